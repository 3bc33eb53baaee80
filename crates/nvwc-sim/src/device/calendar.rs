//! A single shared resource (a link or bus) booked in time intervals.
//!
//! Transfers are booked into the earliest gap that can hold them, so a
//! transfer booked later (in call order) may run before one booked earlier if
//! it fits in an idle gap: the resource never idles while a booked transfer
//! could use it, and booked intervals never overlap.

use super::Nanos;

#[derive(Clone, Debug, Default)]
pub(crate) struct Calendar {
    /// Sorted, disjoint, non-adjacent busy intervals `[start, end)`.
    busy: Vec<(Nanos, Nanos)>,
}

impl Calendar {
    /// Forget intervals that end at or before `t` (they can no longer affect
    /// bookings, whose earliest start is never before the current time).
    pub fn prune(&mut self, t: Nanos) {
        let keep_from = self.busy.partition_point(|&(_, e)| e <= t);
        self.busy.drain(..keep_from);
    }

    /// Book `dur` ns starting no earlier than `earliest`; returns the start.
    pub fn book(&mut self, earliest: Nanos, dur: Nanos) -> Nanos {
        if dur == 0 {
            return earliest;
        }
        let mut start = earliest;
        let mut idx = self.busy.len();
        for (i, &(s, e)) in self.busy.iter().enumerate() {
            if e <= start {
                continue;
            }
            if s >= start + dur {
                idx = i;
                break;
            }
            start = start.max(e);
        }
        // Insert [start, start+dur) at the first interval that begins after it.
        let end = start + dur;
        let pos = if idx == self.busy.len() {
            self.busy.partition_point(|&(s, _)| s < start)
        } else {
            idx
        };
        self.busy.insert(pos, (start, end));
        // Merge with neighbours that touch it.
        if pos + 1 < self.busy.len() && self.busy[pos + 1].0 == end {
            self.busy[pos].1 = self.busy[pos + 1].1;
            self.busy.remove(pos + 1);
        }
        if pos > 0 && self.busy[pos - 1].1 == start {
            self.busy[pos - 1].1 = self.busy[pos].1;
            self.busy.remove(pos);
        }
        start
    }

    #[cfg(test)]
    pub fn intervals(&self) -> &[(Nanos, Nanos)] {
        &self.busy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn books_back_to_back_then_fills_gap() {
        let mut c = Calendar::default();
        assert_eq!(c.book(0, 10), 0);
        assert_eq!(c.book(0, 10), 10);
        assert_eq!(c.book(100, 10), 100);
        // Gap [20, 100) holds a 50 ns transfer.
        assert_eq!(c.book(5, 50), 20);
        // Remaining gap [70, 100) is too small for 40.
        assert_eq!(c.book(0, 40), 110);
        assert_eq!(c.intervals(), &[(0, 70), (100, 150)]);
        c.prune(80);
        assert_eq!(c.intervals(), &[(100, 150)]);
    }

    #[test]
    fn never_overlaps() {
        let mut c = Calendar::default();
        let mut booked = Vec::new();
        for i in 0..200u64 {
            let earliest = (i * 37) % 500;
            let dur = 1 + (i * 13) % 17;
            let s = c.book(earliest, dur);
            assert!(s >= earliest);
            booked.push((s, s + dur));
        }
        booked.sort();
        for w in booked.windows(2) {
            assert!(w[0].1 <= w[1].0, "overlap {:?}", w);
        }
    }
}
