//! The on-tape layout: round trips, appends, recovery, damage, end of medium.

use std::collections::BTreeMap;

use cairn_tape::layout::{
    self, frame_catalog, unframe_catalog, BlockHeader, BlockKind, Extent, Label, LabelError,
    LayoutError, TapeWriter, VolumeId,
};
use cairn_tape::{Clock, CrashModel, EmuDrive, EmuParams, TapeDevice};
use proptest::prelude::*;

use crate::common::{emu, small_params};

const BS: usize = 4096;
const VOL: VolumeId = VolumeId([0xab; 16]);

fn data(id: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64 * 13 + id * 101 + (i as u64 >> 8)) as u8)
        .collect()
}

fn label() -> Label {
    Label::new(VOL, BS as u32, 1_790_000_000, b"volume config goes here")
}

/// A catalog as the engine might keep one: object id -> extents.
fn catalog_bytes(map: &BTreeMap<u64, Vec<Extent>>) -> Vec<u8> {
    serde_json::to_vec(map).unwrap()
}

fn catalog_map(bytes: &[u8]) -> BTreeMap<u64, Vec<Extent>> {
    serde_json::from_slice(bytes).unwrap()
}

/// A tape formatted with an empty catalog, and a writer at its append point.
fn formatted(dir: &std::path::Path, p: EmuParams) -> (EmuDrive, cairn_tape::VirtualClock, Label, TapeWriter) {
    let (mut dev, vc) = emu(dir, p);
    let l = label();
    let c = layout::format(&mut dev, &l, b"").unwrap();
    let w = TapeWriter::new(&l, c.append_point());
    (dev, vc, l, w)
}

fn slot_offset(pos: u64) -> u64 {
    pos * (8 + BS as u64)
}

fn corrupt(dir: &std::path::Path, pos: u64, at: usize) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.join("tape.img"))
        .unwrap();
    let off = slot_offset(pos) + 8 + at as u64;
    let mut b = [0u8; 1];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, off).unwrap();
    b[0] ^= 0x40;
    std::os::unix::fs::FileExt::write_all_at(&f, &b, off).unwrap();
}

fn reopen(dir: &std::path::Path) -> EmuDrive {
    EmuDrive::open(dir, Clock::virtual_clock()).unwrap()
}

/// Writes objects 1..=3 interleaved in runs, as a scheduler would, and a catalog.
fn write_interleaved(dev: &mut EmuDrive) -> (BTreeMap<u64, Vec<Extent>>, layout::CatalogLocation) {
    let l = label();
    let first = layout::format(dev, &l, &catalog_bytes(&BTreeMap::new())).unwrap();
    let mut w = TapeWriter::new(&l, first.append_point());
    let cap = w.payload_capacity();
    let objs = [
        (1u64, data(1, 5 * cap + 100)),
        (2, data(2, 3 * cap)),
        (3, data(3, 17)),
    ];
    let mut map: BTreeMap<u64, Vec<Extent>> = BTreeMap::new();
    // Runs: 1a 2a 1b 3 2b 1c 2c
    let plan: [(u64, std::ops::Range<usize>, bool); 7] = [
        (1, 0..2 * cap, false),
        (2, 0..cap, false),
        (1, 2 * cap..4 * cap, false),
        (3, 0..17, true),
        (2, cap..2 * cap, false),
        (1, 4 * cap..5 * cap + 100, true),
        (2, 2 * cap..3 * cap, true),
    ];
    for (id, range, last) in plan {
        let bytes = &objs.iter().find(|o| o.0 == id).unwrap().1[range];
        let e = w.write(dev, id, bytes, last).unwrap();
        map.entry(id).or_default().push(e);
    }
    assert!(w.open_objects().is_empty());
    let loc = w.write_catalog(dev, &catalog_bytes(&map)).unwrap();
    (map, loc)
}

#[test]
fn interleaved_objects_round_trip_through_label_and_catalog() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let (mut dev, _vc) = emu(&dir, small_params());
    let (map, loc) = write_interleaved(&mut dev);
    drop(dev);
    // Another process (a "mount" elsewhere) starts from the tape alone.
    let mut dev = reopen(&dir);
    let l = layout::read_label(&mut dev, Some(VOL)).unwrap();
    assert_eq!(l, label());
    let cat = layout::read_catalog(&mut dev, &l, None).unwrap();
    assert_eq!(cat.location, loc);
    let got = catalog_map(&cat.bytes);
    assert_eq!(got, map);
    let cap = BS - layout::HEADER_LEN;
    for (id, len) in [(1u64, 5 * cap + 100), (2, 3 * cap), (3, 17)] {
        assert_eq!(
            layout::read_object(&mut dev, &l, &got[&id]).unwrap(),
            data(id, len),
            "object {id}"
        );
    }
    // With the position hint.
    assert_eq!(
        layout::read_catalog(&mut dev, &l, Some(loc.start)).unwrap(),
        cat
    );
    // A stale hint (pointing into data) falls back to the end of data.
    assert_eq!(layout::read_catalog(&mut dev, &l, Some(3)).unwrap(), cat);
    // The layout: label, filemark, data..., filemark, catalog, filemark.
    let report = layout::scan(&mut dev, Some(VOL)).unwrap();
    assert_eq!(
        report.filemarks,
        vec![loc.start - 1, loc.start + loc.blocks]
    );
    assert_eq!(report.catalog.as_ref(), Some(&cat));
    assert!(
        report.objects.values().all(|o| o.complete),
        "{:?}",
        report.objects
    );
    for (id, o) in &report.objects {
        assert_eq!(
            &o.extents, &map[id],
            "scan rebuilds the same extents for object {id}"
        );
    }
}

#[test]
fn appending_overwrites_the_old_catalog_and_keeps_old_objects() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let (mut dev, _vc) = emu(&dir, small_params());
    let (mut map, loc1) = write_interleaved(&mut dev);
    drop(dev);
    let mut dev = reopen(&dir);
    let l = layout::read_label(&mut dev, Some(VOL)).unwrap();
    let cat = layout::read_catalog(&mut dev, &l, None).unwrap();
    let mut w = TapeWriter::new(&l, cat.append_point());
    assert_eq!(
        w.position(),
        loc1.start - 1,
        "appending starts at the filemark before the old catalog"
    );
    let e = w.write(&mut dev, 4, &data(4, 9000), true).unwrap();
    assert_eq!(e.start, loc1.start - 1);
    map.insert(4, vec![e]);
    let loc2 = w.write_catalog(&mut dev, &catalog_bytes(&map)).unwrap();
    assert_eq!(loc2.generation, loc1.generation + 1);
    let cat2 = layout::read_catalog(&mut dev, &l, None).unwrap();
    assert_eq!(catalog_map(&cat2.bytes), map);
    for (id, ex) in &map {
        layout::read_object(&mut dev, &l, ex).unwrap_or_else(|e| panic!("object {id}: {e}"));
    }
    let report = layout::scan(&mut dev, None).unwrap();
    assert_eq!(
        report.max_generation, loc2.generation,
        "the old catalog is gone"
    );
    assert_eq!(report.filemarks.len(), 2);
}

#[test]
fn an_object_can_continue_across_a_catalog() {
    let t = tempfile::tempdir().unwrap();
    let (mut dev, _vc, l, mut w) = formatted(&t.path().join("tape"), small_params());
    let d = data(9, 20_000);
    let e1 = w.write(&mut dev, 9, &d[..10_000], false).unwrap();
    w.write_catalog(&mut dev, b"sync while object 9 is open")
        .unwrap();
    let e2 = w.write(&mut dev, 9, &d[10_000..], true).unwrap();
    w.write_catalog(&mut dev, b"object 9 done").unwrap();
    assert_eq!(layout::read_object(&mut dev, &l, &[e2, e1]).unwrap(), d);
    assert_eq!(
        layout::read_catalog(&mut dev, &l, None).unwrap().bytes,
        b"object 9 done"
    );
}

#[test]
fn reads_between_writes_leave_no_stray_filemark() {
    let t = tempfile::tempdir().unwrap();
    let (mut dev, _vc, l, mut w) = formatted(&t.path().join("tape"), small_params());
    let a = w.write(&mut dev, 1, &data(1, 5000), true).unwrap();
    let b1 = w.write(&mut dev, 2, &data(2, 8000), false).unwrap();
    // Reading right after a write: the drive writes a filemark before it moves.
    assert_eq!(
        layout::read_object(&mut dev, &l, &[a]).unwrap(),
        data(1, 5000)
    );
    // The writer locates back and overwrites it.
    let b2 = w.write(&mut dev, 2, &data(2, 3000), true).unwrap();
    assert_eq!(b2.start, b1.start + b1.blocks);
    let loc = w.write_catalog(&mut dev, b"c").unwrap();
    let report = layout::scan(&mut dev, None).unwrap();
    assert_eq!(
        report.filemarks,
        vec![loc.start - 1, loc.start + loc.blocks]
    );
    assert!(report.objects[&2].complete);
}

#[test]
fn scan_after_a_power_loss_recovers_every_flushed_object() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let mut p = small_params();
    p.crash = CrashModel::PowerLoss;
    let buffer = p.buffer_bytes as usize;
    let (mut dev, _vc, _, mut w) = formatted(&dir, p);
    let a = w.write(&mut dev, 10, &data(10, 50_000), true).unwrap();
    let b = w.write(&mut dev, 11, &data(11, 30_000), true).unwrap();
    w.flush(&mut dev).unwrap(); // like an fsync: 10 and 11 are durable
                                // Object 12 is larger than the drive buffer: its start reaches the tape,
                                // its end is still in the buffer; 13 is entirely in the buffer.
    w.write(&mut dev, 12, &data(12, buffer * 2), true).unwrap();
    w.write(&mut dev, 13, &data(13, 10_000), true).unwrap();
    dev.simulate_power_loss();

    let mut dev = reopen(&dir);
    let l = layout::read_label(&mut dev, Some(VOL)).unwrap();
    match layout::read_catalog(&mut dev, &l, None) {
        Err(LayoutError::NoCatalog { .. }) => {}
        other => panic!("the tape ends in data blocks, read_catalog must say so: {other:?}"),
    }
    let report = layout::scan(&mut dev, Some(VOL)).unwrap();
    let complete: Vec<u64> = report.complete().map(|o| o.object_id).collect();
    assert_eq!(complete, vec![10, 11], "{:?}", report.objects);
    let twelve = &report.objects[&12];
    assert!(
        !twelve.complete
            && twelve
                .problem
                .as_deref()
                .unwrap()
                .contains("last block is missing"),
        "{twelve:?}"
    );
    assert!(
        !report.objects.contains_key(&13),
        "object 13 never left the buffer"
    );
    assert_eq!(report.objects[&10].extents, vec![a]);
    assert_eq!(report.objects[&11].extents, vec![b]);
    assert_eq!(
        layout::read_object(&mut dev, &l, &report.objects[&10].extents).unwrap(),
        data(10, 50_000)
    );
    assert_eq!(
        layout::read_object(&mut dev, &l, &report.objects[&11].extents).unwrap(),
        data(11, 30_000)
    );
    assert_eq!(report.max_object_id, Some(12));
    // Recovery writes a rebuilt catalog after the last block found.
    let mut w = TapeWriter::new(&l, report.append_point());
    let loc = w.write_catalog(&mut dev, b"rebuilt").unwrap();
    assert_eq!(loc.start, report.data_end + 1);
    assert_eq!(
        layout::read_catalog(&mut dev, &l, None).unwrap().bytes,
        b"rebuilt"
    );
    assert_eq!(
        layout::read_object(&mut dev, &l, &report.objects[&11].extents).unwrap(),
        data(11, 30_000)
    );
}

#[test]
fn a_damaged_catalog_is_an_error_and_scan_recovers() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let (mut dev, _vc) = emu(&dir, small_params());
    let (map, loc) = write_interleaved(&mut dev);
    drop(dev);
    corrupt(&dir, loc.start, layout::HEADER_LEN + 60);
    let mut dev = reopen(&dir);
    let l = layout::read_label(&mut dev, Some(VOL)).unwrap();
    let e = layout::read_catalog(&mut dev, &l, None).unwrap_err();
    assert!(
        matches!(e, LayoutError::DamagedCatalog { position, .. } if position == loc.start),
        "{e}"
    );
    assert!(
        e.to_string().contains("tape recover"),
        "the message offers recovery: {e}"
    );
    let report = layout::scan(&mut dev, Some(VOL)).unwrap();
    assert!(report.catalog.is_none());
    assert_eq!(report.bad_blocks.len(), 1);
    assert_eq!(report.bad_blocks[0].position, loc.start);
    for (id, ex) in &map {
        assert_eq!(&report.objects[id].extents, ex);
        assert!(report.objects[id].complete);
    }
    let mut w = TapeWriter::new(&l, report.append_point());
    w.write_catalog(&mut dev, &catalog_bytes(&map)).unwrap();
    assert_eq!(
        catalog_map(&layout::read_catalog(&mut dev, &l, None).unwrap().bytes),
        map
    );
}

#[test]
fn a_catalog_overwritten_with_garbage_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let (mut dev, _vc) = emu(&dir, small_params());
    let (_, loc) = write_interleaved(&mut dev);
    // Garbage blocks where the catalog was (through the device: a valid tape
    // with rubbish after the data).
    dev.locate(loc.start).unwrap();
    dev.write_blocks(&vec![0x77; 3 * BS]).unwrap();
    dev.write_filemarks(1).unwrap();
    let l = layout::read_label(&mut dev, None).unwrap();
    let e = layout::read_catalog(&mut dev, &l, Some(loc.start)).unwrap_err();
    assert!(matches!(e, LayoutError::DamagedCatalog { .. }), "{e}");
    let report = layout::scan(&mut dev, None).unwrap();
    assert_eq!(report.bad_blocks.len(), 3);
    assert_eq!(report.complete().count(), 3);
}

/// A catalog whose blocks run past the length its frame declares (or that
/// declares more than a catalog may hold) is refused at the block where
/// it does, not read whole into memory first.
#[test]
fn a_catalog_longer_than_it_declares_is_refused_where_it_overruns() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let (mut dev, _vc) = emu(&dir, small_params());
    let l = label();
    let c = layout::format(&mut dev, &l, b"").unwrap();
    let start = c.start;
    let cap = (BS - layout::HEADER_LEN) as u64;
    // Two blocks' worth less 100 bytes: the second block overruns it.
    for (declared, bad_at) in [(2 * cap - 48 - 100, 1u64), (layout::CATALOG_MAX + 1, 0)] {
        dev.locate(start).unwrap();
        let cap = cap as usize;
        let mut framed = b"CRNCATLG".to_vec();
        framed.extend_from_slice(&declared.to_le_bytes());
        framed.resize(3 * cap, 0x55);
        let mut blocks = vec![0u8; 3 * BS];
        for (i, p) in framed.chunks(cap).enumerate() {
            let h = BlockHeader { kind: BlockKind::Catalog, last: i == 2, volume_id: VOL, object_id: 1, seq: i as u64, offset: (i * cap) as u64, payload_len: p.len() as u32 };
            h.encode(p, &mut blocks[i * BS..(i + 1) * BS]);
        }
        dev.write_blocks(&blocks).unwrap();
        dev.write_filemarks(1).unwrap();
        let e = layout::read_catalog(&mut dev, &l, None).unwrap_err();
        assert!(matches!(e, LayoutError::DamagedCatalog { position, .. } if position == start + bad_at), "{declared}: {e}");
        assert!(e.to_string().contains("declared length"), "{e}");
    }
}

#[test]
fn a_damaged_data_block_is_named_on_read() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let (mut dev, _vc) = emu(&dir, small_params());
    let (map, _) = write_interleaved(&mut dev);
    drop(dev);
    let victim = map[&1][1].start; // the second run of object 1
    corrupt(&dir, victim, layout::HEADER_LEN + 5);
    let mut dev = reopen(&dir);
    let l = layout::read_label(&mut dev, None).unwrap();
    let e = layout::read_object(&mut dev, &l, &map[&1]).unwrap_err();
    assert!(
        matches!(e, LayoutError::BadBlock { position, .. } if position == victim),
        "{e}"
    );
    assert!(
        layout::read_object(&mut dev, &l, &map[&2]).is_ok(),
        "other objects still read"
    );
    // An extent pointing at the wrong object is refused too.
    let mut wrong = map[&2][0];
    wrong.object_id = 3;
    assert!(matches!(
        layout::read_object(&mut dev, &l, &[wrong]),
        Err(LayoutError::BadBlock { .. })
    ));
}

#[test]
fn end_of_medium_during_a_write_keeps_earlier_data_and_room_for_the_catalog() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let mut p = small_params();
    p.capacity_bytes = 200 * BS as u64;
    p.early_warning_bytes = 30 * BS as u64;
    let (mut dev, _vc, l, mut w) = formatted(&dir, p);
    let mut written = BTreeMap::new();
    let mut failed = None;
    for id in 1..100u64 {
        match w.write(&mut dev, id, &data(id, 20_000), true) {
            Ok(e) => {
                written.insert(id, vec![e]);
            }
            Err(LayoutError::EndOfMedium { object_id, .. }) => {
                failed = Some(object_id);
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    let failed = failed.expect("the medium never ended");
    assert!(written.len() > 20);
    // The catalog goes into the early-warning zone.
    w.write_catalog(&mut dev, &catalog_bytes(&written)).unwrap();
    let cat = layout::read_catalog(&mut dev, &l, None).unwrap();
    assert_eq!(catalog_map(&cat.bytes), written);
    for (id, ex) in &written {
        assert_eq!(
            layout::read_object(&mut dev, &l, ex).unwrap(),
            data(*id, 20_000)
        );
    }
    let report = layout::scan(&mut dev, None).unwrap();
    assert!(report.objects.get(&failed).is_none_or(|o| !o.complete));
}

#[test]
fn label_errors_are_clear() {
    let t = tempfile::tempdir().unwrap();
    // Blank.
    let (mut dev, _vc) = emu(&t.path().join("blank"), small_params());
    assert!(matches!(
        layout::read_label(&mut dev, None),
        Err(LayoutError::BlankTape { .. })
    ));
    // Not Cairn.
    dev.write_blocks(&vec![b't'; BS]).unwrap();
    dev.flush().unwrap();
    assert!(matches!(
        layout::read_label(&mut dev, None),
        Err(LayoutError::NotCairnTape { .. })
    ));
    // Wrong volume.
    let dir = t.path().join("tape");
    let (mut dev, _vc) = emu(&dir, small_params());
    layout::format(&mut dev, &label(), b"").unwrap();
    let e = layout::read_label(&mut dev, Some(VolumeId([1; 16]))).unwrap_err();
    assert!(
        matches!(e, LayoutError::WrongVolume { found, .. } if found == VOL),
        "{e}"
    );
    assert!(
        e.to_string().contains("abababab") && e.to_string().contains("01010101"),
        "{e}"
    );
    // Unknown version.
    let mut v2 = label();
    v2.version = 2;
    dev.rewind().unwrap();
    dev.write_blocks(&v2.encode()).unwrap();
    dev.flush().unwrap();
    let e = layout::read_label(&mut dev, None).unwrap_err();
    assert!(
        matches!(e, LayoutError::UnknownVersion { version: 2, .. }),
        "{e}"
    );
    drop(dev);
    // Damaged.
    let (mut dev, _vc) = emu(&t.path().join("t3"), small_params());
    layout::format(&mut dev, &label(), b"").unwrap();
    drop(dev);
    corrupt(&t.path().join("t3"), 0, 33);
    let mut dev = reopen(&t.path().join("t3"));
    assert!(matches!(
        layout::read_label(&mut dev, None),
        Err(LayoutError::DamagedLabel { .. })
    ));
    // Block size mismatch.
    let mut big = label();
    big.block_size = 8192;
    assert!(matches!(
        layout::format(&mut dev, &big, b""),
        Err(LayoutError::BlockSizeMismatch { tape: 8192, .. })
    ));
}

/// Writes `blocks` data blocks in 20 objects, then `catalog`.
fn tape_with_catalog(dir: &std::path::Path, blocks: usize, catalog: &[u8]) {
    let (mut dev, _vc, _, mut w) = formatted(dir, small_params());
    for id in 0..20u64 {
        w.write(&mut dev, id, &data(id, blocks / 20 * (BS - layout::HEADER_LEN)), true).unwrap();
    }
    w.write_catalog(&mut dev, catalog).unwrap();
}

#[test]
fn mounting_reads_only_label_and_catalog() {
    // 20,000 data blocks (80 MiB) on the tape; mounting reads the last
    // window's worth of them, not the tape.
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    tape_with_catalog(&dir, 20_000, b"cat");
    let mut dev = reopen(&dir);
    let l = layout::read_label(&mut dev, None).unwrap();
    let c = layout::read_catalog(&mut dev, &l, None).unwrap();
    assert_eq!(c.bytes, b"cat");
    let s = dev.stats();
    assert!(s.bytes_read <= layout::CATALOG_WINDOW + 2 * BS as u64, "mounting read {} bytes", s.bytes_read);
    // Each locate costs seconds: space to the end, one locate back to the
    // window before it, nothing more; the tape is left at the end of data.
    assert_eq!(s.locates, 2, "{s:?}");
    assert!(dev.status().unwrap().eod);
    // With the catalog's position known (kept from when it was written):
    // one locate, and reading on proves nothing follows it.
    drop(dev);
    let mut dev = reopen(&dir);
    let l = layout::read_label(&mut dev, None).unwrap();
    let again = layout::read_catalog(&mut dev, &l, Some(c.location.start)).unwrap();
    assert_eq!(again.bytes, b"cat");
    assert_eq!(dev.stats().locates, 1);
    // A stale hint (the catalog moved on) falls back to the end of data.
    drop(dev);
    let mut dev = reopen(&dir);
    let l = layout::read_label(&mut dev, None).unwrap();
    assert_eq!(layout::read_catalog(&mut dev, &l, Some(2)).unwrap().bytes, b"cat");
}

/// A catalog of many blocks inside the window is read with the window (two
/// locates); one longer than the window costs one locate more, back to its
/// start, and is read whole all the same.
#[test]
fn a_long_catalog_costs_one_locate_more_only_past_the_window() {
    let t = tempfile::tempdir().unwrap();
    for (name, len, locates) in [("in", 2 << 20, 2), ("past", layout::CATALOG_WINDOW as usize + (1 << 20), 3)] {
        let dir = t.path().join(name);
        let cat = data(7, len);
        tape_with_catalog(&dir, 2_000, &cat);
        let mut dev = reopen(&dir);
        let l = layout::read_label(&mut dev, None).unwrap();
        let c = layout::read_catalog(&mut dev, &l, None).unwrap();
        assert!(c.bytes == cat, "{name}: the catalog read back differs");
        assert_eq!(dev.stats().locates, locates, "{name}");
        assert!(dev.status().unwrap().eod, "{name}: left at the end of data");
    }
}

#[test]
fn parsers_round_trip() {
    let l = label();
    assert_eq!(Label::parse(&l.encode()).unwrap(), l);
    let mut b = l.encode();
    b[20] ^= 1;
    assert_eq!(
        Label::parse(&b),
        Err(LabelError::Damaged("checksum mismatch".into()))
    );
    let h = BlockHeader {
        kind: BlockKind::Data,
        last: true,
        volume_id: VOL,
        object_id: 7,
        seq: 3,
        offset: 99,
        payload_len: 5,
    };
    let mut block = vec![0xffu8; 512];
    h.encode(b"hello", &mut block);
    let (h2, p) = BlockHeader::decode(&block).unwrap();
    assert_eq!((h2, p), (h, &b"hello"[..]));
    assert!(
        block[layout::HEADER_LEN + 5..].iter().all(|&x| x == 0),
        "padding is zero"
    );
    block[70] ^= 1;
    assert!(
        BlockHeader::decode(&block).is_ok(),
        "padding is not covered by the checksum"
    );
    block[66] ^= 1;
    assert!(
        BlockHeader::decode(&block).is_err(),
        "a payload byte changed"
    );
    let f = frame_catalog(b"catalog");
    assert_eq!(unframe_catalog(&f).unwrap(), b"catalog");
    assert!(unframe_catalog(&f[..f.len() - 1]).is_err());
}

proptest! {
    #[test]
    fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600), flip in 0usize..600) {
        let _ = Label::parse(&bytes);
        let _ = BlockHeader::decode(&bytes);
        let _ = unframe_catalog(&bytes);
        // Valid structures with one byte changed are refused, not misread.
        let l = Label::new(VOL, 512, 5, &bytes[..bytes.len().min(100)]);
        let mut b = l.encode();
        let i = flip % b.len();
        b[i] ^= 0x10;
        if let Ok(parsed) = Label::parse(&b) {
            prop_assert!(i >= 64 + l.info.len(), "a change at byte {} went unnoticed: {:?}", i, parsed);
        }
    }
}

#[test]
fn real_clock_emulator_works_with_the_layout() {
    let t = tempfile::tempdir().unwrap();
    let mut p = EmuParams {
        block_size: BS as u32,
        ..EmuParams::default()
    };
    p.buffer_bytes = 1 << 20;
    let mut dev = EmuDrive::create(&t.path().join("tape"), p, Clock::real()).unwrap();
    let l = label();
    let c = layout::format(&mut dev, &l, b"x").unwrap();
    let mut w = TapeWriter::new(&l, c.append_point());
    let e = w.write(&mut dev, 1, &data(1, 100_000), true).unwrap();
    w.write_catalog(&mut dev, b"y").unwrap();
    assert_eq!(
        layout::read_object(&mut dev, &l, &[e]).unwrap(),
        data(1, 100_000)
    );
    assert_eq!(dev.block_size(), BS);
}

/// A catalog written right after streaming data costs no backhitch: its
/// leading filemark does not stop the tape (immediate mode), only the
/// closing one does, and the data and the catalog are durable after it.
#[test]
fn a_catalog_after_streaming_data_does_not_backhitch() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("tape");
    let (mut dev, _vc, _, mut w) = formatted(&dir, small_params());
    let before = dev.stats().backhitches;
    for id in 0..8u64 {
        w.write(&mut dev, id, &data(id, 200 * (BS - layout::HEADER_LEN)), true).unwrap();
    }
    let loc = w.write_catalog(&mut dev, b"cat").unwrap();
    assert_eq!(dev.stats().backhitches, before, "{:?}", dev.stats());
    drop(dev);
    let mut dev = reopen(&dir);
    let l = layout::read_label(&mut dev, None).unwrap();
    let got = layout::read_catalog(&mut dev, &l, None).unwrap();
    assert_eq!((got.bytes.as_slice(), got.location.start), (&b"cat"[..], loc.start));
}

#[test]
fn a_head_and_data_written_apart_make_the_blocks_of_their_concatenation() {
    let cap = BS - layout::HEADER_LEN;
    for (h, n) in [(0, 0), (0, 3 * cap + 7), (5, 0), (5, 1), (5, cap - 5), (5, cap - 4), (cap - 1, 2), (cap, 9), (cap + 3, 2 * cap)] {
        let (head, body) = (data(1, h), data(2, n));
        let mut images = Vec::new();
        for apart in [false, true] {
            let t = tempfile::tempdir().unwrap();
            let dir = t.path().join("tape");
            let (mut dev, _vc, l, mut w) = formatted(&dir, small_params());
            let e = if apart {
                w.write_parts(&mut dev, 7, &head, &body, true).unwrap()
            } else {
                w.write(&mut dev, 7, &[&head[..], &body[..]].concat(), true).unwrap()
            };
            w.write_catalog(&mut dev, b"done").unwrap();
            assert_eq!(layout::read_object(&mut dev, &l, &[e]).unwrap(), [&head[..], &body[..]].concat(), "head {h}, data {n}");
            drop(dev);
            images.push((e, std::fs::read(dir.join("tape.img")).unwrap()));
        }
        assert_eq!(images[0].0, images[1].0, "head {h}, data {n}: extents differ");
        assert!(images[0].1 == images[1].1, "head {h}, data {n}: the tapes differ");
    }
}
