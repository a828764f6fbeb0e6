//! Engine integration tests: the whole stack below FUSE, in process, on a
//! real local backend in a temporary directory.

mod cases;
mod durability;
mod common;
mod archive;
mod edits;
mod model;
mod patches;
mod backends;
mod cloud;
mod disk_cache;
mod trace;
mod cleaner;
mod sequential;
mod tape;
mod inspect;
mod sim_live;
mod postgres;
mod pg_bucket;
mod shared_writers;
