//! A tape as a [`Backend`] (docs/tape.md §1–3): objects appended as runs of
//! blocks by one drive thread, an in-memory index of them written as the
//! catalog at every sync, reads served in batches sorted by tape position
//! with streaming read-ahead within the run being read.
//!
//! Contract beyond [`Backend`]'s, declared in [`Capabilities`]: a put is
//! durable once a later [`Backend::sync`] returns (it lands in memory and
//! then the drive's buffer); deletes are logical (the index marks the
//! object dead, its blocks stay until the tape is reclaimed); one process
//! has a tape open at a time (the device is locked while open).
//!
//! Every object starts with a small head naming it (docs/format.md, "Tape
//! objects"), so [`recover`] can rebuild the index from the blocks alone.

pub use crate::index::{decode_catalog, encode_catalog, object_head, parse_object_head, CatalogPayload, Index, IndexEntry, InlinePolicy, InlineSpan, INDEX_FORMAT, INDEX_VERSION, INLINE_MAX, OBJECT_MAGIC};
use crate::layout::{self, AppendPoint, Extent, Label, LayoutError, VolumeId};
use crate::TapeDevice;
use cairn_backend::{validate_name, Backend, Backlog, Capabilities, Error, ErrorKind, ObjectInfo, Result};
use parking_lot::{Condvar, Mutex, MutexGuard};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes read from the tape per step of a streaming read.
const READ_STEP: u64 = 8 << 20;
/// Idle this long after the open, a store with
/// [`StoreOptions::prepare_append`] moves the tape to the append point.
const PREPARE_AFTER: Duration = Duration::from_millis(500);
/// After its last write the drive is still emptying its buffer onto the
/// tape for about this long: data arriving within it keeps the tape moving.
const STREAMING_GRACE: Duration = Duration::from_secs(3);

/// How the store uses memory and batches reads.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Bytes of objects waiting for the drive; a put blocks beyond it.
    pub queue_bytes: u64,
    /// A read streams on this far ahead of what was asked, within the
    /// object, while nothing else needs the drive.
    pub read_ahead: u64,
    /// Bytes of read data kept in memory (oldest dropped first).
    pub read_buffer: u64,
    /// A read waits this long for others to join its batch.
    pub batch_window: Duration,
    /// The largest pack the engine should build for this store: packs
    /// are built and queued whole, so their size sets the memory a write
    /// needs (docs/tape.md §10).
    pub pack_size: u64,
    /// When the drive falls idle after the open (and the mount's own
    /// reads), locate to where the next append goes, so the first write
    /// streams at once instead of paying a locate (seconds) while writers
    /// wait; a later read pays at most the locate it needed anyway. For a
    /// read-write mount; a short look (`tape info`) leaves it off.
    pub prepare_append: bool,
    /// When the drive falls idle after the open of a store that will only
    /// read (a read-only mount: a restore), locate to the first object on
    /// the tape a mount has not already got from the catalog: where a
    /// restore in tape order starts, and the oldest files. Catalog reading
    /// leaves the tape at the end of data, the farthest point from them;
    /// the locate happens before anyone waits for it. Given up once a read
    /// of such an object has moved the tape. Ignored with `prepare_append`.
    pub prepare_read: bool,
    /// Which objects every catalog carries inline (docs/tape.md §8), so a
    /// mount reads them with the catalog instead of locating to each. The
    /// store keeps their bytes in memory (at most the policy's
    /// `max_bytes`). None: catalogs carry only the index.
    pub inline: Option<InlinePolicy>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions::for_memory(DEFAULT_MEMORY)
    }
}

/// The memory a mount gives a tape by default (`--tape-memory`).
pub const DEFAULT_MEMORY: u64 = 1 << 30;

/// The least memory [`StoreOptions::for_memory`] takes: room for two
/// packs being built and two queued, of a few MiB each.
pub const MIN_MEMORY: u64 = 16 << 20;

/// The largest pack a store asks for: the default pack size of a tape
/// volume (`cairn init`), whose runs it was measured with.
const MAX_PACK: u64 = 64 << 20;

impl StoreOptions {
    /// Options that keep the data a write holds within `memory` bytes
    /// (docs/tape.md §10): packs of a quarter of it (at most 64 MiB, which
    /// is `cairn init`'s default for a tape), two of them being built by
    /// the engine and the rest of the budget queued for the drive. Reads
    /// keep a quarter of it (32-256 MiB) and read a sixteenth ahead
    /// (16-64 MiB). At least [`MIN_MEMORY`].
    pub fn for_memory(memory: u64) -> StoreOptions {
        let memory = memory.max(MIN_MEMORY);
        let pack_size = (memory / 4).min(MAX_PACK);
        StoreOptions {
            queue_bytes: memory - 2 * pack_size,
            read_ahead: (memory / 16).clamp(16 << 20, 64 << 20),
            read_buffer: (memory / 4).clamp(32 << 20, 256 << 20),
            batch_window: Duration::from_millis(50),
            pack_size,
            prepare_append: false,
            prepare_read: false,
            inline: None,
        }
    }
}

/// What the drive thread is asked to write.
struct Job {
    name: String,
    id: u64,
    data: Arc<Vec<u8>>,
}

/// A read waiting for its batch.
struct ReadReq {
    name: String,
    off: u64,
    len: u64,
    at: Instant,
    done: Mutex<Option<Result<Vec<u8>>>>,
}

/// Counters for `cairn stats` and the benchmarks.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct StoreStats {
    /// Bytes of objects written to the tape (heads not counted).
    pub bytes_written: u64,
    /// Objects written.
    pub objects_written: u64,
    /// Read batches the drive served.
    pub read_batches: u64,
    /// Reads that needed the drive.
    pub reads_from_tape: u64,
    /// Reads served from memory (objects not yet written, read-ahead).
    pub reads_from_memory: u64,
    /// Bytes read from the tape, read-ahead included.
    pub bytes_read: u64,
    /// Catalogs written.
    pub catalogs_written: u64,
    /// Objects the last catalog written carried inline, and their bytes.
    #[serde(default)]
    pub catalog_inline: (u64, u64),
    /// Reads served from inline copies (the catalog's, or kept to go in it).
    #[serde(default)]
    pub reads_inline: u64,
    /// Bytes of live objects a read passed over on the way to its data,
    /// kept in the read buffer (counted in `bytes_read` too).
    #[serde(default)]
    pub bytes_passed_kept: u64,
    /// Reads that joined a pass already under way (they lay ahead of it).
    #[serde(default)]
    pub reads_joined_pass: u64,
    /// The most bytes the write queue held.
    pub peak_queue_bytes: u64,
}

/// A streaming read: the object and how far it has been read and used.
struct Stream {
    name: String,
    /// Next byte to read from the tape.
    next: u64,
    /// Highest byte a reader has taken.
    used: u64,
}

struct State {
    index: Index,
    /// Object id → the name whose index entry has that id: what a pass
    /// read over is looked up by id (`keep_passed`), per run, not by a
    /// walk of the whole index.
    by_id: HashMap<u64, String>,
    queue: VecDeque<Job>,
    queued_bytes: u64,
    /// Objects put and not yet on tape (queued or being written): readable.
    in_flight: HashMap<String, Arc<Vec<u8>>>,
    reads: Vec<Arc<ReadReq>>,
    /// Bytes of the objects the inline policy chose, kept for the next
    /// catalog; each equals the object's bytes on (or queued for) the tape.
    inline: BTreeMap<String, Arc<Vec<u8>>>,
    /// Read data kept: (object, first byte, bytes), oldest first.
    read_buf: Kept,
    /// Data a read passed over (kept apart: it never pushes out what a
    /// reader asked for and has not taken yet).
    passed_buf: Kept,
    stream: Option<Stream>,
    want_sync: u64,
    synced: u64,
    /// Written or deleted since the last catalog.
    dirty: bool,
    /// When the drive thread last finished writing an object.
    last_write: Option<Instant>,
    /// The drive should go to the append point when next idle
    /// ([`StoreOptions::prepare_append`]).
    want_prepare: bool,
    /// A write failed: every later put and sync fails so (the data before
    /// it stays readable).
    failed: Option<(ErrorKind, String)>,
    stop: bool,
    stats: StoreStats,
}

struct Inner {
    describe: String,
    opts: StoreOptions,
    st: Mutex<State>,
    cv: Condvar,
}

/// A tape behind the [`Backend`] trait.
pub struct TapeStore {
    inner: Arc<Inner>,
    thread: Mutex<Option<std::thread::JoinHandle<Parked>>>,
    /// The device and writer while no drive thread runs ([`TapeStore::park`]).
    parked: Mutex<Option<Parked>>,
    label: Label,
    data_end_at_open: u64,
}

fn layout_err(dev: &str, e: LayoutError) -> Error {
    let kind = match &e {
        LayoutError::EndOfMedium { .. } => ErrorKind::NoSpace,
        LayoutError::Device(crate::DeviceError::EndOfMedium { .. }) => ErrorKind::NoSpace,
        LayoutError::BadBlock { .. } | LayoutError::DamagedCatalog { .. } | LayoutError::DamagedLabel { .. } | LayoutError::NoCatalog { .. } => ErrorKind::Corrupt,
        _ => ErrorKind::Permanent,
    };
    let msg = e.to_string();
    let msg = if msg.contains(dev) { msg } else { format!("{dev}: {msg}") };
    Error::new(kind, msg)
}

impl TapeStore {
    /// Opens the tape in `dev`: reads its label (checking the volume when
    /// `expect` is given) and its catalog, and starts the drive thread,
    /// which appends after the last data. A blank tape is formatted first
    /// when `format_blank`.
    pub fn open(mut dev: Box<dyn TapeDevice>, opts: StoreOptions, expect: Option<VolumeId>, format_blank: bool) -> Result<TapeStore> {
        let name = dev.name().to_string();
        let mut passed = Passed::new(opts.read_buffer / 2);
        let (label, payload, at) = match layout::read_label(dev.as_mut(), expect) {
            Ok(label) => {
                let cat = layout::read_catalog_passing(dev.as_mut(), &label, None, &mut |h, p| passed.add(h, p)).map_err(|e| layout_err(&name, e))?;
                let payload = decode_catalog(&cat.bytes).map_err(|e| Error::new(ErrorKind::Corrupt, format!("{name}: damaged catalog: {e}; run `cairn tape recover` to rebuild it from the blocks")))?;
                (label, payload, cat.append_point())
            }
            Err(LayoutError::BlankTape { .. }) if format_blank => {
                let label = Label::new(VolumeId(rand::random()), dev.block_size() as u32, now_secs(), b"");
                let payload = CatalogPayload::default();
                let loc = layout::format(dev.as_mut(), &label, &encode_catalog(&payload.index, &[])).map_err(|e| layout_err(&name, e))?;
                dev.flush().map_err(|e| layout_err(&name, e.into()))?;
                (label, payload, loc.append_point())
            }
            Err(e) => return Err(layout_err(&name, e)),
        };
        let s = Self::start(dev, opts, label, payload, at);
        // The objects written last, read with the catalog: not read again.
        keep_passed(&s.inner, &mut s.inner.st.lock(), passed);
        Ok(s)
    }

    fn start(dev: Box<dyn TapeDevice>, opts: StoreOptions, label: Label, payload: CatalogPayload, at: AppendPoint) -> TapeStore {
        let CatalogPayload { index, inline } = payload;
        let by_id = index.objects.iter().map(|(n, e)| (e.id, n.clone())).collect();
        let inline = inline.into_iter().map(|(n, d)| (n, Arc::new(d))).collect();
        let want_prepare = opts.prepare_append || opts.prepare_read;
        let describe = format!("tape {} (volume {})", dev.name(), label.volume_id);
        let inner = Arc::new(Inner {
            describe,
            opts,
            st: Mutex::new(State {
                index,
                by_id,
                inline,
                queue: VecDeque::new(),
                queued_bytes: 0,
                in_flight: HashMap::new(),
                reads: Vec::new(),
                read_buf: Kept::default(),
                passed_buf: Kept::default(),
                stream: None,
                want_sync: 0,
                synced: 0,
                dirty: false,
                last_write: None,
                want_prepare,
                failed: None,
                stop: false,
                stats: StoreStats::default(),
            }),
            cv: Condvar::new(),
        });
        let data_end_at_open = at.data_end;
        let writer = layout::TapeWriter::new(&label, at);
        let s = TapeStore { inner, thread: Mutex::new(None), parked: Mutex::new(None), label, data_end_at_open };
        s.spawn_drive(Parked { dev, writer });
        s
    }

    fn spawn_drive(&self, p: Parked) {
        let (i2, l2) = (self.inner.clone(), self.label.clone());
        let thread = std::thread::Builder::new().name("cairn-tape-drive".into()).spawn(move || drive(&i2, p.dev, &l2, p.writer)).expect("spawning the drive thread");
        *self.thread.lock() = Some(thread);
    }

    /// Stops the drive thread after what is queued and keeps the device,
    /// so the process holds no thread of this store: it may then fork,
    /// and the child (only) calls [`TapeStore::unpark`] to go on with the
    /// tape as it is, without opening it again (seconds of positioning on
    /// a full tape). The parent must not use the store after the fork, nor
    /// drop it (that would close the child's drive): `std::mem::forget`.
    pub fn park(&self) {
        let Some(t) = self.thread.lock().take() else { return };
        {
            let mut st = self.inner.st.lock();
            st.stop = true;
            self.inner.cv.notify_all();
        }
        let p = t.join().expect("the drive thread does not panic");
        self.inner.st.lock().stop = false;
        *self.parked.lock() = Some(p);
    }

    /// Starts the drive thread again after [`TapeStore::park`].
    pub fn unpark(&self) {
        if let Some(p) = self.parked.lock().take() {
            self.spawn_drive(p);
        }
    }

    /// The block where data ended when the tape was opened (what `tape
    /// info` counts as used: the label, the objects and the catalogs).
    pub fn data_end_at_open(&self) -> u64 {
        self.data_end_at_open
    }

    /// The tape's label.
    pub fn label(&self) -> &Label {
        &self.label
    }

    /// Counters since the store was opened.
    pub fn stats(&self) -> StoreStats {
        self.inner.st.lock().stats
    }

    /// Live and dead bytes of the objects on the tape.
    pub fn space(&self) -> (u64, u64) {
        self.inner.st.lock().index.space()
    }

    /// A copy of the index (for `tape reclaim` and tests).
    pub fn index(&self) -> Index {
        self.inner.st.lock().index.clone()
    }

    /// The id the next put takes. Ids grow with every put; once a sync has
    /// returned, the tape never hands out an id below the value read before
    /// it (its catalog, or `recover`, keeps the counter), so a copy of the
    /// objects kept elsewhere (the engine's CDP mirror) can name what it
    /// holds by "everything put before id N".
    pub fn next_id(&self) -> u64 {
        self.inner.st.lock().index.next_id
    }

    /// Names of the live objects put with an id of at least `id`, and of
    /// every object not yet on tape.
    pub fn names_since(&self, id: u64) -> Vec<String> {
        let st = self.inner.st.lock();
        let mut v: Vec<String> = st.index.objects.iter().filter(|(_, e)| !e.dead && e.id >= id).map(|(n, _)| n.clone()).collect();
        v.extend(st.in_flight.keys().filter(|n| !st.index.objects.get(*n).is_some_and(|e| !e.dead && e.id >= id)).cloned());
        v
    }

    /// Reads many ranges in one pass in tape order (`cairn tape recall`):
    /// they join one batch at once.
    pub fn read_many(&self, reqs: &[(String, u64, u64)]) -> Vec<Result<Vec<u8>>> {
        let past = Instant::now().checked_sub(self.inner.opts.batch_window).unwrap_or_else(Instant::now);
        let rs: Vec<Arc<ReadReq>> = reqs.iter().map(|(n, o, l)| Arc::new(ReadReq { name: n.clone(), off: *o, len: *l, at: past, done: Mutex::new(None) })).collect();
        {
            let mut st = self.inner.st.lock();
            st.reads.extend(rs.iter().cloned());
            self.inner.cv.notify_all();
        }
        rs.iter().map(|r| self.inner.wait_read(r)).collect()
    }

    /// Stops the drive thread after what is queued and gives the device
    /// back, writing no catalog (a store closed without a sync is a crash
    /// as far as the tape can tell).
    pub fn into_device(self) -> Option<Box<dyn TapeDevice>> {
        self.stop()
    }

    fn stop(&self) -> Option<Box<dyn TapeDevice>> {
        {
            let mut st = self.inner.st.lock();
            st.stop = true;
            self.inner.cv.notify_all();
        }
        let t = self.thread.lock().take();
        t.and_then(|t| t.join().ok()).or_else(|| self.parked.lock().take()).map(|p| p.dev)
    }

    fn live(&self, name: &str) -> Result<IndexEntry> {
        match self.inner.st.lock().index.objects.get(name) {
            Some(e) if !e.dead => Ok(e.clone()),
            _ => Err(not_found(name)),
        }
    }
}

fn not_found(name: &str) -> Error {
    Error::new(ErrorKind::NotFound, format!("object {name} does not exist")).with_object(name)
}

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Inner {
    fn wait_read(&self, r: &ReadReq) -> Result<Vec<u8>> {
        let mut st = self.st.lock();
        loop {
            if let Some(res) = r.done.lock().take() {
                return res;
            }
            if st.stop {
                return Err(Error::new(ErrorKind::Permanent, format!("{}: closed", self.describe)));
            }
            self.cv.wait(&mut st);
        }
    }
}

/// Serves `[off, off+len)` of `name` from memory: an object not yet on
/// tape, or data read earlier.
fn from_memory(st: &mut State, name: &str, off: u64, len: u64) -> Option<Vec<u8>> {
    let end = off.checked_add(len)?;
    if let Some(d) = st.in_flight.get(name) {
        if end <= d.len() as u64 {
            st.stats.reads_from_memory += 1;
            return Some(d[off as usize..end as usize].to_vec());
        }
        return None;
    }
    if let Some(d) = st.inline.get(name).filter(|d| end <= d.len() as u64) {
        st.stats.reads_inline += 1;
        return Some(d[off as usize..end as usize].to_vec());
    }
    let out = memory_prefix(st, name, off, end);
    if (out.len() as u64) < len {
        return None;
    }
    st.stats.reads_from_memory += 1;
    if let Some(s) = st.stream.as_mut().filter(|s| s.name == name) {
        s.used = s.used.max(end);
    }
    Some(out)
}

/// The bytes of `[off, end)` of `name` that read data kept in memory holds
/// from `off` on without a gap (a range may span pieces read one after
/// another; the rest must come from the tape).
fn memory_prefix(st: &State, name: &str, off: u64, end: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = off;
    while at < end {
        let Some(piece) = st.read_buf.find(name, at).or_else(|| st.passed_buf.find(name, at)) else { break };
        let a = (at - piece.1) as usize;
        let b = ((end - piece.1) as usize).min(piece.2.len());
        out.extend_from_slice(&piece.2[a..b]);
        at = piece.1 + b as u64;
    }
    out
}

/// Where the first live object a reader still needs starts: the lowest
/// first block of the live objects whose bytes are not kept inline.
fn first_to_read(st: &State) -> Option<u64> {
    st.index.objects.iter().filter(|(n, e)| !e.dead && !st.inline.contains_key(*n)).filter_map(|(_, e)| e.extents.first().map(|x| x.start)).min()
}

/// The names the inline policy chooses among the live objects, those on
/// the tape and those queued for it.
fn inline_choice(st: &State, p: &InlinePolicy) -> Vec<String> {
    let mut names: Vec<&str> = Vec::new();
    for prefix in &p.prefixes {
        names.extend(st.index.objects.range(prefix.clone()..).take_while(|(n, _)| n.starts_with(prefix.as_str())).filter(|(_, e)| !e.dead).map(|(n, _)| n.as_str()));
    }
    names.extend(st.in_flight.keys().filter(|n| p.covers(n)).map(String::as_str));
    names.sort_unstable();
    names.dedup();
    (p.choose)(&names)
}

/// Keeps `data` (when given) as the bytes of `name` if the inline policy
/// wants it, and lets go of what it no longer wants. Over the policy's
/// bound nothing is kept: the mount then locates to each object, as
/// before catalogs carried any.
fn keep_inline(opts: &StoreOptions, st: &mut State, name: &str, data: Option<Arc<Vec<u8>>>) {
    let Some(p) = opts.inline.as_ref().filter(|p| p.covers(name)) else { return };
    if let Some(d) = data {
        st.inline.insert(name.to_string(), d);
    }
    let want: std::collections::HashSet<String> = inline_choice(st, p).into_iter().collect();
    st.inline.retain(|n, _| want.contains(n));
    let bytes: u64 = st.inline.values().map(|d| d.len() as u64).sum();
    if bytes > p.max_bytes {
        tracing::info!("the metadata a mount reads first is {bytes} bytes, over the {} a catalog carries inline: mounts locate to each object", p.max_bytes);
        st.inline.clear();
    }
}

/// The catalog's payload: the index, and the objects the inline policy
/// chooses whose bytes are at hand and already on the tape as the index
/// says (a copy still queued is not: the catalog describes the tape).
fn catalog_payload(opts: &StoreOptions, st: &mut State) -> Vec<u8> {
    let chosen = opts.inline.as_ref().map(|p| inline_choice(st, p)).unwrap_or_default();
    let inline: Vec<(&str, &[u8])> = chosen
        .iter()
        .filter(|n| !st.in_flight.contains_key(*n))
        .filter_map(|n| {
            let d = st.inline.get(n)?;
            st.index.objects.get(n).filter(|e| !e.dead && e.size == d.len() as u64).map(|_| (n.as_str(), d.as_slice()))
        })
        .collect();
    if inline.len() < chosen.len() {
        tracing::debug!("the catalog carries {} of the {} objects a mount reads first (the rest are not at hand)", inline.len(), chosen.len());
    }
    let out = encode_catalog(&st.index, &inline);
    let n = (inline.len() as u64, inline.iter().map(|(_, d)| d.len() as u64).sum());
    st.stats.catalog_inline = n;
    out
}

/// Object bytes one block carries (the block less its header).
fn payload_per_block(label: &Label) -> u64 {
    (label.block_size as usize - layout::HEADER_LEN) as u64
}

/// `len` stretched so that a read of `[from, from+len)` of object `e` ends
/// at the end of a block (or of the object): the next read then starts at
/// the next block, where the tape already is, instead of locating back
/// into the block this one ended in.
fn to_block_end(e: &IndexEntry, from: u64, len: u64, cap: u64) -> u64 {
    let end = (e.head + from + len).div_ceil(cap) * cap;
    end.min(e.head + e.size) - e.head - from
}

/// Blocks of `e` (an object's run, head included) holding bytes
/// `[a, b)` of the object as stored.
fn sub_extent(e: &Extent, a: u64, b: u64, cap: u64) -> Option<Extent> {
    let (lo, hi) = (a.max(e.offset), b.min(e.offset + e.len));
    if lo >= hi {
        return None;
    }
    let i0 = (lo - e.offset) / cap;
    let i1 = (hi - e.offset).div_ceil(cap);
    Some(Extent { object_id: e.object_id, start: e.start + i0, blocks: i1 - i0, first_seq: e.first_seq + i0, offset: e.offset + i0 * cap, len: (i1 * cap).min(e.len) - i0 * cap })
}

/// Reads bytes `[off, off+len)` of an object (offsets past its head).
/// Object bytes kept in memory, oldest first: (object, first byte, bytes).
#[derive(Default)]
struct Kept {
    pieces: VecDeque<(String, u64, Arc<Vec<u8>>)>,
    bytes: u64,
}

impl Kept {
    /// Keeps `bytes` at `off` of `name`, dropping the oldest pieces beyond
    /// `bound` bytes.
    fn push(&mut self, name: &str, off: u64, bytes: Vec<u8>, bound: u64) {
        self.bytes += bytes.len() as u64;
        self.pieces.push_back((name.to_string(), off, Arc::new(bytes)));
        while self.bytes > bound {
            let (_, _, old) = self.pieces.pop_front().expect("bytes were counted");
            self.bytes -= old.len() as u64;
        }
    }

    /// The newest piece of `name` holding byte `at`.
    fn find(&self, name: &str, at: u64) -> Option<&(String, u64, Arc<Vec<u8>>)> {
        self.pieces.iter().rev().find(|(n, s, d)| n == name && *s <= at && at < s + d.len() as u64)
    }
}

/// Data blocks a read passed over on its way to what it was asked for,
/// gathered into runs per object: (object id, offset within the object's
/// stored bytes, its head included, bytes). The last `budget` bytes (half
/// the read buffer: with the buffer itself, memory stays within 1.5 times
/// it while they are handed over) are
/// kept (the ones nearest where the tape is going), in runs of at most
/// [`READ_STEP`] so the oldest go a piece at a time.
struct Passed {
    runs: VecDeque<(u64, u64, Vec<u8>)>,
    bytes: u64,
    budget: u64,
}

impl Passed {
    fn new(budget: u64) -> Self {
        Passed { runs: VecDeque::new(), bytes: 0, budget }
    }

    fn add(&mut self, h: &layout::BlockHeader, payload: &[u8]) {
        if payload.len() as u64 > self.budget {
            return;
        }
        self.bytes += payload.len() as u64;
        match self.runs.back_mut() {
            Some((id, off, d)) if *id == h.object_id && *off + d.len() as u64 == h.offset && (d.len() as u64) < READ_STEP => d.extend_from_slice(payload),
            _ => self.runs.push_back((h.object_id, h.offset, payload.to_vec())),
        }
        while self.bytes > self.budget {
            let (_, _, d) = self.runs.pop_front().expect("bytes were counted");
            self.bytes -= d.len() as u64;
        }
    }
}

/// Keeps what a read passed over that belongs to live objects a reader may
/// still ask for (not kept inline, not being written): a whole-tree read
/// in any order then passes the tape once instead of locating back for
/// data it has already read through (docs/tape.md §8, "No over-reading").
fn keep_passed(inner: &Inner, st: &mut State, passed: Passed) {
    if passed.runs.is_empty() {
        return;
    }
    for (id, off, mut d) in passed.runs {
        // A live object's copy that no inline copy or queued put answers.
        let Some(name) = st.by_id.get(&id) else { continue };
        let Some(head) = st.index.objects.get(name).filter(|e| !e.dead && e.id == id).map(|e| e.head) else { continue };
        if st.inline.contains_key(name) || st.in_flight.contains_key(name) {
            continue;
        }
        let name = name.clone();
        // The object's bytes start after its head.
        let skip = head.saturating_sub(off) as usize;
        if skip < d.len() {
            d.drain(..skip);
            st.stats.bytes_passed_kept += d.len() as u64;
            st.stats.bytes_read += d.len() as u64;
            st.passed_buf.push(&name, off + skip as u64 - head, d, inner.opts.read_buffer / 2);
        }
    }
}

/// Reads `[off, off+len)` of an object from the tape, from the start of the
/// block holding `off`: returns where the bytes start (at or before `off`)
/// and the bytes. The block's earlier bytes come with the read; kept, a
/// later read just before `off` finds them.
fn read_range(dev: &mut dyn TapeDevice, label: &Label, e: &IndexEntry, off: u64, len: u64, passed: &mut Passed) -> layout::Result<(u64, Vec<u8>)> {
    let cap = payload_per_block(label);
    let (a, b) = ((e.head + off) / cap * cap, e.head + off + len);
    let a = a.max(e.head);
    let mut subs: Vec<Extent> = e.extents.iter().filter_map(|x| sub_extent(x, a, b, cap)).collect();
    subs.sort_by_key(|x| x.start);
    let mut out = vec![0u8; (b - a) as usize];
    let sink = |_: &Extent, at: u64, payload: &[u8]| {
        let (p0, p1) = (at, at + payload.len() as u64);
        let (lo, hi) = (p0.max(a), p1.min(b));
        if lo < hi {
            out[(lo - a) as usize..(hi - a) as usize].copy_from_slice(&payload[(lo - p0) as usize..(hi - p0) as usize]);
        }
        Ok(())
    };
    layout::read_extents_passing(dev, label, &subs, sink, &mut |h, p| passed.add(h, p))?;
    Ok((a - e.head, out))
}

/// The drive thread: writes queued objects in order; serves read batches
/// in position order; writes the catalog when a sync asks; streams the
/// current read ahead when nothing else needs the drive. Returns the
/// device when stopped.
/// What the drive thread holds, given back when it stops.
struct Parked {
    dev: Box<dyn TapeDevice>,
    writer: layout::TapeWriter,
}

fn drive(inner: &Inner, mut dev: Box<dyn TapeDevice>, label: &Label, mut writer: layout::TapeWriter) -> Parked {
    let name = dev.name().to_string();
    let mut st = inner.st.lock();
    loop {
        if let Some(job) = st.queue.pop_front() {
            if st.failed.is_some() {
                // Nothing more goes on a tape that failed a write.
                st.queued_bytes -= job.data.len() as u64;
                st.in_flight.remove(&job.name);
                inner.cv.notify_all();
                continue;
            }
            st.stream = None;
            let t = Instant::now();
            let r = MutexGuard::unlocked(&mut st, || {
                let head = object_head(&job.name);
                writer.write_parts(dev.as_mut(), job.id, &head, &job.data, true).map(|x| (x, head.len() as u64))
            });
            st.queued_bytes -= job.data.len() as u64;
            tracing::debug!("{name}: wrote {} ({} bytes) in {:.2?}", job.name, job.data.len(), t.elapsed());
            st.last_write = Some(Instant::now());
            st.want_prepare = false;
            // Deleted while it waited: on the tape all the same, but dead.
            let deleted = !st.in_flight.contains_key(&job.name);
            match r {
                Ok((extent, head)) => {
                    let size = job.data.len() as u64;
                    if let Some(old) = st.index.objects.insert(job.name.clone(), IndexEntry { id: job.id, size, head, extents: vec![extent], dead: deleted }) {
                        if !old.dead {
                            st.index.replaced_bytes += old.size;
                        }
                        st.by_id.remove(&old.id);
                    }
                    st.by_id.insert(job.id, job.name.clone());
                    st.stats.bytes_written += size;
                    st.stats.objects_written += 1;
                    st.dirty = true;
                }
                Err(e) => {
                    let e = layout_err(&name, e);
                    tracing::error!("writing {} to the tape: {e}", job.name);
                    st.failed.get_or_insert((e.kind(), e.to_string()));
                    if e.kind() == ErrorKind::NoSpace {
                        // The append erased the last catalog; the early
                        // warning zone keeps room for one naming what is
                        // on the tape, so it still mounts.
                        let c = catalog_payload(&inner.opts, &mut st);
                        match MutexGuard::unlocked(&mut st, || writer.write_catalog(dev.as_mut(), &c)) {
                            Ok(_) => st.dirty = false,
                            Err(e) => tracing::error!("writing the catalog at the end of the medium: {e}"),
                        }
                    }
                }
            }
            if st.in_flight.get(&job.name).is_some_and(|d| Arc::ptr_eq(d, &job.data)) {
                st.in_flight.remove(&job.name);
            }
            inner.cv.notify_all();
            continue;
        }
        if !st.reads.is_empty() {
            // A batch gathers while requests keep coming (each within the
            // window of the last), up to eight windows from the first: a
            // reader whose open took longer than the others still joins.
            let oldest = st.reads.iter().map(|r| r.at).min().expect("not empty");
            let newest = st.reads.iter().map(|r| r.at).max().expect("not empty");
            let due = (newest + inner.opts.batch_window).min(oldest + 8 * inner.opts.batch_window);
            if Instant::now() < due && !st.stop && st.want_sync == st.synced {
                inner.cv.wait_until(&mut st, due);
                continue;
            }
            let batch = std::mem::take(&mut st.reads);
            st.stats.read_batches += 1;
            if inner.opts.prepare_read && !inner.opts.prepare_append && batch.iter().any(|r| !st.inline.contains_key(&r.name)) {
                // The reader has chosen where the tape goes.
                st.want_prepare = false;
            }
            serve_batch(inner, &mut st, dev.as_mut(), label, batch);
            inner.cv.notify_all();
            continue;
        }
        if st.want_sync > st.synced {
            let want = st.want_sync;
            let catalog = (st.dirty && st.failed.is_none()).then(|| catalog_payload(&inner.opts, &mut st));
            let t = Instant::now();
            let r = MutexGuard::unlocked(&mut st, || match catalog {
                Some(c) => writer.write_catalog(dev.as_mut(), &c).map(Some),
                None => writer.flush(dev.as_mut()).map(|()| None),
            });
            match r {
                Ok(Some(_)) => {
                    st.dirty = false;
                    st.stats.catalogs_written += 1;
                }
                Ok(None) => {}
                Err(e) => {
                    let e = layout_err(&name, e);
                    tracing::error!("syncing the tape: {e}");
                    st.failed.get_or_insert((e.kind(), e.to_string()));
                }
            }
            tracing::debug!("{name}: synced in {:.2?}", t.elapsed());
            st.synced = want;
            inner.cv.notify_all();
            continue;
        }
        if st.stop {
            return Parked { dev, writer };
        }
        if stream_ahead(inner, &mut st, dev.as_mut(), label) {
            inner.cv.notify_all();
            continue;
        }
        if st.want_prepare && st.failed.is_none() {
            // Only once the drive has been idle a moment: a short-lived
            // open (a check, an unmount right after) must not pay a locate.
            if !inner.cv.wait_until(&mut st, Instant::now() + PREPARE_AFTER).timed_out() {
                continue;
            }
            if st.stop || !st.queue.is_empty() || !st.reads.is_empty() || st.want_sync > st.synced {
                continue;
            }
            st.want_prepare = false;
            if inner.opts.prepare_append {
                if let Err(e) = MutexGuard::unlocked(&mut st, || writer.prepare(dev.as_mut())) {
                    // The next write locates by itself (and reports what fails).
                    tracing::warn!("{name}: moving to the append point: {e}");
                }
            } else if let Some(at) = first_to_read(&st) {
                if let Err(e) = MutexGuard::unlocked(&mut st, || dev.locate(at)) {
                    tracing::warn!("{name}: moving to the first object to read: {e}");
                }
            }
            continue;
        }
        inner.cv.wait(&mut st);
    }
}

/// Keeps a sequential reader fed: reads the next step of the object being
/// streamed while less than the read-ahead lies ahead of what was used.
/// Returns whether it read.
fn stream_ahead(inner: &Inner, st: &mut MutexGuard<'_, State>, dev: &mut dyn TapeDevice, label: &Label) -> bool {
    let Some(s) = st.stream.as_ref() else { return false };
    let Some(e) = st.index.objects.get(&s.name).filter(|e| !e.dead).cloned() else {
        st.stream = None;
        return false;
    };
    if s.next >= e.size || s.next - s.used.min(s.next) >= inner.opts.read_ahead {
        return false;
    }
    let (name, off) = (s.name.clone(), s.next);
    let cap = payload_per_block(label);
    let len = to_block_end(&e, off, READ_STEP.min(e.size - off), cap);
    let mut passed = Passed::new(inner.opts.read_buffer / 2);
    let read = MutexGuard::unlocked(st, || read_range(dev, label, &e, off, len, &mut passed));
    keep_passed(inner, st, passed);
    match read {
        Ok((start, bytes)) => {
            keep_read(inner, st, &name, start, bytes);
            if let Some(s) = st.stream.as_mut().filter(|s| s.name == name) {
                s.next = off + len;
            }
        }
        Err(err) => {
            tracing::warn!("reading ahead in {name}: {err}");
            st.stream = None;
        }
    }
    true
}

fn keep_read(inner: &Inner, st: &mut State, name: &str, off: u64, bytes: Vec<u8>) {
    st.stats.bytes_read += bytes.len() as u64;
    st.read_buf.push(name, off, bytes, inner.opts.read_buffer);
}

/// Serves a batch in order of tape position, each read taking at least one
/// read step so the reader's next request finds its data in memory.
fn serve_batch(inner: &Inner, st: &mut MutexGuard<'_, State>, dev: &mut dyn TapeDevice, label: &Label, mut batch: Vec<Arc<ReadReq>>) {
    let cap = payload_per_block(label);
    let pos = |st: &State, r: &ReadReq| {
        st.index.objects.get(&r.name).and_then(|e| e.extents.iter().find_map(|x| sub_extent(x, e.head + r.off, e.head + r.off + 1, cap)).map(|x| x.start)).unwrap_or(u64::MAX)
    };
    batch.sort_by_cached_key(|r| pos(st, r));
    batch.reverse();
    // One pass up the tape (an elevator): a request that arrives while
    // the pass is under way joins it if it lies ahead of where the tape
    // is; one behind waits for the next pass.
    let mut at = 0u64;
    while let Some(r) = batch.pop() {
        at = at.max(pos(st, &r).min(u64::MAX - 1));
        if !st.reads.is_empty() {
            let (ahead, behind): (Vec<_>, Vec<_>) = std::mem::take(&mut st.reads).into_iter().partition(|q| pos(st, q) >= at);
            st.reads = behind;
            if !ahead.is_empty() {
                st.stats.reads_joined_pass += ahead.len() as u64;
                batch.extend(ahead);
                batch.sort_by_cached_key(|q| std::cmp::Reverse(pos(st, q)));
            }
        }
        let res = (|| {
            if let Some(d) = from_memory(st, &r.name, r.off, r.len) {
                return Ok(d);
            }
            let e = st.index.objects.get(&r.name).filter(|e| !e.dead).cloned().ok_or_else(|| not_found(&r.name))?;
            let end = r.off.checked_add(r.len).filter(|&x| x <= e.size).ok_or_else(|| {
                Error::new(ErrorKind::OutOfRange, format!("object {}: range {}+{} past its end ({} bytes)", r.name, r.off, r.len, e.size)).with_object(&r.name)
            })?;
            // What read-ahead already holds is not read again: the tape is
            // positioned after it, and going back would cost a locate.
            let mut out = memory_prefix(st, &r.name, r.off, end);
            let from = r.off + out.len() as u64;
            let len = to_block_end(&e, from, (end - from).max(READ_STEP.min(e.size - from)), cap);
            st.stats.reads_from_tape += 1;
            tracing::debug!("{}: read {} {}+{} from the tape ({} bytes of it in memory), reading {from}+{len}", inner.describe, r.name, r.off, r.len, out.len());
            let mut passed = Passed::new(inner.opts.read_buffer / 2);
            let read = MutexGuard::unlocked(st, || read_range(dev, label, &e, from, len, &mut passed));
            keep_passed(inner, st, passed);
            let (start, bytes) = read.map_err(|x| layout_err(&inner.describe, x).with_object(&r.name))?;
            out.extend_from_slice(&bytes[(from - start) as usize..(end - start) as usize]);
            keep_read(inner, st, &r.name, start, bytes);
            st.stream = Some(Stream { name: r.name.clone(), next: from + len, used: end });
            Ok(out)
        })();
        *r.done.lock() = Some(res);
        // Its reader goes on now, not at the end of the pass.
        inner.cv.notify_all();
    }
}

impl Backend for TapeStore {
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        validate_name(name)?;
        let len = data.len() as u64;
        let mut st = self.inner.st.lock();
        loop {
            if let Some((k, m)) = &st.failed {
                return Err(Error::new(*k, m.clone()).with_object(name));
            }
            if st.queued_bytes == 0 || st.queued_bytes + len <= self.inner.opts.queue_bytes {
                break;
            }
            self.inner.cv.wait(&mut st);
        }
        // Room taken before the copy is made, so a put that waits holds
        // no second copy of its pack, and outside the lock, which the
        // drive needs between writes.
        st.queued_bytes += len;
        st.stats.peak_queue_bytes = st.stats.peak_queue_bytes.max(st.queued_bytes);
        let data = Arc::new(MutexGuard::unlocked(&mut st, || data.to_vec()));
        let id = st.index.next_id;
        st.index.next_id += 1;
        st.in_flight.insert(name.to_string(), data.clone());
        // A copy kept of an older version must never answer a read.
        st.inline.remove(name);
        keep_inline(&self.inner.opts, &mut st, name, Some(data.clone()));
        st.queue.push_back(Job { name: name.to_string(), id, data });
        self.inner.cv.notify_all();
        Ok(())
    }

    fn put_if_absent(&self, name: &str, data: &[u8]) -> Result<()> {
        {
            let st = self.inner.st.lock();
            if st.in_flight.contains_key(name) || st.index.objects.get(name).is_some_and(|e| !e.dead) {
                return Err(Error::new(ErrorKind::AlreadyExists, format!("object {name} already exists")).with_object(name));
            }
        }
        // One process holds the tape, and the engine serialises its
        // conditional creates, so nothing slips in between.
        self.put(name, data)
    }

    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        validate_name(name)?;
        {
            let mut st = self.inner.st.lock();
            if let Some(d) = from_memory(&mut st, name, offset, len) {
                return Ok(d);
            }
            if let Some(d) = st.in_flight.get(name) {
                return Err(Error::new(ErrorKind::OutOfRange, format!("object {name}: range {offset}+{len} past its end ({} bytes)", d.len())).with_object(name));
            }
        }
        let e = self.live(name)?;
        if offset.checked_add(len).is_none_or(|end| end > e.size) {
            return Err(Error::new(ErrorKind::OutOfRange, format!("object {name}: range {offset}+{len} past its end ({} bytes)", e.size)).with_object(name));
        }
        let r = Arc::new(ReadReq { name: name.to_string(), off: offset, len, at: Instant::now(), done: Mutex::new(None) });
        {
            let mut st = self.inner.st.lock();
            st.reads.push(r.clone());
            tracing::debug!("{}: asked for {name} {offset}+{len} ({} reads waiting)", self.inner.describe, st.reads.len());
            self.inner.cv.notify_all();
        }
        self.inner.wait_read(&r)
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        let size = self.size(name)?;
        let data = self.get_range(name, 0, size)?;
        // A mount reads the objects it needs first whole: kept, they go
        // inline in the next catalog (a tape whose catalog had none gets
        // one that does).
        if self.inner.opts.inline.as_ref().is_some_and(|p| p.covers(name)) {
            let mut st = self.inner.st.lock();
            let on_tape = !st.in_flight.contains_key(name) && st.index.objects.get(name).is_some_and(|e| !e.dead && e.size == size);
            if on_tape && !st.inline.contains_key(name) {
                keep_inline(&self.inner.opts, &mut st, name, Some(Arc::new(data.clone())));
            }
        }
        Ok(data)
    }

    fn size(&self, name: &str) -> Result<u64> {
        validate_name(name)?;
        if let Some(d) = self.inner.st.lock().in_flight.get(name) {
            return Ok(d.len() as u64);
        }
        Ok(self.live(name)?.size)
    }

    fn delete(&self, name: &str) -> Result<()> {
        validate_name(name)?;
        let mut st = self.inner.st.lock();
        st.in_flight.remove(name);
        st.inline.remove(name);
        if let Some(e) = st.index.objects.get_mut(name).filter(|e| !e.dead) {
            e.dead = true;
            st.dirty = true;
        }
        Ok(())
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let st = self.inner.st.lock();
        let mut out: Vec<ObjectInfo> = st
            .index
            .objects
            .range(prefix.to_string()..)
            .take_while(|(n, _)| n.starts_with(prefix))
            .filter(|(n, e)| !e.dead && !st.in_flight.contains_key(*n))
            .map(|(n, e)| ObjectInfo { name: n.clone(), size: e.size })
            .collect();
        out.extend(st.in_flight.iter().filter(|(n, _)| n.starts_with(prefix)).map(|(n, d)| ObjectInfo { name: n.clone(), size: d.len() as u64 }));
        Ok(out)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { remote: true, cheap_ranged_reads: false, frees_on_delete: false, preferred_pack_size: self.inner.opts.pack_size, exclusive: true, deferred_durability: true }
    }

    /// Waits until everything put is written, then makes it durable and
    /// writes the catalog after it (docs/tape.md §2).
    fn sync(&self) -> Result<()> {
        let mut st = self.inner.st.lock();
        st.want_sync += 1;
        let want = st.want_sync;
        self.inner.cv.notify_all();
        while st.synced < want {
            self.inner.cv.wait(&mut st);
        }
        match &st.failed {
            Some((k, m)) => Err(Error::new(*k, m.clone())),
            None => Ok(()),
        }
    }

    fn describe(&self) -> String {
        self.inner.describe.clone()
    }

    fn sequential(&self) -> Option<&dyn cairn_backend::Sequential> {
        Some(self)
    }
}

/// A tape is the sequential store.
impl cairn_backend::Sequential for TapeStore {
    /// The block holding byte `offset` of `name` (its head counted), for
    /// reads sorted into one pass. None for an object not on tape yet.
    fn position(&self, name: &str, offset: u64) -> Option<u64> {
        let st = self.inner.st.lock();
        if st.in_flight.contains_key(name) {
            return None;
        }
        let e = st.index.objects.get(name).filter(|e| !e.dead)?;
        let at = e.head + offset;
        let per = (self.label.block_size as u64).saturating_sub(layout::HEADER_LEN as u64).max(1);
        let x = e.extents.iter().find(|x| x.offset <= at && at < x.offset + x.len).or(e.extents.last())?;
        Some(x.start + at.saturating_sub(x.offset) / per)
    }

    /// Deletes on a tape are logical: the dead bytes stay until a reclaim.
    fn space(&self) -> Option<cairn_backend::StoreSpace> {
        let (live_bytes, dead_bytes) = self.inner.st.lock().index.space();
        Some(cairn_backend::StoreSpace { live_bytes, dead_bytes, free_bytes: None })
    }

    fn backlog(&self) -> Backlog {
        let st = self.inner.st.lock();
        let streaming = st.queued_bytes > 0 || st.last_write.is_some_and(|t| t.elapsed() < STREAMING_GRACE);
        Backlog { queued_bytes: st.queued_bytes, streaming }
    }
}

impl Drop for TapeStore {
    /// Stops the drive thread after what is queued, writing no catalog: an
    /// unmount syncs first, and a store dropped without a sync is, as far
    /// as the tape can tell, a crash.
    fn drop(&mut self) {
        self.stop();
    }
}

/// What [`recover`] found and did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Recovery {
    /// Objects whose every block was found, now in the index.
    pub recovered: Vec<String>,
    /// Objects with missing blocks (by name when their head was readable).
    pub incomplete: Vec<String>,
    /// Blocks that failed their checks.
    pub bad_blocks: u64,
    /// Whether a catalog was found and kept as the base (its deletes and
    /// names are trusted for the objects it lists).
    pub had_catalog: bool,
}

/// Rebuilds the catalog of a tape from its blocks (`cairn tape recover`):
/// every object whose blocks all arrived comes back under the name in its
/// head; a newer copy of a name wins. Writes the new catalog after the last
/// good data block, then returns the device.
pub fn recover(mut dev: Box<dyn TapeDevice>, expect: Option<VolumeId>, progress: &mut dyn FnMut(u64, u64)) -> std::result::Result<(Recovery, Box<dyn TapeDevice>), Error> {
    let name = dev.name().to_string();
    let report = layout::scan(dev.as_mut(), expect).map_err(|e| layout_err(&name, e))?;
    let label = report.label.clone();
    let mut out = Recovery { bad_blocks: report.bad_blocks.len() as u64, ..Default::default() };
    // A catalog that survived describes everything before it; objects
    // after it are added. Without one, the index starts empty.
    let mut index = match report.catalog.as_ref().map(|c| decode_catalog(&c.bytes)) {
        Some(Ok(CatalogPayload { index: i, .. })) => {
            out.had_catalog = true;
            i
        }
        _ => Index::default(),
    };
    let known: HashMap<u64, String> = index.objects.iter().map(|(n, e)| (e.id, n.clone())).collect();
    let total = report.objects.len() as u64;
    let cap = payload_per_block(&label);
    let mut done = 0;
    let mut objects: Vec<&layout::ScannedObject> = report.objects.values().collect();
    objects.sort_by_key(|o| o.extents.first().map_or(u64::MAX, |e| e.start));
    for o in objects {
        done += 1;
        progress(done, total);
        if known.contains_key(&o.object_id) {
            continue;
        }
        // Its name is in its first block.
        let first = o.extents.iter().find(|e| e.offset == 0).and_then(|e| sub_extent(e, 0, 6 + u16::MAX as u64, cap).map(|x| Extent { blocks: x.blocks.min(2), len: x.len.min(2 * cap), ..x }));
        let head = first.and_then(|x| {
            let mut b = Vec::new();
            layout::read_extents(dev.as_mut(), &label, &[x], |_, _, p| {
                b.extend_from_slice(p);
                Ok(())
            })
            .ok()?;
            parse_object_head(&b).ok()
        });
        match (o.complete, head) {
            (true, Some((n, head))) => {
                let size = o.len - head;
                if let Some(old) = index.objects.get(&n) {
                    if old.id > o.object_id {
                        continue;
                    }
                    if !old.dead {
                        index.replaced_bytes += old.size;
                    }
                }
                index.objects.insert(n.clone(), IndexEntry { id: o.object_id, size, head, extents: o.extents.clone(), dead: false });
                out.recovered.push(n);
            }
            (_, Some((n, _))) => out.incomplete.push(n),
            (_, None) => out.incomplete.push(format!("object {} (its name is unreadable)", o.object_id)),
        }
    }
    index.next_id = index.next_id.max(report.max_object_id.map_or(0, |m| m + 1));
    let mut w = layout::TapeWriter::new(&label, report.append_point());
    // Nothing inline: the bytes are not at hand. The first mount reads the
    // metadata from where it lies, and its catalog carries it.
    w.write_catalog(dev.as_mut(), &encode_catalog(&index, &[])).map_err(|e| layout_err(&name, e))?;
    dev.flush().map_err(|e| layout_err(&name, e.into()))?;
    Ok((out, dev))
}

/// Opens the tape in `dev` as the destination of [`reclaim`]: a blank tape
/// is formatted (a new label, so a new tape volume id); anything else is
/// refused, naming what it holds, so no data is ever overwritten.
pub fn open_blank(mut dev: Box<dyn TapeDevice>, opts: StoreOptions) -> Result<TapeStore> {
    let name = dev.name().to_string();
    match layout::read_label(dev.as_mut(), None) {
        Err(LayoutError::BlankTape { .. }) => TapeStore::open(dev, opts, None, true),
        Ok(label) => Err(Error::new(ErrorKind::AlreadyExists, format!("{name} already holds Cairn tape volume {}; a reclaim writes only to a blank tape and never overwrites one", label.volume_id))),
        Err(LayoutError::NotCairnTape { .. }) => Err(Error::new(ErrorKind::AlreadyExists, format!("{name} holds data that is not a Cairn tape; a reclaim writes only to a blank tape and never overwrites one"))),
        Err(e) => {
            let e = layout_err(&name, e);
            Err(Error::new(e.kind(), format!("{e}; a reclaim writes only to a blank tape")))
        }
    }
}

/// What [`reclaim`] did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReclaimReport {
    /// The source tape's volume id (its label).
    pub src_volume: String,
    /// The destination's, new.
    pub dst_volume: String,
    /// Live objects copied.
    pub objects: u64,
    /// Their bytes (heads not counted).
    pub bytes: u64,
    /// Dead bytes (deleted or replaced objects) left behind on the source.
    pub dead_bytes_left: u64,
    /// Wall-clock seconds, the destination's final sync included.
    pub seconds: f64,
}

/// Copies the live objects of `src` to `dst` (`cairn tape reclaim`,
/// docs/tape.md §5) under the same names, then syncs `dst` (its catalog).
///
/// One pass over `src`: objects go in the order of their first block on
/// the tape, so each read starts where the last ended or after a dead gap
/// that is read through, never located back to. One object at a time is in
/// memory here; `dst`'s put queue (bounded, blocking) keeps its drive
/// streaming while the next object is read. Every block read is checked
/// (checksum, volume, object, sequence) by the layout, and each object's
/// length against the index. `progress` gets bytes copied and the total.
///
/// `dst` must hold no object (open it with [`open_blank`]). On an error
/// (end of `dst`'s medium, a bad block on `src`) `src` is untouched and
/// `dst` is a partial copy that must not stand in for the volume.
pub fn reclaim(src: &TapeStore, dst: &TapeStore, progress: &mut dyn FnMut(u64, u64)) -> Result<ReclaimReport> {
    let t0 = Instant::now();
    let (sd, dd) = (src.describe(), dst.describe());
    if src.label().volume_id == dst.label().volume_id {
        return Err(Error::new(ErrorKind::Permanent, format!("{sd}: the source and the destination are the same tape")));
    }
    let held = dst.index();
    if !held.objects.is_empty() || !dst.list("")?.is_empty() {
        return Err(Error::new(ErrorKind::AlreadyExists, format!("{dd} holds {} objects; a reclaim writes only to a blank tape", held.objects.len())));
    }
    let index = src.index();
    let (_, dead) = index.space();
    let mut live: Vec<(&String, &IndexEntry)> = index.objects.iter().filter(|(_, e)| !e.dead).collect();
    live.sort_by_key(|(_, e)| e.extents.first().map_or(u64::MAX, |x| x.start));
    let total: u64 = live.iter().map(|(_, e)| e.size).sum();
    let mut rep = ReclaimReport { src_volume: src.label().volume_id.to_string(), dst_volume: dst.label().volume_id.to_string(), dead_bytes_left: dead, ..Default::default() };
    // How far it got, for an error: what reached the destination's tape.
    let partial = |e: Error, what: &str| {
        let st = dst.stats();
        Error::new(
            e.kind(),
            format!(
                "{what}: {e}; {} of {} objects ({} of {total} bytes) had reached {dd}, which is a partial copy: do not use it as the volume. {sd} is untouched",
                st.objects_written,
                live.len(),
                st.bytes_written
            ),
        )
    };
    progress(0, total);
    for (name, e) in &live {
        // One request, served at once in position order: no batch window.
        let data = src.read_many(&[((*name).clone(), 0, e.size)]).pop().expect("one answer per request").map_err(|x| partial(x, &format!("reading {name} from {sd}")))?;
        if data.len() as u64 != e.size {
            return Err(partial(Error::new(ErrorKind::Corrupt, format!("{name}: read {} bytes, the index says {}", data.len(), e.size)).with_object(name.as_str()), &format!("reading {name} from {sd}")));
        }
        dst.put(name, &data).map_err(|x| partial(x, &format!("writing {name} to {dd}")))?;
        rep.objects += 1;
        rep.bytes += e.size;
        progress(rep.bytes, total);
    }
    dst.sync().map_err(|x| partial(x, &format!("syncing {dd}")))?;
    // The destination's index names exactly the live objects, at their sizes.
    let got = dst.index();
    let same = got.objects.len() == live.len() && live.iter().all(|(n, e)| got.objects.get(*n).is_some_and(|g| !g.dead && g.size == e.size));
    if !same || got.space().1 != 0 {
        return Err(Error::new(ErrorKind::Corrupt, format!("{dd}: after the copy its catalog does not name exactly the live objects of {sd}")));
    }
    rep.seconds = t0.elapsed().as_secs_f64();
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_extents_cover_exactly_the_blocks_of_a_range() {
        let e = Extent { object_id: 1, start: 100, blocks: 10, first_seq: 5, offset: 5 * 8, len: 75 };
        // Payload 8 bytes a block; the run holds object bytes 40..115.
        let s = sub_extent(&e, 50, 60, 8).unwrap();
        assert_eq!((s.start, s.blocks, s.first_seq, s.offset, s.len), (101, 2, 6, 48, 16));
        let s = sub_extent(&e, 100, 200, 8).unwrap();
        assert_eq!((s.start, s.blocks, s.offset, s.len), (107, 3, 96, 19));
        assert!(sub_extent(&e, 0, 40, 8).is_none());
    }

    #[test]
    fn a_memory_budget_holds_two_packs_being_built_and_the_queue() {
        for m in [MIN_MEMORY, 64 << 20, 256 << 20, DEFAULT_MEMORY, 8 << 30] {
            let o = StoreOptions::for_memory(m);
            assert_eq!(o.queue_bytes + 2 * o.pack_size, m, "{m}");
            assert!(o.pack_size <= MAX_PACK && o.pack_size >= 1 << 20, "{m}");
            assert!(o.queue_bytes >= 2 * o.pack_size, "{m}: the queue takes two packs");
        }
        // The default is what the measurements of docs/tape.md were made with.
        let d = StoreOptions::default();
        assert_eq!((d.pack_size, d.read_ahead, d.read_buffer), (64 << 20, 64 << 20, 256 << 20));
        // Less than the least is raised to it.
        assert_eq!(StoreOptions::for_memory(1 << 20).queue_bytes, StoreOptions::for_memory(MIN_MEMORY).queue_bytes);
    }
}
