//! `cairn mount`: open a volume and serve it over FUSE, in the foreground
//! or as a daemon.

use crate::volume::VolumeArgs;
use crate::{daemon, logging, metrics, passphrase, resolve, runtime, size, target, utab};
use anyhow::{bail, Context, Result};
use cairn_engine::mirror::MirrorChoice;
use cairn_engine::{OpenOptions, Volume};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How `cairn mount` is spelled for mount(8), fstab and systemd.
const MOUNT_HELPER_HELP: &str = "\
With /sbin/mount.fuse.cairn and /sbin/umount.fuse.cairn linked to this binary, mount(8), \
/etc/fstab and systemd mount units mount volumes too:

    mount -t fuse.cairn VOLUME MOUNTPOINT -o cache_dir=/var/cache/c,ro
    VOLUME  MOUNTPOINT  fuse.cairn  defaults,_netdev,passphrase_file=/etc/cairn/pass  0 0

Every flag above is an -o option without its dashes (cache_dir=DIR or cache-dir=DIR; ro for \
--read-only; no_allow_other for --private, as mount(8) keeps `private` for itself). defaults, \
rw, auto, noauto, nofail, _netdev, user, users, nosuid, nodev, allow_other, x-* and comment= \
are passed over; any other option is an error. The passphrase \
comes from passphrase_file=FILE or the systemd credential cairn-passphrase \
(LoadCredential=cairn-passphrase:FILE), never from the options. A volume whose metadata \
is in PostgreSQL takes meta=postgres://USER@HOST/DB (or CAIRN_META in the unit's \
Environment=); its password comes from PGPASSWORD or a password file, never the options. The daemon always flushes \
everything before it exits; plain umount MOUNTPOINT also waits for that, as cairn umount does, \
when umount(8) learns the type fuse.cairn: under systemd, or when the line has a user-space \
option such as _netdev or uhelper=fuse.cairn (kept in /run/mount/utab); otherwise it returns \
at once. Examples: dist/fstab.example, dist/systemd/.";


/// Mount VOLUME at MOUNTPOINT (in the background unless -f).
#[derive(clap::Args)]
#[command(mut_args(crate::volume::volume_help(None)))]
#[command(after_long_help = MOUNT_HELPER_HELP)]
pub struct MountArgs {
    #[command(flatten)]
    pub vol: VolumeArgs,
    pub mountpoint: PathBuf,
    #[command(flatten)]
    pub store: StoreArgs,
    /// Volume on a tape: memory for data on its way to the drive (a
    /// write waits beyond it): the packs being built, a quarter of it
    /// each (at most 64M), and those queued for the drive. Reads keep a
    /// quarter of it again (32M-256M). At least 16M. Each file goes
    /// down in runs as long as its share of the write-back journal,
    /// which is on disk (docs/tape.md §2 and §10).
    #[arg(long, default_value = "1G", value_parser = size::parse)]
    pub tape_memory: u64,
    /// Volume on a tape: continuous data protection (HPTFS's CDP). Every
    /// object also goes to directory DIR (created if missing; best on
    /// another disk than --cache-dir) at the same time as to the tape: a
    /// write returns when both have it, so the drive and the disk work
    /// together. Reads are served from DIR, so the drive never
    /// repositions to read back what was written; an object DIR lacks
    /// (a mirror added later, or wiped) is read from the tape. DIR holds
    /// the objects exactly as the tape does (sealed on an encrypted
    /// volume). The choice is remembered in --cache-dir: later mounts
    /// from it mirror to DIR without being told, and refuse to start if
    /// DIR has gone (give --mirror DIR again to start it afresh, or
    /// --no-mirror). The tape alone still holds everything: a machine
    /// with only the tape (a new --cache-dir) mounts without a mirror.
    #[arg(long, value_name = "DIR", conflicts_with = "no_mirror")]
    pub mirror: Option<PathBuf>,
    /// Volume on a tape: stop mirroring (forget the --mirror this
    /// --cache-dir remembers; the directory is left as it is).
    #[arg(long)]
    pub no_mirror: bool,
    /// Stay in the foreground and log to the terminal.
    #[arg(short, long)]
    pub foreground: bool,
    /// Mount read-only. On a tape, an idle drive then waits at the
    /// first data on the tape (where a restore starts) rather than at
    /// the append point.
    #[arg(long)]
    pub read_only: bool,
    /// Threads serving the FUSE requests that may wait: reads of data
    /// not in memory and fsyncs (default 4; 32 for a volume on a tape,
    /// where a read may wait seconds for a locate and the drive can
    /// only put in tape order the reads it has been given at once).
    /// One more thread takes every request from the kernel and serves
    /// the rest itself. On a volume other machines share, and with
    /// --no-io-workers, these threads take requests from the kernel
    /// themselves.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Let every --threads thread take requests from the kernel and
    /// serve them whole, instead of one reader handing reads and
    /// fsyncs to them (measured in docs/profile.md, sixth round: the
    /// reader wins on creates, untar and dbench, loses a few percent
    /// on random 4 KiB reads).
    #[arg(long)]
    pub no_io_workers: bool,
    /// Memory for decoded chunks (default: 1/16 of the machine's memory,
    /// at least 256M and at most 1G). A read that misses decodes and
    /// verifies a whole chunk (1 MiB on average), so random reads are
    /// fast only while their working set fits: 4 KiB random reads of a
    /// 512 MiB file ran 7x faster with 1G than with 256M.
    #[arg(long, value_parser = size::parse)]
    pub cache_size: Option<u64>,
    /// Where a background mount logs (default DIR/cairn.log).
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    /// Let only the mounting user in (default: everyone, with kernel
    /// permission checks). In fstab and `mount -o`: no_allow_other
    /// (mount(8) takes `private` for a propagation flag and drops it).
    #[arg(long)]
    pub private: bool,
    /// Send every write(2) to the daemon at once instead of letting the
    /// kernel cache it and send large requests at close, fsync or
    /// memory pressure. The cache made PostMark 1.7-2.7x faster here;
    /// durability is the same either way (only fsync'd bytes are
    /// promised after a crash).
    #[arg(long)]
    pub no_writeback_cache: bool,
    /// close(2) of a file opened for writing returns only once the
    /// file is as durable as fsync makes it: on a tape volume, once its
    /// data, the metadata naming it and a catalog are on the tape. By
    /// default close returns once the writes are in the local journal
    /// (which survives a crash) and they reach the home in the
    /// background; fsync and `cairn umount` wait. On a tape each such
    /// close flushes the drive, so writers that close often slow it.
    #[arg(long)]
    pub fsync_on_close: bool,
    /// Experimental: serve FUSE requests over io_uring (Linux 6.14 or
    /// later, with `echo Y > /sys/module/fuse/parameters/enable_uring`
    /// as root first): one queue per CPU, --threads split across them,
    /// each thread pinned to its queue's CPU. Without the kernel's
    /// support the mount says so and serves over /dev/fuse as usual.
    /// Measured against /dev/fuse in docs/profile.md (sixth round).
    #[arg(long)]
    pub fuse_uring: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g.
    /// 127.0.0.1:9567; port 0 picks a free one, shown by `cairn status`),
    /// or on the Unix socket PATH with `unix:PATH` (made 0600: only the
    /// mounting user may read it; `curl --unix-socket PATH
    /// http://x/metrics`). A TCP port is open to every local user, so
    /// there the counters that tell whether written data was stored
    /// already (deduplicated, new, stored bytes; bucket requests) are
    /// left out unless the volume's dedup domain is `owner`. An address
    /// that cannot be bound (taken by someone else) is logged and the
    /// mount goes on without metrics. At most 2 requests are served
    /// and 8 wait; more connections are closed at once:
    /// FUSE requests and latencies by operation, bytes the kernel read
    /// and wrote, bytes chunked, deduplicated, compressed and stored,
    /// cache hits and misses, journal fill, flush and upload queues,
    /// bucket requests and errors by kind. Any other path answers 404.
    /// `cairn top` shows the same without a port.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Record an access trace into FILE (file reads and writes, where
    /// flushed chunks went, what the bucket cache did) for `cairn sim`
    /// (format: docs/trace.md). Replaces FILE.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
}

// How the mount keeps and cleans the volume's data: the bucket cache,
// durability and lease, the PostgreSQL session, the cleaner (no doc
// comment: flattened, it would replace the command's about text).
#[derive(clap::Args)]
pub struct StoreArgs {
    /// Volume in a bucket: bound on the local pack cache in --cache-dir
    /// (fetched packs and packs not yet uploaded; the latter are never
    /// evicted, and writers wait when they fill it during an outage).
    /// The journal of written data not yet packed gets a quarter of it
    /// (at most 2G), and at least room for two packs.
    #[arg(long, default_value = "10G", value_parser = size::parse)]
    pub cache_dir_size: u64,
    /// Volume in a bucket: what a read miss fetches. 0 (the default):
    /// exactly the bytes the read needs that the cache does not hold,
    /// two such gaps closer than a GET's price in transfer in one
    /// ranged GET. SIZE (4K to 64M): each gap rounded out to aligned
    /// blocks of SIZE, which brings neighbours along at the price of
    /// their transfer; `cairn sim --pack-block` compares them on a
    /// recorded trace.
    #[arg(long, default_value = "0", value_parser = size::parse)]
    pub cache_block: u64,
    /// Volume in a bucket: a miss that starts where the pack's last GET
    /// ended (a reader going through files flushed together, e.g. one
    /// directory's) fetches this much more, so the next files come in
    /// the same GET; a random reader's misses are fetched exactly. 0
    /// turns it off.
    #[arg(long, default_value = "256K", value_parser = size::parse)]
    pub cache_ahead: u64,
    /// Volume in a bucket: when fsync returns. `local`: the data is safe
    /// in the local journal and is uploaded in the background (within
    /// about 10 s while the bucket answers). `remote`: the pack and the
    /// metadata version naming it are in the bucket.
    #[arg(long, value_enum, default_value = "local")]
    pub durability: DurabilityArg,
    /// Volume in a bucket: what the pack cache evicts first. `lru`: the
    /// least recently used block. `kd` (Coral's policy): the blocks of
    /// files read long ago and seldom per byte, a file's blocks together,
    /// in batches that shrink for a while when the read/write mix changes.
    #[arg(long, value_enum, default_value = "lru")]
    pub cache_policy: CachePolicyArg,
    /// Volume in a bucket: seconds between metadata versions shipped to
    /// the bucket (what a lost machine can lose with `local` durability).
    #[arg(long, default_value_t = 5)]
    pub meta_interval: u64,
    /// Volume in a bucket: take the volume over from a machine whose
    /// lease expired without an unmount (it died).
    #[arg(long)]
    pub force: bool,
    /// Volume in a bucket: seconds between renewals of the mount's lease
    /// (1 to 60; the lease expires 120 s after the last renewal). A
    /// mount finds out at its next renewal that its lease was taken or
    /// deleted; renewals happen at metadata shipping rounds
    /// (`--meta-interval`).
    #[arg(long, default_value_t = 30, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=60))]
    pub lease_renew: u64,
    /// Volume in a bucket with its metadata in PostgreSQL: seconds this
    /// mount's session lives without a heartbeat (heartbeats come every
    /// fifth of it; 3 to 3600). If this machine dies, the others clean
    /// up after it (free the unlinked files it had open) this long after
    /// its last heartbeat; if it is cut off from PostgreSQL this long,
    /// it stops writing until remounted.
    #[arg(long, default_value_t = 60, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(3..=3600))]
    pub session_ttl: u64,
    /// Metadata in PostgreSQL: seconds one operation waits for the
    /// database (reconnecting and retrying) before it fails with EIO
    /// (1 to 3600). While PostgreSQL is unreachable, file operations
    /// block until it has been unreachable this long, then fail at
    /// once until it answers again (a call such as fsync or close
    /// waits about this long in all); data already cached stays
    /// readable.
    #[arg(long, default_value_t = 30, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub meta_timeout: u64,
    /// Metadata in PostgreSQL: make every metadata change wait for
    /// PostgreSQL's disk flush before it returns (as JuiceFS does).
    /// Without it a change is seen by every mount at once and is
    /// durable at the next fsync, fsyncdir or syncfs on any file, or
    /// within PostgreSQL's WAL writer delay (0.6 s by default): a crash
    /// of the database server loses at most that window of changes no
    /// fsync covered, as a local file system's crash does.
    #[arg(long)]
    pub meta_sync_commit: bool,
    /// Every volume but one on a tape: seconds between the cleaner's
    /// rounds inside the mount, which clean the packs whose dead bytes
    /// have cost what cleaning them costs (at --gc-prices). Between
    /// rounds it looks every second whether the dead bytes passed
    /// --gc-dead-ratio / --gc-dead-floor or small packs piled up, and
    /// cleans at once if so (docs/frugal.md §8). 0: never clean inside
    /// the mount (`cairn gc` then frees space, unmounted).
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    pub gc_interval: u64,
    /// The cleaner's hard bound: dead bytes at most this many times the
    /// live ones (or --gc-dead-floor, whichever is more).
    #[arg(long, default_value_t = 1.0, value_name = "RATIO")]
    pub gc_dead_ratio: f64,
    /// The cleaner's hard bound's floor: dead bytes up to this much are
    /// always allowed (so a small volume is not rewritten for nothing).
    #[arg(long, default_value = "256M", value_parser = size::parse)]
    pub gc_dead_floor: u64,
    /// Metadata in PostgreSQL: a fixed number of seconds a chunk whose
    /// last reference went is left alone before this mount's cleaner
    /// may delete it (as `cairn gc --chunk-grace`). Default: until no
    /// flush round that began before it died (less 5 s) is under way
    /// on any machine; a gone session's uploads are kept 900 s.
    #[arg(long, value_name = "SECONDS")]
    pub chunk_grace: Option<u64>,
    /// The prices the cleaner weighs (aws, coral, local or a TOML file,
    /// as for `cairn cost`); default: aws in a bucket, local (a local
    /// disk's space against rewrite work) in a directory.
    #[arg(long, value_name = "aws|coral|local|FILE")]
    pub gc_prices: Option<String>,
    /// Volume in a bucket: seconds a read of a pack in an archive class
    /// (GLACIER, DEEP_ARCHIVE) waits for the restore it starts before it
    /// fails with EAGAIN ("try again"; the log says when the restore was
    /// requested and when it should be ready, hours for GLACIER). The
    /// restore goes on; a read after it completes succeeds. `cairn warmup`
    /// starts restores ahead. 0: fail at once (the restore is still sent).
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    pub recall_wait: u64,
}

impl StoreArgs {
    /// The bucket and cleaner options of the mount, checked.
    fn cloud_options(&self) -> Result<cairn_engine::cloud::CloudOptions> {
        if self.cache_block != 0 && !(4 << 10..=64 << 20).contains(&self.cache_block) {
            bail!("--cache-block must be 0 (exact) or between 4K and 64M");
        }
        if self.cache_ahead > 64 << 20 {
            bail!("--cache-ahead must be at most 64M");
        }
        Ok(cairn_engine::cloud::CloudOptions {
            cache_bytes: self.cache_dir_size,
            cache_block: self.cache_block,
            cache_ahead: self.cache_ahead,
            durability: match self.durability {
                DurabilityArg::Local => cairn_engine::cache::disk::Durability::Local,
                DurabilityArg::Remote => cairn_engine::cache::disk::Durability::Remote,
            },
            cache_policy: match self.cache_policy {
                CachePolicyArg::Lru => cairn_engine::cache::PolicyChoice::Lru,
                CachePolicyArg::Kd => cairn_engine::cache::PolicyChoice::Kd,
            },
            meta_interval: std::time::Duration::from_secs(self.meta_interval.max(1)),
            force: self.force,
            lease_renew: std::time::Duration::from_secs(self.lease_renew),
            session_ttl: std::time::Duration::from_secs(self.session_ttl),
            gc_interval: (self.gc_interval > 0).then(|| std::time::Duration::from_secs(self.gc_interval)),
            gc_prices: self.gc_prices.as_deref().map(cairn_engine::cost::Prices::load).transpose()?,
            gc_bound: cairn_engine::cleaner::DeadBound { ratio: self.gc_dead_ratio, floor: self.gc_dead_floor },
            recall_wait: std::time::Duration::from_secs(self.recall_wait),
            ..Default::default()
        })
    }
}

pub fn run(a: MountArgs, verbose: u8) -> Result<i32> {
    let MountArgs { vol: VolumeArgs { volume, cloud, meta, pass }, mountpoint, store, tape_memory, mirror, no_mirror, foreground, read_only, threads, cache_size, log_file, private, no_writeback_cache, fsync_on_close, fuse_uring, no_io_workers, metrics, trace } = a;
    cairn_engine::tape::configure_for_mount(tape_memory, read_only)?;
    let mirror = mirror_choice(mirror, no_mirror, &volume)?;
    check_fuse_access(private)?;
    let local = target::local_dir(&volume, &cloud)?;
    // The same local directory mounted twice (the volume's lock
    // would refuse it less clearly). A volume in a bucket mounted
    // here from another local directory is another "machine": its
    // lease decides, and a read-only mount beside it is fine.
    if let Some(m) = resolve::mount_using(&local) {
        bail!("{volume} is in use: already mounted at {} (daemon pid {}); use that mount, or `cairn umount {}` first", m.mountpoint.display(), m.pid, m.mountpoint.display());
    }
    warn_if_not_empty(&mountpoint);
    // A local directory this mount creates goes again if the mount fails.
    let fresh = FreshDir::new(target::is_url(&volume).then_some(local));
    // Opening a tape costs seconds of positioning (label, catalog at
    // the end of the data): the checks below share one open, and
    // the daemon goes on with it after the fork (parked for it: no
    // thread may exist when the process forks).
    let held_tape = std::cell::Cell::new(if cairn_engine::tape::is_tape_url(&volume) { Some(cairn_engine::tape::open(&target::canonical(&volume)?)?) } else { None });
    let dir = target::open_dir(&volume, &cloud)?;
    // Remembered in the local directory before anything opens the
    // tape (the open finds the mirror there).
    cairn_engine::mirror::choose(&dir, &mirror)?;
    // Ask for the passphrase before going to the background.
    let (_, settings, _, cfg) = cairn_engine::read_config(&dir)?;
    // Checked before going to the background: a missing or refused
    // URL fails here, with the engine's own words for a missing one.
    let meta_url = meta.for_volume(&cfg)?;
    if cfg.meta == cairn_engine::config::MetaKind::Postgres && meta_url.is_none() {
        bail!("this volume keeps its metadata in PostgreSQL (schema cairn_{}): add --meta postgres://USER@HOST/DB (or set CAIRN_META)", cfg.volume_id);
    }
    let passphrase = if cfg.needs_passphrase() { Some(passphrase::get(pass.passphrase_file.as_deref(), false)?) } else { None };
    let dir = std::fs::canonicalize(&dir).with_context(|| format!("volume {}", dir.display()))?;
    let backend = backend_label(&cairn_engine::config::Layout::new(&dir), &settings)?;
    // The mount's source is the volume as the user named it (the
    // canonical directory, or the URL): mount(8) compares it with
    // an fstab line's to see that the line is mounted already.
    let source = if target::is_url(&volume) { volume.clone() } else { dir.display().to_string() };
    let cfg = cairn_fuse::MountConfig {
        mountpoint: mountpoint.clone(),
        read_only,
        allow_other: !private,
        threads: threads.unwrap_or(if cairn_engine::tape::is_tape_url(&volume) { 32 } else { 4 }).max(1),
        io_workers: !no_io_workers,
        fsname: source.clone(),
        // A read-only mount writes nothing, and with the writeback
        // cache the kernel trusts its own size of a regular file
        // over the daemon's: a file another machine changes
        // (a bucket volume with PostgreSQL metadata) would keep its
        // old size here, and reads would stop there, until evicted.
        writeback_cache: !no_writeback_cache && !read_only,
        fuse_uring,
        fsync_on_close,
    };
    let cloud_opts = store.cloud_options()?;
    let opts = OpenOptions { passphrase, read_only, cache_bytes: cache_size.unwrap_or_else(default_cache_size) as usize, cloud: cloud_opts, trace, meta_url, meta_timeout: Some(std::time::Duration::from_secs(store.meta_timeout)), meta_sync_commit: store.meta_sync_commit, chunk_grace: store.chunk_grace.map(std::time::Duration::from_secs), ..Default::default() };
    // The control socket answers what POSIX cannot ask (stats, sync).
    let serve = |vol: &Arc<Volume>| -> Result<cairn_engine::control::Server> {
        Ok(cairn_engine::control::serve(vol, &cairn_engine::control::socket_path(&dir))?)
    };
    // Once mounted, the daemon registers in /run/cairn (see
    // runtime.rs) until it exits: `cairn status` and `cairn umount`
    // find the local directory of the mount there.
    // (canonical before the mount: afterwards resolving it would ask the mount)
    let mp_canon = std::fs::canonicalize(&mountpoint).unwrap_or_else(|_| mountpoint.clone());
    let register = |registration: &mut Option<runtime::Registration>, metrics: Option<String>| {
        let entry = runtime_entry(&mp_canon, &source, &dir, &backend, metrics);
        match entry.and_then(|e| runtime::Registration::write(&e)) {
            Ok(r) => *registration = Some(r),
            Err(e) => tracing::warn!("registering the mount in {}: {e:#}", runtime::dir().display()),
        }
    };
    if foreground {
        logging::init(verbose, log_file.as_deref())?;
        let vol = Volume::load(&dir, opts)?;
        let _control = serve(&vol)?;
        let exporter = metrics.as_deref().and_then(|a| metrics::serve_or_log(&vol, a));
        let mut registration = None;
        let mounted = cairn_fuse::mount(vol, &cfg, || {
            fresh.keep();
            register(&mut registration, exporter.as_ref().map(metrics::Server::addr));
            utab::add(&source, &mp_canon);
            eprintln!("cairn: mounted {} at {}", dir.display(), mountpoint.display())
        });
        utab::remove(&source, &mp_canon);
        // Its Unix socket goes with the mount (the process may end
        // without running destructors).
        drop(exporter);
        mounted?;
        Ok(0)
    } else {
        let log = log_file.unwrap_or_else(|| dir.join("cairn.log"));
        cairn_engine::tape::park_for_fork();
        let code = daemon::run_in_background(|ready| {
            cairn_engine::tape::resume_after_fork();
            logging::init(verbose, Some(&log))?;
            let vol = Volume::load(&dir, opts)?;
            // The volume holds the tape now; the last reference
            // dropped at its close stops the drive.
            drop(held_tape.take());
            let _control = serve(&vol)?;
            let exporter = metrics.as_deref().and_then(|a| metrics::serve_or_log(&vol, a));
            let mut registration = None;
            let mounted = cairn_fuse::mount(vol, &cfg, || {
                register(&mut registration, exporter.as_ref().map(metrics::Server::addr));
                utab::add(&source, &mp_canon);
                ready()
            });
            utab::remove(&source, &mp_canon);
            drop(exporter);
            mounted?;
            Ok(())
        });
        // The parent: the child has the tape's drive. Dropping the
        // parked store here would close it under the child.
        std::mem::forget(held_tape.take());
        let code = code?;
        fresh.keep();
        Ok(code)
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum DurabilityArg {
    Local,
    Remote,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum CachePolicyArg {
    Lru,
    Kd,
}

/// What `--mirror DIR` / `--no-mirror` ask for (neither: what the local
/// directory remembers); refused for a volume not on a tape.
fn mirror_choice(mirror: Option<PathBuf>, no_mirror: bool, volume: &str) -> Result<MirrorChoice> {
    let choice = match (mirror, no_mirror) {
        (Some(d), _) => MirrorChoice::Use(d),
        (None, true) => MirrorChoice::Off,
        (None, false) => MirrorChoice::Remembered,
    };
    if choice != MirrorChoice::Remembered && !cairn_engine::tape::is_tape_url(volume) {
        bail!("--mirror and --no-mirror are for volumes on a tape (tape:/dev/nstN or tape-emu:DIR); {volume} is not one");
    }
    Ok(choice)
}

/// The chunk cache of a mount: 1/16 of physical memory, within [256 MiB, 1 GiB].
fn default_cache_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    let ram = (pages.max(0) as u64).saturating_mul(page.max(0) as u64);
    (ram / 16).clamp(256 << 20, 1 << 30)
}


/// Whether this user can make the FUSE mount asked for, checked before
/// anything is opened so that the error says what to do.
pub(crate) fn check_fuse_access(private: bool) -> Result<()> {
    // SAFETY: access and geteuid have no preconditions; the path is a C string.
    if unsafe { libc::access(c"/dev/fuse".as_ptr(), libc::R_OK | libc::W_OK) } != 0 {
        let e = std::io::Error::last_os_error();
        bail!("cannot open /dev/fuse for reading and writing ({e}): a FUSE mount needs it. Is FUSE installed (apt-get install fuse3) and the fuse module loaded? As a user, /dev/fuse must be mode 0666, as Debian sets it");
    }
    // SAFETY: as above.
    if !private && unsafe { libc::geteuid() } != 0 && !user_allow_other() {
        bail!("mounting for every user (the default) needs the line user_allow_other in /etc/fuse.conf, which only root can add; or mount with --private to let only yourself in");
    }
    Ok(())
}

/// Whether /etc/fuse.conf lets users mount with allow_other.
fn user_allow_other() -> bool {
    std::fs::read_to_string("/etc/fuse.conf").is_ok_and(|c| c.lines().any(|l| l.trim() == "user_allow_other"))
}

/// Says so when a mount is about to hide what a directory holds.
pub(crate) fn warn_if_not_empty(mountpoint: &Path) {
    let Ok(rd) = std::fs::read_dir(mountpoint) else { return };
    let n = rd.take(1001).count();
    if n > 0 {
        let what = match n {
            1 => "its 1 entry is".to_string(),
            1001.. => "its more than 1,000 entries are".to_string(),
            n => format!("its {n} entries are"),
        };
        eprintln!("cairn: warning: {} is not empty: {what} hidden while it is mounted, and come back at the unmount", mountpoint.display());
    }
}

/// A local directory that a failed mount leaves as it found it: removed if
/// this mount created it, unless `keep` was called.
struct FreshDir {
    path: Option<PathBuf>,
    kept: std::cell::Cell<bool>,
}

impl FreshDir {
    fn new(path: Option<PathBuf>) -> FreshDir {
        FreshDir { path: path.filter(|p| !p.exists()), kept: std::cell::Cell::new(false) }
    }

    fn keep(&self) {
        self.kept.set(true);
    }
}

impl Drop for FreshDir {
    fn drop(&mut self) {
        if let (Some(p), false) = (&self.path, self.kept.get()) {
            // The failed daemon may still be closing its log in it.
            for _ in 0..20 {
                match std::fs::remove_dir_all(p) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => std::thread::sleep(std::time::Duration::from_millis(50)),
                    _ => return,
                }
            }
        }
    }
}

/// Where a volume's packs are, for `cairn status`.
fn backend_label(layout: &cairn_engine::config::Layout, settings: &cairn_engine::config::LocalSettings) -> Result<String> {
    if target::is_url(&settings.backend) {
        return Ok(match (&settings.endpoint, &settings.mirror) {
            (Some(ep), _) => format!("{} at {ep}", settings.backend),
            (None, Some(m)) => format!("{} mirrored to {}", settings.backend, m.display()),
            (None, None) => settings.backend.clone(),
        });
    }
    Ok(format!("local:{}", layout.store_path(settings)?.display()))
}

/// This daemon's runtime entry, once its mount is in the mount table.
fn runtime_entry(mp: &Path, source: &str, dir: &Path, backend: &str, metrics: Option<String>) -> Result<runtime::Entry> {
    let m = cairn_fuse::mounttable::mount_entry(mp)?.with_context(|| format!("{} is not in the mount table", mp.display()))?;
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    Ok(runtime::Entry { pid: std::process::id() as i32, mountpoint: mp.to_path_buf(), volume: source.to_string(), local_dir: dir.to_path_buf(), backend: backend.to_string(), dev: m.dev, started, metrics })
}

