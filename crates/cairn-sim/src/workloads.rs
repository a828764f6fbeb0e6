//! Synthetic traces over a simulated year (docs/tiers.md §8): a live
//! recording cannot span a year in a test run, so these write what a
//! mount's trace would hold (WRITE, PLACE, CHUNK, PACK and READ records,
//! docs/trace.md) for a workload's access pattern, deterministic for a
//! seed. `cairn sim` reads them unchanged.
//!
//! Each day's writes are cut into chunks (one per small file, 4 MiB
//! pieces of large ones) and packed in write order into packs of 16 MiB,
//! sealed at the end of the day.

use crate::tiering::PinRange;
use cairn_model::tiers::Class;
use cairn_model::trace::{Event, PackStage, Record};

/// The workloads [`generate`] knows.
pub const WORKLOADS: [&str; 6] = ["fileserver", "webserver", "varmail", "kernel", "backup", "media"];

const DAY: u64 = 86_400_000_000_000;
const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const PACK: u64 = 16 * MIB;
const CHUNK: u64 = 4 * MIB;

/// A generated trace, and the pins a JuiceFS user would set on it.
#[derive(Debug)]
pub struct Generated {
    pub records: Vec<Record>,
    pub pins: Vec<PinRange>,
}

/// splitmix64: small, fast, deterministic.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[lo, hi)`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo).max(1)
    }
    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

enum Op {
    /// Write `len` bytes at the file's end.
    Append(u64, u64),
    /// Read the whole file.
    Read(u64),
    Remove(u64),
}

struct Gen {
    rng: Rng,
    recs: Vec<Record>,
    sizes: std::collections::HashMap<u64, u64>,
    next_chunk: u64,
    next_pack: u64,
    pack_fill: u64,
}

impl Gen {
    fn new(seed: u64) -> Gen {
        Gen { rng: Rng(seed ^ 0xC0FF_EE00_D15C_0B01), recs: Vec::new(), sizes: Default::default(), next_chunk: 1, next_pack: 1, pack_fill: 0 }
    }

    fn push(&mut self, time: u64, event: Event) {
        self.recs.push(Record { time, event });
    }

    fn seal(&mut self, time: u64) {
        if self.pack_fill > 0 {
            let (pack, size) = (self.next_pack, self.pack_fill);
            self.push(time, Event::Pack { pack, size, stage: PackStage::Uploaded });
            self.next_pack += 1;
            self.pack_fill = 0;
        }
    }

    fn run(&mut self, t: u64, op: Op) {
        match op {
            Op::Append(ino, len) => {
                let at = *self.sizes.get(&ino).unwrap_or(&0);
                self.push(t, Event::Write { ino, offset: at, len });
                let mut off = 0;
                while off < len {
                    let n = (len - off).min(CHUNK);
                    let chunk = self.next_chunk;
                    self.next_chunk += 1;
                    self.push(t, Event::Place { ino, offset: at + off, len: n, chunk, described: false });
                    if self.pack_fill + n > PACK {
                        self.seal(t);
                    }
                    let (pack, offset) = (self.next_pack, self.pack_fill);
                    self.push(t, Event::Chunk { chunk, pack, offset, len: n });
                    self.pack_fill += n;
                    off += n;
                }
                self.sizes.insert(ino, at + len);
            }
            Op::Read(ino) => {
                if let Some(&len) = self.sizes.get(&ino).filter(|l| **l > 0) {
                    self.push(t, Event::Read { ino, offset: 0, len });
                }
            }
            Op::Remove(ino) => {
                if self.sizes.remove(&ino).is_some() {
                    self.push(t, Event::Remove { ino });
                }
            }
        }
    }

    /// Runs one day's operations at random times within day `d`, then
    /// seals the day's last pack.
    fn day(&mut self, d: u64, mut ops: Vec<Op>) {
        let mut timed: Vec<(u64, usize, Op)> = ops.drain(..).enumerate().map(|(i, op)| (d * DAY + self.rng.range(0, DAY - 1), i, op)).collect();
        timed.sort_by_key(|x| (x.0, x.1));
        let mut last = d * DAY;
        for (t, _, op) in timed {
            self.run(t, op);
            last = t;
        }
        self.seal(last);
    }
}

/// Generates `name` over `days` simulated days (see docs/tiers.md §8).
pub fn generate(name: &str, seed: u64, days: u64) -> Result<Generated, String> {
    let mut g = Gen::new(seed);
    let mut pins = Vec::new();
    match name {
        // Filebench fileserver: 10,000 files of 128 KiB on average; whole
        // reads, 16 KiB appends, deletes and creates, uniform over files
        // (a day: 500 reads, 250 appends, 125 deletes and creates).
        "fileserver" => {
            let n = 10_000u64;
            let mut next = n + 1;
            let mut live: Vec<u64> = (1..=n).collect();
            let first: Vec<Op> = (1..=n).map(|i| Op::Append(i, g.rng.range(16 * KIB, 240 * KIB))).collect();
            g.day(0, first);
            for d in 1..days {
                let mut ops = Vec::new();
                for _ in 0..500 {
                    ops.push(Op::Read(live[g.rng.range(0, live.len() as u64) as usize]));
                }
                for _ in 0..250 {
                    ops.push(Op::Append(live[g.rng.range(0, live.len() as u64) as usize], 16 * KIB));
                }
                for _ in 0..125 {
                    let i = g.rng.range(0, live.len() as u64) as usize;
                    ops.push(Op::Remove(live[i]));
                    live[i] = next;
                    ops.push(Op::Append(next, g.rng.range(16 * KIB, 240 * KIB)));
                    next += 1;
                }
                g.day(d, ops);
            }
        }
        // Filebench webserver: 1,000 files of 16 KiB read whole (10 reads
        // per 16 KiB append to one log file, ino 1); 2,000 reads a day.
        "webserver" => {
            let n = 1000u64;
            let first: Vec<Op> = (2..=n + 1).map(|i| Op::Append(i, g.rng.range(4 * KIB, 28 * KIB))).collect();
            g.day(0, first);
            for d in 1..days {
                let mut ops = Vec::new();
                for _ in 0..2000 {
                    ops.push(Op::Read(g.rng.range(2, n + 2)));
                }
                for _ in 0..200 {
                    ops.push(Op::Append(1, 16 * KIB));
                }
                g.day(d, ops);
            }
        }
        // Filebench varmail: 1,000 mail files of 16 KiB; delete, create,
        // append, read whole, read again.
        "varmail" => {
            let n = 1000u64;
            let mut live: Vec<u64> = (1..=n).collect();
            let mut next = n + 1;
            let first: Vec<Op> = (1..=n).map(|i| Op::Append(i, g.rng.range(4 * KIB, 28 * KIB))).collect();
            g.day(0, first);
            for d in 1..days {
                let mut ops = Vec::new();
                for _ in 0..500 {
                    let i = g.rng.range(0, live.len() as u64) as usize;
                    ops.push(Op::Remove(live[i]));
                    live[i] = next;
                    ops.push(Op::Append(next, g.rng.range(4 * KIB, 28 * KIB)));
                    next += 1;
                    let j = live[g.rng.range(0, live.len() as u64) as usize];
                    ops.push(Op::Append(j, 8 * KIB));
                    ops.push(Op::Read(j));
                    ops.push(Op::Read(live[g.rng.range(0, live.len() as u64) as usize]));
                }
                g.day(d, ops);
            }
        }
        // A kernel tree: 40,000 files of 1-32 KiB; a hot 5% (2,000 files)
        // read every day with 50 of them edited; the rest read at 1 in
        // 1,000 a day.
        "kernel" => {
            let n = 40_000u64;
            let hot = 2000u64;
            let first: Vec<Op> = (1..=n).map(|i| Op::Append(i, g.rng.range(KIB, 32 * KIB))).collect();
            g.day(0, first);
            for d in 1..days {
                let mut ops = Vec::new();
                for i in 1..=hot {
                    ops.push(Op::Read(i));
                }
                for _ in 0..50 {
                    let i = g.rng.range(1, hot + 1);
                    ops.push(Op::Append(i, g.rng.range(KIB, 4 * KIB)));
                }
                for _ in 0..(n - hot) / 1000 {
                    ops.push(Op::Read(g.rng.range(hot + 1, n + 1)));
                }
                g.day(d, ops);
            }
        }
        // A backup: a full of 2,000 files of 32 MiB (62.5 GiB) on day 0,
        // then one 512 MiB incremental file a day; on 4 days of the year a
        // restore reads 5 files back. The pins a user would set: the
        // backup directory to GLACIER.
        "backup" => {
            let n = 2000u64;
            g.day(0, (1..=n).map(|i| Op::Append(i, 32 * MIB)).collect());
            let restore_days: Vec<u64> = (0..4).map(|_| g.rng.range(30, days.max(31))).collect();
            for d in 1..days {
                let mut ops = vec![Op::Append(n + d, 512 * MIB)];
                if restore_days.contains(&d) {
                    for _ in 0..5 {
                        ops.push(Op::Read(g.rng.range(1, n + d)));
                    }
                }
                g.day(d, ops);
            }
            pins.push(PinRange { from: 1, to: n + days, class: Class::Glacier });
        }
        // A media archive: 2,000 files of 8-56 MiB on day 0, then 10 a
        // day; 10 classics read 5 times a day, the newest 20 files twice a
        // day, the rest at 1 in 3,000 a day. The pins a user would set:
        // the library to STANDARD_IA (its hot items must stay readable).
        "media" => {
            let n = 2000u64;
            let first: Vec<Op> = (1..=n).map(|i| Op::Append(i, g.rng.range(8 * MIB, 56 * MIB))).collect();
            g.day(0, first);
            let mut total = n;
            for d in 1..days {
                let mut ops = Vec::new();
                for _ in 0..10 {
                    total += 1;
                    ops.push(Op::Append(total, g.rng.range(8 * MIB, 56 * MIB)));
                }
                for c in 1..=10 {
                    for _ in 0..5 {
                        ops.push(Op::Read(c * 97));
                    }
                }
                for i in total.saturating_sub(30).max(1)..=total.saturating_sub(10) {
                    ops.push(Op::Read(i));
                    ops.push(Op::Read(i));
                }
                for i in 1..=total {
                    if g.rng.chance(1.0 / 3000.0) {
                        ops.push(Op::Read(i));
                    }
                }
                g.day(d, ops);
            }
            pins.push(PinRange { from: 1, to: total, class: Class::StandardIa });
        }
        _ => return Err(format!("unknown workload {name:?} (known: {})", WORKLOADS.join(", "))),
    }
    Ok(Generated { records: g.recs, pins })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_are_deterministic_and_in_time_order() {
        for w in WORKLOADS {
            let a = generate(w, 7, 40).unwrap();
            let b = generate(w, 7, 40).unwrap();
            assert_eq!(a.records, b.records, "{w}");
            assert!(a.records.windows(2).all(|x| x[0].time <= x[1].time), "{w}");
            assert!(a.records.iter().any(|r| matches!(r.event, Event::Read { .. })), "{w} reads");
            assert!(a.records.iter().any(|r| matches!(r.event, Event::Pack { .. })), "{w} packs");
            assert_ne!(generate(w, 8, 40).unwrap().records, a.records, "{w}: the seed matters");
        }
        assert!(generate("nfs", 1, 1).unwrap_err().contains("unknown workload \"nfs\""));
    }
}
