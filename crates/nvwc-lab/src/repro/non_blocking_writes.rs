//! `nvwc repro non-blocking-writes`: Campello, Lopez, Useche, Marmol,
//! Rangaswami, *Non-blocking Writes to Files* (FAST'15), Figures 5, 10 and 11,
//! on the nvwc engine (a cache block plays the page).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use nvwc_core::{FetchMode, ReplacementKind, WritePolicyKind};
use nvwc_sim::device::DeviceSpec;
use nvwc_sim::plot::{render, Axis, Chart, LinePlot, Series};
use nvwc_sim::sweep::Job;
use nvwc_sim::{default_backing_qd, format_size, RunResult, SimConfig, TracePlan};

use nvwc_trace::{CompactWriter, Op, TraceRecord};

use super::common::{img, prose_size, results, thousands, Args};
use super::non_blocking_writes_claims as claims;
use super::template::{template, Values};
use crate::runs::scan_plan;

/// The fetch modes compared: (label, mode, direct patch write-back).
const MODES: [(&str, FetchMode, bool); 5] = [
    ("blocking", FetchMode::Blocking, false),
    ("async", FetchMode::Async, false),
    ("async-bg", FetchMode::AsyncBg, false),
    ("lazy", FetchMode::Lazy, false),
    ("lazy+direct", FetchMode::Lazy, true),
];

/// A random-write workload in nvwc's compact trace format: `n` writes of
/// `size` bytes at `size`-aligned offsets in `span` bytes, then one FLUSH, so
/// a run ends only when every write is durable (patches included). A
/// fixed seed makes it the same every run.
fn synthetic(dir: &Path, size: u64, n: u64, span: u64, flush: bool) -> Result<PathBuf> {
    let path = dir.join(format!("nbw-randwrite-{size}-{flush}.nvwct"));
    let file =
        std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    let mut w = CompactWriter::new(std::io::BufWriter::new(file), None)?;
    let mut rng = nvwc_dev::rng::Rng::new(0x9E37_79B9_7F4A_7C15 ^ size);
    let slots = span / size;
    for i in 0..n {
        let z = rng.next_u64();
        let off = (z % slots) * size;
        w.write(&TraceRecord {
            ts_ns: i * 10_000,
            op: Op::Write,
            offset: off,
            len: size,
            fua: false,
            dev: 0,
            stream: 0,
        })?;
    }
    if flush {
        w.write(&TraceRecord {
            ts_ns: n * 10_000,
            op: Op::Flush,
            offset: 0,
            len: 0,
            fua: false,
            dev: 0,
            stream: 0,
        })?;
    }
    w.finish()?;
    Ok(path)
}

fn plan_of(path: &Path, base: &SimConfig, limit: Option<u64>) -> Result<Arc<TracePlan>> {
    Ok(Arc::new(scan_plan(path, base, limit)?))
}

fn job(base: &SimConfig, plan: &Arc<TracePlan>, label: String, f: impl Fn(&mut SimConfig)) -> Job {
    let mut cfg = base.clone();
    cfg.label = label;
    f(&mut cfg);
    Job {
        cfg,
        plan: plan.clone(),
        limit: None,
    }
}

/// Cache block size.
const BS: u64 = 4096;
/// Figures 10 and 11: writes outstanding (Filebench's threads).
const QD: u32 = 16;

/// Figure 5: the share of writes that would block, per trace and cache size.
fn figure5(a: &Args, base: &SimConfig) -> Result<(String, Vec<RunResult>)> {
    let mut md = String::new();
    let q = |n: u64| if a.quick { Some(n / 10) } else { Some(n) };
    let traces: Vec<(&str, &str, Option<u64>)> = vec![
        ("cloudPhysicsIO.vscsi", "CloudPhysics vSCSI", q(60_000)),
        ("msr.cut.per_10k.rw_40_60.1370.trace", "MSR cut", q(10_000)),
        ("mobigen.out.facebook", "MobiBench Facebook", None),
        ("mobigen.out.twitter", "MobiBench Twitter", None),
    ];
    let mut b5 = base.clone();
    b5.backing = "ssd".parse()?;
    b5.backing_qd = default_backing_qd(&b5.backing);
    let fracs = [1.0 / 64.0, 1.0 / 16.0, 0.25, 1.0, 2.0];
    let mut jobs = Vec::new();
    let mut plans = Vec::new();
    for (f, label, limit) in &traces {
        let plan = plan_of(
            &a.traces.as_ref().expect("resolved in run").join(f),
            &b5,
            *limit,
        )?;
        for &fr in &fracs {
            let blocks = ((plan.unique_blocks as f64 * fr) as u64).max(16);
            jobs.push(job(&b5, &plan, label.to_string(), |c| {
                c.cache_bytes = blocks * BS;
                c.tuning.fetch = Some(FetchMode::Blocking);
            }));
        }
        plans.push((label.to_string(), plan, *limit));
    }
    for j in &mut jobs {
        j.limit = plans.iter().find(|p| p.0 == j.cfg.label).and_then(|p| p.2);
    }
    let r5 = results(&jobs, a)?;
    writeln!(
        md,
        "| trace | requests | writes | working set | {} |",
        fracs
            .iter()
            .map(|f| format!("cache = {f}× ws"))
            .collect::<Vec<_>>()
            .join(" | ")
    )?;
    writeln!(md, "|---|---:|---:|---:|{}", "---:|".repeat(fracs.len()))?;
    let mut series5 = Vec::new();
    for (l, plan, _) in &plans {
        let rs: Vec<&RunResult> = r5.iter().filter(|r| &r.label == l).collect();
        let cells: Vec<String> = rs
            .iter()
            .map(|r| format!("{:.1} %", 100.0 * r.fetches as f64 / r.writes.max(1) as f64))
            .collect();
        writeln!(
            md,
            "| {l} | {} | {} | {} | {} |",
            rs[0].requests,
            rs[0].writes,
            format_size(plan.unique_blocks * BS),
            cells.join(" | ")
        )?;
        series5.push(Series {
            name: l.clone(),
            points: rs
                .iter()
                .map(|r| {
                    (
                        r.cache_size_bytes as f64,
                        100.0 * r.fetches as f64 / r.writes.max(1) as f64,
                    )
                })
                .collect(),
        });
    }
    render_line(
        a,
        "non-blocking-writes-fig5.png",
        LinePlot {
            title: "writes that would block (fetch-before-write per write)".into(),
            x_label: "cache size".into(),
            y_label: "% of writes".into(),
            x_axis: Axis::Log2Bytes,
            y_axis: Axis::Linear,
            series: series5,
            vlines: Vec::new(),
            y_from_zero: true,
        },
    )?;
    Ok((md, r5))
}

/// Figure 11's stream in `Streams::synth`: 2 KiB writes, no final FLUSH.
const FIG11_STREAM: usize = 4;

/// Figure 10's workload: the synthetic streams and the cache around them.
struct Streams {
    n: u64,
    cache: u64,
    patch_mem: u64,
    span: u64,
    sizes: [u64; 5],
    dir: PathBuf,
    /// (write size, ends with a FLUSH, trace file)
    synth: Vec<(u64, bool, PathBuf)>,
}

fn streams(a: &Args) -> Result<Streams> {
    // The cache holds every block the stream writes (no destage pressure, as
    // a page cache during a 60 s run); patch memory is 1/64 of it (64 MB of
    // 4 GB in the paper) and n × 512 B is over 5× the limit.
    let (n, cache, patch_mem) = if a.quick {
        (3_000u64, 16u64 << 20, 256u64 << 10)
    } else {
        (24_000u64, 128u64 << 20, 2u64 << 20)
    };
    let span = 16u64 << 30;
    let sizes = [512u64, 1024, 2048, 3072, 4096];
    let dir = std::env::temp_dir().join(format!("nvwc-repro-nbw-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut synth = Vec::new();
    for &s in &sizes {
        for flush in [false, true] {
            synth.push((s, flush, synthetic(&dir, s, n, span, flush)?));
        }
    }
    Ok(Streams {
        n,
        cache,
        patch_mem,
        span,
        sizes,
        dir,
        synth,
    })
}

/// The run of `rs` labelled `l` (a default result if it is missing).
fn find(rs: &[RunResult], l: &str) -> RunResult {
    rs.iter()
        .find(|r| r.label == l)
        .cloned()
        .unwrap_or_default()
}

/// Figure 10: IOPS per fetch mode and write size, acked and durable, on both backings.
fn figure10(a: &Args, base: &SimConfig, st: &Streams) -> Result<(String, Vec<RunResult>)> {
    let mut md = String::new();
    let mut jobs = Vec::new();
    let backings = ["hdd", "ssd"];
    for b in backings {
        let mut bb = base.clone();
        bb.backing = b.parse::<DeviceSpec>()?;
        bb.backing_qd = default_backing_qd(&bb.backing);
        bb.qd = QD;
        for (s, flush, p) in &st.synth {
            let plan = plan_of(p, &bb, None)?;
            for (name, m, direct) in MODES {
                jobs.push(job(&bb, &plan, format!("{b} {s} {flush} {name}"), |c| {
                    c.cache_bytes = st.cache;
                    c.tuning.fetch = Some(m);
                    c.tuning.patch_mem_bytes = Some(st.patch_mem);
                    c.tuning.patch_direct = Some(direct);
                }));
            }
        }
    }
    let r10 = results(&jobs, a)?;
    let mut charts = Vec::new();
    for b in backings {
        for flush in [false, true] {
            let what = if flush { "durable" } else { "acked" };
            writeln!(md, "**{b} backing, {what}** (IOPS, and × blocking):\n")?;
            writeln!(
                md,
                "| write size | {} | lazy fallbacks |",
                MODES.map(|m| m.0).join(" | ")
            )?;
            writeln!(md, "|---:|{}---:|", "---:|".repeat(MODES.len()))?;
            let mut series = mode_series();
            for &s in &st.sizes {
                let rs: Vec<RunResult> = MODES
                    .iter()
                    .map(|m| find(&r10, &format!("{b} {s} {flush} {}", m.0)))
                    .collect();
                let b0 = rs[0].throughput_iops.max(1e-9);
                let mut cells = Vec::new();
                for (i, r) in rs.iter().enumerate() {
                    series[i]
                        .points
                        .push((s as f64, r.throughput_iops.max(1.0)));
                    cells.push(if i == 0 {
                        format!("{:.0}", r.throughput_iops)
                    } else {
                        format!("{:.0} ({:.1}×)", r.throughput_iops, r.throughput_iops / b0)
                    });
                }
                writeln!(
                    md,
                    "| {} | {} | {} |",
                    format_size(s),
                    cells.join(" | "),
                    rs[3].patch_fallbacks
                )?;
            }
            writeln!(md)?;
            charts.push(Chart::Line(LinePlot {
                title: format!("random writes, {b} backing, {what}"),
                x_label: "write size (bytes)".into(),
                y_label: "IOPS".into(),
                x_axis: Axis::Linear,
                y_axis: Axis::Log10,
                series,
                vlines: Vec::new(),
                y_from_zero: false,
            }));
        }
    }
    render(
        &charts,
        2,
        (640, 440),
        &img(a, "non-blocking-writes-fig10.png"),
    )?;
    Ok((md, r10))
}

/// Figure 11's patch memory sizes: up to a third of what the 2 KiB stream
/// writes, so the limit is reached.
fn fig11_mems(quick: bool) -> Vec<u64> {
    [1u64, 2, 4, 8, 16, 32, 64]
        .iter()
        .map(|m| (m << 18) >> if quick { 3 } else { 0 })
        .collect()
}

/// Figure 11: 2 KiB writes on the disk against the patch memory limit.
fn figure11(a: &Args, base: &SimConfig, st: &Streams) -> Result<(String, Vec<RunResult>)> {
    let mut md = String::new();
    let mems = fig11_mems(a.quick);
    let mut bb = base.clone();
    bb.backing = "hdd".parse()?;
    bb.backing_qd = default_backing_qd(&bb.backing);
    bb.qd = QD;
    let p2k = plan_of(&st.synth[FIG11_STREAM].2, &bb, None)?;
    let mut jobs = Vec::new();
    for &mem in &mems {
        for (name, m, direct) in MODES {
            jobs.push(job(&bb, &p2k, format!("{mem} {name}"), |c| {
                c.cache_bytes = st.cache.max(2 * mem);
                c.tuning.fetch = Some(m);
                c.tuning.patch_mem_bytes = Some(mem);
                c.tuning.patch_direct = Some(direct);
            }));
        }
    }
    let r11 = results(&jobs, a)?;
    writeln!(
        md,
        "| patch memory | blocking IOPS | async | async-bg | lazy | lazy+direct | lazy fallbacks |"
    )?;
    writeln!(md, "|---:|---:|---:|---:|---:|---:|---:|")?;
    let mut series = mode_series();
    for &mem in &mems {
        let rs: Vec<RunResult> = MODES
            .iter()
            .map(|m| find(&r11, &format!("{mem} {}", m.0)))
            .collect();
        let b0 = rs[0].throughput_iops.max(1e-9);
        for (i, r) in rs.iter().enumerate() {
            series[i]
                .points
                .push((mem as f64, r.throughput_iops.max(1.0)));
        }
        writeln!(
            md,
            "| {} | {:.0} | {:.1}× | {:.1}× | {:.1}× | {:.1}× | {} |",
            format_size(mem),
            rs[0].throughput_iops,
            rs[1].throughput_iops / b0,
            rs[2].throughput_iops / b0,
            rs[3].throughput_iops / b0,
            rs[4].throughput_iops / b0,
            rs[3].patch_fallbacks
        )?;
    }
    render_line(
        a,
        "non-blocking-writes-fig11.png",
        LinePlot {
            title: "2 KiB random writes, hdd backing".into(),
            x_label: "patch memory".into(),
            y_label: "IOPS".into(),
            x_axis: Axis::Log2Bytes,
            y_axis: Axis::Log10,
            series,
            vlines: Vec::new(),
            y_from_zero: false,
        },
    )?;
    Ok((md, r11))
}

/// The stream parameters the prose quotes.
fn stream_values(v: &mut Values, st: &Streams) {
    assert!(
        st.patch_mem > 0 && st.cache.is_multiple_of(st.patch_mem),
        "patch memory divides the cache"
    );
    v.set("straddle", prose_size(st.sizes[3]))
        .set("patch_div", st.cache / st.patch_mem)
        .set("over", st.n * st.sizes[0] / st.patch_mem)
        .set("smallest", prose_size(st.sizes[0]))
        .set("control", prose_size(st.sizes[4]))
        .set("fig11_size", prose_size(st.synth[FIG11_STREAM].0));
}

/// The numbers of "Beside the paper": lazy over blocking on the disk, acked.
fn discussion(v: &mut Values, st: &Streams, r10: &[RunResult]) {
    let ratio = |s: u64| {
        let b = find(r10, &format!("hdd {s} false blocking")).throughput_iops;
        find(r10, &format!("hdd {s} false lazy")).throughput_iops / b.max(1e-9)
    };
    let max = st.sizes.iter().map(|&s| ratio(s)).fold(0.0, f64::max);
    let straddle = st.sizes[3];
    v.set("lazy_max", format!("{max:.0}"))
        .set(
            "cpu",
            format!(
                "{:.2} µs",
                nvwc_sim::cpu::CpuCost::measured().cost(4096) as f64 / 1e3
            ),
        )
        .set(
            "straddle_fallbacks",
            thousands(find(r10, &format!("hdd {straddle} false lazy")).patch_fallbacks),
        )
        .set("straddle_gain", format!("{:.0}", ratio(straddle)));
}

/// `nvwc repro non-blocking-writes`: the report's Markdown.
pub fn non_blocking_writes(a: &Args) -> Result<String> {
    let mut base = SimConfig::new(WritePolicyKind::WriteBack, ReplacementKind::Lru, 0);
    base.cache_device = "nvdram".parse()?;
    let (fig5, r5) = figure5(a, &base)?;
    let st = streams(a)?;
    let (fig10, r10) = figure10(a, &base, &st)?;
    let (fig11, r11) = figure11(a, &base, &st)?;
    let _ = std::fs::remove_dir_all(&st.dir);
    let mut v = Values::new();
    v.set("block", prose_size(BS))
        .set("figure5", fig5)
        .set("n", st.n)
        .set("span", format_size(st.span))
        .set("cache", format_size(st.cache))
        .set("patch_mem", format_size(st.patch_mem))
        .set("figure10", fig10)
        .set("figure11", fig11)
        .set("qd", QD);
    stream_values(&mut v, &st);
    discussion(&mut v, &st, &r10);
    let mut fig5: Vec<(&str, Vec<&RunResult>)> = Vec::new();
    for r in &r5 {
        match fig5.iter_mut().find(|g| g.0 == r.label) {
            Some(g) => g.1.push(r),
            None => fig5.push((&r.label, vec![r])),
        }
    }
    let mems = fig11_mems(a.quick);
    v.set(
        "claims",
        claims::table(&claims::Runs {
            fig5,
            fig10: &r10,
            fig11: &r11,
            partial: &st.sizes[..4],
            mems: &mems,
        }),
    );
    let json = serde_json::to_string_pretty(&(r5, r10, r11))?;
    std::fs::write(a.out.join("non-blocking-writes.json"), json)?;
    Ok(template!("non-blocking-writes.md").fill(&v)?)
}

/// One empty plot series per fetch mode, in `MODES` order.
fn mode_series() -> Vec<Series> {
    MODES
        .iter()
        .map(|m| Series {
            name: m.0.into(),
            points: Vec::new(),
        })
        .collect()
}

/// One line plot as the figure `name` of this report (720×460).
fn render_line(a: &Args, name: &str, plot: LinePlot) -> Result<()> {
    render(&[Chart::Line(plot)], 1, (720, 460), &img(a, name))?;
    Ok(())
}
