//! The Cairn volume engine.
//!
//! Everything below the FUSE adapter: namespace and file-content operations
//! ([`Volume`]), the write-back journal, content-defined chunking with keyed
//! BLAKE3 ids and global deduplication, packs of compressed and encrypted
//! blobs, maintenance (fsck, stats, gc) and the cost-optimal cleaner, and
//! the homes a volume can have: a directory, a bucket (`cloud`: lease,
//! metadata versions, the pack cache) or a tape (`tape`, `mirror`). The
//! metadata lives in a `cairn_meta` store (SQLite in the volume directory,
//! or PostgreSQL), opened with `cairn_meta::open` and used through its
//! traits: the engine holds no SQL and names no store (`meta`).
//!
//! The modules stand in floors, each above what it imports, with no
//! circle (docs/design.md "Layout"; `cairn-testing`'s
//! `tests/module_circles.rs` keeps it so).
//!
//! ```no_run
//! use cairn_engine::{init, InitOptions, Volume, OpenOptions, Caller, FileKind, ROOT_INO};
//! let dir = std::path::Path::new("/tmp/vol");
//! init(dir, &InitOptions::default()).unwrap();
//! let vol = Volume::load(dir, OpenOptions::default()).unwrap();
//! let f = vol.create(ROOT_INO, b"hello", FileKind::File, 0o644, 0, Caller::default()).unwrap();
//! vol.open(f.ino).unwrap();
//! vol.write(f.ino, 0, b"hello world").unwrap();
//! vol.release(f.ino).unwrap();
//! vol.close().unwrap();
//! ```

pub mod background;
pub mod cache;
pub mod cleaner;
pub mod cleaner_rules;
pub mod cloud;
pub mod config;
pub mod control;
pub mod cost;
pub mod crypto;
mod error;
pub mod extent;
pub mod fsutil;
pub mod health;
pub mod journal;
pub mod lease;
pub mod location;
pub mod maintenance;
pub mod metrics;
pub mod meta;
pub mod mirror;
mod open;
pub mod pack;
pub mod report;
pub mod tape;
/// Access traces (docs/trace.md): the format lives in `cairn-model`,
/// shared with the simulator.
pub use cairn_model::trace;
/// Storage classes and their price sheet (docs/tiers.md §1, §4).
pub use cairn_model::tiers;
mod types;
pub mod versions;
mod volume;

// A trace's ranges end within the largest file.
const _: () = assert!(trace::MAX_END == extent::MAX_FILE_SPAN);

pub use config::{ChunkerParams, InitOptions, InjectedBackend, MetaKind, VolumeConfig};
pub use crypto::KdfParams;
pub use error::{Error, ErrorKind, Result};
pub use types::*;
pub use volume::CLOSE_ERROR;
pub use volume::{lock_conflict, LockKind, LockOutcome, LockOwner, LockRequest, LockRow, LockStyle, LOCK_EOF};
pub use open::{init, init_cloud, read_config};
pub use volume::{ArchiveOptions, ArchiveReport, ArchiveSource, ChangeBatch, ChangeFollower, CloneOptions, FOLLOW_POLL, EditReport, FlushReport, KernelCache, MemoryHeld, NewBytes, OpenOptions, Opened, ReadBytes, RecallReport, SnapshotInfo, Volume, ChunkInfo, FileInfo, Place, TreeStats, SNAPSHOT_DIR};
pub use volume::{tier_name, RestoreInfo, TierBytes, TierPin, TierStatus};
