//! A persistent local cache and upload outbox in front of a remote backend
//! (docs/cloud.md §5): [`CachedBackend`].
//!
//! Contract:
//! - Only objects under `packs/` are cached or queued; every other name
//!   (`config`, `meta/...`, `lease`) goes straight to the remote.
//! - Who pays: the cache opened bills its requests to `other`;
//!   [`Backend::paid_by`] gives a handle on the same cache billing
//!   another subsystem, and the remote requests a call through it causes
//!   (a read's fetches, a synchronous put, a delete, a listing) go through
//!   the remote's handle for that subsystem. A pack put into the outbox
//!   remembers who put it (unless `write` or `other`), and the uploaders
//!   send it as theirs, else as `write`'s.
//! - `put` of a pack with [`Durability::Local`] writes `DIR/outbox/<name>`
//!   (`/` escaped as `~`) through a temporary file, fsyncs it and the
//!   directory, and returns: the pack is durable locally. Uploader threads
//!   PUT outbox objects oldest first, retrying forever (backoff 100 ms
//!   doubling to 5 s, full jitter), then move them into the clean cache. A
//!   `put` that would take the outbox past 3/4 of the capacity waits for
//!   uploads to make room (one object is always admitted into an empty
//!   outbox): an outage blocks writers, it never fails them.
//! - `put_held` writes a pack to the outbox as `put` with local durability
//!   does but keeps it out of the upload queue (and out of the outbox's
//!   admission bound) until `pending` or `drain` queue it, or the next
//!   open does; `discard_held` drops it without an upload
//!   (docs/frugal.md §7).
//! - `put` of a pack with [`Durability::Remote`], and every `put_if_absent`
//!   of a pack, goes to the remote synchronously (its error is returned),
//!   then keeps a clean copy.
//! - Reads of a pack are served from the outbox file, a whole-object copy
//!   (`DIR/data/<name>@all`) or cached extents (`DIR/data/<name>@<offset>+<len>`:
//!   disjoint ranges, each fetched at once and evicted whole). A miss
//!   fetches exactly the gaps of the read that no extent holds (rounded out
//!   to `block` if set), two gaps closer than a GET's worth of transfer in
//!   one ranged GET (`cairn_model::cache::extent`, shared with the
//!   simulator; docs/frugal.md §6); two readers missing the same bytes
//!   cause one GET. Sizes come from the outbox, memory, or one `size` per
//!   object.
//! - Clean bytes stay within `capacity` minus the dirty bytes; victims come
//!   from the [`CachePolicy`] and are never outbox objects. A read made
//!   for a file ([`CachedBackend::get_range_for`], the volume's chunk
//!   reads) tells the policy which one ([`CachePolicy::grouped`]).
//! - `delete` of a pack waits for its upload in progress, drops it from the
//!   outbox and the cache, then deletes it on the remote. `list` is the
//!   remote's listing plus the outbox.
//! - Bytes are stored exactly as the remote holds them (sealed packs stay
//!   sealed): the cache never holds plaintext the bucket does not.
//! - Reopen: the outbox is queued again, oldest first by mtime; clean files
//!   are re-admitted least recently modified first (a hit refreshes a file's
//!   mtime at most once a minute), but only after a clean shutdown of a
//!   cache of this format (`DIR/clean`, written when the cache is dropped):
//!   clean files are not fsynced when written, so after a crash they may be
//!   empty or short and are discarded. `.tmp` leftovers are deleted.
//! - No lock is held across file I/O or remote requests; a name whose files
//!   are being replaced (put, delete, upload) or whose blocks are being
//!   fetched or deleted is marked in the index, and others wait for it.

use super::policy::{CachePolicy, Lru};
use cairn_model::cache::extent::{self, FetchRules, Span};
use crate::trace::{pack_id, CacheEvent, Event, TraceWriter};
use cairn_backend::{validate_name, Backend, Capabilities, Error, ErrorKind, ObjectInfo, Payers, Result, Subsystem};
use parking_lot::{Condvar, Mutex, MutexGuard};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

/// The default fetch alignment (none) and read-ahead within a pack, and
/// the pieces an uploaded object is kept in (why: their definitions).
pub use cairn_model::cache::{DEFAULT_AHEAD, DEFAULT_BLOCK, KEEP_PIECE};

/// The names this cache handles; everything else passes through.
const PACKS: &str = "packs/";
/// The slot of a whole-object entry (an extent's slot is its offset).
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
    /// A miss's fetch is rounded out to multiples of this (0: exact).
    pub block: u64,
    /// Two missing ranges of one read at most this far apart go in one
    /// GET ([`extent::merge_below`] of the volume's prices).
    pub merge_below: u64,
    /// A miss that starts where the object's last GET ended fetches this
    /// much more (a scan of the files a pack holds).
    pub ahead: u64,
    /// When a `put` of a pack returns.
    pub durability: Durability,
    /// Upload threads (at least one is started).
    pub uploaders: usize,
    /// A pack written stays cached as extents of this many bytes, each a
    /// file evicted on its own ([`KEEP_PIECE`] by default).
    pub keep_piece: u64,
}

impl DiskCacheOptions {
    /// Options with the defaults: exact fetches, merged at AWS prices,
    /// local durability, two uploaders.
    pub fn new(dir: impl Into<PathBuf>, capacity: u64) -> Self {
        let p = cairn_model::prices::Prices::aws();
        let merge_below = extent::merge_below(p.per_1000_requests.get, p.transfer_down_per_gb);
        DiskCacheOptions { dir: dir.into(), capacity, block: DEFAULT_BLOCK, merge_below, ahead: DEFAULT_AHEAD, durability: Durability::Local, uploaders: 2, keep_piece: KEEP_PIECE }
    }

    fn rules(&self) -> FetchRules {
        FetchRules { align: self.block, merge_below: self.merge_below, ahead: self.ahead }
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
    /// Objects in the outbox (queued or held).
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

/// One clean file: an extent or a whole object.
struct Entry {
    name: String,
    /// The extent's offset, or [`ALL`].
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
    /// Extents: offset → (end, policy key). Disjoint.
    extents: BTreeMap<u64, (u64, u64)>,
    /// Ranges whose files are being created (a fetch) or deleted (an
    /// eviction), offset → end (the whole copy's: `ALL` → `ALL`); nobody
    /// else touches them until released. Disjoint from each other and
    /// from the extents.
    claimed: BTreeMap<u64, u64>,
    /// A put, delete or upload is replacing the object's files: others wait.
    busy: bool,
    /// Where the last GET of the object ended, and the file it was for
    /// (the read-ahead rule).
    last_get: Option<(u64, u64)>,
}

struct State {
    objects: HashMap<String, Obj>,
    /// Policy key → clean entry.
    entries: HashMap<u64, Entry>,
    policy: Box<dyn CachePolicy>,
    /// Queue position → name; the first is the oldest.
    outbox: BTreeMap<u64, String>,
    /// Objects written to the outbox but kept out of its queue
    /// ([`CachedBackend::put_held`]) until [`State::release_held`].
    held: Vec<String>,
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
            let o = Obj { version, size: None, dirty: None, payer: None, whole: None, extents: BTreeMap::new(), claimed: BTreeMap::new(), busy: false, last_get: None };
            self.objects.insert(name.to_string(), o);
        }
        self.objects.get_mut(name).expect("just inserted")
    }

    /// Nobody is replacing the object's files or fetching or deleting any
    /// of its extents.
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
        let old = if slot == ALL { o.whole.replace(key) } else { o.extents.insert(slot, (slot + bytes, key)).map(|(_, k)| k) };
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
            } else if o.extents.get(&e.slot).is_some_and(|(_, k)| *k == key) {
                o.extents.remove(&e.slot);
            }
        }
        Some(e)
    }

    /// Drops every clean entry of `name`; returns their (slot, bytes).
    fn detach_clean(&mut self, name: &str) -> Vec<(u64, u64)> {
        let Some(o) = self.objects.get(name) else { return Vec::new() };
        let keys: Vec<u64> = o.whole.iter().copied().chain(o.extents.values().map(|(_, k)| *k)).collect();
        keys.into_iter().filter_map(|k| self.remove_entry(k)).map(|e| (e.slot, e.bytes)).collect()
    }

    /// Drops entry `key` and claims its range until its file is deleted, so
    /// that nobody creates the file anew before the deletion.
    fn remove_claimed(&mut self, key: u64) -> Option<Victim> {
        let e = self.remove_entry(key)?;
        let end = if e.slot == ALL { ALL } else { e.slot + e.bytes };
        self.obj(&e.name).claimed.insert(e.slot, end);
        Some(Victim { name: e.name, slot: e.slot, bytes: e.bytes })
    }

    /// Evicts the policy's victims while clean bytes exceed what the dirty
    /// ones leave of the capacity.
    fn evict(&mut self, capacity: u64, evictions: &AtomicU64) -> Vec<Victim> {
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
        self.held.retain(|n| n != name);
        self.dirty_bytes -= bytes;
        Some(bytes)
    }

    /// Queues every held object for upload (in the order it was written);
    /// their names and sizes.
    fn release_held(&mut self) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for name in std::mem::take(&mut self.held) {
            if let Some((seq, size)) = self.objects.get(&name).and_then(|o| o.dirty) {
                self.outbox.insert(seq, name.clone());
                out.push((name, size));
            }
        }
        out
    }
}

/// A clean file being deleted, its range claimed meanwhile.
struct Victim {
    name: String,
    slot: u64,
    bytes: u64,
}

struct Inner {
    /// The remote's handle for each payer.
    remote: Payers,
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
    /// Who the requests sent through this handle are billed to.
    who: Subsystem,
    /// The handle `open` returned (its drop shuts the cache down), not
    /// one of [`Backend::paid_by`].
    owner: bool,
}

/// Who a pack read is made for: the subsystem that pays for what it
/// fetches, and the file (an inode) it reads for, if any
/// ([`CachePolicy::grouped`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadFor {
    pub who: Subsystem,
    pub group: Option<u64>,
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

/// `(name, slot, extent length)` of a data file `<escaped name>@<offset>+<len>`
/// (an extent: its length is not 0 and it ends before 2^63) or
/// `<escaped name>@all` (length None).
fn parse_data_file(file: &str) -> Option<(String, u64, Option<u64>)> {
    let (esc, slot) = file.rsplit_once('@')?;
    let number = |s: &str| (!s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse::<u64>().ok()).flatten();
    let (slot, len) = match slot {
        "all" => (ALL, None),
        s => {
            let (off, len) = s.split_once('+')?;
            let (off, len) = (number(off)?, number(len)?);
            if len == 0 || off.checked_add(len)? > i64::MAX as u64 {
                return None;
            }
            (off, Some(len))
        }
    };
    Some((unescape(esc)?, slot, len))
}

fn slot_name(slot: u64, bytes: u64) -> String {
    if slot == ALL {
        "all".to_string()
    } else {
        format!("{slot}+{bytes}")
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

/// The parts of `[off, end)` that no collected piece (offset → bytes;
/// pieces may overlap) covers, in order.
fn uncovered(pieces: &BTreeMap<u64, Vec<u8>>, off: u64, end: u64) -> Vec<Span> {
    let mut out = Vec::new();
    let mut at = off;
    for (&s, p) in pieces.range(..end) {
        let e = s + p.len() as u64;
        if e <= at {
            continue;
        }
        if s > at {
            out.push((at, s));
        }
        at = e;
        if at >= end {
            break;
        }
    }
    if at < end {
        out.push((at, end));
    }
    out
}

/// `[off, end)` assembled from pieces that cover it (they may overlap).
fn assemble(pieces: &BTreeMap<u64, Vec<u8>>, off: u64, end: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity((end - off) as usize);
    let mut at = off;
    while at < end {
        let (&s, p) = pieces.range(..=at).next_back().expect("pieces cover the read");
        let e = (s + p.len() as u64).min(end);
        assert!(e > at, "pieces cover the read");
        out.extend_from_slice(&p[(at - s) as usize..(e - s) as usize]);
        at = e;
    }
    out
}

/// How a read will be served this round.
enum Plan {
    /// One file holds the whole object: the outbox file (`key` None) or a
    /// clean whole copy.
    Whole { path: PathBuf, key: Option<u64> },
    /// Read these cached extents (offset, bytes, key); fetch these GETs,
    /// whose extents are claimed.
    Extents { reads: Vec<(u64, u64, u64)>, gets: Vec<extent::Get> },
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

    fn data_path(&self, name: &str, slot: u64, bytes: u64) -> PathBuf {
        self.data_dir.join(format!("{}@{}", escape(name), slot_name(slot, bytes)))
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

    /// Wakes the uploaders for held objects just queued, and tells the
    /// trace (their PUT).
    fn released(&self, objects: Vec<(String, u64)>) {
        if objects.is_empty() {
            return;
        }
        self.work.notify_all();
        if let Some(t) = self.trace.get() {
            t.record_all(objects.iter().map(|(name, size)| Event::Pack { pack: pack_id(name), size: *size, stage: crate::trace::PackStage::Released }));
        }
    }

    /// Records a pack read, with the file it was for.
    fn trace_read(&self, event: CacheEvent, name: &str, size: u64, off: u64, len: u64, group: Option<u64>) {
        if let Some(t) = self.trace.get() {
            t.cache_read(event, pack_id(name), size, off, len, group.unwrap_or(0));
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

    /// Deletes the files of claimed ranges, then releases the claims.
    fn unlink_claimed(&self, victims: Vec<Victim>) {
        if victims.is_empty() {
            return;
        }
        for Victim { name, slot, bytes } in &victims {
            let p = self.data_path(name, *slot, *bytes);
            if let Err(e) = fs::remove_file(&p) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!("removing cache file {}: {e}", p.display());
                }
            }
        }
        let mut st = self.lock();
        for v in &victims {
            if let Some(o) = st.objects.get_mut(&v.name) {
                o.claimed.remove(&v.slot);
            }
        }
        drop(st);
        self.changed.notify_all();
    }

    /// Deletes the clean files `(slot, bytes)` of `name` (the caller
    /// holds the name busy, so nobody recreates them meanwhile).
    fn unlink_slots(&self, name: &str, slots: &[(u64, u64)]) {
        for (s, b) in slots {
            let p = self.data_path(name, *s, *b);
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

    fn size_of(&self, name: &str, who: Subsystem) -> Result<u64> {
        if let Some(s) = Self::known_size(&self.lock(), name) {
            return Ok(s);
        }
        let s = self.remote.get(who).size(name)?;
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

    /// `[off, off + len)` of pack `name`, read for `r` (who pays, which
    /// file).
    fn read_pack(&self, name: &str, off: u64, len: u64, r: ReadFor) -> Result<Vec<u8>> {
        let group = r.group;
        let rules = self.opts.rules();
        // Pieces of the request collected so far, by offset in the object
        // (they may overlap), and the object version they belong to.
        let mut pieces: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        let mut version = 0;
        let mut missed = false;
        let mut vanished = 0u32;
        loop {
            let size = self.size_of(name, r.who)?;
            let end = off.checked_add(len).filter(|e| *e <= size).ok_or_else(|| {
                Error::new(ErrorKind::OutOfRange, format!("object {name}: range {off}+{len} past its end ({size} bytes)")).with_object(name)
            })?;
            if len == 0 {
                return Ok(Vec::new());
            }
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
                match self.plan(&mut st, name, off, end, size, rules, &pieces, &mut touch, group) {
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
            for (slot, bytes) in touch {
                // Approximate recency that survives a restart (see open).
                let _ = File::options().write(true).open(self.data_path(name, slot, bytes)).and_then(|f| f.set_modified(SystemTime::now()));
            }
            match plan {
                Plan::Done => {
                    let c = if missed { &self.n.misses } else { &self.n.hits };
                    c.fetch_add(1, Ordering::Relaxed);
                    self.trace_read(if missed { CacheEvent::Miss } else { CacheEvent::Hit }, name, size, off, len, group);
                    return Ok(assemble(&pieces, off, end));
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
                        self.trace_read(event, name, size, off, len, group);
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
                Plan::Extents { reads, gets } => {
                    for (start, bytes, k) in reads {
                        let (lo, hi) = (off.max(start), end.min(start + bytes));
                        let path = self.data_path(name, start, bytes);
                        match read_at(&path, lo - start, hi - lo, bytes) {
                            Ok(p) => {
                                pieces.insert(lo, p);
                            }
                            Err(e) => {
                                // Evicted meanwhile (then it is no longer
                                // indexed) or damaged: fetch it again.
                                if !matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::UnexpectedEof) {
                                    tracing::warn!("reading cache file {}: {e}; fetching again", path.display());
                                }
                                self.discard(k);
                                vanished += 1;
                            }
                        }
                    }
                    if !gets.is_empty() {
                        missed = true;
                        self.fetch(name, &gets, off, end, &mut pieces, r)?;
                    }
                }
            }
            if vanished > MAX_VANISHED {
                return Err(Error::new(ErrorKind::Transient, format!("object {name}: its cached files kept changing while being read")).with_object(name));
            }
        }
    }

    /// Decides how to serve `[off, end)` of `name` (known to the index, of
    /// `size` bytes), beyond the `pieces` already collected: the extents to
    /// read, and the gaps to fetch, which it claims; None: wait for the
    /// others. A cached entry it will read counts as accessed; those due a
    /// touch of their mtime are added to `touch` as (slot, bytes). The
    /// policy learns that the entries read are read for file `group`.
    #[allow(clippy::too_many_arguments)]
    fn plan(&self, st: &mut State, name: &str, off: u64, end: u64, size: u64, rules: FetchRules, pieces: &BTreeMap<u64, Vec<u8>>, touch: &mut Vec<(u64, u64)>, group: Option<u64>) -> Option<Plan> {
        let State { objects, entries, policy, .. } = st;
        let o = objects.get_mut(name).expect("the caller found it");
        let mut hit = |key: u64, slot: u64| {
            policy.accessed(key);
            if let Some(g) = group {
                policy.grouped(key, g);
            }
            if let Some(e) = entries.get_mut(&key) {
                if e.touched.elapsed() >= TOUCH_EVERY {
                    e.touched = Instant::now();
                    touch.push((slot, e.bytes));
                }
            }
        };
        if o.dirty.is_some() {
            return Some(Plan::Whole { path: self.outbox_path(name), key: None });
        }
        if let Some(k) = o.whole {
            hit(k, ALL);
            return Some(Plan::Whole { path: self.data_path(name, ALL, 0), key: Some(k) });
        }
        if o.busy {
            // A put, delete or upload is replacing the object's files.
            return None;
        }
        let (mut reads, mut gets, mut others) = (Vec::new(), Vec::new(), false);
        // An extent can serve two gaps of the request: read (and hit) once.
        let mut read_slots = std::collections::HashSet::new();
        for (a, b) in uncovered(pieces, off, end) {
            let after = extent::continuing(o.last_get, group.unwrap_or(0));
            let p = extent::plan(&o.extents, |v| v.0, &o.claimed, after, a, b, size, rules);
            others |= p.waiting;
            for s in p.cached {
                let (e, k) = o.extents[&s];
                if read_slots.insert(s) {
                    hit(k, s);
                    reads.push((s, e - s, k));
                }
            }
            for g in p.gets {
                for &(s, e) in &g.extents {
                    o.claimed.insert(s, e);
                }
                gets.push(g);
            }
        }
        if reads.is_empty() && gets.is_empty() {
            return if others { None } else { Some(Plan::Done) };
        }
        Some(Plan::Extents { reads, gets })
    }

    /// Sends the GETs, keeps the request's pieces of what they bring,
    /// caches each claimed extent (admitted for file `r.group`), and
    /// releases the claims. `r.who` pays for the GETs.
    fn fetch(&self, name: &str, gets: &[extent::Get], off: u64, end: u64, pieces: &mut BTreeMap<u64, Vec<u8>>, r: ReadFor) -> Result<()> {
        let (group, remote) = (r.group, self.remote.get(r.who));
        let mut written = Vec::new();
        let mut result = Ok(());
        for g in gets {
            let (start, stop) = g.range;
            self.n.remote_gets.fetch_add(1, Ordering::Relaxed);
            let data = match remote.get_range(name, start, stop - start) {
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
            for &(s, e) in &g.extents {
                let bytes = &data[(s - start) as usize..(e - start) as usize];
                let (lo, hi) = (off.max(s), end.min(e));
                if lo < hi {
                    pieces.insert(lo, bytes[(lo - s) as usize..(hi - s) as usize].to_vec());
                }
                // No fsync: clean data can be fetched again (see open).
                match self.write_atomic(&self.data_path(name, s, e - s), bytes, false) {
                    Ok(()) => written.push((s, e - s)),
                    Err((err, _)) => tracing::warn!("caching bytes {s}..{e} of {name}: {err}"),
                }
            }
        }
        let mut st = self.lock();
        let now = Instant::now();
        for (s, bytes) in written {
            let key = st.add_entry(name, s, bytes, now);
            if let Some(g) = group {
                st.policy.grouped(key, g);
            }
        }
        if let Some(o) = st.objects.get_mut(name) {
            for g in gets {
                for (s, _) in &g.extents {
                    o.claimed.remove(s);
                }
            }
            if let (Ok(()), Some(g)) = (&result, gets.last()) {
                o.last_get = Some((g.range.1, group.unwrap_or(0)));
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

    /// Writes a pack to the outbox; `queue`: for upload now, else held
    /// ([`CachedBackend::put_held`]).
    fn put_local(&self, name: &str, data: &[u8], queue: bool, who: Subsystem) -> Result<()> {
        let size = data.len() as u64;
        let bound = self.dirty_bound();
        let mut st = self.lock();
        loop {
            if st.free(name) {
                // A new version of a queued object replaces it. Held
                // objects do not count: they are not uploaded before their
                // release, so waiting for them could wait for good (and
                // the round that wrote one copies it away next: at most
                // two are here at once).
                let old = st.objects.get(name).and_then(|o| o.dirty).map_or(0, |d| d.1);
                let held: u64 = st.held.iter().filter(|n| *n != name).filter_map(|n| st.objects.get(n).and_then(|o| o.dirty)).map(|d| d.1).sum();
                let others = st.dirty_bytes + st.reserved - old - held;
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
            o.payer = Some(who).filter(|w| !matches!(w, Subsystem::Other | Subsystem::Write));
            o.size = Some(size);
            o.version = version;
            if queue {
                st.outbox.insert(seq, name.to_string());
            } else {
                st.held.push(name.to_string());
            }
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
    fn put_remote(&self, name: &str, data: &[u8], only_if_absent: bool, who: Subsystem) -> Result<()> {
        let st = self.acquire(self.lock(), name);
        if only_if_absent && st.is_dirty(name) {
            self.release(st, name);
            return Err(Error::new(ErrorKind::AlreadyExists, format!("object {name} already exists (not yet uploaded)")).with_object(name));
        }
        drop(st);
        let remote = self.remote.get(who);
        let r = if only_if_absent { remote.put_if_absent(name, data) } else { remote.put(name, data) };
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
        let pieces = if r.is_ok() { self.write_pieces(name, data) } else { Vec::new() };
        let mut st = self.lock();
        if r.is_ok() {
            let now = Instant::now();
            for &(off, len) in &pieces {
                st.add_entry(name, off, len, now);
            }
            self.trace(CacheEvent::Kept, name, data.len() as u64);
        }
        let victims = st.evict(self.opts.capacity, &self.n.evictions);
        self.release(st, name);
        self.unlink_claimed(victims);
        r
    }

    fn delete_pack(&self, name: &str, who: Subsystem) -> Result<()> {
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
        let r = self.remote.get(who).delete(name);
        let mut st = self.lock();
        st.objects.remove(name);
        drop(st);
        self.wake();
        r
    }

    fn outbox_matching(st: &State, prefix: &str) -> Vec<ObjectInfo> {
        let queued = st.outbox.values().chain(&st.held).filter(|n| n.starts_with(prefix));
        queued.map(|n| ObjectInfo { name: n.clone(), size: st.objects[n].dirty.map_or(0, |d| d.1) }).collect()
    }

    fn list(&self, prefix: &str, who: Subsystem) -> Result<Vec<ObjectInfo>> {
        // The outbox is looked at before the remote too: an object uploaded
        // while the remote lists is in one of the two looks.
        let before = Self::outbox_matching(&self.lock(), prefix);
        let mut out = self.remote.get(who).list(prefix)?;
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
                // The bill: uploads are the writes' requests, unless
                // someone else (gc) put the pack.
                Ok(data) => self.remote.get(payer.unwrap_or(Subsystem::Write)).put(&name, &data).map(|()| data),
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
                Ok(data) => {
                    drop(st);
                    backoff = FIRST_BACKOFF;
                    self.n.upload.ok();
                    self.finish_upload(&name, seq, &data);
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

    /// Writes `data`, the bytes of object `name`, as extent files of
    /// `keep_piece` bytes (not fsynced: clean data); returns the pieces
    /// written, (offset, bytes).
    fn write_pieces(&self, name: &str, data: &[u8]) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let piece_len = self.opts.keep_piece.max(1);
        for (i, piece) in data.chunks(piece_len as usize).enumerate() {
            let off = i as u64 * piece_len;
            match self.write_atomic(&self.data_path(name, off, piece.len() as u64), piece, false) {
                Ok(()) => out.push((off, piece.len() as u64)),
                Err((e, _)) => tracing::warn!("caching bytes {off}+{} of {name}: {e}", piece.len()),
            }
        }
        out
    }

    /// An uploaded outbox object stays cached as pieces of `keep_piece`
    /// bytes, each evicted on its own (kept whole, one pack took most of a
    /// small cache at once and was evicted whole, the parts being read with
    /// the rest); the outbox file goes.
    fn finish_upload(&self, name: &str, seq: u64, data: &[u8]) {
        let path = self.outbox_path(name);
        let pieces = self.write_pieces(name, data);
        let mut st = self.lock();
        debug_assert!(st.objects.get(name).and_then(|o| o.dirty).is_some_and(|d| d.0 == seq), "an outbox object changed during its upload");
        st.drop_dirty(name);
        let now = Instant::now();
        for &(off, len) in &pieces {
            st.add_entry(name, off, len, now);
        }
        self.trace(CacheEvent::Uploaded, name, data.len() as u64);
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
        let paths: Vec<PathBuf> = self.lock().entries.values().map(|e| self.data_path(&e.name, e.slot, e.bytes)).collect();
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
        let r = fsync_dir(&self.data_dir).map_err(|e| (e, false)).and_then(|()| self.write_atomic(&marker, MARKER_TEXT.as_bytes(), true));
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

/// What the clean marker says: the cache's format. Version 2 holds
/// extents; version 1 (`block N`, until 2026-11-29) held aligned blocks
/// and is discarded.
const MARKER_TEXT: &str = "cache 2\n";

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

/// Whether `[s, e)` overlaps one of `extents` (offset → (end, key)).
fn overlaps(extents: &BTreeMap<u64, (u64, u64)>, s: u64, e: u64) -> bool {
    extents.range(..e).next_back().is_some_and(|(_, (end, _))| *end > s)
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
        let outbox_dir = opts.dir.join("outbox");
        let data_dir = opts.dir.join("data");
        for d in [&opts.dir, &outbox_dir, &data_dir] {
            crate::fsutil::create_private_dir_all(d).map_err(|e| Error::from_io(&format!("creating {}", d.display()), e))?;
        }
        // Clean files are trusted only after a clean shutdown of a cache of
        // this format; the marker goes before anything is written again.
        let marker = opts.dir.join(CLEAN_MARKER);
        let said = fs::read_to_string(&marker).ok();
        let trusted = said.as_deref() == Some(MARKER_TEXT);
        let older_format = said.is_some_and(|t| t.starts_with("block "));
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
            let Some((name, slot, len)) = parse_data_file(&file) else {
                if older_format {
                    // A block of the cache's first format (`<name>@<index>`).
                    discarded += 1;
                    remove_quietly(&path);
                } else {
                    tracing::warn!("ignoring {} in the cache: not a cache file", path.display());
                }
                continue;
            };
            // An extent is as long as its name says; the outbox's copy of
            // an object wins over cached ones (a crash between an upload's
            // link and the outbox file's removal).
            let bad_size = len.is_some_and(|l| l != md.len());
            if !trusted || bad_size || queued.contains(name.as_str()) {
                discarded += u64::from(!queued.contains(name.as_str()));
                remove_quietly(&path);
                continue;
            }
            data.push(Found { name, slot, bytes: md.len(), mtime: md.modified().unwrap_or(SystemTime::UNIX_EPOCH), path });
        }
        if discarded > 0 {
            let why = if older_format { "the cache's first format, aligned blocks, replaced by extents on 2026-11-29" } else { "no clean shutdown recorded" };
            tracing::warn!("{}: discarded {discarded} cached files ({why}); they are fetched again as needed", opts.dir.display());
        }
        // Least recently modified first, so that the policy's order
        // approximates the last session's.
        data.sort_by(|a, b| (a.mtime, &a.path).cmp(&(b.mtime, &b.path)));

        let mut st = State {
            objects: HashMap::new(),
            entries: HashMap::new(),
            policy,
            outbox: BTreeMap::new(),
            held: Vec::new(),
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
            if f.slot != ALL && st.objects.get(&f.name).is_some_and(|o| overlaps(&o.extents, f.slot, f.slot + f.bytes)) {
                // Extents of one object never overlap; a directory where
                // two do was not written by this cache. Keep the older.
                tracing::warn!("{}: overlaps another cached extent; discarded", f.path.display());
                remove_quietly(&f.path);
                continue;
            }
            st.add_entry(&f.name, f.slot, f.bytes, instant_of(f.mtime));
            // A whole copy tells the object's size.
            let o = st.obj(&f.name);
            if f.slot == ALL && o.size.is_none() {
                o.size = Some(f.bytes);
            }
        }
        if !outbox.is_empty() {
            tracing::info!("{}: {} packs ({} bytes) wait in the outbox and will be uploaded", opts.dir.display(), outbox.len(), st.dirty_bytes);
        }

        let uploaders = opts.uploaders.max(1);
        st.alive = uploaders;
        let inner = Arc::new(Inner {
            remote: Payers::new(remote),
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
                let me = CachedBackend { inner, who: Subsystem::Other, owner: true };
                me.inner.lock().alive -= uploaders - i;
                return Err(Error::from_io("starting the upload threads", e));
            }
        }
        Ok(Arc::new(CachedBackend { inner, who: Subsystem::Other, owner: true }))
    }

    /// Records this cache's events into `t` from now on, starting with
    /// what it holds (docs/trace.md, CACHE).
    pub fn set_trace(&self, t: Arc<TraceWriter>) {
        let inner = &self.inner;
        let st = inner.lock();
        let mut events = vec![Event::CacheOpened { block: inner.opts.block, capacity: inner.opts.capacity, merge: inner.opts.merge_below, ahead: inner.opts.ahead }];
        // Keys grow with admissions: the policy's order.
        let mut held: Vec<(&u64, &Entry)> = st.entries.iter().collect();
        held.sort_unstable_by_key(|(k, _)| **k);
        for (_, e) in held {
            let (event, offset) = if e.slot == ALL { (CacheEvent::Kept, 0) } else { (CacheEvent::Held, e.slot) };
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
            dirty_objects: (st.outbox.len() + st.held.len()) as u64,
            uploads: g(&n.uploads),
            upload_retries: g(&n.upload_retries),
        }
    }

    /// Whether bytes `[off, off+len)` of `name` are here (in the outbox, a
    /// whole cached object, or extents): reading them costs the bucket
    /// nothing (the cleaner's cost of cleaning, docs/frugal.md §5).
    pub fn holds(&self, name: &str, off: u64, len: u64) -> bool {
        let st = self.inner.lock();
        let Some(o) = st.objects.get(name) else { return false };
        if o.dirty.is_some() || o.whole.is_some() {
            return true;
        }
        let none = BTreeMap::new();
        let size = o.size.unwrap_or(u64::MAX);
        len > 0 && off.checked_add(len).is_some_and(|end| extent::plan(&o.extents, |v| v.0, &none, None, off, end, size, FetchRules::default()).gets.is_empty())
    }

    /// Whether `name` is written but not yet uploaded.
    pub fn is_pending(&self, name: &str) -> bool {
        self.inner.lock().is_dirty(name)
    }

    /// Names of objects written but not yet uploaded (the outbox), oldest
    /// first. Held objects are queued first: whoever asks will wait for
    /// them (a metadata version may name them).
    pub fn pending(&self) -> Vec<String> {
        self.release_held();
        self.inner.lock().outbox.values().cloned().collect()
    }

    /// Queues every held object for upload ([`put_held`](Self::put_held)).
    pub fn release_held(&self) {
        let mut st = self.inner.lock();
        self.inner.released(st.release_held());
    }

    /// Writes a pack to the outbox, durable here as [`Backend::put`] with
    /// local durability makes it, but keeps it out of the upload queue:
    /// a later flush round may copy it into a larger pack and drop it
    /// ([`discard_held`](Self::discard_held)), so that small rounds do not
    /// each cost a PUT (docs/frugal.md §7). It is queued by
    /// [`pending`](Self::pending) (the metadata shipper, before a version
    /// that may name it), [`drain`](Self::drain) (the unmount) or the next
    /// open (the outbox is queued whole). With remote durability, or for a
    /// name outside `packs/`, this is a plain put.
    pub fn put_held(&self, name: &str, data: &[u8]) -> Result<()> {
        if !is_pack(name) || self.inner.opts.durability != Durability::Local {
            return self.put(name, data);
        }
        validate_name(name)?;
        self.inner.put_local(name, data, false, self.who)
    }

    /// `name` is held: in the outbox, not queued for upload.
    pub fn is_held(&self, name: &str) -> bool {
        self.inner.lock().held.iter().any(|n| n == name)
    }

    /// Deletes a held object, which was never uploaded, from the outbox;
    /// false if it is not held (it was queued meanwhile: delete it as any
    /// uploaded object). A reader that had found its file sees it vanish
    /// and looks the object up again.
    pub fn discard_held(&self, name: &str) -> bool {
        let inner = &self.inner;
        let mut st = inner.lock();
        if !st.held.iter().any(|n| n == name) {
            return false;
        }
        st.drop_dirty(name);
        let version = st.bump();
        if let Some(o) = st.objects.get_mut(name) {
            o.version = version;
            o.size = None;
        }
        inner.trace(CacheEvent::Dropped, name, 0);
        drop(st);
        let p = inner.outbox_path(name);
        if let Err(e) = fs::remove_file(&p).and_then(|_| fsync_dir(&inner.outbox_dir)) {
            tracing::warn!("removing {}: {e}", p.display());
        }
        inner.wake(); // the outbox shrank
        true
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
        self.inner.released(st.release_held());
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

impl CachedBackend {
    /// [`Backend::get_range`] made for `r`: `r.who` pays for what it
    /// fetches, and the policy learns which file (`r.group`, an inode)
    /// the entries read or fetched serve ([`CachePolicy::grouped`]).
    pub fn get_range_for(&self, r: ReadFor, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        if !is_pack(name) {
            return self.inner.remote.get(r.who).get_range(name, offset, len);
        }
        validate_name(name)?;
        self.inner.read_pack(name, offset, len, r)
    }

    /// [`Backend::get_ranges`] made for `r`: one read of their span, cut
    /// up.
    pub fn get_ranges_for(&self, r: ReadFor, name: &str, ranges: &[(u64, u64)]) -> Result<Vec<Vec<u8>>> {
        let (offset, len) = cairn_backend::span_of(ranges)?;
        cairn_backend::split_span(self.get_range_for(r, name, offset, len)?, ranges)
    }

    /// The remote's handle for this handle's payer.
    fn remote(&self) -> &Arc<dyn Backend> {
        self.inner.remote.get(self.who)
    }
}

impl Drop for CachedBackend {
    fn drop(&mut self) {
        if !self.owner {
            return;
        }
        self.shutdown();
        self.inner.mark_clean();
    }
}

impl Backend for CachedBackend {
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        if !is_pack(name) {
            return self.remote().put(name, data);
        }
        validate_name(name)?;
        match self.inner.opts.durability {
            Durability::Local => self.inner.put_local(name, data, true, self.who),
            Durability::Remote => self.inner.put_remote(name, data, false, self.who),
        }
    }

    fn put_if_absent(&self, name: &str, data: &[u8]) -> Result<()> {
        if !is_pack(name) {
            return self.remote().put_if_absent(name, data);
        }
        validate_name(name)?;
        // A conditional create decides against the remote's state, so it
        // is synchronous whatever the durability.
        self.inner.put_remote(name, data, true, self.who)
    }

    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        if !is_pack(name) {
            return self.remote().get_range(name, offset, len);
        }
        self.get_range_for(ReadFor { who: self.who, group: None }, name, offset, len)
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        if !is_pack(name) {
            return self.remote().get(name);
        }
        validate_name(name)?;
        let size = self.inner.size_of(name, self.who)?;
        self.inner.read_pack(name, 0, size, ReadFor { who: self.who, group: None })
    }

    fn size(&self, name: &str) -> Result<u64> {
        if !is_pack(name) {
            return self.remote().size(name);
        }
        validate_name(name)?;
        self.inner.size_of(name, self.who)
    }

    fn delete(&self, name: &str) -> Result<()> {
        if !is_pack(name) {
            return self.remote().delete(name);
        }
        validate_name(name)?;
        self.inner.delete_pack(name, self.who)
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        self.inner.list(prefix, self.who)
    }

    fn capabilities(&self) -> Capabilities {
        self.remote().capabilities()
    }

    fn sync(&self) -> Result<()> {
        self.remote().sync()
    }

    fn describe(&self) -> String {
        format!("cache {} over {}", self.inner.opts.dir.display(), self.remote().describe())
    }

    fn meter(&self) -> Option<Arc<cairn_backend::Meter>> {
        self.remote().meter()
    }

    fn sequential(&self) -> Option<&dyn cairn_backend::Sequential> {
        self.remote().sequential()
    }

    // Restores are the bucket's business (docs/tiers.md §6).
    fn restore(&self, name: &str, days: u32, speed: cairn_backend::RestoreSpeed) -> Result<()> {
        self.remote().restore(name, days, speed)
    }

    fn restore_state(&self, name: &str) -> Result<cairn_backend::ObjectState> {
        self.remote().restore_state(name)
    }

    fn paid_by(&self, who: Subsystem) -> Option<Arc<dyn Backend>> {
        Some(Arc::new(CachedBackend { inner: self.inner.clone(), who, owner: false }))
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
        assert_eq!(parse_data_file(&format!("{}@all", escape(name))), Some((name.to_string(), ALL, None)));
        assert_eq!(parse_data_file(&format!("{}@17+4096", escape(name))), Some((name.to_string(), 17, Some(4096))));
        assert_eq!(slot_name(17, 4096), "17+4096");
        // The first format's blocks (`@<index>`) are not extents; an extent
        // is never empty and ends before 2^63.
        for bad in ["packs~x", "packs~x@", "packs~x@17", "packs~x@1x+2", "packs~x@-1+2", "packs~x@1+0", "packs~x@1+", "packs~x@+1", "config@all", "packs~~x@1+1", "packs~x@9223372036854775807+1", "packs~x@18446744073709551615+1", "packs~x@1+2+3"] {
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
    fn overlapping_pieces_assemble_the_request() {
        let mut pieces = BTreeMap::new();
        assert_eq!(uncovered(&pieces, 10, 250), vec![(10, 250)]);
        pieces.insert(10u64, (10u8..60).collect::<Vec<u8>>());
        pieces.insert(40u64, (40u8..120).collect::<Vec<u8>>());
        pieces.insert(150u64, (150u8..250).collect::<Vec<u8>>());
        assert_eq!(uncovered(&pieces, 10, 250), vec![(120, 150)]);
        pieces.insert(120u64, (120u8..150).collect::<Vec<u8>>());
        assert!(uncovered(&pieces, 10, 250).is_empty());
        assert_eq!(assemble(&pieces, 10, 250), (10u8..250).collect::<Vec<u8>>());
        assert_eq!(assemble(&pieces, 45, 46), vec![45]);
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
