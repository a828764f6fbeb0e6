use std::fmt;

/// What went wrong in a backend call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The object does not exist.
    NotFound,
    /// A ranged read went past the end of the object.
    OutOfRange,
    /// The object name breaks the naming contract.
    InvalidName,
    /// The store could not be reached or failed; retrying may help.
    Transient,
    /// Any other I/O failure.
    Io,
}

/// A backend error: its kind, the object concerned, and the cause.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    msg: String,
}

/// Backend result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A new error.
    pub fn new(kind: ErrorKind, msg: impl Into<String>) -> Self {
        Error { kind, msg: msg.into() }
    }
    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
    pub(crate) fn from_io(what: &str, e: std::io::Error) -> Self {
        let kind = match e.kind() {
            std::io::ErrorKind::NotFound => ErrorKind::NotFound,
            _ => ErrorKind::Io,
        };
        Error::new(kind, format!("{what}: {e}"))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for Error {}
