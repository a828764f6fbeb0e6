//! `store::reclaim` (`cairn tape reclaim`) on emulated drives, virtual
//! clock: the live objects of one tape copied to a blank one in one pass,
//! byte for byte, leaving the source as it was; destinations that are not
//! blank refused; the end of the destination's medium reported.

use crate::common::{bytes, small_params};
use cairn_backend::{Backend, ErrorKind};
use cairn_tape::store::{self, StoreOptions, TapeStore};
use cairn_tape::{Clock, EmuDrive, EmuParams, TapeDevice};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

fn opts() -> StoreOptions {
    StoreOptions { queue_bytes: 2 << 20, read_ahead: 1 << 20, read_buffer: 4 << 20, batch_window: Duration::from_millis(5), pack_size: 1 << 20, prepare_append: false, prepare_read: false, inline: None }
}


fn open(dir: &Path) -> TapeStore {
    TapeStore::open(Box::new(EmuDrive::open(dir, Clock::virtual_clock()).unwrap()), opts(), None, false).unwrap()
}

fn blank(dir: &Path, p: EmuParams) -> Box<dyn TapeDevice> {
    Box::new(EmuDrive::create(dir, p, Clock::virtual_clock()).unwrap())
}

/// A tape as a volume leaves it: a config, packs and metadata versions
/// over several syncs, some packs deleted, some names put again (the old
/// copy dead), one object deleted and never synced again. Returns what
/// should be live.
fn used_tape(dir: &Path, p: EmuParams) -> BTreeMap<String, Vec<u8>> {
    let s = TapeStore::open(blank(dir, p), opts(), None, true).unwrap();
    let mut live = BTreeMap::new();
    let put = |live: &mut BTreeMap<String, Vec<u8>>, n: &str, d: Vec<u8>| {
        s.put(n, &d).unwrap();
        live.insert(n.to_string(), d);
    };
    put(&mut live, "config", b"the volume's config".to_vec());
    for round in 0..4u64 {
        for i in 0..8u64 {
            let k = round * 8 + i;
            // Sizes from under a block to several blocks (4032 payload bytes each).
            put(&mut live, &format!("packs/{k:02}/p"), bytes(k, 500 + 7_919 * (k as usize % 9)));
        }
        put(&mut live, &format!("meta/{round:04}.base"), bytes(100 + round, 3_000));
        s.sync().unwrap();
    }
    for k in [1u64, 2, 9, 17, 30] {
        s.delete(&format!("packs/{k:02}/p")).unwrap();
        live.remove(&format!("packs/{k:02}/p"));
    }
    // Put again: the newest copy is live, the old one dead.
    put(&mut live, "packs/05/p", bytes(500, 20_000));
    put(&mut live, "meta/0000.base", bytes(501, 2_000));
    s.sync().unwrap();
    live
}

fn image(dir: &Path) -> Vec<u8> {
    std::fs::read(dir.join("tape.img")).unwrap()
}

/// The destination names exactly the source's live objects with their
/// bytes, holds no dead byte and mounts from the tape alone; the source is
/// unchanged, and was read in one pass (a few locates, not one per object).
#[test]
fn reclaim_copies_exactly_the_live_objects_in_one_pass() {
    let t = tempfile::tempdir().unwrap();
    let (sdir, ddir) = (t.path().join("src"), t.path().join("dst"));
    let live = used_tape(&sdir, small_params());
    let before = image(&sdir);
    let src = open(&sdir);
    let (src_live, src_dead) = src.space();
    assert!(src_dead > 0, "the source has dead bytes to leave behind");
    let dst = store::open_blank(blank(&ddir, small_params()), opts()).unwrap();
    let mut calls: Vec<(u64, u64)> = Vec::new();
    let rep = store::reclaim(&src, &dst, &mut |d, n| calls.push((d, n))).unwrap();
    assert_eq!((rep.objects, rep.bytes, rep.dead_bytes_left), (live.len() as u64, src_live, src_dead));
    assert_ne!(rep.src_volume, rep.dst_volume);
    assert!(calls.windows(2).all(|w| w[0].0 <= w[1].0), "progress only grows: {calls:?}");
    assert_eq!(calls.last(), Some(&(src_live, src_live)));
    drop(src);
    drop(dst);

    // One pass: opening reads the label and locates to the catalog (2),
    // then one locate to the first object; every later object is read on
    // from where the last ended (dead gaps are read through).
    let locates = cairn_tape::Session::read(&sdir).expect("the source drive's session").stats.locates;
    assert!(locates <= 3, "{locates} locates on the source");
    assert!(image(&sdir) == before, "the source tape was changed");

    let d = open(&ddir);
    assert_ne!(d.label().volume_id.to_string(), rep.src_volume);
    let idx = d.index();
    assert_eq!(idx.objects.keys().collect::<Vec<_>>(), live.keys().collect::<Vec<_>>());
    for (n, want) in &live {
        assert!(&d.get(n).unwrap() == want, "{n}");
    }
    assert_eq!(d.space(), (src_live, 0));
    // Written in the source's order: the config (put first) comes first.
    let first = idx.objects.iter().min_by_key(|(_, e)| e.extents[0].start).unwrap().0;
    assert_eq!(first, "config");
}

/// A destination that is not blank is refused and left as it was: another
/// Cairn tape (named by its volume id), data that is not Cairn's, a store
/// holding objects, and the source itself.
#[test]
fn reclaim_refuses_a_destination_that_is_not_blank() {
    let t = tempfile::tempdir().unwrap();
    let (sdir, odir, rdir) = (t.path().join("src"), t.path().join("other"), t.path().join("raw"));
    used_tape(&sdir, small_params());
    // An empty but formatted Cairn tape.
    let other = TapeStore::open(blank(&odir, small_params()), opts(), None, true).unwrap();
    let vid = other.label().volume_id.to_string();
    other.sync().unwrap();
    drop(other);
    let before = image(&odir);
    let e = store::open_blank(Box::new(EmuDrive::open(&odir, Clock::virtual_clock()).unwrap()), opts()).err().expect("a labelled tape must be refused");
    assert_eq!(e.kind(), ErrorKind::AlreadyExists);
    assert!(e.to_string().contains(&vid) && e.to_string().contains("blank"), "{e}");
    assert!(image(&odir) == before);

    // Raw blocks (`cairn tape dd --to`, a tar archive).
    let mut raw = blank(&rdir, small_params());
    raw.write_blocks(&vec![0x41; 4096 * 3]).unwrap();
    raw.write_filemarks(1).unwrap();
    drop(raw);
    let e = store::open_blank(Box::new(EmuDrive::open(&rdir, Clock::virtual_clock()).unwrap()), opts()).err().expect("raw data must be refused");
    assert!(e.to_string().contains("not a Cairn tape"), "{e}");

    // A store that holds objects, opened some other way.
    let src = open(&sdir);
    let full = TapeStore::open(blank(&t.path().join("full"), small_params()), opts(), None, true).unwrap();
    full.put("x", b"data").unwrap();
    full.sync().unwrap();
    let e = store::reclaim(&src, &full, &mut |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("blank"), "{e}");
    assert_eq!(full.get("x").unwrap(), b"data");
    assert_eq!(full.index().objects.len(), 1);

    // The same tape twice.
    let e = store::reclaim(&src, &src, &mut |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("same tape"), "{e}");
}

/// The destination's medium ends before the copy does: NoSpace, saying
/// how far it got and that the destination is partial; the source is
/// unchanged.
#[test]
fn reclaim_reports_the_end_of_the_destination_medium() {
    let t = tempfile::tempdir().unwrap();
    let (sdir, ddir) = (t.path().join("src"), t.path().join("dst"));
    let live = used_tape(&sdir, small_params());
    assert!(live.values().map(|d| d.len()).sum::<usize>() > 400_000);
    let before = image(&sdir);
    let mut p = small_params();
    p.capacity_bytes = 300_000;
    p.early_warning_bytes = 64 << 10;
    let src = open(&sdir);
    let dst = store::open_blank(blank(&ddir, p), opts()).unwrap();
    let e = store::reclaim(&src, &dst, &mut |_, _| {}).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NoSpace, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("partial copy") && msg.contains(&format!("of {} objects", live.len())) && msg.contains("untouched"), "{msg}");
    drop(src);
    drop(dst);
    assert!(image(&sdir) == before, "the source tape was changed");
}
