//! Helpers shared by the integration tests: source trees, stat/xattr
//! readers, and the check that a parsed member matches its source file.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::{self, File};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cairn_tar::{Member, MemberKind};

/// A test whose outside tool (tar, bsdtar) or FUSE is missing fails and
/// says which, rather than passing unrun.
#[allow(unused_imports)]
pub use cairn_testing::{require_fuse, require_tool};

pub fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn cstring(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

pub fn set_xattr(p: &Path, name: &[u8], value: &[u8]) {
    let n = CString::new(name).unwrap();
    let c = cstring(p);
    // SAFETY: valid NUL-terminated strings and a valid buffer.
    let rc = unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(rc, 0, "setxattr {p:?}: {}", io::Error::last_os_error());
}

/// All `user.*` xattrs of a path (not following symlinks), sorted.
pub fn user_xattrs(p: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let c = cstring(p);
    let mut buf = vec![0u8; 65536];
    // SAFETY: valid path and buffer.
    let n = unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n >= 0, "listxattr {p:?}: {}", io::Error::last_os_error());
    let mut out = Vec::new();
    for name in buf[..n as usize]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
    {
        if !name.starts_with(b"user.") {
            continue;
        }
        let cn = CString::new(name).unwrap();
        let mut v = vec![0u8; 65536];
        // SAFETY: as above.
        let len =
            unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        assert!(len >= 0);
        v.truncate(len as usize);
        out.push((name.to_vec(), v));
    }
    out.sort();
    out
}

pub fn sorted_user(x: &[(Vec<u8>, Vec<u8>)]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut v: Vec<_> = x
        .iter()
        .filter(|(n, _)| n.starts_with(b"user."))
        .cloned()
        .collect();
    v.sort();
    v
}

/// Sets a path's atime and mtime (ns since the epoch), not following symlinks.
pub fn set_mtime(p: &Path, ns: i64) {
    let ts = libc::timespec {
        tv_sec: ns.div_euclid(1_000_000_000),
        tv_nsec: ns.rem_euclid(1_000_000_000),
    };
    let c = cstring(p);
    // SAFETY: valid path and two timespecs.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            [ts, ts].as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(rc, 0, "utimensat {p:?}: {}", io::Error::last_os_error());
}

pub fn mkfifo(p: &Path) {
    let c = cstring(p);
    // SAFETY: valid path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o640) }, 0);
}

pub fn mtime_ns(m: &fs::Metadata) -> i64 {
    m.mtime() * 1_000_000_000 + m.mtime_nsec()
}

pub fn kind_of(m: &fs::Metadata) -> MemberKind {
    let t = m.file_type();
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        MemberKind::Dir
    } else if t.is_symlink() {
        MemberKind::Symlink
    } else if t.is_fifo() {
        MemberKind::Fifo
    } else if t.is_char_device() {
        MemberKind::CharDev
    } else if t.is_block_device() {
        MemberKind::BlockDev
    } else {
        MemberKind::File
    }
}

/// Deterministic pseudo-random bytes.
pub fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// What to put in a source tree (formats differ in what they can hold).
#[derive(Clone, Copy)]
pub struct TreeOpts {
    /// Names > 100 bytes without a usable ustar split, paths > 255 bytes,
    /// symlink targets > 100 bytes.
    pub long_names: bool,
    /// A path of 100..255 bytes that splits into ustar prefix + name.
    pub split_name: bool,
    pub fifo: bool,
    pub xattrs: bool,
    /// A 1 MiB sparse file.
    pub sparse: bool,
    /// A 9 GiB sparse file.
    pub huge: bool,
}

pub const GIB: u64 = 1 << 30;

/// Builds a varied tree under `root` (which must not exist).
pub fn build_tree(root: &Path, o: TreeOpts) {
    fs::create_dir_all(root.join("dir/sub")).unwrap();
    let files: &[(&str, usize)] = &[
        ("small.txt", 13),
        ("empty", 0),
        ("exact512", 512),
        ("odd513", 513),
        ("dir/mid.bin", 10_000),
        ("dir/sub/big.bin", 300_000),
    ];
    for (i, (name, n)) in files.iter().enumerate() {
        fs::write(root.join(name), bytes(i as u64 + 1, *n)).unwrap();
    }
    fs::set_permissions(
        root.join("dir/mid.bin"),
        std::os::unix::fs::PermissionsExt::from_mode(0o750),
    )
    .unwrap();
    std::os::unix::fs::symlink("small.txt", root.join("link")).unwrap();
    fs::hard_link(root.join("small.txt"), root.join("dir/hard")).unwrap();
    if o.fifo {
        mkfifo(&root.join("fifo"));
    }
    if o.xattrs {
        set_xattr(&root.join("small.txt"), b"user.test", b"hello");
        set_xattr(&root.join("small.txt"), b"user.bin", b"\x00\xff\x01=\n");
        set_xattr(&root.join("dir"), b"user.dir", b"on a directory");
    }
    if o.split_name {
        let d = root.join("s".repeat(60)).join("t".repeat(60));
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("u".repeat(70)), b"split name").unwrap();
    }
    if o.long_names {
        fs::write(root.join("n".repeat(120)), b"long single name").unwrap();
        let mut d = root.to_path_buf();
        for c in ["a", "b", "c"] {
            d = d.join(c.repeat(90));
        }
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("deep_file_beyond_255_bytes"), bytes(99, 777)).unwrap();
        std::os::unix::fs::symlink("z".repeat(150), root.join("longlink")).unwrap();
        fs::write(root.join("héllo wörld ✓.txt"), b"utf-8 name").unwrap();
    }
    if o.sparse {
        let f = File::create(root.join("sparse")).unwrap();
        f.set_len(1 << 20).unwrap();
        f.write_all_at(&bytes(7, 4096), 0).unwrap();
        f.write_all_at(&bytes(8, 8192), 512 << 10).unwrap();
    }
    if o.huge {
        let f = File::create(root.join("huge")).unwrap();
        f.set_len(9 * GIB).unwrap();
        f.write_all_at(&bytes(9, 4096), 0).unwrap();
        f.write_all_at(&bytes(10, 4096), 8 * GIB + 12_288).unwrap();
        f.write_all_at(b"tail", 9 * GIB - 4).unwrap();
    }
    // Sub-second times on a few entries, set last so nothing disturbs them.
    set_mtime(&root.join("small.txt"), 1_600_000_000_123_456_789);
    set_mtime(&root.join("dir/mid.bin"), 1_500_000_000_500_000_000);
    set_mtime(&root.join("link"), 1_400_000_000_000_000_001);
    set_mtime(&root.join("dir"), 1_300_000_000_250_000_000);
}

/// Source path of an archive member path ("./a/b" → root/a/b).
pub fn source_of(root: &Path, member_path: &[u8]) -> PathBuf {
    let mut p = member_path;
    while let Some(rest) = p.strip_prefix(b"./") {
        p = rest;
    }
    if p == b"." {
        return root.to_path_buf();
    }
    root.join(std::ffi::OsStr::from_bytes(p))
}

/// Every path under `root` (relative, "" for root itself) with its metadata.
pub fn walk(root: &Path) -> BTreeMap<PathBuf, fs::Metadata> {
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let p = root.join(&rel);
        let m = fs::symlink_metadata(&p).unwrap();
        if m.is_dir() {
            for e in fs::read_dir(&p).unwrap() {
                stack.push(rel.join(e.unwrap().file_name()));
            }
        }
        out.insert(rel, m);
    }
    out
}

fn pread(f: &File, off: u64, len: u64) -> Vec<u8> {
    let mut v = vec![0u8; len as usize];
    f.read_exact_at(&mut v, off).unwrap();
    v
}

/// Data regions of a file (SEEK_DATA / SEEK_HOLE).
pub fn data_regions(f: &File, size: u64) -> Vec<(u64, u64)> {
    use std::os::fd::AsRawFd;
    let mut out = Vec::new();
    let mut pos = 0i64;
    while (pos as u64) < size {
        // SAFETY: lseek on an open descriptor.
        let d = unsafe { libc::lseek(f.as_raw_fd(), pos, libc::SEEK_DATA) };
        if d < 0 {
            break;
        }
        // SAFETY: as above.
        let h = unsafe { libc::lseek(f.as_raw_fd(), d, libc::SEEK_HOLE) };
        out.push((d as u64, h as u64));
        pos = h;
    }
    out
}

/// Checks that the archive bytes at `m`'s data runs are exactly the bytes
/// of `src` (holes zero), without reading the holes of big sparse files.
pub fn check_data(archive: &File, m: &Member, src: &Path) {
    let f = File::open(src).unwrap();
    let size = f.metadata().unwrap().len();
    assert_eq!(m.size, size, "{src:?}: size");
    let mut prev_end = 0;
    for r in &m.data {
        assert!(
            r.len > 0 && r.file_offset >= prev_end,
            "{src:?}: runs sorted, non-empty"
        );
        prev_end = r.file_offset + r.len;
        assert!(prev_end <= size);
        // Compare in pieces of at most 16 MiB.
        let mut done = 0;
        while done < r.len {
            let n = (r.len - done).min(16 << 20);
            assert!(
                pread(archive, r.archive_offset + done, n) == pread(&f, r.file_offset + done, n),
                "{src:?}: bytes of run {r:?} differ"
            );
            done += n;
        }
    }
    // Everything not covered by a run must read as zeros.
    let mut gaps = Vec::new();
    let mut at = 0;
    for r in &m.data {
        if r.file_offset > at {
            gaps.push((at, r.file_offset));
        }
        at = r.file_offset + r.len;
    }
    if at < size {
        gaps.push((at, size));
    }
    for (ds, de) in data_regions(&f, size) {
        for &(gs, ge) in &gaps {
            let (s, e) = (ds.max(gs), de.min(ge));
            if s < e {
                assert!(
                    pread(&f, s, e - s).iter().all(|&b| b == 0),
                    "{src:?}: non-zero source bytes in a hole [{s}, {e})"
                );
            }
        }
    }
}
