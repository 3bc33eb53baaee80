//! Timestamp-ordered block lists over dense block ids.
//!
//! Each tracked block is in exactly one of a few lists (clean/dirty, T1/T2…)
//! and owns one *slot*: the logical time of its last access. A slot array maps
//! slots back to blocks, and each list is a hierarchical bitset (64-ary) over
//! slots. So:
//! * touching a block takes a fresh slot (O(levels));
//! * moving a block to another list keeps its slot, so it lands exactly where
//!   its last access puts it in true LRU order (O(levels), no list walk);
//! * walking a list from its LRU end is a sequence of find-next-set-bit
//!   queries (O(levels) each; levels = ⌈log64(slots)⌉, 3 for a million slots).
//!
//! The slot space has `2 × capacity` slots (at least 64); when it is used up,
//! live slots are renumbered `0..n` in order (O(slots), at most once per
//! `capacity` accesses). Per-block state: slot (4 B) + list tag (1 B) + two
//! slot-owner entries (8 B) + one bit per slot per list (plus <2% for the
//! upper bitset levels): about 13.5 bytes for two lists.
//!
//! **Held blocks.** A list may be *hiding* (chosen at construction): a block
//! in it that is held ([`TsLists::hold`]) keeps its list, slot and place in
//! the list's length, but its bit is cleared, so [`TsLists::iter_lru`] of that
//! list skips it without visiting it. Policies use this to keep blocks that
//! the engine is writing back out of their destage walks: the walk then sees
//! the other blocks in exactly the order it saw them before. A held block's
//! bit comes back (at its slot, so in LRU order) once it is released or moves
//! to a list that does not hide.

use crate::BlockId;

pub(crate) const NIL: u32 = u32::MAX;
const UNTRACKED: u8 = u8::MAX;

/// A 64-ary hierarchical bitset with find-next-set.
#[derive(Clone, Debug)]
struct Bits {
    /// `levels[0]` has one bit per position; `levels[k+1]` one bit per word of `levels[k]`.
    levels: Vec<Vec<u64>>,
}

impl Bits {
    fn new(n: usize) -> Self {
        let mut levels = Vec::new();
        let mut words = n.div_ceil(64).max(1);
        loop {
            levels.push(vec![0u64; words]);
            if words == 1 {
                break;
            }
            words = words.div_ceil(64);
        }
        Bits { levels }
    }

    fn set(&mut self, mut pos: usize) {
        for level in &mut self.levels {
            let w = &mut level[pos >> 6];
            let was_zero = *w == 0;
            *w |= 1 << (pos & 63);
            if !was_zero {
                return;
            }
            pos >>= 6;
        }
    }

    fn clear(&mut self, mut pos: usize) {
        for level in &mut self.levels {
            let w = &mut level[pos >> 6];
            debug_assert!(*w & (1 << (pos & 63)) != 0, "clearing a clear bit");
            *w &= !(1 << (pos & 63));
            if *w != 0 {
                return;
            }
            pos >>= 6;
        }
    }

    /// Smallest set position `>= from`.
    fn next(&self, from: usize) -> Option<usize> {
        let mut pos = from;
        let mut k = 0;
        loop {
            let level = self.levels.get(k)?;
            let w = pos >> 6;
            let bits = *level.get(w)? & (u64::MAX << (pos & 63));
            if bits != 0 {
                pos = (w << 6) | bits.trailing_zeros() as usize;
                break;
            }
            pos = w + 1;
            k += 1;
        }
        while k > 0 {
            k -= 1;
            pos = (pos << 6) | self.levels[k][pos].trailing_zeros() as usize;
        }
        Some(pos)
    }

    fn mem_bytes(&self) -> usize {
        self.levels.iter().map(|l| l.capacity() * 8).sum()
    }
}

#[derive(Clone, Debug)]
pub(crate) struct TsLists {
    /// Per block: its slot (valid while tracked).
    slot: Vec<u32>,
    /// Per block: its list, or `UNTRACKED`.
    list: Vec<u8>,
    /// Per slot: the owning block, or `NIL`.
    owner: Vec<u32>,
    /// Per list: the slots of its visible blocks (held blocks of a hiding
    /// list have no bit).
    bits: Vec<Bits>,
    /// Per block: held (`hold`); cleared when the block stops being tracked.
    held: Vec<bool>,
    /// Bit `l` set: list `l` hides its held blocks.
    hiding: u64,
    len: Vec<usize>,
    /// Next free slot.
    now: usize,
}

impl TsLists {
    /// `nlists` lists over ids `0..capacity`; list `l` hides held blocks
    /// if bit `l` of `hiding` is set.
    pub(crate) fn new(capacity: usize, nlists: usize, hiding: u64) -> Self {
        assert!(nlists < UNTRACKED as usize && nlists <= 64);
        assert!(capacity < (NIL / 2) as usize, "capacity must fit u32 ids");
        let slots = (2 * capacity).max(64);
        TsLists {
            slot: vec![0; capacity],
            list: vec![UNTRACKED; capacity],
            owner: vec![NIL; slots],
            bits: (0..nlists).map(|_| Bits::new(slots)).collect(),
            held: vec![false; capacity],
            hiding,
            len: vec![0; nlists],
            now: 0,
        }
    }

    /// Asserts `id` is a valid id and returns it as an index.
    #[inline]
    pub(crate) fn idx(&self, id: BlockId) -> usize {
        let i = id.0 as usize;
        assert!(
            i < self.list.len(),
            "BlockId {} out of range (capacity {})",
            id.0,
            self.list.len()
        );
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

    /// Iterates list `l` from LRU to MRU.
    pub(crate) fn iter_lru(&self, l: usize) -> impl Iterator<Item = BlockId> + '_ {
        let bits = &self.bits[l];
        std::iter::successors(bits.next(0), move |&s| bits.next(s + 1))
            .map(move |s| BlockId(self.owner[s]))
    }

    fn tick(&mut self) -> usize {
        if self.now == self.owner.len() {
            self.compact();
        }
        self.now += 1;
        self.now - 1
    }

    /// Whether block `i` (in list `l`) has its bit in `l`: not held, or `l`
    /// does not hide.
    #[inline]
    fn visible(&self, i: usize, l: usize) -> bool {
        !self.held[i] || self.hiding & (1 << l) == 0
    }

    fn place(&mut self, i: usize, l: usize, s: usize) {
        self.slot[i] = s as u32;
        self.list[i] = l as u8;
        self.owner[s] = i as u32;
        if self.visible(i, l) {
            self.bits[l].set(s);
        }
        self.len[l] += 1;
    }

    fn unplace(&mut self, i: usize) {
        let (l, s) = (self.list[i] as usize, self.slot[i] as usize);
        if self.visible(i, l) {
            self.bits[l].clear(s);
        }
        self.len[l] -= 1;
        self.owner[s] = NIL;
        self.list[i] = UNTRACKED;
    }

    /// Starts tracking `id` (MUST be untracked) at the MRU end of `l`, accessed now.
    pub(crate) fn push_mru(&mut self, id: BlockId, l: usize) {
        let i = self.idx(id);
        assert_eq!(self.list[i], UNTRACKED, "BlockId {} inserted twice", id.0);
        let s = self.tick();
        self.place(i, l, s);
    }

    /// Marks tracked `id` accessed now and moves it to the MRU end of `l`.
    pub(crate) fn touch(&mut self, id: BlockId, l: usize) {
        let i = self.idx(id);
        assert_ne!(self.list[i], UNTRACKED, "BlockId {} not tracked", id.0);
        self.unplace(i);
        let s = self.tick();
        self.place(i, l, s);
    }

    /// Moves tracked `id` to list `l`, at the position its last access dictates.
    pub(crate) fn move_sorted(&mut self, id: BlockId, l: usize) {
        let i = self.idx(id);
        assert_ne!(self.list[i], UNTRACKED, "BlockId {} not tracked", id.0);
        let s = self.slot[i] as usize;
        self.unplace(i);
        self.place(i, l, s);
    }

    /// Stops tracking `id` (MUST be tracked); a hold ends with it.
    pub(crate) fn remove(&mut self, id: BlockId) {
        let i = self.idx(id);
        assert_ne!(
            self.list[i], UNTRACKED,
            "BlockId {} removed but not tracked",
            id.0
        );
        self.unplace(i);
        self.held[i] = false;
    }

    /// Holds (`on`) or releases tracked `id`: a held block is skipped by
    /// `iter_lru` of a hiding list, and keeps its list, slot and count.
    /// `on` MUST differ from its current hold state.
    pub(crate) fn hold(&mut self, id: BlockId, on: bool) {
        let i = self.idx(id);
        assert_ne!(self.list[i], UNTRACKED, "BlockId {} not tracked", id.0);
        assert_ne!(
            self.held[i], on,
            "hold({}, {on}) without a state change",
            id.0
        );
        let (l, s) = (self.list[i] as usize, self.slot[i] as usize);
        self.held[i] = on;
        if self.hiding & (1 << l) != 0 {
            if on {
                self.bits[l].clear(s);
            } else {
                self.bits[l].set(s);
            }
        }
    }

    /// Whether `id` is held.
    #[cfg(test)]
    pub(crate) fn is_held(&self, id: BlockId) -> bool {
        self.held[self.idx(id)]
    }

    /// Renumbers live slots `0..n` in order. At most `capacity` blocks are live
    /// and there are `>= 2 × capacity` slots, so at least half become free.
    #[cold]
    fn compact(&mut self) {
        let slots = self.owner.len();
        for b in &mut self.bits {
            *b = Bits::new(slots);
        }
        let mut n = 0;
        for s in 0..slots {
            let i = self.owner[s];
            if i != NIL {
                self.owner[s] = NIL;
                self.owner[n] = i;
                self.slot[i as usize] = n as u32;
                let l = self.list[i as usize] as usize;
                if self.visible(i as usize, l) {
                    self.bits[l].set(n);
                }
                n += 1;
            }
        }
        self.now = n;
    }

    /// Checks slots, lists and lengths (tests only; O(n)).
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let mut total = 0;
        for l in 0..self.len.len() {
            let v: Vec<BlockId> = self.iter_lru(l).collect();
            let hidden = (0..self.list.len())
                .filter(|&i| self.list[i] as usize == l && !self.visible(i, l))
                .count();
            assert_eq!(v.len() + hidden, self.len[l]);
            for w in v.windows(2) {
                assert!(
                    self.slot[w[0].0 as usize] < self.slot[w[1].0 as usize],
                    "list {l} out of order"
                );
            }
            for id in &v {
                assert_eq!(self.list[id.0 as usize] as usize, l);
                assert_eq!(self.owner[self.slot[id.0 as usize] as usize], id.0);
            }
            for id in &v {
                assert!(
                    self.visible(id.0 as usize, l),
                    "hidden block {} walked",
                    id.0
                );
            }
            total += v.len() + hidden;
        }
        assert!((0..self.list.len()).all(|i| self.list[i] != UNTRACKED || !self.held[i]));
        assert_eq!(total, self.list.iter().filter(|&&l| l != UNTRACKED).count());
        assert_eq!(total, self.owner.iter().filter(|&&o| o != NIL).count());
    }

    pub(crate) fn mem_bytes(&self) -> usize {
        self.slot.capacity() * 4
            + self.list.capacity()
            + self.owner.capacity() * 4
            + self.held.capacity()
            + self.bits.iter().map(Bits::mem_bytes).sum::<usize>()
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
        let mut t = TsLists::new(8, 2, 0);
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

    /// Five blocks on two lists (list 1 hides held blocks), alternating:
    /// 0, 2, 4 on list 0 and 1, 3 on list 1.
    fn alternating() -> TsLists {
        let mut t = TsLists::new(5, 2, 0b10);
        for i in 0..5 {
            t.push_mru(BlockId(i), (i % 2) as usize);
        }
        t
    }

    #[test]
    fn compaction_keeps_order() {
        let mut t = alternating();
        // 64 slots: many touches force several compactions.
        for r in 0..1000u32 {
            let id = BlockId([0, 2, 4, 1, 3][(r % 5) as usize]);
            let l = t.list_of(id).unwrap();
            t.touch(id, l);
            t.check();
        }
        assert!(t.now <= 64);
        assert_eq!(ids(t.iter_lru(0)), vec![0, 2, 4]);
        assert_eq!(ids(t.iter_lru(1)), vec![1, 3]);
    }

    #[test]
    fn held_blocks_are_hidden_only_in_hiding_lists() {
        // List 1 hides held blocks, list 0 does not.
        let mut t = TsLists::new(8, 2, 0b10);
        for i in 0..6 {
            t.push_mru(BlockId(i), 1);
        }
        t.hold(BlockId(1), true);
        t.hold(BlockId(4), true);
        assert_eq!(ids(t.iter_lru(1)), vec![0, 2, 3, 5]);
        assert_eq!(t.len(1), 6);
        t.check();
        // A held block moved to a list that does not hide is walked there,
        // and hidden again when it comes back.
        t.move_sorted(BlockId(4), 0);
        assert_eq!(ids(t.iter_lru(0)), vec![4]);
        t.move_sorted(BlockId(4), 1);
        assert_eq!(ids(t.iter_lru(1)), vec![0, 2, 3, 5]);
        // A held block touched keeps hidden, at its new (MRU) place.
        t.touch(BlockId(1), 1);
        t.hold(BlockId(4), false);
        assert_eq!(ids(t.iter_lru(1)), vec![0, 2, 3, 4, 5]);
        t.hold(BlockId(1), false);
        assert_eq!(ids(t.iter_lru(1)), vec![0, 2, 3, 4, 5, 1]);
        t.hold(BlockId(2), true);
        t.remove(BlockId(2));
        assert!(!t.is_held(BlockId(2)));
        t.push_mru(BlockId(2), 1);
        assert_eq!(ids(t.iter_lru(1)), vec![0, 3, 4, 5, 1, 2]);
        t.check();
    }

    #[test]
    fn compaction_keeps_held_blocks_hidden() {
        let mut t = alternating();
        t.hold(BlockId(1), true);
        t.hold(BlockId(2), true);
        for r in 0..1000u32 {
            let id = BlockId([0, 2, 4, 1, 3][(r % 5) as usize]);
            let l = t.list_of(id).unwrap();
            t.touch(id, l);
            t.check();
        }
        assert_eq!(ids(t.iter_lru(0)), vec![0, 2, 4]);
        assert_eq!(ids(t.iter_lru(1)), vec![3]);
        t.hold(BlockId(1), false);
        assert_eq!(ids(t.iter_lru(1)), vec![1, 3]);
        t.check();
    }

    #[test]
    #[should_panic(expected = "without a state change")]
    fn hold_twice_panics() {
        let mut t = TsLists::new(2, 1, 1);
        t.push_mru(BlockId(0), 0);
        t.hold(BlockId(0), true);
        t.hold(BlockId(0), true);
    }

    #[test]
    fn hierarchical_bits_find_next() {
        let n = 64 * 64 * 3 + 5;
        let mut b = Bits::new(n);
        assert_eq!(b.levels.len(), 3);
        assert_eq!(b.next(0), None);
        for p in [0usize, 63, 64, 4095, 4096, 9000, n - 1] {
            b.set(p);
        }
        let mut got = Vec::new();
        let mut from = 0;
        while let Some(p) = b.next(from) {
            got.push(p);
            from = p + 1;
        }
        assert_eq!(got, vec![0, 63, 64, 4095, 4096, 9000, n - 1]);
        b.clear(4095);
        b.clear(4096);
        assert_eq!(b.next(65), Some(9000));
        b.clear(9000);
        assert_eq!(b.next(65), Some(n - 1));
        assert_eq!(b.next(n), None);
    }

    #[test]
    #[should_panic(expected = "inserted twice")]
    fn double_insert_panics() {
        let mut t = TsLists::new(2, 1, 0);
        t.push_mru(BlockId(0), 0);
        t.push_mru(BlockId(0), 0);
    }
}
