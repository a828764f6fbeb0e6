//! Issue 50: flushing n byte-sized writes or hole punches costs
//! O(n log n), not O(n²) (100,000 one-byte writes took 136 s to flush, a
//! million held every other file's flush back for minutes); and a volume
//! with owner dedup domains stores identical data of two owners twice.

use crate::common::*;
use cairn_engine::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Runs `f` on a thread of its own and waits for it at most `limit`: the
/// bound is generous (seconds of work are expected; the quadratic flush
/// took minutes), so a loaded CI machine does not fail it, while a return
/// to the quadratic cost does.
fn within<T: Send + 'static>(what: &str, limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let t0 = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => {
            eprintln!("{what}: {:.1} s", t0.elapsed().as_secs_f64());
            v
        }
        Err(_) => panic!("{what} did not finish within {limit:?}"),
    }
}

const N: u64 = 100_000;

/// A file with `len` random bytes, stored, and the volume with it.
fn stored(len: usize) -> (tempfile::TempDir, Arc<Volume>, Ino, Vec<u8>) {
    let d = tempfile::tempdir().unwrap();
    init(d.path(), &InitOptions { meta_url: meta_url(), ..Default::default() }).unwrap();
    let v = open(d.path());
    let model = random_bytes(9, len);
    let ino = mkfile(&v, ROOT_INO, "f", &model);
    v.sync().unwrap();
    (d, v, ino, model)
}

#[test]
fn a_hundred_thousand_scattered_one_byte_writes_flush_in_time() {
    let (_d, v, ino, mut model) = stored(4 << 20);
    v.open(ino).unwrap();
    // Every 40th byte: none adjacent, all inside stored chunks.
    for i in 0..N {
        let off = 1 + i * 40;
        let b = [(i % 251) as u8];
        v.write(ino, off, &b).unwrap();
        model[off as usize] = b[0];
    }
    let v2 = v.clone();
    within("flushing 10^5 one-byte writes", Duration::from_secs(60), move || v2.flush_file_now(ino).unwrap());
    v.release(ino).unwrap();
    assert!(read_all(&v, ino) == model, "content after the flush");
}

#[test]
fn a_hundred_thousand_appended_one_byte_writes_flush_in_time() {
    let d = tempfile::tempdir().unwrap();
    init(d.path(), &InitOptions { meta_url: meta_url(), ..Default::default() }).unwrap();
    let v = open(d.path());
    let a = v.create(ROOT_INO, b"log", FileKind::File, 0o644, 0, root()).unwrap();
    v.open(a.ino).unwrap();
    let model = random_bytes(3, N as usize);
    for (i, b) in model.iter().enumerate() {
        v.write(a.ino, i as u64, std::slice::from_ref(b)).unwrap();
    }
    let v2 = v.clone();
    within("flushing 10^5 appended one-byte writes", Duration::from_secs(60), move || v2.flush_file_now(a.ino).unwrap());
    v.release(a.ino).unwrap();
    assert!(read_all(&v, a.ino) == model, "content after the flush");
}

#[test]
fn a_hundred_thousand_one_byte_punches_flush_in_time() {
    let (_d, v, ino, mut model) = stored(4 << 20);
    v.open(ino).unwrap();
    for i in 0..N {
        let off = 1 + i * 40;
        v.fallocate(ino, off, 1, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE).unwrap();
        model[off as usize] = 0;
    }
    let v2 = v.clone();
    within("flushing 10^5 one-byte punches", Duration::from_secs(60), move || v2.flush_file_now(ino).unwrap());
    v.release(ino).unwrap();
    assert!(read_all(&v, ino) == model, "content after the flush");
}

/// Two owners write the same bytes; returns the chunks of each file and
/// how many of the second owner's and of the first owner's second file's are
/// the first file's.
fn two_owners(domain: cairn_engine::config::DedupDomain) -> (Vec<u64>, Vec<u64>, u64, u64) {
    let d = tempfile::tempdir().unwrap();
    init(d.path(), &InitOptions { chunker: small_chunks(), meta_url: meta_url(), dedup_domain: domain, ..Default::default() }).unwrap();
    let v = open(d.path());
    let data = random_bytes(50, 3 << 20);
    let mut chunks = Vec::new();
    let mut same_owner = Vec::new();
    for (name, uid) in [("a", 1000u32), ("b", 1001), ("c", 1000)] {
        let a = v.create(ROOT_INO, name.as_bytes(), FileKind::File, 0o600, 0, Caller { uid, gid: uid }).unwrap();
        v.open(a.ino).unwrap();
        v.write(a.ino, 0, &data).unwrap();
        v.release(a.ino).unwrap();
        v.sync().unwrap();
        let info = v.info(name.as_bytes(), root()).unwrap();
        let mut ids: Vec<u64> = info.runs.iter().filter_map(|r| r.chunk).collect();
        ids.sort_unstable();
        ids.dedup();
        assert!(!ids.is_empty());
        if name == "c" {
            same_owner = ids;
        } else {
            chunks.push(ids);
        }
        assert!(read_all(&v, a.ino) == data);
    }
    // The data of another owner reads back, verified, after a reopen (the
    // id says whose domain it is in).
    v.close().unwrap();
    drop(v);
    let v = open(d.path());
    let rep = cairn_engine::maintenance::fsck(&v, true, &cairn_engine::maintenance::NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
    let shared_with_c = same_owner.iter().filter(|c| chunks[0].contains(c)).count() as u64;
    let shared = chunks[1].iter().filter(|c| chunks[0].contains(c)).count() as u64;
    let b = chunks.pop().unwrap();
    (chunks.pop().unwrap(), b, shared, shared_with_c)
}

#[test]
fn owner_dedup_domains_store_two_owners_identical_files_apart() {
    use cairn_engine::config::DedupDomain;
    let (a, b, shared, same_owner_shared) = two_owners(DedupDomain::Owner);
    assert_eq!(shared, 0, "two owners' identical files share chunks under owner domains: {a:?} {b:?}");
    assert_eq!(same_owner_shared as usize, a.len(), "one owner's two identical files must still share every chunk");
    let (a, b, shared, _) = two_owners(DedupDomain::Volume);
    assert_eq!(a, b, "under one volume domain identical files share every chunk");
    assert_eq!(shared as usize, a.len());
}

/// Issue 50, fairness: "no operation on one file may hold back other
/// files' flushes". A file with 200,000 scattered one-byte writes and one
/// with 100,000 one-byte appends share a background round with a small
/// file: the small file is committed by that first round, while the round
/// applies only the first `ROUND_PIECES` (65,536) writes of each big file
/// and leaves the rest to the next rounds (before, one round applied them
/// all, so the small file's commit waited for every one). Order, not
/// speed: after round 1 the small file is clean and the big ones are not.
/// A crash right after that round loses nothing (the left-out writes
/// replay from the journal), and background rounds alone finish such a
/// file in a few slices.
#[test]
fn a_small_file_is_not_held_back_by_files_of_byte_sized_writes() {
    const M: u64 = 200_000;
    let d = tempfile::tempdir().unwrap();
    init(d.path(), &InitOptions { meta_url: meta_url(), ..Default::default() }).unwrap();
    // Every dirty file is over `flush_bytes`: a background round takes all.
    let load = || Volume::load(d.path(), OpenOptions { flush_bytes: 1, ..opts() }).unwrap();
    let v = load();
    v.pause_flusher(true);
    let mut scattered = random_bytes(11, 8 << 20);
    let h = mkfile(&v, ROOT_INO, "scattered", &scattered);
    let base = random_bytes(12, 1 << 20);
    let a = mkfile(&v, ROOT_INO, "appended", &base);
    v.sync().unwrap();
    v.open(h).unwrap();
    for i in 0..M {
        let off = 1 + i * 40;
        let b = [(i % 251) as u8];
        v.write(h, off, &b).unwrap();
        scattered[off as usize] = b[0];
    }
    v.release(h).unwrap();
    let mut appended = base.clone();
    appended.extend(random_bytes(13, (M / 2) as usize));
    v.open(a).unwrap();
    for (i, b) in appended.iter().enumerate().skip(base.len()) {
        v.write(a, i as u64, std::slice::from_ref(b)).unwrap();
    }
    v.release(a).unwrap();
    let small = random_bytes(14, 100_000);
    let s = mkfile(&v, ROOT_INO, "small", &small);
    assert!(v.is_dirty(h) && v.is_dirty(a) && v.is_dirty(s));

    let r = v.flush_due().unwrap();
    assert_eq!(r.files, 3, "one background round takes the three files: {r:?}");
    assert!(!v.is_dirty(s), "the small file was not committed by the round that took it");
    assert!(v.is_dirty(h), "one round applied all 200,000 scattered writes: a file's work per round is not bounded");
    assert!(v.is_dirty(a), "one round applied all 100,000 appends: a file's work per round is not bounded");
    // What a reader sees meanwhile is every write.
    assert!(read_all(&v, h) == scattered && read_all(&v, a) == appended && read_all(&v, s) == small, "content after a bounded round");

    // A crash now: the open replays the left-out writes from the journal.
    v.simulate_crash();
    let v = load();
    v.pause_flusher(true);
    assert!(read_all(&v, h) == scattered, "scattered writes left out of a round were lost in a crash");
    assert!(read_all(&v, a) == appended, "appends left out of a round were lost in a crash");
    assert!(read_all(&v, s) == small);

    // Background rounds alone finish such a file, a slice each.
    v.open(h).unwrap();
    for i in 0..M {
        let off = 3 + i * 40;
        let b = [(i % 241) as u8];
        v.write(h, off, &b).unwrap();
        scattered[off as usize] = b[0];
    }
    v.release(h).unwrap();
    let mut rounds = 0;
    while v.is_dirty(h) {
        v.flush_due().unwrap();
        rounds += 1;
        assert!(rounds <= 10, "200,000 writes still dirty after {rounds} rounds of up to 65,536 each");
    }
    assert!(rounds >= 3, "200,000 writes took only {rounds} rounds: not bounded per round");
    assert!(read_all(&v, h) == scattered, "content after the rounds");
    v.close().unwrap();
    drop(v);
    let v = load();
    assert!(read_all(&v, h) == scattered && read_all(&v, a) == appended && read_all(&v, s) == small, "content after a remount");
    v.close().unwrap();
}
