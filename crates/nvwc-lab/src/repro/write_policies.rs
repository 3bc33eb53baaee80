//! `nvwc repro write-policies`: Koller et al. (FAST'13), Figures 12, 13,
//! 14 and §5.4, with our traces between the RevoDrive and `net` models.

use std::fmt::Write as _;
use std::sync::Arc;

use anyhow::Result;
use nvwc_core::{ReplacementKind, WritePolicyKind};
use nvwc_sim::device::DeviceSpec;
use nvwc_sim::plot::{render, Axis, BarPlot, Chart, LinePlot, Series};
use nvwc_sim::sweep::Job;
use nvwc_sim::tradeoff::{CostModel, TradeoffPoint};
use nvwc_sim::{default_backing_qd, format_size, GroupEndCost, RunResult, SimConfig, TracePlan};

use super::common::{img, prose_size, quick_or, results, Args};
use super::template::{template, Values};
use super::write_policies_claims as claims;
use super::write_policies_notes as notes;
use crate::runs::scan_plan;

/// Cache block size.
const BS: u64 = 4096;
/// The four write policies, write-through first (the reference).
const POLICIES: [WritePolicyKind; 4] = [
    WritePolicyKind::WriteThrough,
    WritePolicyKind::WriteBack,
    WritePolicyKind::Ordered,
    WritePolicyKind::Journaled,
];
/// Figure 12's cache, in percent of a trace's working set.
const FIG12_PCT: u64 = 80;
/// Figure 14's cache, in percent of the working set.
const FIG14_PCT: u64 = 75;
/// Requests outstanding per stream.
const QD: u32 = 4;

/// A trace's label, plan and replay limit.
type Planned = (String, Arc<TracePlan>, Option<u64>);

fn base_config() -> Result<SimConfig> {
    let backing: DeviceSpec = "net".parse()?;
    let mut base = SimConfig::new(WritePolicyKind::WriteThrough, ReplacementKind::Arc, 0);
    base.backing_qd = default_backing_qd(&backing);
    base.backing = backing;
    base.cache_device = "ssd-revodrive".parse()?;
    base.qd = QD;
    // The paper's journal is storage-side NVRAM, "eliminat[ing] the need to
    // incur additional storage I/Os for atomic group updates" (§3.2.1): its
    // checkpoints cost nothing beyond their writes, unlike `nvwc serve`'s
    // redo log (the simulator's default).
    base.group_end = GroupEndCost::Free;
    Ok(base)
}

/// Scans the traces: (file, label, limit) each.
fn plan_traces(
    a: &Args,
    base: &SimConfig,
    traces: &[(&str, &str, Option<u64>)],
) -> Result<Vec<Planned>> {
    let mut plans = Vec::new();
    for (f, label, limit) in traces {
        let path = a.traces.as_ref().expect("resolved in run").join(f);
        let plan = Arc::new(scan_plan(&path, base, *limit)?);
        plans.push((label.to_string(), plan, *limit));
    }
    Ok(plans)
}

fn traces_table(plans: &[Planned]) -> Result<String> {
    let mut md = String::new();
    writeln!(
        md,
        "| trace | requests replayed | working set | write working set | mapping |"
    )?;
    writeln!(md, "|---|---:|---:|---:|---|")?;
    for (l, p, _) in plans {
        writeln!(
            md,
            "| {l} | {} | {} | {} | {} |",
            p.records,
            format_size(p.unique_blocks * BS),
            format_size(p.unique_write_blocks * BS),
            p.mapping
        )?;
    }
    Ok(md)
}

/// One job per policy on `plan` with a cache of `cache` bytes.
fn policy_jobs(base: &SimConfig, p: &Planned, cache: u64, label: String) -> Vec<Job> {
    POLICIES
        .iter()
        .map(|&pol| {
            let mut cfg = base.clone();
            cfg.write_policy = pol;
            cfg.cache_bytes = cache;
            cfg.label = label.clone();
            Job {
                cfg,
                plan: p.1.clone(),
                limit: p.2,
            }
        })
        .collect()
}

/// Figure 12: every policy per trace at `FIG12_PCT` of its working set.
fn figure12(a: &Args, base: &SimConfig, plans: &[Planned]) -> Result<(String, Vec<RunResult>)> {
    let mut jobs = Vec::new();
    for p in plans {
        let c = ((p.1.unique_blocks * FIG12_PCT / 100).max(64)) * BS;
        jobs.extend(policy_jobs(base, p, c, p.0.clone()));
    }
    let r12 = results(&jobs, a)?;
    let mut md = String::new();
    writeln!(md, "| trace | cache | WT IOPS | WB | ordered | journaled | WB backing writes / WT | ordered | journaled | dirty at end (WB / ordered / journaled) |")?;
    writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")?;
    let mut bars: Vec<(String, Vec<f64>)> = POLICIES
        .iter()
        .map(|p| (p.name().to_string(), Vec::new()))
        .collect();
    let mut cats = Vec::new();
    for (l, _, _) in plans {
        let rs: Vec<&RunResult> = r12.iter().filter(|r| &r.label == l).collect();
        let wt = rs[0].throughput_iops;
        let wtb = rs[0].backing_write_bytes.max(1) as f64;
        for (i, r) in rs.iter().enumerate() {
            bars[i].1.push(r.throughput_iops / wt);
        }
        cats.push(l.clone());
        writeln!(
            md,
            "| {l} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} / {} / {} |",
            format_size(rs[0].cache_size_bytes),
            wt,
            rs[1].throughput_iops / wt,
            rs[2].throughput_iops / wt,
            rs[3].throughput_iops / wt,
            rs[1].backing_write_bytes as f64 / wtb,
            rs[2].backing_write_bytes as f64 / wtb,
            rs[3].backing_write_bytes as f64 / wtb,
            format_size(rs[1].dirty_bytes_end),
            format_size(rs[2].dirty_bytes_end),
            format_size(rs[3].dirty_bytes_end),
        )?;
    }
    render(
        &[Chart::Bar(BarPlot {
            title: "Throughput normalised to write-through (Figure 12 analogue)".into(),
            y_label: "throughput / write-through".into(),
            categories: cats,
            series: bars,
            hline: Some(1.0),
        })],
        1,
        (1000, 480),
        &img(a, "write-policies-fig12.png"),
    )?;
    Ok((md, r12))
}

/// Figure 13: every policy on the first trace over a range of cache sizes.
fn figure13(
    a: &Args,
    base: &SimConfig,
    p13: &Planned,
    fr: &[f64],
) -> Result<(String, Vec<RunResult>)> {
    let mut jobs = Vec::new();
    for &f in fr {
        let c = (((p13.1.unique_blocks as f64) * f) as u64).max(64) * BS;
        jobs.extend(policy_jobs(base, p13, c, format!("{f}")));
    }
    let r13 = results(&jobs, a)?;
    let line = |title: &str, y: &str, f: &dyn Fn(&RunResult) -> f64| -> Chart {
        Chart::Line(LinePlot {
            title: title.into(),
            x_label: "cache size".into(),
            y_label: y.into(),
            x_axis: Axis::Log2Bytes,
            y_axis: Axis::Linear,
            series: POLICIES
                .iter()
                .map(|p| Series {
                    name: p.name().into(),
                    points: r13
                        .iter()
                        .filter(|r| r.write_policy == p.name())
                        .map(|r| (r.cache_size_bytes as f64, f(r)))
                        .collect(),
                })
                .collect(),
            vlines: vec![((p13.1.unique_blocks * BS) as f64, "working set".into())],
            y_from_zero: true,
        })
    };
    render(
        &[
            line("(a) throughput", "requests / s", &|r| r.throughput_iops),
            line(
                "(b) backing write volume",
                "MB written to the backing store",
                &|r| r.backing_write_bytes as f64 / 1e6,
            ),
            line(
                "(c) write allocations",
                "write pieces allocating a block",
                &|r| r.write_misses as f64,
            ),
        ],
        3,
        (520, 420),
        &img(a, "write-policies-fig13.png"),
    )?;
    let mut md = String::new();
    writeln!(md, "| cache | policy | IOPS | backing MB written | write allocations (misses) | overwrites | stalled (queued) writes | dirty at end |")?;
    writeln!(md, "|---:|---|---:|---:|---:|---:|---:|---:|")?;
    for r in &r13 {
        writeln!(
            md,
            "| {} | {} | {:.0} | {:.1} | {} | {} | {} | {} |",
            format_size(r.cache_size_bytes),
            r.write_policy,
            r.throughput_iops,
            r.backing_write_bytes as f64 / 1e6,
            r.write_misses,
            r.overwrites,
            r.queued_writes,
            format_size(r.dirty_bytes_end)
        )?;
    }
    Ok((md, r13))
}

/// Figure 14's runs: write-through and write-back as references, then
/// journaled per journal size `ws` (blocks; `JournalConfig::size_blocks`,
/// everything else at the engine's defaults), all with a cache of `c14` bytes.
fn figure14_runs(
    a: &Args,
    base: &SimConfig,
    p13: &Planned,
    c14: u64,
    ws: &[u32],
) -> Result<Vec<RunResult>> {
    let job = |f: &dyn Fn(&mut SimConfig)| {
        let mut cfg = base.clone();
        cfg.cache_bytes = c14;
        f(&mut cfg);
        Job {
            cfg,
            plan: p13.1.clone(),
            limit: p13.2,
        }
    };
    let mut jobs = Vec::new();
    for pol in [WritePolicyKind::WriteThrough, WritePolicyKind::WriteBack] {
        jobs.push(job(&|c| {
            c.write_policy = pol;
            c.label = "ref".into();
        }));
    }
    for &w in ws {
        jobs.push(job(&|c| {
            c.write_policy = WritePolicyKind::Journaled;
            c.tuning.journal_size_blocks = Some(u64::from(w));
            c.label = format!("{w}");
        }));
    }
    results(&jobs, a)
}

/// Figure 14's table: journaled per `w`, then the two references.
fn figure14(r14: &[RunResult], ws: &[u32]) -> Result<String> {
    let (wt14, wb14) = (&r14[0], &r14[1]);
    let mut md = String::new();
    writeln!(md, "| w (blocks) | w | IOPS | peak dirty | mean dirty | dirty at end | stalled writes | uncheckpointed txns at end | backing MB written | checkpoints |")?;
    writeln!(md, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    for (r, &w) in r14[2..].iter().zip(ws) {
        writeln!(
            md,
            "| {w} | {} | {:.0} | {} | {} | {} | {} | {} | {:.1} | {} |",
            format_size(u64::from(w) * BS),
            r.throughput_iops,
            format_size(r.dirty_blocks_peak * BS),
            format_size((r.dirty_blocks_mean * BS as f64) as u64),
            format_size(r.dirty_bytes_end),
            r.stalled_writes,
            r.uncheckpointed_txns.unwrap_or(0),
            r.backing_write_bytes as f64 / 1e6,
            r.policy_counters
                .get("journal_checkpoints")
                .copied()
                .unwrap_or(0),
        )?;
    }
    writeln!(
        md,
        "| write-through | | {:.0} | {} | | | | | {:.1} | |",
        wt14.throughput_iops,
        format_size(wt14.dirty_blocks_peak * BS),
        wt14.backing_write_bytes as f64 / 1e6
    )?;
    writeln!(
        md,
        "| write-back | | {:.0} | {} | {} | {} | | | {:.1} | |",
        wb14.throughput_iops,
        format_size(wb14.dirty_blocks_peak * BS),
        format_size((wb14.dirty_blocks_mean * BS as f64) as u64),
        format_size(wb14.dirty_bytes_end),
        wb14.backing_write_bytes as f64 / 1e6
    )?;
    Ok(md)
}

/// §5.4's cost model, scaled to the measured ranges of throughput and
/// staleness, and its evaluation at each `w`.
fn tradeoff(jr: &[RunResult], ws: &[u32]) -> (CostModel, Vec<TradeoffPoint>, Option<usize>) {
    let pts: Vec<(f64, f64, f64)> = jr
        .iter()
        .zip(ws)
        .map(|(r, &w)| {
            (
                w as f64 * BS as f64,
                r.throughput_iops,
                r.dirty_blocks_mean * BS as f64,
            )
        })
        .collect();
    let tmin = pts.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let tmax = pts.iter().map(|p| p.1).fold(0.0, f64::max);
    let smax = pts.iter().map(|p| p.2).fold(0.0, f64::max).max(1.0);
    let model = CostModel {
        dollars_per_iops: 1.0,
        p_fail: 0.5,
        base: (tmax - tmin).max(1.0) / (std::f64::consts::E.powi(3) - 1.0),
        scale_bytes: smax / 3.0,
    };
    let (eval, best) = model.evaluate(&pts);
    (model, eval, best)
}

/// A line chart against the journal size.
fn w_chart(
    title: &str,
    y_label: &str,
    y_axis: Axis,
    series: Vec<Series>,
    vlines: Vec<(f64, String)>,
    from_zero: bool,
) -> Chart {
    Chart::Line(LinePlot {
        title: title.into(),
        x_label: "journal size w".into(),
        y_label: y_label.into(),
        x_axis: Axis::Log2Bytes,
        y_axis,
        series,
        vlines,
        y_from_zero: from_zero,
    })
}

/// A series of `f` over the evaluated points.
fn w_series(name: &str, eval: &[TradeoffPoint], f: impl Fn(&TradeoffPoint) -> f64) -> Series {
    Series {
        name: name.into(),
        points: eval.iter().map(|p| (p.w, f(p))).collect(),
    }
}

/// Figure 14's plot: throughput, staleness and revenue − penalty per `w`.
fn figure14_plot(
    a: &Args,
    r14: &[RunResult],
    eval: &[TradeoffPoint],
    best: Option<usize>,
) -> Result<()> {
    let (wt, wb) = (r14[0].throughput_iops, r14[1].throughput_iops);
    let charts = vec![
        w_chart(
            "(a) throughput vs journal size",
            "requests / s",
            Axis::Linear,
            vec![
                w_series("journaled", eval, |p| p.throughput),
                w_series("write-through", eval, |_| wt),
                w_series("write-back", eval, |_| wb),
            ],
            vec![],
            true,
        ),
        w_chart(
            "(b) staleness vs journal size",
            "time-averaged dirty bytes",
            Axis::LinearBytes,
            vec![w_series("journaled", eval, |p| p.staleness_bytes)],
            vec![],
            true,
        ),
        w_chart(
            "(c) revenue − penalty (§5.4)",
            "$",
            Axis::Linear,
            vec![
                w_series("revenue", eval, |p| p.revenue),
                w_series("penalty", eval, |p| p.penalty),
                w_series("profit", eval, |p| p.profit),
            ],
            best.map(|b| vec![(eval[b].w, "w*".to_string())])
                .unwrap_or_default(),
            false,
        ),
    ];
    render(&charts, 3, (520, 420), &img(a, "write-policies-fig14.png"))?;
    Ok(())
}

fn tradeoff_table(eval: &[TradeoffPoint], best: Option<usize>) -> Result<String> {
    let mut md = String::new();
    writeln!(md, "| w | revenue | penalty | profit |")?;
    writeln!(md, "|---:|---:|---:|---:|")?;
    for (i, p) in eval.iter().enumerate() {
        writeln!(
            md,
            "| {}{} | {:.1} | {:.1} | {:.1} |",
            format_size(p.w as u64),
            if Some(i) == best { " **(w\\*)**" } else { "" },
            p.revenue,
            p.penalty,
            p.profit
        )?;
    }
    Ok(md)
}

/// A fraction as a whole percentage, as the prose writes it.
fn pct(f: f64) -> String {
    format!("{:.0}", f * 100.0)
}

/// `nvwc repro write-policies`: the report's Markdown.
pub fn write_policies(a: &Args) -> Result<String> {
    let base = base_config()?;
    let q = |n: u64| if a.quick { Some(n / 10) } else { Some(n) };
    let traces: Vec<(&str, &str, Option<u64>)> = vec![
        ("cloudPhysicsIO.vscsi", "CloudPhysics", q(40_000)),
        ("msr.cut.per_10k.rw_40_60.1370.trace", "MSR cut", q(10_000)),
        ("cloud_storage-sample.bz2", "Tencent", q(50_000)),
        ("systor17-traces-sample.csv.gz", "SYSTOR'17", None),
        ("msr-cambridge1-sample.csv", "MSR hm_0", None),
    ];
    let plans = plan_traces(a, &base, &traces)?;
    let (fig12, r12) = figure12(a, &base, &plans)?;
    let p13 = &plans[0];
    // Figure 13: cache sizes as fractions of the working set.
    let fr = quick_or(
        a.quick,
        &[0.1, 0.4, 1.2],
        &[0.05, 0.1, 0.2, 0.4, 0.8, 1.2, 1.6],
    );
    let (fig13, r13) = figure13(a, &base, p13, &fr)?;
    let c14 = ((p13.1.unique_blocks * FIG14_PCT / 100).max(64)) * BS;
    // Figure 14: journal sizes in blocks, from a few transactions' worth up
    // to about the cache (where the bound stops mattering).
    let ws = quick_or(
        a.quick,
        &[512, 8192, 131072],
        &[128, 512, 2048, 8192, 32768, 131072],
    );
    let r14 = figure14_runs(a, &base, p13, c14, &ws)?;
    let (model, eval, best) = tradeoff(&r14[2..], &ws);
    figure14_plot(a, &r14, &eval, best)?;
    let labels: Vec<&str> = traces.iter().map(|t| t.1).collect();
    let mut v = Values::new();
    v.set("block", prose_size(BS))
        .set("cache_device", "ssd-revodrive")
        .set("backing", "net")
        .set("trace_labels", labels.join(", "))
        .set("qd", QD)
        .set("fig12_pct", FIG12_PCT)
        .set("fig13_lo", pct(fr[0]))
        .set("fig13_hi", pct(fr[fr.len() - 1]))
        .set("fig14_pct", FIG14_PCT)
        .set("traces_table", traces_table(&plans)?)
        .set("figure12", fig12)
        .set("fig13_trace", &p13.0)
        .set("figure13", fig13)
        .set("fig14_cache", format_size(c14))
        .set("txn_cap", c14 / BS / 4)
        .set("figure14", figure14(&r14, &ws)?)
        .set("p_fail", model.p_fail)
        .set("base", format!("{:.2}", model.base))
        .set("scale", format_size(model.scale_bytes as u64))
        .set("tradeoff", tradeoff_table(&eval, best)?);
    notes::workloads(&mut v, &[&r12, &r13, &r14]);
    let named: Vec<(&str, &TracePlan)> = plans.iter().map(|p| (p.0.as_str(), &*p.1)).collect();
    let groups12: Vec<&[RunResult]> = r12.chunks(POLICIES.len()).collect();
    let groups13: Vec<&[RunResult]> = r13.chunks(POLICIES.len()).collect();
    notes::figure12(&mut v, &named, &groups12);
    notes::figure13(&mut v, &groups13, &fr);
    notes::figure14(&mut v, &r14, &ws, &eval, best);
    let claims = claims::Runs {
        fig12: named
            .iter()
            .map(|p| p.0)
            .zip(groups12.iter().copied())
            .collect(),
        fig13: fr.iter().copied().zip(groups13.iter().copied()).collect(),
        fig14: &r14,
        eval: &eval,
        best,
    };
    v.set("claims", claims::table(&claims));
    v.set(
        "disk",
        super::write_policies_disk::section(a, &base, &traces[..2], BS)?,
    );
    v.set(
        "parallel",
        super::write_policies_parallel::section(a, &base, &traces, &POLICIES, FIG12_PCT, BS)?,
    );
    let json = serde_json::to_string_pretty(&(r12, r13, r14))?;
    std::fs::write(img(a, "write-policies-runs.json"), json)?;
    Ok(template!("write-policies.md").fill(&v)?)
}
