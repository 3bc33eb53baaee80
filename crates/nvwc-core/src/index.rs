//! Compact indexes: a hash index from backing block number to block id that
//! stores only `u32` ids (the key lives in the block table), and a bitmap free
//! set. Together they cut the engine's per-block RAM.

/// A `HashMap` for the engine's integer ids (requests, commands, blocks),
/// hashed with one multiply instead of SipHash: the keys come from the engine
/// or the driver, not from an adversary, and the maps sit on every request's
/// path.
pub type IdMap<K, V> = std::collections::HashMap<K, V, std::hash::BuildHasherDefault<IdHasher>>;

/// The hasher behind [`IdMap`] (integer keys only).
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        let h = self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^ (h >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u32(&mut self, i: u32) {
        self.0 = self.0.rotate_left(32) ^ u64::from(i);
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = self.0.rotate_left(32) ^ i;
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
}

/// Maps a backing block number to a block id. The table stores ids only;
/// callers pass a `key` function that returns an id's block number.
///
/// Linear probing with backward-shift deletion; load factor at most 3/4. The
/// table size is not rounded to a power of two (positions come from a
/// multiply-shift of the hash), so a full cache pays 4/3 × 4 bytes per block.
#[derive(Debug, Clone)]
pub struct LbnIndex {
    table: Vec<u32>,
    len: usize,
}

const EMPTY: u32 = u32::MAX;
/// log2 of the run of neighbouring blocks that share a hashed base (see `home`).
const RUN_SHIFT: u32 = 4;

impl LbnIndex {
    pub fn with_capacity(n: usize) -> Self {
        let size = (n * 4 / 3 + 1).max(16);
        LbnIndex {
            table: vec![EMPTY; size],
            len: 0,
        }
    }
    pub fn len(&self) -> usize {
        self.len
    }
    /// Home position of `lbn`. The 16 blocks of an aligned run share one
    /// hashed base and take consecutive positions from it (one 64-byte cache
    /// line of ids), so the lookups of a large request touch one or two lines
    /// of the table instead of one line per block.
    fn home(&self, lbn: u64) -> usize {
        let n = self.table.len();
        let base = ((nvwc_mrc::mix64(lbn >> RUN_SHIFT) as u128 * n as u128) >> 64) as usize;
        let i = base + (lbn & ((1 << RUN_SHIFT) - 1)) as usize;
        if i >= n {
            i - n
        } else {
            i
        }
    }
    fn next(&self, i: usize) -> usize {
        if i + 1 == self.table.len() {
            0
        } else {
            i + 1
        }
    }
    /// The slot holding `lbn`'s id, if any.
    #[inline]
    fn find(&self, lbn: u64, key: impl Fn(u32) -> u64) -> Option<usize> {
        let mut i = self.home(lbn);
        loop {
            let id = self.table[i];
            if id == EMPTY {
                return None;
            }
            if key(id) == lbn {
                return Some(i);
            }
            i = self.next(i);
        }
    }
    /// The id stored for `lbn`.
    pub fn get(&self, lbn: u64, key: impl Fn(u32) -> u64) -> Option<u32> {
        self.find(lbn, key).map(|i| self.table[i])
    }
    /// Insert `id` for `lbn`. Caller guarantees `lbn` is absent and `key(id) == lbn`.
    pub fn insert(&mut self, lbn: u64, id: u32, key: impl Fn(u32) -> u64) {
        assert!(id != EMPTY);
        if (self.len + 1) * 4 > self.table.len() * 3 {
            let bigger = vec![EMPTY; self.table.len() * 2];
            let old = std::mem::replace(&mut self.table, bigger);
            self.len = 0;
            for x in old.into_iter().filter(|&x| x != EMPTY) {
                self.place(key(x), x);
            }
        }
        debug_assert!(self.get(lbn, &key).is_none(), "key inserted twice");
        self.place(lbn, id);
    }
    fn place(&mut self, lbn: u64, id: u32) {
        let mut i = self.home(lbn);
        while self.table[i] != EMPTY {
            i = self.next(i);
        }
        self.table[i] = id;
        self.len += 1;
    }
    /// Remove `lbn`'s entry, returning its id.
    pub fn remove(&mut self, lbn: u64, key: impl Fn(u32) -> u64) -> Option<u32> {
        let i = self.find(lbn, &key)?;
        let removed = self.table[i];
        // Backward shift: move later entries of the cluster into the hole when
        // their home position does not lie cyclically in (hole, j].
        let mut hole = i;
        let mut j = i;
        loop {
            j = self.next(j);
            let id = self.table[j];
            if id == EMPTY {
                break;
            }
            let home = self.home(key(id));
            let in_range = if hole <= j {
                home > hole && home <= j
            } else {
                home > hole || home <= j
            };
            if !in_range {
                self.table[hole] = id;
                hole = j;
            }
        }
        self.table[hole] = EMPTY;
        self.len -= 1;
        Some(removed)
    }
    pub fn mem_bytes(&self) -> usize {
        self.table.capacity() * 4
    }
}

/// A set of free ids as a bitmap, with amortised O(1) `pop`.
///
/// `pop` takes the lowest free id of the first non-empty word at or after
/// the cursor (cyclically); a second bitmap with one bit per non-empty word
/// finds that word without scanning empty ones.
#[derive(Debug, Clone, Default)]
pub struct FreeSet {
    words: Vec<u64>,
    /// Bit `w % 64` of `nonempty[w / 64]`: `words[w] != 0`.
    nonempty: Vec<u64>,
    len: usize,
    cursor: usize,
}

impl FreeSet {
    /// `n` ids, all free when `all_free`.
    pub fn new(n: usize, all_free: bool) -> Self {
        let mut s = FreeSet {
            words: Vec::new(),
            nonempty: Vec::new(),
            len: 0,
            cursor: 0,
        };
        s.grow(n);
        if all_free {
            for i in 0..n {
                s.push(i as u32);
            }
        }
        s
    }
    /// Make room for ids below `n` (new ids are not free).
    pub fn grow(&mut self, n: usize) {
        if n.div_ceil(64) > self.words.len() {
            self.words.resize(n.div_ceil(64), 0);
            self.nonempty.resize(self.words.len().div_ceil(64), 0);
        }
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn clear(&mut self) {
        self.words.iter_mut().for_each(|w| *w = 0);
        self.nonempty.iter_mut().for_each(|w| *w = 0);
        self.len = 0;
    }
    /// Record whether word `w` is non-empty in the summary.
    fn note(&mut self, w: usize) {
        let bit = 1u64 << (w % 64);
        if self.words[w] != 0 {
            self.nonempty[w / 64] |= bit;
        } else {
            self.nonempty[w / 64] &= !bit;
        }
    }
    /// The first non-empty word in `from..to` (word indices), if any.
    fn first_nonempty(&self, from: usize, to: usize) -> Option<usize> {
        let mut s = from / 64;
        let mut mask = !0u64 << (from % 64);
        while s * 64 < to {
            let bits = self.nonempty[s] & mask;
            if bits != 0 {
                let w = s * 64 + bits.trailing_zeros() as usize;
                return (w < to).then_some(w);
            }
            s += 1;
            mask = !0;
        }
        None
    }
    /// Mark `i` free. Caller guarantees it is not free already.
    pub fn push(&mut self, i: u32) {
        let (w, b) = (i as usize / 64, i % 64);
        self.grow(i as usize + 1);
        assert!(self.words[w] & (1 << b) == 0, "id {i} freed twice");
        self.words[w] |= 1 << b;
        self.note(w);
        self.len += 1;
    }
    /// Take a free id.
    pub fn pop(&mut self) -> Option<u32> {
        if self.len == 0 {
            return None;
        }
        let n = self.words.len();
        let w = self
            .first_nonempty(self.cursor, n)
            .or_else(|| self.first_nonempty(0, self.cursor))
            .expect("free count says non-empty");
        debug_assert!(self.words[w] != 0);
        let b = self.words[w].trailing_zeros();
        self.words[w] &= !(1 << b);
        self.note(w);
        self.len -= 1;
        self.cursor = w;
        Some((w * 64) as u32 + b)
    }
    /// Take `i` if it is free.
    pub fn take(&mut self, i: u32) -> bool {
        let (w, b) = (i as usize / 64, i % 64);
        match self.words.get_mut(w) {
            Some(x) if *x & (1 << b) != 0 => {
                *x &= !(1 << b);
                self.note(w);
                self.len -= 1;
                true
            }
            _ => false,
        }
    }
    pub fn mem_bytes(&self) -> usize {
        (self.words.capacity() + self.nonempty.capacity()) * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        #[test]
        fn index_matches_hashmap(ops in proptest::collection::vec((0u64..200, any::<bool>()), 1..2000)) {
            // Ids are slots in `keys`; each id maps to one lbn.
            let mut keys: Vec<u64> = Vec::new();
            let mut free: Vec<u32> = Vec::new();
            let mut idx = LbnIndex::with_capacity(4);
            let mut model: HashMap<u64, u32> = HashMap::new();
            for (lbn, ins) in ops {
                if ins && !model.contains_key(&lbn) {
                    let id = free.pop().unwrap_or_else(|| { keys.push(0); (keys.len() - 1) as u32 });
                    keys[id as usize] = lbn;
                    let k = keys.clone();
                    idx.insert(lbn, id, |x| k[x as usize]);
                    model.insert(lbn, id);
                } else if !ins {
                    let k = keys.clone();
                    let got = idx.remove(lbn, |x| k[x as usize]);
                    prop_assert_eq!(got, model.remove(&lbn));
                    if let Some(id) = got { free.push(id); }
                }
                let k = keys.clone();
                for (&l, &id) in &model {
                    prop_assert_eq!(idx.get(l, |x| k[x as usize]), Some(id));
                }
                prop_assert_eq!(idx.len(), model.len());
            }
        }

        /// `pop` returns what a plain cyclic scan of the words from the
        /// cursor would (the order every run of the engine depends on).
        #[test]
        fn freeset_pops_in_scan_order(n in 1usize..700, ops in proptest::collection::vec((any::<bool>(), 0u32..700), 1..800)) {
            let mut fs = FreeSet::new(n, true);
            let mut words = vec![0u64; n.div_ceil(64)];
            for i in 0..n { words[i / 64] |= 1 << (i % 64); }
            let mut cursor = 0usize;
            for (pop, i) in ops {
                if pop {
                    let m = words.len();
                    let want = (0..m).map(|k| (cursor + k) % m).find(|&w| words[w] != 0).map(|w| {
                        let b = words[w].trailing_zeros();
                        words[w] &= !(1 << b);
                        cursor = w;
                        (w * 64) as u32 + b
                    });
                    prop_assert_eq!(fs.pop(), want);
                } else if (i as usize) < n {
                    let (w, b) = (i as usize / 64, i % 64);
                    if words[w] & (1 << b) == 0 {
                        words[w] |= 1 << b;
                        fs.push(i);
                    } else {
                        words[w] &= !(1 << b);
                        prop_assert!(fs.take(i));
                    }
                }
                let ones: u32 = words.iter().map(|w| w.count_ones()).sum();
                prop_assert_eq!(fs.len(), ones as usize);
            }
        }

        #[test]
        fn freeset_behaves_like_a_set(ops in proptest::collection::vec(any::<bool>(), 1..500)) {
            let mut fs = FreeSet::new(64, true);
            let mut taken: Vec<u32> = Vec::new();
            for pop in ops {
                if pop {
                    match fs.pop() {
                        Some(i) => { prop_assert!(!taken.contains(&i)); taken.push(i); }
                        None => prop_assert_eq!(taken.len(), 64),
                    }
                } else if taken.len() % 3 == 1 {
                    // Taking a given id succeeds exactly when it is free.
                    let i = (taken.len() as u32 * 7) % 64;
                    let was_free = !taken.contains(&i);
                    prop_assert_eq!(fs.take(i), was_free);
                    if was_free { taken.push(i); }
                } else if let Some(i) = taken.pop() {
                    fs.push(i);
                }
                prop_assert_eq!(fs.len(), 64 - taken.len());
            }
        }
    }
}
