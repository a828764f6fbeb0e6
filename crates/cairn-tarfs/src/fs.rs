//! `TarFs`: the read-only `fuser::Filesystem` over a [`Tree`].

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cairn_tar::MemberKind;
use fuser::{
    AccessFlags, BsdFileFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use tracing::{error, info};

use crate::tree::{Node, Tree, ROOT};

/// The archive does not change under a mount (a changed archive is a new
/// index at the next mount), so the kernel may cache for long.
const TTL: Duration = Duration::from_secs(3600);
const GENERATION: Generation = Generation(0);
/// Largest read the kernel sends (set through max_pages at init).
const MAX_READ: u32 = 1 << 20;

/// A tar archive served read-only.
pub struct TarFs {
    tree: Tree,
    archive: File,
    archive_size: u64,
}

impl TarFs {
    /// Serves `tree`, whose data runs point into `archive`.
    pub fn new(tree: Tree, archive: File) -> io::Result<TarFs> {
        let archive_size = archive.metadata()?.len();
        Ok(TarFs {
            tree,
            archive,
            archive_size,
        })
    }

    fn node(&self, ino: INodeNo) -> Result<&Node, Errno> {
        self.tree.get(ino.0).ok_or(Errno::ENOENT)
    }

    fn attr(&self, ino: u64, n: &Node) -> FileAttr {
        FileAttr {
            ino: INodeNo(ino),
            size: match n.kind {
                MemberKind::Symlink => n.link.as_ref().map_or(0, |l| l.len() as u64),
                _ => n.size,
            },
            blocks: n.stored().div_ceil(512),
            atime: time(n.atime_ns),
            mtime: time(n.mtime_ns),
            ctime: time(n.ctime_ns),
            crtime: time(n.mtime_ns),
            kind: file_type(n.kind),
            perm: (n.mode & 0o7777) as u16,
            nlink: n.nlink,
            uid: n.uid,
            gid: n.gid,
            rdev: rdev(n.dev_major, n.dev_minor),
            blksize: 4096,
            flags: 0,
        }
    }

    /// Reads `size` bytes at `offset` of a file: runs from the archive,
    /// holes as zeros.
    fn read_file(&self, n: &Node, offset: u64, size: u32) -> io::Result<Vec<u8>> {
        if offset >= n.size {
            return Ok(Vec::new());
        }
        let len = u64::from(size).min(n.size - offset);
        let end = offset + len;
        let mut buf = vec![0u8; len as usize];
        // First run that ends after `offset`.
        let first = n.runs.partition_point(|r| r.file_offset + r.len <= offset);
        for r in &n.runs[first..] {
            if r.file_offset >= end {
                break;
            }
            let s = r.file_offset.max(offset);
            let e = (r.file_offset + r.len).min(end);
            let dst = &mut buf[(s - offset) as usize..(e - offset) as usize];
            let src = r.archive_offset + (s - r.file_offset);
            self.archive.read_exact_at(dst, src)?;
        }
        Ok(buf)
    }

    fn entry_attr(&self, dir: u64, pos: usize) -> Option<(u64, Vec<u8>, &Node)> {
        let d = self.tree.get(dir)?;
        match pos {
            0 => Some((dir, b".".to_vec(), d)),
            1 => Some((d.parent, b"..".to_vec(), self.tree.get(d.parent)?)),
            _ => {
                let (name, ino) = d.children.get(pos - 2)?;
                Some((*ino, name.clone(), self.tree.get(*ino)?))
            }
        }
    }
}

fn time(ns: i64) -> SystemTime {
    let d = Duration::new(
        ns.unsigned_abs() / 1_000_000_000,
        (ns.unsigned_abs() % 1_000_000_000) as u32,
    );
    if ns >= 0 {
        UNIX_EPOCH + d
    } else {
        UNIX_EPOCH.checked_sub(d).unwrap_or(UNIX_EPOCH)
    }
}

fn file_type(k: MemberKind) -> FileType {
    match k {
        MemberKind::Dir => FileType::Directory,
        MemberKind::Symlink => FileType::Symlink,
        MemberKind::Fifo => FileType::NamedPipe,
        MemberKind::CharDev => FileType::CharDevice,
        MemberKind::BlockDev => FileType::BlockDevice,
        MemberKind::File | MemberKind::HardLink => FileType::RegularFile,
    }
}

/// Linux's `new_encode_dev`.
fn rdev(major: u32, minor: u32) -> u32 {
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

/// The getxattr/listxattr size protocol.
fn xattr_reply(reply: ReplyXattr, size: u32, data: &[u8]) {
    if size == 0 {
        reply.size(data.len() as u32);
    } else if (size as usize) < data.len() {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(data);
    }
}

impl Filesystem for TarFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        if let Err(max) = config.set_max_readahead(u32::MAX) {
            let _ = config.set_max_readahead(max);
        }
        let wanted = InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_CACHE_SYMLINKS
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO;
        let _ = config.add_capabilities(wanted & config.capabilities());
        info!(nodes = self.tree.len(), "tar archive mounted");
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.tree.lookup(parent.0, name.as_bytes()) {
            Some(ino) => match self.tree.get(ino) {
                Some(n) => reply.entry(&TTL, &self.attr(ino, n), GENERATION),
                None => reply.error(Errno::ENOENT),
            },
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.node(ino) {
            Ok(n) => reply.attr(&TTL, &self.attr(ino.0, n)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.node(ino) {
            Ok(Node { link: Some(l), .. }) => reply.data(l),
            Ok(_) => reply.error(Errno::EINVAL),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let n = match self.node(ino) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        if n.kind == MemberKind::Dir {
            return reply.error(Errno::EISDIR);
        }
        if flags.0 & libc::O_ACCMODE != libc::O_RDONLY || flags.0 & libc::O_TRUNC != 0 {
            return reply.error(Errno::EROFS);
        }
        // The archive is fixed while mounted: keep the page cache.
        reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let n = match self.node(ino) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        if n.kind != MemberKind::File {
            return reply.error(Errno::EINVAL);
        }
        match self.read_file(n, offset, size.min(MAX_READ)) {
            Ok(d) => reply.data(&d),
            Err(e) => {
                error!(
                    ino = ino.0,
                    offset, "reading the archive failed: {e} (was it truncated?)"
                );
                reply.error(Errno::EIO);
            }
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.node(ino) {
            Ok(n) if n.kind == MemberKind::Dir => {
                reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE)
            }
            Ok(_) => reply.error(Errno::ENOTDIR),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let Ok(d) = self.node(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let total = d.children.len() + 2;
        // Offset k means "resume after entry k-1": entry positions are stable.
        for pos in (offset as usize)..total {
            let Some((ino, name, n)) = self.entry_attr(ino.0, pos) else {
                break;
            };
            if reply.add(
                INodeNo(ino),
                pos as u64 + 1,
                file_type(n.kind),
                OsStr::from_bytes(&name),
            ) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let Ok(d) = self.node(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let total = d.children.len() + 2;
        for pos in (offset as usize)..total {
            let Some((child, name, n)) = self.entry_attr(ino.0, pos) else {
                break;
            };
            let attr = self.attr(child, n);
            if reply.add(
                INodeNo(child),
                pos as u64 + 1,
                OsStr::from_bytes(&name),
                &TTL,
                &attr,
                GENERATION,
            ) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let blocks = self.archive_size.div_ceil(4096);
        reply.statfs(blocks, 0, 0, self.tree.len() as u64, 0, 4096, 255, 4096);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let n = match self.node(ino) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        match n
            .xattrs
            .iter()
            .find(|(k, _)| k.as_slice() == name.as_bytes())
        {
            Some((_, v)) => xattr_reply(reply, size, v),
            None => reply.error(Errno::NO_XATTR),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let n = match self.node(ino) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let mut list = Vec::new();
        for (k, _) in &n.xattrs {
            list.extend_from_slice(k);
            list.push(0);
        }
        xattr_reply(reply, size, &list);
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        match self.node(ino) {
            Ok(_) if mask.contains(AccessFlags::W_OK) => reply.error(Errno::EROFS),
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    // Everything that would modify the tree: EROFS.

    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _target: &Path,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::EROFS);
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        reply.error(Errno::EROFS);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }
}

/// Root inode number, for callers that walk the tree.
pub const ROOT_INO: u64 = ROOT;
