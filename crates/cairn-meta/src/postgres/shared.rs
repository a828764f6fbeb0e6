//! The shared-volume capabilities of the PostgreSQL store
//! ([`SharedVolume`]): sessions and the maintenance lock, uploads and
//! flush rounds in flight, file locks, journal marks. (The change log is
//! `changes.rs`.)

use super::*;

impl SharedVolume for PgMeta {}

impl Sessions for PgMeta {
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
}

impl InFlight for PgMeta {
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
}

impl FileLocks for PgMeta {
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

impl JournalMarks for PgMeta {
    /// Marks of journal `id` in `journal_marks`; with `legacy`, the
    /// inodes' frozen `jseq` column is copied in first (never lowering a
    /// mark).
    fn set_journal(&self, id: u64, legacy: bool) -> Result<()> {
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
        Ok(())
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
}
