//! Stack-distance histograms and the miss-ratio curves derived from them.

/// A weighted histogram of stack distances plus cold misses.
///
/// Bucket `k` holds the weight of distances in `[k·w, (k+1)·w)` where `w` is the
/// bucket width (a power of two). An *exact* histogram ([`Histogram::new`]) keeps
/// `w = 1`; a *bounded* one ([`Histogram::bounded`]) doubles `w` (merging pairs of
/// buckets) whenever a distance would need more than `max_buckets` buckets, so
/// its memory is bounded while its resolution degrades gracefully. Within a
/// bucket, weight is assumed uniformly spread when evaluating a cache size that
/// falls inside it (exact when `w = 1`).
///
/// Weights are `f64` so that SHARDS can rescale them; counts stay exact up to 2^53.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    shift: u32,
    counts: Vec<f64>,
    max_buckets: usize,
    cold: f64,
    total: f64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl Histogram {
    /// An exact histogram (bucket width 1, unbounded length).
    pub fn new() -> Self {
        Histogram {
            shift: 0,
            counts: Vec::new(),
            max_buckets: usize::MAX,
            cold: 0.0,
            total: 0.0,
        }
    }

    /// A histogram of at most `max_buckets` buckets. Caller guarantees `max_buckets >= 2`.
    pub fn bounded(max_buckets: usize) -> Self {
        assert!(max_buckets >= 2, "need at least 2 buckets");
        Histogram {
            max_buckets,
            ..Self::new()
        }
    }

    /// Bucket width in distance units.
    pub fn bucket_width(&self) -> u64 {
        1 << self.shift
    }

    /// Number of buckets in use.
    pub fn buckets(&self) -> usize {
        self.counts.len()
    }

    /// Total recorded weight (hits at any distance plus cold misses).
    pub fn total(&self) -> f64 {
        self.total
    }

    /// Recorded cold-miss weight.
    pub fn cold(&self) -> f64 {
        self.cold
    }

    /// Records one access with distance `d` (`None` = cold miss).
    #[inline]
    pub fn record(&mut self, d: Option<u64>) {
        self.record_weighted(d, 1.0);
    }

    /// Records weight `w` at distance `d` (`None` = cold miss). `w` MUST be finite.
    #[inline]
    pub fn record_weighted(&mut self, d: Option<u64>, w: f64) {
        debug_assert!(w.is_finite());
        self.total += w;
        let Some(d) = d else {
            self.cold += w;
            return;
        };
        let mut b = d >> self.shift;
        while b >= self.max_buckets as u64 {
            self.coarsen();
            b = d >> self.shift;
        }
        let b = b as usize;
        if b >= self.counts.len() {
            self.counts.resize(b + 1, 0.0);
        }
        self.counts[b] += w;
    }

    /// Adds weight `w` (which may be negative) to the first bucket (distance 0) and
    /// to the total: the SHARDS sample-count adjustment.
    pub fn adjust_first(&mut self, w: f64) {
        debug_assert!(w.is_finite());
        if self.counts.is_empty() {
            self.counts.push(0.0);
        }
        self.counts[0] += w;
        self.total += w;
    }

    /// Multiplies every weight by `f` (`f` MUST be finite and `>= 0`).
    pub fn scale(&mut self, f: f64) {
        assert!(f.is_finite() && f >= 0.0, "bad scale factor {f}");
        for c in &mut self.counts {
            *c *= f;
        }
        self.cold *= f;
        self.total *= f;
    }

    fn coarsen(&mut self) {
        let n = self.counts.len().div_ceil(2);
        for i in 0..n {
            let hi = self.counts.get(2 * i + 1).copied().unwrap_or(0.0);
            self.counts[i] = self.counts[2 * i] + hi;
        }
        self.counts.truncate(n);
        self.shift += 1;
        assert!(self.shift < 64, "histogram width overflow");
    }

    /// Smallest cache size at which every non-cold access hits
    /// (`buckets × width`; 0 if no hit was recorded).
    pub fn max_size(&self) -> u64 {
        (self.counts.len() as u64) << self.shift
    }

    /// Weight of accesses with distance `< size` (hits in an LRU cache of `size` blocks).
    pub fn hits(&self, size: u64) -> f64 {
        let w = self.bucket_width();
        let full = ((size >> self.shift) as usize).min(self.counts.len());
        let mut h: f64 = self.counts[..full].iter().sum();
        if full < self.counts.len() {
            let part = size & (w - 1);
            h += self.counts[full] * part as f64 / w as f64;
        }
        h
    }

    /// Hit ratio of an LRU cache of `size` blocks, clamped to `[0, 1]`
    /// (0 when nothing was recorded).
    pub fn hit_ratio(&self, size: u64) -> f64 {
        if self.total <= 0.0 {
            return 0.0;
        }
        (self.hits(size) / self.total).clamp(0.0, 1.0)
    }

    /// `1 - hit_ratio(size)`.
    pub fn miss_ratio(&self, size: u64) -> f64 {
        1.0 - self.hit_ratio(size)
    }

    /// Miss-ratio curve at the given sizes (any order; output follows input order).
    pub fn mrc_at(&self, sizes: &[u64]) -> Mrc {
        Mrc {
            points: sizes.iter().map(|&s| (s, self.miss_ratio(s))).collect(),
        }
    }

    /// Miss-ratio curve at every bucket boundary `0, w, 2w, …, max_size()`
    /// (every size up to the number of distinct keys for an exact histogram).
    pub fn mrc(&self) -> Mrc {
        let mut points = Vec::with_capacity(self.counts.len() + 1);
        let mut h = 0.0;
        let ratio = |h: f64| {
            if self.total <= 0.0 {
                1.0
            } else {
                1.0 - (h / self.total).clamp(0.0, 1.0)
            }
        };
        points.push((0, ratio(0.0)));
        for (k, c) in self.counts.iter().enumerate() {
            h += c;
            points.push((((k + 1) as u64) << self.shift, ratio(h)));
        }
        Mrc { points }
    }

    /// Bytes of heap memory held.
    pub fn mem_bytes(&self) -> usize {
        self.counts.capacity() * std::mem::size_of::<f64>()
    }
}

/// A miss-ratio curve: `(cache size in blocks, miss ratio)` points with sizes
/// strictly increasing (as produced by [`Histogram::mrc`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Mrc {
    /// `(size, miss_ratio)` points.
    pub points: Vec<(u64, f64)>,
}

impl Mrc {
    /// Miss ratio at `size`, linearly interpolated between points; clamps to the
    /// first/last point outside the covered range. Caller guarantees points are
    /// sorted by size and non-empty.
    pub fn miss_ratio(&self, size: u64) -> f64 {
        assert!(!self.points.is_empty(), "empty curve");
        let i = self.points.partition_point(|&(s, _)| s <= size);
        if i == 0 {
            return self.points[0].1;
        }
        let (s0, m0) = self.points[i - 1];
        if s0 == size || i == self.points.len() {
            return m0;
        }
        let (s1, m1) = self.points[i];
        m0 + (m1 - m0) * (size - s0) as f64 / (s1 - s0) as f64
    }

    /// Mean absolute error of `other` against `self`, evaluated at each size of
    /// `sizes` (`other` is interpolated with [`Mrc::miss_ratio`]).
    pub fn mae(&self, other: &Mrc, sizes: &[u64]) -> f64 {
        assert!(!sizes.is_empty());
        sizes
            .iter()
            .map(|&s| (self.miss_ratio(s) - other.miss_ratio(s)).abs())
            .sum::<f64>()
            / sizes.len() as f64
    }

    /// The curve as `(size, hit_ratio)` pairs in `f64`, ready for Kneedle.
    pub fn hit_points(&self) -> Vec<(f64, f64)> {
        self.points
            .iter()
            .map(|&(s, m)| (s as f64, 1.0 - m))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_hit_ratios() {
        let mut h = Histogram::new();
        for d in [None, None, Some(0), Some(1), Some(1), Some(3)] {
            h.record(d);
        }
        assert_eq!(h.hits(0), 0.0);
        assert_eq!(h.hits(1), 1.0);
        assert_eq!(h.hits(2), 3.0);
        assert_eq!(h.hits(4), 4.0);
        assert_eq!(h.hits(100), 4.0);
        assert!((h.hit_ratio(2) - 0.5).abs() < 1e-12);
        let mrc = h.mrc();
        assert_eq!(mrc.points.len(), 5);
        assert_eq!(mrc.points[4].0, 4);
        assert!((mrc.points[4].1 - 2.0 / 6.0).abs() < 1e-12);
        assert!((mrc.miss_ratio(2) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn bounded_histogram_coarsens_and_keeps_totals() {
        let mut h = Histogram::bounded(4);
        for d in 0..64u64 {
            h.record(Some(d));
        }
        assert!(h.buckets() <= 4);
        assert_eq!(h.bucket_width(), 16);
        assert_eq!(h.total(), 64.0);
        // Uniform distances: interpolation is exact at every size.
        for s in 0..=64 {
            assert!(
                (h.hits(s) - s as f64).abs() < 1e-9,
                "size {s}: {}",
                h.hits(s)
            );
        }
    }

    #[test]
    fn adjustment_and_scale() {
        let mut h = Histogram::new();
        h.record(Some(5));
        h.record(None);
        h.adjust_first(2.0);
        assert_eq!(h.total(), 4.0);
        assert_eq!(h.hits(1), 2.0);
        h.scale(0.5);
        assert_eq!(h.total(), 2.0);
        assert_eq!(h.cold(), 0.5);
        h.adjust_first(-10.0);
        assert_eq!(h.hit_ratio(1), 0.0, "negative totals clamp");
    }
}
