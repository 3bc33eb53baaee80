//! Exact Mattson stack distances in `O(log M)` amortised time per access.
//!
//! Every key's most recent access time is a marked position over access
//! timestamps. The stack distance of an access to `key`, last accessed at time
//! `l`, is the number of marked positions after `l`: the number of distinct keys
//! touched since. Marks live in a bitset; a Fenwick tree (binary indexed tree)
//! counts marks per 64-bit word, so a rank query is a Fenwick prefix over words
//! plus one popcount, and the tree is 64x smaller than the timestamp space
//! (it stays cache-resident for millions of keys). Timestamps are compacted
//! (renumbered `0..M` in order) whenever they reach the end of the tree, so the
//! tree holds `O(M)` positions and memory stays `O(M)` for `M` distinct keys.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use crate::hash::MixBuildHasher;

/// Default smallest timestamp space (positions in the Fenwick tree).
const DEFAULT_MIN_CAPACITY: usize = 1024;

/// Exact LRU stack-distance calculator.
///
/// Distances are 0-based: `Some(0)` means the key was also the previous access;
/// an access hits in an LRU cache of `c` blocks iff its distance is `< c`.
#[derive(Clone, Debug)]
pub struct StackDistance {
    /// key -> timestamp of its last access.
    last: HashMap<u64, u32, MixBuildHasher>,
    /// Fenwick tree over the words of `marks`, 1-based, `bit.len() == marks.len() + 1`.
    bit: Vec<u32>,
    /// Bitset of marked timestamps (one per live key).
    marks: Vec<u64>,
    /// Next timestamp to hand out; `now <= cap`.
    now: usize,
    /// Number of timestamp positions.
    cap: usize,
    min_cap: usize,
}

impl Default for StackDistance {
    fn default() -> Self {
        Self::new()
    }
}

impl StackDistance {
    /// An empty calculator.
    pub fn new() -> Self {
        Self::with_min_capacity(DEFAULT_MIN_CAPACITY)
    }

    /// An empty calculator whose timestamp space never shrinks below `min_cap`
    /// positions. Small values force frequent compaction (useful in tests).
    /// Caller guarantees `min_cap >= 2`.
    pub fn with_min_capacity(min_cap: usize) -> Self {
        assert!(min_cap >= 2, "min_cap must be at least 2");
        assert!(min_cap < u32::MAX as usize / 2, "min_cap too large");
        StackDistance {
            last: HashMap::with_hasher(MixBuildHasher),
            bit: vec![0; min_cap.div_ceil(64) + 1],
            marks: vec![0; min_cap.div_ceil(64)],
            now: 0,
            cap: min_cap,
            min_cap,
        }
    }

    /// Number of distinct keys currently tracked.
    #[inline]
    pub fn distinct(&self) -> usize {
        self.last.len()
    }

    /// Records an access to `key` and returns its stack distance, or `None` on a
    /// cold miss (first access, or first since [`StackDistance::remove`]).
    #[inline]
    pub fn access(&mut self, key: u64) -> Option<u64> {
        if self.now == self.cap {
            self.compact();
        }
        let t = self.now;
        self.now += 1;
        let prev = match self.last.entry(key) {
            Entry::Occupied(mut e) => Some(std::mem::replace(e.get_mut(), t as u32) as usize),
            Entry::Vacant(e) => {
                e.insert(t as u32);
                None
            }
        };
        let d = prev.map(|l| {
            // Every key has exactly one mark; those after l were touched since.
            let d = self.last.len() - self.prefix(l) as usize;
            self.clear_mark(l);
            self.fenwick_sub(l);
            d as u64
        });
        self.set_mark(t);
        self.fenwick_add(t);
        d
    }

    /// Forgets `key` (as if it had never been accessed). Returns whether it was tracked.
    pub fn remove(&mut self, key: u64) -> bool {
        match self.last.remove(&key) {
            Some(l) => {
                self.clear_mark(l as usize);
                self.fenwick_sub(l as usize);
                true
            }
            None => false,
        }
    }

    /// Bytes of heap memory held (approximate for the hash map).
    pub fn mem_bytes(&self) -> usize {
        self.bit.capacity() * 4
            + self.marks.capacity() * 8
            + self.last.capacity() * (std::mem::size_of::<(u64, u32)>() + 1)
    }

    /// Number of marks at positions `0..=i`.
    #[inline]
    fn prefix(&self, i: usize) -> u32 {
        let w = i >> 6;
        let mut s = (self.marks[w] & (u64::MAX >> (63 - (i & 63)))).count_ones();
        let mut idx = w; // Fenwick prefix over words 0..w (1-based index w)
        while idx > 0 {
            s += self.bit[idx];
            idx &= idx - 1;
        }
        s
    }

    #[inline]
    fn fenwick_add(&mut self, i: usize) {
        let mut idx = (i >> 6) + 1;
        let n = self.marks.len();
        while idx <= n {
            self.bit[idx] += 1;
            idx += idx & idx.wrapping_neg();
        }
    }

    #[inline]
    fn fenwick_sub(&mut self, i: usize) {
        let mut idx = (i >> 6) + 1;
        let n = self.marks.len();
        while idx <= n {
            self.bit[idx] -= 1;
            idx += idx & idx.wrapping_neg();
        }
    }

    #[inline]
    fn set_mark(&mut self, i: usize) {
        self.marks[i >> 6] |= 1 << (i & 63);
    }

    #[inline]
    fn clear_mark(&mut self, i: usize) {
        debug_assert!(
            self.marks[i >> 6] & (1 << (i & 63)) != 0,
            "clearing an unmarked position"
        );
        self.marks[i >> 6] &= !(1 << (i & 63));
    }

    /// Renumbers live timestamps to `0..M` (order preserved) and resizes the
    /// timestamp space to `max(2M, min_cap)`.
    #[cold]
    fn compact(&mut self) {
        let m = self.last.len();
        // Rank of old timestamp t = marks strictly before t: word prefix counts + popcount.
        let mut word_rank = Vec::with_capacity(self.marks.len());
        let mut acc = 0u32;
        for w in &self.marks {
            word_rank.push(acc);
            acc += w.count_ones();
        }
        debug_assert_eq!(acc as usize, m, "marks out of sync with key map");
        for v in self.last.values_mut() {
            let t = *v as usize;
            let below = self.marks[t >> 6] & ((1u64 << (t & 63)) - 1);
            *v = word_rank[t >> 6] + below.count_ones();
        }
        let cap = (2 * m).max(self.min_cap);
        assert!(
            cap < u32::MAX as usize,
            "too many distinct keys for u32 timestamps"
        );
        self.cap = cap;
        self.now = m;
        self.marks.clear();
        self.marks.resize(cap.div_ceil(64), 0);
        for i in 0..m {
            self.set_mark(i);
        }
        // Linear-time Fenwick construction over word popcounts.
        let n = self.marks.len();
        self.bit.clear();
        self.bit.resize(n + 1, 0);
        for idx in 1..=n {
            self.bit[idx] += self.marks[idx - 1].count_ones();
            let parent = idx + (idx & idx.wrapping_neg());
            if parent <= n {
                self.bit[parent] += self.bit[idx];
            }
        }
        self.bit.shrink_to_fit();
        self.marks.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simple_sequence() {
        let mut sd = StackDistance::new();
        // a b c a a c b
        let got: Vec<_> = [1, 2, 3, 1, 1, 3, 2]
            .iter()
            .map(|&k| sd.access(k))
            .collect();
        assert_eq!(
            got,
            vec![None, None, None, Some(2), Some(0), Some(1), Some(2)]
        );
        assert_eq!(sd.distinct(), 3);
    }

    #[test]
    fn remove_forgets_key() {
        let mut sd = StackDistance::new();
        sd.access(1);
        sd.access(2);
        sd.access(3);
        assert!(sd.remove(2));
        assert!(!sd.remove(2));
        assert_eq!(sd.access(1), Some(1)); // only 3 since
        assert_eq!(sd.access(2), None);
        assert_eq!(sd.distinct(), 3);
    }

    #[test]
    fn compaction_keeps_distances_and_bounds_memory() {
        let mut sd = StackDistance::with_min_capacity(4);
        // Cycle over 3 keys for a long time: every distance is 2, space stays small.
        for i in 0..10_000u64 {
            let d = sd.access(i % 3);
            if i >= 3 {
                assert_eq!(d, Some(2));
            }
        }
        assert!(sd.cap <= 8, "cap {}", sd.cap);
    }
}
