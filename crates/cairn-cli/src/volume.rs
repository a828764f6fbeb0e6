//! Opening the volume a command names: its local directory (or the mount
//! that has it), its passphrase and metadata URL.

use crate::{meta_url, passphrase, progress, resolve, runtime, target};
use anyhow::{bail, Context, Result};
use cairn_engine::{OpenOptions, Volume};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The volume a command opens and how: where it is, its local directory
/// and S3 service, its metadata database, its passphrase. Every command
/// that opens a volume itself flattens it (no struct doc comment: a
/// flattened one would replace the command's about text); each sets its
/// VOLUME help with [`volume_help`] where it says more.
#[derive(clap::Args, Clone)]
pub struct VolumeArgs {
    /// The volume (a directory, s3://BUCKET/PREFIX or a tape), or the
    /// mountpoint of a mounted one.
    #[arg(value_name = "VOLUME")]
    pub volume: String,
    #[command(flatten)]
    pub cloud: target::CloudArgs,
    #[command(flatten)]
    pub meta: meta_url::MetaArgs,
    #[command(flatten)]
    pub pass: PassArgs,
}

/// For `#[command(mut_args(volume_help(...)))]`: a command's own help for
/// [`VolumeArgs`]' VOLUME (None: none). `mut_args` changes it in place
/// (`mut_arg` would move it after the command's other positionals).
pub fn volume_help(help: Option<&'static str>) -> impl FnMut(clap::Arg) -> clap::Arg {
    move |a| if a.get_id() == "volume" { a.help(help) } else { a }
}

#[derive(clap::Args, Clone)]
pub struct PassArgs {
    /// Read the passphrase of an encrypted volume from this file (first line).
    /// Otherwise CAIRN_PASSPHRASE, otherwise a prompt on the terminal.
    #[arg(long, value_name = "FILE")]
    pub passphrase_file: Option<PathBuf>,
}

pub fn open_volume(dir: &Path, pass: &PassArgs, meta: &meta_url::MetaArgs, read_only: bool, cache: Option<u64>) -> Result<Arc<Volume>> {
    let (_, _, _, cfg) = cairn_engine::read_config(dir)?;
    let meta_url = meta.for_volume(&cfg)?;
    let passphrase = if cfg.needs_passphrase() { Some(passphrase::get(pass.passphrase_file.as_deref(), false)?) } else { None };
    let mut opts = OpenOptions { passphrase, read_only, meta_url, ..Default::default() };
    if let Some(c) = cache {
        opts.cache_bytes = c as usize;
    }
    Ok(Volume::load(dir, opts)?)
}

/// Opens the volume exclusively (its open options adjusted by `adjust`),
/// runs a maintenance task with progress bars (none for JSON output), and
/// closes the volume cleanly.
pub fn maintain<T>(
    dir: &Path,
    pass: &PassArgs,
    meta: &meta_url::MetaArgs,
    json: bool,
    adjust: impl FnOnce(&mut OpenOptions),
    task: impl FnOnce(&Volume, &progress::Bars) -> cairn_engine::Result<T>,
) -> Result<T> {
    let (_, _, _, cfg) = cairn_engine::read_config(dir)?;
    let meta_url = meta.for_volume(&cfg)?;
    let passphrase = if cfg.needs_passphrase() { Some(passphrase::get(pass.passphrase_file.as_deref(), false)?) } else { None };
    let mut opts = OpenOptions { passphrase, meta_url, ..Default::default() };
    adjust(&mut opts);
    let vol = Volume::load(dir, opts)?;
    let bars = progress::Bars::new(!json);
    let r = task(&vol, &bars);
    bars.finish();
    vol.close()?;
    Ok(r?)
}

/// The local directory of the volume a command was given (a volume or the
/// mountpoint of one; see resolve.rs), with the mount that has it, if any.
pub struct VolumeDir {
    pub path: PathBuf,
    pub mount: Option<runtime::Entry>,
    /// A read-only query of a volume in a bucket that this machine has no
    /// local directory for works in a temporary one, removed afterwards, so
    /// that asking leaves nothing behind (a later `cairn init` of the same
    /// bucket and prefix would refuse a directory it left).
    _scratch: Option<tempfile::TempDir>,
}

impl VolumeDir {
    fn resolve(arg: &str, cloud: &target::CloudArgs, query: bool) -> Result<VolumeDir> {
        let v = match resolve::VolumeArg::of(arg) {
            resolve::VolumeArg::Mountpoint(e) => {
                if cloud.cache_dir.is_some() || cloud.endpoint.is_some() || cloud.region.is_some() {
                    bail!("{arg} is where {} is mounted; --cache-dir, --endpoint and --region name a volume in a bucket, not a mount", e.volume);
                }
                return Ok(VolumeDir { path: e.local_dir.clone(), mount: Some(e), _scratch: None });
            }
            resolve::VolumeArg::Volume(v) => v,
        };
        let local = target::local_dir(&v, cloud)?;
        let mount = resolve::mount_of(&v, Some(&local));
        if let (Some(m), None) = (&mount, &cloud.cache_dir) {
            // The mount's own directory, whatever the default would be.
            return Ok(VolumeDir { path: m.local_dir.clone(), mount, _scratch: None });
        }
        if query && target::is_url(&v) && cloud.cache_dir.is_none() && !local.exists() && cairn_engine::cloud::is_remote_url(&v) && !cairn_engine::tape::is_tape_url(&v) {
            let scratch = tempfile::Builder::new().prefix("cairn-query.").tempdir().context("creating a temporary local directory")?;
            let path = scratch.path().join("volume");
            let c = target::CloudArgs { cache_dir: Some(path.clone()), ..cloud.clone() };
            target::open_dir(&v, &c)?;
            return Ok(VolumeDir { path, mount, _scratch: Some(scratch) });
        }
        Ok(VolumeDir { path: target::open_dir(&v, cloud)?, mount, _scratch: None })
    }

    /// For a command that reads (a mounted volume answers through its mount).
    pub fn query(arg: &str, cloud: &target::CloudArgs) -> Result<VolumeDir> {
        Self::resolve(arg, cloud, true)
    }

    /// For a command that needs the volume to itself (`what` names it).
    pub fn unmounted(arg: &str, cloud: &target::CloudArgs, what: &str) -> Result<VolumeDir> {
        let mut v = Self::resolve(arg, cloud, false)?;
        // A volume many machines mount (its metadata in PostgreSQL): a mount
        // from another local directory is another machine's, and this
        // directory is free.
        let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        if v.mount.as_ref().is_some_and(|m| canon(&m.local_dir) != canon(&v.path))
            && cairn_engine::read_config(&v.path).is_ok_and(|(_, _, _, c)| c.meta == cairn_engine::config::MetaKind::Postgres)
        {
            v.mount = None;
        }
        if let Some(m) = &v.mount {
            bail!("{} is in use: it is mounted at {} (daemon pid {}), and `cairn {what}` needs it unmounted; run `cairn umount {}` first", m.volume, m.mountpoint.display(), m.pid, m.mountpoint.display());
        }
        Ok(v)
    }
}

