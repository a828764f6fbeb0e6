//! Following other machines' changes to a shared volume
//! (docs/shared-volume.md §6): a cursor over the store's change log, woken
//! by the store's notices and by a poll, that drops this machine's clean
//! in-memory state of every inode another machine changed and hands the
//! changes on to the layer above (FUSE: the kernel's caches).

use super::Volume;
use crate::error::Result;
use crate::meta;
use crate::types::{FileKind, Ino};
use cairn_meta::{ChangeFeed, Changed};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The log is read at least this often even without a notice: a lost
/// `NOTIFY` (or a listener that cannot connect) leaves stale caches for
/// no longer than this (plus the read).
pub const FOLLOW_POLL: Duration = Duration::from_secs(1);

/// Change rows read per query.
const FOLLOW_BATCH: usize = 1024;

/// What another machine changed since the last batch, after this machine's
/// engine dropped its clean state of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChangeBatch {
    /// The cursor fell behind a trim of the log: anything may have changed.
    /// The engine dropped every clean state it had; `inodes` lists those
    /// states' inodes and the root, and other kernel caches run out with
    /// their TTL.
    pub all: bool,
    /// Inodes whose attributes, content or pages changed (or that went).
    pub inodes: BTreeSet<Ino>,
    /// Directory entries `(parent, name)` that appeared or went.
    pub entries: BTreeSet<(Ino, Vec<u8>)>,
}

impl ChangeBatch {
    pub fn is_empty(&self) -> bool {
        !self.all && self.inodes.is_empty() && self.entries.is_empty()
    }
}

/// A cursor over a shared volume's change log (`Volume::follow_changes`).
pub struct ChangeFollower {
    vol: Arc<Volume>,
    feed: Option<Box<dyn ChangeFeed>>,
    /// The last change seq handled.
    cursor: u64,
    /// When the log was last read.
    read_at: Instant,
    /// A notice (or a reconnect, or a failed read) since the last read.
    pending: bool,
}

impl Volume {
    /// A follower of other machines' changes, starting at the newest change
    /// committed now; None unless the volume is shared (its metadata is in
    /// PostgreSQL). If the store's listener cannot connect, the follower
    /// still polls the log every [`FOLLOW_POLL`].
    pub fn follow_changes(self: &Arc<Self>) -> Result<Option<ChangeFollower>> {
        if !self.is_shared() {
            return Ok(None);
        }
        let store = self.meta.store();
        // Subscribe before taking the cursor: a change committed between the
        // two is then both after the cursor and notified.
        let feed = match store.subscribe() {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!("cannot listen for other machines' changes ({e}); polling the change log every {FOLLOW_POLL:?} instead");
                None
            }
        };
        let cursor = store.last_change_seq()?;
        Ok(Some(ChangeFollower { vol: self.clone(), feed, cursor, read_at: Instant::now(), pending: false }))
    }

    /// The session whose change rows are this mount's own, which the
    /// follower skips (its own caches are current). None: this mount has no
    /// session yet, and its own rows are handled like anyone's (harmless:
    /// a clean state is reloaded from the store, the kernel re-asks).
    fn own_change_session(&self) -> Option<u64> {
        // OWN-SESSION FILTER: return this mount's session id here once the
        // volume opens one (issue 26, sessions).
        None
    }

    /// Drops this machine's cached state of a file another machine changed:
    /// a clean state nobody has open is forgotten (the next open or stat
    /// loads the store's row and extents), a clean open one is reloaded in
    /// place (its handles read the new bytes), and a dirty one keeps its
    /// overlay (the last flush of a range wins, docs/shared-volume.md §3).
    pub(crate) fn forget_clean_state(&self, ino: Ino) -> Result<()> {
        let Some(st) = self.files.get(&ino).map(|e| e.value().clone()) else { return Ok(()) };
        let clean = |g: &super::file::FileInner| !g.evicted && !g.is_dirty() && g.last_seq <= g.flushed_seq;
        let idle = {
            let g = st.inner.lock();
            if !clean(&g) {
                return Ok(());
            }
            g.open == 0
        };
        if idle {
            self.files.remove_if(&ino, |_, s| {
                let mut g = s.inner.lock();
                let idle = clean(&g) && g.open == 0;
                if idle {
                    g.evicted = true;
                }
                idle
            });
            if !self.files.contains_key(&ino) {
                return Ok(());
            }
        }
        // Open here: reload its map under the flush lock (no flush of this
        // machine commits it meanwhile), and take it only if the state is
        // still clean (a write since keeps its overlay).
        let _flushing = st.flush_lock.lock();
        let fresh = self.meta.read(|c| {
            let Some(row) = c.get_inode(ino)? else { return Ok(None) };
            if row.attr.kind != FileKind::File || row.attr.nlink == 0 {
                return Ok(None);
            }
            let base = meta::load_extents(c, ino)?;
            Ok(Some((row, base)))
        })?;
        // Gone elsewhere: its open handles here keep the bytes they had.
        let Some((row, base)) = fresh else { return Ok(()) };
        if base.len() != row.attr.size {
            return Ok(());
        }
        let mut g = st.inner.lock();
        if clean(&g) {
            g.base = base;
            g.base_valid = row.attr.size;
            g.size = row.attr.size;
            g.mtime = row.attr.mtime;
            g.ctime = row.attr.ctime;
            g.data_bytes = row.data_bytes;
            g.last_read_end = 0;
            g.read_ahead_to = 0;
        }
        Ok(())
    }
}

impl ChangeFollower {
    /// The last change seq handled.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// Waits up to `max_wait` for a notice of another machine's commit,
    /// then, if one came or [`FOLLOW_POLL`] passed since the last read,
    /// reads the change log from the cursor and drops the engine's clean
    /// state of every changed inode (before returning them, so that what
    /// the layer above fetches again is current). An empty batch: nothing
    /// to do yet. On an error the cursor stays; call again.
    pub fn next(&mut self, max_wait: Duration) -> Result<ChangeBatch> {
        let due = FOLLOW_POLL.saturating_sub(self.read_at.elapsed());
        let wait = max_wait.min(due);
        if !self.pending && !wait.is_zero() {
            match self.feed.as_mut() {
                Some(f) => match f.wait(wait) {
                    Ok(n) => self.pending |= n,
                    Err(e) => {
                        // Could not reconnect: the poll stands in for it.
                        tracing::debug!("change listener: {e}");
                        std::thread::sleep(wait);
                    }
                },
                None => std::thread::sleep(wait),
            }
        }
        if !self.pending && self.read_at.elapsed() < FOLLOW_POLL {
            return Ok(ChangeBatch::default());
        }
        self.read_now()
    }

    /// Reads the change log from the cursor now (see [`ChangeFollower::next`]).
    pub fn read_now(&mut self) -> Result<ChangeBatch> {
        self.pending = true;
        let store = self.vol.meta.store().clone();
        let own = self.vol.own_change_session();
        let mut batch = ChangeBatch::default();
        let start = self.cursor;
        let mut cursor = self.cursor;
        loop {
            let rows = store.changes_since(cursor, FOLLOW_BATCH)?;
            let Some(last) = rows.last() else { break };
            let full = rows.len() == FOLLOW_BATCH;
            cursor = last.seq;
            for ch in rows {
                if own.is_some() && ch.session == own {
                    continue;
                }
                match ch.what {
                    Changed::Inode(ino) => {
                        batch.inodes.insert(ino);
                    }
                    Changed::Entry { parent, name } => {
                        batch.entries.insert((parent, name));
                    }
                }
            }
            if !full {
                break;
            }
        }
        // A trim keeps the newest row, so a cursor it overtook always finds
        // rows; asked after reading them, so a trim meanwhile is seen too.
        if cursor > start && store.changes_trimmed_through()? > start {
            batch.all = true;
            batch.inodes.insert(crate::types::ROOT_INO);
            let all: Vec<Ino> = self.vol.files.iter().map(|e| *e.key()).collect();
            batch.inodes.extend(all);
        }
        for &ino in &batch.inodes {
            self.vol.forget_clean_state(ino)?;
        }
        self.cursor = cursor;
        self.read_at = Instant::now();
        self.pending = false;
        Ok(batch)
    }
}
