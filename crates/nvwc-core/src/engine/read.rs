//! Reads: hits from the cache, misses from the backing store, and fills.

use super::*;

impl<P: Payload> Engine<P> {
    pub(super) fn read_piece(&mut self, p: u32, b: u32) {
        if self.map.blocks[b as usize].latest == NIL && self.patch.sets.contains_key(&b) {
            return self.patch_read(p, b);
        }
        let blk = &self.map.blocks[b as usize];
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
            self.table.slots[s as usize].refs += 1;
            let pc = self.pieces.get_mut(p);
            pc.slot = s;
            pc.ios = 1;
            let off = self.layout.slot_offset(s) + start as u64;
            self.cache_read(off, end - start, IoCtx::ReadHit { piece: p });
        } else {
            self.stats.read_misses += 1;
            self.map.blocks[b as usize].add_reader();
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

    pub(super) fn on_read_hit(&mut self, p: u32, res: IoResult<P>) {
        let s = self.pieces.get(p).slot;
        self.unref(s);
        self.finish_read_piece(p, res.ok().flatten());
    }

    pub(super) fn on_read_miss(&mut self, p: u32, full: bool, res: IoResult<P>) {
        let (lbn, start, end) = {
            let pc = self.pieces.get(p);
            (pc.lbn, pc.start, pc.end)
        };
        let b = self.block_of(lbn);
        // A write that started while this read was in flight makes its data unfit to cache.
        let stale = self.map.blocks[b as usize].fill_stale;
        self.map.blocks[b as usize].remove_reader();
        let data = res.ok().flatten();
        let part = match (&data, full) {
            (Some(d), true) if d.len() == self.bs as usize => {
                Some(d.slice(start as usize..end as usize))
            }
            (Some(d), false) if d.len() == (end - start) as usize => Some(d.clone()),
            _ => None,
        };
        if let (Some(d), true) = (&data, full) {
            let blk = &self.map.blocks[b as usize];
            if part.is_some()
                && blk.latest == NIL
                && !blk.busy
                && !stale
                && !self.patch.sets.contains_key(&b)
                && !self.bypass.unsettled.contains(&lbn)
            {
                self.fill(b, d.clone());
            }
        }
        self.finish_read_piece(p, part);
        self.maybe_drop_block(b);
    }

    /// Copy a block read from the backing store into the cache as a clean version.
    pub(super) fn fill(&mut self, b: u32, data: P) {
        if self.table.free.len() as u64 <= self.table.reserved + self.cfg.free_reserve as u64 / 2 {
            return;
        }
        let Some(s) = self.alloc_slot(self.map.blocks[b as usize].lbn()) else {
            return;
        };
        self.map.blocks[b as usize].busy = true;
        self.stats.populates += 1;
        let off = self.layout.slot_offset(s);
        self.cache_write(off, data, IoCtx::Fill { block: b, slot: s });
    }

    pub(super) fn on_fill(&mut self, b: u32, s: u32, ok: bool) {
        if ok {
            let lbn = self.map.blocks[b as usize].lbn();
            let seq = self.next_seq;
            self.next_seq += 1;
            self.install(b, s, lbn, seq, NewVersion::Clean);
        } else {
            self.unalloc_slot(s);
        }
        self.release_block(b);
    }

    pub(super) fn finish_read_piece(&mut self, p: u32, data: Option<P>) {
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
}
