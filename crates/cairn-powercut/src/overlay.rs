//! The volatile state of one file: dirty 4 KiB pages over the backing file,
//! the logical size, and the truncation floor.
//!
//! The view of the file through the mount, byte by byte, is: the dirty page
//! if there is one; else the backing file's byte if it lies below `floor`;
//! else zero; and nothing at or past `size`. Invariants:
//!
//! - `floor <= size` and `floor <=` the backing file's length (the backing
//!   file is only changed by [`Overlay::persist`], after which the overlay is
//!   dropped);
//! - bytes of a dirty page at or past `size` are zero (a truncation zeroes
//!   the tail of the page it cuts), so growing the file again shows zeros.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::time::SystemTime;

/// Page size of the overlay.
pub(crate) const PAGE: u64 = 4096;

/// Reads as much of `buf` as the file has at `off` (short only at EOF).
pub(crate) fn read_full_at(f: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], off + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Unsynced changes to one regular file.
#[derive(Debug)]
pub(crate) struct Overlay {
    pages: BTreeMap<u64, Box<[u8]>>,
    /// Logical size, as reported by getattr.
    size: u64,
    /// Lowest size since the last sync: backing bytes at or past it read as
    /// zeros.
    floor: u64,
    /// Modification time of the last write or size change.
    mtime: Option<SystemTime>,
}

impl Overlay {
    /// A clean overlay over a backing file of `backing_len` bytes.
    pub(crate) fn new(backing_len: u64) -> Self {
        Overlay {
            pages: BTreeMap::new(),
            size: backing_len,
            floor: backing_len,
            mtime: None,
        }
    }

    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    pub(crate) fn mtime(&self) -> Option<SystemTime> {
        self.mtime
    }

    /// Forgets the modification time (an explicit utimens was applied to
    /// the backing file).
    pub(crate) fn clear_mtime(&mut self) {
        self.mtime = None;
    }

    /// Bytes of dirty pages within the logical size.
    pub(crate) fn dirty_bytes(&self) -> u64 {
        self.pages
            .keys()
            .map(|&idx| self.size.saturating_sub(idx * PAGE).min(PAGE))
            .sum()
    }

    /// Reads up to `len` bytes at `off` of the current view (short at the
    /// logical end of file).
    pub(crate) fn read(&self, backing: &File, off: u64, len: u32) -> io::Result<Vec<u8>> {
        let end = off.saturating_add(u64::from(len)).min(self.size);
        if off >= end {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; (end - off) as usize];
        if off < self.floor {
            let n = (end.min(self.floor) - off) as usize;
            // Short reads leave zeros (the backing file ends early).
            read_full_at(backing, &mut buf[..n], off)?;
        }
        for (&idx, page) in self.pages.range(off / PAGE..=(end - 1) / PAGE) {
            let pstart = idx * PAGE;
            let from = off.max(pstart);
            let to = end.min(pstart + PAGE);
            buf[(from - off) as usize..(to - off) as usize]
                .copy_from_slice(&page[(from - pstart) as usize..(to - pstart) as usize]);
        }
        Ok(buf)
    }

    /// The current content of page `idx` (for a partial write into it).
    fn load_page(&self, backing: &File, idx: u64) -> io::Result<Box<[u8]>> {
        let mut page = vec![0u8; PAGE as usize].into_boxed_slice();
        let start = idx * PAGE;
        if start < self.floor {
            let n = (self.floor - start).min(PAGE) as usize;
            read_full_at(backing, &mut page[..n], start)?;
        }
        Ok(page)
    }

    /// Writes `data` at `off`; returns how many pages became dirty.
    pub(crate) fn write(&mut self, backing: &File, off: u64, data: &[u8]) -> io::Result<u64> {
        if data.is_empty() {
            return Ok(0);
        }
        let end = off
            .checked_add(data.len() as u64)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EFBIG))?;
        let mut new_pages = 0;
        for idx in off / PAGE..=(end - 1) / PAGE {
            let pstart = idx * PAGE;
            let from = off.max(pstart);
            let to = end.min(pstart + PAGE);
            if !self.pages.contains_key(&idx) {
                let page = if from == pstart && to == pstart + PAGE {
                    vec![0u8; PAGE as usize].into_boxed_slice()
                } else {
                    self.load_page(backing, idx)?
                };
                self.pages.insert(idx, page);
                new_pages += 1;
            }
            let page = self.pages.get_mut(&idx).expect("inserted above");
            page[(from - pstart) as usize..(to - pstart) as usize]
                .copy_from_slice(&data[(from - off) as usize..(to - off) as usize]);
        }
        self.size = self.size.max(end);
        self.mtime = Some(SystemTime::now());
        Ok(new_pages)
    }

    /// Sets the logical size; returns how many dirty pages were dropped.
    pub(crate) fn truncate(&mut self, size: u64) -> u64 {
        let mut dropped = 0;
        if size < self.size {
            let first_gone = size.div_ceil(PAGE);
            dropped = self.pages.split_off(&first_gone).len() as u64;
            let cut = (size % PAGE) as usize;
            if cut != 0 {
                if let Some(page) = self.pages.get_mut(&(size / PAGE)) {
                    page[cut..].fill(0);
                }
            }
            self.floor = self.floor.min(size);
        }
        self.size = size;
        self.mtime = Some(SystemTime::now());
        dropped
    }

    /// Number of dirty pages.
    #[cfg(test)]
    pub(crate) fn pages(&self) -> u64 {
        self.pages.len() as u64
    }

    /// Writes the state into the backing file (without syncing it): its
    /// length goes to the floor, then to the logical size, then the dirty
    /// pages are written. Returns the bytes of page data written.
    pub(crate) fn persist(&self, backing: &File) -> io::Result<u64> {
        backing.set_len(self.floor)?;
        backing.set_len(self.size)?;
        let mut written = 0;
        for (&idx, page) in &self.pages {
            let start = idx * PAGE;
            if start >= self.size {
                break;
            }
            let n = (self.size - start).min(PAGE) as usize;
            backing.write_all_at(&page[..n], start)?;
            written += n as u64;
        }
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn backing(content: &[u8]) -> File {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(content).unwrap();
        f
    }

    fn whole(o: &Overlay, f: &File) -> Vec<u8> {
        o.read(f, 0, u32::MAX).unwrap()
    }

    #[test]
    fn clean_view_is_the_backing_file() {
        let data: Vec<u8> = (0..10000u32).map(|i| i as u8).collect();
        let f = backing(&data);
        let o = Overlay::new(data.len() as u64);
        assert_eq!(whole(&o, &f), data);
        assert_eq!(o.read(&f, 9990, 100).unwrap(), &data[9990..]);
        assert!(o.read(&f, 10000, 10).unwrap().is_empty());
        assert!(o.read(&f, 20000, 10).unwrap().is_empty());
    }

    #[test]
    fn writes_over_backing_at_odd_offsets() {
        let data = vec![7u8; 10000];
        let f = backing(&data);
        let mut o = Overlay::new(10000);
        o.write(&f, 4090, &[1u8; 20]).unwrap(); // spans pages 0 and 1
        o.write(&f, 9999, &[2u8; 3]).unwrap(); // extends the file
        let mut want = data.clone();
        want[4090..4110].fill(1);
        want[9999] = 2;
        want.extend_from_slice(&[2, 2]);
        assert_eq!(whole(&o, &f), want);
        assert_eq!(o.size(), 10002);
        assert_eq!(o.pages(), 3);
        // Nothing reached the backing file.
        let mut b = vec![0u8; 10000];
        read_full_at(&f, &mut b, 0).unwrap();
        assert_eq!(b, data);
        assert_eq!(f.metadata().unwrap().len(), 10000);
    }

    #[test]
    fn truncate_then_grow_shows_zeros() {
        let data = vec![9u8; 10000];
        let f = backing(&data);
        let mut o = Overlay::new(10000);
        o.write(&f, 5, &[1u8; 3]).unwrap();
        o.truncate(10);
        o.write(&f, 8000, &[3u8; 192]).unwrap();
        let v = whole(&o, &f);
        assert_eq!(v.len(), 8192);
        assert_eq!(&v[..5], &[9u8; 5]);
        assert_eq!(&v[5..8], &[1u8; 3]);
        assert_eq!(&v[8..10], &[9u8; 2]);
        assert!(v[10..8000].iter().all(|&b| b == 0));
        assert_eq!(&v[8000..], &[3u8; 192][..]);
        // Grow by setattr: still zeros.
        o.truncate(12000);
        let v = whole(&o, &f);
        assert!(v[8192..].iter().all(|&b| b == 0));

        // Persisting gives the backing file exactly the view.
        o.persist(&f).unwrap();
        let mut b = vec![0u8; 12000];
        assert_eq!(read_full_at(&f, &mut b, 0).unwrap(), 12000);
        assert_eq!(b, v);
        assert_eq!(f.metadata().unwrap().len(), 12000);
    }

    #[test]
    fn truncate_drops_and_zeroes_pages() {
        let f = backing(b"");
        let mut o = Overlay::new(0);
        o.write(&f, 0, &[5u8; 3 * PAGE as usize]).unwrap();
        assert_eq!(o.truncate(100), 2);
        o.truncate(PAGE);
        let v = whole(&o, &f);
        assert_eq!(&v[..100], &[5u8; 100][..]);
        assert!(v[100..].iter().all(|&b| b == 0));
        assert_eq!(o.dirty_bytes(), PAGE);
    }
}
