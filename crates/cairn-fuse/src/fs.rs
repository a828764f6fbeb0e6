//! `CairnFs`: the `fuser::Filesystem` implementation.
//!
//! Every handler has one shape: take the arguments apart, call the engine,
//! convert at the edge (`crate::convert`), reply. Engine errors become errnos
//! through [`errno`], which also logs them.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use cairn_engine::metrics::{Op, Timer};
use cairn_engine::{Attr, Caller, DirEntry, ErrorKind, Ino, LockKind, LockOutcome, LockStyle, SetAttr, Timestamp, Volume};
use dashmap::DashMap;
use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileHandle, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyIoctl, ReplyLock, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};
use tracing::{debug, error, info, warn};

use crate::convert::{
    dir_snapshot, dir_window, file_attr, file_type, is_dot, new_perm, next_offset, node_kind,
    placeholder_attr, rename_flags, set_time, xattr_answer, xattr_flags, xattr_list, XattrAnswer,
    TTL,
};

/// Inode numbers are never reused by the engine, so generation 0 is enough.
const GENERATION: Generation = Generation(0);

/// Largest write the kernel may send in one request (and, through
/// `max_pages`, the largest read).
const MAX_WRITE: u32 = 1 << 20;

/// Background requests (readahead, async direct I/O) the kernel may keep in
/// flight, and the level at which it considers the queue congested (3/4).
const MAX_BACKGROUND: u16 = 64;
const CONGESTION_THRESHOLD: u16 = 48;

/// Capabilities requested when the kernel offers them.
///
/// - `PARALLEL_DIROPS`: lookups and readdirs in one directory run concurrently
///   (the engine is thread-safe); without it the kernel serialises them.
/// - `DO_READDIRPLUS` + `READDIRPLUS_AUTO`: `ls -l` gets names and attributes
///   in one round trip; the kernel falls back to plain readdir when the
///   attributes are not being used.
/// - `CACHE_SYMLINKS`: symlink targets never change, let the page cache keep them.
/// - `ASYNC_DIO`: a large O_DIRECT request is sent as parallel requests.
/// - `HANDLE_KILLPRIV_V2`: the daemon clears setuid/setgid on write, truncate
///   and chown (see [`Cairn::kill_suid`]). Without it the kernel cannot set
///   SB_NOSEC and asks `getxattr("security.capability")` before every
///   `write(2)`: measured, 6 round trips per small file created and written
///   (GETATTR, LOOKUP, CREATE, GETXATTR, WRITE, RELEASE), 2 per 4 KiB write.
///   The kernel flags writes (`FUSE_WRITE_KILL_SUIDGID`); fuser 0.18's
///   `setattr` does not pass on `FATTR_KILL_SUIDGID`, so a truncate clears
///   the bits when the caller is not root (the kernel's own rule is "lacks
///   CAP_FSETID"), and a chown of a non-directory always does, as Linux does.
///
/// - `WRITEBACK_CACHE` (unless the mount turns it off, see
///   [`CairnFs::with_writeback_cache`]): `write(2)` lands in the page cache
///   and the kernel sends whole dirty ranges, up to `max_write`, at close,
///   fsync or memory pressure. PostMark's 8 KiB writes became one request
///   per 1 MiB instead of one per write (1.7-2.7x the transactions per
///   second, docs/design.md "The kernel's writeback cache"). The kernel then
///   owns size and mtime of open files and ignores the sizes the daemon
///   reports, so whatever changes a file outside `write`/`truncate` must
///   first push the file's dirty pages (close of any descriptor does,
///   `syncfs` does for all) and then make the kernel take the new size
///   (`ftruncate` to it): `cairn_client` and the CLI do both.
///
/// Deliberately not requested:
/// - `SPLICE_READ/WRITE/MOVE`: these only tell the kernel the daemon may
///   splice /dev/fuse; fuser 0.18 always uses read/writev, so they would change
///   nothing.
/// - `POSIX_LOCKS` and `FLOCK_LOCKS`: see the note on locking in the crate
///   docs; leaving them out is what makes the kernel do locking itself.
/// - `ATOMIC_O_TRUNC`: O_TRUNC then arrives as a `setattr(size = 0)`, which
///   the engine already handles as a truncate.
/// - `AUTO_INVAL_DATA`: not needed. Opens of regular files keep the page
///   cache (`FOPEN_KEEP_CACHE`): one daemon owns the volume (it is locked),
///   every data change goes through the kernel (write, truncate, fallocate,
///   copy_file_range, which drop or update the pages themselves) or is
///   reported to it (rpwrite ioctls and control-socket edits call
///   `inval_inode`). Dropping a 1 GiB file's pages at every open cost 0.3 s.
///   A shared volume (metadata in PostgreSQL) is changed by other machines
///   too: its notifier thread invalidates what they changed, and `open`
///   leaves out `FOPEN_KEEP_CACHE` for a file changed since
///   (docs/shared-volume.md §6).
fn wanted_capabilities(writeback_cache: bool) -> InitFlags {
    let cache = if writeback_cache { InitFlags::FUSE_WRITEBACK_CACHE } else { InitFlags::empty() };
    cache
        | InitFlags::FUSE_PARALLEL_DIROPS
        | InitFlags::FUSE_DO_READDIRPLUS
        | InitFlags::FUSE_READDIRPLUS_AUTO
        | InitFlags::FUSE_CACHE_SYMLINKS
        | InitFlags::FUSE_ASYNC_DIO
        | InitFlags::FUSE_HANDLE_KILLPRIV_V2
}

/// The permission bits left once setuid (and setgid, where it means "set
/// group id on execution": with group execute) are cleared; None if none
/// of them is set.
fn without_suid(perm: u32) -> Option<u32> {
    let mut p = perm & !0o4000;
    if perm & 0o2010 == 0o2010 {
        p &= !0o2000;
    }
    (p != perm).then_some(p)
}

/// An open directory: the listing taken at opendir (or at the last rewind).
struct DirHandle {
    /// Taken at the first readdir, not at opendir: with the kernel's
    /// directory cache (`FOPEN_CACHE_DIR`) most opens read no entry here.
    listing: Option<Arc<Vec<DirEntry>>>,
    /// Whether a readdir has been answered from `listing`: a later readdir at
    /// offset 0 is a `rewinddir`, which must see a fresh listing (POSIX).
    served: bool,
}

/// The FUSE file system: a thin adapter from kernel requests to a [`Volume`].
///
/// All state lives in the engine except the open-directory listings, kept in
/// a sharded map so concurrent `readdir`s on different handles do not contend.
pub struct CairnFs {
    vol: Arc<Volume>,
    dirs: DashMap<u64, DirHandle>,
    next_fh: AtomicU64,
    /// Set by `init`: `destroy` closes the volume only if the session really
    /// started, so a failed mount leaves the caller's volume untouched.
    initialized: bool,
    /// Whether to ask for the kernel's writeback cache; after `init`,
    /// whether the kernel granted it.
    writeback_cache: bool,
    /// Source tokens handed out by `IOC_SOURCE`: token -> (inode, handle).
    /// A token is random (never an inode number) and dies with its handle.
    sources: DashMap<u64, (Ino, u64)>,
    /// The token of each handle that has one (handle -> token), for release.
    source_of: DashMap<u64, u64>,
    /// On a shared volume mounted read-write, once `init` got the kernel
    /// to send lock requests: the parked blocking ones (locks are then
    /// the metadata store's, shared by every machine). None: the kernel
    /// keeps locks itself, as on any other volume.
    locks: Option<Arc<crate::locks::LockWaiters>>,
    /// Where reads and fsyncs run, if not on the thread that took them
    /// from the kernel (`with_offload`).
    offload: Option<crate::offload::Offload>,
    /// `close(2)` of a handle open for writing fsyncs the file
    /// (`with_fsync_on_close`).
    fsync_on_close: bool,
}

impl CairnFs {
    /// Clears setuid/setgid before a write by a caller without CAP_FSETID
    /// (the kernel flagged it): one metadata read, and a write only when
    /// the bits are set.
    fn kill_suid(&self, ino: Ino) -> cairn_engine::Result<()> {
        let a = self.vol.getattr(ino)?;
        if let Some(perm) = without_suid(a.perm) {
            self.vol.setattr(ino, &SetAttr { perm: Some(perm), uid: None, gid: None, size: None, atime: None, mtime: None, ctime: None })?;
        }
        Ok(())
    }

    /// Wraps a volume. Nothing happens until the session calls `init`.
    pub fn new(vol: Arc<Volume>) -> Self {
        CairnFs {
            vol,
            dirs: DashMap::new(),
            next_fh: AtomicU64::new(1),
            initialized: false,
            writeback_cache: true,
            sources: DashMap::new(),
            source_of: DashMap::new(),
            locks: None,
            offload: None,
            fsync_on_close: false,
        }
    }

    /// Runs reads and fsyncs on `workers` threads of their own, so that the
    /// threads reading requests from the kernel never wait on the disk.
    pub fn with_offload(mut self, workers: usize) -> io::Result<Self> {
        self.offload = Some(crate::offload::Offload::new(workers)?);
        Ok(self)
    }

    fn offloaded(&self, job: impl FnOnce() + Send + 'static) {
        match &self.offload {
            Some(o) => o.run(job),
            None => job(),
        }
    }

    /// Whether the kernel may cache writes (default: yes). Without it every
    /// `write(2)` is a round trip to the daemon.
    pub fn with_writeback_cache(mut self, on: bool) -> Self {
        self.writeback_cache = on;
        self
    }

    /// Whether `close(2)` of a file opened for writing returns only once
    /// the file is as durable as `fsync` makes it (default: no; the writes
    /// are in the journal at close, and reach the home in the background).
    /// For tape users who must know a file is on the tape when `close`
    /// returns (docs/tape.md §2, "close").
    pub fn with_fsync_on_close(mut self, on: bool) -> Self {
        self.fsync_on_close = on;
        self
    }

    /// The volume this file system serves.
    pub fn volume(&self) -> &Arc<Volume> {
        &self.vol
    }

    /// Creates a file or special node from a kernel mode and umask (mknod
    /// and create share this).
    #[allow(clippy::too_many_arguments)]
    fn make_node(&self, op: &'static str, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32) -> Result<Attr, Errno> {
        let kind = node_kind(mode)?;
        self.vol
            .create(parent.0, bytes(name), kind, new_perm(mode, umask), rdev, caller(req))
            .map_err(|e| errno(op, parent.0, &e))
    }

    /// Answers with an entry for `attr`: the kernel takes a reference to
    /// the inode, counted before the reply goes (a FORGET cannot overtake it).
    fn entry(&self, reply: ReplyEntry, attr: &cairn_engine::Attr) {
        self.vol.kernel_ref(attr.ino);
        reply.entry(&TTL, &file_attr(attr), GENERATION)
    }

    /// A new file handle; the low bits record whether it may write (bit 0)
    /// and read (bit 1) (the kernel checks open modes, but ioctls carry
    /// only the handle).
    fn new_fh(&self, writable: bool, readable: bool) -> FileHandle {
        FileHandle((self.next_fh.fetch_add(1, Ordering::Relaxed) << 2) | (readable as u64) << 1 | writable as u64)
    }

    /// The source token of open file `fh` (`IOC_SOURCE`), made on first ask.
    /// Only a handle open for reading gets one: the kernel let the caller
    /// open it after checking every directory on the way and the file's
    /// mode, exactly what `copy_file_range`'s source descriptor proves.
    fn source_token(&self, ino: Ino, fh: FileHandle) -> Result<u64, Errno> {
        if fh.0 & 2 == 0 {
            return Err(Errno::EBADF);
        }
        if let Some(t) = self.source_of.get(&fh.0) {
            return Ok(*t);
        }
        loop {
            let mut b = [0u8; 8];
            // SAFETY: getrandom fills the 8 bytes of `b`.
            if unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) } != b.len() as isize {
                return Err(Errno::EIO);
            }
            let token = u64::from_le_bytes(b);
            if token == 0 || self.sources.contains_key(&token) {
                continue;
            }
            self.sources.insert(token, (ino, fh.0));
            // Two threads asking at once for one handle: keep the first token.
            let kept = *self.source_of.entry(fh.0).or_insert(token);
            if kept != token {
                self.sources.remove(&token);
            }
            return Ok(kept);
        }
    }

    /// Answers the Cairn ioctls (`cairn_client::ioctl`).
    fn cairn_ioctl(&self, _req: &Request, ino: Ino, fh: FileHandle, cmd: u32) -> Result<Vec<u8>, Errno> {
        use cairn::ioctl;
        match cmd {
            ioctl::IOC_PROBE => {
                let p = ioctl::Probe { magic: ioctl::PROBE_MAGIC, version: ioctl::PROTOCOL_VERSION, inline_max: ioctl::INLINE_MAX as u32 };
                Ok(p.bytes().to_vec())
            }
            ioctl::IOC_SOURCE => {
                let token = self.source_token(ino, fh)?;
                Ok(ioctl::Source { token }.bytes().to_vec())
            }
            _ => Err(Errno::ENOTTY),
        }
    }

    /// Checks an rpwrite ioctl (`IOC_RPWRITE`) where it arrives and returns
    /// the edit, to run on a worker: the edit itself (the source's journal
    /// flushed into chunks, the junctions re-chunked, the commit) takes
    /// tens of milliseconds for megabytes, and on the one thread that reads
    /// requests it held every other request of the mount that long.
    fn prepare_rpwrite(&self, ino: Ino, fh: FileHandle, in_data: &[u8]) -> Result<impl FnOnce() -> Result<Vec<u8>, Errno> + Send + 'static, Errno> {
        use cairn::ioctl;
        let mut r = ioctl::Rpwrite::from_bytes(in_data).ok_or(Errno::EINVAL)?;
        // EISDIR and EROFS say more than EBADF, so they come first.
        self.vol.check_file_writable(ino).map_err(|e| errno("rpwrite", ino, &e))?;
        if fh.0 & 1 == 0 {
            return Err(Errno::EBADF);
        }
        let src = if r.flags & ioctl::RP_FROM_SOURCE != 0 {
            // The same answer for every token that is not a live one, so
            // nothing tells which inode numbers exist.
            Some(self.sources.get(&r.src).map(|e| e.0).ok_or(Errno::EBADF)?)
        } else if r.flags != 0 {
            // Version 1 named its source by inode number.
            return Err(Errno::EINVAL);
        } else {
            usize::try_from(r.nbyte).ok().filter(|n| *n <= ioctl::INLINE_MAX).ok_or(Errno::EINVAL)?;
            None
        };
        let vol = self.vol.clone();
        Ok(move || {
            let new = match src {
                Some(src) => cairn_engine::NewBytes::Range { ino: src, offset: r.src_offset, len: r.nbyte },
                None => cairn_engine::NewBytes::Data(&r.data[..r.nbyte as usize]),
            };
            let rep = vol.replace(ino, r.offset, r.mbyte, new).map_err(|e| errno("rpwrite", ino, &e))?;
            r.new_size = rep.size;
            r.rechunked = rep.rechunked_bytes;
            r.new_bytes = rep.new_chunk_bytes;
            r.old_chunks = rep.old_chunks_rechunked;
            // The kernel caches pages and the size of this file; the ioctl
            // changed both behind its back. The notices go from a thread of
            // their own (mount.rs, KernelNotifier), which this waits for,
            // boundedly.
            vol.notify_resized(ino, rep.size);
            Ok(r.header_bytes().to_vec())
        })
    }

    /// A directory listing with `.` and `..`, as served to readdir.
    fn take_listing(&self, dir: Ino) -> Result<Arc<Vec<DirEntry>>, Errno> {
        let entries = self
            .vol
            .readdir(dir)
            .map_err(|e| errno("readdir", dir, &e))?;
        let parent = self
            .vol
            .parent_of(dir)
            .map_err(|e| errno("readdir", dir, &e))?;
        Ok(Arc::new(dir_snapshot(dir, parent, entries)))
    }

    /// The listing a readdir at `offset` on handle `fh` reads from. The shard
    /// lock is never held across an engine call.
    fn listing(&self, dir: Ino, fh: FileHandle, offset: u64) -> Result<Arc<Vec<DirEntry>>, Errno> {
        let cached = self.dirs.get_mut(&fh.0).map(|mut h| {
            let rewind = offset == 0 && h.served;
            h.served = true;
            if rewind { None } else { h.listing.clone() }
        });
        match cached {
            Some(Some(listing)) => Ok(listing),
            Some(None) => {
                let fresh = self.take_listing(dir)?;
                if let Some(mut h) = self.dirs.get_mut(&fh.0) {
                    h.listing = Some(fresh.clone());
                }
                Ok(fresh)
            }
            // A handle we never issued: answer statelessly.
            None => self.take_listing(dir),
        }
    }
}

/// The errno an engine error maps to. I/O errors (unreadable or corrupt packs,
/// a failing backend, a broken metadata store) are logged at warn with the
/// engine's message, which names the pack; the expected ones (ENOENT, EEXIST,
/// ...) only at debug.
fn errno(op: &'static str, ino: Ino, e: &cairn_engine::Error) -> Errno {
    let code = e.errno();
    if code == libc::EIO {
        warn!(op, ino, "I/O error: {}", e.message());
    } else {
        debug!(op, ino, errno = code, "{}", e.message());
    }
    Errno::from_i32(code)
}

/// Marks a request failed in its metrics on the way to its error reply.
fn failed<R>(t: &mut Timer<'_>, reply: R) -> R {
    t.failed();
    reply
}

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
    }
}

/// The lock kind of a `struct flock` type.
fn lock_kind(typ: i32) -> Option<LockKind> {
    match typ {
        libc::F_RDLCK => Some(LockKind::Read),
        libc::F_WRLCK => Some(LockKind::Write),
        libc::F_UNLCK => Some(LockKind::Unlock),
        _ => None,
    }
}

/// Whether open flags allow writing.
fn writable(flags: i32) -> bool {
    flags & libc::O_ACCMODE != libc::O_RDONLY
}

fn readable(flags: i32) -> bool {
    flags & libc::O_ACCMODE != libc::O_WRONLY
}

fn bytes(name: &OsStr) -> &[u8] {
    name.as_bytes()
}

/// Locking: on a volume only this mount writes, neither `FUSE_POSIX_LOCKS`
/// nor `FUSE_FLOCK_LOCKS` is requested at init. The kernel then sets
/// `fc->no_lock` / `fc->no_flock` and serves fcntl and flock locks locally
/// (`posix_lock_file`, `locks_lock_file_wait` in fs/fuse/file.c): correct
/// for a single mount, and no round trip. On a shared volume mounted
/// read-write both are requested and `getlk`/`setlk` keep the locks in the
/// metadata store, where every machine's mount sees them
/// (docs/shared-volume.md §8).
impl Filesystem for CairnFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        if let Err(nearest) = config.set_max_write(MAX_WRITE) {
            let _ = config.set_max_write(nearest);
        }
        // As large as the kernel allows (it offers its own maximum).
        if let Err(max) = config.set_max_readahead(u32::MAX) {
            let _ = config.set_max_readahead(max);
        }
        if let Err(nearest) = config.set_max_background(MAX_BACKGROUND) {
            let _ = config.set_max_background(nearest);
        }
        if let Err(nearest) = config.set_congestion_threshold(CONGESTION_THRESHOLD) {
            let _ = config.set_congestion_threshold(nearest);
        }
        let offered = config.capabilities();
        let wanted = wanted_capabilities(self.writeback_cache);
        let missing = wanted & !offered;
        if !missing.is_empty() {
            debug!("kernel does not offer {missing:?}");
        }
        // Only offered bits are requested, so this cannot fail.
        let _ = config.add_capabilities(wanted & offered);
        // From here on: whether the kernel really caches writes.
        self.writeback_cache = (wanted & offered).contains(InitFlags::FUSE_WRITEBACK_CACHE);
        if self.vol.lock_session().is_some() {
            let locks = InitFlags::FUSE_POSIX_LOCKS | InitFlags::FUSE_FLOCK_LOCKS;
            if offered.contains(locks) {
                let _ = config.add_capabilities(locks);
                self.locks = Some(crate::locks::LockWaiters::new(&self.vol));
            } else {
                warn!("the kernel does not offer FUSE_POSIX_LOCKS and FUSE_FLOCK_LOCKS: file locks on this mount are not seen by other machines");
            }
        }
        self.initialized = true;
        info!(abi = %config.kernel_abi(), writeback_cache = self.writeback_cache, "FUSE session initialised");
        Ok(())
    }

    fn destroy(&mut self) {
        if let Some(o) = &mut self.offload {
            o.stop();
        }
        self.dirs.clear();
        if let Some(l) = self.locks.take() {
            l.stop();
        }
        if !self.initialized {
            return;
        }
        self.initialized = false;
        info!("unmounted: flushing and closing the volume");
        if let Err(e) = self.vol.close() {
            error!("closing the volume at unmount failed: {}", e.message());
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut t = self.vol.metrics().start(Op::Lookup);
        match self.vol.lookup(parent.0, bytes(name)) {
            Ok(attr) => self.entry(reply, &attr),
            // A negative entry (node id 0): the kernel caches the miss for TTL,
            // so repeated probes of missing names (PATH, shared libraries,
            // build tools) stay in the kernel. Creating the name through this
            // mount replaces the negative dentry at once.
            Err(e) if e.errno() == libc::ENOENT => reply.entry(
                &TTL,
                &placeholder_attr(0, cairn_engine::FileKind::File),
                GENERATION,
            ),
            Err(e) => failed(&mut t, reply).error(errno("lookup", parent.0, &e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        // The last FORGET of a file without names frees it (Volume::kernel_forget).
        // BATCH_FORGET comes here too (fuser's default calls this per node).
        if let Err(e) = self.vol.kernel_forget(ino.0, nlookup) {
            error!("forget of inode {}: freeing it failed: {} (the next mount frees it)", ino.0, e.message());
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let mut t = self.vol.metrics().start(Op::Getattr);
        match self.vol.getattr(ino.0) {
            Ok(attr) => reply.attr(&TTL, &file_attr(&attr)),
            Err(e) => failed(&mut t, reply).error(errno("getattr", ino.0, &e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut t = self.vol.metrics().start(Op::Setattr);
        // Handle-killpriv-v2 leaves clearing setuid/setgid on chown and
        // truncate to the file system (see `wanted_capabilities`).
        let kill = mode.is_none() && (uid.is_some() || gid.is_some() || (size.is_some() && req.uid() != 0));
        let mode = match kill.then(|| self.vol.getattr(ino.0)) {
            Some(Ok(a)) if a.kind != cairn_engine::FileKind::Dir => without_suid(a.perm),
            Some(Err(e)) => return failed(&mut t, reply).error(errno("setattr", ino.0, &e)),
            _ => mode,
        };
        let set = SetAttr {
            perm: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
            ctime: ctime.map(Timestamp::from_system),
        };
        match self.vol.setattr(ino.0, &set) {
            Ok(attr) => reply.attr(&TTL, &file_attr(&attr)),
            Err(e) => failed(&mut t, reply).error(errno("setattr", ino.0, &e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let mut t = self.vol.metrics().start(Op::Readlink);
        match self.vol.readlink(ino.0) {
            Ok(target) => reply.data(&target),
            Err(e) => failed(&mut t, reply).error(errno("readlink", ino.0, &e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let mut t = self.vol.metrics().start(Op::Mknod);
        match self.make_node("mknod", req, parent, name, mode, umask, rdev) {
            Ok(attr) => self.entry(reply, &attr),
            Err(e) => failed(&mut t, reply).error(e),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let mut t = self.vol.metrics().start(Op::Mkdir);
        let perm = new_perm(mode, umask);
        match self.vol.mkdir(parent.0, bytes(name), perm, caller(req)) {
            Ok(attr) => self.entry(reply, &attr),
            Err(e) => failed(&mut t, reply).error(errno("mkdir", parent.0, &e)),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut t = self.vol.metrics().start(Op::Unlink);
        match self.vol.unlink(parent.0, bytes(name)) {
            Ok(()) => reply.ok(),
            Err(e) => failed(&mut t, reply).error(errno("unlink", parent.0, &e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut t = self.vol.metrics().start(Op::Rmdir);
        match self.vol.rmdir(parent.0, bytes(name)) {
            Ok(()) => reply.ok(),
            Err(e) => failed(&mut t, reply).error(errno("rmdir", parent.0, &e)),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let mut t = self.vol.metrics().start(Op::Symlink);
        let target = target.as_os_str().as_bytes();
        match self
            .vol
            .symlink(parent.0, bytes(link_name), target, caller(req))
        {
            Ok(attr) => self.entry(reply, &attr),
            Err(e) => failed(&mut t, reply).error(errno("symlink", parent.0, &e)),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut t = self.vol.metrics().start(Op::Rename);
        let flags = match rename_flags(flags.bits()) {
            Ok(f) => f,
            Err(e) => return failed(&mut t, reply).error(e),
        };
        match self
            .vol
            .rename(parent.0, bytes(name), newparent.0, bytes(newname), flags)
        {
            Ok(()) => reply.ok(),
            Err(e) => failed(&mut t, reply).error(errno("rename", parent.0, &e)),
        }
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let mut t = self.vol.metrics().start(Op::Link);
        match self.vol.link(ino.0, newparent.0, bytes(newname)) {
            Ok(attr) => self.entry(reply, &attr),
            Err(e) => failed(&mut t, reply).error(errno("link", ino.0, &e)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut t = self.vol.metrics().start(Op::Open);
        // O_TRUNC arrives separately as setattr(size = 0); access modes were
        // checked by the kernel (default_permissions, ro mount), except that
        // snapshot files refuse writers (EROFS) as a read-only mount would.
        if writable(flags.0) {
            if let Err(e) = self.vol.check_file_writable(ino.0) {
                return failed(&mut t, reply).error(errno("open", ino.0, &e));
            }
        }
        // On a shared volume the file may have changed on another machine
        // since the kernel cached its pages: if so, the kernel drops them
        // at this open (no FOPEN_KEEP_CACHE).
        match self.vol.open(ino.0) {
            Ok(o) => {
                let cache = if o.keep_cache { FopenFlags::FOPEN_KEEP_CACHE } else { FopenFlags::empty() };
                reply.opened(self.new_fh(writable(flags.0), readable(flags.0)), cache)
            }
            Err(e) => failed(&mut t, reply).error(errno("open", ino.0, &e)),
        }
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
        let vol = self.vol.clone();
        let job = move || {
            let mut t = vol.metrics().start(Op::Read);
            match vol.read_shared(ino.0, offset, size) {
                Ok(data) => {
                    vol.metrics().kernel_read(data.len() as u64);
                    reply.data(&data)
                }
                Err(e) => failed(&mut t, reply).error(errno("read", ino.0, &e)),
            }
        };
        // A read of decoded chunks waits on nothing: served here, without
        // the hand-off's wake-up (a quarter of random 4 KiB reads' rate).
        if self.offload.is_some() && !self.vol.read_is_cached(ino.0, offset, size) {
            self.offloaded(job)
        } else {
            job()
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut t = self.vol.metrics().start(Op::Write);
        if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID) {
            if let Err(e) = self.kill_suid(ino.0) {
                return failed(&mut t, reply).error(errno("write", ino.0, &e));
            }
        }
        // With the writeback cache this is the kernel writing pages back;
        // it owns the file's times then (see `Volume::write_back`).
        let written = if self.writeback_cache { self.vol.write_back(ino.0, offset, data) } else { self.vol.write(ino.0, offset, data) };
        match written {
            Ok(n) => {
                self.vol.metrics().kernel_wrote(u64::from(n));
                reply.written(n)
            }
            Err(e) => failed(&mut t, reply).error(errno("write", ino.0, &e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // `--fsync-on-close`: the kernel wrote the file's dirty pages back
        // before this FLUSH; the close returns once they are durable. Only
        // for a handle open for writing: a reader's close must not stop a
        // streaming tape.
        let fsync = self.fsync_on_close && fh.0 & 1 == 1;
        if fsync && !self.vol.is_shared() {
            let vol = self.vol.clone();
            return self.offloaded(move || {
                let mut t = vol.metrics().start(Op::Flush);
                match vol.fsync(ino.0, false) {
                    Ok(()) => reply.ok(),
                    Err(e) => failed(&mut t, reply).error(errno("close(fsync)", ino.0, &e)),
                }
            });
        }
        // On a volume other machines open too, a close commits the file
        // (close-to-open; the kernel wrote its dirty pages back before
        // sending FLUSH). Elsewhere nothing is to do at close(2): writes are
        // already journaled, write-back is scheduled at release, and locks
        // are the kernel's. ENOSYS then makes the kernel stop sending FLUSH
        // altogether, which saves one round trip on every close (a quarter
        // of the cost of creating a file).
        if !self.vol.is_shared() {
            // Never ENOSYS with --fsync-on-close: the kernel would stop
            // sending FLUSH for the writers' closes too.
            match self.fsync_on_close {
                true => reply.ok(),
                false => reply.error(Errno::ENOSYS),
            }
            return;
        }
        let mut t = self.vol.metrics().start(Op::Flush);
        let committed = self.vol.close_commit(ino.0).and_then(|()| if fsync { self.vol.fsync(ino.0, false) } else { Ok(()) });
        // A close drops the POSIX locks its process held on the file
        // (after the commit: whoever takes the lock next reads the bytes).
        if self.locks.is_some() {
            if let Err(e) = self.vol.release_locks(ino.0, lock_owner.0, LockStyle::Posix) {
                let _ = errno("close(unlock)", ino.0, &e);
            }
        }
        match committed {
            Ok(()) => reply.ok(),
            Err(e) => failed(&mut t, reply).error(errno("close", ino.0, &e)),
        }
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut t = self.vol.metrics().start(Op::Release);
        // The last close of an open file that was flock'ed
        // (FUSE_RELEASE_FLOCK_UNLOCK): its flock goes.
        if let (Some(owner), Some(_)) = (lock_owner, &self.locks) {
            if let Err(e) = self.vol.release_locks(ino.0, owner.0, LockStyle::Posix) {
                let _ = errno("release(unlock)", ino.0, &e);
            }
        }
        if let Some((_, token)) = self.source_of.remove(&fh.0) {
            self.sources.remove(&token);
        }
        if flush {
            if let Err(e) = self.vol.flush_file(ino.0) {
                // The handle must still be dropped; the error is logged.
                let _ = errno("release(flush)", ino.0, &e);
            }
        }
        match self.vol.release(ino.0) {
            Ok(()) => reply.ok(),
            Err(e) => failed(&mut t, reply).error(errno("release", ino.0, &e)),
        }
    }

    fn getlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        if self.locks.is_none() {
            return reply.error(Errno::ENOSYS);
        }
        let Some(kind) = lock_kind(typ) else { return reply.error(Errno::EINVAL) };
        match self.vol.test_lock(ino.0, lock_owner.0, LockStyle::Posix, kind, start, end, pid) {
            Ok(Some(h)) => reply.locked(h.start, h.end, if h.kind == LockKind::Write { libc::F_WRLCK } else { libc::F_RDLCK }, h.pid),
            Ok(None) => reply.locked(start, end, libc::F_UNLCK, 0),
            Err(e) => reply.error(errno("getlk", ino.0, &e)),
        }
    }

    /// POSIX locks, and `flock` (which the kernel sends here too): fuser
    /// 0.18 drops the request's FUSE_LK_FLOCK flag, so an flock is kept as
    /// a whole-file POSIX lock owned by its open file (as the Linux NFS
    /// client keeps it): released at the file's last close, and it
    /// conflicts with a POSIX lock of another process on the file.
    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let Some(waiters) = &self.locks else { return reply.error(Errno::ENOSYS) };
        let Some(kind) = lock_kind(typ) else { return reply.error(Errno::EINVAL) };
        if kind == LockKind::Unlock {
            // Whoever takes the range next on another machine reads what
            // this one wrote under it (as a close does).
            if let Err(e) = self.vol.close_commit(ino.0) {
                return reply.error(errno("unlock(commit)", ino.0, &e));
            }
        }
        match self.vol.set_lock(ino.0, lock_owner.0, LockStyle::Posix, kind, start, end, pid) {
            Ok(LockOutcome::Granted) => reply.ok(),
            Ok(LockOutcome::Conflict(_)) if sleep => {
                waiters.park(crate::locks::Waiter { ino: ino.0, owner: lock_owner.0, kind, start, end, pid, tid: req.pid(), reply })
            }
            Ok(LockOutcome::Conflict(_)) => reply.error(Errno::EAGAIN),
            Err(e) => reply.error(errno("setlk", ino.0, &e)),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let vol = self.vol.clone();
        self.offloaded(move || {
            let mut t = vol.metrics().start(Op::Fsync);
            match vol.fsync(ino.0, datasync) {
                Ok(()) => reply.ok(),
                Err(e) => failed(&mut t, reply).error(errno("fsync", ino.0, &e)),
            }
        })
    }

    /// The listing is not read here but at the first readdir, and the
    /// kernel may keep what it read (`FOPEN_CACHE_DIR`, `FOPEN_KEEP_CACHE`):
    /// a directory listed again is served from its cache until it changes.
    /// The kernel drops that cache itself when a request of this mount
    /// changes the directory; on a shared volume another machine's change
    /// reaches it through the notifier (`inval_inode` of the directory), and
    /// an open first reads the change log, as a file's open does, so a
    /// listing after another machine's create shows it (close-to-open).
    /// Opendir stays a request of its own (no `FUSE_NO_OPENDIR_SUPPORT`):
    /// its handle carries the listing's snapshot, which keeps readdir's
    /// offsets stable while entries come and go.
    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _t = self.vol.metrics().start(Op::Opendir);
        let changed = match self.vol.catch_up(ino.0) {
            Ok(c) => c,
            Err(e) => {
                debug!("opendir of inode {}: reading other machines' changes: {e}", ino.0);
                true
            }
        };
        // No lookup here: the kernel opens only inodes it knows to be
        // directories, and one gone meanwhile fails at the first readdir.
        let fh = self.new_fh(false, false);
        self.dirs.insert(fh.0, DirHandle { listing: None, served: false });
        let keep = if changed { FopenFlags::empty() } else { FopenFlags::FOPEN_KEEP_CACHE };
        reply.opened(fh, FopenFlags::FOPEN_CACHE_DIR | keep);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut t = self.vol.metrics().start(Op::Readdir);
        let listing = match self.listing(ino.0, fh, offset) {
            Ok(l) => l,
            Err(e) => return failed(&mut t, reply).error(e),
        };
        for pos in dir_window(listing.len(), offset) {
            let e = &listing[pos];
            let name = OsStr::from_bytes(&e.name);
            if reply.add(INodeNo(e.ino), next_offset(pos), file_type(e.kind), name) {
                break; // buffer full: the kernel comes back from this offset
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let mut t = self.vol.metrics().start(Op::Readdirplus);
        let listing = match self.listing(ino.0, fh, offset) {
            Ok(l) => l,
            Err(e) => return failed(&mut t, reply).error(e),
        };
        let mut added = 0usize;
        for pos in dir_window(listing.len(), offset) {
            let e = &listing[pos];
            let attr = if is_dot(&e.name) {
                placeholder_attr(e.ino, e.kind)
            } else {
                match self.vol.getattr(e.ino) {
                    Ok(a) => file_attr(&a),
                    // Removed since the listing was taken: leave it out.
                    Err(err) if err.errno() == libc::ENOENT => continue,
                    Err(err) if added == 0 => {
                        return failed(&mut t, reply).error(errno("readdirplus", e.ino, &err))
                    }
                    // Send what we have; the next call resumes here and reports it.
                    Err(_) => break,
                }
            };
            let name = OsStr::from_bytes(&e.name);
            if reply.add(attr.ino, next_offset(pos), name, &TTL, &attr, GENERATION) {
                break;
            }
            // The kernel takes a reference to every entry but the dots.
            if !is_dot(&e.name) {
                self.vol.kernel_ref(e.ino);
            }
            added += 1;
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let _t = self.vol.metrics().start(Op::Releasedir);
        self.dirs.remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut t = self.vol.metrics().start(Op::Fsyncdir);
        // fsync(dirfd) after creating or renaming entries is how careful
        // programs make a name durable. `Volume::fsync` on the directory makes
        // the namespace durable (a metadata sync); `Volume::sync` would flush
        // and upload every dirty file of the volume, far too heavy for this.
        match self.vol.fsync(ino.0, datasync) {
            Ok(()) => reply.ok(),
            Err(e) => failed(&mut t, reply).error(errno("fsyncdir", ino.0, &e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let mut t = self.vol.metrics().start(Op::Statfs);
        match self.vol.statfs() {
            Ok(s) => reply.statfs(
                s.blocks,
                s.blocks_free,
                s.blocks_avail,
                s.files,
                s.files_free,
                s.block_size,
                s.name_max,
                s.block_size,
            ),
            Err(e) => failed(&mut t, reply).error(errno("statfs", 0, &e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        reply: ReplyEmpty,
    ) {
        let mut t = self.vol.metrics().start(Op::Setxattr);
        if position != 0 {
            // Resource-fork offsets exist on macOS only.
            return failed(&mut t, reply).error(Errno::EINVAL);
        }
        let flags = match xattr_flags(flags) {
            Ok(f) => f,
            Err(e) => return failed(&mut t, reply).error(e),
        };
        match self.vol.setxattr(ino.0, bytes(name), value, flags) {
            Ok(()) => reply.ok(),
            Err(e) => failed(&mut t, reply).error(errno("setxattr", ino.0, &e)),
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let mut t = self.vol.metrics().start(Op::Getxattr);
        let value = match self.vol.getxattr(ino.0, bytes(name)) {
            Ok(v) => v,
            Err(e) => return failed(&mut t, reply).error(errno("getxattr", ino.0, &e)),
        };
        match xattr_answer(size, &value) {
            XattrAnswer::Size(n) => reply.size(n),
            XattrAnswer::Data(d) => reply.data(d),
            XattrAnswer::Error(e) => failed(&mut t, reply).error(e),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let mut t = self.vol.metrics().start(Op::Listxattr);
        let list = match self.vol.listxattr(ino.0) {
            Ok(names) => xattr_list(&names),
            Err(e) => return failed(&mut t, reply).error(errno("listxattr", ino.0, &e)),
        };
        match xattr_answer(size, &list) {
            XattrAnswer::Size(n) => reply.size(n),
            XattrAnswer::Data(d) => reply.data(d),
            XattrAnswer::Error(e) => failed(&mut t, reply).error(e),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut t = self.vol.metrics().start(Op::Removexattr);
        match self.vol.removexattr(ino.0, bytes(name)) {
            Ok(()) => reply.ok(),
            Err(e) => failed(&mut t, reply).error(errno("removexattr", ino.0, &e)),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        let mut t = self.vol.metrics().start(Op::Access);
        // With default_permissions the kernel checks modes itself and does
        // not normally send ACCESS; if it does, the inode just has to exist.
        match self.vol.getattr(ino.0) {
            Ok(_) => reply.ok(),
            Err(e) => failed(&mut t, reply).error(errno("access", ino.0, &e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut t = self.vol.metrics().start(Op::Create);
        let attr = match self.make_node("create", req, parent, name, mode, umask, 0) {
            Ok(a) => a,
            Err(e) => return failed(&mut t, reply).error(e),
        };
        match self.vol.open_created(attr.ino) {
            Ok(()) => {
                self.vol.kernel_ref(attr.ino);
                reply.created(
                &TTL,
                &file_attr(&attr),
                GENERATION,
                self.new_fh(writable(flags), readable(flags)),
                FopenFlags::FOPEN_KEEP_CACHE,
            )
            }
            Err(e) => failed(&mut t, reply).error(errno("create(open)", attr.ino, &e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let mut t = self.vol.metrics().start(Op::Fallocate);
        match self.vol.fallocate(ino.0, offset, length, mode) {
            Ok(()) => reply.ok(),
            Err(e) => failed(&mut t, reply).error(errno("fallocate", ino.0, &e)),
        }
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        // An rpwrite runs on a worker, when the mount has them; its checks
        // (and their errors) here.
        if cmd == cairn::ioctl::IOC_RPWRITE {
            let edit = match self.prepare_rpwrite(ino.0, fh, in_data) {
                Ok(edit) => edit,
                Err(e) => {
                    let mut t = self.vol.metrics().start(Op::Ioctl);
                    debug!(cmd, "ioctl refused: {e:?}");
                    return failed(&mut t, reply).error(e);
                }
            };
            let vol = self.vol.clone();
            return self.offloaded(move || {
                let mut t = vol.metrics().start(Op::Ioctl);
                match edit() {
                    Ok(out) if out.len() <= out_size as usize => reply.ioctl(0, &out),
                    Ok(_) => failed(&mut t, reply).error(Errno::EINVAL),
                    Err(e) => failed(&mut t, reply).error(e),
                }
            });
        }
        let mut t = self.vol.metrics().start(Op::Ioctl);
        // Anything but Cairn's own answers ENOTTY, which is also what
        // isatty(3) expects (stdio and Python ask it of every file they open).
        match self.cairn_ioctl(req, ino.0, fh, cmd) {
            Ok(out) if out.len() <= out_size as usize => reply.ioctl(0, &out),
            Ok(_) => failed(&mut t, reply).error(Errno::EINVAL),
            Err(e) => {
                debug!(cmd, "ioctl refused: {e:?}");
                failed(&mut t, reply).error(e)
            }
        }
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let mut t = self.vol.metrics().start(Op::CopyFileRange);
        // A clone: the destination range shares the source's extents. The
        // reply counts in 32 bits, so it reports at most 4 GiB - 4 KiB and
        // callers loop; the engine still clones all it was asked (a whole
        // file shares its pages at once) and finds the later calls' ranges
        // already identical. The kernel drops its cached pages of the target.
        match self.vol.clone_range(ino_in.0, offset_in, ino_out.0, offset_out, len) {
            Ok(n) => reply.written(n.min(u32::MAX as u64 & !4095) as u32),
            Err(e) => failed(&mut t, reply).error(errno("copy_file_range", ino_out.0, &e)),
        }
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let mut t = self.vol.metrics().start(Op::Lseek);
        // The kernel answers SEEK_SET/CUR/END itself and only forwards these two.
        if whence != libc::SEEK_DATA && whence != libc::SEEK_HOLE {
            return failed(&mut t, reply).error(Errno::EINVAL);
        }
        let Ok(offset) = u64::try_from(offset) else {
            // As ext4 and XFS: a negative offset has no data or hole after it.
            return failed(&mut t, reply).error(Errno::ENXIO);
        };
        match self.vol.lseek(ino.0, offset, whence) {
            Ok(pos) => match i64::try_from(pos) {
                Ok(pos) => reply.offset(pos),
                Err(_) => failed(&mut t, reply).error(Errno::EOVERFLOW),
            },
            // The engine has no ENXIO kind: it reports "no data (or hole) at
            // or after this offset" as a range error.
            Err(e) if e.kind() == ErrorKind::Range => failed(&mut t, reply).error(Errno::ENXIO),
            Err(e) => failed(&mut t, reply).error(errno("lseek", ino.0, &e)),
        }
    }
}
