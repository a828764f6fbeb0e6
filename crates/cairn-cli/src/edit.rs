//! Verbs that work on files inside a mounted volume: insert, delete and
//! replace bytes (through the rpwrite ioctl), clone and snapshots (through
//! the mount's control socket).

use anyhow::{anyhow, bail, Context, Result};
use cairn_engine::control::{self, Request};
use std::fs::{File, OpenOptions};
use std::io::{IsTerminal, Read};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where new bytes come from.
pub enum Source {
    Stdin,
    File(PathBuf),
}

impl Source {
    pub fn from_arg(arg: Option<PathBuf>) -> Result<Source> {
        match arg {
            Some(p) if p.as_os_str() == "-" => Ok(Source::Stdin),
            Some(p) => Ok(Source::File(p)),
            None if std::io::stdin().is_terminal() => bail!("nothing to write: give --from FILE, or pipe the bytes in (--from -)"),
            None => Ok(Source::Stdin),
        }
    }
}

fn open_target(file: &Path) -> Result<File> {
    let f = OpenOptions::new().read(true).write(true).open(file).with_context(|| format!("opening {}", file.display()))?;
    if f.metadata()?.is_dir() {
        bail!("{} is a directory", file.display());
    }
    if !cairn::is_cairn(f.as_fd()) {
        bail!("{} is not inside a Cairn mount", file.display());
    }
    Ok(f)
}

fn explain(e: std::io::Error, file: &Path, offset: u64) -> anyhow::Error {
    let why = match e.raw_os_error() {
        Some(libc::EINVAL) => format!("offset {offset} is past the end of the file"),
        Some(libc::EROFS) => "the file is in a read-only snapshot".to_string(),
        Some(libc::EBADF) => "the file is not open for writing".to_string(),
        Some(libc::EFBIG) => "the result would be larger than the largest file (2^63 - 1 bytes)".to_string(),
        _ => e.to_string(),
    };
    anyhow!("{}: {why}", file.display())
}

/// `cairn insert|replace|delete`: replaces `mbyte` bytes at `offset` of
/// `file` with the bytes of `src` (none for a delete).
pub fn replace(file: &Path, offset: u64, mbyte: u64, src: Option<Source>) -> Result<()> {
    let target = open_target(file)?;
    // The range replaced or deleted must lie inside the file, as an insert's
    // offset must (the ioctl would cut it at the end: a delete past the end
    // would quietly truncate).
    let size = target.metadata()?.len();
    if mbyte > 0 && offset.checked_add(mbyte).is_none_or(|end| end > size) {
        let most = size.saturating_sub(offset);
        bail!("{}: {mbyte} bytes at offset {offset} reach past the end of the file ({size} bytes){}", file.display(), if offset < size { format!("; at most {most} bytes there") } else { String::new() });
    }
    let outcome = match src {
        None => cairn::rpwrite(target.as_fd(), &[], offset, mbyte).map_err(|e| explain(e, file, offset))?,
        Some(Source::File(p)) => {
            let f = File::open(&p).with_context(|| format!("opening {}", p.display()))?;
            let m = f.metadata()?;
            if m.is_dir() {
                bail!("{} is a directory", p.display());
            }
            if m.dev() == target.metadata()?.dev() {
                // Same mount: share the source's chunks, copy nothing.
                cairn::rpsplice(target.as_fd(), offset, mbyte, f.as_fd(), 0, m.len()).map_err(|e| explain(e, file, offset))?
            } else {
                from_stream(&target, file, offset, mbyte, f, Some(m.len()))?
            }
        }
        Some(Source::Stdin) => from_stream(&target, file, offset, mbyte, std::io::stdin().lock(), None)?,
    };
    if std::io::stderr().is_terminal() {
        eprintln!(
            "{}: now {} bytes (re-chunked {}, stored {} new)",
            file.display(),
            outcome.new_size,
            crate::size::human(outcome.rechunked),
            crate::size::human(outcome.new_bytes)
        );
    }
    Ok(())
}

/// New bytes from a stream: small ones go inline; larger ones are written
/// to a scratch file beside the target first (stored once, deduplicated)
/// and spliced in from there.
fn from_stream(target: &File, file: &Path, offset: u64, mbyte: u64, mut r: impl Read, len: Option<u64>) -> Result<cairn::Outcome> {
    let mut head = Vec::with_capacity(cairn::ioctl::INLINE_MAX + 1);
    (&mut r).take(cairn::ioctl::INLINE_MAX as u64 + 1).read_to_end(&mut head)?;
    if head.len() <= cairn::ioctl::INLINE_MAX {
        return cairn::rpwrite(target.as_fd(), &head, offset, mbyte).map_err(|e| explain(e, file, offset));
    }
    let dir = file.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let scratch = Scratch::create(dir)?;
    let total = crate::progress::copy_with_bar("staging", &head, r, &scratch.file, len)?;
    cairn::rpsplice(target.as_fd(), offset, mbyte, scratch.file.as_fd(), 0, total).map_err(|e| explain(e, file, offset))
}

/// A scratch file in the mount, removed when dropped, and also when the
/// command is stopped by SIGTERM, SIGINT or SIGHUP (a handler unlinks it
/// before the signal takes its default course), so an interrupted
/// `cairn insert --from -` or `archive import` leaves nothing in the mount.
pub(crate) struct Scratch {
    pub path: PathBuf,
    pub file: File,
    slot: Option<usize>,
}

/// Paths (NUL-terminated, leaked while registered) the signal handler
/// unlinks. Only atomics are touched in the handler.
static SCRATCH_PATHS: [std::sync::atomic::AtomicPtr<libc::c_char>; 8] = [const { std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()) }; 8];
const CLEANUP_SIGNALS: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

extern "C" fn remove_scratch_on_signal(sig: libc::c_int) {
    use std::sync::atomic::Ordering;
    for slot in &SCRATCH_PATHS {
        let p = slot.swap(std::ptr::null_mut(), Ordering::SeqCst);
        if !p.is_null() {
            // SAFETY: p came from CString::into_raw and is never freed while
            // registered (Drop swaps it out first); unlink is async-signal-safe.
            unsafe { libc::unlink(p) };
        }
    }
    // SAFETY: restoring the default action and re-raising are async-signal-safe.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

fn install_cleanup_handler() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for sig in CLEANUP_SIGNALS {
            // SAFETY: a plain handler touching only atomics and unlink. A
            // signal the process ignores (nohup) stays ignored.
            unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                libc::sigaction(sig, std::ptr::null(), &mut old);
                if old.sa_sigaction == libc::SIG_IGN {
                    continue;
                }
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = remove_scratch_on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
                libc::sigemptyset(&mut sa.sa_mask);
                sa.sa_flags = libc::SA_RESTART;
                libc::sigaction(sig, &sa, std::ptr::null_mut());
            }
        }
    });
}

fn register_scratch(path: &Path) -> Option<usize> {
    use std::sync::atomic::Ordering;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    install_cleanup_handler();
    let raw = c.into_raw();
    for (i, slot) in SCRATCH_PATHS.iter().enumerate() {
        if slot.compare_exchange(std::ptr::null_mut(), raw, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            return Some(i);
        }
    }
    // SAFETY: raw came from into_raw just above and was not stored.
    drop(unsafe { std::ffi::CString::from_raw(raw) });
    None
}

fn unregister_scratch(slot: usize) {
    let p = SCRATCH_PATHS[slot].swap(std::ptr::null_mut(), std::sync::atomic::Ordering::SeqCst);
    if !p.is_null() {
        // SAFETY: stored by register_scratch from CString::into_raw.
        drop(unsafe { std::ffi::CString::from_raw(p) });
    }
}

impl Scratch {
    pub(crate) fn create(dir: &Path) -> Result<Scratch> {
        Scratch::named(dir, "insert")
    }

    pub(crate) fn named(dir: &Path, what: &str) -> Result<Scratch> {
        for n in 0..1000 {
            let path = dir.join(format!(".cairn-{what}.{}.{n}", std::process::id()));
            match OpenOptions::new().read(true).write(true).create_new(true).open(&path) {
                Ok(file) => {
                    let slot = register_scratch(&path);
                    return Ok(Scratch { path, file, slot });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e).with_context(|| format!("creating a scratch file in {}", dir.display())),
            }
        }
        bail!("no free scratch file name in {}", dir.display())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        if let Some(slot) = self.slot.take() {
            unregister_scratch(slot);
        }
    }
}

/// A path inside a Cairn mount: the mount's control socket and the path
/// from the volume root. The last component is not followed.
pub(crate) struct InMount {
    pub socket: PathBuf,
    pub mountpoint: PathBuf,
    pub rel: Vec<u8>,
}

pub(crate) fn locate(path: &Path) -> Result<InMount> {
    let abs = if path.is_absolute() { path.to_path_buf() } else { std::env::current_dir()?.join(path) };
    let name = abs.file_name().map(|n| n.to_owned());
    let parent = abs.parent().unwrap_or(Path::new("/"));
    let parent = std::fs::canonicalize(parent).with_context(|| format!("{}", parent.display()))?;
    let full = match &name {
        Some(n) if n != ".." && n != "." => parent.join(n),
        _ => std::fs::canonicalize(&abs)?,
    };
    let (mountpoint, _) = cairn_fuse::mount_containing(&full)?.ok_or_else(|| anyhow!("{} is in no mount", path.display()))?;
    let entry = cairn_fuse::mounttable::mount_entry(&mountpoint)?.ok_or_else(|| anyhow!("{} is in no mount", path.display()))?;
    let dir = crate::runtime::local_dir_of(&entry).ok_or_else(|| anyhow!("{} is not inside a Cairn mount", path.display()))?;
    let socket = control::socket_path(&dir);
    let rel = full.strip_prefix(&mountpoint).expect("inside").as_os_str().as_bytes().to_vec();
    Ok(InMount { socket, mountpoint, rel })
}

pub(crate) fn ask(m: &InMount, req: &Request) -> Result<serde_json::Value> {
    // A request that reads files answers from what the daemon has: bytes
    // the kernel still caches (the writeback cache) must reach it first.
    let reads_files = !matches!(req, Request::Stats | Request::SnapshotList | Request::SnapshotDelete { .. });
    if reads_files {
        cairn_fuse::push_cached_writes(&m.mountpoint).with_context(|| format!("syncfs {}", m.mountpoint.display()))?;
    }
    match control::call(&m.socket, req) {
        Ok(Some(v)) => Ok(v),
        Ok(None) => bail!("the mount at {} does not answer on {} (is its daemon running?)", m.mountpoint.display(), m.socket.display()),
        Err(e) if e.to_string().contains("Permission denied") => {
            bail!("{}: permission denied (clone and snapshots go through the mount's control socket, open to the user who mounted it)", m.socket.display())
        }
        Err(e) => Err(e.into()),
    }
}

/// `cairn clone SRC DST`.
pub fn clone(src: &Path, dst: &Path) -> Result<()> {
    let s = locate(src)?;
    let d = locate(dst)?;
    if s.socket != d.socket {
        bail!("{} and {} are not in the same Cairn volume", src.display(), dst.display());
    }
    if d.rel.is_empty() {
        bail!("{} is the root of the mount", dst.display());
    }
    ask(&s, &Request::Clone { src: s.rel.clone(), dst: d.rel.clone() })?;
    Ok(())
}

/// The mount holding `at` (a path inside it).
fn mount_of(at: &Path) -> Result<InMount> {
    let m = locate(at)?;
    Ok(InMount { rel: Vec::new(), ..m })
}

pub fn snapshot_create(at: &Path, name: &str) -> Result<()> {
    let m = mount_of(at)?;
    ask(&m, &Request::SnapshotCreate { name: name.to_string() })?;
    println!("created snapshot {name}: {}", m.mountpoint.join(cairn_engine::SNAPSHOT_DIR).join(name).display());
    Ok(())
}

pub fn snapshot_delete(at: &Path, name: &str) -> Result<()> {
    let m = mount_of(at)?;
    ask(&m, &Request::SnapshotDelete { name: name.to_string() })?;
    Ok(())
}

pub fn snapshot_list(at: &Path, json: bool) -> Result<()> {
    let m = mount_of(at)?;
    let v = ask(&m, &Request::SnapshotList)?;
    let list: Vec<cairn_engine::SnapshotInfo> = serde_json::from_value(v).context("reading the snapshot list")?;
    if json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    for s in list {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(s.created_ns.max(0) as u64);
        let secs = t.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        println!("{}\t{}", s.name, cairn_engine::format_utc(secs));
    }
    Ok(())
}
