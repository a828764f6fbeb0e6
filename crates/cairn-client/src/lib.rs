//! Insert, delete and replace bytes in the middle of a file inside a Cairn
//! mount without rewriting the rest of it (VarFS's `rwrite`/`rpwrite`).
//!
//! ```no_run
//! use std::os::fd::AsFd;
//! let f = std::fs::OpenOptions::new().read(true).write(true).open("/mnt/cairn/log")?;
//! cairn::rpwrite(f.as_fd(), b"inserted ", 4096, 0)?; // insert 9 bytes at 4096
//! cairn::rpwrite(f.as_fd(), b"", 0, 9)?;             // delete the first 9 bytes
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! The call reaches the mount's daemon through an ioctl on the file
//! descriptor (protocol in [`ioctl`]); the daemon splices the file's extent
//! list and re-chunks only the chunks at the edges, so the cost does not
//! depend on the file's size. Up to [`ioctl::INLINE_MAX`] new bytes travel
//! inside the ioctl; more are first written to a scratch file beside the
//! target and then spliced in without being copied again.
//!
//! The same functions are exported for C (`include/cairn.h`, `libcairn.so`).

pub mod ioctl;

use std::ffi::OsString;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// What an rpwrite did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The file's size afterwards.
    pub new_size: u64,
    /// Bytes the daemon read back and re-chunked at the edges of the change.
    pub rechunked: u64,
    /// Bytes of chunks that were new to the volume.
    pub new_bytes: u64,
    /// Old chunks read back and cut again at the edges of the change.
    pub old_chunks: u64,
}

fn not_cairn() -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, "not a file inside a Cairn mount (the rpwrite ioctl is unknown here)")
}

/// Whether `fd` is a file of a Cairn mount that speaks this protocol.
pub fn is_cairn(fd: BorrowedFd<'_>) -> bool {
    probe(fd).is_ok()
}

fn probe(fd: BorrowedFd<'_>) -> io::Result<ioctl::Probe> {
    let mut p = ioctl::Probe::default();
    // SAFETY: IOC_PROBE's size is that of `Probe`, which outlives the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), ioctl::IOC_PROBE as _, &mut p as *mut ioctl::Probe) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::ENOTTY) | Some(libc::ENOSYS) | Some(libc::EINVAL) => not_cairn(),
            _ => e,
        });
    }
    if p.magic != ioctl::PROBE_MAGIC {
        return Err(not_cairn());
    }
    Ok(p)
}

/// Makes the kernel hand the daemon every byte written to `fd`'s file that
/// it still caches (the mount's writeback cache), and wait for them.
///
/// Closing any descriptor of a FUSE file does exactly that, on every kernel
/// version, before anything else; so a duplicate is closed. No request
/// reaches the daemon when nothing is dirty (Cairn declines FLUSH).
fn push_cached_writes(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: dup of a valid descriptor; the copy is closed right away.
    let dup = unsafe { libc::dup(fd.as_raw_fd()) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `dup` is ours. close reports the write-back's error (EIO, ENOSPC).
    if unsafe { libc::close(dup) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn call(fd: BorrowedFd<'_>, req: &mut ioctl::Rpwrite) -> io::Result<Outcome> {
    // The daemon edits what it has: first everything the kernel holds back.
    push_cached_writes(fd)?;
    // SAFETY: IOC_RPWRITE's size is that of `Rpwrite`, which outlives the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), ioctl::IOC_RPWRITE as _, req as *mut ioctl::Rpwrite) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOTTY) {
            return Err(not_cairn());
        }
        return Err(e);
    }
    // A kernel that caches writes keeps its own size for the file and
    // ignores the daemon's; the answer to a truncate is the one size it
    // takes (and it drops its pages past it). The daemon finds the size
    // unchanged, so nothing moves. Only when the kernel's size is wrong:
    // fstat answers from the kernel's cached attributes.
    if fstat(fd)?.len() != req.new_size {
        // SAFETY: ftruncate on a borrowed descriptor open for writing (the
        // ioctl checked that).
        if unsafe { libc::ftruncate(fd.as_raw_fd(), req.new_size as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(Outcome { new_size: req.new_size, rechunked: req.rechunked, new_bytes: req.new_bytes, old_chunks: req.old_chunks })
}

/// Replaces the `mbyte` bytes at `offset` of the file open on `fd` (for
/// writing) with `buf`: an insert when `mbyte` is 0, a delete when `buf` is
/// empty, an overwrite when they are equal. A range past the end of the
/// file is cut there; `offset` may equal the size (append) but not pass it.
///
/// Errors: `Unsupported` outside a Cairn mount; EBADF if `fd` is not open
/// for writing; EISDIR on a directory; EINVAL for an offset past the end;
/// EROFS in a snapshot.
pub fn rpwrite(fd: BorrowedFd<'_>, buf: &[u8], offset: u64, mbyte: u64) -> io::Result<Outcome> {
    if buf.len() <= ioctl::INLINE_MAX {
        let mut req = ioctl::Rpwrite::new();
        req.offset = offset;
        req.mbyte = mbyte;
        req.nbyte = buf.len() as u64;
        req.data[..buf.len()].copy_from_slice(buf);
        return call(fd, &mut req);
    }
    probe(fd)?;
    let scratch = Scratch::beside(fd)?;
    scratch.file().write_all(buf)?;
    rpsplice(fd, offset, mbyte, scratch.fd(), 0, buf.len() as u64)
}

/// Like [`rpwrite`] at the file offset of `fd`, which then moves past the
/// new bytes.
pub fn rwrite(fd: BorrowedFd<'_>, buf: &[u8], mbyte: u64) -> io::Result<Outcome> {
    // SAFETY: lseek on a borrowed descriptor.
    let pos = unsafe { libc::lseek(fd.as_raw_fd(), 0, libc::SEEK_CUR) };
    if pos < 0 {
        return Err(io::Error::last_os_error());
    }
    let out = rpwrite(fd, buf, pos as u64, mbyte)?;
    // SAFETY: as above.
    if unsafe { libc::lseek(fd.as_raw_fd(), pos + buf.len() as i64, libc::SEEK_SET) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(out)
}

/// A token naming `src`'s open file for an rpwrite on another descriptor
/// (`IOC_SOURCE`); the daemon gives one only for a descriptor open for
/// reading (EBADF otherwise).
fn source_token(src: BorrowedFd<'_>) -> io::Result<u64> {
    let mut s = ioctl::Source::default();
    // SAFETY: IOC_SOURCE's size is that of `Source`, which outlives the call.
    let rc = unsafe { libc::ioctl(src.as_raw_fd(), ioctl::IOC_SOURCE as _, &mut s as *mut ioctl::Source) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::ENOTTY) => not_cairn(),
            _ => e,
        });
    }
    Ok(s.token)
}

/// Replaces the `mbyte` bytes at `offset` of `fd`'s file with `len` bytes
/// of `src`'s file from `src_offset` (cut at its end), sharing their chunks
/// instead of copying them. Both must be in the same Cairn mount; `src`
/// must be open for reading (EBADF otherwise), as for `copy_file_range`.
pub fn rpsplice(fd: BorrowedFd<'_>, offset: u64, mbyte: u64, src: BorrowedFd<'_>, src_offset: u64, len: u64) -> io::Result<Outcome> {
    let (dst_meta, src_meta) = (fstat(fd)?, fstat(src)?);
    if dst_meta.dev() != src_meta.dev() {
        return Err(io::Error::new(io::ErrorKind::CrossesDevices, "the source file is not in the same Cairn mount"));
    }
    // The source's cached bytes too (the target's are pushed by `call`).
    push_cached_writes(src)?;
    let token = source_token(src)?;
    let mut req = ioctl::Rpwrite::new();
    req.offset = offset;
    req.mbyte = mbyte;
    req.nbyte = len;
    req.src = token;
    req.src_offset = src_offset;
    req.flags = ioctl::RP_FROM_SOURCE;
    call(fd, &mut req)
}

fn fstat(fd: BorrowedFd<'_>) -> io::Result<std::fs::Metadata> {
    // A borrowed File view of the descriptor: never closed here.
    // SAFETY: the descriptor is valid for the borrow; ManuallyDrop keeps it open.
    let f = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd.as_raw_fd()) });
    f.metadata()
}

/// A scratch file next to the target (same mount), unlinked when dropped.
struct Scratch {
    path: PathBuf,
    file: std::fs::File,
}

impl Scratch {
    fn beside(fd: BorrowedFd<'_>) -> io::Result<Scratch> {
        let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
        let bytes = link.clone().into_os_string().into_vec();
        if bytes.ends_with(b" (deleted)") {
            return Err(io::Error::new(io::ErrorKind::NotFound, "the file has no name left to put a scratch file beside"));
        }
        let dir = link.parent().ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "the file's directory is unknown"))?;
        for n in 0..1000u32 {
            let name = OsString::from(format!(".cairn-rpwrite.{}.{}", std::process::id(), n));
            let path = dir.join(name);
            match std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path) {
                Ok(file) => return Ok(Scratch { path, file }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(io::ErrorKind::AlreadyExists, "no free scratch file name"))
    }

    fn file(&self) -> &std::fs::File {
        &self.file
    }

    fn fd(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.file.as_fd()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

// ---------------------------------------------------------------------------
// C ABI (include/cairn.h)

fn c_result(r: io::Result<Outcome>, ok: isize) -> isize {
    match r {
        Ok(_) => ok,
        Err(e) => {
            let code = match e.raw_os_error() {
                Some(c) => c,
                None if e.kind() == io::ErrorKind::Unsupported => libc::ENOTTY,
                None if e.kind() == io::ErrorKind::CrossesDevices => libc::EXDEV,
                None if e.kind() == io::ErrorKind::NotFound => libc::ENOENT,
                None => libc::EIO,
            };
            // SAFETY: errno is thread-local.
            unsafe { *libc::__errno_location() = code };
            -1
        }
    }
}

/// # Safety
/// `buf` must point to `nbyte` readable bytes (or be null with `nbyte` 0).
unsafe fn c_slice<'a>(buf: *const libc::c_void, nbyte: usize) -> &'a [u8] {
    if nbyte == 0 || buf.is_null() {
        &[]
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), nbyte) }
    }
}

fn check_fd(fd: libc::c_int) -> Option<BorrowedFd<'static>> {
    // SAFETY: only used for the duration of one call.
    (fd >= 0).then(|| unsafe { BorrowedFd::borrow_raw(fd) })
}

fn bad_fd() -> isize {
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() = libc::EBADF };
    -1
}

/// `cairn_rpwrite(fd, buf, nbyte, offset, mbyte)`: see [`rpwrite`]. Returns
/// `nbyte`, or -1 with errno set.
///
/// # Safety
/// `buf` must point to `nbyte` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cairn_rpwrite(fd: libc::c_int, buf: *const libc::c_void, nbyte: usize, offset: libc::off_t, mbyte: usize) -> isize {
    let Some(fd) = check_fd(fd) else { return bad_fd() };
    if offset < 0 {
        return c_result(Err(io::Error::from_raw_os_error(libc::EINVAL)), 0);
    }
    // SAFETY: the caller's contract.
    let data = unsafe { c_slice(buf, nbyte) };
    c_result(rpwrite(fd, data, offset as u64, mbyte as u64), nbyte as isize)
}

/// `cairn_rwrite(fd, buf, nbyte, mbyte)`: see [`rwrite`].
///
/// # Safety
/// `buf` must point to `nbyte` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cairn_rwrite(fd: libc::c_int, buf: *const libc::c_void, nbyte: usize, mbyte: usize) -> isize {
    let Some(fd) = check_fd(fd) else { return bad_fd() };
    // SAFETY: the caller's contract.
    let data = unsafe { c_slice(buf, nbyte) };
    c_result(rwrite(fd, data, mbyte as u64), nbyte as isize)
}

/// `cairn_rpsplice(fd, offset, mbyte, src_fd, src_offset, len)`: see
/// [`rpsplice`]. Returns 0, or -1 with errno set.
#[unsafe(no_mangle)]
pub extern "C" fn cairn_rpsplice(fd: libc::c_int, offset: libc::off_t, mbyte: usize, src_fd: libc::c_int, src_offset: libc::off_t, len: usize) -> libc::c_int {
    let (Some(fd), Some(src)) = (check_fd(fd), check_fd(src_fd)) else { return bad_fd() as libc::c_int };
    if offset < 0 || src_offset < 0 {
        return c_result(Err(io::Error::from_raw_os_error(libc::EINVAL)), 0) as libc::c_int;
    }
    c_result(rpsplice(fd, offset as u64, mbyte as u64, src, src_offset as u64, len as u64), 0) as libc::c_int
}

/// `cairn_is_cairn(fd)`: 1 if `fd` is a file in a Cairn mount, else 0.
#[unsafe(no_mangle)]
pub extern "C" fn cairn_is_cairn(fd: libc::c_int) -> libc::c_int {
    check_fd(fd).is_some_and(is_cairn) as libc::c_int
}
