//! The flusher, one part of a volume (docs/design.md "The volume's
//! parts"): what flush rounds hold and nothing else does (their lock,
//! their marks in a shared store, the chunking windows, the pack buffers,
//! the upload threads), and the background thread that runs a round when
//! woken or every half second, with the signal that wakes it. The rounds
//! themselves are flush.rs.

use super::{buffers, workers, Volume};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What flush rounds hold, held by the volume as `vol.flusher`.
pub(crate) struct Flusher {
    /// One round at a time (the flusher's, a sync's, a close's, an edit's).
    pub(crate) mutex: Mutex<()>,
    /// A flush round under way is recorded in the shared store
    /// (`MetaStore::flush_started`; only under `mutex`).
    pub(crate) marked: AtomicBool,
    /// When this mount last deleted its journal's marks, and the flush
    /// count then (None: not yet); see `Volume::trim_marks`.
    pub(crate) marks_trimmed: Mutex<Option<(Instant, u64)>>,
    /// Chunking windows of the flush, kept for reuse.
    pub(crate) windows: buffers::BufferPool,
    /// Pack builders' buffers, given back by the upload threads.
    pub(crate) pack_buffers: Arc<buffers::BufferPool>,
    /// The threads pack uploads run on (four: two uploads in flight per
    /// round, with a second round, an fsync's or the cleaner's, beside the
    /// flusher's).
    pub(crate) uploader: workers::Workers,
    /// Wakes the background thread; writers wait on its round count.
    pub(crate) signal: Arc<FlushSignal>,
    /// The background thread (None: not started, or stopped).
    pub(super) thread: Mutex<Option<JoinHandle<()>>>,
}

impl Flusher {
    pub(super) fn new() -> Flusher {
        Flusher {
            mutex: Mutex::new(()),
            marked: AtomicBool::new(false),
            marks_trimmed: Mutex::new(None),
            // Two windows are live at once (one cut while the other is hashed).
            windows: buffers::BufferPool::new(2),
            // One building, two uploading.
            pack_buffers: Arc::new(buffers::BufferPool::new(3)),
            uploader: workers::Workers::new("cairn-upload", 4),
            signal: Arc::new(FlushSignal { state: Mutex::new((false, false)), cv: Condvar::new(), done: Mutex::new(0), done_cv: Condvar::new() }),
            thread: Mutex::new(None),
        }
    }
}

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
        let sig = self.flusher.signal.clone();
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
        *self.flusher.thread.lock() = Some(h);
    }
}
