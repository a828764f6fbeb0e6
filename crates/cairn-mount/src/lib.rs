//! The FUSE mount scaffold every Cairn file system shares: the volume
//! (`cairn-fuse`), `cairn archive mount` (`cairn-tarfs`) and the power-cut
//! test layer (`cairn-powercut`). Written once so the three cannot drift:
//! mountpoint checks, the fuser session's threads and descriptors, signals
//! that unmount, unmounting (busy, dead and lazy), and the kernel's mount
//! table.

pub mod mounttable;
mod point;
mod signals;
mod unmount;

pub use point::{absolute, validate_mountpoint};
pub use signals::SignalWatch;
pub use unmount::{detach_if_ours, fuse_connection_of, umount_syscall, unmount_once};

/// A fuser session configuration serving with `threads` threads (at least
/// one), open to other users only with `allow_other`.
pub fn session_config(threads: usize, allow_other: bool) -> fuser::Config {
    let threads = threads.max(1);
    let mut config = fuser::Config::default();
    config.acl = if allow_other { fuser::SessionACL::All } else { fuser::SessionACL::Owner };
    config.n_threads = Some(threads);
    // Per-thread /dev/fuse descriptors (FUSE_DEV_IOC_CLONE) need /dev/fuse
    // to be openable here (it is not when the mount goes through a setuid
    // fusermount3 only); fuser fails the whole session if it is not.
    config.clone_fd = threads > 1 && std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse").is_ok();
    config
}

/// Serves `config`'s session over io_uring as well as /dev/fuse (the
/// vendored fuser's transport, `third_party/fuser/src/uring.rs`), if the
/// kernel offers it at INIT. The kernel queues a request on the queue of
/// the CPU its caller runs on; `threads` are split across the queues (at
/// least one each). /dev/fuse keeps one thread: after the rings are
/// registered it carries only forgets, interrupts and notifications.
pub fn serve_over_io_uring(config: &mut fuser::Config, threads: usize) {
    let queues = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Pinned: dbench's four clients ran 12-17% faster than over /dev/fuse
    // pinned and 8% slower unpinned; one-at-a-time work (creates, untar)
    // lost 6-14% pinned and drew level unpinned (docs/profile.md, sixth
    // round). Two threads per queue beat one and four under dbench.
    config.io_uring = Some(fuser::UringConfig { threads_per_queue: threads.div_ceil(queues).max(1), depth: 4, pin: true });
    config.n_threads = Some(1);
    config.clone_fd = false;
}
