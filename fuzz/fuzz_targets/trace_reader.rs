//! Traces from untrusted bytes: records until the first error, each one
//! encoding back to itself; never a panic.
#![no_main]
use cairn_engine::trace::{Record, TraceReader, HEADER_LEN, RECORD_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(reader) = TraceReader::new(data) {
        let mut read = 0;
        let mut failed = false;
        for r in reader {
            assert!(!failed, "a record after an error");
            match r {
                Ok(rec) => assert_eq!(Record::decode(&rec.encode(), 0).unwrap(), rec),
                Err(_) => failed = true,
            }
            read += 1;
        }
        assert!(HEADER_LEN + read * RECORD_LEN <= data.len());
    }
});
