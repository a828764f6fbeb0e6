//! The first pass over a trace: what the whole trace tells about packs
//! (their sizes and segments, which the cairn layouts need from the first
//! record on), each layout's data set (which sets the cache sizes), and a
//! summary.

use crate::layout::{Layout, LayoutKind, Packs};
use crate::model::{Io, Model, Step};
use crate::repack::Plan;
use crate::SimError;
use cairn_model::trace::{CacheEvent, Event, PackStage, TraceReader};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

/// What a trace holds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub records: u64,
    /// When recording began, ns since the Unix epoch.
    pub start_unix_ns: u64,
    /// The time of the last record.
    pub duration_ns: u64,
    pub reads: u64,
    pub bytes_read: u64,
    pub writes: u64,
    pub bytes_written: u64,
    /// Chunks that reads needed but whose place the trace never said (left
    /// out of the cairn layouts).
    pub unlocated_chunks: u64,
    /// The trace ended inside a record, which was ignored.
    pub torn_tail: bool,
}

pub(crate) struct Survey {
    pub summary: Summary,
    pub packs: Packs,
    data: HashMap<LayoutKind, u64>,
}

impl Survey {
    /// The distinct stored bytes layout `k` reads or writes.
    pub fn data_set(&self, k: LayoutKind) -> u64 {
        self.data.get(&k).copied().unwrap_or(0)
    }
}

/// Adds the bytes of units not seen before.
fn count(seen: &mut HashSet<u64>, bytes: &mut u64, units: &[crate::layout::Unit]) {
    for u in units {
        if seen.insert(u.key) {
            *bytes += u.len;
        }
    }
}

/// Reads the whole trace once (see the module docs), its rounds packed by
/// `plan`.
pub(crate) fn survey(path: &Path, plan: &Arc<Plan>) -> Result<Survey, SimError> {
    let mut reader = TraceReader::open(path)?;
    let mut summary = Summary { start_unix_ns: reader.start_unix_ns(), ..Summary::default() };
    let mut packs = Packs::default();
    let mut recorded: HashMap<u64, u64> = HashMap::new();
    // (pack, offset, len, chunk) of every place a chunk was said to be.
    let mut places: HashSet<(u64, u64, u64, u64)> = HashSet::new();
    // Chunk → the file that placed it first.
    let mut owners: HashMap<u64, u64> = HashMap::new();
    let mut read_chunks: HashSet<(u64, u64, u64)> = HashSet::new();
    // BlueSky's units need nothing from later records: counted as we go.
    let mut blue = Layout::new(LayoutKind::BlueSky, 0);
    let (mut blue_seen, mut blue_bytes) = (HashSet::new(), 0);
    let mut model = Model::with_plan(plan.clone());
    let mut step = Step::default();
    let mut scratch = Vec::new();
    for r in reader.by_ref() {
        let r = r?;
        summary.records += 1;
        summary.duration_ns = summary.duration_ns.max(r.time);
        match plan.moved(&r.event) {
            Event::Read { len, .. } | Event::ReadKept { len, .. } => (summary.reads, summary.bytes_read) = (summary.reads + 1, summary.bytes_read + len),
            Event::Write { len, .. } => (summary.writes, summary.bytes_written) = (summary.writes + 1, summary.bytes_written + len),
            Event::Place { ino, chunk, .. } if chunk != 0 => {
                owners.entry(chunk).or_insert(ino);
            }
            Event::Chunk { chunk, pack, offset, len } => {
                places.insert((pack, offset, len, chunk));
            }
            Event::Pack { pack, size, stage } => {
                let step = plan.step(pack, size, stage);
                for (pack, size) in step.puts {
                    recorded.insert(pack, size);
                    packs.new.insert(pack);
                }
                // Held in the outbox: new (its reads are local until it
                // is released, and it never was in the bucket before).
                if stage == PackStage::Held {
                    let s = recorded.entry(pack).or_insert(0);
                    *s = (*s).max(size);
                    packs.new.insert(pack);
                }
            }
            Event::CacheSize { pack, size } | Event::Cache { event: CacheEvent::Queued | CacheEvent::Uploaded | CacheEvent::Kept, pack, len: size, .. } => {
                recorded.insert(pack, size);
            }
            _ => {}
        }
        model.apply(&r.event, &mut step);
        summary.unlocated_chunks += step.unlocated;
        read_chunks.extend(step.chunk_reads.iter().copied());
        if step.io == Some(Io::Read) {
            blue.read_units(&step, &packs, &mut scratch);
            count(&mut blue_seen, &mut blue_bytes, &scratch);
        }
        blue.write_units(&step, &packs, &mut scratch);
        count(&mut blue_seen, &mut blue_bytes, &scratch);
    }
    summary.torn_tail = reader.torn_tail();
    for &(pack, size) in &plan.at_end {
        recorded.insert(pack, size);
        packs.new.insert(pack);
    }
    // A pack is at least as long as its chunks say.
    for &(pack, off, len, _) in &places {
        let size = packs.sizes.entry(pack).or_insert(0);
        *size = (*size).max(off + len);
    }
    for (pack, size) in recorded {
        let s = packs.sizes.entry(pack).or_insert(0);
        *s = (*s).max(size);
    }
    packs.segment(places.into_iter().map(|(p, off, len, c)| (p, off, len, owners.get(&c).copied().unwrap_or(0))).collect());
    let mut data = HashMap::from([(LayoutKind::BlueSky, blue_bytes)]);
    for kind in [LayoutKind::Cairn, LayoutKind::CairnSegment] {
        let mut l = Layout::new(kind, 0);
        let (mut seen, mut bytes) = (HashSet::new(), 0);
        for &c in &read_chunks {
            if kind == LayoutKind::Cairn && packs.new.contains(&c.0) {
                // Counted with its pack, which is cached whole.
                continue;
            }
            l.units_of_chunk(c, &packs, &mut scratch);
            count(&mut seen, &mut bytes, &scratch);
        }
        for &p in &packs.new {
            let size = packs.sizes.get(&p).copied().unwrap_or(0);
            if kind == LayoutKind::Cairn {
                // Its units are ranges, not keys: the whole pack.
                bytes += size;
                continue;
            }
            scratch.clear();
            l.pack_units(p, 0, size, &packs, &mut scratch);
            count(&mut seen, &mut bytes, &scratch);
        }
        data.insert(kind, bytes);
    }
    Ok(Survey { summary, packs, data })
}
