//! Cairn's caches, below the volume engine.
//!
//! - [`disk`]: [`CachedBackend`], the persistent local cache of ranges of
//!   packs and the upload outbox in front of a remote store (docs/cloud.md
//!   §5). It is itself a [`cairn_backend::Backend`], so a volume in a bucket
//!   or on tape uses it as its store. Start at the contract in its module
//!   comment, then `CachedBackend::with_policy` (open, reopen) and
//!   `read_pack` (a read: outbox, cached extents, gaps fetched once).
//! - [`ChunkCache`] (below): the memory cache of verified plaintext chunks
//!   that a volume's chunk store keeps, bounded in bytes and sharded by chunk
//!   id.
//! - The eviction policies both use: the [`CachePolicy`] seam with its
//!   conformance suite, [`Lru`] and Coral's kd-tree policy ([`KdPolicy`]),
//!   and the extent rules of a fetch ([`extent`]), live whole in
//!   `cairn-model`, shared with the simulator, and are re-exported here.
//!   [`PolicyChoice`] picks one at mount.
//! - [`health`]: the last failure of a part that retries in the
//!   background ([`health::Slot`]): the uploaders keep one, the engine's
//!   flusher, shipper and lease theirs, and `cairn status` reads them all.
//! - [`fsutil`]: the modes of private files and directories, shared with
//!   the engine.
//!
//! This crate depends on `cairn-backend` and `cairn-model` only; the engine
//! re-exports it whole as `cairn_engine::cache`.

pub mod disk;
pub mod fsutil;
pub mod health;
// The policies live in `cairn-model`, shared with the simulator.
pub use cairn_model::cache::{extent, kd, policy};
// The trace format (docs/trace.md) the disk cache records its events in.
use cairn_model::trace;

pub use disk::{CacheStats, CachedBackend, DiskCacheOptions, Durability, ReadFor};
pub use kd::{IoWindows, KdPolicy};
pub use policy::{CachePolicy, Lru};

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

const SHARDS: usize = 16;

/// Which eviction policy the disk cache of a cloud volume uses (`cairn
/// mount --cache-policy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PolicyChoice {
    /// Least recently used first.
    #[default]
    Lru,
    /// Coral's kd-tree policy ([`kd`]).
    Kd,
}

impl PolicyChoice {
    /// A new policy of this kind; a KD one adapts its batches to the
    /// read/write mix counted in `io`.
    pub fn build(self, io: Option<IoWindows>) -> Box<dyn CachePolicy> {
        match (self, io) {
            (PolicyChoice::Lru, _) => Box::new(Lru::new()),
            (PolicyChoice::Kd, Some(w)) => Box::new(KdPolicy::new().with_windows(w)),
            (PolicyChoice::Kd, None) => Box::new(KdPolicy::new()),
        }
    }
}

struct Shard {
    entries: HashMap<u64, Arc<Vec<u8>>>,
    policy: Box<dyn CachePolicy>,
    bytes: usize,
}

/// The memory cache of verified plaintext chunks, bounded in bytes.
///
/// Sharded by chunk id so that concurrent readers of different chunks do
/// not contend on one lock. Which entry goes when a shard is full is its
/// [`CachePolicy`]'s decision (LRU by default).
pub struct ChunkCache {
    shards: Vec<Mutex<Shard>>,
    per_shard: usize,
}

impl ChunkCache {
    /// A cache holding about `capacity` bytes, evicting least recently used
    /// chunks first.
    pub fn new(capacity: usize) -> Self {
        Self::with_policy(capacity, &|| Box::new(Lru::new()))
    }

    /// A cache whose shards each get a policy from `make`.
    pub fn with_policy(capacity: usize, make: &dyn Fn() -> Box<dyn CachePolicy>) -> Self {
        ChunkCache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard { entries: HashMap::new(), policy: make(), bytes: 0 })).collect(),
            per_shard: (capacity / SHARDS).max(1),
        }
    }

    fn shard(&self, id: u64) -> &Mutex<Shard> {
        &self.shards[(id as usize).wrapping_mul(0x9E37_79B9) % SHARDS]
    }

    pub fn get(&self, id: u64) -> Option<Arc<Vec<u8>>> {
        let mut s = self.shard(id).lock();
        let v = s.entries.get(&id).cloned();
        if v.is_some() {
            s.policy.accessed(id);
        }
        v
    }

    pub fn contains(&self, id: u64) -> bool {
        self.shard(id).lock().entries.contains_key(&id)
    }

    /// Adds (or replaces) a chunk, then evicts the policy's victims until
    /// the shard is within its share (one entry always stays, however big).
    pub fn insert(&self, id: u64, data: Arc<Vec<u8>>) {
        let mut s = self.shard(id).lock();
        let n = data.len();
        if let Some(old) = s.entries.insert(id, data) {
            s.bytes -= old.len();
        }
        s.bytes += n;
        s.policy.admitted(id, n as u64);
        while s.bytes > self.per_shard && s.entries.len() > 1 {
            let Some(v) = s.policy.victim() else { break };
            s.policy.removed(v);
            if let Some(old) = s.entries.remove(&v) {
                s.bytes -= old.len();
            }
        }
    }

    /// Drops a chunk (one that no longer exists: its id is never used
    /// again).
    pub fn remove(&self, id: u64) {
        let mut s = self.shard(id).lock();
        if let Some(old) = s.entries.remove(&id) {
            s.bytes -= old.len();
            s.policy.removed(id);
        }
    }

    /// Chunks held.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().entries.len()).sum()
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.shards.iter().map(|s| s.lock().bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn stays_within_its_bound() {
        let c = ChunkCache::new(16 * 1000);
        for i in 0..1000u64 {
            c.insert(i, Arc::new(vec![0u8; 100]));
        }
        assert!(c.bytes() <= 16 * 1000 + 16 * 100);
        assert!(c.get(999).is_some());
    }

    proptest! {
        /// Against a map of everything ever inserted: a hit returns the
        /// newest bytes inserted under its id, the byte count is the sum
        /// of what is held, and each shard stays within its share but for
        /// its one newest entry.
        #[test]
        fn agrees_with_a_model(ops in proptest::collection::vec((0u64..200, 1usize..3000, any::<bool>()), 1..600)) {
            let cap = 16 * 4096;
            let c = ChunkCache::new(cap);
            let mut model: HashMap<u64, Arc<Vec<u8>>> = HashMap::new();
            for (i, (id, len, read)) in ops.into_iter().enumerate() {
                if read {
                    if let Some(v) = c.get(id) {
                        prop_assert_eq!(Some(&v), model.get(&id), "a hit with stale bytes");
                    }
                } else {
                    let v = Arc::new(vec![(i % 251) as u8; len]);
                    c.insert(id, v.clone());
                    model.insert(id, v);
                }
                let held: usize = c.shards.iter().map(|s| s.lock().entries.values().map(|v| v.len()).sum::<usize>()).sum();
                prop_assert_eq!(held, c.bytes());
                for s in &c.shards {
                    let s = s.lock();
                    prop_assert!(s.bytes <= c.per_shard || s.entries.len() == 1, "a shard holds {} bytes in {} entries", s.bytes, s.entries.len());
                    prop_assert_eq!(s.entries.len(), s.policy.len(), "policy and entries disagree");
                }
            }
        }
    }
}
