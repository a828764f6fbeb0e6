//! The shared device suite on the emulated drive.

use cairn_tape::conformance::{run_all, Options};
use cairn_tape::{Clock, CrashModel, EmuDrive, TapeDevice, VirtualClock};

use crate::common::{emu, small_params};

fn suite(crash: CrashModel) {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let mut p = small_params();
    p.crash = crash;
    // Room for the end-of-medium check: 300 blocks, early warning 40 before the end.
    p.capacity_bytes = 300 * 4096;
    p.early_warning_bytes = 40 * 4096;
    let (dev, vc) = emu(&dir, p);
    let mut reopen = || -> Box<dyn TapeDevice> {
        Box::new(EmuDrive::open(&dir, Clock::Virtual(vc.clone())).expect("reopen"))
    };
    let d = run_all(
        Box::new(dev),
        Options {
            reopen: Some(&mut reopen),
            end_of_medium: true,
        },
    );
    drop(d);
}

#[test]
fn conformance_host_crash_model() {
    suite(CrashModel::HostCrash);
}

#[test]
fn conformance_power_loss_model() {
    suite(CrashModel::PowerLoss);
}

#[test]
fn conformance_real_clock() {
    // The same suite in real time, with a fast drive so the run stays short.
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let mut p = small_params();
    p.native_rate = 2e9;
    p.min_rate = 1e9;
    p.locate_fixed_secs = 0.0;
    p.locate_speed_mps = 1e9;
    p.backhitch_secs = 0.0;
    p.capacity_bytes = 300 * 4096;
    p.early_warning_bytes = 40 * 4096;
    let dev = EmuDrive::create(&dir, p, Clock::real()).unwrap();
    let _ = VirtualClock::new();
    run_all(
        Box::new(dev),
        Options {
            reopen: None,
            end_of_medium: true,
        },
    );
}
