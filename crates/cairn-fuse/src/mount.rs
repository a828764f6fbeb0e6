//! Mounting and unmounting: mountpoint checks, the fuser session, and the
//! signal handling that turns SIGTERM/SIGINT/SIGHUP into a clean unmount.

use std::ffi::{CString, OsString};
use std::fs;
use std::io::{self, ErrorKind};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use cairn_engine::Volume;
use fuser::{Config, MountOption, Session, SessionACL};
use tracing::{debug, error, info, warn};

use crate::fs::CairnFs;
use crate::mounttable::{abort_connection, conn_id, entries, mount_entry};

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
    /// Threads serving kernel requests (at least 1).
    pub threads: usize,
    /// The "source" shown by `mount`/`df` (the fsname option).
    pub fsname: String,
    /// Let the kernel cache writes and send them in large requests (see
    /// `fs::wanted_capabilities`).
    pub writeback_cache: bool,
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
            fsname: "cairn".to_string(),
            writeback_cache: true,
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
    let mut config = Config::default();
    config.acl = if cfg.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(threads);
    // Per-thread /dev/fuse descriptors (FUSE_DEV_IOC_CLONE) need /dev/fuse
    // to be openable; fuser fails the whole session if it is not.
    config.clone_fd = threads > 1
        && fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .is_ok();

    // Handlers go in before the mount so that no window exists in which a
    // SIGTERM kills the process with the volume mounted.
    let watch = SignalWatch::start(mountpoint.clone())?;

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
    let fs = CairnFs::new(vol.clone()).with_writeback_cache(writeback_cache);
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
        clone_fd = config.clone_fd,
        "mounted"
    );
    if let (Some(w), Some(id)) = (&watch, conn) {
        w.conn.store(id, Ordering::Relaxed);
    }
    let kernel = Arc::new(KernelNotifier(session.notifier()));
    vol.set_kernel_cache(kernel.clone());
    let bg = match session.spawn() {
        Ok(bg) => bg,
        Err(e) => {
            if as_root {
                detach_if_ours(&mountpoint, conn);
            }
            return Err(e);
        }
    };
    let notifier = follower.and_then(|f| ChangeNotifier::start(f, kernel));
    if watch
        .as_ref()
        .is_some_and(|w| w.signalled.load(Ordering::Relaxed))
    {
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
    crate::mounttable::mount_fuse(mountpoint, &cfg.fsname, "fuse.cairn", read_only, &options)
}

/// Lazily detaches the mount at `path` if it is still our connection (a
/// later mount at the same path is left alone).
fn detach_if_ours(path: &Path, conn: Option<u64>) {
    let Some(ours) = conn else { return };
    match mount_entry(path) {
        Ok(Some(e)) if conn_id(e.dev) == ours => {
            if let Err(e) = umount_syscall(path, true) {
                warn!("{e}");
            }
        }
        _ => {}
    }
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
// Mountpoint checks

fn busy(path: &Path, why: &str) -> io::Error {
    io::Error::new(
        ErrorKind::ResourceBusy,
        format!("mountpoint {} is busy: {why}", path.display()),
    )
}

/// Checks the mountpoint and returns its canonical path.
fn validate_mountpoint(mp: &Path) -> io::Result<PathBuf> {
    let meta = match fs::metadata(mp) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Err(io::Error::new(
                ErrorKind::NotFound,
                format!("mountpoint {} does not exist", mp.display()),
            ))
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            return Err(busy(
                mp,
                "already mounted (by a FUSE daemon that is gone: unmount it first)",
            ))
        }
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!("mountpoint {}: {e}", mp.display()),
            ))
        }
    };
    if !meta.is_dir() {
        return Err(io::Error::new(
            ErrorKind::NotADirectory,
            format!("mountpoint {} is not a directory", mp.display()),
        ));
    }
    let canon = mp.canonicalize()?;
    if is_mount_point(&canon, &meta)? {
        return Err(busy(&canon, "already mounted"));
    }
    Ok(canon)
}

fn is_mount_point(canon: &Path, meta: &fs::Metadata) -> io::Result<bool> {
    let Some(parent) = canon.parent() else {
        return Ok(true); // "/"
    };
    let pmeta = fs::metadata(parent)?;
    if pmeta.dev() != meta.dev() || pmeta.ino() == meta.ino() {
        return Ok(true);
    }
    // A bind mount of the same file system keeps st_dev: ask the mount table.
    Ok(mount_entry(canon)?.is_some())
}

/// An absolute path for `p` without resolving `p` itself, which may be a
/// dead FUSE mount that cannot be stat'ed.
fn absolute(p: &Path) -> io::Result<PathBuf> {
    let abs = std::path::absolute(p)?;
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => match parent.canonicalize() {
            Ok(parent) => Ok(parent.join(name)),
            Err(_) => Ok(abs),
        },
        _ => Ok(abs),
    }
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

/// Found through the mount table, never by stat'ing the mount: that would
/// wait for a session that is not serving yet.
fn fuse_connection_of(mountpoint: &Path) -> Option<u64> {
    match mount_entry(mountpoint) {
        Ok(Some(e)) if e.fstype.starts_with("fuse") => Some(conn_id(e.dev)),
        _ => None,
    }
}

// ---------------------------------------------------------------------------
// Unmounting

fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Unmounts once, without the "is it mounted" checks of [`unmount`].
/// `lazy` detaches a busy mount (MNT_DETACH / `fusermount3 -uz`).
fn unmount_once(path: &Path, lazy: bool) -> io::Result<()> {
    match find_in_path("fusermount3").or_else(|| find_in_path("fusermount")) {
        Some(helper) => {
            let mut cmd = Command::new(&helper);
            cmd.arg(if lazy { "-uz" } else { "-u" }).arg("--").arg(path);
            let out = cmd.output().map_err(|e| {
                io::Error::new(e.kind(), format!("cannot run {}: {e}", helper.display()))
            })?;
            if out.status.success() {
                return Ok(());
            }
            let stderr = String::from_utf8_lossy(&out.stderr);
            Err(helper_error(path, stderr.trim()))
        }
        None => umount_syscall(path, lazy),
    }
}

fn busy_error(path: &Path) -> io::Error {
    io::Error::new(
        ErrorKind::ResourceBusy,
        format!(
            "{} is busy: files are open or a process has its working directory \
             inside; close them and retry, or detach it lazily (umount -l)",
            path.display()
        ),
    )
}

/// Classifies fusermount's complaint ("fusermount3: failed to unmount /x:
/// Device or resource busy").
fn helper_error(path: &Path, stderr: &str) -> io::Error {
    let lower = stderr.to_ascii_lowercase();
    if lower.contains("busy") {
        busy_error(path)
    } else if lower.contains("not found in") || lower.contains("invalid argument") {
        io::Error::new(
            ErrorKind::InvalidInput,
            format!("{} is not mounted", path.display()),
        )
    } else {
        io::Error::other(format!("cannot unmount {}: {stderr}", path.display()))
    }
}

fn umount_syscall(path: &Path, lazy: bool) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(ErrorKind::InvalidInput, "mountpoint contains a NUL byte"))?;
    let flags = libc::UMOUNT_NOFOLLOW | if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    Err(match e.raw_os_error() {
        Some(libc::EBUSY) => busy_error(path),
        Some(libc::EINVAL) => {
            io::Error::new(ErrorKind::InvalidInput, format!("{} is not mounted", path.display()))
        }
        Some(libc::EPERM) => io::Error::new(
            ErrorKind::PermissionDenied,
            format!(
                "cannot unmount {}: permission denied (install fuse3 for fusermount3, or run as root)",
                path.display()
            ),
        ),
        _ => io::Error::new(e.kind(), format!("cannot unmount {}: {e}", path.display())),
    })
}

// ---------------------------------------------------------------------------
// Signals

/// Byte that tells the watcher thread to exit (no signal is numbered 0).
const STOP: u8 = 0;

/// Write end of the signal pipe, for the handler; -1 when none.
static SIGNAL_FD: AtomicI32 = AtomicI32::new(-1);
/// The process-wide self-pipe, created once and never closed, so a handler
/// still running on another thread while we restore the old handlers can
/// never write into a recycled descriptor.
static SIGNAL_PIPE: OnceLock<(OwnedFd, OwnedFd)> = OnceLock::new();
/// Only one mount per process owns the signals at a time.
static SIGNALS_TAKEN: AtomicBool = AtomicBool::new(false);

const SIGNALS: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

extern "C" fn on_signal(sig: libc::c_int) {
    let fd = SIGNAL_FD.load(Ordering::Relaxed);
    if fd < 0 {
        return;
    }
    let byte = u8::try_from(sig).unwrap_or(u8::MAX);
    // SAFETY: write(2) and errno access are async-signal-safe; errno is
    // restored so the interrupted code does not see ours.
    unsafe {
        let saved = *libc::__errno_location();
        libc::write(fd, (&byte as *const u8).cast(), 1);
        *libc::__errno_location() = saved;
    }
}

fn signal_pipe() -> io::Result<&'static (OwnedFd, OwnedFd)> {
    if let Some(p) = SIGNAL_PIPE.get() {
        return Ok(p);
    }
    let mut fds: [RawFd; 2] = [-1; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and ours.
    let pair = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // If another thread won the race, ours is dropped (closed) here.
    Ok(SIGNAL_PIPE.get_or_init(|| pair))
}

/// Turns termination signals into unmounts while a mount is being served.
/// Dropping it restores the previous handlers and stops the thread.
struct SignalWatch {
    old: Vec<(libc::c_int, libc::sigaction)>,
    thread: Option<JoinHandle<()>>,
    /// Set by the watcher on the first signal.
    signalled: Arc<AtomicBool>,
    /// The FUSE connection id, once known (0 = unknown).
    conn: Arc<AtomicU64>,
}

impl SignalWatch {
    /// `None` if another mount in this process already owns the signals.
    fn start(mountpoint: PathBuf) -> io::Result<Option<SignalWatch>> {
        if SIGNALS_TAKEN.swap(true, Ordering::SeqCst) {
            debug!("signals are already handled by another mount in this process");
            return Ok(None);
        }
        let (read_end, write_end) = match signal_pipe() {
            Ok(p) => p,
            Err(e) => {
                SIGNALS_TAKEN.store(false, Ordering::SeqCst);
                return Err(e);
            }
        };
        let rfd = read_end.as_raw_fd();
        drain(rfd);
        SIGNAL_FD.store(write_end.as_raw_fd(), Ordering::SeqCst);

        let signalled = Arc::new(AtomicBool::new(false));
        let conn = Arc::new(AtomicU64::new(0));
        let mut watch = SignalWatch {
            old: Vec::new(),
            thread: None,
            signalled,
            conn,
        };
        let (s, c) = (watch.signalled.clone(), watch.conn.clone());
        let thread = std::thread::Builder::new()
            .name("cairn-signals".to_string())
            .spawn(move || watch_signals(rfd, &mountpoint, &s, &c));
        match thread {
            Ok(t) => watch.thread = Some(t),
            Err(e) => return Err(e), // Drop undoes the rest
        }
        for sig in SIGNALS {
            // SAFETY: a zeroed sigaction is valid; the handler only does
            // async-signal-safe work.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
                sa.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut sa.sa_mask);
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, &sa, &mut old) != 0 {
                    return Err(io::Error::last_os_error());
                }
                watch.old.push((sig, old));
            }
        }
        Ok(Some(watch))
    }
}

impl Drop for SignalWatch {
    fn drop(&mut self) {
        for (sig, old) in self.old.drain(..) {
            // SAFETY: restoring the handler sigaction gave us.
            unsafe {
                libc::sigaction(sig, &old, std::ptr::null_mut());
            }
        }
        let fd = SIGNAL_FD.swap(-1, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            if fd >= 0 {
                // SAFETY: `fd` is the never-closed write end of the pipe.
                unsafe {
                    libc::write(fd, (&STOP as *const u8).cast(), 1);
                }
            }
            let _ = t.join();
        }
        SIGNALS_TAKEN.store(false, Ordering::SeqCst);
    }
}

/// Discards stale bytes left in the pipe by an earlier mount.
fn drain(fd: RawFd) {
    let mut buf = [0u8; 64];
    // SAFETY: reading into a local buffer of the given size; the fd is non-blocking.
    while unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
}

/// Blocks until the next byte from the pipe.
fn next_byte(fd: RawFd) -> Option<u8> {
    loop {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, -1) };
        if rc < 0 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return None;
        }
        let mut b = 0u8;
        // SAFETY: reading one byte into a local.
        let n = unsafe { libc::read(fd, (&mut b as *mut u8).cast(), 1) };
        if n == 1 {
            return Some(b);
        }
        if n == 0 {
            return None;
        }
        // EAGAIN (another reader won) or EINTR: poll again.
    }
}

fn signal_name(sig: u8) -> &'static str {
    match libc::c_int::from(sig) {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
        _ => "signal",
    }
}

fn watch_signals(fd: RawFd, mountpoint: &Path, signalled: &AtomicBool, conn: &AtomicU64) {
    let mut count = 0u32;
    while let Some(sig) = next_byte(fd) {
        if sig == STOP {
            return;
        }
        count += 1;
        signalled.store(true, Ordering::Relaxed);
        let name = signal_name(sig);
        if count == 1 {
            info!("{name}: unmounting {}", mountpoint.display());
            push_before_unmount(mountpoint);
            match unmount_once(mountpoint, false) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::ResourceBusy => {
                    warn!(
                        "{} is in use: detached it lazily; the volume is flushed and closed \
                         when the last open file is closed (send {name} again to abort now)",
                        mountpoint.display()
                    );
                    if let Err(e) = unmount_once(mountpoint, true) {
                        error!("lazy unmount failed: {e}");
                    }
                }
                Err(e) => warn!("{e}"),
            }
        } else {
            let id = conn.load(Ordering::Relaxed);
            if id == 0 {
                warn!("{name} again, but the FUSE connection is unknown: cannot abort it");
                continue;
            }
            warn!(
                "{name} again: aborting FUSE connection {id}; open files will fail with ENOTCONN"
            );
            match abort_connection(id) {
                Ok(()) => {}
                Err(e) => error!("aborting FUSE connection {id} failed: {e}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fusermount_messages() {
        let p = Path::new("/mnt/x");
        let busy = helper_error(
            p,
            "fusermount3: failed to unmount /mnt/x: Device or resource busy",
        );
        assert_eq!(busy.kind(), ErrorKind::ResourceBusy);
        assert!(busy.to_string().contains("/mnt/x is busy"));
        let gone = helper_error(p, "fusermount3: entry for /mnt/x not found in /etc/mtab");
        assert_eq!(gone.kind(), ErrorKind::InvalidInput);
        assert!(gone.to_string().contains("not mounted"));
        let other = helper_error(p, "fusermount3: something else");
        assert!(other.to_string().contains("something else"));
    }

    #[test]
    fn mountpoint_checks() {
        let missing = validate_mountpoint(Path::new("/nonexistent/cairn/mp")).unwrap_err();
        assert_eq!(missing.kind(), ErrorKind::NotFound);
        assert_eq!(
            missing.to_string(),
            "mountpoint /nonexistent/cairn/mp does not exist"
        );

        let root = validate_mountpoint(Path::new("/")).unwrap_err();
        assert_eq!(root.kind(), ErrorKind::ResourceBusy);
        assert!(root.to_string().contains("already mounted"), "{root}");

        let dir = std::env::temp_dir().join(format!("cairn-fuse-mp-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("f");
        fs::write(&file, b"").unwrap();
        assert_eq!(
            validate_mountpoint(&file).unwrap_err().kind(),
            ErrorKind::NotADirectory
        );
        assert_eq!(
            validate_mountpoint(&dir).unwrap(),
            dir.canonicalize().unwrap()
        );
        fs::remove_dir_all(&dir).unwrap();
    }

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
struct KernelNotifier(fuser::Notifier);

impl cairn_engine::KernelCache for KernelNotifier {
    fn inode_changed(&self, ino: cairn_engine::Ino) {
        // Offset 0, length 0: the attributes and every cached page.
        if let Err(e) = self.0.inval_inode(fuser::INodeNo(ino), 0, 0) {
            // ENOENT: the kernel holds nothing for it, which is fine.
            if e.raw_os_error() != Some(libc::ENOENT) {
                debug!("invalidating inode {ino}: {e}");
            }
        }
    }

    fn entry_changed(&self, parent: cairn_engine::Ino, name: &[u8]) {
        use std::os::unix::ffi::OsStrExt;
        if let Err(e) = self.0.inval_entry(fuser::INodeNo(parent), std::ffi::OsStr::from_bytes(name)) {
            if e.raw_os_error() != Some(libc::ENOENT) {
                debug!("invalidating entry {}: {e}", String::from_utf8_lossy(name));
            }
        }
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
    fn start(follower: Arc<cairn_engine::ChangeFollower>, kernel: Arc<KernelNotifier>) -> Option<ChangeNotifier> {
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
                            for &ino in &batch.inodes {
                                cairn_engine::KernelCache::inode_changed(kernel.as_ref(), ino);
                            }
                            for (parent, name) in &batch.entries {
                                cairn_engine::KernelCache::entry_changed(kernel.as_ref(), *parent, name);
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
