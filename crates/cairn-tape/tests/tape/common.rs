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
