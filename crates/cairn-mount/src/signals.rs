//! Signals that unmount: SIGTERM, SIGINT and SIGHUP reach a watcher
//! thread through a self-pipe (the handler only writes one byte and keeps
//! `errno`), which unmounts the file system it watches.

use std::io::{self, ErrorKind};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use tracing::{debug, error, info, warn};

use crate::mounttable::abort_connection;
use crate::unmount::unmount_once;

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
///
/// The first SIGTERM, SIGINT or SIGHUP runs the mount's `before_unmount`
/// hook and unmounts; if the mount is busy it is detached lazily. A second
/// one aborts the FUSE connection (open files then see ENOTCONN), once the
/// connection is known ([`SignalWatch::set_connection`]).
pub struct SignalWatch {
    old: Vec<(libc::c_int, libc::sigaction)>,
    thread: Option<JoinHandle<()>>,
    /// Set by the watcher on the first signal.
    signalled: Arc<AtomicBool>,
    /// The FUSE connection id, once known (0 = unknown).
    conn: Arc<AtomicU64>,
}

impl SignalWatch {
    /// `None` if another mount in this process already owns the signals.
    /// Install it before mounting, so that no window exists in which a
    /// signal kills the process with the file system mounted.
    pub fn start(mountpoint: PathBuf, before_unmount: fn(&Path)) -> io::Result<Option<SignalWatch>> {
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
            .spawn(move || watch_signals(rfd, &mountpoint, before_unmount, &s, &c));
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

impl SignalWatch {
    /// The FUSE connection a second signal aborts.
    pub fn set_connection(&self, id: u64) {
        self.conn.store(id, Ordering::Relaxed);
    }

    /// Whether a signal has arrived (one that came while mounting found
    /// nothing to unmount yet: the caller unmounts then).
    pub fn signalled(&self) -> bool {
        self.signalled.load(Ordering::Relaxed)
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

fn watch_signals(fd: RawFd, mountpoint: &Path, before_unmount: fn(&Path), signalled: &AtomicBool, conn: &AtomicU64) {
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
            before_unmount(mountpoint);
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

    static HOOKED: AtomicU64 = AtomicU64::new(0);

    /// The handler leaves `errno` as the interrupted code had it (a signal
    /// between a failing call and its errno read would otherwise change
    /// the error seen), even when its own write fails; and the watcher
    /// runs the hook on a real signal.
    #[test]
    fn a_signal_keeps_errno_and_runs_the_hook() {
        let dir = tempfile::tempdir().unwrap();
        let w = SignalWatch::start(dir.path().to_path_buf(), |_| {
            HOOKED.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap()
        .expect("no other watch in this test binary");
        // A descriptor the handler's write fails on (EBADF: not open for
        // writing), in place of the pipe for one direct call.
        let ro = std::fs::File::open(dir.path()).unwrap();
        let pipe = SIGNAL_FD.swap(ro.as_raw_fd(), Ordering::SeqCst);
        // SAFETY: errno is this thread's; the handler is async-signal-safe
        // and may be called directly.
        let kept = unsafe {
            *libc::__errno_location() = libc::EXDEV;
            on_signal(libc::SIGHUP);
            *libc::__errno_location()
        };
        SIGNAL_FD.store(pipe, Ordering::SeqCst);
        assert_eq!(kept, libc::EXDEV, "the handler changed errno");
        // SAFETY: raise delivers SIGHUP to this thread; our handler runs.
        unsafe { libc::raise(libc::SIGHUP) };
        let t = std::time::Instant::now();
        while HOOKED.load(Ordering::SeqCst) == 0 {
            assert!(t.elapsed() < std::time::Duration::from_secs(10), "the watcher never ran the hook");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(w.signalled());
    }
}
