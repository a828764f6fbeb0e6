//! `cairn archive`: tar archives made and extracted without copying data.

use super::mount::{check_fuse_access, warn_if_not_empty};
use crate::{archive, daemon, logging, size};
use anyhow::Result;
use std::path::PathBuf;

/// Tar archives without copying data: inside a mount an archive is a new
/// extent list over its members' chunks, and extracting is the reverse.
#[derive(clap::Args)]
pub struct ArchiveArgs {
    #[command(subcommand)]
    pub op: ArchiveCmd,
}

pub fn run(a: ArchiveArgs, verbose: u8) -> Result<i32> {
    let ArchiveArgs { op } = a;
    if !matches!(op, ArchiveCmd::Mount { foreground: false, .. }) {
        logging::init(verbose, None)?;
    }
    match op {
        ArchiveCmd::Create { archive, paths, dir, align, remove } => archive::create(&archive, &paths, dir.as_deref(), align, remove)?,
        ArchiveCmd::Extract { archive, dest, consume } => archive::extract(&archive, &dest, consume)?,
        ArchiveCmd::Import { file, dest } => archive::import(&file, &dest)?,
        ArchiveCmd::Mount { file, mountpoint, foreground, private, log_file } => {
            check_fuse_access(private)?;
            warn_if_not_empty(&mountpoint);
            let opts = cairn_tarfs::TarMountOptions { allow_other: !private, ..Default::default() };
            let say = |info: &cairn_tarfs::MountInfo| {
                let how = match &info.index.rebuilt {
                    Some(why) => format!("indexed {} members in {:.2?} ({why})", info.index.members, info.index.elapsed),
                    None => format!("{} members from the saved index", info.index.members),
                };
                tracing::info!("mounted {} at {}: {how}", file.display(), mountpoint.display());
                how
            };
            if foreground {
                cairn_tarfs::mount_archive(&file, &mountpoint, &opts, |info| eprintln!("cairn: {}", say(info)))?;
            } else {
                return daemon::run_in_background(|ready| {
                    if let Some(l) = &log_file {
                        logging::init(verbose, Some(l))?;
                    }
                    cairn_tarfs::mount_archive(&file, &mountpoint, &opts, |info| {
                        say(info);
                        ready();
                    })?;
                    Ok(())
                });
            }
        }
    }
    Ok(0)
}

#[derive(clap::Subcommand)]
pub enum ArchiveCmd {
    /// Build ARCHIVE (a pax tar GNU tar and bsdtar read) from PATHs inside
    /// the same mount, writing only the headers.
    Create {
        archive: PathBuf,
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Resolve PATHs from this directory (member names are relative to it).
        #[arg(short = 'C', long = "directory", value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Pad headers so every member's data starts at a multiple of this
        /// (a power of two >= 512, e.g. 4096); the padding is a pax comment
        /// that tar readers skip.
        #[arg(long, value_parser = size::parse)]
        align: Option<u64>,
        /// Move the PATHs into the archive (they are removed), like AvaTar's merge.
        #[arg(long = "move")]
        remove: bool,
    },
    /// Extract ARCHIVE (a tar inside the mount, from any tar writer) into
    /// directory DEST (made if missing) without copying data. Refuses,
    /// changing nothing, if a member escapes DEST or DEST already holds one
    /// of its names.
    Extract {
        archive: PathBuf,
        dest: PathBuf,
        /// Remove the archive afterwards (AvaTar's split).
        #[arg(long)]
        consume: bool,
    },
    /// Bring a tar from outside into the volume: its data is stored once
    /// (chunked, deduplicated) and extracted into DEST zero-copy.
    Import { file: PathBuf, dest: PathBuf },
    /// Show any tar file (in a Cairn volume or not) as a read-only tree at
    /// MOUNTPOINT without extracting it. The index of its members is kept in
    /// ~/.cache/cairn/tar-index (or $XDG_CACHE_HOME), so mounting it again
    /// is instant. Unmount with `cairn umount MOUNTPOINT`.
    Mount {
        file: PathBuf,
        mountpoint: PathBuf,
        /// Stay in the foreground.
        #[arg(short, long)]
        foreground: bool,
        /// Let only the mounting user in (default: everyone, with kernel
        /// permission checks).
        #[arg(long)]
        private: bool,
        /// Where a background mount logs (default: nowhere).
        #[arg(long, value_name = "FILE")]
        log_file: Option<PathBuf>,
    },
}
