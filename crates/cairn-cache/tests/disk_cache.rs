//! The disk cache and upload outbox (`cairn_cache::disk::CachedBackend`) over the
//! test doubles: the backend contract through it, read-through in coalesced
//! blocks, the outbox through an outage, writers blocked by a full outbox,
//! reopen, eviction (LRU and the kd-tree policy), a flaky store, and one
//! GET for concurrent misses.

use cairn_backend::{conformance, Backend, Capabilities, Error, ErrorKind, ObjectInfo, Result, RetryPolicy, Retrying};
use cairn_cache::disk::{CachedBackend, DiskCacheOptions, Durability};
use cairn_cache::{IoWindows, PolicyChoice, ReadFor};
use cairn_backend::{Metered, RequestKind, Subsystem};
use cairn_testing::{FaultPlan, FaultyBackend, MemoryBackend};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant, SystemTime};

const KIB: u64 = 1 << 10;

/// Counts the requests that reach a backend, by kind, and can refuse or
/// slow down writes while reads go on (an upload path that is down).
struct Probe<B> {
    inner: B,
    gets: AtomicU64,
    heads: AtomicU64,
    puts: AtomicU64,
    others: AtomicU64,
    refuse_puts: AtomicBool,
    put_delay_ms: AtomicU64,
}

impl<B: Backend> Probe<B> {
    fn new(inner: B) -> Arc<Self> {
        Arc::new(Probe { inner, gets: AtomicU64::new(0), heads: AtomicU64::new(0), puts: AtomicU64::new(0), others: AtomicU64::new(0), refuse_puts: AtomicBool::new(false), put_delay_ms: AtomicU64::new(0) })
    }
    fn gets(&self) -> u64 {
        self.gets.load(Ordering::SeqCst)
    }
    fn heads(&self) -> u64 {
        self.heads.load(Ordering::SeqCst)
    }
    fn puts(&self) -> u64 {
        self.puts.load(Ordering::SeqCst)
    }
    fn total(&self) -> u64 {
        self.gets() + self.heads() + self.puts() + self.others.load(Ordering::SeqCst)
    }
    fn write(&self, name: &str, f: impl FnOnce() -> Result<()>) -> Result<()> {
        self.puts.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(self.put_delay_ms.load(Ordering::SeqCst)));
        if self.refuse_puts.load(Ordering::SeqCst) {
            return Err(Error::new(ErrorKind::Transient, format!("put {name}: refused (test)")).with_object(name));
        }
        f()
    }
}

impl<B: Backend> Backend for Probe<B> {
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        self.write(name, || self.inner.put(name, data))
    }
    fn put_if_absent(&self, name: &str, data: &[u8]) -> Result<()> {
        self.write(name, || self.inner.put_if_absent(name, data))
    }
    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        self.inner.get_range(name, offset, len)
    }
    fn get(&self, name: &str) -> Result<Vec<u8>> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        self.inner.get(name)
    }
    fn size(&self, name: &str) -> Result<u64> {
        self.heads.fetch_add(1, Ordering::SeqCst);
        self.inner.size(name)
    }
    fn delete(&self, name: &str) -> Result<()> {
        self.others.fetch_add(1, Ordering::SeqCst);
        self.inner.delete(name)
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        self.others.fetch_add(1, Ordering::SeqCst);
        self.inner.list(prefix)
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

/// Puts every object of the conformance suite under `packs/`, so that the
/// suite runs through the cache's own paths (its names, `conf/...`, would
/// otherwise pass straight through).
struct InPacks<'a>(&'a dyn Backend);

fn in_packs(name: &str) -> String {
    format!("packs/{name}")
}

fn out_of_packs(e: Error) -> Error {
    match e.object().and_then(|o| o.strip_prefix("packs/")).map(str::to_string) {
        Some(o) => e.with_object(o),
        None => e,
    }
}

impl Backend for InPacks<'_> {
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        self.0.put(&in_packs(name), data).map_err(out_of_packs)
    }
    fn put_if_absent(&self, name: &str, data: &[u8]) -> Result<()> {
        self.0.put_if_absent(&in_packs(name), data).map_err(out_of_packs)
    }
    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.0.get_range(&in_packs(name), offset, len).map_err(out_of_packs)
    }
    fn get(&self, name: &str) -> Result<Vec<u8>> {
        self.0.get(&in_packs(name)).map_err(out_of_packs)
    }
    fn size(&self, name: &str) -> Result<u64> {
        self.0.size(&in_packs(name)).map_err(out_of_packs)
    }
    fn delete(&self, name: &str) -> Result<()> {
        self.0.delete(&in_packs(name)).map_err(out_of_packs)
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let all = self.0.list(&in_packs(prefix)).map_err(out_of_packs)?;
        Ok(all.into_iter().map(|o| ObjectInfo { name: o.name["packs/".len()..].to_string(), size: o.size }).collect())
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
    fn describe(&self) -> String {
        self.0.describe()
    }
}

/// Deterministic pseudo-random bytes.
fn bytes(seed: u64, len: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len as usize + 8);
    while (v.len() as u64) < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len as usize);
    v
}

/// A cache fetching blocks of `block` (0: exact ranges), never merging
/// two gaps of a read into one GET nor reading ahead.
fn opts(dir: &Path, capacity: u64, block: u64, durability: Durability) -> DiskCacheOptions {
    DiskCacheOptions { dir: dir.to_path_buf(), capacity, block, merge_below: 0, ahead: 0, durability, uploaders: 2, keep_piece: cairn_cache::disk::KEEP_PIECE }
}

fn eventually(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(t.elapsed() < timeout, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// Fails unless `name` is missing from `b` (without printing its bytes).
fn assert_missing(b: &dyn Backend, name: &str, why: &str) {
    match b.get(name) {
        Err(e) => assert_eq!(e.kind(), ErrorKind::NotFound, "{name}: {e}"),
        Ok(v) => panic!("{name} ({} bytes) is there: {why}", v.len()),
    }
}

fn range(data: &[u8], off: u64, len: u64) -> &[u8] {
    &data[off as usize..(off + len) as usize]
}

/// Every check of the backend contract holds through the cache, with both
/// durabilities, a roomy cache and one smaller than the suite's largest
/// object (so puts wait for uploads and reads go through evicted blocks),
/// for names that pass through and for packs; and again after a reopen.
/// With local durability every pack ends up in the remote, byte for byte.
#[test]
fn the_backend_contract_holds_through_the_cache() {
    for durability in [Durability::Local, Durability::Remote] {
        for (capacity, block) in [(64 << 20, 4 << 20), (64 * KIB, 4 * KIB)] {
            let d = tempfile::tempdir().unwrap();
            let mem = Arc::new(MemoryBackend::new());
            let c = CachedBackend::open(mem.clone(), opts(d.path(), capacity, block, durability)).unwrap();
            conformance::run_all(&*c);
            conformance::run_all(&InPacks(&*c));
            c.drain(&mut |_, _| {});
            let listed = c.list("packs/").unwrap();
            assert!(listed.len() >= 8, "{durability:?}: {listed:?}");
            for o in &listed {
                let stored = mem.get(&o.name).unwrap_or_else(|e| panic!("{durability:?}: {} is not in the remote: {e}", o.name));
                assert_eq!(stored.len() as u64, o.size, "{durability:?}: {}", o.name);
                assert_eq!(c.get(&o.name).unwrap(), stored, "{durability:?}: {}", o.name);
            }
            let s = c.stats();
            match durability {
                Durability::Local => assert!(s.uploads >= 8, "{s:?}"),
                Durability::Remote => assert_eq!((s.uploads, s.dirty_objects), (0, 0), "{s:?}"),
            }
            assert!(s.hits > 0 && s.clean_bytes <= capacity, "{s:?}");
            drop(c);
            let c = CachedBackend::open(mem.clone(), opts(d.path(), capacity, block, durability)).unwrap();
            conformance::run_all(&InPacks(&*c));
            assert!(c.describe().starts_with(&format!("cache {} over memory:", d.path().display())), "{}", c.describe());
            assert_eq!(c.capabilities(), Capabilities::LOCAL);
        }
    }
}

/// A first read makes one GET (and one size request) of exactly its bytes,
/// the same read none; a read over held extents fetches only the gaps
/// between them, one GET each, or one GET for gaps closer than the merge
/// distance; aligned fetches round out, clamped to the object's end;
/// reading past the end fails without a request. A reopened cache serves
/// all of it without a GET (one size request per object).
/// A pack written stays cached in pieces of `keep_piece` bytes (a tape's
/// cache keeps 4 MiB ones: creating a file per 64 KiB slowed its flush
/// below the drive's rate), and reads after a reopen come from them.
#[test]
fn written_packs_are_kept_in_pieces_of_the_size_asked() {
    const A: &str = "packs/00/a";
    for durability in [Durability::Local, Durability::Remote] {
        for (piece, files) in [(64 * KIB, 56), (1 << 20, 4)] {
            let d = tempfile::tempdir().unwrap();
            let probe = Probe::new(Arc::new(MemoryBackend::new()));
            let data = bytes(3, 3 * (1 << 20) + 512 * KIB);
            let o = DiskCacheOptions { keep_piece: piece, ..opts(d.path(), 64 << 20, 0, durability) };
            let c = CachedBackend::open(probe.clone(), o.clone()).unwrap();
            c.put(A, &data).unwrap();
            c.drain(&mut |_, _| {});
            assert_eq!(files_in(&d.path().join("data")).len(), files, "{durability:?}, pieces of {piece}");
            drop(c);
            let c = CachedBackend::open(probe.clone(), o).unwrap();
            let gets = probe.gets();
            assert!(c.get(A).unwrap() == data, "{durability:?}, pieces of {piece}");
            assert_eq!(probe.gets(), gets, "{durability:?}: read from the remote, not the pieces");
        }
    }
}

#[test]
fn reads_fetch_exactly_their_gaps_and_survive_a_reopen() {
    const B: u64 = 64 * KIB;
    const A: &str = "packs/00/a";
    let d = tempfile::tempdir().unwrap();
    let mem = Arc::new(MemoryBackend::new());
    let data = bytes(1, 16 * B + 1000);
    mem.put(A, &data).unwrap();
    let probe = Probe::new(mem.clone());
    let c = CachedBackend::open(probe.clone(), opts(d.path(), 64 << 20, 0, Durability::Local)).unwrap();

    let reads = [(100, 1000), (2 * B + 5, 2 * B + 10), (0, 6 * B), (16 * B + 990, 10)];
    assert_eq!(c.get_range(A, 100, 1000).unwrap(), range(&data, 100, 1000));
    assert_eq!((probe.gets(), probe.heads(), c.stats().bytes_fetched), (1, 1, 1000));
    let before = probe.total();
    assert_eq!(c.get_range(A, 100, 1000).unwrap(), range(&data, 100, 1000));
    assert_eq!(probe.total(), before, "a cached read reached the remote");

    assert_eq!(c.get_range(A, 2 * B + 5, 2 * B + 10).unwrap(), range(&data, 2 * B + 5, 2 * B + 10));
    assert_eq!((probe.gets(), c.stats().bytes_fetched), (2, 1000 + 2 * B + 10));
    // [0, 6B) over extents [100, 1100) and [2B+5, 4B+15): three gaps.
    assert_eq!(c.get_range(A, 0, 6 * B).unwrap(), range(&data, 0, 6 * B));
    assert_eq!(probe.gets(), 5, "three gaps, three GETs");
    assert_eq!(c.stats().bytes_fetched, 6 * B, "a byte was fetched twice");
    assert_eq!(c.get_range(A, 16 * B + 990, 10).unwrap(), range(&data, 16 * B + 990, 10));
    assert_eq!(c.stats().bytes_fetched, 6 * B + 10);
    let e = c.get_range(A, 16 * B + 995, 10).unwrap_err();
    assert_eq!((e.kind(), e.object()), (ErrorKind::OutOfRange, Some(A)), "{e}");
    assert_eq!(probe.gets(), 6);
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.remote_gets), (1, 4, 6), "{s:?}");
    drop(c);

    let probe = Probe::new(mem.clone());
    let c = CachedBackend::open(probe.clone(), opts(d.path(), 64 << 20, 0, Durability::Local)).unwrap();
    for (off, len) in reads {
        assert_eq!(c.get_range(A, off, len).unwrap(), range(&data, off, len));
    }
    assert_eq!((probe.gets(), probe.heads()), (0, 1), "a reopened cache fetched what it held");
    assert_eq!(c.stats().hits, reads.len() as u64);
    // [6B, 16B+990) is the one gap of a whole read.
    assert_eq!(c.get(A).unwrap(), data);
    assert_eq!(probe.gets(), 1);
    drop(c);

    // Gaps closer than the merge distance share a GET; the held bytes
    // between are downloaded but not kept twice.
    let d = tempfile::tempdir().unwrap();
    let probe = Probe::new(mem.clone());
    let c = CachedBackend::open(probe.clone(), DiskCacheOptions { merge_below: 2000, ..opts(d.path(), 64 << 20, 0, Durability::Local) }).unwrap();
    c.get_range(A, 1000, 1000).unwrap();
    c.get_range(A, 3000, 1000).unwrap();
    assert_eq!(c.get_range(A, 0, 5000).unwrap(), range(&data, 0, 5000));
    assert_eq!((probe.gets(), c.stats().bytes_fetched), (3, 2000 + 5000), "gaps [0,1000) [2000,3000) [4000,5000) in one GET");
    assert_eq!(files_in(&d.path().join("data")).len(), 5);
    drop(c);

    // Aligned to B: a miss rounds out to its blocks, the last clamped to
    // the object's end, but never over what is held.
    let d = tempfile::tempdir().unwrap();
    let probe = Probe::new(mem.clone());
    let c = CachedBackend::open(probe.clone(), opts(d.path(), 64 << 20, B, Durability::Local)).unwrap();
    assert_eq!(c.get_range(A, 100, 1000).unwrap(), range(&data, 100, 1000));
    assert_eq!(c.get_range(A, 16 * B + 990, 10).unwrap(), range(&data, 16 * B + 990, 10));
    assert_eq!(c.stats().bytes_fetched, B + 1000);
    assert_eq!(c.get_range(A, B - 10, 20).unwrap(), range(&data, B - 10, 20));
    assert_eq!(c.stats().bytes_fetched, 2 * B + 1000);
    let mut want = [format!("packs~00~a@0+{B}"), format!("packs~00~a@{}+{B}", B), format!("packs~00~a@{}+1000", 16 * B)];
    want.sort();
    assert_eq!(files_in(&d.path().join("data")), want);
}

/// With the store down, puts of packs return at once and are read back
/// locally; `pending` lists them in order, and `drain` waits, reporting
/// what is left. Back up, they reach the store by themselves, the outbox
/// empties, and reads stay local.
#[test]
fn an_outage_queues_puts_in_the_outbox_and_they_upload_when_the_store_is_back() {
    let d = tempfile::tempdir().unwrap();
    let mem = Arc::new(MemoryBackend::new());
    let faulty = Arc::new(FaultyBackend::new(mem.clone(), FaultPlan::none(), 1));
    faulty.set_down(true);
    let c = CachedBackend::open(faulty.clone(), opts(d.path(), 64 << 20, 64 * KIB, Durability::Local)).unwrap();
    let packs: Vec<(String, Vec<u8>)> = (0..5u64).map(|i| (format!("packs/0{i}/p{i}"), bytes(i, 30_000 + 7_000 * i))).collect();
    let total: u64 = packs.iter().map(|p| p.1.len() as u64).sum();
    for (n, data) in &packs {
        c.put(n, data).unwrap();
    }
    assert_eq!(c.pending(), packs.iter().map(|p| p.0.clone()).collect::<Vec<_>>());
    for (n, data) in &packs {
        assert_eq!(c.get(n).unwrap(), *data);
        assert_eq!(c.get_range(n, 10, 100).unwrap(), data[10..110]);
        assert_eq!(c.size(n).unwrap(), data.len() as u64);
    }
    assert!(mem.list("packs/").unwrap().is_empty());
    eventually("failed uploads", Duration::from_secs(10), || c.stats().upload_retries >= 2);
    let s = c.stats();
    assert_eq!((s.dirty_objects, s.dirty_bytes, s.remote_gets), (5, total, 0), "{s:?}");

    let calls = Arc::new(Mutex::new(Vec::new()));
    let drainer = {
        let (c, calls) = (c.clone(), calls.clone());
        std::thread::spawn(move || c.drain(&mut |bytes, n| calls.lock().unwrap().push((bytes, n))))
    };
    // It reports its progress while it waits (at least twice: not once
    // and then silence), and cannot finish while the store is down.
    eventually("two progress reports during the outage", Duration::from_secs(30), || calls.lock().unwrap().len() >= 2);
    assert!(!drainer.is_finished(), "drain returned during the outage");
    let seen = calls.lock().unwrap().clone();
    assert!(seen.iter().all(|p| *p == (total, 5)), "{seen:?}");

    faulty.set_down(false);
    eventually("the uploads", Duration::from_secs(20), || packs.iter().all(|(n, data)| mem.get(n).is_ok_and(|s| s == *data)));
    eventually("an empty outbox", Duration::from_secs(5), || c.pending().is_empty());
    drainer.join().unwrap();
    let s = c.stats();
    assert_eq!((s.uploads, s.dirty_objects, s.dirty_bytes), (5, 0, 0), "{s:?}");
    assert!(files_in(&d.path().join("outbox")).is_empty());
    for (n, data) in &packs {
        assert_eq!(c.get(n).unwrap(), *data);
    }
    assert_eq!(c.stats().remote_gets, 0, "uploaded packs are cached whole");
}

/// A put that would take the outbox past its share of the capacity blocks
/// while the store is down (one larger than that share still passes into
/// an empty outbox), and completes once uploads make room.
#[test]
fn a_full_outbox_blocks_writers_until_uploads_make_room() {
    let d = tempfile::tempdir().unwrap();
    let mem = Arc::new(MemoryBackend::new());
    let faulty = Arc::new(FaultyBackend::new(mem.clone(), FaultPlan::none(), 2));
    faulty.set_down(true);
    // Capacity 400 KiB: the outbox may hold 300 KiB.
    let c = CachedBackend::open(faulty.clone(), opts(d.path(), 400 * KIB, 64 * KIB, Durability::Local)).unwrap();
    let big = bytes(1, 500 * KIB);
    let small = bytes(2, 100 * KIB);
    let first = {
        let (c, big) = (c.clone(), big.clone());
        std::thread::spawn(move || c.put("packs/big", &big))
    };
    eventually("the first put (into an empty outbox)", Duration::from_secs(5), || first.is_finished());
    first.join().unwrap().unwrap();
    let second = {
        let (c, small) = (c.clone(), small.clone());
        std::thread::spawn(move || c.put("packs/small", &small))
    };
    std::thread::sleep(Duration::from_millis(300));
    assert!(!second.is_finished(), "a put past the outbox's bound returned during the outage");
    assert_eq!(c.pending(), vec!["packs/big".to_string()]);
    faulty.set_down(false);
    second.join().unwrap().unwrap();
    c.drain(&mut |_, _| {});
    assert_eq!(mem.get("packs/big").unwrap(), big);
    assert_eq!(mem.get("packs/small").unwrap(), small);
    assert_eq!(c.get("packs/small").unwrap(), small);
}

/// Dropped with packs in its outbox during an outage (promptly: the
/// uploaders stop), a cache reopened on the directory queues them again,
/// oldest first by time written, serves them locally, and uploads them
/// once the store is back.
#[test]
fn a_reopened_cache_uploads_what_its_outbox_held() {
    let d = tempfile::tempdir().unwrap();
    let mem = Arc::new(MemoryBackend::new());
    let faulty = Arc::new(FaultyBackend::new(mem.clone(), FaultPlan::none(), 3));
    faulty.set_down(true);
    let c = CachedBackend::open(faulty.clone(), opts(d.path(), 64 << 20, 64 * KIB, Durability::Local)).unwrap();
    // Written in the reverse of name order, so that order by name is wrong.
    let packs: Vec<(String, Vec<u8>)> = ["c", "b", "a"].iter().enumerate().map(|(i, n)| (format!("packs/{n}"), bytes(i as u64, 20_000))).collect();
    for (n, data) in &packs {
        c.put(n, data).unwrap();
        std::thread::sleep(Duration::from_millis(30));
    }
    // The drop returns while the store is still down (it does not wait for
    // the uploads): in a thread, with a generous deadline.
    let (dropped, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(c);
        dropped.send(()).unwrap();
    });
    done.recv_timeout(Duration::from_secs(120)).expect("dropping the cache during an outage waited for the store");
    assert_eq!(files_in(&d.path().join("outbox")).len(), 3);

    let c = CachedBackend::open(faulty.clone(), opts(d.path(), 64 << 20, 64 * KIB, Durability::Local)).unwrap();
    assert_eq!(c.pending(), packs.iter().map(|p| p.0.clone()).collect::<Vec<_>>());
    for (n, data) in &packs {
        assert_eq!(c.get(n).unwrap(), *data);
    }
    faulty.set_down(false);
    eventually("the uploads", Duration::from_secs(20), || packs.iter().all(|(n, data)| mem.get(n).is_ok_and(|s| s == *data)));
    eventually("an empty outbox", Duration::from_secs(5), || c.pending().is_empty() && files_in(&d.path().join("outbox")).is_empty());
}

/// Reading many distinct blocks through a cache of four keeps clean bytes
/// within the capacity (and four files on disk), evicts the least recently
/// used, and refetches evicted data correctly. Dirty bytes shrink the room
/// for clean ones, and are never evicted.
#[test]
fn eviction_keeps_the_cache_within_capacity_and_never_drops_dirty_objects() {
    const B: u64 = 16 * KIB;
    let mem = Arc::new(MemoryBackend::new());
    let big = bytes(9, 64 * B);
    mem.put("packs/big", &big).unwrap();

    let d = tempfile::tempdir().unwrap();
    let probe = Probe::new(mem.clone());
    let c = CachedBackend::open(probe.clone(), opts(d.path(), 4 * B, B, Durability::Local)).unwrap();
    for i in 0..64 {
        assert_eq!(c.get_range("packs/big", i * B + 7, 100).unwrap(), range(&big, i * B + 7, 100));
        assert!(c.stats().clean_bytes <= 4 * B, "{:?}", c.stats());
    }
    assert_eq!(c.stats().evictions, 60);
    let mut want: Vec<String> = (60..64).map(|i| format!("packs~big@{}+{B}", i * B)).collect();
    want.sort();
    assert_eq!(files_in(&d.path().join("data")), want);
    assert_eq!(probe.gets(), 64);
    assert_eq!(c.get_range("packs/big", 5, 10).unwrap(), range(&big, 5, 10));
    assert_eq!(probe.gets(), 65, "block 0 was evicted");
    assert_eq!(c.get_range("packs/big", 63 * B, B).unwrap(), range(&big, 63 * B, B));
    assert_eq!(probe.gets(), 65, "block 63, recently used, was evicted");
    drop(c);

    // Uploads refused: a 40 KiB pack stays dirty, leaving 24 KiB (one
    // block) for clean data.
    let d = tempfile::tempdir().unwrap();
    let probe = Probe::new(mem.clone());
    probe.refuse_puts.store(true, Ordering::SeqCst);
    let c = CachedBackend::open(probe.clone(), opts(d.path(), 4 * B, B, Durability::Local)).unwrap();
    let dirty = bytes(10, 40 * KIB);
    c.put("packs/dirty", &dirty).unwrap();
    for i in 0..30 {
        assert_eq!(c.get_range("packs/big", i * B, 50).unwrap(), range(&big, i * B, 50));
        let s = c.stats();
        assert!(s.clean_bytes <= 4 * B - 40 * KIB && s.dirty_bytes == 40 * KIB, "{s:?}");
        assert_eq!(c.get_range("packs/dirty", 1000, 3000).unwrap(), range(&dirty, 1000, 3000));
    }
    assert_eq!(c.stats().evictions, 29);
    assert_eq!(c.pending(), vec!["packs/dirty".to_string()]);
    assert!(d.path().join("outbox/packs~dirty").exists());
    // The uploader runs on its own thread; on a loaded machine it may not
    // have reached its first try yet.
    eventually("a refused upload try", Duration::from_secs(20), || probe.puts() >= 1);
    probe.refuse_puts.store(false, Ordering::SeqCst);
    c.drain(&mut |_, _| {});
    assert_eq!(mem.get("packs/dirty").unwrap(), dirty);
}

/// Over a store failing a tenth of its requests behind the retry wrapper,
/// puts (both durabilities) and reads, whole and ranged, through a warm
/// cache and a cold one, all succeed byte for byte.
#[test]
fn a_store_failing_a_tenth_of_requests_shows_no_error() {
    const B: u64 = 16 * KIB;
    let mem = Arc::new(MemoryBackend::new());
    let faulty = FaultyBackend::new(mem.clone(), FaultPlan::flaky(0.10, Duration::from_millis(3)), 11);
    let remote = Arc::new(Retrying::new(faulty, RetryPolicy::quick()));
    let mut all = Vec::new();
    for durability in [Durability::Local, Durability::Remote] {
        let d = tempfile::tempdir().unwrap();
        let c = CachedBackend::open(remote.clone(), opts(d.path(), 512 * KIB, B, durability)).unwrap();
        let packs: Vec<(String, Vec<u8>)> = (0..24u64).map(|i| (format!("packs/{durability:?}/{i}"), bytes(100 + i, 1_000 + 9_000 * i))).collect();
        for (i, (n, data)) in packs.iter().enumerate() {
            c.put(n, data).unwrap();
            let (m, earlier) = &packs[i / 2];
            let off = (i as u64 * 7919) % earlier.len() as u64;
            let len = (earlier.len() as u64 - off).min(3 * B);
            assert_eq!(c.get_range(m, off, len).unwrap(), range(earlier, off, len), "{m}");
        }
        for (n, data) in &packs {
            assert_eq!(c.get(n).unwrap(), *data, "{n}");
        }
        c.drain(&mut |_, _| {});
        all.extend(packs);
    }
    for (n, data) in &all {
        assert_eq!(mem.get(n).unwrap(), *data, "{n} in the store");
    }
    let d = tempfile::tempdir().unwrap();
    let cold = CachedBackend::open(remote.clone(), opts(d.path(), 512 * KIB, B, Durability::Local)).unwrap();
    for (i, (n, data)) in all.iter().enumerate() {
        let off = (i as u64 * 104_729) % data.len() as u64;
        let len = (data.len() as u64 - off).min(2 * B + 17);
        assert_eq!(cold.get_range(n, off, len).unwrap(), range(data, off, len), "{n}");
        assert_eq!(cold.get(n).unwrap(), *data, "{n}");
    }
    let s = remote.inner().stats();
    assert!(s.failed + s.timed_out + s.lost_replies >= 10, "too few faults injected to prove anything: {s:?}");
}

/// Four threads missing the same block at once (the store answering
/// slowly) cause exactly one GET.
#[test]
fn concurrent_misses_of_one_block_make_one_get() {
    let mem = Arc::new(MemoryBackend::new());
    let data = bytes(5, 256 * KIB);
    mem.put("packs/a", &data).unwrap();
    let slow = FaultyBackend::new(mem.clone(), FaultPlan { slow: 1.0, slow_by: Duration::from_millis(200), ..FaultPlan::none() }, 4);
    let probe = Probe::new(slow);
    let d = tempfile::tempdir().unwrap();
    let c = CachedBackend::open(probe.clone(), opts(d.path(), 64 << 20, 64 * KIB, Durability::Local)).unwrap();
    let barrier = Barrier::new(4);
    let got: Vec<Vec<u8>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    c.get_range("packs/a", 1000, 5000).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for g in got {
        assert_eq!(g, range(&data, 1000, 5000));
    }
    assert_eq!(probe.gets(), 1, "concurrent misses of one block made {} GETs", probe.gets());
    assert_eq!(c.stats().remote_gets, 1);
    // One fetch is one miss: the three reads that waited for it were
    // served from the cache (counting them as misses made the live hit
    // ratio a quarter of the replayed one).
    let s = c.stats();
    assert_eq!((s.misses, s.hits), (1, 3), "{s:?}");
}

/// Deleting a pack still in the outbox drops it there (the remote's delete
/// fails during the outage, and succeeds after); deleting one whose upload
/// is in flight waits for the upload, so the pack does not come back.
#[test]
fn deleting_a_pending_pack_keeps_it_out_of_the_store() {
    let mem = Arc::new(MemoryBackend::new());
    let faulty = Arc::new(FaultyBackend::new(mem.clone(), FaultPlan::none(), 5));
    faulty.set_down(true);
    let d = tempfile::tempdir().unwrap();
    let c = CachedBackend::open(faulty.clone(), opts(d.path(), 64 << 20, 64 * KIB, Durability::Local)).unwrap();
    c.put("packs/p", &bytes(1, 10_000)).unwrap();
    assert_eq!(c.delete("packs/p").unwrap_err().kind(), ErrorKind::Transient);
    assert!(c.pending().is_empty());
    assert!(files_in(&d.path().join("outbox")).is_empty());
    faulty.set_down(false);
    c.delete("packs/p").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_missing(&*mem, "packs/p", "a deleted pack was uploaded");
    assert_missing(&*c, "packs/p", "a deleted pack is still read");
    drop(c);

    let probe = Probe::new(mem.clone());
    probe.put_delay_ms.store(300, Ordering::SeqCst);
    let d = tempfile::tempdir().unwrap();
    let c = CachedBackend::open(probe.clone(), opts(d.path(), 64 << 20, 64 * KIB, Durability::Local)).unwrap();
    c.put("packs/q", &bytes(2, 10_000)).unwrap();
    eventually("the upload to start", Duration::from_secs(5), || probe.puts() >= 1);
    c.delete("packs/q").unwrap();
    assert!(c.pending().is_empty());
    std::thread::sleep(Duration::from_millis(500));
    assert_missing(&*mem, "packs/q", "the upload landed after the delete");
    assert_eq!(probe.puts(), 1);
}

/// Clean files are trusted only after a clean shutdown of a cache of this
/// format: after a crash (the cache is leaked, never dropped) or in a
/// directory of the first format (aligned blocks, `<name>@<index>`) they
/// are fetched again, correctly; extents are trusted whatever the
/// alignment. Temporary leftovers are deleted at open; a pack whose name
/// ends in `.tmp` is not one.
#[test]
fn the_clean_cache_is_trusted_only_after_a_clean_shutdown() {
    const B: u64 = 16 * KIB;
    let mem = Arc::new(MemoryBackend::new());
    let data = bytes(3, 4 * B);
    mem.put("packs/a", &data).unwrap();
    let d = tempfile::tempdir().unwrap();
    let open = |block: u64| {
        let probe = Probe::new(mem.clone());
        // No upload gets through (the outbox check below needs that).
        probe.refuse_puts.store(true, Ordering::SeqCst);
        let c = CachedBackend::open(probe.clone(), opts(d.path(), 1 << 20, block, Durability::Local)).unwrap();
        (c, probe)
    };
    let (c, probe) = open(B);
    assert_eq!(c.get("packs/a").unwrap(), data);
    assert_eq!(probe.gets(), 1);
    std::mem::forget(c); // a crash: no clean shutdown recorded

    let (c, probe) = open(B);
    assert_eq!(c.get("packs/a").unwrap(), data);
    assert_eq!(probe.gets(), 1, "files written before a crash were trusted");
    drop(c);
    let (c, probe) = open(B / 2);
    assert_eq!(c.get("packs/a").unwrap(), data);
    assert_eq!(probe.gets(), 0, "extents of another alignment were not trusted");
    drop(c);
    // A directory of the first format: its marker and a block file.
    for f in files_in(&d.path().join("data")) {
        std::fs::remove_file(d.path().join("data").join(f)).unwrap();
    }
    std::fs::write(d.path().join("clean"), format!("block {B}\n")).unwrap();
    std::fs::write(d.path().join("data/packs~a@0"), range(&data, 0, B)).unwrap();
    let (c, probe) = open(B);
    assert!(files_in(&d.path().join("data")).is_empty(), "a block of the first format was kept");
    assert_eq!(c.get("packs/a").unwrap(), data);
    assert_eq!(probe.gets(), 1);
    drop(c);

    std::fs::write(d.path().join("data/packs~x@3@99.1.tmp"), b"junk").unwrap();
    std::fs::write(d.path().join("outbox/packs~y@99.2.tmp"), b"junk").unwrap();
    std::fs::write(d.path().join("outbox/packs~z.tmp"), b"a pack").unwrap();
    let (c, probe) = open(B / 2);
    assert_eq!(c.get("packs/a").unwrap(), data);
    assert_eq!(probe.gets(), 0);
    assert_eq!(c.pending(), vec!["packs/z.tmp".to_string()]);
    assert!(!d.path().join("data/packs~x@3@99.1.tmp").exists());
    assert!(!d.path().join("outbox/packs~y@99.2.tmp").exists());
    probe.refuse_puts.store(false, Ordering::SeqCst);
    c.drain(&mut |_, _| {});
    assert_eq!(mem.get("packs/z.tmp").unwrap(), b"a pack");
}

/// A reopened cache re-admits its files least recently modified first, so
/// the LRU order of the last session survives.
#[test]
fn recency_survives_a_reopen_through_file_times() {
    const B: u64 = 16 * KIB;
    let mem = Arc::new(MemoryBackend::new());
    let data = bytes(4, 4 * B);
    mem.put("packs/a", &data).unwrap();
    let d = tempfile::tempdir().unwrap();
    let c = CachedBackend::open(mem.clone(), opts(d.path(), 3 * B, B, Durability::Local)).unwrap();
    for i in 0..3 {
        c.get_range("packs/a", i * B, 10).unwrap();
    }
    drop(c);
    for (block, age) in [(1, 300), (0, 200), (2, 100)] {
        let f = std::fs::File::options().write(true).open(d.path().join(format!("data/packs~a@{}+{B}", block * B))).unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(age)).unwrap();
    }
    let probe = Probe::new(mem.clone());
    let c = CachedBackend::open(probe.clone(), opts(d.path(), 3 * B, B, Durability::Local)).unwrap();
    assert_eq!(c.get_range("packs/a", 3 * B, 10).unwrap(), range(&data, 3 * B, 10));
    let want = [format!("packs~a@0+{B}"), format!("packs~a@{}+{B}", 2 * B), format!("packs~a@{}+{B}", 3 * B)];
    assert_eq!(files_in(&d.path().join("data")), want, "not the least recently modified block was evicted");
    assert_eq!(c.get_range("packs/a", 0, 10).unwrap(), range(&data, 0, 10));
    assert_eq!(probe.gets(), 1);
}

/// Names outside `packs/` go straight to the remote: not cached, not
/// queued (a put during an outage fails rather than waiting in the outbox).
#[test]
fn other_objects_pass_straight_through() {
    let mem = Arc::new(MemoryBackend::new());
    let faulty = Arc::new(FaultyBackend::new(mem.clone(), FaultPlan::none(), 6));
    let probe = Probe::new(faulty.clone());
    let d = tempfile::tempdir().unwrap();
    let c = CachedBackend::open(probe.clone(), opts(d.path(), 64 << 20, 64 * KIB, Durability::Local)).unwrap();
    c.put("meta/1", b"version one").unwrap();
    assert_eq!(mem.get("meta/1").unwrap(), b"version one");
    assert_eq!(c.get("meta/1").unwrap(), b"version one");
    assert_eq!(c.get_range("meta/1", 8, 3).unwrap(), b"one");
    assert_eq!(probe.gets(), 2, "a non-pack read was served from the cache");
    faulty.set_down(true);
    assert_eq!(c.put("lease", b"x").unwrap_err().kind(), ErrorKind::Transient);
    assert!(c.pending().is_empty());
    assert!(files_in(&d.path().join("data")).is_empty());
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.dirty_objects), (0, 0, 0), "{s:?}");
}

/// The same random reads of three packs, tagged with the file they are
/// for, through a cache evicting by LRU and one evicting by Coral's
/// kd-tree policy (with the read/write mix counted): both return the
/// stored bytes, stay within their capacity while evicting, and name their
/// policy in the stats.
#[test]
fn lru_and_kd_policies_serve_the_same_reads_within_the_bound() {
    const B: u64 = 16 * KIB;
    let mem = Arc::new(MemoryBackend::new());
    let packs: Vec<(String, Vec<u8>)> = (0..3).map(|i| (format!("packs/p{i}"), bytes(20 + i, 40 * B + 123))).collect();
    for (name, data) in &packs {
        mem.put(name, data).unwrap();
    }
    for policy in [PolicyChoice::Lru, PolicyChoice::Kd] {
        let io = IoWindows::new();
        let d = tempfile::tempdir().unwrap();
        let c = CachedBackend::with_policy(mem.clone(), opts(d.path(), 8 * B, B, Durability::Local), policy.build(Some(io.clone()))).unwrap();
        let mut x = 7u64;
        for i in 0..400u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (name, data) = &packs[(x % 3) as usize];
            let off = (x >> 8) % data.len() as u64;
            let len = ((x >> 32) % (3 * B)).clamp(1, data.len() as u64 - off);
            io.note_read();
            if i % 7 == 0 {
                io.note_write();
            }
            assert_eq!(c.get_range_for(for_file(x % 5), name, off, len).unwrap(), range(data, off, len), "{policy:?}: read {i} of {name} at {off}+{len}");
            let s = c.stats();
            assert!(s.clean_bytes <= 8 * B, "{policy:?}: {s:?}");
        }
        let s = c.stats();
        assert_eq!(s.policy, if policy == PolicyChoice::Lru { "lru" } else { "kd" });
        assert!(s.evictions > 0 && s.hits > 0, "{policy:?}: {s:?}");
        println!("{policy:?}: {} hits, {} misses, {} bytes fetched", s.hits, s.misses, s.bytes_fetched);
    }
}

/// A read miss made for file `ino`.
fn for_file(ino: u64) -> ReadFor {
    ReadFor { who: Subsystem::ReadMiss, group: Some(ino) }
}

/// A policy that is LRU and writes down every `grouped` hint it gets.
struct Noting {
    lru: cairn_cache::Lru,
    seen: Arc<Mutex<Vec<(u64, u64)>>>,
}

impl cairn_cache::CachePolicy for Noting {
    fn name(&self) -> &'static str {
        "noting"
    }
    fn admitted(&mut self, key: u64, size: u64) {
        self.lru.admitted(key, size)
    }
    fn accessed(&mut self, key: u64) {
        self.lru.accessed(key)
    }
    fn removed(&mut self, key: u64) {
        self.lru.removed(key)
    }
    fn grouped(&mut self, key: u64, group: u64) {
        self.seen.lock().unwrap().push((key, group));
    }
    fn victim(&mut self) -> Option<u64> {
        self.lru.victim()
    }
    fn len(&self) -> usize {
        self.lru.len()
    }
}

/// The file a read is for is an argument: a read for file 7 tells the
/// policy so on the fetch and on the hit, on this thread or another; a
/// plain `get_range` (for no file) tells it nothing.
#[test]
fn a_read_for_a_file_groups_what_it_fetches_and_hits() {
    const B: u64 = 16 * KIB;
    let mem = Arc::new(MemoryBackend::new());
    let data = bytes(3, 8 * B);
    mem.put("packs/g", &data).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let d = tempfile::tempdir().unwrap();
    let policy = Box::new(Noting { lru: cairn_cache::Lru::new(), seen: seen.clone() });
    let c = CachedBackend::with_policy(mem.clone(), opts(d.path(), 64 * B, B, Durability::Local), policy).unwrap();
    assert_eq!(c.get_range("packs/g", 0, B).unwrap(), range(&data, 0, B));
    assert_eq!(c.get_range("packs/g", 0, B).unwrap(), range(&data, 0, B));
    assert!(seen.lock().unwrap().is_empty(), "reads for no file grouped: {:?}", seen.lock().unwrap());
    std::thread::scope(|s| {
        s.spawn(|| assert_eq!(c.get_range_for(for_file(7), "packs/g", 2 * B, B).unwrap(), range(&data, 2 * B, B)));
    });
    let fetched = seen.lock().unwrap().clone();
    assert!(!fetched.is_empty() && fetched.iter().all(|&(_, g)| g == 7), "the fetch for file 7: {fetched:?}");
    assert_eq!(c.get_range_for(for_file(7), "packs/g", 0, B).unwrap(), range(&data, 0, B));
    let all = seen.lock().unwrap().clone();
    assert!(all.len() > fetched.len() && all.iter().all(|&(_, g)| g == 7), "the hit for file 7: {all:?}");
    assert_eq!(c.get_ranges_for(for_file(9), "packs/g", &[(0, 10), (10, 20)]).unwrap(), vec![range(&data, 0, 10).to_vec(), range(&data, 10, 20).to_vec()]);
    assert!(seen.lock().unwrap().last().is_some_and(|&(_, g)| g == 9));
}

/// Who pays, through the cache: a read's fetches are billed to the payer
/// the read names; a handle for gc (`paid_by`) puts a pack into the outbox
/// and the uploader thread sends it as gc's, while a pack put through the
/// cache itself goes up as a write; a listing through gc's handle is gc's.
#[test]
fn the_cache_sends_each_request_as_its_payers() {
    const B: u64 = 16 * KIB;
    let m = Metered::new(MemoryBackend::new());
    let meter = m.meter().clone();
    let remote = Arc::new(m);
    let data = bytes(5, 4 * B);
    remote.put("packs/r", &data).unwrap();
    let d = tempfile::tempdir().unwrap();
    let c = CachedBackend::open(remote.clone(), opts(d.path(), 64 * B, B, Durability::Local)).unwrap();
    meter.take();
    let r = ReadFor { who: Subsystem::Prefetch, group: None };
    assert_eq!(c.get_range_for(r, "packs/r", 0, B).unwrap(), range(&data, 0, B));
    let n = meter.take();
    assert!(n.get(Subsystem::Prefetch, RequestKind::Get).requests >= 1 && n.iter().all(|(s, _, _)| s == Subsystem::Prefetch), "{n:?}");
    let gc = c.paid_by(Subsystem::Gc).expect("the cache has a handle per payer");
    gc.put("packs/g", b"moved").unwrap();
    c.put("packs/w", b"written").unwrap();
    c.drain(&mut |_, _| {});
    assert!(gc.list("packs/").unwrap().len() >= 3);
    let n = meter.take();
    assert_eq!(n.get(Subsystem::Gc, RequestKind::Put), cairn_backend::meter::Tally { requests: 1, bytes: 5 }, "{n:?}");
    assert_eq!(n.get(Subsystem::Write, RequestKind::Put), cairn_backend::meter::Tally { requests: 1, bytes: 7 }, "{n:?}");
    assert_eq!(n.get(Subsystem::Gc, RequestKind::List).requests, 1, "{n:?}");
    drop(gc);
    assert_eq!(c.get_range("packs/w", 0, 7).unwrap(), b"written", "a handle's drop leaves the cache open");
}
