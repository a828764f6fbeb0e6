//! A tape catalog's payload from untrusted bytes (docs/format.md, "Catalog
//! payload", versions 1 and 2): refused or accepted, never a panic, memory
//! bounded; what is accepted re-encodes (as version 2) to an equal payload,
//! its inline copies included.
#![no_main]
use cairn_tape::index::{decode_catalog, encode_catalog};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = decode_catalog(data) {
        let inline: Vec<(&str, &[u8])> = p.inline.iter().map(|(n, d)| (n.as_str(), d.as_slice())).collect();
        assert_eq!(decode_catalog(&encode_catalog(&p.index, &inline)).as_ref(), Ok(&p));
    }
});
