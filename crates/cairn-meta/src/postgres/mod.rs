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
pub const PG_SCHEMA_VERSION: i64 = 8;

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

/// The server's clock in whole seconds, as `clock_secs` reads it; inside a
/// statement, the time its transaction started. A macro so that the
/// statements using it are constants (no `format!` per chunk on the flush
/// path).
macro_rules! db_secs {
    () => {
        "floor(extract(epoch FROM now()))::bigint"
    };
}

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

/// A connection whose statements are prepared once (`PgMeta::stmt`).
struct Cached<'a>(&'a mut Conn);

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

/// The maintenance lock: a session-level advisory lock held by a
/// connection of its own. If that connection dies, the server releases
/// the lock (and `still_held` says so).
struct PgMaintenance {
    client: Client,
    key: i64,
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

type P<'a> = &'a (dyn ToSql + Sync);

mod changes;
mod connection;
mod schema;
mod shared;
mod store;
mod tx;

use changes::*;
pub use connection::*;
pub use schema::*;
#[allow(unused_imports)]
pub use store::*;
#[allow(unused_imports)]
pub use tx::*;

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
