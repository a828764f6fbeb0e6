//! Cloud volumes in process: a "bucket" (an in-memory store, or one that
//! misbehaves) behind the cache, metadata versions and the lease. The same
//! paths run against a real S3 server in the e2e tests.

use crate::common::*;
use cairn_backend::{Backend, RetryPolicy, Retrying};
use cairn_engine::cache::disk::Durability;
use cairn_engine::cloud::{self, versions, CloudOptions};
use cairn_engine::*;
use cairn_testing::{FaultPlan, FaultyBackend, MemoryBackend};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub(crate) const URL: &str = "s3://bucket/vol";

pub(crate) fn init_in(dir: &Path, b: &Arc<dyn Backend>, pass: Option<&str>) {
    init_cloud(
        dir,
        URL,
        None,
        None,
        &InitOptions {
            chunker: small_chunks(),
            pack_target: Some(1 << 20),
            backend: Some(InjectedBackend(b.clone())),
            passphrase: pass.map(|p| zeroize::Zeroizing::new(p.as_bytes().to_vec())),
            kdf: Some(KdfParams { m_kib: 64, t: 1, p: 1 }),
            ..Default::default()
        },
    )
    .unwrap();
}

pub(crate) fn opts(b: &Arc<dyn Backend>, durability: Durability) -> OpenOptions {
    OpenOptions {
        backend: Some(InjectedBackend(b.clone())),
        cloud: CloudOptions { cache_bytes: 64 << 20, durability, meta_interval: Duration::from_millis(200), gc_interval: None, ..Default::default() },
        ..Default::default()
    }
}

pub(crate) fn open_in(dir: &Path, b: &Arc<dyn Backend>, durability: Durability) -> Arc<Volume> {
    cloud::attach(dir, URL, None, None, Some(&InjectedBackend(b.clone()))).unwrap();
    Volume::load(dir, opts(b, durability)).unwrap()
}

pub(crate) fn write_tree(v: &Volume, n: u64) -> Vec<(String, Vec<u8>)> {
    let d = v.mkdir(ROOT_INO, b"dir", 0o755, root()).unwrap().ino;
    (0..n)
        .map(|i| {
            let data = random_bytes(i, 3_000 + 7_919 * i as usize);
            let name = format!("f{i}");
            mkfile(v, if i % 2 == 0 { ROOT_INO } else { d }, &name, &data);
            (if i % 2 == 0 { name } else { format!("dir/{name}") }, data)
        })
        .collect()
}

pub(crate) fn lookup_path(v: &Volume, path: &str) -> Ino {
    let mut ino = ROOT_INO;
    for part in path.split('/') {
        ino = v.lookup(ino, part.as_bytes()).unwrap_or_else(|e| panic!("{path}: {e}")).ino;
    }
    ino
}

pub(crate) fn check_tree(v: &Volume, tree: &[(String, Vec<u8>)]) {
    for (path, data) in tree {
        let ino = lookup_path(v, path);
        assert!(&read_all(v, ino) == data, "{path} differs");
    }
}

/// A volume written on one machine opens on another from the bucket alone
/// (a fresh directory, no cache, no metadata), byte for byte, encrypted.
#[test]
fn a_volume_mounts_from_the_bucket_alone() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    init_in(a.path(), &bucket, Some("pw"));
    let mut o = opts(&bucket, Durability::Local);
    o.passphrase = Some(zeroize::Zeroizing::new(b"pw".to_vec()));
    let v = Volume::load(a.path(), o.clone()).unwrap();
    let tree = write_tree(&v, 20);
    v.close().unwrap();
    drop(v);
    assert!(bucket.list("lease").unwrap().is_empty(), "unmount gives the lease back");
    let all = versions::list(bucket.as_ref()).unwrap();
    assert!(all.len() >= 2, "versions: {all:?}");
    cloud::attach(b.path().join("x").as_path(), URL, None, None, Some(&InjectedBackend(bucket.clone()))).unwrap();
    let v = Volume::load(&b.path().join("x"), o).unwrap();
    check_tree(&v, &tree);
    let rep = maintenance::fsck(&v, true, &maintenance::NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "fsck: {:?}", rep.errors);
    v.close().unwrap();
    // No plaintext in the bucket: file bytes never appear in any object.
    for o in bucket.list("").unwrap() {
        let bytes = bucket.get(&o.name).unwrap();
        assert!(!bytes.windows(32).any(|w| w == &tree[3].1[100..132]), "{} holds plaintext", o.name);
    }
}

/// `local` durability: a crash (no unmount, nothing shipped at the end)
/// loses nothing after a remount on the same machine, and the remount
/// ships a base that lets another machine see everything too.
#[test]
fn local_durability_survives_a_crash_on_the_same_machine() {
    let a = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    init_in(a.path(), &bucket, None);
    let mut o = opts(&bucket, Durability::Local);
    o.cloud.meta_interval = Duration::from_secs(3600);
    let v = Volume::load(a.path(), o.clone()).unwrap();
    let tree = write_tree(&v, 12);
    v.flush_now().unwrap();
    v.simulate_crash();
    let v = Volume::load(a.path(), o.clone()).unwrap();
    check_tree(&v, &tree);
    v.close().unwrap();
    drop(v);
    let all = versions::list(bucket.as_ref()).unwrap();
    assert!(all.iter().any(|x| x.version > 1 && x.kind == versions::Kind::Base), "a crash is followed by a base: {all:?}");
    let b = tempfile::tempdir().unwrap();
    let v = open_in(b.path(), &bucket, Durability::Local);
    check_tree(&v, &tree);
    v.close().unwrap();
}

/// `remote` durability: once fsync returns, a machine that never saw the
/// volume finds the file in the bucket, even though the writer crashed.
#[test]
fn remote_durability_puts_fsynced_data_in_the_bucket() {
    let a = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    init_in(a.path(), &bucket, None);
    let mut o = opts(&bucket, Durability::Remote);
    o.cloud.meta_interval = Duration::from_secs(3600);
    let v = Volume::load(a.path(), o).unwrap();
    let data = random_bytes(9, 300_000);
    let ino = mkfile(&v, ROOT_INO, "synced", &data);
    v.fsync(ino, false).unwrap();
    let _unsynced = mkfile(&v, ROOT_INO, "later", b"not fsync'd");
    v.simulate_crash();
    // The crashed mount's lease is still there: the other machine takes it
    // over as an expired one would be (here: forced, as the test cannot wait
    // two minutes).
    let b = tempfile::tempdir().unwrap();
    cloud::attach(b.path(), URL, None, None, Some(&InjectedBackend(bucket.clone()))).unwrap();
    let mut o2 = opts(&bucket, Durability::Remote);
    let e = Volume::load(b.path(), o2.clone()).map(|_| ()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Busy, "{e}");
    assert!(e.to_string().contains("mounted read-write by"), "{e}");
    bucket.delete(cloud::lease::OBJECT).unwrap();
    o2.cloud.force = true;
    let v = Volume::load(b.path(), o2).unwrap();
    let got = v.lookup(ROOT_INO, b"synced").unwrap().ino;
    assert!(read_all(&v, got) == data, "fsync'd file differs on the other machine");
    v.close().unwrap();
}

/// A second read-write open of the same volume from another directory is
/// refused while the first holds the lease, naming the holder.
#[test]
fn a_second_read_write_mount_is_refused() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    init_in(a.path(), &bucket, None);
    let v = Volume::load(a.path(), opts(&bucket, Durability::Local)).unwrap();
    cloud::attach(b.path(), URL, None, None, Some(&InjectedBackend(bucket.clone()))).unwrap();
    let e = Volume::load(b.path(), opts(&bucket, Durability::Local)).map(|_| ()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Busy);
    let msg = e.to_string();
    assert!(msg.contains(&cloud::lease::hostname()) && msg.contains(&std::process::id().to_string()), "{msg}");
    // Read-only is allowed.
    let mut ro = opts(&bucket, Durability::Local);
    ro.read_only = true;
    let r = Volume::load(b.path(), ro).unwrap();
    r.close().unwrap();
    v.close().unwrap();
}

/// 10% of requests failing, timing out or losing their replies: writers,
/// readers and a mount from the bucket alone see no error.
#[test]
fn a_tenth_of_requests_failing_gives_no_error() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let faulty = Arc::new(Retrying::new(FaultyBackend::new(MemoryBackend::new(), FaultPlan::flaky(0.10, Duration::from_millis(3)), 5), RetryPolicy::quick()));
    let bucket: Arc<dyn Backend> = faulty.clone();
    init_in(a.path(), &bucket, None);
    let v = Volume::load(a.path(), opts(&bucket, Durability::Local)).unwrap();
    let tree = write_tree(&v, 80);
    v.close().unwrap();
    drop(v);
    let v = open_in(b.path(), &bucket, Durability::Remote);
    check_tree(&v, &tree);
    let extra = random_bytes(77, 200_000);
    let ino = mkfile(&v, ROOT_INO, "extra", &extra);
    v.fsync(ino, false).unwrap();
    v.close().unwrap();
    let s = faulty.inner().stats();
    assert!(s.failed + s.timed_out + s.lost_replies >= 8, "too few faults to prove anything: {s:?}");
}

/// The bucket down: writes go on into the journal and the outbox until the
/// cache bound, then block; back up, everything uploads by itself and the
/// data is identical from the bucket alone.
#[test]
fn an_outage_blocks_writers_then_resumes() {
    let a = tempfile::tempdir().unwrap();
    let faulty = Arc::new(FaultyBackend::new(MemoryBackend::new(), FaultPlan::none(), 1));
    let bucket: Arc<dyn Backend> = Arc::new(Retrying::new(faulty.clone(), RetryPolicy::quick()));
    init_in(a.path(), &bucket, None);
    let mut o = opts(&bucket, Durability::Local);
    o.cloud.cache_bytes = 4 << 20;
    o.journal_limit = 4 << 20;
    o.flush_bytes = 1 << 20;
    let v = Volume::load(a.path(), o).unwrap();
    faulty.set_down(true);
    let v2 = v.clone();
    let writer = std::thread::spawn(move || {
        let mut tree = Vec::new();
        for i in 0..24u64 {
            let data = random_bytes(1000 + i, 1 << 20);
            mkfile(&v2, ROOT_INO, &format!("big{i}"), &data);
            tree.push((format!("big{i}"), data));
        }
        tree
    });
    std::thread::sleep(Duration::from_secs(3));
    assert!(!writer.is_finished(), "24 MiB of writes finished with the bucket down and 8 MiB of room");
    let stats = maintenance::stats(&v).unwrap().cache.unwrap();
    assert!(stats.dirty_bytes > 0, "{stats:?}");
    faulty.set_down(false);
    let tree = writer.join().unwrap();
    v.close().unwrap();
    drop(v);
    let b = tempfile::tempdir().unwrap();
    let v = open_in(b.path(), &bucket, Durability::Local);
    check_tree(&v, &tree);
    v.close().unwrap();
    assert!(faulty.stats().refused_while_down > 0);
}

/// A flipped byte in a pack in the bucket: the read fails with Corrupt
/// (EIO at the mount) and the message names the pack.
#[test]
fn a_flipped_byte_in_the_bucket_names_the_pack() {
    let a = tempfile::tempdir().unwrap();
    let mem = Arc::new(MemoryBackend::new());
    let bucket: Arc<dyn Backend> = mem.clone();
    init_in(a.path(), &bucket, None);
    let v = Volume::load(a.path(), opts(&bucket, Durability::Local)).unwrap();
    let data = random_bytes(5, 100_000);
    mkfile(&v, ROOT_INO, "f", &data);
    v.close().unwrap();
    drop(v);
    let pack = bucket.list("packs/").unwrap().into_iter().next().expect("a pack").name;
    mem.tamper(&pack, |b| b[200] ^= 0x40);
    let b = tempfile::tempdir().unwrap();
    let v = open_in(b.path(), &bucket, Durability::Local);
    let ino = v.lookup(ROOT_INO, b"f").unwrap().ino;
    v.open(ino).unwrap();
    let e = v.read(ino, 0, 100_000).map(|_| ()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    assert!(e.to_string().contains(pack.rsplit('/').next().unwrap()), "{e}");
    v.release(ino).unwrap();
    v.close().unwrap();
}

/// `meta restore`: the state of an older version becomes the latest, opens
/// consistently (fsck clean) and can itself be undone.
#[test]
fn metadata_rolls_back_to_an_older_version() {
    let a = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    init_in(a.path(), &bucket, None);
    let v = Volume::load(a.path(), opts(&bucket, Durability::Local)).unwrap();
    let tree = write_tree(&v, 6);
    v.close().unwrap();
    drop(v);
    let before = versions::list(bucket.as_ref()).unwrap().last().unwrap().version;
    let v = Volume::load(a.path(), opts(&bucket, Durability::Local)).unwrap();
    let gone = lookup_path(&v, &tree[0].0);
    v.unlink(ROOT_INO, tree[0].0.as_bytes()).unwrap();
    mkfile(&v, ROOT_INO, "newer", b"after the version we go back to");
    let _ = gone;
    v.close().unwrap();
    drop(v);
    let keys = VolumeConfig::parse(&bucket.get("config").unwrap()).unwrap().keys(None).unwrap();
    let restored = cloud::restore(bucket.as_ref(), &keys, URL, before).unwrap();
    assert!(restored > before);
    // The old directory is clean, so it takes the bucket's new state.
    let v = Volume::load(a.path(), opts(&bucket, Durability::Local)).unwrap();
    check_tree(&v, &tree);
    assert_eq!(v.lookup(ROOT_INO, b"newer").map(|_| ()).unwrap_err().kind(), ErrorKind::NotFound);
    let rep = maintenance::fsck(&v, true, &maintenance::NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "fsck: {:?}", rep.errors);
    v.close().unwrap();
    assert!(cloud::restore(bucket.as_ref(), &keys, URL, 999).is_err(), "a version that does not exist");
}

/// Metadata deltas follow the rows changed, not the database: a thousand
/// files, then one rename, ships a small delta.
#[test]
fn a_small_change_ships_a_small_delta() {
    let a = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    init_in(a.path(), &bucket, None);
    let mut o = opts(&bucket, Durability::Remote);
    o.cloud.meta_interval = Duration::from_secs(3600);
    let v = Volume::load(a.path(), o).unwrap();
    for i in 0..1000 {
        v.create(ROOT_INO, format!("file-with-a-longish-name-{i}").as_bytes(), FileKind::File, 0o644, 0, root()).unwrap();
    }
    v.sync().unwrap();
    let big = versions::list(bucket.as_ref()).unwrap().last().unwrap().clone();
    v.rename(ROOT_INO, b"file-with-a-longish-name-7", ROOT_INO, b"renamed", RenameFlags::default()).unwrap();
    v.sync().unwrap();
    let small = versions::list(bucket.as_ref()).unwrap().last().unwrap().clone();
    assert_eq!(small.version, big.version + 1);
    assert_eq!(small.kind, versions::Kind::Delta);
    assert!(small.size < 1024 && small.size * 20 < big.size, "rename delta {} bytes vs {} for 1,000 creates", small.size, big.size);
    v.close().unwrap();
}

/// A tampered bucket's trash object bigger than `MAX_TRASH_OBJECT` is
/// refused by its listed size, not read into memory: fsck (which reads the
/// trash to tell trashed packs from orphans) warns and goes on, and a
/// restore refuses to run on it.
#[test]
fn an_oversized_trash_object_is_refused_unread() {
    let a = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    init_in(a.path(), &bucket, None);
    let v = Volume::load(a.path(), opts(&bucket, Durability::Local)).unwrap();
    mkfile(&v, ROOT_INO, "a", &random_bytes(42, 100_000));
    v.close().unwrap();
    drop(v);
    let version = versions::list(bucket.as_ref()).unwrap().last().unwrap().version;
    let huge = format!("{}0000000000000001-deadbeef", cloud::TRASH_PREFIX);
    let mut body = b"[\"packs/x\"".to_vec();
    body.resize(cloud::MAX_TRASH_OBJECT as usize + 1, b' ');
    body.push(b']');
    bucket.put(&huge, &body).unwrap();
    // A pack no metadata names: fsck looks in the trash for it.
    bucket.put("packs/ff/stray", b"not a pack").unwrap();
    let v = Volume::load(a.path(), opts(&bucket, Durability::Local)).unwrap();
    let rep = maintenance::fsck(&v, false, &maintenance::NoProgress).unwrap();
    assert!(rep.warnings.iter().any(|w| w.contains(&huge) && w.contains("not read")), "{:?}", rep.warnings);
    v.close().unwrap();
    drop(v);
    let keys = VolumeConfig::parse(&bucket.get("config").unwrap()).unwrap().keys(None).unwrap();
    let e = cloud::restore(bucket.as_ref(), &keys, URL, version).expect_err("a restore read an oversized trash object");
    assert!(e.to_string().contains("not read"), "{e}");
}

/// gc in a bucket (rule 3): a pack that no longer holds live data is
/// trashed, not deleted, while an older kept version names it, so that
/// version can still be restored; once enough newer bases pruned every
/// such version, the pack goes.
#[test]
fn gc_in_a_bucket_keeps_packs_older_versions_name() {
    let a = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    init_in(a.path(), &bucket, None);
    let v = Volume::load(a.path(), opts(&bucket, Durability::Local)).unwrap();
    let data = random_bytes(41, 400_000);
    mkfile(&v, ROOT_INO, "a", &data);
    v.close().unwrap();
    drop(v);
    let with_a = versions::list(bucket.as_ref()).unwrap().last().unwrap().version;
    let packs_with_a = bucket.list("packs/").unwrap();
    assert!(!packs_with_a.is_empty());
    let v = Volume::load(a.path(), opts(&bucket, Durability::Local)).unwrap();
    v.unlink(ROOT_INO, b"a").unwrap();
    let rep = maintenance::gc(&v, 0.5, &maintenance::NoProgress).unwrap();
    assert!(rep.packs_deleted >= 1, "{rep:?}");
    v.close().unwrap();
    drop(v);
    assert_eq!(bucket.list("packs/").unwrap().len(), packs_with_a.len(), "a pack went while version {with_a} names it");
    assert!(!bucket.list(cloud::TRASH_PREFIX).unwrap().is_empty());
    // The old version restores, and its pack is no longer trash.
    let keys = VolumeConfig::parse(&bucket.get("config").unwrap()).unwrap().keys(None).unwrap();
    cloud::restore(bucket.as_ref(), &keys, URL, with_a).unwrap();
    assert!(bucket.list(cloud::TRASH_PREFIX).unwrap().is_empty(), "restored packs stay in the trash");
    let v = Volume::load(a.path(), opts(&bucket, Durability::Local)).unwrap();
    let ino = v.lookup(ROOT_INO, b"a").unwrap().ino;
    assert!(read_all(&v, ino) == data);
    // Delete again, gc, and ship bases until the versions naming the pack are pruned.
    v.unlink(ROOT_INO, b"a").unwrap();
    maintenance::gc(&v, 0.5, &maintenance::NoProgress).unwrap();
    assert_eq!(bucket.list("packs/").unwrap().len(), packs_with_a.len());
    for _ in 0..4 {
        v.ship_base_now().unwrap();
    }
    assert!(bucket.list(cloud::TRASH_PREFIX).unwrap().is_empty(), "trash left after the versions naming it were pruned");
    let left: Vec<String> = bucket.list("packs/").unwrap().into_iter().map(|o| o.name).collect();
    for p in &packs_with_a {
        assert!(!left.contains(&p.name), "{} survived", p.name);
    }
    assert!(versions::list(bucket.as_ref()).unwrap().iter().all(|x| x.version > with_a));
    let rep = maintenance::fsck(&v, true, &maintenance::NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "fsck: {:?}", rep.errors);
    v.close().unwrap();
}

/// The referee of the bill in process (as the counting proxy is in the e2e
/// tests): counts the calls that reach the bucket, by the kind a store
/// bills, independently of the engine's meter.
#[derive(Default)]
struct Referee {
    inner: MemoryBackend,
    seen: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
}

impl Referee {
    fn saw(&self, kind: &str) {
        *self.seen.lock().unwrap().entry(kind.to_string()).or_default() += 1;
    }
    fn seen(&self) -> std::collections::BTreeMap<String, u64> {
        self.seen.lock().unwrap().clone()
    }
}

impl Backend for Referee {
    fn put(&self, name: &str, data: &[u8]) -> cairn_backend::Result<()> {
        self.saw("PUT");
        self.inner.put(name, data)
    }
    fn put_if_absent(&self, name: &str, data: &[u8]) -> cairn_backend::Result<()> {
        self.saw("PUT");
        self.inner.put_if_absent(name, data)
    }
    fn get_range(&self, name: &str, offset: u64, len: u64) -> cairn_backend::Result<Vec<u8>> {
        self.saw("GET");
        self.inner.get_range(name, offset, len)
    }
    fn get(&self, name: &str) -> cairn_backend::Result<Vec<u8>> {
        self.saw("GET");
        self.inner.get(name)
    }
    fn size(&self, name: &str) -> cairn_backend::Result<u64> {
        self.saw("HEAD");
        self.inner.size(name)
    }
    fn delete(&self, name: &str) -> cairn_backend::Result<()> {
        self.saw("DELETE");
        self.inner.delete(name)
    }
    fn list(&self, prefix: &str) -> cairn_backend::Result<Vec<cairn_backend::ObjectInfo>> {
        self.saw("LIST");
        self.inner.list(prefix)
    }
    fn capabilities(&self) -> cairn_backend::Capabilities {
        self.inner.capabilities()
    }
    fn sync(&self) -> cairn_backend::Result<()> {
        self.inner.sync()
    }
    fn describe(&self) -> String {
        "referee".into()
    }
}

/// Requests by kind in usage rows (kinds with none left out, as the referee).
fn requests_of(rows: &[meta::BillRow]) -> std::collections::BTreeMap<String, u64> {
    let mut m = cost::price(rows, &cost::Prices::aws(), None).requests;
    m.retain(|_, n| *n > 0);
    m
}

/// The bill counts every request the bucket served (creation, mounts,
/// closes, read-only looks), keeps it across a remount, and ships it: a
/// machine that never saw the volume reads the same bill from the bucket
/// (the metadata's table, and the bill objects of mounts for what they
/// counted after their last version or without any: issue 25).
#[test]
fn the_bill_counts_every_request_persists_and_ships() {
    use cairn_backend::{Metered, RequestKind as K, Subsystem as S};
    let a = tempfile::tempdir().unwrap();
    let referee = Arc::new(Referee::default());
    let bucket: Arc<dyn Backend> = Arc::new(Metered::new(referee.clone()));
    init_in(a.path(), &bucket, None);
    let pending = a.path().join(cost::PENDING_FILE);
    assert!(pending.exists(), "init's requests wait for the first mount");
    let o = opts(&bucket, Durability::Local);
    let v = Volume::load(a.path(), o.clone()).unwrap();
    assert!(!pending.exists(), "the first read-write open takes init's requests into the table");
    let tree = write_tree(&v, 12);
    v.flush_now().unwrap();
    std::thread::sleep(Duration::from_millis(1_200)); // rounds ship; stored bytes accrue
    v.close().unwrap();
    drop(v);

    // Closed: the table and the pending file hold exactly what the bucket saw.
    let seen = referee.seen();
    let ro = Volume::load(a.path(), OpenOptions { read_only: true, ..o.clone() }).unwrap();
    let rows = ro.bill_usage(None, false).unwrap();
    assert_eq!(requests_of(&rows), seen, "the bill against the referee");
    let bill = cost::price(&rows, &cost::Prices::aws(), None);
    let sub = |s: S, k: K| bill.subsystems.iter().find(|x| x.subsystem == s.name()).unwrap().requests[k.name()];
    assert!(sub(S::Write, K::Put) >= 1, "pack uploads are the writes': {bill:#?}");
    assert!(sub(S::Metadata, K::Put) >= 2, "metadata versions and the lease: {bill:#?}");
    assert!(sub(S::Other, K::Get) >= 1, "the config: {bill:#?}");
    assert_eq!(sub(S::ReadMiss, K::Get) + sub(S::Prefetch, K::Get) + sub(S::Gc, K::Get), 0, "nothing was read back");
    assert!(bill.bytes_up > 0 && bill.live_byte_seconds > 0, "{bill:#?}");
    assert!(bill.total > 0.0);
    ro.close().unwrap();
    drop(ro);
    assert!(!pending.exists(), "the read-only look's own requests go to the bucket, not the pending file");
    assert!(!bucket.list(cost::BILLS_PREFIX).unwrap().is_empty(), "the read-only look's bill object");

    // A remount keeps the bill and takes the pending requests in.
    let before = referee.seen();
    let v = Volume::load(a.path(), o.clone()).unwrap();
    assert!(!pending.exists());
    let now = requests_of(&v.bill_usage(None, true).unwrap());
    for (k, n) in &before {
        assert!(now.get(k).copied().unwrap_or(0) >= *n, "{k}: {now:?} against {before:?}");
    }
    mkfile(&v, ROOT_INO, "more", &random_bytes(77, 50_000));
    v.close().unwrap();
    drop(v);

    // Another machine: the metadata's table and the bill objects hold
    // exactly what the bucket served.
    assert!(!pending.exists());
    let seen = referee.seen();
    let b = tempfile::tempdir().unwrap();
    cloud::attach(b.path(), URL, None, None, Some(&InjectedBackend(bucket.clone()))).unwrap();
    let vb = Volume::load(b.path(), OpenOptions { read_only: true, ..o.clone() }).unwrap();
    let shipped = vb.bill_usage(None, false).unwrap();
    assert_eq!(requests_of(&shipped), seen, "the bill from the bucket alone against the referee");
    // b's reads are read misses, in b's bill object once it closes.
    check_tree(&vb, &tree);
    vb.close().unwrap();
    drop(vb);
    assert!(!b.path().join(cost::PENDING_FILE).exists());
    let seen = referee.seen();
    let c = tempfile::tempdir().unwrap();
    cloud::attach(c.path(), URL, None, None, Some(&InjectedBackend(bucket.clone()))).unwrap();
    let vc = Volume::load(c.path(), OpenOptions { read_only: true, ..o.clone() }).unwrap();
    let rows = vc.bill_usage(None, false).unwrap();
    assert_eq!(requests_of(&rows), seen, "b's reads are in the bill from the bucket alone");
    let later = cost::price(&rows, &cost::Prices::aws(), None);
    let misses = later.subsystems.iter().find(|x| x.subsystem == "read_miss").unwrap();
    assert!(misses.requests["GET"] > 0 && misses.bytes_down > 0, "{later:#?}");
    vc.close().unwrap();
}

/// A mount that only reads (issue 25): its GETs reach the bucket in its
/// bill object at unmount, so `cost` from a fresh directory counts them
/// (it once counted 4 GETs where the bucket served 45). A second look
/// rewrites nothing of the first's (bill objects add up, per mount).
#[test]
fn a_reading_mounts_bill_reaches_the_bucket() {
    use cairn_backend::Metered;
    let a = tempfile::tempdir().unwrap();
    let referee = Arc::new(Referee::default());
    let bucket: Arc<dyn Backend> = Arc::new(Metered::new(referee.clone()));
    init_in(a.path(), &bucket, None);
    let o = opts(&bucket, Durability::Local);
    let v = Volume::load(a.path(), o.clone()).unwrap();
    let tree = write_tree(&v, 10);
    v.close().unwrap();
    drop(v);
    let gets_of = |rows: &[meta::BillRow]| requests_of(rows).get("GET").copied().unwrap_or(0);
    let before = referee.seen().get("GET").copied().unwrap_or(0);
    for _ in 0..2 {
        let r = tempfile::tempdir().unwrap();
        cloud::attach(r.path(), URL, None, None, Some(&InjectedBackend(bucket.clone()))).unwrap();
        let vr = Volume::load(r.path(), OpenOptions { read_only: true, ..o.clone() }).unwrap();
        check_tree(&vr, &tree);
        vr.close().unwrap();
    }
    let served = referee.seen().get("GET").copied().unwrap_or(0) - before;
    assert!(served >= 10, "{served}");
    let seen = referee.seen();
    let fresh = tempfile::tempdir().unwrap();
    cloud::attach(fresh.path(), URL, None, None, Some(&InjectedBackend(bucket.clone()))).unwrap();
    let vf = Volume::load(fresh.path(), OpenOptions { read_only: true, ..o.clone() }).unwrap();
    let rows = vf.bill_usage(None, false).unwrap();
    assert_eq!(gets_of(&rows), seen["GET"], "GETs in the bill from a fresh directory against the bucket's");
    assert_eq!(requests_of(&rows), seen);
    vf.close().unwrap();
}

/// A volume whose database has no bill table (made before the bill) gets
/// one at its first read-write open, and ships a base so that no delta
/// names a table the bucket's versions lack.
#[test]
fn a_volume_from_before_the_bill_ships_a_base_with_its_table() {
    let a = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn Backend> = Arc::new(cairn_backend::Metered::new(MemoryBackend::new()));
    init_in(a.path(), &bucket, None);
    {
        let c = rusqlite::Connection::open(a.path().join("meta.sqlite")).unwrap();
        c.execute_batch("DROP TABLE bill").unwrap();
    }
    let mut o = opts(&bucket, Durability::Local);
    o.cloud.meta_interval = Duration::from_secs(3600);
    let v = Volume::load(a.path(), o.clone()).unwrap();
    mkfile(&v, ROOT_INO, "f", b"hello");
    v.close().unwrap();
    drop(v);
    let all = versions::list(bucket.as_ref()).unwrap();
    assert_eq!(all.last().unwrap().kind, versions::Kind::Base, "{all:?}");
    let b = tempfile::tempdir().unwrap();
    let v = open_in(b.path(), &bucket, Durability::Local);
    let bill = cost::price(&v.bill_usage(None, true).unwrap(), &cost::Prices::aws(), None);
    assert!(bill.requests["PUT"] > 0, "{bill:#?}");
    v.close().unwrap();
}

/// A lease object deleted under a mount (issue 25): another machine then
/// mounts read-write; the first holder's next renewal finds the lease lost
/// (before its next round publishes anything), its publish fails and it
/// publishes nothing after, its status says `lease_lost` and its unmount
/// fails, while the new holder goes on.
#[test]
fn a_holder_whose_lease_was_deleted_publishes_nothing_more() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    init_in(a.path(), &bucket, None);
    let oa = opts(&bucket, Durability::Remote);
    let oa = OpenOptions { cloud: CloudOptions { lease_renew: Duration::from_millis(200), ..oa.cloud.clone() }, ..oa };
    let va = Volume::load(a.path(), oa).unwrap();
    let ino = mkfile(&va, ROOT_INO, "before", b"shipped while A held the lease");
    va.fsync(ino, false).unwrap();
    bucket.delete(cloud::lease::OBJECT).unwrap();
    cloud::attach(b.path(), URL, None, None, Some(&InjectedBackend(bucket.clone()))).unwrap();
    let vb = Volume::load(b.path(), opts(&bucket, Durability::Remote)).unwrap();
    let a_writer = cloud::LocalState::load(a.path()).unwrap().unwrap().writer_bytes();
    let published_by_a = || {
        let all = versions::list(bucket.as_ref()).unwrap();
        let heads = versions::headers(bucket.as_ref(), &all).unwrap();
        heads.iter().filter(|h| h.writer == a_writer).map(|h| h.version).collect::<Vec<_>>()
    };
    let before = published_by_a();
    // Written before A knows: its shipper's next round renews first, finds
    // the lease gone, and ships nothing.
    let ino = mkfile(&va, ROOT_INO, "after", b"written once B held the lease");
    let t = std::time::Instant::now();
    while va.status().health != "lease_lost" {
        assert!(t.elapsed() < Duration::from_secs(10), "A's renewals did not find its lease lost: {:?}", va.status());
        std::thread::sleep(Duration::from_millis(50));
    }
    let e = va.fsync(ino, false).unwrap_err();
    assert!(e.to_string().contains("lost the volume's lease"), "{e}");
    let e = va.create(ROOT_INO, b"later", FileKind::File, 0o644, 0, root()).map(|_| ()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ReadOnly, "{e}");
    std::thread::sleep(Duration::from_millis(600)); // shipper rounds
    assert_eq!(va.status().health, "lease_lost");
    // B goes on and publishes; A published nothing since B mounted.
    let ino = mkfile(&vb, ROOT_INO, "from-b", b"the new holder's file");
    vb.fsync(ino, false).unwrap();
    assert_eq!(published_by_a(), before, "A published after losing its lease");
    let e = va.close().unwrap_err();
    assert!(e.to_string().contains("lost the volume's lease"), "{e}");
    vb.close().unwrap();
    drop(vb);
    let c = tempfile::tempdir().unwrap();
    let vc = open_in(c.path(), &bucket, Durability::Local);
    assert!(vc.lookup(ROOT_INO, b"from-b").is_ok() && vc.lookup(ROOT_INO, b"before").is_ok());
    assert_eq!(vc.lookup(ROOT_INO, b"after").map(|_| ()).unwrap_err().kind(), ErrorKind::NotFound);
    vc.close().unwrap();
}

/// Each mount's bill object stays in the bucket after it ends (issue 25):
/// a read-write open folds the ended ones into `bills/folded.json`, and
/// the bill read from the bucket (what `cairn cost` adds to the table) is
/// the same before the fold, after it, and after a fold that stopped
/// between writing the folded object and deleting what it absorbed. A
/// crashed mount's object (never marked ended) is left as it is.
#[test]
fn ended_mounts_bill_objects_fold_into_one_and_the_bill_stays_the_same() {
    let a = tempfile::tempdir().unwrap();
    // Counted: a mount writes its bill object only when its requests are.
    let bucket: Arc<dyn Backend> = Arc::new(cairn_backend::Metered::new(MemoryBackend::new()));
    init_in(a.path(), &bucket, None);
    let o = opts(&bucket, Durability::Local);
    let v = Volume::load(a.path(), o.clone()).unwrap();
    let tree = write_tree(&v, 6);
    v.close().unwrap();
    drop(v);
    // Read-only mounts on other machines read the tree and end.
    let reader = || {
        let d = tempfile::tempdir().unwrap();
        cloud::attach(d.path(), URL, None, None, Some(&InjectedBackend(bucket.clone()))).unwrap();
        let ro = Volume::load(d.path(), OpenOptions { read_only: true, ..o.clone() }).unwrap();
        for (path, data) in &tree {
            assert_eq!(&read_all(&ro, lookup_path(&ro, path)), data);
        }
        ro.close().unwrap();
    };
    for _ in 0..3 {
        reader();
    }
    // A mount that crashed: its object was never marked ended.
    let crashed = "bills/00000000deadbeef.json";
    let row = r#"{"day":20000,"subsystem":"read_miss","item":"GET","requests":5,"bytes":4096}"#;
    bucket.put(crashed, format!(r#"{{"format":"cairn-bill-1","host":"gone","dir":"/x","written":1,"rows":[{row}]}}"#).as_bytes()).unwrap();
    let totals = || {
        let mut t = std::collections::BTreeMap::new();
        for r in cost::bucket_bills(bucket.as_ref(), None).unwrap() {
            let e = t.entry((r.day, r.subsystem, r.item)).or_insert((0u64, 0u64));
            e.0 += r.requests;
            e.1 += r.bytes;
        }
        t
    };
    let objects = || bucket.list(cost::BILLS_PREFIX).unwrap().into_iter().map(|o| o.name).collect::<Vec<_>>();
    let before = totals();
    let ended: Vec<(String, Vec<u8>)> = objects().into_iter().filter(|n| n != crashed).map(|n| (n.clone(), bucket.get(&n).unwrap())).collect();
    assert_eq!(ended.len(), 4, "the writer's and three readers' bill objects: {:?}", objects());
    assert!(before.values().map(|t| t.0).sum::<u64>() > 5, "{before:?}");

    assert_eq!(cost::fold_bills(bucket.as_ref(), None).unwrap(), 4);
    assert_eq!(objects(), vec![crashed.to_string(), cost::FOLDED_BILL.to_string()]);
    assert_eq!(totals(), before, "the fold changed the bill");
    // A fold that stopped after writing the folded object: its parts are
    // still there, and are not counted twice; the next fold deletes them.
    for (n, b) in &ended {
        bucket.put(n, b).unwrap();
    }
    assert_eq!(totals(), before, "a fold's leftovers were counted twice");
    assert_eq!(cost::fold_bills(bucket.as_ref(), None).unwrap(), 0);
    assert_eq!(objects(), vec![crashed.to_string(), cost::FOLDED_BILL.to_string()]);
    assert_eq!(totals(), before);

    // Another reader ends; the next read-write open folds it in.
    reader();
    let with_reader = totals();
    assert_ne!(with_reader, before);
    assert_eq!(objects().len(), 3);
    let v = Volume::load(a.path(), o.clone()).unwrap();
    assert_eq!(objects(), vec![crashed.to_string(), cost::FOLDED_BILL.to_string()], "the read-write open folded nothing");
    assert_eq!(totals(), with_reader);
    v.close().unwrap();
}

/// A publish costs no lease request (issue 25): the holder trusts its
/// lease for `lease::TRUSTED` after a renewal, so N fsyncs that each
/// publish a metadata version (remote durability) read nothing for the
/// metadata; they once read the lease object before each version.
#[test]
fn publishing_versions_costs_no_lease_reads() {
    use cairn_backend::{Metered, RequestKind as K, Subsystem as S};
    let a = tempfile::tempdir().unwrap();
    let metered = Arc::new(Metered::new(MemoryBackend::new()));
    let bucket: Arc<dyn Backend> = metered.clone();
    init_in(a.path(), &bucket, None);
    let v = Volume::load(a.path(), opts(&bucket, Durability::Remote)).unwrap();
    let meter = Metered::meter(&*metered).clone();
    let count = |k: K| meter.lifetime().get(S::Metadata, k).requests;
    let (gets, puts) = (count(K::Get), count(K::Put));
    const N: u64 = 10;
    for i in 0..N {
        let ino = mkfile(&v, ROOT_INO, &format!("f{i}"), b"published at its fsync");
        v.fsync(ino, false).unwrap();
    }
    let published = versions::list(bucket.as_ref()).unwrap().len() as u64;
    assert!(count(K::Put) - puts >= N && published >= N, "each fsync publishes a version: {} PUTs, {published} versions", count(K::Put) - puts);
    assert_eq!(count(K::Get) - gets, 0, "{N} publishes read from the bucket (the lease?)");
    v.close().unwrap();
    assert!(bucket.get(cloud::lease::OBJECT).is_err(), "the unmount gave the lease back");
}

/// The lease renews with a conditional update: a renewal after the lease
/// object was replaced fails as lost and does not overwrite the new one.
#[test]
fn a_renewal_does_not_overwrite_another_holders_lease() {
    let bucket: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let l = cloud::lease::Lease::acquire(bucket.as_ref(), "/a", false, URL).unwrap();
    l.renew(bucket.as_ref()).unwrap();
    l.check(bucket.as_ref()).unwrap();
    bucket.delete(cloud::lease::OBJECT).unwrap();
    assert_eq!(l.renew(bucket.as_ref()).unwrap_err().kind(), ErrorKind::Busy);
    assert!(bucket.get(cloud::lease::OBJECT).is_err(), "a renewal recreated a deleted lease");
    let other = cloud::lease::Lease::acquire(bucket.as_ref(), "/b", false, URL).unwrap();
    let theirs = bucket.get(cloud::lease::OBJECT).unwrap();
    let e = l.renew(bucket.as_ref()).unwrap_err();
    assert!(e.to_string().contains("took it"), "{e}");
    assert_eq!(l.check(bucket.as_ref()).unwrap_err().kind(), ErrorKind::Busy);
    assert_eq!(bucket.get(cloud::lease::OBJECT).unwrap(), theirs, "the old holder overwrote the new lease");
    other.release(bucket.as_ref()).unwrap();
}

/// A metadata version deleted from the middle of the chain (issue 25): a
/// read-write open, here or on another machine, fails naming it (it once
/// rolled the volume back silently and built on the hole); a read-only
/// open shows the last intact state; `meta restore` of an intact version
/// mends the chain; gc then keeps the packs that versions still in the
/// bucket name.
#[test]
fn a_missing_version_stops_a_read_write_mount_and_names_it() {
    let a = tempfile::tempdir().unwrap();
    let bucket: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    init_in(a.path(), &bucket, None);
    let mut tops = Vec::new();
    for (name, seed) in [("one", 1u64), ("two", 2), ("three", 3)] {
        let v = Volume::load(a.path(), opts(&bucket, Durability::Local)).unwrap();
        mkfile(&v, ROOT_INO, name, &random_bytes(seed, 200_000));
        v.close().unwrap();
        drop(v);
        tops.push(versions::list(bucket.as_ref()).unwrap().last().unwrap().clone());
    }
    let (intact, lost) = (tops[0].version, tops[1].clone());
    assert!(lost.version > intact && tops[2].version > lost.version);
    bucket.delete(&lost.object()).unwrap();
    let packs_before: Vec<String> = bucket.list("packs/").unwrap().into_iter().map(|o| o.name).collect();
    // Read-write: refused, here and from a fresh directory, naming the version.
    let b = tempfile::tempdir().unwrap();
    cloud::attach(b.path(), URL, None, None, Some(&InjectedBackend(bucket.clone()))).unwrap();
    for dir in [a.path(), b.path()] {
        let e = Volume::load(dir, opts(&bucket, Durability::Local)).map(|_| ()).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains(&format!("metadata version {} (", lost.version)) && msg.contains("missing"), "{msg}");
        assert!(msg.contains("--read-only") && msg.contains("cairn meta restore"), "{msg}");
    }
    assert!(bucket.list("lease").unwrap().is_empty(), "a refused open left its lease");
    // Read-only from a fresh directory: the last intact state.
    let mut ro = opts(&bucket, Durability::Local);
    ro.read_only = true;
    let r = Volume::load(b.path(), ro).unwrap();
    assert!(r.lookup(ROOT_INO, b"one").is_ok());
    for gone in [&b"two"[..], b"three"] {
        assert_eq!(r.lookup(ROOT_INO, gone).map(|_| ()).unwrap_err().kind(), ErrorKind::NotFound);
    }
    r.close().unwrap();
    drop(r);
    // Restore the intact version: the chain is whole again.
    let keys = VolumeConfig::parse(&bucket.get("config").unwrap()).unwrap().keys(None).unwrap();
    let restored = cloud::restore(bucket.as_ref(), &keys, URL, intact).unwrap();
    assert!(restored > tops[2].version);
    let v = Volume::load(b.path(), opts(&bucket, Durability::Local)).unwrap();
    assert!(read_all(&v, v.lookup(ROOT_INO, b"one").unwrap().ino) == random_bytes(1, 200_000));
    assert_eq!(v.lookup(ROOT_INO, b"three").map(|_| ()).unwrap_err().kind(), ErrorKind::NotFound);
    // gc: the packs of "two" and "three" are orphans now, but version
    // tops[2] (still in the bucket) names them: none is deleted.
    maintenance::gc(&v, 0.5, &maintenance::NoProgress).unwrap();
    let packs_after: Vec<String> = bucket.list("packs/").unwrap().into_iter().map(|o| o.name).collect();
    for p in &packs_before {
        assert!(packs_after.contains(p), "gc deleted {p}, which a version in the bucket names");
    }
    mkfile(&v, ROOT_INO, "four", b"after the restore");
    v.close().unwrap();
    drop(v);
    // The old directory takes the restored state and writes on.
    let v = Volume::load(a.path(), opts(&bucket, Durability::Local)).unwrap();
    assert!(v.lookup(ROOT_INO, b"four").is_ok());
    let rep = maintenance::fsck(&v, true, &maintenance::NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "fsck: {:?}", rep.errors);
    v.close().unwrap();
}

/// Who pays, through a metered bucket (docs/design.md "Who pays and for
/// which file"): on a machine whose cache is empty, gc's listings, its
/// repack's reads of the live chunks and the new pack's upload (from the
/// outbox, on an uploader thread) are gc's, none a read miss or a write;
/// a third machine reading the kept file afterwards pays read misses (and
/// read-ahead), nothing of it gc's.
#[test]
fn gc_pays_for_its_repack_and_a_later_read_is_a_read_miss() {
    use cairn_backend::{Metered, RequestKind as K, Subsystem as S};
    let a = tempfile::tempdir().unwrap();
    let m = Metered::new(MemoryBackend::new());
    let meter = m.meter().clone();
    let bucket: Arc<dyn Backend> = Arc::new(m);
    init_in(a.path(), &bucket, None);
    let v = Volume::load(a.path(), opts(&bucket, Durability::Local)).unwrap();
    let keep = random_bytes(51, 300_000);
    mkfile(&v, ROOT_INO, "keep", &keep);
    mkfile(&v, ROOT_INO, "gone", &random_bytes(52, 300_000));
    v.close().unwrap();
    drop(v);

    let b = tempfile::tempdir().unwrap();
    let v = open_in(b.path(), &bucket, Durability::Local);
    v.unlink(ROOT_INO, b"gone").unwrap();
    // Counted since (the volume's bill takes the meter's counts: its
    // lifetime counts only grow).
    let before = meter.lifetime();
    let rep = maintenance::gc(&v, 0.9, &maintenance::NoProgress).unwrap();
    assert!(rep.packs_repacked >= 1, "{rep:?}");
    v.close().unwrap();
    drop(v);
    let n = since(&meter, &before);
    assert!(n.get(S::Gc, K::List).requests >= 1, "gc's listing: {n:?}");
    assert!(n.get(S::Gc, K::Get).requests >= 1, "the repack's reads: {n:?}");
    assert!(n.get(S::Gc, K::Put).requests >= 1, "the new pack's upload: {n:?}");
    for who in [S::ReadMiss, S::Prefetch, S::Write] {
        assert_eq!(n.get(who, K::Get).requests + n.get(who, K::Put).requests, 0, "{who:?} paid for gc: {n:?}");
    }

    let c = tempfile::tempdir().unwrap();
    let v = open_in(c.path(), &bucket, Durability::Local);
    let ino = v.lookup(ROOT_INO, b"keep").unwrap().ino;
    let before = meter.lifetime();
    assert!(read_all(&v, ino) == keep);
    let n = since(&meter, &before);
    assert!(n.get(S::ReadMiss, K::Get).requests + n.get(S::Prefetch, K::Get).requests >= 1, "the read: {n:?}");
    assert_eq!(n.get(S::Gc, K::Get).requests, 0, "{n:?}");
    v.close().unwrap();
}

/// What `meter` counted since `before` (its lifetime counts then).
fn since(meter: &cairn_backend::Meter, before: &cairn_backend::RequestCounts) -> cairn_backend::RequestCounts {
    let mut n = cairn_backend::RequestCounts::default();
    for (s, k, t) in meter.lifetime().iter() {
        let b = before.get(s, k);
        n.add(s, k, t.requests - b.requests, t.bytes - b.bytes);
    }
    n
}
