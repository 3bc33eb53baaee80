//! Requests into pieces: write admission (slot reservations), splitting
//! a request into per-block pieces, and starting a piece on its block.

use super::*;

impl<P: Payload> Engine<P> {
    // ------------------------------------------------------------- reads/writes

    /// Queue a write for admission. A write joins its write-policy group (node,
    /// transaction) only once the slots it may need are reserved, so it never
    /// waits for space while a group it belongs to waits for it (which would
    /// deadlock a journal transaction that must commit to free space).
    pub(super) fn admit_write(
        &mut self,
        id: ReqId,
        offset: u64,
        len: u64,
        data: P,
        fua: bool,
        tag: Tag,
    ) {
        let rw = |data: P| Rw {
            id,
            offset,
            len,
            data: Some(data),
            fua,
            tag,
        };
        if self.commits.vouched {
            // A warm restart's clean-shutdown record is still the durable
            // one: held until a commit ends it (`CommitState::vouched`).
            self.held.push_back(rw(data));
            self.commits.asap = true;
            return;
        }
        let first = offset / self.bs;
        let last = (offset + len - 1) / self.bs;
        let bypass = self.bypass.active
            && !self.bypass.admission.admit(&WriteInfo {
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
            self.start_rw(rw(data), Route::Bypass);
            return;
        }
        if bypass && self.journal_bypass_ok(first, last) {
            // Journaled: the write takes no transaction and runs now, ahead
            // of anything queued after it (see `journal_bypass_ok`).
            let pieces = self.start_rw(rw(data), Route::BypassUngrouped);
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
        let journal_full = !self.journal_room(need);
        let waits = !self.admit_queue.is_empty()
            || (self.table.free.len() as u64) < self.table.reserved + need
            || journal_full;
        let keep = self.full_keep();
        let full = waits || (self.table.free.len() as u64) < self.table.reserved + need + keep;
        if full && !bypass && self.bypass.when_full {
            // Write-back with a full cache: around the cache rather than wait
            // (`Config::bypass_when_full`). Pieces whose block is cached are
            // cached after all, taking a spare slot or waiting for one.
            self.stats.full_bypassed_writes += 1;
            self.note_full_bypass();
            self.start_rw(rw(data), Route::Bypass);
            return;
        }
        if waits {
            self.stats.admission_stalls += 1;
        }
        if journal_full {
            self.stats.journal_stalls += 1;
        }
        let issued = self.policy.issue_at_arrival().then(|| self.issue_write());
        self.admit_queue.push_back(Admit {
            rw: rw(data),
            route: if bypass { Route::Bypass } else { Route::Cache },
            need,
            pieces: last - first + 1,
            stalled_since: waits.then_some(self.now),
            issued,
        });
    }

    /// Admit the writes held while a clean-shutdown record was the durable
    /// one (`CommitState::vouched`), in arrival order, once it no longer is.
    pub(super) fn release_held(&mut self) -> bool {
        if self.commits.vouched || self.held.is_empty() {
            return false;
        }
        while let Some(rw) = self.held.pop_front() {
            let data = rw.data.expect("a held request is a write");
            self.admit_write(rw.id, rw.offset, rw.len, data, rw.fua, rw.tag);
        }
        true
    }

    pub(super) fn admit(&mut self) -> bool {
        let mut changed = false;
        let mut journal_wait = false;
        while let Some(a) = self.admit_queue.front() {
            if (self.table.free.len() as u64) < self.table.reserved + a.need {
                break;
            }
            if !self.journal_room(a.need) {
                journal_wait = true;
                break;
            }
            let a = self.admit_queue.pop_front().unwrap();
            if let Some(since) = a.stalled_since {
                // A stall for cache space, counted like a piece waiting for
                // a slot (its pieces then have reservations and never wait again).
                self.stats.stalled_writes += a.pieces;
                self.stats.stall_ns += (self.now - since) * a.pieces;
            }
            let pieces = self.start_rw_issued(a.rw, a.route, a.issued);
            // The first `need` pieces each hold one reservation.
            for &k in pieces.iter().take(a.need as usize) {
                self.pieces.get_mut(k).reserved = true;
                self.table.reserved += 1;
            }
            changed = true;
        }
        if self.cfg.journal.size_blocks > 0 {
            self.policy.journal_wait(journal_wait);
        }
        changed
    }

    /// Room in a bounded journal (`JournalConfig::size_blocks`) for a
    /// write needing `need` slots: the versions not yet checkpointed (dirty
    /// ones, new ones being written, and reservations of admitted writes)
    /// plus `need` stay within the bound, or the journal is empty (a write
    /// larger than the whole bound goes alone). Always true without a bound
    /// and for policies that keep no journal.
    pub(super) fn journal_room(&self, need: u64) -> bool {
        let bound = self.cfg.journal.size_blocks;
        if bound == 0 || !self.policy.kind().journaled() {
            return true;
        }
        let used = self.journal_blocks();
        used == 0 || used + need <= bound
    }

    pub(super) fn release_reservation(&mut self, p: u32) {
        let pc = self.pieces.get_mut(p);
        if std::mem::replace(&mut pc.reserved, false) {
            self.table.reserved -= 1;
        }
    }

    /// Split a request into block pieces and queue them; returns the pieces.
    /// A write joins its write-policy group unless routed
    /// [`Route::BypassUngrouped`] (a journaled bypass, `journal_bypass_ok`).
    pub(super) fn start_rw(&mut self, rw: Rw<P>, route: Route) -> Vec<u32> {
        self.start_rw_issued(rw, route, None)
    }

    /// A write's sequence number and group (`WritePolicy::on_write_issue`).
    fn issue_write(&mut self) -> (u64, Group) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let g = if self.policy.synchronous_backing() {
            NO_GROUP
        } else {
            self.policy.on_write_issue(self.now, seq)
        };
        (seq, g)
    }

    /// `start_rw` for a write issued already (`issued`: its sequence
    /// number and group, from `issue_write` on arrival).
    pub(super) fn start_rw_issued(
        &mut self,
        rw: Rw<P>,
        route: Route,
        issued: Option<(u64, Group)>,
    ) -> Vec<u32> {
        let Rw {
            id,
            offset,
            len,
            data,
            fua,
            tag,
        } = rw;
        let bypass = route != Route::Cache;
        let write = data.is_some();
        let (seq, group) = if write && route == Route::BypassUngrouped {
            assert!(self.policy.kind().journaled());
            // Decided by `admit_write` with `journal_bypass_ok`: the write
            // belongs to no transaction (and so has no sequence number: the
            // transactions' sequence ranges never cover it).
            (0, NO_GROUP)
        } else if write {
            issued.unwrap_or_else(|| self.issue_write())
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
                queued_at: 0,
                seq,
                group,
                fua,
            });
            self.piece_queue.push_back(p);
            ids.push(p);
        }
        ids
    }

    pub(super) fn start_piece(&mut self, p: u32) {
        let lbn = self.pieces.get(p).lbn;
        let b = self.block_for(lbn);
        if self.map.blocks[b as usize].busy {
            self.pieces.get_mut(p).queued_at = self.now;
            self.stats.block_waits += 1;
            self.map.waiters.entry(b).or_default().push_back(p);
            if self.bypass.active && self.pieces.get(p).critical {
                self.inherit(b);
            }
            return;
        }
        self.run_piece(p, b);
    }

    pub(super) fn run_piece(&mut self, p: u32, b: u32) {
        if self.pieces.get(p).data.is_none() {
            self.read_piece(p, b);
        } else {
            let blk = &mut self.map.blocks[b as usize];
            blk.busy = true;
            if blk.readers() > 0 {
                blk.fill_stale = true;
            }
            if self.bypass.active {
                self.bypass.holders.insert(b, p);
            }
            self.write_piece(p, b);
        }
    }
}
