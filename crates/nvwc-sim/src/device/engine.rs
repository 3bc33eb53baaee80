//! Generic queueing engine shared by the HDD and solid-state models.
//!
//! The engine owns the device queue, a set of identical servers (a disk arm,
//! flash units), an optional write buffer with background destaging, FLUSH
//! barriers, the internal event heap and statistics. A [`Mechanism`] supplies
//! the device-specific parts: how a command is handled on arrival, which
//! queued job a free server takes, and how long a job occupies a server.
//!
//! Laziness and causality: state is advanced only up to the `now` of the
//! latest call. Before a command submitted at `now` is queued, every internal
//! event at or before `now` is processed, so a scheduling decision taken at
//! time `t` only ever sees commands submitted at or before `t`. (A command
//! submitted exactly when a server frees up is queued after that server has
//! picked its next job.)

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeSet, BinaryHeap, HashMap, HashSet, VecDeque};

use nvwc_mrc::MixBuildHasher;

use super::stats::StatsRecorder;
use super::{advance_clock, check_op, DevOp, DevOpKind, DeviceStats, Nanos};

/// What a queued job is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JobClass {
    /// A host command; its completion is reported to the caller.
    Host,
    /// Background write of buffered data (sequence number in the buffer).
    Destage { buf_seq: u64 },
}

/// A unit of work in the device queue.
#[derive(Clone, Debug)]
pub(crate) struct Job {
    pub op: DevOp,
    pub class: JobClass,
    /// Submission time of the host command this job belongs to.
    pub submitted: Nanos,
    /// Arrival order in the queue (for FIFO and tie-breaking).
    pub seq: u64,
}

/// How a newly submitted command is handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Completes at `at` (>= now) without using a server.
    Complete { at: Nanos },
    /// Goes to the device queue and needs a server.
    Queue,
    /// A WRITE accepted into the write buffer: acknowledged at `at`
    /// (>= now); a background destage job is queued. Only allowed when the
    /// engine reported enough free buffer space.
    Buffer { at: Nanos },
    /// A FLUSH that must wait until every write buffered before it has been
    /// destaged; completes `extra` ns after that.
    FlushBarrier { extra: Nanos },
}

/// Device-specific behaviour plugged into the [`Engine`].
pub(crate) trait Mechanism: Send {
    /// Number of identical servers.
    fn servers(&self) -> usize;
    /// Decide how `op`, submitted at `now`, is handled. `buffer_free` is the
    /// free write-buffer space in bytes; `dirty` tells whether buffered data
    /// awaits destaging.
    fn plan(&mut self, now: Nanos, op: &DevOp, buffer_free: u64, dirty: bool) -> Plan;
    /// Choose which queued job a free server takes at `now`: returns an
    /// element of `candidates` (indices into `queue`, in queue order,
    /// non-empty).
    fn pick(&mut self, now: Nanos, queue: &VecDeque<Job>, candidates: &[usize]) -> usize {
        let _ = (now, queue);
        candidates[0]
    }
    /// Start `job` on `server` at `now`; returns its completion time (>= now).
    fn start(&mut self, now: Nanos, job: &Job, server: usize) -> Nanos;
    /// Whether destage jobs run only when no host job is queued (unless a
    /// FLUSH is waiting).
    fn destage_idle_only(&self) -> bool {
        false
    }
    /// Queued READ/WRITE commands and destages longer than this are split at
    /// multiples of it (offsets aligned to it) into jobs that servers take
    /// independently; the command completes with its last part. 0 = never
    /// split.
    fn chunk_bytes(&self) -> u64 {
        0
    }
    /// Whether [`Mechanism::pick`] always takes the first candidate (then
    /// the engine finds it without building the candidate list).
    fn fifo(&self) -> bool {
        false
    }
}

/// Split `[offset, offset + len)` at multiples of `chunk` (0 = no split):
/// the pieces in order, without allocating (an empty range is one piece).
pub(crate) fn split_range(offset: u64, len: u64, chunk: u64) -> SplitRange {
    SplitRange {
        o: offset,
        end: offset + len,
        chunk: if len == 0 { 0 } else { chunk },
        done: false,
    }
}

/// The pieces of [`split_range`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct SplitRange {
    o: u64,
    end: u64,
    /// 0: one piece.
    chunk: u64,
    done: bool,
}

impl SplitRange {
    /// More than one piece.
    fn is_split(&self) -> bool {
        self.chunk != 0 && (self.o / self.chunk + 1).saturating_mul(self.chunk) < self.end
    }
}

impl Iterator for SplitRange {
    type Item = (u64, u64);
    fn next(&mut self) -> Option<(u64, u64)> {
        if self.done {
            return None;
        }
        let next = match self.o.checked_div(self.chunk) {
            None => self.end,
            Some(q) => (q + 1).saturating_mul(self.chunk).min(self.end),
        };
        let p = (self.o, next - self.o);
        self.o = next;
        self.done = next == self.end;
        Some(p)
    }
}

/// Progress of a host command split into several jobs.
#[derive(Debug)]
struct Parts {
    remaining: usize,
    first_start: Nanos,
    op: DevOp,
}

#[derive(Debug)]
enum EventKind {
    ServerDone {
        server: usize,
        job: Job,
        started: Nanos,
    },
    Ack {
        op: DevOp,
        submitted: Nanos,
        started: Nanos,
    },
}

#[derive(Debug)]
struct Event {
    time: Nanos,
    seq: u64,
    kind: EventKind,
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        (self.time, self.seq) == (other.time, other.seq)
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.time, self.seq).cmp(&(other.time, other.seq))
    }
}

#[derive(Debug)]
struct FlushWaiter {
    /// Completes once no buffered write with `buf_seq <= target` is dirty.
    target: u64,
    extra: Nanos,
    op: DevOp,
    submitted: Nanos,
}

/// The queueing engine. See the module documentation.
pub(crate) struct Engine<M: Mechanism> {
    pub mech: M,
    name: String,
    capacity: u64,
    buffer_cap: u64,
    buffer_used: u64,
    queue: VecDeque<Job>,
    busy: Vec<bool>,
    /// Servers busy (the `true`s in `busy`).
    busy_count: usize,
    heap: BinaryHeap<Reverse<Event>>,
    completed: VecDeque<(Nanos, u64)>,
    outstanding: HashSet<u64, MixBuildHasher>,
    dirty: BTreeSet<u64>,
    next_buf_seq: u64,
    waiters: VecDeque<FlushWaiter>,
    parts: HashMap<u64, Parts, MixBuildHasher>,
    /// Scratch list of dispatch candidates.
    candidates: Vec<usize>,
    seq: u64,
    last_now: Nanos,
    stats: StatsRecorder,
}

impl<M: Mechanism> Engine<M> {
    /// `buffer_cap` is the write-buffer size in bytes (0 = no buffer).
    pub fn new(mech: M, name: String, capacity: u64, buffer_cap: u64) -> Self {
        let n = mech.servers();
        assert!(n > 0, "a device needs at least one server");
        Engine {
            mech,
            name,
            capacity,
            buffer_cap,
            buffer_used: 0,
            queue: VecDeque::new(),
            busy: vec![false; n],
            busy_count: 0,
            heap: BinaryHeap::new(),
            completed: VecDeque::new(),
            outstanding: HashSet::default(),
            dirty: BTreeSet::new(),
            next_buf_seq: 0,
            waiters: VecDeque::new(),
            parts: HashMap::default(),
            candidates: Vec::new(),
            seq: 0,
            last_now: 0,
            stats: StatsRecorder::default(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes of buffered data not yet destaged.
    pub fn buffered_bytes(&self) -> u64 {
        self.buffer_used
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn push(&mut self, time: Nanos, kind: EventKind) {
        let seq = self.next_seq();
        self.heap.push(Reverse(Event { time, seq, kind }));
    }

    /// Acknowledge `op`, submitted at `now` and never queued, at `at`.
    fn ack_unqueued(&mut self, now: Nanos, at: Nanos, op: DevOp) {
        assert!(at >= now);
        self.push(
            at,
            EventKind::Ack {
                op,
                submitted: now,
                started: now,
            },
        );
    }

    fn check_now(&mut self, now: Nanos) {
        advance_clock(&self.name, &mut self.last_now, now);
    }

    pub fn submit(&mut self, now: Nanos, op: DevOp) {
        self.check_now(now);
        check_op(&op, self.capacity);
        self.advance(now);
        assert!(
            self.outstanding.insert(op.id),
            "{}: DevOp id {} is already outstanding",
            self.name,
            op.id
        );
        self.stats.on_submit(now);
        let free = self.buffer_cap - self.buffer_used;
        let dirty = !self.dirty.is_empty();
        match self.mech.plan(now, &op, free, dirty) {
            Plan::Complete { at } => self.ack_unqueued(now, at, op),
            Plan::Queue => {
                let pieces = match op.kind {
                    DevOpKind::Read | DevOpKind::Write => {
                        split_range(op.offset, op.len, self.mech.chunk_bytes())
                    }
                    _ => split_range(op.offset, op.len, 0),
                };
                if pieces.is_split() {
                    self.parts.insert(
                        op.id,
                        Parts {
                            remaining: pieces.count(),
                            first_start: Nanos::MAX,
                            op,
                        },
                    );
                }
                for (offset, len) in pieces {
                    let seq = self.next_seq();
                    let part = DevOp { offset, len, ..op };
                    self.queue.push_back(Job {
                        op: part,
                        class: JobClass::Host,
                        submitted: now,
                        seq,
                    });
                }
            }
            Plan::Buffer { at } => {
                assert!(
                    op.kind == DevOpKind::Write && op.len <= free,
                    "bad Buffer plan"
                );
                self.buffer_used += op.len;
                self.ack_unqueued(now, at, op);
                for (offset, len) in split_range(op.offset, op.len, self.mech.chunk_bytes()) {
                    let buf_seq = self.next_buf_seq;
                    self.next_buf_seq += 1;
                    self.dirty.insert(buf_seq);
                    let seq = self.next_seq();
                    let part = DevOp { offset, len, ..op };
                    self.queue.push_back(Job {
                        op: part,
                        class: JobClass::Destage { buf_seq },
                        submitted: now,
                        seq,
                    });
                }
            }
            Plan::FlushBarrier { extra } => match self.dirty.last() {
                Some(&target) => self.waiters.push_back(FlushWaiter {
                    target,
                    extra,
                    op,
                    submitted: now,
                }),
                None => self.push(
                    now + extra,
                    EventKind::Ack {
                        op,
                        submitted: now,
                        started: now,
                    },
                ),
            },
        }
        self.dispatch(now);
    }

    /// Process every internal event at or before `now`.
    fn advance(&mut self, now: Nanos) {
        while let Some(Reverse(ev)) = self.heap.peek() {
            if ev.time > now {
                break;
            }
            let Reverse(ev) = self.heap.pop().expect("peeked");
            let t = ev.time;
            match ev.kind {
                EventKind::Ack {
                    op,
                    submitted,
                    started,
                } => self.emit(t, op, submitted, started),
                EventKind::ServerDone {
                    server,
                    job,
                    started,
                } => {
                    self.busy[server] = false;
                    self.busy_count -= 1;
                    self.stats.on_server(t, false);
                    match job.class {
                        JobClass::Host if self.parts.is_empty() => {
                            self.emit(t, job.op, job.submitted, started)
                        }
                        JobClass::Host => match self.parts.get_mut(&job.op.id) {
                            None => self.emit(t, job.op, job.submitted, started),
                            Some(p) => {
                                p.remaining -= 1;
                                p.first_start = p.first_start.min(started);
                                if p.remaining == 0 {
                                    let p = self.parts.remove(&job.op.id).expect("present");
                                    self.emit(t, p.op, job.submitted, p.first_start);
                                }
                            }
                        },
                        JobClass::Destage { buf_seq } => {
                            self.stats.tick(t);
                            self.stats.on_background(job.op.len);
                            self.buffer_used -= job.op.len;
                            assert!(self.dirty.remove(&buf_seq));
                            self.release_waiters(t);
                        }
                    }
                    self.dispatch(t);
                }
            }
        }
    }

    fn release_waiters(&mut self, t: Nanos) {
        while let Some(w) = self.waiters.front() {
            let clean = self.dirty.first().is_none_or(|&first| first > w.target);
            if !clean {
                break;
            }
            let w = self.waiters.pop_front().expect("front");
            self.push(
                t + w.extra,
                EventKind::Ack {
                    op: w.op,
                    submitted: w.submitted,
                    started: t,
                },
            );
        }
    }

    fn emit(&mut self, t: Nanos, op: DevOp, submitted: Nanos, started: Nanos) {
        assert!(self.outstanding.remove(&op.id));
        self.stats
            .on_complete(t, op.kind, op.len, submitted, started);
        self.completed.push_back((t, op.id));
    }

    /// Give free servers work, at time `t`.
    fn dispatch(&mut self, t: Nanos) {
        let mut candidates = std::mem::take(&mut self.candidates);
        while self.busy_count < self.busy.len() {
            if self.queue.is_empty() {
                break;
            }
            let server = self.busy.iter().position(|b| !b).expect("a server is free");
            let host_only = self.mech.destage_idle_only()
                && self.waiters.is_empty()
                && self.queue.iter().any(|j| j.class == JobClass::Host);
            let idx = if self.mech.fifo() {
                self.queue
                    .iter()
                    .position(|j| !host_only || j.class == JobClass::Host)
                    .expect("a candidate")
            } else {
                candidates.clear();
                candidates.extend(
                    self.queue
                        .iter()
                        .enumerate()
                        .filter(|(_, j)| !host_only || j.class == JobClass::Host)
                        .map(|(i, _)| i),
                );
                let idx = self.mech.pick(t, &self.queue, &candidates);
                assert!(
                    candidates.contains(&idx),
                    "mechanism picked a non-candidate"
                );
                idx
            };
            let job = self.queue.remove(idx).expect("picked index in queue");
            let done = self.mech.start(t, &job, server);
            assert!(done >= t, "{}: job completes before it starts", self.name);
            self.busy[server] = true;
            self.busy_count += 1;
            self.stats.on_server(t, true);
            self.push(
                done,
                EventKind::ServerDone {
                    server,
                    job,
                    started: t,
                },
            );
        }
        self.candidates = candidates;
    }

    pub fn next_completion(&self) -> Option<Nanos> {
        let c = self.completed.front().map(|&(t, _)| t);
        let h = self.heap.peek().map(|Reverse(e)| e.time);
        match (c, h) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn pop_completions(&mut self, now: Nanos, out: &mut Vec<u64>) {
        self.check_now(now);
        self.advance(now);
        while let Some(&(t, id)) = self.completed.front() {
            debug_assert!(t <= now);
            out.push(id);
            self.completed.pop_front();
        }
    }

    pub fn stats(&self) -> DeviceStats {
        self.stats.snapshot()
    }
}

/// Implement [`DeviceModel`](super::DeviceModel) for a newtype around an
/// [`Engine`] in field `.0`.
macro_rules! delegate_device_model {
    ($ty:ty) => {
        impl $crate::device::DeviceModel for $ty {
            fn name(&self) -> &str {
                self.0.name()
            }
            fn submit(&mut self, now: $crate::device::Nanos, op: $crate::device::DevOp) {
                self.0.submit(now, op)
            }
            fn next_completion(&self) -> Option<$crate::device::Nanos> {
                self.0.next_completion()
            }
            fn pop_completions(&mut self, now: $crate::device::Nanos, out: &mut Vec<u64>) {
                self.0.pop_completions(now, out)
            }
            fn capacity_bytes(&self) -> u64 {
                self.0.capacity()
            }
            fn stats(&self) -> $crate::device::DeviceStats {
                self.0.stats()
            }
            fn track_bytes(&self) -> Option<u64> {
                self.track_bytes_opt()
            }
        }
    };
}
pub(crate) use delegate_device_model;
