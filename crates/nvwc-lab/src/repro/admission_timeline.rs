//! The admission report's timelines: for the smallest cache of an app, what
//! each policy's run was doing over time (`nvwc_sim::app::timeline`), as a
//! figure and a table of time averages after the warm-up.
//!
//! This is where the report shows, with counters over time, why ALL and the
//! request-oriented policies come out as they do at a small cache: how often
//! the cache was full of dirty data, how many write pieces waited for a
//! slot, and what the critical processes were blocked on.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use nvwc_sim::app::timeline::TimelineSample;
use nvwc_sim::app::AppResult;
use nvwc_sim::format_size;
use nvwc_sim::plot::{render, Axis, Chart, LinePlot, Series};

/// The policies drawn (the table lists every policy with a timeline).
const DRAWN: [&str; 3] = ["ALL", "WAL", "CP+PI+IOI"];
/// A cache counts as full when its dirty data is at least this fraction of
/// its blocks (a write then finds no clean slot to take, or almost none).
const FULL: f64 = 0.95;

/// Averages of one run's timeline after the warm-up.
pub(super) struct Summary {
    pub policy: String,
    pub tps: f64,
    /// Fraction of samples with the cache full ([`FULL`]).
    pub full: f64,
    pub stalled_per_s: f64,
    pub reissued_per_s: f64,
    pub inherits_per_s: f64,
    /// Time-averaged free slots, as a fraction of the cache.
    pub free: f64,
    pub on_io: f64,
    pub on_process: f64,
    pub behind_io: f64,
    pub behind_flush: f64,
    pub flushes_per_s: f64,
    pub backing_flushes_per_s: f64,
    pub backing_queue: f64,
}

fn summarize(r: &AppResult, warmup_ms: u64, every_s: f64) -> Option<Summary> {
    let s: Vec<&TimelineSample> = r.timeline.iter().filter(|x| x.t_ms > warmup_ms).collect();
    if s.is_empty() {
        return None;
    }
    let n = s.len() as f64;
    let mean = |f: &dyn Fn(&TimelineSample) -> f64| s.iter().map(|x| f(x)).sum::<f64>() / n;
    Some(Summary {
        policy: r.policy.clone(),
        tps: mean(&|x| x.tps),
        full: mean(&|x| f64::from(u8::from(x.dirty_frac >= FULL))),
        stalled_per_s: mean(&|x| x.stalled as f64) / every_s,
        reissued_per_s: mean(&|x| x.reissued as f64) / every_s,
        inherits_per_s: mean(&|x| x.io_inherits as f64) / every_s,
        free: mean(&|x| x.free_frac),
        on_io: mean(&|x| x.critical_on_io),
        on_process: mean(&|x| x.critical_on_process),
        behind_io: mean(&|x| x.critical_behind_io),
        behind_flush: mean(&|x| x.critical_behind_flush),
        flushes_per_s: mean(&|x| x.flushes as f64) / every_s,
        backing_flushes_per_s: mean(&|x| x.backing_flushes as f64) / every_s,
        backing_queue: mean(&|x| x.backing_queue),
    })
}

/// The runs of `rs` that carry a timeline (one cache device and size).
fn with_timeline(rs: &[AppResult]) -> Vec<&AppResult> {
    rs.iter().filter(|r| !r.timeline.is_empty()).collect()
}

/// Interval between samples, in seconds (from the first two samples).
fn interval_s(r: &AppResult) -> f64 {
    match r.timeline.as_slice() {
        [a, b, ..] => (b.t_ms - a.t_ms) as f64 / 1e3,
        [a] => a.t_ms as f64 / 1e3,
        [] => 1.0,
    }
}

/// The summaries of `app`'s timeline runs, in the order of `rs`.
pub(super) fn summaries(rs: &[AppResult], warmup_ns: u64) -> Vec<Summary> {
    with_timeline(rs)
        .into_iter()
        .filter_map(|r| summarize(r, warmup_ns / 1_000_000, interval_s(r)))
        .collect()
}

/// The markdown section (and its figure, `img/admission-<app>-timeline.png`
/// under `out`). Empty when no run has a timeline.
pub(super) fn section(out: &Path, app: &str, rs: &[AppResult], warmup_ns: u64) -> Result<String> {
    let runs = with_timeline(rs);
    let Some(first) = runs.first() else {
        return Ok(String::new());
    };
    let mut md = String::new();
    let name = format!("admission-{app}-timeline.png");
    let drawn: Vec<&AppResult> = DRAWN
        .iter()
        .filter_map(|p| runs.iter().copied().find(|r| r.policy == *p))
        .collect();
    if nvwc_sim::plot::font_available() {
        std::fs::create_dir_all(out.join("img"))?;
        render(&charts(&drawn), 2, (560, 360), &out.join("img").join(&name))?;
    }
    writeln!(
        md,
        "### Timeline: {}, {}\n\n![{app} timeline](img/{name})\n",
        first.nvwc_device,
        format_size(first.nvwc_bytes)
    )?;
    writeln!(
        md,
        "Sampled every {:.1} s of simulated time; averages over the samples after the warm-up. *Full*: dirty data ≥ {:.0} % of the cache. *Critical blocked*: processes with own or inherited criticality, blocked at the sample instant.\n",
        interval_s(first),
        FULL * 100.0
    )?;
    writeln!(
        md,
        "| policy | tps | cache full | free slots | stalled pieces/s | I/O inheritances/s | reissues/s | critical blocked on I/O | on a lock or condition | of which behind a holder's I/O | of which behind its FLUSH | FLUSH/s | backing FLUSH/s | backing queue |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )?;
    for s in summaries(rs, warmup_ns) {
        writeln!(
            md,
            "| {} | {:.1} | {:.0} % | {:.2} % | {:.0} | {:.1} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} | {:.1} | {:.1} |",
            s.policy,
            s.tps,
            s.full * 100.0,
            s.free * 100.0,
            s.stalled_per_s,
            s.inherits_per_s,
            s.reissued_per_s,
            s.on_io,
            s.on_process,
            s.behind_io,
            s.behind_flush,
            s.flushes_per_s,
            s.backing_flushes_per_s,
            s.backing_queue
        )?;
    }
    writeln!(md)?;
    Ok(md)
}

fn series(runs: &[&AppResult], f: impl Fn(&TimelineSample) -> f64) -> Vec<Series> {
    runs.iter()
        .map(|r| Series {
            name: r.policy.clone(),
            points: r
                .timeline
                .iter()
                .map(|x| (x.t_ms as f64 / 1e3, f(x)))
                .collect(),
        })
        .collect()
}

fn chart(title: &str, y: &str, series: Vec<Series>) -> Chart {
    Chart::Line(LinePlot {
        title: title.into(),
        x_label: "simulated time (s)".into(),
        y_label: y.into(),
        x_axis: Axis::Linear,
        y_axis: Axis::Linear,
        series,
        vlines: vec![],
        y_from_zero: true,
    })
}

fn charts(runs: &[&AppResult]) -> Vec<Chart> {
    vec![
        chart("(a) transactions", "per second", series(runs, |x| x.tps)),
        chart(
            "(b) dirty data",
            "fraction of the cache",
            series(runs, |x| x.dirty_frac),
        ),
        chart(
            "(c) critical processes waiting on an I/O, own or a lock holder's",
            "processes",
            series(runs, |x| x.critical_on_io + x.critical_behind_io),
        ),
        chart(
            "(d) write pieces waiting for a slot",
            "per interval",
            series(runs, |x| x.stalled as f64),
        ),
    ]
}
