//! Change shipping ([`ShipChanges`]): session patchsets and whole-database
//! snapshots a cloud volume ships to its bucket, and reading them back.

use super::*;

impl Capture {
    /// A session recording every table of `c`.
    pub(super) fn start(c: &Connection) -> Result<Capture> {
        let mut s = rusqlite::session::Session::new(c)?;
        s.attach(None::<&str>)?;
        // SAFETY: the session keeps only the raw handle of `c`'s database;
        // the `Conn` that owns both drops the session first (field order)
        // and never replaces its connection.
        Ok(Capture(unsafe { std::mem::transmute::<rusqlite::session::Session<'_>, rusqlite::session::Session<'static>>(s) }))
    }
}

impl ShipChanges for SqliteMeta {
    fn capture_changes(&self) -> Result<()> {
        SqliteMeta::capture_changes(self)
    }
    fn take_changes(&self) -> Result<Option<Vec<u8>>> {
        SqliteMeta::take_changes(self)
    }
    fn has_changes(&self) -> bool {
        SqliteMeta::has_changes(self)
    }
    fn snapshot(&self) -> Result<Vec<u8>> {
        SqliteMeta::snapshot(self)
    }
}

/// The names of every pack a database file names (a database rebuilt from
/// the bucket, read without opening it as a store).
pub fn pack_names_in(path: &Path) -> Result<Vec<String>> {
    let c = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| Error::io(format!("opening metadata {}: {e}", path.display())))?;
    let mut q = c.prepare("SELECT name FROM packs")?;
    let v = q.query_map([], |r| r.get::<_, String>(0))?.collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(v)
}

/// Applies SQLite patchsets, in order, to the database file `path` (in WAL
/// mode; checkpointed at the end), each in one transaction. `next` yields
/// each patchset with a name for errors (None: done); `applied` is called
/// after each. A patchset that conflicts with the state before it fails
/// (Corrupt) and leaves the state before it.
pub fn apply_patchsets(
    path: &Path,
    next: &mut dyn FnMut() -> Result<Option<(String, Vec<u8>)>>,
    applied: &mut dyn FnMut() -> Result<()>,
) -> Result<()> {
    let c = Connection::open(path).map_err(|e| Error::io(format!("opening metadata {}: {e}", path.display())))?;
    c.execute_batch("PRAGMA journal_mode=WAL;")?;
    while let Some((what, delta)) = next()? {
        let conflicts = Arc::new(AtomicU64::new(0));
        let seen = conflicts.clone();
        c.execute_batch("BEGIN IMMEDIATE")?;
        let r = c.apply_strm(&mut &delta[..], None::<fn(&str) -> bool>, move |_, _| {
            seen.fetch_add(1, Ordering::Relaxed);
            rusqlite::session::ConflictAction::SQLITE_CHANGESET_ABORT
        });
        if r.is_err() || conflicts.load(Ordering::Relaxed) > 0 {
            let _ = c.execute_batch("ROLLBACK");
            return Err(Error::corrupt(format!("{what} does not apply to the state before it{}", r.err().map(|e| format!(" ({e})")).unwrap_or_default())));
        }
        c.execute_batch("COMMIT")?;
        applied()?;
    }
    c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")?;
    Ok(())
}
