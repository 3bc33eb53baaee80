//! Slot and block lifecycle: allocation, retirement, release and the
//! small helpers every path uses to emit commands and replies.

use super::*;

impl<P: Payload> Engine<P> {
    // ---------------------------------------------------------------- helpers

    pub(super) fn set_now(&mut self, now: u64) {
        debug_assert!(now >= self.now, "time went backwards");
        self.now = self.now.max(now);
    }

    /// Number of cache blocks a byte range touches (`len > 0`).
    pub(super) fn spans(&self, offset: u64, len: u64) -> u64 {
        (offset + len - 1) / self.bs - offset / self.bs + 1
    }

    pub(super) fn in_range(&self, offset: u64, len: u64) -> bool {
        offset
            .checked_add(len)
            .is_some_and(|e| e <= self.cfg.backing_size)
    }

    pub(super) fn reply(&mut self, id: ReqId, result: Result<Option<P>, ReqError>, seq: u64) {
        self.out_reply.push_back(Reply { id, result, seq });
    }

    pub(super) fn reply_data(&mut self, id: ReqId, data: P) {
        self.out_reply.push_back(Reply {
            id,
            result: Ok(Some(data)),
            seq: 0,
        });
    }

    pub(super) fn emit(&mut self, dev: Dev, op: IoOp<P>, group: Option<u64>, ctx: IoCtx) -> IoId {
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

    pub(super) fn block_for(&mut self, lbn: u64) -> u32 {
        if let Some(b) = self
            .map
            .index
            .get(lbn, |id| self.map.blocks[id as usize].lbn())
        {
            return b;
        }
        let blk = Block::new(lbn);
        let b = if let Some(b) = self.map.free.pop() {
            self.map.blocks[b as usize] = blk;
            b
        } else {
            self.map.blocks.push(blk);
            (self.map.blocks.len() - 1) as u32
        };
        self.map
            .index
            .insert(lbn, b, |id| self.map.blocks[id as usize].lbn());
        b
    }

    pub(super) fn group_of(&self, s: u32) -> Group {
        self.table
            .groups
            .get(s as usize)
            .copied()
            .unwrap_or(NO_GROUP)
    }

    pub(super) fn set_group(&mut self, s: u32, g: Group) -> Group {
        match self.table.groups.get_mut(s as usize) {
            Some(x) => std::mem::replace(x, g),
            None => {
                debug_assert_eq!(g, NO_GROUP, "policy without groups got a group");
                NO_GROUP
            }
        }
    }

    pub(super) fn range_of(&self, s: u32) -> (u32, u32) {
        self.table
            .ranges
            .get(s as usize)
            .copied()
            .unwrap_or((0, self.bs as u32))
    }

    pub(super) fn set_range(&mut self, s: u32, r: (u32, u32)) {
        if let Some(x) = self.table.ranges.get_mut(s as usize) {
            *x = r;
        }
    }

    /// The block number a valid version belongs to.
    pub(super) fn lbn_of(&self, s: u32) -> u64 {
        let b = self.table.slots[s as usize].block;
        assert!(b != NIL, "slot {s} has no block");
        self.map.blocks[b as usize].lbn()
    }

    /// A read of the cache device (outside any atomic group).
    pub(super) fn cache_read(&mut self, offset: u64, len: u32, ctx: IoCtx) -> IoId {
        self.emit(Dev::Cache, IoOp::Read { offset, len }, None, ctx)
    }

    /// A read of the backing store (outside any atomic group).
    pub(super) fn backing_read(&mut self, offset: u64, len: u32, ctx: IoCtx) -> IoId {
        self.emit(Dev::Backing, IoOp::Read { offset, len }, None, ctx)
    }

    /// A plain (non-FUA) write to the cache device.
    pub(super) fn cache_write(&mut self, offset: u64, data: P, ctx: IoCtx) -> IoId {
        let op = IoOp::Write {
            offset,
            data,
            fua: false,
        };
        self.emit(Dev::Cache, op, None, ctx)
    }

    /// The block entry of `lbn`. Caller guarantees it exists.
    pub(super) fn block_of(&self, lbn: u64) -> u32 {
        self.map
            .index
            .get(lbn, |id| self.map.blocks[id as usize].lbn())
            .expect("block entry exists")
    }

    pub(super) fn maybe_drop_block(&mut self, b: u32) {
        let blk = &self.map.blocks[b as usize];
        if blk.latest == NIL
            && !blk.busy
            && blk.readers() == 0
            && blk.shadows == 0
            && blk.destaging == 0
            && !self.map.waiters.contains_key(&b)
            && !self.patch.sets.contains_key(&b)
        {
            debug_assert_eq!(blk.rid, NIL);
            let lbn = blk.lbn();
            self.map
                .index
                .remove(lbn, |id| self.map.blocks[id as usize].lbn());
            self.map.free.push(b);
        }
    }

    pub(super) fn mark_meta(&mut self, s: u32) {
        let slot = &mut self.table.slots[s as usize];
        if !slot.in_meta_dirty() {
            slot.set_in_meta_dirty(true);
            self.commits.meta_dirty.push(s);
        }
        if self.commits.oldest_change.is_none() {
            self.commits.oldest_change = Some(self.now);
        }
    }

    /// Allocate a slot for a version of block `lbn`: its home slot
    /// (`lbn mod capacity`) if free, else any. Homes keep neighbouring blocks
    /// in neighbouring slots whatever order they were first written in, so a
    /// later large write of them is one device write rather than one per
    /// block (the server merges adjacent slot writes).
    pub(super) fn alloc_slot(&mut self, lbn: u64) -> Option<u32> {
        let home = (lbn % self.layout.capacity) as u32;
        let s = if self.table.free.take(home) {
            home
        } else {
            self.table.free.pop()?
        };
        let slot = &mut self.table.slots[s as usize];
        assert_eq!(
            slot.state,
            SlotState::Free,
            "allocated a slot that is not free"
        );
        assert!(!slot.disk_valid() && !slot.in_snapshot() && slot.refs == 0);
        slot.state = SlotState::Writing;
        self.table.writing += 1;
        Some(s)
    }

    /// Return a never-valid slot (a failed or abandoned write) to the free list.
    pub(super) fn unalloc_slot(&mut self, s: u32) {
        let slot = &mut self.table.slots[s as usize];
        assert_eq!(slot.state, SlotState::Writing);
        slot.state = SlotState::Free;
        self.table.writing -= 1;
        self.table.free.push(s);
        self.partial.remove(&s);
    }

    /// Release a version: it stops being readable; the slot is reused once no
    /// read holds it and no durable entry names it.
    pub(super) fn retire(&mut self, s: u32) {
        let slot = &mut self.table.slots[s as usize];
        assert_eq!(
            slot.state,
            SlotState::Valid,
            "retiring a slot that is not valid"
        );
        slot.state = SlotState::Retired;
        self.partial.remove(&s);
        let slot = &mut self.table.slots[s as usize];
        let owner = std::mem::replace(&mut slot.block, NIL);
        let was_shadow = slot.shadow();
        slot.set_shadow(false);
        // The durable table names this version clean (or not at all): clean
        // now, and its entry unchanged since the last durable commit.
        let durably_clean = !slot.dirty() && !slot.in_meta_dirty() && !slot.in_snapshot();
        if slot.dirty() {
            slot.set_dirty(false);
            self.table.dirty -= 1;
        }
        let (disk_valid, in_snapshot) = (slot.disk_valid(), slot.in_snapshot());
        // Write-back recovery after a crash drops clean versions (and every
        // version but the latest: `WriteBack::recover`), so a durably clean
        // one can never come back over a later bypass of its block.
        let harmless = durably_clean && self.policy.kind() == WritePolicyKind::WriteBack;
        if self.bypass.tracking && (disk_valid || in_snapshot) && owner != NIL && !harmless {
            let lbn = self.map.blocks[owner as usize].lbn();
            *self.table.retired_lbns.entry(lbn).or_default() += 1;
            self.table.retired_lbn.insert(s, lbn);
        }
        let g = self.set_group(s, NO_GROUP);
        if g != NO_GROUP {
            self.policy.on_version_removed(g, s);
        }
        if disk_valid || in_snapshot {
            self.table.retired_pending += 1;
            self.table.slots[s as usize].set_reclaim(true);
            self.mark_meta(s);
        } else {
            self.try_release(s);
        }
        if was_shadow {
            self.map.blocks[owner as usize].shadows -= 1;
            self.maybe_drop_block(owner);
        }
    }

    pub(super) fn is_latest(&self, s: u32) -> bool {
        let b = self.table.slots[s as usize].block;
        b != NIL && self.map.blocks[b as usize].latest == s
    }

    pub(super) fn try_release(&mut self, s: u32) {
        let slot = &mut self.table.slots[s as usize];
        if slot.state == SlotState::Retired
            && slot.refs == 0
            && !slot.disk_valid()
            && !slot.in_snapshot()
        {
            slot.state = SlotState::Free;
            slot.set_unsealed(false);
            self.table.free.push(s);
            if self.bypass.tracking {
                if let Some(lbn) = self.table.retired_lbn.remove(&s) {
                    let n = self
                        .table
                        .retired_lbns
                        .get_mut(&lbn)
                        .expect("retired block count");
                    *n -= 1;
                    if *n == 0 {
                        self.table.retired_lbns.remove(&lbn);
                    }
                }
            }
        }
    }

    pub(super) fn unref(&mut self, s: u32) {
        let slot = &mut self.table.slots[s as usize];
        assert!(slot.refs > 0);
        slot.refs -= 1;
        self.try_release(s);
    }

    /// Remove a block's (clean) latest version from the cache.
    pub(super) fn evict_block(&mut self, b: u32) {
        let s = self.map.blocks[b as usize].latest;
        assert!(s != NIL);
        let rid = self.map.blocks[b as usize].rid;
        self.repl.remove(BlockId(rid));
        self.map.rid_block[rid as usize] = NIL;
        self.map.free_rids.push(rid);
        let blk = &mut self.map.blocks[b as usize];
        blk.rid = NIL;
        blk.latest = NIL;
        self.retire(s);
        self.maybe_drop_block(b);
    }

    /// Block `b` (backing block `lbn`) gets a cached version: give it a
    /// replacement id and let the replacement policy track it.
    pub(super) fn track_block(&mut self, b: u32, lbn: u64, dirty: bool) {
        let rid = self
            .map
            .free_rids
            .pop()
            .expect("more cached blocks than slots");
        self.map.rid_block[rid as usize] = b;
        self.map.blocks[b as usize].rid = rid;
        self.repl.insert(BlockId(rid), lbn, dirty);
        if self.map.blocks[b as usize].destaging > 0 {
            self.repl.set_writeback(BlockId(rid), true);
        }
    }

    /// A write of block `b` to the backing store starts that the block MUST
    /// not be destaged beside (a destage copy, or a reissued bypass write):
    /// count it in `Block::destaging`. On the first, the replacement policy
    /// marks the block (`Replacement::set_writeback`, kept while the block is
    /// tracked and `destaging > 0`; `track_block` marks a block tracked
    /// meanwhile), so its destage walk skips it: the engine's `busy`
    /// predicate (`View::pick_victims`) holds for every block with
    /// `destaging > 0`.
    pub(super) fn writeback_begin(&mut self, b: u32) {
        let blk = &mut self.map.blocks[b as usize];
        assert!(
            blk.destaging < u16::MAX,
            "too many write-backs of one block"
        );
        blk.destaging += 1;
        if blk.destaging == 1 && blk.rid != NIL {
            debug_assert_eq!(self.map.rid_block[blk.rid as usize], b);
            self.repl.set_writeback(BlockId(blk.rid), true);
        }
    }

    /// The end of a write counted by `writeback_begin`: after the last,
    /// the replacement policy unmarks the block.
    pub(super) fn writeback_end(&mut self, b: u32) {
        let blk = &mut self.map.blocks[b as usize];
        assert!(
            blk.destaging > 0,
            "write-back end of block {b} without its start"
        );
        blk.destaging -= 1;
        if blk.destaging == 0 && blk.rid != NIL {
            debug_assert_eq!(self.map.rid_block[blk.rid as usize], b);
            self.repl.set_writeback(BlockId(blk.rid), false);
        }
    }
}
