//! `cairn-powercut`: a test-only passthrough FUSE file system that simulates
//! power cuts (in the spirit of LazyFS).
//!
//! `cairn-powercut BACKING MOUNTPOINT` mounts a view of the directory
//! BACKING at MOUNTPOINT. Programs under test work in MOUNTPOINT; what
//! BACKING holds at any moment is what a disk would hold after a power cut.
//!
//! # Semantics
//!
//! - **Namespace operations go to BACKING at once and are durable**: lookup,
//!   getattr, create/mknod, mkdir, unlink, rmdir, rename (`RENAME_NOREPLACE`
//!   and `RENAME_EXCHANGE` honoured, other flags EINVAL), symlink, readlink,
//!   link, setattr of mode/uid/gid/times, statfs, opendir/readdir/releasedir,
//!   access. Errors of the backing file system are passed through with their
//!   errno (ENOENT, EEXIST, ENOTEMPTY, ENOSPC, ...). New entries are owned
//!   by the caller and get exactly `mode & !umask`.
//! - **File contents and sizes are volatile until fsync.** Every write and
//!   every size change (setattr size, O_TRUNC, writes past end of file)
//!   through the mount is kept in this process's memory only: a per-inode
//!   overlay of dirty 4 KiB pages, the logical size, and the lowest size the
//!   file was truncated to since its last sync (backing bytes at or past
//!   that floor read as zeros, even if the file grows again). Reads through
//!   the mount see the current state: backing bytes, then dirty pages over
//!   them, clipped to the logical size, zeros past the backing file's end.
//!   getattr reports the logical size (and the time of the last write as
//!   mtime).
//! - `fsync`/`fdatasync` of a file (through any handle of the inode) writes
//!   its state to the backing file (length to the truncation floor, then to
//!   the logical size, then the dirty pages), fsyncs the backing file
//!   (`fdatasync` for fdatasync), and only then replies. `fsyncdir` fsyncs
//!   the backing directory. `flush` (close) and `release` persist nothing.
//! - A file whose last name is removed (unlink, or replaced by a rename)
//!   drops its overlay, at once or when its last open handle is released.
//!   A rename keeps the overlay with the inode.
//! - **A power cut** is SIGKILL of the process, or [`PowerCut::cut`] in
//!   process: everything not fsync'd is gone, and a new mount over the same
//!   BACKING (with a fresh kernel page cache) sees only what was fsync'd.
//!
//! # What the kernel is told
//!
//! No writeback cache (every write(2) reaches this process before it
//! returns) and no `direct_io`: the normal page cache is used, so shared
//! `mmap` works (SQLite maps its database for reading and its `-shm` file
//! for writing; writes through a shared mapping reach the overlay when the
//! kernel writes the pages back). Opens keep the page cache
//! (`FOPEN_KEEP_CACHE`): all changes go through this process. Attributes
//! and entries are cached for 1 s.
//!
//! No getlk/setlk/flock handlers and no `FUSE_POSIX_LOCKS`/`FUSE_FLOCK_LOCKS`
//! capability (fuser 0.18 requests only `ASYNC_READ`, `BIG_WRITES` and
//! `MAX_PAGES` unless told otherwise): the kernel serves fcntl and flock
//! locks locally, which is what SQLite and a flock'ed volume lock need on
//! one mount.
//!
//! Four threads serve requests; each inode's overlay has its own mutex, so a
//! slow fsync of one file does not stall others.
//!
//! # Inodes
//!
//! Backing `(st_dev, st_ino)` pairs map to FUSE inode numbers that are never
//! reused within a mount; a node records its parent and name (so renaming a
//! directory rewrites nothing below it) and its kernel lookup count. A
//! node with several hard links remembers only the name it was last seen
//! under; this is enough for the Cairn daemon's workloads (SQLite in WAL
//! mode, append-only journal segments, pack files renamed from `tmp/` into
//! `packs/XY/`, `mkdir -p`).
//!
//! # Requirements
//!
//! Root (the mount is made with mount(2) and `allow_other`,
//! `default_permissions`; the type is `fuse.cairn-powercut`, the source
//! `cairn-powercut`).

mod fs;
mod overlay;
mod sys;

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fuser::{BackgroundSession, Session};
use tracing::{info, warn};

use crate::fs::{PowerCutFs, Shared};

/// A moment at which the power fails by itself, right after an operation
/// has reached BACKING and before its reply: what a program sees at that
/// instant is what a cut at that instant keeps. After it every request
/// fails with EIO, as after [`PowerCut::cut`]; call `cut` to unmount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CrashPoint {
    /// After the `nth` (from 1) unlink of a path (relative to BACKING) that
    /// starts with `prefix` (whole components).
    AfterUnlink { prefix: PathBuf, nth: u64 },
    /// After the `nth` (from 1) successful fsync of a file whose path
    /// (relative to BACKING) ends with `suffix`.
    AfterFsync { suffix: String, nth: u64 },
}

/// Counters of one mount.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// fsync/fdatasync requests on files that succeeded.
    pub fsyncs: u64,
    /// fsync requests on directories.
    pub dir_fsyncs: u64,
    /// Bytes of dirty pages written to backing files (at fsync, and at
    /// [`PowerCut::unmount`]).
    pub bytes_persisted: u64,
    /// Bytes of dirty pages held in memory right now.
    pub dirty_bytes: u64,
    /// Bytes of dirty pages discarded by a cut (or an unmount that persists
    /// nothing).
    pub bytes_dropped_at_cut: u64,
}

/// A mounted power-cut file system served by threads of this process.
///
/// Dropping it without [`cut`](Self::cut) or [`unmount`](Self::unmount)
/// is a cut (errors ignored).
pub struct PowerCut {
    backing: PathBuf,
    mountpoint: PathBuf,
    shared: Arc<Shared>,
    session: Option<BackgroundSession>,
    conn: u64,
}

impl std::fmt::Debug for PowerCut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PowerCut")
            .field("backing", &self.backing)
            .field("mountpoint", &self.mountpoint)
            .field("conn", &self.conn)
            .finish()
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

impl PowerCut {
    /// Mounts a power-cut view of `backing` at `mountpoint` and returns once
    /// the mount serves requests. Needs root.
    pub fn mount(backing: &Path, mountpoint: &Path) -> io::Result<PowerCut> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "cairn-powercut mounts with mount(2) and needs root",
            ));
        }
        let backing = backing
            .canonicalize()
            .map_err(|e| io::Error::new(e.kind(), format!("backing {}: {e}", backing.display())))?;
        let mp = cairn_mount::validate_mountpoint(mountpoint)?;
        if mp.starts_with(&backing) {
            return Err(invalid(format!(
                "mountpoint {} lies inside the backing directory {}",
                mp.display(),
                backing.display()
            )));
        }
        let parent_dev = std::fs::metadata(mp.parent().unwrap_or(Path::new("/")))?.dev();
        let shared = Arc::new(Shared::new(backing.clone())?);

        let fd = sys::mount_fuse(&mp)?;
        let conn = match sys::mount_at(&mp)? {
            Some(e) if e.fstype == sys::FSTYPE => sys::conn_id(e.dev),
            _ => {
                let _ = sys::umount(&mp, true);
                return Err(io::Error::other(format!(
                    "{} does not show up in the mount table",
                    mp.display()
                )));
            }
        };
        let fail = |e: io::Error| {
            let _ = sys::abort_connection(conn);
            let _ = sys::umount(&mp, true);
            e
        };
        let config = cairn_mount::session_config(4, true);
        let fsys = PowerCutFs { s: shared.clone() };
        let session = Session::from_fd(fsys, fd, config.acl, config)
            .and_then(Session::spawn)
            .map_err(fail)?;
        let mut pc = PowerCut {
            backing,
            mountpoint: mp.clone(),
            shared,
            session: Some(session),
            conn,
        };
        // Serving: a stat of the root answers with our st_dev.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match std::fs::metadata(&mp) {
                Ok(m) if m.dev() != parent_dev => break,
                r if Instant::now() > deadline => {
                    let _ = pc.stop(false);
                    return Err(io::Error::other(format!(
                        "mount at {} does not answer: {r:?}",
                        mp.display()
                    )));
                }
                _ => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        info!(backing = %pc.backing.display(), mountpoint = %mp.display(), "mounted");
        Ok(pc)
    }

    /// The mount point (canonical).
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// The backing directory (canonical).
    pub fn backing(&self) -> &Path {
        &self.backing
    }

    /// The counters so far.
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// Arms a crash point (replacing any armed one); see [`CrashPoint`].
    pub fn crash_at(&self, point: CrashPoint) {
        self.shared.arm(point);
    }

    /// Whether the armed crash point has fired.
    pub fn crashed(&self) -> bool {
        self.shared.crashed()
    }

    /// The power cut: first every dirty overlay is discarded and every
    /// later request fails with EIO (nothing more can reach BACKING), then
    /// the mount is detached lazily, the FUSE connection aborted (open
    /// files on it get ENOTCONN) and the session ended. Returns the final
    /// counters once the mount point is no longer mounted.
    pub fn cut(mut self) -> io::Result<Stats> {
        self.shared.cut();
        self.stop(true)?;
        Ok(self.shared.stats())
    }

    /// A clean unmount that first persists every dirty file (as if each
    /// were fsync'd), then unmounts like [`cut`](Self::cut) (lazily if the
    /// mount is busy).
    pub fn unmount(mut self) -> io::Result<Stats> {
        let persisted = self.shared.persist_all_and_stop();
        self.stop(false)?;
        persisted?;
        Ok(self.shared.stats())
    }

    /// A clean unmount that persists nothing more: unsynced data is
    /// discarded (counted in `bytes_dropped_at_cut`), as on SIGTERM of the
    /// binary.
    pub fn unmount_discarding(mut self) -> io::Result<Stats> {
        self.shared.cut();
        self.stop(false)?;
        Ok(self.shared.stats())
    }

    /// Whether the session ended by itself (someone unmounted it).
    fn session_ended(&self) -> bool {
        self.session.as_ref().is_none_or(|s| s.guard.is_finished())
    }

    /// Unmounts (lazily if asked or if busy), aborts the connection and
    /// joins the session. Requests are already refused.
    fn stop(&mut self, lazy: bool) -> io::Result<()> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        let ours = |e: &sys::MountEntry| sys::conn_id(e.dev) == self.conn;
        // The connection is aborted only while our mount still holds its
        // id: once the superblock is gone, the id may belong to the next
        // FUSE mount (another test's).
        let abort = |conn: u64| {
            if let Err(e) = sys::abort_connection(conn) {
                warn!("aborting FUSE connection {conn}: {e}");
            }
        };
        if sys::mount_at(&self.mountpoint)?.as_ref().is_some_and(ours) {
            let clean = !lazy
                && match sys::umount(&self.mountpoint, false) {
                    Ok(()) => true,
                    Err(e) => {
                        warn!(
                            "unmount {}: {e}; detaching lazily",
                            self.mountpoint.display()
                        );
                        false
                    }
                };
            if !clean {
                // Open files would keep a detached mount (and the session)
                // alive: end the connection first, then detach.
                abort(self.conn);
                if let Err(e) = sys::umount(&self.mountpoint, true) {
                    warn!("unmount {}: {e}", self.mountpoint.display());
                }
            }
        } else {
            // Unmounted from outside: the session ends by itself unless the
            // mount was detached while busy.
            let deadline = Instant::now() + Duration::from_secs(2);
            while !session.guard.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if !session.guard.is_finished() {
                abort(self.conn);
            }
        }
        if let Err(e) = session.join() {
            warn!("session ended with: {e}");
        }
        if sys::mount_at(&self.mountpoint)?.as_ref().is_some_and(ours) {
            return Err(io::Error::other(format!(
                "{} is still mounted",
                self.mountpoint.display()
            )));
        }
        Ok(())
    }
}

impl Drop for PowerCut {
    fn drop(&mut self) {
        if self.session.is_some() {
            self.shared.cut();
            let _ = self.stop(true);
        }
    }
}

/// Mounts `backing` at `mountpoint` and serves until SIGTERM, SIGINT or
/// SIGHUP (then unmounts cleanly, persisting nothing more: unsynced data is
/// lost, as in a power cut) or until unmounted from outside. SIGKILL is the
/// power cut. Prints `cairn-powercut: serving MOUNTPOINT` to stderr once
/// the mount serves requests.
pub fn run_foreground(backing: &Path, mountpoint: &Path) -> io::Result<()> {
    // Blocked before the serving threads exist, so they inherit the mask
    // and the signals wait for sigtimedwait here.
    // SAFETY: plain signal-set manipulation on local values.
    let (set, old) = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        (set, old)
    };
    let restore = || {
        // SAFETY: restores the mask saved above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    };
    let pc = match PowerCut::mount(backing, mountpoint) {
        Ok(pc) => pc,
        Err(e) => {
            restore();
            return Err(e);
        }
    };
    eprintln!("cairn-powercut: serving {}", pc.mountpoint().display());
    let signal = loop {
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 200_000_000,
        };
        // SAFETY: valid set and timeout; no siginfo wanted.
        let sig = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &ts) };
        if sig > 0 {
            break Some(sig);
        }
        if pc.session_ended() {
            break None;
        }
    };
    let res = pc.unmount_discarding();
    restore();
    let stats = res?;
    eprintln!(
        "cairn-powercut: unmounted ({}); {} fsyncs, {} bytes persisted, {} unsynced bytes discarded",
        match signal {
            Some(s) if s == libc::SIGINT => "SIGINT",
            Some(s) if s == libc::SIGHUP => "SIGHUP",
            Some(_) => "SIGTERM",
            None => "unmounted from outside",
        },
        stats.fsyncs,
        stats.bytes_persisted,
        stats.bytes_dropped_at_cut
    );
    Ok(())
}
