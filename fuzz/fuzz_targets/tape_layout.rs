//! The tape's parsers from untrusted bytes (a label, a block, a catalog
//! frame and an object head as read off a tape): refused or accepted, never
//! a panic, and what is accepted re-encodes to the same bytes. The
//! catalog's payload has its own target, `tape_catalog`.
#![no_main]
use cairn_tape::layout::{frame_catalog, unframe_catalog, BlockHeader, Label, HEADER_LEN};
use cairn_tape::index::{object_head, parse_object_head};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(l) = Label::parse(data) {
        assert!(64 + l.info.len() <= data.len());
        if l.block_size as usize == data.len() {
            // Padding after the info is not covered; compare what is.
            let again = l.encode();
            assert_eq!(again[..64 + l.info.len()], data[..64 + l.info.len()]);
        }
    }
    if let Ok((h, payload)) = BlockHeader::decode(data) {
        assert_eq!(payload.len(), h.payload_len as usize);
        assert!(HEADER_LEN + payload.len() <= data.len());
        let mut block = vec![0u8; data.len()];
        h.encode(payload, &mut block);
        assert_eq!(
            block[..HEADER_LEN + payload.len()],
            data[..HEADER_LEN + payload.len()]
        );
    }
    if let Ok(body) = unframe_catalog(data) {
        assert_eq!(frame_catalog(body), data);
    }
    if let Ok((name, len)) = parse_object_head(data) {
        assert_eq!(object_head(&name)[..], data[..len as usize]);
    }
});
