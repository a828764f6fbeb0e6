//! `mount_archive`: index, mount, serve until unmounted.

use std::ffi::CString;
use std::fs::{self, File};
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::thread::JoinHandle;

use fuser::{Config, MountOption, Session, SessionACL, SessionUnmounter};
use tracing::{info, warn};

use crate::fs::TarFs;
use crate::index::{open_index, IndexInfo};
use crate::tree::{Defaults, Tree};
use crate::TarfsError;

/// How to mount an archive.
#[derive(Clone, Debug)]
pub struct TarMountOptions {
    /// Let users other than the mounting one in (`allow_other`).
    pub allow_other: bool,
    /// Threads serving kernel requests (at least 1).
    pub threads: usize,
    /// The "source" shown by `mount`/`df`; default: the archive path.
    pub fsname: Option<String>,
    /// Where index files live; default [`crate::default_index_dir`].
    pub index_dir: Option<PathBuf>,
    /// Turn SIGTERM, SIGINT and SIGHUP into an unmount (lazy if busy).
    /// Process-wide: leave it off when several mounts share a process.
    pub handle_signals: bool,
}

impl Default for TarMountOptions {
    fn default() -> Self {
        TarMountOptions {
            allow_other: false,
            threads: 2,
            fsname: None,
            index_dir: None,
            handle_signals: true,
        }
    }
}

/// What `on_ready` is told.
#[derive(Clone, Debug)]
pub struct MountInfo {
    /// The mount point, canonicalised.
    pub mountpoint: PathBuf,
    /// How the index was obtained.
    pub index: IndexInfo,
    /// Inodes in the tree (including synthesised directories).
    pub nodes: usize,
    /// Members left out (".." paths, dangling hard links, paths through files).
    pub skipped: usize,
}

/// Mounts `archive` read-only at `mountpoint` and serves it in the
/// foreground until it is unmounted (`fusermount3 -u MOUNTPOINT`,
/// `umount`, or a signal when `opts.handle_signals`).
///
/// The index is loaded or built first (errors in the archive are reported
/// before anything is mounted). `on_ready` runs once the kernel mount
/// exists and the FUSE handshake is done: a daemonising caller can let its
/// parent exit then. Returns when the session ends.
pub fn mount_archive(
    archive: &Path,
    mountpoint: &Path,
    opts: &TarMountOptions,
    on_ready: impl FnOnce(&MountInfo),
) -> Result<(), TarfsError> {
    let mp = fs::canonicalize(mountpoint).map_err(|e| TarfsError::Io {
        what: format!("bad mount point {}", mountpoint.display()),
        source: e,
    })?;
    if !mp.is_dir() {
        return Err(TarfsError::Io {
            what: format!("mount point {} is not a directory", mp.display()),
            source: io::Error::from(io::ErrorKind::NotADirectory),
        });
    }
    let (members, index) = open_index(archive, opts.index_dir.as_deref())?;
    let file = File::open(&index.archive).map_err(|e| TarfsError::Io {
        what: format!("cannot open {}", index.archive.display()),
        source: e,
    })?;
    let meta = file.metadata().map_err(|e| TarfsError::Io {
        what: format!("cannot stat {}", index.archive.display()),
        source: e,
    })?;
    let tree = Tree::build(
        &members,
        Defaults {
            uid: meta.uid(),
            gid: meta.gid(),
            mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
        },
    );
    drop(members);
    let info = MountInfo {
        mountpoint: mp.clone(),
        nodes: tree.len(),
        skipped: tree.skipped,
        index,
    };
    let fs = TarFs::new(tree, file).map_err(|e| TarfsError::Io {
        what: "cannot read the archive".into(),
        source: e,
    })?;

    let threads = opts.threads.max(1);
    let mut config = Config::default();
    config.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(threads);
    // Per-thread /dev/fuse descriptors need /dev/fuse to be openable here
    // (it is not when the mount goes through a setuid fusermount3 only).
    config.clone_fd = threads > 1
        && fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .is_ok();
    let fsname = opts
        .fsname
        .clone()
        .unwrap_or_else(|| info.index.archive.display().to_string())
        .replace(',', "_");
    config.mount_options = vec![
        MountOption::RO,
        MountOption::FSName(fsname),
        MountOption::Subtype("cairn-tar".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
    ];
    let mut session = Session::new(fs, &mp, &config).map_err(|e| TarfsError::Io {
        what: format!("cannot mount {}", mp.display()),
        source: e,
    })?;
    let watch = if opts.handle_signals {
        match SignalWatch::start(session.unmount_callable(), mp.clone()) {
            Ok(w) => w,
            Err(e) => {
                let _ = session.unmount();
                return Err(TarfsError::Io {
                    what: "cannot install signal handlers".into(),
                    source: e,
                });
            }
        }
    } else {
        None
    };
    info!(
        archive = %info.index.archive.display(),
        mountpoint = %mp.display(),
        members = info.index.members,
        "tar archive mounted"
    );
    on_ready(&info);
    let res = session.run();
    drop(watch);
    info!(mountpoint = %mp.display(), "tar mount ended");
    res.map_err(|e| TarfsError::Io {
        what: format!("FUSE session on {}", mp.display()),
        source: e,
    })
}

/// Unmounts a path lazily (root: umount2 MNT_DETACH; others: fusermount3).
pub fn unmount_lazy(mountpoint: &Path) -> io::Result<()> {
    let c = CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
        return Ok(());
    }
    let out = Command::new("fusermount3")
        .arg("-u")
        .arg("-z")
        .arg("--")
        .arg(mountpoint)
        .output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ))
    }
}

/// Write end of the self-pipe the signal handler writes to (-1: none).
static SIGNAL_FD: AtomicI32 = AtomicI32::new(-1);
/// One watcher per process.
static WATCHING: AtomicBool = AtomicBool::new(false);
const SIGNALS: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

extern "C" fn on_signal(_sig: libc::c_int) {
    let fd = SIGNAL_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        let b = 1u8;
        // SAFETY: write(2) is async-signal-safe; the buffer is valid.
        unsafe {
            libc::write(fd, (&b as *const u8).cast(), 1);
        }
    }
}

/// Signal handlers and the thread that turns a signal into an unmount.
struct SignalWatch {
    write_fd: RawFd,
    old: Vec<(libc::c_int, libc::sigaction)>,
    thread: Option<JoinHandle<()>>,
}

impl SignalWatch {
    fn start(
        mut unmounter: SessionUnmounter,
        mountpoint: PathBuf,
    ) -> io::Result<Option<SignalWatch>> {
        if WATCHING.swap(true, Ordering::SeqCst) {
            warn!("another mount in this process handles signals already");
            return Ok(None);
        }
        let mut fds = [0 as RawFd; 2];
        // SAFETY: fds has room for two descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            WATCHING.store(false, Ordering::SeqCst);
            return Err(io::Error::last_os_error());
        }
        let (read_fd, write_fd) = (fds[0], fds[1]);
        SIGNAL_FD.store(write_fd, Ordering::SeqCst);
        let mut old = Vec::new();
        for sig in SIGNALS {
            // SAFETY: a zeroed sigaction with a valid handler and empty mask.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = on_signal as *const () as usize;
                sa.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut sa.sa_mask);
                let mut prev: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, &sa, &mut prev) == 0 {
                    old.push((sig, prev));
                }
            }
        }
        let thread = std::thread::Builder::new()
            .name("cairn-tar-signals".into())
            .spawn(move || {
                let mut b = 0u8;
                loop {
                    // SAFETY: reading one byte into a valid buffer.
                    let n = unsafe { libc::read(read_fd, (&mut b as *mut u8).cast(), 1) };
                    if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    if n <= 0 || b == 0 {
                        break; // closed, or told to stop
                    }
                    info!(mountpoint = %mountpoint.display(), "signal received: unmounting");
                    if let Err(e) = unmounter.unmount() {
                        warn!("unmount failed ({e}): detaching lazily");
                        if let Err(e) = unmount_lazy(&mountpoint) {
                            warn!("lazy unmount of {} failed: {e}", mountpoint.display());
                        }
                    }
                }
                // SAFETY: closing our own descriptor.
                unsafe { libc::close(read_fd) };
            })?;
        Ok(Some(SignalWatch {
            write_fd,
            old,
            thread: Some(thread),
        }))
    }
}

impl Drop for SignalWatch {
    fn drop(&mut self) {
        for (sig, prev) in &self.old {
            // SAFETY: restoring the previous disposition.
            unsafe { libc::sigaction(*sig, prev, std::ptr::null_mut()) };
        }
        SIGNAL_FD.store(-1, Ordering::SeqCst);
        let stop = 0u8;
        // SAFETY: our own pipe; one byte from a valid buffer.
        unsafe {
            libc::write(self.write_fd, (&stop as *const u8).cast(), 1);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // SAFETY: closing our own descriptor.
        unsafe { libc::close(self.write_fd) };
        WATCHING.store(false, Ordering::SeqCst);
    }
}
