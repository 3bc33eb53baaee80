//! Key streams shared by the integration tests and the benchmark (which
//! includes this file by path).

use nvwc_mrc::mix64;

/// A Zipf-like (log-uniform popularity, ~Zipf α=1) stream of `n` keys over
/// `universe` keys from `seed`, key identities scattered by a hash of the
/// rank XOR `salt`.
pub fn zipfish(n: usize, universe: u64, seed: u64, salt: u64) -> Vec<u64> {
    let mut x = seed;
    let ln = (universe as f64).ln();
    (0..n)
        .map(|_| {
            x = mix64(x);
            let u = (x >> 11) as f64 / (1u64 << 53) as f64;
            let rank = ((u * ln).exp() as u64).min(universe) - 1;
            mix64(rank ^ salt)
        })
        .collect()
}
