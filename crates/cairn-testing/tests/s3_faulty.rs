//! The fault injector over the real S3 backend (moto on loopback, started
//! by scripts/test.sh): behind the retry wrapper, a store whose network
//! fails, hangs or loses replies on a quarter of requests still keeps the
//! whole backend contract.

use cairn_backend::{RetryPolicy, Retrying, S3Backend, S3Location};
use cairn_testing::{FaultPlan, FaultyBackend};
use std::time::Duration;

#[test]
fn conformance_on_s3_with_a_quarter_of_requests_failing() {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set: run through scripts/test.sh, which starts moto and sets it"));
    let (ep, bucket) = (var("CAIRN_TEST_S3_ENDPOINT"), var("CAIRN_TEST_S3_BUCKET"));
    let run = format!("faulty-{}", std::process::id());
    let s3 = S3Backend::open(S3Location::parse(&format!("s3://{bucket}/{run}"), Some(&ep), None).unwrap()).unwrap();
    let b = Retrying::new(FaultyBackend::new(s3, FaultPlan::flaky(0.25, Duration::from_millis(5)), 99), RetryPolicy::quick());
    cairn_backend::conformance::run_all(&b);
    let s = b.inner().stats();
    assert!(s.failed > 0 && s.lost_replies > 0, "too few faults to prove anything: {s:?}");
}
