//! The engine on backends handed to it (`InitOptions::backend`,
//! `OpenOptions::backend`): an in-memory store, and one that misbehaves on
//! a tenth of its requests behind the retry wrapper every engine backend
//! gets.

use crate::common::*;
use cairn_backend::{Backend, RetryPolicy, Retrying};
use cairn_engine::*;
use cairn_testing::{FaultPlan, FaultyBackend, MemoryBackend};
use std::sync::Arc;
use std::time::Duration;

fn init_on(dir: &std::path::Path, b: &Arc<dyn Backend>) {
    init(dir, &InitOptions { chunker: small_chunks(), pack_target: Some(1 << 20), backend: Some(InjectedBackend(b.clone())), ..Default::default() }).unwrap();
}

fn open_on(dir: &std::path::Path, b: &Arc<dyn Backend>) -> Arc<Volume> {
    Volume::load(dir, OpenOptions { backend: Some(InjectedBackend(b.clone())), ..Default::default() }).unwrap()
}

/// "10% of requests failing or timing out gives writers and readers no
/// error": files written, flushed into packs, and read back from the store
/// by a fresh open (empty caches), byte for byte; fsck reads every chunk.
#[test]
fn a_volume_on_a_store_failing_a_tenth_of_requests_shows_no_error() {
    let d = tempfile::tempdir().unwrap();
    let faulty = Arc::new(Retrying::new(FaultyBackend::new(MemoryBackend::new(), FaultPlan::flaky(0.10, Duration::from_millis(3)), 12), RetryPolicy::quick()));
    let b: Arc<dyn Backend> = faulty.clone();
    init_on(d.path(), &b);
    let v = open_on(d.path(), &b);
    let files: Vec<(Ino, Vec<u8>)> = (0..24u64)
        .map(|i| {
            let data = random_bytes(i, 50_000 + 9_000 * i as usize);
            (mkfile(&v, ROOT_INO, &format!("f{i}"), &data), data)
        })
        .collect();
    v.flush_now().unwrap();
    v.close().unwrap();
    drop(v);
    let v = open_on(d.path(), &b);
    for (ino, data) in &files {
        assert!(&read_all(&v, *ino) == data, "file {ino} differs after a reopen");
    }
    let rep = maintenance::fsck(&v, true, &maintenance::NoProgress).unwrap();
    assert!(rep.errors.is_empty(), "fsck: {:?}", rep.errors);
    v.close().unwrap();
    let s = faulty.inner().stats();
    assert!(s.failed + s.timed_out + s.lost_replies >= 5, "too few faults injected to prove anything: {s:?}");
}

/// The volume directory alone cannot open a volume whose store its program
/// supplied, and says so.
#[test]
fn a_volume_on_an_injected_store_needs_it_to_open() {
    let d = tempfile::tempdir().unwrap();
    let b: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    init_on(d.path(), &b);
    let e = Volume::load(d.path(), OpenOptions::default()).map(|_| ()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert!(e.to_string().contains("memory:"), "{e}");
}
