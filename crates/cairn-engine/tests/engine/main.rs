//! Engine integration tests: the whole stack below FUSE, in process, on a
//! real local backend in a temporary directory.
//!
//! The suites of what a volume does whatever keeps its metadata (`cases`,
//! `archive`, `edits`, `model`, `inspect`, `patches`) open their volumes
//! through `common::opts`/`init_small`/`open`, and `scripts/test.sh` runs
//! them twice: on SQLite, and with `CAIRN_TEST_META=postgres` on a
//! PostgreSQL server of the test process's own. The others test one
//! store's own mechanisms: `durability` SQLite's (power cuts copy its
//! files), `postgres`, `pg_bucket` and `shared_writers` PostgreSQL's
//! (with the store's own crash and outage tests in cairn-meta).

mod cases;
mod durability;
mod common;
mod archive;
mod edits;
mod model;
mod patches;
mod backends;
mod cloud;
mod trace;
mod cleaner;
mod sequential;
mod tape;
mod inspect;
mod pins;
mod sim_live;
mod appends;
mod rounds;
mod postgres;
mod pg_bucket;
mod tiers;
mod shared_writers;
mod pg_failures;
mod pg_failover;
mod bytewise;
mod fuzz_seeds;
