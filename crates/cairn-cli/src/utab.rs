//! The mount's line in libmount's `/run/mount/utab`, so that a plain
//! `umount MOUNTPOINT` waits for the daemon to flush and exit (issue 50).
//!
//! umount(8) runs `umount.fuse.cairn` (which waits, as `cairn umount`
//! does) only when it learns the type `fuse.cairn` from the mount table.
//! For a mount without user-space options, util-linux takes a fast path:
//! `statfs(2)` names only `fuse`, so umount(8) calls umount(2) and returns
//! at once while the journal still holds data, and a script's next write
//! lands in the directory underneath. A utab line for the mount point
//! makes umount(8) read the mount table and find the helper; its
//! `uhelper=fuse.cairn` names the helper outright. The daemon (as root)
//! writes the line once mounted and removes it when it exits, under
//! libmount's lock (`utab.lock`, flock), by writing a new file and renaming
//! it, as libmount does. Lines mount(8) wrote for the same mount point stay:
//! libmount merges every line that matches a mounted file system.

use anyhow::{Context, Result};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// Where libmount keeps it.
const DIR: &str = "/run/mount";

/// libmount's escaping of a field: space, tab, newline and backslash as
/// octal escapes.
fn mangle(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            ' ' => out.push_str("\\040"),
            '\t' => out.push_str("\\011"),
            '\n' => out.push_str("\\012"),
            '\\' => out.push_str("\\134"),
            c => out.push(c),
        }
    }
    out
}

/// The line Cairn writes for a mount at `target` of `source`.
pub fn line(source: &str, target: &Path) -> String {
    format!("SRC={} TARGET={} ROOT=/ OPTS=uhelper=fuse.cairn", mangle(source), mangle(&target.to_string_lossy()))
}

/// Runs `f` on the lines of `dir/utab` under libmount's lock and writes
/// back what it returns (staged in a new file, renamed into place).
fn edit(dir: &Path, f: impl FnOnce(Vec<String>) -> Vec<String>) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o755).create(dir).with_context(|| format!("creating {}", dir.display()))?;
    let lock_path = dir.join("utab.lock");
    let lock = std::fs::OpenOptions::new().create(true).truncate(false).write(true).mode(0o644).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(&lock_path).with_context(|| format!("opening {}", lock_path.display()))?;
    // SAFETY: a valid descriptor, held until the end of this function.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("locking {}", lock_path.display()));
    }
    let path = dir.join("utab");
    let old = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let lines = f(old.lines().filter(|l| !l.trim().is_empty()).map(str::to_string).collect());
    let tmp: PathBuf = dir.join(format!("utab.cairn.{}", std::process::id()));
    {
        let mut t = std::fs::OpenOptions::new().create(true).truncate(true).write(true).mode(0o644).custom_flags(libc::O_NOFOLLOW).open(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        for l in &lines {
            writeln!(t, "{l}")?;
        }
    }
    std::fs::rename(&tmp, &path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

/// Adds Cairn's line for `target` (replacing an older one of Cairn's).
pub fn add_in(dir: &Path, source: &str, target: &Path) -> Result<()> {
    let ours = line(source, target);
    let tgt = format!(" TARGET={} ", mangle(&target.to_string_lossy()));
    edit(dir, |mut lines| {
        lines.retain(|l| !(l.contains(&tgt) && l.ends_with(" OPTS=uhelper=fuse.cairn")));
        lines.push(ours);
        lines
    })
}

/// Removes Cairn's line for `target` (lines others wrote stay).
pub fn remove_in(dir: &Path, source: &str, target: &Path) -> Result<()> {
    let ours = line(source, target);
    edit(dir, |mut lines| {
        lines.retain(|l| *l != ours);
        lines
    })
}

/// [`add_in`] for the system's utab, as root only (a user's mount is not
/// unmounted by umount(8) but by fusermount); failures are logged.
pub fn add(source: &str, target: &Path) {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    if let Err(e) = add_in(Path::new(DIR), source, target) {
        tracing::warn!("writing the mount's line in {DIR}/utab: {e:#}; a plain `umount {}` may return before the daemon has flushed (`cairn umount` waits)", target.display());
    }
}

/// [`remove_in`] for the system's utab, as root only.
pub fn remove(source: &str, target: &Path) {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    if let Err(e) = remove_in(Path::new(DIR), source, target) {
        tracing::warn!("removing the mount's line from {DIR}/utab: {e:#}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_added_once_and_removed_leaving_others() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("utab"), "SRC=/x TARGET=/mnt/other ROOT=/ OPTS=_netdev\n").unwrap();
        let t = Path::new("/mnt/my vol");
        add_in(d.path(), "/srv/v", t).unwrap();
        add_in(d.path(), "/srv/v", t).unwrap();
        let text = std::fs::read_to_string(d.path().join("utab")).unwrap();
        assert_eq!(text, "SRC=/x TARGET=/mnt/other ROOT=/ OPTS=_netdev\nSRC=/srv/v TARGET=/mnt/my\\040vol ROOT=/ OPTS=uhelper=fuse.cairn\n");
        remove_in(d.path(), "/srv/v", t).unwrap();
        assert_eq!(std::fs::read_to_string(d.path().join("utab")).unwrap(), "SRC=/x TARGET=/mnt/other ROOT=/ OPTS=_netdev\n");
    }
}
