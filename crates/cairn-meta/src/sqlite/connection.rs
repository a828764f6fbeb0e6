//! The connection: opening it, the group commit (the committer thread and
//! `sync`), durability, and the store's own open and create.

use super::*;

impl Shared {
    /// Commits the open write transaction, if any. Once a group was lost
    /// this fails for good: a later barrier must not report durable what
    /// was rolled back (the journal would then retire its only copy).
    pub(super) fn commit(&self, g: &mut Conn) -> Result<()> {
        if let Some(why) = &g.broken {
            return Err(Error::io(why.clone()));
        }
        if g.open_since.is_none() {
            return Ok(());
        }
        g.open_since = None;
        g.pending = 0;
        match g.c.execute_batch("COMMIT") {
            Ok(()) => {
                self.commits.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
            Err(e) => {
                // SQLite may have rolled back already; make sure.
                let _ = g.c.execute_batch("ROLLBACK");
                self.rollbacks.fetch_add(1, Ordering::SeqCst);
                let msg = format!("committing metadata changes failed ({e}); remount the volume (the journal replays file data)");
                tracing::error!("{msg}");
                g.broken = Some(msg.clone());
                Err(Error::from(e))
            }
        }
    }

    pub(super) fn committer(&self) {
        let mut g = self.conn.lock();
        loop {
            if self.stop.load(Ordering::SeqCst) {
                let _ = self.commit(&mut g);
                return;
            }
            match g.open_since {
                None => {
                    // Tests widen the gap between the check and the wait,
                    // where a stop set without this lock would be missed.
                    #[cfg(test)]
                    if tests::PAUSE_BEFORE_WAIT.load(Ordering::SeqCst) {
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                    self.wake.wait(&mut g)
                }
                Some(t) => {
                    let due = t + self.window;
                    if std::time::Instant::now() >= due {
                        let _ = self.commit(&mut g);
                    } else {
                        self.wake.wait_until(&mut g, due);
                    }
                }
            }
        }
    }
}

pub(super) fn open_conn(path: &Path) -> Result<Connection> {
    // SQLite would create the database 0644; its -wal and -shm files take
    // the database's mode, so one made 0600 first keeps all three private.
    if !path.exists() {
        if let Err(e) = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                return Err(Error::os(format_args!("creating metadata {}", path.display()), &e));
            }
        }
    }
    let c = Connection::open(path).map_err(|e| Error::io(format!("opening metadata {}: {e}", path.display())))?;
    c.busy_timeout(std::time::Duration::from_secs(30))?;
    // WAL without fsync at commit (fsync(2) and flushes sync the WAL
    // explicitly); checkpoint rarely, since a checkpoint rewrites pages,
    // and once the WAL starts over, cut it back to 16 MiB (the cleaner
    // checkpoints it too: docs/frugal.md §8); read through mmap to save
    // read(2) calls.
    c.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA cache_size=-65536; PRAGMA temp_store=MEMORY;
         PRAGMA wal_autocheckpoint=16384; PRAGMA journal_size_limit=16777216; PRAGMA mmap_size=268435456;",
    )?;
    // `rarray(?)`: a bound list of ids as a table, for bulk statements.
    rusqlite::vtab::array::load_module(&c)?;
    Ok(c)
}

impl SqliteMeta {
    /// Creates a fresh database with the root directory.
    pub fn create(path: &Path, root: Caller0) -> Result<()> {
        let c = open_conn(path)?;
        c.execute_batch(SCHEMA)?;
        let now = Timestamp::now().0;
        c.execute("INSERT INTO info(key, value) VALUES('schema', ?1)", [SCHEMA_VERSION])?;
        c.execute(
            "INSERT INTO inodes(ino, kind, perm, uid, gid, nlink, atime, mtime, ctime, btime, parent)
             VALUES(1, ?1, ?2, ?3, ?4, 2, ?5, ?5, ?5, ?5, 1)",
            params![FileKind::Dir.code(), root.perm, root.uid, root.gid, now],
        )?;
        // Durable before `init` reports success: the checkpoint fsyncs the
        // database file, and the directory keeps its name.
        c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")?;
        if let Some(dir) = path.parent() {
            std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| Error::os(format_args!("fsync {}", dir.display()), &e))?;
        }
        Ok(())
    }

    /// Opens an existing database, refusing unknown schema versions.
    /// `exclusive`: this process is the only user (it holds the volume lock);
    /// only then are changes grouped, for `group_window` (see [`GROUP_WINDOW`]).
    pub fn open(path: &Path, exclusive: bool, group_window: std::time::Duration, codec: Arc<dyn PageCodec>) -> Result<Self> {
        if !path.exists() {
            return Err(Error::config(format!("metadata database {} is missing", path.display())));
        }
        let w = open_conn(path)?;
        if exclusive {
            w.execute_batch("PRAGMA locking_mode=EXCLUSIVE;")?;
        }
        let v: Option<i64> = w.query_row("SELECT value FROM info WHERE key='schema'", [], |r| r.get(0)).optional()
            .map_err(|e| Error::config(format!("{} is not a Cairn metadata database: {e}", path.display())))?;
        let upgraded = v != Some(SCHEMA_VERSION);
        match v {
            Some(SCHEMA_VERSION) => {}
            Some(1) if exclusive => migrate_v1(&w)?,
            Some(2) if exclusive => migrate_v2(&w)?,
            Some(v @ (1 | 2)) => return Err(Error::config(format!("metadata schema version {v} must be upgraded: open the volume read-write once (mount or fsck)"))),
            Some(v) => return Err(Error::config(format!("metadata schema version {v} is not supported (this build reads {SCHEMA_VERSION})"))),
            None => return Err(Error::config("metadata database has no schema version")),
        }
        let next_chunk = max_chunk_id(&w)? + 1;
        let m = SqliteMeta::from_conn(path, w, if exclusive { group_window } else { std::time::Duration::ZERO }, codec);
        m.next_chunk.store(next_chunk, Ordering::SeqCst);
        m.upgraded.store(upgraded, Ordering::SeqCst);
        Ok(m)
    }

    /// Group commit with window `window` (zero: every change commits at once).
    pub(super) fn from_conn(path: &Path, c: Connection, window: std::time::Duration, codec: Arc<dyn PageCodec>) -> SqliteMeta {
        let shared = std::sync::Arc::new(Shared {
            conn: Mutex::new(Conn { capture: None, c, open_since: None, pending: 0, broken: None, ids: Ids::default() }),
            wake: parking_lot::Condvar::new(),
            stop: std::sync::atomic::AtomicBool::new(false),
            commits: AtomicU64::new(1),
            rollbacks: AtomicU64::new(0),
            window,
        });
        let committer = (!window.is_zero()).then(|| {
            let sh = shared.clone();
            std::thread::Builder::new().name("cairn-meta-commit".into()).spawn(move || sh.committer()).expect("spawning the metadata committer")
        });
        SqliteMeta {
            path: path.to_path_buf(),
            upgraded: std::sync::atomic::AtomicBool::new(false),
            shared,
            durable: AtomicU64::new(0),
            syncing: parking_lot::Mutex::new(()),
            committer,
            codec,
            next_chunk: AtomicU64::new(1),
        }
    }


    /// Runs `f` on the connection itself (tests of query plans).
    #[cfg(test)]
    pub(super) fn conn_read<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        f(&self.shared.conn.lock().c)
    }

    /// Write transactions rolled back so far.
    pub fn rollbacks(&self) -> u64 {
        self.shared.rollbacks.load(Ordering::SeqCst)
    }

    /// What a `kill -9` leaves (for crash tests): the open write
    /// transaction is rolled back instead of committed, and the committer
    /// stops. Committed transactions stay, as their WAL frames would.
    pub fn abandon(&self) {
        {
            let mut g = self.shared.conn.lock();
            if g.open_since.take().is_some() {
                let _ = g.c.execute_batch("ROLLBACK");
            }
            g.pending = 0;
            g.broken = Some("the volume was abandoned (simulated crash)".into());
        }
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake.notify_all();
    }

    /// Commits the open write transaction now (not durable yet: see
    /// [`SqliteMeta::sync`]).
    pub fn commit(&self) -> Result<()> {
        let mut g = self.shared.conn.lock();
        self.shared.commit(&mut g)
    }

    /// Asks the kernel to read the database and its WAL into the page cache
    /// in the background, when they are at most `max_bytes` together: an
    /// operation about to visit a large part of the metadata (archives, tree
    /// clones) then waits for a few large reads instead of one 4 KiB read per
    /// B-tree page. A hint: errors are ignored.
    pub fn prefetch(&self, max_bytes: u64) {
        use std::os::fd::AsRawFd;
        let wal = PathBuf::from(format!("{}-wal", self.path.display()));
        let files: Vec<std::fs::File> = [self.path.clone(), wal].iter().filter_map(|p| std::fs::File::open(p).ok()).collect();
        let total: u64 = files.iter().filter_map(|f| f.metadata().ok()).map(|m| m.len()).sum();
        if total > max_bytes {
            return;
        }
        for f in &files {
            // SAFETY: a valid descriptor; advice only.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_WILLNEED) };
        }
    }

    /// Makes every transaction committed before the call durable (one
    /// fdatasync of the WAL; none when no commit happened since the last
    /// sync). With `synchronous=NORMAL` a commit only writes its WAL frames,
    /// so this is the barrier every ordering rule of `docs/format.md`
    /// ("Order of writes") waits on before it deletes anything.
    pub fn sync(&self) -> Result<()> {
        self.commit()?;
        // Commits counted before the fsync starts are in the WAL's page cache.
        let upto = self.shared.commits.load(Ordering::SeqCst);
        if self.durable.load(Ordering::SeqCst) >= upto {
            return Ok(());
        }
        let _leader = self.syncing.lock();
        if self.durable.load(Ordering::SeqCst) >= upto {
            return Ok(()); // the fsync this caller waited for covered its commits
        }
        // This fsync covers every commit so far, those of callers queued
        // behind it too.
        let upto = self.shared.commits.load(Ordering::SeqCst);
        let wal = PathBuf::from(format!("{}-wal", self.path.display()));
        match std::fs::File::open(&wal) {
            Ok(f) => f.sync_data().map_err(|e| Error::os(format_args!("fsync {}", wal.display()), &e))?,
            // No WAL: everything was checkpointed into the database file
            // (which SQLite fsyncs when it checkpoints).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format!("opening {} to fsync it: {e}", wal.display()))),
        }
        self.durable.fetch_max(upto, Ordering::SeqCst);
        Ok(())
    }

    /// Whether every committed transaction is known durable (for tests of
    /// the ordering rules).
    pub fn is_durable(&self) -> bool {
        let g = self.shared.conn.lock();
        g.open_since.is_none() && self.durable.load(Ordering::SeqCst) >= self.shared.commits.load(Ordering::SeqCst)
    }

    /// Starts recording every committed change, for [`SqliteMeta::take_changes`]
    /// (cloud volumes ship them to the bucket as metadata deltas).
    pub fn capture_changes(&self) -> Result<()> {
        let mut g = self.shared.conn.lock();
        if g.capture.is_none() {
            g.capture = Some(Capture::start(&g.c)?);
        }
        Ok(())
    }

    /// Commits the open group, then returns a SQLite patchset of every row
    /// changed since the last call (each row once, with its final values;
    /// changes undone before the call leave nothing) and starts recording
    /// afresh. None when nothing changed. Runs under the connection lock
    /// for the time it takes to compare the changed rows, no longer: the
    /// caller uploads the bytes after.
    pub fn take_changes(&self) -> Result<Option<Vec<u8>>> {
        let mut g = self.shared.conn.lock();
        self.shared.commit(&mut g)?;
        let Some(cap) = g.capture.as_mut() else {
            return Err(Error::invalid("metadata changes are not being captured"));
        };
        if cap.0.is_empty() {
            return Ok(None);
        }
        let mut out = Vec::new();
        cap.0.patchset_strm(&mut out)?;
        let fresh = Capture::start(&g.c)?;
        g.capture = Some(fresh);
        Ok((!out.is_empty()).then_some(out))
    }

    /// Whether changes were recorded since the last [`SqliteMeta::take_changes`]
    /// (false when changes are not being captured).
    pub fn has_changes(&self) -> bool {
        self.shared.conn.lock().capture.as_ref().is_some_and(|c| !c.0.is_empty())
    }

    /// A copy of the whole database as of the last commit, as the bytes of
    /// a SQLite file, made in memory (the copy never touches the disk), and
    /// restarts change capture so later changes are relative to it.
    pub fn snapshot(&self) -> Result<Vec<u8>> {
        let mut g = self.shared.conn.lock();
        self.shared.commit(&mut g)?;
        let mut mem = Connection::open_in_memory()?;
        {
            let b = rusqlite::backup::Backup::new(&g.c, &mut mem)?;
            b.run_to_completion(1 << 16, std::time::Duration::ZERO, None)?;
        }
        if g.capture.is_some() {
            let fresh = Capture::start(&g.c)?;
            g.capture = Some(fresh);
        }
        drop(g);
        let data = mem.serialize(rusqlite::MAIN_DB)?;
        Ok(data.to_vec())
    }

    /// Folds the WAL back into the database (on clean shutdown).
    pub fn checkpoint(&self) -> Result<()> {
        let mut g = self.shared.conn.lock();
        self.shared.commit(&mut g)?;
        g.c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")?;
        Ok(())
    }
}
