//! The SQLite schema: the tables a new database gets, the bill's table
//! (added at a cloud volume's read-write open) and the step from schema 1.

use super::*;

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS info(key TEXT PRIMARY KEY, value) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS inodes(
  ino INTEGER PRIMARY KEY,
  kind INTEGER NOT NULL, perm INTEGER NOT NULL, uid INTEGER NOT NULL, gid INTEGER NOT NULL,
  rdev INTEGER NOT NULL DEFAULT 0, nlink INTEGER NOT NULL,
  size INTEGER NOT NULL DEFAULT 0, data_bytes INTEGER NOT NULL DEFAULT 0,
  atime INTEGER NOT NULL, mtime INTEGER NOT NULL, ctime INTEGER NOT NULL, btime INTEGER NOT NULL,
  parent INTEGER, target BLOB, jseq INTEGER NOT NULL DEFAULT 0, flags INTEGER NOT NULL DEFAULT 0,
  tier_pin INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS dentries(parent INTEGER NOT NULL, name BLOB NOT NULL, ino INTEGER NOT NULL,
  kind INTEGER NOT NULL, PRIMARY KEY(parent, name)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS xattrs(ino INTEGER NOT NULL, name BLOB NOT NULL, value BLOB NOT NULL,
  PRIMARY KEY(ino, name)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS pages(id INTEGER PRIMARY KEY, refs INTEGER NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS file_pages(ino INTEGER NOT NULL, key INTEGER NOT NULL, page INTEGER NOT NULL,
  PRIMARY KEY(ino, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS packs(id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, size INTEGER NOT NULL,
  blobs INTEGER NOT NULL, dead_bytes INTEGER NOT NULL DEFAULT 0, dead_since INTEGER, created INTEGER NOT NULL,
  dead_acc REAL NOT NULL DEFAULT 0, dead_mark INTEGER, tier INTEGER NOT NULL DEFAULT 0, tier_since INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS chunks(id INTEGER PRIMARY KEY, hash BLOB NOT NULL UNIQUE, pack INTEGER NOT NULL,
  offset INTEGER NOT NULL, stored_len INTEGER NOT NULL, raw_len INTEGER NOT NULL, flags INTEGER NOT NULL,
  refs INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS chunks_pack ON chunks(pack);
CREATE TABLE IF NOT EXISTS restores(pack INTEGER PRIMARY KEY, class INTEGER NOT NULL, requested_ns INTEGER NOT NULL,
  ready_estimate_ns INTEGER NOT NULL, expires_ns INTEGER);
";

/// The bill of a cloud volume (docs/format.md "Metadata"): requests and
/// payload bytes by unix day, subsystem and request kind, and stored
/// byte-seconds (subsystem `storage`, items `live` and `dead`). Created at a
/// read-write open of a cloud volume; a primary key, as every table, so
/// its rows ship in session patchsets.
pub(super) const BILL_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS bill(day INTEGER NOT NULL, subsystem TEXT NOT NULL, item TEXT NOT NULL,
  requests INTEGER NOT NULL DEFAULT 0, bytes INTEGER NOT NULL DEFAULT 0, PRIMARY KEY(day, subsystem, item)) WITHOUT ROWID";

/// Schema v1 -> v2: extent pages become shared, reference-counted rows
/// linked from files (clones and snapshots share them).
pub(super) fn migrate_v1(c: &Connection) -> Result<()> {
    c.execute_batch(
        "BEGIN IMMEDIATE;
         CREATE TABLE pages(id INTEGER PRIMARY KEY, refs INTEGER NOT NULL, data BLOB NOT NULL);
         CREATE TABLE file_pages(ino INTEGER NOT NULL, key INTEGER NOT NULL, page INTEGER NOT NULL, PRIMARY KEY(ino, key)) WITHOUT ROWID;
         INSERT INTO pages(id, refs, data) SELECT ROW_NUMBER() OVER (ORDER BY ino, key), 1, data FROM extent_pages;
         INSERT INTO file_pages(ino, key, page) SELECT ino, key, ROW_NUMBER() OVER (ORDER BY ino, key) FROM extent_pages;
         DROP TABLE extent_pages;
         ALTER TABLE inodes ADD COLUMN flags INTEGER NOT NULL DEFAULT 0;
         UPDATE info SET value=2 WHERE key='schema';
         COMMIT;",
    )
    .map_err(|e| Error::config(format!("upgrading the metadata from schema 1 to 2: {e}")))?;
    tracing::info!("metadata upgraded from schema 1 to 2 (shared extent pages)");
    migrate_v2(c)
}

/// What schema 3 adds (docs/tiers.md §2): where each pack lives
/// (`packs.tier`, 0 = the home, and `tier_since`, ns: a pack from before
/// is in the home since it was made), each inode's tier pin, and the
/// restores in flight.
pub(super) const V3_DDL: &str = "ALTER TABLE packs ADD COLUMN tier INTEGER NOT NULL DEFAULT 0;
ALTER TABLE packs ADD COLUMN tier_since INTEGER NOT NULL DEFAULT 0;
UPDATE packs SET tier_since = created;
ALTER TABLE inodes ADD COLUMN tier_pin INTEGER NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS restores(pack INTEGER PRIMARY KEY, class INTEGER NOT NULL, requested_ns INTEGER NOT NULL,
  ready_estimate_ns INTEGER NOT NULL, expires_ns INTEGER);";

/// Schema v2 -> v3: [`V3_DDL`], in one transaction. The dead-byte accrual
/// columns (added lazily to schema 2, `ensure_dead_accrual`) come first,
/// so that the columns are in the order of a new database.
pub(super) fn migrate_v2(c: &Connection) -> Result<()> {
    let step = || -> Result<()> {
        c.execute_batch("BEGIN IMMEDIATE;")?;
        let r = (|| -> Result<()> {
            ensure_dead_accrual(c)?;
            c.execute_batch(V3_DDL)?;
            c.execute_batch("UPDATE info SET value=3 WHERE key='schema';")?;
            Ok(())
        })();
        match r {
            Ok(()) => Ok(c.execute_batch("COMMIT;")?),
            Err(e) => {
                let _ = c.execute_batch("ROLLBACK;");
                Err(e)
            }
        }
    };
    step().map_err(|e| Error::config(format!("upgrading the metadata from schema 2 to 3: {e}")))?;
    tracing::info!("metadata upgraded from schema 2 to 3 (pack tiers, tier pins, restores)");
    Ok(())
}

impl SqliteMeta {
    /// The database's schema as SQLite's catalog reports it (tables,
    /// columns in order with their declared types and NOT NULL, primary
    /// keys; a key's columns count as NOT NULL), to compare with the one
    /// description of [`crate::schema`].
    pub fn catalog(&self) -> Result<crate::schema::Catalog> {
        let g = self.shared.conn.lock();
        let c = &g.c;
        let tables: Vec<String> =
            c.prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")?.query_map([], |r| r.get(0))?.collect::<rusqlite::Result<_>>()?;
        let mut out = crate::schema::Catalog::new();
        for t in tables {
            // cid, name, type, notnull, dflt_value, pk (position in the key, 0: none)
            let mut q = c.prepare(&format!("PRAGMA table_info(\"{t}\")"))?;
            let cols: Vec<(String, String, bool, i64)> = q.query_map([], |r| Ok((r.get(1)?, r.get(2)?, r.get::<_, i64>(3)? != 0, r.get(5)?)))?.collect::<rusqlite::Result<_>>()?;
            let mut key: Vec<(i64, String)> = cols.iter().filter(|c| c.3 > 0).map(|c| (c.3, c.0.clone())).collect();
            key.sort();
            let table = crate::schema::CatalogTable { columns: cols.into_iter().map(|(n, ty, nn, pk)| (n, ty, nn || pk > 0)).collect(), key: key.into_iter().map(|k| k.1).collect() };
            out.insert(t, table);
        }
        Ok(out)
    }
}
