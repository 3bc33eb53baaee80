//! Bypass and write-through: pieces that go straight to the backing
//! store (admission said no, or the policy is synchronous), adjacent
//! pieces batched into one backing write, and criticality inheritance
//! (a bypassed write a critical request waits on is reissued as cached).

use super::*;

impl<P: Payload> Engine<P> {
    pub(super) fn count_bypassed(&mut self, p: u32) {
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
    pub(super) fn can_bypass(&self, p: u32, b: u32) -> bool {
        let blk = &self.map.blocks[b as usize];
        let local = blk.latest == NIL
            && blk.shadows == 0
            && blk.destaging == 0
            && !self.patch.sets.contains_key(&b)
            && !self.table.retired_lbns.contains_key(&blk.lbn());
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
                    self.destage.inflight == 0
                        && self.destage.plans.is_empty()
                        && self.patch.sets.is_empty()
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
    pub(super) fn journal_bypass_ok(&self, first: u64, last: u64) -> bool {
        if !(self.policy.kind().journaled()
            && self.policy.bypass_ok()
            && self.destage.inflight == 0
            && self.destage.plans.is_empty()
            && self.patch.sets.is_empty()
            && self.admit_queue.is_empty()
            && self.piece_queue.is_empty())
        {
            return false;
        }
        (first..=last).all(|lbn| {
            let Some(b) = self
                .map
                .index
                .get(lbn, |id| self.map.blocks[id as usize].lbn())
            else {
                return !self.table.retired_lbns.contains_key(&lbn);
            };
            let blk = &self.map.blocks[b as usize];
            !blk.busy
                && blk.latest == NIL
                && blk.shadows == 0
                && blk.destaging == 0
                && !self.map.waiters.contains_key(&b)
                && !self.table.retired_lbns.contains_key(&lbn)
        })
    }

    /// Write a rejected piece straight to the backing store. Under write-back
    /// it is an ordinary write (FUA if the client asked): once it completes,
    /// the next FLUSH issues a backing FLUSH before its commit, as for direct
    /// patch writes (`flush_after_patches`). Under ordered and journaled it
    /// carries FUA: acknowledged only once durable there, so no FLUSH waits
    /// for it. The block stays busy until it completes (reads and writes of
    /// it wait, as for any write piece).
    ///
    /// Crash story: before the backing write completes the write is not
    /// acknowledged and either outcome is allowed. After, under write-back,
    /// it is on the backing store and durable once a FLUSH answered after it
    /// (a crash before may lose it: allowed, it was never flushed); under
    /// ordered and journaled it is durable at once. Either way the cache
    /// holds nothing of the block that recovery could put over it (`can_bypass`).
    pub(super) fn bypass_piece(&mut self, p: u32, b: u32) {
        self.count_bypassed(p);
        let pc = self.pieces.get_mut(p);
        pc.ios = 1;
        pc.counted = false;
        self.active_pieces -= 1;
        self.bypass.batch.push((p, b));
    }

    /// Emit the write-through pieces of this round: each run of adjacent
    /// pieces of one request is one backing write, as the client sent it
    /// (a 1 MiB write is one command to a slow backing store, not 256 that
    /// queue for its connections).
    pub(super) fn flush_through_batch(&mut self) {
        if self.bypass.through_batch.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.bypass.through_batch);
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
    pub(super) fn flush_bypass_batch(&mut self) {
        if self.bypass.batch.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.bypass.batch);
        let pieces: Vec<u32> = batch.iter().map(|&(p, _)| p).collect();
        // Write-back: an ordinary write (FUA only if the client asked), made
        // durable by the next FLUSH (`BypassWrite`'s completion marks the
        // backing store unflushed). Ordered and journaled keep FUA: their
        // bypass conditions assume every acknowledged write is durable on
        // the backing store before later destages are issued.
        let plain = self.policy.kind() == WritePolicyKind::WriteBack;
        for (run, offset, data) in self.adjacent_runs(&pieces, |_, _| true) {
            let run = &batch[run];
            let fua = !plain || self.pieces.get(run[0].0).fua;
            let io = self.emit(
                Dev::Backing,
                IoOp::Write { offset, data, fua },
                None,
                IoCtx::BypassWrite {
                    pieces: run.to_vec(),
                    orphans: Vec::new(),
                    fua,
                },
            );
            for &(p, b) in run {
                self.bypass.io.insert(b, (p, io));
            }
        }
    }

    /// Split `pieces` (in order) into runs of adjacent pieces of one request
    /// that `same(i, j)` also allows together: each run's index range, its
    /// first byte on the backing store, and its data.
    pub(super) fn adjacent_runs(
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
    pub(super) fn on_orphan_done(&mut self, b: u32) {
        self.stats.discarded_completions += 1;
        assert!(
            self.map.blocks[b as usize].destaging > 0,
            "orphan bypass write without its block mark"
        );
        self.writeback_end(b);
        self.maybe_drop_block(b);
    }

    /// A critical request waits for busy block `b`: follow the dependency
    /// chain to what the holder itself waits on (cascading dependencies,
    /// §4.2.3) and speed that up. The holder inherits criticality (so later
    /// waiters on whatever it waits for follow the chain on); a bypass write
    /// in flight is reissued to the cache (I/O criticality inheritance,
    /// §4.2.2); a holder waiting for a free slot moves to the head of that queue.
    pub(super) fn inherit(&mut self, b: u32) {
        let Some(&h) = self.bypass.holders.get(&b) else {
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
        if let Some(&(p, io)) = self.bypass.io.get(&b) {
            assert_eq!(p, h, "bypass write of a block another piece holds");
            if self.bypass.admission.reissue() {
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
    /// whole-block piece (a partial one would need the block's other bytes).
    ///
    /// It needs a spare free slot. When there is none, the reissue waits
    /// for one ([`BypassState::pending_reissues`]): `ensure_free` evicts a
    /// clean block for it, and `progress` retries it as soon as a slot is
    /// free, if the backing write is still in flight by then (else the
    /// piece has completed from the backing store, and nothing is left to
    /// do). This is the paper's "immediate reissue" in a cache whose clean
    /// blocks are reused only after a commit: FlashCache, which the paper
    /// modified, writes a reissued block into a clean block's place at
    /// once; refusing the reissue instead left the critical process
    /// waiting for the disk's whole queue whenever the cache was full of
    /// clean data (`reports/admission.md`, the timeline).
    ///
    /// Crash story: the version is dirty and newer than anything recovery
    /// could find for the block (it had none, `can_bypass`); the old backing
    /// write carries the same bytes, and holds the block's `destaging` count
    /// until it completes, so no destage of a later version can land first.
    pub(super) fn reissue(&mut self, b: u32, p: u32, io: IoId) {
        if self.policy.kind() != WritePolicyKind::WriteBack {
            return;
        }
        let (lbn, start, end) = {
            let pc = self.pieces.get(p);
            (pc.lbn, pc.start, pc.end)
        };
        if start != 0 || end as u64 != self.bs {
            return;
        }
        if self.table.free.len() as u64 <= self.table.reserved {
            if !self.bypass.pending_reissues.contains(&(b, p, io)) {
                self.bypass.pending_reissues.push_back((b, p, io));
            }
            return;
        }
        let Some(s) = self.alloc_slot(lbn) else {
            return;
        };
        match self.ios.get_mut(&io) {
            Some(IoCtx::BypassWrite {
                pieces, orphans, ..
            }) => {
                let at = pieces
                    .iter()
                    .position(|&(x, _)| x == p)
                    .expect("reissued piece is part of its bypass write");
                pieces.swap_remove(at);
                orphans.push(b);
            }
            _ => panic!("reissued a bypass write that is not in flight"),
        }
        self.bypass.io.remove(&b);
        self.writeback_begin(b);
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

    /// Retry the reissues that waited for a free slot, oldest first, while
    /// spare slots are free. One whose backing write is no longer in flight
    /// is dropped (the piece completed from the backing store). Returns
    /// whether any ran or was dropped.
    pub(super) fn retry_reissues(&mut self) -> bool {
        let mut changed = false;
        while self.table.free.len() as u64 > self.table.reserved {
            let Some((b, p, io)) = self.bypass.pending_reissues.pop_front() else {
                break;
            };
            changed = true;
            if self.bypass.io.get(&b) == Some(&(p, io)) {
                self.reissue(b, p, io);
            }
        }
        changed
    }
}

/// Admission and bypass state. The maps are used only when admission can
/// reject writes (`active`), so the `all` fast path pays nothing.
pub(super) struct BypassState {
    pub(super) admission: Box<dyn Admission>,
    /// Admission may reject writes (any policy but `all`).
    pub(super) active: bool,
    /// Writes that would wait for space go around the cache
    /// (`Config::bypass_when_full`, write-back only).
    pub(super) when_full: bool,
    /// Track what `can_bypass` needs (released versions a durable commit
    /// still names): whenever a write may bypass, `active || when_full`.
    pub(super) tracking: bool,
    /// Bypass writes in flight: block -> (piece, backing write).
    pub(super) io: IdMap<u32, (u32, IoId)>,
    /// Bypass pieces started in this `progress` round, not yet emitted:
    /// adjacent pieces of one request become one backing write.
    pub(super) batch: Vec<(u32, u32)>,
    /// Write-through pieces started in this `progress` round, not yet
    /// emitted: (piece, FUA). Adjacent pieces of one request become one backing write.
    pub(super) through_batch: Vec<(u32, bool)>,
    /// The write piece holding each busy block (the blocking object a
    /// waiter's dependency chain follows).
    pub(super) holders: IdMap<u32, u32>,
    /// Reissues waiting for a free slot: (block, piece, backing write), in
    /// the order they were asked for ([`Engine::reissue`]). Each counts as a
    /// slot wanted (`free_wanted`), so clean blocks are evicted for it.
    pub(super) pending_reissues: VecDeque<(u32, u32, IoId)>,
    /// Blocks a failed backing write (bypassed or written through) may
    /// have reached in part, volatile: a read of them MUST NOT fill the
    /// cache with what it returns, since a clean copy promises the backing
    /// store's durable bytes and a power loss may take those back (VOPR
    /// journaled-hints seed 12401). A later write of the block settles it.
    pub(super) unsettled: std::collections::HashSet<u64>,
}

impl BypassState {
    pub(super) fn new(cfg: &Config) -> Self {
        let active = cfg.admission != AdmissionKind::All;
        let when_full = cfg.bypass_when_full && cfg.write_policy == WritePolicyKind::WriteBack;
        BypassState {
            admission: admission::build(cfg.admission, &cfg.wal_ranges),
            active,
            when_full,
            tracking: active || when_full,
            io: IdMap::default(),
            batch: Vec::new(),
            through_batch: Vec::new(),
            holders: IdMap::default(),
            pending_reissues: VecDeque::new(),
            unsettled: Default::default(),
        }
    }
}
