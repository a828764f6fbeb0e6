//! Naming a volume or its mount, either way.
//!
//! Commands that act on a volume (`stats`, `fsck`, `gc`, `cost`) also take
//! the mountpoint of that volume, and commands that act on a mount (`top`,
//! `umount`) also take the volume, wherever the name can mean only one
//! volume: a mounted volume is mounted once on a machine (its local
//! directory is locked by its daemon).
//!
//! The join is the runtime registry (`runtime.rs`): its entries name the
//! mountpoint, the volume as the user named it and its local directory, and
//! an entry counts only while the kernel agrees (the daemon is alive and the
//! mount table has its device at its mountpoint).

use crate::runtime::{self, Entry};
use std::path::{Path, PathBuf};

/// Every mount of this machine whose registry entry the kernel confirms.
pub fn live_mounts() -> Vec<Entry> {
    let table = cairn_fuse::mounttable::entries().unwrap_or_default();
    runtime::read_all().into_iter().filter(|e| runtime::alive(e.pid) && table.iter().any(|m| m.fstype == "fuse.cairn" && m.dev == e.dev && m.mount_point == e.mountpoint)).collect()
}

/// The Cairn mount whose mountpoint is `path` (not a path below it).
pub fn mount_at(path: &Path) -> Option<Entry> {
    let mp = std::fs::canonicalize(path).ok()?;
    let m = cairn_fuse::mounttable::mount_entry(&mp).ok()??;
    if m.fstype != "fuse.cairn" || m.mount_point != mp {
        return None;
    }
    runtime::find(m.dev).or_else(|| {
        // A daemon of an earlier version registered nothing: its source is
        // the volume directory itself.
        let dir = runtime::local_dir_of(&m)?;
        Some(Entry { pid: 0, mountpoint: mp, volume: m.source.to_string_lossy().into_owned(), local_dir: dir, backend: String::new(), dev: m.dev, started: 0, metrics: None })
    })
}

/// The live mount of the volume named `volume` (as the user named it: a
/// directory, s3://BUCKET/PREFIX, a tape) or whose local directory is
/// `local_dir`.
pub fn mount_of(volume: &str, local_dir: Option<&Path>) -> Option<Entry> {
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let named = same_volume_name(volume);
    let dir = local_dir.map(canon);
    live_mounts().into_iter().find(|e| named(&e.volume) || dir.as_ref().is_some_and(|d| canon(&e.local_dir) == *d))
}

/// The live mount whose local directory is `local_dir`.
pub fn mount_using(local_dir: &Path) -> Option<Entry> {
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let dir = canon(local_dir);
    live_mounts().into_iter().find(|e| canon(&e.local_dir) == dir)
}

/// A predicate: whether a registered volume name is `volume` (URLs compare
/// without a trailing slash, directories by their canonical path).
fn same_volume_name(volume: &str) -> impl Fn(&str) -> bool {
    let norm = |v: &str| -> String {
        if crate::target::is_url(v) {
            crate::target::canonical(v).unwrap_or_else(|_| v.to_string()).trim_end_matches('/').to_string()
        } else {
            std::fs::canonicalize(v).map_or_else(|_| v.to_string(), |p| p.display().to_string())
        }
    };
    let want = norm(volume);
    move |v: &str| norm(v) == want
}

/// What a command that takes a VOLUME was given.
pub enum VolumeArg {
    /// A volume (a directory or a URL), as given.
    Volume(String),
    /// The mountpoint of a mounted volume: the volume is `entry.volume`,
    /// its local directory `entry.local_dir`.
    Mountpoint(Entry),
}

impl VolumeArg {
    /// `arg` as a volume, or as the mountpoint of one.
    pub fn of(arg: &str) -> VolumeArg {
        if !crate::target::is_url(arg) && !Path::new(arg).join("volume.json").exists() {
            if let Some(e) = mount_at(Path::new(arg)) {
                return VolumeArg::Mountpoint(e);
            }
        }
        VolumeArg::Volume(arg.to_string())
    }
}

/// What a command that takes a MOUNTPOINT was given: the mountpoint itself,
/// or a mounted volume, which names its mount.
pub fn mountpoint_of(arg: &Path) -> PathBuf {
    if mount_at(arg).is_some() {
        return arg.to_path_buf();
    }
    let s = arg.to_string_lossy();
    let looks_like_volume = crate::target::is_url(&s) || arg.join("volume.json").exists();
    match looks_like_volume.then(|| mount_of(&s, (!crate::target::is_url(&s)).then_some(arg))).flatten() {
        Some(e) => e.mountpoint,
        None => arg.to_path_buf(),
    }
}
