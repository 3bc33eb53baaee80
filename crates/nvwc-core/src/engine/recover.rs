//! Recovery: open an existing cache device from its checkpoint and replay
//! the metadata log after it (`docs/ON-DISK-FORMAT.md`, "Recovery").

use super::*;

/// Recovery's write into the cache device (`Engine::recover`'s `repair`):
/// `bytes` at `offset`, or why it failed.
pub type RepairFn<'a> = dyn FnMut(u64, &[u8]) -> Result<(), String> + 'a;

/// What recovery found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub commit: u64,
    pub clean_shutdown: bool,
    pub dirty_versions: u64,
    pub clean_versions: u64,
    pub discarded: u64,
    pub ignored_uncommitted: u64,
    /// Log records replayed after the checkpoint, and valid-looking ones
    /// left out (from the first whose data did not match its checksums).
    pub log_records: u64,
    pub log_dropped: u64,
    /// Versions of unsealed inline records written into their slots.
    pub inline_repairs: u64,
}

/// The metadata regions of a cache device, read by the driver for recovery.
#[derive(Clone, Debug, Default)]
pub struct CacheImage {
    /// 512 bytes at offset 0.
    pub superblock: Vec<u8>,
    /// 512 bytes at each commit record offset.
    pub commit_a: Vec<u8>,
    pub commit_b: Vec<u8>,
    /// The slot table: `Layout::table_bytes` bytes at `layout::TABLE_OFFSET`.
    pub table: Vec<u8>,
    /// The metadata log: `Layout::log_bytes` bytes at `Layout::log_offset`.
    pub log: Vec<u8>,
}

/// Errors opening an existing cache device. The message includes the
/// inner error's, so it is not also given as a `source` (a chain printed
/// whole would repeat it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecoverError {
    #[error("invalid configuration: {0}")]
    Config(ConfigError),
    #[error("cache device metadata: {0}")]
    Format(FormatError),
    #[error("reading cache data to check the log: {0}")]
    Read(String),
    #[error("writing an inline log record's data into its slot: {0}")]
    Repair(String),
}

impl From<ConfigError> for RecoverError {
    fn from(e: ConfigError) -> Self {
        RecoverError::Config(e)
    }
}

impl From<FormatError> for RecoverError {
    fn from(e: FormatError) -> Self {
        RecoverError::Format(e)
    }
}

impl<P: Payload> Engine<P> {
    /// Open an existing cache device from its metadata regions.
    ///
    /// `data_crc(offset, len)` MUST return the CRC-32C ([`layout::data_crc`])
    /// of the cache device's bytes at `offset..offset + len`: recovery
    /// checks the data that the log's unsealed records name (a few blocks).
    /// `repair(offset, bytes)` MUST write `bytes` at `offset` of the cache
    /// device before the engine's first command runs (no flush needed: the
    /// first commit is a checkpoint, whose first step is a device flush, and
    /// until it is durable the log is still there to repair from): recovery
    /// puts an unsealed inline record's versions into their slots.
    pub fn recover(
        cfg: Config,
        image: &CacheImage,
        data_crc: &mut dyn FnMut(u64, u32) -> Result<u32, String>,
        repair: &mut RepairFn<'_>,
    ) -> Result<(Self, RecoveryReport), RecoverError> {
        cfg.validate()?;
        let sb = layout::Superblock::decode(&image.superblock)?;
        layout::check_superblock(&sb, &cfg)?;
        let (ckpt, cr_cur) = latest_commit_record(image)?;
        let mut e = Self::build(cfg);
        e.partial_ok = sb.version >= 2;
        e.inline_ok = sb.version >= 4;
        let l = e.layout;
        if (image.table.len() as u64) < l.table_bytes || (image.log.len() as u64) < l.log_bytes {
            return Err(FormatError::Short.into());
        }
        let mut report = RecoveryReport {
            commit: ckpt.commit,
            clean_shutdown: ckpt.clean_shutdown,
            ..Default::default()
        };
        let mut found = e.read_checkpoint(image, &ckpt, &mut report);
        let replay = replay_log(&l, &image.log, &ckpt, data_crc)?;
        report.inline_repairs = repair_inline(&l, &replay, repair)?;
        e.commits.log = LogState::recovered(ckpt.commit, cr_cur);
        let mut rec = ckpt;
        for r in &replay.accepted {
            for &(s, ent) in &r.entries {
                found.table[s as usize] = Some(ent);
                e.commits
                    .log
                    .page_changed(s as u64 / layout::ENTRIES_PER_PAGE);
            }
            rec = r.record;
        }
        let max_tag = found.max_tag.max(replay.max_n);
        report.log_records = replay.accepted.len() as u64;
        report.log_dropped = replay.dropped.len() as u64;
        if !replay.accepted.is_empty() {
            report.commit = rec.commit;
            report.clean_shutdown = false;
        }
        let (mut versions, stale, mut max_seq) = e.collect_versions(&found.table);
        // Versions named only by dropped records: sequence numbers stay above them.
        for r in &replay.dropped {
            for (_, ent) in &r.entries {
                if ent.flags & F_VALID != 0 {
                    max_seq = max_seq.max(ent.seq);
                }
            }
        }
        let any_dirty = versions.iter().any(|v| v.dirty);
        if any_dirty && sb.write_policy != e.cfg.write_policy.code() {
            return Err(FormatError::Policy {
                found: layout::policy_name(sb.write_policy),
            }
            .into());
        }
        for i in newest_of(&versions, |_| true) {
            versions[i].latest = true;
        }
        e.policy.recover(&rec, &mut versions);
        let mut used = e.install_recovered(&versions, &mut report);
        // Slots whose entries recovery drops stay unused until a commit has
        // written them free: stale entries, and the slots a dropped log
        // record names (new data there could make that record's checksums
        // match at a second recovery, bringing back writes this recovery
        // left out).
        let dropped = replay
            .dropped
            .iter()
            .flat_map(|r| r.entries.iter().map(|&(s, _)| s));
        for s in stale.into_iter().chain(dropped) {
            if used[s as usize] {
                continue;
            }
            used[s as usize] = true;
            let slot = &mut e.table.slots[s as usize];
            slot.state = SlotState::Retired;
            slot.set_disk_valid(true);
            slot.set_reclaim(true);
            e.table.retired_pending += 1;
            e.mark_meta(s);
        }
        for s in (0..l.capacity as u32).rev() {
            if !used[s as usize] {
                e.table.free.push(s);
            }
        }
        for pg in found.rewrite_pages {
            let s = (pg * layout::ENTRIES_PER_PAGE) as u32;
            e.mark_meta(s);
        }
        e.commits.next = max_tag + 1;
        e.commits.durable = rec.commit;
        e.next_seq = rec.next_seq.max(max_seq + 1);
        e.unseal_recovered();
        e.commits.asap = !e.commits.meta_dirty.is_empty() || !replay.accepted.is_empty();
        if report.clean_shutdown
            && !crate::mutation::active(crate::mutation::Mutation::WarmRestartUnvouched)
        {
            // A warm restart: the first commit records a running cache
            // before any write is acknowledged (`CommitState::vouched`).
            e.commits.vouched = true;
            e.commits.asap = true;
        }
        Ok((e, report))
    }

    /// Read the checkpoint's slot table: for each page the copy with the
    /// highest tag not above the checkpoint (recorded in `page_cur`).
    fn read_checkpoint(
        &mut self,
        image: &CacheImage,
        ckpt: &CommitRecord,
        report: &mut RecoveryReport,
    ) -> CheckpointTable {
        let l = self.layout;
        let page = layout::PAGE_BYTES as usize;
        let mut max_tag = ckpt.commit;
        let mut rewrite_pages: Vec<u64> = Vec::new();
        let mut chosen: Vec<Option<usize>> = vec![None; l.pages() as usize];
        for pg in 0..l.pages() {
            let mut best: Option<(u64, u8)> = None;
            for c in 0..2u8 {
                let at = (2 * pg + c as u64) as usize * page;
                let Some(tag) = layout::page_tag(pg, &image.table[at..at + page]) else {
                    continue;
                };
                max_tag = max_tag.max(tag);
                if tag > ckpt.commit {
                    // Written by a commit that never completed: ignored, and
                    // rewritten before any later commit could make its tag valid.
                    report.ignored_uncommitted += 1;
                    rewrite_pages.push(pg);
                    continue;
                }
                if best.is_none_or(|b| tag > b.0) {
                    best = Some((tag, c));
                }
            }
            if let Some((_, c)) = best {
                self.commits.page_cur[pg as usize] = c;
                chosen[pg as usize] = Some((2 * pg + c as u64) as usize * page);
            }
        }
        let table = (0..l.capacity as u32)
            .map(|s| {
                let pg = s as u64 / layout::ENTRIES_PER_PAGE;
                let base = chosen[pg as usize]?;
                let at = base + 64 + (s as u64 % layout::ENTRIES_PER_PAGE) as usize * 64;
                Entry::decode(s, &image.table[at..at + 64])
            })
            .collect();
        CheckpointTable {
            table,
            max_tag,
            rewrite_pages,
        }
    }

    /// The valid entries of `table` as versions for the write policy, the
    /// slots of entries past the backing store's end (stale), and the
    /// highest sequence number.
    fn collect_versions(&self, table: &[Option<Entry>]) -> (Vec<RecoveredVersion>, Vec<u32>, u64) {
        let mut versions = Vec::new();
        let mut stale = Vec::new();
        let mut max_seq = 0u64;
        for (s, ent) in table.iter().enumerate() {
            let s = s as u32;
            let Some(ent) = *ent else {
                continue;
            };
            if ent.flags & F_VALID == 0 {
                continue;
            }
            if ent.lbn >= self.cfg.backing_blocks() {
                stale.push(s);
                continue;
            }
            max_seq = max_seq.max(ent.seq);
            versions.push(RecoveredVersion {
                slot: s,
                lbn: ent.lbn,
                seq: ent.seq,
                aux0: ent.aux0,
                aux1: ent.aux1,
                lo: ent.lo,
                hi: ent.hi,
                dirty: ent.flags & F_DIRTY != 0,
                partial: ent.flags & F_PARTIAL != 0,
                latest: false,
                group: NO_GROUP,
                discard: false,
                clean: false,
            });
        }
        (versions, stale, max_seq)
    }

    /// Install the versions the write policy kept: slots, blocks, the
    /// replacement policy and the dirty count. Returns which slots hold a
    /// version (kept, or retired until a commit frees its entry).
    fn install_recovered(
        &mut self,
        versions: &[RecoveredVersion],
        report: &mut RecoveryReport,
    ) -> Vec<bool> {
        // A discarded latest version hands "latest" to the newest survivor.
        let mut survivor = vec![false; versions.len()];
        for i in newest_of(versions, |v| !v.discard) {
            survivor[i] = true;
        }
        self.table.free.clear();
        let mut used = vec![false; self.layout.capacity as usize];
        for (i, v) in versions.iter().enumerate() {
            let s = v.slot;
            used[s as usize] = true;
            let is_latest = survivor[i];
            let dirty = v.dirty && !v.clean;
            let keep = !v.discard && (is_latest || dirty);
            self.set_range(s, (v.lo, v.hi));
            let slot = &mut self.table.slots[s as usize];
            slot.seq = v.seq;
            slot.set_disk_valid(true);
            if !keep {
                slot.state = SlotState::Retired;
                slot.set_reclaim(true);
                self.table.retired_pending += 1;
                report.discarded += 1;
                self.mark_meta(s);
                continue;
            }
            slot.state = SlotState::Valid;
            slot.set_dirty(dirty);
            if v.partial {
                assert!(
                    v.lo < v.hi && v.hi as u64 <= self.bs,
                    "partial entry with a bad range"
                );
                self.partial.insert(s, (v.lo, v.hi));
            }
            self.set_group(s, if dirty { v.group } else { NO_GROUP });
            if dirty {
                self.table.dirty += 1;
                report.dirty_versions += 1;
                // The policy registered the version with its group in `recover`.
                // A version whose entry no longer says what the policy made
                // of it (journaled: an uncommitted transaction merged into
                // the open one) gets its entry rewritten at the next commit:
                // a stale transaction id left on a page no other change
                // rewrote would later read as a committed, even checkpointed,
                // transaction (the VOPR's second crash on a large cache found
                // it: journaled-hints seed 224).
                if self.policy.entry_aux(v.group) != (v.aux0, v.aux1) {
                    self.mark_meta(s);
                }
            } else {
                report.clean_versions += 1;
                if v.dirty {
                    self.mark_meta(s);
                }
            }
            self.attach_recovered(s, v.lbn, is_latest, dirty);
        }
        used
    }

    /// Put recovered slot `s` on its block: as the latest version (which
    /// the replacement policy tracks) or as a shadow.
    fn attach_recovered(&mut self, s: u32, lbn: u64, latest: bool, dirty: bool) {
        let b = self.block_for(lbn);
        self.table.slots[s as usize].block = b;
        if !latest {
            self.table.slots[s as usize].set_shadow(true);
            self.map.blocks[b as usize].shadows += 1;
            return;
        }
        self.map.blocks[b as usize].latest = s;
        self.track_block(b, lbn, dirty);
    }

    /// The first commit after recovery is a checkpoint; until it is durable
    /// the recovered versions count as unsealed (an unsealed record among
    /// them is checked again if the device crashes before it).
    fn unseal_recovered(&mut self) {
        for s in 0..self.layout.capacity as u32 {
            let slot = &mut self.table.slots[s as usize];
            if slot.state == SlotState::Valid {
                slot.set_unsealed(true);
                let seq = slot.seq;
                self.commits.log.note_unsealed(self.commits.next, s, seq);
            }
        }
    }
}

/// The newer of the two commit records (the checkpoint), and its copy.
fn latest_commit_record(image: &CacheImage) -> Result<(CommitRecord, u8), RecoverError> {
    let ra = CommitRecord::decode(&image.commit_a);
    let rb = CommitRecord::decode(&image.commit_b);
    match (ra, rb) {
        (Some(a), Some(b)) if a.commit >= b.commit => Ok((a, 0)),
        (Some(_), Some(b)) => Ok((b, 1)),
        (Some(a), None) => Ok((a, 0)),
        (None, Some(b)) => Ok((b, 1)),
        (None, None) => Err(FormatError::NoCommit.into()),
    }
}

/// The index of the newest (highest sequence number, first on a tie)
/// version of each block among those `eligible` picks, in no order.
fn newest_of(
    versions: &[RecoveredVersion],
    eligible: impl Fn(&RecoveredVersion) -> bool,
) -> Vec<usize> {
    let mut newest: HashMap<u64, (u64, usize)> = HashMap::new();
    for (i, v) in versions.iter().enumerate() {
        if eligible(v) {
            let n = newest.entry(v.lbn).or_insert((v.seq, i));
            if v.seq > n.0 {
                *n = (v.seq, i);
            }
        }
    }
    newest.values().map(|&(_, i)| i).collect()
}

/// The slot table a checkpoint holds (`Engine::read_checkpoint`).
struct CheckpointTable {
    table: Vec<Option<Entry>>,
    /// Highest page tag seen (a commit number), valid or not.
    max_tag: u64,
    /// Pages with a copy newer than the checkpoint: rewritten at the next commit.
    rewrite_pages: Vec<u64>,
}

/// The log records recovery found after the checkpoint.
struct Replay {
    /// Records whose data checks passed (or that are sealed), in order.
    accepted: Vec<layout::LogRecord>,
    /// Highest `sealed` the records carry (at least the checkpoint's number).
    sealed: u64,
    /// Valid records from the first whose data did not match on.
    dropped: Vec<layout::LogRecord>,
    /// Highest record number seen.
    max_n: u64,
}

/// Read the log that extends checkpoint `ckpt`: consecutive records of its
/// epoch from the region's start, to the first invalid one. Records past
/// the highest `sealed` any of them carries are checked against their data
/// (entries without `F_NOCHECK`), and the first mismatch drops that record
/// and every later one (`docs/ON-DISK-FORMAT.md`, "Recovery").
fn replay_log(
    l: &Layout,
    log: &[u8],
    ckpt: &CommitRecord,
    data_crc: &mut dyn FnMut(u64, u32) -> Result<u32, String>,
) -> Result<Replay, RecoverError> {
    let mut found = Vec::new();
    let mut pos = 0u64;
    let mut want = ckpt.commit + 1;
    while pos < l.log_bytes {
        let Some((r, len)) =
            layout::LogRecord::decode(&log[pos as usize..l.log_bytes as usize], l.block_size)
        else {
            break;
        };
        if r.epoch != ckpt.commit
            || r.n != want
            || r.entries.iter().any(|&(s, _)| s as u64 >= l.capacity)
        {
            break;
        }
        found.push(r);
        pos += len;
        want += 1;
    }
    let max_n = found.last().map_or(0, |r| r.n);
    let sealed = found
        .iter()
        .map(|r| r.sealed)
        .max()
        .unwrap_or(0)
        .max(ckpt.commit);
    let mut cut = found.len();
    'records: for (i, r) in found.iter().enumerate() {
        if r.n <= sealed || crate::mutation::active(crate::mutation::Mutation::LogSkipsDataCheck) {
            continue;
        }
        for (s, ent) in &r.entries {
            // An inline entry's bytes are in the record (checked at decode).
            if ent.flags & F_VALID == 0 || ent.flags & (layout::F_NOCHECK | layout::F_INLINE) != 0 {
                continue;
            }
            let (off, len) = l.checked_bytes(*s, ent);
            if data_crc(off, len).map_err(RecoverError::Read)? != ent.data_crc {
                cut = i;
                break 'records;
            }
        }
    }
    let dropped = found.split_off(cut);
    Ok(Replay {
        accepted: found,
        sealed,
        dropped,
        max_n,
    })
}

/// Write the versions of the unsealed inline records recovery accepted
/// into their slots: a version's slot was written but maybe never flushed
/// (an inline commit flushes nothing but its record). Only where the entry
/// is the last that the accepted records give its slot: a later record
/// naming the slot (which freed it, and maybe reused it for newer data)
/// has the final word. Sealed records' versions are durable in place, and
/// may have been rewritten in place since. Returns the versions written.
fn repair_inline(
    l: &Layout,
    replay: &Replay,
    repair: &mut RepairFn<'_>,
) -> Result<u64, RecoverError> {
    let mut last: HashMap<u32, usize> = HashMap::new();
    for (i, r) in replay.accepted.iter().enumerate() {
        for &(s, _) in &r.entries {
            last.insert(s, i);
        }
    }
    let superseded_too =
        crate::mutation::active(crate::mutation::Mutation::InlineRepairsSuperseded);
    let mut n = 0;
    for (i, r) in replay.accepted.iter().enumerate() {
        if r.n <= replay.sealed
            || crate::mutation::active(crate::mutation::Mutation::InlineSkipsRepair)
        {
            continue;
        }
        for (s, ent, bytes) in r.inline(l.block_size) {
            if last[&s] != i && !superseded_too {
                continue;
            }
            let (off, len) = l.checked_bytes(s, ent);
            debug_assert_eq!(len as usize, bytes.len());
            repair(off, bytes).map_err(RecoverError::Repair)?;
            n += 1;
        }
    }
    Ok(n)
}
