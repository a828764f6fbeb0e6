//! Opening and creating volumes: the one module that knows every layer.
//! It reads a volume directory's settings, opens the store they name and,
//! for a volume in a bucket or on a tape, its cloud parts (lease, metadata
//! chain, cache); hands them to [`Volume::assemble`]; and then starts the
//! background threads that call back into the volume (metadata shipper,
//! cleaner, biller). The layers below read one way: `cloud` knows no
//! `Volume`, `volume` knows the cloud's parts, and only this module and
//! the tools above it (cleaner, maintenance, control) hold a volume.

use crate::background::Background;
use crate::cloud::Cloud;
use crate::config::{is_remote_url, is_tape_url, take_lock, with_retries, write_settings, InitOptions, Layout, LocalSettings, MetaKind, VolumeConfig, CONFIG_OBJECT, FORMAT_VERSION};
use crate::crypto::Keys;
use crate::error::{Error, ErrorKind, Result};
use crate::lease;
use crate::location::{explain, open_backend, open_remote, open_remote_with};
use crate::meta::{Caller0, Location, Meta, SESSION_TTL};
use crate::mirror;
use crate::volume::{OpenOptions, Parts, Volume, CLOSE_ERROR};
use cairn_backend::{Backend, LocalBackend};
use std::fs;
use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

impl Volume {
    /// Opens the volume in `dir`, replays the journal, and starts its
    /// background work: the flusher, the cleaner (every kind but a tape)
    /// and, for a volume in a bucket or on a tape, the metadata shipper (a
    /// read-only open: the biller).
    pub fn load(dir: &Path, mut opts: OpenOptions) -> Result<Arc<Volume>> {
        mirror::choose(dir, &opts.mirror)?;
        let (layout, settings, backend, mut cfg) = read_config_with(dir, opts.backend.as_ref())?;
        crate::volume::check_meta_url(&layout, &cfg, opts.meta_url.as_deref())?;
        if cfg.meta == MetaKind::Postgres && is_tape_url(&settings.backend) {
            return Err(Error::config(format!(
                "the config of {} says its metadata is in PostgreSQL, which a volume on a tape cannot have (its metadata travels with the tape)",
                settings.backend
            )));
        }
        let lock = take_lock(&layout, !opts.read_only)?;
        if !opts.read_only {
            // The last close's failure was for the unmount that followed it.
            let _ = std::fs::remove_file(layout.dir.join(CLOSE_ERROR));
        }
        let keys = cfg.keys(opts.passphrase.as_ref().map(|p| &p[..]))?;
        let mut vid = [0u8; 16];
        hex::decode_to_slice(&cfg.volume_id, &mut vid).map_err(|_| Error::config("volume config: bad volume id"))?;
        let io = (is_remote_url(&settings.backend) && opts.cloud.cache_policy == crate::cache::PolicyChoice::Kd).then(crate::cache::IoWindows::new);
        let trace = match &opts.trace {
            Some(p) => Some(crate::trace::TraceWriter::create(p).map_err(|e| Error::os(format_args!("creating the trace {}", p.display()), &e))?),
            None => None,
        };
        let (backend, cloud) = if is_remote_url(&settings.backend) {
            // Metadata in PostgreSQL is not shipped: no versions to read.
            let ships = cfg.meta == MetaKind::Sqlite;
            let c = Cloud::open(&layout, &settings.backend, backend, &keys, &opts.cloud, opts.read_only, io.clone(), ships)?;
            if let Some(t) = &trace {
                c.cache.set_trace(t.clone());
            }
            // The journal is local dirty data too: within the cache's bound,
            // so an outage blocks writers once the cache is full; but with
            // room for two packs (one filling while the last uploads), or a
            // small cache would cut every pack short at a quarter of itself
            // (each a PUT; docs/frugal.md §7).
            opts.journal_limit = if c.cache.capabilities().cheap_ranged_reads {
                opts.journal_limit.min((opts.cloud.cache_bytes / 4).max(2 * cfg.pack_target))
            } else {
                // A tape store asks for packs that fit its memory: they are
                // built and queued whole (docs/tape.md §10). The target is
                // a write policy; a smaller pack is as valid as a short one.
                cfg.pack_target = cfg.pack_target.min(c.cache.capabilities().preferred_pack_size).max(1 << 20);
                // On a tape the journal is where each stream's run gathers
                // (docs/tape.md §2): the larger, the longer the runs.
                (opts.cloud.cache_bytes / 2).min(8 << 30)
            }
            .max(4 << 20);
            (c.cache.clone() as Arc<dyn Backend>, Some(c))
        } else {
            (backend, None)
        };
        // The medium, chosen once: a tape, a bucket or a local directory.
        let medium = crate::volume::choose_medium(cloud.as_ref(), backend.as_ref());
        let vol = Volume::assemble(Parts { layout, cfg, keys, vid, backend, cloud, medium, trace, io, lock }, opts)?;
        start_background(&vol)?;
        Ok(vol)
    }
}

/// Starts what runs beside an open volume: the cleaner of a read-write
/// one (every kind but a tape: docs/frugal.md §8), and for a cloud volume
/// the rest of [`start_cloud`].
fn start_background(vol: &Arc<Volume>) -> Result<()> {
    start_cloud(vol)?;
    if vol.is_read_only() {
        return Ok(());
    }
    // A tape's cloud options have no interval: cleaning would copy live
    // data onto the tape and free nothing there (docs/tape.md §5).
    let opts = vol.cloud().map_or(&vol.opts.cloud, |c| &c.opts);
    if let Some(every) = opts.gc_interval {
        let _ = vol.cleaner.set(crate::cleaner::background(vol, every, opts.prices_for(vol.cloud().is_some()), opts.gc_bound.clone()));
    }
    Ok(())
}

/// Starts what runs beside an open cloud volume: a read-write one folds
/// the bill left by earlier mounts, marks its directory dirty and starts
/// the shipper; a read-only one rewrites its bill object.
fn start_cloud(vol: &Arc<Volume>) -> Result<()> {
    let Some(c) = vol.cloud() else { return Ok(()) };
    if vol.is_read_only() {
        let weak = Arc::downgrade(vol);
        let _ = c.biller.set(Background::start("cairn-bill", crate::cost::BILL_OBJECT_EVERY, move || {
            let Some(vol) = weak.upgrade() else { return false };
            if let Err(e) = vol.publish_mount_bill() {
                tracing::warn!("{e} (will retry)");
            }
            true
        }));
        return Ok(());
    }
    if let Err(e) = vol.fold_pending_bill() {
        // The bill is no reason to refuse a mount; the file stays and is
        // tried again at the next.
        tracing::warn!("adding the pending requests to the bill: {e}");
    }
    // Ended mounts' bill objects, one per mount, would pile up.
    let own = c.bill.lock().id.clone();
    if let Err(e) = crate::cost::fold_bills(c.remote.as_ref(), Some(&own)) {
        tracing::warn!("folding the bill objects of ended mounts: {e}");
    }
    c.mark_dirty(&vol.layout.dir)?;
    if !c.ships_metadata {
        // Metadata in PostgreSQL: a session instead of the lease, so other
        // machines mount it read-write too and clean up after this one if
        // its heartbeats stop (docs/shared-volume.md §7).
        let who = cairn_meta::SessionInfo {
            host: lease::hostname(),
            pid: std::process::id(),
            mount: vol.layout.dir.display().to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
        };
        let id = vol.meta.need_shared()?.open_session(&who, c.opts.session_ttl)?;
        tracing::info!(session = id, "opened a session in the metadata store");
        let _ = c.session.set(id);
    }
    let _ = c.shipper.set(start_shipper(vol));
    Ok(())
}

/// Starts shipping every `vol`'s metadata interval and renewing its lease
/// (or its session in PostgreSQL).
fn start_shipper(vol: &Arc<Volume>) -> Background {
    let weak: Weak<Volume> = Arc::downgrade(vol);
    let interval = vol.cloud.as_ref().map(|c| c.opts.meta_interval).unwrap_or(Duration::from_secs(5));
    let renew = vol.cloud.as_ref().map_or(lease::RENEW, |c| c.opts.lease_renew.min(lease::MAX_RENEW));
    let mut next_renew = Instant::now() + renew;
    // Five heartbeats in a session's lifetime (or the lease's rate, if a
    // test set that shorter), whatever the shipping interval.
    let ttl = vol.cloud.as_ref().map_or(SESSION_TTL, |c| c.opts.session_ttl);
    let beat = renew.min(ttl / 5);
    let mut next_heartbeat = Instant::now() + beat;
    let interval = if vol.cloud.as_ref().is_some_and(|c| c.session.get().is_some()) { interval.min(beat / 2) } else { interval };
    Background::start("cairn-meta-ship", interval, move || {
        let Some(vol) = weak.upgrade() else { return false };
        let Some(cloud) = vol.cloud.as_ref() else { return false };
        // A pack held for the next round goes up at every tick, before
        // anything here can block (a lease renewal retrying through an
        // outage): the next version may name it (docs/frugal.md §7), and
        // data waits in the outbox at most one interval plus its upload.
        cloud.cache.release_held();
        if let Some(&id) = cloud.session.get() {
            if Instant::now() >= next_heartbeat && !cloud.is_lost() && !vol.stall.heartbeat_paused.load(std::sync::atomic::Ordering::SeqCst) {
                next_heartbeat = Instant::now() + beat;
                match vol.meta.need_shared().and_then(|s| s.renew_session(id, ttl)) {
                    Ok(()) => vol.problems.lease.ok(),
                    Err(e) if e.kind() == ErrorKind::SessionLost => {
                        // Another machine may have cleaned up after it
                        // (its open files, its locks): writing on would
                        // undo that. Never re-registered by itself.
                        tracing::error!("{e}; this mount refuses changes from now on");
                        cloud.mark_lost(&Error::new(ErrorKind::SessionLost, format!("{e}; this mount refuses changes: unmount and mount again")));
                    }
                    Err(e) => {
                        tracing::warn!("renewing the session in the metadata store failed (will retry): {e}");
                        vol.problems.lease.fail("session", &Error::from(e));
                    }
                }
            }
        }
        if Instant::now() >= next_renew {
            next_renew = Instant::now() + renew;
            if let Some(l) = &cloud.lease {
                match l.renew(cloud.remote.as_ref()) {
                    Ok(()) => vol.problems.lease.ok(),
                    Err(e) if e.kind() == ErrorKind::Busy => {
                        tracing::error!("{e}");
                        cloud.mark_lost(&e);
                    }
                    Err(e) => {
                        tracing::warn!("renewing the lease failed (will retry): {e}");
                        vol.problems.lease.fail("lease", &e);
                    }
                }
            }
        }
        match vol.ship_metadata(false) {
            Ok(_) => vol.problems.metadata.ok(),
            Err(e) => {
                tracing::warn!("shipping metadata failed (will retry): {e}");
                vol.problems.metadata.fail("metadata", &e);
            }
        }
        true
    })
}

/// Creates a new volume in `dir` (which must be missing or empty).
pub fn init(dir: &Path, opts: &InitOptions) -> Result<VolumeConfig> {
    if dir.exists() {
        let mut rd = fs::read_dir(dir).map_err(|e| Error::io(format!("{}: {e}", dir.display())))?;
        if rd.next().is_some() {
            return Err(Error::new(ErrorKind::Exists, format!("{} is not empty; a volume needs a new or empty directory", dir.display())));
        }
    }
    crate::fsutil::create_private_dir_all(dir).map_err(|e| Error::io(format!("creating {}: {e}", dir.display())))?;
    let layout = Layout::new(dir);
    let (cfg, _master) = VolumeConfig::create(opts)?;
    let (backend, location): (Arc<dyn Backend>, String) = match &opts.backend {
        Some(b) => (b.0.clone(), format!("{}{}", crate::config::INJECTED_BACKEND, b.0.describe())),
        None => (with_retries(LocalBackend::create(&layout.default_store())?), "local:store".into()),
    };
    backend.put(CONFIG_OBJECT, &cfg.to_bytes())?;
    let settings = LocalSettings { format: "cairn-local".into(), version: FORMAT_VERSION, backend: location, endpoint: None, region: None, mirror: None, volume_id: None };
    create_local_state(&layout, &cfg, opts.meta_url.as_deref())?;
    write_settings(&layout, &settings)?;
    Ok(cfg)
}

/// Creates a cloud volume at `url` (`s3://BUCKET/PREFIX`) whose local
/// directory (metadata, journal, cache) is `dir`: the config and the first
/// metadata version go to the bucket, so any machine can mount it from
/// there with the passphrase.
pub fn init_cloud(dir: &Path, url: &str, endpoint: Option<&str>, region: Option<&str>, opts: &InitOptions) -> Result<VolumeConfig> {
    if opts.meta_url.is_some() && is_tape_url(url) {
        // A tape volume's metadata travels with the tape (docs/tape.md).
        return Err(Error::invalid(format!(
            "a volume on a tape ({url}) keeps its metadata on the tape, not in PostgreSQL: leave out --meta"
        )));
    }
    if dir.exists() {
        let mut rd = fs::read_dir(dir).map_err(|e| Error::io(format!("{}: {e}", dir.display())))?;
        if rd.next().is_some() {
            return Err(Error::new(ErrorKind::Exists, format!("{} is not empty; a volume's local directory must be new or empty", dir.display())));
        }
    }
    let settings = LocalSettings { format: "cairn-local".into(), version: FORMAT_VERSION, backend: url.to_string(), endpoint: endpoint.map(str::to_string), region: region.map(str::to_string), mirror: None, volume_id: None };
    let remote = match &opts.backend {
        Some(b) => b.0.clone(),
        None => open_remote(&settings)?,
    };
    // A short first request: a wrong endpoint, bucket or key fails in seconds.
    let probe = match &opts.backend {
        Some(b) => b.0.clone(),
        None => open_remote_with(&settings, cairn_backend::RetryPolicy::quick())?,
    };
    match probe.get(CONFIG_OBJECT) {
        Ok(_) => return Err(Error::new(ErrorKind::Exists, format!("{url} already holds a Cairn volume; mount it with `cairn mount {url} MOUNTPOINT`"))),
        Err(e) if e.kind() == cairn_backend::ErrorKind::NotFound && !format!("{e:?}").contains("NoSuchBucket") => {}
        Err(e) => return Err(explain(e, url, endpoint)),
    }
    let (cfg, master) = VolumeConfig::create(opts)?;
    if let Some(meta_url) = opts.meta_url.as_deref() {
        // The schema before the config: a config naming metadata that was
        // never made would be a volume nobody can mount, while a schema
        // left by a failed put is only an unused schema of a random id.
        // SAFETY: getuid/getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        Meta::create(Location::Url { url: meta_url, volume_id: &cfg.volume_id }, Caller0 { uid, gid, perm: 0o755 })?;
    }
    remote.put_if_absent(CONFIG_OBJECT, &cfg.to_bytes()).map_err(|e| {
        if e.kind() == cairn_backend::ErrorKind::AlreadyExists {
            Error::new(ErrorKind::Exists, format!("{url} already holds a Cairn volume; mount it with `cairn mount {url} MOUNTPOINT` (and --cache-dir for a directory of your choice)"))
        } else {
            explain(e, url, endpoint)
        }
    })?;
    crate::fsutil::create_private_dir_all(dir).map_err(|e| Error::io(format!("creating {}: {e}", dir.display())))?;
    let layout = Layout::new(dir);
    if opts.meta_url.is_some() {
        // PostgreSQL is the metadata's home (made above): no SQLite here,
        // no metadata version in the bucket, no shipping state.
        crate::fsutil::create_private_dir_all(&layout.journal())?;
        write_settings(&layout, &LocalSettings { volume_id: Some(cfg.volume_id.clone()), ..settings })?;
        if let Err(e) = crate::cost::save_unsaved(dir, remote.as_ref()) {
            tracing::warn!("counting the requests of the creation into the bill: {e}");
        }
        return Ok(cfg);
    }
    create_local_state(&layout, &cfg, None)?;
    // Version 1: the empty volume, so a mount from the bucket alone works
    // from the start.
    let keys = Keys::derive(&master, cfg.encryption == crate::config::Encryption::Aes256Gcm).with_owner_domains(cfg.dedup_domain == crate::config::DedupDomain::Owner);
    let mut state = crate::cloud::LocalState::fresh();
    let snapshot = {
        let m = Meta::open(Location::File(&layout.meta_db()), crate::meta::OpenOptions { exclusive: true, ..Meta::options() })?;
        // Version 1 has the bill's table, so no delta names a table the
        // base lacks.
        m.write(|tx| Ok(tx.ensure_bill_table()?))?;
        m.snapshot()?
    };
    let h = crate::versions::Header { kind: crate::versions::Kind::Base, version: 1, time: crate::lease::now(), writer: state.writer_bytes(), prev: None };
    let (stored, digest) = {
        crate::versions::publish(&*cairn_backend::meter::paying(remote.as_ref(), cairn_backend::Subsystem::Metadata), &keys, &h, &snapshot)?
    };
    state.shipped = 1;
    state.shipped_digest = Some(hex::encode(digest));
    state.base_version = 1;
    state.base_bytes = stored;
    state.save(dir)?;
    write_settings(&layout, &LocalSettings { volume_id: Some(cfg.volume_id.clone()), ..settings })?;
    // The requests of the creation start the bill (folded in at the first
    // read-write open).
    if let Err(e) = crate::cost::save_unsaved(dir, remote.as_ref()) {
        tracing::warn!("counting the requests of the creation into the bill: {e}");
    }
    // A store that keeps puts only after a sync (a tape) has the volume
    // once this returns.
    remote.sync()?;
    Ok(cfg)
}

/// The metadata (an SQLite database in the directory, or with `meta_url`
/// the volume's schema in PostgreSQL) and the journal of a new volume
/// directory.
fn create_local_state(layout: &Layout, cfg: &VolumeConfig, meta_url: Option<&str>) -> Result<()> {
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let root = Caller0 { uid, gid, perm: 0o755 };
    match meta_url {
        Some(url) => Meta::create(Location::Url { url, volume_id: &cfg.volume_id }, root)?,
        None => Meta::create(Location::File(&layout.meta_db()), root)?,
    }
    crate::fsutil::create_private_dir_all(&layout.journal())?;
    Ok(())
}

/// Reads a volume directory's settings and config without opening it.
pub fn read_config(dir: &Path) -> Result<(Layout, LocalSettings, Arc<dyn Backend>, VolumeConfig)> {
    read_config_with(dir, None)
}

/// [`read_config`] with the backend given instead of the one the settings name.
fn read_config_with(dir: &Path, injected: Option<&crate::config::InjectedBackend>) -> Result<(Layout, LocalSettings, Arc<dyn Backend>, VolumeConfig)> {
    let layout = Layout::new(dir);
    let raw = fs::read(layout.settings()).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::config(format!("{} is not a Cairn volume (no volume.json; create one with `cairn init`)", dir.display())),
        _ => Error::io(format!("{}: {e}", layout.settings().display())),
    })?;
    let settings: LocalSettings = serde_json::from_slice(&raw)
        .map_err(|e| Error::config(format!("{} is damaged: {e}", layout.settings().display())))?;
    if settings.version != FORMAT_VERSION {
        return Err(Error::config(format!("volume settings version {} is not supported (this build reads {FORMAT_VERSION})", settings.version)));
    }
    let cloud = is_remote_url(&settings.backend);
    let backend = match injected {
        Some(b) => b.0.clone(),
        None => open_backend(&layout, &settings)?,
    };
    let cfg_bytes = if cloud {
        // A short retry budget: a wrong endpoint or bucket fails in seconds.
        let probe = match injected {
            Some(b) => b.0.clone(),
            None => open_remote_with(&settings, cairn_backend::RetryPolicy::quick())?,
        };
        probe.get(CONFIG_OBJECT).map_err(|e| explain(e, &settings.backend, settings.endpoint.as_deref()))?
    } else {
        backend.get(CONFIG_OBJECT).map_err(|e| Error::config(format!("reading the volume config from {}: {e}", backend.describe())))?
    };
    let cfg = VolumeConfig::parse(&cfg_bytes)?;
    let settings = if cloud { check_home(&layout, settings, &cfg)? } else { settings };
    Ok((layout, settings, backend, cfg))
}

/// Refuses a home that holds another volume than the one this directory
/// is the local state of (another tape in the drive, a bucket prefix
/// reused): mounting it would mix two volumes' metadata and data. A
/// directory from before the id was kept records it now.
fn check_home(layout: &Layout, mut settings: LocalSettings, cfg: &VolumeConfig) -> Result<LocalSettings> {
    match &settings.volume_id {
        Some(id) if *id != cfg.volume_id => Err(Error::config(format!(
            "{} holds Cairn volume {}, but {} is the local directory of volume {id}: {}. Load the volume's own {}, or mount this one with another --cache-dir",
            settings.backend,
            cfg.volume_id,
            layout.dir.display(),
            if is_tape_url(&settings.backend) { "the wrong tape" } else { "another volume took this place" },
            if is_tape_url(&settings.backend) { "tape" } else { "location" },
        ))),
        Some(_) => Ok(settings),
        None => {
            settings.volume_id = Some(cfg.volume_id.clone());
            if let Err(e) = write_settings(layout, &settings) {
                tracing::warn!("recording the volume id in {}: {e}", layout.settings().display());
            }
            Ok(settings)
        }
    }
}
