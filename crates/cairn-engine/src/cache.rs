//! An in-memory cache of verified plaintext chunks, bounded in bytes.
//!
//! Sharded by chunk id so that concurrent readers of different chunks do not
//! contend on one lock. Eviction is LRU within a shard.

use lru::LruCache;
use parking_lot::Mutex;
use std::sync::Arc;

const SHARDS: usize = 16;

struct Shard {
    lru: LruCache<u64, Arc<Vec<u8>>>,
    bytes: usize,
}

/// The chunk cache.
pub struct ChunkCache {
    shards: Vec<Mutex<Shard>>,
    per_shard: usize,
}

impl ChunkCache {
    /// A cache holding about `capacity` bytes.
    pub fn new(capacity: usize) -> Self {
        ChunkCache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard { lru: LruCache::unbounded(), bytes: 0 })).collect(),
            per_shard: (capacity / SHARDS).max(1),
        }
    }

    fn shard(&self, id: u64) -> &Mutex<Shard> {
        &self.shards[(id as usize).wrapping_mul(0x9E37_79B9) % SHARDS]
    }

    pub fn get(&self, id: u64) -> Option<Arc<Vec<u8>>> {
        self.shard(id).lock().lru.get(&id).cloned()
    }

    pub fn contains(&self, id: u64) -> bool {
        self.shard(id).lock().lru.contains(&id)
    }

    pub fn insert(&self, id: u64, data: Arc<Vec<u8>>) {
        let mut s = self.shard(id).lock();
        let n = data.len();
        if let Some(old) = s.lru.put(id, data) {
            s.bytes -= old.len();
        }
        s.bytes += n;
        while s.bytes > self.per_shard && s.lru.len() > 1 {
            match s.lru.pop_lru() {
                Some((_, v)) => s.bytes -= v.len(),
                None => break,
            }
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.shards.iter().map(|s| s.lock().bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_within_its_bound() {
        let c = ChunkCache::new(16 * 1000);
        for i in 0..1000u64 {
            c.insert(i, Arc::new(vec![0u8; 100]));
        }
        assert!(c.bytes() <= 16 * 1000 + 16 * 100);
        assert!(c.get(999).is_some());
    }
}
