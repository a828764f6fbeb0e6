//! Reads of archived data (issue 53, docs/tiers.md §6) on a real S3 server
//! (moto: storage classes, InvalidObjectState, RestoreObject and
//! x-amz-restore; its restores complete at once), with `RestoreHold` in
//! front where a restore must stay "ongoing". A volume is written through
//! the engine, then its packs are put again in GLACIER through the
//! backend (the move itself is the other half of issue 53), then read from
//! another machine's empty cache.

use crate::common::*;
use crate::pg_bucket::{endpoint, REGION};
use cairn_backend::{Backend, ErrorKind as B, RetryPolicy, Retrying, S3Backend, S3Location, StorageClass};
use cairn_engine::cloud::{self, CloudOptions};
use cairn_engine::*;
use cairn_testing::RestoreHold;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

type Bucket = Arc<RestoreHold<Retrying<S3Backend>>>;

fn bucket(what: &str) -> (String, Bucket) {
    let b = std::env::var("CAIRN_TEST_S3_BUCKET").expect("CAIRN_TEST_S3_BUCKET is not set (see scripts/test.sh)");
    let url = format!("s3://{b}/tiers-{what}-{}", hex::encode(rand::random::<[u8; 6]>()));
    let s3 = S3Backend::open(S3Location::parse(&url, Some(&endpoint()), Some(REGION)).unwrap()).unwrap();
    (url, Arc::new(RestoreHold::new(Retrying::new(s3, RetryPolicy::cloud()), false)))
}

fn opts(b: &Bucket, recall_wait: Duration) -> OpenOptions {
    OpenOptions {
        backend: Some(InjectedBackend(b.clone())),
        cloud: CloudOptions { cache_bytes: 64 << 20, meta_interval: Duration::from_millis(200), gc_interval: None, recall_wait, ..Default::default() },
        ..Default::default()
    }
}

/// A volume with one file of several chunks over a few packs, written and
/// closed on machine `a`; its packs then put again in GLACIER. The file's
/// bytes and the pack names.
fn archived_volume(a: &Path, url: &str, b: &Bucket) -> (Vec<u8>, Vec<String>) {
    let init = InitOptions { chunker: small_chunks(), pack_target: Some(1 << 20), backend: Some(InjectedBackend(b.clone())), ..Default::default() };
    init_cloud(a, url, None, None, &init).unwrap();
    let v = Volume::load(a, opts(b, Duration::from_secs(60))).unwrap();
    let data = random_bytes(53, 2_600_000);
    let ino = mkfile(&v, ROOT_INO, "cold", &data);
    v.fsync(ino, false).unwrap();
    v.close().unwrap();
    drop(v);
    let packs: Vec<String> = b.list("packs/").unwrap().into_iter().map(|o| o.name).collect();
    assert!(packs.len() >= 2, "packs: {packs:?}");
    for p in &packs {
        let bytes = b.get(p).unwrap();
        b.put_in_class(p, &bytes, StorageClass::Glacier).unwrap();
        assert_eq!(b.get_range(p, 0, 1).unwrap_err().kind(), B::Archived, "{p} is archived now");
    }
    (data, packs)
}

/// Another machine: an empty cache, the volume from the bucket.
fn elsewhere(dir: &Path, url: &str, b: &Bucket, recall_wait: Duration) -> Arc<Volume> {
    cloud::attach(dir, url, None, None, Some(&InjectedBackend(b.clone()))).unwrap();
    Volume::load(dir, opts(b, recall_wait)).unwrap()
}

/// A read of a file whose packs are in GLACIER restores them (one request
/// per pack) and returns the bytes, exactly; afterwards the packs are
/// restored copies (x-amz-restore says so) still in GLACIER.
#[test]
fn a_read_of_an_archived_file_restores_its_packs_and_succeeds() {
    let (a, m) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (url, b) = bucket("read");
    let (data, packs) = archived_volume(a.path(), &url, &b);
    let v = elsewhere(&m.path().join("m"), &url, &b, Duration::from_secs(60));
    let ino = v.resolve(b"cold").unwrap();
    assert!(read_all(&v, ino) == data, "the archived file read back differs");
    assert_eq!(b.restored_objects(), packs.len(), "one restore per pack read");
    assert_eq!(b.restores(), packs.len() as u64, "no pack restored twice");
    for p in &packs {
        let st = b.restore_state(p).unwrap();
        assert_eq!(st.class, StorageClass::Glacier);
        assert!(st.readable(), "{p}: {st:?}");
    }
    v.close().unwrap();
}

/// A restore that does not complete within `--recall-wait`: the read fails
/// with EAGAIN (not EIO), saying when the restore was asked for and when it
/// should be ready; concurrent readers share one restore per pack; once the
/// restore completes the same read succeeds, byte-exact.
#[test]
fn a_restore_still_under_way_after_recall_wait_is_eagain_then_the_read_succeeds() {
    let (a, m) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (url, b) = bucket("eagain");
    let (data, _packs) = archived_volume(a.path(), &url, &b);
    b.set_held(true);
    let v = elsewhere(&m.path().join("m"), &url, &b, Duration::from_secs(2));
    let ino = v.resolve(b"cold").unwrap();
    let errs: Vec<Error> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..3).map(|_| s.spawn(|| v.read(ino, 0, 4096).expect_err("a read of a pack still being restored must fail"))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for e in &errs {
        assert_eq!(e.kind(), ErrorKind::Again, "{e}");
        assert_eq!(e.errno(), libc::EAGAIN);
        let msg = e.message();
        assert!(msg.contains("restore requested at") && msg.contains("expected ready about") && msg.contains("--recall-wait"), "{msg}");
    }
    assert_eq!(b.restores(), 1, "three readers of one pack: one restore ({} sent)", b.restores());
    // The restore is in the metadata, where `cairn tier status` (on any
    // machine) shows it with its expected time, until the copy is read.
    let st = v.tier_status(b"cold", None).unwrap();
    assert_eq!(st.restores.len(), 1, "the restore in flight is recorded: {st:?}");
    b.set_held(false);
    assert!(read_all(&v, ino) == data, "the file read after the restore differs");
    let st = v.tier_status(b"cold", None).unwrap();
    assert!(st.restores.is_empty(), "a restore whose copy was read stays recorded: {st:?}");
    v.close().unwrap();
}

/// `cairn warmup` of a file whose packs are archived sends their restores
/// at once, one per pack, without waiting, and says so; a second warmup
/// while they are under way sends none; once they complete, a warmup
/// fills the cache and the file reads back byte-exact.
#[test]
fn warmup_requests_the_restores_of_archived_packs_at_once() {
    let (a, m) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (url, b) = bucket("warmup");
    let (data, mut packs) = archived_volume(a.path(), &url, &b);
    b.set_held(true);
    let v = elsewhere(&m.path().join("m"), &url, &b, Duration::from_secs(1));
    let ino = v.resolve(b"cold").unwrap();
    let roots = [(ino, b"cold".to_vec())];
    let rep = v.warmup(&roots, None, &mut |_, _| {}).unwrap();
    let mut sent: Vec<String> = rep.restores_requested.iter().map(|(p, _)| p.clone()).collect();
    sent.sort();
    packs.sort();
    assert_eq!(sent, packs, "one restore per archived pack: {rep:?}");
    assert!(rep.restores_requested.iter().all(|(_, what)| what.contains("restore requested at") && what.contains("expected ready about")), "{rep:?}");
    assert!(rep.restores_ongoing.is_empty());
    assert_eq!(b.restores(), packs.len() as u64, "restores sent");
    assert_eq!(v.tier_status(b"cold", None).unwrap().restores.len(), packs.len(), "each restore sent is recorded");
    assert_eq!(rep.fetched_bytes, 0, "nothing of an archived pack is read");
    assert!(rep.archived_bytes >= data.len() as u64 / 2, "{rep:?}");
    let again = v.warmup(&roots, None, &mut |_, _| {}).unwrap();
    assert!(again.restores_requested.is_empty(), "{again:?}");
    assert_eq!(again.restores_ongoing.len(), packs.len());
    assert_eq!(b.restores(), packs.len() as u64, "no restore sent twice");
    b.set_held(false);
    let done = v.warmup(&roots, None, &mut |_, _| {}).unwrap();
    assert!(done.restores_requested.is_empty() && done.restores_ongoing.is_empty(), "{done:?}");
    assert!(done.fetched_bytes > 0, "{done:?}");
    assert!(v.tier_status(b"cold", None).unwrap().restores.is_empty(), "the restores whose packs the warmup read stay recorded");
    assert!(read_all(&v, ino) == data);
    v.close().unwrap();
}
