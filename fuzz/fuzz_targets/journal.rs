//! Journal segments from untrusted bytes: stops at the first bad record.
#![no_main]
use cairn_engine::journal::scan_bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((recs, len)) = scan_bytes(data) {
        assert!(len as usize <= data.len());
        for r in recs {
            assert!(r.loc.offset <= len);
        }
    }
});
