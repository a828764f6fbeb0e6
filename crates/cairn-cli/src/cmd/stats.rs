//! `cairn stats`: space use of a volume, or of a tree inside a mount.

use crate::volume::{VolumeArgs, VolumeDir, open_volume};
use crate::{inspect, logging, metrics, size};
use anyhow::{Context, Result};
use cairn_engine::maintenance;

/// Show space use: logical and stored bytes, dedup and compression, and
/// for a volume in a bucket its cache (hits, fetched bytes, evictions).
/// Given a directory or file inside a mount instead: that tree's files,
/// bytes, dedup, and what it shares with the rest of the volume versus
/// what deleting it would free.
#[derive(clap::Args)]
#[command(mut_args(crate::volume::volume_help(Some("The volume (a directory, s3://BUCKET/PREFIX or a tape), the mountpoint of a mounted one, or a path inside a mount"))))]
pub struct StatsArgs {
    #[command(flatten)]
    pub vol: VolumeArgs,
    /// Print as JSON.
    #[arg(long)]
    pub json: bool,
    /// Show the mounted volume's live rates instead, as `cairn top`.
    #[arg(long, conflicts_with = "json")]
    pub watch: bool,
}

pub fn run(a: StatsArgs, verbose: u8) -> Result<i32> {
    let StatsArgs { vol: VolumeArgs { volume: dir, cloud, meta, pass }, json, watch } = a;
    logging::init(verbose, None)?;
    meta.check()?;
    // A file or directory inside a mount (not its mountpoint): that tree.
    if let Some(p) = inspect::tree_path(&dir) {
        return inspect::tree_stats(&p, json);
    }
    let vd = VolumeDir::query(&dir, &cloud)?;
    let dir = vd.path.clone();
    if watch {
        let sock = cairn_engine::control::socket_path(&dir);
        return metrics::top(&sock, &dir.display().to_string(), std::time::Duration::from_secs(1), None);
    }
    // A mounted volume answers through its control socket.
    let sock = cairn_engine::control::socket_path(&dir);
    let s: maintenance::Stats = match cairn_engine::control::call(&sock, &cairn_engine::control::Request::Stats)? {
        Some(v) => serde_json::from_value(v).context("reading stats from the mount")?,
        None => maintenance::stats(&*open_volume(&dir, &pass, &meta, true, None)?)?,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        let h = size::human;
        println!("files              {:>14}   directories {}   symlinks {}", s.files, s.directories, s.symlinks);
        println!("logical size       {:>14}   ({} in holes)", h(s.logical_bytes), h(s.logical_bytes - s.data_bytes.min(s.logical_bytes)));
        println!("unique data        {:>14}   in {} chunks", h(s.unique_bytes), s.chunks);
        println!("stored             {:>14}   in {} packs ({} dead in {} unreferenced chunks)", h(s.stored_bytes), s.packs, h(s.dead_bytes), s.dead_chunks);
        match s.dead_bound {
            Some(b) => {
                let pct = if b == 0 { 0.0 } else { 100.0 * s.dead_bytes as f64 / b as f64 };
                println!("dead bound         {:>14}   ({pct:.0}% used; the cleaner keeps dead bytes under it; {} small packs, merged from {})", h(b), s.small_packs, cairn_engine::cleaner::SMALL_PACKS);
            }
            None => println!("dead bound         {:>14}   (no cleaner on this volume: `cairn gc` frees dead bytes)", "none"),
        }
        println!("dedup ratio        {:>14.2}x", s.dedup_ratio);
        println!("compression ratio  {:>14.2}x", s.compression_ratio);
        println!("overall            {:>14.2}x", s.overall_ratio);
        if let Some(c) = &s.cache {
            let lookups = c.hits + c.misses;
            let ratio = if lookups == 0 { 0.0 } else { 100.0 * c.hits as f64 / lookups as f64 };
            println!("cache hits         {:>13.1}%   ({} hits, {} misses)", ratio, c.hits, c.misses);
            println!("fetched            {:>14}   in {} requests", h(c.bytes_fetched), c.remote_gets);
            println!("cached             {:>14}   clean, {} evictions", h(c.clean_bytes), c.evictions);
            if !c.policy.is_empty() {
                println!("cache policy       {:>14}", c.policy);
            }
            println!("not yet uploaded   {:>14}   in {} packs", h(c.dirty_bytes), c.dirty_objects);
        }
        if let Some(m) = &s.medium {
            let total = m.live_bytes + m.dead_bytes;
            let pct = if total == 0 { 0.0 } else { 100.0 * m.dead_bytes as f64 / total as f64 };
            println!("on the tape        {:>14}   live objects, {} dead ({pct:.1}%: deleted or replaced; `cairn tape reclaim` copies the live data to a new tape)", h(m.live_bytes), h(m.dead_bytes));
            if let Some(f) = m.free_bytes {
                println!("room left          {:>14}", h(f));
            }
        }
    }
    Ok(0)
}
