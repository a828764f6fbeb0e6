//! The cleaner's rules and reports, below the volume (docs/frugal.md §8):
//! the bound on dead bytes, what a small pack is, where a volume stands
//! against them, and what a cleaning round did. The cleaner itself
//! (`cleaner.rs`) works on a volume from above; the volume's options, its
//! metrics and its statistics name these from below.

use serde::{Deserialize, Serialize};

/// The cleaner's hard bound on dead bytes (docs/frugal.md §8): at most
/// `ratio` times the live stored bytes, or `floor` bytes, whichever is
/// more. Past it the cleaner cleans whatever theorem 1 says, the packs
/// that free the most dead bytes per byte moved first, until the dead
/// bytes are back under three quarters of the bound.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeadBound {
    pub ratio: f64,
    pub floor: u64,
}

impl Default for DeadBound {
    fn default() -> Self {
        DeadBound { ratio: 1.0, floor: 256 << 20 }
    }
}

impl DeadBound {
    /// The most dead bytes allowed beside `live` live stored bytes.
    pub fn of(&self, live: u64) -> u64 {
        ((live as f64 * self.ratio.max(0.0)) as u64).max(self.floor)
    }
}

/// A pack smaller than the pack target over this is small.
pub const SMALL_PACK_SHARE: u64 = 4;
/// Once this many small packs are there, the cleaner merges them (their
/// live chunks copied into full-size packs): each flush of a few bytes
/// leaves a small pack, which must not stay for good.
pub const SMALL_PACKS: u64 = 64;
/// Where a volume stands against the cleaner's rules.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Standing {
    /// Bytes of every pack.
    pub pack_bytes: u64,
    /// Of which dead.
    pub dead_bytes: u64,
    /// The most dead bytes the bound allows now (none: no bound).
    pub dead_bound: Option<u64>,
    pub packs: u64,
    /// Packs below a quarter of the pack target.
    pub small_packs: u64,
}

impl Standing {
    /// Whether a round is wanted now whatever the interval.
    pub(crate) fn wants_round(&self) -> bool {
        self.dead_bound.is_some_and(|b| self.dead_bytes > b) || self.small_packs >= SMALL_PACKS
    }
}

/// What a cleaning round did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CleanReport {
    /// Packs cleaned (their live chunks moved, the old objects trashed).
    pub packs_cleaned: u64,
    /// Packs written with the moved chunks.
    pub packs_written: u64,
    pub chunks_moved: u64,
    pub bytes_moved: u64,
    /// Dead chunk rows deleted.
    pub chunks_dropped: u64,
    /// Dead bytes no longer stored.
    pub dead_bytes_freed: u64,
    /// Packs kept whole: a writer revived a chunk of theirs (found it by
    /// hash) while they were being cleaned. The next round plans them again.
    pub packs_kept: u64,
    /// The round gave up: no moment without a write batch came. Nothing
    /// changed; the next round tries again.
    pub gave_up: Option<String>,
    /// Packs taken because theorem 1 said so, because the dead bytes were
    /// past the bound, and because they were small.
    pub due: u64,
    pub over_bound: u64,
    pub small: u64,
}
