//! A file's content as an ordered list of extents, stored in pages.
//!
//! An extent is a byte range of one chunk (or a hole, or — only in memory,
//! while a flush is being prepared — a range of the write-back journal).
//! Because an extent can point into any part of any chunk, clone, insert,
//! delete and archive operations are edits of this list, never of data.
//!
//! The list is cut into pages of at most [`PAGE_MAX`] extents. A page is an
//! immutable, reference-counted metadata row `(id, refs, data)`; a file links
//! its pages under sparse, ordered keys `(ino, key) -> id`. A splice replaces
//! only the pages it touches and never renumbers later extents: positional
//! lookup is a binary search over page start offsets (O(log n)), and a splice
//! costs O(PAGE_MAX + n/PAGE_MAX).
//!
//! Pages are shared copy-on-write between clones and snapshots: a clone
//! links the same page ids (O(pages), no chunk reference changes), and an
//! edit never updates a stored page in place but writes a new one. A chunk's
//! reference count counts the extents of distinct stored pages that use it.

use crate::error::{Error, Result};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// Most extents a page holds.
pub const PAGE_MAX: usize = 512;
const KEY_STEP: i64 = 1 << 32;
/// Largest offset-plus-length an extent may have inside its chunk.
const MAX_CHUNK_SPAN: u64 = 64 << 20;
/// Largest byte count a page, or a file's pages together, may describe: the
/// largest file, which is the kernel's (`i64::MAX`, its `s_maxbytes` for
/// FUSE: a daemon cannot tell it a smaller one, so a smaller limit would
/// turn writes the kernel already took into its page cache into errors at
/// write-back, which no one sees).
pub const MAX_FILE_SPAN: u64 = i64::MAX as u64;

/// Where bytes of a journal record lie: shard, segment, and `offset`, the
/// byte's position as if the record's plaintext started at `record` (its
/// data's start in the segment). A sealed record (encrypted volumes) is
/// opened whole, so the location also names the record and its length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct JLoc {
    pub shard: u16,
    pub segment: u32,
    pub offset: u64,
    /// Where the record's stored data starts in the segment.
    pub record: u64,
    /// Plaintext length of a sealed record; 0 for a record in the clear.
    pub sealed_len: u32,
}

/// What an extent's bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// Zeros that take no space.
    Hole,
    /// Bytes of a stored chunk, by its metadata id.
    Chunk(u64),
    /// Bytes still in the journal (never persisted in a page).
    Pending(JLoc),
    /// Bytes of a caller's buffer, at `off` within it, while an edit is
    /// being re-chunked (never persisted in a page).
    Mem,
}

/// `len` bytes of `src` starting at `off` within it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Extent {
    pub src: Source,
    pub off: u64,
    pub len: u64,
}

impl Extent {
    pub fn hole(len: u64) -> Self {
        Extent { src: Source::Hole, off: 0, len }
    }
    pub fn chunk(id: u64, off: u64, len: u64) -> Self {
        Extent { src: Source::Chunk(id), off, len }
    }
    /// The sub-extent `[from, from + len)` of this one.
    pub fn slice(&self, from: u64, len: u64) -> Self {
        debug_assert!(from + len <= self.len);
        let off = if self.src == Source::Hole { 0 } else { self.off + from };
        Extent { src: self.src, off, len }
    }
    fn merges_with(&self, next: &Extent) -> bool {
        self.src == next.src && (self.src == Source::Hole || self.off + self.len == next.off)
    }
}

/// One page of a file: its key in the file and its stored id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page {
    pub key: i64,
    /// Id of the stored page row; 0 until the page is first stored.
    pub id: u64,
    pub extents: Vec<Extent>,
    pub len: u64,
}

impl Page {
    pub fn new(key: i64, extents: Vec<Extent>) -> Self {
        let len = extents.iter().map(|e| e.len).sum();
        Page { key, id: 0, extents, len }
    }
}

/// Where `ExtentMap::range_from` left off: the extent holding the last
/// start offset. A default cursor starts from a lookup.
#[derive(Clone, Copy, Debug, Default)]
pub struct RangeCursor {
    page: usize,
    ext: usize,
    /// File offset where extent `ext` of page `page` begins.
    pos: u64,
    valid: bool,
}

/// The extent list of one file.
#[derive(Clone, Debug, Default)]
pub struct ExtentMap {
    pages: Vec<Arc<Page>>,
    /// `starts[i]` is the file offset where page `i` begins.
    starts: Vec<u64>,
    len: u64,
    /// Keys whose link changed since the last `take_changes`.
    changed: BTreeSet<i64>,
    /// Keys unlinked since then.
    removed: BTreeSet<i64>,
    /// Stored pages this map stopped linking.
    dropped: Vec<Arc<Page>>,
    /// Stored pages this map started linking (a clone's shared pages).
    gained: Vec<u64>,
}

/// What to persist after edits of one file's map.
#[derive(Debug, Default)]
pub struct PageChanges {
    /// Pages to link at their keys: new pages (id 0) are stored first.
    pub upserts: Vec<Arc<Page>>,
    /// Keys to unlink.
    pub deletes: Vec<i64>,
    /// Stored pages that lose one link (freed, with their chunk references,
    /// when the last goes).
    pub dropped: Vec<Arc<Page>>,
    /// Stored pages that gain one link.
    pub gained: Vec<u64>,
}

impl ExtentMap {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// A map from stored pages (in key order).
    pub fn from_pages(mut pages: Vec<Page>) -> Self {
        pages.sort_by_key(|p| p.key);
        let mut m = ExtentMap { pages: pages.into_iter().filter(|p| !p.extents.is_empty()).map(Arc::new).collect(), ..Default::default() };
        m.recompute_starts();
        m
    }

    fn recompute_starts(&mut self) {
        self.starts.clear();
        let mut pos = 0;
        for p in &self.pages {
            self.starts.push(pos);
            pos += p.len;
        }
        self.len = pos;
    }

    /// Logical length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of extents (O(pages)).
    pub fn extent_count(&self) -> usize {
        self.pages.iter().map(|p| p.extents.len()).sum()
    }

    /// Bytes that are not holes.
    pub fn data_bytes(&self) -> u64 {
        self.pages.iter().flat_map(|p| p.extents.iter()).filter(|e| e.src != Source::Hole).map(|e| e.len).sum()
    }

    /// Index of the page holding byte `pos` (the last page if `pos == len`).
    fn page_at(&self, pos: u64) -> usize {
        match self.starts.binary_search(&pos) {
            Ok(i) => i,
            Err(i) => i.saturating_sub(1),
        }
    }

    /// Like `range`, resuming from `cur` when `start` is at or after the
    /// last call's: a pass over the file in increasing offsets (a tar's
    /// headers and members) costs O(extents) in all instead of a scan of a
    /// page (up to `PAGE_MAX` extents) per call.
    pub fn range_from(&self, cur: &mut RangeCursor, start: u64, end: u64) -> Vec<(u64, Extent)> {
        let end = end.min(self.len);
        let mut out = Vec::new();
        if start >= end {
            return out;
        }
        if !cur.valid || start < cur.pos || cur.page >= self.pages.len() {
            let pi = self.page_at(start);
            *cur = RangeCursor { page: pi, ext: 0, pos: self.starts[pi], valid: true };
        }
        // Skip whole extents that end at or before `start`.
        while cur.page < self.pages.len() {
            let exts = &self.pages[cur.page].extents;
            if cur.ext >= exts.len() {
                cur.page += 1;
                cur.ext = 0;
                continue;
            }
            let e = &exts[cur.ext];
            if cur.pos + e.len > start {
                break;
            }
            cur.pos += e.len;
            cur.ext += 1;
        }
        let (mut pi, mut ei, mut pos) = (cur.page, cur.ext, cur.pos);
        while pi < self.pages.len() {
            let exts = &self.pages[pi].extents;
            if ei >= exts.len() {
                pi += 1;
                ei = 0;
                continue;
            }
            let e = &exts[ei];
            if pos >= end {
                break;
            }
            let s = start.max(pos);
            let t = end.min(pos + e.len);
            out.push((s, e.slice(s - pos, t - s)));
            pos += e.len;
            ei += 1;
        }
        out
    }

    /// The extents that overlap `[start, end)` (`end` already clipped to
    /// the map), whole, each with the file offset where it begins: the one
    /// page walk `range` and `more_extents_than` share. Lazy, so a caller
    /// that stops early walks only what it took.
    fn overlapping(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, &Extent)> + '_ {
        let pi = if start < end { self.page_at(start) } else { self.pages.len() };
        let mut pos = self.starts.get(pi).copied().unwrap_or(self.len);
        self.pages[pi..]
            .iter()
            .flat_map(|p| p.extents.iter())
            .map(move |e| {
                let at = pos;
                pos += e.len;
                (at, e)
            })
            .skip_while(move |(at, e)| at + e.len <= start)
            .take_while(move |(at, _)| *at < end)
    }

    /// The extents covering `[start, end)`, clipped, with their file offsets.
    pub fn range(&self, start: u64, end: u64) -> Vec<(u64, Extent)> {
        let end = end.min(self.len);
        self.overlapping(start, end)
            .map(|(es, e)| {
                let s = start.max(es);
                let t = end.min(es + e.len);
                (s, e.slice(s - es, t - s))
            })
            .collect()
    }

    /// All extents with their offsets.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Extent)> + '_ {
        let mut pos = 0u64;
        self.pages.iter().flat_map(|p| p.extents.iter()).map(move |e| {
            let at = pos;
            pos += e.len;
            (at, e)
        })
    }

    /// The boundary offsets of extents strictly inside `(start, end]`, plus
    /// `end` of the map when reached: where an old chunk ends.
    pub fn boundaries(&self, start: u64, end: u64) -> Vec<u64> {
        let mut out = Vec::new();
        for (at, e) in self.range(start, end) {
            let ee = at + e.len;
            if ee > start {
                out.push(ee);
            }
        }
        out
    }

    /// Replaces `[start, end)` by `new`; returns the extents removed.
    pub fn splice(&mut self, start: u64, end: u64, new: Vec<Extent>) -> Vec<Extent> {
        assert!(start <= end && end <= self.len, "splice {start}..{end} outside 0..{}", self.len);
        let new: Vec<Extent> = new.into_iter().filter(|e| e.len > 0).collect();
        if self.pages.is_empty() {
            if !new.is_empty() {
                self.rebuild(0, 0, new);
            }
            return Vec::new();
        }
        let p0 = self.page_at(start);
        let p1 = if end > start { self.page_at(end - 1) } else { p0 }.max(p0);
        let mut before = Vec::new();
        let mut after = Vec::new();
        let mut removed = Vec::new();
        let mut pos = self.starts[p0];
        for page in &self.pages[p0..=p1] {
            for e in &page.extents {
                let (es, ee) = (pos, pos + e.len);
                pos = ee;
                if ee <= start {
                    before.push(*e);
                } else if es >= end {
                    after.push(*e);
                } else {
                    if es < start {
                        before.push(e.slice(0, start - es));
                    }
                    let (s, t) = (start.max(es), end.min(ee));
                    if t > s {
                        removed.push(e.slice(s - es, t - s));
                    }
                    if ee > end {
                        after.push(e.slice(end - es, ee - end));
                    }
                }
            }
        }
        let mut all = before;
        all.extend(new);
        all.extend(after);
        self.rebuild(p0, p1 + 1, all);
        removed
    }

    /// Whether `[start, end)` holds more than `cap` extents, counting at
    /// most `cap + 1` of them (a bounded [`ExtentMap::range`]`.len()`).
    pub fn more_extents_than(&self, start: u64, end: u64, cap: usize) -> bool {
        self.overlapping(start, end.min(self.len)).nth(cap).is_some()
    }

    /// Overwrites many ranges at once: each `(at, extents)` replaces the
    /// bytes `[at, at + their length)`, as `splice` of each would, but in
    /// one pass over the pages the edits touch. `edits` are in increasing
    /// order of `at` and do not overlap. n scattered edits (a flush of a
    /// million one-byte writes) cost O(n + extents of the touched pages +
    /// groups · pages) instead of O(n · (PAGE_MAX + pages)) for n splices.
    pub fn overwrite_many(&mut self, edits: Vec<(u64, Vec<Extent>)>) {
        let edits: Vec<(u64, u64, Vec<Extent>)> = edits
            .into_iter()
            .map(|(at, ex)| {
                let ex: Vec<Extent> = ex.into_iter().filter(|e| e.len > 0).collect();
                (at, ex.iter().map(|e| e.len).sum::<u64>(), ex)
            })
            .filter(|(_, l, _)| *l > 0)
            .collect();
        if edits.is_empty() {
            return;
        }
        let mut prev_end = 0;
        for (at, l, _) in &edits {
            assert!(*at >= prev_end && at + l <= self.len, "overwrite_many: edit {at}+{l} out of order, overlapping or past {}", self.len);
            prev_end = at + l;
        }
        // Groups of edits touching overlapping page ranges: (first page,
        // last page, first edit, end of edits).
        let mut groups: Vec<(usize, usize, usize, usize)> = Vec::new();
        for (k, (at, l, _)) in edits.iter().enumerate() {
            let p0 = self.page_at(*at);
            let p1 = self.page_at(at + l - 1).max(p0);
            match groups.last_mut() {
                Some(g) if p0 <= g.1 => {
                    g.1 = g.1.max(p1);
                    g.3 = k + 1;
                }
                _ => groups.push((p0, p1, k, k + 1)),
            }
        }
        let mut edits: Vec<Option<(u64, u64, Vec<Extent>)>> = edits.into_iter().map(Some).collect();
        // Right to left: rebuilding a group leaves the pages before it,
        // and so the next groups' page indexes, as they were.
        for &(p0, p1, k0, k1) in groups.iter().rev() {
            let mut out: Vec<Extent> = Vec::new();
            let mut j = k0;
            let mut emitted = false;
            let mut es = self.starts[p0];
            for page in &self.pages[p0..=p1] {
                for e in &page.extents {
                    let ee = es + e.len;
                    let mut s = es;
                    while s < ee {
                        let cur = (j < k1).then(|| edits[j].as_ref().map(|(a, l, _)| (*a, a + l)).expect("edit taken once"));
                        match cur {
                            Some((a, b)) if a <= s => {
                                if !emitted {
                                    out.extend(edits[j].as_ref().expect("edit taken once").2.iter().copied());
                                    emitted = true;
                                }
                                s = b.min(ee);
                                if b <= ee {
                                    edits[j] = None;
                                    j += 1;
                                    emitted = false;
                                }
                            }
                            next => {
                                let t = next.map_or(ee, |(a, _)| a.min(ee));
                                out.push(e.slice(s - es, t - s));
                                s = t;
                            }
                        }
                    }
                    es = ee;
                }
            }
            debug_assert_eq!(j, k1, "every edit of the group applied");
            self.rebuild(p0, p1 + 1, out);
        }
    }

    /// Sets the length: truncates, or extends with a hole.
    pub fn set_len(&mut self, new_len: u64) -> Vec<Extent> {
        if new_len < self.len {
            self.splice(new_len, self.len, Vec::new())
        } else {
            if new_len > self.len {
                let l = self.len;
                self.splice(l, l, vec![Extent::hole(new_len - l)]);
            }
            Vec::new()
        }
    }

    /// Replaces pages `[a, b)` with pages built from `extents`.
    fn rebuild(&mut self, a: usize, b: usize, extents: Vec<Extent>) {
        for p in &self.pages[a..b] {
            if p.id != 0 {
                self.dropped.push(p.clone());
            }
        }
        let mut merged: Vec<Extent> = Vec::with_capacity(extents.len());
        for e in extents {
            match merged.last_mut() {
                Some(last) if last.merges_with(&e) => last.len += e.len,
                _ => merged.push(e),
            }
        }
        let groups: Vec<Vec<Extent>> = if merged.is_empty() {
            Vec::new()
        } else {
            let n = merged.len().div_ceil(PAGE_MAX);
            let per = merged.len().div_ceil(n);
            merged.chunks(per).map(|c| c.to_vec()).collect()
        };
        let old_keys: Vec<i64> = self.pages[a..b].iter().map(|p| p.key).collect();
        let lo = if a > 0 { Some(self.pages[a - 1].key) } else { None };
        let hi = self.pages.get(b).map(|p| p.key);
        let keys = match fresh_keys(&old_keys, groups.len(), lo, hi) {
            Some(k) => k,
            None => {
                // No room between neighbours: renumber every page (stored
                // pages keep their ids; only their links move).
                let mut all: Vec<Page> = self.pages[..a].iter().map(|p| (**p).clone()).collect();
                all.extend(groups.into_iter().map(|ex| Page::new(0, ex)));
                all.extend(self.pages[b..].iter().map(|p| (**p).clone()));
                for p in &self.pages {
                    self.removed.insert(p.key);
                }
                self.pages = all
                    .into_iter()
                    .enumerate()
                    .map(|(i, mut p)| {
                        p.key = i as i64 * KEY_STEP;
                        Arc::new(p)
                    })
                    .collect();
                self.changed = self.pages.iter().map(|p| p.key).collect();
                self.recompute_starts();
                return;
            }
        };
        for k in &old_keys {
            if !keys.contains(k) {
                self.removed.insert(*k);
            }
        }
        let new_pages: Vec<Arc<Page>> = groups.into_iter().zip(&keys).map(|(ex, k)| Arc::new(Page::new(*k, ex))).collect();
        for p in &new_pages {
            self.changed.insert(p.key);
            self.removed.remove(&p.key);
        }
        self.pages.splice(a..b, new_pages);
        self.recompute_starts();
    }

    /// The extents of the pages changed since the last `take_changes`,
    /// with their offsets: what the next commit stores (for the trace).
    pub fn changed_extents(&self) -> Vec<(u64, Extent)> {
        let mut out = Vec::new();
        for (p, &start) in self.pages.iter().zip(&self.starts).filter(|(p, _)| self.changed.contains(&p.key)) {
            let mut at = start;
            for e in &p.extents {
                out.push((at, *e));
                at += e.len;
            }
        }
        out
    }

    /// Pages changed since the last call, for persisting.
    pub fn take_changes(&mut self) -> PageChanges {
        let changed = std::mem::take(&mut self.changed);
        let removed = std::mem::take(&mut self.removed);
        let live: BTreeSet<i64> = self.pages.iter().map(|p| p.key).collect();
        PageChanges {
            upserts: self.pages.iter().filter(|p| changed.contains(&p.key)).cloned().collect(),
            deletes: removed.into_iter().filter(|k| !live.contains(k)).collect(),
            dropped: std::mem::take(&mut self.dropped),
            gained: std::mem::take(&mut self.gained),
        }
    }

    /// Whether edits await `take_changes`.
    pub fn has_changes(&self) -> bool {
        !self.changed.is_empty() || !self.removed.is_empty() || !self.dropped.is_empty() || !self.gained.is_empty()
    }

    /// Records the ids the store gave to new pages (by key), after a commit.
    pub fn assign_ids(&mut self, ids: &[(i64, u64)]) {
        if ids.is_empty() {
            return;
        }
        let by_key: HashMap<i64, u64> = ids.iter().copied().collect();
        for p in self.pages.iter_mut() {
            if p.id == 0 {
                if let Some(&id) = by_key.get(&p.key) {
                    Arc::make_mut(p).id = id;
                }
            }
        }
    }

    /// A copy of this (fully stored) map for another file: the same pages,
    /// each linked once more, with no chunk reference changing.
    pub fn share(&self) -> ExtentMap {
        let mut m = ExtentMap { pages: self.pages.clone(), starts: self.starts.clone(), len: self.len, ..Default::default() };
        m.changed = m.pages.iter().map(|p| p.key).collect();
        m.gained = m.pages.iter().filter(|p| p.id != 0).map(|p| p.id).collect();
        m
    }

    /// Makes this map a copy of `src` (fully stored) sharing its pages:
    /// this map's own pages are dropped, `src`'s linked once more.
    pub fn replace_with_share(&mut self, src: &ExtentMap) {
        for p in std::mem::take(&mut self.pages) {
            self.removed.insert(p.key);
            if p.id != 0 {
                self.dropped.push(p);
            }
        }
        self.pages = src.pages.clone();
        self.starts = src.starts.clone();
        self.len = src.len;
        for p in &self.pages {
            self.changed.insert(p.key);
            self.removed.remove(&p.key);
            if p.id != 0 {
                self.gained.push(p.id);
            }
        }
    }

    /// Whether every page has been stored (none waits for an id).
    pub fn all_stored(&self) -> bool {
        self.pages.iter().all(|p| p.id != 0)
    }

    /// Every chunk id referenced, once per extent.
    pub fn chunk_refs(&self) -> impl Iterator<Item = u64> + '_ {
        self.pages.iter().flat_map(|p| p.extents.iter()).filter_map(|e| match e.src {
            Source::Chunk(id) => Some(id),
            _ => None,
        })
    }

    /// Whether any extent still points into the journal.
    pub fn has_pending(&self) -> bool {
        self.pages.iter().flat_map(|p| p.extents.iter()).any(|e| matches!(e.src, Source::Pending(_)))
    }
}

/// Keys for `n` pages replacing `old` between neighbours `lo` and `hi`.
fn fresh_keys(old: &[i64], n: usize, lo: Option<i64>, hi: Option<i64>) -> Option<Vec<i64>> {
    if n <= old.len() {
        return Some(old[..n].to_vec());
    }
    let mut keys = old.to_vec();
    let start = keys.last().copied().or(lo);
    let extra = (n - keys.len()) as i64;
    match (start, hi) {
        (None, None) => return Some((0..n as i64).map(|i| i * KEY_STEP).collect()),
        (Some(s), None) => keys.extend((1..=extra).map(|i| s + i * KEY_STEP)),
        (s, Some(h)) => {
            let s = s.unwrap_or(h - (extra + 1) * KEY_STEP);
            let step = (h - s) / (extra + 1);
            if step < 1 {
                return None;
            }
            keys.extend((1..=extra).map(|i| s + i * step));
        }
    }
    Some(keys)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(b: &[u8], pos: &mut usize) -> Result<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*pos).ok_or_else(|| Error::corrupt("extent page truncated"))?;
        *pos += 1;
        v |= ((byte & 0x7f) as u64) << shift;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(Error::corrupt("extent page varint too long"))
}

/// Encodes a page's extents: per extent `tag, [chunk id], off, len` as varints
/// (tag 0 = hole, 1 = chunk).
pub fn encode_page(p: &Page) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(p.extents.len() * 8);
    for e in &p.extents {
        match e.src {
            Source::Hole => {
                put_varint(&mut out, 0);
                put_varint(&mut out, e.len);
            }
            Source::Chunk(id) => {
                put_varint(&mut out, 1);
                put_varint(&mut out, id);
                put_varint(&mut out, e.off);
                put_varint(&mut out, e.len);
            }
            Source::Pending(_) | Source::Mem => return Err(Error::invalid("internal: unstored extent reached a stored page")),
        }
    }
    Ok(out)
}

/// Decodes a stored page.
pub fn decode_page(key: i64, b: &[u8]) -> Result<Page> {
    let mut pos = 0;
    let mut ex = Vec::new();
    let mut total = 0u64;
    while pos < b.len() {
        let e = match get_varint(b, &mut pos)? {
            0 => Extent::hole(get_varint(b, &mut pos)?),
            1 => {
                let id = get_varint(b, &mut pos)?;
                let off = get_varint(b, &mut pos)?;
                Extent::chunk(id, off, get_varint(b, &mut pos)?)
            }
            t => return Err(Error::corrupt(format!("extent page: unknown tag {t}"))),
        };
        if e.len == 0 {
            return Err(Error::corrupt("extent page: empty extent"));
        }
        // A chunk is at most 64 MiB; a file at most 2^63 - 1 bytes.
        if e.src != Source::Hole && e.off.checked_add(e.len).is_none_or(|end| end > MAX_CHUNK_SPAN) {
            return Err(Error::corrupt("extent page: extent past any chunk's end"));
        }
        total = total.checked_add(e.len).filter(|t| *t <= MAX_FILE_SPAN).ok_or_else(|| Error::corrupt("extent page: length overflows"))?;
        ex.push(e);
    }
    Ok(Page::new(key, ex))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The byte a chunk holds at an offset, in this test's imaginary store.
    fn byte_of(src: Source, off: u64) -> u8 {
        match src {
            Source::Hole => 0,
            Source::Chunk(id) => (id.wrapping_mul(131).wrapping_add(off.wrapping_mul(7)) % 251) as u8 + 1,
            Source::Pending(_) | Source::Mem => unreachable!(),
        }
    }

    fn materialize(m: &ExtentMap) -> Vec<u8> {
        let mut v = Vec::new();
        for (_, e) in m.iter() {
            for i in 0..e.len {
                v.push(byte_of(e.src, e.off + i));
            }
        }
        v
    }

    fn ext_strategy() -> impl Strategy<Value = Extent> {
        prop_oneof![
            (1u64..50).prop_map(Extent::hole),
            (1u64..20, 0u64..100, 1u64..60).prop_map(|(id, off, len)| Extent::chunk(id, off, len)),
        ]
    }

    #[derive(Debug, Clone)]
    enum Op {
        Splice { a: u64, b: u64, new: Vec<Extent> },
        SetLen(u64),
    }

    fn op_strategy() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (any::<u64>(), any::<u64>(), prop::collection::vec(ext_strategy(), 0..6))
                .prop_map(|(a, b, new)| Op::Splice { a, b, new }),
            1 => (0u64..3000).prop_map(Op::SetLen),
        ]
    }

    proptest! {
        /// `overwrite_many` leaves the same content as one splice per edit,
        /// on maps of many pages, and persists through the page store.
        #[test]
        fn overwrite_many_is_splices_in_one_pass(
            base in prop::collection::vec(ext_strategy(), 1..3000),
            cuts in prop::collection::vec((any::<u64>(), prop::collection::vec(ext_strategy(), 1..3)), 0..400),
        ) {
            let mut a = ExtentMap::new();
            a.splice(0, 0, base);
            let mut store = Store::default();
            store.persist(1, &mut a);
            let mut b = a.clone();
            let len = a.len();
            // Disjoint, ordered edits: one per cut point, each at most up
            // to the next cut (clipped extents keep their total length).
            let mut points: Vec<(u64, Vec<Extent>)> = cuts.into_iter().map(|(at, ex)| (at % len, ex)).collect();
            points.sort_by_key(|p| p.0);
            points.dedup_by_key(|p| p.0);
            let mut edits = Vec::new();
            for i in 0..points.len() {
                let (at, ref ex) = points[i];
                let room = points.get(i + 1).map_or(len, |p| p.0) - at;
                let mut left = room;
                let ex: Vec<Extent> = ex.iter().filter_map(|e| {
                    let l = e.len.min(left);
                    left -= l;
                    (l > 0).then(|| e.slice(0, l))
                }).collect();
                edits.push((at, ex));
            }
            for (at, ex) in &edits {
                let l: u64 = ex.iter().map(|e| e.len).sum();
                a.splice(*at, at + l, ex.clone());
            }
            b.overwrite_many(edits);
            prop_assert_eq!(b.len(), len);
            prop_assert_eq!(materialize(&a), materialize(&b));
            store.persist(1, &mut b);
            prop_assert_eq!(materialize(&store.load(1)), materialize(&a));
            store.check()?;
        }
    }

    /// A page store as the metadata keeps it: page rows with link counts,
    /// and per-file links from keys to page ids.
    #[derive(Default)]
    struct Store {
        pages: std::collections::HashMap<u64, (i64, Vec<u8>)>,
        links: std::collections::HashMap<u32, std::collections::BTreeMap<i64, u64>>,
        next: u64,
    }

    impl Store {
        fn persist(&mut self, file: u32, m: &mut ExtentMap) {
            let ch = m.take_changes();
            for id in &ch.gained {
                self.pages.get_mut(id).expect("gained page exists").0 += 1;
            }
            let mut ids = Vec::new();
            for p in &ch.upserts {
                let id = if p.id == 0 {
                    self.next += 1;
                    self.pages.insert(self.next, (1, encode_page(p).unwrap()));
                    ids.push((p.key, self.next));
                    self.next
                } else {
                    p.id
                };
                self.links.entry(file).or_default().insert(p.key, id);
            }
            for k in &ch.deletes {
                self.links.entry(file).or_default().remove(k);
            }
            for p in &ch.dropped {
                let e = self.pages.get_mut(&p.id).expect("dropped page exists");
                e.0 -= 1;
                if e.0 == 0 {
                    self.pages.remove(&p.id);
                }
            }
            m.assign_ids(&ids);
        }

        fn load(&self, file: u32) -> ExtentMap {
            let links = self.links.get(&file).cloned().unwrap_or_default();
            ExtentMap::from_pages(links.iter().map(|(k, id)| {
                let mut p = decode_page(*k, &self.pages[id].1).unwrap();
                p.id = *id;
                p
            }).collect())
        }

        /// Every page's link count equals its links; no page is unlinked.
        fn check(&self) -> Result<(), TestCaseError> {
            let mut n: std::collections::HashMap<u64, i64> = Default::default();
            for l in self.links.values() {
                for id in l.values() {
                    *n.entry(*id).or_default() += 1;
                }
            }
            for (id, (refs, _)) in &self.pages {
                prop_assert_eq!(*refs, n.get(id).copied().unwrap_or(0), "page {} link count", id);
            }
            prop_assert_eq!(n.len(), self.pages.len());
            Ok(())
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Every splice and resize agrees with a plain byte vector; pages
        /// persist and reload to the same content; a clone taken midway keeps
        /// its content while the original is edited; page link counts stay
        /// exact, so shared pages are never freed while a file links them.
        #[test]
        fn splices_match_a_byte_model(ops in prop::collection::vec(op_strategy(), 1..60), clone_at in 0usize..60) {
            let mut m = ExtentMap::new();
            let mut model: Vec<u8> = Vec::new();
            let mut store = Store::default();
            let mut clone: Option<(ExtentMap, Vec<u8>)> = None;
            for (i, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Splice { a, b, new } => {
                        let len = model.len() as u64;
                        let (a, b) = if len == 0 { (0, 0) } else { let a = a % (len + 1); (a, a + b % (len - a + 1)) };
                        let mut bytes = Vec::new();
                        for e in &new { for i in 0..e.len { bytes.push(byte_of(e.src, e.off + i)); } }
                        let removed = m.splice(a, b, new);
                        let removed_bytes: Vec<u8> = removed.iter().flat_map(|e| (0..e.len).map(move |i| byte_of(e.src, e.off + i))).collect();
                        prop_assert_eq!(&removed_bytes[..], &model[a as usize..b as usize]);
                        model.splice(a as usize..b as usize, bytes);
                    }
                    Op::SetLen(n) => {
                        m.set_len(n);
                        model.resize(n as usize, 0);
                    }
                }
                prop_assert_eq!(m.len(), model.len() as u64);
                prop_assert_eq!(materialize(&m), model.clone());
                store.persist(1, &mut m);
                prop_assert!(m.all_stored());
                if i == clone_at {
                    let mut c = m.share();
                    store.persist(2, &mut c);
                    clone = Some((c, model.clone()));
                }
                store.check()?;
                prop_assert_eq!(materialize(&store.load(1)), model.clone());
                if let Some((c, cm)) = &clone {
                    prop_assert_eq!(&materialize(c), cm);
                    prop_assert_eq!(&materialize(&store.load(2)), cm);
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// A cursor carried across calls gives what `range` gives, whatever
        /// order the queries come in (forward, as a tar walk, or not).
        #[test]
        fn range_from_matches_range(exts in prop::collection::vec(ext_strategy(), 1..2000), queries in prop::collection::vec((0u64..200_000, 0u64..300), 1..80), sorted in any::<bool>()) {
            let mut m = ExtentMap::new();
            m.splice(0, 0, exts);
            let len = m.len();
            let mut qs: Vec<(u64, u64)> = queries.into_iter().map(|(a, l)| (a % (len + 1), l)).collect();
            if sorted {
                qs.sort();
            }
            let mut cur = RangeCursor::default();
            for (a, l) in qs {
                prop_assert_eq!(m.range_from(&mut cur, a, a + l), m.range(a, a + l), "[{}, {})", a, a + l);
            }
        }
    }

    #[test]
    fn range_reads_subextents() {
        let mut m = ExtentMap::new();
        m.splice(0, 0, vec![Extent::chunk(1, 0, 100), Extent::hole(50), Extent::chunk(2, 10, 100)]);
        let r = m.range(90, 170);
        assert_eq!(r, vec![(90, Extent::chunk(1, 90, 10)), (100, Extent::hole(50)), (150, Extent::chunk(2, 10, 20))]);
    }

    #[test]
    fn big_map_splice_touches_one_page() {
        let mut m = ExtentMap::new();
        let ex: Vec<Extent> = (0..20_000u64).map(|i| Extent::chunk(i + 1, 0, 1 << 20)).collect();
        m.splice(0, 0, ex);
        m.take_changes();
        let mid = m.len() / 2 + 12345;
        m.splice(mid, mid, vec![Extent::chunk(999_999, 0, 4096)]);
        let ch = m.take_changes();
        assert!(ch.upserts.len() <= 2, "{} pages rewritten", ch.upserts.len());
        assert_eq!(m.len(), 20_000u64 * (1 << 20) + 4096);
    }
}
