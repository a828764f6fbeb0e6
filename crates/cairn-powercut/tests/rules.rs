//! The engine's write-ordering rules (`docs/format.md`, "Order of writes"),
//! each pinned by a power cut at the exact moment the rule is about: the
//! engine runs in this process on a volume whose files live on a
//! `cairn-powercut` mount, a crash point makes the power fail right after
//! the operation in question reaches the disk, and the volume is opened
//! again from what was durable at that instant. Each test fails on an
//! engine that breaks its rule (checked by removing the barrier by hand).

use cairn_engine::*;
use cairn_powercut::{CrashPoint, PowerCut};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

struct Lab {
    _dir: tempfile::TempDir,
    backing: PathBuf,
    mnt: PathBuf,
    pc: Option<PowerCut>,
}

impl Lab {
    fn new() -> Lab {
        let root = Path::new(env!("CARGO_TARGET_TMPDIR"));
        fs::create_dir_all(root).unwrap();
        let dir = tempfile::Builder::new().prefix("rules-").tempdir_in(root).unwrap();
        let backing = dir.path().join("backing");
        let mnt = dir.path().join("mnt");
        fs::create_dir(&backing).unwrap();
        fs::create_dir(&mnt).unwrap();
        let mnt = mnt.canonicalize().unwrap();
        let pc = PowerCut::mount(&backing, &mnt).expect("mounting cairn-powercut (needs root and /dev/fuse)");
        Lab { _dir: dir, backing, mnt, pc: Some(pc) }
    }

    fn vol(&self) -> PathBuf {
        self.mnt.join("vol")
    }

    fn pc(&self) -> &PowerCut {
        self.pc.as_ref().unwrap()
    }

    fn init(&self) {
        let chunker = ChunkerParams { min: 4 << 10, avg: 16 << 10, max: 64 << 10, ..Default::default() };
        init(&self.vol(), &InitOptions { chunker, pack_target: Some(1 << 20), ..Default::default() }).unwrap();
    }

    fn open(&self) -> Arc<Volume> {
        Volume::load(&self.vol(), OpenOptions { flush_age: Duration::from_secs(3600), ..Default::default() }).unwrap()
    }

    /// Cuts the power, then crashes the engine, and brings the layer back.
    /// In that order: dropping the engine closes its SQLite connection,
    /// which checkpoints the WAL (a `kill -9` would not); after the cut
    /// that checkpoint can only fail.
    fn power_cut(&mut self, v: Arc<Volume>) {
        self.pc.take().unwrap().cut().unwrap();
        v.simulate_crash();
        self.pc = Some(PowerCut::mount(&self.backing, &self.mnt).unwrap());
    }

    /// fsck --read-data of the volume as it came back: no errors, and no
    /// warning but unreferenced packs (uploads whose commit was cut).
    fn assert_fsck_clean(&self) {
        let v = self.open();
        let rep = maintenance::fsck(&v, true, &maintenance::NoProgress).unwrap();
        assert!(rep.errors.is_empty(), "fsck after the cut: {:?}", rep.errors);
        let bad: Vec<_> = rep.warnings.iter().filter(|w| !w.contains("is in the backend but not in the metadata")).collect();
        assert!(bad.is_empty(), "fsck after the cut: {bad:?}");
        v.close().unwrap();
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(pc) = self.pc.take() {
            let _ = pc.cut();
        }
    }
}

fn caller() -> Caller {
    Caller { uid: 0, gid: 0 }
}

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn write_file(v: &Volume, name: &str, data: &[u8]) -> Ino {
    let ino = v.create(ROOT_INO, name.as_bytes(), FileKind::File, 0o644, 0, caller()).unwrap().ino;
    v.open(ino).unwrap();
    for (i, piece) in data.chunks(128 << 10).enumerate() {
        v.write(ino, (i * (128 << 10)) as u64, piece).unwrap();
    }
    v.release(ino).unwrap();
    ino
}

fn read_file(v: &Volume, name: &str) -> Vec<u8> {
    let ino = v.resolve(name.as_bytes()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let size = v.getattr(ino).unwrap().size;
    let mut out = Vec::new();
    while (out.len() as u64) < size {
        let got = v.read(ino, out.len() as u64, 1 << 20).unwrap_or_else(|e| panic!("reading {name} at {}: {e}", out.len()));
        assert!(!got.is_empty());
        out.extend_from_slice(&got);
    }
    out
}

/// Rule 1: the power fails right after the flusher deleted the first
/// journal segment. The commit that folded the segment's records in must
/// already be durable, or the fsync'd file comes back empty.
#[test]
fn journal_segment_deleted_only_after_durable_commit() {
    let mut lab = Lab::new();
    lab.init();
    let v = lab.open();
    let data = bytes(1, 300_000);
    let f = write_file(&v, "f", &data);
    v.fsync(f, false).unwrap();
    lab.pc().crash_at(CrashPoint::AfterUnlink { prefix: "vol/journal".into(), nth: 1 });
    // A flush round of the file (closed files wait for their age in the
    // background; the round is the same): commit, then retire the segment.
    let _ = v.flush_file_now(f);
    assert!(lab.pc().crashed(), "the flush round deleted no journal segment");
    lab.power_cut(v);
    let v = lab.open();
    assert_eq!(read_file(&v, "f"), data, "fsync'd data lost: the segment went before its commit was durable");
    v.close().unwrap();
    drop(v);
    lab.assert_fsck_clean();
}

/// Rule 2: the power fails right after the first fsync of the metadata WAL
/// that follows a flush: every pack the now-durable metadata names must be
/// durable too.
#[test]
fn packs_durable_before_metadata_refers_to_them() {
    let mut lab = Lab::new();
    lab.init();
    let v = lab.open();
    let data = bytes(2, 700_000);
    write_file(&v, "f", &data);
    // The create is committed and durable now (group commit would carry it
    // into the flush's transaction, whose first WAL write also syncs the
    // WAL's new header: that would be the first fsync below, not the
    // barrier this test is about). The file's data stays in the journal.
    v.fsync(ROOT_INO, false).unwrap();
    lab.pc().crash_at(CrashPoint::AfterFsync { suffix: "meta.sqlite-wal".into(), nth: 1 });
    let _ = v.flush_now();
    assert!(lab.pc().crashed(), "the flush never fsync'd the WAL");
    lab.power_cut(v);
    let v = lab.open();
    assert_eq!(read_file(&v, "f"), data, "the durable metadata names a pack that is not durable");
    v.close().unwrap();
    drop(v);
    lab.assert_fsck_clean();
}

/// Rule 3: the power fails right after gc deleted the first old pack. The
/// transaction that moved the live chunks into the new pack must be
/// durable, or the kept file's chunks point into the deleted pack.
#[test]
fn gc_deletes_packs_only_after_durable_commit() {
    let mut lab = Lab::new();
    lab.init();
    let v = lab.open();
    let keep = bytes(3, 400_000);
    write_file(&v, "keep", &keep);
    write_file(&v, "drop", &bytes(4, 400_000));
    v.flush_now().unwrap();
    v.unlink(ROOT_INO, b"drop").unwrap();
    v.sync().unwrap();
    lab.pc().crash_at(CrashPoint::AfterUnlink { prefix: "vol/store/packs".into(), nth: 1 });
    let r = maintenance::gc(&v, 0.9, &maintenance::NoProgress);
    assert!(lab.pc().crashed(), "gc deleted no pack: {r:?}");
    lab.power_cut(v);
    let v = lab.open();
    assert_eq!(read_file(&v, "keep"), keep, "gc deleted a pack before its commit was durable");
    assert!(v.resolve(b"drop").is_err());
    v.close().unwrap();
    drop(v);
    lab.assert_fsck_clean();
}

/// Rule 5: a control command that replied is durable: the power fails
/// right after `cairn clone` and `cairn snapshot create` return.
#[test]
fn control_commands_durable_on_return() {
    let mut lab = Lab::new();
    lab.init();
    let v = lab.open();
    let data = bytes(5, 200_000);
    write_file(&v, "src", &data);
    v.sync().unwrap();
    let sock_dir = tempfile::tempdir().unwrap();
    let sock = sock_dir.path().join("ctl");
    let server = control::serve(&v, &sock).unwrap();
    control::call(&sock, &control::Request::Clone { src: b"/src".to_vec(), dst: b"/copy".to_vec() }).unwrap();
    control::call(&sock, &control::Request::SnapshotCreate { name: "s".into() }).unwrap();
    drop(server);
    lab.power_cut(v);
    let v = lab.open();
    assert_eq!(read_file(&v, "copy"), data, "the clone replied but did not survive the cut");
    assert_eq!(read_file(&v, &format!("{SNAPSHOT_DIR}/s/src")), data, "the snapshot replied but did not survive the cut");
    v.close().unwrap();
    drop(v);
    lab.assert_fsck_clean();
}

/// Rule 6: `init` returned, then the power failed: the volume opens.
#[test]
fn init_is_durable() {
    let mut lab = Lab::new();
    lab.init();
    lab.pc.take().unwrap().cut().unwrap();
    lab.pc = Some(PowerCut::mount(&lab.backing, &lab.mnt).unwrap());
    let v = lab.open();
    write_file(&v, "x", b"hello");
    v.close().unwrap();
    drop(v);
    lab.assert_fsck_clean();
}
