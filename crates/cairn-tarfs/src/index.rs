//! The persistent member index: one SQLite file per archive, validated by
//! the archive's size, mtime and a BLAKE3 of its first and last 64 KiB.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cairn_tar::{DataRun, Member, MemberKind, Parser};
use rusqlite::{params, Connection, OpenFlags};
use tracing::{debug, info};

use crate::TarfsError;

/// Bumped whenever the schema or the meaning of a column changes.
const INDEX_VERSION: i64 = 1;
/// Bytes hashed at each end of the archive.
const FINGERPRINT_SPAN: u64 = 64 << 10;

/// How many times this process parsed an archive to build an index (tests
/// use it to prove a second mount did not re-parse).
static BUILDS: AtomicU64 = AtomicU64::new(0);

/// Number of index builds (archive parses) done by this process so far.
pub fn index_builds() -> u64 {
    BUILDS.load(Ordering::Relaxed)
}

/// What opening an archive's index did.
#[derive(Clone, Debug)]
pub struct IndexInfo {
    /// The archive, canonicalised.
    pub archive: PathBuf,
    /// The index file.
    pub path: PathBuf,
    /// Why the index was (re)built; None when a valid one was loaded.
    pub rebuilt: Option<String>,
    /// Members in the archive.
    pub members: usize,
    /// Time to load or build it.
    pub elapsed: Duration,
}

/// The default index directory: `$XDG_CACHE_HOME/cairn/tar-index`, or
/// `$HOME/.cache/cairn/tar-index`.
pub fn default_index_dir() -> PathBuf {
    index_dir_from(std::env::var_os("XDG_CACHE_HOME"), std::env::var_os("HOME"))
}

pub(crate) fn index_dir_from(xdg: Option<OsString>, home: Option<OsString>) -> PathBuf {
    // XDG says relative values are to be ignored.
    let base = match xdg.map(PathBuf::from).filter(|p| p.is_absolute()) {
        Some(x) => x,
        None => home
            .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from)
            .join(".cache"),
    };
    base.join("cairn").join("tar-index")
}

/// The index file for a canonical archive path.
pub fn index_path(dir: &Path, canonical_archive: &Path) -> PathBuf {
    let h = blake3::hash(canonical_archive.as_os_str().as_bytes());
    dir.join(format!("{}.sqlite", &h.to_hex()[..32]))
}

/// BLAKE3 of the first and last 64 KiB and the size.
fn fingerprint(f: &File, size: u64) -> io::Result<[u8; 32]> {
    let mut h = blake3::Hasher::new();
    let head = size.min(FINGERPRINT_SPAN);
    let mut buf = vec![0u8; head as usize];
    f.read_exact_at(&mut buf, 0)?;
    h.update(&buf);
    let tail = size.min(FINGERPRINT_SPAN);
    buf.resize(tail as usize, 0);
    f.read_exact_at(&mut buf, size - tail)?;
    h.update(&buf);
    h.update(&size.to_le_bytes());
    Ok(*h.finalize().as_bytes())
}

struct Identity {
    size: u64,
    mtime_ns: i64,
    fingerprint: [u8; 32],
}

fn kind_code(k: MemberKind) -> i64 {
    match k {
        MemberKind::File => 0,
        MemberKind::Dir => 1,
        MemberKind::Symlink => 2,
        MemberKind::HardLink => 3,
        MemberKind::Fifo => 4,
        MemberKind::CharDev => 5,
        MemberKind::BlockDev => 6,
    }
}

fn kind_from(c: i64) -> Option<MemberKind> {
    Some(match c {
        0 => MemberKind::File,
        1 => MemberKind::Dir,
        2 => MemberKind::Symlink,
        3 => MemberKind::HardLink,
        4 => MemberKind::Fifo,
        5 => MemberKind::CharDev,
        6 => MemberKind::BlockDev,
        _ => return None,
    })
}

fn encode_runs(runs: &[DataRun]) -> Vec<u8> {
    let mut v = Vec::with_capacity(runs.len() * 24);
    for r in runs {
        v.extend_from_slice(&r.file_offset.to_le_bytes());
        v.extend_from_slice(&r.archive_offset.to_le_bytes());
        v.extend_from_slice(&r.len.to_le_bytes());
    }
    v
}

fn decode_runs(b: &[u8]) -> Option<Vec<DataRun>> {
    if !b.len().is_multiple_of(24) {
        return None;
    }
    let u = |s: &[u8]| u64::from_le_bytes(s.try_into().unwrap_or_default());
    Some(
        b.chunks_exact(24)
            .map(|c| DataRun {
                file_offset: u(&c[0..8]),
                archive_offset: u(&c[8..16]),
                len: u(&c[16..24]),
            })
            .collect(),
    )
}

fn encode_xattrs(x: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut v = Vec::new();
    for (n, val) in x {
        v.extend_from_slice(&(n.len() as u32).to_le_bytes());
        v.extend_from_slice(n);
        v.extend_from_slice(&(val.len() as u32).to_le_bytes());
        v.extend_from_slice(val);
    }
    v
}

fn decode_xattrs(mut b: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut out = Vec::new();
    let take = |b: &mut &[u8]| -> Option<Vec<u8>> {
        let n = u32::from_le_bytes(b.get(..4)?.try_into().ok()?) as usize;
        let v = b.get(4..4 + n)?.to_vec();
        *b = &b[4 + n..];
        Some(v)
    };
    while !b.is_empty() {
        let n = take(&mut b)?;
        let v = take(&mut b)?;
        out.push((n, v));
    }
    Some(out)
}

const SCHEMA: &str = "
CREATE TABLE meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE members (
    seq INTEGER PRIMARY KEY,
    path BLOB NOT NULL,
    kind INTEGER NOT NULL,
    link BLOB,
    mode INTEGER NOT NULL,
    uid INTEGER NOT NULL,
    gid INTEGER NOT NULL,
    uname BLOB,
    gname BLOB,
    mtime_ns INTEGER NOT NULL,
    atime_ns INTEGER,
    ctime_ns INTEGER,
    dev_major INTEGER NOT NULL,
    dev_minor INTEGER NOT NULL,
    size INTEGER NOT NULL,
    header_offset INTEGER NOT NULL,
    runs BLOB NOT NULL,
    xattrs BLOB NOT NULL
);
";

/// Opens the index of `archive`, building it (a full header parse) when it
/// is missing, stale or unreadable. Returns the members in archive order.
pub fn open_index(
    archive: &Path,
    index_dir: Option<&Path>,
) -> Result<(Vec<Member>, IndexInfo), TarfsError> {
    let t0 = Instant::now();
    let ctx = |what: &str| {
        let what = what.to_string();
        move |e: io::Error| TarfsError::Io {
            what: format!("{what} {}", archive.display()),
            source: e,
        }
    };
    let canonical = fs::canonicalize(archive).map_err(ctx("cannot resolve"))?;
    let file = File::open(&canonical).map_err(ctx("cannot open"))?;
    let meta = file.metadata().map_err(ctx("cannot stat"))?;
    if !meta.is_file() {
        return Err(TarfsError::Io {
            what: format!("{} is not a regular file", archive.display()),
            source: io::Error::from(io::ErrorKind::InvalidInput),
        });
    }
    let id = Identity {
        size: meta.len(),
        mtime_ns: meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
        fingerprint: fingerprint(&file, meta.len()).map_err(ctx("cannot read"))?,
    };
    let dir = index_dir.map_or_else(default_index_dir, Path::to_path_buf);
    let path = index_path(&dir, &canonical);

    let reason = match load(&path, &canonical, &id) {
        Ok(members) => {
            let info = IndexInfo {
                archive: canonical,
                path,
                rebuilt: None,
                members: members.len(),
                elapsed: t0.elapsed(),
            };
            debug!(index = %info.path.display(), members = info.members, "tar index loaded");
            return Ok((members, info));
        }
        Err(reason) => reason,
    };
    info!(archive = %canonical.display(), "indexing tar archive: {reason}");
    BUILDS.fetch_add(1, Ordering::Relaxed);
    let members = Parser::new(&file, id.size).collect::<Result<Vec<_>, _>>()?;
    fs::create_dir_all(&dir).map_err(|e| TarfsError::Io {
        what: format!("cannot create the index directory {}", dir.display()),
        source: e,
    })?;
    store(&path, &canonical, &id, &members)?;
    let info = IndexInfo {
        archive: canonical,
        path,
        rebuilt: Some(reason),
        members: members.len(),
        elapsed: t0.elapsed(),
    };
    info!(
        index = %info.path.display(),
        members = info.members,
        secs = info.elapsed.as_secs_f64(),
        "tar index built"
    );
    Ok((members, info))
}

/// Loads a valid index; Err holds why it cannot be used.
fn load(path: &Path, archive: &Path, id: &Identity) -> Result<Vec<Member>, String> {
    if !path.exists() {
        return Err("no index yet".into());
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| format!("index unreadable ({e})"))?;
    let get = |k: &str| -> Result<Vec<u8>, String> {
        conn.query_row("SELECT value FROM meta WHERE key = ?1", [k], |r| {
            r.get::<_, Vec<u8>>(0)
        })
        .map_err(|e| format!("index unreadable ({k}: {e})"))
    };
    let num = |k: &str| -> Result<i64, String> {
        let v = get(k)?;
        std::str::from_utf8(&v)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("index field {k} is corrupt"))
    };
    if num("version")? != INDEX_VERSION {
        return Err("index from another version".into());
    }
    if get("archive")? != archive.as_os_str().as_bytes() {
        return Err("index of another archive".into());
    }
    if num("size")? != id.size as i64 {
        return Err("the archive's size changed".into());
    }
    if num("mtime_ns")? != id.mtime_ns {
        return Err("the archive's mtime changed".into());
    }
    if get("fingerprint")? != id.fingerprint {
        return Err("the archive's contents changed".into());
    }
    let count = num("members")?;
    let mut stmt = conn
        .prepare(
            "SELECT path, kind, link, mode, uid, gid, uname, gname, mtime_ns, atime_ns, ctime_ns,
                    dev_major, dev_minor, size, header_offset, runs, xattrs
             FROM members ORDER BY seq",
        )
        .map_err(|e| format!("index unreadable ({e})"))?;
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, Vec<u8>>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, Option<Vec<u8>>>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, i64>(4)?,
                r.get::<_, i64>(5)?,
                r.get::<_, Option<Vec<u8>>>(6)?,
                r.get::<_, Option<Vec<u8>>>(7)?,
                r.get::<_, i64>(8)?,
                r.get::<_, Option<i64>>(9)?,
                r.get::<_, Option<i64>>(10)?,
                (
                    r.get::<_, i64>(11)?,
                    r.get::<_, i64>(12)?,
                    r.get::<_, i64>(13)?,
                    r.get::<_, i64>(14)?,
                ),
                r.get::<_, Vec<u8>>(15)?,
                r.get::<_, Vec<u8>>(16)?,
            ))
        })
        .map_err(|e| format!("index unreadable ({e})"))?;
    let corrupt = || "index rows are corrupt".to_string();
    let mut out = Vec::with_capacity(usize::try_from(count).unwrap_or(0).min(1 << 20));
    for row in rows {
        let (
            path,
            kind,
            link,
            mode,
            uid,
            gid,
            uname,
            gname,
            mtime,
            atime,
            ctime,
            (maj, min, size, hoff),
            runs,
            xattrs,
        ) = row.map_err(|e| format!("index unreadable ({e})"))?;
        out.push(Member {
            path,
            kind: kind_from(kind).ok_or_else(corrupt)?,
            link_target: link,
            mode: mode as u32,
            uid: uid as u64,
            gid: gid as u64,
            uname,
            gname,
            mtime_ns: mtime,
            atime_ns: atime,
            ctime_ns: ctime,
            dev_major: maj as u32,
            dev_minor: min as u32,
            size: size as u64,
            xattrs: decode_xattrs(&xattrs).ok_or_else(corrupt)?,
            data: decode_runs(&runs).ok_or_else(corrupt)?,
            header_offset: hoff as u64,
        });
    }
    if out.len() as i64 != count {
        return Err("index is incomplete".into());
    }
    // Runs must stay inside the archive (a damaged index must not make
    // reads go astray).
    let bad = out.iter().flat_map(|m| &m.data).any(|r| {
        r.archive_offset
            .checked_add(r.len)
            .is_none_or(|e| e > id.size)
    });
    if bad {
        return Err(corrupt());
    }
    Ok(out)
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// Writes the index to a temporary file and renames it into place, so a
/// reader (another mount) never sees a half-written index.
fn store(path: &Path, archive: &Path, id: &Identity, members: &[Member]) -> Result<(), TarfsError> {
    let tmp = path.with_extension(format!(
        "tmp.{}.{}",
        std::process::id(),
        TMP_SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let res = (|| -> Result<(), TarfsError> {
        let _ = fs::remove_file(&tmp);
        let mut conn = Connection::open(&tmp)?;
        conn.execute_batch("PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;")?;
        conn.execute_batch(SCHEMA)?;
        let tx = conn.transaction()?;
        {
            let mut ins = tx.prepare(
                "INSERT INTO members (seq, path, kind, link, mode, uid, gid, uname, gname, mtime_ns,
                    atime_ns, ctime_ns, dev_major, dev_minor, size, header_offset, runs, xattrs)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)",
            )?;
            for (i, m) in members.iter().enumerate() {
                ins.execute(params![
                    i as i64,
                    m.path,
                    kind_code(m.kind),
                    m.link_target,
                    i64::from(m.mode),
                    m.uid as i64,
                    m.gid as i64,
                    m.uname,
                    m.gname,
                    m.mtime_ns,
                    m.atime_ns,
                    m.ctime_ns,
                    i64::from(m.dev_major),
                    i64::from(m.dev_minor),
                    m.size as i64,
                    m.header_offset as i64,
                    encode_runs(&m.data),
                    encode_xattrs(&m.xattrs),
                ])?;
            }
            let mut meta = tx.prepare("INSERT INTO meta (key, value) VALUES (?1, ?2)")?;
            let entries: [(&str, Vec<u8>); 6] = [
                ("version", INDEX_VERSION.to_string().into_bytes()),
                ("archive", archive.as_os_str().as_bytes().to_vec()),
                ("size", id.size.to_string().into_bytes()),
                ("mtime_ns", id.mtime_ns.to_string().into_bytes()),
                ("fingerprint", id.fingerprint.to_vec()),
                ("members", members.len().to_string().into_bytes()),
            ];
            for (k, v) in entries {
                meta.execute(params![k, v])?;
            }
        }
        tx.commit()?;
        drop(conn);
        File::open(&tmp)?.sync_all()?;
        fs::rename(&tmp, path)?;
        Ok(())
    })();
    if res.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_dir() {
        let d = index_dir_from(Some("/x/cache".into()), Some("/home/u".into()));
        assert_eq!(d, Path::new("/x/cache/cairn/tar-index"));
        let d = index_dir_from(None, Some("/home/u".into()));
        assert_eq!(d, Path::new("/home/u/.cache/cairn/tar-index"));
        let d = index_dir_from(Some("relative".into()), Some("/home/u".into()));
        assert_eq!(d, Path::new("/home/u/.cache/cairn/tar-index"));
    }

    #[test]
    fn blobs_roundtrip() {
        let runs = vec![
            DataRun {
                file_offset: 1,
                archive_offset: 2,
                len: 3,
            },
            DataRun {
                file_offset: u64::MAX - 1,
                archive_offset: 5,
                len: 6,
            },
        ];
        assert_eq!(decode_runs(&encode_runs(&runs)).unwrap(), runs);
        let x = vec![
            (b"user.a".to_vec(), b"".to_vec()),
            (b"user.b".to_vec(), vec![0, 1, 2]),
        ];
        assert_eq!(decode_xattrs(&encode_xattrs(&x)).unwrap(), x);
        assert!(decode_xattrs(&[9, 0, 0, 0, 1]).is_none());
        assert!(decode_runs(&[0; 23]).is_none());
    }
}
