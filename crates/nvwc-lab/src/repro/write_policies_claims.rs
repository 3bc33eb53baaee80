//! The write-policies report's table of the paper's claims beside ours, with
//! a verdict for each (`verdict.rs`), computed from the report's runs.

use nvwc_sim::tradeoff::TradeoffPoint;
use nvwc_sim::RunResult;

use super::verdict::{self, Row, Verdict, NOISE};

/// The runs the claims are judged on.
pub struct Runs<'a> {
    /// Figure 12: per trace, its label and its runs under write-through,
    /// write-back, ordered and journaled (in that order).
    pub fig12: Vec<(&'a str, &'a [RunResult])>,
    /// Figure 13: per fraction of the working set, the same four runs.
    pub fig13: Vec<(f64, &'a [RunResult])>,
    /// Figure 14: write-through, write-back, then journaled per journal size.
    pub fig14: &'a [RunResult],
    /// §5.4: the cost model's evaluation and its optimum.
    pub eval: &'a [TradeoffPoint],
    pub best: Option<usize>,
}

const WT: usize = 0;
const WB: usize = 1;
const ORD: usize = 2;
const JNL: usize = 3;

fn thr(rs: &[RunResult], p: usize) -> f64 {
    rs[p].throughput_iops.max(1e-9)
}

/// `label r×, …` for a ratio per trace.
fn per_trace(v: &[(&str, f64)]) -> String {
    v.iter()
        .map(|(l, r)| format!("{l} {r:.2}×"))
        .collect::<Vec<_>>()
        .join(", ")
}

// Causes: each names the paragraph of "Differences from the paper, and why"
// that explains it.
const FIG12_ORD: &str = "ordered writes every version out of place and destages each one, where journaled coalesces rewrites within a transaction (\"Figure 12\")";
const FIG12_READS: &str =
    "SYSTOR'17 (mostly reads, each block touched about once) is bound by cold read misses, so every policy gives the same (\"Figure 12\")";
const ORD_VERSIONS: &str = "ordered destages every version and so writes more to the store than write-back (\"Figure 13\")";
const FIG13: &str =
    "every write-back variant pays dirty evictions on demand when the cache is small (\"Figure 13\")";
const FIG14_SPAN: &str = "checkpoints write each run of contiguous versions as one command, so even the smallest journal checkpoints cheaply and stays above write-through, while eager checkpoints keep the largest below write-back (\"Figure 14\")";
const W_STAR: &str = "with these cost shapes the penalty never outweighs the throughput a larger journal buys (\"§5.4\")";

fn figure12(r: &Runs, rows: &mut Vec<Row>) {
    let over_wt = |p: usize| -> Vec<(&str, f64)> {
        r.fig12
            .iter()
            .map(|(l, rs)| (*l, thr(rs, p) / thr(rs, WT)))
            .collect()
    };
    for (p, name, paper, cause) in [
        (ORD, "ordered", ("1.1 to 8×", 1.1, 8.0), FIG12_READS),
        (JNL, "journaled", ("1.5 to 10×", 1.5, 10.0), FIG12_READS),
    ] {
        let v = over_wt(p);
        let xs: Vec<f64> = v.iter().map(|x| x.1).collect();
        rows.push(Row::new(
            format!("Fig. 12: {name} write-back over write-through, per trace"),
            paper.0,
            per_trace(&v),
            Verdict::of_ratio((paper.1, paper.2), &xs),
            cause,
        ));
    }
    let slowest = |(_, rs): &(&str, &[RunResult])| (1..rs.len()).all(|p| thr(rs, WT) < thr(rs, p));
    let j_over_o = |(_, rs): &(&str, &[RunResult])| thr(rs, JNL) * NOISE >= thr(rs, ORD);
    let within = format!("(within {:.0} %)", (NOISE - 1.0) * 100.0);
    verdict::counted_rows(
        rows,
        &r.fig12,
        ("on", "traces"),
        vec![
            (
                "Fig. 12: write-through is the slowest policy".into(),
                "on every workload",
                &slowest,
                FIG12_READS,
            ),
            (
                format!("Fig. 12: journaled at least as fast as ordered {within}"),
                "on most workloads (all but YCSB-F)",
                &j_over_o,
                FIG12_ORD,
            ),
        ],
    );
}

fn figure13(r: &Runs, rows: &mut Vec<Row>) {
    let large: Vec<&(f64, &[RunResult])> = r.fig13.iter().filter(|(f, _)| *f >= 1.0).collect();
    let beat = |(_, rs): &&(f64, &[RunResult])| (1..rs.len()).all(|p| thr(rs, p) > thr(rs, WT));
    let most = |(_, rs): &&(f64, &[RunResult])| {
        (1..rs.len()).all(|p| rs[WT].backing_write_bytes > rs[p].backing_write_bytes)
    };
    verdict::counted_rows(
        rows,
        &large,
        ("at", "such sizes"),
        vec![
            (
                "Fig. 13: every write-back variant beats write-through at caches at least the working set".into(),
                "yes (caches over 1.5 GB)",
                &beat,
                FIG13,
            ),
            (
                "Fig. 13(b): write-through writes the most to storage, caches at least the working set".into(),
                "yes",
                &most,
                FIG13,
            ),
        ],
    );
    let o_wb: Vec<f64> = large
        .iter()
        .map(|(_, rs)| thr(rs, ORD) / thr(rs, WB))
        .collect();
    let text = large
        .iter()
        .zip(&o_wb)
        .map(|((f, _), x)| format!("{:.0} %: {x:.2}×", f * 100.0))
        .collect::<Vec<_>>()
        .join(", ");
    rows.push(Row::new(
        "Fig. 13: ordered over write-back, caches at least the working set",
        "0.8× (800 against 1000 ops/s)",
        text,
        Verdict::of_ratio((0.8, 0.8), &o_wb),
        ORD_VERSIONS,
    ));
}

fn figure14(r: &Runs, rows: &mut Vec<Row>) {
    let jr = &r.fig14[2..];
    let steps = jr.len().saturating_sub(1);
    let rises = jr
        .windows(2)
        .filter(|p| p[1].dirty_blocks_mean >= p[0].dirty_blocks_mean)
        .count();
    rows.push(Row::counted(
        "Fig. 14: staleness (time-averaged dirty data) rises with the journal size",
        "yes",
        (rises, steps),
        ("at", "steps"),
        "",
    ));
    let (wt, wb) = (
        r.fig14[0].throughput_iops.max(1e-9),
        r.fig14[1].throughput_iops.max(1e-9),
    );
    let (first, last) = (jr[0].throughput_iops, jr[jr.len() - 1].throughput_iops);
    let ends = usize::from(first <= wt * NOISE) + usize::from(last * NOISE >= wb);
    rows.push(Row::new(
        "Fig. 14: the journal size spans write-through's throughput to write-back's",
        "a significant portion of the range",
        format!(
            "smallest journal {first:.0} (write-through {wt:.0}), largest {last:.0} (write-back {wb:.0}) requests/s"
        ),
        Verdict::of_count(ends, 2),
        FIG14_SPAN,
    ));
    let interior = matches!(r.best, Some(b) if b > 0 && b + 1 < r.eval.len());
    rows.push(Row::new(
        "§5.4: an interior optimum w* of revenue − penalty",
        "650 MB of a 1.5 GB cache",
        r.best.map_or("no run".into(), |b| {
            format!(
                "w* = {} ({})",
                nvwc_sim::format_size(r.eval[b].w as u64),
                if interior {
                    "interior"
                } else {
                    "the sweep's edge"
                }
            )
        }),
        Verdict::of_count(usize::from(interior), 1),
        W_STAR,
    ));
}

/// The table.
pub fn table(r: &Runs) -> String {
    verdict::table_of(r, &[&figure12, &figure13, &figure14])
}
