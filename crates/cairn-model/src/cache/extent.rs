//! Which bytes of an object a cache miss fetches (docs/frugal.md §6),
//! shared by the engine's disk cache and the simulator so that the two
//! fetch exactly the same ranges.
//!
//! An object's cached bytes are *extents*: ranges that never overlap, each
//! fetched (or written) at once and evicted whole. A read of `[off, end)`
//! reads the extents it overlaps and fetches the *gaps*, the parts of the
//! range no extent holds and no other reader is fetching:
//!
//! - a gap is rounded out to multiples of `align` (0: not at all), but
//!   never into a neighbouring extent, a range being fetched, or past the
//!   object's end;
//! - two gaps whose distance is at most `merge_below` bytes go in one
//!   ranged GET, the bytes between them downloaded and dropped: a GET
//!   costs what that much transfer does ([`merge_below`]);
//! - a gap that starts where the object's last GET ended (within
//!   `merge_below`), that GET having been for another file, is a reader
//!   going through the object's files in order (a scan of files flushed
//!   together, which lie next to each other in a pack): it is extended by
//!   `ahead` bytes, so the files after it come in the same GET. The
//!   caller says where that GET ended only when it was for another file
//!   ([`continuing`]): within one file, the engine's own read-ahead asks
//!   for the runs ahead. A random reader's gap starts anywhere and is
//!   fetched exactly;
//! - each gap becomes one extent. Extents are never merged nor split.

use std::collections::BTreeMap;

/// `[start, end)` of an object.
pub type Span = (u64, u64);

/// How a cache rounds and groups what it fetches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FetchRules {
    /// Gaps are rounded out to multiples of this (0 or 1: exact).
    pub align: u64,
    /// Gaps at most this far apart share one GET.
    pub merge_below: u64,
    /// A gap continuing the object's last GET is extended by this much.
    pub ahead: u64,
}

/// The bytes of transfer that cost what one GET does, at a GET price and
/// a download price per 2^30 bytes (AWS: $0.0004 per 1,000 GETs, $0.09
/// per GB: 4,772 bytes). Two gaps closer than this are cheaper in one GET.
pub fn merge_below(get_per_1000: f64, transfer_down_per_gb: f64) -> u64 {
    if transfer_down_per_gb <= 0.0 {
        return u64::MAX;
    }
    let bytes = get_per_1000 / 1000.0 / transfer_down_per_gb * (1u64 << 30) as f64;
    if bytes.is_finite() && bytes > 0.0 {
        bytes.min(u64::MAX as f64) as u64
    } else {
        0
    }
}

/// One ranged GET: the range requested, and the extents (disjoint, in
/// order, inside it) it creates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Get {
    pub range: Span,
    pub extents: Vec<Span>,
}

/// How a read is served.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FetchPlan {
    /// Starts of the held extents the read overlaps, in order.
    pub cached: Vec<u64>,
    /// Part of the read is being fetched by someone else: wait for it.
    pub waiting: bool,
    /// What to fetch, in order.
    pub gets: Vec<Get>,
}

/// The spans of `map` (start → value, `end_of` its end; disjoint) that
/// overlap `[off, end)`, in order.
fn overlapping<'a, V>(map: &'a BTreeMap<u64, V>, end_of: &'a impl Fn(&V) -> u64, off: u64, end: u64) -> impl Iterator<Item = Span> + 'a {
    let before = map.range(..off).next_back().map(|(s, v)| (*s, end_of(v))).filter(|&(_, e)| e > off);
    before.into_iter().chain(map.range(off..end).map(move |(s, v)| (*s, end_of(v))))
}

/// The end of the last span of `map` that starts before `at` (0 if none).
fn end_before<V>(map: &BTreeMap<u64, V>, end_of: &impl Fn(&V) -> u64, at: u64) -> u64 {
    map.range(..at).next_back().map_or(0, |(_, v)| end_of(v))
}

/// The start of the first span of `map` that starts at or after `at`.
fn start_from<V>(map: &BTreeMap<u64, V>, at: u64) -> Option<u64> {
    map.range(at..).next().map(|(s, _)| *s)
}

/// Where the object's last GET ended, if it was for another file than
/// this read's: `last` is that GET's (end, file), `group` this read's file
/// (0: unknown, which never continues anything).
pub fn continuing(last: Option<(u64, u64)>, group: u64) -> Option<u64> {
    last.filter(|&(_, g)| g != 0 && group != 0 && g != group).map(|(e, _)| e)
}

/// Plans a read of `[off, end)` of an object of `size` bytes (`end` ≤
/// `size`), given its held extents (`held`, start → value, `held_end` the
/// value's end), the ranges others are fetching (`busy`, start → end) and
/// where the object's last GET for another file ended (`last_end`,
/// [`continuing`]). Both maps hold disjoint spans.
#[allow(clippy::too_many_arguments)]
pub fn plan<V>(held: &BTreeMap<u64, V>, held_end: impl Fn(&V) -> u64, busy: &BTreeMap<u64, u64>, last_end: Option<u64>, off: u64, end: u64, size: u64, rules: FetchRules) -> FetchPlan {
    let mut p = FetchPlan::default();
    if off >= end {
        return p;
    }
    let busy_end = |e: &u64| *e;
    // Everything taken inside the read, in order: held and busy spans.
    let mut taken: Vec<Span> = Vec::new();
    for (s, e) in overlapping(held, &held_end, off, end) {
        p.cached.push(s);
        taken.push((s, e));
    }
    for span in overlapping(busy, &busy_end, off, end) {
        p.waiting = true;
        taken.push(span);
    }
    taken.sort_unstable();
    let mut gaps: Vec<Span> = Vec::new();
    let mut at = off;
    for (s, e) in taken {
        if s > at {
            gaps.push((at, s.min(end)));
        }
        at = at.max(e);
    }
    if at < end {
        gaps.push((at, end));
    }
    // Round each gap out, stopping at whatever is taken on either side.
    let align = rules.align.max(1);
    for g in &mut gaps {
        let floor = end_before(held, &held_end, g.0 + 1).max(end_before(busy, &busy_end, g.0 + 1));
        let floor = if floor > g.0 { g.0 } else { floor };
        let ceil = [start_from(held, g.1), start_from(busy, g.1), Some(size.max(g.1))].into_iter().flatten().min().unwrap_or(g.1);
        let in_order = rules.ahead > 0 && last_end.is_some_and(|l| g.0 >= l && g.0 - l <= rules.merge_below);
        g.0 = (g.0 - g.0 % align).max(floor);
        let want = if in_order { g.1.saturating_add(rules.ahead) } else { g.1 };
        g.1 = want.div_ceil(align).saturating_mul(align).min(ceil).max(g.1);
    }
    for g in gaps {
        match p.gets.last_mut() {
            Some(last) if g.0 - last.range.1 <= rules.merge_below => {
                last.range.1 = g.1;
                last.extents.push(g);
            }
            _ => p.gets.push(Get { range: g, extents: vec![g] }),
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn held(spans: &[Span]) -> BTreeMap<u64, u64> {
        spans.iter().copied().collect()
    }

    fn exact() -> FetchRules {
        FetchRules { align: 0, merge_below: 0, ahead: 0 }
    }

    #[test]
    fn a_cold_read_fetches_exactly_what_it_asks() {
        let p = plan(&held(&[]), |e| *e, &BTreeMap::new(), None, 100, 300, 1000, exact());
        assert_eq!(p, FetchPlan { cached: vec![], waiting: false, gets: vec![Get { range: (100, 300), extents: vec![(100, 300)] }] });
    }

    #[test]
    fn held_extents_are_read_and_the_gaps_fetched() {
        // Held [0,50) [120,200) [250,260); read [40, 300).
        let h = held(&[(0, 50), (120, 200), (250, 260)]);
        let p = plan(&h, |e| *e, &BTreeMap::new(), None, 40, 300, 1000, exact());
        assert_eq!(p.cached, vec![0, 120, 250]);
        let ext: Vec<Span> = p.gets.iter().flat_map(|g| g.extents.clone()).collect();
        assert_eq!(ext, vec![(50, 120), (200, 250), (260, 300)]);
        assert_eq!(p.gets.len(), 3);
        // With holes of up to 50 bytes merged: one GET over [50, 300),
        // the held bytes between downloaded again but not kept twice.
        let p = plan(&h, |e| *e, &BTreeMap::new(), None, 40, 300, 1000, FetchRules { align: 0, merge_below: 80, ahead: 0 });
        assert_eq!(p.gets, vec![Get { range: (50, 300), extents: vec![(50, 120), (200, 250), (260, 300)] }]);
    }

    #[test]
    fn alignment_rounds_out_but_not_into_neighbours_or_past_the_end() {
        let h = held(&[(0, 70)]);
        let busy: BTreeMap<u64, u64> = [(300, 350)].into_iter().collect();
        // [80, 90) rounds to [64, 128) but stops at the held extent's end.
        let p = plan(&h, |e| *e, &busy, None, 80, 90, 1000, FetchRules { align: 64, merge_below: 0, ahead: 0 });
        assert_eq!(p.gets[0].range, (70, 128));
        // [260, 280) rounds to [256, 320) but stops where the busy range starts.
        let p = plan(&h, |e| *e, &busy, None, 260, 280, 1000, FetchRules { align: 64, merge_below: 0, ahead: 0 });
        assert_eq!(p.gets[0].range, (256, 300));
        assert!(!p.waiting);
        // Near the end of a 990-byte object.
        let p = plan(&h, |e| *e, &busy, None, 970, 980, 990, FetchRules { align: 64, merge_below: 0, ahead: 0 });
        assert_eq!(p.gets[0].range, (960, 990));
        // A read overlapping the busy range waits for it, fetching the rest.
        let p = plan(&h, |e| *e, &busy, None, 340, 400, 1000, FetchRules { align: 64, merge_below: 0, ahead: 0 });
        assert!(p.waiting);
        assert_eq!(p.gets[0].range, (350, 448));
    }

    #[test]
    fn a_gap_continuing_the_last_get_reads_ahead() {
        let rules = FetchRules { align: 0, merge_below: 10, ahead: 1000 };
        let h = held(&[(0, 100)]);
        // The last GET ended at 100; a read at 105 (a blob header apart)
        // reads 1,000 bytes more, up to the object's end or the next held
        // extent.
        let p = plan(&h, |e| *e, &BTreeMap::new(), Some(100), 105, 200, 5000, rules);
        assert_eq!(p.gets[0].range, (105, 1200));
        let p = plan(&h, |e| *e, &BTreeMap::new(), Some(100), 105, 200, 600, rules);
        assert_eq!(p.gets[0].range, (105, 600));
        let h2 = held(&[(0, 100), (700, 800)]);
        let p = plan(&h2, |e| *e, &BTreeMap::new(), Some(100), 105, 200, 5000, rules);
        assert_eq!(p.gets[0].range, (105, 700));
        // Elsewhere, or with no GET before: exactly what is asked.
        let p = plan(&h, |e| *e, &BTreeMap::new(), Some(100), 300, 400, 5000, rules);
        assert_eq!(p.gets[0].range, (300, 400));
        let p = plan(&h, |e| *e, &BTreeMap::new(), None, 105, 200, 5000, rules);
        assert_eq!(p.gets[0].range, (105, 200));
    }

    #[test]
    fn only_a_get_for_another_file_is_continued() {
        assert_eq!(continuing(Some((100, 7)), 8), Some(100));
        assert_eq!(continuing(Some((100, 7)), 7), None, "the same file: its own read-ahead");
        assert_eq!(continuing(Some((100, 0)), 8), None);
        assert_eq!(continuing(Some((100, 7)), 0), None);
        assert_eq!(continuing(None, 8), None);
    }

    #[test]
    fn the_merge_distance_is_a_gets_worth_of_transfer() {
        // AWS: $0.0004 per 1,000 GETs, $0.09 per GB.
        assert_eq!(merge_below(0.0004, 0.09), 4772);
        assert_eq!(merge_below(0.0004, 0.0), u64::MAX);
        assert_eq!(merge_below(0.0, 0.09), 0);
    }

    proptest! {
        /// Against a byte map: fetched extents are disjoint from what is
        /// held and busy and from each other, lie within the object, and
        /// with what is held and busy cover the read; each GET's range
        /// holds its extents.
        #[test]
        fn plans_cover_reads_without_overlap(
            spans in proptest::collection::vec((0u64..400, 1u64..60, any::<bool>()), 0..12),
            off in 0u64..500, len in 0u64..200, align in 0u64..100, merge in 0u64..50,
            ahead in 0u64..100, last in proptest::option::of(0u64..500),
        ) {
            let size = 500u64;
            let end = (off + len).min(size);
            let mut owner = vec![0u8; size as usize];
            let (mut h, mut b) = (BTreeMap::new(), BTreeMap::new());
            for (s, l, is_busy) in spans {
                let e = (s + l).min(size);
                if owner[s as usize..e as usize].iter().any(|&x| x != 0) {
                    continue;
                }
                owner[s as usize..e as usize].fill(if is_busy { 2 } else { 1 });
                if is_busy { b.insert(s, e); } else { h.insert(s, e); }
            }
            let p = plan(&h, |e| *e, &b, last, off, end, size, FetchRules { align, merge_below: merge, ahead });
            for g in &p.gets {
                for &(s, e) in &g.extents {
                    prop_assert!(s < e && e <= size && g.range.0 <= s && e <= g.range.1);
                    for x in s..e {
                        prop_assert_eq!(owner[x as usize], 0, "byte {} fetched again", x);
                        owner[x as usize] = 3;
                    }
                }
            }
            for x in off..end {
                prop_assert!(owner[x as usize] != 0, "byte {} of the read not served", x);
            }
            prop_assert_eq!(p.waiting, (off..end).any(|x| b.range(..=x).next_back().is_some_and(|(_, e)| *e > x)));
        }
    }
}
