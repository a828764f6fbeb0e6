//! A volume in a local directory whose metadata lives in PostgreSQL
//! (issue 26, `docs/shared-volume.md`): the engine on a real, throwaway
//! PostgreSQL cluster (`cairn_testing::postgres::PgServer`), one per test
//! process, started on first use and stopped when the process exits.
//! Without PostgreSQL's binaries these tests fail, saying what to install.

use crate::common::*;
use cairn_engine::maintenance::{self, NoProgress};
use cairn_engine::*;
use std::path::Path;
use std::sync::Arc;

pub(crate) use crate::common::{pg_query, pg_schema_exists, pg_url as url};

fn pg_init(dir: &Path) -> VolumeConfig {
    init(dir, &InitOptions { chunker: small_chunks(), pack_target: Some(1 << 20), meta_url: Some(url().to_string()), ..Default::default() }).unwrap()
}

fn pg_open(dir: &Path) -> Arc<Volume> {
    // gc takes a dead chunk at once (the grace has a test of its own,
    // `shared_writers::a_chunk_that_died_within_the_grace_...`).
    Volume::load(dir, OpenOptions { meta_url: Some(url().to_string()), chunk_grace: Some(std::time::Duration::ZERO), ..Default::default() }).unwrap()
}

#[test]
fn namespace_and_data_live_in_postgres_and_survive_reopen() {
    let d = tempfile::tempdir().unwrap();
    let cfg = pg_init(d.path());
    assert_eq!(cfg.meta, MetaKind::Postgres);
    assert!(pg_schema_exists(&cfg.volume_id), "init made the volume's schema");
    assert!(!d.path().join("meta.sqlite").exists(), "no SQLite database beside PostgreSQL");
    let (_, _, _, stored) = read_config(d.path()).unwrap();
    assert_eq!(stored.meta, MetaKind::Postgres, "the stored config says where the metadata is");
    let raw = std::fs::read(d.path().join("store/config")).unwrap();
    let text = String::from_utf8_lossy(&raw);
    assert!(text.contains("\"meta\": \"postgres\"") && !text.contains("127.0.0.1"), "{text}");

    let big = random_bytes(26, 3 << 20);
    let (f, sub) = {
        let v = pg_open(d.path());
        let sub = v.mkdir(ROOT_INO, b"sub", 0o750, root()).unwrap();
        let f = mkfile(&v, sub.ino, "big", &big);
        mkfile(&v, ROOT_INO, "doomed", b"bye");
        v.unlink(ROOT_INO, b"doomed").unwrap();
        mkfile(&v, ROOT_INO, "a", b"A");
        v.rename(ROOT_INO, b"a", sub.ino, b"b", RenameFlags::default()).unwrap();
        v.symlink(ROOT_INO, b"link", b"sub/big", root()).unwrap();
        v.setxattr(f, b"user.colour", b"green", XattrFlags::default()).unwrap();
        v.setxattr(f, b"user.gone", b"x", XattrFlags::default()).unwrap();
        v.removexattr(f, b"user.gone").unwrap();
        assert_eq!(read_all(&v, f), big);
        v.close().unwrap();
        (f, sub.ino)
    };
    let v = pg_open(d.path());
    assert_eq!(read_all(&v, f), big, "3 MiB byte-exact after a reopen");
    assert_eq!(v.resolve(b"sub/big").unwrap(), f);
    assert_eq!(v.getattr(sub).unwrap().perm, 0o750);
    let b = v.resolve(b"sub/b").unwrap();
    assert_eq!(read_all(&v, b), b"A");
    assert_eq!(v.lookup(ROOT_INO, b"a").unwrap_err().errno(), libc::ENOENT);
    assert_eq!(v.lookup(ROOT_INO, b"doomed").unwrap_err().errno(), libc::ENOENT);
    let link = v.lookup(ROOT_INO, b"link").unwrap();
    assert_eq!(link.kind, FileKind::Symlink);
    assert_eq!(v.readlink(link.ino).unwrap(), b"sub/big");
    assert_eq!(v.getxattr(f, b"user.colour").unwrap(), b"green");
    assert_eq!(v.listxattr(f).unwrap(), vec![b"user.colour".to_vec()]);
    let mut names: Vec<Vec<u8>> = v.readdir(ROOT_INO).unwrap().into_iter().map(|e| e.name).filter(|n| n != b"." && n != b"..").collect();
    names.sort();
    assert_eq!(names, vec![b"link".to_vec(), b"sub".to_vec()]);
    let rep = maintenance::fsck(&v, true, &NoProgress).unwrap();
    assert!(rep.errors.is_empty() && rep.warnings.is_empty(), "{rep:?}");
    assert!(rep.inodes >= 4 && rep.chunks > 0, "{rep:?}");
}

#[test]
fn clone_snapshot_and_gc_with_postgres_metadata() {
    let d = tempfile::tempdir().unwrap();
    pg_init(d.path());
    let v = pg_open(d.path());
    let data = random_bytes(27, 3 << 20);
    let top = v.mkdir(ROOT_INO, b"top", 0o755, root()).unwrap();
    mkfile(&v, top.ino, "f", &data);
    v.sync().unwrap();
    let before = stored_pack_bytes(d.path());
    v.clone_tree(top.ino, ROOT_INO, b"copy", CloneOptions { caller: root() }).unwrap();
    v.sync().unwrap();
    assert_eq!(stored_pack_bytes(d.path()), before, "a clone shares the chunks");
    let cf = v.resolve(b"copy/f").unwrap();
    assert_eq!(read_all(&v, cf), data);

    v.snapshot_create("s").unwrap();
    let sf = v.resolve(b".snapshots/s/top/f").unwrap();
    // Only the snapshot and the clone keep the original's chunks now.
    v.unlink(top.ino, b"f").unwrap();
    assert_eq!(read_all(&v, sf), data);

    // A file nothing else refers to: deleting it and gc frees its packs.
    mkfile(&v, ROOT_INO, "gone", &random_bytes(28, 3 << 20));
    v.sync().unwrap();
    let full = stored_pack_bytes(d.path());
    v.unlink(ROOT_INO, b"gone").unwrap();
    let rep = maintenance::gc(&v, 0.5, &NoProgress).unwrap();
    assert!(rep.packs_deleted > 0, "{rep:?}");
    let after = stored_pack_bytes(d.path());
    assert!(after + (2 << 20) < full, "gc freed the deleted file's packs: {full} -> {after}");
    assert_eq!(read_all(&v, sf), data);
    assert_eq!(read_all(&v, cf), data);
    let rep = maintenance::fsck(&v, true, &NoProgress).unwrap();
    assert!(rep.errors.is_empty() && rep.warnings.is_empty(), "{rep:?}");
    v.close().unwrap();
    drop(v);
    let v = pg_open(d.path());
    assert_eq!(read_all(&v, v.resolve(b".snapshots/s/top/f").unwrap()), data);
}

#[test]
fn the_metadata_store_must_match_the_config() {
    let d = tempfile::tempdir().unwrap();
    let cfg = pg_init(d.path());
    let e = Volume::load(d.path(), OpenOptions::default()).err().expect("a PostgreSQL volume opened without --meta");
    assert_eq!(e.kind(), ErrorKind::Config);
    assert!(e.to_string().contains("this volume keeps its metadata in PostgreSQL") && e.to_string().contains("add --meta postgres://USER@HOST/DB"), "{e}");
    assert!(!d.path().join("meta.sqlite").exists(), "a refused open made no SQLite database");
    // Another database of the same server has no such volume.
    pg_query("CREATE DATABASE elsewhere");
    let other = url().replace("/cairn", "/elsewhere");
    let e = Volume::load(d.path(), OpenOptions { meta_url: Some(other), ..Default::default() }).err().expect("the wrong database");
    assert!(e.to_string().contains(&format!("no schema cairn_{}", cfg.volume_id)), "{e}");

    // An SQLite volume refuses a URL.
    let s = tempfile::tempdir().unwrap();
    init_small(s.path());
    let (_, _, _, scfg) = read_config(s.path()).unwrap();
    assert_eq!(scfg.meta, MetaKind::Sqlite);
    let e = Volume::load(s.path(), OpenOptions { meta_url: Some(url().to_string()), ..Default::default() }).err().expect("an SQLite volume opened with --meta");
    assert!(e.to_string().contains("keeps its metadata in SQLite") && e.to_string().contains("leave out --meta"), "{e}");
    assert!(!pg_schema_exists(&scfg.volume_id));

    // A tape volume refuses PostgreSQL metadata (its metadata travels with
    // the tape), before touching anything. (A bucket volume takes it: see
    // pg_bucket.rs.)
    let c = tempfile::tempdir().unwrap();
    let cdir = c.path().join("cache");
    let tape = format!("tape-emu:{}", c.path().join("tape").display());
    let e = init_cloud(&cdir, &tape, None, None, &InitOptions { meta_url: Some(url().to_string()), ..Default::default() }).unwrap_err();
    assert!(e.to_string().contains("keeps its metadata on the tape, not in PostgreSQL") && e.to_string().contains("leave out --meta"), "{e}");
    assert!(!cdir.exists() && !c.path().join("tape").exists());
}

/// A config from before the field (no `meta`) is an SQLite volume, and an
/// SQLite volume's config still has no `meta`, so older builds read it.
#[test]
fn an_absent_meta_field_means_sqlite() {
    let (mut c, _) = VolumeConfig::create(&InitOptions::default()).unwrap();
    let bytes = c.to_bytes();
    assert!(!String::from_utf8_lossy(&bytes).contains("\"meta\""));
    assert_eq!(VolumeConfig::parse(&bytes).unwrap().meta, MetaKind::Sqlite);
    c.meta = MetaKind::Postgres;
    assert_eq!(VolumeConfig::parse(&c.to_bytes()).unwrap().meta, MetaKind::Postgres);
}

/// A tampered bucket whose config says "postgres" of a volume that keeps
/// its metadata in SQLite: the open is refused (without a URL: the URL is
/// asked for; with one: the database has no such volume) and the volume is
/// left as it was.
#[test]
fn a_bucket_config_that_claims_postgres_is_refused() {
    use cairn_backend::Backend;
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("vol");
    let url = "s3://tampered/vol";
    let bucket: Arc<dyn Backend> = Arc::new(cairn_testing::MemoryBackend::new());
    init_cloud(&dir, url, None, None, &InitOptions { backend: Some(InjectedBackend(bucket.clone())), ..Default::default() }).unwrap();
    let mut cfg = VolumeConfig::parse(&bucket.get(config::CONFIG_OBJECT).unwrap()).unwrap();
    cfg.meta = MetaKind::Postgres;
    bucket.put(config::CONFIG_OBJECT, &cfg.to_bytes()).unwrap();
    let before = bucket.list("").unwrap().len();
    for meta_url in [None, Some("postgres://cairn@127.0.0.1:1/cairn".to_string())] {
        let opts = OpenOptions { backend: Some(InjectedBackend(bucket.clone())), meta_url: meta_url.clone(), ..Default::default() };
        let e = Volume::load(&dir, opts).err().expect("a bucket volume whose config claims PostgreSQL");
        let m = e.to_string();
        assert!(m.contains("PostgreSQL"), "{meta_url:?}: {m}");
    }
    assert_eq!(bucket.list("").unwrap().len(), before, "a refused open wrote to the bucket");
}

/// A metadata kind this build does not know is refused, not taken for SQLite.
#[test]
fn an_unknown_meta_kind_is_refused() {
    let (c, _) = VolumeConfig::create(&InitOptions::default()).unwrap();
    let text = String::from_utf8(c.to_bytes()).unwrap();
    let tampered = text.replacen('{', "{\"meta\":\"mysql\",", 1);
    assert!(VolumeConfig::parse(tampered.as_bytes()).is_err());
}

/// Close-to-open (docs/shared-volume.md §3, §10.3): on a volume whose
/// metadata is in PostgreSQL a close commits the file, so a machine that
/// vanishes right after the close, with its journal, leaves the bytes in
/// the store for the others. Elsewhere a close only marks the file due
/// (its journal replays it).
/// A close whose file could not be flushed fails, although the round's
/// transaction (with nothing in it) commits: bytes that are only in this
/// machine's journal are never reported committed (an fsync on a bucket
/// volume takes the same path). Here the old chunks an overwrite is
/// re-chunked with are gone; in an outage it is a chunk lookup that fails,
/// and the server may be back by the commit.
#[test]
fn a_close_that_could_not_flush_the_file_fails() {
    let d = tempfile::tempdir().unwrap();
    pg_init(d.path());
    let data = random_bytes(33, 1 << 20);
    let ino = {
        let v = pg_open(d.path());
        let ino = mkfile(&v, ROOT_INO, "f", &data);
        v.fsync(ino, false).unwrap();
        v.close().unwrap();
        ino
    };
    assert!(stored_pack_bytes(d.path()) > 0);
    std::fs::remove_dir_all(d.path().join("store/packs")).unwrap();
    std::fs::create_dir(d.path().join("store/packs")).unwrap();
    let v = pg_open(d.path());
    v.open(ino).unwrap();
    v.write(ino, 400_000, &random_bytes(34, 200_000)).unwrap();
    let e = v.close_commit(ino).expect_err("a close reported the file committed though its flush failed");
    assert!(e.to_string().contains(&format!("flushing inode {ino}")), "{e}");
    v.simulate_crash();
}

#[test]
fn a_close_commits_the_file_for_other_machines() {
    let d = tempfile::tempdir().unwrap();
    pg_init(d.path());
    let big = random_bytes(31, 700_000);
    let small = b"closed, so committed".to_vec();
    let (f, g, h) = {
        let v = pg_open(d.path());
        assert!(v.is_shared());
        let mut files = Vec::new();
        for (name, data) in [("big", &big[..]), ("small", &small[..])] {
            let ino = v.create(ROOT_INO, name.as_bytes(), FileKind::File, 0o644, 0, root()).unwrap().ino;
            v.open(ino).unwrap();
            v.write(ino, 0, data).unwrap();
            v.close_commit(ino).unwrap();
            v.release(ino).unwrap();
            files.push(ino);
        }
        // Still open: written again after a close, then closed again.
        let h = v.create(ROOT_INO, b"reopened", FileKind::File, 0o644, 0, root()).unwrap().ino;
        v.open(h).unwrap();
        v.write(h, 0, b"first").unwrap();
        v.close_commit(h).unwrap();
        v.write(h, 5, b" second").unwrap();
        v.close_commit(h).unwrap();
        v.simulate_crash();
        (files[0], files[1], h)
    };
    // The machine is gone with its journal; the store and the packs remain.
    std::fs::remove_dir_all(d.path().join("journal")).unwrap();
    std::fs::create_dir(d.path().join("journal")).unwrap();
    let v = pg_open(d.path());
    assert_eq!(read_all(&v, f), big);
    assert_eq!(read_all(&v, g), small);
    assert_eq!(read_all(&v, h), b"first second");
    assert_eq!(v.getattr(h).unwrap().size, 12);
    v.close().unwrap();
}
