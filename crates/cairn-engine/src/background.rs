//! A thread that runs a round every interval until stopped: what every
//! background task of an open volume (metadata shipper, cleaner, biller)
//! runs on.

use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// A thread that runs a round every interval until stopped: the metadata
/// shipper, the cleaner, a read-only mount's biller.
pub struct Background {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Background {
    /// Runs `round` every `interval` (the first after one interval) on a
    /// thread named `name`, until stopped or until `round` returns false.
    pub(crate) fn start(name: &str, interval: Duration, mut round: impl FnMut() -> bool + Send + 'static) -> Background {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let st = stop.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || loop {
                {
                    let mut s = st.0.lock();
                    if !*s {
                        st.1.wait_for(&mut s, interval);
                    }
                    if *s {
                        return;
                    }
                }
                if !round() {
                    return;
                }
            })
            .unwrap_or_else(|e| panic!("spawning {name}: {e}"));
        Background { stop, thread: Mutex::new(Some(thread)) }
    }

    /// Stops the thread (after the round under way).
    pub fn stop(&self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(h) = self.thread.lock().take() {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}
