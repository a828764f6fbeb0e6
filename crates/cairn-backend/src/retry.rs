//! Retries with exponential backoff and full jitter, as a wrapper any
//! backend composes with: `Retrying::new(s3, RetryPolicy::cloud())`.
//!
//! Only [`ErrorKind::Transient`] failures are retried; everything else
//! (a missing object, access denied, bad bytes) returns at once, since the
//! same call would fail the same way.

use crate::{Backend, Capabilities, Error, ErrorKind, ObjectInfo, Result};
use std::time::{Duration, Instant};

/// How long and how often to retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The first wait; each later one may be up to twice the previous cap.
    pub first_delay: Duration,
    /// The largest wait between two attempts.
    pub max_delay: Duration,
    /// Reads (get, size, list) give up after this long.
    pub read_deadline: Duration,
    /// Writes (put, delete) give up after this long; `None`: never (the
    /// caller blocks until the store answers again).
    pub write_deadline: Option<Duration>,
}

impl RetryPolicy {
    /// For a remote store: reads and writes give up after a minute. Callers
    /// that must not lose a write retry it themselves (the cache's
    /// uploaders and the metadata shipper loop until it succeeds, so an
    /// outage blocks the uploads, and through them the writers), and a
    /// call they abandon never hangs for the whole outage.
    pub fn cloud() -> Self {
        RetryPolicy { first_delay: Duration::from_millis(100), max_delay: Duration::from_secs(10), read_deadline: Duration::from_secs(60), write_deadline: Some(Duration::from_secs(60)) }
    }

    /// For a local directory: transient errors there are interrupted calls
    /// and a full disk, so a short while, then the error.
    pub fn local() -> Self {
        RetryPolicy { first_delay: Duration::from_millis(50), max_delay: Duration::from_secs(2), read_deadline: Duration::from_secs(10), write_deadline: Some(Duration::from_secs(30)) }
    }

    /// For tests: quick, and bounded both ways.
    pub fn quick() -> Self {
        RetryPolicy { first_delay: Duration::from_millis(1), max_delay: Duration::from_millis(20), read_deadline: Duration::from_secs(5), write_deadline: Some(Duration::from_secs(5)) }
    }
}

/// A backend whose transient failures are retried (see the module docs).
pub struct Retrying<B> {
    inner: B,
    policy: RetryPolicy,
}

impl<B: Backend> Retrying<B> {
    /// Wraps `inner`.
    pub fn new(inner: B, policy: RetryPolicy) -> Self {
        Retrying { inner, policy }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    fn run<T>(&self, op: &str, name: &str, deadline: Option<Duration>, mut f: impl FnMut() -> Result<T>) -> Result<T> {
        let start = Instant::now();
        let mut cap = self.policy.first_delay;
        let mut attempt = 1u32;
        // The first failure's cause, when it says more than a later one: a
        // refused connection or an unknown host fails at once, and a last
        // attempt cut short by its timeout would report only "timed out".
        let mut first: Option<Error> = None;
        loop {
            match f() {
                Err(e) if e.kind() == ErrorKind::Transient => {
                    // Full jitter: a uniform wait in [0, cap], so that many
                    // clients that failed together do not retry together.
                    let wait = cap.mul_f64(rand::random::<f64>());
                    if deadline.is_some_and(|d| start.elapsed() + wait > d) {
                        let e = match first {
                            Some(f) if is_timeout(&e) && !is_timeout(&f) => f,
                            _ => e,
                        };
                        return Err(Error::new(ErrorKind::Transient, format!("{op} {name}: gave up after {attempt} attempts in {:.1} s", start.elapsed().as_secs_f64())).with_object(name).with_source(e));
                    }
                    if first.is_none() {
                        first = Some(Error::new(e.kind(), innermost(&e)));
                    }
                    if attempt == 1 || attempt.is_power_of_two() {
                        tracing::warn!("{op} {name} failed (attempt {attempt}), retrying: {e}");
                    }
                    std::thread::sleep(wait);
                    cap = (cap * 2).min(self.policy.max_delay);
                    attempt += 1;
                }
                r => return r,
            }
        }
    }
}

/// An error and its causes, one line.
fn full_text(e: &Error) -> String {
    let mut t = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        let s_text = s.to_string();
        if !t.contains(&s_text) {
            t.push_str(": ");
            t.push_str(&s_text);
        }
        src = s.source();
    }
    t
}

/// The deepest cause of an error: what the system said.
fn innermost(e: &Error) -> String {
    let mut last = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        last = s.to_string();
        src = s.source();
    }
    last
}

/// Whether an error (or a cause of it) is a timeout.
fn is_timeout(e: &Error) -> bool {
    let t = full_text(e).to_ascii_lowercase();
    t.contains("timed out") || t.contains("timeout")
}

impl<B: Backend + 'static> Backend for Retrying<B> {
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        self.run("put", name, self.policy.write_deadline, || self.inner.put(name, data))
    }
    fn put_if_absent(&self, name: &str, data: &[u8]) -> Result<()> {
        // A retried create that finds the object may be finding its own
        // first attempt (the reply was lost): AlreadyExists then is only
        // reported as such if the stored bytes differ.
        let mut tried = false;
        self.run("put", name, self.policy.write_deadline, || {
            let r = self.inner.put_if_absent(name, data);
            match r {
                Err(e) if e.kind() == ErrorKind::AlreadyExists && tried => match self.inner.get(name) {
                    Ok(stored) if stored == data => Ok(()),
                    _ => Err(e),
                },
                r => {
                    tried = true;
                    r
                }
            }
        })
    }
    fn conditional_updates(&self) -> bool {
        self.inner.conditional_updates()
    }
    fn get_tagged(&self, name: &str) -> Result<(Vec<u8>, String)> {
        self.run("get", name, Some(self.policy.read_deadline), || self.inner.get_tagged(name))
    }
    fn put_if_match(&self, name: &str, data: &[u8], tag: &str) -> Result<String> {
        // A retried update that finds the object changed may be finding its
        // own first attempt (the reply was lost): it succeeded if the object
        // now holds exactly these bytes.
        let mut tried = false;
        self.run("put", name, self.policy.write_deadline, || {
            let r = self.inner.put_if_match(name, data, tag);
            match r {
                Err(e) if e.kind() == ErrorKind::Changed && tried => match self.inner.get_tagged(name) {
                    Ok((stored, now)) if stored == data => Ok(now),
                    _ => Err(e),
                },
                r => {
                    tried = true;
                    r
                }
            }
        })
    }
    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.run("get", name, Some(self.policy.read_deadline), || self.inner.get_range(name, offset, len))
    }
    fn get_ranges(&self, name: &str, ranges: &[(u64, u64)]) -> Result<Vec<Vec<u8>>> {
        self.run("get", name, Some(self.policy.read_deadline), || self.inner.get_ranges(name, ranges))
    }
    fn get(&self, name: &str) -> Result<Vec<u8>> {
        self.run("get", name, Some(self.policy.read_deadline), || self.inner.get(name))
    }
    fn size(&self, name: &str) -> Result<u64> {
        self.run("head", name, Some(self.policy.read_deadline), || self.inner.size(name))
    }
    fn delete(&self, name: &str) -> Result<()> {
        self.run("delete", name, self.policy.write_deadline, || self.inner.delete(name))
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        self.run("list", prefix, Some(self.policy.read_deadline), || self.inner.list(prefix))
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn sync(&self) -> Result<()> {
        self.inner.sync()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn put_in_class(&self, name: &str, data: &[u8], class: crate::StorageClass) -> Result<()> {
        self.run("put", name, self.policy.write_deadline, || self.inner.put_in_class(name, data, class))
    }
    fn restore(&self, name: &str, days: u32, speed: crate::RestoreSpeed) -> Result<()> {
        // A restore sent twice is one restore (S3 answers the second with
        // 409 RestoreAlreadyInProgress or 200, both success): retried as a
        // read is. `Archived` and `Unsupported` are not transient.
        self.run("restore", name, Some(self.policy.read_deadline), || self.inner.restore(name, days, speed))
    }
    fn restore_state(&self, name: &str) -> Result<crate::ObjectState> {
        self.run("head", name, Some(self.policy.read_deadline), || self.inner.restore_state(name))
    }
    fn meter(&self) -> Option<std::sync::Arc<crate::Meter>> {
        self.inner.meter()
    }
    fn paid_by(&self, who: crate::Subsystem) -> Option<std::sync::Arc<dyn Backend>> {
        let inner = self.inner.paid_by(who)?;
        Some(std::sync::Arc::new(Retrying::new(inner, self.policy)))
    }
    fn sequential(&self) -> Option<&dyn crate::Sequential> {
        self.inner.sequential()
    }
}
