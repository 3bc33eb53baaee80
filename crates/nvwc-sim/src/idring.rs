//! A map from increasing integer ids to values, for ids that are handed out
//! in order and retired in roughly that order (requests and device commands
//! in flight): a ring of slots indexed by `id - base`, with no hashing.
//!
//! Memory is one slot per id between the oldest live id and the newest, so
//! it stays small while ids are retired not long after they are issued.

use std::collections::VecDeque;

/// See the module docs.
#[derive(Debug)]
pub(crate) struct IdRing<T> {
    /// Id of `slots[0]`.
    base: u64,
    /// `slots[i]` holds id `base + i`; the front slot is live unless the
    /// ring is empty.
    slots: VecDeque<Option<T>>,
    len: usize,
}

impl<T> Default for IdRing<T> {
    fn default() -> Self {
        IdRing {
            base: 0,
            slots: VecDeque::new(),
            len: 0,
        }
    }
}

impl<T> IdRing<T> {
    /// Live entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No live entries.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Insert `v` under `id`. `id` MUST be above every id inserted so far
    /// that is still live (ids are handed out in increasing order).
    pub fn insert(&mut self, id: u64, v: T) {
        if self.slots.is_empty() {
            self.base = id;
        }
        let end = self.base + self.slots.len() as u64;
        assert!(id >= end, "id {id} inserted out of order (next free {end})");
        for _ in end..id {
            self.slots.push_back(None);
        }
        self.slots.push_back(Some(v));
        self.len += 1;
    }

    fn index(&self, id: u64) -> Option<usize> {
        let i = id.checked_sub(self.base)?;
        (i < self.slots.len() as u64).then_some(i as usize)
    }

    /// The value under `id`.
    pub fn get_mut(&mut self, id: u64) -> Option<&mut T> {
        let i = self.index(id)?;
        self.slots[i].as_mut()
    }

    /// Remove and return the value under `id`.
    pub fn remove(&mut self, id: u64) -> Option<T> {
        let i = self.index(id)?;
        let v = self.slots[i].take()?;
        self.len -= 1;
        while let Some(None) = self.slots.front() {
            self.slots.pop_front();
            self.base += 1;
        }
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Against a `HashMap` under a mix of in-order inserts (with gaps) and
    /// out-of-order removals.
    #[test]
    fn behaves_like_a_map() {
        let mut ring = IdRing::default();
        let mut map = HashMap::new();
        let mut next = 10u64;
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(12345);
        for step in 0..20_000u64 {
            let x: u64 = rng.gen();
            if x >> 62 != 0 || map.is_empty() {
                next += 1 + (x >> 40) % 3;
                ring.insert(next, step);
                map.insert(next, step);
            } else {
                // Remove a live id, or probe one that is not.
                let probe = next.saturating_sub((x >> 20) % 64);
                assert_eq!(ring.remove(probe), map.remove(&probe));
            }
            if let Some(v) = ring.get_mut(next) {
                *v += 1;
                *map.get_mut(&next).expect("live in both") += 1;
            }
            assert_eq!(ring.len(), map.len());
            assert_eq!(ring.is_empty(), map.is_empty());
        }
        let ids: Vec<u64> = map.keys().copied().collect();
        for id in ids {
            assert_eq!(ring.remove(id), map.remove(&id));
        }
        assert!(ring.is_empty());
        assert!(ring.slots.is_empty(), "an empty ring keeps no slots");
    }

    #[test]
    #[should_panic(expected = "out of order")]
    fn rejects_an_old_id() {
        let mut ring = IdRing::default();
        ring.insert(5, ());
        ring.insert(4, ());
    }
}
