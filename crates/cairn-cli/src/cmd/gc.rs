//! `cairn gc`: free dead space, or show what would be freed.

use crate::show::{human_duration, money};
use crate::volume::{PassArgs, VolumeArgs, VolumeDir, maintain, open_volume};
use crate::{logging, meta_url, size, target};
use anyhow::{bail, Context, Result};
use cairn_engine::maintenance;
use std::path::Path;

/// Free packs without live chunks and repack mostly-dead ones (the
/// volume must not be mounted), or with --dry-run show what would be
/// cleaned (mounted or not).
///
/// A mount of a volume in a bucket cleans by itself, each pack at the
/// moment its dead bytes have cost in storage what cleaning it costs
/// (seed 004's theorem 1: the least total cost); `gc` cleans every pack
/// below --repack-below now, whatever that costs.
#[derive(clap::Args)]
pub struct GcArgs {
    #[command(flatten)]
    pub vol: VolumeArgs,
    /// Repack packs whose live share of bytes is below this fraction.
    #[arg(long, default_value_t = 0.5)]
    pub repack_below: f64,
    /// Change nothing: list the packs `gc` would clean; for a volume in
    /// a bucket also each pack's cost so far, cost of cleaning, and when
    /// the mount's cleaner will clean it.
    #[arg(long)]
    pub dry_run: bool,
    /// With --dry-run: the price table the cleaner's plan is shown at
    /// (as for `cairn cost`: aws, coral, local or a TOML file; default
    /// aws in a bucket, local in a directory).
    #[arg(long, value_name = "aws|coral|local|FILE")]
    pub prices: Option<String>,
    /// Metadata in PostgreSQL: a fixed number of seconds a chunk whose
    /// last reference went is left alone before gc may delete it.
    /// Default: until no flush round that began before it died (less
    /// 5 s) is under way on any machine, since such a round may have
    /// found it by hash and be about to reference it (one that finds it
    /// dead and loses it stores it again).
    #[arg(long, value_name = "SECONDS")]
    pub chunk_grace: Option<u64>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: GcArgs, verbose: u8) -> Result<i32> {
    let GcArgs { vol: VolumeArgs { volume: dir, cloud, meta, pass }, repack_below, dry_run, prices, chunk_grace, json } = a;
    logging::init(verbose, None)?;
    meta.check()?;
    let volume_arg = dir.clone();
    if !(0.0..=1.0).contains(&repack_below) {
        bail!("--repack-below must be between 0 and 1");
    }
    if dry_run {
        let vd = VolumeDir::query(&dir, &cloud)?;
        let in_bucket = vd.mount.as_ref().map_or(target::is_url(&volume_arg), |m| target::is_url(&m.volume));
        let prices = match prices.as_deref() {
            Some(p) => cairn_engine::cost::Prices::load(p)?,
            None if in_bucket => cairn_engine::cost::Prices::aws(),
            None => cairn_engine::cost::Prices::local_disk(),
        };
        return gc_dry_run(&vd.path, repack_below, &prices, json, &pass, &meta);
    }
    let vd = VolumeDir::unmounted(&dir, &cloud, "gc")?;
    let dir = vd.path;
    let grace = chunk_grace.map(std::time::Duration::from_secs);
    let rep = maintain(&dir, &pass, &meta, json, |o| o.chunk_grace = grace, |vol, bars| maintenance::gc(vol, repack_below, bars))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&rep)?);
    } else {
        if rep.packs_settling > 0 {
            println!("{} packs left for a later gc: a chunk of theirs lost its last reference less than the chunk grace ago (--chunk-grace)", rep.packs_settling);
        }
        if rep.packs_kept > 0 {
            println!("{} packs kept: another writer referenced their dead chunks again while gc ran (the next gc takes them)", rep.packs_kept);
        }
        if target::is_url(&volume_arg) {
            // In a bucket a dropped pack goes to the trash first: an
            // older metadata version may still name it.
            println!(
                "{} packs ({} repacked) and {} orphan packs put in the trash, {} dead chunks dropped; the bucket's packs take {} (were {}) until the trash is emptied",
                rep.packs_deleted,
                rep.packs_repacked,
                rep.orphans_deleted,
                rep.chunks_deleted,
                size::human(rep.bytes_after),
                size::human(rep.bytes_before)
            );
            println!("(trashed packs are deleted from the bucket once no kept metadata version names them, after a few more metadata bases; with the metadata in PostgreSQL, by a mount an hour after gc trashed them)");
            return Ok(0);
        }
        println!(
            "deleted {} packs ({} repacked), {} orphan packs, {} dead chunks; backend {} -> {}",
            rep.packs_deleted,
            rep.packs_repacked,
            rep.orphans_deleted,
            rep.chunks_deleted,
            size::human(rep.bytes_before),
            size::human(rep.bytes_after)
        );
    }
    Ok(0)
}

/// `cairn gc --dry-run`: what `gc` would clean and, in a bucket, the
/// cleaner's plan (from the mount if there is one, else read-only).
fn gc_dry_run(dir: &Path, repack_below: f64, prices: &cairn_engine::cost::Prices, json: bool, pass: &PassArgs, meta: &meta_url::MetaArgs) -> Result<i32> {
    use cairn_engine::cleaner::PackCost;
    let sock = cairn_engine::control::socket_path(dir);
    let mounted = cairn_engine::control::call(&sock, &cairn_engine::control::Request::GcPlan { prices: prices.clone() })?;
    let (plan, candidates): (Option<Vec<PackCost>>, Option<Vec<maintenance::GcCandidate>>) = match mounted {
        Some(v) => (Some(serde_json::from_value(v).context("reading the plan from the mount")?), None),
        None => {
            let vol = open_volume(dir, pass, meta, true, None)?;
            let now = cairn_engine::Timestamp::now().0;
            let plan = Some(cairn_engine::cleaner::plan(&vol, now, prices)?);
            let cands = maintenance::gc_candidates(&vol, repack_below)?;
            vol.close()?;
            (plan, Some(cands))
        }
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "cleaner": plan, "gc": candidates }))?);
        return Ok(0);
    }
    if let Some(c) = &candidates {
        let (dead, stored): (u64, u64) = c.iter().fold((0, 0), |(d, s), x| (d + x.dead_bytes, s + x.size));
        println!("`cairn gc` would clean {} packs ({} stored, {} of them dead; --repack-below {repack_below})", c.len(), size::human(stored), size::human(dead));
        for x in c {
            let what = if x.live_bytes == 0 { "delete".to_string() } else { format!("repack {} live", size::human(x.live_bytes)) };
            println!("  {}  {:>10}  {:>10} dead  {what}", x.name, size::human(x.size), size::human(x.dead_bytes));
        }
    } else {
        println!("(mounted: `cairn gc` needs the volume unmounted; the mount's cleaner works by the plan below)");
    }
    if let Some(plan) = &plan {
        println!();
        let now = cairn_engine::Timestamp::now().0;
        let due: Vec<&PackCost> = plan.iter().filter(|p| p.due()).collect();
        let what = if due.is_empty() {
            match plan.iter().filter_map(|p| p.due_at).min() {
                Some(t) => format!("the next is due in {}", human_duration((t - now).max(0) as f64 / 1e9)),
                None => "none will be (storage is free)".to_string(),
            }
        } else {
            let cost: f64 = due.iter().fold(0.0, |a, p| a + p.c_clean);
            let save: f64 = due.iter().fold(0.0, |a, p| a + p.dead_per_month);
            format!("cleaning them costs {} and saves {} a month", money(cost), money(save))
        };
        println!("the cost-optimal cleaner ({}): {} of {} packs with dead bytes are due; {what}", prices.name, due.len(), plan.len());
        println!("  {:<40} {:>10} {:>10} {:>5} {:>12} {:>12} {:>12}  due", "pack", "dead", "live", "GETs", "dead so far", "to clean", "dead/month");
        for p in plan {
            let when = if p.uploading {
                "after its upload".to_string()
            } else if p.due() {
                "now".to_string()
            } else {
                p.due_at.map_or("never (storage is free)".to_string(), |t| format!("in {}", human_duration((t - now).max(0) as f64 / 1e9)))
            };
            println!(
                "  {:<40} {:>10} {:>10} {:>5} {:>12} {:>12} {:>12}  {when}",
                p.name,
                size::human(p.dead_bytes),
                size::human(p.live_bytes),
                p.gets,
                money(p.c_store),
                money(p.c_clean),
                money(p.dead_per_month)
            );
        }
    }
    Ok(0)
}

