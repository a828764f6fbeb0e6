//! Following other machines' changes to a shared volume
//! (docs/shared-volume.md §6): a cursor over the store's change log, woken
//! by the store's notices and by a poll, that drops this machine's clean
//! in-memory state of every inode another machine changed and hands the
//! changes on to the layer above (FUSE: the kernel's caches).

use super::Volume;
use crate::error::Result;
use crate::meta;
use crate::types::{FileKind, Ino};
use cairn_meta::{ChangeCursor, ChangeFeed, Changed};
use std::collections::BTreeSet;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
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

/// The waiting side of a shared volume's change log
/// (`Volume::follow_changes`). One thread calls [`ChangeFollower::next`]
/// in a loop and hands each batch to the kernel, then calls
/// [`ChangeFollower::done`]. The cursor itself is the volume's: its
/// `open` reads the log first ([`Volume::catch_up`]: close-to-open without
/// waiting for the notice), whoever opens.
pub struct ChangeFollower {
    vol: Arc<Volume>,
    /// Only the thread calling `next` waits on it.
    feed: Mutex<Option<Box<dyn ChangeFeed>>>,
    /// Calls of `next` that a notice woke (or found waiting).
    notices: AtomicU64,
}

/// A shared volume's position in its change log (`Volume::changes`).
pub(crate) struct FollowState {
    /// The position in the change log: the last seq handled and the seqs
    /// below it that may still commit (the store asks them again).
    cursor: ChangeCursor,
    /// When the log was last read.
    read_at: Instant,
    /// A notice (or a reconnect) since the last read.
    pending: bool,
    /// Read (by `catch_up`) but not yet returned by `next`.
    queued: ChangeBatch,
    /// Inodes whose engine state was dropped but whose kernel caches were
    /// not invalidated yet (returned by `next`, `done` not called).
    unsent: BTreeSet<Ino>,
    /// A follower hands batches on (`follow_changes` was called): without
    /// one, what `catch_up` reads is not queued for anybody.
    following: bool,
}

impl FollowState {
    /// At the newest change committed now (the volume's open).
    pub(crate) fn at(cursor: ChangeCursor) -> Mutex<FollowState> {
        Mutex::new(FollowState { cursor, read_at: Instant::now(), pending: false, queued: ChangeBatch::default(), unsent: BTreeSet::new(), following: false })
    }
}

impl Volume {
    /// A follower of other machines' changes, from the volume's cursor
    /// (taken at its open) on; None unless the volume is shared (its
    /// metadata is in PostgreSQL). If the store's listener cannot connect,
    /// the follower still polls the log every [`FOLLOW_POLL`].
    pub fn follow_changes(self: &Arc<Self>) -> Result<Option<ChangeFollower>> {
        self.follow_changes_with(|store| store.subscribe())
    }

    /// [`Volume::follow_changes`] with the store's `subscribe` replaced by
    /// `subscribe` (tests: a listener that cannot connect, or one whose
    /// every wait fails, must leave the follower to its poll).
    #[doc(hidden)]
    pub fn follow_changes_with(self: &Arc<Self>, subscribe: impl FnOnce(&dyn cairn_meta::SharedVolume) -> cairn_meta::Result<Option<Box<dyn ChangeFeed>>>) -> Result<Option<ChangeFollower>> {
        let Some(changes) = self.changes.as_ref() else { return Ok(None) };
        let feed = match self.meta.need_shared().and_then(subscribe) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!("cannot listen for other machines' changes ({e}); polling the change log every {FOLLOW_POLL:?} instead");
                None
            }
        };
        // What committed between the volume's open and the subscription
        // was not notified: the first `next` reads the log.
        let mut s = changes.lock();
        s.pending = true;
        s.following = true;
        drop(s);
        Ok(Some(ChangeFollower { vol: self.clone(), feed: Mutex::new(feed), notices: AtomicU64::new(0) }))
    }

    /// Reads the change log now, as an `open` on a shared volume does
    /// first: another machine's commit that returned before the open is
    /// then in the engine's state whether or not its notice came. The batch
    /// goes to the follower's next `next`. True if `ino` changed and the
    /// kernel may still hold its old pages (the opener should not keep
    /// them); false on a volume nobody else writes.
    pub fn catch_up(&self, ino: Ino) -> Result<bool> {
        let Some(changes) = self.changes.as_ref() else { return Ok(false) };
        let mut s = changes.lock();
        let batch = self.read_changes(&mut s)?;
        let changed = batch.all || batch.inodes.contains(&ino) || s.unsent.contains(&ino) || s.queued.inodes.contains(&ino);
        if s.following {
            s.queued.merge(batch);
        }
        Ok(changed)
    }

    /// Reads the change log from the cursor and drops the engine's clean
    /// states of what changed.
    fn read_changes(&self, s: &mut FollowState) -> Result<ChangeBatch> {
        let store = self.meta.need_shared()?;
        // This mount's own rows carry its session and are skipped (its
        // caches are current). No session yet: they are handled like
        // anyone's (harmless: a clean state is reloaded, the kernel re-asks).
        let own = self.session_id();
        let mut batch = ChangeBatch::default();
        let start = s.cursor.after;
        // Advanced on a copy: an error leaves the cursor as it was.
        let mut cursor = s.cursor.clone();
        loop {
            // Each row once: a hole that filled is delivered and forgotten.
            let rows = store.read_changes(&mut cursor, FOLLOW_BATCH)?;
            if rows.is_empty() {
                break;
            }
            let full = rows.len() == FOLLOW_BATCH;
            for ch in rows {
                if own.is_some() && ch.session == own {
                    continue;
                }
                match ch.what {
                    Changed::Inode(ino) => {
                        batch.inodes.insert(ino);
                    }
                    Changed::Entry { parent, name } => {
                        // The directory's listing changed too: the kernel
                        // may cache it (FOPEN_CACHE_DIR).
                        batch.inodes.insert(parent);
                        batch.entries.insert((parent, name));
                    }
                }
            }
            if !full {
                break;
            }
        }
        // A trim keeps the newest row, so a cursor it overtook always finds
        // rows, and the mark read with them (`cursor.trimmed`) is the one
        // of their snapshot.
        // So does a store that found another server history (a crash or a
        // failover): the old log's seqs say nothing about the new one's.
        if (cursor.after > start && cursor.trimmed > start) || cursor.history != s.cursor.history {
            batch.all = true;
            batch.inodes.insert(crate::types::ROOT_INO);
            let all: Vec<Ino> = self.files.iter().map(|e| *e.key()).collect();
            batch.inodes.extend(all);
        }
        for &ino in &batch.inodes {
            self.forget_clean_state(ino)?;
        }
        s.cursor = cursor;
        s.read_at = Instant::now();
        s.pending = false;
        Ok(batch)
    }


    /// Drops this machine's cached state of a file another machine changed:
    /// a clean state nobody has open is forgotten (the next open or stat
    /// loads the store's row and extents), a clean open one is reloaded in
    /// place (its handles read the new bytes), and a dirty one is re-based
    /// on the commit: its overlay stays on top of the committed map, so
    /// its reads show both machines' ranges and its flush commits over
    /// what the store holds (the last flush of a range wins,
    /// docs/shared-volume.md §3; the flush re-bases too if this comes
    /// late).
    pub(crate) fn forget_clean_state(&self, ino: Ino) -> Result<()> {
        // The store lost commits (a crash or failover): its rows may be
        // older than this machine's states, not newer; the journal replay
        // (resume.rs) rebuilds every state instead.
        if self.meta.store().is_lost() {
            return Ok(());
        }
        let Some(st) = self.files.get(&ino).map(|e| e.value().clone()) else { return Ok(()) };
        let clean = |g: &super::file::FileInner| !g.evicted && !g.is_dirty() && g.last_seq <= g.flushed_seq;
        let idle = {
            let g = st.inner.lock();
            if g.evicted {
                return Ok(());
            }
            if !clean(&g) {
                drop(g);
                if self.meta.shared().is_some() {
                    let _flushing = st.flush_lock.lock();
                    self.rebase(&st)?;
                }
                return Ok(());
            }
            g.open == 0
        };
        if idle {
            self.files.forget_if(ino, |g| clean(g) && g.open == 0);
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
            g.take_committed(&row, base);
        }
        Ok(())
    }
}

impl ChangeBatch {
    fn merge(&mut self, other: ChangeBatch) {
        self.all |= other.all;
        self.inodes.extend(other.inodes);
        self.entries.extend(other.entries);
    }
}

impl ChangeFollower {
    fn state(&self) -> &Mutex<FollowState> {
        self.vol.changes.as_ref().expect("a follower is made only for a volume with a change log")
    }

    /// The last change seq handled.
    pub fn cursor(&self) -> u64 {
        self.state().lock().cursor.after
    }

    /// How many calls of `next` a notice of another machine's commit woke
    /// (tests: the notices arrive, the poll is not all that works).
    pub fn notices(&self) -> u64 {
        self.notices.load(Ordering::Relaxed)
    }

    /// Waits up to `max_wait` for a notice of another machine's commit,
    /// then, if one came or [`FOLLOW_POLL`] passed since the last read,
    /// reads the change log from the cursor and drops the engine's clean
    /// state of every changed inode (before returning them, so that what
    /// the layer above fetches again is current). Also returns what
    /// `catch_up` read meanwhile. An empty batch: nothing to do yet. On an
    /// error the cursor stays; call again. Call [`ChangeFollower::done`]
    /// once the batch's kernel caches are dropped.
    pub fn next(&self, max_wait: Duration) -> Result<ChangeBatch> {
        let (pending, due) = {
            let s = self.state().lock();
            (s.pending || !s.queued.is_empty(), FOLLOW_POLL.saturating_sub(s.read_at.elapsed()))
        };
        let wait = max_wait.min(due);
        let mut notified = false;
        if !pending && !wait.is_zero() {
            let mut feed = self.feed.lock();
            match feed.as_mut() {
                Some(f) => match f.wait(wait) {
                    Ok(n) => notified = n,
                    Err(e) => {
                        // Could not reconnect: the poll stands in for it.
                        tracing::debug!("change listener: {e}");
                        std::thread::sleep(wait);
                    }
                },
                None => std::thread::sleep(wait),
            }
        }
        if notified {
            self.notices.fetch_add(1, Ordering::Relaxed);
        }
        let mut s = self.state().lock();
        s.pending |= notified;
        let mut batch = if s.pending || s.read_at.elapsed() >= FOLLOW_POLL {
            s.pending = true;
            self.vol.read_changes(&mut s)?
        } else {
            ChangeBatch::default()
        };
        batch.merge(std::mem::take(&mut s.queued));
        s.unsent.extend(batch.inodes.iter().copied());
        Ok(batch)
    }

    /// The kernel's caches of `batch` (from `next`) are dropped.
    pub fn done(&self, batch: &ChangeBatch) {
        let mut s = self.state().lock();
        for ino in &batch.inodes {
            // Read again meanwhile: still to be sent.
            if !s.queued.inodes.contains(ino) {
                s.unsent.remove(ino);
            }
        }
    }
}
