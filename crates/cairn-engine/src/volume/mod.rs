//! The volume engine: namespace and file content operations over the
//! metadata store, the journal, the packer and the backend. No FUSE types
//! here; the whole engine runs in-process in tests.

mod file;
mod flush;
mod follow;
mod guard;
mod archive;
mod buffers;
mod workers;
mod kernel_refs;
mod edit;
mod namespace;
mod order;
mod recall;
mod inspect;
mod pins;
mod tree;
mod ship;
mod open_files;
mod bill;
mod locks;
mod tails;
mod resume;
mod chunks;
mod medium;
mod flusher;
pub(crate) use medium::choose as choose_medium;
pub(crate) use chunks::ChunkStore;
pub use chunks::MemoryHeld;
pub use archive::{ArchiveReport, ArchiveSource, CreateOptions as ArchiveOptions};
pub use edit::{EditReport, NewBytes};
pub use recall::RecallReport;
pub use inspect::{ChunkInfo, FileInfo, Place, TreeStats};
pub use pins::{tier_name, RestoreInfo, TierBytes, TierPin, TierStatus};
pub use tree::{CloneOptions, SnapshotInfo, SNAPSHOT_DIR};

pub(crate) use file::FileTable;
pub use file::{Opened, ReadBytes};
pub use flush::FlushReport;
pub(crate) use flush::discard_packs;
pub use follow::{ChangeBatch, ChangeFollower, FOLLOW_POLL};
pub use locks::{lock_conflict, LockKind, LockOutcome, LockOwner, LockRequest, LockRow, LockStyle, LOCK_EOF};

use crate::config::{Layout, VolumeConfig};
use crate::crypto::Keys;
use crate::error::{Error, ErrorKind, Result};
use crate::journal::Journal;
use crate::meta::{self, Meta};
use crate::types::{Ino, StatFs};
use cairn_backend::Backend;
use dashmap::DashMap;
use parking_lot::Mutex;
use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;
use zeroize::Zeroizing;

/// Options for opening a volume.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// Passphrase of an encrypted volume.
    pub passphrase: Option<Zeroizing<Vec<u8>>>,
    /// Open with a shared lock, without replaying the journal and without
    /// writing anything (for `stats` of an unmounted volume; a mount answers
    /// such questions through its control socket).
    pub read_only: bool,
    /// Bytes of decoded chunks kept in memory.
    pub cache_bytes: usize,
    /// Flush a file once this many bytes of it are dirty.
    pub flush_bytes: u64,
    /// Flush dirty data older than this.
    pub flush_age: Duration,
    /// Block writers while the journal holds more than this.
    pub journal_limit: u64,
    /// How long a metadata write transaction stays open for more changes
    /// (group commit, `meta::GROUP_WINDOW`); zero commits every change.
    pub group_commit: Duration,
    /// Use this backend instead of the one the volume's settings name (it
    /// must be the one `init` was given, if it was given one).
    pub backend: Option<crate::config::InjectedBackend>,
    /// Cache, durability, shipping and lease settings of a cloud volume.
    pub cloud: crate::cloud::CloudOptions,
    /// Record an access trace into this file (docs/trace.md).
    pub trace: Option<std::path::PathBuf>,
    /// A tape volume's CDP mirror (docs/tape.md §4): a choice other than
    /// the remembered one is written into the local settings first, so it
    /// holds for the next opens from this directory too.
    pub mirror: crate::mirror::MirrorChoice,
    /// Replay a damaged journal: every record that verifies, skipping the
    /// damaged stretches, with a copy of each damaged segment kept in
    /// `journal-damaged/` (`cairn fsck --salvage-journal`). Without it a
    /// damaged segment stops the open.
    pub salvage_journal: bool,
    /// The PostgreSQL database of a volume whose config says its metadata
    /// lives there (`postgres://USER@HOST:PORT/DB`); must be absent for a
    /// volume with SQLite metadata.
    pub meta_url: Option<String>,
    /// How long one metadata operation may wait for PostgreSQL (retries
    /// included) before it fails with EIO (its store's default: 30 s).
    pub meta_timeout: Option<Duration>,
    /// Every PostgreSQL commit waits for the WAL flush (JuiceFS's way);
    /// else a change is durable at the next fsync, fsyncdir or syncfs
    /// (the engine's `sync`), or within PostgreSQL's WAL writer delay, as
    /// a local volume's changes are at the end of their group window.
    pub meta_sync_commit: bool,
    /// On a shared volume, a fixed time a chunk whose last reference went
    /// stays before gc or the cleaner may delete it (None: until no flush
    /// round that began before it died is under way on any machine,
    /// `Volume::collect_dead_before`; zero: at once), and how long a gone
    /// session's upload records stay (None:
    /// [`crate::maintenance::CHUNK_GRACE`]); unused elsewhere.
    pub chunk_grace: Option<Duration>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            passphrase: None,
            read_only: false,
            cache_bytes: 256 << 20,
            flush_bytes: 64 << 20,
            flush_age: Duration::from_secs(5),
            journal_limit: 2 << 30,
            group_commit: crate::meta::GROUP_WINDOW,
            backend: None,
            cloud: Default::default(),
            trace: None,
            mirror: Default::default(),
            salvage_journal: false,
            meta_url: None,
            meta_timeout: None,
            meta_sync_commit: false,
            chunk_grace: None,
        }
    }
}

/// What the kernel may cache about a mounted volume. Changes made outside a
/// kernel request (through the control socket) are reported here so the
/// FUSE adapter can drop stale pages, attributes and names.
pub trait KernelCache: Send + Sync {
    /// Content or attributes of `ino` changed.
    fn inode_changed(&self, ino: Ino);
    /// The entry `name` of directory `parent` appeared, went or changed.
    fn entry_changed(&self, parent: Ino, name: &[u8]);
    /// Content of `ino` changed and its size is now `size`; `tail` is its
    /// content from the start of the page holding its last byte to `size`.
    /// A kernel with a writeback cache keeps its own size of a file and
    /// ignores the daemon's, so dropping attributes is not enough (an
    /// append would write at the old end): the adapter hands the kernel
    /// these bytes, which also sets its size when the file grew. No notice
    /// lowers that size when the file shrank (an rpwrite that deleted
    /// bytes): the caller ftruncates, as `cairn.h` says.
    fn size_changed(&self, ino: Ino, size: u64, tail: &[u8]) {
        let _ = (size, tail);
        self.inode_changed(ino);
    }
}

/// An open Cairn volume.
pub struct Volume {
    pub(crate) layout: Layout,
    pub(crate) cfg: VolumeConfig,
    pub(crate) vid: [u8; 16],
    pub(crate) meta: Meta,
    pub(crate) journal: Journal,
    /// The open files and every change of their state.
    pub(crate) files: FileTable,
    /// The chunks and packs: keys, backend, caches, locations, prefetch.
    pub(crate) chunks: ChunkStore,
    /// Flush rounds: their lock, marks, buffers, upload threads, and the
    /// background thread with its wake signal (flusher.rs).
    pub(crate) flusher: flusher::Flusher,
    /// Inodes the kernel holds (a FUSE mount's lookup counts).
    pub(crate) kernel_refs: kernel_refs::KernelRefs,
    /// The inode count statfs last read and when: counting is O(inodes),
    /// and a `df` or a program that calls statfs before each write must
    /// not pay it every time (at most one count a second).
    inode_count: Mutex<Option<(std::time::Instant, u64)>>,
    /// This mount's rows in the store's open-file registry (open_files.rs).
    pub(crate) open_files: open_files::OpenFiles,
    /// Inodes on which this mount took a lock in the store and may still
    /// hold one, with a count of lock requests (locks.rs): a close of any
    /// other file releases nothing, so it asks the store nothing.
    pub(crate) locked: DashMap<Ino, u64>,
    /// Where the packs go (a directory, a bucket, a tape) and what that
    /// asks of the flush, chosen at open (medium.rs); holds the tape's
    /// feeding state and a bucket's held pack.
    pub(crate) medium: Box<dyn medium::Medium>,
    /// Held (read side) by every [`flush::Batch`] for its life, since a batch
    /// may hold ids of dead chunks it found by hash; the cleaner deletes
    /// dead chunk rows only under the write side (docs/frugal.md §5).
    pub(crate) chunk_guard: guard::ChunkGuard,
    /// A shared volume's position in its change log (volume/follow.rs).
    pub(crate) changes: Option<Mutex<follow::FollowState>>,
    /// The cleaner's thread (docs/frugal.md §5, §8), on every kind of
    /// volume but a tape; stopped first at close.
    pub(crate) cleaner: OnceLock<crate::background::Background>,
    pub(crate) opts: OpenOptions,
    closed: AtomicBool,
    self_ref: OnceLock<Weak<Volume>>,
    /// The FUSE adapter's hook for dropping kernel caches.
    kernel: OnceLock<Arc<dyn KernelCache>>,
    /// Bucket, cache, lease and metadata shipping of a cloud volume.
    pub(crate) cloud: Option<crate::cloud::Cloud>,
    /// Where the access trace goes, when one is recorded.
    pub(crate) trace: Option<Arc<crate::trace::TraceWriter>>,
    /// Read and write requests, counted for a KD cache policy's mode
    /// windows (docs/frugal.md §1).
    pub(crate) io: Option<crate::cache::IoWindows>,
    /// Background failures not yet followed by a success (`status`).
    pub(crate) problems: crate::health::Problems,
    /// Counters for monitoring (`metrics_snapshot`).
    pub(crate) metrics: crate::metrics::Metrics,
    /// Tests: a stalled machine made deterministic (a frozen heartbeat, a
    /// flush held between its uploads and its commit).
    pub(crate) stall: Stall,
    opened: std::time::Instant,
    /// The volume directory's lock: the last field, so it goes after
    /// everything that may still write to the directory when the volume
    /// drops (the cache's clean mark, the lease).
    _lock: Option<File>,
}

/// Tests' hooks that stall a machine (see [`Volume::pause_heartbeat`],
/// [`Volume::hold_next_flush_commit`], [`Volume::hold_next_move_commit`]).
#[derive(Default)]
pub(crate) struct Stall {
    pub heartbeat_paused: AtomicBool,
    pub flusher_paused: AtomicBool,
    pub before_commit: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    pub before_move_commit: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

/// What [`Volume::assemble`] builds a volume from.
pub(crate) struct Parts {
    pub layout: Layout,
    pub cfg: VolumeConfig,
    pub keys: Keys,
    pub vid: [u8; 16],
    /// The store of packs (a cloud volume's: its cache).
    pub backend: Arc<dyn Backend>,
    pub cloud: Option<crate::cloud::Cloud>,
    /// Where the packs go, chosen by `crate::open` ([`medium::choose`]).
    pub medium: Box<dyn medium::Medium>,
    pub trace: Option<Arc<crate::trace::TraceWriter>>,
    pub io: Option<crate::cache::IoWindows>,
    /// The volume lock, held for the volume's life.
    pub lock: File,
}

/// A file in the volume's directory holding why its last close failed
/// (removed by the next read-write open): `cairn umount` reports it.
pub const CLOSE_ERROR: &str = "close-error";

/// Opens the metadata store the volume's config names: its SQLite
/// database, or its schema in the PostgreSQL database `opts.meta_url`.
fn open_meta(layout: &Layout, cfg: &VolumeConfig, opts: &OpenOptions) -> Result<Meta> {
    check_meta_url(layout, cfg, opts.meta_url.as_deref())?;
    match (cfg.meta, opts.meta_url.as_deref()) {
        (crate::config::MetaKind::Postgres, Some(url)) => {
            Meta::open(meta::Location::Url { url, volume_id: &cfg.volume_id }, meta::OpenOptions { timeout: opts.meta_timeout, sync_commit: opts.meta_sync_commit, ..Meta::options() })
        }
        _ => Meta::open(meta::Location::File(&layout.meta_db()), meta::OpenOptions { exclusive: !opts.read_only, group_window: opts.group_commit, ..Meta::options() }),
    }
}

/// Refuses a PostgreSQL volume opened without a database URL, and a URL
/// given for a volume whose metadata is in SQLite.
pub(crate) fn check_meta_url(layout: &Layout, cfg: &VolumeConfig, url: Option<&str>) -> Result<()> {
    match (cfg.meta, url) {
        (crate::config::MetaKind::Postgres, None) => Err(Error::config(format!(
            "this volume keeps its metadata in PostgreSQL (schema cairn_{}): add --meta postgres://USER@HOST/DB",
            cfg.volume_id
        ))),
        (crate::config::MetaKind::Sqlite, Some(_)) => Err(Error::config(format!(
            "this volume keeps its metadata in SQLite ({}), not in PostgreSQL: leave out --meta",
            layout.meta_db().display()
        ))),
        _ => Ok(()),
    }
}

impl Volume {
    /// Builds an open volume from its parts (`crate::open` opened the
    /// directory, its store and its cloud parts): opens the metadata and
    /// the journal, replays it, and starts the flusher. The cloud's
    /// threads are started by the caller.
    pub(crate) fn assemble(p: Parts, opts: OpenOptions) -> Result<Arc<Volume>> {
        let Parts { layout, cfg, keys, vid, backend, cloud, medium, trace, io, lock } = p;
        let meta = open_meta(&layout, &cfg, &opts)?;
        // A volume from before the cleaner's accrual columns gets them.
        let altered = !opts.read_only && meta.write(|tx| Ok(tx.ensure_dead_accrual()?))?;
        if let Some(c) = cloud.as_ref().filter(|_| !opts.read_only) {
            // A volume from before the bill gets its table. New tables and
            // columns are not in the versions shipped so far (a session
            // records rows, not schema), so the next version is a base;
            // so after a schema upgrade at this open.
            if meta.write(|tx| Ok(tx.ensure_bill_table()?))? || altered || meta.schema_upgraded() {
                c.need_base.store(true, Ordering::SeqCst);
            }
            if c.ships_metadata {
                meta.capture_changes()?;
            }
        }
        let (journal, records) = if opts.read_only {
            // Look without touching: no journal at all.
            (Journal::disabled(), Vec::new())
        } else {
            Journal::open_with(&layout.journal(), keys.journal_cipher(), opts.salvage_journal)?
        };
        if !opts.read_only && cfg.meta == crate::config::MetaKind::Postgres {
            // Other machines commit to this volume from journals of their
            // own: the store keeps this journal's marks apart (§11.1 of
            // docs/shared-volume.md). A journal holding records but no id
            // was written by a build without marks: it adopts the
            // positions that build recorded on the inodes. The id is kept
            // only after the store took it, so a crash in between adopts
            // again under a new id rather than not at all.
            let dir = layout.journal();
            match crate::journal::read_journal_id(&dir)? {
                Some(id) => {
                    meta.need_shared()?.set_journal(id, false)?;
                }
                None => {
                    let id = crate::journal::new_journal_id();
                    meta.need_shared()?.set_journal(id, !records.is_empty())?;
                    crate::journal::save_journal_id(&dir, id)?;
                }
            }
        }
        journal.bump_seq(meta.read(|tx| Ok(tx.max_jseq()?))?);
        // Other machines' changes are followed from here on (each open
        // reads the log first, `catch_up`).
        let changes = if cfg.meta == crate::config::MetaKind::Postgres { Some(follow::FollowState::at(meta.need_shared()?.change_cursor()?)) } else { None };
        // Where a read costs a request (a bucket, a tape), the last page of
        // each chunk is kept for the kernel's read before an append.
        let caps = backend.capabilities();
        let tail_bytes = if medium.keeps_tails() || caps.remote { tails::DEFAULT_BYTES } else { 0 };
        let vol = Arc::new(Volume {
            changes,
            layout,
            cfg,
            vid,
            chunks: ChunkStore::new(keys, backend, cloud.as_ref().map(|c| c.cache.clone()), opts.cache_bytes, tail_bytes, trace.clone()).with_recall_wait(opts.cloud.recall_wait),
            meta,
            journal,
            files: FileTable::default(),
            flusher: flusher::Flusher::new(),
            kernel_refs: Default::default(),
            inode_count: Mutex::new(None),
            open_files: Default::default(),
            locked: DashMap::new(),
            medium,
            chunk_guard: guard::ChunkGuard::default(),
            cleaner: OnceLock::new(),
            opts,
            closed: AtomicBool::new(false),
            self_ref: OnceLock::new(),
            kernel: OnceLock::new(),
            cloud,
            trace,
            io,
            problems: Default::default(),
            metrics: crate::metrics::Metrics::new(),
            stall: Stall::default(),
            opened: std::time::Instant::now(),
            _lock: Some(lock),
        });
        let _ = vol.self_ref.set(Arc::downgrade(&vol));
        if !vol.opts.read_only {
            let replayed = vol.replay(records)?;
            // On a volume other machines write, the store lists only the
            // nameless inodes no session has open (open_files.rs).
            vol.remove_orphans()?;
            if replayed > 0 {
                tracing::info!(records = replayed, "replayed the write-back journal");
                vol.sync()?;
            }
            vol.start_flusher();
        }
        Ok(vol)
    }

    /// Hands out a new inode number inside write transaction `tx` (the
    /// store's: numbers are never reused, see `docs/metadata-store.md`).
    pub(crate) fn alloc_ino(&self, tx: &dyn meta::MetaTx) -> Result<Ino> {
        Ok(tx.alloc_ino()?)
    }

    /// Whether other machines may open this volume's files: its metadata
    /// is in PostgreSQL. A close must then commit the file.
    pub fn is_shared(&self) -> bool {
        self.cfg.meta == crate::config::MetaKind::Postgres
    }

    /// Whether this handle refuses changes.
    pub fn is_read_only(&self) -> bool {
        self.opts.read_only
    }

    /// The volume's config.
    pub fn config(&self) -> &VolumeConfig {
        &self.cfg
    }

    /// Which writes may share chunks (fixed at `init`).
    pub fn dedup_domain(&self) -> crate::config::DedupDomain {
        self.cfg.dedup_domain
    }

    /// The backend holding the packs.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.chunks.backend
    }

    /// Installs the kernel cache hook (once, by the FUSE adapter).
    pub fn set_kernel_cache(&self, k: Arc<dyn KernelCache>) {
        let _ = self.kernel.set(k);
    }

    /// Tells the kernel that `ino` changed outside its requests (an ioctl).
    pub fn notify_changed(&self, ino: Ino) {
        self.kernel_inode_changed(ino);
    }

    /// Tells the kernel that `ino` changed outside its requests and is now
    /// `size` bytes long (an rpwrite ioctl): its cached pages and
    /// attributes go, and it learns the new size (see
    /// [`KernelCache::size_changed`]).
    pub fn notify_resized(&self, ino: Ino, size: u64) {
        let Some(k) = self.kernel.get() else { return };
        let from = size.saturating_sub(1) & !4095;
        let tail = if size == 0 { Vec::new() } else { self.read(ino, from, (size - from) as u32).unwrap_or_default() };
        if tail.len() as u64 == size - from {
            k.size_changed(ino, size, &tail);
        } else {
            k.inode_changed(ino);
        }
    }

    pub(crate) fn kernel_inode_changed(&self, ino: Ino) {
        if let Some(k) = self.kernel.get() {
            k.inode_changed(ino);
        }
    }

    pub(crate) fn kernel_entry_changed(&self, parent: Ino, name: &[u8]) {
        if let Some(k) = self.kernel.get() {
            k.entry_changed(parent, name);
        }
    }

    pub(crate) fn check_writable(&self) -> Result<()> {
        if self.opts.read_only {
            return Err(Error::new(ErrorKind::ReadOnly, "volume is open read-only"));
        }
        if let Some(c) = self.cloud.as_ref().filter(|c| c.lost.load(Ordering::SeqCst)) {
            return Err(Error::new(ErrorKind::ReadOnly, match c.guard() {
                "session" => "this mount's session in the metadata store expired",
                _ => "this mount lost the volume's lease to another machine",
            }));
        }
        Ok(())
    }

    /// Whether fsync must reach the bucket (`--durability remote`): the
    /// medium's (medium.rs).
    pub(crate) fn durable_remotely(&self) -> bool {
        self.medium.durable_remotely()
    }

    /// The cache and bucket of a cloud volume.
    pub fn cloud(&self) -> Option<&crate::cloud::Cloud> {
        self.cloud.as_ref()
    }

    /// How the mount is doing: its health, and what it holds that the
    /// backend does not have yet. Takes no metadata lock and flushes
    /// nothing (it must answer while a flush is stuck).
    pub fn status(&self) -> crate::health::MountStatus {
        let mut problems: Vec<crate::health::Problem> = [&self.problems.flush, &self.problems.metadata, &self.problems.lease].iter().filter_map(|s| s.get()).collect();
        let (mut queue_bytes, mut queue_objects) = (0, 0);
        if let Some(c) = &self.cloud {
            let s = c.cache.stats();
            (queue_bytes, queue_objects) = (s.dirty_bytes, s.dirty_objects);
            // A failed upload whose pack left the queue otherwise (gc
            // deleted it) is no problem any more.
            if queue_objects > 0 {
                problems.extend(c.cache.upload_problem());
            }
        }
        problems.sort_by_key(|p| p.since);
        let lost = self.cloud.as_ref().is_some_and(|c| c.lost.load(Ordering::SeqCst));
        if let Some(c) = self.cloud.as_ref().filter(|_| lost) {
            problems.push(crate::health::Problem { what: c.guard().into(), error: c.lost_error().message().to_string(), since: 0, failures: 1 });
        }
        let journal_bytes = self.journal.bytes();
        let mut health = crate::health::MountStatus::judge(&problems, lost);
        if lost && self.cloud.as_ref().is_some_and(|c| c.guard() == "session") {
            health = "session_lost";
        }
        crate::health::MountStatus {
            health: health.to_string(),
            problems,
            read_only: self.opts.read_only || lost,
            in_bucket: self.cloud.is_some(),
            journal_bytes,
            journal_limit: self.opts.journal_limit,
            dirty_files: self.dirty_files(),
            upload_queue_bytes: queue_bytes,
            upload_queue_objects: queue_objects,
            dirty_bytes: journal_bytes + queue_bytes,
            metadata: self.opts.meta_url.as_ref().filter(|_| self.is_shared()).map(|url| match self.session_id() {
                Some(id) => format!("{url} (session {id})"),
                None => format!("{url} (no session: read-only)"),
            }),
        }
    }

    /// The counters the FUSE adapter adds to (requests, kernel bytes).
    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.metrics
    }

    /// Every counter and gauge of this volume now (`cairn top`, the
    /// Prometheus endpoint).
    pub fn metrics_snapshot(&self) -> crate::metrics::Snapshot {
        let mut s = self.metrics.snapshot();
        s.uptime_secs = self.opened.elapsed().as_secs_f64();
        s.journal_bytes = self.journal.bytes();
        s.journal_limit = self.opts.journal_limit;
        s.flush_queue_files = self.dirty_files();
        if let Some(c) = &self.cloud {
            let cs = c.cache.stats();
            s.pack_cache_hits = cs.hits;
            s.pack_cache_misses = cs.misses;
            s.pack_cache_fetched_bytes = cs.bytes_fetched;
            s.pack_cache_evictions = cs.evictions;
            s.upload_queue_objects = cs.dirty_objects;
            s.upload_queue_bytes = cs.dirty_bytes;
            if let Some(m) = &c.meter {
                let life = m.lifetime();
                s.backend = cairn_backend::RequestKind::ALL
                    .into_iter()
                    .map(|k| {
                        let t = life.total(k);
                        crate::metrics::BackendStat { kind: k.name().to_string(), requests: t.requests, bytes: t.bytes, errors: m.errors(k) }
                    })
                    .collect();
            }
        }
        s
    }

    /// Files with changes the flusher has not committed yet.
    pub(crate) fn dirty_files(&self) -> u64 {
        self.files.dirty_count()
    }

    /// Before an operation that visits the metadata of many files: see
    /// [`meta::Meta::prefetch`]. Databases over 256 MiB are left alone (the
    /// operation may need only a small part of them).
    pub(crate) fn prefetch_metadata(&self) {
        self.meta.prefetch(256 << 20);
    }

    /// Flushes every dirty file to the backend and makes the metadata durable.
    pub fn sync(&self) -> Result<()> {
        if self.opts.read_only {
            return Ok(());
        }
        self.flush_round(true)?;
        self.meta.sync()?;
        if self.durable_remotely() {
            self.ship_durably()?;
        }
        Ok(())
    }

    /// Makes every metadata change committed so far durable (namespace
    /// operations, clones, snapshots, edits) without flushing file data:
    /// one WAL fsync, or nothing when all is durable already.
    pub fn sync_metadata(&self) -> Result<()> {
        if self.opts.read_only {
            return Ok(());
        }
        self.meta.sync()?;
        if self.durable_remotely() {
            self.ship_durably()?;
        }
        Ok(())
    }

    /// Whether every committed metadata transaction is known durable (for
    /// tests of the write-ordering rules).
    #[doc(hidden)]
    pub fn metadata_is_durable(&self) -> bool {
        self.meta.is_durable()
    }

    /// Flushes every dirty file now and reports what that took (tests and
    /// benchmarks use it to count re-chunked and new bytes).
    pub fn flush_now(&self) -> Result<FlushReport> {
        self.check_writable()?;
        let r = self.flush_round(true)?;
        self.meta.sync()?;
        Ok(r)
    }

    /// One background flush round now (files due, old or large), as the
    /// flusher thread would run it: for tests.
    #[doc(hidden)]
    pub fn flush_due(&self) -> Result<FlushReport> {
        self.check_writable()?;
        self.flush_round(false)
    }

    /// Flushes one file now, whole (nothing held back), and reports the
    /// round: for tests that must see what a flush of that file did (the
    /// background flusher takes closed files on its own schedule).
    #[doc(hidden)]
    pub fn flush_file_now(&self, ino: Ino) -> Result<FlushReport> {
        self.check_writable()?;
        self.flush_round_of(true, Some(ino))
    }

    /// Tests: stops (or resumes) the background flusher's rounds, so that
    /// a test runs the rounds itself ([`Volume::flush_due`]) and sees what
    /// each one did.
    #[doc(hidden)]
    pub fn pause_flusher(&self, paused: bool) {
        self.stall.flusher_paused.store(paused, Ordering::SeqCst);
    }

    /// Tests: whether this mount holds changes of `ino` not yet committed
    /// (bytes in its overlay, or a size or times to write).
    #[doc(hidden)]
    pub fn is_dirty(&self, ino: Ino) -> bool {
        self.files.get(&ino).is_some_and(|e| {
            let g = e.value().inner.lock();
            !g.evicted && g.is_dirty()
        })
    }

    /// Tests: stops (or resumes) this mount's session heartbeats, as a
    /// machine frozen by SIGSTOP or a paused VM would, while the rest of
    /// the engine runs on.
    #[doc(hidden)]
    pub fn pause_heartbeat(&self, paused: bool) {
        self.stall.heartbeat_paused.store(paused, Ordering::SeqCst);
    }

    /// Tests: the next flush round that gets to its commit runs `f` first,
    /// its packs uploaded and recorded, its transaction not begun (a
    /// machine stalled between a pack's upload and its commit).
    #[doc(hidden)]
    pub fn hold_next_flush_commit(&self, f: impl FnOnce() + Send + 'static) {
        *self.stall.before_commit.lock() = Some(Box::new(f));
    }

    /// Tests: the next gc or cleaner round that gets to its commit runs
    /// `f` first, its copies uploaded (and recorded), its transaction not
    /// begun, its maintenance lock held or lost (a machine stalled between
    /// a repack's upload and its commit).
    #[doc(hidden)]
    pub fn hold_next_move_commit(&self, f: impl FnOnce() + Send + 'static) {
        *self.stall.before_move_commit.lock() = Some(Box::new(f));
    }

    /// Stops background work and drops the handle without flushing or
    /// syncing anything, as `kill -9` would: for crash tests.
    #[doc(hidden)]
    pub fn simulate_crash(self: Arc<Self>) {
        self.closed.store(true, Ordering::SeqCst);
        if let Some(c) = self.cleaner.get() {
            c.stop();
        }
        // Namespace changes still in the open group-commit transaction die
        // with the process.
        self.meta.abandon();
        {
            let mut s = self.flusher.signal.state.lock();
            s.1 = true;
            self.flusher.signal.cv.notify_all();
        }
        if let Some(h) = self.flusher.thread.lock().take() {
            let _ = h.join();
        }
        self.chunks.stop_prefetching();
        if let Some(c) = &self.cloud {
            c.abandon();
        }
    }

    /// Syncs and stops background work. Call once, at unmount.
    pub fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        // Its round under way ends first (it may be this thread's: then
        // it has ended).
        if let Some(c) = self.cleaner.get() {
            c.stop();
        }
        // The kernel is gone: files without names it still held go now.
        let freed = if self.opts.read_only { Ok(()) } else { self.free_forgotten_at_close() };
        let r = freed.and_then(|()| self.sync());
        if r.is_ok() {
            // A clean unmount leaves no marks behind (its journal is empty).
            let _round = self.flusher.mutex.lock();
            self.trim_marks(true);
        }
        {
            let mut s = self.flusher.signal.state.lock();
            s.1 = true;
            self.flusher.signal.cv.notify_all();
        }
        if let Some(h) = self.flusher.thread.lock().take() {
            // The last handle may be dropped on the flusher thread itself.
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
        // Read-ahead still in flight fills the cache: done before the
        // cache closes, and before the directory is let go.
        self.chunks.stop_prefetching();
        let r = match &self.cloud {
            Some(c) if r.is_ok() && !self.opts.read_only => self.close_cloud(c),
            Some(c) => {
                c.abandon();
                r
            }
            None => r,
        };
        // What the bill counted since it was last saved (the last version's
        // upload, the lease's release, a read-only open's requests).
        self.save_bill_residue();
        if let Some(t) = &self.trace {
            if let Err(e) = t.flush() {
                tracing::warn!("writing the access trace: {e}");
            }
        }
        if !self.opts.read_only {
            self.meta.checkpoint()?;
        }
        if let Err(e) = &r {
            // For `cairn umount`, which waits for this process to let the
            // directory's lock go and then says why the close failed.
            // Private as every file of the directory (the reason may name files).
            let path = self.layout.dir.join(CLOSE_ERROR);
            if let Err(w) = crate::fsutil::create_private_file(&path).and_then(|mut f| std::io::Write::write_all(&mut f, e.message().as_bytes())) {
                tracing::warn!("saving the close's error in {}: {w}", self.layout.dir.display());
            }
        }
        r
    }

    /// At unmount, after the last flush: stops the cloud's threads, waits
    /// for every upload, ships the last version (with the bill of those
    /// uploads), marks the directory clean and gives the lease back.
    fn close_cloud(&self, c: &crate::cloud::Cloud) -> Result<()> {
        c.stop_threads();
        c.drain_uploads();
        if c.is_lost() {
            c.abandon();
            return Err(c.lost_error());
        }
        self.ship_durably()?;
        c.finish(&self.layout.dir)?;
        if let Some(&id) = c.session.get() {
            self.meta.need_shared()?.close_session(id)?;
        }
        Ok(())
    }

    /// The number of inodes, counted at most once a second (statfs's file
    /// count may be that stale, as on file systems that sum per-CPU counters).
    fn inode_count(&self) -> Result<u64> {
        const FRESH: std::time::Duration = std::time::Duration::from_secs(1);
        let mut last = self.inode_count.lock();
        match *last {
            Some((at, n)) if at.elapsed() < FRESH => Ok(n),
            _ => {
                let n = self.meta.read(|tx| Ok(tx.count_inodes()?))?;
                *last = Some((std::time::Instant::now(), n));
                Ok(n)
            }
        }
    }

    /// File system totals: space from the local disk under the volume.
    pub fn statfs(&self) -> Result<StatFs> {
        let path = std::ffi::CString::new(self.layout.dir.as_os_str().as_encoded_bytes())
            .map_err(|_| Error::invalid("volume path contains NUL"))?;
        // SAFETY: statvfs writes into the zeroed struct we pass.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(path.as_ptr(), &mut s) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        let files = self.inode_count()?;
        let bs = s.f_frsize as u64;
        Ok(StatFs {
            block_size: 4096,
            blocks: s.f_blocks * bs / 4096,
            blocks_free: s.f_bfree * bs / 4096,
            blocks_avail: s.f_bavail * bs / 4096,
            files: files + s.f_ffree,
            files_free: s.f_ffree,
            name_max: crate::types::NAME_MAX as u32,
        })
    }

    /// A chunk's plaintext, read for no file in particular, a fetch paid
    /// as a read miss (see [`ChunkStore::chunk`]).
    pub(crate) fn chunk(&self, id: u64) -> Result<Arc<Vec<u8>>> {
        self.chunks.chunk(id, crate::cache::ReadFor { who: cairn_backend::Subsystem::ReadMiss, group: None }, &self.meta, &self.metrics)
    }

    /// What this mount holds in memory per chunk and per pack.
    pub fn memory_held(&self) -> MemoryHeld {
        self.chunks.memory_held()
    }

    /// Starts fetching chunks `ids` of `ino` in the background (see
    /// [`ChunkStore::prefetch`]); each run holds the volume until it ends.
    pub(crate) fn prefetch(&self, ino: Ino, ids: Vec<u64>) {
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        let Some(me) = self.self_ref.get().and_then(Weak::upgrade) else { return };
        self.chunks.prefetch(me, &self.meta, ino, ids);
    }
}

impl AsRef<ChunkStore> for Volume {
    fn as_ref(&self) -> &ChunkStore {
        &self.chunks
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        if !self.closed.load(Ordering::SeqCst) {
            if let Err(e) = self.close() {
                tracing::error!("closing the volume: {e}");
            }
        }
    }
}
