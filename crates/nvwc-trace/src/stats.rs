//! Whole-trace summary statistics.

use crate::error::TraceError;
use crate::record::{Op, TraceRecord};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Block size used for unique-block counts and alignment checks.
pub const BLOCK: u64 = 4096;

/// One bucket of [`TraceStats::size_histogram`]: requests whose length `L`
/// satisfies `max_bytes / 2 < L <= max_bytes` (the first bucket,
/// `max_bytes == 512`, also holds everything smaller).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SizeBucket {
    /// Upper bound (inclusive) in bytes; a power of two ≥ 512.
    pub max_bytes: u64,
    /// Reads in the bucket.
    pub reads: u64,
    /// Writes in the bucket.
    pub writes: u64,
}

/// Summary of a trace. `Serialize` for JSON output; `Display` for people.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceStats {
    /// All records (reads + writes + flushes + trims).
    pub requests: u64,
    /// Read records.
    pub reads: u64,
    /// Write records.
    pub writes: u64,
    /// Flush records.
    pub flushes: u64,
    /// Trim records.
    pub trims: u64,
    /// Writes with FUA set.
    pub fua_writes: u64,
    /// Sum of read lengths (saturating).
    pub bytes_read: u64,
    /// Sum of write lengths (saturating).
    pub bytes_written: u64,
    /// Sum of trim lengths (saturating).
    pub bytes_trimmed: u64,
    /// Distinct (device, 4 KiB block) pairs touched by reads or writes.
    pub unique_blocks: u64,
    /// Distinct (device, 4 KiB block) pairs touched by writes.
    pub unique_blocks_written: u64,
    /// Writes whose offset or length is not a multiple of 4096.
    pub unaligned_writes: u64,
    /// `unaligned_writes / writes` (0 when there are no writes).
    pub unaligned_write_fraction: f64,
    /// `writes / (reads + writes)` (0 when there are neither).
    pub write_fraction: f64,
    /// Read/write sizes in power-of-two buckets, ascending, empty buckets
    /// omitted.
    pub size_histogram: Vec<SizeBucket>,
    /// Timestamp of the first record (ns).
    pub first_ts_ns: u64,
    /// Timestamp of the last record (ns).
    pub last_ts_ns: u64,
    /// `last_ts_ns - first_ts_ns`.
    pub duration_ns: u64,
    /// Distinct `dev` values, ascending.
    pub devices: Vec<u32>,
}

impl TraceStats {
    /// Number of distinct devices.
    pub fn device_count(&self) -> usize {
        self.devices.len()
    }
}

/// Exact set of touched blocks kept as disjoint, non-adjacent intervals per
/// device, so sequential runs and huge trims cost one entry, not one per
/// block.
#[derive(Debug, Default, Clone)]
struct BlockSet {
    /// (dev, first block) → one past the last block.
    runs: BTreeMap<(u32, u64), u64>,
    /// Blocks covered (u128: 2^32 devices × 2^52 blocks cannot overflow).
    count: u128,
}

impl BlockSet {
    fn insert(&mut self, dev: u32, mut start: u64, mut end: u64) {
        if start >= end {
            return;
        }
        if let Some((&(d, s), &e)) = self.runs.range(..=(dev, start)).next_back() {
            if d == dev && e >= start {
                if e >= end {
                    return;
                }
                self.runs.remove(&(d, s));
                self.count -= u128::from(e - s);
                start = s;
                end = end.max(e);
            }
        }
        while let Some((&(d, s), &e)) = self.runs.range((dev, start)..=(dev, end)).next() {
            debug_assert_eq!(d, dev);
            self.runs.remove(&(d, s));
            self.count -= u128::from(e - s);
            end = end.max(e);
        }
        self.runs.insert((dev, start), end);
        self.count += u128::from(end - start);
    }
}

/// Incremental statistics: feed records with [`StatsCollector::add`], then
/// call [`StatsCollector::finish`]. Memory grows with the number of
/// distinct block runs and devices, not with the number of records.
#[derive(Debug, Clone, Default)]
pub struct StatsCollector {
    s: Counts,
    blocks: BlockSet,
    written: BlockSet,
    hist: BTreeMap<u32, (u64, u64)>,
    devices: BTreeSet<u32>,
    first: Option<u64>,
    last: u64,
}

#[derive(Debug, Clone, Default)]
struct Counts {
    requests: u64,
    reads: u64,
    writes: u64,
    flushes: u64,
    trims: u64,
    fua_writes: u64,
    bytes_read: u64,
    bytes_written: u64,
    bytes_trimmed: u64,
    unaligned_writes: u64,
}

/// log2 of the histogram bucket bound for a length.
fn bucket(len: u64) -> u32 {
    if len <= 512 {
        9
    } else {
        64 - (len - 1).leading_zeros()
    }
}

impl StatsCollector {
    /// An empty collector.
    pub fn new() -> Self {
        Self::default()
    }

    /// Accounts one record.
    pub fn add(&mut self, r: &TraceRecord) {
        let s = &mut self.s;
        s.requests += 1;
        self.devices.insert(r.dev);
        self.first.get_or_insert(r.ts_ns);
        self.last = r.ts_ns;
        match r.op {
            Op::Flush => s.flushes += 1,
            Op::Trim => {
                s.trims += 1;
                s.bytes_trimmed = s.bytes_trimmed.saturating_add(r.len);
            }
            Op::Read | Op::Write => {
                let first = r.offset / BLOCK;
                let end = r.end().div_ceil(BLOCK);
                self.blocks.insert(r.dev, first, end);
                let h = self.hist.entry(bucket(r.len)).or_default();
                if r.op == Op::Read {
                    s.reads += 1;
                    s.bytes_read = s.bytes_read.saturating_add(r.len);
                    h.0 += 1;
                } else {
                    s.writes += 1;
                    s.bytes_written = s.bytes_written.saturating_add(r.len);
                    s.fua_writes += u64::from(r.fua);
                    s.unaligned_writes +=
                        u64::from(!r.offset.is_multiple_of(BLOCK) || !r.len.is_multiple_of(BLOCK));
                    h.1 += 1;
                    self.written.insert(r.dev, first, end);
                }
            }
        }
    }

    /// The statistics of everything added so far.
    pub fn finish(&self) -> TraceStats {
        let s = &self.s;
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        let first = self.first.unwrap_or(0);
        TraceStats {
            requests: s.requests,
            reads: s.reads,
            writes: s.writes,
            flushes: s.flushes,
            trims: s.trims,
            fua_writes: s.fua_writes,
            bytes_read: s.bytes_read,
            bytes_written: s.bytes_written,
            bytes_trimmed: s.bytes_trimmed,
            unique_blocks: u64::try_from(self.blocks.count).unwrap_or(u64::MAX),
            unique_blocks_written: u64::try_from(self.written.count).unwrap_or(u64::MAX),
            unaligned_writes: s.unaligned_writes,
            unaligned_write_fraction: ratio(s.unaligned_writes, s.writes),
            write_fraction: ratio(s.writes, s.reads + s.writes),
            size_histogram: self
                .hist
                .iter()
                .map(|(&k, &(reads, writes))| SizeBucket {
                    max_bytes: 1u64.checked_shl(k).unwrap_or(u64::MAX),
                    reads,
                    writes,
                })
                .collect(),
            first_ts_ns: first,
            last_ts_ns: self.last,
            duration_ns: self.last.saturating_sub(first),
            devices: self.devices.iter().copied().collect(),
        }
    }
}

/// Computes [`TraceStats`] over a whole reader (or any iterator of
/// records), stopping at — and returning — the first error.
pub fn stats<I>(records: I) -> Result<TraceStats, TraceError>
where
    I: IntoIterator<Item = Result<TraceRecord, TraceError>>,
{
    let mut c = StatsCollector::new();
    for r in records {
        c.add(&r?);
    }
    Ok(c.finish())
}

fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    nvwc_core::units::format_size_1dp(b, &UNITS, " ")
}

impl fmt::Display for TraceStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pct = |a: u64| {
            if self.requests == 0 {
                0.0
            } else {
                100.0 * a as f64 / self.requests as f64
            }
        };
        writeln!(f, "requests        {}", self.requests)?;
        writeln!(
            f,
            "  reads         {} ({:.1}%)",
            self.reads,
            pct(self.reads)
        )?;
        writeln!(
            f,
            "  writes        {} ({:.1}%; {:.1}% of data requests; {} FUA)",
            self.writes,
            pct(self.writes),
            100.0 * self.write_fraction,
            self.fua_writes
        )?;
        writeln!(f, "  flushes       {}", self.flushes)?;
        writeln!(f, "  trims         {}", self.trims)?;
        writeln!(f, "bytes read      {}", human_bytes(self.bytes_read))?;
        writeln!(f, "bytes written   {}", human_bytes(self.bytes_written))?;
        if self.trims > 0 {
            writeln!(f, "bytes trimmed   {}", human_bytes(self.bytes_trimmed))?;
        }
        writeln!(
            f,
            "unique 4K blocks {} ({}), written {} ({})",
            self.unique_blocks,
            human_bytes(self.unique_blocks.saturating_mul(BLOCK)),
            self.unique_blocks_written,
            human_bytes(self.unique_blocks_written.saturating_mul(BLOCK))
        )?;
        writeln!(
            f,
            "unaligned writes {} ({:.1}% of writes not 4 KiB-aligned in offset or length)",
            self.unaligned_writes,
            100.0 * self.unaligned_write_fraction
        )?;
        writeln!(f, "duration        {:.3} s", self.duration_ns as f64 / 1e9)?;
        let shown: Vec<String> = self.devices.iter().take(8).map(u32::to_string).collect();
        writeln!(
            f,
            "devices         {} [{}{}]",
            self.devices.len(),
            shown.join(", "),
            if self.devices.len() > 8 { ", ..." } else { "" }
        )?;
        writeln!(f, "size histogram  (<= size: reads / writes)")?;
        for b in &self.size_histogram {
            writeln!(
                f,
                "  {:>10}: {} / {}",
                human_bytes(b.max_bytes),
                b.reads,
                b.writes
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_set_merges_exactly() {
        let mut s = BlockSet::default();
        s.insert(0, 10, 20);
        s.insert(0, 30, 40);
        assert_eq!(s.count, 20);
        s.insert(0, 15, 35);
        assert_eq!(s.count, 30);
        assert_eq!(s.runs.len(), 1);
        s.insert(0, 40, 41); // adjacent: merges
        assert_eq!((s.count, s.runs.len()), (31, 1));
        s.insert(1, 0, 100); // other device: separate
        assert_eq!(s.count, 131);
        s.insert(0, 0, 5);
        s.insert(0, 12, 13); // inside
        assert_eq!(s.count, 136);
        s.insert(0, 0, u64::MAX);
        assert_eq!(s.count, u128::from(u64::MAX) + 100);
    }

    #[test]
    fn block_set_matches_naive_set() {
        let mut s = BlockSet::default();
        let mut naive = std::collections::HashSet::new();
        let mut rng = nvwc_dev::rng::Rng::new(12345);
        for _ in 0..2000 {
            let x = rng.next_u64();
            let dev = (x >> 60) as u32 % 2;
            let start = (x >> 20) % 500;
            let len = (x >> 40) % 9;
            s.insert(dev, start, start + len);
            for b in start..start + len {
                naive.insert((dev, b));
            }
        }
        assert_eq!(s.count, naive.len() as u128);
    }

    #[test]
    fn counts_and_histogram() {
        let recs = [
            TraceRecord::new(5, Op::Write, 0, 4096, 0),
            TraceRecord::new(6, Op::Write, 512, 512, 0),
            TraceRecord::new(7, Op::Read, 8192, 8192, 1),
            TraceRecord::flush(8, 0),
            TraceRecord::new(9, Op::Trim, 0, 1 << 30, 0),
        ];
        let st = stats(recs.iter().map(|r| Ok(*r))).unwrap();
        assert_eq!(
            (st.requests, st.reads, st.writes, st.flushes, st.trims),
            (5, 1, 2, 1, 1)
        );
        assert_eq!(
            (st.bytes_read, st.bytes_written, st.bytes_trimmed),
            (8192, 4608, 1 << 30)
        );
        assert_eq!((st.unique_blocks, st.unique_blocks_written), (3, 1));
        assert_eq!(st.unaligned_writes, 1);
        assert!((st.unaligned_write_fraction - 0.5).abs() < 1e-12);
        assert_eq!(st.duration_ns, 4);
        assert_eq!(st.devices, [0, 1]);
        assert_eq!(
            st.size_histogram,
            [
                SizeBucket {
                    max_bytes: 512,
                    reads: 0,
                    writes: 1
                },
                SizeBucket {
                    max_bytes: 4096,
                    reads: 0,
                    writes: 1
                },
                SizeBucket {
                    max_bytes: 8192,
                    reads: 1,
                    writes: 0
                },
            ]
        );
        let text = st.to_string();
        assert!(text.contains("requests        5"), "{text}");
        assert_eq!(bucket(513), 10);
        assert_eq!(bucket(u64::MAX), 64);
    }
}
