//! 64-bit mixing hash (the SplitMix64 finalizer) and a `HashMap` hasher built on it.
//!
//! [`mix64`] is a bijection on `u64`, so distinct keys never collide; SHARDS relies
//! on this (no two sampled keys share a hash value) and on its good avalanche
//! behaviour (low and high bits are both usable).

use std::hash::{BuildHasher, Hasher};

/// SplitMix64 finalizer applied to `key + golden gamma`. Bijective on `u64`.
#[inline(always)]
pub fn mix64(key: u64) -> u64 {
    let mut z = key.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A fast hasher for integer keys: the state is mixed with [`mix64`] on finish.
/// Not DoS-resistant; keys here are block numbers, not attacker-chosen strings.
#[derive(Clone, Copy, Default, Debug)]
pub struct MixHasher {
    state: u64,
}

impl Hasher for MixHasher {
    #[inline]
    fn finish(&self) -> u64 {
        mix64(self.state)
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut buf = [0u8; 8];
            buf[..chunk.len()].copy_from_slice(chunk);
            self.state = mix64(self.state ^ u64::from_le_bytes(buf));
        }
    }
    #[inline]
    fn write_u64(&mut self, v: u64) {
        // Chaining keeps tuple keys order-sensitive; a lone u64 key costs one mix in finish.
        self.state = self.state.rotate_left(23) ^ v;
    }
    #[inline]
    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }
    #[inline]
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
}

/// `BuildHasher` for [`MixHasher`]; use as `HashMap<K, V, MixBuildHasher>`.
#[derive(Clone, Copy, Default, Debug)]
pub struct MixBuildHasher;

impl BuildHasher for MixBuildHasher {
    type Hasher = MixHasher;
    #[inline]
    fn build_hasher(&self) -> MixHasher {
        MixHasher::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix64_is_injective_on_a_range_and_spreads_bits() {
        let mut seen = std::collections::HashSet::new();
        let mut ones = [0u32; 64];
        for k in 0..20_000u64 {
            let h = mix64(k);
            assert!(seen.insert(h), "collision at {k}");
            for (b, o) in ones.iter_mut().enumerate() {
                *o += ((h >> b) & 1) as u32;
            }
        }
        // Every output bit should be set in roughly half of the outputs.
        for (b, &o) in ones.iter().enumerate() {
            assert!((9_000..11_000).contains(&o), "bit {b} set {o} times");
        }
    }

    #[test]
    fn sequential_keys_hash_uniformly_below_a_threshold() {
        // Fraction of keys with hash < 2^64 / 10 should be close to 0.1.
        let t = u64::MAX / 10;
        let n = 100_000u64;
        let c = (0..n).filter(|&k| mix64(k) < t).count() as f64 / n as f64;
        assert!((c - 0.1).abs() < 0.005, "fraction {c}");
    }
}
