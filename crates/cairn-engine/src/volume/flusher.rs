//! The background flusher: the thread that runs a flush round when woken
//! or every half second, and the signal that wakes it.

use super::Volume;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Wakes the background flusher.
pub(crate) struct FlushSignal {
    pub(super) state: Mutex<(bool, bool)>, // (poked, stopping)
    pub(super) cv: Condvar,
    /// Bumped after every finished flush round; writers blocked on the
    /// journal limit wait for it.
    pub(super) done: Mutex<u64>,
    pub(super) done_cv: Condvar,
}

impl FlushSignal {
    pub(crate) fn poke(&self) {
        let mut s = self.state.lock();
        s.0 = true;
        self.cv.notify_one();
    }
}

impl Volume {
    pub(super) fn start_flusher(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let sig = self.signal.clone();
        let h = std::thread::Builder::new()
            .name("cairn-flusher".into())
            .spawn(move || loop {
                {
                    let mut s = sig.state.lock();
                    if !s.0 && !s.1 {
                        sig.cv.wait_for(&mut s, Duration::from_millis(500));
                    }
                    if s.1 {
                        return;
                    }
                    s.0 = false;
                }
                let Some(vol) = weak.upgrade() else { return };
                if vol.stall.flusher_paused.load(Ordering::SeqCst) {
                    continue;
                }
                vol.release_old_held_pack();
                // Under journal pressure nothing is held back: a held tail
                // pins every later journal segment (a program writing an open
                // file from the end backwards would otherwise fill the
                // journal and block all writers for good).
                let pressed = vol.journal.bytes() > vol.opts.journal_limit / 2;
                match vol.flush_round_background(pressed) {
                    Ok(_) => vol.problems.flush.ok(),
                    Err(e) => {
                        tracing::error!("background flush failed (will retry): {e}");
                        vol.problems.flush.fail("flush", &e);
                        std::thread::sleep(Duration::from_millis(200));
                    }
                }
            })
            .expect("spawning the flusher thread");
        *self.flusher.lock() = Some(h);
    }
}
