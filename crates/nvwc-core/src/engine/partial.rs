//! Partial versions: lazy patches persisted in the cache without a fetch.
//!
//! Under `FetchMode::Lazy`, a patch set with one contiguous part that has to
//! leave RAM (patch cleaning, a FLUSH, a drain) is written into a fresh slot
//! at its offset and installed as a dirty **partial version**: only the
//! bytes `[lo, hi)` of the slot are the block's data. No backing read is
//! needed, so a partial write to a cold block costs what a full-block write
//! costs, and a FLUSH makes patches durable at cache-device speed. (A set
//! with several parts, or with a read or write waiting on it, is fetched and
//! applied as before; `async` and `async-bg` always fetch, as the paper's
//! modes do.)
//!
//! **Invariant.** A partial version descends only from a patch set, and a
//! patch set exists only on a block with no cached version and no shadows;
//! every later version of the block either is partial with a range that
//! contains the older one's, or holds the whole block. So the backing store
//! holds the block's current bytes everywhere outside the latest partial
//! version's range: nothing else can have written them.
//!
//! * **Reads** inside `[lo, hi)` are plain cache hits. Other reads take the
//!   backing store's bytes and lay the slot's valid bytes over them.
//! * **Writes.** In place only inside `[lo, hi)` (the range, and so the
//!   on-disk entry, never changes in place). Otherwise a read-modify-write:
//!   when the write overlaps or touches `[lo, hi)` (and the policy keeps
//!   exact dirty ranges elsewhere, i.e. not ordered), from the cache alone,
//!   giving a partial version with the union range; else the whole block is
//!   fetched, the slot's valid bytes and then the write laid over it, giving
//!   a whole version (`Stats::partial_write_fetches`).
//! * **Destage and checkpoints** copy only `[lo, hi)` (`plan_copy`). Under
//!   ordered a partial version's dirty range equals its valid range.
//! * **On disk** the entry carries `F_PARTIAL` and `lo..hi` as its range
//!   (format version 2). Recovery restores the range with the version.
//!
//! Crash story: a partial version is a version like any other (written out
//! of place, named by a commit only after its bytes were flushed). `kill -9`
//! keeps it once a commit names it (every FLUSH and FUA waits for one); the
//! backing store alone, if the cache is lost, holds the block as of the last
//! destage of it, as for whole versions.

use super::*;

impl<P: Payload> Engine<P> {
    /// The byte range of slot `s` that holds its block's data.
    pub(super) fn valid_range(&self, s: u32) -> (u32, u32) {
        self.partial.get(&s).copied().unwrap_or((0, self.bs as u32))
    }

    /// May a write of `[start, end)` go over version `s` in place? Whole
    /// versions: always; partial ones: only inside their valid range.
    pub(super) fn within_valid(&self, s: u32, start: u32, end: u32) -> bool {
        let (lo, hi) = self.valid_range(s);
        lo <= start && end <= hi
    }

    /// The byte range a slot's entry records: the dirty range where the
    /// policy keeps one (ordered), else the valid range of a partial version.
    pub(super) fn entry_range(&self, s: u32) -> (u32, u32) {
        match self.partial.get(&s) {
            Some(&r) if self.table.ranges.is_empty() => r,
            Some(&r) => {
                debug_assert_eq!(
                    self.range_of(s),
                    r,
                    "ordered partial version with a wider range"
                );
                self.range_of(s)
            }
            None => self.range_of(s),
        }
    }

    /// Read piece `p` on partial version `s` (valid `[lo, hi)`), which needs
    /// bytes outside that range: backing store first, then the slot's bytes.
    pub(super) fn partial_read(&mut self, p: u32, s: u32, lo: u32, hi: u32) {
        let (lbn, start, end) = {
            let pc = self.pieces.get(p);
            (pc.lbn, pc.start, pc.end)
        };
        self.stats.partial_read_fetches += 1;
        self.stats.read_misses += 1;
        let rid = self.map.blocks[self.block_of(lbn) as usize].rid;
        self.repl.touch(BlockId(rid), false);
        // Held until the read is done: the slot is neither reused nor
        // rewritten in place meanwhile, so `[lo, hi)` stays its range.
        self.table.slots[s as usize].refs += 1;
        let pc = self.pieces.get_mut(p);
        pc.slot = s;
        pc.ios = 1;
        self.backing_read(
            lbn * self.bs + start as u64,
            end - start,
            IoCtx::SplitRead { piece: p, lo, hi },
        );
    }

    pub(super) fn on_split_read(&mut self, p: u32, lo: u32, hi: u32, res: IoResult<P>) {
        let (s, start, end) = {
            let pc = self.pieces.get(p);
            (pc.slot, pc.start, pc.end)
        };
        match res.ok().flatten() {
            Some(d) if d.len() == (end - start) as usize => {
                let (a, e) = (start.max(lo), end.min(hi));
                if a >= e {
                    self.unref(s);
                    return self.finish_read_piece(p, Some(d));
                }
                self.pieces.get_mut(p).buf = Some(d);
                let off = self.layout.slot_offset(s) + a as u64;
                self.cache_read(off, e - a, IoCtx::SplitCache { piece: p, at: a });
            }
            _ => {
                self.unref(s);
                self.finish_read_piece(p, None);
            }
        }
    }

    pub(super) fn on_split_cache(&mut self, p: u32, at: u32, res: IoResult<P>) {
        let (s, start) = {
            let pc = self.pieces.get(p);
            (pc.slot, pc.start)
        };
        self.unref(s);
        let base = self.pieces.get_mut(p).buf.take().expect("backing bytes");
        let data = res
            .ok()
            .flatten()
            .map(|d| base.overlay((at - start) as usize, &d));
        self.finish_read_piece(p, data);
    }

    /// A partial write piece `p` over partial version `old` that cannot go
    /// in place (see the module docs).
    pub(super) fn partial_rmw(&mut self, p: u32, old: u32) {
        let (lbn, start, end) = {
            let pc = self.pieces.get(p);
            (pc.lbn, pc.start, pc.end)
        };
        let (lo, hi) = self.valid_range(old);
        self.table.slots[old as usize].refs += 1;
        let joins = start <= hi && end >= lo;
        if joins && self.table.ranges.is_empty() {
            // The old slot's bytes outside `[lo, hi)` are not the block's,
            // but neither are they inside the new version's range.
            self.pieces.get_mut(p).valid = Some((lo.min(start), hi.max(end)));
            return self.rmw_from_cache(p, old);
        }
        self.stats.fetches += 1;
        self.stats.partial_write_fetches += 1;
        let pc = self.pieces.get_mut(p);
        pc.slot = old;
        pc.ios = 1;
        self.backing_read(
            lbn * self.bs,
            self.bs as u32,
            IoCtx::RmwFetch { piece: p, lo, hi },
        );
    }

    pub(super) fn on_rmw_fetch(&mut self, p: u32, lo: u32, hi: u32, res: IoResult<P>) {
        let s = self.pieces.get(p).slot;
        match res.ok().flatten() {
            Some(d) if d.len() == self.bs as usize => {
                self.pieces.get_mut(p).buf = Some(d);
                let off = self.layout.slot_offset(s) + lo as u64;
                self.cache_read(off, hi - lo, IoCtx::RmwMerge { piece: p, lo });
            }
            _ => self.rmw_failed(p),
        }
    }

    pub(super) fn on_rmw_merge(&mut self, p: u32, lo: u32, res: IoResult<P>) {
        match res.ok().flatten() {
            Some(d) => {
                let s = self.pieces.get(p).slot;
                self.unref(s);
                let pc = self.pieces.get_mut(p);
                pc.slot = NIL;
                pc.ios = 0;
                let block = pc
                    .buf
                    .take()
                    .expect("fetched block")
                    .overlay(lo as usize, &d);
                let data = pc.data.as_ref().expect("write data");
                pc.buf = Some(block.overlay(pc.start as usize, data));
                let _ = self.alloc_and_write(p);
            }
            None => self.rmw_failed(p),
        }
    }

    fn rmw_failed(&mut self, p: u32) {
        let s = self.pieces.get(p).slot;
        self.unref(s);
        let pc = self.pieces.get_mut(p);
        pc.slot = NIL;
        pc.ios = 0;
        pc.buf = None;
        pc.failed = true;
        self.finish_write_piece(p);
    }
}
