//! Packing the trace's flush rounds otherwise (docs/frugal.md §7), to see
//! in the simulator whether a layout decision pays before the flusher is
//! changed:
//!
//! - **Order** ([`PackOrder`]): the chunks a round packed, re-cut into
//!   its packs (same number, same payload sizes) with the files in another
//!   order: `kd` by the file's last read before the round (Coral's t_i:
//!   files read at the same time lie together, never-read ones first);
//!   `next-read` by the file's first read *after* the round (an oracle no
//!   flusher has: the most any order can give). A file's chunks keep their
//!   order.
//! - **Open packs** (`open_target > 0`): a round's chunks are appended to
//!   the pack still open in the outbox instead of sealing their own;
//!   that pack is sealed (one PUT) once it holds `open_target` bytes, or
//!   at the first round `open_age_ns` or more after it opened (a mount
//!   ships a metadata version every few seconds, and a version may not
//!   name a pack the bucket does not hold: docs/format.md rule 7), or at
//!   the trace's end (the unmount). The sealing for age happens at that
//!   round's record, not on a timer: it shifts only stored byte-seconds.
//!
//! A [`Plan`] is made from a first pass over the whole trace; both later
//! passes (the survey and the replay) see every CHUNK record moved by it
//! and every PACK record turned into a [`PackStep`].

use crate::SimError;
use cairn_model::trace::{Event, PackStage, TraceReader};
use std::collections::HashMap;
use std::path::Path;

/// Bytes before a pack's first blob ("CAIRNPK1" and the volume id).
const HEADER: u64 = 24;
/// A pack index's bytes per entry, and its fixed part (count and checksum).
const INDEX_ENTRY: u64 = 49;
const INDEX_FIXED: u64 = 36;
/// Ids of merged packs (apart from any recorded pack id).
const MERGED: u64 = 0xC0DE << 48;

/// The order of files within a round's packs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PackOrder {
    /// As the flusher wrote them (inode order).
    #[default]
    Recorded,
    /// By the file's last read before the round.
    Kd,
    /// By the file's first read after the round (an oracle).
    NextRead,
}

impl PackOrder {
    pub const ALL: [PackOrder; 3] = [PackOrder::Recorded, PackOrder::Kd, PackOrder::NextRead];

    pub fn name(self) -> &'static str {
        match self {
            PackOrder::Recorded => "recorded",
            PackOrder::Kd => "kd",
            PackOrder::NextRead => "next-read",
        }
    }

    pub fn parse(s: &str) -> Option<PackOrder> {
        PackOrder::ALL.into_iter().find(|o| o.name() == s)
    }
}

/// How to pack the rounds (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Repacking {
    pub order: PackOrder,
    /// Open packs sealed at this many bytes (0: every round seals its own).
    pub open_target: u64,
    /// ...or at the first round this long after the pack opened.
    pub open_age_ns: u64,
}

impl Repacking {
    /// Packs as recorded: no plan needed.
    pub fn is_recorded(&self) -> bool {
        self.order == PackOrder::Recorded && self.open_target == 0
    }
}

/// What a PACK record does once repacked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PackStep {
    /// Bytes written into packs, cached as written: (pack, start, len).
    pub cached: Vec<(u64, u64, u64)>,
    /// Packs sealed and uploaded here: (pack, size).
    pub puts: Vec<(u64, u64)>,
}

impl PackStep {
    /// A recorded pack: written whole and uploaded.
    pub fn whole(pack: u64, size: u64) -> PackStep {
        PackStep { cached: vec![(pack, 0, size)], puts: vec![(pack, size)] }
    }

    /// What a PACK record did as recorded.
    pub fn recorded(pack: u64, size: u64, stage: PackStage) -> PackStep {
        match stage {
            PackStage::Uploaded => PackStep::whole(pack, size),
            // In the outbox, outside the clean cache, until released (the
            // model reads it locally meanwhile); then kept as uploaded.
            PackStage::Held => PackStep::default(),
            PackStage::Released => PackStep::whole(pack, size),
        }
    }
}

/// Where the repacking put every chunk of the trace's rounds, and what each
/// PACK record does (see the module docs).
#[derive(Default)]
pub(crate) struct Plan {
    /// (recorded pack, offset) → (pack, offset).
    moves: HashMap<(u64, u64), (u64, u64)>,
    /// Recorded pack → what its PACK record does.
    steps: HashMap<u64, PackStep>,
    /// Packs sealed when the trace ends: (pack, size).
    pub at_end: Vec<(u64, u64)>,
    /// Rounds were merged into open packs (else only re-cut, each pack
    /// kept: its PACK records do what they did).
    merged: bool,
}

impl Plan {
    /// A CHUNK record with its chunk where the plan put it.
    pub fn moved(&self, e: &Event) -> Event {
        match *e {
            Event::Chunk { chunk, pack, offset, len } => match self.moves.get(&(pack, offset)) {
                Some(&(pack, offset)) => Event::Chunk { chunk, pack, offset, len },
                None => *e,
            },
            _ => *e,
        }
    }

    /// What the PACK record of `pack` (recorded with `size` and `stage`)
    /// does. A repacked round's pack was written by its round's record: its
    /// release (a held pack's later PUT) does nothing.
    pub fn step(&self, pack: u64, size: u64, stage: PackStage) -> PackStep {
        if !self.merged {
            return PackStep::recorded(pack, size, stage);
        }
        match self.steps.get(&pack) {
            Some(_) if stage == PackStage::Released => PackStep::default(),
            Some(s) => s.clone(),
            None => PackStep::recorded(pack, size, stage),
        }
    }
}

/// A chunk a round packed: (chunk, recorded pack, offset, stored len).
type Packed = (u64, u64, u64, u64);

/// One flush round: its packs (id, recorded size) and chunks, in order.
struct Round {
    time: u64,
    packs: Vec<(u64, u64, PackStage)>,
    chunks: Vec<Packed>,
}

/// The pack being filled by open-pack appends.
struct Open {
    id: u64,
    fill: u64,
    entries: u64,
    opened: u64,
}

impl Open {
    fn size(&self) -> u64 {
        self.fill + INDEX_ENTRY * self.entries + INDEX_FIXED
    }
}

/// Reads the trace once and plans the repacking.
pub(crate) fn plan(path: &Path, r: &Repacking) -> Result<Plan, SimError> {
    let mut rounds: Vec<Round> = Vec::new();
    let mut reads: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut owners: HashMap<u64, u64> = HashMap::new();
    // The round whose CHUNK records are being read.
    let mut in_round = false;
    for rec in TraceReader::open(path)? {
        let rec = rec?;
        match rec.event {
            // A held pack's release starts no round: it wrote nothing.
            Event::Pack { stage: PackStage::Released, .. } => {}
            Event::Pack { pack, size, stage } => {
                match rounds.last_mut() {
                    Some(last) if in_round && last.chunks.is_empty() && last.time == rec.time => last.packs.push((pack, size, stage)),
                    _ => rounds.push(Round { time: rec.time, packs: vec![(pack, size, stage)], chunks: Vec::new() }),
                }
                in_round = true;
                continue;
            }
            Event::Chunk { chunk, pack, offset, len } if in_round => {
                let last = rounds.last_mut().expect("in a round");
                if last.packs.iter().any(|&(p, ..)| p == pack) {
                    last.chunks.push((chunk, pack, offset, len));
                    continue;
                }
            }
            Event::Read { ino, .. } => reads.entry(ino).or_default().push(rec.time),
            Event::Place { ino, chunk, .. } if chunk != 0 => {
                owners.entry(chunk).or_insert(ino);
            }
            _ => {}
        }
        in_round = false;
    }
    let mut plan = Plan { merged: r.open_target > 0, ..Plan::default() };
    let mut open: Option<Open> = None;
    // Chunk → where an earlier round's open pack put it: a live trace's
    // held pack is copied by the next round, whose CHUNK records name
    // the copies; they are not appended again.
    let mut placed: HashMap<u64, (u64, u64)> = HashMap::new();
    let mut merged = 0u64;
    for round in &mut rounds {
        if r.order != PackOrder::Recorded {
            reorder(round, r.order, &reads, &owners);
        }
        let mut steps: HashMap<u64, PackStep> = round.packs.iter().map(|&(p, ..)| (p, PackStep::default())).collect();
        // The PUTs of this round land on its first PACK record.
        let first = round.packs[0].0;
        if r.open_target == 0 {
            // Re-cut into the recorded packs: each takes its recorded
            // payload's worth, in the new order.
            let mut cuts = round.packs.iter().map(|&(p, ..)| (p, payload(round, p)));
            let (mut pack, mut room) = cuts.next().expect("a round has a pack");
            let mut fill = HEADER;
            for &(_, old, off, len) in &round.chunks {
                if room == 0 {
                    if let Some((p, n)) = cuts.next() {
                        (pack, room, fill) = (p, n, HEADER);
                    }
                }
                plan.moves.insert((old, off), (pack, fill));
                fill += len;
                room = room.saturating_sub(len);
            }
            // Each pack stays: its records do what they did (`Plan::step`).
        } else {
            if let Some(o) = open.take_if(|o| round.time.saturating_sub(o.opened) >= r.open_age_ns) {
                steps.get_mut(&first).expect("first").puts.push((o.id, o.size()));
            }
            for &(chunk, old, off, len) in &round.chunks {
                if let Some(&at) = placed.get(&chunk) {
                    plan.moves.insert((old, off), at);
                    continue;
                }
                let o = open.get_or_insert_with(|| {
                    merged += 1;
                    Open { id: MERGED | merged, fill: HEADER, entries: 0, opened: round.time }
                });
                plan.moves.insert((old, off), (o.id, o.fill));
                placed.insert(chunk, (o.id, o.fill));
                let cached = &mut steps.get_mut(&first).expect("first").cached;
                match cached.last_mut() {
                    Some((p, s, l)) if *p == o.id && *s + *l == o.fill => *l += len,
                    _ => cached.push((o.id, o.fill, len)),
                }
                o.fill += len;
                o.entries += 1;
                if o.fill >= r.open_target {
                    let size = o.size();
                    steps.get_mut(&first).expect("first").puts.push((o.id, size));
                    open = None;
                }
            }
        }
        plan.steps.extend(steps);
    }
    plan.at_end.extend(open.map(|o| (o.id, o.size())));
    Ok(plan)
}

/// The bytes of a round's pack `p` that hold its chunks.
fn payload(round: &Round, p: u64) -> u64 {
    round.chunks.iter().filter(|c| c.1 == p).map(|c| c.3).sum()
}

/// Sorts a round's chunks by their file's key (module docs), a file's
/// chunks in their order.
fn reorder(round: &mut Round, order: PackOrder, reads: &HashMap<u64, Vec<u64>>, owners: &HashMap<u64, u64>) {
    let t = round.time;
    let key = |ino: u64| -> u64 {
        let times = reads.get(&ino).map_or(&[][..], Vec::as_slice);
        let i = times.partition_point(|&x| x < t);
        match order {
            // Never read: first (0); else by the last read.
            PackOrder::Kd => i.checked_sub(1).map_or(0, |j| times[j] + 1),
            PackOrder::NextRead => times.get(i).copied().unwrap_or(u64::MAX),
            PackOrder::Recorded => 0,
        }
    };
    let mut keyed: Vec<(u64, u64, usize, Packed)> = round
        .chunks
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            let ino = owners.get(&c.0).copied().unwrap_or(0);
            (key(ino), ino, i, c)
        })
        .collect();
    keyed.sort_unstable_by_key(|k| (k.0, k.1, k.2));
    round.chunks = keyed.into_iter().map(|k| k.3).collect();
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_model::trace::{PackStage, Record};

    fn trace(events: &[(u64, Event)]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        let records: Vec<Record> = events.iter().map(|&(time, event)| Record { time, event }).collect();
        cairn_model::trace::write_trace(&path, 1, &records).unwrap();
        (dir, path)
    }

    const S: u64 = 1_000_000_000;

    /// Three rounds a second apart of one 1000-byte chunk each: with open
    /// packs of 2500 bytes all three share a pack, sealed when the third
    /// fills it; with an age of half a second every round seals the pack
    /// the round before opened, and the last goes up at the end.
    #[test]
    fn open_packs_append_rounds_until_the_target_or_the_age() {
        let mut ev = Vec::new();
        for i in 0..3u64 {
            ev.push((i * S, Event::Pack { pack: 10 + i, size: 24 + 1000 + 85, stage: PackStage::Uploaded }));
            ev.push((i * S, Event::Chunk { chunk: 100 + i, pack: 10 + i, offset: 24, len: 1000 }));
        }
        let (_d, path) = trace(&ev);
        let p = plan(&path, &Repacking { open_target: 2500, open_age_ns: 10 * S, ..Repacking::default() }).unwrap();
        let m1 = MERGED | 1;
        assert_eq!(p.moved(&Event::Chunk { chunk: 100, pack: 10, offset: 24, len: 1000 }), Event::Chunk { chunk: 100, pack: m1, offset: 24, len: 1000 });
        assert_eq!(p.moved(&Event::Chunk { chunk: 101, pack: 11, offset: 24, len: 1000 }), Event::Chunk { chunk: 101, pack: m1, offset: 1024, len: 1000 });
        assert_eq!(p.step(10, 0, PackStage::Uploaded), PackStep { cached: vec![(m1, 24, 1000)], puts: vec![] });
        assert_eq!(p.step(11, 0, PackStage::Uploaded), PackStep { cached: vec![(m1, 1024, 1000)], puts: vec![] });
        // The third chunk fills the pack past 2500: sealed with it.
        assert_eq!(p.step(12, 0, PackStage::Uploaded), PackStep { cached: vec![(m1, 2024, 1000)], puts: vec![(m1, 3024 + 3 * 49 + 36)] });
        assert!(p.at_end.is_empty());
        let p = plan(&path, &Repacking { open_target: 2500, open_age_ns: S / 2, ..Repacking::default() }).unwrap();
        let m2 = MERGED | 2;
        assert_eq!(p.step(11, 0, PackStage::Uploaded), PackStep { cached: vec![(m2, 24, 1000)], puts: vec![(m1, 1024 + 49 + 36)] });
        assert_eq!(p.at_end, vec![(MERGED | 3, 1024 + 49 + 36)]);
    }

    /// One round of two packs holding files 1, 2, 3 (in that order): by
    /// the next read (3 at 5 s, 1 at 6 s, 2 never) file 3 comes first and
    /// file 2 last, re-cut into the two packs' payload sizes.
    #[test]
    fn orders_recut_a_rounds_packs_by_the_files_reads() {
        let ev = [
            (0, Event::Read { ino: 2, offset: 0, len: 1 }),
            (S, Event::Pack { pack: 1, size: 0, stage: PackStage::Uploaded }),
            (S, Event::Pack { pack: 2, size: 0, stage: PackStage::Uploaded }),
            (S, Event::Chunk { chunk: 11, pack: 1, offset: 24, len: 100 }),
            (S, Event::Chunk { chunk: 12, pack: 1, offset: 124, len: 100 }),
            (S, Event::Chunk { chunk: 21, pack: 2, offset: 24, len: 100 }),
            (S, Event::Chunk { chunk: 31, pack: 2, offset: 124, len: 50 }),
            (S, Event::Place { ino: 1, offset: 0, len: 200, chunk: 11, described: false }),
            (S, Event::Place { ino: 1, offset: 0, len: 200, chunk: 12, described: false }),
            (S, Event::Place { ino: 2, offset: 0, len: 100, chunk: 21, described: false }),
            (S, Event::Place { ino: 3, offset: 0, len: 50, chunk: 31, described: false }),
            (5 * S, Event::Read { ino: 3, offset: 0, len: 1 }),
            (6 * S, Event::Read { ino: 1, offset: 0, len: 1 }),
        ];
        let (_d, path) = trace(&ev);
        let at = |p: &Plan, pack, offset| match p.moved(&Event::Chunk { chunk: 0, pack, offset, len: 0 }) {
            Event::Chunk { pack, offset, .. } => (pack, offset),
            _ => unreachable!(),
        };
        let p = plan(&path, &Repacking { order: PackOrder::NextRead, ..Repacking::default() }).unwrap();
        // Pack 1 (200 bytes): file 3 (50), file 1 (100, 100); pack 2: file 2.
        assert_eq!([at(&p, 2, 124), at(&p, 1, 24), at(&p, 1, 124), at(&p, 2, 24)], [(1, 24), (1, 74), (1, 174), (2, 24)]);
        // By the last read before: never-read files 1 and 3 first (ino
        // order), then file 2 (read at 0).
        let p = plan(&path, &Repacking { order: PackOrder::Kd, ..Repacking::default() }).unwrap();
        assert_eq!([at(&p, 1, 24), at(&p, 1, 124), at(&p, 2, 124), at(&p, 2, 24)], [(1, 24), (1, 124), (2, 24), (2, 74)]);
        // Ordering keeps the packs: each is PUT whole at its record; a pack
        // of no round (none here) is too.
        assert_eq!(p.step(2, 0, PackStage::Uploaded), PackStep::whole(2, 0));
        assert_eq!(p.step(99, 7, PackStage::Uploaded), PackStep::whole(99, 7));
    }

    /// A live trace with a held pack: round 1 held pack 1 (chunk 100), and
    /// round 2's pack 2 holds its own chunk 101 and the copy of chunk 100.
    /// Open packs append chunk 100 once (its copy's place maps to it), and
    /// re-cutting keeps each record's stage (the held pack costs no PUT).
    #[test]
    fn a_trace_with_held_packs_is_repacked_once() {
        let ev = [
            (S, Event::Pack { pack: 1, size: 1109, stage: PackStage::Held }),
            (S, Event::Chunk { chunk: 100, pack: 1, offset: 24, len: 1000 }),
            (2 * S, Event::Pack { pack: 2, size: 2158, stage: PackStage::Uploaded }),
            (2 * S, Event::Chunk { chunk: 101, pack: 2, offset: 1024, len: 1000 }),
            (2 * S, Event::Chunk { chunk: 100, pack: 2, offset: 24, len: 1000 }),
        ];
        let (_d, path) = trace(&ev);
        let at = |p: &Plan, pack, offset| match p.moved(&Event::Chunk { chunk: 0, pack, offset, len: 0 }) {
            Event::Chunk { pack, offset, .. } => (pack, offset),
            _ => unreachable!(),
        };
        let p = plan(&path, &Repacking { open_target: 1 << 20, open_age_ns: 10 * S, ..Repacking::default() }).unwrap();
        let m1 = MERGED | 1;
        assert_eq!([at(&p, 1, 24), at(&p, 2, 24), at(&p, 2, 1024)], [(m1, 24), (m1, 24), (m1, 1024)]);
        assert_eq!(p.at_end, vec![(m1, 2024 + 2 * 49 + 36)]);
        let p = plan(&path, &Repacking { order: PackOrder::Kd, ..Repacking::default() }).unwrap();
        assert_eq!(p.step(1, 1109, PackStage::Held), PackStep::default());
        assert_eq!(p.step(1, 1109, PackStage::Released), PackStep::whole(1, 1109));
    }

}
