//! The engine on backends handed to it (`InitOptions::backend`,
//! `OpenOptions::backend`): an in-memory store, and one that misbehaves on
//! a tenth of its requests behind the retry wrapper every engine backend
//! gets.

use crate::common::*;
use cairn_backend::{Backend, RetryPolicy, Retrying};
use cairn_engine::*;
use cairn_testing::{FaultPlan, FaultyBackend, MemoryBackend};
use std::sync::Arc;
use std::time::Duration;

fn init_on(dir: &std::path::Path, b: &Arc<dyn Backend>) {
    init(dir, &InitOptions { chunker: small_chunks(), pack_target: Some(1 << 20), backend: Some(InjectedBackend(b.clone())), ..Default::default() }).unwrap();
}

fn open_on(dir: &std::path::Path, b: &Arc<dyn Backend>) -> Arc<Volume> {
    Volume::load(dir, OpenOptions { backend: Some(InjectedBackend(b.clone())), ..Default::default() }).unwrap()
}

/// "10% of requests failing or timing out gives writers and readers no
/// error": files written, flushed into packs, and read back from the store
/// by a fresh open (empty caches), byte for byte; fsck reads every chunk.
#[test]
fn a_volume_on_a_store_failing_a_tenth_of_requests_shows_no_error() {
    let d = tempfile::tempdir().unwrap();
    let faulty = Arc::new(Retrying::new(FaultyBackend::new(MemoryBackend::new(), FaultPlan::flaky(0.10, Duration::from_millis(3)), 12), RetryPolicy::quick()));
    let b: Arc<dyn Backend> = faulty.clone();
    init_on(d.path(), &b);
    let v = open_on(d.path(), &b);
    let files: Vec<(Ino, Vec<u8>)> = (0..24u64)
        .map(|i| {
            let data = random_bytes(i, 50_000 + 9_000 * i as usize);
            (mkfile(&v, ROOT_INO, &format!("f{i}"), &data), data)
        })
        .collect();
    v.flush_now().unwrap();
    v.close().unwrap();
    drop(v);
    let v = open_on(d.path(), &b);
    for (ino, data) in &files {
        assert!(&read_all(&v, *ino) == data, "file {ino} differs after a reopen");
    }
    let rep = maintenance::fsck(&v, true, &maintenance::NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "fsck: {:?}", rep.errors);
    v.close().unwrap();
    let s = faulty.inner().stats();
    assert!(s.failed + s.timed_out + s.lost_replies >= 5, "too few faults injected to prove anything: {s:?}");
}

/// The volume directory alone cannot open a volume whose store its program
/// supplied, and says so.
#[test]
fn a_volume_on_an_injected_store_needs_it_to_open() {
    let d = tempfile::tempdir().unwrap();
    let b: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    init_on(d.path(), &b);
    let e = Volume::load(d.path(), OpenOptions::default()).map(|_| ()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert!(e.to_string().contains("memory:"), "{e}");
}

/// A store whose reads are slow (so a reader and the prefetch it started
/// overlap) and that counts the bytes of pack reads.
struct SlowReads {
    inner: MemoryBackend,
    pack_bytes_read: std::sync::atomic::AtomicU64,
    /// A pack whose reads take 400 ms instead (none unless a test sets it).
    slower: parking_lot::Mutex<Option<String>>,
    /// Every blob range read of a pack, (pack, offset), in order.
    ranges: parking_lot::Mutex<Vec<(String, u64)>>,
}

impl SlowReads {
    fn read(&self, name: &str, n: u64, offsets: &[u64]) {
        if name.starts_with("packs/") {
            self.ranges.lock().extend(offsets.iter().map(|o| (name.to_string(), *o)));
        }
        let slower = self.slower.lock().as_deref() == Some(name);
        std::thread::sleep(Duration::from_millis(if slower { 400 } else { 15 }));
        if name.starts_with("packs/") {
            self.pack_bytes_read.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl Backend for SlowReads {
    fn put(&self, name: &str, data: &[u8]) -> cairn_backend::Result<()> {
        self.inner.put(name, data)
    }
    fn put_if_absent(&self, name: &str, data: &[u8]) -> cairn_backend::Result<()> {
        self.inner.put_if_absent(name, data)
    }
    fn get_range(&self, name: &str, offset: u64, len: u64) -> cairn_backend::Result<Vec<u8>> {
        self.read(name, len, &[offset]);
        self.inner.get_range(name, offset, len)
    }
    fn get_ranges(&self, name: &str, ranges: &[(u64, u64)]) -> cairn_backend::Result<Vec<Vec<u8>>> {
        self.read(name, ranges.iter().map(|r| r.1).sum(), &ranges.iter().map(|r| r.0).collect::<Vec<_>>());
        self.inner.get_ranges(name, ranges)
    }
    fn get(&self, name: &str) -> cairn_backend::Result<Vec<u8>> {
        let d = self.inner.get(name)?;
        self.read(name, d.len() as u64, &[0]);
        Ok(d)
    }
    fn size(&self, name: &str) -> cairn_backend::Result<u64> {
        self.inner.size(name)
    }
    fn delete(&self, name: &str) -> cairn_backend::Result<()> {
        self.inner.delete(name)
    }
    fn list(&self, prefix: &str) -> cairn_backend::Result<Vec<cairn_backend::ObjectInfo>> {
        self.inner.list(prefix)
    }
    fn capabilities(&self) -> cairn_backend::Capabilities {
        self.inner.capabilities()
    }
    fn describe(&self) -> String {
        format!("slow reads over {}", self.inner.describe())
    }
}

/// A volume on a [`SlowReads`] store holding one file of `len` random bytes
/// (`seed`), packed, and closed: the next open starts with cold caches.
fn packed_file_on_slow_reads(seed: u64, len: usize) -> (tempfile::TempDir, Arc<SlowReads>, Arc<dyn Backend>, Vec<u8>, u64) {
    let d = tempfile::tempdir().unwrap();
    let slow = Arc::new(SlowReads { inner: MemoryBackend::new(), pack_bytes_read: Default::default(), slower: Default::default(), ranges: Default::default() });
    let b: Arc<dyn Backend> = slow.clone();
    init_on(d.path(), &b);
    let v = open_on(d.path(), &b);
    let data = random_bytes(seed, len);
    let ino = mkfile(&v, ROOT_INO, "f", &data);
    v.flush_now().unwrap();
    v.close().unwrap();
    (d, slow, b, data, ino)
}

/// "One fetch and one decode per chunk": a sequential reader that misses
/// the cache waits for the prefetch already fetching the chunk instead of
/// reading it from the store a second time, so a cold sequential read of
/// a file reads each of its blobs once (before, a reader and its
/// read-ahead both fetched the chunks the reader reached first).
#[test]
fn a_cold_sequential_read_fetches_each_chunk_once() {
    let (d, slow, b, data, ino) = packed_file_on_slow_reads(27, 3 << 20);
    let stored: u64 = slow.inner.list("packs/").unwrap().iter().map(|o| o.size).sum();
    slow.pack_bytes_read.store(0, std::sync::atomic::Ordering::Relaxed);
    let v = open_on(d.path(), &b);
    // As the kernel reads: 128 KiB requests, in order.
    let mut out = Vec::new();
    while out.len() < data.len() {
        let got = v.read(ino, out.len() as u64, 128 << 10).unwrap();
        assert!(!got.is_empty(), "short read at {}", out.len());
        out.extend_from_slice(&got);
    }
    assert!(out == data, "the file read back differs");
    let read = slow.pack_bytes_read.load(std::sync::atomic::Ordering::Relaxed);
    assert!(read <= stored, "read {read} bytes of packs holding {stored}: some chunks were fetched twice");
    assert!(read >= data.len() as u64, "read {read} bytes for a {} byte file", data.len());
    v.close().unwrap();
}

/// Single flight between a reader and a prefetch: a reader that missed
/// and is fetching a chunk registers its fetch, so a prefetch started
/// meanwhile (another reader's read-ahead reaching the same chunk, as the
/// kernel's parallel read requests do) skips the chunk instead of fetching
/// it again. Before, only prefetches registered, and the chunk was read
/// twice (the cause of the occasional failure of the test above under
/// load). Each blob range of the packs is read at most once here.
#[test]
fn a_prefetch_skips_a_chunk_a_reader_is_already_fetching() {
    let (d, slow, b, data, ino) = packed_file_on_slow_reads(29, 6 << 20);
    let pack = slow.inner.list("packs/").unwrap().into_iter().max_by_key(|o| o.size).unwrap().name;
    *slow.slower.lock() = Some(pack);
    slow.ranges.lock().clear();
    let v = open_on(d.path(), &b);
    // A: a read far from where any read ended (no read-ahead of its own):
    // it misses and fetches its chunk, slowly.
    let at = 5u64 << 20;
    let a = {
        let v = v.clone();
        std::thread::spawn(move || v.read(ino, at, 4096).unwrap())
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while slow.ranges.lock().is_empty() {
        assert!(std::time::Instant::now() < deadline, "the first read never reached the store");
        std::thread::sleep(Duration::from_millis(2));
    }
    // B: a read just before it, in order with A's: its read-ahead window
    // starts at its end and covers A's chunk.
    let got_b = v.read(ino, at - 8192, 4096).unwrap();
    let got_a = a.join().unwrap();
    assert!(got_a[..] == data[at as usize..at as usize + 4096], "A's bytes differ");
    assert!(got_b[..] == data[at as usize - 8192..at as usize - 4096], "B's bytes differ");
    v.close().unwrap();
    let ranges = slow.ranges.lock().clone();
    let mut seen = std::collections::HashSet::new();
    for r in &ranges {
        assert!(seen.insert(r.clone()), "blob at {} of {} was read twice (reads: {ranges:?})", r.1, r.0);
    }
    assert!(ranges.len() >= 2, "the read-ahead fetched nothing: {ranges:?}");
}

/// The read-ahead window of a file read in order starts at two average
/// chunks and doubles while the reads stay in order, up to eight of the
/// largest chunks on a local store: a reader of a file's head fetches
/// little it will not read, a long sequential reader gets the whole
/// window, and a jump starts small again.
#[test]
fn the_read_ahead_window_starts_small_and_grows_while_reads_stay_in_order() {
    use std::sync::atomic::Ordering::Relaxed;
    let (d, slow, b, data, ino) = packed_file_on_slow_reads(31, 8 << 20);
    let (avg, max) = (small_chunks().avg as u64, small_chunks().max as u64);
    // Waits for the prefetches a read started, then the bytes read so far.
    let settle = |v: &Volume| {
        let mut last = u64::MAX;
        loop {
            std::thread::sleep(Duration::from_millis(120));
            let now = slow.pack_bytes_read.load(Relaxed);
            if now == last {
                let _ = v;
                return now;
            }
            last = now;
        }
    };
    let v = open_on(d.path(), &b);
    v.open(ino).unwrap(); // the window lives with the open file's state
    slow.pack_bytes_read.store(0, Relaxed);
    // The head of the file, in a few small reads: the chunks read and one
    // small window after them (the window grows only as it is used up).
    for at in (0..4 * 4096).step_by(4096) {
        assert_eq!(v.read(ino, at as u64, 4096).unwrap(), data[at..at + 4096]);
    }
    let head = settle(&v);
    assert!(head <= max + 2 * avg + 2 * max, "four 4 KiB reads of the head fetched {head} bytes (avg chunk {avg}, max {max})");
    // In order, as the kernel reads: the window grows to eight max chunks.
    let mut at = 4 * 4096u64;
    let mut ahead_most = 0u64;
    while at < 2 << 20 {
        let got = v.read(ino, at, 128 << 10).unwrap();
        at += got.len() as u64;
        let read = settle(&v);
        ahead_most = ahead_most.max(read.saturating_sub(at));
    }
    assert!(ahead_most >= 3 * max, "the window never grew: at most {ahead_most} bytes fetched ahead of the reader");
    assert!(ahead_most <= 9 * max + max, "the window outgrew its bound: {ahead_most} bytes ahead");
    // A jump (further than a reordered stream of the kernel's reads goes),
    // then reads in order from there: small again.
    let before = slow.pack_bytes_read.load(Relaxed);
    assert_eq!(v.read(ino, 7 << 20, 4096).unwrap(), data[7 << 20..(7 << 20) + 4096]);
    assert_eq!(v.read(ino, (7 << 20) + 4096, 4096).unwrap(), data[(7 << 20) + 4096..(7 << 20) + 8192]);
    let jump = settle(&v) - before;
    assert!(jump <= max + 2 * avg + 2 * max, "a read after a jump fetched {jump} bytes");
    v.close().unwrap();
}

/// A volume closed while its read-ahead is still fetching lets the
/// directory go when `close` returns: the same program (a test, `cairn`
/// mounting again) opens it at once. Before, a prefetch job held the
/// volume, and the lock went only when that job ended.
#[test]
fn a_closed_volume_can_be_opened_again_at_once_while_read_ahead_was_in_flight() {
    let (d, slow, b, data, ino) = packed_file_on_slow_reads(28, 3 << 20);
    // The file's last chunk in its first pack: a read there fetches it,
    // and its read-ahead reaches into the next pack, a run of its own.
    let runs = {
        let v = open_on(d.path(), &b);
        let runs = v.info(b"/f", root()).unwrap().runs;
        v.close().unwrap();
        runs
    };
    let last = runs.windows(2).position(|w| w[0].pack != w[1].pack).expect("the file spans two packs");
    let (at, next) = (&runs[last], &runs[last + 1]);
    // That run is still being read when the reader has its bytes.
    *slow.slower.lock() = next.pack.clone();
    for round in 0..3 {
        let v = open_on(d.path(), &b);
        let off = at.offset as usize;
        assert!(v.read(ino, at.offset, 4096).unwrap() == data[off..off + 4096], "round {round}: the bytes at {off} differ");
        v.close().unwrap();
        drop(v);
        let again = Volume::load(d.path(), OpenOptions { backend: Some(InjectedBackend(b.clone())), ..Default::default() });
        let again = again.unwrap_or_else(|e| panic!("round {round}: opening the closed volume again: {e}"));
        again.close().unwrap();
    }
}
