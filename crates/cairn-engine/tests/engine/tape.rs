//! Volumes on an emulated tape (virtual clock), in process: the volume
//! created on a tape mounts on a machine that has only the tape; a crash
//! after fsyncs loses no fsync'd byte once `recover` rebuilt the catalog.
//! The mounted form (`cairn mount tape-emu:DIR`) runs in the e2e tests.

use crate::cloud::{check_tree, lookup_path, write_tree};
use crate::common::*;
use cairn_engine::cloud::{self, CloudOptions};
use cairn_engine::tape::{self, TapeOptions};
use cairn_engine::*;
use cairn_tape::store::StoreOptions;
use cairn_tape::EmuParams;
use std::path::Path;
use std::time::Duration;

fn setup() {
    tape::configure(TapeOptions { store: StoreOptions { queue_bytes: 16 << 20, read_ahead: 2 << 20, read_buffer: 8 << 20, batch_window: Duration::from_millis(2), pack_size: 1 << 20 }, virtual_clock: true });
}

fn params() -> EmuParams {
    let mut p = EmuParams::default();
    p.block_size = 64 << 10;
    p
}

fn url(dir: &Path) -> String {
    format!("tape-emu:{}", dir.join("tape").display())
}

fn init_tape(dir: &Path, url: &str) {
    let held = tape::create(url, Some(params())).unwrap();
    init_cloud(dir, url, None, None, &InitOptions { chunker: small_chunks(), pack_target: Some(1 << 20), kdf: Some(KdfParams { m_kib: 64, t: 1, p: 1 }), passphrase: Some(zeroize::Zeroizing::new(b"pw".to_vec())), ..Default::default() }).unwrap();
    drop(held);
}

fn opts() -> OpenOptions {
    OpenOptions { passphrase: Some(zeroize::Zeroizing::new(b"pw".to_vec())), cloud: CloudOptions { cache_bytes: 64 << 20, meta_interval: Duration::from_millis(200), ..Default::default() }, ..Default::default() }
}

fn mount(dir: &Path, url: &str) -> std::sync::Arc<Volume> {
    cloud::attach(dir, url, None, None, None).unwrap();
    Volume::load(dir, opts()).unwrap()
}

/// A mixed tree (files in directories, a symlink, modes, an empty file)
/// written on one machine mounts from the tape alone on another, byte for
/// byte and attribute for attribute; nothing of it is plaintext on tape.
#[test]
fn a_tape_volume_mounts_from_the_tape_alone() {
    setup();
    let t = tempfile::tempdir().unwrap();
    let url = url(t.path());
    init_tape(&t.path().join("a"), &url);
    let v = mount(&t.path().join("a"), &url);
    let tree = write_tree(&v, 24);
    let link = v.symlink(ROOT_INO, b"link", b"dir/f1", root()).unwrap();
    let empty = mkfile(&v, ROOT_INO, "empty", b"");
    v.setattr(empty, &SetAttr { perm: Some(0o600), uid: Some(1234), ..Default::default() }).unwrap();
    let attrs: Vec<(String, Attr)> = tree.iter().map(|(p, _)| (p.clone(), v.getattr(lookup_path(&v, p)).unwrap())).collect();
    let empty_attr = v.getattr(empty).unwrap();
    v.close().unwrap();
    drop(v);

    let w = mount(&t.path().join("b"), &url);
    check_tree(&w, &tree);
    for (p, a) in &attrs {
        let b = w.getattr(lookup_path(&w, p)).unwrap();
        assert_eq!((b.size, b.perm, b.uid, b.gid, b.mtime, b.kind), (a.size, a.perm, a.uid, a.gid, a.mtime, a.kind), "{p}");
    }
    assert_eq!(w.readlink(lookup_path(&w, "link")).unwrap(), b"dir/f1");
    assert_eq!(w.getattr(lookup_path(&w, "link")).unwrap().ino, link.ino);
    let e = w.getattr(lookup_path(&w, "empty")).unwrap();
    assert_eq!((e.size, e.perm, e.uid), (empty_attr.size, 0o600, 1234));
    let rep = maintenance::fsck(&w, true, &maintenance::NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "fsck: {:?}", rep.errors);
    w.close().unwrap();
    drop(w);

    // Encrypted volume: no file's bytes appear in the clear on the tape.
    let img = std::fs::read(t.path().join("tape/tape.img")).unwrap();
    for (_, d) in tree.iter().filter(|(_, d)| d.len() > 4096) {
        assert!(!img.windows(64).any(|w| w == &d[1000..1064]), "plaintext on the tape");
    }
}

/// `kill -9` after fsyncs: the appends erased the catalog, so the tape
/// does not mount; `recover` rebuilds it from the blocks, and every
/// fsync'd file is intact on a machine with only the tape.
#[test]
fn fsynced_files_survive_a_crash_through_recover() {
    setup();
    let t = tempfile::tempdir().unwrap();
    let url = url(t.path());
    init_tape(&t.path().join("a"), &url);
    let v = mount(&t.path().join("a"), &url);
    let mut synced = Vec::new();
    for i in 0..6u64 {
        let data = random_bytes(100 + i, 50_000 + 40_000 * i as usize);
        let ino = mkfile(&v, ROOT_INO, &format!("s{i}"), &data);
        v.fsync(ino, false).unwrap();
        synced.push((format!("s{i}"), data));
    }
    // Written and flushed, never fsync'd: on tape, but no version names it
    // durably; it may or may not come back.
    let late = mkfile(&v, ROOT_INO, "late", &random_bytes(7, 300_000));
    v.flush_file_now(late).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    v.simulate_crash();

    let e = Volume::load(&t.path().join("c"), opts()).err();
    assert!(e.is_some());
    let err = cloud::attach(&t.path().join("c"), &url, None, None, None).unwrap_err();
    assert!(err.to_string().contains("recover"), "{err}");

    let dev = tape::open_device(&url, &TapeOptions { virtual_clock: true, ..Default::default() }, None).unwrap();
    let (r, dev) = cairn_tape::store::recover(dev, None, &mut |_, _| {}).unwrap();
    drop(dev);
    assert!(r.recovered.iter().any(|n| n == "config"), "{r:?}");
    let w = mount(&t.path().join("d"), &url);
    check_tree(&w, &synced);
    let rep = maintenance::fsck(&w, true, &maintenance::NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "fsck: {:?}", rep.errors);
    w.close().unwrap();
}

/// Names of the objects on the tape now (a store shared with the mounted
/// volume in this process).
fn objects_on_tape(url: &str) -> std::collections::HashSet<String> {
    tape::open(url).unwrap().index().objects.into_keys().collect()
}

/// Cuts the tape at the first block of the first object `cut_at` picks
/// among those not in `before` (what a power cut does to blocks still in
/// the drive's buffer: everything from there on is gone, the catalog with
/// it), then rebuilds the catalog as `cairn tape recover` does.
fn cut_tail(url: &str, before: &std::collections::HashSet<String>, cut_at: impl Fn(&str) -> bool) {
    let o = TapeOptions { virtual_clock: true, ..Default::default() };
    let store = cairn_tape::store::TapeStore::open(tape::open_device(url, &o, None).unwrap(), StoreOptions::default(), None, false).unwrap();
    let index = store.index();
    let mut dev = store.into_device().unwrap();
    let cut = index.objects.iter().filter(|(n, _)| !before.contains(*n) && cut_at(n)).flat_map(|(_, e)| e.extents.iter().map(|x| x.start)).min().expect("something to cut");
    dev.locate(cut).unwrap();
    dev.write_filemarks(1).unwrap();
    drop(dev);
    let (r, dev) = cairn_tape::store::recover(tape::open_device(url, &o, None).unwrap(), None, &mut |_, _| {}).unwrap();
    drop(dev);
    assert!(!r.had_catalog, "the cut took the catalog: {r:?}");
}

/// The power cut that takes the drive's buffer after the local metadata
/// already names packs in it: remounting from the same directory must not
/// give EIO for those files. The directory's state is set aside and the
/// tape's latest version mounts: every fsync'd file is intact, the lost
/// one is gone, and fsck is clean.
#[test]
fn a_power_cut_that_loses_packs_the_local_metadata_names_mounts_the_tapes_state() {
    setup();
    let t = tempfile::tempdir().unwrap();
    let url = url(t.path());
    let dir = t.path().join("a");
    init_tape(&dir, &url);
    let v = mount(&dir, &url);
    let synced = write_tree(&v, 6);
    v.sync().unwrap();
    let before = objects_on_tape(&url);
    let lost = mkfile(&v, ROOT_INO, "lost", &random_bytes(77, 600_000));
    v.fsync(lost, false).unwrap();
    v.close().unwrap();
    drop(v);
    // Everything after the fsync'd tree is cut: the pack of "lost" first.
    cut_tail(&url, &before, |_| true);

    let w = Volume::load(&dir, opts()).unwrap();
    check_tree(&w, &synced);
    assert_eq!(w.lookup(ROOT_INO, b"lost").unwrap_err().errno(), libc::ENOENT);
    assert!(dir.join("lost-1/meta.sqlite").exists(), "the directory's old state is kept aside");
    let rep = maintenance::fsck(&w, true, &maintenance::NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "fsck: {:?}", rep.errors);
    // The volume goes on: a new file, and a machine with only the tape sees it.
    let again = random_bytes(78, 200_000);
    let ino = mkfile(&w, ROOT_INO, "again", &again);
    w.fsync(ino, false).unwrap();
    w.close().unwrap();
    drop(w);
    let x = mount(&t.path().join("x"), &url);
    check_tree(&x, &synced);
    assert!(read_all(&x, lookup_path(&x, "again")) == again);
    x.close().unwrap();
}

/// The cut takes only metadata versions (every pack arrived): this
/// directory's database is whole, so it is kept, and the next version it
/// publishes is a base a machine with only the tape mounts.
#[test]
fn a_power_cut_that_loses_only_versions_keeps_the_local_state() {
    setup();
    let t = tempfile::tempdir().unwrap();
    let url = url(t.path());
    let dir = t.path().join("a");
    init_tape(&dir, &url);
    // No background shipping: versions are published by the syncs alone,
    // each after the packs it names.
    let o = || OpenOptions { cloud: CloudOptions { meta_interval: Duration::from_secs(3600), ..opts().cloud }, ..opts() };
    cloud::attach(&dir, &url, None, None, None).unwrap();
    let v = Volume::load(&dir, o()).unwrap();
    let first = write_tree(&v, 4);
    v.sync().unwrap();
    let before = objects_on_tape(&url);
    let later = random_bytes(79, 700_000);
    let ino = mkfile(&v, ROOT_INO, "later", &later);
    v.fsync(ino, false).unwrap();
    v.close().unwrap();
    drop(v);
    cut_tail(&url, &before, |n| n.starts_with("meta/"));

    let w = Volume::load(&dir, o()).unwrap();
    check_tree(&w, &first);
    assert!(read_all(&w, lookup_path(&w, "later")) == later);
    assert!(!dir.join("lost-1").exists(), "nothing was set aside");
    w.close().unwrap();
    drop(w);
    let x = mount(&t.path().join("x"), &url);
    check_tree(&x, &first);
    assert!(read_all(&x, lookup_path(&x, "later")) == later, "the base published after the cut names the file");
    let rep = maintenance::fsck(&x, true, &maintenance::NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "fsck: {:?}", rep.errors);
    x.close().unwrap();
}
