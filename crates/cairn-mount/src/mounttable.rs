//! The kernel's mount table and FUSE connections, read and acted on without
//! touching a mount point (it may be a dead FUSE mount whose daemon is
//! gone), and mounting by hand as root.

use std::ffi::{CString, OsString};
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// One line of /proc/self/mountinfo, the fields we use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// "major:minor" of st_dev for files on this mount.
    pub dev: (u64, u64),
    pub mount_point: PathBuf,
    /// File system type, e.g. `fuse.cairn`.
    pub fstype: String,
    /// Mount source ("fsname").
    pub source: OsString,
}

/// Every mount of this process's mount namespace, in mount order.
pub fn entries() -> io::Result<Vec<MountEntry>> {
    Ok(parse_mountinfo(&fs::read_to_string("/proc/self/mountinfo")?))
}

/// Undoes the octal escapes (`\040` for space, ...) of /proc mount tables.
fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            let digits = &b[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let v = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
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

/// Parses /proc/self/mountinfo (proc(5)): `id parent major:minor root
/// mountpoint options [optional...] - fstype source superoptions`.
fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let (maj, min) = fields.get(2)?.split_once(':')?;
            let dev = (maj.parse().ok()?, min.parse().ok()?);
            let mount_point = PathBuf::from(OsString::from_vec(unescape(fields.get(4)?)));
            let sep = fields.iter().skip(6).position(|f| *f == "-")? + 6;
            let fstype = String::from_utf8_lossy(&unescape(fields.get(sep + 1)?)).into_owned();
            let source = OsString::from_vec(unescape(fields.get(sep + 2)?));
            Some(MountEntry {
                dev,
                mount_point,
                fstype,
                source,
            })
        })
        .collect()
}

/// The topmost mount at exactly `path`, if any.
pub fn mount_entry(path: &Path) -> io::Result<Option<MountEntry>> {
    Ok(entries()?
        .into_iter()
        .rfind(|e| e.mount_point == path))
}

/// The FUSE connection number of a mount (its directory name under
/// /sys/fs/fuse/connections): the superblock's kernel `dev_t`,
/// `major << 20 | minor`.
pub fn conn_id(dev: (u64, u64)) -> u64 {
    (dev.0 << 20) | dev.1
}

/// Aborts a FUSE connection through fusectl: pending and future requests
/// fail with ENOTCONN and the session's reads end, so `destroy` runs.
pub fn abort_connection(id: u64) -> io::Result<()> {
    let root = Path::new("/sys/fs/fuse/connections");
    if !root.join(id.to_string()).exists() {
        // fusectl is often not mounted; as root we can mount it.
        let src = CString::new("fusectl").map_err(io::Error::other)?;
        let dst = CString::new(root.as_os_str().as_bytes()).map_err(io::Error::other)?;
        // SAFETY: valid NUL-terminated strings; no data argument.
        let rc = unsafe {
            libc::mount(
                src.as_ptr(),
                dst.as_ptr(),
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
    match fs::write(root.join(id.to_string()).join("abort"), b"1") {
        // Already gone: the connection ended by itself.
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// mount(2) of a FUSE file system at `mountpoint` on a fresh /dev/fuse
/// descriptor (root only), as `source` of type `fstype` (`fuse.NAME`), with
/// `options` after the ones every FUSE mount needs. Returns the descriptor
/// for the session.
pub fn mount_fuse(mountpoint: &Path, source: &str, fstype: &str, read_only: bool, options: &str) -> io::Result<OwnedFd> {
    let dev: OwnedFd = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| io::Error::new(e.kind(), format!("cannot open /dev/fuse: {e}")))?
        .into();
    let root_mode = fs::metadata(mountpoint)?.mode() & libc::S_IFMT;
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let data = format!("fd={},rootmode={root_mode:o},user_id={uid},group_id={gid},{options}", dev.as_raw_fd());
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV;
    if read_only {
        flags |= libc::MS_RDONLY;
    }
    let nul = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("{what} contains a NUL byte"));
    let source = CString::new(source).map_err(|_| nul("fsname"))?;
    let target = CString::new(mountpoint.as_os_str().as_bytes()).map_err(|_| nul("mountpoint"))?;
    let fstype = CString::new(fstype).map_err(|_| nul("type"))?;
    let data = CString::new(data).map_err(|_| nul("options"))?;
    // SAFETY: all pointers are valid NUL-terminated strings for the call.
    let rc = unsafe { libc::mount(source.as_ptr(), target.as_ptr(), fstype.as_ptr(), flags, data.as_ptr().cast()) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("cannot mount {}: {e}", mountpoint.display())));
    }
    Ok(dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
35 22 0:31 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
98 22 0:52 / /mnt/my\\040vol rw,nosuid,nodev,relatime shared:50 - fuse.cairn cairn rw,user_id=0,group_id=0,default_permissions
99 22 0:53 / /mnt/plain rw,relatime - fuse /dev/fuse rw,user_id=0
100 22 253:1 /srv /mnt/bind rw,relatime shared:1 - ext4 /dev/vda1 rw
101 98 0:300 / /mnt/my\\040vol rw - tmpfs tmpfs rw
";

    #[test]
    fn mountinfo_fields() {
        let m = parse_mountinfo(MOUNTINFO);
        assert_eq!(m.len(), 6);
        assert_eq!(
            m[0],
            MountEntry {
                dev: (253, 1),
                mount_point: PathBuf::from("/"),
                fstype: "ext4".into(),
                source: "/dev/vda1".into(),
            }
        );
        assert_eq!(m[2].source, "cairn");
        assert_eq!(m[2].mount_point, PathBuf::from("/mnt/my vol"));
        assert_eq!(m[2].fstype, "fuse.cairn");
        assert_eq!(m[2].dev, (0, 52));
        // No optional fields before the separator.
        assert_eq!(m[3].fstype, "fuse");
        assert_eq!(m[4].mount_point, PathBuf::from("/mnt/bind"));
    }

    #[test]
    fn mountinfo_ignores_garbage() {
        assert!(parse_mountinfo("").is_empty());
        assert!(parse_mountinfo("not a mount line\n1 2 3\n").is_empty());
        assert!(parse_mountinfo("1 2 x:y / /a rw - ext4 s rw\n").is_empty());
    }

    #[test]
    fn octal_escapes() {
        assert_eq!(unescape("a\\040b"), b"a b");
        assert_eq!(unescape("tab\\011nl\\012bs\\134"), b"tab\tnl\nbs\\");
        assert_eq!(unescape("plain"), b"plain");
        // Malformed escapes stay as they are.
        assert_eq!(unescape("x\\09"), b"x\\09");
        assert_eq!(unescape("end\\"), b"end\\");
        assert_eq!(unescape("\\777"), b"\\777");
    }

    #[test]
    fn connection_ids() {
        assert_eq!(conn_id((0, 52)), 52);
        assert_eq!(conn_id((0, 300)), 300);
        assert_eq!(conn_id((1, 2)), (1 << 20) | 2);
    }

}
