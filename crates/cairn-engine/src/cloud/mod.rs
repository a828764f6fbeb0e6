//! Cloud volumes: a volume whose home is a bucket (docs/cloud.md).
//!
//! The bucket holds the config, the packs, the metadata versions and the
//! lease; the local directory (`--cache-dir`) holds the working metadata
//! database, the write-back journal, the pack cache and outbox, and
//! `cloud.json` (this directory's shipping state). A machine with only the
//! passphrase mounts the volume by rebuilding the database from the latest
//! metadata chain.

pub use crate::{lease, versions};

pub use crate::background::Background;
// Where a volume lives and how its store opens (kept at their old paths).
pub use crate::config::{is_cloud_url, is_remote_url};
pub use crate::location::{explain, open_remote, open_remote_with};

use crate::cache::disk::{CachedBackend, DiskCacheOptions, Durability};
use crate::cache::IoWindows;
use crate::config::{write_settings, Layout, LocalSettings};
use crate::crypto::Keys;
use crate::error::{Error, ErrorKind, Result};
use cairn_backend::Backend;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Where packs wait for deletion (format.md "Trash").
pub const TRASH_PREFIX: &str = "trash/";

/// Largest trash object read. A hostile bucket's bigger one is refused
/// by its listed size and never read whole: at most this much is fetched
/// (format.md "Trash").
pub const MAX_TRASH_OBJECT: u64 = 16 << 20;

/// Pack names per trash object written (about 80 bytes each: about 5 MiB,
/// well under [`MAX_TRASH_OBJECT`]).
pub const TRASH_NAMES_PER_OBJECT: usize = 65_536;

/// The pack names of trash object `t` (as listed), fetching at most its
/// listed size and refusing one above [`MAX_TRASH_OBJECT`].
pub(crate) fn read_trash(remote: &dyn Backend, t: &cairn_backend::ObjectInfo) -> Result<Vec<String>> {
    if t.size == 0 || t.size > MAX_TRASH_OBJECT {
        return Err(Error::corrupt(format!("trash object {} is {} bytes; one is 1 byte to {MAX_TRASH_OBJECT} (not read)", t.name, t.size)));
    }
    let bytes = remote.get_range(&t.name, 0, t.size)?;
    serde_json::from_slice(&bytes).map_err(|e| Error::corrupt(format!("trash object {}: {e}", t.name)))
}

/// The version a trash object was written at.
pub fn trash_version(name: &str) -> Option<u64> {
    let rest = name.strip_prefix(TRASH_PREFIX)?;
    rest.split('-').next()?.parse().ok()
}

/// The fetch alignment of a tape's read cache (a bucket's is exact).
const TAPE_CACHE_BLOCK: u64 = 64 << 10;

/// A pack written to a tape stays cached in pieces of this size. In the
/// 64 KiB pieces a bucket's cache keeps (`KEEP_PIECE`), a 500 MiB file
/// made 8,000 files in the cache, and creating them slowed the flush below
/// the drive's rate: one writer's `dd` went to tape at 59-61% of the raw
/// drive with a backhitch, 94-95% without one in 4 MiB pieces
/// (docs/tape.md §11). Eviction by 4 MiB costs a tape nothing: it is
/// not billed per request.
const TAPE_KEEP_PIECE: u64 = 4 << 20;

/// Settings of a mount of a cloud volume.
#[derive(Clone, Debug)]
pub struct CloudOptions {
    /// Bound on the local pack cache (clean and not yet uploaded bytes).
    pub cache_bytes: u64,
    /// A read miss's fetch is rounded out to aligned blocks of this many
    /// bytes of a pack; 0 (the default): exactly what the read needs.
    pub cache_block: u64,
    /// A miss continuing a pack's last GET fetches this much more.
    pub cache_ahead: u64,
    /// When fsync returns: data safe locally, or in the bucket.
    pub durability: Durability,
    /// How often metadata changes are shipped (at most this much is lost
    /// with the machine).
    pub meta_interval: Duration,
    /// Take over an expired lease.
    pub force: bool,
    /// How often a read-write mount renews its lease (at the metadata
    /// shipper's next round after this much time): at most
    /// [`lease::MAX_RENEW`], so that one failed renewal leaves the lease
    /// time to be renewed before it expires.
    pub lease_renew: Duration,
    /// How long a session in PostgreSQL lives without a heartbeat (a
    /// read-write mount of a volume whose metadata is there); heartbeats
    /// come five times in it.
    pub session_ttl: Duration,
    /// How often the cost-optimal cleaner looks for packs due for cleaning
    /// (docs/frugal.md §5, §8), on every kind of volume but a tape; None:
    /// never inside the mount (nor the bound below).
    pub gc_interval: Option<Duration>,
    /// The prices the cleaner weighs (what storing dead bytes and cleaning
    /// them cost); None: by the volume's kind ([`crate::cost::Prices::aws`]
    /// in a bucket, [`crate::cost::Prices::local_disk`] in a directory).
    pub gc_prices: Option<crate::cost::Prices>,
    /// The cleaner's hard bound on dead bytes (docs/frugal.md §8).
    pub gc_bound: crate::cleaner_rules::DeadBound,
    /// What the pack cache evicts first.
    pub cache_policy: crate::cache::PolicyChoice,
    /// How long a read of an archived pack waits for its restore
    /// (`--recall-wait`) before it fails with EAGAIN (docs/tiers.md §6).
    pub recall_wait: Duration,
}

impl CloudOptions {
    /// The prices the cleaner weighs on a volume in a bucket (`remote`) or
    /// in a directory.
    pub fn prices_for(&self, remote: bool) -> crate::cost::Prices {
        match &self.gc_prices {
            Some(p) => p.clone(),
            None if remote => crate::cost::Prices::aws(),
            None => crate::cost::Prices::local_disk(),
        }
    }
}

/// How long a read of an archived pack waits for its restore by default
/// (`--recall-wait`; docs/tiers.md §6). Here, with the option, so that the
/// volume imports it and not the other way round.
pub const RECALL_WAIT: Duration = Duration::from_secs(60);

impl Default for CloudOptions {
    fn default() -> Self {
        CloudOptions { cache_bytes: 10 << 30, cache_block: crate::cache::disk::DEFAULT_BLOCK, cache_ahead: crate::cache::disk::DEFAULT_AHEAD, durability: Durability::Local, meta_interval: Duration::from_secs(5), force: false, lease_renew: lease::RENEW, session_ttl: crate::meta::SESSION_TTL, gc_interval: Some(Duration::from_secs(60)), gc_prices: None, gc_bound: Default::default(), cache_policy: Default::default(), recall_wait: RECALL_WAIT }
    }
}

/// This directory's shipping state, `DIR/cloud.json`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct LocalState {
    /// Random id of this directory, written into every version it ships.
    pub writer: String,
    /// The newest version this directory's database is equal to (shipped by
    /// it, or rebuilt from the bucket).
    pub shipped: u64,
    /// Set while mounted read-write: changes may exist that no version
    /// holds. Found set at open (a crash), the next version is a base.
    pub dirty: bool,
    /// The latest base and what followed it, to decide when to ship a base.
    pub base_version: u64,
    pub base_bytes: u64,
    pub deltas_since_base: u64,
    pub delta_bytes_since_base: u64,
    /// The digest of version `shipped`'s stored object (hex), which the
    /// next version names; absent when not known here (it is then read
    /// from the bucket).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shipped_digest: Option<String>,
}

impl LocalState {
    fn path(dir: &Path) -> PathBuf {
        dir.join("cloud.json")
    }

    pub fn fresh() -> Self {
        LocalState { writer: hex::encode(rand::random::<[u8; 8]>()), shipped: 0, dirty: false, base_version: 0, base_bytes: 0, deltas_since_base: 0, delta_bytes_since_base: 0, shipped_digest: None }
    }

    pub fn writer_bytes(&self) -> [u8; 8] {
        let mut w = [0u8; 8];
        let _ = hex::decode_to_slice(&self.writer, &mut w);
        w
    }

    /// What the next version names as its predecessor: version `shipped`
    /// and its digest (known here, or read from the bucket).
    pub fn predecessor(&self, remote: &dyn Backend) -> Result<Option<versions::Prev>> {
        if self.shipped == 0 {
            return Ok(None);
        }
        let mut known = [0u8; 32];
        let digest = match self.shipped_digest.as_deref().map(|h| hex::decode_to_slice(h, &mut known)) {
            Some(Ok(())) => known,
            _ => versions::digest_of(remote, self.shipped)?,
        };
        Ok(Some(versions::Prev { version: self.shipped, digest }))
    }

    pub fn load(dir: &Path) -> Result<Option<Self>> {
        match std::fs::read(Self::path(dir)) {
            Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| Error::config(format!("{} is damaged: {e}", Self::path(dir).display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::os(format_args!("reading {}", Self::path(dir).display()), &e)),
        }
    }

    /// Written atomically and durably.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let p = Self::path(dir);
        let tmp = p.with_extension("json.tmp");
        let w = || -> std::io::Result<()> {
            let mut f = crate::fsutil::create_private_file(&tmp)?;
            std::io::Write::write_all(&mut f, &serde_json::to_vec_pretty(self).expect("state serialises"))?;
            f.sync_all()?;
            std::fs::rename(&tmp, &p)
        };
        w().map_err(|e| Error::os(format_args!("writing {}", p.display()), &e))?;
        crate::fsutil::fsync_dir(dir)
    }
}

/// Makes `layout`'s database the bucket's latest state when it is missing
/// or behind (another machine wrote since), and returns the directory's
/// state. Refuses when both sides changed.
///
/// A version missing from the latest chain stops a read-write open with
/// an error naming it; a read-only one (`read_only`) uses the intact part
/// before the hole (or this directory's own database, if it is further).
pub fn sync_down(layout: &Layout, remote: &dyn Backend, keys: &Keys, volume: &str, read_only: bool) -> Result<LocalState> {
    let all = versions::list(remote)?;
    let (latest, holed) = match versions::chain(&all, None) {
        Ok(c) => (c, false),
        Err(e) if read_only && e.kind() == ErrorKind::Corrupt => match versions::intact_prefix(&all) {
            Some(c) => {
                tracing::warn!("{volume}: {e}");
                (c, true)
            }
            None => return Err(e),
        },
        Err(e) => return Err(Error::new(e.kind(), format!("{volume}: {}", e.message()))),
    };
    let top = latest.last().expect("a chain is never empty").version;
    let have_db = layout.meta_db().exists();
    let mut state = match LocalState::load(&layout.dir)? {
        Some(s) if have_db => s,
        _ => {
            let mut s = LocalState::fresh();
            rebuild_into(layout, remote, keys, &latest, &mut s)?;
            s.save(&layout.dir)?;
            return Ok(s);
        }
    };
    if remote.capabilities().deferred_durability {
        // A store that keeps a put only after a sync (a tape) may have lost
        // its tail to a power cut: what this directory's database names is
        // then not all there (docs/tape.md §2 "Crash").
        match lost_tail(layout, remote, &state, top)? {
            Tail::Intact => {}
            Tail::VersionsLost => {
                // Every pack is there, only versions published after the
                // last sync were lost: this database is still whole. The
                // next version is a base numbered after the store's top.
                tracing::warn!(local = state.shipped, store = top, "{volume}: metadata versions after {top} were lost with the drive's buffer; this directory's state is kept and published again");
                state.shipped = top;
                state.shipped_digest = None;
                state.dirty = true;
                state.save(&layout.dir)?;
                return Ok(state);
            }
            Tail::PacksLost(missing) => {
                let aside = set_aside(layout)?;
                tracing::warn!(
                    "{volume}: {} packs this directory's metadata names are not on the store (lost with the drive's buffer, never synced), e.g. {}; \
                     the store's latest state (version {top}) is mounted, and this directory's metadata and journal were moved to {}",
                    missing.len(),
                    missing[0],
                    aside.display()
                );
                let mut s = LocalState::fresh();
                rebuild_into(layout, remote, keys, &latest, &mut s)?;
                s.save(&layout.dir)?;
                return Ok(s);
            }
        }
    }
    if top == state.shipped {
        return Ok(state);
    }
    if holed && top < state.shipped {
        // Read-only: this directory's database holds the versions the hole
        // took and more; nothing is changed here.
        tracing::warn!("{volume}: this directory's metadata (version {}) is used read-only", state.shipped);
        return Ok(state);
    }
    if top < state.shipped {
        return Err(Error::config(format!(
            "{volume}: this directory ({}) has metadata version {} but the bucket's latest is {top}: versions were removed from the bucket. Remove the directory to start from the bucket's state",
            layout.dir.display(),
            state.shipped
        )));
    }
    // Newer versions: ours (a crash after an upload, before cloud.json
    // recorded it) or another machine's.
    let newer: Vec<versions::VersionInfo> = all.iter().filter(|v| v.version > state.shipped).cloned().collect();
    let heads = versions::headers(remote, &newer)?;
    if heads.iter().all(|h| h.writer == state.writer_bytes()) {
        state.shipped = top;
        state.shipped_digest = None;
        state.save(&layout.dir)?;
        return Ok(state);
    }
    if state.dirty {
        return Err(Error::new(
            ErrorKind::Busy,
            format!(
                "{volume}: another machine published metadata versions {}..{top} while this directory ({}) still has changes it never uploaded (a crash while mounted). Keeping both is not possible; remove the directory to take the bucket's state, or restore: `cairn meta list`",
                state.shipped + 1,
                layout.dir.display()
            ),
        ));
    }
    tracing::info!(from = state.shipped, to = top, "the bucket has newer metadata; rebuilding the local copy");
    let _ = std::fs::remove_dir_all(layout.journal());
    crate::fsutil::create_private_dir_all(&layout.journal())?;
    rebuild_into(layout, remote, keys, &latest, &mut state)?;
    state.save(&layout.dir)?;
    Ok(state)
}

/// What a store with deferred durability kept of what this directory
/// wrote before it last closed or crashed.
enum Tail {
    Intact,
    /// Every pack the database names is there; versions after the store's
    /// top are not.
    VersionsLost,
    /// Packs the database names that the store does not have.
    PacksLost(Vec<String>),
}

fn lost_tail(layout: &Layout, remote: &dyn Backend, state: &LocalState, top: u64) -> Result<Tail> {
    let named: Vec<String> = cairn_meta::shipped::pack_names_in(&layout.meta_db())?;
    // The store's listing is its in-memory index: no request per pack.
    let present: std::collections::HashSet<String> = remote.list("packs/")?.into_iter().map(|o| o.name).collect();
    let missing: Vec<String> = named.into_iter().filter(|n| !present.contains(n)).collect();
    Ok(if !missing.is_empty() {
        Tail::PacksLost(missing)
    } else if top < state.shipped {
        Tail::VersionsLost
    } else {
        Tail::Intact
    })
}

/// Moves this directory's metadata, shipping state and journal into a new
/// `lost-N/` beside them (kept for inspection, never read again), and
/// returns it.
fn set_aside(layout: &Layout) -> Result<PathBuf> {
    let aside = (1u32..).map(|n| layout.dir.join(format!("lost-{n}"))).find(|p| !p.exists()).expect("a free name");
    std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), crate::fsutil::PRIVATE_DIR).create(&aside).map_err(|e| Error::os(format_args!("creating {}", aside.display()), &e))?;
    let db = layout.meta_db();
    let db_name = db.file_name().expect("a file").to_string_lossy().to_string();
    let mut moved: Vec<PathBuf> = vec![LocalState::path(&layout.dir), layout.journal()];
    moved.extend(["", "-wal", "-shm", "-journal"].iter().map(|x| layout.dir.join(format!("{db_name}{x}"))));
    for p in moved.into_iter().filter(|p| p.exists()) {
        let to = aside.join(p.file_name().expect("a name"));
        std::fs::rename(&p, &to).map_err(|e| Error::os(format_args!("moving {} to {}", p.display(), to.display()), &e))?;
    }
    crate::fsutil::create_private_dir_all(&layout.journal())?;
    crate::fsutil::fsync_dir(&layout.dir)?;
    Ok(aside)
}

fn rebuild_into(layout: &Layout, remote: &dyn Backend, keys: &Keys, chain: &[versions::VersionInfo], state: &mut LocalState) -> Result<()> {
    let t = std::time::Instant::now();
    let (v, digest) = versions::rebuild(remote, keys, chain, &layout.meta_db(), &|_, _| {})?;
    tracing::info!(version = v, deltas = chain.len() - 1, elapsed = ?t.elapsed(), "metadata rebuilt from the bucket");
    state.shipped = v;
    state.shipped_digest = Some(hex::encode(digest));
    state.base_version = chain[0].version;
    state.base_bytes = chain[0].size;
    state.deltas_since_base = chain.len() as u64 - 1;
    state.delta_bytes_since_base = chain[1..].iter().map(|v| v.size).sum();
    Ok(())
}

/// The parts of an open cloud volume.
pub struct Cloud {
    /// The bucket, behind retries (config, versions, lease), its
    /// requests billed to `other`.
    pub remote: Arc<dyn Backend>,
    /// `remote`'s handle for each payer ([`Cloud::paid`]).
    paid: cairn_backend::Payers,
    /// Cache and outbox in front of it (the volume's backend).
    pub cache: Arc<CachedBackend>,
    pub opts: CloudOptions,
    pub lease: Option<lease::Lease>,
    /// This mount's session in the metadata store: what a read-write mount
    /// of a volume whose metadata is in PostgreSQL holds instead of the
    /// lease (many machines write at once; docs/shared-volume.md §7). Set
    /// by `crate::open` once the volume is assembled.
    pub session: std::sync::OnceLock<u64>,
    /// Whether the metadata ships to the bucket as versions (an SQLite
    /// store); false when PostgreSQL is its home: then there is no chain,
    /// no `cloud.json`, and `state` is an unsaved placeholder.
    pub ships_metadata: bool,
    pub state: parking_lot::Mutex<LocalState>,
    /// Serialises shipping (the background thread and fsyncs).
    pub ship_lock: Arc<parking_lot::Mutex<()>>,
    /// Set when the lease was lost: the volume refuses changes.
    pub lost: std::sync::atomic::AtomicBool,
    /// Why the lease was lost (the error that found it), for `cairn status`
    /// and the unmount's error.
    pub(crate) lost_why: parking_lot::Mutex<Option<String>>,
    /// The next version must be a base (this directory crashed while
    /// mounted, so its changes since the last version are unknown).
    pub need_base: std::sync::atomic::AtomicBool,
    /// The metadata shipper's thread (started by `crate::open`).
    pub(crate) shipper: std::sync::OnceLock<Background>,
    /// Where the bucket's requests are counted (the bill; None: a backend
    /// that does not count, e.g. one injected by a test).
    pub meter: Option<Arc<cairn_backend::Meter>>,
    /// When the bill was last saved into the metadata (held while saving).
    pub(crate) bill_saved: parking_lot::Mutex<std::time::Instant>,
    /// This mount's bill object in the bucket (crate::cost).
    pub(crate) bill: parking_lot::Mutex<crate::cost::MountBill>,
    /// A read-only mount's thread that rewrites its bill object.
    pub(crate) biller: std::sync::OnceLock<Background>,
    /// When trashed packs were last looked at for deletion (a volume
    /// without metadata versions, see `Volume::prune_trash_older_than`).
    pub(crate) trash_pruned: parking_lot::Mutex<std::time::Instant>,
    /// Closed or abandoned: nothing left to do when dropped.
    done: std::sync::atomic::AtomicBool,
}

impl Cloud {
    /// The bucket, its requests paid for by `who` (the bill by
    /// subsystem; most of the cloud's own requests are `Metadata`'s).
    pub(crate) fn paid(&self, who: cairn_backend::Subsystem) -> &Arc<dyn Backend> {
        self.paid.get(who)
    }

    /// Opens the cache in front of the bucket, with the policy `opts`
    /// choose (a KD one reads the volume's request counts from `io`).
    pub fn open_cache(layout: &Layout, remote: Arc<dyn Backend>, opts: &CloudOptions, io: Option<IoWindows>) -> Result<Arc<CachedBackend>> {
        // Two gaps of a read closer than a GET's price in transfer go in
        // one GET, at the prices the cleaner weighs too.
        let p = &opts.prices_for(true);
        let (mut block, mut merge_below, mut ahead, mut keep_piece) = (opts.cache_block, crate::cache::extent::merge_below(p.per_1000_requests.get, p.transfer_down_per_gb), opts.cache_ahead, crate::cache::disk::KEEP_PIECE);
        if !remote.capabilities().cheap_ranged_reads {
            // A tape is not billed per request: its reads go through the
            // store's own batching and keeping of what a pass reads over
            // (docs/tape.md §8), tuned with 64 KiB blocks.
            block = if block == 0 { TAPE_CACHE_BLOCK } else { block };
            merge_below = 0;
            ahead = 0;
            keep_piece = TAPE_KEEP_PIECE;
        }
        let d = DiskCacheOptions { dir: layout.dir.join("cache"), capacity: opts.cache_bytes, block, merge_below, ahead, durability: opts.durability, uploaders: 2, keep_piece };
        Ok(CachedBackend::with_policy(remote, d, opts.cache_policy.build(io))?)
    }
}

impl Cloud {
    /// Takes the lease (read-write opens), brings the local database up to
    /// the bucket's latest version, and opens the cache. With
    /// `ships_metadata` false (the metadata's home is PostgreSQL) there is
    /// no local database to bring up to date: no version is read.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn open(layout: &Layout, url: &str, remote: Arc<dyn Backend>, keys: &Keys, opts: &CloudOptions, read_only: bool, io: Option<IoWindows>, ships_metadata: bool) -> Result<Cloud> {
        // The bill: taking the lease and reading versions is metadata's.
        let paid = cairn_backend::Payers::new(remote.clone());
        let md = paid.get(cairn_backend::Subsystem::Metadata);
        let dir = layout.dir.display().to_string();
        // A store only one process can open (a tape in its drive) is its
        // own lease: the open excluded every other mount already.
        let caps = remote.capabilities();
        // Nor does a volume whose metadata is in PostgreSQL take it: many
        // machines mount that one read-write at once, each with a session
        // in the database instead (opened by `crate::open`).
        let lease = if read_only || caps.exclusive || !ships_metadata { None } else { Some(lease::Lease::acquire(md.as_ref(), &dir, opts.force, url)?) };
        let release = |e: Error| {
            if let Some(l) = &lease {
                let _ = l.release(md.as_ref());
            }
            e
        };
        let state = if ships_metadata { sync_down(layout, md.as_ref(), keys, url, read_only).map_err(release)? } else { LocalState::fresh() };
        let mut cloud_opts = opts.clone();
        if !ships_metadata {
            // PostgreSQL is the metadata's home, which every machine reads
            // at once: a commit naming a pack that is only in this
            // machine's outbox would name a pack missing for everyone else
            // (and for good if this machine is lost). A pack is in the
            // bucket before the commit naming it (docs/shared-volume.md §5).
            cloud_opts.durability = Durability::Remote;
        }
        if caps.deferred_durability {
            // Where a put lasts only after a sync, every fsync must reach
            // the store (docs/tape.md §1): there is no local durability to
            // fall back on once the journal is retired.
            cloud_opts.durability = Durability::Remote;
        }
        if !caps.frees_on_delete {
            // Cleaning copies live data to free space a delete would not
            // free (a tape reclaims by copying to another tape).
            cloud_opts.gc_interval = None;
        }
        let cache = Self::open_cache(layout, remote.clone(), &cloud_opts, io).map_err(release)?;
        let meter = remote.meter();
        Ok(Cloud {
            need_base: std::sync::atomic::AtomicBool::new(state.dirty),
            state: parking_lot::Mutex::new(state),
            remote,
            paid,
            cache,
            opts: cloud_opts,
            lease,
            session: std::sync::OnceLock::new(),
            ships_metadata,
            ship_lock: Arc::new(parking_lot::Mutex::new(())),
            lost: std::sync::atomic::AtomicBool::new(false),
            lost_why: parking_lot::Mutex::new(None),
            shipper: std::sync::OnceLock::new(),
            meter,
            bill_saved: parking_lot::Mutex::new(std::time::Instant::now()),
            bill: parking_lot::Mutex::new(crate::cost::MountBill::new()),
            biller: std::sync::OnceLock::new(),
            // The first look comes a grace period after the mount.
            trash_pruned: parking_lot::Mutex::new(std::time::Instant::now()),
            done: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Marks the directory as holding unshipped changes (before the
    /// shipper starts: a crash from now on means a base comes next).
    pub(crate) fn mark_dirty(&self, dir: &Path) -> Result<()> {
        if !self.ships_metadata {
            return Ok(());
        }
        let mut s = self.state.lock();
        s.dirty = true;
        s.save(dir)
    }

    /// Stops the background threads (after their rounds under way).
    pub(crate) fn stop_threads(&self) {
        if let Some(b) = self.biller.get() {
            b.stop();
        }
        if let Some(s) = self.shipper.get() {
            s.stop();
        }
    }

    /// At unmount, after the threads stopped: waits for every upload.
    pub(crate) fn drain_uploads(&self) {
        let mut last = std::time::Instant::now();
        self.cache.drain(&mut |bytes, n| {
            if last.elapsed() >= Duration::from_secs(2) {
                last = std::time::Instant::now();
                tracing::info!("waiting for {n} uploads ({bytes} bytes) before unmounting");
            }
        });
    }

    /// What guards this mount's writes, for messages and `cairn status`:
    /// `session` (a session in PostgreSQL) or `lease` (the bucket's lease).
    pub(crate) fn guard(&self) -> &'static str {
        if self.session.get().is_some() {
            "session"
        } else {
            "lease"
        }
    }

    /// Whether the lease was lost.
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// At unmount, after the last version shipped: marks the directory
    /// clean and gives the lease back.
    pub(crate) fn finish(&self, dir: &Path) -> Result<()> {
        if self.ships_metadata {
            let mut s = self.state.lock();
            s.dirty = false;
            s.save(dir)?;
        }
        self.done.store(true, std::sync::atomic::Ordering::SeqCst);
        self.cache.shutdown();
        if let Some(l) = &self.lease {
            l.release(self.remote.as_ref())?;
        }
        Ok(())
    }

    /// Records that the lease was lost (`e` found it): the mount refuses
    /// writes and publishes nothing more from now on.
    pub(crate) fn mark_lost(&self, e: &Error) {
        self.lost_why.lock().get_or_insert_with(|| e.message().to_string());
        self.lost.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// The error of a mount that lost its lease, saying why.
    pub(crate) fn lost_error(&self) -> Error {
        match self.lost_why.lock().as_ref() {
            Some(why) => Error::new(ErrorKind::Busy, why.clone()),
            None => lease::lost("it was deleted or taken by another mount while this one was mounted"),
        }
    }

    /// Stops background work without shipping or releasing anything (a
    /// simulated crash, or a failed close).
    pub(crate) fn abandon(&self) {
        self.done.store(true, std::sync::atomic::Ordering::SeqCst);
        self.stop_threads();
        self.cache.shutdown();
    }
}

impl Drop for Cloud {
    /// A volume that failed to open gives its lease back.
    fn drop(&mut self) {
        if !self.done.load(std::sync::atomic::Ordering::SeqCst) {
            self.stop_threads();
            self.cache.shutdown();
            if let Some(l) = &self.lease {
                let _ = l.release(self.remote.as_ref());
            }
        }
    }
}

/// Makes `dir` the local directory of the cloud volume at `url`: a new
/// directory is set up only after the bucket answered with a volume config
/// (so a typo leaves nothing behind); an existing one must belong to the
/// same URL, and takes a new endpoint or region if given (a test server's
/// port changes).
pub fn attach(dir: &Path, url: &str, endpoint: Option<&str>, region: Option<&str>, injected: Option<&crate::config::InjectedBackend>) -> Result<()> {
    let layout = Layout::new(dir);
    if let Ok(raw) = std::fs::read(layout.settings()) {
        let mut s: LocalSettings = serde_json::from_slice(&raw).map_err(|e| Error::config(format!("{} is damaged: {e}", layout.settings().display())))?;
        if s.backend != url {
            return Err(Error::config(format!("{} is the local directory of {}, not of {url}; choose another --cache-dir", dir.display(), s.backend)));
        }
        let changed = (endpoint.is_some() && s.endpoint.as_deref() != endpoint) || (region.is_some() && s.region.as_deref() != region);
        if changed {
            s.endpoint = endpoint.map(str::to_string).or(s.endpoint);
            s.region = region.map(str::to_string).or(s.region);
            write_settings(&layout, &s)?;
        }
        return Ok(());
    }
    if dir.exists() && std::fs::read_dir(dir).map(|mut d| d.next().is_some()).unwrap_or(true) {
        return Err(Error::new(ErrorKind::Exists, format!("{} is not empty and holds no volume; give a new or empty --cache-dir for {url}", dir.display())));
    }
    let settings = LocalSettings {
        format: "cairn-local".into(),
        version: crate::config::FORMAT_VERSION,
        backend: url.to_string(),
        endpoint: endpoint.map(str::to_string),
        region: region.map(str::to_string),
        mirror: None,
        volume_id: None,
    };
    let probe = match injected {
        Some(b) => b.0.clone(),
        None => open_remote_with(&settings, cairn_backend::RetryPolicy::quick())?,
    };
    let cfg = crate::config::VolumeConfig::parse(&probe.get(crate::config::CONFIG_OBJECT).map_err(|e| explain(e, url, endpoint))?)?;
    let settings = LocalSettings { volume_id: Some(cfg.volume_id), ..settings };
    crate::fsutil::create_private_dir_all(dir).map_err(|e| Error::os(format_args!("creating {}", dir.display()), &e))?;
    crate::fsutil::create_private_dir_all(&layout.journal())?;
    write_settings(&layout, &settings)
}

/// `cairn meta restore`: publishes the state of version `version` as a new
/// base on top of the latest (history is never rewritten, so a restore can
/// be undone the same way). The volume must not be mounted read-write
/// anywhere (the lease is taken for the time of the restore), and every
/// pack the old version names must still be in the bucket.
pub fn restore(remote: &dyn Backend, keys: &Keys, url: &str, version: u64) -> Result<u64> {
    let cfg = crate::config::VolumeConfig::parse(&remote.get(crate::config::CONFIG_OBJECT).map_err(|e| explain(e, url, None))?)?;
    if cfg.meta == crate::config::MetaKind::Postgres {
        return Err(Error::invalid(format!(
            "{url} keeps its metadata in PostgreSQL (schema cairn_{}), not as versions in the bucket: there is no version to restore; restore the schema from a PostgreSQL backup instead",
            cfg.volume_id
        )));
    }
    let tmpdir = std::env::temp_dir().join(format!("cairn-restore-{}", hex::encode(rand::random::<[u8; 6]>())));
    crate::fsutil::create_private_dir_all(&tmpdir)?;
    let r = (|| {
        let lease = lease::Lease::acquire(remote, &tmpdir.display().to_string(), false, url)?;
        let r = (|| {
            let all = versions::list(remote)?;
            let chain = versions::chain(&all, Some(version))?;
            let db = tmpdir.join("meta.sqlite");
            versions::rebuild(remote, keys, &chain, &db, &|_, _| {})?;
            let names: Vec<String> = cairn_meta::shipped::pack_names_in(&db)?;
            let present: std::collections::HashSet<String> = remote.list("packs/")?.into_iter().map(|o| o.name).collect();
            let missing: Vec<&String> = names.iter().filter(|n| !present.contains(*n)).collect();
            if !missing.is_empty() {
                return Err(Error::new(
                    ErrorKind::NotFound,
                    format!("version {version} names {} packs that are no longer in the bucket (collected by gc), e.g. {}; it cannot be restored", missing.len(), missing[0]),
                ));
            }
            // Packs trashed since that version are live again: take them off.
            let wanted: std::collections::HashSet<&String> = names.iter().collect();
            for t in remote.list(TRASH_PREFIX)? {
                let listed = read_trash(remote, &t)?;
                let keep: Vec<&String> = listed.iter().filter(|n| !wanted.contains(n)).collect();
                if keep.len() == listed.len() {
                    continue;
                }
                if keep.is_empty() {
                    remote.delete(&t.name)?;
                } else {
                    remote.put(&t.name, &serde_json::to_vec(&keep).expect("names serialise"))?;
                }
            }
            let bytes = std::fs::read(&db)?;
            let top = all.last().map(|v| v.version).unwrap_or(0);
            // The new base follows the newest version in the bucket, whole
            // or not (a restore is how a chain with a hole is mended).
            let prev = match top {
                0 => None,
                t => Some(versions::Prev { version: t, digest: versions::digest_of(remote, t)? }),
            };
            let h = versions::Header { kind: versions::Kind::Base, version: top + 1, time: lease::now(), writer: [0u8; 8], prev };
            versions::publish(remote, keys, &h, &bytes)?;
            Ok(top + 1)
        })();
        let _ = lease.release(remote);
        r
    })();
    let _ = std::fs::remove_dir_all(&tmpdir);
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_backend::ObjectInfo;
    use cairn_testing::MemoryBackend;

    #[test]
    fn a_trash_objects_version_is_read_from_its_name() {
        assert_eq!(trash_version(&format!("{TRASH_PREFIX}{:016}-0a1b2c3d", 42)), Some(42));
        assert_eq!(trash_version(&format!("{TRASH_PREFIX}0000000000000007")), Some(7));
        assert_eq!(trash_version("packs/0000000000000042-00"), None, "not in the trash");
        assert_eq!(trash_version(&format!("{TRASH_PREFIX}x12-00")), None);
    }

    /// A trash object is read within its listed size and refused, naming
    /// it, when empty, oversized or not a list of names.
    #[test]
    fn trash_objects_are_bounded_and_checked() {
        let mem = MemoryBackend::new();
        let names = vec!["packs/a".to_string(), "packs/b".to_string()];
        let body = serde_json::to_vec(&names).unwrap();
        let name = format!("{TRASH_PREFIX}{:016}-00", 3);
        mem.put(&name, &body).unwrap();
        assert_eq!(read_trash(&mem, &ObjectInfo { name: name.clone(), size: body.len() as u64 }).unwrap(), names);
        for size in [0, MAX_TRASH_OBJECT + 1] {
            let e = read_trash(&mem, &ObjectInfo { name: name.clone(), size }).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
            assert!(e.to_string().contains(&name) && e.to_string().contains("not read"), "{e}");
        }
        mem.put(&name, b"[\"packs/a\", 7]").unwrap();
        let e = read_trash(&mem, &ObjectInfo { name: name.clone(), size: 14 }).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
        assert!(e.to_string().contains(&name), "{e}");
    }

    /// The shipping state survives a save and load as it was; a damaged
    /// file is named; none is None.
    #[test]
    fn local_state_saves_and_loads() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(LocalState::load(d.path()).unwrap(), None);
        let mut s = LocalState::fresh();
        s.shipped = 9;
        s.dirty = true;
        s.shipped_digest = Some(hex::encode([5u8; 32]));
        s.save(d.path()).unwrap();
        assert_eq!(LocalState::load(d.path()).unwrap(), Some(s.clone()));
        assert_eq!(hex::encode(s.writer_bytes()), s.writer);
        std::fs::write(d.path().join("cloud.json"), b"{\"writer\": 3").unwrap();
        let e = LocalState::load(d.path()).unwrap_err();
        assert!(e.to_string().contains("cloud.json") && e.to_string().contains("damaged"), "{e}");
    }

    /// The predecessor the next version names: none before the first, the
    /// digest known here, else the digest of the version in the bucket,
    /// and an error naming a version missing from it.
    #[test]
    fn the_predecessor_comes_from_the_state_or_the_bucket() {
        let mem = MemoryBackend::new();
        let mut s = LocalState::fresh();
        assert_eq!(s.predecessor(&mem).unwrap(), None);
        s.shipped = 4;
        s.shipped_digest = Some(hex::encode([6u8; 32]));
        assert_eq!(s.predecessor(&mem).unwrap(), Some(versions::Prev { version: 4, digest: [6; 32] }));
        s.shipped_digest = None;
        let e = s.predecessor(&mem).unwrap_err();
        assert!(e.to_string().contains("metadata version 4"), "{e}");
        mem.put(&versions::object_name(4, versions::Kind::Delta), b"the stored version").unwrap();
        assert_eq!(s.predecessor(&mem).unwrap(), Some(versions::Prev { version: 4, digest: versions::digest(b"the stored version") }));
        // A digest that is not hex is not trusted: the bucket's is used.
        s.shipped_digest = Some("zz".into());
        assert_eq!(s.predecessor(&mem).unwrap().unwrap().digest, versions::digest(b"the stored version"));
    }
}
