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
    fn may_overwrite(&self, old: Group, new: Group) -> bool {
        crate::mutation::active(crate::mutation::Mutation::JournaledRewritesInPlace)
            && old == new
            && self.txns.back().map(|t| t.id) == Some(new)
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
            after: None,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Journaled (or `journaled-hints`) over a 64-slot cache: transactions
    /// of at most 4 blocks, no age limit, the rest as `set` leaves it.
    fn pol(kind: WritePolicyKind, set: impl FnOnce(&mut JournalConfig)) -> Journaled {
        let mut c = Config::new(4096, 64, 1 << 20, kind);
        c.journal.txn_max_blocks = 4;
        c.journal.txn_max_age_ns = 0;
        set(&mut c.journal);
        Journaled::new(&c)
    }

    fn journaled() -> Journaled {
        pol(WritePolicyKind::Journaled, |_| {})
    }

    /// Issue a write, install its version (`slot`, `lbn`), complete it.
    fn write(j: &mut Journaled, seq: u64, slot: u32, lbn: u64) -> Group {
        let now = j.now;
        let g = j.on_write_issue(now, seq);
        j.on_version_installed(g, slot, lbn, seq);
        j.on_write_data_done(now, g);
        g
    }

    fn events(j: &mut Journaled) -> Vec<PolicyEvent> {
        std::iter::from_fn(|| j.poll_event()).collect()
    }

    fn closed(txn: u64, first_seq: u64, last_seq: u64, forced: bool) -> PolicyEvent {
        PolicyEvent::TxnClosed {
            txn,
            first_seq,
            last_seq,
            forced,
        }
    }

    fn counter(j: &Journaled, name: &str) -> u64 {
        j.counters()
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, v)| v)
            .unwrap_or_else(|| panic!("no counter {name}"))
    }

    /// The commit record's journal fields as the policy fills them now.
    fn record(j: &Journaled) -> (u64, u64) {
        let mut rec = CommitRecord::default();
        j.fill_commit(&mut rec);
        (rec.txn_committed, rec.txn_checkpointed)
    }

    /// A metadata commit as the engine runs one, at time `now`.
    fn commit(j: &mut Journaled, now: u64, ok: bool) {
        j.now = now;
        j.on_commit_start();
        j.on_commit_done(ok);
    }

    /// A planning context: the time and whether writers wait for slots.
    struct Ctx {
        now: u64,
        pressure: bool,
    }

    impl PlanCtx for Ctx {
        fn now(&self) -> u64 {
            self.now
        }
        fn cleaning_wanted(&self) -> bool {
            false
        }
        fn pick_victims(&mut self, _max: usize, _out: &mut Vec<(u32, Group)>) {}
        fn space_pressure(&self) -> bool {
            self.pressure
        }
        fn destage_in_flight(&self) -> usize {
            0
        }
        fn destage_limit(&self) -> usize {
            16
        }
    }

    fn plan(j: &mut Journaled, now: u64, pressure: bool) -> Option<Plan> {
        j.next_plan(&mut Ctx { now, pressure })
    }

    /// `(write, drop, tag)` of a checkpoint plan, slots sorted; also checks
    /// the fields every checkpoint has (one atomic group named by its last
    /// transaction, a commit after it, whole blocks).
    fn parts(p: &Plan) -> (Vec<u32>, Vec<u32>, u64) {
        assert_eq!(p.atomic_group, Some(p.tag));
        assert!(p.commit_after && !p.exact);
        let mut drop = p.drop.clone();
        drop.sort_unstable();
        (p.write.clone(), drop, p.tag)
    }

    /// The plan's slots are cleaned (the engine removes them from their
    /// transactions), then the plan completes.
    fn finish(j: &mut Journaled, p: &Plan) {
        for &s in p.write.iter().chain(&p.drop) {
            let t = j.txns.iter().find(|t| t.slots.contains_key(&s));
            let id = t.expect("a planned slot belongs to a transaction").id;
            j.on_version_removed(id, s);
        }
        j.on_plan_done(0, p);
    }

    #[test]
    fn a_transaction_closes_only_when_it_holds_something() {
        let mut j = journaled();
        j.on_consistency_point(0, true);
        assert_eq!(events(&mut j), vec![]);
        assert_eq!(counter(&j, "journal_txns_closed"), 0);
        // A write in flight, its version not yet installed: it counts.
        assert_eq!(j.on_write_issue(0, 7), 1);
        j.on_consistency_point(0, true);
        assert_eq!(events(&mut j), vec![closed(1, 7, 7, false)]);
        assert_eq!(write(&mut j, 8, 1, 100), 2);
        assert_eq!(write(&mut j, 9, 2, 101), 2);
        j.on_consistency_point(0, true);
        assert_eq!(events(&mut j), vec![closed(2, 8, 9, false)]);
        assert_eq!(counter(&j, "journal_txns_closed"), 2);
        assert_eq!(counter(&j, "journal_forced_closes"), 0);
    }

    #[test]
    fn a_flush_closes_hinted_transactions_and_a_checkpoint_request_closes_both() {
        for (kind, flush_closes) in [
            (WritePolicyKind::Journaled, false),
            (WritePolicyKind::JournaledHints, true),
        ] {
            let mut j = pol(kind, |_| {});
            assert_eq!(j.kind(), kind);
            write(&mut j, 1, 1, 10);
            j.on_consistency_point(0, false);
            let want = if flush_closes {
                vec![closed(1, 1, 1, false)]
            } else {
                vec![]
            };
            assert_eq!(events(&mut j), want, "{kind}: FLUSH");
            write(&mut j, 2, 2, 11);
            j.on_consistency_point(0, true);
            let txn = if flush_closes { 2 } else { 1 };
            let first = if flush_closes { 2 } else { 1 };
            assert_eq!(
                events(&mut j),
                vec![closed(txn, first, 2, false)],
                "{kind}: checkpoint request"
            );
        }
    }

    #[test]
    fn size_closes_journaled_transactions_but_not_hinted_ones() {
        let mut j = journaled();
        for i in 0..3 {
            write(&mut j, i + 1, i as u32, 10 + i);
        }
        assert_eq!(events(&mut j), vec![], "3 of 4 blocks");
        write(&mut j, 4, 3, 13);
        assert_eq!(events(&mut j), vec![closed(1, 1, 4, false)]);
        // The next transaction starts empty.
        assert_eq!(write(&mut j, 5, 4, 14), 2);
        assert_eq!(events(&mut j), vec![]);
        let mut h = pol(WritePolicyKind::JournaledHints, |_| {});
        for i in 0..10 {
            assert_eq!(write(&mut h, i + 1, i as u32, 10 + i), 1);
        }
        assert_eq!(events(&mut h), vec![]);
    }

    #[test]
    fn a_commit_takes_the_closed_transactions_whose_writes_all_reached_the_cache() {
        let mut j = journaled();
        assert!(!j.wants_commit());
        // Transaction 1: a write still in flight when it closes.
        let g1 = j.on_write_issue(0, 1);
        j.on_consistency_point(0, true);
        assert!(!j.wants_commit(), "a write of 1 is in flight");
        // Transaction 2: complete, but behind 1.
        write(&mut j, 2, 2, 20);
        j.on_consistency_point(0, true);
        assert!(!j.wants_commit(), "2 waits for 1");
        j.on_version_installed(g1, 1, 10, 1);
        j.on_write_data_done(0, g1);
        assert!(j.wants_commit());
        j.on_commit_start();
        assert_eq!(record(&j), (2, 0), "the commit makes 1 and 2 durable");
        assert!(!j.wants_commit(), "one commit at a time");
        // Transaction 3 closes while the commit is in flight.
        write(&mut j, 3, 3, 30);
        j.on_consistency_point(0, true);
        assert!(!j.wants_commit());
        j.on_commit_done(true);
        let evs = events(&mut j);
        assert_eq!(
            evs.last(),
            Some(&PolicyEvent::TxnCommitted { txn: 2 }),
            "{evs:?}"
        );
        assert_eq!(record(&j), (2, 0));
        assert_eq!(counter(&j, "journal_committed_upto"), 2);
        assert!(j.wants_commit(), "3 is ready");
        commit(&mut j, 0, true);
        assert_eq!(events(&mut j), vec![PolicyEvent::TxnCommitted { txn: 3 }]);
        assert!(!j.wants_commit());
        // The open transaction (4) was not part of any commit: it still
        // takes writes and closes by size.
        for i in 0..4 {
            assert_eq!(write(&mut j, 10 + i, 10 + i as u32, 40 + i), 4);
        }
        assert_eq!(events(&mut j), vec![closed(4, 10, 13, false)]);
    }

    #[test]
    fn a_failed_commit_leaves_its_transactions_to_commit_again() {
        let mut j = journaled();
        write(&mut j, 1, 1, 10);
        j.on_consistency_point(0, true);
        events(&mut j);
        commit(&mut j, 0, false);
        assert_eq!(events(&mut j), vec![]);
        assert_eq!(record(&j), (0, 0));
        assert!(j.wants_commit());
        assert!(plan(&mut j, 0, false).is_none(), "nothing committed");
        commit(&mut j, 0, true);
        assert_eq!(events(&mut j), vec![PolicyEvent::TxnCommitted { txn: 1 }]);
        assert_eq!(record(&j), (1, 0));
        assert!(!j.wants_commit());
        let p = plan(&mut j, 0, false).expect("1 is committed");
        assert_eq!(parts(&p), (vec![1], vec![], 1));
    }

    #[test]
    fn a_patch_holds_its_transaction_back_from_a_commit() {
        let mut j = journaled();
        let g = write(&mut j, 1, 1, 10);
        j.on_patch_pending(g);
        j.on_consistency_point(0, true);
        assert!(!j.wants_commit(), "a patch of 1 is still in RAM");
        j.on_patch_done(g);
        assert!(j.wants_commit());
        assert!(j.commit_needs_patches_done());
    }

    /// Transaction 1 (block 10 in slot 1) committed at `at`, with a
    /// checkpoint delay of `delay`.
    fn committed_at(at: u64, delay: u64) -> Journaled {
        let mut j = pol(WritePolicyKind::Journaled, |c| {
            c.checkpoint_delay_ns = delay
        });
        write(&mut j, 1, 1, 10);
        j.on_consistency_point(0, true);
        commit(&mut j, at, true);
        j
    }

    #[test]
    fn a_checkpoint_waits_for_its_delay_unless_writers_wait() {
        let j = committed_at(100, 1000);
        assert_eq!(j.deadline(), Some(1100));
        for (now, pressure, full, want) in [
            (100, false, false, false),
            (500, false, false, false),
            (1099, false, false, false),
            (1100, false, false, true),
            (5000, false, false, true),
            (500, true, false, true),
            (500, false, true, true),
        ] {
            let mut j = committed_at(100, 1000);
            j.journal_wait(full);
            let p = plan(&mut j, now, pressure);
            assert_eq!(
                p.is_some(),
                want,
                "now {now}, space pressure {pressure}, journal full {full}"
            );
            if let Some(p) = p {
                assert_eq!(parts(&p), (vec![1], vec![], 1));
            }
        }
        // Without a delay, at once.
        let mut j = committed_at(100, 0);
        assert_eq!(j.deadline(), None, "no delay: nothing to wait for");
        assert!(plan(&mut j, 100, false).is_some());
    }

    #[test]
    fn a_checkpoint_merges_up_to_the_limit_and_writes_each_block_once() {
        let mut j = pol(WritePolicyKind::Journaled, |c| c.checkpoint_merge_max = 2);
        write(&mut j, 1, 1, 10);
        write(&mut j, 2, 2, 11);
        j.on_consistency_point(0, true);
        write(&mut j, 3, 3, 10);
        j.on_consistency_point(0, true);
        write(&mut j, 4, 4, 12);
        j.on_consistency_point(0, true);
        // A rewrite within the open transaction: the engine frees the
        // superseded slot.
        write(&mut j, 5, 5, 13);
        write(&mut j, 6, 6, 13);
        j.on_version_removed(4, 5);
        commit(&mut j, 0, true);
        events(&mut j);
        let p = plan(&mut j, 0, false).expect("1..3 committed");
        // Transactions 1 and 2: block 10's newer copy (slot 3) only.
        assert_eq!(parts(&p), (vec![2, 3], vec![1], 2));
        assert!(plan(&mut j, 0, false).is_none(), "one checkpoint at a time");
        finish(&mut j, &p);
        assert_eq!(
            events(&mut j),
            vec![PolicyEvent::TxnCheckpointed { txn: 2 }]
        );
        assert!(plan(&mut j, 0, false).is_none(), "its commit first");
        assert!(j.wants_commit());
        j.on_commit_start();
        assert_eq!(record(&j), (3, 2));
        j.on_commit_done(true);
        assert!(!j.wants_commit());
        let p = plan(&mut j, 0, false).expect("3 is committed");
        assert_eq!(parts(&p), (vec![4], vec![], 3));
        finish(&mut j, &p);
        commit(&mut j, 0, true);
        j.on_consistency_point(0, true);
        commit(&mut j, 0, true);
        let p = plan(&mut j, 0, false).expect("4 is committed");
        assert_eq!(parts(&p), (vec![6], vec![], 4), "slot 5 was freed");
        assert_eq!(
            j.counters(),
            vec![
                ("journal_txns_closed", 4),
                ("journal_forced_closes", 0),
                ("journal_checkpoints", 2),
                ("journal_committed_upto", 4),
                ("journal_checkpointed_upto", 3),
            ]
        );
    }

    #[test]
    fn a_checkpoint_takes_committed_transactions_only() {
        let mut j = pol(WritePolicyKind::Journaled, |c| c.checkpoint_merge_max = 4);
        write(&mut j, 1, 1, 10);
        j.on_consistency_point(0, true);
        write(&mut j, 2, 2, 11);
        j.on_consistency_point(0, true);
        commit(&mut j, 0, true);
        // Closed but not committed (a write in flight), and the open one.
        let g = j.on_write_issue(0, 3);
        j.on_version_installed(g, 3, 12, 3);
        j.on_consistency_point(0, true);
        write(&mut j, 4, 4, 13);
        let p = plan(&mut j, 0, false).expect("1 and 2 are committed");
        assert_eq!(parts(&p), (vec![1, 2], vec![], 2));
        // Transaction 3 still commits, and 4 still takes writes.
        j.on_write_data_done(0, g);
        assert!(j.wants_commit());
        assert_eq!(write(&mut j, 5, 5, 14), 4);
    }

    #[test]
    fn the_newest_copy_of_a_block_wins_in_a_merged_checkpoint() {
        // Sequence numbers, not transaction order, say which copy is newer.
        let mut j = pol(WritePolicyKind::Journaled, |c| c.checkpoint_merge_max = 2);
        let g = j.on_write_issue(0, 9);
        j.on_version_installed(g, 1, 10, 9);
        j.on_write_data_done(0, g);
        j.on_consistency_point(0, true);
        let g = j.on_write_issue(0, 5);
        j.on_version_installed(g, 2, 10, 5);
        j.on_write_data_done(0, g);
        j.on_consistency_point(0, true);
        commit(&mut j, 0, true);
        let p = plan(&mut j, 0, false).expect("committed");
        assert_eq!(parts(&p), (vec![1], vec![2], 2));
    }

    #[test]
    fn a_failed_checkpoint_is_planned_again() {
        let mut j = committed_at(100, 1000);
        let p = plan(&mut j, 2000, false).expect("due");
        j.on_plan_failed(&p);
        let q = plan(&mut j, 2000, false).expect("planned again");
        assert_eq!(parts(&q), parts(&p));
    }

    #[test]
    fn writers_waiting_close_the_open_transaction_when_nothing_else_makes_room() {
        // Hinted: a forced close (the backing store's states are no longer
        // all flush-aligned); journaled: an ordinary one.
        for (kind, forced) in [
            (WritePolicyKind::JournaledHints, true),
            (WritePolicyKind::Journaled, false),
        ] {
            let mut j = pol(kind, |_| {});
            write(&mut j, 1, 1, 10);
            assert!(plan(&mut j, 0, false).is_none());
            assert_eq!(events(&mut j), vec![], "{kind}: nobody waits");
            assert!(plan(&mut j, 0, true).is_none());
            assert_eq!(events(&mut j), vec![closed(1, 1, 1, forced)], "{kind}");
            assert_eq!(counter(&j, "journal_forced_closes"), forced as u64);
            assert_eq!(counter(&j, "journal_txns_closed"), 1);
        }
        // A write waiting for room in the journal does the same.
        let mut j = journaled();
        write(&mut j, 1, 1, 10);
        j.journal_wait(true);
        assert!(plan(&mut j, 0, false).is_none());
        assert_eq!(events(&mut j), vec![closed(1, 1, 1, false)]);
        // Not a transaction with only a write in flight (nothing to
        // checkpoint yet; its version comes).
        let mut j = journaled();
        j.on_write_issue(0, 1);
        assert!(plan(&mut j, 0, true).is_none());
        assert_eq!(events(&mut j), vec![]);
        // Not while a closed transaction waits for its writes (its commit
        // and checkpoint make room first).
        let mut j = journaled();
        let g = j.on_write_issue(0, 1);
        j.on_version_installed(g, 1, 10, 1);
        j.on_consistency_point(0, true);
        events(&mut j);
        write(&mut j, 2, 2, 11);
        assert!(plan(&mut j, 0, true).is_none());
        assert_eq!(events(&mut j), vec![]);
        // Not while a commit is in flight.
        let mut j = journaled();
        write(&mut j, 1, 1, 10);
        j.on_consistency_point(0, true);
        events(&mut j);
        j.on_commit_start();
        write(&mut j, 2, 2, 11);
        assert!(plan(&mut j, 0, true).is_none());
        assert_eq!(events(&mut j), vec![]);
    }

    #[test]
    fn the_journal_is_empty_only_with_nothing_since_the_last_checkpoint() {
        let mut j = journaled();
        assert!(j.bypass_ok());
        j.on_write_issue(0, 1);
        assert!(!j.bypass_ok(), "a write in flight");
        // A write that failed (no version): the open transaction's
        // sequence range has started all the same.
        let mut j = journaled();
        let g = j.on_write_issue(0, 1);
        j.on_write_data_done(0, g);
        assert!(!j.bypass_ok(), "the open transaction had a write");
        // Through a whole cycle: empty again only after the checkpoint's
        // commit.
        let mut j = journaled();
        write(&mut j, 1, 1, 10);
        assert!(!j.bypass_ok());
        j.on_consistency_point(0, true);
        assert!(!j.bypass_ok(), "closed");
        j.on_commit_start();
        assert!(!j.bypass_ok(), "committing");
        j.on_commit_done(true);
        assert!(!j.bypass_ok(), "committed");
        let p = plan(&mut j, 0, false).expect("committed");
        assert!(!j.bypass_ok(), "checkpointing");
        finish(&mut j, &p);
        assert!(!j.bypass_ok(), "checkpointed, not yet recorded");
        j.on_commit_start();
        assert!(!j.bypass_ok(), "recording the checkpoint");
        j.on_commit_done(true);
        assert!(j.bypass_ok());
    }

    #[test]
    fn superseded_versions_of_other_transactions_are_kept() {
        let j = journaled();
        assert!(!j.keep_superseded(NONE, 3), "a clean version");
        assert!(!j.keep_superseded(3, 3), "the same transaction");
        assert!(j.keep_superseded(2, 3));
        assert!(!j.may_overwrite(3, 3));
        assert_eq!(j.entry_aux(5), (5, 0));
    }

    #[test]
    fn the_open_transaction_closes_by_age() {
        let mut j = pol(WritePolicyKind::Journaled, |c| c.txn_max_age_ns = 1000);
        assert_eq!(j.deadline(), None, "nothing open");
        let g = j.on_write_issue(100, 1);
        assert_eq!(j.deadline(), Some(1100), "a write in flight");
        j.on_version_installed(g, 1, 10, 1);
        j.on_write_data_done(100, g);
        assert_eq!(j.deadline(), Some(1100));
        j.on_timeout(1099);
        assert_eq!(events(&mut j), vec![]);
        j.on_timeout(1100);
        assert_eq!(events(&mut j), vec![closed(1, 1, 1, false)]);
        assert_eq!(j.deadline(), None, "no checkpoint delay");
        // A transaction whose only write failed holds nothing to close.
        let mut j = pol(WritePolicyKind::Journaled, |c| c.txn_max_age_ns = 1000);
        let g = j.on_write_issue(100, 1);
        j.on_write_data_done(100, g);
        assert_eq!(j.deadline(), None);
        // No age limit, or hinted: no deadline, and time closes nothing.
        for (kind, age) in [
            (WritePolicyKind::Journaled, 0),
            (WritePolicyKind::JournaledHints, 1000),
        ] {
            let mut j = pol(kind, |c| c.txn_max_age_ns = age);
            write(&mut j, 1, 1, 10);
            assert_eq!(j.deadline(), None, "{kind}, age {age}");
            j.on_timeout(1_000_000);
            assert_eq!(events(&mut j), vec![], "{kind}, age {age}");
        }
    }

    #[test]
    fn the_checkpoint_delay_is_a_deadline_while_no_checkpoint_is_in_flight() {
        let mut j = committed_at(100, 1000);
        assert_eq!(j.deadline(), Some(1100));
        let p = plan(&mut j, 1100, false).expect("due");
        assert_eq!(j.deadline(), None, "checkpointing");
        // Transaction 2 commits while 1 is checkpointed.
        write(&mut j, 2, 2, 11);
        j.on_consistency_point(0, true);
        commit(&mut j, 1200, true);
        finish(&mut j, &p);
        assert_eq!(j.deadline(), None, "the checkpoint's commit is due first");
        commit(&mut j, 1300, true);
        assert_eq!(j.deadline(), Some(2200), "2's delay");
        // The earlier of the two deadlines.
        let mut j = pol(WritePolicyKind::Journaled, |c| {
            c.checkpoint_delay_ns = 1000;
            c.txn_max_age_ns = 5000;
        });
        write(&mut j, 1, 1, 10);
        j.on_consistency_point(0, true);
        commit(&mut j, 100, true);
        j.on_write_issue(200, 2);
        assert_eq!(j.deadline(), Some(1100));
    }

    #[test]
    fn a_later_commit_does_not_restart_an_earlier_transactions_delay() {
        let mut j = committed_at(0, 1000);
        write(&mut j, 2, 2, 11);
        j.on_consistency_point(0, true);
        commit(&mut j, 100, true);
        assert_eq!(j.deadline(), Some(1000));
        let p = plan(&mut j, 1000, false).expect("1 is due");
        assert_eq!(parts(&p), (vec![1], vec![], 1));
    }

    #[test]
    fn recovery_rebuilds_the_committed_and_open_transactions() {
        let rec = CommitRecord {
            txn_committed: 3,
            txn_checkpointed: 1,
            ..CommitRecord::default()
        };
        let v = |slot: u32, lbn: u64, seq: u64, aux0: u64, dirty: bool, latest: bool| {
            RecoveredVersion {
                slot,
                lbn,
                seq,
                aux0,
                aux1: 0,
                lo: 0,
                hi: 4096,
                dirty,
                partial: false,
                latest,
                group: 0,
                discard: false,
                clean: false,
            }
        };
        let mut vs = [
            v(0, 5, 1, NONE, false, true),  // clean
            v(1, 6, 1, NONE, false, false), // clean, superseded
            v(2, 7, 2, 1, true, true),      // checkpointed
            v(3, 8, 3, 1, true, false),     // checkpointed, superseded
            v(4, 9, 4, 2, true, true),      // committed: 2
            v(5, 10, 5, 3, true, true),     // committed: 3
            v(6, 50, 10, 4, true, false),   // uncommitted, an older copy
            v(7, 50, 12, 5, true, true),    // uncommitted, the newest copy
            v(8, 51, 11, 5, true, true),    // uncommitted
        ];
        let mut j = journaled();
        j.recover(&rec, &mut vs);
        let out: Vec<(Group, bool, bool)> =
            vs.iter().map(|v| (v.group, v.clean, v.discard)).collect();
        assert_eq!(
            out,
            vec![
                (NONE, true, false),
                (NONE, true, true),
                (NONE, true, false),
                (NONE, true, true),
                (2, false, false),
                (3, false, false),
                (0, false, true),
                (4, false, false),
                (4, false, false),
            ]
        );
        assert_eq!(record(&j), (3, 1));
        assert_eq!(counter(&j, "journal_committed_upto"), 3);
        assert_eq!(counter(&j, "journal_checkpointed_upto"), 1);
        // The merged uncommitted writes are the open transaction 4.
        j.on_consistency_point(0, true);
        assert_eq!(events(&mut j), vec![closed(4, 11, 12, false)]);
        let p = plan(&mut j, 0, false).expect("2 is committed");
        assert_eq!(parts(&p), (vec![4], vec![], 2));
        finish(&mut j, &p);
        commit(&mut j, 0, true);
        let p = plan(&mut j, 0, false).expect("3 is committed");
        assert_eq!(parts(&p), (vec![5], vec![], 3));
        finish(&mut j, &p);
        commit(&mut j, 0, true);
        let p = plan(&mut j, 0, false).expect("4 is committed");
        assert_eq!(parts(&p), (vec![7, 8], vec![], 4));
    }

    #[test]
    fn the_memory_estimate_counts_records_and_entries() {
        let mut j = journaled();
        let empty = std::mem::size_of::<Txn>();
        assert_eq!(j.mem_bytes(), empty, "one empty transaction");
        let mut h = pol(WritePolicyKind::JournaledHints, |_| {});
        for i in 0..100 {
            write(&mut h, i + 1, i as u32, i);
        }
        let m = h.mem_bytes();
        assert!(
            (empty + 100 * 24..empty + 100 * 24 * 4).contains(&m),
            "{m} bytes for 100 entries"
        );
        write(&mut j, 1, 1, 10);
        j.on_consistency_point(0, true);
        assert!(
            j.mem_bytes() >= 2 * empty + 24,
            "two transactions, one entry"
        );
    }
}
