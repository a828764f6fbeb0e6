//! The metadata version chain from a hostile bucket: object names and
//! version headers parse or fail, and the chain check (holes, links to the
//! predecessor) never panics; a chain it accepts ends at the newest version.
#![no_main]
use cairn_engine::cloud::versions::{parse_name, verify_chain, Header};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Records: a tag byte, then a name (raw, or made from the tag so that
    // most names are versions), then a 2-byte length and the body.
    let mut objects: Vec<(String, Vec<u8>)> = Vec::new();
    let mut rest = data;
    while let Some((&tag, r)) = rest.split_first() {
        rest = r;
        let name = if tag & 0x80 != 0 {
            format!("meta/{:016}.{}", tag & 0x1f, if tag & 0x40 != 0 { "base" } else { "delta" })
        } else {
            let n = (tag as usize).min(rest.len());
            let (raw, r) = rest.split_at(n);
            rest = r;
            String::from_utf8_lossy(raw).into_owned()
        };
        if rest.len() < 2 {
            break;
        }
        let len = (u16::from_le_bytes([rest[0], rest[1]]) as usize).min(rest.len() - 2);
        let body = rest[2..2 + len].to_vec();
        rest = &rest[2 + len..];
        let _ = parse_name(&name, body.len() as u64);
        let _ = Header::decode(&body, &name);
        if objects.len() < 64 && !objects.iter().any(|(n, _)| *n == name) {
            objects.push((name, body));
        }
    }
    if let Ok(top) = verify_chain(&objects) {
        let newest = objects.iter().filter_map(|(n, b)| parse_name(n, b.len() as u64)).map(|v| v.version).max();
        assert_eq!(Some(top), newest, "an accepted chain ends at the newest version");
    }
});
