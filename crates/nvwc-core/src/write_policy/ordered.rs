//! Ordered write-back (write-policy paper §3.1).
//!
//! Every client write is a node of a dependency graph built online from the
//! completion→issue invariant: when a write is issued it gets an edge from
//! every write that has already completed (§3.1.1). Older versions of a block
//! are kept until their node is destaged, so the backing store only ever sees
//! a prefix-closed set of writes. A node is destaged only after all its
//! predecessors are durable on the backing store; eviction of a victim first
//! destages, in parallel, the independent set of its ancestors that are ready
//! (dependency-induced eviction, Figure 7), one wave at a time, each wave
//! followed by a backing FLUSH and a metadata commit.
//!
//! **Dummy nodes (§3.1.2).** After every `dummy_every` completions a dummy node
//! absorbs the completed nodes: later writes depend on the dummy instead of on
//! each of them. Each issue then adds at most `dummy_every + 1` edges, so the
//! number of live edges is bounded by `(dummy_every + 1) × (live write nodes +
//! live dummies)`, where live dummies are at most `live write nodes /
//! dummy_every + 1`. Without dummies a stream of n dependent writes costs up to
//! n²/2 edges.
//!
//! **Frontier reduction.** Beyond the paper, a node that completes drops from
//! the frontier every node it depends on: later writes reach those through it.
//! A queue-depth-1 stream then costs one edge per write instead of
//! `dummy_every / 2`. It only removes edges implied by transitivity.
//!
//! **Blocks with several versions.** A version made by a partial write carries
//! bytes of the block's previous version, and two writes in flight together
//! are not ordered by the graph. Waves therefore write each version's own
//! bytes only (its exact range). A latest version whose wave is done stays
//! dirty, outside any node, unless it covers the whole block and is its
//! block's only version; once no older version of its block is left, it is
//! written again whole (a *sync*), which only rewrites bytes of writes that are
//! all on the backing store already. One plan (wave or sync batch) is in flight
//! at a time, so a sync and a wave never race on a block.
//!
//! "Completion" here is the moment a write's data is in the cache (before its
//! reply): that is never later than the client's completion, so every real
//! dependency is captured (some extra, harmless ones may be added). With
//! reply events (`WritePolicy::set_reply_events`, the server) a completed
//! write joins the frontier only at the next `on_replies_sending`, which the
//! driver calls before any reply can reach a client: still no later than the
//! client's completion, and requests that arrived together (before their
//! replies went out) stay independent instead of forming a chain. Seen
//! completions are always a prefix of the completion indexes (`floor`), so
//! the entries' `(cidx, dfloor)` describe the graph as before.
//!
//! Crash story: every version carries its completion index and its dependency
//! floor (completions before its issue) in its slot entry, so recovery rebuilds
//! the same graph. Each wave ends with a backing FLUSH, so waves reach the
//! backing store in order. Their "clean" marks are committed lazily: a wave
//! (or sync) may start while earlier plans' marks are not yet durable as long
//! as it writes none of *their blocks*; a plan that would touch such a block
//! first waits for a metadata commit, and so does a plan that would write a
//! version whose own entry is not durable yet (`fresh`): otherwise a crash
//! could lose the version after its bytes reached the backing store, with an
//! older version of its block surviving in the cache to be served over them.
//! After a crash, recovery sees every
//! plan since the last durable marks as not done and destages those versions
//! again, in dependency order. Each such block was written by exactly one of
//! those plans and by nothing after it, so the backing store already holds
//! those very bytes: the rewrites change nothing, and the backing store stays
//! the prefix it was. (Committing after every wave instead costs a cache
//! device flush per wave; with the engine completing writes one at a time the
//! graph is a chain, a wave is one node, and destaging crawled at a few
//! waves per second.)

use super::{Group, Plan, PlanCtx, RecoveredVersion, WritePolicy};
use crate::config::{Config, WritePolicyKind};
use crate::layout::CommitRecord;

const UNSET: u64 = u64::MAX;
/// `aux0` of a dirty version whose own wave is done but whose block must still
/// be re-synced whole (see [`Ordered`]).
const ORPHAN: u64 = u64::MAX - 1;
const NO_GROUP: Group = u64::MAX;
/// Nodes one victim's ancestor walk may visit. The walk only picks *which*
/// ready nodes go first (the victim's own ancestors); ready nodes are also
/// kept in a list, so a walk cut short still leaves a wave to destage. With
/// a long chain (writes completed one at a time) an unbounded walk from each
/// of 16 victims cost more CPU per wave than the wave's I/O.
const ANCESTOR_VISITS: usize = 2048;

/// A wave's plan: its versions' own bytes, then a backing FLUSH and a
/// commit; `after`, the tag of the wave it is pipelined behind.
fn wave_plan(write: Vec<u32>, tag: u64, after: Option<u64>) -> Plan {
    Plan {
        write,
        drop: Vec::new(),
        atomic_group: None,
        commit_after: true,
        exact: true,
        tag,
        after,
    }
}

#[derive(Debug, Default)]
struct Node {
    preds: Vec<u32>,
    succs: Vec<u32>,
    slots: Vec<u32>,
    preds_left: u32,
    cidx: u64,
    dfloor: u64,
    completed: bool,
    /// Patches of this node's writes still held in RAM: the node is not
    /// ready until they are versions.
    pending: u32,
    destaged: bool,
    dummy: bool,
    live: bool,
    in_wave: bool,
    /// Completed, but no reply sent since (`Ordered::unseen`): no later
    /// write depends on it yet.
    unseen: bool,
    /// The last ancestor walk that reached this node (`Ordered::walk`).
    walk: u32,
}

impl Node {
    /// Ready to destage (but for a wave): live, completed, not a dummy, its
    /// patches versions, its predecessors destaged, not destaged itself.
    fn ready(&self) -> bool {
        self.live
            && self.completed
            && self.pending == 0
            && !self.dummy
            && !self.destaged
            && self.preds_left == 0
    }
}

/// See the module docs.
pub struct Ordered {
    nodes: Vec<Node>,
    free: Vec<u32>,
    unabsorbed: Vec<u32>,
    last_dummy: Option<u32>,
    dummy_every: u32,
    /// Apply the frontier's transitive reduction (on by default).
    pub reduce: bool,
    next_cidx: u64,
    /// The driver reports sent replies (`WritePolicy::set_reply_events`):
    /// a write counts as complete, for the writes issued after it, only once
    /// a reply may have been sent since its data reached the cache.
    reply_events: bool,
    /// Completed write nodes no later write depends on yet, in completion
    /// order (their completion indexes are the last ones given out).
    unseen: Vec<u32>,
    wave: Vec<u32>,
    /// Nodes that became ready (completed, no undestaged predecessor); may hold
    /// stale ids, checked when taken. Ready nodes never depend on each other.
    ready: Vec<u32>,
    wave_in_flight: bool,
    /// The tag (`Plan::tag`) of the wave in flight (`wave`).
    wave_tag: u64,
    /// Read the next wave while the wave in flight flushes
    /// (`Config::ordered_pipeline`).
    pipeline: bool,
    /// The pipelined wave: started while `wave` was in flight, its backing
    /// writes held until `wave` has ended (`Plan::after`); `next_tag` is 0
    /// when there is none.
    next_wave: Vec<u32>,
    next_tag: u64,
    /// The wave in flight (`wave_tag`) for which a pipelined wave was
    /// looked for: one look per wave, when its copies are written.
    pipe_tried: u64,
    sync_in_flight: bool,
    awaiting_commit: bool,
    commit_started: bool,
    /// Backing block of each slot's version (for the overlap rule above).
    slot_lbn: Vec<u64>,
    /// Blocks written by plans done since the last commit started (their
    /// clean marks are not durable yet), and by plans done before the
    /// commit in flight started (durable when it succeeds).
    unmarked: std::collections::HashSet<u64>,
    marking: std::collections::HashSet<u64>,
    /// Slots of versions installed since the last commit started (their
    /// entries are not durable yet), and of those the commit in flight
    /// records: no plan writes them to the backing store before their
    /// entries are durable (see `needs_marks`).
    fresh: std::collections::HashSet<u32>,
    freshing: std::collections::HashSet<u32>,
    scratch: Vec<(u32, Group)>,
    stack: Vec<u32>,
    /// The current ancestor walk's number: a node whose `walk` equals it
    /// is on the walk's stack or was visited already.
    walk: u32,
    /// Statistics.
    pub edges_live: u64,
    pub edges_max: u64,
    pub edges_total: u64,
    pub dummies_total: u64,
    pub waves: u64,
    /// Waves started while the previous wave was still in flight.
    pub waves_pipelined: u64,
    /// Edges the paper's rule without dummy nodes would have created: at each
    /// issue, one per completed write node not yet destaged (counted, not stored).
    pub raw_edges: u64,
    completed_live: u64,
    /// Versions that belong to a node (not yet written in their wave).
    versions_live: u64,
}

impl Ordered {
    pub fn new(cfg: &Config) -> Self {
        Ordered {
            nodes: Vec::new(),
            free: Vec::new(),
            unabsorbed: Vec::new(),
            last_dummy: None,
            dummy_every: cfg.dummy_every,
            reduce: cfg.ordered_reduction,
            next_cidx: 0,
            reply_events: false,
            unseen: Vec::new(),
            wave: Vec::new(),
            ready: Vec::new(),
            wave_in_flight: false,
            wave_tag: 0,
            pipeline: cfg.ordered_pipeline,
            next_wave: Vec::new(),
            next_tag: 0,
            pipe_tried: 0,
            sync_in_flight: false,
            awaiting_commit: false,
            commit_started: false,
            slot_lbn: Vec::new(),
            unmarked: Default::default(),
            marking: Default::default(),
            fresh: Default::default(),
            freshing: Default::default(),
            scratch: Vec::new(),
            stack: Vec::new(),
            walk: 0,
            edges_live: 0,
            edges_max: 0,
            edges_total: 0,
            dummies_total: 0,
            waves: 0,
            waves_pipelined: 0,
            raw_edges: 0,
            completed_live: 0,
            versions_live: 0,
        }
    }

    /// Live (not yet destaged) nodes, dummies included.
    pub fn live_nodes(&self) -> usize {
        self.nodes.iter().filter(|n| n.live && !n.destaged).count()
    }

    fn alloc(&mut self) -> u32 {
        let n = Node {
            live: true,
            cidx: UNSET,
            ..Default::default()
        };
        if let Some(id) = self.free.pop() {
            self.nodes[id as usize] = n;
            id
        } else {
            self.nodes.push(n);
            (self.nodes.len() - 1) as u32
        }
    }

    fn add_edge(&mut self, from: u32, to: u32) {
        debug_assert!(!self.nodes[from as usize].destaged);
        self.nodes[from as usize].succs.push(to);
        self.nodes[to as usize].preds.push(from);
        self.nodes[to as usize].preds_left += 1;
        self.edges_live += 1;
        self.edges_total += 1;
        self.edges_max = self.edges_max.max(self.edges_live);
    }

    /// Issue event: a new node depending on everything completed so far.
    fn issue(&mut self, dfloor: u64) -> u32 {
        self.raw_edges += self.completed_live;
        let id = self.alloc();
        self.nodes[id as usize].dfloor = dfloor;
        if let Some(d) = self.last_dummy {
            self.add_edge(d, id);
        }
        for i in 0..self.unabsorbed.len() {
            let p = self.unabsorbed[i];
            self.add_edge(p, id);
        }
        id
    }

    /// Completion event, seen at once by every later issue.
    fn complete(&mut self, id: u32, cidx: u64) {
        self.complete_data(id, cidx);
        self.make_seen(id);
    }

    /// Completion event: the write's data is in the cache. It may be
    /// destaged from now on; later writes depend on it from `make_seen`.
    fn complete_data(&mut self, id: u32, cidx: u64) {
        let n = &mut self.nodes[id as usize];
        assert!(
            n.live && !n.completed && !n.dummy,
            "node {id} completed twice"
        );
        n.completed = true;
        n.cidx = cidx;
        self.completed_live += 1;
        self.next_cidx = self.next_cidx.max(cidx + 1);
        if self.nodes[id as usize].preds_left == 0 && self.nodes[id as usize].pending == 0 {
            self.ready.push(id);
        }
    }

    /// Writes issued from now on depend on completed node `id`.
    fn make_seen(&mut self, id: u32) {
        if self.nodes[id as usize].destaged {
            // On the backing store already: nothing can come before it.
            return;
        }
        if self.reduce {
            // Transitive reduction of the frontier: a completed node that depends
            // on frontier nodes stands in for them (later writes reach them through it).
            let preds = std::mem::take(&mut self.nodes[id as usize].preds);
            self.unabsorbed.retain(|u| !preds.contains(u));
            self.nodes[id as usize].preds = preds;
        }
        self.unabsorbed.push(id);
        if self.dummy_every > 0 && self.unabsorbed.len() >= self.dummy_every as usize {
            let d = self.alloc();
            self.nodes[d as usize].dummy = true;
            self.nodes[d as usize].completed = true;
            self.dummies_total += 1;
            let preds = std::mem::take(&mut self.unabsorbed);
            for &p in &preds {
                self.add_edge(p, d);
            }
            if let Some(old) = self.last_dummy {
                self.add_edge(old, d);
            }
            self.unabsorbed = preds;
            self.unabsorbed.clear();
            self.last_dummy = Some(d);
            if self.nodes[d as usize].preds_left == 0 {
                self.mark_destaged(d);
            }
        }
    }

    /// The completion floor of a write issued now: every completion index
    /// below it is a write it depends on. Unseen nodes hold the last indexes
    /// given out, so the seen completions are exactly those below the first
    /// unseen one.
    fn floor(&self) -> u64 {
        self.unseen
            .first()
            .map_or(self.next_cidx, |&u| self.nodes[u as usize].cidx)
    }

    /// Node `id` is durable on the backing store: release its successors.
    fn mark_destaged(&mut self, id: u32) {
        let mut work = vec![id];
        while let Some(x) = work.pop() {
            let n = &mut self.nodes[x as usize];
            assert!(
                n.preds_left == 0,
                "node {x} destaged before its predecessors"
            );
            assert!(!n.destaged);
            n.destaged = true;
            if n.completed && !n.dummy {
                self.completed_live -= 1;
            }
            let succs = std::mem::take(&mut n.succs);
            self.edges_live -= succs.len() as u64;
            for s in succs {
                let sn = &mut self.nodes[s as usize];
                if let Some(pos) = sn.preds.iter().position(|&p| p == x) {
                    sn.preds.swap_remove(pos);
                }
                sn.preds_left -= 1;
                if sn.preds_left == 0 && sn.dummy && !sn.destaged {
                    work.push(s);
                } else if sn.preds_left == 0 && sn.completed && sn.pending == 0 && !sn.destaged {
                    self.ready.push(s);
                }
            }
            if let Some(pos) = self.unabsorbed.iter().position(|&p| p == x) {
                self.unabsorbed.swap_remove(pos);
            }
            if self.last_dummy == Some(x) {
                self.last_dummy = None;
            }
            self.maybe_free(x);
        }
    }

    fn maybe_free(&mut self, id: u32) {
        let n = &self.nodes[id as usize];
        if n.live
            && n.destaged
            && n.slots.is_empty()
            && n.pending == 0
            && n.succs.is_empty()
            && (n.completed || n.dummy)
            && !n.unseen
        {
            self.nodes[id as usize] = Node::default();
            self.free.push(id);
        }
    }

    fn set_slot_lbn(&mut self, slot: u32, lbn: u64) {
        if self.slot_lbn.len() <= slot as usize {
            self.slot_lbn.resize(slot as usize + 1, u64::MAX);
        }
        self.slot_lbn[slot as usize] = lbn;
    }

    fn lbn(&self, slot: u32) -> u64 {
        self.slot_lbn[slot as usize]
    }

    /// Does a plan writing `slots` have to wait for a metadata commit: to
    /// earlier plans' clean marks (it would rewrite one of their blocks), or
    /// to its own versions' entries? A version whose entry is not durable
    /// may be lost by a crash while an older version of its block survives
    /// in the cache; had its bytes reached the backing store, recovery would
    /// serve the older version over them, and a later write destaged before
    /// that block is synced again would put the backing store on a state no
    /// prefix of the order allows (the VOPR found it: ordered seed 17411).
    fn needs_marks(&self, slots: &[u32]) -> bool {
        let fresh = (!self.fresh.is_empty() || !self.freshing.is_empty())
            && slots
                .iter()
                .any(|s| self.fresh.contains(s) || self.freshing.contains(s));
        fresh
            || (!self.unmarked.is_empty() || !self.marking.is_empty() && !super::ignore_marking())
                && slots.iter().any(|&s| {
                    let l = self.lbn(s);
                    self.unmarked.contains(&l) || self.marking.contains(&l)
                })
    }

    fn node_needs_marks(&self, n: u32) -> bool {
        self.needs_marks(&self.nodes[n as usize].slots)
    }

    /// A new walk number (`Node::walk`): no node is marked with it yet.
    fn next_walk(&mut self) -> u32 {
        self.walk = self.walk.wrapping_add(1);
        if self.walk == 0 {
            // Wrapped: forget every mark, so no node looks visited.
            for n in &mut self.nodes {
                n.walk = 0;
            }
            self.walk = 1;
        }
        self.walk
    }

    /// Do the ready nodes outside a wave hold more than `limit` slots? Only
    /// then does a wave have to choose among them; otherwise it takes them
    /// all, and walking the victims' ancestors to choose (which, with the
    /// ready nodes far behind the victims, visits `ANCESTOR_VISITS` nodes
    /// per victim and finds none) would not change which nodes it takes.
    fn ready_over(&mut self, limit: usize) -> bool {
        let walk = self.next_walk();
        let mut slots = 0usize;
        for i in 0..self.ready.len() {
            let n = &mut self.nodes[self.ready[i] as usize];
            if n.walk == walk || !n.ready() || n.in_wave {
                continue;
            }
            n.walk = walk;
            slots += n.slots.len();
            if slots > limit {
                return true;
            }
        }
        false
    }

    /// Ready ancestors of `target` (itself included), at most `limit` slots'
    /// worth, in depth-first order. Each node is visited at most once per
    /// walk (`Node::walk`): the graph is a lattice of dummies and frontiers
    /// with many paths to a node, and a walk that revisited nodes spent its
    /// `ANCESTOR_VISITS` on revisits, each pushing up to `dummy_every`
    /// predecessors again (with the cache full of 64 KiB writes over a 1 ms
    /// backing store, about 3 ms of CPU per wave, on the wave's critical path).
    fn ready_ancestors(&mut self, target: u32, limit: usize, out: &mut Vec<u32>) {
        let walk = self.next_walk();
        self.stack.clear();
        self.stack.push(target);
        self.nodes[target as usize].walk = walk;
        let mut slots = 0usize;
        let mut visits = 0usize;
        while let Some(x) = self.stack.pop() {
            let n = &self.nodes[x as usize];
            if n.destaged || n.in_wave || !n.live {
                continue;
            }
            visits += 1;
            if visits > ANCESTOR_VISITS {
                break;
            }
            if n.preds_left == 0 {
                if n.completed && n.pending == 0 && !n.dummy && !out.contains(&x) {
                    slots += n.slots.len();
                    out.push(x);
                    if slots >= limit {
                        break;
                    }
                }
            } else {
                for i in 0..self.nodes[x as usize].preds.len() {
                    let p = self.nodes[x as usize].preds[i];
                    if self.nodes[p as usize].walk != walk {
                        self.nodes[p as usize].walk = walk;
                        self.stack.push(p);
                    }
                }
            }
        }
    }

    /// Mark `wave`'s nodes as in a wave; their versions, in order.
    fn take_wave(&mut self, wave: &[u32]) -> Vec<u32> {
        let mut write = Vec::new();
        for &n in wave {
            self.nodes[n as usize].in_wave = true;
            write.extend_from_slice(&self.nodes[n as usize].slots);
        }
        self.waves += 1;
        write
    }

    /// The wave in flight ended (or failed): the pipelined wave, if any,
    /// is the wave in flight now.
    fn wave_done(&mut self) {
        if self.next_tag == 0 {
            self.wave_in_flight = false;
            return;
        }
        self.wave = std::mem::take(&mut self.next_wave);
        self.wave_tag = std::mem::replace(&mut self.next_tag, 0);
    }

    /// The next wave, read while the wave in flight waits for its backing
    /// FLUSH: its writes are issued once that FLUSH is done (`Plan::after`),
    /// so every issue still follows the completion of everything it depends
    /// on, as without pipelining. Its nodes are those ready once the wave in
    /// flight is destaged (`virtually_ready`), and none writes a block that
    /// wave writes (the next wave would need that wave's clean marks, as
    /// `needs_marks` asks of later waves). It starts only when the wave in
    /// flight has written all its copies, so that it takes everything that
    /// completed meanwhile, and only when no version waits for a sync (a
    /// sync runs between waves, as without pipelining).
    fn pipelined_wave(&mut self, ctx: &mut dyn PlanCtx) -> Option<Plan> {
        if !self.pipeline
            || self.next_tag != 0
            || self.pipe_tried == self.wave_tag
            || ctx.copies_pending()
        {
            return None;
        }
        // One look per wave (each costs a walk of the wave's successors):
        // what completes during the FLUSH goes in the wave after.
        self.pipe_tried = self.wave_tag;
        let limit = ctx.destage_limit().max(1);
        let mut cand = Vec::new();
        // Ready now, left out of the wave in flight by its limit.
        let mut i = self.ready.len();
        while i > 0 && cand.len() < limit {
            i -= 1;
            let n = self.ready[i];
            let nd = &self.nodes[n as usize];
            if nd.ready() && !nd.in_wave && !cand.contains(&n) {
                cand.push(n);
            }
        }
        self.virtually_ready(limit, &mut cand);
        if cand.is_empty() {
            return None;
        }
        self.scratch.clear();
        ctx.pick_victims(limit.min(16), &mut self.scratch);
        if self.scratch.iter().any(|v| v.1 == NO_GROUP) {
            return None;
        }
        let busy: std::collections::HashSet<u64> = self
            .wave
            .iter()
            .flat_map(|&n| self.nodes[n as usize].slots.iter())
            .map(|&s| self.slot_lbn[s as usize])
            .collect();
        let mut wave = Vec::new();
        let mut slots = 0usize;
        for n in cand {
            if slots >= limit {
                break;
            }
            let nd = &self.nodes[n as usize];
            if nd.slots.is_empty()
                || nd
                    .slots
                    .iter()
                    .any(|&s| busy.contains(&self.slot_lbn[s as usize]))
                || self.node_needs_marks(n)
            {
                continue;
            }
            slots += nd.slots.len();
            wave.push(n);
        }
        if wave.is_empty() {
            return None;
        }
        let write = self.take_wave(&wave);
        self.next_wave = wave;
        self.next_tag = self.waves;
        self.waves_pipelined += 1;
        Some(wave_plan(write, self.next_tag, Some(self.wave_tag)))
    }

    /// Append to `out` (up to `limit` nodes in all) the nodes that become
    /// ready when the wave in flight is destaged: completed write nodes
    /// outside a wave, without patches, whose every remaining predecessor is
    /// in that wave or is a dummy that `mark_destaged` then destages too
    /// (all its own predecessors are).
    fn virtually_ready(&mut self, limit: usize, out: &mut Vec<u32>) {
        let walk = self.next_walk();
        self.stack.clear();
        for i in 0..self.wave.len() {
            let n = self.wave[i];
            self.nodes[n as usize].walk = walk;
            self.stack.push(n);
        }
        let mut visits = 0usize;
        while let Some(x) = self.stack.pop() {
            for i in 0..self.nodes[x as usize].succs.len() {
                let s = self.nodes[x as usize].succs[i];
                let sn = &self.nodes[s as usize];
                if sn.walk == walk || sn.destaged || !sn.live || sn.in_wave {
                    continue;
                }
                visits += 1;
                if visits > ANCESTOR_VISITS || out.len() >= limit {
                    return;
                }
                if !sn
                    .preds
                    .iter()
                    .all(|&p| self.nodes[p as usize].walk == walk)
                {
                    continue;
                }
                if sn.dummy {
                    self.nodes[s as usize].walk = walk;
                    self.stack.push(s);
                } else if sn.completed && sn.pending == 0 && !out.contains(&s) {
                    out.push(s);
                }
            }
        }
    }
}

impl WritePolicy for Ordered {
    fn kind(&self) -> WritePolicyKind {
        WritePolicyKind::Ordered
    }
    fn bypass_ok(&self) -> bool {
        self.versions_live == 0
    }
    /// A node not completed holds nothing up: nothing depends on it and it
    /// is never ready, so a write waiting for room can be a node already.
    fn issue_at_arrival(&self) -> bool {
        true
    }
    fn on_write_issue(&mut self, _now: u64, _seq: u64) -> Group {
        let d = self.floor();
        self.issue(d) as Group
    }
    fn on_write_data_done(&mut self, _now: u64, group: Group) {
        let c = self.next_cidx;
        if self.reply_events {
            self.complete_data(group as u32, c);
            self.nodes[group as usize].unseen = true;
            self.unseen.push(group as u32);
        } else {
            self.complete(group as u32, c);
        }
    }
    fn set_reply_events(&mut self, on: bool) {
        if !on {
            self.on_replies_sending(0);
        }
        self.reply_events = on;
    }
    /// Every write completed so far may have been acknowledged from now on:
    /// writes issued later depend on it. Safe because a client that saw a
    /// write's reply before sending another request had that reply sent
    /// before the request arrived, so before its issue here.
    fn on_replies_sending(&mut self, _now: u64) {
        let unseen = std::mem::take(&mut self.unseen);
        for &id in &unseen {
            self.nodes[id as usize].unseen = false;
            if crate::mutation::active(crate::mutation::Mutation::RepliesSeenWithoutEdges) {
                self.maybe_free(id);
                continue;
            }
            self.make_seen(id);
            self.maybe_free(id);
        }
        self.unseen = unseen;
        self.unseen.clear();
    }
    /// The completion index is in every version's entry (`entry_aux`).
    fn aux_changed_on_completion(&self, group: Group) -> &[u32] {
        &self.nodes[group as usize].slots
    }
    fn on_patch_pending(&mut self, group: Group) {
        let n = &mut self.nodes[group as usize];
        assert!(n.live && !n.destaged, "patch of a destaged node");
        n.pending += 1;
    }
    fn on_patch_done(&mut self, group: Group) {
        let n = &mut self.nodes[group as usize];
        assert!(n.pending > 0);
        n.pending -= 1;
        if n.pending == 0 && n.completed && n.preds_left == 0 && !n.destaged {
            self.ready.push(group as u32);
        }
    }
    /// A commit must not make a later write durable while an earlier,
    /// acknowledged write is only a patch in RAM: a crash would keep the later
    /// one and lose the earlier one, which no prefix of the order allows.
    fn commit_needs_patches_done(&self) -> bool {
        true
    }
    fn on_version_installed(&mut self, group: Group, slot: u32, lbn: u64, _seq: u64) {
        self.set_slot_lbn(slot, lbn);
        self.freshing.remove(&slot);
        self.fresh.insert(slot);
        let n = &mut self.nodes[group as usize];
        assert!(
            n.live && !n.destaged,
            "version installed into a destaged node"
        );
        n.slots.push(slot);
        self.versions_live += 1;
    }
    fn on_version_removed(&mut self, group: Group, slot: u32) {
        self.fresh.remove(&slot);
        self.freshing.remove(&slot);
        let n = &mut self.nodes[group as usize];
        if let Some(pos) = n.slots.iter().position(|&s| s == slot) {
            n.slots.swap_remove(pos);
            self.versions_live -= 1;
        }
        self.maybe_free(group as u32);
    }
    /// Every version is kept until its node is destaged (§3.1: "older copies of
    /// all data blocks must be preserved in the cache until each of them are written back").
    /// A version whose wave is done (outside any node) has its own bytes on
    /// the backing store already and is released.
    fn keep_superseded(&self, old: Group, _new: Group) -> bool {
        old != NO_GROUP
    }
    fn may_overwrite(&self, _old: Group, _new: Group) -> bool {
        false
    }
    fn inherits_dirty_range(&self) -> bool {
        false
    }
    fn next_plan(&mut self, ctx: &mut dyn PlanCtx) -> Option<Plan> {
        if self.sync_in_flight || self.awaiting_commit || !ctx.cleaning_wanted() {
            return None;
        }
        if self.wave_in_flight {
            return self.pipelined_wave(ctx);
        }
        self.scratch.clear();
        let limit = ctx.destage_limit().max(1);
        ctx.pick_victims(limit.min(16), &mut self.scratch);
        let victims = std::mem::take(&mut self.scratch);
        // Versions whose waves are done: re-sync whole blocks.
        let sync: Vec<u32> = victims
            .iter()
            .filter(|v| v.1 == NO_GROUP)
            .map(|v| v.0)
            .collect();
        let (sync, held): (Vec<u32>, Vec<u32>) =
            sync.into_iter().partition(|&s| !self.needs_marks(&[s]));
        if sync.is_empty() && !held.is_empty() {
            self.scratch = victims;
            self.awaiting_commit = true;
            self.commit_started = false;
            return None;
        }
        if !sync.is_empty() {
            self.scratch = victims;
            self.sync_in_flight = true;
            return Some(Plan {
                write: sync,
                tag: 0,
                ..Default::default()
            });
        }
        let mut wave = Vec::new();
        if self.ready_over(limit) {
            for &(_, g) in &victims {
                if (g as usize) >= self.nodes.len() {
                    continue;
                }
                self.ready_ancestors(g as u32, limit, &mut wave);
                if !wave.is_empty() {
                    break;
                }
            }
        }
        let mut held = 0usize;
        wave.retain(|&n| {
            let ok = !self.node_needs_marks(n);
            held += usize::from(!ok);
            ok
        });
        self.scratch = victims;
        // Drop stale entries so the list stays proportional to the graph.
        if self.ready.len() > 1024 && self.ready.len() > 2 * self.nodes.len() {
            let nodes = &self.nodes;
            self.ready.retain(|&n| nodes[n as usize].ready());
            self.ready.sort_unstable();
            self.ready.dedup();
        }
        // Fill the wave with other ready nodes: ready nodes are mutually
        // independent, so one flush and one commit cover more of them.
        let mut slots: usize = wave
            .iter()
            .map(|&n| self.nodes[n as usize].slots.len())
            .sum();
        let mut later = Vec::new();
        while slots < limit {
            let Some(n) = self.ready.pop() else { break };
            let nd = &self.nodes[n as usize];
            if nd.ready() && !nd.in_wave && !wave.contains(&n) {
                if self.node_needs_marks(n) {
                    held += 1;
                    later.push(n);
                    continue;
                }
                slots += self.nodes[n as usize].slots.len();
                wave.push(n);
            }
        }
        self.ready.extend(later);
        if wave.is_empty() {
            // The victims' nodes are not ready (or their blocks' latest versions
            // wait for older ones): destage the oldest ready node instead.
            let mut best: Option<(u64, u32)> = None;
            for (i, n) in self.nodes.iter().enumerate() {
                if n.ready()
                    && !n.in_wave
                    && !n.slots.is_empty()
                    && best.is_none_or(|b| n.cidx < b.0)
                    && !self.needs_marks(&n.slots)
                {
                    best = Some((n.cidx, i as u32));
                }
            }
            if let Some((_, id)) = best {
                wave.push(id);
            }
        }
        if wave.is_empty() {
            if held > 0 {
                // Ready work waits only for earlier plans' clean marks.
                self.awaiting_commit = true;
                self.commit_started = false;
            }
            return None;
        }
        let write = self.take_wave(&wave);
        self.wave = wave;
        self.wave_in_flight = true;
        self.wave_tag = self.waves;
        Some(wave_plan(write, self.waves, None))
    }
    fn on_plan_done(&mut self, _now: u64, plan: &Plan) {
        for &s in &plan.write {
            let l = self.lbn(s);
            self.unmarked.insert(l);
        }
        if plan.tag == 0 {
            self.sync_in_flight = false;
            return;
        }
        assert_eq!(
            plan.tag, self.wave_tag,
            "a pipelined wave ended before the wave it follows"
        );
        let wave = std::mem::take(&mut self.wave);
        for n in wave {
            self.nodes[n as usize].in_wave = false;
            self.mark_destaged(n);
        }
        self.wave_done();
    }
    fn on_plan_failed(&mut self, plan: &Plan) {
        if plan.tag == 0 {
            self.sync_in_flight = false;
            return;
        }
        let nodes = if plan.tag == self.wave_tag {
            std::mem::take(&mut self.wave)
        } else {
            // The pipelined wave failed first (a cache read).
            assert_eq!(plan.tag, self.next_tag, "an unknown wave failed");
            self.next_tag = 0;
            std::mem::take(&mut self.next_wave)
        };
        for n in nodes {
            self.nodes[n as usize].in_wave = false;
            // Ready again: back on the list (a wave takes its nodes off it).
            if self.nodes[n as usize].ready() {
                self.ready.push(n);
            }
        }
        if plan.tag == self.wave_tag {
            // A pipelined wave behind it is cancelled next (`Plan::after`).
            self.wave_done();
        }
    }
    fn entry_aux(&self, group: Group) -> (u64, u64) {
        if group == NO_GROUP {
            return (ORPHAN, 0);
        }
        match self.nodes.get(group as usize) {
            Some(n) if n.live => (n.cidx, n.dfloor),
            _ => (UNSET, 0),
        }
    }
    fn wants_commit(&self) -> bool {
        self.awaiting_commit && !self.commit_started
    }
    fn on_commit_start(&mut self) {
        if self.awaiting_commit {
            self.commit_started = true;
        }
        // This commit records every clean mark made so far, and every
        // version installed so far.
        let done: Vec<u64> = self.unmarked.drain().collect();
        self.marking.extend(done);
        let installed: Vec<u32> = self.fresh.drain().collect();
        self.freshing.extend(installed);
    }
    fn on_commit_done(&mut self, ok: bool) {
        if ok {
            self.marking.clear();
            self.freshing.clear();
        } else {
            let back: Vec<u64> = self.marking.drain().collect();
            self.unmarked.extend(back);
            let back: Vec<u32> = self.freshing.drain().collect();
            self.fresh.extend(back);
        }
        if self.commit_started {
            self.commit_started = false;
            if ok {
                self.awaiting_commit = false;
            }
        }
    }
    fn fill_commit(&self, rec: &mut CommitRecord) {
        rec.next_cidx = self.next_cidx;
    }
    fn recover(&mut self, rec: &CommitRecord, versions: &mut [RecoveredVersion]) {
        // Nodes are identified by their completion index. A version whose write
        // had not completed (cidx unset) was never acknowledged; it is kept (a
        // write in flight may survive a crash), completing after every known
        // node: nothing depended on it. Discarding it instead could expose an
        // older version whose bytes are older than what the backing store holds.
        let mut by_cidx: std::collections::BTreeMap<u64, (u64, Vec<usize>)> = Default::default();
        let mut unset: std::collections::BTreeMap<u64, (u64, Vec<usize>)> = Default::default();
        for (i, v) in versions.iter_mut().enumerate() {
            self.set_slot_lbn(v.slot, v.lbn);
            if !v.dirty {
                v.discard = !v.latest;
                v.clean = true;
                v.group = UNSET;
                continue;
            }
            if v.aux0 == UNSET {
                unset.entry(v.seq).or_insert((v.aux1, Vec::new())).1.push(i);
                continue;
            }
            if v.aux0 == ORPHAN {
                v.group = NO_GROUP;
                continue;
            }
            by_cidx
                .entry(v.aux0)
                .or_insert((v.aux1, Vec::new()))
                .1
                .push(i);
        }
        let next = by_cidx
            .keys()
            .next_back()
            .map_or(rec.next_cidx, |&c| (c + 1).max(rec.next_cidx));
        for (k, (_, (d, idxs))) in unset.into_iter().enumerate() {
            by_cidx.insert(next + k as u64, (d, idxs));
        }
        // Replay issue and completion events in their original order:
        // issue with floor d sits between completion d-1 and completion d.
        let mut events: Vec<(u64, u64)> = Vec::new();
        for (&c, &(d, _)) in &by_cidx {
            events.push((2 * d, c));
            events.push((2 * c + 1, c));
        }
        events.sort();
        let mut ids = std::collections::HashMap::new();
        for (key, c) in events {
            if key % 2 == 0 {
                let id = self.issue(by_cidx[&c].0);
                ids.insert(c, id);
            } else {
                let id = ids[&c];
                self.complete(id, c);
            }
        }
        for (c, (_, idxs)) in by_cidx {
            let id = ids[&c];
            for i in idxs {
                versions[i].group = id as Group;
                self.nodes[id as usize].slots.push(versions[i].slot);
                self.versions_live += 1;
            }
        }
        self.next_cidx = self.next_cidx.max(rec.next_cidx);
    }
    fn mem_bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<Node>()
            + self.slot_lbn.capacity() * 8
            + (self.unmarked.capacity() + self.marking.capacity()) * 8
            + (self.fresh.capacity() + self.freshing.capacity()) * 4
            + self.unseen.capacity() * 4
            + self
                .nodes
                .iter()
                .map(|n| (n.preds.capacity() + n.succs.capacity() + n.slots.capacity()) * 4)
                .sum::<usize>()
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("ordered_edges_live", self.edges_live),
            ("ordered_edges_max", self.edges_max),
            ("ordered_edges_total", self.edges_total),
            ("ordered_dummies", self.dummies_total),
            ("ordered_waves", self.waves),
            ("ordered_waves_pipelined", self.waves_pipelined),
            ("ordered_raw_rule_edges", self.raw_edges),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version installed whose entry a commit has made durable since
    /// (`Ordered::fresh` is what a wave waits on otherwise; the tests of
    /// that rule install with `on_version_installed` itself).
    trait InstallDurable {
        fn install_durable(&mut self, g: Group, slot: u32, lbn: u64, seq: u64);
    }

    impl InstallDurable for Ordered {
        fn install_durable(&mut self, g: Group, slot: u32, lbn: u64, seq: u64) {
            self.on_version_installed(g, slot, lbn, seq);
            self.fresh.remove(&slot);
        }
    }

    fn pol(dummy: u32) -> Ordered {
        let mut c = Config::new(4096, 64, 1 << 20, WritePolicyKind::Ordered);
        c.dummy_every = dummy;
        Ordered::new(&c)
    }

    /// Figure 6's sequence on `o`: I1, I2, C1, C2, I3, I4, C3, C4, I5; the
    /// five writes' nodes.
    fn figure6(o: &mut Ordered) -> [u64; 5] {
        let n1 = o.on_write_issue(0, 1);
        let n2 = o.on_write_issue(0, 2);
        o.on_write_data_done(0, n1);
        o.on_write_data_done(0, n2);
        let n3 = o.on_write_issue(0, 3);
        let n4 = o.on_write_issue(0, 4);
        o.on_write_data_done(0, n3);
        o.on_write_data_done(0, n4);
        let n5 = o.on_write_issue(0, 5);
        [n1, n2, n3, n4, n5]
    }

    #[test]
    fn with_reply_events_a_write_counts_once_replies_may_be_seen() {
        let preds = |o: &Ordered, n: Group| sorted(o.nodes[n as usize].preds.clone());
        let mut o = pol(0);
        o.set_reply_events(true);
        let a = o.on_write_issue(0, 1);
        o.on_write_data_done(0, a);
        // b arrived before any reply went out: the client cannot have seen
        // a's, so b does not depend on a.
        let b = o.on_write_issue(0, 2);
        assert!(preds(&o, b).is_empty());
        assert_eq!(o.entry_aux(b), (UNSET, 0), "floor: no completion seen");
        o.on_write_data_done(0, b);
        assert_eq!(o.entry_aux(a), (0, 0));
        assert_eq!(o.entry_aux(b), (1, 0));
        // Both are ready at once: one wave.
        assert_eq!(sorted(o.ready.clone()), sorted(vec![a as u32, b as u32]));
        o.on_replies_sending(0);
        let c = o.on_write_issue(0, 3);
        assert_eq!(preds(&o, c), sorted(vec![a as u32, b as u32]));
        assert_eq!(o.entry_aux(c).1, 2);
        // Replies going out with nothing new completed change nothing.
        o.on_replies_sending(0);
        let d = o.on_write_issue(0, 4);
        assert_eq!(preds(&o, d), sorted(vec![a as u32, b as u32]));
        // Without the events, b depends on a.
        let mut q = pol(0);
        let a = q.on_write_issue(0, 1);
        q.on_write_data_done(0, a);
        let b = q.on_write_issue(0, 2);
        assert_eq!(preds(&q, b), vec![a as u32]);
        assert_eq!(q.entry_aux(b), (UNSET, 1));
    }

    #[test]
    fn a_write_destaged_before_its_reply_is_kept_until_then_and_adds_no_edge() {
        let mut o = pol(0);
        o.set_reply_events(true);
        let a = o.on_write_issue(0, 1);
        o.on_write_data_done(0, a);
        o.mark_destaged(a as u32);
        assert!(
            o.nodes[a as usize].live,
            "freed while a reply may still name it"
        );
        o.on_replies_sending(0);
        assert!(!o.nodes[a as usize].live && o.free.contains(&(a as u32)));
        assert!(o.unabsorbed.is_empty());
        let b = o.on_write_issue(0, 2);
        assert!(o.nodes[b as usize].preds.is_empty());
        assert_eq!(o.entry_aux(b).1, 1, "a is below b's floor");
    }

    #[test]
    fn unseen_completions_reach_a_dummy_once_seen() {
        let mut o = pol(2);
        o.set_reply_events(true);
        let ids: Vec<Group> = (0..3).map(|i| o.on_write_issue(0, i)).collect();
        for &g in &ids {
            o.on_write_data_done(0, g);
        }
        assert_eq!(o.dummies_total, 0, "no completion seen yet");
        o.on_replies_sending(0);
        assert_eq!(o.dummies_total, 1);
        // Turning the events off sees what is pending.
        let x = o.on_write_issue(0, 9);
        o.on_write_data_done(0, x);
        o.set_reply_events(false);
        assert!(o.unseen.is_empty() && !o.nodes[x as usize].unseen);
        assert!(o.unabsorbed.contains(&(x as u32)));
    }

    #[test]
    fn recovery_rebuilds_a_graph_built_with_reply_events() {
        let mut o = pol(0);
        o.set_reply_events(true);
        let a = o.on_write_issue(0, 1);
        o.on_write_data_done(0, a);
        let b = o.on_write_issue(0, 2);
        o.on_write_data_done(0, b);
        o.on_replies_sending(0);
        let c = o.on_write_issue(0, 3);
        o.on_write_data_done(0, c);
        let aux: Vec<(u64, u64)> = [a, b, c].iter().map(|&g| o.entry_aux(g)).collect();
        let mut vs: Vec<RecoveredVersion> = (0..3)
            .map(|i| version(i as u32, 10 + i, 1 + i, aux[i as usize]))
            .collect();
        let mut r = pol(0);
        r.recover(&CommitRecord::default(), &mut vs);
        let g: Vec<Group> = vs.iter().map(|v| v.group).collect();
        let preds = |n: Group| sorted(r.nodes[n as usize].preds.clone());
        assert!(preds(g[0]).is_empty() && preds(g[1]).is_empty());
        assert_eq!(preds(g[2]), sorted(vec![g[0] as u32, g[1] as u32]));
    }

    #[test]
    fn a_wave_waits_until_its_versions_entries_are_durable() {
        // a's version is installed, its entry not yet committed: a crash
        // could lose it while the backing store had its bytes.
        let mut o = pol(0);
        let a = o.on_write_issue(0, 1);
        o.on_version_installed(a, 0, 10, 1);
        o.on_write_data_done(0, a);
        assert!(o.next_plan(&mut ctx(&[(0, a)])).is_none());
        assert!(o.wants_commit(), "it asks for the commit it waits for");
        o.on_commit_start();
        // The commit in flight records the entry: still not durable.
        assert!(o.next_plan(&mut ctx(&[(0, a)])).is_none());
        // A failed commit leaves it to the next one.
        o.on_commit_done(false);
        assert!(o.next_plan(&mut ctx(&[(0, a)])).is_none());
        o.on_commit_start();
        o.on_commit_done(true);
        let p = o.next_plan(&mut ctx(&[(0, a)])).expect("a's wave");
        assert_eq!(p.write, vec![0]);
        // A version installed while a commit is in flight waits for the next.
        let b = o.on_write_issue(0, 2);
        o.on_commit_start();
        o.on_version_installed(b, 1, 11, 2);
        o.on_write_data_done(0, b);
        o.on_commit_done(true);
        assert!(o.needs_marks(&[1]));
        // A removed version's slot is not held back.
        o.on_version_removed(b, 1);
        assert!(!o.needs_marks(&[1]));
    }

    #[test]
    fn figure6_graph() {
        // I1, I2, C1, C2, I3, I4, C3, C4, I5 (§3.1.1): 3 and 4 depend on 1 and 2; 5 on all.
        let mut o = pol(0);
        let [n1, n2, n3, n4, n5] = figure6(&mut o);
        let preds = |o: &Ordered, n: u64| {
            let mut p = o.nodes[n as usize].preds.clone();
            p.sort();
            p
        };
        assert!(preds(&o, n1).is_empty() && preds(&o, n2).is_empty());
        assert_eq!(preds(&o, n3), vec![n1 as u32, n2 as u32]);
        assert_eq!(preds(&o, n4), vec![n1 as u32, n2 as u32]);
        // Figure 6 draws 5 after 3 and 4 (its edges from 1 and 2 are implied):
        // that is what the frontier reduction keeps; the raw rule adds all four.
        assert_eq!(preds(&o, n5), vec![n3 as u32, n4 as u32]);
        let mut raw = pol(0);
        raw.reduce = false;
        let [.., e] = figure6(&mut raw);
        assert_eq!(preds(&raw, e).len(), 4);
    }

    /// Issue `sets` rounds of `width` writes; each round starts after the previous one completed.
    fn rounds(o: &mut Ordered, sets: u64, width: u64) {
        let mut seq = 0;
        for _ in 0..sets {
            let ids: Vec<u64> = (0..width)
                .map(|_| {
                    seq += 1;
                    o.on_write_issue(0, seq)
                })
                .collect();
            for g in ids {
                o.on_write_data_done(0, g);
            }
        }
    }

    #[test]
    fn dummy_nodes_bound_edges_on_a_million_writes() {
        // One million writes, issued in rounds of 8 concurrent writes (each round
        // depends on the whole previous one), nothing destaged.
        let k = 100u64;
        let mut o = pol(k as u32);
        o.reduce = false;
        rounds(&mut o, 125_000, 8);
        let live_writes = 1_000_000u64;
        let bound = (k + 1) * (live_writes + live_writes / k + 1);
        assert!(
            o.edges_live <= bound,
            "edges {} above the documented bound {bound}",
            o.edges_live
        );
        let per_write = o.edges_live as f64 / live_writes as f64;
        assert!(per_write <= (k + 1) as f64, "{per_write} edges per write");
        // With the frontier reduction a round of width w costs about w*w edges / w writes.
        let mut r = pol(k as u32);
        rounds(&mut r, 125_000, 8);
        assert!(
            r.edges_live <= 9 * 1_000_000,
            "reduced graph has {} edges",
            r.edges_live
        );
        assert!(r.edges_live < o.edges_live);
    }

    #[test]
    fn without_dummies_edges_grow_quadratically() {
        // Figure 8: two sets of 4 independent writes: 16 edges without the dummy, 8 with it.
        let mut plain = pol(0);
        plain.reduce = false;
        rounds(&mut plain, 2, 4);
        let ids: Vec<u64> = (0..4).map(|i| plain.on_write_issue(0, 100 + i)).collect();
        assert_eq!(ids.len(), 4);
        assert_eq!(
            plain.edges_live,
            16 + 32,
            "each of the 4 new writes depends on all 8 completed ones"
        );
        let mut d = pol(4);
        d.reduce = false;
        rounds(&mut d, 2, 4);
        for i in 0..4 {
            d.on_write_issue(0, 100 + i);
        }
        // 16 edges round1->round2 + 4+1 into the second dummy + 4 out of it... bounded by (k+1) per node.
        assert!(
            d.edges_live < plain.edges_live,
            "{} vs {}",
            d.edges_live,
            plain.edges_live
        );
        // A chain without dummies: n(n-1)/2 edges.
        let mut c = pol(0);
        c.reduce = false;
        rounds(&mut c, 2000, 1);
        assert_eq!(c.edges_live, 2000 * 1999 / 2);
        let mut cr = pol(0);
        rounds(&mut cr, 2000, 1);
        assert_eq!(
            cr.edges_live, 1999,
            "frontier reduction: one edge per write in a chain"
        );
    }

    #[test]
    fn destage_respects_dependencies() {
        let mut o = pol(3);
        let mut ids = Vec::new();
        for i in 0..10 {
            let g = o.on_write_issue(0, i);
            o.install_durable(g, i as u32, i, i);
            o.on_write_data_done(0, g);
            ids.push(g as u32);
        }
        // Only the first node is ready; asking for the last pulls in the first.
        let mut out = Vec::new();
        o.ready_ancestors(ids[9], 100, &mut out);
        assert_eq!(out, vec![ids[0]]);
        o.mark_destaged(ids[0]);
        out.clear();
        o.ready_ancestors(ids[9], 100, &mut out);
        assert_eq!(out, vec![ids[1]]);
    }

    /// A planning context for `next_plan`: fixed victims and limit.
    struct Ctx {
        want: bool,
        victims: Vec<(u32, Group)>,
        limit: usize,
        copies_pending: bool,
    }

    impl PlanCtx for Ctx {
        fn now(&self) -> u64 {
            0
        }
        fn cleaning_wanted(&self) -> bool {
            self.want
        }
        fn pick_victims(&mut self, max: usize, out: &mut Vec<(u32, Group)>) {
            out.extend(self.victims.iter().take(max));
        }
        fn space_pressure(&self) -> bool {
            false
        }
        fn destage_in_flight(&self) -> usize {
            0
        }
        fn destage_limit(&self) -> usize {
            self.limit
        }
        fn copies_pending(&self) -> bool {
            self.copies_pending
        }
    }

    fn ctx(victims: &[(u32, Group)]) -> Ctx {
        Ctx {
            want: true,
            victims: victims.to_vec(),
            limit: 16,
            copies_pending: false,
        }
    }

    fn sorted(mut v: Vec<u32>) -> Vec<u32> {
        v.sort();
        v
    }

    /// Issue a write, install its version (`slot`, `lbn`), complete it.
    fn write(o: &mut Ordered, seq: u64, slot: u32, lbn: u64) -> Group {
        let g = o.on_write_issue(0, seq);
        o.install_durable(g, slot, lbn, seq);
        o.on_write_data_done(0, g);
        g
    }

    /// Write 1 (slot 0, block 10), destaged by a wave that is done: block
    /// 10's clean mark is not durable yet.
    fn first_wave_done(o: &mut Ordered) {
        let a = write(o, 1, 0, 10);
        let p = o.next_plan(&mut ctx(&[(0, a)])).expect("write 1's wave");
        o.on_plan_done(0, &p);
    }

    #[test]
    fn statistics_and_live_nodes_follow_the_graph() {
        let mut o = pol(0);
        assert_eq!(o.live_nodes(), 0);
        let [n1, n2, n3, n4, n5] = figure6(&mut o);
        assert_eq!(o.live_nodes(), 5);
        // 3 and 4 each depend on 1 and 2, 5 on 3 and 4; the raw rule: 2 + 2 + 4.
        let c = |o: &Ordered| o.counters();
        assert_eq!(
            c(&o),
            vec![
                ("ordered_edges_live", 6),
                ("ordered_edges_max", 6),
                ("ordered_edges_total", 6),
                ("ordered_dummies", 0),
                ("ordered_waves", 0),
                ("ordered_waves_pipelined", 0),
                ("ordered_raw_rule_edges", 8),
            ]
        );
        // Completion indexes in completion order; 5's floor is the 4 completions before it.
        assert_eq!(o.entry_aux(n1), (0, 0));
        assert_eq!(o.entry_aux(n2), (1, 0));
        assert_eq!(o.entry_aux(n3), (2, 2));
        assert_eq!(o.entry_aux(n4), (3, 2));
        assert_eq!(o.entry_aux(n5), (UNSET, 4));
        assert_eq!(o.entry_aux(NO_GROUP), (ORPHAN, 0));
        assert_ne!(ORPHAN, UNSET);
        let mut rec = CommitRecord::default();
        o.fill_commit(&mut rec);
        assert_eq!(rec.next_cidx, 4);
        // Destaging 1 (no versions: freed) removes its two edges; 3 and 4 still wait for 2.
        o.mark_destaged(n1 as u32);
        assert_eq!(o.live_nodes(), 4);
        assert_eq!(
            o.entry_aux(n1),
            (UNSET, 0),
            "a freed node has no entry fields"
        );
        assert_eq!(o.nodes[n3 as usize].preds_left, 1);
        assert!(!o.nodes[n3 as usize].ready());
        o.mark_destaged(n2 as u32);
        assert!(o.nodes[n3 as usize].ready() && o.nodes[n4 as usize].ready());
        assert!(o.ready.contains(&(n3 as u32)) && o.ready.contains(&(n4 as u32)));
        assert_eq!(o.live_nodes(), 3);
        // 3 and 4 are completed and not destaged: a new write counts two raw edges.
        o.on_write_issue(0, 6);
        assert_eq!(
            c(&o),
            vec![
                ("ordered_edges_live", 4),
                ("ordered_edges_max", 6),
                ("ordered_edges_total", 8),
                ("ordered_dummies", 0),
                ("ordered_waves", 0),
                ("ordered_waves_pipelined", 0),
                ("ordered_raw_rule_edges", 10),
            ]
        );
    }

    #[test]
    fn a_dummy_is_destaged_with_its_last_predecessor() {
        let mut o = pol(2);
        let a = o.on_write_issue(0, 1) as u32;
        let b = o.on_write_issue(0, 2) as u32;
        o.on_write_data_done(0, a as Group);
        assert_eq!(o.dummies_total, 0);
        o.on_write_data_done(0, b as Group);
        // Two completions: a dummy absorbs them; the next write depends on it alone.
        assert_eq!(o.dummies_total, 1);
        let d = o.last_dummy.expect("a dummy");
        assert!(o.unabsorbed.is_empty());
        let c = o.on_write_issue(0, 3) as u32;
        assert_eq!(o.nodes[c as usize].preds, vec![d]);
        assert_eq!(o.edges_live, 3);
        assert_eq!(o.live_nodes(), 4);
        o.mark_destaged(a);
        assert!(!o.nodes[d as usize].destaged);
        assert_eq!(o.nodes[c as usize].preds_left, 1);
        o.mark_destaged(b);
        // The dummy went with b, and released c (not completed: not ready yet).
        assert_eq!(o.last_dummy, None);
        assert_eq!(o.nodes[c as usize].preds_left, 0);
        assert!(o.nodes[c as usize].preds.is_empty());
        assert_eq!(o.edges_live, 0);
        assert_eq!(o.live_nodes(), 1);
        assert!(!o.ready.contains(&c));
        o.on_write_data_done(0, c as Group);
        assert!(o.nodes[c as usize].ready());
        assert_eq!(o.ready, vec![a, b, c]);
    }

    #[test]
    fn a_patch_holds_its_node_back_until_it_is_a_version() {
        let mut o = pol(0);
        let a = o.on_write_issue(0, 1);
        o.install_durable(a, 0, 10, 1);
        o.on_patch_pending(a);
        o.on_patch_pending(a);
        o.on_write_data_done(0, a);
        assert!(!o.nodes[a as usize].ready());
        assert!(o.ready.is_empty());
        assert!(o.next_plan(&mut ctx(&[(0, a)])).is_none());
        o.on_patch_done(a);
        assert!(o.ready.is_empty(), "one patch left");
        assert!(o.next_plan(&mut ctx(&[(0, a)])).is_none());
        o.on_patch_done(a);
        assert_eq!(o.ready, vec![a as u32]);
        let p = o.next_plan(&mut ctx(&[(0, a)])).expect("a wave");
        assert_eq!(p.write, vec![0]);
    }

    #[test]
    fn waves_follow_the_graph_and_wait_for_clean_marks() {
        let mut o = pol(0);
        assert_eq!(o.kind(), WritePolicyKind::Ordered);
        assert!(o.commit_needs_patches_done());
        assert!(!o.may_overwrite(0, 1) && !o.inherits_dirty_range());
        assert!(o.issue_at_arrival());
        assert!(o.bypass_ok());
        // a and b in flight together, then c (a's block again) after both.
        let a = o.on_write_issue(0, 1);
        let b = o.on_write_issue(0, 2);
        o.install_durable(a, 0, 10, 1);
        o.install_durable(b, 1, 11, 2);
        o.on_write_data_done(0, a);
        o.on_write_data_done(0, b);
        let c = write(&mut o, 3, 2, 10);
        assert!(!o.bypass_ok());
        assert!(o.keep_superseded(a, c) && !o.keep_superseded(NO_GROUP, c));
        assert_eq!(o.aux_changed_on_completion(c), &[2]);
        assert!(!o.wants_commit());
        let mut idle = ctx(&[(2, c)]);
        idle.want = false;
        assert!(o.next_plan(&mut idle).is_none());
        // The victim c is not ready: its ready ancestors a and b go first.
        let p = o.next_plan(&mut ctx(&[(2, c)])).expect("a wave");
        assert_eq!(sorted(p.write.clone()), vec![0, 1]);
        assert!(p.commit_after && p.exact && p.drop.is_empty() && p.atomic_group.is_none());
        assert_eq!(p.tag, 1);
        assert_eq!(o.waves, 1);
        assert!(o.nodes[a as usize].in_wave && o.nodes[b as usize].in_wave);
        assert!(
            o.next_plan(&mut ctx(&[(2, c)])).is_none(),
            "no pipelined wave: c writes block 10, which the wave in flight writes"
        );
        o.on_plan_done(0, &p);
        assert!(!o.nodes[a as usize].in_wave);
        assert!(o.nodes[c as usize].ready());
        // c rewrites block 10, whose clean mark is not committed yet: wait for a commit.
        assert!(o.next_plan(&mut ctx(&[(2, c)])).is_none());
        assert!(o.wants_commit());
        o.on_commit_start();
        assert!(!o.wants_commit());
        assert!(o.next_plan(&mut ctx(&[(2, c)])).is_none());
        o.on_commit_done(false);
        assert!(o.wants_commit(), "a failed commit is retried");
        assert!(o.next_plan(&mut ctx(&[(2, c)])).is_none());
        o.on_commit_start();
        o.on_commit_done(true);
        assert!(!o.wants_commit());
        let p = o.next_plan(&mut ctx(&[(2, c)])).expect("c's wave");
        assert_eq!((p.write.clone(), p.tag), (vec![2], 2));
        // A failed wave is planned again.
        o.on_plan_failed(&p);
        assert!(!o.nodes[c as usize].in_wave && !o.nodes[c as usize].destaged);
        let p = o.next_plan(&mut ctx(&[(2, c)])).expect("c's wave again");
        assert_eq!((p.write.clone(), p.tag), (vec![2], 3));
        o.on_plan_done(0, &p);
        assert!(o.nodes[c as usize].destaged);
        for (g, s) in [(a, 0), (b, 1), (c, 2)] {
            o.on_version_removed(g, s);
        }
        assert!(o.bypass_ok());
        assert_eq!(o.live_nodes(), 0);
        assert_eq!(o.counters()[4], ("ordered_waves", 3));
    }

    #[test]
    fn a_version_outside_any_node_is_synced_whole_once_its_mark_is_durable() {
        let mut o = pol(0);
        first_wave_done(&mut o);
        // The engine keeps slot 0 dirty outside any node (NO_GROUP): a sync
        // must wait for the wave's clean mark on block 10.
        assert!(o.next_plan(&mut ctx(&[(0, NO_GROUP)])).is_none());
        assert!(o.wants_commit());
        o.on_commit_start();
        o.on_commit_done(true);
        let s = o.next_plan(&mut ctx(&[(0, NO_GROUP)])).expect("a sync");
        assert_eq!(
            (s.write.clone(), s.tag, s.commit_after),
            (vec![0], 0, false)
        );
        assert!(
            o.next_plan(&mut ctx(&[(0, NO_GROUP)])).is_none(),
            "one plan at a time"
        );
        o.on_plan_failed(&s);
        let s = o
            .next_plan(&mut ctx(&[(0, NO_GROUP)]))
            .expect("the sync again");
        o.on_plan_done(0, &s);
        assert!(o.unmarked.contains(&10));
        // A sync done leaves the wave counter alone and plans no more.
        assert_eq!(o.waves, 1);
        let b = write(&mut o, 2, 1, 11);
        let p = o.next_plan(&mut ctx(&[(1, b)])).expect("b's wave");
        assert_eq!(p.write, vec![1]);
    }

    #[test]
    fn a_wave_takes_the_victims_ready_ancestors_first_up_to_the_limit() {
        // a, b and x in flight together; c issued after a and b completed,
        // before x did: c depends on a and b, not on x. All of a, b, x ready.
        let setup = || {
            let mut o = pol(0);
            let a = o.on_write_issue(0, 1);
            let b = o.on_write_issue(0, 2);
            let x = o.on_write_issue(0, 3);
            for (g, s) in [(a, 0), (b, 1), (x, 2)] {
                o.install_durable(g, s, 10 + u64::from(s), g);
            }
            o.on_write_data_done(0, a);
            o.on_write_data_done(0, b);
            let c = o.on_write_issue(0, 4);
            o.install_durable(c, 3, 13, 4);
            o.on_write_data_done(0, x);
            o.on_write_data_done(0, c);
            (o, c)
        };
        let plan = |limit: usize| {
            let (mut o, c) = setup();
            let mut cx = ctx(&[(3, c)]);
            cx.limit = limit;
            sorted(o.next_plan(&mut cx).expect("a wave").write)
        };
        // Two slots: the victim's ancestors, not x (the newest ready node).
        assert_eq!(plan(2), vec![0, 1]);
        // One slot: one ancestor only.
        assert_eq!(plan(1).len(), 1);
        // Room for more: the other ready nodes fill the wave.
        assert_eq!(plan(16), vec![0, 1, 2]);
    }

    fn version(slot: u32, lbn: u64, seq: u64, aux: (u64, u64)) -> RecoveredVersion {
        RecoveredVersion {
            slot,
            lbn,
            seq,
            aux0: aux.0,
            aux1: aux.1,
            lo: 0,
            hi: 4096,
            dirty: true,
            partial: false,
            latest: true,
            group: 0,
            discard: false,
            clean: false,
        }
    }

    #[test]
    fn recovery_rebuilds_the_graph_from_the_entries() {
        // a and b concurrent, c after both, d and e after c and never completed.
        let mut o = pol(0);
        let a = o.on_write_issue(0, 1);
        let b = o.on_write_issue(0, 2);
        o.on_write_data_done(0, a);
        o.on_write_data_done(0, b);
        let c = o.on_write_issue(0, 3);
        o.on_write_data_done(0, c);
        let d = o.on_write_issue(0, 4);
        let e = o.on_write_issue(0, 5);
        let aux: Vec<(u64, u64)> = [a, b, c, d, e].iter().map(|&g| o.entry_aux(g)).collect();
        let mut vs = vec![
            version(0, 10, 1, aux[0]),
            version(1, 11, 2, aux[1]),
            version(2, 12, 3, aux[2]),
            version(3, 13, 4, aux[3]),
            version(4, 14, 5, aux[4]),
            version(5, 15, 6, o.entry_aux(NO_GROUP)),
            RecoveredVersion {
                dirty: false,
                latest: false,
                ..version(6, 10, 0, (UNSET, 0))
            },
            RecoveredVersion {
                dirty: false,
                ..version(7, 16, 0, (UNSET, 0))
            },
        ];
        // An older commit record: the entries say more.
        let rec = CommitRecord::default();
        let mut r = pol(0);
        r.recover(&rec, &mut vs);
        let g: Vec<Group> = vs.iter().map(|v| v.group).collect();
        // The unfinished writes complete after every known node, in sequence order.
        let cidx: Vec<u64> = g[..5].iter().map(|&g| r.entry_aux(g).0).collect();
        assert_eq!(cidx, vec![0, 1, 2, 3, 4]);
        assert_eq!(r.entry_aux(g[2]), (2, 2));
        assert_eq!(r.entry_aux(g[3]).1, 3);
        let preds = |n: Group| sorted(r.nodes[n as usize].preds.clone());
        assert!(preds(g[0]).is_empty() && preds(g[1]).is_empty());
        assert_eq!(preds(g[2]), sorted(vec![g[0] as u32, g[1] as u32]));
        assert_eq!(preds(g[3]), vec![g[2] as u32]);
        assert_eq!(preds(g[4]), vec![g[2] as u32]);
        for i in 0..5 {
            assert_eq!(r.nodes[g[i] as usize].slots, vec![i as u32]);
            assert!(!vs[i].discard && !vs[i].clean);
        }
        assert_eq!(g[5], NO_GROUP);
        assert!(!vs[5].clean && !vs[5].discard);
        assert!(
            vs[6].clean && vs[6].discard,
            "an older clean version is dropped"
        );
        assert!(
            vs[7].clean && !vs[7].discard,
            "a latest clean version is kept"
        );
        assert_eq!(r.versions_live, 5);
        assert!(!r.bypass_ok());
        assert_eq!(r.lbn(5), 15);
        let mut out = CommitRecord::default();
        r.fill_commit(&mut out);
        assert_eq!(out.next_cidx, 5);
        // A newer record than the entries: the counter goes on from it.
        let rec = CommitRecord {
            next_cidx: 9,
            ..Default::default()
        };
        let mut vs = vec![version(0, 10, 1, (0, 0)), version(1, 11, 2, (UNSET, 1))];
        let mut r = pol(0);
        r.recover(&rec, &mut vs);
        assert_eq!(r.entry_aux(vs[1].group).0, 9);
        r.fill_commit(&mut out);
        assert_eq!(out.next_cidx, 10);
    }

    #[test]
    fn the_memory_estimate_counts_nodes_edges_slots_and_marks() {
        let empty = pol(0);
        assert_eq!(empty.mem_bytes(), 0, "nothing allocated");
        // Figure 6's five nodes, three of them with versions, one wave done
        // and its marks being committed, another done since.
        let mut o = pol(0);
        let [n1, n2, n3, ..] = figure6(&mut o);
        o.install_durable(n1, 0, 10, 1);
        o.install_durable(n2, 1, 11, 2);
        o.install_durable(n3, 7, 17, 3);
        o.install_durable(n3, 8, 18, 3);
        let p = o.next_plan(&mut ctx(&[(0, n1)])).expect("a wave");
        o.on_plan_done(0, &p);
        o.on_commit_start();
        o.unmarked.insert(12);
        o.unmarked.insert(13);
        assert!(!o.marking.is_empty() && !o.unmarked.is_empty());
        // What it counts: the node table, the slot-to-block map (8 bytes a
        // slot), the blocks of both clean-mark sets (8 bytes each), and
        // every node's edge and slot lists (4 bytes an entry).
        let table = o.nodes.capacity() * std::mem::size_of::<Node>();
        let map = o.slot_lbn.capacity() * 8;
        let marks = (o.unmarked.capacity() + o.marking.capacity()) * 8;
        let lists: Vec<usize> = o
            .nodes
            .iter()
            .map(|n| (n.preds.capacity() + n.succs.capacity() + n.slots.capacity()) * 4)
            .collect();
        assert!(table > 0 && map >= 9 * 8 && marks >= 3 * 8);
        assert!(lists.iter().filter(|&&l| l > 0).count() >= 3, "{lists:?}");
        // And the slots whose entries are not durable yet, and completions
        // no reply has shown yet (4 bytes each).
        let fresh = (o.fresh.capacity() + o.freshing.capacity() + o.unseen.capacity()) * 4;
        assert!(fresh > 0, "installs leave capacity in the fresh set");
        assert_eq!(
            o.mem_bytes(),
            table + map + marks + fresh + lists.iter().sum::<usize>()
        );
        assert!(o.mem_bytes() >= 5 * std::mem::size_of::<Node>() + 9 * 8);
    }

    #[test]
    fn with_no_victim_ready_the_oldest_ready_node_is_destaged() {
        // b is issued first (the lowest node id) but completes last; a is
        // older. w, issued with them, completes first but holds a patch: not
        // ready. A failed wave puts a and b back on the ready list. Were a
        // ready node ever missing from the list (the list emptied here by
        // hand), a wave with no victim would take the oldest ready node.
        let mut o = pol(0);
        let b = o.on_write_issue(0, 1);
        let a = o.on_write_issue(0, 2);
        let w = o.on_write_issue(0, 3);
        assert!(b < a && a < w);
        o.install_durable(b, 0, 10, 1);
        o.install_durable(a, 1, 11, 2);
        o.install_durable(w, 2, 12, 3);
        o.on_patch_pending(w);
        o.on_write_data_done(0, w);
        o.on_write_data_done(0, a);
        o.on_write_data_done(0, b);
        assert_eq!(o.entry_aux(w).0, 0);
        assert_eq!(o.entry_aux(a).0, 1);
        assert_eq!(o.entry_aux(b).0, 2);
        let p = o.next_plan(&mut ctx(&[])).expect("a and b ready");
        assert_eq!(sorted(p.write.clone()), vec![0, 1]);
        assert!(o.ready.is_empty(), "the wave took a and b off the list");
        o.on_plan_failed(&p);
        assert_eq!(sorted(o.ready.clone()), sorted(vec![a as u32, b as u32]));
        o.ready.clear();
        let mut one = ctx(&[]);
        one.limit = 1;
        let p = o.next_plan(&mut one).expect("the oldest");
        assert_eq!(p.write, vec![1], "a, the oldest ready write");
        o.on_plan_done(0, &p);
        // b's block was not written: no wait for a commit.
        let p = o.next_plan(&mut one).expect("then b");
        assert_eq!(p.write, vec![0]);
        o.on_plan_done(0, &p);
        assert!(o.next_plan(&mut one).is_none(), "w is not ready");
    }

    /// `n` independent writes (all issued before any completes), write `i`
    /// in slot `i` of block `100 + i`, completed in order: node `i`, ready,
    /// and the ready list `0..n`.
    fn independent(n: u32) -> Ordered {
        let mut o = pol(0);
        let ids: Vec<Group> = (0..n).map(|i| o.on_write_issue(0, u64::from(i))).collect();
        for (i, &g) in ids.iter().enumerate() {
            assert_eq!(g, i as Group);
            o.install_durable(g, i as u32, 100 + i as u64, i as u64);
        }
        for &g in &ids {
            o.on_write_data_done(0, g);
        }
        assert_eq!(o.ready, (0..n).collect::<Vec<u32>>());
        o
    }

    /// The slots of the wave `next_plan` makes with no victim and room for
    /// `limit` slots, after the ready list was set to `ready`.
    fn fill(o: &mut Ordered, ready: Vec<u32>, limit: usize) -> Vec<u32> {
        o.ready = ready;
        let mut cx = ctx(&[]);
        cx.limit = limit;
        o.next_plan(&mut cx).expect("a wave").write
    }

    #[test]
    fn the_ready_list_is_taken_newest_first_and_compacted_only_when_long() {
        // Short lists (at most 1024 entries) are taken as they are, from
        // the end, stale and repeated entries skipped.
        let mut o = independent(3);
        assert_eq!(fill(&mut o, vec![2, 2, 2, 2, 2, 2, 0, 1], 1), vec![1]);
        let mut o = independent(3);
        let mut r = vec![2; 1022];
        r.extend([0, 1]);
        assert_eq!(fill(&mut o, r, 1), vec![1], "1024 entries: not compacted");
        let mut o = independent(3);
        assert_eq!(sorted(fill(&mut o, vec![2, 0, 1, 0, 1], 16)), vec![0, 1, 2]);
        // A node not ready (its write not completed) is skipped.
        let mut o = independent(2);
        let late = o.on_write_issue(0, 9);
        o.install_durable(late, 7, 200, 9);
        assert_eq!(
            sorted(fill(&mut o, vec![late as u32, 0, 1, 0, 1], 16)),
            vec![0, 1]
        );
        // Longer than 1024 and than twice the nodes: compacted (only ready
        // nodes, once each, in id order), so the highest id goes first.
        let mut o = independent(3);
        let mut r = vec![2; 1100];
        r.extend([0, 1]);
        assert_eq!(fill(&mut o, r, 1), vec![2]);
        assert_eq!(o.ready, vec![0, 1]);
        // 1100 entries and 550 nodes: not more than twice the nodes.
        let mut o = independent(550);
        let mut r: Vec<u32> = (0..550).collect();
        r.extend([0; 550]);
        assert_eq!(fill(&mut o, r, 1), vec![0]);
        let mut o = independent(550);
        let mut r: Vec<u32> = (0..550).collect();
        r.extend([0; 551]);
        assert_eq!(fill(&mut o, r, 1), vec![549], "1101 entries: compacted");
    }

    #[test]
    fn a_wave_is_filled_up_to_the_limit_in_slots() {
        // The victim's node (one slot), then the newest ready nodes until
        // the wave holds `limit` slots.
        let mut o = independent(5);
        let mut cx = ctx(&[(0, 0)]);
        cx.limit = 4;
        let p = o.next_plan(&mut cx).expect("a wave");
        assert_eq!(sorted(p.write), vec![0, 2, 3, 4]);
        // No victim: as many as fit.
        let mut o = independent(5);
        assert_eq!(sorted(fill(&mut o, (0..5).collect(), 3)), vec![2, 3, 4]);
        // The first victim with a ready ancestor decides; later victims add
        // nothing beyond the limit (node 0 holds two slots: the limit).
        let mut o = independent(3);
        o.install_durable(0, 5, 105, 0);
        let mut cx = ctx(&[(0, 0), (1, 1)]);
        cx.limit = 2;
        let p = o.next_plan(&mut cx).expect("a wave");
        assert_eq!(sorted(p.write), vec![0, 5]);
        // A victim without a ready ancestor (its write, issued first, not
        // completed) is passed over for the next one; the newest ready node
        // fills the rest.
        let mut o = pol(0);
        let late = o.on_write_issue(0, 9);
        o.install_durable(late, 7, 200, 9);
        let ids: Vec<Group> = (0..3).map(|i| o.on_write_issue(0, i)).collect();
        for (i, &g) in ids.iter().enumerate() {
            o.install_durable(g, i as u32, 100 + i as u64, i as u64);
            o.on_write_data_done(0, g);
        }
        let mut cx = ctx(&[(7, late), (0, ids[0])]);
        cx.limit = 2;
        let p = o.next_plan(&mut cx).expect("a wave");
        assert_eq!(sorted(p.write), vec![0, 2]);
    }

    #[test]
    fn a_held_node_asks_for_a_commit_whichever_way_it_is_found() {
        let mut o = pol(0);
        assert!(o.next_plan(&mut ctx(&[])).is_none());
        assert!(!o.wants_commit(), "nothing ready, nothing held");
        first_wave_done(&mut o);
        // c rewrites block 10 (no older node left: c is ready at once). No
        // victim: the ready list finds c, held for block 10's mark.
        let c = write(&mut o, 2, 1, 10);
        assert_eq!(o.ready, vec![c as u32]);
        assert!(o.next_plan(&mut ctx(&[])).is_none());
        assert!(o.wants_commit(), "c waits for block 10's mark");
        assert_eq!(o.ready, vec![c as u32], "and stays in the ready list");
        // c back on the ready list after its wave failed, and the victim:
        // found again, held for block 11's mark.
        let mut o = pol(0);
        let c = write(&mut o, 1, 1, 11);
        let p = o.next_plan(&mut ctx(&[(1, c)])).expect("c's wave");
        assert!(o.ready.is_empty(), "the wave took c off the ready list");
        o.on_plan_failed(&p);
        assert_eq!(o.ready, vec![c as u32], "c is back on it");
        // A plan done on block 11 since (a sync of another of its versions).
        o.set_slot_lbn(5, 11);
        o.on_plan_done(
            0,
            &Plan {
                write: vec![5],
                tag: 0,
                ..Default::default()
            },
        );
        assert!(o.next_plan(&mut ctx(&[(1, c)])).is_none());
        assert!(o.wants_commit(), "c waits for block 11's mark");
    }

    /// A chain of `len` writes (each issued after the previous completed),
    /// write `i` in slot `i + 1`, and `s` (slot 0), issued first and
    /// completed last: ready, newest in the ready list, no ancestor of the
    /// chain. The slots of the wave with room for one, the chain's top as
    /// the victim.
    fn chain_wave(len: u32) -> Vec<u32> {
        let mut o = pol(0);
        let s = o.on_write_issue(0, 0);
        o.install_durable(s, 0, 0, 0);
        let mut top = 0;
        for i in 1..=len {
            top = write(&mut o, u64::from(i), i, u64::from(i));
        }
        o.on_write_data_done(0, s);
        assert_eq!(o.nodes[top as usize].preds.len(), 1);
        let mut cx = ctx(&[(len, top)]);
        cx.limit = 1;
        o.next_plan(&mut cx).expect("a wave").write
    }

    #[test]
    fn the_ancestor_walk_stops_after_its_visit_budget() {
        // The chain's root is the victim's only ready ancestor, ANCESTOR_VISITS
        // nodes down: found. One more and the walk gives up; the ready list
        // gives s.
        assert_eq!(ANCESTOR_VISITS, 2048);
        assert_eq!(chain_wave(2048), vec![1]);
        assert_eq!(chain_wave(2049), vec![0]);
    }

    /// `layers` rounds of `width` writes, each round issued after the
    /// previous one completed (each node depends on every node of the round
    /// before: width^layers paths down). The first round holds patches:
    /// nothing in it is ready. r is issued first and completes after the
    /// last round was issued, before it completed; s is issued first and
    /// completes after v. v depends on r and the last round. The slots of
    /// the wave with room for one and v as the victim.
    fn rounds_wave(width: u32, layers: u32) -> Vec<u32> {
        let mut o = pol(0);
        let r = o.on_write_issue(0, 1000);
        o.install_durable(r, 1000, 1000, 1000);
        let s = o.on_write_issue(0, 1001);
        o.install_durable(s, 1001, 1001, 1001);
        let mut slot = 0;
        let mut round: Vec<Group> = Vec::new();
        for k in 0..layers {
            round = (0..width)
                .map(|_| {
                    slot += 1;
                    let g = o.on_write_issue(0, u64::from(slot));
                    o.install_durable(g, slot, u64::from(slot), u64::from(slot));
                    if k == 0 {
                        o.on_patch_pending(g);
                    }
                    g
                })
                .collect();
            if k == layers - 1 {
                o.on_write_data_done(0, r);
            }
            for &g in &round {
                o.on_write_data_done(0, g);
            }
        }
        let v = o.on_write_issue(0, 2000);
        o.install_durable(v, 2000, 2000, 2000);
        o.on_write_data_done(0, s);
        let mut want: Vec<u32> = round.iter().map(|&g| g as u32).collect();
        want.push(r as u32);
        assert_eq!(sorted(o.nodes[v as usize].preds.clone()), sorted(want));
        assert_eq!(o.ready, vec![r as u32, s as u32]);
        let mut cx = ctx(&[(2000, v)]);
        cx.limit = 1;
        o.next_plan(&mut cx).expect("a wave").write
    }

    #[test]
    fn the_ancestor_walk_visits_each_node_once() {
        // v's walk goes through the rounds first and reaches r, its ready
        // ancestor, within its visit budget only if it visits each node of
        // the rounds once (24, 60 and 400 nodes; 20 rounds of 20 have 20^20
        // paths down, and a walk that remembered only its first 64 nodes
        // gave up on them). Otherwise the walk gives up and the ready list
        // gives s.
        assert_eq!(rounds_wave(2, 12), vec![1000]);
        assert_eq!(rounds_wave(3, 20), vec![1000]);
        assert_eq!(rounds_wave(20, 20), vec![1000]);
    }

    #[test]
    fn the_ancestor_walk_skips_nodes_in_a_wave_destaged_or_freed() {
        let mut o = pol(0);
        let a = write(&mut o, 1, 0, 10);
        let b = write(&mut o, 2, 1, 11);
        let mut one = ctx(&[(0, a)]);
        one.limit = 1;
        let p = o.next_plan(&mut one).expect("a's wave");
        assert_eq!(p.write, vec![0]);
        let walk = |o: &mut Ordered, n: Group| {
            let mut out = Vec::new();
            o.ready_ancestors(n as u32, 16, &mut out);
            out
        };
        assert!(o.nodes[a as usize].in_wave);
        assert_eq!(walk(&mut o, a), vec![], "a is in a wave");
        assert_eq!(walk(&mut o, b), vec![], "b's ancestor a is in a wave");
        o.on_plan_done(0, &p);
        // Destaged, its version not yet removed: not freed.
        assert!(o.nodes[a as usize].destaged && o.nodes[a as usize].live);
        assert_eq!(walk(&mut o, a), vec![], "a is destaged");
        assert_eq!(walk(&mut o, b), vec![b as u32]);
        o.on_version_removed(a, 0);
        assert!(!o.nodes[a as usize].live, "freed");
        assert_eq!(walk(&mut o, a), vec![], "a is freed");
    }

    #[test]
    fn a_live_dummy_stays_the_frontier_while_its_predecessors_are_destaged() {
        // a and b complete: a dummy d absorbs them. a destaged: d is still
        // live (it waits for b), and a new write c depends on it.
        let mut o = pol(2);
        let a = o.on_write_issue(0, 1) as u32;
        let b = o.on_write_issue(0, 2) as u32;
        o.on_write_data_done(0, a as Group);
        o.on_write_data_done(0, b as Group);
        let d = o.last_dummy.expect("a dummy");
        o.mark_destaged(a);
        assert_eq!(o.last_dummy, Some(d));
        let c = o.on_write_issue(0, 3);
        assert_eq!(o.nodes[c as usize].preds, vec![d]);
        o.on_write_data_done(0, c);
        assert!(!o.nodes[c as usize].ready(), "b is not destaged yet");
        // Issues count the completed writes not destaged (the raw rule):
        // none for a and b, b alone for c (a is destaged).
        assert_eq!(o.raw_edges, 1);
        o.mark_destaged(b);
        assert_eq!(o.last_dummy, None, "d went with b");
        assert!(o.nodes[c as usize].ready());
        // The dummy counted no completion: c alone is left.
        o.on_write_issue(0, 4);
        assert_eq!(o.raw_edges, 1 + 1);
    }

    #[test]
    fn a_wave_waits_for_marks_a_commit_in_flight_is_recording() {
        // a's wave is done, and a commit (started by the engine, not asked
        // for) is recording block 10's clean mark. c rewrites block 10: it
        // waits until that commit is done.
        let mut o = pol(0);
        first_wave_done(&mut o);
        o.on_commit_start();
        assert!(o.unmarked.is_empty() && o.marking.contains(&10));
        let c = write(&mut o, 2, 1, 10);
        assert!(o.next_plan(&mut ctx(&[(1, c)])).is_none());
        assert!(o.wants_commit());
        o.on_commit_done(true);
        assert!(o.marking.is_empty());
        if o.wants_commit() {
            // The commit that recorded the mark was not the one asked for.
            o.on_commit_start();
            o.on_commit_done(true);
        }
        let p = o.next_plan(&mut ctx(&[(1, c)])).expect("c's wave");
        assert_eq!(p.write, vec![1]);
    }

    /// a, then b and c issued after a completed (b and c depend on a), then
    /// e after b and c completed; d rewrites a's block 10. Slots 0-4.
    fn pipeline_graph(o: &mut Ordered) -> [Group; 5] {
        let a = write(o, 1, 0, 10);
        let b = o.on_write_issue(0, 2);
        let c = o.on_write_issue(0, 3);
        let d = o.on_write_issue(0, 4);
        for (g, slot, lbn) in [(b, 1, 11), (c, 2, 12), (d, 3, 10)] {
            o.install_durable(g, slot, lbn, g);
            o.on_write_data_done(0, g);
        }
        let e = write(o, 5, 4, 14);
        [a, b, c, d, e]
    }

    #[test]
    fn a_pipelined_wave_takes_what_the_wave_in_flight_releases() {
        let mut o = pol(0);
        let [a, b, c, d, e] = pipeline_graph(&mut o);
        let w1 = o.next_plan(&mut ctx(&[(0, a)])).expect("a's wave");
        assert_eq!((w1.write.clone(), w1.tag, w1.after), (vec![0], 1, None));
        // The wave's copies are not written yet: nothing to read ahead for.
        let mut busy = ctx(&[]);
        busy.copies_pending = true;
        assert!(o.next_plan(&mut busy).is_none());
        // Its FLUSH is in flight: b and c become ready with it (d rewrites
        // a's block, e also waits for b and c).
        let w2 = o.next_plan(&mut ctx(&[])).expect("a pipelined wave");
        assert_eq!(
            (sorted(w2.write.clone()), w2.tag, w2.after),
            (vec![1, 2], 2, Some(1))
        );
        assert!(w2.exact && w2.commit_after && w2.atomic_group.is_none());
        assert!(o.nodes[b as usize].in_wave && !o.nodes[b as usize].ready());
        assert!(
            o.next_plan(&mut ctx(&[])).is_none(),
            "one pipelined wave at a time"
        );
        assert_eq!((o.waves, o.waves_pipelined), (2, 1));
        o.on_plan_done(0, &w1);
        assert!(o.nodes[a as usize].destaged && o.nodes[b as usize].preds_left == 0);
        // w2 is the wave in flight now; d waits for a's clean mark and e
        // for w2, which has not flushed: nothing to read ahead.
        assert!(o.next_plan(&mut ctx(&[])).is_none());
        o.on_plan_done(0, &w2);
        assert!(o.nodes[b as usize].destaged && o.nodes[c as usize].destaged);
        assert!(!o.wave_in_flight);
        // e was issued after d completed: it waits for d, which waits for
        // block 10's clean mark (a's wave).
        assert!(o.nodes[d as usize].ready() && !o.nodes[e as usize].ready());
        assert!(o.next_plan(&mut ctx(&[])).is_none());
        assert!(o.wants_commit());
    }

    #[test]
    fn a_failed_wave_takes_its_pipelined_wave_back_with_it() {
        let mut o = pol(0);
        let [a, b, c, _, _] = pipeline_graph(&mut o);
        let w1 = o.next_plan(&mut ctx(&[(0, a)])).expect("a's wave");
        let w2 = o.next_plan(&mut ctx(&[])).expect("a pipelined wave");
        // The engine fails the wave, then cancels the one gated on it.
        o.on_plan_failed(&w1);
        assert!(o.wave_in_flight, "the cancelled wave is still out");
        o.on_plan_failed(&w2);
        assert!(!o.wave_in_flight);
        for n in [a, b, c] {
            assert!(!o.nodes[n as usize].in_wave && !o.nodes[n as usize].destaged);
        }
        assert!(o.nodes[a as usize].ready() && !o.nodes[b as usize].ready());
        let again = o.next_plan(&mut ctx(&[(0, a)])).expect("a's wave again");
        assert_eq!((again.write.clone(), again.after), (vec![0], None));
        // A pipelined wave that fails on its own (a cache read) leaves the
        // wave in flight alone.
        let w2 = o.next_plan(&mut ctx(&[])).expect("a pipelined wave");
        o.on_plan_failed(&w2);
        assert!(o.wave_in_flight && o.next_tag == 0);
        assert!(!o.nodes[b as usize].in_wave);
        o.on_plan_done(0, &again);
        assert!(o.nodes[b as usize].ready() && o.nodes[c as usize].ready());
    }

    #[test]
    fn no_pipelined_wave_when_a_sync_waits_or_pipelining_is_off() {
        let mut o = pol(0);
        let [a, ..] = pipeline_graph(&mut o);
        o.next_plan(&mut ctx(&[(0, a)])).expect("a's wave");
        // A victim outside any node (its wave done) is synced between waves.
        assert!(o.next_plan(&mut ctx(&[(9, NO_GROUP)])).is_none());
        let mut c = Config::new(4096, 64, 1 << 20, WritePolicyKind::Ordered);
        c.dummy_every = 0;
        c.ordered_pipeline = false;
        let mut off = Ordered::new(&c);
        let [a, ..] = pipeline_graph(&mut off);
        off.next_plan(&mut ctx(&[(0, a)])).expect("a's wave");
        assert!(off.next_plan(&mut ctx(&[])).is_none());
    }

    #[test]
    fn a_pipelined_wave_reaches_through_dummies_the_wave_releases() {
        // Two writes complete and a dummy absorbs them; x is issued after
        // the dummy and depends on it alone. With a and b in the wave in
        // flight, the dummy goes with them, so x is ready with them.
        let mut o = pol(2);
        let a = o.on_write_issue(0, 1);
        let b = o.on_write_issue(0, 2);
        for (g, slot, lbn) in [(a, 0, 10), (b, 1, 11)] {
            o.install_durable(g, slot, lbn, g);
            o.on_write_data_done(0, g);
        }
        assert_eq!(o.dummies_total, 1);
        let x = write(&mut o, 3, 2, 12);
        let dummy = o.last_dummy.expect("a dummy");
        assert_eq!(o.nodes[x as usize].preds, vec![dummy]);
        let w1 = o.next_plan(&mut ctx(&[(0, a)])).expect("a and b's wave");
        assert_eq!(sorted(w1.write.clone()), vec![0, 1]);
        let w2 = o.next_plan(&mut ctx(&[])).expect("x's pipelined wave");
        assert_eq!(w2.write, vec![2]);
        o.on_plan_done(0, &w1);
        assert!(o.nodes[x as usize].preds_left == 0 && o.last_dummy.is_none());
        o.on_plan_done(0, &w2);
        assert!(o.nodes[x as usize].destaged);
    }

    #[test]
    fn a_pipelined_wave_takes_ready_nodes_the_wave_in_flight_left_out() {
        // Three independent writes, node 1 with two versions; the first
        // wave has room for one slot and takes the newest ready node (2).
        // A write not completed (its own id on the ready list by hand, as a
        // stale entry) is skipped. While the wave flushes, the pipelined
        // wave takes the ready nodes it left out, newest first, up to its
        // limit in slots.
        let setup = || {
            let mut o = independent(3);
            o.install_durable(1, 5, 105, 1);
            let late = o.on_write_issue(0, 9);
            o.install_durable(late, 7, 200, 9);
            let mut one = ctx(&[]);
            one.limit = 1;
            let w1 = o.next_plan(&mut one).expect("a wave");
            assert_eq!(w1.write, vec![2]);
            assert_eq!(o.ready, vec![0, 1]);
            o.ready.push(late as u32);
            (o, w1.tag)
        };
        let pipelined = |limit: usize| {
            let (mut o, tag) = setup();
            let mut cx = ctx(&[]);
            cx.limit = limit;
            let w2 = o.next_plan(&mut cx).expect("a pipelined wave");
            assert_eq!(w2.after, Some(tag));
            w2.write
        };
        // Node 1's two versions fill a limit of two; with room for more,
        // node 0 too.
        assert_eq!(pipelined(2), vec![1, 5]);
        assert_eq!(pipelined(3), vec![1, 5, 0]);
    }

    #[test]
    fn a_wave_in_flight_is_looked_behind_once() {
        // a's wave is in flight; b depends on a and is not completed when
        // the pipelined wave is looked for: nothing. b completes during the
        // FLUSH: it goes in the wave after, not in a second look.
        let mut o = pol(0);
        let a = write(&mut o, 1, 0, 10);
        let w1 = o.next_plan(&mut ctx(&[(0, a)])).expect("a's wave");
        let b = o.on_write_issue(0, 2);
        o.install_durable(b, 1, 11, 2);
        assert!(o.next_plan(&mut ctx(&[])).is_none(), "b not completed");
        o.on_write_data_done(0, b);
        assert!(o.next_plan(&mut ctx(&[])).is_none(), "looked once already");
        o.on_plan_done(0, &w1);
        let w2 = o.next_plan(&mut ctx(&[])).expect("b's wave");
        assert_eq!((w2.write, w2.after), (vec![1], None));
    }

    #[test]
    fn the_look_behind_a_wave_stops_after_its_visit_budget() {
        // a's wave is in flight; `n` writes issued after a completed and
        // not completed themselves (each a visit), then x, ready once a is
        // destaged: found within ANCESTOR_VISITS visits, not beyond.
        let look = |n: u64| {
            let mut o = pol(0);
            let a = write(&mut o, 1, 0, 10);
            o.next_plan(&mut ctx(&[(0, a)])).expect("a's wave");
            for i in 0..n {
                o.on_write_issue(0, 100 + i);
            }
            let x = write(&mut o, 2, 1, 11);
            assert_eq!(o.nodes[x as usize].preds, vec![a as u32]);
            o.next_plan(&mut ctx(&[])).map(|p| p.write)
        };
        assert_eq!(look(2047), Some(vec![1]));
        assert_eq!(look(2048), None);
    }

    #[test]
    fn a_node_held_by_the_victims_walk_and_by_the_ready_list_asks_for_a_commit() {
        // a's wave wrote block 10. c rewrites it, with a second version
        // (block 12), and is ready at once. With room for one slot, the
        // victim's ancestor walk finds c and holds it for block 10's mark,
        // then the ready list finds it again: held twice, a commit asked for.
        let mut o = pol(0);
        first_wave_done(&mut o);
        let c = write(&mut o, 2, 1, 10);
        o.install_durable(c, 2, 12, 2);
        assert_eq!(o.ready, vec![c as u32]);
        let mut cx = ctx(&[(1, c)]);
        cx.limit = 1;
        assert!(o.next_plan(&mut cx).is_none());
        assert!(o.wants_commit(), "c waits for block 10's mark");
        assert_eq!(o.ready, vec![c as u32]);
    }

    #[test]
    fn the_memory_estimate_counts_each_set_of_slots_and_completions() {
        // Versions installed before a commit started (their entries being
        // recorded), one installed since, and a completion no reply has
        // shown yet: each set counts 4 bytes an entry of its capacity.
        let mut o = pol(0);
        o.set_reply_events(true);
        let a = o.on_write_issue(0, 1);
        o.on_version_installed(a, 0, 10, 1);
        o.on_version_installed(a, 1, 11, 1);
        o.on_commit_start();
        o.on_version_installed(a, 2, 12, 1);
        o.on_write_data_done(0, a);
        let fresh = o.fresh.capacity();
        let freshing = o.freshing.capacity();
        let unseen = o.unseen.capacity();
        assert!(fresh > 0 && freshing > 0 && unseen > 0);
        let rest = o.nodes.capacity() * std::mem::size_of::<Node>()
            + o.slot_lbn.capacity() * 8
            + (o.unmarked.capacity() + o.marking.capacity()) * 8
            + o.nodes
                .iter()
                .map(|n| (n.preds.capacity() + n.succs.capacity() + n.slots.capacity()) * 4)
                .sum::<usize>();
        assert_eq!(o.mem_bytes(), rest + (fresh + freshing + unseen) * 4);
    }

    #[test]
    fn the_look_behind_a_wave_visits_each_dummy_once() {
        // By hand: the wave in flight holds q, p and a (walked from a); a
        // dummy d after a and p, then 2040 writes not completed after d;
        // x, completed, after q alone. The walk visits d once from a (2041
        // visits with d's successors) and finds x within ANCESTOR_VISITS;
        // visiting d again from p would spend the budget before q.
        let mut o = pol(0);
        let [q, p, a, d, x] = [(); 5].map(|_| o.alloc());
        for n in [q, p, a, d, x] {
            o.nodes[n as usize].completed = true;
        }
        o.nodes[d as usize].dummy = true;
        o.add_edge(a, d);
        o.add_edge(p, d);
        o.add_edge(q, x);
        for _ in 0..2040 {
            let n = o.alloc();
            o.add_edge(d, n);
        }
        o.wave = vec![q, p, a];
        for n in [q, p, a] {
            o.nodes[n as usize].in_wave = true;
        }
        let mut out = Vec::new();
        o.virtually_ready(16, &mut out);
        assert_eq!(out, vec![x]);
    }

    #[test]
    fn a_wave_waits_only_for_its_own_versions_entries() {
        // a's entry is durable; b's version (another block) was installed
        // since, its entry not committed: a's wave goes without a commit.
        let mut o = pol(0);
        let a = write(&mut o, 1, 0, 10);
        let b = o.on_write_issue(0, 2);
        o.on_version_installed(b, 1, 11, 2);
        assert!(o.needs_marks(&[1]) && !o.needs_marks(&[0]));
        let p = o.next_plan(&mut ctx(&[(0, a)])).expect("a's wave");
        assert_eq!(p.write, vec![0]);
        assert!(!o.wants_commit());
    }

    #[test]
    fn a_wave_waits_for_entries_a_commit_in_flight_is_recording() {
        // a's version is installed, then a commit (started by the engine,
        // not asked for) records its entry: no version is waiting for the
        // next commit, and a's wave still waits until that one is done.
        let mut o = pol(0);
        let a = o.on_write_issue(0, 1);
        o.on_version_installed(a, 0, 10, 1);
        o.on_write_data_done(0, a);
        o.on_commit_start();
        assert!(o.fresh.is_empty() && o.freshing.contains(&0));
        assert!(o.next_plan(&mut ctx(&[(0, a)])).is_none());
        assert!(o.wants_commit());
        o.on_commit_done(true);
        if o.wants_commit() {
            // The commit that recorded the entry was not the one asked for.
            o.on_commit_start();
            o.on_commit_done(true);
        }
        let p = o.next_plan(&mut ctx(&[(0, a)])).expect("a's wave");
        assert_eq!(p.write, vec![0]);
    }

    #[test]
    fn a_ready_node_over_the_limit_alone_makes_the_wave_choose() {
        // As in a_wave_takes_the_victims_ready_ancestors_first_up_to_the_limit,
        // with a holding two versions: with room for one slot, a alone
        // holds more than the wave takes, so the victim's ancestor walk
        // chooses (b, found first), not the newest ready node x.
        let mut o = pol(0);
        let a = o.on_write_issue(0, 1);
        let b = o.on_write_issue(0, 2);
        let x = o.on_write_issue(0, 3);
        for (g, s) in [(a, 0), (b, 1), (x, 2), (a, 4)] {
            o.install_durable(g, s, 10 + u64::from(s), g);
        }
        o.on_write_data_done(0, a);
        o.on_write_data_done(0, b);
        let c = o.on_write_issue(0, 4);
        o.install_durable(c, 3, 13, 4);
        o.on_write_data_done(0, x);
        o.on_write_data_done(0, c);
        assert_eq!(o.ready, vec![a as u32, b as u32, x as u32]);
        let mut cx = ctx(&[(3, c)]);
        cx.limit = 1;
        assert_eq!(o.next_plan(&mut cx).expect("a wave").write, vec![1]);
    }
}
