//! The schema of a volume in PostgreSQL: its DDL, each version's step up
//! to [`PG_SCHEMA_VERSION`], the fencing trigger, the schema's name.

use super::*;

pub(super) fn schema_ddl(schema: &str) -> String {
    format!(
        "CREATE TABLE info(key TEXT PRIMARY KEY, value BIGINT NOT NULL);
CREATE TABLE inodes(
  ino BIGINT PRIMARY KEY,
  kind BIGINT NOT NULL, perm BIGINT NOT NULL, uid BIGINT NOT NULL, gid BIGINT NOT NULL,
  rdev BIGINT NOT NULL DEFAULT 0, nlink BIGINT NOT NULL,
  size BIGINT NOT NULL DEFAULT 0, data_bytes BIGINT NOT NULL DEFAULT 0,
  atime BIGINT NOT NULL, mtime BIGINT NOT NULL, ctime BIGINT NOT NULL, btime BIGINT NOT NULL,
  parent BIGINT, target BYTEA, jseq BIGINT NOT NULL DEFAULT 0, flags BIGINT NOT NULL DEFAULT 0);
CREATE INDEX inodes_orphans ON inodes(ino) WHERE nlink = 0;
CREATE TABLE dentries(parent BIGINT NOT NULL, name BYTEA NOT NULL, ino BIGINT NOT NULL,
  kind BIGINT NOT NULL, PRIMARY KEY(parent, name));
CREATE TABLE xattrs(ino BIGINT NOT NULL, name BYTEA NOT NULL, value BYTEA NOT NULL, PRIMARY KEY(ino, name));
CREATE SEQUENCE page_seq;
CREATE TABLE pages(id BIGINT PRIMARY KEY DEFAULT nextval('page_seq'), refs BIGINT NOT NULL, data BYTEA NOT NULL);
CREATE TABLE file_pages(ino BIGINT NOT NULL, key BIGINT NOT NULL, page BIGINT NOT NULL, PRIMARY KEY(ino, key));
CREATE SEQUENCE pack_seq;
CREATE TABLE packs(id BIGINT PRIMARY KEY DEFAULT nextval('pack_seq'), name TEXT NOT NULL UNIQUE, size BIGINT NOT NULL,
  blobs BIGINT NOT NULL, dead_bytes BIGINT NOT NULL DEFAULT 0, dead_since BIGINT, created BIGINT NOT NULL,
  dead_acc DOUBLE PRECISION NOT NULL DEFAULT 0, dead_mark BIGINT);
CREATE TABLE chunks(id BIGINT PRIMARY KEY, hash BYTEA NOT NULL UNIQUE, pack BIGINT NOT NULL,
  \"offset\" BIGINT NOT NULL, stored_len BIGINT NOT NULL, raw_len BIGINT NOT NULL, flags BIGINT NOT NULL,
  refs BIGINT NOT NULL);
CREATE INDEX chunks_pack ON chunks(pack);
CREATE TABLE bill(day BIGINT NOT NULL, subsystem TEXT NOT NULL, item TEXT NOT NULL,
  requests BIGINT NOT NULL DEFAULT 0, bytes BIGINT NOT NULL DEFAULT 0, PRIMARY KEY(day, subsystem, item));
CREATE SEQUENCE ino_seq INCREMENT {ID_BLOCK} START 2;
CREATE SEQUENCE chunk_seq INCREMENT {ID_BLOCK} START 1;
{V2_DDL}
{V3_DDL}
{V4_DDL}
{V5_DDL}
{V6_DDL}
{V7_DDL}
{V8_DDL}
{}
INSERT INTO info(key, value) VALUES('schema', {PG_SCHEMA_VERSION});",
        fence_ddl(schema)
    )
}

/// What schema version 2 added (sessions, the change log); run as is on a
/// version 1 schema at open (`IF NOT EXISTS`: idempotent).
pub(super) const V2_DDL: &str = "CREATE SEQUENCE IF NOT EXISTS session_seq;
CREATE TABLE IF NOT EXISTS sessions(id BIGINT PRIMARY KEY DEFAULT nextval('session_seq'), host TEXT NOT NULL,
  pid BIGINT NOT NULL, mount TEXT NOT NULL, version TEXT NOT NULL,
  started TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(), heartbeat TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
  expires TIMESTAMPTZ NOT NULL);
CREATE TABLE IF NOT EXISTS changes(seq BIGSERIAL PRIMARY KEY, kind SMALLINT NOT NULL, ino BIGINT, parent BIGINT,
  name BYTEA, session BIGINT, at TIMESTAMPTZ NOT NULL DEFAULT now());";

/// What schema version 3 added: journal marks, one row per (journal,
/// inode) whose records that journal's writer committed
/// (`docs/shared-volume.md` §11.1); run as is on an older schema at open.
/// The index on `ino` serves `delete_inode`. The inodes' `jseq` column
/// stays, frozen: what builds before marks recorded (single writer), read
/// once by `set_journal(.., legacy)`.
pub(super) const V3_DDL: &str = "CREATE TABLE IF NOT EXISTS journal_marks(journal BIGINT NOT NULL, ino BIGINT NOT NULL, seq BIGINT NOT NULL,
  PRIMARY KEY(journal, ino));
CREATE INDEX IF NOT EXISTS journal_marks_ino ON journal_marks(ino);";

/// What schema version 4 added: the open-file registry, one row per
/// (inode, session) that has the inode open (`docs/shared-volume.md` §7):
/// an inode whose last name went is freed only when no row names it; `gen`
/// tells a close from a newer open of the same file by the same session.
/// And file locks (`flock` and POSIX ranges, §8), one row per held range
/// `lo..=hi`; `owner` is the kernel's lock owner (64 bits stored as
/// BIGINT), `flock` tells the two styles apart, `kind` is 1 read or 2
/// write. Run as is on an older schema at open.
pub(super) const V4_DDL: &str = "CREATE TABLE IF NOT EXISTS open_files(ino BIGINT NOT NULL, session BIGINT NOT NULL, gen BIGINT NOT NULL,
  PRIMARY KEY(ino, session));
CREATE INDEX IF NOT EXISTS open_files_session ON open_files(session);
CREATE TABLE IF NOT EXISTS locks(ino BIGINT NOT NULL, session BIGINT NOT NULL, owner BIGINT NOT NULL,
  flock BOOLEAN NOT NULL, kind SMALLINT NOT NULL, lo BIGINT NOT NULL, hi BIGINT NOT NULL, pid BIGINT NOT NULL);
CREATE INDEX IF NOT EXISTS locks_ino ON locks(ino);
CREATE INDEX IF NOT EXISTS locks_session ON locks(session);";

/// What schema version 5 added: when a chunk's references last reached 0
/// (`zero_since`, the server's clock in seconds; NULL while referenced),
/// so that gc and the cleaner leave it for a grace period
/// (`docs/shared-volume.md` §7). Chunks at zero from before it read NULL
/// and count as dead since long ago. Run as is on an older schema at open.
pub(super) const V5_DDL: &str = "ALTER TABLE chunks ADD COLUMN IF NOT EXISTS zero_since BIGINT;";

/// What schema version 6 added: each inode's content version (`cver`,
/// raised by every `update_content`), which a flush or an edit compares
/// with the version its extent map was loaded at, so that no machine
/// commits over a map another machine replaced (`docs/shared-volume.md`
/// §3). Existing rows start at 0. Run as is on an older schema at open.
///
/// And the uploads a session has under way (`begin_upload`, §7
/// "Uploads"): one row per pack object being uploaded, from before its PUT
/// until the transaction that inserts its `packs` row (which deletes it),
/// so gc on another machine never takes it for an orphan; rows of gone
/// sessions are dropped by gc after a grace period (the server's clock).
pub(super) const V6_DDL: &str = "ALTER TABLE inodes ADD COLUMN IF NOT EXISTS cver BIGINT NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS uploads(name TEXT PRIMARY KEY, session BIGINT NOT NULL, since TIMESTAMPTZ NOT NULL DEFAULT now());
CREATE INDEX IF NOT EXISTS uploads_session ON uploads(session);";

/// What schema version 7 added: when each session's flush round under
/// way began (`flush_since`, the server's clock in seconds; NULL between
/// rounds), so that a collector on any machine leaves alone the chunks
/// that died after the oldest of them (docs/shared-volume.md §7 "Chunk
/// grace"), instead of every chunk that died in the last 15 minutes. Run
/// as is on an older schema at open.
pub(super) const V7_DDL: &str = "ALTER TABLE sessions ADD COLUMN IF NOT EXISTS flush_since BIGINT;";

/// What schema version 8 added (docs/tiers.md §2): where each pack lives
/// (`tier`, 0 = the home; `tier_since`, ns: a pack from before is in the
/// home since it was made), each inode's tier pin (§5), and the restores
/// in flight (§6). Run as is on an older schema at open (the UPDATE only
/// touches rows the ADD COLUMN just made 0).
pub(super) const V8_DDL: &str = "ALTER TABLE packs ADD COLUMN IF NOT EXISTS tier SMALLINT NOT NULL DEFAULT 0;
ALTER TABLE packs ADD COLUMN IF NOT EXISTS tier_since BIGINT NOT NULL DEFAULT 0;
UPDATE packs SET tier_since = created WHERE tier_since = 0;
ALTER TABLE inodes ADD COLUMN IF NOT EXISTS tier_pin SMALLINT NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS restores(pack BIGINT PRIMARY KEY, class SMALLINT NOT NULL, requested_ns BIGINT NOT NULL,
  ready_estimate_ns BIGINT NOT NULL, expires_ns BIGINT);";

/// SQLSTATE of a write fenced off: its session's row is gone.
pub(super) const FENCED: &str = "ZF001";

/// The fence (schema 6): `fence(s)` takes session `s`'s row `FOR KEY
/// SHARE` (a heartbeat's update does not wait for it; the cleanup's
/// delete does, until the transaction ends) and fails with [`FENCED`]
/// when the row is gone. Every write transaction of a store with a
/// session calls it in its COMMIT's round trip (docs/shared-volume.md §7
/// "Fencing"). Names qualified by the schema: it works whatever the
/// connection's search path.
pub(super) fn fence_ddl(schema: &str) -> String {
    format!(
        "CREATE OR REPLACE FUNCTION {schema}.fence(s BIGINT) RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
  PERFORM 1 FROM {schema}.sessions WHERE id = s FOR KEY SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'metadata session % is gone (expired and cleaned up by another machine)', s USING ERRCODE = '{FENCED}';
  END IF;
END $f$;"
    )
}

/// A write of a session another machine removed.
pub(super) fn fenced(session: u64) -> Error {
    Error::new(
        ErrorKind::SessionLost,
        format!("metadata session {session} is gone (its heartbeats stopped past its lifetime and another machine cleaned it up): this mount's writes are refused; remount"),
    )
}

/// The schema of volume `id`: `cairn_<id>`, with `id` of `[a-z0-9_]` only
/// (it is spliced into SQL as an identifier).
pub fn schema_name(id: &str) -> Result<String> {
    if id.is_empty() || id.len() > 57 || !id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') {
        return Err(Error::invalid(format!("volume id {id:?} must be 1 to 57 characters of a-z, 0-9 and _ (it names the PostgreSQL schema)")));
    }
    Ok(format!("cairn_{id}"))
}

impl PgMeta {
    /// The volume's schema as PostgreSQL's catalog reports it (tables,
    /// columns in order with their types and NOT NULL, primary keys), to
    /// compare with the one description of [`crate::schema`].
    pub fn catalog(&self) -> Result<crate::schema::Catalog> {
        let cols = self.stmt("reading the schema's columns", |c| {
            c.query(
                "SELECT table_name::text, column_name::text, data_type::text, is_nullable::text = 'NO' FROM information_schema.columns
                 WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position",
                &[],
            )
        })?;
        let keys = self.stmt("reading the schema's primary keys", |c| {
            c.query(
                "SELECT k.table_name::text, k.column_name::text FROM information_schema.table_constraints t
                 JOIN information_schema.key_column_usage k ON k.constraint_schema = t.constraint_schema AND k.constraint_name = t.constraint_name
                 WHERE t.constraint_type = 'PRIMARY KEY' AND t.table_schema = current_schema() ORDER BY k.table_name, k.ordinal_position",
                &[],
            )
        })?;
        let mut out = crate::schema::Catalog::new();
        for r in cols {
            let t: String = r.get(0);
            out.entry(t).or_default().columns.push((r.get(1), r.get(2), r.get(3)));
        }
        for r in keys {
            let t: String = r.get(0);
            out.entry(t).or_default().key.push(r.get(1));
        }
        Ok(out)
    }
}
