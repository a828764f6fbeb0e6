//! Property test: file content operations against a plain byte vector,
//! with flushes, clean reopens and crashes (after fsync) in between.

use crate::common::*;
use cairn_engine::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Write { off: u64, len: usize, seed: u64 },
    Truncate(u64),
    Punch { off: u64, len: u64 },
    Flush,
    BackgroundFlush,
    Reopen,
    FsyncAndCrash,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u64..400_000, 1usize..150_000, any::<u64>()).prop_map(|(off, len, seed)| Op::Write { off, len, seed }),
        1 => (0u64..500_000).prop_map(Op::Truncate),
        1 => (0u64..400_000, 1u64..100_000).prop_map(|(off, len)| Op::Punch { off, len }),
        2 => Just(Op::Flush),
        3 => Just(Op::BackgroundFlush),
        1 => Just(Op::Reopen),
        1 => Just(Op::FsyncAndCrash),
    ]
}

/// Flushes a file after 64 KiB of dirty data, so background rounds take
/// the size-triggered path (which holds back the tail of open files).
fn open_eager(dir: &std::path::Path) -> std::sync::Arc<Volume> {
    Volume::load(dir, OpenOptions { flush_bytes: 64 << 10, flush_age: std::time::Duration::from_secs(3600), ..opts() }).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn file_matches_model(ops in prop::collection::vec(op(), 1..25)) {
        let d = tempfile::tempdir().unwrap();
        init_small(d.path());
        let mut v = open_eager(d.path());
        let ino = v.create(ROOT_INO, b"f", FileKind::File, 0o644, 0, root()).unwrap().ino;
        v.open(ino).unwrap();
        let mut model: Vec<u8> = Vec::new();
        for op in ops {
            match op {
                Op::Write { off, len, seed } => {
                    let data = random_bytes(seed, len);
                    v.write(ino, off, &data).unwrap();
                    if model.len() < off as usize + len { model.resize(off as usize + len, 0); }
                    model[off as usize..off as usize + len].copy_from_slice(&data);
                }
                Op::Truncate(n) => {
                    v.setattr(ino, &SetAttr { size: Some(n), ..Default::default() }).unwrap();
                    model.resize(n as usize, 0);
                }
                Op::Punch { off, len } => {
                    v.fallocate(ino, off, len, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE).unwrap();
                    let end = (off + len).min(model.len() as u64) as usize;
                    if (off as usize) < end { model[off as usize..end].fill(0); }
                }
                Op::Flush => { v.flush_now().unwrap(); }
                Op::BackgroundFlush => { v.flush_due().unwrap(); }
                Op::Reopen => {
                    v.release(ino).unwrap();
                    v.close().unwrap();
                    drop(v);
                    v = open_eager(d.path());
                    v.open(ino).unwrap();
                }
                Op::FsyncAndCrash => {
                    v.fsync(ino, false).unwrap();
                    v.simulate_crash();
                    v = open_eager(d.path());
                    v.open(ino).unwrap();
                }
            }
            prop_assert_eq!(v.getattr(ino).unwrap().size, model.len() as u64);
        }
        let got = read_all(&v, ino);
        prop_assert!(got == model, "content differs (len {} vs {})", got.len(), model.len());
        v.release(ino).unwrap();
        v.flush_now().unwrap();
        prop_assert!(read_all(&v, ino) == model);
        let rep = cairn_engine::maintenance::fsck(&v, true, &cairn_engine::maintenance::NoProgress).unwrap();
        prop_assert!(rep.errors.is_empty(), "{:?}", rep.errors);
    }
}
