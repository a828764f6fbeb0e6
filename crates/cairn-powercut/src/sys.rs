//! Mounting by hand (root only), the mount table, lazy unmounts and
//! aborting a FUSE connection.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// File system type shown in the mount table (`fuse.` + subtype).
pub(crate) const FSTYPE: &str = "fuse.cairn-powercut";
/// Mount source ("fsname").
pub(crate) const FSNAME: &str = "cairn-powercut";

fn cstr(p: &OsStr) -> io::Result<CString> {
    CString::new(p.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

// The mount table, connection ids and fusectl aborts are the FUSE adapter's
// (`cairn_fuse::mounttable`), so both read the kernel's tables one way.
pub(crate) use cairn_fuse::mounttable::{abort_connection, conn_id, mount_entry as mount_at, MountEntry};

/// mount(2) of the power-cut file system on a fresh /dev/fuse descriptor.
pub(crate) fn mount_fuse(mountpoint: &Path) -> io::Result<OwnedFd> {
    cairn_fuse::mounttable::mount_fuse(mountpoint, FSNAME, FSTYPE, false, "default_permissions,allow_other")
}

/// umount2(2); `lazy` detaches even a busy mount.
pub(crate) fn umount(path: &Path, lazy: bool) -> io::Result<()> {
    let p = cstr(path.as_os_str())?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: valid NUL-terminated string.
    if unsafe { libc::umount2(p.as_ptr(), flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_mounted() {
        let e = mount_at(Path::new("/")).unwrap().unwrap();
        assert!(!e.fstype.is_empty());
    }
}
