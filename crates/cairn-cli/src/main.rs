//! `cairn`: create, mount, check and maintain Cairn volumes.

mod archive;
mod daemon;
mod edit;
mod generate;
mod inspect;
mod meta_url;
mod metrics;
mod mount_helper;
mod passphrase;
mod progress;
mod resolve;
mod runtime;
mod sim;
mod size;
mod status;
mod tape;
mod utab;
mod target;

use anyhow::{bail, Context, Result};
use cairn_engine::maintenance;
use cairn_engine::{ChunkerParams, InitOptions, OpenOptions, Volume};
use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Cairn: a deduplicating, compressing, encrypting file system in user space.
///
/// A volume (VOLUME) lives in a directory: its metadata, its write-back
/// journal and its packs under DIR/store. Or it lives in a bucket,
/// s3://BUCKET/PREFIX, with a local directory (--cache-dir) for its working
/// metadata, journal and cache: any machine with the passphrase mounts it
/// from the bucket alone. Mount with `cairn mount VOLUME MOUNTPOINT` and use
/// it like any file system.
#[derive(Parser)]
#[command(name = "cairn", version, about, long_about, propagate_version = true)]
struct Cli {
    /// More log output (repeat for more); also RUST_LOG=cairn_engine=debug.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Clone)]
struct PassArgs {
    /// Read the passphrase of an encrypted volume from this file (first line).
    /// Otherwise CAIRN_PASSPHRASE, otherwise a prompt on the terminal.
    #[arg(long, value_name = "FILE")]
    passphrase_file: Option<PathBuf>,
}

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

#[derive(Subcommand)]
enum Cmd {
    /// Create a new volume in DIR (a new or empty directory), or in a bucket
    /// (s3://BUCKET/PREFIX; the bucket must exist).
    Init {
        #[arg(value_name = "VOLUME")]
        dir: String,
        #[command(flatten)]
        cloud: target::CloudArgs,
        #[command(flatten)]
        meta: meta_url::MetaArgs,
        /// Encrypt data and metadata indexes with AES-256-GCM under a key
        /// wrapped by your passphrase (Argon2id).
        #[arg(long)]
        encrypt: bool,
        #[command(flatten)]
        pass: PassArgs,
        /// Smallest chunk (e.g. 256K).
        #[arg(long, default_value = "256K", value_parser = size::parse)]
        chunk_min: u64,
        /// Average chunk size.
        #[arg(long, default_value = "1M", value_parser = size::parse)]
        chunk_avg: u64,
        /// Largest chunk.
        #[arg(long, default_value = "4M", value_parser = size::parse)]
        chunk_max: u64,
        /// Target size of the pack objects written to the backend (default
        /// 32M in a directory, 16M in a bucket, 64M on a tape). In a bucket
        /// 16M packs uploaded and read back faster than 32M or 64M ones on
        /// the S3-compatible server measured (docs/profile.md, fourth
        /// round), at 4 or 5 requests per pack instead of 10 or 11 for 64M.
        #[arg(long, value_parser = size::parse)]
        pack_size: Option<u64>,
        /// zstd level for chunk compression (1 is fast; 19 is small).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i32).range(-7..=22))]
        zstd_level: i32,
        /// Which files' data may share chunks: `volume` (any file's, the
        /// default: identical data is stored once) or `owner` (only the
        /// files of one owner's: identical data of two users is stored
        /// twice, and no user can learn by writing whether another stored
        /// some data). Fixed for the volume's life; see
        /// docs/threat-model.md, "What dedup tells a co-tenant".
        #[arg(long, default_value = "volume", value_name = "volume|owner")]
        dedup_domain: cairn_engine::config::DedupDomain,
    },
    /// Mount VOLUME at MOUNTPOINT (in the background unless -f).
    #[command(after_long_help = MOUNT_HELPER_HELP)]
    Mount {
        #[arg(value_name = "VOLUME")]
        dir: String,
        mountpoint: PathBuf,
        #[command(flatten)]
        cloud: target::CloudArgs,
        #[command(flatten)]
        meta: meta_url::MetaArgs,
        /// Volume in a bucket: bound on the local pack cache in --cache-dir
        /// (fetched packs and packs not yet uploaded; the latter are never
        /// evicted, and writers wait when they fill it during an outage).
        /// The journal of written data not yet packed gets a quarter of it
        /// (at most 2G), and at least room for two packs.
        #[arg(long, default_value = "10G", value_parser = size::parse)]
        cache_dir_size: u64,
        /// Volume in a bucket: what a read miss fetches. 0 (the default):
        /// exactly the bytes the read needs that the cache does not hold,
        /// two such gaps closer than a GET's price in transfer in one
        /// ranged GET. SIZE (4K to 64M): each gap rounded out to aligned
        /// blocks of SIZE, which brings neighbours along at the price of
        /// their transfer; `cairn sim --pack-block` compares them on a
        /// recorded trace.
        #[arg(long, default_value = "0", value_parser = size::parse)]
        cache_block: u64,
        /// Volume in a bucket: a miss that starts where the pack's last GET
        /// ended (a reader going through files flushed together, e.g. one
        /// directory's) fetches this much more, so the next files come in
        /// the same GET; a random reader's misses are fetched exactly. 0
        /// turns it off.
        #[arg(long, default_value = "256K", value_parser = size::parse)]
        cache_ahead: u64,
        /// Volume in a bucket: when fsync returns. `local`: the data is safe
        /// in the local journal and is uploaded in the background (within
        /// about 10 s while the bucket answers). `remote`: the pack and the
        /// metadata version naming it are in the bucket.
        #[arg(long, value_enum, default_value = "local")]
        durability: DurabilityArg,
        /// Volume in a bucket: what the pack cache evicts first. `lru`: the
        /// least recently used block. `kd` (Coral's policy): the blocks of
        /// files read long ago and seldom per byte, a file's blocks together,
        /// in batches that shrink for a while when the read/write mix changes.
        #[arg(long, value_enum, default_value = "lru")]
        cache_policy: CachePolicyArg,
        /// Volume in a bucket: seconds between metadata versions shipped to
        /// the bucket (what a lost machine can lose with `local` durability).
        #[arg(long, default_value_t = 5)]
        meta_interval: u64,
        /// Volume in a bucket: take the volume over from a machine whose
        /// lease expired without an unmount (it died).
        #[arg(long)]
        force: bool,
        /// Volume in a bucket: seconds between renewals of the mount's lease
        /// (1 to 60; the lease expires 120 s after the last renewal). A
        /// mount finds out at its next renewal that its lease was taken or
        /// deleted; renewals happen at metadata shipping rounds
        /// (`--meta-interval`).
        #[arg(long, default_value_t = 30, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=60))]
        lease_renew: u64,
        /// Volume in a bucket with its metadata in PostgreSQL: seconds this
        /// mount's session lives without a heartbeat (heartbeats come every
        /// fifth of it; 3 to 3600). If this machine dies, the others clean
        /// up after it (free the unlinked files it had open) this long after
        /// its last heartbeat; if it is cut off from PostgreSQL this long,
        /// it stops writing until remounted.
        #[arg(long, default_value_t = 60, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(3..=3600))]
        session_ttl: u64,
        /// Metadata in PostgreSQL: seconds one operation waits for the
        /// database (reconnecting and retrying) before it fails with EIO
        /// (1 to 3600). While PostgreSQL is unreachable, file operations
        /// block until it has been unreachable this long, then fail at
        /// once until it answers again (a call such as fsync or close
        /// waits about this long in all); data already cached stays
        /// readable.
        #[arg(long, default_value_t = 30, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=3600))]
        meta_timeout: u64,
        /// Metadata in PostgreSQL: make every metadata change wait for
        /// PostgreSQL's disk flush before it returns (as JuiceFS does).
        /// Without it a change is seen by every mount at once and is
        /// durable at the next fsync, fsyncdir or syncfs on any file, or
        /// within PostgreSQL's WAL writer delay (0.6 s by default): a crash
        /// of the database server loses at most that window of changes no
        /// fsync covered, as a local file system's crash does.
        #[arg(long)]
        meta_sync_commit: bool,
        /// Every volume but one on a tape: seconds between the cleaner's
        /// rounds inside the mount, which clean the packs whose dead bytes
        /// have cost what cleaning them costs (at --gc-prices). Between
        /// rounds it looks every second whether the dead bytes passed
        /// --gc-dead-ratio / --gc-dead-floor or small packs piled up, and
        /// cleans at once if so (docs/frugal.md §8). 0: never clean inside
        /// the mount (`cairn gc` then frees space, unmounted).
        #[arg(long, default_value_t = 60, value_name = "SECONDS")]
        gc_interval: u64,
        /// The cleaner's hard bound: dead bytes at most this many times the
        /// live ones (or --gc-dead-floor, whichever is more).
        #[arg(long, default_value_t = 1.0, value_name = "RATIO")]
        gc_dead_ratio: f64,
        /// The cleaner's hard bound's floor: dead bytes up to this much are
        /// always allowed (so a small volume is not rewritten for nothing).
        #[arg(long, default_value = "256M", value_parser = size::parse)]
        gc_dead_floor: u64,
        /// Metadata in PostgreSQL: a fixed number of seconds a chunk whose
        /// last reference went is left alone before this mount's cleaner
        /// may delete it (as `cairn gc --chunk-grace`). Default: until no
        /// flush round that began before it died (less 5 s) is under way
        /// on any machine; a gone session's uploads are kept 900 s.
        #[arg(long, value_name = "SECONDS")]
        chunk_grace: Option<u64>,
        /// The prices the cleaner weighs (aws, coral, local or a TOML file,
        /// as for `cairn cost`); default: aws in a bucket, local (a local
        /// disk's space against rewrite work) in a directory.
        #[arg(long, value_name = "aws|coral|local|FILE")]
        gc_prices: Option<String>,
        /// Volume on a tape: memory for data on its way to the drive (a
        /// write waits beyond it): the packs being built, a quarter of it
        /// each (at most 64M), and those queued for the drive. Reads keep a
        /// quarter of it again (32M-256M). At least 16M. Each file goes
        /// down in runs as long as its share of the write-back journal,
        /// which is on disk (docs/tape.md §2 and §10).
        #[arg(long, default_value = "1G", value_parser = size::parse)]
        tape_memory: u64,
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
        mirror: Option<PathBuf>,
        /// Volume on a tape: stop mirroring (forget the --mirror this
        /// --cache-dir remembers; the directory is left as it is).
        #[arg(long)]
        no_mirror: bool,
        /// Stay in the foreground and log to the terminal.
        #[arg(short, long)]
        foreground: bool,
        /// Mount read-only. On a tape, an idle drive then waits at the
        /// first data on the tape (where a restore starts) rather than at
        /// the append point.
        #[arg(long)]
        read_only: bool,
        /// Threads serving the FUSE requests that may wait: reads of data
        /// not in memory and fsyncs (default 4; 32 for a volume on a tape,
        /// where a read may wait seconds for a locate and the drive can
        /// only put in tape order the reads it has been given at once).
        /// One more thread takes every request from the kernel and serves
        /// the rest itself. On a volume other machines share, and with
        /// --no-io-workers, these threads take requests from the kernel
        /// themselves.
        #[arg(long)]
        threads: Option<usize>,
        /// Let every --threads thread take requests from the kernel and
        /// serve them whole, instead of one reader handing reads and
        /// fsyncs to them (measured in docs/profile.md, sixth round: the
        /// reader wins on creates, untar and dbench, loses a few percent
        /// on random 4 KiB reads).
        #[arg(long)]
        no_io_workers: bool,
        /// Memory for decoded chunks (default: 1/16 of the machine's memory,
        /// at least 256M and at most 1G). A read that misses decodes and
        /// verifies a whole chunk (1 MiB on average), so random reads are
        /// fast only while their working set fits: 4 KiB random reads of a
        /// 512 MiB file ran 7x faster with 1G than with 256M.
        #[arg(long, value_parser = size::parse)]
        cache_size: Option<u64>,
        /// Where a background mount logs (default DIR/cairn.log).
        #[arg(long, value_name = "FILE")]
        log_file: Option<PathBuf>,
        /// Let only the mounting user in (default: everyone, with kernel
        /// permission checks). In fstab and `mount -o`: no_allow_other
        /// (mount(8) takes `private` for a propagation flag and drops it).
        #[arg(long)]
        private: bool,
        /// Send every write(2) to the daemon at once instead of letting the
        /// kernel cache it and send large requests at close, fsync or
        /// memory pressure. The cache made PostMark 1.7-2.7x faster here;
        /// durability is the same either way (only fsync'd bytes are
        /// promised after a crash).
        #[arg(long)]
        no_writeback_cache: bool,
        /// close(2) of a file opened for writing returns only once the
        /// file is as durable as fsync makes it: on a tape volume, once its
        /// data, the metadata naming it and a catalog are on the tape. By
        /// default close returns once the writes are in the local journal
        /// (which survives a crash) and they reach the home in the
        /// background; fsync and `cairn umount` wait. On a tape each such
        /// close flushes the drive, so writers that close often slow it.
        #[arg(long)]
        fsync_on_close: bool,
        /// Experimental: serve FUSE requests over io_uring (Linux 6.14 or
        /// later, with `echo Y > /sys/module/fuse/parameters/enable_uring`
        /// as root first): one queue per CPU, --threads split across them,
        /// each thread pinned to its queue's CPU. Without the kernel's
        /// support the mount says so and serves over /dev/fuse as usual.
        /// Measured against /dev/fuse in docs/profile.md (sixth round).
        #[arg(long)]
        fuse_uring: bool,
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
        metrics: Option<String>,
        /// Record an access trace into FILE (file reads and writes, where
        /// flushed chunks went, what the bucket cache did) for `cairn sim`
        /// (format: docs/trace.md). Replaces FILE.
        #[arg(long, value_name = "FILE")]
        trace: Option<PathBuf>,
        #[command(flatten)]
        pass: PassArgs,
    },
    /// List every Cairn mount on this machine: volume, backend, mountpoint,
    /// daemon pid, uptime, bytes not yet in the backend, and health.
    ///
    /// Mounts come from the kernel's mount table (type fuse.cairn); each
    /// mount's daemon registers its pid, local directory and backend in
    /// /run/cairn/mounts/PID.json (other users: $XDG_RUNTIME_DIR/cairn/mounts)
    /// while it runs, and answers the rest on its control socket. Dirty bytes
    /// are the write-back journal plus packs waiting for upload: what this
    /// machine holds that the backend has not got yet. Health: ok;
    /// backend_unreachable (uploads, metadata shipping or lease renewals are
    /// failing: writes pile up locally and are sent when the bucket answers);
    /// lease_lost (another machine took the volume's lease, or its lease
    /// object was deleted: the mount refuses writes, and `cairn umount` of
    /// it exits non-zero); session_lost (a volume whose metadata is in
    /// PostgreSQL: the mount's session expired, perhaps while the database
    /// was unreachable, and it refuses writes until mounted again);
    /// degraded (the flusher is failing); not_responding (the daemon does not
    /// answer within 5 s); dead (the daemon is gone: `cairn umount` it);
    /// unknown (it cannot be asked, e.g. another user's mount). The last
    /// error of each failing part is shown. Exits 0 whatever the health.
    /// It takes no --meta: a mount whose volume keeps its metadata in
    /// PostgreSQL holds its own connection and answers for it.
    Status {
        /// Print as JSON (one object per mount).
        #[arg(long)]
        json: bool,
    },
    /// Live rates of a mount, refreshed every second, as `juicefs stats`:
    /// FUSE requests and their latency, bytes the kernel read and wrote,
    /// bytes chunked, deduplicated, compressed and stored, cache hit ratios,
    /// journal fill, flush and upload queues, bucket requests and errors.
    ///
    /// Read from the mount's control socket (no --metrics port needed);
    /// the same counters as the Prometheus endpoint. q (or Ctrl-C) stops it.
    /// `cairn stats VOLUME --watch` is the same by volume. No --meta: the
    /// mount answers, whatever holds its volume's metadata.
    Top {
        /// The mountpoint, or the mounted volume (a directory or s3://BUCKET/PREFIX).
        mountpoint: PathBuf,
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
        /// Stop after this many refreshes (default: run until interrupted).
        #[arg(long, value_name = "N")]
        count: Option<u64>,
        /// One refresh, then exit (--count 1).
        #[arg(long, conflicts_with = "count")]
        once: bool,
    },
    /// Unmount a Cairn mount and wait until its data is safely flushed.
    Umount {
        /// The mountpoint, or the mounted volume (a directory or s3://BUCKET/PREFIX).
        mountpoint: PathBuf,
        /// Give up waiting for the flush after this many seconds.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
    /// Check a volume's consistency (it must not be mounted).
    Fsck {
        /// The volume (a directory, s3://BUCKET/PREFIX or a tape), or the
        /// mountpoint of a mounted one.
        #[arg(value_name = "VOLUME")]
        dir: String,
        #[command(flatten)]
        cloud: target::CloudArgs,
        #[command(flatten)]
        meta: meta_url::MetaArgs,
        /// Also read, decrypt and verify every stored chunk.
        #[arg(long)]
        read_data: bool,
        /// Replay a damaged journal: every record that still verifies, the
        /// damaged ones skipped (lost); a copy of each damaged segment is
        /// kept in the volume's journal-damaged/ directory.
        #[arg(long)]
        salvage_journal: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        pass: PassArgs,
    },
    /// Show space use: logical and stored bytes, dedup and compression, and
    /// for a volume in a bucket its cache (hits, fetched bytes, evictions).
    /// Given a directory or file inside a mount instead: that tree's files,
    /// bytes, dedup, and what it shares with the rest of the volume versus
    /// what deleting it would free.
    Stats {
        /// The volume (a directory, s3://BUCKET/PREFIX or a tape), the
        /// mountpoint of a mounted one, or a path inside a mount.
        #[arg(value_name = "VOLUME")]
        dir: String,
        #[command(flatten)]
        cloud: target::CloudArgs,
        #[command(flatten)]
        meta: meta_url::MetaArgs,
        /// Print as JSON.
        #[arg(long)]
        json: bool,
        /// Show the mounted volume's live rates instead, as `cairn top`.
        #[arg(long, conflicts_with = "json")]
        watch: bool,
        #[command(flatten)]
        pass: PassArgs,
    },
    /// The bill of a volume in a bucket: requests by kind, transfer up and
    /// down, stored bytes (live and dead), priced, and what each subsystem
    /// spent.
    ///
    /// Every HTTP request this volume's mounts and commands sent to the bucket
    /// is counted as it is sent (failed attempts and retries too; a listing
    /// counts a request per page of 1,000 names, a multipart upload its
    /// create, each part and its completion), with the bytes of object
    /// bodies up and down, by who asked: write (pack uploads), read_miss,
    /// prefetch, gc, metadata (metadata versions, the lease, trash) and
    /// other (the config object, fsck, commands). Stored bytes accrue by the
    /// second, mounted or not: live and dead bytes of the packs the metadata
    /// names. The counts live in the volume's metadata, so they survive
    /// remounts and ship to the bucket with it; what a mount counts after
    /// its last metadata version (that version's own upload, the lease's
    /// release) waits in the local directory and ships with the next mount
    /// from it.
    ///
    /// A mounted volume answers through its control socket and sends no
    /// request for it; an unmounted one is opened read-only, and the
    /// requests that takes are counted after this report (the next one shows
    /// them). Not counted: the requests of a command that failed before the
    /// volume's local directory existed, of a read-only query (`stats`,
    /// `cost`, `meta list`, `gc --dry-run`) run on a machine without a local
    /// directory of the volume (it works in a temporary one, removed
    /// afterwards), metadata versions' storage, and
    /// the storage of packs gc trashed that wait for deletion.
    Cost {
        /// s3://BUCKET/PREFIX (or the volume's local directory, or the
        /// mountpoint of the volume).
        #[arg(value_name = "VOLUME")]
        dir: String,
        #[command(flatten)]
        cloud: target::CloudArgs,
        #[command(flatten)]
        meta: meta_url::MetaArgs,
        /// Count from this day on (YYYY-MM-DD, UTC). Default: everything.
        #[arg(long, value_name = "YYYY-MM-DD")]
        since: Option<String>,
        /// The price table. `aws`: AWS S3 Standard in us-east-1, list prices
        /// ($0.023 per GB-month; PUT, COPY, POST, LIST $0.005 per 1,000;
        /// GET, HEAD $0.0004 per 1,000; DELETE free; transfer in free, out
        /// $0.09 per GB). `coral`: seed 004's table 1, Amazon column ($0.095
        /// per GB-month, $0.12 per GB down, $5e-6 a PUT/POST/LIST, $4e-7 a
        /// GET/HEAD). Or a TOML file with the fields `name` (optional),
        /// `storage_per_gb_month`, `transfer_up_per_gb`,
        /// `transfer_down_per_gb` and a table `[per_1000_requests]` with
        /// GET, HEAD, PUT, POST, LIST, DELETE (dollars per 1,000). GB =
        /// 2^30 bytes; a month = 730 hours.
        #[arg(long, default_value = "aws", value_name = "aws|coral|FILE")]
        prices: String,
        /// Print as JSON (usage, prices, items, subsystems, total).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        pass: PassArgs,
    },
    /// Free packs without live chunks and repack mostly-dead ones (the
    /// volume must not be mounted), or with --dry-run show what would be
    /// cleaned (mounted or not).
    ///
    /// A mount of a volume in a bucket cleans by itself, each pack at the
    /// moment its dead bytes have cost in storage what cleaning it costs
    /// (seed 004's theorem 1: the least total cost); `gc` cleans every pack
    /// below --repack-below now, whatever that costs.
    Gc {
        /// The volume (a directory, s3://BUCKET/PREFIX or a tape), or the
        /// mountpoint of a mounted one.
        #[arg(value_name = "VOLUME")]
        dir: String,
        #[command(flatten)]
        cloud: target::CloudArgs,
        #[command(flatten)]
        meta: meta_url::MetaArgs,
        /// Repack packs whose live share of bytes is below this fraction.
        #[arg(long, default_value_t = 0.5)]
        repack_below: f64,
        /// Change nothing: list the packs `gc` would clean; for a volume in
        /// a bucket also each pack's cost so far, cost of cleaning, and when
        /// the mount's cleaner will clean it.
        #[arg(long)]
        dry_run: bool,
        /// With --dry-run: the price table the cleaner's plan is shown at
        /// (as for `cairn cost`: aws, coral, local or a TOML file; default
        /// aws in a bucket, local in a directory).
        #[arg(long, value_name = "aws|coral|local|FILE")]
        prices: Option<String>,
        /// Metadata in PostgreSQL: a fixed number of seconds a chunk whose
        /// last reference went is left alone before gc may delete it.
        /// Default: until no flush round that began before it died (less
        /// 5 s) is under way on any machine, since such a round may have
        /// found it by hash and be about to reference it (one that finds it
        /// dead and loses it stores it again).
        #[arg(long, value_name = "SECONDS")]
        chunk_grace: Option<u64>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        pass: PassArgs,
    },
    /// Insert bytes into FILE at OFFSET, moving the rest of the file along
    /// (no rewrite: only the chunks at the edges are re-chunked).
    ///
    /// FILE must be inside a Cairn mount and writable by you. The bytes come
    /// from --from SRC (shared, not copied, when SRC is in the same mount)
    /// or standard input.
    Insert {
        file: PathBuf,
        #[arg(value_parser = size::parse)]
        offset: u64,
        /// Where the new bytes come from ('-' for standard input).
        #[arg(long, value_name = "SRC")]
        from: Option<PathBuf>,
    },
    /// Delete LEN bytes of FILE at OFFSET, moving the rest of the file back.
    Delete {
        file: PathBuf,
        #[arg(value_parser = size::parse)]
        offset: u64,
        #[arg(value_parser = size::parse)]
        len: u64,
    },
    /// Replace LEN bytes of FILE at OFFSET with new bytes of any length.
    Replace {
        file: PathBuf,
        #[arg(value_parser = size::parse)]
        offset: u64,
        #[arg(value_parser = size::parse)]
        len: u64,
        /// Where the new bytes come from ('-' for standard input).
        #[arg(long, value_name = "SRC")]
        from: Option<PathBuf>,
    },
    /// Copy a file or a whole tree inside a mounted volume without copying
    /// data: the copy shares the source's chunks until either is changed.
    ///
    /// Modes, owners, times, xattrs, symlinks and hard links inside the tree
    /// are kept. DST must not exist. (Plain `cp` of a file inside a Cairn
    /// mount is a clone too: it uses copy_file_range.)
    Clone { src: PathBuf, dst: PathBuf },
    /// Where a file's bytes are: its chunks (offset, length, chunk id,
    /// stored length, pack and offset), how many places reference each, and
    /// whether each is in the journal (not yet flushed), `local` (a pack in
    /// the volume's directory), `cache` (the local pack cache of a bucket or
    /// tape volume), or only in the `bucket` or on the `tape`.
    Info {
        /// A file (or directory: its entry count) inside a mount.
        path: PathBuf,
        /// Print as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Bring the data of files or whole trees close, before they are read.
    /// On a volume in a bucket or on tape this is `cairn tape recall`: their
    /// chunks' pack ranges are read into the local cache in one pass, in
    /// the order they lie on the medium (bounded by --cache-dir-size). On a
    /// volume in a local directory there is no cache: the ranges of its
    /// packs are read once so that the OS page cache holds them, until the
    /// kernel needs the memory. Bytes not yet flushed are in the journal,
    /// local already.
    Warmup {
        /// Files or directories inside one mounted volume.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Tar archives without copying data: inside a mount an archive is a new
    /// extent list over its members' chunks, and extracting is the reverse.
    Archive {
        #[command(subcommand)]
        op: ArchiveCmd,
    },
    /// Read-only point-in-time copies of a whole mounted volume, visible as
    /// MOUNTPOINT/.snapshots/NAME; they cost metadata only.
    Snapshot {
        #[command(subcommand)]
        op: SnapshotCmd,
    },
    /// Replay an access trace (`cairn mount --trace`) against cache
    /// policies, object layouts and cache sizes, and price each: hit ratio,
    /// GETs, PUTs, bytes down and up, and the bill (requests, transfer, and
    /// storage for the trace's duration).
    ///
    /// Layouts: `cairn` (the recorded placement; the cache fetches what a
    /// read misses, as the live cache: see --pack-block and --pack-ahead),
    /// `cairn-segment` (the recorded
    /// placement; a miss fetches each needed segment, the run of one file's
    /// chunks in one pack, adjacent ones in one GET), `bluesky` (writes
    /// appended to a log in request order, no dedup or compression, sealed
    /// into 4 MiB objects; a miss fetches the missing 32 KiB blocks of an
    /// object, one GET per run). Every layout caches what it writes. Cache
    /// sizes are percentages of each layout's data set (the distinct stored
    /// bytes the trace reads or writes), or with --cache-of of one size for
    /// every layout (the same cache in bytes). With --live, the live cache's own
    /// records are replayed instead: the hit ratio the mount had, or would
    /// have had with another policy or --capacity.
    Sim {
        /// The trace file.
        trace: PathBuf,
        /// Cache sizes, in percent of the data set.
        #[arg(long, default_value = "2,5,10,20", value_delimiter = ',')]
        cache_sizes: Vec<f64>,
        /// The cache sizes are percentages of SIZE, or of the data set of
        /// LAYOUT (`bluesky`: the distinct bytes the trace reads or writes,
        /// as written), for every layout: each gets the same cache in bytes.
        /// Without it, of each layout's own data set.
        #[arg(long, value_name = "SIZE|LAYOUT")]
        cache_of: Option<String>,
        /// Eviction policies: lru, kd (Coral's kd-tree), and kd on one
        /// metric alone: ti (file recency), tb (block recency), h (hotness).
        #[arg(long, default_value = "lru,kd,ti,tb,h", value_delimiter = ',')]
        policies: Vec<String>,
        /// Layouts: cairn, cairn-segment, bluesky.
        #[arg(long, default_value = "cairn,cairn-segment,bluesky", value_delimiter = ',')]
        layouts: Vec<String>,
        /// The price table (as for `cairn cost`: aws, coral or a TOML file).
        #[arg(long, default_value = "aws", value_name = "aws|coral|FILE")]
        prices: String,
        /// Replay the live cache's own records (a volume in a bucket).
        #[arg(long)]
        live: bool,
        /// With --live: the cache's size (default: the live cache's).
        /// Without: each layout is also simulated with a cache of exactly
        /// this size (e.g. the live cache's, to set the simulated bill of
        /// Cairn's layout beside the live one), in rows marked
        /// `at_capacity`.
        #[arg(long, value_parser = size::parse)]
        capacity: Option<u64>,
        /// The `cairn` layout's fetch alignment, as a mount's `--cache-block`:
        /// 0 (the live cache's default) fetches exactly what a read misses;
        /// SIZE rounds each miss out to aligned blocks of SIZE.
        #[arg(long, default_value = "0", value_parser = size::parse)]
        pack_block: u64,
        /// The `cairn` layout's read-ahead within a pack, as a mount's
        /// `--cache-ahead`: a miss starting where the pack's last GET ended
        /// fetches this much more (0: none).
        #[arg(long, default_value = "256K", value_parser = size::parse)]
        pack_ahead: u64,
        /// The order of files within each flush round's packs (the cairn
        /// layouts): `recorded` (as the flusher wrote them), `kd` (by each
        /// file's last read before the round, Coral's t_i), `next-read` (by
        /// each file's first read after the round: an oracle, the most any
        /// order can give).
        #[arg(long, default_value = "recorded", value_name = "recorded|kd|next-read")]
        pack_order: String,
        /// Open packs (the cairn layouts): each round's chunks are appended
        /// to the pack still open in the outbox, sealed and uploaded once
        /// it holds SIZE (e.g. the volume's pack size), or at the first
        /// round --open-pack-age or more after it opened, or at the trace's
        /// end. 0: every round seals its own packs, as recorded.
        #[arg(long, default_value = "0", value_parser = size::parse, value_name = "SIZE")]
        open_packs: u64,
        /// With --open-packs: the most seconds a pack stays open (a mount
        /// ships metadata every --meta-interval, 5 s by default, and a
        /// version may not name a pack the bucket does not hold).
        #[arg(long, default_value = "5", value_name = "SECS")]
        open_pack_age: f64,
        /// Print as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Metadata versions of a volume in a bucket: list them, or roll the
    /// volume back to one (the volume must not be mounted).
    Meta {
        #[command(subcommand)]
        op: MetaCmd,
    },
    /// Tapes: rebuild a lost catalog, show what a tape holds, stream raw
    /// blocks (docs/tape.md). A volume on a tape is created and mounted as
    /// any other: `cairn init tape-emu:DIR`, `cairn mount tape:/dev/nst0 MNT`.
    Tape {
        #[command(subcommand)]
        op: tape::TapeCmd,
    },
    /// Write man pages or shell completions generated from these
    /// definitions (for packaging).
    #[command(hide = true)]
    Generate {
        #[command(subcommand)]
        what: generate::What,
    },
}

#[derive(Subcommand)]
enum MetaCmd {
    /// List the metadata versions kept in the bucket, oldest first.
    List {
        /// s3://BUCKET/PREFIX
        volume: String,
        #[command(flatten)]
        cloud: target::CloudArgs,
        /// Print as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Make the state of VERSION the volume's latest state, as a new version
    /// (nothing is deleted: restoring is itself undone the same way).
    Restore {
        /// s3://BUCKET/PREFIX
        volume: String,
        /// The version to go back to (`cairn meta list` shows them).
        #[arg(value_name = "VERSION")]
        target: u64,
        #[command(flatten)]
        cloud: target::CloudArgs,
        #[command(flatten)]
        pass: PassArgs,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum DurabilityArg {
    Local,
    Remote,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum CachePolicyArg {
    Lru,
    Kd,
}

#[derive(Subcommand)]
enum ArchiveCmd {
    /// Build ARCHIVE (a pax tar GNU tar and bsdtar read) from PATHs inside
    /// the same mount, writing only the headers.
    Create {
        archive: PathBuf,
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Resolve PATHs from this directory (member names are relative to it).
        #[arg(short = 'C', long = "directory", value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Pad headers so every member's data starts at a multiple of this
        /// (a power of two >= 512, e.g. 4096); the padding is a pax comment
        /// that tar readers skip.
        #[arg(long, value_parser = size::parse)]
        align: Option<u64>,
        /// Move the PATHs into the archive (they are removed), like AvaTar's merge.
        #[arg(long = "move")]
        remove: bool,
    },
    /// Extract ARCHIVE (a tar inside the mount, from any tar writer) into
    /// directory DEST (made if missing) without copying data. Refuses,
    /// changing nothing, if a member escapes DEST or DEST already holds one
    /// of its names.
    Extract {
        archive: PathBuf,
        dest: PathBuf,
        /// Remove the archive afterwards (AvaTar's split).
        #[arg(long)]
        consume: bool,
    },
    /// Bring a tar from outside into the volume: its data is stored once
    /// (chunked, deduplicated) and extracted into DEST zero-copy.
    Import { file: PathBuf, dest: PathBuf },
    /// Show any tar file (in a Cairn volume or not) as a read-only tree at
    /// MOUNTPOINT without extracting it. The index of its members is kept in
    /// ~/.cache/cairn/tar-index (or $XDG_CACHE_HOME), so mounting it again
    /// is instant. Unmount with `cairn umount MOUNTPOINT`.
    Mount {
        file: PathBuf,
        mountpoint: PathBuf,
        /// Stay in the foreground.
        #[arg(short, long)]
        foreground: bool,
        /// Let only the mounting user in (default: everyone, with kernel
        /// permission checks).
        #[arg(long)]
        private: bool,
        /// Where a background mount logs (default: nowhere).
        #[arg(long, value_name = "FILE")]
        log_file: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum SnapshotCmd {
    /// Take a snapshot named NAME.
    Create {
        name: String,
        /// Any path inside the mount (default: the current directory).
        #[arg(long, short = 'm', default_value = ".")]
        mount: PathBuf,
    },
    /// List snapshots with their creation times.
    List {
        #[arg(long, short = 'm', default_value = ".")]
        mount: PathBuf,
        /// Print as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete snapshot NAME (its space returns at the next `cairn gc`).
    Delete {
        name: String,
        #[arg(long, short = 'm', default_value = ".")]
        mount: PathBuf,
    },
}

fn main() {
    // mount(8) and umount(8) run /sbin/mount.fuse.cairn and
    // /sbin/umount.fuse.cairn: links to this binary.
    let argv0 = std::env::args_os().next().unwrap_or_default();
    if let Some(code) = mount_helper::main_as(Path::new(&argv0)) {
        std::process::exit(code);
    }
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cairn: {e:#}");
            1
        }
    };
    std::process::exit(code);
}

fn init_logging(verbose: u8, file: Option<&Path>) -> Result<()> {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "warn,cairn_engine=info,cairn_fuse=info",
        1 => "info,cairn_engine=debug,cairn_fuse=debug",
        _ => "debug",
    };
    let filter = EnvFilter::try_from_env("RUST_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let b = tracing_subscriber::fmt().with_env_filter(filter);
    match file {
        Some(p) => {
            // The log names files and volumes: private, like the volume directory.
            let f = std::os::unix::fs::OpenOptionsExt::mode(std::fs::OpenOptions::new().create(true).append(true), 0o600).open(p).with_context(|| format!("opening log file {}", p.display()))?;
            b.with_ansi(false).with_writer(std::sync::Mutex::new(f)).init();
        }
        // Colour codes only for a terminal: a log redirected to a file
        // stays plain text.
        None => {
            use std::io::IsTerminal;
            b.with_ansi(std::io::stderr().is_terminal()).with_writer(std::io::stderr).init()
        }
    }
    Ok(())
}

/// The chunk cache of a mount: 1/16 of physical memory, within [256 MiB, 1 GiB].
fn default_cache_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    let ram = (pages.max(0) as u64).saturating_mul(page.max(0) as u64);
    (ram / 16).clamp(256 << 20, 1 << 30)
}

fn open_volume(dir: &Path, pass: &PassArgs, meta: &meta_url::MetaArgs, read_only: bool, cache: Option<u64>) -> Result<Arc<Volume>> {
    let (_, _, _, cfg) = cairn_engine::read_config(dir)?;
    let meta_url = meta.for_volume(&cfg)?;
    let passphrase = if cfg.needs_passphrase() { Some(passphrase::get(pass.passphrase_file.as_deref(), false)?) } else { None };
    let mut opts = OpenOptions { passphrase, read_only, meta_url, ..Default::default() };
    if let Some(c) = cache {
        opts.cache_bytes = c as usize;
    }
    Ok(Volume::load(dir, opts)?)
}

/// Opens the volume exclusively (its open options adjusted by `adjust`),
/// runs a maintenance task with progress bars (none for JSON output), and
/// closes the volume cleanly.
fn maintain<T>(
    dir: &Path,
    pass: &PassArgs,
    meta: &meta_url::MetaArgs,
    json: bool,
    adjust: impl FnOnce(&mut OpenOptions),
    task: impl FnOnce(&Volume, &progress::Bars) -> cairn_engine::Result<T>,
) -> Result<T> {
    let (_, _, _, cfg) = cairn_engine::read_config(dir)?;
    let meta_url = meta.for_volume(&cfg)?;
    let passphrase = if cfg.needs_passphrase() { Some(passphrase::get(pass.passphrase_file.as_deref(), false)?) } else { None };
    let mut opts = OpenOptions { passphrase, meta_url, ..Default::default() };
    adjust(&mut opts);
    let vol = Volume::load(dir, opts)?;
    let bars = progress::Bars::new(!json);
    let r = task(&vol, &bars);
    bars.finish();
    vol.close()?;
    Ok(r?)
}

fn run(cli: Cli) -> Result<i32> {
    match cli.cmd {
        Cmd::Init { dir: volume, cloud, meta, encrypt, pass, chunk_min, chunk_avg, chunk_max, pack_size, zstd_level, dedup_domain } => {
            let dir = target::local_dir(&volume, &cloud)?;
            let meta_url = meta.for_init()?;
            let pack_size = pack_size.unwrap_or(if cairn_engine::tape::is_tape_url(&volume) {
                64 << 20
            } else if target::is_url(&volume) {
                16 << 20
            } else {
                32 << 20
            });
            init_logging(cli.verbose, None)?;
            let chunker = ChunkerParams {
                min: u32::try_from(chunk_min).context("--chunk-min too large")?,
                avg: u32::try_from(chunk_avg).context("--chunk-avg too large")?,
                max: u32::try_from(chunk_max).context("--chunk-max too large")?,
                ..Default::default()
            };
            if pack_size < 1 << 20 {
                bail!("--pack-size must be at least 1M");
            }
            let passphrase = if encrypt { Some(passphrase::get(pass.passphrase_file.as_deref(), true)?) } else { None };
            let io = InitOptions { chunker, passphrase, kdf: None, zstd_level: Some(zstd_level), pack_target: Some(pack_size), backend: None, meta_url: meta_url.clone(), dedup_domain };
            let cfg = if target::is_url(&volume) {
                let volume = target::canonical(&volume)?;
                // A blank tape is formatted (an emulated one created) and
                // held while the volume is created on it.
                let _tape = if cairn_engine::tape::is_tape_url(&volume) { Some(cairn_engine::tape::create(&volume, None)?) } else { None };
                cairn_engine::init_cloud(&dir, &volume, cloud.endpoint.as_deref(), cloud.region.as_deref(), &io)?
            } else {
                cairn_engine::init(&dir, &io)?
            };
            let place = if target::is_url(&volume) { format!("{volume} (local directory {})", dir.display()) } else { dir.display().to_string() };
            println!(
                "created volume {} in {} ({}, chunks {}/{}/{} bytes{})",
                cfg.volume_id,
                place,
                if encrypt { "encrypted with AES-256-GCM" } else { "not encrypted" },
                chunker.min,
                chunker.avg,
                chunker.max,
                if meta_url.is_some() { format!(", metadata in PostgreSQL schema cairn_{}: mount and maintain it with --meta URL or CAIRN_META", cfg.volume_id) } else { String::new() }
            );
            Ok(0)
        }
        Cmd::Mount { dir: volume, mountpoint, cloud, meta, cache_dir_size, cache_block, cache_ahead, durability, cache_policy, meta_interval, force, lease_renew, session_ttl, meta_timeout, meta_sync_commit, gc_interval, gc_dead_ratio, gc_dead_floor, chunk_grace, gc_prices, tape_memory, mirror, no_mirror, foreground, read_only, threads, cache_size, log_file, private, no_writeback_cache, fsync_on_close, fuse_uring, no_io_workers, metrics, trace, pass } => {
            if tape_memory < cairn_tape::store::MIN_MEMORY {
                bail!("--tape-memory of {tape_memory} bytes is too small: a tape needs at least 16M (two packs being built and two queued)");
            }
            cairn_engine::tape::configure(cairn_engine::tape::TapeOptions { store: cairn_tape::store::StoreOptions { prepare_append: !read_only, prepare_read: read_only, ..cairn_tape::store::StoreOptions::for_memory(tape_memory) }, ..Default::default() });
            use cairn_engine::mirror::MirrorChoice;
            let mirror = match (mirror, no_mirror) {
                (Some(d), _) => MirrorChoice::Use(d),
                (None, true) => MirrorChoice::Off,
                (None, false) => MirrorChoice::Remembered,
            };
            if mirror != MirrorChoice::Remembered && !cairn_engine::tape::is_tape_url(&volume) {
                bail!("--mirror and --no-mirror are for volumes on a tape (tape:/dev/nstN or tape-emu:DIR); {volume} is not one");
            }
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
            if cache_block != 0 && !(4 << 10..=64 << 20).contains(&cache_block) {
                bail!("--cache-block must be 0 (exact) or between 4K and 64M");
            }
            if cache_ahead > 64 << 20 {
                bail!("--cache-ahead must be at most 64M");
            }
            let cloud_opts = cairn_engine::cloud::CloudOptions {
                cache_bytes: cache_dir_size,
                cache_block,
                cache_ahead,
                durability: match durability {
                    DurabilityArg::Local => cairn_engine::cache::disk::Durability::Local,
                    DurabilityArg::Remote => cairn_engine::cache::disk::Durability::Remote,
                },
                cache_policy: match cache_policy {
                    CachePolicyArg::Lru => cairn_engine::cache::PolicyChoice::Lru,
                    CachePolicyArg::Kd => cairn_engine::cache::PolicyChoice::Kd,
                },
                meta_interval: std::time::Duration::from_secs(meta_interval.max(1)),
                force,
                lease_renew: std::time::Duration::from_secs(lease_renew),
                session_ttl: std::time::Duration::from_secs(session_ttl),
                gc_interval: (gc_interval > 0).then(|| std::time::Duration::from_secs(gc_interval)),
                gc_prices: gc_prices.as_deref().map(cairn_engine::cost::Prices::load).transpose()?,
                gc_bound: cairn_engine::cleaner::DeadBound { ratio: gc_dead_ratio, floor: gc_dead_floor },
                ..Default::default()
            };
            let opts = OpenOptions { passphrase, read_only, cache_bytes: cache_size.unwrap_or_else(default_cache_size) as usize, cloud: cloud_opts, trace, meta_url, meta_timeout: Some(std::time::Duration::from_secs(meta_timeout)), meta_sync_commit, chunk_grace: chunk_grace.map(std::time::Duration::from_secs), ..Default::default() };
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
                init_logging(cli.verbose, log_file.as_deref())?;
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
                    init_logging(cli.verbose, Some(&log))?;
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
        Cmd::Status { json } => {
            init_logging(cli.verbose, None)?;
            status::run(json)
        }
        Cmd::Top { mountpoint, interval, count, once } => {
            init_logging(cli.verbose, None)?;
            if !(interval > 0.0 && interval.is_finite()) {
                bail!("--interval must be a positive number of seconds");
            }
            let mountpoint = resolve::mountpoint_of(&mountpoint);
            let sock = metrics::socket_of(&mountpoint)?;
            metrics::top(&sock, &mountpoint.display().to_string(), std::time::Duration::from_secs_f64(interval), if once { Some(1) } else { count })
        }
        Cmd::Umount { mountpoint, timeout } => {
            init_logging(cli.verbose, None)?;
            let mountpoint = resolve::mountpoint_of(&mountpoint);
            daemon::unmount_and_wait(&mountpoint, std::time::Duration::from_secs(timeout))?;
            Ok(0)
        }
        Cmd::Fsck { dir, cloud, meta, read_data, salvage_journal, json, pass } => {
            init_logging(cli.verbose, None)?;
            meta.check()?;
            let dir = VolumeDir::unmounted(&dir, &cloud, "fsck")?.path;
            // A damaged journal stops an open that replays it: report it,
            // and check what is committed through a read-only open (or
            // salvage the journal when asked to).
            let damage = cairn_engine::journal::check_dir(&dir.join("journal"))?;
            // Bytes a segment ends with past its last record that verifies:
            // a torn write is a warning, a whole record that fails (damage
            // to what may have been fsync'd) an error. Read before the open
            // below replays (and may then delete) the segments.
            let tails = cairn_engine::journal::check_tails(&dir.join("journal"))?;
            let mut rep = if damage.is_empty() || salvage_journal {
                maintain(&dir, &pass, &meta, json, |o| o.salvage_journal = salvage_journal, |vol, bars| maintenance::fsck(vol, read_data, bars))?
            } else {
                let vol = open_volume(&dir, &pass, &meta, true, None)?;
                let bars = progress::Bars::new(!json);
                let r = maintenance::fsck(&vol, read_data, &bars);
                bars.finish();
                vol.close()?;
                r?
            };
            for (i, d) in damage.into_iter().enumerate() {
                rep.errors.insert(
                    i,
                    if salvage_journal {
                        format!("{d}; salvaged: every record that verifies was replayed, the damaged ones are lost, a copy of the segment is in journal-damaged/")
                    } else {
                        format!("{d}; the volume will not mount until `cairn fsck --salvage-journal` replays every record that verifies")
                    },
                );
            }
            for (line, damaged) in tails {
                if damaged {
                    rep.errors.push(line);
                } else {
                    rep.warnings.push(line);
                }
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&rep)?);
            } else {
                for w in &rep.warnings {
                    println!("warning: {w}");
                }
                for e in &rep.errors {
                    println!("error: {e}");
                }
                if rep.packs_in_trash > 0 {
                    println!("{} packs no metadata names wait in the trash for their grace period (gc put them there)", rep.packs_in_trash);
                }
                if rep.packs_uploading > 0 {
                    println!("{} packs are being uploaded by a flush not yet committed (or by a gone session, reclaimed by gc after the grace)", rep.packs_uploading);
                }
                println!(
                    "checked {} inodes, {} chunks, {} packs{}: {} errors, {} warnings",
                    rep.inodes,
                    rep.chunks,
                    rep.packs,
                    if read_data { format!(", read {} blobs", rep.blobs_read) } else { String::new() },
                    rep.errors.len(),
                    rep.warnings.len()
                );
            }
            Ok(if rep.errors.is_empty() { 0 } else { 1 })
        }
        Cmd::Stats { dir, cloud, meta, json, watch, pass } => {
            init_logging(cli.verbose, None)?;
            meta.check()?;
            // A file or directory inside a mount (not its mountpoint): that tree.
            if let Some(p) = inspect::tree_path(&dir) {
                return inspect::tree_stats(&p, json);
            }
            let vd = VolumeDir::query(&dir, &cloud)?;
            let dir = vd.path.clone();
            if watch {
                let sock = cairn_engine::control::socket_path(&dir);
                return metrics::top(&sock, &dir.display().to_string(), std::time::Duration::from_secs(1), None);
            }
            // A mounted volume answers through its control socket.
            let sock = cairn_engine::control::socket_path(&dir);
            let s: maintenance::Stats = match cairn_engine::control::call(&sock, &cairn_engine::control::Request::Stats)? {
                Some(v) => serde_json::from_value(v).context("reading stats from the mount")?,
                None => maintenance::stats(&*open_volume(&dir, &pass, &meta, true, None)?)?,
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                let h = size::human;
                println!("files              {:>14}   directories {}   symlinks {}", s.files, s.directories, s.symlinks);
                println!("logical size       {:>14}   ({} in holes)", h(s.logical_bytes), h(s.logical_bytes - s.data_bytes.min(s.logical_bytes)));
                println!("unique data        {:>14}   in {} chunks", h(s.unique_bytes), s.chunks);
                println!("stored             {:>14}   in {} packs ({} dead in {} unreferenced chunks)", h(s.stored_bytes), s.packs, h(s.dead_bytes), s.dead_chunks);
                match s.dead_bound {
                    Some(b) => {
                        let pct = if b == 0 { 0.0 } else { 100.0 * s.dead_bytes as f64 / b as f64 };
                        println!("dead bound         {:>14}   ({pct:.0}% used; the cleaner keeps dead bytes under it; {} small packs, merged from {})", h(b), s.small_packs, cairn_engine::cleaner::SMALL_PACKS);
                    }
                    None => println!("dead bound         {:>14}   (no cleaner on this volume: `cairn gc` frees dead bytes)", "none"),
                }
                println!("dedup ratio        {:>14.2}x", s.dedup_ratio);
                println!("compression ratio  {:>14.2}x", s.compression_ratio);
                println!("overall            {:>14.2}x", s.overall_ratio);
                if let Some(c) = &s.cache {
                    let lookups = c.hits + c.misses;
                    let ratio = if lookups == 0 { 0.0 } else { 100.0 * c.hits as f64 / lookups as f64 };
                    println!("cache hits         {:>13.1}%   ({} hits, {} misses)", ratio, c.hits, c.misses);
                    println!("fetched            {:>14}   in {} requests", h(c.bytes_fetched), c.remote_gets);
                    println!("cached             {:>14}   clean, {} evictions", h(c.clean_bytes), c.evictions);
                    if !c.policy.is_empty() {
                        println!("cache policy       {:>14}", c.policy);
                    }
                    println!("not yet uploaded   {:>14}   in {} packs", h(c.dirty_bytes), c.dirty_objects);
                }
                if let Some(m) = &s.medium {
                    let total = m.live_bytes + m.dead_bytes;
                    let pct = if total == 0 { 0.0 } else { 100.0 * m.dead_bytes as f64 / total as f64 };
                    println!("on the tape        {:>14}   live objects, {} dead ({pct:.1}%: deleted or replaced; `cairn tape reclaim` copies the live data to a new tape)", h(m.live_bytes), h(m.dead_bytes));
                    if let Some(f) = m.free_bytes {
                        println!("room left          {:>14}", h(f));
                    }
                }
            }
            Ok(0)
        }
        Cmd::Cost { dir, cloud, meta, since, prices, json, pass } => {
            init_logging(cli.verbose, None)?;
            meta.check()?;
            use cairn_engine::cost;
            // A bad price table or date fails before anything is opened.
            let prices = cost::Prices::load(&prices)?;
            let since_day = since.as_deref().map(cost::parse_day).transpose()?;
            let vd = VolumeDir::query(&dir, &cloud)?;
            let dir = vd.path.clone();
            let sock = cairn_engine::control::socket_path(&dir);
            let rows: Vec<cairn_engine::meta::BillRow> = match cairn_engine::control::call(&sock, &cairn_engine::control::Request::Cost { since_day })? {
                Some(v) => serde_json::from_value(v).context("reading the bill from the mount")?,
                None => {
                    let vol = open_volume(&dir, &pass, &meta, true, None)?;
                    let rows = vol.bill_usage(since_day, false);
                    vol.close()?;
                    rows?
                }
            };
            let bill = cost::price(&rows, &prices, since_day);
            if json {
                println!("{}", serde_json::to_string_pretty(&bill)?);
            } else {
                print_bill(&bill);
            }
            Ok(0)
        }
        Cmd::Insert { file, offset, from } => {
            init_logging(cli.verbose, None)?;
            edit::replace(&file, offset, 0, Some(edit::Source::from_arg(from)?))?;
            Ok(0)
        }
        Cmd::Delete { file, offset, len } => {
            init_logging(cli.verbose, None)?;
            edit::replace(&file, offset, len, None)?;
            Ok(0)
        }
        Cmd::Replace { file, offset, len, from } => {
            init_logging(cli.verbose, None)?;
            edit::replace(&file, offset, len, Some(edit::Source::from_arg(from)?))?;
            Ok(0)
        }
        Cmd::Clone { src, dst } => {
            init_logging(cli.verbose, None)?;
            edit::clone(&src, &dst)?;
            Ok(0)
        }
        Cmd::Info { path, json } => {
            init_logging(cli.verbose, None)?;
            inspect::info(&path, json)
        }
        Cmd::Warmup { paths, json } => {
            init_logging(cli.verbose, None)?;
            inspect::warmup(&paths, json, "warmup")
        }
        Cmd::Archive { op } => {
            if !matches!(op, ArchiveCmd::Mount { foreground: false, .. }) {
                init_logging(cli.verbose, None)?;
            }
            match op {
                ArchiveCmd::Create { archive, paths, dir, align, remove } => archive::create(&archive, &paths, dir.as_deref(), align, remove)?,
                ArchiveCmd::Extract { archive, dest, consume } => archive::extract(&archive, &dest, consume)?,
                ArchiveCmd::Import { file, dest } => archive::import(&file, &dest)?,
                ArchiveCmd::Mount { file, mountpoint, foreground, private, log_file } => {
                    check_fuse_access(private)?;
                    warn_if_not_empty(&mountpoint);
                    let opts = cairn_tarfs::TarMountOptions { allow_other: !private, ..Default::default() };
                    let say = |info: &cairn_tarfs::MountInfo| {
                        let how = match &info.index.rebuilt {
                            Some(why) => format!("indexed {} members in {:.2?} ({why})", info.index.members, info.index.elapsed),
                            None => format!("{} members from the saved index", info.index.members),
                        };
                        tracing::info!("mounted {} at {}: {how}", file.display(), mountpoint.display());
                        how
                    };
                    if foreground {
                        cairn_tarfs::mount_archive(&file, &mountpoint, &opts, |info| eprintln!("cairn: {}", say(info)))?;
                    } else {
                        return daemon::run_in_background(|ready| {
                            if let Some(l) = &log_file {
                                init_logging(cli.verbose, Some(l))?;
                            }
                            cairn_tarfs::mount_archive(&file, &mountpoint, &opts, |info| {
                                say(info);
                                ready();
                            })?;
                            Ok(())
                        });
                    }
                }
            }
            Ok(0)
        }
        Cmd::Snapshot { op } => {
            init_logging(cli.verbose, None)?;
            match op {
                SnapshotCmd::Create { name, mount } => edit::snapshot_create(&mount, &name)?,
                SnapshotCmd::List { mount, json } => edit::snapshot_list(&mount, json)?,
                SnapshotCmd::Delete { name, mount } => edit::snapshot_delete(&mount, &name)?,
            }
            Ok(0)
        }
        Cmd::Gc { dir, cloud, meta, repack_below, dry_run, prices, chunk_grace, json, pass } => {
            init_logging(cli.verbose, None)?;
            meta.check()?;
            let volume_arg = dir.clone();
            if !(0.0..=1.0).contains(&repack_below) {
                bail!("--repack-below must be between 0 and 1");
            }
            if dry_run {
                let vd = VolumeDir::query(&dir, &cloud)?;
                let in_bucket = vd.mount.as_ref().map_or(target::is_url(&volume_arg), |m| target::is_url(&m.volume));
                let prices = match prices.as_deref() {
                    Some(p) => cairn_engine::cost::Prices::load(p)?,
                    None if in_bucket => cairn_engine::cost::Prices::aws(),
                    None => cairn_engine::cost::Prices::local_disk(),
                };
                return gc_dry_run(&vd.path, repack_below, &prices, json, &pass, &meta);
            }
            let vd = VolumeDir::unmounted(&dir, &cloud, "gc")?;
            let dir = vd.path;
            let grace = chunk_grace.map(std::time::Duration::from_secs);
            let rep = maintain(&dir, &pass, &meta, json, |o| o.chunk_grace = grace, |vol, bars| maintenance::gc(vol, repack_below, bars))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rep)?);
            } else {
                if rep.packs_settling > 0 {
                    println!("{} packs left for a later gc: a chunk of theirs lost its last reference less than the chunk grace ago (--chunk-grace)", rep.packs_settling);
                }
                if rep.packs_kept > 0 {
                    println!("{} packs kept: another writer referenced their dead chunks again while gc ran (the next gc takes them)", rep.packs_kept);
                }
                if target::is_url(&volume_arg) {
                    // In a bucket a dropped pack goes to the trash first: an
                    // older metadata version may still name it.
                    println!(
                        "{} packs ({} repacked) and {} orphan packs put in the trash, {} dead chunks dropped; the bucket's packs take {} (were {}) until the trash is emptied",
                        rep.packs_deleted,
                        rep.packs_repacked,
                        rep.orphans_deleted,
                        rep.chunks_deleted,
                        size::human(rep.bytes_after),
                        size::human(rep.bytes_before)
                    );
                    println!("(trashed packs are deleted from the bucket once no kept metadata version names them, after a few more metadata bases; with the metadata in PostgreSQL, by a mount an hour after gc trashed them)");
                    return Ok(0);
                }
                println!(
                    "deleted {} packs ({} repacked), {} orphan packs, {} dead chunks; backend {} -> {}",
                    rep.packs_deleted,
                    rep.packs_repacked,
                    rep.orphans_deleted,
                    rep.chunks_deleted,
                    size::human(rep.bytes_before),
                    size::human(rep.bytes_after)
                );
            }
            Ok(0)
        }
        Cmd::Sim { trace, cache_sizes, cache_of, policies, layouts, prices, live, capacity, pack_block, pack_ahead, pack_order, open_packs, open_pack_age, json } => {
            init_logging(cli.verbose, None)?;
            sim::run(sim::Args { trace: &trace, cache_sizes, cache_of, policies, layouts, prices: &prices, live, capacity, pack_block, pack_ahead, pack_order: &pack_order, open_packs, open_pack_age, json })
        }
        Cmd::Meta { op } => {
            init_logging(cli.verbose, None)?;
            meta_command(op)
        }
        Cmd::Tape { op } => {
            init_logging(cli.verbose, None)?;
            tape::run(op)
        }
        Cmd::Generate { what } => generate::run(<Cli as clap::CommandFactory>::command(), what),
    }
}

/// The local directory of the volume a command was given (a volume or the
/// mountpoint of one; see resolve.rs), with the mount that has it, if any.
struct VolumeDir {
    path: PathBuf,
    mount: Option<runtime::Entry>,
    /// A read-only query of a volume in a bucket that this machine has no
    /// local directory for works in a temporary one, removed afterwards, so
    /// that asking leaves nothing behind (a later `cairn init` of the same
    /// bucket and prefix would refuse a directory it left).
    _scratch: Option<tempfile::TempDir>,
}

impl VolumeDir {
    fn resolve(arg: &str, cloud: &target::CloudArgs, query: bool) -> Result<VolumeDir> {
        let v = match resolve::VolumeArg::of(arg) {
            resolve::VolumeArg::Mountpoint(e) => {
                if cloud.cache_dir.is_some() || cloud.endpoint.is_some() || cloud.region.is_some() {
                    bail!("{arg} is where {} is mounted; --cache-dir, --endpoint and --region name a volume in a bucket, not a mount", e.volume);
                }
                return Ok(VolumeDir { path: e.local_dir.clone(), mount: Some(e), _scratch: None });
            }
            resolve::VolumeArg::Volume(v) => v,
        };
        let local = target::local_dir(&v, cloud)?;
        let mount = resolve::mount_of(&v, Some(&local));
        if let (Some(m), None) = (&mount, &cloud.cache_dir) {
            // The mount's own directory, whatever the default would be.
            return Ok(VolumeDir { path: m.local_dir.clone(), mount, _scratch: None });
        }
        if query && target::is_url(&v) && cloud.cache_dir.is_none() && !local.exists() && cairn_engine::cloud::is_remote_url(&v) && !cairn_engine::tape::is_tape_url(&v) {
            let scratch = tempfile::Builder::new().prefix("cairn-query.").tempdir().context("creating a temporary local directory")?;
            let path = scratch.path().join("volume");
            let c = target::CloudArgs { cache_dir: Some(path.clone()), ..cloud.clone() };
            target::open_dir(&v, &c)?;
            return Ok(VolumeDir { path, mount, _scratch: Some(scratch) });
        }
        Ok(VolumeDir { path: target::open_dir(&v, cloud)?, mount, _scratch: None })
    }

    /// For a command that reads (a mounted volume answers through its mount).
    fn query(arg: &str, cloud: &target::CloudArgs) -> Result<VolumeDir> {
        Self::resolve(arg, cloud, true)
    }

    /// For a command that needs the volume to itself (`what` names it).
    fn unmounted(arg: &str, cloud: &target::CloudArgs, what: &str) -> Result<VolumeDir> {
        let mut v = Self::resolve(arg, cloud, false)?;
        // A volume many machines mount (its metadata in PostgreSQL): a mount
        // from another local directory is another machine's, and this
        // directory is free.
        let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        if v.mount.as_ref().is_some_and(|m| canon(&m.local_dir) != canon(&v.path))
            && cairn_engine::read_config(&v.path).is_ok_and(|(_, _, _, c)| c.meta == cairn_engine::config::MetaKind::Postgres)
        {
            v.mount = None;
        }
        if let Some(m) = &v.mount {
            bail!("{} is in use: it is mounted at {} (daemon pid {}), and `cairn {what}` needs it unmounted; run `cairn umount {}` first", m.volume, m.mountpoint.display(), m.pid, m.mountpoint.display());
        }
        Ok(v)
    }
}

/// Whether this user can make the FUSE mount asked for, checked before
/// anything is opened so that the error says what to do.
fn check_fuse_access(private: bool) -> Result<()> {
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
fn warn_if_not_empty(mountpoint: &Path) {
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

/// `cairn meta list|restore`.
fn meta_command(op: MetaCmd) -> Result<i32> {
    use cairn_engine::cloud::{self, versions};
    match op {
        MetaCmd::List { volume, cloud: c, json } => {
            let vd = VolumeDir::query(&volume, &c)?;
            let dir = vd.path.clone();
            let (_, settings, _, _) = cairn_engine::read_config(&dir)?;
            let remote = cloud::open_remote(&settings)?;
            let all = versions::list(remote.as_ref())?;
            let heads = versions::headers(remote.as_ref(), &all)?;
            save_requests(&dir, remote.as_ref());
            let latest = versions::chain(&all, None).ok().and_then(|c| c.last().map(|v| v.version));
            if json {
                let rows: Vec<serde_json::Value> = all
                    .iter()
                    .zip(&heads)
                    .map(|(v, h)| serde_json::json!({"version": v.version, "kind": v.kind, "bytes": v.size, "time": h.time, "writer": hex_of(&h.writer), "latest": Some(v.version) == latest}))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                println!("{:>8}  {:<5}  {:<23}  {:>10}  writer", "version", "kind", "written", "size");
                for (v, h) in all.iter().zip(&heads) {
                    let mark = if Some(v.version) == latest { "  (latest)" } else { "" };
                    let kind = match v.kind {
                        versions::Kind::Base => "base",
                        versions::Kind::Delta => "delta",
                    };
                    let who = if h.writer == [0u8; 8] { "restore".to_string() } else { hex_of(&h.writer) };
                    println!("{:>8}  {:<5}  {:<23}  {:>10}  {who}{mark}", v.version, kind, cloud::lease::show_time(h.time), size::human(v.size));
                }
            }
            Ok(0)
        }
        MetaCmd::Restore { volume, target: version, cloud: c, pass } => {
            let dir = target::open_dir(&volume, &c)?;
            let (_, settings, _, cfg) = cairn_engine::read_config(&dir)?;
            let passphrase = if cfg.needs_passphrase() { Some(passphrase::get(pass.passphrase_file.as_deref(), false)?) } else { None };
            let keys = cfg.keys(passphrase.as_ref().map(|p| &p[..]))?;
            let remote = cloud::open_remote(&settings)?;
            let v = cloud::restore(remote.as_ref(), &keys, &volume, version);
            save_requests(&dir, remote.as_ref());
            let v = v?;
            println!("restored version {version} of {volume} as version {v}; mount it to use it");
            Ok(0)
        }
    }
}

/// Counts the requests of a command that does not open the volume into its
/// bill (`cairn cost` shows them).
fn save_requests(dir: &Path, remote: &dyn cairn_backend::Backend) {
    if let Err(e) = cairn_engine::cost::save_unsaved(dir, remote) {
        tracing::warn!("counting this command's requests into the bill: {e}");
    }
}

/// `cairn cost` for a terminal.
/// `cairn gc --dry-run`: what `gc` would clean and, in a bucket, the
/// cleaner's plan (from the mount if there is one, else read-only).
fn gc_dry_run(dir: &Path, repack_below: f64, prices: &cairn_engine::cost::Prices, json: bool, pass: &PassArgs, meta: &meta_url::MetaArgs) -> Result<i32> {
    use cairn_engine::cleaner::PackCost;
    let sock = cairn_engine::control::socket_path(dir);
    let mounted = cairn_engine::control::call(&sock, &cairn_engine::control::Request::GcPlan { prices: prices.clone() })?;
    let (plan, candidates): (Option<Vec<PackCost>>, Option<Vec<maintenance::GcCandidate>>) = match mounted {
        Some(v) => (Some(serde_json::from_value(v).context("reading the plan from the mount")?), None),
        None => {
            let vol = open_volume(dir, pass, meta, true, None)?;
            let now = cairn_engine::Timestamp::now().0;
            let plan = Some(cairn_engine::cleaner::plan(&vol, now, prices)?);
            let cands = maintenance::gc_candidates(&vol, repack_below)?;
            vol.close()?;
            (plan, Some(cands))
        }
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "cleaner": plan, "gc": candidates }))?);
        return Ok(0);
    }
    if let Some(c) = &candidates {
        let (dead, stored): (u64, u64) = c.iter().fold((0, 0), |(d, s), x| (d + x.dead_bytes, s + x.size));
        println!("`cairn gc` would clean {} packs ({} stored, {} of them dead; --repack-below {repack_below})", c.len(), size::human(stored), size::human(dead));
        for x in c {
            let what = if x.live_bytes == 0 { "delete".to_string() } else { format!("repack {} live", size::human(x.live_bytes)) };
            println!("  {}  {:>10}  {:>10} dead  {what}", x.name, size::human(x.size), size::human(x.dead_bytes));
        }
    } else {
        println!("(mounted: `cairn gc` needs the volume unmounted; the mount's cleaner works by the plan below)");
    }
    if let Some(plan) = &plan {
        println!();
        let now = cairn_engine::Timestamp::now().0;
        let due: Vec<&PackCost> = plan.iter().filter(|p| p.due()).collect();
        let what = if due.is_empty() {
            match plan.iter().filter_map(|p| p.due_at).min() {
                Some(t) => format!("the next is due in {}", human_duration((t - now).max(0) as f64 / 1e9)),
                None => "none will be (storage is free)".to_string(),
            }
        } else {
            let cost: f64 = due.iter().fold(0.0, |a, p| a + p.c_clean);
            let save: f64 = due.iter().fold(0.0, |a, p| a + p.dead_per_month);
            format!("cleaning them costs {} and saves {} a month", money(cost), money(save))
        };
        println!("the cost-optimal cleaner ({}): {} of {} packs with dead bytes are due; {what}", prices.name, due.len(), plan.len());
        println!("  {:<40} {:>10} {:>10} {:>5} {:>12} {:>12} {:>12}  due", "pack", "dead", "live", "GETs", "dead so far", "to clean", "dead/month");
        for p in plan {
            let when = if p.uploading {
                "after its upload".to_string()
            } else if p.due() {
                "now".to_string()
            } else {
                p.due_at.map_or("never (storage is free)".to_string(), |t| format!("in {}", human_duration((t - now).max(0) as f64 / 1e9)))
            };
            println!(
                "  {:<40} {:>10} {:>10} {:>5} {:>12} {:>12} {:>12}  {when}",
                p.name,
                size::human(p.dead_bytes),
                size::human(p.live_bytes),
                p.gets,
                money(p.c_store),
                money(p.c_clean),
                money(p.dead_per_month)
            );
        }
    }
    Ok(0)
}

/// `3.2 days`, `5.0 hours`, `12 s`.
fn human_duration(secs: f64) -> String {
    match secs {
        s if s >= 86_400.0 * 365.0 => format!("{:.1} years", s / (86_400.0 * 365.0)),
        s if s >= 86_400.0 => format!("{:.1} days", s / 86_400.0),
        s if s >= 3_600.0 => format!("{:.1} hours", s / 3_600.0),
        s if s >= 60.0 => format!("{:.1} minutes", s / 60.0),
        s => format!("{s:.0} s"),
    }
}

fn print_bill(b: &cairn_engine::cost::Bill) {
    let from = b.since.as_deref().map_or("since counting began".to_string(), |d| format!("from {d}"));
    println!("bill {from}, prices: {}", b.prices.name);
    println!();
    // Few significant digits, no float noise: 0.0004, 2.5e-7.
    let num = |x: f64| {
        if x == 0.0 {
            "0".to_string()
        } else if x.abs() >= 1e-4 {
            let s = format!("{x:.6}");
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            format!("{x:.3e}")
        }
    };
    println!("{:<18} {:>22} {:>24} {:>14}", "item", "quantity", "unit price", "cost");
    for i in &b.items {
        let (q, p) = match i.unit.as_str() {
            "requests" => (format!("{}", i.quantity as u64), format!("${} per 1,000", num(i.unit_price * 1000.0))),
            // Bytes in binary units, as everywhere else Cairn shows sizes.
            "GB" => (size::human((i.quantity * cairn_engine::cost::GB) as u64), format!("${} per GB", num(i.unit_price))),
            _ => (format!("{}-months", size::human((i.quantity * cairn_engine::cost::GB) as u64)), format!("${} per GB-month", num(i.unit_price))),
        };
        println!("{:<18} {:>22} {:>24} {:>14}", i.item, q, p, money(i.cost));
    }
    println!("{:<18} {:>22} {:>24} {:>14}", "total", "", "", money(b.total));
    println!();
    let kinds = ["GET", "HEAD", "PUT", "POST", "LIST", "DELETE"];
    print!("{:<10}", "subsystem");
    for k in kinds {
        print!(" {k:>8}");
    }
    println!(" {:>12} {:>12} {:>12}", "up", "down", "cost");
    for s in &b.subsystems {
        print!("{:<10}", s.subsystem);
        for k in kinds {
            print!(" {:>8}", s.requests.get(k).copied().unwrap_or(0));
        }
        println!(" {:>12} {:>12} {:>12}", size::human(s.bytes_up), size::human(s.bytes_down), money(s.cost));
    }
    let months = |bs: u64| bs as f64 / cairn_engine::cost::GB / cairn_engine::cost::MONTH_SECS;
    let storage = (months(b.live_byte_seconds) + months(b.dead_byte_seconds)) * b.prices.storage_per_gb_month;
    println!("{:<10} {:>92}", "storage", money(storage));
}

/// Dollars as a person reads them: `$0.0123`, `$4.50`, `< $0.000001`
/// (never `1.033e-9`). JSON output keeps the exact figures.
fn money(x: f64) -> String {
    if x == 0.0 {
        return "$0".to_string();
    }
    if x.abs() < 0.000_001 {
        return if x < 0.0 { "> -$0.000001".to_string() } else { "< $0.000001".to_string() };
    }
    let digits = if x.abs() >= 1.0 { 2 } else { 6 };
    let s = format!("{:.*}", digits, x.abs());
    let s = if digits > 2 { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s };
    format!("{}${s}", if x < 0.0 { "-" } else { "" })
}

fn hex_of(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
