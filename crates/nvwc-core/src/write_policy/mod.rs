//! Write policies: one file each, behind the narrow [`WritePolicy`] trait.
//!
//! The engine owns slots, blocks and I/O; a write policy decides three things:
//! which *group* a new write's versions belong to (an ordered-graph node, a
//! journal transaction, or nothing), whether a superseded version must be kept
//! until its group reaches the backing store, and which versions to destage
//! next, as a [`Plan`]. The engine executes plans and reports back.

use crate::config::{Config, WritePolicyKind};
use crate::layout::CommitRecord;

pub mod journaled;
pub mod ordered;
pub mod write_back;
pub mod write_through;

/// A policy-defined group of versions (ordered: node id; journaled: txn id; else 0).
pub type Group = u64;

/// A destage plan: versions (cache slots) to copy to the backing store.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// Slots whose data is written to the backing store.
    pub write: Vec<u32>,
    /// Superseded slots released when the plan completes, without being written
    /// (journaled coalescing across merged transactions).
    pub drop: Vec<u32>,
    /// Emit the writes as one atomic group with this id (journaled checkpoints).
    pub atomic_group: Option<u64>,
    /// Persist metadata (an engine commit) after the plan, before the next plan.
    pub commit_after: bool,
    /// Write only the bytes each version's own writes changed (ordered waves),
    /// instead of whole blocks.
    pub exact: bool,
    /// Policy-private tag (ordered: wave number; journaled: last txn in the plan).
    pub tag: u64,
    /// Pipelining (ordered waves): the plan in flight with this tag MUST
    /// end before this plan's backing writes are issued. Its cache reads may
    /// run meanwhile, and its writes do not count toward the destage limit
    /// until then. If that plan fails, this one is cancelled: it ends failed
    /// without writing anything (`WritePolicy::on_plan_failed`), after the
    /// failed plan's own `on_plan_failed`, and is not counted as a failure.
    pub after: Option<u64>,
}

/// What the engine offers a policy while it plans.
pub trait PlanCtx {
    /// Current time (ns).
    fn now(&self) -> u64;
    /// Should cleaning run (watermarks, stalled writers)?
    fn cleaning_wanted(&self) -> bool;
    /// Dirty latest versions the replacement policy would clean first:
    /// `(slot, group)` pairs, skipping versions that are busy or already destaging.
    fn pick_victims(&mut self, max: usize, out: &mut Vec<(u32, Group)>);
    /// Are writers stalled for lack of free slots?
    fn space_pressure(&self) -> bool;
    /// Block writes of destage plans currently in flight.
    fn destage_in_flight(&self) -> usize;
    /// Upper bound for `destage_in_flight`.
    fn destage_limit(&self) -> usize;
    /// Does a plan in flight (not gated, `Plan::after`) still have copies
    /// to write to the backing store? False once every such plan waits only
    /// for its backing FLUSH (or its atomic group's end).
    fn copies_pending(&self) -> bool {
        false
    }
}

/// A version found on the cache device at recovery.
#[derive(Clone, Copy, Debug)]
pub struct RecoveredVersion {
    pub slot: u32,
    pub lbn: u64,
    pub seq: u64,
    pub aux0: u64,
    pub aux1: u64,
    pub lo: u32,
    pub hi: u32,
    pub dirty: bool,
    /// A partial version (`F_PARTIAL`): only `lo..hi` is valid.
    pub partial: bool,
    /// The newest version of its block.
    pub latest: bool,
    /// Output: the group the policy assigns.
    pub group: Group,
    /// Output: discard this version (it is not part of the recovered state).
    pub discard: bool,
    /// Output: treat it as clean.
    pub clean: bool,
}

/// Notifications from a policy to the engine's observers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyEvent {
    /// A journal transaction closed: it holds writes with sequence numbers
    /// in `first_seq..=last_seq` (those that completed successfully).
    TxnClosed {
        txn: u64,
        first_seq: u64,
        last_seq: u64,
        forced: bool,
    },
    /// A journal transaction was committed on the cache device.
    TxnCommitted { txn: u64 },
    /// Transactions up to `txn` are checkpointed on the backing store.
    TxnCheckpointed { txn: u64 },
}

/// A write policy. See the module docs.
pub trait WritePolicy: Send {
    /// The configuration name.
    fn kind(&self) -> WritePolicyKind;
    /// Client writes are written to the backing store before they are acknowledged.
    fn synchronous_backing(&self) -> bool {
        false
    }
    /// Issue a write (`on_write_issue`) when it arrives, before it waits
    /// for cache space, rather than when it is admitted. Ordered: the
    /// completion->issue rule counts what completed before the client sent
    /// the write; what completes while it waits for room adds edges no
    /// client asked for (with a full cache every write waited, each
    /// depended on the one before, and waves were one write long). A policy
    /// answering true MUST let a write that has not been admitted hold
    /// nothing up: no commit, checkpoint or plan may wait for it.
    fn issue_at_arrival(&self) -> bool {
        false
    }
    /// A client write was issued with sequence number `seq`; returns its group.
    fn on_write_issue(&mut self, now: u64, seq: u64) -> Group;
    /// A client write's data reached the cache (all its blocks); it may still wait for a commit.
    fn on_write_data_done(&mut self, _now: u64, _group: Group) {}
    /// Slots whose entry [`WritePolicy::entry_aux`] changes when `group`'s
    /// write completes: every version of the group, including those that
    /// reached the cache before the write completed by another path than
    /// the write's own pieces (a patch persisted as a partial version). The
    /// engine rewrites their entries at the next commit.
    fn aux_changed_on_completion(&self, _group: Group) -> &[u32] {
        &[]
    }
    /// The driver will report, with [`WritePolicy::on_replies_sending`],
    /// each moment from which replies may be visible to clients. Without it
    /// (the default) a write counts as visible once its data is in the cache
    /// ([`WritePolicy::on_write_data_done`]), before its reply.
    fn set_reply_events(&mut self, _on: bool) {}
    /// Replies may be visible to clients from now on: every write whose data
    /// is in the cache by now counts as complete for the writes issued after
    /// this call (the completion→issue rule; only ordered cares).
    fn on_replies_sending(&mut self, _now: u64) {}
    /// A client write was acknowledged.
    fn on_write_ack(&mut self, _now: u64, _group: Group) {}
    /// A write of `group` was acknowledged with some of its data held as a
    /// *patch* in RAM (not yet a version). Until the matching
    /// [`WritePolicy::on_patch_done`], nothing of `group` may reach the backing
    /// store or a journal commit: the patch's version is still to come.
    fn on_patch_pending(&mut self, _group: Group) {}
    /// The patch counted by `on_patch_pending` became a version of `group`
    /// (installed before this call) or was superseded within `group`.
    fn on_patch_done(&mut self, _group: Group) {}
    /// Must a metadata commit wait until no patch is held in RAM? True where a
    /// durable later version without an earlier acknowledged patch would break
    /// the policy's guarantee and nothing else prevents it (ordered).
    fn commit_needs_patches_done(&self) -> bool {
        false
    }
    /// A version in `slot` was installed for `group`.
    fn on_version_installed(&mut self, _group: Group, _slot: u32, _lbn: u64, _seq: u64) {}
    /// A version left `group` (freed or cleaned).
    fn on_version_removed(&mut self, _group: Group, _slot: u32) {}
    /// A version of `old` is superseded by a version of `new`: must it be kept
    /// until `old` is destaged?
    fn keep_superseded(&self, _old: Group, _new: Group) -> bool {
        false
    }
    /// When a new version replaces (coalesces) a dirty version, does it inherit
    /// the old version's dirty byte range? (Not in ordered write-back, where a
    /// replaced version's own bytes are already on the backing store.)
    fn inherits_dirty_range(&self) -> bool {
        true
    }
    /// May a write of group `new` overwrite in place an uncommitted version of group `old`?
    fn may_overwrite(&self, old: Group, new: Group) -> bool {
        old == new
    }
    /// May a write overwrite in place a dirty version that a durable commit
    /// already names? Then a crash may recover that block with the new bytes
    /// (or, after power loss, a sector-wise mix of old and new) under the old
    /// entry, rather than exactly the committed version: fine where nothing
    /// orders unflushed writes (plain write-back, like a disk's volatile
    /// cache), never where the recovered cache must be a point in time.
    fn may_overwrite_durable(&self) -> bool {
        false
    }
    /// May a write go straight to the backing store now (an admission
    /// bypass), written with FUA and acknowledged once durable there, without
    /// breaking the policy's guarantee? The engine calls this only when no
    /// destage plan is in flight and no patch is held, and only for a block
    /// with no version in the cache and no durable entry that recovery could
    /// bring back. Write-through and write-back promise nothing about the
    /// backing store between flushes: yes. Ordered: only while every
    /// completed write is already on the backing store (no version belongs
    /// to a node), since the bypassed write must land after all of them.
    /// Journaled: only while the journal is empty (nothing written since the
    /// last checkpoint), when the bypassed write can be a transaction of its
    /// own ahead of the open one; the engine decides that at admission
    /// (`Engine::journal_bypass_ok`; see ARCHITECTURE.md).
    fn bypass_ok(&self) -> bool {
        true
    }
    /// Under a journal bound (`JournalConfig::size_blocks`), after each
    /// admission round: does a write wait for room in the journal? While
    /// one does, the policy MUST make progress towards room without
    /// waiting for time to pass: checkpoint committed transactions now, and
    /// close the open transaction when nothing else could be checkpointed.
    fn journal_wait(&mut self, _waiting: bool) {}
    /// A client FLUSH (`explicit == false`) or checkpoint request (`true`) arrived.
    fn on_consistency_point(&mut self, _now: u64, _explicit: bool) {}
    /// The next destage plan, if the policy wants one now.
    fn next_plan(&mut self, ctx: &mut dyn PlanCtx) -> Option<Plan>;
    /// A plan is done: its writes are durable on the backing store.
    fn on_plan_done(&mut self, _now: u64, _plan: &Plan) {}
    /// A plan failed and was abandoned; its versions stay dirty.
    fn on_plan_failed(&mut self, _plan: &Plan) {}
    /// Entry fields persisted with dirty versions of `group` (which may be
    /// `NO_GROUP`): `(aux0, aux1)`.
    fn entry_aux(&self, _group: Group) -> (u64, u64) {
        (0, 0)
    }
    /// Does the policy need a metadata commit now?
    fn wants_commit(&self) -> bool {
        false
    }
    /// A commit is starting: the policy records what it makes durable.
    fn on_commit_start(&mut self) {}
    /// The commit started last finished (`ok == false`: it failed).
    fn on_commit_done(&mut self, _ok: bool) {}
    /// Fill policy fields of a commit record.
    fn fill_commit(&self, _rec: &mut CommitRecord) {}
    /// Assign groups to recovered versions (and discard or clean some).
    fn recover(&mut self, rec: &CommitRecord, versions: &mut [RecoveredVersion]);
    /// Next time the policy wants `on_timeout`.
    fn deadline(&self) -> Option<u64> {
        None
    }
    /// Time passed.
    fn on_timeout(&mut self, _now: u64) {}
    /// Notifications for observers.
    fn poll_event(&mut self) -> Option<PolicyEvent> {
        None
    }
    /// Bytes of RAM the policy uses.
    fn mem_bytes(&self) -> usize {
        0
    }
    /// Policy-specific counters for status and benchmarks: `(name, value)`.
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
}

/// Build the policy for `cfg`.
pub fn build(cfg: &Config) -> Box<dyn WritePolicy> {
    match cfg.write_policy {
        WritePolicyKind::WriteThrough => Box::new(write_through::WriteThrough),
        WritePolicyKind::WriteBack => Box::new(write_back::WriteBack::new(cfg)),
        WritePolicyKind::Ordered => Box::new(ordered::Ordered::new(cfg)),
        WritePolicyKind::Journaled | WritePolicyKind::JournaledHints => {
            Box::new(journaled::Journaled::new(cfg))
        }
    }
}

// The planted bug of `Ordered::needs_marks` (the checkers' tests only).
pub(crate) use crate::mutation::ignore_marking;
