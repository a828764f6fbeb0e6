//! How each layout (docs/frugal.md §4) turns what a record did into fetch
//! units (what its cache holds, what its GETs fetch) and uploads (its PUTs
//! and stored bytes):
//!
//! - `cairn`: the recorded placement, fetched as the live disk cache
//!   fetches: a read asks for runs of adjacent chunks of a pack (at most
//!   16, as the engine's reads do), and the cache fetches the gaps its
//!   extents leave (`cairn_model::cache::extent`; the units of a read are
//!   these [`RANGE`] requests, planned by each cache against what it
//!   holds); each pack is PUT once, as the S3 backend sends it (multipart
//!   from 100 MiB), and cached in 64 KiB pieces, as the live cache keeps it.
//! - `cairn-segment`: the recorded placement; a unit is a segment, the run
//!   of one file's chunks that lie next to each other in one pack.
//! - `bluesky`: every write appended to a log in request order (no dedup,
//!   no compression), sealed into 4 MiB objects, one PUT each; a unit is a
//!   32 KiB block of an object.
//!
//! Every layout caches what it writes as it writes it.

use crate::model::{Model, Step};
use serde::Serialize;
use std::collections::{HashMap, HashSet};

/// The default fetch alignment of the `cairn` layout: the live disk
/// cache's (0: exact).
pub const PACK_BLOCK: u64 = cairn_model::cache::DEFAULT_BLOCK;
/// The key of a unit that is a request for a range, not a cache unit.
pub(crate) const RANGE: u64 = u64::MAX;
/// The most chunks one read of a pack asks for (`Volume`'s coalescing).
const MAX_RUN: usize = 16;
/// The cache unit of the `bluesky` layout.
pub const LOG_BLOCK: u64 = 32 << 10;

/// A fetch unit: bytes `[start, start+len)` of object `obj`, cached as `key`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Unit {
    pub key: u64,
    pub obj: u64,
    pub start: u64,
    pub len: u64,
}

/// A layout (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(into = "&'static str")]
pub enum LayoutKind {
    Cairn,
    CairnSegment,
    BlueSky,
}

impl LayoutKind {
    pub const ALL: [LayoutKind; 3] = [LayoutKind::Cairn, LayoutKind::CairnSegment, LayoutKind::BlueSky];

    pub fn name(self) -> &'static str {
        match self {
            LayoutKind::Cairn => "cairn",
            LayoutKind::CairnSegment => "cairn-segment",
            LayoutKind::BlueSky => "bluesky",
        }
    }

    pub fn parse(s: &str) -> Option<LayoutKind> {
        LayoutKind::ALL.into_iter().find(|k| k.name() == s)
    }
}

impl From<LayoutKind> for &'static str {
    fn from(k: LayoutKind) -> Self {
        k.name()
    }
}

/// What the whole trace tells about packs, which the cairn layouts need
/// from the first record on (gathered by a first pass).
#[derive(Default)]
pub(crate) struct Packs {
    /// Pack id → size (as recorded, else the end of its last chunk).
    pub sizes: HashMap<u64, u64>,
    /// Packs uploaded during the trace.
    pub new: HashSet<u64>,
    /// Pack id → its segments as (start, end), sorted.
    pub segments: HashMap<u64, Vec<(u64, u64)>>,
}

impl Packs {
    /// Cuts each pack into segments: runs of chunks next to each other (in
    /// offset order) that belong to one file, the first to place them.
    /// `chunks`: (pack, offset, len, owner) of every chunk location.
    pub fn segment(&mut self, mut chunks: Vec<(u64, u64, u64, u64)>) {
        chunks.sort_unstable();
        // Pack → (start, end, owner) of its segments so far.
        let mut runs: HashMap<u64, Vec<(u64, u64, u64)>> = HashMap::new();
        for (pack, off, len, owner) in chunks {
            let segs = runs.entry(pack).or_default();
            match segs.last_mut() {
                Some((_, end, o)) if *o == owner => *end = (*end).max(off + len),
                _ => segs.push((off, off + len, owner)),
            }
        }
        self.segments = runs.into_iter().map(|(p, v)| (p, v.into_iter().map(|(s, e, _)| (s, e)).collect())).collect();
    }
}

/// What a layout stored in the bucket (the same whatever its cache).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Uploads {
    pub puts: u64,
    /// Multipart creations and completions.
    pub posts: u64,
    pub bytes_up: u64,
    /// Stored byte-seconds over the trace's duration.
    pub byte_seconds: f64,
}

/// One layout's bookkeeping during a replay.
pub(crate) struct Layout {
    pub kind: LayoutKind,
    /// (object, start) → the unit's cache key.
    keys: HashMap<(u64, u64), u64>,
    up: Uploads,
    /// The trace's end (ns): objects are stored until then.
    end: u64,
    /// Packs read that the trace did not see uploaded: stored throughout.
    older: HashSet<u64>,
}

impl Layout {
    /// A layout (the `cairn` kind's fetch rules are its caches').
    pub fn new(kind: LayoutKind, end: u64) -> Layout {
        Layout { kind, keys: HashMap::new(), up: Uploads::default(), end, older: HashSet::new() }
    }

    fn unit(&mut self, obj: u64, start: u64, len: u64) -> Unit {
        let next = self.keys.len() as u64;
        let key = *self.keys.entry((obj, start)).or_insert(next);
        Unit { key, obj, start, len }
    }

    /// The units of `[off, off+len)` of an object of `size` bytes cut into
    /// blocks of `block`.
    fn blocks(&mut self, obj: u64, off: u64, len: u64, size: u64, block: u64, out: &mut Vec<Unit>) {
        if len == 0 {
            return;
        }
        for idx in off / block..=(off + len - 1) / block {
            let start = idx * block;
            let n = block.min(size.saturating_sub(start));
            if n > 0 {
                out.push(self.unit(obj, start, n));
            }
        }
    }

    /// The units holding a stored chunk (pack, offset, len); for `cairn`,
    /// the chunk itself (its data set counts bytes, not units).
    fn chunk_units(&mut self, (pack, off, len): (u64, u64, u64), packs: &Packs, out: &mut Vec<Unit>) {
        match self.kind {
            LayoutKind::Cairn => out.push(self.unit(pack, off, len)),
            LayoutKind::CairnSegment => {
                let seg = packs.segments.get(&pack).and_then(|segs| {
                    let i = segs.partition_point(|&(s, _)| s <= off);
                    segs[..i].last().filter(|&&(_, e)| e > off)
                });
                let (s, e) = seg.copied().unwrap_or((off, off + len));
                out.push(self.unit(pack, s, e - s));
            }
            LayoutKind::BlueSky => {}
        }
    }

    /// The units a read needs, sorted by place; true if it also read bytes
    /// that need no fetch (Cairn's journal).
    pub fn read_units(&mut self, s: &Step, packs: &Packs, out: &mut Vec<Unit>) -> bool {
        out.clear();
        let local = match self.kind {
            LayoutKind::BlueSky => {
                for &(obj, off, len) in &s.log_reads {
                    self.blocks(obj, off, len, u64::MAX, LOG_BLOCK, out);
                }
                false
            }
            LayoutKind::Cairn => {
                let mut chunks = s.chunk_reads.clone();
                chunks.sort_unstable();
                chunks.dedup();
                let mut run = 0;
                for (pack, off, len) in chunks {
                    if !packs.new.contains(&pack) {
                        self.older.insert(pack);
                    }
                    match out.last_mut() {
                        Some(u) if u.obj == pack && u.start + u.len == off && run < MAX_RUN => {
                            u.len += len;
                            run += 1;
                        }
                        _ => {
                            out.push(Unit { key: RANGE, obj: pack, start: off, len });
                            run = 1;
                        }
                    }
                }
                return s.journal_read;
            }
            LayoutKind::CairnSegment => {
                for &c in &s.chunk_reads {
                    if !packs.new.contains(&c.0) {
                        self.older.insert(c.0);
                    }
                    self.chunk_units(c, packs, out);
                }
                s.journal_read
            }
        };
        sort_units(out);
        local
    }

    /// The units a step stored (cached as written), sorted by place.
    pub fn write_units(&mut self, s: &Step, packs: &Packs, out: &mut Vec<Unit>) {
        out.clear();
        match (self.kind, &s.pack) {
            (LayoutKind::BlueSky, _) => {
                for &(obj, off, len) in &s.log_writes {
                    self.blocks(obj, off, len, u64::MAX, LOG_BLOCK, out);
                }
            }
            (_, Some(step)) => {
                for &(pack, start, len) in &step.cached {
                    self.pack_units(pack, start, len, packs, out);
                }
            }
            (_, None) => {}
        }
        if self.kind != LayoutKind::Cairn {
            sort_units(out);
        }
    }

    /// Every unit of `[start, start+len)` of a new pack (`cairn`: ranges
    /// of `KEEP_PIECE` bytes, which its caches keep as extents, as the live
    /// cache keeps a pack it uploaded; `cairn-segment`: the segments
    /// starting there).
    pub fn pack_units(&mut self, pack: u64, start: u64, len: u64, packs: &Packs, out: &mut Vec<Unit>) {
        match (self.kind, packs.segments.get(&pack)) {
            (LayoutKind::Cairn, _) => {
                let p = cairn_model::cache::KEEP_PIECE;
                out.extend((0..len.div_ceil(p)).map(|i| Unit { key: RANGE, obj: pack, start: start + i * p, len: p.min(len - i * p) }));
            }
            (LayoutKind::CairnSegment, Some(segs)) => {
                let from = segs.partition_point(|&(s, _)| s < start);
                for &(s, e) in segs[from..].iter().take_while(|&&(s, _)| s < start + len) {
                    out.push(self.unit(pack, s, e - s));
                }
            }
            _ => {}
        }
    }

    /// The objects a step uploaded at `time`.
    pub fn uploaded(&mut self, s: &Step, time: u64) {
        match (self.kind, &s.pack) {
            (LayoutKind::BlueSky, _) => {
                for &(_, size) in &s.sealed {
                    self.upload(size, time);
                }
            }
            (_, Some(step)) => {
                for &(_, size) in &step.puts {
                    self.upload(size, time);
                }
            }
            (_, None) => {}
        }
    }

    /// The units holding one stored chunk, for the data set.
    pub fn units_of_chunk(&mut self, chunk: (u64, u64, u64), packs: &Packs, out: &mut Vec<Unit>) {
        out.clear();
        self.chunk_units(chunk, packs, out);
    }

    /// A PUT of `size` bytes at `time`, stored until the end.
    fn upload(&mut self, size: u64, time: u64) {
        let (puts, posts) = cairn_model::prices::put_requests(size);
        self.up.puts += puts;
        self.up.posts += posts;
        self.up.bytes_up += size;
        self.up.byte_seconds += size as f64 * self.end.saturating_sub(time) as f64 / 1e9;
    }

    /// What the layout uploaded and stored, once the trace is over: the
    /// log's last object goes up at the end; data older than the trace is
    /// stored throughout.
    pub fn finish(&mut self, model: &Model, packs: &Packs) -> Uploads {
        let secs = self.end as f64 / 1e9;
        match self.kind {
            LayoutKind::BlueSky => {
                if let Some((_, size)) = model.log.open_object() {
                    self.upload(size, self.end);
                }
                self.up.byte_seconds += model.prior.bytes as f64 * secs;
            }
            _ => {
                // Open packs sealed at the unmount.
                for &(_, size) in &model.plan.at_end {
                    self.upload(size, self.end);
                }
                let older: u64 = self.older.iter().map(|p| packs.sizes.get(p).copied().unwrap_or(0)).sum();
                self.up.byte_seconds += older as f64 * secs;
            }
        }
        self.up
    }
}

/// Sorts units by place and drops repeats, so that runs of adjacent ones
/// are next to each other.
fn sort_units(v: &mut Vec<Unit>) {
    v.sort_unstable_by_key(|u| (u.obj, u.start));
    v.dedup_by_key(|u| u.key);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Io;
    use crate::repack::PackStep;

    #[test]
    fn segments_are_runs_of_one_files_chunks() {
        let mut p = Packs::default();
        // Pack 1: file 5's chunks at 24 and 124, file 6's at 224, file 5's
        // again at 324 (a later round), then an unplaced chunk.
        p.segment(vec![(1, 224, 100, 6), (1, 24, 100, 5), (1, 124, 100, 5), (1, 324, 50, 5), (1, 374, 10, 0), (1, 24, 100, 5)]);
        assert_eq!(p.segments[&1], vec![(24, 224), (224, 324), (324, 374), (374, 384)]);
        let mut l = Layout::new(LayoutKind::CairnSegment, 0);
        let mut out = Vec::new();
        l.units_of_chunk((1, 124, 100), &p, &mut out);
        assert_eq!((out[0].start, out[0].len), (24, 200));
        l.units_of_chunk((1, 24, 100), &p, &mut out);
        assert_eq!(out[0].key, 0, "one key per segment");
    }

    #[test]
    fn reads_of_packs_are_runs_of_chunks_and_packs_go_up_whole() {
        let mb = 1 << 20;
        let mut p = Packs::default();
        p.sizes.insert(9, 10 * mb);
        p.new.insert(9);
        let mut l = Layout::new(LayoutKind::Cairn, 2_000_000_000);
        let mut out = Vec::new();
        // Chunks of pack 9 at 0, 100 and 200 (adjacent), 400, and 20
        // adjacent ones from 1000: four requests, the last two split at
        // 16 chunks; a chunk read twice is asked once.
        let mut chunks = vec![(9, 200, 100), (9, 0, 100), (9, 100, 100), (9, 400, 10), (9, 0, 100)];
        chunks.extend((0..20).map(|i| (9, 1000 + 10 * i, 10)));
        let s = Step { io: Some(Io::Read), chunk_reads: chunks, ..Step::default() };
        assert!(!l.read_units(&s, &p, &mut out));
        let got: Vec<(u64, u64, u64)> = out.iter().map(|u| (u.key, u.start, u.len)).collect();
        assert_eq!(got, vec![(RANGE, 0, 300), (RANGE, 400, 10), (RANGE, 1000, 160), (RANGE, 1160, 40)]);
        // Writing the pack caches it in pieces (the last one short).
        let s = Step { pack: Some(PackStep::whole(9, 10 * mb + 100)), ..Step::default() };
        l.write_units(&s, &p, &mut out);
        l.uploaded(&s, 1_000_000_000);
        let piece = cairn_model::cache::KEEP_PIECE;
        assert_eq!(out.len() as u64, (10 * mb).div_ceil(piece) + 1);
        assert!(out.iter().all(|u| u.key == RANGE));
        assert_eq!((out[0].start, out[0].len), (0, piece));
        assert_eq!((out.last().unwrap().start, out.last().unwrap().len), (10 * mb, 100));
        // 10 MiB goes up in one PUT, and so does 64 MiB; 128 MiB in a
        // multipart upload of 8 parts.
        l.uploaded(&Step { pack: Some(PackStep::whole(10, 64 * mb)), ..Step::default() }, 2_000_000_000);
        l.uploaded(&Step { pack: Some(PackStep::whole(11, 128 * mb)), ..Step::default() }, 2_000_000_000);
        let up = l.finish(&Model::new(), &p);
        assert_eq!((up.puts, up.posts, up.bytes_up), (1 + 1 + 8, 2, 202 * mb + 100));
        // 10 MiB stored for the last second, the others for none.
        assert_eq!(up.byte_seconds, (10 * mb + 100) as f64);
    }
}
