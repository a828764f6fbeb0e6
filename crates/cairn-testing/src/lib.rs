//! Test doubles for Cairn's seams.
//!
//! - [`MemoryBackend`]: a backend in a map, for tests that need a store and
//!   nothing else (and as the base under [`FaultyBackend`]).
//! - [`FaultyBackend`]: wraps any backend and makes a chosen fraction of
//!   requests fail, time out, succeed but lose their reply, or run slowly,
//!   from a seeded generator; or makes the whole store "down" at once, for
//!   outage tests. It stands in for the network and the store's bad days;
//!   the real store (a directory, moto) stays real underneath.
//!
//! Both pass the backend conformance suite (`cairn_backend::conformance`);
//! a `FaultyBackend` does only behind `Retrying`, which is the point.
//!
//! - [`RestoreHold`]: wraps a store with archive classes (moto) and holds
//!   its restores "ongoing" until released: an archived object stays
//!   unreadable and its HEAD says `ongoing-request="true"`, as a real
//!   GLACIER restore does for hours (docs/tiers.md §6).
//! - [`postgres::PgServer`]: not a double but the real thing, a throwaway
//!   PostgreSQL cluster on a loopback port, for the metadata store's tests
//!   (it can be stopped, killed and started again under load).
//! - [`patroni::PatroniCluster`]: two PostgreSQL nodes under Patroni and
//!   etcd, a primary and its synchronous standby, whose primary can be
//!   killed to make Patroni fail over.
//! - [`ustar_header`]: a raw tar header block, for crafted archives.
//! - [`require_tool`], [`require_fuse`]: a test whose outside tool is
//!   missing fails and says which, rather than passing unrun.

mod faulty;
mod restore_hold;
mod memory;
pub mod patroni;
pub mod postgres;
mod tar;
mod tools;

pub use faulty::{FaultPlan, FaultStats, FaultyBackend};
pub use memory::MemoryBackend;
pub use restore_hold::RestoreHold;
pub use tar::ustar_header;
pub use tools::{missing_tool, require_fuse, require_tool};
