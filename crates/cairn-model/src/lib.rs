//! What the Cairn engine and its simulator (`cairn-sim`) share, without
//! the engine's metadata stores or its S3 backend: the cache policies
//! ([`cache`]: LRU and Coral's kd-tree policy), the access-trace format
//! ([`trace`], docs/trace.md), and the cloud price list with the request
//! model it prices ([`prices`]).
//!
//! The engine re-exports each at its old path (`cairn_engine::cache::kd`,
//! `cairn_engine::trace`, `cairn_engine::cost::Prices`), and the backend
//! re-exports [`prices::RequestKind`] and [`prices::put_requests`].

pub mod cache;
pub mod prices;
pub mod tiers;
pub mod trace;
