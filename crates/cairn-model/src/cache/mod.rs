//! Cache eviction policies, shared by the engine's caches and the
//! simulator's: the [`CachePolicy`] seam, [`Lru`], and Coral's kd-tree
//! policy ([`kd`]).

pub mod extent;
pub mod kd;
pub mod policy;

pub use kd::{IoWindows, KdPolicy};
pub use policy::{CachePolicy, Lru};

/// The disk cache's default fetch alignment: none. A miss fetches exactly
/// the bytes asked for (docs/frugal.md §6): at AWS prices a GET costs what
/// 4.7 KB of transfer does, so rounding a 16 KiB read out to 64 KiB blocks
/// downloaded three times its price in bytes. Sequential readers still get
/// large reads, since read-ahead asks for runs of adjacent chunks at once
/// (`Volume::prefetch`). `--cache-block` rounds misses out to aligned
/// blocks instead (`cairn sim --pack-block` compares them on a trace).
pub const DEFAULT_BLOCK: u64 = 0;

/// How much more a miss fetches when it starts where the pack's last GET
/// ended: a reader going through the files a pack holds in order (the
/// files of a directory, flushed together) gets the next ones in the same
/// GET, where fetching each exactly cost a GET and a round trip per file
/// (docs/frugal.md §6). A random reader is not affected.
pub const DEFAULT_AHEAD: u64 = 256 << 10;

/// A pack written (uploaded, or put directly) stays in the disk cache as
/// extents of this size, each evicted on its own. Kept whole, a 16 MiB
/// pack took most of a cache of a few tens of MiB at once and left it
/// whole, the few files read from it keeping all of it: section 14's
/// fileserver then downloaded 1.5 times the BlueSky-like log's bytes,
/// which keeps its log in 32 KiB blocks.
pub const KEEP_PIECE: u64 = 64 << 10;
