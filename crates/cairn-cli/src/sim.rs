//! `cairn sim`: replays an access trace (docs/trace.md) with `cairn-sim`
//! and prints one table.

use crate::size::human;
use anyhow::{bail, Result};
use cairn_sim::{LayoutKind, LiveReport, Options, PackOrder, PercentOf, Repacking, Report};
use std::path::Path;

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
