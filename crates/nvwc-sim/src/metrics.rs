//! Run metrics: latency histograms, contiguous-run histogram, interval
//! snapshots and the final [`RunResult`].
//!
//! Units: the engine counts hits, misses and overwrites per *block piece*
//! (one piece per cache block a request touches); requests, latencies and
//! throughput are per *client request* (a trace record). Times in the result
//! are microseconds of virtual time unless the name says otherwise.

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latency histogram bounds: 1 ns .. 1 hour, 3 significant digits.
const LAT_MAX_NS: u64 = 3_600_000_000_000;

/// `total / count`: a mean, or a ratio, that is 0 when `count` is 0.
pub(crate) fn per(total: f64, count: u64) -> f64 {
    if count == 0 {
        0.0
    } else {
        total / count as f64
    }
}

/// A latency histogram in nanoseconds.
#[derive(Clone, Debug)]
pub struct Latency(Histogram<u64>);

impl Default for Latency {
    fn default() -> Self {
        Latency(Histogram::new_with_bounds(1, LAT_MAX_NS, 3).expect("valid histogram bounds"))
    }
}

impl Latency {
    /// Records one latency (clamped into the histogram's range).
    pub fn record(&mut self, ns: u64) {
        self.0.saturating_record(ns.max(1));
    }
    /// Number of samples.
    pub fn len(&self) -> u64 {
        self.0.len()
    }
    /// No samples.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// Quantile `q` in `[0, 1]`, in microseconds (0 when empty).
    pub fn quantile_us(&self, q: f64) -> f64 {
        if self.0.is_empty() {
            0.0
        } else {
            self.0.value_at_quantile(q) as f64 / 1e3
        }
    }
    /// Mean in microseconds (0 when empty).
    pub fn mean_us(&self) -> f64 {
        if self.0.is_empty() {
            0.0
        } else {
            self.0.mean() / 1e3
        }
    }
    /// Maximum in microseconds (0 when empty).
    pub fn max_us(&self) -> f64 {
        self.0.max() as f64 / 1e3
    }
    /// Forget every sample.
    pub fn reset(&mut self) {
        self.0.reset();
    }
    /// Summary for JSON.
    pub fn summary(&self) -> LatencySummary {
        LatencySummary {
            count: self.len(),
            mean_us: self.mean_us(),
            p50_us: self.quantile_us(0.5),
            p90_us: self.quantile_us(0.9),
            p99_us: self.quantile_us(0.99),
            p999_us: self.quantile_us(0.999),
            max_us: self.max_us(),
        }
    }
}

/// Latency percentiles of one class of requests.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct LatencySummary {
    /// Samples.
    pub count: u64,
    /// Mean (µs).
    pub mean_us: f64,
    /// Median (µs).
    pub p50_us: f64,
    /// 90th percentile (µs).
    pub p90_us: f64,
    /// 99th percentile (µs).
    pub p99_us: f64,
    /// 99.9th percentile (µs).
    pub p999_us: f64,
    /// Maximum (µs).
    pub max_us: f64,
}

/// Histogram of contiguous backing-write run lengths, in cache blocks, in
/// power-of-two buckets: bucket `k` counts runs of `2^(k-1) < n <= 2^k`
/// blocks (bucket 0: exactly 1 block).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct RunHistogram {
    /// Counts per bucket.
    pub buckets: Vec<u64>,
    /// Runs recorded.
    pub runs: u64,
    /// Blocks in all runs.
    pub blocks: u64,
}

impl RunHistogram {
    /// Records a run of `blocks` (>= 1) blocks.
    pub fn record(&mut self, blocks: u64) {
        let blocks = blocks.max(1);
        let k = (64 - (blocks - 1).leading_zeros()) as usize;
        if self.buckets.len() <= k {
            self.buckets.resize(k + 1, 0);
        }
        self.buckets[k] += 1;
        self.runs += 1;
        self.blocks += blocks;
    }
    /// Upper bound (blocks) of bucket `k`.
    pub fn bucket_max(k: usize) -> u64 {
        1u64 << k
    }
    /// Mean run length in blocks (0 when empty).
    pub fn mean(&self) -> f64 {
        per(self.blocks as f64, self.runs)
    }
    /// `"1:n, 2:n, <=4:n, ..."` (empty buckets omitted).
    pub fn describe(&self) -> String {
        self.buckets
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(k, c)| format!("<={}:{c}", Self::bucket_max(k)))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Metrics of one interval of virtual time `[start_us, end_us)`.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct IntervalRecord {
    /// Interval start (µs).
    pub start_us: f64,
    /// Interval end (µs).
    pub end_us: f64,
    /// Requests completed in the interval.
    pub requests: u64,
    /// Reads completed.
    pub reads: u64,
    /// Writes completed.
    pub writes: u64,
    /// Read hits (block pieces).
    pub read_hits: u64,
    /// Write hits (block pieces).
    pub write_hits: u64,
    /// Overwrites absorbed.
    pub overwrites: u64,
    /// Backing block writes issued by the engine.
    pub backing_writes: u64,
    /// Bytes of those writes.
    pub backing_write_bytes: u64,
    /// Contiguous runs closed in the interval.
    pub backing_write_runs: u64,
    /// Stalled write pieces.
    pub stalled_writes: u64,
    /// Stall time accumulated (µs).
    pub stall_time_us: f64,
    /// Write requests queued on arrival (see [`RunResult::queued_writes`]).
    pub queued_writes: u64,
    /// Dirty blocks at the end of the interval.
    pub dirty_blocks: u64,
    /// Completed requests per second.
    pub iops: f64,
    /// Completed read+write bytes per second / 10^6.
    pub mbps: f64,
    /// Median latency of requests completed in the interval (µs).
    pub latency_us_p50: f64,
    /// 99th percentile (µs).
    pub latency_us_p99: f64,
}

/// The result of one simulated run. Serialised as one JSON object.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RunResult {
    /// Trace file name.
    pub trace: String,
    /// Write policy name.
    pub write_policy: String,
    /// Replacement policy (text form).
    pub replacement: String,
    /// Fetch mode for partial writes to uncached blocks (`blocking` or a patch mode).
    pub fetch: String,
    /// Patched blocks made, brought up to date by a fetch, partial writes
    /// that fell back to blocking at the patch-memory limit, reads served from patches.
    pub patches_created: u64,
    pub patch_fetches: u64,
    pub patch_fallbacks: u64,
    pub patch_reads: u64,
    /// Cache size in bytes (data slots × block size).
    pub cache_size_bytes: u64,
    /// Cache block size in bytes.
    pub block_size: u64,
    /// Cache data slots.
    pub cache_blocks: u64,
    /// Backing device model.
    pub backing: String,
    /// Cache device model.
    pub cache_device: String,
    /// Backing store size the engine saw.
    pub backing_size_bytes: u64,
    /// `closed` or `open`.
    pub mode: String,
    /// Outstanding requests per client (closed loop).
    pub qd: u32,
    /// Open-loop speed-up factor.
    pub speedup: f64,
    /// Label of the run (free text from the caller, e.g. a sweep parameter).
    pub label: String,
    /// Client requests completed (trace records replayed).
    pub requests: u64,
    /// Reads completed.
    pub reads: u64,
    /// Writes completed.
    pub writes: u64,
    /// Flushes completed.
    pub flushes: u64,
    /// Trims completed.
    pub trims: u64,
    /// Requests that failed (should be 0).
    pub errors: u64,
    /// Bytes read by clients.
    pub client_read_bytes: u64,
    /// Bytes written by clients.
    pub client_write_bytes: u64,
    /// Read block pieces served from the cache.
    pub read_hits: u64,
    /// Read block pieces that missed.
    pub read_misses: u64,
    /// Write block pieces to a cached block.
    pub write_hits: u64,
    /// Write block pieces to an uncached block (each allocates a block).
    pub write_misses: u64,
    /// Writes that replaced a dirty version (one destage saved).
    pub overwrites: u64,
    /// Backing block writes issued by the engine (destages and write-through).
    pub backing_writes: u64,
    /// Bytes of those writes.
    pub backing_write_bytes: u64,
    /// Contiguous runs: maximal sequences of backing device writes dispatched
    /// back to back, each starting where the previous one ended.
    pub backing_write_runs: u64,
    /// Backing device write commands (after merging in the driver's queue).
    pub backing_write_ops: u64,
    /// Histogram of run lengths in blocks.
    pub run_length_histogram: RunHistogram,
    /// `backing_write_bytes / client_write_bytes` (0 without client writes).
    pub write_amplification: f64,
    /// Backing reads (misses, fetch-before-write).
    pub backing_reads: u64,
    /// Bytes read from the backing store.
    pub backing_read_bytes: u64,
    /// Backing flushes.
    pub backing_flushes: u64,
    /// Atomic groups ended on the backing store (journaled checkpoints).
    pub backing_groups: u64,
    /// Costed group ends (`--group-end redo`, the default, or
    /// `write-flush`): each writes its log area and flushes (driver docs).
    pub group_commit_writes: u64,
    /// Bytes the costed group ends wrote to their log area (the redo log's
    /// encoding of each group and its clearing write, or the commit records).
    pub group_log_bytes: u64,
    /// Partial-write fetches from the backing store.
    pub fetches: u64,
    /// Clean blocks evicted.
    pub evictions: u64,
    /// Write pieces that waited for cache space: in the engine's admission
    /// queue (for slot reservations) or for a free slot.
    pub stalled_writes: u64,
    /// Total time those pieces waited (µs, summed over pieces).
    pub stall_time_us: f64,
    /// Write requests that caused no device command when they arrived: they
    /// queued in the engine, almost always for cache space, rarely behind
    /// another write to the same block. The driver's view of stalls.
    pub queued_writes: u64,
    /// Cache device commands (all kinds).
    pub cache_device_ops: u64,
    /// Virtual time from the first request to the last reply (µs).
    pub sim_time_us: f64,
    /// Completed requests per second of virtual time.
    pub throughput_iops: f64,
    /// Completed read+write bytes per second of virtual time / 10^6.
    pub throughput_mbps: f64,
    /// All requests: median latency (µs).
    pub latency_us_p50: f64,
    /// All requests: 99th percentile (µs).
    pub latency_us_p99: f64,
    /// All requests: mean (µs).
    pub latency_us_mean: f64,
    /// Every request.
    pub latency_all: LatencySummary,
    /// Reads.
    pub latency_read: LatencySummary,
    /// Writes.
    pub latency_write: LatencySummary,
    /// Flushes.
    pub latency_flush: LatencySummary,
    /// Dirty blocks at the end (versions not on the backing store).
    pub dirty_blocks_end: u64,
    /// Staleness at the end: dirty bytes not on the backing store.
    pub dirty_bytes_end: u64,
    /// Peak dirty blocks during the run.
    pub dirty_blocks_peak: u64,
    /// Time-averaged dirty blocks.
    pub dirty_blocks_mean: f64,
    /// Journaled: transactions closed but not yet checkpointed at the end.
    pub uncheckpointed_txns: Option<u64>,
    /// Journaled: transactions committed on the cache but not checkpointed.
    pub committed_not_checkpointed_txns: Option<u64>,
    /// Policy-specific counters at the end.
    pub policy_counters: std::collections::BTreeMap<String, u64>,
    /// Backing device: mean queue depth.
    pub backing_mean_queue_depth: f64,
    /// Backing device: fraction of time busy.
    pub backing_utilisation: f64,
    /// Wall-clock seconds the run took.
    pub wall_seconds: f64,
    /// Simulated requests per wall-clock second.
    pub replay_rate: f64,
    /// Interval snapshots (empty without `--interval`).
    pub intervals: Vec<IntervalRecord>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_histogram_buckets() {
        let mut h = RunHistogram::default();
        for n in [1, 2, 3, 4, 5, 8, 9, 64] {
            h.record(n);
        }
        // 1 -> b0, 2 -> b1, 3,4 -> b2, 5,8 -> b3, 9 -> b4, 64 -> b6
        assert_eq!(h.buckets, vec![1, 1, 2, 2, 1, 0, 1]);
        assert_eq!(h.runs, 8);
        assert_eq!(h.blocks, 96);
        assert!((h.mean() - 12.0).abs() < 1e-12);
        assert_eq!(h.describe(), "<=1:1 <=2:1 <=4:2 <=8:2 <=16:1 <=64:1");
    }

    #[test]
    fn latency_quantiles() {
        let mut l = Latency::default();
        for us in 1..=100u64 {
            l.record(us * 1000);
        }
        assert_eq!(l.len(), 100);
        let p50 = l.quantile_us(0.5);
        assert!((p50 - 50.0).abs() < 0.1, "{p50}");
        let p99 = l.quantile_us(0.99);
        assert!((p99 - 99.0).abs() < 0.1, "{p99}");
        assert!((l.mean_us() - 50.5).abs() < 0.1);
    }
}
