//! The chunk guard: batches that may hold ids of dead chunks (found by
//! hash, not yet referenced) against the cleaner that deletes dead chunk
//! rows (docs/frugal.md §5).
//!
//! A shared/exclusive lock whose shared side is `Send` (a batch crosses
//! rayon's threads) and may be taken again by a holder: shared holders never
//! wait for a waiting exclusive one, only for one that holds. The exclusive
//! side (the cleaner's commit, milliseconds) waits for a moment with no
//! batch under way; flush rounds leave such moments between them.

use parking_lot::{Condvar, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
pub(crate) struct ChunkGuard {
    /// Shared holders, and whether the exclusive side is held.
    state: Mutex<(usize, bool)>,
    cv: Condvar,
}

/// A shared hold; released on drop.
pub(crate) struct Shared<'a>(&'a ChunkGuard);

/// The exclusive hold; released on drop.
pub(crate) struct Exclusive<'a>(&'a ChunkGuard);

impl ChunkGuard {
    pub(crate) fn shared(&self) -> Shared<'_> {
        let mut st = self.state.lock();
        while st.1 {
            self.cv.wait(&mut st);
        }
        st.0 += 1;
        Shared(self)
    }

    /// The exclusive side, or None if no moment without a batch came
    /// within `patience`.
    pub(crate) fn exclusive(&self, patience: Duration) -> Option<Exclusive<'_>> {
        let until = Instant::now() + patience;
        let mut st = self.state.lock();
        while st.0 > 0 || st.1 {
            if self.cv.wait_until(&mut st, until).timed_out() && (st.0 > 0 || st.1) {
                return None;
            }
        }
        st.1 = true;
        Some(Exclusive(self))
    }
}

impl Drop for Shared<'_> {
    fn drop(&mut self) {
        let mut st = self.0.state.lock();
        st.0 -= 1;
        if st.0 == 0 {
            self.0.cv.notify_all();
        }
    }
}

impl Drop for Exclusive<'_> {
    fn drop(&mut self) {
        self.0.state.lock().1 = false;
        self.0.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn exclusive_waits_for_shared_holders_and_shared_may_nest() {
        let g = ChunkGuard::default();
        let a = g.shared();
        let b = g.shared(); // nested in one thread: no deadlock
        assert!(g.exclusive(Duration::from_millis(20)).is_none(), "exclusive while batches hold it");
        drop(a);
        drop(b);
        let x = g.exclusive(Duration::from_millis(20)).expect("free now");
        let blocked = AtomicBool::new(true);
        std::thread::scope(|s| {
            s.spawn(|| {
                let _s = g.shared();
                assert!(!blocked.load(Ordering::SeqCst), "a batch started while the cleaner committed");
            });
            std::thread::sleep(Duration::from_millis(30));
            blocked.store(false, Ordering::SeqCst);
            drop(x);
        });
    }
}
