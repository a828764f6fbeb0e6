//! `cairn gc`: free dead space, or show what would be freed.

use crate::show::{human_duration, money};
use crate::volume::{maintain, open_volume, VolumeArgs, VolumeDir};
use crate::{logging, size, target};
use anyhow::{bail, Context, Result};
use cairn_engine::cost::Prices;
use cairn_engine::maintenance;
use cairn_engine::report::{self, Due, GcPreview};
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
    let GcArgs { vol, repack_below, dry_run, prices, chunk_grace, json } = a;
    logging::init(verbose, None)?;
    vol.meta.check()?;
    if !(0.0..=1.0).contains(&repack_below) {
        bail!("--repack-below must be between 0 and 1");
    }
    if dry_run {
        let vd = VolumeDir::query(&vol.volume, &vol.cloud)?;
        let in_bucket = vd.mount.as_ref().map_or(target::is_url(&vol.volume), |m| target::is_url(&m.volume));
        let prices = report::cleaner_prices(prices.as_deref(), in_bucket)?;
        let preview = preview(&vd.path, repack_below, &prices, &vol)?;
        if json {
            println!("{}", serde_json::to_string_pretty(&preview)?);
        } else {
            print_preview(&preview, repack_below, &prices);
        }
        return Ok(0);
    }
    let dir = VolumeDir::unmounted(&vol.volume, &vol.cloud, "gc")?.path;
    let grace = chunk_grace.map(std::time::Duration::from_secs);
    let rep = maintain(&dir, &vol.pass, &vol.meta, json, |o| o.chunk_grace = grace, |v, bars| maintenance::gc(v, repack_below, bars))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&rep)?);
    } else {
        print_report(&rep, target::is_url(&vol.volume));
    }
    Ok(0)
}

/// `cairn gc` for a terminal.
fn print_report(rep: &maintenance::GcReport, in_bucket: bool) {
    if rep.packs_settling > 0 {
        println!("{} packs left for a later gc: a chunk of theirs lost its last reference less than the chunk grace ago (--chunk-grace)", rep.packs_settling);
    }
    if rep.packs_kept > 0 {
        println!("{} packs kept: another writer referenced their dead chunks again while gc ran (the next gc takes them)", rep.packs_kept);
    }
    if in_bucket {
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
        return;
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

/// `cairn gc --dry-run`: what `gc` would clean and, in a bucket, the
/// cleaner's plan (from the mount if there is one, else read-only).
fn preview(dir: &Path, repack_below: f64, prices: &Prices, vol: &VolumeArgs) -> Result<GcPreview> {
    let sock = cairn_engine::control::socket_path(dir);
    match cairn_engine::control::call(&sock, &cairn_engine::control::Request::GcPlan { prices: prices.clone() })? {
        Some(v) => Ok(GcPreview { cleaner: Some(serde_json::from_value(v).context("reading the plan from the mount")?), gc: None }),
        None => {
            let v = open_volume(dir, &vol.pass, &vol.meta, true, None)?;
            let preview = report::gc_preview(&v, repack_below, prices, cairn_engine::Timestamp::now().0);
            v.close()?;
            Ok(preview?)
        }
    }
}

/// `cairn gc --dry-run` for a terminal.
fn print_preview(preview: &GcPreview, repack_below: f64, prices: &Prices) {
    if let Some(c) = &preview.gc {
        let t = report::candidate_totals(c);
        println!("`cairn gc` would clean {} packs ({} stored, {} of them dead; --repack-below {repack_below})", t.packs, size::human(t.stored), size::human(t.dead));
        for x in c {
            let what = if x.live_bytes == 0 { "delete".to_string() } else { format!("repack {} live", size::human(x.live_bytes)) };
            println!("  {}  {:>10}  {:>10} dead  {what}", x.name, size::human(x.size), size::human(x.dead_bytes));
        }
    } else {
        println!("(mounted: `cairn gc` needs the volume unmounted; the mount's cleaner works by the plan below)");
    }
    let Some(plan) = &preview.cleaner else { return };
    println!();
    let now = cairn_engine::Timestamp::now().0;
    let sum = report::plan_summary(plan, now);
    let what = if sum.due == 0 {
        match sum.next_due_in {
            Some(s) => format!("the next is due in {}", human_duration(s)),
            None => "none will be (storage is free)".to_string(),
        }
    } else {
        format!("cleaning them costs {} and saves {} a month", money(sum.cost_due), money(sum.saves_per_month))
    };
    println!("the cost-optimal cleaner ({}): {} of {} packs with dead bytes are due; {what}", prices.name, sum.due, sum.packs);
    println!("  {:<40} {:>10} {:>10} {:>5} {:>12} {:>12} {:>12}  due", "pack", "dead", "live", "GETs", "dead so far", "to clean", "dead/month");
    for p in plan {
        let when = match report::due(p, now) {
            Due::AfterUpload => "after its upload".to_string(),
            Due::Now => "now".to_string(),
            Due::In(s) => format!("in {}", human_duration(s)),
            Due::Never => "never (storage is free)".to_string(),
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
