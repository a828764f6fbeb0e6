//! `cairn top`: live rates of a mount.

use crate::{logging, metrics, resolve};
use anyhow::{bail, Result};
use std::path::PathBuf;

/// Live rates of a mount, refreshed every second, as `juicefs stats`:
/// FUSE requests and their latency, bytes the kernel read and wrote,
/// bytes chunked, deduplicated, compressed and stored, cache hit ratios,
/// journal fill, flush and upload queues, bucket requests and errors.
///
/// Read from the mount's control socket (no --metrics port needed);
/// the same counters as the Prometheus endpoint. q (or Ctrl-C) stops it.
/// `cairn stats VOLUME --watch` is the same by volume. No --meta: the
/// mount answers, whatever holds its volume's metadata.
#[derive(clap::Args)]
pub struct TopArgs {
    /// The mountpoint, or the mounted volume (a directory or s3://BUCKET/PREFIX).
    pub mountpoint: PathBuf,
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    /// Stop after this many refreshes (default: run until interrupted).
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// One refresh, then exit (--count 1).
    #[arg(long, conflicts_with = "count")]
    pub once: bool,
}

pub fn run(a: TopArgs, verbose: u8) -> Result<i32> {
    let TopArgs { mountpoint, interval, count, once } = a;
    logging::init(verbose, None)?;
    if !(interval > 0.0 && interval.is_finite()) {
        bail!("--interval must be a positive number of seconds");
    }
    let mountpoint = resolve::mountpoint_of(&mountpoint);
    let sock = metrics::socket_of(&mountpoint)?;
    metrics::top(&sock, &mountpoint.display().to_string(), std::time::Duration::from_secs_f64(interval), if once { Some(1) } else { count })
}
