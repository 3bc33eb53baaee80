//! The project's one hand-written random generator: splitmix64. Small, fast,
//! reproducible from a seed, and good enough for workload mixes, fault
//! draws and trial plans (the VOPR uses `rand_chacha`).

/// splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
/// generators", OOPSLA 2014). Every seed, 0 included, gives a full-period
/// sequence.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Fill `buf` with the next outputs, little-endian (the last one cut short).
    pub fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            c.copy_from_slice(&self.next_u64().to_le_bytes()[..c.len()]);
        }
    }

    /// Uniform enough in `0..n` (`0` when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn splitmix64_reference_values() {
        // First outputs for seed 0 of the reference implementation.
        let mut r = Rng::new(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(r.below(0), 0);
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        assert!((0..100).all(|_| a.below(10) == b.below(10)));
        let mut bytes = [0u8; 12];
        Rng::new(0).fill(&mut bytes);
        assert_eq!(bytes[..8], 0xe220_a839_7b1d_cdafu64.to_le_bytes());
        assert_eq!(bytes[8..], 0x6e78_9e6a_a1b9_65f4u64.to_le_bytes()[..4]);
    }
}
