//! Writes into the cache: in place or to a fresh slot, read-modify-write
//! of partial blocks, installing a version, and finishing a request.

use super::*;

impl<P: Payload> Engine<P> {
    pub(super) fn inplace_ok(&self, s: u32, group: Group) -> bool {
        let slot = &self.table.slots[s as usize];
        slot.state == SlotState::Valid
            && (!slot.disk_valid() && !slot.in_snapshot() || self.policy.may_overwrite_durable())
            && slot.refs == 0
            && !slot.destaging()
            && (!slot.unsealed()
                || crate::mutation::active(crate::mutation::Mutation::InPlaceIgnoresSeal))
            && slot.dirty()
            && self.commits.waiters.is_empty()
            && !self.commits.deferred
            && self.policy.may_overwrite(self.group_of(s), group)
    }

    pub(super) fn write_piece(&mut self, p: u32, b: u32) {
        let latest = self.map.blocks[b as usize].latest;
        let (start, end, group) = {
            let pc = self.pieces.get(p);
            (pc.start, pc.end, pc.group)
        };
        let full = start == 0 && end as u64 == self.bs;
        if latest != NIL {
            self.stats.write_hits += 1;
        } else {
            self.stats.write_misses += 1;
        }
        if (self.bypass.active || self.pieces.get(p).bypass)
            && !self.policy.synchronous_backing()
            && self.admission_bypasses(p, b)
        {
            return;
        }
        if self.policy.synchronous_backing() {
            return self.write_through_piece(p, b, latest, full);
        }
        if latest == NIL && self.patch_write(p, b) {
            return;
        }
        if latest != NIL && self.inplace_ok(latest, group) && self.within_valid(latest, start, end)
        {
            return self.overwrite_in_place(p, latest);
        }
        if full {
            let d = self.pieces.get(p).data.clone();
            self.pieces.get_mut(p).buf = d;
            let _ = self.alloc_and_write(p);
        } else if latest != NIL && self.partial.contains_key(&latest) {
            self.partial_rmw(p, latest);
        } else if latest != NIL {
            self.table.slots[latest as usize].refs += 1;
            self.rmw_from_cache(p, latest);
        } else {
            self.stats.fetches += 1;
            self.pieces.get_mut(p).ios = 1;
            let lbn = self.pieces.get(p).lbn;
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

    /// Under an admission policy that can reject writes (write-back,
    /// ordered, journaled): bypass piece `p` if admission rejected it and
    /// it can bypass (returns true); a rejected piece that cannot is cached,
    /// and so is its request.
    fn admission_bypasses(&mut self, p: u32, b: u32) -> bool {
        let bypass = self.pieces.get(p).bypass;
        if bypass && self.table.free.len() as u64 <= self.table.reserved {
            // No slot to spare: rather than wait for one, drop a clean copy
            // of the block and go around the cache (`drop_clean_for_bypass`).
            self.drop_clean_for_bypass(b);
        }
        if bypass && self.can_bypass(p, b) {
            self.bypass_piece(p, b);
            return true;
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
        false
    }

    /// Write-back: drop block `b`'s cached version if it is clean, idle and
    /// durably clean (no read holds it, no plan copies it, no older version
    /// or patch of the block, and the durable table names it clean), so that
    /// a bypass of the block can go ahead (`can_bypass`). Recovery after a
    /// crash drops clean versions under write-back, so the dropped one never
    /// comes back over the bypassed bytes.
    fn drop_clean_for_bypass(&mut self, b: u32) {
        if self.policy.kind() != WritePolicyKind::WriteBack {
            return;
        }
        let blk = &self.map.blocks[b as usize];
        let s = blk.latest;
        if s == NIL || blk.shadows > 0 || blk.destaging > 0 || self.patch.sets.contains_key(&b) {
            return;
        }
        let slot = &self.table.slots[s as usize];
        if slot.state == SlotState::Valid
            && !slot.dirty()
            && slot.refs == 0
            && !slot.destaging()
            && !slot.in_meta_dirty()
            && !slot.in_snapshot()
            && !self.partial.contains_key(&s)
        {
            self.stats.full_dropped_clean += 1;
            self.evict_block(b);
        }
    }

    /// Write-through: the piece goes to the backing store; a full block
    /// admitted to the cache also gets a new cached copy if a slot is spare.
    fn write_through_piece(&mut self, p: u32, b: u32, latest: u32, full: bool) {
        let (data, fua, lbn, bypass) = {
            let pc = self.pieces.get(p);
            (pc.data.clone().unwrap(), pc.fua, pc.lbn, pc.bypass)
        };
        self.pieces.get_mut(p).ios += 1;
        // Emitted at the end of this round, merged with the adjacent
        // pieces of the same request (`flush_through_batch`).
        self.bypass.through_batch.push((p, fua));
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
        } else if self.bypass.active {
            self.count_admitted(p);
        }
        if full
            && !bypass
            && self.table.free.len() as u64 > self.table.reserved + self.cfg.free_reserve as u64 / 2
        {
            let s = self.alloc_slot(lbn).unwrap();
            self.write_new_version(p, s, data);
        }
    }

    /// Overwrite the latest version `latest` in place (`inplace_ok`).
    fn overwrite_in_place(&mut self, p: u32, latest: u32) {
        let (data, start) = {
            let pc = self.pieces.get(p);
            (pc.data.clone().unwrap(), pc.start)
        };
        self.stats.overwrites += 1;
        let pc = self.pieces.get_mut(p);
        pc.slot = latest;
        pc.ios = 1;
        self.table.slots[latest as usize].state = SlotState::Writing;
        self.commits.inplace_inflight += 1;
        let off = self.layout.slot_offset(latest) + start as u64;
        self.cache_write(
            off,
            data,
            IoCtx::PieceCacheWrite {
                piece: p,
                inplace: true,
            },
        );
    }

    /// Admission counters: every class, and the critical class alone (the
    /// class the request's tag gave the piece).
    pub(super) fn count_admitted(&mut self, p: u32) {
        self.stats.admitted_pieces += 1;
        if self.pieces.get(p).tag_critical {
            self.stats.critical_admitted_pieces += 1;
        }
    }

    pub(super) fn on_rmw_read(&mut self, p: u32, from_cache: bool, res: IoResult<P>) {
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
    pub(super) fn rmw_from_cache(&mut self, p: u32, old: u32) {
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
    pub(super) fn write_new_version(&mut self, p: u32, s: u32, data: P) {
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
    pub(super) fn alloc_and_write(&mut self, p: u32) -> bool {
        // A piece without a reservation must leave the reserved slots alone.
        let spare = self.table.free.len() as u64 > self.table.reserved;
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

    pub(super) fn on_piece_cache_write(&mut self, p: u32, inplace: bool, ok: bool) {
        let (s, lbn, seq, group) = {
            let pc = self.pieces.get(p);
            (pc.slot, pc.lbn, pc.seq, pc.group)
        };
        if inplace {
            self.commits.inplace_inflight -= 1;
            let slot = &mut self.table.slots[s as usize];
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
                    self.commits.unsynced_overwrites = true;
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
            self.install(
                b,
                s,
                lbn,
                seq,
                NewVersion::Dirty {
                    group,
                    range: (a, e),
                },
            );
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
        if !self.patch.sets.is_empty() {
            // A full write over a patched block: its patches go once it is installed.
            let b = self.block_of(lbn);
            self.patch_superseded(b, ok);
        }
        self.pieces.get_mut(p).slot = NIL;
        self.on_piece_io_done(p, ok);
    }

    pub(super) fn on_piece_io_done(&mut self, p: u32, ok: bool) {
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
                self.install(b, s, lbn, seq, NewVersion::Clean);
            }
        }
        self.finish_write_piece(p);
    }

    /// Make slot `s` the latest version of block `b`.
    /// A backing write of block `lbn` ended: a failed one leaves its bytes
    /// there unknown and maybe volatile (`BypassState::unsettled`), a
    /// successful one settles them.
    pub(super) fn settle(&mut self, lbn: u64, ok: bool) {
        if ok {
            if !self.bypass.unsettled.is_empty() {
                self.bypass.unsettled.remove(&lbn);
            }
        } else {
            self.bypass.unsettled.insert(lbn);
        }
    }

    pub(super) fn install(&mut self, b: u32, s: u32, lbn: u64, seq: u64, version: NewVersion) {
        let (dirty, group, range) = match version {
            NewVersion::Clean => (false, NO_GROUP, (0, 0)),
            NewVersion::Dirty { group, range } => (true, group, range),
        };
        let old = self.map.blocks[b as usize].latest;
        let coalesce = old != NIL && {
            let o = &self.table.slots[old as usize];
            !(o.dirty() && self.policy.keep_superseded(self.group_of(old), group))
        };
        let (mut lo, mut hi) = range;
        if coalesce && self.table.slots[old as usize].dirty() && self.policy.inherits_dirty_range()
        {
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
            let slot = &mut self.table.slots[s as usize];

            assert_eq!(slot.state, SlotState::Writing);
            slot.state = SlotState::Valid;
            slot.seq = seq;
            slot.set_dirty(dirty);
            slot.block = b;
        }
        self.table.writing -= 1;
        if dirty {
            self.table.dirty += 1;
        }
        self.mark_meta(s);
        if group != NO_GROUP {
            self.policy.on_version_installed(group, s, lbn, seq);
        }
        self.map.blocks[b as usize].latest = s;
        if old != NIL {
            let o = self.table.slots[old as usize];
            if !coalesce {
                // Shadow version: kept until its group reaches the backing store.
                self.map.blocks[b as usize].shadows += 1;
                self.table.slots[old as usize].set_shadow(true);
            } else {
                if o.dirty() {
                    self.stats.overwrites += 1;
                }
                self.retire(old);
            }
            let rid = self.map.blocks[b as usize].rid;
            self.repl.touch(BlockId(rid), true);
            if o.dirty() != dirty {
                self.repl.set_dirty(BlockId(rid), dirty);
            }
        } else {
            self.track_block(b, lbn, dirty);
        }
    }

    pub(super) fn finish_write_piece(&mut self, p: u32) {
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

    pub(super) fn release_block(&mut self, b: u32) {
        self.map.blocks[b as usize].busy = false;
        if self.bypass.active {
            self.bypass.holders.remove(&b);
        }
        // Wake waiters: reads run together; a write takes the block.
        while let Some(q) = self.map.waiters.get_mut(&b) {
            let Some(p) = q.pop_front() else {
                self.map.waiters.remove(&b);
                break;
            };
            if q.is_empty() {
                self.map.waiters.remove(&b);
            }
            let is_write = self.pieces.get(p).data.is_some();
            self.stats.block_wait_ns += self.now - self.pieces.get(p).queued_at;
            self.run_piece(p, b);
            if is_write || self.map.blocks[b as usize].busy {
                break;
            }
        }
        self.maybe_drop_block(b);
    }

    pub(super) fn finish_request(&mut self, id: ReqId) {
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
                        let slot = &self.table.slots[s as usize];
                        if slot.state == SlotState::Valid && self.group_of(s) == r.group {
                            self.mark_meta(s);
                        }
                    }
                }
                if let Some(e) = r.failed {
                    return self.reply(id, Err(e), r.seq);
                }
                if r.fua && r.cached && !self.policy.synchronous_backing() {
                    self.commits.waiters.push(Waiter {
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
