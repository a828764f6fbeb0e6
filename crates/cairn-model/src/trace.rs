//! Access traces (docs/trace.md): what a mount read and wrote, where its
//! chunks went, and what its disk cache did, in a binary file that the
//! simulator (crate `cairn-sim`) replays.
//!
//! [`TraceWriter`] appends records under one mutex into a buffered file; a
//! volume holds it as an `Option<Arc<TraceWriter>>`, so a volume without
//! tracing pays one branch per hook. [`TraceReader`] parses untrusted bytes
//! and never panics: a torn last record is ignored, anything else malformed
//! is an error naming its byte offset.

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The first bytes of a trace file.
pub const MAGIC: &[u8; 8] = b"CAIRNTRC";
/// The format version this build writes and reads.
pub const VERSION: u32 = 1;
/// Bytes of the header.
pub const HEADER_LEN: usize = 24;
/// Bytes of each record.
pub const RECORD_LEN: usize = 48;

const READ: u8 = 1;
const WRITE: u8 = 2;
const TRUNCATE: u8 = 3;
const REMOVE: u8 = 4;
const PLACE: u8 = 5;
const CHUNK: u8 = 6;
const PACK: u8 = 7;
const CACHE: u8 = 8;

/// Every range and size ends within this: the largest file, 2^63 - 1
/// bytes (objects are smaller; the engine checks that this is its
/// `extent::MAX_FILE_SPAN`).
pub const MAX_END: u64 = i64::MAX as u64;

/// Every range (and an object's size) is at most this long, which bounds a
/// replay's work per record: reads and writes are at most 4 GiB, extents
/// and objects smaller; only a file's size (TRUNCATE) may reach `MAX_END`.
pub const MAX_LEN: u64 = 16 << 40;

/// PLACE flag: an extent committed before tracing began.
const DESCRIBED: u8 = 1;
/// READ flag: answered from the last pages of chunks kept in memory, no
/// chunk read (since 2026-11-29).
const KEPT: u8 = 1;

/// PACK flags: the pack was held in the outbox, or a held pack was
/// released for upload (since 2026-11-29; none: written and uploaded).
const HELD: u8 = 1;
const RELEASED: u8 = 2;

/// What a PACK record says happened to a pack (docs/trace.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PackStage {
    /// Written and put (one PUT).
    Uploaded,
    /// Written to the outbox and held there for a later round to copy
    /// into a larger pack: no PUT (yet).
    Held,
    /// A held pack queued for upload after all: its PUT.
    Released,
}

/// CACHE event numbers (the record's flags byte).
const OPENED: u8 = 7;
const SIZE: u8 = 9;

/// What the disk cache did to one pack (docs/trace.md, CACHE events).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CacheEvent {
    /// A read served by cached entries.
    Hit,
    /// A read that fetched from the bucket.
    Miss,
    /// A read served by the outbox.
    Outbox,
    /// The pack entered the outbox.
    Queued,
    /// The pack was uploaded from the outbox and kept, in pieces of
    /// `cache::KEEP_PIECE` bytes.
    Uploaded,
    /// The pack, put to the bucket directly, was kept in such pieces.
    Kept,
    /// The pack's copies left the cache.
    Dropped,
    /// A cached extent present when tracing began.
    Held,
}

impl CacheEvent {
    fn code(self) -> u8 {
        match self {
            CacheEvent::Hit => 0,
            CacheEvent::Miss => 1,
            CacheEvent::Outbox => 2,
            CacheEvent::Queued => 3,
            CacheEvent::Uploaded => 4,
            CacheEvent::Kept => 5,
            CacheEvent::Dropped => 6,
            CacheEvent::Held => 8,
        }
    }

    fn from_code(c: u8) -> Option<CacheEvent> {
        Some(match c {
            0 => CacheEvent::Hit,
            1 => CacheEvent::Miss,
            2 => CacheEvent::Outbox,
            3 => CacheEvent::Queued,
            4 => CacheEvent::Uploaded,
            5 => CacheEvent::Kept,
            6 => CacheEvent::Dropped,
            8 => CacheEvent::Held,
            _ => return None,
        })
    }

    /// Whether the event is a read of the pack (its `group` is the inode
    /// read for).
    pub fn is_read(self) -> bool {
        matches!(self, CacheEvent::Hit | CacheEvent::Miss | CacheEvent::Outbox)
    }
}

/// One recorded event (docs/trace.md, Kinds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Read {
        ino: u64,
        offset: u64,
        len: u64,
    },
    /// A read answered from the last pages of chunks the mount keeps in
    /// memory (the kernel's read of a partial last page before an append):
    /// it needed no chunk.
    ReadKept {
        ino: u64,
        offset: u64,
        len: u64,
    },
    Write {
        ino: u64,
        offset: u64,
        len: u64,
    },
    Truncate {
        ino: u64,
        size: u64,
    },
    Remove {
        ino: u64,
    },
    /// File bytes `[offset, offset+len)` are chunk `chunk` (0: a hole);
    /// `described`: committed before tracing began.
    Place {
        ino: u64,
        offset: u64,
        len: u64,
        chunk: u64,
        described: bool,
    },
    Chunk {
        chunk: u64,
        pack: u64,
        offset: u64,
        len: u64,
    },
    Pack {
        pack: u64,
        size: u64,
        stage: PackStage,
    },
    /// `[offset, offset+len)` of `pack`; `group`: the inode a read was for
    /// (0: none, and for the other events).
    Cache {
        event: CacheEvent,
        pack: u64,
        offset: u64,
        len: u64,
        group: u64,
    },
    /// Tracing of the disk cache began.
    CacheOpened {
        /// The cache's fetch alignment (0: a miss fetches exactly what it
        /// asks; traces before 2026-11-29: its aligned block size).
        block: u64,
        capacity: u64,
        /// Two missing ranges of a read this close shared one GET (0 in
        /// traces before 2026-11-29).
        merge: u64,
        /// A miss continuing the pack's last GET fetched this much more
        /// (0 in traces before 2026-11-29).
        ahead: u64,
    },
    /// The size of `pack`, before its first read event.
    CacheSize {
        pack: u64,
        size: u64,
    },
}

/// An event and when it happened (ns since the trace's start).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub time: u64,
    pub event: Event,
}

impl Record {
    /// The record's bytes.
    pub fn encode(&self) -> [u8; RECORD_LEN] {
        let (kind, flags, f) = match self.event {
            Event::Read { ino, offset, len } => (READ, 0, [ino, offset, len, 0]),
            Event::ReadKept { ino, offset, len } => (READ, KEPT, [ino, offset, len, 0]),
            Event::Write { ino, offset, len } => (WRITE, 0, [ino, offset, len, 0]),
            Event::Truncate { ino, size } => (TRUNCATE, 0, [ino, size, 0, 0]),
            Event::Remove { ino } => (REMOVE, 0, [ino, 0, 0, 0]),
            Event::Place { ino, offset, len, chunk, described } => (PLACE, if described { DESCRIBED } else { 0 }, [ino, offset, len, chunk]),
            Event::Chunk { chunk, pack, offset, len } => (CHUNK, 0, [chunk, pack, offset, len]),
            Event::Pack { pack, size, stage } => {
                let flags = match stage {
                    PackStage::Uploaded => 0,
                    PackStage::Held => HELD,
                    PackStage::Released => RELEASED,
                };
                (PACK, flags, [pack, size, 0, 0])
            }
            Event::Cache { event, pack, offset, len, group } => (CACHE, event.code(), [pack, offset, len, group]),
            Event::CacheOpened { block, capacity, merge, ahead } => (CACHE, OPENED, [ahead, block, capacity, merge]),
            Event::CacheSize { pack, size } => (CACHE, SIZE, [pack, 0, size, 0]),
        };
        let mut b = [0u8; RECORD_LEN];
        b[0] = kind;
        b[1] = flags;
        b[8..16].copy_from_slice(&self.time.to_le_bytes());
        for (i, v) in f.iter().enumerate() {
            b[16 + 8 * i..24 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// Parses the record that starts at byte `at` of the file.
    pub fn decode(b: &[u8; RECORD_LEN], at: u64) -> Result<Record, TraceError> {
        let u = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let (kind, flags, time) = (b[0], b[1], u(8));
        let [a, bb, c, d] = [u(16), u(24), u(32), u(40)];
        let bad = |what: String| TraceError::BadRecord { offset: at, what };
        let range = |off: u64, len: u64| match off.checked_add(len) {
            _ if len > MAX_LEN => Err(bad(format!("range {off}+{len} is longer than 16 TiB"))),
            Some(end) if end <= MAX_END => Ok(()),
            _ => Err(bad(format!("range {off}+{len} ends past the largest file (2^63 - 1 bytes)"))),
        };
        let allowed = match kind {
            PLACE => DESCRIBED,
            READ => KEPT,
            PACK => HELD | RELEASED,
            CACHE => u8::MAX, // the event, checked below
            _ => 0,
        };
        if flags & !allowed != 0 {
            return Err(bad(format!("flags {flags:#04x} are not defined for kind {kind}")));
        }
        let event = match kind {
            READ | WRITE => {
                range(bb, c)?;
                if kind == READ && flags & KEPT != 0 {
                    Event::ReadKept { ino: a, offset: bb, len: c }
                } else if kind == READ {
                    Event::Read { ino: a, offset: bb, len: c }
                } else {
                    Event::Write { ino: a, offset: bb, len: c }
                }
            }
            TRUNCATE => {
                if bb > MAX_END {
                    return Err(bad(format!("size {bb} is past the largest file (2^63 - 1 bytes)")));
                }
                Event::Truncate { ino: a, size: bb }
            }
            REMOVE => Event::Remove { ino: a },
            PLACE => {
                range(bb, c)?;
                Event::Place { ino: a, offset: bb, len: c, chunk: d, described: flags & DESCRIBED != 0 }
            }
            CHUNK => {
                range(c, d)?;
                Event::Chunk { chunk: a, pack: bb, offset: c, len: d }
            }
            PACK => {
                range(0, bb)?;
                let stage = match flags {
                    0 => PackStage::Uploaded,
                    HELD => PackStage::Held,
                    RELEASED => PackStage::Released,
                    _ => return Err(bad(format!("a pack both held and released (flags {flags:#04x})"))),
                };
                Event::Pack { pack: a, size: bb, stage }
            }
            CACHE => match flags {
                OPENED => Event::CacheOpened { block: bb, capacity: c, merge: d, ahead: a },
                SIZE => {
                    range(0, c)?;
                    Event::CacheSize { pack: a, size: c }
                }
                e => {
                    let event = CacheEvent::from_code(e).ok_or_else(|| bad(format!("unknown cache event {e}")))?;
                    range(bb, c)?;
                    Event::Cache { event, pack: a, offset: bb, len: c, group: d }
                }
            },
            k => return Err(bad(format!("unknown kind {k}"))),
        };
        Ok(Record { time, event })
    }
}

/// Why a trace cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("reading the trace: {0}")]
    Io(#[from] io::Error),
    #[error("not a Cairn trace: {0}")]
    NotATrace(&'static str),
    #[error("trace format version {0} is not supported (this build reads version {VERSION})")]
    Version(u32),
    #[error("trace records of {0} bytes are not supported (this build reads {RECORD_LEN})")]
    RecordLen(u32),
    #[error("trace record at byte {offset}: {what}")]
    BadRecord { offset: u64, what: String },
}

/// Reads up to `buf.len()` bytes; fewer only at the end of the input.
fn fill(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// The records of a trace, in order. Stops after the first error.
pub struct TraceReader<R> {
    r: R,
    /// Byte offset of the next record.
    at: u64,
    start_unix_ns: u64,
    done: bool,
    torn_tail: bool,
}

impl TraceReader<BufReader<File>> {
    /// Opens a trace file.
    pub fn open(path: &Path) -> Result<Self, TraceError> {
        TraceReader::new(BufReader::with_capacity(1 << 20, File::open(path)?))
    }
}

impl<R: Read> TraceReader<R> {
    /// Reads and checks the header.
    pub fn new(mut r: R) -> Result<Self, TraceError> {
        let mut h = [0u8; HEADER_LEN];
        if fill(&mut r, &mut h)? < HEADER_LEN {
            return Err(TraceError::NotATrace("shorter than a header"));
        }
        if &h[..8] != MAGIC {
            return Err(TraceError::NotATrace("bad magic"));
        }
        let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().expect("4 bytes"));
        match (u32_at(8), u32_at(12)) {
            (VERSION, len) if len as usize == RECORD_LEN => {}
            (VERSION, len) => return Err(TraceError::RecordLen(len)),
            (v, _) => return Err(TraceError::Version(v)),
        }
        let start_unix_ns = u64::from_le_bytes(h[16..24].try_into().expect("8 bytes"));
        Ok(TraceReader { r, at: HEADER_LEN as u64, start_unix_ns, done: false, torn_tail: false })
    }

    /// When recording began, in ns since the Unix epoch.
    pub fn start_unix_ns(&self) -> u64 {
        self.start_unix_ns
    }

    /// Whether the input ended inside a record (which was ignored).
    pub fn torn_tail(&self) -> bool {
        self.torn_tail
    }
}

impl<R: Read> Iterator for TraceReader<R> {
    type Item = Result<Record, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let mut b = [0u8; RECORD_LEN];
        let r = match fill(&mut self.r, &mut b) {
            Ok(RECORD_LEN) => Record::decode(&b, self.at),
            Ok(n) => {
                self.torn_tail = n > 0;
                self.done = true;
                return None;
            }
            Err(e) => Err(e.into()),
        };
        self.at += RECORD_LEN as u64;
        self.done = r.is_err();
        Some(r)
    }
}

/// Writes a whole trace file of `records` (header starting at Unix time
/// `start_unix_ns`): for tools and tests that make traces by hand.
pub fn write_trace(path: &Path, start_unix_ns: u64, records: &[Record]) -> io::Result<()> {
    let mut b = Vec::with_capacity(HEADER_LEN + records.len() * RECORD_LEN);
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&(RECORD_LEN as u32).to_le_bytes());
    b.extend_from_slice(&start_unix_ns.to_le_bytes());
    for r in records {
        b.extend_from_slice(&r.encode());
    }
    std::fs::write(path, b)
}

/// The pack id of a pack name (docs/trace.md): the first 16 hex digits of
/// its last component, else the first 8 bytes of its BLAKE3 hash.
pub fn pack_id(name: &str) -> u64 {
    let last = name.rsplit('/').next().unwrap_or(name);
    match last.get(..16).filter(|h| h.bytes().all(|c| c.is_ascii_hexdigit())) {
        Some(h) => u64::from_str_radix(h, 16).expect("16 hex digits"),
        None => u64::from_le_bytes(blake3::hash(name.as_bytes()).as_bytes()[..8].try_into().expect("8 bytes")),
    }
}

struct WriterState {
    /// None once a write failed (tracing stops; the mount goes on).
    out: Option<BufWriter<File>>,
    /// Files whose committed map the trace has described.
    described: HashSet<u64>,
    /// Chunk id → the pack the trace last said it is in.
    chunks: HashMap<u64, u64>,
    /// Packs whose size the cache events told.
    sized: HashSet<u64>,
}

/// Appends records to a trace file (see the module docs).
pub struct TraceWriter {
    start: Instant,
    state: Mutex<WriterState>,
}

impl TraceWriter {
    /// Creates (or truncates) `path` and writes the header.
    pub fn create(path: &Path) -> io::Result<Arc<TraceWriter>> {
        let mut out = BufWriter::with_capacity(1 << 20, File::create(path)?);
        let start_unix_ns = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let mut h = [0u8; HEADER_LEN];
        h[..8].copy_from_slice(MAGIC);
        h[8..12].copy_from_slice(&VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&(RECORD_LEN as u32).to_le_bytes());
        h[16..24].copy_from_slice(&start_unix_ns.to_le_bytes());
        out.write_all(&h)?;
        let state = WriterState { out: Some(out), described: HashSet::new(), chunks: HashMap::new(), sized: HashSet::new() };
        Ok(Arc::new(TraceWriter { start: Instant::now(), state: Mutex::new(state) }))
    }

    /// Appends events in order, none of another thread's between them.
    pub fn record_all(&self, events: impl IntoIterator<Item = Event>) {
        let mut st = self.state.lock();
        self.append(&mut st, events);
    }

    /// Appends one event.
    pub fn record(&self, e: Event) {
        self.record_all([e]);
    }

    fn append(&self, st: &mut WriterState, events: impl IntoIterator<Item = Event>) {
        let Some(out) = st.out.as_mut() else { return };
        let time = self.start.elapsed().as_nanos() as u64;
        let mut r = Ok(());
        for event in events {
            match event {
                Event::Chunk { chunk, pack, .. } => {
                    st.chunks.insert(chunk, pack);
                }
                Event::Cache { pack, event: CacheEvent::Queued | CacheEvent::Uploaded | CacheEvent::Kept, .. } | Event::CacheSize { pack, .. } => {
                    st.sized.insert(pack);
                }
                _ => {}
            }
            r = r.and_then(|()| out.write_all(&Record { time, event }.encode()));
        }
        if let Err(e) = r {
            tracing::warn!("writing the access trace: {e}; tracing stops");
            st.out = None;
        }
    }

    /// Records where `chunk` is, unless the trace said so already.
    pub fn chunk_at(&self, chunk: u64, pack: u64, offset: u64, len: u64) {
        let mut st = self.state.lock();
        if st.chunks.get(&chunk) != Some(&pack) {
            self.append(&mut st, [Event::Chunk { chunk, pack, offset, len }]);
        }
    }

    /// Records `file`'s committed extents (from `extents`, called only
    /// then) the first time it is asked for the file.
    pub fn describe_once(&self, ino: u64, extents: impl FnOnce() -> Vec<Event>) {
        let mut st = self.state.lock();
        if st.described.insert(ino) {
            self.append(&mut st, extents());
        }
    }

    /// Records a read event of the disk cache, preceded by the pack's size
    /// the first time the trace mentions the pack.
    pub fn cache_read(&self, event: CacheEvent, pack: u64, size: u64, offset: u64, len: u64, group: u64) {
        let mut st = self.state.lock();
        let sized = !st.sized.insert(pack);
        let read = Event::Cache { event, pack, offset, len, group };
        if sized {
            self.append(&mut st, [read]);
        } else {
            self.append(&mut st, [Event::CacheSize { pack, size }, read]);
        }
    }

    /// Writes out what is buffered (at unmount; dropping the writer does
    /// too).
    pub fn flush(&self) -> io::Result<()> {
        match self.state.lock().out.as_mut() {
            Some(out) => out.flush(),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Event> {
        vec![
            Event::Write { ino: 7, offset: 0, len: 4096 },
            Event::Pack { pack: 0xab12, size: 1 << 20, stage: PackStage::Uploaded },
            Event::Chunk { chunk: 3, pack: 0xab12, offset: 24, len: 4000 },
            // Held in the outbox, then released for upload (since 2026-11-29).
            Event::Pack { pack: 0xab13, size: 5000, stage: PackStage::Held },
            Event::Pack { pack: 0xab13, size: 5000, stage: PackStage::Released },
            Event::Place { ino: 7, offset: 0, len: 4096, chunk: 3, described: false },
            Event::Place { ino: 9, offset: 10, len: 5, chunk: 0, described: true },
            Event::Read { ino: 7, offset: 100, len: 200 },
            Event::ReadKept { ino: 7, offset: 4096, len: 100 },
            Event::Truncate { ino: 7, size: 10 },
            Event::Remove { ino: 7 },
            Event::CacheOpened { block: 4 << 20, capacity: 8 << 20, merge: 0, ahead: 0 },
            // A cache fetching exact ranges (since 2026-11-29).
            Event::CacheOpened { block: 0, capacity: 8 << 20, merge: 4772, ahead: 256 << 10 },
            Event::Cache { event: CacheEvent::Held, pack: 5, offset: 4 << 20, len: 100, group: 0 },
            Event::Cache { event: CacheEvent::Queued, pack: 0xab12, offset: 0, len: 1 << 20, group: 0 },
            Event::Cache { event: CacheEvent::Uploaded, pack: 0xab12, offset: 0, len: 1 << 20, group: 0 },
            Event::Cache { event: CacheEvent::Kept, pack: 6, offset: 0, len: 9, group: 0 },
            Event::Cache { event: CacheEvent::Dropped, pack: 6, offset: 0, len: 0, group: 0 },
            Event::Cache { event: CacheEvent::Outbox, pack: 1, offset: 2, len: 3, group: 4 },
            Event::Cache { event: CacheEvent::Hit, pack: 0xab12, offset: 24, len: 4000, group: 7 },
        ]
    }

    fn write_trace(path: &Path) {
        let w = TraceWriter::create(path).unwrap();
        w.record_all(sample());
        // The size goes before the first read of pack 8 only.
        w.cache_read(CacheEvent::Miss, 8, 5000, 0, 10, 7);
        w.cache_read(CacheEvent::Hit, 8, 5000, 0, 10, 7);
        // Told once per location; described once per file.
        w.chunk_at(3, 0xab12, 24, 4000);
        w.chunk_at(3, 0xcd, 0, 4000);
        w.describe_once(9, || vec![Event::Place { ino: 9, offset: 0, len: 1, chunk: 2, described: true }]);
        w.describe_once(9, || panic!("described twice"));
        w.flush().unwrap();
    }

    fn expected() -> Vec<Event> {
        let mut want = sample();
        want.extend([
            Event::CacheSize { pack: 8, size: 5000 },
            Event::Cache { event: CacheEvent::Miss, pack: 8, offset: 0, len: 10, group: 7 },
            Event::Cache { event: CacheEvent::Hit, pack: 8, offset: 0, len: 10, group: 7 },
            Event::Chunk { chunk: 3, pack: 0xcd, offset: 0, len: 4000 },
            Event::Place { ino: 9, offset: 0, len: 1, chunk: 2, described: true },
        ]);
        want
    }

    #[test]
    fn records_round_trip() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t");
        write_trace(&p);
        let mut r = TraceReader::open(&p).unwrap();
        assert!(r.start_unix_ns() > 0);
        let got: Vec<Record> = r.by_ref().collect::<Result<_, _>>().unwrap();
        assert_eq!(got.iter().map(|r| r.event).collect::<Vec<_>>(), expected());
        assert!(got.windows(2).all(|w| w[0].time <= w[1].time), "times go backwards");
        assert!(!r.torn_tail());
    }

    #[test]
    fn a_torn_last_record_is_ignored() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t");
        write_trace(&p);
        let bytes = std::fs::read(&p).unwrap();
        let n = expected().len();
        for cut in [1, RECORD_LEN / 2, RECORD_LEN - 1] {
            let torn = &bytes[..bytes.len() - cut];
            let mut r = TraceReader::new(torn).unwrap();
            let got: Vec<Record> = r.by_ref().collect::<Result<_, _>>().unwrap();
            assert_eq!(got.len(), n - 1, "cut {cut}");
            assert!(r.torn_tail());
        }
        // A header alone is an empty trace.
        assert_eq!(TraceReader::new(&bytes[..HEADER_LEN]).unwrap().count(), 0);
    }

    #[test]
    fn bad_headers_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t");
        write_trace(&p);
        let bytes = std::fs::read(&p).unwrap();
        let refused = |b: &[u8]| TraceReader::new(b).err().expect("refused").to_string();
        assert!(refused(&bytes[..HEADER_LEN - 1]).contains("shorter than a header"));
        let mut b = bytes.clone();
        b[0] = b'X';
        assert!(refused(&b).contains("bad magic"));
        let mut b = bytes.clone();
        b[8] = 2;
        assert!(refused(&b).contains("version 2"));
        let mut b = bytes.clone();
        b[12] = 56;
        assert!(refused(&b).contains("56 bytes"));
    }

    #[test]
    fn a_bad_record_is_an_error_naming_its_offset() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t");
        write_trace(&p);
        let bytes = std::fs::read(&p).unwrap();
        let third = HEADER_LEN + 2 * RECORD_LEN;
        let check = |patch: &dyn Fn(&mut [u8]), what: &str| {
            let mut b = bytes.clone();
            patch(&mut b[third..third + RECORD_LEN]);
            let got: Vec<_> = TraceReader::new(&b[..]).unwrap().collect();
            assert_eq!(got.len(), 3, "{what}: reading stops at the bad record");
            let e = got[2].as_ref().unwrap_err().to_string();
            assert!(e.contains(&format!("at byte {third}")) && e.contains(what), "{e}");
        };
        check(&|r| r[0] = 99, "unknown kind 99");
        check(&|r| r[0] = 0, "unknown kind 0");
        check(&|r| r[1] = 2, "flags 0x02");
        // The second record is a PACK: held, released, not both.
        let second = HEADER_LEN + RECORD_LEN;
        let mut b = bytes.clone();
        b[second + 1] = 3;
        let got: Vec<_> = TraceReader::new(&b[..]).unwrap().collect();
        assert!(got[1].as_ref().unwrap_err().to_string().contains("both held and released"), "{:?}", got[1]);
        // The third record is a CHUNK: offset at 32, length at 40.
        check(&|r| r[32..40].copy_from_slice(&u64::MAX.to_le_bytes()), "past the largest file");
        check(&|r| r[32..40].copy_from_slice(&MAX_END.to_le_bytes()), "past the largest file");
        check(&|r| r[40..48].copy_from_slice(&(MAX_LEN + 1).to_le_bytes()), "longer than 16 TiB");
        check(&|r| (r[0], r[1]) = (CACHE, 10), "unknown cache event 10");
    }

    /// Files reach 2^63 - 1 bytes: ranges and sizes up to there are read
    /// back, one byte further is refused.
    #[test]
    fn ranges_reach_the_largest_file() {
        let round = |event: Event| Record::decode(&Record { time: 1, event }.encode(), 0).map(|r| r.event);
        for e in [Event::Write { ino: 1, offset: MAX_END - 1, len: 1 }, Event::Read { ino: 1, offset: MAX_END - 4096, len: 4096 }, Event::Truncate { ino: 1, size: MAX_END }] {
            assert_eq!(round(e).unwrap(), e);
        }
        assert!(round(Event::Write { ino: 1, offset: MAX_END - 1, len: 2 }).unwrap_err().to_string().contains("past the largest file"));
        assert!(round(Event::Truncate { ino: 1, size: MAX_END + 1 }).unwrap_err().to_string().contains("past the largest file"));
    }

    #[test]
    fn pack_ids_come_from_names() {
        assert_eq!(pack_id("packs/ab/ab0123456789cdef0011223344556677"), 0xab01_2345_6789_cdef);
        assert_eq!(pack_id("packs/ab/AB0123456789CDEF"), 0xab01_2345_6789_cdef);
        assert_ne!(pack_id("packs/x/short"), pack_id("packs/x/other"));
        assert_eq!(pack_id("packs/x/short"), pack_id("packs/x/short"));
    }
}
