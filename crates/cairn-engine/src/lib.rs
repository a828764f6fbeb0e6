//! The Cairn volume engine: everything below the FUSE adapter. The
//! metadata lives in a `cairn_meta` store (SQLite in the volume directory,
//! or PostgreSQL), opened with `cairn_meta::open` and used through its
//! traits: the engine holds no SQL and names no store (`meta.rs`).
//!
//! # A map for a newcomer
//!
//! `open.rs` opens a volume ([`init`], `Volume::load`): the one module
//! that knows every layer. A [`Volume`] (`volume/mod.rs`) is a front over
//! a few parts, one field each, and its operations ask the parts. Each
//! part below, with where to start reading (docs/design.md "The volume's
//! parts" draws them):
//!
//! - **File table** (`volume/file.rs`, `FileTable`): the open files and
//!   every change of an open file's state; [`Volume::write`] and
//!   [`Volume::read`]. A flush hands a file its `CommittedRound` to
//!   apply (`FileState::apply_commit`). Beside it: `open_files.rs` (the
//!   store's registry of open files), `kernel_refs.rs` (the kernel's
//!   lookup counts), `locks.rs` (file locks), `resume.rs` (redoing commits
//!   a database lost).
//! - **Journal** (`journal.rs`, [`journal::Journal`]): the write-back redo
//!   log every write appends to first; it stays on the front, since the
//!   flusher retires it.
//! - **Flusher** (`volume/flusher.rs`, `Flusher`; its rounds in
//!   `volume/flush.rs`): picks the files that are due, chunks, packs,
//!   uploads and commits. Start at `Volume::flush_round` and
//!   `flush_round_locked`; the order of writes is `volume/order.rs`.
//!   Helpers: `buffers.rs`, `workers.rs` (upload threads), `guard.rs` (the
//!   chunk guard against the cleaner).
//! - **Medium** (`volume/medium.rs`, `trait Medium`, picked once by
//!   `medium::choose`): what the place the packs go to asks of the flush:
//!   `LocalHome`, `BucketHome` or `TapeHome`.
//! - **Namespace** (`volume/namespace.rs`): lookup, create, link, unlink,
//!   rename, attributes, extended attributes, each one metadata
//!   transaction; `tree.rs` (clones, snapshots), `edit.rs` (range clones,
//!   rpwrite), `archive.rs` (tar files), `follow.rs` (other machines'
//!   changes to a shared volume). Still `impl Volume` blocks, not a part
//!   with its own state.
//! - **Chunk store** (`volume/chunks.rs`, `ChunkStore`; start at
//!   `ChunkStore::chunk`): keys, the store of packs, the memory cache of
//!   chunks, kept last pages (`tails.rs`), chunk locations, prefetch. The
//!   formats under it: `pack.rs`, `crypto.rs`, `extent.rs`; the caches are
//!   the `cairn-cache` crate, re-exported as [`cache`].
//! - **Cloud part** (`cloud/mod.rs`, [`cloud::Cloud`], there when the
//!   volume lives in a bucket or on tape: `vol.cloud`): the lease
//!   (`lease.rs`), metadata versions (`versions.rs`) shipped by
//!   `volume/ship.rs`, the bill (`volume/bill.rs`, `cost.rs`). Which store
//!   a URL names: `location.rs`; a tape home: `tape.rs`, `mirror.rs`.
//! - **Maintenance**, tools over an opened volume, not inside it:
//!   `maintenance.rs` ([`maintenance::stats`], [`maintenance::fsck`],
//!   [`maintenance::gc`]), the cleaner (`cleaner.rs`, [`cleaner::clean`];
//!   its rules in `cleaner_rules.rs`) and `report.rs`.
//! - **Around them**: `control.rs` (a mount's control socket),
//!   `metrics.rs`, `health.rs` (`cairn status`), `config.rs` (the
//!   directory layout, settings), `background.rs`, `types.rs`, `error.rs`.
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
/// The caches (the disk cache of ranges of packs with its upload outbox,
/// the memory cache of chunks, their policies) are the `cairn-cache`
/// crate, re-exported whole at their old path.
pub use cairn_cache as cache;
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
