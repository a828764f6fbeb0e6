//! The live run's own cache, replayed: the trace's CACHE records through a
//! model of the disk cache's bookkeeping (`cairn_cache::disk`):
//! extents of packs fetched as the disk cache plans them (the same
//! function, `cairn_model::cache::extent`, at the alignment and merge
//! distance the trace's OPENED record gives), whole copies of packs
//! written, the outbox's bytes taking room from clean ones, victims from
//! the policy. At the live run's capacity and policy it gives the live hit
//! ratio; at others, what that run would have had.

use crate::cache::Policy;
use crate::model::Io;
use crate::SimError;
use cairn_model::cache::extent::{self, FetchRules};
use cairn_model::cache::KEEP_PIECE;
use cairn_model::trace::{CacheEvent, Event, TraceReader};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// What a replay of the live cache found, next to what the live run
/// recorded.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LiveReport {
    pub policy: String,
    pub capacity: u64,
    /// The live cache's fetch alignment (0: exact).
    pub block: u64,
    /// Pack reads replayed: served locally, or fetching.
    pub hits: u64,
    pub misses: u64,
    pub hit_ratio: f64,
    pub gets: u64,
    pub bytes_fetched: u64,
    pub evictions: u64,
    /// The live run's own counts.
    pub recorded_hits: u64,
    pub recorded_misses: u64,
    pub recorded_hit_ratio: f64,
}

fn ratio(hits: u64, misses: u64) -> f64 {
    if hits + misses == 0 {
        0.0
    } else {
        hits as f64 / (hits + misses) as f64
    }
}

/// The slot of a whole copy (as the disk cache's).
const WHOLE: u64 = u64::MAX;

#[derive(Default)]
struct Obj {
    size: Option<u64>,
    /// Bytes in the outbox.
    dirty: Option<u64>,
    /// The whole copy's key.
    whole: Option<u64>,
    /// Where its last GET ended, and the file it was for.
    last_get: Option<(u64, u64)>,
    /// Extents: offset → (end, key).
    extents: BTreeMap<u64, (u64, u64)>,
}

/// The model of the disk cache (see the module docs).
struct LiveCache {
    policy: Policy,
    rules: FetchRules,
    capacity: u64,
    objects: HashMap<u64, Obj>,
    /// Key → (pack, slot, bytes).
    entries: HashMap<u64, (u64, u64, u64)>,
    next_key: u64,
    clean: u64,
    dirty: u64,
    r: LiveReport,
}

impl LiveCache {
    fn add(&mut self, pack: u64, slot: u64, bytes: u64, group: u64) {
        let key = self.next_key;
        self.next_key += 1;
        let o = self.objects.entry(pack).or_default();
        let old = if slot == WHOLE { o.whole.replace(key) } else { o.extents.insert(slot, (slot + bytes, key)).map(|(_, k)| k) };
        if let Some(old) = old {
            self.policy.policy.removed(old);
            if let Some((_, _, b)) = self.entries.remove(&old) {
                self.clean -= b;
            }
        }
        self.entries.insert(key, (pack, slot, bytes));
        self.policy.policy.admitted(key, bytes);
        if group != 0 {
            self.policy.policy.grouped(key, group);
        }
        self.clean += bytes;
    }

    fn remove(&mut self, key: u64) -> bool {
        self.policy.policy.removed(key);
        let Some((pack, slot, bytes)) = self.entries.remove(&key) else {
            return false;
        };
        self.clean -= bytes;
        if let Some(o) = self.objects.get_mut(&pack) {
            if slot == WHOLE {
                if o.whole == Some(key) {
                    o.whole = None;
                }
            } else if o.extents.get(&slot).is_some_and(|(_, k)| *k == key) {
                o.extents.remove(&slot);
            }
        }
        true
    }

    fn evict(&mut self) {
        while self.clean > self.capacity.saturating_sub(self.dirty) {
            let Some(k) = self.policy.policy.victim() else {
                break;
            };
            if self.remove(k) {
                self.r.evictions += 1;
            }
        }
    }

    /// Drops the pack's clean copies and its outbox bytes.
    fn detach(&mut self, pack: u64) {
        let Some(o) = self.objects.get_mut(&pack) else {
            return;
        };
        let keys: Vec<u64> = o.whole.iter().copied().chain(o.extents.values().map(|(_, k)| *k)).collect();
        self.dirty -= o.dirty.take().unwrap_or(0);
        for k in keys {
            self.remove(k);
        }
    }

    fn read(&mut self, pack: u64, off: u64, len: u64, group: u64) {
        let o = self.objects.entry(pack).or_default();
        let size = o.size.unwrap_or(0).max(off + len);
        if o.dirty.is_some() || len == 0 {
            self.r.hits += 1;
            return;
        }
        let (touched, gets) = match o.whole {
            Some(k) => (vec![k], Vec::new()),
            None => {
                let after = extent::continuing(o.last_get, group);
                let p = extent::plan(&o.extents, |v| v.0, &BTreeMap::new(), after, off, off + len, size, self.rules);
                if let Some(g) = p.gets.last() {
                    o.last_get = Some((g.range.1, group));
                }
                (p.cached.iter().map(|s| o.extents[s].1).collect(), p.gets)
            }
        };
        for k in touched {
            self.policy.policy.accessed(k);
            if group != 0 {
                self.policy.policy.grouped(k, group);
            }
        }
        if gets.is_empty() {
            self.r.hits += 1;
            return;
        }
        self.r.misses += 1;
        for g in gets {
            self.r.gets += 1;
            self.r.bytes_fetched += g.range.1 - g.range.0;
            for (s, e) in g.extents {
                self.add(pack, s, e - s, group);
            }
        }
        self.evict();
    }

    fn apply(&mut self, e: &Event) {
        match *e {
            Event::Read { .. } | Event::ReadKept { .. } => self.policy.note(Io::Read),
            Event::Write { .. } => self.policy.note(Io::Write),
            Event::CacheSize { pack, size } => self.objects.entry(pack).or_default().size = Some(size),
            Event::Cache { event, pack, offset, len, group } => match event {
                CacheEvent::Hit | CacheEvent::Miss | CacheEvent::Outbox => {
                    if event == CacheEvent::Miss {
                        self.r.recorded_misses += 1;
                    } else {
                        self.r.recorded_hits += 1;
                    }
                    self.read(pack, offset, len, group);
                }
                CacheEvent::Held => self.add(pack, offset, len, 0),
                CacheEvent::Queued => {
                    self.detach(pack);
                    let o = self.objects.entry(pack).or_default();
                    (o.dirty, o.size) = (Some(len), Some(len));
                    self.dirty += len;
                    self.evict();
                }
                CacheEvent::Uploaded | CacheEvent::Kept => {
                    // Kept as pieces, each evicted on its own (the disk
                    // cache's `KEEP_PIECE`).
                    self.detach(pack);
                    self.objects.entry(pack).or_default().size = Some(len);
                    let mut off = 0;
                    while off < len {
                        let n = KEEP_PIECE.min(len - off);
                        self.add(pack, off, n, 0);
                        off += n;
                    }
                    self.evict();
                }
                CacheEvent::Dropped => self.detach(pack),
            },
            _ => {}
        }
    }
}

/// Replays the CACHE records of the trace at `path` through policy
/// `policy` (one of [`crate::POLICIES`]) at `capacity` bytes (default: the
/// live cache's own).
pub fn replay_live(path: &Path, policy: &str, capacity: Option<u64>) -> Result<LiveReport, SimError> {
    let p = Policy::named(policy).ok_or_else(|| SimError::Invalid(format!("unknown policy {policy:?} (known: {})", crate::POLICIES.join(", "))))?;
    let mut reader = TraceReader::open(path)?;
    // Everything before OPENED is no cache's business.
    let (block, live_capacity, merge, ahead) = loop {
        match reader.next().transpose()? {
            Some(r) => {
                if let Event::CacheOpened { block, capacity, merge, ahead } = r.event {
                    break (block, capacity, merge, ahead);
                }
            }
            None => return Err(SimError::Invalid(format!("{} holds no cache records (the trace of a volume in a bucket has them)", path.display()))),
        }
    };
    let capacity = capacity.unwrap_or(live_capacity);
    let r = LiveReport {
        policy: policy.to_string(),
        capacity,
        block,
        hits: 0,
        misses: 0,
        hit_ratio: 0.0,
        gets: 0,
        bytes_fetched: 0,
        evictions: 0,
        recorded_hits: 0,
        recorded_misses: 0,
        recorded_hit_ratio: 0.0,
    };
    let mut c = LiveCache { policy: p, rules: FetchRules { align: block, merge_below: merge, ahead }, capacity, objects: HashMap::new(), entries: HashMap::new(), next_key: 0, clean: 0, dirty: 0, r };
    for rec in reader {
        c.apply(&rec?.event);
    }
    let mut r = c.r;
    r.hit_ratio = ratio(r.hits, r.misses);
    r.recorded_hit_ratio = ratio(r.recorded_hits, r.recorded_misses);
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_model::trace::TraceWriter;

    fn cache(event: CacheEvent, pack: u64, offset: u64, len: u64) -> Event {
        Event::Cache { event, pack, offset, len, group: 1 }
    }

    /// A cache of 200 bytes fetching 100-byte aligned extents, LRU, by
    /// hand: extents of pack 1 read 0 1 0 2 1; a read across blocks 3-4
    /// fetches one 150-byte extent (clamped to the pack's end) in one GET;
    /// a pack in the outbox takes room from clean extents and reads
    /// locally.
    #[test]
    fn the_disk_cache_replayed_by_hand() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t");
        let w = TraceWriter::create(&p).unwrap();
        use CacheEvent::*;
        let events = vec![
            Event::Write { ino: 1, offset: 0, len: 1 },
            Event::CacheOpened { block: 100, capacity: 200, merge: 0, ahead: 0 },
            Event::CacheSize { pack: 1, size: 450 },
            cache(Miss, 1, 0, 10),     // fetch 0: {0}
            cache(Miss, 1, 150, 10),   // fetch 1: {0 1}
            cache(Hit, 1, 20, 10),     // {1 0}
            cache(Miss, 1, 250, 10),   // fetch 2, evict 1: {0 2}
            cache(Miss, 1, 120, 10),   // fetch 1, evict 0: {2 1}
            cache(Miss, 1, 350, 90),   // fetch [300, 450) in one GET, evict 2 and 1: {3}
            cache(Queued, 2, 0, 60),   // 60 dirty: 150 clean > 140, evict 3: {}
            cache(Outbox, 2, 0, 60),   // local
            cache(Uploaded, 2, 0, 60), // whole copy, clean 60: {2*}
            cache(Hit, 2, 5, 5),
            cache(Hit, 1, 420, 10),    // the live cache had kept [400, 450) as a block: fetch it

        ];
        w.record_all(events);
        w.flush().unwrap();
        let r = replay_live(&p, "lru", None).unwrap();
        assert_eq!((r.capacity, r.block), (200, 100));
        assert_eq!((r.hits, r.misses, r.gets, r.evictions), (3, 6, 6, 5));
        assert_eq!(r.bytes_fetched, 100 * 4 + 150 + 50);
        assert_eq!((r.recorded_hits, r.recorded_misses), (4, 5));
        // At 100 bytes: extent 1 evicts extent 0 before its hit, and the
        // 150-byte extent does not stay.
        let r = replay_live(&p, "lru", Some(100)).unwrap();
        assert_eq!((r.hits, r.misses), (2, 7));
        assert!(replay_live(&p, "nope", None).is_err());
    }

    #[test]
    fn a_trace_without_cache_records_says_so() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t");
        let w = TraceWriter::create(&p).unwrap();
        w.record(Event::Read { ino: 1, offset: 0, len: 1 });
        w.flush().unwrap();
        assert!(replay_live(&p, "lru", None).unwrap_err().to_string().contains("no cache records"));
    }
}
