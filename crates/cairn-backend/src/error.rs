use std::fmt;

/// What went wrong in a backend call. Callers decide by kind: retry
/// ([`ErrorKind::Transient`] only), report a missing or damaged object as
/// corruption, or give up and say why ([`ErrorKind::Permanent`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The object does not exist.
    NotFound,
    /// A ranged read went past the end of the object.
    OutOfRange,
    /// The object name breaks the naming contract.
    InvalidName,
    /// A conditional create found the object already there.
    AlreadyExists,
    /// A conditional update found the object replaced or gone (its tag is
    /// not the one given).
    Changed,
    /// The store could not be reached, timed out, was busy or failed on its
    /// side (a 5xx, a reset, a full disk): the same call may succeed later.
    Transient,
    /// The store refused the request and will again (bad credentials,
    /// access denied, a missing bucket, a failing disk): retrying is futile.
    Permanent,
    /// The store returned bytes that are not what was stored (a short
    /// body, a checksum mismatch).
    Corrupt,
    /// The medium is full (a tape at its end): nothing more can be stored
    /// on it, though everything stored before stays readable.
    NoSpace,
    /// The object lives in an archive storage class (S3 `GLACIER`,
    /// `DEEP_ARCHIVE`) and has no restored copy: a GET is refused (S3's 403
    /// `InvalidObjectState`) until [`crate::Backend::restore`] brings one
    /// back. Not transient: retrying the same GET fails the same way until
    /// the restore completes, hours later.
    Archived,
    /// The store does not do this (a storage class or a restore on a
    /// store without classes: a directory, a tape).
    Unsupported,
}

impl ErrorKind {
    /// Whether retrying the same call may help.
    pub fn is_transient(self) -> bool {
        self == ErrorKind::Transient
    }
}

/// A backend error: its kind, the object concerned (if any), what was being
/// done, and the underlying error.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    object: Option<String>,
    msg: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// Backend result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A new error; `msg` says what was being done.
    pub fn new(kind: ErrorKind, msg: impl Into<String>) -> Self {
        Error { kind, object: None, msg: msg.into(), source: None }
    }

    /// Names the object the call was about.
    pub fn with_object(mut self, name: impl Into<String>) -> Self {
        self.object = Some(name.into());
        self
    }

    /// Keeps the underlying error (shown after the message, and as
    /// [`std::error::Error::source`]).
    pub fn with_source(mut self, e: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(e));
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The object the call was about, if it was about one.
    pub fn object(&self) -> Option<&str> {
        self.object.as_deref()
    }

    /// An I/O error of a local file system, classified: a missing file is
    /// NotFound, an existing one AlreadyExists, an interrupted or timed-out
    /// call and a full disk Transient (space can come back), the rest
    /// Permanent.
    pub fn from_io(what: &str, e: std::io::Error) -> Self {
        use std::io::ErrorKind as K;
        let kind = match e.kind() {
            K::NotFound => ErrorKind::NotFound,
            K::AlreadyExists => ErrorKind::AlreadyExists,
            K::Interrupted | K::TimedOut | K::WouldBlock | K::StorageFull | K::QuotaExceeded | K::ResourceBusy => ErrorKind::Transient,
            K::UnexpectedEof => ErrorKind::Corrupt,
            _ => ErrorKind::Permanent,
        };
        Error::new(kind, what).with_source(e)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)?;
        if let Some(s) = &self.source {
            write!(f, ": {s}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_are_classified_and_keep_their_source() {
        let e = Error::from_io("reading object packs/00/x", std::io::Error::from(std::io::ErrorKind::NotFound)).with_object("packs/00/x");
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert_eq!(e.object(), Some("packs/00/x"));
        assert!(e.to_string().starts_with("reading object packs/00/x: "), "{e}");
        assert!(std::error::Error::source(&e).is_some());
        let full = Error::from_io("writing", std::io::Error::from_raw_os_error(libc_enospc()));
        assert!(full.kind().is_transient(), "a full disk can free up: {full:?}");
        let eio = Error::from_io("writing", std::io::Error::from_raw_os_error(5));
        assert_eq!(eio.kind(), ErrorKind::Permanent);
    }

    fn libc_enospc() -> i32 {
        28
    }
}
