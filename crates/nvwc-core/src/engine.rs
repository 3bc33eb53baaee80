//! The sans-IO write-cache engine.
//!
//! Inputs: [`Engine::handle_request`], [`Engine::handle_completion`],
//! [`Engine::handle_timeout`], each with the current time `now` (ns, any
//! monotonic origin). Outputs: [`Engine::poll_io`] (device commands),
//! [`Engine::poll_reply`], [`Engine::poll_event`] and [`Engine::poll_timeout`].
//! The engine never blocks, reads a clock or touches a file.
//!
//! # Model
//! The cache device holds `capacity` *slots* of one cache block each. A slot
//! holds one *version* of a backing block. Writes never overwrite a version
//! that a durable commit names: they go to a fresh slot (out of place), and
//! the superseded version is released or, when the write policy needs it
//! (ordered, journaled), kept as a *shadow* until it reaches the backing store.
//! A version that no commit has named yet may be overwritten in place; so may
//! a committed dirty version when the write policy orders nothing among
//! unflushed writes and the operator opted in (plain write-back with
//! `rewrite_in_place`: `may_overwrite_durable`).
//!
//! Metadata (the slot table, see [`crate::layout`]) is persisted by *commits*:
//! flush the cache device (data durable), write the changed table pages, flush,
//! write the commit record with FUA. A FLUSH or FUA reply waits for a commit
//! that started after the write completed. A crash therefore recovers exactly
//! the state of the last durable commit: a prefix-closed set of writes.
//!
//! Per backing block, client writes are serialised (one write piece at a time)
//! and reads wait for an in-progress write. No lock is held across blocks.
//!
//! # Contracts
//! * The driver MUST deliver exactly one completion for every command taken
//!   from `poll_io`, and MUST NOT reuse a `ReqId` while that request is in flight.
//! * `now` MUST be non-decreasing across calls.
//! * Before [`Engine::new`], the driver MUST have written the cache device with
//!   [`crate::layout::format_writes`]; [`Engine::recover`] takes the metadata
//!   regions read back from an existing device.

use std::collections::{BTreeSet, HashMap, VecDeque};

use nvwc_replacement::{BlockId, Replacement};

use crate::admission::{self, Admission, WriteInfo};
use crate::config::{AdmissionKind, Config, ConfigError, FetchMode, WritePolicyKind};
use crate::index::{FreeSet, IdMap, LbnIndex};
use crate::layout::{self, CommitRecord, Entry, FormatError, Layout, F_DIRTY, F_PARTIAL, F_VALID};
use crate::payload::Payload;
use crate::slab::Slab;
use crate::stats::Stats;
use crate::types::*;
use crate::write_policy::{self, Group, Plan, PlanCtx, PolicyEvent, RecoveredVersion, WritePolicy};

mod commit;
mod direct;
mod partial;
mod patch;
use commit::{CommitJob, LogState};
use patch::PatchSet;

const NIL: u32 = u32::MAX;
/// Group of versions that belong to no policy group (clean versions).
pub const NO_GROUP: Group = u64::MAX;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum SlotState {
    Free,
    /// Allocated; data write in flight, not readable.
    Writing,
    Valid,
    /// Released; waiting for in-flight reads or for a commit that writes its entry as free.
    Retired,
}

#[derive(Copy, Clone, Debug)]
struct Slot {
    seq: u64,
    /// Owning block (latest version or shadow), or NIL (free or retired).
    block: u32,
    refs: u16,
    state: SlotState,
    /// `F_*` bits below.
    flags: u8,
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

macro_rules! slot_flag {
    ($get:ident, $set:ident, $bit:expr) => {
        fn $get(&self) -> bool {
            self.flags & $bit != 0
        }
        fn $set(&mut self, v: bool) {
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
}

impl Slot {
    fn free() -> Self {
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
struct Block {
    /// Block number (low 48 bits) and backing reads in flight (high 16 bits).
    key: u64,
    latest: u32,
    /// Replacement handle while cached, or NIL.
    rid: u32,
    /// Older dirty versions (shadows) kept for the write policy.
    shadows: u32,
    /// Destage writes of this block's versions in flight (at most one plan
    /// writes a block at a time, so writes of two versions never race).
    destaging: u16,
    /// A write piece (or a read fill) holds the block.
    busy: bool,
    /// A write started while backing reads were in flight: their data may be
    /// stale, so they must not fill the cache.
    fill_stale: bool,
}

const LBN_BITS: u32 = 48;
const LBN_MASK: u64 = (1 << LBN_BITS) - 1;

impl Block {
    fn new(lbn: u64) -> Self {
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
    fn lbn(&self) -> u64 {
        self.key & LBN_MASK
    }
    fn readers(&self) -> u16 {
        (self.key >> LBN_BITS) as u16
    }
    fn add_reader(&mut self) {
        assert!(
            self.readers() < u16::MAX,
            "too many reads of one block in flight"
        );
        self.key += 1 << LBN_BITS;
    }
    fn remove_reader(&mut self) {
        assert!(self.readers() > 0);
        self.key -= 1 << LBN_BITS;
        if self.readers() == 0 {
            self.fill_stale = false;
        }
    }
}

#[derive(Debug)]
struct Piece<P> {
    req: ReqId,
    lbn: u64,
    start: u32,
    end: u32,
    /// Write data (length `end - start`); `None` for reads.
    data: Option<P>,
    /// Full block contents ready to be written to a new slot.
    buf: Option<P>,
    /// New slot being written, or the slot being read.
    slot: u32,
    ios: u8,
    failed: bool,
    stalled_since: Option<u64>,
    seq: u64,
    group: Group,
    fua: bool,
    /// Holds one unit of `Engine::reserved` until it allocates a slot or ends.
    reserved: bool,
    /// The admission policy rejected the write: bypass it if that is safe.
    bypass: bool,
    /// A critical request issued it or waits behind it (inherited).
    critical: bool,
    /// The class the request's tag gave it (critical or normal), for the
    /// per-class admission counters; inheritance does not change it.
    tag_critical: bool,
    /// The new version this write makes is partial, valid only in this byte
    /// range (a write over a partial version, see [`partial`]); `None`: whole.
    valid: Option<(u32, u32)>,
    /// Counted in `active_pieces` (a bypass piece in flight to the backing
    /// store is not: it only waits for that device, and counting it would
    /// let a burst of slow bypass writes hold every place a cached write
    /// needs to start).
    counted: bool,
}

#[derive(Debug)]
enum ReqKind {
    Read,
    Write,
}

#[derive(Debug)]
struct Req<P> {
    kind: ReqKind,
    pieces_left: u32,
    failed: Option<ReqError>,
    parts: Vec<(u64, P)>,
    offset: u64,
    seq: u64,
    group: Group,
    fua: bool,
    /// Versions installed for this write (their entries are rewritten once the
    /// write completes, when its policy fields are final).
    installed: Vec<u32>,
    /// Some piece went through the cache (not bypassed): a FUA reply waits
    /// for a commit. Bypassed pieces are durable on the backing store already.
    cached: bool,
}

#[derive(Debug)]
enum IoCtx {
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
    /// An admission bypass: adjacent pieces of one request written to the
    /// backing store with FUA as one write. A piece reissued to the cache
    /// meanwhile moves to `orphans` (its block stays marked until this
    /// completes, and the completion is discarded for it).
    BypassWrite {
        pieces: Vec<(u32, u32)>,
        orphans: Vec<u32>,
    },
    Fill {
        block: u32,
        slot: u32,
    },
    DestageRead {
        plan: u32,
        slot: u32,
        /// The version's block when the plan started (it stays in the table while destaging).
        block: u32,
        /// Where in the block the bytes read start.
        lo: u32,
    },
    DestageWrite {
        plan: u32,
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
struct PlanExec {
    plan: Plan,
    /// Owning block of each written slot.
    blocks: Vec<u32>,
    left: u32,
    failed: bool,
}

/// A write waiting for admission.
#[derive(Debug)]
struct Admit<P> {
    id: ReqId,
    tag: Tag,
    bypass: bool,
    offset: u64,
    len: u64,
    data: P,
    fua: bool,
    /// Slots it reserves when admitted.
    need: u64,
    /// Block pieces it covers.
    pieces: u64,
    /// When it arrived, if it could not be admitted at once (a stall for space).
    stalled_since: Option<u64>,
}

/// A request waiting for a metadata commit (FLUSH, or a FUA write).
#[derive(Copy, Clone, Debug)]
struct Waiter {
    id: ReqId,
    group: Group,
    write: bool,
    seq: u64,
}

/// Observable engine events (for logs, metrics and checkers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Policy(PolicyEvent),
    /// A metadata commit finished.
    Committed {
        commit: u64,
        ok: bool,
    },
    /// A background operation failed and will be retried.
    BackgroundError {
        what: &'static str,
    },
}

/// What recovery found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub commit: u64,
    pub clean_shutdown: bool,
    pub dirty_versions: u64,
    pub clean_versions: u64,
    pub discarded: u64,
    pub ignored_uncommitted: u64,
    /// Log records replayed after the checkpoint, and valid-looking ones
    /// left out (from the first whose data did not match its checksums).
    pub log_records: u64,
    pub log_dropped: u64,
}

/// The metadata regions of a cache device, read by the driver for recovery.
#[derive(Clone, Debug, Default)]
pub struct CacheImage {
    /// 512 bytes at offset 0.
    pub superblock: Vec<u8>,
    /// 512 bytes at each commit record offset.
    pub commit_a: Vec<u8>,
    pub commit_b: Vec<u8>,
    /// The slot table: `Layout::table_bytes` bytes at `layout::TABLE_OFFSET`.
    pub table: Vec<u8>,
    /// The metadata log: `Layout::log_bytes` bytes at `Layout::log_offset`.
    pub log: Vec<u8>,
}

/// Errors opening an existing cache device. The message includes the
/// inner error's, so it is not also given as a `source` (a chain printed
/// whole would repeat it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecoverError {
    #[error("invalid configuration: {0}")]
    Config(ConfigError),
    #[error("cache device metadata: {0}")]
    Format(FormatError),
    #[error("reading cache data to check the log: {0}")]
    Read(String),
}

impl From<ConfigError> for RecoverError {
    fn from(e: ConfigError) -> Self {
        RecoverError::Config(e)
    }
}

impl From<FormatError> for RecoverError {
    fn from(e: FormatError) -> Self {
        RecoverError::Format(e)
    }
}

/// The engine. See the module docs.
pub struct Engine<P: Payload> {
    cfg: Config,
    layout: Layout,
    bs: u64,
    policy: Box<dyn WritePolicy>,
    repl: Box<dyn Replacement>,
    slots: Vec<Slot>,
    /// Policy group of each slot's version; empty for policies without groups.
    groups: Vec<Group>,
    /// Byte range each version's writes changed; kept only where destage is
    /// exact (ordered), empty otherwise (whole blocks).
    ranges: Vec<(u32, u32)>,
    free_slots: FreeSet,
    retired_pending: u64,
    index: LbnIndex,
    blocks: Vec<Block>,
    free_blocks: FreeSet,
    rid_block: Vec<u32>,
    free_rids: FreeSet,
    waiters: IdMap<u32, VecDeque<u32>>,
    reqs: IdMap<ReqId, Req<P>>,
    pieces: Slab<Piece<P>>,
    piece_queue: VecDeque<u32>,
    active_pieces: u32,
    max_active: u32,
    alloc_waiters: VecDeque<u32>,
    /// Writes waiting to be admitted (FIFO) until their slots can be reserved.
    admit_queue: VecDeque<Admit<P>>,
    /// Free slots promised to admitted write pieces that have not allocated yet.
    reserved: u64,
    ios: IdMap<IoId, IoCtx>,
    next_io: IoId,
    out_io: VecDeque<IoCmd<P>>,
    out_reply: VecDeque<Reply<P>>,
    out_event: VecDeque<Event>,
    meta_dirty: Vec<u32>,
    /// Which copy (0 or 1) of each metadata page is durable; 2 = neither.
    page_cur: Vec<u8>,
    /// In-place data writes in flight (a commit waits for them).
    inplace_inflight: u32,
    /// A commit is due but waits for in-place writes to finish.
    commit_deferred: bool,
    /// In-place overwrites of durable versions completed since the last
    /// commit started: their bytes need that commit's device flush, though
    /// no entry changed (so a FLUSH cannot be answered at once).
    unsynced_overwrites: bool,
    oldest_change: Option<u64>,
    commit: Option<CommitJob>,
    /// The metadata log and checkpoints (see [`commit`]).
    log: LogState,
    commit_waiters: Vec<Waiter>,
    commit_asap: bool,
    next_commit: u64,
    durable_commit: u64,
    plans: Slab<PlanExec>,
    /// Plans (without an atomic group) whose shared backing FLUSH is in
    /// flight, and those waiting for the next one.
    plan_flush_inflight: Option<Vec<u32>>,
    plan_flush_next: Option<Vec<u32>>,
    destage_inflight: usize,
    cleaning_active: bool,
    retry_at: Option<u64>,
    drain: bool,
    shutting_down: bool,
    next_seq: u64,
    dirty_slots: u64,
    now: u64,
    stats: Stats,
    /// Patched blocks (see [`patch`]), oldest first in `patch_order` by first sequence number.
    patches: IdMap<u32, PatchSet<P>>,
    /// Valid byte range of each partial version, by slot (see [`partial`]);
    /// a slot not in here holds its whole block.
    partial: IdMap<u32, (u32, u32)>,
    /// Lazy patches may be persisted as partial versions (a cache formatted
    /// at `FORMAT_VERSION` 2 or later: older readers do not know `F_PARTIAL`).
    partial_ok: bool,
    patch_order: BTreeSet<(u64, u32)>,
    patch_bytes: u64,
    next_patch_id: u64,
    /// Patched blocks queued for background materialisation, and how many run.
    patch_bg: VecDeque<u32>,
    patch_bg_inflight: u32,
    /// Patched blocks whose materialisation failed, retried at `retry_at`.
    patch_retry: Vec<u32>,
    /// A commit waits for every patch (ordered): no new patch sets meanwhile.
    patch_barrier: bool,
    /// FLUSHes waiting for patch sets older than their sequence number: (id, explicit, seq).
    patch_flushes: Vec<(ReqId, bool, u64)>,
    /// Direct patch writes completed (and their patch sets dropped) since the
    /// last backing FLUSH was issued: the next client FLUSH issues one first.
    direct_unflushed: bool,
    /// Backing FLUSHes in flight for `direct_unflushed` writes.
    direct_cover_inflight: u32,
    /// Admission policy; the state below is kept only when it can reject
    /// writes (`bypassing`), so the `all` fast path pays nothing.
    admission: Box<dyn Admission>,
    bypassing: bool,
    /// Bypass writes in flight: block -> (piece, backing write).
    bypass_io: IdMap<u32, (u32, IoId)>,
    /// Bypass pieces started in this `progress` round, not yet emitted:
    /// adjacent pieces of one request become one backing write.
    bypass_batch: Vec<(u32, u32)>,
    /// Write-through pieces started in this `progress` round, not yet
    /// emitted: (piece, FUA). Adjacent pieces of one request become one backing write.
    through_batch: Vec<(u32, bool)>,
    /// The write piece holding each busy block (the blocking object a
    /// waiter's dependency chain follows).
    holders: IdMap<u32, u32>,
    /// Blocks with a released version whose entry a durable (or in-flight)
    /// commit may still name, and the count: recovery could bring such a
    /// version back, so the block must not be bypassed until a commit frees
    /// the entry. `retired_lbn` maps each such slot to its block.
    retired_lbns: HashMap<u64, u32>,
    retired_lbn: IdMap<u32, u64>,
}

/// The engine's view offered to write policies while they plan.
struct View<'a> {
    now: u64,
    repl: &'a mut dyn Replacement,
    blocks: &'a [Block],
    slots: &'a [Slot],
    groups: &'a [Group],
    rid_block: &'a [u32],
    wanted: bool,
    pressure: bool,
    inflight: usize,
    limit: usize,
    ids: Vec<BlockId>,
}

impl PlanCtx for View<'_> {
    fn now(&self) -> u64 {
        self.now
    }
    fn cleaning_wanted(&self) -> bool {
        self.wanted
    }
    fn pick_victims(&mut self, max: usize, out: &mut Vec<(u32, Group)>) {
        let blocks = self.blocks;
        let slots = self.slots;
        let groups = self.groups;
        let rid_block = self.rid_block;
        let busy = |id: BlockId| {
            let b = &blocks[rid_block[id.0 as usize] as usize];
            if b.busy || b.latest == NIL {
                return true;
            }
            if b.destaging > 0 {
                return true;
            }
            let s = &slots[b.latest as usize];
            // A version outside any group (ordered: already written in its wave)
            // is re-synced only once no older version of its block is left.
            let g = groups.get(b.latest as usize).copied().unwrap_or(NO_GROUP);
            s.destaging() || !s.dirty() || (g == NO_GROUP && b.shadows > 0)
        };
        self.ids.clear();
        self.repl.clean_batch(max, &busy, &mut self.ids);
        for id in &self.ids {
            let b = &blocks[rid_block[id.0 as usize] as usize];
            if !busy(*id) {
                out.push((
                    b.latest,
                    groups.get(b.latest as usize).copied().unwrap_or(NO_GROUP),
                ));
            }
        }
    }
    fn space_pressure(&self) -> bool {
        self.pressure
    }
    fn destage_in_flight(&self) -> usize {
        self.inflight
    }
    fn destage_limit(&self) -> usize {
        self.limit
    }
}

impl<P: Payload> Engine<P> {
    /// An engine over a freshly formatted cache device.
    pub fn new(cfg: Config) -> Result<Self, ConfigError> {
        cfg.validate()?;
        Ok(Self::build(cfg))
    }

    fn build(cfg: Config) -> Self {
        let cap = cfg.capacity_blocks as usize;
        let layout = Layout::new(&cfg);
        let policy = write_policy::build(&cfg);
        let repl = nvwc_replacement::build(cfg.replacement, cfg.capacity_blocks as usize);
        let bs = cfg.block_size as u64;
        // Pieces in progress; also bounds the reads of one block in flight (u16).
        let max_active = ((cap / 4) as u32).clamp(4, u16::MAX as u32);
        let admission = admission::build(cfg.admission, &cfg.wal_ranges);
        let bypassing = cfg.admission != AdmissionKind::All;
        Engine {
            admission,
            bypassing,
            bypass_io: IdMap::default(),
            bypass_batch: Vec::new(),
            through_batch: Vec::new(),
            holders: IdMap::default(),
            retired_lbns: HashMap::new(),
            retired_lbn: IdMap::default(),
            layout,
            bs,
            policy,
            repl,
            slots: vec![Slot::free(); cap],
            groups: if matches!(
                cfg.write_policy,
                WritePolicyKind::Ordered
                    | WritePolicyKind::Journaled
                    | WritePolicyKind::JournaledHints
            ) {
                vec![NO_GROUP; cap]
            } else {
                Vec::new()
            },
            ranges: if cfg.write_policy == WritePolicyKind::Ordered {
                vec![(0, 0); cap]
            } else {
                Vec::new()
            },
            free_slots: FreeSet::new(cap, true),
            retired_pending: 0,
            index: LbnIndex::with_capacity(cap),
            blocks: Vec::new(),
            free_blocks: FreeSet::default(),
            rid_block: vec![NIL; cap],
            free_rids: FreeSet::new(cap, true),
            waiters: IdMap::default(),
            reqs: IdMap::default(),
            pieces: Slab::default(),
            piece_queue: VecDeque::new(),
            active_pieces: 0,
            max_active,
            alloc_waiters: VecDeque::new(),
            admit_queue: VecDeque::new(),
            reserved: 0,
            ios: IdMap::default(),
            next_io: 1,
            out_io: VecDeque::new(),
            out_reply: VecDeque::new(),
            out_event: VecDeque::new(),
            meta_dirty: Vec::new(),
            page_cur: vec![2; layout.pages() as usize],
            inplace_inflight: 0,
            commit_deferred: false,
            unsynced_overwrites: false,
            oldest_change: None,
            commit: None,
            log: LogState::fresh(),
            commit_waiters: Vec::new(),
            commit_asap: false,
            next_commit: 1,
            durable_commit: 0,
            plans: Slab::default(),
            plan_flush_inflight: None,
            plan_flush_next: None,
            destage_inflight: 0,
            cleaning_active: false,
            retry_at: None,
            drain: false,
            shutting_down: false,
            next_seq: 1,
            dirty_slots: 0,
            now: 0,
            stats: Stats::default(),
            patches: IdMap::default(),
            partial: IdMap::default(),
            partial_ok: true,
            patch_order: BTreeSet::new(),
            patch_bytes: 0,
            next_patch_id: 1,
            patch_bg: VecDeque::new(),
            patch_bg_inflight: 0,
            patch_retry: Vec::new(),
            patch_barrier: false,
            patch_flushes: Vec::new(),
            direct_unflushed: false,
            direct_cover_inflight: 0,
            cfg,
        }
    }

    /// Open an existing cache device from its metadata regions.
    ///
    /// `data_crc(offset, len)` MUST return the CRC-32C ([`layout::data_crc`])
    /// of the cache device's bytes at `offset..offset + len`: recovery
    /// checks the data that the log's unsealed records name (a few blocks).
    pub fn recover(
        cfg: Config,
        image: &CacheImage,
        data_crc: &mut dyn FnMut(u64, u32) -> Result<u32, String>,
    ) -> Result<(Self, RecoveryReport), RecoverError> {
        cfg.validate()?;
        let sb = layout::Superblock::decode(&image.superblock)?;
        layout::check_superblock(&sb, &cfg)?;
        let ra = CommitRecord::decode(&image.commit_a);
        let rb = CommitRecord::decode(&image.commit_b);
        let (rec, cr_cur) = match (ra, rb) {
            (Some(a), Some(b)) => {
                if a.commit >= b.commit {
                    (a, 0)
                } else {
                    (b, 1)
                }
            }
            (Some(a), None) => (a, 0),
            (None, Some(b)) => (b, 1),
            (None, None) => return Err(FormatError::NoCommit.into()),
        };
        let mut e = Self::build(cfg);
        e.partial_ok = sb.version >= 2;
        let l = e.layout;
        if (image.table.len() as u64) < l.table_bytes || (image.log.len() as u64) < l.log_bytes {
            return Err(FormatError::Short.into());
        }
        let mut report = RecoveryReport {
            commit: rec.commit,
            clean_shutdown: rec.clean_shutdown,
            ..Default::default()
        };
        let mut versions: Vec<RecoveredVersion> = Vec::new();
        let mut max_tag = rec.commit;
        let mut max_seq = 0u64;
        let mut stale: Vec<u32> = Vec::new();
        let mut rewrite_pages: Vec<u64> = Vec::new();
        let mut chosen: Vec<Option<usize>> = vec![None; l.pages() as usize];
        for pg in 0..l.pages() {
            let mut best: Option<(u64, u8)> = None;
            for c in 0..2u8 {
                let at = (2 * pg + c as u64) as usize * layout::PAGE_BYTES as usize;
                let Some(tag) =
                    layout::page_tag(pg, &image.table[at..at + layout::PAGE_BYTES as usize])
                else {
                    continue;
                };
                max_tag = max_tag.max(tag);
                if tag > rec.commit {
                    // Written by a commit that never completed: ignored, and
                    // rewritten before any later commit could make its tag valid.
                    report.ignored_uncommitted += 1;
                    rewrite_pages.push(pg);
                    continue;
                }
                if best.is_none_or(|b| tag > b.0) {
                    best = Some((tag, c));
                }
            }
            if let Some((_, c)) = best {
                e.page_cur[pg as usize] = c;
                chosen[pg as usize] =
                    Some((2 * pg + c as u64) as usize * layout::PAGE_BYTES as usize);
            }
        }
        let mut table: Vec<Option<Entry>> = (0..l.capacity as u32)
            .map(|s| {
                let pg = s as u64 / layout::ENTRIES_PER_PAGE;
                let base = chosen[pg as usize]?;
                let at = base + 64 + (s as u64 % layout::ENTRIES_PER_PAGE) as usize * 64;
                Entry::decode(s, &image.table[at..at + 64])
            })
            .collect();
        let replay = replay_log(&l, &image.log, &rec, data_crc)?;
        e.log = LogState::recovered(rec.commit, cr_cur);
        let mut rec = rec;
        for r in &replay.accepted {
            for &(s, ent) in &r.entries {
                table[s as usize] = Some(ent);
                e.log.page_changed(s as u64 / layout::ENTRIES_PER_PAGE);
            }
            rec = r.record;
        }
        max_tag = max_tag.max(replay.max_n);
        report.log_records = replay.accepted.len() as u64;
        report.log_dropped = replay.dropped.len() as u64;
        if !replay.accepted.is_empty() {
            report.commit = rec.commit;
            report.clean_shutdown = false;
        }
        for (s, ent) in table.iter().enumerate() {
            let s = s as u32;
            let Some(ent) = *ent else {
                continue;
            };
            if ent.flags & F_VALID == 0 {
                continue;
            }
            if ent.lbn >= e.cfg.backing_blocks() {
                stale.push(s);
                continue;
            }
            max_seq = max_seq.max(ent.seq);
            versions.push(RecoveredVersion {
                slot: s,
                lbn: ent.lbn,
                seq: ent.seq,
                aux0: ent.aux0,
                aux1: ent.aux1,
                lo: ent.lo,
                hi: ent.hi,
                dirty: ent.flags & F_DIRTY != 0,
                partial: ent.flags & F_PARTIAL != 0,
                latest: false,
                group: NO_GROUP,
                discard: false,
                clean: false,
            });
        }
        // Versions named only by dropped records: sequence numbers stay above them.
        for r in &replay.dropped {
            for (_, ent) in &r.entries {
                if ent.flags & F_VALID != 0 {
                    max_seq = max_seq.max(ent.seq);
                }
            }
        }
        let any_dirty = versions.iter().any(|v| v.dirty);
        if any_dirty && sb.write_policy != e.cfg.write_policy.code() {
            return Err(FormatError::Policy {
                found: layout::policy_name(sb.write_policy),
            }
            .into());
        }
        // Latest version per block: the highest sequence number.
        let mut newest: HashMap<u64, (u64, usize)> = HashMap::new();
        for (i, v) in versions.iter().enumerate() {
            let n = newest.entry(v.lbn).or_insert((v.seq, i));
            if v.seq > n.0 {
                *n = (v.seq, i);
            }
        }
        for &(_, i) in newest.values() {
            versions[i].latest = true;
        }
        e.policy.recover(&rec, &mut versions);
        // A discarded latest version hands "latest" to the newest survivor.
        let mut survivor: HashMap<u64, (u64, usize)> = HashMap::new();
        for (i, v) in versions.iter().enumerate() {
            if !v.discard {
                let n = survivor.entry(v.lbn).or_insert((v.seq, i));
                if v.seq > n.0 {
                    *n = (v.seq, i);
                }
            }
        }
        e.free_slots.clear();
        let mut used = vec![false; l.capacity as usize];
        for (i, v) in versions.iter().enumerate() {
            let s = v.slot;
            used[s as usize] = true;
            let is_latest = survivor.get(&v.lbn).map(|&(_, j)| j == i).unwrap_or(false);
            let dirty = v.dirty && !v.clean;
            let keep = !v.discard && (is_latest || dirty);
            e.set_range(s, (v.lo, v.hi));
            let slot = &mut e.slots[s as usize];
            slot.seq = v.seq;
            slot.set_disk_valid(true);
            if !keep {
                slot.state = SlotState::Retired;
                e.retired_pending += 1;
                report.discarded += 1;
                e.mark_meta(s);
                continue;
            }
            slot.state = SlotState::Valid;
            slot.set_dirty(dirty);
            if v.partial {
                assert!(
                    v.lo < v.hi && v.hi as u64 <= e.bs,
                    "partial entry with a bad range"
                );
                e.partial.insert(s, (v.lo, v.hi));
            }
            e.set_group(s, if dirty { v.group } else { NO_GROUP });
            if dirty {
                e.dirty_slots += 1;
                report.dirty_versions += 1;
                // The policy registered the version with its group in `recover`.
                // A version whose entry no longer says what the policy made
                // of it (journaled: an uncommitted transaction merged into
                // the open one) gets its entry rewritten at the next commit:
                // a stale transaction id left on a page no other change
                // rewrote would later read as a committed, even checkpointed,
                // transaction (the VOPR's second crash on a large cache found
                // it: journaled-hints seed 224).
                if e.policy.entry_aux(v.group) != (v.aux0, v.aux1) {
                    e.mark_meta(s);
                }
            } else {
                report.clean_versions += 1;
                if v.dirty {
                    e.mark_meta(s);
                }
            }
            let b = e.block_for(v.lbn);
            e.slots[s as usize].block = b;
            if !is_latest {
                e.slots[s as usize].set_shadow(true);
                e.blocks[b as usize].shadows += 1;
            }
            if is_latest {
                e.blocks[b as usize].latest = s;
                let rid = e.free_rids.pop().expect("more cached blocks than slots");
                e.rid_block[rid as usize] = b;
                e.blocks[b as usize].rid = rid;
                e.repl.insert(BlockId(rid), v.lbn, dirty);
            }
        }
        // Slots whose entries recovery drops stay unused until a commit has
        // written them free: stale entries, and the slots a dropped log
        // record names (new data there could make that record's checksums
        // match at a second recovery, bringing back writes this recovery
        // left out).
        let dropped = replay
            .dropped
            .iter()
            .flat_map(|r| r.entries.iter().map(|&(s, _)| s));
        for s in stale.into_iter().chain(dropped) {
            if used[s as usize] {
                continue;
            }
            used[s as usize] = true;
            let slot = &mut e.slots[s as usize];
            slot.state = SlotState::Retired;
            slot.set_disk_valid(true);
            e.retired_pending += 1;
            e.mark_meta(s);
        }
        for s in (0..l.capacity as u32).rev() {
            if !used[s as usize] {
                e.free_slots.push(s);
            }
        }
        for pg in rewrite_pages {
            let s = (pg * layout::ENTRIES_PER_PAGE) as u32;
            e.mark_meta(s);
        }
        e.next_commit = max_tag + 1;
        e.durable_commit = rec.commit;
        e.next_seq = rec.next_seq.max(max_seq + 1);
        // The first commit is a checkpoint; until it is durable the recovered
        // versions count as unsealed (an unsealed record among them is
        // checked again if the device crashes before it).
        for s in 0..l.capacity as u32 {
            let slot = &mut e.slots[s as usize];
            if slot.state == SlotState::Valid {
                slot.set_unsealed(true);
                let seq = slot.seq;
                e.log.note_unsealed(e.next_commit, s, seq);
            }
        }
        e.commit_asap = !e.meta_dirty.is_empty() || !replay.accepted.is_empty();
        Ok((e, report))
    }

    // ----------------------------------------------------------------- outputs

    /// Next device command.
    pub fn poll_io(&mut self) -> Option<IoCmd<P>> {
        self.out_io.pop_front()
    }
    /// Next client reply.
    pub fn poll_reply(&mut self) -> Option<Reply<P>> {
        self.out_reply.pop_front()
    }
    /// Next event.
    pub fn poll_event(&mut self) -> Option<Event> {
        while let Some(e) = self.policy.poll_event() {
            self.out_event.push_back(Event::Policy(e));
        }
        self.out_event.pop_front()
    }
    /// When the engine next wants [`Engine::handle_timeout`].
    ///
    /// A commit deadline (autocommit age, or a commit wanted at once) is
    /// left out while a commit cannot start: one is in flight, an in-place
    /// write is, or the commit waits for patches it already started to turn
    /// into versions (`patch_barrier`). The
    /// completion that unblocks it starts the commit, so a driver that calls
    /// `handle_timeout` at each deadline never meets a deadline that stays
    /// due at an instant while the engine waits for a device (it spun there).
    ///
    /// During a retry backoff (`retry_at`) no destage plan starts, so the
    /// write policy's deadline counts from the end of the backoff.
    pub fn poll_timeout(&self) -> Option<u64> {
        let mut d = self
            .policy
            .deadline()
            .map(|t| self.retry_at.map_or(t, |r| t.max(r)));
        let mut min = |x: u64| d = Some(d.map_or(x, |d: u64| d.min(x)));
        let commit_blocked = self.commit.is_some()
            || self.inplace_inflight > 0
            || self.patch_barrier
                && self.policy.commit_needs_patches_done()
                && !self.patches.is_empty();
        if self.commit_asap && !commit_blocked {
            min(self.now);
        }
        if let Some(t) = self.oldest_change.filter(|_| !commit_blocked) {
            min(t.saturating_add(self.cfg.autocommit_ns));
        }
        if let Some(t) = self.retry_at {
            min(t);
        }
        d
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        let mut s = self.stats.clone();
        s.dirty_blocks = self.dirty_slots;
        s.cached_blocks = self.cfg.capacity_blocks - self.free_rids.len() as u64;
        s.free_slots = self.free_slots.len() as u64;
        s.patched_blocks = self.patches.len() as u64;
        s.patch_bytes = self.patch_bytes;
        s
    }
    /// Policy-specific counters.
    pub fn policy_counters(&self) -> Vec<(&'static str, u64)> {
        self.policy.counters()
    }
    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }
    /// The cache device geometry.
    pub fn layout(&self) -> Layout {
        self.layout
    }
    /// Dirty versions in the cache, plus patched blocks (dirty data in RAM),
    /// plus one while direct patch writes wait for a backing FLUSH.
    pub fn dirty_versions(&self) -> u64 {
        self.dirty_slots
            + self.patches.len() as u64
            + u64::from(self.direct_unflushed || self.direct_cover_inflight > 0)
    }
    /// Highest durable commit.
    pub fn durable_commit(&self) -> u64 {
        self.durable_commit
    }
    /// Nothing in flight: no requests, no device commands, no plans, no commit.
    pub fn is_idle(&self) -> bool {
        self.reqs.is_empty()
            && self.admit_queue.is_empty()
            && self.ios.is_empty()
            && self.commit.is_none()
            && self.plans.is_empty()
            && (self.patches.is_empty() || !self.shutting_down)
    }
    /// Largest write (in bytes) the engine accepts: half the cache, so that a
    /// write can always reserve every slot it needs before it joins a
    /// transaction or node. Drivers advertise it (NBD maximum block size) or
    /// split larger writes.
    pub fn max_write_bytes(&self) -> u64 {
        (self.cfg.capacity_blocks / 2).max(1) * self.bs
    }

    /// A one-line summary of queues and counts, for logs and debugging.
    pub fn debug_state(&self) -> String {
        format!(
            "reqs={} admit_queue={} reserved={} piece_queue={} active={} alloc_waiters={} free={} retired_pending={} dirty={} cached={} ios={} plans={} destage_inflight={} commit={:?} commit_waiters={} meta_dirty={} inplace={} deferred={} policy={:?}",
            self.reqs.len(),
            self.admit_queue.len(),
            self.reserved,
            self.piece_queue.len(),
            self.active_pieces,
            self.alloc_waiters.len(),
            self.free_slots.len(),
            self.retired_pending,
            self.dirty_slots,
            self.index.len(),
            self.ios.len(),
            self.plans.len(),
            self.destage_inflight,
            self.commit.as_ref().map(|c| (c.n, c.stage)),
            self.commit_waiters.len(),
            self.meta_dirty.len(),
            self.inplace_inflight,
            self.commit_deferred,
            self.policy.counters(),
        )
    }

    /// Requests in flight.
    pub fn requests_in_flight(&self) -> usize {
        self.reqs.len()
    }
    /// Bytes of RAM used by the engine's per-block state (slots, blocks, index, replacement, policy).
    pub fn mem_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.groups.capacity() * std::mem::size_of::<Group>()
            + self.ranges.capacity() * 8
            // Partial versions: key, range, and about one control byte.
            + self.partial.capacity() * 13
            + self.blocks.capacity() * std::mem::size_of::<Block>()
            + self.index.mem_bytes()
            + self.free_slots.mem_bytes()
            + self.free_blocks.mem_bytes()
            + self.free_rids.mem_bytes()
            + self.rid_block.capacity() * 4
            + self.repl.mem_bytes()
            + self.policy.mem_bytes()
    }

    // ------------------------------------------------------------------ inputs

    /// A client request arrives.
    pub fn handle_request(&mut self, now: u64, req: Request<P>) {
        self.set_now(now);
        self.stats.requests += 1;
        if self.shutting_down {
            self.reply(req.id, Err(ReqError::Shutdown), 0);
            return;
        }
        assert!(
            !self.reqs.contains_key(&req.id),
            "request id {} reused while in flight",
            req.id
        );
        match req.op {
            ReqOp::Read { offset, len } => {
                self.stats.reads += 1;
                self.stats.read_bytes += len as u64;
                if !self.in_range(offset, len as u64) {
                    return self.reply(req.id, Err(ReqError::InvalidRange), 0);
                }
                if len == 0 {
                    return self.reply_data(req.id, P::zeroes(0));
                }
                self.start_rw(
                    req.id, offset, len as u64, None, false, req.tag, false, true,
                );
            }
            ReqOp::Write { offset, data, fua } => {
                self.stats.writes += 1;
                self.stats.write_bytes += data.len() as u64;
                if !self.in_range(offset, data.len() as u64) {
                    return self.reply(req.id, Err(ReqError::InvalidRange), 0);
                }
                let len = data.len() as u64;
                if len == 0 {
                    return self.reply(req.id, Ok(None), 0);
                }
                if self.spans(offset, len) > self.max_write_bytes() / self.bs {
                    return self.reply(req.id, Err(ReqError::TooLarge), 0);
                }
                self.admit_write(req.id, offset, len, data, fua, req.tag);
            }
            ReqOp::WriteZeroes { offset, len, fua } => {
                self.stats.writes += 1;
                self.stats.write_bytes += len as u64;
                if !self.in_range(offset, len as u64) {
                    return self.reply(req.id, Err(ReqError::InvalidRange), 0);
                }
                if len == 0 {
                    return self.reply(req.id, Ok(None), 0);
                }
                if self.spans(offset, len as u64) > self.max_write_bytes() / self.bs {
                    return self.reply(req.id, Err(ReqError::TooLarge), 0);
                }
                self.admit_write(
                    req.id,
                    offset,
                    len as u64,
                    P::zeroes(len as usize),
                    fua,
                    req.tag,
                );
            }
            ReqOp::Flush => {
                self.stats.flushes += 1;
                self.start_flush(req.id, false);
            }
            ReqOp::Checkpoint => {
                self.stats.flushes += 1;
                self.start_flush(req.id, true);
            }
            ReqOp::Trim { offset, len } => {
                self.stats.trims += 1;
                if !self.in_range(offset, len as u64) {
                    return self.reply(req.id, Err(ReqError::InvalidRange), 0);
                }
                self.start_trim(req.id, offset, len);
            }
        }
        self.progress();
    }

    /// A device command completed.
    ///
    /// # Panics
    /// If `id` is not a command in flight (a driver bug).
    pub fn handle_completion(&mut self, now: u64, id: IoId, res: IoResult<P>) {
        self.set_now(now);
        let ctx = self
            .ios
            .remove(&id)
            .unwrap_or_else(|| panic!("completion for unknown I/O {id}"));
        if res.is_err() {
            self.stats.io_errors += 1;
        }
        match ctx {
            IoCtx::ReadHit { piece } => self.on_read_hit(piece, res),
            IoCtx::ReadMiss { piece, full } => self.on_read_miss(piece, full, res),
            IoCtx::RmwRead { piece, from_cache } => self.on_rmw_read(piece, from_cache, res),
            IoCtx::PieceCacheWrite { piece, inplace } => {
                self.on_piece_cache_write(piece, inplace, res.is_ok())
            }
            IoCtx::ThroughWrite { pieces } => {
                for piece in pieces {
                    self.on_piece_io_done(piece, res.is_ok());
                }
            }
            IoCtx::BypassWrite { pieces, orphans } => {
                for (piece, block) in pieces {
                    self.bypass_io.remove(&block);
                    self.on_piece_io_done(piece, res.is_ok());
                }
                for block in orphans {
                    self.on_orphan_done(block);
                }
            }
            IoCtx::Fill { block, slot } => self.on_fill(block, slot, res.is_ok()),
            IoCtx::DestageRead {
                plan,
                slot,
                block,
                lo,
            } => self.on_destage_read(plan, slot, block, lo, res),
            IoCtx::DestageWrite { plan } => self.on_destage_write(plan, res.is_ok()),
            IoCtx::PlanBegin { plan } => self.on_plan_begin(plan, res.is_ok()),
            IoCtx::PlanFinish { plan } => self.on_plan_finish(plan, res.is_ok()),
            IoCtx::PlanFlush => self.on_plan_flush(res.is_ok()),
            IoCtx::Commit => self.on_commit_io(res.is_ok()),
            IoCtx::CommitChecksum { entry } => self.on_commit_checksum(entry, res),
            IoCtx::PatchFetch { block, id, bg } => self.on_patch_fetch(block, id, bg, res),
            IoCtx::PatchInstall {
                block,
                slot,
                took,
                partial,
            } => self.on_patch_install(block, slot, took, partial, res.is_ok()),
            IoCtx::SplitRead { piece, lo, hi } => self.on_split_read(piece, lo, hi, res),
            IoCtx::SplitCache { piece, at } => self.on_split_cache(piece, at, res),
            IoCtx::RmwFetch { piece, lo, hi } => self.on_rmw_fetch(piece, lo, hi, res),
            IoCtx::RmwMerge { piece, lo } => self.on_rmw_merge(piece, lo, res),
            IoCtx::DirectCover { req } => self.on_direct_cover(req, res.is_ok()),
            IoCtx::PatchDirect {
                block,
                id,
                bg,
                took,
            } => self.on_patch_direct(block, id, bg, took, res.is_ok()),
            IoCtx::ReqBacking { req } => {
                let r: Result<Option<P>, ReqError> = if res.is_ok() {
                    Ok(None)
                } else {
                    Err(ReqError::Io)
                };
                self.reply(req, r, 0);
            }
        }
        self.progress();
    }

    /// Time passed (call at or after [`Engine::poll_timeout`]).
    pub fn handle_timeout(&mut self, now: u64) {
        self.set_now(now);
        self.policy.on_timeout(now);
        if matches!(self.retry_at, Some(t) if t <= now) {
            self.retry_at = None;
        }
        self.progress();
    }

    /// A critical waiter depends on client request `id` (which the driver
    /// issued earlier and which has not completed): I/O criticality
    /// inheritance for dependencies the engine cannot see, such as a process
    /// waiting for a page under writeback (the simulator's application
    /// model). The request's bypass writes in flight are reissued to the
    /// cache when the admission policy reissues; its pieces not started yet
    /// are cached rather than bypassed and count as critical. Does nothing
    /// for an unknown or finished request.
    pub fn inherit_request(&mut self, now: u64, id: ReqId) {
        self.set_now(now);
        if !self.bypassing || !self.reqs.contains_key(&id) {
            return;
        }
        let queued: Vec<u32> = self
            .piece_queue
            .iter()
            .chain(self.waiters.values().flatten())
            .copied()
            .filter(|&p| self.pieces.get(p).req == id)
            .collect();
        for p in queued {
            let pc = self.pieces.get_mut(p);
            pc.critical = true;
            if self.admission.reissue() && pc.bypass {
                pc.bypass = false;
                // Now cached: a FUA reply waits for a commit.
                self.reqs.get_mut(&id).expect("checked above").cached = true;
            }
        }
        let inflight: Vec<u32> = self
            .bypass_io
            .iter()
            .filter(|(_, &(p, _))| self.pieces.get(p).req == id)
            .map(|(&b, _)| b)
            .collect();
        for b in inflight {
            self.inherit(b);
        }
        self.progress();
    }

    /// Write back everything dirty (`nvwc flush`, `nvwc detach`); see [`Engine::dirty_versions`].
    pub fn start_drain(&mut self, now: u64) {
        self.set_now(now);
        self.drain = true;
        self.policy.on_consistency_point(now, true);
        self.materialize_all();
        self.progress();
    }

    /// The drain the driver asked for is over (it saw `dirty_versions() == 0`
    /// with the engine idle): back to the write policy's usual destaging.
    /// Without this, every later write would be destaged at once.
    pub fn end_drain(&mut self) {
        self.drain = false;
    }

    /// Begin a clean shutdown: new requests fail with `Shutdown`; once nothing is
    /// in flight a final commit records a clean shutdown. Done when [`Engine::is_idle`].
    pub fn start_shutdown(&mut self, now: u64) {
        self.set_now(now);
        self.shutting_down = true;
        self.commit_asap = true;
        self.materialize_all();
        self.progress();
    }

    // ---------------------------------------------------------------- helpers

    fn set_now(&mut self, now: u64) {
        debug_assert!(now >= self.now, "time went backwards");
        self.now = self.now.max(now);
    }

    /// Number of cache blocks a byte range touches (`len > 0`).
    fn spans(&self, offset: u64, len: u64) -> u64 {
        (offset + len - 1) / self.bs - offset / self.bs + 1
    }

    fn in_range(&self, offset: u64, len: u64) -> bool {
        offset
            .checked_add(len)
            .is_some_and(|e| e <= self.cfg.backing_size)
    }

    fn reply(&mut self, id: ReqId, result: Result<Option<P>, ReqError>, seq: u64) {
        self.out_reply.push_back(Reply { id, result, seq });
    }

    fn reply_data(&mut self, id: ReqId, data: P) {
        self.out_reply.push_back(Reply {
            id,
            result: Ok(Some(data)),
            seq: 0,
        });
    }

    fn emit(&mut self, dev: Dev, op: IoOp<P>, group: Option<u64>, ctx: IoCtx) -> IoId {
        let id = self.next_io;
        self.next_io += 1;
        let s = &mut self.stats;
        match (&op, dev) {
            (IoOp::Read { len, .. }, Dev::Cache) => {
                s.cache_reads += 1;
                s.cache_read_bytes += *len as u64;
            }
            (IoOp::Read { len, .. }, Dev::Backing) => {
                s.backing_reads += 1;
                s.backing_read_bytes += *len as u64;
            }
            (IoOp::Write { data, .. }, Dev::Cache) => {
                s.cache_writes += 1;
                s.cache_write_bytes += data.len() as u64;
            }
            (IoOp::Write { data, .. }, Dev::Backing) => {
                s.backing_writes += 1;
                s.backing_write_bytes += data.len() as u64;
            }
            (IoOp::Flush, Dev::Cache) => s.cache_flushes += 1,
            (IoOp::Flush, Dev::Backing) => s.backing_flushes += 1,
            (IoOp::GroupEnd { .. }, _) => s.backing_groups += 1,
            _ => {}
        }
        self.ios.insert(id, ctx);
        self.out_io.push_back(IoCmd { id, dev, op, group });
        id
    }

    fn block_for(&mut self, lbn: u64) -> u32 {
        if let Some(b) = self.index.get(lbn, |id| self.blocks[id as usize].lbn()) {
            return b;
        }
        let blk = Block::new(lbn);
        let b = if let Some(b) = self.free_blocks.pop() {
            self.blocks[b as usize] = blk;
            b
        } else {
            self.blocks.push(blk);
            (self.blocks.len() - 1) as u32
        };
        self.index
            .insert(lbn, b, |id| self.blocks[id as usize].lbn());
        b
    }

    fn group_of(&self, s: u32) -> Group {
        self.groups.get(s as usize).copied().unwrap_or(NO_GROUP)
    }

    fn set_group(&mut self, s: u32, g: Group) -> Group {
        match self.groups.get_mut(s as usize) {
            Some(x) => std::mem::replace(x, g),
            None => {
                debug_assert_eq!(g, NO_GROUP, "policy without groups got a group");
                NO_GROUP
            }
        }
    }

    fn range_of(&self, s: u32) -> (u32, u32) {
        self.ranges
            .get(s as usize)
            .copied()
            .unwrap_or((0, self.bs as u32))
    }

    fn set_range(&mut self, s: u32, r: (u32, u32)) {
        if let Some(x) = self.ranges.get_mut(s as usize) {
            *x = r;
        }
    }

    /// The block number a valid version belongs to.
    fn lbn_of(&self, s: u32) -> u64 {
        let b = self.slots[s as usize].block;
        assert!(b != NIL, "slot {s} has no block");
        self.blocks[b as usize].lbn()
    }

    /// A read of the cache device (outside any atomic group).
    fn cache_read(&mut self, offset: u64, len: u32, ctx: IoCtx) -> IoId {
        self.emit(Dev::Cache, IoOp::Read { offset, len }, None, ctx)
    }

    /// A read of the backing store (outside any atomic group).
    fn backing_read(&mut self, offset: u64, len: u32, ctx: IoCtx) -> IoId {
        self.emit(Dev::Backing, IoOp::Read { offset, len }, None, ctx)
    }

    /// A plain (non-FUA) write to the cache device.
    fn cache_write(&mut self, offset: u64, data: P, ctx: IoCtx) -> IoId {
        let op = IoOp::Write {
            offset,
            data,
            fua: false,
        };
        self.emit(Dev::Cache, op, None, ctx)
    }

    /// The block entry of `lbn`. Caller guarantees it exists.
    fn block_of(&self, lbn: u64) -> u32 {
        self.index
            .get(lbn, |id| self.blocks[id as usize].lbn())
            .expect("block entry exists")
    }

    fn maybe_drop_block(&mut self, b: u32) {
        let blk = &self.blocks[b as usize];
        if blk.latest == NIL
            && !blk.busy
            && blk.readers() == 0
            && blk.shadows == 0
            && blk.destaging == 0
            && !self.waiters.contains_key(&b)
            && !self.patches.contains_key(&b)
        {
            debug_assert_eq!(blk.rid, NIL);
            let lbn = blk.lbn();
            self.index.remove(lbn, |id| self.blocks[id as usize].lbn());
            self.free_blocks.push(b);
        }
    }

    fn mark_meta(&mut self, s: u32) {
        let slot = &mut self.slots[s as usize];
        if !slot.in_meta_dirty() {
            slot.set_in_meta_dirty(true);
            self.meta_dirty.push(s);
        }
        if self.oldest_change.is_none() {
            self.oldest_change = Some(self.now);
        }
    }

    /// Allocate a slot for a version of block `lbn`: its home slot
    /// (`lbn mod capacity`) if free, else any. Homes keep neighbouring blocks
    /// in neighbouring slots whatever order they were first written in, so a
    /// later large write of them is one device write rather than one per
    /// block (the server merges adjacent slot writes).
    fn alloc_slot(&mut self, lbn: u64) -> Option<u32> {
        let home = (lbn % self.layout.capacity) as u32;
        let s = if self.free_slots.take(home) {
            home
        } else {
            self.free_slots.pop()?
        };
        let slot = &mut self.slots[s as usize];
        assert_eq!(
            slot.state,
            SlotState::Free,
            "allocated a slot that is not free"
        );
        assert!(!slot.disk_valid() && !slot.in_snapshot() && slot.refs == 0);
        slot.state = SlotState::Writing;
        Some(s)
    }

    /// Return a never-valid slot (a failed or abandoned write) to the free list.
    fn unalloc_slot(&mut self, s: u32) {
        let slot = &mut self.slots[s as usize];
        assert_eq!(slot.state, SlotState::Writing);
        slot.state = SlotState::Free;
        self.free_slots.push(s);
        self.partial.remove(&s);
    }

    /// Release a version: it stops being readable; the slot is reused once no
    /// read holds it and no durable entry names it.
    fn retire(&mut self, s: u32) {
        let slot = &mut self.slots[s as usize];
        assert_eq!(
            slot.state,
            SlotState::Valid,
            "retiring a slot that is not valid"
        );
        slot.state = SlotState::Retired;
        self.partial.remove(&s);
        let slot = &mut self.slots[s as usize];
        let owner = std::mem::replace(&mut slot.block, NIL);
        let was_shadow = slot.shadow();
        slot.set_shadow(false);
        if slot.dirty() {
            slot.set_dirty(false);
            self.dirty_slots -= 1;
        }
        let (disk_valid, in_snapshot) = (slot.disk_valid(), slot.in_snapshot());
        if self.bypassing && (disk_valid || in_snapshot) && owner != NIL {
            let lbn = self.blocks[owner as usize].lbn();
            *self.retired_lbns.entry(lbn).or_default() += 1;
            self.retired_lbn.insert(s, lbn);
        }
        let g = self.set_group(s, NO_GROUP);
        if g != NO_GROUP {
            self.policy.on_version_removed(g, s);
        }
        if disk_valid || in_snapshot {
            self.retired_pending += 1;
            self.mark_meta(s);
        } else {
            self.try_release(s);
        }
        if was_shadow {
            self.blocks[owner as usize].shadows -= 1;
            self.maybe_drop_block(owner);
        }
    }

    fn is_latest(&self, s: u32) -> bool {
        let b = self.slots[s as usize].block;
        b != NIL && self.blocks[b as usize].latest == s
    }

    fn try_release(&mut self, s: u32) {
        let slot = &mut self.slots[s as usize];
        if slot.state == SlotState::Retired
            && slot.refs == 0
            && !slot.disk_valid()
            && !slot.in_snapshot()
        {
            slot.state = SlotState::Free;
            slot.set_unsealed(false);
            self.free_slots.push(s);
            if self.bypassing {
                if let Some(lbn) = self.retired_lbn.remove(&s) {
                    let n = self
                        .retired_lbns
                        .get_mut(&lbn)
                        .expect("retired block count");
                    *n -= 1;
                    if *n == 0 {
                        self.retired_lbns.remove(&lbn);
                    }
                }
            }
        }
    }

    fn unref(&mut self, s: u32) {
        let slot = &mut self.slots[s as usize];
        assert!(slot.refs > 0);
        slot.refs -= 1;
        self.try_release(s);
    }

    /// Remove a block's (clean) latest version from the cache.
    fn evict_block(&mut self, b: u32) {
        let s = self.blocks[b as usize].latest;
        assert!(s != NIL);
        let rid = self.blocks[b as usize].rid;
        self.repl.remove(BlockId(rid));
        self.rid_block[rid as usize] = NIL;
        self.free_rids.push(rid);
        let blk = &mut self.blocks[b as usize];
        blk.rid = NIL;
        blk.latest = NIL;
        self.retire(s);
        self.maybe_drop_block(b);
    }

    // ------------------------------------------------------------- reads/writes

    /// Queue a write for admission. A write joins its write-policy group (node,
    /// transaction) only once the slots it may need are reserved, so it never
    /// waits for space while a group it belongs to waits for it (which would
    /// deadlock a journal transaction that must commit to free space).
    fn admit_write(&mut self, id: ReqId, offset: u64, len: u64, data: P, fua: bool, tag: Tag) {
        let first = offset / self.bs;
        let last = (offset + len - 1) / self.bs;
        let bypass = self.bypassing
            && !self.admission.admit(&WriteInfo {
                offset,
                len,
                fua,
                tag,
            });
        if bypass
            && matches!(
                self.policy.kind(),
                WritePolicyKind::WriteBack | WritePolicyKind::WriteThrough
            )
        {
            // No group to join and no slot to reserve: a piece that is cached
            // after all (its block is cached) takes a spare slot or waits for
            // one like any stalled writer, which write-back can always free.
            self.start_rw(id, offset, len, Some(data), fua, tag, true, true);
            return;
        }
        if bypass && self.journal_bypass_ok(first, last) {
            // Journaled: the write takes no transaction and runs now, ahead
            // of anything queued after it (see `journal_bypass_ok`).
            let pieces = self.start_rw(id, offset, len, Some(data), fua, tag, true, false);
            assert_eq!(self.piece_queue.len(), pieces.len());
            self.piece_queue.clear();
            for p in pieces {
                self.active_pieces += 1;
                self.start_piece(p);
            }
            return;
        }
        let need = if self.policy.synchronous_backing() {
            0
        } else {
            last - first + 1
        };
        // `admit` runs right after this and takes the queue in order: the
        // write waits exactly when others wait before it or space is short.
        let waits =
            !self.admit_queue.is_empty() || (self.free_slots.len() as u64) < self.reserved + need;
        if waits {
            self.stats.admission_stalls += 1;
        }
        self.admit_queue.push_back(Admit {
            id,
            tag,
            bypass,
            offset,
            len,
            data,
            fua,
            need,
            pieces: last - first + 1,
            stalled_since: waits.then_some(self.now),
        });
    }

    fn admit(&mut self) -> bool {
        let mut changed = false;
        while let Some(a) = self.admit_queue.front() {
            if (self.free_slots.len() as u64) < self.reserved + a.need {
                break;
            }
            let a = self.admit_queue.pop_front().unwrap();
            if let Some(since) = a.stalled_since {
                // A stall for cache space, counted like a piece waiting for
                // a slot (its pieces then have reservations and never wait again).
                self.stats.stalled_writes += a.pieces;
                self.stats.stall_ns += (self.now - since) * a.pieces;
            }
            let pieces = self.start_rw(
                a.id,
                a.offset,
                a.len,
                Some(a.data),
                a.fua,
                a.tag,
                a.bypass,
                true,
            );
            // The first `need` pieces each hold one reservation.
            for &k in pieces.iter().take(a.need as usize) {
                self.pieces.get_mut(k).reserved = true;
                self.reserved += 1;
            }
            changed = true;
        }
        changed
    }

    fn release_reservation(&mut self, p: u32) {
        let pc = self.pieces.get_mut(p);
        if std::mem::replace(&mut pc.reserved, false) {
            self.reserved -= 1;
        }
    }

    /// Split a request into block pieces and queue them; returns the pieces.
    /// A write joins its write-policy group unless `grouped` is false (a
    /// journaled bypass, `journal_bypass_ok`).
    #[allow(clippy::too_many_arguments)]
    fn start_rw(
        &mut self,
        id: ReqId,
        offset: u64,
        len: u64,
        data: Option<P>,
        fua: bool,
        tag: Tag,
        bypass: bool,
        grouped: bool,
    ) -> Vec<u32> {
        let write = data.is_some();
        let (seq, group) = if write && !grouped {
            assert!(bypass && self.policy.kind().journaled());
            // Decided by `admit_write` with `journal_bypass_ok`: the write
            // belongs to no transaction (and so has no sequence number: the
            // transactions' sequence ranges never cover it).
            (0, NO_GROUP)
        } else if write {
            let seq = self.next_seq;
            self.next_seq += 1;
            let g = if self.policy.synchronous_backing() {
                NO_GROUP
            } else {
                self.policy.on_write_issue(self.now, seq)
            };
            (seq, g)
        } else {
            (0, NO_GROUP)
        };
        let first = offset / self.bs;
        let last = (offset + len - 1) / self.bs;
        let n = (last - first + 1) as u32;
        let mut ids = Vec::with_capacity(n as usize);
        self.reqs.insert(
            id,
            Req {
                kind: if write { ReqKind::Write } else { ReqKind::Read },
                pieces_left: n,
                failed: None,
                parts: Vec::new(),
                offset,
                seq,
                group,
                fua,
                installed: Vec::new(),
                // A request the admission policy admitted is cached whole;
                // a rejected one only where a piece cannot bypass.
                cached: !bypass,
            },
        );
        for lbn in first..=last {
            let bstart = lbn * self.bs;
            let s = offset.max(bstart);
            let e = (offset + len).min(bstart + self.bs);
            let pdata = data
                .as_ref()
                .map(|d| d.slice((s - offset) as usize..(e - offset) as usize));
            let p = self.pieces.insert(Piece {
                reserved: false,
                bypass,
                critical: tag.critical,
                tag_critical: tag.critical,
                valid: None,
                counted: true,
                req: id,
                lbn,
                start: (s - bstart) as u32,
                end: (e - bstart) as u32,
                data: pdata,
                buf: None,
                slot: NIL,
                ios: 0,
                failed: false,
                stalled_since: None,
                seq,
                group,
                fua,
            });
            self.piece_queue.push_back(p);
            ids.push(p);
        }
        ids
    }

    fn start_piece(&mut self, p: u32) {
        let lbn = self.pieces.get(p).lbn;
        let b = self.block_for(lbn);
        if self.blocks[b as usize].busy {
            self.waiters.entry(b).or_default().push_back(p);
            if self.bypassing && self.pieces.get(p).critical {
                self.inherit(b);
            }
            return;
        }
        self.run_piece(p, b);
    }

    fn run_piece(&mut self, p: u32, b: u32) {
        if self.pieces.get(p).data.is_none() {
            self.read_piece(p, b);
        } else {
            let blk = &mut self.blocks[b as usize];
            blk.busy = true;
            if blk.readers() > 0 {
                blk.fill_stale = true;
            }
            if self.bypassing {
                self.holders.insert(b, p);
            }
            self.write_piece(p, b);
        }
    }

    fn read_piece(&mut self, p: u32, b: u32) {
        if self.blocks[b as usize].latest == NIL && self.patches.contains_key(&b) {
            return self.patch_read(p, b);
        }
        let blk = &self.blocks[b as usize];
        let (start, end, lbn) = {
            let pc = self.pieces.get(p);
            (pc.start, pc.end, pc.lbn)
        };
        if blk.latest != NIL {
            let s = blk.latest;
            if let Some(&(lo, hi)) = self.partial.get(&s) {
                if start < lo || end > hi {
                    return self.partial_read(p, s, lo, hi);
                }
            }
            let rid = blk.rid;
            self.stats.read_hits += 1;
            self.repl.touch(BlockId(rid), false);
            self.slots[s as usize].refs += 1;
            let pc = self.pieces.get_mut(p);
            pc.slot = s;
            pc.ios = 1;
            let off = self.layout.slot_offset(s) + start as u64;
            self.cache_read(off, end - start, IoCtx::ReadHit { piece: p });
        } else {
            self.stats.read_misses += 1;
            self.blocks[b as usize].add_reader();
            let full = self.cfg.read_allocate;
            let pc = self.pieces.get_mut(p);
            pc.ios = 1;
            let (off, len) = if full {
                (lbn * self.bs, self.bs as u32)
            } else {
                (lbn * self.bs + start as u64, end - start)
            };
            self.backing_read(off, len, IoCtx::ReadMiss { piece: p, full });
        }
    }

    fn on_read_hit(&mut self, p: u32, res: IoResult<P>) {
        let s = self.pieces.get(p).slot;
        self.unref(s);
        self.finish_read_piece(p, res.ok().flatten());
    }

    fn on_read_miss(&mut self, p: u32, full: bool, res: IoResult<P>) {
        let (lbn, start, end) = {
            let pc = self.pieces.get(p);
            (pc.lbn, pc.start, pc.end)
        };
        let b = self.block_of(lbn);
        // A write that started while this read was in flight makes its data unfit to cache.
        let stale = self.blocks[b as usize].fill_stale;
        self.blocks[b as usize].remove_reader();
        let data = res.ok().flatten();
        let part = match (&data, full) {
            (Some(d), true) if d.len() == self.bs as usize => {
                Some(d.slice(start as usize..end as usize))
            }
            (Some(d), false) if d.len() == (end - start) as usize => Some(d.clone()),
            _ => None,
        };
        if let (Some(d), true) = (&data, full) {
            let blk = &self.blocks[b as usize];
            if part.is_some()
                && blk.latest == NIL
                && !blk.busy
                && !stale
                && !self.patches.contains_key(&b)
            {
                self.fill(b, d.clone());
            }
        }
        self.finish_read_piece(p, part);
        self.maybe_drop_block(b);
    }

    /// Copy a block read from the backing store into the cache as a clean version.
    fn fill(&mut self, b: u32, data: P) {
        if self.free_slots.len() as u64 <= self.reserved + self.cfg.free_reserve as u64 / 2 {
            return;
        }
        let Some(s) = self.alloc_slot(self.blocks[b as usize].lbn()) else {
            return;
        };
        self.blocks[b as usize].busy = true;
        self.stats.populates += 1;
        let off = self.layout.slot_offset(s);
        self.cache_write(off, data, IoCtx::Fill { block: b, slot: s });
    }

    fn on_fill(&mut self, b: u32, s: u32, ok: bool) {
        if ok {
            let lbn = self.blocks[b as usize].lbn();
            let seq = self.next_seq;
            self.next_seq += 1;
            self.install(b, s, lbn, seq, NO_GROUP, false, (0, 0));
        } else {
            self.unalloc_slot(s);
        }
        self.release_block(b);
    }

    fn finish_read_piece(&mut self, p: u32, data: Option<P>) {
        let pc = self.pieces.remove(p);
        self.active_pieces -= 1;
        let bstart = pc.lbn * self.bs + pc.start as u64;
        let r = self
            .reqs
            .get_mut(&pc.req)
            .expect("piece of unknown request");
        match data {
            Some(d) => r.parts.push((bstart, d)),
            None => r.failed = Some(ReqError::Io),
        }
        r.pieces_left -= 1;
        if r.pieces_left == 0 {
            self.finish_request(pc.req);
        }
    }

    fn inplace_ok(&self, s: u32, group: Group) -> bool {
        let slot = &self.slots[s as usize];
        slot.state == SlotState::Valid
            && (!slot.disk_valid() && !slot.in_snapshot() || self.policy.may_overwrite_durable())
            && slot.refs == 0
            && !slot.destaging()
            && (!slot.unsealed()
                || crate::mutation::active(crate::mutation::Mutation::InPlaceIgnoresSeal))
            && slot.dirty()
            && self.commit_waiters.is_empty()
            && !self.commit_deferred
            && self.policy.may_overwrite(self.group_of(s), group)
    }

    fn write_piece(&mut self, p: u32, b: u32) {
        let latest = self.blocks[b as usize].latest;
        let (start, end, lbn, group, fua) = {
            let pc = self.pieces.get(p);
            (pc.start, pc.end, pc.lbn, pc.group, pc.fua)
        };
        let full = start == 0 && end as u64 == self.bs;
        if latest != NIL {
            self.stats.write_hits += 1;
        } else {
            self.stats.write_misses += 1;
        }
        let bypass = self.pieces.get(p).bypass;
        if self.bypassing && !self.policy.synchronous_backing() {
            if bypass && self.can_bypass(p, b) {
                return self.bypass_piece(p, b);
            }
            if bypass {
                self.stats.bypass_refused += 1;
                self.pieces.get_mut(p).bypass = false;
                let req = self.pieces.get(p).req;
                self.reqs
                    .get_mut(&req)
                    .expect("piece of unknown request")
                    .cached = true;
            } else {
                self.count_admitted(p);
            }
        }
        if self.policy.synchronous_backing() {
            let data = self.pieces.get(p).data.clone().unwrap();
            self.pieces.get_mut(p).ios += 1;
            // Emitted at the end of this round, merged with the adjacent
            // pieces of the same request (`flush_through_batch`).
            self.through_batch.push((p, fua));
            // The backing store is authoritative: drop the old copy now (a read in
            // flight on it finishes first; the slot is reused after), and install a
            // new one only if its cache write succeeds.
            if latest != NIL {
                self.evict_block(b);
            }
            // A rejected write under write-through keeps the cache out of it:
            // the old copy (if any) is gone above, and no new one is made.
            if bypass {
                self.count_bypassed(p);
            } else if self.bypassing {
                self.count_admitted(p);
            }
            if full
                && !bypass
                && self.free_slots.len() as u64 > self.reserved + self.cfg.free_reserve as u64 / 2
            {
                let s = self.alloc_slot(lbn).unwrap();
                self.write_new_version(p, s, data);
            }
            return;
        }
        if latest == NIL && self.patch_write(p, b) {
            return;
        }
        if latest != NIL && self.inplace_ok(latest, group) && self.within_valid(latest, start, end)
        {
            let data = self.pieces.get(p).data.clone().unwrap();
            self.stats.overwrites += 1;
            let pc = self.pieces.get_mut(p);
            pc.slot = latest;
            pc.ios = 1;
            self.slots[latest as usize].state = SlotState::Writing;
            self.inplace_inflight += 1;
            let off = self.layout.slot_offset(latest) + start as u64;
            self.cache_write(
                off,
                data,
                IoCtx::PieceCacheWrite {
                    piece: p,
                    inplace: true,
                },
            );
            return;
        }
        if full {
            let d = self.pieces.get(p).data.clone();
            self.pieces.get_mut(p).buf = d;
            let _ = self.alloc_and_write(p);
        } else if latest != NIL && self.partial.contains_key(&latest) {
            self.partial_rmw(p, latest);
        } else if latest != NIL {
            self.slots[latest as usize].refs += 1;
            self.rmw_from_cache(p, latest);
        } else {
            self.stats.fetches += 1;
            self.pieces.get_mut(p).ios = 1;
            self.backing_read(
                lbn * self.bs,
                self.bs as u32,
                IoCtx::RmwRead {
                    piece: p,
                    from_cache: false,
                },
            );
        }
    }

    /// Admission counters: every class, and the critical class alone (the
    /// class the request's tag gave the piece).
    fn count_admitted(&mut self, p: u32) {
        self.stats.admitted_pieces += 1;
        if self.pieces.get(p).tag_critical {
            self.stats.critical_admitted_pieces += 1;
        }
    }

    fn count_bypassed(&mut self, p: u32) {
        let pc = self.pieces.get(p);
        let (bytes, critical) = ((pc.end - pc.start) as u64, pc.tag_critical);
        self.stats.bypassed_pieces += 1;
        self.stats.bypassed_bytes += bytes;
        if critical {
            self.stats.critical_bypassed_pieces += 1;
        }
    }

    /// May a rejected write piece on block `b` go straight to the backing store?
    ///
    /// Only where nothing in the cache could later put older bytes over it or
    /// serve older bytes for it: no version of the block is cached or being
    /// destaged, no patch holds part of it, and no released version of it is
    /// still named by a durable commit (recovery would bring that version back
    /// as the block's newest and destage it over the bypassed data). Beyond
    /// that the write policy decides (`WritePolicy::bypass_ok`); under ordered
    /// no destage plan or patch may be in flight either, so every write
    /// completed before this one is already durable on the backing store.
    ///
    /// Journaled decides at admission (`journal_bypass_ok`): a piece without
    /// a transaction bypasses, and the block conditions MUST still hold (its
    /// pieces ran at once); a piece with one is cached.
    fn can_bypass(&self, p: u32, b: u32) -> bool {
        let blk = &self.blocks[b as usize];
        let local = blk.latest == NIL
            && blk.shadows == 0
            && blk.destaging == 0
            && !self.patches.contains_key(&b)
            && !self.retired_lbns.contains_key(&blk.lbn());
        if self.policy.kind().journaled() {
            if self.pieces.get(p).group != NO_GROUP {
                return false;
            }
            assert!(
                local,
                "journaled bypass of block {} admitted, but the block changed before it ran",
                blk.lbn()
            );
            return true;
        }
        local
            && match self.policy.kind() {
                WritePolicyKind::WriteBack => true,
                _ => {
                    self.destage_inflight == 0
                        && self.plans.is_empty()
                        && self.patches.is_empty()
                        && self.policy.bypass_ok()
                }
            }
    }

    /// May a rejected write of blocks `first..=last` bypass under journaled?
    ///
    /// Only while the journal is empty (`WritePolicy::bypass_ok`: every
    /// transaction before the open one checkpointed, no checkpoint or its
    /// commit in flight, and the open one never written), nothing is destaged
    /// or patched, nothing waits for admission or a place to run, and every
    /// block passes `can_bypass`'s block conditions and is not held by a
    /// write. Then every write acknowledged before this one is durable on
    /// the backing store, and the write becomes a transaction of its own,
    /// ahead of every write of the open transaction: its pieces run at once
    /// (a read in flight on one of its blocks drops its cache fill, as for
    /// any write), so the conditions still hold when they do. Writes that
    /// complete after it are checkpointed after it is durable (it is written
    /// with FUA and acknowledged only then); writes concurrent with it may
    /// reach the backing store before or after it, as concurrency allows.
    fn journal_bypass_ok(&self, first: u64, last: u64) -> bool {
        if !(self.policy.kind().journaled()
            && self.policy.bypass_ok()
            && self.destage_inflight == 0
            && self.plans.is_empty()
            && self.patches.is_empty()
            && self.admit_queue.is_empty()
            && self.piece_queue.is_empty())
        {
            return false;
        }
        (first..=last).all(|lbn| {
            let Some(b) = self.index.get(lbn, |id| self.blocks[id as usize].lbn()) else {
                return !self.retired_lbns.contains_key(&lbn);
            };
            let blk = &self.blocks[b as usize];
            !blk.busy
                && blk.latest == NIL
                && blk.shadows == 0
                && blk.destaging == 0
                && !self.waiters.contains_key(&b)
                && !self.retired_lbns.contains_key(&lbn)
        })
    }

    /// Write a rejected piece straight to the backing store, with FUA: it is
    /// acknowledged only once durable there, so no FLUSH ever has to wait for
    /// it or flush the backing store for it. The block stays busy until then
    /// (reads and writes of it wait, as for any write piece).
    ///
    /// Crash story: before the backing write completes the write is not
    /// acknowledged and either outcome is allowed; after, it is durable on
    /// the backing store, and the cache holds nothing of the block that
    /// recovery could put over it (`can_bypass`).
    fn bypass_piece(&mut self, p: u32, b: u32) {
        self.count_bypassed(p);
        let pc = self.pieces.get_mut(p);
        pc.ios = 1;
        pc.counted = false;
        self.active_pieces -= 1;
        self.bypass_batch.push((p, b));
    }

    /// Emit the write-through pieces of this round: each run of adjacent
    /// pieces of one request is one backing write, as the client sent it
    /// (a 1 MiB write is one command to a slow backing store, not 256 that
    /// queue for its connections).
    fn flush_through_batch(&mut self) {
        if self.through_batch.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.through_batch);
        let pieces: Vec<u32> = batch.iter().map(|&(p, _)| p).collect();
        for (run, offset, data) in self.adjacent_runs(&pieces, |a, b| batch[a].1 == batch[b].1) {
            let fua = batch[run.start].1;
            self.emit(
                Dev::Backing,
                IoOp::Write { offset, data, fua },
                None,
                IoCtx::ThroughWrite {
                    pieces: pieces[run].to_vec(),
                },
            );
        }
    }

    /// Emit the batched bypass pieces: each run of adjacent pieces of one
    /// request is one backing write (a 256 KiB write is one command, not 64).
    fn flush_bypass_batch(&mut self) {
        if self.bypass_batch.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.bypass_batch);
        let pieces: Vec<u32> = batch.iter().map(|&(p, _)| p).collect();
        for (run, offset, data) in self.adjacent_runs(&pieces, |_, _| true) {
            let run = &batch[run];
            let io = self.emit(
                Dev::Backing,
                IoOp::Write {
                    offset,
                    data,
                    fua: true,
                },
                None,
                IoCtx::BypassWrite {
                    pieces: run.to_vec(),
                    orphans: Vec::new(),
                },
            );
            for &(p, b) in run {
                self.bypass_io.insert(b, (p, io));
            }
        }
    }

    /// Split `pieces` (in order) into runs of adjacent pieces of one request
    /// that `same(i, j)` also allows together: each run's index range, its
    /// first byte on the backing store, and its data.
    fn adjacent_runs(
        &self,
        pieces: &[u32],
        same: impl Fn(usize, usize) -> bool,
    ) -> Vec<(std::ops::Range<usize>, u64, P)> {
        let span = |p: u32| {
            let pc = self.pieces.get(p);
            (
                pc.req,
                pc.lbn * self.bs + pc.start as u64,
                pc.lbn * self.bs + pc.end as u64,
            )
        };
        let mut runs = Vec::new();
        let mut i = 0;
        while i < pieces.len() {
            let (req, start_off, mut end_off) = span(pieces[i]);
            let mut j = i + 1;
            while j < pieces.len() {
                let (r, s, e) = span(pieces[j]);
                if r != req || s != end_off || !same(i, j) {
                    break;
                }
                end_off = e;
                j += 1;
            }
            let parts: Vec<P> = pieces[i..j]
                .iter()
                .map(|&p| self.pieces.get(p).data.clone().unwrap())
                .collect();
            let data = P::concat(&parts);
            debug_assert_eq!(data.len() as u64, end_off - start_off);
            runs.push((i..j, start_off, data));
            i = j;
        }
        runs
    }

    /// The backing write of a reissued bypass piece completed: its result is
    /// discarded, and block `b` may be destaged again.
    fn on_orphan_done(&mut self, b: u32) {
        self.stats.discarded_completions += 1;
        let blk = &mut self.blocks[b as usize];
        assert!(
            blk.destaging > 0,
            "orphan bypass write without its block mark"
        );
        blk.destaging -= 1;
        self.maybe_drop_block(b);
    }

    /// A critical request waits for busy block `b`: follow the dependency
    /// chain to what the holder itself waits on (cascading dependencies,
    /// §4.2.3) and speed that up. The holder inherits criticality (so later
    /// waiters on whatever it waits for follow the chain on); a bypass write
    /// in flight is reissued to the cache (I/O criticality inheritance,
    /// §4.2.2); a holder waiting for a free slot moves to the head of that queue.
    fn inherit(&mut self, b: u32) {
        let Some(&h) = self.holders.get(&b) else {
            return;
        };
        let pc = self.pieces.get_mut(h);
        if !pc.critical {
            pc.critical = true;
            self.stats.inherited += 1;
        }
        // A bypass (or write-through) piece still in this round's batch has
        // no backing write yet: emit the batch, then treat it like any write
        // in flight.
        self.flush_bypass_batch();
        self.flush_through_batch();
        if let Some(&(p, io)) = self.bypass_io.get(&b) {
            assert_eq!(p, h, "bypass write of a block another piece holds");
            if self.admission.reissue() {
                self.reissue(b, p, io);
            }
            return;
        }
        if let Some(pos) = self.alloc_waiters.iter().position(|&x| x == h) {
            if pos > 0 {
                self.alloc_waiters.remove(pos);
                self.alloc_waiters.push_front(h);
            }
        }
    }

    /// Reissue bypass piece `p` (backing write `io` in flight) to the cache:
    /// the piece completes when its cache write does, as a dirty version,
    /// and the backing write's completion is discarded when it comes.
    ///
    /// Only under write-back. Under ordered, the orphaned backing write is a
    /// write the dependency graph does not know: a later version of the block
    /// can be destaged in a wave, and later waves after it, before the orphan
    /// lands with the older bytes (tried: the test
    /// `an_orphaned_bypass_write_never_lands_over_a_later_destage` fails with
    /// ordered reissue). Only for a
    /// whole-block piece (a partial one would need the block's other bytes),
    /// and only when a spare slot is free. Otherwise the waiter waits.
    ///
    /// Crash story: the version is dirty and newer than anything recovery
    /// could find for the block (it had none, `can_bypass`); the old backing
    /// write carries the same bytes, and holds the block's `destaging` count
    /// until it completes, so no destage of a later version can land first.
    fn reissue(&mut self, b: u32, p: u32, io: IoId) {
        if self.policy.kind() != WritePolicyKind::WriteBack {
            return;
        }
        let (lbn, start, end) = {
            let pc = self.pieces.get(p);
            (pc.lbn, pc.start, pc.end)
        };
        if start != 0 || end as u64 != self.bs || self.free_slots.len() as u64 <= self.reserved {
            return;
        }
        let Some(s) = self.alloc_slot(lbn) else {
            return;
        };
        match self.ios.get_mut(&io) {
            Some(IoCtx::BypassWrite { pieces, orphans }) => {
                let at = pieces
                    .iter()
                    .position(|&(x, _)| x == p)
                    .expect("reissued piece is part of its bypass write");
                pieces.swap_remove(at);
                orphans.push(b);
            }
            _ => panic!("reissued a bypass write that is not in flight"),
        }
        self.bypass_io.remove(&b);
        self.blocks[b as usize].destaging += 1;
        self.stats.reissued_writes += 1;
        if self.pieces.get(p).tag_critical {
            self.stats.critical_reissued_writes += 1;
        }
        let req = self.pieces.get(p).req;
        self.reqs
            .get_mut(&req)
            .expect("piece of unknown request")
            .cached = true;
        let pc = self.pieces.get_mut(p);
        pc.ios = 0;
        pc.bypass = false;
        let data = pc.data.clone().unwrap();
        self.write_new_version(p, s, data);
    }

    fn on_rmw_read(&mut self, p: u32, from_cache: bool, res: IoResult<P>) {
        if from_cache {
            let s = self.pieces.get(p).slot;
            self.unref(s);
            self.pieces.get_mut(p).slot = NIL;
        }
        self.pieces.get_mut(p).ios = 0;
        match res {
            Ok(Some(old)) if old.len() == self.bs as usize => {
                let pc = self.pieces.get_mut(p);
                let d = pc.data.as_ref().unwrap();
                pc.buf = Some(old.overlay(pc.start as usize, d));
                let _ = self.alloc_and_write(p);
            }
            _ => {
                self.pieces.get_mut(p).failed = true;
                self.finish_write_piece(p);
            }
        }
    }

    /// Read-modify-write from the cache: read version `old`'s whole slot for
    /// piece `p` (caller holds a reference on `old`; `on_rmw_read` drops it).
    fn rmw_from_cache(&mut self, p: u32, old: u32) {
        let pc = self.pieces.get_mut(p);
        pc.slot = old;
        pc.ios = 1;
        let off = self.layout.slot_offset(old);
        self.cache_read(
            off,
            self.bs as u32,
            IoCtx::RmwRead {
                piece: p,
                from_cache: true,
            },
        );
    }

    /// Write a piece's whole new version (`data`, one block) to fresh slot `s`.
    fn write_new_version(&mut self, p: u32, s: u32, data: P) {
        let pc = self.pieces.get_mut(p);
        pc.slot = s;
        pc.ios += 1;
        let offset = self.layout.slot_offset(s);
        self.cache_write(
            offset,
            data,
            IoCtx::PieceCacheWrite {
                piece: p,
                inplace: false,
            },
        );
    }

    /// Allocate a slot and write the piece's block to it, or queue the piece
    /// as a stalled writer. Returns whether it got a slot.
    fn alloc_and_write(&mut self, p: u32) -> bool {
        // A piece without a reservation must leave the reserved slots alone.
        let spare = self.free_slots.len() as u64 > self.reserved;
        let slot = if self.pieces.get(p).reserved || spare {
            self.alloc_slot(self.pieces.get(p).lbn)
        } else {
            None
        };
        match slot {
            Some(s) => {
                self.release_reservation(p);
                if let Some(since) = self.pieces.get_mut(p).stalled_since.take() {
                    self.stats.stall_ns += self.now - since;
                }
                let data = self.pieces.get_mut(p).buf.take().expect("full block data");
                self.write_new_version(p, s, data);
                true
            }
            None => {
                let pc = self.pieces.get_mut(p);
                if pc.stalled_since.is_none() {
                    pc.stalled_since = Some(self.now);
                    self.stats.stalled_writes += 1;
                }
                self.alloc_waiters.push_back(p);
                false
            }
        }
    }

    fn on_piece_cache_write(&mut self, p: u32, inplace: bool, ok: bool) {
        let (s, lbn, seq, group) = {
            let pc = self.pieces.get(p);
            (pc.slot, pc.lbn, pc.seq, pc.group)
        };
        if inplace {
            self.inplace_inflight -= 1;
            let slot = &mut self.slots[s as usize];
            slot.state = SlotState::Valid;
            if ok {
                slot.seq = seq;
                // Over a version a commit names (or is naming), under a policy
                // that allows it: the durable entry (block, dirty, an older
                // seq that still orders it above every durable shadow of the
                // block) stays right, so nothing needs committing; a FLUSH
                // still commits, and its device flush makes these bytes durable.
                let durable = slot.disk_valid() || slot.in_snapshot();
                let (a, e) = (self.pieces.get(p).start, self.pieces.get(p).end);
                let (lo, hi) = self.range_of(s);
                self.set_range(s, (lo.min(a), hi.max(e)));
                if durable && self.policy.may_overwrite_durable() {
                    self.unsynced_overwrites = true;
                } else {
                    self.mark_meta(s);
                }
                if group != NO_GROUP {
                    self.policy.on_version_installed(group, s, lbn, seq);
                }
            }
            self.pieces.get_mut(p).slot = NIL;
            return self.on_piece_io_done(p, ok);
        }
        if self.policy.synchronous_backing() {
            // Write-through: the clean copy is installed once the backing write
            // is done too; a failed cache write only loses the copy.
            if !ok {
                self.unalloc_slot(s);
                self.pieces.get_mut(p).slot = NIL;
            }
            return self.on_piece_io_done(p, true);
        }
        if ok {
            let b = self.block_of(lbn);
            let (a, e) = (self.pieces.get(p).start, self.pieces.get(p).end);
            self.install(b, s, lbn, seq, group, true, (a, e));
            if let Some(v) = self.pieces.get(p).valid {
                self.partial.insert(s, v);
            }
            let req = self.pieces.get(p).req;
            self.reqs
                .get_mut(&req)
                .expect("piece of unknown request")
                .installed
                .push(s);
        } else {
            self.unalloc_slot(s);
        }
        if !self.patches.is_empty() {
            // A full write over a patched block: its patches go once it is installed.
            let b = self.block_of(lbn);
            self.patch_superseded(b, ok);
        }
        self.pieces.get_mut(p).slot = NIL;
        self.on_piece_io_done(p, ok);
    }

    fn on_piece_io_done(&mut self, p: u32, ok: bool) {
        let pc = self.pieces.get_mut(p);
        if !ok {
            pc.failed = true;
        }
        pc.ios -= 1;
        if pc.ios > 0 {
            return;
        }
        // Write-through: a finished cache copy waits for the backing write.
        let s = pc.slot;
        if s != NIL {
            let (lbn, seq, failed) = (pc.lbn, pc.seq, pc.failed);
            pc.slot = NIL;
            if failed {
                self.unalloc_slot(s);
            } else {
                let b = self.block_of(lbn);
                self.install(b, s, lbn, seq, NO_GROUP, false, (0, 0));
            }
        }
        self.finish_write_piece(p);
    }

    /// Make slot `s` the latest version of block `b`.
    #[allow(clippy::too_many_arguments)]
    fn install(
        &mut self,
        b: u32,
        s: u32,
        lbn: u64,
        seq: u64,
        group: Group,
        dirty: bool,
        range: (u32, u32),
    ) {
        let old = self.blocks[b as usize].latest;
        let coalesce = old != NIL && {
            let o = &self.slots[old as usize];
            !(o.dirty() && self.policy.keep_superseded(self.group_of(old), group))
        };
        let (mut lo, mut hi) = range;
        if coalesce && self.slots[old as usize].dirty() && self.policy.inherits_dirty_range() {
            let (olo, ohi) = self.range_of(old);
            lo = lo.min(olo);
            hi = hi.max(ohi);
        }
        self.set_range(s, (lo, hi));
        self.set_group(s, group);
        // A new version holds its whole block unless the caller marks it
        // partial right after (`Engine::partial`).
        self.partial.remove(&s);
        {
            let slot = &mut self.slots[s as usize];

            assert_eq!(slot.state, SlotState::Writing);
            slot.state = SlotState::Valid;
            slot.seq = seq;
            slot.set_dirty(dirty);
            slot.block = b;
        }
        if dirty {
            self.dirty_slots += 1;
        }
        self.mark_meta(s);
        if group != NO_GROUP {
            self.policy.on_version_installed(group, s, lbn, seq);
        }
        self.blocks[b as usize].latest = s;
        if old != NIL {
            let o = self.slots[old as usize];
            if !coalesce {
                // Shadow version: kept until its group reaches the backing store.
                self.blocks[b as usize].shadows += 1;
                self.slots[old as usize].set_shadow(true);
            } else {
                if o.dirty() {
                    self.stats.overwrites += 1;
                }
                self.retire(old);
            }
            let rid = self.blocks[b as usize].rid;
            self.repl.touch(BlockId(rid), true);
            if o.dirty() != dirty {
                self.repl.set_dirty(BlockId(rid), dirty);
            }
        } else {
            let rid = self.free_rids.pop().expect("more cached blocks than slots");
            self.rid_block[rid as usize] = b;
            self.blocks[b as usize].rid = rid;
            self.repl.insert(BlockId(rid), lbn, dirty);
        }
    }

    fn finish_write_piece(&mut self, p: u32) {
        self.release_reservation(p);
        let pc = self.pieces.remove(p);
        if pc.counted {
            self.active_pieces -= 1;
        }
        let b = self.block_of(pc.lbn);
        self.release_block(b);
        let r = self
            .reqs
            .get_mut(&pc.req)
            .expect("piece of unknown request");
        if pc.failed {
            r.failed = Some(ReqError::Io);
        }
        r.pieces_left -= 1;
        if r.pieces_left == 0 {
            self.finish_request(pc.req);
        }
    }

    fn release_block(&mut self, b: u32) {
        self.blocks[b as usize].busy = false;
        if self.bypassing {
            self.holders.remove(&b);
        }
        // Wake waiters: reads run together; a write takes the block.
        while let Some(q) = self.waiters.get_mut(&b) {
            let Some(p) = q.pop_front() else {
                self.waiters.remove(&b);
                break;
            };
            if q.is_empty() {
                self.waiters.remove(&b);
            }
            let is_write = self.pieces.get(p).data.is_some();
            self.run_piece(p, b);
            if is_write || self.blocks[b as usize].busy {
                break;
            }
        }
        self.maybe_drop_block(b);
    }

    fn finish_request(&mut self, id: ReqId) {
        let r = self.reqs.remove(&id).expect("unknown request");
        match r.kind {
            ReqKind::Read => {
                if let Some(e) = r.failed {
                    return self.reply(id, Err(e), 0);
                }
                let mut parts = r.parts;
                parts.sort_by_key(|(o, _)| *o);
                debug_assert_eq!(parts.first().map(|p| p.0), Some(r.offset));
                let data: Vec<P> = parts.into_iter().map(|(_, d)| d).collect();
                self.reply_data(id, P::concat(&data));
            }
            ReqKind::Write => {
                if r.group != NO_GROUP {
                    self.policy.on_write_data_done(self.now, r.group);
                    // Entries carry the write's completion (ordered): rewrite
                    // them, including versions of the group the write's own
                    // pieces did not install (a patch persisted meanwhile).
                    // Missing one left a stale "not completed" entry on a
                    // metadata page no other change rewrote (the VOPR's
                    // large caches found it: ordered seed 497).
                    let extra = self.policy.aux_changed_on_completion(r.group).to_vec();
                    for s in r.installed.iter().copied().chain(extra) {
                        let slot = &self.slots[s as usize];
                        if slot.state == SlotState::Valid && self.group_of(s) == r.group {
                            self.mark_meta(s);
                        }
                    }
                }
                if let Some(e) = r.failed {
                    return self.reply(id, Err(e), r.seq);
                }
                if r.fua && r.cached && !self.policy.synchronous_backing() {
                    self.commit_waiters.push(Waiter {
                        id,
                        group: r.group,
                        write: true,
                        seq: r.seq,
                    });
                } else {
                    if r.group != NO_GROUP {
                        self.policy.on_write_ack(self.now, r.group);
                    }
                    self.reply(id, Ok(None), r.seq);
                }
            }
        }
    }
}

impl<P: Payload> Engine<P> {
    // ------------------------------------------------------------ flush, trim

    fn start_flush(&mut self, id: ReqId, explicit: bool) {
        if self.policy.synchronous_backing() {
            // Write-through: acknowledged writes are on the backing store; make them durable there.
            self.emit(
                Dev::Backing,
                IoOp::Flush,
                None,
                IoCtx::ReqBacking { req: id },
            );
            return;
        }
        // The consistency point is here, where the FLUSH arrives (it closes a
        // journaled-hints transaction), even if the reply waits for patches.
        self.policy.on_consistency_point(self.now, explicit);
        if !self.patches.is_empty() {
            // Every patch acknowledged before this FLUSH becomes a version
            // first; then the FLUSH goes on in `flush_after_patches` (see `patch`).
            self.patch_flushes.push((id, explicit, self.next_seq));
            self.materialize_all();
            return;
        }
        self.flush_after_patches(id, explicit);
    }

    /// The rest of a FLUSH, once no patch older than it is left.
    fn flush_after_patches(&mut self, id: ReqId, _explicit: bool) {
        if (self.direct_unflushed || self.direct_cover_inflight > 0)
            && !crate::mutation::active(crate::mutation::Mutation::FlushSkipsDirectCover)
        {
            // Direct patch writes acknowledged before this FLUSH sit in the
            // backing store's volatile cache (or a backing FLUSH that covers
            // them is still in flight): a backing FLUSH issued now covers
            // them all, and the commit follows it (`on_direct_cover`).
            self.issue_direct_cover(Some(id));
            return;
        }
        self.flush_commit(id);
    }

    fn issue_direct_cover(&mut self, req: Option<ReqId>) {
        self.direct_unflushed = false;
        self.direct_cover_inflight += 1;
        self.emit(Dev::Backing, IoOp::Flush, None, IoCtx::DirectCover { req });
    }

    fn on_direct_cover(&mut self, req: Option<ReqId>, ok: bool) {
        self.direct_cover_inflight -= 1;
        if !ok {
            // The writes may still be volatile: the next FLUSH tries again.
            self.direct_unflushed = true;
            if req.is_none() && self.retry_at.is_none() {
                self.retry_at = Some(self.now + self.cfg.retry_ns);
            }
            self.out_event.push_back(Event::BackgroundError {
                what: "backing flush after direct patch writes",
            });
        }
        match req {
            Some(id) if ok => self.flush_commit(id),
            Some(id) => self.reply(id, Err(ReqError::Io), 0),
            None => {}
        }
    }

    /// A drain or shutdown leaves direct patch writes durable on the backing
    /// store once no patch is left.
    fn cover_direct_at_end(&mut self) -> bool {
        if (self.drain || self.shutting_down)
            && self.direct_unflushed
            && self.direct_cover_inflight == 0
            && self.patches.is_empty()
            && self.retry_at.is_none()
        {
            self.issue_direct_cover(None);
            return true;
        }
        false
    }

    /// The FLUSH's commit: every acknowledged write named by a durable commit.
    fn flush_commit(&mut self, id: ReqId) {
        if self.meta_dirty.is_empty() && self.commit.is_none() && !self.unsynced_overwrites {
            // Every acknowledged write is already named by a durable commit,
            // and its bytes were flushed by it.
            return self.reply(id, Ok(None), 0);
        }
        if crate::mutation::active(crate::mutation::Mutation::FlushNeverAnswered) {
            return;
        }
        self.commit_waiters.push(Waiter {
            id,
            group: NO_GROUP,
            write: false,
            seq: 0,
        });
    }

    /// TRIM: contents become unspecified. Clean cached copies of fully covered
    /// blocks are dropped. Write-through and write-back pass the trim to the
    /// backing store; ordered and journaled do not, because a trim reaching the
    /// backing store ahead of older destages would break point-in-time
    /// consistency (NBD allows a server to ignore TRIM).
    fn start_trim(&mut self, id: ReqId, offset: u64, len: u32) {
        if len == 0 {
            return self.reply(id, Ok(None), 0);
        }
        let first = offset.div_ceil(self.bs);
        let end = (offset + len as u64) / self.bs;
        for lbn in first..end {
            if let Some(b) = self.index.get(lbn, |id| self.blocks[id as usize].lbn()) {
                let blk = &self.blocks[b as usize];
                if blk.latest != NIL && !blk.busy && !self.waiters.contains_key(&b) {
                    let s = &self.slots[blk.latest as usize];
                    if !s.dirty() && s.refs == 0 && !s.destaging() {
                        self.evict_block(b);
                    }
                }
            }
        }
        use crate::config::WritePolicyKind as K;
        match self.cfg.write_policy {
            K::WriteThrough | K::WriteBack => {
                self.emit(
                    Dev::Backing,
                    IoOp::Trim { offset, len },
                    None,
                    IoCtx::ReqBacking { req: id },
                );
            }
            _ => self.reply(id, Ok(None), 0),
        }
    }

    // ---------------------------------------------------------------- progress

    /// Run everything that can run now.
    fn progress(&mut self) {
        for _ in 0..64 {
            let mut changed = false;
            // Stalled writers take freed slots first.
            while !self.free_slots.is_empty() {
                let Some(p) = self.alloc_waiters.pop_front() else {
                    break;
                };
                if !self.alloc_and_write(p) {
                    // Still no slot for it: keep its place at the head.
                    let back = self.alloc_waiters.pop_back();
                    debug_assert_eq!(back, Some(p));
                    self.alloc_waiters.push_front(p);
                    break;
                }
                changed = true;
            }
            changed |= self.admit();
            while self.active_pieces < self.max_active {
                let Some(p) = self.piece_queue.pop_front() else {
                    break;
                };
                self.active_pieces += 1;
                self.start_piece(p);
                changed = true;
            }
            changed |= self.ensure_free();
            // Slots ensure_free just freed (clean evictions) go to waiting
            // writes before the write policy looks at space pressure: a
            // write that only waited for a clean eviction is not pressure
            // (journaled-hints would close a transaction early for it).
            changed |= self.admit();
            changed |= self.patch_progress();
            changed |= self.plan();
            changed |= self.cover_direct_at_end();
            changed |= self.maybe_commit();
            if !changed {
                break;
            }
        }
        self.flush_bypass_batch();
        self.flush_through_batch();
    }

    /// Evict clean blocks to keep `free_reserve` slots (plus one per stalled writer) ready.
    fn ensure_free(&mut self) -> bool {
        self.evict_clean_until(self.free_wanted())
    }

    /// Evict clean, idle blocks (the replacement policy's victims) until
    /// free slots plus those a commit will free reach `want`, or no victim
    /// is left. Returns whether it evicted any.
    fn evict_clean_until(&mut self, want: u64) -> bool {
        let mut changed = false;
        while (self.free_slots.len() as u64 + self.retired_pending) < want {
            let blocks = &self.blocks;
            let slots = &self.slots;
            let rid_block = &self.rid_block;
            let waiters = &self.waiters;
            let pinned = |id: BlockId| {
                let b = rid_block[id.0 as usize];
                let blk = &blocks[b as usize];
                let s = &slots[blk.latest as usize];
                blk.busy || s.refs > 0 || s.destaging() || s.dirty() || waiters.contains_key(&b)
            };
            let Some(v) = self.repl.victim_clean(&pinned) else {
                break;
            };
            let b = self.rid_block[v.0 as usize];
            assert!(
                !self.slots[self.blocks[b as usize].latest as usize].dirty(),
                "replacement chose a dirty victim"
            );
            self.evict_block(b);
            self.stats.evictions += 1;
            changed = true;
        }
        changed
    }

    fn space_pressure(&self) -> bool {
        !self.alloc_waiters.is_empty() || !self.admit_queue.is_empty()
    }

    /// Free slots wanted now: the reserve, promised slots, and the next admission.
    fn free_wanted(&self) -> u64 {
        self.cfg.free_reserve as u64
            + self.reserved
            + self.alloc_waiters.len() as u64
            + self.admit_queue.front().map_or(0, |a| a.need)
    }

    fn plan(&mut self) -> bool {
        if self.retry_at.is_some() || self.shutting_down && self.drain_done() {
            return false;
        }
        let mut changed = false;
        for _ in 0..16 {
            let cap = self.cfg.capacity_blocks;
            let wanted = self.drain && self.dirty_slots > 0
                || self.space_pressure()
                || self.repl.should_clean(
                    self.dirty_slots,
                    cap,
                    self.cleaning_active,
                    self.cfg.watermarks,
                );
            self.cleaning_active = wanted;
            // Pressure for the write policy: writers wait and the slots
            // already on their way back (evicted, freed at the next metadata
            // commit) do not cover them. A wait that only needs that commit
            // is not a reason for a policy to act (journaled-hints would close
            // a transaction off a FLUSH boundary for nothing).
            let coming = self.free_slots.len() as u64 + self.retired_pending;
            let pressure = self.space_pressure() && coming < self.free_wanted() || self.drain;
            let mut view = View {
                now: self.now,
                repl: &mut *self.repl,
                blocks: &self.blocks,
                slots: &self.slots,
                groups: &self.groups,
                rid_block: &self.rid_block,
                wanted,
                pressure,
                inflight: self.destage_inflight,
                limit: self.cfg.max_destage_inflight as usize,
                ids: Vec::new(),
            };
            let Some(plan) = self.policy.next_plan(&mut view) else {
                break;
            };
            self.start_plan(plan);
            changed = true;
        }
        changed
    }

    fn drain_done(&self) -> bool {
        self.dirty_slots == 0
    }

    fn start_plan(&mut self, plan: Plan) {
        for &s in &plan.write {
            let slot = &mut self.slots[s as usize];
            assert_eq!(
                slot.state,
                SlotState::Valid,
                "plan names a slot that is not valid"
            );
            assert!(slot.dirty(), "plan names a clean version");
            assert!(!slot.destaging(), "slot destaged twice at once");
            slot.set_destaging(true);
            slot.refs += 1;
        }
        let blocks: Vec<u32> = plan
            .write
            .iter()
            .map(|&s| self.slots[s as usize].block)
            .collect();
        assert!(
            blocks.iter().all(|&b| b != NIL),
            "plan names a version without a block"
        );
        for &b in &blocks {
            self.blocks[b as usize].destaging += 1;
        }
        self.destage_inflight += plan.write.len();
        self.stats.destage_plans += 1;
        let group = plan.atomic_group;
        let n = plan.write.len() as u32;
        let pid = self.plans.insert(PlanExec {
            plan,
            blocks,
            left: n,
            failed: false,
        });
        match group {
            Some(g) => {
                self.emit(
                    Dev::Backing,
                    IoOp::GroupBegin { group: g },
                    Some(g),
                    IoCtx::PlanBegin { plan: pid },
                );
            }
            None => self.plan_copy(pid),
        }
    }

    fn plan_copy(&mut self, pid: u32) {
        let slots = self.plans.get(pid).plan.write.clone();
        if slots.is_empty() {
            return self.plan_copied(pid);
        }
        let exact = self.plans.get(pid).plan.exact;
        let blocks = self.plans.get(pid).blocks.clone();
        for (s, b) in slots.into_iter().zip(blocks) {
            let (lo, hi) = if exact {
                self.range_of(s)
            } else {
                (0, self.bs as u32)
            };
            // A partial version holds only its valid bytes; the backing
            // store already has the rest of the block (`partial`).
            let (vlo, vhi) = self.valid_range(s);
            let (lo, hi) = (lo.max(vlo), hi.min(vhi));
            assert!(lo < hi, "destage of slot {s} has nothing to copy");
            let off = self.layout.slot_offset(s) + lo as u64;
            self.cache_read(
                off,
                hi - lo,
                IoCtx::DestageRead {
                    plan: pid,
                    slot: s,
                    block: b,
                    lo,
                },
            );
        }
    }

    fn on_plan_begin(&mut self, pid: u32, ok: bool) {
        if !ok {
            let pe = self.plans.get_mut(pid);
            pe.failed = true;
            pe.left = 0;
            return self.plan_copied(pid);
        }
        self.plan_copy(pid);
    }

    fn on_destage_read(&mut self, pid: u32, _s: u32, b: u32, lo: u32, res: IoResult<P>) {
        match res {
            Ok(Some(d)) => {
                let lbn = self.blocks[b as usize].lbn();
                let group = self.plans.get(pid).plan.atomic_group;
                self.emit(
                    Dev::Backing,
                    IoOp::Write {
                        offset: lbn * self.bs + lo as u64,
                        data: d,
                        fua: false,
                    },
                    group,
                    IoCtx::DestageWrite { plan: pid },
                );
            }
            _ => self.on_destage_write(pid, false),
        }
    }

    fn on_destage_write(&mut self, pid: u32, ok: bool) {
        let pe = self.plans.get_mut(pid);
        if !ok {
            pe.failed = true;
        }
        pe.left -= 1;
        if pe.left == 0 {
            self.plan_copied(pid);
        }
    }

    /// Every block of the plan was written (or the plan failed).
    fn plan_copied(&mut self, pid: u32) {
        let pe = self.plans.get(pid);
        if pe.failed {
            return self.plan_end(pid, false);
        }
        match pe.plan.atomic_group {
            Some(g) => {
                self.emit(
                    Dev::Backing,
                    IoOp::GroupEnd { group: g },
                    Some(g),
                    IoCtx::PlanFinish { plan: pid },
                );
            }
            None => {
                // One backing FLUSH covers every plan whose writes completed
                // before it was issued: a plan that finishes copying while
                // one is in flight waits for the next, shared by all such
                // plans (destage at the backing store's write rate, not one
                // sync per 16 blocks).
                if let Some(waiting) = &mut self.plan_flush_next {
                    waiting.push(pid);
                } else if self.plan_flush_inflight.is_some() {
                    self.plan_flush_next = Some(vec![pid]);
                } else {
                    self.issue_plan_flush(vec![pid]);
                }
            }
        }
    }

    fn issue_plan_flush(&mut self, plans: Vec<u32>) {
        debug_assert!(self.plan_flush_inflight.is_none());
        self.plan_flush_inflight = Some(plans);
        self.emit(Dev::Backing, IoOp::Flush, None, IoCtx::PlanFlush);
    }

    fn on_plan_flush(&mut self, ok: bool) {
        let done = self
            .plan_flush_inflight
            .take()
            .expect("plan flush completion without plans");
        if let Some(next) = self.plan_flush_next.take() {
            self.issue_plan_flush(next);
        }
        for pid in done {
            self.plan_end(pid, ok);
        }
    }

    fn on_plan_finish(&mut self, pid: u32, ok: bool) {
        self.plan_end(pid, ok);
    }

    fn plan_end(&mut self, pid: u32, ok: bool) {
        let pe = self.plans.remove(pid);
        self.destage_inflight -= pe.plan.write.len();
        for &b in &pe.blocks {
            self.blocks[b as usize].destaging -= 1;
        }
        for &s in &pe.plan.write {
            self.slots[s as usize].set_destaging(false);
        }
        if !ok {
            self.stats.destage_failures += 1;
            self.out_event
                .push_back(Event::BackgroundError { what: "destage" });
            for &s in &pe.plan.write {
                self.unref(s);
            }
            self.policy.on_plan_failed(&pe.plan);
            self.retry_at = Some(self.now + self.cfg.retry_ns);
            return;
        }
        self.stats.destaged_blocks += pe.plan.write.len() as u64;
        // Older versions first, so that each block's shadow count is final
        // when its latest version is considered.
        let mut per_block: HashMap<u32, u32> = HashMap::new();
        for &s in &pe.plan.write {
            let b = self.slots[s as usize].block;
            if b != NIL {
                *per_block.entry(b).or_default() += 1;
            }
        }
        for &s in &pe.plan.write {
            if self.slots[s as usize].state == SlotState::Valid && !self.is_latest(s) {
                self.retire(s);
            }
        }
        for &s in &pe.plan.drop {
            assert!(!self.is_latest(s), "dropping the latest version of a block");
            if self.slots[s as usize].state == SlotState::Valid {
                self.retire(s);
            }
        }
        for &s in &pe.plan.write {
            let slot = self.slots[s as usize];
            if slot.state == SlotState::Valid && self.is_latest(s) && slot.dirty() {
                let b = slot.block;
                // Written whole: its dirty range covers every byte it holds.
                let full = {
                    let ((lo, hi), (vlo, vhi)) = (self.range_of(s), self.valid_range(s));
                    lo <= vlo && hi >= vhi
                };
                let alone = self.blocks[b as usize].shadows == 0
                    && per_block.get(&b).copied().unwrap_or(0) == 1;
                let g = self.set_group(s, NO_GROUP);
                if g != NO_GROUP {
                    self.policy.on_version_removed(g, s);
                }
                if !pe.plan.exact || (full && alone) {
                    // The backing store now holds exactly this version: clean.
                    self.slots[s as usize].set_dirty(false);
                    self.dirty_slots -= 1;
                    let rid = self.blocks[b as usize].rid;
                    self.repl.set_dirty(BlockId(rid), false);
                }
                // Otherwise its own bytes are written but the block as a whole may
                // not match yet: it stays dirty, outside any group, and is re-synced
                // whole once no older version of the block is left.
                self.mark_meta(s);
            }
        }
        for &s in &pe.plan.write {
            self.unref(s);
        }
        for &b in &pe.blocks {
            self.maybe_drop_block(b);
        }
        self.policy.on_plan_done(self.now, &pe.plan);
    }
}

/// The log records recovery found after the checkpoint.
struct Replay {
    /// Records whose data checks passed (or that are sealed), in order.
    accepted: Vec<layout::LogRecord>,
    /// Valid records from the first whose data did not match on.
    dropped: Vec<layout::LogRecord>,
    /// Highest record number seen.
    max_n: u64,
}

/// Read the log that extends checkpoint `ckpt`: consecutive records of its
/// epoch from the region's start, to the first invalid one. Records past
/// the highest `sealed` any of them carries are checked against their data
/// (entries without `F_NOCHECK`), and the first mismatch drops that record
/// and every later one (`docs/ON-DISK-FORMAT.md`, "Recovery").
fn replay_log(
    l: &Layout,
    log: &[u8],
    ckpt: &CommitRecord,
    data_crc: &mut dyn FnMut(u64, u32) -> Result<u32, String>,
) -> Result<Replay, RecoverError> {
    let mut found = Vec::new();
    let mut pos = 0u64;
    let mut want = ckpt.commit + 1;
    while pos < l.log_bytes {
        let Some((r, len)) = layout::LogRecord::decode(&log[pos as usize..l.log_bytes as usize])
        else {
            break;
        };
        if r.epoch != ckpt.commit
            || r.n != want
            || r.entries.iter().any(|&(s, _)| s as u64 >= l.capacity)
        {
            break;
        }
        found.push(r);
        pos += len;
        want += 1;
    }
    let max_n = found.last().map_or(0, |r| r.n);
    let sealed = found
        .iter()
        .map(|r| r.sealed)
        .max()
        .unwrap_or(0)
        .max(ckpt.commit);
    let mut cut = found.len();
    'records: for (i, r) in found.iter().enumerate() {
        if r.n <= sealed || crate::mutation::active(crate::mutation::Mutation::LogSkipsDataCheck) {
            continue;
        }
        for (s, ent) in &r.entries {
            if ent.flags & F_VALID == 0 || ent.flags & layout::F_NOCHECK != 0 {
                continue;
            }
            let (off, len) = l.checked_bytes(*s, ent);
            if data_crc(off, len).map_err(RecoverError::Read)? != ent.data_crc {
                cut = i;
                break 'records;
            }
        }
    }
    let dropped = found.split_off(cut);
    Ok(Replay {
        accepted: found,
        dropped,
        max_n,
    })
}
