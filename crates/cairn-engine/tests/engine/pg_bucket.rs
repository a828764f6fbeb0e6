//! A volume in a bucket whose metadata lives in PostgreSQL (issue 26,
//! docs/shared-volume.md): a real S3-compatible server (moto, named by
//! `CAIRN_TEST_S3_ENDPOINT` and `CAIRN_TEST_S3_BUCKET` as scripts/test.sh
//! exports them) and the throwaway PostgreSQL of `postgres.rs`. Each test
//! takes a prefix of its own; each "machine" is a cache directory of its own.

use crate::common::*;
use crate::postgres::{pg_query, pg_schema_exists, url};
use cairn_backend::{Backend, S3Backend, S3Location};
use cairn_engine::cloud::{self, versions, CloudOptions};
use cairn_engine::maintenance::{self, NoProgress};
use cairn_engine::*;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub(crate) const REGION: &str = "us-east-1";

pub(crate) fn endpoint() -> String {
    std::env::var("CAIRN_TEST_S3_ENDPOINT").expect(
        "CAIRN_TEST_S3_ENDPOINT is not set: these tests need an S3-compatible server (moto_server -H 127.0.0.1 -p PORT; \
         curl -X PUT http://127.0.0.1:PORT/BUCKET; export CAIRN_TEST_S3_ENDPOINT=http://127.0.0.1:PORT CAIRN_TEST_S3_BUCKET=BUCKET \
         and AWS credentials), as scripts/test.sh does",
    )
}

/// A new volume URL: a fresh prefix in the test bucket.
pub(crate) fn fresh_url(what: &str) -> String {
    let bucket = std::env::var("CAIRN_TEST_S3_BUCKET").expect("CAIRN_TEST_S3_BUCKET is not set (see scripts/test.sh)");
    format!("s3://{bucket}/pg-{what}-{}", hex::encode(rand::random::<[u8; 6]>()))
}

/// The volume's prefix of the bucket, as the tests look at it.
/// The test's own view of the bucket, retried as the engine's is: an S3
/// server may answer 500 now and then (moto does under concurrent listing
/// and writing), and a test must not fail on what a client retries.
pub(crate) fn bucket_of(url: &str) -> Arc<dyn Backend> {
    let s3 = S3Backend::open(S3Location::parse(url, Some(&endpoint()), Some(REGION)).unwrap()).unwrap();
    Arc::new(cairn_backend::Retrying::new(s3, cairn_backend::RetryPolicy::cloud()))
}

pub(crate) fn pg_init_cloud(dir: &Path, url: &str) -> VolumeConfig {
    let opts = InitOptions { chunker: small_chunks(), pack_target: Some(1 << 20), meta_url: Some(crate::postgres::url().to_string()), ..Default::default() };
    init_cloud(dir, url, Some(&endpoint()), Some(REGION), &opts).unwrap()
}

pub(crate) fn pg_opts() -> OpenOptions {
    OpenOptions {
        meta_url: Some(url().to_string()),
        cloud: CloudOptions { cache_bytes: 64 << 20, meta_interval: Duration::from_millis(200), gc_interval: None, ..Default::default() },
        // gc takes a dead chunk at once, so the tests reach the races the
        // grace makes rare; the grace has a test of its own
        // (`shared_writers::a_chunk_that_died_within_the_grace_...`).
        chunk_grace: Some(Duration::ZERO),
        ..Default::default()
    }
}

/// Another machine: a new cache directory for the volume, then the open.
pub(crate) fn mount_elsewhere(dir: &Path, url: &str, opts: OpenOptions) -> Arc<Volume> {
    cloud::attach(dir, url, Some(&endpoint()), Some(REGION), None).unwrap();
    Volume::load(dir, opts).unwrap()
}

/// Files of several sizes (empty, one byte, under a chunk, many chunks
/// over several packs), each fsync'd.
fn write_files(v: &Volume) -> Vec<(String, Vec<u8>)> {
    let sub = v.mkdir(ROOT_INO, b"sub", 0o755, root()).unwrap().ino;
    let sizes = [0usize, 1, 4_095, 100_000, 3 << 20];
    sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let data = random_bytes(40 + i as u64, n);
            let (parent, path) = if i % 2 == 0 { (ROOT_INO, format!("f{i}")) } else { (sub, format!("sub/f{i}")) };
            let ino = mkfile(v, parent, path.rsplit('/').next().unwrap(), &data);
            v.fsync(ino, false).unwrap();
            (path, data)
        })
        .collect()
}

fn check_files(v: &Volume, files: &[(String, Vec<u8>)]) {
    for (path, data) in files {
        let ino = v.resolve(path.as_bytes()).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(&read_all(v, ino) == data, "{path} differs");
    }
}

pub(crate) fn fsck_clean(v: &Volume) {
    let rep = maintenance::fsck(v, true, &NoProgress).unwrap();
    assert!(rep.errors.is_empty() && rep.warnings.is_empty(), "fsck: {rep:?}");
}

/// The packs the trash objects list.
fn trashed(bucket: &dyn Backend) -> Vec<String> {
    bucket.list(cloud::TRASH_PREFIX).unwrap().iter().flat_map(|t| serde_json::from_slice::<Vec<String>>(&bucket.get(&t.name).unwrap()).unwrap()).collect()
}

/// fsck with every byte read: no error, and no warning but packs in the
/// bucket that the metadata no longer names because they are in the trash.
fn fsck_clean_but_trash(v: &Volume, bucket: &dyn Backend) {
    let rep = maintenance::fsck(v, true, &NoProgress).unwrap();
    let t = trashed(bucket);
    assert!(rep.errors.is_empty(), "fsck: {rep:?}");
    for w in &rep.warnings {
        assert!(t.iter().any(|n| w.contains(&format!("pack {n} is in the backend but not in the metadata"))), "{w} (trash: {t:?})");
    }
}

/// What the bucket holds: the config, packs and bill objects; never a
/// metadata version, a database or a password.
fn assert_bucket_holds_no_metadata(bucket: &dyn Backend) {
    assert!(versions::list(bucket).unwrap().is_empty(), "metadata versions in the bucket of a PostgreSQL volume");
    for o in bucket.list("").unwrap() {
        let n = o.name.as_str();
        assert!(n == config::CONFIG_OBJECT || n.starts_with("packs/") || n.starts_with("bills/") || n.starts_with(cloud::TRASH_PREFIX), "unexpected object {n}");
    }
}

/// Made with a PostgreSQL URL, a bucket volume keeps only its config there
/// (which says "postgres" and names no server); its cache directory holds
/// no SQLite database and no shipping state. Written and closed on one
/// machine, it opens on another from a fresh cache directory (no versions
/// fetched: there are none) and reads byte for byte; fsck is clean there.
#[test]
fn a_bucket_volume_with_postgres_metadata_opens_on_another_machine() {
    let url = fresh_url("two");
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let cfg = pg_init_cloud(a.path(), &url);
    let bucket = bucket_of(&url);
    assert_eq!(cfg.meta, MetaKind::Postgres);
    assert!(pg_schema_exists(&cfg.volume_id), "init made the volume's schema");
    let text = String::from_utf8(bucket.get(config::CONFIG_OBJECT).unwrap()).unwrap();
    assert!(text.contains("\"meta\": \"postgres\"") && !text.contains("127.0.0.1") && !text.contains("postgres://"), "{text}");
    assert!(!a.path().join("meta.sqlite").exists(), "no SQLite database beside PostgreSQL");
    assert!(!a.path().join("cloud.json").exists(), "no shipping state: nothing ships");
    assert!(a.path().join("journal").is_dir());
    assert_bucket_holds_no_metadata(bucket.as_ref());

    let v = Volume::load(a.path(), pg_opts()).unwrap();
    let files = write_files(&v);
    v.close().unwrap();
    drop(v);
    assert!(bucket.list("lease").unwrap().is_empty(), "unmount gives the lease back");
    assert_bucket_holds_no_metadata(bucket.as_ref());
    assert!(!bucket.list("packs/").unwrap().is_empty(), "the data is in the bucket");
    assert!(!a.path().join("meta.sqlite").exists() && !a.path().join("cloud.json").exists());

    let bdir = b.path().join("cache");
    cloud::attach(&bdir, &url, Some(&endpoint()), Some(REGION), None).unwrap();
    assert!(bdir.join("journal").is_dir());
    assert!(!bdir.join("meta.sqlite").exists() && !bdir.join("cloud.json").exists(), "attach fetched nothing");
    let v = Volume::load(&bdir, pg_opts()).unwrap();
    check_files(&v, &files);
    fsck_clean(&v);
    assert!(!bdir.join("meta.sqlite").exists() && !bdir.join("cloud.json").exists());
    // Written here too, then seen back on the first machine.
    let more = random_bytes(49, 200_000);
    mkfile(&v, ROOT_INO, "from-b", &more);
    v.close().unwrap();
    drop(v);
    assert_bucket_holds_no_metadata(bucket.as_ref());
    let v = Volume::load(a.path(), pg_opts()).unwrap();
    check_files(&v, &files);
    assert_eq!(read_all(&v, v.resolve(b"from-b").unwrap()), more);
    v.close().unwrap();
}

/// A crash after fsync: another machine sees the fsync'd bytes at once
/// (the pack reached the bucket before PostgreSQL named it), and the
/// crashed machine's own reopen keeps them and replays the rest of its
/// journal.
#[test]
fn fsynced_data_survives_a_crash_and_is_visible_elsewhere() {
    let url = fresh_url("crash");
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    pg_init_cloud(a.path(), &url);
    let mut o = pg_opts();
    o.cloud.meta_interval = Duration::from_secs(3600);
    let v = Volume::load(a.path(), o.clone()).unwrap();
    let files = write_files(&v);
    // Acknowledged but never fsync'd: in this machine's journal only.
    let late = random_bytes(50, 50_000);
    let late_ino = v.create(ROOT_INO, b"late", FileKind::File, 0o644, 0, root()).unwrap().ino;
    v.open(late_ino).unwrap();
    v.write(late_ino, 0, &late).unwrap();
    v.simulate_crash();

    // Another machine, read-only (the crashed mount's lease has not expired).
    let mut ro = pg_opts();
    ro.read_only = true;
    let v = mount_elsewhere(&b.path().join("cache"), &url, ro);
    check_files(&v, &files);
    v.close().unwrap();
    drop(v);

    let v = Volume::load(a.path(), o).unwrap();
    check_files(&v, &files);
    assert_eq!(read_all(&v, v.resolve(b"late").unwrap()), late, "the journal replayed into PostgreSQL");
    fsck_clean(&v);
    v.close().unwrap();
    assert_bucket_holds_no_metadata(bucket_of(&url).as_ref());
}

/// Without the URL the open says how to give it, and touches nothing; a
/// cache directory attached to such a volume has no SQLite to fall back on.
#[test]
fn opening_without_the_url_is_refused() {
    let url = fresh_url("nourl");
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let cfg = pg_init_cloud(a.path(), &url);
    let bucket = bucket_of(&url);
    let before = bucket.list("").unwrap().len();
    let bdir = b.path().join("cache");
    cloud::attach(&bdir, &url, Some(&endpoint()), Some(REGION), None).unwrap();
    for dir in [a.path(), bdir.as_path()] {
        let mut o = pg_opts();
        o.meta_url = None;
        let e = Volume::load(dir, o).err().expect("a PostgreSQL volume opened without --meta");
        assert_eq!(e.kind(), ErrorKind::Config);
        let m = e.to_string();
        assert!(m.contains("this volume keeps its metadata in PostgreSQL") && m.contains(&format!("cairn_{}", cfg.volume_id)) && m.contains("add --meta postgres://USER@HOST/DB"), "{m}");
        assert!(!dir.join("meta.sqlite").exists(), "a refused open made an SQLite database");
    }
    assert_eq!(bucket.list("").unwrap().len(), before, "a refused open wrote to the bucket");
    let e = cloud::restore(bucket.as_ref(), &cfg.keys(None).unwrap(), &url, 1).unwrap_err();
    assert!(e.to_string().contains("keeps its metadata in PostgreSQL") && e.to_string().contains("no version to restore"), "{e}");
}

/// gc (empty packs deleted, sparse ones repacked) and the cost-optimal
/// cleaner work on PostgreSQL metadata: the data stays readable, fsck is
/// clean, the packs they free wait in the trash for the grace period and
/// then go, and another machine (an empty cache: every byte from the
/// bucket) still reads everything.
#[test]
fn gc_and_the_cleaner_keep_every_byte() {
    let url = fresh_url("gc");
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    pg_init_cloud(a.path(), &url);
    let bucket = bucket_of(&url);
    let v = Volume::load(a.path(), pg_opts()).unwrap();
    let files = write_files(&v);
    // Dead bytes: a whole file's packs, and part of a pack.
    mkfile(&v, ROOT_INO, "gone", &random_bytes(60, 2 << 20));
    mkfile(&v, ROOT_INO, "small-gone", &random_bytes(61, 300_000));
    let keep = random_bytes(62, 200_000);
    mkfile(&v, ROOT_INO, "keep", &keep);
    v.sync().unwrap();
    v.unlink(ROOT_INO, b"gone").unwrap();
    v.unlink(ROOT_INO, b"small-gone").unwrap();
    v.sync().unwrap();
    let packs_before = bucket.list("packs/").unwrap().len();

    let rep = maintenance::gc(&v, 0.0, &NoProgress).unwrap();
    assert!(rep.packs_deleted > 0, "{rep:?}");
    let trash = bucket.list(cloud::TRASH_PREFIX).unwrap();
    assert!(!trash.is_empty(), "freed packs wait in the trash");
    check_files(&v, &files);
    fsck_clean_but_trash(&v, bucket.as_ref());

    // The cleaner, at a time when every pack with dead bytes is due.
    let far = 1i64 << 62;
    let mut prices = cost::Prices::aws();
    prices.storage_per_gb_month = 1e6;
    let rep = cleaner::clean_due(&v, far, &prices, 1 << 30).unwrap();
    assert!(rep.gave_up.is_none() && rep.packs_cleaned > 0, "{rep:?}");
    check_files(&v, &files);
    assert_eq!(read_all(&v, v.resolve(b"keep").unwrap()), keep);
    fsck_clean_but_trash(&v, bucket.as_ref());

    // Not yet past the grace period: nothing deleted.
    v.prune_trash_older_than(Duration::from_secs(3600));
    let trashed = trashed(bucket.as_ref());
    assert!(!trashed.is_empty());
    let listed: std::collections::HashSet<String> = bucket.list("packs/").unwrap().into_iter().map(|o| o.name).collect();
    assert!(trashed.iter().all(|n| listed.contains(n)), "a trashed pack went before its grace period");
    // Past it: the trashed packs go.
    v.prune_trash_older_than(Duration::ZERO);
    assert!(bucket.list(cloud::TRASH_PREFIX).unwrap().is_empty(), "trash left after its grace period");
    let listed: std::collections::HashSet<String> = bucket.list("packs/").unwrap().into_iter().map(|o| o.name).collect();
    assert!(trashed.iter().all(|n| !listed.contains(n)), "trashed packs still in the bucket");
    assert!(listed.len() < packs_before, "{} packs before, {} after", packs_before, listed.len());
    check_files(&v, &files);
    fsck_clean(&v);
    v.close().unwrap();
    drop(v);
    assert_bucket_holds_no_metadata(bucket.as_ref());

    let v = mount_elsewhere(&b.path().join("cache"), &url, pg_opts());
    check_files(&v, &files);
    assert_eq!(read_all(&v, v.resolve(b"keep").unwrap()), keep);
    fsck_clean(&v);
    v.close().unwrap();
}

/// Journal positions are per machine (docs/shared-volume.md §11.1). Machine
/// A commits file x, then writes it again (acknowledged, in A's journal
/// only) and crashes; its journal also still holds x's committed records
/// (an unflushed file y keeps the segments). Machine B (its own cache
/// directory and journal) rewrites x and commits it at many more journal
/// positions of its own. When A comes back, its acknowledged write is
/// replayed, and is the last flush of its range, so it wins there (§3);
/// its already committed records are not re-applied over B's newer bytes.
/// Before the marks, x's one `jseq` held B's position, far past A's record:
/// A skipped it and the write was lost without a word.
#[test]
fn a_crashed_machines_write_replays_after_another_machine_committed_the_file() {
    let url = fresh_url("marks");
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let cfg = pg_init_cloud(a.path(), &url);
    let bucket = bucket_of(&url);
    let marks = || pg_query(&format!("SELECT count(*) FROM cairn_{}.journal_marks", cfg.volume_id));
    let mut o = pg_opts();
    o.cloud.meta_interval = Duration::from_secs(3600);
    // Nothing is flushed unless asked: the late write stays in A's journal.
    o.flush_age = Duration::from_secs(3600);
    let size = 64 << 10;
    let v = Volume::load(a.path(), o.clone()).unwrap();
    // The journal's id: 16 hex digits, private to the owner.
    let id_of = |dir: &Path| {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join("journal/id");
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600, "{} is not private", p.display());
        let t = std::fs::read_to_string(&p).unwrap();
        assert!(t.len() == 17 && u64::from_str_radix(t.trim(), 16).is_ok(), "{t:?}");
        t
    };
    let a_id = id_of(a.path());
    let y = v.create(ROOT_INO, b"y", FileKind::File, 0o644, 0, root()).unwrap().ino;
    v.open(y).unwrap();
    let y_data = random_bytes(80, 10_000);
    v.write(y, 0, &y_data).unwrap();
    let first = random_bytes(81, size);
    let x = v.create(ROOT_INO, b"x", FileKind::File, 0o644, 0, root()).unwrap().ino;
    v.open(x).unwrap();
    for (i, piece) in first.chunks(4096).enumerate() {
        v.write(x, (i * 4096) as u64, piece).unwrap();
    }
    v.fsync(x, false).unwrap();
    let late = random_bytes(82, 3000);
    v.write(x, 1000, &late).unwrap();
    v.simulate_crash();

    // Machine B takes the volume over (the crashed mount's lease is
    // forced, as an expired one would be) and rewrites x.
    bucket.delete(cloud::lease::OBJECT).unwrap();
    let mut ob = pg_opts();
    ob.cloud.force = true;
    let vb = mount_elsewhere(&b.path().join("cache"), &url, ob);
    let xb = vb.resolve(b"x").unwrap();
    assert!(read_all(&vb, xb) == first, "B does not see what A committed");
    vb.open(xb).unwrap();
    let mut expect = random_bytes(83, size);
    vb.write(xb, 0, &expect).unwrap();
    vb.fsync(xb, false).unwrap();
    for i in 0..60u64 {
        let at = (i * 1000) as usize;
        let bytes = random_bytes(200 + i, 200);
        vb.write(xb, at as u64, &bytes).unwrap();
        vb.fsync(xb, false).unwrap();
        expect[at..at + 200].copy_from_slice(&bytes);
    }
    assert_ne!(id_of(&b.path().join("cache")), a_id, "two cache directories share a journal id");
    vb.release(xb).unwrap();
    vb.close().unwrap();
    drop(vb);
    assert_eq!(marks(), "1", "B's clean close left marks, or A's mark for x went with B's commits");

    // A comes back: its journal replays.
    expect[1000..4000].copy_from_slice(&late);
    let v = Volume::load(a.path(), o.clone()).unwrap();
    assert_eq!(id_of(a.path()), a_id, "the journal id changed at a reopen");
    let got = read_all(&v, x);
    assert!(got[1000..4000] == late[..], "A's acknowledged write was lost: B's commit of x at a higher position of B's journal made A skip it");
    assert!(got == expect, "A re-applied records it had committed over B's newer bytes ({} bytes differ)", got.iter().zip(&expect).filter(|(p, q)| p != q).count());
    assert!(read_all(&v, y) == y_data, "y was not replayed");
    fsck_clean(&v);
    v.close().unwrap();
    drop(v);
    assert_eq!(marks(), "0", "A's clean close (journal empty) left marks");

    // What A replayed is committed: another machine reads it.
    let v = mount_elsewhere(&b.path().join("c2"), &url, pg_opts());
    assert!(read_all(&v, v.resolve(b"x").unwrap()) == expect, "the replayed write did not reach PostgreSQL");
    v.close().unwrap();
}

/// Reads `len` bytes of `ino` from 0, as an open handle does.
fn read_open(v: &Volume, ino: Ino, len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < len {
        let got = v.read(ino, out.len() as u64, 1 << 20).unwrap();
        assert!(!got.is_empty(), "short read at {}", out.len());
        out.extend_from_slice(&got);
    }
    out
}

/// Calls `f.next` until its batch names `ino`; the batches' union and the
/// time it took (panics after 5 s).
fn follow_until(f: &ChangeFollower, ino: Ino) -> ChangeBatch {
    follow_until_batch(f, Duration::from_secs(60), |b| b.inodes.contains(&ino))
}

/// Calls `f.next` until one of them was woken by a notice (panics after
/// `limit`, a generous deadline): the store's notices reach the follower,
/// not only its poll.
fn await_notice(f: &ChangeFollower, since: u64, limit: Duration) {
    let t = std::time::Instant::now();
    while f.notices() <= since {
        assert!(t.elapsed() < limit, "no notice of another machine's commit woke the follower within {limit:?}");
        let b = f.next(Duration::from_millis(100)).unwrap();
        f.done(&b);
    }
}

/// Machine B (read-only, the bucket's lease is A's) has a file open and
/// read; A rewrites it with other bytes of the same size and closes it. B's
/// in-memory state still serves the old extent map (nothing told it); its
/// change follower (woken by A's commit notice; the notice is asserted to arrive)
/// reloads it, so the same open handle then reads A's bytes and B's getattr
/// shows A's mtime. The batch also names the entries A created and renamed,
/// and a file B had not opened reads A's latest bytes at once.
#[test]
fn a_follower_makes_another_machines_rewrite_visible_to_an_open_file() {
    let url = fresh_url("follow");
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    pg_init_cloud(a.path(), &url);
    let va = Volume::load(a.path(), pg_opts()).unwrap();
    let old = random_bytes(60, 300_000);
    let ino = mkfile(&va, ROOT_INO, "f", &old);
    va.fsync(ino, false).unwrap();

    let mut ro = pg_opts();
    ro.read_only = true;
    let vb = mount_elsewhere(&b.path().join("cache"), &url, ro);
    let follower = vb.follow_changes().unwrap().expect("a volume with PostgreSQL metadata is followed");
    assert!(follower.cursor() > 0, "the cursor starts at the newest change");
    assert_eq!(vb.resolve(b"f").unwrap(), ino);
    vb.open(ino).unwrap();
    assert!(read_open(&vb, ino, old.len()) == old);

    // A: same size, other bytes, closed (committed for other machines).
    let new = random_bytes(61, old.len());
    va.open(ino).unwrap();
    va.write(ino, 0, &new).unwrap();
    va.close_commit(ino).unwrap();
    va.release(ino).unwrap();
    let a_mtime = va.getattr(ino).unwrap().mtime;
    assert!(read_open(&vb, ino, old.len()) == old, "B's open state keeps the extent map it loaded until it follows the change");

    let notices = follower.notices();
    let batch = follow_until(&follower, ino);
    assert!(!batch.all, "nothing was trimmed");
    // The notice of A's commit reaches B (whether the poll or the notice
    // read the row first is a race of no consequence).
    await_notice(&follower, notices, Duration::from_secs(60));
    let got = read_open(&vb, ino, new.len());
    assert!(got == new, "B's open handle reads A's new bytes after the follower (first difference at {:?})", got.iter().zip(&new).position(|(x, y)| x != y));
    let attr = vb.getattr(ino).unwrap();
    assert_eq!((attr.size, attr.mtime), (new.len() as u64, a_mtime));

    // An open catches up at once, notice or not: A rewrites again, and B's
    // `open` reloads the file before returning.
    let newer = random_bytes(62, old.len());
    va.open(ino).unwrap();
    va.write(ino, 0, &newer).unwrap();
    va.close_commit(ino).unwrap();
    va.release(ino).unwrap();
    assert!(!vb.open(ino).unwrap().keep_cache, "an open after another machine's change tells the kernel to drop its pages");
    vb.release(ino).unwrap();
    assert!(read_open(&vb, ino, newer.len()) == newer, "B reads A's bytes right after the open");
    let b = follower.next(Duration::ZERO).unwrap();
    assert!(b.inodes.contains(&ino), "what the catch-up read goes to the notifier too: {b:?}");
    follower.done(&b);
    assert!(vb.open(ino).unwrap().keep_cache, "nothing new: the kernel keeps its pages");
    vb.release(ino).unwrap();

    // Names: a create and a rename on A come as entries.
    let g = mkfile(&va, ROOT_INO, "g", b"first");
    va.fsync(g, false).unwrap();
    va.rename(ROOT_INO, b"g", ROOT_INO, b"h", Default::default()).unwrap();
    let batch = follow_until(&follower, g);
    for name in [&b"g"[..], b"h"] {
        assert!(batch.entries.contains(&(ROOT_INO, name.to_vec())), "entry {} in {batch:?}", String::from_utf8_lossy(name));
    }
    assert_eq!(read_all(&vb, vb.resolve(b"h").unwrap()), b"first");
    vb.release(ino).unwrap();
    vb.close().unwrap();
    va.close().unwrap();
}

/// Calls `f.next` until a batch satisfies `done`; the batches' union
/// (panics after `limit`: a generous deadline, not a speed).
fn follow_until_batch(f: &ChangeFollower, limit: Duration, done: impl Fn(&ChangeBatch) -> bool) -> ChangeBatch {
    let t = std::time::Instant::now();
    let mut all = ChangeBatch::default();
    while !done(&all) {
        assert!(t.elapsed() < limit, "the follower did not deliver what was awaited within {limit:?}: {all:?}");
        let b = f.next(Duration::from_millis(100)).unwrap();
        f.done(&b);
        all.all |= b.all;
        all.inodes.extend(b.inodes);
        all.entries.extend(b.entries);
    }
    all
}

/// A follower whose cursor a trim of the change log overtook (B read
/// nothing while A changed files and the log was trimmed past B's place,
/// docs/shared-volume.md §6) cannot know what it missed: its batch says
/// `all`, names the root and every inode B holds state of, and B's open
/// file then reads A's bytes.
#[test]
fn a_follower_overtaken_by_a_trim_of_the_log_drops_everything() {
    let url = fresh_url("trim");
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let cfg = pg_init_cloud(a.path(), &url);
    let va = Volume::load(a.path(), pg_opts()).unwrap();
    let old = random_bytes(70, 100_000);
    let f = mkfile(&va, ROOT_INO, "f", &old);
    va.fsync(f, false).unwrap();
    let mut ro = pg_opts();
    ro.read_only = true;
    let vb = mount_elsewhere(&b.path().join("cache"), &url, ro);
    let follower = vb.follow_changes().unwrap().expect("followed");
    vb.open(f).unwrap();
    assert!(read_open(&vb, f, old.len()) == old);
    let first = follower.next(Duration::ZERO).unwrap();
    assert!(!first.all, "nothing trimmed yet: {first:?}");
    follower.done(&first);
    let start = follower.cursor();

    // A changes f and makes more files; then the log loses every row but
    // the newest (what `trim_changes` does to rows past their age), and the
    // mark of how far it was trimmed moves past B's cursor.
    let new = random_bytes(71, old.len());
    va.open(f).unwrap();
    va.write(f, 0, &new).unwrap();
    va.close_commit(f).unwrap();
    va.release(f).unwrap();
    for i in 0..3 {
        let g = mkfile(&va, ROOT_INO, &format!("g{i}"), b"more");
        va.fsync(g, false).unwrap();
    }
    let schema = format!("cairn_{}", cfg.volume_id);
    pg_query(&format!(
        "WITH d AS (DELETE FROM {schema}.changes WHERE seq < (SELECT MAX(seq) FROM {schema}.changes) RETURNING seq) \
         INSERT INTO {schema}.info(key, value) SELECT 'changes_trimmed', MAX(seq) FROM d \
         ON CONFLICT (key) DO UPDATE SET value = GREATEST({schema}.info.value, excluded.value)"
    ));
    let trimmed: u64 = pg_query(&format!("SELECT value FROM {schema}.info WHERE key = 'changes_trimmed'")).trim().parse().unwrap();
    assert!(trimmed > start, "the trim did not pass B's cursor ({trimmed} <= {start}): the test did not test");

    let batch = follow_until_batch(&follower, Duration::from_secs(60), |b| b.all);
    assert!(batch.inodes.contains(&ROOT_INO) && batch.inodes.contains(&f), "an overtaken cursor names the root and B's open file: {batch:?}");
    let got = read_open(&vb, f, new.len());
    assert!(got == new, "B's open handle still reads the old bytes after the follower dropped everything");
    // Caught up: the next batches are not `all` again.
    let next = follower.next(Duration::ZERO).unwrap();
    assert!(!next.all, "a follower past the trim still says all: {next:?}");
    vb.release(f).unwrap();
    vb.close().unwrap();
    va.close().unwrap();
}

/// A change whose notice never comes (a row written without `NOTIFY`,
/// as when the listener lost its connection at that moment) still reaches
/// the follower: the poll reads the log every FOLLOW_POLL without a
/// notice, and drops B's state of the inode.
#[test]
fn a_change_without_a_notice_is_found_by_the_poll() {
    let url = fresh_url("poll");
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let cfg = pg_init_cloud(a.path(), &url);
    let va = Volume::load(a.path(), pg_opts()).unwrap();
    let f = mkfile(&va, ROOT_INO, "f", b"some bytes");
    va.fsync(f, false).unwrap();
    let mut ro = pg_opts();
    ro.read_only = true;
    let vb = mount_elsewhere(&b.path().join("cache"), &url, ro);
    let follower = vb.follow_changes().unwrap().expect("followed");
    // What committed before the follower began is read by its first call.
    follower.done(&follower.next(Duration::ZERO).unwrap());
    let before = follower.cursor();
    // A change row with no notice (no pg_notify), for f.
    pg_query(&format!("INSERT INTO cairn_{}.changes(kind, ino) VALUES (0, {f})", cfg.volume_id));
    let batch = follow_until_batch(&follower, Duration::from_secs(60), |b| b.inodes.contains(&f));
    assert!(!batch.all);
    assert!(follower.cursor() > before, "the cursor did not move past the polled row");
    vb.close().unwrap();
    va.close().unwrap();
}

/// A feed whose every wait fails, as a listener that lost its connection
/// and cannot reconnect does.
struct DeadFeed(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl cairn_meta::ChangeFeed for DeadFeed {
    fn wait(&mut self, _: Duration) -> cairn_meta::Result<bool> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Err(cairn_meta::Error::io("the listener's connection is gone (test)"))
    }
}

/// Without a listener (LISTEN refused when the follower starts, or a feed
/// whose every wait fails) the follower still delivers another machine's
/// commits, by its poll of the change log (docs/shared-volume.md §6): B's
/// open file reads A's rewrite without ever being notified.
#[test]
fn a_follower_without_a_listener_still_delivers_changes_by_its_poll() {
    let url = fresh_url("nolisten");
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    pg_init_cloud(a.path(), &url);
    let va = Volume::load(a.path(), pg_opts()).unwrap();
    let old = random_bytes(80, 50_000);
    let f = mkfile(&va, ROOT_INO, "f", &old);
    va.fsync(f, false).unwrap();
    let mut ro = pg_opts();
    ro.read_only = true;
    let vb = mount_elsewhere(&b.path().join("cache"), &url, ro);
    vb.open(f).unwrap();
    assert!(read_open(&vb, f, old.len()) == old);

    let waits = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    for (i, what) in ["LISTEN refused", "every wait failing"].into_iter().enumerate() {
        let follower = if i == 0 {
            vb.follow_changes_with(|_| Err(cairn_meta::Error::io("LISTEN refused (test)")))
        } else {
            let w = waits.clone();
            vb.follow_changes_with(move |_| Ok(Some(Box::new(DeadFeed(w)))))
        }
        .unwrap()
        .unwrap_or_else(|| panic!("{what}: no follower"));
        follower.done(&follower.next(Duration::ZERO).unwrap());
        // A: same size, other bytes, closed (committed for other machines).
        let new = random_bytes(81 + i as u64, old.len());
        va.open(f).unwrap();
        va.write(f, 0, &new).unwrap();
        va.close_commit(f).unwrap();
        va.release(f).unwrap();
        let batch = follow_until_batch(&follower, Duration::from_secs(60), |b| b.inodes.contains(&f));
        assert!(!batch.all, "{what}: {batch:?}");
        assert_eq!(follower.notices(), 0, "{what}: no notice can have woken this follower");
        let got = read_open(&vb, f, new.len());
        assert!(got == new, "{what}: B's open file still reads the old bytes after the poll delivered A's rewrite");
    }
    assert!(waits.load(std::sync::atomic::Ordering::Relaxed) > 0, "the failing feed was never waited on: the test did not test it");
    vb.release(f).unwrap();
    vb.close().unwrap();
    va.close().unwrap();
}
