//! Blocking lock requests (`F_SETLKW`, `flock` without `LOCK_NB`) on a
//! shared volume, parked off the FUSE workers (docs/shared-volume.md §8):
//! the handler hands its reply to one waiter thread and returns; the
//! thread asks the metadata store again every [`RETRY`] until the lock is
//! granted, the store fails, or the process that asked is gone or has a
//! signal to take (fuser 0.18 answers FUSE_INTERRUPT itself with ENOSYS,
//! so the kernel keeps waiting for this reply: without the check a killed
//! waiter would hang until the holder let go).

use std::sync::{Arc, Weak};
use std::time::Duration;

use cairn_engine::{Ino, LockKind, LockOutcome, LockStyle, Volume};
use fuser::{Errno, ReplyEmpty};
use parking_lot::{Condvar, Mutex};
use tracing::{debug, warn};

/// How often a parked request asks the store again.
pub(crate) const RETRY: Duration = Duration::from_millis(50);

/// One parked request.
pub(crate) struct Waiter {
    pub ino: Ino,
    pub owner: u64,
    pub kind: LockKind,
    pub start: u64,
    pub end: u64,
    /// The lock's pid (thread group) as `F_GETLK` reports it.
    pub pid: u32,
    /// The thread that asked (the request header's pid): its signals.
    pub tid: u32,
    pub reply: ReplyEmpty,
}

#[derive(Default)]
struct Queue {
    waiters: Vec<Waiter>,
    stop: bool,
}

/// The parked requests and the thread serving them (started at the first).
pub(crate) struct LockWaiters {
    q: Mutex<Queue>,
    cv: Condvar,
    vol: Weak<Volume>,
    started: std::sync::Once,
}

impl LockWaiters {
    pub(crate) fn new(vol: &Arc<Volume>) -> Arc<Self> {
        Arc::new(LockWaiters { q: Mutex::new(Queue::default()), cv: Condvar::new(), vol: Arc::downgrade(vol), started: std::sync::Once::new() })
    }

    /// Parks `w`: it is answered by the waiter thread.
    pub(crate) fn park(self: &Arc<Self>, w: Waiter) {
        self.started.call_once(|| {
            let me = self.clone();
            if let Err(e) = std::thread::Builder::new().name("cairn-lock-wait".into()).spawn(move || me.run()) {
                warn!("cannot start the lock waiter thread: {e}");
            }
        });
        self.q.lock().waiters.push(w);
        self.cv.notify_one();
    }

    /// How many requests wait (tests, status).
    #[allow(dead_code)]
    pub(crate) fn waiting(&self) -> usize {
        self.q.lock().waiters.len()
    }

    /// Answers every parked request with EINTR and ends the thread
    /// (unmount).
    pub(crate) fn stop(&self) {
        let mut q = self.q.lock();
        q.stop = true;
        for w in q.waiters.drain(..) {
            w.reply.error(Errno::EINTR);
        }
        self.cv.notify_all();
    }

    fn run(self: Arc<Self>) {
        loop {
            let batch = {
                let mut q = self.q.lock();
                while q.waiters.is_empty() && !q.stop {
                    self.cv.wait(&mut q);
                }
                if q.stop {
                    return;
                }
                std::mem::take(&mut q.waiters)
            };
            let Some(vol) = self.vol.upgrade() else {
                for w in batch {
                    w.reply.error(Errno::EIO);
                }
                return;
            };
            let mut still = Vec::new();
            for w in batch {
                if interrupted(w.tid) {
                    debug!(ino = w.ino, tid = w.tid, "a blocked lock request's process is gone or has a signal: answering EINTR");
                    w.reply.error(Errno::EINTR);
                    continue;
                }
                match vol.set_lock(w.ino, w.owner, LockStyle::Posix, w.kind, w.start, w.end, w.pid) {
                    Ok(LockOutcome::Granted) => w.reply.ok(),
                    Ok(LockOutcome::Conflict(_)) => still.push(w),
                    Err(e) => {
                        warn!(ino = w.ino, "a blocked lock request failed: {}", e.message());
                        w.reply.error(Errno::from_i32(e.errno()));
                    }
                }
            }
            drop(vol);
            let mut q = self.q.lock();
            if q.stop {
                for w in still {
                    w.reply.error(Errno::EINTR);
                }
                return;
            }
            q.waiters.extend(still);
            if !q.waiters.is_empty() {
                // New requests are tried at once; the rest after RETRY.
                let _ = self.cv.wait_for(&mut q, RETRY);
            }
        }
    }
}

/// Whether thread `tid` no longer exists or has an unblocked signal
/// pending (then the kernel must get an answer: EINTR restarts or ends
/// the system call as the signal decides).
pub(crate) fn interrupted(tid: u32) -> bool {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{tid}/status")) else { return true };
    let field = |name: &str| -> u64 {
        s.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| u64::from_str_radix(v.trim(), 16).ok()).unwrap_or(0)
    };
    if s.lines().any(|l| l.starts_with("State:") && (l.contains("zombie") || l.contains("dead"))) {
        return true;
    }
    let pending = field("SigPnd:") | field("ShdPnd:");
    let blocked = field("SigBlk:");
    // SIGKILL (bit 8) cannot be blocked.
    pending & (!blocked | 1 << (libc::SIGKILL - 1)) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_thread_is_not_interrupted_and_a_gone_one_is() {
        assert!(!interrupted(std::process::id()));
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        assert!(interrupted(pid), "a reaped process counted as alive");
    }
}
