//! The last page of recently stored or fetched chunks, kept in memory
//! (docs/frugal.md §6, "No read-modify-write from the bucket").
//!
//! With the kernel's writeback cache, a write that does not start on a
//! page boundary makes the kernel read the page first; an append to a file
//! whose size is not a multiple of the page reads the file's partial last
//! page, which lies in the last [`TAIL`] bytes of the file's last chunk.
//! On a volume in a bucket that read is a GET of the whole chunk, for
//! bytes the machine wrote or read a moment ago. Keeping the last page of
//! every chunk this mount stored or fetched answers it from memory.
//!
//! A chunk's bytes never change under its id (ids are never reused by a
//! running mount: they come from a counter, or from PostgreSQL's
//! sequence), so an entry is never stale; it is dropped only when the
//! bound in bytes needs room (least recently used first). Plaintext stays
//! in memory, never on disk.

use lru::LruCache;
use parking_lot::Mutex;

/// The bytes kept of each chunk: one page, which holds any file's partial
/// last page when the chunk ends the file.
pub(crate) const TAIL: usize = 4096;

/// What [`ChunkTails`] keeps of each chunk by default, where a read costs a
/// request (a bucket, a tape): 8 MiB, the last pages of at least 2,048
/// chunks.
pub(crate) const DEFAULT_BYTES: usize = 8 << 20;

struct Inner {
    /// Chunk id → (the chunk's length, its last bytes).
    map: LruCache<u64, (u64, Box<[u8]>)>,
    bytes: usize,
}

/// See the module docs.
pub(crate) struct ChunkTails {
    inner: Mutex<Inner>,
    capacity: usize,
}

impl ChunkTails {
    /// Keeps at most `capacity` bytes of tails (0: none).
    pub fn new(capacity: usize) -> ChunkTails {
        ChunkTails { inner: Mutex::new(Inner { map: LruCache::unbounded(), bytes: 0 }), capacity }
    }

    /// Keeps the last page of chunk `id`, whose bytes are `chunk`.
    pub fn keep(&self, id: u64, chunk: &[u8]) {
        let n = chunk.len().min(TAIL);
        if n == 0 || n > self.capacity {
            return;
        }
        let tail: Box<[u8]> = chunk[chunk.len() - n..].into();
        let mut g = self.inner.lock();
        if let Some((_, old)) = g.map.put(id, (chunk.len() as u64, tail)) {
            g.bytes -= old.len();
        }
        g.bytes += n;
        while g.bytes > self.capacity {
            match g.map.pop_lru() {
                Some((_, (_, old))) => g.bytes -= old.len(),
                None => break,
            }
        }
    }

    /// Bytes `[off, off + len)` of chunk `id`, if they lie in its kept tail.
    pub fn get(&self, id: u64, off: u64, len: u64) -> Option<Vec<u8>> {
        if self.capacity == 0 {
            return None;
        }
        let mut g = self.inner.lock();
        let (size, tail) = g.map.get(&id)?;
        let from = size.checked_sub(tail.len() as u64)?;
        let end = off.checked_add(len)?;
        if off < from || end > *size {
            return None;
        }
        Some(tail[(off - from) as usize..(end - from) as usize].to_vec())
    }

    /// Bytes held (for tests).
    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.inner.lock().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_page_of_a_chunk_is_answered_and_nothing_before_it() {
        let t = ChunkTails::new(3 * TAIL);
        let chunk: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        t.keep(7, &chunk);
        // A partial last page: the last 1,808 bytes (10,000 - 8,192).
        assert_eq!(t.get(7, 8192, 1808).as_deref(), Some(&chunk[8192..]));
        assert_eq!(t.get(7, 10_000 - TAIL as u64, TAIL as u64).as_deref(), Some(&chunk[10_000 - TAIL..]));
        assert_eq!(t.get(7, 10_000 - TAIL as u64 - 1, 10), None, "a byte before the tail");
        assert_eq!(t.get(7, 9_990, 11), None, "past the chunk's end");
        assert_eq!(t.get(8, 0, 1), None);
        // A chunk shorter than a page is kept whole.
        t.keep(9, b"short");
        assert_eq!(t.get(9, 0, 5).as_deref(), Some(&b"short"[..]));
    }

    #[test]
    fn the_bound_evicts_the_least_recently_used() {
        let t = ChunkTails::new(2 * TAIL);
        let page = vec![1u8; TAIL];
        t.keep(1, &page);
        t.keep(2, &page);
        assert!(t.get(1, 0, 1).is_some());
        t.keep(3, &page);
        assert!(t.get(2, 0, 1).is_none(), "2 was the least recently used");
        assert!(t.get(1, 0, 1).is_some() && t.get(3, 0, 1).is_some());
        assert_eq!(t.bytes(), 2 * TAIL);
        let none = ChunkTails::new(0);
        none.keep(1, &page);
        assert!(none.get(1, 0, 1).is_none());
    }
}
