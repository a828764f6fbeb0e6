//! A pack's trailer, index and blobs, from untrusted bytes: errors, never panics.
#![no_main]
use cairn_engine::crypto::Keys;
use cairn_engine::pack;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let vid = [7u8; 16];
    for enc in [false, true] {
        let keys = Keys::derive(&[1u8; 32], enc);
        let size = data.len() as u64;
        let _ = pack::check_header(data, &vid);
        if data.len() >= pack::TRAILER_LEN {
            if let Ok(n) = pack::parse_trailer(&data[data.len() - pack::TRAILER_LEN..], size) {
                let end = data.len() - pack::TRAILER_LEN;
                let idx = data[end - n as usize..end].to_vec();
                if let Ok(entries) = pack::decode_index(&keys, &vid, idx, size) {
                    for e in entries {
                        let blob = data[e.offset as usize..(e.offset + e.stored_len as u64) as usize].to_vec();
                        // Both checks: the mount's (seal only when encrypted) and fsck's.
                        let _ = pack::decode_blob(&keys, &e, blob.clone(), pack::Verify::Sealed);
                        let _ = pack::decode_blob(&keys, &e, blob, pack::Verify::Full);
                    }
                }
            }
        }
        // The index decoder on raw input as well.
        let _ = pack::decode_index(&keys, &vid, data.to_vec(), size.saturating_add(1 << 20));
    }
});
