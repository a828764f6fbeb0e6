//! `cairn snapshot`: read-only point-in-time copies of a mounted volume.

use crate::{edit, logging};
use anyhow::Result;
use std::path::PathBuf;

/// Read-only point-in-time copies of a whole mounted volume, visible as
/// MOUNTPOINT/.snapshots/NAME; they cost metadata only.
#[derive(clap::Args)]
pub struct SnapshotArgs {
    #[command(subcommand)]
    pub op: SnapshotCmd,
}

pub fn run(a: SnapshotArgs, verbose: u8) -> Result<i32> {
    let SnapshotArgs { op } = a;
    logging::init(verbose, None)?;
    match op {
        SnapshotCmd::Create { name, mount } => edit::snapshot_create(&mount, &name)?,
        SnapshotCmd::List { mount, json } => edit::snapshot_list(&mount, json)?,
        SnapshotCmd::Delete { name, mount } => edit::snapshot_delete(&mount, &name)?,
    }
    Ok(0)
}

#[derive(clap::Subcommand)]
pub enum SnapshotCmd {
    /// Take a snapshot named NAME.
    Create {
        name: String,
        /// Any path inside the mount (default: the current directory).
        #[arg(long, short = 'm', default_value = ".")]
        mount: PathBuf,
    },
    /// List snapshots with their creation times.
    List {
        #[arg(long, short = 'm', default_value = ".")]
        mount: PathBuf,
        /// Print as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete snapshot NAME (its space returns at the next `cairn gc`).
    Delete {
        name: String,
        #[arg(long, short = 'm', default_value = ".")]
        mount: PathBuf,
    },
}
