//! `cairn mount --metrics ADDR`: the mount's counters in Prometheus' text
//! format at `http://ADDR/metrics` or on a Unix socket (prometheus-client
//! encodes, a small bounded server of our own answers; any other path is a
//! 404), and `cairn top`, the same numbers as rates in a terminal, read
//! over the control socket.
//!
//! Both read one [`Snapshot`] per scrape or refresh; the counters behind it
//! are atomics the engine and the FUSE adapter add to (no lock on the
//! request path, see `cairn_engine::metrics`).

use anyhow::{anyhow, bail, Context, Result};
use cairn_engine::metrics::Snapshot;
use cairn_engine::Volume;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Takes a snapshot of the volume at every scrape.
#[derive(Debug)]
struct VolumeCollector(Weak<Volume>);

type Fmt = std::fmt::Result;

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, unit: Option<&Unit>, v: u64) -> Fmt {
    ConstCounter::new(v).encode(e.encode_descriptor(name, help, unit, MetricType::Counter)?)
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, unit: Option<&Unit>, v: u64) -> Fmt {
    ConstGauge::new(v as i64).encode(e.encode_descriptor(name, help, unit, MetricType::Gauge)?)
}

/// A counter family with one label.
fn counters<'a>(e: &mut DescriptorEncoder, name: &str, help: &str, unit: Option<&Unit>, label: &str, rows: impl Iterator<Item = (&'a str, u64)>) -> Fmt {
    let mut fam = e.encode_descriptor(name, help, unit, MetricType::Counter)?;
    for (value, v) in rows {
        let labels = [(label, value)];
        ConstCounter::new(v).encode(fam.encode_family(&labels)?)?;
    }
    Ok(())
}

/// The whole snapshot as metric families.
fn encode(s: &Snapshot, mut e: DescriptorEncoder) -> Fmt {
    let e = &mut e;
    let ops = || s.ops.iter().map(|o| (o.op.as_str(), o));
    counters(e, "cairn_fuse_requests", "FUSE requests served, by operation", None, "op", ops().map(|(n, o)| (n, o.count)))?;
    counters(e, "cairn_fuse_request_errors", "FUSE requests answered with an error (ENOENT, ENODATA and the like included), by operation", None, "op", ops().map(|(n, o)| (n, o.errors)))?;
    {
        let mut fam = e.encode_descriptor("cairn_fuse_request_duration", "Time to serve a FUSE request, by operation", Some(&Unit::Seconds), MetricType::Histogram)?;
        for (name, o) in ops() {
            let bounds = s.latency_bounds.iter().copied().chain([f64::MAX]);
            let buckets: Vec<(f64, u64)> = bounds.zip(o.buckets.iter().copied()).collect();
            let labels = [("op", name)];
            fam.encode_family(&labels)?.encode_histogram::<NoLabelSet>(o.seconds, o.count, &buckets, None)?;
        }
    }
    counter(e, "cairn_kernel_read", "Bytes the kernel read from the mount", Some(&Unit::Bytes), s.kernel_read_bytes)?;
    counter(e, "cairn_kernel_written", "Bytes the kernel wrote to the mount", Some(&Unit::Bytes), s.kernel_write_bytes)?;
    counter(e, "cairn_chunked", "Bytes cut into chunks by flushes and edits", Some(&Unit::Bytes), s.chunked_bytes)?;
    counter(e, "cairn_deduplicated", "Chunked bytes that were stored already (not stored again)", Some(&Unit::Bytes), s.deduplicated_bytes)?;
    counter(e, "cairn_new_chunk", "Bytes of new chunks, before compression", Some(&Unit::Bytes), s.new_chunk_bytes)?;
    counter(e, "cairn_compressed", "Bytes of new chunks after compression and encryption", Some(&Unit::Bytes), s.compressed_bytes)?;
    counter(e, "cairn_stored", "Pack bytes written to the backend by flushes and edits (not gc)", Some(&Unit::Bytes), s.stored_bytes)?;
    counter(e, "cairn_chunks_written", "New chunks stored", None, s.new_chunks)?;
    counter(e, "cairn_packs_written", "Packs written by flushes and edits", None, s.packs_written)?;
    counter(e, "cairn_flushes", "Flush rounds that committed something", None, s.flushes)?;
    counter(e, "cairn_flush_rounds_raced", "Flush rounds that lost a chunk to another machine's writer and were prepared again", None, s.flush_rounds_raced)?;
    let caches = [("chunk", s.chunk_cache_hits, s.chunk_cache_misses), ("pack", s.pack_cache_hits, s.pack_cache_misses)];
    counters(e, "cairn_cache_hits", "Reads served by a cache: decoded chunks in memory, packs on local disk (a volume in a bucket)", None, "cache", caches.iter().map(|c| (c.0, c.1)))?;
    counters(e, "cairn_cache_misses", "Reads a cache could not serve", None, "cache", caches.iter().map(|c| (c.0, c.2)))?;
    counter(e, "cairn_pack_cache_fetched", "Bytes fetched from the bucket by pack cache misses", Some(&Unit::Bytes), s.pack_cache_fetched_bytes)?;
    counter(e, "cairn_pack_cache_evictions", "Clean pack cache entries evicted", None, s.pack_cache_evictions)?;
    gauge(e, "cairn_journal", "Bytes in the write-back journal (not yet chunked into packs)", Some(&Unit::Bytes), s.journal_bytes)?;
    gauge(e, "cairn_journal_limit", "Journal bytes at which writers wait for the flusher", Some(&Unit::Bytes), s.journal_limit)?;
    gauge(e, "cairn_flush_queue_files", "Files with changes waiting for the flusher", None, s.flush_queue_files)?;
    gauge(e, "cairn_upload_queue_objects", "Packs waiting for upload to the bucket", None, s.upload_queue_objects)?;
    gauge(e, "cairn_upload_queue", "Bytes of packs waiting for upload to the bucket", Some(&Unit::Bytes), s.upload_queue_bytes)?;
    gauge(e, "cairn_uptime", "Seconds since the volume was opened", Some(&Unit::Seconds), s.uptime_secs as u64)?;
    gauge(e, "cairn_pack", "Bytes of every pack (the cleaner's last look)", Some(&Unit::Bytes), s.pack_bytes)?;
    gauge(e, "cairn_dead", "Bytes of unreferenced chunks in packs (the cleaner's last look)", Some(&Unit::Bytes), s.dead_bytes)?;
    gauge(e, "cairn_dead_bound", "Most dead bytes the cleaner's bound allows", Some(&Unit::Bytes), s.dead_bound)?;
    gauge(e, "cairn_packs", "Packs in the volume (the cleaner's last look)", None, s.packs)?;
    gauge(e, "cairn_small_packs", "Packs below a quarter of the pack target", None, s.small_packs)?;
    counter(e, "cairn_cleaner_rounds", "Cleaning rounds run inside the mount", None, s.cleaner_rounds)?;
    counter(e, "cairn_cleaner_packs", "Packs the cleaner emptied (deleted or merged)", None, s.cleaner_packs)?;
    counter(e, "cairn_cleaner_moved", "Live bytes the cleaner copied into new packs", Some(&Unit::Bytes), s.cleaner_moved_bytes)?;
    counter(e, "cairn_cleaner_freed", "Dead bytes the cleaner freed", Some(&Unit::Bytes), s.cleaner_freed_bytes)?;
    if !s.backend.is_empty() {
        let rows = || s.backend.iter().map(|b| (b.kind.as_str(), b));
        counters(e, "cairn_backend_requests", "Requests sent to the bucket, by kind (failed attempts and retries included)", None, "kind", rows().map(|(k, b)| (k, b.requests)))?;
        counters(e, "cairn_backend_request", "Payload bytes of bucket requests, by kind (up for PUT and POST, down otherwise)", Some(&Unit::Bytes), "kind", rows().map(|(k, b)| (k, b.bytes)))?;
        counters(e, "cairn_backend_errors", "Bucket requests that failed, by kind (not-found answers excluded)", None, "kind", rows().map(|(k, b)| (k, b.errors)))?;
    }
    Ok(())
}

impl Collector for VolumeCollector {
    fn encode(&self, e: DescriptorEncoder) -> Fmt {
        match self.0.upgrade() {
            Some(v) => encode(&v.metrics_snapshot(), e),
            None => Ok(()),
        }
    }
}

/// The Prometheus text of `vol`'s counters now.
fn render(registry: &Registry) -> Result<String> {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).map_err(|e| anyhow!("encoding metrics: {e}"))?;
    Ok(out)
}

/// The series a reader of a TCP endpoint does not get on a volume whose
/// dedup domain is the whole volume: each tells whether written data was
/// stored already, so a local user could confirm another user's file
/// contents one guess at a time (docs/threat-model.md, "What dedup tells a
/// co-tenant"). The Unix socket (`unix:PATH`, 0600) serves them.
const CONTENT_REVEALING: &[&str] = &[
    "cairn_deduplicated",
    "cairn_new_chunk",
    "cairn_compressed",
    "cairn_stored",
    "cairn_chunks_written",
    "cairn_packs_written",
    "cairn_upload_queue",
    "cairn_backend_",
];

/// Drops the families named in [`CONTENT_REVEALING`] from `text`.
fn without_content_revealing(text: &str) -> String {
    let revealing = |name: &str| CONTENT_REVEALING.iter().any(|p| name.starts_with(p));
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let name = match line.strip_prefix("# ") {
            Some(meta) => meta.split_whitespace().nth(1).unwrap_or(""),
            None => line.split(['{', ' ']).next().unwrap_or(""),
        };
        if !revealing(name) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Limits of the endpoint, so that no client can take the mount's
/// threads, descriptors or memory (docs/threat-model.md): this many
/// connections are served at once and this many wait; one more is closed
/// as soon as it is accepted.
const WORKERS: usize = 2;
const WAITING: usize = 8;
/// A request (line and headers) longer than this is answered 431.
const MAX_REQUEST: usize = 8 << 10;
/// A client gets this long to send its request and this long to take the
/// answer; then the connection is closed (slow clients, slowloris).
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);

/// Where the endpoint listens.
enum Listener {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener),
}

/// One accepted connection.
trait Conn: std::io::Read + std::io::Write + Send {
    fn deadlines(&self, d: Duration) -> std::io::Result<()>;
}

impl Conn for std::net::TcpStream {
    fn deadlines(&self, d: Duration) -> std::io::Result<()> {
        self.set_nonblocking(false)?;
        self.set_read_timeout(Some(d))?;
        self.set_write_timeout(Some(d))
    }
}

impl Conn for std::os::unix::net::UnixStream {
    fn deadlines(&self, d: Duration) -> std::io::Result<()> {
        self.set_nonblocking(false)?;
        self.set_read_timeout(Some(d))?;
        self.set_write_timeout(Some(d))
    }
}

impl Listener {
    fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        match self {
            Listener::Tcp(l) => l.as_fd(),
            Listener::Unix(l) => l.as_fd(),
        }
    }

    fn accept(&self) -> std::io::Result<Box<dyn Conn>> {
        Ok(match self {
            Listener::Tcp(l) => Box::new(l.accept()?.0),
            Listener::Unix(l) => Box::new(l.accept()?.0),
        })
    }
}

/// A running metrics endpoint; stops when dropped.
pub struct Server {
    addr: String,
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    socket: Option<std::path::PathBuf>,
}

impl Server {
    /// Where it listens (the port chosen, when asked for port 0; `unix:PATH`
    /// for a socket).
    pub fn addr(&self) -> String {
        self.addr.clone()
    }
}

/// Binds `unix:PATH`: created under a temporary name, made 0600 (the
/// mounting user alone may connect), then renamed into place, so that no
/// one can connect in between. A stale socket nobody answers on is
/// replaced; anything else at PATH is left alone and refused.
fn bind_unix(path: &Path) -> Result<std::os::unix::net::UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if !m.file_type().is_socket() {
            bail!("{} exists and is not a socket", path.display());
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!("{} is in use (another mount's metrics?)", path.display());
        }
    }
    let tmp = path.with_file_name(format!(".{}.{}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("metrics"), std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let l = std::os::unix::net::UnixListener::bind(&tmp).with_context(|| format!("binding {}", tmp.display()))?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).and_then(|_| std::fs::rename(&tmp, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("placing the socket at {}", path.display()));
    }
    Ok(l)
}

/// Serves `vol`'s metrics at `http://addr/metrics` (or on the Unix socket
/// `unix:PATH`) from a small fixed set of threads. Binding happens here;
/// the caller decides what a taken or bad address means (the mount logs it
/// and goes on without metrics).
pub fn serve(vol: &Arc<Volume>, addr: &str) -> Result<Server> {
    let (listener, shown, socket) = match addr.strip_prefix("unix:") {
        Some(p) => {
            let path = std::path::PathBuf::from(p);
            if !path.is_absolute() {
                bail!("--metrics {addr}: the socket path must be absolute");
            }
            let l = bind_unix(&path).with_context(|| format!("--metrics {addr}"))?;
            (Listener::Unix(l), addr.to_string(), Some(path))
        }
        None => {
            let l = std::net::TcpListener::bind(addr).map_err(|e| anyhow!("--metrics {addr}: cannot listen there: {e}"))?;
            let shown = l.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| addr.to_string());
            (Listener::Tcp(l), shown, None)
        }
    };
    // A TCP port is open to every local user: unless no data is shared
    // across owners, it leaves out what tells whether data was stored.
    let full = matches!(listener, Listener::Unix(_)) || vol.dedup_domain() == cairn_engine::config::DedupDomain::Owner;
    let mut registry = Registry::default();
    registry.register_collector(Box::new(VolumeCollector(Arc::downgrade(vol))));
    let registry = Arc::new(registry);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::sync_channel::<Box<dyn Conn>>(WAITING);
    let rx = Arc::new(parking_lot::Mutex::new(rx));
    let mut threads = Vec::new();
    for i in 0..WORKERS {
        let (rx, registry) = (rx.clone(), registry.clone());
        let t = std::thread::Builder::new().name(format!("cairn-metrics-{i}")).spawn(move || loop {
            let next = rx.lock().recv();
            let Ok(conn) = next else { return };
            if let Err(e) = answer(conn, &registry, full) {
                tracing::debug!("a metrics request: {e}");
            }
        });
        threads.push(t.context("spawning a metrics thread")?);
    }
    let st = stop.clone();
    let accept = std::thread::Builder::new()
        .name("cairn-metrics".into())
        .spawn(move || {
            use std::os::fd::AsRawFd;
            let mut pfd = libc::pollfd { fd: listener.fd().as_raw_fd(), events: libc::POLLIN, revents: 0 };
            while !st.load(std::sync::atomic::Ordering::SeqCst) {
                // SAFETY: one valid pollfd for the listener, alive here.
                let n = unsafe { libc::poll(&mut pfd, 1, 200) };
                if n <= 0 {
                    continue;
                }
                match listener.accept() {
                    // Full: closed at once (dropped), no thread, no waiting fd.
                    Ok(c) => drop(tx.try_send(c)),
                    Err(e) => {
                        // EMFILE and the like: the listener stays, the
                        // connection waits in the kernel's backlog.
                        tracing::debug!("accepting a metrics connection: {e}");
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }
            drop(tx);
        })
        .context("spawning the metrics thread")?;
    threads.push(accept);
    Ok(Server { addr: shown, stop, threads, socket })
}

/// [`serve`], or `None` after logging why not: metrics are an extra that
/// must never keep a volume from mounting (a port another user took first,
/// a stale path).
pub fn serve_or_log(vol: &Arc<Volume>, addr: &str) -> Option<Server> {
    match serve(vol, addr) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::error!("no metrics endpoint: {e:#}; the volume is mounted without one");
            eprintln!("cairn: no metrics endpoint: {e:#}; mounting without one");
            None
        }
    }
}

/// Reads one request (bounded in size and time), answers it, closes.
fn answer(mut c: Box<dyn Conn>, registry: &Registry, full: bool) -> std::io::Result<()> {
    c.deadlines(Duration::from_secs(1))?;
    let started = Instant::now();
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p;
        }
        if buf.len() > MAX_REQUEST {
            let _ = c.write_all(b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
            return Ok(());
        }
        if started.elapsed() > REQUEST_DEADLINE {
            return Ok(());
        }
        match c.read(&mut chunk) {
            Ok(0) => return Ok(()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted) => continue,
            Err(e) => return Err(e),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]);
    let mut first = head.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (first.next().unwrap_or(""), first.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, ctype, body) = if path == "/metrics" && matches!(method, "GET" | "HEAD") {
        match render(registry) {
            Ok(text) => ("200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", if full { text } else { without_content_revealing(&text) }),
            Err(e) => ("500 Internal Server Error", "text/plain", format!("{e:#}\n")),
        }
    } else {
        ("404 Not Found", "text/plain", "not found: Cairn serves its metrics at /metrics\n".to_string())
    };
    c.deadlines(REQUEST_DEADLINE)?;
    let mut out = format!("HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len()).into_bytes();
    if method != "HEAD" {
        out.extend_from_slice(body.as_bytes());
    }
    c.write_all(&out)?;
    c.flush()
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for t in self.threads.drain(..).rev() {
            let _ = t.join();
        }
        if let Some(p) = &self.socket {
            let _ = std::fs::remove_file(p);
        }
    }
}

// ---------------------------------------------------------------- cairn top

/// The metrics snapshot of the mount whose control socket is `sock`.
fn snapshot_of(sock: &Path) -> Result<Snapshot> {
    let v = cairn_engine::control::call_within(sock, &cairn_engine::control::Request::Metrics, Duration::from_secs(5))?
        .ok_or_else(|| anyhow!("nothing answers on {} (is the mount's daemon running?)", sock.display()))?;
    serde_json::from_value(v).context("reading the metrics from the mount (a daemon of another version?)")
}

/// The control socket of the Cairn mount at `mnt`.
pub fn socket_of(mnt: &Path) -> Result<std::path::PathBuf> {
    let mp = std::fs::canonicalize(mnt).with_context(|| format!("{}", mnt.display()))?;
    let m = cairn_fuse::mounttable::mount_entry(&mp)?.ok_or_else(|| anyhow!("{} is not a mount point", mp.display()))?;
    let dir = crate::runtime::local_dir_of(&m).ok_or_else(|| anyhow!("{} is not a Cairn mount (it is {})", mp.display(), m.fstype))?;
    Ok(cairn_engine::control::socket_path(&dir))
}

/// Per-second rates between two snapshots `secs` apart.
pub fn rates(a: &Snapshot, b: &Snapshot, secs: f64) -> Vec<(&'static str, String)> {
    let per = |x: u64, y: u64| (y.saturating_sub(x)) as f64 / secs.max(1e-9);
    let bytes = |x: u64, y: u64| format!("{}/s", crate::size::human(per(x, y) as u64));
    let count = |x: u64, y: u64| format!("{:.0}/s", per(x, y));
    let reqs = |s: &Snapshot| s.ops.iter().map(|o| o.count).sum::<u64>();
    let busy = |s: &Snapshot| s.ops.iter().map(|o| o.seconds).sum::<f64>();
    let n = reqs(b).saturating_sub(reqs(a));
    let lat = if n == 0 { "-".to_string() } else { format!("{:.0}µs", (busy(b) - busy(a)) / n as f64 * 1e6) };
    let ratio = |h: u64, m: u64| if h + m == 0 { "-".to_string() } else { format!("{:.0}%", 100.0 * h as f64 / (h + m) as f64) };
    let backend = |s: &Snapshot, f: fn(&cairn_engine::metrics::BackendStat) -> u64| s.backend.iter().map(f).sum::<u64>();
    vec![
        ("fuse ops", count(reqs(a), reqs(b))),
        ("avg latency", lat),
        ("kernel read", bytes(a.kernel_read_bytes, b.kernel_read_bytes)),
        ("kernel write", bytes(a.kernel_write_bytes, b.kernel_write_bytes)),
        ("chunked", bytes(a.chunked_bytes, b.chunked_bytes)),
        ("deduplicated", bytes(a.deduplicated_bytes, b.deduplicated_bytes)),
        ("compressed", bytes(a.compressed_bytes, b.compressed_bytes)),
        ("stored", bytes(a.stored_bytes, b.stored_bytes)),
        ("chunk cache hits", ratio(b.chunk_cache_hits.saturating_sub(a.chunk_cache_hits), b.chunk_cache_misses.saturating_sub(a.chunk_cache_misses))),
        ("pack cache hits", ratio(b.pack_cache_hits.saturating_sub(a.pack_cache_hits), b.pack_cache_misses.saturating_sub(a.pack_cache_misses))),
        ("journal", format!("{} of {}", crate::size::human(b.journal_bytes), crate::size::human(b.journal_limit))),
        ("flush queue", format!("{} files", b.flush_queue_files)),
        ("upload queue", format!("{} in {} packs", crate::size::human(b.upload_queue_bytes), b.upload_queue_objects)),
        ("backend requests", count(backend(a, |x| x.requests), backend(b, |x| x.requests))),
        ("backend errors", count(backend(a, |x| x.errors), backend(b, |x| x.errors))),
    ]
}

/// `cairn top MNT`: the rates of the mount whose control socket is `sock`
/// (shown as `what`) every `interval`, `count` times (or until
/// interrupted); on a terminal the screen is redrawn in place.
pub fn top(sock: &Path, what: &str, interval: Duration, count: Option<u64>) -> Result<i32> {
    use std::io::{IsTerminal, Write};
    if interval.is_zero() {
        bail!("--interval must be above 0");
    }
    let tty = std::io::stdout().is_terminal();
    let mut prev = snapshot_of(sock)?;
    let mut at = Instant::now();
    let mut shown = 0;
    // On a terminal, q (or Ctrl-C) stops it, as in top(1).
    let keys = Keys::new();
    while count.is_none_or(|c| shown < c) {
        if keys.as_ref().map_or_else(|| {
            std::thread::sleep(interval);
            false
        }, |k| k.quit_within(interval)) {
            break;
        }
        let now = snapshot_of(sock)?;
        let secs = at.elapsed().as_secs_f64();
        at = Instant::now();
        let rows = rates(&prev, &now, secs);
        let mut out = String::new();
        if tty {
            out.push_str("\x1b[H\x1b[2J");
        }
        out.push_str(&format!("cairn top {what}   up {}   every {:.1}s\n", crate::show::human_duration(now.uptime_secs), interval.as_secs_f64()));
        for (k, v) in &rows {
            out.push_str(&format!("  {k:<18} {v:>18}\n"));
        }
        // The busiest operations of the interval.
        let mut ops: Vec<(&str, u64, f64)> = now.ops.iter().zip(&prev.ops).map(|(b, a)| (b.op.as_str(), b.count.saturating_sub(a.count), b.seconds - a.seconds)).filter(|(_, n, _)| *n > 0).collect();
        ops.sort_by_key(|o| std::cmp::Reverse(o.1));
        for (op, n, secs_in) in ops.iter().take(6) {
            out.push_str(&format!("  op {op:<15} {:>12.0}/s {:>9.0}µs avg\n", *n as f64 / secs, secs_in / *n as f64 * 1e6));
        }
        if !tty {
            out.push('\n');
        }
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(out.as_bytes())?;
        stdout.flush()?;
        prev = now;
        shown += 1;
    }
    Ok(0)
}

/// Single keys from a terminal on standard input (no line editing, no
/// echo) while `cairn top` runs; the terminal is restored when it drops,
/// also after Ctrl-C, which is caught and read as `q`.
struct Keys {
    saved: libc::termios,
}

static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
}

impl Keys {
    /// None when standard input is not a terminal.
    fn new() -> Option<Keys> {
        use std::io::IsTerminal;
        if !std::io::stdin().is_terminal() {
            return None;
        }
        // SAFETY: termios is plain data filled by tcgetattr; fd 0 is a terminal.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        if unsafe { libc::tcgetattr(0, &mut t) } != 0 {
            return None;
        }
        let saved = t;
        t.c_lflag &= !(libc::ICANON | libc::ECHO);
        t.c_cc[libc::VMIN] = 1;
        t.c_cc[libc::VTIME] = 0;
        // SAFETY: a handler that only stores an atomic; sigaction is
        // filled before use; SA_RESTART is off so that poll returns EINTR.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_interrupt as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
            libc::tcsetattr(0, libc::TCSANOW, &t);
        }
        Some(Keys { saved })
    }

    /// Waits `d` for a key; true when it was q or Q (or Ctrl-C came).
    fn quit_within(&self, d: Duration) -> bool {
        let end = Instant::now() + d;
        loop {
            if INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) {
                return true;
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let mut p = libc::pollfd { fd: 0, events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut p, 1, left.as_millis().min(i32::MAX as u128) as i32) };
            if n > 0 {
                let mut b = [0u8; 16];
                // SAFETY: reading into a local buffer.
                let r = unsafe { libc::read(0, b.as_mut_ptr().cast(), b.len()) };
                if r <= 0 {
                    // End of input: no more keys will come; just wait.
                    std::thread::sleep(left);
                    return false;
                }
                if b[..r as usize].iter().any(|c| matches!(c, b'q' | b'Q')) {
                    return true;
                }
            }
        }
    }
}

impl Drop for Keys {
    fn drop(&mut self) {
        // SAFETY: restores the attributes read in `new`.
        unsafe { libc::tcsetattr(0, libc::TCSANOW, &self.saved) };
    }
}
