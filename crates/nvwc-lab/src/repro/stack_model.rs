//! `nvwc repro stack-model`: Pâris, Haining & Long (2000), Table 1 and
//! Figure 2, with our traces on the HP 97560 disk model.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use anyhow::Result;
use nvwc_core::{ReplacementKind, WritePolicyKind};
use nvwc_mrc::{kneedle, most_prominent, CurveShape, Histogram, StackDistance};
use nvwc_sim::device::{build, DeviceSpec};
use nvwc_sim::plot::{render, Axis, Chart, LinePlot, Series};
use nvwc_sim::sweep::Job;
use nvwc_sim::{default_backing_qd, format_size, Mode, RunResult, SimConfig, TracePlan};
use nvwc_trace::{Op, TraceRecord};

use super::common::{img, prose_size, quick_or, range, results, thousands, Args};
use super::stack_model_claims as claims;
use super::stack_model_sensitivity as sensitivity;
use super::template::{template, Values};
use crate::runs::{parse_replacement, scan_plan, track_blocks_of};

/// Exact LRU stack-distance histogram of a trace's writes (or all accesses),
/// per block of `bs` bytes, over the first `limit` records; with the last
/// timestamp and the largest write (bytes).
fn write_histogram(
    path: &Path,
    bs: u64,
    limit: Option<u64>,
    writes_only: bool,
) -> Result<(Histogram, u64, u64)> {
    let mut sd = StackDistance::new();
    let mut h = Histogram::new();
    let mut n = 0u64;
    let mut last_ts = 0u64;
    let mut max_write = 0u64;
    for r in nvwc_trace::open_path(path, None, &nvwc_trace::ReaderOptions::default())? {
        let r: TraceRecord = match r {
            Ok(r) => r,
            Err(e) if e.is_fatal() => return Err(e.into()),
            Err(_) => continue,
        };
        if limit.is_some_and(|l| n >= l) {
            break;
        }
        n += 1;
        last_ts = r.ts_ns;
        if r.op == Op::Write {
            max_write = max_write.max(r.len);
        }
        let take = r.op == Op::Write || (!writes_only && r.op == Op::Read);
        if !take || r.len == 0 {
            continue;
        }
        for b in r.offset / bs..=(r.end() - 1) / bs {
            h.record(sd.access((r.dev as u64) << 44 | b));
        }
    }
    Ok((h, last_ts, max_write))
}

/// The most prominent Kneedle knee of the miss-ratio curve within cache
/// sizes `1..=max` blocks (None if the curve has no knee there).
pub(super) fn knee_within(h: &Histogram, max: u64) -> Option<u64> {
    let n = max.clamp(3, 400);
    let pts: Vec<(f64, f64)> = (1..=n)
        .map(|i| {
            let s = (max * i).div_ceil(n);
            (s as f64, h.miss_ratio(s))
        })
        .collect::<Vec<_>>();
    let mut dedup: Vec<(f64, f64)> = Vec::new();
    for p in pts {
        if dedup.last().is_none_or(|q| q.0 < p.0) {
            dedup.push(p);
        }
    }
    let knees = kneedle(
        &dedup,
        CurveShape::ConvexDecreasing,
        nvwc_mrc::DEFAULT_SENSITIVITY,
    );
    most_prominent(&knees).map(|k| k.x as u64)
}

pub(super) struct StackTrace {
    pub(super) file: &'static str,
    pub(super) label: &'static str,
    pub(super) limit: Option<u64>,
}

/// Stack-model load rule: traces faster than this mean rate are slowed to it.
const TARGET_RATE: f64 = 10.0;
/// Cache sizes, in percent of a trace's write working set: Table 1 uses the
/// first, Figure 2 all three.
pub(super) const SIZE_PCT: [u64; 3] = [1, 2, 4];
/// The smallest cache, in blocks.
const MIN_BLOCKS: u64 = 32;
/// Cache block size.
pub(super) const BS: u64 = 4096;
/// Dirty watermarks: cleaning starts at the first, LRU and LST stop at the second.
pub(super) const WATERMARKS: (f64, f64) = (0.9, 0.5);

/// A trace's plan, write MRC, cache sizes (blocks) and replay time scale.
pub(super) struct Planned {
    pub(super) plan: Arc<TracePlan>,
    pub(super) hist: Histogram,
    pub(super) sizes: Vec<u64>,
    rate: f64,
    speedup: f64,
    /// The largest write request (bytes).
    max_write: u64,
}

/// The setup every run shares.
pub(super) struct Setup {
    traces: [StackTrace; 2],
    pub(super) base: SimConfig,
    pub(super) track: Option<u64>,
}

fn setup(a: &Args) -> Result<Setup> {
    let traces = [
        StackTrace {
            file: "cloudPhysicsIO.vscsi",
            label: "CloudPhysics",
            limit: if a.quick { Some(20_000) } else { None },
        },
        StackTrace {
            file: "msr.cut.per_10k.rw_40_60.1370.trace",
            label: "MSR cut",
            limit: None,
        },
    ];
    let backing: DeviceSpec = "hdd-hp97560".parse()?;
    let track = track_blocks_of(&backing, BS)?;
    let mut base = SimConfig::new(WritePolicyKind::WriteBack, ReplacementKind::Lru, 0);
    base.backing = backing.clone();
    base.cache_device = "nvdram".parse()?;
    base.backing_qd = default_backing_qd(&backing);
    base.mode = Mode::Open;
    base.speedup = 1.0;
    base.tuning.read_allocate = Some(false);
    base.tuning.watermarks = Some(WATERMARKS);
    Ok(Setup {
        traces,
        base,
        track,
    })
}

/// Scans each trace and measures its write MRC and mean request rate.
pub(super) fn plan_traces(a: &Args, s: &Setup, traces: &[StackTrace]) -> Result<Vec<Planned>> {
    let mut ts = Vec::new();
    for t in traces {
        let path = a.traces.as_ref().expect("resolved in run").join(t.file);
        let plan = Arc::new(scan_plan(&path, &s.base, t.limit)?);
        let (hist, dur, max_write) = write_histogram(&path, BS, t.limit, true)?;
        let w = plan.unique_write_blocks;
        let sizes: Vec<u64> = SIZE_PCT
            .iter()
            .map(|p| (w * p / 100).max(MIN_BLOCKS))
            .collect();
        let rate = plan.records as f64 / (dur as f64 / 1e9).max(1e-9);
        let speedup = (TARGET_RATE / rate).min(1.0);
        ts.push(Planned {
            plan,
            hist,
            sizes,
            rate,
            speedup,
            max_write,
        });
    }
    Ok(ts)
}

/// The table of traces: size, rate, scale, working set, cache and knee.
fn traces_table(s: &Setup, ts: &[Planned]) -> Result<String> {
    let mut md = String::new();
    writeln!(md, "| trace | requests | mean rate | time scale | write working set | cache ({} %) | mapping | MRC knee within the cache |", SIZE_PCT[0])?;
    writeln!(md, "|---|---:|---:|---:|---:|---:|---|---:|")?;
    for (t, x) in s.traces.iter().zip(ts) {
        let c = x.sizes[0];
        let k = knee_within(&x.hist, c);
        writeln!(
            md,
            "| {} | {} | {:.1} req/s | ×{:.3} | {} blocks ({}) | {} blocks ({}) | {} | {} |",
            t.label,
            x.plan.records,
            x.rate,
            x.speedup,
            x.plan.unique_write_blocks,
            format_size(x.plan.unique_write_blocks * BS),
            c,
            format_size(c * BS),
            x.plan.mapping,
            k.map_or("none".to_string(), |k| format!(
                "{k} blocks ({:.0} % of the cache)",
                100.0 * k as f64 / c as f64
            )),
        )?;
    }
    Ok(md)
}

/// The paper's Table 1: (trace, writes to disk, stalled writes, overwrites)
/// for LRU, LST and the new policy.
type PaperRow = (&'static str, [u32; 3], [u32; 3], [u32; 3]);
const PAPER_TABLE1: [PaperRow; 2] = [
    (
        "Snake 5",
        [33538, 33895, 32758],
        [418, 85, 97],
        [79678, 76061, 79980],
    ),
    (
        "Snake 6",
        [57059, 54057, 59592],
        [398, 0, 0],
        [143191, 141814, 145871],
    ),
];

/// One run of trace `t` (planned as `x`) with replacement `repl` and a
/// cache of `c` blocks.
pub(super) fn job(
    s: &Setup,
    t: &StackTrace,
    x: &Planned,
    repl: &str,
    c: u64,
    label: String,
) -> Result<Job> {
    let mut cfg = s.base.clone();
    cfg.speedup = x.speedup;
    cfg.replacement = parse_replacement(repl, s.track)?;
    cfg.cache_bytes = c * BS;
    cfg.label = label;
    Ok(Job {
        cfg,
        plan: x.plan.clone(),
        limit: t.limit,
    })
}

/// Table 1's runs: each trace at its smallest cache under LRU, LST, the
/// stack policy at the MRC knee and the stack policy with an online knee.
fn table1_runs(a: &Args, s: &Setup, ts: &[Planned]) -> Result<Vec<RunResult>> {
    let mut jobs = Vec::new();
    for (t, x) in s.traces.iter().zip(ts) {
        let c = x.sizes[0];
        let knee = knee_within(&x.hist, c).unwrap_or(c / 2);
        for (name, r) in [
            ("LRU", "lru".to_string()),
            ("LST", "lst".to_string()),
            ("New (stack, MRC knee)", format!("stack:knee={knee}")),
            ("stack, online knee", "stack".to_string()),
        ] {
            jobs.push(job(s, t, x, &r, c, format!("{}|{name}", t.label))?);
        }
    }
    results(&jobs, a)
}

/// The runs of one trace, in Table 1's column order.
fn of_trace<'a>(res: &'a [RunResult], label: &str) -> Vec<&'a RunResult> {
    res.iter()
        .filter(|r| r.label.starts_with(&format!("{label}|")))
        .collect()
}

fn table1(s: &Setup, res: &[RunResult]) -> Result<String> {
    let mut md = String::new();
    for (t, p) in s.traces.iter().zip(&PAPER_TABLE1) {
        let rs = of_trace(res, t.label);
        writeln!(
            md,
            "**{}** (cache {}; ours), with the paper's {} beside it:\n",
            t.label,
            format_size(rs[0].cache_size_bytes),
            p.0
        )?;
        writeln!(md, "| metric | LRU | LST | New (stack, MRC knee) | stack, online knee | paper LRU | paper LST | paper New |")?;
        writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|")?;
        let row = |f: &dyn Fn(&RunResult) -> String| {
            rs.iter().map(|r| f(r)).collect::<Vec<_>>().join(" | ")
        };
        let paper = |v: &[u32; 3]| v.map(|x| x.to_string()).join(" | ");
        let rows: [(&str, String, String); 7] = [
            (
                "writes to disk (block writes)",
                row(&|r| format!("{} ({})", r.backing_write_ops, r.backing_writes)),
                paper(&p.1),
            ),
            (
                "stalled writes",
                row(&|r| r.queued_writes.to_string()),
                paper(&p.2),
            ),
            (
                "cache overwrites",
                row(&|r| r.overwrites.to_string()),
                paper(&p.3),
            ),
            (
                "mean segment (blocks per disk write)",
                row(&|r| format!("{:.2}", segment(r))),
                "| |".into(),
            ),
            (
                "engine `stalled_writes` (block pieces)",
                row(&|r| r.stalled_writes.to_string()),
                "| |".into(),
            ),
            (
                "write p99 latency (ms)",
                row(&|r| format!("{:.1}", r.latency_write.p99_us / 1e3)),
                "| |".into(),
            ),
            (
                "dirty at end",
                row(&|r| format_size(r.dirty_bytes_end)),
                "| |".into(),
            ),
        ];
        for (name, ours, theirs) in rows {
            writeln!(md, "| {name} | {ours} | {theirs} |")?;
        }
        writeln!(md)?;
    }
    Ok(md)
}

/// Blocks per disk write command.
pub(super) fn segment(r: &RunResult) -> f64 {
    r.backing_writes as f64 / r.backing_write_ops.max(1) as f64
}

/// Figure 2's runs: the stack policy with a fixed hot region, per trace,
/// cache size and fraction.
fn figure2_runs(a: &Args, s: &Setup, ts: &[Planned], fracs: &[f64]) -> Result<Vec<RunResult>> {
    let mut jobs = Vec::new();
    for (t, x) in s.traces.iter().zip(ts) {
        for &c in &x.sizes {
            for &f in fracs {
                let k = ((c as f64 * f).round() as u64).max(1);
                let label = format!("{}|{c}|{f}", t.label);
                jobs.push(job(s, t, x, &format!("stack:knee={k}"), c, label)?);
            }
        }
    }
    results(&jobs, a)
}

/// Relative change (percent) from the first to the last of `v`, if it has two.
fn change(v: &[f64]) -> Option<f64> {
    (v.len() >= 2).then(|| 100.0 * (v[v.len() - 1] - v[0]) / v[0].max(1.0))
}

/// Figure 2's (before, after) changes of one cache: disk writes against
/// the hot-region fraction `pts` up to and from the knee fraction `kf`.
fn changes(pts: &[(f64, f64)], kf: Option<f64>) -> (Option<f64>, Option<f64>) {
    let Some(kf) = kf else {
        return (None, None);
    };
    let side = |f: &dyn Fn(f64) -> bool| -> Vec<f64> {
        pts.iter().filter(|p| f(p.0)).map(|p| p.1).collect()
    };
    (change(&side(&|x| x <= kf)), change(&side(&|x| x >= kf)))
}

/// Disk write commands per hot-region fraction for one trace and cache size.
fn fig2_points(res2: &[RunResult], label: &str, c: u64, fracs: &[f64]) -> Vec<(f64, f64)> {
    fracs
        .iter()
        .map(|&f| {
            let r = res2
                .iter()
                .find(|r| r.label == format!("{label}|{c}|{f}"))
                .expect("run");
            (f, r.backing_write_ops as f64)
        })
        .collect()
}

/// Figure 2's tables (one per trace) and its plot.
fn figure2(
    a: &Args,
    s: &Setup,
    ts: &[Planned],
    fracs: &[f64],
    res2: &[RunResult],
) -> Result<String> {
    let mut md = String::new();
    let mut charts = Vec::new();
    for (t, x) in s.traces.iter().zip(ts) {
        let mut series = Vec::new();
        let mut vlines = Vec::new();
        writeln!(
            md,
            "**{}** — disk writes per hot-region fraction:\n",
            t.label
        )?;
        write!(md, "| cache | knee (fraction) |")?;
        for f in fracs {
            write!(md, " {f} |")?;
        }
        writeln!(md, " change before knee | change after knee |")?;
        writeln!(md, "|---|---:|{}---:|---:|", "---:|".repeat(fracs.len()))?;
        for &c in &x.sizes {
            let pts = fig2_points(res2, t.label, c, fracs);
            let knee = knee_within(&x.hist, c).map(|k| k as f64 / c as f64);
            if let Some(kf) = knee {
                vlines.push((kf, format!("knee {}", format_size(c * BS))));
            }
            let pct = |x: Option<f64>| x.map_or("n/a".into(), |x| format!("{x:+.1} %"));
            let (before, after) = changes(&pts, knee);
            let (before, after) = (pct(before), pct(after));
            let cells: Vec<String> = pts.iter().map(|p| format!("{}", p.1)).collect();
            writeln!(
                md,
                "| {} | {} | {} | {before} | {after} |",
                format_size(c * BS),
                knee.map_or("none".into(), |k| format!("{k:.2}")),
                cells.join(" | "),
            )?;
            series.push(Series {
                name: format!("cache {}", format_size(c * BS)),
                points: pts,
            });
        }
        writeln!(md)?;
        charts.push(Chart::Line(LinePlot {
            title: format!("{}: writes to disk vs hot region", t.label),
            x_label: "hot region s_knee / cache size".into(),
            y_label: "disk write commands".into(),
            x_axis: Axis::Linear,
            y_axis: Axis::Linear,
            series,
            vlines,
            y_from_zero: false,
        }));
    }
    render(&charts, 2, (640, 440), &img(a, "stack-model-fig2.png"))?;
    Ok(md)
}

/// The write miss-ratio curves with the knees (the paper's Figure 1 analogue).
fn mrc_figure(a: &Args, s: &Setup, ts: &[Planned]) -> Result<()> {
    let mrc_charts: Vec<Chart> = s
        .traces
        .iter()
        .zip(ts)
        .map(|(t, x)| {
            let max = x.sizes[2] * 2;
            let pts: Vec<(f64, f64)> = (1..=200u64)
                .map(|i| {
                    let s = (max * i / 200).max(1);
                    ((s * BS) as f64, x.hist.miss_ratio(s))
                })
                .collect();
            Chart::Line(LinePlot {
                title: format!("{}: write miss-ratio curve", t.label),
                x_label: "cache size".into(),
                y_label: "write miss ratio".into(),
                x_axis: Axis::LinearBytes,
                y_axis: Axis::Linear,
                series: vec![Series {
                    name: "LRU (exact)".into(),
                    points: pts,
                }],
                vlines: x
                    .sizes
                    .iter()
                    .filter_map(|&c| {
                        knee_within(&x.hist, c)
                            .map(|k| ((k * BS) as f64, format!("knee ≤{}", format_size(c * BS))))
                    })
                    .collect(),
                y_from_zero: true,
            })
        })
        .collect();
    render(&mrc_charts, 2, (640, 440), &img(a, "stack-model-mrc.png"))?;
    Ok(())
}

/// `nvwc repro stack-model`: the report's Markdown.
pub fn stack_model(a: &Args) -> Result<String> {
    let s = setup(a)?;
    let ts = plan_traces(a, &s, &s.traces)?;
    let res = table1_runs(a, &s, &ts)?;
    // Figure 2: hot-region fractions of the cache.
    let fracs = quick_or(
        a.quick,
        &[0.1, 0.3, 0.5, 0.7, 0.9],
        &[0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9],
    );
    let res2 = figure2_runs(a, &s, &ts, &fracs)?;
    let mut v = Values::new();
    v.set("backing", "hdd-hp97560")
        .set("trace_a", s.traces[0].file)
        .set("trace_b", s.traces[1].file)
        .set("label_b", s.traces[1].label)
        .set("pct_small", SIZE_PCT[0])
        .set("pct_mid", SIZE_PCT[1])
        .set("pct_large", SIZE_PCT[2])
        .set("block", prose_size(BS))
        .set("min_blocks", MIN_BLOCKS)
        .set("small_b", prose_size(ts[1].sizes[0] * BS))
        .set("high", format!("{:.0}", WATERMARKS.0 * 100.0))
        .set("low", format!("{:.0}", WATERMARKS.1 * 100.0))
        .set("track", s.track.unwrap_or(0))
        .set("rate", TARGET_RATE)
        .set("traces_table", traces_table(&s, &ts)?)
        .set("table1", table1(&s, &res)?)
        .set("figure2", figure2(a, &s, &ts, &fracs, &res2)?);
    disk_values(&mut v, &s)?;
    discussion(&mut v, &s, &ts, &res, &res2, &fracs);
    v.set("claims", claims_table(&s, &ts, &res, &res2, &fracs));
    let main: Vec<(&StackTrace, &Planned)> = s.traces.iter().zip(&ts).collect();
    v.set("sensitivity", sensitivity::section(a, &s, &main)?);
    mrc_figure(a, &s, &ts)?;
    let json = serde_json::to_string_pretty(&(&res, &res2))?;
    std::fs::write(img(a, "stack-model-runs.json"), json)?;
    Ok(template!("stack-model.md").fill(&v)?)
}

/// The verdict table, from Table 1's and Figure 2's runs.
fn claims_table(
    s: &Setup,
    ts: &[Planned],
    res: &[RunResult],
    res2: &[RunResult],
    fracs: &[f64],
) -> String {
    let t1: claims::Table1 = s
        .traces
        .iter()
        .map(|t| (t.label, of_trace(res, t.label)))
        .collect();
    let mut fig2 = Vec::new();
    for (t, x) in s.traces.iter().zip(ts) {
        for &c in &x.sizes {
            let knee = knee_within(&x.hist, c).map(|k| k as f64 / c as f64);
            if let (Some(b), Some(a)) = changes(&fig2_points(res2, t.label, c, fracs), knee) {
                fig2.push((format!("{} {}", t.label, format_size(c * BS)), b, a));
            }
        }
    }
    claims::table(&t1, &fig2)
}

/// How values `lo..=hi` compare with `x`, as "fewer disk writes than" etc.
fn compared(lo: u64, hi: u64, x: u64) -> &'static str {
    if hi < x {
        "fewer disk writes than"
    } else if lo > x {
        "more disk writes than"
    } else {
        "about as many disk writes as"
    }
}

/// The disk's parameters the prose quotes, from its model.
fn disk_values(v: &mut Values, s: &Setup) -> Result<()> {
    let DeviceSpec::Hdd(p) = &s.base.backing else {
        anyhow::bail!("the stack-model backing must be a disk model");
    };
    let cap = build(&s.base.backing, None)?.capacity_bytes();
    let spt = p.zones[0].sectors_per_track as u64;
    v.set("disk_gb", format!("{:.2}", cap as f64 / 1e9))
        .set("rpm", p.rpm)
        .set("spt", spt)
        .set("sector", p.sector_bytes)
        .set("track_size", prose_size(spt * p.sector_bytes as u64));
    Ok(())
}

/// The numbers of "Differences from the paper", from the runs. Table 1's
/// runs of a trace are, in order: LRU, LST, stack at the MRC knee, stack
/// with an online knee.
fn discussion(
    v: &mut Values,
    s: &Setup,
    ts: &[Planned],
    res: &[RunResult],
    res2: &[RunResult],
    fracs: &[f64],
) {
    let (cp, msr) = (
        of_trace(res, s.traces[0].label),
        of_trace(res, s.traces[1].label),
    );
    let ops = |rs: &[&RunResult], i: usize| rs[i].backing_write_ops;
    let ow = |rs: &[&RunResult], i: usize| rs[i].overwrites;
    let stack_ops = [ops(&cp, 2), ops(&cp, 3)];
    let (lo, hi) = (
        stack_ops[0].min(stack_ops[1]),
        stack_ops[0].max(stack_ops[1]),
    );
    let fewest = ops(&msr, 2) < ops(&msr, 0).min(ops(&msr, 1));
    let most_ow = [&cp, &msr]
        .iter()
        .all(|rs| ow(rs, 2).min(ow(rs, 3)) > ow(rs, 0).max(ow(rs, 1)));
    let stalls: Vec<u64> = res.iter().map(|r| r.queued_writes).collect();
    v.set("label_a", s.traces[0].label)
        .set("msr_requests", thousands(ts[1].plan.records))
        .set("msr_util", format!("{:.0}", msr[0].backing_utilisation * 100.0))
        .set("msr_verdict", if fewest { "makes the fewest disk writes" } else { "does not make the fewest disk writes" })
        .set("msr_new", thousands(ops(&msr, 2)))
        .set("msr_lru", thousands(ops(&msr, 0)))
        .set("msr_lst", thousands(ops(&msr, 1)))
        .set("cp_stack", range(&stack_ops, thousands))
        .set("cp_vs_lru", compared(lo, hi, ops(&cp, 0)))
        .set("cp_lru", thousands(ops(&cp, 0)))
        .set("cp_vs_lst", compared(lo, hi, ops(&cp, 1)))
        .set("cp_lst", thousands(ops(&cp, 1)))
        .set("cp_max_write", prose_size(ts[0].max_write))
        .set("cp_max_slots", ts[0].max_write.div_ceil(BS))
        .set("cp_seg_lst", format!("{:.1}", segment(cp[1])))
        .set("cp_seg_stack", range(&[segment(cp[2]), segment(cp[3])], |x| format!("{x:.1}")))
        .set("cp_seg_lru", format!("{:.1}", segment(cp[0])))
        .set(
            "overwrite_verdict",
            if most_ow {
                "As in the paper, the stack policy overwrites data in the cache most often on both traces"
            } else {
                "Unlike the paper, the stack policy does not overwrite data in the cache most often on both traces"
            },
        )
        .set("cp_ow_stack", format!("{}/{}", thousands(ow(&cp, 2)), thousands(ow(&cp, 3))))
        .set("cp_ow_lru", thousands(ow(&cp, 0)))
        .set("cp_ow_lst", thousands(ow(&cp, 1)))
        .set("msr_ow_stack", format!("{}/{}", thousands(ow(&msr, 2)), thousands(ow(&msr, 3))))
        .set("msr_ow_lru", thousands(ow(&msr, 0)))
        .set("msr_ow_lst", thousands(ow(&msr, 1)))
        .set("stalls", range(&stalls, thousands))
        .set("cp_cache", prose_size(ts[0].sizes[0] * BS))
        .set("cp_p99", thousands((cp[0].latency_write.p99_us / 1e6).round() as u64))
        .set("cp_region", prose_size(ts[0].plan.map.region_bytes()))
        .set("msr_region", prose_size(ts[1].plan.map.region_bytes()));
    figure2_values(v, s, ts, res2, fracs);
}

/// Figure 2's numbers in the prose: the changes before and after the knee
/// on the second trace, the largest step and the knees on the first.
fn figure2_values(v: &mut Values, s: &Setup, ts: &[Planned], res2: &[RunResult], fracs: &[f64]) {
    let (mut before, mut after) = (Vec::new(), Vec::new());
    for &c in &ts[1].sizes {
        let pts = fig2_points(res2, s.traces[1].label, c, fracs);
        let (b, a) = changes(
            &pts,
            knee_within(&ts[1].hist, c).map(|k| k as f64 / c as f64),
        );
        before.extend(b);
        after.extend(a);
    }
    let mut jump = 0.0f64;
    let mut knees = Vec::new();
    for &c in &ts[0].sizes {
        let pts = fig2_points(res2, s.traces[0].label, c, fracs);
        for w in pts.windows(2) {
            jump = jump.max(100.0 * (w[1].1 - w[0].1).abs() / w[0].1.max(1.0));
        }
        knees.extend(knee_within(&ts[0].hist, c).map(|k| k as f64 / c as f64));
    }
    let pct = |v: &[f64]| {
        if v.is_empty() {
            "an unknown amount (no two measured points on that side of the knee)".to_string()
        } else {
            range(v, |x| format!("{x:+.0} %"))
        }
    };
    v.set("msr_before", pct(&before))
        .set("msr_after", pct(&after))
        .set("cp_jump", format!("{jump:.0} %"))
        .set("cp_knees", range(&knees, |k| format!("{k:.2}")));
}
