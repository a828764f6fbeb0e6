//! `cairn info`, `cairn warmup` and `cairn stats` of a tree, in process:
//! the numbers they report against what was written.

use crate::cloud::{init_in, opts};
use crate::common::*;
use cairn_backend::Backend;
use cairn_engine::cache::disk::Durability;
use cairn_engine::cloud;
use cairn_engine::*;
use cairn_testing::MemoryBackend;
use std::sync::Arc;

fn places(i: &FileInfo) -> Vec<Place> {
    let mut p: Vec<Place> = i.runs.iter().map(|r| r.place).collect();
    p.dedup();
    p
}

/// Two files with the same bytes share every chunk (refs 2); a third is
/// alone. `info` shows the references and where the bytes are; the tree
/// stats of the directory holding one copy and the lone file count the
/// copy's chunks as shared and the lone file's as exclusive; a whole-file
/// clone of the lone file outside the tree makes it shared too.
#[test]
fn info_and_tree_stats_count_shared_and_exclusive_chunks() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let a = v.mkdir(ROOT_INO, b"a", 0o755, root()).unwrap().ino;
    let b = v.mkdir(ROOT_INO, b"b", 0o755, root()).unwrap().ino;
    let same = random_bytes(1, 400_000);
    let lone = random_bytes(2, 250_000);
    mkfile(&v, a, "x", &same);
    mkfile(&v, b, "y", &same);
    mkfile(&v, a, "z", &lone);
    v.sync().unwrap();

    let x = v.info(b"a/x", root()).unwrap();
    assert_eq!((x.kind.as_str(), x.size, x.hole_bytes, x.map_links), ("file", same.len() as u64, 0, 1));
    assert!(x.chunks > 3, "{x:?}");
    assert!(x.runs.iter().all(|r| r.refs == 2 && r.place == Place::Local && r.pack.is_some() && r.stored_len > 0), "{:?}", x.runs);
    assert_eq!(x.runs.iter().map(|r| r.len).sum::<u64>(), same.len() as u64);
    assert_eq!((x.shared_bytes, x.exclusive_bytes), (same.len() as u64, 0));
    assert_eq!(x.placed.get("local"), Some(&(same.len() as u64)));
    let z = v.info(b"a/z", root()).unwrap();
    assert!(z.runs.iter().all(|r| r.refs == 1), "{:?}", z.runs);
    assert_eq!((z.shared_bytes, z.exclusive_bytes), (0, lone.len() as u64));
    let dir = v.info(b"a", root()).unwrap();
    assert_eq!((dir.kind.as_str(), dir.entries), ("dir", Some(2)));

    let s = v.tree_stats(b"a", root()).unwrap();
    assert_eq!((s.files, s.directories, s.symlinks), (2, 1, 0));
    assert_eq!((s.logical_bytes, s.hole_bytes), ((same.len() + lone.len()) as u64, 0));
    assert_eq!(s.chunks, x.chunks + z.chunks);
    assert_eq!(s.unique_bytes, (same.len() + lone.len()) as u64);
    assert_eq!((s.shared_bytes, s.shared_chunks), (same.len() as u64, x.chunks), "{s:?}");
    assert_eq!((s.exclusive_bytes, s.exclusive_chunks), (lone.len() as u64, z.chunks), "{s:?}");
    assert_eq!(s.stored_bytes, s.shared_stored_bytes + s.exclusive_stored_bytes);
    assert!((s.dedup_ratio - 1.0).abs() < 1e-9, "{s:?}");
    // The whole volume: both copies inside, everything exclusive, dedup 2x on `same`.
    let all = v.tree_stats(b"", root()).unwrap();
    assert_eq!((all.files, all.shared_bytes, all.exclusive_bytes), (3, 0, (same.len() + lone.len()) as u64), "{all:?}");

    // A whole-file clone shares the lone file's map from outside the tree.
    let zi = v.lookup(a, b"z").unwrap().ino;
    v.clone_tree(zi, b, b"zc", CloneOptions { caller: root() }).unwrap();
    let z = v.info(b"a/z", root()).unwrap();
    assert_eq!((z.map_links, z.shared_bytes, z.exclusive_bytes), (2, lone.len() as u64, 0), "{z:?}");
    let s = v.tree_stats(b"a", root()).unwrap();
    assert_eq!((s.shared_bytes, s.exclusive_bytes), ((same.len() + lone.len()) as u64, 0), "{s:?}");
    // With the clone inside the tree too, the lone file's chunks are the tree's alone.
    let s = v.tree_stats(b"", root()).unwrap();
    assert_eq!((s.files, s.shared_bytes, s.exclusive_bytes), (4, 0, (same.len() + lone.len()) as u64), "{s:?}");
    // A hard link outside the tree keeps the file (and its chunks) alive.
    v.link(zi, ROOT_INO, b"zl").unwrap();
    v.unlink(b, b"zc").unwrap();
    let s = v.tree_stats(b"a", root()).unwrap();
    assert_eq!((s.shared_bytes, s.exclusive_bytes), ((same.len() + lone.len()) as u64, 0), "{s:?}");
    v.close().unwrap();
}

/// Bytes written and not yet flushed are in the journal; after a flush
/// they are in a pack of the volume's directory.
#[test]
fn info_shows_journal_then_local() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let f = v.create(ROOT_INO, b"f", FileKind::File, 0o644, 0, root()).unwrap().ino;
    v.open(f).unwrap();
    let data = random_bytes(3, 100_000);
    v.write(f, 0, &data).unwrap();
    let i = v.info(b"f", root()).unwrap();
    assert_eq!(places(&i), vec![Place::Journal], "{i:?}");
    assert_eq!(i.placed.get("journal"), Some(&(data.len() as u64)));
    assert!(i.runs.iter().all(|r| r.chunk.is_none() && r.pack.is_none()));
    v.release(f).unwrap();
    v.sync().unwrap();
    let i = v.info(b"f", root()).unwrap();
    assert_eq!(places(&i), vec![Place::Local], "{i:?}");
    assert_eq!(i.placed.get("local"), Some(&(data.len() as u64)));
    assert!(i.runs.iter().all(|r| r.chunk.is_some() && r.refs == 1));
    v.close().unwrap();
}

/// A user who may not search a directory gets no answer about what is in
/// it, as the kernel would refuse a stat; nor may they warm it up.
#[test]
fn info_and_tree_stats_check_the_callers_access() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    let p = v.mkdir(ROOT_INO, b"private", 0o700, root()).unwrap().ino;
    mkfile(&v, p, "f", &random_bytes(4, 10_000));
    let user = Caller { uid: 1000, gid: 1000 };
    for e in [v.info(b"private/f", user).unwrap_err(), v.tree_stats(b"private", user).unwrap_err()] {
        assert_eq!(e.kind(), ErrorKind::Permission, "{e}");
        assert!(e.to_string().contains("private"), "{e}");
    }
    let e = v.warmup(&[(p, b"private".to_vec())], Some(user), &mut |_, _| {}).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Permission, "{e}");
    // Root may, and so may the owner once it is theirs.
    assert!(v.info(b"private/f", root()).is_ok());
    v.close().unwrap();
}

/// A volume in a bucket, opened on a machine with an empty cache: the
/// chunks are only in the bucket; after a warmup the cache holds them.
#[test]
fn info_on_a_bucket_volume_shows_bucket_then_cache_after_warmup() {
    let t = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    init_in(&t.path().join("a"), &bucket, None);
    let v = Volume::load(&t.path().join("a"), opts(&bucket, Durability::Local)).unwrap();
    let data = random_bytes(6, 300_000);
    mkfile(&v, ROOT_INO, "f", &data);
    mkfile(&v, ROOT_INO, "g", &random_bytes(7, 200_000));
    v.close().unwrap();
    drop(v);

    let b = t.path().join("b");
    cloud::attach(&b, crate::cloud::URL, None, None, Some(&InjectedBackend(bucket.clone()))).unwrap();
    let w = Volume::load(&b, opts(&bucket, Durability::Local)).unwrap();
    let i = w.info(b"f", root()).unwrap();
    assert_eq!(places(&i), vec![Place::Bucket], "{i:?}");
    assert_eq!(i.placed.get("bucket"), Some(&(data.len() as u64)));
    let f = w.lookup(ROOT_INO, b"f").unwrap().ino;
    let rep = w.warmup(&[(f, b"f".to_vec())], Some(root()), &mut |_, _| {}).unwrap();
    assert!(!rep.local && rep.files == 1 && rep.fetched_bytes >= rep.stored_bytes && rep.reads > 0, "{rep:?}");
    let i = w.info(b"f", root()).unwrap();
    assert_eq!(places(&i), vec![Place::Cache], "{i:?}");
    // The file not warmed is still only in the bucket.
    assert_eq!(places(&w.info(b"g", root()).unwrap()), vec![Place::Bucket]);
    w.close().unwrap();
}
