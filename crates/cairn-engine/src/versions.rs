//! Metadata versions in the bucket (docs/cloud.md §3, format.md "Metadata
//! versions"): full bases now and then, SQLite patchsets (deltas) often.
//!
//! Version `v` is one object, `meta/<v as 16 digits>.base` (the whole
//! database as of `v`) or `meta/<v>.delta` (the rows changed since `v - 1`).
//! The state of the volume is the highest version whose chain — the latest
//! base at or below it and every delta after that base — is complete.
//! Objects are written with `put_if_absent`, so two writers can never both
//! publish version `v`.
//!
//! Each version (format 2, magic `CAIRNMD2`) names its predecessor: the
//! number `v - 1` and a digest of that object's stored bytes, so a version
//! lost from the bucket, or replaced by another history's, is found rather
//! than built on. The latest state needs every version from the newest
//! base to the newest version: a hole there is an error naming the missing
//! version (a read-only mount may use the intact part before it). Format 1
//! versions (`CAIRNMD1`, before predecessors were named) are still read;
//! an old volume's links are checked from the first version that names one.

use crate::crypto::Keys;
use crate::error::{Error, ErrorKind, Result};
use cairn_backend::Backend;
use std::path::Path;

/// Where versions live in the bucket.
pub const PREFIX: &str = "meta/";
const MAGIC: &[u8; 8] = b"CAIRNMD1";
const MAGIC2: &[u8; 8] = b"CAIRNMD2";
/// Header bytes of format 1: magic, kind, flags, 6 reserved, version,
/// time, writer.
pub const HEADER_LEN: usize = 8 + 1 + 1 + 6 + 8 + 8 + 8;
/// Header bytes of format 2: format 1's, then the predecessor's version
/// and the digest of its stored bytes (both zero for the first version).
pub const HEADER_LEN_V2: usize = HEADER_LEN + 8 + 32;
const DIGEST_CONTEXT: &str = "cairn 2025 metadata version predecessor digest";
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

/// The version an object name stands for, if it is one (`meta/<16
/// digits>.base|delta`; other names are ignored: a later format may add
/// some).
pub fn parse_name(name: &str, size: u64) -> Option<VersionInfo> {
    let rest = name.strip_prefix(PREFIX)?;
    let (num, suffix) = rest.split_once('.')?;
    if num.len() != 16 || !num.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let version = num.parse().ok()?;
    let kind = match suffix {
        "base" => Kind::Base,
        "delta" => Kind::Delta,
        _ => return None,
    };
    Some(VersionInfo { version, kind, size })
}

/// Every version in the bucket, oldest first.
pub fn list(backend: &dyn Backend) -> Result<Vec<VersionInfo>> {
    let mut out: Vec<VersionInfo> = backend.list(PREFIX)?.into_iter().filter_map(|o| parse_name(&o.name, o.size)).collect();
    out.sort_by_key(|v| (v.version, v.kind.code()));
    Ok(out)
}

/// The chain that gives the state as of `upto` (the latest when None):
/// the newest base at or below it and every delta after that base, in
/// order. A version missing from that range is an error naming it (see
/// [`intact_prefix`] for what a read-only mount may use instead).
pub fn chain(all: &[VersionInfo], upto: Option<u64>) -> Result<Vec<VersionInfo>> {
    let eligible: Vec<&VersionInfo> = all.iter().filter(|v| upto.is_none_or(|u| v.version <= u)).collect();
    if let Some(u) = upto {
        if !eligible.iter().any(|v| v.version == u) {
            return Err(Error::not_found(format!("metadata version {u} is not in the bucket (`cairn meta list` shows those kept)")));
        }
    }
    let Some(i) = eligible.iter().rposition(|v| v.kind == Kind::Base) else {
        return Err(Error::config(match upto {
            Some(u) => format!("metadata version {u} has no complete chain (its base or a delta before it is gone)"),
            None if all.is_empty() => "the bucket holds no metadata versions (was the volume's first upload interrupted?)".to_string(),
            None => "the bucket's metadata versions have no base to start from".to_string(),
        }));
    };
    let b = eligible[i];
    let rest = &eligible[i + 1..];
    let top = eligible.last().expect("non-empty").version;
    // Two objects of one version (a base and a delta), or a gap.
    let mut expect = b.version + 1;
    for v in rest {
        if v.version != expect || v.kind != Kind::Delta {
            let missing = if v.version > expect { expect } else { v.version };
            return Err(gap_error(missing, v.version > expect, b.version, top, upto));
        }
        expect += 1;
    }
    Ok(eligible[i..].iter().map(|v| (*v).clone()).collect())
}

fn gap_error(missing: u64, absent: bool, base: u64, top: u64, upto: Option<u64>) -> Error {
    let what = if absent {
        format!("metadata version {missing} ({}) is missing from the bucket", object_name(missing, Kind::Delta).replace(".delta", ".base|.delta"))
    } else {
        format!("metadata version {missing} is in the bucket twice (as a base and a delta)")
    };
    let need = match upto {
        Some(u) => format!("version {u} is built from versions {base}..{u}"),
        None => format!("the volume's latest state, version {top}, is built from versions {base}..{top}"),
    };
    Error::new(
        ErrorKind::Corrupt,
        format!(
            "{what}: {need}, so it cannot be rebuilt, and a read-write mount (which would build on the hole) is refused. \
             Mount read-only (`cairn mount --read-only`) to use the last intact state, version {}, or make an intact version the latest with \
             `cairn meta restore VOLUME VERSION` (`cairn meta list` shows the versions kept)",
            missing.saturating_sub(1)
        ),
    )
}

/// What the latest state would be without the hole [`chain`] found: the
/// newest base and the complete run of deltas after it, up to the first
/// missing version (for a read-only mount). None if even that base is
/// missing.
pub fn intact_prefix(all: &[VersionInfo]) -> Option<Vec<VersionInfo>> {
    let i = all.iter().rposition(|v| v.kind == Kind::Base)?;
    let b = &all[i];
    let mut out = vec![b.clone()];
    for (k, v) in all[i + 1..].iter().enumerate() {
        if v.version != b.version + 1 + k as u64 || v.kind != Kind::Delta {
            break;
        }
        out.push(v.clone());
    }
    Some(out)
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
    /// The version it follows (None: the volume's first version, or a
    /// format 1 version, which names none).
    pub prev: Option<Prev>,
}

/// The version a version follows: its number and the digest of its stored
/// bytes ([`digest`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prev {
    pub version: u64,
    pub digest: [u8; 32],
}

/// The digest of a version object's stored bytes, as its successor names it.
pub fn digest(stored: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_derive_key(DIGEST_CONTEXT);
    h.update(stored);
    *h.finalize().as_bytes()
}

impl Header {
    fn encode(&self, sealed: bool) -> [u8; HEADER_LEN_V2] {
        let mut h = [0u8; HEADER_LEN_V2];
        h[..8].copy_from_slice(MAGIC2);
        h[8] = self.kind.code();
        h[9] = sealed as u8;
        h[16..24].copy_from_slice(&self.version.to_le_bytes());
        h[24..32].copy_from_slice(&self.time.to_le_bytes());
        h[32..40].copy_from_slice(&self.writer);
        if let Some(p) = self.prev {
            h[40..48].copy_from_slice(&p.version.to_le_bytes());
            h[48..80].copy_from_slice(&p.digest);
        }
        h
    }

    /// Parses a header (format 1 or 2); `name` is for messages. Returns it,
    /// whether the body is sealed, and the header's length.
    pub fn decode(b: &[u8], name: &str) -> Result<(Header, bool, usize)> {
        let len = match b.get(..8) {
            Some(m) if m == MAGIC => HEADER_LEN,
            Some(m) if m == MAGIC2 => HEADER_LEN_V2,
            _ => return Err(Error::corrupt(format!("{name} is not a Cairn metadata version (bad magic)"))),
        };
        if b.len() < len {
            return Err(Error::corrupt(format!("{name} is truncated (a header of {} bytes)", b.len())));
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
        let version = u(16..24);
        let prev = if len == HEADER_LEN_V2 {
            let mut digest = [0u8; 32];
            digest.copy_from_slice(&b[48..80]);
            match u(40..48) {
                0 if digest == [0u8; 32] => None,
                p if p == 0 || p >= version => return Err(Error::corrupt(format!("{name}: names version {p} as its predecessor"))),
                p => Some(Prev { version: p, digest }),
            }
        } else {
            None
        };
        Ok((Header { kind, version, time: u(24..32), writer, prev }, b[9] == 1, len))
    }
}

/// Checks that `next` (version `v`) follows the object of version `v - 1`
/// whose stored bytes digest to `prev_digest`, as its header says; a
/// version that names no predecessor (format 1) passes.
pub fn check_link(next: &Header, prev_version: u64, prev_digest: &[u8; 32]) -> Result<()> {
    match next.prev {
        None => Ok(()),
        Some(p) if p.version != prev_version => Err(Error::corrupt(format!(
            "metadata version {} follows version {} but the chain has version {prev_version} before it (a version is missing)",
            next.version, p.version
        ))),
        Some(p) if &p.digest != prev_digest => Err(Error::corrupt(format!(
            "metadata version {} was written on top of another version {prev_version} than the one in the bucket (version {prev_version} was replaced: two histories are mixed); \
             `cairn meta restore VOLUME {}` makes the intact state before it the latest",
            next.version,
            prev_version.saturating_sub(1)
        ))),
        Some(_) => Ok(()),
    }
}

/// Validates, from a list of objects and their stored bytes (a hostile
/// bucket's, in the fuzz target), the latest chain and every link in it:
/// what [`chain`] and [`rebuild`] check before any payload is opened.
/// Returns the latest version.
pub fn verify_chain(objects: &[(String, Vec<u8>)]) -> Result<u64> {
    let mut all: Vec<VersionInfo> = objects.iter().filter_map(|(n, b)| parse_name(n, b.len() as u64)).collect();
    all.sort_by_key(|v| (v.version, v.kind.code()));
    let c = chain(&all, None)?;
    let bytes_of = |v: &VersionInfo| objects.iter().find(|(n, _)| *n == v.object()).map(|(_, b)| b.as_slice()).expect("listed");
    let mut prev: Option<(u64, [u8; 32])> = None;
    for v in &c {
        let b = bytes_of(v);
        let (h, _, _) = Header::decode(b, &v.object())?;
        if h.version != v.version || h.kind != v.kind {
            return Err(Error::corrupt(format!("{} says it is version {} (renamed or misplaced)", v.object(), h.version)));
        }
        if let Some((pv, pd)) = prev {
            check_link(&h, pv, &pd)?;
        }
        prev = Some((v.version, digest(b)));
    }
    Ok(c.last().expect("a chain is never empty").version)
}

/// The stored bytes of a version: header, then the zstd-compressed payload,
/// sealed with the volume's data key (the header as associated data) on an
/// encrypted volume, or followed by a keyed checksum of header and body.
pub fn encode(keys: &Keys, h: &Header, payload: &[u8]) -> Result<Vec<u8>> {
    let z = zstd::bulk::compress(payload, 3).map_err(|e| Error::io(format!("compressing metadata: {e}")))?;
    let head = h.encode(keys.encrypted());
    let mut out = Vec::with_capacity(HEADER_LEN_V2 + z.len() + 64);
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
    let (h, sealed, hlen) = Header::decode(&bytes, name)?;
    if h.version != expect {
        return Err(Error::corrupt(format!("{name} says it is version {} (renamed or misplaced)", h.version)));
    }
    if sealed != keys.encrypted() {
        return Err(Error::corrupt(format!("{name}: sealing does not match the volume's encryption")));
    }
    let head = bytes[..hlen].to_vec();
    let z = if sealed {
        keys.open(&head, bytes[hlen..].to_vec()).map_err(|e| Error::corrupt(format!("{name}: {}", e.message())))?
    } else {
        if bytes.len() < hlen + 32 {
            return Err(Error::corrupt(format!("{name} is truncated")));
        }
        let (body, sum) = bytes[hlen..].split_at(bytes.len() - hlen - 32);
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
            let b = backend.get_range(&n, 0, (HEADER_LEN_V2 as u64).min(v.size))?;
            Ok(Header::decode(&b, &n)?.0)
        })
        .collect()
}

/// Builds the metadata database at `path` from `chain` (a base and the
/// deltas after it): written beside it and renamed over it only when every
/// delta applied, so a failure leaves the old file. Every version must
/// follow the one before it ([`check_link`]). Returns the newest version
/// applied and the digest of its stored bytes.
pub fn rebuild(backend: &dyn Backend, keys: &Keys, chain: &[VersionInfo], path: &Path, progress: &dyn Fn(usize, usize)) -> Result<(u64, [u8; 32])> {
    let Some(first) = chain.first() else { return Err(Error::config("no metadata version to rebuild from")) };
    if first.kind != Kind::Base {
        return Err(Error::config("a metadata chain must start with a base"));
    }
    let tmp = path.with_extension("rebuild");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", tmp.display()));
    }
    // The digest of the version read last: the next one must name it.
    let last = std::cell::Cell::new(None::<(u64, [u8; 32])>);
    let get = |v: &VersionInfo| -> Result<Vec<u8>> {
        let n = v.object();
        let bytes = backend.get(&n).map_err(|e| Error::from(e).context(format_args!("reading metadata version {}", v.version)))?;
        let d = digest(&bytes);
        let (h, payload) = decode(keys, &n, v.version, bytes)?;
        if let Some((pv, pd)) = last.get() {
            check_link(&h, pv, &pd)?;
        }
        last.set(Some((v.version, d)));
        Ok(payload)
    };
    let base = get(first)?;
    crate::fsutil::create_private_file(&tmp).and_then(|mut f| std::io::Write::write_all(&mut f, &base)).map_err(|e| Error::os(format_args!("writing {}", tmp.display()), &e))?;
    drop(base);
    progress(1, chain.len());
    let mut rest = chain.iter().enumerate().skip(1);
    let at = std::cell::Cell::new(1);
    cairn_meta::shipped::apply_patchsets(
        &tmp,
        &mut || match rest.next() {
            None => Ok(None),
            Some((i, v)) => {
                at.set(i);
                Ok(Some((format!("metadata version {}", v.version), get(v)?)))
            }
        },
        &mut || {
            progress(at.get() + 1, chain.len());
            Ok(())
        },
    )?;
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
    Ok(last.get().expect("a version was read"))
}

/// Publishes version `v`; AlreadyExists means another writer published it.
/// Returns its stored size and digest (the next version names it).
pub fn publish(backend: &dyn Backend, keys: &Keys, h: &Header, payload: &[u8]) -> Result<(u64, [u8; 32])> {
    let bytes = encode(keys, h, payload)?;
    let n = object_name(h.version, h.kind);
    let d = digest(&bytes);
    match backend.put_if_absent(&n, &bytes) {
        Ok(()) => Ok((bytes.len() as u64, d)),
        Err(e) if e.kind() == cairn_backend::ErrorKind::AlreadyExists => {
            // Ours, if a retry followed a create whose reply was lost: the
            // sealed bytes (random nonce) or the checksum make it unique.
            if backend.get(&n).is_ok_and(|there| there == bytes) {
                return Ok((bytes.len() as u64, d));
            }
            Err(crate::lease::lost(&format!("metadata version {} was published by another mount", h.version)))
        }
        Err(e) => Err(Error::from(e).context(format_args!("uploading metadata version {}", h.version))),
    }
}

/// The digest of version `v`'s stored object (for a successor to name),
/// read from the bucket.
pub fn digest_of(backend: &dyn Backend, v: u64) -> Result<[u8; 32]> {
    let found = backend.list(&format!("{PREFIX}{v:016}."))?.into_iter().find_map(|o| parse_name(&o.name, o.size));
    let Some(info) = found else {
        return Err(Error::new(
            ErrorKind::Corrupt,
            format!("metadata version {v}, which this mount's state is built on, is missing from the bucket: the next version cannot name it. Unmount; `cairn meta list` and `cairn meta restore` repair the chain"),
        ));
    };
    let bytes = backend.get(&info.object()).map_err(|e| Error::from(e).context(format_args!("reading metadata version {v}")))?;
    Ok(digest(&bytes))
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
        // A missing delta is an error naming it (it once silently rolled
        // the volume back to version 2); the intact part is there for a
        // read-only mount.
        let gap = vec![v(1, Base), v(2, Delta), v(4, Delta)];
        let e = chain(&gap, None).unwrap_err();
        assert!(e.to_string().contains("metadata version 3 (meta/0000000000000003.base|.delta) is missing"), "{e}");
        assert!(e.to_string().contains("last intact state, version 2"), "{e}");
        assert_eq!(intact_prefix(&gap).unwrap().iter().map(|x| x.version).collect::<Vec<_>>(), vec![1, 2]);
        assert!(chain(&gap, Some(4)).is_err());
        assert_eq!(chain(&gap, Some(2)).unwrap().len(), 2);
        // A missing base in the middle: the deltas after it do not apply
        // to the older base.
        let no_base = vec![v(1, Base), v(2, Delta), v(4, Delta), v(5, Delta)];
        assert!(chain(&no_base, None).unwrap_err().to_string().contains("version 3 "));
        // Gaps below the newest base do not matter.
        let pruned = vec![v(1, Base), v(3, Base), v(4, Delta)];
        assert_eq!(chain(&pruned, None).unwrap().len(), 2);
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
            let h = Header { kind: Kind::Delta, version: 42, time: 1, writer: *b"abcdefgh", prev: Some(Prev { version: 41, digest: [9u8; 32] }) };
            let bytes = encode(&keys, &h, b"some rows").unwrap();
            let (h2, p) = decode(&keys, "x", 42, bytes.clone()).unwrap();
            assert_eq!((h2, p.as_slice()), (h, &b"some rows"[..]));
            assert!(decode(&keys, "x", 43, bytes.clone()).is_err(), "a renamed version is refused");
            for i in [3, HEADER_LEN - 1, HEADER_LEN + 2, HEADER_LEN_V2 - 1, HEADER_LEN_V2 + 2, bytes.len() - 1] {
                let mut bad = bytes.clone();
                bad[i] ^= 1;
                assert!(decode(&keys, "x", 42, bad).is_err(), "flipped byte {i} (encrypt {encrypt})");
            }
            assert!(decode(&keys, "x", 42, bytes[..bytes.len() - 5].to_vec()).is_err());
            assert!(decode(&Keys::derive(&[8u8; 32], encrypt), "x", 42, bytes).is_err(), "another volume's key");
        }
    }

    fn object(keys: &Keys, version: u64, kind: Kind, prev: Option<(u64, &[u8])>) -> (String, Vec<u8>) {
        let prev = prev.map(|(v, b)| Prev { version: v, digest: digest(b) });
        let h = Header { kind, version, time: 1, writer: [1; 8], prev };
        (object_name(version, kind), encode(keys, &h, format!("v{version}").as_bytes()).unwrap())
    }

    #[test]
    fn each_version_names_the_one_it_follows() {
        let keys = Keys::derive(&[7u8; 32], false);
        let (n1, b1) = object(&keys, 1, Kind::Base, None);
        let (n2, b2) = object(&keys, 2, Kind::Delta, Some((1, &b1)));
        let (n3, b3) = object(&keys, 3, Kind::Delta, Some((2, &b2)));
        let good = vec![(n1.clone(), b1.clone()), (n2.clone(), b2.clone()), (n3.clone(), b3.clone())];
        assert_eq!(verify_chain(&good).unwrap(), 3);
        // Version 2 replaced by another history's version 2: 3 does not follow it.
        let h = Header { kind: Kind::Delta, version: 2, time: 2, writer: [2; 8], prev: Some(Prev { version: 1, digest: digest(&b1) }) };
        let other2 = encode(&keys, &h, b"another history").unwrap();
        let mixed = vec![(n1.clone(), b1.clone()), (n2.clone(), other2), (n3.clone(), b3.clone())];
        let e = verify_chain(&mixed).unwrap_err();
        assert!(e.to_string().contains("two histories are mixed"), "{e}");
        // Version 2 missing: named.
        let gap = vec![(n1.clone(), b1.clone()), (n3.clone(), b3.clone())];
        assert!(verify_chain(&gap).unwrap_err().to_string().contains("version 2 "));
        // A format 1 version (no predecessor: written before this format)
        // is still read, and a format 2 version after it is checked.
        let mut head = [0u8; HEADER_LEN];
        head[..8].copy_from_slice(MAGIC);
        head[8] = Kind::Base.code();
        head[16..24].copy_from_slice(&1u64.to_le_bytes());
        let z = zstd::bulk::compress(b"old base", 3).unwrap();
        let mut old = head.to_vec();
        old.extend_from_slice(&z);
        old.extend_from_slice(&keys.checksum(CHECKSUM_DOMAIN, &[&head[..], &z[..]].concat()));
        let (h, payload) = decode(&keys, &n1, 1, old.clone()).unwrap();
        assert_eq!((h.prev, payload.as_slice()), (None, &b"old base"[..]));
        let (_, after_old) = object(&keys, 2, Kind::Delta, Some((1, &old)));
        assert_eq!(verify_chain(&[(n1.clone(), old.clone()), (n2.clone(), after_old)]).unwrap(), 2);
        let (h, _, len) = Header::decode(&old, "old").unwrap();
        assert_eq!((h.prev, len), (None, HEADER_LEN));
    }
}
