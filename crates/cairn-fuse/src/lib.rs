//! The FUSE adapter of Cairn: serves a [`cairn_engine::Volume`] to the Linux
//! kernel through [`fuser`] 0.18.
//!
//! - [`CairnFs`] implements `fuser::Filesystem`. It holds no file system
//!   state of its own beyond open-directory listings: every request becomes
//!   one or two engine calls, converted at the edge. Inode numbers are the
//!   engine's (root = 1), generations are 0 (numbers are never reused).
//! - [`mount`] checks the mountpoint, mounts with `default_permissions`
//!   (the kernel does all permission checks; the engine does none), serves
//!   the volume on several threads until unmounted, and turns SIGTERM,
//!   SIGINT and SIGHUP into a clean unmount so the volume is flushed and
//!   closed (`destroy` → `Volume::close`). As root it calls mount(2) itself
//!   (type `fuse.cairn`) and hands fuser the /dev/fuse descriptor, so that no
//!   stray unmount of the path happens when the session ends; other users go
//!   through fuser and fusermount3.
//! - [`unmount`] unmounts from another process (`cairn unmount`).
//!
//! # Kernel-facing choices
//!
//! - Attribute, entry and negative-lookup TTL: 1 s.
//! - `max_write` 1 MiB (and `max_read` 1 MiB), readahead as large as the
//!   kernel offers, 64 background requests.
//! - Capabilities: parallel dirops, readdirplus (auto), cached symlinks,
//!   async direct I/O, and the kernel's writeback cache unless the mount
//!   turns it off. See `fs::wanted_capabilities`.
//! - Directories: `opendir` takes a listing (`.`, `..`, then the engine's
//!   sorted entries); readdir offsets are positions in it, so a directory
//!   changing under a reader neither repeats nor skips entries. A readdir at
//!   offset 0 on an already-read handle (`rewinddir`) takes a fresh listing.
//! - Locks: on a volume only this mount writes, no lock handlers and no
//!   `FUSE_POSIX_LOCKS`/`FUSE_FLOCK_LOCKS`, so the kernel implements fcntl
//!   and flock locks locally; on a shared volume (metadata in PostgreSQL)
//!   both are requested and the locks live in the metadata store, where
//!   every machine's mount sees them (`locks`, docs/shared-volume.md §8).
//! - `st_blksize` is 128 KiB, not 4 KiB: without the writeback cache every
//!   write(2) is a round trip, and stdio sizes its buffers from it.
//! - `fsyncdir` calls `Volume::fsync` on the directory (a metadata sync), not
//!   the volume-wide `Volume::sync`.
//! - `ioctl` serves Cairn's own (rpwrite, `cairn_client::ioctl`) and
//!   answers ENOTTY to anything else (what isatty(3) expects);
//!   `copy_file_range` clones: the destination range shares the source's
//!   extents.
//! - Errors: engine errors map through `Error::errno()`; EIO ones (corrupt or
//!   unreadable packs, backend failures) are logged at warn with the engine's
//!   message.

mod convert;
mod fs;
mod locks;
mod mount;
mod offload;
/// The kernel's mount table, for the CLI (it lives in the mount scaffold).
pub use cairn_mount::mounttable;

pub use fs::CairnFs;
pub use mount::{mount, mount_at, mount_containing, push_cached_writes, unmount, MountConfig, MountInfo};
