//! The contract checks every [`TapeDevice`] must pass. The emulator's tests
//! call [`run_all`]; a real drive runs the same checks through the ignored
//! test `st_conformance` in `tests/tape.rs`:
//!
//! ```text
//! CAIRN_TAPE_DEVICE=/dev/nst0 CAIRN_TAPE_DESTROY=yes \
//!     cargo test -p cairn-tape --test tape -- --ignored st_conformance
//! ```
//!
//! The suite **overwrites the whole tape** from the beginning. Every check
//! panics with a message naming what broke.

use crate::device::{read_exact_blocks, DeviceError, ReadOutcome, TapeDevice};

/// How to run the suite on a device.
pub struct Options<'a> {
    /// Opens the device again (after the previous handle was dropped), for
    /// the durability check; `None` skips it.
    pub reopen: Option<&'a mut dyn FnMut() -> Box<dyn TapeDevice>>,
    /// Run the end-of-medium check: only for devices whose medium fills in
    /// a few hundred blocks (an emulated drive with a small capacity).
    pub end_of_medium: bool,
}

/// Runs every check on `dev`, which holds a scratch tape. With
/// `opts.reopen`, `dev` is dropped and reopened during the run; the device
/// in use at the end is returned.
pub fn run_all(mut dev: Box<dyn TapeDevice>, opts: Options<'_>) -> Box<dyn TapeDevice> {
    let d = dev.as_mut();
    write_read_roundtrip(d);
    short_read_stops_before_filemark(d);
    filemarks_occupy_positions(d);
    immediate_filemarks(d);
    overwrite_truncates(d);
    read_past_end_of_data(d);
    locate_position_roundtrip(d);
    rewind_and_space_to_eod(d);
    implicit_filemark_before_moving(d);
    invalid_arguments(d);
    if let Some(reopen) = opts.reopen {
        dev = flush_survives_reopen(dev, reopen);
    }
    if opts.end_of_medium {
        end_of_medium(dev.as_mut());
    }
    dev
}

/// A block whose bytes say which block it is (`tag`, `i`).
pub fn pattern_block(bs: usize, tag: u64, i: u64) -> Vec<u8> {
    let mut b: Vec<u8> = (0..bs)
        .map(|j| (j as u64).wrapping_mul(31).wrapping_add(i * 7 + tag) as u8)
        .collect();
    b[..8].copy_from_slice(&tag.to_le_bytes());
    b[8..16].copy_from_slice(&i.to_le_bytes());
    b
}

fn blocks(bs: usize, tag: u64, range: std::ops::Range<u64>) -> Vec<u8> {
    range.flat_map(|i| pattern_block(bs, tag, i)).collect()
}

fn expect_block(d: &mut dyn TapeDevice, tag: u64, i: u64, what: &str) {
    let bs = d.block_size();
    let mut buf = vec![0u8; bs];
    match d.read_blocks(&mut buf) {
        Ok(ReadOutcome::Blocks(1)) => {}
        other => panic!("{what}: expected block ({tag}, {i}), got {other:?}"),
    }
    assert!(
        buf == pattern_block(bs, tag, i),
        "{what}: wrong contents for block ({tag}, {i})"
    );
}

fn expect_outcome(d: &mut dyn TapeDevice, want: ReadOutcome, what: &str) {
    let mut buf = vec![0u8; d.block_size()];
    let got = d
        .read_blocks(&mut buf)
        .unwrap_or_else(|e| panic!("{what}: read failed: {e}"));
    assert_eq!(got, want, "{what}");
}

fn pos(d: &mut dyn TapeDevice) -> u64 {
    d.position().expect("position")
}

fn write_read_roundtrip(d: &mut dyn TapeDevice) {
    let bs = d.block_size();
    d.rewind().expect("rewind");
    assert_eq!(pos(d), 0, "position after rewind");
    d.write_blocks(&blocks(bs, 1, 0..10))
        .expect("write 10 blocks");
    assert_eq!(pos(d), 10, "position after writing 10 blocks");
    d.write_filemarks(1).expect("filemark");
    assert_eq!(pos(d), 11, "a filemark occupies one position");
    d.rewind().expect("rewind");
    let mut buf = vec![0u8; 4 * bs];
    let mut seen = Vec::new();
    loop {
        match d.read_blocks(&mut buf).expect("read") {
            ReadOutcome::Blocks(n) => {
                assert!(
                    (1..=4).contains(&n),
                    "read returned {n} blocks for a 4-block buffer"
                );
                seen.extend_from_slice(&buf[..n * bs]);
            }
            ReadOutcome::Filemark => break,
            ReadOutcome::EndOfData => panic!("end of data before the filemark"),
        }
    }
    assert!(
        seen == blocks(bs, 1, 0..10),
        "read back differs from what was written"
    );
    assert_eq!(pos(d), 11, "position after reading past the filemark");
    expect_outcome(d, ReadOutcome::EndOfData, "read after the last filemark");
    assert_eq!(pos(d), 11, "reading at the end of data must not move");
}

fn short_read_stops_before_filemark(d: &mut dyn TapeDevice) {
    let bs = d.block_size();
    d.rewind().unwrap();
    d.write_blocks(&blocks(bs, 2, 0..2)).unwrap();
    d.write_filemarks(1).unwrap();
    d.write_blocks(&blocks(bs, 2, 2..3)).unwrap();
    d.flush().unwrap();
    d.rewind().unwrap();
    let mut buf = vec![0u8; 5 * bs];
    assert_eq!(
        d.read_blocks(&mut buf).unwrap(),
        ReadOutcome::Blocks(2),
        "a read stops before a filemark"
    );
    assert!(buf[..2 * bs] == blocks(bs, 2, 0..2)[..]);
    assert_eq!(pos(d), 2, "the filemark is left for the next read");
    assert_eq!(d.read_blocks(&mut buf).unwrap(), ReadOutcome::Filemark);
    assert_eq!(pos(d), 3, "the filemark was passed");
    expect_block(d, 2, 2, "the block after the filemark");
}

fn filemarks_occupy_positions(d: &mut dyn TapeDevice) {
    let bs = d.block_size();
    d.rewind().unwrap();
    d.write_blocks(&blocks(bs, 3, 0..3)).unwrap();
    d.write_filemarks(2).unwrap();
    d.write_blocks(&blocks(bs, 3, 5..7)).unwrap();
    d.flush().unwrap();
    assert_eq!(pos(d), 7, "3 blocks + 2 filemarks + 2 blocks");
    d.locate(5).unwrap();
    expect_block(d, 3, 5, "locate past two filemarks");
    d.locate(3).unwrap();
    expect_outcome(d, ReadOutcome::Filemark, "position 3 is the first filemark");
    assert_eq!(pos(d), 4);
    expect_outcome(
        d,
        ReadOutcome::Filemark,
        "position 4 is the second filemark",
    );
    expect_block(d, 3, 5, "after two filemarks");
    expect_block(d, 3, 6, "the last block");
    expect_outcome(d, ReadOutcome::EndOfData, "after the last block");
}

/// A filemark written in immediate mode is a filemark like any other once
/// a later flush has made it durable, and occupies its position.
fn immediate_filemarks(d: &mut dyn TapeDevice) {
    let bs = d.block_size();
    d.rewind().unwrap();
    d.write_blocks(&blocks(bs, 9, 0..2)).unwrap();
    d.write_filemarks_immediate(1).unwrap();
    d.write_blocks(&blocks(bs, 9, 3..4)).unwrap();
    d.write_filemarks(1).unwrap();
    assert_eq!(pos(d), 5, "2 blocks + filemark + block + filemark");
    d.rewind().unwrap();
    expect_block(d, 9, 0, "before the immediate filemark");
    expect_block(d, 9, 1, "before the immediate filemark");
    expect_outcome(d, ReadOutcome::Filemark, "the immediate filemark");
    expect_block(d, 9, 3, "after the immediate filemark");
    expect_outcome(d, ReadOutcome::Filemark, "the closing filemark");
}

fn overwrite_truncates(d: &mut dyn TapeDevice) {
    let bs = d.block_size();
    d.rewind().unwrap();
    d.write_blocks(&blocks(bs, 4, 0..10)).unwrap();
    d.write_filemarks(1).unwrap();
    d.locate(4).unwrap();
    d.write_blocks(&blocks(bs, 5, 4..6)).unwrap();
    d.flush().unwrap();
    d.space_to_eod().unwrap();
    assert_eq!(
        pos(d),
        6,
        "writing at 4 must erase everything after the new data"
    );
    d.locate(3).unwrap();
    expect_block(d, 4, 3, "the block before the overwrite is kept");
    expect_block(d, 5, 4, "new block 4");
    expect_block(d, 5, 5, "new block 5");
    expect_outcome(
        d,
        ReadOutcome::EndOfData,
        "old blocks after the overwrite are gone",
    );
    match d.locate(7) {
        Err(DeviceError::EndOfData { .. }) => {}
        other => panic!("locate beyond the end of data must fail with EndOfData, got {other:?}"),
    }
}

fn read_past_end_of_data(d: &mut dyn TapeDevice) {
    let bs = d.block_size();
    d.rewind().unwrap();
    d.write_blocks(&blocks(bs, 6, 0..1)).unwrap();
    d.flush().unwrap();
    d.space_to_eod().unwrap();
    assert_eq!(pos(d), 1);
    expect_outcome(d, ReadOutcome::EndOfData, "read at the end of data");
    expect_outcome(
        d,
        ReadOutcome::EndOfData,
        "a second read at the end of data",
    );
    assert_eq!(pos(d), 1, "reading at the end of data must not move");
    d.rewind().unwrap();
    let mut buf = vec![0u8; 3 * bs];
    match read_exact_blocks(d, &mut buf) {
        Err(DeviceError::EndOfData { position: 1, .. }) => {}
        other => panic!("read_exact_blocks past the end must fail at position 1, got {other:?}"),
    }
    d.locate(1)
        .expect("locate to exactly the end of data is allowed");
    assert!(
        matches!(d.locate(2), Err(DeviceError::EndOfData { .. })),
        "locate past the end of data"
    );
}

fn locate_position_roundtrip(d: &mut dyn TapeDevice) {
    let bs = d.block_size();
    d.rewind().unwrap();
    d.write_blocks(&blocks(bs, 7, 0..40)).unwrap();
    d.flush().unwrap();
    for p in [17u64, 3, 39, 0, 25, 25, 1] {
        d.locate(p).unwrap();
        assert_eq!(pos(d), p, "position after locate({p})");
        expect_block(d, 7, p, "block after locate");
        assert_eq!(pos(d), p + 1);
    }
    d.locate(40).unwrap();
    assert_eq!(pos(d), 40, "locate to the end of data");
}

fn rewind_and_space_to_eod(d: &mut dyn TapeDevice) {
    let bs = d.block_size();
    d.rewind().unwrap();
    d.write_blocks(&blocks(bs, 8, 0..5)).unwrap();
    d.write_filemarks(1).unwrap();
    d.write_blocks(&blocks(bs, 8, 6..8)).unwrap();
    d.write_filemarks(1).unwrap();
    d.rewind().unwrap();
    let st = d.status().expect("status");
    assert!(
        st.online && st.bot && !st.no_tape,
        "status after rewind: {st}"
    );
    d.space_to_eod().unwrap();
    assert_eq!(pos(d), 9, "space_to_eod past filemarks");
    let st = d.status().unwrap();
    assert!(st.eod || st.filemark, "status at the end of data: {st}");
    expect_outcome(d, ReadOutcome::EndOfData, "read at the end of data");
    d.write_blocks(&blocks(bs, 8, 9..10))
        .expect("append at the end of data");
    d.flush().unwrap();
    d.locate(8).unwrap();
    expect_outcome(d, ReadOutcome::Filemark, "the old last filemark");
    expect_block(d, 8, 9, "the appended block");
}

fn implicit_filemark_before_moving(d: &mut dyn TapeDevice) {
    let bs = d.block_size();
    d.rewind().unwrap();
    d.write_blocks(&blocks(bs, 9, 0..2)).unwrap();
    // No flush: like st, moving right after a write writes a filemark first.
    d.rewind().unwrap();
    d.space_to_eod().unwrap();
    assert_eq!(pos(d), 3, "rewind right after a write adds one filemark");
    d.locate(2).unwrap();
    expect_outcome(d, ReadOutcome::Filemark, "the implicit filemark");
    d.locate(3).unwrap();
    d.write_blocks(&blocks(bs, 9, 3..4)).unwrap();
    d.flush().unwrap();
    d.rewind().unwrap();
    d.space_to_eod().unwrap();
    assert_eq!(pos(d), 4, "a flush before moving adds no filemark");
}

fn invalid_arguments(d: &mut dyn TapeDevice) {
    let bs = d.block_size();
    d.rewind().unwrap();
    let half = vec![0u8; bs / 2];
    assert!(
        matches!(
            d.write_blocks(&half),
            Err(DeviceError::InvalidArgument { .. })
        ),
        "a write that is not a multiple of the block size"
    );
    d.write_blocks(&blocks(bs, 10, 0..1)).unwrap();
    d.flush().unwrap();
    d.rewind().unwrap();
    let mut small = vec![0u8; bs / 2];
    assert!(
        matches!(
            d.read_blocks(&mut small),
            Err(DeviceError::InvalidArgument { .. })
        ),
        "a read buffer smaller than a block"
    );
    let e = d.locate(100).unwrap_err();
    assert!(
        e.to_string().contains(d.name()),
        "errors name the device: {e}"
    );
}

fn flush_survives_reopen(
    dev: Box<dyn TapeDevice>,
    reopen: &mut dyn FnMut() -> Box<dyn TapeDevice>,
) -> Box<dyn TapeDevice> {
    let mut d = dev;
    let bs = d.block_size();
    d.rewind().unwrap();
    d.write_blocks(&blocks(bs, 11, 0..20)).unwrap();
    d.flush().unwrap();
    drop(d);
    let mut d = reopen();
    d.rewind().unwrap();
    let mut buf = vec![0u8; 20 * bs];
    read_exact_blocks(d.as_mut(), &mut buf).expect("flushed blocks after reopening");
    assert!(
        buf == blocks(bs, 11, 0..20),
        "flushed blocks changed across reopen"
    );
    d
}

fn end_of_medium(d: &mut dyn TapeDevice) {
    let bs = d.block_size();
    d.rewind().unwrap();
    let mut written = 0u64;
    let chunk = 8u64;
    // Fill up to the early warning.
    let ew_at = loop {
        match d.write_blocks(&blocks(bs, 12, written..written + chunk)) {
            Ok(()) => written += chunk,
            Err(DeviceError::EndOfMedium { written_blocks, .. }) => {
                assert_eq!(
                    written_blocks, 0,
                    "the early warning fails the write after the crossing one, whole"
                );
                break written;
            }
            Err(e) => panic!("write before the early warning: {e}"),
        }
        assert!(
            written < 1_000_000,
            "no end of medium after a million blocks"
        );
    };
    assert_eq!(pos(d), ew_at, "the failed write moved the tape");
    // Past the early warning writes go on (trailer, catalog) until the physical end.
    let mut after_ew = 0u64;
    loop {
        match d.write_blocks(&blocks(bs, 12, written..written + chunk)) {
            Ok(()) => {
                written += chunk;
                after_ew += chunk;
            }
            Err(DeviceError::EndOfMedium { written_blocks, .. }) => {
                assert!(
                    written_blocks < chunk,
                    "the physical end accepted the whole write"
                );
                written += written_blocks;
                break;
            }
            Err(e) => panic!("write in the early-warning zone: {e}"),
        }
        assert!(after_ew < 1_000_000, "no physical end");
    }
    assert!(after_ew > 0, "the early-warning zone accepted no write");
    assert_eq!(pos(d), written, "position after the physical end");
    assert!(matches!(
        d.write_blocks(&blocks(bs, 12, 0..1)),
        Err(DeviceError::EndOfMedium {
            written_blocks: 0,
            ..
        })
    ));
    d.rewind().unwrap();
    let mut buf = vec![0u8; chunk as usize * bs];
    let mut i = 0;
    while i < written {
        let n = (written - i).min(chunk);
        read_exact_blocks(d, &mut buf[..n as usize * bs]).expect("read back after end of medium");
        assert!(
            buf[..n as usize * bs] == blocks(bs, 12, i..i + n)[..],
            "data before the end of medium changed"
        );
        i += n;
    }
    d.rewind().unwrap();
    d.write_blocks(&blocks(bs, 13, 0..1))
        .expect("a rewound tape takes writes again");
    d.flush().unwrap();
}
