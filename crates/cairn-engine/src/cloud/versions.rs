//! Metadata versions in the bucket (docs/cloud.md §3, format.md "Metadata
//! versions"): full bases now and then, SQLite patchsets (deltas) often.
//!
//! Version `v` is one object, `meta/<v as 16 digits>.base` (the whole
//! database as of `v`) or `meta/<v>.delta` (the rows changed since `v - 1`).
//! The state of the volume is the highest version whose chain — the latest
//! base at or below it and every delta after that base — is complete.
//! Objects are written with `put_if_absent`, so two writers can never both
//! publish version `v`.

use crate::crypto::Keys;
use crate::error::{Error, ErrorKind, Result};
use cairn_backend::Backend;
use std::path::Path;

/// Where versions live in the bucket.
pub const PREFIX: &str = "meta/";
const MAGIC: &[u8; 8] = b"CAIRNMD1";
/// Header bytes: magic, kind, flags, 6 reserved, version, time, writer.
pub const HEADER_LEN: usize = 8 + 1 + 1 + 6 + 8 + 8 + 8;
const CHECKSUM_DOMAIN: &str = "cairn-meta-version";

/// Whether a version holds the whole database or the changes to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Base,
    Delta,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::Base => 1,
            Kind::Delta => 2,
        }
    }
    fn suffix(self) -> &'static str {
        match self {
            Kind::Base => "base",
            Kind::Delta => "delta",
        }
    }
}

/// One version as listed.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct VersionInfo {
    pub version: u64,
    pub kind: Kind,
    /// Stored (compressed, sealed) bytes.
    pub size: u64,
}

impl VersionInfo {
    pub fn object(&self) -> String {
        object_name(self.version, self.kind)
    }
}

/// The object name of version `v`.
pub fn object_name(v: u64, kind: Kind) -> String {
    format!("{PREFIX}{v:016}.{}", kind.suffix())
}

/// Every version in the bucket, oldest first. Names that are not versions
/// are ignored (a later format may add some).
pub fn list(backend: &dyn Backend) -> Result<Vec<VersionInfo>> {
    let mut out: Vec<VersionInfo> = backend
        .list(PREFIX)?
        .into_iter()
        .filter_map(|o| {
            let rest = o.name.strip_prefix(PREFIX)?;
            let (num, suffix) = rest.split_once('.')?;
            if num.len() != 16 {
                return None;
            }
            let version = num.parse().ok()?;
            let kind = match suffix {
                "base" => Kind::Base,
                "delta" => Kind::Delta,
                _ => return None,
            };
            Some(VersionInfo { version, kind, size: o.size })
        })
        .collect();
    out.sort_by_key(|v| v.version);
    Ok(out)
}

/// The chain that gives the state as of `upto` (the latest complete one
/// when None): the base and the deltas after it, in order.
pub fn chain(all: &[VersionInfo], upto: Option<u64>) -> Result<Vec<VersionInfo>> {
    let eligible: Vec<&VersionInfo> = all.iter().filter(|v| upto.is_none_or(|u| v.version <= u)).collect();
    if let Some(u) = upto {
        if !eligible.iter().any(|v| v.version == u) {
            return Err(Error::not_found(format!("metadata version {u} is not in the bucket (`cairn meta list` shows those kept)")));
        }
    }
    // The newest base from which every later version up to the end is present.
    for (i, b) in eligible.iter().enumerate().rev() {
        if b.kind != Kind::Base {
            continue;
        }
        let rest = &eligible[i + 1..];
        let consecutive = rest.iter().enumerate().all(|(k, v)| v.version == b.version + 1 + k as u64 && v.kind == Kind::Delta);
        if consecutive {
            return Ok(eligible[i..].iter().map(|v| (*v).clone()).collect());
        }
        if upto.is_some() {
            break;
        }
        // A gap after this base: a version was lost or is being written;
        // fall back to the longest complete prefix below.
        let mut prefix = vec![(*b).clone()];
        for (k, v) in rest.iter().enumerate() {
            if v.version != b.version + 1 + k as u64 || v.kind != Kind::Delta {
                break;
            }
            prefix.push((*v).clone());
        }
        return Ok(prefix);
    }
    Err(Error::config(match upto {
        Some(u) => format!("metadata version {u} has no complete chain (its base or a delta before it is gone)"),
        None if all.is_empty() => "the bucket holds no metadata versions (was the volume's first upload interrupted?)".to_string(),
        None => "the bucket's metadata versions have no base to start from".to_string(),
    }))
}

/// A version object's fixed header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub version: u64,
    /// Seconds since the epoch when it was written.
    pub time: u64,
    /// Which local cache directory wrote it (see `cloud::LocalState`).
    pub writer: [u8; 8],
}

impl Header {
    fn encode(&self, sealed: bool) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[..8].copy_from_slice(MAGIC);
        h[8] = self.kind.code();
        h[9] = sealed as u8;
        h[16..24].copy_from_slice(&self.version.to_le_bytes());
        h[24..32].copy_from_slice(&self.time.to_le_bytes());
        h[32..40].copy_from_slice(&self.writer);
        h
    }

    /// Parses a header; `name` is for messages.
    pub fn decode(b: &[u8], name: &str) -> Result<(Header, bool)> {
        if b.len() < HEADER_LEN || &b[..8] != MAGIC {
            return Err(Error::corrupt(format!("{name} is not a Cairn metadata version (bad magic)")));
        }
        let kind = match b[8] {
            1 => Kind::Base,
            2 => Kind::Delta,
            k => return Err(Error::corrupt(format!("{name}: unknown version kind {k}"))),
        };
        if b[9] > 1 || b[10..16].iter().any(|&x| x != 0) {
            return Err(Error::corrupt(format!("{name}: unknown header flags")));
        }
        let u = |r: std::ops::Range<usize>| u64::from_le_bytes(b[r].try_into().expect("8 bytes"));
        let mut writer = [0u8; 8];
        writer.copy_from_slice(&b[32..40]);
        Ok((Header { kind, version: u(16..24), time: u(24..32), writer }, b[9] == 1))
    }
}

/// The stored bytes of a version: header, then the zstd-compressed payload,
/// sealed with the volume's data key (the header as associated data) on an
/// encrypted volume, or followed by a keyed checksum of header and body.
pub fn encode(keys: &Keys, h: &Header, payload: &[u8]) -> Result<Vec<u8>> {
    let z = zstd::bulk::compress(payload, 3).map_err(|e| Error::io(format!("compressing metadata: {e}")))?;
    let head = h.encode(keys.encrypted());
    let mut out = Vec::with_capacity(HEADER_LEN + z.len() + 64);
    out.extend_from_slice(&head);
    if keys.encrypted() {
        out.extend_from_slice(&keys.seal(&head, z));
    } else {
        let sum = keys.checksum(CHECKSUM_DOMAIN, &[&head[..], &z[..]].concat());
        out.extend_from_slice(&z);
        out.extend_from_slice(&sum);
    }
    Ok(out)
}

/// Checks and opens a version object; `expect` is the version its name says.
pub fn decode(keys: &Keys, name: &str, expect: u64, bytes: Vec<u8>) -> Result<(Header, Vec<u8>)> {
    let (h, sealed) = Header::decode(&bytes, name)?;
    if h.version != expect {
        return Err(Error::corrupt(format!("{name} says it is version {} (renamed or misplaced)", h.version)));
    }
    if sealed != keys.encrypted() {
        return Err(Error::corrupt(format!("{name}: sealing does not match the volume's encryption")));
    }
    let head = bytes[..HEADER_LEN].to_vec();
    let z = if sealed {
        keys.open(&head, bytes[HEADER_LEN..].to_vec()).map_err(|e| Error::corrupt(format!("{name}: {}", e.message())))?
    } else {
        if bytes.len() < HEADER_LEN + 32 {
            return Err(Error::corrupt(format!("{name} is truncated")));
        }
        let (body, sum) = bytes[HEADER_LEN..].split_at(bytes.len() - HEADER_LEN - 32);
        if keys.checksum(CHECKSUM_DOMAIN, &[&head[..], body].concat()) != sum {
            return Err(Error::corrupt(format!("{name}: checksum mismatch (altered or truncated)")));
        }
        body.to_vec()
    };
    // Bases of a large volume are large; the bound only stops a bomb.
    let payload = zstd::stream::decode_all(&z[..]).map_err(|e| Error::corrupt(format!("{name}: bad compressed payload: {e}")))?;
    Ok((h, payload))
}

/// Reads the header of each version (one small ranged read each), for `meta list`.
pub fn headers(backend: &dyn Backend, all: &[VersionInfo]) -> Result<Vec<Header>> {
    all.iter()
        .map(|v| {
            let n = v.object();
            let b = backend.get_range(&n, 0, HEADER_LEN as u64)?;
            Ok(Header::decode(&b, &n)?.0)
        })
        .collect()
}

/// Builds the metadata database at `path` from `chain` (a base and the
/// deltas after it): written beside it and renamed over it only when every
/// delta applied, so a failure leaves the old file. Returns the newest
/// version applied.
pub fn rebuild(backend: &dyn Backend, keys: &Keys, chain: &[VersionInfo], path: &Path, progress: &dyn Fn(usize, usize)) -> Result<u64> {
    let Some(first) = chain.first() else { return Err(Error::config("no metadata version to rebuild from")) };
    if first.kind != Kind::Base {
        return Err(Error::config("a metadata chain must start with a base"));
    }
    let tmp = path.with_extension("rebuild");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", tmp.display()));
    }
    let get = |v: &VersionInfo| -> Result<Vec<u8>> {
        let n = v.object();
        let bytes = backend.get(&n).map_err(|e| Error::from(e).context(format_args!("reading metadata version {}", v.version)))?;
        Ok(decode(keys, &n, v.version, bytes)?.1)
    };
    let base = get(first)?;
    crate::fsutil::create_private_file(&tmp).and_then(|mut f| std::io::Write::write_all(&mut f, &base)).map_err(|e| Error::os(format_args!("writing {}", tmp.display()), &e))?;
    drop(base);
    progress(1, chain.len());
    {
        let c = rusqlite::Connection::open(&tmp)?;
        c.execute_batch("PRAGMA journal_mode=WAL;")?;
        for (i, v) in chain.iter().enumerate().skip(1) {
            let delta = get(v)?;
            let conflicts = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
            let seen = conflicts.clone();
            c.execute_batch("BEGIN IMMEDIATE")?;
            let r = c.apply_strm(&mut &delta[..], None::<fn(&str) -> bool>, move |_, _| {
                seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                rusqlite::session::ConflictAction::SQLITE_CHANGESET_ABORT
            });
            if r.is_err() || conflicts.load(std::sync::atomic::Ordering::Relaxed) > 0 {
                let _ = c.execute_batch("ROLLBACK");
                return Err(Error::corrupt(format!(
                    "metadata version {} does not apply to the state before it{}",
                    v.version,
                    r.err().map(|e| format!(" ({e})")).unwrap_or_default()
                )));
            }
            c.execute_batch("COMMIT")?;
            progress(i + 1, chain.len());
        }
        c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")?;
    }
    let f = std::fs::File::open(&tmp)?;
    f.sync_all()?;
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        let _ = std::fs::remove_file(format!("{}{suffix}", tmp.display()));
    }
    std::fs::rename(&tmp, path).map_err(|e| Error::os(format_args!("renaming {} into place", tmp.display()), &e))?;
    if let Some(dir) = path.parent() {
        crate::fsutil::fsync_dir(dir)?;
    }
    Ok(chain.last().expect("non-empty").version)
}

/// Publishes version `v`; AlreadyExists means another writer published it.
pub fn publish(backend: &dyn Backend, keys: &Keys, h: &Header, payload: &[u8]) -> Result<u64> {
    let bytes = encode(keys, h, payload)?;
    let n = object_name(h.version, h.kind);
    match backend.put_if_absent(&n, &bytes) {
        Ok(()) => Ok(bytes.len() as u64),
        Err(e) if e.kind() == cairn_backend::ErrorKind::AlreadyExists => {
            // Ours, if a retry followed a create whose reply was lost: the
            // sealed bytes (random nonce) or the checksum make it unique.
            if backend.get(&n).is_ok_and(|there| there == bytes) {
                return Ok(bytes.len() as u64);
            }
            Err(Error::new(ErrorKind::Busy, format!("metadata version {} was published by another machine: this mount no longer owns the volume", h.version)))
        }
        Err(e) => Err(Error::from(e).context(format_args!("uploading metadata version {}", h.version))),
    }
}

/// Versions to delete so that only the newest `keep_bases` bases and what
/// follows the oldest of them remain.
pub fn prunable(all: &[VersionInfo], keep_bases: usize) -> Vec<VersionInfo> {
    let bases: Vec<u64> = all.iter().filter(|v| v.kind == Kind::Base).map(|v| v.version).collect();
    if bases.len() <= keep_bases {
        return Vec::new();
    }
    let oldest_kept = bases[bases.len() - keep_bases];
    all.iter().filter(|v| v.version < oldest_kept).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(version: u64, kind: Kind) -> VersionInfo {
        VersionInfo { version, kind, size: 1 }
    }

    #[test]
    fn the_latest_complete_chain_wins() {
        use Kind::*;
        let all = vec![v(1, Base), v(2, Delta), v(3, Delta), v(4, Base), v(5, Delta)];
        assert_eq!(chain(&all, None).unwrap().iter().map(|x| x.version).collect::<Vec<_>>(), vec![4, 5]);
        assert_eq!(chain(&all, Some(3)).unwrap().iter().map(|x| x.version).collect::<Vec<_>>(), vec![1, 2, 3]);
        // A missing delta: the chain stops before the gap.
        let gap = vec![v(1, Base), v(2, Delta), v(4, Delta)];
        assert_eq!(chain(&gap, None).unwrap().iter().map(|x| x.version).collect::<Vec<_>>(), vec![1, 2]);
        assert!(chain(&gap, Some(4)).is_err());
        assert!(chain(&[], None).is_err());
        assert!(chain(&all, Some(9)).is_err());
    }

    #[test]
    fn pruning_keeps_the_newest_bases_and_what_follows() {
        use Kind::*;
        let all = vec![v(1, Base), v(2, Delta), v(3, Base), v(4, Delta), v(5, Base), v(6, Delta)];
        assert_eq!(prunable(&all, 2).iter().map(|x| x.version).collect::<Vec<_>>(), vec![1, 2]);
        assert!(prunable(&all, 3).is_empty());
    }

    #[test]
    fn versions_round_trip_and_refuse_tampering() {
        for encrypt in [false, true] {
            let keys = Keys::derive(&[7u8; 32], encrypt);
            let h = Header { kind: Kind::Delta, version: 42, time: 1, writer: *b"abcdefgh" };
            let bytes = encode(&keys, &h, b"some rows").unwrap();
            let (h2, p) = decode(&keys, "x", 42, bytes.clone()).unwrap();
            assert_eq!((h2, p.as_slice()), (h, &b"some rows"[..]));
            assert!(decode(&keys, "x", 43, bytes.clone()).is_err(), "a renamed version is refused");
            for i in [3, HEADER_LEN - 1, HEADER_LEN + 2, bytes.len() - 1] {
                let mut bad = bytes.clone();
                bad[i] ^= 1;
                assert!(decode(&keys, "x", 42, bad).is_err(), "flipped byte {i} (encrypt {encrypt})");
            }
            assert!(decode(&keys, "x", 42, bytes[..bytes.len() - 5].to_vec()).is_err());
            assert!(decode(&Keys::derive(&[8u8; 32], encrypt), "x", 42, bytes).is_err(), "another volume's key");
        }
    }
}
