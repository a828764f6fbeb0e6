//! Large byte buffers kept for reuse by the flush: chunking windows and
//! pack builders.
//!
//! A fresh 16 MiB window or 40 MiB pack buffer is faulted in page by page
//! and zero-filled by the kernel; on the machines measured that cost 11% of
//! the daemon's CPU in a sequential write (docs/profile.md). Keeping a few
//! buffers bounds the memory held to `keep` buffers of each kind.

use parking_lot::Mutex;

pub(crate) struct BufferPool {
    keep: usize,
    free: Mutex<Vec<Vec<u8>>>,
}

impl BufferPool {
    pub(crate) const fn new(keep: usize) -> Self {
        BufferPool { keep, free: Mutex::new(Vec::new()) }
    }

    /// An empty buffer with at least `cap` bytes of capacity.
    pub(crate) fn take(&self, cap: usize) -> Vec<u8> {
        let mut v = self.free.lock().pop().unwrap_or_default();
        v.clear();
        v.reserve(cap);
        v
    }

    /// Returns a buffer for reuse (dropped if enough are kept).
    pub(crate) fn give(&self, v: Vec<u8>) {
        let mut f = self.free.lock();
        if f.len() < self.keep && v.capacity() > 0 {
            f.push(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_empty_with_their_capacity_and_at_most_keep_are_held() {
        let pool = BufferPool::new(1);
        let mut a = pool.take(1 << 20);
        a.extend_from_slice(b"old bytes");
        let p = a.as_ptr();
        pool.give(a);
        pool.give(vec![0u8; 10]); // over `keep`: dropped
        let b = pool.take(1000);
        assert!(b.is_empty());
        assert_eq!(b.as_ptr(), p);
        assert!(b.capacity() >= 1 << 20);
        let c = pool.take(64);
        assert!(c.capacity() >= 64);
    }
}
