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
