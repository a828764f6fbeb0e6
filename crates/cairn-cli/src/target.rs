//! Where a volume is: a local directory, or `s3://BUCKET/PREFIX` or a tape
//! (`tape:/dev/nstN`, `tape-emu:DIR`) with a local directory for its
//! metadata, journal and cache.

use anyhow::{Context, Result};
use std::path::PathBuf;

/// Options of a volume kept in a bucket.
#[derive(clap::Args, Clone, Default)]
pub struct CloudArgs {
    /// Local directory of a volume kept in a bucket or on a tape (VOLUME is
    /// s3://BUCKET/PREFIX, tape:/dev/nstN or tape-emu:DIR): its working
    /// metadata, write-back journal and pack cache. Default:
    /// /var/cache/cairn/BUCKET/PREFIX as root, ~/.cache/cairn/BUCKET/PREFIX
    /// otherwise (for a tape, the device path with / turned into _). A
    /// machine that has never seen the volume starts with an empty one.
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// S3 service URL of an S3-compatible store (MinIO, Ceph RGW, R2,
    /// moto...); AWS when absent. Credentials come from AWS_ACCESS_KEY_ID
    /// and AWS_SECRET_ACCESS_KEY or ~/.aws/credentials, never from flags.
    #[arg(long, value_name = "URL")]
    pub endpoint: Option<String>,
    /// S3 region (default: AWS_REGION, else us-east-1).
    #[arg(long)]
    pub region: Option<String>,
}

/// Whether VOLUME names a bucket or a tape. Any `SCHEME://` counts, not
/// only the schemes this build knows (`config::is_remote_url`), so that a
/// mistyped or unsupported one (`gs://...`) is refused as a URL rather than
/// taken for a directory of that name.
pub fn is_url(volume: &str) -> bool {
    volume.contains("://") || cairn_engine::tape::is_tape_url(volume)
}

/// VOLUME as the volume's settings keep it (an emulated tape's directory
/// made absolute, so the name works from any directory).
pub fn canonical(volume: &str) -> Result<String> {
    Ok(cairn_engine::tape::absolute(volume)?)
}

/// The local directory of `volume`, without touching it.
pub fn local_dir(volume: &str, c: &CloudArgs) -> Result<PathBuf> {
    if !is_url(volume) {
        if c.endpoint.is_some() || c.region.is_some() || c.cache_dir.is_some() {
            anyhow::bail!("--cache-dir, --endpoint and --region are for volumes in a bucket (s3://BUCKET/PREFIX); {volume} is a directory");
        }
        return Ok(PathBuf::from(volume));
    }
    if !cairn_engine::cloud::is_remote_url(volume) {
        anyhow::bail!("{volume}: not a volume location (a directory, s3://BUCKET/PREFIX, tape:/dev/nstN or tape-emu:DIR)");
    }
    if let Some(d) = &c.cache_dir {
        return Ok(d.clone());
    }
    let volume = canonical(volume)?;
    let rest = match volume.split_once(':') {
        Some((scheme, path)) if cairn_engine::tape::is_tape_url(&volume) => format!("{scheme}{}", path.replace('/', "_")),
        _ => volume.trim_start_matches("s3://").trim_end_matches('/').to_string(),
    };
    // SAFETY: geteuid has no preconditions.
    let base = if unsafe { libc::geteuid() } == 0 {
        PathBuf::from("/var/cache/cairn")
    } else {
        let home = std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")));
        home.context("no HOME to put the cache directory in; give --cache-dir")?.join("cairn")
    };
    Ok(base.join(rest))
}

/// The local directory of an existing volume, set up from the bucket if
/// this machine has not seen the volume before.
pub fn open_dir(volume: &str, c: &CloudArgs) -> Result<PathBuf> {
    let dir = local_dir(volume, c)?;
    if is_url(volume) {
        cairn_engine::cloud::attach(&dir, &canonical(volume)?, c.endpoint.as_deref(), c.region.as_deref(), None)?;
    }
    Ok(dir)
}
