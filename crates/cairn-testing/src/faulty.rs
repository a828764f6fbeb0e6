use cairn_backend::{Backend, Capabilities, Error, ErrorKind, ObjectInfo, Result};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Which faults to inject, as fractions of requests (each request draws
/// once; the fractions are checked in the order of the fields).
#[derive(Clone, Copy, Debug)]
pub struct FaultPlan {
    /// Fail at once with a transient error; nothing is done.
    pub fail: f64,
    /// Hang for `timeout_after`, then fail as timed out; nothing is done.
    pub timeout: f64,
    /// How long a timed-out request hangs.
    pub timeout_after: Duration,
    /// Writes only: carried out, but the caller gets a transient error (the
    /// reply was lost), so a retry repeats a write that already happened.
    pub lost_reply: f64,
    /// Carried out after waiting `slow_by`.
    pub slow: f64,
    /// How long a slow request waits.
    pub slow_by: Duration,
}

impl FaultPlan {
    /// No faults.
    pub fn none() -> Self {
        FaultPlan { fail: 0.0, timeout: 0.0, timeout_after: Duration::ZERO, lost_reply: 0.0, slow: 0.0, slow_by: Duration::ZERO }
    }

    /// `rate` of all requests go wrong, split between quick failures,
    /// timeouts (of `timeout_after`) and lost replies; as many again are slow.
    pub fn flaky(rate: f64, timeout_after: Duration) -> Self {
        FaultPlan { fail: rate * 0.5, timeout: rate * 0.25, timeout_after, lost_reply: rate * 0.25, slow: rate, slow_by: timeout_after / 4 }
    }
}

/// What a [`FaultyBackend`] has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Requests seen.
    pub requests: u64,
    /// Failed at once.
    pub failed: u64,
    /// Hung, then failed.
    pub timed_out: u64,
    /// Done, reply lost.
    pub lost_replies: u64,
    /// Done slowly.
    pub slowed: u64,
    /// Refused because the store was down.
    pub refused_while_down: u64,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    failed: AtomicU64,
    timed_out: AtomicU64,
    lost_replies: AtomicU64,
    slowed: AtomicU64,
    refused_while_down: AtomicU64,
}

/// A backend that misbehaves on purpose (see the crate docs).
pub struct FaultyBackend<B> {
    inner: B,
    plan: Mutex<FaultPlan>,
    rng: Mutex<StdRng>,
    down: AtomicBool,
    n: Counters,
}

enum Fate {
    Fail,
    TimeOut(Duration),
    LoseReply,
    Slow(Duration),
    Fine,
}

impl<B: Backend> FaultyBackend<B> {
    /// Wraps `inner`; the same `seed` gives the same sequence of fates.
    pub fn new(inner: B, plan: FaultPlan, seed: u64) -> Self {
        FaultyBackend { inner, plan: Mutex::new(plan), rng: Mutex::new(StdRng::seed_from_u64(seed)), down: AtomicBool::new(false), n: Counters::default() }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// Changes the faults from now on.
    pub fn set_plan(&self, plan: FaultPlan) {
        *self.plan.lock() = plan;
    }

    /// Takes the whole store down (every request fails, as a refused
    /// connection would) or brings it back.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// Counts so far.
    pub fn stats(&self) -> FaultStats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        FaultStats {
            requests: g(&self.n.requests),
            failed: g(&self.n.failed),
            timed_out: g(&self.n.timed_out),
            lost_replies: g(&self.n.lost_replies),
            slowed: g(&self.n.slowed),
            refused_while_down: g(&self.n.refused_while_down),
        }
    }

    fn fate(&self, write: bool) -> Fate {
        let p = *self.plan.lock();
        let r: f64 = self.rng.lock().gen();
        let mut edge = p.fail;
        if r < edge {
            return Fate::Fail;
        }
        edge += p.timeout;
        if r < edge {
            return Fate::TimeOut(p.timeout_after);
        }
        if write {
            edge += p.lost_reply;
            if r < edge {
                return Fate::LoseReply;
            }
        }
        edge += p.slow;
        if r < edge {
            return Fate::Slow(p.slow_by);
        }
        Fate::Fine
    }

    fn call<T>(&self, op: &str, name: &str, write: bool, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.n.requests.fetch_add(1, Ordering::Relaxed);
        let transient = |what: &str| Error::new(ErrorKind::Transient, format!("{op} {name}: {what} (injected)")).with_object(name);
        if self.down.load(Ordering::SeqCst) {
            self.n.refused_while_down.fetch_add(1, Ordering::Relaxed);
            return Err(transient("connection refused, the store is down"));
        }
        match self.fate(write) {
            Fate::Fail => {
                self.n.failed.fetch_add(1, Ordering::Relaxed);
                Err(transient("503 Service Unavailable"))
            }
            Fate::TimeOut(d) => {
                std::thread::sleep(d);
                self.n.timed_out.fetch_add(1, Ordering::Relaxed);
                Err(transient("timed out"))
            }
            Fate::LoseReply => {
                f()?;
                self.n.lost_replies.fetch_add(1, Ordering::Relaxed);
                Err(transient("connection reset after the request was carried out"))
            }
            Fate::Slow(d) => {
                std::thread::sleep(d);
                self.n.slowed.fetch_add(1, Ordering::Relaxed);
                f()
            }
            Fate::Fine => f(),
        }
    }
}

impl<B: Backend> Backend for FaultyBackend<B> {
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        self.call("put", name, true, || self.inner.put(name, data))
    }
    fn put_if_absent(&self, name: &str, data: &[u8]) -> Result<()> {
        self.call("put", name, true, || self.inner.put_if_absent(name, data))
    }
    fn conditional_updates(&self) -> bool {
        self.inner.conditional_updates()
    }
    fn get_tagged(&self, name: &str) -> Result<(Vec<u8>, String)> {
        self.call("get", name, false, || self.inner.get_tagged(name))
    }
    fn put_if_match(&self, name: &str, data: &[u8], tag: &str) -> Result<String> {
        self.call("put", name, true, || self.inner.put_if_match(name, data, tag))
    }
    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.call("get", name, false, || self.inner.get_range(name, offset, len))
    }
    fn get(&self, name: &str) -> Result<Vec<u8>> {
        self.call("get", name, false, || self.inner.get(name))
    }
    fn size(&self, name: &str) -> Result<u64> {
        self.call("head", name, false, || self.inner.size(name))
    }
    fn delete(&self, name: &str) -> Result<()> {
        self.call("delete", name, true, || self.inner.delete(name))
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        self.call("list", prefix, false, || self.inner.list(prefix))
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn sync(&self) -> Result<()> {
        self.inner.sync()
    }
    fn describe(&self) -> String {
        format!("faulty:{}", self.inner.describe())
    }
    fn put_in_class(&self, name: &str, data: &[u8], class: cairn_backend::StorageClass) -> Result<()> {
        self.call("put", name, true, || self.inner.put_in_class(name, data, class))
    }
    fn restore(&self, name: &str, days: u32, speed: cairn_backend::RestoreSpeed) -> Result<()> {
        self.call("restore", name, true, || self.inner.restore(name, days, speed))
    }
    fn restore_state(&self, name: &str) -> Result<cairn_backend::ObjectState> {
        self.call("head", name, false, || self.inner.restore_state(name))
    }
    fn meter(&self) -> Option<std::sync::Arc<cairn_backend::Meter>> {
        self.inner.meter()
    }
    fn sequential(&self) -> Option<&dyn cairn_backend::Sequential> {
        self.inner.sequential()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryBackend;
    use cairn_backend::{RetryPolicy, Retrying};

    /// Behind the retry wrapper a store that fails a third of its requests
    /// (quick failures, hangs, lost replies) still passes every check of the
    /// contract: no injected fault is visible.
    #[test]
    fn conformance_behind_retries_with_a_third_of_requests_failing() {
        let faulty = FaultyBackend::new(MemoryBackend::new(), FaultPlan::flaky(0.33, Duration::from_millis(2)), 7);
        let b = Retrying::new(faulty, RetryPolicy::quick());
        cairn_backend::conformance::run_all(&b);
        let s = b.inner().stats();
        assert!(s.failed > 0 && s.timed_out > 0 && s.lost_replies > 0, "the plan injected too little to prove anything: {s:?}");
    }

    /// Without the wrapper the faults show, so the test above means something.
    #[test]
    fn faults_are_visible_without_retries() {
        let b = FaultyBackend::new(MemoryBackend::new(), FaultPlan { fail: 1.0, ..FaultPlan::none() }, 1);
        let e = b.put("a", b"x").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Transient);
        assert!(b.inner().get("a").is_err(), "a failed request was carried out");
        let lost = FaultyBackend::new(MemoryBackend::new(), FaultPlan { lost_reply: 1.0, ..FaultPlan::none() }, 1);
        assert!(lost.put("a", b"x").is_err());
        assert_eq!(lost.inner().get("a").unwrap(), b"x", "a lost reply's request was not carried out");
    }

    /// Down, reads give up at the deadline with a transient error naming
    /// the object; back up, the same call succeeds.
    #[test]
    fn an_outage_delays_writes_and_fails_reads_at_their_deadline() {
        let faulty = FaultyBackend::new(MemoryBackend::new(), FaultPlan::none(), 3);
        let policy = RetryPolicy { read_deadline: Duration::from_millis(100), write_deadline: None, ..RetryPolicy::quick() };
        let b = std::sync::Arc::new(Retrying::new(faulty, policy));
        b.put("x", b"1").unwrap();
        b.inner().set_down(true);
        let e = b.get("x").unwrap_err();
        assert_eq!((e.kind(), e.object()), (ErrorKind::Transient, Some("x")), "{e}");
        // A write blocks through the outage and lands once the store is back.
        let b2 = b.clone();
        let writer = std::thread::spawn(move || b2.put("y", b"2"));
        std::thread::sleep(Duration::from_millis(200));
        assert!(!writer.is_finished(), "a write gave up during the outage");
        b.inner().set_down(false);
        writer.join().unwrap().unwrap();
        assert_eq!(b.get("y").unwrap(), b"2");
        assert!(b.inner().stats().refused_while_down > 2);
    }
}
