//! The embedded SQLite store: WAL mode (schema v2).
//!
//! A read-write open uses one connection in exclusive locking mode behind a
//! mutex: the volume lock already guarantees no other process touches the
//! database, and exclusive mode drops the per-transaction file and
//! shared-memory locks (11 fcntl calls per create+unlink with a reader pool)
//! and keeps one page cache valid (3 preads per operation fewer). Statements
//! are microseconds; flush commits are split so no transaction is long.
//! A read-only open (`stats` on an unmounted volume) uses normal locking.
//! Changes are grouped into one SQLite transaction for up to
//! [`GROUP_WINDOW`] (each change a savepoint), committed by a committer
//! thread or by `sync`. Statements are cached (`prepare_cached`).

use crate::error::{Error, Result};
use crate::types::{Attr, FileKind, Ino, Timestamp};
use crate::*;
use parking_lot::Mutex;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Schema version this build reads and writes.
pub const SCHEMA_VERSION: i64 = 3;

/// How long a write transaction may stay open to take more changes (group
/// commit), and how many changes it may take.
///
/// One connection serves every request, so a change left uncommitted is
/// already seen by the next statements: nobody waits for the window. It
/// only bounds what a `kill -9` of the daemon loses of changes nobody
/// fsync'd (a kernel crash loses up to 5 s of them on ext4), while
/// `SqliteMeta::sync` (every fsync, fsyncdir and ordering barrier) commits first.
/// Each commit rewrites the WAL frames of every page it touched, so an untar
/// wrote 28.8 KiB of WAL per file in 4.3 commits; grouped, a page touched
/// by many changes is written once per window.
pub const GROUP_WINDOW: std::time::Duration = std::time::Duration::from_millis(10);
const GROUP_MAX: u32 = 1024;

/// The connection and the state of the write transaction on it.
struct Conn {
    /// Records committed changes for shipping (cloud volumes, see
    /// [`SqliteMeta::capture_changes`]). Declared before `c` so it is dropped first.
    capture: Option<Capture>,
    c: Connection,
    /// When the open write transaction (if any) began.
    open_since: Option<std::time::Instant>,
    /// Changes in it.
    pending: u32,
    /// Set when a group commit failed: changes already acknowledged were
    /// rolled back, so memory and database disagree until a remount
    /// replays the journal. Every later change fails with this message.
    broken: Option<String>,
    /// Inode numbers handed out by `alloc_ino`.
    ids: Ids,
}

/// Inode-number allocation state: the next number and the reserved
/// high-water mark (`info.ino_high`) as committed in this transaction.
/// `next` 0: not loaded yet (read at the first allocation).
#[derive(Default)]
struct Ids {
    next: Cell<u64>,
    reserved: Cell<u64>,
}

/// Numbers reserved at a time: the transaction that hands out a number
/// past the reserved range records a new high-water mark this far ahead,
/// so a create costs no extra statement.
const INO_RESERVE: u64 = 4096;

/// A SQLite session on the connection of the [`Conn`] that holds it.
struct Capture(rusqlite::session::Session<'static>);

// SAFETY: the session is only touched under the `Conn` mutex, like the
// connection it records (SQLite is built thread-safe; a session is tied to
// its connection, not to a thread).
unsafe impl Send for Capture {}

/// What the committer thread shares with [`SqliteMeta`].
struct Shared {
    conn: Mutex<Conn>,
    /// Wakes the committer: a transaction opened, or stop.
    wake: parking_lot::Condvar,
    stop: std::sync::atomic::AtomicBool,
    /// Write transactions committed so far (counted after each commit, under
    /// the connection lock).
    commits: AtomicU64,
    /// Write transactions rolled back so far (an inode-number reservation
    /// made in one must be made again).
    rollbacks: AtomicU64,
    window: std::time::Duration,
}

/// The SQLite metadata store.
pub struct SqliteMeta {
    path: PathBuf,
    /// This open upgraded the schema ([`MetaStore::schema_upgraded`]).
    upgraded: std::sync::atomic::AtomicBool,
    shared: std::sync::Arc<Shared>,
    /// Every commit up to this number is known durable (its WAL frames were
    /// fsync'd). Starts below `commits`, so the first sync always runs.
    durable: AtomicU64,
    /// Held by the one caller fsyncing the WAL: callers that arrive
    /// meanwhile wait for it, then find their commits durable (group
    /// commit: concurrent fsyncs share one device flush).
    syncing: parking_lot::Mutex<()>,
    /// Commits open write transactions when their window ends.
    committer: Option<std::thread::JoinHandle<()>>,
    /// Reads chunk references out of pages the store frees.
    codec: Arc<dyn PageCodec>,
    /// The next chunk id (`alloc_chunk_id`), read at the open (not at the
    /// first call: that may come inside a transaction, under the lock).
    next_chunk: AtomicU64,
}

impl Drop for SqliteMeta {
    fn drop(&mut self) {
        // Under the connection's lock: the committer checks `stop` and
        // starts waiting under it, so a stop set between the two would
        // wake nobody and the join would wait forever.
        {
            let _g = self.shared.conn.lock();
            self.shared.stop.store(true, Ordering::SeqCst);
        }
        self.shared.wake.notify_all();
        if let Some(t) = self.committer.take() {
            let _ = t.join();
        }
    }
}

/// A transaction (or a read) on the connection: the typed operations of
/// [`MetaRead`] and [`MetaTx`] as SQL. Chunk reference changes of page
/// operations accumulate in `deltas` and are applied by `finish`.
struct SqlTx<'a> {
    c: &'a Connection,
    codec: &'a dyn PageCodec,
    /// None for reads.
    ids: Option<&'a Ids>,
    deltas: RefCell<HashMap<u64, i64>>,
}

mod connection;
mod queries;
mod schema;
mod ship;
mod store;
mod tx;

pub use queries::*;
use schema::*;
pub use ship::*;
#[allow(unused_imports)]
pub use tx::*;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MetaStoreExt;
    use crate::conformance::TestCodec;

    fn codec() -> Arc<dyn PageCodec> {
        Arc::new(TestCodec)
    }

    /// Makes the committer pause between its stop check and its wait.
    pub(super) static PAUSE_BEFORE_WAIT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

    /// Dropping a store returns even when the committer is between its
    /// stop check and its wait. With the stop set outside the committer's
    /// lock the wake-up was lost there and the join waited forever (a full
    /// test run hung so); the committer pauses in that gap here, and a
    /// watchdog turns a hang into a failure.
    #[test]
    fn dropping_a_store_never_hangs() {
        use std::sync::atomic::AtomicBool;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.sqlite");
        SqliteMeta::create(&path, Caller0 { uid: 0, gid: 0, perm: 0o755 }).unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let watchdog = {
            let done = done.clone();
            std::thread::spawn(move || {
                let end = std::time::Instant::now() + std::time::Duration::from_secs(60);
                while !done.load(Ordering::SeqCst) {
                    if std::time::Instant::now() > end {
                        eprintln!("dropping a SqliteMeta hung: the committer missed its stop");
                        std::process::abort();
                    }
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
            })
        };
        PAUSE_BEFORE_WAIT.store(true, Ordering::SeqCst);
        for i in 0..20u32 {
            let m = SqliteMeta::open(&path, true, GROUP_WINDOW, codec()).unwrap();
            if i % 2 == 1 {
                m.write_with(|tx| -> Result<()> { tx.set_info("drop_test", i as i64) }).unwrap();
                m.commit().unwrap();
            }
            // Into the gap: the committer checked `stop` and sleeps before
            // its wait.
            std::thread::sleep(std::time::Duration::from_millis(5));
            drop(m);
        }
        PAUSE_BEFORE_WAIT.store(false, Ordering::SeqCst);
        done.store(true, Ordering::SeqCst);
        watchdog.join().unwrap();
    }

    /// A database with `n` chunks of 100 stored bytes in two packs; chunk
    /// `i` (1-based) starts with `i % 3` references.
    fn db(n: u64) -> (tempfile::TempDir, SqliteMeta) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.sqlite");
        SqliteMeta::create(&path, Caller0 { uid: 0, gid: 0, perm: 0o755 }).unwrap();
        let m = SqliteMeta::open(&path, true, GROUP_WINDOW, codec()).unwrap();
        m.write_with(|tx| -> Result<()> {
            // Dead bytes as the invariant wants them: chunks nobody references.
            let dead = |p: u64| (1..=n).filter(|i| 1 + i % 2 == p && i % 3 == 0).count() as u64 * 100;
            for (p, name) in [(1, "a"), (2, "b")] {
                tx.insert_pack(name, 1 << 20, n, dead(p))?;
            }
            for i in 1..=n {
                let mut hash = [0u8; 32];
                hash[..8].copy_from_slice(&i.to_le_bytes());
                let refs = (i % 3) as i64;
                tx.insert_chunk(&ChunkRow { id: i, hash, pack: 1 + i % 2, offset: i * 100, stored_len: 100, raw_len: 100, flags: 0, refs, zero_since: None })?;
            }
            Ok(())
        })
        .unwrap();
        (dir, m)
    }

    fn state(m: &SqliteMeta) -> (Vec<(u64, i64)>, Vec<(u64, u64)>) {
        m.read_with(|c| -> Result<_> {
            let chunks = c.all_chunks()?.into_iter().map(|r| (r.id, r.refs)).collect::<Vec<_>>();
            let packs = c.all_packs()?.into_iter().map(|p| (p.id, p.dead_bytes)).collect();
            let mut chunks = chunks;
            chunks.sort();
            Ok((chunks, packs))
        })
        .unwrap()
    }

    /// Both paths (a few deltas, thousands) against the obvious model:
    /// counts add up and each pack's dead bytes are its unreferenced chunks'.
    #[test]
    fn ref_deltas_match_model_small_and_bulk() {
        for count in [10u64, 3000] {
            let (_d, m) = db(count + 5);
            let (before, _) = state(&m);
            let mut deltas = HashMap::new();
            for i in 1..=count {
                // Mixed deltas, never below zero: +1, +2, -refs (to zero), 0.
                let refs = (i % 3) as i64;
                let d = match i % 4 { 0 => 1, 1 => 2, 2 => -refs, _ => 0 };
                deltas.insert(i, d);
            }
            m.write_with(|tx| tx.add_chunk_refs(&deltas)).unwrap();
            let (after, packs) = state(&m);
            let mut dead = HashMap::<u64, u64>::new();
            for (&(id, r0), &(id1, r1)) in before.iter().zip(&after) {
                assert_eq!(id, id1);
                assert_eq!(r1, r0 + deltas.get(&id).copied().unwrap_or(0), "chunk {id} ({count} deltas)");
                if r1 == 0 {
                    *dead.entry(1 + id % 2).or_default() += 100;
                }
            }
            for (p, d) in packs {
                assert_eq!(d, dead.get(&p).copied().unwrap_or(0), "pack {p} dead bytes ({count} deltas)");
            }
        }
    }

    /// Bad deltas fail and change nothing, on both paths.
    #[test]
    fn ref_deltas_refuse_unknown_and_negative() {
        for count in [10u64, 3000] {
            let (_d, m) = db(count);
            let before = state(&m);
            let mut deltas: HashMap<u64, i64> = (1..=count).map(|i| (i, 1)).collect();
            deltas.insert(count + 7, 1);
            let e = m.write_with(|tx| tx.add_chunk_refs(&deltas)).unwrap_err();
            assert!(e.to_string().contains(&format!("unknown chunk #{}", count + 7)), "{e}");
            let mut deltas: HashMap<u64, i64> = (1..=count).map(|i| (i, 1)).collect();
            deltas.insert(3, -1); // chunk 3 has no references
            let e = m.write_with(|tx| tx.add_chunk_refs(&deltas)).unwrap_err();
            assert!(e.to_string().contains("chunk #3 reference count would go negative"), "{e}");
            assert_eq!(state(&m), before);
        }
    }

    /// The bulk statements look chunks up by id: their cost follows the
    /// number of deltas, not the size of the chunks table.
    #[test]
    fn bulk_ref_statements_do_not_scan_chunks() {
        let (_d, m) = db(10);
        m.conn_read(|c| {
            for sql in [
                "SELECT id, refs, pack, stored_len FROM chunks WHERE id IN rarray(?1) ORDER BY id",
            ] {
                let ids: rusqlite::vtab::array::Array = std::rc::Rc::new(vec![rusqlite::types::Value::Integer(1)]);
                let mut st = c.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?;
                let mut q = if st.parameter_count() == 2 { st.query(params![ids, 1])? } else { st.query(params![ids])? };
                let mut plan = Vec::new();
                while let Some(r) = q.next()? {
                    plan.push(r.get::<_, String>(3)?);
                }
                assert!(plan.iter().any(|l| l.starts_with("SEARCH chunks")), "{sql}: {plan:?}");
                assert!(!plan.iter().any(|l| l.starts_with("SCAN chunks")), "{sql}: {plan:?}");
            }
            Ok(())
        })
        .unwrap();
    }

    fn fresh() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.sqlite");
        SqliteMeta::create(&path, Caller0 { uid: 0, gid: 0, perm: 0o755 }).unwrap();
        (dir, path)
    }

    fn info(m: &SqliteMeta, key: &str) -> Option<i64> {
        m.read_with(|c| c.get_info(key)).unwrap()
    }

    /// Group commit: a change is seen at once, durable after `sync`, and
    /// the window commits it without one.
    #[test]
    fn grouped_changes_are_seen_at_once_and_committed_by_sync_or_the_window() {
        let (_d, path) = fresh();
        let m = SqliteMeta::open(&path, true, GROUP_WINDOW, codec()).unwrap();
        let c0 = m.shared.commits.load(Ordering::SeqCst);
        for i in 0..10 {
            m.write_with(|tx| tx.set_info(&format!("k{i}"), i)).unwrap();
            assert_eq!(info(&m, &format!("k{i}")), Some(i), "a change is not seen by the next read");
        }
        assert!(m.shared.commits.load(Ordering::SeqCst) - c0 <= 1, "ten changes in a burst took several commits");
        m.sync().unwrap();
        assert!(m.is_durable());
        assert_eq!(m.shared.commits.load(Ordering::SeqCst), c0 + 1, "the burst was not one commit");
        // Without a sync, the committer ends the window.
        m.write_with(|tx| tx.set_info("late", 1)).unwrap();
        assert!(!m.is_durable());
        std::thread::sleep(GROUP_WINDOW * 5);
        assert!(m.shared.conn.lock().open_since.is_none(), "the window did not commit");
        assert_eq!(m.shared.commits.load(Ordering::SeqCst), c0 + 2);
        drop(m);
        let m = SqliteMeta::open(&path, true, GROUP_WINDOW, codec()).unwrap();
        assert_eq!((info(&m, "k9"), info(&m, "late")), (Some(9), Some(1)));
    }

    /// A failing change is undone alone: the changes grouped with it stay.
    #[test]
    fn a_failed_change_leaves_the_rest_of_its_group() {
        let (_d, path) = fresh();
        let m = SqliteMeta::open(&path, true, GROUP_WINDOW, codec()).unwrap();
        m.write_with(|tx| tx.set_info("a", 1)).unwrap();
        let r: Result<()> = m.write_with(|tx| {
            tx.set_info("b", 2)?;
            tx.set_info("a", 99)?;
            Err(Error::io("refused"))
        });
        assert!(r.is_err());
        assert_eq!(m.rollbacks(), 1);
        // A constraint error from SQLite itself, likewise.
        m.write_with(|tx| tx.insert_dentry(1, b"x", 1, FileKind::File)).unwrap();
        let r = m.write_with(|tx| {
            tx.set_info("c", 3)?;
            tx.insert_dentry(1, b"x", 2, FileKind::File)
        });
        assert!(r.is_err(), "a duplicate key was accepted");
        m.write_with(|tx| tx.set_info("d", 4)).unwrap();
        assert_eq!((info(&m, "a"), info(&m, "b"), info(&m, "c"), info(&m, "d")), (Some(1), None, None, Some(4)));
        m.sync().unwrap();
        drop(m);
        let m = SqliteMeta::open(&path, true, GROUP_WINDOW, codec()).unwrap();
        assert_eq!((info(&m, "a"), info(&m, "b"), info(&m, "c"), info(&m, "d")), (Some(1), None, None, Some(4)));
    }

    /// After a group was lost (here: abandoned, as a simulated crash does),
    /// no barrier may report the store durable, and no change is taken.
    #[test]
    fn a_lost_group_fails_every_later_barrier() {
        let (_d, path) = fresh();
        let m = SqliteMeta::open(&path, true, std::time::Duration::from_secs(3600), codec()).unwrap();
        m.write_with(|tx| tx.set_info("a", 1)).unwrap();
        m.abandon();
        assert!(m.sync().is_err(), "a barrier after a lost group succeeded");
        assert!(m.write_with(|tx| tx.set_info("b", 2)).is_err());
    }

    /// Fails, naming each difference, unless `m`'s schema is the one
    /// description of both stores' schemas (`crate::schema`).
    fn described(m: &SqliteMeta) {
        let diff = crate::schema::differences(&m.catalog().unwrap(), crate::schema::Dialect::Sqlite);
        assert!(diff.is_empty(), "the schema differs from crates/cairn-meta/src/schema.rs:\n{}", diff.join("\n"));
    }

    /// A new database (with the bill a cloud volume adds) has the
    /// described schema; so does one from before dead-byte accrual, once
    /// `ensure_dead_accrual` added its columns.
    #[test]
    fn the_schema_is_the_described_one() {
        let (_d, path) = fresh();
        let m = SqliteMeta::open(&path, true, std::time::Duration::ZERO, codec()).unwrap();
        assert!(m.write_with(|tx| tx.ensure_bill_table()).unwrap());
        described(&m);
        // The accrual columns come before schema 3's: drop those too, as
        // a schema 2 database from before the accrual has neither.
        m.conn_read(|c| {
            Ok(c.execute_batch("ALTER TABLE packs DROP COLUMN tier_since; ALTER TABLE packs DROP COLUMN tier; ALTER TABLE packs DROP COLUMN dead_mark; ALTER TABLE packs DROP COLUMN dead_acc")?)
        })
        .unwrap();
        assert!(!crate::schema::differences(&m.catalog().unwrap(), crate::schema::Dialect::Sqlite).is_empty(), "the columns did not go");
        assert!(m.write_with(|tx| tx.ensure_dead_accrual()).unwrap());
        m.conn_read(|c| Ok(c.execute_batch("ALTER TABLE packs ADD COLUMN tier INTEGER NOT NULL DEFAULT 0; ALTER TABLE packs ADD COLUMN tier_since INTEGER NOT NULL DEFAULT 0")?)).unwrap();
        described(&m);
    }

    /// The schema 2 DDL, as builds before pack tiers created it (with the
    /// dead-byte accrual columns a read-write open of such a build adds).
    const V2_SCHEMA: &str = "
CREATE TABLE info(key TEXT PRIMARY KEY, value) WITHOUT ROWID;
CREATE TABLE inodes(
  ino INTEGER PRIMARY KEY,
  kind INTEGER NOT NULL, perm INTEGER NOT NULL, uid INTEGER NOT NULL, gid INTEGER NOT NULL,
  rdev INTEGER NOT NULL DEFAULT 0, nlink INTEGER NOT NULL,
  size INTEGER NOT NULL DEFAULT 0, data_bytes INTEGER NOT NULL DEFAULT 0,
  atime INTEGER NOT NULL, mtime INTEGER NOT NULL, ctime INTEGER NOT NULL, btime INTEGER NOT NULL,
  parent INTEGER, target BLOB, jseq INTEGER NOT NULL DEFAULT 0, flags INTEGER NOT NULL DEFAULT 0);
CREATE TABLE dentries(parent INTEGER NOT NULL, name BLOB NOT NULL, ino INTEGER NOT NULL,
  kind INTEGER NOT NULL, PRIMARY KEY(parent, name)) WITHOUT ROWID;
CREATE TABLE xattrs(ino INTEGER NOT NULL, name BLOB NOT NULL, value BLOB NOT NULL,
  PRIMARY KEY(ino, name)) WITHOUT ROWID;
CREATE TABLE pages(id INTEGER PRIMARY KEY, refs INTEGER NOT NULL, data BLOB NOT NULL);
CREATE TABLE file_pages(ino INTEGER NOT NULL, key INTEGER NOT NULL, page INTEGER NOT NULL,
  PRIMARY KEY(ino, key)) WITHOUT ROWID;
CREATE TABLE packs(id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, size INTEGER NOT NULL,
  blobs INTEGER NOT NULL, dead_bytes INTEGER NOT NULL DEFAULT 0, dead_since INTEGER, created INTEGER NOT NULL,
  dead_acc REAL NOT NULL DEFAULT 0, dead_mark INTEGER);
CREATE TABLE chunks(id INTEGER PRIMARY KEY, hash BLOB NOT NULL UNIQUE, pack INTEGER NOT NULL,
  offset INTEGER NOT NULL, stored_len INTEGER NOT NULL, raw_len INTEGER NOT NULL, flags INTEGER NOT NULL,
  refs INTEGER NOT NULL);
CREATE INDEX chunks_pack ON chunks(pack);
INSERT INTO info(key, value) VALUES('schema', 2);
INSERT INTO inodes(ino, kind, perm, uid, gid, nlink, atime, mtime, ctime, btime, parent) VALUES(1, 2, 493, 0, 0, 2, 1, 1, 1, 1, 1);
INSERT INTO inodes(ino, kind, perm, uid, gid, nlink, size, atime, mtime, ctime, btime) VALUES(2, 1, 420, 5, 5, 1, 100, 1, 1, 1, 1);
INSERT INTO dentries(parent, name, ino, kind) VALUES(1, CAST('kept' AS BLOB), 2, 1);
INSERT INTO packs(id, name, size, blobs, created, dead_mark) VALUES(1, 'packs/old', 100, 1, 777000, 777000);
INSERT INTO chunks(id, hash, pack, offset, stored_len, raw_len, flags, refs) VALUES(1, zeroblob(32), 1, 0, 100, 100, 0, 1);
";

    /// A database of schema 2 (made by the DDL of the builds before pack
    /// tiers) opens read-write as schema 3: the described schema, its
    /// rows kept, its pack in the home tier since it was made, no pins,
    /// no restores; a read-only open of it is refused with what to do.
    #[test]
    fn a_schema_2_database_is_upgraded() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("meta.sqlite");
        Connection::open(&path).unwrap().execute_batch(V2_SCHEMA).unwrap();
        let e = SqliteMeta::open(&path, false, std::time::Duration::ZERO, codec()).err().expect("a read-only open of schema 2 went on");
        assert!(e.to_string().contains("open the volume read-write once"), "{e}");
        let m = SqliteMeta::open(&path, true, std::time::Duration::ZERO, codec()).unwrap();
        assert!(m.write_with(|tx| tx.ensure_bill_table()).unwrap());
        described(&m);
        assert_eq!(info(&m, "schema"), Some(SCHEMA_VERSION));
        assert_eq!(m.read_with(|r| r.lookup(1, b"kept")).unwrap(), Some((2, FileKind::File)));
        assert_eq!(m.read_with(|r| r.get_inode(2)).unwrap().unwrap().attr.size, 100);
        assert_eq!(m.read_with(|r| r.chunk_by_id(1)).unwrap().unwrap().pack, 1);
        assert_eq!(m.read_with(|r| r.pack_tier(1)).unwrap(), Some(PackTier { tier: TIER_HOME, since: 777000 }));
        assert_eq!(m.read_with(|r| r.tier_pin(2)).unwrap(), Some(PIN_AUTO));
        assert!(m.read_with(|r| r.list_restores()).unwrap().is_empty());
        // The new columns work, and a second open finds schema 3 as is.
        assert!(m.write_with(|tx| tx.set_tier_pin(1, PIN_COLD)).unwrap());
        m.sync().unwrap();
        drop(m);
        let m = SqliteMeta::open(&path, true, std::time::Duration::ZERO, codec()).unwrap();
        assert_eq!(m.read_with(|r| r.tier_pin(1)).unwrap(), Some(PIN_COLD));
        described(&m);
    }

    /// A `make` for the conformance checks: fresh databases in a
    /// directory of the test's own.
    fn conformance_maker() -> impl Fn(bool) -> Box<dyn MetaStore> {
        let dir = tempfile::tempdir().unwrap();
        let n = std::cell::Cell::new(0);
        move |fresh: bool| -> Box<dyn MetaStore> {
            if fresh {
                n.set(n.get() + 1);
            }
            let path = dir.path().join(format!("meta{}.sqlite", n.get()));
            if fresh {
                SqliteMeta::create(&path, Caller0 { uid: 0, gid: 0, perm: 0o755 }).unwrap();
            }
            Box::new(SqliteMeta::open(&path, true, GROUP_WINDOW, codec()).unwrap())
        }
    }

    /// The store contract (`docs/metadata-store.md`), as every store must
    /// keep it, one test per check. One SQLite database serves one process
    /// and one journal: it offers no SharedVolume (sessions, change log,
    /// locks, marks), so the shared checks are not run, and a test says
    /// so.
    mod contract {
        crate::conformance_tests!(super::conformance_maker(); core);
    }
}
