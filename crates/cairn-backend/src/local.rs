//! A backend in a local directory: one file per object.

use crate::{validate_name, Backend, Capabilities, Error, ErrorKind, ObjectInfo, Result};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Objects as files below a root directory. Writes are staged in `tmp/`,
/// fsynced, renamed into place, and the directory is fsynced, so a crash
/// never leaves a partial object under its final name.
#[derive(Debug)]
pub struct LocalBackend {
    root: PathBuf,
    /// Aligned buffers for direct writes, kept between puts.
    bounce: direct::BouncePool,
    /// Aligned buffers for direct reads, kept between reads.
    reads: direct::BouncePool,
}

impl LocalBackend {
    /// Opens an existing backend directory.
    pub fn open(root: &Path) -> Result<Self> {
        let md = fs::metadata(root).map_err(|e| Error::from_io(&format!("backend directory {}", root.display()), e))?;
        if !md.is_dir() {
            return Err(Error::new(ErrorKind::Permanent, format!("backend {} is not a directory", root.display())));
        }
        Ok(LocalBackend { root: root.to_path_buf(), bounce: direct::BouncePool::for_writes(), reads: direct::BouncePool::for_reads() })
    }

    /// Creates the directory (and parents) if needed and opens it.
    pub fn create(root: &Path) -> Result<Self> {
        create_dir_durable(&root.join("tmp")).map_err(|e| Error::from_io(&format!("creating {}", root.display()), e))?;
        Self::open(root)
    }

    /// The directory that holds the objects.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, name: &str) -> Result<PathBuf> {
        validate_name(name)?;
        Ok(self.root.join(name))
    }
}

/// Writes a new object's bytes: large objects mostly with direct I/O.
///
/// A pack is written once, fsync'd, and read back later only in small
/// ranges, so copying it into the page cache first is wasted work: on this
/// project's test machine a buffered write of 1 GiB with fsync ran at
/// 184-680 MB/s and a direct one at 850-1,100 MB/s, and the copy was the
/// largest single cost of the daemon's sequential write (docs/profile.md).
/// The aligned body is written with `O_DIRECT`, from where it is when its
/// address is aligned (a pack the engine built), else through a reused
/// 4 MiB aligned buffer; the unaligned tail (under 4 KiB) is written buffered. A file
/// system that refuses `O_DIRECT` (tmpfs) gets a plain buffered write.
fn write_object(f: &mut File, data: &[u8], pool: &direct::BouncePool) -> std::io::Result<()> {
    let written = if data.len() >= direct::MIN_LEN { direct::write_aligned_prefix(f, data, pool)? } else { 0 };
    f.write_all(&data[written..])
}

mod direct {
    use std::fs::File;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    /// Objects below this size are written buffered.
    pub const MIN_LEN: usize = 1 << 20;
    /// Alignment of buffer addresses, lengths and file offsets.
    const ALIGN: usize = 4096;
    /// A bounce buffer for bytes written from an unaligned address.
    const BOUNCE_LEN: usize = 4 << 20;
    /// Bounce buffers kept (one an upload thread; the engine runs two).
    const KEEP_WRITES: usize = 2;
    /// A read buffer: a whole prefetch run of a local volume (16 MiB) and
    /// its alignment on both sides, read by one request, so the device
    /// has all of it in flight at once. (Reads in 4 MiB windows ran 10 to
    /// 30% slower than through the page cache and its read-ahead.)
    const READ_LEN: usize = (16 << 20) + 2 * ALIGN;
    /// Read buffers kept: one for each of the engine's fetch threads.
    const KEEP_READS: usize = 4;

    /// A heap buffer aligned for `O_DIRECT`.
    pub struct Bounce {
        ptr: std::ptr::NonNull<u8>,
        len: usize,
    }
    // SAFETY: the buffer is plain bytes owned by this value alone.
    unsafe impl Send for Bounce {}

    fn layout(len: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(len, ALIGN).expect("valid layout")
    }

    impl Bounce {
        fn new(len: usize) -> Self {
            // Zeroed once, so the reads into it (`as_mut_slice`) never see
            // uninitialised bytes. SAFETY: the layout has a non-zero size.
            let p = unsafe { std::alloc::alloc_zeroed(layout(len)) };
            let ptr = std::ptr::NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout(len)));
            Bounce { ptr, len }
        }
        fn as_mut_slice(&mut self) -> &mut [u8] {
            // SAFETY: `ptr` points at `len` initialised bytes owned by
            // self, and the borrow of self keeps them exclusive.
            unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
        }
        fn fill(&mut self, src: &[u8]) -> &[u8] {
            assert!(src.len() <= self.len);
            // SAFETY: `ptr` points at `len` writable bytes owned by self,
            // which cannot overlap `src` (a shared borrow of other memory).
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr(), src.len());
                std::slice::from_raw_parts(self.ptr.as_ptr(), src.len())
            }
        }
    }

    impl Drop for Bounce {
        fn drop(&mut self) {
            // SAFETY: allocated in `new` with the same layout.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout(self.len)) }
        }
    }

    /// Buffers of one size, up to `keep` of them kept for reuse.
    pub struct BouncePool {
        free: std::sync::Mutex<Vec<Bounce>>,
        len: usize,
        keep: usize,
    }

    impl std::fmt::Debug for BouncePool {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("BouncePool")
        }
    }

    impl BouncePool {
        pub fn for_writes() -> Self {
            BouncePool { free: Default::default(), len: BOUNCE_LEN, keep: KEEP_WRITES }
        }
        pub fn for_reads() -> Self {
            BouncePool { free: Default::default(), len: READ_LEN, keep: KEEP_READS }
        }
        fn take(&self) -> Bounce {
            self.free.lock().unwrap_or_else(|e| e.into_inner()).pop().unwrap_or_else(|| Bounce::new(self.len))
        }
        /// Buffers held for reuse.
        #[cfg(test)]
        pub fn kept(&self) -> usize {
            self.free.lock().unwrap_or_else(|e| e.into_inner()).len()
        }
        fn give(&self, b: Bounce) {
            let mut v = self.free.lock().unwrap_or_else(|e| e.into_inner());
            if v.len() < self.keep {
                v.push(b);
            }
        }
    }

    /// Reads below this span go through the page cache.
    pub const MIN_READ: u64 = 64 << 10;

    /// Reads the adjacent `ranges` (their span starting at `start`, inside
    /// a file of `size` bytes) with `O_DIRECT`, one buffer each; `None`
    /// when the file system refuses direct I/O. Aligned windows of up to
    /// the pool's buffer size are read into a pooled buffer and each
    /// range's bytes copied out once: the copy the page cache would make,
    /// without filling the page cache (and reading ahead) with bytes the
    /// engine's chunk cache already holds decoded.
    pub fn read_ranges(f: &File, start: u64, size: u64, ranges: &[(u64, u64)], pool: &BouncePool) -> std::io::Result<Option<Vec<Vec<u8>>>> {
        use std::os::unix::fs::FileExt;
        if !set_direct(f, true)? {
            return Ok(None);
        }
        let mut out: Vec<Vec<u8>> = ranges.iter().map(|&(_, len)| Vec::with_capacity(len as usize)).collect();
        let end = ranges.last().map_or(start, |&(off, len)| off + len);
        let mut bounce = pool.take();
        let result = (|| {
            let mut pos = start / ALIGN as u64 * ALIGN as u64;
            // The range being filled (ranges are in order and adjacent).
            let mut k = 0;
            while pos < end {
                let buf = bounce.as_mut_slice();
                let want = ((end - pos) as usize).next_multiple_of(ALIGN).min(buf.len());
                let mut got = 0;
                while got < want {
                    match f.read_at(&mut buf[got..want], pos + got as u64) {
                        Ok(0) => break,
                        Ok(n) => got += n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                    // Past the end of the file, or a short read left unaligned.
                    if got % ALIGN != 0 || pos + got as u64 >= size {
                        break;
                    }
                }
                let window_end = pos + got as u64;
                if got == 0 {
                    return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, format!("short read at {pos} of a {size}-byte file")));
                }
                // Copy this window's share of each range still open.
                while k < ranges.len() {
                    let (off, len) = ranges[k];
                    let from = off + out[k].len() as u64;
                    let to = (off + len).min(window_end);
                    if from < to {
                        out[k].extend_from_slice(&buf[(from - pos) as usize..(to - pos) as usize]);
                    }
                    if out[k].len() as u64 == len {
                        k += 1;
                    } else {
                        break;
                    }
                }
                if window_end >= end {
                    break;
                }
                // A short read that ended unaligned (not seen on Linux's
                // disk file systems) resumes from the block it ended in.
                let next = window_end / ALIGN as u64 * ALIGN as u64;
                if next == pos {
                    return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, format!("direct read at {pos} returned {got} bytes")));
                }
                pos = next;
            }
            Ok(())
        })();
        pool.give(bounce);
        set_direct(f, false)?;
        result.map(|()| Some(out))
    }

    fn set_direct(f: &File, on: bool) -> std::io::Result<bool> {
        let fd = f.as_raw_fd();
        // SAFETY: fcntl on a valid descriptor owned by `f`.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let new = if on { flags | libc::O_DIRECT } else { flags & !libc::O_DIRECT };
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd, libc::F_SETFL, new) } < 0 {
            let e = std::io::Error::last_os_error();
            // The file system has no direct I/O.
            return if on && e.raw_os_error() == Some(libc::EINVAL) { Ok(false) } else { Err(e) };
        }
        Ok(true)
    }

    /// Writes the longest aligned prefix of `data` with `O_DIRECT` at the
    /// start of the empty file `f`; returns how many bytes it wrote (0 when
    /// direct I/O is refused). The descriptor is buffered again afterwards.
    pub fn write_aligned_prefix(f: &mut File, data: &[u8], pool: &BouncePool) -> std::io::Result<usize> {
        let body = data.len() / ALIGN * ALIGN;
        if body == 0 || !set_direct(f, true)? {
            return Ok(0);
        }
        // Bytes already at an aligned address (the engine builds packs so)
        // are written from where they are: no bounce copy.
        let in_place = data.as_ptr() as usize % ALIGN == 0;
        let mut bounce = if in_place { None } else { Some(pool.take()) };
        let mut done = 0;
        let result = (|| {
            while done < body {
                // In place, the whole body in one request: the device gets
                // all of it in flight at once (4 MiB requests left it one
                // request deep between them).
                let n = match &bounce {
                    Some(b) => (body - done).min(b.len),
                    None => body - done,
                };
                let buf = match &mut bounce {
                    Some(b) => b.fill(&data[done..done + n]),
                    None => &data[done..done + n],
                };
                let mut off = 0;
                while off < n {
                    match f.write(&buf[off..]) {
                        Ok(0) => return Err(std::io::Error::new(std::io::ErrorKind::WriteZero, "direct write wrote nothing")),
                        Ok(k) => off += k,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                    // A short write that leaves the offset unaligned ends
                    // the direct part; the caller writes the rest buffered.
                    if off % ALIGN != 0 {
                        done += off;
                        return Ok(());
                    }
                }
                done += n;
            }
            Ok(())
        })();
        if let Some(b) = bounce {
            pool.give(b);
        }
        set_direct(f, false)?;
        result.map(|()| done)
    }
}

/// An object's tag on a local directory: a hash of its bytes.
fn tag_of(data: &[u8]) -> String {
    blake3::hash(data).to_hex()[..32].to_string()
}

fn fsync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// `create_dir_all` whose new directories survive a power cut: each one
/// created here is made durable in its parent (an fsync of the new
/// directory's contents alone would not keep its name).
fn create_dir_durable(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent() {
        create_dir_durable(parent)?;
    }
    // Private to the owner (a volume's packs hold its files' content).
    match std::os::unix::fs::DirBuilderExt::mode(&mut fs::DirBuilder::new(), 0o700).create(dir) {
        Ok(()) => fsync_dir(dir.parent().unwrap_or(Path::new("/"))),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Opens (creating) the lock file of `put_if_match`: private to its owner
/// whatever the umask (0600, and a file left wider by an older version is
/// narrowed), and never through a symlink planted in its place.
fn open_update_lock(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    if f.metadata()?.permissions().mode() & 0o7777 != 0o600 {
        f.set_permissions(fs::Permissions::from_mode(0o600))?;
    }
    Ok(f)
}

impl LocalBackend {
    /// Writes `data` to a staging file, makes it durable, then gives it its
    /// name: rename(2) replaces, link(2) creates only if the name is free
    /// (atomically: of two racing creates one gets EEXIST).
    fn store(&self, name: &str, data: &[u8], only_if_absent: bool) -> Result<()> {
        let path = self.path(name)?;
        let parent = path.parent().unwrap_or(&self.root).to_path_buf();
        let tmpdir = self.root.join("tmp");
        let ctx = |e| Error::from_io(&format!("writing object {name} in {}", self.root.display()), e).with_object(name);
        create_dir_durable(&parent).map_err(ctx)?;
        create_dir_durable(&tmpdir).map_err(ctx)?;
        let tmp = tmpdir.join(format!("{}.{:016x}", std::process::id(), rand::random::<u64>()));
        let result = (|| {
            let mut f = std::os::unix::fs::OpenOptionsExt::mode(OpenOptions::new().write(true).create_new(true), 0o600).open(&tmp)?;
            write_object(&mut f, data, &self.bounce)?;
            f.sync_all()?;
            drop(f);
            if only_if_absent {
                fs::hard_link(&tmp, &path)?;
                fs::remove_file(&tmp)?;
            } else {
                fs::rename(&tmp, &path)?;
            }
            fsync_dir(&parent)
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result.map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => Error::new(ErrorKind::AlreadyExists, format!("object {name} already exists")).with_object(name),
            _ => ctx(e),
        })
    }
}

impl Backend for LocalBackend {
    fn put(&self, name: &str, data: &[u8]) -> Result<()> {
        self.store(name, data, false)
    }

    fn put_if_absent(&self, name: &str, data: &[u8]) -> Result<()> {
        self.store(name, data, true)
    }

    fn conditional_updates(&self) -> bool {
        true
    }

    fn get_tagged(&self, name: &str) -> Result<(Vec<u8>, String)> {
        let data = self.get(name)?;
        let tag = tag_of(&data);
        Ok((data, tag))
    }

    /// Compare and replace under an exclusive `flock` of `tmp/update.lock`,
    /// so updates by every process using this directory are serialised (a
    /// plain `put` or `delete` does not take it: only updates exclude each
    /// other, as the contract asks).
    fn put_if_match(&self, name: &str, data: &[u8], tag: &str) -> Result<String> {
        validate_name(name)?;
        let lock_path = self.root.join("tmp").join("update.lock");
        let ctx = |e| Error::from_io(&format!("locking {}", lock_path.display()), e).with_object(name);
        create_dir_durable(&self.root.join("tmp")).map_err(ctx)?;
        let lock = open_update_lock(&lock_path).map_err(ctx)?;
        // SAFETY: flock on a descriptor this function owns; released when `lock` is dropped.
        if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) } != 0 {
            return Err(ctx(std::io::Error::last_os_error()));
        }
        let current = match self.get(name) {
            Ok(d) => Some(tag_of(&d)),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        if current.as_deref() != Some(tag) {
            return Err(Error::new(ErrorKind::Changed, format!("object {name} was replaced or deleted (tag {tag} no longer matches)")).with_object(name));
        }
        self.store(name, data, false)?;
        drop(lock);
        Ok(tag_of(data))
    }

    fn get_range(&self, name: &str, offset: u64, len: u64) -> Result<Vec<u8>> {
        Ok(self.get_ranges(name, &[(offset, len)])?.pop().unwrap_or_default())
    }

    /// One open, then each range read into its own buffer (no span to cut):
    /// a span of 64 KiB or more with `O_DIRECT` (`direct::read_ranges`),
    /// a smaller one by one seek and consecutive
    /// buffered reads (the ranges are adjacent).
    fn get_ranges(&self, name: &str, ranges: &[(u64, u64)]) -> Result<Vec<Vec<u8>>> {
        let (start, span) = crate::span_of(ranges)?;
        let path = self.path(name)?;
        let mut f = File::open(&path).map_err(|e| Error::from_io(&format!("object {name}"), e).with_object(name))?;
        let size = f.metadata().map_err(|e| Error::from_io(name, e).with_object(name))?.len();
        if start + span > size {
            return Err(Error::new(ErrorKind::OutOfRange, format!("object {name}: range {start}+{span} past its end ({size} bytes): truncated?")).with_object(name));
        }
        if span >= direct::MIN_READ {
            if let Some(bufs) = direct::read_ranges(&f, start, size, ranges, &self.reads).map_err(|e| Error::from_io(&format!("reading object {name}"), e).with_object(name))? {
                return Ok(bufs);
            }
        }
        f.seek(SeekFrom::Start(start)).map_err(|e| Error::from_io(&format!("reading object {name}"), e).with_object(name))?;
        ranges
            .iter()
            .map(|&(_, len)| {
                // Read into spare capacity: no zero-filling first.
                let mut buf = Vec::with_capacity(len as usize);
                (&mut f).take(len).read_to_end(&mut buf).map_err(|e| Error::from_io(&format!("reading object {name}"), e).with_object(name))?;
                if buf.len() as u64 != len {
                    return Err(Error::new(ErrorKind::OutOfRange, format!("object {name}: short read ({} of {len} bytes)", buf.len())).with_object(name));
                }
                Ok(buf)
            })
            .collect()
    }

    fn get(&self, name: &str) -> Result<Vec<u8>> {
        let path = self.path(name)?;
        let mut f = File::open(&path).map_err(|e| Error::from_io(&format!("object {name}"), e).with_object(name))?;
        let mut buf = Vec::new();
        f.seek(SeekFrom::Start(0)).and_then(|_| f.read_to_end(&mut buf)).map_err(|e| Error::from_io(&format!("reading object {name}"), e).with_object(name))?;
        Ok(buf)
    }

    fn size(&self, name: &str) -> Result<u64> {
        let path = self.path(name)?;
        Ok(fs::metadata(&path).map_err(|e| Error::from_io(&format!("object {name}"), e).with_object(name))?.len())
    }

    fn delete(&self, name: &str) -> Result<()> {
        let path = self.path(name)?;
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::from_io(&format!("deleting object {name}"), e).with_object(name)),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let mut out = Vec::new();
        let mut stack = vec![(self.root.clone(), String::new())];
        while let Some((dir, rel)) = stack.pop() {
            let rd = match fs::read_dir(&dir) {
                Ok(rd) => rd,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::from_io(&format!("listing {}", dir.display()), e)),
            };
            for ent in rd {
                let ent = ent.map_err(|e| Error::from_io("listing", e))?;
                let Some(fname) = ent.file_name().to_str().map(str::to_owned) else { continue };
                let name = if rel.is_empty() { fname.clone() } else { format!("{rel}/{fname}") };
                let ft = ent.file_type().map_err(|e| Error::from_io("listing", e))?;
                if ft.is_dir() {
                    if rel.is_empty() && fname == "tmp" {
                        continue; // staging area, not objects
                    }
                    // Descend only where the prefix can still match.
                    if prefix.starts_with(&name) || name.starts_with(prefix) {
                        stack.push((ent.path(), name));
                    }
                } else if ft.is_file() && name.starts_with(prefix) {
                    let size = ent.metadata().map_err(|e| Error::from_io("listing", e))?.len();
                    out.push(ObjectInfo { name, size });
                }
            }
        }
        Ok(out)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::LOCAL
    }

    fn describe(&self) -> String {
        format!("local:{}", self.root.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conformance() {
        let dir = tempfile::tempdir().unwrap();
        let b = LocalBackend::create(dir.path()).unwrap();
        crate::conformance::run_all(&b);
    }

    /// The lock file of conditional updates is 0600 even under umask 0,
    /// one left wider is narrowed, and a symlink in its place is refused.
    #[test]
    fn update_lock_is_private_whatever_the_umask() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let b = LocalBackend::create(dir.path()).unwrap();
        b.put("lease", b"a").unwrap();
        let lock = dir.path().join("tmp").join("update.lock");
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        // SAFETY: umask has no preconditions (the other tests here check no modes).
        let old = unsafe { libc::umask(0) };
        let tag = b.put_if_match("lease", b"b", &tag_of(b"a"));
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        let tag = tag.unwrap();
        assert_eq!(mode(&lock), 0o600, "a new update.lock under umask 0");
        fs::set_permissions(&lock, fs::Permissions::from_mode(0o666)).unwrap();
        let tag = b.put_if_match("lease", b"c", &tag).unwrap();
        assert_eq!(mode(&lock), 0o600, "an update.lock left 0666");
        fs::remove_file(&lock).unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::os::unix::fs::symlink(&elsewhere, &lock).unwrap();
        let e = b.put_if_match("lease", b"d", &tag).unwrap_err();
        assert!(e.to_string().contains("update.lock"), "{e}");
        assert!(!elsewhere.exists(), "the lock was created through a symlink");
        assert_eq!(b.get("lease").unwrap(), b"c");
    }

    #[test]
    fn no_staging_leftovers_after_put() {
        let dir = tempfile::tempdir().unwrap();
        let b = LocalBackend::create(dir.path()).unwrap();
        b.put("a/b", b"x").unwrap();
        assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
    }
}

#[cfg(test)]
mod direct_tests {
    use super::*;

    /// Bytes whose every 4 KiB block differs, so a block written at the
    /// wrong offset is caught.
    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_right(29) as u8).collect()
    }

    /// A directory on the disk that holds the build (tests' temp dirs may be tmpfs).
    fn disk_dir() -> tempfile::TempDir {
        // The workspace's target/ may not exist (CARGO_TARGET_DIR elsewhere).
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target");
        std::fs::create_dir_all(dir).unwrap();
        tempfile::tempdir_in(dir).unwrap()
    }

    /// Sizes around the direct-write threshold, the alignment and the bounce
    /// buffer, on a disk file system (where O_DIRECT is used) and on tmpfs
    /// (`/dev/shm`, where it is refused and the write falls back).
    #[test]
    fn objects_of_awkward_sizes_read_back_exactly() {
        let sizes = [0, 1, 4095, 4096, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, (4 << 20) + 4097, (9 << 20) + 123];
        let disk = disk_dir();
        let mem = tempfile::tempdir_in("/dev/shm").expect("tmpfs at /dev/shm");
        for root in [disk.path(), mem.path()] {
            let b = LocalBackend::create(root).unwrap();
            for (k, &n) in sizes.iter().enumerate() {
                let data = pattern(n);
                let name = format!("o/{k}");
                b.put(&name, &data).unwrap();
                assert_eq!(b.size(&name).unwrap(), n as u64, "size of a {n}-byte object in {}", root.display());
                assert!(b.get(&name).unwrap() == data, "a {n}-byte object read back differently in {}", root.display());
            }
        }
    }

    /// Ranged reads at unaligned offsets, across the bounce buffer's
    /// windows and up to the object's unaligned end read back exactly,
    /// direct on a disk file system and buffered on tmpfs.
    #[test]
    fn ranges_at_awkward_offsets_read_back_exactly() {
        let n = (9 << 20) + 123;
        let data = pattern(n);
        let disk = disk_dir();
        let mem = tempfile::tempdir_in("/dev/shm").expect("tmpfs at /dev/shm");
        for root in [disk.path(), mem.path()] {
            let b = LocalBackend::create(root).unwrap();
            b.put("o", &data).unwrap();
            let cases: &[&[(u64, u64)]] = &[
                &[(1, 70_000)],
                &[(4095, 4097), (8192, 100_000), (108_192, 1)],
                &[(100, (4 << 20) - 100), ((4 << 20), 5), ((4 << 20) + 5, (3 << 20) + 7)],
                &[(0, n as u64)],
                &[(n as u64 - 200_000, 150_000), (n as u64 - 50_000, 50_000)],
                &[(12_345, 0), (12_345, 65_536)],
            ];
            for ranges in cases {
                let got = b.get_ranges("o", ranges).unwrap();
                assert_eq!(got.len(), ranges.len());
                for (buf, &(off, len)) in got.iter().zip(ranges.iter()) {
                    assert!(buf[..] == data[off as usize..(off + len) as usize], "range {off}+{len} of {ranges:?} read back differently in {}", root.display());
                }
            }
            let f = File::open(root.join("o")).unwrap();
            let direct = direct::read_ranges(&f, 1, n as u64, &[(1, 70_000)], &b.reads).unwrap();
            if root == disk.path() {
                assert!(direct.is_some(), "direct reads refused in {} (the build's target directory must be on a disk file system)", root.display());
            }
            let past = b.get_ranges("o", &[(n as u64 - 100_000, 100_001)]).unwrap_err();
            assert_eq!(past.kind(), ErrorKind::OutOfRange);
        }
        assert!(direct::MIN_READ <= 65_536, "the cases above must take the direct path");
    }

    /// On a disk file system the aligned body really goes direct.
    #[test]
    fn the_aligned_body_is_written_direct_on_a_disk_file_system() {
        let dir = disk_dir();
        let path = dir.path().join("f");
        let mut f = OpenOptions::new().write(true).create_new(true).open(&path).unwrap();
        let data = pattern((5 << 20) + 100);
        let pool = direct::BouncePool::for_writes();
        let n = direct::write_aligned_prefix(&mut f, &data, &pool).unwrap();
        assert_eq!(n, 5 << 20, "direct I/O was refused on {} (the build's target directory must be on a disk file system)", dir.path().display());
        f.write_all(&data[n..]).unwrap();
        drop(f);
        assert!(fs::read(&path).unwrap() == data);
    }

    /// Bytes at an aligned address are written from where they are (no
    /// bounce buffer is taken); others go through one.
    #[test]
    fn bytes_at_an_aligned_address_skip_the_bounce_buffer() {
        let dir = disk_dir();
        let len = (9 << 20) + 100;
        let mut backing = pattern(len + 4096);
        let pad = (4096 - backing.as_ptr() as usize % 4096) % 4096;
        backing.truncate(pad + len);
        for (k, start) in [pad, pad + 1].into_iter().enumerate() {
            let data = &backing[start..];
            let path = dir.path().join(format!("f{k}"));
            let mut f = OpenOptions::new().write(true).create_new(true).open(&path).unwrap();
            let pool = direct::BouncePool::for_writes();
            let n = direct::write_aligned_prefix(&mut f, data, &pool).unwrap();
            assert_eq!(n, data.len() / 4096 * 4096);
            f.write_all(&data[n..]).unwrap();
            drop(f);
            assert!(fs::read(&path).unwrap() == data, "bytes from offset {start} read back differently");
            let aligned = data.as_ptr() as usize % 4096 == 0;
            assert_eq!(pool.kept(), if aligned { 0 } else { 1 }, "aligned {aligned}: a bounce buffer was {}", if aligned { "used" } else { "not used" });
        }
    }
}
