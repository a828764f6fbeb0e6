//! Metadata-only content edits: range clones (`copy_file_range`) and
//! replace/insert/delete in the middle of a file (VarFS's `rpwrite`).
//!
//! Every edit works on a file whose content is all committed (its journal
//! overlay flushed first), holds the flush round lock and the files' locks
//! for its duration, and commits the new extent map in one transaction.
//! An edit rewrites only the extent pages it touches; a clone shares whole
//! pages when it copies a whole file. Data is read only where new bytes meet
//! old ones: the chunks at the two edges of a replace are re-chunked so that
//! the result is cut as if written from scratch (and keeps deduplicating).

use super::file::{FileInner, FileState, MAX_FILE_SIZE};
use super::flush::Batch;
use super::Volume;
use crate::error::{Error, ErrorKind, Result};
use crate::extent::{Extent, ExtentMap, Source};
use crate::meta;
use crate::types::{Ino, Timestamp};
use parking_lot::MutexGuard;
use std::sync::Arc;

/// Flush attempts before an edit gives up on a file that keeps failing to flush.
const CLEAN_ATTEMPTS: usize = 8;

/// Largest source range an edit reads into memory rather than splices,
/// when the range is still in the journal (see `replace`).
const INLINE_SOURCE_MAX: u64 = 64 << 20;

/// The bytes that replace a range.
#[derive(Clone, Copy, Debug)]
pub enum NewBytes<'a> {
    /// From memory (re-chunked with the edges).
    Data(&'a [u8]),
    /// Zero-copy: `len` bytes of file `ino` from `offset` (its extents are
    /// spliced in; only the two junctions are re-chunked). A range of at
    /// most 64 MiB still in the source's journal is read and handled as
    /// `Data` instead: it must be chunked either way, and chunking it with
    /// the junctions in one pass saves flushing the source first and then
    /// reading its edge chunks back (what libcairn's scratch file is).
    Range { ino: Ino, offset: u64, len: u64 },
}

/// What an edit did, for callers and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EditReport {
    /// The file's size afterwards.
    pub size: u64,
    /// Bytes read back and cut again at the edges.
    pub rechunked_bytes: u64,
    /// Bytes of chunks that were new to the volume.
    pub new_chunk_bytes: u64,
    /// Chunks the re-chunking produced (new or deduplicated).
    pub chunks_written: u64,
    /// Old chunks read back and cut again (the edges of the change).
    pub old_chunks_rechunked: u64,
}

/// Files locked for an edit, in inode order (never twice).
pub(super) struct Locked<'a> {
    _round: MutexGuard<'a, ()>,
    pub(super) states: Vec<Arc<FileState>>,
}

impl Volume {
    /// Flushes `inos` until their content is all committed, then locks them
    /// against flush rounds; the caller locks their `inner`s.
    pub(super) fn lock_clean(&self, inos: &[Ino]) -> Result<Locked<'_>> {
        let mut inos = inos.to_vec();
        inos.sort_unstable();
        inos.dedup();
        for _ in 0..CLEAN_ATTEMPTS {
            for &ino in &inos {
                let st = self.file_state(ino)?;
                if st.inner.lock().is_dirty() {
                    self.flush_round_of(true, Some(ino))?;
                }
            }
            let round = self.flusher.mutex.lock();
            let states: Vec<Arc<FileState>> = inos.iter().map(|&i| self.file_state(i)).collect::<Result<_>>()?;
            let clean = states.iter().all(|st| {
                let g = st.inner.lock();
                !g.evicted && !g.is_dirty()
            });
            if clean {
                return Ok(Locked { _round: round, states });
            }
        }
        Err(Error::new(ErrorKind::Busy, "the file's pending writes could not be flushed; see the log"))
    }

    /// `copy_file_range`: makes `[dst_off, dst_off + n)` of `dst` share the
    /// extents of `[src_off, src_off + n)` of `src`, where `n` is `len` cut at
    /// the end of `src`. No data is read or written; a whole-file copy shares
    /// the source's extent pages. Returns `n`.
    pub fn clone_range(&self, src: Ino, src_off: u64, dst: Ino, dst_off: u64, len: u64) -> Result<u64> {
        self.check_writable()?;
        if len == 0 {
            return Ok(0);
        }
        let locked = self.lock_clean(&[src, dst])?;
        let st_src = locked.states.iter().find(|s| s.ino == src).expect("locked").clone();
        let st_dst = locked.states.iter().find(|s| s.ino == dst).expect("locked").clone();
        let (src_map, src_size) = {
            let g = st_src.inner.lock();
            (g.base.clone(), g.size)
        };
        let mut d = st_dst.inner.lock();
        check_edit(&d)?;
        if src_off >= src_size {
            return Ok(0);
        }
        let n = len.min(src_size - src_off);
        let dst_end = dst_off.checked_add(n).filter(|e| *e <= MAX_FILE_SIZE).ok_or_else(|| Error::new(ErrorKind::TooBig, "copy past the largest file size"))?;
        if src == dst && src_off < dst_end && dst_off < src_off + n {
            return Err(Error::invalid("source and destination ranges overlap"));
        }
        // Already the same extents (a caller going on with the rest of a
        // whole-file clone it was told was shorter): nothing to do.
        if dst_end <= d.size && src_map.range(src_off, src_off + n).into_iter().map(|(_, e)| e).eq(d.base.range(dst_off, dst_end).into_iter().map(|(_, e)| e)) {
            return Ok(n);
        }
        let mut map = d.base.clone();
        if src_off == 0 && n == src_size && dst_off == 0 && d.size <= n && src_map.all_stored() {
            map.replace_with_share(&src_map);
        } else {
            if dst_off > map.len() {
                map.set_len(dst_off);
            }
            let cut_end = dst_end.min(map.len());
            let exts: Vec<Extent> = src_map.range(src_off, src_off + n).into_iter().map(|(_, e)| e).collect();
            map.splice(dst_off, cut_end, exts);
        }
        self.commit_edit(&st_dst, &mut d, map, None)?;
        Ok(n)
    }

    /// A hole over `[offset, end)` (cut at the size when `keep_size`) too
    /// long for a journal record (4 GiB and more): the file's pending
    /// writes are flushed and the hole is committed to its extent map, as
    /// a clone is. Costs O(pages touched) whatever its length. The group
    /// transaction is committed before returning, so the hole survives the
    /// daemon's death as a journaled one would (fsync makes it durable).
    pub(super) fn punch_committed(&self, ino: Ino, offset: u64, end: u64, keep_size: bool) -> Result<()> {
        let locked = self.lock_clean(&[ino])?;
        let st = locked.states[0].clone();
        let mut g = st.inner.lock();
        check_edit(&g)?;
        let end = if keep_size { end.min(g.size) } else { end };
        if end <= offset {
            return Ok(());
        }
        let mut map = g.base.clone();
        if end > map.len() {
            map.set_len(end);
        }
        map.splice(offset, end, vec![Extent::hole(end - offset)]);
        self.commit_edit(&st, &mut g, map, None)?;
        self.meta.commit()
    }

    /// `rpwrite`: replaces the `mbyte` bytes at `offset` (cut at the end of
    /// the file) with `new`: an insert when `mbyte` is 0, a delete when `new`
    /// is empty. `offset` may be the file's size (an append) but not past it.
    pub fn replace(&self, ino: Ino, offset: u64, mbyte: u64, new: NewBytes<'_>) -> Result<EditReport> {
        self.check_writable()?;
        let journaled;
        let new = match new {
            NewBytes::Range { ino: src, offset: so, len } if src != ino => match self.journaled_source(src, so, len)? {
                Some(bytes) => {
                    journaled = bytes;
                    NewBytes::Data(&journaled)
                }
                None => new,
            },
            _ => new,
        };
        let inos: Vec<Ino> = match new {
            NewBytes::Data(_) => vec![ino],
            NewBytes::Range { ino: src, .. } => vec![ino, src],
        };
        let locked = self.lock_clean(&inos)?;
        let st = locked.states.iter().find(|s| s.ino == ino).expect("locked").clone();
        // The source's extents, read before the target is locked (it may be
        // the same file).
        let (new_exts, mem, n): (Vec<Extent>, &[u8], u64) = match new {
            NewBytes::Data(b) => (vec![Extent { src: Source::Mem, off: 0, len: b.len() as u64 }], b, b.len() as u64),
            NewBytes::Range { ino: src, offset: so, len } => {
                let s = locked.states.iter().find(|s| s.ino == src).expect("locked");
                let g = s.inner.lock();
                let n = len.min(g.size.saturating_sub(so));
                (g.base.range(so, so + n).into_iter().map(|(_, e)| e).collect(), &[][..], n)
            }
        };
        let mut g = st.inner.lock();
        check_edit(&g)?;
        if offset > g.size {
            return Err(Error::invalid(format!("offset {offset} is past the end of the file ({} bytes)", g.size)));
        }
        let mbyte = mbyte.min(g.size - offset);
        let new_size = (g.size - mbyte).checked_add(n).filter(|s| *s <= MAX_FILE_SIZE).ok_or_else(|| Error::new(ErrorKind::TooBig, "the result would pass the largest file size"))?;
        let mut map = g.base.clone();
        map.splice(offset, offset + mbyte, new_exts);
        let mut report = EditReport { size: new_size, ..Default::default() };
        let mut batch = Batch::new(self);
        batch.owner_of(ino)?;
        match new {
            NewBytes::Data(_) => {
                self.rechunk(&mut map, offset, offset + n, &mut batch, false, mem)?;
                self.finish_edit(&st, &mut g, map, batch, &mut report)?;
            }
            NewBytes::Range { .. } => {
                // Each junction is re-chunked on its own, so the spliced-in
                // extents between them stay as they are. A re-chunk reads
                // only committed chunks, so the right junction (whose new
                // chunks the left one may reach) is committed first; the
                // content is the same before and after either commit.
                if n > 0 {
                    self.rechunk(&mut map, offset + n, offset + n, &mut batch, false, &[])?;
                }
                self.finish_edit(&st, &mut g, map, batch, &mut report)?;
                let mut map = g.base.clone();
                let mut batch = Batch::new(self);
                batch.owner_of(ino)?;
                self.rechunk(&mut map, offset, offset, &mut batch, false, &[])?;
                self.finish_edit(&st, &mut g, map, batch, &mut report)?;
            }
        }
        debug_assert_eq!(g.size, new_size);
        Ok(report)
    }

    /// The bytes of `[offset, offset + len)` of `src` (cut at its end) when
    /// some of them are still in its journal and they are at most
    /// [`INLINE_SOURCE_MAX`]; `None` when the range is better spliced.
    fn journaled_source(&self, src: Ino, offset: u64, len: u64) -> Result<Option<Vec<u8>>> {
        let n = self.with_file(src, |_, g| {
            let end = offset.saturating_add(len).min(g.size);
            if offset >= end || end - offset > INLINE_SOURCE_MAX {
                return Ok(None);
            }
            // Overlay pieces are sorted and disjoint: the last one starting
            // before `end` reaches furthest.
            let pending = g.overlay.range(..end).next_back().is_some_and(|(&s, p)| s + p.len > offset);
            Ok(pending.then_some(end - offset))
        })?;
        let Some(n) = n else { return Ok(None) };
        let mut bytes = Vec::with_capacity(n as usize);
        while (bytes.len() as u64) < n {
            let want = (n - bytes.len() as u64).min(16 << 20) as u32;
            let part = self.read_with(src, offset + bytes.len() as u64, want, false)?;
            if part.is_empty() {
                break; // the source shrank meanwhile: what was there is what is inserted
            }
            bytes.extend_from_slice(&part);
        }
        Ok(Some(bytes))
    }

    /// Uploads a batch's packs, commits the new map with them, and adds the
    /// batch's counters to `report`.
    fn finish_edit(&self, st: &FileState, g: &mut FileInner, map: ExtentMap, mut batch: Batch, report: &mut EditReport) -> Result<()> {
        batch.seal()?;
        batch.finish_uploads()?;
        report.rechunked_bytes += batch.chunked_bytes;
        report.new_chunk_bytes += batch.new_bytes;
        report.chunks_written += batch.chunks_stored;
        report.old_chunks_rechunked += batch.old_chunks_rechunked;
        self.commit_edit(st, g, map, Some(&batch))
    }

    /// Commits a file's new map (and the chunks of `batch`), then installs it.
    ///
    /// Where the store keeps content versions (a volume many machines
    /// share), only while the file is at the version its map was built
    /// on: an edit built on a map another machine has replaced since fails
    /// with `Raced` (EIO), changing nothing, and the state is re-based on
    /// that machine's commit so that the edit can be run again
    /// (docs/shared-volume.md §3).
    fn commit_edit(&self, st: &FileState, g: &mut FileInner, mut map: ExtentMap, batch: Option<&Batch>) -> Result<()> {
        let now = Timestamp::now();
        let ino = st.ino;
        let data_bytes = map.data_bytes();
        let size = map.len();
        let jseq = g.last_seq;
        let versioned = self.meta.shared().is_some();
        let expect = g.base_cver;
        // Taken before the transaction and installed after it: its closure
        // may run again (docs/metadata-store.md).
        let ch = map.take_changes();
        let r = self.meta.write(|tx| {
            let mut cver = expect;
            if versioned {
                let row = tx.get_inode(ino)?.ok_or_else(|| Error::not_found(format!("inode {ino} does not exist")))?;
                if row.cver != expect {
                    return Err(Error::new(ErrorKind::Raced, format!("another machine changed inode {ino} during the edit; nothing was changed, run it again")));
                }
                cver = row.cver + 1;
            }
            if let Some(b) = batch {
                b.insert_into(tx)?;
            }
            let ids = meta::save_extents(tx, ino, &ch)?;
            tx.update_content(ino, size, data_bytes, now, now, jseq)?;
            Ok((ids, cver))
        });
        let (ids, cver) = match r {
            Ok(v) => v,
            Err(e) => {
                if e.kind() == ErrorKind::Raced {
                    if let Some(b) = batch {
                        b.discard();
                    }
                    if versioned {
                        let fresh = self.meta.read(|c| Ok(match c.get_inode(ino)? {
                            Some(row) => Some((meta::load_extents(c, ino)?, row)),
                            None => None,
                        }))?;
                        if let Some((base, row)) = fresh {
                            if base.len() == row.attr.size && g.rebase_onto(&row, base) {
                                self.metrics.flush_rebases.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                        }
                    }
                }
                return Err(e);
            }
        };
        map.assign_ids(&ids);
        if let Some(b) = batch {
            b.account();
        }
        g.take_edit(map, cver, size, data_bytes, now);
        Ok(())
    }
}

/// Edits need a writable, regular, live file.
fn check_edit(g: &FileInner) -> Result<()> {
    if g.read_only {
        return Err(Error::new(ErrorKind::ReadOnly, "snapshots are read-only"));
    }
    Ok(())
}
