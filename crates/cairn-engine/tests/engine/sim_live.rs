//! The live replay against a live run: a cloud volume over an in-memory
//! bucket, with a small pack cache and tracing on, writes files and reads
//! them back in a skewed random order (so the cache misses and evicts);
//! the replay of its trace at the same capacity must find the hit ratio
//! the cache itself counted. (Here, not in cairn-sim, so that the
//! simulator's own tests build without the engine.)

use cairn_engine::cloud::CloudOptions;
use cairn_engine::{Caller, FileKind, InjectedBackend, OpenOptions, Volume, ROOT_INO};
use std::time::Duration;

const CACHE: u64 = 8 << 20;

/// xorshift64: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

#[test]
fn the_live_replay_reproduces_the_live_hit_ratio() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("vol");
    let trace = d.path().join("trace");
    let bucket = crate::common::memory_cloud_volume(&dir);
    let opts = OpenOptions {
        backend: Some(InjectedBackend(bucket.clone())),
        // Nearly no decoded chunks in memory: reads reach the pack cache.
        cache_bytes: 0,
        cloud: CloudOptions { cache_bytes: CACHE, meta_interval: Duration::from_secs(3600), gc_interval: None, ..Default::default() },
        trace: Some(trace.clone()),
        ..Default::default()
    };
    let v = Volume::load(&dir, opts).unwrap();
    let who = Caller { uid: 0, gid: 0 };

    // ~40 MiB in files of 4-60 KiB, in 1 MiB packs: five times the cache.
    let mut rng = Rng(0x5eed);
    let mut files = Vec::new();
    let mut written = 0u64;
    while written < 40 << 20 {
        let len = 4096 + (rng.next() % (56 << 10)) as usize;
        let a = v.create(ROOT_INO, format!("f{}", files.len()).as_bytes(), FileKind::File, 0o644, 0, who).unwrap();
        v.open(a.ino).unwrap();
        v.write(a.ino, 0, &rng.bytes(len)).unwrap();
        v.release(a.ino).unwrap();
        files.push((a.ino, len));
        written += len as u64;
    }
    v.flush_now().unwrap();
    let cache = v.cloud().unwrap().cache.clone();
    cache.drain(&mut |_, _| {});

    // Whole files (no read-ahead), low numbers far more often: u^3 puts
    // 58% of the reads on the first fifth.
    for _ in 0..4000 {
        let (ino, len) = files[(rng.unit().powi(3) * files.len() as f64) as usize];
        assert_eq!(v.read(ino, 0, 1 << 20).unwrap().len(), len);
    }
    v.close().unwrap();
    drop(v);

    let live = cache.stats();
    assert!(live.misses > 100 && live.evictions > 100, "the workload must miss and evict: {live:?}");
    let live_ratio = live.hits as f64 / (live.hits + live.misses) as f64;
    let r = cairn_sim::replay_live(&trace, "lru", Some(CACHE)).unwrap();
    // Every counted read is in the trace.
    assert_eq!((r.recorded_hits, r.recorded_misses), (live.hits, live.misses));
    assert!(
        (r.hit_ratio - live_ratio).abs() < 0.03,
        "the replay's hit ratio {:.4} ({} hits, {} misses) is not within 3 points of the live cache's {:.4} ({} hits, {} misses)",
        r.hit_ratio,
        r.hits,
        r.misses,
        live_ratio,
        live.hits,
        live.misses
    );
}
