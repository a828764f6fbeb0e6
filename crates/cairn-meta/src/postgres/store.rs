//! [`MetaStore`] of the PostgreSQL store: transactions (serializable or
//! locking), their commit outcome after a lost reply, sessions, locks.

use super::*;

/// Deletes a session with its open-file rows and its locks in one
/// statement (a data-modifying `WITH` runs whether or not it is
/// referenced); counts the session rows.
pub(super) const SESSION_DELETE: &str =
    "WITH o AS (DELETE FROM open_files WHERE session = $1), l AS (DELETE FROM locks WHERE session = $1) DELETE FROM sessions WHERE id = $1";

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

/// Settings of every pooled connection. `enable_seqscan = off`: every
/// statement on the hot path has an index to go by, but a statement
/// prepared while the volume's tables were small keeps a plan that scans
/// them whole until autovacuum's next ANALYZE (a minute or more) makes it
/// plan again; meanwhile a create or lookup read every row of `inodes`
/// and `dentries` (measured: 357 creates/s on a volume of 6,000 files
/// before its ANALYZE, 790 after). A statement with no index to use still
/// scans.
pub(super) const SESSION_SETTINGS: &str = "SET enable_seqscan = off";

/// How a try of a transaction begins.
#[derive(Clone, Copy)]
pub(super) enum Mode<'a> {
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
pub(super) fn rollback(c: &mut Conn) {
    let _ = c.client.batch_execute("ROLLBACK");
}

impl PgMeta {
    /// One try of a transaction: `begin`, the closure (`tx` gives it the
    /// operations), for writes the reference counts, then COMMIT.
    pub(super) fn attempt(&self, c: &mut Conn, mode: Mode, f: &mut dyn FnMut(&PgTx) -> Result<()>) -> Step<()> {
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
    pub(super) fn commit_outcome(&self, xid: i64, ident: &Ident) -> Result<bool> {
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
    pub(super) fn lazy_begin(&self, ident: &Ident) {
        let mut l = self.lazy.lock();
        match l.iter_mut().find(|x| x.ident == *ident) {
            Some(x) => x.inflight += 1,
            None => l.push(Lazy { ident: ident.clone(), inflight: 1, done: 0 }),
        }
    }

    /// That COMMIT's answer: committed, or not (then it needs no proof).
    pub(super) fn lazy_end(&self, ident: &Ident, committed: bool) {
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
pub(super) const LOCKS_ON: &str = "SELECT session, owner, flock, kind, lo, hi, pid FROM locks WHERE ino = $1 ORDER BY session, owner, lo";

pub(super) fn lock_rows(rows: Vec<Row>) -> Result<Vec<LockRow>> {
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
