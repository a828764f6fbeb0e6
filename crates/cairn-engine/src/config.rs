//! The volume's on-disk layout and its config object (format v1).
//!
//! ```text
//! DIR/                    the volume's local home (what `cairn init DIR` made)
//!   volume.json           local settings: where the backend is
//!   lock                  flock'd by the process that has the volume open
//!   meta.sqlite           metadata (SQLite, WAL; absent when the config
//!                         says `"meta": "postgres"`)
//!   journal/              write-back journal shards (see journal.rs)
//!   store/                the default local backend:
//!     config              the config object (JSON, below)
//!     packs/xx/<name>     packs (see pack.rs)
//! ```

use crate::crypto::{self, KdfParams, Keys, WrappedKey};
use crate::error::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// The only format version this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;
/// Name of the config object in the backend.
pub const CONFIG_OBJECT: &str = "config";

/// Chunker parameters, fixed at `init`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ChunkerParams {
    pub algorithm: ChunkerAlgorithm,
    pub min: u32,
    pub avg: u32,
    pub max: u32,
}

/// The chunking algorithm's name as stored (only FastCDC 2020 for now).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum ChunkerAlgorithm {
    #[serde(rename = "fastcdc-2020")]
    FastCdc2020,
}

impl Default for ChunkerParams {
    fn default() -> Self {
        ChunkerParams { algorithm: ChunkerAlgorithm::FastCdc2020, min: 256 << 10, avg: 1 << 20, max: 4 << 20 }
    }
}

impl ChunkerParams {
    /// Checks the limits FastCDC imposes.
    pub fn validate(&self) -> Result<()> {
        let ok = self.min >= 64
            && self.min.is_multiple_of(2)
            && self.min <= self.avg
            && self.avg <= self.max
            && self.max <= 64 << 20
            && self.min <= 67_108_864;
        if ok {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "chunker sizes must satisfy 64 <= min <= avg <= max <= 64 MiB with an even min (got {}/{}/{})",
                self.min, self.avg, self.max
            )))
        }
    }
}

/// The config object stored in the backend: everything needed to read the
/// volume's packs, except the passphrase.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VolumeConfig {
    pub format: String,
    pub version: u32,
    pub volume_id: String,
    pub chunker: ChunkerParams,
    pub compression: Compression,
    pub encryption: Encryption,
    /// Target pack size in bytes.
    pub pack_target: u64,
    /// The master secret, wrapped (encrypted volumes) or plain hex.
    pub key: KeySlot,
    /// Where the metadata lives (absent: SQLite, as every volume before
    /// it). Never a host or a password: the URL is given at each open.
    #[serde(default, skip_serializing_if = "MetaKind::is_sqlite")]
    pub meta: MetaKind,
    /// Which writers' data may share chunks (absent: the whole volume, as
    /// every volume before it). Fixed at `init` (docs/format.md §2).
    #[serde(default, skip_serializing_if = "DedupDomain::is_volume")]
    pub dedup_domain: DedupDomain,
}

/// Which writes may be deduplicated against each other
/// (docs/threat-model.md, "What dedup tells a co-tenant").
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DedupDomain {
    /// Any file's data against any other's: identical data is stored once.
    #[default]
    Volume,
    /// Only files of one owner (uid, at the time of the write) against each
    /// other: the chunk id is keyed by the volume key and the owner, so
    /// identical data of two owners is stored twice and no one can learn,
    /// by writing, whether another owner stored some data.
    Owner,
}

impl DedupDomain {
    pub fn is_volume(&self) -> bool {
        *self == DedupDomain::Volume
    }
}

impl std::str::FromStr for DedupDomain {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "volume" => Ok(DedupDomain::Volume),
            "owner" => Ok(DedupDomain::Owner),
            _ => Err(format!("unknown dedup domain {s:?} (volume or owner)")),
        }
    }
}

/// The metadata store a volume keeps its metadata in.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum MetaKind {
    /// `DIR/meta.sqlite`.
    #[default]
    Sqlite,
    /// Schema `cairn_<volume id>` in a PostgreSQL database named by the
    /// opener (`meta_url`).
    Postgres,
}

impl MetaKind {
    pub fn is_sqlite(&self) -> bool {
        *self == MetaKind::Sqlite
    }
}

/// How blobs are compressed.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Compression {
    pub algorithm: CompressionAlgorithm,
    pub level: i32,
}

/// Compression algorithms.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum CompressionAlgorithm {
    #[serde(rename = "zstd")]
    Zstd,
}

/// Blob encryption.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum Encryption {
    #[serde(rename = "none")]
    None,
    #[serde(rename = "aes-256-gcm")]
    Aes256Gcm,
}

/// Where the master secret lives.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeySlot {
    /// Unencrypted volume: the secret keys chunk ids and checksums only.
    Plain(String),
    /// Encrypted volume: wrapped by an Argon2id key from the passphrase.
    Wrapped(WrappedKey),
}

/// Local settings of one volume directory.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LocalSettings {
    pub format: String,
    pub version: u32,
    /// Backend location: `local:PATH` (relative paths are relative to DIR)
    /// or `s3://BUCKET/PREFIX` (a cloud volume: DIR is then its local
    /// cache and working metadata, see `cloud`).
    pub backend: String,
    /// S3 service URL for S3-compatible stores (cloud volumes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// S3 region (cloud volumes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// The CDP mirror of a tape volume (an absolute directory; docs/tape.md
    /// §4): kept here so that the next mounts from this directory mirror
    /// too, while a machine with only the tape mounts without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<std::path::PathBuf>,
    /// The volume (its config's id) whose local state this directory
    /// holds, for a home away from it: a drive's URL names whatever tape is
    /// loaded and a bucket prefix can be replaced, so the URL alone cannot
    /// tell that the home is still this volume. Recorded when first seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_id: Option<String>,
}

/// Options for `init`.
#[derive(Clone, Debug, Default)]
pub struct InitOptions {
    pub chunker: ChunkerParams,
    /// Encrypt with a key wrapped by this passphrase.
    pub passphrase: Option<Zeroizing<Vec<u8>>>,
    pub kdf: Option<KdfParams>,
    pub zstd_level: Option<i32>,
    pub pack_target: Option<u64>,
    /// Keep the volume's packs and config here instead of `DIR/store` (tests
    /// and embedders; every later open must be given the same backend).
    pub backend: Option<InjectedBackend>,
    /// Keep the metadata in PostgreSQL, in schema `cairn_<volume id>` of
    /// the database this URL names (`postgres://USER@HOST:PORT/DB`; the
    /// password comes from PGPASSWORD or ~/.pgpass), instead of
    /// `DIR/meta.sqlite`.
    pub meta_url: Option<String>,
    /// Which writes share chunks (default: the whole volume).
    pub dedup_domain: DedupDomain,
}

/// A backend handed to `init` or `Volume::load` by the program instead of
/// the one the volume's settings name.
#[derive(Clone)]
pub struct InjectedBackend(pub std::sync::Arc<dyn cairn_backend::Backend>);

impl std::fmt::Debug for InjectedBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InjectedBackend({})", self.0.describe())
    }
}

/// The settings' `backend` of a volume made with an injected backend.
pub const INJECTED_BACKEND: &str = "injected:";

/// Paths inside a volume directory.
#[derive(Clone, Debug)]
pub struct Layout {
    pub dir: PathBuf,
}

impl Layout {
    pub fn new(dir: &Path) -> Self {
        Layout { dir: dir.to_path_buf() }
    }
    pub fn settings(&self) -> PathBuf {
        self.dir.join("volume.json")
    }
    pub fn lock(&self) -> PathBuf {
        self.dir.join("lock")
    }
    pub fn meta_db(&self) -> PathBuf {
        self.dir.join("meta.sqlite")
    }
    pub fn journal(&self) -> PathBuf {
        self.dir.join("journal")
    }
    pub fn default_store(&self) -> PathBuf {
        self.dir.join("store")
    }
    /// Resolves the backend location in the settings to a directory.
    pub fn store_path(&self, s: &LocalSettings) -> Result<PathBuf> {
        if s.backend.starts_with(INJECTED_BACKEND) {
            return Err(Error::config(format!("volume {} keeps its data in a backend its program supplies ({}); it cannot be opened on its own", self.dir.display(), s.backend)));
        }
        let Some(p) = s.backend.strip_prefix("local:") else {
            return Err(Error::config(format!("unsupported backend {:?} (this build knows local:PATH)", s.backend)));
        };
        let p = Path::new(p);
        Ok(if p.is_absolute() { p.to_path_buf() } else { self.dir.join(p) })
    }
}

impl VolumeConfig {
    /// A new config with a fresh volume id and master secret; returns the
    /// secret too so the caller can derive keys without unwrapping.
    pub fn create(opts: &InitOptions) -> Result<(Self, Zeroizing<[u8; 32]>)> {
        opts.chunker.validate()?;
        let volume_id = hex::encode(rand::random::<[u8; 16]>());
        let master = crypto::random_master();
        let (encryption, key) = match &opts.passphrase {
            Some(p) => {
                if p.is_empty() {
                    return Err(Error::invalid("the passphrase is empty"));
                }
                let w = crypto::wrap_master(&master, p, volume_id.as_bytes(), opts.kdf.unwrap_or_default())?;
                (Encryption::Aes256Gcm, KeySlot::Wrapped(w))
            }
            None => (Encryption::None, KeySlot::Plain(hex::encode(&master[..]))),
        };
        let cfg = VolumeConfig {
            format: "cairn-volume".into(),
            version: FORMAT_VERSION,
            volume_id,
            chunker: opts.chunker,
            compression: Compression { algorithm: CompressionAlgorithm::Zstd, level: opts.zstd_level.unwrap_or(1) },
            encryption,
            pack_target: opts.pack_target.unwrap_or(32 << 20),
            key,
            meta: if opts.meta_url.is_some() { MetaKind::Postgres } else { MetaKind::Sqlite },
            dedup_domain: opts.dedup_domain,
        };
        Ok((cfg, master))
    }

    /// Parses and checks a stored config object.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        #[derive(Deserialize)]
        struct Head {
            format: String,
            version: u32,
        }
        let head: Head = serde_json::from_slice(bytes)
            .map_err(|e| Error::config(format!("volume config is not valid: {e}")))?;
        if head.format != "cairn-volume" {
            return Err(Error::config(format!("not a Cairn volume config (format {:?})", head.format)));
        }
        if head.version != FORMAT_VERSION {
            return Err(Error::config(format!(
                "volume format version {} is not supported by this cairn (it reads version {FORMAT_VERSION}); use a matching release",
                head.version
            )));
        }
        let cfg: VolumeConfig = serde_json::from_slice(bytes)
            .map_err(|e| Error::config(format!("volume config is not valid: {e}")))?;
        cfg.chunker.validate().map_err(|e| Error::config(format!("volume config: {e}")))?;
        if cfg.pack_target < (1 << 20) {
            return Err(Error::config("volume config: pack_target below 1 MiB"));
        }
        Ok(cfg)
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("config serialises")
    }

    /// Whether opening needs a passphrase.
    pub fn needs_passphrase(&self) -> bool {
        matches!(self.key, KeySlot::Wrapped(_))
    }

    /// Derives the working keys, unwrapping with `pass` when encrypted.
    pub fn keys(&self, pass: Option<&[u8]>) -> Result<Keys> {
        let master = match &self.key {
            KeySlot::Plain(h) => {
                let v = hex::decode(h).map_err(|_| Error::config("volume config: bad key"))?;
                let mut m = Zeroizing::new([0u8; 32]);
                if v.len() != 32 {
                    return Err(Error::config("volume config: bad key length"));
                }
                m.copy_from_slice(&v);
                m
            }
            KeySlot::Wrapped(w) => {
                let Some(p) = pass else {
                    return Err(Error::new(ErrorKind::Config, "this volume is encrypted: a passphrase is needed"));
                };
                crypto::unwrap_master(w, p, self.volume_id.as_bytes())?
            }
        };
        Ok(Keys::derive(&master, self.encryption == Encryption::Aes256Gcm).with_owner_domains(self.dedup_domain == DedupDomain::Owner))
    }
}


/// A local store as the engine uses every backend: behind `Retrying`.
pub fn with_retries(local: cairn_backend::LocalBackend) -> std::sync::Arc<dyn cairn_backend::Backend> {
    std::sync::Arc::new(cairn_backend::Retrying::new(local, cairn_backend::RetryPolicy::local()))
}

// Where a volume lives, by its location's scheme.

/// Scheme of a real drive.
pub const DRIVE_SCHEME: &str = "tape:";
/// Scheme of an emulated drive.
pub const EMU_SCHEME: &str = "tape-emu:";
/// Whether a location names a bucket (`s3://...`).
pub fn is_cloud_url(s: &str) -> bool {
    s.starts_with("s3://")
}

/// Whether a location is a home away from the local directory: a bucket
/// or a tape (both run this module's machinery).
pub fn is_remote_url(s: &str) -> bool {
    is_cloud_url(s) || is_tape_url(s)
}

/// Whether a location names a tape.
pub fn is_tape_url(s: &str) -> bool {
    s.starts_with(DRIVE_SCHEME) || s.starts_with(EMU_SCHEME)
}

/// Writes `volume.json`, the mark of a finished volume directory.
pub(crate) fn write_settings(layout: &Layout, settings: &LocalSettings) -> Result<()> {
    let dir = &layout.dir;
    // volume.json last: a directory without it is not a volume, so a power
    // cut before this point leaves no half-made volume behind. Everything
    // above is durable first (the database is checkpointed and fsync'd by
    // Meta::create, the config by the backend's put).
    crate::fsutil::replace_private_file(dir, "volume.json", &serde_json::to_vec_pretty(&settings).expect("settings serialise"))
}

/// Takes the volume lock: exclusive for read-write opens, shared for
/// read-only looks (which then keep any writer out while they read).
pub(crate) fn take_lock(layout: &Layout, exclusive: bool) -> Result<File> {
    // The lock lives in the volume directory, which only its owner may
    // enter: another user can neither read the volume nor hold its lock.
    crate::fsutil::ensure_private_dir(&layout.dir);
    let f = crate::fsutil::open_lock_file(&layout.lock()).map_err(|e| Error::os(format_args!("opening the volume lock {}", layout.lock().display()), &e))?;
    let op = if exclusive { libc::LOCK_EX } else { libc::LOCK_SH };
    // SAFETY: flock on an fd we own.
    let r = unsafe { libc::flock(f.as_raw_fd(), op | libc::LOCK_NB) };
    if r != 0 {
        return Err(Error::new(
            ErrorKind::Busy,
            format!("volume {} is in use by another cairn process (is it mounted?)", layout.dir.display()),
        ));
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_version_is_refused() {
        let (mut c, _) = VolumeConfig::create(&InitOptions::default()).unwrap();
        c.version = 99;
        let e = VolumeConfig::parse(&c.to_bytes()).unwrap_err();
        assert!(e.message().contains("version 99"), "{e}");
    }

    #[test]
    fn garbage_config_is_refused() {
        assert!(VolumeConfig::parse(b"{not json").is_err());
        assert!(VolumeConfig::parse(br#"{"format":"x","version":1}"#).is_err());
    }
}

/// The pack size `cairn init` gives a volume at `volume` when none is
/// asked for: 64 MiB on a tape, 16 MiB in a bucket (uploaded and read back
/// faster there than 32 or 64 MiB ones, docs/profile.md), 32 MiB in a
/// directory.
pub fn default_pack_target(volume: &str) -> u64 {
    if is_tape_url(volume) {
        64 << 20
    } else if is_cloud_url(volume) {
        16 << 20
    } else {
        32 << 20
    }
}
