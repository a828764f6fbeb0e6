//! Which cached entry goes when room is needed: the seam between a cache,
//! which holds bytes, and its policy, which sees only keys, sizes, accesses
//! and which file an access was for. LRU is the first implementation;
//! Coral's kd-tree policy ([`super::kd`], docs/frugal.md §1–2) is the
//! second.
//!
//! Contract, checked for every policy by [`conformance`]:
//! - `victim` returns a key that was admitted and not removed since, or
//!   None when no key is tracked; it does not stop tracking the key (the
//!   cache calls `removed` once it has dropped the entry).
//! - `removed` of a key that is not tracked is a no-op.
//! - Admitting a tracked key again replaces it (one entry, the new size).
//! - `grouped` is a hint: it never adds or drops a key, and of a key that
//!   is not tracked it is a no-op.
//! - Each call costs at most O(log n) in the number of tracked keys
//!   (amortized over the calls, for a policy that works in batches).
//!
//! Which file an access is for is an argument of the cache's reads (the
//! disk cache's `CachedBackend::get_range_for`, given by the volume's chunk
//! reads), which the cache hands on as [`CachePolicy::grouped`]: a reader
//! of a call sees which file it is made for (docs/design.md, "Who pays and
//! for which file").

/// An eviction policy over `u64` keys (chunk or segment ids).
pub trait CachePolicy: Send {
    /// A short name for logs and stats.
    fn name(&self) -> &'static str;
    /// `key` entered the cache with `size` bytes.
    fn admitted(&mut self, key: u64, size: u64);
    /// `key`, present, was read.
    fn accessed(&mut self, key: u64);
    /// `key` left the cache (evicted, replaced or invalidated).
    fn removed(&mut self, key: u64);
    /// `key`, present, was just admitted or accessed for file `group` (an
    /// inode). Policies that do not correlate files ignore it.
    fn grouped(&mut self, _key: u64, _group: u64) {}
    /// The entry to evict next.
    fn victim(&mut self) -> Option<u64>;
    /// Keys tracked.
    fn len(&self) -> usize;
    /// Whether no key is tracked.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Least recently used first.
pub struct Lru {
    order: lru::LruCache<u64, ()>,
}

impl Lru {
    /// An empty policy.
    pub fn new() -> Self {
        Lru { order: lru::LruCache::unbounded() }
    }
}

impl Default for Lru {
    fn default() -> Self {
        Self::new()
    }
}

impl CachePolicy for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }
    fn admitted(&mut self, key: u64, _size: u64) {
        self.order.put(key, ());
    }
    fn accessed(&mut self, key: u64) {
        self.order.get(&key);
    }
    fn removed(&mut self, key: u64) {
        self.order.pop(&key);
    }
    fn victim(&mut self) -> Option<u64> {
        self.order.peek_lru().map(|(k, _)| *k)
    }
    fn len(&self) -> usize {
        self.order.len()
    }
}

/// The checks every [`CachePolicy`] must pass; each policy's tests call
/// [`conformance::run_all`] with a constructor.
pub mod conformance {
    use super::CachePolicy;
    use std::collections::BTreeSet;

    /// Runs every check; panics with a message on the first failure.
    pub fn run_all(make: &dyn Fn() -> Box<dyn CachePolicy>) {
        drains_exactly_what_was_admitted(make);
        removed_keys_never_come_back(make);
        readmission_keeps_one_entry(make);
        grouping_never_breaks_the_contract(make);
        random_operations_against_a_model(make, 1);
        random_operations_against_a_model(make, 2);
    }

    fn drains_exactly_what_was_admitted(make: &dyn Fn() -> Box<dyn CachePolicy>) {
        let mut p = make();
        assert_eq!(p.victim(), None, "{}: a victim from an empty policy", p.name());
        for k in 0..100u64 {
            p.admitted(k * 7, 100 + k);
        }
        let mut seen = BTreeSet::new();
        while let Some(v) = p.victim() {
            assert!(v % 7 == 0 && v < 700, "{}: victim {v} was never admitted", p.name());
            assert!(seen.insert(v), "{}: victim {v} twice", p.name());
            p.removed(v);
        }
        assert_eq!(seen.len(), 100, "{}: drained {} of 100 keys", p.name(), seen.len());
        assert!(p.is_empty());
    }

    fn removed_keys_never_come_back(make: &dyn Fn() -> Box<dyn CachePolicy>) {
        let mut p = make();
        for k in 0..10u64 {
            p.admitted(k, 1);
        }
        for k in 0..10u64 {
            p.accessed(k);
        }
        p.removed(3);
        p.removed(3);
        p.removed(42); // never admitted: a no-op
        let mut left = BTreeSet::new();
        while let Some(v) = p.victim() {
            p.removed(v);
            left.insert(v);
        }
        assert_eq!(left, (0..10u64).filter(|k| *k != 3).collect(), "{}", p.name());
    }

    fn readmission_keeps_one_entry(make: &dyn Fn() -> Box<dyn CachePolicy>) {
        let mut p = make();
        p.admitted(5, 10);
        p.admitted(5, 20);
        assert_eq!(p.len(), 1, "{}: admitting a tracked key twice tracked it twice", p.name());
        assert_eq!(p.victim(), Some(5));
        p.removed(5);
        assert_eq!(p.victim(), None);
    }

    fn grouping_never_breaks_the_contract(make: &dyn Fn() -> Box<dyn CachePolicy>) {
        let mut p = make();
        p.grouped(1, 1); // not tracked: a no-op
        assert_eq!((p.len(), p.victim()), (0, None), "{}: grouping an untracked key tracked it", p.name());
        for k in 0..50u64 {
            p.admitted(k, 4096 * (1 + k % 3));
            p.grouped(k, k % 5);
        }
        for k in (0..50u64).step_by(3) {
            p.accessed(k);
            p.grouped(k, 7); // a block shared by another file
        }
        for k in (0..50u64).step_by(4) {
            p.removed(k);
            p.grouped(k, 1);
        }
        let mut left = BTreeSet::new();
        while let Some(v) = p.victim() {
            assert!(left.insert(v), "{}: victim {v} twice", p.name());
            p.removed(v);
            p.grouped(v, 2);
        }
        assert_eq!(left, (0..50u64).filter(|k| k % 4 != 0).collect(), "{}", p.name());
    }

    /// A random mix of every call, against the set of tracked keys.
    fn random_operations_against_a_model(make: &dyn Fn() -> Box<dyn CachePolicy>, seed: u64) {
        let mut p = make();
        let mut model = BTreeSet::new();
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for step in 0..20_000 {
            let r = next();
            let key = (r >> 8) % 64;
            match r % 6 {
                0 | 1 => {
                    p.admitted(key, 1 + (r >> 20) % 4096);
                    model.insert(key);
                }
                2 => {
                    if model.contains(&key) {
                        p.accessed(key);
                    }
                }
                3 => {
                    p.removed(key);
                    model.remove(&key);
                }
                // Tracked or not: a hint changes nothing the model sees.
                4 => p.grouped(key, (r >> 32) % 8),
                _ => match p.victim() {
                    Some(v) => {
                        assert!(model.contains(&v), "{}: step {step}: victim {v} is not tracked", p.name());
                        p.removed(v);
                        model.remove(&v);
                    }
                    None => assert!(model.is_empty(), "{}: step {step}: no victim with {} keys tracked", p.name(), model.len()),
                },
            }
            assert_eq!(p.len(), model.len(), "{}: step {step}: tracks {} keys, model {}", p.name(), p.len(), model.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_passes_the_conformance_suite() {
        conformance::run_all(&|| Box::new(Lru::new()));
    }

    #[test]
    fn lru_evicts_the_least_recently_used() {
        let mut p = Lru::new();
        for k in 1..=3 {
            p.admitted(k, 1);
        }
        p.accessed(1);
        assert_eq!(p.victim(), Some(2));
        p.removed(2);
        assert_eq!(p.victim(), Some(3));
    }
}
