//! Recall (`cairn tape recall PATH...`, docs/tape.md §3): bring many files'
//! data from the home into the local cache in one pass over the medium.
//!
//! Reading files one by one from a tape costs a locate (seconds) each time
//! the next file's data lies elsewhere. Recall resolves every named file
//! to the pack ranges its chunks occupy, merges ranges close together
//! (reading through a short gap is far cheaper than a locate), drops what
//! the cache already holds, sorts the rest by position on the medium
//! ([`cairn_backend::Sequential::position`]) and reads them in that order
//! through the cache, a few at a time so that the store's read batches
//! stay full. On a bucket there is no position; the same plan warms the
//! cache with few, large ranged GETs.

use super::Volume;
use crate::error::{Error, ErrorKind, Result};
use crate::extent::Source;
use crate::meta;
use crate::types::{FileKind, Ino};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Reads in flight at once: enough to fill a tape read batch, few enough
/// that the order of the plan is the order of the medium.
const TAPE_READERS: usize = 4;
/// On a store with cheap ranged reads (a bucket), more run at once.
const BUCKET_READERS: usize = 8;
/// The largest single read: bounds the memory of a reader.
const MAX_RANGE: u64 = 16 << 20;

/// What a recall did.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RecallReport {
    /// Regular files named or found under the named directories.
    pub files: u64,
    /// Stored (compressed, sealed) bytes of their chunks.
    pub stored_bytes: u64,
    /// Of those, bytes the local cache held already.
    pub cached_bytes: u64,
    /// Bytes read from the home now (ranges merged across short gaps, so
    /// a little more than the chunks need).
    pub fetched_bytes: u64,
    /// Ranged reads sent to the home.
    pub reads: u64,
    /// Seconds from the plan to the last byte.
    pub seconds: f64,
    /// The local cache's bound (0 for a volume in a local directory).
    pub cache_capacity: u64,
    /// The volume keeps its packs in its own directory: there is no cache,
    /// the packs' ranges were read once so the OS page cache holds them.
    #[serde(default)]
    pub local: bool,
    /// More was recalled than the cache holds: the first ranges read may
    /// have been evicted again.
    pub overflow: bool,
    /// Packs in an archive class (GLACIER, DEEP_ARCHIVE) whose restore
    /// this warmup requested, one request each, with `restore requested at
    /// T, expected ready about T+Δ` (docs/tiers.md §6.1); their ranges
    /// were not read (run the warmup again once they are ready).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restores_requested: Vec<(String, String)>,
    /// Archived packs whose restore was already under way (none sent).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restores_ongoing: Vec<String>,
    /// Stored bytes of the chunks in those packs, not read.
    #[serde(default)]
    pub archived_bytes: u64,
}

/// One planned read.
struct Range {
    pack: Arc<str>,
    off: u64,
    len: u64,
    /// The chunk bytes it covers (a merged range also covers gaps).
    needed: u64,
}

impl Volume {
    /// Reads the data of the files `roots` (files, or directories taken
    /// whole) into the local cache, in the order it lies on the medium.
    /// `progress(done, total)` follows the bytes to fetch. A volume in a
    /// local directory has no cache: see [`Volume::warmup`].
    pub fn recall(&self, roots: &[Ino], progress: &mut dyn FnMut(u64, u64)) -> Result<RecallReport> {
        let roots: Vec<(Ino, Vec<u8>)> = roots.iter().map(|&i| (i, Vec::new())).collect();
        self.warmup(&roots, None, progress)
    }

    /// `cairn warmup`: [`Volume::recall`] for any volume. On a volume in a
    /// local directory (no cache) the packs' ranges are read once, so that
    /// the OS page cache holds them. With a `caller`, every directory in
    /// the trees must be readable and searchable by it and every file
    /// readable (the roots' paths, from the volume root, name them in
    /// errors).
    pub fn warmup(&self, roots: &[(Ino, Vec<u8>)], caller: Option<crate::types::Caller>, progress: &mut dyn FnMut(u64, u64)) -> Result<RecallReport> {
        let cloud = self.cloud();
        let t0 = Instant::now();
        let cache = cloud.map(|c| c.cache.clone());
        let caps = self.chunks.backend.capabilities();
        let (files, chunks) = self.recall_chunks(roots, caller)?;

        // Chunk ranges per pack, in offset order.
        let mut by_pack: BTreeMap<Arc<str>, Vec<(u64, u64)>> = BTreeMap::new();
        for id in chunks {
            let (name, e) = self.chunks.chunk_location(&self.meta, id)?;
            by_pack.entry(name).or_default().push((e.offset, e.stored_len as u64));
        }
        // A gap shorter than this is read through: on a tape a locate costs
        // seconds and reading costs milliseconds per MiB; on a bucket a GET
        // costs about as much as a few dozen KiB of transfer.
        let gap = if caps.cheap_ranged_reads { 64 << 10 } else { 4 << 20 };
        let mut rep = RecallReport { files, cache_capacity: cloud.map_or(0, |c| c.opts.cache_bytes), local: cloud.is_none(), ..Default::default() };
        let mut plan: Vec<Range> = Vec::new();
        for (pack, mut ranges) in by_pack {
            ranges.sort_unstable();
            ranges.dedup();
            let mut cur: Option<Range> = None;
            for (off, len) in ranges {
                rep.stored_bytes += len;
                match &mut cur {
                    Some(r) if off <= r.off + r.len + gap && off + len - r.off <= MAX_RANGE => {
                        r.len = r.len.max(off + len - r.off);
                        r.needed += len;
                    }
                    _ => {
                        plan.extend(cur.take());
                        cur = Some(Range { pack: pack.clone(), off, len, needed: len });
                    }
                }
            }
            plan.extend(cur);
        }
        plan.retain(|r| {
            let held = cache.as_ref().is_some_and(|c| c.holds(&r.pack, r.off, r.len));
            if held {
                rep.cached_bytes += r.needed;
            }
            !held
        });
        // The medium's order; ranges of objects it cannot place (not yet
        // written, or a bucket) after, by name and offset.
        let medium = self.chunks.backend.sequential();
        let mut keyed: Vec<(u64, Range)> = plan.into_iter().map(|r| (medium.and_then(|m| m.position(&r.pack, r.off)).unwrap_or(u64::MAX), r)).collect();
        keyed.sort_by(|a, b| (a.0, &a.1.pack, a.1.off).cmp(&(b.0, &b.1.pack, b.1.off)));
        let plan: Vec<Range> = keyed.into_iter().map(|(_, r)| r).collect();
        let total: u64 = plan.iter().map(|r| r.len).sum();
        rep.overflow = cache.as_ref().is_some_and(|c| total + c.stats().clean_bytes > rep.cache_capacity);
        progress(0, total);

        let next = AtomicUsize::new(0);
        let done = AtomicU64::new(0);
        let reads = AtomicU64::new(0);
        let failure: parking_lot::Mutex<Option<Error>> = parking_lot::Mutex::new(None);
        // Packs a GET found archived: their other ranges are not asked for.
        let archived: parking_lot::Mutex<std::collections::BTreeSet<Arc<str>>> = Default::default();
        let readers = if caps.cheap_ranged_reads { BUCKET_READERS } else { TAPE_READERS };
        std::thread::scope(|s| {
            for _ in 0..readers.min(plan.len()) {
                s.spawn(|| {
                    loop {
                        if self.closed.load(Ordering::SeqCst) || failure.lock().is_some() {
                            return;
                        }
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        let Some(r) = plan.get(i) else { return };
                        if archived.lock().contains(&r.pack) {
                            done.fetch_add(r.len, Ordering::Relaxed);
                            continue;
                        }
                        reads.fetch_add(1, Ordering::Relaxed);
                        // The bill: these reads are recall's (a prefetch).
                        match self.chunks.paid(cairn_backend::Subsystem::Prefetch).get_range(&r.pack, r.off, r.len) {
                            Ok(_) => {
                                done.fetch_add(r.len, Ordering::Relaxed);
                            }
                            Err(e) if e.kind() == cairn_backend::ErrorKind::Archived => {
                                archived.lock().insert(r.pack.clone());
                                done.fetch_add(r.len, Ordering::Relaxed);
                            }
                            Err(e) => {
                                let e = Error::from(e).context(format!("recalling {} bytes at {} of pack {}", r.len, r.off, r.pack));
                                failure.lock().get_or_insert(e);
                                return;
                            }
                        }
                    }
                });
            }
            // Progress from here, while the readers work.
            loop {
                let d = done.load(Ordering::Relaxed);
                progress(d, total);
                if d >= total || next.load(Ordering::SeqCst) >= plan.len() + readers || failure.lock().is_some() || self.closed.load(Ordering::SeqCst) {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        });
        if let Some(e) = failure.into_inner() {
            return Err(e);
        }
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::new(ErrorKind::Io, "the volume was unmounted during the recall"));
        }
        // The restores of the archived packs, at once, one per pack.
        let archived: Vec<Arc<str>> = archived.into_inner().into_iter().collect();
        if !archived.is_empty() {
            rep.archived_bytes = plan.iter().filter(|r| archived.contains(&r.pack)).map(|r| r.needed).sum();
            for (pack, st) in self.chunks.request_restores(cairn_backend::Subsystem::Prefetch, &self.meta, &archived)? {
                match st {
                    super::chunks::RecallState::Requested(what) => rep.restores_requested.push((pack.to_string(), what)),
                    super::chunks::RecallState::Ongoing => rep.restores_ongoing.push(pack.to_string()),
                }
            }
        }
        // Packs of recorded restores that this warmup read: their copies
        // are readable, so their rows go (one query for the table).
        self.chunks.forget_read_restores(&self.meta, plan.iter().map(|r| &r.pack).filter(|p| !archived.contains(p)));
        let fetched = done.into_inner();
        rep.fetched_bytes = fetched - plan.iter().filter(|r| archived.contains(&r.pack)).map(|r| r.len).sum::<u64>();
        progress(fetched, total);
        rep.reads = reads.into_inner();
        rep.seconds = t0.elapsed().as_secs_f64();
        Ok(rep)
    }

    /// The regular files under `roots` and the chunks their content
    /// references (each once), from the committed metadata.
    fn recall_chunks(&self, roots: &[(Ino, Vec<u8>)], caller: Option<crate::types::Caller>) -> Result<(u64, HashSet<u64>)> {
        let mut files = 0u64;
        let mut chunks = HashSet::new();
        for (root, path) in roots {
            self.walk_tree(*root, path, caller, true, &mut |a, _| {
                if a.kind == FileKind::File {
                    files += 1;
                    let map = self.meta.read(|c| meta::load_extents(c, a.ino))?;
                    for (_, e) in map.iter() {
                        if let Source::Chunk(id) = e.src {
                            chunks.insert(id);
                        }
                    }
                }
                Ok(())
            })?;
        }
        Ok((files, chunks))
    }
}
