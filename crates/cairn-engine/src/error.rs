//! The engine's error type: a kind a caller can act on (and map to an errno),
//! plus a message for people.

use std::fmt;

/// What went wrong, in terms a caller can act on (shared with the
/// metadata store).
pub use cairn_meta::ErrorKind;

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
            ErrorKind::Again => libc::EAGAIN,
            _ => libc::EIO,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for Error {}

impl From<cairn_meta::Error> for Error {
    fn from(e: cairn_meta::Error) -> Self {
        let (kind, msg) = e.into_parts();
        Error { kind, msg }
    }
}

/// An engine error raised inside a metadata transaction goes through the
/// store unchanged (kind and message), and comes back out by the `From` above.
impl From<Error> for cairn_meta::Error {
    fn from(e: Error) -> Self {
        cairn_meta::Error::new(e.kind, e.msg)
    }
}

/// A price table that is not one is invalid; one that cannot be read is
/// the OS error's.
impl From<cairn_model::prices::PriceError> for Error {
    fn from(e: cairn_model::prices::PriceError) -> Self {
        match &e {
            cairn_model::prices::PriceError::Invalid(_) => Error::invalid(e.to_string()),
            cairn_model::prices::PriceError::Read { error, .. } => Error::new(os_kind(error), e.to_string()),
        }
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
            // The chunk reads restore it and wait (volume/chunks.rs); what
            // reaches here is a read elsewhere (fsck, an export).
            B::Archived => (ErrorKind::Io, "archived in the backend (restore it first: cairn warmup)"),
            B::Unsupported => (ErrorKind::NotSupported, "not supported by the backend"),
            _ => (ErrorKind::Io, "backend error"),
        };
        Error::new(kind, format!("{what}: {e}"))
    }
}
