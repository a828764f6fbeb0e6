//! `cairn sim`: replays an access trace (docs/trace.md) with `cairn-sim`
//! and prints one table.

use crate::size::human;
use anyhow::{bail, Result};
use cairn_sim::tiering::{format_pins, parse_pins, TierOptions, TierPolicy, TierReport};
use cairn_sim::{LayoutKind, LiveReport, Options, PackOrder, PercentOf, Repacking, Report};
use std::path::{Path, PathBuf};

/// `cairn sim --generate`: writes a synthetic trace and its pins.
pub fn generate(trace: &Path, workload: &str, seed: u64, days: u64) -> Result<i32> {
    if days == 0 {
        bail!("--days must be at least 1");
    }
    let g = cairn_sim::workloads::generate(workload, seed, days).map_err(anyhow::Error::msg)?;
    cairn_engine::trace::write_trace(trace, 0, &g.records).map_err(|e| anyhow::anyhow!("writing {}: {e}", trace.display()))?;
    let pins = pins_path(trace);
    std::fs::write(&pins, format_pins(&g.pins)).map_err(|e| anyhow::anyhow!("writing {}: {e}", pins.display()))?;
    println!("{}: {} records over {days} days ({workload}, seed {seed}); pins in {}", trace.display(), g.records.len(), pins.display());
    Ok(0)
}

fn pins_path(trace: &Path) -> PathBuf {
    let mut p = trace.as_os_str().to_owned();
    p.push(".pins");
    PathBuf::from(p)
}

/// What `cairn sim --tier-policies` was asked.
pub struct TierArgs<'a> {
    pub trace: &'a Path,
    pub policies: Vec<String>,
    pub pins: Option<PathBuf>,
    pub horizon: f64,
    pub cold_after: f64,
    pub cairn_pins: bool,
    pub prices: &'a str,
    pub json: bool,
}

/// `cairn sim --tier-policies`: bills each storage-class policy.
pub fn tiers(a: TierArgs) -> Result<i32> {
    let mut policies = Vec::new();
    for p in &a.policies {
        match TierPolicy::parse(p) {
            Some(p) => policies.push(p),
            None => bail!("unknown tier policy {p:?} (known: {})", TierPolicy::ALL.map(TierPolicy::name).join(", ")),
        }
    }
    let pins_file = match a.pins {
        Some(p) => Some(p),
        None => Some(pins_path(a.trace)).filter(|p| p.exists()),
    };
    let pins = match &pins_file {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("reading pins {}: {e}", p.display()))?;
            parse_pins(&text).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?
        }
        None => Vec::new(),
    };
    if !(a.horizon.is_finite() && a.horizon > 0.0) {
        bail!("--tier-horizon must be a positive number of days, not {}", a.horizon);
    }
    if !(a.cold_after.is_finite() && a.cold_after >= 0.0) {
        bail!("--cold-after must be a number of days, not {}", a.cold_after);
    }
    let prices = cairn_engine::cost::Prices::load(a.prices)?;
    let mut o = TierOptions { policies, sheet: prices.tier_sheet(), pins, cairn_pins: a.cairn_pins, ..TierOptions::default() };
    o.rule.horizon_days = a.horizon;
    o.rule.cold_after_days = a.cold_after;
    let r = cairn_sim::simulate_tiers(a.trace, &o)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print_tiers(&r, pins_file.as_deref());
    }
    Ok(0)
}

fn print_tiers(r: &TierReport, pins: Option<&Path>) {
    println!("trace: {} records over {:.1} days: {} reads, {} written{}", r.records, r.days, r.reads, human(r.bytes_written), if r.unlocated > 0 { format!("; {} chunk reads unlocated (left out)", r.unlocated) } else { String::new() });
    println!("prices: AWS us-east-1 list prices per class unless the price file has [tiers]; pins: {}", pins.map_or("none".to_string(), |p| p.display().to_string()));
    println!();
    println!("{:<13} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>9} {:>9} {:>8} {:>10}", "policy", "storage", "requests", "retrieval", "early del.", "monitoring", "total", "restores", "waits", "wait h", "moved");
    for row in &r.rows {
        let b = &row.bill;
        println!(
            "{:<13} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>9} {:>9} {:>8.1} {:>10}",
            row.policy.name(),
            format!("${:.4}", b.storage),
            format!("${:.4}", b.requests),
            format!("${:.4}", b.retrieval),
            format!("${:.4}", b.early_deletion),
            format!("${:.4}", b.monitoring),
            format!("${:.4}", b.total),
            row.restores,
            row.restore_waits,
            row.wait_hours,
            human(row.moved_bytes)
        );
    }
    println!();
    for row in &r.rows {
        let g: Vec<String> = row.gb_months.iter().map(|(k, v)| format!("{k} {v:.2}")).collect();
        println!("{:<13} GB-months: {}", row.policy.name(), g.join(", "));
    }
}

/// What `cairn sim` was asked.
pub struct Args<'a> {
    pub trace: &'a Path,
    pub cache_sizes: Vec<f64>,
    pub cache_of: Option<String>,
    pub policies: Vec<String>,
    pub layouts: Vec<String>,
    pub prices: &'a str,
    pub live: bool,
    pub capacity: Option<u64>,
    pub pack_block: u64,
    pub pack_ahead: u64,
    pub pack_order: &'a str,
    pub open_packs: u64,
    pub open_pack_age: f64,
    pub json: bool,
}

pub fn run(a: Args) -> Result<i32> {
    if a.live {
        let reports = a.policies.iter().map(|p| cairn_sim::replay_live(a.trace, p, a.capacity)).collect::<Result<Vec<_>, _>>()?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&reports)?);
        } else {
            print_live(&reports);
        }
        return Ok(0);
    }
    let mut layouts = Vec::new();
    for l in &a.layouts {
        match LayoutKind::parse(l) {
            Some(k) => layouts.push(k),
            None => bail!("unknown layout {l:?} (known: {})", LayoutKind::ALL.map(LayoutKind::name).join(", ")),
        }
    }
    let percent_of = match a.cache_of.as_deref() {
        None => None,
        Some(s) => Some(match LayoutKind::parse(s) {
            Some(k) => PercentOf::DataSetOf(k),
            None => PercentOf::Bytes(crate::size::parse(s).map_err(|e| anyhow::anyhow!("--cache-of {s:?}: neither a layout ({}) nor a size: {e}", LayoutKind::ALL.map(LayoutKind::name).join(", ")))?),
        }),
    };
    let Some(order) = PackOrder::parse(a.pack_order) else {
        bail!("unknown --pack-order {:?} (known: {})", a.pack_order, PackOrder::ALL.map(PackOrder::name).join(", "));
    };
    if !(a.open_pack_age.is_finite() && a.open_pack_age >= 0.0) {
        bail!("--open-pack-age must be a number of seconds, not {}", a.open_pack_age);
    }
    let repacking = Repacking { order, open_target: a.open_packs, open_age_ns: (a.open_pack_age * 1e9) as u64 };
    let prices = cairn_engine::cost::Prices::load(a.prices)?;
    let r = cairn_sim::simulate(a.trace, &Options { cache_percents: a.cache_sizes, percent_of, cache_bytes: a.capacity, policies: a.policies, layouts, prices, pack_block: a.pack_block, pack_ahead: a.pack_ahead, repacking })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print_report(&r);
    }
    Ok(0)
}

fn print_report(r: &Report) {
    let s = &r.summary;
    println!(
        "trace: {} records over {:.1} s: {} reads ({}), {} writes ({}){}",
        s.records,
        s.duration_ns as f64 / 1e9,
        s.reads,
        human(s.bytes_read),
        s.writes,
        human(s.bytes_written),
        if s.torn_tail { "; a torn last record was ignored" } else { "" }
    );
    if s.unlocated_chunks > 0 {
        println!("({} chunk reads had no recorded place and are left out of the cairn layouts)", s.unlocated_chunks);
    }
    let sets: Vec<String> = r.data_sets.iter().map(|d| format!("{} {}", d.layout.name(), human(d.bytes))).collect();
    println!("data sets: {}; prices: {}", sets.join(", "), r.prices.name);
    println!();
    println!("{:<14} {:<6} {:>16} {:>7} {:>9} {:>7} {:>7} {:>6} {:>10} {:>10} {:>12}", "layout", "policy", "cache", "hit%", "reads", "GET", "PUT", "POST", "down", "up", "cost");
    for row in &r.rows {
        println!(
            "{:<14} {:<6} {:>16} {:>6.1}% {:>9} {:>7} {:>7} {:>6} {:>10} {:>10} {:>12}",
            row.layout.name(),
            row.policy,
            format!("{}% {}", row.cache_percent, human(row.cache_bytes)),
            100.0 * row.hit_ratio,
            row.reads,
            row.gets,
            row.puts,
            row.posts,
            human(row.bytes_down),
            human(row.bytes_up),
            format!("${:.6}", row.cost)
        );
    }
}

fn print_live(reports: &[LiveReport]) {
    let Some(first) = reports.first() else { return };
    println!(
        "the live cache replayed at {} (blocks of {}); the live run counted {:.1}% hits ({} hits, {} misses)",
        human(first.capacity),
        human(first.block),
        100.0 * first.recorded_hit_ratio,
        first.recorded_hits,
        first.recorded_misses
    );
    println!();
    println!("{:<6} {:>7} {:>9} {:>9} {:>9} {:>10} {:>10}", "policy", "hit%", "hits", "misses", "GET", "fetched", "evictions");
    for r in reports {
        println!("{:<6} {:>6.1}% {:>9} {:>9} {:>9} {:>10} {:>10}", r.policy, 100.0 * r.hit_ratio, r.hits, r.misses, r.gets, human(r.bytes_fetched), r.evictions);
    }
}
