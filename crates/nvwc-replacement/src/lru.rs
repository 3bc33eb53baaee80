//! LRU over all cached blocks.
//!
//! Two timestamp-ordered lists (slot bitsets over access times): clean and
//! dirty. `victim_clean` walks the clean list from its LRU end (skipping
//! pinned blocks); `clean_batch` walks the dirty list from its LRU end (skipping
//! busy blocks). Each step is a find-next-set-bit (O(log64 capacity)), plus one
//! per pinned/busy block skipped. A block whose dirty state changes keeps its
//! access slot, so it lands in the other list exactly where true LRU order puts
//! it. Per-block state is about 13.5 bytes (u32 slot, u8 list tag, two u32
//! slot-owner entries, bitset bits); no hash map.

use crate::clean_dirty::{delegate_to_lists, CleanDirty};
use crate::{BlockId, Replacement};

/// Least-recently-used replacement and cleaning.
#[derive(Clone, Debug)]
pub struct Lru {
    lists: CleanDirty,
}

impl Lru {
    /// A policy for block ids `0..capacity_blocks`.
    pub fn new(capacity_blocks: usize) -> Self {
        Lru {
            lists: CleanDirty::new(capacity_blocks),
        }
    }

    /// Number of tracked clean blocks.
    pub fn clean_len(&self) -> usize {
        self.lists.len(false)
    }

    /// Number of tracked dirty blocks.
    pub fn dirty_len(&self) -> usize {
        self.lists.len(true)
    }
}

impl Replacement for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn insert(&mut self, id: BlockId, _lbn: u64, dirty: bool) {
        self.lists.insert(id, dirty);
    }

    fn touch(&mut self, id: BlockId, _write: bool) {
        self.lists.touch(id);
    }

    delegate_to_lists!();

    fn clean_batch(&mut self, max: usize, busy: &dyn Fn(BlockId) -> bool, out: &mut Vec<BlockId>) {
        out.extend(self.lists.dirty_lru().filter(|&id| !busy(id)).take(max));
    }

    fn mem_bytes(&self) -> usize {
        self.lists.mem_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{fill, none};

    #[test]
    fn evicts_least_recently_used_clean_and_skips_pinned() {
        let mut p = Lru::new(8);
        fill(&mut p, 4, 100, false);
        p.touch(BlockId(0), false);
        assert_eq!(p.victim_clean(&none), Some(BlockId(1)));
        assert_eq!(p.victim_clean(&|b| b == BlockId(1)), Some(BlockId(2)));
        p.set_dirty(BlockId(2), true);
        assert_eq!(p.victim_clean(&|b| b == BlockId(1)), Some(BlockId(3)));
        assert_eq!(p.victim_clean(&|b| b != BlockId(0)), Some(BlockId(0)));
        assert_eq!(p.victim_clean(&|_| true), None);
        p.remove(BlockId(1));
        assert_eq!(p.victim_clean(&none), Some(BlockId(3)));
    }

    #[test]
    fn cleaned_block_keeps_its_lru_position() {
        let mut p = Lru::new(8);
        p.insert(BlockId(0), 0, true); // old dirty block
        p.insert(BlockId(1), 1, false);
        p.insert(BlockId(2), 2, false);
        p.set_dirty(BlockId(0), false); // cleaned: oldest clean block, not MRU
        assert_eq!(p.victim_clean(&none), Some(BlockId(0)));
    }

    #[test]
    fn clean_batch_oldest_dirty_first_skipping_busy() {
        let mut p = Lru::new(8);
        for i in 0..5 {
            p.insert(BlockId(i), i as u64, i != 2);
        }
        p.touch(BlockId(0), true);
        let mut out = Vec::new();
        p.clean_batch(2, &|b| b == BlockId(1), &mut out);
        assert_eq!(out, vec![BlockId(3), BlockId(4)]);
        out.clear();
        p.clean_batch(10, &none, &mut out);
        assert_eq!(out, vec![BlockId(1), BlockId(3), BlockId(4), BlockId(0)]);
        assert_eq!((p.clean_len(), p.dirty_len()), (1, 4));
    }

    #[test]
    fn blocks_under_writeback_leave_the_walk_in_order() {
        // The same batch as when the walk asks `busy` about them.
        let mut p = Lru::new(8);
        fill(&mut p, 6, 0, true);
        let marked = |b: BlockId| b == BlockId(0) || b == BlockId(3);
        let mut asked = Vec::new();
        p.clean_batch(3, &marked, &mut asked);
        p.set_writeback(BlockId(0), true);
        p.set_writeback(BlockId(3), true);
        let visited = std::cell::Cell::new(0);
        let mut out = Vec::new();
        p.clean_batch(
            3,
            &|b| {
                visited.set(visited.get() + 1);
                marked(b)
            },
            &mut out,
        );
        assert_eq!(out, asked);
        assert_eq!(out, vec![BlockId(1), BlockId(2), BlockId(4)]);
        assert_eq!(visited.get(), 3, "marked blocks are not visited");
        // Cleaned while marked: an eviction candidate as before.
        p.set_dirty(BlockId(0), false);
        assert_eq!(p.victim_clean(&none), Some(BlockId(0)));
        p.set_dirty(BlockId(0), true);
        p.set_writeback(BlockId(0), false);
        out.clear();
        p.clean_batch(2, &none, &mut out);
        assert_eq!(out, vec![BlockId(0), BlockId(1)]);
        assert_eq!(p.dirty_len(), 6);
        // Removal ends the mark: the id is reused unmarked.
        p.remove(BlockId(3));
        p.insert(BlockId(3), 9, true);
        p.set_writeback(BlockId(3), true);
    }

    #[test]
    fn memory_is_at_most_16_bytes_per_block() {
        let p = Lru::new(1 << 16);
        assert!(p.mem_bytes() <= 16 << 16, "{}", p.mem_bytes());
        assert!(p.mem_bytes() >= 13 << 16, "{}", p.mem_bytes());
    }

    #[test]
    #[should_panic(expected = "without a state change")]
    fn set_dirty_same_state_panics() {
        let mut p = Lru::new(2);
        p.insert(BlockId(0), 0, true);
        p.set_dirty(BlockId(0), true);
    }
}
