//! Running a mount in the background, and unmounting with a wait.
//!
//! The parent forks before any thread exists; the child opens the volume and
//! mounts, then reports "ok" (or the error) through a pipe, so `cairn mount`
//! exits 0 only once the mount is really there.

use anyhow::{anyhow, bail, Context, Result};
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Forks; the child runs `work(ready)` detached from the terminal.
pub fn run_in_background(work: impl FnOnce(&mut dyn FnMut()) -> Result<()>) -> Result<i32> {
    let mut fds = [0; 2];
    // SAFETY: pipe writes two fds into the array.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error()).context("creating a pipe");
    }
    // SAFETY: the fds were just created and are owned here.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: no other thread exists yet in this process.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error()).context("fork");
    }
    if pid > 0 {
        drop(wr);
        let mut msg = String::new();
        std::fs::File::from(rd).read_to_string(&mut msg).ok();
        if msg == "ok" {
            return Ok(0);
        }
        let msg = msg.strip_prefix("error: ").unwrap_or(&msg).trim().to_string();
        if msg.is_empty() {
            bail!("the mount process exited before mounting (see the log file)");
        }
        bail!("{msg}");
    }
    drop(rd);
    // Child: new session, stdio to /dev/null.
    // SAFETY: plain syscalls on our own process.
    unsafe {
        libc::setsid();
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::dup2(null, 1);
            libc::dup2(null, 2);
            if null > 2 {
                libc::close(null);
            }
        }
    }
    let mut pipe = Some(std::fs::File::from(wr));
    let mut ready = || {
        if let Some(mut p) = pipe.take() {
            let _ = p.write_all(b"ok");
        }
    };
    let r = work(&mut ready);
    let code = match r {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!("{e:#}");
            if let Some(mut p) = pipe.take() {
                let _ = write!(p, "error: {e:#}");
            }
            1
        }
    };
    drop(pipe);
    std::process::exit(code);
}

/// The volume directory behind a Cairn mount (`None` for another mount),
/// and whether anything is mounted there at all.
fn volume_of(mountpoint: &Path) -> Result<(bool, Option<PathBuf>)> {
    let mp = std::fs::canonicalize(mountpoint).with_context(|| format!("mountpoint {}", mountpoint.display()))?;
    let Some(m) = cairn_fuse::mounttable::mount_entry(&mp).context("reading /proc/self/mountinfo")? else { return Ok((false, None)) };
    Ok((true, crate::runtime::local_dir_of(&m)))
}

/// Unmounts, then waits until the daemon has flushed and released the volume.
pub fn unmount_and_wait(mountpoint: &Path, timeout: Duration) -> Result<()> {
    let (mounted, vol) = volume_of(mountpoint)?;
    if !mounted {
        bail!("{} is not mounted", mountpoint.display());
    }
    cairn_fuse::unmount(mountpoint).map_err(|e| anyhow!("unmounting {}: {e}", mountpoint.display()))?;
    let Some(dir) = vol else { return Ok(()) };
    let lock = dir.join("lock");
    let start = Instant::now();
    let mut uploads = UploadBar::new(&dir);
    loop {
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&lock);
        let Ok(f) = f else { return Ok(()) };
        use std::os::fd::AsRawFd;
        // SAFETY: flock on an fd we own; released when f drops.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return close_outcome(mountpoint, &dir);
        }
        if start.elapsed() > timeout {
            uploads.finish();
            bail!("unmounted, but the daemon is still flushing {} after {}s (see {}/cairn.log)", dir.display(), timeout.as_secs(), dir.display());
        }
        uploads.tick();
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The most of the close's reason `cairn umount` reads.
const CLOSE_ERROR_MAX: u64 = 4096;

/// Once the daemon let the directory go: whether its close failed (it
/// left the reason in the directory), e.g. a volume in a bucket whose
/// lease was lost while mounted.
fn close_outcome(mountpoint: &Path, dir: &Path) -> Result<()> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = dir.join(cairn_engine::CLOSE_ERROR);
    // Whoever unmounts may not own the directory: never through a symlink
    // planted there, and at most a screenful whatever the file holds.
    let Ok(file) = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(&f) else { return Ok(()) };
    let mut why = Vec::new();
    if !file.metadata().is_ok_and(|m| m.is_file()) || file.take(CLOSE_ERROR_MAX).read_to_end(&mut why).is_err() {
        return Ok(());
    }
    let _ = std::fs::remove_file(&f);
    bail!("{} is unmounted, but the volume did not close cleanly: {} (see {}/cairn.log)", mountpoint.display(), String::from_utf8_lossy(&why).trim(), dir.display())
}

/// While a volume in a bucket uploads what it still holds, a progress bar
/// of the bytes left (on a terminal; the daemon answers `stats` through its
/// control socket until it exits).
struct UploadBar {
    sock: PathBuf,
    bar: Option<indicatif::ProgressBar>,
    most: u64,
    last: Instant,
    enabled: bool,
}

impl UploadBar {
    fn new(dir: &Path) -> Self {
        use std::io::IsTerminal;
        UploadBar { sock: cairn_engine::control::socket_path(dir), bar: None, most: 0, last: Instant::now(), enabled: std::io::stderr().is_terminal() }
    }

    fn tick(&mut self) {
        if !self.enabled || self.last.elapsed() < Duration::from_millis(500) {
            return;
        }
        self.last = Instant::now();
        let Ok(Some(v)) = cairn_engine::control::call(&self.sock, &cairn_engine::control::Request::Stats) else { return };
        let Some(left) = v.get("cache").and_then(|c| c.get("dirty_bytes")).and_then(|d| d.as_u64()) else { return };
        if left == 0 && self.bar.is_none() {
            return;
        }
        self.most = self.most.max(left);
        let bar = self.bar.get_or_insert_with(|| {
            let b = indicatif::ProgressBar::new(self.most);
            b.set_style(indicatif::ProgressStyle::with_template("uploading [{bar:40}] {bytes}/{total_bytes} {eta}").expect("template").progress_chars("=> "));
            b
        });
        bar.set_length(self.most);
        bar.set_position(self.most - left);
    }

    fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

impl Drop for UploadBar {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::close_outcome;
    use std::path::Path;

    #[test]
    fn the_close_error_is_reported_once_bounded_and_never_through_a_symlink() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join(cairn_engine::CLOSE_ERROR);
        let mnt = Path::new("/mnt/x");
        assert!(close_outcome(mnt, d.path()).is_ok(), "no file: a clean close");
        std::fs::write(&f, "the lease was lost\n").unwrap();
        let e = format!("{:#}", close_outcome(mnt, d.path()).unwrap_err());
        assert!(e.contains("did not close cleanly: the lease was lost (see"), "{e}");
        assert!(!f.exists(), "reported once: the file is removed");
        // A huge file is read only as far as a screenful.
        std::fs::write(&f, vec![b'x'; 1 << 20]).unwrap();
        let e = format!("{:#}", close_outcome(mnt, d.path()).unwrap_err());
        assert!(e.len() < 5000, "{} bytes of error", e.len());
        // A symlink planted in its place is not followed (here to a secret).
        let secret = d.path().join("secret");
        std::fs::write(&secret, "top secret").unwrap();
        std::os::unix::fs::symlink(&secret, &f).unwrap();
        let r = close_outcome(mnt, d.path());
        assert!(r.as_ref().map_or_else(|e| !format!("{e:#}").contains("top secret"), |_| true), "{r:?}");
        // Nor a FIFO, which would block the unmount forever.
        std::fs::remove_file(&f).unwrap();
        assert!(std::process::Command::new("mkfifo").arg(&f).status().unwrap().success());
        assert!(close_outcome(mnt, d.path()).is_ok());
    }
}
