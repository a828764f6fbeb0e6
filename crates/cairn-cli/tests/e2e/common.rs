//! Shared machinery: volumes in temp dirs on the local disk, mounts whose
//! guard always unmounts (and kills a stuck daemon), running the real `cairn`
//! binary, deterministic pseudo-random content, errno helpers.

#![allow(dead_code)]

use std::ffi::{CString, OsStr, OsString};
use std::fmt;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// The binary under test.
pub const CAIRN: &str = env!("CARGO_BIN_EXE_cairn");

static SERIAL: Mutex<()> = Mutex::new(());

/// Held by every test for its whole run: concurrent mounts on a 2-core
/// machine make the throughput-bound tests slow and the timing-bound ones
/// (crash, flock) flaky. A panicking test poisons nothing we care about.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

// ---------------------------------------------------------------- commands

/// What a finished command printed and how it exited.
pub struct Out {
    pub what: String,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }
    /// stdout and stderr together, for message checks.
    pub fn text(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

impl fmt::Display for Out {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` exited {:?}\n--- stdout:\n{}\n--- stderr:\n{}",
            self.what, self.code, self.stdout, self.stderr
        )
    }
}

pub fn run(cmd: &mut Command) -> Out {
    let what = format!("{cmd:?}");
    let o = cmd.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    Out {
        what,
        code: o.status.code(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

pub fn cairn<I, S>(args: I) -> Out
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run(Command::new(CAIRN).args(args))
}

/// Runs cairn and panics (with everything it printed) unless it exits 0.
pub fn cairn_ok<I, S>(args: I) -> Out
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let out = cairn(args);
    assert!(out.ok(), "{out}");
    out
}

/// `bash -c SCRIPT`.
pub fn sh(script: &str) -> Out {
    run(Command::new("bash").arg("-c").arg(script))
}

pub fn have(tool: &str) -> bool {
    sh(&format!("command -v {tool}")).ok()
}

/// Runs a python3 script (system python, usable by every user), optionally
/// as another uid/gid (setpriv, no groups), from `/`.
pub fn python(script: &str, args: &[&OsStr], as_ids: Option<(u32, u32)>) -> Out {
    let mut cmd = match as_ids {
        Some((uid, gid)) => {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={uid}"))
                .arg(format!("--regid={gid}"))
                .arg("--clear-groups")
                .arg("/usr/bin/python3");
            c
        }
        None => Command::new("/usr/bin/python3"),
    };
    cmd.arg("-I").arg("-c").arg(script).arg("--").args(args).current_dir("/");
    run(&mut cmd)
}

/// Panics naming the first ancestor of `path` that another user cannot
/// search (no `o+x`): a test that acts as `nobody` inside a mount needs every
/// directory above the mountpoint open to it, or each of its calls fails
/// with EACCES before reaching the file system under test.
pub fn assert_others_can_reach(path: &Path) {
    for dir in path.ancestors().skip(1) {
        let mode = fs::metadata(dir).map(|m| m.permissions().mode()).unwrap_or(0);
        assert!(
            mode & 0o001 != 0,
            "{} has mode {:o}: other users cannot reach {} through it, so the test cannot run as nobody. \
             Run the tests from a checkout whose parent directories are searchable (chmod o+x).",
            dir.display(),
            mode & 0o7777,
            path.display()
        );
    }
}

// ----------------------------------------------------------------- volumes

fn base_dir() -> PathBuf {
    let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join("e2e");
    fs::create_dir_all(&base).expect("creating the e2e temp base");
    fs::set_permissions(&base, fs::Permissions::from_mode(0o755)).unwrap();
    fs::canonicalize(&base).unwrap()
}

/// A test's private directory on the local disk (`target/tmp/e2e/NAME-*`,
/// never tmpfs) holding `vol/` (the volume) and `mnt/` (the mountpoint).
/// Deleted on drop unless `CAIRN_E2E_KEEP` is set.
pub struct Env {
    pub root: PathBuf,
    pub vol: PathBuf,
    pub mnt: PathBuf,
    tmp: Option<tempfile::TempDir>,
}

impl Env {
    /// A fresh unencrypted volume with default settings.
    pub fn new(name: &str) -> Env {
        Env::with_init(name, &[])
    }

    /// A fresh volume made with `cairn init vol EXTRA...`.
    pub fn with_init(name: &str, extra: &[&str]) -> Env {
        let env = Env::bare(name);
        let mut args: Vec<OsString> = vec!["init".into(), env.vol.clone().into()];
        args.extend(extra.iter().map(OsString::from));
        cairn_ok(&args);
        env
    }

    /// The directories only: no volume yet.
    pub fn bare(name: &str) -> Env {
        let tmp = tempfile::Builder::new().prefix(&format!("{name}-")).tempdir_in(base_dir()).expect("temp dir");
        // Reachable by the unprivileged user of the permission tests.
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let root = tmp.path().to_path_buf();
        let mnt = root.join("mnt");
        fs::create_dir(&mnt).unwrap();
        Env {
            vol: root.join("vol"),
            mnt,
            root,
            tmp: Some(tmp),
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// Mounts the volume at `mnt`; panics if `cairn mount` fails.
    pub fn mount(&self) -> Mount {
        self.mount_with(&[])
    }

    pub fn mount_with(&self, extra: &[&str]) -> Mount {
        Mount::new(&self.vol, &self.mnt, extra).unwrap_or_else(|out| panic!("mount failed: {out}"))
    }

    /// `cairn stats --json`.
    pub fn stats(&self) -> serde_json::Value {
        let out = cairn_ok([OsStr::new("stats"), self.vol.as_os_str(), OsStr::new("--json")]);
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("stats JSON: {e}\n{out}"))
    }

    /// `cairn fsck [--read-data] --json`: the run and its parsed report.
    pub fn fsck(&self, read_data: bool) -> (Out, serde_json::Value) {
        fsck_at(&self.vol, read_data, &[])
    }

    /// Asserts that `fsck --read-data` exits 0 with no errors; warnings
    /// that every entry satisfies `warning_ok` are accepted.
    pub fn assert_fsck_clean(&self, warning_ok: impl Fn(&str) -> bool) -> serde_json::Value {
        assert_fsck_clean_at(&self.vol, true, &[], warning_ok)
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.vol.join("cairn.log")).unwrap_or_default()
    }

    /// Every pack file name under vol/store/packs.
    pub fn packs(&self) -> Vec<PathBuf> {
        let mut v = Vec::new();
        let top = self.vol.join("store/packs");
        let Ok(rd) = fs::read_dir(&top) else { return v };
        for d in rd.flatten() {
            if let Ok(inner) = fs::read_dir(d.path()) {
                v.extend(inner.flatten().map(|e| e.path()));
            }
        }
        v.sort();
        v
    }
}


/// `cairn fsck VOL [--read-data] --json EXTRA...`: the run and its report.
pub fn fsck_at(vol: &Path, read_data: bool, extra: &[OsString]) -> (Out, serde_json::Value) {
    let mut args: Vec<&OsStr> = vec![OsStr::new("fsck"), vol.as_os_str(), OsStr::new("--json")];
    if read_data {
        args.push(OsStr::new("--read-data"));
    }
    args.extend(extra.iter().map(|a| a.as_os_str()));
    let out = cairn(&args);
    let v = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("fsck JSON: {e}\n{out}"));
    (out, v)
}

/// Asserts that fsck of `vol` exits 0 with no errors; warnings that every
/// entry satisfies `warning_ok` are accepted.
pub fn assert_fsck_clean_at(vol: &Path, read_data: bool, extra: &[OsString], warning_ok: impl Fn(&str) -> bool) -> serde_json::Value {
    let (out, rep) = fsck_at(vol, read_data, extra);
    let errors = rep["errors"].as_array().expect("errors array");
    let warnings = rep["warnings"].as_array().expect("warnings array");
    assert!(errors.is_empty() && out.ok(), "fsck found errors:\n{out}");
    let bad: Vec<_> = warnings.iter().filter(|w| !warning_ok(w.as_str().unwrap_or(""))).collect();
    assert!(bad.is_empty(), "fsck: unexpected warnings {bad:?}\n{out}");
    rep
}

impl Drop for Env {
    fn drop(&mut self) {
        // Never let the temp dir removal walk into a live mount.
        if is_mounted(&self.mnt) {
            force_unmount(&self.mnt);
        }
        if std::env::var_os("CAIRN_E2E_KEEP").is_some() {
            if let Some(t) = self.tmp.take() {
                eprintln!("CAIRN_E2E_KEEP: leaving {}", t.keep().display());
            }
        }
    }
}

// ------------------------------------------------------------------ mounts

/// A live mount. Drop unmounts it (`cairn umount`, then `fusermount3 -u -z`,
/// then `umount -l`) and SIGKILLs the daemon if it is still alive, so that a
/// failed assertion never leaves a mount or a process behind.
pub struct Mount {
    pub vol: PathBuf,
    pub mnt: PathBuf,
    /// The daemon: the process whose command line is `cairn mount VOL MNT`.
    pub pid: Option<i32>,
    done: bool,
}

impl Mount {
    /// `cairn mount VOL MNT EXTRA...`; Err(the run) if it fails.
    pub fn new(vol: &Path, mnt: &Path, extra: &[&str]) -> Result<Mount, Out> {
        Mount::new_with_env(vol, mnt, extra, &[])
    }

    /// As [`Mount::new`], with environment variables set for `cairn mount`.
    pub fn new_with_env(vol: &Path, mnt: &Path, extra: &[&str], env: &[(&str, &str)]) -> Result<Mount, Out> {
        let mut args: Vec<OsString> = vec!["mount".into(), vol.into(), mnt.into()];
        args.extend(extra.iter().map(OsString::from));
        let out = run(Command::new(CAIRN).args(&args).envs(env.iter().copied()));
        if !out.ok() {
            return Err(out);
        }
        let m = Mount {
            vol: vol.to_path_buf(),
            mnt: mnt.to_path_buf(),
            pid: daemon_pid(vol, mnt),
            done: false,
        };
        assert!(is_mounted(mnt), "`cairn mount` exited 0 but {} is not in the mount table\n{out}", mnt.display());
        assert!(
            m.pid.is_some(),
            "`cairn mount` exited 0 but no daemon `cairn mount {} {}` runs",
            vol.display(),
            mnt.display()
        );
        Ok(m)
    }

    pub fn path(&self) -> &Path {
        &self.mnt
    }

    pub fn join(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// `cairn umount`, which must succeed, leave nothing mounted, and let
    /// the daemon exit.
    pub fn umount(mut self) {
        let out = cairn([OsStr::new("umount"), self.mnt.as_os_str(), OsStr::new("--timeout"), OsStr::new("300")]);
        assert!(out.ok(), "{out}");
        assert!(!is_mounted(&self.mnt), "{} still mounted after `cairn umount`", self.mnt.display());
        if let Some(pid) = self.pid {
            assert!(wait_dead(pid, Duration::from_secs(30)), "daemon {pid} still alive 30 s after `cairn umount`");
        }
        self.done = true;
    }

    /// `cairn umount` that is expected to fail (the volume did not close
    /// cleanly) yet still unmount and let the daemon exit: returns its run.
    pub fn umount_failing(mut self) -> Out {
        let out = cairn([OsStr::new("umount"), self.mnt.as_os_str(), OsStr::new("--timeout"), OsStr::new("300")]);
        assert!(!out.ok(), "`cairn umount` succeeded: {out}");
        assert!(!is_mounted(&self.mnt), "{} still mounted after `cairn umount`", self.mnt.display());
        if let Some(pid) = self.pid {
            assert!(wait_dead(pid, Duration::from_secs(30)), "daemon {pid} still alive 30 s after `cairn umount`");
        }
        self.done = true;
        out
    }

    /// SIGKILL to the daemon; returns once it is dead. The mount is left
    /// dead (ENOTCONN) until [`Mount::detach`].
    pub fn kill9(&mut self) {
        let pid = self.pid.expect("daemon pid");
        assert!(is_daemon(pid, &self.vol, &self.mnt), "pid {pid} is not the daemon any more");
        // SAFETY: plain kill(2) of a process we identified by its command line.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0, "kill -9 {pid}: {}", io::Error::last_os_error());
        assert!(wait_dead(pid, Duration::from_secs(30)), "daemon {pid} survived SIGKILL");
    }

    /// Cleans up the mount of a dead daemon (`fusermount3 -u -z`).
    pub fn detach(mut self) {
        force_unmount(&self.mnt);
        assert!(!is_mounted(&self.mnt), "could not detach the dead mount at {}", self.mnt.display());
        self.done = true;
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if is_mounted(&self.mnt) {
            let out = cairn([OsStr::new("umount"), self.mnt.as_os_str(), OsStr::new("--timeout"), OsStr::new("120")]);
            if !out.ok() {
                eprintln!("cleanup: {out}");
                force_unmount(&self.mnt);
            }
        }
        if let Some(pid) = self.pid {
            if !wait_dead(pid, Duration::from_secs(10)) && is_daemon(pid, &self.vol, &self.mnt) {
                eprintln!("cleanup: killing daemon {pid}");
                // SAFETY: kill(2) of the daemon, identified by its command line.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                wait_dead(pid, Duration::from_secs(10));
            }
        }
    }
}

pub fn force_unmount(mnt: &Path) {
    let _ = run(Command::new("fusermount3").arg("-u").arg("-z").arg(mnt));
    if is_mounted(mnt) {
        let _ = run(Command::new("umount").arg("-l").arg(mnt));
    }
}


/// Whether `mnt` (an absolute, canonical path) is a mount point now. Works
/// on dead FUSE mounts too (no stat of the path itself).
pub fn is_mounted(mnt: &Path) -> bool {
    matches!(cairn_fuse::mount_at(mnt), Ok(Some(_)))
}

fn cmdline(pid: i32) -> Option<Vec<OsString>> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| OsString::from_vec(a.to_vec()))
            .collect(),
    )
}

fn is_daemon(pid: i32, vol: &Path, mnt: &Path) -> bool {
    match cmdline(pid) {
        Some(args) => {
            args.len() >= 4
                && Path::new(&args[0]).file_name() == Some(OsStr::new("cairn"))
                && args.iter().any(|a| a == "mount")
                && args.iter().any(|a| a == vol.as_os_str())
                && args.iter().any(|a| a == mnt.as_os_str())
        }
        None => false,
    }
}

/// The live process whose command line is `cairn mount VOL MNT`.
pub fn daemon_pid(vol: &Path, mnt: &Path) -> Option<i32> {
    let me = std::process::id() as i32;
    let mut found = Vec::new();
    for e in fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if pid != me && alive(pid) && is_daemon(pid, vol, mnt) {
            found.push(pid);
        }
    }
    found.into_iter().max()
}

/// Alive and not a zombie (a killed daemon is reparented to an init that
/// may never reap it).
pub fn alive(pid: i32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, None | Some('Z') | Some('X'))
}

pub fn wait_dead(pid: i32, timeout: Duration) -> bool {
    let start = Instant::now();
    while alive(pid) {
        if start.elapsed() > timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

// -------------------------------------------------------------------- data

/// SplitMix64: fast, deterministic content derived from a seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5851_f42d_4c95_7f2d)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in 0..n (n > 0), bias irrelevant here.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    /// Fills `buf`; successive calls continue one stream as long as every
    /// call but the last has a length that is a multiple of 8.
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let v = self.next_u64().to_le_bytes();
            let n = rest.len();
            rest.copy_from_slice(&v[..n]);
        }
    }
}

/// `len` pseudo-random bytes of stream `seed`.
pub fn gen(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    Rng::new(seed).fill(&mut v);
    v
}

const BLOCK: usize = 4 << 20;

/// Writes `len` bytes of stream `seed` to `w` in 4 MiB blocks.
pub fn write_stream(w: &mut impl Write, seed: u64, len: u64) -> io::Result<()> {
    let mut rng = Rng::new(seed);
    let mut buf = vec![0u8; BLOCK];
    let mut left = len;
    while left > 0 {
        let n = left.min(BLOCK as u64) as usize;
        rng.fill(&mut buf[..n]);
        w.write_all(&buf[..n])?;
        left -= n as u64;
    }
    Ok(())
}

pub fn write_random_file(path: &Path, seed: u64, len: u64) {
    let mut f = fs::File::create(path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    write_stream(&mut f, seed, len).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Reads until `buf` is full or EOF; returns how much was read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn first_diff(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()))
}

/// Checks that the first `len` bytes of `path` are stream `seed` (and, if
/// `exact`, that the file is exactly `len` bytes long).
pub fn check_stream(path: &Path, seed: u64, len: u64, exact: bool) -> Result<(), String> {
    let mut f = fs::File::open(path).map_err(|e| format!("open {}: {e}", path.display()))?;
    let size = f.metadata().map_err(|e| format!("stat {}: {e}", path.display()))?.len();
    if exact && size != len || size < len {
        return Err(format!(
            "{}: size {size}, expected {}{len}",
            path.display(),
            if exact { "" } else { "at least " }
        ));
    }
    let mut rng = Rng::new(seed);
    let (mut want, mut got) = (vec![0u8; BLOCK], vec![0u8; BLOCK]);
    let mut off = 0u64;
    while off < len {
        let n = (len - off).min(BLOCK as u64) as usize;
        rng.fill(&mut want[..n]);
        let k = read_full(&mut f, &mut got[..n]).map_err(|e| format!("read {} at {off}: {e} (errno {:?})", path.display(), e.raw_os_error()))?;
        if k != n || got[..n] != want[..n] {
            return Err(format!(
                "{}: content differs at byte {} (read {k} of {n} bytes at {off})",
                path.display(),
                off + first_diff(&got[..k], &want[..n]) as u64
            ));
        }
        off += n as u64;
    }
    Ok(())
}

/// Byte-for-byte comparison of two files, streaming.
pub fn compare_files(a: &Path, b: &Path) -> Result<(), String> {
    let mut fa = fs::File::open(a).map_err(|e| format!("open {}: {e}", a.display()))?;
    let mut fb = fs::File::open(b).map_err(|e| format!("open {}: {e}", b.display()))?;
    let (mut ba, mut bb) = (vec![0u8; BLOCK], vec![0u8; BLOCK]);
    let mut off = 0u64;
    loop {
        let na = read_full(&mut fa, &mut ba).map_err(|e| format!("read {} at {off}: {e}", a.display()))?;
        let nb = read_full(&mut fb, &mut bb).map_err(|e| format!("read {} at {off}: {e} (errno {:?})", b.display(), e.raw_os_error()))?;
        if na != nb || ba[..na] != bb[..nb] {
            return Err(format!(
                "{} and {} differ at byte {} (read {na} and {nb} bytes at {off})",
                a.display(),
                b.display(),
                off + first_diff(&ba[..na], &bb[..nb]) as u64
            ));
        }
        if na == 0 {
            return Ok(());
        }
        off += na as u64;
    }
}

pub fn pread_exact(f: &fs::File, off: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    f.read_exact_at(&mut v, off).unwrap_or_else(|e| panic!("pread {len} at {off}: {e}"));
    v
}

// ------------------------------------------------------------------ errnos

pub fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

pub fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Name of an errno value, for readable assertion messages.
pub fn errno_name(e: i32) -> String {
    let known = [
        (libc::EPERM, "EPERM"),
        (libc::ENOENT, "ENOENT"),
        (libc::EIO, "EIO"),
        (libc::EBADF, "EBADF"),
        (libc::EAGAIN, "EAGAIN"),
        (libc::EACCES, "EACCES"),
        (libc::EEXIST, "EEXIST"),
        (libc::ENOTDIR, "ENOTDIR"),
        (libc::EISDIR, "EISDIR"),
        (libc::EINVAL, "EINVAL"),
        (libc::ENOSPC, "ENOSPC"),
        (libc::ENOSYS, "ENOSYS"),
        (libc::ENOTEMPTY, "ENOTEMPTY"),
        (libc::ENODATA, "ENODATA"),
        (libc::ENOTCONN, "ENOTCONN"),
        (libc::EOPNOTSUPP, "EOPNOTSUPP"),
        (libc::EXDEV, "EXDEV"),
    ];
    known
        .iter()
        .find(|(v, _)| *v == e)
        .map(|(_, n)| n.to_string())
        .unwrap_or_else(|| format!("errno {e}"))
}

/// The errno of a failed io::Result, or a panic if it succeeded.
pub fn err_of<T>(r: io::Result<T>, what: &str) -> i32 {
    match r {
        Ok(_) => panic!("{what}: succeeded, expected an error"),
        Err(e) => e.raw_os_error().unwrap_or_else(|| panic!("{what}: non-OS error {e}")),
    }
}

// ------------------------------------------------------------------ xattrs

/// All xattrs (name, value) of `p` without following a symlink, sorted.
pub fn xattrs(p: &Path) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let c = cpath(p);
    // SAFETY: size query with a null buffer.
    let n = unsafe { libc::llistxattr(c.as_ptr(), std::ptr::null_mut(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut names = vec![0u8; n as usize + 256];
    // SAFETY: buffer of the given length.
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    names.truncate(n as usize);
    let mut out = Vec::new();
    for name in names.split(|b| *b == 0).filter(|s| !s.is_empty()) {
        let cn = CString::new(name).unwrap();
        let mut val = vec![0u8; 65536];
        // SAFETY: buffer of the given length.
        let k = unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), val.as_mut_ptr().cast(), val.len()) };
        if k < 0 {
            return Err(io::Error::last_os_error());
        }
        val.truncate(k as usize);
        out.push((name.to_vec(), val));
    }
    out.sort();
    Ok(out)
}

pub fn set_xattr(p: &Path, name: &str, value: &[u8]) {
    let (c, n) = (cpath(p), CString::new(name).unwrap());
    // SAFETY: valid strings and buffer.
    let rc = unsafe { libc::lsetxattr(c.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    assert_eq!(rc, 0, "setxattr {name} on {}: {}", p.display(), io::Error::last_os_error());
}

/// lchown + utimensat(AT_SYMLINK_NOFOLLOW) helpers.
pub fn lchown(p: &Path, uid: u32, gid: u32) {
    let c = cpath(p);
    // SAFETY: valid path string.
    assert_eq!(
        unsafe { libc::lchown(c.as_ptr(), uid, gid) },
        0,
        "lchown {}: {}",
        p.display(),
        io::Error::last_os_error()
    );
}

pub fn set_times(p: &Path, atime: (i64, i64), mtime: (i64, i64)) {
    let c = cpath(p);
    let ts = [
        libc::timespec {
            tv_sec: atime.0,
            tv_nsec: atime.1,
        },
        libc::timespec {
            tv_sec: mtime.0,
            tv_nsec: mtime.1,
        },
    ];
    // SAFETY: valid path string and two timespecs.
    let rc = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) };
    assert_eq!(rc, 0, "utimensat {}: {}", p.display(), io::Error::last_os_error());
}
