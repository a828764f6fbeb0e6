//! Memory of `archive_create` and `archive_extract` stays flat: measured
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

/// The peak RSS is the process's: one measurement at a time.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Resets the peak RSS to the current RSS; returns the current RSS.
fn reset_peak() -> u64 {
    std::fs::write("/proc/self/clear_refs", "5").expect("resetting VmHWM (Linux 4.0+)");
    status_kb("VmRSS:")
}

#[test]
fn archive_create_of_a_20000_deep_tree_keeps_memory_flat() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
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

/// A ustar header block with no data.
fn header(name: &[u8], typeflag: u8) -> [u8; 512] {
    let mut b = [0u8; 512];
    b[..name.len()].copy_from_slice(name);
    b[100..108].copy_from_slice(b"0000644\0");
    b[108..116].copy_from_slice(b"0001750\0");
    b[116..124].copy_from_slice(b"0001750\0");
    b[124..136].copy_from_slice(b"00000000000\0");
    b[136..148].copy_from_slice(b"14000000000\0");
    b[156] = typeflag;
    b[257..263].copy_from_slice(b"ustar\0");
    b[263..265].copy_from_slice(b"00");
    b[265..269].copy_from_slice(b"user");
    b[297..302].copy_from_slice(b"group");
    b[148..156].fill(b' ');
    let sum: u32 = b.iter().map(|&c| u32::from(c)).sum();
    b[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    b
}

#[test]
fn archive_extract_of_200k_header_only_members_keeps_little_per_member() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let d = tempfile::tempdir().unwrap();
    init_small(d.path());
    // A small chunk cache: the archive's header chunks read while parsing
    // would otherwise fill it (256 MiB, bounded, not per member).
    let v = Volume::load(d.path(), OpenOptions { cache_bytes: 4 << 20, ..Default::default() }).unwrap();
    const N: usize = 200_000;
    let mut tar = Vec::with_capacity(N * 512 + 2048);
    for i in 0..N {
        if i % 1000 == 0 {
            tar.extend_from_slice(&header(format!("dir{:03}/", i / 1000).as_bytes(), b'5'));
        } else {
            tar.extend_from_slice(&header(format!("dir{:03}/member-{i:07}", i / 1000).as_bytes(), b'0'));
        }
    }
    tar.extend_from_slice(&[0u8; 1024]);
    let a = mkfile(&v, ROOT_INO, "many.tar", &tar);
    drop(tar);
    v.flush_now().unwrap();
    let base = reset_peak();
    let t = std::time::Instant::now();
    let rep = v.archive_extract(a, ROOT_INO, b"out", None, root()).unwrap();
    let grew = status_kb("VmHWM:").saturating_sub(base);
    let per = grew / N as u64;
    eprintln!("{rep:?}: peak RSS grew {} MiB, {per} B/member, in {:?}", grew >> 20, t.elapsed());
    assert_eq!(rep.members, N as u64);
    // Main's code kept every parsed member (about 700 bytes each here) until
    // the plan was built; laid out while parsing, a member costs its node
    // (about 150 bytes with its name and index entry), its inode number and
    // its share of SQLite's page cache for the transaction (bounded).
    assert!(per < 400, "extracting {N} header-only members grew the peak RSS by {per} bytes a member");
    let i = v.resolve(b"out/dir199/member-0199999").unwrap();
    assert_eq!(v.getattr(i).unwrap().uid, 1000);
}
