//! Mountpoint checks, the same for every file system that mounts.

use std::fs;
use std::io::{self, ErrorKind};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::mounttable::mount_entry;

fn busy(path: &Path, why: &str) -> io::Error {
    io::Error::new(
        ErrorKind::ResourceBusy,
        format!("mountpoint {} is busy: {why}", path.display()),
    )
}

/// Checks the mountpoint and returns its canonical path.
pub fn validate_mountpoint(mp: &Path) -> io::Result<PathBuf> {
    let meta = match fs::metadata(mp) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Err(io::Error::new(
                ErrorKind::NotFound,
                format!("mountpoint {} does not exist", mp.display()),
            ))
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            return Err(busy(
                mp,
                "already mounted (by a FUSE daemon that is gone: unmount it first)",
            ))
        }
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!("mountpoint {}: {e}", mp.display()),
            ))
        }
    };
    if !meta.is_dir() {
        return Err(io::Error::new(
            ErrorKind::NotADirectory,
            format!("mountpoint {} is not a directory", mp.display()),
        ));
    }
    let canon = mp.canonicalize()?;
    if is_mount_point(&canon, &meta)? {
        return Err(busy(&canon, "already mounted"));
    }
    Ok(canon)
}

fn is_mount_point(canon: &Path, meta: &fs::Metadata) -> io::Result<bool> {
    let Some(parent) = canon.parent() else {
        return Ok(true); // "/"
    };
    let pmeta = fs::metadata(parent)?;
    if pmeta.dev() != meta.dev() || pmeta.ino() == meta.ino() {
        return Ok(true);
    }
    // A bind mount of the same file system keeps st_dev: ask the mount table.
    Ok(mount_entry(canon)?.is_some())
}

/// An absolute path for `p` without resolving `p` itself, which may be a
/// dead FUSE mount that cannot be stat'ed.
pub fn absolute(p: &Path) -> io::Result<PathBuf> {
    let abs = std::path::absolute(p)?;
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => match parent.canonicalize() {
            Ok(parent) => Ok(parent.join(name)),
            Err(_) => Ok(abs),
        },
        _ => Ok(abs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountpoint_checks() {
        let missing = validate_mountpoint(Path::new("/nonexistent/cairn/mp")).unwrap_err();
        assert_eq!(missing.kind(), ErrorKind::NotFound);
        assert_eq!(
            missing.to_string(),
            "mountpoint /nonexistent/cairn/mp does not exist"
        );

        let root = validate_mountpoint(Path::new("/")).unwrap_err();
        assert_eq!(root.kind(), ErrorKind::ResourceBusy);
        assert!(root.to_string().contains("already mounted"), "{root}");

        let dir = std::env::temp_dir().join(format!("cairn-fuse-mp-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("f");
        fs::write(&file, b"").unwrap();
        assert_eq!(
            validate_mountpoint(&file).unwrap_err().kind(),
            ErrorKind::NotADirectory
        );
        assert_eq!(
            validate_mountpoint(&dir).unwrap(),
            dir.canonicalize().unwrap()
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
