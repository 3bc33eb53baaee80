//! Patches: non-blocking partial writes (non-blocking-writes paper §3–4).
//!
//! A partial write to a block that has no cached version would normally read
//! the whole block from the backing store first (fetch-before-write). With a
//! [`FetchMode`] other than `Blocking`, the engine instead keeps the written
//! bytes as a *patch* in RAM and acknowledges the write at once.
//!
//! * **Patch sets.** Each patched block has one [`PatchSet`]: its parts are
//!   kept sorted, disjoint and non-adjacent, because adjacent and overlapping
//!   patches merge on arrival (newer bytes win). That is the paper's per-page
//!   FIFO queue after merging: applying the queue in order gives the same
//!   bytes, and RAM grows with the bytes changed, not the bytes written.
//! * **Invariant.** A block with a patch set has no cached version
//!   (`latest == NIL`) and no shadows. The set holds one slot reservation,
//!   so bringing it up to date can always get a slot.
//! * **Non-blocking reads (§3.4).** A read that one part covers is answered
//!   from RAM; any other read waits until the block is brought up to date.
//! * **Bringing a block up to date** ("materialising"): read the whole block
//!   from the backing store, apply the parts, write it to a fresh slot and
//!   install it as a dirty version of the patch set's group. Under `Lazy`,
//!   a set with one part and nothing waiting on it is instead **persisted**:
//!   its part is written into a fresh slot at its offset and installed as a
//!   *partial version* (valid only in the part's range, `F_PARTIAL` on disk;
//!   see [`super::partial`]), with no fetch at all. With
//!   `Config::patch_direct` (write-back only) the parts are written to the
//!   backing store instead (no fetch, no slot) and the patches are dropped
//!   when those writes complete. They are then in the backing store's
//!   volatile cache: the next client FLUSH issues a backing FLUSH before its
//!   commit, and so does the end of a drain or a shutdown.
//! * **When.** `Async`: at once. `AsyncBg`: queued, at most
//!   `fetch_bg_inflight` in flight. `Lazy`: only when needed. In every mode:
//!   a read not covered by the patches; a FLUSH or checkpoint (for every set
//!   that exists when it arrives); a write that cannot merge (a FUA write, a
//!   write of another policy group, a full write whose policy keeps the older
//!   data); patch RAM above `patch_clean_at × patch_mem_bytes` or writers
//!   stalled for space (oldest sets first, in the background); drain and
//!   shutdown; and, under ordered write-back, every metadata commit.
//! * **Patch memory limit.** A new patch set that would take patch RAM over
//!   `patch_mem_bytes` is not created: the write falls back to
//!   fetch-before-write (`Stats::patch_fallbacks`).
//!
//! # Durability (crash story)
//! A patch lives only in RAM. A non-FUA write MAY be acknowledged while it is
//! a patch (NBD allows it): `kill -9` or losing the cache device loses it, as
//! it would lose any write not yet flushed. A FUA write never becomes a patch.
//! A FLUSH (or checkpoint) first brings every patch set that exists when it
//! arrives up to date (persisted as a partial version under `Lazy`, else
//! fetched, applied and written as a whole version), and only then takes the
//! usual path (a commit that started after those versions were written), so by
//! its reply every patch acknowledged before it is in a durable commit (or, with
//! `patch_direct`, on the backing store, and a backing FLUSH issued after
//! that write completed has completed). `kill -9` after a direct write
//! completes keeps its bytes (they are in the backing store's cache, and no
//! cache version of the block exists to shadow them). Under `Lazy` this is
//! a patch log on the cache device whose record is the
//! partial version itself, so there is still one on-disk format (one flag
//! more) and one recovery path, and a FLUSH costs cache writes, not one
//! backing read per patched block. The other modes keep fetch-and-install,
//! which is what they are measured for.

//! **Consistency.** A patch write takes its policy group at issue like any
//! write and completes (in the ordered graph's sense) when acknowledged, so
//! later writes depend on it. Until its patch becomes a version the policy is
//! told it is pending ([`WritePolicy::on_patch_pending`]): an ordered node is
//! not destaged, a journal transaction does not commit (so no later one does).
//! Under ordered write-back a metadata commit also waits until no patch is
//! left (new patch sets are refused meanwhile, so the wait is bounded): a
//! durable later version must never outlive an earlier patch lost in a crash.
//! Patches of one block all belong to one group; a write of another group
//! waits for the block to be brought up to date.
//!
//! # Errors (§5.2)
//! A failed fetch (or direct write, or cache write) keeps the patches in RAM
//! and retries after `retry_ns`. Reads waiting for the block fail with EIO.
//! The error is reported to every FLUSH waiting on that block (EIO); later
//! FLUSHes retry. Nothing acknowledged is dropped.

use super::patch_set::{merge_part, PatchSet};
use super::*;

impl<P: Payload> Engine<P> {
    /// A write piece on block `b`, which has no cached version. Returns true
    /// if patching took the piece (made or merged a patch, or parked it);
    /// false to go on with the normal write path.
    pub(super) fn patch_write(&mut self, p: u32, b: u32) -> bool {
        let (start, end, group, fua, seq, reserved) = {
            let pc = self.pieces.get(p);
            (pc.start, pc.end, pc.group, pc.fua, pc.seq, pc.reserved)
        };
        let full = start == 0 && end as u64 == self.bs;
        if self.patch.sets.contains_key(&b) {
            return self.patch_onto_set(p, b, full);
        }
        let blk = &self.map.blocks[b as usize];
        if full
            || fua
            || !reserved
            || self.cfg.fetch == FetchMode::Blocking
            || self.patch.barrier
            || blk.shadows > 0
            || blk.destaging > 0
        {
            return false;
        }
        let len = (end - start) as u64;
        if self.patch.bytes + len > self.cfg.patch_mem_bytes {
            self.stats.patch_fallbacks += 1;
            return false;
        }
        // The set takes over the piece's slot reservation.
        let data = {
            let pc = self.pieces.get_mut(p);
            pc.reserved = false;
            pc.data.clone().expect("write data")
        };
        let id = self.patch.next_id;
        self.patch.next_id += 1;
        self.patch.sets.insert(
            b,
            PatchSet {
                parts: vec![(start, data)],
                bytes: len as u32,
                group,
                first_seq: seq,
                last_seq: seq,
                id,
                io: false,
                frozen: false,
                direct_left: 0,
                direct_failed: false,
                queued: false,
                superseding: false,
                waiters: Vec::new(),
            },
        );
        self.patch.order.insert((seq, b));
        self.patch.bytes += len;
        self.stats.patches_created += 1;
        if group != NO_GROUP {
            self.policy.on_patch_pending(group);
        }
        // A FLUSH waits for every set older than it (by issue sequence), and
        // this write may have been issued before a FLUSH that is waiting now.
        let flush_waits = self.patch.flushes.iter().any(|f| f.2 > seq);
        match self.cfg.fetch {
            _ if flush_waits || self.patch.barrier => self.materialize(b, true),
            FetchMode::Async => self.materialize(b, true),
            FetchMode::AsyncBg => self.materialize(b, false),
            FetchMode::Lazy | FetchMode::Blocking => {}
        }
        self.finish_write_piece(p);
        true
    }

    /// Write piece `p` to block `b`, which already has a patch set: merge
    /// it into the set, let a full-block write supersede the set, or wait
    /// for the set to be materialised. Returns false if the piece should
    /// take the normal write path (superseding).
    fn patch_onto_set(&mut self, p: u32, b: u32, full: bool) -> bool {
        let (start, group, fua, seq) = {
            let pc = self.pieces.get(p);
            (pc.start, pc.group, pc.fua, pc.seq)
        };
        let ps = &self.patch.sets[&b];
        let frozen = ps.frozen;
        if full
            && !frozen
            && !ps.io
            && ps.waiters.is_empty()
            && !self.policy.keep_superseded(ps.group, group)
        {
            // The whole block is rewritten: once the new version is
            // installed the patches are moot (`patch_superseded`); if its
            // write fails they stay. No materialisation starts meanwhile.
            self.patch.sets.get_mut(&b).unwrap().superseding = true;
            return false;
        }
        if !full && !fua && !frozen && ps.group == group {
            let data = self.pieces.get_mut(p).data.clone().expect("write data");
            let ps = self.patch.sets.get_mut(&b).unwrap();
            let delta = merge_part(&mut ps.parts, start, data);
            ps.bytes = (ps.bytes as i64 + delta) as u32;
            ps.last_seq = ps.last_seq.max(seq);
            self.patch.bytes = (self.patch.bytes as i64 + delta) as u64;
            self.stats.patch_merges += 1;
            self.finish_write_piece(p);
            return true;
        }
        self.stats.patch_waits += 1;
        self.patch.sets.get_mut(&b).unwrap().waiters.push(p);
        self.materialize(b, true);
        true
    }

    /// A read piece on block `b`, which has patches and no cached version.
    pub(super) fn patch_read(&mut self, p: u32, b: u32) {
        let (start, end) = {
            let pc = self.pieces.get(p);
            (pc.start, pc.end)
        };
        let ps = self.patch.sets.get_mut(&b).expect("patched block");
        let i = ps.parts.partition_point(|(s, _)| *s <= start);
        if i > 0 {
            let (s, d) = &ps.parts[i - 1];
            if s + d.len() as u32 >= end {
                let data = d.slice((start - s) as usize..(end - s) as usize);
                self.stats.patch_reads += 1;
                self.stats.read_hits += 1;
                return self.finish_read_piece(p, Some(data));
            }
        }
        ps.waiters.push(p);
        self.stats.patch_waits += 1;
        self.materialize(b, true);
    }

    /// Bring block `b` up to date: now (`urgent`) or through the background queue.
    pub(super) fn materialize(&mut self, b: u32, urgent: bool) {
        let ps = self.patch.sets.get_mut(&b).expect("patched block");
        if ps.io || ps.superseding {
            return;
        }
        if !urgent {
            if !ps.queued {
                ps.queued = true;
                self.patch.bg.push_back(b);
            }
            return;
        }
        self.start_materialize(b, false);
    }

    fn start_materialize(&mut self, b: u32, bg: bool) {
        let lbn = self.map.blocks[b as usize].lbn();
        let reads_wait = {
            let ps = &self.patch.sets[&b];
            ps.waiters
                .iter()
                .any(|&w| self.pieces.get(w).data.is_none())
        };
        if self.persist_patch(b) {
            return;
        }
        if bg {
            self.patch.bg_inflight += 1;
        }
        let bs = self.bs;
        let direct = self.write_patch_directly() && !reads_wait;
        let ps = self.patch.sets.get_mut(&b).unwrap();
        ps.io = true;
        let id = ps.id;
        if direct {
            // Freeze the parts: the block is busy until the writes are done.
            let took = !self.map.blocks[b as usize].busy;
            self.map.blocks[b as usize].busy = true;
            let parts = ps.parts.clone();
            ps.frozen = true;
            ps.direct_left = parts.len() as u32;
            ps.direct_failed = false;
            self.stats.patch_direct_writes += 1;
            for (s, d) in parts {
                self.emit(
                    Dev::Backing,
                    IoOp::Write {
                        offset: lbn * bs + s as u64,
                        data: d,
                        fua: false,
                    },
                    None,
                    IoCtx::PatchDirect {
                        block: b,
                        id,
                        bg,
                        took,
                    },
                );
            }
            return;
        }
        self.stats.patch_fetches += 1;
        self.backing_read(lbn * bs, bs as u32, IoCtx::PatchFetch { block: b, id, bg });
    }

    /// Lazy mode: write block `b`'s one patch into a fresh slot and install
    /// it as a partial version, with no fetch (`super::partial`). Only for a
    /// set with one part and nothing waiting on it; returns false otherwise
    /// (the caller fetches).
    fn persist_patch(&mut self, b: u32) -> bool {
        let ps = &self.patch.sets[&b];
        if self.cfg.fetch != FetchMode::Lazy
            || !self.partial_ok
            || ps.parts.len() != 1
            || !ps.waiters.is_empty()
            || self.write_patch_directly() && !self.durability_waits_for(b)
        {
            return false;
        }
        let lbn = self.map.blocks[b as usize].lbn();
        let Some(s) = self.alloc_slot(lbn) else {
            // Cannot happen while the set holds its reservation: fetch instead.
            return false;
        };
        let ps = self.patch.sets.get_mut(&b).unwrap();
        ps.io = true;
        ps.frozen = true;
        let (at, data) = ps.parts[0].clone();
        self.stats.patch_persists += 1;
        self.write_patch_slot(b, s, at, data, true);
        true
    }

    /// Write block `b`'s new contents (`data` at `at` in slot `s`: the whole
    /// block, or the one patch of a partial version) and install it when done.
    fn write_patch_slot(&mut self, b: u32, s: u32, at: u32, data: P, partial: bool) {
        let took = !self.map.blocks[b as usize].busy;
        self.map.blocks[b as usize].busy = true;
        let off = self.layout.slot_offset(s) + at as u64;
        self.cache_write(
            off,
            data,
            IoCtx::PatchInstall {
                block: b,
                slot: s,
                took,
                partial,
            },
        );
    }

    /// Does a FLUSH (or a clean stop) wait for block `b`'s patches? Then,
    /// under lazy, a one-part set goes into its reserved slot as a partial
    /// version even when the cache is short of room (`write_patch_directly`):
    /// a cache write instead of a backing write on the FLUSH's path. With
    /// many sets outstanding, writing each directly made the FLUSH wait for
    /// one backing write per set at the backing store's parallelism (about
    /// 19,000 sets, 2 s at 1 ms per write: `scripts/bench-nbw.sh`). The slot
    /// was promised to the set anyway; the destage that later frees it
    /// copies only the part's range, one backing write as the direct write
    /// would have been, off the FLUSH's path. Not with `patch_direct`, which
    /// asks for direct writes, nor in a drain, which writes everything back.
    fn durability_waits_for(&self, b: u32) -> bool {
        if self.cfg.patch_direct || self.drain {
            return false;
        }
        let first = self.patch.sets[&b].first_seq;
        self.shutting_down || self.patch.flushes.iter().any(|f| f.2 > first)
    }

    /// Write patches straight to the backing store (no fetch, no slot)?
    /// Always with `patch_direct`; and under lazy write-back once free slots
    /// (beyond those promised) fall below an eighth of the cache, the mark
    /// at which the engine starts reclaiming early: a partial version takes a
    /// whole slot for a few bytes, and a cache full of them makes every new
    /// patch wait for an eviction and a metadata commit (with 64 KiB blocks
    /// and 2 KiB patches, lazy was then bound by slot reclaim at 2.2x
    /// blocking; reacting only once writers waited, 4x). Write-back only: it
    /// is the policy with no order for the backing store to keep.
    fn write_patch_directly(&self) -> bool {
        self.cfg.patch_direct
            || self.cfg.fetch == FetchMode::Lazy
                && self.cfg.write_policy == WritePolicyKind::WriteBack
                && (self.table.free.len() as u64) < self.table.reserved + self.layout.capacity / 8
    }

    pub(super) fn on_patch_fetch(&mut self, b: u32, id: u64, bg: bool, res: IoResult<P>) {
        if bg {
            self.patch.bg_inflight -= 1;
        }
        let bs = self.bs as usize;
        let Some(ps) = self.patch.sets.get_mut(&b) else {
            return;
        };
        if ps.id != id {
            return;
        }
        let data = match res {
            Ok(Some(d)) if d.len() == bs => d,
            _ => {
                self.stats.patch_fetch_errors += 1;
                return self.patch_failed(b);
            }
        };
        let Some(s) = self.alloc_slot(self.map.blocks[b as usize].lbn()) else {
            // Cannot happen while the reservation invariant holds; retry later.
            return self.patch_failed(b);
        };
        let ps = self.patch.sets.get_mut(&b).unwrap();
        ps.frozen = true;
        let mut buf = data;
        for (at, d) in &ps.parts {
            buf = buf.overlay(*at as usize, d);
        }
        self.write_patch_slot(b, s, 0, buf, false);
    }

    /// The cache write of a patched block finished: a whole block brought up
    /// to date, or (`partial`) the set's one patch, persisted as a partial version.
    pub(super) fn on_patch_install(&mut self, b: u32, s: u32, took: bool, partial: bool, ok: bool) {
        if !ok {
            self.unalloc_slot(s);
            self.patch_failed(b);
            if took {
                self.release_block(b);
            }
            return;
        }
        let lbn = self.map.blocks[b as usize].lbn();
        let (seq, group, range) = {
            let ps = &self.patch.sets[&b];
            let (fs, _) = ps.parts[0];
            let (ls, ld) = ps.parts.last().unwrap();
            (ps.last_seq, ps.group, (fs, ls + ld.len() as u32))
        };
        let waiters = self.remove_patch_set(b, false);
        self.install(b, s, lbn, seq, NewVersion::Dirty { group, range });
        if partial {
            self.partial.insert(s, range);
        }
        if group != NO_GROUP {
            self.policy.on_patch_done(group);
        }
        self.rerun_waiters(b, waiters, took);
    }

    pub(super) fn on_patch_direct(&mut self, b: u32, id: u64, bg: bool, took: bool, ok: bool) {
        let ps = self
            .patch
            .sets
            .get_mut(&b)
            .expect("patched block busy with direct writes");
        assert_eq!(ps.id, id);
        ps.direct_left -= 1;
        ps.direct_failed |= !ok;
        if ps.direct_left > 0 {
            return;
        }
        if bg {
            self.patch.bg_inflight -= 1;
        }
        if ps.direct_failed {
            self.patch_failed(b);
            if took {
                self.release_block(b);
            }
            return;
        }
        // On the backing store, not yet durable there: the patch set goes
        // now (a read of the block reads these bytes back from the backing
        // store), and the next client FLUSH issues a backing FLUSH before its
        // commit (`Engine::flush_after_patches`).
        self.patch.direct_unflushed = true;
        let group = ps.group;
        let waiters = self.remove_patch_set(b, false);
        if group != NO_GROUP {
            self.policy.on_patch_done(group);
        }
        self.rerun_waiters(b, waiters, took);
    }

    /// Run the pieces that waited for block `b`, then give up the block if the
    /// materialisation took it.
    fn rerun_waiters(&mut self, b: u32, waiters: Vec<u32>, took: bool) {
        for p in waiters {
            if self.pieces.get(p).data.is_none() {
                self.read_piece(p, b);
            } else {
                // The parked write has held the block busy all along. Reads
                // that missed meanwhile must not fill the cache with data
                // older than it (as in `run_piece`).
                debug_assert!(!took);
                if self.map.blocks[b as usize].readers() > 0 {
                    self.map.blocks[b as usize].fill_stale = true;
                }
                self.write_piece(p, b);
            }
        }
        if took {
            self.release_block(b);
        } else {
            self.maybe_drop_block(b);
        }
        self.patch_flushes_ready();
    }

    /// A fetch, direct write or cache write failed: keep the patches, fail the
    /// reads and FLUSHes that need them, retry later.
    fn patch_failed(&mut self, b: u32) {
        let retry = self.now + self.cfg.retry_ns;
        let ps = self.patch.sets.get_mut(&b).unwrap();
        ps.io = false;
        ps.frozen = false;
        ps.queued = true;
        let first = ps.first_seq;
        let mut reads = Vec::new();
        ps.waiters.retain(|&w| {
            let is_read = self.pieces.get(w).data.is_none();
            if is_read {
                reads.push(w);
            }
            !is_read
        });
        for w in reads {
            self.finish_read_piece(w, None);
        }
        let mut failed = Vec::new();
        self.patch.flushes.retain(|f| {
            if f.2 > first {
                failed.push(f.0);
                false
            } else {
                true
            }
        });
        for id in failed {
            self.reply(id, Err(ReqError::Io), 0);
        }
        self.patch.retry.push(b);
        if self.retry_at.is_none() {
            self.retry_at = Some(retry);
        }
        self.out_event.push_back(Event::BackgroundError {
            what: "patched block fetch",
        });
    }

    /// The write piece that superseded block `b`'s patches finished: installed
    /// (`ok`: the patches go) or failed (they stay, and are brought up to date).
    pub(super) fn patch_superseded(&mut self, b: u32, ok: bool) {
        let Some(ps) = self.patch.sets.get_mut(&b) else {
            return;
        };
        if !ps.superseding {
            return;
        }
        ps.superseding = false;
        if ok {
            self.stats.patch_discards += 1;
            self.remove_patch_set(b, true);
        } else {
            self.materialize(b, true);
        }
    }

    /// Drop block `b`'s patch set; returns its waiting pieces. `superseded`:
    /// a full write replaced the patches (the policy hears it here).
    fn remove_patch_set(&mut self, b: u32, superseded: bool) -> Vec<u32> {
        let ps = self.patch.sets.remove(&b).expect("patched block");
        self.patch.order.remove(&(ps.first_seq, b));
        self.patch.bytes -= ps.bytes as u64;
        assert!(self.table.reserved > 0, "patch set without its reservation");
        self.table.reserved -= 1;
        if superseded && ps.group != NO_GROUP {
            self.policy.on_patch_done(ps.group);
        }
        assert!(
            !superseded || ps.waiters.is_empty(),
            "discarded a patch set with waiters"
        );
        ps.waiters
    }

    /// Background work: patch cleaning, the background queue, retries, and
    /// FLUSHes whose patches are all up to date.
    pub(super) fn patch_progress(&mut self) -> bool {
        self.patch_flushes_ready();
        if self.patch.sets.is_empty() {
            return false;
        }
        let mut changed = false;
        if self.retry_at.is_none() && !self.patch.retry.is_empty() {
            for b in std::mem::take(&mut self.patch.retry) {
                if let Some(ps) = self.patch.sets.get_mut(&b) {
                    if !ps.io {
                        self.patch.bg.push_back(b);
                    }
                }
            }
        }
        let limit = self.cfg.fetch_bg_inflight;
        let over =
            self.patch.bytes as f64 > self.cfg.patch_clean_at * self.cfg.patch_mem_bytes as f64;
        if (over || self.space_pressure()) && self.patch.bg.len() < limit as usize {
            let want = limit as usize - self.patch.bg.len();
            let mut picked = Vec::new();
            for &(_, b) in self.patch.order.iter() {
                let ps = &self.patch.sets[&b];
                if !ps.io && !ps.queued {
                    picked.push(b);
                    if picked.len() >= want {
                        break;
                    }
                }
            }
            for b in picked {
                self.patch.sets.get_mut(&b).unwrap().queued = true;
                self.patch.bg.push_back(b);
            }
        }
        // After a failure nothing new starts in the background until
        // `retry_at`: a backing store that is down is not hammered.
        while self.retry_at.is_none() && self.patch.bg_inflight < limit {
            let Some(b) = self.patch.bg.pop_front() else {
                break;
            };
            let Some(ps) = self.patch.sets.get_mut(&b) else {
                continue;
            };
            ps.queued = false;
            if ps.io || ps.superseding {
                continue;
            }
            self.start_materialize(b, true);
            changed = true;
        }
        changed
    }

    /// Request every patch set now (FLUSH, barrier, drain, shutdown).
    pub(super) fn materialize_all(&mut self) {
        let blocks: Vec<u32> = self.patch.order.iter().map(|&(_, b)| b).collect();
        for b in blocks {
            self.materialize(b, true);
        }
    }

    /// Continue the FLUSHes whose patches are all up to date.
    pub(super) fn patch_flushes_ready(&mut self) {
        if self.patch.flushes.is_empty() {
            return;
        }
        let oldest = self.patch.order.first().map_or(u64::MAX, |&(s, _)| s);
        let ready: Vec<(ReqId, bool, u64)> = self
            .patch
            .flushes
            .iter()
            .copied()
            .filter(|f| f.2 <= oldest)
            .collect();
        self.patch.flushes.retain(|f| f.2 > oldest);
        for (id, explicit, _) in ready {
            self.flush_after_patches(id, explicit);
        }
    }
}

/// Patch state (non-blocking writes): the patch sets, their order, and
/// background materialisation.
pub(super) struct PatchState<P> {
    /// Patched blocks, oldest first in `order` by first sequence number.
    pub(super) sets: IdMap<u32, PatchSet<P>>,
    pub(super) order: BTreeSet<(u64, u32)>,
    /// Bytes held in patches.
    pub(super) bytes: u64,
    pub(super) next_id: u64,
    /// Patched blocks queued for background materialisation, and how many run.
    pub(super) bg: VecDeque<u32>,
    pub(super) bg_inflight: u32,
    /// Patched blocks whose materialisation failed, retried at `retry_at`.
    pub(super) retry: Vec<u32>,
    /// A commit waits for every patch (ordered): no new patch sets meanwhile.
    pub(super) barrier: bool,
    /// FLUSHes waiting for patch sets older than their sequence number: (id, explicit, seq).
    pub(super) flushes: Vec<(ReqId, bool, u64)>,
    /// Direct patch writes completed (and their patch sets dropped) since the
    /// last backing FLUSH was issued: the next client FLUSH issues one first.
    pub(super) direct_unflushed: bool,
    /// Backing FLUSHes in flight for `direct_unflushed` writes.
    pub(super) direct_cover_inflight: u32,
}

impl<P> Default for PatchState<P> {
    fn default() -> Self {
        PatchState {
            sets: IdMap::default(),
            order: BTreeSet::new(),
            bytes: 0,
            next_id: 1,
            bg: VecDeque::new(),
            bg_inflight: 0,
            retry: Vec::new(),
            barrier: false,
            flushes: Vec::new(),
            direct_unflushed: false,
            direct_cover_inflight: 0,
        }
    }
}
