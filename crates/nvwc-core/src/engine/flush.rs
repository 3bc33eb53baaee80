//! FLUSH and trim requests.

use super::*;

impl<P: Payload> Engine<P> {
    // ------------------------------------------------------------ flush, trim

    pub(super) fn start_flush(&mut self, id: ReqId, explicit: bool) {
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
        if !self.patch.sets.is_empty() {
            // Every patch acknowledged before this FLUSH becomes a version
            // first; then the FLUSH goes on in `flush_after_patches` (see `patch`).
            self.patch.flushes.push((id, explicit, self.next_seq));
            self.materialize_all();
            return;
        }
        self.flush_after_patches(id, explicit);
    }

    /// The rest of a FLUSH, once no patch older than it is left.
    pub(super) fn flush_after_patches(&mut self, id: ReqId, _explicit: bool) {
        if (self.patch.direct_unflushed || self.patch.direct_cover_inflight > 0)
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

    pub(super) fn issue_direct_cover(&mut self, req: Option<ReqId>) {
        self.patch.direct_unflushed = false;
        self.patch.direct_cover_inflight += 1;
        self.emit(Dev::Backing, IoOp::Flush, None, IoCtx::DirectCover { req });
    }

    pub(super) fn on_direct_cover(&mut self, req: Option<ReqId>, ok: bool) {
        self.patch.direct_cover_inflight -= 1;
        if !ok {
            // The writes may still be volatile: the next FLUSH tries again.
            self.patch.direct_unflushed = true;
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
    pub(super) fn cover_direct_at_end(&mut self) -> bool {
        if (self.drain || self.shutting_down)
            && self.patch.direct_unflushed
            && self.patch.direct_cover_inflight == 0
            && self.patch.sets.is_empty()
            && self.retry_at.is_none()
        {
            self.issue_direct_cover(None);
            return true;
        }
        false
    }

    /// The FLUSH's commit: every acknowledged write named by a durable commit.
    pub(super) fn flush_commit(&mut self, id: ReqId) {
        if self.commits.meta_dirty.is_empty()
            && self.commits.job.is_none()
            && !self.commits.unsynced_overwrites
        {
            // Every acknowledged write is already named by a durable commit,
            // and its bytes were flushed by it.
            return self.reply(id, Ok(None), 0);
        }
        if crate::mutation::active(crate::mutation::Mutation::FlushNeverAnswered) {
            return;
        }
        self.commits.waiters.push(Waiter {
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
    pub(super) fn start_trim(&mut self, id: ReqId, offset: u64, len: u32) {
        if len == 0 {
            return self.reply(id, Ok(None), 0);
        }
        let first = offset.div_ceil(self.bs);
        let end = (offset + len as u64) / self.bs;
        for lbn in first..end {
            if let Some(b) = self
                .map
                .index
                .get(lbn, |id| self.map.blocks[id as usize].lbn())
            {
                let blk = &self.map.blocks[b as usize];
                if blk.latest != NIL && !blk.busy && !self.map.waiters.contains_key(&b) {
                    let s = &self.table.slots[blk.latest as usize];
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
}
