//! The control channel into a running mount: a Unix socket `DIR/control.sock`
//! (mode 0600) speaking one JSON request line, one JSON reply line.
//!
//! ```text
//! -> {"op":"stats"}            <- {"ok":true,"result":{...Stats...}}   (after a sync)
//! -> {"op":"sync"}             <- {"ok":true,"result":null}
//! -> {"op":"status"}           <- {"ok":true,"result":{...MountStatus...}}   (no sync: answers while stuck)
//! -> {"op":"metrics"}          <- {"ok":true,"result":{...metrics::Snapshot...}}
//! -> {"op":"cost","since_day":N|null}  <- {"ok":true,"result":[{BillRow}...]}   (a volume in a bucket)
//! -> {"op":"clone","src":[..bytes..],"dst":[..bytes..]}   paths from the volume root
//!                              <- {"ok":true,"result":{"ino":N}}
//! -> {"op":"snapshot_create","name":"NAME"}  <- {"ok":true,"result":{SnapshotInfo}}
//! -> {"op":"snapshot_list"}    <- {"ok":true,"result":[{SnapshotInfo}...]}
//! -> {"op":"snapshot_delete","name":"NAME"}  <- {"ok":true,"result":null}
//! -> {"op":"archive_create","archive":[..],"members":[[name,path]..],"align":4096,"remove":false}
//! -> {"op":"archive_extract","archive":[..],"dest":[..],"consume":false}
//!                              <- {"ok":true,"result":{ArchiveReport}}
//!                              <- {"ok":false,"error":"message","errno":N}
//! -> {"op":"info","path":[..bytes..]}   <- {"ok":true,"result":{FileInfo}}   (a file's chunks and where they are)
//! -> {"op":"tree_stats","path":[..bytes..]}   <- {"ok":true,"result":{TreeStats}}   (after a sync)
//! -> {"op":"tier_set","path":[..bytes..],"pin":"cold","recursive":false}
//!                              <- {"ok":true,"result":{"pinned":N}}   (owner or root only, as chmod: EPERM)
//! -> {"op":"tier_status","path":[..bytes..]}   <- {"ok":true,"result":{TierStatus}}   (after a sync)
//! -> {"op":"recall","paths":[[..bytes..]..]}   files or trees into the local cache
//!                              (a volume in a local directory: into the OS page cache; `cairn warmup`)
//!                              <- {"progress":{"done":N,"total":M}}   (any number, every 100 ms or so)
//!                              <- {"ok":true,"result":{RecallReport}}
//! ```
//! A recall can take as long as the medium does; it runs on a thread of
//! its own so the socket keeps answering, and stops if the client goes.
//! It carries what POSIX has no call for. Content edits of one open file
//! (`rpwrite`) go through an ioctl on the file instead (see `cairn-fuse`),
//! which any user with the file open for writing may use; this socket is
//! the administrator's (mode 0600).

use crate::error::{Error, ErrorKind, Result};
use crate::maintenance;
use crate::types::Caller;
use crate::volume::{ArchiveOptions, ArchiveSource, CloneOptions, Volume};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// A request on the control channel.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Volume statistics of the committed state.
    Stats,
    /// Flush everything to the backend.
    Sync,
    /// Health and what is not yet in the backend ([`crate::health::MountStatus`]);
    /// flushes nothing.
    Status,
    /// Every counter and gauge ([`crate::metrics::Snapshot`]), for `cairn top`.
    Metrics,
    /// The bill's usage rows (`cost::BillRow`) from unix day `since_day`
    /// on, including requests counted but not saved yet. Sends no request
    /// to the bucket itself.
    Cost {
        #[serde(default)]
        since_day: Option<i64>,
    },
    /// What the cost-optimal cleaner would clean now, priced by `prices`
    /// (docs/frugal.md §5). Changes nothing.
    GcPlan { prices: crate::cost::Prices },
    /// Copy a file or tree sharing its data: `src` and `dst` are paths from
    /// the volume root (`dst` must not exist).
    Clone { src: Vec<u8>, dst: Vec<u8> },
    SnapshotCreate { name: String },
    SnapshotList,
    SnapshotDelete { name: String },
    /// Build the tar file `archive` from `members` (name in the archive,
    /// path in the volume), sharing their data; `remove` moves them in.
    ArchiveCreate { archive: Vec<u8>, members: Vec<(Vec<u8>, Vec<u8>)>, align: Option<u64>, remove: bool },
    /// Extract the tar file `archive` into directory `dest` (made if
    /// missing) without copying data; `consume` removes the archive.
    ArchiveExtract { archive: Vec<u8>, dest: Vec<u8>, consume: bool },
    /// Read the data of these files or trees (paths from the volume root)
    /// into the local cache in one pass in medium order ([`Volume::recall`]).
    /// Answered with progress lines before the reply ([`call_with_progress`]).
    Recall { paths: Vec<Vec<u8>> },
    /// Where the bytes of a file are (path from the volume root): its
    /// chunks, packs, references and places ([`crate::FileInfo`]).
    Info { path: Vec<u8> },
    /// A summary of the tree at `path` ([`crate::TreeStats`]), after a sync.
    TreeStats { path: Vec<u8> },
    /// Pin the file or tree at `path` to a tier ([`Volume::set_tier_pin_as`]:
    /// the caller must own each inode or be root). The pin is recorded;
    /// packs move when the tier planner runs.
    TierSet { path: Vec<u8>, pin: crate::TierPin, #[serde(default)] recursive: bool },
    /// The pin and the bytes by tier of the file or tree at `path`
    /// ([`crate::TierStatus`]), after a sync.
    TierStatus { path: Vec<u8> },
}

/// A progress line sent before the reply of a long request.
#[derive(Debug, Serialize, Deserialize)]
struct ProgressLine {
    progress: Progress,
}

/// Bytes done of bytes to do.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Progress {
    pub done: u64,
    pub total: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Reply {
    ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// The error's kind as an errno, so a client can exit like the call would.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    errno: Option<i32>,
}

/// The socket path of a volume directory.
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join("control.sock")
}

/// A running control server; stops and removes its socket when dropped.
pub struct Server {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Starts serving `vol` on `path` (replacing a stale socket).
pub fn serve(vol: &Arc<Volume>, path: &Path) -> Result<Server> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).map_err(|e| Error::io(format!("control socket {}: {e}", path.display())))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    let stop = Arc::new(AtomicBool::new(false));
    let weak: Weak<Volume> = Arc::downgrade(vol);
    let stop2 = stop.clone();
    let thread = std::thread::Builder::new()
        .name("cairn-control".into())
        .spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let Some(vol) = weak.upgrade() else { return };
                // One request at a time is plenty for administration (a
                // recall goes on on a thread of its own).
                if let Err(e) = handle(&vol, conn) {
                    tracing::warn!("control request failed: {e}");
                }
            }
        })
        .map_err(|e| Error::io(format!("spawning the control thread: {e}")))?;
    Ok(Server { path: path.to_path_buf(), stop, thread: Some(thread) })
}

fn handle(vol: &Arc<Volume>, conn: UnixStream) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut line = String::new();
    BufReader::new(&conn).take(16 << 20).read_line(&mut line)?;
    let caller = peer_caller(&conn);
    let reply = match serde_json::from_str::<Request>(&line) {
        Err(e) => Reply { ok: false, result: None, error: Some(format!("bad request: {e}")), errno: Some(libc::EINVAL) },
        Ok(Request::Recall { paths }) => {
            let vol = vol.clone();
            std::thread::Builder::new().name("cairn-recall".into()).spawn(move || {
                if let Err(e) = recall(&vol, &paths, caller, &conn) {
                    tracing::info!("recall: the client went away ({e})");
                }
            })?;
            return Ok(());
        }
        Ok(req) => to_reply(execute(vol, req, caller)),
    };
    send(&conn, &reply)
}

fn to_reply(r: Result<serde_json::Value>) -> Reply {
    match r {
        Ok(v) => Reply { ok: true, result: Some(v), error: None, errno: None },
        Err(e) => Reply { ok: false, result: None, error: Some(e.to_string()), errno: Some(e.errno()) },
    }
}

fn send(conn: &UnixStream, msg: &impl Serialize) -> std::io::Result<()> {
    let mut out = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
    out.push(b'\n');
    (&*conn).write_all(&out)
}

/// Runs a recall, sending progress lines, then the reply. A client that
/// has gone makes the next progress line fail, which stops the recall.
fn recall(vol: &Volume, paths: &[Vec<u8>], caller: Caller, conn: &UnixStream) -> std::io::Result<()> {
    let mut gone: Option<std::io::Error> = None;
    let r = (|| {
        let roots = recall_roots(vol, paths, caller)?;
        let mut last = std::time::Instant::now();
        let rep = vol.warmup(&roots, Some(caller), &mut |done, total| {
            if gone.is_none() && (last.elapsed() >= Duration::from_millis(100) || done == total) {
                last = std::time::Instant::now();
                if let Err(e) = send(conn, &ProgressLine { progress: Progress { done, total } }) {
                    gone = Some(e);
                }
            }
        })?;
        Ok(serde_json::to_value(rep).expect("the report serialises"))
    })();
    if let Some(e) = gone {
        return Err(e);
    }
    send(conn, &to_reply(r))
}

/// The connecting process's user and group (SO_PEERCRED).
fn peer_caller(conn: &UnixStream) -> Caller {
    use std::os::unix::io::AsRawFd;
    let mut cred = libc::ucred { pid: 0, uid: u32::MAX, gid: u32::MAX };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a valid socket, and `cred`/`len` describe a writable ucred.
    let rc = unsafe { libc::getsockopt(conn.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, &mut cred as *mut _ as *mut libc::c_void, &mut len) };
    if rc != 0 {
        return Caller { uid: u32::MAX, gid: u32::MAX };
    }
    Caller { uid: cred.uid, gid: cred.gid }
}

fn execute(vol: &Volume, req: Request, caller: Caller) -> Result<serde_json::Value> {
    let changes = !matches!(req, Request::SnapshotList | Request::Stats | Request::Sync | Request::Status | Request::Metrics | Request::Cost { .. } | Request::GcPlan { .. } | Request::Recall { .. } | Request::Info { .. } | Request::TreeStats { .. } | Request::TierStatus { .. });
    let v = execute_one(vol, req, caller)?;
    // A command that reports success has made its change durable (one WAL
    // fsync): `cairn clone` or `cairn snapshot create` followed by a power
    // cut must not come back without it.
    if changes {
        vol.sync_metadata()?;
    }
    Ok(v)
}

fn execute_one(vol: &Volume, req: Request, caller: Caller) -> Result<serde_json::Value> {
    match req {
        Request::Clone { src, dst } => {
            let src = vol.resolve(&src)?;
            let (parent, name) = vol.resolve_parent(&dst)?;
            let a = vol.clone_tree(src, parent, &name, CloneOptions { caller })?;
            Ok(serde_json::json!({ "ino": a.ino }))
        }
        Request::ArchiveCreate { archive, members, align, remove } => {
            let mut sources = Vec::with_capacity(members.len());
            for (name, path) in members {
                let ino = vol.resolve(&path).map_err(|e| e.context(String::from_utf8_lossy(&path)))?;
                let (parent, entry) = vol.resolve_parent(&path)?;
                sources.push(ArchiveSource { name, ino, parent, entry });
            }
            let (parent, name) = vol.resolve_parent(&archive)?;
            let rep = vol.archive_create(&sources, parent, &name, ArchiveOptions { align, remove, caller })?;
            Ok(serde_json::to_value(rep).expect("serialises"))
        }
        Request::ArchiveExtract { archive, dest, consume } => {
            let a = vol.resolve(&archive).map_err(|e| e.context(String::from_utf8_lossy(&archive)))?;
            let (parent, name) = vol.resolve_parent(&dest)?;
            let consume = if consume { Some(vol.resolve_parent(&archive)?) } else { None };
            let rep = vol.archive_extract(a, parent, &name, consume, caller)?;
            Ok(serde_json::to_value(rep).expect("serialises"))
        }
        Request::SnapshotCreate { name } => Ok(serde_json::to_value(vol.snapshot_create(&name)?).expect("serialises")),
        Request::SnapshotList => Ok(serde_json::to_value(vol.snapshot_list()?).expect("serialises")),
        Request::SnapshotDelete { name } => {
            vol.snapshot_delete(&name)?;
            Ok(serde_json::Value::Null)
        }
        Request::Stats => {
            // Report what was written, not only what happened to be flushed.
            vol.sync()?;
            Ok(serde_json::to_value(maintenance::stats(vol)?).expect("stats serialise"))
        }
        Request::Sync => {
            vol.sync()?;
            Ok(serde_json::Value::Null)
        }
        Request::Status => Ok(serde_json::to_value(vol.status()).expect("status serialises")),
        Request::Metrics => Ok(serde_json::to_value(vol.metrics_snapshot()).expect("metrics serialise")),
        Request::Cost { since_day } => Ok(serde_json::to_value(vol.bill_usage(since_day, true)?).expect("rows serialise")),
        Request::GcPlan { prices } => {
            let plan = crate::cleaner::plan(vol, crate::types::Timestamp::now().0, &prices)?;
            Ok(serde_json::to_value(plan).expect("plans serialise"))
        }
        Request::Recall { paths } => {
            let roots = recall_roots(vol, &paths, caller)?;
            Ok(serde_json::to_value(vol.warmup(&roots, Some(caller), &mut |_, _| {})?).expect("the report serialises"))
        }
        Request::Info { path } => Ok(serde_json::to_value(vol.info(&path, caller)?).expect("the info serialises")),
        Request::TreeStats { path } => Ok(serde_json::to_value(vol.tree_stats(&path, caller)?).expect("the stats serialise")),
        Request::TierSet { path, pin, recursive } => {
            let n = vol.set_tier_pin_as(&path, pin, recursive, caller)?;
            Ok(serde_json::json!({ "pinned": n }))
        }
        Request::TierStatus { path } => Ok(serde_json::to_value(vol.tier_status(&path, Some(caller))?).expect("the status serialises")),
    }
}


impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = UnixStream::connect(&self.path); // wake the accept loop
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Sends one request to a running mount. `Ok(None)` if nothing listens.
pub fn call(path: &Path, req: &Request) -> Result<Option<serde_json::Value>> {
    call_within(path, req, Duration::from_secs(600))
}

/// [`call`] for a request answered with progress lines first (a recall):
/// `progress` sees each; the wait for the next line, not for the whole
/// request, is bounded.
pub fn call_with_progress(path: &Path, req: &Request, progress: &mut dyn FnMut(Progress)) -> Result<Option<serde_json::Value>> {
    let timeout = Duration::from_secs(600);
    let Some(conn) = connect(path)? else { return Ok(None) };
    conn.set_read_timeout(Some(timeout))?;
    send(&conn, req)?;
    let mut lines = BufReader::new(&conn);
    loop {
        let mut line = String::new();
        let n = lines.read_line(&mut line).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Error::new(ErrorKind::Busy, format!("no word from {} for {timeout:?}", path.display())),
            _ => e.into(),
        })?;
        if n == 0 {
            return Err(Error::io(format!("the mount closed {} without an answer (did it stop?)", path.display())));
        }
        if let Ok(p) = serde_json::from_str::<ProgressLine>(&line) {
            progress(p.progress);
            continue;
        }
        return parse_reply(&line);
    }
}

/// The mount's socket, or None if nothing listens there.
fn connect(path: &Path) -> Result<Option<UnixStream>> {
    match UnixStream::connect(path) {
        Ok(c) => Ok(Some(c)),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused) => Ok(None),
        Err(e) => Err(Error::io(format!("control socket {}: {e}", path.display()))),
    }
}

/// The inodes of a recall's paths (from the volume root), reached as
/// `caller` would reach them.
fn recall_roots(vol: &Volume, paths: &[Vec<u8>], caller: Caller) -> Result<Vec<(crate::types::Ino, Vec<u8>)>> {
    paths.iter().map(|p| Ok((vol.resolve_as(p, caller, 4).map_err(|e| e.context(String::from_utf8_lossy(p)))?, p.clone()))).collect()
}

fn parse_reply(line: &str) -> Result<Option<serde_json::Value>> {
    let reply: Reply = serde_json::from_str(line).map_err(|e| Error::io(format!("bad reply from the mount: {e}")))?;
    if reply.ok {
        Ok(Some(reply.result.unwrap_or(serde_json::Value::Null)))
    } else {
        let kind = reply.errno.map_or(ErrorKind::Io, ErrorKind::from_errno);
        Err(Error::new(kind, reply.error.unwrap_or_else(|| "request failed".into())))
    }
}

/// [`call`], giving up (an error of kind `Busy`) when no answer comes
/// within `timeout` (the server answers one request at a time: a long one,
/// such as a `stats` that flushes, holds the next back).
pub fn call_within(path: &Path, req: &Request, timeout: Duration) -> Result<Option<serde_json::Value>> {
    let Some(conn) = connect(path)? else { return Ok(None) };
    conn.set_read_timeout(Some(timeout))?;
    send(&conn, req)?;
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line).map_err(|e| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Error::new(ErrorKind::Busy, format!("no answer from {} within {timeout:?}", path.display())),
        _ => e.into(),
    })?;
    parse_reply(&line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_over_the_socket() {
        let d = tempfile::tempdir().unwrap();
        crate::init(d.path(), &Default::default()).unwrap();
        let vol = Volume::load(d.path(), Default::default()).unwrap();
        let sock = socket_path(d.path());
        let server = serve(&vol, &sock).unwrap();
        let v = call(&sock, &Request::Stats).unwrap().unwrap();
        assert_eq!(v["directories"], 1);
        assert!(call(&sock, &Request::Sync).unwrap().is_some());
        drop(server);
        assert!(!sock.exists());
        assert!(call(&sock, &Request::Stats).unwrap().is_none());
    }
}
