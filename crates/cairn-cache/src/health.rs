//! What a part that retries in the background reports: its last failure,
//! until its next success.
//!
//! The disk cache's uploaders keep a [`Slot`] (`CachedBackend::upload_problem`),
//! as the engine's flusher, metadata shipping and lease keep theirs
//! (`cairn_engine::health`, which re-exports these two types and tells a
//! mount's health from them).

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};

/// A failure that has not been followed by a success yet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// The part failing: `flush`, `upload`, `metadata`, `lease`.
    pub what: String,
    /// The last error.
    pub error: String,
    /// Unix seconds of the first failure of this run of failures.
    pub since: u64,
    /// Failures in a row.
    pub failures: u64,
}

/// The last failure of one background part, if it has not succeeded since.
#[derive(Debug, Default)]
pub struct Slot {
    /// Whether `problem` holds something: a success checks this first, so
    /// the path that works takes no lock.
    set: AtomicBool,
    problem: Mutex<Option<Problem>>,
}

impl Slot {
    /// Records a failure of `what`.
    pub fn fail(&self, what: &str, error: &dyn std::fmt::Display) {
        let mut p = self.problem.lock();
        match p.as_mut() {
            Some(p) => {
                p.error = error.to_string();
                p.failures += 1;
            }
            None => *p = Some(Problem { what: what.to_string(), error: error.to_string(), since: now_secs(), failures: 1 }),
        }
        self.set.store(true, Ordering::Release);
    }

    /// Records a success: the problem, if any, is over.
    pub fn ok(&self) {
        if self.set.load(Ordering::Acquire) {
            *self.problem.lock() = None;
            self.set.store(false, Ordering::Release);
        }
    }

    /// The current problem.
    pub fn get(&self) -> Option<Problem> {
        if !self.set.load(Ordering::Acquire) {
            return None;
        }
        self.problem.lock().clone()
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_success_clears_a_run_of_failures() {
        let s = Slot::default();
        assert_eq!(s.get(), None);
        s.ok();
        s.fail("upload", &"connection refused");
        s.fail("upload", &"timed out");
        let p = s.get().unwrap();
        assert_eq!((p.what.as_str(), p.error.as_str(), p.failures), ("upload", "timed out", 2));
        s.ok();
        assert_eq!(s.get(), None);
        s.fail("upload", &"again");
        assert_eq!(s.get().unwrap().failures, 1, "a new run counts from one");
    }
}
