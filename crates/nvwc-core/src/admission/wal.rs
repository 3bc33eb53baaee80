//! `wal`: cache writes that touch a byte range declared as a write-ahead log
//! (`Config::wal_ranges`, the server's `--wal-range START:LEN`).

use super::{Admission, WriteInfo};
use crate::config::AdmissionKind;

pub struct Wal {
    /// `(start, end)` byte ranges, sorted, non-overlapping.
    ranges: Vec<(u64, u64)>,
}

impl Wal {
    /// `ranges` are `(start, len)` in bytes; empty ranges are ignored.
    pub fn new(ranges: &[(u64, u64)]) -> Self {
        let mut r: Vec<(u64, u64)> = ranges
            .iter()
            .filter(|&&(_, l)| l > 0)
            .map(|&(s, l)| (s, s.saturating_add(l)))
            .collect();
        r.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(r.len());
        for (s, e) in r {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        Wal { ranges: merged }
    }
}

impl Admission for Wal {
    fn kind(&self) -> AdmissionKind {
        AdmissionKind::Wal
    }
    fn admit(&self, w: &WriteInfo) -> bool {
        let (s, e) = (w.offset, w.offset + w.len);
        // First range ending after `s`: overlaps if it starts before `e`.
        let i = self.ranges.partition_point(|&(_, re)| re <= s);
        self.ranges.get(i).is_some_and(|&(rs, _)| rs < e)
    }
}
