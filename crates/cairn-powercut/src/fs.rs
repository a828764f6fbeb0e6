//! The `fuser::Filesystem`: namespace operations pass through to the backing
//! directory, file contents go through per-inode [`Overlay`]s.
//!
//! Locking: the inode table ([`Table`]) is one mutex held only for in-memory
//! work, never across I/O, and never while waiting for another lock (it is
//! a leaf). Each inode's [`FileState`] has its own mutex, held across that
//! file's I/O (reads of the backing file, persisting at fsync); taking the
//! table lock while holding a file lock is allowed, the reverse is not.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, Metadata, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, BsdFileFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;
use tracing::{debug, info, warn};

use crate::overlay::{read_full_at, Overlay};
use crate::Stats;

/// Attribute and entry cache time: every change goes through this process.
const TTL: Duration = Duration::from_secs(1);
/// FUSE inode numbers are never reused within a mount.
const GENERATION: Generation = Generation(0);
/// Largest write request.
const MAX_WRITE: u32 = 1 << 20;
const ROOT: u64 = 1;

/// A backing inode: (st_dev, st_ino).
type Key = (u64, u64);

/// The per-inode state of file contents.
#[derive(Default)]
pub(crate) struct FileState {
    /// The backing file, open while the kernel holds handles on the inode.
    fd: Option<Arc<File>>,
    fd_writable: bool,
    /// Handles the kernel holds (open/create minus release).
    opens: u64,
    /// Unsynced changes; `None` when the view is the backing file.
    overlay: Option<Overlay>,
    /// The last name is gone: the overlay lives only while handles remain.
    orphan: bool,
}

type FileRef = Arc<Mutex<FileState>>;

struct Node {
    key: Key,
    /// Where the node was last seen: parent inode and name (the root's are
    /// unused). Paths are built by walking parents, so renaming a
    /// directory does not touch its children.
    parent: u64,
    name: OsString,
    /// Kernel lookup count (entries replied minus forgets).
    lookups: u64,
    /// Its last name was removed (unlink, rmdir, replaced by rename).
    orphan: bool,
    is_reg: bool,
    file: FileRef,
}

struct Table {
    nodes: HashMap<u64, Node>,
    keys: HashMap<Key, u64>,
    next_ino: u64,
}

/// One entry of a directory snapshot.
struct Listed {
    ino: u64,
    kind: FileType,
    name: OsString,
}

/// State shared between the FUSE threads and the [`crate::PowerCut`] handle.
pub(crate) struct Shared {
    backing: PathBuf,
    table: Mutex<Table>,
    dirs: Mutex<HashMap<u64, Arc<Vec<Listed>>>>,
    next_fh: AtomicU64,
    /// Set by a cut or an unmount: every request fails with EIO from then on
    /// and nothing more reaches the backing directory.
    stopped: AtomicBool,
    /// Armed crash point, with how many matching operations it has seen.
    crash_point: Mutex<Option<(crate::CrashPoint, u64)>>,
    crashed: AtomicBool,
    fsyncs: AtomicU64,
    dir_fsyncs: AtomicU64,
    bytes_persisted: AtomicU64,
    bytes_dropped: AtomicU64,
}

fn err(e: io::Error) -> Errno {
    Errno::from(e)
}

fn file_type(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

fn time(sec: i64, nsec: i64) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec as u32)
    } else {
        UNIX_EPOCH - Duration::new(sec.unsigned_abs(), 0) + Duration::new(0, nsec as u32)
    }
}

fn to_attr(ino: u64, m: &Metadata, ov: Option<&Overlay>) -> FileAttr {
    let mut mtime = time(m.mtime(), m.mtime_nsec());
    let mut ctime = time(m.ctime(), m.ctime_nsec());
    let (size, blocks) = match ov {
        Some(o) => {
            if let Some(t) = o.mtime() {
                mtime = t;
                ctime = ctime.max(t);
            }
            (o.size(), o.size().div_ceil(512))
        }
        None => (m.size(), m.blocks()),
    };
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks,
        atime: time(m.atime(), m.atime_nsec()),
        mtime,
        ctime,
        crtime: UNIX_EPOCH,
        kind: file_type(m.mode()),
        perm: (m.mode() & 0o7777) as u16,
        nlink: m.nlink() as u32,
        uid: m.uid(),
        gid: m.gid(),
        rdev: m.rdev() as u32,
        blksize: 4096,
        flags: 0,
    }
}

fn timespec(t: Option<TimeOrNow>) -> libc::timespec {
    let (tv_sec, tv_nsec) = match t {
        None => (0, libc::UTIME_OMIT),
        Some(TimeOrNow::Now) => (0, libc::UTIME_NOW),
        Some(TimeOrNow::SpecificTime(t)) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => (
                d.as_secs() as libc::time_t,
                libc::c_long::from(d.subsec_nanos()),
            ),
            Err(e) => {
                let d = e.duration();
                let mut s = -(d.as_secs() as libc::time_t);
                let mut n = libc::c_long::from(d.subsec_nanos());
                if n > 0 {
                    s -= 1;
                    n = 1_000_000_000 - n;
                }
                (s, n)
            }
        },
    };
    libc::timespec { tv_sec, tv_nsec }
}

fn cpath(p: &Path) -> Result<std::ffi::CString, Errno> {
    std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)
}

fn check(rc: libc::c_int) -> Result<(), Errno> {
    if rc == 0 {
        Ok(())
    } else {
        Err(err(io::Error::last_os_error()))
    }
}

/// Opens a backing file for reading and writing, or read-only if that is
/// all it allows; never with O_TRUNC (truncation is volatile).
fn open_backing(path: &Path) -> io::Result<(File, bool)> {
    match OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => Ok((f, true)),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EACCES | libc::EROFS | libc::ETXTBSY)
            ) =>
        {
            Ok((File::open(path)?, false))
        }
        Err(e) => Err(e),
    }
}

impl Shared {
    pub(crate) fn new(backing: PathBuf) -> io::Result<Shared> {
        let m = fs::metadata(&backing)?;
        if !m.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{} is not a directory", backing.display()),
            ));
        }
        let key = (m.dev(), m.ino());
        let mut nodes = HashMap::new();
        nodes.insert(
            ROOT,
            Node {
                key,
                parent: ROOT,
                name: OsString::new(),
                lookups: 1,
                orphan: false,
                is_reg: false,
                file: FileRef::default(),
            },
        );
        Ok(Shared {
            backing,
            table: Mutex::new(Table {
                nodes,
                keys: HashMap::from([(key, ROOT)]),
                next_ino: ROOT + 1,
            }),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            stopped: AtomicBool::new(false),
            crash_point: Mutex::new(None),
            crashed: AtomicBool::new(false),
            fsyncs: AtomicU64::new(0),
            dir_fsyncs: AtomicU64::new(0),
            bytes_persisted: AtomicU64::new(0),
            bytes_dropped: AtomicU64::new(0),
        })
    }

    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    fn all_files(&self) -> Vec<FileRef> {
        self.table
            .lock()
            .nodes
            .values()
            .map(|n| n.file.clone())
            .collect()
    }

    /// The counters, and the dirty bytes held right now.
    pub(crate) fn stats(&self) -> Stats {
        let dirty_bytes = self
            .all_files()
            .iter()
            .map(|f| f.lock().overlay.as_ref().map_or(0, Overlay::dirty_bytes))
            .sum();
        Stats {
            fsyncs: self.fsyncs.load(Ordering::Relaxed),
            dir_fsyncs: self.dir_fsyncs.load(Ordering::Relaxed),
            bytes_persisted: self.bytes_persisted.load(Ordering::Relaxed),
            dirty_bytes,
            bytes_dropped_at_cut: self.bytes_dropped.load(Ordering::Relaxed),
        }
    }

    /// Arms a crash point (replacing any armed one).
    pub(crate) fn arm(&self, p: crate::CrashPoint) {
        *self.crash_point.lock() = Some((p, 0));
    }

    /// Whether an armed crash point fired.
    pub(crate) fn crashed(&self) -> bool {
        self.crashed.load(Ordering::SeqCst)
    }

    /// Called after an operation reached BACKING: if it is the armed crash
    /// point, the power goes now (before the reply). Returns whether it did.
    /// `path` is asked for only while a crash point is armed.
    fn crash_if(&self, unlink: bool, path: impl FnOnce() -> Option<PathBuf>) -> bool {
        let mut g = self.crash_point.lock();
        if g.is_none() {
            return false;
        }
        let Some(path) = path() else { return false };
        let rel = path.strip_prefix(&self.backing).unwrap_or(&path);
        let fire = {
            let hit = match g.as_ref() {
                Some((crate::CrashPoint::AfterUnlink { prefix, .. }, _)) => unlink && rel.starts_with(prefix),
                Some((crate::CrashPoint::AfterFsync { suffix, .. }, _)) => !unlink && rel.as_os_str().as_bytes().ends_with(suffix.as_bytes()),
                None => false,
            };
            match g.as_mut() {
                Some((p, seen)) if hit => {
                    *seen += 1;
                    let nth = match p {
                        crate::CrashPoint::AfterUnlink { nth, .. } | crate::CrashPoint::AfterFsync { nth, .. } => *nth,
                    };
                    if *seen >= nth.max(1) {
                        *g = None;
                        true
                    } else {
                        false
                    }
                }
                _ => false,
            }
        };
        drop(g);
        if fire {
            info!("crash point reached after {} of {}", if unlink { "unlink" } else { "fsync" }, rel.display());
            self.crashed.store(true, Ordering::SeqCst);
            self.cut();
        }
        fire
    }

    /// The power cut: no request touches the backing directory any more,
    /// and every overlay is discarded. Returns the dirty bytes dropped.
    pub(crate) fn cut(&self) -> u64 {
        self.stopped.store(true, Ordering::SeqCst);
        let mut dropped = 0;
        for f in self.all_files() {
            // Waits for an fsync in progress on this file: it finished
            // before the power went.
            let mut st = f.lock();
            if let Some(o) = st.overlay.take() {
                dropped += o.dirty_bytes();
            }
            st.fd = None;
        }
        self.bytes_dropped.fetch_add(dropped, Ordering::Relaxed);
        dropped
    }

    /// Persists every dirty file (as an fsync of each would), then stops
    /// serving. Returns the first error, after trying every file.
    pub(crate) fn persist_all_and_stop(&self) -> io::Result<()> {
        let mut first_err = None;
        let files = {
            let t = self.table.lock();
            t.nodes
                .iter()
                .filter(|(_, n)| n.is_reg)
                .map(|(&ino, n)| (ino, n.file.clone()))
                .collect::<Vec<_>>()
        };
        for (ino, f) in files {
            let mut st = f.lock();
            if st.overlay.is_none() {
                continue;
            }
            if let Err(e) = self.persist_locked(ino, &mut st, false) {
                warn!(ino, "persisting at unmount failed: {e:?}");
                first_err.get_or_insert(io::Error::from_raw_os_error(e.code()));
            }
        }
        self.stopped.store(true, Ordering::SeqCst);
        // Anything written between the persist and the stop is dropped.
        self.cut();
        first_err.map_or(Ok(()), Err)
    }

    // -----------------------------------------------------------------
    // The inode table

    fn path_locked(&self, t: &Table, ino: u64) -> Result<PathBuf, Errno> {
        let mut names = Vec::new();
        let mut cur = ino;
        while cur != ROOT {
            let n = t.nodes.get(&cur).ok_or(Errno::ENOENT)?;
            if n.orphan {
                return Err(Errno::ENOENT);
            }
            names.push(n.name.clone());
            cur = n.parent;
            if names.len() > 4096 {
                return Err(Errno::ELOOP);
            }
        }
        let mut p = self.backing.clone();
        for name in names.iter().rev() {
            p.push(name);
        }
        Ok(p)
    }

    fn path(&self, ino: u64) -> Result<PathBuf, Errno> {
        self.path_locked(&self.table.lock(), ino)
    }

    fn child_path(&self, parent: u64, name: &OsStr) -> Result<PathBuf, Errno> {
        if name.as_bytes().contains(&b'/') || name.is_empty() {
            return Err(Errno::EINVAL);
        }
        Ok(self.path(parent)?.join(name))
    }

    /// The node's path (None for an orphan), file state and kind.
    fn node(&self, ino: u64) -> Result<(Option<PathBuf>, FileRef, bool), Errno> {
        let t = self.table.lock();
        let n = t.nodes.get(&ino).ok_or(Errno::ENOENT)?;
        let (file, is_reg, orphan) = (n.file.clone(), n.is_reg, n.orphan);
        let path = if orphan {
            None
        } else {
            Some(self.path_locked(&t, ino)?)
        };
        Ok((path, file, is_reg))
    }

    /// Finds or makes the node for a backing inode seen at `parent/name`,
    /// records that name, and adds `lookups` kernel references.
    fn remember(&self, parent: u64, name: &OsStr, m: &Metadata, lookups: u64) -> (u64, FileRef) {
        let key = (m.dev(), m.ino());
        let mut t = self.table.lock();
        if let Some(&ino) = t.keys.get(&key) {
            if let Some(n) = t.nodes.get_mut(&ino) {
                if ino != ROOT {
                    n.parent = parent;
                    n.name = name.to_os_string();
                }
                n.lookups += lookups;
                return (ino, n.file.clone());
            }
        }
        let ino = t.next_ino;
        t.next_ino += 1;
        let file = FileRef::default();
        t.nodes.insert(
            ino,
            Node {
                key,
                parent,
                name: name.to_os_string(),
                lookups,
                orphan: false,
                is_reg: m.file_type().is_file(),
                file: file.clone(),
            },
        );
        t.keys.insert(key, ino);
        (ino, file)
    }

    /// The backing inode `key` lost its last name.
    fn orphan_key(&self, key: Key) {
        let (ino, file) = {
            let mut t = self.table.lock();
            let Some(ino) = t.keys.remove(&key) else {
                return;
            };
            let Some(n) = t.nodes.get_mut(&ino) else {
                return;
            };
            n.orphan = true;
            (ino, n.file.clone())
        };
        {
            let mut st = file.lock();
            st.orphan = true;
            if st.opens == 0 {
                st.overlay = None;
                st.fd = None;
            }
        }
        self.maybe_remove(ino);
    }

    /// Drops a node the kernel no longer references, if it holds nothing:
    /// an orphan, or a clean file without handles.
    fn maybe_remove(&self, ino: u64) {
        if ino == ROOT {
            return;
        }
        let file = {
            let t = self.table.lock();
            match t.nodes.get(&ino) {
                Some(n) if n.lookups == 0 => n.file.clone(),
                _ => return,
            }
        };
        let st = file.lock();
        let idle = st.opens == 0 && (st.orphan || st.overlay.is_none());
        if !idle {
            return;
        }
        let mut t = self.table.lock();
        let Some(n) = t.nodes.get(&ino) else { return };
        if n.lookups != 0 {
            return;
        }
        let key = n.key;
        t.nodes.remove(&ino);
        if t.keys.get(&key) == Some(&ino) {
            t.keys.remove(&key);
        }
    }

    // -----------------------------------------------------------------
    // Attributes

    /// Attributes of a regular file under its lock: the backing file's,
    /// with the overlay's size and mtime.
    fn file_attr_locked(
        &self,
        ino: u64,
        path: Option<&Path>,
        st: &FileState,
    ) -> Result<FileAttr, Errno> {
        let m = match (&st.fd, path) {
            (Some(fd), _) => fd.metadata(),
            (None, Some(p)) => fs::symlink_metadata(p),
            (None, None) => return Err(Errno::ENOENT),
        }
        .map_err(err)?;
        Ok(to_attr(ino, &m, st.overlay.as_ref()))
    }

    fn attr(&self, ino: u64) -> Result<FileAttr, Errno> {
        let (path, file, is_reg) = self.node(ino)?;
        if is_reg {
            let st = file.lock();
            self.file_attr_locked(ino, path.as_deref(), &st)
        } else {
            let p = path.ok_or(Errno::ENOENT)?;
            let m = fs::symlink_metadata(p).map_err(err)?;
            Ok(to_attr(ino, &m, None))
        }
    }

    /// Entry reply data for a freshly remembered node.
    fn entry_attr(
        &self,
        ino: u64,
        file: &FileRef,
        path: &Path,
        m: &Metadata,
    ) -> Result<FileAttr, Errno> {
        if m.file_type().is_file() {
            let st = file.lock();
            self.file_attr_locked(ino, Some(path), &st)
        } else {
            Ok(to_attr(ino, m, None))
        }
    }

    /// Makes a new entry's owner the caller's, as a kernel file system would.
    fn chown_to_caller(path: &Path, req: &Request) {
        // SAFETY: geteuid/getegid have no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        if req.uid() != uid || req.gid() != gid {
            if let Err(e) = std::os::unix::fs::lchown(path, Some(req.uid()), Some(req.gid())) {
                debug!("chown {}: {e}", path.display());
            }
        }
    }

    // -----------------------------------------------------------------
    // File contents

    /// The backing descriptor of a file (opened if needed; kept while the
    /// kernel holds handles).
    fn fd_locked(&self, path: Option<&Path>, st: &mut FileState) -> Result<Arc<File>, Errno> {
        if let Some(fd) = &st.fd {
            return Ok(fd.clone());
        }
        let p = path.ok_or(Errno::ENOENT)?;
        let (f, w) = open_backing(p).map_err(err)?;
        let f = Arc::new(f);
        if st.opens > 0 {
            st.fd = Some(f.clone());
            st.fd_writable = w;
        }
        Ok(f)
    }

    fn overlay_locked<'a>(
        &self,
        path: Option<&Path>,
        st: &'a mut FileState,
    ) -> Result<&'a mut Overlay, Errno> {
        if st.overlay.is_none() {
            let len = match (&st.fd, path) {
                (Some(fd), _) => fd.metadata(),
                (None, Some(p)) => fs::metadata(p),
                (None, None) => return Err(Errno::ENOENT),
            }
            .map_err(err)?
            .len();
            st.overlay = Some(Overlay::new(len));
        }
        Ok(st.overlay.as_mut().expect("set above"))
    }

    fn truncate_locked(
        &self,
        path: Option<&Path>,
        st: &mut FileState,
        size: u64,
    ) -> Result<(), Errno> {
        let o = self.overlay_locked(path, st)?;
        o.truncate(size);
        Ok(())
    }

    /// Writes the overlay into the backing file and syncs it; the overlay is
    /// dropped only once the sync succeeded.
    fn persist_locked(&self, ino: u64, st: &mut FileState, datasync: bool) -> Result<(), Errno> {
        let path = if st.orphan { None } else { self.path(ino).ok() };
        // A descriptor that can write.
        let fd = match &st.fd {
            Some(fd) if st.fd_writable => fd.clone(),
            _ => {
                let p = path.as_deref().ok_or(Errno::ENOENT)?;
                Arc::new(OpenOptions::new().write(true).open(p).map_err(err)?)
            }
        };
        let mut written = 0;
        if let Some(o) = &st.overlay {
            written = o.persist(&fd).map_err(err)?;
        }
        if datasync {
            fd.sync_data()
        } else {
            fd.sync_all()
        }
        .map_err(err)?;
        st.overlay = None;
        self.bytes_persisted.fetch_add(written, Ordering::Relaxed);
        debug!(ino, written, "persisted");
        Ok(())
    }

    // -----------------------------------------------------------------
    // Directories

    fn listing(&self, ino: u64) -> Result<Arc<Vec<Listed>>, Errno> {
        let path = self.path(ino)?;
        let dm = fs::metadata(&path).map_err(err)?;
        let parent = {
            let t = self.table.lock();
            t.nodes
                .get(&ino)
                .map_or(ROOT, |n| if ino == ROOT { ROOT } else { n.parent })
        };
        let mut out = vec![
            Listed {
                ino,
                kind: FileType::Directory,
                name: ".".into(),
            },
            Listed {
                ino: parent,
                kind: FileType::Directory,
                name: "..".into(),
            },
        ];
        for e in fs::read_dir(&path).map_err(err)? {
            let e = e.map_err(err)?;
            let Ok(ft) = e.file_type() else { continue };
            let kind = if ft.is_dir() {
                FileType::Directory
            } else if ft.is_symlink() {
                FileType::Symlink
            } else if ft.is_file() {
                FileType::RegularFile
            } else {
                FileType::from_std(ft).unwrap_or(FileType::RegularFile)
            };
            let name = e.file_name();
            let key = (dm.dev(), std::os::unix::fs::DirEntryExt::ino(&e));
            // Report the FUSE inode number the entry has or will have.
            let child = {
                let mut t = self.table.lock();
                match t.keys.get(&key) {
                    Some(&i) => i,
                    None => {
                        let i = t.next_ino;
                        t.next_ino += 1;
                        t.nodes.insert(
                            i,
                            Node {
                                key,
                                parent: ino,
                                name: name.clone(),
                                lookups: 0,
                                orphan: false,
                                is_reg: kind == FileType::RegularFile,
                                file: FileRef::default(),
                            },
                        );
                        t.keys.insert(key, i);
                        i
                    }
                }
            };
            out.push(Listed {
                ino: child,
                kind,
                name,
            });
        }
        Ok(Arc::new(out))
    }
}

/// The file system served to the kernel.
pub(crate) struct PowerCutFs {
    pub(crate) s: Arc<Shared>,
}

macro_rules! live {
    ($self:ident, $reply:ident) => {
        if $self.s.stopped() {
            return $reply.error(Errno::EIO);
        }
    };
}

macro_rules! tri {
    ($e:expr, $reply:ident) => {
        match $e {
            Ok(v) => v,
            Err(e) => return $reply.error(e),
        }
    };
}

impl PowerCutFs {
    fn new_fh(&self) -> FileHandle {
        FileHandle(self.s.next_fh.fetch_add(1, Ordering::Relaxed))
    }

    /// Common tail of mkdir/mknod/symlink/link: stat the new entry,
    /// remember it, reply.
    fn reply_new_entry(&self, parent: u64, name: &OsStr, path: &Path, reply: ReplyEntry) {
        let m = tri!(fs::symlink_metadata(path).map_err(err), reply);
        let (ino, file) = self.s.remember(parent, name, &m, 1);
        match self.s.entry_attr(ino, &file, path, &m) {
            Ok(a) => reply.entry(&TTL, &a, GENERATION),
            Err(e) => reply.error(e),
        }
    }
}

/// Locks: no getlk/setlk/flock handlers, and neither `FUSE_POSIX_LOCKS` nor
/// `FUSE_FLOCK_LOCKS` is requested at init (fuser 0.18 requests only
/// `ASYNC_READ`, `BIG_WRITES` and `MAX_PAGES` by default), so the kernel
/// serves fcntl and flock locks locally.
impl Filesystem for PowerCutFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        if let Err(nearest) = config.set_max_write(MAX_WRITE) {
            let _ = config.set_max_write(nearest);
        }
        info!(abi = %config.kernel_abi(), "cairn-powercut session initialised");
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        live!(self, reply);
        if name == ".." || name == "." {
            let ino = if name == "." {
                parent.0
            } else {
                let t = self.s.table.lock();
                t.nodes.get(&parent.0).map_or(ROOT, |n| n.parent)
            };
            let path = tri!(self.s.path(ino), reply);
            return self.reply_new_entry_dot(ino, &path, reply);
        }
        let path = tri!(self.s.child_path(parent.0, name), reply);
        self.reply_new_entry(parent.0, name, &path, reply);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        {
            let mut t = self.s.table.lock();
            let Some(n) = t.nodes.get_mut(&ino.0) else {
                return;
            };
            n.lookups = n.lookups.saturating_sub(nlookup);
            if n.lookups != 0 {
                return;
            }
        }
        self.s.maybe_remove(ino.0);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        live!(self, reply);
        match self.s.attr(ino.0) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        live!(self, reply);
        let (path, file, is_reg) = tri!(self.s.node(ino.0), reply);
        let mut st = file.lock();
        if let Some(size) = size {
            if !is_reg {
                return reply.error(Errno::EISDIR);
            }
            tri!(
                self.s.truncate_locked(path.as_deref(), &mut st, size),
                reply
            );
        }
        // Metadata goes to the backing file at once: by path, or through
        // the descriptor of an open orphan.
        let fd = if path.is_none() { st.fd.clone() } else { None };
        if path.is_none() && fd.is_none() {
            return reply.error(Errno::ENOENT);
        }
        let cp = match &path {
            Some(p) => Some(tri!(cpath(p), reply)),
            None => None,
        };
        if let Some(mode) = mode {
            let mode = mode & 0o7777;
            // SAFETY: valid C string / descriptor.
            let rc = match (&cp, &fd) {
                (Some(c), _) => unsafe { libc::fchmodat(libc::AT_FDCWD, c.as_ptr(), mode, 0) },
                (None, Some(f)) => unsafe { libc::fchmod(f.as_raw_fd(), mode) },
                _ => unreachable!(),
            };
            tri!(check(rc), reply);
        }
        if uid.is_some() || gid.is_some() {
            let u = uid.unwrap_or(u32::MAX);
            let g = gid.unwrap_or(u32::MAX);
            // SAFETY: as above; -1 leaves an id unchanged.
            let rc = match (&cp, &fd) {
                (Some(c), _) => unsafe { libc::lchown(c.as_ptr(), u, g) },
                (None, Some(f)) => unsafe { libc::fchown(f.as_raw_fd(), u, g) },
                _ => unreachable!(),
            };
            tri!(check(rc), reply);
        }
        if atime.is_some() || mtime.is_some() {
            let ts = [timespec(atime), timespec(mtime)];
            // SAFETY: as above; `ts` holds two timespecs.
            let rc = match (&cp, &fd) {
                (Some(c), _) => unsafe {
                    libc::utimensat(
                        libc::AT_FDCWD,
                        c.as_ptr(),
                        ts.as_ptr(),
                        libc::AT_SYMLINK_NOFOLLOW,
                    )
                },
                (None, Some(f)) => unsafe { libc::futimens(f.as_raw_fd(), ts.as_ptr()) },
                _ => unreachable!(),
            };
            tri!(check(rc), reply);
            if mtime.is_some() {
                if let Some(o) = st.overlay.as_mut() {
                    o.clear_mtime();
                }
            }
        }
        let attr = if is_reg {
            self.s.file_attr_locked(ino.0, path.as_deref(), &st)
        } else {
            drop(st);
            self.s.attr(ino.0)
        };
        match attr {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        live!(self, reply);
        let path = tri!(self.s.path(ino.0), reply);
        match fs::read_link(path) {
            Ok(t) => reply.data(t.as_os_str().as_bytes()),
            Err(e) => reply.error(err(e)),
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
        live!(self, reply);
        let path = tri!(self.s.child_path(parent.0, name), reply);
        let perm = mode & !umask & 0o7777;
        if mode & libc::S_IFMT == libc::S_IFREG || mode & libc::S_IFMT == 0 {
            let f = tri!(
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(perm)
                    .open(&path)
                    .map_err(err),
                reply
            );
            let _ = f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(perm));
        } else {
            let c = tri!(cpath(&path), reply);
            // SAFETY: valid C string.
            tri!(
                check(unsafe {
                    libc::mknod(
                        c.as_ptr(),
                        (mode & libc::S_IFMT) | perm,
                        libc::dev_t::from(rdev),
                    )
                }),
                reply
            );
            // SAFETY: as above.
            let _ = unsafe { libc::chmod(c.as_ptr(), perm) };
        }
        Shared::chown_to_caller(&path, req);
        self.reply_new_entry(parent.0, name, &path, reply);
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
        live!(self, reply);
        let path = tri!(self.s.child_path(parent.0, name), reply);
        let perm = mode & !umask & 0o7777;
        tri!(
            fs::DirBuilder::new().mode(perm).create(&path).map_err(err),
            reply
        );
        let _ = fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(perm));
        Shared::chown_to_caller(&path, req);
        self.reply_new_entry(parent.0, name, &path, reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        live!(self, reply);
        let path = tri!(self.s.child_path(parent.0, name), reply);
        let m = tri!(fs::symlink_metadata(&path).map_err(err), reply);
        tri!(fs::remove_file(&path).map_err(err), reply);
        if m.nlink() <= 1 {
            self.s.orphan_key((m.dev(), m.ino()));
        }
        if self.s.crash_if(true, || Some(path.clone())) {
            return reply.error(Errno::EIO);
        }
        reply.ok();
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        live!(self, reply);
        let path = tri!(self.s.child_path(parent.0, name), reply);
        let m = tri!(fs::symlink_metadata(&path).map_err(err), reply);
        tri!(fs::remove_dir(&path).map_err(err), reply);
        self.s.orphan_key((m.dev(), m.ino()));
        reply.ok();
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        live!(self, reply);
        let path = tri!(self.s.child_path(parent.0, link_name), reply);
        tri!(
            std::os::unix::fs::symlink(target, &path).map_err(err),
            reply
        );
        Shared::chown_to_caller(&path, req);
        self.reply_new_entry(parent.0, link_name, &path, reply);
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
        live!(self, reply);
        let known = RenameFlags::RENAME_NOREPLACE | RenameFlags::RENAME_EXCHANGE;
        if !known.contains(flags) || flags == known {
            return reply.error(Errno::EINVAL);
        }
        let from = tri!(self.s.child_path(parent.0, name), reply);
        let to = tri!(self.s.child_path(newparent.0, newname), reply);
        let src = tri!(fs::symlink_metadata(&from).map_err(err), reply);
        let dst = fs::symlink_metadata(&to).ok();
        let (cf, ct) = (tri!(cpath(&from), reply), tri!(cpath(&to), reply));
        // SAFETY: valid C strings.
        let rc = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                cf.as_ptr(),
                libc::AT_FDCWD,
                ct.as_ptr(),
                flags.bits(),
            )
        };
        tri!(check(rc), reply);
        let skey = (src.dev(), src.ino());
        let dkey = dst.as_ref().map(|d| (d.dev(), d.ino()));
        let mut replaced = None;
        {
            let mut t = self.s.table.lock();
            if let Some(n) = t.keys.get(&skey).copied().and_then(|i| t.nodes.get_mut(&i)) {
                n.parent = newparent.0;
                n.name = newname.to_os_string();
            }
            if let (Some(dkey), Some(d)) = (dkey, &dst) {
                if dkey != skey {
                    if flags.contains(RenameFlags::RENAME_EXCHANGE) {
                        if let Some(n) =
                            t.keys.get(&dkey).copied().and_then(|i| t.nodes.get_mut(&i))
                        {
                            n.parent = parent.0;
                            n.name = name.to_os_string();
                        }
                    } else if d.is_dir() || d.nlink() <= 1 {
                        replaced = Some(dkey);
                    }
                }
            }
        }
        if let Some(k) = replaced {
            self.s.orphan_key(k);
        }
        reply.ok();
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        live!(self, reply);
        let from = tri!(self.s.path(ino.0), reply);
        let to = tri!(self.s.child_path(newparent.0, newname), reply);
        tri!(fs::hard_link(&from, &to).map_err(err), reply);
        self.reply_new_entry(newparent.0, newname, &to, reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        live!(self, reply);
        let (path, file, is_reg) = tri!(self.s.node(ino.0), reply);
        let mut st = file.lock();
        if is_reg {
            if st.fd.is_none() {
                let p = tri!(path.as_deref().ok_or(Errno::ENOENT), reply);
                let (f, w) = tri!(open_backing(p).map_err(err), reply);
                st.fd = Some(Arc::new(f));
                st.fd_writable = w;
            }
            if flags.0 & libc::O_TRUNC != 0 && flags.0 & libc::O_ACCMODE != libc::O_RDONLY {
                tri!(self.s.truncate_locked(path.as_deref(), &mut st, 0), reply);
            }
        }
        st.opens += 1;
        reply.opened(self.new_fh(), FopenFlags::FOPEN_KEEP_CACHE);
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
        live!(self, reply);
        let (path, file, _) = tri!(self.s.node(ino.0), reply);
        let mut st = file.lock();
        let fd = tri!(self.s.fd_locked(path.as_deref(), &mut st), reply);
        let data = match &st.overlay {
            Some(o) => o.read(&fd, offset, size),
            None => {
                let mut buf = vec![0u8; size as usize];
                read_full_at(&fd, &mut buf, offset).map(|n| {
                    buf.truncate(n);
                    buf
                })
            }
        };
        match data {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(err(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        live!(self, reply);
        let (path, file, _) = tri!(self.s.node(ino.0), reply);
        let mut st = file.lock();
        let fd = tri!(self.s.fd_locked(path.as_deref(), &mut st), reply);
        let o = tri!(self.s.overlay_locked(path.as_deref(), &mut st), reply);
        match o.write(&fd, offset, data) {
            Ok(_) => reply.written(data.len() as u32),
            Err(e) => reply.error(err(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) persists nothing.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let file = {
            let t = self.s.table.lock();
            t.nodes.get(&ino.0).map(|n| n.file.clone())
        };
        if let Some(file) = file {
            let mut st = file.lock();
            st.opens = st.opens.saturating_sub(1);
            if st.opens == 0 {
                st.fd = None;
                if st.orphan {
                    st.overlay = None;
                }
            }
        }
        self.s.maybe_remove(ino.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        live!(self, reply);
        let (_, file, is_reg) = tri!(self.s.node(ino.0), reply);
        if !is_reg {
            return reply.ok();
        }
        let mut st = file.lock();
        // The cut may have come while we waited for the lock.
        live!(self, reply);
        tri!(self.s.persist_locked(ino.0, &mut st, datasync), reply);
        self.s.fsyncs.fetch_add(1, Ordering::Relaxed);
        drop(st);
        if self.s.crash_if(false, || self.s.path(ino.0).ok()) {
            return reply.error(Errno::EIO);
        }
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        live!(self, reply);
        let listing = tri!(self.s.listing(ino.0), reply);
        let fh = self.new_fh();
        self.s.dirs.lock().insert(fh.0, listing);
        reply.opened(fh, FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        live!(self, reply);
        let cached = self.s.dirs.lock().get(&fh.0).cloned();
        let listing = match cached {
            Some(l) => l,
            None => tri!(self.s.listing(ino.0), reply),
        };
        for (i, e) in listing.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(e.ino), (i + 1) as u64, e.kind, &e.name) {
                break;
            }
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
        self.s.dirs.lock().remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        live!(self, reply);
        let path = tri!(self.s.path(ino.0), reply);
        tri!(
            File::open(path).and_then(|d| d.sync_all()).map_err(err),
            reply
        );
        self.s.dir_fsyncs.fetch_add(1, Ordering::Relaxed);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        live!(self, reply);
        let c = tri!(cpath(&self.s.backing), reply);
        // SAFETY: zeroed statvfs is a valid out-parameter.
        let mut v: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: valid C string and out-pointer.
        tri!(check(unsafe { libc::statvfs(c.as_ptr(), &mut v) }), reply);
        reply.statfs(
            v.f_blocks,
            v.f_bfree,
            v.f_bavail,
            v.f_files,
            v.f_ffree,
            v.f_bsize as u32,
            v.f_namemax as u32,
            v.f_frsize as u32,
        );
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        live!(self, reply);
        // default_permissions: the kernel checks modes; the inode must exist.
        match self.s.attr(ino.0) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    // Extended attributes are not supported; ENOSYS (instead of fuser's
    // default, which logs a warning each time) makes the kernel stop asking
    // (it asks for `security.capability` before writes).
    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: fuser::ReplyXattr,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: fuser::ReplyXattr) {
        reply.error(Errno::ENOSYS);
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
        reply.error(Errno::ENOSYS);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::ENOSYS);
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
        live!(self, reply);
        let path = tri!(self.s.child_path(parent.0, name), reply);
        let perm = mode & !umask & 0o7777;
        // The name goes to the backing directory at once; O_TRUNC never
        // reaches the backing file.
        let (f, created) = match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(perm)
            .open(&path)
        {
            Ok(f) => (f, true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && flags & libc::O_EXCL == 0 => (
                tri!(
                    OpenOptions::new()
                        .read(true)
                        .write(true)
                        .open(&path)
                        .map_err(err),
                    reply
                ),
                false,
            ),
            Err(e) => return reply.error(err(e)),
        };
        if created {
            let _ = f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(perm));
            Shared::chown_to_caller(&path, req);
        }
        let m = tri!(f.metadata().map_err(err), reply);
        if !m.is_file() {
            return reply.error(Errno::EISDIR);
        }
        let (ino, file) = self.s.remember(parent.0, name, &m, 1);
        let mut st = file.lock();
        if st.fd.is_none() {
            st.fd = Some(Arc::new(f));
            st.fd_writable = true;
        }
        st.opens += 1;
        if !created && flags & libc::O_TRUNC != 0 {
            tri!(self.s.truncate_locked(Some(&path), &mut st, 0), reply);
        }
        let attr = tri!(self.s.file_attr_locked(ino, Some(&path), &st), reply);
        reply.created(
            &TTL,
            &attr,
            GENERATION,
            self.new_fh(),
            FopenFlags::FOPEN_KEEP_CACHE,
        );
    }
}

impl PowerCutFs {
    /// Entry for "." or ".." (only asked for by NFS-style exports).
    fn reply_new_entry_dot(&self, ino: u64, path: &Path, reply: ReplyEntry) {
        let m = tri!(fs::symlink_metadata(path).map_err(err), reply);
        {
            let mut t = self.s.table.lock();
            if let Some(n) = t.nodes.get_mut(&ino) {
                n.lookups += 1;
            }
        }
        reply.entry(&TTL, &to_attr(ino, &m, None), GENERATION);
    }
}
