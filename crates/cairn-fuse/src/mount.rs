//! Mounting and unmounting a volume, on the scaffold every Cairn file
//! system shares (`cairn-mount`: mountpoint checks, session threads,
//! signals that unmount, unmounting).

use std::ffi::OsString;
use std::fs;
use std::io::{self, ErrorKind};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cairn_engine::Volume;
use cairn_mount::mounttable::{entries, mount_entry};
use cairn_mount::{absolute, detach_if_ours, fuse_connection_of, unmount_once, validate_mountpoint, SignalWatch};
use fuser::{MountOption, Session};
use tracing::{debug, error, info, warn};

use crate::fs::CairnFs;

/// How to mount a volume.
#[derive(Clone, Debug)]
pub struct MountConfig {
    /// An existing, empty-or-not directory that is not already a mount point.
    pub mountpoint: PathBuf,
    /// Mount read-only (also forced when the volume itself is read-only).
    pub read_only: bool,
    /// Let users other than the mounting one in (`allow_other`); permissions
    /// are then checked by the kernel against the file modes.
    pub allow_other: bool,
    /// Threads serving requests that may wait (at least 1): with
    /// `io_workers`, reads of chunks not in memory and fsyncs, while one
    /// thread takes every request from the kernel and serves the others;
    /// without, the threads that take requests from the kernel.
    pub threads: usize,
    /// One thread reading requests and `threads` workers for the requests
    /// that may wait (not on a volume other machines share, where every
    /// metadata request is a round trip to the metadata server).
    pub io_workers: bool,
    /// The "source" shown by `mount`/`df` (the fsname option).
    pub fsname: String,
    /// Let the kernel cache writes and send them in large requests (see
    /// `fs::wanted_capabilities`).
    pub writeback_cache: bool,
    /// Serve requests over io_uring where the kernel offers it (see
    /// `cairn_mount::serve_over_io_uring`).
    pub fuse_uring: bool,
    /// `close(2)` of a file opened for writing returns once the file is as
    /// durable as `fsync` makes it (on a tape: on the tape).
    pub fsync_on_close: bool,
}

impl MountConfig {
    /// Defaults: read-write, owner only, 4 threads, fsname "cairn", the
    /// kernel's writeback cache on.
    pub fn new(mountpoint: impl Into<PathBuf>) -> Self {
        MountConfig {
            mountpoint: mountpoint.into(),
            read_only: false,
            allow_other: false,
            threads: 4,
            io_workers: true,
            fsname: "cairn".to_string(),
            writeback_cache: true,
            fuse_uring: false,
            fsync_on_close: false,
        }
    }
}

/// Largest read request, matching the 1 MiB `max_write` asked for at init.
const MAX_READ: u32 = 1 << 20;

/// Mounts `vol` at `cfg.mountpoint` and serves it until it is unmounted.
///
/// `on_ready` runs once the kernel mount exists and the serving threads are
/// started (a daemonising parent can exit then). SIGTERM, SIGINT and SIGHUP
/// unmount cleanly: if the mount is busy it is detached lazily and the
/// volume is closed when the last open file goes; a second signal aborts
/// the FUSE connection at once (open files then see ENOTCONN).
///
/// The volume is closed (`Volume::close`, through the session's `destroy`)
/// exactly when a session was established; if this fails before that (bad
/// mountpoint, mount refused), the volume is left open for the caller.
pub fn mount(vol: Arc<Volume>, cfg: &MountConfig, on_ready: impl FnOnce()) -> io::Result<()> {
    let mountpoint = validate_mountpoint(&cfg.mountpoint)?;
    let read_only = cfg.read_only || vol.is_read_only();
    if read_only && !cfg.read_only {
        info!("the volume is read-only: mounting read-only");
    }
    let threads = cfg.threads.max(1);
    // One reader hands reads and fsyncs to `threads` workers: 20,000
    // creates 15% faster, untar 5%, dbench 5% with a fifth less CPU, than
    // `threads` readers contending (docs/profile.md, sixth round).
    let io_workers = cfg.io_workers && !vol.is_shared();
    let mut config = cairn_mount::session_config(if io_workers { 1 } else { threads }, cfg.allow_other);
    if cfg.fuse_uring {
        cairn_mount::serve_over_io_uring(&mut config, threads);
    }

    // Handlers go in before the mount so that no window exists in which a
    // SIGTERM kills the process with the volume mounted.
    let watch = SignalWatch::start(mountpoint.clone(), push_before_unmount)?;

    // As root we call mount(2) ourselves and give fuser only the /dev/fuse
    // descriptor. fuser's own mount object unmounts the *path* again when
    // the session ends, even after a lazy detach: by then another mount may
    // sit at that path, and it would be the one unmounted. Owning the mount
    // avoids that, and gives the "fuse.cairn" type in the mount table.
    // Unprivileged users go through fuser and fusermount3.
    // SAFETY: geteuid has no preconditions.
    let as_root = unsafe { libc::geteuid() } == 0;
    // On a shared volume: other machines' changes, followed from now on.
    let follower = match vol.follow_changes() {
        Ok(f) => f.map(Arc::new),
        Err(e) => {
            warn!("cannot follow other machines' changes ({e}): this mount sees them only after the kernel's cache TTL");
            None
        }
    };
    // Under the writeback cache the kernel trusts its own size of a regular
    // file over the daemon's: on a volume other machines write, a file one
    // of them grew or cut would keep this machine's old size (and reads
    // would stop there) until the inode left the kernel's cache.
    let writeback_cache = cfg.writeback_cache && !vol.is_shared();
    if cfg.writeback_cache && !writeback_cache {
        info!("other machines write this volume: mounting without the kernel's writeback cache");
    }
    let mut fs = CairnFs::new(vol.clone()).with_writeback_cache(writeback_cache).with_fsync_on_close(cfg.fsync_on_close && !read_only);
    if io_workers {
        fs = fs.with_offload(threads)?;
    }
    let (session, conn) = if as_root {
        let fd = mount_direct(&mountpoint, cfg, read_only)?;
        // Known from the mount table without touching the mount, which
        // would wait for a session that is not serving yet.
        let conn = fuse_connection_of(&mountpoint);
        match Session::from_fd(fs, fd, config.acl, config.clone()) {
            Ok(s) => (s, conn),
            Err(e) => {
                detach_if_ours(&mountpoint, conn);
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "cannot start the FUSE session on {}: {e}",
                        mountpoint.display()
                    ),
                ));
            }
        }
    } else {
        config.mount_options = vec![
            MountOption::FSName(cfg.fsname.clone()),
            MountOption::Subtype("cairn".to_string()),
            MountOption::DefaultPermissions,
            MountOption::CUSTOM(format!("max_read={MAX_READ}")),
            if read_only {
                MountOption::RO
            } else {
                MountOption::RW
            },
        ];
        let s = Session::new(fs, &mountpoint, &config).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot mount {}: {e}", mountpoint.display()),
            )
        })?;
        (s, fuse_connection_of(&mountpoint))
    };
    info!(
        mountpoint = %mountpoint.display(),
        read_only,
        threads,
        io_workers,
        clone_fd = config.clone_fd,
        "mounted"
    );
    if let (Some(w), Some(id)) = (&watch, conn) {
        w.set_connection(id);
    }
    let session_notifier = session.notifier();
    let kernel = Arc::new(KernelNotifier::new(session.notifier()));
    vol.set_kernel_cache(kernel);
    let bg = match session.spawn() {
        Ok(bg) => bg,
        Err(e) => {
            if as_root {
                detach_if_ours(&mountpoint, conn);
            }
            return Err(e);
        }
    };
    // The change notifier sends its own notices (its own copy of the
    // channel): it is a thread of its own, never a request handler, so it
    // needs no hand-off to the notice thread (`KernelNotifier`).
    let notifier = follower.and_then(|f| ChangeNotifier::start(f, session_notifier));
    if watch.as_ref().is_some_and(SignalWatch::signalled) {
        // A signal arrived while mounting: its unmount found nothing yet.
        info!("signal received during mount: unmounting");
        if let Err(e) = unmount_once(&mountpoint, false) {
            warn!("{e}");
        }
    } else {
        on_ready();
    }
    let res = bg.join();
    drop(notifier);
    if as_root {
        // The session can also end on an error with the mount still there.
        detach_if_ours(&mountpoint, conn);
    }
    drop(watch);
    match &res {
        Ok(()) => info!(mountpoint = %mountpoint.display(), "session ended"),
        Err(e) => error!(mountpoint = %mountpoint.display(), "session ended with an error: {e}"),
    }
    res
}

/// mount(2) of a FUSE file system on a fresh /dev/fuse descriptor (root
/// only), with the options fuser would pass.
fn mount_direct(mountpoint: &Path, cfg: &MountConfig, read_only: bool) -> io::Result<OwnedFd> {
    let mut options = format!("default_permissions,max_read={MAX_READ}");
    if cfg.allow_other {
        options.push_str(",allow_other");
    }
    cairn_mount::mounttable::mount_fuse(mountpoint, &cfg.fsname, "fuse.cairn", read_only, &options)
}

/// Makes the kernel send every byte it caches for the mount at `path` (the
/// writeback cache) to the daemon, and waits for them: `syncfs(2)` on the
/// mount. FUSE's `syncfs` writes back every dirty inode; it asks the daemon
/// for nothing more (no `SYNCFS` request), so it makes nothing durable by
/// itself. Control-socket requests that read files (clone, snapshot,
/// archive, sync) and unmounts go through here first.
pub fn push_cached_writes(path: &Path) -> io::Result<()> {
    let root = fs::File::open(path)?;
    // SAFETY: syncfs on a descriptor we own.
    if unsafe { libc::syncfs(root.as_raw_fd()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// [`push_cached_writes`] before an unmount, so that the last bytes reach
/// the daemon while it still serves every request, whatever the kernel
/// version does at unmount (6.18 writes a closed file's mapped pages back
/// at release; e2e `writeback::mapped_writes_survive_a_plain_umount` checks
/// plain umount(8)). Costs nothing when nothing is dirty. A dead mount
/// (ENOTCONN) has nothing to push.
fn push_before_unmount(path: &Path) {
    if let Err(e) = push_cached_writes(path) {
        debug!("syncfs {} before unmounting: {e}", path.display());
    }
}

/// Unmounts a Cairn (or any FUSE) mount: `fusermount3 -u`, or `umount(2)`
/// when fusermount3 is not installed, after [`push_cached_writes`]. A mount
/// whose daemon died ("transport endpoint is not connected") is unmounted
/// too.
///
/// Errors: the path is not a mount point, is not a FUSE mount (refused, so a
/// typo cannot unmount /home), or is busy (open files, a process inside).
pub fn unmount(mountpoint: &Path) -> io::Result<()> {
    let path = absolute(mountpoint)?;
    let entry = mount_entry(&path)?.ok_or_else(|| {
        io::Error::new(
            ErrorKind::InvalidInput,
            format!("{} is not mounted", path.display()),
        )
    })?;
    if !entry.fstype.starts_with("fuse") {
        return Err(io::Error::new(
            ErrorKind::InvalidInput,
            format!(
                "{} is not a FUSE mount (it is {}); refusing to unmount it",
                path.display(),
                entry.fstype
            ),
        ));
    }
    push_before_unmount(&path);
    unmount_once(&path, false)
}

// ---------------------------------------------------------------------------
// The mount table

/// What the mount table says about one mount point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    /// File system type, e.g. `fuse.cairn`.
    pub fstype: String,
    /// Mount source; a Cairn mount's is the volume as its user named it
    /// (the canonical volume directory, or `s3://BUCKET/PREFIX`).
    pub source: OsString,
}

/// The topmost mount at exactly `path` (absolute, canonical), read from
/// /proc/self/mountinfo without touching the path (works on dead FUSE mounts).
pub fn mount_at(path: &Path) -> io::Result<Option<MountInfo>> {
    Ok(mount_entry(path)?.map(|e| MountInfo { fstype: e.fstype, source: e.source }))
}

/// The innermost mount holding `path` (absolute, canonical): its mount
/// point and what the table says of it.
pub fn mount_containing(path: &Path) -> io::Result<Option<(PathBuf, MountInfo)>> {
    Ok(entries()?
        .into_iter()
        .filter(|e| path.starts_with(&e.mount_point))
        .max_by_key(|e| e.mount_point.components().count())
        .map(|e| (e.mount_point, MountInfo { fstype: e.fstype, source: e.source })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unmount_refuses_what_is_not_a_fuse_mount() {
        let e = unmount(Path::new("/")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(e.to_string().contains("not a FUSE mount"), "{e}");
        let dir = std::env::temp_dir();
        let e = unmount(&dir).unwrap_err();
        assert!(
            e.to_string().contains("not mounted") || e.to_string().contains("not a FUSE"),
            "{e}"
        );
    }
}


/// Drops what the kernel caches when the engine changes files outside a
/// kernel request (control-socket clones and snapshots, rpwrite ioctls).
///
/// Every notice goes out from a thread of its own: `inval_*` and `store`
/// wait for the kernel, which may wait for a request a handler is serving
/// (an ioctl's handler asking for its own inode would deadlock). The caller
/// waits for its notice at most [`NOTICE_WAIT`], so an answer that comes
/// back at once (the usual case) is in place when an ioctl returns, and a
/// kernel that blocks costs a bounded delay, never a hang.
struct KernelNotifier {
    jobs: parking_lot::Mutex<Option<std::sync::mpsc::Sender<(Notice, std::sync::mpsc::SyncSender<()>)>>>,
    thread: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// The longest a caller waits for its notice to reach the kernel.
const NOTICE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

enum Notice {
    Inode(cairn_engine::Ino),
    Entry(cairn_engine::Ino, Vec<u8>),
    Resized(cairn_engine::Ino, u64, Vec<u8>),
}

impl KernelNotifier {
    fn new(n: fuser::Notifier) -> KernelNotifier {
        let (tx, rx) = std::sync::mpsc::channel::<(Notice, std::sync::mpsc::SyncSender<()>)>();
        let thread = std::thread::Builder::new().name("cairn-kernel-notices".into()).spawn(move || {
            for (notice, done) in rx {
                Self::send(&n, notice);
                let _ = done.try_send(());
            }
        });
        match thread {
            Ok(t) => KernelNotifier { jobs: parking_lot::Mutex::new(Some(tx)), thread: parking_lot::Mutex::new(Some(t)) },
            Err(e) => {
                warn!("cannot start the kernel notice thread: {e}; changes made outside kernel requests are seen after the attribute timeout");
                KernelNotifier { jobs: parking_lot::Mutex::new(None), thread: parking_lot::Mutex::new(None) }
            }
        }
    }

    fn send(n: &fuser::Notifier, notice: Notice) {
        use std::os::unix::ffi::OsStrExt;
        // ENOENT: the kernel holds nothing for it, which is fine. The
        // message is made only for an error (the change notifier sends
        // thousands a second under a create or unlink load).
        let quiet = |what: &dyn Fn() -> String, r: io::Result<()>| {
            if let Err(e) = r {
                if e.raw_os_error() != Some(libc::ENOENT) {
                    debug!("{}: {e}", what());
                }
            }
        };
        match notice {
            // Offset 0, length 0: the attributes and every cached page.
            Notice::Inode(ino) => quiet(&|| format!("invalidating inode {ino}"), n.inval_inode(fuser::INodeNo(ino), 0, 0)),
            Notice::Entry(parent, name) => quiet(&|| format!("invalidating entry {}", String::from_utf8_lossy(&name)), n.inval_entry(fuser::INodeNo(parent), std::ffi::OsStr::from_bytes(&name))),
            Notice::Resized(ino, size, tail) => {
                quiet(&|| format!("invalidating inode {ino}"), n.inval_inode(fuser::INodeNo(ino), 0, 0));
                // The kernel takes a stored range past its size as the new
                // size (fuse_notify_store); a writeback cache ignores the
                // size in attributes.
                if !tail.is_empty() {
                    quiet(&|| format!("storing the end of inode {ino}"), n.store(fuser::INodeNo(ino), size - tail.len() as u64, &tail));
                }
            }
        }
    }

    /// Hands `notice` to the thread and waits for it, boundedly.
    fn notify(&self, notice: Notice) {
        let (done_tx, done_rx) = std::sync::mpsc::sync_channel(1);
        let sent = self.jobs.lock().as_ref().is_some_and(|tx| tx.send((notice, done_tx)).is_ok());
        if sent && done_rx.recv_timeout(NOTICE_WAIT).is_err() {
            debug!("a kernel notice is still under way after {NOTICE_WAIT:?}");
        }
    }
}

impl Drop for KernelNotifier {
    fn drop(&mut self) {
        drop(self.jobs.lock().take());
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

impl cairn_engine::KernelCache for KernelNotifier {
    fn inode_changed(&self, ino: cairn_engine::Ino) {
        self.notify(Notice::Inode(ino));
    }

    fn entry_changed(&self, parent: cairn_engine::Ino, name: &[u8]) {
        self.notify(Notice::Entry(parent, name.to_vec()));
    }

    fn size_changed(&self, ino: cairn_engine::Ino, size: u64, tail: &[u8]) {
        self.notify(Notice::Resized(ino, size, tail.to_vec()));
    }
}

/// How long the notifier thread waits for a notice at a time: the most it
/// adds to an unmount.
const NOTIFIER_SLICE: std::time::Duration = std::time::Duration::from_millis(100);

/// On a shared volume (metadata in PostgreSQL), the thread that follows
/// other machines' changes (`Volume::follow_changes`: the engine drops its
/// clean state of each changed file first) and drops what this machine's
/// kernel caches of them: attributes and pages of changed inodes, changed
/// names (docs/shared-volume.md §6). Its own thread, never a request
/// handler: `inval_*` waits for the kernel, which may wait for a request
/// the handler would be serving. Stopped and joined when dropped.
struct ChangeNotifier {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ChangeNotifier {
    /// None if the thread cannot start (then the kernel's 1 s TTL is the
    /// bound, as logged).
    fn start(follower: Arc<cairn_engine::ChangeFollower>, kernel: fuser::Notifier) -> Option<ChangeNotifier> {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("cairn-notifier".into())
            .spawn(move || {
                let mut failing = false;
                while !s.load(Ordering::Relaxed) {
                    match follower.next(NOTIFIER_SLICE) {
                        Ok(batch) => {
                            failing = false;
                            if batch.all {
                                info!("the change log was trimmed past this mount's cursor: dropped every cached file");
                            }
                            // Sent from here, not through the notice
                            // thread: a hand-off and a wait per notice
                            // (two context switches) cost this thread
                            // about as much again under a create or
                            // unlink load (BENCHMARKS §16.7).
                            for &ino in &batch.inodes {
                                KernelNotifier::send(&kernel, Notice::Inode(ino));
                            }
                            for (parent, name) in &batch.entries {
                                KernelNotifier::send(&kernel, Notice::Entry(*parent, name.clone()));
                            }
                            follower.done(&batch);
                        }
                        Err(e) => {
                            if !failing {
                                warn!("reading other machines' changes: {e} (retrying)");
                            }
                            failing = true;
                            std::thread::sleep(NOTIFIER_SLICE);
                        }
                    }
                }
            });
        match thread {
            Ok(t) => Some(ChangeNotifier { stop, thread: Some(t) }),
            Err(e) => {
                warn!("cannot start the change notifier thread: {e}");
                None
            }
        }
    }
}

impl Drop for ChangeNotifier {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
