//! The stack-model report's table of the paper's claims beside ours, with a
//! verdict for each (`verdict.rs`), computed from the report's runs.

use nvwc_sim::RunResult;

use super::verdict::{self, Row, Verdict, NOISE};

/// Per trace: its label and its Table 1 runs, in order LRU, LST, stack at
/// the MRC knee, stack with an online knee.
pub type Table1<'a> = Vec<(&'a str, Vec<&'a RunResult>)>;

/// Figure 2: per (trace, cache size) with a knee, the relative change of
/// disk writes (percent) up to the knee and from it.
pub type Figure2 = Vec<(String, f64, f64)>;

const LRU: usize = 0;
const LST: usize = 1;
const STACK: usize = 2;

// Causes: each names the paragraph of "Differences from the paper, and why"
// that explains it.
const TRAFFIC: &str = "both traces offer more write traffic than the HP 97560 absorbs, so the cache runs full and destages on demand whatever the policy (\"Stalled writes\")";
const RUNS: &str = "LST writes longer runs on CloudPhysics, whose large sequential writes favour spatial locality alone (\"Writes to disk\")";
const KNEE: &str = "the stack policy stops cleaning once only the hot region is left, so a hot region past the knee leaves less room for bursts (\"Figure 2\")";

fn per_trace(t: &Table1, f: impl Fn(&[&RunResult]) -> String) -> String {
    t.iter()
        .map(|(l, rs)| format!("{l} {}", f(rs)))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The table.
pub fn table(t: &Table1, fig2: &Figure2) -> String {
    let mut rows = Vec::new();
    let absorbed: Vec<f64> = t
        .iter()
        .map(|(_, rs)| rs[STACK].backing_write_ops.max(1) as f64 / rs[STACK].writes.max(1) as f64)
        .collect();
    rows.push(Row::new(
        "writes to disk per write request, stack policy, a modest cache",
        "0.25 (75 % fewer, on average)",
        per_trace(t, |rs| {
            format!(
                "{:.2} ({} of {})",
                rs[STACK].backing_write_ops as f64 / rs[STACK].writes.max(1) as f64,
                rs[STACK].backing_write_ops,
                rs[STACK].writes
            )
        }),
        Verdict::of_ratio((0.25, 0.25), &absorbed),
        TRAFFIC,
    ));
    let fewer_stalls = t
        .iter()
        .filter(|(_, rs)| (rs[STACK].queued_writes as f64) * NOISE < rs[LRU].queued_writes as f64)
        .count();
    rows.push(Row::new(
        "the stack policy stalls fewer writes than LRU",
        "often none where others stall hundreds (Snake 5: 97 against 418)",
        per_trace(t, |rs| {
            format!(
                "{} against {}",
                rs[STACK].queued_writes, rs[LRU].queued_writes
            )
        }),
        Verdict::of_count(fewer_stalls, t.len()),
        TRAFFIC,
    ));
    type Runs<'a> = (&'a str, Vec<&'a RunResult>);
    let fewest = |(_, rs): &Runs| {
        rs[STACK].backing_write_ops <= rs[LRU].backing_write_ops.min(rs[LST].backing_write_ops)
    };
    let most_overwrites =
        |(_, rs): &Runs| rs[STACK].overwrites > rs[LRU].overwrites.max(rs[LST].overwrites);
    verdict::counted_rows(
        &mut rows,
        t,
        ("on", "traces"),
        vec![
            (
                "the stack policy makes the fewest disk writes of LRU, LST and stack".into(),
                "often",
                &fewest,
                RUNS,
            ),
            (
                "the stack policy overwrites in the cache most often".into(),
                "yes",
                &most_overwrites,
                "",
            ),
        ],
    );
    let steeper = fig2.iter().filter(|(_, b, a)| b < a && *b < 0.0).count();
    rows.push(Row::new(
        "Fig. 2: disk writes fall faster before the knee than after it",
        "up to −25 % before, as little as −4 % after",
        fig2.iter()
            .map(|(l, b, a)| format!("{l} {b:+.0} % / {a:+.0} %"))
            .collect::<Vec<_>>()
            .join("; "),
        Verdict::of_count(steeper, fig2.len()),
        KNEE,
    ));
    verdict::table(&rows)
}
