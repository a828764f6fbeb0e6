//! Tar headers without the data: parse an archive's headers and report where
//! each member's bytes lie, and write header bytes for members whose data
//! the caller lays out itself.
//!
//! Cairn builds archives whose member data are existing file extents
//! (zero-copy) and extracts archives already in a volume by turning each
//! member into a sub-range of the archive. Neither direction copies data
//! through this crate: [`parse`] reads only header blocks (and the sparse
//! map of a pax 1.0 sparse member, which lives in its data area), and
//! [`write_header`] returns only header bytes.
//!
//! # Reading
//!
//! [`parse`] (or the streaming [`Parser`]) accepts ustar, pax (`x`/`g`
//! headers with path, linkpath, size, uid, gid, uname, gname, mtime, atime,
//! ctime, `SCHILY.xattr.*`, `LIBARCHIVE.xattr.*`, and the GNU sparse formats
//! 0.0, 0.1 and 1.0), GNU (`L`/`K` long names, `S` old sparse with
//! extension blocks, base-256 numbers), and v7 archives. Each [`Member`]
//! carries its [`DataRun`]s: archive ranges holding the member's bytes, and
//! for sparse members the file offsets they belong at (gaps are holes).
//!
//! # Writing
//!
//! A caller lays out, for each member, `write_header(spec, pos, align)`,
//! then [`HeaderSpec::data_len`] bytes of data, then [`data_padding`] zero
//! bytes; and finally [`END_OF_ARCHIVE`]. Headers are plain ustar when
//! everything fits, otherwise a pax `x` header comes first, as GNU tar
//! `--format=posix` writes them. With an alignment, the header is padded
//! (with a pax `comment` record) so the member's data starts on it.
//!
//! The crate never panics on any input and never allocates in proportion
//! to a size read from the archive before checking it against the archive
//! length.

#![forbid(unsafe_code)]

mod error;
mod num;
mod parse;
mod path;
mod write;

pub use error::TarError;
pub use parse::{parse, Parser};
pub use path::safe_path;
pub use write::{data_padding, write_header, HeaderSpec, END_OF_ARCHIVE};

use std::io;

/// The tar block size.
pub const BLOCK: u64 = 512;

/// Longest path component (file name) of a member, as on Linux. The parser
/// refuses a member whose path or hard-link target has a longer one.
pub const NAME_MAX: usize = 255;
/// Longest member path, symlink target or hard-link target, in bytes: Linux's
/// `PATH_MAX` (4096) less its terminating NUL. GNU long names and pax
/// `path`/`linkpath` records longer than this are refused while parsing
/// (a long name's data is not even read).
pub const PATH_MAX: usize = 4095;
/// Longest xattr name (Linux `XATTR_NAME_MAX`).
pub const XATTR_NAME_MAX: usize = 255;
/// Largest xattr value (Linux `XATTR_SIZE_MAX`): `getxattr` cannot return more.
pub const XATTR_SIZE_MAX: usize = 64 << 10;
/// Largest list of a member's xattr names, each with its NUL (Linux
/// `XATTR_LIST_MAX`): `listxattr` cannot return more.
pub const XATTR_LIST_MAX: usize = 64 << 10;

/// Positional reads of an archive.
pub trait ReadAt {
    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read
    /// (0 only at or past the end).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
}

impl ReadAt for std::fs::File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(self, buf, offset)
    }
}

impl ReadAt for [u8] {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let Ok(start) = usize::try_from(offset) else {
            return Ok(0);
        };
        if start >= self.len() {
            return Ok(0);
        }
        let n = buf.len().min(self.len() - start);
        buf[..n].copy_from_slice(&self[start..start + n]);
        Ok(n)
    }
}

impl ReadAt for Vec<u8> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.as_slice().read_at(buf, offset)
    }
}

impl<T: ReadAt + ?Sized> ReadAt for &T {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        (**self).read_at(buf, offset)
    }
}

/// What a member is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemberKind {
    /// A regular file (also contiguous files, type `7`, and unknown types,
    /// which POSIX says to read as regular files).
    File,
    /// A directory (also GNU dump directories, type `D`).
    Dir,
    /// A symbolic link; [`Member::link_target`] is its target.
    Symlink,
    /// A hard link to an earlier member; [`Member::link_target`] is that
    /// member's path.
    HardLink,
    /// A named pipe.
    Fifo,
    /// A character device.
    CharDev,
    /// A block device.
    BlockDev,
}

/// One archive member, as its headers describe it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Raw path bytes, as in the archive after pax `path`, GNU long names or
    /// `GNU.sparse.name` are applied; trailing '/' removed (a lone "/" is
    /// kept). Not checked for safety: see [`safe_path`].
    pub path: Vec<u8>,
    /// What the member is.
    pub kind: MemberKind,
    /// Symlink target or hard-link target path (None for other kinds).
    pub link_target: Option<Vec<u8>>,
    /// Permission bits (`mode & 0o7777`).
    pub mode: u32,
    /// Owner.
    pub uid: u64,
    /// Group.
    pub gid: u64,
    /// Owner name, if recorded.
    pub uname: Option<Vec<u8>>,
    /// Group name, if recorded.
    pub gname: Option<Vec<u8>>,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// Access time, if recorded (pax, or GNU header fields).
    pub atime_ns: Option<i64>,
    /// Change time, if recorded.
    pub ctime_ns: Option<i64>,
    /// Device numbers (character and block devices; 0 otherwise).
    pub dev_major: u32,
    /// See `dev_major`.
    pub dev_minor: u32,
    /// Logical size: for sparse files the real size, for regular files and
    /// hard links with data the data size, 0 for other kinds.
    pub size: u64,
    /// Extended attributes, in archive order, one entry per name.
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// Where the bytes are: sorted by `file_offset`, non-overlapping, none
    /// empty. A regular file of size n > 0 has one run `[0, n)`; a sparse
    /// file has one per data region (bytes not covered are holes, zeros).
    pub data: Vec<DataRun>,
    /// Archive offset of the member's first header block, counting pax `x`
    /// and GNU `L`/`K` headers that belong to it.
    pub header_offset: u64,
}

impl Member {
    /// True if the member's data are described by a sparse map (its runs
    /// may leave holes).
    pub fn is_sparse(&self) -> bool {
        let covered: u64 = self.data.iter().map(|r| r.len).sum();
        covered != self.size
    }
}

/// `len` bytes of a member at `file_offset` are stored in the archive at
/// `archive_offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DataRun {
    /// Offset in the member's file.
    pub file_offset: u64,
    /// Offset in the archive.
    pub archive_offset: u64,
    /// Length in bytes (never 0).
    pub len: u64,
}
