//! What a trace says about the files, replayed record by record: each
//! file's bytes as Cairn placed them (chunks, or still in the journal) and
//! as BlueSky's log would hold them (where each byte's latest write
//! landed), and where each chunk is stored. Each record yields a [`Step`]:
//! what a read needs, what a write stored.

use crate::repack::{PackStep, Plan};
use cairn_model::trace::{Event, PackStage};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// BlueSky seals its log into objects of this size.
pub const LOG_OBJECT: u64 = 4 << 20;
/// Object ids of the log laid out for data older than the trace.
const PRIOR: u64 = 1 << 63;

/// A value of a [`RangeMap`] that can be cut: the value of its tail `by`
/// bytes in.
pub(crate) trait Piece: Copy {
    fn skip(self, by: u64) -> Self;
}

/// Non-overlapping ranges of a file, each with a value.
pub(crate) struct RangeMap<V> {
    /// Start → (end, value).
    m: BTreeMap<u64, (u64, V)>,
}

impl<V> Default for RangeMap<V> {
    fn default() -> Self {
        RangeMap { m: BTreeMap::new() }
    }
}

impl<V: Piece> RangeMap<V> {
    /// Splits the range holding `at` so that one starts there.
    fn cut(&mut self, at: u64) {
        if let Some((&s, &(e, v))) = self.m.range(..at).next_back() {
            if e > at {
                self.m.insert(s, (at, v));
                self.m.insert(at, (e, v.skip(at - s)));
            }
        }
    }

    /// Forgets `[start, end)`.
    pub fn clear(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        self.cut(start);
        self.cut(end);
        let inside: Vec<u64> = self.m.range(start..end).map(|(&s, _)| s).collect();
        for s in inside {
            self.m.remove(&s);
        }
    }

    /// `[start, end)` becomes `v`.
    pub fn set(&mut self, start: u64, end: u64, v: V) {
        if start < end {
            self.clear(start, end);
            self.m.insert(start, (end, v));
        }
    }

    /// Forgets everything from `size` on.
    pub fn truncate(&mut self, size: u64) {
        self.cut(size);
        let beyond: Vec<u64> = self.m.range(size..).map(|(&s, _)| s).collect();
        for s in beyond {
            self.m.remove(&s);
        }
    }

    /// Calls `f(start, len, value)` for each range overlapping `[start,
    /// end)`, clipped to it, in order.
    pub fn overlaps(&self, start: u64, end: u64, mut f: impl FnMut(u64, u64, V)) {
        let first = self.m.range(..start).next_back().filter(|(_, &(e, _))| e > start);
        for (&s, &(e, v)) in first.into_iter().chain(self.m.range(start..end)) {
            let (a, b) = (s.max(start), e.min(end));
            f(a, b - a, if a > s { v.skip(a - s) } else { v });
        }
    }

    /// The parts of `[start, end)` no range covers.
    pub fn gaps(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut at = start;
        self.overlaps(start, end, |s, len, _| {
            if s > at {
                out.push((at, s));
            }
            at = s + len;
        });
        if at < end {
            out.push((at, end));
        }
        out
    }
}

/// Where Cairn has a file's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stored {
    /// In the write-back journal: local, not yet flushed.
    Journal,
    /// In this chunk (a read fetches all of it).
    Chunk(u64),
}

impl Piece for Stored {
    fn skip(self, _: u64) -> Self {
        self
    }
}

/// Where BlueSky's log has a file's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LogPos {
    obj: u64,
    off: u64,
}

impl Piece for LogPos {
    fn skip(self, by: u64) -> Self {
        LogPos { obj: self.obj, off: self.off + by }
    }
}

/// A log cut into objects of [`LOG_OBJECT`] bytes.
#[derive(Default)]
pub(crate) struct Log {
    /// Added to object numbers (to tell logs apart).
    base: u64,
    /// The object being filled, and its bytes so far.
    obj: u64,
    fill: u64,
    /// Bytes appended.
    pub bytes: u64,
}

impl Log {
    /// Appends `len` bytes; `put(object, offset, len)` for each piece, and
    /// the objects filled up go to `sealed` as (object, size).
    fn append(&mut self, mut len: u64, sealed: &mut Vec<(u64, u64)>, mut put: impl FnMut(u64, u64, u64)) {
        self.bytes += len;
        while len > 0 {
            let n = len.min(LOG_OBJECT - self.fill);
            put(self.base + self.obj, self.fill, n);
            self.fill += n;
            len -= n;
            if self.fill == LOG_OBJECT {
                sealed.push((self.base + self.obj, LOG_OBJECT));
                self.obj += 1;
                self.fill = 0;
            }
        }
    }

    /// The object being filled, and its size, if it holds anything.
    pub fn open_object(&self) -> Option<(u64, u64)> {
        (self.fill > 0).then_some((self.base + self.obj, self.fill))
    }
}

/// A file request (for the KD policy's read/write windows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Io {
    Read,
    Write,
}

/// What one record did, for the layouts.
#[derive(Default)]
pub(crate) struct Step {
    /// The record was a file read or write.
    pub io: Option<Io>,
    /// The file it was for.
    pub ino: u64,
    /// Cairn: stored chunks a read needs, as (pack, offset, len), sorted.
    pub chunk_reads: Vec<(u64, u64, u64)>,
    /// Cairn: the read also had bytes still in the journal.
    pub journal_read: bool,
    /// Cairn: chunks a read needs whose place the trace never said.
    pub unlocated: u64,
    /// Cairn: bytes written into packs and packs sealed (a PACK record).
    pub pack: Option<PackStep>,
    /// Cairn: the live cache dropped this pack (CACHE DROPPED).
    pub dropped: Option<u64>,
    /// BlueSky: log ranges a read needs, as (object, offset, len).
    pub log_reads: Vec<(u64, u64, u64)>,
    /// BlueSky: log ranges a write filled, and the objects it sealed.
    pub log_writes: Vec<(u64, u64, u64)>,
    pub sealed: Vec<(u64, u64)>,
}

impl Step {
    fn clear(&mut self) {
        self.io = None;
        self.ino = 0;
        self.chunk_reads.clear();
        self.journal_read = false;
        self.unlocated = 0;
        self.pack = None;
        self.dropped = None;
        self.log_reads.clear();
        self.log_writes.clear();
        self.sealed.clear();
    }
}

/// The replayed state (see the module docs).
pub(crate) struct Model {
    cairn: HashMap<u64, RangeMap<Stored>>,
    blue: HashMap<u64, RangeMap<LogPos>>,
    /// Chunk id → (pack, offset, stored length), as last recorded.
    chunks: HashMap<u64, (u64, u64, u64)>,
    /// BlueSky's log of writes.
    pub log: Log,
    /// Data older than the trace, laid out in a log of its own as the
    /// trace first describes it (whole files, in the order first read):
    /// stored from the start, never uploaded during the trace.
    pub prior: Log,
    /// Where the rounds' chunks go (empty: as recorded).
    pub plan: Arc<Plan>,
    /// Packs held in the outbox (PACK HELD, until RELEASED or the cache
    /// dropped them): local, outside the cache, as the live mount has them.
    held: std::collections::HashSet<u64>,
}

impl Model {
    #[cfg(test)]
    pub fn new() -> Model {
        Model::with_plan(Arc::default())
    }

    /// A model whose rounds are packed by `plan`.
    pub fn with_plan(plan: Arc<Plan>) -> Model {
        Model { cairn: HashMap::new(), blue: HashMap::new(), chunks: HashMap::new(), log: Log::default(), prior: Log { base: PRIOR, ..Log::default() }, plan, held: Default::default() }
    }

    /// Applies one record; `s` says what it did.
    pub fn apply(&mut self, e: &Event, s: &mut Step) {
        s.clear();
        match *e {
            Event::Read { ino, offset, len } | Event::ReadKept { ino, offset, len } => {
                s.io = Some(Io::Read);
                s.ino = ino;
                let end = offset + len;
                if matches!(e, Event::ReadKept { .. }) {
                    // Cairn answered it from memory (the last pages of
                    // chunks it keeps); the log has no such pages.
                    s.journal_read = true;
                } else if let Some(m) = self.cairn.get(&ino) {
                    m.overlaps(offset, end, |_, _, v| match v {
                        Stored::Journal => s.journal_read = true,
                        Stored::Chunk(c) => match self.chunks.get(&c) {
                            Some(&loc) if self.held.contains(&loc.0) => s.journal_read = true,
                            Some(&loc) => s.chunk_reads.push(loc),
                            None => s.unlocated += 1,
                        },
                    });
                    s.chunk_reads.sort_unstable();
                    s.chunk_reads.dedup();
                }
                if let Some(m) = self.blue.get(&ino) {
                    m.overlaps(offset, end, |_, len, p| s.log_reads.push((p.obj, p.off, len)));
                }
            }
            Event::Write { ino, offset, len } => {
                s.io = Some(Io::Write);
                s.ino = ino;
                self.cairn.entry(ino).or_default().set(offset, offset + len, Stored::Journal);
                let map = self.blue.entry(ino).or_default();
                let mut at = offset;
                self.log.append(len, &mut s.sealed, |obj, off, n| {
                    map.set(at, at + n, LogPos { obj, off });
                    s.log_writes.push((obj, off, n));
                    at += n;
                });
            }
            Event::Truncate { ino, size } => {
                if let Some(m) = self.cairn.get_mut(&ino) {
                    m.truncate(size);
                }
                if let Some(m) = self.blue.get_mut(&ino) {
                    m.truncate(size);
                }
            }
            Event::Remove { ino } => {
                self.cairn.remove(&ino);
                self.blue.remove(&ino);
            }
            Event::Place { ino, offset, len, chunk, described: false } => {
                let m = self.cairn.entry(ino).or_default();
                match chunk {
                    0 => m.clear(offset, offset + len),
                    c => m.set(offset, offset + len, Stored::Chunk(c)),
                }
            }
            // Older than anything the trace said about these bytes: it
            // fills only what is unknown.
            Event::Place { ino, offset, len, chunk, described: true } => {
                let m = self.cairn.entry(ino).or_default();
                for (a, b) in m.gaps(offset, offset + len) {
                    m.set(a, b, Stored::Chunk(chunk));
                }
                let m = self.blue.entry(ino).or_default();
                let mut unused = Vec::new();
                for (a, b) in m.gaps(offset, offset + len) {
                    let mut at = a;
                    self.prior.append(b - a, &mut unused, |obj, off, n| {
                        m.set(at, at + n, LogPos { obj, off });
                        at += n;
                    });
                }
            }
            Event::Chunk { .. } => {
                if let Event::Chunk { chunk, pack, offset, len } = self.plan.moved(e) {
                    self.chunks.insert(chunk, (pack, offset, len));
                }
            }
            Event::Pack { pack, size, stage } => {
                match stage {
                    PackStage::Held => self.held.insert(pack),
                    PackStage::Released => self.held.remove(&pack),
                    PackStage::Uploaded => false,
                };
                s.pack = Some(self.plan.step(pack, size, stage));
            }
            Event::Cache { event: cairn_model::trace::CacheEvent::Dropped, pack, .. } => {
                self.held.remove(&pack);
                s.dropped = Some(pack);
            }
            Event::Cache { .. } | Event::CacheOpened { .. } | Event::CacheSize { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Piece for u64 {
        fn skip(self, by: u64) -> Self {
            self + by
        }
    }

    fn ranges(m: &RangeMap<u64>) -> Vec<(u64, u64, u64)> {
        let mut v = Vec::new();
        m.overlaps(0, u64::MAX, |s, l, x| v.push((s, s + l, x)));
        v
    }

    #[test]
    fn range_maps_set_cut_and_truncate() {
        let mut m = RangeMap::default();
        m.set(0, 100, 1000);
        m.set(40, 60, 5000);
        assert_eq!(ranges(&m), vec![(0, 40, 1000), (40, 60, 5000), (60, 100, 1060)]);
        assert_eq!(m.gaps(0, 120), vec![(100, 120)]);
        m.clear(10, 50);
        assert_eq!(m.gaps(0, 100), vec![(10, 50)]);
        m.truncate(70);
        assert_eq!(ranges(&m), vec![(0, 10, 1000), (50, 60, 5010), (60, 70, 1060)]);
        let mut seen = Vec::new();
        m.overlaps(5, 55, |s, l, x| seen.push((s, l, x)));
        assert_eq!(seen, vec![(5, 5, 1005), (50, 5, 5010)]);
    }

    /// BlueSky's log in request order: two files written turn about share
    /// objects, each read maps to where its bytes' latest write landed.
    #[test]
    fn the_log_packs_interleaved_writes_in_request_order() {
        let mut m = Model::new();
        let mut s = Step::default();
        let mb = 1 << 20;
        for i in 0..3 {
            m.apply(&Event::Write { ino: 1, offset: i * 2 * mb, len: 2 * mb }, &mut s);
            m.apply(&Event::Write { ino: 2, offset: i * mb, len: mb }, &mut s);
        }
        // 9 MiB: objects 0 and 1 sealed, 1 MiB in object 2.
        assert_eq!(m.log.open_object(), Some((2, mb)));
        assert_eq!(m.log.bytes, 9 * mb);
        // File 1's third write (at 4 MiB) went to 6 MiB of the log: object
        // 1 from 2 MiB; file 2's last write opened object 2.
        m.apply(&Event::Read { ino: 1, offset: 4 * mb + 10, len: 20 }, &mut s);
        assert_eq!(s.log_reads, vec![(1, 2 * mb + 10, 20)]);
        m.apply(&Event::Read { ino: 2, offset: 2 * mb, len: mb }, &mut s);
        assert_eq!(s.log_reads, vec![(2, 0, mb)]);
        // An overwrite moves the bytes to the log's end.
        m.apply(&Event::Write { ino: 2, offset: 0, len: 10 }, &mut s);
        assert_eq!(s.log_writes, vec![(2, mb, 10)]);
        m.apply(&Event::Read { ino: 2, offset: 0, len: 20 }, &mut s);
        assert_eq!(s.log_reads, vec![(2, mb, 10), (0, 2 * mb + 10, 10)]);
    }

    /// Cairn: written bytes are local until their PLACE; described extents
    /// fill only what the trace did not say.
    #[test]
    fn placements_follow_commits_and_descriptions() {
        let mut m = Model::new();
        let mut s = Step::default();
        m.apply(&Event::Chunk { chunk: 7, pack: 9, offset: 24, len: 500 }, &mut s);
        m.apply(&Event::Chunk { chunk: 8, pack: 9, offset: 524, len: 300 }, &mut s);
        m.apply(&Event::Write { ino: 1, offset: 1000, len: 100 }, &mut s);
        m.apply(&Event::Place { ino: 1, offset: 0, len: 2000, chunk: 7, described: true }, &mut s);
        m.apply(&Event::Read { ino: 1, offset: 900, len: 300 }, &mut s);
        assert_eq!((s.chunk_reads.clone(), s.journal_read), (vec![(9, 24, 500)], true));
        m.apply(&Event::Place { ino: 1, offset: 1000, len: 100, chunk: 8, described: false }, &mut s);
        m.apply(&Event::Read { ino: 1, offset: 900, len: 300 }, &mut s);
        assert_eq!((s.chunk_reads.clone(), s.journal_read), (vec![(9, 24, 500), (9, 524, 300)], false));
        // The same bytes answered from the kept last pages: no chunk for
        // Cairn, the log's bytes for BlueSky.
        m.apply(&Event::ReadKept { ino: 1, offset: 1000, len: 100 }, &mut s);
        assert_eq!((s.io, s.chunk_reads.is_empty(), s.journal_read), (Some(Io::Read), true, true));
        assert_eq!(s.log_reads.iter().map(|r| r.2).sum::<u64>(), 100);
        m.apply(&Event::Place { ino: 1, offset: 0, len: 2000, chunk: 0, described: false }, &mut s);
        m.apply(&Event::Read { ino: 1, offset: 0, len: 2000 }, &mut s);
        assert!(s.chunk_reads.is_empty());
        m.apply(&Event::Place { ino: 2, offset: 0, len: 10, chunk: 99, described: false }, &mut s);
        m.apply(&Event::Read { ino: 2, offset: 0, len: 10 }, &mut s);
        assert_eq!(s.unlocated, 1);
    }
}
