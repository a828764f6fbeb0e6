//! The emulator against a model of a tape: a list of blocks and filemarks.

use cairn_tape::conformance::pattern_block;
use cairn_tape::{DeviceError, ReadOutcome, TapeDevice};
use proptest::prelude::*;

use crate::common::emu;

const BS: usize = 512;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Entry {
    Block(u64),
    Mark,
}

#[derive(Debug, Clone)]
enum Op {
    Write(u64),
    Marks(u32),
    Read(usize),
    Locate(u64),
    Rewind,
    SpaceEod,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..5).prop_map(Op::Write),
        2 => (0u32..3).prop_map(Op::Marks),
        4 => (1usize..5).prop_map(Op::Read),
        3 => (0u64..40).prop_map(Op::Locate),
        1 => Just(Op::Rewind),
        1 => Just(Op::SpaceEod),
    ]
}

/// What st (and so every TapeDevice) does, written as plainly as possible.
struct Model {
    tape: Vec<Entry>,
    pos: usize,
    wrote_last: bool,
}

impl Model {
    fn put(&mut self, e: Entry) {
        self.tape.truncate(self.pos);
        self.tape.push(e);
        self.pos += 1;
    }
    fn implicit_mark(&mut self) {
        if self.wrote_last {
            self.put(Entry::Mark);
            self.wrote_last = false;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    #[test]
    fn emulator_behaves_like_the_model(ops in proptest::collection::vec(op(), 1..60)) {
        let t = tempfile::tempdir().unwrap();
        let mut p = crate::common::small_params();
        p.block_size = BS as u32;
        p.buffer_bytes = 16 * BS as u64;
        let (mut d, _vc) = emu(&t.path().join("tape"), p);
        let mut m = Model { tape: Vec::new(), pos: 0, wrote_last: false };
        let mut next_tag = 1u64;
        for (i, op) in ops.iter().enumerate() {
            match *op {
                Op::Write(k) => {
                    let mut data = Vec::new();
                    for _ in 0..k {
                        data.extend(pattern_block(BS, next_tag, 0));
                        m.put(Entry::Block(next_tag));
                        next_tag += 1;
                    }
                    d.write_blocks(&data).unwrap();
                    m.wrote_last = true;
                }
                Op::Marks(n) => {
                    d.write_filemarks(n).unwrap();
                    for _ in 0..n {
                        m.put(Entry::Mark);
                    }
                    m.wrote_last = false;
                }
                Op::Read(k) => {
                    m.wrote_last = false;
                    let mut buf = vec![0u8; k * BS];
                    let got = d.read_blocks(&mut buf).unwrap();
                    let want = if m.pos == m.tape.len() {
                        ReadOutcome::EndOfData
                    } else if m.tape[m.pos] == Entry::Mark {
                        m.pos += 1;
                        ReadOutcome::Filemark
                    } else {
                        let mut n = 0;
                        while n < k && m.pos < m.tape.len() {
                            let Entry::Block(tag) = m.tape[m.pos] else { break };
                            prop_assert!(buf[n * BS..(n + 1) * BS] == pattern_block(BS, tag, 0)[..], "op {i}: wrong data for block {tag}");
                            n += 1;
                            m.pos += 1;
                        }
                        ReadOutcome::Blocks(n)
                    };
                    prop_assert_eq!(got, want, "op {}: {:?}", i, op);
                }
                Op::Locate(p) => {
                    m.implicit_mark();
                    let r = d.locate(p);
                    if p as usize > m.tape.len() {
                        prop_assert!(matches!(r, Err(DeviceError::EndOfData { .. })), "op {}: locate({}) past {} gave {:?}", i, p, m.tape.len(), r);
                    } else {
                        r.unwrap();
                        m.pos = p as usize;
                    }
                }
                Op::Rewind => {
                    m.implicit_mark();
                    d.rewind().unwrap();
                    m.pos = 0;
                }
                Op::SpaceEod => {
                    m.wrote_last = false;
                    d.space_to_eod().unwrap();
                    m.pos = m.tape.len();
                }
            }
            prop_assert_eq!(d.position().unwrap(), m.pos as u64, "position after op {}: {:?}", i, op);
            prop_assert_eq!(d.end_of_data(), m.tape.len() as u64, "end of data after op {}: {:?}", i, op);
        }
    }
}
