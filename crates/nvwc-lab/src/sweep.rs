//! `nvwc sweep`: a resumable simulation sweep, one result file per cell.
//!
//! A *spec* (a TOML or JSON file, or flags) lists traces, write policies,
//! replacement policies, cache sizes, cache and backing device models, fetch
//! modes and admission policies. Every combination is a *cell*. A cell's id is
//! a readable name plus a hash of its configuration (the spec's strings as
//! written, so the same spec always gives the same ids). Cells run on all
//! cores; each one writes `OUT/cells/<id>.json` (to a temporary file, then
//! renamed, so a file that exists is complete). A re-run skips the cells whose
//! file says `"status": "ok"`, so an interrupted sweep resumes where it
//! stopped. A cell that cannot run (missing trace, bad option) records its
//! error in its file; the others go on, and the exit status is 1.
//!
//! At the end `OUT/summary.md`, `OUT/summary.csv` and one plot per trace
//! (`OUT/plots/<trace>.svg`: backing writes and throughput against cache
//! size) are written from the cell files.
//!
//! `--list` prints the cells (JSON lines) and `--cell ID` runs only the given
//! cells, writing the same file: the Ray driver (`python/nvwc_ray`) uses both.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use nvwc_core::{AdmissionKind, FetchMode, ReplacementKind, WritePolicyKind};
use nvwc_sim::plot::Chart;
use nvwc_sim::sweep::default_threads;
use nvwc_sim::{default_backing_qd, parse_size, SimConfig};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::runs::{
    parse_device, parse_replacement, scan_plan, size_charts, track_blocks_of, SizePoint,
};

/// Arguments of `nvwc sweep`.
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Sweep spec: a `.toml` or `.json` file (flags below override its lists).
    #[arg(long)]
    pub spec: Option<PathBuf>,
    /// Output directory (cells/, summary.md, summary.csv, plots/).
    #[arg(long)]
    pub out: PathBuf,
    /// Trace files (repeat the flag or separate with commas).
    #[arg(long = "trace", value_delimiter = ',')]
    pub traces: Vec<String>,
    /// Write policies, comma-separated (wt, wb, ordered, journaled, ...).
    #[arg(long)]
    pub write_policy: Option<String>,
    /// Replacement policies, comma-separated (lru, arc, lst, stack:...).
    #[arg(long)]
    pub replacement: Option<String>,
    /// Cache sizes, comma-separated (1M,16M).
    #[arg(long)]
    pub cache_size: Option<String>,
    /// Cache device models (presets), comma-separated.
    #[arg(long)]
    pub cache_device: Option<String>,
    /// Backing device models (presets), comma-separated.
    #[arg(long)]
    pub backing: Option<String>,
    /// Fetch modes, comma-separated (blocking, async, async-bg, lazy).
    #[arg(long)]
    pub fetch: Option<String>,
    /// Admission policies, comma-separated (all, sync, ...).
    #[arg(long)]
    pub admission: Option<String>,
    /// Replay at most this many requests of each trace.
    #[arg(long)]
    pub limit: Option<u64>,
    /// Closed loop: outstanding requests per client.
    #[arg(long)]
    pub qd: Option<u32>,
    /// Worker threads (default: available cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Run only these cells (ids from --list; repeat or comma-separate). No summary.
    #[arg(long, value_delimiter = ',')]
    pub cell: Vec<String>,
    /// Print the cells as JSON lines ({"id", "config", "done"}) and exit.
    #[arg(long)]
    pub list: bool,
    /// Run nothing: write the summary and plots from the cell files.
    #[arg(long)]
    pub summarize: bool,
    /// Re-run cells that are already complete.
    #[arg(long)]
    pub force: bool,
    /// No progress bar or table.
    #[arg(long)]
    pub quiet: bool,
}

/// Serde's `default = "..."` wants one function per field: a one-item list each.
macro_rules! list_defaults {
    ($($name:ident => $v:literal),* $(,)?) => {
        $(fn $name() -> Vec<String> {
            vec![$v.into()]
        })*
    };
}
list_defaults! {
    default_policies => "write-back",
    default_replacements => "lru",
    default_sizes => "64M",
    default_cache_devices => "nvdram",
    default_backings => "net",
    default_fetch => "blocking",
    default_admission => "all",
}
fn default_qd() -> u32 {
    1
}
fn default_block_size() -> String {
    "4k".into()
}

/// A sweep spec (the file format; every list is swept).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// Trace files (relative paths are relative to the working directory).
    pub traces: Vec<String>,
    #[serde(default = "default_policies")]
    pub write_policies: Vec<String>,
    #[serde(default = "default_replacements")]
    pub replacements: Vec<String>,
    #[serde(default = "default_sizes")]
    pub cache_sizes: Vec<String>,
    #[serde(default = "default_cache_devices")]
    pub cache_devices: Vec<String>,
    #[serde(default = "default_backings")]
    pub backings: Vec<String>,
    #[serde(default = "default_fetch")]
    pub fetch: Vec<String>,
    #[serde(default = "default_admission")]
    pub admission: Vec<String>,
    /// Replay at most this many requests of each trace.
    #[serde(default)]
    pub limit: Option<u64>,
    /// Closed loop: outstanding requests per client.
    #[serde(default = "default_qd")]
    pub qd: u32,
    /// Cache block size.
    #[serde(default = "default_block_size")]
    pub block_size: String,
}

/// One cell's configuration, as the spec wrote it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CellConfig {
    pub trace: String,
    pub write_policy: String,
    pub replacement: String,
    pub cache_size: String,
    pub cache_device: String,
    pub backing: String,
    pub fetch: String,
    pub admission: String,
    pub limit: Option<u64>,
    pub qd: u32,
    pub block_size: String,
}

/// One cell.
#[derive(Clone, Debug)]
pub struct Cell {
    pub id: String,
    pub config: CellConfig,
}

/// A cell's result file.
#[derive(Debug, Serialize, Deserialize)]
pub struct CellFile {
    pub id: String,
    pub config: CellConfig,
    /// `ok` or `failed`.
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The run's metrics (`nvwc sim --json` fields).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
}

fn split_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

impl Spec {
    /// Reads a spec file (`.toml`, else JSON).
    pub fn load(path: &Path) -> Result<Spec> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        if path.extension().is_some_and(|e| e == "toml") {
            toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))
        } else {
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
        }
    }

    /// The spec from a file and/or flags (flags replace the file's lists).
    pub fn from_args(a: &Args) -> Result<Spec> {
        let mut s = match &a.spec {
            Some(p) => Spec::load(p)?,
            None => Spec {
                traces: vec![],
                write_policies: default_policies(),
                replacements: default_replacements(),
                cache_sizes: default_sizes(),
                cache_devices: default_cache_devices(),
                backings: default_backings(),
                fetch: default_fetch(),
                admission: default_admission(),
                limit: None,
                qd: default_qd(),
                block_size: default_block_size(),
            },
        };
        if !a.traces.is_empty() {
            s.traces = a.traces.clone();
        }
        if let Some(v) = &a.write_policy {
            s.write_policies = if v == "all" {
                WritePolicyKind::ALL
                    .iter()
                    .map(|p| p.name().to_string())
                    .collect()
            } else {
                split_list(v)
            };
        }
        if let Some(v) = &a.replacement {
            s.replacements = crate::runs::split_replacements(v);
        }
        for (flag, list) in [
            (&a.cache_size, &mut s.cache_sizes),
            (&a.cache_device, &mut s.cache_devices),
            (&a.backing, &mut s.backings),
            (&a.fetch, &mut s.fetch),
            (&a.admission, &mut s.admission),
        ] {
            if let Some(v) = flag {
                *list = split_list(v);
            }
        }
        if a.limit.is_some() {
            s.limit = a.limit;
        }
        if let Some(q) = a.qd {
            s.qd = q;
        }
        if s.traces.is_empty() {
            bail!("no traces (--trace or `traces` in the spec)");
        }
        for (name, l) in [
            ("write_policies", &s.write_policies),
            ("replacements", &s.replacements),
            ("cache_sizes", &s.cache_sizes),
            ("cache_devices", &s.cache_devices),
            ("backings", &s.backings),
            ("fetch", &s.fetch),
            ("admission", &s.admission),
        ] {
            if l.is_empty() {
                bail!("empty list {name} in the sweep spec");
            }
        }
        Ok(s)
    }

    /// Every cell, in a fixed order (traces outermost).
    pub fn cells(&self) -> Vec<Cell> {
        let mut out = Vec::new();
        for t in &self.traces {
            for p in &self.write_policies {
                for r in &self.replacements {
                    for z in &self.cache_sizes {
                        for cd in &self.cache_devices {
                            for b in &self.backings {
                                for f in &self.fetch {
                                    for ad in &self.admission {
                                        let config = CellConfig {
                                            trace: t.clone(),
                                            write_policy: p.clone(),
                                            replacement: r.clone(),
                                            cache_size: z.clone(),
                                            cache_device: cd.clone(),
                                            backing: b.clone(),
                                            fetch: f.clone(),
                                            admission: ad.clone(),
                                            limit: self.limit,
                                            qd: self.qd,
                                            block_size: self.block_size.clone(),
                                        };
                                        out.push(Cell {
                                            id: cell_id(&config),
                                            config,
                                        });
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        out
    }
}

/// FNV-1a, 64 bits: stable across runs, platforms and Rust versions.
fn fnv1a(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in b {
        h ^= x as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn slug(s: &str, max: usize) -> String {
    let t: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    t.chars().take(max).collect()
}

/// A cell's id: readable parts, then 12 hex digits of a hash of the whole
/// configuration (field order fixed by [`CellConfig`]).
pub fn cell_id(c: &CellConfig) -> String {
    let canon = serde_json::to_string(c).expect("serialisable");
    let trace = Path::new(&c.trace)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| c.trace.clone());
    let dev = |d: &str| {
        if d.trim_start().starts_with('{') {
            "json".to_string()
        } else {
            slug(d, 16)
        }
    };
    format!(
        "{}-{}-{}-{}-{}-{}-{}-{}-{:012x}",
        slug(&trace, 24),
        slug(&c.write_policy, 16),
        slug(&c.replacement, 16),
        slug(&c.cache_size, 8),
        dev(&c.cache_device),
        dev(&c.backing),
        slug(&c.fetch, 8),
        slug(&c.admission, 16),
        fnv1a(canon.as_bytes()) & 0xffff_ffff_ffff
    )
}

fn cells_dir(out: &Path) -> PathBuf {
    out.join("cells")
}

fn cell_path(out: &Path, id: &str) -> PathBuf {
    cells_dir(out).join(format!("{id}.json"))
}

/// The cell's file, if it exists and parses.
fn read_cell(out: &Path, id: &str) -> Option<CellFile> {
    let text = std::fs::read_to_string(cell_path(out, id)).ok()?;
    serde_json::from_str(&text).ok()
}

fn is_complete(out: &Path, id: &str) -> bool {
    read_cell(out, id)
        .is_some_and(|c| c.status == "ok" && c.result.as_ref().is_some_and(Value::is_object))
}

/// Writes a cell file atomically (temporary file in the same directory, then rename).
fn write_cell(out: &Path, f: &CellFile) -> Result<()> {
    let dir = cells_dir(out);
    let tmp = dir.join(format!(".{}.{}.tmp", f.id, std::process::id()));
    let text = serde_json::to_string_pretty(f)? + "\n";
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, cell_path(out, &f.id))
        .with_context(|| format!("renaming {}", tmp.display()))?;
    Ok(())
}

type PlanKey = (String, String, String, Option<u64>);
type PlanSlot = Arc<OnceLock<std::result::Result<Arc<nvwc_sim::TracePlan>, String>>>;

/// Trace plans shared between cells (scanned once per trace, backing model,
/// block size and limit, by whichever worker needs one first).
#[derive(Default)]
struct Plans(Mutex<HashMap<PlanKey, PlanSlot>>);

impl Plans {
    fn get(
        &self,
        c: &CellConfig,
        base: &SimConfig,
    ) -> std::result::Result<Arc<nvwc_sim::TracePlan>, String> {
        let key = (
            c.trace.clone(),
            c.backing.clone(),
            c.block_size.clone(),
            c.limit,
        );
        let slot = self
            .0
            .lock()
            .expect("plans")
            .entry(key)
            .or_default()
            .clone();
        slot.get_or_init(|| {
            let trace = Path::new(&c.trace);
            if !trace.exists() {
                return Err(format!("trace {} not found", trace.display()));
            }
            scan_plan(trace, base, c.limit)
                .map(Arc::new)
                .map_err(|e| format!("{e:#}"))
        })
        .clone()
    }
}

/// The simulator configuration of a cell.
fn sim_config(c: &CellConfig) -> Result<SimConfig> {
    let policy: WritePolicyKind = c
        .write_policy
        .parse()
        .map_err(|e| anyhow::anyhow!("write policy {:?}: {e}", c.write_policy))?;
    let backing = parse_device(&c.backing)?;
    let bs = parse_size(&c.block_size).map_err(|e| anyhow::anyhow!("block size: {e}"))?;
    let track = track_blocks_of(&backing, bs)?;
    let repl: ReplacementKind = parse_replacement(&c.replacement, track)?;
    let size = parse_size(&c.cache_size).map_err(|e| anyhow::anyhow!("cache size: {e}"))?;
    let mut s = SimConfig::new(policy, repl, size);
    s.block_size = u32::try_from(bs).context("block size")?;
    s.backing_qd = default_backing_qd(&backing);
    s.backing = backing;
    s.cache_device = parse_device(&c.cache_device)?;
    s.qd = c.qd;
    let fetch: FetchMode = c
        .fetch
        .parse()
        .map_err(|e| anyhow::anyhow!("fetch mode {:?}: {e}", c.fetch))?;
    s.tuning.fetch = Some(fetch);
    let adm: AdmissionKind = c
        .admission
        .parse()
        .map_err(|e| anyhow::anyhow!("admission {:?}: {e}", c.admission))?;
    s.tuning.admission = Some(adm);
    Ok(s)
}

/// Runs one cell and returns its file's contents.
fn run_cell(cell: &Cell, plans: &Plans) -> CellFile {
    let r = (|| -> std::result::Result<Value, String> {
        let cfg = sim_config(&cell.config).map_err(|e| format!("{e:#}"))?;
        let plan = plans.get(&cell.config, &cfg)?;
        let r = nvwc_sim::run_plan(&cfg, &plan, cell.config.limit).map_err(|e| e.to_string())?;
        serde_json::to_value(&r).map_err(|e| e.to_string())
    })();
    let (status, error, result) = match r {
        Ok(r) => ("ok", None, Some(r)),
        Err(e) => ("failed", Some(e), None),
    };
    CellFile {
        id: cell.id.clone(),
        config: cell.config.clone(),
        status: status.into(),
        error,
        result,
    }
}

/// `nvwc sweep`.
pub fn run(a: Args) -> Result<ExitCode> {
    let spec = Spec::from_args(&a)?;
    let all = spec.cells();
    let out = &a.out;
    if a.list {
        for c in &all {
            println!(
                "{}",
                serde_json::json!({"id": c.id, "config": c.config, "done": is_complete(out, &c.id)})
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    std::fs::create_dir_all(cells_dir(out))
        .with_context(|| format!("creating {}", cells_dir(out).display()))?;
    if !a.summarize {
        let chosen: Vec<&Cell> = if a.cell.is_empty() {
            all.iter().collect()
        } else {
            let mut v = Vec::new();
            for id in &a.cell {
                match all.iter().find(|c| &c.id == id) {
                    Some(c) => v.push(c),
                    None => bail!("no cell {id:?} in this sweep (see --list)"),
                }
            }
            v
        };
        let todo: Vec<&Cell> = chosen
            .iter()
            .copied()
            .filter(|c| a.force || !is_complete(out, &c.id))
            .collect();
        if !a.quiet {
            eprintln!(
                "sweep: {} cells, {} already complete, running {}",
                chosen.len(),
                chosen.len() - todo.len(),
                todo.len()
            );
        }
        let pb = if a.quiet {
            ProgressBar::hidden()
        } else {
            ProgressBar::new(todo.len() as u64)
        };
        pb.set_style(
            ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} cells (eta {eta}) {msg}",
            )
            .expect("template")
            .progress_chars("=> "),
        );
        let plans = Plans::default();
        let next = AtomicUsize::new(0);
        let write_errors: Mutex<Vec<String>> = Mutex::new(Vec::new());
        let threads = a
            .threads
            .unwrap_or_else(default_threads)
            .clamp(1, todo.len().max(1));
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(cell) = todo.get(i) else { break };
                    let f = run_cell(cell, &plans);
                    if let Some(e) = &f.error {
                        pb.println(format!("cell {} failed: {e}", cell.id));
                    }
                    if let Err(e) = write_cell(out, &f) {
                        write_errors.lock().expect("errors").push(format!("{e:#}"));
                    }
                    pb.set_message(cell.id.clone());
                    pb.inc(1);
                });
            }
        });
        pb.finish_and_clear();
        if let Some(e) = write_errors.into_inner().expect("errors").first() {
            bail!("{e}");
        }
        if !a.cell.is_empty() {
            let failed = chosen.iter().filter(|c| !is_complete(out, &c.id)).count();
            return Ok(if failed > 0 {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            });
        }
    }
    let failed = summarize(out, &all, a.quiet)?;
    Ok(if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// An unsigned field of a result (0 when absent).
fn gu(r: &Value, k: &str) -> u64 {
    r.get(k).and_then(Value::as_u64).unwrap_or(0)
}

/// A float field of a result (NaN when absent or null).
fn gf(r: &Value, k: &str) -> f64 {
    r.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// Writes summary.md, summary.csv and plots/ from the cell files; returns
/// the number of cells that are not complete (failed or missing).
fn summarize(out: &Path, cells: &[Cell], quiet: bool) -> Result<usize> {
    let files: Vec<(&Cell, Option<CellFile>)> =
        cells.iter().map(|c| (c, read_cell(out, &c.id))).collect();
    let cols = [
        "id",
        "trace",
        "write_policy",
        "replacement",
        "cache_size",
        "cache_device",
        "backing",
        "fetch",
        "admission",
        "status",
        "requests",
        "read_hit_ratio",
        "write_hit_ratio",
        "backing_writes",
        "write_amplification",
        "throughput_iops",
        "latency_us_p50",
        "latency_us_p99",
        "stalled_writes",
        "error",
    ];
    let mut csv = cols.join(",") + "\n";
    let mut md = String::from("# Sweep summary\n\n");
    let mut failed = Vec::new();
    let mut rows = Vec::new();
    for (c, f) in &files {
        let k = &c.config;
        let (status, err, r) = match f {
            Some(f) => (f.status.as_str(), f.error.clone(), f.result.as_ref()),
            None => ("missing", None, None),
        };
        if status != "ok" || r.is_none() {
            failed.push((c.id.clone(), status, err.clone().unwrap_or_default()));
        }
        let ratio = |h: u64, m: u64| {
            if h + m > 0 {
                format!("{:.4}", h as f64 / (h + m) as f64)
            } else {
                String::new()
            }
        };
        let num = |f: &dyn Fn(&Value) -> String| r.map(f).unwrap_or_default();
        let row = vec![
            c.id.clone(),
            k.trace.clone(),
            k.write_policy.clone(),
            k.replacement.clone(),
            k.cache_size.clone(),
            k.cache_device.clone(),
            k.backing.clone(),
            k.fetch.clone(),
            k.admission.clone(),
            status.to_string(),
            num(&|r| gu(r, "requests").to_string()),
            num(&|r| ratio(gu(r, "read_hits"), gu(r, "read_misses"))),
            num(&|r| ratio(gu(r, "write_hits"), gu(r, "write_misses"))),
            num(&|r| gu(r, "backing_writes").to_string()),
            num(&|r| format!("{:.3}", gf(r, "write_amplification"))),
            num(&|r| format!("{:.1}", gf(r, "throughput_iops"))),
            num(&|r| format!("{:.1}", gf(r, "latency_us_p50"))),
            num(&|r| format!("{:.1}", gf(r, "latency_us_p99"))),
            num(&|r| gu(r, "stalled_writes").to_string()),
            err.unwrap_or_default(),
        ];
        csv += &row
            .iter()
            .map(|s| csv_field(s))
            .collect::<Vec<_>>()
            .join(",");
        csv.push('\n');
        rows.push(row);
    }
    let ok = files.len() - failed.len();
    md += &format!(
        "{} cells: {} complete, {} failed or missing.\n\n",
        files.len(),
        ok,
        failed.len()
    );
    // The markdown table leaves out the id and the error (they are in the CSV).
    md += &format!("| {} |\n", cols[1..cols.len() - 1].join(" | "));
    md += &format!("|{}\n", "---|".repeat(cols.len() - 2));
    for row in &rows {
        let cells: Vec<String> = row[1..row.len() - 1]
            .iter()
            .map(|s| s.replace('|', "\\|"))
            .collect();
        md += &format!("| {} |\n", cells.join(" | "));
    }
    if !failed.is_empty() {
        md += "\n## Failed or missing cells\n\n";
        for (id, status, e) in &failed {
            md += &format!("- `{id}` ({status}): {}\n", e.replace('\n', " "));
        }
    }
    let plot_dir = out.join("plots");
    std::fs::create_dir_all(&plot_dir)?;
    let mut plots = Vec::new();
    let mut traces: Vec<&str> = Vec::new();
    for c in cells {
        if !traces.contains(&c.config.trace.as_str()) {
            traces.push(&c.config.trace);
        }
    }
    for t in traces {
        let results: Vec<(&CellConfig, &Value)> = files
            .iter()
            .filter(|(c, _)| c.config.trace == t)
            .filter_map(|(c, f)| {
                f.as_ref()
                    .and_then(|f| f.result.as_ref())
                    .map(|r| (&c.config, r))
            })
            .collect();
        if results.is_empty() {
            continue;
        }
        let name = Path::new(t)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| t.to_string());
        let safe: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || ".-_".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = plot_dir.join(format!("{safe}.svg"));
        nvwc_sim::plot::render(&charts(&name, &results), 2, (640, 440), &path)
            .with_context(|| format!("plotting {}", path.display()))?;
        plots.push(path);
    }
    if !plots.is_empty() {
        md += "\n## Plots\n\n";
        for p in &plots {
            let rel = p.strip_prefix(out).unwrap_or(p);
            md += &format!("![{}]({})\n", rel.display(), rel.display());
        }
    }
    std::fs::write(out.join("summary.csv"), csv)?;
    std::fs::write(out.join("summary.md"), md)?;
    if !quiet {
        println!(
            "{:<70} {:>8} {:>10} {:>10} {:>7} {:>10}",
            "cell", "status", "requests", "bk_writes", "WA", "IOPS"
        );
        for row in &rows {
            println!(
                "{:<70} {:>8} {:>10} {:>10} {:>7} {:>10}",
                row[0], row[9], row[10], row[13], row[14], row[15]
            );
        }
        eprintln!(
            "sweep: {ok}/{} cells complete; summary in {}",
            files.len(),
            out.join("summary.md").display()
        );
    }
    for (id, status, e) in &failed {
        eprintln!("nvwc sweep: cell {id} {status}: {e}");
    }
    Ok(failed.len())
}

/// Backing writes and throughput against cache size for one trace, one line
/// per combination of the other swept dimensions.
fn charts(trace: &str, results: &[(&CellConfig, &Value)]) -> Vec<Chart> {
    let points: Vec<SizePoint> = results
        .iter()
        .map(|(c, r)| SizePoint {
            key: format!(
                "{} / {} / {} / {} / {} / {}",
                c.write_policy, c.replacement, c.cache_device, c.backing, c.fetch, c.admission
            ),
            cache_bytes: gu(r, "cache_size_bytes") as f64,
            backing_writes: gu(r, "backing_writes") as f64,
            throughput: gf(r, "throughput_iops"),
        })
        .collect();
    size_charts(trace, &points)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cell_ids_are_stable_and_distinct() {
        let c = CellConfig {
            trace: "../shared/traces/x.vscsi".into(),
            write_policy: "wb".into(),
            replacement: "lru".into(),
            cache_size: "1M".into(),
            cache_device: "nvdram".into(),
            backing: "net".into(),
            fetch: "blocking".into(),
            admission: "all".into(),
            limit: Some(10),
            qd: 1,
            block_size: "4k".into(),
        };
        let id = cell_id(&c);
        assert!(
            id.starts_with("x.vscsi-wb-lru-1M-nvdram-net-blocking-all-"),
            "{id}"
        );
        assert_eq!(id, cell_id(&c.clone()));
        let mut d = c.clone();
        d.limit = Some(11);
        assert_ne!(id, cell_id(&d));
    }
}
