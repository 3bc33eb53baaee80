//! Journaled write-back (write-policy paper §3.2), and `journaled-hints`.
//!
//! Writes join the *current transaction*; a second write to a block in the same
//! transaction replaces the first (coalescing: one copy per block per
//! transaction). The transaction closes when it reaches `txn_max_blocks`
//! blocks or `txn_max_age_ns` age (`journaled`), or only at consistency
//! points, a client FLUSH or an explicit checkpoint request
//! (`journaled-hints`). Once every write of a closed transaction has reached
//! the cache, a metadata commit makes it *committed*: its slot entries, each
//! tagged with the transaction id and naming the block's backing address,
//! together with the commit record's `txn_committed` field, are the commit
//! marker. Several committed transactions may wait; a background checkpoint
//! copies the oldest ones to the backing store as one atomic group (begin,
//! blocks, end), and a further commit records `txn_checkpointed`.
//!
//! **Dual staleness control (§3.2.3).** With the cache intact, what is lost at
//! a crash is bounded by how often transactions commit (size and age; and
//! every FLUSH commits the open transaction's entries too). With the cache
//! lost, the backing store is as stale as the last checkpoint:
//! `checkpoint_delay_ns` holds committed transactions back (and lets
//! `checkpoint_merge_max` consecutive ones coalesce into one group), trading
//! staleness for fewer backing writes.
//!
//! **Liveness.** A transaction cannot be checkpointed while it is open, so an
//! open transaction that fills the cache would deadlock. The effective size
//! limit is therefore at most a quarter of the cache, and under `journaled-hints`
//! a transaction is closed early when writers stall for space with nothing else
//! to checkpoint; such closes are reported (`forced`) and counted, because at
//! that point the backing store's states are no longer all flush-aligned.

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::{Group, Plan, PlanCtx, PolicyEvent, RecoveredVersion, WritePolicy};
use crate::config::{Config, JournalConfig, WritePolicyKind};
use crate::layout::CommitRecord;

const NONE: u64 = u64::MAX;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum TxnState {
    Open,
    Sealed,
    Committing,
    Committed { at: u64 },
    Checkpointing,
}

#[derive(Debug)]
struct Txn {
    id: u64,
    state: TxnState,
    /// slot -> (lbn, seq)
    slots: HashMap<u32, (u64, u64)>,
    inflight: u32,
    first_seq: u64,
    last_seq: u64,
    opened_at: Option<u64>,
}

impl Txn {
    fn new(id: u64) -> Self {
        Txn {
            id,
            state: TxnState::Open,
            slots: HashMap::new(),
            inflight: 0,
            first_seq: 0,
            last_seq: 0,
            opened_at: None,
        }
    }
}

/// See the module docs.
pub struct Journaled {
    hints: bool,
    cfg: JournalConfig,
    max_blocks: usize,
    txns: VecDeque<Txn>,
    committed_upto: u64,
    checkpointed_upto: u64,
    committing_upto: Option<u64>,
    ckpt_in_flight: bool,
    awaiting_commit: bool,
    commit_for_ckpt: bool,
    /// A write waits for room in the bounded journal (`journal_wait`).
    journal_full: bool,
    now: u64,
    events: VecDeque<PolicyEvent>,
    /// Statistics.
    pub forced_closes: u64,
    pub txns_closed: u64,
    pub checkpoints: u64,
}

impl Journaled {
    pub fn new(cfg: &Config) -> Self {
        let max_blocks =
            (cfg.journal.txn_max_blocks as u64).min((cfg.capacity_blocks / 4).max(1)) as usize;
        let mut txns = VecDeque::new();
        txns.push_back(Txn::new(1));
        Journaled {
            hints: cfg.write_policy == WritePolicyKind::JournaledHints,
            cfg: cfg.journal,
            max_blocks,
            txns,
            committed_upto: 0,
            checkpointed_upto: 0,
            committing_upto: None,
            ckpt_in_flight: false,
            awaiting_commit: false,
            commit_for_ckpt: false,
            journal_full: false,
            now: 0,
            events: VecDeque::new(),
            forced_closes: 0,
            txns_closed: 0,
            checkpoints: 0,
        }
    }

    fn txn(&mut self, id: u64) -> Option<&mut Txn> {
        let first = self.txns.front()?.id;
        let i = id.checked_sub(first)? as usize;
        self.txns.get_mut(i)
    }

    fn open(&mut self) -> &mut Txn {
        let t = self
            .txns
            .back_mut()
            .expect("there is always an open transaction");
        debug_assert_eq!(t.state, TxnState::Open);
        t
    }

    /// Close the open transaction (if it holds anything) and open the next.
    fn seal(&mut self, forced: bool) {
        let t = self.open();
        if t.slots.is_empty() && t.inflight == 0 {
            return;
        }
        t.state = TxnState::Sealed;
        let ev = PolicyEvent::TxnClosed {
            txn: t.id,
            first_seq: t.first_seq,
            last_seq: t.last_seq,
            forced,
        };
        let next = t.id + 1;
        self.txns.push_back(Txn::new(next));
        self.events.push_back(ev);
        self.txns_closed += 1;
        if forced {
            self.forced_closes += 1;
        }
    }

    /// Sealed transactions, in order from the oldest uncommitted one, whose writes all reached the cache.
    fn ready_to_commit(&self) -> Option<u64> {
        let mut upto = None;
        for t in &self.txns {
            if t.id <= self.committed_upto {
                continue;
            }
            if t.state == TxnState::Sealed && t.inflight == 0 {
                upto = Some(t.id);
            } else {
                break;
            }
        }
        upto
    }
}

impl WritePolicy for Journaled {
    /// The journal is empty: every transaction before the open one is
    /// checkpointed (and gone), no checkpoint or commit is in flight, and the
    /// open transaction has never had a write (so its sequence range starts
    /// after a write that bypasses now). The engine then lets a rejected
    /// write bypass as a transaction of its own (`Engine::journal_bypass_ok`).
    fn bypass_ok(&self) -> bool {
        !self.ckpt_in_flight
            && !self.awaiting_commit
            && self.committing_upto.is_none()
            && self.txns.len() == 1
            && self.txns.front().is_some_and(|t| {
                t.state == TxnState::Open
                    && t.first_seq == 0
                    && t.inflight == 0
                    && t.slots.is_empty()
            })
    }
    fn kind(&self) -> WritePolicyKind {
        if self.hints {
            WritePolicyKind::JournaledHints
        } else {
            WritePolicyKind::Journaled
        }
    }
    fn on_write_issue(&mut self, now: u64, seq: u64) -> Group {
        self.now = now;
        let t = self.open();
        t.inflight += 1;
        if t.first_seq == 0 {
            t.first_seq = seq;
        }
        t.last_seq = seq;
        if t.opened_at.is_none() {
            t.opened_at = Some(now);
        }
        t.id
    }
    fn on_write_data_done(&mut self, _now: u64, group: Group) {
        let t = self.txn(group).expect("write of an unknown transaction");
        assert!(t.inflight > 0);
        t.inflight -= 1;
    }
    /// A patch counts as a write in flight: its transaction cannot commit
    /// (and so no later one can) until the patch is a version.
    fn on_patch_pending(&mut self, group: Group) {
        let t = self.txn(group).expect("patch of an unknown transaction");
        t.inflight += 1;
    }
    fn on_patch_done(&mut self, group: Group) {
        let t = self.txn(group).expect("patch of an unknown transaction");
        assert!(t.inflight > 0);
        t.inflight -= 1;
    }
    fn on_version_installed(&mut self, group: Group, slot: u32, lbn: u64, seq: u64) {
        let max = self.max_blocks;
        let hints = self.hints;
        let t = self.txn(group).expect("version of an unknown transaction");
        assert!(
            matches!(t.state, TxnState::Open | TxnState::Sealed),
            "version installed into a closed transaction"
        );
        t.slots.insert(slot, (lbn, seq));
        if !hints && t.state == TxnState::Open && t.slots.len() >= max {
            self.seal(false);
        }
    }
    fn on_version_removed(&mut self, group: Group, slot: u32) {
        if let Some(t) = self.txn(group) {
            t.slots.remove(&slot);
        }
    }
    fn keep_superseded(&self, old: Group, new: Group) -> bool {
        old != NONE && old != new
    }
    /// As in ordered: a commit must not make a later write durable while an
    /// earlier acknowledged write is only a patch in RAM. Transactions keep
    /// such a patch off the backing store before a crash, but after one,
    /// recovery merges the open transactions and checkpoints what the cache
    /// kept: the later write without the earlier one, which no point in time
    /// allows (found by the VOPR's drain-after-recovery check).
    fn commit_needs_patches_done(&self) -> bool {
        true
    }
    /// Never: a rewrite goes to a fresh slot, even within the open
    /// transaction. An in-place rewrite that fails part-way (a torn write, an
    /// EIO after some sectors) would leave the acknowledged version it
    /// overwrote a mix of two writes, and the next checkpoint would put that
    /// mix on the backing store, which no point in time holds (the live crash
    /// test found it; `tests/write_policies.rs`,
    /// `a_torn_cache_write_damages_no_kept_version`). Out of place, a failed
    /// write loses only itself. The superseded slot of the same transaction
    /// is freed when the new version is installed (`keep_superseded`).
    fn may_overwrite(&self, _old: Group, _new: Group) -> bool {
        false
    }
    fn journal_wait(&mut self, waiting: bool) {
        self.journal_full = waiting;
    }
    fn on_consistency_point(&mut self, now: u64, explicit: bool) {
        self.now = now;
        if self.hints || explicit {
            self.seal(false);
        }
    }
    fn next_plan(&mut self, ctx: &mut dyn PlanCtx) -> Option<Plan> {
        self.now = ctx.now();
        if self.ckpt_in_flight || self.awaiting_commit {
            return None;
        }
        let first = self.checkpointed_upto + 1;
        let committed_first = self.txn(first).map(|t| t.state);
        // Writers wait for slots, or for room in the bounded journal.
        let pressure = ctx.space_pressure() || self.journal_full;
        let Some(TxnState::Committed { at }) = committed_first else {
            // Nothing to checkpoint. If writers stall and the open transaction
            // holds blocks, close it so it can commit and be checkpointed.
            if pressure && self.ready_to_commit().is_none() && self.committing_upto.is_none() {
                let open_nonempty = self
                    .txns
                    .back()
                    .map(|t| !t.slots.is_empty())
                    .unwrap_or(false);
                let only_open = self
                    .txns
                    .iter()
                    .all(|t| t.state == TxnState::Open || t.id <= self.checkpointed_upto);
                if open_nonempty && only_open {
                    self.seal(self.hints);
                }
            }
            return None;
        };
        if self.now < at.saturating_add(self.cfg.checkpoint_delay_ns) && !pressure {
            return None;
        }
        let mut last = first;
        let mut map: BTreeMap<u64, (u64, u32)> = BTreeMap::new();
        let mut drop = Vec::new();
        let merge = self.cfg.checkpoint_merge_max as u64;
        let mut id = first;
        while id < first + merge {
            let now = self.now;
            // A full journal takes every committed transaction it may merge.
            let delay = if self.journal_full {
                0
            } else {
                self.cfg.checkpoint_delay_ns
            };
            match self.txn(id) {
                Some(t) if matches!(t.state, TxnState::Committed { at } if id == first || now >= at.saturating_add(delay)) =>
                {
                    t.state = TxnState::Checkpointing;
                    for (&slot, &(lbn, seq)) in &t.slots {
                        match map.get(&lbn) {
                            Some(&(s0, _)) if s0 > seq => drop.push(slot),
                            Some(&(_, old)) => {
                                drop.push(old);
                                map.insert(lbn, (seq, slot));
                            }
                            None => {
                                map.insert(lbn, (seq, slot));
                            }
                        }
                    }
                    last = id;
                }
                _ => break,
            }
            id += 1;
        }
        self.ckpt_in_flight = true;
        let mut write: Vec<u32> = map.values().map(|&(_, s)| s).collect();
        write.sort_unstable();
        Some(Plan {
            write,
            drop,
            atomic_group: Some(last),
            commit_after: true,
            exact: false,
            tag: last,
        })
    }
    fn on_plan_done(&mut self, _now: u64, plan: &Plan) {
        assert!(self.ckpt_in_flight);
        self.ckpt_in_flight = false;
        self.checkpointed_upto = plan.tag;
        while let Some(t) = self.txns.front() {
            if t.id <= self.checkpointed_upto && t.state == TxnState::Checkpointing {
                debug_assert!(
                    t.slots.is_empty(),
                    "checkpointed transaction still holds versions"
                );
                self.txns.pop_front();
            } else {
                break;
            }
        }
        self.checkpoints += 1;
        self.awaiting_commit = true;
        self.events
            .push_back(PolicyEvent::TxnCheckpointed { txn: plan.tag });
    }
    fn on_plan_failed(&mut self, plan: &Plan) {
        self.ckpt_in_flight = false;
        for t in self.txns.iter_mut() {
            if t.id <= plan.tag && t.state == TxnState::Checkpointing {
                t.state = TxnState::Committed { at: 0 };
            }
        }
    }
    fn entry_aux(&self, group: Group) -> (u64, u64) {
        (group, 0)
    }
    fn wants_commit(&self) -> bool {
        (self.awaiting_commit && !self.commit_for_ckpt)
            || (self.committing_upto.is_none() && self.ready_to_commit().is_some())
    }
    fn on_commit_start(&mut self) {
        if self.committing_upto.is_none() {
            if let Some(upto) = self.ready_to_commit() {
                for t in self.txns.iter_mut() {
                    if t.id > self.committed_upto && t.id <= upto {
                        t.state = TxnState::Committing;
                    }
                }
                self.committing_upto = Some(upto);
            }
        }
        if self.awaiting_commit {
            self.commit_for_ckpt = true;
        }
    }
    fn on_commit_done(&mut self, ok: bool) {
        if let Some(upto) = self.committing_upto.take() {
            let now = self.now;
            for t in self.txns.iter_mut() {
                if t.state == TxnState::Committing {
                    t.state = if ok {
                        TxnState::Committed { at: now }
                    } else {
                        TxnState::Sealed
                    };
                }
            }
            if ok {
                self.committed_upto = upto;
                self.events
                    .push_back(PolicyEvent::TxnCommitted { txn: upto });
            }
        }
        if self.commit_for_ckpt {
            self.commit_for_ckpt = false;
            if ok {
                self.awaiting_commit = false;
            }
        }
    }
    fn fill_commit(&self, rec: &mut CommitRecord) {
        rec.txn_committed = self.committing_upto.unwrap_or(self.committed_upto);
        rec.txn_checkpointed = self.checkpointed_upto;
    }
    fn recover(&mut self, rec: &CommitRecord, versions: &mut [RecoveredVersion]) {
        self.committed_upto = rec.txn_committed;
        self.checkpointed_upto = rec.txn_checkpointed;
        let open_id = rec.txn_committed + 1;
        self.txns.clear();
        for id in rec.txn_checkpointed + 1..=rec.txn_committed {
            let mut t = Txn::new(id);
            t.state = TxnState::Committed { at: 0 };
            self.txns.push_back(t);
        }
        let mut open = Txn::new(open_id);
        // Newest version per block among the (merged) uncommitted transactions.
        let mut newest_open: HashMap<u64, u64> = HashMap::new();
        for v in versions.iter() {
            if v.dirty && v.aux0 > rec.txn_committed {
                let e = newest_open.entry(v.lbn).or_insert(v.seq);
                *e = (*e).max(v.seq);
            }
        }
        for v in versions.iter_mut() {
            if !v.dirty || v.aux0 <= rec.txn_checkpointed {
                v.clean = true;
                v.discard = !v.latest;
                v.group = NONE;
            } else if v.aux0 <= rec.txn_committed {
                v.group = v.aux0;
                let t = &mut self.txns[(v.aux0 - rec.txn_checkpointed - 1) as usize];
                t.slots.insert(v.slot, (v.lbn, v.seq));
            } else if newest_open.get(&v.lbn) == Some(&v.seq) {
                v.group = open_id;
                open.slots.insert(v.slot, (v.lbn, v.seq));
                if open.first_seq == 0 || v.seq < open.first_seq {
                    open.first_seq = v.seq;
                }
                open.last_seq = open.last_seq.max(v.seq);
            } else {
                v.discard = true;
            }
        }
        self.txns.push_back(open);
    }
    /// Only deadlines a timeout can act on: the open transaction's age
    /// while it holds something (`seal` closes nothing else), and the
    /// checkpoint delay of the next transaction to checkpoint while no
    /// checkpoint or its commit is in flight (their completions look again).
    /// A deadline that stayed due while the engine waits for a device would
    /// make a driver that honours it spin at one instant.
    fn deadline(&self) -> Option<u64> {
        let mut d: Option<u64> = None;
        if !self.hints && self.cfg.txn_max_age_ns > 0 {
            if let Some(t) = self.txns.back() {
                if let Some(at) = t
                    .opened_at
                    .filter(|_| !t.slots.is_empty() || t.inflight > 0)
                {
                    d = Some(at.saturating_add(self.cfg.txn_max_age_ns));
                }
            }
        }
        if self.cfg.checkpoint_delay_ns > 0 && !self.ckpt_in_flight && !self.awaiting_commit {
            let first = self.txns.front().map(|t| t.id);
            let next = first.and_then(|f| {
                let i = (self.checkpointed_upto + 1).checked_sub(f)? as usize;
                self.txns.get(i)
            });
            if let Some(TxnState::Committed { at }) = next.map(|t| t.state) {
                let x = at.saturating_add(self.cfg.checkpoint_delay_ns);
                d = Some(d.map_or(x, |d| d.min(x)));
            }
        }
        d
    }
    fn on_timeout(&mut self, now: u64) {
        self.now = now;
        if !self.hints && self.cfg.txn_max_age_ns > 0 {
            if let Some(at) = self.txns.back().and_then(|t| t.opened_at) {
                if now >= at.saturating_add(self.cfg.txn_max_age_ns) {
                    self.seal(false);
                }
            }
        }
    }
    fn poll_event(&mut self) -> Option<PolicyEvent> {
        self.events.pop_front()
    }
    fn mem_bytes(&self) -> usize {
        self.txns
            .iter()
            .map(|t| t.slots.capacity() * 24 + std::mem::size_of::<Txn>())
            .sum()
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("journal_txns_closed", self.txns_closed),
            ("journal_forced_closes", self.forced_closes),
            ("journal_checkpoints", self.checkpoints),
            ("journal_committed_upto", self.committed_upto),
            ("journal_checkpointed_upto", self.checkpointed_upto),
        ]
    }
}
