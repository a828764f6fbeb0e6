//! Shipping a cloud volume's metadata: each version (a delta, or a base
//! when deltas have grown) goes to the bucket after every pack it names,
//! old versions are pruned, and objects to delete wait in the trash until
//! no kept version names them. The thread that calls this every interval
//! is started by `crate::open`.

use super::Volume;
use crate::cloud::{read_trash, trash_version, TRASH_NAMES_PER_OBJECT, TRASH_PREFIX};
use crate::error::{Error, ErrorKind, Result};
use crate::lease;
use crate::versions::{self, Header, Kind};
use cairn_backend::Subsystem;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// A base replaces the deltas once this many follow the last one...
const MAX_DELTAS: u64 = 64;
/// ...or once they add up to this share of the base (and 256 KiB).
const DELTA_SHARE: u64 = 4;
/// Bases kept in the bucket, with everything after the oldest of them.
pub(crate) const KEEP_BASES: usize = 3;
/// How long packs trashed on a volume whose metadata is in PostgreSQL
/// stay before they are deleted (no version names them, but a read that
/// found a chunk's old location before the cleaner moved it may still be
/// on its way to the old pack).
pub const TRASH_GRACE: Duration = Duration::from_secs(3600);

impl Volume {
    /// Publishes the metadata changes committed so far as the next version
    /// (a delta, or a base when `base` or when deltas have grown), after
    /// every pack they may name is in the bucket. Returns the version, or
    /// None when nothing changed. A failed upload is retried here until it
    /// succeeds: the changes were taken out of the session and exist
    /// nowhere else.
    pub(crate) fn ship_metadata(&self, base: bool) -> Result<Option<u64>> {
        let Some(cloud) = self.cloud.as_ref() else { return Ok(None) };
        let _g = cloud.ship_lock.lock();
        if cloud.lost.load(Ordering::SeqCst) {
            return Err(Error::new(ErrorKind::ReadOnly, cloud.lost_error().message().to_string()));
        }
        // The bill ships with the metadata: counted requests and stored
        // bytes go into the table before the changes are taken (only when
        // there are other changes, or the bill is old: see crate::cost).
        if let Err(e) = self.record_bill() {
            tracing::warn!("saving the bill: {e}");
        }
        // What ships must be durable here first (a crash must not leave the
        // bucket ahead of this machine's own database).
        self.meta.sync()?;
        if !cloud.ships_metadata {
            // PostgreSQL is the metadata's home: there is nothing to
            // publish (the bill went into its table above). Trashed packs
            // wait out their grace period instead of versions.
            drop(_g);
            if cloud.trash_pruned.lock().elapsed() >= TRASH_GRACE {
                self.prune_trash_older_than(TRASH_GRACE);
            }
            return Ok(None);
        }
        let st = cloud.state.lock().clone();
        // The version this one follows (before any change is taken out of
        // the session: a failure here loses nothing).
        let prev = st.predecessor(cloud.paid(Subsystem::Metadata).as_ref())?;
        let base = base || cloud.need_base.load(Ordering::SeqCst);
        let (kind, payload) = if base {
            (Kind::Base, self.meta.snapshot()?)
        } else {
            let Some(changes) = self.meta.take_changes()? else { return Ok(None) };
            let grown = st.deltas_since_base >= MAX_DELTAS
                || (st.delta_bytes_since_base + changes.len() as u64 > st.base_bytes / DELTA_SHARE && st.delta_bytes_since_base > 256 << 10);
            if grown {
                (Kind::Base, self.meta.snapshot()?)
            } else {
                (Kind::Delta, changes)
            }
        };
        // Rule 1 of the bucket's order of writes: packs before the version
        // naming them. Every pack the changes name was handed to the cache
        // before they committed, so it is uploaded or pending now.
        let pending = cloud.cache.pending();
        cloud.cache.wait_uploaded(&pending);
        let v = st.shipped + 1;
        let h = Header { kind, version: v, time: lease::now(), writer: st.writer_bytes(), prev };
        let mut delay = Duration::from_millis(500);
        let (stored, digest) = loop {
            // The lease first: a holder whose lease object was deleted or
            // replaced (another machine may hold the volume now) publishes
            // nothing more (docs/cloud.md §4).
            let checked = match &cloud.lease {
                Some(l) => l.check(cloud.paid(Subsystem::Metadata).as_ref()),
                None => Ok(()),
            };
            match checked.and_then(|()| versions::publish(cloud.paid(Subsystem::Metadata).as_ref(), &self.chunks.keys, &h, &payload)) {
                Ok(n) => break n,
                Err(e) if e.kind() == ErrorKind::Busy => {
                    cloud.mark_lost(&e);
                    tracing::error!("{e}");
                    return Err(e);
                }
                Err(e) => {
                    tracing::warn!("uploading metadata version {v} failed (retrying in {delay:?}): {e}");
                    self.problems.metadata.fail("metadata", &e);
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_secs(15));
                }
            }
        };
        let mut s = cloud.state.lock();
        s.shipped = v;
        s.shipped_digest = Some(hex::encode(digest));
        match kind {
            Kind::Base => {
                s.base_version = v;
                s.base_bytes = stored;
                s.deltas_since_base = 0;
                s.delta_bytes_since_base = 0;
            }
            Kind::Delta => {
                s.deltas_since_base += 1;
                s.delta_bytes_since_base += stored;
            }
        }
        s.save(&self.layout.dir)?;
        drop(s);
        cloud.need_base.store(false, Ordering::SeqCst);
        tracing::debug!(version = v, ?kind, bytes = stored, "metadata version shipped");
        if kind == Kind::Base {
            self.prune_versions();
        }
        Ok(Some(v))
    }

    /// Deletes versions older than the oldest kept base, then the packs
    /// trashed at or before the oldest kept version (errors are logged: an
    /// object left behind costs storage, not correctness, and the next
    /// prune tries again).
    pub(crate) fn prune_versions(&self) {
        let Some(cloud) = self.cloud.as_ref() else { return };
        let all = match versions::list(cloud.paid(Subsystem::Metadata).as_ref()) {
            Ok(a) => a,
            Err(e) => return tracing::warn!("listing metadata versions to prune: {e}"),
        };
        let old = versions::prunable(&all, KEEP_BASES);
        for v in &old {
            if let Err(e) = cloud.paid(Subsystem::Metadata).delete(&v.object()) {
                tracing::warn!("removing old metadata version {}: {e}", v.version);
                return;
            }
        }
        let Some(oldest_kept) = all.iter().map(|v| v.version).find(|v| !old.iter().any(|o| o.version == *v)) else { return };
        // Trash is deleted only while the kept versions form one chain:
        // with a hole (a version lost from the bucket) the versions after
        // it may name trashed packs, and nothing is deleted until a restore
        // mends the chain.
        let kept: Vec<versions::VersionInfo> = all.iter().filter(|v| v.version >= oldest_kept).cloned().collect();
        if let Err(e) = versions::chain(&kept, None) {
            return tracing::error!("keeping every trashed pack: {e}");
        }
        self.delete_trash(|at| at <= oldest_kept);
    }

    /// On a volume whose metadata is in PostgreSQL (no versions): deletes
    /// the packs trashed at least `age` ago. Errors are logged.
    #[doc(hidden)]
    pub fn prune_trash_older_than(&self, age: Duration) {
        let Some(cloud) = self.cloud.as_ref().filter(|c| !c.ships_metadata) else { return };
        *cloud.trash_pruned.lock() = std::time::Instant::now();
        // The database's clock: the trash object may come from a machine
        // whose clock is ahead or behind this one's.
        let now = match self.meta.store().clock_secs() {
            Ok(t) => t,
            Err(e) => return tracing::warn!("pruning the trash: reading the metadata store's clock: {e}"),
        };
        let before = now.saturating_sub(age.as_secs() as i64);
        self.delete_trash(|at| at as i64 <= before);
    }

    /// The packs the trash objects list (waiting for their grace period);
    /// a trash object that cannot be read or parsed is a warning. Empty
    /// outside a bucket.
    pub(crate) fn trashed_packs(&self, warnings: &mut Vec<String>) -> std::collections::HashSet<String> {
        let mut out = std::collections::HashSet::new();
        let Some(cloud) = self.cloud.as_ref() else { return out };
        let trash = match cloud.remote.list(TRASH_PREFIX) {
            Ok(t) => t,
            Err(e) => {
                warnings.push(format!("listing the trash: {e}"));
                return out;
            }
        };
        for t in trash {
            match read_trash(cloud.remote.as_ref(), &t) {
                Ok(names) => out.extend(names.into_iter().filter(|n| n.starts_with("packs/"))),
                Err(e) => warnings.push(e.to_string()),
            }
        }
        out
    }

    /// Deletes the packs of every trash object whose number (a version, or
    /// on a volume without versions the time it was written) `due` accepts,
    /// never one the metadata names now, then the trash object.
    fn delete_trash(&self, due: impl Fn(u64) -> bool) {
        let Some(cloud) = self.cloud.as_ref() else { return };
        let trash = match cloud.paid(Subsystem::Metadata).list(TRASH_PREFIX) {
            Ok(t) => t,
            Err(e) => return tracing::warn!("listing trashed packs: {e}"),
        };
        for t in trash {
            let Some(at) = trash_version(&t.name) else { continue };
            if !due(at) {
                continue;
            }
            let r = (|| -> Result<usize> {
                let names = read_trash(cloud.paid(Subsystem::Metadata).as_ref(), &t)?;
                if let Some(bad) = names.iter().find(|n| !n.starts_with("packs/")) {
                    return Err(Error::corrupt(format!("{} lists {bad:?}, which is not a pack; deleting nothing", t.name)));
                }
                // A second guard: never delete what the metadata names now.
                let named = self.meta.read(|c| names.iter().map(|n| Ok(c.pack_exists(n)?)).collect::<Result<Vec<bool>>>())?;
                for (n, named) in names.iter().zip(named) {
                    if named {
                        tracing::error!("{} lists pack {n}, which the metadata names: keeping it", t.name);
                        continue;
                    }
                    self.chunks.paid(Subsystem::Metadata).delete(n)?;
                }
                cloud.paid(Subsystem::Metadata).delete(&t.name)?;
                Ok(names.len())
            })();
            match r {
                Ok(n) => tracing::info!(packs = n, trashed_at = at, "deleted trashed packs no metadata names"),
                Err(e) => tracing::warn!("deleting the packs of {}: {e}", t.name),
            }
        }
    }

    /// What `fsync`, `sync` and unmount call under `--durability remote`:
    /// ships what changed, then, on a store whose puts last only after a
    /// sync (a tape), makes everything put so far durable. The sync runs
    /// even when nothing new shipped: the background shipper may have
    /// published the version naming the fsync'd data without one.
    pub(crate) fn ship_durably(&self) -> Result<()> {
        self.ship_metadata(false)?;
        if let Some(cloud) = self.cloud.as_ref() {
            if cloud.remote.capabilities().deferred_durability {
                cloud.paid(Subsystem::Metadata).sync()?;
            }
        }
        Ok(())
    }

    /// Ships a base now and prunes what it allows (tests of retention).
    #[doc(hidden)]
    pub fn ship_base_now(&self) -> Result<Option<u64>> {
        self.ship_metadata(true)
    }

    /// Rule 3 in a bucket: objects the latest metadata no longer names are
    /// listed in `trash/<version>-<random>` and deleted only once every
    /// version that may name them is pruned. Returns how many were listed.
    pub(crate) fn trash_objects(&self, names: &[String]) -> Result<u64> {
        let Some(cloud) = self.cloud.as_ref() else { return Ok(0) };
        if names.is_empty() {
            return Ok(0);
        }
        // The newest version must be one without them.
        self.ship_metadata(false)?;
        // Bounded objects: a reader refuses one above MAX_TRASH_OBJECT.
        for part in names.chunks(TRASH_NAMES_PER_OBJECT) {
            let name = if cloud.ships_metadata {
                let at = cloud.state.lock().shipped;
                format!("{}{at:016}-{}", TRASH_PREFIX, hex::encode(rand::random::<[u8; 4]>()))
            } else {
                // No versions: the time on the metadata store's clock, for
                // the grace period (format.md "Trash"). Random enough that
                // two machines never collide.
                let at = self.meta.store().clock_secs()?.max(0) as u64;
                format!("{}{at:016}-{}", TRASH_PREFIX, hex::encode(rand::random::<[u8; 8]>()))
            };
            cloud.paid(Subsystem::Metadata).put(&name, &serde_json::to_vec(part).expect("names serialise"))?;
        }
        Ok(names.len() as u64)
    }
}
