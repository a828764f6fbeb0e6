//! A home that declares what a tape cannot do cheaply (docs/tape.md §1):
//! puts that last only after `sync`, one opener at a time, deletes that
//! free nothing, costly positioning. The engine must fsync through `sync`,
//! keep no lease, run no cleaner, and flush files in long runs. The store
//! here is the memory store behind a buffer that a "power cut" empties,
//! as a drive's buffer is lost when the power goes.

use crate::cloud::{init_in, lookup_path, URL};
use crate::common::*;
use cairn_backend::{Backend, Capabilities, ObjectInfo, Result};
use cairn_engine::cache::disk::Durability;
use cairn_engine::cloud::{self, CloudOptions};
use cairn_engine::*;
use cairn_testing::MemoryBackend;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Objects reach `durable` only at `sync`; until then they sit in `buffer`
/// (readable, as a drive reads its own buffer) and a power cut drops them.
#[derive(Default)]
struct Buffered {
    durable: MemoryBackend,
    buffer: Mutex<BTreeMap<String, Vec<u8>>>,
    syncs: AtomicU64,
    puts: Mutex<Vec<String>>,
    /// What `backlog` says: the drive is moving and needs data.
    streaming: std::sync::atomic::AtomicBool,
    /// Bytes put since the test last said the drive took them (what
    /// `backlog` reports queued).
    queued: AtomicU64,
    /// Packs read, in order.
    reads: Mutex<Vec<String>>,
}

impl Buffered {
    fn power_cut(&self) {
        self.buffer.lock().clear();
    }
}

impl Backend for Buffered {
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        cairn_backend::validate_name(name)?;
        self.puts.lock().push(name.to_string());
        self.queued.fetch_add(data.len() as u64, Ordering::SeqCst);
        self.buffer.lock().insert(name.to_string(), data.to_vec());
        Ok(())
    }
    fn put_if_absent(&self, name: &str, data: &[u8]) -> Result<()> {
        if self.buffer.lock().contains_key(name) || self.durable.size(name).is_ok() {
            return Err(cairn_backend::Error::new(cairn_backend::ErrorKind::AlreadyExists, format!("{name} exists")).with_object(name));
        }
        self.put(name, data)
    }
    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.reads.lock().push(name.to_string());
        if let Some(d) = self.buffer.lock().get(name) {
            return Ok(d[offset as usize..(offset + len) as usize].to_vec());
        }
        self.durable.get_range(name, offset, len)
    }
    fn get(&self, name: &str) -> Result<Vec<u8>> {
        if let Some(d) = self.buffer.lock().get(name) {
            return Ok(d.clone());
        }
        self.durable.get(name)
    }
    fn size(&self, name: &str) -> Result<u64> {
        if let Some(d) = self.buffer.lock().get(name) {
            return Ok(d.len() as u64);
        }
        self.durable.size(name)
    }
    fn delete(&self, name: &str) -> Result<()> {
        self.buffer.lock().remove(name);
        self.durable.delete(name)
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let mut out = self.durable.list(prefix)?;
        out.retain(|o| !self.buffer.lock().contains_key(&o.name));
        out.extend(self.buffer.lock().iter().filter(|(n, _)| n.starts_with(prefix)).map(|(n, d)| ObjectInfo {
            name: n.clone(),
            size: d.len() as u64,
        }));
        Ok(out)
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            remote: true,
            cheap_ranged_reads: false,
            frees_on_delete: false,
            preferred_pack_size: 1 << 20,
            exclusive: true,
            deferred_durability: true,
        }
    }
    fn sync(&self) -> Result<()> {
        let buffered = std::mem::take(&mut *self.buffer.lock());
        for (n, d) in buffered {
            self.durable.put(&n, &d)?;
        }
        self.syncs.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn describe(&self) -> String {
        "buffered".into()
    }
    fn sequential(&self) -> Option<&dyn cairn_backend::Sequential> {
        Some(self)
    }
}

impl cairn_backend::Sequential for Buffered {
    fn backlog(&self) -> cairn_backend::Backlog {
        cairn_backend::Backlog { queued_bytes: self.queued.load(Ordering::SeqCst), streaming: self.streaming.load(Ordering::SeqCst) }
    }
}

fn opts(b: &Arc<dyn Backend>) -> OpenOptions {
    OpenOptions {
        backend: Some(InjectedBackend(b.clone())),
        // Asked for local durability and a cleaner: the store's
        // capabilities overrule both.
        cloud: CloudOptions {
            cache_bytes: 64 << 20,
            durability: Durability::Local,
            meta_interval: Duration::from_secs(3600),
            gc_interval: Some(Duration::from_millis(50)),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A volume on a fresh [`Buffered`] store, with a local cache of
/// `cache_bytes` (on such a store the journal is half of it).
fn buffered_volume(cache_bytes: u64) -> (Arc<Buffered>, Arc<dyn Backend>, tempfile::TempDir, Arc<Volume>) {
    let store = Arc::new(Buffered::default());
    let b: Arc<dyn Backend> = store.clone();
    let a = tempfile::tempdir().unwrap();
    init_in(a.path(), &b, None);
    cloud::attach(a.path(), URL, None, None, Some(&InjectedBackend(b.clone()))).unwrap();
    let o = opts(&b);
    let v = Volume::load(a.path(), OpenOptions { cloud: CloudOptions { cache_bytes, ..o.cloud.clone() }, ..o }).unwrap();
    (store, b, a, v)
}

/// fsync'd files survive a power cut that empties the store's buffer; the
/// volume never wrote a lease or trash, and reopens on a machine that only
/// has the store.
#[test]
fn fsync_reaches_a_store_whose_puts_last_only_after_sync() {
    let store = Arc::new(Buffered::default());
    let b: Arc<dyn Backend> = store.clone();
    let a = tempfile::tempdir().unwrap();
    init_in(a.path(), &b, None);
    store.sync().unwrap(); // init's objects were made durable by whoever initialised
    cloud::attach(a.path(), URL, None, None, Some(&InjectedBackend(b.clone()))).unwrap();
    let v = Volume::load(a.path(), opts(&b)).unwrap();

    let kept = random_bytes(1, 300_000);
    let ino = mkfile(&v, ROOT_INO, "kept", &kept);
    let before = store.syncs.load(Ordering::SeqCst);
    v.fsync(ino, false).unwrap();
    assert!(store.syncs.load(Ordering::SeqCst) > before, "fsync ended with the store's sync");
    assert!(store.buffer.lock().is_empty(), "nothing put before the fsync returned is left unsynced");

    // A wholly dead pack: a cleaner would trash it at once (it is due
    // at any price); here deletes free nothing, so none runs.
    let gone = mkfile(&v, ROOT_INO, "gone", &random_bytes(4, 100_000));
    v.flush_file_now(gone).unwrap();
    v.unlink(ROOT_INO, b"gone").unwrap();
    v.sync().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(maintenance::stats(&v).unwrap().dead_bytes >= 100_000, "the dead bytes stay where they are");

    // Written after the fsync, never synced: the power cut may take it.
    let lost = random_bytes(2, 200_000);
    let ino2 = mkfile(&v, ROOT_INO, "unsynced", &lost);
    v.flush_file_now(ino2).unwrap();
    v.simulate_crash();
    store.power_cut();

    let puts = store.puts.lock().clone();
    assert!(!puts.iter().any(|n| n == "lease"), "an exclusive store keeps no lease: {puts:?}");
    assert!(!puts.iter().any(|n| n.starts_with("trash/")), "no cleaner on a store whose deletes free nothing: {puts:?}");

    // A machine with only the store.
    let c = tempfile::tempdir().unwrap();
    cloud::attach(c.path(), URL, None, None, Some(&InjectedBackend(b.clone()))).unwrap();
    let w = Volume::load(c.path(), opts(&b)).unwrap();
    assert_eq!(read_all(&w, lookup_path(&w, "kept")), kept);
    w.close().unwrap();
}

/// On such a store an open file is flushed in runs: not by age (5 s) nor
/// at 64 MiB, but when closed (or when its run fills); and unmount syncs.
#[test]
fn files_are_flushed_whole_when_positioning_is_costly() {
    let store = Arc::new(Buffered::default());
    let b: Arc<dyn Backend> = store.clone();
    let a = tempfile::tempdir().unwrap();
    init_in(a.path(), &b, None);
    cloud::attach(a.path(), URL, None, None, Some(&InjectedBackend(b.clone()))).unwrap();
    let v = Volume::load(
        a.path(),
        OpenOptions {
            flush_age: Duration::from_millis(10),
            ..opts(&b)
        },
    )
    .unwrap();
    let attr = v.create(ROOT_INO, b"open", FileKind::File, 0o644, 0, root()).unwrap();
    v.open(attr.ino).unwrap();
    let data = random_bytes(3, 3 << 20);
    v.write(attr.ino, 0, &data).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let packs = |s: &Buffered| s.puts.lock().iter().filter(|n| n.starts_with("packs/")).count();
    assert_eq!(v.flush_due().unwrap().files, 0, "an open file younger than a minute waits for its run");
    assert_eq!(packs(&store), 0);
    v.release(attr.ino).unwrap();
    assert_eq!(v.flush_due().unwrap().files, 1, "closed: due");
    assert!(packs(&store) >= 1);
    let before = store.syncs.load(Ordering::SeqCst);
    v.close().unwrap();
    assert!(store.syncs.load(Ordering::SeqCst) > before, "unmount syncs the store");
    assert!(store.buffer.lock().is_empty());
}

/// A drive about to run dry is fed the open file with the most dirty data
/// once it holds a minimal run (64 MiB), before its full run; the file fed
/// last is fed again before a larger one, so its runs lie together on the
/// tape. A standing drive with two files being written waits for runs.
#[test]
fn a_drive_is_fed_before_it_runs_dry_and_one_file_at_a_time() {
    // A journal of 1 GiB: runs of 256 MiB for two writers.
    let (store, b, a, v) = buffered_volume(2 << 30);
    let packed = |s: &Buffered| -> usize { s.buffer.lock().iter().filter(|(n, _)| n.starts_with("packs/")).map(|(_, d)| d.len()).sum() };
    // The drive has plenty queued until `fed` says it took it.
    let busy = || store.queued.store(1 << 40, Ordering::SeqCst);
    busy();
    let small = v.create(ROOT_INO, b"small", FileKind::File, 0o644, 0, root()).unwrap().ino;
    let big = v.create(ROOT_INO, b"big", FileKind::File, 0o644, 0, root()).unwrap().ino;
    v.open(small).unwrap();
    v.open(big).unwrap();
    let mut small_data = random_bytes(5, 8 << 20);
    v.write(small, 0, &small_data).unwrap();
    let data = random_bytes(6, 132 << 20);
    let (first, second) = data.split_at(66 << 20);
    for (i, part) in first.chunks(4 << 20).enumerate() {
        v.write(big, (i as u64) << 22, part).unwrap();
    }
    // The background flusher or this call, well within the age (60 s)
    // that would flush the files anyway.
    // Each feed queues more than a pack, so no second one follows until
    // the drive has taken it.
    let fed = |what: &str| {
        store.queued.store(0, Ordering::SeqCst);
        let before = packed(&store);
        let t = std::time::Instant::now();
        while packed(&store) == before && t.elapsed() < Duration::from_secs(20) {
            v.flush_due().unwrap();
        }
        let n = packed(&store) - before;
        assert!(n > 0, "{what}: the drive was not fed");
        n
    };
    store.queued.store(0, Ordering::SeqCst);
    assert_eq!(v.flush_due().unwrap().files, 0, "a standing drive waits for a full run");
    assert_eq!(packed(&store), 0);
    store.streaming.store(true, Ordering::SeqCst);
    let n = fed("streaming");
    assert!(n > 56 << 20 && n < 67 << 20, "the big file less its last chunk, not the small one: {n} bytes packed");
    store.queued.store(0, Ordering::SeqCst);
    assert_eq!(v.flush_due().unwrap().files, 0, "what is left of either file is below a minimal run");
    assert_eq!(v.status().dirty_files, 2);
    busy();

    // Now the small file has more dirty bytes than the big one, both
    // above a minimal run: the big one, fed last, goes first.
    for (i, part) in second.chunks(4 << 20).enumerate() {
        v.write(big, (66 << 20) + ((i as u64) << 22), part).unwrap();
    }
    let more = random_bytes(7, 74 << 20);
    v.write(small, 8 << 20, &more).unwrap();
    small_data.extend_from_slice(&more);
    let n = fed("streaming again");
    assert!(n > 60 << 20 && n < 70 << 20, "the big file again (about 66 MiB), not the small one (82 MiB): {n} bytes packed");
    assert!(v.status().journal_limit >= 1 << 30, "a tape's journal is half the local cache");
    // The small file closes while the big one, fed last, is still being
    // written and the drive has enough queued: it waits, so nothing lands
    // between the big file's runs.
    v.release(small).unwrap();
    busy();
    let before = store.puts.lock().len();
    assert_eq!(v.flush_due().unwrap().files, 0, "a closed file went between the fed file's runs");
    assert_eq!(v.status().dirty_files, 2);
    // Nor when the drive needs feeding and the big file, first in a walk
    // and still being written, has less than a run: the closed small one
    // (a run and more) waits for it all the same.
    store.queued.store(0, Ordering::SeqCst);
    assert_eq!(v.flush_due().unwrap().files, 0, "a closed file was fed between the runs of a file still being written that a walk meets first");
    assert_eq!(v.status().dirty_files, 2);
    busy();
    // The big one closes: one round takes it first, then the small one.
    v.write(big, 132 << 20, &random_bytes(9, 1 << 20)).unwrap();
    v.release(big).unwrap();
    let t = std::time::Instant::now();
    while v.status().dirty_files > 0 && t.elapsed() < Duration::from_secs(20) {
        v.flush_due().unwrap();
    }
    assert_eq!(v.status().dirty_files, 0, "closed files were not flushed");
    let puts: Vec<String> = store.puts.lock()[before..].iter().filter(|n| n.starts_with("packs/")).cloned().collect();
    let mut data = data;
    data.extend_from_slice(&random_bytes(9, 1 << 20));
    v.close().unwrap();
    drop(v);
    let w = Volume::load(a.path(), opts(&b)).unwrap();
    assert!(read_all(&w, lookup_path(&w, "big")) == data);
    assert!(read_all(&w, lookup_path(&w, "small")) == small_data);
    // The last round's packs: the big file's rest, then the small file.
    let pack_of = |name: &str| -> Vec<usize> {
        let runs = w.info(format!("/{name}").as_bytes(), root()).unwrap().runs;
        runs.iter().filter_map(|r| puts.iter().position(|p| Some(p.as_str()) == r.pack.as_deref())).collect()
    };
    let (big_last, small_first) = (pack_of("big").into_iter().max(), pack_of("small").into_iter().min());
    assert!(big_last.is_some() && small_first.is_some(), "the last round held both files: {big_last:?} {small_first:?}");
    assert!(big_last <= small_first, "the small file went before the big one's last run");
    w.close().unwrap();
}

/// A standing drive with one file alone being written starts with that
/// file's first minimal run (its runs follow one another on the tape, so
/// reading it back costs no positioning); below a minimal run it waits.
#[test]
fn a_lone_writer_starts_a_standing_drive() {
    let (store, b, a, v) = buffered_volume(2 << 30);
    let packs = |s: &Buffered| s.puts.lock().iter().filter(|n| n.starts_with("packs/")).count();
    let lone = v.create(ROOT_INO, b"lone", FileKind::File, 0o644, 0, root()).unwrap().ino;
    v.open(lone).unwrap();
    let data = random_bytes(7, 66 << 20);
    let (head, tail) = data.split_at(60 << 20);
    for (i, part) in head.chunks(4 << 20).enumerate() {
        v.write(lone, (i as u64) << 22, part).unwrap();
    }
    assert_eq!(v.flush_due().unwrap().files, 0, "below a minimal run the drive waits");
    assert_eq!(packs(&store), 0);
    v.write(lone, 60 << 20, tail).unwrap();
    // The background flusher or this call, well within the age (60 s)
    // that would flush it anyway.
    let t = std::time::Instant::now();
    while packs(&store) == 0 && t.elapsed() < Duration::from_secs(20) {
        v.flush_due().unwrap();
    }
    assert!(packs(&store) >= 1, "the lone writer started the drive");
    v.release(lone).unwrap();
    v.close().unwrap();
    drop(v);
    let w = Volume::load(a.path(), opts(&b)).unwrap();
    assert!(read_all(&w, lookup_path(&w, "lone")) == data);
    w.close().unwrap();
}

/// A file written alone in many rounds lies on the store in file order:
/// its packs, taken in the order the file's bytes lie in them, were put in
/// that order (none overtook another), so a tape reads it back in one
/// forward pass. (The order of the reads themselves is the tape store's
/// to choose: read-ahead sends several runs at once and the tape batches
/// them by position; this store serves them as they come, so it cannot
/// show that.)
#[test]
fn a_files_packs_reach_the_store_in_file_order() {
    let (store, b, _a, v) = buffered_volume(2 << 30);
    store.streaming.store(true, Ordering::SeqCst);
    let ino = v.create(ROOT_INO, b"f", FileKind::File, 0o644, 0, root()).unwrap().ino;
    v.open(ino).unwrap();
    let data = random_bytes(8, 200 << 20);
    for (i, part) in data.chunks(8 << 20).enumerate() {
        v.write(ino, (i as u64) << 23, part).unwrap();
        store.queued.store(0, Ordering::SeqCst);
        v.flush_due().unwrap();
    }
    v.release(ino).unwrap();
    v.close().unwrap();
    drop(v);
    let put: Vec<String> = store.puts.lock().iter().filter(|n| n.starts_with("packs/")).cloned().collect();
    assert!(put.len() > 100, "{} packs", put.len());
    let c = tempfile::tempdir().unwrap();
    cloud::attach(c.path(), URL, None, None, Some(&InjectedBackend(b.clone()))).unwrap();
    let w = Volume::load(c.path(), opts(&b)).unwrap();
    let f = lookup_path(&w, "f");
    // The metadata from the store alone places every byte of the file.
    let runs = w.info(b"/f", root()).unwrap().runs;
    assert_eq!(runs.iter().map(|r| r.len).sum::<u64>(), data.len() as u64);
    // Each pack by where the file's bytes first lie in it, as its place in
    // the put order.
    let mut order: Vec<usize> = Vec::new();
    for r in &runs {
        let name = r.pack.as_deref().unwrap_or_else(|| panic!("bytes at {} are in no pack", r.offset));
        let i = put.iter().position(|p| p == name).unwrap_or_else(|| panic!("{name} was never put"));
        if order.last() != Some(&i) {
            assert!(!order.contains(&i), "the file comes back to pack #{i} at {}", r.offset);
            order.push(i);
        }
    }
    assert!(order.len() > put.len() * 9 / 10, "{} of {} packs hold the file", order.len(), put.len());
    let at: Vec<(usize, usize)> = order.windows(2).filter(|w| w[1] < w[0]).map(|w| (w[0], w[1])).collect();
    assert!(at.is_empty(), "the file's bytes go back in the put order {} times: {at:?} of {}", at.len(), order.len());
    // And it reads back from the store alone.
    for off in (0..data.len()).step_by(64 << 10) {
        assert_eq!(w.read(f, off as u64, 1).unwrap(), &data[off..off + 1]);
    }
    w.close().unwrap();
}

/// Files written at once go down in the order a walk of the tree meets
/// them (a directory lists its names in order), whatever order they were
/// created or closed in: a closed file waits while a file before it is
/// still being written, so a restore reading them by name streams without
/// locating back (docs/tape.md §10). A writer that stopped writing holds
/// nothing back for longer than `FEEDING` (5 s).
#[test]
fn files_written_at_once_go_down_in_name_order() {
    let (store, b, a, v) = buffered_volume(2 << 30);
    // Created c, a, b (so inode order is not name order), written in turns.
    let inos: Vec<Ino> = ["c", "a", "b"].iter().map(|n| v.create(ROOT_INO, n.as_bytes(), FileKind::File, 0o644, 0, root()).unwrap().ino).collect();
    let datas: Vec<Vec<u8>> = (0..3).map(|i| random_bytes(40 + i, 3 << 20)).collect();
    for &ino in &inos {
        v.open(ino).unwrap();
    }
    for part in 0..3usize {
        for (ino, data) in inos.iter().zip(&datas) {
            v.write(*ino, (part as u64) << 20, &data[part << 20..(part + 1) << 20]).unwrap();
        }
    }
    let before = store.puts.lock().len();
    // c and b close first: they wait for a, still being written.
    v.release(inos[0]).unwrap();
    v.release(inos[2]).unwrap();
    assert_eq!(v.flush_due().unwrap().files, 0, "a closed file went before a file still being written that a walk meets first");
    assert_eq!(v.status().dirty_files, 3);
    v.release(inos[1]).unwrap();
    let t = std::time::Instant::now();
    while v.status().dirty_files > 0 && t.elapsed() < Duration::from_secs(20) {
        v.flush_due().unwrap();
    }
    assert_eq!(v.status().dirty_files, 0, "closed files were not flushed");

    // A writer that stops writing holds the others back no longer than 5 s.
    let slow = v.create(ROOT_INO, b"d", FileKind::File, 0o644, 0, root()).unwrap().ino;
    let later = v.create(ROOT_INO, b"e", FileKind::File, 0o644, 0, root()).unwrap().ino;
    v.open(slow).unwrap();
    v.open(later).unwrap();
    v.write(slow, 0, b"a line of a log").unwrap();
    v.write(later, 0, &random_bytes(45, 1 << 20)).unwrap();
    v.release(later).unwrap();
    assert_eq!(v.flush_due().unwrap().files, 0, "e waits while d was written a moment ago");
    std::thread::sleep(Duration::from_millis(5_200));
    let t = std::time::Instant::now();
    while v.status().dirty_files > 1 && t.elapsed() < Duration::from_secs(20) {
        v.flush_due().unwrap();
    }
    assert_eq!(v.status().dirty_files, 1, "e still waits for d, which stopped writing 5 s ago");
    v.release(slow).unwrap();
    let puts: Vec<String> = store.puts.lock()[before..].iter().filter(|n| n.starts_with("packs/")).cloned().collect();
    v.close().unwrap();
    drop(v);
    let w = Volume::load(a.path(), opts(&b)).unwrap();
    let mut spans = Vec::new();
    for (name, data) in ["c", "a", "b"].iter().zip(&datas) {
        assert!(&read_all(&w, lookup_path(&w, name)) == data, "{name} differs");
        let runs = w.info(format!("/{name}").as_bytes(), root()).unwrap().runs;
        let at: Vec<usize> = runs.iter().map(|r| puts.iter().position(|p| Some(p.as_str()) == r.pack.as_deref()).expect("a pack put in this test")).collect();
        spans.push((*name, *at.iter().min().unwrap(), *at.iter().max().unwrap()));
    }
    spans.sort_by_key(|s| s.1);
    let order: Vec<&str> = spans.iter().map(|s| s.0).collect();
    assert_eq!(order, ["a", "b", "c"], "the files' order on the store (by first pack): {spans:?}");
    assert!(spans.windows(2).all(|w| w[0].2 <= w[1].1), "one file's packs went between another's: {spans:?}");
    w.close().unwrap();
}

/// A file written under one name and renamed while it is written (rsync
/// and editors write a temporary name) takes its new place in the walk: a
/// closed file after the new name waits for it, as one after the old name
/// would not.
#[test]
fn a_renamed_file_takes_its_new_place_in_the_walk() {
    let (_store, _b, _a, v) = buffered_volume(2 << 30);
    let tmp = v.create(ROOT_INO, b"z.tmp", FileKind::File, 0o644, 0, root()).unwrap().ino;
    let m = v.create(ROOT_INO, b"m", FileKind::File, 0o644, 0, root()).unwrap().ino;
    v.open(tmp).unwrap();
    v.open(m).unwrap();
    v.write(tmp, 0, &random_bytes(50, 1 << 20)).unwrap();
    v.write(m, 0, &random_bytes(51, 1 << 20)).unwrap();
    v.rename(ROOT_INO, b"z.tmp", ROOT_INO, b"a", RenameFlags::default()).unwrap();
    v.write(tmp, 1 << 20, &random_bytes(52, 1 << 20)).unwrap();
    v.release(m).unwrap();
    assert_eq!(v.flush_due().unwrap().files, 0, "m went before a, still being written, which a walk now meets first");
    // RENAME_EXCHANGE moves both: the file being written, the exchange's
    // target here, takes the place "z" of a clean file, after m, which
    // then waits no longer.
    let clean = v.create(ROOT_INO, b"z", FileKind::File, 0o644, 0, root()).unwrap().ino;
    v.rename(ROOT_INO, b"z", ROOT_INO, b"a", RenameFlags { exchange: true, ..Default::default() }).unwrap();
    assert_eq!((lookup_path(&v, "z"), lookup_path(&v, "a")), (tmp, clean));
    v.write(tmp, 2 << 20, &random_bytes(53, 1 << 20)).unwrap();
    assert_eq!(v.flush_due().unwrap().files, 1, "m waited for the file being written, which an exchange moved after it");
    v.release(tmp).unwrap();
    let t = std::time::Instant::now();
    while v.status().dirty_files > 0 && t.elapsed() < Duration::from_secs(20) {
        v.flush_due().unwrap();
    }
    assert_eq!(v.status().dirty_files, 0, "closed files were not flushed");
    v.close().unwrap();
}
