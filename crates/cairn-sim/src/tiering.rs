//! `cairn sim --tier-policies`: a trace replayed over its (simulated)
//! time against storage-class policies, each billed (docs/tiers.md §8).
//!
//! One pass over the trace keeps what every policy shares: each file's
//! chunks (from PLACE records), each chunk's length, references, owner
//! (the file that first placed it) and access history (an EWMA of
//! accesses with a 30-day half-life and the last access, docs/tiers.md
//! §2). Each policy has its own [`Store`] of packs: class, since when,
//! live bytes, chunks, last access, restore in flight. Packs enter a
//! store at their PACK record (a PUT in the class the policy gives them);
//! storage accrues per pack from the last change to the next (exact, not
//! sampled), at the class's price for its billable bytes. Reads cost a GET
//! per pack read, the class's retrieval fee, and in a class that needs a
//! restore: a restore request, the whole object's retrieval, the restored
//! copy's storage, and a wait (counted). Once a simulated day the
//! Intelligent-Tiering store's objects change tier by their idle days,
//! and Cairn's planner ([`cairn_model::tiers::decide`] per chunk, packs
//! rebuilt by destination) runs.
//!
//! Simplification shared by every policy: a chunk no file references any
//! more stops being billed at once (as if the cleaner compacted for free),
//! with the early-deletion fee of its class if it leaves too young.

use crate::model::{Piece, RangeMap};
use crate::SimError;
use cairn_model::tiers::{decide, Class, Item, Pin, Rule, TierSheet, DAYS_PER_MONTH};
use cairn_model::trace::{Event, PackStage, TraceReader};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

const DAY_NS: u64 = 86_400_000_000_000;
const GB: f64 = (1u64 << 30) as f64;
/// The EWMA's half-life, in days (docs/tiers.md §2).
const HALF_LIFE_DAYS: f64 = 30.0;

/// A policy of placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TierPolicy {
    /// Everything in STANDARD.
    AllStandard,
    /// Every pack an INTELLIGENT_TIERING object (S3's published rules).
    Intelligent,
    /// JuiceFS-style manual pins: pinned files' data written in the pin's
    /// class, the rest in STANDARD; nothing moves.
    Pins,
    /// Cairn's planner (docs/tiers.md §4), once a simulated day.
    Cairn,
}

impl TierPolicy {
    pub const ALL: [TierPolicy; 4] = [TierPolicy::AllStandard, TierPolicy::Intelligent, TierPolicy::Pins, TierPolicy::Cairn];

    pub fn name(self) -> &'static str {
        match self {
            TierPolicy::AllStandard => "all-standard",
            TierPolicy::Intelligent => "intelligent",
            TierPolicy::Pins => "pins",
            TierPolicy::Cairn => "cairn",
        }
    }

    pub fn parse(s: &str) -> Option<TierPolicy> {
        Self::ALL.into_iter().find(|p| p.name() == s)
    }
}

/// Files `from..=to` (inode numbers) pinned to `class`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PinRange {
    pub from: u64,
    pub to: u64,
    pub class: Class,
}

/// Parses a pins file: one `FROM TO CLASS` a line (inode numbers, both
/// included; CLASS as `STANDARD_IA` or `cold`), `#` starts a comment.
pub fn parse_pins(text: &str) -> Result<Vec<PinRange>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let bad = |why: &str| format!("pins line {}: {why} (expected `FROM TO CLASS`): {line:?}", i + 1);
        let [from, to, class] = f[..] else { return Err(bad("three fields")) };
        let from: u64 = from.parse().map_err(|_| bad("FROM is not an inode number"))?;
        let to: u64 = to.parse().map_err(|_| bad("TO is not an inode number"))?;
        if to < from {
            return Err(bad("TO is below FROM"));
        }
        let class = Class::parse(class).ok_or_else(|| bad("unknown class (STANDARD, STANDARD_IA, GLACIER_IR, GLACIER, DEEP_ARCHIVE, TAPE)"))?;
        out.push(PinRange { from, to, class });
    }
    Ok(out)
}

/// Writes pins in the form [`parse_pins`] reads.
pub fn format_pins(pins: &[PinRange]) -> String {
    pins.iter().map(|p| format!("{} {} {}\n", p.from, p.to, p.class.name())).collect()
}

/// What to simulate.
#[derive(Clone, Debug)]
pub struct TierOptions {
    pub policies: Vec<TierPolicy>,
    pub sheet: TierSheet,
    pub rule: Rule,
    /// The pins policy's pins (and Cairn's, with `cairn_pins`).
    pub pins: Vec<PinRange>,
    pub cairn_pins: bool,
    /// The size of the packs Cairn's planner builds (the volume's target).
    pub pack_target: u64,
    /// Days a restored copy stays readable (RestoreObject's `Days`).
    pub restore_copy_days: f64,
}

impl Default for TierOptions {
    fn default() -> Self {
        TierOptions { policies: TierPolicy::ALL.to_vec(), sheet: TierSheet::aws(), rule: Rule::default(), pins: Vec::new(), cairn_pins: false, pack_target: 16 << 20, restore_copy_days: 1.0 }
    }
}

/// A bill (dollars).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Bill {
    pub storage: f64,
    /// PUT, GET and restore requests.
    pub requests: f64,
    /// Retrieval per GB.
    pub retrieval: f64,
    pub early_deletion: f64,
    /// Intelligent-Tiering's monitoring fee.
    pub monitoring: f64,
    pub total: f64,
}

/// What one policy cost.
#[derive(Clone, Debug, Serialize)]
pub struct TierRow {
    pub policy: TierPolicy,
    pub bill: Bill,
    /// GB-months stored per class (Intelligent-Tiering: per access tier,
    /// as `IT_FREQUENT`, `IT_INFREQUENT`, `IT_ARCHIVE_INSTANT`).
    pub gb_months: BTreeMap<String, f64>,
    /// Reads that waited for a restore, and their total wait.
    pub restore_waits: u64,
    pub wait_hours: f64,
    pub restores: u64,
    /// Bytes Cairn's planner moved (rewrote into new packs).
    pub moved_bytes: u64,
    pub puts: u64,
    pub gets: u64,
}

/// The result of [`simulate_tiers`].
#[derive(Clone, Debug, Serialize)]
pub struct TierReport {
    pub days: f64,
    pub records: u64,
    pub reads: u64,
    pub bytes_written: u64,
    /// Chunk reads whose pack the trace never uploaded (left out).
    pub unlocated: u64,
    pub sheet: TierSheet,
    pub rows: Vec<TierRow>,
}

#[derive(Clone, Copy)]
struct Ch(u64);
impl Piece for Ch {
    fn skip(self, _: u64) -> Self {
        self
    }
}

struct ChunkInfo {
    len: u64,
    refs: u32,
    owner: u64,
    /// EWMA of accesses (decayed to `mark`).
    ewma: f64,
    mark: u64,
    last_access: Option<u64>,
}

impl ChunkInfo {
    fn touch(&mut self, now: u64) {
        self.ewma = self.ewma_at(now) + 1.0;
        self.mark = now;
        self.last_access = Some(now);
    }

    fn ewma_at(&self, now: u64) -> f64 {
        let days = now.saturating_sub(self.mark) as f64 / DAY_NS as f64;
        self.ewma * (-(std::f64::consts::LN_2 / HALF_LIFE_DAYS) * days).exp()
    }

    /// Accesses a month: a steady rate r a day gives an EWMA of r / λ.
    fn rate_per_month(&self, now: u64) -> f64 {
        self.ewma_at(now) * std::f64::consts::LN_2 / HALF_LIFE_DAYS * DAYS_PER_MONTH
    }
}

struct Pack {
    class: Class,
    since: u64,
    live: u64,
    chunks: Vec<u64>,
    billed_to: u64,
    last_access: u64,
    restore_ready: u64,
    restored_until: u64,
}

struct Store {
    policy: TierPolicy,
    packs: HashMap<u64, Pack>,
    chunk_pack: HashMap<u64, u64>,
    /// (recorded pack, class) → this store's pack.
    recorded: HashMap<(u64, Class), u64>,
    next_id: u64,
    bill: Bill,
    gb_months: BTreeMap<String, f64>,
    waits: u64,
    wait_ns: u64,
    restores: u64,
    moved: u64,
    puts: u64,
    gets: u64,
}

impl Store {
    fn new(policy: TierPolicy) -> Store {
        Store { policy, packs: HashMap::new(), chunk_pack: HashMap::new(), recorded: HashMap::new(), next_id: 1, bill: Bill::default(), gb_months: BTreeMap::new(), waits: 0, wait_ns: 0, restores: 0, moved: 0, puts: 0, gets: 0 }
    }

    /// Bills pack `id`'s storage up to `now`.
    fn accrue(&mut self, id: u64, now: u64, sheet: &TierSheet) {
        let Some(p) = self.packs.get_mut(&id) else { return };
        if now <= p.billed_to {
            return;
        }
        let days = (now - p.billed_to) as f64 / DAY_NS as f64;
        if self.policy == TierPolicy::Intelligent {
            let it = &sheet.intelligent;
            let idle = p.billed_to.saturating_sub(p.last_access) as f64 / DAY_NS as f64;
            let price = it.storage_price(p.live, idle);
            let gbm = p.live as f64 / GB * days / DAYS_PER_MONTH;
            self.bill.storage += gbm * price;
            let tier = if price == it.frequent_per_gb_month {
                "IT_FREQUENT"
            } else if price == it.infrequent_per_gb_month {
                "IT_INFREQUENT"
            } else {
                "IT_ARCHIVE_INSTANT"
            };
            *self.gb_months.entry(tier.into()).or_default() += gbm;
            if p.live >= it.min_monitored_bytes {
                self.bill.monitoring += it.monitoring_per_1000_month / 1000.0 * days / DAYS_PER_MONTH;
            }
        } else {
            let s = sheet.of(p.class);
            let billed = s.billable(p.live) as f64;
            self.bill.storage += s.per_day(billed) * days;
            *self.gb_months.entry(p.class.name().into()).or_default() += billed / GB * days / DAYS_PER_MONTH;
        }
        p.billed_to = now;
    }

    fn put(&mut self, class: Class, sheet: &TierSheet) {
        self.puts += 1;
        self.bill.requests += if self.policy == TierPolicy::Intelligent { sheet.intelligent.put_per_1000 } else { sheet.of(class).put_per_1000 } / 1000.0;
    }

    fn new_pack(&mut self, class: Class, now: u64, last_access: u64) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.packs.insert(id, Pack { class, since: now, live: 0, chunks: Vec::new(), billed_to: now, last_access, restore_ready: 0, restored_until: 0 });
        id
    }

    /// A read of `bytes` of pack `id` at `now`.
    fn read(&mut self, id: u64, bytes: u64, now: u64, o: &TierOptions) {
        let sheet = &o.sheet;
        self.gets += 1;
        if self.policy == TierPolicy::Intelligent {
            self.accrue(id, now, sheet);
            self.bill.requests += sheet.intelligent.get_per_1000 / 1000.0;
            if let Some(p) = self.packs.get_mut(&id) {
                p.last_access = now;
            }
            return;
        }
        let Some(p) = self.packs.get_mut(&id) else { return };
        p.last_access = now;
        let s = sheet.of(p.class);
        self.bill.requests += s.get_per_1000 / 1000.0;
        if !s.needs_restore() {
            self.bill.retrieval += s.retrieval_per_gb * bytes as f64 / GB;
        } else if now < p.restore_ready {
            self.waits += 1;
            self.wait_ns += p.restore_ready - now;
        } else if now >= p.restored_until {
            let latency = (s.restore_hours * 3600e9) as u64;
            self.restores += 1;
            self.waits += 1;
            self.wait_ns += latency;
            self.bill.requests += s.restore_per_1000 / 1000.0;
            self.bill.retrieval += s.retrieval_per_gb * p.live as f64 / GB;
            // The restored copy is billed as STANDARD while it is kept.
            let copy_days = o.restore_copy_days + s.restore_hours / 24.0;
            self.bill.storage += sheet.standard.per_day(p.live as f64) * copy_days;
            p.restore_ready = now + latency;
            p.restored_until = p.restore_ready + (o.restore_copy_days * DAY_NS as f64) as u64;
        }
    }

    /// Chunk `c` (`len` bytes) is no longer referenced.
    fn drop_chunk(&mut self, c: u64, len: u64, now: u64, sheet: &TierSheet) {
        let Some(id) = self.chunk_pack.remove(&c) else { return };
        self.accrue(id, now, sheet);
        let Some(p) = self.packs.get_mut(&id) else { return };
        if self.policy != TierPolicy::Intelligent {
            let s = sheet.of(p.class);
            self.bill.early_deletion += s.early_deletion(len as f64, now.saturating_sub(p.since) as f64 / DAY_NS as f64);
        }
        p.live -= len.min(p.live);
        p.chunks.retain(|&x| x != c);
        if p.chunks.is_empty() {
            self.packs.remove(&id);
        }
    }
}

/// Shared replay state.
struct World {
    files: HashMap<u64, (RangeMap<Ch>, HashSet<u64>)>,
    chunks: HashMap<u64, ChunkInfo>,
    /// Recorded pack → chunks waiting for its upload.
    pending: HashMap<u64, Vec<u64>>,
    uploaded: HashSet<u64>,
}

fn pin_of(pins: &[PinRange], ino: u64) -> Option<Class> {
    pins.iter().rev().find(|p| (p.from..=p.to).contains(&ino)).map(|p| p.class)
}

/// The class a policy writes a new chunk of `owner` in.
fn write_class(policy: TierPolicy, o: &TierOptions, owner: u64) -> Class {
    match policy {
        TierPolicy::Pins => pin_of(&o.pins, owner).unwrap_or(Class::Standard),
        TierPolicy::Cairn if o.cairn_pins => pin_of(&o.pins, owner).unwrap_or(Class::Standard),
        _ => Class::Standard,
    }
}

/// Puts chunks of recorded pack `rec` into `store` (a PUT per pack and class).
fn place(store: &mut Store, w: &World, o: &TierOptions, rec: u64, chunks: &[u64], now: u64) {
    for &c in chunks {
        let Some(info) = w.chunks.get(&c) else { continue };
        if info.refs == 0 || store.chunk_pack.contains_key(&c) {
            continue;
        }
        let class = write_class(store.policy, o, info.owner);
        let id = match store.recorded.get(&(rec, class)) {
            Some(&id) if store.packs.contains_key(&id) => id,
            _ => {
                store.put(class, &o.sheet);
                let id = store.new_pack(class, now, now);
                store.recorded.insert((rec, class), id);
                id
            }
        };
        store.accrue(id, now, &o.sheet);
        let p = store.packs.get_mut(&id).expect("just made");
        p.live += info.len;
        p.chunks.push(c);
        store.chunk_pack.insert(c, id);
    }
}

/// Cairn's planner over `store` at `now` (docs/tiers.md §4).
fn plan(store: &mut Store, w: &World, o: &TierOptions, now: u64) {
    let sheet = &o.sheet;
    let target = o.pack_target.max(1);
    let mut ids: Vec<u64> = store.packs.keys().copied().collect();
    ids.sort_unstable();
    let mut groups: BTreeMap<Class, Vec<u64>> = BTreeMap::new();
    for id in ids {
        let p = &store.packs[&id];
        let age = now.saturating_sub(p.since) as f64 / DAY_NS as f64;
        let mut net = 0.0;
        let mut pinned = false;
        let mut stay_bytes = 0u64;
        let mut moving: Vec<(u64, Class)> = Vec::new();
        // A chunk's read rate is at least its pack's mean: a chunk never
        // read itself shares the restores its neighbours' reads cause, and
        // a never-read chunk's own EWMA says nothing of its peers.
        let rates: Vec<f64> = p.chunks.iter().map(|c| w.chunks.get(c).map_or(0.0, |i| i.rate_per_month(now))).collect();
        let mean = rates.iter().sum::<f64>() / rates.len().max(1) as f64;
        for (k, &c) in p.chunks.iter().enumerate() {
            let Some(info) = w.chunks.get(&c) else { continue };
            let pin = match (o.cairn_pins, pin_of(&o.pins, info.owner)) {
                (true, Some(c)) => Pin::To(c),
                _ => Pin::Auto,
            };
            let it = Item {
                bytes: info.len,
                class: p.class,
                age_days: age,
                reads_per_month: rates[k].max(mean),
                days_since_access: info.last_access.map(|t| now.saturating_sub(t) as f64 / DAY_NS as f64),
                read_bytes: info.len,
                object_bytes: target,
                request_share: info.len as f64 / target as f64,
                pin,
            };
            match decide(sheet, &o.rule, &it) {
                Some(d) => {
                    net += d.saving - d.move_cost;
                    pinned |= d.pinned;
                    moving.push((c, d.to));
                }
                None => {
                    stay_bytes += info.len;
                    moving.push((c, p.class));
                }
            }
        }
        if moving.iter().all(|&(_, to)| to == p.class) {
            continue;
        }
        // The chunks that stay are rewritten too (the old pack goes): the
        // move must pay for that as well.
        let s = sheet.of(p.class);
        let share = stay_bytes as f64 / target as f64;
        let rewrite = (s.get_per_1000 + s.restore_per_1000 + s.put_per_1000) / 1000.0 * share + s.retrieval_per_gb * stay_bytes as f64 / GB + s.early_deletion(stay_bytes as f64, age);
        if !pinned && net - rewrite <= 0.0 {
            continue;
        }
        store.accrue(id, now, sheet);
        let p = store.packs.remove(&id).expect("listed");
        store.gets += 1;
        store.bill.requests += (s.get_per_1000 + s.restore_per_1000) / 1000.0;
        store.bill.retrieval += s.retrieval_per_gb * p.live as f64 / GB;
        store.bill.early_deletion += s.early_deletion(p.live as f64, age);
        for (c, to) in moving {
            if to != p.class {
                store.moved += w.chunks.get(&c).map_or(0, |i| i.len);
            }
            store.chunk_pack.remove(&c);
            groups.entry(to).or_default().push(c);
        }
    }
    for (class, chunks) in groups {
        let mut open: Option<u64> = None;
        for c in chunks {
            let Some(info) = w.chunks.get(&c) else { continue };
            let id = match open.filter(|id| store.packs[id].live + info.len <= target || store.packs[id].live == 0) {
                Some(id) => id,
                None => {
                    store.put(class, sheet);
                    let id = store.new_pack(class, now, info.last_access.unwrap_or(now));
                    open = Some(id);
                    id
                }
            };
            let p = store.packs.get_mut(&id).expect("open");
            p.live += info.len;
            p.chunks.push(c);
            p.last_access = p.last_access.max(info.last_access.unwrap_or(0));
            store.chunk_pack.insert(c, id);
        }
    }
}

fn tick(stores: &mut [Store], w: &World, o: &TierOptions, now: u64) {
    for s in stores.iter_mut() {
        let ids: Vec<u64> = s.packs.keys().copied().collect();
        for id in ids {
            s.accrue(id, now, &o.sheet);
        }
        if s.policy == TierPolicy::Cairn {
            plan(s, w, o, now);
        }
    }
}

/// Replays the trace at `path` against `o.policies` (see the module docs).
pub fn simulate_tiers(path: &Path, o: &TierOptions) -> Result<TierReport, SimError> {
    o.sheet.check().map_err(SimError::Invalid)?;
    if !(o.rule.horizon_days.is_finite() && o.rule.horizon_days > 0.0) {
        return Err(SimError::Invalid(format!("the tier horizon must be a positive number of days, not {}", o.rule.horizon_days)));
    }
    if !(o.rule.cold_after_days.is_finite() && o.rule.cold_after_days >= 0.0) {
        return Err(SimError::Invalid(format!("--cold-after must be a number of days, not {}", o.rule.cold_after_days)));
    }
    let mut stores: Vec<Store> = o.policies.iter().map(|&p| Store::new(p)).collect();
    let mut w = World { files: HashMap::new(), chunks: HashMap::new(), pending: HashMap::new(), uploaded: HashSet::new() };
    let (mut records, mut reads, mut bytes_written, mut unlocated) = (0u64, 0u64, 0u64, 0u64);
    let mut next_tick = DAY_NS;
    let mut now = 0u64;
    let mut wanted: Vec<u64> = Vec::new();
    for r in TraceReader::open(path)? {
        let r = r?;
        records += 1;
        // Times never go back (a trace's records are in order; a record
        // out of order is taken as happening now).
        now = now.max(r.time);
        while now >= next_tick {
            tick(&mut stores, &w, o, next_tick);
            next_tick += DAY_NS;
        }
        match r.event {
            Event::Read { ino, offset, len } => {
                reads += 1;
                wanted.clear();
                if let Some((m, _)) = w.files.get(&ino) {
                    m.overlaps(offset, offset.saturating_add(len), |_, _, Ch(c)| wanted.push(c));
                }
                wanted.sort_unstable();
                wanted.dedup();
                for &c in &wanted {
                    if let Some(i) = w.chunks.get_mut(&c) {
                        i.touch(now);
                    }
                }
                for s in stores.iter_mut() {
                    let mut per_pack: BTreeMap<u64, u64> = BTreeMap::new();
                    for &c in &wanted {
                        match s.chunk_pack.get(&c) {
                            Some(&id) => *per_pack.entry(id).or_default() += w.chunks.get(&c).map_or(0, |i| i.len),
                            None if s.policy == stores_first_policy(o) => unlocated += 1,
                            None => {}
                        }
                    }
                    for (id, bytes) in per_pack {
                        s.read(id, bytes, now, o);
                    }
                }
            }
            Event::Write { len, .. } => bytes_written += len,
            Event::Place { ino, offset, len, chunk, described } => {
                let (m, set) = w.files.entry(ino).or_insert_with(|| (RangeMap::default(), HashSet::new()));
                if chunk == 0 {
                    m.clear(offset, offset.saturating_add(len));
                    continue;
                }
                if described {
                    for (a, b) in m.gaps(offset, offset.saturating_add(len)) {
                        m.set(a, b, Ch(chunk));
                    }
                } else {
                    m.set(offset, offset.saturating_add(len), Ch(chunk));
                }
                let info = w.chunks.entry(chunk).or_insert(ChunkInfo { len: 0, refs: 0, owner: ino, ewma: 0.0, mark: now, last_access: None });
                if set.insert(chunk) {
                    info.refs += 1;
                }
                if !described {
                    // A write is an access for the latency guard (fresh
                    // data goes to no class that restores for
                    // --cold-after days), not a read for the EWMA.
                    info.last_access = Some(now);
                }
            }
            Event::Chunk { chunk, pack, len, .. } => {
                let info = w.chunks.entry(chunk).or_insert(ChunkInfo { len, refs: 0, owner: 0, ewma: 0.0, mark: now, last_access: None });
                info.len = len;
                if w.uploaded.contains(&pack) {
                    for s in stores.iter_mut() {
                        place(s, &w, o, pack, &[chunk], now);
                    }
                } else {
                    w.pending.entry(pack).or_default().push(chunk);
                }
            }
            Event::Pack { pack, stage: PackStage::Uploaded | PackStage::Released, .. } => {
                w.uploaded.insert(pack);
                if let Some(chunks) = w.pending.remove(&pack) {
                    for s in stores.iter_mut() {
                        place(s, &w, o, pack, &chunks, now);
                    }
                }
            }
            Event::Remove { ino } => {
                if let Some((_, set)) = w.files.remove(&ino) {
                    for c in set {
                        let Some(info) = w.chunks.get_mut(&c) else { continue };
                        info.refs = info.refs.saturating_sub(1);
                        if info.refs == 0 {
                            let len = info.len;
                            for s in stores.iter_mut() {
                                s.drop_chunk(c, len, now, &o.sheet);
                            }
                            w.chunks.remove(&c);
                        }
                    }
                }
            }
            _ => {}
        }
    }
    for s in stores.iter_mut() {
        let ids: Vec<u64> = s.packs.keys().copied().collect();
        for id in ids {
            s.accrue(id, now, &o.sheet);
        }
    }
    let rows = stores
        .into_iter()
        .map(|s| {
            let mut bill = s.bill;
            bill.total = bill.storage + bill.requests + bill.retrieval + bill.early_deletion + bill.monitoring;
            TierRow { policy: s.policy, bill, gb_months: s.gb_months, restore_waits: s.waits, wait_hours: s.wait_ns as f64 / 3600e9, restores: s.restores, moved_bytes: s.moved, puts: s.puts, gets: s.gets }
        })
        .collect();
    Ok(TierReport { days: now as f64 / DAY_NS as f64, records, reads, bytes_written, unlocated, sheet: o.sheet.clone(), rows })
}

/// Unlocated reads are counted once, for the first policy's store.
fn stores_first_policy(o: &TierOptions) -> TierPolicy {
    o.policies.first().copied().unwrap_or(TierPolicy::AllStandard)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_model::trace::{write_trace, Record};

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    fn day(d: f64) -> u64 {
        (d * DAY_NS as f64) as u64
    }

    /// A file `ino` of one chunk `chunk` of `len` bytes in pack `chunk`.
    fn file(t: u64, ino: u64, chunk: u64, len: u64) -> Vec<Record> {
        vec![
            Record { time: t, event: Event::Write { ino, offset: 0, len } },
            Record { time: t, event: Event::Place { ino, offset: 0, len, chunk, described: false } },
            Record { time: t, event: Event::Chunk { chunk, pack: chunk, offset: 0, len } },
            Record { time: t, event: Event::Pack { pack: chunk, size: len, stage: PackStage::Uploaded } },
        ]
    }

    fn read(t: u64, ino: u64) -> Record {
        Record { time: t, event: Event::Read { ino, offset: 0, len: 1 } }
    }

    fn run(records: &[Record], o: &TierOptions) -> TierReport {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t.trace");
        write_trace(&p, 0, records).unwrap();
        simulate_tiers(&p, o).unwrap()
    }

    fn row(r: &TierReport, p: TierPolicy) -> &TierRow {
        r.rows.iter().find(|x| x.policy == p).unwrap()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1e-9)
    }

    #[test]
    fn all_standard_bills_gb_months_and_requests() {
        let mut recs = file(0, 1, 1, GIB);
        recs.push(read(day(DAYS_PER_MONTH), 1));
        let r = run(&recs, &TierOptions::default());
        let b = &row(&r, TierPolicy::AllStandard).bill;
        assert!(close(b.storage, 0.023), "{b:?}");
        assert!(close(b.requests, (0.005 + 0.0004) / 1000.0), "{b:?}");
        assert_eq!((b.retrieval, b.early_deletion, b.monitoring), (0.0, 0.0, 0.0));
    }

    #[test]
    fn intelligent_tiering_follows_its_published_rules() {
        let mut recs = file(0, 1, 1, GIB);
        recs.extend(file(0, 2, 2, 64 << 10));
        recs.push(read(day(120.0), 3)); // nothing: ends the trace at day 120
        let o = TierOptions { policies: vec![TierPolicy::Intelligent], ..TierOptions::default() };
        let r = run(&recs, &o);
        let it = row(&r, TierPolicy::Intelligent);
        let small = (64 << 10) as f64 / GIB as f64;
        let want = (30.0 * 0.023 + 60.0 * 0.0125 + 30.0 * 0.004 + 120.0 * 0.023 * small) / DAYS_PER_MONTH;
        assert!(close(it.bill.storage, want), "{:?} want {want}", it.bill);
        // One object monitored (the 64 KiB one is not).
        assert!(close(it.bill.monitoring, 0.0025 / 1000.0 * 120.0 / DAYS_PER_MONTH), "{:?}", it.bill);
        assert!(close(it.gb_months["IT_ARCHIVE_INSTANT"], 30.0 / DAYS_PER_MONTH));
        // A read brings the object back to the frequent tier, for 30 days.
        let mut recs = file(0, 1, 1, GIB);
        recs.push(read(day(89.0), 1));
        recs.push(read(day(120.0), 3));
        let it = run(&recs, &o).rows.remove(0);
        assert!(close(it.bill.storage, (60.0 * 0.023 + 60.0 * 0.0125) / DAYS_PER_MONTH), "{:?}", it.bill);
    }

    #[test]
    fn pinned_glacier_reads_wait_for_restores() {
        let mut recs = file(0, 1, 1, GIB);
        recs.push(read(day(100.0), 1));
        recs.push(read(day(100.0) + 3_600_000_000_000, 1));
        recs.push(read(day(100.5), 1)); // restored copy readable
        recs.push(read(day(103.0), 1)); // the copy expired: restore again
        let o = TierOptions { policies: vec![TierPolicy::Pins], pins: parse_pins("# backups\n1 1 GLACIER\n").unwrap(), ..TierOptions::default() };
        let p = run(&recs, &o).rows.remove(0);
        assert_eq!((p.restores, p.restore_waits), (2, 3));
        assert!(close(p.wait_hours, 4.0 + 3.0 + 4.0), "{}", p.wait_hours);
        assert!(close(p.bill.retrieval, 2.0 * 0.01), "{:?}", p.bill);
        assert!(p.gb_months.contains_key("GLACIER") && !p.gb_months.contains_key("STANDARD"));
    }

    #[test]
    fn cairn_moves_cold_chunks_down_and_keeps_shared_hot_ones_warm() {
        // File 1 (chunk 1) is read daily; file 2 holds chunk 2 and shares
        // chunk 1; nobody reads file 2.
        let mut recs = file(0, 1, 1, 64 * MIB);
        recs.extend(file(0, 2, 2, 64 * MIB));
        recs.push(Record { time: 0, event: Event::Place { ino: 2, offset: 64 * MIB, len: 64 * MIB, chunk: 1, described: false } });
        for d in 1..300 {
            recs.push(read(day(d as f64), 1));
        }
        let r = run(&recs, &TierOptions::default());
        let (c, s) = (row(&r, TierPolicy::Cairn), row(&r, TierPolicy::AllStandard));
        assert_eq!(c.restore_waits, 0, "the shared chunk stayed instant");
        let archived: f64 = ["GLACIER", "DEEP_ARCHIVE"].iter().filter_map(|k| c.gb_months.get(*k)).sum();
        assert!(archived > 64.0 / 1024.0 * 200.0 / DAYS_PER_MONTH, "{:?}", c.gb_months);
        let std_gbm = c.gb_months["STANDARD"];
        assert!(std_gbm >= 64.0 / 1024.0 * 299.0 / DAYS_PER_MONTH, "{:?}", c.gb_months);
        // Only the cold chunk moved, once: after --cold-after days without
        // access (it was written), straight to an archive class.
        assert_eq!(c.moved_bytes, 64 * MIB);
        assert!(c.bill.total < 0.7 * s.bill.total, "cairn {:?} standard {:?}", c.bill, s.bill);
    }

    #[test]
    fn bad_pins_and_traces_are_clear_errors() {
        assert_eq!(parse_pins("1 2").unwrap_err(), "pins line 1: three fields (expected `FROM TO CLASS`): \"1 2\"");
        assert!(parse_pins("5 1 GLACIER").unwrap_err().contains("TO is below FROM"));
        assert!(parse_pins("1 5 ICE").unwrap_err().contains("unknown class"));
        assert_eq!(parse_pins("1 5 cold\n").unwrap(), vec![PinRange { from: 1, to: 5, class: Class::Glacier }]);
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x");
        std::fs::write(&p, b"not a trace at all, not at all").unwrap();
        assert_eq!(simulate_tiers(&p, &TierOptions::default()).unwrap_err().to_string(), "not a Cairn trace: bad magic");
        let mut o = TierOptions::default();
        o.rule.horizon_days = 0.0;
        assert!(simulate_tiers(&p, &o).unwrap_err().to_string().contains("horizon"));
    }
}
