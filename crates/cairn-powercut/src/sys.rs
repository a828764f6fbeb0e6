//! Mounting by hand (root only), the mount table, lazy unmounts and
//! aborting a FUSE connection.

use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;

/// File system type shown in the mount table (`fuse.` + subtype).
pub(crate) const FSTYPE: &str = "fuse.cairn-powercut";
/// Mount source ("fsname").
pub(crate) const FSNAME: &str = "cairn-powercut";

// The mount table, connection ids, fusectl aborts and umount2 are the mount
// scaffold's (`cairn-mount`), so every Cairn file system reads the kernel's
// tables and unmounts one way.
pub(crate) use cairn_mount::mounttable::{abort_connection, conn_id, mount_entry as mount_at, MountEntry};
pub(crate) use cairn_mount::umount_syscall as umount;

/// mount(2) of the power-cut file system on a fresh /dev/fuse descriptor.
pub(crate) fn mount_fuse(mountpoint: &Path) -> io::Result<OwnedFd> {
    cairn_mount::mounttable::mount_fuse(mountpoint, FSNAME, FSTYPE, false, "default_permissions,allow_other")
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
