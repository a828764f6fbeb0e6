//! Helpers shared by the tests.
#![allow(dead_code)]

use std::path::Path;

use cairn_tape::{Clock, EmuDrive, EmuParams, VirtualClock};

/// Small, fast parameters for functional tests: 4 KiB blocks.
pub fn small_params() -> EmuParams {
    let mut p = EmuParams::default();
    p.block_size = 4096;
    p.buffer_bytes = 256 * 1024;
    p
}

/// A fresh emulated tape on a virtual clock; returns the clock too.
pub fn emu(dir: &Path, p: EmuParams) -> (EmuDrive, VirtualClock) {
    let vc = VirtualClock::new();
    let d = EmuDrive::create(dir, p, Clock::Virtual(vc.clone())).expect("create emulated tape");
    (d, vc)
}

/// Deterministic incompressible bytes (xorshift) for object contents.
pub fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
