//! A persistent local cache and upload outbox in front of a remote backend
//! (docs/cloud.md §5): [`CachedBackend`].
//!
//! Contract:
//! - Only objects under `packs/` are cached or queued; every other name
//!   (`config`, `meta/...`, `lease`) goes straight to the remote.
//! - `put` of a pack with [`Durability::Local`] writes `DIR/outbox/<name>`
//!   (`/` escaped as `~`) through a temporary file, fsyncs it and the
//!   directory, and returns: the pack is durable locally. Uploader threads
//!   PUT outbox objects oldest first, retrying forever (backoff 100 ms
//!   doubling to 5 s, full jitter), then move them into the clean cache. A
//!   `put` that would take the outbox past 3/4 of the capacity waits for
//!   uploads to make room (one object is always admitted into an empty
//!   outbox): an outage blocks writers, it never fails them.
//! - `put` of a pack with [`Durability::Remote`], and every `put_if_absent`
//!   of a pack, goes to the remote synchronously (its error is returned),
//!   then keeps a clean copy.
//! - Reads of a pack are served from the outbox file, a whole-object copy
//!   (`DIR/data/<name>@all`) or cached blocks of `block` bytes
//!   (`DIR/data/<name>@<index>`). Missing blocks are fetched with one ranged
//!   GET per contiguous run; two readers missing the same block cause one
//!   GET. Sizes come from the outbox, memory, or one `size` per object.
//! - Clean bytes stay within `capacity` minus the dirty bytes; victims come
//!   from the [`CachePolicy`] and are never outbox objects. A read tells
//!   the policy which file it is for when its thread says so
//!   ([`super::policy::reading_for`]).
//! - `delete` of a pack waits for its upload in progress, drops it from the
//!   outbox and the cache, then deletes it on the remote. `list` is the
//!   remote's listing plus the outbox.
//! - Bytes are stored exactly as the remote holds them (sealed packs stay
//!   sealed): the cache never holds plaintext the bucket does not.
//! - Reopen: the outbox is queued again, oldest first by mtime; clean files
//!   are re-admitted least recently modified first (a hit refreshes a file's
//!   mtime at most once a minute), but only after a clean shutdown with the
//!   same block size (`DIR/clean`, written when the cache is dropped):
//!   clean files are not fsynced when written, so after a crash they may be
//!   empty or short and are discarded. `.tmp` leftovers are deleted.
//! - No lock is held across file I/O or remote requests; a name whose files
//!   are being replaced (put, delete, upload) or whose blocks are being
//!   fetched or deleted is marked in the index, and others wait for it.

use super::policy::{CachePolicy, Lru};
use crate::trace::{pack_id, CacheEvent, Event, TraceWriter};
use cairn_backend::{validate_name, Backend, Capabilities, Error, ErrorKind, ObjectInfo, Result};
use parking_lot::{Condvar, Mutex, MutexGuard};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

/// The default fetch granularity (why this size: its definition).
pub use cairn_model::cache::DEFAULT_BLOCK;

/// The names this cache handles; everything else passes through.
const PACKS: &str = "packs/";
/// The slot of a whole-object entry (block slots are block indices).
const ALL: u64 = u64::MAX;
/// A hit refreshes its file's mtime at most this often.
const TOUCH_EVERY: Duration = Duration::from_secs(60);
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
const PROGRESS_EVERY: Duration = Duration::from_millis(200);
/// Written at a clean shutdown: the data files are complete and fsynced.
const CLEAN_MARKER: &str = "clean";
/// How many times a read may find a local file changed under it before it
/// gives up (each time it looks the object up again).
const MAX_VANISHED: u32 = 100;

/// When a `put` of a pack returns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// Once it is fsynced in the local outbox; uploaded in the background.
    #[default]
    Local,
    /// Once the remote has it.
    Remote,
}

/// Where and how big the cache is.
#[derive(Clone, Debug)]
pub struct DiskCacheOptions {
    /// The cache's directory, e.g. `VOLUME_DIR/cache`; created if missing.
    pub dir: PathBuf,
    /// Bound on clean plus dirty bytes.
    pub capacity: u64,
    /// Fetch granularity in bytes.
    pub block: u64,
    /// When a `put` of a pack returns.
    pub durability: Durability,
    /// Upload threads (at least one is started).
    pub uploaders: usize,
}

impl DiskCacheOptions {
    /// Options with the defaults: 4 MiB blocks, local durability, two
    /// uploaders.
    pub fn new(dir: impl Into<PathBuf>, capacity: u64) -> Self {
        DiskCacheOptions { dir: dir.into(), capacity, block: DEFAULT_BLOCK, durability: Durability::Local, uploaders: 2 }
    }
}

/// What the cache has done, and holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheStats {
    /// The eviction policy's name (`lru`, `kd`; empty from a mount older
    /// than the field).
    #[serde(default)]
    pub policy: String,
    /// Pack reads served entirely locally.
    pub hits: u64,
    /// Pack reads that needed the remote.
    pub misses: u64,
    /// Bytes fetched from the remote by pack reads.
    pub bytes_fetched: u64,
    /// Ranged GETs sent to the remote.
    pub remote_gets: u64,
    /// Clean entries evicted.
    pub evictions: u64,
    /// Clean bytes held (file sizes).
    pub clean_bytes: u64,
    /// Bytes in the outbox (and being written to it).
    pub dirty_bytes: u64,
    /// Objects in the outbox.
    pub dirty_objects: u64,
    /// Outbox objects uploaded.
    pub uploads: u64,
    /// Failed upload attempts (each retried).
    pub upload_retries: u64,
}

#[derive(Default)]
struct Counters {
    /// The uploaders' last failure, until an upload succeeds (`cairn status`).
    upload: crate::health::Slot,
    hits: AtomicU64,
    misses: AtomicU64,
    bytes_fetched: AtomicU64,
    remote_gets: AtomicU64,
    evictions: AtomicU64,
    uploads: AtomicU64,
    upload_retries: AtomicU64,
}

/// One clean file: a block or a whole object.
struct Entry {
    name: String,
    slot: u64,
    bytes: u64,
    /// When its mtime was last set (approximately).
    touched: Instant,
}

/// What the index knows of one pack.
struct Obj {
    /// Changes whenever the object's bytes may have changed (put, delete):
    /// a read that collected pieces of an older version starts over.
    version: u64,
    /// The remote object's size, once learned.
    size: Option<u64>,
    /// In the outbox: (queue position, bytes).
    dirty: Option<(u64, u64)>,
    /// Who the bill charges for the outbox object's upload, when not the
    /// writes (the cleaner's packs are gc's).
    payer: Option<cairn_backend::Subsystem>,
    /// Policy key of the whole-object entry.
    whole: Option<u64>,
    /// Block index → policy key.
    blocks: BTreeMap<u64, u64>,
    /// Slots whose files are being created (a fetch) or deleted (an
    /// eviction): nobody else touches them until released.
    claimed: BTreeSet<u64>,
    /// A put, delete or upload is replacing the object's files: others wait.
    busy: bool,
}

struct State {
    objects: HashMap<String, Obj>,
    /// Policy key → clean entry.
    entries: HashMap<u64, Entry>,
    policy: Box<dyn CachePolicy>,
    /// Queue position → name; the first is the oldest.
    outbox: BTreeMap<u64, String>,
    next_key: u64,
    next_seq: u64,
    next_version: u64,
    clean_bytes: u64,
    /// Bytes of the objects in the outbox.
    dirty_bytes: u64,
    /// Bytes of puts admitted and being written to the outbox.
    reserved: u64,
    shutdown: bool,
    /// Uploader threads still running, and how many of them are inside a
    /// remote call (which shutdown cannot interrupt and does not wait for).
    alive: usize,
    in_remote: usize,
}

impl State {
    fn bump(&mut self) -> u64 {
        self.next_version += 1;
        self.next_version
    }

    fn obj(&mut self, name: &str) -> &mut Obj {
        if !self.objects.contains_key(name) {
            let version = self.bump();
            let o = Obj { version, size: None, dirty: None, payer: None, whole: None, blocks: BTreeMap::new(), claimed: BTreeSet::new(), busy: false };
            self.objects.insert(name.to_string(), o);
        }
        self.objects.get_mut(name).expect("just inserted")
    }

    /// Nobody is replacing the object's files or fetching or deleting any
    /// of its blocks.
    fn free(&self, name: &str) -> bool {
        self.objects.get(name).is_none_or(|o| !o.busy && o.claimed.is_empty())
    }

    fn is_dirty(&self, name: &str) -> bool {
        self.objects.get(name).is_some_and(|o| o.dirty.is_some())
    }

    /// Indexes a clean file; its policy key.
    fn add_entry(&mut self, name: &str, slot: u64, bytes: u64, touched: Instant) -> u64 {
        let key = self.next_key;
        self.next_key += 1;
        let o = self.obj(name);
        let old = if slot == ALL { o.whole.replace(key) } else { o.blocks.insert(slot, key) };
        if let Some(old) = old {
            self.policy.removed(old);
            if let Some(e) = self.entries.remove(&old) {
                self.clean_bytes -= e.bytes;
            }
        }
        self.entries.insert(key, Entry { name: name.to_string(), slot, bytes, touched });
        self.policy.admitted(key, bytes);
        self.clean_bytes += bytes;
        key
    }

    /// Drops entry `key` from the index and the policy (the caller deletes
    /// its file).
    fn remove_entry(&mut self, key: u64) -> Option<Entry> {
        self.policy.removed(key);
        let e = self.entries.remove(&key)?;
        self.clean_bytes -= e.bytes;
        if let Some(o) = self.objects.get_mut(&e.name) {
            if e.slot == ALL {
                if o.whole == Some(key) {
                    o.whole = None;
                }
            } else if o.blocks.get(&e.slot) == Some(&key) {
                o.blocks.remove(&e.slot);
            }
        }
        Some(e)
    }

    /// Drops every clean entry of `name`; returns their slots.
    fn detach_clean(&mut self, name: &str) -> Vec<u64> {
        let Some(o) = self.objects.get(name) else { return Vec::new() };
        let keys: Vec<u64> = o.whole.iter().chain(o.blocks.values()).copied().collect();
        keys.into_iter().filter_map(|k| self.remove_entry(k)).map(|e| e.slot).collect()
    }

    /// Drops entry `key` and claims its slot until its file is deleted, so
    /// that nobody creates the file anew before the deletion.
    fn remove_claimed(&mut self, key: u64) -> Option<(String, u64)> {
        let e = self.remove_entry(key)?;
        self.obj(&e.name).claimed.insert(e.slot);
        Some((e.name, e.slot))
    }

    /// Evicts the policy's victims while clean bytes exceed what the dirty
    /// ones leave of the capacity.
    fn evict(&mut self, capacity: u64, evictions: &AtomicU64) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        while self.clean_bytes > capacity.saturating_sub(self.dirty_bytes + self.reserved) {
            let Some(k) = self.policy.victim() else { break };
            // A key the policy tracks but the index does not is dropped
            // (remove_entry tells the policy either way).
            if let Some(v) = self.remove_claimed(k) {
                evictions.fetch_add(1, Ordering::Relaxed);
                out.push(v);
            }
        }
        out
    }

    fn drop_dirty(&mut self, name: &str) -> Option<u64> {
        let o = self.objects.get_mut(name)?;
        o.payer = None;
        let (seq, bytes) = o.dirty.take()?;
        self.outbox.remove(&seq);
        self.dirty_bytes -= bytes;
        Some(bytes)
    }
}

struct Inner {
    remote: Arc<dyn Backend>,
    opts: DiskCacheOptions,
    outbox_dir: PathBuf,
    data_dir: PathBuf,
    state: Mutex<State>,
    /// Anything others may wait for changed: a name no longer busy, a claim
    /// released, the outbox shrank, an uploader stopped.
    changed: Condvar,
    /// For uploaders: the outbox grew, a name became free, or shutdown.
    work: Condvar,
    n: Counters,
    tmp_seq: AtomicU64,
    /// Where this cache's events are recorded (docs/trace.md, CACHE).
    trace: OnceLock<Arc<TraceWriter>>,
}

/// A persistent cache and upload outbox in front of a remote backend (see
/// the module docs). Dropping it stops the uploaders and records a clean
/// shutdown.
pub struct CachedBackend {
    inner: Arc<Inner>,
}

fn escape(name: &str) -> String {
    name.replace('/', "~")
}

fn is_pack(name: &str) -> bool {
    name.starts_with(PACKS)
}

/// A pack name from a cache file name (`~` back to `/`), if it is one.
fn unescape(file: &str) -> Option<String> {
    let name = file.replace('~', "/");
    (is_pack(&name) && validate_name(&name).is_ok()).then_some(name)
}

/// Temporary files carry an `@`, which no object name does (so a pack
/// named `x.tmp` is never mistaken for a leftover).
fn is_leftover(file: &str) -> bool {
    file.contains('@') && file.ends_with(".tmp")
}

/// `(name, slot)` of a data file `<escaped name>@<index>` or `@all`.
fn parse_data_file(file: &str) -> Option<(String, u64)> {
    let (esc, slot) = file.rsplit_once('@')?;
    let slot = match slot {
        "all" => ALL,
        s if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => s.parse().ok().filter(|i| *i != ALL)?,
        _ => return None,
    };
    Some((unescape(esc)?, slot))
}

fn slot_name(slot: u64) -> String {
    if slot == ALL {
        "all".to_string()
    } else {
        slot.to_string()
    }
}

fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Reads `len` bytes at `off` of a file that must be `expect` bytes long.
/// A missing, shorter or longer file is `NotFound` / `UnexpectedEof`.
fn read_at(path: &Path, off: u64, len: u64, expect: u64) -> io::Result<Vec<u8>> {
    let f = File::open(path)?;
    if f.metadata()?.len() != expect {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, format!("{} is not {expect} bytes long", path.display())));
    }
    let mut buf = vec![0u8; len as usize];
    f.read_exact_at(&mut buf, off)?;
    Ok(buf)
}

/// The modification time of a file as an `Instant` (for the touch rule).
fn instant_of(mtime: SystemTime) -> Instant {
    let age = SystemTime::now().duration_since(mtime).unwrap_or_default();
    Instant::now().checked_sub(age).unwrap_or_else(Instant::now)
}

/// Bytes of `[off, end)` that fall in block `idx`, as a range of the block.
fn piece_of_block(idx: u64, block: u64, off: u64, end: u64) -> (u64, u64) {
    let start = idx * block;
    (off.max(start) - start, end.min(start + block) - start)
}

/// How a read will be served this round.
enum Plan {
    /// One file holds the whole object: the outbox file (`key` None) or a
    /// clean whole copy.
    Whole { path: PathBuf, key: Option<u64> },
    /// Blocks: read these cached ones, fetch the claimed ones.
    Blocks { reads: Vec<(u64, u64)>, claims: Vec<u64> },
    /// Everything was collected: assemble.
    Done,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    fn outbox_path(&self, name: &str) -> PathBuf {
        self.outbox_dir.join(escape(name))
    }

    fn data_path(&self, name: &str, slot: u64) -> PathBuf {
        self.data_dir.join(format!("{}@{}", escape(name), slot_name(slot)))
    }

    fn dirty_bound(&self) -> u64 {
        self.opts.capacity - self.opts.capacity / 4
    }

    /// Records a change of a whole pack (the state lock held, so events
    /// are in the order of the changes).
    fn trace(&self, event: CacheEvent, name: &str, size: u64) {
        if let Some(t) = self.trace.get() {
            t.record(Event::Cache { event, pack: pack_id(name), offset: 0, len: size, group: 0 });
        }
    }

    /// Records a pack read, with the file it was for.
    fn trace_read(&self, event: CacheEvent, name: &str, size: u64, off: u64, len: u64) {
        if let Some(t) = self.trace.get() {
            t.cache_read(event, pack_id(name), size, off, len, super::policy::current_group().unwrap_or(0));
        }
    }

    fn tmp_path(&self, path: &Path) -> PathBuf {
        let file = path.file_name().expect("cache paths have a file name").to_string_lossy();
        path.with_file_name(format!("{file}@{}.{}.tmp", std::process::id(), self.tmp_seq.fetch_add(1, Ordering::Relaxed)))
    }

    /// Writes `data` to `path` through a temporary file renamed into place;
    /// `durable`: the file and its directory are fsynced. The error says
    /// whether the rename had happened (the new file may be in place).
    fn write_atomic(&self, path: &Path, data: &[u8], durable: bool) -> std::result::Result<(), (io::Error, bool)> {
        let tmp = self.tmp_path(path);
        let written = (|| {
            let mut f = fs::OpenOptions::new().write(true).create_new(true).mode(crate::fsutil::PRIVATE_FILE).open(&tmp)?;
            f.write_all(data)?;
            if durable {
                f.sync_all()?;
            } else {
                start_writeback(&f);
            }
            fs::rename(&tmp, path)
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err((e, false));
        }
        if durable {
            fsync_dir(path.parent().expect("cache paths have a parent")).map_err(|e| (e, true))?;
        }
        Ok(())
    }

    fn wake(&self) {
        self.changed.notify_all();
        self.work.notify_all();
    }

    /// Deletes the files of claimed slots, then releases the claims.
    fn unlink_claimed(&self, victims: Vec<(String, u64)>) {
        if victims.is_empty() {
            return;
        }
        for (name, slot) in &victims {
            let p = self.data_path(name, *slot);
            if let Err(e) = fs::remove_file(&p) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!("removing cache file {}: {e}", p.display());
                }
            }
        }
        let mut st = self.lock();
        for (name, slot) in &victims {
            if let Some(o) = st.objects.get_mut(name) {
                o.claimed.remove(slot);
            }
        }
        drop(st);
        self.changed.notify_all();
    }

    /// Deletes the clean files of `slots` of `name` (the caller holds the
    /// name busy, so nobody recreates them meanwhile).
    fn unlink_slots(&self, name: &str, slots: &[u64]) {
        for s in slots {
            let p = self.data_path(name, *s);
            if let Err(e) = fs::remove_file(&p) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!("removing cache file {}: {e}", p.display());
                }
            }
        }
    }

    /// Drops a clean entry whose file turned out missing or damaged, if it
    /// is still indexed (it is refetched on the next look).
    fn discard(&self, key: u64) {
        let v = self.lock().remove_claimed(key);
        self.unlink_claimed(v.into_iter().collect());
    }

    /// Waits until nobody works on `name`'s files, then marks it busy.
    fn acquire<'a>(&'a self, mut st: MutexGuard<'a, State>, name: &str) -> MutexGuard<'a, State> {
        while !st.free(name) {
            self.changed.wait(&mut st);
        }
        st.obj(name).busy = true;
        st
    }

    fn release(&self, mut st: MutexGuard<'_, State>, name: &str) {
        if let Some(o) = st.objects.get_mut(name) {
            o.busy = false;
        }
        drop(st);
        self.wake();
    }

    // ---- sizes ----

    fn known_size(st: &State, name: &str) -> Option<u64> {
        let o = st.objects.get(name)?;
        o.dirty.map(|d| d.1).or(o.size)
    }

    fn size_of(&self, name: &str) -> Result<u64> {
        if let Some(s) = Self::known_size(&self.lock(), name) {
            return Ok(s);
        }
        let s = self.remote.size(name)?;
        let mut st = self.lock();
        // Not while a put or delete is changing the object: what the remote
        // said may already be out of date.
        if st.free(name) {
            let o = st.obj(name);
            if o.dirty.is_none() && o.size.is_none() {
                o.size = Some(s);
            }
        }
        Ok(s)
    }

    // ---- reads ----

    fn read_pack(&self, name: &str, off: u64, len: u64) -> Result<Vec<u8>> {
        let b = self.opts.block;
        // Pieces of the request collected so far, by block, and the object
        // version they belong to.
        let mut pieces: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        let mut version = 0;
        let mut missed = false;
        let mut vanished = 0u32;
        loop {
            let size = self.size_of(name)?;
            let end = off.checked_add(len).filter(|e| *e <= size).ok_or_else(|| {
                Error::new(ErrorKind::OutOfRange, format!("object {name}: range {off}+{len} past its end ({size} bytes)")).with_object(name)
            })?;
            if len == 0 {
                return Ok(Vec::new());
            }
            let (first, last) = (off / b, (end - 1) / b);
            let mut touch = Vec::new();
            let plan = {
                let mut st = self.lock();
                if Self::known_size(&st, name) != Some(size) {
                    // Changed or forgotten since, or not remembered because
                    // a put or delete is under way: look again, after it.
                    if !st.free(name) {
                        self.changed.wait(&mut st);
                    }
                    continue;
                }
                let cur = st.objects[name].version;
                if cur != version {
                    pieces.clear();
                    version = cur;
                }
                match self.plan(&mut st, name, first..=last, &pieces, &mut touch) {
                    Some(p) => p,
                    None => {
                        // Another thread is fetching (or deleting) what we
                        // need: wait for it rather than GET it twice. The
                        // fetch is that thread's miss; this read is served
                        // from the cache (a hit, as the simulator replaying
                        // the trace counts it), unless it has to fetch
                        // something itself after all.
                        self.changed.wait(&mut st);
                        continue;
                    }
                }
            };
            for slot in touch {
                // Approximate recency that survives a restart (see open).
                let _ = File::options().write(true).open(self.data_path(name, slot)).and_then(|f| f.set_modified(SystemTime::now()));
            }
            match plan {
                Plan::Done => {
                    let c = if missed { &self.n.misses } else { &self.n.hits };
                    c.fetch_add(1, Ordering::Relaxed);
                    self.trace_read(if missed { CacheEvent::Miss } else { CacheEvent::Hit }, name, size, off, len);
                    let mut out = Vec::with_capacity(len as usize);
                    for p in pieces.values() {
                        out.extend_from_slice(p);
                    }
                    return Ok(out);
                }
                Plan::Whole { path, key } => match read_at(&path, off, len, size) {
                    Ok(data) => {
                        let c = if missed { &self.n.misses } else { &self.n.hits };
                        c.fetch_add(1, Ordering::Relaxed);
                        let event = match key {
                            _ if missed => CacheEvent::Miss,
                            None => CacheEvent::Outbox,
                            Some(_) => CacheEvent::Hit,
                        };
                        self.trace_read(event, name, size, off, len);
                        return Ok(data);
                    }
                    Err(e) => {
                        let gone = matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::UnexpectedEof);
                        match key {
                            // The outbox file was moved into the cache, or
                            // replaced by a put: look again.
                            None if gone => {}
                            None => return Err(Error::from_io(&format!("reading {}", path.display()), e).with_object(name)),
                            Some(k) => {
                                if !gone {
                                    tracing::warn!("reading cache file {}: {e}; fetching again", path.display());
                                }
                                self.discard(k);
                            }
                        }
                        vanished += 1;
                    }
                },
                Plan::Blocks { reads, claims } => {
                    for (idx, k) in reads {
                        let (lo, hi) = piece_of_block(idx, b, off, end);
                        let block_len = b.min(size - idx * b);
                        match read_at(&self.data_path(name, idx), lo, hi - lo, block_len) {
                            Ok(p) => {
                                pieces.insert(idx, p);
                            }
                            Err(e) => {
                                // Evicted meanwhile (then it is no longer
                                // indexed) or damaged: fetch it again.
                                if !matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::UnexpectedEof) {
                                    tracing::warn!("reading cache file {}: {e}; fetching again", self.data_path(name, idx).display());
                                }
                                self.discard(k);
                                vanished += 1;
                            }
                        }
                    }
                    if !claims.is_empty() {
                        missed = true;
                        self.fetch(name, size, &claims, off, end, &mut pieces)?;
                    }
                }
            }
            if vanished > MAX_VANISHED {
                return Err(Error::new(ErrorKind::Transient, format!("object {name}: its cached files kept changing while being read")).with_object(name));
            }
        }
    }

    /// Decides how to serve blocks `want` of `name` (known to the index),
    /// claiming the missing blocks nobody else is working on; None: wait for
    /// the others. A cached entry it will read counts as accessed; those due
    /// a touch of their mtime are added to `touch`.
    fn plan(&self, st: &mut State, name: &str, want: std::ops::RangeInclusive<u64>, pieces: &BTreeMap<u64, Vec<u8>>, touch: &mut Vec<u64>) -> Option<Plan> {
        let State { objects, entries, policy, .. } = st;
        let o = objects.get_mut(name).expect("the caller found it");
        let group = super::policy::current_group();
        let mut hit = |key: u64, slot: u64| {
            policy.accessed(key);
            if let Some(g) = group {
                policy.grouped(key, g);
            }
            if let Some(e) = entries.get_mut(&key) {
                if e.touched.elapsed() >= TOUCH_EVERY {
                    e.touched = Instant::now();
                    touch.push(slot);
                }
            }
        };
        if o.dirty.is_some() {
            return Some(Plan::Whole { path: self.outbox_path(name), key: None });
        }
        if let Some(k) = o.whole {
            hit(k, ALL);
            return Some(Plan::Whole { path: self.data_path(name, ALL), key: Some(k) });
        }
        let (mut reads, mut claims, mut others) = (Vec::new(), Vec::new(), false);
        for idx in want {
            if pieces.contains_key(&idx) {
                continue;
            }
            if let Some(&k) = o.blocks.get(&idx) {
                hit(k, idx);
                reads.push((idx, k));
            } else if o.busy || o.claimed.contains(&idx) {
                others = true;
            } else {
                claims.push(idx);
            }
        }
        if reads.is_empty() && claims.is_empty() {
            return if others { None } else { Some(Plan::Done) };
        }
        o.claimed.extend(claims.iter().copied());
        Some(Plan::Blocks { reads, claims })
    }

    /// Fetches the claimed blocks, one ranged GET per contiguous run, keeps
    /// the request's pieces of them, caches them, and releases the claims.
    fn fetch(&self, name: &str, size: u64, claims: &[u64], off: u64, end: u64, pieces: &mut BTreeMap<u64, Vec<u8>>) -> Result<()> {
        let b = self.opts.block;
        let mut written = Vec::new();
        let mut result = Ok(());
        let mut i = 0;
        while i < claims.len() {
            let mut j = i;
            while j + 1 < claims.len() && claims[j + 1] == claims[j] + 1 {
                j += 1;
            }
            let (start, stop) = (claims[i] * b, ((claims[j] + 1) * b).min(size));
            self.n.remote_gets.fetch_add(1, Ordering::Relaxed);
            let data = match self.remote.get_range(name, start, stop - start) {
                Ok(d) if d.len() as u64 == stop - start => d,
                Ok(d) => {
                    result = Err(Error::new(ErrorKind::Corrupt, format!("object {name}: asked for {} bytes at {start}, got {}", stop - start, d.len())).with_object(name));
                    break;
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            self.n.bytes_fetched.fetch_add(data.len() as u64, Ordering::Relaxed);
            for &idx in &claims[i..=j] {
                let (bs, be) = (idx * b - start, ((idx + 1) * b).min(size) - start);
                let block = &data[bs as usize..be as usize];
                let (lo, hi) = piece_of_block(idx, b, off, end);
                pieces.insert(idx, block[lo as usize..hi as usize].to_vec());
                // No fsync: clean data can be fetched again (see open).
                match self.write_atomic(&self.data_path(name, idx), block, false) {
                    Ok(()) => written.push((idx, block.len() as u64)),
                    Err((e, _)) => tracing::warn!("caching block {idx} of {name}: {e}"),
                }
            }
            i = j + 1;
        }
        let group = super::policy::current_group();
        let mut st = self.lock();
        let now = Instant::now();
        for (idx, bytes) in written {
            let key = st.add_entry(name, idx, bytes, now);
            if let Some(g) = group {
                st.policy.grouped(key, g);
            }
        }
        if let Some(o) = st.objects.get_mut(name) {
            for c in claims {
                o.claimed.remove(c);
            }
            // The remembered size was stale: the object is gone.
            if matches!(&result, Err(e) if e.kind() == ErrorKind::NotFound) && o.dirty.is_none() {
                o.size = None;
            }
        }
        let victims = st.evict(self.opts.capacity, &self.n.evictions);
        drop(st);
        self.changed.notify_all();
        self.unlink_claimed(victims);
        result
    }

    // ---- writes ----

    fn put_local(&self, name: &str, data: &[u8]) -> Result<()> {
        let size = data.len() as u64;
        let bound = self.dirty_bound();
        let mut st = self.lock();
        loop {
            if st.free(name) {
                // A new version of a queued object replaces it.
                let old = st.objects.get(name).and_then(|o| o.dirty).map_or(0, |d| d.1);
                let others = st.dirty_bytes + st.reserved - old;
                if others == 0 || others + size <= bound {
                    break;
                }
            }
            // Blocked by an outage until uploads make room.
            self.changed.wait(&mut st);
        }
        st.reserved += size;
        st.obj(name).busy = true;
        let stale = st.detach_clean(name);
        drop(st);
        self.unlink_slots(name, &stale);
        let path = self.outbox_path(name);
        let r = self.write_atomic(&path, data, true);
        let mut st = self.lock();
        st.reserved -= size;
        if matches!(r, Ok(()) | Err((_, true))) {
            st.drop_dirty(name);
            let seq = st.next_seq;
            st.next_seq += 1;
            let version = st.bump();
            let o = st.obj(name);
            o.dirty = Some((seq, size));
            o.payer = Some(cairn_backend::meter::current()).filter(|w| !matches!(w, cairn_backend::Subsystem::Other | cairn_backend::Subsystem::Write));
            o.size = Some(size);
            o.version = version;
            st.outbox.insert(seq, name.to_string());
            st.dirty_bytes += size;
            self.trace(CacheEvent::Queued, name, size);
        }
        let victims = st.evict(self.opts.capacity, &self.n.evictions);
        self.release(st, name);
        self.unlink_claimed(victims);
        r.map_err(|(e, _)| Error::from_io(&format!("writing {} to the outbox", path.display()), e).with_object(name))
    }

    /// A put (or create) that goes to the remote before it returns, then
    /// keeps a clean whole copy.
    fn put_remote(&self, name: &str, data: &[u8], only_if_absent: bool) -> Result<()> {
        let st = self.acquire(self.lock(), name);
        if only_if_absent && st.is_dirty(name) {
            self.release(st, name);
            return Err(Error::new(ErrorKind::AlreadyExists, format!("object {name} already exists (not yet uploaded)")).with_object(name));
        }
        drop(st);
        let r = if only_if_absent { self.remote.put_if_absent(name, data) } else { self.remote.put(name, data) };
        if matches!(&r, Err(e) if e.kind() == ErrorKind::AlreadyExists) {
            self.release(self.lock(), name);
            return r;
        }
        // Done, or maybe done (a lost reply): what is cached is out of date.
        let mut st = self.lock();
        let stale = st.detach_clean(name);
        let had_dirty = r.is_ok() && st.drop_dirty(name).is_some();
        let version = st.bump();
        let o = st.obj(name);
        o.version = version;
        o.size = if r.is_ok() { Some(data.len() as u64) } else { None };
        drop(st);
        self.unlink_slots(name, &stale);
        if had_dirty {
            // An older version queued by a local put must not upload over
            // this one.
            let p = self.outbox_path(name);
            if let Err(e) = fs::remove_file(&p).and_then(|_| fsync_dir(&self.outbox_dir)) {
                tracing::warn!("removing {}: {e}", p.display());
            }
        }
        let cached = r.is_ok() && {
            match self.write_atomic(&self.data_path(name, ALL), data, false) {
                Ok(()) => true,
                Err((e, _)) => {
                    tracing::warn!("caching {name}: {e}");
                    false
                }
            }
        };
        let mut st = self.lock();
        if cached {
            st.add_entry(name, ALL, data.len() as u64, Instant::now());
            self.trace(CacheEvent::Kept, name, data.len() as u64);
        } else if r.is_ok() {
            self.trace(CacheEvent::Dropped, name, 0);
        }
        let victims = st.evict(self.opts.capacity, &self.n.evictions);
        self.release(st, name);
        self.unlink_claimed(victims);
        r
    }

    fn delete_pack(&self, name: &str) -> Result<()> {
        // Waits for an upload in progress: deleting under it could let the
        // upload land after the remote delete.
        let mut st = self.acquire(self.lock(), name);
        let stale = st.detach_clean(name);
        let had_dirty = st.drop_dirty(name).is_some();
        self.trace(CacheEvent::Dropped, name, 0);
        drop(st);
        self.wake(); // the outbox may have shrunk
        self.unlink_slots(name, &stale);
        if had_dirty {
            let p = self.outbox_path(name);
            if let Err(e) = fs::remove_file(&p).and_then(|_| fsync_dir(&self.outbox_dir)) {
                tracing::warn!("removing {}: {e}", p.display());
            }
        }
        let r = self.remote.delete(name);
        let mut st = self.lock();
        st.objects.remove(name);
        drop(st);
        self.wake();
        r
    }

    fn outbox_matching(st: &State, prefix: &str) -> Vec<ObjectInfo> {
        let queued = st.outbox.values().filter(|n| n.starts_with(prefix));
        queued.map(|n| ObjectInfo { name: n.clone(), size: st.objects[n].dirty.map_or(0, |d| d.1) }).collect()
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        // The outbox is looked at before the remote too: an object uploaded
        // while the remote lists is in one of the two looks.
        let before = Self::outbox_matching(&self.lock(), prefix);
        let mut out = self.remote.list(prefix)?;
        let st = self.lock();
        let mut at: HashMap<String, usize> = out.iter().enumerate().map(|(i, o)| (o.name.clone(), i)).collect();
        // Deleted meanwhile: no longer known to the index.
        let before = before.into_iter().filter(|o| st.objects.contains_key(&o.name));
        for (o, newer) in before.map(|o| (o, false)).chain(Self::outbox_matching(&st, prefix).into_iter().map(|o| (o, true))) {
            match at.get(&o.name) {
                // What the outbox holds now is the newest version.
                Some(&i) if newer => out[i].size = o.size,
                Some(_) => {}
                None => {
                    at.insert(o.name.clone(), out.len());
                    out.push(o);
                }
            }
        }
        Ok(out)
    }

    // ---- uploads ----

    fn uploader(self: Arc<Self>) {
        /// Counts the thread out however it ends (a panic too), so that
        /// shutdown never waits for a thread that is gone.
        struct Running<'a> {
            inner: &'a Inner,
            in_remote: bool,
        }
        impl Drop for Running<'_> {
            fn drop(&mut self) {
                let mut st = self.inner.lock();
                st.alive -= 1;
                if self.in_remote {
                    st.in_remote -= 1;
                }
                drop(st);
                self.inner.changed.notify_all();
            }
        }
        let mut me = Running { inner: &self, in_remote: false };
        // The bill: uploads are the writes' requests.
        let _who = cairn_backend::meter::tag(cairn_backend::Subsystem::Write);
        let mut backoff = FIRST_BACKOFF;
        loop {
            // The oldest queued object nobody is working on.
            let mut st = self.lock();
            let (seq, name) = loop {
                if st.shutdown {
                    drop(st);
                    return;
                }
                let next = st.outbox.iter().find(|(_, n)| st.free(n)).map(|(s, n)| (*s, n.clone()));
                if let Some(n) = next {
                    break n;
                }
                self.work.wait(&mut st);
            };
            st.obj(&name).busy = true;
            st.in_remote += 1;
            me.in_remote = true;
            let payer = st.objects.get(&name).and_then(|o| o.payer);
            drop(st);
            let path = self.outbox_path(&name);
            let r = match fs::read(&path) {
                Ok(data) => {
                    let _who = payer.map(cairn_backend::meter::tag);
                    self.remote.put(&name, &data).map(|()| data.len() as u64)
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    // Someone removed the file behind our back: nothing is
                    // left to upload.
                    tracing::warn!("outbox object {name} vanished from {}; dropping it", path.display());
                    let mut st = self.lock();
                    st.in_remote -= 1;
                    me.in_remote = false;
                    if st.objects.get(&name).and_then(|o| o.dirty).is_some_and(|d| d.0 == seq) {
                        st.drop_dirty(&name);
                        self.trace(CacheEvent::Dropped, &name, 0);
                    }
                    self.release(st, &name);
                    continue;
                }
                Err(e) => Err(Error::from_io(&format!("reading {}", path.display()), e).with_object(&name)),
            };
            let mut st = self.lock();
            st.in_remote -= 1;
            me.in_remote = false;
            if st.shutdown {
                // Whether or not it landed, the object stays in the outbox
                // and is uploaded (again) at the next open.
                self.release(st, &name);
                continue;
            }
            match r {
                Ok(bytes) => {
                    drop(st);
                    backoff = FIRST_BACKOFF;
                    self.n.upload.ok();
                    self.finish_upload(&name, seq, bytes);
                }
                Err(e) => {
                    self.n.upload_retries.fetch_add(1, Ordering::Relaxed);
                    self.n.upload.fail("upload", &e);
                    tracing::warn!("uploading {name} failed, retrying: {e}");
                    // Free the object while we wait, so that a delete or a
                    // new version need not wait for the outage to end.
                    if let Some(o) = st.objects.get_mut(&name) {
                        o.busy = false;
                    }
                    self.changed.notify_all();
                    let until = Instant::now() + backoff.mul_f64(rand::random::<f64>());
                    while !st.shutdown && !self.work.wait_until(&mut st, until).timed_out() {}
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// An uploaded outbox file becomes a clean whole-object entry (a hard
    /// link: the same inode, so no copy, and its data is already fsynced).
    fn finish_upload(&self, name: &str, seq: u64, bytes: u64) {
        let path = self.outbox_path(name);
        let whole = self.data_path(name, ALL);
        let tmp = self.tmp_path(&whole);
        let linked = fs::hard_link(&path, &tmp).and_then(|()| fs::rename(&tmp, &whole));
        if let Err(e) = &linked {
            let _ = fs::remove_file(&tmp);
            tracing::warn!("caching uploaded {name}: {e}");
        }
        let mut st = self.lock();
        debug_assert!(st.objects.get(name).and_then(|o| o.dirty).is_some_and(|d| d.0 == seq), "an outbox object changed during its upload");
        st.drop_dirty(name);
        if linked.is_ok() {
            st.add_entry(name, ALL, bytes, Instant::now());
            self.trace(CacheEvent::Uploaded, name, bytes);
        } else {
            self.trace(CacheEvent::Dropped, name, 0);
        }
        self.n.uploads.fetch_add(1, Ordering::Relaxed);
        let victims = st.evict(self.opts.capacity, &self.n.evictions);
        drop(st);
        self.changed.notify_all();
        // Still busy: a new put of the name must not write its outbox file
        // before this one is gone. A crash before the unlink uploads the
        // object again, which is harmless.
        if let Err(e) = fs::remove_file(&path) {
            tracing::warn!("removing uploaded {}: {e}", path.display());
        }
        self.release(self.lock(), name);
        self.unlink_claimed(victims);
    }

    /// Makes every clean file durable and records it (see open).
    fn mark_clean(&self) {
        let paths: Vec<PathBuf> = self.lock().entries.values().map(|e| self.data_path(&e.name, e.slot)).collect();
        for p in &paths {
            match File::open(p).and_then(|f| f.sync_all()) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!("syncing {}: {e}; the cache will be dropped at the next open", p.display());
                    return;
                }
            }
        }
        let marker = self.opts.dir.join(CLEAN_MARKER);
        let r = fsync_dir(&self.data_dir).map_err(|e| (e, false)).and_then(|()| self.write_atomic(&marker, marker_text(self.opts.block).as_bytes(), true));
        if let Err((e, _)) = r {
            tracing::warn!("writing {}: {e}", marker.display());
        }
    }
}

/// Starts writing a file's pages to disk without waiting for them: the
/// clean shutdown fsyncs every cached file ([`Inner::mark_clean`]), and
/// pages already on their way make that quick instead of an unmount
/// writing the whole cache at once (0.4 s per 500 MiB here).
fn start_writeback(f: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: sync_file_range on a descriptor we own; a failure only
    // leaves the work to the later fsync.
    unsafe {
        libc::sync_file_range(f.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
    }
}

fn marker_text(block: u64) -> String {
    format!("block {block}\n")
}

/// One file found in a cache directory at open.
struct Found {
    name: String,
    slot: u64,
    bytes: u64,
    mtime: SystemTime,
    path: PathBuf,
}

fn scan(dir: &Path, what: &str) -> Result<Vec<(String, PathBuf, fs::Metadata)>> {
    let io = |e| Error::from_io(&format!("reading {what} {}", dir.display()), e);
    let mut out = Vec::new();
    for d in fs::read_dir(dir).map_err(io)? {
        let d = d.map_err(io)?;
        let md = d.metadata().map_err(io)?;
        if md.is_file() {
            out.push((d.file_name().to_string_lossy().into_owned(), d.path(), md));
        }
    }
    Ok(out)
}

fn remove_quietly(p: &Path) {
    if let Err(e) = fs::remove_file(p) {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::warn!("removing {}: {e}", p.display());
        }
    }
}

impl CachedBackend {
    /// Opens (or creates) the cache at `opts.dir` in front of `remote`,
    /// evicting least recently used first, and starts the uploaders.
    ///
    /// The uploaders retry on their own, forever; a `remote` that itself
    /// retries writes forever (`RetryPolicy::cloud()`) works too, but then
    /// [`shutdown`](Self::shutdown) leaves an upload stuck in an outage
    /// running in the background (it touches nothing once it returns).
    pub fn open(remote: Arc<dyn Backend>, opts: DiskCacheOptions) -> Result<Arc<CachedBackend>> {
        Self::with_policy(remote, opts, Box::new(Lru::new()))
    }

    /// [`open`](Self::open) with another eviction policy.
    pub fn with_policy(remote: Arc<dyn Backend>, opts: DiskCacheOptions, policy: Box<dyn CachePolicy>) -> Result<Arc<CachedBackend>> {
        if opts.block == 0 {
            return Err(Error::new(ErrorKind::Permanent, "the cache's block size must not be 0"));
        }
        let outbox_dir = opts.dir.join("outbox");
        let data_dir = opts.dir.join("data");
        for d in [&opts.dir, &outbox_dir, &data_dir] {
            crate::fsutil::create_private_dir_all(d).map_err(|e| Error::from_io(&format!("creating {}", d.display()), e))?;
        }
        // Clean files are trusted only after a clean shutdown with the same
        // block size; the marker goes before anything is written again.
        let marker = opts.dir.join(CLEAN_MARKER);
        let trusted = fs::read_to_string(&marker).is_ok_and(|t| t == marker_text(opts.block));
        match fs::remove_file(&marker) {
            Ok(()) => fsync_dir(&opts.dir).map_err(|e| Error::from_io(&format!("fsync {}", opts.dir.display()), e))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::from_io(&format!("removing {}", marker.display()), e)),
        }

        let mut outbox = Vec::new();
        for (file, path, md) in scan(&outbox_dir, "the outbox")? {
            if is_leftover(&file) {
                remove_quietly(&path);
            } else if let Some(name) = unescape(&file) {
                outbox.push(Found { name, slot: ALL, bytes: md.len(), mtime: md.modified().unwrap_or(SystemTime::UNIX_EPOCH), path });
            } else {
                tracing::warn!("ignoring {} in the cache's outbox: not a pack", path.display());
            }
        }
        outbox.sort_by(|a, b| (a.mtime, &a.name).cmp(&(b.mtime, &b.name)));
        let queued: std::collections::HashSet<&str> = outbox.iter().map(|f| f.name.as_str()).collect();

        let mut data = Vec::new();
        let mut discarded = 0u64;
        for (file, path, md) in scan(&data_dir, "the cache")? {
            if is_leftover(&file) {
                remove_quietly(&path);
                continue;
            }
            let Some((name, slot)) = parse_data_file(&file) else {
                tracing::warn!("ignoring {} in the cache: not a cache file", path.display());
                continue;
            };
            // A block is never empty nor longer than a block; the outbox's
            // copy of an object wins over cached ones (a crash between an
            // upload's link and the outbox file's removal).
            let bad_size = slot != ALL && (md.len() == 0 || md.len() > opts.block);
            if !trusted || bad_size || queued.contains(name.as_str()) {
                discarded += u64::from(!queued.contains(name.as_str()));
                remove_quietly(&path);
                continue;
            }
            data.push(Found { name, slot, bytes: md.len(), mtime: md.modified().unwrap_or(SystemTime::UNIX_EPOCH), path });
        }
        if discarded > 0 {
            tracing::warn!("{}: discarded {discarded} cached files (no clean shutdown with {}-byte blocks recorded); they are fetched again as needed", opts.dir.display(), opts.block);
        }
        // Least recently modified first, so that the policy's order
        // approximates the last session's.
        data.sort_by(|a, b| (a.mtime, &a.path).cmp(&(b.mtime, &b.path)));

        let mut st = State {
            objects: HashMap::new(),
            entries: HashMap::new(),
            policy,
            outbox: BTreeMap::new(),
            next_key: 0,
            next_seq: 0,
            next_version: 0,
            clean_bytes: 0,
            dirty_bytes: 0,
            reserved: 0,
            shutdown: false,
            alive: 0,
            in_remote: 0,
        };
        for f in &outbox {
            let seq = st.next_seq;
            st.next_seq += 1;
            let o = st.obj(&f.name);
            o.dirty = Some((seq, f.bytes));
            o.size = Some(f.bytes);
            st.outbox.insert(seq, f.name.clone());
            st.dirty_bytes += f.bytes;
        }
        for f in &data {
            st.add_entry(&f.name, f.slot, f.bytes, instant_of(f.mtime));
            // The sizes the files tell: a whole copy's, and a short block's
            // (only the last block of an object is short).
            let size = if f.slot == ALL {
                Some(f.bytes)
            } else if f.bytes < opts.block {
                Some(f.slot * opts.block + f.bytes)
            } else {
                None
            };
            let o = st.obj(&f.name);
            if o.size.is_none() {
                o.size = size;
            }
        }
        if !outbox.is_empty() {
            tracing::info!("{}: {} packs ({} bytes) wait in the outbox and will be uploaded", opts.dir.display(), outbox.len(), st.dirty_bytes);
        }

        let uploaders = opts.uploaders.max(1);
        st.alive = uploaders;
        let inner = Arc::new(Inner {
            remote,
            opts,
            outbox_dir,
            data_dir,
            state: Mutex::new(st),
            changed: Condvar::new(),
            work: Condvar::new(),
            n: Counters::default(),
            tmp_seq: AtomicU64::new(0),
            trace: OnceLock::new(),
        });
        // A smaller capacity than last time.
        let victims = inner.lock().evict(inner.opts.capacity, &inner.n.evictions);
        inner.unlink_claimed(victims);
        for i in 0..uploaders {
            let inner2 = inner.clone();
            let spawned = std::thread::Builder::new().name(format!("cairn-upload-{i}")).spawn(move || inner2.uploader());
            if let Err(e) = spawned {
                let me = CachedBackend { inner };
                me.inner.lock().alive -= uploaders - i;
                return Err(Error::from_io("starting the upload threads", e));
            }
        }
        Ok(Arc::new(CachedBackend { inner }))
    }

    /// Records this cache's events into `t` from now on, starting with
    /// what it holds (docs/trace.md, CACHE).
    pub fn set_trace(&self, t: Arc<TraceWriter>) {
        let inner = &self.inner;
        let b = inner.opts.block;
        let st = inner.lock();
        let mut events = vec![Event::CacheOpened { block: b, capacity: inner.opts.capacity }];
        // Keys grow with admissions: the policy's order.
        let mut held: Vec<(&u64, &Entry)> = st.entries.iter().collect();
        held.sort_unstable_by_key(|(k, _)| **k);
        for (_, e) in held {
            let (event, offset) = if e.slot == ALL { (CacheEvent::Kept, 0) } else { (CacheEvent::Held, e.slot * b) };
            events.push(Event::Cache { event, pack: pack_id(&e.name), offset, len: e.bytes, group: 0 });
        }
        for name in st.outbox.values() {
            let size = st.objects[name].dirty.map_or(0, |d| d.1);
            events.push(Event::Cache { event: CacheEvent::Queued, pack: pack_id(name), offset: 0, len: size, group: 0 });
        }
        t.record_all(events);
        let _ = inner.trace.set(t);
    }

    /// The uploaders' last failure, if no upload has succeeded since.
    pub fn upload_problem(&self) -> Option<crate::health::Problem> {
        self.inner.n.upload.get()
    }

    /// Counts and sizes.
    pub fn stats(&self) -> CacheStats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let n = &self.inner.n;
        let st = self.inner.lock();
        CacheStats {
            policy: st.policy.name().to_string(),
            hits: g(&n.hits),
            misses: g(&n.misses),
            bytes_fetched: g(&n.bytes_fetched),
            remote_gets: g(&n.remote_gets),
            evictions: g(&n.evictions),
            clean_bytes: st.clean_bytes,
            dirty_bytes: st.dirty_bytes + st.reserved,
            dirty_objects: st.outbox.len() as u64,
            uploads: g(&n.uploads),
            upload_retries: g(&n.upload_retries),
        }
    }

    /// Whether bytes `[off, off+len)` of `name` are here (in the outbox, a
    /// whole cached object, or every block): reading them costs the bucket
    /// nothing (the cleaner's cost of cleaning, docs/frugal.md §5).
    pub fn holds(&self, name: &str, off: u64, len: u64) -> bool {
        let st = self.inner.lock();
        let Some(o) = st.objects.get(name) else { return false };
        if o.dirty.is_some() || o.whole.is_some() {
            return true;
        }
        let b = self.inner.opts.block;
        len > 0 && (off / b..=(off + len - 1) / b).all(|i| o.blocks.contains_key(&i))
    }

    /// Whether `name` is written but not yet uploaded.
    pub fn is_pending(&self, name: &str) -> bool {
        self.inner.lock().is_dirty(name)
    }

    /// Names of objects written but not yet uploaded (the outbox), oldest
    /// first.
    pub fn pending(&self) -> Vec<String> {
        self.inner.lock().outbox.values().cloned().collect()
    }

    /// Blocks until every object in `names` that is still in the outbox is
    /// uploaded (after [`shutdown`](Self::shutdown): forever, if any is).
    pub fn wait_uploaded(&self, names: &[String]) {
        let mut st = self.inner.lock();
        while names.iter().any(|n| st.is_dirty(n)) {
            self.inner.changed.wait(&mut st);
        }
    }

    /// Blocks until the outbox is empty, calling `progress(remaining_bytes,
    /// remaining_objects)` at once and then at least every 200 ms (after
    /// [`shutdown`](Self::shutdown): forever, if it is not empty).
    pub fn drain(&self, progress: &mut dyn FnMut(u64, u64)) {
        let mut st = self.inner.lock();
        let mut next = Instant::now();
        loop {
            if st.outbox.is_empty() {
                return;
            }
            if Instant::now() >= next {
                let (bytes, n) = (st.dirty_bytes, st.outbox.len() as u64);
                MutexGuard::unlocked(&mut st, || progress(bytes, n));
                next = Instant::now() + PROGRESS_EVERY;
                continue;
            }
            self.inner.changed.wait_until(&mut st, next);
        }
    }

    /// Stops the uploader threads; objects left in the outbox stay there and
    /// upload at the next open. Returns once no uploader touches the
    /// cache's files any more: an upload inside a remote call that does not
    /// return (a remote retrying forever in an outage) is left to finish in
    /// the background, and its result is ignored.
    pub fn shutdown(&self) {
        let inner = &self.inner;
        let mut st = inner.lock();
        st.shutdown = true;
        inner.work.notify_all();
        while st.alive > st.in_remote {
            inner.changed.wait(&mut st);
        }
    }
}

impl Drop for CachedBackend {
    fn drop(&mut self) {
        self.shutdown();
        self.inner.mark_clean();
    }
}

impl Backend for CachedBackend {
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        if !is_pack(name) {
            return self.inner.remote.put(name, data);
        }
        validate_name(name)?;
        match self.inner.opts.durability {
            Durability::Local => self.inner.put_local(name, data),
            Durability::Remote => self.inner.put_remote(name, data, false),
        }
    }

    fn put_if_absent(&self, name: &str, data: &[u8]) -> Result<()> {
        if !is_pack(name) {
            return self.inner.remote.put_if_absent(name, data);
        }
        validate_name(name)?;
        // A conditional create decides against the remote's state, so it
        // is synchronous whatever the durability.
        self.inner.put_remote(name, data, true)
    }

    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        if !is_pack(name) {
            return self.inner.remote.get_range(name, offset, len);
        }
        validate_name(name)?;
        self.inner.read_pack(name, offset, len)
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        if !is_pack(name) {
            return self.inner.remote.get(name);
        }
        validate_name(name)?;
        let size = self.inner.size_of(name)?;
        self.inner.read_pack(name, 0, size)
    }

    fn size(&self, name: &str) -> Result<u64> {
        if !is_pack(name) {
            return self.inner.remote.size(name);
        }
        validate_name(name)?;
        self.inner.size_of(name)
    }

    fn delete(&self, name: &str) -> Result<()> {
        if !is_pack(name) {
            return self.inner.remote.delete(name);
        }
        validate_name(name)?;
        self.inner.delete_pack(name)
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        self.inner.list(prefix)
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.remote.capabilities()
    }

    fn sync(&self) -> Result<()> {
        self.inner.remote.sync()
    }

    fn describe(&self) -> String {
        format!("cache {} over {}", self.inner.opts.dir.display(), self.inner.remote.describe())
    }

    fn meter(&self) -> Option<Arc<cairn_backend::Meter>> {
        self.inner.remote.meter()
    }

    fn backlog(&self) -> Option<cairn_backend::Backlog> {
        self.inner.remote.backlog()
    }

    fn position(&self, name: &str, offset: u64) -> Option<u64> {
        self.inner.remote.position(name, offset)
    }

    fn space(&self) -> Option<cairn_backend::StoreSpace> {
        self.inner.remote.space()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_file_names_round_trip_and_leftovers_are_told_apart() {
        let name = "packs/00/ab-c_d.e";
        assert_eq!(escape(name), "packs~00~ab-c_d.e");
        assert_eq!(unescape(&escape(name)).as_deref(), Some(name));
        assert_eq!(parse_data_file(&format!("{}@all", escape(name))), Some((name.to_string(), ALL)));
        assert_eq!(parse_data_file(&format!("{}@17", escape(name))), Some((name.to_string(), 17)));
        for bad in ["packs~x", "packs~x@", "packs~x@1x", "packs~x@-1", "config@all", "packs~~x@1", "packs~x@18446744073709551615"] {
            assert_eq!(parse_data_file(bad), None, "{bad}");
        }
        // A pack may be named *.tmp; a temporary file always has an '@'.
        assert!(!is_leftover("packs~x.tmp"));
        assert_eq!(unescape("packs~x.tmp").as_deref(), Some("packs/x.tmp"));
        assert!(is_leftover("packs~x@12.tmp"));
        assert!(is_leftover("packs~x@3@12.4.tmp"));
        assert_eq!(parse_data_file("packs~x@3@12.4.tmp"), None);
    }

    #[test]
    fn pieces_of_blocks_cover_the_request() {
        // [10, 250) over blocks of 100: 90 bytes of block 0, all of 1, 50 of 2.
        assert_eq!(piece_of_block(0, 100, 10, 250), (10, 100));
        assert_eq!(piece_of_block(1, 100, 10, 250), (0, 100));
        assert_eq!(piece_of_block(2, 100, 10, 250), (0, 50));
    }

    /// The temporary file of an outbox write carries the pid and a
    /// sequence number, so concurrent writers never share one, and it is
    /// recognised as a leftover.
    #[test]
    fn temporary_files_are_unique_leftovers() {
        let d = tempfile::tempdir().unwrap();
        let c = CachedBackend::open(Arc::new(cairn_testing::MemoryBackend::new()), DiskCacheOptions::new(d.path(), 1 << 20)).unwrap();
        let p = c.inner.outbox_path("packs/a");
        let (t1, t2) = (c.inner.tmp_path(&p), c.inner.tmp_path(&p));
        assert_ne!(t1, t2);
        assert!(is_leftover(&t1.file_name().unwrap().to_string_lossy()));
        assert_eq!(t1.parent(), p.parent());
    }
}
