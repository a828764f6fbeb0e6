//! Memory of `archive_create` stays flat: measured
//! as the process's peak RSS (VmHWM, reset through /proc/self/clear_refs),
//! so this is its own test binary, with nothing else running beside it.

#[path = "engine/common.rs"]
mod common;

use cairn_engine::*;
use common::*;

/// A field of /proc/self/status, in bytes.
fn status_kb(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {field}"));
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// Resets the peak RSS to the current RSS; returns the current RSS.
fn reset_peak() -> u64 {
    std::fs::write("/proc/self/clear_refs", "5").expect("resetting VmHWM (Linux 4.0+)");
    status_kb("VmRSS:")
}

#[test]
fn archive_create_of_a_20000_deep_tree_keeps_memory_flat() {
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    let v = open(d.path());
    // Built inside the engine: a path this deep (40 KB) is past PATH_MAX.
    const DEPTH: usize = 20_000;
    let top = v.mkdir(ROOT_INO, b"d", 0o755, root()).unwrap().ino;
    let mut cur = top;
    for _ in 1..DEPTH {
        cur = v.mkdir(cur, b"d", 0o755, root()).unwrap().ino;
    }
    mkfile(&v, cur, "leaf", b"at the bottom");
    let (parent, entry) = v.resolve_parent(b"d").unwrap();
    let src = ArchiveSource { name: b"d".to_vec(), ino: top, parent, entry };
    let base = reset_peak();
    let t = std::time::Instant::now();
    let rep = v.archive_create(&[src], ROOT_INO, b"deep.tar", ArchiveOptions { align: None, remove: false, caller: root() }).unwrap();
    let peak = status_kb("VmHWM:");
    let grew = peak.saturating_sub(base);
    eprintln!("{rep:?}: peak RSS grew {} MiB in {:?}", grew >> 20, t.elapsed());
    assert_eq!(rep.members, DEPTH as u64 + 1);
    // Each header repeats its whole path: about 400 MB of headers in all,
    // which used to be held in one buffer.
    assert!(rep.header_bytes > 400_000_000, "{rep:?}");
    assert!(grew < 150 << 20, "archiving a {DEPTH}-deep tree grew the peak RSS by {} MiB", grew >> 20);
    // The archive holds the headers: its last member is the leaf, whose
    // path spells the whole depth.
    let a = v.resolve(b"deep.tar").unwrap();
    assert_eq!(v.getattr(a).unwrap().size, rep.archive_bytes);
    let tail = v.read(a, rep.archive_bytes - 1024 - 512, 512).unwrap();
    assert!(tail.starts_with(b"at the bottom"), "{:?}", String::from_utf8_lossy(&tail[..32]));
}

