//! The PostgreSQL store against a real, throwaway PostgreSQL cluster
//! (`cairn_testing::postgres::PgServer`): the shared conformance suite, and
//! what only a store shared by several machines must get right (ids,
//! names and reference counts under concurrency, an outage of the server).
//! Without PostgreSQL's binaries these tests fail, saying what to install.

use cairn_meta::conformance::{self, test_page, TestCodec};
use cairn_meta::postgres::{PgMeta, PgOptions};
use cairn_meta::*;
use cairn_testing::postgres::PgServer;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn server() -> PgServer {
    let pg = PgServer::start().unwrap_or_else(|e| panic!("starting a PostgreSQL server for the tests: {e}"));
    pg.create_database("cairn").unwrap();
    pg
}

const ROOT: Caller0 = Caller0 { uid: 0, gid: 0, perm: 0o755 };

fn codec() -> Arc<dyn PageCodec> {
    Arc::new(TestCodec)
}

/// A fresh volume schema in database `cairn` (made on first use).
fn fresh(pg: &PgServer, id: &str) -> String {
    let url = pg.url("cairn");
    PgMeta::create(&url, id, ROOT).unwrap();
    url
}

fn open(url: &str, id: &str) -> Arc<PgMeta> {
    Arc::new(PgMeta::open(url, id, codec()).unwrap())
}

fn attr(ino: Ino, kind: FileKind) -> Attr {
    let t = Timestamp(1);
    Attr { ino, kind, perm: 0o644, nlink: 1, uid: 0, gid: 0, rdev: 0, size: 0, blocks: 0, atime: t, mtime: t, ctime: t, btime: t }
}

/// Creates `name` in `dir` as one transaction (lookup-free: the insert of
/// the entry decides).
fn create(s: &PgMeta, dir: Ino, name: &[u8]) -> Result<Ino> {
    s.write_with(|tx| -> Result<Ino> {
        let ino = tx.alloc_ino()?;
        tx.insert_inode(&attr(ino, FileKind::File), None, None, 0)?;
        tx.insert_dentry(dir, name, ino, FileKind::File)?;
        Ok(ino)
    })
}

/// The process's shared server (`cairn_testing::postgres::shared`): every
/// test here but those that stop, kill or count the connections of theirs
/// (`server()`) keeps to schemas of its own on it.
fn pg() -> Arc<PgServer> {
    cairn_testing::postgres::shared()
}

/// A `make` for the conformance checks: a fresh schema of the shared
/// server for each store it makes.
fn conformance_maker() -> impl Fn(bool) -> Box<dyn MetaStore> {
    static SCHEMAS: AtomicU32 = AtomicU32::new(0);
    let pg = pg();
    let last = std::cell::RefCell::new(String::new());
    move |new: bool| -> Box<dyn MetaStore> {
        if new {
            *last.borrow_mut() = format!("conf{}", SCHEMAS.fetch_add(1, Ordering::SeqCst));
        }
        let id = last.borrow().clone();
        let url = if new { fresh(&pg, &id) } else { pg.url("cairn") };
        Box::new(PgMeta::open(&url, &id, codec()).unwrap())
    }
}

/// The store contract (`docs/metadata-store.md`): the core checks, as the
/// SQLite store passes them, and the shared-volume checks (PostgreSQL
/// offers SharedVolume), one test per check.
mod contract {
    cairn_meta::conformance_tests!(super::conformance_maker(); shared);
}

/// Schema handling: a second create of the same volume is refused; an
/// unknown volume, or a schema that is not ours, is named in the error.
#[test]
fn schemas_are_checked_at_create_and_open() {
    let pg = pg();
    let url = fresh(&pg, "twice");
    let e = PgMeta::create(&url, "twice", ROOT).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Exists, "{e}");
    assert!(e.to_string().contains("cairn_twice"), "{e}");
    let e = PgMeta::open(&url, "nosuch", codec()).err().expect("a missing schema was opened");
    assert!(e.to_string().contains("cairn_nosuch"), "{e}");
    pg.psql("cairn", "CREATE SCHEMA cairn_alien; CREATE TABLE cairn_alien.info(key text, value bigint)").unwrap();
    let e = PgMeta::open(&url, "alien", codec()).err().expect("a schema without a version was opened");
    assert!(e.to_string().contains("cairn_alien") && e.to_string().contains("schema version"), "{e}");
}

/// Two stores on one schema ("two machines"), four threads each,
/// allocating inode numbers at once: no number is handed out twice.
#[test]
fn inode_numbers_from_two_machines() {
    let pg = &*pg();
    let url = fresh(pg, "ids");
    let stores = [open(&url, "ids"), open(&url, "ids")];
    let mut threads = Vec::new();
    for s in &stores {
        for _ in 0..4 {
            let s = s.clone();
            threads.push(std::thread::spawn(move || (0..300).map(|_| s.write_with(|tx| tx.alloc_ino()).unwrap()).collect::<Vec<_>>()));
        }
    }
    let mut seen = HashSet::from([ROOT_INO]);
    for t in threads {
        for ino in t.join().unwrap() {
            assert!(seen.insert(ino), "inode number {ino} was handed out twice");
        }
    }
    assert_eq!(seen.len(), 1 + 8 * 300);
}

/// Two stores create names in one directory from several threads, each
/// name tried by every thread: every name exists exactly once, every loser
/// gets Exists (never a serialization failure), and no loser's inode stays.
#[test]
fn same_and_different_names_from_two_machines() {
    let pg = &*pg();
    let url = fresh(pg, "names");
    let stores = [open(&url, "names"), open(&url, "names")];
    const SHARED: usize = 40;
    let mut threads = Vec::new();
    // Every thread tries each shared name at the same moment.
    let together = Arc::new(std::sync::Barrier::new(6));
    for (m, s) in stores.iter().enumerate() {
        for t in 0..3 {
            let s = s.clone();
            let together = together.clone();
            threads.push(std::thread::spawn(move || {
                let mut out = Vec::new();
                for i in 0..SHARED {
                    together.wait();
                    let name = format!("shared{i}");
                    out.push((name.clone(), create(&s, ROOT_INO, name.as_bytes()).map_err(|e| (e.kind(), e.to_string()))));
                    let own = format!("own{m}-{t}-{i}");
                    out.push((own.clone(), create(&s, ROOT_INO, own.as_bytes()).map_err(|e| (e.kind(), e.to_string()))));
                }
                out
            }));
        }
    }
    let mut won: std::collections::HashMap<String, Ino> = Default::default();
    for t in threads {
        for (name, r) in t.join().unwrap() {
            match r {
                Ok(ino) => assert!(won.insert(name.clone(), ino).is_none(), "{name} was created twice"),
                Err((kind, msg)) => {
                    assert_eq!(kind, ErrorKind::Exists, "{name}: {msg}");
                    assert!(name.starts_with("shared"), "{name}, tried once, failed: {msg}");
                }
            }
        }
    }
    let s = &stores[0];
    let listed = s.read_with(|r| r.list_dir(ROOT_INO)).unwrap();
    assert_eq!(listed.len(), SHARED + 6 * SHARED, "names in the directory");
    for (name, ino, _) in &listed {
        assert_eq!(won.get(std::str::from_utf8(name).unwrap()), Some(ino), "{} names the winner's inode", String::from_utf8_lossy(name));
    }
    assert_eq!(s.read_with(|r| r.count_inodes()).unwrap() as usize, 1 + listed.len(), "a loser's inode stayed");
    eprintln!("names: {} retries", stores[0].retries() + stores[1].retries());
}

/// Creates in one directory from two stores, three threads each, as the
/// engine makes them (look the name up, insert inode and entry, touch the
/// directory). As serializable writes they conflict on the directory's row
/// and run again; as `write_locking` writes (READ COMMITTED, the directory
/// locked first) they queue: not one retry, and every name once.
#[test]
fn creates_that_lock_their_directory_queue_instead_of_retrying() {
    let pg = &*pg();
    let run = |id: &str, locking: bool| -> (u64, usize) {
        let url = fresh(pg, id);
        let stores = [open(&url, id), open(&url, id)];
        let mut threads = Vec::new();
        for (m, s) in stores.iter().enumerate() {
            for t in 0..3 {
                let s = s.clone();
                threads.push(std::thread::spawn(move || {
                    for i in 0..60 {
                        let name = format!("m{m}-t{t}-{i}");
                        let mut f = |tx: &dyn MetaTx| -> Result<()> {
                            if tx.lookup(ROOT_INO, name.as_bytes())?.is_some() {
                                return Err(Error::new(ErrorKind::Exists, "name exists"));
                            }
                            let ino = tx.alloc_ino()?;
                            tx.insert_inode(&attr(ino, FileKind::File), None, None, 0)?;
                            tx.insert_dentry(ROOT_INO, name.as_bytes(), ino, FileKind::File)?;
                            tx.touch_dir(ROOT_INO, Timestamp(i), 0)
                        };
                        if locking {
                            s.write_locking(&[ROOT_INO], &[], false, &mut f).unwrap();
                        } else {
                            s.write(&mut f).unwrap();
                        }
                    }
                }));
            }
        }
        for t in threads {
            t.join().unwrap();
        }
        let names = stores[0].read_with(|r| r.list_dir(ROOT_INO)).unwrap().len();
        (stores[0].retries() + stores[1].retries(), names)
    };
    let (serializable, n) = run("dirser", false);
    assert_eq!(n, 360);
    let (locking, n) = run("dirlock", true);
    assert_eq!(n, 360);
    eprintln!("360 creates in one directory from 6 threads: {serializable} retries serializable, {locking} locking");
    assert!(serializable > 0, "serializable creates in one directory never conflicted: the test did not test");
    assert_eq!(locking, 0, "creates that lock their directory first still failed and ran again");
}

/// Two stores, two threads each, save pages referencing one chunk at once:
/// the count ends equal to the number of commits, and the chunk's pack has
/// no dead bytes left.
#[test]
fn reference_counts_from_two_machines() {
    let pg = &*pg();
    let url = fresh(pg, "refs");
    let stores = [open(&url, "refs"), open(&url, "refs")];
    let x = stores[0].alloc_chunk_id().unwrap();
    stores[0]
        .write_with(|tx| {
            let p = tx.insert_pack("packs/x", 100, 1, 100)?;
            tx.insert_chunk(&ChunkRow { id: x, hash: [7; 32], pack: p, offset: 0, stored_len: 100, raw_len: 100, flags: 0, refs: 0, zero_since: None })
        })
        .unwrap();
    const EACH: i64 = 50;
    let mut threads = Vec::new();
    for (m, s) in stores.iter().enumerate() {
        for t in 0..2u64 {
            let s = s.clone();
            let ino = 1000 + 10 * m as u64 + t;
            threads.push(std::thread::spawn(move || {
                for k in 0..EACH {
                    s.write_with(|tx| tx.save_pages(ino, &PageEdits { upserts: vec![test_page(k, &[x])], ..Default::default() })).unwrap();
                }
            }));
        }
    }
    for t in threads {
        t.join().unwrap();
    }
    let (refs, dead) = stores[1].read_with(|r| -> Result<_> { Ok((r.chunk_by_id(x)?.unwrap().refs, r.pack_bytes()?.1)) }).unwrap();
    assert_eq!(refs, 4 * EACH, "reference count after {} commits", 4 * EACH);
    assert_eq!(dead, 0, "dead bytes of a referenced chunk's pack");
    assert_eq!(stores[1].read_with(|r| r.all_pages()).unwrap().len() as i64, 4 * EACH);
    let retries = stores[0].retries() + stores[1].retries();
    eprintln!("reference counts: {retries} retries");
    assert!(retries > 0, "four writers of one chunk's count never conflicted: the test did not test");
}

/// The server goes away for ~3 s: a write issued meanwhile (with the
/// default deadline) succeeds once it is back, and returns only after it
/// is back; with a 1 s deadline, a write during the outage fails by itself
/// (the server still down) with the I/O kind, naming the PostgreSQL error,
/// and the operations after it fail after one try each until the server
/// answers again. Order and counts, no speed: the waits are deadlines.
#[test]
fn postgres_outage() {
    let mut pg = server();
    let url = fresh(&pg, "outage");
    let s = open(&url, "outage");
    let short = Arc::new(PgMeta::open_with(&url, "outage", codec(), PgOptions { timeout: Duration::from_secs(1), ..Default::default() }).unwrap());
    create(&s, ROOT_INO, b"before").unwrap();
    create(&short, ROOT_INO, b"before-short").unwrap();
    pg.stop().unwrap();
    let down = Instant::now();
    let w = {
        let s = s.clone();
        std::thread::spawn(move || {
            let r = create(&s, ROOT_INO, b"during");
            (r, Instant::now())
        })
    };
    // The short store gives up by itself: the server stays down until it
    // did (or a generous minute passed, which fails the test).
    let gave_up = {
        let short = short.clone();
        std::thread::spawn(move || {
            let t = Instant::now();
            (create(&short, ROOT_INO, b"during-short"), t.elapsed())
        })
    };
    let limit = Instant::now() + Duration::from_secs(60);
    while !gave_up.is_finished() {
        assert!(Instant::now() < limit, "a write with a 1 s deadline was still waiting after 60 s with the server down");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (r, took) = gave_up.join().unwrap();
    let e = r.expect_err("a write with the server down succeeded");
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(e.to_string().contains("PostgreSQL") && e.to_string().contains("last error: error connecting"), "the error names the last PostgreSQL error: {e}");
    // It tried for its deadline (a lower bound: a sleep's floor, not a speed).
    assert!(took >= Duration::from_millis(900), "gave up after {took:?}, before its 1 s deadline");
    // The server has been unreachable for the deadline: later operations
    // (the next ones of the same system call, say) fail after one try, not
    // after a deadline each, and say why.
    let e = create(&short, ROOT_INO, b"during-short-2").expect_err("a second write with the server down succeeded");
    assert!(e.to_string().contains("unreachable for") && e.to_string().contains("failed after 1 tries"), "a second write during the outage: {e}");
    let e = short.read_with(|r| r.lookup(ROOT_INO, b"before")).expect_err("a read with the server down succeeded");
    assert!(e.to_string().contains("unreachable for") && e.to_string().contains("failed after 1 tries"), "a read during the outage: {e}");
    assert!(!w.is_finished(), "the write with the default deadline returned while the server was down: {:?}", w.join().unwrap().0);
    std::thread::sleep(Duration::from_secs(3).saturating_sub(down.elapsed()));
    let back = Instant::now();
    pg.start_again().unwrap();
    // Back: the first operation connects and works, no waiting for the
    // outage to be forgotten (a 1 s deadline leaves no room for waiting).
    create(&short, ROOT_INO, b"after-short").unwrap_or_else(|e| panic!("the first write after the server came back: {e}"));
    let (r, done) = w.join().unwrap();
    let ino = r.unwrap_or_else(|e| panic!("a write during a 3 s outage failed: {e}"));
    assert!(done >= back, "the write returned before the server was back");
    assert_eq!(s.read_with(|r| r.lookup(ROOT_INO, b"during")).unwrap().map(|x| x.0), Some(ino));
    assert_eq!(short.read_with(|r| r.lookup(ROOT_INO, b"during-short")).unwrap(), None, "the failed write left its entry");
    // Reads reconnect too.
    assert!(short.read_with(|r| r.lookup(ROOT_INO, b"before")).unwrap().is_some());
}

/// `read_one` runs without a transaction, so a closure that asks twice
/// would see two snapshots: PostgreSQL refuses the second query (the
/// conformance suite accepts stores that simply run both).
#[test]
fn read_one_refuses_a_second_query() {
    let pg = &*pg();
    let url = fresh(pg, "readone");
    let s = open(&url, "readone");
    let e = s.read_one_with(|r| -> Result<Option<InodeRow>> {
        r.get_inode(ROOT_INO)?;
        r.get_inode(ROOT_INO)
    });
    let e = e.expect_err("a second query in read_one was answered");
    assert!(e.to_string().contains("second query"), "{e}");
    assert!(s.read_one_with(|r| r.get_inode(ROOT_INO)).unwrap().is_some());
}

/// Commits wait for no WAL flush by default (`PgOptions::sync_commit`
/// off): a change is durable once `sync` returned, which a crash of the
/// server (SIGKILL: what was not flushed is lost) proves; with
/// `sync_commit` every write is durable when it returns.
#[test]
fn a_synced_change_survives_a_server_crash() {
    let mut pg = server();
    let url = fresh(&pg, "crash");
    let lazy = open(&url, "crash");
    let session = lazy.open_session(&conformance::who("/lazy"), Duration::from_secs(60)).unwrap();
    assert!(lazy.is_durable(), "a store that wrote nothing has nothing to flush");
    let a = create(&lazy, ROOT_INO, b"synced").unwrap();
    assert!(!lazy.is_durable(), "a commit without the WAL flush was taken as durable");
    lazy.sync().unwrap();
    assert!(lazy.is_durable());
    // The barrier wrote the session's heartbeat, not some shared row.
    assert!(lazy.sessions().unwrap().iter().any(|r| r.id == session));
    drop(lazy);
    pg.kill();
    pg.start_again().unwrap();
    let s = open(&url, "crash");
    assert_eq!(s.read_with(|r| r.lookup(ROOT_INO, b"synced")).unwrap().map(|x| x.0), Some(a), "a change made durable by sync was lost in the crash");
    drop(s);
    let strict = Arc::new(PgMeta::open_with(&url, "crash", codec(), PgOptions { sync_commit: true, ..Default::default() }).unwrap());
    let b = create(&strict, ROOT_INO, b"strict").unwrap();
    assert!(strict.is_durable(), "a sync_commit store has a write not yet durable");
    drop(strict);
    pg.kill();
    pg.start_again().unwrap();
    let s = open(&url, "crash");
    assert_eq!(s.read_with(|r| r.lookup(ROOT_INO, b"strict")).unwrap().map(|x| x.0), Some(b), "a sync_commit write was lost in the crash");
}

/// A COMMIT whose reply is lost with its connection is not run again when
/// it did commit: a create answers Ok (not Exists), a flush counts its
/// references once.
#[test]
fn a_lost_commit_reply_is_not_a_second_commit() {
    let pg = &*pg();
    let url = fresh(pg, "lost");
    let s = open(&url, "lost");
    s.lose_next_commit_reply();
    let ino = create(&s, ROOT_INO, b"once").unwrap_or_else(|e| panic!("a create whose COMMIT reply was lost: {e}"));
    assert_eq!(s.read_with(|r| r.lookup(ROOT_INO, b"once")).unwrap().map(|x| x.0), Some(ino));
    let x = s.alloc_chunk_id().unwrap();
    s.write_with(|tx| {
        let p = tx.insert_pack("packs/lost", 100, 1, 100)?;
        tx.insert_chunk(&ChunkRow { id: x, hash: [3; 32], pack: p, offset: 0, stored_len: 100, raw_len: 100, flags: 0, refs: 0, zero_since: None })
    })
    .unwrap();
    s.lose_next_commit_reply();
    s.write_with(|tx| tx.save_pages(ino, &PageEdits { upserts: vec![test_page(0, &[x])], ..Default::default() })).unwrap();
    assert_eq!(s.read_with(|r| r.chunk_by_id(x)).unwrap().unwrap().refs, 1, "a flush whose COMMIT reply was lost was counted twice");
    assert_eq!(s.read_with(|r| r.all_pages()).unwrap().len(), 1);
}

/// The store refuses everything after `abandon`.
#[test]
fn abandon_refuses_later_calls() {
    let pg = &*pg();
    let url = fresh(pg, "gone");
    let s = open(&url, "gone");
    create(&s, ROOT_INO, b"a").unwrap();
    s.abandon();
    assert!(create(&s, ROOT_INO, b"b").is_err());
    assert!(s.read_with(|r| r.lookup(ROOT_INO, b"a")).is_err());
    let s2 = open(&url, "gone");
    assert!(s2.read_with(|r| r.lookup(ROOT_INO, b"a")).unwrap().is_some());
    assert!(s2.read_with(|r| r.lookup(ROOT_INO, b"b")).unwrap().is_none());
}

/// Not a check: the create rate of one store, one thread (alloc_ino +
/// insert_inode + insert_dentry + touch_dir per transaction), for the
/// cost of the change log. `cargo test --release -p cairn-meta --test
/// postgres create_rate -- --ignored --nocapture`
#[test]
#[ignore]
fn postgres_create_rate() {
    let pg = server();
    let url = fresh(&pg, "rate");
    let s = open(&url, "rate");
    let run = |prefix: &str, n: usize| {
        let t = Instant::now();
        for i in 0..n {
            s.write_with(|tx| -> Result<()> {
                let ino = tx.alloc_ino()?;
                tx.insert_inode(&attr(ino, FileKind::File), None, None, 0)?;
                tx.insert_dentry(ROOT_INO, format!("{prefix}{i}").as_bytes(), ino, FileKind::File)?;
                tx.touch_dir(ROOT_INO, Timestamp(2), 0)
            })
            .unwrap();
        }
        n as f64 / t.elapsed().as_secs_f64()
    };
    run("warm", 200);
    for round in 0..3 {
        eprintln!("round {round}: {:.0} creates/s", run(&format!("r{round}-"), 2000));
    }
}

/// Four machines (a store each, one schema) creating 500 files each at
/// once: the figure writers that do not serialize on the change log
/// improve. `cargo test --release -p cairn-meta --test postgres
/// concurrent_create_rate -- --ignored --nocapture`
#[test]
#[ignore]
fn postgres_concurrent_create_rate() {
    let pg = server();
    let url = fresh(&pg, "crate");
    for machines in [1usize, 2, 4] {
        let stores: Vec<Arc<PgMeta>> = (0..machines).map(|_| open(&url, "crate")).collect();
        let t = Instant::now();
        std::thread::scope(|sc| {
            for (m, s) in stores.iter().enumerate() {
                let s = s.clone();
                sc.spawn(move || {
                    for i in 0..500 {
                        create(&s, ROOT_INO, format!("m{machines}-{m}-{i}").as_bytes()).unwrap();
                    }
                });
            }
        });
        eprintln!("{machines} machines: {:.0} creates/s", (500 * machines) as f64 / t.elapsed().as_secs_f64());
    }
}

/// Terminates the backends whose `application_name` is `app`; returns how
/// many.
fn kill_backends(pg: &PgServer, app: &str) -> usize {
    let out = pg
        .psql("cairn", &format!("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = '{app}' AND pid <> pg_backend_pid()"))
        .unwrap();
    out.trim().lines().filter_map(|l| l.trim().parse::<usize>().ok()).next().unwrap_or_else(|| panic!("psql said {out:?}"))
}

/// Sessions live in the database: another machine sees them, ids never
/// repeat across machines, and one machine's renewal of a session the
/// other's cleaner removed fails.
#[test]
fn sessions_from_two_machines() {
    let pg = &*pg();
    let url = fresh(pg, "sess");
    let (a, b) = (open(&url, "sess"), open(&url, "sess"));
    let mut ids = HashSet::new();
    for i in 0..10 {
        let s = if i % 2 == 0 { &a } else { &b };
        assert!(ids.insert(s.open_session(&conformance::who("/m"), Duration::from_secs(30)).unwrap()), "a session id came twice");
    }
    let sa = a.open_session(&conformance::who("/a"), Duration::from_secs(30)).unwrap();
    assert!(b.sessions().unwrap().iter().any(|r| r.id == sa && r.mount == "/a" && !r.expired), "machine B does not see A's session");
    assert!(b.remove_session(sa).unwrap());
    assert_eq!(a.renew_session(sa, Duration::from_secs(30)).unwrap_err().kind(), ErrorKind::SessionLost, "a removed session was renewed");
    // Expiry is on the database's clock: a session whose `expires` the
    // database puts in the past is lost, whatever this machine's clock says.
    let sb = b.open_session(&conformance::who("/b"), Duration::from_secs(3600)).unwrap();
    pg.psql("cairn", &format!("UPDATE cairn_sess.sessions SET expires = clock_timestamp() - interval '1 second' WHERE id = {sb}")).unwrap();
    assert_eq!(b.renew_session(sb, Duration::from_secs(30)).unwrap_err().kind(), ErrorKind::SessionLost);
    assert!(a.expired_sessions().unwrap().iter().any(|r| r.id == sb));
}

/// One maintenance holder across machines; a dead holder's connection
/// releases the lock.
#[test]
fn maintenance_lock_across_machines() {
    // A server of its own: it counts the connections of one kind.
    let pg = &server();
    let url = fresh(pg, "maint");
    let (a, b) = (open(&url, "maint"), open(&url, "maint"));
    // Another volume in the same database has a lock of its own.
    let other = open(&fresh(pg, "maint2"), "maint2");
    let mut ga = a.try_maintenance().unwrap().expect("the lock of a fresh volume");
    assert!(b.try_maintenance().unwrap().is_none(), "machine B got the maintenance lock machine A holds");
    assert!(a.try_maintenance().unwrap().is_none(), "a second guard on the same machine");
    let go = other.try_maintenance().unwrap().expect("another volume's maintenance lock was taken by this one's");
    drop(go);
    assert!(ga.still_held());
    drop(ga);
    let mut gb = b.try_maintenance().unwrap().expect("the lock was not granted to B after A's guard dropped");
    assert!(a.try_maintenance().unwrap().is_none());
    // B's connection dies (a crashed machine, a cut network): the server
    // releases the lock and A gets it; B's guard says it lost it.
    assert_eq!(kill_backends(pg, "cairn-maintenance cairn_maint"), 1);
    let t = Instant::now();
    let ga = loop {
        if let Some(g) = a.try_maintenance().unwrap() {
            break g;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "the lock of a killed connection was not released within 60 s");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!gb.still_held(), "a guard whose connection was killed says it still holds the lock");
    drop(gb);
    assert!(b.try_maintenance().unwrap().is_none(), "dropping a dead guard released the live holder's lock");
    drop(ga);
}

fn mkfile(s: &PgMeta, dir: Ino, name: &[u8]) -> Ino {
    create(s, dir, name).unwrap()
}

/// A create on machine A is in the log machine B reads: the entry and the
/// directory, once each, carrying A's session; nothing of a rolled-back
/// transaction.
#[test]
fn changes_seen_by_another_machine() {
    let pg = &*pg();
    let url = fresh(pg, "chg");
    let (a, b) = (open(&url, "chg"), open(&url, "chg"));
    let sa = a.open_session(&conformance::who("/a"), Duration::from_secs(60)).unwrap();
    let start = b.last_change_seq().unwrap();
    let f = mkfile(&a, ROOT_INO, b"from-a");
    let got = b.changes_since(start, 100).unwrap();
    let mut what: Vec<Changed> = got.iter().map(|c| c.what.clone()).collect();
    what.sort();
    assert_eq!(what, vec![Changed::Inode(ROOT_INO), Changed::Entry { parent: ROOT_INO, name: b"from-a".to_vec() }], "B's view of A's create");
    assert!(got.iter().all(|c| c.session == Some(sa)), "change rows carry the committer's session: {got:?}");
    a.write_with(|tx| tx.set_xattr(f, b"user.k", b"v")).unwrap();
    let last = got.last().unwrap().seq;
    assert_eq!(b.changes_since(last, 100).unwrap().iter().map(|c| c.what.clone()).collect::<Vec<_>>(), vec![Changed::Inode(f)]);
    let last = b.last_change_seq().unwrap();
    let e = a
        .write_with(|tx| -> Result<()> {
            tx.set_xattr(f, b"user.k", b"w")?;
            Err(Error::invalid("roll back"))
        })
        .expect_err("a write whose closure failed committed");
    assert!(e.to_string().contains("roll back"), "the closure's own error comes back: {e}");
    assert_eq!(a.read_with(|r| r.get_xattr(f, b"user.k")).unwrap().as_deref(), Some(&b"v"[..]), "the rolled-back write changed the value");
    assert!(b.changes_since(last, 100).unwrap().is_empty(), "a rolled-back transaction left change rows");
    a.close_session(sa).unwrap();
    mkfile(&a, ROOT_INO, b"no-session");
    assert!(b.changes_since(last, 100).unwrap().iter().all(|c| c.session.is_none()), "rows after close_session carry the closed session");
}

/// Makes `s`'s next write stop after inserting its change rows, before
/// its COMMIT: `held` hears when it got there, a send on `release` lets it
/// commit.
fn hold_commit(s: &PgMeta) -> (std::sync::mpsc::Receiver<()>, std::sync::mpsc::Sender<()>) {
    let (at_commit, held) = std::sync::mpsc::channel();
    let (release, go) = std::sync::mpsc::channel::<()>();
    s.hold_next_commit(move || {
        at_commit.send(()).unwrap();
        go.recv().unwrap();
    });
    (held, release)
}

/// Writers do not wait for each other's commits, so a transaction that
/// took seq n can commit after seq n+1 was read: B's reader must still
/// deliver n (once), at its next read; a seq that never commits (rolled
/// back) is a hole that does not block later rows.
#[test]
fn a_change_committing_late_is_not_missed() {
    let pg = &*pg();
    let url = fresh(pg, "late");
    let (a1, a2, b) = (open(&url, "late"), open(&url, "late"), open(&url, "late"));
    let d1 = s_mkdir(&a1, b"d1");
    let d2 = s_mkdir(&a1, b"d2");
    let mut cur = b.change_cursor().unwrap();
    let start = cur.after;
    // T1 (machine a1) inserts its rows and stops before COMMIT.
    let (held, release) = hold_commit(&a1);
    let t1 = {
        let a1 = a1.clone();
        std::thread::spawn(move || a1.write_with(|tx| tx.touch_dir(d1, Timestamp(70), 0)))
    };
    held.recv().unwrap();
    // T2 (machine a2) commits meanwhile, with a larger seq.
    let t2 = {
        let a2 = a2.clone();
        std::thread::spawn(move || a2.write_with(|tx| tx.touch_dir(d2, Timestamp(71), 0)))
    };
    let t0 = Instant::now();
    while !t2.is_finished() && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let t2_done = t2.is_finished();
    if !t2_done {
        release.send(()).unwrap();
    }
    assert!(t2_done, "a write waited for another machine's uncommitted write");
    t2.join().unwrap().unwrap();
    let first = b.read_changes(&mut cur, 100).unwrap();
    assert_eq!(first.iter().map(|c| c.what.clone()).collect::<Vec<_>>(), vec![Changed::Inode(d2)], "only T2 committed");
    assert!(first[0].seq > start + 1, "T1's seq {} is below T2's {}", start + 1, first[0].seq);
    release.send(()).unwrap();
    t1.join().unwrap().unwrap();
    let late = b.read_changes(&mut cur, 100).unwrap();
    assert_eq!(late.iter().map(|c| (c.seq, c.what.clone())).collect::<Vec<_>>(), vec![(start + 1, Changed::Inode(d1))], "T1's late commit was missed");
    assert!(cur.holes.is_empty());
    assert!(b.read_changes(&mut cur, 100).unwrap().is_empty(), "a row was delivered twice");
    // A new cursor taken while a transaction is committing has its seq as
    // a hole.
    let (held, release) = hold_commit(&a1);
    let t1 = {
        let a1 = a1.clone();
        std::thread::spawn(move || a1.write_with(|tx| tx.touch_dir(d1, Timestamp(72), 0)))
    };
    held.recv().unwrap();
    a2.write_with(|tx| tx.touch_dir(d2, Timestamp(73), 0)).unwrap();
    let mut fresh_cur = b.change_cursor().unwrap();
    assert_eq!(fresh_cur.hole_seqs(), vec![cur.after + 1], "a new cursor does not wait for T1");
    assert_eq!(b.read_changes(&mut cur, 100).unwrap().len(), 1);
    release.send(()).unwrap();
    t1.join().unwrap().unwrap();
    assert_eq!(b.read_changes(&mut fresh_cur, 100).unwrap().iter().map(|c| c.what.clone()).collect::<Vec<_>>(), vec![Changed::Inode(d1)]);
    assert_eq!(b.read_changes(&mut cur, 100).unwrap().iter().map(|c| c.what.clone()).collect::<Vec<_>>(), vec![Changed::Inode(d1)]);
    // A transaction that took a seq and rolled back: a hole for good,
    // which does not hold back later rows.
    pg.psql("cairn", "BEGIN; INSERT INTO cairn_late.changes(kind, ino) VALUES (0, 1); ROLLBACK;").unwrap();
    a2.write_with(|tx| tx.touch_dir(d2, Timestamp(75), 0)).unwrap();
    assert_eq!(b.read_changes(&mut cur, 100).unwrap().iter().map(|c| c.what.clone()).collect::<Vec<_>>(), vec![Changed::Inode(d2)]);
    assert_eq!(cur.holes.len(), 1, "the rolled-back seq is a hole: {:?}", cur.holes);
    a2.write_with(|tx| tx.touch_dir(d2, Timestamp(76), 0)).unwrap();
    assert_eq!(b.read_changes(&mut cur, 100).unwrap().iter().map(|c| c.what.clone()).collect::<Vec<_>>(), vec![Changed::Inode(d2)]);
    assert_eq!(cur.holes.len(), 1, "a hole is asked until its bound: {:?}", cur.holes);
    assert!(cur.hole_bound >= Duration::from_secs(60), "the hole bound derives from the 30 s deadline: {:?}", cur.hole_bound);
    // With a 1 s deadline the bound is 12 s: the rolled-back seq is
    // forgotten after a read past it, and never delivered.
    let quick = PgMeta::open_with(&url, "late", codec(), PgOptions { timeout: Duration::from_secs(1), ..Default::default() }).unwrap();
    assert_eq!(quick.hole_bound(), Duration::from_secs(12));
    cur.hole_bound = Duration::ZERO;
    quick.read_changes(&mut cur, 100).unwrap();
    assert_eq!((cur.holes.len(), cur.hole_bound), (1, Duration::from_secs(12)));
    std::thread::sleep(Duration::from_secs(13));
    assert!(quick.read_changes(&mut cur, 100).unwrap().is_empty());
    assert!(cur.holes.is_empty(), "a hole outlived its bound: {:?}", cur.holes);
}

/// A closure that hits a serialization failure runs again; the log holds
/// exactly what the committed run changed, once.
#[test]
fn a_retried_closure_logs_its_last_run_only() {
    let pg = &*pg();
    let url = fresh(pg, "retry");
    let (a, b) = (open(&url, "retry"), open(&url, "retry"));
    let d = s_mkdir(&a, b"d");
    let start = a.last_change_seq().unwrap();
    let retries = a.retries();
    let mut runs = 0;
    let f = a
        .write_with(|tx| -> Result<Ino> {
            runs += 1;
            tx.get_inode(d)?;
            let ino = tx.alloc_ino()?;
            tx.insert_inode(&attr(ino, FileKind::File), None, None, 0)?;
            let name: &[u8] = if runs == 1 { b"first-try" } else { b"retried" };
            tx.insert_dentry(d, name, ino, FileKind::File)?;
            tx.set_xattr(ino, b"user.run", name)?;
            if runs == 1 {
                // Another machine changes the row this transaction read.
                b.write_with(|tx| tx.touch_dir(d, Timestamp(50), 0)).unwrap();
            }
            tx.touch_dir(d, Timestamp(60), 0)?;
            Ok(ino)
        })
        .unwrap();
    assert_eq!(runs, 2, "the closure was not re-run: the test did not test");
    assert!(a.retries() > retries);
    let rows = b.changes_since(start, 100).unwrap();
    let mut what: Vec<Changed> = rows.iter().map(|c| c.what.clone()).collect();
    what.sort();
    assert_eq!(
        what,
        vec![Changed::Inode(d), Changed::Inode(d), Changed::Inode(f), Changed::Entry { parent: d, name: b"retried".to_vec() }],
        "B's touch once, A's committed run once, nothing of A's first run"
    );
}

fn s_mkdir(s: &PgMeta, name: &[u8]) -> Ino {
    s.write_with(|tx| -> Result<Ino> {
        let ino = tx.alloc_ino()?;
        tx.insert_inode(&attr(ino, FileKind::Dir), Some(ROOT_INO), None, 0)?;
        tx.insert_dentry(ROOT_INO, name, ino, FileKind::Dir)
            .map(|()| ino)
    })
    .unwrap()
}

/// Machine B's feed wakes on A's commit (waits are bounded by a generous
/// deadline: the test asserts that a notice comes, not how fast; the
/// latency is measured by bench/), stays quiet otherwise, and after its connection is killed says so (true) once it
/// has reconnected, then wakes again on the next commit.
#[test]
fn feed_wakes_on_another_machines_commit() {
    // A server of its own: it counts the connections of one kind.
    let pg = &server();
    const WAKE: Duration = Duration::from_secs(30);
    let url = fresh(pg, "feed");
    let (a, b) = (open(&url, "feed"), open(&url, "feed"));
    let mut feed = b.subscribe().unwrap().expect("the PostgreSQL store has a feed");
    assert!(!feed.wait(Duration::from_millis(200)).unwrap(), "a feed woke with nothing committed");
    // A read or a change of no inode sends nothing.
    a.write_with(|tx| tx.set_info("x", 1)).unwrap();
    assert!(!feed.wait(Duration::from_millis(200)).unwrap(), "a transaction that changed no inode woke the feed");
    // The feed's own store's commits wake nobody once it has a session
    // (its caches are current); another machine's still do.
    b.open_session(&conformance::who("/b"), Duration::from_secs(60)).unwrap();
    mkfile(&b, ROOT_INO, b"own");
    assert!(!feed.wait(Duration::from_millis(300)).unwrap(), "this store's own commit woke its feed");
    mkfile(&b, ROOT_INO, b"own2");
    mkfile(&a, ROOT_INO, b"theirs");
    assert!(feed.wait(WAKE).unwrap(), "another machine's commit after this one's own did not wake the feed");
    for i in 0..3 {
        let t = Instant::now();
        mkfile(&a, ROOT_INO, format!("n{i}").as_bytes());
        assert!(feed.wait(WAKE).unwrap(), "no notice within {WAKE:?} of a commit on another machine");
        eprintln!("feed: woke {:?} after the commit began", t.elapsed());
    }
    // Several commits before a wait: one wake-up takes them all.
    for i in 0..5 {
        mkfile(&a, ROOT_INO, format!("m{i}").as_bytes());
    }
    assert!(feed.wait(WAKE).unwrap());
    std::thread::sleep(Duration::from_millis(50));
    let _ = feed.wait(Duration::from_millis(10));
    assert!(!feed.wait(Duration::from_millis(200)).unwrap(), "notices already taken woke the feed again");
    // The listener's connection dies: the next wait reconnects and says
    // true (notices sent meanwhile are lost; the caller reads the log).
    assert_eq!(kill_backends(pg, "cairn-listen"), 1);
    mkfile(&a, ROOT_INO, b"while-away");
    assert!(feed.wait(WAKE).unwrap(), "a feed whose connection died did not say so");
    assert!(!feed.wait(Duration::from_millis(200)).unwrap());
    mkfile(&a, ROOT_INO, b"after");
    assert!(feed.wait(WAKE).unwrap(), "a reconnected feed missed a notice");
}

/// The schema a store creates, column by column, is the one description
/// of both stores' schemas (`cairn_meta::schema`).
#[test]
fn the_created_schema_is_the_described_one() {
    let pg = &*pg();
    let url = fresh(pg, "described");
    described(&open(&url, "described"));
}

/// Fails, naming each difference, unless `s`'s schema is the described one.
fn described(s: &PgMeta) {
    let diff = cairn_meta::schema::differences(&s.catalog().unwrap(), cairn_meta::schema::Dialect::Postgres);
    assert!(diff.is_empty(), "the schema differs from crates/cairn-meta/src/schema.rs:\n{}", diff.join("\n"));
}

/// A schema of version 1 (no sessions, no change log) is upgraded when
/// opened, keeping its files, to the described schema.
#[test]
fn a_version_1_schema_is_upgraded() {
    let pg = &*pg();
    let url = fresh(pg, "old");
    mkfile(&open(&url, "old"), ROOT_INO, b"kept");
    pg.psql("cairn", "DROP TABLE cairn_old.sessions; DROP SEQUENCE cairn_old.session_seq; DROP TABLE cairn_old.changes; UPDATE cairn_old.info SET value = 1 WHERE key = 'schema'")
        .unwrap();
    let s = open(&url, "old");
    described(&s);
    assert!(s.read_with(|r| r.lookup(ROOT_INO, b"kept")).unwrap().is_some());
    assert_eq!(s.read_with(|r| r.get_info("schema")).unwrap(), Some(cairn_meta::postgres::PG_SCHEMA_VERSION));
    let id = s.open_session(&conformance::who("/old"), Duration::from_secs(30)).unwrap();
    mkfile(&s, ROOT_INO, b"new");
    assert!(s.changes_since(0, 10).unwrap().iter().all(|c| c.session == Some(id)));
    assert_eq!(s.changes_since(0, 10).unwrap().len(), 2);
}

/// A schema of version 2 (no journal marks) gets them when opened; a
/// journal that held records before it had an id adopts the positions the
/// single-writer build recorded on the inodes, a new journal starts with
/// none.
#[test]
fn a_version_2_schema_gets_journal_marks() {
    let pg = &*pg();
    let url = fresh(pg, "old2");
    let f = mkfile(&open(&url, "old2"), ROOT_INO, b"kept");
    pg.psql(
        "cairn",
        &format!("DROP TABLE cairn_old2.journal_marks; DROP TABLE cairn_old2.open_files; UPDATE cairn_old2.inodes SET jseq = 42 WHERE ino = {f}; UPDATE cairn_old2.info SET value = 2 WHERE key = 'schema'"),
    )
    .unwrap();
    let old = open(&url, "old2");
    described(&old);
    assert_eq!(old.read_with(|r| r.get_info("schema")).unwrap(), Some(cairn_meta::postgres::PG_SCHEMA_VERSION));
    old.set_journal(7, true).unwrap();
    assert_eq!(old.read_with(|r| r.get_inode(f)).unwrap().unwrap().jseq, 42, "the legacy journal lost its position");
    assert_eq!(old.read_with(|r| r.max_jseq()).unwrap(), 42);
    let new = open(&url, "old2");
    new.set_journal(8, false).unwrap();
    assert_eq!(new.read_with(|r| r.get_inode(f)).unwrap().unwrap().jseq, 0, "a new journal took another's position");
}

/// A schema of version 3 (no lock table) gets it when opened, and locks
/// then work (two stores, "two machines": one is refused the other's
/// range).
#[test]
fn a_version_3_schema_gets_locks() {
    let pg = &*pg();
    let url = fresh(pg, "old3");
    let f = mkfile(&open(&url, "old3"), ROOT_INO, b"kept");
    pg.psql("cairn", "DROP TABLE cairn_old3.locks; UPDATE cairn_old3.info SET value = 3 WHERE key = 'schema'").unwrap();
    let (a, b) = (open(&url, "old3"), open(&url, "old3"));
    described(&a);
    assert_eq!(a.read_with(|r| r.get_info("schema")).unwrap(), Some(cairn_meta::postgres::PG_SCHEMA_VERSION));
    let rq = |session, kind| LockRequest { ino: f, owner: LockOwner { session, owner: 1 }, style: LockStyle::Posix, kind, start: 0, end: LOCK_EOF, pid: 1 };
    // Locks are taken by live sessions only (fencing, schema 6).
    let (sa, sb) = (a.open_session(&conformance::who("/a"), Duration::from_secs(60)).unwrap(), b.open_session(&conformance::who("/b"), Duration::from_secs(60)).unwrap());
    assert_eq!(a.set_lock(&rq(sa, LockKind::Write)).unwrap(), LockOutcome::Granted);
    assert!(matches!(b.set_lock(&rq(sb, LockKind::Read)).unwrap(), LockOutcome::Conflict(_)));
}

/// A version 4 schema (before chunks' zero dates) gets the column at open;
/// a chunk at zero from before reads undated (dead since long ago).
#[test]
fn a_version_4_schema_gets_zero_dates() {
    let pg = &*pg();
    let url = fresh(pg, "old4");
    let s = open(&url, "old4");
    let x = s.alloc_chunk_id().unwrap();
    s.write_with(|tx| {
        let p = tx.insert_pack("packs/old", 100, 1, 100)?;
        tx.insert_chunk(&ChunkRow { id: x, hash: [4; 32], pack: p, offset: 0, stored_len: 100, raw_len: 100, flags: 0, refs: 0, zero_since: None })
    })
    .unwrap();
    drop(s);
    pg.psql("cairn", "ALTER TABLE cairn_old4.chunks DROP COLUMN zero_since; UPDATE cairn_old4.info SET value = 4 WHERE key = 'schema'").unwrap();
    let s = open(&url, "old4");
    described(&s);
    assert_eq!(s.read_with(|r| r.get_info("schema")).unwrap(), Some(cairn_meta::postgres::PG_SCHEMA_VERSION));
    let c = s.read_with(|r| r.chunk_by_id(x)).unwrap().expect("the chunk survived the upgrade");
    assert_eq!((c.refs, c.zero_since), (0, None));
}

/// A version 7 schema (before pack tiers, pins and restores) gets them at
/// open: its files and packs kept, each pack in the home tier since it
/// was made, no pins; creates then inherit pins.
#[test]
fn a_version_7_schema_gets_tiers_and_pins() {
    let pg = &*pg();
    let url = fresh(pg, "old7");
    let s = open(&url, "old7");
    let d = s_mkdir(&s, b"d");
    let p = s.write_with(|tx| tx.insert_pack("packs/old", 100, 1, 0)).unwrap();
    drop(s);
    pg.psql(
        "cairn",
        "ALTER TABLE cairn_old7.packs DROP COLUMN tier; ALTER TABLE cairn_old7.packs DROP COLUMN tier_since; ALTER TABLE cairn_old7.inodes DROP COLUMN tier_pin;
         DROP TABLE cairn_old7.restores; UPDATE cairn_old7.packs SET created = 777000; UPDATE cairn_old7.info SET value = 7 WHERE key = 'schema'",
    )
    .unwrap();
    let s = open(&url, "old7");
    described(&s);
    assert_eq!(s.read_with(|r| r.get_info("schema")).unwrap(), Some(cairn_meta::postgres::PG_SCHEMA_VERSION));
    assert_eq!(s.read_with(|r| r.lookup(ROOT_INO, b"d")).unwrap(), Some((d, FileKind::Dir)));
    assert_eq!(s.read_with(|r| r.pack_tier(p)).unwrap(), Some(PackTier { tier: TIER_HOME, since: 777000 }));
    assert_eq!(s.read_with(|r| r.tier_pin(d)).unwrap(), Some(PIN_AUTO));
    assert!(s.read_with(|r| r.list_restores()).unwrap().is_empty());
    assert!(s.write_with(|tx| tx.set_tier_pin(d, PIN_WARM)).unwrap());
    let f = s
        .write_with(|tx| -> Result<Ino> {
            let ino = tx.alloc_ino()?;
            tx.create_node(&NewNode { attr: &attr(ino, FileKind::File), parent: d, name: b"f", target: None, jseq: 0, now: Timestamp(5), open: None })?;
            Ok(ino)
        })
        .unwrap();
    assert_eq!(s.read_with(|r| r.tier_pin(f)).unwrap(), Some(PIN_WARM | PIN_INHERITED));
}

/// The cycle the up-front entry locks close (docs/shared-volume.md §4):
/// directory D (the lower inode number) inside P; one machine keeps trying
/// to remove D (never empty: it fails with NotEmpty) while another moves a
/// file between D and P. Locking P first and D after the lookup, the rmdir
/// holds P and waits for D while the rename holds D and waits for P, and
/// PostgreSQL breaks the cycle after its deadlock_timeout (1 s). With D
/// locked with P in one ascending pass there is no cycle: no retry.
#[test]
fn an_rmdir_and_renames_out_of_the_directory_never_deadlock() {
    let pg = &*pg();
    let run = |id: &str, up_front: bool, rounds: usize| -> u64 {
        let url = fresh(pg, id);
        let s0 = open(&url, id);
        let d = s_mkdir(&s0, b"D");
        let p = s_mkdir(&s0, b"P");
        assert!(d < p);
        // D into P, a file kept in D, and the file that moves.
        s0.write_with(|tx| -> Result<()> {
            assert!(tx.delete_dentry(ROOT_INO, b"D", d)?);
            tx.insert_dentry(p, b"D", d, FileKind::Dir)
        })
        .unwrap();
        mkfile(&s0, d, b"keep");
        mkfile(&s0, d, b"x");
        let stores = [open(&url, id), open(&url, id)];
        // Without the up-front locks, the first deadlock is enough.
        let seen = || !up_front && stores[0].retries() + stores[1].retries() > 0;
        std::thread::scope(|sc| {
            let (rm, seen) = (&stores[0], &seen);
            sc.spawn(move || {
                for _ in 0..rounds {
                    if seen() {
                        break;
                    }
                    let entry: &[(Ino, &[u8])] = if up_front { &[(p, b"D")] } else { &[] };
                    let e = rm
                        .write_locking_with(&[p], entry, false, |tx| -> Result<()> {
                            let (ino, _) = tx.lookup(p, b"D")?.expect("D");
                            tx.lock_inode(ino)?;
                            if !tx.dir_is_empty(ino)? {
                                return Err(Error::new(ErrorKind::NotEmpty, "directory not empty"));
                            }
                            unreachable!("D always holds keep");
                        })
                        .unwrap_err();
                    assert_eq!(e.kind(), ErrorKind::NotEmpty, "{e}");
                }
            });
            let mv = &stores[1];
            sc.spawn(move || {
                for i in 0..rounds {
                    if seen() {
                        break;
                    }
                    let (from, to) = if i % 2 == 0 { (d, p) } else { (p, d) };
                    let entries: &[(Ino, &[u8])] = if up_front { &[(from, b"x"), (to, b"x")] } else { &[] };
                    mv.write_locking_with(&[from, to], entries, true, |tx| -> Result<()> {
                        let (x, _) = tx.lookup(from, b"x")?.expect("x");
                        tx.lock_inodes(&[x])?;
                        assert!(tx.delete_dentry(from, b"x", x)?);
                        tx.insert_dentry(to, b"x", x, FileKind::File)?;
                        tx.touch_dir(from, Timestamp(i as i64), 0)?;
                        tx.touch_dir(to, Timestamp(i as i64), 0)
                    })
                    .unwrap();
                }
            });
        });
        stores[0].retries() + stores[1].retries()
    };
    let after = run("nodeadlock", true, 300);
    let before = run("deadlock", false, 300);
    eprintln!("rmdir against renames out of the directory: {before} retries locking the child after its parent (until the first), {after} locking both up front (300 rounds)");
    assert!(before > 0, "no deadlock with the child locked after its parent: the test did not test");
    assert_eq!(after, 0, "an rmdir and renames out of the directory still deadlocked");
}

/// Two stores ("two machines"), three threads each, racing for one write
/// lock range: never two holders at once (the inode row lock serializes
/// the check and the insert), and every thread gets its turn.
#[test]
fn one_writer_at_a_time_across_stores() {
    let pg = &*pg();
    let url = fresh(pg, "lockrace");
    let f = mkfile(&open(&url, "lockrace"), ROOT_INO, b"f");
    let stores = [open(&url, "lockrace"), open(&url, "lockrace")];
    // Locks are taken by live sessions only (fencing, schema 6).
    let sessions: Vec<u64> = stores.iter().map(|s| s.open_session(&conformance::who("/lockrace"), Duration::from_secs(600)).unwrap()).collect();
    let inside = Arc::new(AtomicU32::new(0));
    let grants = Arc::new(AtomicU32::new(0));
    std::thread::scope(|sc| {
        for t in 0..6u64 {
            let s = stores[(t % 2) as usize].clone();
            let session = sessions[(t % 2) as usize];
            let (inside, grants) = (inside.clone(), grants.clone());
            sc.spawn(move || {
                let rq = |kind| LockRequest { ino: f, owner: LockOwner { session, owner: t }, style: LockStyle::Posix, kind, start: 10, end: 20, pid: t as u32 };
                let mut mine = 0;
                let start = Instant::now();
                while mine < 5 {
                    assert!(start.elapsed() < Duration::from_secs(60), "thread {t} starved");
                    match s.set_lock(&rq(LockKind::Write)).unwrap() {
                        LockOutcome::Granted => {
                            assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders of one write lock");
                            std::thread::sleep(Duration::from_millis(2));
                            inside.fetch_sub(1, Ordering::SeqCst);
                            assert_eq!(s.set_lock(&rq(LockKind::Unlock)).unwrap(), LockOutcome::Granted);
                            grants.fetch_add(1, Ordering::SeqCst);
                            mine += 1;
                        }
                        LockOutcome::Conflict(h) => assert_ne!(h.owner.owner, t, "conflict with itself"),
                    }
                }
            });
        }
    });
    assert_eq!(grants.load(Ordering::SeqCst), 30);
}

/// A server whose WAL writer runs every 10 s (its maximum): a commit made
/// with `synchronous_commit = off` stays in the server's memory until a
/// WAL flush, so an immediate stop (SIGQUIT, as `pg_ctl stop -m
/// immediate`, a power cut or an OOM kill) loses it.
fn lazy_server() -> PgServer {
    let pg = PgServer::start_with(&["wal_writer_delay=10000"]).unwrap_or_else(|e| panic!("starting a PostgreSQL server for the tests: {e}"));
    pg.create_database("cairn").unwrap();
    pg
}

fn exists(s: &PgMeta, name: &[u8]) -> bool {
    s.read_with(|r| r.lookup(ROOT_INO, name)).unwrap().is_some()
}

/// `sync` promises that every write returned before it is durable: a
/// lazy commit the server lost in a crash (immediate stop, then crash
/// recovery) must make `sync` fail, not be covered by a barrier on the
/// restarted server. Every later sync fails too (the engine keeps its
/// journal and replays it) until `resume_after_loss`. A clean restart (whose shutdown flushes
/// the WAL) is no such loss: sync after it succeeds.
#[test]
fn a_lazy_commit_lost_in_a_crash_fails_sync() {
    let mut pg = lazy_server();
    let url = fresh(&pg, "lazylost");
    let s = open(&url, "lazylost");
    s.open_session(&conformance::who("/lazy"), Duration::from_secs(600)).unwrap();
    create(&s, ROOT_INO, b"synced").unwrap();
    s.sync().unwrap();
    create(&s, ROOT_INO, b"lazy").unwrap();
    pg.stop_immediate();
    pg.start_again().unwrap();
    let r = s.sync();
    let check = open(&url, "lazylost");
    assert!(exists(&check, b"synced"), "a change sync made durable was lost");
    let there = exists(&check, b"lazy");
    assert!(r.is_err() || there, "sync answered Ok after a crash that lost the lazy commit it covers");
    assert!(!there, "the lazy commit survived the immediate stop, so this test tested nothing (was the WAL writer delay not 10 s?)");
    let e = r.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(e.to_string().contains("cannot be proven durable"), "{e}");
    assert!(!s.is_durable());
    assert!(s.is_lost());
    let e = s.sync().expect_err("a second sync after the loss succeeded");
    assert!(e.to_string().contains("replayed it on the new history"), "{e}");
    // Once its owner has what it needs to redo them (the engine: its
    // journal, volume/resume.rs), the store resumes on the new history.
    s.resume_after_loss().unwrap();
    assert!(!s.is_lost());
    create(&s, ROOT_INO, b"resumed").unwrap();
    s.sync().unwrap();

    // A clean restart in the same place: the shutdown checkpoint flushed
    // every commit, the history is the same, sync succeeds.
    let s = open(&url, "lazylost");
    create(&s, ROOT_INO, b"clean").unwrap();
    pg.stop().unwrap();
    pg.start_again().unwrap();
    s.sync().unwrap_or_else(|e| panic!("sync after a clean restart of the server: {e}"));
    assert!(exists(&s, b"clean"));
    assert!(s.is_durable());
}

/// A failover to a server with another history (a standby that had not
/// received the last WAL, promoted: a new timeline): a lazy commit made
/// on the old primary fails `sync` (machine 1); the id block a machine
/// reserved there is dropped and the sequence set past it (the new
/// primary would hand it out again, here to a third machine), so the
/// machines' new inodes never collide; and a change cursor of the old
/// history is reset (`ChangeCursor::history`).
#[test]
fn a_failover_to_another_history_is_noticed() {
    let mut pg = lazy_server();
    let url = fresh(&pg, "failover");
    pg.stop().unwrap();
    pg.copy_for_standby().unwrap();
    pg.start_again().unwrap();
    let s = open(&url, "failover");
    let lazy = open(&url, "failover");
    let mut cursor = s.change_cursor().unwrap();
    let old = create(&s, ROOT_INO, b"old-primary").unwrap();
    s.sync().unwrap();
    create(&lazy, ROOT_INO, b"lazy").unwrap();
    pg.stop_immediate();
    pg.fail_over_to_copy().unwrap();
    let r = lazy.sync();
    let s2 = open(&url, "failover");
    assert!(!exists(&s2, b"old-primary") && !exists(&s2, b"lazy"), "the copy has the old primary's last commits: this test tested nothing");
    assert!(r.is_err(), "sync answered Ok for a commit the failover lost");
    // The third machine reserves its block on the new primary first.
    let mut inos = std::collections::BTreeSet::new();
    for i in 0..5 {
        let ino = create(&s2, ROOT_INO, format!("m2-{i}").as_bytes()).unwrap_or_else(|e| panic!("machine 2 create {i}: {e}"));
        assert!(inos.insert(ino), "inode {ino} handed out twice");
    }
    for i in 0..5 {
        let ino = create(&s, ROOT_INO, format!("m1-{i}").as_bytes()).unwrap_or_else(|e| panic!("machine 1 create {i} after the failover: {e}"));
        assert!(inos.insert(ino), "inode {ino} handed out to two machines (machine 1 kept its block of the old primary, whose inode {old} it had taken)");
    }
    let before = cursor.history;
    let rows = s.read_changes(&mut cursor, 100).unwrap();
    assert!(rows.is_empty() && cursor.history != before, "a cursor of the old history was not reset: {rows:?}");
    assert_eq!(cursor.after, s.last_change_seq().unwrap());
    // The lazy machine refuses changes until its owner has replayed what
    // may be lost and resumes it.
    let e = create(&lazy, ROOT_INO, b"after").expect_err("a store that lost commits took a change");
    assert!(e.to_string().contains("replayed it on the new history"), "{e}");
    lazy.resume_after_loss().unwrap();
    create(&lazy, ROOT_INO, b"after").unwrap_or_else(|e| panic!("a create after resuming: {e}"));
    lazy.sync().unwrap();
}

/// A machine that froze holding a directory's row lock (its transaction
/// open, nothing sent): another machine's create in that directory
/// answers within its deadline (here an error, `lock_timeout`), never
/// hangs; once the lock goes, creates work again.
#[test]
fn a_frozen_machines_row_lock_bounds_a_create() {
    let pg = server();
    let url = fresh(&pg, "frozen");
    let s = Arc::new(PgMeta::open_with(&url, "frozen", codec(), PgOptions { timeout: Duration::from_secs(2), ..Default::default() }).unwrap());
    let mut frozen = ::postgres::Client::connect(&url, ::postgres::NoTls).unwrap();
    frozen.batch_execute("BEGIN; SELECT ino FROM cairn_frozen.inodes WHERE ino = 1 FOR UPDATE").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let t = {
        let s = s.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            let r = s.write_locking(&[ROOT_INO], &[(ROOT_INO, b"x")], false, &mut |tx| {
                let ino = tx.alloc_ino()?;
                tx.insert_inode(&attr(ino, FileKind::File), None, None, 0)?;
                tx.insert_dentry(ROOT_INO, b"x", ino, FileKind::File)?;
                tx.touch_dir(ROOT_INO, Timestamp(2), 0)
            });
            let _ = tx.send((r, start.elapsed()));
        })
    };
    // Generous: the bound is the 2 s deadline (one lock wait of it).
    let (r, took) = rx.recv_timeout(Duration::from_secs(60)).expect("a create behind a frozen machine's row lock hung for 60 s (deadline 2 s)");
    t.join().unwrap();
    let e = r.expect_err("a create behind a held row lock succeeded");
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(e.to_string().contains("55P03") || e.to_string().contains("57014"), "the error names the lock timeout: {e}");
    eprintln!("create behind a frozen lock answered after {took:?}: {e}");
    drop(frozen);
    create(&s, ROOT_INO, b"after").unwrap();
}

/// `trim_changes` on a log of 10^6 old rows (two rows per create or
/// unlink: half a million operations) with a 3 s deadline, which also
/// bounds each statement (`statement_timeout`): it trims in batches, each
/// well within it, keeps the young rows and the newest, and records the
/// highest seq it removed.
#[test]
fn a_change_log_of_a_million_rows_is_trimmed() {
    let pg = server();
    let url = fresh(&pg, "trim");
    pg.psql(
        "cairn",
        "INSERT INTO cairn_trim.changes(kind, ino, at) SELECT 1, g, clock_timestamp() - interval '2 hours' FROM generate_series(1, 1000000) g;
         INSERT INTO cairn_trim.changes(kind, ino) SELECT 1, g FROM generate_series(1, 5) g",
    )
    .unwrap();
    let s = Arc::new(PgMeta::open_with(&url, "trim", codec(), PgOptions { timeout: Duration::from_secs(3), ..Default::default() }).unwrap());
    let top = s.last_change_seq().unwrap();
    let t = Instant::now();
    let n = s.trim_changes(Duration::from_secs(3600)).unwrap_or_else(|e| panic!("trimming 10^6 rows: {e}"));
    eprintln!("trimmed {n} change rows in {:?}", t.elapsed());
    assert_eq!(n, 1_000_000);
    assert_eq!(pg.psql("cairn", "SELECT count(*) FROM cairn_trim.changes").unwrap(), "5");
    assert_eq!(s.changes_trimmed_through().unwrap(), top - 5);
    assert_eq!(s.last_change_seq().unwrap(), top);
    assert_eq!(s.trim_changes(Duration::from_secs(3600)).unwrap(), 0);
}

/// Not a check: what the change notices cost at 4 mounts. `pg_notify`
/// takes a lock at commit that is one for the whole cluster (PostgreSQL's
/// `PreCommit_Notify` locks database object 0 until the commit is
/// done), so notifying commits queue one at a time there. 4 stores, 2
/// threads each, creating in directories of their own, with and without
/// notices. `cargo test --release -p cairn-meta --test postgres
/// notify_cost -- --ignored --nocapture`
#[test]
#[ignore]
fn notify_cost_at_four_mounts() {
    // WAL flushes that reach the disk, as in production.
    let pg = PgServer::start_with(&["fsync=on"]).unwrap();
    pg.create_database("cairn").unwrap();
    for (round, notify) in [(0, true), (1, false), (2, true), (3, false)] {
        for sync_commit in [false, true] {
            let id = format!("notify{round}{}", sync_commit as u8);
            let url = fresh(&pg, &id);
            let stores: Vec<Arc<PgMeta>> = (0..4).map(|_| Arc::new(PgMeta::open_with(&url, &id, codec(), PgOptions { notify, sync_commit, ..Default::default() }).unwrap())).collect();
            let dirs: Vec<Ino> = (0..8).map(|i| create_dir(&stores[0], format!("d{i}").as_bytes())).collect();
            let n = 400;
            let t = Instant::now();
            std::thread::scope(|s| {
                for (k, st) in stores.iter().enumerate() {
                    for th in 0..2 {
                        let dir = dirs[k * 2 + th];
                        s.spawn(move || {
                            for i in 0..n {
                                let name = format!("f{i}");
                                st.write_locking(&[dir], &[(dir, name.as_bytes())], false, &mut |tx| {
                                    let ino = tx.alloc_ino()?;
                                    tx.insert_inode(&attr(ino, FileKind::File), None, None, 0)?;
                                    tx.insert_dentry(dir, name.as_bytes(), ino, FileKind::File)?;
                                    tx.touch_dir(dir, Timestamp(i), 0)
                                })
                                .unwrap();
                            }
                        });
                    }
                }
            });
            let rate = (8 * n) as f64 / t.elapsed().as_secs_f64();
            eprintln!("4 stores x 2 threads, {} creates, notify {notify}, sync_commit {sync_commit}: {rate:.0} creates/s", 8 * n);
        }
    }
}

fn create_dir(s: &PgMeta, name: &[u8]) -> Ino {
    s.write_with(|tx| -> Result<Ino> {
        let ino = tx.alloc_ino()?;
        tx.insert_inode(&attr(ino, FileKind::Dir), Some(ROOT_INO), None, 0)?;
        tx.insert_dentry(ROOT_INO, name, ino, FileKind::Dir)?;
        Ok(ino)
    })
    .unwrap()
}

/// Not a check: N small files made durable one by one, as an application
/// that writes each with an fsync: per file a create, a content update
/// (the flush's commit) and `sync` (the fsync), lazy commits proven by
/// the barrier (the default) against every commit waiting for its WAL
/// flush (`sync_commit`), on 1 and 4 threads, with the WAL on this
/// machine's disk (`fsync=on`). `cargo test --release -p cairn-meta
/// --test postgres fsynced_small_files -- --ignored --nocapture`
#[test]
#[ignore]
fn fsynced_small_files_lazy_or_synchronous() {
    let pg = PgServer::start_with(&["fsync=on"]).unwrap();
    pg.create_database("cairn").unwrap();
    let n = 300;
    for round in 0..2 {
        for threads in [1usize, 4] {
            for sync_commit in [false, true] {
                let id = format!("fs{round}{threads}{}", sync_commit as u8);
                let url = fresh(&pg, &id);
                let stores: Vec<Arc<PgMeta>> = (0..threads).map(|_| Arc::new(PgMeta::open_with(&url, &id, codec(), PgOptions { sync_commit, ..Default::default() }).unwrap())).collect();
                let t = Instant::now();
                std::thread::scope(|sc| {
                    for (k, st) in stores.iter().enumerate() {
                        sc.spawn(move || {
                            for i in 0..n / threads {
                                let ino = create(st, ROOT_INO, format!("t{k}-{i}").as_bytes()).unwrap();
                                st.write_with(|tx| tx.update_content(ino, 4096, 4096, Timestamp(2), Timestamp(2), 1)).unwrap();
                                st.sync().unwrap();
                            }
                        });
                    }
                });
                let took = t.elapsed();
                eprintln!(
                    "{n} fsync'd small files, {threads} thread(s), {}: {:.2} ms per file, {:.0} files/s",
                    if sync_commit { "synchronous commits" } else { "lazy commits + proven barrier" },
                    took.as_secs_f64() * 1000.0 / n as f64,
                    n as f64 / took.as_secs_f64()
                );
            }
        }
    }
}

/// The store's statements are never compiled by PostgreSQL's JIT.
/// `enable_seqscan = off` (every pooled connection) costs a statement
/// that can only scan past 10^10, so without `jit = off` the server
/// compiled the cleaner's look at the packs (`pack_bytes`, every second
/// on every mount) with LLVM at each execution: 100-350 ms of server CPU
/// on an empty table (BENCHMARKS §16.7). pg_stat_statements counts the
/// functions JIT made per statement; the same statement through psql
/// with `enable_seqscan = off` shows that this server does compile it
/// (a server without JIT would prove nothing).
#[test]
fn the_store_runs_no_statement_through_jit() {
    let pg = PgServer::start_with(&["shared_preload_libraries=pg_stat_statements"]).unwrap_or_else(|e| panic!("starting a PostgreSQL server for the tests: {e}"));
    pg.create_database("cairn").unwrap();
    pg.psql("cairn", "CREATE EXTENSION pg_stat_statements").unwrap();
    let url = fresh(&pg, "nojit");
    let s = open(&url, "nojit");
    for _ in 0..3 {
        s.read_with(|r| r.pack_bytes()).unwrap();
    }
    let jitted = |like: &str| -> (i64, i64) {
        let out = pg
            .psql("cairn", &format!("SELECT COALESCE(SUM(calls), 0), COALESCE(SUM(jit_functions), 0) FROM pg_stat_statements WHERE query LIKE '{like}'"))
            .unwrap();
        let nums: Vec<i64> = out.split(|c: char| !c.is_ascii_digit()).filter_map(|w| w.parse().ok()).collect();
        match nums[..] {
            [calls, funcs, ..] => (calls, funcs),
            _ => panic!("psql said {out:?}"),
        }
    };
    let (calls, funcs) = jitted("SELECT COALESCE(SUM(size), %)::text, COALESCE(SUM(dead_bytes), %FROM packs");
    assert!(calls >= 3, "pack_bytes ran 3 times, pg_stat_statements saw {calls}");
    assert_eq!(funcs, 0, "the store's pack_bytes was compiled by JIT ({funcs} functions in {calls} runs)");
    // The control: the server JIT-compiles that scan when it may.
    let schema = pg.psql("cairn", "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'cairn_%'").unwrap();
    let schema = schema.split_whitespace().find(|w| w.starts_with("cairn_")).unwrap_or_else(|| panic!("no volume schema in {schema:?}")).to_string();
    pg.psql("cairn", &format!("SET enable_seqscan = off; SELECT SUM(size + 0) AS control_jit FROM {schema}.packs")).unwrap();
    let (_, control) = jitted("%control_jit%");
    assert!(control > 0, "this server does not JIT-compile a penalised scan (no LLVM JIT?): the test proves nothing on it");
}
