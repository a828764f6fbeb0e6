//! Unmounting: through fusermount3 when it is installed (it works for
//! unprivileged users), else umount2(2); busy mounts are named as such.

use std::ffi::CString;
use std::io::{self, ErrorKind};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use tracing::warn;

use crate::mounttable::{conn_id, mount_entry};

fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Unmounts once, without the "is it mounted" checks of [`unmount`].
/// `lazy` detaches a busy mount (MNT_DETACH / `fusermount3 -uz`).
pub fn unmount_once(path: &Path, lazy: bool) -> io::Result<()> {
    match find_in_path("fusermount3").or_else(|| find_in_path("fusermount")) {
        Some(helper) => {
            let mut cmd = Command::new(&helper);
            cmd.arg(if lazy { "-uz" } else { "-u" }).arg("--").arg(path);
            let out = cmd.output().map_err(|e| {
                io::Error::new(e.kind(), format!("cannot run {}: {e}", helper.display()))
            })?;
            if out.status.success() {
                return Ok(());
            }
            let stderr = String::from_utf8_lossy(&out.stderr);
            Err(helper_error(path, stderr.trim()))
        }
        None => umount_syscall(path, lazy),
    }
}

fn busy_error(path: &Path) -> io::Error {
    io::Error::new(
        ErrorKind::ResourceBusy,
        format!(
            "{} is busy: files are open or a process has its working directory \
             inside; close them and retry, or detach it lazily (umount -l)",
            path.display()
        ),
    )
}

/// Classifies fusermount's complaint ("fusermount3: failed to unmount /x:
/// Device or resource busy").
fn helper_error(path: &Path, stderr: &str) -> io::Error {
    let lower = stderr.to_ascii_lowercase();
    if lower.contains("busy") {
        busy_error(path)
    } else if lower.contains("not found in") || lower.contains("invalid argument") {
        io::Error::new(
            ErrorKind::InvalidInput,
            format!("{} is not mounted", path.display()),
        )
    } else {
        io::Error::other(format!("cannot unmount {}: {stderr}", path.display()))
    }
}

pub fn umount_syscall(path: &Path, lazy: bool) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(ErrorKind::InvalidInput, "mountpoint contains a NUL byte"))?;
    let flags = libc::UMOUNT_NOFOLLOW | if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    Err(match e.raw_os_error() {
        Some(libc::EBUSY) => busy_error(path),
        Some(libc::EINVAL) => {
            io::Error::new(ErrorKind::InvalidInput, format!("{} is not mounted", path.display()))
        }
        Some(libc::EPERM) => io::Error::new(
            ErrorKind::PermissionDenied,
            format!(
                "cannot unmount {}: permission denied (install fuse3 for fusermount3, or run as root)",
                path.display()
            ),
        ),
        _ => io::Error::new(e.kind(), format!("cannot unmount {}: {e}", path.display())),
    })
}

/// Found through the mount table, never by stat'ing the mount: that would
/// wait for a session that is not serving yet.
pub fn fuse_connection_of(mountpoint: &Path) -> Option<u64> {
    match mount_entry(mountpoint) {
        Ok(Some(e)) if e.fstype.starts_with("fuse") => Some(conn_id(e.dev)),
        _ => None,
    }
}

/// Lazily detaches the mount at `path` if it is still our connection (a
/// later mount at the same path is left alone).
pub fn detach_if_ours(path: &Path, conn: Option<u64>) {
    let Some(ours) = conn else { return };
    match mount_entry(path) {
        Ok(Some(e)) if conn_id(e.dev) == ours => {
            if let Err(e) = umount_syscall(path, true) {
                warn!("{e}");
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fusermount_messages() {
        let p = Path::new("/mnt/x");
        let busy = helper_error(
            p,
            "fusermount3: failed to unmount /mnt/x: Device or resource busy",
        );
        assert_eq!(busy.kind(), ErrorKind::ResourceBusy);
        assert!(busy.to_string().contains("/mnt/x is busy"));
        let gone = helper_error(p, "fusermount3: entry for /mnt/x not found in /etc/mtab");
        assert_eq!(gone.kind(), ErrorKind::InvalidInput);
        assert!(gone.to_string().contains("not mounted"));
        let other = helper_error(p, "fusermount3: something else");
        assert!(other.to_string().contains("something else"));
    }
}
