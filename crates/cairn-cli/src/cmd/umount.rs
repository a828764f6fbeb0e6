//! `cairn umount`: unmount and wait for the flush.

use crate::{daemon, logging, resolve};
use anyhow::Result;
use std::path::PathBuf;

/// Unmount a Cairn mount and wait until its data is safely flushed.
#[derive(clap::Args)]
pub struct UmountArgs {
    /// The mountpoint, or the mounted volume (a directory or s3://BUCKET/PREFIX).
    pub mountpoint: PathBuf,
    /// Give up waiting for the flush after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
}

pub fn run(a: UmountArgs, verbose: u8) -> Result<i32> {
    let UmountArgs { mountpoint, timeout } = a;
    logging::init(verbose, None)?;
    let mountpoint = resolve::mountpoint_of(&mountpoint);
    daemon::unmount_and_wait(&mountpoint, std::time::Duration::from_secs(timeout))?;
    Ok(0)
}
