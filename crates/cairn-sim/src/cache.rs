//! A simulated cache: fetch units under a [`CachePolicy`], bounded in
//! bytes, counting reads, hits, GETs and bytes fetched. It replays a
//! layout's operations in batches (several caches replay one batch at once
//! on their own threads).

use crate::layout::{Unit, RANGE};
use crate::model::Io;
use cairn_model::cache::extent::{self, FetchRules};
use cairn_model::cache::kd::{IoWindows, KdPolicy, Metric};
use cairn_model::cache::{CachePolicy, Lru};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::Arc;

/// The policies the simulator knows, by name: LRU, Coral's kd-tree, and
/// the kd-tree on t_i, t_b or h alone (seed 004, fig. 12–13).
pub const POLICIES: [&str; 5] = ["lru", "kd", "ti", "tb", "h"];

/// A policy, and the read/write counts it watches (KD's windows), which
/// the replay bumps as the trace's file requests go by.
pub(crate) struct Policy {
    pub policy: Box<dyn CachePolicy>,
    pub windows: Option<IoWindows>,
}

impl Policy {
    /// The policy named `name` (one of [`POLICIES`]).
    pub fn named(name: &str) -> Option<Policy> {
        let kd = |p: KdPolicy| {
            let w = IoWindows::new();
            Policy { policy: Box::new(p.with_windows(w.clone())), windows: Some(w) }
        };
        Some(match name {
            "lru" => Policy { policy: Box::new(Lru::new()), windows: None },
            "kd" => kd(KdPolicy::new()),
            "ti" => kd(KdPolicy::single(Metric::Inode)),
            "tb" => kd(KdPolicy::single(Metric::Block)),
            "h" => kd(KdPolicy::single(Metric::Hotness)),
            _ => return None,
        })
    }

    pub fn note(&self, io: Io) {
        if let Some(w) = &self.windows {
            match io {
                Io::Read => w.note_read(),
                Io::Write => w.note_write(),
            }
        }
    }
}

/// One thing a cache replays.
pub(crate) enum Op {
    /// A file request went by (KD's windows count it).
    Io(Io),
    /// A read of file `group` needing `units` of the batch (sorted by
    /// place); `local`: it also read bytes that need no fetch.
    Read { group: u64, local: bool, units: Range<usize> },
    /// A write of file `group` (0: none) stored `units`.
    Admit { group: u64, units: Range<usize> },
    /// The object is gone (a held pack copied away, a pack deleted): what
    /// an extent cache holds of it goes too, as the live cache drops it.
    Drop(u64),
}

/// Operations and the units they name.
#[derive(Default)]
pub(crate) struct Batch {
    pub ops: Vec<Op>,
    pub units: Vec<Unit>,
}

impl Batch {
    /// Adds an operation over `units`.
    pub fn push(&mut self, units: &[Unit], op: impl FnOnce(Range<usize>) -> Op) {
        let at = self.units.len();
        self.units.extend_from_slice(units);
        self.ops.push(op(at..self.units.len()));
    }

    pub fn clear(&mut self) {
        self.ops.clear();
        self.units.clear();
    }
}

/// What a cache did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Reads of stored data.
    pub reads: u64,
    /// Reads that needed no GET.
    pub hits: u64,
    /// Ranged GETs: one per run of adjacent missing units.
    pub gets: u64,
    pub bytes_down: u64,
    pub evictions: u64,
}

/// The extents a cache of the `cairn` layout holds, as the live disk
/// cache does: per object, offset → (end, key); and where each key is.
struct Extents {
    rules: FetchRules,
    /// Pack sizes (alignment stops at a pack's end).
    sizes: Arc<HashMap<u64, u64>>,
    objects: HashMap<u64, BTreeMap<u64, (u64, u64)>>,
    /// Object → where its last GET ended, and the file it was for.
    last_get: HashMap<u64, (u64, u64)>,
    at: HashMap<u64, (u64, u64)>,
    next_key: u64,
}

/// A cache of units (see the module docs).
pub(crate) struct SimCache {
    policy: Policy,
    capacity: u64,
    /// Key → bytes of the units held.
    held: HashMap<u64, u64>,
    bytes: u64,
    missing: Vec<Unit>,
    /// Set when the layout's units are [`RANGE`] requests.
    extents: Option<Extents>,
    pub counts: Counts,
}

impl SimCache {
    pub fn new(policy: Policy, capacity: u64) -> SimCache {
        SimCache { policy, capacity, held: HashMap::new(), bytes: 0, missing: Vec::new(), extents: None, counts: Counts::default() }
    }

    /// A cache whose units are range requests, planned as the live disk
    /// cache plans them.
    pub fn with_extents(mut self, rules: FetchRules, sizes: Arc<HashMap<u64, u64>>) -> SimCache {
        self.extents = Some(Extents { rules, sizes, objects: HashMap::new(), last_get: HashMap::new(), at: HashMap::new(), next_key: 0 });
        self
    }

    pub fn run(&mut self, b: &Batch) {
        for op in &b.ops {
            match op {
                Op::Io(io) => self.policy.note(*io),
                Op::Read { group, local, units } => self.read(&b.units[units.clone()], *group, *local),
                Op::Admit { group, units } => self.admit(&b.units[units.clone()], *group),
                Op::Drop(obj) => self.drop_object(*obj),
            }
        }
    }

    fn touch(&mut self, key: u64, group: u64) {
        self.policy.policy.accessed(key);
        if group != 0 {
            self.policy.policy.grouped(key, group);
        }
    }

    fn insert(&mut self, u: &Unit, group: u64) {
        self.held.insert(u.key, u.len);
        self.bytes += u.len;
        self.policy.policy.admitted(u.key, u.len);
        if group != 0 {
            self.policy.policy.grouped(u.key, group);
        }
    }

    /// Holds `[start, start+len)` of `obj` as a new extent.
    fn add_extent(&mut self, obj: u64, start: u64, len: u64, group: u64) {
        let x = self.extents.as_mut().expect("an extent cache");
        let key = x.next_key;
        x.next_key += 1;
        x.objects.entry(obj).or_default().insert(start, (start + len, key));
        x.at.insert(key, (obj, start));
        self.insert(&Unit { key, obj, start, len }, group);
    }

    /// A read (or, `admit`, a write) of range requests against the extents.
    fn ranges(&mut self, units: &[Unit], group: u64, local: bool, admit: bool) {
        if units.is_empty() && !local {
            return;
        }
        if !admit {
            self.counts.reads += 1;
        }
        let none = BTreeMap::new();
        let mut hit = true;
        for u in units {
            debug_assert_eq!(u.key, RANGE);
            let x = self.extents.as_mut().expect("an extent cache");
            let end = u.start + u.len;
            let size = x.sizes.get(&u.obj).copied().unwrap_or(end).max(end);
            let held = x.objects.entry(u.obj).or_default();
            // What is written is admitted exactly; a read's gaps follow the
            // fetch rules.
            let rules = if admit { FetchRules::default() } else { x.rules };
            let after = extent::continuing(x.last_get.get(&u.obj).copied(), group);
            let p = extent::plan(held, |v| v.0, &none, after, u.start, end, size, rules);
            if let (false, Some(g)) = (admit, p.gets.last()) {
                x.last_get.insert(u.obj, (g.range.1, group));
            }
            let cached: Vec<u64> = p.cached.iter().map(|s| held[s].1).collect();
            for k in cached {
                self.touch(k, group);
            }
            for g in p.gets {
                hit = false;
                if !admit {
                    self.counts.gets += 1;
                    self.counts.bytes_down += g.range.1 - g.range.0;
                }
                for (s, e) in g.extents {
                    self.add_extent(u.obj, s, e - s, group);
                }
            }
        }
        if hit && !admit {
            self.counts.hits += 1;
        }
        self.evict();
    }

    fn read(&mut self, units: &[Unit], group: u64, local: bool) {
        if self.extents.is_some() {
            return self.ranges(units, group, local, false);
        }
        if units.is_empty() && !local {
            return;
        }
        self.counts.reads += 1;
        let mut missing = std::mem::take(&mut self.missing);
        missing.clear();
        for u in units {
            if self.held.contains_key(&u.key) {
                self.touch(u.key, group);
            } else {
                missing.push(*u);
            }
        }
        if missing.is_empty() {
            self.counts.hits += 1;
        }
        let mut prev: Option<&Unit> = None;
        for u in &missing {
            if !prev.is_some_and(|p| p.obj == u.obj && p.start + p.len == u.start) {
                self.counts.gets += 1;
            }
            self.counts.bytes_down += u.len;
            prev = Some(u);
        }
        for u in &missing {
            self.insert(u, group);
        }
        self.missing = missing;
        self.evict();
    }

    fn admit(&mut self, units: &[Unit], group: u64) {
        if self.extents.is_some() {
            return self.ranges(units, group, false, true);
        }
        for u in units {
            if self.held.contains_key(&u.key) {
                self.touch(u.key, group);
            } else {
                self.insert(u, group);
            }
        }
        self.evict();
    }

    /// Forgets every extent of `obj` (extent caches only: a unit cache's
    /// units of a dropped object are never asked for again and age out).
    fn drop_object(&mut self, obj: u64) {
        let Some(x) = &mut self.extents else { return };
        let Some(m) = x.objects.remove(&obj) else { return };
        x.last_get.remove(&obj);
        for (_, (_, key)) in m {
            x.at.remove(&key);
            self.policy.policy.removed(key);
            if let Some(n) = self.held.remove(&key) {
                self.bytes -= n;
            }
        }
    }

    fn evict(&mut self) {
        while self.bytes > self.capacity {
            let Some(v) = self.policy.policy.victim() else {
                break;
            };
            self.policy.policy.removed(v);
            if let Some(n) = self.held.remove(&v) {
                self.bytes -= n;
                self.counts.evictions += 1;
            }
            if let Some(x) = &mut self.extents {
                if let Some((obj, start)) = x.at.remove(&v) {
                    if let Some(m) = x.objects.get_mut(&obj) {
                        m.remove(&start);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unit `k` of object `obj`, at k*10, 10 bytes.
    fn u(obj: u64, k: u64) -> Unit {
        Unit { key: obj * 100 + k, obj, start: k * 10, len: 10 }
    }

    fn read(c: &mut SimCache, units: &[Unit]) {
        let mut b = Batch::default();
        b.push(units, |r| Op::Read { group: 1, local: false, units: r });
        c.run(&b);
    }

    /// LRU over three 10-byte units, by hand: A B C A D B E A.
    /// A miss, B miss, C miss, A hit (order B C A), D miss evicts B
    /// (C A D), B miss evicts C (A D B), E miss evicts A (D B E), A miss.
    #[test]
    fn lru_hits_by_hand() {
        let mut c = SimCache::new(Policy::named("lru").unwrap(), 30);
        let [a, b, cc, d, e] = [u(1, 0), u(2, 0), u(3, 0), u(4, 0), u(5, 0)];
        for x in [a, b, cc, a, d, b, e, a] {
            read(&mut c, &[x]);
        }
        assert_eq!(c.counts, Counts { reads: 8, hits: 1, gets: 7, bytes_down: 70, evictions: 4 });
    }

    /// Missing units of one object coalesce into one GET per adjacent run;
    /// a read of held units and local bytes is a hit.
    #[test]
    fn gets_per_run_of_adjacent_missing_units() {
        let mut c = SimCache::new(Policy::named("lru").unwrap(), 1000);
        read(&mut c, &[u(1, 2)]);
        // 0 1 _ 3 of object 1 and 0 of object 2: runs [0,1], [3], [obj 2].
        read(&mut c, &[u(1, 0), u(1, 1), u(1, 2), u(1, 3), u(2, 0)]);
        assert_eq!((c.counts.reads, c.counts.hits, c.counts.gets, c.counts.bytes_down), (2, 0, 4, 50));
        let mut b = Batch::default();
        b.push(&[u(1, 3)], |r| Op::Read { group: 1, local: true, units: r });
        b.push(&[], |r| Op::Read { group: 1, local: true, units: r });
        b.push(&[], |r| Op::Read { group: 1, local: false, units: r });
        c.run(&b);
        assert_eq!((c.counts.reads, c.counts.hits), (4, 2), "an empty read without local bytes is not counted");
    }

    /// Written units are cached; a write larger than the cache leaves it
    /// within its bound.
    #[test]
    fn writes_are_cached_within_the_bound() {
        let mut c = SimCache::new(Policy::named("lru").unwrap(), 25);
        let mut b = Batch::default();
        b.push(&[u(1, 0), u(1, 1), u(1, 2)], |r| Op::Admit { group: 0, units: r });
        c.run(&b);
        assert_eq!((c.bytes, c.counts.evictions), (20, 1));
        read(&mut c, &[u(1, 1), u(1, 2)]);
        assert_eq!(c.counts.hits, 1);
    }

    #[test]
    fn every_named_policy_runs() {
        for name in POLICIES {
            let mut c = SimCache::new(Policy::named(name).unwrap(), 50);
            let mut b = Batch::default();
            for i in 0..200u64 {
                b.ops.push(Op::Io(if i % 3 == 0 { Io::Write } else { Io::Read }));
                b.push(&[u(i % 17, i % 5)], |r| Op::Read { group: i % 4 + 1, local: false, units: r });
            }
            c.run(&b);
            assert!(c.bytes <= 50 && c.counts.reads == 200, "{name}");
        }
        assert!(Policy::named("mru").is_none());
    }
}
