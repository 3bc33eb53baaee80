//! Direct writes: the driver puts a write's payload on the cache device itself.
//!
//! A driver that gets a write's payload from a source it can read into any
//! memory (the server: a unix socket, read straight into the mapped cache
//! file) need not copy it through a buffer first.
//! [`Engine::handle_direct_write`] takes the write *without its bytes*. When
//! the write can go, now and whole, to cache slots as plain writes (the
//! conditions below), the engine runs it exactly as
//! [`Engine::handle_request`] would, but instead of emitting those cache
//! writes through `poll_io` it returns them as [`DirectPart`]s: which bytes
//! of the payload go to which cache-device offset, and the command id to
//! complete. Otherwise it changes nothing and returns `None`; the driver then
//! gets the bytes and calls `handle_request` as usual.
//!
//! Everything else is unchanged: the slots were chosen by the usual
//! placement (in place, or a fresh slot), the pieces are in flight like any
//! cache write's, and the request is acknowledged, committed (FUA) and
//! destaged as it would be. So a direct write has the crash story of the
//! cache writes it stands for: until its completion nothing refers to new
//! bytes in a fresh slot, and an in-place rewrite is one the engine allowed
//! (see `docs/ON-DISK-FORMAT.md`, "Rules that make this safe").
//!
//! **Conditions** (all must hold; each rules out a path on which the engine
//! would read the payload, send it to the backing store, keep it, or let the
//! write wait):
//! * the write covers whole blocks, inside the device, at most
//!   `max_write_bytes()`;
//! * the write policy keeps the backing store out of the write (not
//!   write-through) and the admission policy is `all` (no bypass);
//! * nothing waits before it: no request waiting for admission, no piece
//!   queued or waiting for a slot, and there are free slots for every block
//!   beyond those already reserved (clean blocks are evicted for them, as
//!   the buffered path would for this write), and room for all its pieces
//!   to start; under a bounded journal, room in it for every block;
//! * none of its blocks has a piece in progress or a patch set.
//!
//! Under these, every piece reaches `write_piece` at once and, being a full
//! block with no patches, is written in place or to a fresh (reserved) slot:
//! one plain cache write each. `handle_direct_write` asserts that.

use super::*;

impl<P: Payload> Engine<P> {
    /// Start the write `id` of `len` bytes at `offset` whose payload the
    /// driver will write to the cache device itself (module docs).
    ///
    /// Returns `None` when the write cannot go directly; nothing changed
    /// then, except that clean blocks may have been evicted to make room
    /// for it (which its buffered `handle_request` would do too). Otherwise returns the parts in payload order: the driver
    /// MUST write payload bytes `[payload_offset, payload_offset + len)` to
    /// cache-device offset `offset` of each part and then complete the part's
    /// `io` with [`Engine::handle_completion`] (`Ok(None)`, or the error),
    /// exactly as for a cache write from `poll_io`; it MAY do so in any
    /// order and at any time, and MUST NOT let a part's bytes reach the
    /// device before this call returns.
    pub fn handle_direct_write(
        &mut self,
        now: u64,
        id: ReqId,
        offset: u64,
        len: u64,
        fua: bool,
        tag: Tag,
    ) -> Option<Vec<DirectPart>> {
        if !self.direct_write_ok(offset, len) {
            return None;
        }
        let n = len / self.bs;
        // Room as `admit_write` finds it (with what a paced cleaner keeps
        // for writes that cannot go around, `full_keep`), else none here.
        let need = self.table.reserved + n + self.full_keep();
        if (self.table.free.len() as u64) < need {
            // Clean evictions, with the reserve kept.
            self.evict_clean_until(
                need.max(self.table.reserved + n + u64::from(self.cfg.free_reserve)),
            );
            if (self.table.free.len() as u64) < need {
                return None;
            }
        }
        let first_io = self.next_io;
        let pieces = (len / self.bs) as usize;
        self.handle_request(
            now,
            Request {
                id,
                op: ReqOp::Write {
                    offset,
                    // Never read: every byte goes out as a part (asserted below).
                    data: P::zeroes(len as usize),
                    fua,
                },
                tag,
            },
        );
        let mut parts = Vec::with_capacity(pieces);
        let (ios, all, bs) = (&self.ios, &self.pieces, self.bs);
        self.out_io.retain(|cmd| {
            if cmd.id < first_io || cmd.dev != Dev::Cache {
                return true;
            }
            let (
                Some(IoCtx::PieceCacheWrite { piece, .. }),
                IoOp::Write {
                    offset: at,
                    data,
                    fua: false,
                },
            ) = (ios.get(&cmd.id), &cmd.op)
            else {
                return true;
            };
            let pc = all.get(*piece);
            if pc.req != id {
                return true;
            }
            parts.push(DirectPart {
                io: cmd.id,
                offset: *at,
                payload_offset: pc.lbn * bs + u64::from(pc.start) - offset,
                len: data.len() as u64,
            });
            false
        });
        parts.sort_unstable_by_key(|p| p.payload_offset);
        assert!(
            parts.len() == pieces
                && parts
                    .iter()
                    .enumerate()
                    .all(|(i, p)| p.payload_offset == i as u64 * bs && p.len == bs),
            "direct write {id} ({offset}+{len}) did not go out as one cache write per block: {parts:?}"
        );
        self.stats.direct_writes += 1;
        Some(parts)
    }

    /// The conditions of the module docs but free slots (which may take
    /// evictions, see `handle_direct_write`).
    fn direct_write_ok(&self, offset: u64, len: u64) -> bool {
        let n = len / self.bs;
        if self.shutting_down
            || self.commits.vouched
            || len == 0
            || !offset.is_multiple_of(self.bs)
            || !len.is_multiple_of(self.bs)
            || !self.in_range(offset, len)
            || n > self.max_write_bytes() / self.bs
            || self.policy.synchronous_backing()
            || self.bypass.active
            || !self.admit_queue.is_empty()
            || !self.piece_queue.is_empty()
            || !self.alloc_waiters.is_empty()
            || u64::from(self.active_pieces) + n > u64::from(self.max_active)
            || !self.journal_room(n)
        {
            return false;
        }
        let first = offset / self.bs;
        (first..first + n).all(|lbn| {
            match self
                .map
                .index
                .get(lbn, |b| self.map.blocks[b as usize].lbn())
            {
                None => true,
                Some(b) => {
                    !self.map.blocks[b as usize].busy
                        && !self.map.waiters.contains_key(&b)
                        && !self.patch.sets.contains_key(&b)
                }
            }
        })
    }
}
