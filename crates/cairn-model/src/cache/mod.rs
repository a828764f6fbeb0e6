//! Cache eviction policies, shared by the engine's caches and the
//! simulator's: the [`CachePolicy`] seam, [`Lru`], and Coral's kd-tree
//! policy ([`kd`]).

pub mod kd;
pub mod policy;

pub use kd::{IoWindows, KdPolicy};
pub use policy::{CachePolicy, Lru};

/// The disk cache's default fetch granularity. Small: at AWS prices a MiB
/// downloaded costs what 220 GETs do, so a miss should bring little beyond
/// what was asked; sequential readers still get large reads, since
/// read-ahead asks for runs of adjacent chunks at once
/// (`Volume::prefetch`). Simulated on recorded traces (docs/frugal.md §3):
/// an untar and a read of every file cost least with 64 KiB blocks (4 MiB
/// blocks: 240x more), a webserver-like random read of whole files half of
/// what 256 KiB cost.
pub const DEFAULT_BLOCK: u64 = 64 << 10;
