//! Mapping trace addresses onto one simulated backing store.
//!
//! A trace may name several devices (`dev`: MSR disk numbers, Tencent
//! volumes, SYSTOR LUNs) and may span far more address space than it touches.
//! Before a run, [`TracePlan::scan`] streams the trace once (memory bounded by
//! the number of devices and, with compaction, the number of touched regions,
//! never by the number of records) and decides:
//!
//! * **Devices.** With [`DevSelect::One`] only records of that device are
//!   replayed. With [`DevSelect::All`] (the default) every device gets its own
//!   disjoint region of the backing store, in ascending `dev` order, each region
//!   starting on a 1 MiB boundary: device `d`'s byte `x` lands at
//!   `base(d) + map_d(x)`.
//! * **Address compaction.** [`AddressMode::Identity`] keeps offsets.
//!   [`AddressMode::Compact`] cuts the address space into regions of
//!   `region_bytes` and renumbers the touched regions densely *in address
//!   order* (a monotone map): untouched space disappears, relative order and
//!   all contiguity inside and across adjacent touched regions are kept, so
//!   sequential runs stay sequential, seek distances shrink. This lets a trace
//!   that spans 34 GB but touches 1.3 GB run on a 1.37 GB disk model.
//!   [`AddressMode::Auto`] is identity if the span fits the backing device,
//!   else the largest power-of-two region (from 1 MiB down to the block size)
//!   whose compacted size fits.
//! * **Backing size**: the mapped span rounded up to the block size (or the
//!   size given by the user, which must cover it).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nvwc_trace::{open_path, Format, Op, ReaderOptions, TraceError, TraceRecord};

use crate::SimError;

/// Alignment of per-device regions.
pub const DEV_ALIGN: u64 = 1 << 20;

/// Which trace devices to replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DevSelect {
    /// Every device, each in its own region.
    #[default]
    All,
    /// Only this device.
    One(u32),
}

/// How trace offsets become backing offsets (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AddressMode {
    /// Offsets as in the trace.
    Identity,
    /// Dense renumbering of touched regions of this many bytes (a power of two).
    Compact {
        /// Region size in bytes.
        region_bytes: u64,
    },
    /// Identity if it fits the backing device, else the coarsest compaction that fits.
    #[default]
    Auto,
}

impl std::str::FromStr for AddressMode {
    type Err = String;
    /// `identity`, `auto`, `compact` (1 MiB regions) or `compact:SIZE` (e.g. `compact:64k`).
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "identity" => Ok(AddressMode::Identity),
            "auto" => Ok(AddressMode::Auto),
            "compact" => Ok(AddressMode::Compact {
                region_bytes: 1 << 20,
            }),
            _ => match s.strip_prefix("compact:") {
                Some(sz) => {
                    let b = crate::parse_size(sz)?;
                    if !b.is_power_of_two() {
                        return Err(format!("region size {b} is not a power of two"));
                    }
                    Ok(AddressMode::Compact { region_bytes: b })
                }
                None => Err(format!(
                    "unknown address mode {s:?} (identity, auto, compact, compact:SIZE)"
                )),
            },
        }
    }
}

/// Per-device facts from the scan.
#[derive(Clone, Debug, Default)]
struct DevScan {
    max_end: u64,
    /// Touched regions at the finest granularity scanned (hashed while
    /// scanning, sorted once after: a B-tree insert per record cost 5% of a
    /// single simulation run).
    touched: std::collections::HashSet<u64, nvwc_mrc::MixBuildHasher>,
    /// `touched`, sorted (filled after the scan).
    regions: BTreeSet<u64>,
}

/// Finest region size collected during the scan (compaction can only use
/// multiples of it).
const SCAN_REGION: u64 = 4096;

/// The per-device part of an [`AddressMap`].
#[derive(Clone, Debug)]
struct DevMap {
    base: u64,
    /// Compaction: region index -> dense rank (empty for identity).
    rank: BTreeMap<u64, u64>,
}

/// A trace-to-backing address map (cheap to clone: shared).
#[derive(Clone, Debug)]
pub struct AddressMap {
    devs: Arc<BTreeMap<u32, DevMap>>,
    region_bytes: u64,
    select: DevSelect,
}

impl AddressMap {
    /// Maps a record: `None` if the record's device is not replayed.
    /// Flushes map to offset 0. Caller guarantees the record was part of the
    /// scanned trace (its device and regions are known).
    pub fn map(&self, r: &TraceRecord) -> Option<u64> {
        if let DevSelect::One(d) = self.select {
            if r.dev != d {
                return None;
            }
        }
        if r.op == Op::Flush {
            return Some(0);
        }
        let dm = self.devs.get(&r.dev)?;
        if dm.rank.is_empty() {
            return Some(dm.base + r.offset);
        }
        let reg = r.offset / self.region_bytes;
        let rank = *dm.rank.get(&reg)?;
        Some(dm.base + rank * self.region_bytes + r.offset % self.region_bytes)
    }
    /// Region size of the compaction (0 for identity).
    pub fn region_bytes(&self) -> u64 {
        self.region_bytes
    }
}

/// What a run needs to know about its trace before it starts.
#[derive(Clone, Debug)]
pub struct TracePlan {
    /// The trace file.
    pub path: PathBuf,
    /// Its format, if forced.
    pub format: Option<Format>,
    /// Records the scan saw (after the device filter and `limit`).
    pub records: u64,
    /// Malformed records skipped.
    pub malformed: u64,
    /// Devices seen, ascending.
    pub devices: Vec<u32>,
    /// Bytes the replayed records span after mapping (rounded up to the block size).
    pub mapped_span: u64,
    /// Backing store size for the engine.
    pub backing_size: u64,
    /// The address map.
    pub map: AddressMap,
    /// Human-readable description of the mapping.
    pub mapping: String,
    /// Distinct 4 KiB blocks written (after mapping).
    pub unique_write_blocks: u64,
    /// Distinct 4 KiB blocks read or written.
    pub unique_blocks: u64,
    /// Replay the trace this many times in a row (each pass's timestamps
    /// start 1 ms after the previous pass's last one, as `nvwc trace convert
    /// --repeat` writes them); the scan covers one pass (the same records).
    pub repeat: u32,
}

/// Options of [`TracePlan::scan`].
#[derive(Clone, Debug)]
pub struct ScanOptions {
    /// Device selection.
    pub select: DevSelect,
    /// Address mode.
    pub mode: AddressMode,
    /// Replay at most this many records (after the device filter).
    pub limit: Option<u64>,
    /// Cache block size (the backing size is a multiple of it).
    pub block_size: u64,
    /// Capacity of the backing device model, for [`AddressMode::Auto`] and checks.
    pub device_capacity: u64,
    /// Bytes the driver keeps at the end of the backing device (group-commit log).
    pub reserve_bytes: u64,
    /// Backing size requested by the user (must cover the mapped span).
    pub backing_size: Option<u64>,
}

/// Opens a trace for reading.
pub fn open(
    path: &Path,
    format: Option<Format>,
) -> Result<nvwc_trace::TraceReader<'static>, SimError> {
    open_path(path, format, &ReaderOptions::default()).map_err(SimError::Trace)
}

/// Collects 4 KiB blocks as disjoint intervals (memory ∝ runs, not records).
#[derive(Default)]
struct Runs(BTreeMap<u64, u64>, u64);

impl Runs {
    fn insert(&mut self, mut s: u64, mut e: u64) {
        if let Some((&a, &b)) = self.0.range(..=s).next_back() {
            if b >= s {
                if b >= e {
                    return;
                }
                self.0.remove(&a);
                self.1 -= b - a;
                s = a;
                e = e.max(b);
            }
        }
        while let Some((&a, &b)) = self.0.range(s..=e).next() {
            self.0.remove(&a);
            self.1 -= b - a;
            e = e.max(b);
        }
        self.0.insert(s, e);
        self.1 += e - s;
    }
}

impl TracePlan {
    /// Streams the trace once and builds the plan (see the module docs).
    pub fn scan(
        path: &Path,
        format: Option<Format>,
        o: &ScanOptions,
    ) -> Result<TracePlan, SimError> {
        let mut devs: BTreeMap<u32, DevScan> = BTreeMap::new();
        let mut records = 0u64;
        let mut malformed = 0u64;
        let mut reader = open(path, format)?;
        for r in reader.by_ref() {
            let r = match r {
                Ok(r) => r,
                Err(e) if e.is_fatal() => return Err(SimError::Trace(e)),
                Err(_) => {
                    malformed += 1;
                    continue;
                }
            };
            if let DevSelect::One(d) = o.select {
                if r.dev != d {
                    continue;
                }
            }
            if o.limit.is_some_and(|l| records >= l) {
                break;
            }
            records += 1;
            let d = devs.entry(r.dev).or_default();
            if r.op == Op::Flush || r.len == 0 {
                continue;
            }
            d.max_end = d.max_end.max(r.end());
            let (a, b) = (r.offset / SCAN_REGION, (r.end() - 1) / SCAN_REGION);
            for reg in a..=b {
                d.touched.insert(reg);
            }
        }
        for d in devs.values_mut() {
            d.regions = std::mem::take(&mut d.touched).into_iter().collect();
        }
        let bs = o.block_size;
        let devices: Vec<u32> = devs.keys().copied().collect();
        let identity_span: u64 = devs
            .values()
            .map(|d| d.max_end.next_multiple_of(DEV_ALIGN))
            .sum();
        let room = o.device_capacity.saturating_sub(o.reserve_bytes);
        let compact_span = |region: u64| -> u64 {
            devs.values()
                .map(|d| {
                    let n: BTreeSet<u64> =
                        d.regions.iter().map(|r| r * SCAN_REGION / region).collect();
                    (n.len() as u64 * region).next_multiple_of(DEV_ALIGN)
                })
                .sum()
        };
        let region = match o.mode {
            AddressMode::Identity => 0,
            AddressMode::Compact { region_bytes } => region_bytes.max(SCAN_REGION),
            AddressMode::Auto => {
                if identity_span <= room {
                    0
                } else {
                    let mut r = DEV_ALIGN;
                    loop {
                        if compact_span(r) <= room {
                            break r;
                        }
                        if r <= bs.max(SCAN_REGION) {
                            return Err(SimError::Config(format!(
                                "the trace touches {} bytes, more than the backing device's {} bytes even when compacted",
                                compact_span(r),
                                room
                            )));
                        }
                        r /= 2;
                    }
                }
            }
        };
        if region != 0 && region % bs != 0 && !bs.is_multiple_of(region) {
            return Err(SimError::Config(format!(
                "compaction region {region} and block size {bs} must divide one another"
            )));
        }
        let mut maps = BTreeMap::new();
        let mut base = 0u64;
        for (&dev, d) in &devs {
            let mut rank = BTreeMap::new();
            let span = if region == 0 {
                d.max_end
            } else {
                for reg in d.regions.iter().map(|r| r * SCAN_REGION / region) {
                    let n = rank.len() as u64;
                    rank.entry(reg).or_insert(n);
                }
                rank.len() as u64 * region
            };
            maps.insert(dev, DevMap { base, rank });
            base += span.next_multiple_of(DEV_ALIGN);
        }
        let map = AddressMap {
            devs: Arc::new(maps),
            region_bytes: region,
            select: o.select,
        };
        let mapped_span = base.max(bs).next_multiple_of(bs);
        let backing_size = match o.backing_size {
            Some(b) => {
                if b < mapped_span {
                    return Err(SimError::Config(format!(
                        "--backing-size {b} is smaller than the {mapped_span} bytes the trace spans"
                    )));
                }
                b.next_multiple_of(bs)
            }
            None => mapped_span,
        };
        if backing_size + o.reserve_bytes > o.device_capacity {
            return Err(SimError::Config(format!(
                "the trace needs a {backing_size}-byte backing store; the backing device holds {} (try --address-map compact)",
                o.device_capacity.saturating_sub(o.reserve_bytes)
            )));
        }
        // Second look at the records, mapped: unique blocks (for scaling rules).
        let mut wr = Runs::default();
        let mut all = Runs::default();
        let mut n = 0u64;
        for r in open(path, format)?.flatten() {
            let Some(off) = map.map(&r) else { continue };
            if o.limit.is_some_and(|l| n >= l) {
                break;
            }
            n += 1;
            if !r.op.is_data() || r.len == 0 {
                continue;
            }
            let (a, b) = (off / 4096, (off + r.len).div_ceil(4096));
            all.insert(a, b);
            if r.op == Op::Write {
                wr.insert(a, b);
            }
        }
        let mapping = match (o.select, region) {
            (DevSelect::One(d), 0) => format!("device {d} only, identity"),
            (DevSelect::One(d), r) => format!("device {d} only, compacted in {r}-byte regions"),
            (DevSelect::All, 0) => {
                format!("{} device(s) in disjoint regions, identity", devices.len())
            }
            (DevSelect::All, r) => format!(
                "{} device(s) in disjoint regions, compacted in {r}-byte regions",
                devices.len()
            ),
        };
        Ok(TracePlan {
            path: path.to_path_buf(),
            format,
            records,
            malformed,
            devices,
            mapped_span,
            backing_size,
            map,
            mapping,
            unique_write_blocks: wr.1,
            unique_blocks: all.1,
            repeat: 1,
        })
    }
}

/// Iterator over mapped records of a plan (its trace `plan.repeat` times in
/// a row; `limit` counts records over all passes).
pub struct MappedRecords {
    reader: Option<nvwc_trace::TraceReader<'static>>,
    path: std::path::PathBuf,
    format: Option<Format>,
    /// Passes still to open after the current one.
    passes_left: u32,
    base_ns: u64,
    last_ns: u64,
    map: AddressMap,
    limit: Option<u64>,
    taken: u64,
    /// Malformed records skipped.
    pub malformed: u64,
}

impl MappedRecords {
    /// Opens the plan's trace.
    pub fn open(plan: &TracePlan, limit: Option<u64>) -> Result<Self, SimError> {
        Ok(MappedRecords {
            reader: Some(open(&plan.path, plan.format)?),
            path: plan.path.clone(),
            format: plan.format,
            passes_left: plan.repeat.max(1) - 1,
            base_ns: 0,
            last_ns: 0,
            map: plan.map.clone(),
            limit,
            taken: 0,
            malformed: 0,
        })
    }
}

impl Iterator for MappedRecords {
    type Item = Result<TraceRecord, TraceError>;
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.limit.is_some_and(|l| self.taken >= l) {
                return None;
            }
            let next = match self.reader.as_mut()?.next() {
                Some(n) => n,
                None => {
                    if self.passes_left == 0 {
                        self.reader = None;
                        return None;
                    }
                    self.passes_left -= 1;
                    self.base_ns = self.last_ns + 1_000_000;
                    match open_path(&self.path, self.format, &ReaderOptions::default()) {
                        Ok(r) => self.reader = Some(r),
                        Err(e) => {
                            self.reader = None;
                            return Some(Err(e));
                        }
                    }
                    continue;
                }
            };
            match next {
                Ok(mut r) => {
                    r.ts_ns += self.base_ns;
                    self.last_ns = r.ts_ns;
                    let Some(off) = self.map.map(&r) else {
                        continue;
                    };
                    r.offset = off;
                    self.taken += 1;
                    return Some(Ok(r));
                }
                Err(e) if e.is_fatal() => return Some(Err(e)),
                Err(_) => self.malformed += 1,
            }
        }
    }
}
