//! The trace-driven simulator behind `cairn sim` (docs/frugal.md §4): a
//! trace recorded by `cairn mount --trace` (docs/trace.md) replayed against
//! cache policies × object layouts × cache sizes, each priced, as seed 004
//! compares Coral with BlueSky (§4.2, fig. 9) and its policies (§4.3, fig.
//! 12–13).
//!
//! Two passes over the trace: the first ([`survey`]) learns what the whole
//! trace tells about packs (sizes, segments) and each layout's data set
//! (the distinct stored bytes it reads or writes), which sets the cache
//! sizes; the second replays every record through a [`model`] of the
//! files, each layout's [`layout`] mapping, and one [`cache`] per policy
//! and size, the caches of a batch of records on parallel threads.
//! [`replay_live`] replays the live cache's own records instead.

mod cache;
mod layout;
mod live;
mod model;
mod repack;
mod survey;
pub mod tiering;
pub mod workloads;

pub use cache::{Counts, POLICIES};
pub use layout::{LayoutKind, Uploads, LOG_BLOCK, PACK_BLOCK};
pub use live::{replay_live, LiveReport};
pub use repack::{PackOrder, Repacking};
pub use survey::Summary;
pub use tiering::{simulate_tiers, TierOptions, TierPolicy, TierReport};

use cache::{Batch, Op, Policy, SimCache};
use cairn_model::prices::{Prices, GB, MONTH_SECS};
use cairn_model::trace::{TraceError, TraceReader};
use layout::{Layout, Unit};
use model::{Io, Model, Step};
use rayon::prelude::*;
use serde::Serialize;
use std::path::Path;

/// Why a simulation cannot run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error("{0}")]
    Invalid(String),
}

/// What to simulate.
#[derive(Clone, Debug)]
pub struct Options {
    /// Cache sizes in percent of each layout's data set...
    pub cache_percents: Vec<f64>,
    /// ...or of one size for every layout (the same cache in bytes).
    pub percent_of: Option<PercentOf>,
    /// Also each layout with a cache of exactly this many bytes (the live
    /// cache's size: its rows are marked `at_capacity`).
    pub cache_bytes: Option<u64>,
    /// Policy names (of [`POLICIES`]).
    pub policies: Vec<String>,
    pub layouts: Vec<LayoutKind>,
    pub prices: Prices,
    /// The `cairn` layout's fetch unit (the live cache's block by default).
    pub pack_block: u64,
    /// The `cairn` layout's read-ahead within a pack (the live cache's
    /// `--cache-ahead`).
    pub pack_ahead: u64,
    /// How the rounds are packed (default: as recorded).
    pub repacking: Repacking,
}

/// What the cache percentages are of, when every layout gets the same
/// cache in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PercentOf {
    Bytes(u64),
    /// This layout's data set (`bluesky`: the distinct bytes the trace
    /// reads or writes, as they are, no dedup or compression).
    DataSetOf(LayoutKind),
}

/// What one layout, policy and cache size cost.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub layout: LayoutKind,
    pub policy: String,
    pub cache_percent: f64,
    pub cache_bytes: u64,
    /// The cache was `Options::cache_bytes` bytes, not a percentage.
    #[serde(default)]
    pub at_capacity: bool,
    /// Reads of stored data, and those that needed no GET.
    pub reads: u64,
    pub hits: u64,
    pub hit_ratio: f64,
    pub gets: u64,
    pub puts: u64,
    pub posts: u64,
    pub bytes_down: u64,
    pub bytes_up: u64,
    /// Stored GB-months over the trace's duration.
    pub storage_gb_months: f64,
    /// Dollars: requests, transfer, storage, and their sum.
    pub cost_requests: f64,
    pub cost_transfer: f64,
    pub cost_storage: f64,
    pub cost: f64,
}

/// A layout's data set: the distinct stored bytes the trace reads or writes.
#[derive(Clone, Debug, Serialize)]
pub struct DataSet {
    pub layout: LayoutKind,
    pub bytes: u64,
}

/// The result of [`simulate`].
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub summary: Summary,
    pub prices: Prices,
    pub data_sets: Vec<DataSet>,
    pub rows: Vec<Row>,
}

/// Records replayed between two runs of the caches.
const BATCH: usize = 1 << 15;

/// One layout's replay: its mapping, its caches (policy, percent,
/// capacity), and the operations waiting for them.
struct Lane {
    layout: Layout,
    /// (policy, percent, bytes, sized by `Options::cache_bytes`, cache)
    caches: Vec<(String, f64, u64, bool, SimCache)>,
    batch: Batch,
}

impl Lane {
    fn step(&mut self, s: &Step, time: u64, packs: &layout::Packs, scratch: &mut Vec<Unit>) {
        if let Some(io) = s.io {
            self.batch.ops.push(Op::Io(io));
        }
        if s.io == Some(Io::Read) {
            let local = self.layout.read_units(s, packs, scratch);
            self.batch.push(scratch, |units| Op::Read { group: s.ino, local, units });
        }
        self.layout.write_units(s, packs, scratch);
        if !scratch.is_empty() {
            self.batch.push(scratch, |units| Op::Admit { group: s.ino, units });
        }
        if let (Some(p), layout::LayoutKind::Cairn) = (s.dropped, self.layout.kind) {
            self.batch.ops.push(Op::Drop(p));
        }
        self.layout.uploaded(s, time);
    }
}

/// Runs every cache of every lane over its lane's batch, in parallel.
fn run_caches(lanes: &mut [Lane]) {
    let mut work: Vec<(&Batch, &mut SimCache)> = Vec::new();
    for l in lanes.iter_mut() {
        let batch = &l.batch;
        work.extend(l.caches.iter_mut().map(|c| (batch, &mut c.4)));
    }
    work.into_par_iter().for_each(|(b, c)| c.run(b));
    for l in lanes {
        l.batch.clear();
    }
}

/// Replays the trace at `path` (see the crate docs).
pub fn simulate(path: &Path, o: &Options) -> Result<Report, SimError> {
    if let Some(p) = o.policies.iter().find(|p| Policy::named(p).is_none()) {
        return Err(SimError::Invalid(format!("unknown policy {p:?} (known: {})", POLICIES.join(", "))));
    }
    if let Some(p) = o.cache_percents.iter().find(|p| !(p.is_finite() && **p > 0.0)) {
        return Err(SimError::Invalid(format!("cache size {p}% is not a positive percentage")));
    }
    let plan = std::sync::Arc::new(if o.repacking.is_recorded() { repack::Plan::default() } else { repack::plan(path, &o.repacking)? });
    let s = survey::survey(path, &plan)?;
    let end = s.summary.duration_ns;
    // The live cache's rules: the alignment asked for, gaps closer than a
    // GET's price in transfer merged.
    let rules = cairn_model::cache::extent::FetchRules {
        align: o.pack_block,
        merge_below: cairn_model::cache::extent::merge_below(o.prices.per_1000_requests.get, o.prices.transfer_down_per_gb),
        ahead: o.pack_ahead,
    };
    let sizes = std::sync::Arc::new(s.packs.sizes.clone());
    let basis = |kind| match o.percent_of {
        None => s.data_set(kind),
        Some(PercentOf::Bytes(b)) => b,
        Some(PercentOf::DataSetOf(k)) => s.data_set(k),
    };
    let mut lanes: Vec<Lane> = o
        .layouts
        .iter()
        .map(|&kind| {
            let data = s.data_set(kind);
            let mut caches = Vec::new();
            let cache = |name: &str, capacity: u64| {
                let c = SimCache::new(Policy::named(name).expect("checked above"), capacity);
                if kind == LayoutKind::Cairn {
                    c.with_extents(rules, sizes.clone())
                } else {
                    c
                }
            };
            for name in &o.policies {
                if let Some(b) = o.cache_bytes {
                    let pct = if data == 0 { 0.0 } else { b as f64 * 100.0 / data as f64 };
                    caches.push((name.clone(), pct, b, true, cache(name, b)));
                }
                for &pct in &o.cache_percents {
                    let capacity = (basis(kind) as f64 * pct / 100.0) as u64;
                    caches.push((name.clone(), pct, capacity, false, cache(name, capacity)));
                }
            }
            Lane { layout: Layout::new(kind, end), caches, batch: Batch::default() }
        })
        .collect();
    let mut model = Model::with_plan(plan);
    let mut step = Step::default();
    let mut scratch = Vec::new();
    for (i, r) in TraceReader::open(path)?.enumerate() {
        let r = r?;
        model.apply(&r.event, &mut step);
        for l in &mut lanes {
            l.step(&step, r.time, &s.packs, &mut scratch);
        }
        if i % BATCH == BATCH - 1 {
            run_caches(&mut lanes);
        }
    }
    run_caches(&mut lanes);
    let mut rows = Vec::new();
    for l in &mut lanes {
        let up = l.layout.finish(&model, &s.packs);
        for (policy, pct, capacity, at_capacity, c) in &l.caches {
            let mut r = row(l.layout.kind, policy, *pct, *capacity, &c.counts, &up, &o.prices);
            r.at_capacity = *at_capacity;
            rows.push(r);
        }
    }
    let data_sets = o.layouts.iter().map(|&layout| DataSet { layout, bytes: s.data_set(layout) }).collect();
    Ok(Report { summary: s.summary, prices: o.prices.clone(), data_sets, rows })
}

fn row(layout: LayoutKind, policy: &str, pct: f64, capacity: u64, c: &Counts, up: &Uploads, p: &Prices) -> Row {
    let per = |price_per_1000: f64, n: u64| n as f64 * price_per_1000 / 1000.0;
    let r = &p.per_1000_requests;
    let cost_requests = per(r.get, c.gets) + per(r.put, up.puts) + per(r.post, up.posts);
    let cost_transfer = c.bytes_down as f64 / GB * p.transfer_down_per_gb + up.bytes_up as f64 / GB * p.transfer_up_per_gb;
    let storage_gb_months = up.byte_seconds / GB / MONTH_SECS;
    let cost_storage = storage_gb_months * p.storage_per_gb_month;
    Row {
        layout,
        policy: policy.to_string(),
        cache_percent: pct,
        cache_bytes: capacity,
        at_capacity: false,
        reads: c.reads,
        hits: c.hits,
        hit_ratio: if c.reads == 0 { 0.0 } else { c.hits as f64 / c.reads as f64 },
        gets: c.gets,
        puts: up.puts,
        posts: up.posts,
        bytes_down: c.bytes_down,
        bytes_up: up.bytes_up,
        storage_gb_months,
        cost_requests,
        cost_transfer,
        cost_storage,
        cost: cost_requests + cost_transfer + cost_storage,
    }
}
