//! The S3 backend against a real S3-compatible server (moto on loopback,
//! started by scripts/test.sh, which exports where it listens).

use cairn_backend::{Backend, ErrorKind, RetryPolicy, Retrying, S3Backend, S3Location};
use cairn_model::prices::{MULTIPART_MIN, PART_SIZE};

/// The server scripts/test.sh started: `CAIRN_TEST_S3_ENDPOINT` and a
/// bucket that exists there, `CAIRN_TEST_S3_BUCKET`.
fn server() -> (String, String) {
    let get = |k: &str| {
        std::env::var(k).unwrap_or_else(|_| {
            panic!(
                "{k} is not set: these tests need an S3-compatible server. scripts/test.sh starts one \
                 (pip install 'moto[server]'; moto_server -H 127.0.0.1 -p PORT; curl -X PUT http://127.0.0.1:PORT/BUCKET) \
                 and sets CAIRN_TEST_S3_ENDPOINT=http://127.0.0.1:PORT, CAIRN_TEST_S3_BUCKET=BUCKET and AWS credentials"
            )
        })
    };
    (get("CAIRN_TEST_S3_ENDPOINT"), get("CAIRN_TEST_S3_BUCKET"))
}

fn backend(prefix: &str) -> S3Backend {
    let (ep, bucket) = server();
    let run = format!("{prefix}-{:016x}", rand_id());
    S3Backend::open(S3Location::parse(&format!("s3://{bucket}/{run}"), Some(&ep), Some("us-east-1")).unwrap()).unwrap()
}

fn rand_id() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64 ^ (std::process::id() as u64) << 32
}

#[test]
fn conformance_on_a_real_s3_server() {
    cairn_backend::conformance::run_all(&backend("conformance"));
}

#[test]
fn conformance_at_the_bucket_root_behind_retries() {
    let (ep, bucket) = server();
    let b = S3Backend::open(S3Location::parse(&format!("s3://{bucket}"), Some(&ep), None).unwrap()).unwrap();
    cairn_backend::conformance::run_all(&Retrying::new(b, RetryPolicy::quick()));
}

/// Objects of `MULTIPART_MIN` (100 MiB) or more go up in parts; ranges
/// across part edges read back.
#[test]
fn large_objects_go_up_in_parts_and_read_back_by_range() {
    let b = backend("multipart");
    let data = pattern(MULTIPART_MIN + (4 << 20));
    b.put("packs/00/big", &data).unwrap();
    assert_eq!(b.size("packs/00/big").unwrap(), data.len() as u64);
    let at = PART_SIZE - 100;
    assert_eq!(b.get_range("packs/00/big", at, 300).unwrap(), &data[at as usize..at as usize + 300]);
    assert!(b.get("packs/00/big").unwrap() == data);
}

/// A bucket that does not exist is not a transient failure: retrying would
/// not help, and the message names it.
#[test]
fn a_missing_bucket_is_reported_as_such() {
    let (ep, _) = server();
    let b = S3Backend::open(S3Location::parse("s3://no-such-bucket-cairn/x", Some(&ep), None).unwrap()).unwrap();
    let e = b.get("config").unwrap_err();
    assert_ne!(e.kind(), ErrorKind::Transient, "{e}");
    assert!(e.to_string().contains("no-such-bucket-cairn"), "{e}");
}

/// Nothing listens: a transient error (the store may come back), named.
#[test]
fn an_unreachable_endpoint_is_transient() {
    let b = S3Backend::open(S3Location::parse("s3://b/x", Some("http://127.0.0.1:9"), None).unwrap()).unwrap();
    let e = b.get("config").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
    assert!(e.to_string().contains("127.0.0.1:9"), "{e}");
}

/// Every HTTP request is counted, by kind and by the subsystem whose
/// handle sent it ([`Backend::paid_by`]): a multipart upload is a POST, a PUT per 16 MiB part and a
/// POST; a pack of 20 MiB one PUT; a listing a LIST per 1,000 keys; failed
/// requests count too.
#[test]
fn every_request_is_counted_as_sent() {
    use cairn_backend::meter::{RequestKind as K, Subsystem};
    let b = backend("meter");
    let m = b.meter().clone();
    m.take();
    let huge = pattern(MULTIPART_MIN + 1);
    let big = pattern(20 << 20);
    {
        let w = b.paid_by(Subsystem::Write).unwrap();
        w.put("packs/00/huge", &huge).unwrap();
        w.put("packs/00/big", &big).unwrap();
        w.put("packs/00/small", b"hello").unwrap();
    }
    let n = m.take();
    let parts = huge.len().div_ceil(PART_SIZE as usize) as u64;
    assert_eq!(parts, 7);
    assert_eq!(n.get(Subsystem::Write, K::Post).requests, 2, "create and complete");
    assert_eq!(n.get(Subsystem::Write, K::Put).requests, parts + 2, "the parts, a 20 MiB pack and a small object");
    assert_eq!(n.get(Subsystem::Write, K::Put).bytes, (huge.len() + big.len()) as u64 + 5);
    assert_eq!(n.iter().count(), 2, "{n:?}");
    drop(huge);
    b.delete("packs/00/huge").unwrap();
    m.take();
    {
        let r = b.paid_by(Subsystem::ReadMiss).unwrap();
        assert_eq!(r.get_range("packs/00/big", 10, 100).unwrap().len(), 100);
        assert_eq!(r.get("packs/00/small").unwrap(), b"hello");
        assert_eq!(r.size("packs/00/big").unwrap(), big.len() as u64);
        assert!(r.get("packs/00/missing").is_err());
    }
    let n = m.take();
    assert_eq!(n.get(Subsystem::ReadMiss, K::Get), cairn_backend::meter::Tally { requests: 3, bytes: 105 });
    assert_eq!(n.get(Subsystem::ReadMiss, K::Head).requests, 1);
    // 1,001 keys: two pages. Through the store itself: "other".
    for i in 0..999 {
        b.put(&format!("many/{i:04}"), b"x").unwrap();
    }
    m.take();
    assert_eq!(b.list("").unwrap().len(), 1001);
    assert_eq!(b.list("many/").unwrap().len(), 999);
    assert_eq!(b.list("nothing/").unwrap().len(), 0);
    b.delete("packs/00/small").unwrap();
    b.delete("packs/00/small").unwrap(); // missing: still a request
    let n = m.take();
    assert_eq!(n.get(Subsystem::Other, K::List).requests, 2 + 1 + 1);
    assert_eq!(n.get(Subsystem::Other, K::Delete).requests, 2);
    // Behind retries: one count per attempt (here, the server refuses a
    // create of an existing object once, and that is final).
    let r = Retrying::new(b, RetryPolicy::quick());
    assert_eq!(r.put_if_absent("packs/00/big", b"x").unwrap_err().kind(), ErrorKind::AlreadyExists);
    assert_eq!(m.take().total(K::Put).requests, 1);
}

/// Bytes that do not repeat within a part (so a part mixed up shows).
fn pattern(len: u64) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect()
}

/// Storage classes on the server (moto implements them, InvalidObjectState
/// on a GET of a GLACIER object, RestoreObject and x-amz-restore; its
/// restores complete at once): a put in GLACIER reads back as `Archived`
/// (never a generic error, and `Retrying` does not retry it), a restore
/// makes it readable byte-exact, and each request is billed as its kind.
#[test]
fn archived_objects_refuse_a_get_until_restored() {
    use cairn_backend::{meter::Subsystem, RequestKind, RestoreSpeed, RestoreState, StorageClass};
    let b = backend("classes");
    let data = pattern(70_000u64);
    b.put_in_class("packs/00/cold", &data, StorageClass::Glacier).unwrap();
    let st = b.restore_state("packs/00/cold").unwrap();
    assert_eq!((st.class, st.restore.clone()), (StorageClass::Glacier, RestoreState::None));
    let meter = b.meter().clone();
    let before = meter.lifetime();
    let r = Retrying::new(b, RetryPolicy::quick());
    let e = r.get_range("packs/00/cold", 100, 1000).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Archived, "{e}");
    assert!(e.to_string().contains("archived"), "{e}");
    let gets = meter.lifetime().total(RequestKind::Get).requests - before.total(RequestKind::Get).requests;
    assert_eq!(gets, 1, "an archived GET is not retried");
    r.restore("packs/00/cold", 1, RestoreSpeed::Standard).unwrap();
    assert!(r.restore_state("packs/00/cold").unwrap().readable());
    assert!(r.get("packs/00/cold").unwrap() == data);
    assert_eq!(r.get_range("packs/00/cold", 100, 1000).unwrap(), &data[100..1100]);
    let n = meter.lifetime();
    assert_eq!(n.get(Subsystem::Other, RequestKind::Restore).requests - before.get(Subsystem::Other, RequestKind::Restore).requests, 1);
    // A multipart upload takes the class too.
    let big = pattern(MULTIPART_MIN + 1000);
    r.inner().put_in_class("packs/00/big-cold", &big, StorageClass::DeepArchive).unwrap();
    assert_eq!(r.restore_state("packs/00/big-cold").unwrap().class, StorageClass::DeepArchive);
    assert_eq!(r.get_range("packs/00/big-cold", 0, 10).unwrap_err().kind(), ErrorKind::Archived);
}
