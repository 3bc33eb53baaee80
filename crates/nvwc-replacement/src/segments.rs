//! Dirty segments for the LST and stack-model policies.
//!
//! A *segment* is a maximal run of contiguous dirty lbns within one track
//! (`track = lbn / track_blocks`). Every dirty block belongs to exactly one
//! segment; segments split when a block in their middle is cleaned or removed
//! and merge when the gap between two of them is written.
//!
//! **Recency.** Each dirty block remembers the time of its last write (a
//! logical clock ticked by every write). A segment's time is the maximum over
//! its blocks, i.e. "last access of any of its blocks"; a merged segment thus
//! takes the most recent time, and each piece of a split keeps the time of its
//! own most recently written block. Because each tick is owned by one block,
//! segment times are unique.
//!
//! **Index.** Segments sit in a segment tree over time slots (the clock values)
//! storing per node the sum of segment sizes and the largest (non-excluded)
//! segment size. This gives, in `O(log n)`:
//! * the hot/cold boundary: the longest run of most recent segments whose
//!   cumulative size fits in `s_knee` (a descent from the newest end);
//! * the largest cold segment, oldest first on ties (leftmost maximum);
//! * the oldest segment.
//!
//! When the clock reaches the end of the slot space, live times are renumbered
//! `0..D` in order (D = dirty blocks) and the space is resized to `~2D`, so
//! memory is `O(dirty blocks)` and the amortised cost stays `O(log D)`.

use std::collections::HashMap;

use nvwc_mrc::MixBuildHasher;

use crate::lists::NIL;
use crate::BlockId;

const MIN_SLOTS: usize = 64;

#[derive(Clone, Copy, Debug)]
struct Seg {
    start: u64,
    len: u32,
    slot: u32,
    excluded: bool,
}

/// A segment as seen from outside (tests, debugging).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    /// First lbn.
    pub start: u64,
    /// Length in blocks.
    pub len: u32,
    /// Recency rank: larger is more recent (comparable within one snapshot only).
    pub time: u32,
}

#[derive(Clone, Debug)]
pub(crate) struct SegmentIndex {
    track_blocks: u64,
    lbn: Vec<u64>,
    seg_of: Vec<u32>,
    wtime: Vec<u32>,
    by_lbn: HashMap<u64, u32, MixBuildHasher>,
    segs: Vec<Seg>,
    free: Vec<u32>,
    slot_seg: Vec<u32>,
    sum: Vec<u32>,
    max: Vec<u32>,
    ns: usize,
    now: usize,
}

impl SegmentIndex {
    pub(crate) fn new(capacity: usize, track_blocks: u64) -> Self {
        assert!(track_blocks >= 1, "track_blocks must be >= 1");
        assert!(track_blocks <= u32::MAX as u64, "track_blocks must fit u32");
        SegmentIndex {
            track_blocks,
            lbn: vec![0; capacity],
            seg_of: vec![NIL; capacity],
            wtime: vec![0; capacity],
            by_lbn: HashMap::with_hasher(MixBuildHasher),
            segs: Vec::new(),
            free: Vec::new(),
            slot_seg: vec![NIL; MIN_SLOTS],
            sum: vec![0; 2 * MIN_SLOTS],
            max: vec![0; 2 * MIN_SLOTS],
            ns: MIN_SLOTS,
            now: 0,
        }
    }

    pub(crate) fn track_blocks(&self) -> u64 {
        self.track_blocks
    }

    /// Records the lbn of a newly tracked block (clean or about to be dirty).
    pub(crate) fn set_lbn(&mut self, id: BlockId, lbn: u64) {
        let i = id.0 as usize;
        debug_assert_eq!(self.seg_of[i], NIL);
        self.lbn[i] = lbn;
    }

    pub(crate) fn lbn(&self, id: BlockId) -> u64 {
        self.lbn[id.0 as usize]
    }

    /// Total dirty blocks in segments.
    pub(crate) fn total(&self) -> u64 {
        u64::from(self.sum[1])
    }

    fn tick(&mut self) -> u32 {
        if self.now == self.ns {
            self.compact();
        }
        self.now += 1;
        (self.now - 1) as u32
    }

    /// Block `i` is written now: records and returns its write time.
    fn stamp_write(&mut self, i: usize) -> u32 {
        let t = self.tick();
        self.wtime[i] = t;
        t
    }

    fn alloc(&mut self, s: Seg) -> u32 {
        match self.free.pop() {
            Some(g) => {
                self.segs[g as usize] = s;
                g
            }
            None => {
                self.segs.push(s);
                assert!(self.segs.len() < NIL as usize);
                (self.segs.len() - 1) as u32
            }
        }
    }

    fn block_at(&self, lbn: u64) -> u32 {
        match self.by_lbn.get(&lbn) {
            Some(&i) => i,
            None => panic!("segment covers lbn {lbn} but no dirty block has it"),
        }
    }

    fn update(&mut self, slot: usize) {
        let g = self.slot_seg[slot];
        let (s, m) = if g == NIL {
            (0, 0)
        } else {
            let seg = &self.segs[g as usize];
            (seg.len, if seg.excluded { 0 } else { seg.len })
        };
        let mut i = slot + self.ns;
        self.sum[i] = s;
        self.max[i] = m;
        i /= 2;
        while i >= 1 {
            self.sum[i] = self.sum[2 * i] + self.sum[2 * i + 1];
            self.max[i] = self.max[2 * i].max(self.max[2 * i + 1]);
            i /= 2;
        }
    }

    fn place_at(&mut self, g: u32, slot: u32) {
        assert_eq!(
            self.slot_seg[slot as usize], NIL,
            "slot {slot} already holds a segment"
        );
        self.segs[g as usize].slot = slot;
        self.slot_seg[slot as usize] = g;
        self.update(slot as usize);
    }

    /// Places `g` at the time of its most recently written block.
    fn place(&mut self, g: u32) {
        let Seg { start, len, .. } = self.segs[g as usize];
        let t = (start..start + u64::from(len))
            .map(|l| self.wtime[self.block_at(l) as usize])
            .max()
            .expect("empty segment");
        self.place_at(g, t);
    }

    fn unplace(&mut self, g: u32) {
        let slot = self.segs[g as usize].slot as usize;
        assert_eq!(self.slot_seg[slot], g, "segment/slot mismatch");
        self.slot_seg[slot] = NIL;
        self.update(slot);
    }

    fn relabel(&mut self, g: u32) {
        let Seg { start, len, .. } = self.segs[g as usize];
        for l in start..start + u64::from(len) {
            let i = self.block_at(l);
            self.seg_of[i as usize] = g;
        }
    }

    #[cfg(test)]
    pub(crate) fn is_dirty(&self, id: BlockId) -> bool {
        self.seg_of[id.0 as usize] != NIL
    }

    /// Block `id` (tracked, clean) becomes dirty now: joins or bridges neighbours.
    pub(crate) fn add_dirty(&mut self, id: BlockId) {
        let i = id.0 as usize;
        assert_eq!(self.seg_of[i], NIL, "block {} already dirty", id.0);
        let t = self.stamp_write(i);
        let l = self.lbn[i];
        if let Some(other) = self.by_lbn.insert(l, i as u32) {
            panic!("blocks {other} and {} both cache lbn {l}", id.0);
        }
        let tb = self.track_blocks;
        let left = if !l.is_multiple_of(tb) {
            self.by_lbn.get(&(l - 1)).map(|&b| self.seg_of[b as usize])
        } else {
            None
        };
        let right = match l.checked_add(1) {
            Some(r) if r % tb != 0 => self.by_lbn.get(&r).map(|&b| self.seg_of[b as usize]),
            _ => None,
        };
        let g = match (left, right) {
            (None, None) => self.alloc(Seg {
                start: l,
                len: 1,
                slot: NIL,
                excluded: false,
            }),
            (Some(a), None) => {
                self.unplace(a);
                self.segs[a as usize].len += 1;
                a
            }
            (None, Some(b)) => {
                self.unplace(b);
                let s = &mut self.segs[b as usize];
                s.start = l;
                s.len += 1;
                b
            }
            (Some(a), Some(b)) => {
                self.unplace(a);
                self.unplace(b);
                let (sa, sb) = (self.segs[a as usize], self.segs[b as usize]);
                let (keep, gone) = if sa.len >= sb.len { (a, b) } else { (b, a) };
                self.segs[keep as usize].start = sa.start;
                self.segs[keep as usize].len = sa.len + 1 + sb.len;
                self.seg_of[i] = keep;
                self.relabel(keep); // covers gone's blocks; O(track) at most
                self.free.push(gone);
                keep
            }
        };
        self.seg_of[i] = g;
        self.place_at(g, t);
    }

    /// Dirty block `id` is written again: its segment becomes the most recent.
    pub(crate) fn rewrite(&mut self, id: BlockId) {
        let i = id.0 as usize;
        assert_ne!(self.seg_of[i], NIL, "block {} is not dirty", id.0);
        let t = self.stamp_write(i);
        let g = self.seg_of[i];
        self.unplace(g);
        self.place_at(g, t);
    }

    /// Dirty block `id` is cleaned or leaves the cache: its segment shrinks or splits.
    pub(crate) fn remove_dirty(&mut self, id: BlockId) {
        let i = id.0 as usize;
        let g = self.seg_of[i];
        assert_ne!(g, NIL, "block {} is not dirty", id.0);
        let l = self.lbn[i];
        self.by_lbn.remove(&l);
        self.seg_of[i] = NIL;
        let Seg {
            start, len, slot, ..
        } = self.segs[g as usize];
        // Unless the removed block was the segment's newest, the segment's
        // time (slot) is unchanged; cleaning a segment block by block then
        // costs O(len) in total instead of O(len^2).
        let was_newest = self.wtime[i] == slot;
        let end = start + u64::from(len);
        let left = (l - start) as u32;
        let right = (end - l - 1) as u32;
        match (left > 0, right > 0) {
            (false, false) => {
                self.unplace(g);
                self.free.push(g);
            }
            (true, true) => {
                self.unplace(g);
                let (lseg, rseg) = ((start, left), (l + 1, right));
                let (keep, moved) = if left >= right {
                    (lseg, rseg)
                } else {
                    (rseg, lseg)
                };
                let s = &mut self.segs[g as usize];
                s.start = keep.0;
                s.len = keep.1;
                let n = self.alloc(Seg {
                    start: moved.0,
                    len: moved.1,
                    slot: NIL,
                    excluded: false,
                });
                self.relabel(n);
                self.place(g);
                self.place(n);
            }
            (true, false) | (false, true) => {
                let s = &mut self.segs[g as usize];
                if left > 0 {
                    s.len = left;
                } else {
                    s.start = l + 1;
                    s.len = right;
                }
                if was_newest {
                    self.unplace(g);
                    self.place(g);
                } else {
                    self.update(slot as usize);
                }
            }
        }
    }

    /// `(b, hot)`: slots `b..` hold the hot segments (the most recent ones whose
    /// cumulative size fits in `knee`), `hot` is their total size. Slots `..b`
    /// are cold. `b == 0` when everything fits.
    pub(crate) fn hot_boundary(&self, knee: u64) -> (usize, u64) {
        let total = self.total();
        if total <= knee {
            return (0, total);
        }
        let (mut node, mut lo, mut hi, mut acc) = (1usize, 0usize, self.ns, 0u64);
        while node < self.ns {
            let mid = (lo + hi) / 2;
            let right = 2 * node + 1;
            if acc + u64::from(self.sum[right]) <= knee {
                acc += u64::from(self.sum[right]);
                node *= 2;
                hi = mid;
            } else {
                node = right;
                lo = mid;
            }
        }
        (lo + 1, acc)
    }

    /// Largest `max` value over slots `..end`.
    fn range_max(&self, end: usize) -> u32 {
        let (mut lo, mut hi) = (self.ns, self.ns + end);
        let mut m = 0;
        while lo < hi {
            if lo & 1 == 1 {
                m = m.max(self.max[lo]);
                lo += 1;
            }
            if hi & 1 == 1 {
                hi -= 1;
                m = m.max(self.max[hi]);
            }
            lo /= 2;
            hi /= 2;
        }
        m
    }

    /// Leftmost slot `< end` whose segment size (non-excluded) is `>= m`.
    fn leftmost_ge(&self, node: usize, lo: usize, hi: usize, end: usize, m: u32) -> Option<usize> {
        if lo >= end || self.max[node] < m {
            return None;
        }
        if hi - lo == 1 {
            return Some(lo);
        }
        let mid = (lo + hi) / 2;
        self.leftmost_ge(2 * node, lo, mid, end, m)
            .or_else(|| self.leftmost_ge(2 * node + 1, mid, hi, end, m))
    }

    /// Appends to `out` up to `max` non-busy blocks (lbn order) of one segment:
    /// the largest cold segment (oldest on ties) for hot region `knee`. Fully
    /// busy segments are skipped. If no cold segment exists at all, the oldest
    /// (hot) segment with a non-busy block is used instead. If cold segments
    /// exist but all are fully busy, nothing is appended.
    pub(crate) fn clean_batch(
        &mut self,
        knee: u64,
        max: usize,
        busy: &dyn Fn(BlockId) -> bool,
        out: &mut Vec<BlockId>,
    ) {
        if max == 0 || self.total() == 0 {
            return;
        }
        let (b, hot) = self.hot_boundary(knee);
        let cold = self.total() > hot;
        let mut excluded = Vec::new();
        loop {
            let cand = if cold {
                match self.range_max(b) {
                    0 => None,
                    m => self.leftmost_ge(1, 0, self.ns, b, m),
                }
            } else {
                self.leftmost_ge(1, 0, self.ns, self.now, 1)
            };
            let Some(slot) = cand else { break };
            let g = self.slot_seg[slot];
            let Seg { start, len, .. } = self.segs[g as usize];
            let before = out.len();
            for l in start..start + u64::from(len) {
                let id = BlockId(self.block_at(l));
                if !busy(id) {
                    out.push(id);
                    if out.len() - before == max {
                        break;
                    }
                }
            }
            if out.len() > before {
                break;
            }
            self.segs[g as usize].excluded = true;
            self.update(slot);
            excluded.push(g);
        }
        for g in excluded {
            self.segs[g as usize].excluded = false;
            let slot = self.segs[g as usize].slot as usize;
            self.update(slot);
        }
    }

    /// Renumbers live write times `0..D` in order and resizes the slot space.
    #[cold]
    fn compact(&mut self) {
        let mut live: Vec<(u32, u32)> = self
            .by_lbn
            .values()
            .map(|&i| (self.wtime[i as usize], i))
            .collect();
        live.sort_unstable();
        let d = live.len();
        let ns = (2 * d).next_power_of_two().max(MIN_SLOTS);
        let mut slot_seg = vec![NIL; ns];
        for (r, &(t, i)) in live.iter().enumerate() {
            let g = self.slot_seg[t as usize];
            if g != NIL {
                slot_seg[r] = g;
                self.segs[g as usize].slot = r as u32;
            }
            self.wtime[i as usize] = r as u32;
        }
        self.slot_seg = slot_seg;
        self.ns = ns;
        self.now = d;
        self.sum = vec![0; 2 * ns];
        self.max = vec![0; 2 * ns];
        for slot in 0..ns {
            let g = self.slot_seg[slot];
            if g != NIL {
                let s = &self.segs[g as usize];
                self.sum[ns + slot] = s.len;
                self.max[ns + slot] = if s.excluded { 0 } else { s.len };
            }
        }
        for i in (1..ns).rev() {
            self.sum[i] = self.sum[2 * i] + self.sum[2 * i + 1];
            self.max[i] = self.max[2 * i].max(self.max[2 * i + 1]);
        }
    }

    /// All segments, oldest first.
    pub(crate) fn segments(&self) -> Vec<SegmentInfo> {
        (0..self.now)
            .filter_map(|slot| {
                let g = self.slot_seg[slot];
                (g != NIL).then(|| {
                    let s = self.segs[g as usize];
                    SegmentInfo {
                        start: s.start,
                        len: s.len,
                        time: slot as u32,
                    }
                })
            })
            .collect()
    }

    /// Full consistency check, O(n). For tests.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let tb = self.track_blocks;
        let mut covered = 0u64;
        for s in self.segments() {
            assert!(s.len >= 1);
            let end = s.start + u64::from(s.len);
            assert_eq!(
                s.start / tb,
                (end - 1) / tb,
                "segment crosses a track boundary"
            );
            if s.start % tb != 0 {
                assert!(
                    !self.by_lbn.contains_key(&(s.start - 1)),
                    "segment not maximal (left)"
                );
            }
            if end % tb != 0 {
                assert!(
                    !self.by_lbn.contains_key(&end),
                    "segment not maximal (right)"
                );
            }
            let g = self.slot_seg[s.time as usize];
            let mut tmax = 0;
            for l in s.start..end {
                let i = self.block_at(l) as usize;
                assert_eq!(self.seg_of[i], g);
                tmax = tmax.max(self.wtime[i]);
            }
            assert_eq!(tmax, s.time, "segment time is not its newest block's");
            covered += u64::from(s.len);
        }
        assert_eq!(covered, self.by_lbn.len() as u64);
        assert_eq!(covered, self.total());
    }

    pub(crate) fn mem_bytes(&self) -> usize {
        self.lbn.capacity() * 8
            + self.seg_of.capacity() * 4
            + self.wtime.capacity() * 4
            + self.by_lbn.capacity() * (std::mem::size_of::<(u64, u32)>() + 1)
            + self.segs.capacity() * std::mem::size_of::<Seg>()
            + self.free.capacity() * 4
            + self.slot_seg.capacity() * 4
            + (self.sum.capacity() + self.max.capacity()) * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ix(n: usize, tb: u64) -> SegmentIndex {
        SegmentIndex::new(n, tb)
    }

    fn dirty(s: &mut SegmentIndex, id: u32, lbn: u64) {
        s.set_lbn(BlockId(id), lbn);
        s.add_dirty(BlockId(id));
    }

    fn spans(s: &SegmentIndex) -> Vec<(u64, u32)> {
        let mut v: Vec<_> = s.segments().iter().map(|x| (x.start, x.len)).collect();
        v.sort();
        v
    }

    #[test]
    fn merge_split_and_track_boundaries() {
        let mut s = ix(16, 4);
        dirty(&mut s, 0, 1);
        dirty(&mut s, 1, 3);
        dirty(&mut s, 2, 4); // next track: no merge with 3
        assert_eq!(spans(&s), vec![(1, 1), (3, 1), (4, 1)]);
        dirty(&mut s, 3, 2); // bridges 1 and 3
        assert_eq!(spans(&s), vec![(1, 3), (4, 1)]);
        s.check();
        s.remove_dirty(BlockId(3)); // split again
        assert_eq!(spans(&s), vec![(1, 1), (3, 1), (4, 1)]);
        s.check();
        // The piece at 3 was written after the piece at 1: it is more recent.
        let seg = s.segments();
        let t = |start| seg.iter().find(|x| x.start == start).unwrap().time;
        assert!(t(3) > t(1));
        assert!(t(4) > t(3));
    }

    #[test]
    fn hot_boundary_and_largest_cold() {
        let mut s = ix(32, 8);
        // Oldest first: track 0 run of 3, track 1 run of 5, track 2 run of 2, track 3 run of 1.
        let mut id = 0;
        for (track, n) in [(0u64, 3u64), (1, 5), (2, 2), (3, 1)] {
            for k in 0..n {
                dirty(&mut s, id, track * 8 + k);
                id += 1;
            }
        }
        s.check();
        assert_eq!(s.total(), 11);
        // knee 3: hot = {1, 2}; cold = {3, 5}; largest cold = track 1.
        let mut out = Vec::new();
        s.clean_batch(3, 100, &|_| false, &mut out);
        assert_eq!(
            out.iter().map(|b| s.lbn(*b)).collect::<Vec<_>>(),
            vec![8, 9, 10, 11, 12]
        );
        // knee 8: hot = {1, 2, 5}; cold = {3}.
        out.clear();
        s.clean_batch(8, 100, &|_| false, &mut out);
        assert_eq!(
            out.iter().map(|b| s.lbn(*b)).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        // knee 11: nothing cold; falls back to the oldest segment.
        out.clear();
        s.clean_batch(11, 2, &|_| false, &mut out);
        assert_eq!(
            out.iter().map(|b| s.lbn(*b)).collect::<Vec<_>>(),
            vec![0, 1]
        );
        // knee 3 with the whole 5-run busy: next largest cold is the 3-run.
        out.clear();
        let busy = |b: BlockId| (3..8).contains(&b.0);
        s.clean_batch(3, 100, &busy, &mut out);
        assert_eq!(
            out.iter().map(|b| s.lbn(*b)).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        // All cold blocks busy: nothing, even though hot blocks are available.
        out.clear();
        s.clean_batch(3, 100, &|b: BlockId| b.0 < 8, &mut out);
        assert!(out.is_empty());
        s.check(); // exclusions were restored
    }

    #[test]
    fn compaction_preserves_order_and_bounds_slots() {
        let mut s = ix(8, 4);
        for (i, l) in [0u64, 1, 5, 9].iter().enumerate() {
            dirty(&mut s, i as u32, *l);
        }
        for round in 0..1000 {
            s.rewrite(BlockId((round % 4) as u32));
            s.check();
        }
        assert!(s.ns <= 64);
        let order: Vec<u64> = s.segments().iter().map(|x| x.start).collect();
        // Last rewrites: ids 0,1,2,3 in that order -> segment (0..2) older than 5, 9.
        assert_eq!(order, vec![0, 5, 9]);
    }
}
