//! The engine's error type: a kind a caller can act on (and map to an errno),
//! plus a message for people.

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
}

/// An engine error.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    msg: String,
}

/// Engine result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A new error of `kind` with a message.
    pub fn new(kind: ErrorKind, msg: impl Into<String>) -> Self {
        Error { kind, msg: msg.into() }
    }
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
    pub fn message(&self) -> &str {
        &self.msg
    }
    pub(crate) fn not_found(msg: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, msg)
    }
    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, msg)
    }
    pub(crate) fn corrupt(msg: impl Into<String>) -> Self {
        Self::new(ErrorKind::Corrupt, msg)
    }
    pub(crate) fn io(msg: impl Into<String>) -> Self {
        Self::new(ErrorKind::Io, msg)
    }
    /// An OS error with context, keeping the errno a caller can act on (a
    /// full disk is ENOSPC to the writer, not EIO).
    pub(crate) fn os(what: impl fmt::Display, e: &std::io::Error) -> Self {
        Self::new(os_kind(e), format!("{what}: {e}"))
    }
    pub(crate) fn config(msg: impl Into<String>) -> Self {
        Self::new(ErrorKind::Config, msg)
    }
    /// Adds context in front of the message.
    pub fn context(self, what: impl fmt::Display) -> Self {
        Error { kind: self.kind, msg: format!("{what}: {}", self.msg) }
    }
    /// The errno a POSIX caller should see.
    pub fn errno(&self) -> i32 {
        match self.kind {
            ErrorKind::NotFound => libc::ENOENT,
            ErrorKind::Exists => libc::EEXIST,
            ErrorKind::NotDir => libc::ENOTDIR,
            ErrorKind::IsDir => libc::EISDIR,
            ErrorKind::NotEmpty => libc::ENOTEMPTY,
            ErrorKind::Invalid => libc::EINVAL,
            ErrorKind::NameTooLong => libc::ENAMETOOLONG,
            ErrorKind::NoAttr => libc::ENODATA,
            ErrorKind::Range => libc::ERANGE,
            ErrorKind::Permission => libc::EPERM,
            ErrorKind::ReadOnly => libc::EROFS,
            ErrorKind::TooBig => libc::EFBIG,
            ErrorKind::Corrupt | ErrorKind::Io | ErrorKind::Config => libc::EIO,
            ErrorKind::Busy => libc::EBUSY,
            ErrorKind::NotSupported => libc::EOPNOTSUPP,
            ErrorKind::NoSpace => libc::ENOSPC,
        }
    }
}

impl ErrorKind {
    /// The kind an errno stands for (the reverse of `Error::errno`).
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
            _ => ErrorKind::Io,
        }
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

/// The kind of an OS error a caller can act on: a full disk is ENOSPC.
fn os_kind(e: &std::io::Error) -> ErrorKind {
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => ErrorKind::NoSpace,
        _ => ErrorKind::Io,
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::new(os_kind(&e), e.to_string())
    }
}

/// What the engine makes of a backend failure. The engine only asks for
/// objects its metadata names, so a missing or short object is damage
/// (Corrupt: EIO, and fsck's business), as are bad bytes; a store that is
/// unreachable (after the retries of `RetryingBackend`) or refuses (bad
/// credentials, access denied) is an I/O error whose message says which.
impl From<cairn_backend::Error> for Error {
    fn from(e: cairn_backend::Error) -> Self {
        use cairn_backend::ErrorKind as B;
        let (kind, what) = match e.kind() {
            B::NotFound => (ErrorKind::Corrupt, "missing from the backend"),
            B::OutOfRange => (ErrorKind::Corrupt, "shorter in the backend than the metadata says"),
            B::Corrupt => (ErrorKind::Corrupt, "damaged in the backend"),
            B::Transient => (ErrorKind::Io, "backend unavailable"),
            B::Permanent => (ErrorKind::Io, "backend refused the request"),
            B::NoSpace => (ErrorKind::NoSpace, "the backend's medium is full"),
            B::Changed => (ErrorKind::Busy, "changed in the backend by someone else"),
            _ => (ErrorKind::Io, "backend error"),
        };
        Error::new(kind, format!("{what}: {e}"))
    }
}
