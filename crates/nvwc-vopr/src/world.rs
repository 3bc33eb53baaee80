//! The simulated world one engine runs in: a cache and a backing [`Disk`], an
//! event queue with device latencies and injected errors, and the loop that
//! drives the engine ([`World::run`]) for a [`Client`]: the random workload,
//! the read-back after recovery, or nothing (a drain).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use bytes::Bytes;
use nvwc_core::pump::{pump, Driver};
use nvwc_core::*;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::disk::{Disk, SECTOR};
use crate::oracle::{decode, Oracle, Val};
use crate::SeedOutcome;

/// A request outstanding longer than this (simulated) fails the liveness
/// check. Device latencies are at most 2 ms and a run issues at most a few
/// hundred requests, so a request that waits this long waits for nothing
/// that will come (the longest legitimate wait, recorded as
/// `SeedOutcome::max_latency_ns`, is reported by `nvwc vopr`).
pub const LIVENESS_NS: u64 = 30_000_000_000;

/// Events at one simulated instant beyond which time is stuck (livelock).
const STUCK_EVENTS: u64 = 1_000_000;

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Client,
    Io(u64),
    Timeout,
    /// Held replies go out (`World::delay_replies`).
    Replies,
}

/// Longest a released reply is held before it goes out (ns), with
/// `World::delay_replies`: long enough that requests keep arriving meanwhile.
const REPLY_DELAY_NS: u64 = 300_000;

struct InFlight {
    cmd: IoCmd<Bytes>,
    stamp: u64,
    fail: bool,
    /// For a failed plain write (not part of an atomic group): the bytes of its payload (a
    /// whole number of sectors, possibly none) that reach the device before
    /// the failure, as a failing device may leave a torn write.
    torn: usize,
    /// The oracle's clock when the command was put in flight.
    issued_at: u64,
}

/// Device latencies (ns, uniform in `[lo, hi)`) and the probability that a
/// command fails with EIO.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Latency {
    pub cache: (u64, u64),
    pub backing: (u64, u64),
    pub err_rate: f64,
}

/// What a [`Client`] works with besides the world: the seed's oracle, its
/// random stream and its outcome.
pub(crate) struct Ctx<'a> {
    pub o: &'a mut Oracle,
    pub rng: &'a mut ChaCha8Rng,
    pub out: &'a mut SeedOutcome,
}

/// What a [`Client`] wants after a reply.
pub(crate) trait Client {
    /// Called at each client event: issue requests. Returns when to be
    /// called again, if ever.
    fn issue(&mut self, w: &mut World, cx: &mut Ctx) -> Option<u64>;
    /// A reply arrived; `true` asks for a client event now (a retry).
    fn reply(&mut self, r: Reply<Bytes>, now: u64, cx: &mut Ctx) -> bool;
    /// Requests issued and not yet answered, and the oldest one's issue time.
    fn outstanding(&self) -> (usize, Option<(u64, u64)>);
    /// Every request the client will ever issue has been issued.
    fn all_issued(&self) -> bool;
    /// The oracle learns the journal transactions this engine closes (the
    /// workload's engine: not one that only reads back or drains after a
    /// crash, whose recovery merged transactions the oracle cannot know).
    fn records_txns(&self) -> bool {
        false
    }
}

/// Why [`World::run`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// The crash point was reached.
    Crash,
    /// Nothing is left to do (or `done` holds).
    Quiet,
    /// A check failed (recorded in the oracle).
    Violation,
}

/// The engine, its devices, and the commands in flight.
pub(crate) struct World {
    pub eng: Engine<Bytes>,
    pub cache: Disk,
    pub backing: Disk,
    events: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    ev_seq: u64,
    // Ordered maps: the crash walks what is in flight, drawing randomness
    // per command, so iteration order must not depend on a hasher's seed.
    inflight: BTreeMap<u64, InFlight>,
    /// Cache writes of direct writes, issued before the engine's own output.
    pub direct_cmds: VecDeque<IoCmd<Bytes>>,
    timeout_at: Option<u64>,
    pub now: u64,
    pub processed: u64,
    lat: Latency,
    pub verbose: bool,
    /// The metadata table's byte range, the distinct pages written since
    /// the last commit record, and the most one commit wrote.
    table: (u64, u64),
    pages_since_commit: std::collections::BTreeSet<u64>,
    pub max_commit_pages: u64,
    /// With `delay_replies`: the stream the delays are drawn from (its
    /// seed, for a world that follows this one), and the replies the
    /// engine released that the client has not seen yet.
    replies: Option<(ChaCha8Rng, u64)>,
    held: Vec<Reply<Bytes>>,
    replies_due: bool,
    /// With `slow_cache_syncs`: the latency range of the cache device's
    /// FLUSHes and FUA writes, in place of `lat.cache`.
    slow_syncs: Option<(u64, u64)>,
}

impl World {
    pub fn new(
        eng: Engine<Bytes>,
        cache: Disk,
        backing: Disk,
        lat: Latency,
        now: u64,
        table: (u64, u64),
    ) -> Self {
        World {
            eng,
            cache,
            backing,
            events: BinaryHeap::new(),
            ev_seq: 0,
            inflight: BTreeMap::new(),
            direct_cmds: VecDeque::new(),
            timeout_at: None,
            now,
            processed: 0,
            lat,
            verbose: false,
            table,
            pages_since_commit: Default::default(),
            max_commit_pages: 0,
            replies: None,
            held: Vec::new(),
            replies_due: false,
            slow_syncs: None,
        }
    }

    /// The cache device's FLUSHes and FUA writes take `range` (ns) instead
    /// of a plain command's latency, as a real device's syncs do under load
    /// (an `fdatasync` of the server's cache file took 0.6-7.9 ms while the
    /// backing store's 1 ms writes took 1.5 ms: `strace -T` of
    /// `nvwc serve --write-policy ordered` over nbdkit's delay filter under
    /// fio, 2026-11-27). A commit then stays in flight while destage plans,
    /// client writes and reply batches go on around it, so crashes land
    /// inside those windows.
    pub fn slow_cache_syncs(&mut self, range: (u64, u64)) {
        assert!(range.0 < range.1, "an empty latency range");
        self.slow_syncs = Some(range);
    }

    /// The range given to `slow_cache_syncs`, if any.
    pub fn slow_syncs(&self) -> Option<(u64, u64)> {
        self.slow_syncs
    }

    /// Replies reach the client after a random delay, in batches, as a
    /// server's reply writer sends them; the engine is told before each
    /// batch goes out (`Engine::handle_replies_sending`). Requests issued
    /// meanwhile were sent before the client saw those replies, so the
    /// oracle does not order them after the held writes, and ordered
    /// write-back, with reply events on, does not either. The delays come
    /// from a stream of their own (`seed`), so the seed's other draws keep
    /// their values.
    pub fn delay_replies(&mut self, seed: u64) {
        use rand::SeedableRng;
        self.eng.set_reply_events(true);
        self.replies = Some((ChaCha8Rng::seed_from_u64(seed), seed));
    }

    /// The seed given to `delay_replies`, if any.
    pub fn reply_seed(&self) -> Option<u64> {
        self.replies.as_ref().map(|r| r.1)
    }

    fn push(&mut self, t: u64, e: Ev) {
        self.ev_seq += 1;
        self.events.push(Reverse((t, self.ev_seq, e)));
    }

    /// Drive the engine for `client` until the `crash_at`-th event, until
    /// nothing is left to do, or until `done` holds. `watch` sees every
    /// completed command with the backing store after it; `false` from it
    /// stops the run (it recorded a violation).
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &mut self,
        client: &mut dyn Client,
        o: &mut Oracle,
        rng: &mut ChaCha8Rng,
        out: &mut SeedOutcome,
        crash_at: u64,
        watch: &mut dyn FnMut(&IoCmd<Bytes>, &Disk, &mut Oracle) -> bool,
        done: &dyn Fn(&Engine<Bytes>) -> bool,
    ) -> Stop {
        let start = self.processed;
        let cx = &mut Ctx { o, rng, out };
        self.push(self.now, Ev::Client);
        let mut stuck = (self.now, 0u64);
        loop {
            if self.processed - start >= crash_at {
                return Stop::Crash;
            }
            let (n_out, oldest) = client.outstanding();
            if client.all_issued() && n_out == 0 && done(&self.eng) {
                return Stop::Quiet;
            }
            if let Some((id, t)) = oldest {
                if self.now.saturating_sub(t) > LIVENESS_NS {
                    cx.o.violations.push(format!(
                        "liveness: request #{id} outstanding for {} ms (bound {} ms)",
                        (self.now - t) / 1_000_000,
                        LIVENESS_NS / 1_000_000
                    ));
                    return Stop::Violation;
                }
            }
            let Some(Reverse((t, _, ev))) = self.events.pop() else {
                if n_out > 0 {
                    cx.o.violations
                        .push(format!("deadlock: {n_out} requests never completed"));
                    return Stop::Violation;
                }
                return Stop::Quiet;
            };
            self.processed += 1;
            self.now = self.now.max(t);
            if stuck.0 == self.now {
                stuck.1 += 1;
                if stuck.1 > STUCK_EVENTS {
                    cx.o.violations.push(format!(
                        "livelock: {STUCK_EVENTS} events without simulated time passing (t={}, engine deadline {:?}, {} commands in flight)",
                        self.now,
                        self.eng.poll_timeout(),
                        self.inflight.len()
                    ));
                    return Stop::Violation;
                }
            } else {
                stuck = (self.now, 0);
            }
            match ev {
                Ev::Client => {
                    if let Some(next) = client.issue(self, cx) {
                        self.push(next, Ev::Client);
                    }
                }
                Ev::Io(id) => {
                    let f = self.inflight.remove(&id).expect("io");
                    let res = self.execute(&f, cx.o);
                    if res.is_ok() && !self.torn_version_ok(&f, cx.o) {
                        return Stop::Violation;
                    }
                    self.eng.handle_completion(self.now, id, res);
                    if !watch(&f.cmd, &self.backing, cx.o) {
                        return Stop::Violation;
                    }
                }
                Ev::Timeout => {
                    if self.timeout_at.is_some_and(|t| t <= self.now) {
                        self.timeout_at = None;
                        self.eng.handle_timeout(self.now);
                    }
                }
                Ev::Replies => {
                    cx.out.reply_batches += 1;
                    self.replies_due = false;
                    self.eng.handle_replies_sending(self.now);
                    let mut retry = false;
                    for r in std::mem::take(&mut self.held) {
                        retry |= client.reply(r, self.now, cx);
                    }
                    if retry {
                        self.push(self.now, Ev::Client);
                    }
                }
            }
            self.pump(client, cx);
            if let Some(t) = self.eng.poll_timeout() {
                let t = t.max(self.now);
                if self.timeout_at.is_none_or(|x| t < x) {
                    self.timeout_at = Some(t);
                    self.push(t, Ev::Timeout);
                }
            }
            let (n_out, _) = client.outstanding();
            if client.all_issued()
                && n_out == 0
                && self.inflight.is_empty()
                && self.events.iter().all(|e| matches!(e.0 .2, Ev::Timeout))
                && self
                    .timeout_at
                    .is_none_or(|t| t > self.now + 10_000_000_000)
            {
                return Stop::Quiet;
            }
        }
    }

    /// A backing write never carries a torn version: where it shows a write
    /// `x` that failed before the command was issued, every other sector of
    /// `x` in the same block (and in the command) shows `x` too, or a write
    /// not ordered before `x`. Except under write-back, whose failed in-place
    /// rewrites leave a block undefined, a policy keeps a version only once
    /// its cache write succeeded, so what a failed cache write left on the
    /// device (a torn prefix, `InFlight::torn`) never reaches the backing
    /// store mixed with the version it was to replace. (A failed write may
    /// reach it whole: a FUA write whose data landed and whose commit
    /// failed. And a failed write that tore on the backing store itself, a
    /// bypass, left its prefix there: a later read-modify-write of that
    /// block carries it legitimately, so such writes are not judged.) The oracle's per-sector rules cannot see this, since each
    /// sector of a torn write is legal alone. `false` records a violation.
    fn torn_version_ok(&self, f: &InFlight, o: &mut Oracle) -> bool {
        let cfg = self.eng.config();
        if f.cmd.dev != Dev::Backing || cfg.write_policy == WritePolicyKind::WriteBack {
            return true;
        }
        let IoOp::Write { offset, data, .. } = &f.cmd.op else {
            return true;
        };
        let per_block = cfg.block_size as u64 / SECTOR as u64;
        let first = offset / SECTOR as u64;
        let vals: Vec<Val> = data
            .chunks_exact(SECTOR)
            .enumerate()
            .map(|(i, b)| decode(b, first + i as u64))
            .collect();
        let at = |s: u64| vals[(s - first) as usize];
        for (i, v) in vals.iter().enumerate() {
            let s = first + i as u64;
            let Val::W(x) = *v else { continue };
            let r = &o.writes[x as usize];
            if r.ok || r.done.is_none_or(|d| d >= f.issued_at) || o.backing_torn.contains(&x) {
                continue;
            }
            let block = s / per_block;
            let lo = (block * per_block).max(r.first_sector).max(first);
            let hi = ((block + 1) * per_block)
                .min(r.first_sector + r.sectors)
                .min(first + vals.len() as u64);
            if let Some(bad) = (lo..hi).find(|&t| !o.shows_or_supersedes(t, at(t), x)) {
                o.violations.push(format!(
                    "(c) a backing write at {offset} carries a torn version of failed write w{x}: sector {s} shows it, sector {bad} of the same block shows {:?} ({})",
                    at(bad),
                    o.describe(x)
                ));
                return false;
            }
        }
        true
    }

    /// Run a completed command on the disk models.
    fn execute(&mut self, f: &InFlight, o: &mut Oracle) -> IoResult<Bytes> {
        if f.fail {
            if let IoOp::Write { offset, data, .. } = &f.cmd.op {
                if f.torn > 0 {
                    // The torn prefix lands (`issue`), then EIO.
                    let prefix = IoOp::Write {
                        offset: *offset,
                        data: data.slice(..f.torn),
                        fua: false,
                    };
                    let disk = if f.cmd.dev == Dev::Cache {
                        &mut self.cache
                    } else {
                        // What lands there is the backing store's own state
                        // from now on (`Oracle::backing_torn`).
                        let first = offset / SECTOR as u64;
                        for (i, b) in data[..f.torn].chunks_exact(SECTOR).enumerate() {
                            if let Val::W(x) = decode(b, first + i as u64) {
                                o.backing_torn.insert(x);
                            }
                        }
                        &mut self.backing
                    };
                    let _ = disk.execute(&prefix, None, f.stamp);
                }
            }
            return Err(IoError::Eio);
        }
        let disk = if f.cmd.dev == Dev::Cache {
            &mut self.cache
        } else {
            &mut self.backing
        };
        disk.execute(&f.cmd.op, f.cmd.group, f.stamp)
    }

    /// Drain the engine (the one pump, [`pump`]): direct writes' parts
    /// first (they were due first), then the engine's commands, each put in
    /// flight; replies to the client (a retry it asks for is a client event
    /// now); events to the oracle when the client records transactions.
    fn pump(&mut self, client: &mut dyn Client, cx: &mut Ctx) {
        while let Some(cmd) = self.direct_cmds.pop_front() {
            self.issue(cmd, cx.rng, cx.o.clock);
        }
        let records = client.records_txns();
        let mut p = Pumped {
            w: self,
            client,
            cx,
            records,
            retry: false,
        };
        pump(&mut p);
        if p.retry {
            self.push(self.now, Ev::Client);
        }
    }

    /// Put one command in flight, with a latency and maybe an error.
    fn issue(&mut self, cmd: IoCmd<Bytes>, rng: &mut ChaCha8Rng, clock: u64) {
        let (lo, hi) = match (cmd.dev, self.slow_syncs, &cmd.op) {
            (Dev::Cache, Some(r), IoOp::Flush | IoOp::Write { fua: true, .. }) => r,
            (Dev::Cache, ..) => self.lat.cache,
            _ => self.lat.backing,
        };
        let lat = rng.gen_range(lo..hi);
        let disk = if cmd.dev == Dev::Cache {
            &self.cache
        } else {
            &self.backing
        };
        let fail = self.lat.err_rate > 0.0
            && rng.gen_bool(self.lat.err_rate)
            && !matches!(cmd.op, IoOp::GroupBegin { .. });
        let stamp = disk.flush_issue_stamp();
        let torn = match &cmd.op {
            IoOp::Write { data, .. } if fail && cmd.group.is_none() => {
                rng.gen_range(0..=data.len() / SECTOR) * SECTOR
            }
            _ => 0,
        };
        self.count_table_write(&cmd);
        if self.verbose {
            self.trace_issue(&cmd, fail, lat);
        }
        self.push(self.now + lat, Ev::Io(cmd.id));
        self.inflight.insert(
            cmd.id,
            InFlight {
                cmd,
                stamp,
                fail,
                torn,
                issued_at: clock,
            },
        );
    }

    /// Print a command put in flight (`--verbose`).
    fn trace_issue(&self, cmd: &IoCmd<Bytes>, fail: bool, lat: u64) {
        let what = match &cmd.op {
            IoOp::Read { offset, len } => format!("read {offset}+{len}"),
            IoOp::Write { offset, data, fua } => format!(
                "write {offset}+{} fua={fua} stamp=w{}/s{}",
                data.len(),
                u64::from_le_bytes(data[8..16].try_into().unwrap()),
                u64::from_le_bytes(data[16..24].try_into().unwrap())
            ),
            other => format!("{other:?}"),
        };
        eprintln!(
            "t={}   io {} {:?} {what} group={:?} fail={fail} done_at={}",
            self.now,
            cmd.id,
            cmd.dev,
            cmd.group,
            self.now + lat
        );
    }

    /// Count metadata-page writes per commit (a commit record write ends one).
    fn count_table_write(&mut self, cmd: &IoCmd<Bytes>) {
        if cmd.dev != Dev::Cache {
            return;
        }
        if let IoOp::Write { offset, .. } = cmd.op {
            let (lo, hi) = self.table;
            if offset >= lo && offset < hi {
                // Both copies of a page count as one page.
                self.pages_since_commit
                    .insert((offset - lo) / (2 * nvwc_core::layout::PAGE_BYTES));
            } else if offset < lo && offset >= nvwc_core::layout::PAGE_BYTES {
                let n = self.pages_since_commit.len() as u64;
                self.max_commit_pages = self.max_commit_pages.max(n);
                self.pages_since_commit.clear();
            }
        }
    }

    /// Writes in flight on `dev` (outside atomic groups), for the crash.
    pub fn inflight_writes(&self, dev: Dev) -> Vec<(u64, Vec<u8>)> {
        self.inflight
            .values()
            .filter(|f| f.cmd.dev == dev && f.cmd.group.is_none())
            .filter_map(|f| match &f.cmd.op {
                IoOp::Write { offset, data, .. } => Some((*offset, data.to_vec())),
                _ => None,
            })
            .collect()
    }

    /// Groups whose `GroupEnd` is in flight.
    pub fn inflight_group_ends(&self) -> Vec<u64> {
        self.inflight
            .values()
            .filter_map(|f| match f.cmd.op {
                IoOp::GroupEnd { group } => Some(group),
                _ => None,
            })
            .collect()
    }
}

/// The world as the engine's pump sees it (`World::pump`).
struct Pumped<'a, 'c> {
    w: &'a mut World,
    client: &'a mut dyn Client,
    cx: &'a mut Ctx<'c>,
    /// The client records journal transactions (`Client::records_txns`).
    records: bool,
    /// The client asked for a retry.
    retry: bool,
}

impl Driver<Bytes> for Pumped<'_, '_> {
    fn engine(&mut self) -> &mut Engine<Bytes> {
        &mut self.w.eng
    }
    fn command(&mut self, cmd: IoCmd<Bytes>) {
        self.w.issue(cmd, self.cx.rng, self.cx.o.clock);
    }
    fn reply(&mut self, r: Reply<Bytes>) {
        let w = &mut *self.w;
        let Some((rng, _)) = w.replies.as_mut() else {
            self.retry |= self.client.reply(r, w.now, self.cx);
            return;
        };
        w.held.push(r);
        if !w.replies_due {
            w.replies_due = true;
            let t = w.now + rng.gen_range(0..REPLY_DELAY_NS);
            w.push(t, Ev::Replies);
        }
    }
    fn event(&mut self, ev: Event) {
        if self.records {
            crate::record_event(ev, self.cx.o, false, self.cx.out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// A client with one request the engine never answers, and a tick every
    /// 100 ms that keeps events coming (as a timer that keeps firing would).
    struct Hung {
        ticks: u64,
    }

    impl Client for Hung {
        fn issue(&mut self, w: &mut World, _: &mut Ctx) -> Option<u64> {
            self.ticks += 1;
            Some(w.now + 100_000_000)
        }
        fn reply(&mut self, _: Reply<Bytes>, _: u64, _: &mut Ctx) -> bool {
            false
        }
        fn outstanding(&self) -> (usize, Option<(u64, u64)>) {
            (1, Some((7, 0)))
        }
        fn all_issued(&self) -> bool {
            true
        }
    }

    #[test]
    fn a_request_outstanding_past_the_bound_fails_while_events_keep_coming() {
        let cfg = Config::new(4096, 16, 64 * 4096, WritePolicyKind::WriteBack);
        let eng = Engine::new(cfg).unwrap();
        let lat = Latency {
            cache: (1, 2),
            backing: (1, 2),
            err_rate: 0.0,
        };
        let mut w = World::new(
            eng,
            Disk::new(vec![0; 1 << 20]),
            Disk::new(vec![0; 1 << 20]),
            lat,
            0,
            (0, 0),
        );
        let mut o = Oracle::new();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut out = SeedOutcome::default();
        let mut c = Hung { ticks: 0 };
        let stop = w.run(
            &mut c,
            &mut o,
            &mut rng,
            &mut out,
            u64::MAX,
            &mut |_, _, _| true,
            &|_| false,
        );
        assert_eq!(stop, Stop::Violation);
        assert!(
            o.violations[0].starts_with("liveness: request #7"),
            "{:?}",
            o.violations
        );
        assert!(w.now > LIVENESS_NS && w.now <= LIVENESS_NS + 200_000_000);
        assert!(c.ticks > 300, "events kept coming: {}", c.ticks);
    }
}
