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

mod bypass;
mod commit;
mod destage;
mod direct;
mod flush;
mod partial;
mod patch;
mod patch_set;
mod read;
mod recover;
mod request;
mod slots;
mod state;
mod write;
use bypass::BypassState;
use commit::{CommitState, LogState};
use destage::DestageState;
use patch::PatchState;
pub use recover::{CacheImage, RecoverError, RecoveryReport, RepairFn};
use state::*;

const NIL: u32 = u32::MAX;
/// Group of versions that belong to no policy group (clean versions).
pub const NO_GROUP: Group = u64::MAX;
/// How often a clean stop retries after a failure (`Engine::start_shutdown`):
/// enough for a transient error to clear (each retry waits `retry_ns`, 10 ms
/// by default), few enough that a stop on a failed device ends within a
/// second, without its clean-shutdown record (the restart is then cold).
pub const STOP_RETRIES: u32 = 8;
/// How often a checkpoint writes its commit record again after the write
/// failed (`commit.rs`, `on_commit_io`), `retry_ns` apart, before it gives
/// up. A record write that keeps failing means a failed device (the server
/// has degraded the export to read-only by then).
pub const RECORD_RETRIES: u32 = 8;

/// Largest backing write a destage plan issues: its copies whose backing
/// bytes are contiguous go as one command up to this size. 1 MiB: the
/// largest request the Linux block layer builds by default
/// (`max_sectors_kb` = 1280) rounded down to a power of two. A backing
/// store that takes less (an NBD upstream advertising a smaller maximum
/// block size) gets it in pieces from the driver.
pub const MAX_DESTAGE_RUN_BYTES: u64 = 1 << 20;

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

/// The engine. See the module docs.
pub struct Engine<P: Payload> {
    table: SlotTable,
    map: BlockMap,
    commits: CommitState<P>,
    patch: PatchState<P>,
    bypass: BypassState,
    destage: DestageState,
    /// Bytes read for each destage run not yet written, by (plan, run).
    destage_parts: HashMap<(u32, u32), Vec<Option<P>>>,
    /// Runs of gated plans (`Plan::after`) read and waiting for their gate:
    /// (plan, backing offset, data, copies).
    destage_held: Vec<(u32, u64, P, u32)>,
    cfg: Config,
    layout: Layout,
    bs: u64,
    policy: Box<dyn WritePolicy>,
    repl: Box<dyn Replacement>,
    reqs: IdMap<ReqId, Req<P>>,
    pieces: Slab<Piece<P>>,
    piece_queue: VecDeque<u32>,
    active_pieces: u32,
    max_active: u32,
    alloc_waiters: VecDeque<u32>,
    /// Writes waiting to be admitted (FIFO) until their slots can be reserved.
    admit_queue: VecDeque<Admit<P>>,
    /// Writes held, in arrival order, while a clean-shutdown record is the
    /// durable one (`CommitState::vouched`).
    held: VecDeque<Rw<P>>,
    ios: IdMap<IoId, IoCtx>,
    next_io: IoId,
    out_io: VecDeque<IoCmd<P>>,
    out_reply: VecDeque<Reply<P>>,
    out_event: VecDeque<Event>,
    retry_at: Option<u64>,
    /// Retries a clean stop has left (`STOP_RETRIES` at its start): a
    /// failure during the stop (its final commit, a destage, a backing
    /// FLUSH) is retried after `retry_ns`, and the stop is not idle while a
    /// retry is due, until these run out.
    stop_tries: u32,
    drain: bool,
    shutting_down: bool,
    next_seq: u64,
    now: u64,
    stats: Stats,
    /// Valid byte range of each partial version, by slot (see [`partial`]);
    /// a slot not in here holds its whole block.
    partial: IdMap<u32, (u32, u32)>,
    /// Lazy patches may be persisted as partial versions (a cache formatted
    /// at `FORMAT_VERSION` 2 or later: older readers do not know `F_PARTIAL`).
    partial_ok: bool,
    /// Log records may carry their versions' bytes (`F_INLINE`: a cache
    /// formatted at `FORMAT_VERSION` 4 or later: older readers would take
    /// such a record for the end of the log).
    inline_ok: bool,
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
        let grouped = matches!(
            cfg.write_policy,
            WritePolicyKind::Ordered | WritePolicyKind::Journaled | WritePolicyKind::JournaledHints
        );
        let ranged = cfg.write_policy == WritePolicyKind::Ordered;
        Engine {
            table: SlotTable::new(cap, grouped, ranged),
            map: BlockMap::new(cap),
            commits: CommitState::new(layout.pages() as usize),
            patch: PatchState::default(),
            bypass: BypassState::new(&cfg),
            destage: DestageState::default(),
            destage_parts: HashMap::new(),
            destage_held: Vec::new(),
            layout,
            bs,
            policy,
            repl,
            reqs: IdMap::default(),
            pieces: Slab::default(),
            piece_queue: VecDeque::new(),
            active_pieces: 0,
            max_active,
            alloc_waiters: VecDeque::new(),
            admit_queue: VecDeque::new(),
            held: VecDeque::new(),
            ios: IdMap::default(),
            next_io: 1,
            out_io: VecDeque::new(),
            out_reply: VecDeque::new(),
            out_event: VecDeque::new(),
            retry_at: None,
            stop_tries: 0,
            drain: false,
            shutting_down: false,
            next_seq: 1,
            now: 0,
            stats: Stats::default(),
            partial: IdMap::default(),
            partial_ok: true,
            inline_ok: true,
            cfg,
        }
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
    /// Whether a device command or a reply waits to be polled (what a pump
    /// that drained the engine MUST have left: none).
    pub fn has_output(&self) -> bool {
        !self.out_io.is_empty() || !self.out_reply.is_empty()
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
        let commit_blocked = self.commits.job.is_some()
            || self.stop_holds_commits()
            || self.commits.inplace_inflight > 0
            || self.patch.barrier
                && self.policy.commit_needs_patches_done()
                && !self.patch.sets.is_empty();
        if self.commits.asap && !commit_blocked {
            min(self.now);
        }
        if let Some(t) = self.commits.oldest_change.filter(|_| !commit_blocked) {
            min(t.saturating_add(self.cfg.autocommit_ns));
        }
        if let Some(t) = self.retry_at {
            min(t);
        }
        if self.destage.pace_blocked {
            // Paced cleaning waits for its next turn, or for pacing to end.
            min(self.destage.pace_next.min(self.destage.paced_until));
        }
        d
    }

    /// Counters.
    pub fn stats(&self) -> Stats {
        let mut s = self.stats.clone();
        s.dirty_blocks = self.table.dirty;
        s.cached_blocks = self.cfg.capacity_blocks - self.map.free_rids.len() as u64;
        s.free_slots = self.table.free.len() as u64;
        s.patched_blocks = self.patch.sets.len() as u64;
        s.patch_bytes = self.patch.bytes;
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
        self.table.dirty
            + self.patch.sets.len() as u64
            + u64::from(self.patch.direct_unflushed || self.patch.direct_cover_inflight > 0)
    }
    /// What a journal bound (`JournalConfig::size_blocks`) counts: dirty
    /// versions, new versions being written, and slots reserved by
    /// admitted writes. Under the bound it MUST stay within
    /// `size_blocks`, except for a single larger write admitted alone.
    pub fn journal_blocks(&self) -> u64 {
        self.table.dirty + self.table.writing + self.table.reserved
    }
    /// Highest durable commit.
    pub fn durable_commit(&self) -> u64 {
        self.commits.durable
    }
    /// Nothing in flight: no requests, no device commands, no plans, no
    /// commit, and during a clean stop no retry due (`stop_tries`).
    pub fn is_idle(&self) -> bool {
        !(self.shutting_down && self.retry_at.is_some() && self.stop_tries > 0)
            && self.reqs.is_empty()
            && self.admit_queue.is_empty()
            && self.held.is_empty()
            && self.ios.is_empty()
            && self.commits.job.is_none()
            && self.destage.plans.is_empty()
            && (self.patch.sets.is_empty() || !self.shutting_down)
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
            self.table.reserved,
            self.piece_queue.len(),
            self.active_pieces,
            self.alloc_waiters.len(),
            self.table.free.len(),
            self.table.retired_pending,
            self.table.dirty,
            self.map.index.len(),
            self.ios.len(),
            self.destage.plans.len(),
            self.destage.inflight,
            self.commits.job.as_ref().map(|c| (c.n, c.stage)),
            self.commits.waiters.len(),
            self.commits.meta_dirty.len(),
            self.commits.inplace_inflight,
            self.commits.deferred,
            self.policy.counters(),
        )
    }

    /// Requests in flight.
    pub fn requests_in_flight(&self) -> usize {
        self.reqs.len()
    }
    /// Bytes of RAM used by the engine's per-block state (slots, blocks, index, replacement, policy).
    pub fn mem_bytes(&self) -> usize {
        self.table.slots.capacity() * std::mem::size_of::<Slot>()
            + self.table.groups.capacity() * std::mem::size_of::<Group>()
            + self.table.ranges.capacity() * 8
            // Partial versions: key, range, and about one control byte.
            + self.partial.capacity() * 13
            + self.map.blocks.capacity() * std::mem::size_of::<Block>()
            + self.map.index.mem_bytes()
            + self.table.free.mem_bytes()
            + self.map.free.mem_bytes()
            + self.map.free_rids.mem_bytes()
            + self.map.rid_block.capacity() * 4
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
            !self.reqs.contains_key(&req.id) && !self.held.iter().any(|w| w.id == req.id),
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
                let rw = Rw {
                    id: req.id,
                    offset,
                    len: len as u64,
                    data: None,
                    fua: false,
                    tag: req.tag,
                };
                self.start_rw(rw, Route::Cache);
            }
            ReqOp::Write { offset, data, fua } => {
                let len = data.len() as u64;
                if self.refuse_write(req.id, offset, len) {
                    return;
                }
                self.admit_write(req.id, offset, len, data, fua, req.tag);
            }
            ReqOp::WriteZeroes { offset, len, fua } => {
                if self.refuse_write(req.id, offset, len as u64) {
                    return;
                }
                let zeroes = P::zeroes(len as usize);
                self.admit_write(req.id, offset, len as u64, zeroes, fua, req.tag);
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

    /// Count a write of `len` bytes at `offset` and answer it at once if it
    /// is out of range, empty or too large (returns true then).
    fn refuse_write(&mut self, id: ReqId, offset: u64, len: u64) -> bool {
        self.stats.writes += 1;
        self.stats.write_bytes += len;
        let refusal = if !self.in_range(offset, len) {
            Err(ReqError::InvalidRange)
        } else if len == 0 {
            Ok(None)
        } else if self.spans(offset, len) > self.max_write_bytes() / self.bs {
            Err(ReqError::TooLarge)
        } else {
            return false;
        };
        self.reply(id, refusal, 0);
        true
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
                    let lbn = self.pieces.get(piece).lbn;
                    self.settle(lbn, res.is_ok());
                    self.on_piece_io_done(piece, res.is_ok());
                }
            }
            IoCtx::BypassWrite {
                pieces,
                orphans,
                fua,
            } => {
                if res.is_ok() && !fua && !pieces.is_empty() {
                    // Acknowledged below, volatile on the backing store: the
                    // next FLUSH flushes it first (`flush_after_patches`).
                    self.patch.direct_unflushed =
                        !crate::mutation::active(crate::mutation::Mutation::FlushSkipsBypassCover);
                }
                for (piece, block) in pieces {
                    let lbn = self.map.blocks[block as usize].lbn();
                    self.settle(lbn, res.is_ok());
                    self.bypass.io.remove(&block);
                    // A reissue waiting for a slot is moot now.
                    self.bypass.pending_reissues.retain(|r| r.0 != block);
                    self.on_piece_io_done(piece, res.is_ok());
                }
                for block in orphans {
                    self.on_orphan_done(block);
                }
            }
            IoCtx::Fill { block, slot } => self.on_fill(block, slot, res.is_ok()),
            IoCtx::DestageRead { plan, run, part } => self.on_destage_read(plan, run, part, res),
            IoCtx::DestageWrite { plan, copies } => {
                self.on_destage_write(plan, copies, res.is_ok())
            }
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
            self.retry_commit_record();
            if self.shutting_down {
                // A clean stop tries its final commit again (`stop_tries`).
                self.stop_tries = self.stop_tries.saturating_sub(1);
                self.commits.asap = true;
            }
        }
        self.progress();
    }

    /// The driver reports sent replies: it MUST then call
    /// [`Engine::handle_replies_sending`] before any reply the engine has
    /// released (`poll_reply`) can be seen by a client, that is, before it
    /// starts sending replies, each time. Call before the first request.
    ///
    /// Ordered write-back then counts a write as complete, for the writes
    /// issued after it, from that call on rather than from the moment its
    /// data is in the cache: requests that arrived together (before any of
    /// their replies went out) are independent, as they are at the client,
    /// and their writes can be destaged in one wave. Without it, a driver
    /// that completes each request before it reads the next (the server's
    /// inline path) makes every write depend on the one before.
    pub fn set_reply_events(&mut self, on: bool) {
        self.policy.set_reply_events(on);
    }

    /// Replies may be seen by clients from now on (see
    /// [`Engine::set_reply_events`]).
    pub fn handle_replies_sending(&mut self, now: u64) {
        self.set_now(now);
        self.policy.on_replies_sending(now);
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
        if !self.bypass.active || !self.reqs.contains_key(&id) {
            return;
        }
        let queued: Vec<u32> = self
            .piece_queue
            .iter()
            .chain(self.map.waiters.values().flatten())
            .copied()
            .filter(|&p| self.pieces.get(p).req == id)
            .collect();
        for p in queued {
            let pc = self.pieces.get_mut(p);
            pc.critical = true;
            if self.bypass.admission.reissue() && pc.bypass {
                pc.bypass = false;
                // Now cached: a FUA reply waits for a commit.
                self.reqs.get_mut(&id).expect("checked above").cached = true;
            }
        }
        let inflight: Vec<u32> = self
            .bypass
            .io
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

    /// A clean stop that ran out of retries (`STOP_RETRIES`) before its
    /// final commit succeeded: it ends without a clean-shutdown record, and
    /// the next start recovers as after a crash (cold).
    pub fn stop_gave_up(&self) -> bool {
        self.shutting_down && self.stop_tries == 0 && !self.commits.vouched
    }

    /// Begin a clean shutdown: new requests fail with `Shutdown`; once nothing is
    /// in flight a final commit records a clean shutdown. A failure on the
    /// way (the final commit, a destage, a backing FLUSH) is retried after
    /// `retry_ns`, up to [`STOP_RETRIES`] times. Done when [`Engine::is_idle`].
    pub fn start_shutdown(&mut self, now: u64) {
        self.set_now(now);
        self.shutting_down = true;
        self.stop_tries = STOP_RETRIES;
        self.commits.asap = true;
        // Writes held for the commit that would end a warm restart's
        // vouching never started: they fail like requests arriving now.
        for rw in std::mem::take(&mut self.held) {
            self.reply(rw.id, Err(ReqError::Shutdown), 0);
        }
        self.materialize_all();
        self.progress();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    /// `Engine::mem_bytes` counts each per-block structure once, at its
    /// element size (docs/ARCHITECTURE.md, "Memory per cached block"):
    /// growing any one of them grows the estimate by exactly that
    /// structure's bytes. `tests/accounting.rs` checks the estimate's size
    /// per block and its growth within bounds loose enough that a term
    /// counted with the wrong sign or factor passed them (mutation testing:
    /// engine.rs lines 380-392).
    #[test]
    fn mem_bytes_counts_each_structure_once_at_its_size() {
        type Grow = fn(&mut Engine<Bytes>, &Config) -> (usize, usize);
        fn vec_grow<T>(v: &mut Vec<T>, size: usize) -> (usize, usize) {
            let c = v.capacity();
            v.reserve_exact(c + 100);
            (c * size, v.capacity() * size)
        }
        let grows: [(&str, Grow); 12] = [
            ("slots", |e, _| {
                vec_grow(&mut e.table.slots, std::mem::size_of::<Slot>())
            }),
            ("groups", |e, _| {
                vec_grow(&mut e.table.groups, std::mem::size_of::<Group>())
            }),
            ("ranges", |e, _| vec_grow(&mut e.table.ranges, 8)),
            ("partial", |e, _| {
                let c = e.partial.capacity();
                e.partial.reserve(c + 100);
                (c * 13, e.partial.capacity() * 13)
            }),
            ("blocks", |e, _| {
                vec_grow(&mut e.map.blocks, std::mem::size_of::<Block>())
            }),
            ("index", |e, cfg| {
                let old = e.map.index.mem_bytes();
                e.map.index = LbnIndex::with_capacity(4 * cfg.capacity_blocks as usize);
                (old, e.map.index.mem_bytes())
            }),
            ("free slots", |e, cfg| {
                let old = e.table.free.mem_bytes();
                e.table.free = FreeSet::new(4 * cfg.capacity_blocks as usize, true);
                (old, e.table.free.mem_bytes())
            }),
            ("free blocks", |e, cfg| {
                let old = e.map.free.mem_bytes();
                e.map.free = FreeSet::new(4 * cfg.capacity_blocks as usize, true);
                (old, e.map.free.mem_bytes())
            }),
            ("free rids", |e, cfg| {
                let old = e.map.free_rids.mem_bytes();
                e.map.free_rids = FreeSet::new(4 * cfg.capacity_blocks as usize, true);
                (old, e.map.free_rids.mem_bytes())
            }),
            ("rid_block", |e, _| vec_grow(&mut e.map.rid_block, 4)),
            ("replacement", |e, cfg| {
                let old = e.repl.mem_bytes();
                e.repl = nvwc_replacement::build(cfg.replacement, 4 * cfg.capacity_blocks as usize);
                (old, e.repl.mem_bytes())
            }),
            ("policy", |e, cfg| {
                // Journaled's (a constant) for write-back's or ordered's
                // (none while nothing is cached), none for journaled's.
                let old = e.policy.mem_bytes();
                let mut c = cfg.clone();
                c.write_policy = if old == 0 {
                    WritePolicyKind::Journaled
                } else {
                    WritePolicyKind::WriteBack
                };
                e.policy = write_policy::build(&c);
                (old, e.policy.mem_bytes())
            }),
        ];
        for policy in [
            WritePolicyKind::WriteBack,
            WritePolicyKind::Ordered,
            WritePolicyKind::Journaled,
        ] {
            let cfg = Config::new(4096, 256, 1024 * 4096, policy);
            let mut e: Engine<Bytes> = Engine::new(cfg.clone()).expect("valid");
            for (what, grow) in grows {
                let m = e.mem_bytes();
                let (old, new) = grow(&mut e, &cfg);
                assert_ne!(new, old, "{policy} {what}: changed");
                assert_eq!(e.mem_bytes(), m - old + new, "{policy} {what}");
            }
        }
    }
}
