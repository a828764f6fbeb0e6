//! File content: the per-file write-back state and read/write/truncate.
//!
//! A file's content is its committed extent map (`base`), cut at
//! `base_valid` by truncations not yet flushed, with an overlay of journal
//! pieces on top. Invariant: `base_valid <= base.len()` and
//! `base_valid <= size`; bytes in `[0, size)` come from the overlay if it
//! covers them, else from `base` below `base_valid`, else they are zeros.

use super::Volume;
use crate::error::{Error, ErrorKind, Result};
use crate::extent::{ExtentMap, JLoc, Source};
use crate::journal::RecordKind;
use crate::meta;
use crate::trace::Event;
use crate::types::{Attr, FileKind, Ino, Timestamp};
use dashmap::DashMap;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::sync::Arc;
use std::time::Instant;

/// A file's place in a walk of the tree: (directory, name, inode).
pub(crate) type WalkKey = (Ino, Arc<[u8]>, Ino);

/// Dirty bytes above which `fsync` flushes into packs instead of syncing the journal.
const FSYNC_FLUSH_BYTES: u64 = 16 << 20;

/// How long a close on a shared volume waits for the flusher's group
/// round before it flushes its file itself.
const CLOSE_GROUP_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How far from the end of the last read a read may start and still count
/// as sequential (for read-ahead).
const READ_AHEAD_SLACK: u64 = 4 << 20;

/// Read requests at least this large come from the kernel's read-ahead,
/// which it does only for sequential access (fio's random reads arrive as
/// single 4 KiB pages; a sequential stream as 128 KiB to 1 MiB requests).
const KERNEL_READ_AHEAD_MIN: u32 = 64 << 10;

/// Largest file size: the kernel's for FUSE (2^63 - 1 bytes; see
/// [`crate::extent::MAX_FILE_SPAN`]).
pub const MAX_FILE_SIZE: u64 = crate::extent::MAX_FILE_SPAN;

/// Where an overlay piece's bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PieceSrc {
    /// In the journal, starting here.
    Data(JLoc),
    /// Zeros (a punched hole).
    Zero,
}

/// A range of bytes written since the last flush.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Piece {
    pub len: u64,
    pub src: PieceSrc,
    pub seq: u64,
}

impl Piece {
    pub(crate) fn slice(&self, from: u64, len: u64) -> Piece {
        let src = match self.src {
            PieceSrc::Data(l) => PieceSrc::Data(JLoc { offset: l.offset + from, ..l }),
            PieceSrc::Zero => PieceSrc::Zero,
        };
        Piece { len, src, seq: self.seq }
    }
}

/// In-memory state of a regular file that is open or has unflushed changes.
pub(crate) struct FileState {
    pub ino: Ino,
    pub inner: Mutex<FileInner>,
    /// Held while a flush of this file is prepared and committed, and by
    /// truncation, so that the two never interleave.
    pub flush_lock: Arc<Mutex<()>>,
    /// Its directory and name, when this mount created or renamed it:
    /// where a walk of the tree meets it (a directory lists its names in
    /// order), the order files written at once go down on a tape
    /// (docs/tape.md §10).
    pub placed_at: Mutex<Option<(Ino, Arc<[u8]>)>>,
}

/// The file table: the in-memory states of the files this mount has open
/// or holds changes of, by inode, and the files lost in a database crash
/// or failover. Looking a state up reads the map (`Deref`); the changes
/// a flush round makes to a state go through [`FileState::apply_commit`]
/// and [`FileTable::forget_if`], a resume's drop of a file the store lost
/// through [`FileTable::drop_lost`].
#[derive(Default)]
pub(crate) struct FileTable {
    map: DashMap<Ino, Arc<FileState>>,
    /// Files whose creation was in metadata commits lost in a database
    /// crash or failover while this mount had them open or held changes
    /// of them ([`FileTable::drop_lost`]): their fsync fails with EIO.
    lost: Mutex<HashSet<Ino>>,
}

impl std::ops::Deref for FileTable {
    type Target = DashMap<Ino, Arc<FileState>>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl FileTable {
    /// Drops the state of `ino` from the table if `idle` says so of it
    /// (under its lock); a holder of the dropped state sees it evicted and
    /// looks the file up again. True if it went.
    pub(crate) fn forget_if(&self, ino: Ino, idle: impl FnOnce(&FileInner) -> bool) -> bool {
        self.map
            .remove_if(&ino, |_, st| {
                let mut g = st.inner.lock();
                let idle = idle(&g);
                if idle {
                    g.evicted = true;
                }
                idle
            })
            .is_some()
    }

    /// Files with changes not yet committed.
    pub(crate) fn dirty_count(&self) -> u64 {
        self.map.iter().filter(|e| e.value().inner.lock().is_dirty()).count() as u64
    }

    /// Drops the state `st` of a file whose row the store no longer has
    /// after it lost commits in a crash or failover (resume.rs): its
    /// create, or every commit of it, was among them. Nothing acknowledged
    /// it, so a file that was open or held unflushed changes is counted
    /// lost ([`FileTable::is_lost`]: its holder's fsync fails) instead of
    /// being answered Ok later. A holder of the state sees it evicted. The
    /// caller holds the file's flush lock; `g` is the state's lock, let go
    /// before the table's (the order `forget_if` takes them in).
    pub(crate) fn drop_lost(&self, st: &Arc<FileState>, mut g: parking_lot::MutexGuard<'_, FileInner>) {
        if g.open > 0 || g.last_seq > g.flushed_seq {
            self.lost.lock().insert(st.ino);
        }
        g.evicted = true;
        drop(g);
        self.map.remove_if(&st.ino, |_, s| Arc::ptr_eq(s, st));
    }

    /// Whether `ino` was dropped as lost with changes nothing acknowledged
    /// ([`FileTable::drop_lost`]).
    pub(crate) fn is_lost(&self, ino: Ino) -> bool {
        self.lost.lock().contains(&ino)
    }

    /// Drops the state of a file being freed (no names, no handles),
    /// after a round flushing it ends (its flush lock): a holder of the
    /// state sees it evicted, with nothing left to flush.
    pub(crate) fn drop_freed(&self, ino: Ino) {
        if let Some((_, st)) = self.map.remove(&ino) {
            let _fl = st.flush_lock.lock();
            let mut g = st.inner.lock();
            g.evicted = true;
            g.overlay.clear();
            g.dirty_bytes = 0;
        }
    }
}

/// What a flush round committed of one file ([`FileState::apply_commit`]).
pub(crate) struct CommittedRound {
    /// The committed extent map, and the content version it was built on.
    pub map: ExtentMap,
    pub cver: u64,
    /// Committed size: the file's size, or where a held-back tail starts.
    pub size: u64,
    /// The newest record folded into the round.
    pub seq: u64,
    /// Records up to here are in the committed map (below `seq` when a
    /// tail is held back).
    pub committed_seq: u64,
    /// Overlay pieces from this offset on were left out of the map
    /// (`u64::MAX`: none).
    pub kept_from: u64,
}

pub(crate) struct FileInner {
    pub base: ExtentMap,
    /// The content version `base` was loaded at (`InodeRow::cver`; 0 in a
    /// store that keeps none): a flush commits against `base` only while
    /// the store's row still says it (docs/shared-volume.md §3).
    pub base_cver: u64,
    pub base_valid: u64,
    pub size: u64,
    pub overlay: BTreeMap<u64, Piece>,
    pub dirty_bytes: u64,
    /// Seq of this file's newest journal record.
    pub last_seq: u64,
    /// Records up to here are in `base`.
    pub flushed_seq: u64,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    /// Size or times differ from the metadata row.
    pub meta_dirty: bool,
    pub open: u32,
    /// Closed since its last change: flush soon.
    pub due: bool,
    pub dirty_since: Option<Instant>,
    /// Committed non-hole bytes (for `st_blocks`).
    pub data_bytes: u64,
    /// Removed from the volume's table; holders must look it up again.
    pub evicted: bool,
    /// Its last name went while it was open: free it at the last release.
    pub unlinked: bool,
    /// The generation of this mount's open-file row while it has the file
    /// open, on a volume many machines share (0: none; open_files.rs).
    pub open_gen: u64,
    /// Part of a snapshot: every change fails with EROFS.
    pub read_only: bool,
    /// Where the last read ended: reads near it are sequential and fetch
    /// the chunks after them ahead of time.
    pub last_read_end: u64,
    /// How far read-ahead has been asked for (0: not reading in order).
    pub read_ahead_to: u64,
    /// The read-ahead window asked for last (0: none yet; the first is
    /// [`Volume::read_ahead_windows`]); each renewal, when less than half
    /// of it is left, asks for twice as much, back to the first at a jump.
    pub read_ahead_window: u64,
}

impl FileInner {
    pub fn is_dirty(&self) -> bool {
        !self.overlay.is_empty() || self.base_valid < self.base.len() || self.size != self.base.len() || self.meta_dirty
    }

    /// Puts `piece` at `start`, replacing what the overlay had there.
    pub fn overlay_insert(&mut self, start: u64, piece: Piece) {
        let end = start + piece.len;
        let mut hit: Vec<u64> = Vec::new();
        if let Some((&s, p)) = self.overlay.range(..start).next_back() {
            if s + p.len > start {
                hit.push(s);
            }
        }
        hit.extend(self.overlay.range(start..end).map(|(&s, _)| s));
        for s in hit {
            let p = self.overlay.remove(&s).expect("present");
            self.dirty_bytes -= p.len;
            if s < start {
                let head = p.slice(0, start - s);
                self.dirty_bytes += head.len;
                self.overlay.insert(s, head);
            }
            if s + p.len > end {
                let tail = p.slice(end - s, s + p.len - end);
                self.dirty_bytes += tail.len;
                self.overlay.insert(end, tail);
            }
        }
        self.dirty_bytes += piece.len;
        self.overlay.insert(start, piece);
    }

    /// Drops overlay bytes at or beyond `size`.
    fn overlay_clip(&mut self, size: u64) {
        let beyond: Vec<u64> = self.overlay.range(size..).map(|(&s, _)| s).collect();
        for s in beyond {
            let p = self.overlay.remove(&s).expect("present");
            self.dirty_bytes -= p.len;
        }
        if let Some((&s, p)) = self.overlay.range(..size).next_back() {
            if s + p.len > size {
                let p = *p;
                self.dirty_bytes -= p.len;
                let head = p.slice(0, size - s);
                self.dirty_bytes += head.len;
                self.overlay.insert(s, head);
            }
        }
    }

    /// Re-bases this state on a file's committed content `base` at row
    /// `row`, which another machine committed since this state's base was
    /// loaded (docs/shared-volume.md §3 "Two writers of one file"): the
    /// committed map becomes the base, and this machine's own changes
    /// since its last flush, the overlay's ranges and a truncation, stay
    /// on top of it, so the next flush commits both machines' ranges and
    /// drops only pages the store links now. The size: a truncation here
    /// wins (the last flush of the size wins); otherwise the larger of the
    /// committed size and where this machine's writes end. False (and
    /// nothing changed) if the state is at that version already.
    pub(crate) fn rebase_onto(&mut self, row: &cairn_meta::InodeRow, base: ExtentMap) -> bool {
        if self.base_cver == row.cver {
            return false;
        }
        let dirty = self.is_dirty();
        let old_len = self.base.len();
        let new_len = base.len();
        let truncated = self.base_valid < old_len;
        let written_to = self.overlay.iter().next_back().map_or(0, |(s, p)| s + p.len);
        let size = if truncated {
            self.size
        } else if self.size > old_len {
            self.size.max(new_len)
        } else {
            new_len.max(written_to)
        };
        self.base_valid = if truncated { self.base_valid.min(new_len) } else { new_len }.min(size);
        self.overlay_clip(size);
        self.size = size;
        self.base = base;
        self.base_cver = row.cver;
        self.data_bytes = row.data_bytes;
        if dirty {
            self.mtime = self.mtime.max(row.attr.mtime);
            self.ctime = self.ctime.max(row.attr.ctime);
            self.meta_dirty = true;
        } else {
            // Nothing of this machine's to keep: the state is the commit.
            self.mtime = row.attr.mtime;
            self.ctime = row.attr.ctime;
        }
        true
    }

    /// A clean state takes a file's committed content `base` at row `row`
    /// (another machine's commit, read from the change log): its reads
    /// start over, with no read-ahead.
    pub(crate) fn take_committed(&mut self, row: &cairn_meta::InodeRow, base: ExtentMap) {
        self.base = base;
        self.base_cver = row.cver;
        self.base_valid = row.attr.size;
        self.size = row.attr.size;
        self.mtime = row.attr.mtime;
        self.ctime = row.attr.ctime;
        self.data_bytes = row.data_bytes;
        self.last_read_end = 0;
        self.read_ahead_to = 0;
        self.read_ahead_window = 0;
    }

    /// Takes a committed metadata-only edit (edit.rs): the new map at
    /// content version `cver`, `size` bytes long, changed at `now`.
    pub(crate) fn take_edit(&mut self, map: ExtentMap, cver: u64, size: u64, data_bytes: u64, now: Timestamp) {
        self.base_cver = cver;
        self.base = map;
        self.base_valid = size;
        self.size = size;
        self.data_bytes = data_bytes;
        self.mtime = now;
        self.ctime = now;
    }

    fn check_writable(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::new(ErrorKind::ReadOnly, "snapshots are read-only"));
        }
        Ok(())
    }

    fn touch(&mut self, now: Timestamp) {
        self.mtime = now;
        self.ctime = now;
        self.mark_dirty();
    }

    /// Content changed; the times are someone else's to set.
    fn mark_dirty(&mut self) {
        self.meta_dirty = true;
        self.due = false;
        if self.dirty_since.is_none() {
            self.dirty_since = Some(Instant::now());
        }
    }
}

impl FileState {
    fn new(ino: Ino, base: ExtentMap, cver: u64, a: &Attr, data_bytes: u64, jseq: u64, unlinked: bool, read_only: bool) -> Arc<Self> {
        Arc::new(FileState {
            ino,
            inner: Mutex::new(FileInner {
                base_cver: cver,
                base_valid: a.size,
                size: a.size,
                base,
                overlay: BTreeMap::new(),
                dirty_bytes: 0,
                last_seq: jseq,
                flushed_seq: jseq,
                mtime: a.mtime,
                ctime: a.ctime,
                meta_dirty: false,
                open: 0,
                due: false,
                dirty_since: None,
                data_bytes,
                evicted: false,
                unlinked,
                open_gen: 0,
                read_only,
                last_read_end: 0,
                read_ahead_to: 0,
                read_ahead_window: 0,
            }),
            flush_lock: Arc::new(Mutex::new(())),
            placed_at: Mutex::new(None),
        })
    }

    /// Takes the times a setattr committed to the file's row (`mtime`
    /// only if it set one): an open file's times in memory win over the
    /// row, so they follow it, and the file's next commit writes them.
    pub(crate) fn take_set_times(&self, mtime: Option<Timestamp>, ctime: Timestamp) {
        let mut g = self.inner.lock();
        if let Some(t) = mtime {
            g.mtime = t;
        }
        g.ctime = ctime;
        g.meta_dirty = true;
        if g.dirty_since.is_none() {
            g.dirty_since = Some(Instant::now());
        }
    }

    /// Applies a flush round's commit of this file (the caller holds its
    /// `flush_lock`): the committed map becomes the base, the overlay
    /// keeps only what the round did not commit (newer records, pieces
    /// left out by the round's bound, a held-back tail clipped to where the
    /// committed map ends), and the file is clean if nothing is left.
    pub(crate) fn apply_commit(&self, p: CommittedRound) {
        let mut g = self.inner.lock();
        g.base = p.map;
        g.base_cver = p.cver;
        g.base_valid = p.size;
        g.data_bytes = g.base.data_bytes();
        let seq = p.seq;
        let keep: Vec<(u64, Piece)> = g
            .overlay
            .iter()
            .filter(|(&s0, pc)| pc.seq > seq || s0 >= p.kept_from || (p.committed_seq < seq && s0 + pc.len > p.size))
            .map(|(&s0, pc)| (s0, *pc))
            .collect();
        g.overlay.clear();
        g.dirty_bytes = 0;
        for (s0, pc) in keep {
            g.dirty_bytes += pc.len;
            g.overlay.insert(s0, pc);
        }
        // A held-back tail stays in the overlay (clipped to where the
        // committed map ends) until a later flush.
        if p.committed_seq < seq {
            let held: Vec<(u64, Piece)> = g
                .overlay
                .range(..)
                .filter(|(&s0, pc)| pc.seq <= seq && s0 < p.kept_from && s0 + pc.len > p.size)
                .map(|(&s0, pc)| (s0, *pc))
                .collect();
            for (s0, pc) in held {
                let _ = g.overlay.remove(&s0);
                g.dirty_bytes -= pc.len;
                let from = p.size.saturating_sub(s0);
                g.overlay_insert(s0 + from, pc.slice(from, pc.len - from));
            }
        }
        g.flushed_seq = p.committed_seq;
        if g.last_seq == seq && p.committed_seq == seq {
            g.meta_dirty = false;
        }
        if !g.is_dirty() {
            g.dirty_since = None;
        } else if p.kept_from == u64::MAX || g.dirty_since.is_none() {
            g.dirty_since = Some(Instant::now());
        }
        // Cut short by the round's bound: the file stays as old as
        // it was, so the next round goes on with it.
    }

    /// Its place in a walk of the tree: files this mount created or
    /// renamed by their directory and name, then the others by inode (the
    /// key only orders what goes to a tape first).
    pub(crate) fn walk_key(&self) -> WalkKey {
        match &*self.placed_at.lock() {
            Some((dir, name)) => (*dir, name.clone(), self.ino),
            None => (Ino::MAX, Arc::from(&[][..]), self.ino),
        }
    }
}

/// One part of a read.
enum ReadPart {
    Zero(u64),
    /// Planned with the segment's file open, so a segment retired before
    /// the read still reads.
    Journal { file: Arc<File>, loc: JLoc, len: u64 },
    Chunk { id: u64, off: u64, len: u64 },
}

/// The bytes of a read: a slice of one cached chunk (no copy), or bytes
/// assembled from several parts.
pub enum ReadBytes {
    Slice(Arc<Vec<u8>>, std::ops::Range<usize>),
    Owned(Vec<u8>),
}

impl ReadBytes {
    pub fn into_vec(self) -> Vec<u8> {
        match self {
            ReadBytes::Slice(c, r) => c[r].to_vec(),
            ReadBytes::Owned(v) => v,
        }
    }
}

impl std::ops::Deref for ReadBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ReadBytes::Slice(c, r) => &c[r.clone()],
            ReadBytes::Owned(v) => v,
        }
    }
}

/// What [`Volume::open`] tells the layer above.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opened {
    /// The file did not change on another machine since this machine last
    /// read the change log: pages the kernel cached of it are current.
    pub keep_cache: bool,
}

impl Volume {
    /// The state of regular file `ino`, loaded from the metadata if needed.
    pub(crate) fn file_state(&self, ino: Ino) -> Result<Arc<FileState>> {
        if let Some(st) = self.files.get(&ino) {
            return Ok(st.clone());
        }
        let (row, base) = self.meta.read(|c| {
            let row = c.get_inode(ino)?.ok_or_else(|| Error::not_found(format!("inode {ino} does not exist")))?;
            if row.attr.kind != FileKind::File {
                let kind = if row.attr.kind == FileKind::Dir { ErrorKind::IsDir } else { ErrorKind::Invalid };
                return Err(Error::new(kind, format!("inode {ino} is not a regular file")));
            }
            Ok((row, meta::load_extents(c, ino)?))
        })?;
        if base.len() != row.attr.size {
            return Err(Error::corrupt(format!("inode {ino}: extents cover {} bytes but its size is {}", base.len(), row.attr.size)));
        }
        let st = FileState::new(ino, base, row.cver, &row.attr, row.data_bytes, row.jseq, row.attr.nlink == 0, row.read_only());
        Ok(self.files.entry(ino).or_insert(st).clone())
    }

    /// Re-bases a file's state on what the store holds now, if another
    /// machine committed the file since the state's base was loaded
    /// ([`FileInner::rebase_onto`]); the caller holds the file's
    /// `flush_lock`. True if it did (counted in the metrics).
    pub(crate) fn rebase(&self, st: &FileState) -> Result<bool> {
        let ino = st.ino;
        // Rows older than the state after a loss: replayed instead (resume.rs).
        if self.meta.store().is_lost() {
            return Ok(false);
        }
        // Gone: the flush finds it gone too and commits nothing of it.
        let Some((row, base)) = self.load_file_row(ino)? else { return Ok(false) };
        let done = st.inner.lock().rebase_onto(&row, base);
        if done {
            self.metrics.flush_rebases.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::debug!(ino, cver = row.cver, "another machine committed the file since this one loaded it: re-based its unflushed changes on that commit");
        }
        Ok(done)
    }

    /// Registers the state of a file just created as `name` in `dir` (saves
    /// a metadata read at open).
    pub(crate) fn adopt_new_file(&self, a: &Attr, dir: Ino, name: &[u8]) {
        let st = self.files.entry(a.ino).or_insert_with(|| FileState::new(a.ino, ExtentMap::new(), 0, a, 0, 0, false, false)).clone();
        st.placed_at.lock().get_or_insert_with(|| (dir, name.into()));
    }

    /// Follows a rename of `ino` to `name` in `dir`, if its state is here,
    /// so its place in a walk (what goes to a tape first) is where it now
    /// lies: a file written under a temporary name and renamed at close
    /// (rsync, editors) then goes down among its final neighbours.
    pub(crate) fn file_moved(&self, ino: Ino, dir: Ino, name: &[u8]) {
        if let Some(e) = self.files.get(&ino) {
            *e.value().placed_at.lock() = Some((dir, name.into()));
        }
    }

    /// Runs `f` on the file's locked state, retrying if the state was evicted
    /// between lookup and lock.
    pub(super) fn with_file<T>(&self, ino: Ino, mut f: impl FnMut(&FileState, &mut FileInner) -> Result<T>) -> Result<T> {
        loop {
            let st = self.file_state(ino)?;
            let mut g = st.inner.lock();
            if g.evicted {
                continue;
            }
            return f(&st, &mut g);
        }
    }

    /// Merges in-memory size and times into a stored attribute.
    pub(crate) fn overlay_attr(&self, a: &mut Attr) {
        if a.kind != FileKind::File {
            return;
        }
        if let Some(st) = self.files.get(&a.ino) {
            let g = st.inner.lock();
            a.size = g.size;
            a.mtime = g.mtime;
            a.ctime = g.ctime.max(a.ctime);
            a.blocks = (g.data_bytes + g.dirty_bytes).min(g.size).div_ceil(512);
        }
    }

    /// Fails unless `ino` is a regular file whose content may change: EISDIR
    /// for a directory, EROFS in a snapshot (or on a read-only volume).
    pub fn check_file_writable(&self, ino: Ino) -> Result<()> {
        self.check_writable()?;
        self.with_file(ino, |_, g| g.check_writable())
    }

    /// Registers an open handle on a regular file. On a shared volume it
    /// first reads the change log (`catch_up`), so that a file another
    /// machine closed before this open shows that machine's bytes
    /// (close-to-open, docs/shared-volume.md §3).
    pub fn open(&self, ino: Ino) -> Result<Opened> {
        // Unread, the log only costs the kernel's pages: the open goes on.
        let changed = self.catch_up(ino).unwrap_or_else(|e| {
            tracing::debug!("open of inode {ino}: reading other machines' changes: {e}");
            true
        });
        self.open_created(ino)?;
        Ok(Opened { keep_cache: !changed })
    }

    /// Registers an open handle on a regular file this mount has just
    /// created (FUSE `create`): no other machine's change to it can be in
    /// the kernel's cache, so the change log is not read (a round trip per
    /// create saved).
    pub fn open_created(&self, ino: Ino) -> Result<()> {
        self.with_file(ino, |_, g| {
            if g.open == 0 {
                if let Some(gen) = self.register_open(ino)? {
                    g.open_gen = gen;
                }
            }
            g.open += 1;
            Ok(())
        })
    }

    /// Drops an open handle; the last one of an unlinked file frees it.
    pub fn release(&self, ino: Ino) -> Result<()> {
        let last = self.with_file(ino, |_, g| {
            g.open = g.open.saturating_sub(1);
            if g.open == 0 {
                g.due |= self.close_makes_due();
                self.register_close(ino, g.open_gen);
            }
            Ok(g.open == 0)
        })?;
        if last {
            // One statement (a shared volume: one round trip, not three).
            let nlink = self.meta.read_one(|c| Ok(c.get_inode(ino)?))?.map(|r| r.attr.nlink);
            // Otherwise the flusher picks the file up on its next round, together
            // with every other file closed meanwhile, so small files share packs.
            // (If the kernel still holds it, its FORGET frees it.)
            if nlink == Some(0) && !self.held_by_kernel(ino) {
                self.free_inode(ino)?;
            } else if self.opts.read_only {
                // No flusher evicts clean states here: forget the file now,
                // so the next getattr or open reads the store again (on a
                // bucket volume with PostgreSQL metadata another machine
                // may have committed the file since).
                self.files.forget_if(ino, |g| g.open == 0 && !g.is_dirty());
            }
        }
        Ok(())
    }

    /// Called when a file lost its last name: frees it now, or leaves it to
    /// its last release or, if the kernel still holds it, to its FORGET.
    pub(crate) fn last_name_gone(&self, ino: Ino) -> Result<()> {
        let open = match self.files.get(&ino) {
            Some(st) => {
                let mut g = st.inner.lock();
                g.unlinked = true;
                g.open
            }
            None => 0,
        };
        if open == 0 && !self.held_by_kernel(ino) {
            self.free_inode(ino)?;
        }
        Ok(())
    }

    /// Close-time hint: flush this file soon (where a close makes a file
    /// due, see `close_makes_due`).
    pub fn flush_file(&self, ino: Ino) -> Result<()> {
        if !self.close_makes_due() {
            return Ok(());
        }
        if let Some(st) = self.files.get(&ino) {
            st.inner.lock().due = true;
        }
        Ok(())
    }

    /// Whether closing a file makes it due for the next flush round. On a
    /// tape it does: a closed file's data goes out in one run. Elsewhere a
    /// closed file waits for its age (`flush_age`) or journal pressure
    /// like an open one: a short-lived file (PostMark's, a compiler's
    /// temporary, a file renamed over) deleted within that time is never
    /// chunked, hashed or packed, and files closed together still share a
    /// round and its packs. What fsync and close-to-open promise does not
    /// depend on it: both flush or sync on their own.
    fn close_makes_due(&self) -> bool {
        !self.chunks.backend.capabilities().cheap_ranged_reads
    }

    /// What a close must do on a volume other machines open too (its
    /// metadata is in PostgreSQL): commit the file, so that an `open`
    /// elsewhere after this returns reads these bytes (close-to-open,
    /// docs/shared-volume.md §3, §11.3). Files closed meanwhile share the
    /// round: the flusher takes every closed file at once. Elsewhere a
    /// close only marks the file due (`flush_file`).
    pub fn close_commit(&self, ino: Ino) -> Result<()> {
        let Some(st) = self.files.get(&ino).map(|e| e.value().clone()) else { return Ok(()) };
        let target = {
            let mut g = st.inner.lock();
            g.due = true;
            g.last_seq
        };
        if !self.is_shared() || self.opts.read_only {
            return Ok(());
        }
        let committed = || {
            let g = st.inner.lock();
            g.evicted || !g.is_dirty() || (g.flushed_seq >= target && !g.meta_dirty)
        };
        if committed() {
            return Ok(());
        }
        // Two rounds after the poke: the first may have chosen its files
        // before this one was due.
        let seen = *self.flusher.signal.done.lock();
        self.flusher.signal.poke();
        let deadline = std::time::Instant::now() + CLOSE_GROUP_WAIT;
        let mut last = seen;
        while last < seen + 2 && std::time::Instant::now() < deadline {
            {
                let mut d = self.flusher.signal.done.lock();
                if *d == last {
                    self.flusher.signal.done_cv.wait_until(&mut d, deadline);
                }
                last = *d;
            }
            // The file's lock is never taken under the round counter's.
            if committed() {
                return Ok(());
            }
        }
        // The background round failed or is slow: flush it here, so the
        // close reports what went wrong.
        self.flush_round_of(true, Some(ino))?;
        Ok(())
    }

    /// Makes the file's acknowledged writes and the namespace durable.
    ///
    /// A little dirty data is made durable where it is, in the journal (one
    /// fdatasync). A lot is flushed into packs instead: that writes it to
    /// disk once, not once in the journal and again in a pack.
    pub fn fsync(&self, ino: Ino, _datasync: bool) -> Result<()> {
        if self.opts.read_only {
            return Ok(());
        }
        if self.files.is_lost(ino) {
            return Err(Error::io(format!(
                "inode {ino} was created in metadata commits that were lost in a database crash or failover before they were durable; its data is gone"
            )));
        }
        if self.durable_remotely() {
            // `--durability remote`: the file's bytes go into packs in the
            // bucket, then the metadata version that names them.
            self.flush_round_of(true, Some(ino))?;
            self.meta.sync()?;
            self.ship_durably()?;
            return Ok(());
        }
        let unflushed = |v: &Self| v.files.get(&ino).map(|st| {
            let g = st.inner.lock();
            (g.dirty_bytes, g.last_seq > g.flushed_seq)
        });
        if let Some((dirty, _)) = unflushed(self) {
            if dirty >= FSYNC_FLUSH_BYTES {
                self.flush_round_of(true, Some(ino))?;
            }
        }
        // Records the flush did not fold in (or all of them, for small
        // amounts) are made durable in the journal.
        if unflushed(self).is_some_and(|(_, pending)| pending) {
            self.journal.sync_for(ino)?;
        }
        self.meta.sync()
    }

    fn wait_for_journal_room(&self) {
        while self.journal.bytes() > self.opts.journal_limit {
            self.flusher.signal.poke();
            let mut d = self.flusher.signal.done.lock();
            self.flusher.signal.done_cv.wait_for(&mut d, std::time::Duration::from_millis(100));
        }
    }

    /// Writes `data` at `offset`.
    pub fn write(&self, ino: Ino, offset: u64, data: &[u8]) -> Result<u32> {
        self.write_at(ino, offset, data, true)
    }

    /// A write-back from the kernel's writeback cache: like [`Volume::write`]
    /// but leaves mtime and ctime alone. The kernel set them when the
    /// application wrote (the bytes may arrive seconds later) and sends them
    /// in a setattr of their own; stamping "now" here would make the
    /// daemon's times differ from the ones the kernel shows.
    pub fn write_back(&self, ino: Ino, offset: u64, data: &[u8]) -> Result<u32> {
        self.write_at(ino, offset, data, false)
    }

    fn write_at(&self, ino: Ino, offset: u64, data: &[u8], stamp_times: bool) -> Result<u32> {
        self.check_writable()?;
        if let Some(w) = &self.io {
            w.note_write();
        }
        let end = offset.checked_add(data.len() as u64).filter(|e| *e <= MAX_FILE_SIZE);
        let Some(end) = end else {
            return Err(Error::new(ErrorKind::TooBig, "write past the largest file size"));
        };
        if data.is_empty() {
            return Ok(0);
        }
        self.wait_for_journal_room();
        let poke = self.with_file(ino, |_, g| {
            g.check_writable()?;
            let now = Timestamp::now();
            let (seq, loc) = self.journal.append(RecordKind::Write, ino, offset, data.len() as u32, data, now)?;
            g.overlay_insert(offset, Piece { len: data.len() as u64, src: PieceSrc::Data(loc), seq });
            g.size = g.size.max(end);
            g.last_seq = seq;
            // Under the file's lock: before the flush that commits it.
            if let Some(t) = &self.trace {
                t.record(Event::Write { ino, offset, len: data.len() as u64 });
            }
            if stamp_times {
                g.touch(now);
            } else {
                g.mark_dirty();
            }
            Ok(g.dirty_bytes >= self.opts.flush_bytes)
        })?;
        if poke {
            self.flusher.signal.poke();
        }
        Ok(data.len() as u32)
    }

    /// Sets the size: cuts the content or extends it with a hole.
    pub fn truncate(&self, ino: Ino, size: u64) -> Result<()> {
        self.check_writable()?;
        if size > MAX_FILE_SIZE {
            return Err(Error::new(ErrorKind::TooBig, "size past the largest file size"));
        }
        loop {
            let st = self.file_state(ino)?;
            let _fl = st.flush_lock.lock();
            let mut g = st.inner.lock();
            if g.evicted {
                continue;
            }
            g.check_writable()?;
            let now = Timestamp::now();
            let (seq, _) = self.journal.append(RecordKind::Truncate, ino, size, 0, &[], now)?;
            apply_truncate(&mut g, size);
            g.last_seq = seq;
            g.touch(now);
            if let Some(t) = &self.trace {
                t.record(Event::Truncate { ino, size });
            }
            return Ok(());
        }
    }

    /// Replaces `[offset, offset+len)` with a hole (within the current size
    /// when `keep_size`, else extending it).
    pub(crate) fn punch(&self, ino: Ino, offset: u64, len: u64, keep_size: bool) -> Result<()> {
        self.check_writable()?;
        let end = offset.checked_add(len).filter(|e| *e <= MAX_FILE_SIZE).ok_or_else(|| Error::new(ErrorKind::TooBig, "range past the largest file size"))?;
        let journaled = self.with_file(ino, |_, g| {
            g.check_writable()?;
            let end = if keep_size { end.min(g.size) } else { end };
            if end <= offset {
                return Ok(true);
            }
            // A journal record says a length in 32 bits: a longer hole is
            // committed to the extent map at once instead (replaying a
            // record cut to 32 bits would bring back what it removed).
            let Ok(n) = u32::try_from(end - offset) else {
                return Ok(false);
            };
            let now = Timestamp::now();
            let (seq, _) = self.journal.append(RecordKind::Punch, ino, offset, n, &[], now)?;
            g.overlay_insert(offset, Piece { len: end - offset, src: PieceSrc::Zero, seq });
            g.size = g.size.max(end);
            g.last_seq = seq;
            g.touch(now);
            Ok(true)
        })?;
        if !journaled {
            self.punch_committed(ino, offset, end, keep_size)?;
        }
        Ok(())
    }

    /// `fallocate(2)`: mode 0 extends the size (space is never reserved in a
    /// deduplicating store), KEEP_SIZE does nothing, PUNCH_HOLE and
    /// ZERO_RANGE store a hole.
    pub fn fallocate(&self, ino: Ino, offset: u64, len: u64, mode: i32) -> Result<()> {
        self.check_writable()?;
        let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let m = mode & !libc::FALLOC_FL_KEEP_SIZE;
        // As the kernel (and ext4): a range whose end does not fit is EFBIG.
        let end = offset.checked_add(len).ok_or_else(|| Error::new(ErrorKind::TooBig, "range past the largest file size"))?;
        if m == libc::FALLOC_FL_PUNCH_HOLE {
            if !keep {
                return Err(Error::new(ErrorKind::NotSupported, "PUNCH_HOLE needs KEEP_SIZE"));
            }
            self.punch(ino, offset, len, true)
        } else if m == libc::FALLOC_FL_ZERO_RANGE {
            self.punch(ino, offset, len, keep)
        } else if m == 0 {
            if keep {
                return Ok(());
            }
            let size = self.with_file(ino, |_, g| Ok(g.size))?;
            if end > size {
                self.truncate(ino, end)?;
            }
            Ok(())
        } else {
            Err(Error::new(ErrorKind::NotSupported, format!("fallocate mode {mode:#x} is not supported")))
        }
    }

    /// `lseek` SEEK_DATA / SEEK_HOLE over committed holes and the overlay.
    pub fn lseek(&self, ino: Ino, offset: u64, whence: i32) -> Result<u64> {
        let parts = self.with_file(ino, |_, g| {
            if offset >= g.size {
                return Err(Error::new(ErrorKind::Range, "offset at or past end of file"));
            }
            Ok((g.size, plan_holes(g, offset)))
        });
        let (size, holes) = match parts {
            Ok(p) => p,
            Err(e) if e.kind() == ErrorKind::Range => return Err(Error::new(ErrorKind::Range, "ENXIO")),
            Err(e) => return Err(e),
        };
        let mut pos = offset;
        for (s, len, is_hole) in holes {
            let e = s + len;
            if e <= pos {
                continue;
            }
            if whence == libc::SEEK_DATA && !is_hole {
                return Ok(pos.max(s));
            }
            if whence == libc::SEEK_HOLE && is_hole {
                return Ok(pos.max(s));
            }
            pos = pos.max(s);
        }
        match whence {
            libc::SEEK_HOLE => Ok(size),
            libc::SEEK_DATA => Err(Error::new(ErrorKind::Range, "ENXIO")),
            _ => Err(Error::invalid("lseek whence must be SEEK_DATA or SEEK_HOLE")),
        }
    }

    /// Reads up to `size` bytes at `offset` (short only at end of file).
    pub fn read(&self, ino: Ino, offset: u64, size: u32) -> Result<Vec<u8>> {
        self.read_with(ino, offset, size, true)
    }

    /// `read`, with or without fetching the chunks that follow ahead of
    /// time (a tar parser hopping from header to header wants none of them).
    pub(crate) fn read_with(&self, ino: Ino, offset: u64, size: u32, read_ahead: bool) -> Result<Vec<u8>> {
        Ok(self.read_bytes(ino, offset, size, read_ahead)?.into_vec())
    }

    /// `read` without a copy where it can: a read inside one cached chunk
    /// is that chunk's bytes (the FUSE reply is sent straight from them).
    pub fn read_shared(&self, ino: Ino, offset: u64, size: u32) -> Result<ReadBytes> {
        self.read_bytes(ino, offset, size, true)
    }

    /// Whether reading `[offset, offset + size)` of `ino` would find every
    /// chunk it needs decoded in memory (holes and journaled bytes count as
    /// found): such a read waits on nothing. `false` when unsure. It
    /// changes no read-ahead state.
    pub fn read_is_cached(&self, ino: Ino, offset: u64, size: u32) -> bool {
        let parts = self.with_file(ino, |_, g| {
            let end = offset.saturating_add(size as u64).min(g.size);
            let mut parts = Vec::new();
            if offset < end {
                self.plan_read(g, offset, end, &mut parts)?;
            }
            Ok(parts)
        });
        parts.is_ok_and(|parts| parts.iter().all(|p| match p {
            ReadPart::Chunk { id, .. } => self.chunks.cache.contains(*id),
            _ => true,
        }))
    }

    /// The first and the largest read-ahead window of a file read in order:
    /// two average chunks to start; at most eight of the largest chunks on
    /// a local disk (enough for several direct reads in flight: the page
    /// cache no longer reads ahead of them) and sixteen where every request
    /// crosses a network. On a tape, where every request that misses may
    /// cost a locate, the largest at once: a file read whole is then asked
    /// of the store in its first runs, which join the batch of every other
    /// reader's and are read in one pass in tape order.
    pub(crate) fn read_ahead_windows(&self) -> (u64, u64) {
        let c = &self.cfg.chunker;
        let caps = self.chunks.backend.capabilities();
        let most = if caps.remote { 16 } else { 8 } * c.max as u64;
        if !caps.cheap_ranged_reads {
            return (most, most);
        }
        ((2 * c.avg as u64).min(most), most)
    }

    fn read_bytes(&self, ino: Ino, offset: u64, size: u32, read_ahead: bool) -> Result<ReadBytes> {
        if let Some(w) = &self.io {
            w.note_read();
        }
        let (parts, ahead) = self.with_file(ino, |_, g| {
            let end = offset.saturating_add(size as u64).min(g.size);
            if offset >= end {
                return Ok((Vec::new(), Vec::new()));
            }
            let mut parts = Vec::new();
            self.plan_read(g, offset, end, &mut parts)?;
            if let Some(t) = &self.trace {
                t.describe_once(ino, || described(ino, g));
            }
            // Read-ahead: the chunks just past this read, when reads go
            // through the file in order. A large request is the kernel's
            // own read-ahead at work (it reads ahead only for sequential
            // access, and sends several requests at once, served out of
            // order by several threads, so where the last one ended says
            // little); a small one counts when it starts near where the
            // last read ended. A random read fetches nothing more:
            // prefetching two chunk-sizes after each 4 KiB read made random
            // reads decode megabytes each.
            let near = READ_AHEAD_SLACK;
            let contiguous = offset + near >= g.last_read_end && offset <= g.last_read_end + near;
            let sequential = size >= KERNEL_READ_AHEAD_MIN || offset == 0 || contiguous;
            if !contiguous {
                // A jump (or a new pass from the start): a new, small window.
                g.read_ahead_to = 0;
                g.read_ahead_window = 0;
            }
            g.last_read_end = end;
            // The window ahead is renewed once less than half of it is
            // left, so its chunks come in few ranged reads (adjacent ones
            // coalesce, see prefetch). It starts small, so a reader of a
            // file's head fetches little it will not read, and doubles at
            // each renewal while the reads stay in order (as mountpoint-s3's
            // prefetcher does), up to the most the store is worth.
            let (from, ahead_end) = if !(read_ahead && sequential) {
                g.read_ahead_to = 0;
                g.read_ahead_window = 0;
                (0, 0)
            } else if g.read_ahead_window == 0 || g.read_ahead_to < end + g.read_ahead_window / 2 {
                // Less than half of the window asked for last is left: the
                // next one, twice as large (the first: small). Asked of the
                // store only here: most reads renew nothing.
                let (first, most) = self.read_ahead_windows();
                let window = if g.read_ahead_window == 0 { first } else { (2 * g.read_ahead_window).min(most) };
                let from = g.read_ahead_to.max(end);
                g.read_ahead_to = (end + window).min(g.base_valid);
                g.read_ahead_window = window;
                (from, g.read_ahead_to)
            } else {
                (0, 0)
            };
            let ahead: Vec<u64> = if from < ahead_end {
                g.base.range(from, ahead_end).into_iter().filter_map(|(_, e)| match e.src { Source::Chunk(id) => Some(id), _ => None }).collect()
            } else {
                Vec::new()
            };
            Ok((parts, ahead))
        })?;
        if !ahead.is_empty() {
            self.prefetch(ino, ahead);
        }
        if let [ReadPart::Chunk { id, off, len }] = parts[..] {
            if let Some(b) = self.kept_tail(id, off, len) {
                if let Some(t) = &self.trace {
                    t.record(Event::ReadKept { ino, offset, len });
                }
                return Ok(ReadBytes::Owned(b));
            }
            let (c, r) = self.chunk_slice(ino, id, off, len)?;
            if let Some(t) = &self.trace {
                t.record(Event::Read { ino, offset, len });
            }
            return Ok(ReadBytes::Slice(c, r));
        }
        let total: u64 = parts.iter().map(|p| match p { ReadPart::Zero(l) => *l, ReadPart::Journal { len, .. } => *len, ReadPart::Chunk { len, .. } => *len }).sum();
        // Parts are in order: append them (only holes and journal bytes are
        // zero-filled first, not the whole buffer).
        let mut buf = Vec::with_capacity(total as usize);
        for p in parts {
            match p {
                ReadPart::Zero(l) => buf.resize(buf.len() + l as usize, 0),
                ReadPart::Journal { file, loc, len } => {
                    let at = buf.len();
                    buf.resize(at + len as usize, 0);
                    self.journal.read(&file, &loc, &mut buf[at..])?;
                }
                ReadPart::Chunk { id, off, len } => match self.kept_tail(id, off, len) {
                    Some(b) => buf.extend_from_slice(&b),
                    None => {
                        let (c, r) = self.chunk_slice(ino, id, off, len)?;
                        buf.extend_from_slice(&c[r]);
                    }
                },
            }
        }
        // Once done, so the CHUNK records of what it fetched come first.
        if let (Some(t), false) = (&self.trace, buf.is_empty()) {
            t.record(Event::Read { ino, offset, len: buf.len() as u64 });
        }
        Ok(ReadBytes::Owned(buf))
    }

    /// The bytes `[off, off + len)` of chunk `id` from its kept last page,
    /// when they lie there and the chunk itself is not in memory.
    fn kept_tail(&self, id: u64, off: u64, len: u64) -> Option<Vec<u8>> {
        if self.chunks.cache.contains(id) {
            return None;
        }
        let b = self.chunks.tails.get(id, off, len)?;
        self.metrics.tail_hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(b)
    }

    /// The bytes `[off, off + len)` of chunk `id`, read for file `ino`
    /// (the pack cache learns which file its blocks are read for; a fetch
    /// is a read miss); an
    /// extent past the chunk's end is corruption.
    fn chunk_slice(&self, ino: Ino, id: u64, off: u64, len: u64) -> Result<(Arc<Vec<u8>>, std::ops::Range<usize>)> {
        let c = self.chunks.chunk(id, crate::cache::ReadFor { who: cairn_backend::Subsystem::ReadMiss, group: Some(ino) }, &self.meta, &self.metrics)?;
        let r = off as usize..(off + len) as usize;
        if r.end > c.len() {
            return Err(Error::corrupt(format!("extent past the end of chunk #{id}")));
        }
        Ok((c, r))
    }

    /// Plans the bytes `[start, end)` of the file's current content.
    fn plan_read(&self, g: &FileInner, start: u64, end: u64, out: &mut Vec<ReadPart>) -> Result<()> {
        let mut pos = start;
        let mut pieces: Vec<(u64, Piece)> = Vec::new();
        if let Some((&s, p)) = g.overlay.range(..start).next_back() {
            if s + p.len > start {
                pieces.push((s, *p));
            }
        }
        pieces.extend(g.overlay.range(start..end).map(|(&s, p)| (s, *p)));
        for (s, p) in pieces {
            if s > pos {
                self.plan_base(g, pos, s, out);
                pos = s;
            }
            let from = pos - s;
            let len = (s + p.len).min(end) - pos;
            match p.src {
                PieceSrc::Zero => out.push(ReadPart::Zero(len)),
                PieceSrc::Data(loc) => out.push(ReadPart::Journal { file: self.journal.file(&loc)?, loc: JLoc { offset: loc.offset + from, ..loc }, len }),
            }
            pos += len;
        }
        if pos < end {
            self.plan_base(g, pos, end, out);
        }
        Ok(())
    }

    fn plan_base(&self, g: &FileInner, start: u64, end: u64, out: &mut Vec<ReadPart>) {
        let valid_end = end.min(g.base_valid);
        if start < valid_end {
            for (_, e) in g.base.range(start, valid_end) {
                match e.src {
                    Source::Hole => out.push(ReadPart::Zero(e.len)),
                    Source::Chunk(id) => out.push(ReadPart::Chunk { id, off: e.off, len: e.len }),
                    Source::Pending(_) | Source::Mem => out.push(ReadPart::Zero(e.len)), // never in a committed map
                }
            }
        }
        let z = start.max(valid_end);
        if z < end {
            out.push(ReadPart::Zero(end - z));
        }
    }

    /// Applies a replayed journal record.
    pub(crate) fn replay_record(&self, r: &crate::journal::Record) -> Result<()> {
        self.with_file(r.ino, |_, g| {
            if r.seq <= g.flushed_seq {
                return Ok(());
            }
            apply_record(g, r)
        })
    }

    /// The state of `ino` as the store holds it now (row and extents), or
    /// None if it is gone or no longer a regular file.
    pub(crate) fn load_file_row(&self, ino: Ino) -> Result<Option<(cairn_meta::InodeRow, ExtentMap)>> {
        let fresh = self.meta.read(|c| {
            let Some(row) = c.get_inode(ino)? else { return Ok(None) };
            if row.attr.kind != FileKind::File {
                return Ok(None);
            }
            let base = meta::load_extents(c, ino)?;
            Ok(Some((row, base)))
        })?;
        if let Some((row, base)) = &fresh {
            if base.len() != row.attr.size {
                return Err(Error::corrupt(format!("inode {ino}: extents cover {} bytes but its size is {}", base.len(), row.attr.size)));
            }
        }
        Ok(fresh)
    }

    /// A fresh state of `ino` from a store row, for `resume.rs`.
    pub(crate) fn state_from_row(ino: Ino, row: &cairn_meta::InodeRow, base: ExtentMap) -> Arc<FileState> {
        FileState::new(ino, base, row.cver, &row.attr, row.data_bytes, row.jseq, row.attr.nlink == 0, row.read_only())
    }
}

/// Applies a journal record to a file's state (replay).
pub(crate) fn apply_record(g: &mut FileInner, r: &crate::journal::Record) -> Result<()> {
    // A record's checksum held, but its range must still fit in a
    // file (the size arithmetic below must not overflow).
    let end = if r.kind == RecordKind::Truncate { Some(r.arg) } else { r.arg.checked_add(r.len as u64) };
    if end.is_none_or(|e| e > MAX_FILE_SIZE) {
        return Err(Error::corrupt(format!("journal record {} of inode {}: range {}+{} is past the largest file", r.seq, r.ino, r.arg, r.len)));
    }
    match r.kind {
        RecordKind::Write => {
            g.overlay_insert(r.arg, Piece { len: r.len as u64, src: PieceSrc::Data(r.loc), seq: r.seq });
            g.size = g.size.max(r.arg + r.len as u64);
        }
        RecordKind::Truncate => apply_truncate(g, r.arg),
        RecordKind::Punch => {
            g.overlay_insert(r.arg, Piece { len: r.len as u64, src: PieceSrc::Zero, seq: r.seq });
            g.size = g.size.max(r.arg + r.len as u64);
        }
    }
    g.last_seq = g.last_seq.max(r.seq);
    g.touch(r.time);
    g.due = true;
    Ok(())
}

/// Puts a newer state's changes since its base (`old`: its overlay, and
/// a truncation below its base's end) on top of `g`, whose content up to
/// `old.base`'s end is what `old.base` held (`resume.rs`).
pub(crate) fn reapply_changes(g: &mut FileInner, old: &FileInner) {
    if old.base_valid < g.size {
        apply_truncate(g, old.base_valid);
    }
    for (&at, p) in &old.overlay {
        g.overlay_insert(at, *p);
    }
    g.size = old.size;
    g.last_seq = g.last_seq.max(old.last_seq);
    g.mtime = old.mtime;
    g.ctime = old.ctime;
    g.mark_dirty();
    g.due = true;
}

/// Rebuilds the state `g` of `ino` on the store's `row` and `base`: the
/// records of `recs` after the row's position and at most `upto`, then
/// `g`'s own changes since its base on top; the open count and flags are
/// kept.
pub(crate) fn rebuild(g: &mut FileInner, ino: Ino, row: &cairn_meta::InodeRow, base: crate::extent::ExtentMap, recs: &[crate::journal::Record], upto: u64) -> Result<()> {
    let new = Volume::state_from_row(ino, row, base);
    let mut n = new.inner.lock();
    for r in recs.iter().filter(|r| r.seq > row.jseq && r.seq <= upto) {
        apply_record(&mut n, r)?;
    }
    reapply_changes(&mut n, g);
    n.open = g.open;
    n.open_gen = g.open_gen;
    n.unlinked = g.unlinked;
    n.read_only = g.read_only;
    n.dirty_since = g.dirty_since.or(n.dirty_since);
    std::mem::swap(g, &mut *n);
    Ok(())
}

/// The trace's PLACE records of a file's committed map (docs/trace.md).
fn described(ino: Ino, g: &FileInner) -> Vec<Event> {
    let extents = g.base.range(0, g.base_valid).into_iter();
    extents.filter_map(|(at, e)| match e.src {
        Source::Chunk(chunk) => Some(Event::Place { ino, offset: at, len: e.len, chunk, described: true }),
        _ => None,
    }).collect()
}

fn apply_truncate(g: &mut FileInner, size: u64) {
    g.overlay_clip(size);
    g.base_valid = g.base_valid.min(size);
    g.size = size;
}

/// Data/hole runs from `offset` on: (start, len, is_hole).
fn plan_holes(g: &FileInner, offset: u64) -> Vec<(u64, u64, bool)> {
    let mut out = Vec::new();
    // Coarse but exact enough: committed holes below base_valid, overlay
    // pieces as data (or holes when punched), the rest past base_valid holes.
    let mut marks: BTreeMap<u64, (u64, bool)> = BTreeMap::new();
    for (at, e) in g.base.range(offset, g.base_valid) {
        marks.insert(at, (e.len, e.src == Source::Hole));
    }
    if g.base_valid < g.size {
        marks.insert(g.base_valid.max(offset), (g.size - g.base_valid.max(offset), true));
    }
    for (&s, p) in g.overlay.range(..) {
        if s + p.len <= offset {
            continue;
        }
        // Overlay wins: split whatever it covers.
        let (a, b) = (s, s + p.len);
        let covered: Vec<(u64, (u64, bool))> = marks.range(..b).filter(|(&ms, &(ml, _))| ms + ml > a).map(|(&k, &v)| (k, v)).collect();
        for (ms, (ml, h)) in covered {
            marks.remove(&ms);
            if ms < a {
                marks.insert(ms, (a - ms, h));
            }
            if ms + ml > b {
                marks.insert(b, (ms + ml - b, h));
            }
        }
        marks.insert(a, (p.len, p.src == PieceSrc::Zero));
    }
    for (s, (l, h)) in marks {
        out.push((s, l, h));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(ino: Ino) -> Arc<FileState> {
        let t = Timestamp::default();
        let a = Attr { ino, kind: FileKind::File, perm: 0o644, nlink: 1, uid: 0, gid: 0, rdev: 0, size: 0, blocks: 0, atime: t, mtime: t, ctime: t, btime: t };
        FileState::new(ino, ExtentMap::new(), 0, &a, 0, 0, false, false)
    }

    /// A file the store lost (resume.rs) leaves the table evicted; it is
    /// counted lost (its fsync fails) only if this mount had it open or
    /// held changes nothing acknowledged; and a newer state of the same
    /// inode, loaded since, is not dropped with the old one.
    #[test]
    fn a_file_the_store_lost_leaves_the_table_and_is_lost_only_if_held() {
        let t = FileTable::default();
        let (open, written, idle) = (state(10), state(11), state(12));
        open.inner.lock().open = 1;
        written.inner.lock().last_seq = 7;
        for st in [&open, &written, &idle] {
            t.map.insert(st.ino, st.clone());
            t.drop_lost(st, st.inner.lock());
            assert!(st.inner.lock().evicted, "inode {}", st.ino);
            assert!(!t.contains_key(&st.ino), "inode {} is still in the table", st.ino);
        }
        assert!(t.is_lost(10) && t.is_lost(11), "a held file whose create was lost must fail its fsync");
        assert!(!t.is_lost(12), "a file with nothing unacknowledged is not lost");
        let (old, newer) = (state(13), state(13));
        t.map.insert(13, newer.clone());
        t.drop_lost(&old, old.inner.lock());
        assert!(t.get(&13).is_some_and(|s| Arc::ptr_eq(&s, &newer)), "the newer state of the inode was dropped");
    }
}
