//! Resuming without a remount after the metadata store lost commits
//! (docs/shared-volume.md, "After a proven loss").
//!
//! A PostgreSQL store whose `sync` cannot prove that its lazy commits
//! survived (the server crashed, or failed over to a standby, before they
//! were flushed) refuses every later change and sync (`MetaStore::is_lost`).
//! What those commits carried is still here: the namespace changes were
//! not acknowledged (no sync returned Ok after them), and every byte of
//! file content is in the write-back journal, which is never retired
//! without a sync. The next mount would replay that journal against what
//! the database holds now; this does the same inside the running mount,
//! under the flush lock (no flush commits meanwhile), and then lets the
//! store accept changes again:
//!
//! 1. The journal's live records are read back, as an open reads them.
//! 2. Each file whose state this mount holds is rebuilt on the store's row
//!    as it is now: the row's base, then the journal records it had
//!    folded into its base since the row's position (the commits that may
//!    be lost), then its own unflushed changes on top (its overlay and a
//!    truncation), so nothing a writer did since is dropped. A file whose
//!    row is gone (its create was lost) is dropped from the table; a writer
//!    that still has it open gets EIO from its fsync (`FileTable::lost`).
//! 3. Files with records whose state is not held are loaded from the store
//!    and the records after their position replayed, as at a mount.
//! 4. The store drops the unproven commits of the old history and resumes;
//!    the rebuilt files are due, and the next rounds commit them.
//!
//! Records of a file are appended under its lock, so with the lock held
//! every record of it below its `last_seq` is in the journal; and a file's
//! base moves only in a flush, which waits for the flush lock held here.
//! So the records a held state had folded into its base were all in the
//! journal before step 1 read it.

use super::file::{apply_record, rebuild, FileState};
use super::Volume;
use crate::error::Result;
use crate::journal::Record;
use crate::types::Ino;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

impl Volume {
    /// If the store lost commits, replays the journal on what it holds
    /// now and resumes (see the module comment). The caller holds
    /// `flusher.mutex`. Returns whether it did; an error (the server still
    /// unreachable) leaves the loss in place for the next round to try.
    pub(crate) fn resume_after_loss(&self) -> Result<bool> {
        let store = self.meta.store().clone();
        if self.opts.read_only || !store.is_lost() {
            return Ok(false);
        }
        let started = std::time::Instant::now();
        let held: Vec<Arc<FileState>> = self.files.iter().map(|e| e.value().clone()).collect();
        let records = self.journal.live_records()?;
        let mut by_ino: BTreeMap<Ino, Vec<Record>> = BTreeMap::new();
        for r in records {
            by_ino.entry(r.ino).or_default().push(r);
        }
        let none: Vec<Record> = Vec::new();
        let (mut rebuilt, mut gone) = (0usize, 0usize);
        let mut done: HashSet<Ino> = HashSet::new();
        for st in &held {
            let ino = st.ino;
            done.insert(ino);
            let _flushing = st.flush_lock.lock();
            let fresh = self.load_file_row(ino)?;
            let mut g = st.inner.lock();
            if g.evicted {
                continue;
            }
            let Some((row, base)) = fresh else {
                // Created (or last committed) only in commits that are
                // gone: the table drops it, a holder's fsync fails.
                self.files.drop_lost(st, g);
                gone += 1;
                continue;
            };
            if row.jseq >= g.flushed_seq && row.cver == g.base_cver {
                continue; // its commits survived
            }
            // The records it had folded into its base since the row's
            // position go beneath its own changes.
            let upto = g.flushed_seq;
            rebuild(&mut g, ino, &row, base, by_ino.get(&ino).unwrap_or(&none), upto)?;
            rebuilt += 1;
        }
        // Files not held: loaded and replayed as at a mount. A state made
        // here is locked before it is in the table, so no writer gets in
        // between the load and the replay.
        let mut replayed = 0usize;
        for (ino, recs) in &by_ino {
            if done.contains(ino) {
                continue;
            }
            let Some((row, base)) = self.load_file_row(*ino)? else { continue };
            let new = Volume::state_from_row(*ino, &row, base);
            let mut n = new.inner.lock();
            let st = self.files.entry(*ino).or_insert_with(|| new.clone()).clone();
            if Arc::ptr_eq(&st, &new) {
                let from = n.flushed_seq;
                for r in recs.iter().filter(|r| r.seq > from) {
                    apply_record(&mut n, r)?;
                }
                replayed += 1;
                continue;
            }
            // Loaded by someone since the table was read: its base is the
            // store's now and its overlay holds only writes made since,
            // newer than every record read: the records go beneath them.
            drop(n);
            let _flushing = st.flush_lock.lock();
            let Some((row, base)) = self.load_file_row(*ino)? else { continue };
            let mut g = st.inner.lock();
            if g.evicted {
                continue;
            }
            rebuild(&mut g, *ino, &row, base, recs, u64::MAX)?;
            replayed += 1;
        }
        store.resume_after_loss()?;
        tracing::warn!(
            rebuilt,
            replayed,
            gone,
            "metadata commits lost in a database crash or failover were redone from the journal in {:.1} s; the mount resumes",
            started.elapsed().as_secs_f64()
        );
        self.flusher.signal.poke();
        Ok(true)
    }
}
