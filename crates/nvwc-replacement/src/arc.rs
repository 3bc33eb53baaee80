//! ARC: Adaptive Replacement Cache (Megiddo & Modha, FAST'03), adapted to an
//! engine that decides *when* to evict and only asks *which* clean block.
//!
//! Resident blocks are in T1 (seen once recently) or T2 (seen at least twice);
//! each of T1/T2 is kept as two timestamp-ordered lists, clean and dirty, so the
//! LRU clean block and the LRU dirty block of either list are O(1) to find
//! while the relative LRU order within T1 (or T2) is preserved. Ghost lists B1/B2
//! hold the lbns of blocks evicted from T1/T2 (a hash map plus an intrusive LRU
//! list in a slab). The target size `p` of T1 adapts on ghost hits exactly as in
//! ARC: `p += max(1, |B2|/|B1|)` on a B1 hit, `p -= max(1, |B1|/|B2|)` on a B2 hit.
//!
//! Adaptations to the [`Replacement`] interface:
//! * `victim_clean` does not know the incoming block, so ARC's
//!   `REPLACE(x, p)` rule "evict from T1 iff |T1| > p, or |T1| = p and x ∈ B2"
//!   is reduced to "prefer T1 iff |T1| > p". In the chosen list it returns the
//!   LRU clean unpinned block; if none, the other list's.
//! * A ghost is created only when a block returned by `victim_clean` is later
//!   removed (an eviction); other removals (trim, invalidate) leave no ghost.
//! * Ghost bookkeeping follows ARC's case IV on inserts of unseen blocks
//!   (`|T1|+|B1| >= c` drops B1's LRU, else a full directory of `2c` drops B2's
//!   LRU), and ghosts are additionally capped at `c` entries in total.
//! * `clean_batch` destages dirty blocks from the LRU end of T1, then of T2.

use std::collections::HashMap;

use nvwc_mrc::MixBuildHasher;

use crate::lists::{TsLists, NIL};
use crate::{BlockId, Replacement};

const T1C: usize = 0;
const T1D: usize = 1;
const T2C: usize = 2;
const T2D: usize = 3;
const B1: usize = 0;
const B2: usize = 1;

#[derive(Clone, Copy, Debug)]
struct Ghost {
    lbn: u64,
    newer: u32,
    older: u32,
    list: u8,
}

/// Ghost lists B1 and B2: lbn -> slab slot, slots linked MRU..LRU per list.
#[derive(Clone, Debug, Default)]
struct Ghosts {
    map: HashMap<u64, u32, MixBuildHasher>,
    nodes: Vec<Ghost>,
    free: Vec<u32>,
    mru: [u32; 2],
    lru: [u32; 2],
    len: [usize; 2],
}

impl Ghosts {
    fn new() -> Self {
        Ghosts {
            mru: [NIL; 2],
            lru: [NIL; 2],
            ..Default::default()
        }
    }

    fn find(&self, lbn: u64) -> Option<usize> {
        self.map
            .get(&lbn)
            .map(|&s| self.nodes[s as usize].list as usize)
    }

    fn push(&mut self, l: usize, lbn: u64) {
        if self.map.contains_key(&lbn) {
            self.remove(lbn);
        }
        let node = Ghost {
            lbn,
            newer: NIL,
            older: self.mru[l],
            list: l as u8,
        };
        let s = match self.free.pop() {
            Some(s) => {
                self.nodes[s as usize] = node;
                s
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        if self.mru[l] != NIL {
            self.nodes[self.mru[l] as usize].newer = s;
        } else {
            self.lru[l] = s;
        }
        self.mru[l] = s;
        self.len[l] += 1;
        self.map.insert(lbn, s);
    }

    fn remove(&mut self, lbn: u64) -> Option<usize> {
        let s = self.map.remove(&lbn)?;
        let Ghost {
            newer, older, list, ..
        } = self.nodes[s as usize];
        let l = list as usize;
        if newer == NIL {
            self.mru[l] = older;
        } else {
            self.nodes[newer as usize].older = older;
        }
        if older == NIL {
            self.lru[l] = newer;
        } else {
            self.nodes[older as usize].newer = newer;
        }
        self.len[l] -= 1;
        self.free.push(s);
        Some(l)
    }

    fn pop_lru(&mut self, l: usize) -> Option<u64> {
        let s = self.lru[l];
        if s == NIL {
            return None;
        }
        let lbn = self.nodes[s as usize].lbn;
        self.remove(lbn);
        Some(lbn)
    }

    fn mem_bytes(&self) -> usize {
        self.map.capacity() * (std::mem::size_of::<(u64, u32)>() + 1)
            + self.nodes.capacity() * std::mem::size_of::<Ghost>()
            + self.free.capacity() * 4
    }
}

/// Adaptive Replacement Cache.
#[derive(Clone, Debug)]
pub struct Arc {
    c: usize,
    p: f64,
    lists: TsLists,
    lbn: Vec<u64>,
    /// Bitset: block was returned by `victim_clean` and not re-referenced since.
    offered: Vec<u64>,
    ghosts: Ghosts,
}

impl Arc {
    /// A policy for a cache of `capacity_blocks` blocks (ids `0..capacity_blocks`).
    pub fn new(capacity_blocks: usize) -> Self {
        assert!(capacity_blocks >= 1, "capacity must be at least 1 block");
        Arc {
            c: capacity_blocks,
            p: 0.0,
            // The dirty lists hide blocks being written back (`set_writeback`).
            lists: TsLists::new(capacity_blocks, 4, (1 << T1D) | (1 << T2D)),
            lbn: vec![0; capacity_blocks],
            offered: vec![0; capacity_blocks.div_ceil(64)],
            ghosts: Ghosts::new(),
        }
    }

    /// Current target size of T1, in `[0, c]`.
    pub fn p(&self) -> f64 {
        self.p
    }

    /// `(|T1|, |T2|, |B1|, |B2|)`.
    pub fn sizes(&self) -> (usize, usize, usize, usize) {
        (
            self.t1_len(),
            self.t2_len(),
            self.ghosts.len[B1],
            self.ghosts.len[B2],
        )
    }

    /// `Some(true)` if `id` is resident in T2, `Some(false)` if in T1, `None` if untracked.
    pub fn in_t2(&self, id: BlockId) -> Option<bool> {
        self.lists.list_of(id).map(|l| l >= T2C)
    }

    fn t1_len(&self) -> usize {
        self.lists.len(T1C) + self.lists.len(T1D)
    }

    fn t2_len(&self) -> usize {
        self.lists.len(T2C) + self.lists.len(T2D)
    }

    fn list_of(&self, id: BlockId) -> usize {
        match self.lists.list_of(id) {
            Some(l) => l,
            None => panic!("BlockId {} is not tracked", id.0),
        }
    }

    fn set_offered(&mut self, id: BlockId, on: bool) {
        let i = id.0 as usize;
        if on {
            self.offered[i >> 6] |= 1 << (i & 63);
        } else {
            self.offered[i >> 6] &= !(1 << (i & 63));
        }
    }

    fn is_offered(&self, id: BlockId) -> bool {
        let i = id.0 as usize;
        self.offered[i >> 6] & (1 << (i & 63)) != 0
    }

    fn cap_ghosts(&mut self) {
        while self.t1_len() + self.ghosts.len[B1] > self.c && self.ghosts.pop_lru(B1).is_some() {}
        while self.ghosts.len[B1] + self.ghosts.len[B2] > self.c {
            let l = if self.ghosts.len[B2] > 0 { B2 } else { B1 };
            self.ghosts.pop_lru(l);
        }
    }

    /// Debug check of ARC's size invariants (tests).
    #[cfg(test)]
    fn check(&self) {
        self.lists.check();
        assert!(self.t1_len() + self.t2_len() <= self.c);
        assert!(self.ghosts.len[B1] + self.ghosts.len[B2] <= self.c);
        assert!((0.0..=self.c as f64).contains(&self.p));
        assert_eq!(
            self.ghosts.map.len(),
            self.ghosts.len[B1] + self.ghosts.len[B2]
        );
    }
}

impl Replacement for Arc {
    fn name(&self) -> &'static str {
        "arc"
    }

    fn insert(&mut self, id: BlockId, lbn: u64, dirty: bool) {
        let i = self.lists.idx(id);
        let (b1, b2) = (self.ghosts.len[B1] as f64, self.ghosts.len[B2] as f64);
        let c = self.c as f64;
        let target = match self.ghosts.find(lbn) {
            Some(B1) => {
                self.p = (self.p + (b2 / b1).max(1.0)).min(c);
                self.ghosts.remove(lbn);
                T2C
            }
            Some(_) => {
                self.p = (self.p - (b1 / b2).max(1.0)).max(0.0);
                self.ghosts.remove(lbn);
                T2C
            }
            None => {
                let l1 = self.t1_len() + self.ghosts.len[B1];
                let total = l1 + self.t2_len() + self.ghosts.len[B2];
                if l1 >= self.c {
                    self.ghosts.pop_lru(B1);
                } else if total >= 2 * self.c {
                    self.ghosts.pop_lru(B2);
                }
                T1C
            }
        };
        self.lbn[i] = lbn;
        self.set_offered(id, false);
        self.lists.push_mru(id, target + dirty as usize);
    }

    fn touch(&mut self, id: BlockId, _write: bool) {
        let l = self.list_of(id);
        let dirty = l == T1D || l == T2D;
        self.set_offered(id, false);
        self.lists.touch(id, T2C + dirty as usize);
    }

    fn set_dirty(&mut self, id: BlockId, dirty: bool) {
        let l = self.list_of(id);
        let was_dirty = l == T1D || l == T2D;
        assert_ne!(
            was_dirty, dirty,
            "set_dirty({}, {dirty}) without a state change",
            id.0
        );
        let base = if l < T2C { T1C } else { T2C };
        self.lists.move_sorted(id, base + dirty as usize);
    }

    fn remove(&mut self, id: BlockId) {
        let l = self.list_of(id);
        self.lists.remove(id);
        if self.is_offered(id) {
            self.set_offered(id, false);
            self.ghosts
                .push(if l < T2C { B1 } else { B2 }, self.lbn[id.0 as usize]);
            self.cap_ghosts();
        }
    }

    fn victim_clean(&mut self, pinned: &dyn Fn(BlockId) -> bool) -> Option<BlockId> {
        let (first, second) = if self.t1_len() as f64 > self.p {
            (T1C, T2C)
        } else {
            (T2C, T1C)
        };
        let v = self
            .lists
            .iter_lru(first)
            .find(|&id| !pinned(id))
            .or_else(|| self.lists.iter_lru(second).find(|&id| !pinned(id)))?;
        self.set_offered(v, true);
        Some(v)
    }

    fn set_writeback(&mut self, id: BlockId, on: bool) {
        self.lists.hold(id, on);
    }

    fn clean_batch(&mut self, max: usize, busy: &dyn Fn(BlockId) -> bool, out: &mut Vec<BlockId>) {
        out.extend(
            self.lists
                .iter_lru(T1D)
                .chain(self.lists.iter_lru(T2D))
                .filter(|&id| !busy(id))
                .take(max),
        );
    }

    fn mem_bytes(&self) -> usize {
        self.lists.mem_bytes()
            + self.lbn.capacity() * 8
            + self.offered.capacity() * 8
            + self.ghosts.mem_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{fill, none};

    /// Fills a cache of `c` blocks with lbns `0..c`, then evicts `k` victims.
    fn fill_and_evict(p: &mut Arc, c: u32, k: usize) -> Vec<(BlockId, u64)> {
        fill(p, c, 0, false);
        (0..k)
            .map(|_| {
                let v = p.victim_clean(&none).unwrap();
                let lbn = p.lbn[v.0 as usize];
                p.remove(v);
                (v, lbn)
            })
            .collect()
    }

    #[test]
    fn b1_hit_grows_p_and_b2_hit_shrinks_it() {
        let mut p = Arc::new(4);
        let ev = fill_and_evict(&mut p, 4, 2);
        // All in T1, p = 0: T1 is the victim list, LRU first.
        assert_eq!(ev.iter().map(|e| e.1).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(p.sizes(), (2, 0, 2, 0));
        // Re-insert lbn 0: B1 hit, p += max(1, 0/2) = 1, block goes to T2.
        p.insert(ev[0].0, 0, false);
        assert_eq!(p.p(), 1.0);
        assert_eq!(p.sizes(), (2, 1, 1, 0));
        p.check();
        // Build a B2 ghost: make a T2-only victim by pinning T1 blocks.
        let t2_block = ev[0].0;
        let in_t1 = |b: BlockId| b != t2_block;
        // |T1| = 2 > p = 1, so T1 is preferred, but its blocks are pinned: fall back to T2.
        let v = p.victim_clean(&in_t1).unwrap();
        assert_eq!(v, t2_block);
        p.remove(v);
        assert_eq!(p.sizes(), (2, 0, 1, 1));
        p.insert(v, 0, false); // B2 hit: p -= max(1, 1/1) = 1
        assert_eq!(p.p(), 0.0);
        assert_eq!(p.sizes(), (2, 1, 1, 0));
        p.check();
    }

    #[test]
    fn victim_prefers_t2_when_t1_is_small() {
        let mut p = Arc::new(4);
        let ev = fill_and_evict(&mut p, 4, 1);
        p.insert(ev[0].0, ev[0].1, false); // B1 hit: p = 1, lbn 0 in T2
        p.touch(BlockId(1), false); // T2 gets lbn 1 as well
        p.touch(BlockId(2), false);
        // T1 = {3}, |T1| = 1 <= p = 1: the victim comes from T2's LRU end.
        let v = p.victim_clean(&none).unwrap();
        assert!(p.lists.list_of(v).unwrap() >= T2C);
        assert_eq!(p.lbn[v.0 as usize], 0);
    }

    #[test]
    fn blocks_under_writeback_leave_both_dirty_walks() {
        let mut p = Arc::new(8);
        fill(&mut p, 6, 10, true);
        p.touch(BlockId(1), true);
        p.touch(BlockId(4), true);
        // T1D = 0 2 3 5, T2D = 1 4.
        let marked = |b: BlockId| b == BlockId(2) || b == BlockId(1);
        let mut asked = Vec::new();
        p.clean_batch(8, &marked, &mut asked);
        p.set_writeback(BlockId(2), true);
        p.set_writeback(BlockId(1), true);
        let mut out = Vec::new();
        p.clean_batch(
            8,
            &|b| {
                assert!(!marked(b), "marked block {} visited", b.0);
                false
            },
            &mut out,
        );
        assert_eq!(out, asked);
        assert_eq!(out, vec![BlockId(0), BlockId(3), BlockId(5), BlockId(4)]);
        // Sizes (and so `p`'s adaptation) count marked blocks.
        assert_eq!(p.sizes(), (4, 2, 0, 0));
        p.set_writeback(BlockId(1), false);
        out.clear();
        p.clean_batch(8, &|b| b == BlockId(2), &mut out);
        assert_eq!(
            out,
            vec![BlockId(0), BlockId(3), BlockId(5), BlockId(1), BlockId(4)]
        );
        p.check();
    }

    #[test]
    fn skips_dirty_and_trim_leaves_no_ghost() {
        let mut p = Arc::new(4);
        p.insert(BlockId(0), 10, true);
        p.insert(BlockId(1), 11, false);
        assert_eq!(p.victim_clean(&none), Some(BlockId(1)));
        p.remove(BlockId(0)); // never offered: a trim
        assert_eq!(p.sizes(), (1, 0, 0, 0));
        let mut out = Vec::new();
        p.clean_batch(4, &none, &mut out);
        assert!(out.is_empty());
        p.insert(BlockId(0), 12, true);
        p.touch(BlockId(0), true);
        p.insert(BlockId(2), 13, true);
        p.clean_batch(4, &none, &mut out);
        assert_eq!(
            out,
            vec![BlockId(2), BlockId(0)],
            "T1 dirty before T2 dirty"
        );
    }

    #[test]
    fn ghosts_stay_bounded() {
        let mut p = Arc::new(8);
        fill(&mut p, 8, 0, false);
        for lbn in 8..1000u64 {
            let v = p.victim_clean(&none).unwrap();
            p.remove(v);
            p.insert(v, lbn, false);
            p.check();
        }
        let (t1, t2, b1, b2) = p.sizes();
        assert_eq!(t1 + t2, 8);
        assert!(b1 + b2 <= 8);
    }
}
