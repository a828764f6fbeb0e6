//! The cost-optimal cleaner (docs/frugal.md §5): due exactly when theorem 1
//! says (a fake clock: `now` is a parameter), and never losing a chunk to
//! writers that deduplicate against the chunks it is deleting.

use crate::cloud::{init_in, open_in, opts};
use crate::common::*;
use cairn_backend::Backend;
use cairn_engine::cache::disk::Durability;
use cairn_engine::cleaner::{self, PackCost};
use cairn_engine::cost::{Prices, GB, MONTH_SECS};
use cairn_engine::*;
use cairn_testing::MemoryBackend;
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Round prices so the hand computation below reads plainly.
fn prices() -> Prices {
    let mut p = Prices::aws();
    p.storage_per_gb_month = 1.0;
    p
}

const SEC: i64 = 1_000_000_000;

fn the_pack(v: &Volume, now: i64) -> PackCost {
    let plan = cleaner::plan(v, now, &prices()).unwrap();
    assert_eq!(plan.len(), 1, "one pack holds dead bytes: {plan:?}");
    plan.into_iter().next().unwrap()
}

fn fsck_clean(v: &Volume) {
    let rep = maintenance::fsck(v, true, &maintenance::NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "fsck: {:?}", rep.errors);
}

/// C_store = dead bytes × seconds × price; C_clean = download + GETs + the
/// new pack's PUT. Not due a second before they meet, due a second after;
/// a machine whose cache holds the pack pays no download, so it is due
/// sooner there; the cleaning itself keeps every byte.
#[test]
fn cleaning_is_due_exactly_when_theorem_1_says() {
    let bucket: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let a = tempfile::tempdir().unwrap();
    init_in(a.path(), &bucket, None);
    let v = open_in(a.path(), &bucket, Durability::Local);
    let (da, db) = (random_bytes(1, 300_000), random_bytes(2, 200_000));
    mkfile(&v, ROOT_INO, "a", &da);
    let b = mkfile(&v, ROOT_INO, "b", &db);
    v.flush_now().unwrap();
    v.unlink(ROOT_INO, b"a").unwrap();
    v.sync().unwrap();
    let stats = maintenance::stats(&v).unwrap();
    let here = the_pack(&v, 0);
    assert_eq!(here.dead_bytes, stats.dead_bytes);
    assert_eq!(here.live_bytes, stats.live_stored_bytes);
    assert!(here.dead_bytes >= 300_000 && here.live_bytes >= 200_000, "{here:?}");
    assert_eq!((here.gets, here.download_bytes), (0, 0), "the writer's cache holds its pack: cleaning downloads nothing");
    v.close().unwrap();
    drop(v);

    // Another machine: an empty cache, so cleaning downloads the live run.
    let c = tempfile::tempdir().unwrap();
    let v = open_in(c.path(), &bucket, Durability::Local);
    let p = the_pack(&v, 0);
    assert_eq!((p.gets, p.download_bytes), (1, p.live_bytes), "one run of live chunks after the dead one: {p:?}");
    // Byte-seconds accrued before the last death (the new pack's chunks
    // count dead from its insert to their references in the same commit).
    assert!(p.dead_acc < 1e4, "{p:?}");
    let per_byte_second = 1.0 / GB / MONTH_SECS;
    let c_clean = p.live_bytes as f64 / GB * 0.09 + 0.0004 / 1000.0 + 0.005 / 1000.0;
    let tau = p.mark + ((c_clean / per_byte_second - p.dead_acc) / p.dead_bytes as f64 * 1e9) as i64;
    assert!((p.c_clean - c_clean).abs() < 1e-12, "C_clean {} vs {c_clean} by hand", p.c_clean);
    assert!((p.due_at.unwrap() - tau).abs() < 1_000_000, "due at {} vs {tau} by hand", p.due_at.unwrap());
    assert!(here.due_at.unwrap() < tau, "a cached pack is due sooner");
    let before = the_pack(&v, tau - SEC);
    assert!(!before.due(), "due a second early: C_store {} < C_clean {}", before.c_store, before.c_clean);
    assert!(the_pack(&v, tau + SEC).due());

    let r = cleaner::clean_due(&v, tau - SEC, &prices(), u64::MAX).unwrap();
    assert_eq!(r.packs_cleaned, 0, "{r:?}");
    let r = cleaner::clean_due(&v, tau + SEC, &prices(), u64::MAX).unwrap();
    assert_eq!((r.packs_cleaned, r.packs_written, r.gave_up.as_deref()), (1, 1, None), "{r:?}");
    assert_eq!(r.dead_bytes_freed, p.dead_bytes);
    assert!(cleaner::plan(&v, tau + SEC, &prices()).unwrap().is_empty(), "no dead bytes left");
    assert_eq!(read_all(&v, b), db);
    fsck_clean(&v);
    v.close().unwrap();
    drop(v);
    // The move shipped with the metadata: a third machine reads it.
    let d = tempfile::tempdir().unwrap();
    let v = open_in(d.path(), &bucket, Durability::Local);
    assert_eq!(read_all(&v, v.lookup(ROOT_INO, b"b").unwrap().ino), db);
    fsck_clean(&v);
    v.close().unwrap();
}

/// A pack nobody references costs nothing to clean (a DELETE): due at once.
#[test]
fn a_wholly_dead_pack_is_due_at_once() {
    let bucket: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let a = tempfile::tempdir().unwrap();
    init_in(a.path(), &bucket, None);
    let v = open_in(a.path(), &bucket, Durability::Local);
    mkfile(&v, ROOT_INO, "a", &random_bytes(3, 100_000));
    v.flush_now().unwrap();
    v.unlink(ROOT_INO, b"a").unwrap();
    v.sync().unwrap();
    let p = the_pack(&v, 0);
    assert_eq!((p.live_bytes, p.c_clean), (0, 0.0));
    assert!(the_pack(&v, p.mark).due());
    let r = cleaner::clean_due(&v, p.mark, &prices(), u64::MAX).unwrap();
    assert_eq!((r.packs_cleaned, r.packs_written, r.chunks_moved), (1, 0, 0), "{r:?}");
    assert_eq!(maintenance::stats(&v).unwrap().packs, 0);
    fsck_clean(&v);
    v.close().unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, failure_persistence: None, ..ProptestConfig::default() })]

    /// Writers replace and delete files whose contents come from a few
    /// blobs, so their chunks die and come back by deduplication, while a
    /// cleaner thread cleans every pack with dead bytes as fast as it can.
    /// Every file matches the model afterwards, and fsck reads every chunk.
    #[test]
    fn cleaning_races_writers_without_losing_a_chunk(ops in proptest::collection::vec((any::<bool>(), 0usize..5, 0usize..4), 15..35)) {
        let bucket: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
        let dir = tempfile::tempdir().unwrap();
        init_in(dir.path(), &bucket, None);
        let mut o = opts(&bucket, Durability::Local);
        o.cloud.meta_interval = std::time::Duration::from_secs(3600);
        let v = Volume::load(dir.path(), o).unwrap();
        let blobs: Vec<Vec<u8>> = (0..4).map(|i| random_bytes(100 + i, 120_000)).collect();
        let mut model: HashMap<usize, Vec<u8>> = HashMap::new();
        let stop = AtomicBool::new(false);
        let (rounds, races) = (AtomicU64::new(0), AtomicU64::new(0));
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Ordering::SeqCst) {
                    // Far in the future: every pack with dead bytes is due.
                    let r = cleaner::clean_due(&v, i64::MAX / 4, &Prices::aws(), 4 << 20).unwrap();
                    rounds.fetch_add(r.packs_cleaned, Ordering::SeqCst);
                    races.fetch_add(r.gave_up.is_some() as u64 + r.packs_kept, Ordering::SeqCst);
                }
            });
            for (i, &(write, slot, blob)) in ops.iter().enumerate() {
                let name = format!("f{slot}");
                if model.remove(&slot).is_some() {
                    v.unlink(ROOT_INO, name.as_bytes()).unwrap();
                }
                if write {
                    // A blob, sometimes with a few bytes of its own in front
                    // (the same chunks after the first boundary).
                    let mut data = if i % 3 == 0 { random_bytes(1000 + i as u64, 50) } else { Vec::new() };
                    data.extend_from_slice(&blobs[blob]);
                    mkfile(&v, ROOT_INO, &name, &data);
                    model.insert(slot, data);
                }
                v.flush_now().unwrap();
            }
            stop.store(true, Ordering::SeqCst);
        });
        v.sync().unwrap();
        for (slot, data) in &model {
            let ino = v.lookup(ROOT_INO, format!("f{slot}").as_bytes()).unwrap().ino;
            prop_assert!(&read_all(&v, ino) == data, "f{} differs after {} packs cleaned, {} rounds given up or packs kept", slot, rounds.load(Ordering::SeqCst), races.load(Ordering::SeqCst));
        }
        fsck_clean(&v);
        // A last round with no writer cleans everything left.
        let r = cleaner::clean_due(&v, i64::MAX / 4, &Prices::aws(), u64::MAX).unwrap();
        prop_assert!(r.gave_up.is_none(), "{:?}", r);
        prop_assert_eq!(maintenance::stats(&v).unwrap().dead_bytes, 0);
        fsck_clean(&v);
        v.close().unwrap();
    }
}

/// The mount's own cleaner thread: a wholly dead pack is trashed within a
/// few intervals, with no call from outside.
#[test]
fn the_mount_cleans_by_itself() {
    let bucket: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let a = tempfile::tempdir().unwrap();
    init_in(a.path(), &bucket, None);
    let mut o = opts(&bucket, Durability::Local);
    o.cloud.gc_interval = Some(std::time::Duration::from_millis(100));
    let v = Volume::load(a.path(), o).unwrap();
    let keep = random_bytes(5, 50_000);
    let b = mkfile(&v, ROOT_INO, "keep", &keep);
    v.flush_now().unwrap();
    mkfile(&v, ROOT_INO, "gone", &random_bytes(6, 100_000));
    v.flush_now().unwrap();
    v.unlink(ROOT_INO, b"gone").unwrap();
    v.sync().unwrap();
    assert!(maintenance::stats(&v).unwrap().dead_bytes >= 100_000);
    let t0 = std::time::Instant::now();
    while maintenance::stats(&v).unwrap().dead_bytes > 0 {
        assert!(t0.elapsed() < std::time::Duration::from_secs(20), "the cleaner never cleaned: {:?}", cleaner::plan(&v, 0, &Prices::aws()));
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(read_all(&v, b), keep);
    fsck_clean(&v);
    v.close().unwrap();
}

/// A volume in a directory on the suite's store, opened with the cleaner's
/// theorem-1 rounds an hour apart: what acts within a test is the look
/// every second at the bound and at the small packs (docs/frugal.md §8).
fn local_with_bound(dir: &std::path::Path, floor: u64) -> Arc<Volume> {
    init(dir, &InitOptions { chunker: small_chunks(), meta_url: meta_url(), ..Default::default() }).unwrap();
    let mut o = crate::common::opts();
    o.cloud.gc_interval = Some(std::time::Duration::from_secs(3600));
    o.cloud.gc_bound = cleaner::DeadBound { ratio: 1.0, floor };
    Volume::load(dir, o).unwrap()
}

/// Waits (at most a minute) until `done` holds of the volume's stats.
fn wait_stats(v: &Volume, what: &str, done: impl Fn(&maintenance::Stats) -> bool) -> maintenance::Stats {
    let t0 = std::time::Instant::now();
    loop {
        let s = maintenance::stats(v).unwrap();
        if done(&s) {
            return s;
        }
        assert!(t0.elapsed() < std::time::Duration::from_secs(60), "{what} never came: {s:?}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Issue 55: a file of 256 KiB rewritten in place again and again on a
/// volume in a directory (random writes, truncates, punched holes, each
/// round flushed as an fsync would), as a database or a VM image is. The
/// mount's own cleaner keeps the dead bytes under the bound and the
/// metadata's chunk rows with them, with no call to gc; every byte
/// reads back. Before, only a volume in a bucket ran a cleaner, and the
/// dead bytes grew with every rewrite.
#[test]
fn a_local_volume_keeps_its_dead_bytes_bounded_under_rewrites() {
    const FILE: usize = 256 << 10;
    const FLOOR: u64 = 1 << 20;
    let d = tempfile::tempdir().unwrap();
    let v = local_with_bound(d.path(), FLOOR);
    let mut model = random_bytes(1, FILE);
    let f = mkfile(&v, ROOT_INO, "db", &model);
    v.flush_now().unwrap();
    v.open(f).unwrap();
    let mut written = 0u64;
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    for i in 0..600u64 {
        match i % 10 {
            3 => {
                // Truncate, then write the tail back anew.
                let at = next(FILE as u64) as usize;
                v.truncate(f, at as u64).unwrap();
                let tail = random_bytes(10_000 + i, FILE - at);
                v.write(f, at as u64, &tail).unwrap();
                model.truncate(at);
                model.extend_from_slice(&tail);
                written += tail.len() as u64;
            }
            7 => {
                // Punch a hole.
                let off = next(FILE as u64 - 4096) & !4095;
                let len = (next(32 << 10) + 4096).min(FILE as u64 - off) & !4095;
                v.fallocate(f, off, len, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE).unwrap();
                model[off as usize..(off + len) as usize].fill(0);
            }
            _ => {
                let off = next(FILE as u64 - 1024) as usize;
                let len = (next(64 << 10) as usize + 1024).min(FILE - off);
                let data = random_bytes(20_000 + i, len);
                v.write(f, off as u64, &data).unwrap();
                model[off..off + len].copy_from_slice(&data);
                written += len as u64;
            }
        }
        v.flush_file_now(f).unwrap();
    }
    v.release(f).unwrap();
    v.sync().unwrap();
    assert!(written > 20 * FLOOR, "the loop rewrote {written} bytes: far more than the bound");
    let s = wait_stats(&v, "dead bytes under the bound", |s| s.dead_bound.is_some_and(|b| s.dead_bytes <= b));
    assert_eq!(s.dead_bound, Some(FLOOR), "live bytes are below the floor: {s:?}");
    // The metadata follows: the chunk rows of dead chunks go with their
    // packs (600 rounds left a few dead chunks each).
    assert!(s.dead_chunks <= 400, "{} dead chunk rows stay: {s:?}", s.dead_chunks);
    assert!(s.packs <= cleaner::SMALL_PACKS + 4, "{} packs stay for {} live: {s:?}", s.packs, s.live_stored_bytes);
    assert!(v.metrics_snapshot().cleaner_rounds > 0);
    assert!(read_all(&v, f) == model, "the file differs from the model");
    fsck_clean(&v);
    v.close().unwrap();
}

/// Issue 55: each flush of a few bytes leaves a small pack; once
/// [`cleaner::SMALL_PACKS`] of them are there the mount's cleaner merges
/// their live chunks into one, so the pack count follows the live data,
/// not the number of flushes.
#[test]
fn tiny_flushes_do_not_leave_a_pack_each() {
    let d = tempfile::tempdir().unwrap();
    let v = local_with_bound(d.path(), 256 << 20);
    let n = 3 * cleaner::SMALL_PACKS as usize;
    for i in 0..n {
        mkfile(&v, ROOT_INO, &format!("f{i}"), format!("line {i}\n").as_bytes());
        v.flush_now().unwrap();
    }
    let s = wait_stats(&v, "the small packs merged", |s| s.packs < cleaner::SMALL_PACKS);
    assert!(s.small_packs < cleaner::SMALL_PACKS, "{s:?}");
    for i in 0..n {
        let ino = v.lookup(ROOT_INO, format!("f{i}").as_bytes()).unwrap().ino;
        assert_eq!(read_all(&v, ino), format!("line {i}\n").as_bytes());
    }
    fsck_clean(&v);
    v.close().unwrap();
    drop(v);
    // Reopened, everything is where the merge put it.
    let v = Volume::load(d.path(), crate::common::opts()).unwrap();
    assert_eq!(read_all(&v, v.lookup(ROOT_INO, b"f7").unwrap().ino), b"line 7\n");
    fsck_clean(&v);
    v.close().unwrap();
}

/// Issue 55, memory: a file of 256 KiB rewritten and read back round after
/// round on a volume in a directory with a memory cache far larger than
/// the volume (256 MiB). What the mount holds per chunk follows what
/// exists (the live chunks and the dead ones the bound allows), not the
/// history: the chunks the cleaner drops leave the memory cache and the
/// location map with their rows. Before, they stayed until the cache's LRU
/// reached its whole budget (the daemon grew by some 90 MB a minute under
/// the soak, to 1 GiB and more) and the location map until a million.
#[test]
fn the_memory_held_per_chunk_follows_the_live_chunks_not_the_history() {
    const FILE: usize = 256 << 10;
    const FLOOR: u64 = 1 << 20;
    let d = tempfile::tempdir().unwrap();
    init(d.path(), &InitOptions { chunker: small_chunks(), meta_url: meta_url(), ..Default::default() }).unwrap();
    let mut o = crate::common::opts();
    o.cache_bytes = 256 << 20;
    o.cloud.gc_interval = Some(std::time::Duration::from_secs(3600));
    o.cloud.gc_bound = cleaner::DeadBound { ratio: 1.0, floor: FLOOR };
    let v = Volume::load(d.path(), o).unwrap();
    let mut model = random_bytes(3, FILE);
    let f = mkfile(&v, ROOT_INO, "db", &model);
    v.flush_now().unwrap();
    v.open(f).unwrap();
    let mut written = 0u64;
    for i in 0..300u64 {
        let off = (i * 7919 % (FILE as u64 - (48 << 10))) as usize;
        let data = random_bytes(30_000 + i, 48 << 10);
        v.write(f, off as u64, &data).unwrap();
        model[off..off + data.len()].copy_from_slice(&data);
        written += data.len() as u64;
        v.flush_file_now(f).unwrap();
        // Read back, as fsx does: the chunks come through the memory cache.
        assert!(read_all(&v, f) == model, "round {i}: the file differs from the model");
    }
    v.release(f).unwrap();
    v.sync().unwrap();
    assert!(written > 8 * FLOOR, "the loop rewrote {written} bytes: not past the bound");
    let s = wait_stats(&v, "dead bytes under the bound", |s| s.dead_bound.is_some_and(|b| s.dead_bytes <= b));
    // Every chunk the cleaner dropped has left memory: what stays is at
    // most the chunks that exist (live, or dead within the bound).
    let t0 = std::time::Instant::now();
    let m = loop {
        let m = v.memory_held();
        let s = maintenance::stats(&v).unwrap();
        if m.cached_bytes <= s.stored_bytes && m.chunk_locations <= s.chunks + s.dead_chunks {
            break m;
        }
        assert!(t0.elapsed() < std::time::Duration::from_secs(60), "the mount holds {m:?} in memory for {s:?} after {written} bytes rewritten");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(m.cached_bytes <= FLOOR + 2 * FILE as u64, "{m:?} for {s:?}");
    assert!(read_all(&v, f) == model);
    fsck_clean(&v);
    v.close().unwrap();
}
