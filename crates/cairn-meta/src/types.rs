//! Plain value types the store persists and the engine uses (re-exported
//! by the engine at their old paths).

use crate::error::{Error, Result};

/// Inode number. 1 is the root directory; numbers are never reused.
pub type Ino = u64;
/// The root directory's inode number.
pub const ROOT_INO: Ino = 1;

/// Time as nanoseconds since the Unix epoch (negative before 1970).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// The current wall-clock time.
    pub fn now() -> Self {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp(d.as_nanos() as i64)
    }
    /// Converts from a `SystemTime`, saturating outside ±292 years.
    pub fn from_system(t: std::time::SystemTime) -> Self {
        match t.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => Timestamp(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)),
            Err(e) => Timestamp(-i64::try_from(e.duration().as_nanos()).unwrap_or(i64::MAX)),
        }
    }
    /// Converts to a `SystemTime`.
    pub fn to_system(self) -> std::time::SystemTime {
        let e = std::time::UNIX_EPOCH;
        if self.0 >= 0 {
            e + std::time::Duration::from_nanos(self.0 as u64)
        } else {
            e - std::time::Duration::from_nanos(self.0.unsigned_abs())
        }
    }
}

/// What kind of object an inode is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

impl FileKind {
    pub fn code(self) -> i64 {
        match self {
            FileKind::File => 1,
            FileKind::Dir => 2,
            FileKind::Symlink => 3,
            FileKind::Fifo => 4,
            FileKind::Socket => 5,
            FileKind::CharDev => 6,
            FileKind::BlockDev => 7,
        }
    }
    pub fn from_code(c: i64) -> Result<Self> {
        Ok(match c {
            1 => FileKind::File,
            2 => FileKind::Dir,
            3 => FileKind::Symlink,
            4 => FileKind::Fifo,
            5 => FileKind::Socket,
            6 => FileKind::CharDev,
            7 => FileKind::BlockDev,
            _ => return Err(Error::corrupt(format!("unknown inode kind code {c}"))),
        })
    }
    /// The kind encoded in the `S_IFMT` bits of a mode, if any.
    pub fn from_mode(mode: u32) -> Option<Self> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => FileKind::File,
            libc::S_IFDIR => FileKind::Dir,
            libc::S_IFLNK => FileKind::Symlink,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            libc::S_IFCHR => FileKind::CharDev,
            libc::S_IFBLK => FileKind::BlockDev,
            _ => return None,
        })
    }
}

/// Attributes of an inode, as `stat` reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: FileKind,
    /// Permission bits including setuid/setgid/sticky (`mode & 0o7777`).
    pub perm: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub size: u64,
    /// Allocated space in 512-byte units: logical bytes that are not holes.
    pub blocks: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub btime: Timestamp,
}

