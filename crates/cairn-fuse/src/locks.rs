//! Blocking lock requests (`F_SETLKW`, `flock` without `LOCK_NB`) on a
//! shared volume, parked off the FUSE workers (docs/shared-volume.md §8):
//! the handler hands its reply to one waiter thread and returns; every
//! [`RETRY`] the thread reads the locks on all the parked requests' inodes
//! in one query, and asks the store to grant only the requests nothing
//! visible conflicts with, until the lock is granted, the store fails, or
//! the process that asked is gone or has a signal to take. However many
//! requests a local user parks (each costs them an open file and a
//! blocked thread), the store sees one query a round from this mount
//! (fuser 0.18 answers FUSE_INTERRUPT itself with ENOSYS,
//! so the kernel keeps waiting for this reply: without the check a killed
//! waiter would hang until the holder let go).

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use cairn_engine::{lock_conflict, Ino, LockKind, LockOutcome, LockOwner, LockRequest, LockRow, LockStyle, Volume};
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
            let mut live = Vec::with_capacity(batch.len());
            for w in batch {
                if interrupted(w.tid) {
                    debug!(ino = w.ino, tid = w.tid, "a blocked lock request's process is gone or has a signal: answering EINTR");
                    w.reply.error(Errno::EINTR);
                } else {
                    live.push(w);
                }
            }
            let mut inos: Vec<Ino> = live.iter().map(|w| w.ino).collect();
            inos.sort_unstable();
            inos.dedup();
            let held = if inos.is_empty() { Ok(Vec::new()) } else { vol.locks_on(&inos) };
            let held = match held {
                Ok(h) => h,
                Err(e) => {
                    warn!("blocked lock requests: reading the locks held failed: {}", e.message());
                    for w in live {
                        w.reply.error(Errno::from_i32(e.errno()));
                    }
                    continue;
                }
            };
            let mut by_ino: HashMap<Ino, Vec<LockRow>> = HashMap::new();
            for (ino, l) in held {
                by_ino.entry(ino).or_default().push(l);
            }
            let session = vol.lock_session().unwrap_or(0);
            for w in live {
                // Still held by another owner: not worth a transaction.
                let req = LockRequest { ino: w.ino, owner: LockOwner { session, owner: w.owner }, style: LockStyle::Posix, kind: w.kind, start: w.start, end: w.end, pid: w.pid };
                if lock_conflict(by_ino.get(&w.ino).map_or(&[][..], |v| v), &req).is_some() {
                    still.push(w);
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
