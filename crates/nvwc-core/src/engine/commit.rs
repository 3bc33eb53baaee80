//! Metadata commits: log records (one device flush) and checkpoints
//! (the shadow-paged slot table: three). `docs/ON-DISK-FORMAT.md`, "The
//! commit protocol", is the specification; this file is its only writer.
//!
//! A **log commit** `n` appends one record to the log: the entries of every
//! slot whose entry changed since the previous commit, each valid entry
//! with the CRC-32C of its version's bytes. Then one FLUSH makes the
//! record and the data it names durable together. There is no flush
//! between data and record: recovery accepts a record only if the data of
//! every checked entry matches its checksum, so a record that reached the
//! device before its data is recognised as unfinished.
//!
//! An **inline** log commit (format 4) carries the new versions' bytes in
//! the record itself (`F_INLINE`), read back from their slots, and writes
//! the record with FUA: one device write, no device flush. It is taken
//! when those bytes are few (`Config::log_inline_bytes`) and no in-place
//! overwrite waits for a flush (`unsynced_overwrites`): then the record
//! holds everything the FLUSH promises. The versions' slots are not
//! flushed, so recovery writes the bytes of an unsealed inline record into
//! their slots (`recover.rs`).
//!
//! A record is **sealed** once a durable record says that its versions'
//! bytes were durable *in their slots* when that record was built (its
//! `sealed` field: `LogState::in_place`, the last commit followed by a
//! device flush: a flushed log commit or a checkpoint), or a checkpoint
//! covers it. Recovery checks (or, inline, writes back) data only for
//! records past the highest `sealed` it reads, so a sealed record's
//! versions may change afterwards without invalidating it. Hence two
//! rules, both enforced here and in `inplace_ok`:
//!
//! * a version's bytes MUST NOT change while the record that introduced it
//!   is unsealed (`S_UNSEALED`): write-back's in-place rewrite waits for the
//!   seal (the write goes to a fresh slot meanwhile);
//! * a slot freed by a record is reused only after that record is durable;
//!   with one commit at a time that record's `sealed` field covers every
//!   earlier record, so the version it frees is sealed too.
//!
//! A **checkpoint** writes every slot-table page changed since the last
//! checkpoint (shadow paging), flushes, and writes the commit record with
//! FUA. The log then restarts at its beginning under the new checkpoint's
//! number (its epoch). A commit is a checkpoint when the cache has no log
//! (format 1 and 2), when the record would not fit in what is left of the
//! log, at a clean shutdown, and first after recovery or a failed commit
//! (the log's tail is then unknown).

use super::*;
use crate::layout::{LogRecord, F_INLINE, F_NOCHECK};

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum CommitStage {
    /// Checkpoint: FLUSH the data, write pages, FLUSH, write the record (FUA).
    DataFlush,
    Pages,
    MetaFlush,
    Record,
    /// Log commit: checksum the new versions (inline: read them), write
    /// the record (inline: with FUA, and done), FLUSH.
    Checksums,
    LogWrite,
    LogFlush,
}

#[derive(Debug)]
pub(super) struct CommitJob<P> {
    pub(super) n: u64,
    pub(super) stage: CommitStage,
    snapshot: Vec<(u32, bool)>,
    /// Checkpoint: (page, copy, bytes), and what was written.
    pages: Vec<(u64, u8, Vec<u8>)>,
    written: Vec<(u64, u8)>,
    /// Checkpoint: every page it writes (put back into `LogState::pages` if it fails).
    ckpt_pages: Vec<u64>,
    /// Checkpoint: the commit-record copy it writes.
    copy: u8,
    /// Checkpoint: it erases that copy first (`LogState::record_unsure`).
    erase: bool,
    waiters: Vec<Waiter>,
    left: u32,
    failed: bool,
    /// Checkpoint: times its record write failed and waits to be written
    /// again (`on_commit_io`); `record_wait` while a retry is due.
    record_tries: u32,
    pub(super) record_wait: bool,
    record: CommitRecord,
    /// Log commit: the record (its entries' checksums fill in as they complete).
    log: Option<LogRecord>,
    /// Log commit: inline (its record carries the new versions' bytes, read
    /// into `inline_data` by entry, and is written with FUA, no flush).
    inline: bool,
    inline_data: Vec<Option<P>>,
    /// Log commit: bytes its record takes in the log.
    log_len: u64,
}

/// The log's and the checkpoints' state.
#[derive(Debug, Default)]
pub(super) struct LogState {
    /// Byte offset of the next record within the log region.
    pos: u64,
    /// Commit number of the durable checkpoint the log extends.
    epoch: u64,
    /// Commit-record copy (0 = A, 1 = B) holding that checkpoint.
    cr_cur: u8,
    /// The next commit MUST be a checkpoint.
    force_checkpoint: bool,
    /// A checkpoint gave up on its record write (`RECORD_RETRIES` failed):
    /// the copy not in force (`1 - cr_cur`) may hold that record, landed
    /// whole, naming the shadow pages the next checkpoint writes. The next
    /// checkpoint MUST erase that copy before it writes a page.
    record_unsure: bool,
    /// Highest commit known sealed on the device.
    sealed: u64,
    /// Highest commit whose versions' bytes are durable in their slots:
    /// the last one followed by a device flush (a flushed log commit or a
    /// checkpoint). Inline commits leave it; records carry it as `sealed`.
    in_place: u64,
    /// Versions introduced by an unsealed record, oldest first: (commit, slot, seq).
    unsealed: VecDeque<(u64, u32, u64)>,
    /// Slot-table pages changed since the durable checkpoint.
    pages: PageSet,
}

/// A set of slot-table page numbers, one bit per page, iterated in
/// ascending order (as the `BTreeSet` it replaces was: a checkpoint writes
/// its pages in that order). Every commit snapshot inserts the page of each
/// slot it names, so this is on the write path.
#[derive(Debug, Default)]
pub(super) struct PageSet {
    words: Vec<u64>,
}

impl PageSet {
    pub(super) fn insert(&mut self, page: u64) {
        let w = usize::try_from(page / 64).expect("page number fits usize");
        if w >= self.words.len() {
            self.words.resize(w + 1, 0);
        }
        self.words[w] |= 1 << (page % 64);
    }

    /// Pages in ascending order.
    pub(super) fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.words.iter().enumerate().flat_map(|(w, &bits)| {
            let mut bits = bits;
            std::iter::from_fn(move || {
                if bits == 0 {
                    return None;
                }
                let b = bits.trailing_zeros();
                bits &= bits - 1;
                Some(w as u64 * 64 + u64::from(b))
            })
        })
    }

    /// Removes every page, keeping the allocation.
    fn clear(&mut self) {
        self.words.iter_mut().for_each(|w| *w = 0);
    }
}

impl LogState {
    /// State of a freshly formatted device: checkpoint 0 in copy A, empty log.
    pub(super) fn fresh() -> Self {
        LogState::default()
    }
    /// State after recovery: the log extends checkpoint `epoch` (in copy
    /// `cr_cur`); the first commit MUST be a checkpoint.
    pub(super) fn recovered(epoch: u64, cr_cur: u8) -> Self {
        LogState {
            epoch,
            cr_cur,
            force_checkpoint: true,
            sealed: epoch,
            in_place: epoch,
            ..Default::default()
        }
    }
    /// Remember that `slot`'s version `seq` becomes sealed with commit `n`.
    pub(super) fn note_unsealed(&mut self, n: u64, slot: u32, seq: u64) {
        debug_assert!(self.unsealed.back().is_none_or(|b| b.0 <= n));
        self.unsealed.push_back((n, slot, seq));
    }
    pub(super) fn page_changed(&mut self, page: u64) {
        self.pages.insert(page);
    }
}

/// Most data bytes one log record checksums; a commit that would check
/// more is a checkpoint. A record's cost grows with the data it names
/// (CRC-32C over every new version, read from the host's page cache, under
/// the engine's lock), a checkpoint's with the pages it writes plus two
/// more device syncs. 1 MiB is about one device sync's worth of checksum
/// work (CRC-32C with SSE4.2 runs at several GB/s; a device sync costs
/// 0.1-1 ms on this project's machines), so FLUSH-driven commits of a few
/// blocks take the log, and background commits of many thousands of
/// blocks (autocommits under bulk writes) take a checkpoint, which also
/// seals everything at once for in-place rewrites.
pub(super) const LOG_MAX_CHECKED_BYTES: u64 = 1 << 20;

impl<P: Payload> Engine<P> {
    pub(super) fn maybe_commit(&mut self) -> bool {
        // An in-place write in flight leaves its slot's contents undefined: the
        // commit waits for it (new in-place writes are refused meanwhile).
        if self.commits.job.is_some() {
            return false;
        }
        let autocommit = self
            .commits
            .oldest_change
            .is_some_and(|t| self.now >= t.saturating_add(self.cfg.autocommit_ns))
            || self.commits.meta_dirty.len() >= self.cfg.autocommit_changes as usize;
        // Reclaim when writers need slots, and also before they have to
        // wait: once free slots fall below an eighth of the cache and a
        // commit would release at least a thirty-second of it, that commit
        // starts while the free slots still absorb writes.
        let free = self.table.free.len() as u64;
        let cap = self.cfg.capacity_blocks;
        let reclaim = self.table.retired_pending > 0
            && (free < self.free_wanted()
                || free < cap / 8 && self.table.retired_pending >= (cap / 32).max(1));
        if !(self.commits.asap
            || !self.commits.waiters.is_empty()
            || self.policy.wants_commit()
            || autocommit
            || reclaim)
        {
            return false;
        }
        if self.stop_holds_commits() {
            return false;
        }
        if self.policy.commit_needs_patches_done() && !self.patch.sets.is_empty() {
            if !self.patch.barrier {
                self.patch.barrier = true;
                self.materialize_all();
            }
            return false;
        }
        self.patch.barrier = false;
        if self.commits.inplace_inflight > 0 {
            self.commits.deferred = true;
            return false;
        }
        self.commits.deferred = false;
        self.start_commit();
        true
    }

    /// Nothing is left for a clean stop's final commit to wait for.
    fn shutdown_quiet(&self) -> bool {
        self.reqs.is_empty()
            && self.destage.plans.is_empty()
            && self.patch.sets.is_empty()
            && !self.patch.direct_unflushed
            && self.patch.direct_cover_inflight == 0
    }

    /// During a clean stop, commits wait for its final one (asked for
    /// `asap`, taken once `shutdown_quiet`), unless a FLUSH or the policy
    /// needs one now. `Engine::poll_timeout` MUST NOT ask for a commit
    /// deadline then: one already due that `maybe_commit` refuses makes a
    /// driver spin (the VOPR's warm restarts found it: a write-back stop
    /// with a destage in flight).
    pub(super) fn stop_holds_commits(&self) -> bool {
        self.shutting_down
            && !(self.shutdown_quiet() && self.commits.asap)
            && self.commits.waiters.is_empty()
            && !self.policy.wants_commit()
    }

    fn start_commit(&mut self) {
        // This commit's device flush covers every in-place write completed
        // so far (an inline commit has none: it is not taken when there are).
        let overwrites = std::mem::take(&mut self.commits.unsynced_overwrites);
        let n = self.commits.next;
        self.commits.next += 1;
        self.policy.on_commit_start();
        let clean_shutdown =
            self.shutting_down && self.reqs.is_empty() && self.destage.plans.is_empty();
        if clean_shutdown || !self.shutting_down {
            self.commits.asap = false;
        }
        let snapshot = self.take_snapshot();
        self.commits.oldest_change = None;
        let mut record = CommitRecord {
            commit: n,
            next_seq: self.next_seq,
            clean_shutdown,
            ..Default::default()
        };
        self.policy.fill_commit(&mut record);
        let waiters = std::mem::take(&mut self.commits.waiters);
        let checked = self.checked_bytes(&snapshot);
        let inline = self.inline_ok
            && self.cfg.log_inline_bytes > 0
            && (!overwrites
                || crate::mutation::active(crate::mutation::Mutation::InlineIgnoresOverwrites))
            && checked <= self.cfg.log_inline_bytes;
        let log_len = LogRecord::bytes_for(snapshot.len(), if inline { checked } else { 0 });
        let fits = self.commits.log.pos + log_len <= self.layout.log_bytes
            && checked <= LOG_MAX_CHECKED_BYTES;
        let mut job = CommitJob {
            n,
            stage: CommitStage::DataFlush,
            snapshot,
            pages: Vec::new(),
            written: Vec::new(),
            ckpt_pages: Vec::new(),
            copy: 0,
            erase: false,
            waiters,
            left: 1,
            failed: false,
            record_tries: 0,
            record_wait: false,
            record,
            log: None,
            inline,
            inline_data: Vec::new(),
            log_len,
        };
        if fits && !self.commits.log.force_checkpoint && !clean_shutdown {
            self.start_log_commit(&mut job);
            self.commits.job = Some(job);
            if self.commits.job.as_ref().is_some_and(|j| j.left == 0) {
                self.on_commit_io(true);
            }
        } else {
            self.start_checkpoint(&mut job);
            job.erase = self.commits.log.record_unsure;
            if job.erase {
                job.left += 1;
            }
            self.commits.job = Some(job);
            self.emit(Dev::Cache, IoOp::Flush, None, IoCtx::Commit);
            if self.commits.log.record_unsure {
                self.erase_unsure_record();
            }
        }
    }

    /// Bytes a log record of `snapshot` would checksum: the versions it
    /// introduces (a sealed version in its slot is not checked again).
    fn checked_bytes(&self, snapshot: &[(u32, bool)]) -> u64 {
        snapshot
            .iter()
            .filter(|&&(s, valid)| {
                let slot = &self.table.slots[s as usize];
                valid && (!slot.disk_valid() || slot.unsealed())
            })
            .map(|&(s, _)| match self.partial.get(&s) {
                Some(&(lo, hi)) => u64::from(hi - lo),
                None => self.bs,
            })
            .sum()
    }

    /// Take the slots whose entries changed since the last commit: `(slot,
    /// valid)`, marked as part of the commit; their pages join the set the
    /// next checkpoint writes.
    fn take_snapshot(&mut self) -> Vec<(u32, bool)> {
        let mut snapshot = Vec::with_capacity(self.commits.meta_dirty.len());
        // Neighbouring slots share a page: insert each run's page once.
        let mut last_page = None;
        for s in std::mem::take(&mut self.commits.meta_dirty) {
            let slot = &mut self.table.slots[s as usize];
            slot.set_in_meta_dirty(false);
            // Free and Writing slots are written as free entries: the durable
            // state already says free for them, so they need no protection.
            // (An in-place overwrite of a durable version is also Writing, but
            // no commit starts while one is in flight.)
            assert!(
                slot.state != SlotState::Writing || !slot.disk_valid(),
                "commit snapshot of a durable slot under an in-place write"
            );
            if matches!(slot.state, SlotState::Valid | SlotState::Retired) {
                slot.set_in_snapshot(true);
            }
            snapshot.push((s, slot.state == SlotState::Valid));
            let page = s as u64 / layout::ENTRIES_PER_PAGE;
            if last_page != Some(page) {
                self.commits.log.pages.insert(page);
                last_page = Some(page);
            }
        }
        snapshot
    }

    /// The entry slot `s` has now, tagged with commit `tag`.
    fn entry_now(&self, s: u32, tag: u64) -> Entry {
        let slot = &self.table.slots[s as usize];
        if slot.state != SlotState::Valid {
            return Entry {
                commit: tag,
                ..Default::default()
            };
        }
        let (aux0, aux1) = if slot.dirty() {
            self.policy.entry_aux(self.group_of(s))
        } else {
            (0, 0)
        };
        let (lo, hi) = self.entry_range(s);
        Entry {
            lbn: self.lbn_of(s),
            seq: slot.seq,
            commit: tag,
            aux0,
            aux1,
            lo,
            hi,
            flags: F_VALID
                | if slot.dirty() { F_DIRTY } else { 0 }
                | if self.partial.contains_key(&s) {
                    F_PARTIAL
                } else {
                    0
                },
            data_crc: 0,
        }
    }

    fn start_log_commit(&mut self, job: &mut CommitJob<P>) {
        let n = job.n;
        let mut entries = Vec::with_capacity(job.snapshot.len());
        let mut sums: Vec<(u32, u64, u32)> = Vec::new();
        for &(s, valid) in &job.snapshot {
            let mut e = self.entry_now(s, n);
            debug_assert_eq!(valid, e.flags & F_VALID != 0);
            if valid {
                let slot = &mut self.table.slots[s as usize];
                if slot.disk_valid() && !slot.unsealed() {
                    // A sealed version in this slot: its bytes are as durable
                    // as any FLUSH promised, and may be rewritten in place.
                    e.flags |= F_NOCHECK;
                } else {
                    if !slot.unsealed() {
                        slot.set_unsealed(true);
                        let seq = slot.seq;
                        self.commits.log.note_unsealed(n, s, seq);
                    }
                    let (off, len) = self.layout.checked_bytes(s, &e);
                    if job.inline {
                        e.flags |= F_INLINE;
                    }
                    sums.push((entries.len() as u32, off, len));
                }
            }
            entries.push((s, e));
        }
        if job.inline {
            job.inline_data = vec![None; entries.len()];
        }
        job.log = Some(LogRecord {
            epoch: self.commits.log.epoch,
            n,
            sealed: self.commits.log.in_place,
            record: job.record,
            entries,
            data: Vec::new(),
        });
        job.stage = CommitStage::Checksums;
        job.left = sums.len() as u32;
        for (entry, offset, len) in sums {
            let op = if job.inline {
                IoOp::Read { offset, len }
            } else {
                IoOp::Checksum { offset, len }
            };
            self.emit(Dev::Cache, op, None, IoCtx::CommitChecksum { entry });
        }
    }

    fn start_checkpoint(&mut self, job: &mut CommitJob<P>) {
        let n = job.n;
        let pages: Vec<u64> = self.commits.log.pages.iter().collect();
        self.commits.log.pages.clear();
        // Shadow paging: every page changed since the last checkpoint is
        // written whole into the copy that is not durable. Slots outside the
        // snapshot are unchanged since the last durable commit, so their
        // in-memory state is their durable state.
        job.pages = pages
            .iter()
            .map(|&pg| {
                let copy = if self.commits.page_cur[pg as usize] == 0 {
                    1
                } else {
                    0
                };
                if !P::CARRIES_BYTES {
                    // The simulator's payload: only the page's length matters.
                    return (pg, copy, Vec::new());
                }
                let first = pg * layout::ENTRIES_PER_PAGE;
                let last = (first + layout::ENTRIES_PER_PAGE).min(self.layout.capacity);
                let entries: Vec<(u32, Entry)> = (first..last)
                    .map(|s| (s as u32, self.entry_now(s as u32, n)))
                    .collect();
                (pg, copy, layout::encode_page(pg, n, &entries))
            })
            .collect();
        job.written = job.pages.iter().map(|(p, c, _)| (*p, *c)).collect();
        job.ckpt_pages = pages;
        job.copy = 1 - self.commits.log.cr_cur;
        job.stage = CommitStage::DataFlush;
        job.left = 1;
    }

    pub(super) fn on_commit_checksum(&mut self, entry: u32, res: IoResult<P>) {
        let job = self
            .commits
            .job
            .as_mut()
            .expect("checksum without a commit");
        if let Ok(p) = res.as_ref() {
            let crc = if job.inline {
                // The version's bytes themselves, for the record's data area
                // (a model that keeps no bytes, the simulator's, has none:
                // it never encodes the record).
                let crc = p
                    .as_ref()
                    .and_then(|p| p.bytes())
                    .map_or(0, layout::data_crc);
                job.inline_data[entry as usize] = p.clone();
                crc
            } else {
                p.as_ref()
                    .and_then(|p| p.bytes())
                    .and_then(|b| b.get(0..4))
                    .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
                    .unwrap_or(0)
            };
            let log = job.log.as_mut().expect("checksum for a checkpoint");
            log.entries[entry as usize].1.data_crc = crc;
        }
        self.on_commit_io(res.is_ok());
    }

    pub(super) fn on_commit_io(&mut self, ok: bool) {
        let job = self
            .commits
            .job
            .as_mut()
            .expect("commit I/O without a commit");
        if !ok {
            job.failed = true;
        }
        job.left = job.left.saturating_sub(1);
        if job.left > 0 {
            return;
        }
        if job.failed && job.stage == CommitStage::Record && job.record_tries < RECORD_RETRIES {
            // A failed record write may still have reached the device whole
            // (a failing device can write a command and report an error), and
            // the pages it names are the copies the next checkpoint would
            // overwrite. So the job stays (its snapshot keeps protecting the
            // slots it names) and writes the same record again after
            // `retry_ns`: once that succeeds, this commit is the durable one.
            // The VOPR's torn failed writes found a checkpoint overwriting the
            // pages of a record that had landed.
            job.failed = false;
            job.record_tries += 1;
            job.record_wait = true;
            self.stats.commit_failures += 1;
            let at = self.now + self.cfg.retry_ns;
            self.retry_at = Some(self.retry_at.map_or(at, |r| r.min(at)));
            return;
        }
        if job.failed {
            if job.stage == CommitStage::Record {
                // Its record may have landed (`LogState::record_unsure`).
                self.commits.log.record_unsure = true;
            }
            return self.finish_commit(false);
        }
        match job.stage {
            CommitStage::DataFlush => {
                if job.erase {
                    // The copy is zeroes now: the durable record is in force.
                    self.commits.log.record_unsure = false;
                }
                job.stage = CommitStage::Pages;
                let pages = std::mem::take(&mut job.pages);
                if pages.is_empty() {
                    job.stage = CommitStage::MetaFlush;
                    job.left = 1;
                    return self.on_commit_io(true);
                }
                job.left = pages.len() as u32;
                for (pg, copy, buf) in pages {
                    let off = self.layout.page_offset(pg, copy);
                    let data = P::encoded(layout::PAGE_BYTES as usize, || buf);
                    self.cache_write(off, data, IoCtx::Commit);
                }
            }
            CommitStage::Pages => {
                job.stage = CommitStage::MetaFlush;
                job.left = 1;
                self.emit(Dev::Cache, IoOp::Flush, None, IoCtx::Commit);
            }
            CommitStage::MetaFlush => {
                job.stage = CommitStage::Record;
                self.write_commit_record();
            }
            CommitStage::Record | CommitStage::LogFlush => self.finish_commit(true),
            CommitStage::Checksums => {
                job.stage = CommitStage::LogWrite;
                job.left = 1;
                let len = job.log_len;
                let off = self.layout.log_offset + self.commits.log.pos;
                debug_assert!(self.commits.log.pos + len <= self.layout.log_bytes);
                if !job.inline {
                    let log = job.log.as_ref().expect("log commit");
                    let data = P::encoded(len as usize, || log.encode());
                    self.cache_write(off, data, IoCtx::Commit);
                    return;
                }
                // Inline: the data area is the versions' bytes in entry
                // order; the record is durable alone, with FUA.
                let parts = std::mem::take(&mut job.inline_data);
                let log = job.log.as_mut().expect("log commit");
                let data = P::encoded(len as usize, || {
                    log.data = parts
                        .iter()
                        .flatten()
                        .flat_map(|p| p.bytes().expect("bytes").iter().copied())
                        .collect();
                    log.encode()
                });
                self.emit(
                    Dev::Cache,
                    IoOp::Write {
                        offset: off,
                        data,
                        fua: true,
                    },
                    None,
                    IoCtx::Commit,
                );
            }
            CommitStage::LogWrite if job.inline => self.finish_commit(true),
            CommitStage::LogWrite => {
                job.stage = CommitStage::LogFlush;
                job.left = 1;
                self.emit(Dev::Cache, IoOp::Flush, None, IoCtx::Commit);
            }
        }
    }

    /// Write the checkpoint's commit record (FUA): its last step, or again
    /// after a failed attempt (`on_commit_io`).
    fn write_commit_record(&mut self) {
        let job = self.commits.job.as_mut().expect("no commit");
        debug_assert_eq!(job.stage, CommitStage::Record);
        job.left = 1;
        job.record_wait = false;
        let copy = job.copy;
        let data = P::encoded(512, || job.record.encode());
        self.put_record_copy(copy, data);
    }

    /// Write `data` (512 bytes) over commit-record copy `copy`, with FUA.
    fn put_record_copy(&mut self, copy: u8, data: P) {
        let offset = self.layout.commit_offset(u64::from(copy));
        self.emit(
            Dev::Cache,
            IoOp::Write {
                offset,
                data,
                fua: true,
            },
            None,
            IoCtx::Commit,
        );
    }

    /// Erase the commit-record copy a given-up checkpoint may have landed in
    /// (`LogState::record_unsure`), with FUA, beside the checkpoint's first
    /// device flush: both complete before a page is written. Zeroes decode as
    /// no record, as the second copy of a fresh format does, so the record
    /// in `cr_cur` is in force again. If the erase fails, the checkpoint
    /// fails before writing anything, and the next one erases again.
    fn erase_unsure_record(&mut self) {
        let data = P::encoded(512, || vec![0u8; 512]);
        self.put_record_copy(1 - self.commits.log.cr_cur, data);
    }

    /// A checkpoint whose record write failed writes it again once the
    /// retry is due (`Engine::handle_timeout`).
    pub(super) fn retry_commit_record(&mut self) {
        if self.commits.job.as_ref().is_some_and(|j| j.record_wait) {
            self.write_commit_record();
        }
    }

    /// Commits up to `upto` are sealed: their versions may change.
    fn advance_sealed(&mut self, upto: u64) {
        self.commits.log.sealed = self.commits.log.sealed.max(upto);
        while let Some(&(n, s, seq)) = self.commits.log.unsealed.front() {
            if n > self.commits.log.sealed {
                break;
            }
            self.commits.log.unsealed.pop_front();
            let slot = &mut self.table.slots[s as usize];
            if slot.seq == seq {
                slot.set_unsealed(false);
            }
        }
    }

    fn finish_commit(&mut self, ok: bool) {
        let job = self.commits.job.take().expect("no commit");
        if ok {
            // A clean stop's final record vouches from now on
            // (`Engine::stop_gave_up` reads it).
            self.commits.vouched = job.record.clean_shutdown;
        } else if self.commits.vouched {
            // The writes held for this commit fail with it, as a FLUSH
            // waiting for a failed commit does; a later write asks again.
            for rw in std::mem::take(&mut self.held) {
                self.reply(rw.id, Err(ReqError::Io), 0);
            }
        }
        if ok {
            self.commits.durable = job.n;
            self.stats.commits += 1;
            if let Some(rec) = &job.log {
                self.stats.log_commits += 1;
                self.commits.log.pos += job.log_len;
                if job.inline {
                    self.stats.inline_commits += 1;
                } else {
                    // Its device flush made every named version's bytes
                    // durable in place, this commit's and earlier ones'.
                    self.commits.log.in_place = job.n;
                }
                self.advance_sealed(rec.sealed);
            } else {
                for &(pg, copy) in &job.written {
                    self.commits.page_cur[pg as usize] = copy;
                }
                self.commits.log.cr_cur = job.copy;
                self.commits.log.epoch = job.n;
                self.commits.log.pos = 0;
                self.commits.log.force_checkpoint = false;
                self.commits.log.in_place = job.n;
                self.advance_sealed(job.n);
            }
        } else {
            self.stats.commit_failures += 1;
            if self.shutting_down && self.stop_tries > 0 && self.retry_at.is_none() {
                // A clean stop tries again (`Engine::start_shutdown`).
                self.retry_at = Some(self.now + self.cfg.retry_ns);
            }
            // Its device flush may not have covered the in-place writes.
            self.commits.unsynced_overwrites = true;
            // What reached the device is unknown: the log's tail, or which
            // commit record is in force. Only a checkpoint settles it.
            self.commits.log.force_checkpoint = true;
            for &pg in &job.ckpt_pages {
                self.commits.log.pages.insert(pg);
            }
        }
        for (s, valid) in job.snapshot {
            let slot = &mut self.table.slots[s as usize];
            let marked = slot.in_snapshot();
            slot.set_in_snapshot(false);
            let was = slot.disk_valid();
            if !marked {
                // Written as free over a free entry: nothing changed on disk.
                continue;
            }
            if ok {
                slot.set_disk_valid(valid);
            } else {
                // Unknown: the entry may or may not have reached the device.
                slot.set_disk_valid(was || valid);
                self.mark_meta(s);
            }
            let slot = &self.table.slots[s as usize];
            if slot.state == SlotState::Retired && !slot.disk_valid() && (was || ok) {
                if self.table.slots[s as usize].take_reclaim() {
                    self.table.retired_pending = (self.table.retired_pending.checked_sub(1))
                        .expect("retired_pending counts every slot marked reclaim");
                }
                self.try_release(s);
            }
        }
        self.policy.on_commit_done(ok);
        self.out_event
            .push_back(Event::Committed { commit: job.n, ok });
        for w in job.waiters {
            if ok {
                if w.write && w.group != NO_GROUP {
                    self.policy.on_write_ack(self.now, w.group);
                }
                self.reply(w.id, Ok(None), w.seq);
            } else {
                self.reply(w.id, Err(ReqError::Io), w.seq);
            }
        }
    }
}

/// Commit state: what the next commit must write, the commit in flight,
/// the log, and the requests waiting for a durable commit.
pub(super) struct CommitState<P> {
    /// Slots whose entries changed since the last commit.
    pub(super) meta_dirty: Vec<u32>,
    /// Which copy (0 or 1) of each metadata page is durable; 2 = neither.
    pub(super) page_cur: Vec<u8>,
    /// In-place data writes in flight (a commit waits for them).
    pub(super) inplace_inflight: u32,
    /// A commit is due but waits for in-place writes to finish.
    pub(super) deferred: bool,
    /// In-place overwrites of durable versions completed since the last
    /// commit started: their bytes need that commit's device flush, though
    /// no entry changed (so a FLUSH cannot be answered at once).
    pub(super) unsynced_overwrites: bool,
    /// When the oldest change not yet committed was made.
    pub(super) oldest_change: Option<u64>,
    /// The commit in flight.
    pub(super) job: Option<CommitJob<P>>,
    /// The metadata log and checkpoints (see the module docs).
    pub(super) log: LogState,
    /// Requests waiting for a durable commit.
    pub(super) waiters: Vec<Waiter>,
    /// Start a commit as soon as possible.
    pub(super) asap: bool,
    /// The durable commit record says the cache was shut down cleanly.
    /// Such a record vouches for every clean copy it names: recovery keeps
    /// them (a warm restart). A write acknowledged while it is still the
    /// durable record could leave a clean copy older than the backing
    /// store's bytes (write-through's writes, write-back's bypassed FUA
    /// writes), and a crash would bring that copy back. So writes are held
    /// (`Engine::held`) until a commit recording a running cache is durable.
    pub(super) vouched: bool,
    /// Number of the next commit, and of the last durable one.
    pub(super) next: u64,
    pub(super) durable: u64,
}

impl<P> CommitState<P> {
    pub(super) fn new(pages: usize) -> Self {
        CommitState {
            meta_dirty: Vec::new(),
            page_cur: vec![2; pages],
            inplace_inflight: 0,
            deferred: false,
            unsynced_overwrites: false,
            oldest_change: None,
            job: None,
            log: LogState::fresh(),
            waiters: Vec::new(),
            asap: false,
            vouched: false,
            next: 1,
            durable: 0,
        }
    }
}
