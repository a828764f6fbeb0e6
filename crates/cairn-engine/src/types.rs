//! Plain value types shared by the engine and its front ends (FUSE adapter, CLI).

pub use cairn_meta::types::{Attr, FileKind, Ino, Timestamp, ROOT_INO};
/// Longest name a directory entry may have (bytes), as on ext4.
pub const NAME_MAX: usize = 255;

/// A new time for `setattr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetTime {
    Now,
    At(Timestamp),
}

/// Changes requested by `setattr`; `None` leaves a field alone.
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    pub perm: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    pub ctime: Option<Timestamp>,
}

/// Who asks: the owner of new inodes. Permission checks are the kernel's
/// (`default_permissions`), so the engine needs no more than this.
#[derive(Clone, Copy, Debug, Default)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
}

/// One directory entry (without `.` and `..`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: Ino,
    pub kind: FileKind,
}

/// `rename` flags (renameat2).
#[derive(Clone, Copy, Debug, Default)]
pub struct RenameFlags {
    /// RENAME_NOREPLACE: fail with EEXIST if the target exists.
    pub noreplace: bool,
    /// RENAME_EXCHANGE: atomically swap the two names; both must exist.
    pub exchange: bool,
}

/// `setxattr` flags.
#[derive(Clone, Copy, Debug, Default)]
pub struct XattrFlags {
    /// XATTR_CREATE: fail with EEXIST if the attribute exists.
    pub create: bool,
    /// XATTR_REPLACE: fail with ENODATA if it does not.
    pub replace: bool,
}

/// File system totals for `statfs`.
#[derive(Clone, Copy, Debug, Default)]
pub struct StatFs {
    pub block_size: u32,
    pub blocks: u64,
    pub blocks_free: u64,
    pub blocks_avail: u64,
    pub files: u64,
    pub files_free: u64,
    pub name_max: u32,
}

/// `YYYY-MM-DD HH:MM:SS UTC` of seconds since the epoch, without a date
/// library (Howard Hinnant's civil-from-days).
pub fn format_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + (m <= 2) as i64;
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod utc_tests {
    #[test]
    fn utc_dates() {
        assert_eq!(super::format_utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(super::format_utc(1_795_000_000), "2026-11-18 11:06:40 UTC");
        assert_eq!(super::format_utc(951_782_400), "2000-02-29 00:00:00 UTC");
    }
}
