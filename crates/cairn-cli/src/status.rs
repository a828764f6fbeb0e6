//! `cairn status`: every Cairn mount on the machine, from the kernel's mount
//! table (type `fuse.cairn`), joined with the runtime registry (pid, local
//! directory, backend, start time: see `runtime.rs`) and each mount's own
//! answer on its control socket (health, bytes not yet in the backend).

use crate::runtime;
use anyhow::Result;
use cairn_engine::control::{self, Request};
use cairn_engine::health::{MountStatus, Problem};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

/// How long a mount may take to answer (it answers one request at a time,
/// so a `cairn stats` flushing a large write holds the answer back).
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// One mount, as `cairn status --json` prints it.
#[derive(Debug, Serialize)]
pub struct Row {
    pub mountpoint: PathBuf,
    /// The volume as it was named: its directory or s3://BUCKET/PREFIX.
    pub volume: String,
    /// Where the packs are (`local:DIR` or the bucket and endpoint).
    pub backend: Option<String>,
    /// The volume's local directory (control socket, journal, cache).
    pub local_dir: Option<PathBuf>,
    pub pid: Option<i32>,
    /// Unix seconds when it was mounted, and seconds since.
    pub started: Option<u64>,
    pub uptime_secs: Option<u64>,
    /// `ok`, `lease_lost`, `session_lost`, `backend_unreachable`, `degraded` (the mount's own judgement),
    /// `not_responding` (its daemon runs but does not answer), `dead` (its
    /// daemon is gone), or `unknown` (it cannot be asked: see `problems`).
    pub health: String,
    pub problems: Vec<Problem>,
    /// Bytes this machine holds that the backend does not have yet:
    /// journal plus packs waiting for upload.
    pub dirty_bytes: Option<u64>,
    pub journal_bytes: Option<u64>,
    pub upload_queue_bytes: Option<u64>,
    pub upload_queue_objects: Option<u64>,
    pub dirty_files: Option<u64>,
    pub read_only: Option<bool>,
    /// Where its Prometheus metrics are served (`--metrics`).
    pub metrics: Option<String>,
    /// A shared volume's PostgreSQL URL and this mount's session.
    pub metadata: Option<String>,
}

fn problem(what: &str, error: String) -> Problem {
    Problem { what: what.into(), error, since: 0, failures: 1 }
}

/// Every Cairn mount of this mount namespace.
pub fn rows() -> Result<Vec<Row>> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut out = Vec::new();
    for m in cairn_fuse::mounttable::entries()?.into_iter().filter(|m| m.fstype == "fuse.cairn") {
        // Every registry entry that names this mount, live or not: a dead
        // daemon's entry still tells whose mount it was.
        let entries: Vec<runtime::Entry> = runtime::read_all().into_iter().filter(|e| e.dev == m.dev && e.mountpoint == m.mount_point).collect();
        let live = entries.iter().find(|e| runtime::alive(e.pid)).cloned();
        let known = live.clone().or_else(|| entries.into_iter().next());
        let mut row = Row {
            mountpoint: m.mount_point.clone(),
            volume: m.source.to_string_lossy().into_owned(),
            backend: known.as_ref().map(|e| e.backend.clone()),
            local_dir: known.as_ref().map(|e| e.local_dir.clone()).or_else(|| runtime::local_dir_of(&m)),
            pid: known.as_ref().map(|e| e.pid),
            started: known.as_ref().map(|e| e.started),
            uptime_secs: known.as_ref().map(|e| now.saturating_sub(e.started)),
            health: String::new(),
            problems: Vec::new(),
            dirty_bytes: None,
            journal_bytes: None,
            upload_queue_bytes: None,
            upload_queue_objects: None,
            dirty_files: None,
            read_only: None,
            metrics: known.as_ref().and_then(|e| e.metrics.clone()),
            metadata: None,
        };
        if let Some(e) = known.as_ref().filter(|_| live.is_none()) {
            row.health = "dead".into();
            row.problems.push(problem("daemon", format!("its daemon (pid {}) is gone; unmount with `cairn umount {}`", e.pid, m.mount_point.display())));
            out.push(row);
            continue;
        }
        let Some(dir) = row.local_dir.clone() else {
            row.health = "unknown".into();
            row.problems.push(problem("daemon", format!("no entry for it in {} (mounted by another user, or by an older cairn)", runtime::dir().display())));
            out.push(row);
            continue;
        };
        let sock = control::socket_path(&dir);
        match control::call_within(&sock, &Request::Status, ANSWER_WITHIN) {
            Ok(Some(v)) => match serde_json::from_value::<MountStatus>(v) {
                Ok(s) => {
                    row.health = s.health;
                    row.problems = s.problems;
                    row.dirty_bytes = Some(s.dirty_bytes);
                    row.journal_bytes = Some(s.journal_bytes);
                    row.upload_queue_bytes = Some(s.upload_queue_bytes);
                    row.upload_queue_objects = Some(s.upload_queue_objects);
                    row.dirty_files = Some(s.dirty_files);
                    row.read_only = Some(s.read_only);
                    row.metadata = s.metadata;
                }
                Err(e) => {
                    row.health = "unknown".into();
                    row.problems.push(problem("daemon", format!("its answer on {} does not parse: {e}", sock.display())));
                }
            },
            Ok(None) => {
                row.health = "not_responding".into();
                row.problems.push(problem("daemon", format!("nothing listens on {}", sock.display())));
            }
            Err(e) if e.to_string().contains("Permission denied") => {
                row.health = "unknown".into();
                row.problems.push(problem("daemon", format!("{}: permission denied (ask as root or as the user who mounted it)", sock.display())));
            }
            Err(e) if e.kind() == cairn_engine::ErrorKind::Busy => {
                row.health = "not_responding".into();
                row.problems.push(problem("daemon", e.to_string()));
            }
            Err(e) => {
                row.health = "not_responding".into();
                row.problems.push(problem("daemon", format!("asking {}: {e}", sock.display())));
            }
        }
        out.push(row);
    }
    Ok(out)
}

/// `cairn status [--json]`.
pub fn run(json: bool) -> Result<i32> {
    let rows = rows()?;
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(0);
    }
    if rows.is_empty() {
        println!("no Cairn mounts");
        return Ok(0);
    }
    let opt = |v: Option<u64>, f: fn(u64) -> String| v.map_or("-".to_string(), f);
    println!("{:<28} {:<36} {:>8} {:>12} {:>10}  health", "mountpoint", "volume", "pid", "uptime", "dirty");
    for r in &rows {
        println!(
            "{:<28} {:<36} {:>8} {:>12} {:>10}  {}",
            r.mountpoint.display(),
            r.volume,
            r.pid.map_or("-".into(), |p| p.to_string()),
            opt(r.uptime_secs, |s| crate::show::human_duration(s as f64)),
            opt(r.dirty_bytes, crate::size::human),
            r.health
        );
        if let Some(b) = &r.backend {
            println!("    backend {b}");
        }
        if let Some(m) = &r.metadata {
            println!("    metadata {m}");
        }
        if let Some(m) = &r.metrics {
            match m.strip_prefix("unix:") {
                Some(path) => println!("    metrics on the socket {path} (curl --unix-socket {path} http://localhost/metrics)"),
                None => println!("    metrics http://{m}/metrics"),
            }
        }
        for p in &r.problems {
            let n = if p.failures > 1 { format!(" ({} times)", p.failures) } else { String::new() };
            println!("    {}: {}{n}", p.what, p.error);
        }
    }
    Ok(0)
}
