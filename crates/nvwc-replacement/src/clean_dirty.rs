//! The two LRU lists that LRU, LST and stack keep, clean and dirty
//! ([`CleanDirty`]), and for the two segment policies the same lists with
//! the dirty blocks' segment index kept in step ([`SegmentedLists`]).

use crate::lists::TsLists;
use crate::segments::SegmentIndex;
use crate::BlockId;

const CLEAN: usize = 0;
const DIRTY: usize = 1;

fn list(dirty: bool) -> usize {
    if dirty {
        DIRTY
    } else {
        CLEAN
    }
}

/// Clean and dirty blocks, each list in access order. A block whose dirty
/// state changes keeps its access slot, so it lands in the other list where
/// true LRU order puts it.
#[derive(Clone, Debug)]
pub(crate) struct CleanDirty {
    lists: TsLists,
}

impl CleanDirty {
    pub(crate) fn new(capacity_blocks: usize) -> Self {
        CleanDirty {
            // The dirty list hides held blocks (being written back): the
            // destage walk skips them without visiting them.
            lists: TsLists::new(capacity_blocks, 2, 1 << DIRTY),
        }
    }

    /// Number of tracked blocks that are dirty (`dirty`) or clean.
    pub(crate) fn len(&self, dirty: bool) -> usize {
        self.lists.len(list(dirty))
    }

    /// Whether `id` is dirty. `id` MUST be tracked.
    fn is_dirty(&self, id: BlockId) -> bool {
        match self.lists.list_of(id) {
            Some(l) => l == DIRTY,
            None => panic!("BlockId {} is not tracked", id.0),
        }
    }

    pub(crate) fn insert(&mut self, id: BlockId, dirty: bool) {
        self.lists.push_mru(id, list(dirty));
    }

    /// Make `id` the most recently used of its list; returns whether it is dirty.
    pub(crate) fn touch(&mut self, id: BlockId) -> bool {
        let dirty = self.is_dirty(id);
        self.lists.touch(id, list(dirty));
        dirty
    }

    /// Move `id` to the other list: `dirty` MUST differ from its state.
    pub(crate) fn set_dirty(&mut self, id: BlockId, dirty: bool) {
        assert_ne!(
            self.is_dirty(id),
            dirty,
            "set_dirty({}, {dirty}) without a state change",
            id.0
        );
        self.lists.move_sorted(id, list(dirty));
    }

    /// Stop tracking `id`; returns whether it was dirty.
    pub(crate) fn remove(&mut self, id: BlockId) -> bool {
        let dirty = self.is_dirty(id);
        self.lists.remove(id);
        dirty
    }

    /// The least recently used clean block not `pinned`.
    pub(crate) fn victim_clean(&self, pinned: &dyn Fn(BlockId) -> bool) -> Option<BlockId> {
        self.lists.iter_lru(CLEAN).find(|&id| !pinned(id))
    }

    /// `Replacement::set_writeback`: a held dirty block leaves `dirty_lru`.
    pub(crate) fn hold(&mut self, id: BlockId, on: bool) {
        self.lists.hold(id, on);
    }

    /// Dirty blocks not held, least recently used first.
    pub(crate) fn dirty_lru(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.lists.iter_lru(DIRTY)
    }

    pub(crate) fn mem_bytes(&self) -> usize {
        self.lists.mem_bytes()
    }
}

/// [`CleanDirty`] with the segments of the dirty blocks.
#[derive(Clone, Debug)]
pub(crate) struct SegmentedLists {
    pub(crate) blocks: CleanDirty,
    pub(crate) segs: SegmentIndex,
}

impl SegmentedLists {
    /// Block ids `0..capacity_blocks`, tracks of `track_blocks` blocks
    /// (`track_blocks >= 1`).
    pub(crate) fn new(capacity_blocks: usize, track_blocks: u64) -> Self {
        SegmentedLists {
            blocks: CleanDirty::new(capacity_blocks),
            segs: SegmentIndex::new(capacity_blocks, track_blocks),
        }
    }

    pub(crate) fn insert(&mut self, id: BlockId, lbn: u64, dirty: bool) {
        self.blocks.insert(id, dirty);
        self.segs.set_lbn(id, lbn);
        if dirty {
            self.segs.add_dirty(id);
        }
    }

    /// An access; a write to a dirty block refreshes its segment.
    pub(crate) fn touch(&mut self, id: BlockId, write: bool) {
        if self.blocks.touch(id) && write {
            self.segs.rewrite(id);
        }
    }

    pub(crate) fn set_dirty(&mut self, id: BlockId, dirty: bool) {
        self.blocks.set_dirty(id, dirty);
        if dirty {
            self.segs.add_dirty(id);
        } else {
            self.segs.remove_dirty(id);
        }
    }

    pub(crate) fn remove(&mut self, id: BlockId) {
        if self.blocks.remove(id) {
            self.segs.remove_dirty(id);
        }
    }

    /// The least recently used clean block not `pinned`.
    pub(crate) fn victim_clean(&self, pinned: &dyn Fn(BlockId) -> bool) -> Option<BlockId> {
        self.blocks.victim_clean(pinned)
    }

    /// `Replacement::set_writeback`. The segment walk does not use the
    /// dirty list (a segment is a run of lbns; it asks `busy` per block), so
    /// only the block lists record the hold.
    pub(crate) fn hold(&mut self, id: BlockId, on: bool) {
        self.blocks.hold(id, on);
    }

    pub(crate) fn mem_bytes(&self) -> usize {
        self.blocks.mem_bytes() + self.segs.mem_bytes()
    }
}

/// The `Replacement` methods a policy passes to its `lists` ([`CleanDirty`]
/// or [`SegmentedLists`]) unchanged: `set_dirty`, `remove`, `victim_clean`,
/// `set_writeback`.
macro_rules! delegate_to_lists {
    () => {
        fn set_dirty(&mut self, id: BlockId, dirty: bool) {
            self.lists.set_dirty(id, dirty);
        }

        fn remove(&mut self, id: BlockId) {
            self.lists.remove(id);
        }

        fn victim_clean(&mut self, pinned: &dyn Fn(BlockId) -> bool) -> Option<BlockId> {
            self.lists.victim_clean(pinned)
        }

        fn set_writeback(&mut self, id: BlockId, on: bool) {
            self.lists.hold(id, on);
        }
    };
}
pub(crate) use delegate_to_lists;
