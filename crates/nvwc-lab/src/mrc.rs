//! `nvwc mrc`: the miss-ratio curve of a trace (exact Mattson by default,
//! SHARDS when asked), every Kneedle knee marked, as a table, JSON and a plot.
//!
//! Keys are cache blocks: every record touches the blocks
//! `offset / bs ..= (offset + len − 1) / bs` of its device, each one access
//! (key = device << 44 | block). Flushes and trims are not accesses.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Result};
use nvwc_mrc::{
    kneedle, CurveShape, Histogram, Mrc, ShardsFixedRate, ShardsFixedSize, StackDistance,
};
use nvwc_sim::plot::{Axis, Chart, LinePlot, Series};
use nvwc_sim::{format_size, parse_size};
use nvwc_trace::{open_path, Op, ReaderOptions};
use serde::Serialize;

/// Arguments of `nvwc mrc`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Trace file.
    #[arg(long)]
    pub trace: PathBuf,
    /// Trace format (detected when omitted).
    #[arg(long)]
    pub format: Option<String>,
    /// SHARDS with this fixed sampling rate (0 < R <= 1).
    #[arg(long, conflicts_with = "shards_size")]
    pub shards: Option<f64>,
    /// Fixed-size SHARDS keeping at most this many sampled keys.
    #[arg(long)]
    pub shards_size: Option<usize>,
    /// Only writes are accesses (the write working set of a write cache).
    #[arg(long)]
    pub writes_only: bool,
    /// Cache block size.
    #[arg(long, default_value = "4k")]
    pub block_size: String,
    /// Read at most this many records.
    #[arg(long)]
    pub limit: Option<u64>,
    /// Kneedle sensitivity.
    #[arg(long, default_value_t = nvwc_mrc::DEFAULT_SENSITIVITY)]
    pub sensitivity: f64,
    /// Rows in the printed table.
    #[arg(long, default_value_t = 24)]
    pub rows: usize,
    /// Plot the curve (.png or .svg).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Write the curve and knees as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// A knee of the curve.
#[derive(Clone, Debug, Serialize)]
pub struct KneeOut {
    /// Cache size in blocks.
    pub size_blocks: u64,
    /// Cache size in bytes.
    pub size_bytes: u64,
    /// Miss ratio there.
    pub miss_ratio: f64,
    /// Kneedle difference value (prominence).
    pub prominence: f64,
}

/// The output of `nvwc mrc`.
#[derive(Clone, Debug, Serialize)]
pub struct MrcOut {
    /// Trace file.
    pub trace: String,
    /// `exact`, `shards-rate` or `shards-size`.
    pub method: String,
    /// Final sampling rate (1 for exact).
    pub rate: f64,
    /// Block size.
    pub block_size: u64,
    /// Only writes counted.
    pub writes_only: bool,
    /// Accesses (block references) seen.
    pub accesses: u64,
    /// Records read.
    pub records: u64,
    /// Distinct blocks (exact) or sampled keys (SHARDS).
    pub keys: u64,
    /// `(size_blocks, miss_ratio)`, at most 2000 points.
    pub points: Vec<(u64, f64)>,
    /// Every knee, ascending size.
    pub knees: Vec<KneeOut>,
    /// Wall-clock seconds and accesses per second.
    pub wall_seconds: f64,
    /// Accesses processed per wall-clock second.
    pub accesses_per_sec: f64,
    /// Records processed per wall-clock second.
    pub requests_per_sec: f64,
}

enum Method {
    Exact(StackDistance, Histogram),
    Rate(ShardsFixedRate),
    Size(ShardsFixedSize),
}

/// Computes the curve (used by `nvwc mrc` and the reproductions).
pub fn compute(a: &Args) -> Result<MrcOut> {
    let bs = parse_size(&a.block_size).map_err(|e| anyhow::anyhow!(e))?;
    if bs == 0 {
        bail!("block size must be positive");
    }
    let fmt = a.format.as_deref().map(|s| s.parse()).transpose()?;
    let mut m = match (a.shards, a.shards_size) {
        (Some(r), _) => {
            if !(r > 0.0 && r <= 1.0) {
                bail!("--shards rate must be in (0, 1]");
            }
            Method::Rate(ShardsFixedRate::new(r))
        }
        (None, Some(k)) => Method::Size(ShardsFixedSize::new(k.max(1))),
        _ => Method::Exact(StackDistance::new(), Histogram::new()),
    };
    let wall = std::time::Instant::now();
    let (mut records, mut accesses) = (0u64, 0u64);
    for r in open_path(&a.trace, fmt, &ReaderOptions::default())? {
        let r = match r {
            Ok(r) => r,
            Err(e) if e.is_fatal() => return Err(e.into()),
            Err(_) => continue,
        };
        if a.limit.is_some_and(|l| records >= l) {
            break;
        }
        records += 1;
        let access = match r.op {
            Op::Write => true,
            Op::Read => !a.writes_only,
            _ => false,
        };
        if !access || r.len == 0 {
            continue;
        }
        for b in r.offset / bs..=(r.end() - 1) / bs {
            let key = (r.dev as u64) << 44 | (b & ((1 << 44) - 1));
            accesses += 1;
            match &mut m {
                Method::Exact(sd, h) => h.record(sd.access(key)),
                Method::Rate(s) => s.access(key),
                Method::Size(s) => s.access(key),
            }
        }
    }
    let secs = wall.elapsed().as_secs_f64();
    let (mrc, method, rate, keys): (Mrc, &str, f64, u64) = match &m {
        Method::Exact(sd, h) => (h.mrc(), "exact", 1.0, sd.distinct() as u64),
        Method::Rate(s) => (s.mrc(), "shards-rate", s.rate(), s.sampled_keys() as u64),
        Method::Size(s) => (s.mrc(), "shards-size", s.rate(), s.sampled_keys() as u64),
    };
    let pts: Vec<(f64, f64)> = mrc.points.iter().map(|&(s, m)| (s as f64, m)).collect();
    let knees = kneedle(&pts, CurveShape::ConvexDecreasing, a.sensitivity)
        .into_iter()
        .map(|k| KneeOut {
            size_blocks: k.x as u64,
            size_bytes: k.x as u64 * bs,
            miss_ratio: k.y,
            prominence: k.diff,
        })
        .collect();
    let step = mrc.points.len().div_ceil(2000).max(1);
    let mut points: Vec<(u64, f64)> = mrc.points.iter().step_by(step).copied().collect();
    if let (Some(&l), Some(p)) = (mrc.points.last(), points.last()) {
        if p.0 != l.0 {
            points.push(l);
        }
    }
    Ok(MrcOut {
        trace: a.trace.display().to_string(),
        method: method.into(),
        rate,
        block_size: bs,
        writes_only: a.writes_only,
        accesses,
        records,
        keys,
        points,
        knees,
        wall_seconds: secs,
        accesses_per_sec: if secs > 0.0 {
            accesses as f64 / secs
        } else {
            0.0
        },
        requests_per_sec: if secs > 0.0 {
            records as f64 / secs
        } else {
            0.0
        },
    })
}

/// Interpolated miss ratio of the output's points at `size` blocks.
pub fn miss_at(o: &MrcOut, size: u64) -> f64 {
    Mrc {
        points: o.points.clone(),
    }
    .miss_ratio(size)
}

/// The plot of a curve with its knees.
pub fn chart(o: &MrcOut, title: &str) -> Chart {
    let bs = o.block_size as f64;
    Chart::Line(LinePlot {
        title: title.to_string(),
        x_label: "cache size".into(),
        y_label: "miss ratio".into(),
        x_axis: Axis::Log2Bytes,
        y_axis: Axis::Linear,
        series: vec![Series {
            name: format!(
                "{} ({})",
                if o.writes_only { "writes" } else { "all" },
                o.method
            ),
            points: o
                .points
                .iter()
                .filter(|p| p.0 > 0)
                .map(|&(s, m)| (s as f64 * bs, m))
                .collect(),
        }],
        vlines: o
            .knees
            .iter()
            .map(|k| {
                (
                    k.size_bytes as f64,
                    format!("knee {}", format_size(k.size_bytes)),
                )
            })
            .collect(),
        y_from_zero: true,
    })
}

/// `nvwc mrc`.
pub fn run(a: Args) -> Result<ExitCode> {
    let o = compute(&a)?;
    println!(
        "{}: {} records, {} block accesses, {} {} keys, method {} (rate {:.4}), {:.2} s ({:.0} requests/s)",
        o.trace,
        o.records,
        o.accesses,
        o.keys,
        if o.method == "exact" { "distinct" } else { "sampled" },
        o.method,
        o.rate,
        o.wall_seconds,
        o.requests_per_sec
    );
    let max = o.points.last().map(|p| p.0).unwrap_or(0).max(1);
    println!("{:>12} {:>12} {:>10}", "cache", "blocks", "miss_ratio");
    let rows = a.rows.max(2);
    let mut last = u64::MAX;
    for i in 0..rows {
        let s = ((max as f64).powf(i as f64 / (rows - 1) as f64)).round() as u64;
        if s == last {
            continue;
        }
        last = s;
        println!(
            "{:>12} {:>12} {:>10.4}",
            format_size(s * o.block_size),
            s,
            miss_at(&o, s)
        );
    }
    if o.knees.is_empty() {
        println!("no knee found");
    }
    for k in &o.knees {
        println!(
            "knee: {:>12} {:>12} {:>10.4}  (prominence {:.3})",
            format_size(k.size_bytes),
            k.size_blocks,
            k.miss_ratio,
            k.prominence
        );
    }
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&o)?)?;
    }
    if let Some(p) = &a.plot {
        let name = a
            .trace
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        nvwc_sim::plot::render(
            &[chart(&o, &format!("Miss-ratio curve: {name}"))],
            1,
            (800, 500),
            p,
        )?;
    }
    Ok(ExitCode::SUCCESS)
}
