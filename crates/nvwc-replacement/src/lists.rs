//! Intrusive, timestamp-ordered doubly-linked lists over dense block ids.
//!
//! Each tracked block is in exactly one of a few lists (clean/dirty, T1/T2…).
//! Every list is kept sorted by the block's last-access timestamp, MRU at the
//! head, so moving a block between lists (e.g. when it is cleaned) can put it
//! where true LRU order says it belongs instead of at the MRU end. The sorted
//! insert walks from both ends at once, so it costs `O(min(distance from MRU,
//! distance from LRU))`; cleaned blocks are usually old and dirtied blocks
//! usually just written, so both are near an end in practice.
//!
//! Per-block state: 4 + 4 + 4 + 1 = 13 bytes (links, timestamp, list tag).

use crate::BlockId;

pub(crate) const NIL: u32 = u32::MAX;
const UNTRACKED: u8 = u8::MAX;

#[derive(Clone, Debug)]
pub(crate) struct TsLists {
    newer: Vec<u32>,
    older: Vec<u32>,
    ts: Vec<u32>,
    list: Vec<u8>,
    mru: Vec<u32>,
    lru: Vec<u32>,
    len: Vec<usize>,
    clock: u32,
}

impl TsLists {
    /// `nlists` lists over ids `0..capacity`.
    pub(crate) fn new(capacity: usize, nlists: usize) -> Self {
        assert!(nlists < UNTRACKED as usize);
        assert!(capacity < NIL as usize, "capacity must fit u32 ids");
        TsLists {
            newer: vec![NIL; capacity],
            older: vec![NIL; capacity],
            ts: vec![0; capacity],
            list: vec![UNTRACKED; capacity],
            mru: vec![NIL; nlists],
            lru: vec![NIL; nlists],
            len: vec![0; nlists],
            clock: 0,
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.list.len()
    }

    /// Asserts `id` is a valid id and returns it as an index.
    #[inline]
    pub(crate) fn idx(&self, id: BlockId) -> usize {
        let i = id.0 as usize;
        assert!(i < self.list.len(), "BlockId {} out of range (capacity {})", id.0, self.list.len());
        i
    }

    /// The list holding `id`, or `None` if untracked.
    #[inline]
    pub(crate) fn list_of(&self, id: BlockId) -> Option<usize> {
        let l = self.list[self.idx(id)];
        (l != UNTRACKED).then_some(l as usize)
    }

    #[inline]
    pub(crate) fn len(&self, l: usize) -> usize {
        self.len[l]
    }

    /// Least recently used member of list `l`.
    #[inline]
    pub(crate) fn lru(&self, l: usize) -> Option<BlockId> {
        let i = self.lru[l];
        (i != NIL).then_some(BlockId(i))
    }

    /// The next more recently used block in the same list.
    #[inline]
    pub(crate) fn newer(&self, id: BlockId) -> Option<BlockId> {
        let i = self.newer[id.0 as usize];
        (i != NIL).then_some(BlockId(i))
    }

    /// Iterates list `l` from LRU to MRU.
    pub(crate) fn iter_lru(&self, l: usize) -> impl Iterator<Item = BlockId> + '_ {
        std::iter::successors(self.lru(l), move |&id| self.newer(id))
    }

    fn tick(&mut self) -> u32 {
        if self.clock == u32::MAX {
            self.renumber();
        }
        let t = self.clock;
        self.clock += 1;
        t
    }

    /// Starts tracking `id` (MUST be untracked) at the MRU end of `l`, accessed now.
    pub(crate) fn push_mru(&mut self, id: BlockId, l: usize) {
        let i = self.idx(id);
        assert_eq!(self.list[i], UNTRACKED, "BlockId {} inserted twice", id.0);
        let t = self.tick();
        self.ts[i] = t;
        self.list[i] = l as u8;
        self.link(i as u32, l, NIL, self.mru[l]);
    }

    /// Marks tracked `id` accessed now and moves it to the MRU end of `l`.
    pub(crate) fn touch(&mut self, id: BlockId, l: usize) {
        let i = self.idx(id);
        assert_ne!(self.list[i], UNTRACKED, "BlockId {} not tracked", id.0);
        self.unlink_idx(i);
        let t = self.tick();
        self.ts[i] = t;
        self.list[i] = l as u8;
        self.link(i as u32, l, NIL, self.mru[l]);
    }

    /// Moves tracked `id` to list `l`, at the position its timestamp dictates.
    pub(crate) fn move_sorted(&mut self, id: BlockId, l: usize) {
        let i = self.idx(id);
        assert_ne!(self.list[i], UNTRACKED, "BlockId {} not tracked", id.0);
        self.unlink_idx(i);
        self.list[i] = l as u8;
        let t = self.ts[i];
        let (mut a, mut b) = (self.mru[l], self.lru[l]);
        // `a` walks MRU->LRU looking for the first older block; `b` walks
        // LRU->MRU looking for the first newer one. Whichever finds it first wins.
        let (newer, older) = loop {
            if a == NIL {
                break (self.lru[l], NIL);
            }
            if self.ts[a as usize] < t {
                break (self.newer[a as usize], a);
            }
            a = self.older[a as usize];
            if b == NIL {
                break (NIL, self.mru[l]);
            }
            if self.ts[b as usize] > t {
                break (b, self.older[b as usize]);
            }
            b = self.newer[b as usize];
        };
        self.link(i as u32, l, newer, older);
    }

    /// Stops tracking `id` (MUST be tracked).
    pub(crate) fn remove(&mut self, id: BlockId) {
        let i = self.idx(id);
        assert_ne!(self.list[i], UNTRACKED, "BlockId {} removed but not tracked", id.0);
        self.unlink_idx(i);
        self.list[i] = UNTRACKED;
    }

    fn link(&mut self, i: u32, l: usize, newer: u32, older: u32) {
        let iu = i as usize;
        self.newer[iu] = newer;
        self.older[iu] = older;
        if newer == NIL {
            self.mru[l] = i;
        } else {
            self.older[newer as usize] = i;
        }
        if older == NIL {
            self.lru[l] = i;
        } else {
            self.newer[older as usize] = i;
        }
        self.len[l] += 1;
    }

    fn unlink_idx(&mut self, i: usize) {
        let l = self.list[i] as usize;
        let (n, o) = (self.newer[i], self.older[i]);
        if n == NIL {
            self.mru[l] = o;
        } else {
            self.older[n as usize] = o;
        }
        if o == NIL {
            self.lru[l] = n;
        } else {
            self.newer[o as usize] = n;
        }
        self.newer[i] = NIL;
        self.older[i] = NIL;
        self.len[l] -= 1;
    }

    /// Renumbers timestamps `0..n` in order when the clock would overflow.
    #[cold]
    fn renumber(&mut self) {
        let mut live: Vec<(u32, u32)> = (0..self.list.len())
            .filter(|&i| self.list[i] != UNTRACKED)
            .map(|i| (self.ts[i], i as u32))
            .collect();
        live.sort_unstable();
        for (rank, &(_, i)) in live.iter().enumerate() {
            self.ts[i as usize] = rank as u32;
        }
        self.clock = live.len() as u32;
    }

    #[cfg(test)]
    pub(crate) fn set_clock(&mut self, c: u32) {
        self.clock = c;
    }

    /// Checks links, lengths and timestamp order (tests only; O(n)).
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let mut total = 0;
        for l in 0..self.len.len() {
            let v: Vec<BlockId> = self.iter_lru(l).collect();
            assert_eq!(v.len(), self.len[l]);
            for w in v.windows(2) {
                assert!(self.ts[w[0].0 as usize] < self.ts[w[1].0 as usize], "list {l} out of order");
            }
            for id in &v {
                assert_eq!(self.list[id.0 as usize] as usize, l);
            }
            total += v.len();
        }
        assert_eq!(total, self.list.iter().filter(|&&l| l != UNTRACKED).count());
    }

    pub(crate) fn mem_bytes(&self) -> usize {
        self.newer.capacity() * 4
            + self.older.capacity() * 4
            + self.ts.capacity() * 4
            + self.list.capacity()
            + (self.mru.capacity() + self.lru.capacity()) * 4
            + self.len.capacity() * std::mem::size_of::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: impl Iterator<Item = BlockId>) -> Vec<u32> {
        v.map(|b| b.0).collect()
    }

    #[test]
    fn sorted_move_restores_lru_position() {
        let mut t = TsLists::new(8, 2);
        for i in 0..6 {
            t.push_mru(BlockId(i), 0);
        }
        t.move_sorted(BlockId(1), 1);
        t.move_sorted(BlockId(4), 1);
        t.move_sorted(BlockId(2), 1);
        assert_eq!(ids(t.iter_lru(1)), vec![1, 2, 4]);
        t.touch(BlockId(0), 0);
        assert_eq!(ids(t.iter_lru(0)), vec![3, 5, 0]);
        // Back to list 0: 2 goes between 0's old place (now MRU) and 3.
        t.move_sorted(BlockId(2), 0);
        assert_eq!(ids(t.iter_lru(0)), vec![2, 3, 5, 0]);
        t.move_sorted(BlockId(4), 0);
        assert_eq!(ids(t.iter_lru(0)), vec![2, 3, 4, 5, 0]);
        t.check();
        t.remove(BlockId(3));
        assert_eq!(ids(t.iter_lru(0)), vec![2, 4, 5, 0]);
        assert_eq!(t.list_of(BlockId(3)), None);
        t.check();
    }

    #[test]
    fn clock_overflow_renumbers_in_order() {
        let mut t = TsLists::new(4, 1);
        t.set_clock(u32::MAX - 2);
        t.push_mru(BlockId(0), 0);
        t.push_mru(BlockId(1), 0);
        t.push_mru(BlockId(2), 0); // clock is MAX: renumbers before ticking
        t.touch(BlockId(0), 0);
        assert!(t.clock < 10);
        assert_eq!(ids(t.iter_lru(0)), vec![1, 2, 0]);
        t.check();
    }

    #[test]
    #[should_panic(expected = "inserted twice")]
    fn double_insert_panics() {
        let mut t = TsLists::new(2, 1);
        t.push_mru(BlockId(0), 0);
        t.push_mru(BlockId(0), 0);
    }
}
