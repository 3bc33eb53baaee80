//! Pieces shared by the simulator's subcommands (`sim`, `sweep`, `repro`):
//! parsing policy, size and device lists, scanning a trace into a plan, and
//! running jobs in parallel behind a progress bar.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use nvwc_core::{ReplacementKind, WritePolicyKind};
use nvwc_sim::device::{build, DeviceSpec};
use nvwc_sim::plot::{Axis, Chart, LinePlot, Series};
use nvwc_sim::sweep::{default_threads, run_parallel, Job};
use nvwc_sim::{
    format_size, parse_size, AddressMode, DevSelect, RunResult, ScanOptions, SimConfig, TracePlan,
};
/// Peak resident set size of this process in KiB (Linux `/proc/self/status`).
pub fn peak_rss_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Parses one replacement policy. `track_hint`: the backing disk's track size
/// in blocks, used for LST and stack when the text gives no `track=`. This is
/// the one place that knows the `ReplacementKind` variants.
pub fn parse_replacement(s: &str, track_hint: Option<u64>) -> Result<ReplacementKind> {
    let mut k: ReplacementKind = s
        .parse()
        .map_err(|e| anyhow::anyhow!("replacement {s:?}: {e}"))?;
    if let (Some(t), false) = (track_hint, s.contains("track=")) {
        match &mut k {
            ReplacementKind::Lst { track_blocks } => *track_blocks = t.max(1),
            ReplacementKind::Stack { track_blocks, .. } => *track_blocks = t.max(1),
            _ => {}
        }
    }
    Ok(k)
}

/// Splits a list of replacement policies at the commas that start a new
/// policy name (parameters such as `stack:track=9,knee=100` keep theirs).
pub fn split_replacements(s: &str) -> Vec<String> {
    const NAMES: [&str; 4] = ["lru", "arc", "lst", "stack"];
    let mut out: Vec<String> = Vec::new();
    for part in s.split(',') {
        let p = part.trim();
        let starts_policy = NAMES.iter().any(|n| {
            let l = p.to_ascii_lowercase();
            l == *n || l.starts_with(&format!("{n}:"))
        });
        match out.last_mut() {
            Some(last) if !starts_policy => {
                last.push(',');
                last.push_str(p);
            }
            _ => out.push(p.to_string()),
        }
    }
    out
}

/// Parses a comma-separated policy list (`all` = every policy).
pub fn parse_policies(s: &str) -> Result<Vec<WritePolicyKind>> {
    if s == "all" {
        return Ok(WritePolicyKind::ALL.to_vec());
    }
    s.split(',')
        .map(|p| p.trim().parse().map_err(|e| anyhow::anyhow!("{e}")))
        .collect()
}

/// Parses a comma-separated size list.
pub fn parse_sizes(s: &str) -> Result<Vec<u64>> {
    s.split(',')
        .map(|p| parse_size(p).map_err(|e| anyhow::anyhow!(e)))
        .collect()
}

/// Parses a device spec: a preset name, JSON, or the path of a JSON file.
/// An error quotes a long spec by its start only.
pub fn parse_device(s: &str) -> Result<DeviceSpec> {
    let t = s.trim();
    let is_json = t.starts_with('{') || t.starts_with('"');
    let path = std::path::Path::new(t);
    if !is_json && DeviceSpec::preset(t).is_err() && path.is_file() {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("device file {}: {e}", path.display()))?;
        return DeviceSpec::from_json(text.trim())
            .map_err(|e| anyhow::anyhow!("device file {}: {e}", path.display()));
    }
    s.parse().map_err(|e| {
        let shown: String = t.chars().take(60).collect();
        let more = if t.chars().count() > 60 { "…" } else { "" };
        anyhow::anyhow!("device {shown:?}{more}: {e}")
    })
}

/// The backing device's track size in cache blocks, if it has tracks.
pub fn track_blocks_of(spec: &DeviceSpec, block_size: u64) -> Result<Option<u64>> {
    let d = build(spec, None)?;
    Ok(d.track_bytes().map(|t| (t / block_size).max(1)))
}

/// Scans a trace for a sweep.
#[allow(clippy::too_many_arguments)]
pub fn scan(
    trace: &Path,
    format: Option<nvwc_trace::Format>,
    backing: &DeviceSpec,
    base: &SimConfig,
    dev: Option<u32>,
    address_map: AddressMode,
    backing_size: Option<u64>,
    limit: Option<u64>,
) -> Result<TracePlan> {
    let cap = build(backing, None)?.capacity_bytes();
    let opts = ScanOptions {
        select: dev.map_or(DevSelect::All, DevSelect::One),
        mode: address_map,
        limit,
        block_size: base.block_size as u64,
        device_capacity: cap,
        reserve_bytes: base.reserve_bytes(),
        backing_size,
    };
    TracePlan::scan(trace, format, &opts).with_context(|| format!("scanning {}", trace.display()))
}

/// Scans a whole trace (every device, `--address-map auto`, the backing
/// store sized to the trace) with `base`'s backing, as the sweep and the
/// reproductions do.
pub fn scan_plan(trace: &Path, base: &SimConfig, limit: Option<u64>) -> Result<TracePlan> {
    scan(
        trace,
        None,
        &base.backing,
        base,
        None,
        AddressMode::Auto,
        None,
        limit,
    )
}

/// The exit status of a sweep with `failed` failed runs (printing the peak
/// RSS first if asked).
pub fn finish(print_peak_rss: bool, failed: usize) -> ExitCode {
    if print_peak_rss {
        eprintln!("peak_rss_kib {}", peak_rss_kib().unwrap_or(0));
    }
    if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// A progress bar over `n` runs (hidden when `quiet`).
pub fn runs_bar(n: usize, quiet: bool) -> ProgressBar {
    let pb = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(n as u64)
    };
    pb.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} runs {msg}")
            .expect("template")
            .progress_chars("=> "),
    );
    pb
}

/// Runs jobs with a progress bar; returns results in order.
pub fn run_jobs(
    jobs: &[Job],
    threads: Option<usize>,
    quiet: bool,
) -> Vec<Result<RunResult, nvwc_sim::SimError>> {
    let pb = runs_bar(jobs.len(), quiet);
    let out = run_parallel(jobs, threads.unwrap_or_else(default_threads), |_, r| {
        if let Ok(r) = r {
            pb.set_message(format!(
                "{} {} {}",
                r.write_policy,
                r.replacement,
                format_size(r.cache_size_bytes)
            ));
        }
        pb.inc(1);
    });
    pb.finish_and_clear();
    out
}

/// One run's point on the cache-size charts: the line it belongs to, its
/// cache size (bytes), backing block writes and throughput.
pub struct SizePoint {
    pub key: String,
    pub cache_bytes: f64,
    pub backing_writes: f64,
    pub throughput: f64,
}

/// Backing writes and throughput against cache size for `trace`, one line
/// per key (in the order keys first appear), points sorted by size.
pub fn size_charts(trace: &str, points: &[SizePoint]) -> Vec<Chart> {
    let mut keys: Vec<&str> = Vec::new();
    for p in points {
        if !keys.contains(&p.key.as_str()) {
            keys.push(&p.key);
        }
    }
    let series = |f: &dyn Fn(&SizePoint) -> f64| -> Vec<Series> {
        keys.iter()
            .map(|k| {
                let mut pts: Vec<(f64, f64)> = points
                    .iter()
                    .filter(|p| p.key == *k)
                    .map(|p| (p.cache_bytes, f(p)))
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                Series {
                    name: k.to_string(),
                    points: pts,
                }
            })
            .collect()
    };
    let chart = |title: &str, y_label: &str, f: &dyn Fn(&SizePoint) -> f64| {
        Chart::Line(LinePlot {
            title: format!("{title} ({trace})"),
            x_label: "cache size".into(),
            y_label: y_label.into(),
            x_axis: Axis::Log2Bytes,
            y_axis: Axis::Linear,
            series: series(f),
            vlines: vec![],
            y_from_zero: true,
        })
    };
    vec![
        chart("Backing writes", "backing block writes", &|p| {
            p.backing_writes
        }),
        chart("Throughput", "requests / s", &|p| p.throughput),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replacement_lists_keep_parameters() {
        assert_eq!(
            split_replacements("lru,stack:track=9,knee=100,lst,arc"),
            vec!["lru", "stack:track=9,knee=100", "lst", "arc"]
        );
        let k = parse_replacement("lst", Some(9)).unwrap();
        assert_eq!(k, ReplacementKind::Lst { track_blocks: 9 });
        let k = parse_replacement("lst:track=4", Some(9)).unwrap();
        assert_eq!(k, ReplacementKind::Lst { track_blocks: 4 });
        assert!(parse_replacement("fifo", None).is_err());
    }

    #[test]
    fn a_device_spec_may_be_a_json_file_and_a_bad_one_is_quoted_short() {
        let net = DeviceSpec::preset("net").unwrap();
        let json = serde_json::to_string(&net).unwrap();
        let path = std::env::temp_dir().join(format!("nvwc-runs-{}.json", std::process::id()));
        std::fs::write(&path, &json).unwrap();
        assert_eq!(parse_device(path.to_str().unwrap()).unwrap(), net);
        assert_eq!(parse_device(&json).unwrap(), net);
        std::fs::write(&path, "{\"type\": \"net\"}").unwrap();
        let e = parse_device(path.to_str().unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("device file "), "{e}");
        std::fs::remove_file(&path).unwrap();
        let long = json.replace("\"name\"", "\"nmae\"");
        let e = parse_device(&long).unwrap_err().to_string();
        assert!(e.contains("…") && e.len() < 400, "{e}");
        assert!(parse_device("no-such-device").is_err());
    }
}
