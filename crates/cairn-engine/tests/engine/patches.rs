//! Small overwrites inside stored content become patches (chunks of their
//! own) instead of re-chunking their neighbourhood; a neighbourhood that
//! gathers too many is re-chunked, folding them back.

use crate::common::*;
use cairn_engine::maintenance::{self, NoProgress};
use cairn_engine::*;

const MIB: usize = 1 << 20;

/// Applies `n` 4 KiB overwrites at random 4 KiB-aligned offsets to the file
/// and to the model, then flushes the file (still open, so the background
/// flusher leaves it alone) and closes it.
fn overwrite_4k(v: &Volume, ino: Ino, model: &mut [u8], seed: u64, n: usize) -> FlushReport {
    let mut x = seed | 1;
    v.open(ino).unwrap();
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let blocks = model.len() / 4096;
        // Not the first or last block: a patch needs stored bytes on both sides.
        let off = (1 + (x as usize) % (blocks - 2)) * 4096;
        let data = random_bytes(seed.wrapping_add(i as u64 * 7919), 4096);
        v.write(ino, off as u64, &data).unwrap();
        model[off..off + 4096].copy_from_slice(&data);
    }
    let r = v.flush_file_now(ino).unwrap();
    v.release(ino).unwrap();
    r
}

/// A fresh volume (default chunking) with one file of `len` random bytes,
/// chunked and packed: the directory, the volume, the file and its bytes.
fn stored_file(seed: u64, len: usize) -> (tempfile::TempDir, std::sync::Arc<Volume>, Ino, Vec<u8>) {
    let d = tempfile::tempdir().unwrap();
    init(d.path(), &InitOptions { meta_url: meta_url(), ..Default::default() }).unwrap();
    let v = open(d.path());
    let model = random_bytes(seed, len);
    let ino = mkfile(&v, ROOT_INO, "f", &model);
    v.sync().unwrap();
    (d, v, ino, model)
}

/// Closes `v`, opens the volume again and checks the file's bytes and fsck.
fn reopen_and_check(d: &tempfile::TempDir, v: std::sync::Arc<Volume>, ino: Ino, model: &[u8]) {
    v.close().unwrap();
    drop(v);
    let v = open(d.path());
    assert!(read_all(&v, ino) == model, "content after reopening");
    let rep = maintenance::fsck(&v, true, &NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
}

#[test]
fn scattered_4k_overwrites_are_patched_not_rechunked_and_read_back_exactly() {
    let (d, v, ino, mut model) = stored_file(1, 24 * MIB);

    // 40 overwrites on a freshly chunked 24 MiB file: each is a patch, and
    // nothing else is read back or cut again.
    let r = overwrite_4k(&v, ino, &mut model, 11, 40);
    assert_eq!(r.files, 1);
    assert!(r.patches >= 38, "only {} of 40 overwrites became patches", r.patches);
    assert!(r.chunked_bytes <= 40 * 4096 + 4 * MIB as u64 * (40 - r.patches), "chunked {} bytes for 40 small overwrites", r.chunked_bytes);
    assert!(read_all(&v, ino) == model, "content after the patches");

    // Many more: neighbourhoods pass the extent bound and are re-chunked,
    // which folds their patches back into content-defined chunks.
    let mut folded = false;
    for round in 0..6 {
        let r = overwrite_4k(&v, ino, &mut model, 100 + round, 150);
        folded |= r.chunked_bytes > r.patches * 4096;
        assert!(read_all(&v, ino) == model, "content after round {round}");
    }
    assert!(folded, "no neighbourhood was ever re-chunked: fragmentation is unbounded");
    let rep = maintenance::fsck(&v, true, &NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
    reopen_and_check(&d, v, ino, &model);
}

#[test]
fn a_patch_survives_a_crash_after_fsync() {
    let d = tempfile::tempdir().unwrap();
    init(d.path(), &InitOptions { meta_url: meta_url(), ..Default::default() }).unwrap();
    let v = open(d.path());
    let mut model = random_bytes(2, 8 * MIB);
    let ino = mkfile(&v, ROOT_INO, "f", &model);
    v.sync().unwrap();
    let r = overwrite_4k(&v, ino, &mut model, 5, 10);
    assert!(r.patches >= 9, "{r:?}");
    v.fsync(ino, false).unwrap();
    v.simulate_crash();
    let v = open(d.path());
    assert!(read_all(&v, ino) == model, "patched content after a crash");
}

/// A small overwrite next to a large one, in one round: the large one's
/// re-chunk reads up to two chunk-maxima around it, so the small one
/// cannot be a patch (its chunk would be only in the round's batch, not in
/// the chunk index, when the re-chunk reads it). Likewise two re-chunked
/// ranges between two and three maxima apart. Each distance is one round.
#[test]
fn small_and_large_overwrites_near_each_other_flush_in_one_round() {
    const MAX: usize = 4 * MIB; // the default chunker's largest chunk
    let d = tempfile::tempdir().unwrap();
    init(d.path(), &InitOptions { meta_url: meta_url(), ..Default::default() }).unwrap();
    let v = open(d.path());
    let mut model = random_bytes(3, 40 * MIB);
    let ino = mkfile(&v, ROOT_INO, "f", &model);
    v.sync().unwrap();
    let mut seed = 10;
    let (small, large) = (4096, 2 * MIB);
    let rounds = [
        [(8 * MIB, small), (8 * MIB + MAX / 2, large)],
        [(20 * MIB, small), (20 * MIB - 3 * MAX / 2, large)],
        [(6 * MIB, large), (6 * MIB + large + 2 * MAX + 65536, large)],
    ];
    for writes in rounds {
        v.open(ino).unwrap();
        for (at, len) in writes {
            seed += 1;
            let data = random_bytes(seed, len);
            v.write(ino, at as u64, &data).unwrap();
            model[at..at + len].copy_from_slice(&data);
        }
        v.flush_file_now(ino).unwrap_or_else(|e| panic!("writes {writes:?}: {e}"));
        v.release(ino).unwrap();
        assert!(read_all(&v, ino) == model, "content after writes {writes:?}");
    }
    let rep = maintenance::fsck(&v, true, &NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
}

/// Appending a little to a stored file (reopened each time, as a log is)
/// stores the new bytes as a patch: the file's last chunk is neither read
/// back nor cut again. Enough appends are folded back by a re-chunk.
#[test]
fn small_appends_to_a_stored_file_are_patches() {
    let (d, v, ino, mut model) = stored_file(3, 8 * MIB);
    let mut folded = 0;
    for i in 0..100u64 {
        let line = random_bytes(1000 + i, 3000);
        v.open(ino).unwrap();
        v.write(ino, model.len() as u64, &line).unwrap();
        v.release(ino).unwrap();
        model.extend_from_slice(&line);
        let r = v.flush_file_now(ino).unwrap();
        if r.patches == 1 {
            assert_eq!(r.chunked_bytes, 3000, "append {i}: a patch chunks only its own bytes");
        } else {
            assert!(i >= 30, "append {i} was re-chunked ({r:?}) before its neighbourhood filled up");
            folded += 1;
        }
    }
    assert!(folded >= 1, "100 appends never folded back: fragmentation is unbounded");
    assert!(folded <= 5, "{folded} of 100 appends were re-chunked");
    assert!(read_all(&v, ino) == model, "content after the appends");
    reopen_and_check(&d, v, ino, &model);
}
