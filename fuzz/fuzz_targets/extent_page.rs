//! Extent pages from untrusted bytes: decode errors or round-trips exactly.
#![no_main]
use cairn_engine::extent::{decode_page, encode_page};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = decode_page(1, data) {
        let again = encode_page(&p).expect("decoded pages encode");
        let p2 = decode_page(1, &again).expect("re-encoded page decodes");
        assert_eq!(p, p2);
    }
});
