//! The tape store (a tape behind the Backend trait) on the emulated drive,
//! virtual clock: the backend contract, the self-describing tape (reopen
//! from the tape alone), recovery after a crash, logical deletes, reads in
//! position order, streaming read-ahead, end of medium.

use crate::common::{bytes, small_params};
use cairn_backend::{Backend, ErrorKind, Sequential};
use cairn_tape::store::{self, StoreOptions, TapeStore};
use cairn_tape::{Clock, EmuDrive, EmuParams, TapeDevice};
use std::path::Path;
use std::time::Duration;

fn opts() -> StoreOptions {
    StoreOptions { queue_bytes: 8 << 20, read_ahead: 1 << 20, read_buffer: 4 << 20, batch_window: Duration::from_millis(5), pack_size: 1 << 20, prepare_append: false, prepare_read: false, inline: None }
}

fn create(dir: &Path, p: EmuParams) -> TapeStore {
    let dev = EmuDrive::create(dir, p, Clock::virtual_clock()).unwrap();
    TapeStore::open(Box::new(dev), opts(), None, true).unwrap()
}

/// An object as long as the window a mount reads before the catalog, put
/// last: the objects before it are then read from where they lie, not
/// kept from that window.
fn filler(s: &TapeStore) {
    s.put("zz/filler", &vec![7u8; cairn_tape::layout::CATALOG_WINDOW as usize]).unwrap();
}

fn reopen(dir: &Path) -> cairn_backend::Result<TapeStore> {
    TapeStore::open(Box::new(EmuDrive::open(dir, Clock::virtual_clock()).unwrap()), opts(), None, false)
}


#[test]
fn the_store_keeps_the_backend_contract() {
    let t = tempfile::tempdir().unwrap();
    let s = create(&t.path().join("tape"), small_params());
    cairn_backend::conformance::run_all(&s);
    s.sync().unwrap();
    // Again once everything is on tape and read from there.
    let s = {
        drop(s);
        reopen(&t.path().join("tape")).unwrap()
    };
    assert_eq!(s.get_range("conf/range", 3, 4).unwrap(), b"3456");
    assert_eq!(s.get_range("conf/range", 8, 5).unwrap_err().kind(), ErrorKind::OutOfRange);
}

/// What a sync covered is read back from the tape alone by a new store,
/// byte for byte and across block boundaries; a blank tape is refused
/// without format_blank, a store closed without a sync leaves the catalog
/// of the last sync, which tells to run recover.
#[test]
fn a_synced_tape_mounts_from_the_tape_alone() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let s = create(&dir, small_params());
    let objs: Vec<(String, Vec<u8>)> = (0..20).map(|i| (format!("packs/{i:02}/p{i}"), bytes(i, 1_000 + 9_973 * i as usize))).collect();
    for (n, d) in &objs {
        s.put(n, d).unwrap();
    }
    s.sync().unwrap();
    let vid = s.label().volume_id;
    drop(s);
    let s = reopen(&dir).unwrap();
    assert_eq!(s.label().volume_id, vid);
    for (n, d) in &objs {
        assert_eq!(&s.get(n).unwrap(), d, "{n}");
        if d.len() > 9000 {
            // A range across the 4 KiB blocks (4032 payload bytes each).
            assert_eq!(s.get_range(n, 4000, 5000).unwrap(), d[4000..9000]);
        }
    }
    let mut names: Vec<String> = s.list("packs/").unwrap().into_iter().map(|o| o.name).collect();
    names.sort();
    assert_eq!(names.len(), 20);

    // Appending after the catalog, then a crash (no sync).
    s.put("packs/late", &bytes(99, 50_000)).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    drop(s);
    let e = reopen(&dir).err().expect("the catalog was overwritten by the append");
    assert_eq!(e.kind(), ErrorKind::Corrupt);
    assert!(e.to_string().contains("recover"), "{e}");

    let blank = t.path().join("blank");
    EmuDrive::create(&blank, small_params(), Clock::virtual_clock()).unwrap();
    let e = reopen(&blank).err().unwrap();
    assert!(e.to_string().contains("blank"), "{e}");
}

/// After a crash, recover brings back every object whose blocks all
/// arrived, under its own name, newest copy winning, and names the rest.
#[test]
fn recover_rebuilds_the_catalog_from_the_blocks() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let s = create(&dir, small_params());
    s.put("config", b"the config").unwrap();
    s.put("meta/1", &bytes(1, 30_000)).unwrap();
    s.sync().unwrap();
    s.put("meta/1", &bytes(2, 20_000)).unwrap(); // a newer copy
    s.put("packs/aa/x", &bytes(3, 100_000)).unwrap();
    s.delete("config").unwrap(); // a delete after the last catalog is forgotten
    s.put("packs/bb/cut", &bytes(4, 200_000)).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let dev = s.into_device().unwrap();
    drop(dev);
    // Cut the last object short, as a power cut in its middle would.
    let img = dir.join("tape.img");
    let len = std::fs::metadata(&img).unwrap().len();
    let slot = len / EmuDrive::open(&dir, Clock::virtual_clock()).unwrap().end_of_data();
    std::fs::OpenOptions::new().write(true).open(&img).unwrap().set_len(len - 3 * slot).unwrap();

    let dev = EmuDrive::open(&dir, Clock::virtual_clock()).unwrap();
    let mut calls = 0;
    let (r, dev) = store::recover(Box::new(dev), None, &mut |_, _| calls += 1).unwrap();
    assert!(calls > 0);
    assert!(!r.had_catalog, "appending erased the last catalog");
    assert_eq!(r.incomplete, vec!["packs/bb/cut".to_string()]);
    let mut got = r.recovered.clone();
    got.sort();
    assert_eq!(got, vec!["config".to_string(), "meta/1".to_string(), "meta/1".to_string(), "packs/aa/x".to_string()]);
    let s = TapeStore::open(dev, opts(), None, false).unwrap();
    assert_eq!(s.get("meta/1").unwrap(), bytes(2, 20_000));
    assert_eq!(s.get("packs/aa/x").unwrap(), bytes(3, 100_000));
    assert_eq!(s.get("config").unwrap(), b"the config");
    assert_eq!(s.get("packs/bb/cut").unwrap_err().kind(), ErrorKind::NotFound);
    // The replaced copy is dead space.
    assert_eq!(s.space().1, 30_000);
    // And the tape takes appends again.
    s.put("packs/cc/new", b"after recovery").unwrap();
    s.sync().unwrap();
    drop(s);
    assert_eq!(reopen(&dir).unwrap().get("packs/cc/new").unwrap(), b"after recovery");
}

/// Deletes are logical: the bytes stay and count as dead.
#[test]
fn deletes_free_nothing_and_are_counted() {
    let t = tempfile::tempdir().unwrap();
    let s = create(&t.path().join("tape"), small_params());
    s.put("a", &bytes(1, 10_000)).unwrap();
    s.put("b", &bytes(2, 5_000)).unwrap();
    s.sync().unwrap();
    s.delete("a").unwrap();
    s.delete("a").unwrap();
    assert_eq!(s.space(), (5_000, 10_000));
    assert_eq!(s.get("a").unwrap_err().kind(), ErrorKind::NotFound);
    assert!(!s.capabilities().frees_on_delete);
    s.sync().unwrap();
    drop(s);
    assert_eq!(reopen(&t.path().join("tape")).unwrap().space(), (5_000, 10_000));
}

/// A batch of reads is served in tape order in one pass: fewer locates
/// than reading the same objects in the order asked.
#[test]
fn batched_reads_go_in_tape_order() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let s = create(&dir, small_params());
    for i in 0..40u64 {
        s.put(&format!("o/{i:02}"), &bytes(i, 40_000)).unwrap();
    }
    filler(&s);
    s.sync().unwrap();
    drop(s);
    let reqs: Vec<(String, u64, u64)> = (0..40u64).rev().step_by(3).map(|i| (format!("o/{i:02}"), 100, 30_000)).collect();
    let run = |batched: bool| {
        let dev = EmuDrive::open(&dir, Clock::virtual_clock()).unwrap();
        let o = StoreOptions { read_ahead: 0, ..opts() };
        let s = TapeStore::open(Box::new(dev), o, None, false).unwrap();
        if batched {
            for (r, (n, off, len)) in s.read_many(&reqs).into_iter().zip(&reqs) {
                let i: u64 = n[2..].parse().unwrap();
                assert_eq!(r.unwrap(), bytes(i, 40_000)[*off as usize..(off + len) as usize]);
            }
        } else {
            for (n, off, len) in &reqs {
                s.get_range(n, *off, *len).unwrap();
            }
        }
        let pos = s.into_device().unwrap().position().unwrap();
        (pos, cairn_tape::Session::read(&dir).expect("the drive's session").stats.locates)
    };
    // In tape order the last request served is the highest-numbered
    // object's; in the order asked (descending) it is the lowest's.
    let (batched, batched_locates) = run(true);
    let (fifo, fifo_locates) = run(false);
    assert!(batched > fifo);
    // The gaps between the objects asked for are short: in tape order they
    // are read through (opening: 2 locates; the first object: 1), while
    // the order asked locates back for every request.
    assert_eq!(batched_locates, 3, "batched");
    assert!(fifo_locates >= reqs.len() as u64, "fifo: {fifo_locates}");
}

/// A sequential reader is fed by the read-ahead: a few tape reads serve
/// many requests.
#[test]
fn sequential_reads_stream_ahead() {
    let t = tempfile::tempdir().unwrap();
    let s = create(&t.path().join("tape"), small_params());
    let d = bytes(7, 3 << 20);
    s.put("big", &d).unwrap();
    s.sync().unwrap();
    drop(s);
    let s = reopen(&t.path().join("tape")).unwrap();
    let mut got = Vec::new();
    while got.len() < d.len() {
        let n = (64 << 10).min(d.len() - got.len()) as u64;
        got.extend(s.get_range("big", got.len() as u64, n).unwrap());
    }
    assert_eq!(got, d);
    let st = s.stats();
    assert!(st.reads_from_tape <= 2, "{st:?}");
    assert!(st.reads_from_memory >= 40, "{st:?}");
}

/// The end of the medium fails the put or the sync that meets it with
/// NoSpace; what was synced before stays readable after a reopen.
#[test]
fn end_of_medium_is_no_space_and_keeps_earlier_data() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let mut p = small_params();
    p.capacity_bytes = 2 << 20;
    p.early_warning_bytes = 256 << 10;
    let s = create(&dir, p);
    s.put("kept", &bytes(1, 500_000)).unwrap();
    s.sync().unwrap();
    let mut failed = None;
    for i in 0..10 {
        if let Err(e) = s.put(&format!("more/{i}"), &bytes(i + 10, 400_000)).and_then(|()| s.sync()) {
            failed = Some(e);
            break;
        }
    }
    let e = failed.expect("the tape filled up");
    assert_eq!(e.kind(), ErrorKind::NoSpace, "{e}");
    assert_eq!(s.put("after", b"x").unwrap_err().kind(), ErrorKind::NoSpace);
    drop(s);
    let s = reopen(&dir).unwrap();
    assert_eq!(s.get("kept").unwrap(), bytes(1, 500_000));
}

/// The catalog overwritten with garbage: opening says the catalog is
/// damaged and to run recover; recover brings every object back.
#[test]
fn a_garbage_catalog_is_refused_then_recovered() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let s = create(&dir, small_params());
    let objs: Vec<(String, Vec<u8>)> = (0..5).map(|i| (format!("packs/0{i}/x"), bytes(40 + i, 20_000 + 5_000 * i as usize))).collect();
    for (n, d) in &objs {
        s.put(n, d).unwrap();
    }
    s.sync().unwrap();
    drop(s);
    // The catalog is the last record before the final filemark: overwrite
    // the payload of the records between the last two filemarks.
    let eod = EmuDrive::open(&dir, Clock::virtual_clock()).unwrap().end_of_data();
    let slot = 8 + small_params().block_size as u64;
    let f = std::fs::OpenOptions::new().write(true).open(dir.join("tape.img")).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &vec![0x5a; 3000], (eod - 2) * slot + 8 + 100).unwrap();
    drop(f);
    let e = reopen(&dir).err().expect("a garbage catalog must be refused");
    assert_eq!(e.kind(), ErrorKind::Corrupt);
    assert!(e.to_string().contains("catalog") && e.to_string().contains("recover"), "{e}");
    let (r, dev) = store::recover(Box::new(EmuDrive::open(&dir, Clock::virtual_clock()).unwrap()), None, &mut |_, _| {}).unwrap();
    assert_eq!(r.recovered.len(), 5, "{r:?}");
    assert!(r.incomplete.is_empty());
    let s = TapeStore::open(dev, opts(), None, false).unwrap();
    for (n, d) in &objs {
        assert_eq!(&s.get(n).unwrap(), d);
    }
}

/// `position` places bytes on the tape: objects in the order they were
/// written, a later byte of an object at or after an earlier one, nothing
/// for an object deleted or unknown; `space` counts deletes and
/// replacements as dead.
#[test]
fn positions_follow_the_tape_and_space_counts_the_dead() {
    let t = tempfile::tempdir().unwrap();
    let s = create(&t.path().join("tape"), small_params());
    let bs = s.label().block_size as u64;
    for (i, n) in ["p/a", "p/b", "p/c"].iter().enumerate() {
        s.put(n, &bytes(i as u64, 5 * bs as usize)).unwrap();
    }
    s.sync().unwrap();
    let (a, b, c) = (s.position("p/a", 0).unwrap(), s.position("p/b", 0).unwrap(), s.position("p/c", 0).unwrap());
    assert!(a < b && b < c, "{a} {b} {c}");
    let a_end = s.position("p/a", 5 * bs - 1).unwrap();
    assert!(a_end >= a + 4 && a_end < b, "{a} {a_end} {b}");
    assert_eq!(s.position("p/none", 0), None);
    let before = Sequential::space(&s).unwrap();
    assert_eq!((before.live_bytes, before.dead_bytes), (15 * bs, 0));
    s.delete("p/b").unwrap();
    s.put("p/c", b"new").unwrap();
    s.sync().unwrap();
    assert_eq!(s.position("p/b", 0), None, "deleted");
    let after = Sequential::space(&s).unwrap();
    assert_eq!((after.live_bytes, after.dead_bytes), (5 * bs + 3, 10 * bs), "{after:?}");
}

/// With `prepare_append`, a store idle after its open moves the tape to
/// the append point, so the first write after it pays no locate (3 s on
/// the default drive); without it the first write pays it.
#[test]
fn an_idle_store_prepares_the_first_append() {
    let first_write_secs = |prepare: bool| {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("tape");
        drop(create(&dir, small_params()));
        let vc = cairn_tape::VirtualClock::new();
        let dev = EmuDrive::open(&dir, Clock::Virtual(vc.clone())).unwrap();
        let s = TapeStore::open(Box::new(dev), StoreOptions { prepare_append: prepare, ..opts() }, None, false).unwrap();
        std::thread::sleep(Duration::from_millis(1200));
        let t0 = vc.now();
        s.put("p/x", &bytes(1, 64 << 10)).unwrap();
        s.sync().unwrap();
        vc.now() - t0
    };
    let (with, without) = (first_write_secs(true), first_write_secs(false));
    let locate = small_params().locate_fixed_secs;
    assert!(without - with >= locate * 0.9, "with {with:.2} s, without {without:.2} s");
}

/// The inline policy of the engine, in small: `meta/N.base|delta` names,
/// the newest base and everything after it.
fn chain_policy(max_bytes: u64) -> store::InlinePolicy {
    store::InlinePolicy {
        prefixes: vec!["meta/".into()],
        max_bytes,
        choose: std::sync::Arc::new(|names: &[&str]| match names.iter().rposition(|n| n.ends_with(".base")) {
            Some(i) => names[i..].iter().map(|n| n.to_string()).collect(),
            None => Vec::new(),
        }),
    }
}

fn open_with(dir: &Path, inline: Option<store::InlinePolicy>) -> TapeStore {
    TapeStore::open(Box::new(EmuDrive::open(dir, Clock::virtual_clock()).unwrap()), StoreOptions { inline, ..opts() }, None, false).unwrap()
}

fn locates(dir: &Path) -> u64 {
    cairn_tape::Session::read(dir).expect("the drive's session").stats.locates
}

/// docs/tape.md §8: the catalog carries the metadata chain (the newest
/// base and its deltas, not older versions), so a store opened on a
/// machine with only the tape reads it with the catalog: two locates in
/// all, and no read of the drive for the chain. The copies are the
/// objects' bytes, and recover still rebuilds everything from the blocks.
#[test]
fn the_catalog_carries_the_metadata_chain_inline() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let s = create(&dir, small_params());
    drop(s);
    let s = open_with(&dir, Some(chain_policy(1 << 20)));
    let chain = [("meta/0000000000000003.base", bytes(3, 30_000)), ("meta/0000000000000004.delta", bytes(4, 5_000))];
    s.put("meta/0000000000000001.base", &bytes(1, 20_000)).unwrap();
    s.put("packs/aa/one", &bytes(10, 200_000)).unwrap();
    s.put("meta/0000000000000002.delta", &bytes(2, 4_000)).unwrap();
    s.put("packs/bb/two", &bytes(11, 200_000)).unwrap();
    for (n, d) in &chain {
        s.put(n, d).unwrap();
        s.put(&format!("packs/cc/{}", &n[5..21]), &bytes(12, 100_000)).unwrap();
    }
    s.delete("meta/0000000000000001.base").unwrap(); // pruned, as the engine does
    filler(&s);
    s.sync().unwrap();
    assert_eq!(s.stats().catalog_inline, (2, 35_000));
    drop(s);

    let s = open_with(&dir, Some(chain_policy(1 << 20)));
    for (n, d) in &chain {
        assert!(s.get(n).unwrap() == *d, "{n}");
    }
    assert_eq!(s.get_range(chain[0].0, 100, 10).unwrap(), chain[0].1[100..110]);
    let st = s.stats();
    assert_eq!((st.reads_from_tape, st.reads_inline), (0, 3), "{st:?}");
    drop(s);
    assert!(locates(&dir) <= 2, "{} locates to open and read the chain", locates(&dir));
    // An older version is not inline: it is read from the tape.
    let s = open_with(&dir, Some(chain_policy(1 << 20)));
    assert_eq!(s.get("meta/0000000000000002.delta").unwrap(), bytes(2, 4_000));
    assert_eq!(s.stats().reads_from_tape, 1);
    drop(s);

    // recover (the catalog lost) rebuilds from the blocks: the chain is
    // read from where it lies, and the next catalog carries it again.
    let dev = EmuDrive::open(&dir, Clock::virtual_clock()).unwrap();
    let (r, dev) = store::recover(Box::new(dev), None, &mut |_, _| {}).unwrap();
    assert!(r.had_catalog);
    drop(dev);
    let s = open_with(&dir, Some(chain_policy(1 << 20)));
    for (n, d) in &chain {
        assert!(s.get(n).unwrap() == *d, "{n}");
    }
    assert_eq!(s.stats().reads_inline, 0);
    s.put("packs/dd/after", b"x").unwrap();
    s.sync().unwrap();
    assert_eq!(s.stats().catalog_inline, (2, 35_000), "the chain, read whole, goes in the next catalog");
    drop(s);
    let s = open_with(&dir, Some(chain_policy(1 << 20)));
    assert!(s.get(chain[1].0).unwrap() == chain[1].1);
    assert_eq!(s.stats().reads_inline, 1);
}

/// A chain over the policy's bound is not inline (memory stays bounded);
/// a store without a policy writes none and still reads an inline catalog.
#[test]
fn a_chain_over_the_bound_stays_on_tape_only() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    drop(create(&dir, small_params()));
    let s = open_with(&dir, Some(chain_policy(10_000)));
    s.put("meta/0000000000000001.base", &bytes(1, 8_000)).unwrap();
    s.put("meta/0000000000000002.delta", &bytes(2, 3_000)).unwrap();
    s.sync().unwrap();
    assert_eq!(s.stats().catalog_inline, (0, 0));
    // A new base makes the chain small again.
    s.put("meta/0000000000000003.base", &bytes(3, 6_000)).unwrap();
    s.sync().unwrap();
    assert_eq!(s.stats().catalog_inline, (1, 6_000));
    drop(s);
    let s = open_with(&dir, None);
    assert_eq!(s.get("meta/0000000000000003.base").unwrap(), bytes(3, 6_000));
    assert_eq!(s.stats().reads_inline, 1);
    s.put("packs/x", b"x").unwrap();
    s.sync().unwrap();
    assert_eq!(s.stats().catalog_inline, (0, 0));
    // A name written again is read as written, never from the old copy.
    s.put("meta/0000000000000003.base", &bytes(4, 7_000)).unwrap();
    s.sync().unwrap();
    assert_eq!(s.get("meta/0000000000000003.base").unwrap(), bytes(4, 7_000));
}

/// A store that will only read (a read-only mount) moves the tape, once
/// idle, from the end of data where the catalog left it to the first
/// object it has not got inline: reading that object then starts at once,
/// a locate earlier than without. A read first gives the move up.
#[test]
fn an_idle_read_only_store_prepares_the_first_read() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let s = create(&dir, small_params());
    drop(s);
    let s = open_with(&dir, Some(chain_policy(1 << 20)));
    s.put("meta/0000000000000001.base", &bytes(1, 5_000)).unwrap();
    for i in 0..8 {
        s.put(&format!("packs/p{i}"), &bytes(10 + i, 300_000)).unwrap();
    }
    filler(&s);
    s.sync().unwrap();
    drop(s);
    let first_read_secs = |prepare: bool, idle_ms: u64| {
        let vc = cairn_tape::VirtualClock::new();
        let dev = EmuDrive::open(&dir, Clock::Virtual(vc.clone())).unwrap();
        let o = StoreOptions { prepare_read: prepare, inline: Some(chain_policy(1 << 20)), ..opts() };
        let s = TapeStore::open(Box::new(dev), o, None, false).unwrap();
        std::thread::sleep(Duration::from_millis(idle_ms));
        let t0 = vc.now();
        assert_eq!(s.get("packs/p0").unwrap(), bytes(10, 300_000));
        let secs = vc.now() - t0;
        // The inline base is not where the tape went.
        assert_eq!(s.stats().reads_from_tape, 1);
        secs
    };
    let (with, without) = (first_read_secs(true, 1200), first_read_secs(false, 1200));
    let locate = small_params().locate_fixed_secs;
    assert!(without - with >= locate * 0.9, "with {with:.2} s, without {without:.2} s");
    // Read before the drive was idle: it goes where the read asked, once.
    let early = first_read_secs(true, 0);
    assert!(early >= locate * 0.9, "{early:.2} s");
    assert!(locates(&dir) <= 3, "{} locates", locates(&dir));
}

/// A read that reads through a gap keeps the live objects it passed: read
/// back in an order other than the tape's, every object is read from the
/// tape once, without locating back for one passed over before.
#[test]
fn what_a_read_passes_over_is_kept_not_read_again() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let s = create(&dir, small_params());
    for i in 0..6u64 {
        s.put(&format!("packs/p{i}"), &bytes(20 + i, 300_000)).unwrap();
    }
    s.delete("packs/p3").unwrap();
    filler(&s);
    s.sync().unwrap();
    drop(s);
    let s = reopen(&dir).unwrap();
    for i in [0u64, 2, 1, 5, 4] {
        assert_eq!(s.get(&format!("packs/p{i}")).unwrap(), bytes(20 + i, 300_000), "p{i}");
    }
    let st = s.stats();
    // p0, p2 (passing p1), p5 (passing p4 and the dead p3, which is not kept).
    assert_eq!(st.reads_from_tape, 3, "{st:?}");
    assert!(st.bytes_passed_kept >= 600_000, "{st:?}");
    drop(s);
    // Opening: 2 locates; p0: 1; nothing else goes back.
    assert_eq!(locates(&dir), 3);
}

/// The objects written last lie in the window a mount reads before the
/// catalog: they are kept, and reading them needs the drive no more.
#[test]
fn the_objects_read_with_the_catalog_are_kept() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let s = create(&dir, small_params());
    filler(&s);
    for i in 0..4u64 {
        s.put(&format!("packs/p{i}"), &bytes(30 + i, 200_000)).unwrap();
    }
    s.sync().unwrap();
    drop(s);
    let s = reopen(&dir).unwrap();
    for i in [3u64, 1, 0, 2] {
        assert_eq!(s.get(&format!("packs/p{i}")).unwrap(), bytes(30 + i, 200_000), "p{i}");
    }
    let st = s.stats();
    assert_eq!(st.reads_from_tape, 0, "{st:?}");
    assert!(st.bytes_passed_kept >= 800_000, "{st:?}");
    drop(s);
    assert_eq!(locates(&dir), 2);
}

/// A parked store (its drive thread stopped, so a process may fork) keeps
/// the tape as it is: unparked, it reads and writes on, and what it wrote
/// after is on the tape.
#[test]
fn a_parked_store_goes_on_without_reopening() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let s = create(&dir, small_params());
    s.put("packs/a", &bytes(1, 50_000)).unwrap();
    s.sync().unwrap();
    drop(s);
    let s = reopen(&dir).unwrap();
    s.park();
    s.park(); // twice is harmless
    s.unpark();
    assert_eq!(s.get("packs/a").unwrap(), bytes(1, 50_000));
    s.put("packs/b", &bytes(2, 30_000)).unwrap();
    s.sync().unwrap();
    s.park();
    drop(s); // a parked store closes its drive when dropped
    let s = reopen(&dir).unwrap();
    assert_eq!(s.get("packs/b").unwrap(), bytes(2, 30_000));
    drop(s);
    // The store opened once: two locates to open, none to go on after.
    assert!(locates(&dir) <= 3, "{}", locates(&dir));
}
