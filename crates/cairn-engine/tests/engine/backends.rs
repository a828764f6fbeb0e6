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
}

impl SlowReads {
    fn read(&self, name: &str, n: u64) {
        std::thread::sleep(Duration::from_millis(15));
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
        self.read(name, len);
        self.inner.get_range(name, offset, len)
    }
    fn get_ranges(&self, name: &str, ranges: &[(u64, u64)]) -> cairn_backend::Result<Vec<Vec<u8>>> {
        self.read(name, ranges.iter().map(|r| r.1).sum());
        self.inner.get_ranges(name, ranges)
    }
    fn get(&self, name: &str) -> cairn_backend::Result<Vec<u8>> {
        let d = self.inner.get(name)?;
        self.read(name, d.len() as u64);
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

/// "One fetch and one decode per chunk": a sequential reader that misses
/// the cache waits for the prefetch already fetching the chunk instead of
/// reading it from the store a second time, so a cold sequential read of
/// a file reads each of its blobs once (before, a reader and its
/// read-ahead both fetched the chunks the reader reached first).
#[test]
fn a_cold_sequential_read_fetches_each_chunk_once() {
    let d = tempfile::tempdir().unwrap();
    let slow = Arc::new(SlowReads { inner: MemoryBackend::new(), pack_bytes_read: Default::default() });
    let b: Arc<dyn Backend> = slow.clone();
    init_on(d.path(), &b);
    let v = open_on(d.path(), &b);
    let data = random_bytes(27, 3 << 20);
    let ino = mkfile(&v, ROOT_INO, "f", &data);
    v.flush_now().unwrap();
    v.close().unwrap();
    drop(v);
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
