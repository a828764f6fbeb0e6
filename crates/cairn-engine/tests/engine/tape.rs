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

fn tape_options() -> TapeOptions {
    TapeOptions { store: StoreOptions { queue_bytes: 16 << 20, read_ahead: 2 << 20, read_buffer: 8 << 20, batch_window: Duration::from_millis(2), pack_size: 1 << 20, prepare_append: true, prepare_read: false, inline: None }, virtual_clock: true }
}

fn setup() {
    tape::configure(tape_options());
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
    init_tape_packing(dir, url, 1 << 20);
}

/// A fresh emulated tape and a volume on it with packs of `pack_target`.
fn init_tape_packing(dir: &Path, url: &str, pack_target: u64) {
    let held = tape::create(url, Some(params())).unwrap();
    init_cloud(dir, url, None, None, &InitOptions { chunker: small_chunks(), pack_target: Some(pack_target), kdf: Some(KdfParams { m_kib: 64, t: 1, p: 1 }), passphrase: Some(zeroize::Zeroizing::new(b"pw".to_vec())), ..Default::default() }).unwrap();
    drop(held);
}

/// Packs on a tape are no larger than the store asks for (its memory,
/// docs/tape.md §10), whatever the volume's pack target: a mount given
/// little memory builds and queues small packs.
#[test]
fn packs_on_a_tape_fit_the_memory_the_store_was_given() {
    setup();
    let t = tempfile::tempdir().unwrap();
    let url = url(t.path());
    let dir = t.path().join("a");
    // The store's ask, from the options `setup` gave every tape.
    let asked = tape_options().store.pack_size;
    init_tape_packing(&dir, &url, 8 * asked);
    let v = mount(&dir, &url);
    let data = random_bytes(7, 6 * asked as usize);
    mkfile(&v, ROOT_INO, "big", &data);
    v.close().unwrap();
    drop(v);
    let store = tape::open(&url).unwrap();
    let packs = store.list("packs/").unwrap();
    drop(store);
    assert!(packs.len() >= 5, "{} packs for {} bytes", packs.len(), data.len());
    // A pack ends with the chunk that reaches the target: one chunk over.
    let largest = packs.iter().map(|o| o.size).max().unwrap();
    assert!(largest <= asked + small_chunks().max as u64 + 4096, "a pack of {largest} bytes; the store asked for {asked}");
    let w = mount(&t.path().join("b"), &url);
    assert!(read_all(&w, lookup_path(&w, "big")) == data);
    w.close().unwrap();
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

/// docs/tape.md §8: a tape written by a volume over several metadata
/// versions mounts on a machine with only the tape in two locates: the
/// catalog, read from the end of data, carries the config and the
/// metadata chain. The data is then read from the tape as usual.
#[test]
fn a_full_tape_mounts_in_two_locates_on_a_fresh_machine() {
    setup();
    let t = tempfile::tempdir().unwrap();
    let url = url(t.path());
    init_tape(&t.path().join("a"), &url);
    let v = mount(&t.path().join("a"), &url);
    let mut files = Vec::new();
    for round in 0..4u64 {
        for i in 0..6u64 {
            let data = random_bytes(round * 10 + i, 200_000 + 30_000 * i as usize);
            let ino = mkfile(&v, ROOT_INO, &format!("r{round}f{i}"), &data);
            v.fsync(ino, false).unwrap();
            files.push((format!("r{round}f{i}"), data));
        }
        // Long enough for a metadata version to ship each round.
        std::thread::sleep(Duration::from_millis(300));
    }
    v.close().unwrap();
    // The store the volume used (shared within the process): what its last
    // catalog carried.
    let store = tape::open(&url).unwrap();
    let versions = store.list("meta/").unwrap().len();
    let inline = store.stats();
    drop(store);
    drop(v);
    assert!(versions >= 2, "{versions} metadata versions on the tape");
    assert!(inline.catalog_inline.0 >= 2, "the config and a base at least: {inline:?}");
    let dir = Path::new(url.strip_prefix("tape-emu:").unwrap());
    std::fs::remove_file(dir.join(cairn_tape::SESSION_FILE)).unwrap();

    let w = mount(&t.path().join("b"), &url);
    w.close().unwrap();
    drop(w);
    let s = cairn_tape::Session::read(dir).expect("the mount's session");
    assert!(s.stats.locates <= 2, "mounting took {} locates ({inline:?})", s.stats.locates);
    assert_eq!(s.stats.bytes_written, 0, "a mount and unmount that changed nothing write nothing");

    let w = mount(&t.path().join("b"), &url);
    check_tree(&w, &files);
    w.close().unwrap();
}

/// docs/tape.md §8, "Batched reads": files read whole at once by many
/// readers on a fresh machine reach the store together and are read in
/// one pass up the tape: a locate to the first, then reading on, however
/// the files lie (here every other one of 40, written in turn with
/// others). On rayon's two threads, two requests reached the store at a
/// time and the pass broke into many, each locating back.
#[test]
fn files_read_at_once_are_read_in_one_pass() {
    setup();
    let t = tempfile::tempdir().unwrap();
    let url = url(t.path());
    init_tape(&t.path().join("a"), &url);
    let v = mount(&t.path().join("a"), &url);
    let mut files = Vec::new();
    for i in 0..40u64 {
        let data = random_bytes(500 + i, 150_000 + 7_000 * i as usize);
        let ino = mkfile(&v, ROOT_INO, &format!("f{i}"), &data);
        v.fsync(ino, false).unwrap();
        files.push((format!("f{i}"), data));
    }
    v.close().unwrap();
    drop(v);
    let dir = Path::new(url.strip_prefix("tape-emu:").unwrap());
    let w = mount(&t.path().join("b"), &url);
    // Every other file, the last first.
    let picks: Vec<&(String, Vec<u8>)> = files.iter().rev().step_by(2).collect();
    std::thread::scope(|s| {
        for (name, data) in &picks {
            let w = &w;
            s.spawn(move || {
                let ino = lookup_path(w, name);
                assert!(read_all(w, ino) == *data, "{name} differs");
            });
        }
    });
    let stats = tape::open(&url).unwrap().stats();
    w.close().unwrap();
    drop(w);
    let s = cairn_tape::Session::read(dir).expect("the mount's session");
    // Two to open (the end of data, the catalog's window), then one per
    // pass up the tape: every request that arrived together, and every
    // one that arrived ahead of a pass under way, went in that pass. How
    // many passes it takes depends on when the threads run (this test's
    // batch window is 2 ms, and the suite loads the machine); with all
    // requests together it is one (section 15: 40 reads, 3 locates).
    assert!(s.stats.locates <= 2 + stats.read_batches, "{} locates: {stats:?}", s.stats.locates);
    assert!(stats.read_batches < picks.len() as u64, "{stats:?}");
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

// ---- The CDP mirror (docs/tape.md §4) ----

use cairn_backend::Backend;
use cairn_engine::mirror::{MirrorChoice, Mirrored};

/// A formatted tape (held by the caller) and a mirror in `DIR/mirror`.
fn mirrored(t: &Path) -> (String, std::sync::Arc<cairn_tape::store::TapeStore>, std::sync::Arc<Mirrored>) {
    setup();
    let url = url(t);
    let held = tape::create(&url, Some(params())).unwrap();
    std::fs::create_dir_all(t.join("mirror")).unwrap();
    let m = tape::open_mirrored(&url, &t.join("mirror")).unwrap();
    (url, held, m)
}

/// The mirroring backend keeps the backend contract, racing conditional
/// creates included.
#[test]
fn the_mirror_passes_the_backend_conformance_suite() {
    let t = tempfile::tempdir().unwrap();
    let (_url, _held, m) = mirrored(t.path());
    cairn_backend::conformance::run_all(&*m);
    m.sync().unwrap();
    // The same again once the mirror lost everything: the tape answers.
    for e in std::fs::read_dir(t.path().join("mirror")).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            std::fs::remove_dir_all(&p).unwrap();
        }
    }
    cairn_backend::conformance::run_all(&*m);
}

/// Reads are served by the directory, never by the drive; an object the
/// directory lacks, or holds at another size, comes from the tape (and a
/// whole one is written back); the tape's answer wins over a stray file;
/// a delete frees the directory's copy.
#[test]
fn the_mirror_serves_reads_and_the_tape_fills_its_gaps() {
    let t = tempfile::tempdir().unwrap();
    let (_url, held, m) = mirrored(t.path());
    let pack = random_bytes(1, 900_000);
    let meta = random_bytes(2, 5_000);
    m.put("packs/ab/abcd", &pack).unwrap();
    m.put_if_absent("meta/0000000000000002.base", &meta).unwrap();
    m.sync().unwrap();
    let root = t.path().join("mirror");
    assert!(std::fs::read(root.join("packs/ab/abcd")).unwrap() == pack, "the object is in the directory verbatim");
    assert_eq!(m.get_range("packs/ab/abcd", 100_000, 300_000).unwrap(), &pack[100_000..400_000]);
    assert_eq!(m.get("meta/0000000000000002.base").unwrap(), meta);
    assert_eq!(held.stats().reads_from_tape, 0, "served by the drive: {:?}", held.stats());
    assert_eq!((m.stats().reads_from_mirror, m.stats().fallbacks), (2, 0));
    assert_eq!(m.size("packs/ab/abcd").unwrap(), pack.len() as u64);
    assert_eq!(m.get_range("packs/ab/abcd", 899_999, 2).unwrap_err().kind(), cairn_backend::ErrorKind::OutOfRange);

    // Wiped: the tape serves; a whole object comes back into the directory.
    std::fs::remove_dir_all(root.join("packs")).unwrap();
    std::fs::remove_dir_all(root.join("meta")).unwrap();
    assert_eq!(m.get_range("packs/ab/abcd", 5, 50_000).unwrap(), &pack[5..50_005]);
    assert!(!root.join("packs/ab/abcd").exists(), "a range is not a whole object");
    assert_eq!(m.get("meta/0000000000000002.base").unwrap(), meta);
    assert!(std::fs::read(root.join("meta/0000000000000002.base")).unwrap() == meta, "read whole from the tape, written back");
    assert!(held.stats().reads_from_tape >= 1);
    assert_eq!((m.stats().fallbacks, m.stats().filled), (2, 1));
    // A file of the wrong size is not served.
    std::fs::create_dir_all(root.join("packs/ab")).unwrap();
    std::fs::write(root.join("packs/ab/abcd"), b"short").unwrap();
    assert!(m.get("packs/ab/abcd").unwrap() == pack);
    // A file the tape does not hold is not an object.
    std::fs::write(root.join("packs/ab/stray"), b"x").unwrap();
    assert_eq!(m.get("packs/ab/stray").unwrap_err().kind(), cairn_backend::ErrorKind::NotFound);
    assert!(m.list("packs/").unwrap().iter().all(|o| o.name != "packs/ab/stray"), "the listing is the tape's");
    // Deletes go to both.
    m.delete("packs/ab/abcd").unwrap();
    assert!(!root.join("packs/ab/abcd").exists());
    assert_eq!(m.get("packs/ab/abcd").unwrap_err().kind(), cairn_backend::ErrorKind::NotFound);
    assert_eq!(held.size("packs/ab/abcd").unwrap_err().kind(), cairn_backend::ErrorKind::NotFound);
}

/// Objects put on the tape while the mirror was not there (a mount without
/// it, or a crash before the mirror's sync) may have older copies in the
/// directory: opening drops those, so the directory never serves bytes the
/// tape does not hold, and keeps the rest.
#[test]
fn a_mirror_drops_copies_the_tape_replaced_without_it() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("mirror");
    let (url, held, m) = mirrored(t.path());
    m.put("meta/a", &[1u8; 4000]).unwrap();
    m.put("meta/b", &[2u8; 4000]).unwrap();
    m.sync().unwrap();
    drop(m);
    // The tape alone replaces meta/a with as many bytes.
    held.put("meta/a", &[3u8; 4000]).unwrap();
    held.sync().unwrap();
    // Through the mirror without a sync (a crash): its copy is suspect too.
    let m = tape::open_mirrored(&url, &root).unwrap();
    m.put("meta/c", &[4u8; 4000]).unwrap();
    drop(m);
    assert!(root.join("meta/c").exists());
    let m = tape::open_mirrored(&url, &root).unwrap();
    assert!(!root.join("meta/a").exists() && !root.join("meta/c").exists(), "suspect copies dropped");
    assert!(root.join("meta/b").exists(), "a copy put before the last sync is kept");
    assert_eq!(m.get("meta/a").unwrap(), vec![3u8; 4000]);
    assert_eq!(m.get("meta/b").unwrap(), vec![2u8; 4000]);
    assert_eq!(m.get("meta/c").unwrap(), vec![4u8; 4000]);
    assert_eq!(m.stats().reads_from_mirror, 1);
}

/// A directory that mirrors another tape, or holds something else, is
/// refused, naming why.
#[test]
fn a_mirror_of_another_tape_or_a_busy_directory_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let (_url, _held, m) = mirrored(t.path());
    m.put("config", b"x").unwrap();
    m.sync().unwrap();
    drop(m);
    let other = t.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    let url2 = url(&other);
    let _held2 = tape::create(&url2, Some(params())).unwrap();
    let e = tape::open_mirrored(&url2, &t.path().join("mirror")).err().expect("another tape's mirror");
    assert!(e.to_string().contains("not of this tape"), "{e}");
    let busy = t.path().join("busy");
    std::fs::create_dir_all(&busy).unwrap();
    std::fs::write(busy.join("notes.txt"), b"mine").unwrap();
    let e = tape::open_mirrored(&url2, &busy).err().expect("a directory that is not a mirror");
    assert!(e.to_string().contains("neither empty nor a CDP mirror"), "{e}");
    assert_eq!(std::fs::read(busy.join("notes.txt")).unwrap(), b"mine");
}

/// The whole story on a volume: a tree written with a mirror is read back
/// on another directory with the mirror and the drive reads nothing of it;
/// the mirror holds no plaintext; the directory that remembers a mirror
/// that has gone refuses to mount until told; after the mirror is deleted
/// the tape alone mounts it byte for byte.
#[test]
fn a_mirrored_tape_volume_reads_from_the_mirror_and_restores_from_the_tape_alone() {
    setup();
    let t = tempfile::tempdir().unwrap();
    let url = url(t.path());
    let mdir = t.path().join("mirror");
    init_tape(&t.path().join("a"), &url);
    cloud::attach(&t.path().join("a"), &url, None, None, None).unwrap();
    let v = Volume::load(&t.path().join("a"), OpenOptions { mirror: MirrorChoice::Use(mdir.clone()), ..opts() }).unwrap();
    let mut tree = write_tree(&v, 16);
    for i in 0..3u64 {
        let data = random_bytes(50 + i, 1_500_000 + 100_000 * i as usize);
        mkfile(&v, ROOT_INO, &format!("big{i}"), &data);
        tree.push((format!("big{i}"), data));
    }
    v.close().unwrap();
    drop(v);
    // Remembered: the next open from this directory mirrors without being told.
    let settings: serde_json::Value = serde_json::from_slice(&std::fs::read(t.path().join("a/volume.json")).unwrap()).unwrap();
    assert_eq!(settings["mirror"].as_str(), Some(std::fs::canonicalize(&mdir).unwrap().to_str().unwrap()));

    // Encrypted volume: nothing of the files is in the clear in the mirror.
    for e in walk(&mdir) {
        let bytes = std::fs::read(&e).unwrap();
        for (_, d) in tree.iter().filter(|(_, d)| d.len() > 4096) {
            assert!(!bytes.windows(64).any(|w| w == &d[1000..1064]), "plaintext in {}", e.display());
        }
    }

    // Another directory with the mirror: every read of the tree is the mirror's.
    cloud::attach(&t.path().join("b"), &url, None, None, None).unwrap();
    let w = Volume::load(&t.path().join("b"), OpenOptions { mirror: MirrorChoice::Use(mdir.clone()), ..opts() }).unwrap();
    let m = tape::open_mirrored(&url, &std::fs::canonicalize(&mdir).unwrap()).unwrap();
    let (drive0, mirror0) = (m.tape().stats(), m.stats());
    check_tree(&w, &tree);
    let (drive1, mirror1) = (m.tape().stats(), m.stats());
    assert_eq!(drive1.reads_from_tape, drive0.reads_from_tape, "the drive read for the tree: {drive1:?}");
    assert_eq!(mirror1.fallbacks, mirror0.fallbacks, "{mirror1:?}");
    assert!(mirror1.reads_from_mirror > mirror0.reads_from_mirror + 3, "{mirror1:?}");
    drop(m);
    w.close().unwrap();
    drop(w);

    // The mirror is lost. The directory that remembers it says what to do.
    std::fs::remove_dir_all(&mdir).unwrap();
    let e = Volume::load(&t.path().join("a"), opts()).err().expect("a remembered mirror that has gone");
    assert!(e.to_string().contains("--mirror") && e.to_string().contains("--no-mirror"), "{e}");
    // A machine with only the tape.
    let x = mount(&t.path().join("c"), &url);
    let before = tape::open(&url).unwrap().stats();
    check_tree(&x, &tree);
    assert!(tape::open(&url).unwrap().stats().reads_from_tape > before.reads_from_tape, "read from the tape");
    let rep = maintenance::fsck(&x, true, &maintenance::NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "fsck: {:?}", rep.errors);
    x.close().unwrap();
    drop(x);
    // The first directory, told to stop mirroring, mounts from the tape.
    let y = Volume::load(&t.path().join("a"), OpenOptions { mirror: MirrorChoice::Off, ..opts() }).unwrap();
    check_tree(&y, &tree[..4]);
    y.close().unwrap();
    assert!(!mdir.exists(), "nothing made the mirror again");
}

/// Every file below `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Store reads of any kind (from the drive or its read-ahead memory).
fn store_reads(url: &str) -> u64 {
    let s = tape::open(url).unwrap().stats();
    s.reads_from_tape + s.reads_from_memory
}

/// `recall` of a directory on a machine with only the tape reads its
/// files' data into the local cache in one pass: afterwards reading them
/// asks the tape for nothing, while a file not recalled still goes to the
/// tape; a second recall finds everything cached.
#[test]
fn recall_reads_a_tree_into_the_cache_in_one_pass() {
    setup();
    let t = tempfile::tempdir().unwrap();
    let url = url(t.path());
    init_tape(&t.path().join("a"), &url);
    let v = mount(&t.path().join("a"), &url);
    let mut tree = write_tree(&v, 20);
    for i in 0..3u64 {
        let data = random_bytes(70 + i, 700_000 + 300_000 * i as usize);
        let d = lookup_path(&v, "dir");
        mkfile(&v, d, &format!("big{i}"), &data);
        tree.push((format!("dir/big{i}"), data));
    }
    v.close().unwrap();
    drop(v);

    let w = mount(&t.path().join("b"), &url);
    let (in_dir, at_root): (Vec<_>, Vec<_>) = tree.iter().cloned().partition(|(p, _)| p.starts_with("dir/"));
    let before = (store_reads(&url), tape::open(&url).unwrap().stats().read_batches);
    let rep = w.recall(&[lookup_path(&w, "dir")], &mut |_, _| {}).unwrap();
    let after = (store_reads(&url), tape::open(&url).unwrap().stats().read_batches);
    assert_eq!(rep.files, in_dir.len() as u64, "{rep:?}");
    let wanted: u64 = in_dir.iter().map(|(_, d)| d.len() as u64).sum();
    assert!(rep.stored_bytes >= wanted && rep.fetched_bytes >= wanted, "random data stores about its size: {rep:?}");
    assert_eq!(rep.cached_bytes, 0, "{rep:?}");
    assert!(rep.reads > 0 && after.0 > before.0, "{rep:?}");
    assert!(!rep.overflow, "{rep:?}");

    // The recalled files come from the cache alone.
    check_tree(&w, &in_dir);
    assert_eq!(store_reads(&url), after.0, "reading recalled files asked the tape");
    // A file that was not recalled needs the tape.
    check_tree(&w, &at_root);
    assert!(store_reads(&url) > after.0, "the root's files were not recalled, yet the tape served nothing");

    // Everything is cached now: a second recall of the whole tree reads nothing.
    let again = w.recall(&[ROOT_INO], &mut |_, _| {}).unwrap();
    assert_eq!(again.files, tree.len() as u64);
    assert_eq!((again.fetched_bytes, again.reads), (0, 0), "{again:?}");
    assert_eq!(again.cached_bytes, again.stored_bytes, "{again:?}");
    w.close().unwrap();
}

/// A volume whose data is in its own directory has no cache to recall
/// into: recall (`cairn warmup`) reads its packs' ranges once instead, so
/// the OS page cache holds them.
#[test]
fn recall_on_a_local_volume_reads_its_packs_once() {
    let d = tempfile::tempdir().unwrap();
    init(d.path(), &Default::default()).unwrap();
    let v = Volume::load(d.path(), Default::default()).unwrap();
    let data = random_bytes(5, 300_000);
    mkfile(&v, ROOT_INO, "f", &data);
    v.sync().unwrap();
    let rep = v.recall(&[ROOT_INO], &mut |_, _| {}).unwrap();
    assert!(rep.local && rep.files == 1 && rep.reads > 0, "{rep:?}");
    assert!(rep.stored_bytes >= data.len() as u64 && rep.fetched_bytes >= rep.stored_bytes, "{rep:?}");
    assert_eq!((rep.cached_bytes, rep.cache_capacity, rep.overflow), (0, 0, false), "{rep:?}");
}

/// Another tape where this directory's tape was (a drive's URL names
/// whatever cartridge is loaded): the mount is refused naming both
/// volumes, and nothing is written; the right tape mounts again.
#[test]
fn the_wrong_tape_is_refused_naming_both_volumes() {
    setup();
    let t = tempfile::tempdir().unwrap();
    let url = url(t.path());
    init_tape(&t.path().join("a"), &url);
    let v = mount(&t.path().join("a"), &url);
    let tree = write_tree(&v, 4);
    v.close().unwrap();
    drop(v);
    let ours = serde_json::from_slice::<serde_json::Value>(&std::fs::read(t.path().join("a/volume.json")).unwrap()).unwrap()["volume_id"].as_str().unwrap().to_string();
    // Another volume's tape, then loaded in its place.
    let other = t.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let other_url = format!("tape-emu:{}", other.join("tape").display());
    init_tape(&other.join("dir"), &other_url);
    std::fs::rename(t.path().join("tape"), t.path().join("ours")).unwrap();
    std::fs::rename(other.join("tape"), t.path().join("tape")).unwrap();
    let img = std::fs::read(t.path().join("tape/tape.img")).unwrap();
    let e = Volume::load(&t.path().join("a"), opts()).err().expect("another volume's tape");
    let msg = e.to_string();
    assert!(msg.contains("wrong tape") && msg.contains(&ours), "{msg}");
    let theirs = serde_json::from_slice::<serde_json::Value>(&std::fs::read(other.join("dir/volume.json")).unwrap()).unwrap()["volume_id"].as_str().unwrap().to_string();
    assert!(msg.contains(&theirs) && ours != theirs, "{msg}");
    assert!(std::fs::read(t.path().join("tape/tape.img")).unwrap() == img, "the other tape was written to");
    std::fs::rename(t.path().join("tape"), other.join("tape")).unwrap();
    std::fs::rename(t.path().join("ours"), t.path().join("tape")).unwrap();
    let w = Volume::load(&t.path().join("a"), opts()).unwrap();
    check_tree(&w, &tree);
    w.close().unwrap();
}

/// `cairn tape reclaim`: a volume whose tape holds dead packs and versions
/// (files deleted and overwritten, `gc` run) is copied to a second tape,
/// created with the first one's drive parameters; the second tape alone
/// mounts it on a fresh directory byte for byte, with no dead bytes. The
/// directory attached to the first tape refuses the second; a tape in use
/// cannot be reclaimed from.
#[test]
fn a_reclaimed_tape_mounts_alone_byte_for_byte() {
    setup();
    let t = tempfile::tempdir().unwrap();
    let url = url(t.path());
    let dst = format!("tape-emu:{}", t.path().join("tape2").display());
    init_tape(&t.path().join("a"), &url);
    let v = mount(&t.path().join("a"), &url);
    let mut tree = write_tree(&v, 16);
    v.sync().unwrap();
    // Deleted, and overwritten with other bytes: their packs die.
    for i in [0u64, 3, 4, 7, 12, 2, 9] {
        let (path, _) = tree.iter().find(|(p, _)| p.ends_with(&format!("f{i}"))).unwrap().clone();
        let parent = if path.starts_with("dir/") { lookup_path(&v, "dir") } else { ROOT_INO };
        v.unlink(parent, format!("f{i}").as_bytes()).unwrap();
        tree.retain(|(p, _)| *p != path);
        if i == 2 || i == 9 {
            let data = random_bytes(900 + i, 60_000);
            mkfile(&v, parent, &format!("f{i}"), &data);
            tree.push((path, data));
        }
    }
    v.sync().unwrap();
    let gc = maintenance::gc(&v, 0.9, &maintenance::NoProgress).unwrap();
    assert!(gc.packs_deleted > 0, "{gc:?}");
    // Trashed packs go once the versions naming them are pruned: then
    // they, and the pruned versions, are dead on the tape.
    for _ in 0..4 {
        v.ship_base_now().unwrap();
    }
    v.sync().unwrap();

    // In use by the mount: refused, and no destination is made.
    let o = TapeOptions { virtual_clock: true, store: StoreOptions { queue_bytes: 4 << 20, ..Default::default() } };
    let e = tape::open_reclaim(&url, &dst, &o).err().expect("the source is busy");
    assert!(e.to_string().contains("busy"), "{e}");
    assert!(!t.path().join("tape2").exists());
    v.close().unwrap();
    drop(v);

    let (s, d) = tape::open_reclaim(&url, &dst, &o).unwrap();
    let (live, dead) = s.space();
    assert!(dead > 0);
    let r = cairn_tape::store::reclaim(&s, &d, &mut |_, _| {}).unwrap();
    assert_eq!((r.bytes, r.dead_bytes_left), (live, dead));
    drop(s);
    drop(d);
    assert_eq!(tape::open(&dst).unwrap().index().space(), (live, 0), "no dead bytes on the new tape");
    let params = |d: &str| std::fs::read_to_string(t.path().join(d).join("params.json")).unwrap();
    assert_eq!(params("tape2"), params("tape"));
    // Not again onto a tape that now holds a volume.
    let e = tape::open_reclaim(&url, &dst, &o).err().expect("the destination is not blank");
    assert!(e.to_string().contains("already holds Cairn tape volume"), "{e}");

    let e = cloud::attach(&t.path().join("a"), &dst, None, None, None).unwrap_err();
    assert!(e.to_string().contains("choose another --cache-dir"), "{e}");
    let w = mount(&t.path().join("b"), &dst);
    check_tree(&w, &tree);
    for gone in ["f0", "f4", "f12"] {
        assert_eq!(w.lookup(ROOT_INO, gone.as_bytes()).unwrap_err().errno(), libc::ENOENT);
    }
    let rep = maintenance::fsck(&w, true, &maintenance::NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "fsck: {:?}", rep.errors);
    w.close().unwrap();
}
