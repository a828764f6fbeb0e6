//! Counters a mount keeps for monitoring: `cairn mount --metrics ADDR`
//! serves them in Prometheus' text format and `cairn top` shows them as
//! rates; both read a [`Snapshot`] (the control socket's `metrics`).
//!
//! Every counter is a relaxed atomic add where the work happens; a FUSE
//! request's latency goes into its operation's own histogram, fixed buckets
//! of atomics. Nothing on the request path takes a lock. Gauges (journal
//! fill, queues) and the cache's and backend's counts are read when a
//! snapshot is taken; backend requests are the bill's own meter
//! ([`cairn_backend::Meter`]), not a second count.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

macro_rules! ops {
    ($($v:ident => $n:literal),* $(,)?) => {
        /// A kind of FUSE request.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Op { $($v),* }

        impl Op {
            /// Every kind, in order.
            pub const ALL: &'static [Op] = &[$(Op::$v),*];

            /// Its name (a Prometheus label value).
            pub fn name(self) -> &'static str {
                match self { $(Op::$v => $n),* }
            }
        }
    };
}

ops! {
    Lookup => "lookup", Getattr => "getattr", Setattr => "setattr", Readlink => "readlink",
    Mknod => "mknod", Mkdir => "mkdir", Unlink => "unlink", Rmdir => "rmdir", Symlink => "symlink",
    Rename => "rename", Link => "link", Open => "open", Read => "read", Write => "write",
    Release => "release", Flush => "flush", Fsync => "fsync", Opendir => "opendir", Readdir => "readdir",
    Readdirplus => "readdirplus", Releasedir => "releasedir", Fsyncdir => "fsyncdir", Statfs => "statfs",
    Setxattr => "setxattr", Getxattr => "getxattr", Listxattr => "listxattr", Removexattr => "removexattr",
    Access => "access", Create => "create", Fallocate => "fallocate", Ioctl => "ioctl",
    CopyFileRange => "copy_file_range", Lseek => "lseek",
}

/// Upper bounds (seconds) of the latency buckets; one more bucket above the
/// last takes the rest (+Inf).
pub const LATENCY_BOUNDS: [f64; 16] = [10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 1.0, 10.0];
const BUCKETS: usize = LATENCY_BOUNDS.len() + 1;

#[derive(Default)]
struct OpCell {
    count: AtomicU64,
    errors: AtomicU64,
    nanos: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

/// Engine-side counters of one open volume.
#[derive(Default)]
pub struct Metrics {
    ops: Vec<OpCell>,
    /// Bytes the kernel read from and wrote to the mount (FUSE read and
    /// write requests; with the writeback cache, writes arrive as the
    /// kernel writes its pages back).
    pub(crate) kernel_read: AtomicU64,
    pub(crate) kernel_written: AtomicU64,
    /// What flushes (and content edits) committed: bytes cut into chunks,
    /// of which already stored (deduplicated) or new; new chunks' bytes
    /// after compression and encryption; pack bytes written; chunks; packs.
    pub(crate) chunked: AtomicU64,
    pub(crate) deduplicated: AtomicU64,
    pub(crate) new_chunk_bytes: AtomicU64,
    pub(crate) compressed: AtomicU64,
    pub(crate) stored: AtomicU64,
    pub(crate) new_chunks: AtomicU64,
    pub(crate) packs: AtomicU64,
    pub(crate) flushes: AtomicU64,
    /// Files whose flush (or edit) found that another machine had
    /// committed them since their extent map was loaded here, and that
    /// were re-based on the committed map (docs/shared-volume.md §3).
    pub(crate) flush_rebases: AtomicU64,
    /// Flush rounds that lost a chunk to another writer (`Raced`) and were
    /// prepared again (a volume shared by several machines).
    pub(crate) flush_rounds_raced: AtomicU64,
    /// Lookups in the memory cache of decoded chunks.
    pub(crate) chunk_hits: AtomicU64,
    pub(crate) chunk_misses: AtomicU64,
    /// Reads answered from the kept last pages of chunks.
    pub(crate) tail_hits: AtomicU64,
    /// The cleaner (docs/frugal.md §8): its last look at the packs, and
    /// what its rounds did.
    space: [AtomicU64; 5],
    cleaner: [AtomicU64; 4],
}

impl Metrics {
    /// Counters at zero.
    pub fn new() -> Metrics {
        Metrics { ops: Op::ALL.iter().map(|_| OpCell::default()).collect(), ..Default::default() }
    }

    /// Counts one request of kind `op` that took `took`.
    pub fn observe(&self, op: Op, took: Duration, failed: bool) {
        let c = &self.ops[op as usize];
        c.count.fetch_add(1, Ordering::Relaxed);
        if failed {
            c.errors.fetch_add(1, Ordering::Relaxed);
        }
        c.nanos.fetch_add(took.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
        let s = took.as_secs_f64();
        let i = LATENCY_BOUNDS.iter().position(|b| s <= *b).unwrap_or(LATENCY_BOUNDS.len());
        c.buckets[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Starts timing a request; [`Timer::done`] (or dropping it) counts it.
    pub fn start(&self, op: Op) -> Timer<'_> {
        Timer { m: self, op, at: Instant::now(), failed: false }
    }

    /// The cleaner's last look at the packs (gauges).
    pub(crate) fn record_standing(&self, s: &crate::cleaner_rules::Standing) {
        let v = [s.pack_bytes, s.dead_bytes, s.dead_bound.unwrap_or(0), s.packs, s.small_packs];
        for (a, v) in self.space.iter().zip(v) {
            a.store(v, Ordering::Relaxed);
        }
    }

    /// A cleaning round's work (counters).
    pub(crate) fn record_clean(&self, r: &crate::cleaner_rules::CleanReport) {
        let v = [1, r.packs_cleaned, r.bytes_moved, r.dead_bytes_freed];
        for (a, v) in self.cleaner.iter().zip(v) {
            a.fetch_add(v, Ordering::Relaxed);
        }
    }

    /// Counts bytes the kernel read.
    pub fn kernel_read(&self, n: u64) {
        self.kernel_read.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts bytes the kernel wrote.
    pub fn kernel_wrote(&self, n: u64) {
        self.kernel_written.fetch_add(n, Ordering::Relaxed);
    }

    /// The counters (gauges and the backend's counts left empty: see
    /// `Volume::metrics_snapshot`).
    pub(crate) fn snapshot(&self) -> Snapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Snapshot {
            latency_bounds: LATENCY_BOUNDS.to_vec(),
            ops: Op::ALL
                .iter()
                .zip(&self.ops)
                .map(|(op, c)| OpStat { op: op.name().to_string(), count: g(&c.count), errors: g(&c.errors), seconds: g(&c.nanos) as f64 / 1e9, buckets: c.buckets.iter().map(g).collect() })
                .collect(),
            kernel_read_bytes: g(&self.kernel_read),
            kernel_write_bytes: g(&self.kernel_written),
            chunked_bytes: g(&self.chunked),
            deduplicated_bytes: g(&self.deduplicated),
            new_chunk_bytes: g(&self.new_chunk_bytes),
            compressed_bytes: g(&self.compressed),
            stored_bytes: g(&self.stored),
            new_chunks: g(&self.new_chunks),
            packs_written: g(&self.packs),
            flushes: g(&self.flushes),
            flush_rebases: g(&self.flush_rebases),
            flush_rounds_raced: g(&self.flush_rounds_raced),
            chunk_cache_hits: g(&self.chunk_hits),
            chunk_cache_misses: g(&self.chunk_misses),
            chunk_tail_hits: g(&self.tail_hits),
            pack_bytes: g(&self.space[0]),
            dead_bytes: g(&self.space[1]),
            dead_bound: g(&self.space[2]),
            packs: g(&self.space[3]),
            small_packs: g(&self.space[4]),
            cleaner_rounds: g(&self.cleaner[0]),
            cleaner_packs: g(&self.cleaner[1]),
            cleaner_moved_bytes: g(&self.cleaner[2]),
            cleaner_freed_bytes: g(&self.cleaner[3]),
            ..Default::default()
        }
    }
}

/// Times one request (see [`Metrics::start`]).
pub struct Timer<'a> {
    m: &'a Metrics,
    op: Op,
    at: Instant,
    failed: bool,
}

impl Timer<'_> {
    /// Marks the request failed (counted in its operation's errors).
    pub fn failed(&mut self) {
        self.failed = true;
    }
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        self.m.observe(self.op, self.at.elapsed(), self.failed);
    }
}

/// One kind of FUSE request: how many, how many failed, total time, and
/// per-bucket counts (not cumulative; one per [`LATENCY_BOUNDS`] and +Inf).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OpStat {
    pub op: String,
    pub count: u64,
    pub errors: u64,
    pub seconds: f64,
    pub buckets: Vec<u64>,
}

/// Backend requests of one kind over the mount's life (the bill's meter:
/// failed attempts and retries included), with their payload bytes, and
/// how many of them failed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendStat {
    pub kind: String,
    pub requests: u64,
    pub bytes: u64,
    pub errors: u64,
}

/// Everything a mount counts, at one moment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Seconds since the volume was opened.
    pub uptime_secs: f64,
    pub latency_bounds: Vec<f64>,
    pub ops: Vec<OpStat>,
    pub kernel_read_bytes: u64,
    pub kernel_write_bytes: u64,
    pub chunked_bytes: u64,
    pub deduplicated_bytes: u64,
    pub new_chunk_bytes: u64,
    pub compressed_bytes: u64,
    pub stored_bytes: u64,
    pub new_chunks: u64,
    pub packs_written: u64,
    pub flushes: u64,
    /// Dirty files re-based on another machine's commit of them.
    #[serde(default)]
    pub flush_rebases: u64,
    /// Flush rounds that lost a chunk to another machine's writer and were
    /// prepared again.
    #[serde(default)]
    pub flush_rounds_raced: u64,
    pub chunk_cache_hits: u64,
    pub chunk_cache_misses: u64,
    /// Reads answered from the last pages of chunks kept in memory (the
    /// kernel's read before an append), without the chunk.
    #[serde(default)]
    pub chunk_tail_hits: u64,
    /// The pack cache of a volume in a bucket (reads served locally or not,
    /// bytes fetched, evictions); zero for a local volume.
    pub pack_cache_hits: u64,
    pub pack_cache_misses: u64,
    pub pack_cache_fetched_bytes: u64,
    pub pack_cache_evictions: u64,
    /// Bytes in the write-back journal, and the limit at which writers wait.
    pub journal_bytes: u64,
    pub journal_limit: u64,
    /// Files waiting for the flusher (the flush queue).
    pub flush_queue_files: u64,
    /// Packs waiting for upload to the bucket.
    pub upload_queue_objects: u64,
    pub upload_queue_bytes: u64,
    /// Backend requests by kind (a volume in a bucket; a local directory is
    /// not metered).
    pub backend: Vec<BackendStat>,
    /// The cleaner's last look (every second; zero where no cleaner runs):
    /// bytes of all packs, of dead chunks in them, the most dead bytes the
    /// bound allows, packs, and packs below a quarter of the pack target
    /// (docs/frugal.md §8).
    #[serde(default)]
    pub pack_bytes: u64,
    #[serde(default)]
    pub dead_bytes: u64,
    #[serde(default)]
    pub dead_bound: u64,
    #[serde(default)]
    pub packs: u64,
    #[serde(default)]
    pub small_packs: u64,
    /// The cleaner's rounds, packs cleaned, live bytes moved and dead bytes
    /// freed over the mount's life.
    #[serde(default)]
    pub cleaner_rounds: u64,
    #[serde(default)]
    pub cleaner_packs: u64,
    #[serde(default)]
    pub cleaner_moved_bytes: u64,
    #[serde(default)]
    pub cleaner_freed_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_land_in_their_bucket() {
        let m = Metrics::new();
        m.observe(Op::Read, Duration::from_micros(5), false);
        m.observe(Op::Read, Duration::from_micros(30), false);
        m.observe(Op::Read, Duration::from_secs(20), true);
        {
            let mut t = m.start(Op::Write);
            t.failed();
        }
        let s = m.snapshot();
        let read = s.ops.iter().find(|o| o.op == "read").unwrap();
        assert_eq!((read.count, read.errors), (3, 1));
        assert_eq!(read.buckets[0], 1, "5 µs <= 10 µs");
        assert_eq!(read.buckets[2], 1, "30 µs in (25, 50] µs");
        assert_eq!(read.buckets[LATENCY_BOUNDS.len()], 1, "20 s above every bound");
        assert!((read.seconds - 20.000035).abs() < 1e-6);
        let write = s.ops.iter().find(|o| o.op == "write").unwrap();
        assert_eq!((write.count, write.errors), (1, 1));
        assert_eq!(s.ops.len(), Op::ALL.len());
        assert!(Op::ALL.iter().enumerate().all(|(i, op)| *op as usize == i));
    }
}
