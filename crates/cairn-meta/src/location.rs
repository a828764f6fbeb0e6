//! Where a volume's metadata lives, and the one way to create or open the
//! store there: a file is an embedded SQLite database (in the volume's own
//! directory), a URL names a database server that many machines share
//! (PostgreSQL, one schema `cairn_<volume id>` per volume). The caller
//! names a place and gets an `Arc<dyn MetaStore>`: which store serves it
//! is this module's choice, so the engine names no store.

use crate::error::Result;
use crate::postgres::{PgMeta, PgOptions};
use crate::sqlite::SqliteMeta;
use crate::{Caller0, MetaStore, PageCodec};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Where a volume's metadata lives.
#[derive(Clone, Copy, Debug)]
pub enum Location<'a> {
    /// A database file of the embedded store (SQLite).
    File(&'a Path),
    /// A database server, by its URL, and the volume whose schema there
    /// holds the metadata. Every URL is PostgreSQL's today
    /// (`postgres://USER@HOST[:PORT]/DB`, or libpq's `key=value` form); a
    /// second server store would be chosen here by the URL's scheme.
    Url { url: &'a str, volume_id: &'a str },
}

/// How to open a store. The fields for the other kind of place are
/// ignored.
#[derive(Clone)]
pub struct OpenOptions {
    /// Reads the chunk references of an extent page (the engine's page
    /// format), for the store to free a page's chunks.
    pub codec: Arc<dyn PageCodec>,
    /// File: this process is the only user (it holds the volume lock);
    /// only then are changes grouped, for `group_window`.
    pub exclusive: bool,
    /// File: the group commit window ([`GROUP_WINDOW`](crate::GROUP_WINDOW)
    /// by default in the engine; zero commits every change).
    pub group_window: Duration,
    /// Url: how long one operation (its retries included) may take before
    /// it fails (None: the store's default).
    pub timeout: Option<Duration>,
    /// Url: every write waits for the server's WAL flush (else durable at
    /// the next `MetaStore::sync`).
    pub sync_commit: bool,
}

impl OpenOptions {
    /// Defaults: not exclusive, no grouping, the server's defaults.
    pub fn new(codec: Arc<dyn PageCodec>) -> OpenOptions {
        OpenOptions { codec, exclusive: false, group_window: Duration::ZERO, timeout: None, sync_commit: false }
    }
}

/// Creates a fresh store at `at` with the root directory owned by `root`:
/// a new database file, or the volume's schema in the server's database.
pub fn create(at: Location<'_>, root: Caller0) -> Result<()> {
    match at {
        Location::File(path) => SqliteMeta::create(path, root),
        Location::Url { url, volume_id } => PgMeta::create(url, volume_id, root),
    }
}

/// Opens the store at `at`, refusing one of an unknown schema version.
pub fn open(at: Location<'_>, opts: OpenOptions) -> Result<Arc<dyn MetaStore>> {
    Ok(match at {
        Location::File(path) => Arc::new(SqliteMeta::open(path, opts.exclusive, opts.group_window, opts.codec)?),
        Location::Url { url, volume_id } => {
            let mut o = PgOptions { sync_commit: opts.sync_commit, ..Default::default() };
            if let Some(t) = opts.timeout {
                o.timeout = t;
            }
            Arc::new(PgMeta::open_with(url, volume_id, opts.codec, o)?)
        }
    })
}
