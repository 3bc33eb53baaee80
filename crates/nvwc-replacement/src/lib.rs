//! Replacement and cleaning policies for the nvwc engine.
//!
//! The engine (`nvwc-core`) owns the block table; a replacement policy only
//! sees *cached blocks*, each identified by a dense [`BlockId`] that the engine
//! hands out (an index into its block table, stable while the block is cached)
//! together with the block's backing block number (`lbn`, in cache-block units).
//!
//! A policy answers two questions:
//! * which **clean** block to evict when the engine needs a free slot
//!   ([`Replacement::victim_clean`]);
//! * which **dirty** blocks to clean (destage) next, and when cleaning should
//!   run at all ([`Replacement::clean_batch`], [`Replacement::should_clean`]).
//!
//! Contracts (checked with `debug_assert!`/`assert!` in implementations):
//! * the engine MUST call [`Replacement::insert`] exactly once before any other
//!   call naming a block, and [`Replacement::remove`] exactly once when the block
//!   leaves the cache; a removed `BlockId` may be reused by a later `insert`;
//! * `BlockId`s are dense: the engine guarantees `id.0 < capacity_blocks`
//!   given at construction, so policies may use `Vec`s indexed by id;
//! * `lbn` of a tracked block never changes while it is tracked;
//! * `set_dirty` is only called with a state different from the current one;
//! * `set_writeback` is only called with a state different from the current
//!   one, and while a block is under write-back the engine's `busy` predicate
//!   given to `clean_batch` MUST be true for it (so a policy that leaves such
//!   blocks out of its walk offers exactly the blocks, in exactly the order,
//!   it would offer if it walked them and asked `busy`).

//!
//! Policies (one per module): [`Lru`], [`Arc`], [`Lst`], [`Stack`]; select one
//! with [`ReplacementKind`] (parses `"lru"`, `"arc"`, `"lst"`, `"stack"`, with
//! optional parameters) and [`build`].
//!
//! All policies `assert!` the O(1) parts of the contracts above: ids in range,
//! `insert` of an untracked id, other calls on tracked ids, `set_dirty` with a
//! changed state, and (LST/stack) no two dirty blocks with the same lbn.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod arc;
mod clean_dirty;
mod kind;
mod lists;
pub mod lru;
pub mod lst;
pub mod segments;
pub mod stack;
#[cfg(test)]
mod testutil;

pub use arc::Arc;
pub use kind::{build, ParseKindError, ReplacementKind, DEFAULT_TRACK_BLOCKS};
pub use lru::Lru;
pub use lst::Lst;
pub use segments::SegmentInfo;
pub use stack::{KneeSource, Stack};

/// Dense handle of a cached block, chosen by the engine.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

/// Dirty-occupancy watermarks, as fractions of capacity in [0, 1].
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Watermarks {
    /// Cleaning starts when dirty blocks exceed `high * capacity`.
    pub high: f64,
    /// Cleaning stops when dirty blocks fall to `low * capacity` or below.
    pub low: f64,
}

impl Default for Watermarks {
    fn default() -> Self {
        Watermarks {
            high: 0.9,
            low: 0.5,
        }
    }
}

/// A replacement/cleaning policy. One implementation per file.
pub trait Replacement: Send {
    /// Short stable name (`"lru"`, `"arc"`, `"lst"`, `"stack"`).
    fn name(&self) -> &'static str;
    /// A block entered the cache (after a write allocation or a read fill).
    fn insert(&mut self, id: BlockId, lbn: u64, dirty: bool);
    /// The block was accessed again (a hit). `write` is true for writes.
    fn touch(&mut self, id: BlockId, write: bool);
    /// The block's dirty state changed (written while clean, or cleaned).
    fn set_dirty(&mut self, id: BlockId, dirty: bool);
    /// The block left the cache (evicted, trimmed or invalidated). A
    /// write-back mark (`set_writeback`) ends with it.
    fn remove(&mut self, id: BlockId);
    /// The engine started (`true`) or finished (`false`) writing the tracked
    /// block back to the backing store (a destage, or a write sent around the
    /// cache). A block is inserted unmarked; the engine MUST mark it while
    /// any such write of it is in flight, also if it is inserted while one
    /// is, and MUST call this only with a state change (policies assert it).
    /// While a block is marked, the engine's `busy` predicate for
    /// [`Replacement::clean_batch`] MUST return true for it: a policy MAY
    /// then leave it out of its destage walk without visiting it (LRU and
    /// ARC do: cleaning would otherwise step over every block in flight at
    /// each plan), and MUST NOT let the mark change anything else (the
    /// order of other blocks, eviction, counts), so every policy's choices
    /// are exactly what they would be without the mark.
    fn set_writeback(&mut self, id: BlockId, on: bool);
    /// A clean block the engine may evict now, or `None` if no clean block
    /// is tracked. The block stays tracked until the engine calls `remove`.
    /// `pinned` tells the policy which blocks the engine cannot evict right now
    /// (for example, blocks with I/O in flight); the policy skips them.
    fn victim_clean(&mut self, pinned: &dyn Fn(BlockId) -> bool) -> Option<BlockId>;
    /// Append to `out` up to `max` dirty blocks to destage next, as the policy
    /// prefers them (LRU: oldest first; LST/stack: one whole segment).
    /// Blocks for which `busy` is true are already being cleaned: skip them
    /// (blocks marked by `set_writeback` are among them; a policy need not
    /// ask `busy` about those).
    fn clean_batch(&mut self, max: usize, busy: &dyn Fn(BlockId) -> bool, out: &mut Vec<BlockId>);
    /// Whether cleaning should run now. `active` says whether it is running
    /// already (for hysteresis). Default: high/low watermark hysteresis.
    fn should_clean(&self, dirty: u64, capacity: u64, active: bool, wm: Watermarks) -> bool {
        let d = dirty as f64;
        let c = capacity as f64;
        if active {
            d > wm.low * c
        } else {
            d > wm.high * c
        }
    }
    /// Bytes of RAM the policy uses for its per-block state (for benchmarks).
    fn mem_bytes(&self) -> usize;
}
