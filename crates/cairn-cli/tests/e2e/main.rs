//! End-to-end tests of Cairn through real FUSE mounts of the `cairn` binary.
//!
//! Every test makes its own volume and mountpoint under `target/tmp/e2e`
//! (local disk), holds the global [`common::serial`] lock for its whole run
//! (mounts do not overlap) and unmounts through a drop guard, so a failing
//! assertion leaves no mount or daemon behind. Needs root, /dev/fuse,
//! fusermount3, python3, setpriv; rsync is used when present.
//!
//! Set `CAIRN_E2E_KEEP=1` to keep the temp dirs of a run for inspection.

mod common;

mod archive;

mod corruption;
mod crash;
mod dedup;
mod edits;
mod errors;
mod permissions;
mod newcomer;
mod posix;
mod postgres;
mod shared;
mod powercut;
mod roundtrip;
mod writeback;
mod uring;
mod cloud;
mod system;
mod tape;
mod inspect;
