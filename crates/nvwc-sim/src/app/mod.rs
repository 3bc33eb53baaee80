//! Application models over the engine: simulated processes, locks,
//! condition variables and I/O, in virtual time, for the request-oriented
//! admission paper's experiments (PostgreSQL-like and Redis-like workloads).
//!
//! A block device cannot see processes, so this is where process-level
//! criticality lives. Each process runs a small program ([`Model::step`])
//! that computes, writes (synchronously, waited on, or asynchronously),
//! flushes, takes and releases locks, and waits on and signals condition
//! variables. The runtime executes those steps against the engine (write-back
//! write policy, the chosen admission policy) and two device models.
//!
//! # Criticality
//! * Critical processes are named by the model (PostgreSQL backends, the
//!   Redis server): the paper's application hints (§4.1).
//! * A write is tagged critical when its process is critical (or has
//!   inherited criticality, under the PI policies) **and** the process waits
//!   for it (a synchronous write): CP caches "synchronous writes requested by
//!   critical processes" (§7.1). Every write carries `Tag::sync` for SYNC.
//! * Every blocked process records its *blocking object*: a lock, a
//!   condition (with the process expected to signal it) or an I/O request.
//!   When a critical process blocks, under CP+PI and CP+PI+IOI the runtime
//!   follows the chain: a lock's owner and a condition's signaller inherit
//!   criticality (§4.2.1) and the walk goes on to what *they* are blocked on
//!   (cascading dependencies, §4.2.3); when the chain ends at an I/O request,
//!   CP+PI+IOI asks the engine to reissue it to the cache
//!   ([`Engine::inherit_request`], §4.2.2). Inherited criticality ends when
//!   the process releases what it came through: the lock a critical process
//!   waited for, or (signalling) the condition it waited on.
//!
//! # Time
//! Nothing is random except the model's own draws from a seeded generator,
//! so a run is a function of its configuration and seed. CPU time is not
//! contended (every process computes in parallel).
//!
//! # Debugging
//! With `NVWC_APP_DEBUG` set, a run prints once per simulated second the
//! requests done, how many critical processes are blocked, the backing
//! queue and the engine's state, and at the end every process blocked for
//! more than a second and on what. A run in which nothing can happen any
//! more fails with the same list.

pub mod fs;
pub mod postgres;
pub mod redis;
pub mod timeline;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use hdrhistogram::Histogram;
use nvwc_core::pump::{pump, Driver};
use nvwc_core::{
    AdmissionKind, Config, Dev, Engine, IoCmd, Phantom, ReplacementKind, Reply, ReqId, ReqOp,
    Request, Tag, WritePolicyKind,
};
use serde::Serialize;

use crate::device::{build, DevOp, DevOpKind, DeviceModel, DeviceSpec, Nanos};
use timeline::{Snapshot, Timeline, TimelineSample};

/// Process id.
pub type Pid = usize;
/// Lock id.
pub type LockId = usize;
/// Condition id.
pub type CondId = usize;

/// The paper's admission policies (§7.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Policy {
    All,
    Sync,
    Wal,
    Cp,
    CpPi,
    CpPiIoi,
}

impl Policy {
    pub const ALL: [Policy; 6] = [
        Policy::All,
        Policy::Sync,
        Policy::Wal,
        Policy::Cp,
        Policy::CpPi,
        Policy::CpPiIoi,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Policy::All => "ALL",
            Policy::Sync => "SYNC",
            Policy::Wal => "WAL",
            Policy::Cp => "CP",
            Policy::CpPi => "CP+PI",
            Policy::CpPiIoi => "CP+PI+IOI",
        }
    }
    fn admission(self) -> AdmissionKind {
        match self {
            Policy::All => AdmissionKind::All,
            Policy::Sync => AdmissionKind::Sync,
            Policy::Wal => AdmissionKind::Wal,
            Policy::Cp => AdmissionKind::Critical,
            Policy::CpPi => AdmissionKind::CriticalPi,
            Policy::CpPiIoi => AdmissionKind::CriticalPiIoi,
        }
    }
    fn pi(self) -> bool {
        matches!(self, Policy::CpPi | Policy::CpPiIoi)
    }
    fn ioi(self) -> bool {
        self == Policy::CpPiIoi
    }
}

/// What a process does next.
#[derive(Clone, Copy, Debug)]
pub enum Step {
    /// Busy for this long.
    Compute(Nanos),
    /// Write `len` bytes at `offset`. `wait`: block until it completes (a
    /// synchronous write); otherwise go on at once (the request id is in
    /// [`Rt::last_req`]). `sync` classifies the write for SYNC and CP (a
    /// write issued in a sync path and waited on later counts as sync).
    Write {
        offset: u64,
        len: u64,
        sync: bool,
        wait: bool,
        fua: bool,
    },
    /// FLUSH, waited on.
    Flush,
    Lock(LockId),
    Unlock(LockId),
    /// Block until the condition is signalled.
    Wait(CondId),
    /// Block until signalled or until this much time passed.
    WaitTimeout(CondId, Nanos),
    /// Wake every waiter.
    Signal(CondId),
    /// Block until request `id` completes (go on at once if it has).
    WaitIo(ReqId),
    /// A client request starts now (its latency clock).
    Begin,
    /// The client request that started at `Begin` (or at `t`, if given) ends.
    End(Option<Nanos>),
}

/// The runtime's services to a model while it steps.
pub struct Rt {
    pub now: Nanos,
    rng: u64,
    /// Id of the last write issued with `wait: false`.
    pub last_req: ReqId,
    outstanding: HashMap<ReqId, Pid>,
}

impl Rt {
    /// Uniform in `0..n` (SplitMix64).
    pub fn below(&mut self, n: u64) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z as u128 * n as u128) >> 64) as u64
    }
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.below(1 << 53) as f64) < p * (1u64 << 53) as f64
    }
    /// Is request `id` still in flight?
    pub fn in_flight(&self, id: ReqId) -> bool {
        self.outstanding.contains_key(&id)
    }
}

/// An application model.
pub trait Model {
    /// Processes: `(name, critical)`; their ids are the indices.
    fn processes(&self) -> Vec<(String, bool)>;
    /// Number of locks and conditions the model uses.
    fn locks(&self) -> usize;
    fn conds(&self) -> usize;
    /// The process expected to signal `c`, if one is (for the dependency walk).
    fn signaller(&self, c: CondId) -> Option<Pid>;
    /// Byte ranges declared as log (for WAL).
    fn wal_ranges(&self) -> Vec<(u64, u64)>;
    /// Bytes of backing store the model uses.
    fn backing_bytes(&self) -> u64;
    /// Where the backing store splits between two disks (the log disk), if it does.
    fn log_disk_at(&self) -> Option<u64> {
        None
    }
    /// Process `p` is ready: its next step.
    fn step(&mut self, rt: &mut Rt, p: Pid) -> Step;
    /// A write request completed (for models that track pages under writeback).
    fn io_done(&mut self, _rt: &mut Rt, _id: ReqId) {}
}

/// One run's configuration.
#[derive(Clone, Debug)]
pub struct AppConfig {
    pub policy: Policy,
    /// NVWC capacity.
    pub cache_bytes: u64,
    pub cache_device: DeviceSpec,
    pub backing: DeviceSpec,
    /// Virtual time simulated; the first `warmup_ns` are not measured.
    pub duration_ns: Nanos,
    pub warmup_ns: Nanos,
    pub seed: u64,
    /// Sample a timeline at this interval of virtual time (`timeline.rs`).
    pub timeline_ns: Option<Nanos>,
}

/// One run's results (measured after the warm-up).
#[derive(Clone, Debug, Serialize)]
pub struct AppResult {
    pub app: String,
    pub policy: String,
    pub nvwc_bytes: u64,
    pub nvwc_device: String,
    /// Client requests completed per second.
    pub throughput: f64,
    pub requests: u64,
    /// Client write bytes that went to the cache (admitted, refused bypasses, reissues).
    pub cached_write_bytes: u64,
    /// Client write bytes in total.
    pub write_bytes: u64,
    /// Throughput per cached 4 KiB block (the paper's caching efficiency, Figure 7).
    pub efficiency: f64,
    pub latency_ms_avg: f64,
    pub latency_ms_p99: f64,
    pub latency_ms_p999: f64,
    pub latency_ms_p9999: f64,
    /// Write pieces that waited for cache space.
    pub stalled_writes: u64,
    pub reissued_writes: u64,
    /// Processes that inherited criticality, and I/O inheritance requests.
    pub inheritances: u64,
    pub io_inheritances: u64,
    /// Sync writes by each process (name, bytes), for Table 1.
    pub sync_bytes_by_process: Vec<(String, u64)>,
    pub async_bytes_by_process: Vec<(String, u64)>,
    /// Total time critical processes spent blocked, per blocking object kind.
    pub critical_wait_ms: [(String, f64); 3],
    /// The run's timeline, when [`AppConfig::timeline_ns`] asked for one.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<TimelineSample>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Blocker {
    None,
    Lock(LockId),
    Cond(CondId),
    Io(ReqId),
    Timer,
}

struct Proc {
    name: String,
    critical: bool,
    inherited: bool,
    /// What the inherited criticality came through (a lock it holds, a
    /// condition it is expected to signal); it ends when that is released.
    inherited_via: Vec<Blocker>,
    blocker: Blocker,
    blocked_at: Nanos,
    begin: Nanos,
    /// Timer wake-up generation (a wait with timeout woken early ignores its timer).
    gen: u64,
    sync_bytes: u64,
    async_bytes: u64,
}

struct Lock {
    owner: Option<Pid>,
    waiters: VecDeque<Pid>,
}

/// A disk behind a block layer: at most `qd` commands on the device; queued
/// writes merge with a queued write they extend (same FUA, at most 1 MiB; a
/// queued FLUSH is a barrier), as an elevator does. Without merging, a
/// stream of small sequential writes (destages, journal blocks) would cost
/// a rotation each on a disk model.
struct Queue {
    dev: Box<dyn DeviceModel>,
    qd: usize,
    out: usize,
    q: VecDeque<(DevOp, Vec<u64>)>,
    inflight: HashMap<u64, Vec<u64>>,
    next: u64,
}

impl Queue {
    fn new(dev: Box<dyn DeviceModel>, qd: usize) -> Self {
        Queue {
            dev,
            qd,
            out: 0,
            q: VecDeque::new(),
            inflight: HashMap::new(),
            next: 1,
        }
    }
    fn submit(&mut self, now: Nanos, op: DevOp) {
        if op.kind == DevOpKind::Write {
            for (o, ids) in self.q.iter_mut().rev() {
                if o.kind != DevOpKind::Write {
                    break;
                }
                if o.fua != op.fua || o.len + op.len > 1 << 20 {
                    continue;
                }
                if o.offset + o.len == op.offset {
                    o.len += op.len;
                    ids.push(op.id);
                    return;
                }
                if op.offset + op.len == o.offset {
                    o.offset = op.offset;
                    o.len += op.len;
                    ids.push(op.id);
                    return;
                }
            }
        }
        if op.kind == DevOpKind::Flush {
            // A FLUSH covers completed writes only: it does not wait behind
            // queued ones (Linux issues flushes ahead of the scheduler).
            self.q.push_front((op, vec![op.id]));
        } else {
            self.q.push_back((op, vec![op.id]));
        }
        self.dispatch(now);
    }
    fn dispatch(&mut self, now: Nanos) {
        while self.out < self.qd {
            let Some((mut op, ids)) = self.q.pop_front() else {
                break;
            };
            op.id = self.next;
            self.next += 1;
            self.inflight.insert(op.id, ids);
            self.out += 1;
            self.dev.submit(now, op);
        }
    }
    fn next_completion(&self) -> Option<Nanos> {
        self.dev.next_completion()
    }
    fn pop(&mut self, now: Nanos, out: &mut Vec<u64>) {
        let mut raw = Vec::new();
        self.dev.pop_completions(now, &mut raw);
        for id in raw {
            out.extend(self.inflight.remove(&id).expect("queued command"));
            self.out -= 1;
        }
        self.dispatch(now);
    }
}

/// Two disks behind one address space: the log disk from `at` on.
struct Split {
    a: Queue,
    b: Option<(u64, Queue)>,
    /// Flushes sent to both disks: id -> completions still expected.
    flush_left: HashMap<u64, u8>,
}

impl Split {
    fn submit(&mut self, now: Nanos, mut op: DevOp) {
        match &mut self.b {
            Some((at, b)) => match op.kind {
                DevOpKind::Flush => {
                    self.flush_left.insert(op.id, 2);
                    self.a.submit(now, op);
                    b.submit(now, op);
                }
                _ if op.offset >= *at => {
                    op.offset -= *at;
                    b.submit(now, op);
                }
                _ => self.a.submit(now, op),
            },
            None => self.a.submit(now, op),
        }
    }
    fn next_completion(&self) -> Option<Nanos> {
        let b = self.b.as_ref().and_then(|(_, b)| b.next_completion());
        match (self.a.next_completion(), b) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        }
    }
    fn pop(&mut self, now: Nanos, out: &mut Vec<u64>) {
        let mut raw = Vec::new();
        self.a.pop(now, &mut raw);
        if let Some((_, b)) = &mut self.b {
            b.pop(now, &mut raw);
        }
        for id in raw {
            match self.flush_left.get_mut(&id) {
                Some(n) if *n > 1 => *n -= 1,
                Some(_) => {
                    self.flush_left.remove(&id);
                    out.push(id);
                }
                None => out.push(id),
            }
        }
    }
}

/// Commands a disk model holds at once (NCQ plus the elevator's sorting
/// window); more wait in the queue and merge.
const DISK_QD: usize = 32;

/// Run `model` under `cfg`.
pub fn run(name: &str, model: &mut dyn Model, cfg: &AppConfig) -> Result<AppResult, String> {
    let bs = 4096u64;
    let backing_bytes = model.backing_bytes();
    let mut ecfg = Config::new(
        bs as u32,
        (cfg.cache_bytes / bs).max(16),
        backing_bytes,
        WritePolicyKind::WriteBack,
    );
    ecfg.replacement = ReplacementKind::Lru;
    ecfg.admission = cfg.policy.admission();
    ecfg.wal_ranges = model.wal_ranges();
    let mut eng: Engine<Phantom> = Engine::new(ecfg).map_err(|e| e.to_string())?;
    let mut cache = build(&cfg.cache_device, Some(cfg.cache_bytes * 2 + (64 << 20)))
        .map_err(|e| e.to_string())?;
    let b = match model.log_disk_at() {
        Some(at) => Some((
            at,
            Queue::new(
                build(&cfg.backing, Some(backing_bytes - at)).map_err(|e| e.to_string())?,
                DISK_QD,
            ),
        )),
        None => None,
    };
    let mut backing = Split {
        a: Queue::new(
            build(
                &cfg.backing,
                Some(model.log_disk_at().unwrap_or(backing_bytes)),
            )
            .map_err(|e| e.to_string())?,
            DISK_QD,
        ),
        b,
        flush_left: HashMap::new(),
    };
    let procs_spec = model.processes();
    let mut procs: Vec<Proc> = procs_spec
        .iter()
        .map(|(n, c)| Proc {
            name: n.clone(),
            critical: *c,
            inherited: false,
            inherited_via: Vec::new(),
            blocker: Blocker::None,
            blocked_at: 0,
            begin: 0,
            gen: 0,
            sync_bytes: 0,
            async_bytes: 0,
        })
        .collect();
    let mut locks: Vec<Lock> = (0..model.locks())
        .map(|_| Lock {
            owner: None,
            waiters: VecDeque::new(),
        })
        .collect();
    let mut conds: Vec<Vec<Pid>> = vec![Vec::new(); model.conds()];
    let mut rt = Rt {
        now: 0,
        rng: cfg.seed ^ 0x5DEE_CE66_D1CE_4E5B,
        last_req: 0,
        outstanding: HashMap::new(),
    };
    let mut io_waiters: HashMap<ReqId, Vec<Pid>> = HashMap::new();
    let mut timers: BinaryHeap<Reverse<(Nanos, u64, Pid, u64)>> = BinaryHeap::new();
    let mut timer_seq = 0u64;
    let mut ready: VecDeque<Pid> = (0..procs.len()).collect();
    let mut next_req: ReqId = 1;
    let mut next_devop = 1u64;
    let mut devops: HashMap<u64, (u64, Option<u32>)> = HashMap::new();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).expect("histogram");
    let mut requests = 0u64;
    let mut stats0 = None;
    let (mut inheritances, mut io_inheritances) = (0u64, 0u64);
    let mut wait_ns = [0u64; 3];
    let pi = cfg.policy.pi();
    let ioi = cfg.policy.ioi();
    let mut done = Vec::new();
    let debug = std::env::var_os("NVWC_APP_DEBUG").is_some();
    let mut timeout_served: Option<Nanos> = None;
    let mut timeline = cfg.timeline_ns.map(Timeline::new);
    let mut ends = 0u64;
    // Client FLUSH requests in flight (for the timeline's "behind a FLUSH").
    let mut flush_ids: std::collections::HashSet<ReqId> = Default::default();

    macro_rules! pump {
        () => {
            pump(&mut Pumped {
                eng: &mut eng,
                cache: &mut cache,
                backing: &mut backing,
                devops: &mut devops,
                next_devop: &mut next_devop,
                rt: &mut rt,
                io_waiters: &mut io_waiters,
                ready: &mut ready,
                model,
            })
        };
    }

    // Follow the dependency chain from critical process `p` (see the module docs).
    macro_rules! propagate {
        ($p:expr) => {{
            let mut cur = $p;
            for _ in 0..32 {
                let next = match procs[cur].blocker {
                    Blocker::Lock(l) => locks[l].owner,
                    Blocker::Cond(c) => model.signaller(c),
                    Blocker::Io(r) => {
                        if ioi && rt.outstanding.contains_key(&r) {
                            io_inheritances += 1;
                            eng.inherit_request(rt.now, r);
                        }
                        None
                    }
                    Blocker::None | Blocker::Timer => None,
                };
                let Some(n) = next else { break };
                if n == cur {
                    break;
                }
                if !procs[n].critical {
                    if !procs[n].inherited {
                        procs[n].inherited = true;
                        inheritances += 1;
                    }
                    let via = procs[cur].blocker;
                    if !procs[n].inherited_via.contains(&via) {
                        procs[n].inherited_via.push(via);
                    }
                }
                cur = n;
            }
        }};
    }

    loop {
        // Run every ready process until it blocks.
        while let Some(p) = ready.pop_front() {
            if procs[p].blocker != Blocker::None && procs[p].blocker != Blocker::Timer {
                // Woken: account the wait of a critical process.
                if procs[p].critical && rt.now >= cfg.warmup_ns {
                    let k = match procs[p].blocker {
                        Blocker::Lock(_) | Blocker::Cond(_) => 0,
                        Blocker::Io(_) => 1,
                        _ => 2,
                    };
                    wait_ns[k] += rt.now - procs[p].blocked_at.max(cfg.warmup_ns);
                }
            }
            procs[p].blocker = Blocker::None;
            for _ in 0..100_000 {
                let st = model.step(&mut rt, p);
                let now = rt.now;
                let block = |procs: &mut Vec<Proc>, b: Blocker| {
                    procs[p].blocker = b;
                    procs[p].blocked_at = now;
                };
                match st {
                    Step::Compute(d) => {
                        timer_seq += 1;
                        procs[p].gen += 1;
                        timers.push(Reverse((rt.now + d, timer_seq, p, procs[p].gen)));
                        block(&mut procs, Blocker::Timer);
                        break;
                    }
                    Step::Write {
                        offset,
                        len,
                        sync,
                        wait,
                        fua,
                    } => {
                        let id = next_req;
                        next_req += 1;
                        let crit = (procs[p].critical || pi && procs[p].inherited) && sync;
                        if sync {
                            procs[p].sync_bytes += len;
                        } else {
                            procs[p].async_bytes += len;
                        }
                        rt.outstanding.insert(id, p);
                        eng.handle_request(
                            rt.now,
                            Request {
                                id,
                                op: ReqOp::Write {
                                    offset,
                                    data: Phantom(len as usize),
                                    fua,
                                },
                                tag: Tag {
                                    client: p as u32,
                                    critical: crit,
                                    sync,
                                },
                            },
                        );
                        rt.last_req = id;
                        if wait {
                            io_waiters.entry(id).or_default().push(p);
                            block(&mut procs, Blocker::Io(id));
                            if procs[p].critical || procs[p].inherited {
                                propagate!(p);
                            }
                            break;
                        }
                    }
                    Step::Flush => {
                        if timeline.is_some() {
                            if flush_ids.len() > 4096 {
                                flush_ids.retain(|r| rt.outstanding.contains_key(r));
                            }
                            flush_ids.insert(next_req);
                        }
                        let id = next_req;
                        next_req += 1;
                        rt.outstanding.insert(id, p);
                        eng.handle_request(
                            rt.now,
                            Request {
                                id,
                                op: ReqOp::Flush,
                                tag: Tag {
                                    client: p as u32,
                                    critical: procs[p].critical || pi && procs[p].inherited,
                                    sync: true,
                                },
                            },
                        );
                        io_waiters.entry(id).or_default().push(p);
                        block(&mut procs, Blocker::Io(id));
                        break;
                    }
                    Step::Lock(l) => {
                        if locks[l].owner.is_none() {
                            locks[l].owner = Some(p);
                        } else {
                            assert_ne!(locks[l].owner, Some(p), "lock {l} taken twice by {p}");
                            locks[l].waiters.push_back(p);
                            block(&mut procs, Blocker::Lock(l));
                            if pi && (procs[p].critical || procs[p].inherited) {
                                propagate!(p);
                            }
                            break;
                        }
                    }
                    Step::Unlock(l) => {
                        assert_eq!(
                            locks[l].owner,
                            Some(p),
                            "unlock of lock {l} not held by {p}"
                        );
                        locks[l].owner = locks[l].waiters.pop_front();
                        if let Some(w) = locks[l].owner {
                            ready.push_back(w);
                        }
                        procs[p].inherited_via.retain(|&b| b != Blocker::Lock(l));
                        procs[p].inherited = !procs[p].inherited_via.is_empty();
                    }
                    Step::Wait(c) | Step::WaitTimeout(c, _) => {
                        conds[c].push(p);
                        if let Step::WaitTimeout(_, d) = st {
                            timer_seq += 1;
                            procs[p].gen += 1;
                            timers.push(Reverse((rt.now + d, timer_seq, p, procs[p].gen)));
                        }
                        block(&mut procs, Blocker::Cond(c));
                        if pi && (procs[p].critical || procs[p].inherited) {
                            propagate!(p);
                        }
                        break;
                    }
                    Step::Signal(c) => {
                        for w in std::mem::take(&mut conds[c]) {
                            procs[w].gen += 1; // cancels a pending timeout
                            ready.push_back(w);
                        }
                        procs[p].inherited_via.retain(|&b| b != Blocker::Cond(c));
                        procs[p].inherited = !procs[p].inherited_via.is_empty();
                    }
                    Step::WaitIo(r) => {
                        if rt.outstanding.contains_key(&r) {
                            io_waiters.entry(r).or_default().push(p);
                            block(&mut procs, Blocker::Io(r));
                            if procs[p].critical || procs[p].inherited {
                                propagate!(p);
                            }
                            break;
                        }
                    }
                    Step::Begin => procs[p].begin = rt.now,
                    Step::End(t) => {
                        ends += 1;
                        let t0 = t.unwrap_or(procs[p].begin);
                        if t0 >= cfg.warmup_ns {
                            requests += 1;
                            hist.saturating_record((rt.now - t0).max(1));
                        }
                    }
                }
            }
            // Engine outputs after the process ran.
            pump!();
        }
        if stats0.is_none() && rt.now >= cfg.warmup_ns {
            stats0 = Some(eng.stats());
        }
        // Next event.
        let mut t = u64::MAX;
        for x in [cache.next_completion(), backing.next_completion()]
            .into_iter()
            .flatten()
        {
            t = t.min(x);
        }
        // An engine deadline already due (it stays due while a device works)
        // is served once per instant, not spun on.
        match eng.poll_timeout() {
            Some(x) if x > rt.now => t = t.min(x),
            Some(_) if timeout_served != Some(rt.now) => {
                timeout_served = Some(rt.now);
                eng.handle_timeout(rt.now);
                pump!();
                continue;
            }
            _ => {}
        }
        if let Some(Reverse((x, ..))) = timers.peek() {
            t = t.min(*x);
        }
        // The clock moves to `t` (or to the end of the run); nothing below
        // changes the state before it does.
        if let Some(tl) = timeline.as_mut() {
            let end = t.min(cfg.duration_ns).max(rt.now);
            let s = snapshot(
                &eng,
                &procs,
                &locks,
                &backing,
                &flush_ids,
                ends,
                io_inheritances,
            );
            tl.advance(rt.now, end, &s);
        }
        if t > cfg.duration_ns {
            break;
        }
        if t == u64::MAX {
            // Nothing can happen any more: every process waits for something
            // no event will bring. A model or engine bug; say who waits on what.
            let blocked: Vec<String> = procs
                .iter()
                .map(|p| {
                    format!(
                        "{}:{:?}{}",
                        p.name,
                        p.blocker,
                        if p.inherited { "(inh)" } else { "" }
                    )
                })
                .collect();
            return Err(format!(
                "stuck at t={} ms: {}; engine: {}",
                rt.now / 1_000_000,
                blocked.join(" "),
                eng.debug_state()
            ));
        }
        if debug && t / 1_000_000_000 != rt.now / 1_000_000_000 {
            let blocked = procs
                .iter()
                .filter(|p| p.critical && !matches!(p.blocker, Blocker::None | Blocker::Timer))
                .count();
            eprintln!(
                "t={}s requests={requests} critical_blocked={blocked} disk: queued={} out={} next={:?} cache_next={:?} {}",
                t / 1_000_000_000,
                backing.a.q.len(),
                backing.a.out,
                backing.a.next_completion(),
                cache.next_completion(),
                eng.debug_state()
            );
        }
        rt.now = rt.now.max(t);
        if stats0.is_none() && rt.now >= cfg.warmup_ns {
            stats0 = Some(eng.stats());
        }
        done.clear();
        cache.pop_completions(rt.now, &mut done);
        for id in done.drain(..) {
            let (io, rl) = devops.remove(&id).expect("cache devop");
            eng.handle_completion(rt.now, io, Ok(rl.map(|l| Phantom(l as usize))));
        }
        backing.pop(rt.now, &mut done);
        for id in done.drain(..) {
            let (io, rl) = devops.remove(&id).expect("backing devop");
            eng.handle_completion(rt.now, io, Ok(rl.map(|l| Phantom(l as usize))));
        }
        if eng.poll_timeout().is_some_and(|x| x <= rt.now) {
            timeout_served = Some(rt.now);
            eng.handle_timeout(rt.now);
        }
        while let Some(Reverse((x, _, p, g))) = timers.peek().copied() {
            if x > rt.now {
                break;
            }
            timers.pop();
            if procs[p].gen == g {
                // A timed wait that timed out leaves its condition's waiters.
                if let Blocker::Cond(c) = procs[p].blocker {
                    conds[c].retain(|&w| w != p);
                }
                ready.push_back(p);
            }
        }
        pump!();
    }
    if std::env::var_os("NVWC_APP_DEBUG").is_some() {
        for pr in &procs {
            if pr.blocker != Blocker::None && rt.now - pr.blocked_at > 1_000_000_000 {
                eprintln!(
                    "{} {}: {} blocked on {:?} since {} ms",
                    cfg.policy.name(),
                    pr.name,
                    name,
                    pr.blocker,
                    pr.blocked_at / 1_000_000
                );
            }
        }
        eprintln!("{}", eng.debug_state());
    }
    let s0 = stats0.unwrap_or_default();
    let s1 = eng.stats();
    let secs = (cfg.duration_ns - cfg.warmup_ns) as f64 / 1e9;
    let write_bytes = s1.write_bytes - s0.write_bytes;
    let cached = write_bytes - (s1.bypassed_bytes - s0.bypassed_bytes)
        + (s1.reissued_writes - s0.reissued_writes) * bs;
    let throughput = requests as f64 / secs;
    let q = |p: f64| hist.value_at_quantile(p) as f64 / 1e6;
    let named: Vec<(String, u64, u64)> = {
        // Sum by process name without the instance number ("backend-3" -> "backend").
        let mut m: Vec<(String, u64, u64)> = Vec::new();
        for pr in &procs {
            let base = match pr.name.rsplit_once('-') {
                Some((b, n)) if n.chars().all(|c| c.is_ascii_digit()) => b,
                _ => pr.name.as_str(),
            };
            match m.iter_mut().find(|x| x.0 == base) {
                Some(x) => {
                    x.1 += pr.sync_bytes;
                    x.2 += pr.async_bytes;
                }
                None => m.push((base.to_string(), pr.sync_bytes, pr.async_bytes)),
            }
        }
        m
    };
    Ok(AppResult {
        app: name.to_string(),
        policy: cfg.policy.name().to_string(),
        nvwc_bytes: cfg.cache_bytes,
        nvwc_device: cfg.cache_device.name().to_string(),
        throughput,
        requests,
        cached_write_bytes: cached,
        write_bytes,
        efficiency: if cached > 0 {
            throughput / (cached as f64 / bs as f64)
        } else {
            0.0
        },
        latency_ms_avg: hist.mean() / 1e6,
        latency_ms_p99: q(0.99),
        latency_ms_p999: q(0.999),
        latency_ms_p9999: q(0.9999),
        stalled_writes: s1.stalled_writes - s0.stalled_writes,
        reissued_writes: s1.reissued_writes - s0.reissued_writes,
        inheritances,
        io_inheritances,
        sync_bytes_by_process: named.iter().map(|x| (x.0.clone(), x.1)).collect(),
        async_bytes_by_process: named.iter().map(|x| (x.0.clone(), x.2)).collect(),
        critical_wait_ms: [
            ("process".into(), wait_ns[0] as f64 / 1e6),
            ("io".into(), wait_ns[1] as f64 / 1e6),
            ("other".into(), wait_ns[2] as f64 / 1e6),
        ],
        timeline: timeline.map(Timeline::finish).unwrap_or_default(),
    })
}

/// The I/O request `p` waits for behind a lock: the holder's (or its
/// holder's, and so on), if the chain of lock holders ends at one.
fn behind_io(procs: &[Proc], locks: &[Lock], p: Pid) -> Option<ReqId> {
    let mut cur = p;
    for _ in 0..procs.len() {
        let Blocker::Lock(l) = procs[cur].blocker else {
            break;
        };
        match locks[l].owner {
            Some(o) if o != cur => cur = o,
            _ => return None,
        }
        if let Blocker::Io(r) = procs[cur].blocker {
            return Some(r);
        }
    }
    None
}

/// The state a timeline sample reads (see `timeline.rs`).
fn snapshot(
    eng: &Engine<Phantom>,
    procs: &[Proc],
    locks: &[Lock],
    backing: &Split,
    flush_ids: &std::collections::HashSet<ReqId>,
    ends: u64,
    io_inherits: u64,
) -> Snapshot {
    let s = eng.stats();
    let blocked = |f: fn(&Blocker) -> bool| {
        procs
            .iter()
            .filter(|p| (p.critical || p.inherited) && f(&p.blocker))
            .count() as u32
    };
    let queue = |q: &Queue| (q.q.len() + q.out) as u32;
    let blocks = eng.config().capacity_blocks as f64;
    // The I/O each critical process waits for behind a lock holder.
    let behind: Vec<ReqId> = (0..procs.len())
        .filter(|&p| procs[p].critical || procs[p].inherited)
        .filter_map(|p| behind_io(procs, locks, p))
        .collect();
    Snapshot {
        ends,
        dirty_frac: eng.dirty_versions() as f64 / blocks,
        free_frac: s.free_slots as f64 / blocks,
        stalled: s.stalled_writes,
        reissued: s.reissued_writes,
        io_inherits,
        critical_on_io: blocked(|b| matches!(b, Blocker::Io(_))),
        critical_on_process: blocked(|b| matches!(b, Blocker::Lock(_) | Blocker::Cond(_))),
        critical_behind_io: behind.len() as u32,
        critical_behind_flush: behind.iter().filter(|r| flush_ids.contains(r)).count() as u32,
        flushes: s.flushes,
        backing_flushes: s.backing_flushes,
        backing_queue: queue(&backing.a) + backing.b.as_ref().map_or(0, |(_, q)| queue(q)),
    }
}

/// A run as the engine's pump sees it: device commands go to the device
/// models (those with nothing to do complete at once), replies to the
/// model and to the processes waiting for them.
struct Pumped<'a> {
    eng: &'a mut Engine<Phantom>,
    cache: &'a mut Box<dyn DeviceModel>,
    backing: &'a mut Split,
    /// Device operation id to the engine's command and its read length.
    devops: &'a mut HashMap<u64, (u64, Option<u32>)>,
    next_devop: &'a mut u64,
    rt: &'a mut Rt,
    io_waiters: &'a mut HashMap<ReqId, Vec<Pid>>,
    ready: &'a mut VecDeque<Pid>,
    model: &'a mut dyn Model,
}

impl Driver<Phantom> for Pumped<'_> {
    fn engine(&mut self) -> &mut Engine<Phantom> {
        self.eng
    }
    fn command(&mut self, cmd: IoCmd<Phantom>) {
        let id = *self.next_devop;
        *self.next_devop += 1;
        // A trim has nothing to do on these models (write-back never
        // sends one to a device it does not own; group markers are free).
        let Some((op, rl)) =
            crate::driver::dev_op(id, &cmd.op).filter(|(op, _)| op.kind != DevOpKind::Trim)
        else {
            self.eng.handle_completion(self.rt.now, cmd.id, Ok(None));
            return;
        };
        self.devops.insert(id, (cmd.id, rl));
        match cmd.dev {
            Dev::Cache => self.cache.submit(self.rt.now, op),
            Dev::Backing => self.backing.submit(self.rt.now, op),
        }
    }
    fn reply(&mut self, r: Reply<Phantom>) {
        assert!(r.result.is_ok(), "simulated I/O cannot fail: {r:?}");
        if self.rt.outstanding.remove(&r.id).is_some() {
            self.model.io_done(self.rt, r.id);
        }
        self.ready
            .extend(self.io_waiters.remove(&r.id).unwrap_or_default());
    }
}
