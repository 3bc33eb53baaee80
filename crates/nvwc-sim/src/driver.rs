//! The discrete-event driver: the engine, a cache device model, a backing
//! device model and a trace-driven client population, in virtual time.
//!
//! # Time and events
//! Virtual time is in nanoseconds. The driver repeatedly takes the earliest of:
//! the next completion of either device model, the engine's timeout, and (open
//! loop) the next trace arrival; it advances time to it, feeds the engine the
//! completions, the timeout and the arrivals, and then drains every engine
//! output at that instant (device commands, replies, events) until the engine
//! is quiet. Nothing is random: a run is a function of the trace and the
//! configuration.
//!
//! # Device commands
//! * `Dev::Cache` commands go to the cache device model as they come.
//! * `Dev::Backing` commands go through a driver queue that keeps at most
//!   [`SimConfig::backing_qd`] commands outstanding on the backing model (like
//!   a block layer's hardware queue depth; [`default_backing_qd`] is 1 for a
//!   disk or networked store, 32 otherwise). While they wait, a backing write is merged into a
//!   queued write it extends (back or front merge; same FUA flag; at most
//!   [`SimConfig::max_merge_bytes`]; never across a queued non-write command,
//!   which is a barrier) when [`SimConfig::merge_backing`] is on (default),
//!   as an elevator would. Every engine write of a merged command completes
//!   with it. The *contiguous runs* of the metrics are maximal sequences of
//!   backing device writes dispatched back to back, each starting where the
//!   previous one ended; they are counted with or without merging.
//! * `GroupBegin` completes immediately. What `GroupEnd` costs is
//!   [`SimConfig::group_end`]:
//!   - [`GroupEndCost::Redo`] (default): what `nvwc serve` pays, the redo-log
//!     protocol of `nvwc-dev/src/redo.rs` (log the group durably, write it in
//!     place, flush; the log is cleared only before a write outside a group,
//!     which the engine sends only for an admission bypass). The group's
//!     writes go in place as the engine issues them; its `GroupEnd` then
//!     costs the log write (the group's bytes in the log's encoding, 20 bytes
//!     plus 16 per record, rounded up to 4 KiB, written sequentially in a log
//!     area past the backing store's end), a flush, and the flush after the
//!     in-place writes. (A bypass's clear of the log is not charged.) The device work is the
//!     server's; its order differs (the server logs before it writes in place,
//!     and holds the in-place writes until then), so a group's end may come
//!     sooner here than live, never with less device work;
//!   - [`GroupEndCost::Free`]: completes immediately (the write-policy
//!     paper's storage-side journal is NVRAM, "eliminat[ing] the need to incur
//!     additional storage I/Os for atomic group updates", §3.2.1; the
//!     write-policy reproduction uses it);
//!   - [`GroupEndCost::WriteFlush`]: one 4 KiB backing write (a commit record
//!     in a log area of 1 MiB past the backing store's end, used circularly)
//!     followed by a backing flush.
//!
//! # Clients
//! * **Closed loop** ([`Mode::Closed`], default): each client (by
//!   [`ClientKey`], default the trace's `stream`) keeps at most
//!   [`SimConfig::qd`] requests outstanding and issues its records in trace
//!   order; the next one goes out the instant one completes. The driver reads
//!   ahead at most [`SimConfig::lookahead`] records, so a blocked client can
//!   hold up others only beyond that window. Trace timestamps are ignored.
//! * **Open loop** ([`Mode::Open`]): record `i` arrives at `ts_i / speedup`
//!   whatever the state of earlier requests (at most
//!   [`SimConfig::max_outstanding`] in flight; later arrivals wait, and their
//!   latency counts from their arrival).
//!
//! Requests are handed to the engine as they are, except that reads, writes
//! and trims longer than the engine's [`Engine::max_write_bytes`] are split
//! at multiples of it; a request completes when its last part does.
//! Records of zero length are skipped (counted in nothing).
//!
//! # Memory
//! Bounded by the engine (per cache block), the requests in flight, the
//! look-ahead window and fixed-size histograms: never by the trace length
//! (interval snapshots, when asked for, grow with virtual time).

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use nvwc_core::{
    Config, Dev, Engine, FetchMode, IoCmd, IoId, IoOp, Phantom, ReplacementKind, ReqId, ReqOp,
    Request, Tag, Watermarks, WritePolicyKind,
};
use nvwc_mrc::MixBuildHasher;
use nvwc_trace::{Op, TraceError, TraceRecord};

use crate::cpu::{CpuCost, CpuQueue};
use crate::device::{build, DevOp, DevOpKind, DeviceModel, DeviceSpec, Nanos};
use crate::idring::IdRing;
use crate::metrics::{IntervalRecord, Latency, RunHistogram, RunResult};
use crate::SimError;

mod pumped;

type Map<K, V> = HashMap<K, V, MixBuildHasher>;

/// A unit enum of options with their names: `FromStr` takes a name (or an
/// alias after `|`) and, for any other string, lists the names.
macro_rules! named_options {
    ($(#[$meta:meta])* $vis:vis enum $name:ident($what:literal) {
        $($(#[$vmeta:meta])* $variant:ident = $text:literal $(| $alias:literal)*,)+
    }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
        $vis enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($text $(| $alias)* => Ok($name::$variant),)+
                    _ => Err(format!("unknown {} {s:?} ({})", $what, [$($text),+].join(", "))),
                }
            }
        }
    };
}

named_options! {
    /// Replay mode.
    pub enum Mode("mode") {
        /// N outstanding requests per client.
        #[default]
        Closed = "closed",
        /// Arrivals at trace timestamps divided by the speed-up.
        Open = "open",
    }
}

named_options! {
    /// What identifies a client in closed loop.
    pub enum ClientKey("client key") {
        /// The record's `stream` (pid/tid when the format has one).
        #[default]
        Stream = "stream",
        /// The record's `dev` (volume, disk).
        Dev = "dev",
        /// One client for the whole trace.
        Single = "single" | "none",
    }
}

named_options! {
    /// Cost of a `GroupEnd` marker (see the module docs).
    pub enum GroupEndCost("group-end cost") {
        /// The live server's redo log: log write, flush, flush.
        #[default]
        Redo = "redo",
        /// Completes immediately.
        Free = "free",
        /// One 4 KiB backing write then a backing flush.
        WriteFlush = "write-flush",
    }
}

/// Optional overrides of the engine's defaults ([`Config::new`]).
#[derive(Clone, Debug, Default)]
pub struct EngineTuning {
    /// Dirty watermarks `(high, low)` as fractions of the capacity.
    pub watermarks: Option<(f64, f64)>,
    /// Journaled: transaction size limit (blocks).
    pub txn_max_blocks: Option<u32>,
    /// Journaled: transaction age limit (ns, 0 = none).
    pub txn_max_age_ns: Option<u64>,
    /// Journaled: checkpoint delay (ns).
    pub checkpoint_delay_ns: Option<u64>,
    /// Journaled: transactions merged per checkpoint.
    pub checkpoint_merge_max: Option<u32>,
    /// Journaled: the journal's size bound (blocks, 0 = the cache's).
    pub journal_size_blocks: Option<u64>,
    /// Allocate cache blocks on read misses.
    pub read_allocate: Option<bool>,
    /// Ordered: pipelined waves (`Config::ordered_pipeline`).
    pub ordered_pipeline: Option<bool>,
    /// Destage writes in flight.
    pub max_destage_inflight: Option<u32>,
    /// Partial writes to uncached blocks: fetch-before-write or patches.
    pub fetch: Option<FetchMode>,
    /// Patch RAM limit (bytes).
    pub patch_mem_bytes: Option<u64>,
    /// Write-back: write patched blocks back without a fetch.
    pub patch_direct: Option<bool>,
    /// Write-back: writes that would wait for space go around the cache
    /// (`Config::bypass_when_full`; off by default, as in the papers).
    pub bypass_when_full: Option<bool>,
    /// Admission policy (trace records carry no hints: every request is
    /// untagged, FUA writes are synchronous).
    pub admission: Option<nvwc_core::AdmissionKind>,
}

/// One run's configuration.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Write policy.
    pub write_policy: WritePolicyKind,
    /// Replacement policy.
    pub replacement: ReplacementKind,
    /// Cache data capacity in bytes (rounded down to blocks; at least 16 blocks).
    pub cache_bytes: u64,
    /// Cache block size in bytes.
    pub block_size: u32,
    /// Backing device model.
    pub backing: DeviceSpec,
    /// Cache device model.
    pub cache_device: DeviceSpec,
    /// Replay mode.
    pub mode: Mode,
    /// Closed loop: outstanding requests per client (>= 1).
    pub qd: u32,
    /// Closed loop: records read ahead at most.
    pub lookahead: usize,
    /// Closed loop: client identity.
    pub client_key: ClientKey,
    /// Open loop: timestamps are divided by this (> 0).
    pub speedup: f64,
    /// Open loop: most requests in flight.
    pub max_outstanding: usize,
    /// Coalesce adjacent back-to-back backing writes into one device command.
    pub merge_backing: bool,
    /// Largest coalesced backing write.
    pub max_merge_bytes: u64,
    /// Queued backing reads are dispatched before queued writes (not past a
    /// flush), as a deadline-style block scheduler favours reads.
    pub read_priority: bool,
    /// Backing commands the driver keeps outstanding on the backing device;
    /// more wait in the driver's queue, where adjacent writes merge.
    pub backing_qd: usize,
    /// Cost of `GroupEnd`.
    pub group_end: GroupEndCost,
    /// Host CPU time per request (`cpu.rs`; default: measured on this
    /// machine).
    pub cpu: CpuCost,
    /// Interval of virtual time between snapshots (None: no snapshots).
    pub interval_ns: Option<u64>,
    /// Engine overrides.
    pub tuning: EngineTuning,
    /// Free-text label copied into the result.
    pub label: String,
}

impl SimConfig {
    /// Defaults: closed loop, QD 1, `nvdram` cache device, `net` backing
    /// (driver backing queue depth 1), 4 KiB blocks.
    pub fn new(
        write_policy: WritePolicyKind,
        replacement: ReplacementKind,
        cache_bytes: u64,
    ) -> Self {
        SimConfig {
            write_policy,
            replacement,
            cache_bytes,
            block_size: 4096,
            backing: DeviceSpec::preset("net").expect("preset"),
            cache_device: DeviceSpec::preset("nvdram").expect("preset"),
            mode: Mode::Closed,
            qd: 1,
            lookahead: 256,
            client_key: ClientKey::Stream,
            speedup: 1.0,
            max_outstanding: 65_536,
            merge_backing: true,
            max_merge_bytes: 1 << 20,
            backing_qd: 1,
            read_priority: true,
            group_end: GroupEndCost::Redo,
            cpu: CpuCost::measured(),
            interval_ns: None,
            tuning: EngineTuning::default(),
            label: String::new(),
        }
    }

    /// Bytes reserved past the backing store for group-commit records: for
    /// the redo log, room for a group as large as the cache in the log's
    /// encoding (no group holds more than the cache's dirty blocks).
    pub fn reserve_bytes(&self) -> u64 {
        match self.group_end {
            GroupEndCost::Free => 0,
            GroupEndCost::WriteFlush => GROUP_LOG_BYTES,
            GroupEndCost::Redo => redo_log_bytes(
                self.cache_bytes,
                self.cache_bytes / u64::from(self.block_size).max(1),
            ),
        }
    }

    /// Engine configuration for a backing store of `backing_size` bytes.
    pub fn engine_config(&self, backing_size: u64) -> Config {
        let bs = self.block_size as u64;
        let mut c = Config::new(
            self.block_size,
            (self.cache_bytes / bs).max(1),
            backing_size,
            self.write_policy,
        );
        c.replacement = self.replacement;
        let t = &self.tuning;
        if let Some((high, low)) = t.watermarks {
            c.watermarks = Watermarks { high, low };
        }
        if let Some(v) = t.txn_max_blocks {
            c.journal.txn_max_blocks = v;
        }
        if let Some(v) = t.txn_max_age_ns {
            c.journal.txn_max_age_ns = v;
        }
        if let Some(v) = t.checkpoint_delay_ns {
            c.journal.checkpoint_delay_ns = v;
        }
        if let Some(v) = t.checkpoint_merge_max {
            c.journal.checkpoint_merge_max = v;
        }
        if let Some(v) = t.journal_size_blocks {
            c.journal.size_blocks = v;
        }
        if let Some(v) = t.read_allocate {
            c.read_allocate = v;
        }
        if let Some(v) = t.ordered_pipeline {
            c.ordered_pipeline = v;
        }
        if let Some(v) = t.max_destage_inflight {
            c.max_destage_inflight = v;
        }
        if let Some(v) = t.fetch {
            c.fetch = v;
        }
        if let Some(v) = t.patch_mem_bytes {
            c.patch_mem_bytes = v;
        }
        if let Some(v) = t.patch_direct {
            c.patch_direct = v;
        }
        if let Some(v) = t.bypass_when_full {
            c.bypass_when_full = v;
        }
        if let Some(v) = t.admission {
            c.admission = v;
        }
        c
    }
}

/// Default driver queue depth for a backing model: 1 for a disk and for
/// networked storage (the `net` preset serves one request at a time, so one
/// outstanding command loses no throughput, queued destages merge as the
/// stack-model paper's segment writes do, and the read-first queue can put
/// client reads ahead of queued destages), 32 for solid-state devices and
/// arrays.
pub fn default_backing_qd(spec: &DeviceSpec) -> usize {
    match spec {
        DeviceSpec::Hdd(_) | DeviceSpec::Net(_) => 1,
        _ => 32,
    }
}

/// Size of the group-commit log area past the backing store.
pub const GROUP_LOG_BYTES: u64 = 1 << 20;

/// Bytes of a redo log holding `records` writes of `data` bytes in all, in
/// `nvwc-dev`'s encoding (`redo::encode`: a 16-byte header and a 4-byte
/// CRC-32, 16 bytes before each record), rounded up to the 4 KiB pages it
/// is written in.
pub fn redo_log_bytes(data: u64, records: u64) -> u64 {
    (20 + 16 * records + data).div_ceil(4096) * 4096
}

/// A device command in flight, by driver-chosen device-op id.
#[derive(Debug)]
enum InFlight {
    /// One engine command (`read_len`: Some for reads).
    One { io: IoId, read_len: Option<u32> },
    /// Several coalesced backing writes.
    Merged(Vec<IoId>),
    /// `GroupEnd` with a cost: one step of it in flight, the rest after.
    GroupStep { io: IoId, rest: VecDeque<DevOp> },
}

/// A backing command waiting in the driver's queue.
#[derive(Debug)]
enum Queued {
    /// A write (possibly several engine writes merged).
    Write {
        off: u64,
        len: u64,
        fua: bool,
        ios: Vec<IoId>,
    },
    /// Anything else (a barrier for merging); its id is assigned at dispatch.
    Other(DevOp, InFlight),
}

/// A client request in flight.
#[derive(Debug)]
struct Pending {
    client: u32,
    op: Op,
    arrived: Nanos,
    parts_left: u32,
    bytes: u64,
    failed: bool,
}

#[derive(Debug, Default)]
struct Client {
    outstanding: u32,
    queue: VecDeque<TraceRecord>,
}

/// Counters the driver keeps itself (the engine keeps the rest).
#[derive(Clone, Debug, Default)]
struct Counts {
    requests: u64,
    reads: u64,
    writes: u64,
    flushes: u64,
    trims: u64,
    errors: u64,
    read_bytes: u64,
    write_bytes: u64,
    runs: u64,
    queued_writes: u64,
    backing_dev_writes: u64,
    group_writes: u64,
    group_log_bytes: u64,
    cache_ops: u64,
}

/// Device commands the engine has issued so far (for the stall proxy).
/// The device command for an engine command with id `id`, and the length a
/// read returns; `None` for group markers and checksums (no device work: a
/// log commit's CRC-32C runs over data the host holds in memory, at
/// several GB/s per core with SSE4.2's `crc32` instruction; the model
/// charges no CPU time for it, as for any other request processing).
pub(crate) fn dev_op(id: u64, op: &IoOp<Phantom>) -> Option<(DevOp, Option<u32>)> {
    Some(match *op {
        IoOp::Read { offset, len } => (DevOp::read(id, offset, len as u64), Some(len)),
        IoOp::Write {
            offset,
            ref data,
            fua,
        } => (
            DevOp {
                id,
                kind: DevOpKind::Write,
                offset,
                len: data.0 as u64,
                fua,
            },
            None,
        ),
        IoOp::Flush => (DevOp::flush(id), None),
        IoOp::Trim { offset, len } => (DevOp::trim(id, offset, len as u64), None),
        IoOp::GroupBegin { .. } | IoOp::GroupEnd { .. } | IoOp::Checksum { .. } => return None,
    })
}

fn io_count(s: &nvwc_core::Stats) -> u64 {
    s.cache_reads + s.cache_writes + s.backing_reads + s.backing_writes
}

/// Snapshot of cumulative counters at an interval boundary.
#[derive(Clone, Debug, Default)]
struct Mark {
    c: Counts,
    e: nvwc_core::Stats,
}

/// The simulator for one run. See the module docs.
pub struct Simulator<I: Iterator<Item = Result<TraceRecord, TraceError>>> {
    cfg: SimConfig,
    trace_name: String,
    engine: Engine<Phantom>,
    cache: Box<dyn DeviceModel>,
    backing: Box<dyn DeviceModel>,
    backing_size: u64,
    source: I,
    source_done: bool,
    /// Records taken from the trace so far.
    pulled: u64,
    now: Nanos,
    // Requests.
    next_req: ReqId,
    pending: IdRing<Pending>,
    part_of: IdRing<u64>,
    clients: Map<u32, Client>,
    buffered: usize,
    peeked: Option<TraceRecord>,
    open_waiting: VecDeque<(TraceRecord, Nanos)>,
    // Devices.
    next_dev_op: u64,
    inflight: IdRing<InFlight>,
    immediate: VecDeque<IoId>,
    /// Backing commands waiting for a device queue slot (writes may merge here).
    bqueue: VecDeque<Queued>,
    backing_outstanding: usize,
    /// End offset of the last dispatched backing write and the current run's length.
    run_end: Option<u64>,
    run_len: u64,
    group_log_next: u64,
    /// Open atomic groups: bytes and records written so far (redo-log cost).
    group_bytes: HashMap<u64, (u64, u64)>,
    done_buf: Vec<u64>,
    // Metrics.
    counts: Counts,
    runs: RunHistogram,
    lat_all: Latency,
    lat_read: Latency,
    lat_write: Latency,
    lat_flush: Latency,
    lat_interval: Latency,
    last_reply: Nanos,
    /// Requests whose I/O is done, waiting for their CPU time (`cpu.rs`).
    cpu_queue: CpuQueue<ReqId>,
    dirty_peak: u64,
    dirty_integral: u128,
    next_boundary: Option<Nanos>,
    mark: Mark,
    mark_end: Nanos,
    started: bool,
    intervals: Vec<IntervalRecord>,
    stale_timeout_spins: u64,
    timeout_fired_at: Option<Nanos>,
}

/// Runs one simulation of `plan`'s trace with `cfg` (convenience wrapper).
pub fn run_plan(
    cfg: &SimConfig,
    plan: &crate::addr::TracePlan,
    limit: Option<u64>,
) -> Result<RunResult, SimError> {
    let recs = crate::addr::MappedRecords::open(plan, limit)?;
    let name = plan
        .path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Simulator::new(cfg.clone(), plan.backing_size, recs, name)?.run()
}

impl<I: Iterator<Item = Result<TraceRecord, TraceError>>> Simulator<I> {
    /// A simulator over `source`, whose records must lie within
    /// `backing_size` bytes (already mapped, see [`crate::addr`]).
    pub fn new(
        cfg: SimConfig,
        backing_size: u64,
        source: I,
        trace_name: impl Into<String>,
    ) -> Result<Self, SimError> {
        if cfg.qd == 0 {
            return Err(SimError::Config("qd must be at least 1".into()));
        }
        if !(cfg.speedup.is_finite() && cfg.speedup > 0.0) {
            return Err(SimError::Config("speedup must be positive".into()));
        }
        let bs = cfg.block_size as u64;
        let backing_size = backing_size.max(bs).next_multiple_of(bs);
        let ecfg = cfg.engine_config(backing_size);
        let engine = Engine::new(ecfg).map_err(|e| SimError::Config(e.to_string()))?;
        let cache_bytes = engine.layout().device_bytes();
        let cache = build(&cfg.cache_device, Some(cache_bytes))?;
        let backing = build(&cfg.backing, Some(backing_size + cfg.reserve_bytes()))?;
        let next_boundary = cfg.interval_ns.filter(|&i| i > 0);
        Ok(Simulator {
            trace_name: trace_name.into(),
            engine,
            cache,
            backing,
            backing_size,
            source,
            source_done: false,
            pulled: 0,
            now: 0,
            next_req: 1,
            pending: IdRing::default(),
            part_of: IdRing::default(),
            clients: Map::default(),
            buffered: 0,
            peeked: None,
            open_waiting: VecDeque::new(),
            next_dev_op: 1,
            inflight: IdRing::default(),
            immediate: VecDeque::new(),
            bqueue: VecDeque::new(),
            backing_outstanding: 0,
            run_end: None,
            run_len: 0,
            group_log_next: 0,
            group_bytes: HashMap::new(),
            done_buf: Vec::new(),
            counts: Counts::default(),
            runs: RunHistogram::default(),
            lat_all: Latency::default(),
            lat_read: Latency::default(),
            lat_write: Latency::default(),
            lat_flush: Latency::default(),
            lat_interval: Latency::default(),
            last_reply: 0,
            cpu_queue: CpuQueue::default(),
            dirty_peak: 0,
            dirty_integral: 0,
            next_boundary,
            mark: Mark::default(),
            mark_end: 0,
            started: false,
            intervals: Vec::new(),
            stale_timeout_spins: 0,
            timeout_fired_at: None,
            cfg,
        })
    }

    /// The engine (for inspection in tests).
    pub fn engine(&self) -> &Engine<Phantom> {
        &self.engine
    }

    /// Current virtual time.
    pub fn now(&self) -> Nanos {
        self.now
    }

    /// Client requests in flight.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Runs to the end of the trace (every request replied) and returns the metrics.
    pub fn run(mut self) -> Result<RunResult, SimError> {
        let wall = Instant::now();
        while self.step()? {}
        Ok(self.finish(wall.elapsed().as_secs_f64()))
    }

    /// One event step. Returns `Ok(false)` once the trace is exhausted and
    /// every request has been replied to.
    pub fn step(&mut self) -> Result<bool, SimError> {
        if !self.started {
            self.started = true;
            self.feed()?;
            self.pump();
        }
        if self.source_done && self.pending.is_empty() && self.open_waiting.is_empty() {
            return Ok(false);
        }
        let mut next: Option<Nanos> = None;
        let mut consider = |t: Option<Nanos>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n: Nanos| n.min(t)));
            }
        };
        consider(self.cache.next_completion());
        consider(self.backing.next_completion());
        consider(self.cpu_queue.next_at());
        if self.cfg.mode == Mode::Open && self.pending.len() < self.cfg.max_outstanding {
            consider(self.open_waiting.front().map(|&(_, at)| at));
        }
        let tmo = self.engine.poll_timeout();
        match tmo {
            Some(t) if t <= self.now && self.timeout_fired_at == Some(self.now) => {
                // The engine already had its timeout at this instant; it is
                // waiting for something else (e.g. a commit in flight).
            }
            t => consider(t),
        }
        let t = match next {
            Some(t) => t.max(self.now),
            None => {
                if tmo.is_some() {
                    // Only a stale timeout remains: let a microsecond pass.
                    self.stale_timeout_spins += 1;
                    if self.stale_timeout_spins > 1_000_000 {
                        return Err(
                            self.stuck("engine keeps asking for a timeout without progress")
                        );
                    }
                    self.now + 1_000
                } else {
                    // Requests can complete with no device I/O at all (a
                    // write that becomes a patch): then more can be issued now.
                    let before = self.pulled;
                    self.feed()?;
                    self.pump();
                    if self.pulled != before
                        || (self.source_done
                            && self.pending.is_empty()
                            && self.open_waiting.is_empty())
                    {
                        return Ok(true);
                    }
                    return Err(self.stuck("no event pending while requests are in flight"));
                }
            }
        };
        self.advance_to(t);
        self.pop_device(t, false);
        self.pop_device(t, true);
        while let Some(parent) = self.cpu_queue.pop_done(t) {
            self.complete(parent);
        }
        if self.engine.poll_timeout().is_some_and(|x| x <= t) && self.timeout_fired_at != Some(t) {
            self.engine.handle_timeout(t);
            self.timeout_fired_at = Some(t);
        }
        self.feed()?;
        self.pump();
        self.feed()?;
        self.pump();
        Ok(true)
    }

    fn stuck(&self, why: &str) -> SimError {
        SimError::Stuck(format!(
            "{why} at t={} ns with {} requests in flight; engine: {}",
            self.now,
            self.pending.len(),
            self.engine.debug_state()
        ))
    }

    fn advance_to(&mut self, t: Nanos) {
        if t > self.now {
            while let Some(b) = self.next_boundary {
                if b > t {
                    break;
                }
                let dt = b.saturating_sub(self.now);
                self.dirty_integral += self.engine.dirty_versions() as u128 * dt as u128;
                self.now = self.now.max(b);
                self.snapshot(b);
                self.next_boundary = Some(b + self.cfg.interval_ns.unwrap_or(1).max(1));
            }
            let dt = t - self.now;
            self.dirty_integral += self.engine.dirty_versions() as u128 * dt as u128;
            self.now = t;
            self.stale_timeout_spins = 0;
        }
    }

    fn snapshot(&mut self, end: Nanos) {
        let start = self.mark_end;
        let e = self.engine.stats();
        let c = self.counts.clone();
        let (pc, pe) = (&self.mark.c, &self.mark.e);
        let secs = (end.saturating_sub(start)).max(1) as f64 / 1e9;
        let reqs = c.requests - pc.requests;
        let bytes = (c.read_bytes - pc.read_bytes) + (c.write_bytes - pc.write_bytes);
        self.intervals.push(IntervalRecord {
            start_us: start as f64 / 1e3,
            end_us: end as f64 / 1e3,
            requests: reqs,
            reads: c.reads - pc.reads,
            writes: c.writes - pc.writes,
            read_hits: e.read_hits - pe.read_hits,
            write_hits: e.write_hits - pe.write_hits,
            overwrites: e.overwrites - pe.overwrites,
            backing_writes: e.backing_writes - pe.backing_writes,
            backing_write_bytes: e.backing_write_bytes - pe.backing_write_bytes,
            backing_write_runs: c.runs - pc.runs,
            stalled_writes: e.stalled_writes - pe.stalled_writes,
            queued_writes: c.queued_writes - pc.queued_writes,
            stall_time_us: (e.stall_ns - pe.stall_ns) as f64 / 1e3,
            dirty_blocks: e.dirty_blocks,
            iops: reqs as f64 / secs,
            mbps: bytes as f64 / secs / 1e6,
            latency_us_p50: self.lat_interval.quantile_us(0.5),
            latency_us_p99: self.lat_interval.quantile_us(0.99),
        });
        self.lat_interval.reset();
        self.mark = Mark { c, e };
        self.mark_end = end;
    }

    // ------------------------------------------------------------ clients

    fn client_of(&self, r: &TraceRecord) -> u32 {
        match self.cfg.client_key {
            ClientKey::Stream => r.stream,
            ClientKey::Dev => r.dev,
            ClientKey::Single => 0,
        }
    }

    fn pull(&mut self) -> Result<Option<TraceRecord>, SimError> {
        if self.source_done {
            return Ok(None);
        }
        loop {
            match self.source.next() {
                None => {
                    self.source_done = true;
                    return Ok(None);
                }
                Some(Err(e)) if e.is_fatal() => return Err(SimError::Trace(e)),
                Some(Err(_)) => continue,
                Some(Ok(r)) => {
                    if r.op != Op::Flush && r.len == 0 {
                        continue;
                    }
                    if r.op != Op::Flush && r.end() > self.backing_size {
                        return Err(SimError::Config(format!(
                            "record at offset {} + {} is beyond the {}-byte backing store",
                            r.offset, r.len, self.backing_size
                        )));
                    }
                    self.pulled += 1;
                    return Ok(Some(r));
                }
            }
        }
    }

    /// Issues whatever the replay mode allows now.
    fn feed(&mut self) -> Result<(), SimError> {
        match self.cfg.mode {
            Mode::Closed => {
                while self.buffered < self.cfg.lookahead {
                    let Some(r) = self.pull()? else { break };
                    let c = self.client_of(&r);
                    let cl = self.clients.entry(c).or_default();
                    if cl.outstanding < self.cfg.qd && cl.queue.is_empty() {
                        cl.outstanding += 1;
                        let now = self.now;
                        self.issue(r, c, now);
                    } else {
                        cl.queue.push_back(r);
                        self.buffered += 1;
                    }
                }
            }
            Mode::Open => {
                // Move arrivals due by now into the waiting queue (bounded by
                // what is due; later records stay in the reader).
                loop {
                    if self.peeked.is_none() {
                        self.peeked = self.pull()?;
                    }
                    let Some(r) = self.peeked else { break };
                    let at = (r.ts_ns as f64 / self.cfg.speedup) as Nanos;
                    if at > self.now && !self.open_waiting.is_empty() {
                        break;
                    }
                    if at > self.now {
                        // Keep exactly one future arrival visible to the event loop.
                        self.open_waiting.push_back((r, at));
                        self.peeked = None;
                        break;
                    }
                    self.open_waiting.push_back((r, at));
                    self.peeked = None;
                }
                while self.pending.len() < self.cfg.max_outstanding {
                    match self.open_waiting.front() {
                        Some(&(r, at)) if at <= self.now => {
                            self.open_waiting.pop_front();
                            let c = self.client_of(&r);
                            self.issue(r, c, at);
                        }
                        _ => break,
                    }
                }
            }
        }
        Ok(())
    }

    fn issue(&mut self, r: TraceRecord, client: u32, arrived: Nanos) {
        let parent = self.next_req;
        let tag = Tag {
            client,
            ..Tag::default()
        };
        let bs = self.cfg.block_size as u64;
        let chunk = (self.engine.max_write_bytes() / bs).max(1) * bs;
        let chunk = chunk.min(1 << 30);
        // Parts split at multiples of `chunk` (records of zero length never
        // get here, except flushes).
        let end = r.offset + r.len;
        let n_parts = match r.op {
            Op::Flush => 1,
            _ => (end - 1) / chunk - r.offset / chunk + 1,
        };
        self.pending.insert(
            parent,
            Pending {
                client,
                op: r.op,
                arrived,
                parts_left: n_parts as u32,
                bytes: r.len,
                failed: false,
            },
        );
        let is_write = r.op == Op::Write;
        let before = if is_write {
            io_count(&self.engine.stats())
        } else {
            0
        };
        let mut o = r.offset;
        for _ in 0..n_parts {
            let op = match r.op {
                Op::Flush => ReqOp::Flush,
                _ => {
                    let e = ((o / chunk + 1) * chunk).min(end);
                    let len = (e - o) as u32;
                    let op = match r.op {
                        Op::Read => ReqOp::Read { offset: o, len },
                        Op::Write => ReqOp::Write {
                            offset: o,
                            data: Phantom(len as usize),
                            fua: r.fua,
                        },
                        _ => ReqOp::Trim { offset: o, len },
                    };
                    o = e;
                    op
                }
            };
            let id = self.next_req;
            self.next_req += 1;
            self.part_of.insert(id, parent);
            self.engine
                .handle_request(self.now, Request { id, op, tag });
        }
        if is_write && io_count(&self.engine.stats()) == before {
            self.counts.queued_writes += 1;
        }
    }

    fn on_reply(&mut self, id: ReqId, ok: bool) {
        let parent = self
            .part_of
            .remove(id)
            .unwrap_or_else(|| panic!("reply for unknown request {id}"));
        let p = self.pending.get_mut(parent).expect("parent request");
        p.parts_left -= 1;
        if !ok {
            p.failed = true;
        }
        if p.parts_left > 0 {
            return;
        }
        let cost = self.cfg.cpu.cost(p.bytes);
        if cost > 0 {
            self.cpu_queue.push(self.now, cost, parent);
            return;
        }
        self.complete(parent);
    }

    /// Request `parent` is done, I/O and CPU: the client sees it now.
    fn complete(&mut self, parent: ReqId) {
        let p = self.pending.remove(parent).expect("parent request");
        let lat = self.now - p.arrived;
        self.last_reply = self.now;
        let c = &mut self.counts;
        c.requests += 1;
        if p.failed {
            c.errors += 1;
        }
        self.lat_all.record(lat);
        if self.next_boundary.is_some() {
            self.lat_interval.record(lat);
        }
        match p.op {
            Op::Read => {
                c.reads += 1;
                c.read_bytes += p.bytes;
                self.lat_read.record(lat);
            }
            Op::Write => {
                c.writes += 1;
                c.write_bytes += p.bytes;
                self.lat_write.record(lat);
            }
            Op::Flush => {
                c.flushes += 1;
                self.lat_flush.record(lat);
            }
            Op::Trim => c.trims += 1,
        }
        if self.cfg.mode == Mode::Closed {
            let now = self.now;
            let cl = self.clients.get_mut(&p.client).expect("client");
            cl.outstanding -= 1;
            if let Some(r) = cl.queue.pop_front() {
                cl.outstanding += 1;
                self.buffered -= 1;
                self.issue(r, p.client, now);
            }
        }
    }

    // ------------------------------------------------------------ devices

    fn dev_op_id(&mut self) -> u64 {
        let id = self.next_dev_op;
        self.next_dev_op += 1;
        id
    }

    fn submit(&mut self, cmd: IoCmd<Phantom>) {
        let now = self.now;
        match cmd.dev {
            Dev::Cache => {
                self.counts.cache_ops += 1;
                let id = self.dev_op_id();
                let Some((op, read_len)) = dev_op(id, &cmd.op) else {
                    self.immediate.push_back(cmd.id);
                    return;
                };
                if matches!(op.kind, DevOpKind::Read | DevOpKind::Write) && op.len == 0 {
                    self.immediate.push_back(cmd.id);
                    return;
                }
                self.inflight.insert(
                    id,
                    InFlight::One {
                        io: cmd.id,
                        read_len,
                    },
                );
                self.cache.submit(now, op);
            }
            Dev::Backing => match cmd.op {
                IoOp::Write { offset, data, fua } if data.0 > 0 => {
                    if let Some(g) = cmd.group {
                        let (bytes, records) = self.group_bytes.entry(g).or_default();
                        *bytes += data.0 as u64;
                        *records += 1;
                    }
                    self.enqueue_write(offset, data.0 as u64, fua, cmd.id);
                }
                IoOp::GroupBegin { group } => {
                    // A retried checkpoint reuses its id: start counting afresh.
                    self.group_bytes.insert(group, (0, 0));
                    self.immediate.push_back(cmd.id);
                }
                IoOp::GroupEnd { group } => {
                    let (bytes, records) = self.group_bytes.remove(&group).unwrap_or_default();
                    let mut steps = self.group_end_steps(bytes, records);
                    match steps.pop_front() {
                        // A free group end completes at once.
                        None => self.immediate.push_back(cmd.id),
                        Some(first) => self.bqueue.push_back(Queued::Other(
                            first,
                            InFlight::GroupStep {
                                io: cmd.id,
                                rest: steps,
                            },
                        )),
                    }
                }
                op => {
                    let (dop, what) = match op {
                        IoOp::Read { offset, len } if len > 0 => (
                            DevOp::read(0, offset, len as u64),
                            InFlight::One {
                                io: cmd.id,
                                read_len: Some(len),
                            },
                        ),
                        IoOp::Flush => (
                            DevOp::flush(0),
                            InFlight::One {
                                io: cmd.id,
                                read_len: None,
                            },
                        ),
                        IoOp::Trim { offset, len } => (
                            DevOp::trim(0, offset, len as u64),
                            InFlight::One {
                                io: cmd.id,
                                read_len: None,
                            },
                        ),
                        IoOp::Read { len, .. } => {
                            debug_assert_eq!(len, 0);
                            self.engine_read_done_later(cmd.id);
                            return;
                        }
                        _ => {
                            self.immediate.push_back(cmd.id);
                            return;
                        }
                    };
                    self.bqueue.push_back(Queued::Other(dop, what));
                }
            },
        }
    }

    fn engine_read_done_later(&mut self, io: IoId) {
        // A zero-length read completes with an empty payload at once.
        self.engine
            .handle_completion(self.now, io, Ok(Some(Phantom(0))));
    }

    /// Queues a backing write, merging it into a queued write it extends
    /// (back or front) after the last barrier, when merging is on.
    fn enqueue_write(&mut self, off: u64, len: u64, fua: bool, io: IoId) {
        if self.cfg.merge_backing {
            for q in self.bqueue.iter_mut().rev() {
                match q {
                    Queued::Other(..) => break,
                    Queued::Write {
                        off: o,
                        len: l,
                        fua: f,
                        ios,
                    } => {
                        if *f != fua || *l + len > self.cfg.max_merge_bytes {
                            continue;
                        }
                        if *o + *l == off {
                            *l += len;
                            ios.push(io);
                            return;
                        }
                        if off + len == *o {
                            *o = off;
                            *l += len;
                            ios.push(io);
                            return;
                        }
                    }
                }
            }
        }
        self.bqueue.push_back(Queued::Write {
            off,
            len,
            fua,
            ios: vec![io],
        });
    }

    /// Sends queued backing commands while the driver's backing queue depth allows.
    fn dispatch_backing(&mut self) {
        let now = self.now;
        while self.backing_outstanding < self.cfg.backing_qd.max(1) {
            // Reads go first (they are client-critical; queued writes are
            // destages), but never past a barrier.
            let pick = if self.cfg.read_priority {
                self.bqueue
                    .iter()
                    .take_while(|q| {
                        matches!(
                            q,
                            Queued::Write { .. }
                                | Queued::Other(
                                    DevOp {
                                        kind: DevOpKind::Read,
                                        ..
                                    },
                                    _
                                )
                        )
                    })
                    .position(|q| {
                        matches!(
                            q,
                            Queued::Other(
                                DevOp {
                                    kind: DevOpKind::Read,
                                    ..
                                },
                                _
                            )
                        )
                    })
                    .unwrap_or(0)
            } else {
                0
            };
            let Some(q) = self.bqueue.remove(pick) else {
                break;
            };
            let id = self.dev_op_id();
            let op = match q {
                Queued::Write { off, len, fua, ios } => {
                    let bs = self.cfg.block_size as u64;
                    if self.run_end == Some(off) {
                        self.run_len += len;
                    } else {
                        if self.run_len > 0 {
                            self.counts.runs += 1;
                            self.runs.record(self.run_len.div_ceil(bs));
                        }
                        self.run_len = len;
                    }
                    self.run_end = Some(off + len);
                    self.counts.backing_dev_writes += 1;
                    let what = if ios.len() == 1 {
                        InFlight::One {
                            io: ios[0],
                            read_len: None,
                        }
                    } else {
                        InFlight::Merged(ios)
                    };
                    self.inflight.insert(id, what);
                    DevOp {
                        id,
                        kind: DevOpKind::Write,
                        offset: off,
                        len,
                        fua,
                    }
                }
                Queued::Other(mut dop, what) => {
                    dop.id = id;
                    self.inflight.insert(id, what);
                    dop
                }
            };
            self.backing_outstanding += 1;
            self.backing.submit(now, op);
        }
    }

    /// Closes the current contiguous run (at the end of a run).
    fn close_run(&mut self) {
        if self.run_len > 0 {
            let bs = self.cfg.block_size as u64;
            self.counts.runs += 1;
            self.runs.record(self.run_len.div_ceil(bs));
            self.run_len = 0;
            self.run_end = None;
        }
    }

    fn dev_done(&mut self, id: u64, backing: bool) {
        let now = self.now;
        if backing {
            self.backing_outstanding -= 1;
        }
        match self
            .inflight
            .remove(id)
            .expect("completion of an unknown device op")
        {
            InFlight::One { io, read_len } => {
                let res = Ok(read_len.map(|l| Phantom(l as usize)));
                self.engine.handle_completion(now, io, res);
            }
            InFlight::Merged(ios) => {
                for io in ios {
                    self.engine.handle_completion(now, io, Ok(None));
                }
            }
            InFlight::GroupStep { io, mut rest } => match rest.pop_front() {
                Some(next) => self
                    .bqueue
                    .push_front(Queued::Other(next, InFlight::GroupStep { io, rest })),
                None => self.engine.handle_completion(now, io, Ok(None)),
            },
        }
    }

    /// The device commands a `GroupEnd` runs (none when free), in order (module docs),
    /// for a group of `records` writes of `bytes` bytes in all.
    fn group_end_steps(&mut self, bytes: u64, records: u64) -> VecDeque<DevOp> {
        let log = self.backing_size;
        let steps = match self.cfg.group_end {
            GroupEndCost::Free => VecDeque::new(),
            GroupEndCost::WriteFlush => {
                let off = log + self.group_log_next * 4096;
                self.group_log_next = (self.group_log_next + 1) % (GROUP_LOG_BYTES / 4096);
                VecDeque::from([DevOp::write(0, off, 4096), DevOp::flush(0)])
            }
            GroupEndCost::Redo => VecDeque::from([
                DevOp::write(0, log, redo_log_bytes(bytes, records)),
                DevOp::flush(0),
                DevOp::flush(0),
            ]),
        };
        self.counts.group_writes += u64::from(!steps.is_empty());
        self.counts.group_log_bytes += steps
            .iter()
            .filter(|op| op.kind == DevOpKind::Write)
            .map(|op| op.len)
            .sum::<u64>();
        steps
    }

    // ------------------------------------------------------------ results

    fn finish(mut self, wall: f64) -> RunResult {
        self.close_run();
        if self.next_boundary.is_some() && self.last_reply > self.mark_end {
            let end = self.last_reply;
            self.snapshot(end);
        }
        let e = self.engine.stats();
        let c = &self.counts;
        let bs = self.cfg.block_size as u64;
        let sim_ns = self.last_reply;
        let secs = sim_ns as f64 / 1e9;
        let counters: std::collections::BTreeMap<String, u64> = self
            .engine
            .policy_counters()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let (unckpt, committed_unckpt) = if self.cfg.write_policy.is_journaled() {
            let closed = counters.get("journal_txns_closed").copied().unwrap_or(0);
            let committed = counters.get("journal_committed_upto").copied().unwrap_or(0);
            let ckpt = counters
                .get("journal_checkpointed_upto")
                .copied()
                .unwrap_or(0);
            (
                Some(closed.saturating_sub(ckpt)),
                Some(committed.saturating_sub(ckpt)),
            )
        } else {
            (None, None)
        };
        let bstats = self.backing.stats();
        let rate = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
        RunResult {
            trace: self.trace_name.clone(),
            write_policy: self.cfg.write_policy.name().to_string(),
            replacement: self.cfg.replacement.to_string(),
            fetch: self.engine.config().fetch.name().to_string(),
            patches_created: e.patches_created,
            patch_fetches: e.patch_fetches,
            patch_fallbacks: e.patch_fallbacks,
            patch_reads: e.patch_reads,
            cache_size_bytes: self.engine.config().capacity_blocks * bs,
            block_size: bs,
            cache_blocks: self.engine.config().capacity_blocks,
            backing: self.cfg.backing.name().to_string(),
            cache_device: self.cfg.cache_device.name().to_string(),
            backing_size_bytes: self.backing_size,
            mode: match self.cfg.mode {
                Mode::Closed => "closed".into(),
                Mode::Open => "open".into(),
            },
            qd: self.cfg.qd,
            speedup: self.cfg.speedup,
            label: self.cfg.label.clone(),
            requests: c.requests,
            reads: c.reads,
            writes: c.writes,
            flushes: c.flushes,
            trims: c.trims,
            errors: c.errors,
            client_read_bytes: c.read_bytes,
            client_write_bytes: c.write_bytes,
            read_hits: e.read_hits,
            read_misses: e.read_misses,
            write_hits: e.write_hits,
            write_misses: e.write_misses,
            overwrites: e.overwrites,
            backing_writes: e.backing_writes,
            backing_write_bytes: e.backing_write_bytes,
            backing_write_runs: c.runs,
            backing_write_ops: c.backing_dev_writes,
            run_length_histogram: self.runs.clone(),
            write_amplification: if c.write_bytes > 0 {
                e.backing_write_bytes as f64 / c.write_bytes as f64
            } else {
                0.0
            },
            backing_reads: e.backing_reads,
            backing_read_bytes: e.backing_read_bytes,
            backing_flushes: e.backing_flushes,
            backing_groups: e.backing_groups,
            group_commit_writes: c.group_writes,
            group_log_bytes: c.group_log_bytes,
            fetches: e.fetches,
            evictions: e.evictions,
            stalled_writes: e.stalled_writes,
            stall_time_us: e.stall_ns as f64 / 1e3,
            queued_writes: c.queued_writes,
            cache_device_ops: c.cache_ops,
            sim_time_us: sim_ns as f64 / 1e3,
            throughput_iops: rate(c.requests),
            throughput_mbps: rate(c.read_bytes + c.write_bytes) / 1e6,
            latency_us_p50: self.lat_all.quantile_us(0.5),
            latency_us_p99: self.lat_all.quantile_us(0.99),
            latency_us_mean: self.lat_all.mean_us(),
            latency_all: self.lat_all.summary(),
            latency_read: self.lat_read.summary(),
            latency_write: self.lat_write.summary(),
            latency_flush: self.lat_flush.summary(),
            dirty_blocks_end: e.dirty_blocks,
            dirty_bytes_end: e.dirty_blocks * bs,
            dirty_blocks_peak: self.dirty_peak,
            dirty_blocks_mean: if self.now > 0 {
                self.dirty_integral as f64 / self.now as f64
            } else {
                0.0
            },
            uncheckpointed_txns: unckpt,
            committed_not_checkpointed_txns: committed_unckpt,
            policy_counters: counters,
            backing_mean_queue_depth: bstats.mean_queue_depth,
            backing_utilisation: if bstats.elapsed_ns > 0 {
                bstats.busy_ns as f64 / bstats.elapsed_ns as f64
            } else {
                0.0
            },
            wall_seconds: wall,
            replay_rate: if wall > 0.0 {
                c.requests as f64 / wall
            } else {
                0.0
            },
            intervals: std::mem::take(&mut self.intervals),
        }
    }
}
