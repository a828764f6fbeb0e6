//! `cairn archive mount FILE.tar MOUNTPOINT`: any tar archive as a
//! read-only file system, without extracting it (like ratarmount).
//!
//! - [`open_index`] parses the archive's headers once ([`cairn_tar`]) and
//!   keeps one row per member, with its data runs, in a SQLite file under
//!   [`default_index_dir`] named by a hash of the archive's canonical path.
//!   The index is reused while the archive's size, mtime and a BLAKE3 of
//!   its first and last 64 KiB are unchanged, and rebuilt otherwise.
//! - [`Tree`] lays the members out as extraction would: implied
//!   directories are synthesised, later members of a path replace earlier
//!   ones, hard links are further names of their target's inode.
//! - [`TarFs`] serves the tree; reads are preads of the archive at the
//!   member's data runs (holes read as zeros). Everything that would
//!   modify answers EROFS.
//! - [`mount_archive`] does all three and serves in the foreground until
//!   unmounted.

mod fs;
mod index;
mod mount;
mod tree;

pub use fs::{TarFs, ROOT_INO};
pub use index::{default_index_dir, index_builds, index_path, open_index, IndexInfo};
pub use mount::{mount_archive, MountInfo, TarMountOptions};
pub use tree::{Defaults, Node, Tree};

/// Why an archive could not be indexed or mounted.
#[derive(Debug, thiserror::Error)]
pub enum TarfsError {
    /// The archive is not a tar file we can read.
    #[error("{0}")]
    Tar(#[from] cairn_tar::TarError),
    /// A file system operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// Writing the index failed.
    #[error("writing the tar index: {0}")]
    Index(#[from] rusqlite::Error),
}

impl From<std::io::Error> for TarfsError {
    fn from(e: std::io::Error) -> Self {
        TarfsError::Io {
            what: "writing the tar index".into(),
            source: e,
        }
    }
}
