//! FUSE over io_uring (Linux 6.14 and later): the kernel hands requests to
//! per-CPU queues of buffers the daemon registered with `IORING_OP_URING_CMD`,
//! and one `COMMIT_AND_FETCH` command both answers a request and asks for the
//! next, where `/dev/fuse` needs a `writev` and a `read`. The kernel queues a
//! request on the queue of the CPU its caller runs on, so the daemon thread
//! that serves it is pinned to that CPU.
//!
//! Added to the vendored fuser 0.18.0 for Cairn (see `PATCHES.md`): the
//! requests are parsed and dispatched exactly as those read from
//! `/dev/fuse`; only the transport differs. Forgets, interrupts and
//! notifications still use `/dev/fuse` (the kernel sends them there), so the
//! session keeps its `/dev/fuse` threads as well.
//!
//! Per entry, one page-aligned allocation holds the 288-byte header the
//! kernel fills (`fuse_uring_req_header`), a scratch area, and the payload
//! buffer. The fixed part of a request (`fuse_in_header` and the opcode's
//! struct, at most 40 + 128 bytes) is copied into the scratch area so that it
//! ends where the payload begins: the request is then one contiguous slice,
//! as a `/dev/fuse` read gives it, without copying the payload (a write's
//! data).

use std::alloc::Layout;
use std::io;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::Mutex;
use std::thread::ThreadId;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::debug;
use log::warn;

use crate::Filesystem;
use crate::channel::Channel;
use crate::channel::ChannelSender;
use crate::ll::Operation;
use crate::reply::ReplyEmpty;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

/// How the session serves requests over io_uring.
#[derive(Debug, Clone, Copy, Eq, PartialEq)]
pub struct UringConfig {
    /// Threads per CPU queue, each with its own ring and entries. More than
    /// one lets a request that blocks (on a disk, a lock) not hold up the
    /// others queued on its CPU.
    pub threads_per_queue: usize,
    /// Entries (request buffers) each thread registers.
    pub depth: usize,
    /// Pin each thread to its queue's CPU. The kernel queues a request on
    /// its caller's CPU, so a pinned thread shares that CPU with the caller.
    pub pin: bool,
}

impl Default for UringConfig {
    fn default() -> Self {
        UringConfig {
            threads_per_queue: 2,
            depth: 4,
            pin: true,
        }
    }
}

// The kernel ABI (include/uapi/linux/fuse.h, 7.42).
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
const HEADER_LEN: usize = 288;
const IN_OUT_OFFSET: usize = 0;
const OP_IN_OFFSET: usize = 128;
const OP_IN_LEN: usize = 128;
const ENT_IN_OUT_OFFSET: usize = 256;
const IN_HEADER_LEN: usize = 40;
const OUT_HEADER_LEN: usize = 16;
/// The payload starts here in an entry's allocation; the scratch area for
/// the fixed part of a request lies just before it.
const PAYLOAD_OFFSET: usize = 1024;
const EVENT_TOKEN: u64 = u64::MAX;

/// What the session learned at INIT that sizes the entries.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UringParams {
    pub(crate) config: UringConfig,
    /// The kernel's `max_payload_sz`: max(8 KiB, max_write, max_pages pages).
    pub(crate) payload: usize,
}

impl UringParams {
    pub(crate) fn new(config: UringConfig, max_write: u32, max_pages: u16) -> Self {
        // The kernel clamps max_pages to its max_pages_limit (256 unless the
        // module parameter says otherwise).
        let limit = std::fs::read_to_string("/sys/module/fuse/parameters/max_pages_limit")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(256);
        let pages = usize::from(max_pages).clamp(1, limit);
        let payload = 8192
            .max(max_write as usize)
            .max(pages * page_size::get());
        UringParams { config, payload }
    }
}

/// The number of queues the kernel expects: one per possible CPU.
pub(crate) fn queue_count() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| parse_cpu_list_max(s.trim()))
        .map(|max| max + 1)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

fn parse_cpu_list_max(list: &str) -> Option<usize> {
    list.split(',')
        .filter_map(|part| part.rsplit('-').next()?.trim().parse::<usize>().ok())
        .max()
}

/// One registered entry's memory: header, scratch, payload.
struct EntryMem {
    base: *mut u8,
    layout: Layout,
    payload: usize,
    iov: [libc::iovec; 2],
}

// SAFETY: the memory is owned by the entry; who may touch it when follows the
// protocol (the kernel while the entry is registered, the thread handling the
// request until it replies, the queue thread when it commits).
unsafe impl Send for EntryMem {}
unsafe impl Sync for EntryMem {}

impl EntryMem {
    fn new(payload: usize) -> io::Result<Box<Self>> {
        let layout = Layout::from_size_align(PAYLOAD_OFFSET + payload, 4096)
            .map_err(|_| io::Error::other("uring entry size"))?;
        // SAFETY: the layout is not zero-sized.
        let base = unsafe { std::alloc::alloc_zeroed(layout) };
        if base.is_null() {
            return Err(io::Error::from(io::ErrorKind::OutOfMemory));
        }
        let mem = Box::new(EntryMem {
            base,
            layout,
            payload,
            iov: [
                libc::iovec {
                    iov_base: base.cast(),
                    iov_len: HEADER_LEN,
                },
                libc::iovec {
                    // SAFETY: within the allocation.
                    iov_base: unsafe { base.add(PAYLOAD_OFFSET) }.cast(),
                    iov_len: payload,
                },
            ],
        });
        Ok(mem)
    }

    fn read_u64(&self, at: usize) -> u64 {
        let mut b = [0u8; 8];
        // SAFETY: `at + 8` lies within the header.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(at), b.as_mut_ptr(), 8) };
        u64::from_ne_bytes(b)
    }

    fn read_u32(&self, at: usize) -> u32 {
        let mut b = [0u8; 4];
        // SAFETY: `at + 4` lies within the header.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(at), b.as_mut_ptr(), 4) };
        u32::from_ne_bytes(b)
    }

    /// The request the kernel placed in this entry, as one slice laid out as
    /// a `/dev/fuse` read gives it, or `None` if the sizes do not add up.
    ///
    /// # Safety
    /// The kernel must have completed this entry's command (it no longer
    /// writes it), and no reply to it may be in progress.
    unsafe fn request(&self) -> Option<&[u8]> {
        let len = self.read_u32(IN_OUT_OFFSET) as usize;
        let payload_sz = self.read_u32(ENT_IN_OUT_OFFSET + 16) as usize;
        if payload_sz > self.payload {
            return None;
        }
        let op_in = len.checked_sub(IN_HEADER_LEN + payload_sz)?;
        if op_in > OP_IN_LEN {
            return None;
        }
        let start = PAYLOAD_OFFSET - IN_HEADER_LEN - op_in;
        // SAFETY: all ranges lie within the allocation, and the scratch
        // area (start..PAYLOAD_OFFSET) does not overlap the header.
        unsafe {
            std::ptr::copy_nonoverlapping(self.base.add(IN_OUT_OFFSET), self.base.add(start), IN_HEADER_LEN);
            std::ptr::copy_nonoverlapping(
                self.base.add(OP_IN_OFFSET),
                self.base.add(start + IN_HEADER_LEN),
                op_in,
            );
            Some(std::slice::from_raw_parts(self.base.add(start), len))
        }
    }
}

impl Drop for EntryMem {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.base, self.layout) };
    }
}

/// What a queue thread shares with the replies it hands out.
#[derive(Debug)]
struct QueueShared {
    /// Entries whose reply is written and that await their commit.
    replied: Mutex<Vec<usize>>,
    /// Wakes the queue thread when a reply comes from another thread.
    event_fd: RawFd,
    owner: ThreadId,
}

impl Drop for QueueShared {
    fn drop(&mut self) {
        // SAFETY: the descriptor is ours.
        unsafe { libc::close(self.event_fd) };
    }
}

/// The reply side of one request received over io_uring.
#[derive(Clone)]
pub(crate) struct UringReply {
    device: ChannelSender,
    shared: Arc<QueueShared>,
    entry: Arc<EntryMem>,
    index: usize,
}

impl std::fmt::Debug for UringReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringReply").field("index", &self.index).finish()
    }
}

impl UringReply {
    /// The `/dev/fuse` channel, for what goes through the device whatever
    /// the transport (backing files).
    pub(crate) fn device(&self) -> &ChannelSender {
        &self.device
    }

    /// Answers the request EIO.
    fn send_eio(&self) -> io::Result<()> {
        // The kernel's commit id is the request's unique.
        let unique = self.entry.read_u64(ENT_IN_OUT_OFFSET + 8);
        let mut h = [0u8; OUT_HEADER_LEN];
        h[0..4].copy_from_slice(&(OUT_HEADER_LEN as u32).to_ne_bytes());
        h[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
        h[8..16].copy_from_slice(&unique.to_ne_bytes());
        self.send(&[io::IoSlice::new(&h)])
    }

    /// Writes the reply into the entry (the out header into the header area,
    /// the rest into the payload) and queues its commit.
    pub(crate) fn send(&self, data: &[io::IoSlice<'_>]) -> io::Result<()> {
        let total: usize = data.iter().map(|d| d.len()).sum();
        let body = match total.checked_sub(OUT_HEADER_LEN) {
            Some(body) if body <= self.entry.payload => body,
            _ => {
                // Answered EIO all the same: an entry never committed would
                // leave its caller waiting for good.
                self.send_eio()?;
                return Err(io::Error::other(format!(
                    "a {total}-byte FUSE reply does not fit the ring's {}-byte payload buffer",
                    self.entry.payload
                )));
            }
        };
        let mut written = 0usize;
        for slice in data {
            let mut s: &[u8] = slice;
            while !s.is_empty() {
                let (dst, room) = if written < OUT_HEADER_LEN {
                    (IN_OUT_OFFSET + written, OUT_HEADER_LEN - written)
                } else {
                    (PAYLOAD_OFFSET + written - OUT_HEADER_LEN, s.len())
                };
                let n = room.min(s.len());
                // SAFETY: bounds checked against `total` above; this request
                // owns the entry until it is committed.
                unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), self.entry.base.add(dst), n) };
                written += n;
                s = &s[n..];
            }
        }
        let sz = (body as u32).to_ne_bytes();
        // SAFETY: within the header.
        unsafe {
            std::ptr::copy_nonoverlapping(sz.as_ptr(), self.entry.base.add(ENT_IN_OUT_OFFSET + 16), 4)
        };
        self.shared.replied.lock().unwrap_or_else(|e| e.into_inner()).push(self.index);
        if std::thread::current().id() != self.shared.owner {
            // SAFETY: an eventfd write of 8 bytes.
            unsafe { libc::eventfd_write(self.shared.event_fd, 1) };
        }
        Ok(())
    }
}

/// Builds a uring command SQE (128 bytes) for `cmd_op` on the FUSE device.
fn uring_cmd(fd: RawFd, cmd_op: u32, commit_id: u64, qid: u16, iov: Option<&[libc::iovec; 2]>) -> squeue::Entry128 {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    let mut op = opcode::UringCmd80::new(types::Fd(fd), cmd_op).cmd(cmd);
    if let Some(iov) = iov {
        op = op.addr(Some(iov.as_ptr() as u64));
    }
    let entry = op.build();
    if iov.is_none() {
        return entry;
    }
    // io-uring's UringCmd80 has no `len`; REGISTER needs sqe->len = 2 (the
    // iovec count). Entry128 is repr(C): a 64-byte io_uring_sqe, whose `len`
    // is the u32 at offset 24, then the 64 bytes of command.
    const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128);
    // SAFETY: Entry128 is repr(C), 128 bytes of plain data.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(entry) };
    raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
    // SAFETY: as above; every byte pattern is a valid SQE to construct.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; the calls only read it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            debug!("fuse-uring: could not pin to CPU {cpu}: {}", io::Error::last_os_error());
        }
    }
}

/// Serves queue `qid` from one thread until the connection ends.
pub(crate) fn serve_queue<FS: Filesystem>(
    se: SessionEventLoop<FS>,
    device: Channel,
    qid: usize,
    params: UringParams,
) -> io::Result<()> {
    if params.config.pin {
        pin_to_cpu(qid);
    }
    let depth = params.config.depth.max(1);
    let fd = device.as_fd().as_raw_fd();
    let qid16 = u16::try_from(qid).map_err(|_| io::Error::other("too many FUSE queues"))?;
    // SAFETY: plain eventfd creation.
    let event_fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if event_fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let shared = Arc::new(QueueShared {
        replied: Mutex::new(Vec::with_capacity(depth)),
        event_fd,
        owner: std::thread::current().id(),
    });
    // Declared before the ring so that they are dropped after it: the
    // kernel holds pointers into them while commands are pending.
    let entries: Vec<Arc<EntryMem>> = (0..depth)
        .map(|_| EntryMem::new(params.payload).map(Arc::from))
        .collect::<io::Result<_>>()?;
    let mut event_buf = [0u8; 8];
    let mut ring: IoUring<squeue::Entry128, cqueue::Entry> =
        IoUring::builder().setup_single_issuer().build((depth + 1).next_power_of_two() as u32 * 2)?;
    let event_read = |buf: &mut [u8; 8]| -> squeue::Entry128 {
        opcode::Read::new(types::Fd(event_fd), buf.as_mut_ptr(), 8)
            .build()
            .user_data(EVENT_TOKEN)
            .into()
    };
    {
        let mut sq = ring.submission();
        for (i, e) in entries.iter().enumerate() {
            let sqe = uring_cmd(fd, CMD_REGISTER, 0, qid16, Some(&e.iov)).user_data(i as u64);
            // SAFETY: the iovecs and buffers live as long as `entries`, which
            // outlives the ring (declared before it: dropped after).
            unsafe { sq.push(&sqe) }.map_err(|_| io::Error::other("uring submission queue full"))?;
        }
        // SAFETY: `event_buf` outlives the ring's use of it.
        unsafe { sq.push(&event_read(&mut event_buf)) }
            .map_err(|_| io::Error::other("uring submission queue full"))?;
    }
    let mut live = depth;
    let mut done: Vec<(u64, i32)> = Vec::with_capacity(depth + 1);
    let mut to_commit: Vec<usize> = Vec::with_capacity(depth);
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => return Err(e),
        }
        done.clear();
        done.extend(ring.completion().map(|c| (c.user_data(), c.result())));
        for &(token, res) in &done {
            if token == EVENT_TOKEN {
                // SAFETY: as at the first push.
                unsafe { ring.submission().push(&event_read(&mut event_buf)) }
                    .map_err(|_| io::Error::other("uring submission queue full"))?;
                continue;
            }
            let i = token as usize;
            if res < 0 {
                live -= 1;
                let err = io::Error::from_raw_os_error(-res);
                match -res {
                    libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED | libc::ENODEV => {
                        debug!("fuse-uring queue {qid}: entry {i} ended: {err}")
                    }
                    _ => warn!("fuse-uring queue {qid}: entry {i} failed: {err}"),
                }
                continue;
            }
            let entry = &entries[i];
            let reply = UringReply {
                device: device.sender(),
                shared: shared.clone(),
                entry: entry.clone(),
                index: i,
            };
            // SAFETY: the kernel completed this entry's command, and no
            // reply is in progress (it is handed out below).
            match unsafe { entry.request() }.and_then(|data| RequestWithSender::new_uring(device.sender(), reply.clone(), data)) {
                Some(req) => {
                    if let Ok(Operation::Destroy(_)) = req.request.operation() {
                        req.reply::<ReplyEmpty>().ok();
                    } else {
                        req.dispatch(&se);
                    }
                }
                None => {
                    // Unparseable: answer EIO so the entry comes back.
                    warn!("fuse-uring queue {qid}: malformed request in entry {i}");
                    reply.send_eio()?;
                }
            }
        }
        to_commit.clear();
        to_commit.append(&mut shared.replied.lock().unwrap_or_else(|e| e.into_inner()));
        for &i in &to_commit {
            // The kernel's commit id stays in the entry's header (a reply
            // writes only the out header and payload_sz): read it there.
            let commit_id = entries[i].read_u64(ENT_IN_OUT_OFFSET + 8);
            let sqe = uring_cmd(fd, CMD_COMMIT_AND_FETCH, commit_id, qid16, None).user_data(i as u64);
            // SAFETY: the entry's buffers live as long as `entries`.
            unsafe { ring.submission().push(&sqe) }
                .map_err(|_| io::Error::other("uring submission queue full"))?;
        }
        if live == 0 {
            debug!("fuse-uring queue {qid}: all entries ended");
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_list_max() {
        assert_eq!(parse_cpu_list_max("0-1"), Some(1));
        assert_eq!(parse_cpu_list_max("0"), Some(0));
        assert_eq!(parse_cpu_list_max("0-3,8-11"), Some(11));
    }

    #[test]
    fn register_sqe_carries_the_iovec_count() {
        let mem = EntryMem::new(8192).unwrap();
        let e = uring_cmd(7, CMD_REGISTER, 0, 1, Some(&mem.iov));
        // SAFETY: as in uring_cmd.
        let raw: [u8; 128] = unsafe { std::mem::transmute(e) };
        assert_eq!(raw[0], opcode::UringCmd80::CODE);
        assert_eq!(i32::from_ne_bytes(raw[4..8].try_into().unwrap()), 7);
        assert_eq!(u64::from_ne_bytes(raw[16..24].try_into().unwrap()), mem.iov.as_ptr() as u64);
        assert_eq!(u32::from_ne_bytes(raw[24..28].try_into().unwrap()), 2);
        // cmd area (at 48): flags, commit_id, qid
        assert_eq!(u16::from_ne_bytes(raw[64..66].try_into().unwrap()), 1);
    }
}
