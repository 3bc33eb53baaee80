//! Host CPU time per client request: the server's protocol handling, the
//! payload copy and the engine's own work, which the device models do not
//! see.
//!
//! The driver charges it on one CPU in first-come order, between the
//! engine's reply and the client's completion: a request whose I/O is done
//! completes `cost(len)` after the CPU is free. Without it, a request the
//! cache answers with no device I/O at all (a write that becomes a patch,
//! a queued write) completes in zero time, and ratios against a policy
//! that waits for a device grow without bound (the non-blocking-writes
//! report's lazy mode came out at 863× blocking).
//!
//! The default is this machine's live measurement of `nvwc serve`
//! ([`CpuCost::measured`]): CPU time of the server process per request in
//! `scripts/bench-nbd.sh` (`reports/bench-nbd.txt`, medians of 3
//! interleaved rounds; the 2026-11-26 quiet-machine run): 5.27 µs per 4 KiB
//! random write and 16.57 µs per 64 KiB sequential write (write-back, hot
//! cache). A line through the two: 4.52 µs per request plus 188 ns per KiB.
//! It is one host's cost, not the papers' machines'; it bounds what a
//! request answered from memory can reach, which is what matters here.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::device::Nanos;

/// CPU time charged per request (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuCost {
    /// Fixed cost of one request.
    pub per_request_ns: Nanos,
    /// Cost per KiB of payload (reads and writes).
    pub per_kib_ns: Nanos,
}

impl CpuCost {
    /// Measured on this machine (module docs): 4.52 µs + 188 ns per KiB.
    pub const fn measured() -> Self {
        CpuCost {
            per_request_ns: 4_520,
            per_kib_ns: 188,
        }
    }

    /// No CPU time (the simulator before this model; for studies of the
    /// devices alone).
    pub const fn none() -> Self {
        CpuCost {
            per_request_ns: 0,
            per_kib_ns: 0,
        }
    }

    /// The cost of a request with `bytes` of payload.
    pub fn cost(&self, bytes: u64) -> Nanos {
        self.per_request_ns + self.per_kib_ns * bytes / 1024
    }
}

impl Default for CpuCost {
    fn default() -> Self {
        CpuCost::measured()
    }
}

/// One CPU serving requests in arrival order: `T` is what completes.
#[derive(Debug)]
pub(crate) struct CpuQueue<T> {
    free_at: Nanos,
    queue: VecDeque<(Nanos, T)>,
}

impl<T> Default for CpuQueue<T> {
    fn default() -> Self {
        CpuQueue {
            free_at: 0,
            queue: VecDeque::new(),
        }
    }
}

impl<T> CpuQueue<T> {
    /// `what` needs `cost` of CPU from `now` on; returns when it is done.
    pub fn push(&mut self, now: Nanos, cost: Nanos, what: T) -> Nanos {
        let done = self.free_at.max(now) + cost;
        self.free_at = done;
        self.queue.push_back((done, what));
        done
    }

    /// When the next one is done.
    pub fn next_at(&self) -> Option<Nanos> {
        self.queue.front().map(|x| x.0)
    }

    /// The next one, if it is done by `now`.
    pub fn pop_done(&mut self, now: Nanos) -> Option<T> {
        if self.next_at()? <= now {
            self.queue.pop_front().map(|x| x.1)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measured_cost_matches_the_two_measurements_it_was_drawn_through() {
        let c = CpuCost::measured();
        // 5.27 µs at 4 KiB, 16.57 µs at 64 KiB, within rounding.
        assert!((c.cost(4096) as i64 - 5_270).abs() < 10, "{}", c.cost(4096));
        assert!(
            (c.cost(65536) as i64 - 16_570).abs() < 50,
            "{}",
            c.cost(65536)
        );
        assert_eq!(CpuCost::none().cost(1 << 20), 0);
    }

    #[test]
    fn one_cpu_serves_in_order_and_queues_when_busy() {
        let mut q = CpuQueue::default();
        assert_eq!(q.push(100, 10, 'a'), 110);
        // Arrives while busy: waits for 'a'.
        assert_eq!(q.push(105, 10, 'b'), 120);
        // Arrives when idle: starts at once.
        assert_eq!(q.push(200, 5, 'c'), 205);
        assert_eq!(q.pop_done(109), None);
        assert_eq!(q.pop_done(120), Some('a'));
        assert_eq!(q.pop_done(120), Some('b'));
        assert_eq!(q.next_at(), Some(205));
        assert_eq!(q.pop_done(205), Some('c'));
        assert_eq!(q.next_at(), None);
    }
}
