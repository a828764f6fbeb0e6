//! Grouped flush rounds in a bucket (docs/frugal.md §7): every pack is a
//! PUT, so a round takes what was written over about half the flush age
//! rather than the few files that crossed it since the flusher's last
//! tick, closed files that fill a pack go without waiting for their age,
//! and a small cache still leaves the journal room for whole packs.

use cairn_engine::cloud::CloudOptions;
use cairn_engine::{Caller, FileKind, InjectedBackend, OpenOptions, Volume, ROOT_INO};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{memory_cloud_volume, memory_cloud_volume_packing, random_bytes as bytes};

fn open(dir: &std::path::Path, bucket: &Arc<dyn cairn_backend::Backend>, flush_age: Duration, cache_bytes: u64) -> Arc<Volume> {
    let opts = OpenOptions {
        backend: Some(InjectedBackend(bucket.clone())),
        flush_age,
        cloud: CloudOptions { cache_bytes, meta_interval: Duration::from_secs(3600), gc_interval: None, ..Default::default() },
        ..Default::default()
    };
    Volume::load(dir, opts).unwrap()
}

fn write_closed(v: &Volume, name: &str, seed: u64, len: usize) {
    let who = Caller { uid: 0, gid: 0 };
    let f = v.create(ROOT_INO, name.as_bytes(), FileKind::File, 0o644, 0, who).unwrap().ino;
    v.open(f).unwrap();
    v.write(f, 0, &bytes(seed, len)).unwrap();
    v.release(f).unwrap();
}

/// Waits until the flusher has taken every dirty file (or `limit` passes).
fn flushed_within(v: &Volume, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if v.status().dirty_files == 0 {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn a_round_takes_the_files_half_its_age_old_into_one_pack() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("vol");
    let bucket = memory_cloud_volume(&dir);
    let v = open(&dir, &bucket, Duration::from_secs(4), 64 << 20);
    write_closed(&v, "a", 1, 100_000);
    // b is written a second after a: when a turns 4 s old, b is 3 s old,
    // past half the age, and goes with it. Without grouping b would wait
    // for a round of its own a second later: two packs, two PUTs.
    std::thread::sleep(Duration::from_secs(1));
    write_closed(&v, "b", 2, 100_000);
    assert!(flushed_within(&v, Duration::from_secs(30)), "not flushed");
    let m = v.metrics_snapshot();
    assert_eq!((m.flushes, m.packs_written), (1, 1), "{:?}", (m.flushes, m.packs_written));
    v.close().unwrap();
}

#[test]
fn closed_files_that_fill_a_pack_go_without_waiting_for_their_age() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("vol");
    let bucket = memory_cloud_volume(&dir); // 1 MiB packs
    let v = open(&dir, &bucket, Duration::from_secs(3600), 64 << 20);
    // Half a pack, closed: it waits (for an hour).
    for i in 0..4 {
        write_closed(&v, &format!("f{i}"), i, 128 << 10);
    }
    assert!(!flushed_within(&v, Duration::from_secs(2)), "half a pack went");
    // A pack's worth: all of them go, into one full pack and a rest.
    for i in 4..9 {
        write_closed(&v, &format!("f{i}"), i, 128 << 10);
    }
    assert!(flushed_within(&v, Duration::from_secs(30)), "a pack's worth of closed files waited");
    assert_eq!(v.metrics_snapshot().flushes, 1);
    v.close().unwrap();
}

#[test]
fn a_small_cache_leaves_the_journal_room_for_two_packs() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("vol");
    let bucket = memory_cloud_volume_packing(&dir, 16 << 20);
    // A quarter of 16 MiB would be 4 MiB: every pack cut at a quarter.
    let v = open(&dir, &bucket, Duration::from_secs(5), 16 << 20);
    assert_eq!(v.status().journal_limit, 32 << 20);
    v.close().unwrap();
    drop(v);
    // A large cache: a quarter of it, as before.
    let v = open(&dir, &bucket, Duration::from_secs(5), 1 << 30);
    assert_eq!(v.status().journal_limit, 256 << 20);
    v.close().unwrap();
}

#[test]
fn a_grouped_round_takes_at_most_two_packs_of_files() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("vol");
    let bucket = memory_cloud_volume(&dir); // 1 MiB packs
    let v = open(&dir, &bucket, Duration::from_secs(3600), 64 << 20);
    // Three packs' worth of closed files: more than one round may take.
    let file = 512u64 << 10;
    for i in 0..6 {
        write_closed(&v, &format!("f{i}"), i, file as usize);
    }
    // The rounds run here (the background flusher may take one first: it
    // follows the same rule). Each takes the oldest files up to two packs.
    let mut taken = 0;
    let end = Instant::now() + Duration::from_secs(30);
    while v.status().dirty_files > 0 {
        assert!(Instant::now() < end, "closed files filling three packs were never taken");
        let r = v.flush_due().unwrap();
        assert!(r.chunked_bytes <= 2 * (1 << 20), "a round took {} bytes", r.chunked_bytes);
        taken += r.files;
        if r.files == 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    assert!(taken > 0, "the background flusher took every round");
    assert!(v.metrics_snapshot().flushes >= 2);
    v.close().unwrap();
}
