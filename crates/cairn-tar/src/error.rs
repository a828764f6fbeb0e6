//! The one error type of the crate.

use std::fmt;
use std::io;

/// Why an archive (or a member path) was refused. Every variant that comes
/// from the parser names the archive offset of the block at fault.
#[derive(Debug)]
#[non_exhaustive]
pub enum TarError {
    /// The archive ends inside a header, an extended header or member data.
    Truncated {
        /// Where the missing bytes should have started.
        offset: u64,
        /// What was being read.
        what: &'static str,
    },
    /// A header block whose checksum does not match its contents.
    BadChecksum {
        /// Offset of the header block.
        offset: u64,
        /// The value stored in the `chksum` field (None: not a number).
        stored: Option<u64>,
        /// The unsigned sum computed over the block.
        computed: u64,
    },
    /// A field that cannot be parsed or makes no sense (a size past the end
    /// of the archive, a malformed pax record, an inconsistent sparse map).
    BadField {
        /// Offset of the header block (or extended data) holding the field.
        offset: u64,
        /// The field, e.g. `"size"`, `"pax record"`, `"GNU.sparse.map"`.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A well-formed construct this crate does not handle (multi-volume
    /// members, huge extended headers).
    Unsupported {
        /// Offset of the header block.
        offset: u64,
        /// What it is.
        what: String,
    },
    /// A member path that must not be used for extraction ([`crate::safe_path`]).
    UnsafePath {
        /// The path as stored in the archive.
        path: Vec<u8>,
        /// Why it was refused.
        reason: &'static str,
    },
    /// Reading the archive failed.
    Io {
        /// Offset of the read that failed.
        offset: u64,
        /// The underlying error.
        source: io::Error,
    },
}

impl TarError {
    /// The archive offset the error refers to (None for [`TarError::UnsafePath`]).
    pub fn offset(&self) -> Option<u64> {
        match self {
            TarError::Truncated { offset, .. }
            | TarError::BadChecksum { offset, .. }
            | TarError::BadField { offset, .. }
            | TarError::Unsupported { offset, .. }
            | TarError::Io { offset, .. } => Some(*offset),
            TarError::UnsafePath { .. } => None,
        }
    }

    pub(crate) fn bad(offset: u64, field: &'static str, reason: impl Into<String>) -> Self {
        TarError::BadField {
            offset,
            field,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for TarError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TarError::Truncated { offset, what } => write!(
                f,
                "tar archive truncated: it ends inside {what} that starts at offset {offset}"
            ),
            TarError::BadChecksum {
                offset,
                stored,
                computed,
            } => match stored {
                Some(s) => write!(
                    f,
                    "tar header at offset {offset} has a bad checksum (stored {s:o}, computed {computed:o}): \
                     the archive is corrupt or this is not a tar file"
                ),
                None => write!(
                    f,
                    "tar header at offset {offset} has no valid checksum field: \
                     the archive is corrupt or this is not a tar file"
                ),
            },
            TarError::BadField {
                offset,
                field,
                reason,
            } => write!(f, "tar header at offset {offset}: bad {field}: {reason}"),
            TarError::Unsupported { offset, what } => {
                write!(f, "tar header at offset {offset}: unsupported: {what}")
            }
            TarError::UnsafePath { path, reason } => write!(
                f,
                "refusing tar member path {}: {reason}",
                quote(path)
            ),
            TarError::Io { offset, source } => {
                write!(f, "reading the tar archive at offset {offset}: {source}")
            }
        }
    }
}

impl std::error::Error for TarError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TarError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<TarError> for io::Error {
    fn from(e: TarError) -> io::Error {
        match e {
            TarError::Io { source, .. } => source,
            other => io::Error::new(io::ErrorKind::InvalidData, other),
        }
    }
}

/// At most this many bytes of a path are quoted in an error.
const QUOTE_MAX: usize = 120;

/// A path for an error message, cut if long.
pub(crate) fn quote(p: &[u8]) -> String {
    if p.len() <= QUOTE_MAX {
        format!("{:?}", String::from_utf8_lossy(p))
    } else {
        format!(
            "{:?}... ({} bytes)",
            String::from_utf8_lossy(&p[..QUOTE_MAX]),
            p.len()
        )
    }
}
