//! Cairn as a Linux citizen: mount(8) and fstab through the helpers
//! /sbin/mount.fuse.cairn and /sbin/umount.fuse.cairn (mount(8) looks for
//! helpers in /sbin only, so the test links them there and removes them
//! after), generated man pages and completions, the shipped systemd unit.

use crate::common::*;
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const HELPERS: [&str; 2] = ["/sbin/mount.fuse.cairn", "/sbin/umount.fuse.cairn"];

/// The helpers linked to the binary under test; whatever was there before
/// (an installed package) is put back on drop.
struct Helpers {
    saved: Vec<(PathBuf, PathBuf)>,
}

impl Helpers {
    fn install() -> Helpers {
        let mut saved = Vec::new();
        for h in HELPERS {
            let h = Path::new(h);
            if fs::symlink_metadata(h).is_ok() {
                let keep = h.with_extension("cairn-e2e-saved");
                fs::rename(h, &keep).unwrap();
                saved.push((h.to_path_buf(), keep));
            }
            std::os::unix::fs::symlink(CAIRN, h).unwrap_or_else(|e| panic!("linking {}: {e}", h.display()));
        }
        Helpers { saved }
    }
}

impl Drop for Helpers {
    fn drop(&mut self) {
        for h in HELPERS {
            let _ = fs::remove_file(h);
        }
        for (h, keep) in &self.saved {
            let _ = fs::rename(keep, h);
        }
    }
}

/// The daemon a helper mount left: a process named by the helper's
/// command line (`mount.fuse.cairn VOL MNT -o ...`).
fn helper_daemon(vol: &Path) -> Option<i32> {
    let me = std::process::id() as i32;
    fs::read_dir("/proc").ok()?.flatten().filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok()).filter(|&pid| pid != me && alive(pid)).find(|pid| {
        let Ok(raw) = fs::read(format!("/proc/{pid}/cmdline")) else { return false };
        let args: Vec<&[u8]> = raw.split(|b| *b == 0).collect();
        args.first().is_some_and(|a| a.ends_with(b"mount.fuse.cairn")) && args.iter().any(|a| *a == vol.as_os_str().as_encoded_bytes())
    })
}

/// How many Cairn mounts sit at `mnt` (stacked mounts each have a line).
fn cairn_mounts_at(mnt: &Path) -> usize {
    let mnt = fs::canonicalize(mnt).unwrap();
    cairn_fuse::mounttable::entries().unwrap().iter().filter(|e| e.mount_point == mnt && e.fstype == "fuse.cairn").count()
}

/// Unmounts whatever a failed assertion left at `mnt`.
struct Unmounter<'a>(&'a Path);

impl Drop for Unmounter<'_> {
    fn drop(&mut self) {
        if is_mounted(self.0) {
            let _ = cairn([OsStr::new("umount"), self.0.as_os_str()]);
            force_unmount(self.0);
        }
    }
}

#[test]
fn an_fstab_line_mounts_and_plain_umount_flushes() {
    let _serial = serial();
    let env = Env::bare("fstab");
    let pass = env.path("pass");
    fs::write(&pass, "correct horse\n").unwrap();
    cairn_ok([OsStr::new("init"), env.vol.as_os_str(), OsStr::new("--encrypt"), OsStr::new("--passphrase-file"), pass.as_os_str()]);
    let _helpers = Helpers::install();
    let _unmount = Unmounter(&env.mnt);
    let fstab = env.path("fstab");
    // The line of the issue, plus options a boot would carry.
    fs::write(
        &fstab,
        format!(
            "# scratch fstab\n{} {} fuse.cairn defaults,_netdev,nofail,x-systemd.requires=network-online.target,passphrase_file={},cache_size=300M,threads=2 0 0\n",
            env.vol.display(),
            env.mnt.display(),
            pass.display()
        ),
    )
    .unwrap();
    let out = run(Command::new("mount").arg("-a").arg("-T").arg(&fstab));
    assert!(out.ok(), "{out}");
    let m = cairn_fuse::mount_at(&env.mnt).unwrap().expect("mounted by mount -a");
    assert_eq!(m.fstype, "fuse.cairn");
    // The source is the fstab line's, so mount(8) sees the line as mounted:
    // `mount -a` again (as at every boot-like start) mounts nothing more.
    assert_eq!(m.source, fs::canonicalize(&env.vol).unwrap().as_os_str());
    let pid = helper_daemon(&env.vol).expect("the daemon of the helper mount");
    let out = run(Command::new("mount").arg("-a").arg("-T").arg(&fstab));
    assert!(out.ok(), "second mount -a: {out}");
    assert_eq!(cairn_mounts_at(&env.mnt), 1, "mount -a twice stacked a second mount");
    assert_eq!(helper_daemon(&env.vol), Some(pid), "a second daemon was started");
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mountinfo.contains("correct horse"));

    // Neither fsync'd nor flushed: only the umount can make these durable.
    let len = 24 << 20;
    write_random_file(&env.mnt.join("big"), 16, len);
    fs::write(env.mnt.join("small"), b"written before a plain umount").unwrap();
    let out = run(Command::new("umount").arg(&env.mnt));
    assert!(out.ok(), "{out}");
    assert!(!is_mounted(&env.mnt));
    // umount.fuse.cairn waited for the flush: the daemon is gone already.
    assert!(wait_dead(pid, Duration::from_millis(500)), "daemon {pid} still running when umount returned");
    assert!(env.log().contains("flushing and closing the volume"), "{}", env.log());

    let out = run(Command::new("mount").arg("-a").arg("-T").arg(&fstab));
    assert!(out.ok(), "remount: {out}");
    check_stream(&env.mnt.join("big"), 16, len, true).unwrap();
    assert_eq!(fs::read(env.mnt.join("small")).unwrap(), b"written before a plain umount");
    let out = run(Command::new("umount").arg(&env.mnt));
    assert!(out.ok(), "{out}");
    assert!(!is_mounted(&env.mnt));
    assert_fsck_clean_at(&env.vol, true, &["--passphrase-file".into(), pass.clone().into()], |_| false);
}

#[test]
fn mount_t_fuse_cairn_takes_options_and_names_a_bad_one() {
    let _serial = serial();
    let env = Env::new("mount-t");
    {
        let m = env.mount();
        fs::write(m.join("f"), b"before").unwrap();
        m.umount();
    }
    let _helpers = Helpers::install();
    let _unmount = Unmounter(&env.mnt);
    let mount = |opts: &str| run(Command::new("mount").arg("-t").arg("fuse.cairn").arg(&env.vol).arg(&env.mnt).arg("-o").arg(opts));

    let out = mount("cache_dri=/tmp/x,ro");
    assert!(!out.ok(), "{out}");
    assert!(out.stderr.contains("unknown mount option `cache_dri`"), "{out}");
    assert!(!is_mounted(&env.mnt));
    let out = mount("passphrase=hunter2");
    assert!(!out.ok() && out.stderr.contains("passphrase_file=FILE") && !out.stderr.contains("hunter2"), "{out}");
    let out = mount("durability=sometimes");
    assert!(!out.ok() && out.stderr.contains("sometimes"), "{out}");
    assert!(!is_mounted(&env.mnt));

    // ro and no_allow_other, no user-space option: umount(8) sees type
    // "fuse" and unmounts by itself; the daemon still flushes and exits.
    let out = mount("ro,no_allow_other,no-writeback-cache");
    assert!(out.ok(), "{out}");
    let pid = helper_daemon(&env.vol).expect("daemon");
    assert_eq!(fs::read(env.mnt.join("f")).unwrap(), b"before");
    let e = fs::write(env.mnt.join("g"), b"no").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    let out = run(Command::new("umount").arg(&env.mnt));
    assert!(out.ok(), "{out}");
    assert!(wait_dead(pid, Duration::from_secs(60)));
}

/// A mount for root alone, written in fstab as `dist/fstab.example` shows
/// (`no_allow_other`; mount(8) eats `private` as a propagation flag): after
/// `mount -a` another user cannot even stat the mountpoint, root can read.
#[test]
fn an_fstab_mount_for_root_alone_is_closed_to_other_users() {
    let _serial = serial();
    let env = Env::new("fstab-private");
    {
        let m = env.mount();
        fs::write(m.join("f"), b"root's").unwrap();
        fs::set_permissions(m.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        m.umount();
    }
    assert_others_can_reach(&env.mnt);
    let _helpers = Helpers::install();
    let _unmount = Unmounter(&env.mnt);
    let fstab = env.path("fstab");
    fs::write(&fstab, format!("{} {} fuse.cairn defaults,uhelper=fuse.cairn,no_allow_other 0 0\n", env.vol.display(), env.mnt.display())).unwrap();
    let out = run(Command::new("mount").arg("-a").arg("-T").arg(&fstab));
    assert!(out.ok(), "{out}");
    assert!(cairn_fuse::mount_at(&env.mnt).unwrap().is_some(), "not mounted by mount -a");
    assert_eq!(fs::read(env.mnt.join("f")).unwrap(), b"root's");
    const PY: &str = r#"
import errno, os, sys
for name, f in [("stat", lambda: os.stat(sys.argv[2])), ("read", lambda: open(os.path.join(sys.argv[2], "f"), "rb").read())]:
    try:
        f()
        print(name, "OK")
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, str(e.errno)))
"#;
    let out = python(PY, &[env.mnt.as_os_str()], Some((65534, 65534)));
    assert!(out.ok(), "{out}");
    assert_eq!(out.stdout, "stat EACCES\nread EACCES\n", "another user reached a mount for root alone");
    let out = run(Command::new("umount").arg(&env.mnt));
    assert!(out.ok(), "{out}");
}

/// man's output to a pipe without its overstrikes (bold is `X\x08X`).
fn plain(s: &str) -> String {
    let mut out: Vec<char> = Vec::new();
    for c in s.chars() {
        if c == '\x08' {
            out.pop();
        } else {
            out.push(c);
        }
    }
    out.into_iter().collect()
}

#[test]
fn generated_man_pages_render_and_completions_parse() {
    if !have("man") {
        panic!("man is missing (scripts/test.sh installs man-db)");
    }
    let dir = tempfile::tempdir().unwrap();
    let man = dir.path().join("man");
    cairn_ok([OsStr::new("generate"), OsStr::new("man"), man.as_os_str()]);
    let dist = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist/man/cairn.7");
    for (page, want) in [(man.join("cairn.1"), "SUBCOMMANDS"), (man.join("cairn-mount.1"), "fuse.cairn"), (man.join("cairn-snapshot-create.1"), "cairn-snapshot-create"), (dist, "snapshot")] {
        let out = run(Command::new("man").arg("-l").arg(&page).env("MANWIDTH", "100"));
        assert!(out.ok() && out.stderr.trim().is_empty(), "{}: {out}", page.display());
        assert!(plain(&out.stdout).contains(want), "{} lacks {want}:\n{}", page.display(), plain(&out.stdout));
    }
    let mount = run(Command::new("man").arg("-l").arg(man.join("cairn-mount.1")).env("MANWIDTH", "100"));
    assert!(plain(&mount.stdout).contains("--cache-dir-size"), "{}", plain(&mount.stdout));
    assert!(!man.join("cairn-generate.1").exists(), "the hidden generate command got a page");

    let comp = dir.path().join("comp");
    cairn_ok([OsStr::new("generate"), OsStr::new("completions"), comp.as_os_str()]);
    for f in ["cairn.bash", "_cairn", "cairn.fish"] {
        assert!(comp.join(f).exists(), "{f} missing");
    }
    let out = run(Command::new("bash").arg("-c").arg(format!("source {} && complete -p cairn", comp.join("cairn.bash").display())));
    assert!(out.ok(), "{out}");
}

#[test]
fn the_systemd_unit_verifies() {
    let unit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist/systemd/mnt-cairn.mount");
    assert!(unit.exists());
    assert!(have("systemd-analyze"), "systemd-analyze is missing: scripts/test.sh installs it (apt-get install systemd)");
    // (--man=no: the pages of Documentation= are not installed here)
    let out = run(Command::new("systemd-analyze").arg("verify").arg("--man=no").arg(&unit));
    assert!(out.ok(), "{out}");
    assert!(!out.stderr.contains("mnt-cairn.mount:"), "warnings about the unit: {out}");
}

/// `cairn status --json`, parsed, keeping only the mounts at `ours` (the
/// machine may have other Cairn mounts).
fn status_of(ours: &[&Path]) -> Vec<serde_json::Value> {
    let out = cairn(["status", "--json"]);
    assert!(out.ok(), "{out}");
    let all: Vec<serde_json::Value> = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out}"));
    let ours: Vec<PathBuf> = ours.iter().map(|p| fs::canonicalize(p).unwrap()).collect();
    all.into_iter().filter(|r| ours.iter().any(|p| r["mountpoint"].as_str() == p.to_str())).collect()
}

fn row_at<'a>(rows: &'a [serde_json::Value], mnt: &Path) -> &'a serde_json::Value {
    let mnt = fs::canonicalize(mnt).unwrap();
    rows.iter().find(|r| r["mountpoint"].as_str() == mnt.to_str()).unwrap_or_else(|| panic!("{} not listed: {rows:?}", mnt.display()))
}

/// Polls `cairn status` until `pred` holds for the mount at `mnt`.
fn wait_status(mnt: &Path, what: &str, secs: u64, pred: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let t = std::time::Instant::now();
    loop {
        let rows = status_of(&[mnt]);
        let r = row_at(&rows, mnt).clone();
        if pred(&r) {
            return r;
        }
        assert!(t.elapsed() < Duration::from_secs(secs), "{what}: not within {secs} s; last status {r:#}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// `cairn status` lists a local and a bucket mount with their volume,
/// backend, pid, uptime and health; a bucket that stops answering shows as
/// backend_unreachable with the bytes waiting for it, and ok again once it
/// answers; an unmounted volume leaves the list.
#[test]
fn cairn_status_lists_a_local_and_a_bucket_mount() {
    let _serial = serial();
    let local = Env::new("status-local");
    let (ep, _) = crate::cloud::s3_env();
    let proxy = crate::cloud::Proxy::start(&ep);
    let c = crate::cloud::Cloud::new("status-s3", false, Some(&proxy.endpoint()));
    let m1 = local.mount();
    let m2 = c.mount("a", &[]);
    write_random_file(&m1.join("f"), 1, 3 << 20);
    write_random_file(&m2.join("g"), 2, 3 << 20);

    let rows = status_of(&[m1.path(), m2.path()]);
    assert_eq!(rows.len(), 2, "{rows:#?}");
    let vol = fs::canonicalize(&local.vol).unwrap();
    let r = row_at(&rows, m1.path());
    assert_eq!(r["volume"].as_str(), vol.to_str(), "{r:#}");
    assert_eq!(r["local_dir"].as_str(), vol.to_str(), "{r:#}");
    assert_eq!(r["backend"].as_str().unwrap(), format!("local:{}", vol.join("store").display()), "{r:#}");
    assert_eq!(r["pid"].as_i64(), m1.pid.map(i64::from), "{r:#}");
    assert!(r["uptime_secs"].as_u64().unwrap() < 600, "{r:#}");
    assert_eq!(r["health"], "ok", "{r:#}");
    assert!(r["problems"].as_array().unwrap().is_empty(), "{r:#}");
    assert!(r["dirty_bytes"].is_u64() && r["journal_bytes"].is_u64(), "{r:#}");
    let r = row_at(&rows, m2.path());
    assert_eq!(r["volume"].as_str(), Some(c.url.as_str()), "{r:#}");
    assert_eq!(r["local_dir"].as_str(), fs::canonicalize(c.dir("a")).unwrap().to_str(), "{r:#}");
    assert_eq!(r["backend"].as_str().unwrap(), format!("{} at {}", c.url, proxy.endpoint()), "{r:#}");
    assert_eq!(r["pid"].as_i64(), m2.pid.map(i64::from), "{r:#}");
    assert_eq!(r["health"], "ok", "{r:#}");

    // The bucket stops answering: an fsync'd file is safe locally (the
    // default durability) and waits for the bucket, which status shows.
    proxy.set_up(false);
    let mut f = fs::File::create(m2.join("during-outage")).unwrap();
    write_stream(&mut f, 3, 4 << 20).unwrap();
    f.sync_all().expect("fsync with the bucket down (local durability)");
    drop(f);
    // An upload retries inside the S3 backend for up to its write deadline
    // (60 s, RetryPolicy::cloud) before the uploader sees the failure that
    // status reports: 60 s here failed on a loaded machine.
    // The closed file is packed once it is flush_age old, so the metadata
    // version shipped meanwhile may fail first: wait for the upload's own.
    let failed_upload = |r: &serde_json::Value| r["problems"].as_array().unwrap().iter().any(|p| p["what"] == "upload");
    let r = wait_status(m2.path(), "backend_unreachable with the file queued", 150, |r| {
        r["health"] == "backend_unreachable" && r["dirty_bytes"].as_u64().unwrap() >= 4 << 20 && failed_upload(r)
    });
    let problems = r["problems"].as_array().unwrap();
    assert!(problems.iter().any(|p| p["what"] == "upload" && !p["error"].as_str().unwrap().is_empty()), "{r:#}");
    let text = cairn_ok(["status"]).stdout;
    assert!(text.contains("backend_unreachable") && text.contains("upload:"), "{text}");
    proxy.set_up(true);
    wait_status(m2.path(), "ok with nothing queued after the outage", 90, |r| r["health"] == "ok" && r["upload_queue_bytes"] == 0);

    m1.umount();
    let rows = status_of(&[&local.mnt, m2.path()]);
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(rows[0]["volume"].as_str(), Some(c.url.as_str()));
    m2.umount();
    assert!(status_of(&[&c.env.mnt]).is_empty());
}

/// One HTTP GET to `addr` (`host:port`): the status code and the body.
fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut raw = String::new();
    match addr.strip_prefix("unix:") {
        Some(sock) => {
            let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap_or_else(|e| panic!("connecting to {sock}: {e}"));
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
            s.read_to_string(&mut raw).unwrap();
        }
        None => {
            let mut s = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
            s.read_to_string(&mut raw).unwrap();
        }
    }
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no HTTP answer: {raw:?}"));
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("status line: {head}"));
    (code, body.to_string())
}

/// The value of the sample `series` (name with its labels, as printed).
fn sample(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .map(|v| v.trim().parse::<f64>().unwrap_or_else(|e| panic!("{series}: {v}: {e}")) as u64)
        .unwrap_or_else(|| panic!("no sample {series} in:\n{text}"))
}

/// `cairn mount --metrics`, given as `-o metrics=unix:PATH` through the
/// mount(8) helper: the socket is 0600; scraped during a write, the
/// counters grow with every fsync'd step; at the end they agree with `cairn
/// stats` (bytes written, chunks, packs, stored bytes); other paths answer
/// 404. `cairn top` shows the write as rates, reading the same counters
/// over the control socket.
#[test]
fn metrics_scraped_during_a_write_agree_with_stats() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let _serial = serial();
    let env = Env::new("metrics");
    let _helpers = Helpers::install();
    let _unmount = Unmounter(&env.mnt);
    let sock = env.path("metrics.sock");
    let out = run(Command::new("mount").arg("-t").arg("fuse.cairn").arg(&env.vol).arg(&env.mnt).arg("-o").arg(format!("metrics=unix:{},_netdev", sock.display())));
    assert!(out.ok(), "{out}");
    let rows = status_of(&[&env.mnt]);
    let addr = rows[0]["metrics"].as_str().unwrap_or_else(|| panic!("no metrics address in status: {rows:#?}")).to_string();
    assert_eq!(addr, format!("unix:{}", sock.display()));
    let m = fs::symlink_metadata(&sock).unwrap();
    assert!(m.file_type().is_socket() && m.permissions().mode() & 0o777 == 0o600, "socket mode {:o}", m.permissions().mode());

    let (code, body) = http_get(&addr, "/nope");
    assert_eq!(code, 404, "{body}");
    let (code, first) = http_get(&addr, "/metrics");
    assert_eq!(code, 200, "{first}");
    assert!(first.contains("# TYPE cairn_fuse_request_duration_seconds histogram"), "{first}");

    let step = 8u64 << 20;
    let mut f = fs::File::create(env.mnt.join("big")).unwrap();
    let (mut written, mut writes) = (sample(&first, "cairn_kernel_written_bytes_total"), sample(&first, "cairn_fuse_requests_total{op=\"write\"}"));
    for i in 0..4 {
        write_stream(&mut f, 100 + i, step).unwrap();
        f.sync_all().unwrap();
        let (code, text) = http_get(&addr, "/metrics");
        assert_eq!(code, 200);
        let (w, n) = (sample(&text, "cairn_kernel_written_bytes_total"), sample(&text, "cairn_fuse_requests_total{op=\"write\"}"));
        assert!(w >= written + step && n > writes, "step {i}: written {written} -> {w}, write requests {writes} -> {n}");
        (written, writes) = (w, n);
    }
    drop(f);

    // `cairn top` while a writer keeps writing: two refreshes with rates.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, path) = (stop.clone(), env.mnt.join("more"));
        std::thread::spawn(move || {
            let mut f = fs::File::create(path).unwrap();
            let mut seed = 200;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                write_stream(&mut f, seed, 1 << 20).unwrap();
                f.sync_all().unwrap();
                seed += 1;
            }
            (seed - 200) << 20
        })
    };
    let top = cairn_ok([OsStr::new("top"), env.mnt.as_os_str(), OsStr::new("--count"), OsStr::new("2"), OsStr::new("--interval"), OsStr::new("1")]).stdout;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let more = writer.join().unwrap();
    assert_eq!(top.matches("cairn top ").count(), 2, "{top}");
    let kernel_write: Vec<&str> = top.lines().filter(|l| l.trim_start().starts_with("kernel write")).collect();
    assert_eq!(kernel_write.len(), 2, "{top}");
    assert!(kernel_write.iter().any(|l| !l.trim_end().ends_with(" 0 B/s")), "no write rate while writing:\n{top}");
    for k in ["fuse ops", "chunked", "stored", "journal", "upload queue", "op write"] {
        assert!(top.contains(k), "top lacks {k}:\n{top}");
    }

    // `cairn stats` flushes everything; then both count the same things.
    let stats: serde_json::Value = serde_json::from_str(&cairn_ok([OsStr::new("stats"), env.vol.as_os_str(), OsStr::new("--json")]).stdout).unwrap();
    let (_, text) = http_get(&addr, "/metrics");
    let total = 4 * step + more;
    assert_eq!(stats["data_bytes"].as_u64(), Some(total), "{stats}");
    assert_eq!(sample(&text, "cairn_kernel_written_bytes_total"), total, "every byte written reached the daemon once");
    assert!(sample(&text, "cairn_chunked_bytes_total") >= total);
    let chunks = stats["chunks"].as_u64().unwrap() + stats["dead_chunks"].as_u64().unwrap();
    assert_eq!(sample(&text, "cairn_chunks_written_total"), chunks, "{stats}");
    assert_eq!(sample(&text, "cairn_packs_written_total"), stats["packs"].as_u64().unwrap(), "{stats}");
    assert_eq!(sample(&text, "cairn_stored_bytes_total"), stats["stored_bytes"].as_u64().unwrap(), "{stats}");
    let writes = sample(&text, "cairn_fuse_requests_total{op=\"write\"}");
    assert_eq!(sample(&text, "cairn_fuse_request_duration_seconds_bucket{le=\"+Inf\",op=\"write\"}"), writes, "{text}");

    let out = run(Command::new("umount").arg(&env.mnt));
    assert!(out.ok(), "{out}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while sock.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!sock.exists(), "the metrics socket outlived the daemon");
}

/// The daemon's resident set, in KiB.
fn rss_kib(pid: i32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()).and_then(|v| v.parse().ok()).unwrap()
}

/// Issue 50: a TCP metrics endpoint is open to every local user. Acting as
/// `nobody`-like clients, 600 idle connections, a client sending an
/// endless header (800 MiB if let) and a slowloris client: meanwhile the
/// mount's own writes and fsyncs succeed, the daemon keeps few descriptors
/// and little memory, and the endpoint answers again afterwards. It leaves
/// out the counters that tell whether written data was stored already.
/// And a port someone else holds does not keep the volume from mounting.
#[test]
fn metrics_endpoint_survives_a_flood_and_an_endless_header() {
    use std::io::Write;
    let _serial = serial();
    let env = Env::new("metrics-flood");
    let _unmount = Unmounter(&env.mnt);
    // A port another user holds first: the mount logs it and goes on.
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = squatter.local_addr().unwrap().to_string();
    let m = Mount::new(&env.vol, &env.mnt, &["--metrics", &taken]).unwrap_or_else(|o| panic!("a taken metrics port failed the mount: {o}"));
    assert!(env.log().contains("no metrics endpoint") && env.log().contains(&taken), "{}", env.log());
    m.umount();
    drop(squatter);

    let m = Mount::new(&env.vol, &env.mnt, &["--metrics", "127.0.0.1:0"]).unwrap_or_else(|o| panic!("{o}"));
    let rows = status_of(&[&env.mnt]);
    let addr = rows[0]["metrics"].as_str().unwrap_or_else(|| panic!("no metrics address: {rows:#?}")).to_string();
    let pid = daemon_pid(&env.vol, &env.mnt).expect("daemon pid");
    let (code, text) = http_get(&addr, "/metrics");
    assert_eq!(code, 200, "{text}");
    assert!(text.contains("cairn_kernel_written_bytes_total"), "{text}");
    for hidden in ["cairn_deduplicated", "cairn_new_chunk", "cairn_stored", "cairn_chunks_written", "cairn_packs_written"] {
        assert!(!text.contains(hidden), "{hidden} is served over TCP on a volume of one dedup domain:\n{text}");
    }
    // Sockets the daemon holds (the mount's own files come and go with the
    // writes below; the endpoint's connections are sockets).
    let fds = || fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten().filter(|e| fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))).count();
    let (fds0, rss0) = (fds(), rss_kib(pid));

    // An endless header, streamed as fast as the daemon takes it.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let header = {
        let (addr, stop) = (addr.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut s = std::net::TcpStream::connect(&addr).unwrap();
            s.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
            let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nX-Fill: ");
            let junk = vec![b'a'; 1 << 20];
            let mut sent = 0u64;
            while sent < 800 << 20 && !stop.load(std::sync::atomic::Ordering::SeqCst) {
                match s.write_all(&junk) {
                    Ok(()) => sent += junk.len() as u64,
                    Err(_) => break,
                }
            }
            sent
        })
    };
    // A flood of connections that send nothing, and some that send a byte
    // a second (slowloris).
    let mut flood = Vec::new();
    for i in 0..600 {
        match std::net::TcpStream::connect(&addr) {
            Ok(mut c) => {
                if i % 50 == 0 {
                    let _ = c.write_all(b"G");
                }
                flood.push(c);
            }
            Err(e) => panic!("connection {i}: {e}"),
        }
    }
    // The mount's own I/O meanwhile: writes and fsyncs of 64 files.
    for i in 0..64 {
        let p = env.mnt.join(format!("f{i}"));
        let mut f = fs::File::create(&p).unwrap_or_else(|e| panic!("creating {}: {e}", p.display()));
        write_stream(&mut f, i, 256 << 10).unwrap();
        f.sync_all().unwrap_or_else(|e| panic!("fsync {} during the flood: {e}", p.display()));
    }
    let (fds1, rss1) = (fds(), rss_kib(pid));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let sent = header.join().unwrap();
    drop(flood);
    assert!(fds1 <= fds0 + 11, "the endpoint holds a socket per connection: {fds0} before, {fds1} during the flood");
    assert!(rss1 <= rss0 + 64 * 1024, "daemon RSS {rss0} KiB before, {rss1} KiB after a {sent}-byte header");
    assert!(!env.log().contains("Too many open files"), "{}", env.log());
    // Answers again once the flood is gone (idle connections time out).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let ok = std::net::TcpStream::connect(&addr).ok().and_then(|mut s| {
            use std::io::Read;
            s.set_read_timeout(Some(Duration::from_secs(20))).ok()?;
            write!(s, "GET /metrics HTTP/1.0\r\n\r\n").ok()?;
            let mut r = String::new();
            s.read_to_string(&mut r).ok()?;
            Some(r.starts_with("HTTP/1.1 200"))
        });
        if ok == Some(true) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the endpoint does not answer after the flood");
        std::thread::sleep(Duration::from_millis(200));
    }
    for i in 0..64 {
        check_stream(&env.mnt.join(format!("f{i}")), i, 256 << 10, true).unwrap();
    }
    m.umount();
}

/// Removes the test's package again however the test ends.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let out = run(Command::new("dpkg").arg("-r").arg("cairn"));
        if !out.ok() {
            eprintln!("dpkg -r cairn: {out}");
        }
    }
}

/// scripts/deb.sh packages the release build; the .deb holds the binary,
/// the mount(8) helper links, libcairn.so and cairn.h, man pages,
/// completions and the examples, and depends on fuse3. Installed with
/// dpkg -i, `mount -t fuse.cairn` works from the installed files alone
/// (/sbin helper, /usr/bin/cairn), plain umount flushes, the data is
/// byte-exact after a remount, `man cairn-mount` renders; dpkg -r removes
/// it all.
#[test]
fn the_debian_package_installs_and_mounts() {
    let _serial = serial();
    for tool in ["cargo-deb", "dpkg-deb", "dpkg", "man", "gzip"] {
        assert!(have(tool), "{tool} is missing (scripts/test.sh installs what this test needs: cargo install cargo-deb --locked; apt-get install man-db)");
    }
    // The package is made from the binary under test.
    let release = Path::new(CAIRN).parent().unwrap();
    assert!(release.ends_with("release"), "the package test needs the release build (cargo test --release): {CAIRN}");
    assert!(release.join("libcairn.so").exists(), "{} is missing: cargo build --release -p cairn-client (scripts/test.sh builds the workspace)", release.join("libcairn.so").display());
    assert!(!run(Command::new("dpkg").arg("-s").arg("cairn")).ok(), "a cairn package is installed on this machine already; this test installs and removes its own");
    let env = Env::bare("deb");
    let out_dir = env.path("deb");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/deb.sh");
    let out = run(Command::new(&script).arg("--no-build").arg("--output").arg(&out_dir).env("CARGO_TARGET_DIR", release.parent().unwrap()));
    assert!(out.ok(), "{out}");
    let deb = fs::read_dir(&out_dir).unwrap().flatten().map(|e| e.path()).find(|p| p.extension().is_some_and(|x| x == "deb")).unwrap_or_else(|| panic!("no .deb in {}: {out}", out_dir.display()));

    let list = run(Command::new("dpkg-deb").arg("-c").arg(&deb));
    assert!(list.ok(), "{list}");
    for want in [
        "./usr/bin/cairn",
        "./sbin/mount.fuse.cairn -> /usr/bin/cairn",
        "./sbin/umount.fuse.cairn -> /usr/bin/cairn",
        "./sbin/mount.cairn -> /usr/bin/cairn",
        "./usr/lib/libcairn.so",
        "./usr/include/cairn.h",
        "./usr/share/man/man1/cairn.1.gz",
        "./usr/share/man/man1/cairn-mount.1.gz",
        "./usr/share/man/man1/cairn-status.1.gz",
        "./usr/share/man/man7/cairn.7.gz",
        "./usr/share/bash-completion/completions/cairn",
        "./usr/share/zsh/vendor-completions/_cairn",
        "./usr/share/fish/vendor_completions.d/cairn.fish",
        "./usr/share/doc/cairn/examples/mnt-cairn.mount",
        "./usr/share/doc/cairn/examples/fstab.example",
    ] {
        assert!(list.stdout.lines().any(|l| l.ends_with(want)), "{} lacks {want}:\n{}", deb.display(), list.stdout);
    }
    let depends = run(Command::new("dpkg-deb").arg("-f").arg(&deb).arg("Depends"));
    assert!(depends.stdout.contains("fuse3"), "{depends}");

    let out = run(Command::new("dpkg").arg("-i").arg(&deb));
    let _installed = Installed;
    assert!(out.ok(), "{out}");
    // Only installed files from here on: /usr/bin/cairn and the /sbin helpers.
    let installed = |args: &[&OsStr]| run(Command::new("/usr/bin/cairn").args(args));
    let out = installed(&[OsStr::new("init"), env.vol.as_os_str()]);
    assert!(out.ok(), "{out}");
    let _unmount = Unmounter(&env.mnt);
    let mount = || run(Command::new("mount").arg("-t").arg("fuse.cairn").arg(&env.vol).arg(&env.mnt).arg("-o").arg("_netdev"));
    let out = mount();
    assert!(out.ok(), "{out}");
    let pid = helper_daemon(&env.vol).expect("the daemon of the installed helper");
    assert_eq!(fs::read_link(format!("/proc/{pid}/exe")).unwrap(), Path::new("/usr/bin/cairn"));
    let len = 6 << 20;
    write_random_file(&env.mnt.join("f"), 7, len);
    let out = run(Command::new("umount").arg(&env.mnt));
    assert!(out.ok(), "{out}");
    assert!(wait_dead(pid, Duration::from_millis(500)), "daemon {pid} still running when umount returned");
    let out = mount();
    assert!(out.ok(), "remount: {out}");
    check_stream(&env.mnt.join("f"), 7, len, true).unwrap();
    let out = run(Command::new("umount").arg(&env.mnt));
    assert!(out.ok(), "{out}");

    let page = run(Command::new("man").arg("cairn-mount").env("MANWIDTH", "100").env("MANPAGER", "cat").env("PAGER", "cat"));
    assert!(page.ok(), "{page}");
    assert!(plain(&page.stdout).contains("fuse.cairn") && plain(&page.stdout).contains("--metrics"), "{}", plain(&page.stdout));
    let page = run(Command::new("man").arg("7").arg("cairn").env("MANPAGER", "cat"));
    assert!(page.ok() && plain(&page.stdout).contains("snapshot"), "{page}");

    drop(_installed);
    for gone in ["/usr/bin/cairn", "/sbin/mount.fuse.cairn", "/usr/lib/libcairn.so", "/usr/share/man/man1/cairn-mount.1.gz"] {
        assert!(fs::symlink_metadata(gone).is_err(), "{gone} is still there after dpkg -r");
    }
}

/// Issue 50: a plain `umount` of a mount made by `cairn mount` (no
/// `uhelper=` option anywhere) waits until the daemon has flushed and
/// exited: the daemon writes its line (`uhelper=fuse.cairn`) into
/// /run/mount/utab, so umount(8) finds umount.fuse.cairn instead of calling
/// umount(2) and returning while data is still in the journal. The line
/// goes when the daemon exits.
#[test]
fn plain_umount_of_a_cairn_mount_waits_for_the_flush() {
    let _serial = serial();
    let env = Env::new("plain-umount");
    let _helpers = Helpers::install();
    let _unmount = Unmounter(&env.mnt);
    let m = Mount::new(&env.vol, &env.mnt, &[]).unwrap_or_else(|o| panic!("{o}"));
    let mnt = fs::canonicalize(&env.mnt).unwrap();
    let utab = || fs::read_to_string("/run/mount/utab").unwrap_or_default();
    let ours = |t: &str| t.lines().any(|l| l.contains(&format!("TARGET={} ", mnt.display())) && l.contains("uhelper=fuse.cairn"));
    assert!(ours(&utab()), "no utab line for {}:\n{}", mnt.display(), utab());
    let pid = daemon_pid(&env.vol, &env.mnt).expect("daemon pid");
    {
        let mut f = fs::File::create(env.mnt.join("big")).unwrap();
        write_stream(&mut f, 5, 96 << 20).unwrap();
    }
    let out = run(Command::new("umount").arg(&env.mnt));
    assert!(out.ok(), "{out}");
    // umount returned: the daemon has exited (nothing left in its journal).
    assert!(!alive(pid), "plain umount returned while the daemon (pid {pid}) still runs");
    m.detach();
    assert!(!ours(&utab()), "the utab line outlived the mount:\n{}", utab());
    let journal: u64 = fs::read_dir(env.vol.join("journal")).map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().ends_with(".jnl")).map(|e| e.metadata().unwrap().len()).sum()).unwrap_or(0);
    assert_eq!(journal, 0, "data left in the journal after a plain umount");
    let m = Mount::new(&env.vol, &env.mnt, &[]).unwrap_or_else(|o| panic!("{o}"));
    check_stream(&env.mnt.join("big"), 5, 96 << 20, true).unwrap();
    m.umount();
}
