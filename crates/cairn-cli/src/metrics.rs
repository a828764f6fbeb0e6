//! `cairn mount --metrics ADDR`: the mount's counters in Prometheus' text
//! format at `http://ADDR/metrics` (prometheus-client encodes, tiny_http
//! serves; any other path is a 404), and `cairn top`, the same numbers as
//! rates in a terminal, read over the control socket.
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

/// A running metrics endpoint; stops when dropped.
pub struct Server {
    http: Arc<tiny_http::Server>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Where it listens (the port chosen, when asked for port 0).
    pub fn addr(&self) -> String {
        self.http.server_addr().to_string()
    }
}

/// Serves `vol`'s metrics at `http://addr/metrics` on a thread of its own.
/// Binding happens here, so a taken or bad address fails the mount.
pub fn serve(vol: &Arc<Volume>, addr: &str) -> Result<Server> {
    let http = Arc::new(tiny_http::Server::http(addr).map_err(|e| anyhow!("--metrics {addr}: cannot listen there: {e}"))?);
    let mut registry = Registry::default();
    registry.register_collector(Box::new(VolumeCollector(Arc::downgrade(vol))));
    let h = http.clone();
    let thread = std::thread::Builder::new()
        .name("cairn-metrics".into())
        .spawn(move || {
            for req in h.incoming_requests() {
                let path = req.url().split('?').next().unwrap_or("");
                let resp = if path == "/metrics" && matches!(req.method(), tiny_http::Method::Get | tiny_http::Method::Head) {
                    match render(&registry) {
                        Ok(body) => tiny_http::Response::from_string(body).with_header(header("Content-Type", "application/openmetrics-text; version=1.0.0; charset=utf-8")),
                        Err(e) => tiny_http::Response::from_string(format!("{e:#}\n")).with_status_code(500),
                    }
                } else {
                    tiny_http::Response::from_string("not found: Cairn serves its metrics at /metrics\n").with_status_code(404)
                };
                if let Err(e) = req.respond(resp) {
                    tracing::debug!("answering a metrics request: {e}");
                }
            }
        })
        .context("spawning the metrics thread")?;
    Ok(Server { http, thread: Some(thread) })
}

fn header(k: &str, v: &str) -> tiny_http::Header {
    tiny_http::Header::from_bytes(k.as_bytes(), v.as_bytes()).expect("a valid header")
}

impl Drop for Server {
    fn drop(&mut self) {
        self.http.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
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
        out.push_str(&format!("cairn top {what}   up {}   every {:.1}s\n", crate::human_duration(now.uptime_secs), interval.as_secs_f64()));
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
