//! SHARDS: spatially hashed sampling for approximate miss-ratio curves
//! (Waldspurger, Park, Garthwaite, Ahmad: "Efficient MRC Construction with
//! SHARDS", FAST'15).
//!
//! A key is sampled iff `mix64(key) <= threshold`; the sampling rate is
//! `R = (threshold + 1) / 2^64`. Sampled keys go through an exact
//! [`StackDistance`]; each sampled distance `d` estimates a full-trace distance
//! `d / R`. Because the hash is a bijection (no ties), "hash mod P < T" of the
//! paper becomes a plain comparison against a 64-bit threshold.
//!
//! Both variants apply the paper's `SHARDS_adj` correction when building a
//! curve: the difference between the expected number of sampled references
//! (`N · R`) and the actual one is added to the first histogram bucket.

use std::collections::BinaryHeap;

use crate::hash::mix64;
use crate::histogram::{Histogram, Mrc};
use crate::mattson::StackDistance;

/// Default histogram bound for SHARDS (buckets).
pub const DEFAULT_MAX_BUCKETS: usize = 1 << 16;

const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;

/// Rate of an inclusive threshold.
#[inline]
fn rate_of(threshold: u64) -> f64 {
    (threshold as f64 + 1.0) / TWO_POW_64
}

/// Inclusive threshold for a rate in `(0, 1]`.
fn threshold_of(rate: f64) -> u64 {
    assert!(
        rate > 0.0 && rate <= 1.0,
        "sampling rate must be in (0, 1], got {rate}"
    );
    let t = rate * TWO_POW_64;
    if t >= TWO_POW_64 {
        u64::MAX
    } else {
        (t as u64).saturating_sub(1)
    }
}

/// SHARDS over sample set `S`: [`ShardsFixedRate`] or [`ShardsFixedSize`].
/// The sampling, the scaled histogram and the curve are the same for both;
/// only how the threshold is set differs.
#[derive(Clone, Debug)]
pub struct Shards<S> {
    threshold: u64,
    refs: u64,
    sd: StackDistance,
    hist: Histogram,
    adjust: bool,
    set: S,
}

/// Fixed-rate SHARDS: the threshold never moves.
pub type ShardsFixedRate = Shards<FixedRate>;

/// Fixed-size SHARDS: at most `s_max` sampled keys, whatever the trace.
///
/// Starts at rate 1 (exact). When a new sampled key would make the sample set
/// exceed `s_max`, the key with the largest hash is evicted and the threshold
/// drops to just below that hash; the histogram is rescaled by `R_new / R_old`
/// so all of it reflects the current rate.
pub type ShardsFixedSize = Shards<FixedSize>;

/// The sample set of [`ShardsFixedRate`]: every key under a fixed threshold.
#[derive(Clone, Debug)]
pub struct FixedRate;

/// The sample set of [`ShardsFixedSize`]: at most `s_max` keys.
#[derive(Clone, Debug)]
pub struct FixedSize {
    s_max: usize,
    /// Sampled keys by hash (max-heap); exactly the keys tracked by `sd`.
    heap: BinaryHeap<(u64, u64)>,
}

impl<S> Shards<S> {
    fn with_set(threshold: u64, set: S) -> Self {
        Shards {
            threshold,
            refs: 0,
            sd: StackDistance::new(),
            hist: Histogram::bounded(DEFAULT_MAX_BUCKETS),
            adjust: true,
            set,
        }
    }

    /// Replaces the histogram bound (must be called before any access).
    pub fn with_max_buckets(mut self, max_buckets: usize) -> Self {
        assert_eq!(self.refs, 0, "with_max_buckets after accesses");
        self.hist = Histogram::bounded(max_buckets);
        self
    }

    /// Enables or disables the `SHARDS_adj` correction (default: on).
    pub fn with_adjustment(mut self, on: bool) -> Self {
        self.adjust = on;
        self
    }

    /// The current sampling rate.
    pub fn rate(&self) -> f64 {
        rate_of(self.threshold)
    }

    /// References seen (sampled or not).
    pub fn references(&self) -> u64 {
        self.refs
    }

    /// Distinct sampled keys tracked (for fixed size, always `<= s_max`).
    pub fn sampled_keys(&self) -> usize {
        self.sd.distinct()
    }

    /// Records a sampled key's scaled distance; returns whether it is new.
    fn record(&mut self, key: u64) -> bool {
        let d = self.sd.access(key);
        let scale = 1.0 / self.rate();
        self.hist.record(d.map(|d| (d as f64 * scale) as u64));
        d.is_none()
    }

    /// The (adjusted) histogram of scaled distances.
    pub fn histogram(&self) -> Histogram {
        let mut h = self.hist.clone();
        if self.adjust {
            h.adjust_first(self.refs as f64 * self.rate() - h.total());
        }
        h
    }

    /// The estimated miss-ratio curve at every histogram bucket boundary.
    pub fn mrc(&self) -> Mrc {
        self.histogram().mrc()
    }
}

impl Shards<FixedRate> {
    /// Samples keys at rate `rate` (caller guarantees `0 < rate <= 1`), with a
    /// histogram of at most [`DEFAULT_MAX_BUCKETS`] buckets and `SHARDS_adj` on.
    pub fn new(rate: f64) -> Self {
        Self::with_set(threshold_of(rate), FixedRate)
    }

    /// Feeds one reference. The unsampled path is one hash and one compare.
    #[inline(always)]
    pub fn access(&mut self, key: u64) {
        self.refs += 1;
        if mix64(key) <= self.threshold {
            self.sample(key);
        }
    }

    #[inline(never)]
    fn sample(&mut self, key: u64) {
        self.record(key);
    }

    /// Bytes of heap memory held.
    pub fn mem_bytes(&self) -> usize {
        self.sd.mem_bytes() + self.hist.mem_bytes()
    }
}

impl Shards<FixedSize> {
    /// Keeps at most `s_max` sampled keys (caller guarantees `s_max >= 1`).
    pub fn new(s_max: usize) -> Self {
        assert!(s_max >= 1, "s_max must be at least 1");
        let heap = BinaryHeap::with_capacity(s_max + 1);
        Self::with_set(u64::MAX, FixedSize { s_max, heap })
    }

    /// Feeds one reference.
    #[inline(always)]
    pub fn access(&mut self, key: u64) {
        self.refs += 1;
        let h = mix64(key);
        if h <= self.threshold {
            self.sample(key, h);
        }
    }

    #[inline(never)]
    fn sample(&mut self, key: u64, h: u64) {
        if self.record(key) {
            self.set.heap.push((h, key));
            if self.set.heap.len() > self.set.s_max {
                self.lower_threshold();
            }
        }
    }

    fn lower_threshold(&mut self) {
        let old = self.rate();
        let (h, k) = self.set.heap.pop().expect("heap is over s_max");
        let removed = self.sd.remove(k);
        assert!(removed, "sampled key missing from the stack");
        // Keys hash to distinct values (mix64 is bijective): sample iff hash < h.
        self.threshold = h - 1;
        self.hist.scale(self.rate() / old);
        debug_assert_eq!(self.set.heap.len(), self.sd.distinct());
    }

    /// Bytes of heap memory held.
    pub fn mem_bytes(&self) -> usize {
        self.sd.mem_bytes() + self.hist.mem_bytes() + self.set.heap.capacity() * 16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_one_is_exact() {
        let mut s = ShardsFixedRate::new(1.0);
        let mut sd = StackDistance::new();
        let mut h = Histogram::new();
        for i in 0..5_000u64 {
            let k = (i * 7919) % 613 + (i % 5);
            s.access(k);
            h.record(sd.access(k));
        }
        assert_eq!(s.rate(), 1.0);
        let a = s.mrc();
        for size in [0u64, 1, 10, 100, 600, 1000] {
            assert!(
                (a.miss_ratio(size) - h.miss_ratio(size)).abs() < 1e-9,
                "size {size}"
            );
        }
    }

    #[test]
    fn fixed_rate_samples_about_r() {
        let mut s = ShardsFixedRate::new(0.01);
        for k in 0..200_000u64 {
            s.access(k);
        }
        let frac = s.sampled_keys() as f64 / 200_000.0;
        assert!((frac - 0.01).abs() < 0.001, "sampled fraction {frac}");
    }

    #[test]
    fn fixed_size_bounds_samples_and_lowers_rate() {
        let mut s = ShardsFixedSize::new(100);
        for k in 0..100_000u64 {
            s.access(k % 20_000);
            assert!(s.sampled_keys() <= 100);
        }
        // About 100 of 20 000 keys survive: rate near 0.005.
        assert!((0.003..0.008).contains(&s.rate()), "rate {}", s.rate());
        // Every key repeats with distance 19 999 after the first pass: the
        // adjusted curve should have ~0.2 cold misses and jump around 20 000.
        let h = s.histogram();
        assert!(h.hit_ratio(15_000) < 0.2, "{}", h.hit_ratio(15_000));
        assert!(h.hit_ratio(25_000) > 0.6, "{}", h.hit_ratio(25_000));
    }
}
