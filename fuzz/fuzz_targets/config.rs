//! The config object from untrusted bytes.
#![no_main]
use cairn_engine::VolumeConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = VolumeConfig::parse(data) {
        let _ = c.keys(Some(b"pass"));
    }
});
