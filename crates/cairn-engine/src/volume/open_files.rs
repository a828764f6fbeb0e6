//! Which files this mount has open, told to the metadata store, on a
//! volume many machines share (docs/shared-volume.md §7 "Open files").
//!
//! A file whose last name goes on one machine may be open on another;
//! POSIX says the open one keeps reading it. So a mount with a session
//! keeps a row `(ino, session, gen)` in the store's registry while it has
//! the file open, and an inode without names is freed only when no row
//! names it: by the unlink itself when nobody else has it open, else by
//! the last machine to close it, else (that machine crashed) by the
//! cleaner once the dead session and its rows are removed.
//!
//! Cost: a create writes its row in the create's own transaction; an open
//! of a file this mount does not have open already writes one; a close
//! writes nothing at once, its row is deleted with the others closed in the
//! same flush round (one statement), unless the file is opened again
//! first. `gen` tells such a batched delete from a newer open's row.
//!
//! Invariant (per file, under its state lock): while `open > 0` the row
//! exists and is not queued for deletion; while `open == 0` there is no row
//! or it is queued in `closing`.

use super::*;
use crate::meta::MetaTx;
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;

#[derive(Default)]
pub(crate) struct OpenFiles {
    gen: AtomicU64,
    /// Rows of files closed here, by inode, to delete in the next round.
    closing: Mutex<HashMap<Ino, u64>>,
}

impl OpenFiles {
    fn next_gen(&self) -> u64 {
        self.gen.fetch_add(1, Ordering::Relaxed) + 1
    }
}

impl Volume {
    /// This mount's session in a store many machines share (None for a
    /// volume only this process opens, and for a read-only mount: only a
    /// read-write mount of a shared volume opens one, crate::open).
    pub(crate) fn session_id(&self) -> Option<u64> {
        self.cloud.as_ref().and_then(|c| c.session.get().copied())
    }

    /// The open-file row of a regular file this mount is creating, for the
    /// create's transaction (`MetaTx::create_node`): (session,
    /// generation), None where nothing registers open files. Once
    /// committed it is queued for deletion (`created_registered`): the
    /// create's open takes it back at no cost; a `mknod` nobody opens
    /// loses it in the next round.
    pub(crate) fn created_open(&self) -> Option<(u64, u64)> {
        let session = self.session_id()?;
        Some((session, self.open_files.next_gen()))
    }

    /// After the create's transaction committed.
    pub(crate) fn created_registered(&self, row: Option<(u64, u64)>) {
        if let Some((ino, gen)) = row {
            self.open_files.closing.lock().insert(ino, gen);
        }
    }

    /// The first open of `ino` on this mount (its state lock held): takes
    /// back a row queued for deletion, or writes one, and returns its
    /// generation for the file's state (None: nothing registers open
    /// files). NotFound if another machine freed the file meanwhile.
    pub(crate) fn register_open(&self, ino: Ino) -> Result<Option<u64>> {
        let Some(session) = self.session_id() else { return Ok(None) };
        if let Some(gen) = self.open_files.closing.lock().remove(&ino) {
            return Ok(Some(gen));
        }
        let gen = self.open_files.next_gen();
        if !self.meta.write(|tx| Ok(tx.mark_open(session, ino, gen)?))? {
            return Err(Error::not_found(format!("inode {ino} was removed (by another machine)")));
        }
        Ok(Some(gen))
    }

    /// The last close of `ino` on this mount (its state lock held), whose
    /// row has generation `open_gen`: the row is queued for the next round.
    pub(crate) fn register_close(&self, ino: Ino, open_gen: u64) {
        if self.session_id().is_some() && open_gen != 0 {
            self.open_files.closing.lock().insert(ino, open_gen);
        }
    }

    /// Whether inode `ino`, whose last name goes in `tx`, may be freed in
    /// it: nobody here has it open or dirty, the kernel does not hold it,
    /// and no other session has it open.
    pub(crate) fn free_in_tx(&self, tx: &dyn MetaTx, ino: Ino) -> Result<bool> {
        if self.files.contains_key(&ino) || self.kernel_holds(ino) {
            return Ok(false);
        }
        match self.session_id() {
            Some(s) => Ok(!tx.open_elsewhere(ino, s)?),
            None => Ok(true),
        }
    }

    /// Before freeing `ino` in `tx` (no handle open here): drops this
    /// session's row and says whether another session still has it open.
    pub(crate) fn open_elsewhere_on_free(&self, tx: &dyn MetaTx, ino: Ino) -> Result<bool> {
        if !self.is_shared() {
            return Ok(false);
        }
        let me = self.session_id().unwrap_or(0);
        if me != 0 {
            tx.mark_closed(me, &[(ino, 0)])?;
        }
        Ok(tx.open_elsewhere(ino, me)?)
    }

    /// After `ino` was freed or found open elsewhere: its queued row went
    /// with it.
    pub(crate) fn forget_closing(&self, ino: Ino) {
        self.open_files.closing.lock().remove(&ino);
    }

    /// Deletes the rows of the files closed since the last round, in one
    /// transaction; on failure they stay queued (a row left longer only
    /// delays freeing a file another machine unlinks).
    pub(crate) fn drain_closed(&self) {
        let Some(session) = self.session_id() else { return };
        let rows: Vec<(Ino, u64)> = std::mem::take(&mut *self.open_files.closing.lock()).into_iter().collect();
        if rows.is_empty() {
            return;
        }
        if let Err(e) = self.meta.write(|tx| Ok(tx.mark_closed(session, &rows)?)) {
            tracing::warn!(files = rows.len(), "deleting the open-file rows of closed files (will retry): {e}");
            let mut q = self.open_files.closing.lock();
            for (ino, gen) in rows {
                q.entry(ino).or_insert(gen);
            }
        }
    }
}
