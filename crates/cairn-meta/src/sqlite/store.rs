//! [`MetaStore`] of the SQLite store: reads, grouped writes, barriers.

use super::*;

impl MetaStore for SqliteMeta {
    fn schema_upgraded(&self) -> bool {
        self.upgraded.load(std::sync::atomic::Ordering::SeqCst)
    }
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
}
