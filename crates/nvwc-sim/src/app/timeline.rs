//! A run's timeline: what the application, the cache and the backing disk
//! were doing, sampled at a fixed interval of virtual time.
//!
//! The totals of a run say *that* one policy beats another; the timeline
//! says *when* and *why*: whether the cache was full, how many writes waited
//! for a free slot, and what the critical processes were blocked on. The
//! admission report plots it for the smallest cache, where ALL and the
//! request-oriented policies part ways.
//!
//! Each sample describes the interval that ends at its time `t_ms`:
//! counters (transactions, stalled write pieces, reissues) are the interval's
//! increments; states (dirty fraction, blocked processes, backing queue) are
//! time averages over the interval. Between events nothing changes in the
//! simulation, so the run loop reports the state at every step of the clock
//! and the sampler integrates it. (Reading the state only at the interval's
//! end aliases: the model's own timers fire on round instants, and the state
//! just before one is always the same phase of its cycle.)

use serde::{Deserialize, Serialize};

use crate::device::Nanos;

/// One sample (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimelineSample {
    /// End of the interval, in ms of virtual time since the run's start.
    pub t_ms: u64,
    /// Transactions (model requests) completed in the interval, per second.
    pub tps: f64,
    /// Dirty data as a fraction of the cache's blocks (time average).
    pub dirty_frac: f64,
    /// Write pieces that began waiting for a cache slot in the interval.
    pub stalled: u64,
    /// Writes reissued to the cache (I/O inheritance) in the interval.
    pub reissued: u64,
    /// I/O inheritance requests (a critical process found blocked on a write
    /// in flight) in the interval: each may or may not lead to a reissue.
    pub io_inherits: u64,
    /// Free slots (holding no version: what a new version or a reissue
    /// takes at once) as a fraction of the cache's blocks (time average).
    pub free_frac: f64,
    /// Critical processes (own or inherited criticality) blocked on an I/O
    /// request (time average).
    pub critical_on_io: f64,
    /// Critical processes blocked on a lock or a condition (time average).
    pub critical_on_process: f64,
    /// Of those, the ones blocked on a lock whose holder (or the holder's
    /// holder, and so on) is blocked on an I/O request (time average).
    pub critical_behind_io: f64,
    /// Of those, the ones whose holder waits for a client FLUSH (time average).
    pub critical_behind_flush: f64,
    /// Client FLUSH requests in the interval.
    pub flushes: u64,
    /// FLUSH commands the engine sent to the backing store in the interval.
    pub backing_flushes: u64,
    /// Backing-disk commands queued or in service (time average).
    pub backing_queue: f64,
}

/// What the run loop reports at each step of the clock: counters (totals
/// since the start) and the state that holds until the next event.
pub(crate) struct Snapshot {
    pub ends: u64,
    pub stalled: u64,
    pub reissued: u64,
    pub io_inherits: u64,
    pub dirty_frac: f64,
    pub free_frac: f64,
    pub critical_on_io: u32,
    pub critical_on_process: u32,
    pub critical_behind_io: u32,
    pub critical_behind_flush: u32,
    pub flushes: u64,
    pub backing_flushes: u64,
    pub backing_queue: u32,
}

/// Time integrals of the state over the open interval.
#[derive(Default)]
struct Integrals {
    dirty: f64,
    free: f64,
    on_io: f64,
    on_process: f64,
    behind_io: f64,
    behind_flush: f64,
    queue: f64,
}

impl Integrals {
    fn add(&mut self, s: &Snapshot, dt: Nanos) {
        let dt = dt as f64;
        self.dirty += s.dirty_frac * dt;
        self.free += s.free_frac * dt;
        self.on_io += f64::from(s.critical_on_io) * dt;
        self.on_process += f64::from(s.critical_on_process) * dt;
        self.behind_io += f64::from(s.critical_behind_io) * dt;
        self.behind_flush += f64::from(s.critical_behind_flush) * dt;
        self.queue += f64::from(s.backing_queue) * dt;
    }
}

/// The sampler the run loop drives.
pub(crate) struct Timeline {
    every: Nanos,
    next_at: Nanos,
    acc: Integrals,
    last: [u64; 6],
    samples: Vec<TimelineSample>,
}

impl Timeline {
    /// A sampler every `every` ns (MUST be > 0).
    pub fn new(every: Nanos) -> Self {
        assert!(every > 0, "timeline interval must be positive");
        Timeline {
            every,
            next_at: every,
            acc: Integrals::default(),
            last: [0; 6],
            samples: Vec::new(),
        }
    }

    /// The clock moves from `now` to `to` (MUST NOT go back); `s` held
    /// over `[now, to)`. States are time-averaged over each interval (an
    /// instant's state would alias with the model's own periodic timers);
    /// counter increments fall in the interval they were counted in.
    pub fn advance(&mut self, now: Nanos, to: Nanos, s: &Snapshot) {
        assert!(to >= now, "the clock went back: {now} -> {to}");
        let mut from = now;
        while self.next_at <= to {
            self.acc.add(s, self.next_at - from);
            self.close(s);
            // The boundary just closed.
            from = self.next_at - self.every;
        }
        self.acc.add(s, to - from);
    }

    fn close(&mut self, s: &Snapshot) {
        let e = self.every as f64;
        let secs = e / 1e9;
        let a = std::mem::take(&mut self.acc);
        self.samples.push(TimelineSample {
            t_ms: self.next_at / 1_000_000,
            tps: (s.ends - self.last[0]) as f64 / secs,
            dirty_frac: a.dirty / e,
            stalled: s.stalled - self.last[1],
            reissued: s.reissued - self.last[2],
            io_inherits: s.io_inherits - self.last[3],
            flushes: s.flushes - self.last[4],
            backing_flushes: s.backing_flushes - self.last[5],
            critical_behind_io: a.behind_io / e,
            critical_behind_flush: a.behind_flush / e,
            free_frac: a.free / e,
            critical_on_io: a.on_io / e,
            critical_on_process: a.on_process / e,
            backing_queue: a.queue / e,
        });
        self.last = [
            s.ends,
            s.stalled,
            s.reissued,
            s.io_inherits,
            s.flushes,
            s.backing_flushes,
        ];
        self.next_at += self.every;
    }

    /// The samples taken.
    pub fn finish(self) -> Vec<TimelineSample> {
        self.samples
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(ends: u64, stalled: u64, on_io: u32) -> Snapshot {
        Snapshot {
            ends,
            stalled,
            reissued: 0,
            io_inherits: 0,
            dirty_frac: 0.5,
            free_frac: 0.25,
            critical_on_io: on_io,
            critical_on_process: 1,
            critical_behind_io: 1,
            critical_behind_flush: 0,
            flushes: 0,
            backing_flushes: 0,
            backing_queue: 3,
        }
    }

    #[test]
    fn states_are_time_averaged_and_counters_fall_in_their_interval() {
        let mut t = Timeline::new(100);
        // [0, 50): 4 on I/O; [50, 100): 0 on I/O; 10 ends by 100.
        t.advance(0, 50, &snap(0, 0, 4));
        t.advance(50, 100, &snap(10, 4, 0));
        // One step over two boundaries, 2 on I/O throughout [100, 320).
        t.advance(100, 320, &snap(25, 6, 2));
        let s = t.finish();
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].critical_on_io, 2.0);
        assert_eq!(s[0].tps, 10.0 / 100e-9);
        assert_eq!((s[0].stalled, s[1].stalled, s[2].stalled), (4, 2, 0));
        assert_eq!(s[1].tps, 15.0 / 100e-9);
        assert_eq!(s[2].tps, 0.0);
        assert_eq!((s[1].critical_on_io, s[2].critical_on_io), (2.0, 2.0));
        assert_eq!((s[2].dirty_frac, s[2].backing_queue), (0.5, 3.0));
    }

    #[test]
    fn a_step_inside_an_interval_only_accumulates() {
        let mut t = Timeline::new(100);
        t.advance(0, 30, &snap(0, 0, 1));
        t.advance(30, 60, &snap(0, 0, 3));
        assert!(t.samples.is_empty());
        t.advance(60, 100, &snap(1, 0, 0));
        // (30 × 1 + 30 × 3 + 40 × 0) / 100
        assert_eq!(t.finish()[0].critical_on_io, 1.2);
    }
}
