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
///
/// `jit = off`: a scan that `enable_seqscan = off` penalises is costed
/// past 10^10, far over `jit_above_cost` and the inlining and optimising
/// thresholds (10^5, 5·10^5), so PostgreSQL compiled such a statement
/// with LLVM at every execution: the cleaner's look at the packs
/// (`SUM(size) FROM packs`, every second on every mount) took 100–350 ms
/// of server CPU on an empty table instead of 0.02 ms, about half of the
/// server's statement time under a create or unlink load (BENCHMARKS
/// §16.7). No statement of the store is long enough for JIT to pay.
pub(super) const SESSION_SETTINGS: &str = "SET enable_seqscan = off; SET jit = off";

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
    /// The database server's clock.
    fn clock_secs(&self) -> Result<i64> {
        self.stmt("reading the server's clock", |c| c.query_one("SELECT floor(extract(epoch FROM clock_timestamp()))::bigint", &[]).map(|r| r.get::<_, i64>(0)))
    }
    fn shared(&self) -> Option<&dyn SharedVolume> {
        Some(self)
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
