//! The engine's bookkeeping types: slots, blocks, request pieces, I/O
//! contexts, destage plans in flight and commit waiters.

use super::*;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum SlotState {
    Free,
    /// Allocated; data write in flight, not readable.
    Writing,
    Valid,
    /// Released; waiting for in-flight reads or for a commit that writes its entry as free.
    Retired,
}

#[derive(Copy, Clone, Debug)]
pub(super) struct Slot {
    pub(super) seq: u64,
    /// Owning block (latest version or shadow), or NIL (free or retired).
    pub(super) block: u32,
    pub(super) refs: u16,
    pub(super) state: SlotState,
    /// `F_*` bits below.
    pub(super) flags: u8,
}

/// The version is dirty (not yet on the backing store).
const S_DIRTY: u8 = 1;
/// An older version kept for the write policy (counted in its block's `shadows`).
const S_SHADOW: u8 = 2;
/// The durable slot table may name this slot as valid.
const S_DISK_VALID: u8 = 4;
/// Listed in `meta_dirty` (its entry changed since the last commit snapshot).
const S_IN_META_DIRTY: u8 = 8;
/// Part of the commit in progress.
const S_IN_SNAPSHOT: u8 = 16;
/// Being copied to the backing store by a plan.
const S_DESTAGING: u8 = 32;
/// Its version was introduced by a log record that is not sealed yet: its
/// bytes MUST NOT change ([`commit`] module docs).
const S_UNSEALED: u8 = 64;
/// Retired and counted in `SlotTable::retired_pending`: its entry was on
/// the device (or in the commit in flight), so a commit that writes it as
/// free frees it. A slot retired off the device is freed without a commit
/// (once its last reader lets go) and MUST NOT be counted.
const S_RECLAIM: u8 = 128;

macro_rules! slot_flag {
    ($get:ident, $set:ident, $bit:expr) => {
        pub(super) fn $get(&self) -> bool {
            self.flags & $bit != 0
        }
        pub(super) fn $set(&mut self, v: bool) {
            if v {
                self.flags |= $bit
            } else {
                self.flags &= !$bit
            }
        }
    };
}

const _: () = assert!(std::mem::size_of::<Slot>() == 16 && std::mem::size_of::<Block>() == 24);

impl Slot {
    slot_flag!(dirty, set_dirty, S_DIRTY);
    slot_flag!(shadow, set_shadow, S_SHADOW);
    slot_flag!(disk_valid, set_disk_valid, S_DISK_VALID);
    slot_flag!(in_meta_dirty, set_in_meta_dirty, S_IN_META_DIRTY);
    slot_flag!(in_snapshot, set_in_snapshot, S_IN_SNAPSHOT);
    slot_flag!(destaging, set_destaging, S_DESTAGING);
    slot_flag!(unsealed, set_unsealed, S_UNSEALED);
    slot_flag!(reclaim, set_reclaim, S_RECLAIM);

    /// Clear [`Slot::reclaim`]; whether it was set.
    pub(super) fn take_reclaim(&mut self) -> bool {
        let r = self.reclaim();
        self.set_reclaim(false);
        r
    }
}

impl Slot {
    pub(super) fn free() -> Self {
        Slot {
            seq: 0,
            block: NIL,
            refs: 0,
            state: SlotState::Free,
            flags: 0,
        }
    }
}

/// A backing block with state in the engine (cached, or busy with I/O).
/// 24 bytes: the block number shares a word with the reader count.
#[derive(Clone, Debug)]
pub(super) struct Block {
    /// Block number (low 48 bits) and backing reads in flight (high 16 bits).
    pub(super) key: u64,
    pub(super) latest: u32,
    /// Replacement handle while cached, or NIL.
    pub(super) rid: u32,
    /// Older dirty versions (shadows) kept for the write policy.
    pub(super) shadows: u32,
    /// Destage writes of this block's versions in flight (at most one plan
    /// writes a block at a time, so writes of two versions never race).
    pub(super) destaging: u16,
    /// A write piece (or a read fill) holds the block.
    pub(super) busy: bool,
    /// A write started while backing reads were in flight: their data may be
    /// stale, so they must not fill the cache.
    pub(super) fill_stale: bool,
}

const LBN_BITS: u32 = 48;
const LBN_MASK: u64 = (1 << LBN_BITS) - 1;

impl Block {
    pub(super) fn new(lbn: u64) -> Self {
        assert!(
            lbn <= LBN_MASK,
            "block number {lbn} needs more than 48 bits"
        );
        Block {
            key: lbn,
            latest: NIL,
            rid: NIL,
            shadows: 0,
            destaging: 0,
            busy: false,
            fill_stale: false,
        }
    }
    pub(super) fn lbn(&self) -> u64 {
        self.key & LBN_MASK
    }
    pub(super) fn readers(&self) -> u16 {
        (self.key >> LBN_BITS) as u16
    }
    pub(super) fn add_reader(&mut self) {
        assert!(
            self.readers() < u16::MAX,
            "too many reads of one block in flight"
        );
        self.key += 1 << LBN_BITS;
    }
    pub(super) fn remove_reader(&mut self) {
        assert!(self.readers() > 0);
        self.key -= 1 << LBN_BITS;
        if self.readers() == 0 {
            self.fill_stale = false;
        }
    }
}

#[derive(Debug)]
pub(super) struct Piece<P> {
    pub(super) req: ReqId,
    pub(super) lbn: u64,
    pub(super) start: u32,
    pub(super) end: u32,
    /// Write data (length `end - start`); `None` for reads.
    pub(super) data: Option<P>,
    /// Full block contents ready to be written to a new slot.
    pub(super) buf: Option<P>,
    /// New slot being written, or the slot being read.
    pub(super) slot: u32,
    pub(super) ios: u8,
    pub(super) failed: bool,
    pub(super) stalled_since: Option<u64>,
    /// Since when it waits for its block (`Engine::start_piece`).
    pub(super) queued_at: u64,
    pub(super) seq: u64,
    pub(super) group: Group,
    pub(super) fua: bool,
    /// Holds one unit of `Engine::reserved` until it allocates a slot or ends.
    pub(super) reserved: bool,
    /// The admission policy rejected the write: bypass it if that is safe.
    pub(super) bypass: bool,
    /// A critical request issued it or waits behind it (inherited).
    pub(super) critical: bool,
    /// The class the request's tag gave it (critical or normal), for the
    /// per-class admission counters; inheritance does not change it.
    pub(super) tag_critical: bool,
    /// The new version this write makes is partial, valid only in this byte
    /// range (a write over a partial version, see [`partial`]); `None`: whole.
    pub(super) valid: Option<(u32, u32)>,
    /// Counted in `active_pieces` (a bypass piece in flight to the backing
    /// store is not: it only waits for that device, and counting it would
    /// let a burst of slow bypass writes hold every place a cached write
    /// needs to start).
    pub(super) counted: bool,
}

#[derive(Debug)]
pub(super) enum ReqKind {
    Read,
    Write,
}

#[derive(Debug)]
pub(super) struct Req<P> {
    pub(super) kind: ReqKind,
    pub(super) pieces_left: u32,
    pub(super) failed: Option<ReqError>,
    pub(super) parts: Vec<(u64, P)>,
    pub(super) offset: u64,
    pub(super) seq: u64,
    pub(super) group: Group,
    pub(super) fua: bool,
    /// Versions installed for this write (their entries are rewritten once the
    /// write completes, when its policy fields are final).
    pub(super) installed: Vec<u32>,
    /// Some piece went through the cache (not bypassed): a FUA reply waits
    /// for a commit. Bypassed pieces are durable on the backing store already.
    pub(super) cached: bool,
}

#[derive(Debug)]
pub(super) enum IoCtx {
    ReadHit {
        piece: u32,
    },
    ReadMiss {
        piece: u32,
        full: bool,
    },
    /// Old contents for a partial write (from the cache or, as a fetch, the backing store).
    RmwRead {
        piece: u32,
        from_cache: bool,
    },
    PieceCacheWrite {
        piece: u32,
        inplace: bool,
    },
    /// Write-through: adjacent pieces of one request written to the backing store as one write.
    ThroughWrite {
        pieces: Vec<u32>,
    },
    /// An admission (or full-cache) bypass: adjacent pieces of one request
    /// written to the backing store as one write, with FUA or not (`fua`:
    /// see `Engine::bypass_piece`). A piece reissued to the cache meanwhile
    /// moves to `orphans` (its block stays marked until this completes, and
    /// the completion is discarded for it).
    BypassWrite {
        pieces: Vec<(u32, u32)>,
        orphans: Vec<u32>,
        fua: bool,
    },
    Fill {
        block: u32,
        slot: u32,
    },
    DestageRead {
        plan: u32,
        /// The run of the plan (`PlanExec::runs`) the bytes read belong to,
        /// and their place in it.
        run: u32,
        part: u32,
    },
    DestageWrite {
        plan: u32,
        /// Copies the write carries (a run's parts).
        copies: u32,
    },
    PlanBegin {
        plan: u32,
    },
    PlanFinish {
        plan: u32,
    },
    /// A backing FLUSH shared by the plans in `Engine::plan_flush_inflight`.
    PlanFlush,
    Commit,
    /// A log commit's data checksum for the record's entry `entry`.
    CommitChecksum {
        entry: u32,
    },
    ReqBacking {
        req: ReqId,
    },
    /// Whole-block read of a patched block (see [`patch`]).
    PatchFetch {
        block: u32,
        id: u64,
        bg: bool,
    },
    /// Cache write of a patched block brought up to date, or (`partial`) of
    /// its one patch into a fresh slot, as a partial version.
    PatchInstall {
        block: u32,
        slot: u32,
        took: bool,
        partial: bool,
    },
    /// A read of a partial version that needs bytes outside its valid range
    /// `[lo, hi)`: first the backing store's bytes, then `SplitCache`.
    SplitRead {
        piece: u32,
        lo: u32,
        hi: u32,
    },
    /// The partial version's bytes `[at, ..)` for that read, from the cache.
    SplitCache {
        piece: u32,
        at: u32,
    },
    /// A partial write over a partial version whose range it cannot join:
    /// the whole block from the backing store, then `RmwMerge`.
    RmwFetch {
        piece: u32,
        lo: u32,
        hi: u32,
    },
    /// The old partial version's valid bytes `[lo, ..)`, laid over the fetched block.
    RmwMerge {
        piece: u32,
        lo: u32,
    },
    /// Backing FLUSH that makes completed direct patch writes durable, for a
    /// client FLUSH (`req`) or at the end of a drain or shutdown (`None`).
    DirectCover {
        req: Option<ReqId>,
    },
    /// Backing write of one patch (`patch_direct`).
    PatchDirect {
        block: u32,
        id: u64,
        bg: bool,
        took: bool,
    },
}

#[derive(Debug)]
pub(super) struct PlanExec {
    pub(super) plan: Plan,
    /// Owning block of each written slot.
    pub(super) blocks: Vec<u32>,
    pub(super) left: u32,
    pub(super) failed: bool,
    /// Each copy is a FUA write, durable on its own: the plan ends without
    /// the shared backing FLUSH (paced cleaning, `Engine::pace_after`).
    pub(super) fua: bool,
    /// The plan's copies by backing address, in runs of contiguous bytes:
    /// each run is one backing write (`Engine::plan_copy`).
    pub(super) runs: Vec<RunExec>,
    /// The plan whose end this plan's backing writes wait for
    /// (`Plan::after`); `None` once it ended, or if there was none.
    pub(super) gate: Option<u32>,
    /// Gated, and every copy was read (or failed) before the gate ended:
    /// the plan finishes when the gate does (`Engine::release_gated`).
    pub(super) copied_early: bool,
    /// The gate failed: nothing of this plan is written.
    pub(super) cancelled: bool,
}

/// One backing write of a destage plan: copies whose backing bytes are
/// contiguous, written as one command once every part is read.
#[derive(Debug)]
pub(super) struct RunExec {
    /// Backing byte offset of the first part.
    pub(super) offset: u64,
    /// Parts (copies) in the run.
    pub(super) parts: u32,
    /// Parts whose cache read has not completed.
    pub(super) waiting: u32,
    /// A part's cache read failed: the run is not written.
    pub(super) failed: bool,
}

/// A write waiting for admission.
#[derive(Debug)]
pub(super) struct Admit<P> {
    pub(super) rw: Rw<P>,
    pub(super) route: Route,
    /// Slots it reserves when admitted.
    pub(super) need: u64,
    /// Block pieces it covers.
    pub(super) pieces: u64,
    /// When it arrived, if it could not be admitted at once (a stall for space).
    pub(super) stalled_since: Option<u64>,
    /// Its sequence number and group, if issued on arrival
    /// (`WritePolicy::issue_at_arrival`).
    pub(super) issued: Option<(u64, Group)>,
}

/// A request waiting for a metadata commit (FLUSH, or a FUA write).
#[derive(Copy, Clone, Debug)]
pub(super) struct Waiter {
    pub(super) id: ReqId,
    pub(super) group: Group,
    pub(super) write: bool,
    pub(super) seq: u64,
}

/// The slot table in memory: one [`Slot`] per cache slot, the policy's
/// group and changed range of each version, free slots, and the slots
/// whose released versions a commit may still name.
pub(super) struct SlotTable {
    pub(super) slots: Vec<Slot>,
    /// Policy group of each slot's version; empty for policies without groups.
    pub(super) groups: Vec<Group>,
    /// Byte range each version's writes changed; kept only where destage is
    /// exact (ordered), empty otherwise (whole blocks).
    pub(super) ranges: Vec<(u32, u32)>,
    pub(super) free: FreeSet,
    /// Slots retired but not yet free that a commit will free: those marked
    /// [`Slot::reclaim`] (their entries were on the device).
    pub(super) retired_pending: u64,
    /// Free slots promised to admitted write pieces that have not allocated yet.
    pub(super) reserved: u64,
    /// Dirty versions (not yet on the backing store).
    pub(super) dirty: u64,
    /// Slots allocated for a new version whose write has not finished
    /// (`alloc_slot` to `install` or `unalloc_slot`).
    pub(super) writing: u64,
    /// Blocks with a released version whose entry a durable (or in-flight)
    /// commit may still name, and the count: recovery could bring such a
    /// version back, so the block must not be bypassed until a commit frees
    /// the entry. `retired_lbn` maps each such slot to its block.
    pub(super) retired_lbns: HashMap<u64, u32>,
    pub(super) retired_lbn: IdMap<u32, u64>,
}

impl SlotTable {
    /// `cap` free slots; groups kept when the policy groups versions,
    /// ranges when it destages exact byte ranges.
    pub(super) fn new(cap: usize, groups: bool, ranges: bool) -> Self {
        SlotTable {
            slots: vec![Slot::free(); cap],
            groups: if groups {
                vec![NO_GROUP; cap]
            } else {
                Vec::new()
            },
            ranges: if ranges {
                vec![(0, 0); cap]
            } else {
                Vec::new()
            },
            free: FreeSet::new(cap, true),
            retired_pending: 0,
            reserved: 0,
            dirty: 0,
            writing: 0,
            retired_lbns: HashMap::new(),
            retired_lbn: IdMap::default(),
        }
    }
}

/// The backing blocks the cache knows about: the LBN index into
/// [`Block`] entries, and the request-id map of blocks with waiters.
pub(super) struct BlockMap {
    pub(super) index: LbnIndex,
    pub(super) blocks: Vec<Block>,
    pub(super) free: FreeSet,
    pub(super) rid_block: Vec<u32>,
    pub(super) free_rids: FreeSet,
    /// Pieces waiting for each busy block, in arrival order.
    pub(super) waiters: IdMap<u32, VecDeque<u32>>,
}

impl BlockMap {
    pub(super) fn new(cap: usize) -> Self {
        BlockMap {
            index: LbnIndex::with_capacity(cap),
            blocks: Vec::new(),
            free: FreeSet::default(),
            rid_block: vec![NIL; cap],
            free_rids: FreeSet::new(cap, true),
            waiters: IdMap::default(),
        }
    }
}

/// A client read (`data` None) or write on its way into block pieces.
#[derive(Debug)]
pub(super) struct Rw<P> {
    pub(super) id: ReqId,
    pub(super) offset: u64,
    pub(super) len: u64,
    pub(super) data: Option<P>,
    pub(super) fua: bool,
    pub(super) tag: Tag,
}

/// Where a request's pieces go, as admission decided.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum Route {
    /// Cached, each write in its write-policy group (and every read).
    Cache,
    /// Admission rejected the write: each piece bypasses the cache where it
    /// can (`can_bypass`), in its write-policy group.
    Bypass,
    /// A journaled bypass that belongs to no transaction (`journal_bypass_ok`).
    BypassUngrouped,
}

/// What a version being installed holds (`install`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum NewVersion {
    /// The backing store's bytes (a fill): clean, in no group.
    Clean,
    /// A write not yet on the backing store: its write-policy group, and
    /// the byte range it changed.
    Dirty { group: Group, range: (u32, u32) },
}
