//! Progress and destage: the round that runs everything runnable, clean
//! eviction, and destage plans from the write policy to the backing store.

use super::*;

/// The engine's view offered to write policies while they plan.
pub(super) struct View<'a> {
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
    plans: &'a Slab<PlanExec>,
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
            // MUST hold for every block the replacement policy has marked
            // (`Engine::writeback_begin`): the policy may skip those unasked.
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
    fn copies_pending(&self) -> bool {
        self.plans
            .iter()
            .any(|(_, pe)| pe.gate.is_none() && !pe.cancelled && pe.left > 0)
    }
}

impl<P: Payload> Engine<P> {
    // ---------------------------------------------------------------- progress

    /// Run everything that can run now.
    pub(super) fn progress(&mut self) {
        for _ in 0..64 {
            let mut changed = false;
            // Stalled writers take freed slots first.
            while !self.table.free.is_empty() {
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
            changed |= self.retry_reissues();
            changed |= self.release_held();
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

    /// Evict clean blocks to keep `free_reserve` slots (plus one per stalled
    /// writer) ready, and room for every write waiting for admission: the
    /// slots evicted wait for the next commit (`retired_pending`), and one
    /// commit then frees room for all of them. Evicting only the next
    /// write's room cost a commit (a cache device sync) per waiting write
    /// with the cache full: ordered write-64k QD16 over a 1 ms backing ran
    /// at one commit per request. At most `max_destage_inflight` slots are
    /// evicted ahead this way (one destage batch's worth): an open-loop
    /// simulation can queue thousands of writes, and evicting room for all
    /// of them at once would empty the cache of clean blocks (and summing
    /// the queue at every step cost quadratic time).
    pub(super) fn ensure_free(&mut self) -> bool {
        let cap = u64::from(self.cfg.max_destage_inflight);
        let mut queued = 0u64;
        for a in self.admit_queue.iter().skip(1) {
            if queued >= cap {
                break;
            }
            queued += a.need;
        }
        self.evict_clean_until(self.free_wanted() + self.reclaim_ahead() + queued.min(cap))
    }

    /// Free slots a write of new blocks leaves untouched: while cleaning is
    /// paced, the reserve and the slots evicted ahead of it stay for writes
    /// that cannot go around the cache (the new blocks go around instead);
    /// none otherwise. A direct write MUST find this many spare too, or it
    /// would go around the cache after all (`Engine::handle_direct_write`).
    pub(super) fn full_keep(&self) -> u64 {
        if self.pacing() {
            self.cfg.free_reserve as u64 + self.reclaim_ahead()
        } else {
            0
        }
    }

    /// Slots to evict beyond those wanted now, so that one reclaiming
    /// commit frees several: a reserve's worth while cleaning is paced
    /// (then the reserve is used one slot at a time by writes that cannot
    /// go around the cache, and a commit per slot would cost a cache sync
    /// each), none otherwise.
    pub(super) fn reclaim_ahead(&self) -> u64 {
        if self.pacing() {
            self.cfg.free_reserve as u64
        } else {
            0
        }
    }

    /// Evict clean, idle blocks (the replacement policy's victims) until
    /// free slots plus those a commit will free reach `want`, or no victim
    /// is left. Returns whether it evicted any.
    pub(super) fn evict_clean_until(&mut self, want: u64) -> bool {
        let mut changed = false;
        while (self.table.free.len() as u64 + self.table.retired_pending) < want {
            let blocks = &self.map.blocks;
            let slots = &self.table.slots;
            let rid_block = &self.map.rid_block;
            let waiters = &self.map.waiters;
            let pinned = |id: BlockId| {
                let b = rid_block[id.0 as usize];
                let blk = &blocks[b as usize];
                let s = &slots[blk.latest as usize];
                blk.busy || s.refs > 0 || s.destaging() || s.dirty() || waiters.contains_key(&b)
            };
            let Some(v) = self.repl.victim_clean(&pinned) else {
                break;
            };
            let b = self.map.rid_block[v.0 as usize];
            assert!(
                !self.table.slots[self.map.blocks[b as usize].latest as usize].dirty(),
                "replacement chose a dirty victim"
            );
            self.evict_block(b);
            self.stats.evictions += 1;
            changed = true;
        }
        changed
    }

    pub(super) fn space_pressure(&self) -> bool {
        !self.alloc_waiters.is_empty() || !self.admit_queue.is_empty()
    }

    /// Free slots wanted now: the reserve, promised slots, and the next admission.
    pub(super) fn free_wanted(&self) -> u64 {
        self.cfg.free_reserve as u64
            + self.table.reserved
            + self.alloc_waiters.len() as u64
            + self.bypass.pending_reissues.len() as u64
            + self.admit_queue.front().map_or(0, |a| a.need)
    }

    pub(super) fn plan(&mut self) -> bool {
        self.destage.pace_blocked = false;
        if self.retry_at.is_some() || self.shutting_down && self.drain_done() {
            return false;
        }
        let mut changed = false;
        for _ in 0..16 {
            let cap = self.cfg.capacity_blocks;
            // A clean stop cleans only for a drain or for writers waiting
            // for a slot: its final commit keeps the dirty data in the
            // cache, and writing it back down to the low watermark first
            // only delays the stop (by about a second with a 128 MiB cache
            // over a 1 ms backing store: `scripts/bench-nbw.sh`).
            let wanted = self.drain && self.table.dirty > 0
                || self.space_pressure()
                || !self.shutting_down
                    && self.repl.should_clean(
                        self.table.dirty,
                        cap,
                        self.destage.cleaning,
                        self.cfg.watermarks,
                    );
            self.destage.cleaning = wanted;
            // Pressure for the write policy: writers wait and the slots
            // already on their way back (evicted, freed at the next metadata
            // commit) do not cover them. A wait that only needs that commit
            // is not a reason for a policy to act (journaled-hints would close
            // a transaction off a FLUSH boundary for nothing).
            let coming = self.table.free.len() as u64 + self.table.retired_pending;
            let pressure = self.space_pressure() && coming < self.free_wanted() || self.drain;
            let paced = wanted && self.paced();
            if paced && self.now < self.destage.pace_next {
                self.destage.pace_blocked = true;
                break;
            }
            let mut view = View {
                now: self.now,
                repl: &mut *self.repl,
                blocks: &self.map.blocks,
                slots: &self.table.slots,
                groups: &self.table.groups,
                rid_block: &self.map.rid_block,
                wanted,
                pressure,
                inflight: self.destage.inflight,
                limit: self.cfg.max_destage_inflight as usize,
                ids: std::mem::take(&mut self.destage.victim_ids),
                plans: &self.destage.plans,
            };
            let next = self.policy.next_plan(&mut view);
            self.destage.victim_ids = view.ids;
            let Some(plan) = next else {
                break;
            };
            if paced {
                self.pace_after(plan.write.len() as u64);
            }
            self.start_plan(plan, paced);
            changed = true;
        }
        changed
    }

    /// Is cleaning paced now (`Config::full_clean_secs`)? Only while writes
    /// go around the full cache, and never when a writer waits for a slot
    /// (it cannot go around: only cleaning frees one), while draining or
    /// stopping. MUST be false whenever a request waits on cleaning, so
    /// that pacing delays no request.
    fn paced(&self) -> bool {
        self.pacing()
            && !self.space_pressure()
            && self.table.free.len() as u64 + self.table.retired_pending >= self.free_wanted()
            && !self.drain
            && !self.shutting_down
    }

    /// Writes are going around the full cache and cleaning is paced
    /// (`Config::full_clean_secs`): new blocks also go around rather than
    /// take the reserve's last `free_reserve` slots, which stay for writes
    /// that cannot go around (their block is cached). The cleaner refills
    /// the reserve at full speed (`paced`).
    pub(super) fn pacing(&self) -> bool {
        // `paced_until` moves only when a write goes around the full cache,
        // which only `bypass_when_full` does.
        debug_assert!(self.destage.paced_until == 0 || self.bypass.when_full);
        self.cfg.full_clean_secs > 0 && self.now < self.destage.paced_until
    }

    /// A paced plan of `n` blocks starts now: the next may start once the
    /// pace (`excess / full_clean_secs` blocks per second) has paid for these.
    fn pace_after(&mut self, n: u64) {
        let floor = (self.cfg.watermarks.low * self.cfg.capacity_blocks as f64) as u64;
        let excess = self.table.dirty.saturating_sub(floor).max(1);
        let gap = n.saturating_mul(u64::from(self.cfg.full_clean_secs) * 1_000_000_000) / excess;
        self.destage.pace_next = self.destage.pace_next.max(self.now).saturating_add(gap);
    }

    /// A write went around the full cache: clean at a pace for a while.
    pub(super) fn note_full_bypass(&mut self) {
        if self.cfg.full_clean_secs > 0 {
            self.destage.paced_until = self.now.saturating_add(crate::config::FULL_IDLE_NS);
        }
    }

    pub(super) fn drain_done(&self) -> bool {
        self.table.dirty == 0
    }

    /// Start destaging `plan`. `fua`: its copies are FUA writes and it ends
    /// without a backing FLUSH. Paced cleaning does so: its few copies run
    /// among many writes sent around the cache, and a FLUSH of the backing
    /// store would write all of those back too, each time (a local file's
    /// sync writes back every dirty page; a FUA write, only its own range).
    pub(super) fn start_plan(&mut self, plan: Plan, fua: bool) {
        for &s in &plan.write {
            let slot = &mut self.table.slots[s as usize];
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
            .map(|&s| self.table.slots[s as usize].block)
            .collect();
        assert!(
            blocks.iter().all(|&b| b != NIL),
            "plan names a version without a block"
        );
        for &b in &blocks {
            self.writeback_begin(b);
        }
        // A gated plan's writes count toward the destage limit once its
        // gate has ended (`release_gated`).
        let gate = plan.after.map(|tag| {
            self.destage
                .plans
                .iter()
                .find(|(_, pe)| pe.plan.tag == tag)
                .map(|(pid, _)| pid)
                .expect("a plan gated on a plan not in flight")
        });
        assert!(
            gate.is_none() || plan.atomic_group.is_none(),
            "a gated plan in an atomic group"
        );
        if gate.is_none() {
            self.destage.inflight += plan.write.len();
        }
        self.stats.destage_plans += 1;
        let group = plan.atomic_group;
        let n = plan.write.len() as u32;
        let pid = self.destage.plans.insert(PlanExec {
            plan,
            blocks,
            left: n,
            failed: false,
            fua: fua && group.is_none(),
            runs: Vec::new(),
            gate,
            copied_early: false,
            cancelled: false,
        });
        if gate.is_some() {
            self.destage.gated.push(pid);
        }
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

    /// Read the plan's copies from the cache; each run of copies whose
    /// backing bytes are contiguous (at most [`MAX_DESTAGE_RUN_BYTES`]) is
    /// then written as one backing command (`on_destage_read`), as
    /// dm-writecache's writeback puts contiguous blocks in one bio: over a
    /// network store, one round trip instead of one per block.
    pub(super) fn plan_copy(&mut self, pid: u32) {
        let pe = self.destage.plans.get(pid);
        let (n, exact) = (pe.plan.write.len(), pe.plan.exact);
        if n == 0 {
            return self.plan_copied(pid);
        }
        // (backing offset, cache offset, length) of each copy.
        let mut copies: Vec<(u64, u64, u32)> = Vec::with_capacity(n);
        for i in 0..n {
            let pe = self.destage.plans.get(pid);
            let (s, b) = (pe.plan.write[i], pe.blocks[i]);
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
            let at = self.map.blocks[b as usize].lbn() * self.bs + u64::from(lo);
            copies.push((at, self.layout.slot_offset(s) + u64::from(lo), hi - lo));
        }
        // Stable: copies of one address (never two in a plan) keep their order.
        copies.sort_by_key(|c| c.0);
        let mut runs: Vec<RunExec> = Vec::new();
        let mut place = Vec::with_capacity(n);
        let (mut end, mut bytes) = (u64::MAX, 0u64);
        for &(at, _, len) in &copies {
            let len = u64::from(len);
            match runs.last_mut() {
                Some(r) if at == end && bytes + len <= MAX_DESTAGE_RUN_BYTES => {
                    r.parts += 1;
                    r.waiting += 1;
                    bytes += len;
                }
                _ => {
                    runs.push(RunExec {
                        offset: at,
                        parts: 1,
                        waiting: 1,
                        failed: false,
                    });
                    bytes = len;
                }
            }
            end = at + len;
            let r = runs.last().expect("a run");
            place.push((runs.len() as u32 - 1, r.parts - 1));
        }
        for (i, r) in runs.iter().enumerate() {
            self.destage_parts
                .insert((pid, i as u32), vec![None; r.parts as usize]);
        }
        self.destage.plans.get_mut(pid).runs = runs;
        for (&(_, from, len), &(run, part)) in copies.iter().zip(&place) {
            // Issuing a read leaves the plan as it is (completions come later).
            self.cache_read(
                from,
                len,
                IoCtx::DestageRead {
                    plan: pid,
                    run,
                    part,
                },
            );
        }
    }

    pub(super) fn on_plan_begin(&mut self, pid: u32, ok: bool) {
        if !ok {
            let pe = self.destage.plans.get_mut(pid);
            pe.failed = true;
            pe.left = 0;
            return self.plan_copied(pid);
        }
        self.plan_copy(pid);
    }

    pub(super) fn on_destage_read(&mut self, pid: u32, run: u32, part: u32, res: IoResult<P>) {
        let parts = self
            .destage_parts
            .get_mut(&(pid, run))
            .expect("destage read of a run not waiting");
        let pe = self.destage.plans.get_mut(pid);
        let r = &mut pe.runs[run as usize];
        match res {
            Ok(Some(d)) => parts[part as usize] = Some(d),
            _ => r.failed = true,
        }
        r.waiting -= 1;
        if r.waiting > 0 {
            return;
        }
        let (offset, n, failed) = (r.offset, r.parts, r.failed);
        let (group, fua) = (pe.plan.atomic_group, pe.fua);
        let parts = self
            .destage_parts
            .remove(&(pid, run))
            .expect("the run's parts");
        if failed {
            return self.on_destage_write(pid, n, false);
        }
        let (gated, cancelled) = (pe.gate.is_some(), pe.cancelled);
        if cancelled {
            // The gate failed: this plan's writes MUST NOT go out.
            return self.drop_run(pid, n);
        }
        let mut parts: Vec<P> = parts
            .into_iter()
            .map(|p| p.expect("every part read"))
            .collect();
        let data = if parts.len() == 1 {
            parts.pop().expect("one part")
        } else {
            P::concat(&parts)
        };
        if gated && !crate::mutation::active(crate::mutation::Mutation::GatedPlanWritesEarly) {
            self.destage_held.push((pid, offset, data, n));
            return;
        }
        self.write_run(pid, offset, data, n, group, fua);
    }

    /// Issue one run of plan `pid` to the backing store.
    fn write_run(&mut self, pid: u32, offset: u64, data: P, n: u32, group: Option<u64>, fua: bool) {
        let fua =
            fua && !crate::mutation::active(crate::mutation::Mutation::PacedDestageWithoutFua);
        self.emit(
            Dev::Backing,
            IoOp::Write { offset, data, fua },
            group,
            IoCtx::DestageWrite {
                plan: pid,
                copies: n,
            },
        );
    }

    /// A run of a cancelled plan is not written: its copies are done
    /// without counting as failed writes.
    fn drop_run(&mut self, pid: u32, n: u32) {
        let pe = self.destage.plans.get_mut(pid);
        pe.left -= n;
        if pe.left == 0 {
            self.plan_copied(pid);
        }
    }

    /// Plan `done` ended (`ok`: its writes are durable): the plans gated on
    /// it (`Plan::after`) issue the writes they hold, or are cancelled.
    /// Called after the policy has heard of `done`'s end.
    fn release_gated(&mut self, done: u32, ok: bool) {
        if self.destage.gated.is_empty() {
            return;
        }
        let plans = &self.destage.plans;
        let (now, later): (Vec<u32>, Vec<u32>) = std::mem::take(&mut self.destage.gated)
            .into_iter()
            .partition(|&p| plans.get(p).gate == Some(done));
        self.destage.gated = later;
        for pid in now {
            let pe = self.destage.plans.get_mut(pid);
            pe.gate = None;
            let (n, early, group, fua) = (
                pe.plan.write.len(),
                pe.copied_early,
                pe.plan.atomic_group,
                pe.fua,
            );
            if ok {
                self.destage.inflight += n;
            } else {
                pe.cancelled = true;
            }
            let held = std::mem::take(&mut self.destage_held);
            let (mine, rest): (Vec<_>, Vec<_>) = held.into_iter().partition(|h| h.0 == pid);
            self.destage_held = rest;
            for (_, offset, data, copies) in mine {
                if ok {
                    self.write_run(pid, offset, data, copies, group, fua);
                } else {
                    self.drop_run(pid, copies);
                }
            }
            if early {
                self.plan_copied(pid);
            }
        }
    }

    pub(super) fn on_destage_write(&mut self, pid: u32, copies: u32, ok: bool) {
        let pe = self.destage.plans.get_mut(pid);
        if !ok {
            pe.failed = true;
        }
        pe.left -= copies;
        if pe.left == 0 {
            self.plan_copied(pid);
        }
    }

    /// Every block of the plan was written (or the plan failed).
    pub(super) fn plan_copied(&mut self, pid: u32) {
        let pe = self.destage.plans.get_mut(pid);
        if pe.gate.is_some() && !pe.failed {
            // Nothing of it may end before its gate (`release_gated`).
            pe.copied_early = true;
            return;
        }
        if pe.failed || pe.cancelled {
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
            None if pe.fua => self.plan_end(pid, true),
            None => {
                // One backing FLUSH covers every plan whose writes completed
                // before it was issued: a plan that finishes copying while
                // one is in flight waits for the next, shared by all such
                // plans (destage at the backing store's write rate, not one
                // sync per 16 blocks).
                if let Some(waiting) = &mut self.destage.flush_next {
                    waiting.push(pid);
                } else if self.destage.flush_inflight.is_some() {
                    self.destage.flush_next = Some(vec![pid]);
                } else {
                    self.issue_plan_flush(vec![pid]);
                }
            }
        }
    }

    pub(super) fn issue_plan_flush(&mut self, plans: Vec<u32>) {
        debug_assert!(self.destage.flush_inflight.is_none());
        self.destage.flush_inflight = Some(plans);
        self.emit(Dev::Backing, IoOp::Flush, None, IoCtx::PlanFlush);
    }

    pub(super) fn on_plan_flush(&mut self, ok: bool) {
        let done = self
            .destage
            .flush_inflight
            .take()
            .expect("plan flush completion without plans");
        if let Some(next) = self.destage.flush_next.take() {
            self.issue_plan_flush(next);
        }
        for pid in done {
            self.plan_end(pid, ok);
        }
    }

    pub(super) fn on_plan_finish(&mut self, pid: u32, ok: bool) {
        self.plan_end(pid, ok);
    }

    pub(super) fn plan_end(&mut self, pid: u32, ok: bool) {
        self.plan_end_inner(pid, ok);
        self.release_gated(pid, ok);
    }

    fn plan_end_inner(&mut self, pid: u32, ok: bool) {
        let pe = self.destage.plans.remove(pid);
        if pe.gate.is_some() {
            // Failed before its gate ended.
            assert!(!ok, "a gated plan ended before its gate");
            self.destage.gated.retain(|&p| p != pid);
            self.destage_held.retain(|h| h.0 != pid);
        } else if !pe.cancelled {
            self.destage.inflight -= pe.plan.write.len();
        }
        for &b in &pe.blocks {
            self.writeback_end(b);
        }
        for &s in &pe.plan.write {
            self.table.slots[s as usize].set_destaging(false);
        }
        if !ok {
            if pe.failed || !pe.cancelled {
                self.stats.destage_failures += 1;
                self.out_event
                    .push_back(Event::BackgroundError { what: "destage" });
                self.retry_at = Some(self.now + self.cfg.retry_ns);
            }
            for &s in &pe.plan.write {
                self.unref(s);
            }
            self.policy.on_plan_failed(&pe.plan);
            return;
        }
        self.stats.destaged_blocks += pe.plan.write.len() as u64;
        // Older versions first, so that each block's shadow count is final
        // when its latest version is considered.
        // Versions of each block in the plan (only an exact plan asks).
        let mut per_block: IdMap<u32, u32> = IdMap::default();
        if pe.plan.exact {
            for &s in &pe.plan.write {
                let b = self.table.slots[s as usize].block;
                if b != NIL {
                    *per_block.entry(b).or_default() += 1;
                }
            }
        }
        for &s in &pe.plan.write {
            if self.table.slots[s as usize].state == SlotState::Valid && !self.is_latest(s) {
                self.retire(s);
            }
        }
        for &s in &pe.plan.drop {
            assert!(!self.is_latest(s), "dropping the latest version of a block");
            if self.table.slots[s as usize].state == SlotState::Valid {
                self.retire(s);
            }
        }
        for &s in &pe.plan.write {
            let slot = self.table.slots[s as usize];
            if slot.state == SlotState::Valid && self.is_latest(s) && slot.dirty() {
                let b = slot.block;
                // Written whole: its dirty range covers every byte it holds.
                let full = {
                    let ((lo, hi), (vlo, vhi)) = (self.range_of(s), self.valid_range(s));
                    lo <= vlo && hi >= vhi
                };
                let alone = self.map.blocks[b as usize].shadows == 0
                    && per_block.get(&b).copied().unwrap_or(0) == 1;
                let g = self.set_group(s, NO_GROUP);
                if g != NO_GROUP {
                    self.policy.on_version_removed(g, s);
                }
                if !pe.plan.exact || (full && alone) {
                    // The backing store now holds exactly this version: clean.
                    self.table.slots[s as usize].set_dirty(false);
                    self.table.dirty -= 1;
                    let rid = self.map.blocks[b as usize].rid;
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

/// Destage state: plans in flight and their shared backing FLUSHes.
#[derive(Default)]
pub(super) struct DestageState {
    pub(super) plans: Slab<PlanExec>,
    /// Plans (without an atomic group) whose shared backing FLUSH is in
    /// flight, and those waiting for the next one.
    pub(super) flush_inflight: Option<Vec<u32>>,
    pub(super) flush_next: Option<Vec<u32>>,
    /// Plans waiting for another plan's end before they write (`Plan::after`).
    pub(super) gated: Vec<u32>,
    /// Scratch list of the replacement policy's destage candidates (kept
    /// between plans so that planning does not allocate).
    pub(super) victim_ids: Vec<BlockId>,
    /// Destage copies in flight.
    pub(super) inflight: usize,
    /// Cleaning (destage without space pressure) is running.
    pub(super) cleaning: bool,
    /// Paced cleaning (`Config::full_clean_secs`): paced until this time
    /// (the last write sent around the full cache plus `FULL_IDLE_NS`).
    pub(super) paced_until: u64,
    /// The earliest time the next paced plan may start.
    pub(super) pace_next: u64,
    /// Cleaning is wanted but waits for `pace_next` (a deadline for
    /// `Engine::poll_timeout`).
    pub(super) pace_blocked: bool,
}
