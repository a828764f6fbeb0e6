//! Behaviour of the engine: persistence, dedup, sparse files, crash
//! recovery, corruption, namespace rules, gc.

use crate::common::*;
use cairn_engine::maintenance::{self, NoProgress};
use cairn_engine::*;

#[test]
fn content_survives_reopen_byte_for_byte() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let small = b"hello, cairn".to_vec();
    let big = random_bytes(1, 3 << 20);
    let (a, b) = {
        let v = open(d.path());
        let a = mkfile(&v, ROOT_INO, "small", &small);
        let dir = v.mkdir(ROOT_INO, b"sub", 0o755, root()).unwrap();
        let b = mkfile(&v, dir.ino, "big", &big);
        v.close().unwrap();
        (a, b)
    };
    let v = open(d.path());
    assert_eq!(read_all(&v, a), small);
    assert_eq!(read_all(&v, b), big);
    let sub = v.lookup(ROOT_INO, b"sub").unwrap();
    assert_eq!(v.lookup(sub.ino, b"big").unwrap().size, big.len() as u64);
    let rep = maintenance::fsck(&v, true, &NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
}

#[test]
fn same_data_twice_is_stored_once() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let data = random_bytes(7, 16 << 20);
    mkfile(&v, ROOT_INO, "one", &data);
    v.sync().unwrap();
    let before = stored_pack_bytes(d.path());
    mkfile(&v, ROOT_INO, "two", &data);
    v.sync().unwrap();
    let after = stored_pack_bytes(d.path());
    assert!(before >= 16 << 20, "first copy stored {before} bytes");
    assert!((after - before) as f64 <= 0.02 * before as f64, "second copy grew storage from {before} to {after}");
    let s = maintenance::stats(&v).unwrap();
    assert!(s.dedup_ratio > 1.95, "{s:?}");
}

#[test]
fn small_overwrite_rechunks_only_nearby_chunks() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let mut data = random_bytes(3, 8 << 20);
    let ino = mkfile(&v, ROOT_INO, "f", &data);
    v.flush_now().unwrap();
    v.open(ino).unwrap();
    v.write(ino, 4 << 20, b"XYZ").unwrap();
    data[(4 << 20)..(4 << 20) + 3].copy_from_slice(b"XYZ");
    let r = v.flush_now().unwrap();
    // Left neighbour, the changed chunk, and at most a couple to resync.
    assert!(r.chunked_bytes <= 4 * (64 << 10), "re-chunked {} bytes", r.chunked_bytes);
    assert!(r.new_chunk_bytes <= 3 * (64 << 10), "stored {} new bytes", r.new_chunk_bytes);
    v.release(ino).unwrap();
    assert_eq!(read_all(&v, ino), data);
}

#[test]
fn insert_by_rewriting_the_tail_uploads_only_changed_chunks() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let data = random_bytes(5, 4 << 20);
    let ino = mkfile(&v, ROOT_INO, "f", &data);
    v.flush_now().unwrap();
    // A legacy program inserts one byte at 1 MiB by rewriting the tail.
    let mut new = data[..1 << 20].to_vec();
    new.push(b'!');
    new.extend_from_slice(&data[1 << 20..]);
    v.open(ino).unwrap();
    for (i, piece) in new[1 << 20..].chunks(128 << 10).enumerate() {
        v.write(ino, (1 << 20) + (i as u64) * (128 << 10), piece).unwrap();
    }
    let r = v.flush_now().unwrap();
    assert!(r.new_chunk_bytes <= 3 * (64 << 10), "stored {} new bytes for a 1-byte insert", r.new_chunk_bytes);
    v.release(ino).unwrap();
    assert_eq!(read_all(&v, ino), new);
}

#[test]
fn sparse_file_holes_take_no_space() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let a = v.create(ROOT_INO, b"sparse", FileKind::File, 0o644, 0, root()).unwrap();
    v.open(a.ino).unwrap();
    v.setattr(a.ino, &SetAttr { size: Some(5 << 30), ..Default::default() }).unwrap();
    v.write(a.ino, (5 << 30) - 5, b"tail!").unwrap();
    v.write(a.ino, 1 << 30, b"middle").unwrap();
    v.release(a.ino).unwrap();
    v.sync().unwrap();
    let attr = v.getattr(a.ino).unwrap();
    assert_eq!(attr.size, 5 << 30);
    assert!(attr.blocks * 512 < 1 << 20, "{} blocks allocated", attr.blocks);
    assert!(stored_pack_bytes(d.path()) < 1 << 20);
    assert_eq!(v.read(a.ino, (5 << 30) - 5, 10).unwrap(), b"tail!");
    assert_eq!(v.read(a.ino, 1 << 30, 6).unwrap(), b"middle");
    assert_eq!(v.read(a.ino, 2 << 30, 4).unwrap(), vec![0u8; 4]);
    assert_eq!(v.lseek(a.ino, 0, libc::SEEK_DATA).unwrap(), 1 << 30);
    assert_eq!(v.lseek(a.ino, 1 << 30, libc::SEEK_HOLE).unwrap(), (1 << 30) + 6);
}

/// The largest file is the kernel's for FUSE, 2^63 - 1 bytes (a smaller
/// one would turn writes the kernel already took into its page cache into
/// errors at write-back, which no one sees): its last byte is written,
/// survives a crash, and costs one page over the hole; a byte further is
/// EFBIG for every call; sizes that large add up in `stats` without
/// overflowing.
#[test]
fn the_largest_file_is_the_kernels() {
    const MAX: u64 = i64::MAX as u64;
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let ino = {
        let v = open(d.path());
        let a = v.create(ROOT_INO, b"edge", FileKind::File, 0o644, 0, root()).unwrap();
        v.open(a.ino).unwrap();
        v.write(a.ino, 0, b"head").unwrap();
        assert_eq!(v.write(a.ino, MAX - 1, b"z").unwrap(), 1, "a write of the last byte");
        for off in [MAX - 1, MAX, u64::MAX - 1] {
            let e = v.write(a.ino, off, b"zz").unwrap_err();
            assert_eq!(e.errno(), libc::EFBIG, "a write at {off}: {e}");
        }
        let e = v.setattr(a.ino, &SetAttr { size: Some(MAX + 1), ..Default::default() }).unwrap_err();
        assert_eq!(e.errno(), libc::EFBIG, "{e}");
        for (off, len, mode) in [(MAX - 10, 100, 0), (u64::MAX - 1, 10, 0), (MAX - 10, 100, libc::FALLOC_FL_ZERO_RANGE)] {
            let e = v.fallocate(a.ino, off, len, mode).unwrap_err();
            assert_eq!(e.errno(), libc::EFBIG, "fallocate({off}, {len}, {mode}): {e}");
        }
        assert_eq!(v.getattr(a.ino).unwrap().size, MAX);
        v.fsync(a.ino, false).unwrap();
        v.simulate_crash();
        a.ino
    };
    let check = |v: &Volume| {
        let attr = v.getattr(ino).unwrap();
        assert_eq!(attr.size, MAX);
        assert!(attr.blocks * 512 < 1 << 20, "{} blocks for a sparse file", attr.blocks);
        assert_eq!(v.read(ino, 0, 4).unwrap(), b"head");
        assert_eq!(v.read(ino, MAX - 1, 100).unwrap(), b"z");
        assert!(v.read(ino, MAX, 100).unwrap().is_empty());
        let tail = v.read(ino, MAX - 4096, 4096).unwrap();
        assert_eq!((tail.len(), tail[4095]), (4096, b'z'));
        assert!(tail[..4095].iter().all(|b| *b == 0));
        assert_eq!(v.lseek(ino, 4, libc::SEEK_DATA).unwrap(), MAX - 1);
    };
    let v = open(d.path());
    check(&v);
    for name in ["b", "c"] {
        let a = v.create(ROOT_INO, name.as_bytes(), FileKind::File, 0o644, 0, root()).unwrap();
        v.setattr(a.ino, &SetAttr { size: Some(MAX), ..Default::default() }).unwrap();
    }
    v.flush_now().unwrap();
    assert!(stored_pack_bytes(d.path()) < 1 << 20);
    let s = maintenance::stats(&v).unwrap();
    assert_eq!((s.files, s.logical_bytes), (3, u64::MAX), "three files of 2^63 - 1 bytes");
    let rep = maintenance::fsck(&v, true, &NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
    v.close().unwrap();
    drop(v);
    // From packs and extent pages now, not the journal.
    check(&open(d.path()));
    // A stored page may describe the largest file, and not a byte more.
    use cairn_engine::extent::{decode_page, encode_page, Extent, Page};
    let page = |ex: Vec<Extent>| encode_page(&Page::new(0, ex)).unwrap();
    assert_eq!(decode_page(0, &page(vec![Extent::hole(MAX - 1), Extent::hole(1)])).unwrap().len, MAX);
    assert!(decode_page(0, &page(vec![Extent::hole(MAX), Extent::hole(1)])).is_err());
}

/// A hole longer than a journal record's 32-bit length (4 GiB and more)
/// stays punched after a crash: the data under it never comes back.
#[test]
fn a_hole_longer_than_4_gib_stays_punched_after_a_crash() {
    const GIB: u64 = 1 << 30;
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let opts = || OpenOptions { flush_age: std::time::Duration::from_secs(3600), flush_bytes: u64::MAX, ..opts() };
    let ino = {
        let v = Volume::load(d.path(), opts()).unwrap();
        let a = v.create(ROOT_INO, b"f", FileKind::File, 0o644, 0, root()).unwrap();
        v.open(a.ino).unwrap();
        v.write(a.ino, 6 * GIB, b"tail").unwrap();
        v.write(a.ino, 4 * GIB + 5, b"committed").unwrap();
        v.flush_now().unwrap();
        v.write(a.ino, GIB, b"journaled").unwrap();
        v.fallocate(a.ino, 0, 5 * GIB, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE).unwrap();
        assert_eq!(v.read(a.ino, 4 * GIB + 5, 9).unwrap(), vec![0; 9]);
        v.simulate_crash();
        a.ino
    };
    let v = Volume::load(d.path(), opts()).unwrap();
    assert_eq!(v.getattr(ino).unwrap().size, 6 * GIB + 4);
    assert_eq!(v.read(ino, 4 * GIB + 5, 9).unwrap(), vec![0; 9], "committed data under the hole");
    assert_eq!(v.read(ino, GIB, 9).unwrap(), vec![0; 9], "journaled data under the hole");
    assert_eq!(v.read(ino, 6 * GIB, 4).unwrap(), b"tail");
    let rep = maintenance::fsck(&v, true, &NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
}

#[test]
fn fsynced_writes_survive_a_crash() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let data = random_bytes(11, 2 << 20);
    let ino = {
        let v = open(d.path());
        let a = v.create(ROOT_INO, b"f", FileKind::File, 0o644, 0, root()).unwrap();
        v.open(a.ino).unwrap();
        v.write(a.ino, 0, &data).unwrap();
        v.setattr(a.ino, &SetAttr { size: Some(1 << 20), ..Default::default() }).unwrap();
        v.write(a.ino, 1 << 20, &data[1 << 20..]).unwrap();
        v.fsync(a.ino, false).unwrap();
        v.simulate_crash();
        a.ino
    };
    let v = open(d.path());
    assert_eq!(read_all(&v, ino), data);
    let rep = maintenance::fsck(&v, true, &NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
}

#[test]
fn a_flipped_byte_gives_an_error_naming_the_pack_and_spares_other_files() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let (victim, other) = {
        let v = open(d.path());
        let victim = mkfile(&v, ROOT_INO, "victim", &random_bytes(1, 200 << 10));
        v.sync().unwrap();
        let other = mkfile(&v, ROOT_INO, "other", &random_bytes(2, 200 << 10));
        v.close().unwrap();
        (victim, other)
    };
    // The first pack holds only the victim's chunks.
    let mut packs: Vec<_> = walkdir(&d.path().join("store/packs"));
    packs.sort_by_key(|p| std::fs::metadata(p).unwrap().modified().unwrap());
    let p = &packs[0];
    let mut bytes = std::fs::read(p).unwrap();
    bytes[100] ^= 0x01;
    std::fs::write(p, bytes).unwrap();
    let name = p.file_name().unwrap().to_str().unwrap().to_string();
    let v = open(d.path());
    let err = v.read(victim, 0, 1 << 20).unwrap_err();
    assert_eq!(err.errno(), libc::EIO);
    assert!(err.message().contains(&name), "{err}");
    assert_eq!(read_all(&v, other), random_bytes(2, 200 << 10));
    let rep = maintenance::fsck(&v, true, &NoProgress).unwrap();
    assert!(rep.errors.iter().any(|e| e.contains(&name)), "{:?}", rep.errors);
}

fn walkdir(p: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(p).unwrap().flatten() {
        if e.file_type().unwrap().is_dir() {
            out.extend(walkdir(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

#[test]
fn truncated_pack_is_reported() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let ino = {
        let v = open(d.path());
        let i = mkfile(&v, ROOT_INO, "f", &random_bytes(9, 100 << 10));
        v.close().unwrap();
        i
    };
    let p = &walkdir(&d.path().join("store/packs"))[0];
    let len = std::fs::metadata(p).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(p).unwrap().set_len(len.min(40)).unwrap();
    let v = open(d.path());
    assert_eq!(v.read(ino, 0, 4096).unwrap_err().errno(), libc::EIO);
    let rep = maintenance::fsck(&v, false, &NoProgress).unwrap();
    assert!(rep.errors.iter().any(|e| e.contains("truncated")), "{:?}", rep.errors);
}

#[test]
fn unlinked_open_file_stays_readable_until_released() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let data = random_bytes(4, 300 << 10);
    let ino = mkfile(&v, ROOT_INO, "f", &data);
    v.sync().unwrap();
    v.open(ino).unwrap();
    v.unlink(ROOT_INO, b"f").unwrap();
    assert_eq!(v.lookup(ROOT_INO, b"f").unwrap_err().errno(), libc::ENOENT);
    assert_eq!(read_all(&v, ino), data);
    v.release(ino).unwrap();
    assert_eq!(v.getattr(ino).unwrap_err().errno(), libc::ENOENT);
    let s = maintenance::stats(&v).unwrap();
    assert_eq!(s.chunks, 0, "{s:?}");
}

#[test]
fn delete_everything_and_gc_returns_backend_to_near_zero() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    for i in 0..20 {
        mkfile(&v, ROOT_INO, &format!("f{i}"), &random_bytes(i, 100 << 10));
    }
    // A file that keeps a little live data in a mostly-dead pack.
    mkfile(&v, ROOT_INO, "keep", b"some bytes to keep");
    v.sync().unwrap();
    assert!(stored_pack_bytes(d.path()) > 3 << 19);
    for i in 0..20 {
        v.unlink(ROOT_INO, format!("f{i}").as_bytes()).unwrap();
    }
    let rep = maintenance::gc(&v, 0.5, &NoProgress).unwrap();
    assert!(rep.packs_deleted > 0);
    assert!(stored_pack_bytes(d.path()) < 64 << 10, "{} bytes left", stored_pack_bytes(d.path()));
    let keep = v.lookup(ROOT_INO, b"keep").unwrap();
    assert_eq!(read_all(&v, keep.ino), b"some bytes to keep");
    let f = maintenance::fsck(&v, true, &NoProgress).unwrap();
    assert!(f.errors.is_empty() && f.warnings.is_empty(), "{f:?}");
}

#[test]
fn rename_rules() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let a = mkfile(&v, ROOT_INO, "a", b"A");
    let b = mkfile(&v, ROOT_INO, "b", b"B");
    let dir = v.mkdir(ROOT_INO, b"d", 0o755, root()).unwrap();
    let sub = v.mkdir(dir.ino, b"sub", 0o755, root()).unwrap();
    let no = RenameFlags { noreplace: true, ..Default::default() };
    assert_eq!(v.rename(ROOT_INO, b"a", ROOT_INO, b"b", no).unwrap_err().errno(), libc::EEXIST);
    let ex = RenameFlags { exchange: true, ..Default::default() };
    v.rename(ROOT_INO, b"a", ROOT_INO, b"b", ex).unwrap();
    assert_eq!(v.lookup(ROOT_INO, b"a").unwrap().ino, b);
    assert_eq!(v.lookup(ROOT_INO, b"b").unwrap().ino, a);
    assert_eq!(v.rename(ROOT_INO, b"d", sub.ino, b"x", Default::default()).unwrap_err().errno(), libc::EINVAL);
    assert_eq!(v.rename(ROOT_INO, b"a", ROOT_INO, b"d", Default::default()).unwrap_err().errno(), libc::EISDIR);
    assert_eq!(v.rename(ROOT_INO, b"d", ROOT_INO, b"a", Default::default()).unwrap_err().errno(), libc::ENOTDIR);
    // Plain rename over a file frees the old one.
    v.rename(ROOT_INO, b"a", ROOT_INO, b"b", Default::default()).unwrap();
    assert_eq!(v.getattr(a).unwrap_err().errno(), libc::ENOENT);
    // Moving a directory fixes link counts.
    v.rename(dir.ino, b"sub", ROOT_INO, b"sub2", Default::default()).unwrap();
    assert_eq!(v.getattr(dir.ino).unwrap().nlink, 2);
    assert_eq!(v.getattr(ROOT_INO).unwrap().nlink, 4);
    assert_eq!(v.parent_of(sub.ino).unwrap(), ROOT_INO);
    v.rmdir(ROOT_INO, b"d").unwrap();
    assert_eq!(v.rmdir(ROOT_INO, b"sub2").map_err(|e| e.errno()), Ok(()));
    let rep = maintenance::fsck(&v, false, &NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
}

#[test]
fn hard_links_and_xattrs() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let a = mkfile(&v, ROOT_INO, "a", b"data");
    v.link(a, ROOT_INO, b"a2").unwrap();
    assert_eq!(v.getattr(a).unwrap().nlink, 2);
    v.unlink(ROOT_INO, b"a").unwrap();
    assert_eq!(read_all(&v, v.lookup(ROOT_INO, b"a2").unwrap().ino), b"data");
    v.setxattr(a, b"user.k", b"v", XattrFlags::default()).unwrap();
    assert_eq!(v.setxattr(a, b"user.k", b"w", XattrFlags { create: true, ..Default::default() }).unwrap_err().errno(), libc::EEXIST);
    assert_eq!(v.setxattr(a, b"user.z", b"w", XattrFlags { replace: true, ..Default::default() }).unwrap_err().errno(), libc::ENODATA);
    assert_eq!(v.getxattr(a, b"user.k").unwrap(), b"v");
    assert_eq!(v.listxattr(a).unwrap(), vec![b"user.k".to_vec()]);
    v.removexattr(a, b"user.k").unwrap();
    assert_eq!(v.getxattr(a, b"user.k").unwrap_err().errno(), libc::ENODATA);
    assert_eq!(v.mkdir(ROOT_INO, &[b'x'; 256], 0o755, root()).unwrap_err().errno(), libc::ENAMETOOLONG);
    assert_eq!(v.create(ROOT_INO, b"a2", FileKind::File, 0o644, 0, root()).unwrap_err().errno(), libc::EEXIST);
}

#[test]
fn encrypted_volume_needs_the_right_passphrase() {
    let d = tempfile::tempdir().unwrap();
    let pass = zeroize::Zeroizing::new(b"correct horse".to_vec());
    init(d.path(), &InitOptions { passphrase: Some(pass.clone()), kdf: Some(KdfParams { m_kib: 1024, t: 1, p: 1 }), chunker: small_chunks(), meta_url: meta_url(), ..Default::default() }).unwrap();
    {
        let v = Volume::load(d.path(), OpenOptions { passphrase: Some(pass.clone()), ..opts() }).unwrap();
        mkfile(&v, ROOT_INO, "secret", b"attack at dawn");
        v.close().unwrap();
    }
    // Plaintext appears nowhere in the store.
    for p in walkdir(&d.path().join("store/packs")) {
        let b = std::fs::read(p).unwrap();
        assert!(!b.windows(6).any(|w| w == b"attack"));
    }
    let e = Volume::load(d.path(), OpenOptions { passphrase: Some(zeroize::Zeroizing::new(b"wrong".to_vec())), ..opts() }).err().unwrap();
    assert!(e.message().contains("wrong passphrase"), "{e}");
    let e = Volume::load(d.path(), opts()).err().unwrap();
    assert!(e.message().contains("passphrase"), "{e}");
    let v = Volume::load(d.path(), OpenOptions { passphrase: Some(pass), ..opts() }).unwrap();
    let ino = v.lookup(ROOT_INO, b"secret").unwrap().ino;
    assert_eq!(read_all(&v, ino), b"attack at dawn");
}

#[test]
fn second_open_is_refused_while_in_use() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let e = Volume::load(d.path(), opts()).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Busy);
    // Even a read-only look is refused at once (the mount answers those).
    let e = Volume::load(d.path(), OpenOptions { read_only: true, ..opts() }).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Busy);
    v.close().unwrap();
    drop(v);
    // Read-only looks share; a writer waits for them.
    let ro = Volume::load(d.path(), OpenOptions { read_only: true, ..opts() }).unwrap();
    let ro2 = Volume::load(d.path(), OpenOptions { read_only: true, ..opts() }).unwrap();
    assert!(maintenance::stats(&ro).is_ok() && maintenance::stats(&ro2).is_ok());
    assert_eq!(Volume::load(d.path(), opts()).err().unwrap().kind(), ErrorKind::Busy);
}

#[test]
fn streaming_writer_with_many_background_flushes_leaves_no_dead_chunks() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = Volume::load(d.path(), OpenOptions { flush_bytes: 256 << 10, ..opts() }).unwrap();
    let data = random_bytes(21, 6 << 20);
    let a = v.create(ROOT_INO, b"stream", FileKind::File, 0o644, 0, root()).unwrap();
    v.open(a.ino).unwrap();
    for (i, piece) in data.chunks(128 << 10).enumerate() {
        v.write(a.ino, (i as u64) * (128 << 10), piece).unwrap();
        // Size-triggered rounds (the flusher thread may run some itself).
        v.flush_due().unwrap();
    }
    // Most of the file is committed while it is still open for writing...
    let committed = maintenance::stats(&v).unwrap().data_bytes;
    assert!(committed >= 5 << 20, "only {committed} bytes committed while writing");
    assert_eq!(read_all(&v, a.ino), data);
    v.release(a.ino).unwrap();
    v.flush_now().unwrap();
    let s = maintenance::stats(&v).unwrap();
    assert_eq!(s.dead_chunks, 0, "{s:?}");
    assert_eq!(read_all(&v, a.ino), data);
    let rep = maintenance::fsck(&v, true, &NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
}

/// The writeback cache may send a file's pages out of order: flushes that
/// run while a stretch is still missing hold back everything from the gap
/// on (a chunk cut at the gap would die once the gap is filled), the file
/// reads back exactly meanwhile, and a crash with the gap open replays
/// what was held.
#[test]
fn flushes_during_out_of_order_writes_hold_back_from_the_gap() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let data = random_bytes(22, 6 << 20);
    let piece = 128usize << 10;
    // Pieces 10..16 arrive last, as a late write-back would send them.
    let order: Vec<usize> = (0..10).chain(16..48).chain(10..16).collect();
    let mut with_gap = data.clone();
    with_gap[10 * piece..16 * piece].fill(0);
    let v = Volume::load(d.path(), OpenOptions { flush_bytes: 256 << 10, ..opts() }).unwrap();
    let write_until = |name: &[u8], n: usize| {
        let a = v.create(ROOT_INO, name, FileKind::File, 0o644, 0, root()).unwrap();
        v.open(a.ino).unwrap();
        for &i in &order[..n] {
            v.write(a.ino, (i * piece) as u64, &data[i * piece..(i + 1) * piece]).unwrap();
            v.flush_due().unwrap();
        }
        a.ino
    };
    let whole = write_until(b"late", 42);
    // The gap is still open: nothing past it is committed yet.
    let committed = maintenance::stats(&v).unwrap().data_bytes;
    assert!(committed <= (10 * piece) as u64, "{committed} bytes committed with a gap at {}", 10 * piece);
    assert!(read_all(&v, whole) == with_gap, "content with the gap open");
    for &i in &order[42..] {
        v.write(whole, (i * piece) as u64, &data[i * piece..(i + 1) * piece]).unwrap();
        v.flush_due().unwrap();
    }
    assert!(read_all(&v, whole) == data);
    v.release(whole).unwrap();
    v.flush_now().unwrap();
    let s = maintenance::stats(&v).unwrap();
    assert_eq!(s.dead_chunks, 0, "{s:?}");
    assert!(read_all(&v, whole) == data);
    // A crash while the gap is open (the held records were fsynced).
    let cut = write_until(b"cut", 42);
    v.fsync(cut, false).unwrap();
    v.simulate_crash();
    let v = open(d.path());
    assert!(read_all(&v, cut) == with_gap, "content after the crash");
    assert!(read_all(&v, whole) == data);
    let rep = maintenance::fsck(&v, true, &NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "{:?}", rep.errors);
}

/// In-process metadata rate, without FUSE: `cargo test --release -- --ignored --nocapture create_rate`.
#[test]
#[ignore]
fn create_rate() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let dir = v.mkdir(ROOT_INO, b"many", 0o755, root()).unwrap().ino;
    let n = 20_000;
    let t = std::time::Instant::now();
    for i in 0..n {
        let name = format!("f{i}");
        assert!(v.lookup(dir, name.as_bytes()).is_err());
        let a = v.create(dir, name.as_bytes(), FileKind::File, 0o644, 0, root()).unwrap();
        v.open(a.ino).unwrap();
        v.release(a.ino).unwrap();
    }
    let c = t.elapsed().as_secs_f64();
    let t = std::time::Instant::now();
    for i in 0..n {
        v.unlink(dir, format!("f{i}").as_bytes()).unwrap();
    }
    let u = t.elapsed().as_secs_f64();
    eprintln!("engine: create {:.0}/s unlink {:.0}/s", n as f64 / c, n as f64 / u);
}

/// A program that rewrites an open file from the end backwards keeps its
/// first write (the file's last chunk) in the held-back tail of every
/// background flush. That must not pin the journal until writers block.
#[test]
fn writing_an_open_file_backwards_never_blocks_on_the_journal() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = Volume::load(
        d.path(),
        OpenOptions { flush_bytes: 1 << 20, journal_limit: 8 << 20, flush_age: std::time::Duration::from_secs(3600), ..opts() },
    )
    .unwrap();
    let ino = v.create(ROOT_INO, b"f", FileKind::File, 0o644, 0, root()).unwrap().ino;
    v.open(ino).unwrap();
    let total = 40usize << 20; // five times the journal limit
    let block = 256usize << 10;
    let data = random_bytes(77, total);
    let (tx, rx) = std::sync::mpsc::channel();
    let v2 = v.clone();
    let data2 = data.clone();
    std::thread::spawn(move || {
        let mut pos = total;
        while pos > 0 {
            pos -= block;
            v2.write(ino, pos as u64, &data2[pos..pos + block]).unwrap();
        }
        tx.send(()).unwrap();
    });
    rx.recv_timeout(std::time::Duration::from_secs(120)).expect("the writer blocked on a full journal");
    v.release(ino).unwrap();
    v.flush_now().unwrap();
    assert!(read_all(&v, ino) == data);
}

/// Inode numbers are never handed out twice: not after the newest file is
/// deleted and the volume reopened, not after a crash, not after a failed
/// create rolled back the transaction that reserved numbers.
#[test]
fn inode_numbers_are_never_reused() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let a = v.create(ROOT_INO, b"a", FileKind::File, 0o644, 0, root()).unwrap().ino;
    let b = v.create(ROOT_INO, b"b", FileKind::File, 0o644, 0, root()).unwrap().ino;
    assert!(b > a);
    v.unlink(ROOT_INO, b"b").unwrap();
    v.close().unwrap();
    drop(v);
    let v = open(d.path());
    let c = v.create(ROOT_INO, b"c", FileKind::File, 0o644, 0, root()).unwrap().ino;
    assert!(c > b, "inode {c} handed out again after the newest ({b}) was deleted and the volume reopened");
    // The newest deleted again, then a crash (no clean close).
    v.unlink(ROOT_INO, b"c").unwrap();
    v.sync().unwrap();
    v.simulate_crash();
    let v = open(d.path());
    let e = v.create(ROOT_INO, b"e", FileKind::File, 0o644, 0, root()).unwrap().ino;
    assert!(e > c, "inode {e} reused after a crash (newest was {c})");
    // A create that fails (the name exists) rolls its transaction back; the
    // numbers after it are still above everything handed out.
    assert!(v.create(ROOT_INO, b"e", FileKind::File, 0o644, 0, root()).is_err());
    let f = v.create(ROOT_INO, b"f", FileKind::File, 0o644, 0, root()).unwrap().ino;
    assert!(f > e);
    v.unlink(ROOT_INO, b"f").unwrap();
    v.sync().unwrap();
    v.simulate_crash();
    let v = open(d.path());
    let g = v.create(ROOT_INO, b"g", FileKind::File, 0o644, 0, root()).unwrap().ino;
    assert!(g > f, "inode {g} reused (newest was {f})");
}
