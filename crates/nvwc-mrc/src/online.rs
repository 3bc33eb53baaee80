//! Online knee tracking for the stack-model replacement policy.
//!
//! [`OnlineKnee`] is fed accesses one by one (the write stream, for the
//! policy). Every `period` accesses it rebuilds the hit-ratio curve over cache
//! sizes `0..=max_size` and runs Kneedle on it.
//!
//! **Memory choice:** the curve comes from fixed-size SHARDS
//! ([`ShardsFixedSize`]) with at most `sample_keys` keys and a bounded
//! histogram, so memory is bounded whatever the footprint of the stream. While
//! the stream has touched at most `sample_keys` distinct keys the sampling rate
//! is 1 and the curve is exact Mattson.

use crate::histogram::Histogram;
use crate::kneedle::{kneedle, most_prominent, CurveShape, Knee, DEFAULT_SENSITIVITY};
use crate::shards::ShardsFixedSize;

/// Which knee to report when Kneedle finds several.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum KneeSelect {
    /// The smallest cache size with a knee.
    First,
    /// The largest cache size with a knee.
    Last,
    /// The knee with the largest normalised difference value (default).
    MostProminent,
}

/// Configuration of [`OnlineKnee`].
#[derive(Clone, Debug, PartialEq)]
pub struct OnlineKneeConfig {
    /// Recompute the curve and knee every `period` accesses (`>= 1`).
    pub period: u64,
    /// Fixed-size SHARDS bound on sampled keys (`>= 1`).
    pub sample_keys: usize,
    /// Largest cache size (blocks) on the curve (`>= 2`); for a cache policy,
    /// its capacity.
    pub max_size: u64,
    /// Number of curve points handed to Kneedle (`>= 3`); sizes are spread
    /// evenly over `0..=max_size` (every size if `max_size < points`).
    pub points: usize,
    /// Kneedle sensitivity `S`.
    pub sensitivity: f64,
    /// Knee selection rule.
    pub select: KneeSelect,
}

impl OnlineKneeConfig {
    /// Defaults for a cache of `max_size` blocks: period 65 536, 16 384 sampled
    /// keys, 200 points, S = 1, most prominent knee.
    pub fn new(max_size: u64) -> Self {
        OnlineKneeConfig {
            period: 65_536,
            sample_keys: 16_384,
            max_size,
            points: 200,
            sensitivity: DEFAULT_SENSITIVITY,
            select: KneeSelect::MostProminent,
        }
    }
}

/// Periodically recomputed knee of the hit-ratio curve of an access stream.
#[derive(Clone, Debug)]
pub struct OnlineKnee {
    cfg: OnlineKneeConfig,
    shards: ShardsFixedSize,
    since: u64,
    knee: Option<u64>,
    recomputes: u64,
}

impl OnlineKnee {
    /// A tracker with configuration `cfg` (validated with assertions).
    pub fn new(cfg: OnlineKneeConfig) -> Self {
        assert!(cfg.period >= 1, "period must be >= 1");
        assert!(cfg.max_size >= 2, "max_size must be >= 2");
        assert!(cfg.points >= 3, "points must be >= 3");
        assert!(
            cfg.sensitivity >= 0.0 && cfg.sensitivity.is_finite(),
            "bad sensitivity"
        );
        let shards = ShardsFixedSize::new(cfg.sample_keys).with_max_buckets(4096);
        OnlineKnee {
            cfg,
            shards,
            since: 0,
            knee: None,
            recomputes: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &OnlineKneeConfig {
        &self.cfg
    }

    /// Feeds one access; recomputes the knee every `period` accesses.
    #[inline]
    pub fn access(&mut self, key: u64) {
        self.shards.access(key);
        self.since += 1;
        if self.since >= self.cfg.period {
            self.recompute();
        }
    }

    /// The knee (cache size in blocks) found at the last recomputation, if any.
    pub fn knee_blocks(&self) -> Option<u64> {
        self.knee
    }

    /// How many times the knee was recomputed.
    pub fn recomputations(&self) -> u64 {
        self.recomputes
    }

    /// Rebuilds the curve and knee now (also resets the period counter).
    pub fn recompute(&mut self) -> Option<u64> {
        self.since = 0;
        self.recomputes += 1;
        let hist = self.shards.histogram();
        let curve = self.curve_from(&hist);
        let pts: Vec<(f64, f64)> = curve.iter().map(|&(s, h)| (s as f64, h)).collect();
        let knees = kneedle(&pts, CurveShape::ConcaveIncreasing, self.cfg.sensitivity);
        self.knee = select(&knees, self.cfg.select).map(|k| k.x as u64);
        self.knee
    }

    /// The current hit-ratio curve `(size, hit_ratio)` at the configured sizes.
    pub fn hit_curve(&self) -> Vec<(u64, f64)> {
        self.curve_from(&self.shards.histogram())
    }

    fn curve_from(&self, hist: &Histogram) -> Vec<(u64, f64)> {
        let m = self.cfg.max_size;
        let n = self.cfg.points as u64;
        let mut out: Vec<(u64, f64)> = Vec::with_capacity(self.cfg.points);
        for i in 0..n {
            let s = if m < n {
                i.min(m)
            } else {
                (i as u128 * m as u128 / (n - 1) as u128) as u64
            };
            if out.last().is_some_and(|&(p, _)| p == s) {
                continue;
            }
            out.push((s, hist.hit_ratio(s)));
        }
        out
    }

    /// Bytes of heap memory held.
    pub fn mem_bytes(&self) -> usize {
        self.shards.mem_bytes()
    }
}

fn select(knees: &[Knee], rule: KneeSelect) -> Option<Knee> {
    match rule {
        KneeSelect::First => knees.first().copied(),
        KneeSelect::Last => knees.last().copied(),
        KneeSelect::MostProminent => most_prominent(knees),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream whose LRU hit-ratio curve has a knee at `hot` blocks: 90% of
    /// accesses cycle over `hot` keys, 10% go to a large cold set.
    fn feed(k: &mut OnlineKnee, hot: u64, n: u64) {
        let mut x = 12345u64;
        for i in 0..n {
            x = crate::hash::mix64(x);
            if x.is_multiple_of(10) {
                k.access(1_000_000 + (x >> 8) % 50_000);
            } else {
                k.access(i % hot);
            }
        }
    }

    #[test]
    fn knee_found_near_hot_set_size() {
        let mut cfg = OnlineKneeConfig::new(1000);
        cfg.period = 10_000;
        cfg.sample_keys = 4096;
        let mut k = OnlineKnee::new(cfg);
        assert_eq!(k.knee_blocks(), None);
        feed(&mut k, 300, 60_000);
        assert_eq!(k.recomputations(), 6);
        let knee = k.knee_blocks().expect("a knee");
        // Interleaved cold accesses stretch hot distances to ~300/0.9 = 333
        // (binomial spread, std ~6); the curve saturates at the tail of that
        // spread, so the knee sits a little above 333.
        assert!((320..=400).contains(&knee), "knee {knee}");
        assert!(k.shards.sampled_keys() <= 4096);
    }

    #[test]
    fn curve_sizes_cover_range_without_duplicates() {
        let mut cfg = OnlineKneeConfig::new(10);
        cfg.points = 50;
        let k = OnlineKnee::new(cfg);
        let c = k.hit_curve();
        assert_eq!(
            c.iter().map(|p| p.0).collect::<Vec<_>>(),
            (0..=10).collect::<Vec<_>>()
        );
        let mut cfg = OnlineKneeConfig::new(1000);
        cfg.points = 11;
        let c = OnlineKnee::new(cfg).hit_curve();
        assert_eq!(
            c.iter().map(|p| p.0).collect::<Vec<_>>(),
            (0..=10).map(|i| i * 100).collect::<Vec<_>>()
        );
    }
}
