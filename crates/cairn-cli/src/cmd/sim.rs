//! `cairn sim`: replay an access trace against cache policies and layouts.

use crate::{logging, size};
use anyhow::Result;
use std::path::PathBuf;

/// Replay an access trace (`cairn mount --trace`) against cache
/// policies, object layouts and cache sizes, and price each: hit ratio,
/// GETs, PUTs, bytes down and up, and the bill (requests, transfer, and
/// storage for the trace's duration).
///
/// Layouts: `cairn` (the recorded placement; the cache fetches what a
/// read misses, as the live cache: see --pack-block and --pack-ahead),
/// `cairn-segment` (the recorded
/// placement; a miss fetches each needed segment, the run of one file's
/// chunks in one pack, adjacent ones in one GET), `bluesky` (writes
/// appended to a log in request order, no dedup or compression, sealed
/// into 4 MiB objects; a miss fetches the missing 32 KiB blocks of an
/// object, one GET per run). Every layout caches what it writes. Cache
/// sizes are percentages of each layout's data set (the distinct stored
/// bytes the trace reads or writes), or with --cache-of of one size for
/// every layout (the same cache in bytes). With --live, the live cache's own
/// records are replayed instead: the hit ratio the mount had, or would
/// have had with another policy or --capacity.
///
/// With --tier-policies, the trace is replayed over its time against
/// storage-class policies instead (docs/tiers.md §8): all-standard,
/// intelligent (S3 Intelligent-Tiering's rules), pins (JuiceFS-style, from
/// --tier-pins) and cairn (the planner of docs/tiers.md §4, once a
/// simulated day), each billed: storage per class, requests, retrieval,
/// early deletion, monitoring, and the reads that waited for a restore.
/// With --generate WORKLOAD, TRACE is written instead: a year (--days) of
/// a synthetic workload, and its pins beside it (TRACE.pins).
#[derive(clap::Args)]
pub struct SimArgs {
    /// The trace file.
    pub trace: PathBuf,
    /// Cache sizes, in percent of the data set.
    #[arg(long, default_value = "2,5,10,20", value_delimiter = ',')]
    pub cache_sizes: Vec<f64>,
    /// The cache sizes are percentages of SIZE, or of the data set of
    /// LAYOUT (`bluesky`: the distinct bytes the trace reads or writes,
    /// as written), for every layout: each gets the same cache in bytes.
    /// Without it, of each layout's own data set.
    #[arg(long, value_name = "SIZE|LAYOUT")]
    pub cache_of: Option<String>,
    /// Eviction policies: lru, kd (Coral's kd-tree), and kd on one
    /// metric alone: ti (file recency), tb (block recency), h (hotness).
    #[arg(long, default_value = "lru,kd,ti,tb,h", value_delimiter = ',')]
    pub policies: Vec<String>,
    /// Layouts: cairn, cairn-segment, bluesky.
    #[arg(long, default_value = "cairn,cairn-segment,bluesky", value_delimiter = ',')]
    pub layouts: Vec<String>,
    /// The price table (as for `cairn cost`: aws, coral or a TOML file).
    #[arg(long, default_value = "aws", value_name = "aws|coral|FILE")]
    pub prices: String,
    /// Replay the live cache's own records (a volume in a bucket).
    #[arg(long)]
    pub live: bool,
    /// With --live: the cache's size (default: the live cache's).
    /// Without: each layout is also simulated with a cache of exactly
    /// this size (e.g. the live cache's, to set the simulated bill of
    /// Cairn's layout beside the live one), in rows marked
    /// `at_capacity`.
    #[arg(long, value_parser = size::parse)]
    pub capacity: Option<u64>,
    /// The `cairn` layout's fetch alignment, as a mount's `--cache-block`:
    /// 0 (the live cache's default) fetches exactly what a read misses;
    /// SIZE rounds each miss out to aligned blocks of SIZE.
    #[arg(long, default_value = "0", value_parser = size::parse)]
    pub pack_block: u64,
    /// The `cairn` layout's read-ahead within a pack, as a mount's
    /// `--cache-ahead`: a miss starting where the pack's last GET ended
    /// fetches this much more (0: none).
    #[arg(long, default_value = "256K", value_parser = size::parse)]
    pub pack_ahead: u64,
    /// The order of files within each flush round's packs (the cairn
    /// layouts): `recorded` (as the flusher wrote them), `kd` (by each
    /// file's last read before the round, Coral's t_i), `next-read` (by
    /// each file's first read after the round: an oracle, the most any
    /// order can give).
    #[arg(long, default_value = "recorded", value_name = "recorded|kd|next-read")]
    pub pack_order: String,
    /// Open packs (the cairn layouts): each round's chunks are appended
    /// to the pack still open in the outbox, sealed and uploaded once
    /// it holds SIZE (e.g. the volume's pack size), or at the first
    /// round --open-pack-age or more after it opened, or at the trace's
    /// end. 0: every round seals its own packs, as recorded.
    #[arg(long, default_value = "0", value_parser = size::parse, value_name = "SIZE")]
    pub open_packs: u64,
    /// With --open-packs: the most seconds a pack stays open (a mount
    /// ships metadata every --meta-interval, 5 s by default, and a
    /// version may not name a pack the bucket does not hold).
    #[arg(long, default_value = "5", value_name = "SECS")]
    pub open_pack_age: f64,
    /// Storage-class policies to compare: all-standard, intelligent,
    /// pins, cairn (e.g. all four, comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub tier_policies: Vec<String>,
    /// The pins policy's pins: a file of `FROM TO CLASS` lines (inode
    /// numbers; CLASS e.g. GLACIER). Default: TRACE.pins if it exists.
    #[arg(long, value_name = "FILE")]
    pub tier_pins: Option<PathBuf>,
    /// Days over which a move must pay for itself.
    #[arg(long, default_value = "90", value_name = "DAYS")]
    pub tier_horizon: f64,
    /// No class that needs a restore for data read or written this many
    /// days ago or less.
    #[arg(long, default_value = "30", value_name = "DAYS")]
    pub cold_after: f64,
    /// Cairn's planner honours the pins too (as `cairn tier set` would).
    #[arg(long)]
    pub cairn_pins: bool,
    /// Write TRACE: a synthetic workload (fileserver, webserver, varmail,
    /// kernel, backup, media) over --days simulated days.
    #[arg(long, value_name = "WORKLOAD")]
    pub generate: Option<String>,
    /// With --generate: the random seed.
    #[arg(long, default_value = "1")]
    pub seed: u64,
    /// With --generate: simulated days.
    #[arg(long, default_value = "365")]
    pub days: u64,
    /// Print as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: SimArgs, verbose: u8) -> Result<i32> {
    let SimArgs { trace, cache_sizes, cache_of, policies, layouts, prices, live, capacity, pack_block, pack_ahead, pack_order, open_packs, open_pack_age, tier_policies, tier_pins, tier_horizon, cold_after, cairn_pins, generate, seed, days, json } = a;
    logging::init(verbose, None)?;
    if let Some(w) = generate {
        return crate::sim::generate(&trace, &w, seed, days);
    }
    if !tier_policies.is_empty() {
        return crate::sim::tiers(crate::sim::TierArgs { trace: &trace, policies: tier_policies, pins: tier_pins, horizon: tier_horizon, cold_after, cairn_pins, prices: &prices, json });
    }
    crate::sim::run(crate::sim::Args { trace: &trace, cache_sizes, cache_of, policies, layouts, prices: &prices, live, capacity, pack_block, pack_ahead, pack_order: &pack_order, open_packs, open_pack_age, json })
}
