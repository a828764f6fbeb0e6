//! No read-modify-write from the bucket (docs/frugal.md §6): with the
//! kernel's writeback cache, an append to a file whose size is not a
//! multiple of the page first reads the file's partial last page. A mount
//! keeps the last page of every chunk it stored or fetched, so that read
//! costs no GET of the chunk, and a trace says so (READ with flag KEPT).

use cairn_engine::cloud::CloudOptions;
use cairn_engine::trace::{Event, TraceReader};
use cairn_engine::{Caller, FileKind, InjectedBackend, OpenOptions, Volume, ROOT_INO};
use std::time::Duration;

use crate::common::{memory_cloud_volume, random_bytes as bytes};

#[test]
fn the_page_read_before_an_append_costs_no_get() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("vol");
    let trace = d.path().join("trace");
    let bucket = memory_cloud_volume(&dir);
    let opts = |trace: Option<std::path::PathBuf>| OpenOptions {
        backend: Some(InjectedBackend(bucket.clone())),
        // No decoded chunks kept in memory to speak of, and a pack cache
        // far smaller than what is written: reads reach the bucket.
        cache_bytes: 0,
        cloud: CloudOptions { cache_bytes: 1 << 20, meta_interval: Duration::from_secs(3600), gc_interval: None, ..Default::default() },
        trace,
        ..Default::default()
    };
    let v = Volume::load(&dir, opts(Some(trace.clone()))).unwrap();
    let who = Caller { uid: 0, gid: 0 };
    let data = bytes(7, 50_001);
    let a = v.create(ROOT_INO, b"a", FileKind::File, 0o644, 0, who).unwrap().ino;
    v.open(a).unwrap();
    v.write(a, 0, &data).unwrap();
    v.release(a).unwrap();
    // 8 MiB of other files push a's pack out of the 1 MiB cache.
    for i in 0..64 {
        let f = v.create(ROOT_INO, format!("f{i}").as_bytes(), FileKind::File, 0o644, 0, who).unwrap().ino;
        v.open(f).unwrap();
        v.write(f, 0, &bytes(100 + i, 128 << 10)).unwrap();
        v.release(f).unwrap();
    }
    v.flush_now().unwrap();
    let cache = v.cloud().unwrap().cache.clone();
    cache.drain(&mut |_, _| {});
    let gets = || cache.stats().remote_gets;
    let before = gets();

    // The kernel's read of the partial last page: from the kept tail.
    let page = 50_001 / 4096 * 4096;
    assert!(v.read(a, page as u64, 4096).unwrap() == data[page..], "the partial last page");
    assert_eq!(gets(), before, "the partial last page was fetched from the bucket");
    assert_eq!(v.metrics_snapshot().chunk_tail_hits, 1);
    // The append itself, and the file read back whole.
    v.open(a).unwrap();
    v.write(a, 50_001, b" and more").unwrap();
    v.release(a).unwrap();
    v.flush_now().unwrap();
    // The start of the file was not kept: it is fetched (so a's pack was
    // not in the cache, and the tail read above saved a GET).
    assert!(v.read(a, 0, 100).unwrap() == data[..100], "the first 100 bytes");
    assert!(gets() > before, "the file's first page was local: the test evicts nothing");
    let mut whole = data.clone();
    whole.extend_from_slice(b" and more");
    assert!(v.read(a, 0, 1 << 20).unwrap() == whole, "the file read back whole");
    v.close().unwrap();
    drop(v);

    // The trace tells the simulator which read needed no chunk.
    let kept: Vec<Event> = TraceReader::open(&trace).unwrap().map(|r| r.unwrap().event).filter(|e| matches!(e, Event::ReadKept { .. })).collect();
    assert_eq!(kept, vec![Event::ReadKept { ino: a, offset: page as u64, len: (50_001 - page) as u64 }]);

    // A new mount has kept nothing: the same read fetches.
    let v = Volume::load(&dir, opts(None)).unwrap();
    let cache = v.cloud().unwrap().cache.clone();
    let before = cache.stats().remote_gets;
    assert!(v.read(a, page as u64, 4096).unwrap() == whole[page..], "the last page after the append");
    assert!(cache.stats().remote_gets > before, "{:?}", cache.stats());
    v.close().unwrap();
}
