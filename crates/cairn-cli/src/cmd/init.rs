//! `cairn init`: create a volume.

use crate::volume::VolumeArgs;
use crate::{logging, passphrase, size, target};
use anyhow::{bail, Context, Result};
use cairn_engine::{ChunkerParams, InitOptions};

/// Create a new volume in DIR (a new or empty directory), or in a bucket
/// (s3://BUCKET/PREFIX; the bucket must exist).
#[derive(clap::Args)]
#[command(mut_args(crate::volume::volume_help(None)))]
pub struct InitArgs {
    #[command(flatten)]
    pub vol: VolumeArgs,
    /// Encrypt data and metadata indexes with AES-256-GCM under a key
    /// wrapped by your passphrase (Argon2id).
    #[arg(long)]
    pub encrypt: bool,
    /// Smallest chunk (e.g. 256K).
    #[arg(long, default_value = "256K", value_parser = size::parse)]
    pub chunk_min: u64,
    /// Average chunk size.
    #[arg(long, default_value = "1M", value_parser = size::parse)]
    pub chunk_avg: u64,
    /// Largest chunk.
    #[arg(long, default_value = "4M", value_parser = size::parse)]
    pub chunk_max: u64,
    /// Target size of the pack objects written to the backend (default
    /// 32M in a directory, 16M in a bucket, 64M on a tape). In a bucket
    /// 16M packs uploaded and read back faster than 32M or 64M ones on
    /// the S3-compatible server measured (docs/profile.md, fourth
    /// round), at 4 or 5 requests per pack instead of 10 or 11 for 64M.
    #[arg(long, value_parser = size::parse)]
    pub pack_size: Option<u64>,
    /// zstd level for chunk compression (1 is fast; 19 is small).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i32).range(-7..=22))]
    pub zstd_level: i32,
    /// Which files' data may share chunks: `volume` (any file's, the
    /// default: identical data is stored once) or `owner` (only the
    /// files of one owner's: identical data of two users is stored
    /// twice, and no user can learn by writing whether another stored
    /// some data). Fixed for the volume's life; see
    /// docs/threat-model.md, "What dedup tells a co-tenant".
    #[arg(long, default_value = "volume", value_name = "volume|owner")]
    pub dedup_domain: cairn_engine::config::DedupDomain,
}

pub fn run(a: InitArgs, verbose: u8) -> Result<i32> {
    let InitArgs { vol: VolumeArgs { volume, cloud, meta, pass }, encrypt, chunk_min, chunk_avg, chunk_max, pack_size, zstd_level, dedup_domain } = a;
    let dir = target::local_dir(&volume, &cloud)?;
    let meta_url = meta.for_init()?;
    let pack_size = pack_size.unwrap_or_else(|| cairn_engine::config::default_pack_target(&volume));
    logging::init(verbose, None)?;
    let chunker = ChunkerParams {
        min: u32::try_from(chunk_min).context("--chunk-min too large")?,
        avg: u32::try_from(chunk_avg).context("--chunk-avg too large")?,
        max: u32::try_from(chunk_max).context("--chunk-max too large")?,
        ..Default::default()
    };
    if pack_size < 1 << 20 {
        bail!("--pack-size must be at least 1M");
    }
    let passphrase = if encrypt { Some(passphrase::get(pass.passphrase_file.as_deref(), true)?) } else { None };
    let io = InitOptions { chunker, passphrase, kdf: None, zstd_level: Some(zstd_level), pack_target: Some(pack_size), backend: None, meta_url: meta_url.clone(), dedup_domain };
    let cfg = if target::is_url(&volume) {
        let volume = target::canonical(&volume)?;
        // A blank tape is formatted (an emulated one created) and
        // held while the volume is created on it.
        let _tape = if cairn_engine::tape::is_tape_url(&volume) { Some(cairn_engine::tape::create(&volume, None)?) } else { None };
        cairn_engine::init_cloud(&dir, &volume, cloud.endpoint.as_deref(), cloud.region.as_deref(), &io)?
    } else {
        cairn_engine::init(&dir, &io)?
    };
    let place = if target::is_url(&volume) { format!("{volume} (local directory {})", dir.display()) } else { dir.display().to_string() };
    println!(
        "created volume {} in {} ({}, chunks {}/{}/{} bytes{})",
        cfg.volume_id,
        place,
        if encrypt { "encrypted with AES-256-GCM" } else { "not encrypted" },
        chunker.min,
        chunker.avg,
        chunker.max,
        if meta_url.is_some() { format!(", metadata in PostgreSQL schema cairn_{}: mount and maintain it with --meta URL or CAIRN_META", cfg.volume_id) } else { String::new() }
    );
    Ok(0)
}
