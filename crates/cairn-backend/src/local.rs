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
}

impl LocalBackend {
    /// Opens an existing backend directory.
    pub fn open(root: &Path) -> Result<Self> {
        let md = fs::metadata(root).map_err(|e| Error::from_io(&format!("backend directory {}", root.display()), e))?;
        if !md.is_dir() {
            return Err(Error::new(ErrorKind::Permanent, format!("backend {} is not a directory", root.display())));
        }
        Ok(LocalBackend { root: root.to_path_buf(), bounce: direct::BouncePool::default() })
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
    const BOUNCE_LEN: usize = 4 << 20;
    /// Buffers kept for reuse (one an upload thread; the engine runs two).
    const KEEP: usize = 2;

    /// A heap buffer aligned for `O_DIRECT`.
    pub struct Bounce {
        ptr: std::ptr::NonNull<u8>,
    }
    // SAFETY: the buffer is plain bytes owned by this value alone.
    unsafe impl Send for Bounce {}

    fn layout() -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(BOUNCE_LEN, ALIGN).expect("valid layout")
    }

    impl Bounce {
        fn new() -> Self {
            // SAFETY: the layout has a non-zero size.
            let p = unsafe { std::alloc::alloc(layout()) };
            let ptr = std::ptr::NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout()));
            Bounce { ptr }
        }
        fn fill(&mut self, src: &[u8]) -> &[u8] {
            assert!(src.len() <= BOUNCE_LEN);
            // SAFETY: `ptr` points at BOUNCE_LEN writable bytes owned by self,
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
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout()) }
        }
    }

    #[derive(Default)]
    pub struct BouncePool(std::sync::Mutex<Vec<Bounce>>);

    impl std::fmt::Debug for BouncePool {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("BouncePool")
        }
    }

    impl BouncePool {
        fn take(&self) -> Bounce {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).pop().unwrap_or_else(Bounce::new)
        }
        /// Buffers held for reuse.
        #[cfg(test)]
        pub fn kept(&self) -> usize {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
        }
        fn give(&self, b: Bounce) {
            let mut v = self.0.lock().unwrap_or_else(|e| e.into_inner());
            if v.len() < KEEP {
                v.push(b);
            }
        }
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
                let n = (body - done).min(BOUNCE_LEN);
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
    /// the ranges are adjacent, so one seek and consecutive reads.
    fn get_ranges(&self, name: &str, ranges: &[(u64, u64)]) -> Result<Vec<Vec<u8>>> {
        let (start, span) = crate::span_of(ranges)?;
        let path = self.path(name)?;
        let mut f = File::open(&path).map_err(|e| Error::from_io(&format!("object {name}"), e).with_object(name))?;
        let size = f.metadata().map_err(|e| Error::from_io(name, e).with_object(name))?.len();
        if start + span > size {
            return Err(Error::new(ErrorKind::OutOfRange, format!("object {name}: range {start}+{span} past its end ({size} bytes): truncated?")).with_object(name));
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

    /// On a disk file system the aligned body really goes direct.
    #[test]
    fn the_aligned_body_is_written_direct_on_a_disk_file_system() {
        let dir = disk_dir();
        let path = dir.path().join("f");
        let mut f = OpenOptions::new().write(true).create_new(true).open(&path).unwrap();
        let data = pattern((5 << 20) + 100);
        let pool = direct::BouncePool::default();
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
            let pool = direct::BouncePool::default();
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
