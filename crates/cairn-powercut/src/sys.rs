//! Mounting by hand (root only), the mount table, lazy unmounts and
//! aborting a FUSE connection.

use std::ffi::{CString, OsStr};
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// File system type shown in the mount table (`fuse.` + subtype).
pub(crate) const FSTYPE: &str = "fuse.cairn-powercut";
/// Mount source ("fsname").
pub(crate) const FSNAME: &str = "cairn-powercut";

fn cstr(p: &OsStr) -> io::Result<CString> {
    CString::new(p.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// One mount of /proc/self/mountinfo: its st_dev ("major:minor") and type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MountEntry {
    pub(crate) dev: (u64, u64),
    pub(crate) fstype: String,
}

/// Undoes the octal escapes (`\040` ...) of /proc mount tables.
fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            let d = &b[i + 1..i + 4];
            if d.iter().all(|c| (b'0'..=b'7').contains(c)) {
                let v = d.iter().fold(0u32, |a, c| a * 8 + u32::from(c - b'0'));
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// The topmost mount at exactly `path` (canonical), from the mount table,
/// without touching the path (it may be a dead FUSE mount).
pub(crate) fn mount_at(path: &Path) -> io::Result<Option<MountEntry>> {
    let text = fs::read_to_string("/proc/self/mountinfo")?;
    let mut found = None;
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        let (Some(dev), Some(mp), Some(fstype)) =
            (fields.get(2), fields.get(4), fields.get(sep + 1))
        else {
            continue;
        };
        if Path::new(OsStr::from_bytes(&unescape(mp))) != path {
            continue;
        }
        let Some((maj, min)) = dev.split_once(':') else {
            continue;
        };
        let (Ok(maj), Ok(min)) = (maj.parse(), min.parse()) else {
            continue;
        };
        // Later lines are mounted on top of earlier ones.
        found = Some(MountEntry {
            dev: (maj, min),
            fstype: (*fstype).to_string(),
        });
    }
    Ok(found)
}

/// The name of a FUSE connection in /sys/fs/fuse/connections: the kernel's
/// internal dev_t of the superblock.
pub(crate) fn conn_id(dev: (u64, u64)) -> u64 {
    (dev.0 << 20) | dev.1
}

/// mount(2) of a FUSE file system on a fresh /dev/fuse descriptor.
pub(crate) fn mount_fuse(mountpoint: &Path) -> io::Result<OwnedFd> {
    let dev: OwnedFd = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| io::Error::new(e.kind(), format!("cannot open /dev/fuse: {e}")))?
        .into();
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let data = format!(
        "fd={},rootmode=40000,user_id={uid},group_id={gid},default_permissions,allow_other",
        dev.as_raw_fd()
    );
    let source = cstr(OsStr::new(FSNAME))?;
    let target = cstr(mountpoint.as_os_str())?;
    let fstype = cstr(OsStr::new(FSTYPE))?;
    let data = cstr(OsStr::new(&data))?;
    // SAFETY: valid NUL-terminated strings for the duration of the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("cannot mount {}: {e}", mountpoint.display()),
        ));
    }
    Ok(dev)
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

/// Aborts FUSE connection `id` through fusectl (mounting fusectl if needed):
/// every pending and later request fails, the daemon's reads of /dev/fuse
/// get ENODEV and its session ends, even if files are still open.
pub(crate) fn abort_connection(id: u64) -> io::Result<()> {
    let root = PathBuf::from("/sys/fs/fuse/connections");
    let dir = root.join(id.to_string());
    if !dir.exists() && mount_at(&root)?.is_none() {
        let src = cstr(OsStr::new("fusectl"))?;
        let target = cstr(root.as_os_str())?;
        // SAFETY: valid NUL-terminated strings.
        let rc = unsafe {
            libc::mount(
                src.as_ptr(),
                target.as_ptr(),
                src.as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EBUSY) {
                return Err(io::Error::new(
                    e.kind(),
                    format!("cannot mount fusectl: {e}"),
                ));
            }
        }
    }
    match fs::write(dir.join("abort"), b"1") {
        Ok(()) => Ok(()),
        // Already gone: the connection ended by itself.
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes() {
        assert_eq!(unescape("a\\040b"), b"a b");
        assert_eq!(unescape("x\\09"), b"x\\09");
        assert_eq!(unescape("end\\"), b"end\\");
    }

    #[test]
    fn root_is_mounted() {
        let e = mount_at(Path::new("/")).unwrap().unwrap();
        assert!(!e.fstype.is_empty());
    }
}
