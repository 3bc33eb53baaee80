//! The non-blocking-writes report's table of the paper's claims beside ours,
//! with a verdict for each (`verdict.rs`), computed from the report's runs.

use nvwc_sim::{format_size, RunResult};

use super::verdict::{self, Row, Verdict};

/// The runs the claims are judged on, and how to find one.
pub struct Runs<'a> {
    /// Figure 5: per trace label, its runs in ascending cache size.
    pub fig5: Vec<(&'a str, Vec<&'a RunResult>)>,
    /// Figure 10: labelled `"{backing} {size} {flush} {mode}"`.
    pub fig10: &'a [RunResult],
    /// Figure 11: labelled `"{patch memory} {mode}"`.
    pub fig11: &'a [RunResult],
    /// The partial write sizes (every size of Figure 10 but the 4 KiB control).
    pub partial: &'a [u64],
    /// Figure 11's patch memory sizes, ascending.
    pub mems: &'a [u64],
}

fn iops(rs: &[RunResult], label: &str) -> f64 {
    rs.iter()
        .find(|r| r.label == label)
        .map_or(0.0, |r| r.throughput_iops)
        .max(1e-9)
}

/// Geometric mean.
fn gmean(v: &[f64]) -> f64 {
    (v.iter().map(|x| x.ln()).sum::<f64>() / v.len().max(1) as f64).exp()
}

// Causes: each names the paragraph of "Why the numbers differ" that explains it.
const WHAT_BLOCKS: &str = "a cache block below any page cache, and block-level traces, not file-system pages, decide what is partial (\"What blocks\")";
const NO_CPU: &str = "a request answered from memory costs only the host CPU measured live (about 5 µs), and lazy persists patches as partial versions, which a page cache cannot (\"Lazy's magnitudes here\")";
const BOTH: &str = "async and async-bg: every write meets a cold block, so they retire patches at the fetch rate (\"Steady state\"); lazy: a write answered from memory costs only the host CPU measured live, and patches persist as partial versions (\"Lazy's magnitudes here\")";
const STEADY: &str = "every write in the stream meets a cold block, so async and async-bg retire patches at the backing store's fetch rate once the limit is reached (\"Steady state\", \"The limit\")";

fn figure5(r: &Runs, rows: &mut Vec<Row>) {
    let at_largest: Vec<(&str, f64)> = r
        .fig5
        .iter()
        .filter_map(|(l, rs)| {
            let last = rs.last()?;
            Some((*l, last.fetches as f64 / last.writes.max(1) as f64))
        })
        .collect();
    let over = at_largest.iter().filter(|x| x.1 >= 0.15).count();
    rows.push(Row::new(
        "Fig. 5: writes that would block, at the largest cache",
        "at least 15 % for most workloads",
        at_largest
            .iter()
            .map(|(l, x)| format!("{l} {:.1} %", x * 100.0))
            .collect::<Vec<_>>()
            .join(", "),
        Verdict::of_count(over, at_largest.len()),
        WHAT_BLOCKS,
    ));
}

/// Ratios of `mode` over blocking for each partial size on `backing`, acked.
fn fig10_ratios(r: &Runs, backing: &str, mode: &str) -> Vec<f64> {
    r.partial
        .iter()
        .map(|s| {
            iops(r.fig10, &format!("{backing} {s} false {mode}"))
                / iops(r.fig10, &format!("{backing} {s} false blocking"))
        })
        .collect()
}

fn figure10(r: &Runs, rows: &mut Vec<Row>) {
    let nbw = ["async", "async-bg", "lazy"];
    for (backing, paper, cause) in [
        ("hdd", ("7× on average", 7.0), BOTH),
        ("ssd", ("2.1× on average", 2.1), BOTH),
    ] {
        // Judged per mode: one mean over modes would let one mode's excess
        // hide another's absence of gain.
        let means: Vec<f64> = nbw
            .iter()
            .map(|m| gmean(&fig10_ratios(r, backing, m)))
            .collect();
        let text: Vec<String> = nbw
            .iter()
            .zip(&means)
            .map(|(m, x)| format!("{m} {x:.1}×"))
            .collect();
        rows.push(Row::new(
            format!(
                "Fig. 10, {backing}: NBW over BW, partial random writes (per mode, geometric mean over sizes, acked)"
            ),
            paper.0,
            text.join(", "),
            Verdict::of_ratio((paper.1, paper.1), &means),
            cause,
        ));
    }
    let lazy = fig10_ratios(r, "hdd", "lazy");
    let max = lazy.iter().copied().fold(0.0, f64::max);
    rows.push(Row::new(
        "Fig. 10, disk: NBW-Lazy over BW, random writes, the largest gain",
        "up to 45×",
        format!("{max:.0}×"),
        Verdict::of_ratio((45.0, 45.0), &[max]),
        NO_CPU,
    ));
}

fn figure11(r: &Runs, rows: &mut Vec<Row>) {
    let ratio = |mem: u64, mode: &str| {
        iops(r.fig11, &format!("{mem} {mode}")) / iops(r.fig11, &format!("{mem} blocking"))
    };
    for (mode, name, paper, cause) in [
        ("async-bg", "NBW-Async-BG", 5.6, STEADY),
        ("lazy", "NBW-Lazy", 7.1, NO_CPU),
    ] {
        let best = r.mems.iter().map(|&m| ratio(m, mode)).fold(0.0, f64::max);
        rows.push(Row::new(
            format!("Fig. 11: {name} over BW, the largest gain over patch memory"),
            format!("up to {paper}×"),
            format!("{best:.1}×"),
            Verdict::of_ratio((paper, paper), &[best]),
            cause,
        ));
    }
    let lazy: Vec<f64> = r.mems.iter().map(|&m| ratio(m, "lazy")).collect();
    let rises = lazy.windows(2).filter(|p| p[1] >= p[0]).count();
    rows.push(Row::new(
        "Fig. 11: lazy's gain grows with memory",
        "yes, until the limit is no longer reached",
        format!(
            "at {rises} of {} steps ({} to {})",
            lazy.len().saturating_sub(1),
            format_size(r.mems[0]),
            format_size(r.mems[r.mems.len() - 1])
        ),
        Verdict::of_count(rises, lazy.len().saturating_sub(1)),
        NO_CPU,
    ));
}

/// The table.
pub fn table(r: &Runs) -> String {
    verdict::table_of(r, &[&figure5, &figure10, &figure11])
}
