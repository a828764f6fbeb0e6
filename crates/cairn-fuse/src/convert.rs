//! Pure conversions between engine values and FUSE values: no I/O, no engine
//! calls, so every rule here is unit-tested.

use std::ops::Range;
use std::time::{Duration, SystemTime};

use cairn_engine::{Attr, DirEntry, FileKind, Ino, RenameFlags, SetTime, Timestamp, XattrFlags};
use fuser::{Errno, FileAttr, FileType, INodeNo, TimeOrNow};

/// How long the kernel may cache attributes, names and negative lookups.
pub(crate) const TTL: Duration = Duration::from_secs(1);

/// `st_blksize`, the "preferred I/O size". Not 4096 on purpose: without the
/// writeback cache every `write(2)` is one synchronous round trip to the
/// daemon, and stdio (glibc sizes a `FILE` buffer from `st_blksize`) would
/// then cost one round trip per 4 KiB. 128 KiB (the classic FUSE `max_write`)
/// cuts that 32-fold while keeping per-stream buffers small. `st_blocks` stays
/// in 512-byte units whatever this is, so `du` is unaffected.
pub(crate) const BLKSIZE: u32 = 128 * 1024;

/// FUSE type of an engine inode kind.
pub(crate) fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::BlockDev => FileType::BlockDevice,
    }
}

/// Engine attributes as the kernel wants them.
pub(crate) fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: a.atime.to_system(),
        mtime: a.mtime.to_system(),
        ctime: a.ctime.to_system(),
        crtime: a.btime.to_system(),
        kind: file_type(a.kind),
        // `& 0o7777` makes the cast lossless.
        perm: (a.perm & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: BLKSIZE,
        flags: 0,
    }
}

/// Attributes for a `readdirplus` entry the kernel never instantiates: it skips
/// `.` and `..` (fs/fuse/readdir.c, `fuse_direntplus_link`) and only reads the
/// inode number and type from them for the dirent.
pub(crate) fn placeholder_attr(ino: Ino, kind: FileKind) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind: file_type(kind),
        perm: 0,
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: BLKSIZE,
        flags: 0,
    }
}

/// A `setattr` time from the kernel's.
pub(crate) fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(st) => SetTime::At(kernel_time(st)),
    }
}

/// Undoes fuser 0.18's decoding of a kernel time before 1970: it builds
/// `EPOCH - (|secs| s + nsecs ns)` from the kernel's `(secs < 0, nsecs)`,
/// whereas the time is `secs s + nsecs ns` (its own TODO in `time.rs`).
fn kernel_time(st: SystemTime) -> Timestamp {
    match SystemTime::UNIX_EPOCH.duration_since(st) {
        Ok(d) if d.subsec_nanos() != 0 => {
            let secs = -(d.as_secs() as i128);
            let ns = secs * 1_000_000_000 + d.subsec_nanos() as i128;
            Timestamp(ns.clamp(i64::MIN as i128, i64::MAX as i128) as i64)
        }
        _ => Timestamp::from_system(st),
    }
}

/// Permission bits of a new inode: the requested mode less the caller's umask.
/// (Without `FUSE_DONT_MASK` the kernel has usually applied the umask already;
/// applying it twice is harmless.)
pub(crate) fn new_perm(mode: u32, umask: u32) -> u32 {
    mode & !umask & 0o7777
}

/// The inode kind `mknod`/`create` asks for. A mode without type bits means a
/// regular file, as in mknod(2); directories and symlinks have their own calls.
pub(crate) fn node_kind(mode: u32) -> Result<FileKind, Errno> {
    if mode & libc::S_IFMT == 0 {
        return Ok(FileKind::File);
    }
    match FileKind::from_mode(mode) {
        Some(FileKind::Dir) | Some(FileKind::Symlink) | None => Err(Errno::EINVAL),
        Some(kind) => Ok(kind),
    }
}

/// renameat2 flags. `RENAME_WHITEOUT` (overlayfs's) and unknown bits are refused.
pub(crate) fn rename_flags(flags: u32) -> Result<RenameFlags, Errno> {
    let known = libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE;
    if flags & !known != 0 {
        return Err(Errno::EINVAL);
    }
    let out = RenameFlags {
        noreplace: flags & libc::RENAME_NOREPLACE != 0,
        exchange: flags & libc::RENAME_EXCHANGE != 0,
    };
    if out.noreplace && out.exchange {
        // renameat2(2): "RENAME_NOREPLACE can't be employed together with RENAME_EXCHANGE".
        return Err(Errno::EINVAL);
    }
    Ok(out)
}

/// setxattr flags (`XATTR_CREATE`, `XATTR_REPLACE`); unknown bits are refused.
pub(crate) fn xattr_flags(flags: i32) -> Result<XattrFlags, Errno> {
    let known = libc::XATTR_CREATE | libc::XATTR_REPLACE;
    if flags & !known != 0 {
        return Err(Errno::EINVAL);
    }
    Ok(XattrFlags {
        create: flags & libc::XATTR_CREATE != 0,
        replace: flags & libc::XATTR_REPLACE != 0,
    })
}

/// What to answer to `getxattr`/`listxattr` given the caller's buffer size.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum XattrAnswer<'a> {
    /// `size == 0`: the caller asks how big a buffer it needs.
    Size(u32),
    /// The value fits: send it.
    Data(&'a [u8]),
    /// The caller's buffer is too small (ERANGE), or the value is larger than
    /// any xattr can be (E2BIG).
    Error(Errno),
}

/// The xattr size protocol: size 0 asks for the length, a non-zero size is the
/// caller's buffer, which must hold the whole value.
pub(crate) fn xattr_answer(size: u32, value: &[u8]) -> XattrAnswer<'_> {
    let Ok(len) = u32::try_from(value.len()) else {
        return XattrAnswer::Error(Errno::E2BIG);
    };
    if size == 0 {
        XattrAnswer::Size(len)
    } else if len > size {
        XattrAnswer::Error(Errno::ERANGE)
    } else {
        XattrAnswer::Data(value)
    }
}

/// `listxattr` wire format: each name followed by a NUL.
pub(crate) fn xattr_list(names: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(names.iter().map(|n| n.len() + 1).sum());
    for n in names {
        out.extend_from_slice(n);
        out.push(0);
    }
    out
}

/// A directory listing as the kernel sees it: `.` and `..` first, then the
/// engine's entries. Positions in this vector are the readdir offsets.
pub(crate) fn dir_snapshot(dir: Ino, parent: Ino, entries: Vec<DirEntry>) -> Vec<DirEntry> {
    let mut out = Vec::with_capacity(entries.len() + 2);
    out.push(DirEntry {
        name: b".".to_vec(),
        ino: dir,
        kind: FileKind::Dir,
    });
    out.push(DirEntry {
        name: b"..".to_vec(),
        ino: parent,
        kind: FileKind::Dir,
    });
    out.extend(entries);
    out
}

/// Which snapshot positions a readdir at `offset` returns. The offset the
/// kernel passes is the one we attached to the last entry it consumed, which is
/// that entry's position + 1, i.e. the position to resume at.
pub(crate) fn dir_window(len: usize, offset: u64) -> Range<usize> {
    let start = usize::try_from(offset).unwrap_or(usize::MAX).min(len);
    start..len
}

/// The offset attached to the entry at `pos`: where the next readdir resumes.
pub(crate) fn next_offset(pos: usize) -> u64 {
    pos as u64 + 1
}

/// True for `.` and `..`.
pub(crate) fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

#[cfg(test)]
mod time_tests {
    use super::*;

    #[test]
    fn kernel_times_before_1970_keep_their_fraction() {
        // The kernel sends (-1 s, 250000000 ns) = -0.75 s; fuser hands us EPOCH - 1.25 s.
        let from_fuser = SystemTime::UNIX_EPOCH - Duration::new(1, 250_000_000);
        assert_eq!(kernel_time(from_fuser), Timestamp(-750_000_000));
        let from_fuser = SystemTime::UNIX_EPOCH - Duration::new(1_234_567_890, 123_456_789);
        assert_eq!(kernel_time(from_fuser), Timestamp(-1_234_567_890 * 1_000_000_000 + 123_456_789));
        // Whole seconds and later times pass through.
        assert_eq!(kernel_time(SystemTime::UNIX_EPOCH - Duration::new(5, 0)), Timestamp(-5_000_000_000));
        assert_eq!(kernel_time(SystemTime::UNIX_EPOCH + Duration::new(5, 7)), Timestamp(5_000_000_007));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: FileKind, perm: u32) -> Attr {
        Attr {
            ino: 42,
            kind,
            perm,
            nlink: 3,
            uid: 1000,
            gid: 100,
            rdev: 0x0801,
            size: 12345,
            blocks: 32,
            atime: Timestamp(1_700_000_000_123_456_789),
            mtime: Timestamp(-1_500_000_000),
            ctime: Timestamp(0),
            btime: Timestamp(5),
        }
    }

    #[test]
    fn kinds_map_one_to_one() {
        let all = [
            (FileKind::File, FileType::RegularFile, libc::S_IFREG),
            (FileKind::Dir, FileType::Directory, libc::S_IFDIR),
            (FileKind::Symlink, FileType::Symlink, libc::S_IFLNK),
            (FileKind::Fifo, FileType::NamedPipe, libc::S_IFIFO),
            (FileKind::Socket, FileType::Socket, libc::S_IFSOCK),
            (FileKind::CharDev, FileType::CharDevice, libc::S_IFCHR),
            (FileKind::BlockDev, FileType::BlockDevice, libc::S_IFBLK),
        ];
        for (kind, ft, ifmt) in all {
            assert_eq!(file_type(kind), ft);
            assert_eq!(FileKind::from_mode(ifmt | 0o644), Some(kind));
        }
    }

    #[test]
    fn attr_conversion_keeps_every_field() {
        let a = attr(FileKind::File, 0o4755);
        let f = file_attr(&a);
        assert_eq!(f.ino, INodeNo(42));
        assert_eq!(f.kind, FileType::RegularFile);
        assert_eq!(f.perm, 0o4755);
        assert_eq!((f.nlink, f.uid, f.gid, f.rdev), (3, 1000, 100, 0x0801));
        assert_eq!((f.size, f.blocks), (12345, 32));
        assert_eq!(f.blksize, BLKSIZE);
        assert_eq!(Timestamp::from_system(f.atime), a.atime);
        assert_eq!(Timestamp::from_system(f.mtime), a.mtime);
        assert_eq!(Timestamp::from_system(f.ctime), a.ctime);
        assert_eq!(Timestamp::from_system(f.crtime), a.btime);
    }

    #[test]
    fn attr_conversion_drops_type_bits_from_perm() {
        let f = file_attr(&attr(FileKind::Dir, libc::S_IFDIR | 0o1777));
        assert_eq!(f.perm, 0o1777);
        assert_eq!(f.kind, FileType::Directory);
    }

    #[test]
    fn umask_is_applied_and_type_bits_dropped() {
        assert_eq!(new_perm(libc::S_IFREG | 0o666, 0o022), 0o644);
        assert_eq!(new_perm(0o777, 0o077), 0o700);
        assert_eq!(new_perm(0o4777, 0o002), 0o4775);
        assert_eq!(new_perm(libc::S_IFDIR | 0o2775, 0), 0o2775);
    }

    #[test]
    fn node_kinds_for_mknod() {
        assert_eq!(node_kind(0o644), Ok(FileKind::File));
        assert_eq!(node_kind(libc::S_IFREG | 0o644), Ok(FileKind::File));
        assert_eq!(node_kind(libc::S_IFIFO | 0o600), Ok(FileKind::Fifo));
        assert_eq!(node_kind(libc::S_IFSOCK | 0o600), Ok(FileKind::Socket));
        assert_eq!(node_kind(libc::S_IFCHR | 0o600), Ok(FileKind::CharDev));
        assert_eq!(node_kind(libc::S_IFBLK | 0o600), Ok(FileKind::BlockDev));
        assert_eq!(node_kind(libc::S_IFDIR | 0o755), Err(Errno::EINVAL));
        assert_eq!(node_kind(libc::S_IFLNK | 0o777), Err(Errno::EINVAL));
    }

    #[test]
    fn times_from_kernel() {
        assert_eq!(set_time(TimeOrNow::Now), SetTime::Now);
        let t = Timestamp(1_234_567_890_123_456_789);
        assert_eq!(
            set_time(TimeOrNow::SpecificTime(t.to_system())),
            SetTime::At(t)
        );
        // -42.000000001 s reaches fuser as (secs -43, nsecs 999999999), which
        // it decodes as EPOCH - 43.999999999 s.
        let from_fuser = std::time::UNIX_EPOCH - Duration::new(43, 999_999_999);
        assert_eq!(
            set_time(TimeOrNow::SpecificTime(from_fuser)),
            SetTime::At(Timestamp(-42_000_000_001))
        );
    }

    #[test]
    fn rename_flag_rules() {
        let f = rename_flags(0).unwrap();
        assert!(!f.noreplace && !f.exchange);
        assert!(rename_flags(libc::RENAME_NOREPLACE).unwrap().noreplace);
        assert!(rename_flags(libc::RENAME_EXCHANGE).unwrap().exchange);
        assert_eq!(
            rename_flags(libc::RENAME_WHITEOUT).err(),
            Some(Errno::EINVAL)
        );
        assert_eq!(
            rename_flags(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE).err(),
            Some(Errno::EINVAL)
        );
        assert_eq!(rename_flags(1 << 20).err(), Some(Errno::EINVAL));
    }

    #[test]
    fn xattr_flag_rules() {
        let f = xattr_flags(0).unwrap();
        assert!(!f.create && !f.replace);
        assert!(xattr_flags(libc::XATTR_CREATE).unwrap().create);
        assert!(xattr_flags(libc::XATTR_REPLACE).unwrap().replace);
        assert_eq!(xattr_flags(0x10).err(), Some(Errno::EINVAL));
    }

    #[test]
    fn xattr_size_protocol() {
        let v = b"hello";
        assert_eq!(xattr_answer(0, v), XattrAnswer::Size(5));
        assert_eq!(xattr_answer(5, v), XattrAnswer::Data(&v[..]));
        assert_eq!(xattr_answer(4096, v), XattrAnswer::Data(&v[..]));
        assert_eq!(xattr_answer(4, v), XattrAnswer::Error(Errno::ERANGE));
        // An empty value: size query says 0, any buffer holds it.
        assert_eq!(xattr_answer(0, b""), XattrAnswer::Size(0));
        assert_eq!(xattr_answer(1, b""), XattrAnswer::Data(&b""[..]));
    }

    #[test]
    fn xattr_list_is_nul_terminated() {
        assert_eq!(xattr_list(&[]), b"");
        let names = vec![b"user.a".to_vec(), b"security.selinux".to_vec()];
        let l = xattr_list(&names);
        assert_eq!(l, b"user.a\0security.selinux\0");
        assert_eq!(xattr_answer(0, &l), XattrAnswer::Size(24));
        assert_eq!(xattr_answer(23, &l), XattrAnswer::Error(Errno::ERANGE));
    }

    fn entry(name: &str, ino: Ino) -> DirEntry {
        DirEntry {
            name: name.as_bytes().to_vec(),
            ino,
            kind: FileKind::File,
        }
    }

    #[test]
    fn snapshot_starts_with_dots() {
        let s = dir_snapshot(7, 3, vec![entry("a", 10), entry("b", 11)]);
        let names: Vec<&[u8]> = s.iter().map(|e| &e.name[..]).collect();
        assert_eq!(names, [&b"."[..], b"..", b"a", b"b"]);
        assert_eq!((s[0].ino, s[1].ino), (7, 3));
        assert_eq!((s[0].kind, s[1].kind), (FileKind::Dir, FileKind::Dir));
        assert!(is_dot(&s[0].name) && is_dot(&s[1].name) && !is_dot(&s[2].name));
        assert!(!is_dot(b"...") && !is_dot(b".a"));
    }

    #[test]
    fn readdir_offsets_resume_after_the_last_entry() {
        let s = dir_snapshot(
            1,
            1,
            (0..5).map(|i| entry(&format!("f{i}"), 10 + i)).collect(),
        );
        assert_eq!(s.len(), 7);
        // First call: everything.
        assert_eq!(dir_window(s.len(), 0), 0..7);
        // The kernel consumed ".", "..", "f0" (positions 0..=2); the last
        // offset it saw is next_offset(2) = 3, so we resume at "f1".
        let off = next_offset(2);
        let w = dir_window(s.len(), off);
        assert_eq!(w, 3..7);
        assert_eq!(s[w.start].name, b"f1");
        // Past the end: empty, never a panic.
        assert!(dir_window(s.len(), 7).is_empty());
        assert!(dir_window(s.len(), 1000).is_empty());
        assert!(dir_window(s.len(), u64::MAX).is_empty());
        // Offsets are never 0 (0 means "from the start").
        assert_eq!(next_offset(0), 1);
    }

    #[test]
    fn walking_a_listing_in_small_pages_sees_every_entry_once() {
        let s = dir_snapshot(
            1,
            1,
            (0..23)
                .map(|i| entry(&format!("f{i:02}"), 10 + i))
                .collect(),
        );
        let mut seen = Vec::new();
        let mut offset = 0;
        loop {
            let w = dir_window(s.len(), offset);
            if w.is_empty() {
                break;
            }
            // A reply buffer with room for 4 entries.
            for pos in w.take(4) {
                seen.push(s[pos].name.clone());
                offset = next_offset(pos);
            }
        }
        assert_eq!(seen.len(), s.len());
        assert_eq!(seen, s.iter().map(|e| e.name.clone()).collect::<Vec<_>>());
    }
}
