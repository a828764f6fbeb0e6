//! What the emulated tape keeps across a crash, a reopen, and misuse.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use cairn_tape::conformance::pattern_block;
use cairn_tape::{
    read_exact_blocks, Clock, CrashModel, DeviceError, EmuDrive, ReadOutcome, TapeDevice,
};

use crate::common::{emu, small_params};

const BS: usize = 4096;

fn blocks(tag: u64, n: u64) -> Vec<u8> {
    (0..n).flat_map(|i| pattern_block(BS, tag, i)).collect()
}

fn reopen_eod(dir: &std::path::Path) -> u64 {
    let mut d = EmuDrive::open(dir, Clock::virtual_clock()).unwrap();
    d.space_to_eod().unwrap();
    d.position().unwrap()
}

#[test]
fn power_loss_drops_what_was_not_flushed() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let mut p = small_params();
    p.crash = CrashModel::PowerLoss;
    let (mut d, _vc) = emu(&dir, p);
    d.write_blocks(&blocks(1, 10)).unwrap();
    d.flush().unwrap();
    // Five more blocks stay in the drive buffer (below the start threshold).
    d.write_blocks(&blocks(2, 5)).unwrap();
    d.simulate_power_loss();
    assert_eq!(
        reopen_eod(&dir),
        10,
        "unflushed blocks survived a power loss"
    );
    let mut d = EmuDrive::open(&dir, Clock::virtual_clock()).unwrap();
    let mut buf = vec![0u8; 10 * BS];
    read_exact_blocks(&mut d, &mut buf).unwrap();
    assert!(buf == blocks(1, 10), "flushed blocks changed");
}

#[test]
fn power_loss_keeps_what_the_drive_already_wrote() {
    // A stream longer than the buffer: the model has put most of it on tape.
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let mut p = small_params();
    p.crash = CrashModel::PowerLoss;
    let buffer_blocks = p.buffer_bytes / BS as u64;
    let (mut d, _vc) = emu(&dir, p);
    for i in 0..20 {
        d.write_blocks(&blocks(100 + i, 16)).unwrap();
    }
    d.simulate_power_loss();
    let eod = reopen_eod(&dir);
    assert!(
        eod >= 320 - buffer_blocks && eod < 320,
        "after 320 unflushed blocks with a {buffer_blocks}-block buffer, {eod} remain"
    );
}

#[test]
fn host_crash_keeps_every_written_block() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let (mut d, _vc) = emu(&dir, small_params());
    d.write_blocks(&blocks(1, 10)).unwrap();
    d.flush().unwrap();
    d.write_blocks(&blocks(2, 5)).unwrap();
    d.simulate_power_loss(); // with HostCrash the drive outlives the host
    assert_eq!(reopen_eod(&dir), 15);
}

/// Run by `kill_9_*` in a child process: writes, flushes, writes more,
/// says READY, and waits to be killed.
#[test]
#[ignore = "helper for kill_9_leaves_flushed_blocks; runs in a child process"]
fn child_writer() {
    let Ok(dir) = std::env::var("CAIRN_TAPE_CHILD_DIR") else {
        return;
    };
    let mut d = EmuDrive::open(std::path::Path::new(&dir), Clock::virtual_clock()).unwrap();
    d.write_blocks(&blocks(1, 10)).unwrap();
    d.flush().unwrap();
    d.write_blocks(&blocks(2, 5)).unwrap();
    println!("READY");
    std::thread::sleep(std::time::Duration::from_secs(60));
}

fn kill_9(crash: CrashModel) -> u64 {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let mut p = small_params();
    p.crash = crash;
    drop(emu(&dir, p));
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "emu_crash::child_writer",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CAIRN_TAPE_CHILD_DIR", &dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while out.read_line(&mut line).unwrap() > 0 && !line.contains("READY") {
        line.clear();
    }
    assert!(
        line.contains("READY"),
        "the child did not get to its writes"
    );
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    reopen_eod(&dir)
}

#[test]
fn kill_9_leaves_flushed_blocks() {
    assert_eq!(
        kill_9(CrashModel::PowerLoss),
        10,
        "PowerLoss: only the flushed blocks remain after kill -9"
    );
    assert_eq!(
        kill_9(CrashModel::HostCrash),
        15,
        "HostCrash: every written block remains after kill -9"
    );
}

#[test]
fn a_slot_torn_by_a_crash_is_dropped_on_open() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let (mut d, _vc) = emu(&dir, small_params());
    d.write_blocks(&blocks(1, 3)).unwrap();
    d.flush().unwrap();
    drop(d);
    let f = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join("tape.img"))
        .unwrap();
    std::io::Write::write_all(&mut &f, b"CTS1\x01\0\0\0half a block").unwrap();
    drop(f);
    assert_eq!(reopen_eod(&dir), 3, "the torn slot is gone");
}

#[test]
fn a_damaged_slot_is_a_medium_error() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let (mut d, _vc) = emu(&dir, small_params());
    d.write_blocks(&blocks(1, 3)).unwrap();
    d.flush().unwrap();
    drop(d);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("tape.img"))
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"XXXX", 8 + BS as u64).unwrap();
    let mut d = EmuDrive::open(&dir, Clock::virtual_clock()).unwrap();
    let mut buf = vec![0u8; BS];
    assert_eq!(d.read_blocks(&mut buf).unwrap(), ReadOutcome::Blocks(1));
    let e = d.read_blocks(&mut buf).unwrap_err();
    assert!(
        matches!(e, DeviceError::Io { .. }) && e.to_string().contains("medium error at block 1"),
        "{e}"
    );
}

#[test]
fn a_second_opener_is_told_the_tape_is_busy() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let (_d, _vc) = emu(&dir, small_params());
    let e = EmuDrive::open(&dir, Clock::virtual_clock())
        .err()
        .expect("second open");
    assert!(
        e.to_string().contains("busy") && e.to_string().contains(&dir.display().to_string()),
        "{e}"
    );
}

#[test]
fn missing_tape_and_write_protect_are_typed_errors() {
    let t = tempfile::tempdir().unwrap();
    let e = EmuDrive::open(&t.path().join("nope"), Clock::virtual_clock())
        .err()
        .expect("open of a missing tape");
    assert!(
        matches!(e, DeviceError::Io { .. }) && e.to_string().contains("nope"),
        "{e}"
    );
    assert_eq!(e.errno(), Some(libc::ENOENT));
    let dir = t.path().join("tape");
    let (mut d, _vc) = emu(&dir, small_params());
    d.write_blocks(&blocks(1, 1)).unwrap();
    d.flush().unwrap();
    d.set_write_protected(true).unwrap();
    assert!(matches!(
        d.write_blocks(&blocks(1, 1)),
        Err(DeviceError::WriteProtected { .. })
    ));
    assert!(matches!(
        d.write_filemarks(1),
        Err(DeviceError::WriteProtected { .. })
    ));
    assert!(d.status().unwrap().write_protected);
    drop(d);
    // The switch is part of the cartridge: it survives a reopen.
    let mut d = EmuDrive::open(&dir, Clock::virtual_clock()).unwrap();
    assert!(matches!(
        d.write_blocks(&blocks(1, 1)),
        Err(DeviceError::WriteProtected { .. })
    ));
    d.unload().unwrap();
    let mut buf = vec![0u8; BS];
    assert!(matches!(
        d.read_blocks(&mut buf),
        Err(DeviceError::NoTape { .. })
    ));
    d.load().unwrap();
    assert_eq!(d.read_blocks(&mut buf).unwrap(), ReadOutcome::Blocks(1));
}
