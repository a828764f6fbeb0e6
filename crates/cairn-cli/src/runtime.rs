//! The runtime registry of running mounts: one small JSON file per mount
//! daemon, `/run/cairn/mounts/PID.json` (as root; other users
//! `$XDG_RUNTIME_DIR/cairn/mounts`, else `/tmp/cairn-UID/mounts`), written by
//! the daemon once the kernel mount exists and removed when it exits.
//!
//! The mount table says what is mounted and where, but not where a volume
//! in a bucket keeps its local directory (its control socket, lock and
//! journal): the mount's source is what the user gave (`/srv/vol` or
//! `s3://bucket/prefix`), so that mount(8) recognises its fstab line as
//! mounted. The registry answers that, and what `cairn status` shows beside
//! the mount table: the pid, the backend, when the mount started, where its
//! metrics are served.
//!
//! A file is trusted only while it agrees with the kernel: its pid is alive
//! and /proc/self/mountinfo has a `fuse.cairn` mount with its device number
//! at its mountpoint. A daemon killed with SIGKILL leaves its file behind;
//! it is ignored (and removed by the next daemon that registers).

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// One running mount.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Entry {
    /// The daemon serving the mount.
    pub pid: i32,
    /// Canonical mountpoint.
    pub mountpoint: PathBuf,
    /// The volume as the user named it: a directory or s3://BUCKET/PREFIX.
    pub volume: String,
    /// The volume's local directory (control socket, lock, journal).
    pub local_dir: PathBuf,
    /// Where the packs are: `local:DIR/store` or `s3://BUCKET/PREFIX [at ENDPOINT]`.
    pub backend: String,
    /// The mount's device number (major, minor) in /proc/self/mountinfo.
    pub dev: (u64, u64),
    /// Unix seconds when the mount was made.
    pub started: u64,
    /// Where Prometheus metrics are served (`--metrics`), if anywhere.
    #[serde(default)]
    pub metrics: Option<String>,
}

/// The registry directory of the calling user.
pub fn dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return PathBuf::from("/run/cairn/mounts");
    }
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d).join("cairn/mounts"),
        None => PathBuf::from(format!("/tmp/cairn-{uid}/mounts")),
    }
}

/// The directories `cairn status` reads: root's (readable by everyone) and
/// the caller's own.
pub fn dirs() -> Vec<PathBuf> {
    let mut v = vec![PathBuf::from("/run/cairn/mounts")];
    let mine = dir();
    if !v.contains(&mine) {
        v.push(mine);
    }
    v
}

/// Whether a process exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, None | Some('Z') | Some('X'))
}

/// Every readable entry, live or stale. Only files of root or of the
/// caller count: another user could have made a /tmp fallback directory.
pub fn read_all() -> Vec<Entry> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let mut out = Vec::new();
    for d in dirs() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for f in rd.flatten() {
            let trusted = f.metadata().is_ok_and(|m| m.uid() == 0 || m.uid() == me);
            if trusted && f.path().extension().is_some_and(|e| e == "json") {
                if let Some(e) = std::fs::read(f.path()).ok().and_then(|b| serde_json::from_slice::<Entry>(&b).ok()) {
                    out.push(e);
                }
            }
        }
    }
    out
}

/// The live entry of the mount whose device number is `dev`, if any.
pub fn find(dev: (u64, u64)) -> Option<Entry> {
    read_all().into_iter().find(|e| e.dev == dev && alive(e.pid))
}

/// A registration; the file goes when this drops (the daemon's exit).
pub struct Registration {
    path: PathBuf,
}

impl Registration {
    /// Writes `e` as this process's entry (atomically: readers never see
    /// half a file), first removing entries whose daemons are gone.
    pub fn write(e: &Entry) -> Result<Registration> {
        let d = dir();
        make_dir(&d)?;
        if let Ok(rd) = std::fs::read_dir(&d) {
            for f in rd.flatten() {
                let stale = f.path().file_stem().and_then(|s| s.to_str()?.parse::<i32>().ok()).is_some_and(|pid| pid != e.pid && !alive(pid));
                if stale {
                    let _ = std::fs::remove_file(f.path());
                }
            }
        }
        let path = d.join(format!("{}.json", e.pid));
        let tmp = d.join(format!(".{}.json.tmp", e.pid));
        std::fs::write(&tmp, serde_json::to_vec_pretty(e).expect("entries serialise")).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
        Ok(Registration { path })
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Makes the registry directory `d`. Root's (`/run/cairn/mounts`) is
/// readable by every user, as the mount table is. Another user's is private,
/// and since its `/tmp` fallback has a name anyone can predict, whatever
/// already stands there must be a real directory of this user that nobody
/// else can enter: otherwise a local user could make `/tmp/cairn-UID` first,
/// read the entries, or point `mounts` elsewhere, where registering writes
/// files and clearing stale entries removes `PID.json` files.
fn make_dir(d: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if me == 0 {
        return std::fs::DirBuilder::new().recursive(true).mode(0o755).create(d).with_context(|| format!("creating {}", d.display()));
    }
    // The fallback's parent (`/tmp/cairn-UID`) is as exposed as `mounts`
    // itself; under XDG_RUNTIME_DIR (made 0700 by the login manager) only
    // `cairn` and `mounts` are ours to check.
    let fallback = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()).is_none();
    let parent = d.parent().expect("the registry directory has a parent");
    if !fallback {
        if let Some(p) = parent.parent() {
            std::fs::create_dir_all(p).with_context(|| format!("creating {}", p.display()))?;
        }
    }
    private_dir(parent, me)?;
    private_dir(d, me)
}

/// The local directory of the Cairn mount `m`: from the registry, else
/// from the source itself (a volume directory), else from the `cairn:DIR`
/// source that daemons of earlier versions gave their mounts.
pub fn local_dir_of(m: &cairn_fuse::mounttable::MountEntry) -> Option<PathBuf> {
    if m.fstype != "fuse.cairn" {
        return None;
    }
    if let Some(e) = find(m.dev) {
        return Some(e.local_dir);
    }
    let src = Path::new(&m.source);
    if src.is_absolute() && src.join("volume.json").exists() {
        return Some(src.to_path_buf());
    }
    use std::os::unix::ffi::OsStrExt;
    m.source.as_bytes().strip_prefix(b"cairn:").map(|d| PathBuf::from(std::ffi::OsStr::from_bytes(d)))
}

/// Creates `d` mode 0700 if it is missing, then checks that it is a
/// directory (not a symlink) owned by `me` with no access for others.
fn private_dir(d: &Path, me: u32) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    match std::fs::DirBuilder::new().mode(0o700).create(d) {
        Ok(()) => {
            // The umask may have narrowed it, never widened it; make it exact.
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).with_context(|| format!("setting the mode of {}", d.display()))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("creating {}", d.display())),
    }
    let m = std::fs::symlink_metadata(d).with_context(|| format!("reading {}", d.display()))?;
    let fix = "remove it, or set XDG_RUNTIME_DIR to a private directory of yours";
    if !m.file_type().is_dir() {
        anyhow::bail!("refusing the mount registry {}: it is not a directory (a symlink?); {fix}", d.display());
    }
    if m.uid() != me {
        anyhow::bail!("refusing the mount registry {}: it belongs to uid {}, not to you (uid {me}); {fix}", d.display(), m.uid());
    }
    if m.mode() & 0o077 != 0 {
        anyhow::bail!("refusing the mount registry {}: mode {:04o} lets other users in; run chmod 700 on it, or {fix}", d.display(), m.mode() & 0o7777);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn scratch(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("cairn-registry-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_new_registry_directory_is_private() {
        let base = scratch("new");
        let d = base.join("mounts");
        // SAFETY: geteuid has no preconditions.
        private_dir(&d, unsafe { libc::geteuid() }).unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o7777, 0o700);
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn a_registry_directory_made_by_someone_else_is_refused() {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let base = scratch("hostile");
        // Another user's directory (the test runs as root in CI; as
        // another user, pretend to be someone else instead).
        let theirs = base.join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
        let (dir_owner, as_user) = if me == 0 {
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            (65534, 0)
        } else {
            (me, me + 1)
        };
        let e = format!("{:#}", private_dir(&theirs, as_user).unwrap_err());
        assert!(e.contains(&format!("belongs to uid {dir_owner}")), "{e}");
        // Ours but open to others.
        let open = base.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = format!("{:#}", private_dir(&open, me).unwrap_err());
        assert!(e.contains("mode 0777 lets other users in"), "{e}");
        // A symlink to a directory of ours is not the directory.
        let target = scratch("target");
        let link = base.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = format!("{:#}", private_dir(&link, me).unwrap_err());
        assert!(e.contains("not a directory"), "{e}");
        std::fs::remove_dir_all(base).unwrap();
        std::fs::remove_dir_all(target).unwrap();
    }

    #[test]
    fn entries_round_trip_and_old_ones_parse() {
        let e = Entry { pid: 7, mountpoint: "/mnt/a".into(), volume: "s3://b/p".into(), local_dir: "/var/cache/cairn/b/p".into(), backend: "s3://b/p".into(), dev: (0, 52), started: 1, metrics: None };
        let back: Entry = serde_json::from_slice(&serde_json::to_vec(&e).unwrap()).unwrap();
        assert_eq!(back, e);
        let without_metrics = r#"{"pid":7,"mountpoint":"/m","volume":"/v","local_dir":"/v","backend":"local:/v/store","dev":[0,1],"started":3}"#;
        assert_eq!(serde_json::from_str::<Entry>(without_metrics).unwrap().metrics, None);
    }

    #[test]
    fn the_living_and_the_dead() {
        assert!(alive(std::process::id() as i32));
        assert!(!alive(i32::MAX));
    }
}
