//! Journal segments from untrusted bytes: the scanner never panics, stays
//! within the input, and reports records in file order.
#![no_main]
use cairn_engine::journal::scan_bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(scan) = scan_bytes(data) {
        assert!(scan.end as usize <= data.len());
        assert_eq!(scan.len as usize, data.len());
        let mut prev = 0;
        for r in &scan.records {
            assert!(r.loc.offset <= scan.end && r.loc.offset >= prev);
            prev = r.loc.offset;
        }
        for d in &scan.damage {
            assert!(d.resume.is_none_or(|q| q > d.offset && q <= data.len() as u64));
        }
    }
});
