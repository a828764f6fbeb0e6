//! Time for the emulated drive: virtual (tests) or real (benchmarks).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A clock that moves only when told to. Clones share the same time, so a
/// test (or a benchmark harness) holds one handle and the drive another.
#[derive(Debug, Clone, Default)]
pub struct VirtualClock(Arc<AtomicU64>);

impl VirtualClock {
    /// A clock at time 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Seconds since the clock was created.
    pub fn now(&self) -> f64 {
        self.0.load(Ordering::SeqCst) as f64 / 1e9
    }

    /// Moves the clock forward by `secs` (a host spending time computing).
    pub fn advance(&self, secs: f64) {
        if secs > 0.0 {
            self.0
                .fetch_add((secs * 1e9).round() as u64, Ordering::SeqCst);
        }
    }

    /// Moves the clock forward to `t` if it is earlier.
    pub fn advance_to(&self, t: f64) {
        let target = (t * 1e9).round() as u64;
        self.0.fetch_max(target, Ordering::SeqCst);
    }
}

/// The emulated drive's notion of time, chosen when it is opened.
#[derive(Debug, Clone)]
pub enum Clock {
    /// Time advances only in the model: an operation that takes the drive
    /// 3 s moves the clock by 3 s and returns at once.
    Virtual(VirtualClock),
    /// Wall-clock time: an operation that takes the drive 3 s sleeps for
    /// the rest of those 3 s, so throughput is real.
    Real(Instant),
}

impl Clock {
    /// A new virtual clock at 0.
    pub fn virtual_clock() -> Clock {
        Clock::Virtual(VirtualClock::new())
    }

    /// A real clock starting now.
    pub fn real() -> Clock {
        Clock::Real(Instant::now())
    }

    /// Seconds since the clock started.
    pub fn now(&self) -> f64 {
        match self {
            Clock::Virtual(v) => v.now(),
            Clock::Real(start) => start.elapsed().as_secs_f64(),
        }
    }

    /// Waits until `t`: moves a virtual clock there, sleeps on a real one.
    pub fn wait_until(&self, t: f64) {
        match self {
            Clock::Virtual(v) => v.advance_to(t),
            Clock::Real(start) => {
                let now = start.elapsed().as_secs_f64();
                if t > now {
                    std::thread::sleep(Duration::from_secs_f64(t - now));
                }
            }
        }
    }

    /// Spends `secs` of host time (advances a virtual clock, sleeps on a real one).
    pub fn advance(&self, secs: f64) {
        let t = self.now() + secs;
        self.wait_until(t);
    }
}
