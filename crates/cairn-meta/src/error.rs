//! The store's error: a kind a caller can act on (the engine maps it to an
//! errno) and a message for people. The engine's error converts from it
//! without loss, and back (a closure's error passes through a transaction).

use std::fmt;

/// What went wrong, in terms a caller can act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    NotFound,
    Exists,
    NotDir,
    IsDir,
    NotEmpty,
    Invalid,
    NameTooLong,
    NoAttr,
    Range,
    Permission,
    ReadOnly,
    TooBig,
    /// Stored data failed verification or could not be read: never served.
    Corrupt,
    /// The backend or local disk failed.
    Io,
    /// The volume's configuration or key is wrong (bad passphrase, unknown format).
    Config,
    /// The volume is in use by another process.
    Busy,
    NotSupported,
    /// The local disk under the volume (journal, metadata) is full.
    NoSpace,
    /// This mount's session expired or was removed (on the database's
    /// clock): it must stop writing and never re-register by itself.
    SessionLost,
    /// Another machine changed a chunk this transaction relied on: it
    /// claimed the same new chunk first, or collected a chunk found by hash
    /// before the transaction referenced it. Nothing was written; the
    /// writer prepares its batch again (it then finds the other machine's
    /// chunk, or stores the collected one anew). Never retried inside the
    /// store: running the same closure again would fail the same way.
    Raced,
    /// Try again later: the data is fine but not readable yet (an archived
    /// pack whose restore is under way, docs/tiers.md §6). EAGAIN.
    Again,
}

impl ErrorKind {
    /// The kind an errno stands for (the reverse of the engine's `Error::errno`).
    pub fn from_errno(e: i32) -> Self {
        match e {
            libc::ENOENT => ErrorKind::NotFound,
            libc::EEXIST => ErrorKind::Exists,
            libc::ENOTDIR => ErrorKind::NotDir,
            libc::EISDIR => ErrorKind::IsDir,
            libc::ENOTEMPTY => ErrorKind::NotEmpty,
            libc::EINVAL => ErrorKind::Invalid,
            libc::ENAMETOOLONG => ErrorKind::NameTooLong,
            libc::ENODATA => ErrorKind::NoAttr,
            libc::ERANGE => ErrorKind::Range,
            libc::EPERM | libc::EACCES => ErrorKind::Permission,
            libc::EROFS => ErrorKind::ReadOnly,
            libc::EFBIG => ErrorKind::TooBig,
            libc::EBUSY => ErrorKind::Busy,
            libc::EOPNOTSUPP => ErrorKind::NotSupported,
            libc::ENOSPC => ErrorKind::NoSpace,
            libc::EAGAIN => ErrorKind::Again,
            _ => ErrorKind::Io,
        }
    }
}

/// A metadata store error.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    msg: String,
}

/// Store result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(kind: ErrorKind, msg: impl Into<String>) -> Self {
        Error { kind, msg: msg.into() }
    }
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
    pub fn message(&self) -> &str {
        &self.msg
    }
    pub fn into_parts(self) -> (ErrorKind, String) {
        (self.kind, self.msg)
    }
    pub fn corrupt(msg: impl Into<String>) -> Self {
        Self::new(ErrorKind::Corrupt, msg)
    }
    pub fn io(msg: impl Into<String>) -> Self {
        Self::new(ErrorKind::Io, msg)
    }
    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, msg)
    }
    pub fn config(msg: impl Into<String>) -> Self {
        Self::new(ErrorKind::Config, msg)
    }
    /// An OS error with context; a full disk stays ENOSPC.
    pub fn os(what: impl fmt::Display, e: &std::io::Error) -> Self {
        let kind = match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => ErrorKind::NoSpace,
            _ => ErrorKind::Io,
        };
        Self::new(kind, format!("{what}: {e}"))
    }
    /// Adds context in front of the message.
    pub fn context(self, what: impl fmt::Display) -> Self {
        Error { kind: self.kind, msg: format!("{what}: {}", self.msg) }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for Error {}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        let full = matches!(&e, rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::DiskFull);
        Error::new(if full { ErrorKind::NoSpace } else { ErrorKind::Io }, format!("metadata database: {e}"))
    }
}
