//! Counting the requests a remote store is sent, for the bill (docs/cloud.md
//! §6): a [`Meter`] holds counts of requests and payload bytes by
//! [`Subsystem`] (who asked) and [`RequestKind`] (what the store bills).
//!
//! Who asks is the handle a request is sent through: a metering store's
//! requests count for [`Subsystem::Other`], and [`Backend::paid_by`] gives
//! a handle on the same store (same connection, same meter) whose
//! requests count for another subsystem. The engine makes each payer's
//! handle once ([`Payers`]) and sends each request through the one of the
//! subsystem that pays: the uploaders `Write`, a read miss `ReadMiss`, gc
//! `Gc` (and a read miss inside gc stays gc's, since gc hands its payer
//! down), and so on (docs/design.md, "Who pays and for which file").
//! [`S3Backend`](crate::S3Backend) counts every HTTP request it sends
//! (each multipart part, each page of a listing, each failed attempt);
//! [`Metered`] counts the calls of any other backend the same way, one
//! request per call, for tests and injected stores.
//!
//! ```
//! use cairn_backend::{meter::{Payers, RequestKind, Subsystem}, Backend, LocalBackend, Metered};
//! use std::sync::Arc;
//! let dir = tempfile::tempdir().unwrap();
//! let b = Metered::new(LocalBackend::create(dir.path()).unwrap());
//! let meter = b.meter().clone();
//! let paid = Payers::new(Arc::new(b));
//! paid.get(Subsystem::Write).put("packs/00/a", b"hello").unwrap();
//! let n = meter.take();
//! assert_eq!(n.get(Subsystem::Write, RequestKind::Put).requests, 1);
//! assert_eq!(n.get(Subsystem::Write, RequestKind::Put).bytes, 5);
//! assert!(meter.take().is_empty());
//! ```

use crate::{Backend, Capabilities, ObjectInfo, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Who a request is made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Subsystem {
    /// Pack uploads (the cache's uploaders, flushes with remote durability).
    Write,
    /// Reads that missed the caches.
    ReadMiss,
    /// Read-ahead.
    Prefetch,
    /// Garbage collection (reading live chunks, writing new packs).
    Gc,
    /// Metadata versions, the lease, trash.
    Metadata,
    /// Requests sent through a store itself rather than a payer's handle
    /// (the config object, fsck, commands).
    Other,
}

impl Subsystem {
    /// Every subsystem, in order.
    pub const ALL: [Subsystem; 6] = [Subsystem::Write, Subsystem::ReadMiss, Subsystem::Prefetch, Subsystem::Gc, Subsystem::Metadata, Subsystem::Other];

    /// Its name in the bill (`write`, `read_miss`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Subsystem::Write => "write",
            Subsystem::ReadMiss => "read_miss",
            Subsystem::Prefetch => "prefetch",
            Subsystem::Gc => "gc",
            Subsystem::Metadata => "metadata",
            Subsystem::Other => "other",
        }
    }

    /// The subsystem of a name from [`Subsystem::name`].
    pub fn from_name(s: &str) -> Option<Subsystem> {
        Self::ALL.into_iter().find(|x| x.name() == s)
    }
}

/// A request as a store bills it (defined with the prices, in `cairn-model`).
pub use cairn_model::prices::RequestKind;

/// Requests and payload bytes of one (subsystem, kind).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Requests sent (failed ones included).
    pub requests: u64,
    /// Payload bytes: sent for PUT and POST, received for the others.
    pub bytes: u64,
}

const S: usize = Subsystem::ALL.len();
const K: usize = RequestKind::ALL.len();

/// A copy of a meter's counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestCounts {
    cells: [[Tally; K]; S],
}

impl RequestCounts {
    /// The counts of one (subsystem, kind).
    pub fn get(&self, s: Subsystem, k: RequestKind) -> Tally {
        self.cells[s as usize][k as usize]
    }

    /// Adds `requests` and `bytes` to one (subsystem, kind).
    pub fn add(&mut self, s: Subsystem, k: RequestKind, requests: u64, bytes: u64) {
        let c = &mut self.cells[s as usize][k as usize];
        c.requests += requests;
        c.bytes += bytes;
    }

    /// Adds every count of `other`.
    pub fn add_all(&mut self, other: &RequestCounts) {
        for (s, k, t) in other.iter() {
            self.add(s, k, t.requests, t.bytes);
        }
    }

    /// Every (subsystem, kind) with a request or a byte.
    pub fn iter(&self) -> impl Iterator<Item = (Subsystem, RequestKind, Tally)> + '_ {
        Subsystem::ALL
            .into_iter()
            .flat_map(|s| RequestKind::ALL.into_iter().map(move |k| (s, k)))
            .map(|(s, k)| (s, k, self.get(s, k)))
            .filter(|(_, _, t)| t.requests > 0 || t.bytes > 0)
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.iter().next().is_none()
    }

    /// Requests of one kind, over every subsystem.
    pub fn total(&self, k: RequestKind) -> Tally {
        Subsystem::ALL.into_iter().fold(Tally::default(), |a, s| {
            let t = self.get(s, k);
            Tally { requests: a.requests + t.requests, bytes: a.bytes + t.bytes }
        })
    }
}

/// Live counters, shared by every backend that counts into them.
///
/// The counts only grow (monitoring reads them as they are: [`Meter::lifetime`]);
/// the bill takes what it has not taken yet ([`Meter::take`]), which is
/// the counts less a high-water mark of what was taken.
#[derive(Debug, Default)]
pub struct Meter {
    /// (requests, bytes) by subsystem and kind, since the meter was made.
    cells: [[[AtomicU64; 2]; K]; S],
    /// How much of each cell [`Meter::take`] has handed out (less what was
    /// given back).
    taken: [[[AtomicU64; 2]; K]; S],
    /// Failed requests by kind (see [`Meter::record_error`]).
    errors: [AtomicU64; K],
}

impl Meter {
    /// A meter at zero.
    pub fn new() -> Meter {
        Meter::default()
    }

    /// Counts one request of `kind` made for `who`.
    pub fn record(&self, who: Subsystem, kind: RequestKind, bytes: u64) {
        self.record_as(who, kind, 1, bytes);
    }

    /// Counts `requests` requests of `kind` made for `who`.
    pub fn record_as(&self, who: Subsystem, kind: RequestKind, requests: u64, bytes: u64) {
        let c = &self.cells[who as usize][kind as usize];
        if requests > 0 {
            c[0].fetch_add(requests, Ordering::Relaxed);
        }
        if bytes > 0 {
            c[1].fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// Counts one failed request of `kind` (it was counted by [`Meter::record`]
    /// too, when it was sent).
    pub fn record_error(&self, kind: RequestKind) {
        self.errors[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Failed requests of `kind` since the meter was made.
    pub fn errors(&self, kind: RequestKind) -> u64 {
        self.errors[kind as usize].load(Ordering::Relaxed)
    }

    /// The counts not taken yet.
    pub fn snapshot(&self) -> RequestCounts {
        self.collect(|c, t| c.load(Ordering::Relaxed).saturating_sub(t.load(Ordering::Relaxed)))
    }

    /// Every count since the meter was made, taken or not (they only grow).
    pub fn lifetime(&self) -> RequestCounts {
        self.collect(|c, _| c.load(Ordering::Relaxed))
    }

    /// The counts not taken yet, marking them taken: each request counted
    /// is returned by exactly one `take` (one that races a request returns
    /// it or leaves it for the next; two racing takes split the counts, as
    /// the high-water mark only moves up).
    pub fn take(&self) -> RequestCounts {
        self.collect(|c, t| {
            let now = c.load(Ordering::Relaxed);
            now.saturating_sub(t.fetch_max(now, Ordering::Relaxed))
        })
    }

    /// Gives counts back (taken, then not saved): the next `take` returns
    /// them again.
    pub fn add(&self, counts: &RequestCounts) {
        for (s, k, t) in counts.iter() {
            let cell = &self.taken[s as usize][k as usize];
            for (i, n) in [t.requests, t.bytes].into_iter().enumerate() {
                let _ = cell[i].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some(v.saturating_sub(n)));
            }
        }
    }

    fn collect(&self, f: impl Fn(&AtomicU64, &AtomicU64) -> u64) -> RequestCounts {
        let mut out = RequestCounts::default();
        for s in Subsystem::ALL {
            for k in RequestKind::ALL {
                let (c, t) = (&self.cells[s as usize][k as usize], &self.taken[s as usize][k as usize]);
                out.cells[s as usize][k as usize] = Tally { requests: f(&c[0], &t[0]), bytes: f(&c[1], &t[1]) };
            }
        }
        out
    }
}

/// The meter of a place (e.g. one bucket and prefix at one endpoint), the
/// same for every backend of this process that names it: the short-lived
/// handles a command opens to probe a volume count into the meter its
/// long-lived one reports.
pub fn shared(place: &str) -> Arc<Meter> {
    static ALL: OnceLock<Mutex<HashMap<String, Arc<Meter>>>> = OnceLock::new();
    let mut m = ALL.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    m.entry(place.to_string()).or_default().clone()
}

/// One store's handles by payer ([`Backend::paid_by`]), made once: a
/// request is sent through the handle of the subsystem that pays for it,
/// at no cost more than a call through the store itself.
#[derive(Clone)]
pub struct Payers {
    by: [Arc<dyn Backend>; S],
}

impl Payers {
    /// The handles of `store` (itself for every payer where it bills
    /// nothing by subsystem).
    pub fn new(store: Arc<dyn Backend>) -> Payers {
        Payers { by: Subsystem::ALL.map(|who| store.paid_by(who).unwrap_or_else(|| store.clone())) }
    }

    /// The handle whose requests `who` pays for.
    pub fn get(&self, who: Subsystem) -> &Arc<dyn Backend> {
        &self.by[who as usize]
    }
}

/// `store`'s handle for `who`, made now: for work that is not per
/// request (a lease renewal, a bill), where keeping [`Payers`] is not
/// worth it. Where the store bills nothing, `store` itself.
pub fn paying(store: &dyn Backend, who: Subsystem) -> Paying<'_> {
    match store.paid_by(who) {
        Some(h) => Paying::Handle(h),
        None => Paying::Same(store),
    }
}

/// See [`paying`]: derefs to the handle.
pub enum Paying<'a> {
    /// A store that bills nothing by subsystem.
    Same(&'a dyn Backend),
    /// The payer's handle.
    Handle(Arc<dyn Backend>),
}

impl<'a> std::ops::Deref for Paying<'a> {
    type Target = dyn Backend + 'a;
    fn deref(&self) -> &Self::Target {
        match self {
            Paying::Same(b) => *b,
            Paying::Handle(h) => h.as_ref(),
        }
    }
}

impl std::fmt::Debug for Payers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Payers({})", self.by[Subsystem::Other as usize].describe())
    }
}

/// Any backend with its calls counted into a [`Meter`], one request per
/// call (a listing: one per 1,000 names, at least one), failed calls
/// included. [`S3Backend`](crate::S3Backend) counts on its own, per HTTP
/// request; this is for the others (an in-memory store in tests).
/// Its calls count for [`Subsystem::Other`]; [`Backend::paid_by`] gives a
/// handle on the same store and meter counting for another subsystem.
pub struct Metered<B> {
    inner: Arc<B>,
    meter: Arc<Meter>,
    who: Subsystem,
}

impl<B: Backend> Metered<B> {
    /// Counts `inner`'s calls into a meter of its own.
    pub fn new(inner: B) -> Self {
        Metered { inner: Arc::new(inner), meter: Arc::new(Meter::new()), who: Subsystem::Other }
    }

    /// The counts.
    pub fn meter(&self) -> &Arc<Meter> {
        &self.meter
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }
}

/// Pages of a listing of `n` names: S3 returns at most 1,000 a page, and
/// even an empty listing is one request.
pub fn list_pages(n: usize) -> u64 {
    n.div_ceil(1000).max(1) as u64
}

impl<B: Backend + 'static> Backend for Metered<B> {
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        self.meter.record(self.who, RequestKind::Put, data.len() as u64);
        self.inner.put(name, data)
    }
    fn conditional_updates(&self) -> bool {
        self.inner.conditional_updates()
    }
    fn get_tagged(&self, name: &str) -> Result<(Vec<u8>, String)> {
        let r = self.inner.get_tagged(name);
        self.meter.record(self.who, RequestKind::Get, r.as_ref().map_or(0, |d| d.0.len() as u64));
        r
    }
    fn put_if_match(&self, name: &str, data: &[u8], tag: &str) -> Result<String> {
        self.meter.record(self.who, RequestKind::Put, data.len() as u64);
        self.inner.put_if_match(name, data, tag)
    }
    fn put_if_absent(&self, name: &str, data: &[u8]) -> Result<()> {
        self.meter.record(self.who, RequestKind::Put, data.len() as u64);
        self.inner.put_if_absent(name, data)
    }
    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        let r = self.inner.get_range(name, offset, len);
        self.meter.record(self.who, RequestKind::Get, r.as_ref().map_or(0, |d| d.len() as u64));
        r
    }
    fn get_ranges(&self, name: &str, ranges: &[(u64, u64)]) -> Result<Vec<Vec<u8>>> {
        // One request, as the store's own get_ranges is.
        let r = self.inner.get_ranges(name, ranges);
        self.meter.record(self.who, RequestKind::Get, r.as_ref().map_or(0, |d| d.iter().map(|b| b.len() as u64).sum()));
        r
    }
    fn get(&self, name: &str) -> Result<Vec<u8>> {
        let r = self.inner.get(name);
        self.meter.record(self.who, RequestKind::Get, r.as_ref().map_or(0, |d| d.len() as u64));
        r
    }
    fn size(&self, name: &str) -> Result<u64> {
        self.meter.record(self.who, RequestKind::Head, 0);
        self.inner.size(name)
    }
    fn delete(&self, name: &str) -> Result<()> {
        self.meter.record(self.who, RequestKind::Delete, 0);
        self.inner.delete(name)
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let r = self.inner.list(prefix);
        self.meter.record_as(self.who, RequestKind::List, list_pages(r.as_ref().map_or(0, Vec::len)), 0);
        r
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
        self.meter.record(self.who, RequestKind::Put, data.len() as u64);
        self.inner.put_in_class(name, data, class)
    }
    fn restore(&self, name: &str, days: u32, speed: crate::RestoreSpeed) -> Result<()> {
        // Its own priced request, not a POST (cairn_model's prices).
        self.meter.record(self.who, RequestKind::Restore, 0);
        self.inner.restore(name, days, speed)
    }
    fn restore_state(&self, name: &str) -> Result<crate::ObjectState> {
        self.meter.record(self.who, RequestKind::Head, 0);
        self.inner.restore_state(name)
    }
    fn meter(&self) -> Option<Arc<Meter>> {
        Some(self.meter.clone())
    }
    fn sequential(&self) -> Option<&dyn crate::Sequential> {
        self.inner.sequential()
    }
    fn paid_by(&self, who: Subsystem) -> Option<Arc<dyn Backend>> {
        Some(Arc::new(Metered { inner: self.inner.clone(), meter: self.meter.clone(), who }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_payer_has_its_handle_on_one_meter() {
        let dir = tempfile::tempdir().unwrap();
        let b = Metered::new(crate::LocalBackend::create(dir.path()).unwrap());
        let meter = b.meter().clone();
        let b = Arc::new(b);
        let paid = Payers::new(b.clone());
        b.put("packs/a", b"abc").unwrap();
        paid.get(Subsystem::Gc).put("packs/b", b"de").unwrap();
        assert_eq!(paid.get(Subsystem::ReadMiss).get_range("packs/b", 0, 1).unwrap(), b"d");
        assert_eq!(paid.get(Subsystem::Gc).list("packs/").unwrap().len(), 2);
        let n = meter.take();
        assert_eq!(n.get(Subsystem::Other, RequestKind::Put), Tally { requests: 1, bytes: 3 });
        assert_eq!(n.get(Subsystem::Gc, RequestKind::Put), Tally { requests: 1, bytes: 2 });
        assert_eq!(n.get(Subsystem::ReadMiss, RequestKind::Get), Tally { requests: 1, bytes: 1 });
        assert_eq!(n.get(Subsystem::Gc, RequestKind::List).requests, 1);
        assert_eq!(n.iter().count(), 4, "{n:?}");
        // A store that bills nothing serves every payer itself.
        let dir2 = tempfile::tempdir().unwrap();
        let local: Arc<dyn Backend> = Arc::new(crate::LocalBackend::create(dir2.path()).unwrap());
        assert!(Arc::ptr_eq(Payers::new(local.clone()).get(Subsystem::Gc), &local));
    }

    #[test]
    fn take_drains_and_add_gives_back() {
        let m = Meter::new();
        m.record_as(Subsystem::Write, RequestKind::Put, 2, 100);
        m.record_as(Subsystem::Prefetch, RequestKind::Get, 1, 7);
        let n = m.take();
        assert_eq!(n.total(RequestKind::Put), Tally { requests: 2, bytes: 100 });
        assert_eq!(n.iter().count(), 2);
        assert!(m.snapshot().is_empty());
        m.add(&n);
        assert_eq!(m.snapshot(), n);
        assert_eq!(m.take(), n, "given back, taken again");
        assert!(m.take().is_empty());
    }

    #[test]
    fn lifetime_counts_only_grow_while_the_bill_takes() {
        let m = Meter::new();
        m.record_as(Subsystem::Write, RequestKind::Put, 1, 10);
        let first = m.take();
        m.record_as(Subsystem::Write, RequestKind::Put, 2, 5);
        assert_eq!(m.take().total(RequestKind::Put), Tally { requests: 2, bytes: 5 }, "the second take has only what came after the first");
        assert_eq!(m.lifetime().total(RequestKind::Put), Tally { requests: 3, bytes: 15 });
        m.add(&first);
        assert_eq!(m.lifetime().total(RequestKind::Put), Tally { requests: 3, bytes: 15 }, "giving back changes no lifetime count");
        m.record_error(RequestKind::Get);
        assert_eq!((m.errors(RequestKind::Get), m.errors(RequestKind::Put)), (1, 0));
    }

    #[test]
    fn shared_meters_are_per_place() {
        let a = shared("test|a");
        let b = shared("test|b");
        a.record_as(Subsystem::Other, RequestKind::Head, 1, 0);
        assert_eq!(shared("test|a").snapshot().total(RequestKind::Head).requests, 1);
        assert!(b.snapshot().is_empty());
    }

    #[test]
    fn listing_pages() {
        assert_eq!((list_pages(0), list_pages(1), list_pages(1000), list_pages(1001)), (1, 1, 1, 2));
    }
}
