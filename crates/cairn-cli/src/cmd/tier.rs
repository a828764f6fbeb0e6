//! `cairn tier set|status`: pin a file or tree to a tier, and show where
//! its bytes are and what they cost a month (docs/tiers.md §5, §6).

use crate::edit::{ask, locate};
use crate::show::money;
use crate::volume::{open_volume, PassArgs, VolumeDir};
use crate::{logging, meta_url, size, target};
use anyhow::{bail, Context, Result};
use cairn_engine::control::Request;
use cairn_engine::cost::Prices;
use cairn_engine::tiers::{Class, TierSheet};
use cairn_engine::{TierPin, TierStatus};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Tiers of a volume: pin files and trees to a tier, and show the bytes
/// of a file or tree per tier with their monthly cost.
///
/// A pack lives in one tier at a time (the volume's home, or a storage
/// class of its bucket such as STANDARD_IA, GLACIER or DEEP_ARCHIVE, or a
/// tape). Pins tell the tier planner where a file's chunks must stay;
/// the planner itself (moves decided by the bill) is not built yet, so
/// today every pack is in the home tier and a pin is recorded only.
#[derive(clap::Args)]
pub struct TierArgs {
    #[command(subcommand)]
    pub op: TierCmd,
}

/// Where PATH is: inside a mount (the default), or in an unmounted volume.
#[derive(clap::Args)]
pub struct Where {
    /// An unmounted volume (a directory, s3://BUCKET/PREFIX or a tape):
    /// PATH is then a path from its root (`/` or `` for the root).
    /// Without it, PATH is inside a mount and the request goes through
    /// the mount's control socket.
    #[arg(long, value_name = "VOLUME")]
    pub volume: Option<String>,
    #[command(flatten)]
    pub cloud: target::CloudArgs,
    #[command(flatten)]
    pub meta: meta_url::MetaArgs,
    #[command(flatten)]
    pub pass: PassArgs,
}

#[derive(clap::Subcommand)]
pub enum TierCmd {
    /// Pin a file or directory to a tier: hot (the home; to be kept in
    /// the local cache too, once cache pinning is built), warm (the
    /// bucket's STANDARD class), cold (an archive class or the tape), or
    /// auto (the tier planner decides by the bill; clears a pin).
    ///
    /// Files and directories created later under a pinned directory take
    /// its pin (shown as inherited). -r also pins everything already in
    /// the tree. The pin is recorded; packs move when the tier planner
    /// runs (not built yet: today no pack leaves the home tier, whatever
    /// the pin).
    ///
    /// Through a mount only the owner of each file or root may pin it,
    /// as for chmod (EPERM otherwise, and nothing of the tree is pinned).
    Set {
        /// A file or directory inside a mount (or, with --volume, a path
        /// from the volume's root).
        path: PathBuf,
        /// hot, warm, cold or auto.
        #[arg(value_parser = parse_pin)]
        pin: TierPin,
        /// Pin every file and directory of the tree, not only PATH.
        #[arg(short = 'r', long)]
        recursive: bool,
        #[command(flatten)]
        at: Where,
    },
    /// Show a file's or tree's pin (and whether it was inherited from its
    /// directory at create), its bytes per tier (the tier of the pack
    /// each chunk is in; file bytes count each file's references, stored
    /// bytes each chunk once), the restores of its packs in flight, and
    /// the monthly storage cost of its stored bytes per tier from the
    /// price sheet. Flushes the mount first.
    Status {
        /// A file or directory inside a mount (or, with --volume, a path
        /// from the volume's root).
        path: PathBuf,
        /// The price sheet per storage class: aws (AWS us-east-1 list
        /// prices, the default), coral, or a TOML price file whose
        /// [tiers.CLASS] tables override them (`cairn cost --help`).
        #[arg(long, default_value = "aws", value_name = "aws|coral|FILE")]
        prices: String,
        /// Print as JSON (the status, and the monthly cost per tier).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        at: Where,
    },
}

fn parse_pin(s: &str) -> std::result::Result<TierPin, String> {
    TierPin::parse(s).ok_or_else(|| format!("{s:?} is no pin: say hot, warm, cold or auto"))
}

pub fn run(a: TierArgs, verbose: u8) -> Result<i32> {
    logging::init(verbose, None)?;
    match a.op {
        TierCmd::Set { path, pin, recursive, at } => set(&path, pin, recursive, &at),
        TierCmd::Status { path, prices, json, at } => status(&path, &prices, json, &at),
    }
}

/// `path` from the root of an unmounted volume, as bytes.
fn in_volume(path: &Path) -> Vec<u8> {
    path.as_os_str().as_bytes().to_vec()
}

fn set(path: &Path, pin: TierPin, recursive: bool, at: &Where) -> Result<i32> {
    let n = match &at.volume {
        Some(vol) => {
            at.meta.check()?;
            let dir = VolumeDir::unmounted(vol, &at.cloud, "tier set")?.path;
            let v = open_volume(&dir, &at.pass, &at.meta, false, None)?;
            let ino = v.resolve(&in_volume(path)).with_context(|| format!("{}", path.display()))?;
            let n = v.set_tier_pin(ino, pin, recursive)?;
            v.close()?;
            n
        }
        None => {
            let m = locate(path)?;
            let v = ask(&m, &Request::TierSet { path: m.rel.clone(), pin, recursive }).with_context(|| format!("{}", path.display()))?;
            v["pinned"].as_u64().context("reading the mount's answer")?
        }
    };
    println!(
        "{}: pinned {} ({} {}); the pin is recorded, packs move when the tier planner runs",
        path.display(),
        pin.name(),
        n,
        if n == 1 { "inode" } else { "inodes" }
    );
    Ok(0)
}

/// The monthly storage cost of `stored` bytes in `class` (None: a local
/// directory, not priced per class).
fn monthly(sheet: &TierSheet, class: &str, stored: u64) -> Option<f64> {
    let c = Class::parse(class)?;
    Some(stored as f64 / cairn_engine::cost::GB * sheet.of(c).storage_per_gb_month)
}

fn status(path: &Path, prices: &str, json: bool, at: &Where) -> Result<i32> {
    let sheet = Prices::load(prices).map_err(|e| anyhow::anyhow!("--prices {prices}: {e}"))?.tier_sheet();
    let s: TierStatus = match &at.volume {
        Some(vol) => {
            at.meta.check()?;
            let dir = VolumeDir::query(vol, &at.cloud)?;
            if dir.mount.is_some() {
                bail!("{vol} is mounted: give a path inside the mount instead of --volume");
            }
            let v = open_volume(&dir.path, &at.pass, &at.meta, true, None)?;
            v.tier_status(&in_volume(path), None).with_context(|| format!("{}", path.display()))?
        }
        None => {
            let m = locate(path)?;
            let v = ask(&m, &Request::TierStatus { path: m.rel.clone() }).with_context(|| format!("{}", path.display()))?;
            serde_json::from_value(v).context("reading the mount's answer")?
        }
    };
    let costs: Vec<Option<f64>> = s.tiers.iter().map(|t| monthly(&sheet, &t.class, t.stored_bytes)).collect();
    if json {
        let mut v = serde_json::to_value(&s)?;
        v["monthly_cost"] = serde_json::json!(s.tiers.iter().zip(&costs).map(|(t, c)| serde_json::json!({"tier": t.tier, "class": t.class, "usd": c})).collect::<Vec<_>>());
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(0);
    }
    let h = size::human;
    let pinned: Vec<String> = s.pinned.iter().map(|(k, n)| format!("{n} {k}")).collect();
    println!(
        "{}: {}, pin {}{}{}",
        path.display(),
        s.kind,
        s.pin.name(),
        if s.inherited { " (inherited from its directory)" } else { "" },
        if s.kind == "dir" && !pinned.is_empty() { format!("; pinned in the tree: {}", pinned.join(", ")) } else { String::new() }
    );
    println!("{} {}, {} of data; the home is {}", s.files, if s.files == 1 { "file" } else { "files" }, h(s.file_bytes), s.home);
    if s.tiers.is_empty() {
        println!("no stored data");
    } else {
        println!("{:<14} {:<14} {:>12} {:>12} {:>8} {:>6} {:>12}", "tier", "billed as", "file bytes", "stored", "chunks", "packs", "$/month");
        let mut total = 0.0;
        for (t, c) in s.tiers.iter().zip(&costs) {
            total += c.unwrap_or(0.0);
            let cost = c.map_or("-".to_string(), money);
            println!("{:<14} {:<14} {:>12} {:>12} {:>8} {:>6} {:>12}", t.tier, t.class, h(t.bytes), h(t.stored_bytes), t.chunks, t.packs, cost);
        }
        if costs.iter().any(|c| c.is_some()) {
            println!("{:<14} {:<14} {:>12} {:>12} {:>8} {:>6} {:>12}", "total", "", "", "", "", "", money(total));
        } else {
            println!("(a volume in a local directory: its storage is not priced per class)");
        }
    }
    for r in &s.restores {
        let eta = (r.ready_estimate_ns - cairn_engine::Timestamp::now().0) as f64 / 1e9;
        let when = if eta > 0.0 { format!("ready in about {}", crate::show::human_duration(eta)) } else { "ready".to_string() };
        println!("restore of {} ({}): {when}", r.pack, r.class);
    }
    Ok(0)
}
