//! The PostgreSQL store (issue 26, `docs/shared-volume.md`): one schema
//! `cairn_<volume id>` per volume in a database many machines share.
//!
//! Every `write` is one SERIALIZABLE transaction, so a closure's
//! lookup-then-insert is safe against other machines without explicit row
//! locks; a `write_locking` (namespace operations) is one READ COMMITTED
//! transaction that locks the rows it changes first. Reference-count
//! changes are applied when the closure returns, after locking the chunk
//! rows in ascending id order. Serialization
//! failures (40001), deadlocks (40P01) and lost connections are retried
//! inside the store (the closure runs again) with exponential backoff and
//! full jitter until a deadline ([`PgOptions::timeout`]); past it the
//! caller gets an I/O error naming the last PostgreSQL error. Reads run in
//! one READ ONLY REPEATABLE READ transaction (one snapshot). A commit is
//! durable in PostgreSQL, so `sync` has nothing to do.
//!
//! Inode and chunk numbers come from sequences that hand out blocks of
//! [`ID_BLOCK`] numbers (one `nextval` reserves a block for this store), so
//! they never repeat, whatever rolls back or crashes, on any machine.
//!
//! Passwords never come in the URL (it would sit in `ps` and in shell
//! history): `PGPASSWORD`, else `PGPASSFILE` or `~/.pgpass`, as libpq.

use crate::error::{Error, ErrorKind, Result};
use crate::types::{Attr, FileKind, Ino, Timestamp};
use crate::*;
use ::postgres as pg;
use parking_lot::Mutex;
use pg::fallible_iterator::FallibleIterator;
use pg::types::ToSql;
use pg::{Client, NoTls, Row, Statement};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Schema version of a volume's PostgreSQL schema (`info.schema`).
pub const PG_SCHEMA_VERSION: i64 = 7;

/// Numbers one `nextval` of `ino_seq` or `chunk_seq` reserves.
pub const ID_BLOCK: u64 = 1024;

/// Connection attempts and statements give up after this long by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Connections one store keeps open at most (idle and in use); an
/// operation that finds them all busy waits for one (within its deadline).
pub const MAX_CONNECTIONS: usize = 32;

/// An idle connection unused this long is closed.
pub const IDLE_CLOSE: Duration = Duration::from_secs(60);

/// Tunables of a [`PgMeta`].
#[derive(Clone, Debug)]
pub struct PgOptions {
    /// How long one operation (its retries included) may take before it
    /// fails with an I/O error.
    pub timeout: Duration,
    /// Every write waits for PostgreSQL's WAL flush before it returns.
    /// Off (the default), a write commits with `synchronous_commit = off`:
    /// seen by every machine at once, durable at the next
    /// [`MetaStore::sync`] (which the engine calls before anything
    /// depends on it: an fsync, a deleted object, a retired journal
    /// segment) or within PostgreSQL's WAL writer delay (3 x 200 ms at
    /// most by default). docs/metadata-store.md "Durability".
    pub sync_commit: bool,
    /// Each write that changes something sends a change notice
    /// (`pg_notify`) with its COMMIT (the default). Off, other machines
    /// learn of changes only from their poll of the change log: for
    /// measuring what the notices cost (docs/shared-volume.md §9).
    pub notify: bool,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions { timeout: DEFAULT_TIMEOUT, sync_commit: false, notify: true }
    }
}

fn schema_ddl(schema: &str) -> String {
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
{}
INSERT INTO info(key, value) VALUES('schema', {PG_SCHEMA_VERSION});",
        fence_ddl(schema)
    )
}

/// What schema version 2 added (sessions, the change log); run as is on a
/// version 1 schema at open (`IF NOT EXISTS`: idempotent).
const V2_DDL: &str = "CREATE SEQUENCE IF NOT EXISTS session_seq;
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
const V3_DDL: &str = "CREATE TABLE IF NOT EXISTS journal_marks(journal BIGINT NOT NULL, ino BIGINT NOT NULL, seq BIGINT NOT NULL,
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
const V4_DDL: &str = "CREATE TABLE IF NOT EXISTS open_files(ino BIGINT NOT NULL, session BIGINT NOT NULL, gen BIGINT NOT NULL,
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
const V5_DDL: &str = "ALTER TABLE chunks ADD COLUMN IF NOT EXISTS zero_since BIGINT;";

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
const V6_DDL: &str = "ALTER TABLE inodes ADD COLUMN IF NOT EXISTS cver BIGINT NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS uploads(name TEXT PRIMARY KEY, session BIGINT NOT NULL, since TIMESTAMPTZ NOT NULL DEFAULT now());
CREATE INDEX IF NOT EXISTS uploads_session ON uploads(session);";

/// What schema version 7 added: when each session's flush round under
/// way began (`flush_since`, the server's clock in seconds; NULL between
/// rounds), so that a collector on any machine leaves alone the chunks
/// that died after the oldest of them (docs/shared-volume.md §7 "Chunk
/// grace"), instead of every chunk that died in the last 15 minutes. Run
/// as is on an older schema at open.
const V7_DDL: &str = "ALTER TABLE sessions ADD COLUMN IF NOT EXISTS flush_since BIGINT;";

/// SQLSTATE of a write fenced off: its session's row is gone.
const FENCED: &str = "ZF001";

/// The fence (schema 6): `fence(s)` takes session `s`'s row `FOR KEY
/// SHARE` (a heartbeat's update does not wait for it; the cleanup's
/// delete does, until the transaction ends) and fails with [`FENCED`]
/// when the row is gone. Every write transaction of a store with a
/// session calls it in its COMMIT's round trip (docs/shared-volume.md §7
/// "Fencing"). Names qualified by the schema: it works whatever the
/// connection's search path.
fn fence_ddl(schema: &str) -> String {
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
fn fenced(session: u64) -> Error {
    Error::new(
        ErrorKind::SessionLost,
        format!("metadata session {session} is gone (its heartbeats stopped past its lifetime and another machine cleaned it up): this mount's writes are refused; remount"),
    )
}

/// The server's clock in whole seconds, as `clock_secs` reads it; inside a
/// statement, the time its transaction started. A macro so that the
/// statements using it are constants (no `format!` per chunk on the flush
/// path).
macro_rules! db_secs {
    () => {
        "floor(extract(epoch FROM now()))::bigint"
    };
}

/// Reference-count changes, dating a count that reaches 0.
const APPLY_REFS_SQL: &str = concat!(
    "UPDATE chunks c SET refs = c.refs + d.d, zero_since = CASE WHEN c.refs + d.d = 0 THEN ",
    // The statement's time, not the transaction's start: as close to the
    // commit as the store can date it (the collector compares it with
    // the start of flush rounds under way, `oldest_flush`).
    "floor(extract(epoch FROM clock_timestamp()))::bigint",
    " END FROM unnest($1::bigint[], $2::bigint[]) AS d(id, d) WHERE c.id = d.id"
);

/// A new chunk row, its hash claimed atomically; dated if it starts at 0.
const INSERT_CHUNK_SQL: &str = concat!(
    "INSERT INTO chunks(id, hash, pack, \"offset\", stored_len, raw_len, flags, refs, zero_since) ",
    "VALUES($1, $2, $3, $4, $5, $6, $7, $8, CASE WHEN $8::bigint = 0 THEN ",
    db_secs!(),
    " END) ON CONFLICT (hash) DO NOTHING"
);

/// Deletes a session with its open-file rows and its locks in one
/// statement (a data-modifying `WITH` runs whether or not it is
/// referenced); counts the session rows.
const SESSION_DELETE: &str =
    "WITH o AS (DELETE FROM open_files WHERE session = $1), l AS (DELETE FROM locks WHERE session = $1) DELETE FROM sessions WHERE id = $1";

/// `info` key: the highest change seq a trim removed.
const TRIMMED_KEY: &str = "changes_trimmed";

/// Change rows one statement of `trim_changes` removes at most.
const TRIM_BATCH: i64 = 20_000;

/// `changes.kind` of an inode change and of an entry change.
const CHANGE_INODE: i16 = 0;
const CHANGE_ENTRY: i16 = 1;

/// The bytes of lowercase or uppercase hex (None if it is not).
fn unhex(h: &str) -> Option<Vec<u8>> {
    if h.len() % 2 != 0 {
        return None;
    }
    (0..h.len()).step_by(2).map(|k| h.get(k..k + 2).and_then(|x| u8::from_str_radix(x, 16).ok())).collect()
}

/// Bytes as lowercase hex, for `decode('…', 'hex')` in SQL sent as text
/// (nothing to quote).
fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(2 * b.len());
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

/// The schema of volume `id`: `cairn_<id>`, with `id` of `[a-z0-9_]` only
/// (it is spliced into SQL as an identifier).
pub fn schema_name(id: &str) -> Result<String> {
    if id.is_empty() || id.len() > 57 || !id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') {
        return Err(Error::invalid(format!("volume id {id:?} must be 1 to 57 characters of a-z, 0-9 and _ (it names the PostgreSQL schema)")));
    }
    Ok(format!("cairn_{id}"))
}

/// How many of a store's connections are open, at most
/// [`MAX_CONNECTIONS`]; `free` wakes a waiter when one closes.
#[derive(Default)]
struct Slots {
    open: Mutex<usize>,
    free: parking_lot::Condvar,
}

/// One counted open connection: closing it (dropping the `Conn`) frees
/// its slot.
struct Slot(Arc<Slots>);

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.0.open.lock();
        *open -= 1;
        self.0.free.notify_one();
    }
}

/// One connection with its prepared statements.
struct Conn {
    client: Client,
    _slot: Slot,
    stmts: HashMap<String, Statement>,
    /// The server history it was opened on (read when it connected; a
    /// connection that still answers has seen no crash since).
    ident: Ident,
    /// When it was last put back in the pool.
    idle_since: Instant,
}

/// Which server history a connection talks to: the cluster's system
/// identifier, its current timeline, and when its statistics were last
/// reset (`pg_stat_wal.stats_reset`, which crash recovery resets: a
/// crashed-and-restarted server, or one whose backends crashed and were
/// reinitialized, answers with a new one; a clean restart keeps it, and
/// its shutdown checkpoint flushed every commit). Two commits under the
/// same identity were made on one unbroken history, so a WAL flush of
/// the later covers the earlier (docs/shared-volume.md, "Durability
/// across a database crash").
#[derive(Clone, Debug, PartialEq, Eq)]
struct Ident {
    system: String,
    timeline: String,
    stats_reset: String,
}

impl std::fmt::Display for Ident {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "system {} timeline {} crash-recovered at {}", self.system, self.timeline, if self.stats_reset.is_empty() { "never" } else { &self.stats_reset })
    }
}

impl Conn {
    /// `sql` prepared on this connection once, then reused: a statement
    /// sent as text is parsed in a round trip of its own every time.
    fn prepared(&mut self, sql: &str) -> std::result::Result<Statement, pg::Error> {
        if let Some(s) = self.stmts.get(sql) {
            return Ok(s.clone());
        }
        let s = self.client.prepare(sql)?;
        self.stmts.insert(sql.to_string(), s.clone());
        Ok(s)
    }
}

/// A connection whose statements are prepared once (`PgMeta::stmt`).
struct Cached<'a>(&'a mut Conn);

impl Cached<'_> {
    fn query(&mut self, sql: &str, p: &[P]) -> std::result::Result<Vec<Row>, pg::Error> {
        let st = self.0.prepared(sql)?;
        self.0.client.query(&st, p)
    }
    fn query_one(&mut self, sql: &str, p: &[P]) -> std::result::Result<Row, pg::Error> {
        let st = self.0.prepared(sql)?;
        self.0.client.query_one(&st, p)
    }
    fn execute(&mut self, sql: &str, p: &[P]) -> std::result::Result<u64, pg::Error> {
        let st = self.0.prepared(sql)?;
        self.0.client.execute(&st, p)
    }
}

/// A block of numbers from a sequence: `next..end` are free.
#[derive(Default)]
struct Block {
    next: u64,
    end: u64,
    /// `PgMeta::history` when it was reserved: a block of another server
    /// history is dropped (that server's sequence may not have kept it).
    history: u64,
}

impl Block {
    fn take(&mut self, floor: u64) -> Option<u64> {
        while self.next < self.end {
            let v = self.next;
            self.next += 1;
            if v > floor {
                return Some(v);
            }
        }
        None
    }
}

/// The PostgreSQL metadata store.
pub struct PgMeta {
    cfg: pg::Config,
    schema: String,
    codec: Arc<dyn PageCodec>,
    opts: PgOptions,
    /// Idle connections (a connection that failed is dropped, not kept).
    pool: Mutex<Vec<Conn>>,
    /// Open connections of the pool, idle and in use (`Slot`).
    slots: Arc<Slots>,
    inos: Mutex<Block>,
    chunk_ids: Mutex<Block>,
    /// Numbers at or below these were in use when the store opened (rows
    /// written with numbers of their own, the root): never handed out.
    ino_floor: u64,
    chunk_floor: u64,
    abandoned: AtomicBool,
    /// Since when the server has been unreachable, as far as this store
    /// knows: set by the first try that found it so, cleared by the first
    /// new connection (or answer) after. Operations fail once it is
    /// `timeout` ago, so one system call that makes several of them waits
    /// for about one deadline, not one per operation (see [`PgMeta::run`]).
    outage: Mutex<Option<Outage>>,
    /// Whether `outage` is set (read without the lock on every operation).
    in_outage: AtomicBool,
    /// Tries that failed and were run again.
    retries: std::sync::atomic::AtomicU64,
    /// Test hook: see [`PgMeta::lose_next_commit_reply`].
    lose_commit_reply: AtomicBool,
    /// Test hook: see [`PgMeta::hold_next_commit`].
    before_commit: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// Writes committed (or committing) without waiting for the WAL
    /// flush since the last `sync` proved them, by the server history
    /// (`Ident`) they were made on (usually one). `sync` proves them by a
    /// WAL flush on a connection of the same history.
    lazy: Mutex<Vec<Lazy>>,
    /// Held through a `sync`: one proves at a time, so a sync that finds
    /// no commit left to prove knows that the ones before it were proven
    /// (another sync had taken them), not merely taken by a barrier still
    /// under way. Syncs that queue behind one find their commits proven
    /// by it and return at once (a group commit of barriers).
    syncing: Mutex<()>,
    /// Set once lazy commits could not be proven durable (the server
    /// crashed or failed over before they were flushed): every later
    /// `sync` fails with this, so the engine keeps its journal for the
    /// replay at the next mount.
    lost: Mutex<Option<String>>,
    /// The server history the store last connected to.
    ident: Mutex<Option<Ident>>,
    /// How many times that history changed under this store (change
    /// cursors made before are reset: `ChangeCursor::history`).
    history: AtomicU64,
    /// The highest block of `ino_seq` and of `chunk_seq` this store
    /// reserved (0: none): after a history change the sequences are set
    /// past them, so numbers this store handed out are not handed out
    /// again by a server that lost the reservation.
    ino_high: AtomicU64,
    chunk_high: AtomicU64,
    /// The session change rows carry (0: none open); shared with this
    /// store's change feeds, which skip its own notices.
    session: Arc<AtomicU64>,
    /// The journal whose marks `jseq` means (`set_journal`; 0: none).
    journal: AtomicU64,
    /// Advisory lock keys: the maintenance lock, and the lock that orders
    /// change-log appends.
    maintenance_key: i64,
    /// The key of the volume's rename lock (a transaction-level advisory
    /// lock: renames between directories, one at a time).
    rename_key: i64,
}

/// Lazy commits made on one server history (`PgMeta::lazy`).
struct Lazy {
    ident: Ident,
    /// Sent COMMIT, no answer yet.
    inflight: u64,
    /// Committed, not yet proven durable.
    done: u64,
}

/// The server unreachable (`PgMeta::outage`).
struct Outage {
    since: Instant,
    /// Whether an operation gave up in it yet (logged as an error once).
    reported: bool,
}

/// What one try of an operation came to.
enum Step<T> {
    Done(Result<T>),
    /// A retryable failure (or one to classify); `Done` with its error if not.
    Failed(pg::Error),
}

/// How a PostgreSQL error is handled.
#[derive(PartialEq, Eq, Debug)]
enum Class {
    /// Serialization failure, deadlock: roll back and run again.
    Retry,
    /// The connection is gone or unusable: drop it, connect again, run again.
    Reconnect,
    /// Anything else: the operation fails.
    Fatal,
}

/// By SQLSTATE, and for the driver's own errors (no SQLSTATE) by kind:
/// a closed connection, or an I/O error underneath (the driver's connect
/// and communication failures all carry one). Never by message text.
fn classify(e: &pg::Error) -> Class {
    if let Some(code) = e.code() {
        return classify_sqlstate(code.code());
    }
    if e.is_closed() || std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>()) {
        return Class::Reconnect;
    }
    Class::Fatal
}

/// 40001 serialization failure, 40P01 deadlock, 55P03 lock not available
/// (`lock_timeout`), 57014 statement cancelled (`statement_timeout`): run
/// again while the deadline allows. Class 08 (connection), 57P01-03
/// (administrator or crash shutdown, cannot connect now), 53300 (too many
/// connections), 25006 (read-only transaction: a standby, as after a
/// failover to this address): connect again.
fn classify_sqlstate(c: &str) -> Class {
    match c {
        "40001" | "40P01" | "55P03" | "57014" => Class::Retry,
        "57P01" | "57P02" | "57P03" | "53300" | "25006" => Class::Reconnect,
        _ if c.starts_with("08") => Class::Reconnect,
        _ => Class::Fatal,
    }
}

/// Why no connection could be had.
enum ConnError {
    Pg(pg::Error),
    /// All [`MAX_CONNECTIONS`] stayed busy until the deadline.
    Busy,
}

impl From<pg::Error> for ConnError {
    fn from(e: pg::Error) -> Self {
        ConnError::Pg(e)
    }
}

/// A PostgreSQL error as people read it: the server's message and SQLSTATE.
fn describe(e: &pg::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{}: {} (SQLSTATE {})", d.severity(), d.message(), d.code().code()),
        None => match std::error::Error::source(e) {
            Some(s) => format!("{e}: {s}"),
            None => e.to_string(),
        },
    }
}

/// A chunk a transaction references is gone: on a shared volume, only
/// another machine's collector deletes chunk rows (at zero references),
/// so the writer lost the race with it and stores the chunk again.
fn gone_chunk(id: i64) -> Error {
    Error::new(ErrorKind::Raced, format!("chunk #{id} was collected by another machine before this transaction referenced it"))
}

fn pg_err(what: &str, e: &pg::Error) -> Error {
    Error::io(format!("PostgreSQL metadata store: {what}: {}", describe(e)))
}

impl PgMeta {
    /// Creates the schema of volume `id` (`cairn_<id>`) with its tables,
    /// sequences and the root directory, in one transaction. Fails if the
    /// schema exists.
    pub fn create(url: &str, id: &str, root: Caller0) -> Result<()> {
        let schema = schema_name(id)?;
        let cfg = config(url)?;
        let mut c = connect(&cfg, DEFAULT_TIMEOUT).map_err(|e| pg_err("connecting", &e))?;
        let now = Timestamp::now().0;
        let sql = format!(
            "BEGIN; CREATE SCHEMA {schema}; SET LOCAL search_path TO {schema}; {}
             INSERT INTO inodes(ino, kind, perm, uid, gid, nlink, atime, mtime, ctime, btime, parent)
             VALUES(1, {}, {}, {}, {}, 2, {now}, {now}, {now}, {now}, 1); COMMIT;",
            schema_ddl(&schema),
            FileKind::Dir.code(),
            root.perm,
            root.uid,
            root.gid
        );
        match c.batch_execute(&sql) {
            Ok(()) => Ok(()),
            Err(e) if e.code().is_some_and(|c| c.code() == "42P06") => Err(Error::new(
                ErrorKind::Exists,
                format!("PostgreSQL schema {schema} already exists in database {}: a volume with id {id} is there already", db_name(&cfg)),
            )),
            Err(e) => Err(pg_err(&format!("creating schema {schema}"), &e)),
        }
    }

    /// Opens the schema of volume `id`, refusing a missing schema or an
    /// unknown schema version.
    pub fn open(url: &str, id: &str, codec: Arc<dyn PageCodec>) -> Result<PgMeta> {
        Self::open_with(url, id, codec, PgOptions::default())
    }

    /// [`PgMeta::open`] with options.
    pub fn open_with(url: &str, id: &str, codec: Arc<dyn PageCodec>, opts: PgOptions) -> Result<PgMeta> {
        let schema = schema_name(id)?;
        let mut cfg = config(url)?;
        tune(&mut cfg, opts.timeout);
        let mut c = connect(&cfg, opts.timeout).map_err(|e| pg_err("connecting", &e))?;
        let db = db_name(&cfg);
        let exists = c
            .query_opt("SELECT 1 FROM pg_namespace WHERE nspname = $1", &[&schema])
            .map_err(|e| pg_err("looking up the volume's schema", &e))?
            .is_some();
        if !exists {
            return Err(Error::config(format!("PostgreSQL database {db} has no schema {schema}: no volume with id {id} was created there (wrong --meta database?)")));
        }
        c.batch_execute(&format!("SET search_path TO {schema}; {SESSION_SETTINGS}")).map_err(|e| pg_err("setting the search path", &e))?;
        let v = c
            .query_opt("SELECT value FROM info WHERE key = 'schema'", &[])
            .map_err(|e| Error::config(format!("PostgreSQL schema {schema} in database {db} is not a Cairn metadata schema: {}", describe(&e))))?;
        match v.map(|r| r.get::<_, i64>(0)) {
            Some(PG_SCHEMA_VERSION) => {}
            // Adds sessions and the change log (from 1), journal marks
            // (from 1 or 2), the open-file registry and locks (from 1 to
            // 3), the chunks' zero dates (from 1 to 4), the content
            // versions (from 1 to 5), the flushes under way (from 1 to
            // 6); the table lock makes a second
            // machine upgrading at once wait, then find them.
            Some(1..=6) => c
                .batch_execute(&format!(
                    "BEGIN; LOCK TABLE info IN SHARE ROW EXCLUSIVE MODE; {V2_DDL}
                     {V3_DDL}
                     {V4_DDL}
                     {V5_DDL}
                     {V6_DDL}
                     {V7_DDL}
                     {}
                     UPDATE info SET value = {PG_SCHEMA_VERSION} WHERE key = 'schema' AND value < {PG_SCHEMA_VERSION}; COMMIT;",
                    fence_ddl(&schema)
                ))
                .map_err(|e| pg_err(&format!("upgrading schema {schema} to version {PG_SCHEMA_VERSION}"), &e))?,
            Some(v) => {
                return Err(Error::config(format!("PostgreSQL schema {schema} has metadata schema version {v}; this build reads {PG_SCHEMA_VERSION}")))
            }
            None => return Err(Error::config(format!("PostgreSQL schema {schema} in database {db} has no metadata schema version"))),
        }
        let r = c
            .query_one("SELECT COALESCE((SELECT MAX(ino) FROM inodes), 1), COALESCE((SELECT MAX(id) FROM chunks), 0)", &[])
            .map_err(|e| pg_err("reading the highest numbers in use", &e))?;
        let (ino_floor, chunk_floor) = (r.get::<_, i64>(0) as u64, r.get::<_, i64>(1) as u64);
        // Advisory lock keys of this volume (advisory locks are per
        // database, so they name the schema): 64 bits of an MD5.
        let r = c
            .query_one(
                "SELECT ('x' || substr(md5($1 || ':maintenance'), 1, 16))::bit(64)::bigint",
                &[&schema],
            )
            .map_err(|e| pg_err("computing the volume's lock keys", &e))?;
        let maintenance_key = r.get::<_, i64>(0);
        let rename_key = c
            .query_one("SELECT ('x' || substr(md5($1 || ':rename'), 1, 16))::bit(64)::bigint", &[&schema])
            .map_err(|e| pg_err("computing the volume's lock keys", &e))?
            .get::<_, i64>(0);
        let ident = setup(&mut c, &schema, opts.timeout).map_err(|e| pg_err("setting up the connection", &e))?;
        let slots = Arc::new(Slots { open: Mutex::new(1), free: Default::default() });
        let first = Conn { client: c, _slot: Slot(slots.clone()), stmts: HashMap::new(), ident: ident.clone(), idle_since: Instant::now() };
        Ok(PgMeta {
            cfg,
            schema,
            codec,
            opts,
            pool: Mutex::new(vec![first]),
            slots,
            inos: Mutex::new(Block::default()),
            chunk_ids: Mutex::new(Block::default()),
            ino_floor,
            chunk_floor,
            abandoned: AtomicBool::new(false),
            outage: Mutex::new(None),
            in_outage: AtomicBool::new(false),
            retries: Default::default(),
            lose_commit_reply: AtomicBool::new(false),
            before_commit: Mutex::new(None),
            lazy: Mutex::new(Vec::new()),
            syncing: Mutex::new(()),
            lost: Mutex::new(None),
            ident: Mutex::new(Some(ident)),
            history: AtomicU64::new(0),
            ino_high: AtomicU64::new(0),
            chunk_high: AtomicU64::new(0),
            session: Arc::new(AtomicU64::new(0)),
            journal: AtomicU64::new(0),
            maintenance_key,
            rename_key,
        })
    }

    /// How many tries of operations failed and were run again (serialization
    /// failures, deadlocks, lost connections).
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// The schema this store works in.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    fn check_alive(&self) -> Result<()> {
        if self.abandoned.load(Ordering::SeqCst) {
            return Err(Error::io("the PostgreSQL metadata store was abandoned (simulated crash)"));
        }
        Ok(())
    }

    /// Once lazy commits were found lost (`sync`), every later change is
    /// refused too: the mount's view has parted from the database's, and
    /// only a new mount (replaying its journal) joins them again.
    fn check_not_lost(&self) -> Result<()> {
        match &*self.lost.lock() {
            Some(m) => Err(Error::io(m.clone())),
            None => Ok(()),
        }
    }

    /// An idle connection, or a new one (`setup`), once fewer than
    /// [`MAX_CONNECTIONS`] are open: else it waits for one until the
    /// deadline (`Busy`). Idle connections unused for [`IDLE_CLOSE`] are
    /// closed first.
    fn take_conn(&self, deadline: Instant) -> std::result::Result<Conn, ConnError> {
        // Closed outside the count's lock (closing one takes it).
        let stale: Vec<Conn> = {
            let mut pool = self.pool.lock();
            let (old, keep): (Vec<Conn>, Vec<Conn>) = pool.drain(..).partition(|c| c.idle_since.elapsed() >= IDLE_CLOSE);
            *pool = keep;
            old
        };
        drop(stale);
        {
            // The pool is looked at with the count locked, and a connection
            // put back or closed takes that lock to wake a waiter: no
            // wake-up is missed between the look and the wait.
            let mut open = self.slots.open.lock();
            loop {
                if let Some(c) = self.pool.lock().pop() {
                    return Ok(c);
                }
                if *open < MAX_CONNECTIONS {
                    *open += 1;
                    break;
                }
                if self.slots.free.wait_until(&mut open, deadline).timed_out() {
                    return Err(ConnError::Busy);
                }
            }
        }
        // Counted from here: dropped on any failure below.
        let slot = Slot(self.slots.clone());
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
        let mut client = connect(&self.cfg, left)?;
        let ident = setup(&mut client, &self.schema, self.opts.timeout)?;
        self.reachable();
        if self.saw(&ident) {
            // Before anything else on the new history.
            let (i, c) = (self.ino_high.load(Ordering::SeqCst) as i64, self.chunk_high.load(Ordering::SeqCst) as i64);
            client.batch_execute(&format!(
                "SELECT setval('ino_seq', GREATEST(last_value, {i})) FROM ino_seq; SELECT setval('chunk_seq', GREATEST(last_value, {c})) FROM chunk_seq"
            ))?;
        }
        Ok(Conn { client, _slot: slot, stmts: HashMap::new(), ident, idle_since: Instant::now() })
    }

    /// A new connection reached server history `ident`: if it is not the
    /// one the store saw before, the server crashed (and recovered) or
    /// another one took its place (a failover), and what this store knew
    /// of the old history is suspect: its id blocks are dropped (the new
    /// server's sequences may hand them out again), its change cursors
    /// are reset (`history`: the followers invalidate everything), and
    /// lazy commits made on the old history cannot be proven: the store is
    /// lost at once (`is_lost`) until `resume_after_loss`.
    /// Returns whether it changed.
    fn saw(&self, ident: &Ident) -> bool {
        let mut seen = self.ident.lock();
        let changed = match &*seen {
            Some(old) if old == ident => return false,
            Some(old) => {
                // Lazy commits of another history can no longer be proven:
                // the store is lost from here (before the change cursors
                // move, so no follower takes the new server's older rows
                // for another machine's newer ones and re-bases on them;
                // the engine replays its journal instead, resume.rs).
                let unproven: u64 = self.lazy.lock().iter().filter(|x| x.ident != *ident).map(|x| x.done + x.inflight).sum();
                if unproven > 0 {
                    let msg = format!(
                        "PostgreSQL metadata store: {unproven} metadata commits made without waiting for the WAL flush (on {old}) cannot be proven durable: \
                         the server's history changed before they were flushed (a crash or a failover; now {ident}), so they may be lost. \
                         This mount keeps its write-back journal, refuses changes and syncs until it has replayed it on the new history (as a new mount would), then resumes"
                    );
                    tracing::error!("{msg}");
                    self.lost.lock().get_or_insert(msg);
                }
                self.history.fetch_add(1, Ordering::SeqCst);
                tracing::warn!("PostgreSQL metadata store: the server's history changed (was {old}, now {ident}): a crash or a failover; id blocks dropped, sequences set past them, change cursors reset");
                true
            }
            None => false,
        };
        *seen = Some(ident.clone());
        changed
    }

    /// A try found the server unreachable at `at`: the outage starts then
    /// unless it had already. Returns since when it has been unreachable.
    fn unreachable(&self, at: Instant) -> Instant {
        let mut o = self.outage.lock();
        let since = o.get_or_insert(Outage { since: at, reported: false }).since;
        self.in_outage.store(true, Ordering::SeqCst);
        since
    }

    /// The server answered: an outage is over.
    fn reachable(&self) {
        if !self.in_outage.load(Ordering::Relaxed) {
            return;
        }
        let mut o = self.outage.lock();
        if let Some(out) = o.take() {
            if out.reported {
                tracing::warn!("PostgreSQL metadata store: the server answers again, after {:.1} s unreachable", out.since.elapsed().as_secs_f64());
            }
        }
        self.in_outage.store(false, Ordering::SeqCst);
    }

    fn put_conn(&self, mut c: Conn) {
        if !c.client.is_closed() && !self.abandoned.load(Ordering::SeqCst) {
            c.idle_since = Instant::now();
            self.pool.lock().push(c);
            let _open = self.slots.open.lock();
            self.slots.free.notify_one();
        }
    }

    /// Runs `body` on a connection until it is done, retrying serialization
    /// failures, deadlocks and lost connections with exponential backoff
    /// (from 2 ms, full jitter, at most 200 ms) until the deadline.
    ///
    /// The deadline is `timeout` after the operation started or after the
    /// server was first found unreachable (`outage`), whichever is sooner:
    /// past it an operation fails after one try. So a system call that
    /// makes several operations during an outage (an fsync: the chunk
    /// lookups, the commit; a close after it) waits for about one deadline
    /// in all, not one per operation, and any operation resumes as soon as
    /// a connection succeeds again (docs/metadata-store.md, "Retries").
    fn run<T>(&self, what: &str, mut body: impl FnMut(&mut Conn) -> Step<T>) -> Result<T> {
        self.check_alive()?;
        let start = Instant::now();
        let mut deadline = start + self.opts.timeout;
        if self.in_outage.load(Ordering::SeqCst) {
            if let Some(o) = &*self.outage.lock() {
                deadline = deadline.min(o.since + self.opts.timeout);
            }
        }
        let mut tries: u32 = 0;
        loop {
            let last = match self.take_conn(deadline) {
                Ok(mut c) => match body(&mut c) {
                    Step::Done(r) => {
                        if r.is_ok() {
                            self.reachable();
                        }
                        self.put_conn(c);
                        return r;
                    }
                    Step::Failed(e) => {
                        match classify(&e) {
                            Class::Retry => {
                                self.reachable();
                                self.put_conn(c)
                            }
                            Class::Reconnect => {
                                // The others were most likely cut too.
                                drop(c);
                                let old = std::mem::take(&mut *self.pool.lock());
                                drop(old);
                                let since = self.unreachable(Instant::now());
                                deadline = deadline.min(since + self.opts.timeout);
                            }
                            Class::Fatal => {
                                if e.as_db_error().is_some() {
                                    self.reachable();
                                }
                                self.put_conn(c);
                                return Err(pg_err(what, &e));
                            }
                        }
                        e
                    }
                },
                Err(ConnError::Busy) => {
                    return Err(Error::io(format!(
                        "PostgreSQL metadata store: {what}: all {MAX_CONNECTIONS} connections of this mount stayed busy for the deadline ({:?})",
                        self.opts.timeout
                    )))
                }
                Err(ConnError::Pg(e)) => {
                    if classify(&e) == Class::Fatal {
                        return Err(pg_err(&format!("{what}: connecting"), &e));
                    }
                    let since = self.unreachable(Instant::now());
                    deadline = deadline.min(since + self.opts.timeout);
                    e
                }
            };
            tries += 1;
            self.check_alive()?;
            self.retries.fetch_add(1, Ordering::Relaxed);
            let now = Instant::now();
            if now >= deadline {
                let mut o = self.outage.lock();
                let (down, first) = match o.as_mut() {
                    Some(out) => (Some(now - out.since), !std::mem::replace(&mut out.reported, true)),
                    None => (None, true),
                };
                drop(o);
                let down = match down {
                    Some(d) => format!("; the server has been unreachable for {:.1} s, so operations fail after one try until a connection succeeds again", d.as_secs_f64()),
                    None => String::new(),
                };
                let msg = format!(
                    "PostgreSQL metadata store: {what} failed after {tries} tries in {:.1} s (deadline {:?}){down}; last error: {}",
                    (now - start).as_secs_f64(),
                    self.opts.timeout,
                    describe(&last)
                );
                // Once per outage: every operation fails after it, and the
                // flusher tries twice a second.
                if first {
                    tracing::error!("{msg}");
                } else {
                    tracing::debug!("{msg}");
                }
                return Err(Error::io(msg));
            }
            tracing::debug!("PostgreSQL metadata store: {what}: try {tries} failed ({}); retrying", describe(&last));
            let cap = Duration::from_millis(2).saturating_mul(1u32 << tries.min(10)).min(Duration::from_millis(200));
            let pause = cap.mul_f64(rand::random::<f64>()).min(deadline - now);
            std::thread::sleep(pause);
        }
    }

    /// Reserves the next block of a sequence on `c`.
    fn next_block(c: &mut Client, seq: &str) -> std::result::Result<Block, pg::Error> {
        let v: i64 = c.query_one(&format!("SELECT nextval('{seq}')"), &[])?.get(0);
        Ok(Block { next: v as u64, end: v as u64 + ID_BLOCK, history: 0 })
    }
}

/// Parses `url`, refusing a password in it, and sets the password from
/// `PGPASSWORD` or the password file as libpq does.
fn config(url: &str) -> Result<pg::Config> {
    let mut cfg: pg::Config = url.parse().map_err(|e| Error::config(format!("PostgreSQL URL {url:?}: {e}")))?;
    if cfg.get_password().is_some() {
        return Err(Error::config(
            "the PostgreSQL URL carries a password, which would show in `ps` and shell history: remove it and use PGPASSWORD, ~/.pgpass or PGPASSFILE",
        ));
    }
    if let Some(p) = std::env::var_os("PGPASSWORD") {
        cfg.password(std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str()));
        return Ok(cfg);
    }
    let file = match std::env::var_os("PGPASSFILE") {
        Some(f) => Some(std::path::PathBuf::from(f)),
        None => std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".pgpass")),
    };
    if let Some(file) = file {
        if let Some(text) = read_pgpass(&file) {
            let host = match cfg.get_hosts().first() {
                Some(pg::config::Host::Tcp(h)) => h.clone(),
                _ => "localhost".to_string(),
            };
            let port = cfg.get_ports().first().copied().unwrap_or(5432).to_string();
            let user = cfg.get_user().map(str::to_string).or_else(|| std::env::var("USER").ok()).unwrap_or_default();
            let db = cfg.get_dbname().map(str::to_string).unwrap_or_else(|| user.clone());
            if let Some(pw) = pgpass_lookup(&text, &host, &port, &db, &user) {
                cfg.password(pw);
            }
        }
    }
    Ok(cfg)
}

/// The password file's text, or None if it is missing, not a regular file,
/// or readable by group or others (ignored with a warning, as libpq does).
fn read_pgpass(path: &std::path::Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let md = std::fs::metadata(path).ok()?;
    if !md.is_file() {
        return None;
    }
    if md.permissions().mode() & 0o077 != 0 {
        tracing::warn!("password file {} has group or world access and is ignored; permissions should be u=rw (0600) or less", path.display());
        return None;
    }
    std::fs::read_to_string(path).ok()
}

/// The password of the first line of a libpq password file
/// (`host:port:database:user:password`, `*` matching anything in the first
/// four fields, `\:` and `\\` escapes) matching the connection.
pub fn pgpass_lookup(text: &str, host: &str, port: &str, db: &str, user: &str) -> Option<String> {
    for line in text.lines() {
        let line = line.trim_end_matches('\r');
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields: Vec<String> = vec![String::new()];
        let mut chars = line.chars();
        while let Some(ch) = chars.next() {
            match ch {
                '\\' => {
                    if let Some(n) = chars.next() {
                        fields.last_mut().unwrap().push(n);
                    }
                }
                ':' if fields.len() < 5 => fields.push(String::new()),
                _ => fields.last_mut().unwrap().push(ch),
            }
        }
        if fields.len() != 5 {
            continue;
        }
        let want = [host, port, db, user];
        if fields[..4].iter().zip(want).all(|(f, w)| f == "*" || f == w) {
            return Some(fields.pop().unwrap());
        }
    }
    None
}

fn db_name(cfg: &pg::Config) -> String {
    cfg.get_dbname().or(cfg.get_user()).unwrap_or("?").to_string()
}

/// Bounds on a connection's waits (docs/shared-volume.md, "Bounded
/// waits"), where the URL did not set them: TCP keepalives after a third
/// of the deadline (at most 60 s) of silence, probed 3 times a few
/// seconds apart, and `tcp_user_timeout` at the deadline, so a silent
/// network (a server machine gone, a partition) ends the connection
/// instead of the kernel's 2-hour default; and a primary: a standby
/// (read-only) at the address is skipped, so a failover that leaves one
/// there is met by connecting again.
fn tune(cfg: &mut pg::Config, timeout: Duration) {
    let idle = (timeout / 3).clamp(Duration::from_secs(1), Duration::from_secs(60));
    cfg.keepalives(true);
    if cfg.get_keepalives_idle() == Duration::from_secs(2 * 60 * 60) {
        cfg.keepalives_idle(idle);
    }
    if cfg.get_keepalives_interval().is_none() {
        cfg.keepalives_interval((idle / 3).max(Duration::from_secs(1)));
    }
    if cfg.get_keepalives_retries().is_none() {
        cfg.keepalives_retries(3);
    }
    if cfg.get_tcp_user_timeout().is_none() {
        cfg.tcp_user_timeout(timeout.max(Duration::from_secs(1)));
    }
    if cfg.get_target_session_attrs() == pg::config::TargetSessionAttrs::Any {
        cfg.target_session_attrs(pg::config::TargetSessionAttrs::ReadWrite);
    }
}

/// A new connection's settings, and the server history it reached
/// (`Ident`), in one round trip: the search path, the planner setting
/// (`SESSION_SETTINGS`), and the timeouts that bound what a statement
/// may wait for: `statement_timeout` and `lock_timeout` at the store's
/// deadline (a row lock held by a machine that froze makes the waiter
/// fail with 55P03 instead of hanging), and
/// `idle_in_transaction_session_timeout` at the deadline too (a machine
/// that froze inside a transaction loses it, and its locks, then).
fn setup(c: &mut Client, schema: &str, timeout: Duration) -> std::result::Result<Ident, pg::Error> {
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128);
    let msgs = c.simple_query(&format!(
        "SET search_path TO {schema}; {SESSION_SETTINGS}; SET statement_timeout = {ms}; SET lock_timeout = {ms};
         SET idle_in_transaction_session_timeout = {ms}; {IDENT_SQL}"
    ))?;
    Ok(ident_of(&msgs))
}

/// The server history (`Ident`) as one row of text.
const IDENT_SQL: &str = "SELECT (SELECT system_identifier FROM pg_control_system())::text, substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8),
    COALESCE((SELECT stats_reset FROM pg_stat_wal)::text, '')";

/// The `IDENT_SQL` row among a simple query's answers.
fn ident_of(msgs: &[pg::SimpleQueryMessage]) -> Ident {
    let row = msgs.iter().find_map(|m| match m {
        pg::SimpleQueryMessage::Row(r) => Some(r),
        _ => None,
    });
    let get = |i: usize| row.and_then(|r| r.get(i)).unwrap_or_default().to_string();
    Ident { system: get(0), timeline: get(1), stats_reset: get(2) }
}

fn connect(cfg: &pg::Config, timeout: Duration) -> std::result::Result<Client, pg::Error> {
    connect_as(cfg, timeout, "cairn")
}

/// A connection whose `application_name` says what it is for
/// (`pg_stat_activity` shows it).
fn connect_as(cfg: &pg::Config, timeout: Duration, app: &str) -> std::result::Result<Client, pg::Error> {
    let mut cfg = cfg.clone();
    cfg.connect_timeout(timeout.min(Duration::from_secs(10)));
    cfg.application_name(app);
    cfg.connect(NoTls)
}

/// A `Duration` as PostgreSQL microseconds (for `* interval '1 microsecond'`).
fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// The maintenance lock: a session-level advisory lock held by a
/// connection of its own. If that connection dies, the server releases
/// the lock (and `still_held` says so).
struct PgMaintenance {
    client: Client,
    key: i64,
}

impl MaintenanceGuard for PgMaintenance {
    fn still_held(&mut self) -> bool {
        !self.client.is_closed() && self.client.is_valid(Duration::from_secs(5)).is_ok()
    }
}

impl Drop for PgMaintenance {
    /// Unlocks at once (closing the connection would too, but only when
    /// the server notices).
    fn drop(&mut self) {
        let _ = self.client.execute("SELECT pg_advisory_unlock($1)", &[&self.key]);
    }
}

/// Notices of commits to a volume: a connection of its own that LISTENs
/// on the volume's channel (its schema name).
struct PgFeed {
    cfg: pg::Config,
    channel: String,
    timeout: Duration,
    client: Option<Client>,
    /// When the connection was last known alive.
    checked: Instant,
    /// This store's session: its own commits' notices wake nobody (its
    /// caches are current; the follower reads those rows on its poll).
    own: Arc<AtomicU64>,
}

/// Whether a notice's payload (`SEQ SESSION`, format.md "Change
/// notices"; a bare `SEQ` from an older writer) names a session other
/// than `own` (0: none), which is the only kind that wakes a follower.
fn foreign_notice(payload: &str, own: u64) -> bool {
    let session = payload.split_once(' ').and_then(|(_, s)| s.parse::<u64>().ok());
    own == 0 || session != Some(own)
}

impl PgFeed {
    fn listen(&mut self) -> Result<()> {
        let mut c = connect_as(&self.cfg, self.timeout, "cairn-listen").map_err(|e| pg_err("connecting to listen for changes", &e))?;
        c.batch_execute(&format!("LISTEN {}", self.channel)).map_err(|e| pg_err("listening for changes", &e))?;
        self.client = Some(c);
        self.checked = Instant::now();
        Ok(())
    }
}

impl ChangeFeed for PgFeed {
    fn wait(&mut self, timeout: Duration) -> Result<bool> {
        if let Some(c) = &mut self.client {
            let start = Instant::now();
            let own = self.own.load(Ordering::SeqCst);
            let mut r = c.notifications().timeout_iter(timeout).next();
            // This mount's own notices: keep waiting out the timeout.
            while let Ok(Some(n)) = &r {
                if foreign_notice(n.payload(), own) {
                    break;
                }
                self.checked = Instant::now();
                r = c.notifications().timeout_iter(timeout.saturating_sub(start.elapsed())).next();
                if matches!(r, Ok(None)) && start.elapsed() < timeout {
                    // timeout_iter ended early only if the connection did.
                    break;
                }
            }
            let alive = match r {
                Ok(Some(_)) => {
                    // Take every notice already here: one wake-up for them.
                    while let Ok(Some(_)) = c.notifications().iter().next() {}
                    self.checked = Instant::now();
                    return Ok(true);
                }
                // None before the timeout: the connection ended. After a
                // quiet timeout, check now and then that it still lives
                // (a silent network would never end it).
                Ok(None) if start.elapsed() < timeout => false,
                Ok(None) if self.checked.elapsed() < Duration::from_secs(10) => true,
                Ok(None) => !c.is_closed() && c.is_valid(Duration::from_secs(5)).is_ok(),
                Err(_) => false,
            };
            if alive {
                self.checked = Instant::now();
                return Ok(false);
            }
            tracing::warn!("PostgreSQL metadata store: the change listener's connection was lost; reconnecting");
            self.client = None;
        }
        // Notices sent while away are lost: the caller reads the log.
        self.listen()?;
        Ok(true)
    }
}

/// A transaction (or a read) on one connection: the typed operations as
/// SQL. The first PostgreSQL error of the transaction is kept: the store
/// decides from it whether to run the closure again (the transaction is
/// aborted after it anyway).
struct PgTx<'a> {
    c: RefCell<&'a mut Conn>,
    store: &'a PgMeta,
    write: bool,
    deltas: RefCell<HashMap<u64, i64>>,
    /// What this try of the transaction changed, for the change log (a new
    /// `PgTx` per try: a re-run closure starts from nothing).
    changed: RefCell<std::collections::BTreeSet<Changed>>,
    failed: RefCell<Option<pg::Error>>,
    /// `read_one`: no transaction of its own, so one query at most (two
    /// would see two snapshots); the number run so far.
    single: Option<std::cell::Cell<u32>>,
    /// A locking write's rows read in its BEGIN round trip, once locked:
    /// its first reads are answered from here, until it sends any
    /// statement (which may change them).
    pre: RefCell<Option<Prefetched>>,
}

/// What a locking write's BEGIN round trip read after taking its locks.
#[derive(Default)]
struct Prefetched {
    /// The locked inodes' rows.
    inodes: HashMap<Ino, InodeRow>,
    /// The entries named up front: (ino, kind), None where absent.
    entries: HashMap<(Ino, Vec<u8>), Option<(Ino, FileKind)>>,
}

impl Prefetched {
    /// From the BEGIN batch's rows: `i` rows are locked inodes
    /// (`INODE_COLS` after the tag), `e` rows entries (parent, name as
    /// hex, ino, kind); `asked` entries without a row are absent.
    fn from_rows(msgs: &[pg::SimpleQueryMessage], asked: &[(Ino, &[u8])]) -> Result<Prefetched> {
        let mut p = Prefetched::default();
        for &(parent, name) in asked {
            p.entries.insert((parent, name.to_vec()), None);
        }
        for m in msgs {
            let pg::SimpleQueryMessage::Row(r) = m else { continue };
            match r.get(0) {
                Some("i") => {
                    let row = row_to_inode_at(r, 1)?;
                    p.inodes.insert(row.attr.ino, row);
                }
                Some("e") => {
                    let name = unhex(r.get(2).unwrap_or_default()).ok_or_else(|| Error::corrupt("PostgreSQL metadata: an entry's name is not hex"))?;
                    let (parent, ino, kind) = (r.int(1)? as Ino, r.int(3)? as Ino, FileKind::from_code(r.int(4)?)?);
                    p.entries.insert((parent, name), Some((ino, kind)));
                }
                _ => {}
            }
        }
        Ok(p)
    }
}

type P<'a> = &'a (dyn ToSql + Sync);

fn col<'r, T: pg::types::FromSql<'r>>(r: &'r Row, i: usize) -> Result<T> {
    r.try_get(i).map_err(|e| Error::corrupt(format!("PostgreSQL metadata: column {i}: {e}")))
}

impl<'a> PgTx<'a> {
    fn new(c: &'a mut Conn, store: &'a PgMeta, write: bool) -> Self {
        PgTx { c: RefCell::new(c), store, write, deltas: RefCell::new(HashMap::new()), changed: Default::default(), failed: RefCell::new(None), single: None, pre: RefCell::new(None) }
    }

    /// Notes a change for the log (once per transaction).
    fn changed(&self, c: Changed) {
        self.changed.borrow_mut().insert(c);
    }

    fn inode_changed(&self, ino: Ino) {
        self.changed(Changed::Inode(ino));
    }

    /// An entry of `parent` appeared or went: the entry and the directory.
    fn entry_changed(&self, parent: Ino, name: &[u8]) {
        self.changed(Changed::Entry { parent, name: name.to_vec() });
        self.changed(Changed::Inode(parent));
    }

    /// The statement that appends the transaction's change rows and sends
    /// `pg_notify(<schema>, "<highest seq> <session>")`, delivered at
    /// commit; sent in the COMMIT's own round trip (`attempt`), so it is
    /// SQL text with the values written in: integers, and names as hex
    /// (`decode('…', 'hex')`), nothing to quote. None if nothing changed.
    /// No lock: writers of every machine commit side by side (group
    /// commit), so a smaller seq may commit after a larger one was read;
    /// readers track such holes (`read_changes`).
    fn changes_sql(&self) -> Option<String> {
        use std::fmt::Write;
        let set = std::mem::take(&mut *self.changed.borrow_mut());
        if set.is_empty() {
            return None;
        }
        let session = match self.store.session.load(Ordering::SeqCst) {
            0 => None,
            s => Some(s as i64),
        };
        let sess = session.map_or("NULL".to_string(), |s| s.to_string());
        let mut values = String::new();
        for c in set {
            if !values.is_empty() {
                values.push(',');
            }
            match c {
                Changed::Inode(ino) => {
                    let _ = write!(values, "({CHANGE_INODE},{},NULL,NULL,{sess})", ino as i64);
                }
                Changed::Entry { parent, name } => {
                    let _ = write!(values, "({CHANGE_ENTRY},NULL,{},decode('{}','hex'),{sess})", parent as i64, hex(&name));
                }
            }
        }
        if !self.store.opts.notify {
            return Some(format!("INSERT INTO changes(kind, ino, parent, name, session) VALUES {values}; "));
        }
        // The schema name is [a-z0-9_] (checked when the store opened).
        Some(format!(
            "WITH ins AS (INSERT INTO changes(kind, ino, parent, name, session) VALUES {values} RETURNING seq)
             SELECT pg_notify('{}', MAX(seq)::text || ' ' || '{}') FROM ins; ",
            self.store.schema,
            session.map_or(String::new(), |s| s.to_string())
        ))
    }

    fn note(&self, e: pg::Error) -> Error {
        let err = pg_err("statement failed", &e);
        let mut f = self.failed.borrow_mut();
        if f.is_none() {
            *f = Some(e);
        }
        err
    }

    fn with<T>(&self, sql: &str, run: impl FnOnce(&mut Client, &Statement) -> std::result::Result<T, pg::Error>) -> Result<T> {
        // A statement may change what the BEGIN round trip read.
        self.pre.borrow_mut().take();
        if let Some(n) = &self.single {
            if n.replace(n.get() + 1) > 0 {
                return Err(Error::invalid("internal: a second query in a read_one closure (it would see another snapshot)"));
            }
        }
        let mut g = self.c.borrow_mut();
        let conn = &mut **g;
        let st = conn.prepared(sql).map_err(|e| self.note(e))?;
        run(&mut conn.client, &st).map_err(|e| self.note(e))
    }

    fn query(&self, sql: &str, p: &[P]) -> Result<Vec<Row>> {
        self.with(sql, |c, st| c.query(st, p))
    }
    fn opt(&self, sql: &str, p: &[P]) -> Result<Option<Row>> {
        self.with(sql, |c, st| c.query_opt(st, p))
    }
    fn one(&self, sql: &str, p: &[P]) -> Result<Row> {
        self.with(sql, |c, st| c.query_one(st, p))
    }
    fn exec(&self, sql: &str, p: &[P]) -> Result<u64> {
        self.with(sql, |c, st| c.execute(st, p))
    }
    fn int(&self, sql: &str, p: &[P]) -> Result<i64> {
        col(&self.one(sql, p)?, 0)
    }

    /// This store's journal id as a parameter (0: none set).
    fn journal(&self) -> i64 {
        self.store.journal.load(Ordering::SeqCst) as i64
    }

    fn need_write(&self) -> Result<()> {
        if self.write {
            Ok(())
        } else {
            Err(Error::invalid("internal: a change outside a write transaction"))
        }
    }

    /// Applies the accumulated chunk reference changes: the rows are
    /// locked in ascending id order (so two transactions sharing chunks
    /// queue instead of deadlocking), checked, then incremented; each
    /// pack's dead bytes follow (as the SQLite store's `apply_ref_deltas`).
    /// The reference counts; returns the change rows' statement, for the
    /// COMMIT's round trip.
    fn finish(&self) -> Result<Option<String>> {
        self.apply_refs()?;
        Ok(self.changes_sql())
    }

    fn apply_refs(&self) -> Result<()> {
        let d = std::mem::take(&mut *self.deltas.borrow_mut());
        let mut rows: Vec<(i64, i64)> = d.into_iter().filter(|&(_, d)| d != 0).map(|(id, d)| (id as i64, d)).collect();
        if rows.is_empty() {
            return Ok(());
        }
        rows.sort_unstable();
        let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
        let got = self.query("SELECT id, refs, pack, stored_len FROM chunks WHERE id = ANY($1) ORDER BY id FOR UPDATE", &[&ids])?;
        let mut dead: HashMap<i64, i64> = HashMap::new();
        let mut want = rows.iter();
        for r in &got {
            let id: i64 = col(r, 0)?;
            let &(wid, d) = want.next().ok_or_else(|| Error::corrupt(format!("chunk #{id} came back unasked")))?;
            if wid != id {
                return Err(gone_chunk(wid));
            }
            let refs: i64 = col(r, 1)?;
            let new = refs + d;
            if new < 0 {
                return Err(Error::corrupt(format!("chunk #{id} reference count would go negative ({refs}{d:+})")));
            }
            let (pack, stored): (i64, i64) = (col(r, 2)?, col(r, 3)?);
            if refs > 0 && new == 0 {
                *dead.entry(pack).or_default() += stored;
            } else if refs == 0 && new > 0 {
                *dead.entry(pack).or_default() -= stored;
            }
        }
        if let Some(&(id, _)) = want.next() {
            return Err(gone_chunk(id));
        }
        let ds: Vec<i64> = rows.iter().map(|r| r.1).collect();
        // A count reaching 0 dates it (the collector's grace runs from
        // then); one leaving 0 clears the date.
        self.exec(APPLY_REFS_SQL, &[&ids, &ds])?;
        let now = Timestamp::now().0;
        let mut packs: Vec<(i64, i64)> = dead.into_iter().filter(|&(_, b)| b != 0).collect();
        packs.sort_unstable();
        for (pack, bytes) in packs {
            self.exec(DEAD_BYTES_SQL, &[&pack, &bytes, &now])?;
        }
        Ok(())
    }

    fn unlink_page(&self, id: u64, chunks: Option<&[u64]>) -> Result<()> {
        let refs: i64 = match self.opt("UPDATE pages SET refs = refs - 1 WHERE id = $1 RETURNING refs", &[&(id as i64)])? {
            Some(r) => col(&r, 0)?,
            None => return Err(Error::corrupt(format!("page #{id} is missing"))),
        };
        if refs < 0 {
            return Err(Error::corrupt(format!("page #{id}: link count went negative")));
        }
        if refs == 0 {
            let mut d = Vec::new();
            match chunks {
                Some(ch) => d.extend_from_slice(ch),
                None => {
                    let row = self.one("SELECT data FROM pages WHERE id = $1", &[&(id as i64)])?;
                    let data: Vec<u8> = col(&row, 0)?;
                    self.store.codec.chunk_ids(&data, &mut d).map_err(|e| e.context(format!("page #{id}")))?;
                }
            }
            let mut deltas = self.deltas.borrow_mut();
            for c in d {
                *deltas.entry(c).or_default() -= 1;
            }
            self.exec("DELETE FROM pages WHERE id = $1", &[&(id as i64)])?;
        }
        Ok(())
    }
}

/// Adds `$2` bytes to pack `$1`'s dead bytes at time `$3` (ns), accruing
/// the dead bytes held until then into `dead_acc` (as the SQLite store).
const DEAD_BYTES_SQL: &str = "UPDATE packs SET dead_bytes = dead_bytes + $2::bigint,
  dead_since = CASE WHEN $2::bigint > 0 AND dead_since IS NULL THEN $3::bigint WHEN dead_bytes + $2::bigint = 0 THEN NULL ELSE dead_since END,
  dead_acc = dead_acc + dead_bytes * (($3::bigint - COALESCE(dead_mark, dead_since, $3::bigint))::float8 / 1e9::float8), dead_mark = $3::bigint
  WHERE id = $1";

/// An inode row with this store's journal's mark as `jseq` (`$J` is
/// replaced by the parameter number of the journal id; no mark reads 0).
const INODE_COLS: &str = "i.ino, i.kind, i.perm, i.nlink, i.uid, i.gid, i.rdev, i.size, i.data_bytes, i.atime, i.mtime, i.ctime, i.btime, i.parent, i.target, COALESCE(m.seq, 0), i.flags, i.cver";
/// How many columns `INODE_COLS` has.
const INODE_NCOLS: usize = 18;
const INODE_FROM: &str = "inodes i LEFT JOIN journal_marks m ON m.journal = $J AND m.ino = i.ino";
const CHUNK_COLS: &str = "id, hash, pack, \"offset\", stored_len, raw_len, flags, refs, zero_since";

fn row_to_inode(r: &Row) -> Result<InodeRow> {
    row_to_inode_at(r, 0)
}

/// A result row's columns, from a prepared statement (binary) or from a
/// simple query (text: a locking write's BEGIN round trip).
trait Cols {
    fn opt_int(&self, i: usize) -> Result<Option<i64>>;
    fn opt_bytes(&self, i: usize) -> Result<Option<Vec<u8>>>;
    fn int(&self, i: usize) -> Result<i64> {
        self.opt_int(i)?.ok_or_else(|| Error::corrupt(format!("PostgreSQL metadata: column {i} is NULL")))
    }
}

impl Cols for Row {
    fn opt_int(&self, i: usize) -> Result<Option<i64>> {
        col(self, i)
    }
    fn opt_bytes(&self, i: usize) -> Result<Option<Vec<u8>>> {
        col(self, i)
    }
}

impl Cols for pg::SimpleQueryRow {
    fn opt_int(&self, i: usize) -> Result<Option<i64>> {
        let v = self.try_get(i).map_err(|e| Error::corrupt(format!("PostgreSQL metadata: column {i}: {e}")))?;
        v.map(|t| t.parse::<i64>().map_err(|e| Error::corrupt(format!("PostgreSQL metadata: column {i}: {t:?}: {e}")))).transpose()
    }
    /// `bytea` in its text form, `\x` and hex.
    fn opt_bytes(&self, i: usize) -> Result<Option<Vec<u8>>> {
        let v = self.try_get(i).map_err(|e| Error::corrupt(format!("PostgreSQL metadata: column {i}: {e}")))?;
        let Some(t) = v else { return Ok(None) };
        t.strip_prefix("\\x").and_then(unhex).map(Some).ok_or_else(|| Error::corrupt(format!("PostgreSQL metadata: column {i} is not hex bytea")))
    }
}

/// The inode in `INODE_COLS` order from column `b` on.
fn row_to_inode_at(r: &impl Cols, b: usize) -> Result<InodeRow> {
    let data_bytes = r.int(b + 8)?;
    let attr = Attr {
        ino: r.int(b)? as u64,
        kind: FileKind::from_code(r.int(b + 1)?)?,
        perm: r.int(b + 2)? as u32,
        nlink: r.int(b + 3)? as u32,
        uid: r.int(b + 4)? as u32,
        gid: r.int(b + 5)? as u32,
        rdev: r.int(b + 6)? as u32,
        size: r.int(b + 7)? as u64,
        blocks: (data_bytes as u64).div_ceil(512),
        atime: Timestamp(r.int(b + 9)?),
        mtime: Timestamp(r.int(b + 10)?),
        ctime: Timestamp(r.int(b + 11)?),
        btime: Timestamp(r.int(b + 12)?),
    };
    let mut row = InodeRow {
        attr,
        data_bytes: data_bytes as u64,
        parent: r.opt_int(b + 13)?.map(|p| p as u64),
        target: r.opt_bytes(b + 14)?,
        jseq: r.int(b + 15)? as u64,
        flags: r.int(b + 16)?,
        cver: r.int(b + 17)? as u64,
    };
    if row.attr.kind == FileKind::Dir {
        row.attr.size = 4096;
        row.attr.blocks = 8;
    }
    Ok(row)
}

fn row_to_chunk(r: &Row) -> Result<ChunkRow> {
    let h: Vec<u8> = col(r, 1)?;
    let mut hash = [0u8; 32];
    if h.len() == 32 {
        hash.copy_from_slice(&h);
    }
    Ok(ChunkRow {
        id: col::<i64>(r, 0)? as u64,
        hash,
        pack: col::<i64>(r, 2)? as u64,
        offset: col::<i64>(r, 3)? as u64,
        stored_len: col::<i64>(r, 4)? as u32,
        raw_len: col::<i64>(r, 5)? as u32,
        flags: col::<i64>(r, 6)? as u8,
        refs: col(r, 7)?,
        zero_since: col(r, 8)?,
    })
}

fn chunks_of(rows: Vec<Row>) -> Result<Vec<ChunkRow>> {
    rows.iter().map(row_to_chunk).collect()
}

/// A sum PostgreSQL returns as numeric, read as text, saturating at u64::MAX.
fn big(r: &Row, i: usize) -> Result<u64> {
    let s: String = col(r, i)?;
    Ok(s.parse::<u128>().map(|v| u64::try_from(v).unwrap_or(u64::MAX)).unwrap_or(u64::MAX))
}

impl MetaRead for PgTx<'_> {
    fn get_inode(&self, ino: Ino) -> Result<Option<InodeRow>> {
        if let Some(r) = self.pre.borrow().as_ref().and_then(|p| p.inodes.get(&ino)) {
            return Ok(Some(r.clone()));
        }
        let from = INODE_FROM.replace("$J", "$2");
        let Some(r) = self.opt(&format!("SELECT {INODE_COLS} FROM {from} WHERE i.ino = $1"), &[&(ino as i64), &self.journal()])? else { return Ok(None) };
        Ok(Some(row_to_inode(&r)?))
    }
    /// One statement: the directory's row joined to the entry and its
    /// inode's row (all NULL when the name is not there).
    fn lookup_inode(&self, parent: Ino, name: &[u8]) -> Result<(Option<InodeRow>, Option<InodeRow>)> {
        if let Some(p) = self.pre.borrow().as_ref() {
            if let (Some(prow), Some(entry)) = (p.inodes.get(&parent), p.entries.get(&(parent, name.to_vec()))) {
                match entry {
                    None => return Ok((Some(prow.clone()), None)),
                    Some((ino, _)) => {
                        if let Some(c) = p.inodes.get(ino) {
                            return Ok((Some(prow.clone()), Some(c.clone())));
                        }
                    }
                }
            }
        }
        let parent_cols = INODE_COLS.replace("i.", "p.").replace("m.seq", "pm.seq");
        let sql = format!(
            "SELECT {parent_cols}, {INODE_COLS}
             FROM inodes p LEFT JOIN journal_marks pm ON pm.journal = $2 AND pm.ino = p.ino
             LEFT JOIN dentries d ON d.parent = p.ino AND d.name = $3
             LEFT JOIN inodes i ON i.ino = d.ino
             LEFT JOIN journal_marks m ON m.journal = $2 AND m.ino = i.ino
             WHERE p.ino = $1"
        );
        let Some(r) = self.opt(&sql, &[&(parent as i64), &self.journal(), &name])? else { return Ok((None, None)) };
        let child = match col::<Option<i64>>(&r, INODE_NCOLS)? {
            Some(_) => Some(row_to_inode_at(&r, INODE_NCOLS)?),
            None => None,
        };
        Ok((Some(row_to_inode(&r)?), child))
    }
    fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Option<(Ino, FileKind)>> {
        if let Some(e) = self.pre.borrow().as_ref().and_then(|p| p.entries.get(&(parent, name.to_vec()))) {
            return Ok(*e);
        }
        match self.opt("SELECT ino, kind FROM dentries WHERE parent = $1 AND name = $2", &[&(parent as i64), &name])? {
            None => Ok(None),
            Some(r) => Ok(Some((col::<i64>(&r, 0)? as u64, FileKind::from_code(col(&r, 1)?)?))),
        }
    }
    fn list_dir(&self, dir: Ino) -> Result<Vec<(Vec<u8>, Ino, FileKind)>> {
        self.query("SELECT name, ino, kind FROM dentries WHERE parent = $1 ORDER BY name", &[&(dir as i64)])?
            .iter()
            .map(|r| Ok((col(r, 0)?, col::<i64>(r, 1)? as u64, FileKind::from_code(col(r, 2)?)?)))
            .collect()
    }
    fn dir_is_empty(&self, dir: Ino) -> Result<bool> {
        Ok(self.opt("SELECT 1 FROM dentries WHERE parent = $1 LIMIT 1", &[&(dir as i64)])?.is_none())
    }
    fn get_xattr(&self, ino: Ino, name: &[u8]) -> Result<Option<Vec<u8>>> {
        self.opt("SELECT value FROM xattrs WHERE ino = $1 AND name = $2", &[&(ino as i64), &name])?.map(|r| col(&r, 0)).transpose()
    }
    fn list_xattrs(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        self.query("SELECT name FROM xattrs WHERE ino = $1 ORDER BY name", &[&(ino as i64)])?.iter().map(|r| col(r, 0)).collect()
    }
    fn load_pages(&self, ino: Ino) -> Result<Vec<StoredPage>> {
        let rows = self.query(
            "SELECT f.key, p.id, p.data FROM file_pages f JOIN pages p ON p.id = f.page WHERE f.ino = $1 ORDER BY f.key",
            &[&(ino as i64)],
        )?;
        let pages: Vec<StoredPage> =
            rows.iter().map(|r| Ok(StoredPage { key: col(r, 0)?, id: col::<i64>(r, 1)? as u64, data: col(r, 2)? })).collect::<Result<_>>()?;
        let n = self.int("SELECT COUNT(*) FROM file_pages WHERE ino = $1", &[&(ino as i64)])?;
        if n as usize != pages.len() {
            return Err(Error::corrupt(format!("inode {ino} links {} pages that do not exist", n as usize - pages.len())));
        }
        Ok(pages)
    }
    fn page_links(&self, ino: Ino) -> Result<Vec<PageLink>> {
        self.query("SELECT f.key, p.id, p.refs, p.data FROM file_pages f JOIN pages p ON p.id = f.page WHERE f.ino = $1", &[&(ino as i64)])?
            .iter()
            .map(|r| Ok(PageLink { key: col(r, 0)?, id: col::<i64>(r, 1)? as u64, refs: col(r, 2)?, data: col(r, 3)? }))
            .collect()
    }
    fn page_data(&self, id: u64) -> Result<Option<Vec<u8>>> {
        self.opt("SELECT data FROM pages WHERE id = $1", &[&(id as i64)])?.map(|r| col(&r, 0)).transpose()
    }
    fn get_info(&self, key: &str) -> Result<Option<i64>> {
        self.opt("SELECT value FROM info WHERE key = $1", &[&key])?.map(|r| col(&r, 0)).transpose()
    }
    fn chunk_by_id(&self, id: u64) -> Result<Option<ChunkRow>> {
        self.opt(&format!("SELECT {CHUNK_COLS} FROM chunks WHERE id = $1"), &[&(id as i64)])?.map(|r| row_to_chunk(&r)).transpose()
    }
    fn chunk_by_hash(&self, hash: &[u8; 32]) -> Result<Option<ChunkRow>> {
        self.opt(&format!("SELECT {CHUNK_COLS} FROM chunks WHERE hash = $1"), &[&&hash[..]])?.map(|r| row_to_chunk(&r)).transpose()
    }
    fn chunks_in_pack(&self, pack: u64) -> Result<Vec<ChunkRow>> {
        chunks_of(self.query(&format!("SELECT {CHUNK_COLS} FROM chunks WHERE pack = $1 ORDER BY \"offset\""), &[&(pack as i64)])?)
    }
    fn all_chunks(&self) -> Result<Vec<ChunkRow>> {
        chunks_of(self.query(&format!("SELECT {CHUNK_COLS} FROM chunks ORDER BY pack, \"offset\""), &[])?)
    }
    fn max_chunk_id(&self) -> Result<u64> {
        Ok(self.int("SELECT COALESCE(MAX(id), 0) FROM chunks", &[])? as u64)
    }
    fn pack_name(&self, id: u64) -> Result<String> {
        match self.opt("SELECT name FROM packs WHERE id = $1", &[&(id as i64)])? {
            Some(r) => col(&r, 0),
            None => Err(Error::corrupt(format!("pack #{id} is missing from the metadata"))),
        }
    }
    fn pack_exists(&self, name: &str) -> Result<bool> {
        Ok(self.opt("SELECT 1 FROM packs WHERE name = $1", &[&name])?.is_some())
    }
    fn all_packs(&self) -> Result<Vec<PackRow>> {
        self.query("SELECT id, name, size, blobs, dead_bytes FROM packs ORDER BY id", &[])?
            .iter()
            .map(|r| {
                Ok(PackRow {
                    id: col::<i64>(r, 0)? as u64,
                    name: col(r, 1)?,
                    size: col::<i64>(r, 2)? as u64,
                    blobs: col::<i64>(r, 3)? as u64,
                    dead_bytes: col::<i64>(r, 4)? as u64,
                })
            })
            .collect()
    }
    fn dead_packs(&self) -> Result<Vec<DeadPack>> {
        self.query(
            "SELECT id, name, size, dead_bytes, dead_acc, COALESCE(dead_mark, dead_since, created), blobs FROM packs WHERE dead_bytes > 0 ORDER BY id",
            &[],
        )?
        .iter()
        .map(|r| {
            Ok(DeadPack {
                id: col::<i64>(r, 0)? as u64,
                name: col(r, 1)?,
                size: col::<i64>(r, 2)? as u64,
                dead_bytes: col::<i64>(r, 3)? as u64,
                dead_acc: col(r, 4)?,
                mark: col(r, 5)?,
                blobs: col::<i64>(r, 6)? as u64,
            })
        })
        .collect()
    }
    fn pack_bytes(&self) -> Result<(u64, u64)> {
        let r = self.one("SELECT COALESCE(SUM(size), 0)::text, COALESCE(SUM(dead_bytes), 0)::text FROM packs", &[])?;
        Ok((big(&r, 0)?, big(&r, 1)?))
    }
    fn bill_rows(&self, since: Option<i64>) -> Result<Vec<BillRow>> {
        self.query(
            "SELECT day, subsystem, item, requests, bytes FROM bill WHERE day >= $1 ORDER BY day, subsystem, item",
            &[&since.unwrap_or(i64::MIN)],
        )?
        .iter()
        .map(|r| Ok(BillRow { day: col(r, 0)?, subsystem: col(r, 1)?, item: col(r, 2)?, requests: col::<i64>(r, 3)? as u64, bytes: col::<i64>(r, 4)? as u64 }))
        .collect()
    }
    fn all_inodes(&self) -> Result<Vec<InodeRow>> {
        let from = INODE_FROM.replace("$J", "$1");
        self.query(&format!("SELECT {INODE_COLS} FROM {from} ORDER BY i.ino"), &[&self.journal()])?.iter().map(row_to_inode).collect()
    }
    fn orphan_inodes(&self) -> Result<Vec<Ino>> {
        // A row of a session that is gone counts for nothing (rows go with
        // their session; this is the second guard).
        self.query(
            "SELECT ino FROM inodes i WHERE nlink = 0
             AND NOT EXISTS (SELECT 1 FROM open_files o JOIN sessions s ON s.id = o.session WHERE o.ino = i.ino) ORDER BY ino",
            &[],
        )?
            .iter()
            .map(|r| Ok(col::<i64>(r, 0)? as u64))
            .collect()
    }
    fn open_elsewhere(&self, ino: Ino, except: u64) -> Result<bool> {
        Ok(self
            .opt(
                "SELECT 1 FROM open_files o JOIN sessions s ON s.id = o.session WHERE o.ino = $1 AND o.session <> $2 LIMIT 1",
                &[&(ino as i64), &(except as i64)],
            )?
            .is_some())
    }
    fn all_dentries(&self) -> Result<Vec<(Ino, Vec<u8>, Ino, i64)>> {
        self.query("SELECT parent, name, ino, kind FROM dentries ORDER BY parent, name", &[])?
            .iter()
            .map(|r| Ok((col::<i64>(r, 0)? as u64, col(r, 1)?, col::<i64>(r, 2)? as u64, col(r, 3)?)))
            .collect()
    }
    fn all_pages(&self) -> Result<Vec<(u64, i64, Vec<u8>)>> {
        self.query("SELECT id, refs, data FROM pages ORDER BY id", &[])?.iter().map(|r| Ok((col::<i64>(r, 0)? as u64, col(r, 1)?, col(r, 2)?))).collect()
    }
    fn all_page_links(&self) -> Result<Vec<(Ino, i64, u64)>> {
        self.query("SELECT ino, key, page FROM file_pages ORDER BY ino, key", &[])?
            .iter()
            .map(|r| Ok((col::<i64>(r, 0)? as u64, col(r, 1)?, col::<i64>(r, 2)? as u64)))
            .collect()
    }
    fn count_inodes(&self) -> Result<u64> {
        Ok(self.int("SELECT COUNT(*) FROM inodes", &[])? as u64)
    }
    fn max_jseq(&self) -> Result<u64> {
        Ok(self.int("SELECT COALESCE(MAX(seq), 0) FROM journal_marks WHERE journal = $1", &[&self.journal()])? as u64)
    }
    fn inode_totals(&self) -> Result<InodeTotals> {
        let rows = self.query(
            "SELECT kind, COUNT(*), LEAST(COALESCE(SUM(size), 0), 18446744073709551615)::text,
                    LEAST(COALESCE(SUM(data_bytes), 0), 18446744073709551615)::text FROM inodes GROUP BY kind ORDER BY kind",
            &[],
        )?;
        let mut t = InodeTotals::default();
        for r in &rows {
            t.by_kind.push((FileKind::from_code(col(r, 0)?)?, col::<i64>(r, 1)? as u64, big(r, 2)?, big(r, 3)?));
        }
        Ok(t)
    }
    fn chunk_totals(&self) -> Result<ChunkTotals> {
        let r = self.one(
            "SELECT COUNT(*) FILTER (WHERE refs > 0), COUNT(*) FILTER (WHERE refs = 0),
                    COALESCE(SUM(raw_len) FILTER (WHERE refs > 0), 0)::text, COALESCE(SUM(stored_len) FILTER (WHERE refs > 0), 0)::text FROM chunks",
            &[],
        )?;
        let p = self.one("SELECT COUNT(*), COALESCE(SUM(size), 0)::text, COALESCE(SUM(dead_bytes), 0)::text FROM packs", &[])?;
        Ok(ChunkTotals {
            live_chunks: col::<i64>(&r, 0)? as u64,
            dead_chunks: col::<i64>(&r, 1)? as u64,
            unique_bytes: big(&r, 2)?,
            live_stored_bytes: big(&r, 3)?,
            packs: col::<i64>(&p, 0)? as u64,
            pack_bytes: big(&p, 1)?,
            dead_bytes: big(&p, 2)?,
        })
    }
}

impl MetaTx for PgTx<'_> {
    fn lock_inode(&self, ino: Ino) -> Result<Option<InodeRow>> {
        // Locked in the BEGIN round trip already.
        if let Some(r) = self.pre.borrow().as_ref().and_then(|p| p.inodes.get(&ino)) {
            return Ok(Some(r.clone()));
        }
        let from = INODE_FROM.replace("$J", "$2");
        let Some(r) = self.opt(&format!("SELECT {INODE_COLS} FROM {from} WHERE i.ino = $1 FOR UPDATE OF i"), &[&(ino as i64), &self.journal()])? else {
            return Ok(None);
        };
        Ok(Some(row_to_inode(&r)?))
    }
    fn unlink_entry(&self, parent: Ino, name: &[u8], ino: Ino, now: Timestamp, nlink_delta: i64) -> Result<bool> {
        let r = self.one(
            "WITH d AS (DELETE FROM dentries WHERE parent = $1 AND name = $2 AND ino = $3 RETURNING 1),
                  t AS (UPDATE inodes SET mtime = $4, ctime = $4, nlink = nlink + $5 WHERE ino = $1 AND EXISTS (SELECT 1 FROM d) RETURNING 1)
             SELECT EXISTS (SELECT 1 FROM d), (SELECT count(*) FROM t)",
            &[&(parent as i64), &name, &(ino as i64), &now.0, &nlink_delta],
        )?;
        let gone: bool = col(&r, 0)?;
        if gone {
            self.entry_changed(parent, name);
        }
        Ok(gone)
    }
    fn lock_inodes(&self, inos: &[Ino]) -> Result<()> {
        if self.pre.borrow().as_ref().is_some_and(|p| inos.iter().all(|i| p.inodes.contains_key(i))) {
            return Ok(());
        }
        let mut ids: Vec<i64> = inos.iter().map(|&i| i as i64).collect();
        ids.sort_unstable();
        ids.dedup();
        self.query("SELECT ino FROM inodes WHERE ino = ANY($1) ORDER BY ino FOR UPDATE", &[&ids])?;
        Ok(())
    }
    /// From this store's block of `ino_seq` (a new block is reserved by a
    /// `nextval` on this transaction's connection: sequences are not
    /// transactional, so a rolled-back transaction skips its numbers).
    fn alloc_ino(&self) -> Result<Ino> {
        self.need_write()?;
        let mut b = self.store.inos.lock();
        loop {
            let history = self.store.history.load(Ordering::SeqCst);
            if b.history != history {
                *b = Block::default();
            }
            if let Some(v) = b.take(self.store.ino_floor) {
                return Ok(v);
            }
            let mut g = self.c.borrow_mut();
            *b = PgMeta::next_block(&mut g.client, "ino_seq").map_err(|e| self.note(e))?;
            b.history = history;
            self.store.ino_high.fetch_max(b.next, Ordering::SeqCst);
        }
    }
    /// One statement: the entry (ON CONFLICT DO NOTHING decides), then,
    /// only if it went in, the inode, the parent's times and links, and
    /// the open-file row.
    fn create_node(&self, n: &NewNode) -> Result<()> {
        let a = n.attr;
        let dir = a.kind == FileKind::Dir;
        let (session, gen) = n.open.unwrap_or((0, 0));
        let r = self.one(
            "WITH d AS (INSERT INTO dentries(parent, name, ino, kind) VALUES($14, $15, $1, $2) ON CONFLICT (parent, name) DO NOTHING RETURNING 1),
                  i AS (INSERT INTO inodes(ino, kind, perm, uid, gid, rdev, nlink, size, data_bytes, atime, mtime, ctime, btime, parent, target, jseq, flags)
                        SELECT $1::bigint, $2::bigint, $3::bigint, $4::bigint, $5::bigint, $6::bigint, $7::bigint, $8::bigint, 0, $9::bigint, $10::bigint,
                               $11::bigint, $12::bigint, $13::bigint, $16::bytea, 0, 0
                        WHERE EXISTS (SELECT 1 FROM d) RETURNING ino),
                  t AS (UPDATE inodes SET mtime = $17::bigint, ctime = $17::bigint, nlink = nlink + $18::bigint
                        WHERE ino = $14 AND EXISTS (SELECT 1 FROM d) RETURNING 1),
                  s AS (SELECT $19::bigint = 0 OR EXISTS (SELECT 1 FROM sessions WHERE id = $19::bigint) AS live),
                  o AS (INSERT INTO open_files(ino, session, gen) SELECT $1::bigint, $19::bigint, $20::bigint
                        WHERE $19::bigint <> 0 AND (SELECT live FROM s) AND EXISTS (SELECT 1 FROM i)
                        ON CONFLICT (ino, session) DO UPDATE SET gen = excluded.gen RETURNING 1)
             SELECT EXISTS (SELECT 1 FROM d), (SELECT live FROM s), (SELECT count(*) FROM t) + (SELECT count(*) FROM o)",
            &[
                &(a.ino as i64),
                &a.kind.code(),
                &(a.perm as i64),
                &(a.uid as i64),
                &(a.gid as i64),
                &(a.rdev as i64),
                &(a.nlink as i64),
                &(a.size as i64),
                &a.atime.0,
                &a.mtime.0,
                &a.ctime.0,
                &a.btime.0,
                &(dir.then_some(n.parent as i64)),
                &(n.parent as i64),
                &n.name,
                &n.target,
                &n.now.0,
                &(dir as i64),
                &(session as i64),
                &(gen as i64),
            ],
        )?;
        if !col::<bool>(&r, 0)? {
            return Err(name_taken(n.parent, n.name));
        }
        if !col::<bool>(&r, 1)? {
            return Err(session_gone(session));
        }
        self.entry_changed(n.parent, n.name);
        Ok(())
    }
    fn insert_inode_full(&self, a: &Attr, data_bytes: u64, parent: Option<Ino>, target: Option<&[u8]>, _jseq: u64, flags: i64) -> Result<()> {
        self.exec(
            "INSERT INTO inodes(ino, kind, perm, uid, gid, rdev, nlink, size, data_bytes, atime, mtime, ctime, btime, parent, target, jseq, flags)
             VALUES($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)",
            &[
                &(a.ino as i64),
                &a.kind.code(),
                &(a.perm as i64),
                &(a.uid as i64),
                &(a.gid as i64),
                &(a.rdev as i64),
                &(a.nlink as i64),
                &(a.size as i64),
                &(data_bytes as i64),
                &a.atime.0,
                &a.mtime.0,
                &a.ctime.0,
                &a.btime.0,
                &parent.map(|p| p as i64),
                &target,
                // No mark: the number is new, so no journal holds an older
                // record of it (the column is the frozen legacy one).
                &0i64,
                &flags,
            ],
        )?;
        Ok(())
    }
    fn update_attr(&self, a: &Attr) -> Result<()> {
        self.exec(
            "UPDATE inodes SET perm = $2, uid = $3, gid = $4, nlink = $5, atime = $6, mtime = $7, ctime = $8 WHERE ino = $1",
            &[&(a.ino as i64), &(a.perm as i64), &(a.uid as i64), &(a.gid as i64), &(a.nlink as i64), &a.atime.0, &a.mtime.0, &a.ctime.0],
        )?;
        self.inode_changed(a.ino);
        Ok(())
    }
    fn update_content(&self, ino: Ino, size: u64, data_bytes: u64, mtime: Timestamp, ctime: Timestamp, jseq: u64) -> Result<()> {
        // One statement: the content, and this journal's mark for the
        // inode (raised, never lowered; none for a missing inode, position
        // 0 or no journal set). Other journals' marks stay.
        self.exec(
            "WITH u AS (UPDATE inodes SET size = $2, data_bytes = $3, mtime = $4, ctime = $5, cver = cver + 1 WHERE ino = $1 RETURNING ino)
             INSERT INTO journal_marks(journal, ino, seq) SELECT $7::bigint, ino, $6::bigint FROM u WHERE $6::bigint > 0 AND $7::bigint <> 0
             ON CONFLICT (journal, ino) DO UPDATE SET seq = GREATEST(journal_marks.seq, excluded.seq)",
            &[&(ino as i64), &(size as i64), &(data_bytes as i64), &mtime.0, &ctime.0, &(jseq.min(i64::MAX as u64) as i64), &self.journal()],
        )?;
        self.inode_changed(ino);
        Ok(())
    }
    fn set_nlink(&self, ino: Ino, nlink: u32, ctime: Timestamp) -> Result<()> {
        self.exec("UPDATE inodes SET nlink = $2, ctime = $3 WHERE ino = $1", &[&(ino as i64), &(nlink as i64), &ctime.0])?;
        self.inode_changed(ino);
        Ok(())
    }
    fn fix_nlink(&self, ino: Ino, nlink: u32) -> Result<()> {
        self.exec("UPDATE inodes SET nlink = $2 WHERE ino = $1", &[&(ino as i64), &(nlink as i64)])?;
        self.inode_changed(ino);
        Ok(())
    }
    fn set_parent(&self, ino: Ino, parent: Ino) -> Result<()> {
        self.exec("UPDATE inodes SET parent = $2 WHERE ino = $1", &[&(ino as i64), &(parent as i64)])?;
        self.inode_changed(ino);
        Ok(())
    }
    fn set_btime(&self, ino: Ino, btime: Timestamp) -> Result<()> {
        self.exec("UPDATE inodes SET btime = $2 WHERE ino = $1", &[&(ino as i64), &btime.0])?;
        self.inode_changed(ino);
        Ok(())
    }
    fn touch_dir(&self, ino: Ino, now: Timestamp, nlink_delta: i64) -> Result<()> {
        self.exec("UPDATE inodes SET mtime = $2, ctime = $2, nlink = nlink + $3 WHERE ino = $1", &[&(ino as i64), &now.0, &nlink_delta])?;
        self.inode_changed(ino);
        Ok(())
    }
    fn set_flags(&self, ino: Ino, flags: i64) -> Result<()> {
        self.exec("UPDATE inodes SET flags = $2 WHERE ino = $1", &[&(ino as i64), &flags])?;
        self.inode_changed(ino);
        Ok(())
    }
    /// `ON CONFLICT DO NOTHING`: a taken name does not abort the
    /// transaction (as a constraint error in SQLite does not). A name taken
    /// by a transaction this one cannot see fails it with a serialization
    /// error instead, and the re-run sees the winner.
    fn insert_dentry(&self, parent: Ino, name: &[u8], ino: Ino, kind: FileKind) -> Result<()> {
        let n = self.exec(
            "INSERT INTO dentries(parent, name, ino, kind) VALUES($1, $2, $3, $4) ON CONFLICT (parent, name) DO NOTHING",
            &[&(parent as i64), &name, &(ino as i64), &kind.code()],
        )?;
        if n == 0 {
            return Err(name_taken(parent, name));
        }
        self.entry_changed(parent, name);
        Ok(())
    }
    fn delete_dentry(&self, parent: Ino, name: &[u8], expect: Ino) -> Result<bool> {
        let gone = self.exec("DELETE FROM dentries WHERE parent = $1 AND name = $2 AND ino = $3", &[&(parent as i64), &name, &(expect as i64)])? == 1;
        if gone {
            self.entry_changed(parent, name);
        }
        Ok(gone)
    }
    fn delete_inode(&self, ino: Ino) -> Result<()> {
        let i = ino as i64;
        self.exec(
            "WITH m AS (DELETE FROM journal_marks WHERE ino = $1), o AS (DELETE FROM open_files WHERE ino = $1),
                  x AS (DELETE FROM xattrs WHERE ino = $1), f AS (DELETE FROM file_pages WHERE ino = $1)
             DELETE FROM inodes WHERE ino = $1",
            &[&i],
        )?;
        self.inode_changed(ino);
        Ok(())
    }
    /// Reads the inode and writes the row in one serializable
    /// transaction: an unlink elsewhere that read no row and freed the
    /// inode conflicts with it, and one of the two is retried.
    fn mark_open(&self, session: u64, ino: Ino, gen: u64) -> Result<bool> {
        // A row of a session that is gone would keep the file forever. One
        // statement (a create runs this inside its transaction: a round
        // trip saved per create). FOR SHARE: an unlink at READ COMMITTED
        // locks the inode FOR UPDATE before it asks whether anyone has it
        // open, so the two queue and the unlink sees this row (or this
        // finds the inode gone), never both missing each other.
        let r = self.one(
            "WITH s AS (SELECT EXISTS (SELECT 1 FROM sessions WHERE id = $2) AS live),
                  ins AS (INSERT INTO open_files(ino, session, gen) SELECT $1, $2, $3
                          WHERE (SELECT live FROM s) AND EXISTS (SELECT 1 FROM inodes WHERE ino = $1 FOR SHARE)
                          ON CONFLICT (ino, session) DO UPDATE SET gen = excluded.gen RETURNING 1)
             SELECT (SELECT live FROM s), EXISTS (SELECT 1 FROM ins)",
            &[&(ino as i64), &(session as i64), &(gen as i64)],
        )?;
        if !col::<bool>(&r, 0)? {
            return Err(session_gone(session));
        }
        col(&r, 1)
    }
    fn mark_closed(&self, session: u64, rows: &[(Ino, u64)]) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let inos: Vec<i64> = rows.iter().map(|r| r.0 as i64).collect();
        let gens: Vec<i64> = rows.iter().map(|r| r.1 as i64).collect();
        self.exec(
            "DELETE FROM open_files o USING unnest($2::bigint[], $3::bigint[]) AS x(ino, gen)
             WHERE o.session = $1 AND o.ino = x.ino AND (x.gen = 0 OR o.gen = x.gen)",
            &[&(session as i64), &inos, &gens],
        )?;
        Ok(())
    }
    fn set_xattr(&self, ino: Ino, name: &[u8], value: &[u8]) -> Result<()> {
        self.exec(
            "INSERT INTO xattrs(ino, name, value) VALUES($1, $2, $3) ON CONFLICT (ino, name) DO UPDATE SET value = excluded.value",
            &[&(ino as i64), &name, &value],
        )?;
        self.inode_changed(ino);
        Ok(())
    }
    fn remove_xattr(&self, ino: Ino, name: &[u8]) -> Result<bool> {
        let gone = self.exec("DELETE FROM xattrs WHERE ino = $1 AND name = $2", &[&(ino as i64), &name])? > 0;
        if gone {
            self.inode_changed(ino);
        }
        Ok(gone)
    }
    fn copy_xattrs(&self, src: Ino, dst: Ino) -> Result<()> {
        self.exec("INSERT INTO xattrs(ino, name, value) SELECT $2, name, value FROM xattrs WHERE ino = $1", &[&(src as i64), &(dst as i64)])?;
        Ok(())
    }
    fn save_pages(&self, ino: Ino, ch: &PageEdits) -> Result<Vec<(i64, u64)>> {
        let i = ino as i64;
        for id in &ch.gained {
            if self.exec("UPDATE pages SET refs = refs + 1 WHERE id = $1", &[&(*id as i64)])? != 1 {
                return Err(Error::corrupt(format!("inode {ino}: shared page #{id} is missing")));
            }
        }
        let mut ids = Vec::new();
        for p in &ch.upserts {
            let id = if p.id == 0 {
                let id = self.int("INSERT INTO pages(refs, data) VALUES(1, $1) RETURNING id", &[&p.data])? as u64;
                let mut d = self.deltas.borrow_mut();
                for &c in &p.chunks {
                    *d.entry(c).or_default() += 1;
                }
                ids.push((p.key, id));
                id
            } else {
                p.id
            };
            self.exec(
                "INSERT INTO file_pages(ino, key, page) VALUES($1, $2, $3) ON CONFLICT (ino, key) DO UPDATE SET page = excluded.page",
                &[&i, &p.key, &(id as i64)],
            )?;
        }
        for k in &ch.deletes {
            self.exec("DELETE FROM file_pages WHERE ino = $1 AND key = $2", &[&i, k])?;
        }
        for (id, chunks) in &ch.dropped {
            self.unlink_page(*id, Some(chunks))?;
        }
        self.inode_changed(ino);
        Ok(ids)
    }
    /// One statement drops the links and counts the pages down (answering
    /// the data of those left unreferenced); one more deletes those pages.
    fn release_pages(&self, ino: Ino) -> Result<()> {
        let rows = self.query(
            "WITH f AS (DELETE FROM file_pages WHERE ino = $1 RETURNING page),
                  c AS (SELECT page, count(*) AS n FROM f GROUP BY page),
                  u AS (UPDATE pages p SET refs = p.refs - c.n FROM c WHERE p.id = c.page RETURNING p.id, p.refs, p.data)
             SELECT id, refs, CASE WHEN refs = 0 THEN data END, (SELECT count(*) FROM c) FROM u",
            &[&(ino as i64)],
        )?;
        self.inode_changed(ino);
        let Some(first) = rows.first() else { return Ok(()) };
        let linked: i64 = col(first, 3)?;
        if linked as usize != rows.len() {
            return Err(Error::corrupt(format!("inode {ino} links {} pages that do not exist", linked as usize - rows.len())));
        }
        let mut gone = Vec::new();
        let mut ids = Vec::new();
        for r in &rows {
            let (id, refs): (i64, i64) = (col(r, 0)?, col(r, 1)?);
            if refs < 0 {
                return Err(Error::corrupt(format!("page #{id}: link count went negative")));
            }
            if refs == 0 {
                let data: Vec<u8> = col(r, 2)?;
                self.store.codec.chunk_ids(&data, &mut ids).map_err(|e| e.context(format!("page #{id}")))?;
                gone.push(id);
            }
        }
        let mut deltas = self.deltas.borrow_mut();
        for c in ids {
            *deltas.entry(c).or_default() -= 1;
        }
        drop(deltas);
        if !gone.is_empty() {
            self.exec("DELETE FROM pages WHERE id = ANY($1)", &[&gone])?;
        }
        Ok(())
    }
    fn share_pages(&self, src: Ino, dst: Ino) -> Result<()> {
        self.exec("UPDATE pages SET refs = refs + 1 WHERE id IN (SELECT page FROM file_pages WHERE ino = $1)", &[&(src as i64)])?;
        self.exec("INSERT INTO file_pages(ino, key, page) SELECT $2, key, page FROM file_pages WHERE ino = $1", &[&(src as i64), &(dst as i64)])?;
        self.inode_changed(dst);
        Ok(())
    }
    fn set_info(&self, key: &str, value: i64) -> Result<()> {
        self.exec("INSERT INTO info(key, value) VALUES($1, $2) ON CONFLICT (key) DO UPDATE SET value = excluded.value", &[&key, &value])?;
        Ok(())
    }
    fn insert_chunk(&self, ch: &ChunkRow) -> Result<()> {
        // The hash is claimed atomically: another machine that stored the
        // same new chunk first wins, and this transaction learns it lost.
        let n = self.exec(
            INSERT_CHUNK_SQL,
            &[
                &(ch.id as i64),
                &&ch.hash[..],
                &(ch.pack as i64),
                &(ch.offset as i64),
                &(ch.stored_len as i64),
                &(ch.raw_len as i64),
                &(ch.flags as i64),
                &ch.refs,
            ],
        )?;
        if n == 0 {
            return Err(Error::new(
                ErrorKind::Raced,
                format!("chunk #{} (a new chunk) was stored by another machine at the same time", ch.id),
            ));
        }
        Ok(())
    }
    fn relocate_chunk(&self, id: u64, from: u64, to: u64, offset: u64) -> Result<()> {
        // `AND pack = $2`: two cleaners (one stalled past its lease) that
        // both planned to move this chunk must not both succeed; the
        // second would point the row at its own copy while the first's
        // transaction deletes the source, leaking one copy or naming a
        // pack gc already took.
        let n = self.exec("UPDATE chunks SET pack = $3, \"offset\" = $4 WHERE id = $1 AND pack = $2", &[&(id as i64), &(from as i64), &(to as i64), &(offset as i64)])?;
        if n == 0 {
            return Err(Error::new(ErrorKind::Raced, format!("chunk #{id} is no longer in pack #{from} (moved or freed by another machine since it was read)")));
        }
        Ok(())
    }
    fn insert_pack(&self, name: &str, size: u64, blobs: u64, dead_bytes: u64) -> Result<u64> {
        let now = Timestamp::now().0;
        Ok(self.int(
            "WITH u AS (DELETE FROM uploads WHERE name = $1)
             INSERT INTO packs(name, size, blobs, dead_bytes, dead_since, created, dead_mark)
             VALUES($1, $2, $3, $4::bigint, CASE WHEN $4::bigint > 0 THEN $5::bigint END, $5::bigint, $5::bigint) RETURNING id",
            &[&name, &(size as i64), &(blobs as i64), &(dead_bytes as i64), &now],
        )? as u64)
    }
    fn delete_pack(&self, pack: u64) -> Result<u64> {
        let p = pack as i64;
        let n = self.exec("DELETE FROM chunks WHERE pack = $1 AND refs = 0", &[&p])?;
        let live = self.int("SELECT COUNT(*) FROM chunks WHERE pack = $1", &[&p])?;
        if live > 0 {
            // Planned dead, but another machine referenced one of its
            // chunks since (found by hash): nothing is deleted, the
            // cleaner plans again.
            return Err(Error::new(ErrorKind::Raced, format!("pack #{pack} still holds {live} live chunks (referenced by another machine since it was planned)")));
        }
        self.exec("DELETE FROM packs WHERE id = $1", &[&p])?;
        Ok(n)
    }
    fn add_bill(&self, r: &BillRow) -> Result<()> {
        self.exec(
            "INSERT INTO bill(day, subsystem, item, requests, bytes) VALUES($1, $2, $3, $4, $5)
             ON CONFLICT (day, subsystem, item) DO UPDATE SET requests = bill.requests + excluded.requests, bytes = bill.bytes + excluded.bytes",
            &[&r.day, &r.subsystem, &r.item, &(r.requests as i64), &(r.bytes as i64)],
        )?;
        Ok(())
    }
    /// The bill table is made with the schema.
    fn ensure_bill_table(&self) -> Result<bool> {
        Ok(false)
    }
    /// The accrual columns are made with the schema.
    fn ensure_dead_accrual(&self) -> Result<bool> {
        Ok(false)
    }
    fn add_chunk_refs(&self, deltas: &HashMap<u64, i64>) -> Result<()> {
        let mut d = self.deltas.borrow_mut();
        for (&id, &n) in deltas {
            *d.entry(id).or_default() += n;
        }
        Ok(())
    }
}

/// A create found its name taken.
fn name_taken(parent: Ino, name: &[u8]) -> Error {
    Error::new(ErrorKind::Exists, format!("{} already exists in directory {parent}", String::from_utf8_lossy(name)))
}

/// An open-file row asked for by a session that was cleaned up.
fn session_gone(session: u64) -> Error {
    Error::new(ErrorKind::SessionLost, format!("metadata session {session} is gone (expired and cleaned up): this mount cannot register open files any more; remount"))
}

/// Settings of every pooled connection. `enable_seqscan = off`: every
/// statement on the hot path has an index to go by, but a statement
/// prepared while the volume's tables were small keeps a plan that scans
/// them whole until autovacuum's next ANALYZE (a minute or more) makes it
/// plan again; meanwhile a create or lookup read every row of `inodes`
/// and `dentries` (measured: 357 creates/s on a volume of 6,000 files
/// before its ANALYZE, 790 after). A statement with no index to use still
/// scans.
///
/// `jit = off`: a scan that `enable_seqscan = off` penalises is costed
/// past 10^10, far over `jit_above_cost` and the inlining and optimising
/// thresholds (10^5, 5·10^5), so PostgreSQL compiled such a statement
/// with LLVM at every execution: the cleaner's look at the packs
/// (`SUM(size) FROM packs`, every second on every mount) took 100–350 ms
/// of server CPU on an empty table instead of 0.02 ms, about half of the
/// server's statement time under a create or unlink load (BENCHMARKS
/// §16.7). No statement of the store is long enough for JIT to pay.
const SESSION_SETTINGS: &str = "SET enable_seqscan = off; SET jit = off";

/// How a try of a transaction begins.
#[derive(Clone, Copy)]
enum Mode<'a> {
    /// One snapshot, read only.
    Read,
    /// A write at SERIALIZABLE: conflicts fail it (40001) and it runs again.
    Serializable,
    /// A write at READ COMMITTED that locks the rows of `inos` and of the
    /// inodes `entries` name, in one ascending pass, first, after the
    /// volume's rename lock when asked.
    Locking { inos: &'a [Ino], entries: &'a [(Ino, &'a [u8])], rename_lock: bool },
}

/// Ends the transaction open on `c` without keeping anything; a
/// connection that cannot even do that is closed for good.
fn rollback(c: &mut Conn) {
    let _ = c.client.batch_execute("ROLLBACK");
}

impl PgMeta {
    /// One try of a transaction: `begin`, the closure (`tx` gives it the
    /// operations), for writes the reference counts, then COMMIT.
    fn attempt(&self, c: &mut Conn, mode: Mode, f: &mut dyn FnMut(&PgTx) -> Result<()>) -> Step<()> {
        // A write learns its transaction id in the same round trip, to
        // find out whether it committed if the reply to COMMIT is lost;
        // a locking write takes its first locks in it too.
        let write = !matches!(mode, Mode::Read);
        let lazy = write && !self.opts.sync_commit;
        let sync = if lazy { "off" } else { "on" };
        let begin = match mode {
            Mode::Read => "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY".to_string(),
            Mode::Serializable => format!("BEGIN ISOLATION LEVEL SERIALIZABLE; SET LOCAL synchronous_commit = {sync}; SELECT txid_current()"),
            Mode::Locking { inos, entries, rename_lock } => {
                // Integers, and names as hex: nothing to quote.
                let list = inos.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
                let rename = if rename_lock { format!("SELECT pg_advisory_xact_lock({}); ", self.rename_key) } else { String::new() };
                // The entries' inodes with the parents, in one ascending
                // pass (rows are locked in the sort's order): an rmdir and
                // a rename out of the removed directory never hold one
                // each while waiting for the other's.
                // The locked rows come back whole, and then the entries as
                // they are once their parents are locked: the closure's
                // first reads need no round trip of their own.
                let pairs = entries.iter().map(|(p, n)| format!("({p}, decode('{}', 'hex'))", hex(n))).collect::<Vec<_>>().join(", ");
                let named = if entries.is_empty() { String::new() } else { format!(" || ARRAY(SELECT ino FROM dentries WHERE (parent, name) IN ({pairs}))") };
                let from = INODE_FROM.replace("$J", &(self.journal.load(Ordering::SeqCst) as i64).to_string());
                let mut rows = String::new();
                if !inos.is_empty() || !entries.is_empty() {
                    rows = format!("; SELECT 'i', {INODE_COLS} FROM {from} WHERE i.ino = ANY(ARRAY[{list}]::bigint[]{named}) ORDER BY i.ino FOR UPDATE OF i");
                }
                if !entries.is_empty() {
                    rows += &format!("; SELECT 'e', parent, encode(name, 'hex'), ino, kind FROM dentries WHERE (parent, name) IN ({pairs})");
                }
                format!("BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL synchronous_commit = {sync}; {rename}SELECT txid_current(){rows}")
            }
        };
        let mut pre = None;
        let xid = match c.client.simple_query(&begin) {
            Ok(msgs) => {
                if let Mode::Locking { entries, .. } = mode {
                    match Prefetched::from_rows(&msgs, entries) {
                        Ok(p) => pre = Some(p),
                        Err(e) => {
                            rollback(c);
                            return Step::Done(Err(e));
                        }
                    }
                }
                msgs.iter().find_map(|m| match m {
                    pg::SimpleQueryMessage::Row(r) => r.get(0).and_then(|v| v.parse::<i64>().ok()),
                    _ => None,
                })
            }
            Err(e) => {
                // The batch opened the transaction before a statement of
                // it failed (a lock wait broken as a deadlock): end it, or
                // the retry's BEGIN finds it aborted (25P02).
                rollback(c);
                return Step::Failed(e);
            }
        };
        let tx = PgTx::new(c, self, write);
        *tx.pre.borrow_mut() = pre;
        let mut changes = None;
        let r = f(&tx).and_then(|()| {
            if write {
                changes = tx.finish()?;
            }
            Ok(())
        });
        let failed = tx.failed.take();
        drop(tx);
        match (r, failed) {
            (r, Some(e)) => {
                rollback(c);
                if classify(&e) != Class::Fatal {
                    return Step::Failed(e);
                }
                match r {
                    Err(err) => Step::Done(Err(err)),
                    // The closure went on past a failed statement: nothing
                    // of the aborted transaction can be kept.
                    Ok(()) => Step::Done(Err(pg_err("a statement failed in the transaction", &e))),
                }
            }
            (Err(e), None) => {
                rollback(c);
                Step::Done(Err(e))
            }
            (Ok(()), None) => {
                if write {
                    let hold = self.before_commit.lock().take();
                    if let Some(f) = hold {
                        // Tests: hold between the change rows (their seqs
                        // taken) and the COMMIT, as a slow commit does.
                        if let Some(sql) = changes.take() {
                            if let Err(e) = c.client.batch_execute(&sql) {
                                rollback(c);
                                return Step::Failed(e);
                            }
                        }
                        f();
                    }
                }
                // The change rows ride in the COMMIT's round trip, after
                // the fence: a session another machine removed commits
                // nothing (docs/shared-volume.md §7 "Fencing").
                let session = if write { self.session.load(Ordering::SeqCst) } else { 0 };
                let fence = if session != 0 { format!("SELECT {}.fence({session}); ", self.schema) } else { String::new() };
                let commit = match changes {
                    Some(sql) => fence + &sql + "COMMIT",
                    None => fence + "COMMIT",
                };
                // Counted before the COMMIT is sent: a sync that starts
                // once this write returned must prove it.
                if lazy {
                    self.lazy_begin(&c.ident);
                }
                let ident = c.ident.clone();
                let lost = match c.client.batch_execute(&commit) {
                    Ok(()) if self.lose_commit_reply.swap(false, Ordering::SeqCst) => None,
                    Ok(()) => {
                        if lazy {
                            self.lazy_end(&ident, true);
                        }
                        return Step::Done(Ok(()));
                    }
                    Err(e) if classify(&e) == Class::Reconnect && xid.is_some() => Some(e),
                    Err(e) if e.code().is_some_and(|c| c.code() == FENCED) => {
                        rollback(c);
                        return Step::Done(Err(fenced(session)));
                    }
                    Err(e) => {
                        if lazy {
                            self.lazy_end(&ident, false);
                        }
                        // The change rows' statement failed before COMMIT
                        // ran: the transaction is still open, aborted.
                        rollback(c);
                        return Step::Failed(e);
                    }
                };
                // The connection went away with COMMIT sent: it may have
                // committed. Running the closure again would then answer
                // Exists for a create that happened, or count a flush's
                // references twice; so ask.
                let xid = xid.unwrap_or_default();
                let outcome = self.commit_outcome(xid, &ident);
                if lazy {
                    self.lazy_end(&ident, matches!(outcome, Ok(true)));
                }
                match outcome {
                    Ok(true) => Step::Done(Ok(())),
                    Ok(false) => match lost {
                        Some(e) => Step::Failed(e),
                        None => Step::Done(Err(Error::io(format!("transaction {xid} did not commit")))),
                    },
                    Err(e) => Step::Done(Err(e)),
                }
            }
        }
    }

    /// Whether transaction `xid` committed (true) or aborted (false), asked
    /// on another connection, waiting while it is still in progress. Only
    /// a connection of the same server history (`ident`) can tell: after
    /// a crash the number may have gone to another transaction (the
    /// server hands out again the numbers whose use it did not flush),
    /// so then the outcome is unknown, an error.
    fn commit_outcome(&self, xid: i64, ident: &Ident) -> Result<bool> {
        let start = Instant::now();
        let what = format!("finding out whether transaction {xid} committed (the connection was lost at COMMIT)");
        self.run(&what, |c| loop {
            if c.ident != *ident {
                return Step::Done(Err(Error::io(format!(
                    "PostgreSQL metadata store: {what}: the server's history changed meanwhile (was {ident}, now {}): a crash or a failover; the outcome is unknown",
                    c.ident
                ))));
            }
            let status: Option<String> = match c.client.query_one("SELECT txid_status($1)", &[&xid]) {
                Ok(r) => r.get(0),
                Err(e) => return Step::Failed(e),
            };
            match status.as_deref() {
                Some("committed") => return Step::Done(Ok(true)),
                Some("aborted") => return Step::Done(Ok(false)),
                Some(_) if start.elapsed() < self.opts.timeout => std::thread::sleep(Duration::from_millis(10)),
                _ => return Step::Done(Err(Error::io(format!("PostgreSQL metadata store: {what}: the outcome is unknown ({status:?})")))),
            }
        })
    }

    /// A lazy COMMIT is about to be sent on a connection of `ident`.
    fn lazy_begin(&self, ident: &Ident) {
        let mut l = self.lazy.lock();
        match l.iter_mut().find(|x| x.ident == *ident) {
            Some(x) => x.inflight += 1,
            None => l.push(Lazy { ident: ident.clone(), inflight: 1, done: 0 }),
        }
    }

    /// That COMMIT's answer: committed, or not (then it needs no proof).
    fn lazy_end(&self, ident: &Ident, committed: bool) {
        let mut l = self.lazy.lock();
        if let Some(x) = l.iter_mut().find(|x| x.ident == *ident) {
            x.inflight = x.inflight.saturating_sub(1);
            if committed {
                x.done += 1;
            }
        }
        l.retain(|x| x.inflight > 0 || x.done > 0);
    }

    /// Tests: the next successful COMMIT is treated as if its reply were
    /// lost with the connection (the store must find out it committed).
    #[doc(hidden)]
    pub fn lose_next_commit_reply(&self) {
        self.lose_commit_reply.store(true, Ordering::SeqCst);
    }

    /// Tests: the next write transaction that gets to COMMIT runs `f`
    /// first, its change rows inserted (their seqs taken) but not
    /// committed.
    #[doc(hidden)]
    pub fn hold_next_commit(&self, f: impl FnOnce() + Send + 'static) {
        *self.before_commit.lock() = Some(Box::new(f));
    }
}

impl MetaStore for PgMeta {
    fn read(&self, f: &mut dyn FnMut(&dyn MetaRead) -> Result<()>) -> Result<()> {
        self.run("reading metadata", |c| self.attempt(c, Mode::Read, &mut |tx| f(tx)))
    }
    /// No BEGIN and no COMMIT: the one query is its own transaction (one
    /// round trip instead of three).
    fn read_one(&self, f: &mut dyn FnMut(&dyn MetaRead) -> Result<()>) -> Result<()> {
        self.run("reading metadata", |c| {
            let mut tx = PgTx::new(c, self, false);
            tx.single = Some(std::cell::Cell::new(0));
            let r = f(&tx);
            match tx.failed.take() {
                Some(e) if classify(&e) != Class::Fatal => Step::Failed(e),
                Some(e) => Step::Done(Err(r.err().unwrap_or_else(|| pg_err("a statement failed", &e)))),
                None => Step::Done(r),
            }
        })
    }
    fn write(&self, f: &mut dyn FnMut(&dyn MetaTx) -> Result<()>) -> Result<()> {
        self.check_not_lost()?;
        self.run("changing metadata", |c| self.attempt(c, Mode::Serializable, &mut |tx| f(tx)))
    }
    /// READ COMMITTED with the rows locked first (docs/shared-volume.md
    /// §4): every statement sees what committed before it, and the locks
    /// order this transaction against every other writer of those rows.
    fn write_locking(&self, inos: &[Ino], entries: &[(Ino, &[u8])], rename_lock: bool, f: &mut dyn FnMut(&dyn MetaTx) -> Result<()>) -> Result<()> {
        self.check_not_lost()?;
        let mut inos = inos.to_vec();
        inos.sort_unstable();
        inos.dedup();
        self.run("changing metadata", |c| self.attempt(c, Mode::Locking { inos: &inos, entries, rename_lock }, &mut |tx| f(tx)))
    }
    fn alloc_chunk_id(&self) -> Result<u64> {
        let mut b = self.chunk_ids.lock();
        loop {
            if b.history != self.history.load(Ordering::SeqCst) {
                *b = Block::default();
            }
            if let Some(v) = b.take(self.chunk_floor) {
                return Ok(v);
            }
            let history = self.history.load(Ordering::SeqCst);
            *b = self.run("reserving chunk ids", |c| match PgMeta::next_block(&mut c.client, "chunk_seq") {
                Ok(b) => Step::Done(Ok(b)),
                Err(e) => Step::Failed(e),
            })?;
            b.history = history;
            self.chunk_high.fetch_max(b.next, Ordering::SeqCst);
        }
    }
    /// Every `write` commits before it returns.
    fn commit(&self) -> Result<()> {
        self.check_alive()
    }
    /// A barrier: one small write committed with `synchronous_commit =
    /// on` waits for the WAL flush up to its commit record, and every
    /// commit that returned before (this machine's or another's: the WAL
    /// is one sequence) is in the WAL before it, if the server kept that
    /// WAL: so the lazy commits count as durable only when the barrier
    /// ran on the server history they were made on (`Ident`). A barrier
    /// on another one (the server crashed and recovered, or failed over,
    /// in between) cannot tell whether they survived: the store then
    /// counts them lost, this call and every later one fail, and the
    /// engine keeps its journal for the replay at the next mount
    /// (docs/shared-volume.md, "Durability across a database crash").
    fn sync(&self) -> Result<()> {
        self.check_alive()?;
        let _one = self.syncing.lock();
        if let Some(m) = &*self.lost.lock() {
            return Err(Error::io(m.clone()));
        }
        // The commits that returned before this call; later ones wait
        // for the next sync.
        let taken: Vec<(Ident, u64)> = {
            let mut l = self.lazy.lock();
            let t = l.iter_mut().filter(|x| x.done > 0).map(|x| (x.ident.clone(), std::mem::take(&mut x.done))).collect();
            l.retain(|x| x.inflight > 0 || x.done > 0);
            t
        };
        if taken.is_empty() {
            return Ok(());
        }
        let session = self.session.load(Ordering::SeqCst) as i64;
        let r = self.run("making metadata changes durable", |c| {
            let r = (|| -> std::result::Result<Ident, pg::Error> {
                let mut t = c.client.transaction()?;
                // Whatever the server's default is. The history is read
                // in the barrier itself, not taken from the connection's
                // setup: a pooler (PgBouncer) in between keeps a client
                // connection across a crash of the server behind it.
                let ident = ident_of(&t.simple_query(&format!("SET LOCAL synchronous_commit = on; {IDENT_SQL}"))?);
                // The session's own row (no machine contends for it); the
                // transaction must write something, or its commit is not
                // flushed.
                let n = t.execute("UPDATE sessions SET heartbeat = clock_timestamp() WHERE id = $1", &[&session])?;
                if n == 0 {
                    t.execute("INSERT INTO info(key, value) VALUES ('sync_barrier', 1) ON CONFLICT (key) DO UPDATE SET value = info.value + 1", &[])?;
                }
                t.commit()?;
                Ok(ident)
            })();
            match r {
                Ok(ident) => Step::Done(Ok(ident)),
                Err(e) => Step::Failed(e),
            }
        });
        let now = match r {
            Ok(now) => now,
            Err(e) => {
                // Still to prove.
                let mut l = self.lazy.lock();
                for (ident, n) in taken {
                    match l.iter_mut().find(|x| x.ident == ident) {
                        Some(x) => x.done += n,
                        None => l.push(Lazy { ident, inflight: 0, done: n }),
                    }
                }
                return Err(e);
            }
        };
        let gone: Vec<String> = taken.iter().filter(|(i, _)| *i != now).map(|(i, n)| format!("{n} on {i}")).collect();
        if gone.is_empty() {
            return Ok(());
        }
        let msg = format!(
            "PostgreSQL metadata store: metadata commits made without waiting for the WAL flush ({}) cannot be proven durable: \
             the server's history changed before they were flushed (a crash or a failover; now {now}), so they may be lost. \
             This mount keeps its write-back journal, refuses changes and syncs until it has replayed it on the new history (as a new mount would), then resumes",
            gone.join(", ")
        );
        tracing::error!("{msg}");
        *self.lost.lock() = Some(msg.clone());
        Err(Error::io(msg))
    }
    fn is_durable(&self) -> bool {
        self.lost.lock().is_none() && self.lazy.lock().is_empty()
    }
    fn is_lost(&self) -> bool {
        self.lost.lock().is_some()
    }
    /// Reads the server's history on a live connection (a new one after
    /// a failover, which also sets the sequences past this store's
    /// blocks), drops the lazy commits of every other history (the caller
    /// redoes them from its journal) and clears the loss. Commits made on
    /// the current history stay to be proven by the next `sync`.
    fn resume_after_loss(&self) -> Result<()> {
        self.check_alive()?;
        let _one = self.syncing.lock();
        if self.lost.lock().is_none() {
            return Ok(());
        }
        let now = self.run("reading the server's history", |c| match c.client.simple_query(IDENT_SQL) {
            Ok(m) => Step::Done(Ok(ident_of(&m))),
            Err(e) => Step::Failed(e),
        })?;
        self.saw(&now);
        let dropped: u64 = {
            let mut l = self.lazy.lock();
            let n = l.iter().filter(|x| x.ident != now).map(|x| x.done + x.inflight).sum();
            l.retain(|x| x.ident == now);
            n
        };
        *self.lost.lock() = None;
        tracing::warn!("PostgreSQL metadata store: resuming on {now} after the loss ({dropped} more unproven commits of the old history dropped; the journal redoes them)");
        Ok(())
    }
    /// Drops every connection (an open transaction dies with it, as with a
    /// `kill -9`) and refuses every later call.
    fn abandon(&self) {
        self.abandoned.store(true, Ordering::SeqCst);
        let old = std::mem::take(&mut *self.pool.lock());
        drop(old);
    }
    fn checkpoint(&self) -> Result<()> {
        self.check_alive()
    }
    /// A row in `sessions` expiring `ttl` from now on the database's clock;
    /// the id comes from `session_seq`. (A connection lost at the INSERT's
    /// reply may leave a row that is never renewed: it expires.)
    fn open_session(&self, who: &SessionInfo, ttl: Duration) -> Result<u64> {
        let id = self.stmt("opening a session", |c| {
            c.query_one(
                "INSERT INTO sessions(host, pid, mount, version, expires)
                 VALUES($1, $2, $3, $4, clock_timestamp() + $5::bigint * interval '1 microsecond') RETURNING id",
                &[&who.host, &(who.pid as i64), &who.mount, &who.version, &micros(ttl)],
            )
            .map(|r| r.get::<_, i64>(0) as u64)
        })?;
        self.session.store(id, Ordering::SeqCst);
        Ok(id)
    }
    /// Moves `expires` only while it is in the future (database clock):
    /// a lost session stays lost.
    fn renew_session(&self, id: u64, ttl: Duration) -> Result<()> {
        let n = self.stmt("renewing the session", |c| {
            c.execute(
                "UPDATE sessions SET expires = clock_timestamp() + $2::bigint * interval '1 microsecond', heartbeat = clock_timestamp()
                 WHERE id = $1 AND expires > clock_timestamp()",
                &[&(id as i64), &micros(ttl)],
            )
        })?;
        if n == 0 {
            return Err(Error::new(
                ErrorKind::SessionLost,
                format!("metadata session {id} expired (on the database's clock) or was removed before it was renewed: this mount must stop writing; remount"),
            ));
        }
        // Lazy commits of a mount that went quiet are proven now, not at
        // the next fsync: a crash of the server later cannot make them
        // suspect (docs/shared-volume.md, "Durability across a database
        // crash"). A failure is the next sync's to report.
        if !self.lazy.lock().is_empty() {
            let _ = self.sync();
        }
        Ok(())
    }
    /// Its open files and locks go in the same statement.
    fn close_session(&self, id: u64) -> Result<()> {
        self.stmt("closing the session", |c| c.execute(SESSION_DELETE, &[&(id as i64)]))?;
        let _ = self.session.compare_exchange(id, 0, Ordering::SeqCst, Ordering::SeqCst);
        Ok(())
    }
    fn sessions(&self) -> Result<Vec<SessionRow>> {
        self.session_rows(false)
    }
    fn expired_sessions(&self) -> Result<Vec<SessionRow>> {
        self.session_rows(true)
    }
    /// Its open files and locks go in the same statement.
    fn remove_session(&self, id: u64) -> Result<bool> {
        Ok(self.stmt("removing a session", |c| c.execute(SESSION_DELETE, &[&(id as i64)]))? > 0)
    }
    fn keeps_open_files(&self) -> bool {
        true
    }
    fn keeps_content_versions(&self) -> bool {
        true
    }
    fn fences_sessions(&self) -> bool {
        true
    }
    /// One statement: the row is inserted only while the session's row
    /// exists, which it holds `FOR KEY SHARE` until it commits, so a
    /// cleanup of the session either comes after (and the row names a
    /// gone session) or before (and nothing is recorded: SessionLost).
    fn begin_upload(&self, name: &str) -> Result<()> {
        let session = self.session.load(Ordering::SeqCst);
        if session == 0 {
            return Ok(());
        }
        let n = self.stmt("recording an upload", |c| {
            c.execute(
                "INSERT INTO uploads(name, session) SELECT $1, id FROM sessions WHERE id = $2 FOR KEY SHARE
                 ON CONFLICT (name) DO UPDATE SET session = excluded.session",
                &[&name, &(session as i64)],
            )
        })?;
        if n == 0 {
            return Err(fenced(session));
        }
        Ok(())
    }
    fn end_uploads(&self, names: &[&str]) -> Result<()> {
        if names.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        self.stmt("dropping upload records", |c| c.execute("DELETE FROM uploads WHERE name = ANY($1)", &[&names]))?;
        Ok(())
    }
    /// Keeps an older start: a round retried after a lost race is the
    /// same round. The row's key is not changed, so a commit's fence
    /// (`FOR KEY SHARE`) does not wait for it.
    fn flush_started(&self) -> Result<()> {
        let session = self.session.load(Ordering::SeqCst);
        if session == 0 {
            return Ok(());
        }
        self.stmt("recording a flush under way", |c| {
            c.execute(
                "UPDATE sessions SET flush_since = COALESCE(flush_since, floor(extract(epoch FROM clock_timestamp()))::bigint) WHERE id = $1",
                &[&(session as i64)],
            )
        })?;
        Ok(())
    }
    fn flush_ended(&self) -> Result<()> {
        let session = self.session.load(Ordering::SeqCst);
        if session == 0 {
            return Ok(());
        }
        self.stmt("recording a flush done", |c| c.execute("UPDATE sessions SET flush_since = NULL WHERE id = $1 AND flush_since IS NOT NULL", &[&(session as i64)]))?;
        Ok(())
    }
    /// Every session row counts, expired or not: one not yet cleaned up
    /// may still commit (its fence finds the row).
    fn oldest_flush(&self) -> Result<Option<i64>> {
        self.stmt("reading the flushes under way", |c| c.query_one("SELECT MIN(flush_since) FROM sessions", &[]).map(|r| r.get::<_, Option<i64>>(0)))
    }
    /// One statement: the records of gone sessions older than `grace`
    /// are deleted, the others listed (a data-modifying `WITH` and the
    /// outer query see the same snapshot, so the deleted ones are left
    /// out by name).
    fn uploads_in_flight(&self, grace: Duration) -> Result<Vec<String>> {
        let rows = self.stmt("listing uploads under way", |c| {
            c.query(
                "WITH d AS (DELETE FROM uploads u WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = u.session)
                              AND u.since < now() - $1::bigint * interval '1 microsecond' RETURNING name)
                 SELECT name FROM uploads WHERE name NOT IN (SELECT name FROM d) ORDER BY name",
                // Capped (an interval has a range): 100 years is forever here.
                &[&micros(grace.min(Duration::from_secs(100 * 365 * 86_400)))],
            )
        })?;
        rows.iter().map(|r| col(r, 0)).collect()
    }
    /// `pg_try_advisory_lock` on a connection of its own, keyed on the
    /// volume's schema: one holder across every machine. The lock lives as
    /// long as that connection (a dead holder's is released by the server).
    fn try_maintenance(&self) -> Result<Option<Box<dyn MaintenanceGuard>>> {
        self.check_alive()?;
        // Named after the volume: an operator (or a test) can tell which
        // volume's lock a connection holds.
        let app = format!("cairn-maintenance {}", self.schema);
        let mut client = connect_as(&self.cfg, self.opts.timeout, &app).map_err(|e| pg_err("connecting for the maintenance lock", &e))?;
        let got: bool = client
            .query_one("SELECT pg_try_advisory_lock($1)", &[&self.maintenance_key])
            .map_err(|e| pg_err("taking the maintenance lock", &e))?
            .get(0);
        Ok(got.then(|| Box::new(PgMaintenance { client, key: self.maintenance_key }) as Box<dyn MaintenanceGuard>))
    }
    fn changes_since(&self, after: u64, limit: usize) -> Result<Vec<Change>> {
        let mut c = ChangeCursor::at(after);
        self.read_changes_from(&mut c, limit, false)
    }
    /// Holes: the seqs missing in the `CURSOR_WINDOW` below the newest
    /// (above the highest trimmed), asked in the same statement.
    fn change_cursor(&self) -> Result<ChangeCursor> {
        let history = self.history.load(Ordering::SeqCst);
        let (top, holes) = self.stmt("reading the change log", |c| {
            c.query_one(
                "WITH m AS (SELECT COALESCE((SELECT MAX(seq) FROM changes), 0) AS top),
                      r AS (SELECT top, GREATEST(top - $1, COALESCE((SELECT value FROM info WHERE key = $2), 0), 0) AS lo FROM m)
                 SELECT top, ARRAY(SELECT s FROM r, generate_series(r.lo + 1, r.top - 1) AS s
                                   WHERE NOT EXISTS (SELECT 1 FROM changes WHERE seq = s) ORDER BY s)
                 FROM r",
                &[&(CURSOR_WINDOW as i64), &TRIMMED_KEY],
            )
            .map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, Vec<i64>>(1)))
        })?;
        let now = Instant::now();
        Ok(ChangeCursor { after: top, holes: holes.into_iter().map(|s| (s as u64, now)).collect(), hole_bound: self.hole_bound(), trimmed: 0, history })
    }
    fn read_changes(&self, cursor: &mut ChangeCursor, limit: usize) -> Result<Vec<Change>> {
        self.read_changes_from(cursor, limit, true)
    }
    /// The database server's clock.
    fn clock_secs(&self) -> Result<i64> {
        self.stmt("reading the server's clock", |c| c.query_one("SELECT floor(extract(epoch FROM clock_timestamp()))::bigint", &[]).map(|r| r.get::<_, i64>(0)))
    }
    fn last_change_seq(&self) -> Result<u64> {
        self.stmt("reading the change log", |c| c.query_one("SELECT COALESCE(MAX(seq), 0) FROM changes", &[]).map(|r| r.get::<_, i64>(0) as u64))
    }
    /// Keeps the newest row whatever its age, so `last_change_seq` never
    /// goes back; records the highest seq removed in `info` in the same
    /// statement (`changes_trimmed_through`). In batches of
    /// [`TRIM_BATCH`] rows, oldest seq first (the primary key's order;
    /// seqs are taken in time order), each its own statement and
    /// transaction: a log of millions of rows is trimmed in steps that
    /// each end well within the statement timeout and hold few locks.
    fn trim_changes(&self, older_than: Duration) -> Result<u64> {
        let mut total = 0u64;
        loop {
            let (n, looked) = self.stmt("trimming the change log", |c| {
                c.query_one(
                    "WITH b AS (SELECT seq, at FROM changes WHERE seq < (SELECT MAX(seq) FROM changes) ORDER BY seq LIMIT $3),
                          d AS (DELETE FROM changes WHERE seq IN (SELECT seq FROM b WHERE at < clock_timestamp() - $1::bigint * interval '1 microsecond')
                                RETURNING seq),
                          m AS (SELECT COUNT(*) AS n, MAX(seq) AS top FROM d),
                          u AS (INSERT INTO info(key, value) SELECT $2, top FROM m WHERE top IS NOT NULL
                                ON CONFLICT (key) DO UPDATE SET value = GREATEST(info.value, excluded.value))
                     SELECT n, (SELECT COUNT(*) FROM b) FROM m",
                    &[&micros(older_than), &TRIMMED_KEY, &TRIM_BATCH],
                )
                .map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, i64>(1)))
            })?;
            total += n;
            // A young row in the batch, or the log's end: done.
            if (n as i64) < looked || looked < TRIM_BATCH {
                return Ok(total);
            }
        }
    }
    fn changes_trimmed_through(&self) -> Result<u64> {
        self.stmt("reading the change log", |c| {
            c.query_one("SELECT COALESCE((SELECT value FROM info WHERE key = $1), 0)", &[&TRIMMED_KEY]).map(|r| r.get::<_, i64>(0) as u64)
        })
    }
    /// Marks of journal `id` in `journal_marks`; with `legacy`, the
    /// inodes' frozen `jseq` column is copied in first (never lowering a
    /// mark).
    fn set_journal(&self, id: u64, legacy: bool) -> Result<bool> {
        if id == 0 {
            return Err(Error::invalid("journal id 0 is reserved (no journal)"));
        }
        if legacy {
            let n = self.stmt("adopting the journal positions of a build without journal marks", |c| {
                c.execute(
                    "INSERT INTO journal_marks(journal, ino, seq) SELECT $1::bigint, ino, jseq FROM inodes WHERE jseq > 0
                     ON CONFLICT (journal, ino) DO UPDATE SET seq = GREATEST(journal_marks.seq, excluded.seq)",
                    &[&(id as i64)],
                )
            })?;
            tracing::info!(journal = format_args!("{id:016x}"), marks = n, "a journal from before journal marks adopted the positions recorded on the inodes");
        }
        self.journal.store(id, Ordering::SeqCst);
        Ok(true)
    }
    fn trim_journal_marks(&self, upto: u64) -> Result<u64> {
        let j = self.journal.load(Ordering::SeqCst);
        if j == 0 {
            return Err(Error::invalid("internal: trimming journal marks with no journal set"));
        }
        self.stmt("trimming the journal's marks", |c| {
            c.execute("DELETE FROM journal_marks WHERE journal = $1 AND seq <= $2", &[&(j as i64), &(upto.min(i64::MAX as u64) as i64)])
        })
    }
    fn subscribe(&self) -> Result<Option<Box<dyn ChangeFeed>>> {
        self.check_alive()?;
        let mut f = PgFeed {
            cfg: self.cfg.clone(),
            channel: self.schema.clone(),
            timeout: self.opts.timeout,
            client: None,
            checked: Instant::now(),
            own: self.session.clone(),
        };
        f.listen()?;
        Ok(Some(Box::new(f)))
    }
    /// One READ COMMITTED transaction: the inode's row is locked FOR
    /// UPDATE first (every lock change on an inode queues there, so two
    /// machines never both see no conflict), then its locks are read, the
    /// new set planned ([`locks::plan`]) and the owner's rows of that
    /// style replaced. An inode with no row (deleted) locks nothing: its
    /// locks are moot, the request is refused as NotFound.
    fn set_lock(&self, req: &LockRequest) -> Result<LockOutcome> {
        self.run("changing a file lock", |c| {
            let r = (|| -> std::result::Result<std::result::Result<LockOutcome, Error>, pg::Error> {
                let mut t = c.client.transaction()?;
                // Fenced first (the session's row before any other lock):
                // a session another machine removed, with its locks, takes
                // no lock again.
                if req.owner.session != 0 && t.query_opt("SELECT 1 FROM sessions WHERE id = $1 FOR KEY SHARE", &[&(req.owner.session as i64)])?.is_none() {
                    return Ok(Err(fenced(req.owner.session)));
                }
                if t.query_opt("SELECT 1 FROM inodes WHERE ino = $1 FOR UPDATE", &[&(req.ino as i64)])?.is_none() {
                    return Ok(Err(Error::new(ErrorKind::NotFound, format!("inode {} is gone: no lock to take", req.ino))));
                }
                let held = match lock_rows(t.query(LOCKS_ON, &[&(req.ino as i64)])?) {
                    Ok(h) => h,
                    Err(e) => return Ok(Err(e)),
                };
                match locks::plan(&held, req) {
                    Err(holder) => return Ok(Ok(LockOutcome::Conflict(holder))),
                    Ok(mine) => {
                        let flock = req.style == LockStyle::Flock;
                        let (sess, owner) = (req.owner.session as i64, req.owner.owner as i64);
                        t.execute("DELETE FROM locks WHERE ino = $1 AND session = $2 AND owner = $3 AND flock = $4", &[&(req.ino as i64), &sess, &owner, &flock])?;
                        for r in mine {
                            t.execute(
                                "INSERT INTO locks(ino, session, owner, flock, kind, lo, hi, pid) VALUES($1, $2, $3, $4, $5, $6, $7, $8)",
                                &[&(req.ino as i64), &sess, &owner, &flock, &r.kind.code(), &(r.start as i64), &(r.end as i64), &(r.pid as i64)],
                            )?;
                        }
                    }
                }
                t.commit()?;
                Ok(Ok(LockOutcome::Granted))
            })();
            match r {
                Ok(v) => Step::Done(v),
                Err(e) => Step::Failed(e),
            }
        })
    }
    fn test_lock(&self, req: &LockRequest) -> Result<Option<LockRow>> {
        let held = self.locks_on(req.ino)?;
        Ok(locks::conflict(&held, req))
    }
    fn release_locks(&self, ino: Ino, owner: LockOwner, style: LockStyle) -> Result<u64> {
        self.stmt("releasing file locks", |c| {
            c.execute(
                "DELETE FROM locks WHERE ino = $1 AND session = $2 AND owner = $3 AND flock = $4",
                &[&(ino as i64), &(owner.session as i64), &(owner.owner as i64), &(style == LockStyle::Flock)],
            )
        })
    }
    fn release_session_locks(&self, session: u64) -> Result<u64> {
        self.stmt("releasing a session's file locks", |c| c.execute("DELETE FROM locks WHERE session = $1", &[&(session as i64)]))
    }
    fn locks_on(&self, ino: Ino) -> Result<Vec<LockRow>> {
        let rows = self.stmt("reading file locks", |c| c.query(LOCKS_ON, &[&(ino as i64)]))?;
        lock_rows(rows)
    }
    fn locks_on_many(&self, inos: &[Ino]) -> Result<Vec<(Ino, LockRow)>> {
        let ids: Vec<i64> = inos.iter().map(|&i| i as i64).collect();
        let rows = self.stmt("reading file locks", |c| {
            c.query("SELECT session, owner, flock, kind, lo, hi, pid, ino FROM locks WHERE ino = ANY($1) ORDER BY ino, session, owner, lo", &[&ids])
        })?;
        let inos = rows.iter().map(|r| col::<i64>(r, 7).map(|i| i as Ino)).collect::<Result<Vec<_>>>()?;
        Ok(inos.into_iter().zip(lock_rows(rows)?).collect())
    }
}

/// Every lock on an inode, by owner and start.
const LOCKS_ON: &str = "SELECT session, owner, flock, kind, lo, hi, pid FROM locks WHERE ino = $1 ORDER BY session, owner, lo";

fn lock_rows(rows: Vec<Row>) -> Result<Vec<LockRow>> {
    rows.iter()
        .map(|r| {
            Ok(LockRow {
                owner: LockOwner { session: col::<i64>(r, 0)? as u64, owner: col::<i64>(r, 1)? as u64 },
                style: if col::<bool>(r, 2)? { LockStyle::Flock } else { LockStyle::Posix },
                kind: LockKind::from_code(col(r, 3)?)?,
                start: col::<i64>(r, 4)? as u64,
                end: col::<i64>(r, 5)? as u64,
                pid: col::<i64>(r, 6)? as u32,
            })
        })
        .collect()
}

/// How far below the newest change a new cursor looks for seqs still
/// committing ([`MetaRead::change_cursor`]).
const CURSOR_WINDOW: u64 = 65_536;

/// At most this many holes per cursor (the lowest go first, with a
/// warning): a sequence moved by hand (`setval`) must not make every read
/// carry millions of seqs.
const MAX_HOLES: usize = 65_536;

impl PgMeta {
    /// How long a reader asks for a missing seq: twice the operation
    /// deadline plus 10 s (70 s by default). A transaction takes its seqs
    /// in its last statement before COMMIT, so it is done (committed or
    /// rolled back) well within this unless the server stalls its commit
    /// that long.
    pub fn hole_bound(&self) -> Duration {
        self.opts.timeout.saturating_mul(2) + Duration::from_secs(10)
    }

    /// `changes_since` (`holes` false: rows after `cursor.after` only) or
    /// `read_changes`.
    fn read_changes_from(&self, cur: &mut ChangeCursor, limit: usize, holes: bool) -> Result<Vec<Change>> {
        let history = self.history.load(Ordering::SeqCst);
        if holes && cur.history != history {
            // Another server history: its seqs say nothing about the old
            // one's. From its newest row on; the caller sees `history`
            // changed and drops what it cached.
            let top = self.last_change_seq()?;
            tracing::warn!(was = cur.after, now = top, "PostgreSQL metadata store: change cursor reset after the server's history changed");
            *cur = ChangeCursor { after: top, hole_bound: self.hole_bound(), history, ..Default::default() };
            return Ok(Vec::new());
        }
        let started = Instant::now();
        let asked: Vec<i64> = if holes { cur.holes.keys().map(|&s| s as i64).collect() } else { Vec::new() };
        // The trim mark rides along (one row with a NULL seq when there
        // are no changes), in the rows' snapshot. The rows after the
        // cursor and the holes below it are two index ranges: as one
        // `seq > $1 OR seq = ANY(..)` the index was walked from its start,
        // every read costing the whole log (an open per create slowed from
        // 690 to 244/s as 6,000 files went by).
        let rows = self.stmt("reading the change log", |c| {
            c.query(
                "SELECT c.seq, c.kind, c.ino, c.parent, c.name, c.session, t.trimmed
                 FROM (SELECT COALESCE((SELECT value FROM info WHERE key = $4), 0) AS trimmed) t
                 LEFT JOIN LATERAL (SELECT * FROM (
                      (SELECT seq, kind, ino, parent, name, session FROM changes WHERE seq > $1 ORDER BY seq LIMIT $2)
                      UNION ALL
                      (SELECT seq, kind, ino, parent, name, session FROM changes WHERE seq = ANY($3::bigint[]) AND seq <= $1)
                  ) u ORDER BY seq LIMIT $2) c ON true
                 ORDER BY c.seq",
                &[&(cur.after.min(i64::MAX as u64) as i64), &(limit.min(i64::MAX as usize) as i64), &asked, &TRIMMED_KEY],
            )
        })?;
        let trimmed = match rows.first() {
            Some(r) => col::<i64>(r, 6)? as u64,
            None => 0,
        };
        let rows = rows
            .iter()
            .filter(|r| matches!(r.try_get::<_, Option<i64>>(0), Ok(Some(_))))
            .map(|r| {
                let kind: i16 = col(r, 1)?;
                let what = match kind {
                    CHANGE_INODE => Changed::Inode(col::<Option<i64>>(r, 2)?.unwrap_or(0) as u64),
                    CHANGE_ENTRY => Changed::Entry { parent: col::<Option<i64>>(r, 3)?.unwrap_or(0) as u64, name: col::<Option<Vec<u8>>>(r, 4)?.unwrap_or_default() },
                    k => return Err(Error::corrupt(format!("change log: unknown kind {k}"))),
                };
                Ok(Change { seq: col::<i64>(r, 0)? as u64, what, session: col::<Option<i64>>(r, 5)?.map(|s| s as u64) })
            })
            .collect::<Result<Vec<Change>>>()?;
        if !rows.is_empty() {
            cur.trimmed = trimmed;
        }
        if !holes {
            if let Some(last) = rows.last() {
                cur.after = last.seq;
            }
            return Ok(rows);
        }
        // A seq missing now was taken before the larger one read was
        // committed, so before now: its transaction ends within the bound
        // from now.
        let seen = Instant::now();
        let bound = self.hole_bound();
        cur.hole_bound = bound;
        for ch in &rows {
            if ch.seq > cur.after {
                for h in (cur.after + 1).max(ch.seq.saturating_sub(MAX_HOLES as u64))..ch.seq {
                    cur.holes.insert(h, seen);
                }
                cur.after = ch.seq;
            } else {
                cur.holes.remove(&ch.seq);
            }
        }
        // Forgotten only after a read that began past the bound.
        cur.holes.retain(|_, t| started.saturating_duration_since(*t) < bound);
        if cur.holes.len() > MAX_HOLES {
            let drop = cur.holes.len() - MAX_HOLES;
            tracing::warn!(dropped = drop, "PostgreSQL metadata store: more than {MAX_HOLES} change seqs missing below seq {}; no longer waiting for the lowest", cur.after);
            let keep = cur.holes.split_off(&cur.holes.keys().nth(drop).copied().unwrap_or(u64::MAX));
            cur.holes = keep;
        }
        Ok(rows)
    }

    /// One statement in its own (autocommit) transaction, with the store's
    /// retries.
    fn stmt<T>(&self, what: &str, mut f: impl FnMut(&mut Cached) -> std::result::Result<T, pg::Error>) -> Result<T> {
        self.run(what, |c| match f(&mut Cached(c)) {
            Ok(v) => Step::Done(Ok(v)),
            Err(e) => Step::Failed(e),
        })
    }

    fn session_rows(&self, expired_only: bool) -> Result<Vec<SessionRow>> {
        let rows = self.stmt("listing sessions", |c| {
            c.query(
                "SELECT id, host, pid, mount, version, (extract(epoch FROM started) * 1000000000)::bigint,
                        (extract(epoch FROM expires) * 1000000000)::bigint, expires <= clock_timestamp()
                 FROM sessions WHERE NOT $1 OR expires <= clock_timestamp() ORDER BY id",
                &[&expired_only],
            )
        })?;
        rows.iter()
            .map(|r| {
                Ok(SessionRow {
                    id: col::<i64>(r, 0)? as u64,
                    host: col(r, 1)?,
                    pid: col::<i64>(r, 2)? as u32,
                    mount: col(r, 3)?,
                    version: col(r, 4)?,
                    started: Timestamp(col(r, 5)?),
                    expires: Timestamp(col(r, 6)?),
                    expired: col(r, 7)?,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgpass_fields_wildcards_and_escapes() {
        let f = "# comment\n\
                 db1:5432:vol:alice:first\n\
                 *:5432:*:bob:b\\:o\\\\b\n\
                 host\\:x:*:*:*:colon-host\n\
                 short:line\n\
                 *:*:*:*:fallback:with:colons\n";
        assert_eq!(pgpass_lookup(f, "db1", "5432", "vol", "alice").as_deref(), Some("first"));
        assert_eq!(pgpass_lookup(f, "db2", "5432", "x", "bob").as_deref(), Some("b:o\\b"), "escapes in the password");
        assert_eq!(pgpass_lookup(f, "host:x", "1", "d", "u").as_deref(), Some("colon-host"), "an escaped colon in a field");
        assert_eq!(pgpass_lookup(f, "db1", "5433", "vol", "alice").as_deref(), Some("fallback:with:colons"), "first match wins; the last field keeps colons");
        assert_eq!(pgpass_lookup("db1:5432:vol:alice:pw\n", "db1", "5432", "vol", "carol"), None);
        assert_eq!(pgpass_lookup("", "a", "1", "b", "c"), None);
    }

    #[test]
    fn a_password_in_the_url_is_refused() {
        let e = config("postgres://cairn:secret@db:5432/cairn").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert!(e.to_string().contains("PGPASSWORD") && e.to_string().contains("pgpass"), "{e}");
        assert!(config("postgres://cairn@db:5432/cairn").is_ok());
    }

    #[test]
    fn a_group_readable_password_file_is_ignored() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("pgpass");
        std::fs::write(&p, "*:*:*:*:pw\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert_eq!(read_pgpass(&p), None);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_pgpass(&p).as_deref(), Some("*:*:*:*:pw\n"));
    }

    /// The only test that touches the environment.
    #[test]
    fn the_password_comes_from_pgpassword_else_the_password_file() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("pgpass");
        std::fs::write(&p, "other:5432:vol:cairn:no\ndb:5432:vol:cairn:s3cret\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::env::remove_var("PGPASSWORD");
        std::env::set_var("PGPASSFILE", &p);
        let pw = |url: &str| config(url).unwrap().get_password().map(|p| String::from_utf8_lossy(p).into_owned());
        assert_eq!(pw("postgres://cairn@db:5432/vol").as_deref(), Some("s3cret"));
        assert_eq!(pw("postgres://cairn@db/vol").as_deref(), Some("s3cret"), "the default port matches 5432");
        assert_eq!(pw("postgres://cairn@db:5432/elsewhere"), None);
        std::env::set_var("PGPASSWORD", "from-env");
        assert_eq!(pw("postgres://cairn@db:5432/vol").as_deref(), Some("from-env"), "PGPASSWORD comes first");
        std::env::remove_var("PGPASSWORD");
        std::env::remove_var("PGPASSFILE");
    }

    #[test]
    fn volume_ids_are_plain_identifiers() {
        assert_eq!(schema_name("abc_12").unwrap(), "cairn_abc_12");
        for bad in ["", "A", "a-b", "a;drop", "x y", &"a".repeat(58)] {
            assert_eq!(schema_name(bad).unwrap_err().kind(), ErrorKind::Invalid, "{bad:?}");
        }
    }
}
