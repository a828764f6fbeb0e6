//! `cairn`: create, mount, check and maintain Cairn volumes.
//!
//! This file is the command line's top level: the commands and their
//! dispatch. Each command's arguments and `run` are in `cmd/`; what they
//! share (the volume a command names, logging, formatting) in the modules
//! below.

mod archive;
mod cmd;
mod daemon;
mod edit;
mod inspect;
mod logging;
mod meta_url;
mod metrics;
mod mount_helper;
mod passphrase;
mod progress;
mod resolve;
mod runtime;
mod show;
mod sim;
mod size;
mod status;
mod target;
mod utab;
mod volume;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::Path;

/// Cairn: a deduplicating, compressing, encrypting file system in user space.
///
/// A volume (VOLUME) lives in a directory: its metadata, its write-back
/// journal and its packs under DIR/store. Or it lives in a bucket,
/// s3://BUCKET/PREFIX, with a local directory (--cache-dir) for its working
/// metadata, journal and cache: any machine with the passphrase mounts it
/// from the bucket alone. Mount with `cairn mount VOLUME MOUNTPOINT` and use
/// it like any file system.
#[derive(Parser)]
#[command(name = "cairn", version, about, long_about, propagate_version = true)]
struct Cli {
    /// More log output (repeat for more); also RUST_LOG=cairn_engine=debug.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    cmd: Cmd,
}

/// The commands, in the order `cairn --help` lists them; each one's help
/// is its arguments' doc comment.
#[derive(Subcommand)]
enum Cmd {
    Init(cmd::init::InitArgs),
    Mount(cmd::mount::MountArgs),
    Status(cmd::status::StatusArgs),
    Top(cmd::top::TopArgs),
    Umount(cmd::umount::UmountArgs),
    Fsck(cmd::fsck::FsckArgs),
    Stats(cmd::stats::StatsArgs),
    Cost(cmd::cost::CostArgs),
    Gc(cmd::gc::GcArgs),
    Insert(cmd::edit::InsertArgs),
    Delete(cmd::edit::DeleteArgs),
    Replace(cmd::edit::ReplaceArgs),
    Clone(cmd::edit::CloneArgs),
    Info(cmd::info::InfoArgs),
    Warmup(cmd::info::WarmupArgs),
    Archive(cmd::archive::ArchiveArgs),
    Snapshot(cmd::snapshot::SnapshotArgs),
    Sim(cmd::sim::SimArgs),
    Meta(cmd::meta::MetaArgs),
    Tape(cmd::tape::TapeArgs),
    Tier(cmd::tier::TierArgs),
    /// Write man pages or shell completions generated from these
    /// definitions (for packaging).
    #[command(hide = true)]
    Generate {
        #[command(subcommand)]
        what: cmd::generate::What,
    },
}

fn main() {
    // mount(8) and umount(8) run /sbin/mount.fuse.cairn and
    // /sbin/umount.fuse.cairn: links to this binary.
    let argv0 = std::env::args_os().next().unwrap_or_default();
    if let Some(code) = mount_helper::main_as(Path::new(&argv0)) {
        std::process::exit(code);
    }
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cairn: {e:#}");
            1
        }
    };
    std::process::exit(code);
}

fn run(cli: Cli) -> Result<i32> {
    let v = cli.verbose;
    match cli.cmd {
        Cmd::Init(a) => cmd::init::run(a, v),
        Cmd::Mount(a) => cmd::mount::run(a, v),
        Cmd::Status(a) => cmd::status::run(a, v),
        Cmd::Top(a) => cmd::top::run(a, v),
        Cmd::Umount(a) => cmd::umount::run(a, v),
        Cmd::Fsck(a) => cmd::fsck::run(a, v),
        Cmd::Stats(a) => cmd::stats::run(a, v),
        Cmd::Cost(a) => cmd::cost::run(a, v),
        Cmd::Gc(a) => cmd::gc::run(a, v),
        Cmd::Insert(a) => cmd::edit::insert(a, v),
        Cmd::Delete(a) => cmd::edit::delete(a, v),
        Cmd::Replace(a) => cmd::edit::replace(a, v),
        Cmd::Clone(a) => cmd::edit::clone(a, v),
        Cmd::Info(a) => cmd::info::info(a, v),
        Cmd::Warmup(a) => cmd::info::warmup(a, v),
        Cmd::Archive(a) => cmd::archive::run(a, v),
        Cmd::Snapshot(a) => cmd::snapshot::run(a, v),
        Cmd::Sim(a) => cmd::sim::run(a, v),
        Cmd::Meta(a) => cmd::meta::run(a, v),
        Cmd::Tape(a) => cmd::tape::run(a, v),
        Cmd::Tier(a) => cmd::tier::run(a, v),
        Cmd::Generate { what } => cmd::generate::run(<Cli as clap::CommandFactory>::command(), what),
    }
}
