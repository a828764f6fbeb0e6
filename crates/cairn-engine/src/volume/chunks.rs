//! The chunk store: what a mount knows of chunks and packs (the keys
//! that seal them, the backend that holds the packs, the memory cache of
//! decoded chunks and their kept last pages, where each chunk lives), and
//! the reads of chunks: one on a miss (fetched, decoded, verified), and
//! the prefetch that reads runs of chunks ahead of a sequential reader.
//! The volume holds one; it asks the metadata (handed in) where a chunk
//! lives, and never changes a file.

use super::{tails, workers};
use crate::cache::{CachedBackend, ChunkCache, ReadFor};
use crate::crypto::Keys;
use crate::error::{Error, Result};
use crate::meta::Meta;
use crate::metrics::Metrics;
use crate::pack::{self, BlobEntry};
use crate::types::Ino;
use cairn_backend::{Backend, Payers, Subsystem};
use dashmap::DashMap;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What a mount holds in memory per chunk and per pack
/// ([`crate::Volume::memory_held`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryHeld {
    /// Decoded chunks in the memory cache, and their bytes.
    pub cached_chunks: u64,
    pub cached_bytes: u64,
    /// Chunk locations resolved (chunk id to pack and offset).
    pub chunk_locations: u64,
    /// Pack names resolved (pack id to name).
    pub pack_names: u64,
}

/// The chunks and packs of an open volume.
pub(crate) struct ChunkStore {
    pub(crate) keys: Keys,
    /// The store of packs (a cloud volume's: its cache).
    pub(crate) backend: Arc<dyn Backend>,
    /// `backend`'s handle for each payer (the bill by subsystem): a
    /// request goes through the one of the subsystem that pays for it.
    paid: Payers,
    /// A cloud volume's cache (the same object as `backend`), which the
    /// chunk reads tell who pays and the file they are for.
    disk: Option<Arc<CachedBackend>>,
    /// Decoded chunks.
    pub(crate) cache: ChunkCache,
    /// The last page of chunks stored or fetched, where a read costs a
    /// request: the kernel's read of a file's partial last page before an
    /// append is answered without one.
    pub(crate) tails: tails::ChunkTails,
    pack_names: DashMap<u64, Arc<str>>,
    /// The reverse of `pack_names`: the id a `restores` row names.
    pack_ids: DashMap<Arc<str>, u64>,
    /// Where chunks live. Locations change only in gc: offline, or the
    /// cleaner inside a mount, which drops the entries of what it moved
    /// (the old packs stay readable meanwhile, docs/frugal.md §5).
    chunk_locs: DashMap<u64, (Arc<str>, BlobEntry)>,
    /// Chunks being fetched, by a prefetch or by a reader that missed: a
    /// reader that misses the cache waits for one of these instead of
    /// fetching and verifying it again, and a prefetch skips them.
    prefetching: DashMap<u64, Arc<InFlight>>,
    /// Prefetch runs handed to threads and not yet ended: `close` waits
    /// for them, since each holds the volume (and may fill its cache), so
    /// that the caller's handle is the last and the lock goes with it.
    prefetch_runs: Arc<RunsInFlight>,
    /// The threads prefetch reads wait on (a bucket's or a local disk's).
    fetchers: workers::Workers,
    /// Prefetch reads of a store where a read positions the medium (a
    /// tape): many at once, so the store sees every reader's request and
    /// serves them in one pass in position order.
    tape_fetchers: workers::Workers,
    /// Where the access trace goes, when one is recorded.
    trace: Option<Arc<crate::trace::TraceWriter>>,
    /// Restores of archived packs this mount requested, by pack name
    /// (docs/tiers.md §6): every reader of the pack waits on the one
    /// restore (single flight). Each one sent is also recorded in the
    /// metadata's `restores` table (`cairn tier status` shows it on every
    /// machine) and deleted there once the copy is readable.
    recalls: Mutex<std::collections::HashMap<Arc<str>, Arc<Recall>>>,
    /// `recalls` is not empty: a read miss looks there only then (no lock
    /// on the read path of a volume with nothing archived).
    any_recalls: std::sync::atomic::AtomicBool,
    /// How long a read waits for a restore before EAGAIN (`--recall-wait`).
    recall_wait: std::time::Duration,
}

impl ChunkStore {
    /// A store of `backend`'s packs sealed with `keys`, with `cache_bytes`
    /// of decoded chunks and `tail_bytes` of their last pages in memory;
    /// `disk`: `backend` itself, when it is a cloud volume's cache.
    pub(crate) fn new(keys: Keys, backend: Arc<dyn Backend>, disk: Option<Arc<CachedBackend>>, cache_bytes: usize, tail_bytes: usize, trace: Option<Arc<crate::trace::TraceWriter>>) -> ChunkStore {
        ChunkStore {
            keys,
            paid: Payers::new(backend.clone()),
            backend,
            disk,
            cache: ChunkCache::new(cache_bytes),
            tails: tails::ChunkTails::new(tail_bytes),
            pack_names: DashMap::new(),
            pack_ids: DashMap::new(),
            chunk_locs: DashMap::new(),
            prefetching: DashMap::new(),
            prefetch_runs: Arc::default(),
            fetchers: workers::Workers::new("cairn-fetch", PREFETCH_THREADS),
            tape_fetchers: workers::Workers::new("cairn-tape-fetch", TAPE_FETCH_THREADS),
            trace,
            recalls: Mutex::new(Default::default()),
            any_recalls: Default::default(),
            recall_wait: crate::cloud::RECALL_WAIT,
        }
    }

    /// Sets how long a read of an archived pack waits for its restore.
    pub(crate) fn with_recall_wait(mut self, wait: std::time::Duration) -> ChunkStore {
        self.recall_wait = wait;
        self
    }

    /// Makes archived pack `name` readable (docs/tiers.md §6): asks the
    /// store where it stands, sends one restore for it unless one is under
    /// way (this mount's, single flight, or another machine's), then polls
    /// with backoff (1 s, doubling, at most [`RECALL_POLL_MAX`]) until the
    /// restored copy is readable. Past `--recall-wait` the read fails with
    /// [`ErrorKind::Again`](crate::ErrorKind::Again) (EAGAIN) and a message
    /// with the restore's expected time; the restore goes on, and a later
    /// read finds it (or its copy).
    pub(crate) fn recall(&self, who: Subsystem, meta: &Meta, name: &Arc<str>) -> Result<()> {
        let start = std::time::Instant::now();
        let store = self.paid(who);
        let mut backoff = RECALL_POLL_FIRST;
        loop {
            let rec = self.recall_of(name);
            let state = store.restore_state(name).map_err(|e| Error::from(e).context(format!("pack {name}: asking where its restore stands")))?;
            if state.readable() {
                self.recall_done(meta, name);
                return Ok(());
            }
            if state.restore == cairn_backend::RestoreState::None {
                // None asked for (or its copy expired): this mount asks,
                // once for all its readers.
                if let Some(sent) = rec.send(store.as_ref(), name, state.class)? {
                    self.record_restore(meta, name, state.class, sent);
                }
            }
            let waited = start.elapsed();
            if waited >= self.recall_wait {
                return Err(Error::new(
                    crate::ErrorKind::Again,
                    format!("pack {name}: {}; not ready after waiting {:.0} s (--recall-wait): try again later", rec.describe(), waited.as_secs_f64()),
                ));
            }
            std::thread::sleep(backoff.min(self.recall_wait - waited));
            backoff = (backoff * 2).min(RECALL_POLL_MAX);
        }
    }

    /// This mount's restore of pack `name`, made if there is none.
    fn recall_of(&self, name: &Arc<str>) -> Arc<Recall> {
        let mut recalls = self.recalls.lock();
        self.any_recalls.store(true, Ordering::Relaxed);
        recalls.entry(name.clone()).or_insert_with(|| Arc::new(Recall::default())).clone()
    }

    /// Pack `name` was read: a restore this mount sent for it is over.
    fn recall_done(&self, meta: &Meta, name: &Arc<str>) {
        let ended = {
            let mut recalls = self.recalls.lock();
            let ended = recalls.remove(name).is_some();
            self.any_recalls.store(!recalls.is_empty(), Ordering::Relaxed);
            ended
        };
        if ended {
            self.forget_restore(meta, name);
        }
    }

    /// Sends the restores of the archived packs among `names`, one request
    /// per pack, without waiting (`cairn warmup`): what was sent, and the
    /// packs that needed none.
    pub(crate) fn request_restores(&self, who: Subsystem, meta: &Meta, names: &[Arc<str>]) -> Result<Vec<(Arc<str>, RecallState)>> {
        let store = self.paid(who);
        let mut out = Vec::new();
        for name in names {
            let state = match store.restore_state(name) {
                Ok(s) => s,
                // A store without classes: nothing is ever archived.
                Err(e) if e.kind() == cairn_backend::ErrorKind::Unsupported => return Ok(Vec::new()),
                Err(e) => return Err(Error::from(e).context(format!("pack {name}: asking where its restore stands"))),
            };
            let st = if state.readable() {
                continue;
            } else if state.restore == cairn_backend::RestoreState::None {
                let rec = self.recall_of(name);
                if let Some(sent) = rec.send(store.as_ref(), name, state.class)? {
                    self.record_restore(meta, name, state.class, sent);
                }
                RecallState::Requested(rec.describe())
            } else {
                RecallState::Ongoing
            };
            out.push((name.clone(), st));
        }
        Ok(out)
    }

    /// Records a restore this mount just sent in the `restores` table. A
    /// failure is logged, not returned: the restore itself was sent, and
    /// the reader waits on the store's answer, not on the row.
    fn record_restore(&self, meta: &Meta, name: &str, class: cairn_backend::StorageClass, (at, eta): (std::time::SystemTime, std::time::Duration)) {
        let Some(pack) = self.pack_ids.get(name).map(|p| *p) else { return };
        let ns = |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64);
        let row = cairn_meta::RestoreRow { pack, class: tier_code(class), requested_ns: ns(at), ready_estimate_ns: ns(at + eta), expires_ns: None };
        if let Err(e) = meta.write(|tx| Ok(tx.insert_restore(&row)?)) {
            tracing::warn!("pack {name}: the restore was sent but not recorded in the metadata: {e}");
        }
    }

    /// Deletes the `restores` row of pack `name`, now readable.
    fn forget_restore(&self, meta: &Meta, name: &str) {
        let Some(pack) = self.pack_ids.get(name).map(|p| *p) else { return };
        let had = meta.read(|c| Ok(c.get_restore(pack)?.is_some())).unwrap_or(false);
        if had {
            if let Err(e) = meta.write(|tx| Ok(tx.delete_restore(pack)?)) {
                tracing::warn!("pack {name}: its restore is done but its row stays: {e}");
            }
        }
    }

    /// Deletes the `restores` rows of the packs among `read` (packs just
    /// read whole or in part: their copies are readable). One query for
    /// the table; nothing more when it is empty, as it almost always is.
    pub(crate) fn forget_read_restores<'a>(&self, meta: &Meta, read: impl Iterator<Item = &'a Arc<str>>) {
        let rows = match meta.read(|c| Ok(c.list_restores()?)) {
            Ok(rows) if !rows.is_empty() => rows,
            _ => return,
        };
        let read: std::collections::HashSet<&str> = read.map(|p| &**p).collect();
        for row in rows {
            if self.pack_name(meta, row.pack).is_ok_and(|n| read.contains(&*n)) {
                if let Err(e) = meta.write(|tx| Ok(tx.delete_restore(row.pack)?)) {
                    tracing::warn!("pack #{}: its restore is done but its row stays: {e}", row.pack);
                }
            }
        }
    }

    /// The name of pack `pack`, asked of `meta` once.
    pub(crate) fn pack_name(&self, meta: &Meta, pack: u64) -> Result<Arc<str>> {
        if let Some(n) = self.pack_names.get(&pack) {
            return Ok(n.clone());
        }
        let n: Arc<str> = meta.read(|c| Ok(c.pack_name(pack)?))?.into();
        self.pack_names.insert(pack, n.clone());
        self.pack_ids.insert(n.clone(), pack);
        Ok(n)
    }

    /// A chunk's plaintext: from the cache, or fetched, decrypted,
    /// decompressed and verified. Corruption is an error naming the pack.
    /// `r`: who pays for a fetch (a read miss, or the gc or prefetch that
    /// asked) and the file it is read for (the disk cache's policy learns
    /// it), if any. `meta` says where it lives; `metrics` counts the hit
    /// or miss.
    pub(crate) fn chunk(&self, id: u64, r: ReadFor, meta: &Meta, metrics: &Metrics) -> Result<Arc<Vec<u8>>> {
        if let Some(c) = self.cache.get(id) {
            metrics.chunk_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(c);
        }
        // One fetch per chunk at a time (single flight): a reader that
        // misses registers its own fetch where prefetches look, so a
        // prefetch started meanwhile skips the chunk instead of fetching it
        // a second time; and a reader that finds a fetch under way waits
        // for it rather than read and verify the chunk twice. Not on a
        // rayon worker: the fetch may be queued behind this very task on
        // the same pool, so that reader fetches for itself.
        let _own_flight = match self.prefetching.entry(id) {
            dashmap::Entry::Occupied(o) => {
                let f = o.get().clone();
                drop(o);
                if rayon::current_thread_index().is_none() {
                    f.wait();
                    if let Some(c) = self.cache.get(id) {
                        metrics.chunk_hits.fetch_add(1, Ordering::Relaxed);
                        return Ok(c);
                    }
                }
                // The other fetch failed (its reader reports it) or is
                // stuck: fetch for ourselves, unregistered.
                None
            }
            dashmap::Entry::Vacant(v) => {
                let flight = v.insert(Arc::new(InFlight::default())).value().clone();
                let own = OwnFlight { store: self, id, flight };
                // A fetch that ended between the miss above and the entry
                // put the chunk in the cache: no need for another.
                if let Some(c) = self.cache.get(id) {
                    metrics.chunk_hits.fetch_add(1, Ordering::Relaxed);
                    return Ok(c);
                }
                Some(own)
            }
        };
        metrics.chunk_misses.fetch_add(1, Ordering::Relaxed);
        let (mut name, mut entry) = self.chunk_location(meta, id)?;
        let mut got = self.read(r, &name, entry.offset, entry.stored_len as u64);
        if matches!(&got, Err(e) if e.kind() == cairn_backend::ErrorKind::Archived) {
            // The pack is in an archive class: restore it and wait
            // (bounded by --recall-wait, then EAGAIN), then read again.
            self.recall(r.who, meta, &name)?;
            got = self.read(r, &name, entry.offset, entry.stored_len as u64);
        }
        if matches!(&got, Err(e) if e.kind() == cairn_backend::ErrorKind::NotFound) {
            // The chunk moved and its old pack went: the cleaner of this
            // mount did it (a volume in a directory deletes at once,
            // docs/frugal.md §8), another machine's gc or cleaner did it
            // after the grace period, or a flush round copied a held pack
            // into its own and dropped it from the outbox (docs/frugal.md
            // §7). The location this mount resolved is stale (and the
            // pack's id may name another pack now). Ask the metadata
            // again, once.
            self.chunk_locs.remove(&id);
            self.pack_names.retain(|_, n| **n != *name);
            self.pack_ids.remove(&name);
            (name, entry) = self.chunk_location(meta, id)?;
            got = self.read(r, &name, entry.offset, entry.stored_len as u64);
        }
        if got.is_ok() && self.any_recalls.load(Ordering::Relaxed) {
            // A pack this mount asked to restore read fine: its copy is
            // ready, whether or not a reader saw it become so.
            self.recall_done(meta, &name);
        }
        if let Some(t) = &self.trace {
            t.chunk_at(id, crate::trace::pack_id(&name), entry.offset, entry.stored_len as u64);
        }
        let data = got
            .map_err(Error::from)
            .and_then(|stored| pack::decode_blob(&self.keys, &entry, stored, pack::Verify::Sealed))
            .map_err(|e| {
                let e = Error::corrupt(format!("chunk #{id} in pack {name}: {e}"));
                tracing::warn!("{e}");
                e
            })?;
        self.tails.keep(id, &data);
        let data = Arc::new(data);
        self.cache.insert(id, data.clone());
        Ok(data)
    }

    /// Where chunk `id` lives (its pack's name and its blob), asked of
    /// `meta` once.
    pub(crate) fn chunk_location(&self, meta: &Meta, id: u64) -> Result<(Arc<str>, BlobEntry)> {
        if let Some(l) = self.chunk_locs.get(&id) {
            return Ok(l.clone());
        }
        let row = meta
            .read(|c| Ok(c.chunk_by_id(id)?))?
            .ok_or_else(|| Error::corrupt(format!("chunk #{id} is referenced but not in the chunk index")))?;
        let name = self.pack_name(meta, row.pack)?;
        let entry = BlobEntry { id: row.hash, offset: row.offset, stored_len: row.stored_len, raw_len: row.raw_len, flags: row.flags };
        // About 100 bytes an entry: start over past a million rather than grow.
        if self.chunk_locs.len() > 1 << 20 {
            self.chunk_locs.clear();
        }
        self.chunk_locs.insert(id, (name.clone(), entry.clone()));
        Ok((name, entry))
    }

    /// Forgets chunks whose rows the cleaner or gc dropped: their decoded
    /// bytes in the memory cache and their locations (issue 55). Nothing
    /// else drops them but the cache's LRU and the location map's reset
    /// past a million entries, so under a rewrite load the cache filled
    /// its whole budget with chunks that no longer exist (1 GiB for a
    /// 256 KiB file) and the map grew with every chunk ever read.
    pub(crate) fn forget_chunks(&self, ids: &[u64]) {
        for id in ids {
            self.cache.remove(*id);
            self.chunk_locs.remove(id);
        }
    }

    /// Forgets where chunks `ids` live (moved by the cleaner or gc, or
    /// out of a held pack): the next read asks the metadata.
    pub(crate) fn forget_locations(&self, ids: impl IntoIterator<Item = u64>) {
        for id in ids {
            self.chunk_locs.remove(&id);
        }
    }

    /// Forgets the name of pack `id` (gone, or its id about to name another).
    pub(crate) fn forget_pack_name(&self, id: u64) {
        self.pack_names.remove(&id);
    }

    /// What this mount holds in memory per chunk and per pack.
    pub(crate) fn memory_held(&self) -> MemoryHeld {
        MemoryHeld { cached_chunks: self.cache.len() as u64, cached_bytes: self.cache.bytes() as u64, chunk_locations: self.chunk_locs.len() as u64, pack_names: self.pack_names.len() as u64 }
    }

    /// Starts fetching chunks in the background so a sequential reader
    /// finds them decoded.
    ///
    /// Chunks that lie next to each other in one pack (a file's segment,
    /// and the segments of files flushed with it) are fetched by one ranged
    /// read, so a sequential reader costs one GET per run, whatever block
    /// size the cache fetches by (docs/frugal.md §3).
    ///
    /// Each run holds `holder` (the volume) until it ends, and `meta` says
    /// where the chunks live.
    pub(crate) fn prefetch<V: AsRef<ChunkStore> + Send + Sync + 'static>(&self, holder: Arc<V>, meta: &Meta, ino: Ino, ids: Vec<u64>) {
        // A bucket: requests cost more than bytes, so runs are as long as
        // a pack. A local disk: runs short enough that several are in
        // flight. A tape orders its reads itself and keeps longer runs.
        let caps = self.backend.capabilities();
        let run_max = if caps.remote && caps.cheap_ranged_reads {
            PREFETCH_RUN_REMOTE
        } else if caps.cheap_ranged_reads {
            PREFETCH_RUN_DISK
        } else {
            PREFETCH_RUN_TAPE
        };
        // Each run with its bytes so far.
        let mut runs: Vec<(Arc<str>, Vec<(u64, BlobEntry, Arc<InFlight>)>, u64)> = Vec::new();
        for id in ids {
            if self.cache.contains(id) {
                continue;
            }
            let flight = match self.prefetching.entry(id) {
                dashmap::Entry::Occupied(_) => continue,
                dashmap::Entry::Vacant(v) => v.insert(Arc::new(InFlight::default())).value().clone(),
            };
            let Ok((name, e)) = self.chunk_location(meta, id) else {
                self.finish_prefetch(id, &flight);
                continue;
            };
            let len = e.stored_len as u64;
            match runs.last_mut() {
                Some((n, run, bytes)) if *n == name && run.last().is_some_and(|(_, p, _)| p.offset + p.stored_len as u64 == e.offset) && *bytes + len <= run_max => {
                    run.push((id, e, flight));
                    *bytes += len;
                }
                _ => runs.push((name, vec![(id, e, flight)], len)),
            }
        }
        if runs.is_empty() {
            return;
        }
        if !self.prefetch_runs.enter(runs.len()) {
            // Closing: nothing new starts; the waiting readers fetch for themselves.
            for (_, run, _) in runs {
                for (id, _, flight) in run {
                    self.finish_prefetch(id, &flight);
                }
            }
            return;
        }
        for (name, run, _) in runs {
            let run = PrefetchRun { vol: Some(holder.clone()), name, run };
            let job = move || {
                if let Some(vol) = &run.vol {
                    (**vol).as_ref().prefetch_run(&run.name, &run.run, ino);
                }
            };
            if caps.cheap_ranged_reads {
                // Waits on the network or the disk (a local store reads
                // with O_DIRECT, without the kernel's read-ahead): on
                // threads of its own, so several runs are in flight at
                // once, not on the pool the flush hashes with. A job
                // refused (no thread could start) is dropped unrun, which
                // releases its readers to fetch the chunks themselves.
                let _ = self.fetchers.submit(move || {
                    job();
                    Ok(())
                });
            } else {
                // A tape: the store batches what arrives together and
                // reads it in tape order; on rayon's pool (one thread per
                // core) two requests reached it at a time, and 40 whole
                // files read at once went as 20 batches of two, locating
                // back and forth (docs/tape.md §8, "Batched reads").
                let _ = self.tape_fetchers.submit(move || {
                    job();
                    Ok(())
                });
            }
        }
    }

    fn finish_prefetch(&self, id: u64, flight: &Arc<InFlight>) {
        self.prefetching.remove_if(&id, |_, f| Arc::ptr_eq(f, flight));
        flight.finish();
    }

    /// Reads a run of adjacent blobs of pack `name` at once and caches the
    /// chunks, each announced to its waiting readers as soon as it is in;
    /// read for file `ino`, paid for by prefetch.
    fn prefetch_run(&self, name: &str, run: &[(u64, BlobEntry, Arc<InFlight>)], ino: Ino) {
        if run.is_empty() {
            return;
        }
        if let Some(t) = &self.trace {
            for (id, e, _) in run {
                t.chunk_at(*id, crate::trace::pack_id(name), e.offset, e.stored_len as u64);
            }
        }
        let ranges: Vec<(u64, u64)> = run.iter().map(|(_, e, _)| (e.offset, e.stored_len as u64)).collect();
        let blobs = match &self.disk {
            Some(d) => d.get_ranges_for(ReadFor { who: Subsystem::Prefetch, group: Some(ino) }, name, &ranges),
            None => self.paid(Subsystem::Prefetch).get_ranges(name, &ranges),
        };
        let Ok(blobs) = blobs else { return };
        for ((id, e, flight), blob) in run.iter().zip(blobs) {
            if let Ok(data) = pack::decode_blob(&self.keys, e, blob, pack::Verify::Sealed) {
                self.cache.insert(*id, Arc::new(data));
            }
            self.finish_prefetch(*id, flight);
        }
    }

    /// `len` bytes at `offset` of pack `name`, read for `r`.
    fn read(&self, r: ReadFor, name: &str, offset: u64, len: u64) -> cairn_backend::Result<Vec<u8>> {
        match &self.disk {
            Some(d) => d.get_range_for(r, name, offset, len),
            None => self.paid(r.who).get_range(name, offset, len),
        }
    }

    /// The packs' store, its requests paid for by `who`.
    pub(crate) fn paid(&self, who: Subsystem) -> &Arc<dyn Backend> {
        self.paid.get(who)
    }

    /// Lets no prefetch run start from now on and waits for those under
    /// way (at close, before the cache and the directory go).
    pub(crate) fn stop_prefetching(&self) {
        self.prefetch_runs.close_and_wait();
    }
}

/// A reader's own fetch of a chunk, registered among the fetches under
/// way; when it ends (the chunk cached, or an error), its waiters go.
struct OwnFlight<'a> {
    store: &'a ChunkStore,
    id: u64,
    flight: Arc<InFlight>,
}

impl Drop for OwnFlight<'_> {
    fn drop(&mut self) {
        self.store.finish_prefetch(self.id, &self.flight);
    }
}

/// A prefetch run handed to a thread. When it goes (run or dropped unrun),
/// every chunk it did not deliver (a failed read or decode) is released
/// to its readers, who fetch it and report the error.
struct PrefetchRun<V: AsRef<ChunkStore>> {
    /// Taken by the drop, which lets go of it before counting the run out.
    vol: Option<Arc<V>>,
    name: Arc<str>,
    run: Vec<(u64, BlobEntry, Arc<InFlight>)>,
}

impl<V: AsRef<ChunkStore>> Drop for PrefetchRun<V> {
    fn drop(&mut self) {
        let Some(vol) = self.vol.take() else { return };
        for (id, _, flight) in &self.run {
            (*vol).as_ref().finish_prefetch(*id, flight);
        }
        // The volume first, then the count: once `close` has seen every run
        // out, none holds the volume any more. If this was the last handle,
        // its drop closes the volume here and must not wait for this run.
        let runs = (*vol).as_ref().prefetch_runs.clone();
        IN_PREFETCH_DROP.with(|f| f.set(true));
        drop(vol);
        IN_PREFETCH_DROP.with(|f| f.set(false));
        runs.leave();
    }
}

thread_local! {
    /// Set while a prefetch run lets go of its volume on this thread.
    static IN_PREFETCH_DROP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Counts the prefetch runs under way, so `close` can wait for them.
#[derive(Default)]
struct RunsInFlight {
    /// (runs under way, closing).
    state: Mutex<(usize, bool)>,
    cv: Condvar,
}

impl RunsInFlight {
    /// Counts `n` runs in, unless the volume is closing.
    fn enter(&self, n: usize) -> bool {
        let mut s = self.state.lock();
        if s.1 {
            return false;
        }
        s.0 += n;
        true
    }

    fn leave(&self) {
        let mut s = self.state.lock();
        s.0 -= 1;
        if s.0 == 0 {
            self.cv.notify_all();
        }
    }

    /// Lets no run start from now on and waits for those under way (but
    /// for the one whose drop is closing the volume on this thread).
    fn close_and_wait(&self) {
        let own = usize::from(IN_PREFETCH_DROP.with(|f| f.get()));
        let mut s = self.state.lock();
        s.1 = true;
        while s.0 > own {
            self.cv.wait(&mut s);
        }
    }
}

/// A chunk being fetched (by a prefetch or a reader): done once it is in
/// the cache or has failed.
#[derive(Default)]
struct InFlight {
    done: Mutex<bool>,
    cv: Condvar,
}

impl InFlight {
    fn finish(&self) {
        *self.done.lock() = true;
        self.cv.notify_all();
    }

    /// Waits until the prefetch is done with the chunk. Bounded: a
    /// prefetch stuck on a slow store leaves the reader to fetch it itself.
    fn wait(&self) {
        let mut d = self.done.lock();
        if !*d {
            self.cv.wait_for(&mut d, PREFETCH_WAIT);
        }
    }
}

/// A restore of an archived pack requested by this mount.
#[derive(Default)]
pub(crate) struct Recall {
    /// When the request was accepted and when the copy is expected, once
    /// sent; the lock is held while sending, so concurrent readers send one.
    sent: Mutex<Option<(std::time::SystemTime, std::time::Duration)>>,
}

impl Recall {
    /// Sends the restore unless this mount sent it already (and it has
    /// not lapsed: a copy that expired is asked for again, by the caller
    /// seeing no restore under way).
    /// Returns when it was sent and how long it should take, if it was
    /// sent now.
    fn send(&self, store: &dyn Backend, name: &str, class: cairn_backend::StorageClass) -> Result<Option<(std::time::SystemTime, std::time::Duration)>> {
        let mut sent = self.sent.lock();
        if let Some((at, eta)) = *sent {
            // Sent, and still within its expected time: the store's answer
            // of "none" is a store that has not caught up yet.
            if at.elapsed().unwrap_or_default() < eta {
                return Ok(None);
            }
        }
        store.restore(name, RECALL_DAYS, cairn_backend::RestoreSpeed::Standard).map_err(|e| Error::from(e).context(format!("pack {name}: requesting its restore")))?;
        let eta = expected_restore(class);
        let now = std::time::SystemTime::now();
        *sent = Some((now, eta));
        tracing::warn!("pack {name}: restore requested at {}, expected ready about {} ({}, standard retrieval)", fmt_time(now), fmt_time(now + eta), class.name());
        Ok(Some((now, eta)))
    }

    /// `restore requested at T, expected ready about T+Δ`, or that it was
    /// asked for elsewhere.
    fn describe(&self) -> String {
        match *self.sent.lock() {
            Some((at, eta)) => format!("restore requested at {}, expected ready about {}", fmt_time(at), fmt_time(at + eta)),
            None => "restore under way (requested by another client)".to_string(),
        }
    }
}

/// What `cairn warmup` did for an archived pack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecallState {
    /// A restore was requested now (with its expected time).
    Requested(String),
    /// One was under way already.
    Ongoing,
}

/// The first wait between two polls of a restore; it doubles up to
/// [`RECALL_POLL_MAX`].
const RECALL_POLL_FIRST: std::time::Duration = std::time::Duration::from_secs(1);
const RECALL_POLL_MAX: std::time::Duration = std::time::Duration::from_secs(300);
/// Days a restored copy stays readable.
const RECALL_DAYS: u32 = 1;

/// The `packs.tier` code of a storage class (docs/format.md "Tiers").
fn tier_code(class: cairn_backend::StorageClass) -> cairn_meta::TierCode {
    use cairn_backend::StorageClass as S;
    match class {
        S::Standard => cairn_meta::TIER_STANDARD,
        S::StandardIa => cairn_meta::TIER_STANDARD_IA,
        S::GlacierIr => cairn_meta::TIER_GLACIER_IR,
        S::Glacier => cairn_meta::TIER_GLACIER,
        S::DeepArchive => cairn_meta::TIER_DEEP_ARCHIVE,
    }
}

/// How long a standard restore of `class` takes, from the AWS sheet
/// (docs/tiers.md §1: GLACIER about 4 h, DEEP_ARCHIVE about 12 h).
fn expected_restore(class: cairn_backend::StorageClass) -> std::time::Duration {
    use cairn_model::tiers::{Class, TierSheet};
    let c = match class {
        cairn_backend::StorageClass::DeepArchive => Class::DeepArchive,
        _ => Class::Glacier,
    };
    std::time::Duration::from_secs_f64(TierSheet::aws().of(c).restore_hours * 3600.0)
}

/// The longest a reader waits for a chunk a prefetch is fetching.
const PREFETCH_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// At most this many bytes in one prefetch read from a local store: with
/// the window of eight of the largest chunks, about four runs are in
/// flight on the fetch threads (the store reads each with one direct
/// request, and the page cache no longer reads ahead of them).
const PREFETCH_RUN_DISK: u64 = 8 << 20;
/// At most this many bytes in one prefetch read from a tape.
const PREFETCH_RUN_TAPE: u64 = 16 << 20;
/// At most this many in one ranged GET from a bucket: a whole pack (16
/// MiB by default; up to 64 MiB if chosen), since a request costs more
/// than its bytes there. Of 64 MiB packs, 16 MiB GETs read back from moto
/// at 154-164 MiB/s and whole-pack ones at 182-183 (docs/profile.md,
/// fourth round).
const PREFETCH_RUN_REMOTE: u64 = 64 << 20;
/// Prefetch reads from a bucket or a local store in flight at once.
const PREFETCH_THREADS: usize = 4;
/// Prefetch reads from a tape in flight at once: as many as the FUSE
/// workers a tape mount has by default, so every reader's run can join
/// the store's batch.
const TAPE_FETCH_THREADS: usize = 32;

/// A time as `YYYY-MM-DD HH:MM:SS UTC`.
fn fmt_time(t: std::time::SystemTime) -> String {
    crate::types::format_utc(t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs())
}
