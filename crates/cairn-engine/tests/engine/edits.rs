//! Metadata-only operations: rpwrite (insert/delete/replace), range and
//! whole-file clones, tree clones and snapshots.

use crate::common::*;
use cairn_engine::maintenance::{self, NoProgress};
use cairn_engine::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    /// Replace `mbyte` at `off` (both taken modulo the size) of file `f` with new bytes.
    Replace { f: usize, off: u64, mbyte: u64, len: usize, seed: u64 },
    /// Replace `mbyte` at `off` of file `f` with a range of the other file (zero-copy).
    Splice { f: usize, off: u64, mbyte: u64, src_off: u64, len: u64 },
    /// copy_file_range from the other file onto `f`.
    CloneRange { f: usize, src_off: u64, dst_off: u64, len: u64 },
    /// Whole-file clone of the other file onto `f`.
    CloneWhole { f: usize },
    Write { f: usize, off: u64, len: usize, seed: u64 },
    Flush,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..2usize, any::<u64>(), 0u64..200_000, 0usize..150_000, any::<u64>()).prop_map(|(f, off, mbyte, len, seed)| Op::Replace { f, off, mbyte, len, seed }),
        2 => (0..2usize, any::<u64>(), 0u64..100_000, any::<u64>(), 0u64..300_000).prop_map(|(f, off, mbyte, src_off, len)| Op::Splice { f, off, mbyte, src_off, len }),
        2 => (0..2usize, any::<u64>(), any::<u64>(), 0u64..300_000).prop_map(|(f, src_off, dst_off, len)| Op::CloneRange { f, src_off, dst_off, len }),
        1 => (0..2usize).prop_map(|f| Op::CloneWhole { f }),
        2 => (0..2usize, 0u64..400_000, 1usize..100_000, any::<u64>()).prop_map(|(f, off, len, seed)| Op::Write { f, off, len, seed }),
        1 => Just(Op::Flush),
        1 => Just(Op::Reopen),
    ]
}

/// Picks an offset in `0..=len` from a random number.
fn at(x: u64, len: usize) -> u64 {
    x % (len as u64 + 1)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]
    /// Two files edited by every kind of metadata-only operation (and plain
    /// writes) agree with two byte vectors throughout, after reopening, and
    /// fsck finds every page link count and chunk reference exact.
    #[test]
    fn edits_match_a_byte_model(ops in prop::collection::vec(op(), 1..20)) {
        let d = tempfile::tempdir().unwrap();
        init_small(d.path());
        let mut v = open(d.path());
        let mut model = [random_bytes(1, 300_000), random_bytes(2, 200_000)];
        let inos = [mkfile(&v, ROOT_INO, "a", &model[0]), mkfile(&v, ROOT_INO, "b", &model[1])];
        for op in ops {
            match op {
                Op::Replace { f, off, mbyte, len, seed } => {
                    let off = at(off, model[f].len());
                    let data = random_bytes(seed, len);
                    let r = v.replace(inos[f], off, mbyte, NewBytes::Data(&data)).unwrap();
                    let end = (off + mbyte).min(model[f].len() as u64);
                    model[f].splice(off as usize..end as usize, data);
                    prop_assert_eq!(r.size, model[f].len() as u64);
                }
                Op::Splice { f, off, mbyte, src_off, len } => {
                    let o = 1 - f;
                    let off = at(off, model[f].len());
                    let src_off = at(src_off, model[o].len());
                    v.replace(inos[f], off, mbyte, NewBytes::Range { ino: inos[o], offset: src_off, len }).unwrap();
                    let s_end = (src_off + len).min(model[o].len() as u64);
                    let new = model[o][src_off as usize..s_end as usize].to_vec();
                    let end = (off + mbyte).min(model[f].len() as u64);
                    model[f].splice(off as usize..end as usize, new);
                }
                Op::CloneRange { f, src_off, dst_off, len } => {
                    let o = 1 - f;
                    let src_off = at(src_off, model[o].len());
                    let dst_off = dst_off % (model[f].len() as u64 + 100_000);
                    let n = v.clone_range(inos[o], src_off, inos[f], dst_off, len).unwrap();
                    let want = len.min(model[o].len() as u64 - src_off);
                    prop_assert_eq!(n, want);
                    let new = model[o][src_off as usize..(src_off + n) as usize].to_vec();
                    let end = (dst_off + n) as usize;
                    if model[f].len() < end { model[f].resize(end, 0); }
                    model[f][dst_off as usize..end].copy_from_slice(&new);
                }
                Op::CloneWhole { f } => {
                    let o = 1 - f;
                    v.setattr(inos[f], &SetAttr { size: Some(0), ..Default::default() }).unwrap();
                    let n = v.clone_range(inos[o], 0, inos[f], 0, u64::MAX).unwrap();
                    prop_assert_eq!(n, model[o].len() as u64);
                    model[f] = model[o].clone();
                }
                Op::Write { f, off, len, seed } => {
                    let data = random_bytes(seed, len);
                    v.write(inos[f], off, &data).unwrap();
                    let end = off as usize + len;
                    if model[f].len() < end { model[f].resize(end, 0); }
                    model[f][off as usize..end].copy_from_slice(&data);
                }
                Op::Flush => { v.flush_now().unwrap(); }
                Op::Reopen => {
                    v.close().unwrap();
                    drop(v);
                    v = open(d.path());
                }
            }
            for f in 0..2 {
                prop_assert_eq!(v.getattr(inos[f]).unwrap().size, model[f].len() as u64);
            }
        }
        for f in 0..2 {
            prop_assert!(read_all(&v, inos[f]) == model[f], "file {} differs", f);
        }
        let rep = maintenance::fsck(&v, true, &NoProgress).unwrap();
        prop_assert!(rep.errors.is_empty(), "{:?}", rep.errors);
        // Deleting one file leaves the other whole, and everything stays exact.
        v.unlink(ROOT_INO, b"a").unwrap();
        prop_assert!(read_all(&v, inos[1]) == model[1]);
        let rep = maintenance::fsck(&v, true, &NoProgress).unwrap();
        prop_assert!(rep.errors.is_empty(), "{:?}", rep.errors);
    }
}

/// Chunk boundaries of the small-chunk test volumes: at most 64 KiB.
const MAX_CHUNK: u64 = 64 << 10;

#[test]
fn insert_and_delete_in_the_middle_rechunk_only_the_edges() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let mut model = random_bytes(7, 16 << 20);
    let ino = mkfile(&v, ROOT_INO, "big", &model);
    v.flush_now().unwrap();
    let mid = 8 << 20;
    for (what, mbyte, new) in [("insert 4 KiB", 0u64, random_bytes(9, 4096)), ("delete 4 KiB", 4096, Vec::new()), ("replace 100 B by 3 B", 100, b"xyz".to_vec())] {
        let before = stored_pack_bytes(d.path());
        let r = v.replace(ino, mid, mbyte, NewBytes::Data(&new)).unwrap();
        model.splice(mid as usize..(mid + mbyte) as usize, new.iter().copied());
        // The edge chunk(s) and the new bytes; never the rest of the file.
        assert!(r.rechunked_bytes <= 3 * MAX_CHUNK + new.len() as u64, "{what}: re-chunked {} bytes", r.rechunked_bytes);
        assert!(r.chunks_written <= 8, "{what}: {} chunks", r.chunks_written);
        assert!(r.old_chunks_rechunked <= 2, "{what}: {} old chunks re-chunked", r.old_chunks_rechunked);
        let grew = stored_pack_bytes(d.path()) - before;
        assert!(grew <= 3 * MAX_CHUNK + 4096, "{what}: backend grew {grew} bytes");
        assert_eq!(r.size, model.len() as u64);
    }
    // A large delete costs the same.
    let r = v.replace(ino, 1 << 20, 8 << 20, NewBytes::Data(&[])).unwrap();
    model.drain(1 << 20..9 << 20);
    assert!(r.rechunked_bytes <= 3 * MAX_CHUNK, "8 MiB delete re-chunked {} bytes", r.rechunked_bytes);
    assert!(r.old_chunks_rechunked <= 3, "8 MiB delete re-chunked {} old chunks", r.old_chunks_rechunked);
    assert_eq!(read_all(&v, ino), model);
    v.close().unwrap();
    drop(v);
    let v = open(d.path());
    assert_eq!(read_all(&v, ino), model);
    assert!(maintenance::fsck(&v, true, &NoProgress).unwrap().errors.is_empty());
}

#[test]
fn rpwrite_errors() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let ino = mkfile(&v, ROOT_INO, "f", b"hello");
    let e = v.replace(ino, 6, 0, NewBytes::Data(b"x")).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    // At the end is an append; a range past the end is cut there.
    v.replace(ino, 5, 0, NewBytes::Data(b"!")).unwrap();
    v.replace(ino, 4, 100, NewBytes::Data(b"O")).unwrap();
    assert_eq!(read_all(&v, ino), b"hellO");
    let dir = v.mkdir(ROOT_INO, b"d", 0o755, root()).unwrap().ino;
    assert_eq!(v.replace(dir, 0, 0, NewBytes::Data(b"x")).unwrap_err().errno(), libc::EISDIR);
    v.snapshot_create("s").unwrap();
    let snap_f = v.resolve(b".snapshots/s/f").unwrap();
    assert_eq!(v.replace(snap_f, 0, 0, NewBytes::Data(b"x")).unwrap_err().errno(), libc::EROFS);
    assert_eq!(v.clone_range(ino, 0, snap_f, 0, 5).unwrap_err().errno(), libc::EROFS);
    // Overlapping ranges of one file.
    assert_eq!(v.clone_range(ino, 0, ino, 2, 3).unwrap_err().errno(), libc::EINVAL);
}

#[test]
fn whole_file_clone_shares_everything_and_copy_on_write_stores_only_changes() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let data = random_bytes(11, 8 << 20);
    let src = mkfile(&v, ROOT_INO, "src", &data);
    v.flush_now().unwrap();
    let before = stored_pack_bytes(d.path());
    let dst = v.create(ROOT_INO, b"dst", FileKind::File, 0o644, 0, root()).unwrap().ino;
    // A clone is metadata only: it reads, cuts and stores no data (its
    // speed is measured by bench/fsbench.py, section 5).
    let m0 = v.metrics_snapshot();
    assert_eq!(v.clone_range(src, 0, dst, 0, u64::MAX).unwrap(), 8 << 20);
    let m1 = v.metrics_snapshot();
    assert_eq!(stored_pack_bytes(d.path()), before, "a clone writes no data");
    assert_eq!(
        (m1.chunked_bytes, m1.new_chunks, m1.stored_bytes, m1.chunk_cache_misses),
        (m0.chunked_bytes, m0.new_chunks, m0.stored_bytes, m0.chunk_cache_misses),
        "a clone cut, stored or fetched data"
    );
    assert_eq!(v.status().dirty_files, 0, "a clone left data to flush");
    assert_eq!(read_all(&v, dst), data);
    // Writes to either side store only the chunks they change.
    let mut a = data.clone();
    v.write(dst, 4 << 20, b"changed").unwrap();
    a[4 << 20..(4 << 20) + 7].copy_from_slice(b"changed");
    v.flush_now().unwrap();
    let grew = stored_pack_bytes(d.path()) - before;
    assert!(grew <= 3 * MAX_CHUNK, "a 7-byte change stored {grew} bytes");
    assert_eq!(read_all(&v, src), data);
    assert_eq!(read_all(&v, dst), a);
    // Deleting the source frees nothing the clone uses.
    v.unlink(ROOT_INO, b"src").unwrap();
    maintenance::gc(&v, 0.5, &NoProgress).unwrap();
    assert_eq!(read_all(&v, dst), a);
    let rep = maintenance::fsck(&v, true, &NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
}

#[test]
fn cloned_tree_keeps_modes_times_symlinks_and_hard_links() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let top = v.mkdir(ROOT_INO, b"top", 0o750, root()).unwrap().ino;
    let sub = v.mkdir(top, b"sub", 0o700, root()).unwrap().ino;
    let f = mkfile(&v, sub, "f", &random_bytes(3, 300_000));
    v.setattr(f, &SetAttr { perm: Some(0o4640), uid: Some(1000), gid: Some(100), mtime: Some(SetTime::At(Timestamp(1_234_567_890_123_456_789))), ..Default::default() }).unwrap();
    v.link(f, top, b"hard").unwrap();
    v.symlink(top, b"ln", b"sub/f", root()).unwrap();
    v.setxattr(f, b"user.k", b"val", Default::default()).unwrap();
    let a = v.clone_tree(top, ROOT_INO, b"copy", CloneOptions { caller: root() }).unwrap();
    assert_eq!(a.kind, FileKind::Dir);
    assert_eq!(a.perm, 0o750);
    assert_eq!(a.nlink, 3);
    let cf = v.resolve(b"copy/sub/f").unwrap();
    let ch = v.resolve(b"copy/hard").unwrap();
    assert_eq!(cf, ch, "hard links stay hard links");
    assert_ne!(cf, f);
    let ca = v.getattr(cf).unwrap();
    let fa = v.getattr(f).unwrap();
    assert_eq!((ca.perm, ca.uid, ca.gid, ca.mtime, ca.nlink, ca.size), (fa.perm, fa.uid, fa.gid, fa.mtime, 2, fa.size));
    assert_eq!(v.readlink(v.resolve(b"copy/ln").unwrap()).unwrap(), b"sub/f");
    assert_eq!(v.getxattr(cf, b"user.k").unwrap(), b"val");
    assert_eq!(read_all(&v, cf), read_all(&v, f));
    assert_eq!(v.clone_tree(top, ROOT_INO, b"copy", CloneOptions { caller: root() }).unwrap_err().errno(), libc::EEXIST);
    assert_eq!(v.clone_tree(top, sub, b"loop", CloneOptions { caller: root() }).unwrap_err().errno(), libc::EINVAL);
    let rep = maintenance::fsck(&v, true, &NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
}

#[test]
fn snapshots_keep_their_content_and_are_read_only() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let data = random_bytes(5, 2 << 20);
    let dir = v.mkdir(ROOT_INO, b"d", 0o755, root()).unwrap().ino;
    let f = mkfile(&v, dir, "f", &data);
    let g = mkfile(&v, ROOT_INO, "g", b"gone soon");
    // Unflushed writes at snapshot time are part of it.
    v.open(f).unwrap();
    v.write(f, 0, b"HEAD").unwrap();
    let mut snap_data = data.clone();
    snap_data[..4].copy_from_slice(b"HEAD");
    let info = v.snapshot_create("one").unwrap();
    v.release(f).unwrap();
    assert_eq!(v.snapshot_list().unwrap(), vec![info.clone()]);
    let sf = v.resolve(b".snapshots/one/d/f").unwrap();
    let sg = v.resolve(b".snapshots/one/g").unwrap();
    assert!(v.resolve(b".snapshots/one/.snapshots").is_err(), "snapshots do not nest");
    // The live tree changes, loses files, and gc runs.
    v.replace(f, 100, 1 << 20, NewBytes::Data(b"new")).unwrap();
    v.write(f, 0, &random_bytes(6, 500_000)).unwrap();
    v.unlink(ROOT_INO, b"g").unwrap();
    v.flush_now().unwrap();
    maintenance::gc(&v, 0.5, &NoProgress).unwrap();
    assert_eq!(read_all(&v, sf), snap_data);
    assert_eq!(read_all(&v, sg), b"gone soon");
    let _ = g;
    // Read-only, whatever the call.
    let erofs = |r: Result<()>| assert_eq!(r.unwrap_err().errno(), libc::EROFS);
    erofs(v.write(sf, 0, b"x").map(|_| ()));
    erofs(v.setattr(sf, &SetAttr { perm: Some(0o600), ..Default::default() }).map(|_| ()));
    erofs(v.setattr(sf, &SetAttr { size: Some(0), ..Default::default() }).map(|_| ()));
    let sd = v.resolve(b".snapshots/one/d").unwrap();
    erofs(v.unlink(sd, b"f"));
    erofs(v.create(sd, b"new", FileKind::File, 0o644, 0, root()).map(|_| ()));
    erofs(v.rename(sd, b"f", ROOT_INO, b"stolen", Default::default()));
    erofs(v.setxattr(sf, b"user.x", b"y", Default::default()));
    let snaps = v.resolve(b".snapshots").unwrap();
    erofs(v.rmdir(ROOT_INO, b".snapshots"));
    erofs(v.mkdir(snaps, b"fake", 0o755, root()).map(|_| ()));
    assert_eq!(v.snapshot_create("one").unwrap_err().errno(), libc::EEXIST);
    // Survives a reopen; deleting it frees its chunks for gc.
    v.close().unwrap();
    drop(v);
    let v = open(d.path());
    assert_eq!(read_all(&v, sf), snap_data);
    let rep = maintenance::fsck(&v, true, &NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
    let before = stored_pack_bytes(d.path());
    v.snapshot_delete("one").unwrap();
    assert!(v.snapshot_list().unwrap().is_empty());
    maintenance::gc(&v, 0.9, &NoProgress).unwrap();
    assert!(stored_pack_bytes(d.path()) < before, "deleting the snapshot freed nothing");
    let rep = maintenance::fsck(&v, true, &NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
    let _ = snaps;
}

#[test]
fn an_insert_from_a_source_still_in_the_journal_is_chunked_once_with_its_junctions() {
    // libcairn's rpwrite of a large insert writes the new bytes to a scratch
    // file and inserts from it at once: they are still in the journal. They
    // are chunked in the same pass as the two junctions, so only the old
    // chunks at the insertion point are read back, never the scratch's own.
    // Small chunks, and the default ones (4 MiB at most), where the new
    // bytes and the junction after them span two re-chunk windows.
    for (chunker, size) in [(small_chunks(), 16 << 20), (ChunkerParams::default(), 40 << 20)] {
        journaled_insert(chunker, size);
    }
}

fn journaled_insert(chunker: ChunkerParams, size: usize) {
    let d = tempfile::tempdir().unwrap();
    init(d.path(), &InitOptions { chunker, meta_url: meta_url(), ..Default::default() }).unwrap();
    let v = open(d.path());
    let mut model = random_bytes(23, size);
    let ino = mkfile(&v, ROOT_INO, "big", &model);
    v.flush_now().unwrap();
    for (i, at) in [(24u64, 5u64 << 20), (25, 11 << 20), (26, 0)] {
        let new = random_bytes(i, 8 << 20);
        // Kept open, as libcairn keeps it, so that no flush round takes it
        // early (a closed file is due at once).
        let scratch = v.create(ROOT_INO, b"scratch", FileKind::File, 0o600, 0, root()).unwrap().ino;
        v.open(scratch).unwrap();
        v.write(scratch, 0, &new).unwrap();
        let r = v.replace(ino, at, 0, NewBytes::Range { ino: scratch, offset: 0, len: u64::MAX }).unwrap();
        v.release(scratch).unwrap();
        model.splice(at as usize..at as usize, new.iter().copied());
        // The chunk cut by the insert (counted once), and the one after it
        // when the cut at its end falls within the minimum size of a new cut.
        assert!(r.old_chunks_rechunked <= 2, "{chunker:?}, insert at {at}: {} old chunks re-chunked", r.old_chunks_rechunked);
        assert!(r.rechunked_bytes >= 8 << 20, "the new bytes were not chunked by the edit ({} bytes)", r.rechunked_bytes);
        assert_eq!(read_all(&v, ino), model);
        v.unlink(ROOT_INO, b"scratch").unwrap();
    }
    v.flush_now().unwrap();
    assert_eq!(read_all(&v, ino), model);
    assert!(maintenance::fsck(&v, true, &NoProgress).unwrap().errors.is_empty());
    v.close().unwrap();
    drop(v);
    let v = open(d.path());
    assert_eq!(read_all(&v, ino), model);
}

#[test]
fn a_large_zero_copy_insert_rechunks_only_its_two_junctions() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let mut model = random_bytes(21, 16 << 20);
    let ino = mkfile(&v, ROOT_INO, "big", &model);
    let new = random_bytes(22, 8 << 20);
    let scratch = mkfile(&v, ROOT_INO, "scratch", &new);
    v.flush_now().unwrap();
    let before = stored_pack_bytes(d.path());
    let r = v.replace(ino, 5 << 20, 0, NewBytes::Range { ino: scratch, offset: 0, len: u64::MAX }).unwrap();
    model.splice(5 << 20..5 << 20, new.iter().copied());
    // Two junctions: the chunks around each, never the 8 MiB between them.
    assert!(r.rechunked_bytes <= 6 * MAX_CHUNK, "re-chunked {} bytes", r.rechunked_bytes);
    assert!(r.old_chunks_rechunked <= 6, "{} old chunks re-chunked", r.old_chunks_rechunked);
    let grew = stored_pack_bytes(d.path()) - before;
    assert!(grew <= 6 * MAX_CHUNK, "the zero-copy insert stored {grew} bytes");
    assert_eq!(read_all(&v, ino), model);
    v.unlink(ROOT_INO, b"scratch").unwrap();
    assert_eq!(read_all(&v, ino), model);
    assert!(maintenance::fsck(&v, true, &NoProgress).unwrap().errors.is_empty());
}
