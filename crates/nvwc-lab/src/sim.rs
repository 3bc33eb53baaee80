//! `nvwc sim`: trace-driven simulation sweeps (see `nvwc_sim`).
//!
//! The cartesian product of `--write-policy`, `--replacement` and
//! `--cache-size` runs in parallel, one run per thread, with a progress bar.
//! Results go to stdout as a table, and optionally to JSON (one object per
//! run), CSV (the scalar fields) and a PNG/SVG plot.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use nvwc_core::{FetchMode, ReplacementKind, WritePolicyKind};
use nvwc_sim::plot::{Axis, Chart, LinePlot, Series};
use nvwc_sim::sweep::{default_threads, Job};
use nvwc_sim::{default_backing_qd, format_size, parse_size, AddressMode, RunResult, SimConfig};

use crate::runs::{
    finish, parse_device, parse_policies, parse_replacement, parse_sizes, run_jobs, runs_bar, scan,
    size_charts, split_replacements, track_blocks_of, SizePoint,
};

/// Arguments of `nvwc sim`.
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Trace file (any format nvwc-trace reads; gzip/bzip2 are detected).
    #[arg(long)]
    pub trace: PathBuf,
    /// Trace format (detected when omitted).
    #[arg(long)]
    pub format: Option<String>,
    /// Write policies, comma-separated (write-through, write-back, ordered, journaled, journaled-hints; or wt, wb, wb-o, wb-j, wb-jh; or `all`).
    #[arg(long, default_value = "write-back")]
    pub write_policy: String,
    /// Replacement policies, comma-separated (lru, arc, lst[:track=N], stack[:track=N,knee=K|online]).
    /// Without `track=`, LST and stack use the backing disk's track size when it has one.
    #[arg(long, default_value = "lru")]
    pub replacement: String,
    /// Cache sizes, comma-separated (4M,64M,1G).
    #[arg(long, default_value = "64M")]
    pub cache_size: String,
    /// Cache block size.
    #[arg(long, default_value = "4k")]
    pub block_size: String,
    /// Backing device: a preset name (hdd, hdd-hp97560, ssd, net, ...) or JSON (inline, or the path of a JSON file).
    #[arg(long, default_value = "net")]
    pub backing: String,
    /// Cache device: a preset name (nvdram, pmem, ssd-nvme, ssd-revodrive, ...) or JSON (inline, or the path of a JSON file).
    #[arg(long, default_value = "nvdram")]
    pub cache_device: String,
    /// Replay mode: closed (N outstanding per client) or open (trace timestamps).
    #[arg(long, default_value = "closed")]
    pub mode: String,
    /// Closed loop: outstanding requests per client.
    #[arg(long, default_value_t = 1)]
    pub qd: u32,
    /// Closed loop: what a client is (stream, dev, single).
    #[arg(long, default_value = "stream")]
    pub client_key: String,
    /// Open loop: divide trace timestamps by this.
    #[arg(long, default_value_t = 1.0)]
    pub speedup: f64,
    /// Replay at most this many requests.
    #[arg(long)]
    pub limit: Option<u64>,
    /// Replay the trace N times in a row (streamed again each pass; each
    /// pass's timestamps start 1 ms after the previous one's last, as with
    /// `nvwc trace convert --repeat N`). `--limit` counts all passes.
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
    /// Replay only this trace device (default: every device in its own region).
    #[arg(long)]
    pub dev: Option<u32>,
    /// Address mapping: auto, identity, compact, compact:SIZE.
    #[arg(long, default_value = "auto")]
    pub address_map: String,
    /// Backing store size (default: the mapped span of the trace).
    #[arg(long)]
    pub backing_size: Option<String>,
    /// Snapshot metrics every SECS of virtual time (in the JSON's `intervals`).
    #[arg(long)]
    pub interval: Option<f64>,
    /// Backing commands outstanding at once (default: 1 for a disk and for a networked store, 32 otherwise).
    #[arg(long)]
    pub backing_qd: Option<usize>,
    /// Merge adjacent queued backing writes.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub merge_backing: bool,
    /// Cost of a journaled checkpoint's GroupEnd: redo (the live server's
    /// redo log: log write, flush, flush), free (the
    /// write-policy paper's NVRAM journal) or write-flush (a 4 KiB commit
    /// record and a flush).
    #[arg(long, default_value = "redo")]
    pub group_end: String,
    /// Host CPU time per request, NS,NS_PER_KIB (default: measured on this
    /// machine, 4520,188; `0,0` for none; see crates/nvwc-sim/src/cpu.rs).
    #[arg(long)]
    pub cpu_ns: Option<String>,
    /// Dirty watermarks HIGH,LOW (fractions of the cache).
    #[arg(long)]
    pub watermarks: Option<String>,
    /// Ordered: read the next wave from the cache while the wave before it
    /// flushes (default true; false destages one wave at a time).
    #[arg(long, action = clap::ArgAction::Set)]
    pub wave_pipeline: Option<bool>,
    /// Journaled: transaction size limit in blocks.
    #[arg(long)]
    pub txn_blocks: Option<u32>,
    /// Journaled: transaction age limit in ms (0 = none).
    #[arg(long)]
    pub txn_age_ms: Option<f64>,
    /// Journaled: checkpoint delay in ms.
    #[arg(long)]
    pub checkpoint_delay_ms: Option<f64>,
    /// Journaled: committed transactions merged per checkpoint.
    #[arg(long)]
    pub checkpoint_merge: Option<u32>,
    /// Journaled: the journal's size bound (most data not yet checkpointed;
    /// writes wait for room), e.g. 64M; 0 = bounded by the cache only.
    #[arg(long)]
    pub journal_size: Option<String>,
    /// Allocate cache blocks on read misses.
    #[arg(long, action = clap::ArgAction::Set)]
    pub read_allocate: Option<bool>,
    /// Fetch modes for partial writes to uncached blocks, a comma list swept
    /// like the policies: blocking, async, async-bg, lazy.
    #[arg(long, default_value = "blocking")]
    pub fetch: String,
    /// Patch RAM limit (e.g. 64M).
    #[arg(long)]
    pub patch_mem: Option<String>,
    /// Write-back: write patched blocks back without a fetch.
    #[arg(long)]
    pub patch_direct: bool,
    /// Write-back: a write that would wait for cache space goes around the
    /// cache to the backing store (as `nvwc serve` does by default); off,
    /// it waits for a destage, as the papers' write-back does.
    #[arg(long)]
    pub bypass_when_full: bool,
    /// Admission policy (all, sync, wal, critical, ...; trace requests carry
    /// no hints, FUA writes count as synchronous).
    #[arg(long)]
    pub admission: Option<String>,
    /// Worker threads (default: available cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Write every run's result as a JSON array.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the scalar results as CSV.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Plot backing writes and throughput vs cache size (.png or .svg).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// No table on stdout.
    #[arg(long)]
    pub quiet: bool,
    /// Model: `des` (the engine, device models and virtual time) or
    /// `hit-ratio` (the replacement policy alone, every block clean: hit
    /// ratios only, much faster; write policies, devices and fetch modes
    /// do not apply).
    #[arg(long, default_value = "des")]
    pub model: String,
    /// Print this process's peak resident set size (VmHWM) to stderr at the end.
    #[arg(long, hide = true)]
    pub print_peak_rss: bool,
}

fn secs_to_ns(s: f64) -> u64 {
    (s * 1e9).round() as u64
}

/// Builds the base configuration (everything but policy, replacement, size).
pub fn base_config(a: &Args) -> Result<SimConfig> {
    let mut c = SimConfig::new(WritePolicyKind::WriteBack, ReplacementKind::Lru, 0);
    let bs = parse_size(&a.block_size).map_err(|e| anyhow::anyhow!(e))?;
    c.block_size = u32::try_from(bs).context("block size")?;
    c.backing = parse_device(&a.backing)?;
    c.cache_device = parse_device(&a.cache_device)?;
    c.mode = a.mode.parse().map_err(|e: String| anyhow::anyhow!(e))?;
    c.qd = a.qd;
    c.client_key = a
        .client_key
        .parse()
        .map_err(|e: String| anyhow::anyhow!(e))?;
    c.speedup = a.speedup;
    c.interval_ns = a.interval.map(secs_to_ns);
    c.backing_qd = a
        .backing_qd
        .unwrap_or_else(|| default_backing_qd(&c.backing));
    c.merge_backing = a.merge_backing;
    c.group_end = a
        .group_end
        .parse()
        .map_err(|e: String| anyhow::anyhow!(e))?;
    if let Some(x) = &a.cpu_ns {
        let (r, k) = x.split_once(',').context("--cpu-ns NS,NS_PER_KIB")?;
        c.cpu = nvwc_sim::cpu::CpuCost {
            per_request_ns: r.trim().parse().context("--cpu-ns: per-request ns")?,
            per_kib_ns: k.trim().parse().context("--cpu-ns: ns per KiB")?,
        };
    }
    if let Some(w) = &a.watermarks {
        let (h, l) = w.split_once(',').context("--watermarks HIGH,LOW")?;
        c.tuning.watermarks = Some((h.trim().parse()?, l.trim().parse()?));
    }
    c.tuning.txn_max_blocks = a.txn_blocks;
    c.tuning.txn_max_age_ns = a.txn_age_ms.map(|m| secs_to_ns(m / 1e3));
    c.tuning.checkpoint_delay_ns = a.checkpoint_delay_ms.map(|m| secs_to_ns(m / 1e3));
    c.tuning.checkpoint_merge_max = a.checkpoint_merge;
    if let Some(j) = &a.journal_size {
        let bytes = parse_size(j).map_err(|e| anyhow::anyhow!("--journal-size: {e}"))?;
        c.tuning.journal_size_blocks = Some(bytes.div_ceil(bs));
    }
    c.tuning.read_allocate = a.read_allocate;
    c.tuning.ordered_pipeline = a.wave_pipeline;
    c.tuning.patch_mem_bytes = a
        .patch_mem
        .as_deref()
        .map(parse_size)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--patch-mem: {e}"))?;
    c.tuning.patch_direct = a.patch_direct.then_some(true);
    c.tuning.bypass_when_full = a.bypass_when_full.then_some(true);
    c.tuning.admission = a
        .admission
        .as_deref()
        .map(|s| s.parse::<nvwc_core::AdmissionKind>())
        .transpose()
        .map_err(|e| anyhow::anyhow!("--admission: {e}"))?;
    Ok(c)
}

/// Prints results as a table.
pub fn print_table(results: &[RunResult]) {
    println!(
        "{:<15} {:<22} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8} {:>6} {:>8} {:>10} {:>9} {:>9} {:>9}",
        "policy", "replacement", "cache", "requests", "rd_hits", "wr_hits", "overwr", "bk_wr", "runs", "WA",
        "queued", "IOPS", "p50_us", "p99_us", "dirty_end"
    );
    for r in results {
        println!(
            "{:<15} {:<22} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8} {:>6.3} {:>8} {:>10.1} {:>9.1} {:>9.1} {:>9}",
            r.write_policy,
            r.replacement,
            format_size(r.cache_size_bytes),
            r.requests,
            r.read_hits,
            r.write_hits,
            r.overwrites,
            r.backing_writes,
            r.backing_write_runs,
            r.write_amplification,
            r.queued_writes,
            r.throughput_iops,
            r.latency_us_p50,
            r.latency_us_p99,
            format_size(r.dirty_bytes_end),
        );
    }
}

/// Writes the results as a JSON array.
pub fn write_json(path: &Path, results: &[RunResult]) -> Result<()> {
    let f = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    serde_json::to_writer_pretty(std::io::BufWriter::new(f), results)?;
    Ok(())
}

/// Writes the scalar fields of the results as CSV (columns sorted by name).
pub fn write_csv(path: &Path, results: &[RunResult]) -> Result<()> {
    let rows: Vec<serde_json::Map<String, serde_json::Value>> = results
        .iter()
        .map(|r| match serde_json::to_value(r) {
            Ok(serde_json::Value::Object(m)) => m,
            _ => serde_json::Map::new(),
        })
        .collect();
    let cols: Vec<String> = rows
        .first()
        .map(|m| {
            m.iter()
                .filter(|(_, v)| !v.is_object() && !v.is_array())
                .map(|(k, _)| k.clone())
                .collect()
        })
        .unwrap_or_default();
    let mut out = cols.join(",");
    out.push('\n');
    for m in &rows {
        let line: Vec<String> = cols
            .iter()
            .map(|c| match m.get(c) {
                Some(serde_json::Value::String(s)) => {
                    if s.contains([',', '"']) {
                        format!("\"{}\"", s.replace('"', "\"\""))
                    } else {
                        s.clone()
                    }
                }
                Some(serde_json::Value::Null) | None => String::new(),
                Some(v) => v.to_string(),
            })
            .collect();
        out.push_str(&line.join(","));
        out.push('\n');
    }
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}

/// Backing writes and throughput vs cache size, one line per policy pair.
pub fn sweep_charts(results: &[RunResult]) -> Vec<Chart> {
    let points: Vec<SizePoint> = results
        .iter()
        .map(|r| SizePoint {
            key: format!("{} / {}", r.write_policy, r.replacement),
            cache_bytes: r.cache_size_bytes as f64,
            backing_writes: r.backing_writes as f64,
            throughput: r.throughput_iops,
        })
        .collect();
    let trace = results.first().map(|r| r.trace.clone()).unwrap_or_default();
    size_charts(&trace, &points)
}

/// `nvwc sim --model hit-ratio`: every (replacement, size) through the
/// replacement policy alone, in parallel.
fn run_hit_ratio(
    a: &Args,
    base: &SimConfig,
    format: Option<nvwc_trace::Format>,
    repls: &[ReplacementKind],
    sizes: &[u64],
) -> Result<ExitCode> {
    use nvwc_sim::hitratio::{self, HitRatioConfig, HitRatioResult};
    let read_allocate = a.read_allocate.unwrap_or(true);
    let mut cfgs = Vec::new();
    for &r in repls {
        for &s in sizes {
            cfgs.push(HitRatioConfig {
                replacement: r,
                cache_bytes: s,
                block_size: base.block_size as u64,
                read_allocate,
            });
        }
    }
    let pb = runs_bar(cfgs.len(), a.quiet);
    let threads = a
        .threads
        .unwrap_or_else(default_threads)
        .clamp(1, cfgs.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let out: std::sync::Mutex<Vec<Option<Result<HitRatioResult, nvwc_sim::SimError>>>> =
        std::sync::Mutex::new((0..cfgs.len()).map(|_| None).collect());
    std::thread::scope(|sc| {
        for _ in 0..threads {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(c) = cfgs.get(i) else { break };
                let r = hitratio::run_file(c, &a.trace, format, a.dev, a.limit);
                pb.inc(1);
                out.lock().expect("results")[i] = Some(r);
            });
        }
    });
    pb.finish_and_clear();
    let mut ok = Vec::new();
    let mut failed = 0;
    for (c, r) in cfgs.iter().zip(out.into_inner().expect("results")) {
        match r.expect("every run ran") {
            Ok(r) => ok.push(r),
            Err(e) => {
                failed += 1;
                eprintln!(
                    "nvwc sim: hit-ratio run {} {} failed: {e}",
                    c.replacement,
                    format_size(c.cache_bytes)
                );
            }
        }
    }
    if !a.quiet {
        println!(
            "{:<10} {:>8} {:>10} {:>12} {:>9} {:>9} {:>10} {:>8} {:>12}",
            "repl",
            "cache",
            "requests",
            "accesses",
            "hit%",
            "read hit%",
            "evictions",
            "wall s",
            "req/s"
        );
        for r in &ok {
            println!(
                "{:<10} {:>8} {:>10} {:>12} {:>9.4} {:>9.4} {:>10} {:>8.3} {:>12.0}",
                r.replacement,
                format_size(r.cache_size_bytes),
                r.requests,
                r.block_accesses,
                100.0 * r.hit_ratio,
                100.0 * r.read_hit_ratio,
                r.evictions,
                r.wall_seconds,
                r.replay_rate
            );
        }
    }
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&ok)? + "\n")
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &a.csv {
        let mut t = String::from(concat!(
            "trace,replacement,cache_size_bytes,block_size,read_allocate,requests,block_accesses,",
            "read_hits,read_misses,write_hits,write_misses,evictions,hit_ratio,read_hit_ratio,",
            "wall_seconds,replay_rate\n"
        ));
        for r in &ok {
            t += &format!(
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n",
                r.trace,
                r.replacement,
                r.cache_size_bytes,
                r.block_size,
                r.read_allocate,
                r.requests,
                r.block_accesses,
                r.read_hits,
                r.read_misses,
                r.write_hits,
                r.write_misses,
                r.evictions,
                r.hit_ratio,
                r.read_hit_ratio,
                r.wall_seconds,
                r.replay_rate
            );
        }
        std::fs::write(p, t).with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &a.plot {
        let mut keys: Vec<String> = Vec::new();
        for r in &ok {
            if !keys.contains(&r.replacement) {
                keys.push(r.replacement.clone());
            }
        }
        let series = keys
            .iter()
            .map(|k| {
                let mut pts: Vec<(f64, f64)> = ok
                    .iter()
                    .filter(|r| &r.replacement == k)
                    .map(|r| (r.cache_size_bytes as f64, 100.0 * r.hit_ratio))
                    .collect();
                pts.sort_by(|x, y| x.0.total_cmp(&y.0));
                Series {
                    name: k.clone(),
                    points: pts,
                }
            })
            .collect();
        let trace = ok.first().map(|r| r.trace.clone()).unwrap_or_default();
        let chart = Chart::Line(LinePlot {
            title: format!("Hit ratio ({trace})"),
            x_label: "cache size".into(),
            y_label: "block hit ratio (%)".into(),
            x_axis: Axis::Log2Bytes,
            y_axis: Axis::Linear,
            series,
            vlines: vec![],
            y_from_zero: true,
        });
        nvwc_sim::plot::render(&[chart], 1, (640, 440), p)?;
    }
    Ok(finish(a.print_peak_rss, failed))
}

/// `nvwc sim`.
pub fn run(a: Args) -> Result<ExitCode> {
    let base = base_config(&a)?;
    let format = a
        .format
        .as_deref()
        .map(|f| f.parse::<nvwc_trace::Format>())
        .transpose()?;
    let policies = parse_policies(&a.write_policy)?;
    let track = track_blocks_of(&base.backing, base.block_size as u64)?;
    let repls: Vec<ReplacementKind> = split_replacements(&a.replacement)
        .iter()
        .map(|r| parse_replacement(r, track))
        .collect::<Result<_>>()?;
    let sizes = parse_sizes(&a.cache_size)?;
    let fetches: Vec<FetchMode> = a
        .fetch
        .split(',')
        .map(|m| m.trim().parse())
        .collect::<Result<_, _>>()?;
    if policies.is_empty() || repls.is_empty() || sizes.is_empty() {
        bail!("empty sweep");
    }
    match a.model.as_str() {
        "des" => {}
        "hit-ratio" if a.repeat != 1 => {
            bail!("--repeat applies to --model des; for hit-ratio, nvwc trace convert --repeat N first")
        }
        "hit-ratio" => return run_hit_ratio(&a, &base, format, &repls, &sizes),
        m => bail!("unknown model {m:?} (des, hit-ratio)"),
    }
    let mode: AddressMode = a
        .address_map
        .parse()
        .map_err(|e: String| anyhow::anyhow!(e))?;
    let backing_size = a
        .backing_size
        .as_deref()
        .map(parse_size)
        .transpose()
        .map_err(|e| anyhow::anyhow!(e))?;
    if a.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    let mut plan = scan(
        &a.trace,
        format,
        &base.backing,
        &base,
        a.dev,
        mode,
        backing_size,
        a.limit,
    )?;
    plan.repeat = a.repeat;
    plan.records = plan.records.saturating_mul(a.repeat as u64);
    if let Some(l) = a.limit {
        plan.records = plan.records.min(l);
    }
    let plan = Arc::new(plan);
    if !a.quiet {
        eprintln!(
            "trace {}: {} requests, {}; backing store {}, {} unique blocks written",
            a.trace.display(),
            plan.records,
            plan.mapping,
            format_size(plan.backing_size),
            plan.unique_write_blocks
        );
    }
    let mut jobs = Vec::new();
    for &p in &policies {
        for &r in &repls {
            for &s in &sizes {
                for &f in &fetches {
                    let mut c = base.clone();
                    c.write_policy = p;
                    c.replacement = r;
                    c.cache_bytes = s;
                    c.tuning.fetch = Some(f);
                    jobs.push(Job {
                        cfg: c,
                        plan: plan.clone(),
                        limit: a.limit,
                    });
                }
            }
        }
    }
    let results = run_jobs(&jobs, a.threads, a.quiet);
    let mut ok = Vec::new();
    let mut failed = 0;
    for (j, r) in jobs.iter().zip(results) {
        match r {
            Ok(r) => ok.push(r),
            Err(e) => {
                failed += 1;
                eprintln!(
                    "nvwc sim: run {} {} {} failed: {e}",
                    j.cfg.write_policy,
                    j.cfg.replacement,
                    format_size(j.cfg.cache_bytes)
                );
            }
        }
    }
    if !a.quiet {
        print_table(&ok);
    }
    if let Some(p) = &a.json {
        write_json(p, &ok)?;
    }
    if let Some(p) = &a.csv {
        write_csv(p, &ok)?;
    }
    if let Some(p) = &a.plot {
        nvwc_sim::plot::render(&sweep_charts(&ok), 2, (640, 440), p)?;
    }
    Ok(finish(a.print_peak_rss, failed))
}
