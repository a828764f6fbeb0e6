//! `cairn meta list|restore`: metadata versions of a volume in a bucket.

use crate::show::hex_of;
use crate::volume::{PassArgs, VolumeDir};
use crate::{logging, passphrase, size, target};
use anyhow::Result;
use cairn_engine::cloud::{self, versions};
use cairn_engine::report;

/// Metadata versions of a volume in a bucket: list them, or roll the
/// volume back to one (the volume must not be mounted).
#[derive(clap::Args)]
pub struct MetaArgs {
    #[command(subcommand)]
    pub op: MetaCmd,
}

pub fn run(a: MetaArgs, verbose: u8) -> Result<i32> {
    let MetaArgs { op } = a;
    logging::init(verbose, None)?;
    meta_command(op)
}

#[derive(clap::Subcommand)]
pub enum MetaCmd {
    /// List the metadata versions kept in the bucket, oldest first.
    List {
        /// s3://BUCKET/PREFIX
        volume: String,
        #[command(flatten)]
        cloud: target::CloudArgs,
        /// Print as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Make the state of VERSION the volume's latest state, as a new version
    /// (nothing is deleted: restoring is itself undone the same way).
    Restore {
        /// s3://BUCKET/PREFIX
        volume: String,
        /// The version to go back to (`cairn meta list` shows them).
        #[arg(value_name = "VERSION")]
        target: u64,
        #[command(flatten)]
        cloud: target::CloudArgs,
        #[command(flatten)]
        pass: PassArgs,
    },
}

/// `cairn meta list|restore`.
fn meta_command(op: MetaCmd) -> Result<i32> {
    match op {
        MetaCmd::List { volume, cloud: c, json } => {
            let vd = VolumeDir::query(&volume, &c)?;
            let rows = report::meta_versions(&vd.path)?;
            if json {
                let rows: Vec<serde_json::Value> =
                    rows.iter().map(|v| serde_json::json!({"version": v.version, "kind": v.kind, "bytes": v.bytes, "time": v.time, "writer": hex_of(&v.writer), "latest": v.latest})).collect();
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                println!("{:>8}  {:<5}  {:<23}  {:>10}  writer", "version", "kind", "written", "size");
                for v in &rows {
                    let mark = if v.latest { "  (latest)" } else { "" };
                    let kind = match v.kind {
                        versions::Kind::Base => "base",
                        versions::Kind::Delta => "delta",
                    };
                    let who = if v.writer == [0u8; 8] { "restore".to_string() } else { hex_of(&v.writer) };
                    println!("{:>8}  {:<5}  {:<23}  {:>10}  {who}{mark}", v.version, kind, cloud::lease::show_time(v.time), size::human(v.bytes));
                }
            }
            Ok(0)
        }
        MetaCmd::Restore { volume, target: version, cloud: c, pass } => {
            let dir = target::open_dir(&volume, &c)?;
            let (_, _, _, cfg) = cairn_engine::read_config(&dir)?;
            let passphrase = if cfg.needs_passphrase() { Some(passphrase::get(pass.passphrase_file.as_deref(), false)?) } else { None };
            let v = report::restore_meta_version(&dir, passphrase.as_ref().map(|p| &p[..]), &volume, version)?;
            println!("restored version {version} of {volume} as version {v}; mount it to use it");
            Ok(0)
        }
    }
}
