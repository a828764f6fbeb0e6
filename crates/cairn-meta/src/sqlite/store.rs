//! [`MetaStore`] of the SQLite store: reads, grouped writes, barriers.

use super::*;

impl MetaStore for SqliteMeta {
    /// `f` sees one consistent state (the connection is this process's only
    /// one, held for the call), including changes not yet committed.
    fn read(&self, f: &mut dyn FnMut(&dyn MetaRead) -> Result<()>) -> Result<()> {
        let g = self.shared.conn.lock();
        f(&SqlTx::new(&g.c, &*self.codec, None))
    }

    /// `f` runs in one read transaction, so the WAL's shared-memory locks
    /// (fcntl calls) are taken once, not once a statement (a third of a
    /// cold 1,024-file archive walk went there). Inside an open write
    /// transaction it already is.
    fn read_many(&self, f: &mut dyn FnMut(&dyn MetaRead) -> Result<()>) -> Result<()> {
        let mut g = self.shared.conn.lock();
        if g.open_since.is_some() {
            return f(&SqlTx::new(&g.c, &*self.codec, None));
        }
        let tx = g.c.transaction_with_behavior(TransactionBehavior::Deferred)?;
        f(&SqlTx::new(&tx, &*self.codec, None))?;
        tx.commit()?;
        Ok(())
    }

    /// The change joins the open write transaction as a savepoint (group
    /// commit, see [`GROUP_WINDOW`]); it is seen by every later read at
    /// once, and is durable after the next `sync`. Never retried.
    fn write(&self, f: &mut dyn FnMut(&dyn MetaTx) -> Result<()>) -> Result<()> {
        let sh = &*self.shared;
        let mut g = sh.conn.lock();
        if let Some(why) = &g.broken {
            return Err(Error::io(why.clone()));
        }
        if g.open_since.is_none() {
            g.c.execute_batch("BEGIN IMMEDIATE")?;
            g.open_since = Some(std::time::Instant::now());
            sh.wake.notify_one();
        }
        // Cached statements: these run on every change.
        g.c.prepare_cached("SAVEPOINT change")?.execute([])?;
        let r = {
            let conn = &*g;
            let tx = SqlTx::new(&conn.c, &*self.codec, Some(&conn.ids));
            f(&tx).and_then(|()| tx.finish()).and_then(|()| {
                conn.c.prepare_cached("RELEASE change")?.execute([])?;
                Ok(())
            })
        };
        match r {
            Ok(()) => {
                g.pending += 1;
                if sh.window.is_zero() || g.pending >= GROUP_MAX {
                    sh.commit(&mut g)?;
                }
                Ok(())
            }
            Err(e) => {
                // Undo this change only; the others in the group stay.
                let _ = g.c.execute_batch("ROLLBACK TO change; RELEASE change");
                sh.rollbacks.fetch_add(1, Ordering::SeqCst);
                // A reservation this change made is gone: the next
                // allocation reserves again (numbers it handed out stay
                // skipped, never reused).
                g.ids.reserved.set(0);
                if g.c.is_autocommit() {
                    // SQLite rolled the whole transaction back (a full disk,
                    // an I/O error): the group's acknowledged changes too.
                    let lost = g.pending;
                    g.open_since = None;
                    g.pending = 0;
                    if lost > 0 {
                        let msg = format!("metadata changes were rolled back by SQLite ({e}); remount the volume (the journal replays file data)");
                        tracing::error!("{msg}");
                        g.broken = Some(msg);
                    }
                }
                Err(e)
            }
        }
    }

    fn alloc_chunk_id(&self) -> Result<u64> {
        Ok(self.next_chunk.fetch_add(1, Ordering::SeqCst))
    }
    fn commit(&self) -> Result<()> {
        SqliteMeta::commit(self)
    }
    fn sync(&self) -> Result<()> {
        SqliteMeta::sync(self)
    }
    fn is_durable(&self) -> bool {
        SqliteMeta::is_durable(self)
    }
    fn abandon(&self) {
        SqliteMeta::abandon(self)
    }
    fn checkpoint(&self) -> Result<()> {
        SqliteMeta::checkpoint(self)
    }
    fn prefetch(&self, max_bytes: u64) {
        SqliteMeta::prefetch(self, max_bytes)
    }
    fn shipping(&self) -> Option<&dyn ShipChanges> {
        Some(self)
    }
    /// In memory, on this machine's monotonic clock; the id comes from
    /// `info.session_seq` (one write), so ids never repeat across opens.
    fn open_session(&self, who: &SessionInfo, ttl: std::time::Duration) -> Result<u64> {
        let id = self.write_with(|tx| -> Result<u64> {
            let id = tx.get_info(SESSION_SEQ_KEY)?.unwrap_or(0) + 1;
            tx.set_info(SESSION_SEQ_KEY, id)?;
            Ok(id as u64)
        })?;
        let now = std::time::Instant::now();
        self.sessions.lock().insert(id, LocalSession { who: who.clone(), started: Timestamp::now(), expires: now + ttl });
        Ok(id)
    }
    fn renew_session(&self, id: u64, ttl: std::time::Duration) -> Result<()> {
        let mut ss = self.sessions.lock();
        let now = std::time::Instant::now();
        match ss.get_mut(&id) {
            Some(s) if s.expires > now => {
                s.expires = now + ttl;
                Ok(())
            }
            Some(_) => Err(Error::new(ErrorKind::SessionLost, format!("metadata session {id} expired before it was renewed: stop writing and remount"))),
            None => Err(Error::new(ErrorKind::SessionLost, format!("metadata session {id} is gone: stop writing and remount"))),
        }
    }
    fn close_session(&self, id: u64) -> Result<()> {
        self.sessions.lock().remove(&id);
        self.release_session_locks(id)?;
        Ok(())
    }
    fn sessions(&self) -> Result<Vec<SessionRow>> {
        Ok(self.sessions.lock().iter().map(|(&id, s)| s.row(id)).collect())
    }
    fn expired_sessions(&self) -> Result<Vec<SessionRow>> {
        Ok(self.sessions()?.into_iter().filter(|s| s.expired).collect())
    }
    fn remove_session(&self, id: u64) -> Result<bool> {
        let was = self.sessions.lock().remove(&id).is_some();
        self.release_session_locks(id)?;
        Ok(was)
    }
    /// An in-process flag: the volume lock keeps other processes out.
    fn try_maintenance(&self) -> Result<Option<Box<dyn MaintenanceGuard>>> {
        if self.maintenance.compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst).is_err() {
            return Ok(None);
        }
        Ok(Some(Box::new(LocalMaintenance(self.maintenance.clone()))))
    }
    /// One machine: nobody else to tell, no log.
    fn changes_since(&self, _after: u64, _limit: usize) -> Result<Vec<Change>> {
        Ok(Vec::new())
    }
    fn last_change_seq(&self) -> Result<u64> {
        Ok(0)
    }
    fn trim_changes(&self, _older_than: std::time::Duration) -> Result<u64> {
        Ok(0)
    }
    fn changes_trimmed_through(&self) -> Result<u64> {
        Ok(0)
    }
    fn subscribe(&self) -> Result<Option<Box<dyn ChangeFeed>>> {
        Ok(None)
    }
    /// Under one mutex: the table is this process's alone.
    fn set_lock(&self, req: &LockRequest) -> Result<LockOutcome> {
        let mut all = self.locks.lock();
        let held: Vec<LockRow> = all.iter().filter(|(i, _)| *i == req.ino).map(|(_, r)| *r).collect();
        match locks::plan(&held, req) {
            Err(c) => Ok(LockOutcome::Conflict(c)),
            Ok(mine) => {
                all.retain(|(i, r)| !(*i == req.ino && r.owner == req.owner && r.style == req.style));
                all.extend(mine.into_iter().map(|r| (req.ino, r)));
                Ok(LockOutcome::Granted)
            }
        }
    }
    fn test_lock(&self, req: &LockRequest) -> Result<Option<LockRow>> {
        let held: Vec<LockRow> = self.locks.lock().iter().filter(|(i, _)| *i == req.ino).map(|(_, r)| *r).collect();
        Ok(locks::conflict(&held, req))
    }
    fn release_locks(&self, ino: Ino, owner: LockOwner, style: LockStyle) -> Result<u64> {
        let mut all = self.locks.lock();
        let n = all.len();
        all.retain(|(i, r)| !(*i == ino && r.owner == owner && r.style == style));
        Ok((n - all.len()) as u64)
    }
    fn release_session_locks(&self, session: u64) -> Result<u64> {
        let mut all = self.locks.lock();
        let n = all.len();
        all.retain(|(_, r)| r.owner.session != session);
        Ok((n - all.len()) as u64)
    }
    fn locks_on(&self, ino: Ino) -> Result<Vec<LockRow>> {
        let mut v: Vec<LockRow> = self.locks.lock().iter().filter(|(i, _)| *i == ino).map(|(_, r)| *r).collect();
        v.sort_by_key(|r| (r.owner, r.start));
        Ok(v)
    }
}

/// `info` key: the last session id handed out.
pub const SESSION_SEQ_KEY: &str = "session_seq";
