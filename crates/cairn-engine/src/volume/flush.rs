//! Write-back: turn journal pieces into chunks, packs and committed extents.
//!
//! One flush round picks the files that are due (closed, old, or large),
//! re-chunks only the regions around their changes (VarFS §3.3.2: from the
//! chunk boundary before the first dirty byte until the chunker falls back
//! onto an old boundary after the last), deduplicates, packs the new blobs
//! (blobs of one round share packs: small files from many writes end up
//! together), uploads the packs, and only then commits every file's new
//! extents, the chunks and the reference counts in one transaction. The
//! journal records folded in are then retired.

use super::file::{CommittedRound, FileState, PieceSrc};
use super::Volume;
use crate::crypto::ChunkId;
use crate::error::{Error, ErrorKind, Result};
use crate::extent::{Extent, ExtentMap, JLoc, Source};
use crate::meta::{self, ChunkRow};
use crate::pack::{self, BlobEntry, PackBuilder};
use crate::trace::{self, Event, PackStage};
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// How often at most a mount deletes its empty journal's commit marks
/// (one statement; `Volume::trim_marks`).
pub(crate) const MARKS_TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Bytes of content chunked per step (bounds memory per flush).
const WINDOW: u64 = 16 << 20;

/// Largest overwrite stored as a patch (see `Volume::store_patches`); a
/// quarter of the smallest chunk if that is less.
const PATCH_MAX: u64 = 64 << 10;

/// Most extents within one largest-chunk-size either side of a small
/// overwrite for it to become a patch; past that its neighbourhood is
/// re-chunked. Bounds how fragmented a region gets (about 8 extents there
/// when freshly chunked, two more per patch).
const PATCH_EXTENTS: usize = 64;

/// A file's prepared flush: the new map and what it covers.
struct Prepared {
    st: Arc<FileState>,
    _guard: parking_lot::ArcMutexGuard<parking_lot::RawMutex, ()>,
    map: ExtentMap,
    /// Committed size: the file's size, or where a held-back tail starts.
    size: u64,
    /// The newest record folded into the snapshot.
    seq: u64,
    /// Records up to here are in the committed map (below `seq` when a
    /// tail is held back: the records covering it must replay after a crash).
    committed_seq: u64,
    /// The content version the map was built on (`FileInner::base_cver`).
    cver: u64,
    /// Overlay pieces from this offset on were left out of the map (a
    /// background round's bound per file, [`ROUND_PIECES`]); `u64::MAX`:
    /// none. They stay in the overlay for the next rounds.
    kept_from: u64,
}

/// A file's prepared content.
struct Plan {
    map: ExtentMap,
    size: u64,
    seq: u64,
    committed_seq: u64,
    cver: u64,
    kept_from: u64,
}

/// How many times in a row a flush round is prepared again after losing a
/// chunk race (each loss means another writer committed meanwhile, so a
/// long run of them is a bug, not contention).
const MAX_RACED_ROUNDS: u32 = 16;

/// A sealed pack of this round: uploaded, or held in the outbox.
struct SealedPack {
    name: String,
    size: u64,
    blobs: u64,
    held: bool,
}

/// Chunks and packs produced by one round.
pub(crate) struct Batch<'a> {
    vol: &'a Volume,
    /// Keeps the cleaner from deleting a dead chunk this batch found by
    /// hash before the batch commits its reference (docs/frugal.md §5).
    _chunk_guard: super::guard::Shared<'a>,
    builder: Option<PackBuilder>,
    sealed: Vec<SealedPack>,
    /// Pack uploads under way on the volume's upload threads (at most two).
    uploads: std::collections::VecDeque<super::workers::Pending>,
    new_chunks: Vec<(u64, usize, BlobEntry)>,
    by_hash: HashMap<ChunkId, u64>,
    /// Chunks of the held pack copied into this round's packs: (chunk id,
    /// index into `sealed`, offset there, stored length).
    moved: Vec<(u64, usize, u64, u32)>,
    /// The held pack they came from (name, metadata id).
    absorbed: Option<(String, u64)>,
    /// Whose dedup domain the chunks stored next belong to (the owner of
    /// the file being written; only read on a volume with owner domains).
    owner: u32,
    /// Counters for stats and benchmarks.
    pub chunked_bytes: u64,
    pub new_bytes: u64,
    /// Chunks stored (new or deduplicated).
    pub chunks_stored: u64,
    /// Old chunks whose bytes were read back to be cut again.
    pub old_chunks_rechunked: u64,
    /// Small overwrites stored as patches.
    pub patches: u64,
}

/// What a round did.
#[derive(Debug, Default, Clone, Copy)]
pub struct FlushReport {
    pub files: usize,
    pub chunked_bytes: u64,
    pub new_chunk_bytes: u64,
    pub packs: usize,
    /// Small overwrites stored as patches instead of re-chunked.
    pub patches: u64,
}

/// A grouped round (in a bucket) takes files up to this many packs' worth
/// of dirty bytes, oldest first.
const ROUND_PACKS: u64 = 2;

/// A background round applies at most this many of one file's overlay
/// pieces (its first ones by offset); the rest wait for the next rounds
/// (issue 50: one file's million byte-sized writes held every other
/// file's flush back for minutes). A round's work per file is then
/// bounded, so the other files of the round, and an fsync waiting for the
/// round to end, wait for at most this much. A file's own fsync or close,
/// and `sync`, flush it whole.
pub(crate) const ROUND_PIECES: usize = 1 << 16;

/// Steps of fewer bytes hash and encode their chunks on the calling thread.
const PARALLEL_MIN_BYTES: usize = 1 << 20;

impl<'a> Batch<'a> {
    pub(crate) fn new(vol: &'a Volume) -> Self {
        Batch { vol, _chunk_guard: vol.chunk_guard.shared(), builder: None, sealed: Vec::new(), uploads: Default::default(), new_chunks: Vec::new(), by_hash: HashMap::new(), moved: Vec::new(), absorbed: None, owner: 0, chunked_bytes: 0, new_bytes: 0, chunks_stored: 0, old_chunks_rechunked: 0, patches: 0 }
    }

    /// Makes the chunks stored next those of owner `uid` (a volume with
    /// owner dedup domains keys their ids by it; docs/format.md §2).
    pub(crate) fn set_owner(&mut self, uid: u32) {
        self.owner = uid;
    }

    /// [`Batch::set_owner`] with the owner of file `ino`, looked up only
    /// on a volume with owner domains.
    pub(crate) fn owner_of(&mut self, ino: u64) -> Result<()> {
        if self.vol.chunks.keys.owner_domains() {
            self.owner = self.vol.getattr(ino)?.uid;
        }
        Ok(())
    }

    /// Stores chunks (deduplicated); returns their metadata ids in order.
    pub(crate) fn store(&mut self, chunks: &[&[u8]]) -> Result<Vec<u64>> {
        self.store_with(None, chunks)
    }

    /// [`Batch::store`] from inside a metadata read or transaction `c`
    /// (the chunk lookups use it instead of taking the metadata lock).
    pub(crate) fn store_in(&mut self, c: &dyn meta::MetaRead, chunks: &[&[u8]]) -> Result<Vec<u64>> {
        self.store_with(Some(c), chunks)
    }

    fn store_with(&mut self, conn: Option<&dyn meta::MetaRead>, chunks: &[&[u8]]) -> Result<Vec<u64>> {
        let vol = self.vol;
        let total: usize = chunks.iter().map(|c| c.len()).sum();
        // A small step (a short file's chunks) runs on this thread: handed
        // to rayon's pool it cost more in wake-ups and idle workers' spins
        // (`sched_yield`) than the hashing itself.
        let parallel = total >= PARALLEL_MIN_BYTES && chunks.len() > 1;
        let owner = self.owner;
        let hash = |c: &&[u8]| vol.chunks.keys.chunk_id_of(owner, c);
        let ids: Vec<ChunkId> = if parallel { chunks.par_iter().map(hash).collect() } else { chunks.iter().map(hash).collect() };
        let mut out = vec![0u64; chunks.len()];
        let mut todo: Vec<usize> = Vec::new();
        let mut lookup = |c: &dyn meta::MetaRead| -> Result<()> {
            todo.clear(); // a store may run a read again
            for (i, h) in ids.iter().enumerate() {
                if let Some(&id) = self.by_hash.get(h) {
                    out[i] = id;
                } else if let Some(row) = c.chunk_by_hash(h)? {
                    self.by_hash.insert(*h, row.id);
                    out[i] = row.id;
                } else {
                    todo.push(i);
                }
            }
            Ok(())
        };
        match conn {
            Some(c) => lookup(c)?,
            None => vol.meta.read_many(|c| lookup(c))?,
        }
        // The same new chunk twice in one step is encoded once.
        let mut first: HashMap<ChunkId, usize> = HashMap::new();
        todo.retain(|&i| first.insert(ids[i], i).is_none());
        // Compressed (where it pays) in parallel, then sealed straight into
        // the pack in parallel: each new chunk's bytes are copied once.
        let level = vol.cfg.compression.level;
        let prepare = |&i: &usize| pack::Payload::of(chunks[i], level);
        let payloads: Vec<pack::Payload> = if parallel { todo.par_iter().map(prepare).collect() } else { todo.iter().map(prepare).collect() };
        let target = vol.cfg.pack_target;
        let mut k = 0;
        while k < todo.len() {
            let b = self.builder.get_or_insert_with(|| PackBuilder::with_buffer(&vol.vid, vol.flusher.pack_buffers.take(target as usize + (8 << 20))));
            // This pack's share: up to and including the blob that takes
            // it to its target, as when blobs were added one at a time.
            let mut len = b.len() as u64;
            let mut end = k;
            while end < todo.len() {
                len += vol.chunks.keys.sealed_len(payloads[end].bytes(chunks[todo[end]]).len()) as u64;
                end += 1;
                if len >= target {
                    break;
                }
            }
            let seg = &todo[k..end];
            let chunk_ids = seg.iter().map(|_| vol.meta.store().alloc_chunk_id()).collect::<std::result::Result<Vec<u64>, _>>()?;
            let blobs: Vec<(ChunkId, u32, u8)> = seg.iter().zip(&payloads[k..end]).map(|(&i, p)| (ids[i], chunks[i].len() as u32, p.flags())).collect();
            let entries = b.append_sealed(&vol.chunks.keys, &blobs, parallel && seg.len() > 1, |j| payloads[k + j].bytes(chunks[seg[j]]));
            let full = b.len() as u64 >= target;
            for ((&i, e), id) in seg.iter().zip(entries).zip(chunk_ids) {
                self.new_chunks.push((id, self.sealed.len(), e));
                self.by_hash.insert(ids[i], id);
                self.new_bytes += chunks[i].len() as u64;
            }
            k = end;
            if full {
                self.seal()?;
            }
        }
        for (i, h) in ids.iter().enumerate() {
            if out[i] == 0 {
                out[i] = self.by_hash[h];
            }
            // A file's partial last page may be read before an append.
            vol.chunks.tails.keep(out[i], chunks[i]);
        }
        self.chunked_bytes += total as u64;
        self.chunks_stored += chunks.len() as u64;
        Ok(out)
    }

    /// Seals the open pack and starts uploading it (with retries) on one of
    /// the volume's upload threads, so the flush goes on chunking meanwhile.
    pub(crate) fn seal(&mut self) -> Result<()> {
        let Some(b) = self.builder.take() else { return Ok(()) };
        if b.is_empty() {
            return Ok(());
        }
        let vol = self.vol;
        let (built, entries) = b.finish(&vol.chunks.keys, &vol.vid);
        let name = pack::fresh_name();
        self.sealed.push(SealedPack { name: name.clone(), size: built.bytes().len() as u64, blobs: entries.len() as u64, held: false });
        // A store that positions its medium (a tape) lays packs down in the
        // order their puts arrive: one upload at a time keeps that the
        // order they were sealed in, so a file's packs lie in file order
        // (two at once let a small last pack overtake a big one, and
        // reading the file back located backwards once per round).
        let in_flight = if vol.chunks.backend.capabilities().cheap_ranged_reads { 2 } else { 1 };
        while self.uploads.len() >= in_flight {
            self.uploads.pop_front().expect("non-empty").wait()?;
        }
        // Recorded as under way before the PUT (a volume many machines
        // share): gc on another machine leaves the object alone until this
        // round commits it or the session is gone past its grace
        // (docs/shared-volume.md §7 "Uploads"). A session already gone
        // uploads nothing.
        if let Some(s) = vol.meta.shared() {
            s.begin_upload(&name)?;
        }
        let backend = vol.chunks.paid(cairn_backend::Subsystem::Write).clone();
        let pool = vol.flusher.pack_buffers.clone();
        let pending = vol.flusher.uploader.submit(move || {
            let r = upload(backend.as_ref(), &name, built.bytes());
            pool.give(built.into_buffer());
            r
        })?;
        self.uploads.push_back(pending);
        Ok(())
    }

    /// Copies the pack the last round held in the outbox (docs/frugal.md
    /// §7) into this round's packs, ahead of the round's own chunks: rounds
    /// too small to fill a pack end up in one, one PUT. Its chunks move in
    /// this round's transaction, which also drops its row; the pack itself
    /// goes after that ([`Volume::settle_held`]). Nothing to do if the
    /// cache queued it for upload meanwhile (a metadata version may then
    /// name it): it stays an ordinary pack.
    pub(crate) fn absorb_held(&mut self) -> Result<()> {
        let vol = self.vol;
        let Some(held) = vol.medium.held() else { return Ok(()) };
        let Some((name, id, _)) = held.pack.lock().clone() else { return Ok(()) };
        if !held.cache.is_held(&name) {
            *held.pack.lock() = None;
            return Ok(());
        }
        let rows = vol.meta.read(|c| Ok(c.chunks_in_pack(id)?))?;
        let data = vol.chunks.backend.get(&name)?;
        let target = vol.cfg.pack_target;
        for c in &rows {
            let end = c.offset + c.stored_len as u64;
            let blob = data.get(c.offset as usize..end as usize).ok_or_else(|| Error::corrupt(format!("held pack {name}: chunk #{} ends past the pack ({end} > {})", c.id, data.len())))?;
            let b = self.builder.get_or_insert_with(|| PackBuilder::with_buffer(&vol.vid, vol.flusher.pack_buffers.take(target as usize + (8 << 20))));
            // Blobs are position-independent: copied as stored.
            let e = b.add(c.hash, blob, c.raw_len, c.flags);
            self.moved.push((c.id, self.sealed.len(), e.offset, c.stored_len));
            self.by_hash.insert(c.hash, c.id);
            if b.len() as u64 >= target {
                self.seal()?;
            }
        }
        self.absorbed = Some((name, id));
        Ok(())
    }

    /// Gives up a failed [`Batch::absorb_held`]: the held pack is queued
    /// for upload as it is, and nothing of it stays in this batch.
    pub(crate) fn forget_absorbed(&mut self) {
        self.builder = None;
        self.moved.clear();
        self.absorbed = None;
        if let Some(held) = self.vol.medium.held() {
            *held.pack.lock() = None;
            held.cache.release_held();
        }
    }

    /// Seals a round's last pack: with `hold`, one short of the pack target
    /// is written to the outbox but held there for the next round
    /// ([`Batch::absorb_held`]); else as [`Batch::seal`].
    pub(crate) fn seal_round(&mut self, hold: bool) -> Result<()> {
        let vol = self.vol;
        let held = vol.medium.held().filter(|_| hold);
        let short = self.builder.as_ref().is_some_and(|b| !b.is_empty() && (b.len() as u64) < vol.cfg.pack_target);
        let (Some(held), true) = (held, short) else { return self.seal() };
        let b = self.builder.take().expect("short");
        let (built, entries) = b.finish(&vol.chunks.keys, &vol.vid);
        let name = pack::fresh_name();
        let r = held.cache.put_held(&name, built.bytes());
        let size = built.bytes().len() as u64;
        vol.flusher.pack_buffers.give(built.into_buffer());
        r?;
        self.sealed.push(SealedPack { name, size, blobs: entries.len() as u64, held: true });
        Ok(())
    }

    /// Deletes this batch's uploaded packs, which no metadata names (its
    /// transaction lost a race and rolled back). A failure only leaves
    /// orphans that gc removes.
    pub(crate) fn discard(&self) {
        discard_packs(self.vol, cairn_backend::Subsystem::Other, self.sealed.iter().map(|p| p.name.as_str()));
    }

    /// Adds what this batch stored to the volume's metrics, once the
    /// transaction naming its chunks has committed.
    pub(crate) fn account(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        let m = &self.vol.metrics;
        m.chunked.fetch_add(self.chunked_bytes, Relaxed);
        m.deduplicated.fetch_add(self.chunked_bytes.saturating_sub(self.new_bytes), Relaxed);
        m.new_chunk_bytes.fetch_add(self.new_bytes, Relaxed);
        m.compressed.fetch_add(self.new_chunks.iter().map(|(_, _, e)| e.stored_len as u64).sum(), Relaxed);
        m.stored.fetch_add(self.sealed.iter().map(|p| p.size).sum(), Relaxed);
        m.new_chunks.fetch_add(self.new_chunks.len() as u64, Relaxed);
        m.packs.fetch_add(self.sealed.len() as u64, Relaxed);
    }

    /// Waits for every upload; the packs are durable when this returns Ok.
    pub(crate) fn finish_uploads(&mut self) -> Result<()> {
        let mut first_err = None;
        while let Some(p) = self.uploads.pop_front() {
            if let Err(e) = p.wait() {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// The trace's records of this round's new packs and chunks
    /// (docs/trace.md: PACK, then CHUNK; the chunks moved from a held pack
    /// too).
    fn trace_events(&self) -> impl Iterator<Item = Event> + '_ {
        let packs = self.sealed.iter().map(|p| Event::Pack { pack: trace::pack_id(&p.name), size: p.size, stage: if p.held { PackStage::Held } else { PackStage::Uploaded } });
        let pack = |pidx: usize| trace::pack_id(&self.sealed[pidx].name);
        let chunks = self.new_chunks.iter().map(move |(id, pidx, e)| Event::Chunk { chunk: *id, pack: pack(*pidx), offset: e.offset, len: e.stored_len as u64 });
        let moved = self.moved.iter().map(move |&(id, pidx, offset, len)| Event::Chunk { chunk: id, pack: pack(pidx), offset, len: len as u64 });
        packs.chain(chunks).chain(moved)
    }

    /// Inserts this round's packs and chunks into a transaction, moves the
    /// chunks copied from a held pack and drops its row; the new packs'
    /// metadata ids, in order.
    pub(crate) fn insert_into(&self, tx: &dyn meta::MetaTx) -> Result<Vec<u64>> {
        let mut pack_ids = Vec::with_capacity(self.sealed.len());
        let mut unreferenced = vec![0u64; self.sealed.len()];
        for (_, pidx, e) in &self.new_chunks {
            unreferenced[*pidx] += e.stored_len as u64;
        }
        // A moved chunk nothing references is dead in its new pack too.
        let mut moving = Vec::with_capacity(self.moved.len());
        for &(id, pidx, offset, len) in &self.moved {
            let Some(row) = tx.chunk_by_id(id)? else { continue };
            if row.refs == 0 {
                unreferenced[pidx] += len as u64;
            }
            moving.push((id, pidx, offset));
        }
        for (p, dead) in self.sealed.iter().zip(unreferenced) {
            pack_ids.push(tx.insert_pack(&p.name, p.size, p.blobs, dead)?);
        }
        for (id, pidx, e) in &self.new_chunks {
            tx.insert_chunk(
                &ChunkRow { id: *id, hash: e.id, pack: pack_ids[*pidx], offset: e.offset, stored_len: e.stored_len, raw_len: e.raw_len, flags: e.flags, refs: 0, zero_since: None },
            )?;
        }
        // The held pack this batch absorbed: its chunks move into the new
        // packs, then it goes.
        if let Some((_, old)) = &self.absorbed {
            for (id, pidx, offset) in moving {
                tx.relocate_chunk(id, *old, pack_ids[pidx], offset)?;
            }
            tx.delete_pack(*old)?;
        }
        Ok(pack_ids)
    }
}

/// Where the first gap in a file's new bytes starts: a stretch past the
/// committed length `from` that no overlay piece covers, with a piece
/// after it. Only when the pieces run to the file's `size`: out-of-order
/// write-back sets the size by its writes, and held records then restore
/// it after a crash. A size a truncate set past the pieces is committed
/// with that truncate's record, so the flush cannot stop short of it.
fn first_gap(pieces: &[(u64, super::file::Piece)], from: u64, size: u64) -> Option<u64> {
    if !pieces.last().is_some_and(|(s, p)| s + p.len == size) {
        return None;
    }
    let mut at = from;
    for (s, p) in pieces {
        if s + p.len <= at {
            continue;
        }
        if *s > at {
            return (at < size).then_some(at);
        }
        at = s + p.len;
    }
    None
}

/// Moves into `rest` every patch that lies where a re-chunk of a `rest`
/// range will read, `[a - max, b + 2·max)`, until none does: the re-chunk
/// would read the patch's chunk, which is only in this round's batch (not
/// yet in the chunk index), and would fold it away at once anyway.
fn demote_patches_near_rechunks(patches: &mut Vec<(u64, u64)>, rest: &mut Vec<(u64, u64)>, max: u64) {
    // One sweep each way until nothing moves: a demoted patch demotes the
    // patches after it within 2·max (left to right) and before it within
    // max (right to left). Each sweep is linear (a demotion per round of a
    // sort and a scan was quadratic when patches chained).
    let mut all: Vec<(u64, u64, bool)> = patches.iter().map(|&(a, b)| (a, b, false)).chain(rest.iter().map(|&(a, b)| (a, b, true))).collect();
    all.sort_unstable();
    loop {
        let mut moved = false;
        let mut last_rest_end: Option<u64> = None;
        for r in all.iter_mut() {
            if !r.2 && last_rest_end.is_some_and(|e| e + 2 * max > r.0) {
                r.2 = true;
                moved = true;
            }
            if r.2 {
                last_rest_end = Some(r.1);
            }
        }
        let mut next_rest_start: Option<u64> = None;
        for r in all.iter_mut().rev() {
            if !r.2 && next_rest_start.is_some_and(|a| a < r.1 + max) {
                r.2 = true;
                moved = true;
            }
            if r.2 {
                next_rest_start = Some(r.0);
            }
        }
        if !moved {
            break;
        }
    }
    patches.clear();
    rest.clear();
    for (a, b, is_rest) in all {
        if is_rest { rest.push((a, b)) } else { patches.push((a, b)) }
    }
}

/// One pack upload, paid for by whoever `backend` is the handle of (the
/// flush's: `write`). Retries are the backend's (`cairn_backend::Retrying`
/// wraps every backend the engine opens), by error kind.
fn upload(backend: &dyn cairn_backend::Backend, name: &str, bytes: &[u8]) -> Result<()> {
    backend.put(name, bytes).map_err(|e| Error::from(e).context(format!("uploading pack {name}")))
}

impl<'a> Drop for Batch<'a> {
    fn drop(&mut self) {
        // A failed round still waits for its uploads (their packs are orphans
        // that gc removes), so no upload outlives the batch.
        let _ = self.finish_uploads();
    }
}

impl Volume {
    /// One flush round: every due file (or every dirty file if `all`).
    pub(crate) fn flush_round(&self, all: bool) -> Result<FlushReport> {
        self.flush_round_of(all, None)
    }

    /// The background flusher's round: like [`flush_round`](Self::flush_round),
    /// but its last short pack may be held for the next round
    /// (docs/frugal.md §7). Rounds someone asked for (`sync`, a close that
    /// waits, an archive) leave nothing held.
    pub(crate) fn flush_round_background(&self, all: bool) -> Result<FlushReport> {
        let _round = self.flusher.mutex.lock();
        self.flush_round_retrying(all, None, true)
    }

    /// A flush round limited to one file (or, with `None`, the due files).
    pub(crate) fn flush_round_of(&self, all: bool, only: Option<crate::types::Ino>) -> Result<FlushReport> {
        let _round = self.flusher.mutex.lock();
        let r = self.flush_round_retrying(all, only, false);
        // Asked for: nothing stays held (what was is in this round's packs
        // or queued now).
        if only.is_none() {
            self.medium.release_held();
        }
        r
    }

    /// A round, prepared again after lost races; the caller holds
    /// `flusher.mutex`.
    fn flush_round_retrying(&self, all: bool, only: Option<crate::types::Ino>, may_hold: bool) -> Result<FlushReport> {
        // Commits lost in a database crash or failover are redone from the
        // journal first (resume.rs).
        self.resume_after_loss()?;
        let mut raced = 0;
        let r = loop {
            match self.flush_round_locked(all, only, may_hold) {
                // Another writer claimed one of this round's new chunks
                // first, or collected one it found by hash: nothing was
                // committed, so the round is prepared again and then finds
                // the winner's chunk (or stores the collected one anew).
                // The failed round deleted the packs it uploaded.
                Err(e) if e.kind() == ErrorKind::Raced && raced < MAX_RACED_ROUNDS => {
                    raced += 1;
                    self.metrics.flush_rounds_raced.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::debug!("flush round raced another writer ({e}); preparing it again");
                }
                r => break r,
            }
        };
        // The round committed or gave up: the chunks it found no longer
        // need holding. Left recorded if this fails (collectors only wait
        // longer, until the next round's end or the session's cleanup).
        if self.flusher.marked.swap(false, std::sync::atomic::Ordering::SeqCst) {
            if let Err(e) = self.meta.need_shared().and_then(|s| s.flush_ended()) {
                self.flusher.marked.store(true, std::sync::atomic::Ordering::SeqCst);
                tracing::debug!("recording the end of a flush round: {e}");
            }
        }
        *self.flusher.signal.done.lock() += 1;
        self.flusher.signal.done_cv.notify_all();
        r
    }

    fn flush_round_locked(&self, all: bool, only: Option<crate::types::Ino>, may_hold: bool) -> Result<FlushReport> {
        let (age, flush_bytes) = self.medium.due(self);
        // Past half the journal's limit, closed files go whatever their age,
        // before writers have to wait for room.
        let pressure = self.journal.bytes() > self.opts.journal_limit / 2;
        // In a bucket, where every pack is a PUT, rounds are grouped
        // (docs/frugal.md §7): one that age starts also takes the files at
        // least half that old, so rounds come about every half age with
        // what was written meanwhile, not every flusher tick (500 ms) with
        // the few files that just crossed the age; and once the closed
        // files' dirty bytes fill a pack, a round takes them all.
        let grouped = self.medium.groups_rounds() && only.is_none();
        // (not due, dirty since, dirty bytes, file)
        type Cand = (bool, Option<std::time::Instant>, u64, Arc<FileState>);
        let mut picked: Vec<Cand> = Vec::new();
        let (mut half_old, mut closed): (Vec<Cand>, Vec<Cand>) = (Vec::new(), Vec::new());
        let mut closed_bytes = 0;
        for e in self.files.iter() {
            if only.is_some_and(|i| i != *e.key()) {
                continue;
            }
            let g = e.value().inner.lock();
            if g.evicted || !g.is_dirty() {
                continue;
            }
            let dirty_for = g.dirty_since.map(|t| t.elapsed());
            let old = dirty_for.is_some_and(|d| d >= age);
            let cand = (!g.due, g.dirty_since, g.dirty_bytes, e.value().clone());
            if all || g.due || old || g.dirty_bytes >= flush_bytes || (pressure && g.open == 0) {
                picked.push(cand);
            } else if grouped {
                if g.open == 0 {
                    closed_bytes += g.dirty_bytes;
                }
                if dirty_for.is_some_and(|d| d >= age / 2) {
                    half_old.push(cand);
                } else if g.open == 0 {
                    closed.push(cand);
                }
            }
        }
        let fills_a_pack = grouped && closed_bytes >= self.cfg.pack_target;
        if !picked.is_empty() || fills_a_pack {
            picked.append(&mut half_old);
        }
        if fills_a_pack {
            picked.append(&mut closed);
        }
        if grouped && !all {
            // A round holds its files' flush locks (a delete or truncate of
            // one waits) until its packs are in the outbox, which a small
            // cache lets in one at a time as uploads drain: a grouped round
            // takes the oldest files up to ROUND_PACKS packs' worth, and the
            // rest go in the next round. A file someone waits for (due: a
            // close on a shared volume) always goes.
            picked.sort_by_key(|c| (c.0, c.1));
            let mut bytes = 0;
            let keep = picked.iter().take_while(|c| {
                let under = !c.0 || bytes < ROUND_PACKS * self.cfg.pack_target;
                bytes += c.2;
                under
            });
            let n = keep.count();
            picked.truncate(n);
        }
        let mut chosen: Vec<Arc<FileState>> = picked.into_iter().map(|c| c.3).collect();
        // Which go, in what order: the medium's (on a tape, the drive's
        // feeding and a walk of the tree; else inode order).
        self.medium.order_round(self, &mut chosen, all, pressure, only);
        let mut report = FlushReport::default();
        if !chosen.is_empty() {
            // On a shared volume, recorded before this round looks a chunk
            // up by hash: collectors on every machine leave the chunks
            // that die from now on alone until the round ends
            // (docs/shared-volume.md §7 "Chunk grace").
            if self.is_shared() && !self.flusher.marked.swap(true, std::sync::atomic::Ordering::SeqCst) {
                if let Err(e) = self.meta.need_shared().and_then(|s| s.flush_started()) {
                    self.flusher.marked.store(false, std::sync::atomic::Ordering::SeqCst);
                    return Err(e.into());
                }
            }
            let mut batch = Batch::new(self);
            // A grouped round's last, short pack may wait in the outbox for
            // the next round to fill it where the medium holds packs
            // (docs/frugal.md §7, `medium::choose`).
            let holds = grouped && self.medium.held().is_some();
            if holds {
                if let Err(e) = batch.absorb_held() {
                    tracing::warn!("copying the held pack into this round's: {e}; it is uploaded as it is");
                    batch.forget_absorbed();
                }
            }
            let mut prepared = Vec::new();
            for st in chosen {
                let guard = st.flush_lock.lock_arc();
                let bound = (!all && only.is_none()).then_some(ROUND_PIECES);
                match self.prepare(&st, &mut batch, !all, bound) {
                    Ok(Plan { map, size, seq, committed_seq, cver, kept_from }) => prepared.push(Prepared { st, _guard: guard, map, size, seq, committed_seq, cver, kept_from }),
                    // A round for one file (its fsync or close) that could
                    // not prepare it fails: committing the rest (nothing)
                    // and answering Ok would report bytes durable that
                    // are only in the journal.
                    Err(e) if only.is_some() => return Err(e.context(format!("flushing inode {} (kept in the journal)", st.ino))),
                    Err(e) => tracing::error!("flushing inode {}: {e} (kept in the journal, will retry)", st.ino),
                }
            }
            // Any round may hold, a pressed or `sync` one too: the held pack
            // is as durable here as an uploaded one's outbox copy, and the
            // unmount (`drain`) and every shipped version release it.
            batch.seal_round(holds && may_hold)?;
            batch.finish_uploads()?;
            let hold = self.stall.before_commit.lock().take();
            if let Some(f) = hold {
                f();
            }
            let mut stale = Vec::new();
            let pack_ids = match self.commit(&batch, &mut prepared, &mut stale) {
                Ok(ids) => ids,
                Err(e) => {
                    if e.kind() == ErrorKind::SessionLost {
                        // Fenced: another machine cleaned this session up
                        // (its locks, its open files, its uploads). Nothing
                        // was committed; the journal keeps the bytes for a
                        // remount, and the mount refuses changes from now on.
                        if let Some(c) = self.cloud() {
                            c.mark_lost(&e);
                        }
                    }
                    if e.kind() == ErrorKind::Raced {
                        // Lost a chunk to another writer, or another machine
                        // committed one of the files since this one loaded
                        // it: the transaction rolled back, so nothing names
                        // this round's packs.
                        batch.discard();
                    }
                    // Each file another machine committed meanwhile is
                    // re-based on that commit (its guard is still held),
                    // and the round is prepared again on top of it.
                    for p in prepared.iter().filter(|p| stale.contains(&p.st.ino)) {
                        if let Err(r) = self.rebase(&p.st) {
                            return Err(r.context(format!("re-basing inode {} on another machine's commit", p.st.ino)));
                        }
                    }
                    return Err(e);
                }
            };
            self.settle_held(&batch, &pack_ids)?;
            batch.account();
            self.metrics.flushes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            report = FlushReport { files: prepared.len(), chunked_bytes: batch.chunked_bytes, new_chunk_bytes: batch.new_bytes, packs: batch.sealed.len(), patches: batch.patches };
            // Each file takes its commit (its flush lock still held).
            for p in prepared {
                p.st.apply_commit(CommittedRound { map: p.map, cver: p.cver, size: p.size, seq: p.seq, committed_seq: p.committed_seq, kept_from: p.kept_from });
            }
        }
        // Retire journal segments every committed record lives in, and forget
        // clean files nobody has open.
        let mut min_live = self.journal.last_seq() + 1;
        let mut evict = Vec::new();
        for e in self.files.iter() {
            let g = e.value().inner.lock();
            if g.last_seq > g.flushed_seq {
                min_live = min_live.min(g.flushed_seq + 1);
            } else if g.open == 0 && !g.is_dirty() {
                evict.push(*e.key());
            }
        }
        // The round's commit must be durable before a segment holding the
        // same data goes (rule 1, see order.rs).
        self.retire_journal(min_live)?;
        self.trim_marks(false);
        self.drain_closed();
        for ino in evict {
            self.files.forget_if(ino, |g| g.open == 0 && !g.is_dirty() && g.last_seq <= g.flushed_seq);
        }
        Ok(report)
    }

    /// Builds a file's new extent map: its committed map with the overlay
    /// spliced in and the changed regions re-chunked.
    ///
    /// With `hold_tail`, a file still open for writing keeps the chunk that
    /// runs to its end out of this flush: that chunk was cut by the flush, not
    /// by content, so storing it would waste a chunk and misalign dedup.
    ///
    /// With `max_pieces`, only the overlay's first `max_pieces` pieces (by
    /// offset) go into the map; the others stay in the overlay
    /// (`Plan::kept_from`), their records replay after a crash (the
    /// committed journal position stays below the first of them), and the
    /// committed size stops where the stored content or the last applied
    /// piece ends.
    fn prepare(&self, st: &FileState, batch: &mut Batch, hold_tail: bool, max_pieces: Option<usize>) -> Result<Plan> {
        batch.owner_of(st.ino)?;
        let (mut map, cver, pieces, size, base_valid, seq, writing) = {
            let g = st.inner.lock();
            let pieces: Vec<(u64, super::file::Piece)> = g.overlay.iter().map(|(&s, p)| (s, *p)).collect();
            (g.base.clone(), g.base_cver, pieces, g.size, g.base_valid, g.last_seq, g.open > 0 && !g.due)
        };
        let hold_tail = hold_tail && writing;
        if base_valid < map.len() {
            map.set_len(base_valid);
        }
        // A file still being written whose new bytes have a gap (the
        // writeback cache sends pages out of order) is flushed only up to
        // the gap: a chunk cut there would die when the gap is filled.
        // Bounded: with more than a quarter of the journal's limit past the
        // gap (a writer that leaves it open for good), the flush goes
        // through it, so held bytes never stall writers on journal room.
        let mut end = match hold_tail.then(|| first_gap(&pieces, map.len(), size)).flatten() {
            Some(gap) if size - gap <= self.opts.journal_limit / 4 => gap,
            _ => size,
        };
        // Pieces are disjoint and in order, so those before the first one
        // left out end at or before it.
        let kept_from = match max_pieces.and_then(|k| pieces.get(k)) {
            Some((s, _)) if *s < end => *s,
            _ => u64::MAX,
        };
        if kept_from != u64::MAX {
            // What lies past the stored content and the applied pieces is
            // left for later rounds (as a held tail is), not committed as
            // a hole.
            end = end.min(map.len().max(kept_from));
        }
        map.set_len(end);
        let mut dirty: Vec<(u64, u64)> = Vec::new();
        // The overlay's pieces are disjoint and in order: spliced in one
        // pass (one splice each cost O(PAGE_MAX + pages), quadratic in
        // the pieces of a file written a byte at a time).
        let mut edits: Vec<(u64, Vec<Extent>)> = Vec::with_capacity(pieces.len());
        for (s, p) in &pieces {
            if *s >= end || *s >= kept_from {
                continue;
            }
            let p = &if s + p.len > end { p.slice(0, end - s) } else { *p };
            let ext = match p.src {
                PieceSrc::Zero => Extent::hole(p.len),
                PieceSrc::Data(loc) => {
                    match dirty.last_mut() {
                        Some(last) if last.1 == *s => last.1 = s + p.len,
                        _ => dirty.push((*s, s + p.len)),
                    }
                    Extent { src: Source::Pending(loc), off: 0, len: p.len }
                }
            };
            edits.push((*s, vec![ext]));
        }
        map.overwrite_many(edits);
        let dirty = self.store_patches(&mut map, dirty, batch, !hold_tail)?;
        // Cluster dirty ranges that would re-chunk the same old chunks.
        let max = self.cfg.chunker.max as u64;
        let mut clusters: Vec<(u64, u64)> = Vec::new();
        for (a, b) in dirty {
            if let Some(last) = clusters.last_mut() {
                // 3·max: a re-chunk reads from max before its range to
                // 2·max after it (`rechunk`), so two clusters apart never
                // read each other's new chunks, which are only in this
                // round's batch, not yet in the chunk index.
                if a - last.1 < 3 * max && !map.range(last.1, a).iter().any(|(_, e)| e.src == Source::Hole) {
                    last.1 = b;
                    continue;
                }
            }
            clusters.push((a, b));
        }
        let n_clusters = clusters.len();
        // Right to left, so splices do not move the clusters still to do.
        // Records with bytes past the committed end replay after a crash, so
        // the committed journal position stays below them.
        let below = |t: u64| pieces.iter().filter(|(s0, p)| s0 + p.len > t).map(|(_, p)| p.seq).min().map_or(seq, |first| first - 1);
        let mut committed = end;
        // Records of the pieces left out replay after a crash.
        let left_out = if kept_from != u64::MAX { below(kept_from) } else { seq };
        let mut committed_seq = if end < size { below(end) } else { seq }.min(left_out);
        for (i, (a, b)) in clusters.into_iter().enumerate().rev() {
            let last = i + 1 == n_clusters;
            let held = self.rechunk(&mut map, a, b, batch, hold_tail && last && b == end, &[])?;
            if let Some(t) = held {
                // Commit up to `t`; the pieces covering the tail replay after a
                // crash, so the committed journal position stays below them.
                committed = t;
                map.set_len(t);
                committed_seq = below(t).min(left_out);
            }
        }
        debug_assert!(!map.has_pending());
        Ok(Plan { map, size: committed, seq, committed_seq, cver, kept_from })
    }

    /// Stores each small overwrite inside stored content as a chunk of its
    /// own (a *patch*), spliced between the parts of the old chunks around
    /// it; returns the dirty ranges left to re-chunk.
    ///
    /// Re-chunking a 4 KiB overwrite reads, cuts, hashes and seals the one
    /// or two chunks around it (megabytes), and scattered small writes less
    /// than two chunk-sizes apart merge into one cluster spanning all of
    /// them: fio's 4 KiB random writes on a 512 MiB file re-chunked the
    /// whole file every round. A patch costs its own bytes. It gives up
    /// content-defined boundaries there (the same bytes written elsewhere
    /// as a whole file chunk differently), so a neighbourhood that gathers
    /// more than [`PATCH_EXTENTS`] extents is re-chunked instead, which
    /// folds its patches back into content-defined chunks.
    ///
    /// With `appends`, a small append to stored content is a patch too (a
    /// file reopened to add a line): re-chunking it would read back and
    /// cut again the file's last chunk, which on a bucket is a GET. Not
    /// for a file still being written: there the flush holds back its
    /// tail chunk instead, so a stream keeps content-defined chunks.
    fn store_patches(&self, map: &mut ExtentMap, dirty: Vec<(u64, u64)>, batch: &mut Batch, appends: bool) -> Result<Vec<(u64, u64)>> {
        let max = self.cfg.chunker.max as u64;
        let patch_max = (self.cfg.chunker.min as u64 / 4).min(PATCH_MAX);
        let is_chunk = |m: &ExtentMap, at: u64| m.range(at, at + 1).first().is_some_and(|(_, e)| matches!(e.src, Source::Chunk(_)));
        let (mut patches, mut rest) = (Vec::new(), Vec::new());
        let mut prev_end = 0;
        for (a, b) in dirty {
            let after = std::mem::replace(&mut prev_end, b);
            let append = appends && b == map.len();
            let small = b - a <= patch_max && a > 0 && (b < map.len() || append);
            if small && is_chunk(map, a - 1) && (append || is_chunk(map, b)) && !map.more_extents_than(a.saturating_sub(max), (b + max).min(map.len()), PATCH_EXTENTS) {
                patches.push((a, b));
            } else if append && small && is_chunk(map, a - 1) {
                // Too many extents near the end: re-chunk from up to `max`
                // back (not across a hole, nor into the dirty range before:
                // ranges stay disjoint), which folds the patches there into
                // content-defined chunks (from `a` only the last one would
                // be, and every later append would re-chunk the growing
                // tail again).
                let near = map.range(a.saturating_sub(max).max(after), a);
                let from = near.iter().rev().take_while(|(_, e)| e.src != Source::Hole).last().map_or(a, |(s, _)| *s).max(after);
                rest.push((from, b));
            } else {
                rest.push((a, b));
            }
        }
        demote_patches_near_rechunks(&mut patches, &mut rest, max);
        if patches.is_empty() {
            return Ok(rest);
        }
        // All patches' bytes in one pooled buffer, one after the other.
        let mut bytes = self.flusher.windows.take(patches.iter().map(|(a, b)| (b - a) as usize).sum());
        for &(a, b) in &patches {
            self.read_map_into(map, a, b, &[], &mut bytes)?;
        }
        let mut at = 0;
        let slices: Vec<&[u8]> = patches.iter().map(|(a, b)| {
            let s = &bytes[at..at + (b - a) as usize];
            at += (b - a) as usize;
            s
        }).collect();
        let ids = batch.store(&slices)?;
        drop(slices);
        self.flusher.windows.give(bytes);
        map.overwrite_many(patches.iter().zip(ids).map(|((a, b), id)| (*a, vec![Extent::chunk(id, 0, b - a)])).collect());
        batch.patches += patches.len() as u64;
        Ok(rest)
    }

    /// Re-chunks `[a, b)` (new data) together with the old chunk before it
    /// and as much after it as it takes to fall back onto an old boundary.
    ///
    /// With `hold_tail` (the cluster runs to the end of a file still being
    /// written), the final chunk is not stored and its start is returned: the
    /// caller commits only up to there.
    ///
    /// Windows are pipelined: while one window's chunks are hashed,
    /// compressed and sealed on the rayon pool, the flush thread reads and
    /// cuts the next window (chunking is sequential and the costliest stage).
    ///
    /// `mem` holds the bytes of `Source::Mem` extents (an edit's new data).
    pub(crate) fn rechunk(&self, map: &mut ExtentMap, a: u64, b: u64, batch: &mut Batch, hold_tail: bool, mem: &[u8]) -> Result<Option<u64>> {
        let p = self.cfg.chunker;
        let max = p.max as u64;
        let left = match map.range(a.saturating_sub(max), a).last() {
            Some((at, e)) if matches!(e.src, Source::Chunk(_)) => *at,
            _ => a,
        };
        let limit = (b + 2 * max).min(map.len());
        let mut hard_end = limit;
        let mut boundaries = vec![b];
        for (at, e) in map.range(b, limit) {
            if e.src == Source::Hole {
                hard_end = at;
                break;
            }
            boundaries.push(at + e.len);
        }
        let soft = hard_end == b + 2 * max && hard_end < map.len();
        let window = WINDOW.max(4 * max);
        let m: &ExtentMap = map;
        let mut new_exts: Vec<Extent> = Vec::new();
        let mut held = None;
        let mut pos = left;
        let mut cur = if pos < hard_end { Some(self.cut_window(m, pos, (pos + window).min(hard_end), mem)?) } else { None };
        while let Some((buf, cuts)) = cur.take() {
            let last_window = pos + buf.len() as u64 == hard_end;
            let span = |r: std::ops::Range<usize>| -> Vec<&[u8]> { cuts[r].iter().map(|&(o, l)| &buf[o..o + l]).collect() };
            let hold_here = last_window && !soft && hold_tail && hard_end == m.len() && cuts.len() > 1 && {
                // Only new data can be held: it must all still be in the journal.
                let t = pos + cuts[cuts.len() - 1].0 as u64;
                m.range(t, hard_end).iter().all(|(_, e)| matches!(e.src, Source::Pending(_)))
            };
            // With old data after the dirty range, stop at the first cut
            // that lands on an old boundary at or after it: from there on
            // the old cuts are the ones a fresh write would make. In any
            // window, not only the last: new data longer than a window
            // (an 8 MiB insert) must not drag 2 × max of old data along.
            // A window's last cut is made by the window, not by content.
            let content_cuts = if last_window { cuts.len() } else { cuts.len().saturating_sub(1) };
            let hit = if soft {
                cuts[..content_cuts].iter().position(|&(o, l)| {
                    let e = pos + (o + l) as u64;
                    e >= b && boundaries.binary_search(&e).is_ok()
                })
            } else {
                None
            };
            let slices: Vec<&[u8]> = if hold_here {
                span(0..cuts.len() - 1)
            } else if let Some(i) = hit {
                span(0..i + 1)
            } else if !last_window {
                // Keep the last chunk: it was cut by the window, not by content.
                span(0..cuts.len().saturating_sub(1).max(1))
            } else if !soft {
                span(0..cuts.len())
            } else {
                // No cut fell on an old boundary: stop at the first one.
                let e = *boundaries.iter().find(|&&x| x > pos).unwrap_or(&hard_end);
                let n = cuts.iter().take_while(|&&(o, l)| pos + ((o + l) as u64) < e).count();
                let from: usize = cuts[..n].iter().map(|&(_, l)| l).sum();
                let mut v = span(0..n);
                v.push(&buf[from..(e - pos) as usize]);
                v
            };
            let next_pos = pos + slices.iter().map(|s| s.len() as u64).sum::<u64>();
            let more = !last_window && hit.is_none();
            // The next window is cut while this one is stored; the last
            // window (a small file's only one) has nothing to overlap and
            // stays off rayon's pool (a join from outside it wakes a worker).
            let (ids, next) = if more {
                rayon::join(|| batch.store(&slices), || self.cut_window(m, next_pos, (next_pos + window).min(hard_end), mem).map(Some))
            } else {
                (batch.store(&slices), Ok(None))
            };
            for (id, s) in ids?.into_iter().zip(&slices) {
                new_exts.push(Extent::chunk(id, 0, s.len() as u64));
            }
            pos = next_pos;
            if hold_here {
                held = Some(pos);
            }
            drop(slices);
            self.flusher.windows.give(buf);
            cur = next?;
        }
        let old: std::collections::HashSet<u64> = map.range(left, pos).into_iter().filter_map(|(_, e)| match e.src {
            Source::Chunk(id) => Some(id),
            _ => None,
        }).collect();
        batch.old_chunks_rechunked += old.len() as u64;
        map.splice(left, pos, new_exts);
        Ok(held)
    }

    /// Reads `[start, end)` of a map under construction and cuts it.
    fn cut_window(&self, map: &ExtentMap, start: u64, end: u64, mem: &[u8]) -> Result<(Vec<u8>, Vec<(usize, usize)>)> {
        let p = self.cfg.chunker;
        let buf = self.read_map(map, start, end, mem)?;
        let cuts = fastcdc::v2020::FastCDC::new(&buf, p.min as usize, p.avg as usize, p.max as usize).map(|c| (c.offset, c.length)).collect();
        Ok((buf, cuts))
    }

    /// The content of `[start, end)` of a map under construction.
    ///
    /// The buffer comes from the volume's window pool (give it back with
    /// `windows.give`) and is filled by appending, extent after extent, so
    /// only holes and journal reads are zero-filled first.
    fn read_map(&self, map: &ExtentMap, start: u64, end: u64, mem: &[u8]) -> Result<Vec<u8>> {
        let mut buf = self.flusher.windows.take((end - start) as usize);
        self.read_map_into(map, start, end, mem, &mut buf)?;
        Ok(buf)
    }

    /// Appends the content of `[start, end)` of a map under construction to `buf`.
    fn read_map_into(&self, map: &ExtentMap, start: u64, end: u64, mem: &[u8], buf: &mut Vec<u8>) -> Result<()> {
        let base = buf.len();
        let n = (end - start) as usize;
        for (at, e) in map.range(start, end) {
            debug_assert_eq!((buf.len() - base) as u64, at - start);
            let len = e.len as usize;
            match e.src {
                Source::Hole => buf.resize(buf.len() + len, 0),
                Source::Chunk(id) => {
                    let c = self.chunk(id)?;
                    buf.extend_from_slice(c.get(e.off as usize..(e.off + e.len) as usize).ok_or_else(|| Error::corrupt(format!("extent past the end of chunk #{id}")))?);
                }
                Source::Pending(loc) => {
                    let at = JLoc { offset: loc.offset + e.off, ..loc };
                    let file = self.journal.file(&loc)?;
                    self.journal.read_append(&file, &at, len, buf)?;
                }
                Source::Mem => buf.extend_from_slice(&mem[e.off as usize..(e.off + e.len) as usize]),
            }
        }
        if buf.len() - base != n {
            return Err(Error::corrupt(format!("internal: the map covers {} of the {n} bytes asked for", buf.len() - base)));
        }
        Ok(())
    }

    /// Commits a round: packs, chunks, every file's pages, sizes and
    /// reference counts, in one transaction.
    /// Queues the held pack for upload once it has waited a metadata
    /// interval (the flusher's tick): the shipper releases it before every
    /// version too, but a shipper stuck retrying through an outage must not
    /// keep data from even trying the bucket.
    pub(crate) fn release_old_held_pack(&self) {
        let Some(held) = self.medium.held() else { return };
        let old = held.pack.lock().as_ref().is_some_and(|h| h.2.elapsed() >= held.interval);
        if old {
            held.cache.release_held();
        }
    }

    /// After a round's commit: the chunks it moved out of a held pack are
    /// looked up anew, that pack goes (rule 3: once the transaction that
    /// stopped naming it is durable; from the outbox if it is still held,
    /// else through the trash as any uploaded pack), and the round's own
    /// held pack, if any, waits for the next round.
    fn settle_held(&self, batch: &Batch, pack_ids: &[u64]) -> Result<()> {
        self.chunks.forget_locations(batch.moved.iter().map(|&(id, ..)| id));
        let Some(held) = self.medium.held() else { return Ok(()) };
        *held.pack.lock() = batch.sealed.iter().zip(pack_ids).find(|(p, _)| p.held).map(|(p, &id)| (p.name.clone(), id, Instant::now()));
        let Some((name, id)) = &batch.absorbed else { return Ok(()) };
        self.chunks.forget_pack_name(*id);
        self.meta.sync()?;
        // A ship under way may have taken changes that name the held pack
        // and not yet queued it (rule 7): then it goes up and through the
        // trash like any uploaded pack. With the ship lock held, a later
        // ship takes this round's commit too, which no longer names it.
        let discarded = match held.ship_lock.try_lock() {
            Some(_ship) => held.cache.discard_held(name),
            None => {
                held.cache.release_held();
                false
            }
        };
        if !discarded {
            self.delete_objects(cairn_backend::Subsystem::Other, [name.as_str()])?;
        }
        Ok(())
    }

    /// Each file's commit compares and swaps its content version: a file
    /// another machine committed since this one built on its map is not
    /// committed over (its map would drop pages the store no longer links
    /// to it, and lose that machine's ranges). The whole transaction then
    /// fails with `Raced`, naming such files in `stale`, for the round to
    /// re-base them and run again. After the commit each `Prepared::cver`
    /// is the version the store now holds.
    fn commit(&self, batch: &Batch, prepared: &mut [Prepared], stale: &mut Vec<crate::types::Ino>) -> Result<Vec<u64>> {
        // The trace's PLACE records: every extent of the changed pages.
        // The maps' changes are taken before the transaction and their new
        // page ids installed after it: its closure may run again
        // (docs/metadata-store.md), so it changes nothing outside it.
        let mut edits = Vec::with_capacity(prepared.len());
        for p in prepared.iter_mut() {
            let ino = p.st.ino;
            let placed: Vec<Event> = if self.trace.is_some() {
                p.map.changed_extents().into_iter().map(|(at, e)| {
                    let chunk = match e.src {
                        Source::Chunk(id) => id,
                        _ => 0,
                    };
                    Event::Place { ino, offset: at, len: e.len, chunk, described: false }
                }).collect()
            } else {
                Vec::new()
            };
            let (mtime, ctime) = {
                let g = p.st.inner.lock();
                (g.mtime, g.ctime)
            };
            edits.push((p.map.take_changes(), placed, p.map.data_bytes(), mtime, ctime));
        }
        let versioned = self.meta.shared().is_some();
        let (placed, ids, pack_ids, cvers) = self.meta.write(|tx| {
            stale.clear(); // the store may run this again
            let pack_ids = batch.insert_into(tx)?;
            let mut placed = Vec::new();
            let mut ids = Vec::with_capacity(prepared.len());
            let mut cvers = Vec::with_capacity(prepared.len());
            for (p, (ch, ev, data_bytes, mtime, ctime)) in prepared.iter().zip(&edits) {
                let Some(row) = tx.get_inode(p.st.ino)? else {
                    ids.push(Vec::new());
                    cvers.push(p.cver);
                    continue; // deleted meanwhile: its new chunks stay unreferenced
                };
                if versioned && row.cver != p.cver {
                    stale.push(p.st.ino);
                    continue;
                }
                placed.extend(ev.iter().cloned());
                ids.push(meta::save_extents(tx, p.st.ino, ch)?);
                tx.update_content(p.st.ino, p.size, *data_bytes, *mtime, *ctime, p.committed_seq)?;
                cvers.push(if versioned { row.cver + 1 } else { p.cver });
            }
            if !stale.is_empty() {
                return Err(Error::new(ErrorKind::Raced, format!("another machine committed inode(s) {stale:?} since this one loaded them")));
            }
            Ok((placed, ids, pack_ids, cvers))
        })?;
        for ((p, ids), cver) in prepared.iter_mut().zip(&ids).zip(cvers) {
            p.map.assign_ids(ids);
            p.cver = cver;
        }
        if let Some(t) = &self.trace {
            t.record_all(batch.trace_events().chain(placed));
        }
        Ok(pack_ids)
    }

    /// Replays journal records newer than each inode's committed position.
    /// On a volume whose metadata is shared (PostgreSQL), deletes this
    /// journal's marks once the journal holds no record: every mark is a
    /// position at or below the journal's last seq, and with no record left
    /// at or below it none of them guards anything (`docs/shared-volume.md`
    /// §11.1). Marks committed after `last_seq` was read are above it and
    /// stay. Runs at the first round that finds the journal empty after the
    /// open (replay done), then at most every [`MARKS_TRIM_EVERY`] and only
    /// after flushes committed more marks; `force` (a clean close) skips the
    /// wait. The caller holds `flusher.mutex`, so no flush commits meanwhile.
    /// A failure is logged only: the marks stay correct, just more of them.
    pub(crate) fn trim_marks(&self, force: bool) {
        if self.opts.read_only || !self.is_shared() {
            return;
        }
        let flushes = self.metrics.flushes.load(std::sync::atomic::Ordering::Relaxed);
        if let Some((at, n)) = *self.flusher.marks_trimmed.lock() {
            if n == flushes || (!force && at.elapsed() < MARKS_TRIM_EVERY) {
                return;
            }
        }
        let upto = self.journal.last_seq();
        if !self.journal.is_empty() {
            return;
        }
        match self.meta.need_shared().and_then(|s| s.trim_journal_marks(upto)) {
            Ok(n) => {
                tracing::debug!(marks = n, upto, "the journal is empty: its commit marks were deleted");
                *self.flusher.marks_trimmed.lock() = Some((Instant::now(), flushes));
            }
            Err(e) => tracing::warn!("deleting the empty journal's commit marks (kept, harmless): {e}"),
        }
    }

    pub(crate) fn replay(&self, records: Vec<crate::journal::Record>) -> Result<usize> {
        let mut n = 0;
        for r in &records {
            match self.replay_record(r) {
                Ok(()) => n += 1,
                Err(e) if matches!(e.kind(), crate::error::ErrorKind::NotFound | crate::error::ErrorKind::IsDir | crate::error::ErrorKind::Invalid) => {}
                Err(e) => return Err(e.context("replaying the journal")),
            }
        }
        Ok(n)
    }
}

/// Deletes uploaded packs that no metadata names (their transaction never
/// committed), then their upload records. A failure only leaves orphans,
/// which gc removes (the records go once this session is gone).
pub(crate) fn discard_packs<'a>(vol: &Volume, who: cairn_backend::Subsystem, names: impl IntoIterator<Item = &'a str>) {
    let names: Vec<&str> = names.into_iter().collect();
    for name in &names {
        if let Err(e) = vol.chunks.paid(who).delete(name) {
            tracing::warn!("removing the unused pack {name}: {e} (gc removes it later)");
        }
    }
    if let Err(e) = vol.meta.shared().map_or(Ok(()), |s| s.end_uploads(&names)) {
        tracing::warn!("dropping the records of discarded uploads: {e} (gc drops them once this session is gone)");
    }
}
