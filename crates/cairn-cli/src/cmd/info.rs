//! `cairn info|warmup`: where a file's bytes are, and bringing them close.

use crate::{inspect, logging};
use anyhow::Result;
use std::path::PathBuf;

/// Where a file's bytes are: its chunks (offset, length, chunk id,
/// stored length, pack and offset), how many places reference each, and
/// whether each is in the journal (not yet flushed), `local` (a pack in
/// the volume's directory), `cache` (the local pack cache of a bucket or
/// tape volume), or only in the `bucket` or on the `tape`.
#[derive(clap::Args)]
pub struct InfoArgs {
    /// A file (or directory: its entry count) inside a mount.
    pub path: PathBuf,
    /// Print as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn info(a: InfoArgs, verbose: u8) -> Result<i32> {
    let InfoArgs { path, json } = a;
    logging::init(verbose, None)?;
    inspect::info(&path, json)
}

/// Bring the data of files or whole trees close, before they are read.
/// On a volume in a bucket or on tape this is `cairn tape recall`: their
/// chunks' pack ranges are read into the local cache in one pass, in
/// the order they lie on the medium (bounded by --cache-dir-size). On a
/// volume in a local directory there is no cache: the ranges of its
/// packs are read once so that the OS page cache holds them, until the
/// kernel needs the memory. Bytes not yet flushed are in the journal,
/// local already.
#[derive(clap::Args)]
pub struct WarmupArgs {
    /// Files or directories inside one mounted volume.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn warmup(a: WarmupArgs, verbose: u8) -> Result<i32> {
    let WarmupArgs { paths, json } = a;
    logging::init(verbose, None)?;
    inspect::warmup(&paths, json, "warmup")
}
