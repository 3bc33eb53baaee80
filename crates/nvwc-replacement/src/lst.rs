//! LST: Largest Segment per Track.
//!
//! Dirty blocks are grouped into segments (maximal runs of contiguous dirty
//! lbns within one track of `track_blocks` blocks, see [`crate::segments`]).
//! `clean_batch` destages the largest segment, the least recently written one
//! on ties (segments whose blocks are all busy are skipped). `victim_clean`
//! evicts clean blocks in LRU order (timestamp-ordered intrusive list, as in
//! [`crate::lru::Lru`]). Cleaning starts/stops at the watermarks (the trait's
//! default `should_clean`).

use crate::clean_dirty::{delegate_to_lists, SegmentedLists};
use crate::segments::SegmentInfo;
use crate::{BlockId, Replacement};

/// Largest-segment-per-track cleaning with LRU eviction of clean blocks.
#[derive(Clone, Debug)]
pub struct Lst {
    lists: SegmentedLists,
}

impl Lst {
    /// A policy for block ids `0..capacity_blocks` and tracks of `track_blocks`
    /// blocks (caller guarantees `track_blocks >= 1`).
    pub fn new(capacity_blocks: usize, track_blocks: u64) -> Self {
        Lst {
            lists: SegmentedLists::new(capacity_blocks, track_blocks),
        }
    }

    /// Track size in blocks.
    pub fn track_blocks(&self) -> u64 {
        self.lists.segs.track_blocks()
    }

    /// Current dirty segments, least recently written first.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        self.lists.segs.segments()
    }
}

impl Replacement for Lst {
    fn name(&self) -> &'static str {
        "lst"
    }

    fn insert(&mut self, id: BlockId, lbn: u64, dirty: bool) {
        self.lists.insert(id, lbn, dirty);
    }

    fn touch(&mut self, id: BlockId, write: bool) {
        self.lists.touch(id, write);
    }

    delegate_to_lists!();

    fn clean_batch(&mut self, max: usize, busy: &dyn Fn(BlockId) -> bool, out: &mut Vec<BlockId>) {
        // A hot region of 0 blocks: every segment is a candidate.
        self.lists.segs.clean_batch(0, max, busy, out);
    }

    fn mem_bytes(&self) -> usize {
        self.lists.mem_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{fill, none};

    fn lbns(p: &Lst, v: &[BlockId]) -> Vec<u64> {
        v.iter().map(|&b| p.lists.segs.lbn(b)).collect()
    }

    #[test]
    fn picks_largest_run_and_runs_never_cross_tracks() {
        let mut p = Lst::new(64, 8);
        // Track 0: lbns 5,6,7 ; track 1: lbns 8,9 (contiguous with 7 but another track);
        // track 2: 16..20 but 18 clean -> runs {16,17} and {19}.
        let layout = [
            (5, true),
            (6, true),
            (7, true),
            (8, true),
            (9, true),
            (16, true),
            (17, true),
            (18, false),
            (19, true),
        ];
        for (i, &(l, d)) in layout.iter().enumerate() {
            p.insert(BlockId(i as u32), l, d);
        }
        let mut spans: Vec<_> = p.segments().iter().map(|s| (s.start, s.len)).collect();
        spans.sort();
        assert_eq!(spans, vec![(5, 3), (8, 2), (16, 2), (19, 1)]);
        let mut out = Vec::new();
        p.clean_batch(64, &none, &mut out);
        assert_eq!(lbns(&p, &out), vec![5, 6, 7]);
        // Writing lbn 18 bridges 16..19 into the largest run (4 blocks).
        p.set_dirty(BlockId(7), true);
        out.clear();
        p.clean_batch(64, &none, &mut out);
        assert_eq!(lbns(&p, &out), vec![16, 17, 18, 19]);
        p.lists.segs.check();
    }

    #[test]
    fn ties_go_to_the_least_recently_written() {
        let mut p = Lst::new(16, 64);
        p.insert(BlockId(0), 100, true);
        p.insert(BlockId(1), 101, true);
        p.insert(BlockId(2), 200, true);
        p.insert(BlockId(3), 201, true);
        let mut out = Vec::new();
        p.clean_batch(8, &none, &mut out);
        assert_eq!(lbns(&p, &out), vec![100, 101]);
        p.touch(BlockId(0), true); // run at 100 is now the most recent
        out.clear();
        p.clean_batch(8, &none, &mut out);
        assert_eq!(lbns(&p, &out), vec![200, 201]);
        // A read does not change the segment order.
        p.touch(BlockId(2), false);
        out.clear();
        p.clean_batch(8, &none, &mut out);
        assert_eq!(lbns(&p, &out), vec![200, 201]);
    }

    #[test]
    fn cleaning_splits_and_victims_are_lru_clean() {
        let mut p = Lst::new(16, 64);
        fill(&mut p, 5, 10, true);
        p.insert(BlockId(5), 50, false);
        p.set_dirty(BlockId(2), false); // split 10..15 into {10,11} and {13,14}
        let mut spans: Vec<_> = p.segments().iter().map(|s| (s.start, s.len)).collect();
        spans.sort();
        assert_eq!(spans, vec![(10, 2), (13, 2)]);
        // lbn 12 (id 2) was accessed before id 5: it is the LRU clean block.
        assert_eq!(p.victim_clean(&none), Some(BlockId(2)));
        assert_eq!(p.victim_clean(&|b| b == BlockId(2)), Some(BlockId(5)));
        p.remove(BlockId(3)); // dirty block leaves: {13,14} shrinks to {14}
        let mut spans: Vec<_> = p.segments().iter().map(|s| (s.start, s.len)).collect();
        spans.sort();
        assert_eq!(spans, vec![(10, 2), (14, 1)]);
        p.lists.segs.check();
    }
}
