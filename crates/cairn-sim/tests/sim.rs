//! `simulate` on hand-made traces whose every figure is worked out by hand.

use cairn_model::prices::Prices;
use cairn_model::trace::{Event, PackStage, Record};
use cairn_sim::{simulate, LayoutKind, Options, PercentOf, Repacking, Row};
use std::path::Path;

const MB: u64 = 1 << 20;
const SEC: u64 = 1_000_000_000;

/// A trace file of `(time, event)` records.
fn write_trace(path: &Path, records: &[(u64, Event)]) {
    let records: Vec<Record> = records.iter().map(|&(time, event)| Record { time, event }).collect();
    cairn_model::trace::write_trace(path, 1, &records).unwrap();
}

/// File 1 writes 6 MiB, file 2 1 MiB; a flush packs them into one pack
/// (file 1's two chunks, then file 2's); then 4 KiB reads of file 2 at 0,
/// file 1 at 5 MiB, file 1 at 0.
fn trace() -> Vec<(u64, Event)> {
    let pack = 0xabcd;
    let place = |ino, offset, len, chunk| Event::Place { ino, offset, len, chunk, described: false };
    vec![
        (SEC, Event::Write { ino: 1, offset: 0, len: 6 * MB }),
        (SEC, Event::Write { ino: 2, offset: 0, len: MB }),
        (2 * SEC, Event::Pack { pack, size: 7 * MB + 100, stage: PackStage::Uploaded }),
        (2 * SEC, Event::Chunk { chunk: 1, pack, offset: 0, len: 3 * MB }),
        (2 * SEC, Event::Chunk { chunk: 2, pack, offset: 3 * MB, len: 3 * MB }),
        (2 * SEC, Event::Chunk { chunk: 3, pack, offset: 6 * MB, len: MB }),
        (2 * SEC, place(1, 0, 3 * MB, 1)),
        (2 * SEC, place(1, 3 * MB, 3 * MB, 2)),
        (2 * SEC, place(2, 0, MB, 3)),
        (3 * SEC, Event::Read { ino: 2, offset: 0, len: 4096 }),
        (4 * SEC, Event::Read { ino: 1, offset: 5 * MB, len: 4096 }),
        (5 * SEC, Event::Read { ino: 1, offset: 0, len: 4096 }),
    ]
}

fn run(percent: f64) -> Vec<Row> {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t");
    write_trace(&p, &trace());
    let o = Options { cache_percents: vec![percent], percent_of: None, cache_bytes: None, policies: vec!["lru".into()], layouts: LayoutKind::ALL.to_vec(), prices: Prices::aws(), pack_block: 4 * MB, pack_ahead: 0, repacking: Default::default() }; // the hand computations below are in 4 MiB blocks
    let r = simulate(&p, &o).unwrap();
    assert_eq!((r.summary.records, r.summary.duration_ns, r.summary.reads, r.summary.writes), (12, 5 * SEC, 3, 2));
    let sets: Vec<(LayoutKind, u64)> = r.data_sets.iter().map(|d| (d.layout, d.bytes)).collect();
    // cairn: the pack, cached as written; segments: file 1's 6 MiB and file 2's
    // 1 MiB; bluesky: the 7 MiB written, 224 blocks of 32 KiB.
    assert_eq!(sets, vec![(LayoutKind::Cairn, 7 * MB + 100), (LayoutKind::CairnSegment, 7 * MB), (LayoutKind::BlueSky, 7 * MB)]);
    r.rows
}

#[test]
fn three_layouts_by_hand() {
    let rows = run(60.0);
    let [cairn, seg, blue] = [&rows[0], &rows[1], &rows[2]];

    // cairn, 4.2 MiB (4,404,079 bytes), misses rounded out to 4 MiB: the
    // pack is cached as it is written, in 64 KiB pieces, and LRU keeps the
    // last 67 full pieces and the 100-byte one: [2,949,120, the end). File
    // 2 (chunk 3, pack bytes 6-7 MiB) and file 1 at 5 MiB (chunk 2, 3-6
    // MiB) hit; file 1 at 0 (chunk 1, 0-3 MiB) fetches [0, 2,949,120),
    // rounded down to 0 and stopped at the held piece, in one GET.
    assert_eq!(cairn.cache_bytes, ((7 * MB + 100) as f64 * 0.6) as u64);
    assert_eq!((cairn.reads, cairn.hits, cairn.gets, cairn.bytes_down), (3, 2, 1, 45 * 65536));
    assert_eq!((cairn.puts, cairn.posts, cairn.bytes_up), (1, 0, 7 * MB + 100));

    // cairn-segment, 4.2 MiB: segment B (file 2, 1 MiB) stays, A (file 1,
    // 6 MiB) is larger than the cache and never does: both reads of file 1
    // fetch it whole (the second time evicting B as well).
    assert_eq!((seg.reads, seg.hits, seg.gets, seg.bytes_down), (3, 1, 2, 12 * MB));

    // bluesky, 134 blocks of 32 KiB: file 1's 6 MiB fill object 0 and 2
    // MiB of object 1 (192 blocks, the first 58 go), file 2's 1 MiB the
    // next 32 blocks of object 1 (32 more go: object 0 keeps blocks
    // 90-127). Reads: file 2 at 0 (object 1 block 64) and file 1 at 5 MiB
    // (object 1 block 32) hit; file 1 at 0 (object 0 block 0) fetches one
    // block.
    assert_eq!((blue.reads, blue.hits, blue.gets, blue.bytes_down), (3, 2, 1, 32 << 10));
    // Object 0 sealed at 1 s, object 1 (3 MiB) put at the end.
    assert_eq!((blue.puts, blue.posts, blue.bytes_up), (2, 0, 7 * MB));

    // Storage over the 5 s: the pack from 2 s, object 0 from 1 s.
    let gb_months = |byte_secs: f64| byte_secs / cairn_model::prices::GB / cairn_model::prices::MONTH_SECS;
    assert!((cairn.storage_gb_months - gb_months((7 * MB + 100) as f64 * 3.0)).abs() < 1e-15);
    assert!((blue.storage_gb_months - gb_months((4 * MB) as f64 * 4.0)).abs() < 1e-15);
    // Requests at AWS's prices: a GET and a PUT.
    assert!((cairn.cost_requests - (0.0004 + 0.005) / 1000.0).abs() < 1e-12);
    let down = (45 * 65536) as f64 / cairn_model::prices::GB * 0.09;
    assert!((cairn.cost_transfer - down).abs() < 1e-12);
    assert!((cairn.cost - (cairn.cost_requests + cairn.cost_transfer + cairn.cost_storage)).abs() < 1e-12);
}

/// With room for everything, only what was never cached misses: nothing,
/// since every layout caches what it writes.
#[test]
fn a_cache_as_large_as_the_data_set_never_misses() {
    for r in run(100.0) {
        assert_eq!((r.reads, r.hits, r.gets, r.bytes_down), (3, 3, 0, 0), "{:?}", r.layout);
    }
}

#[test]
fn bad_options_and_traces_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t");
    write_trace(&p, &trace());
    let o = Options { cache_percents: vec![10.0], percent_of: None, cache_bytes: None, policies: vec!["mru".into()], layouts: vec![LayoutKind::Cairn], prices: Prices::aws(), pack_block: 4 * MB, pack_ahead: 0, repacking: Default::default() };
    assert!(simulate(&p, &o).unwrap_err().to_string().contains("unknown policy"));
    let o = Options { cache_percents: vec![0.0], policies: vec!["lru".into()], ..o };
    assert!(simulate(&p, &o).unwrap_err().to_string().contains("not a positive"));
    std::fs::write(&p, b"not a trace at all, no").unwrap();
    let o = Options { cache_percents: vec![10.0], ..o };
    assert!(simulate(&p, &o).unwrap_err().to_string().contains("not a Cairn trace"));
}

/// A cache of exactly `cache_bytes` gives the same counts as the percentage
/// that comes to the same bytes, in rows marked `at_capacity`.
#[test]
fn a_cache_of_given_bytes_is_the_percentage_of_the_same_size() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t");
    write_trace(&p, &trace());
    let bytes = ((7 * MB + 100) as f64 * 0.6) as u64;
    let o = Options { cache_percents: vec![60.0], percent_of: None, cache_bytes: Some(bytes), policies: vec!["lru".into()], layouts: vec![LayoutKind::Cairn], prices: Prices::aws(), pack_block: 4 * MB, pack_ahead: 0, repacking: Default::default() };
    let rows = simulate(&p, &o).unwrap().rows;
    assert_eq!(rows.len(), 2);
    let (fixed, pct): (Vec<&Row>, Vec<&Row>) = rows.iter().partition(|r| r.at_capacity);
    let (f, q) = (fixed[0], pct[0]);
    assert_eq!((f.cache_bytes, q.cache_bytes), (bytes, bytes));
    assert!((f.cache_percent - 60.0).abs() < 1e-3, "{}", f.cache_percent);
    assert_eq!((f.reads, f.hits, f.gets, f.bytes_down), (q.reads, q.hits, q.gets, q.bytes_down));
    assert!(!q.at_capacity);
}

/// `percent_of` sizes every layout's cache from one number of bytes, so
/// the layouts are compared with the same cache (issue 28), and a
/// percentage of it replays as that many bytes would.
#[test]
fn percentages_of_one_size_give_every_layout_the_same_cache() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t");
    write_trace(&p, &trace());
    let of = 20 * MB;
    let o = Options { cache_percents: vec![25.0], percent_of: Some(PercentOf::Bytes(of)), cache_bytes: Some((of as f64 * 25.0 / 100.0) as u64), policies: vec!["lru".into()], layouts: LayoutKind::ALL.to_vec(), prices: Prices::aws(), pack_block: 4 * MB, pack_ahead: 0, repacking: Default::default() };
    let r = simulate(&p, &o).unwrap();
    // The layouts' own data sets differ, so only `percent_of` makes the sizes equal.
    assert!(r.data_sets.iter().any(|d| d.bytes != r.data_sets[0].bytes), "{:?}", r.data_sets);
    for layout in LayoutKind::ALL {
        let rows: Vec<&Row> = r.rows.iter().filter(|x| x.layout == layout).collect();
        assert_eq!(rows.len(), 2);
        let (fixed, pct): (Vec<&Row>, Vec<&Row>) = rows.into_iter().partition(|x| x.at_capacity);
        assert_eq!(pct[0].cache_bytes, (of as f64 * 25.0 / 100.0) as u64, "{layout:?}");
        assert_eq!((fixed[0].hits, fixed[0].gets, fixed[0].bytes_down), (pct[0].hits, pct[0].gets, pct[0].bytes_down), "{layout:?}");
    }
    // Of a layout's data set: that layout's rows are as without the option.
    let blue = r.data_sets.iter().find(|d| d.layout == LayoutKind::BlueSky).unwrap().bytes;
    let o = Options { percent_of: Some(PercentOf::DataSetOf(LayoutKind::BlueSky)), cache_bytes: None, ..o };
    let r = simulate(&p, &o).unwrap();
    assert!(r.rows.iter().all(|x| x.cache_bytes == (blue as f64 * 25.0 / 100.0) as u64), "{:?}", r.rows);
}

/// Five rounds a second apart, each one 1 MiB file in its own pack, then
/// each file read back: as recorded that is five PUTs; with open packs of
/// 3 MiB the first three rounds share one pack (sealed when the third
/// fills it) and the last two another, sealed at the trace's end. Every
/// layout with the whole data set cached reads nothing from the bucket,
/// and what is stored is the same bytes plus one header and index fewer
/// per merge.
#[test]
fn open_packs_merge_rounds_into_fewer_puts() {
    let mut ev = Vec::new();
    for i in 0..5u64 {
        let (t, pack, chunk, ino) = ((i + 1) * SEC, 100 + i, 10 + i, 1 + i);
        ev.push((t, Event::Write { ino, offset: 0, len: MB }));
        ev.push((t, Event::Pack { pack, size: 24 + MB + 85, stage: PackStage::Uploaded }));
        ev.push((t, Event::Chunk { chunk, pack, offset: 24, len: MB }));
        ev.push((t, Event::Place { ino, offset: 0, len: MB, chunk, described: false }));
    }
    for ino in 1..=5 {
        ev.push((10 * SEC, Event::Read { ino, offset: 0, len: MB }));
    }
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t");
    write_trace(&p, &ev);
    let o = |repacking| Options { cache_percents: vec![100.0], percent_of: None, cache_bytes: None, policies: vec!["lru".into()], layouts: vec![LayoutKind::Cairn, LayoutKind::CairnSegment], prices: Prices::aws(), pack_block: 0, pack_ahead: 0, repacking };
    let recorded = simulate(&p, &o(Repacking::default())).unwrap();
    let open = Repacking { open_target: 3 * MB, open_age_ns: 30 * SEC, ..Repacking::default() };
    let merged = simulate(&p, &o(open)).unwrap();
    for (r, m) in recorded.rows.iter().zip(&merged.rows) {
        assert_eq!((r.puts, m.puts), (5, 2), "{:?}", r.layout);
        assert_eq!((m.reads, m.hits, m.gets), (5, 5, 0), "{:?}", m.layout);
        // Two packs: 3 and 2 chunks, one header and index each.
        assert_eq!(m.bytes_up, 5 * MB + 2 * (24 + 36) + 5 * 49, "{:?}", m.layout);
        assert_eq!(r.bytes_up, 5 * (24 + MB + 85));
    }
    // The second pack goes up at the end (10 s), so it is stored for no time.
    let secs = |gb_months: f64| gb_months * cairn_model::prices::GB * cairn_model::prices::MONTH_SECS;
    let want = (3 * MB + 24 + 36 + 3 * 49) as f64 * 7.0;
    assert!((secs(merged.rows[0].storage_gb_months) - want).abs() < 1.0, "{} {}", secs(merged.rows[0].storage_gb_months), want);
    // Packs open at most half a second: every round seals the pack the
    // round before opened: one PUT per round again, each a round late.
    let aged = simulate(&p, &o(Repacking { open_age_ns: SEC / 2, ..open })).unwrap();
    assert_eq!(aged.rows[0].puts, 5);
}

/// A live trace with a held pack (docs/trace.md): file 1's round held pack
/// 1 in the outbox (cached, no PUT); the next round copied its chunk into
/// pack 2 with file 2's and uploaded that (one PUT), and pack 1 was
/// dropped; a later round held pack 3, released at the end (its PUT).
/// Both files read back from the cache.
#[test]
fn held_packs_cost_a_put_only_when_uploaded() {
    let place = |ino, len, chunk| Event::Place { ino, offset: 0, len, chunk, described: false };
    let ev = vec![
        (SEC, Event::Write { ino: 1, offset: 0, len: MB }),
        (SEC, Event::Pack { pack: 1, size: MB + 100, stage: PackStage::Held }),
        (SEC, Event::Chunk { chunk: 11, pack: 1, offset: 24, len: MB }),
        (SEC, place(1, MB, 11)),
        (2 * SEC, Event::Write { ino: 2, offset: 0, len: MB }),
        (2 * SEC, Event::Pack { pack: 2, size: 2 * MB + 200, stage: PackStage::Uploaded }),
        (2 * SEC, Event::Chunk { chunk: 12, pack: 2, offset: MB + 24, len: MB }),
        (2 * SEC, Event::Chunk { chunk: 11, pack: 2, offset: 24, len: MB }),
        (2 * SEC, place(2, MB, 12)),
        (2 * SEC, Event::Cache { event: cairn_model::trace::CacheEvent::Dropped, pack: 1, offset: 0, len: 0, group: 0 }),
        (3 * SEC, Event::Write { ino: 3, offset: 0, len: 1000 }),
        (3 * SEC, Event::Pack { pack: 3, size: 1100, stage: PackStage::Held }),
        (3 * SEC, Event::Chunk { chunk: 13, pack: 3, offset: 24, len: 1000 }),
        (3 * SEC, place(3, 1000, 13)),
        (4 * SEC, Event::Read { ino: 1, offset: 0, len: MB }),
        (4 * SEC, Event::Read { ino: 2, offset: 0, len: MB }),
        (5 * SEC, Event::Pack { pack: 3, size: 1100, stage: PackStage::Released }),
    ];
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t");
    write_trace(&p, &ev);
    let o = Options { cache_percents: vec![100.0], percent_of: None, cache_bytes: None, policies: vec!["lru".into()], layouts: vec![LayoutKind::Cairn], prices: Prices::aws(), pack_block: 0, pack_ahead: 0, repacking: Repacking::default() };
    let r = &simulate(&p, &o).unwrap().rows[0];
    assert_eq!((r.puts, r.bytes_up), (2, 2 * MB + 200 + 1100));
    assert_eq!((r.reads, r.hits, r.gets), (2, 2, 0));
}

/// A held pack is in the outbox, not the cache: read while held it costs
/// no GET even with no room in the cache; once released and uploaded it is
/// kept like any uploaded pack, and a cache with no room fetches it.
#[test]
fn a_held_pack_reads_locally_until_released() {
    let ev = vec![
        (SEC, Event::Write { ino: 1, offset: 0, len: MB }),
        (SEC, Event::Pack { pack: 1, size: MB + 100, stage: PackStage::Held }),
        (SEC, Event::Chunk { chunk: 11, pack: 1, offset: 24, len: MB }),
        (SEC, Event::Place { ino: 1, offset: 0, len: MB, chunk: 11, described: false }),
        (2 * SEC, Event::Read { ino: 1, offset: 0, len: MB }),
        (3 * SEC, Event::Pack { pack: 1, size: MB + 100, stage: PackStage::Released }),
        (4 * SEC, Event::Read { ino: 1, offset: 0, len: MB }),
    ];
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("t");
    write_trace(&p, &ev);
    let o = Options { cache_percents: vec![0.001], percent_of: None, cache_bytes: None, policies: vec!["lru".into()], layouts: vec![LayoutKind::Cairn], prices: Prices::aws(), pack_block: 0, pack_ahead: 0, repacking: Repacking::default() };
    let r = &simulate(&p, &o).unwrap().rows[0];
    assert_eq!((r.reads, r.hits, r.gets, r.bytes_down), (2, 1, 1, MB), "the first read is local, the second a GET");
    assert_eq!(r.puts, 1);
}
