//! Volumes in a bucket, through real mounts, on a real S3-compatible server
//! (moto, started by scripts/test.sh; CAIRN_TEST_S3_ENDPOINT and
//! CAIRN_TEST_S3_BUCKET name it). Failures come from a TCP proxy between
//! the mount and the server ([`Proxy`]): it resets a chosen share of
//! requests, or stops answering, while the server itself stays real; it
//! also counts the requests it forwards, the referee of `cairn cost`.

use crate::common::*;
use crate::roundtrip::{build_tree_with, check_copy};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

pub(crate) fn s3_env() -> (String, String) {
    let ep = std::env::var("CAIRN_TEST_S3_ENDPOINT")
        .expect("CAIRN_TEST_S3_ENDPOINT is not set: run these tests through scripts/test.sh, which starts an S3-compatible server (moto)");
    let bucket = std::env::var("CAIRN_TEST_S3_BUCKET").expect("CAIRN_TEST_S3_BUCKET is not set (see scripts/test.sh)");
    (ep, bucket)
}

/// A volume in the test bucket under a fresh prefix, with local
/// directories for two "machines".
pub(crate) struct Cloud {
    pub(crate) env: Env,
    pub(crate) url: String,
    endpoint: String,
    pass: PathBuf,
}

impl Cloud {
    pub(crate) fn new(name: &str, encrypt: bool, endpoint: Option<&str>) -> Cloud {
        Self::with_pack_size(name, encrypt, endpoint, "8M")
    }

    fn with_pack_size(name: &str, encrypt: bool, endpoint: Option<&str>, pack_size: &str) -> Cloud {
        let (ep, bucket) = s3_env();
        let env = Env::bare(name);
        let url = format!("s3://{bucket}/{}", env.root.file_name().unwrap().to_string_lossy());
        let pass = env.path("pass");
        fs::write(&pass, "correct horse battery staple\n").unwrap();
        let c = Cloud { env, url, endpoint: endpoint.map(str::to_string).unwrap_or(ep), pass };
        let mut args = vec!["init".to_string(), c.url.clone(), "--cache-dir".into(), c.dir("a").display().to_string(), "--endpoint".into(), c.endpoint.clone(), "--pack-size".into(), pack_size.into()];
        if encrypt {
            args.extend(["--encrypt".into(), "--passphrase-file".into(), c.pass.display().to_string()]);
        }
        cairn_ok(&args);
        c
    }

    /// A local directory ("machine") of this volume.
    pub(crate) fn dir(&self, machine: &str) -> PathBuf {
        self.env.path(&format!("cache-{machine}"))
    }

    fn args(&self, machine: &str, extra: &[&str]) -> Vec<String> {
        let mut a = vec!["--cache-dir".to_string(), self.dir(machine).display().to_string(), "--endpoint".into(), self.endpoint.clone(), "--passphrase-file".into(), self.pass.display().to_string()];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    }

    pub(crate) fn mount(&self, machine: &str, extra: &[&str]) -> Mount {
        self.try_mount(machine, extra).unwrap_or_else(|out| panic!("mount failed: {out}"))
    }

    fn try_mount(&self, machine: &str, extra: &[&str]) -> Result<Mount, Out> {
        let a = self.args(machine, extra);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        Mount::new(Path::new(&self.url), &self.env.mnt, &a)
    }

    fn cairn(&self, cmd: &str, machine: &str, extra: &[&str]) -> Out {
        let mut a = vec![cmd.to_string(), self.url.clone()];
        a.extend(self.args(machine, extra));
        cairn(&a)
    }

    fn log(&self, machine: &str) -> String {
        fs::read_to_string(self.dir(machine).join("cairn.log")).unwrap_or_default()
    }
}

/// The issue's first test: a mixed tree written through a mount on S3,
/// unmounted, the local directory removed, mounted from the bucket alone in
/// a fresh directory and compared byte for byte and attribute for
/// attribute; fsck and stats work on the bucket URL; gc too.
#[test]
fn a_mixed_tree_mounts_from_the_bucket_alone() {
    let _serial = serial();
    let c = Cloud::new("cloud-tree", true, None);
    let src = c.env.path("src");
    build_tree_with(&src, 600, 6 * MIB);
    let m = c.mount("a", &[]);
    let out = run(Command::new("cp").arg("-a").arg(format!("{}/.", src.display())).arg(m.path()));
    assert!(out.ok(), "cp -a: {out}");
    m.umount();
    fs::remove_dir_all(c.dir("a")).unwrap();
    let t = Instant::now();
    let m = c.mount("b", &[]);
    eprintln!("cloud: mounted from the bucket alone in {:.2?}", t.elapsed());
    check_copy(&src, m.path(), "from the bucket");
    let stats = {
        let out = c.cairn("stats", "b", &["--json"]);
        assert!(out.ok(), "{out}");
        serde_json::from_str::<serde_json::Value>(&out.stdout).unwrap()
    };
    assert!(stats["cache"]["misses"].as_u64().unwrap() > 0, "{stats}");
    assert!(stats["cache"]["bytes_fetched"].as_u64().unwrap() > 18 * MIB, "{stats}");
    m.umount();
    let out = c.cairn("fsck", "b", &["--read-data", "--json"]);
    let rep: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(out.ok() && rep["errors"].as_array().unwrap().is_empty(), "{out}");
    let out = c.cairn("gc", "b", &["--json"]);
    assert!(out.ok(), "{out}");
    // The cache survived the unmount: the second pass fetches nothing.
    let m = c.mount("b", &[]);
    check_copy(&src, m.path(), "from the cache");
    let s: serde_json::Value = serde_json::from_str(&c.cairn("stats", "b", &["--json"]).stdout).unwrap();
    assert_eq!(s["cache"]["remote_gets"].as_u64(), Some(0), "reads after a remount fetched again: {s}");
    m.umount();
}

/// Writes `n` files of `len` bytes with fsync each (python, so each file
/// is fsync'd before the next starts); returns their names and seeds.
pub(crate) fn fsync_files(dir: &Path, n: u64, len: u64, seed: u64) -> Out {
    let script = r#"
import os, sys, random
d, n, ln, seed = sys.argv[-4], int(sys.argv[-3]), int(sys.argv[-2]), int(sys.argv[-1])
for i in range(n):
    r = random.Random(seed + i)
    data = r.randbytes(ln)
    with open(os.path.join(d, f"f{i}"), "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    print(i, flush=True)
"#;
    python(script, &[dir.as_os_str(), OsStr::new(&n.to_string()), OsStr::new(&len.to_string()), OsStr::new(&seed.to_string())], None)
}

pub(crate) fn expected(seed: u64, i: u64, len: u64) -> Vec<u8> {
    let script = "import random,sys; sys.stdout.buffer.write(random.Random(int(sys.argv[1])).randbytes(int(sys.argv[2])))";
    let out = Command::new("python3").args(["-c", script, &(seed + i).to_string(), &len.to_string()]).output().unwrap_or_else(|e| panic!("this test needs python3 (apt-get install -y python3): {e}"));
    assert!(out.status.success());
    out.stdout
}

/// kill -9 of the daemon during uploads. `remote`: every fsync'd file is in
/// the bucket (read from another directory). `local`: everything fsync'd is
/// there after a remount on the same machine.
#[test]
fn kill9_during_uploads_loses_no_fsynced_byte() {
    let _serial = serial();
    for durability in ["remote", "local"] {
        let c = Cloud::new(&format!("cloud-kill-{durability}"), false, None);
        let mut m = c.mount("a", &["--durability", durability]);
        let out = fsync_files(m.path(), 12, 3 * MIB, 500);
        assert!(out.ok(), "{out}");
        // A large unsynced write keeps the uploader busy when the kill lands.
        let _ = fs::write(m.join("unsynced"), gen(9, 20 * MIB as usize));
        m.kill9();
        m.detach();
        let machine = if durability == "remote" { "b" } else { "a" };
        let extra: &[&str] = if durability == "remote" { &["--force"] } else { &[] };
        let m = c.mount(machine, extra);
        for i in 0..12 {
            let got = fs::read(m.join(&format!("f{i}"))).unwrap_or_else(|e| panic!("{durability}: f{i}: {e}"));
            assert!(got == expected(500, i, 3 * MIB), "{durability}: f{i} differs after kill -9");
        }
        m.umount();
    }
}

/// A TCP proxy in front of the S3 server: it can reset a share of requests
/// (half before the server sees them, half after, so the reply is lost) and
/// stop answering altogether (the port closed, live connections cut). It
/// counts the requests it forwards by the kind S3 bills ([`Proxy::seen`]).
pub(crate) struct Proxy {
    port: u16,
    seen: Arc<Mutex<BTreeMap<String, u64>>>,
    up: Arc<AtomicBool>,
    fault_per_mille: Arc<AtomicU64>,
    faults: Arc<AtomicU64>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    pub(crate) fn start(upstream: &str) -> Proxy {
        let up_addr: SocketAddr = upstream.trim_start_matches("http://").trim_end_matches('/').parse().expect("endpoint host:port");
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let p = Proxy {
            port,
            seen: Arc::new(Mutex::new(BTreeMap::new())),
            up: Arc::new(AtomicBool::new(true)),
            fault_per_mille: Arc::new(AtomicU64::new(0)),
            faults: Arc::new(AtomicU64::new(0)),
            conns: Arc::new(Mutex::new(Vec::new())),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let (up, rate, faults, conns, stop, seen) = (p.up.clone(), p.fault_per_mille.clone(), p.faults.clone(), p.conns.clone(), p.stop.clone(), p.seen.clone());
        std::thread::spawn(move || {
            let mut listener = Some(l);
            let mut seed = 0x9e3779b97f4a7c15u64;
            while !stop.load(Ordering::SeqCst) {
                if !up.load(Ordering::SeqCst) {
                    if listener.take().is_some() {
                        for c in conns.lock().unwrap().drain(..) {
                            let _ = c.shutdown(std::net::Shutdown::Both);
                        }
                    }
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                if listener.is_none() {
                    listener = TcpListener::bind(("127.0.0.1", port)).ok();
                    if listener.is_none() {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    }
                }
                let l = listener.as_ref().unwrap();
                l.set_nonblocking(true).unwrap();
                match l.accept() {
                    Ok((client, _)) => {
                        client.set_nonblocking(false).unwrap();
                        let Ok(server) = TcpStream::connect(up_addr) else { continue };
                        conns.lock().unwrap().push(client.try_clone().unwrap());
                        conns.lock().unwrap().push(server.try_clone().unwrap());
                        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                        let (rate, faults, seen) = (rate.clone(), faults.clone(), seen.clone());
                        let conn_seed = seed;
                        std::thread::spawn(move || pump_requests(client, server, conn_seed, &rate, &faults, &seen));
                        std::thread::spawn(move || pump(s2, c2));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        p
    }

    pub(crate) fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn set_faults(&self, per_mille: u64) {
        self.fault_per_mille.store(per_mille, Ordering::SeqCst);
    }

    pub(crate) fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::SeqCst);
    }

    /// Requests forwarded so far by kind: GET, HEAD, PUT, POST, DELETE, and
    /// LIST for a GET of a listing (`?list-type=2`).
    fn seen(&self) -> BTreeMap<String, u64> {
        self.seen.lock().unwrap().clone()
    }
}

/// Finds where each HTTP/1.1 request starts in a client's byte stream (the
/// header ends at a blank line, the body is Content-Length bytes), so a
/// request is counted once however the stream is cut into reads.
#[derive(Default)]
struct RequestStarts {
    head: Vec<u8>,
    body_left: u64,
}

impl RequestStarts {
    /// The kinds of the requests whose headers end in `data`.
    fn feed(&mut self, mut data: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        while !data.is_empty() {
            if self.body_left > 0 {
                let n = (self.body_left as usize).min(data.len());
                self.body_left -= n as u64;
                data = &data[n..];
                continue;
            }
            self.head.extend_from_slice(data);
            data = &[];
            while let Some(end) = self.head.windows(4).position(|w| w == b"\r\n\r\n") {
                let rest = self.head.split_off(end + 4);
                let head = String::from_utf8_lossy(&self.head).into_owned();
                let mut words = head.split_whitespace();
                let (method, target) = (words.next().unwrap_or("").to_string(), words.next().unwrap_or(""));
                let lower = head.to_ascii_lowercase();
                assert!(!lower.contains("transfer-encoding: chunked"), "a chunked request: the proxy cannot count it\n{head}");
                let body: u64 = lower.lines().find_map(|l| l.strip_prefix("content-length:")).map_or(0, |v| v.trim().parse().expect("content-length"));
                out.push(if method == "GET" && target.contains("list-type=") { "LIST".to_string() } else { method });
                // What follows: this request's body, then maybe the next one.
                let skip = (body as usize).min(rest.len());
                self.body_left = body - skip as u64;
                self.head = rest[skip..].to_vec();
            }
        }
        out
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
    let _ = from.shutdown(std::net::Shutdown::Both);
}

/// Client to server, resetting a share of the requests that start in a read,
/// and counting the requests it forwards.
fn pump_requests(mut from: TcpStream, mut to: TcpStream, mut seed: u64, rate: &AtomicU64, faults: &AtomicU64, seen: &Mutex<BTreeMap<String, u64>>) {
    let mut buf = vec![0u8; 64 << 10];
    let mut starts = RequestStarts::default();
    let mut count = |bytes: &[u8]| {
        for kind in starts.feed(bytes) {
            *seen.lock().unwrap().entry(kind).or_default() += 1;
        }
    };
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let starts_request = [&b"GET "[..], b"PUT ", b"POST", b"HEAD", b"DELE"].iter().any(|m| buf[..n].starts_with(m));
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let draw = seed % 1000;
        let r = rate.load(Ordering::SeqCst);
        if starts_request && draw < r {
            faults.fetch_add(1, Ordering::SeqCst);
            if draw % 2 == 1 {
                // The server gets the request; the client never hears back.
                count(&buf[..n]);
                let _ = to.write_all(&buf[..n]);
                std::thread::sleep(Duration::from_millis(50));
            }
            break;
        }
        count(&buf[..n]);
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
    let _ = from.shutdown(std::net::Shutdown::Both);
}

/// 10% of requests reset (half of them after the server acted): writers and
/// readers see no error, and the tree is identical from the bucket alone.
#[test]
fn a_tenth_of_requests_failing_gives_writers_and_readers_no_error() {
    let _serial = serial();
    let (ep, _) = s3_env();
    let proxy = Proxy::start(&ep);
    let c = Cloud::new("cloud-faults", false, Some(&proxy.endpoint()));
    proxy.set_faults(100);
    let src = c.env.path("src");
    build_tree_with(&src, 300, 3 * MIB);
    // Remote durability: each fsync is a pack and a metadata version, so
    // many requests cross the proxy.
    let m = c.mount("a", &["--durability", "remote"]);
    let out = run(Command::new("cp").arg("-a").arg(format!("{}/.", src.display())).arg(m.path()));
    assert!(out.ok(), "cp -a under 10% faults: {out}");
    m.umount();
    let m = c.mount("b", &["--durability", "remote"]);
    check_copy(&src, m.path(), "under 10% faults");
    fs::create_dir(m.join("synced")).unwrap();
    let out = fsync_files(&m.join("synced"), 40, 64 << 10, 300);
    assert!(out.ok(), "fsync'd writes under 10% faults: {out}");
    m.umount();
    let m = c.mount("c", &[]);
    for i in 0..40 {
        assert!(fs::read(m.join(&format!("synced/f{i}"))).unwrap() == expected(300, i, 64 << 10), "synced/f{i} differs");
    }
    m.umount();
    let n = proxy.faults.load(Ordering::SeqCst);
    assert!(n >= 5, "only {n} requests were reset: not a test of anything");
}

/// The server unreachable for 30 s under writes: writers block (they
/// neither fail nor finish while the cache is full), then finish when it
/// answers again; the data is identical from the bucket alone.
#[test]
fn the_server_stopped_for_30s_blocks_writers_then_they_finish() {
    let _serial = serial();
    let (ep, _) = s3_env();
    let proxy = Proxy::start(&ep);
    let c = Cloud::new("cloud-outage", false, Some(&proxy.endpoint()));
    let m = c.mount("a", &["--cache-dir-size", "24M"]);
    proxy.set_up(false);
    let dir = m.path().to_path_buf();
    let writer = std::thread::spawn(move || fsync_files(&dir, 20, 4 * MIB, 900));
    std::thread::sleep(Duration::from_secs(30));
    assert!(!writer.is_finished(), "80 MiB written with the server down and a 24 MiB cache: writers were not blocked");
    proxy.set_up(true);
    let out = writer.join().unwrap();
    assert!(out.ok(), "a writer failed during the outage: {out}");
    m.umount();
    let m = c.mount("b", &[]);
    for i in 0..20 {
        assert!(fs::read(m.join(&format!("f{i}"))).unwrap() == expected(900, i, 4 * MIB), "f{i} differs after the outage");
    }
    m.umount();
}

/// A second read-write mount of the same volume is refused, naming the holder.
#[test]
fn a_second_read_write_mount_is_refused() {
    let _serial = serial();
    let c = Cloud::new("cloud-lease", false, None);
    let m = c.mount("a", &[]);
    let other = c.env.path("mnt2");
    fs::create_dir(&other).unwrap();
    let a = c.args("b", &[]);
    let mut args = vec!["mount".to_string(), c.url.clone(), other.display().to_string()];
    args.extend(a);
    let out = cairn(&args);
    assert!(!out.ok() && out.code == Some(1), "second mount: {out}");
    assert!(out.stderr.contains("is mounted read-write by") && out.stderr.contains("pid"), "{out}");
    assert!(!is_mounted(&other));
    m.umount();
}

/// The lease object deleted from the bucket under a read-write mount
/// (issue 25): at its next renewal the mount finds its lease lost; `cairn
/// status` says `lease_lost` and why, writes fail with EROFS, and `cairn
/// umount` exits non-zero saying what may not be in the bucket.
#[test]
fn a_mount_whose_lease_object_was_deleted_says_lease_lost_and_its_umount_fails() {
    let _serial = serial();
    let (ep, bucket) = s3_env();
    let c = Cloud::new("cloud-lease-lost", false, None);
    let m = c.mount("a", &["--meta-interval", "1", "--lease-renew", "1"]);
    fs::write(m.join("before"), b"written while the lease was held").unwrap();
    let mnt = fs::canonicalize(m.path()).unwrap();
    let status = || -> serde_json::Value {
        let out = cairn(["status", "--json"]);
        assert!(out.ok(), "{out}");
        let all: Vec<serde_json::Value> = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
        all.into_iter().find(|r| r["mountpoint"].as_str() == mnt.to_str()).unwrap_or_else(|| panic!("{} not in `cairn status`: {out}", mnt.display()))
    };
    assert_eq!(status()["health"], "ok", "{}", status());
    let prefix = c.url.trim_start_matches(&format!("s3://{bucket}/")).to_string();
    let delete = r#"
import sys, boto3
ep, bucket, prefix = sys.argv[1:4]
s3 = boto3.client("s3", endpoint_url=ep, region_name="us-east-1")
s3.head_object(Bucket=bucket, Key=prefix + "/lease")
s3.delete_object(Bucket=bucket, Key=prefix + "/lease")
"#;
    let out = Command::new("python3").args(["-c", delete, &ep, &bucket, &prefix]).output().unwrap_or_else(|e| panic!("this test needs python3 (apt-get install -y python3): {e}"));
    assert!(out.status.success(), "deleting the lease with boto3: {}", String::from_utf8_lossy(&out.stderr));
    // The next renewal (every second here) finds it gone.
    let t = Instant::now();
    let row = loop {
        let r = status();
        if r["health"] == "lease_lost" {
            break r;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "no lease_lost 30 s after the lease was deleted: {r:#}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let problems = row["problems"].to_string();
    assert!(problems.contains("lost the volume's lease") && problems.contains("deleted"), "{row:#}");
    assert_eq!(row["read_only"], true, "{row:#}");
    let text = cairn_ok(["status"]).stdout;
    assert!(text.contains("lease_lost"), "{text}");
    let e = fs::write(m.join("after"), b"written after the loss").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    let out = m.umount_failing();
    assert_eq!(out.code, Some(1), "{out}");
    assert!(out.stderr.contains("lost the volume's lease") && out.stderr.contains("may not be published"), "{out}");
    assert!(c.log("a").contains("lost the volume's lease"), "{}", c.log("a"));
}

/// A flipped byte in a pack in the bucket: reading the file gives EIO and
/// the log names the pack.
#[test]
fn a_flipped_byte_in_a_pack_gives_eio_naming_it() {
    let _serial = serial();
    let (ep, bucket) = s3_env();
    let c = Cloud::new("cloud-corrupt", false, None);
    let m = c.mount("a", &[]);
    fs::write(m.join("victim"), gen(3, 2 * MIB as usize)).unwrap();
    m.umount();
    // Signed requests (moto refuses anonymous reads): boto3 comes with moto.
    let prefix = c.url.trim_start_matches(&format!("s3://{bucket}/")).to_string();
    let flip = r#"
import sys, boto3
ep, bucket, prefix = sys.argv[1:4]
s3 = boto3.client("s3", endpoint_url=ep, region_name="us-east-1")
keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/packs/")["Contents"]]
key = sorted(keys)[0]
body = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
body[len(body) // 2] ^= 1
s3.put_object(Bucket=bucket, Key=key, Body=bytes(body))
print(key)
"#;
    let out = Command::new("python3").args(["-c", flip, &ep, &bucket, &prefix]).output().unwrap_or_else(|e| panic!("this test needs python3 (apt-get install -y python3): {e}"));
    assert!(out.status.success(), "flipping a byte with boto3: {}", String::from_utf8_lossy(&out.stderr));
    let key = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let m = c.mount("b", &[]);
    let e = fs::read(m.join("victim")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    let pack = key.rsplit('/').next().unwrap();
    m.umount();
    assert!(c.log("b").contains(pack), "the log does not name pack {pack}:\n{}", c.log("b"));
}

/// Wrong passphrase, unreachable endpoint, missing bucket and refused
/// credentials: one clear message each, exit 1, nothing left behind.
#[test]
fn cli_errors_are_one_clear_message() {
    let _serial = serial();
    let (ep, _) = s3_env();
    let c = Cloud::new("cloud-errors", true, None);
    let check = |out: &Out, want: &str| {
        assert_eq!(out.code, Some(1), "{out}");
        assert!(out.stderr.contains(want), "wanted {want:?}:\n{out}");
        assert!(out.stderr.lines().filter(|l| !l.trim().is_empty()).count() <= 2, "more than one message:\n{out}");
    };
    let wrong = c.env.path("wrong");
    fs::write(&wrong, "not the passphrase\n").unwrap();
    let out = cairn(["mount", &c.url, c.env.mnt.to_str().unwrap(), "--cache-dir", c.dir("w").to_str().unwrap(), "--endpoint", &ep, "--passphrase-file", wrong.to_str().unwrap()]);
    check(&out, "passphrase");
    let out = cairn(["mount", &c.url, c.env.mnt.to_str().unwrap(), "--cache-dir", c.dir("x").to_str().unwrap(), "--endpoint", "http://127.0.0.1:9"]);
    check(&out, "cannot reach");
    assert!(!c.dir("x").exists(), "a failed first mount left its directory behind");
    let out = cairn(["mount", "s3://no-such-bucket-cairn/v", c.env.mnt.to_str().unwrap(), "--cache-dir", c.dir("y").to_str().unwrap(), "--endpoint", &ep]);
    check(&out, "bucket does not exist");
    let out = cairn(["init", "s3://no-such-bucket-cairn/v", "--cache-dir", c.dir("z").to_str().unwrap(), "--endpoint", &ep]);
    check(&out, "bucket does not exist");
    // Refused credentials need a server that checks them: a second moto
    // with authentication on.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut server = Command::new("moto_server")
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .env("INITIAL_NO_AUTH_ACTION_COUNT", "0")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("moto_server is not installed (scripts/test.sh installs it with pip)");
    let auth_ep = format!("http://127.0.0.1:{port}");
    let t = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = cairn(["init", "s3://locked/v", "--cache-dir", c.dir("v").to_str().unwrap(), "--endpoint", &auth_ep]);
    let _ = server.kill();
    let _ = server.wait();
    check(&out, "refused access");
    assert!(out.stderr.contains("AWS_ACCESS_KEY_ID"), "{out}");
}

/// `cairn meta list` and `cairn meta restore`: an older version becomes the
/// latest, mounts consistently (fsck clean) and shows the old tree.
#[test]
fn metadata_restored_to_an_older_version_mounts_clean() {
    let _serial = serial();
    let c = Cloud::new("cloud-restore", true, None);
    let m = c.mount("a", &[]);
    fs::write(m.join("keep"), b"from the first session").unwrap();
    m.umount();
    let out = cairn(["meta", "list", &c.url, "--cache-dir", c.dir("a").to_str().unwrap(), "--endpoint", &c.endpoint, "--json"]);
    assert!(out.ok(), "{out}");
    let versions: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let old = versions.as_array().unwrap().last().unwrap()["version"].as_u64().unwrap();
    let m = c.mount("a", &[]);
    fs::remove_file(m.join("keep")).unwrap();
    fs::write(m.join("later"), b"from the second session").unwrap();
    m.umount();
    let out = cairn(["meta", "restore", &c.url, &old.to_string(), "--cache-dir", c.dir("a").to_str().unwrap(), "--endpoint", &c.endpoint, "--passphrase-file", c.pass.to_str().unwrap()]);
    assert!(out.ok(), "{out}");
    let m = c.mount("a", &[]);
    assert_eq!(fs::read(m.join("keep")).unwrap(), b"from the first session");
    assert!(!m.join("later").exists());
    m.umount();
    let out = c.cairn("fsck", "a", &["--read-data", "--json"]);
    assert!(out.ok(), "fsck after restore: {out}");
    let human = cairn(["meta", "list", &c.url, "--cache-dir", c.dir("a").to_str().unwrap(), "--endpoint", &c.endpoint]);
    assert!(human.ok() && human.stdout.contains("(latest)") && human.stdout.contains("restore"), "{human}");
}

/// `cairn cost --json`: requests by kind, from its `requests` field.
fn cost_requests(out: &Out) -> BTreeMap<String, u64> {
    assert!(out.ok(), "cairn cost: {out}");
    let bill: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
    let mut m: BTreeMap<String, u64> = serde_json::from_value(bill["requests"].clone()).unwrap();
    m.retain(|_, n| *n > 0);
    m
}

/// Requests by kind in a local directory's pending bill (what a volume
/// counted after its last metadata version, and read-only commands).
fn pending_requests(dir: &Path) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for line in fs::read_to_string(dir.join("bill-pending.jsonl")).unwrap_or_default().lines() {
        let rows: Vec<serde_json::Value> = serde_json::from_str(line).unwrap();
        for r in rows.iter().filter(|r| r["subsystem"] != "storage") {
            *m.entry(r["item"].as_str().unwrap().to_string()).or_default() += r["requests"].as_u64().unwrap();
        }
    }
    m.retain(|_, n| *n > 0);
    m
}

fn plus(a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    let mut m = a.clone();
    for (k, n) in b {
        *m.entry(k.clone()).or_default() += n;
    }
    m
}

/// The issue's test of the bill: `cairn cost` counts exactly the requests
/// a counting proxy in front of the S3 server forwarded, by kind, from
/// `cairn init` on: a tree written through a mount (three files of 40 MiB:
/// packs of 101 MiB, which go up in parts: POST, PUTs, POST), unmounted; the read-only look of `cairn
/// cost` itself is counted after its report, so the next report matches
/// again. A second machine reads the tree (read misses) and its bill is
/// the shipped one plus its own: with what the first directory still holds
/// locally, again exactly what the proxy saw.
#[test]
fn cost_counts_exactly_the_requests_the_bucket_served() {
    let _serial = serial();
    let (ep, _) = s3_env();
    let proxy = Proxy::start(&ep);
    let c = Cloud::with_pack_size("cloud-cost", true, Some(&proxy.endpoint()), "101M");
    let src = c.env.path("src");
    build_tree_with(&src, 300, 40 * MIB);
    let m = c.mount("a", &[]);
    let out = run(Command::new("cp").arg("-a").arg(format!("{}/.", src.display())).arg(m.path()));
    assert!(out.ok(), "cp -a: {out}");
    m.umount();
    let seen = proxy.seen();
    assert!(seen["POST"] >= 2 && seen["PUT"] >= 5, "no multipart upload went through the proxy: {seen:?}");
    let out = c.cairn("cost", "a", &["--json"]);
    assert_eq!(cost_requests(&out), seen, "cairn cost against the proxy\n{}", out.stdout);
    let bill: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let sub = |name: &str, kind: &str| bill["subsystems"].as_array().unwrap().iter().find(|s| s["subsystem"] == name).unwrap()["requests"][kind].as_u64().unwrap();
    assert!(sub("write", "PUT") >= 3 && sub("write", "POST") >= 2, "pack uploads: {bill:#}");
    assert!(sub("metadata", "PUT") >= 3, "version 1, the lease, a version with the tree: {bill:#}");
    assert!(bill["bytes_up"].as_u64().unwrap() > 3 * 40 * MIB, "{bill:#}");
    assert!(bill["total"].as_f64().unwrap() > 0.0);
    // The first report's own requests show in the second.
    let seen = proxy.seen();
    assert_eq!(cost_requests(&c.cairn("cost", "a", &["--json"])), seen, "a second cairn cost");

    // Another machine reads everything back: read misses.
    let m = c.mount("b", &[]);
    check_copy(&src, m.path(), "from the bucket");
    m.umount();
    let seen = proxy.seen();
    let out = c.cairn("cost", "b", &["--json"]);
    let b = cost_requests(&out);
    assert_eq!(plus(&b, &pending_requests(&c.dir("a"))), seen, "b's bill and a's local rest against the proxy\n{}", out.stdout);
    let bill: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let subs = bill["subsystems"].as_array().unwrap();
    let of = |name: &str| subs.iter().find(|s| s["subsystem"] == name).unwrap().clone();
    let (misses, ahead) = (of("read_miss"), of("prefetch"));
    assert!(misses["requests"]["GET"].as_u64().unwrap() > 0, "{bill:#}");
    let down = misses["bytes_down"].as_u64().unwrap() + ahead["bytes_down"].as_u64().unwrap();
    assert!(down > 3 * 40 * MIB, "the tree was read back from the bucket: {bill:#}");

    // Price tables and days.
    let coral = c.cairn("cost", "b", &["--prices", "coral"]);
    assert!(coral.ok() && coral.stdout.contains("coral") && coral.stdout.contains("GET requests") && coral.stdout.contains("read_miss"), "{coral}");
    let table = c.env.path("prices.toml");
    fs::write(&table, "name = \"free\"\nstorage_per_gb_month = 0\ntransfer_up_per_gb = 0\ntransfer_down_per_gb = 0\n[per_1000_requests]\nGET = 0\nHEAD = 0\nPUT = 0\nPOST = 0\nLIST = 0\nDELETE = 0\n").unwrap();
    let free: serde_json::Value = serde_json::from_str(&c.cairn("cost", "b", &["--json", "--prices", table.to_str().unwrap()]).stdout).unwrap();
    assert_eq!(free["total"].as_f64(), Some(0.0), "{free:#}");
    assert!(cost_requests(&c.cairn("cost", "b", &["--json", "--since", "2999-01-01"])).is_empty());
    let bad = c.cairn("cost", "b", &["--since", "yesterday"]);
    assert!(!bad.ok() && bad.stderr.contains("YYYY-MM-DD"), "{bad}");
}

/// The cost-optimal cleaner through the CLI: `gc --dry-run` prices a pack
/// with dead bytes (not due at AWS prices: storing 1 MiB dead costs less
/// than re-uploading the live part for days), and a mount whose price table
/// makes storage dear cleans it by itself, keeping every live byte, which a
/// machine that never saw the volume then reads.
#[test]
fn the_mount_cleans_a_pack_when_its_dead_bytes_have_cost_its_cleaning() {
    let _serial = serial();
    let c = Cloud::new("cloud-cleaner", false, None);
    let keep = expected(7, 0, 3 * MIB);
    let m = c.mount("a", &["--gc-interval", "0"]);
    fs::write(m.join("gone"), expected(8, 0, MIB)).unwrap();
    fs::write(m.join("keep"), &keep).unwrap();
    m.umount();
    let m = c.mount("a", &["--gc-interval", "0"]);
    fs::remove_file(m.join("gone")).unwrap();
    m.umount();
    let out = c.cairn("gc", "a", &["--dry-run"]);
    assert!(out.ok() && out.stdout.contains("0 of 1 packs with dead bytes are due") && out.stdout.contains(" days"), "{out}");
    let dear = c.env.path("dear.toml");
    fs::write(&dear, "name = \"dear storage\"\nstorage_per_gb_month = 1e6\ntransfer_up_per_gb = 0\ntransfer_down_per_gb = 0.09\n[per_1000_requests]\nGET = 0.0004\nHEAD = 0.0004\nPUT = 0.005\nPOST = 0.005\nLIST = 0.005\nDELETE = 0\n").unwrap();
    let out = c.cairn("gc", "a", &["--dry-run", "--prices", dear.to_str().unwrap()]);
    assert!(out.ok() && out.stdout.contains("1 of 1 packs with dead bytes are due"), "{out}");
    let m = c.mount("a", &["--gc-interval", "1", "--gc-prices", dear.to_str().unwrap()]);
    let t = Instant::now();
    loop {
        let out = c.cairn("stats", "a", &["--json"]);
        let s: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
        if s["dead_bytes"].as_u64() == Some(0) {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "not cleaned after a minute: {s}\n{}", c.log("a"));
        std::thread::sleep(Duration::from_millis(500));
    }
    let out = c.cairn("gc", "a", &["--dry-run", "--json"]);
    let plan: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(plan["cleaner"].as_array().map(Vec::len), Some(0), "{plan}");
    assert_eq!(fs::read(m.join("keep")).unwrap(), keep);
    m.umount();
    // The bill charges the new pack's upload to gc, not to the writes.
    let out = c.cairn("cost", "a", &["--json"]);
    let bill: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
    let gc = bill["subsystems"].as_array().unwrap().iter().find(|s| s["subsystem"] == "gc").cloned().unwrap_or_default();
    assert!(gc["requests"]["PUT"].as_u64().unwrap_or(0) >= 1, "no PUT charged to gc: {bill}");
    let out = c.cairn("fsck", "a", &["--read-data", "--json"]);
    assert!(out.ok(), "fsck after cleaning: {out}");
    let m = c.mount("b", &[]);
    assert_eq!(fs::read(m.join("keep")).unwrap(), keep, "a machine that never saw the volume");
    m.umount();
}

/// Asking about a volume in a bucket leaves nothing on a machine that has
/// no local directory for it (a later `cairn init` of the same bucket and
/// prefix would refuse what it left), a mount that fails removes the
/// directory it made, gc says that dropped packs wait in the trash, and
/// the bill reads in human units.
#[test]
fn queries_and_failed_mounts_leave_no_local_directory() {
    let _serial = serial();
    let (ep, bucket) = s3_env();
    let c = Cloud::new("cloud-queries", false, None);
    let m = c.mount("a", &[]);
    write_random_file(&m.join("gone"), 3, 2 * MIB);
    write_random_file(&m.join("kept"), 4, MIB);
    m.umount();
    let m = c.mount("a", &[]);
    fs::remove_file(m.join("gone")).unwrap();
    m.umount();
    let prefix = c.url.trim_start_matches(&format!("s3://{bucket}/")).to_string();
    let default_dir = PathBuf::from(format!("/var/cache/cairn/{bucket}/{prefix}"));
    for cmd in [&["stats", c.url.as_str()][..], &["cost", &c.url], &["meta", "list", &c.url], &["gc", &c.url, "--dry-run"]] {
        let mut args: Vec<&str> = cmd.to_vec();
        args.extend(["--endpoint", ep.as_str()]);
        let out = cairn_ok(&args);
        assert!(!default_dir.exists(), "`cairn {}` left {}\n{out}", cmd.join(" "), default_dir.display());
        let exponent = out.stdout.as_bytes().windows(3).any(|w| w[0].is_ascii_digit() && w[1] == b'e' && w[2] == b'-');
        assert!(!exponent, "a number in scientific notation for a person to read:\n{out}");
    }
    // A failed first mount (a wrong passphrase is impossible here: the
    // volume is not encrypted; a mountpoint that does not exist fails after
    // the directory was set up from the bucket).
    let fresh = c.dir("fresh");
    let out = cairn(["mount", &c.url, c.env.path("no-such-mnt").to_str().unwrap(), "--cache-dir", fresh.to_str().unwrap(), "--endpoint", &ep]);
    assert!(!out.ok(), "{out}");
    assert!(!fresh.exists(), "a failed mount left its new directory {}\n{out}", fresh.display());
    // gc in a bucket: into the trash, not "deleted".
    let out = c.cairn("gc", "a", &[]);
    assert!(out.ok() && out.stdout.contains("trash") && !out.stdout.contains("deleted 1 packs"), "{out}");
}

/// Without credentials a command says so at once, and never asks the
/// instance metadata address of a machine that is not on EC2; the AWS
/// shared credentials file is read.
#[test]
fn missing_credentials_fail_at_once_and_the_credentials_file_is_read() {
    let _serial = serial();
    let (ep, _) = s3_env();
    let c = Cloud::new("cloud-creds", false, None);
    let home = c.env.path("home");
    fs::create_dir(&home).unwrap();
    let cmd = || {
        let mut k = Command::new(CAIRN);
        k.args(["stats", &c.url, "--endpoint", &ep, "--cache-dir", c.dir("a").to_str().unwrap()]);
        for v in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE"] {
            k.env_remove(v);
        }
        k.env("HOME", &home);
        k
    };
    let out = run(&mut cmd());
    assert_eq!(out.code, Some(1), "{out}");
    assert!(out.stderr.contains("no AWS credentials found") && out.stderr.contains(".aws/credentials"), "{out}");
    // "At once": the answer is the backend's own check of the credential
    // sources (it names the profile it looked for), made before any
    // request, not object_store's fall-through to the instance metadata
    // address, which says the same first words after seconds of trying.
    assert!(out.stderr.contains("under [default]"), "the error is not the up-front check of the credential sources: {out}");
    assert!(!out.stderr.contains("169.254"), "asked the instance metadata address: {out}");
    assert!(out.stderr.lines().filter(|l| !l.trim().is_empty()).count() <= 2, "more than one message: {out}");
    fs::create_dir(home.join(".aws")).unwrap();
    fs::write(home.join(".aws/credentials"), "[default]\naws_access_key_id = cairn-test\naws_secret_access_key = cairn-test\n").unwrap();
    let out = run(&mut cmd());
    assert!(out.ok(), "with ~/.aws/credentials: {out}");
}
