//! The write-policies report's look at a disk backing store: why write-back
//! can lose to write-through there, and what removes the loss. Every number
//! comes from the runs; the diagnosis is read off their counters.

use std::fmt::Write as _;

use anyhow::Result;
use nvwc_core::{FetchMode, WritePolicyKind};
use nvwc_sim::device::DeviceSpec;
use nvwc_sim::sweep::Job;
use nvwc_sim::{default_backing_qd, format_size, RunResult, SimConfig};

use super::common::{results, Args};
use super::verdict::NOISE;

/// The disk model, and the cache sizes as fractions of each trace's working
/// set: one small (write-back short of room), one as Figure 12's.
const DISK: &str = "hdd";
const FRACTIONS: [f64; 2] = [0.1, 0.8];

/// The variants, write-through first: (name, policy, bypass when full, fetch).
const VARIANTS: [(&str, WritePolicyKind, bool, FetchMode); 5] = [
    (
        "write-through",
        WritePolicyKind::WriteThrough,
        false,
        FetchMode::Blocking,
    ),
    (
        "write-back",
        WritePolicyKind::WriteBack,
        false,
        FetchMode::Blocking,
    ),
    (
        "write-back, around a full cache",
        WritePolicyKind::WriteBack,
        true,
        FetchMode::Blocking,
    ),
    (
        "write-back, lazy patches",
        WritePolicyKind::WriteBack,
        false,
        FetchMode::Lazy,
    ),
    (
        "write-back, both",
        WritePolicyKind::WriteBack,
        true,
        FetchMode::Lazy,
    ),
];

/// The section's Markdown: one table per trace and cache size, then the
/// diagnosis of every cell where write-back loses to write-through.
pub(super) fn section(
    a: &Args,
    base: &SimConfig,
    traces: &[(&str, &str, Option<u64>)],
    bs: u64,
) -> Result<String> {
    let mut disk = base.clone();
    disk.backing = DISK.parse::<DeviceSpec>()?;
    disk.backing_qd = default_backing_qd(&disk.backing);
    let mut jobs = Vec::new();
    let mut cells = Vec::new();
    for (file, label, limit) in traces {
        let path = a.traces.as_ref().expect("resolved in run").join(file);
        let plan = std::sync::Arc::new(crate::runs::scan_plan(&path, &disk, *limit)?);
        for f in FRACTIONS {
            let cache = ((plan.unique_blocks as f64 * f) as u64).max(64) * bs;
            for (name, policy, around, fetch) in VARIANTS {
                let mut cfg = disk.clone();
                cfg.write_policy = policy;
                cfg.cache_bytes = cache;
                cfg.tuning.bypass_when_full = Some(around);
                cfg.tuning.fetch = Some(fetch);
                cfg.label = format!("{label}|{f}|{name}");
                jobs.push(Job {
                    cfg,
                    plan: plan.clone(),
                    limit: *limit,
                });
            }
            cells.push((label.to_string(), f, cache));
        }
    }
    let res = results(&jobs, a)?;
    let mut md = String::new();
    let mut losses = Vec::new();
    for ((label, f, cache), runs) in cells.iter().zip(res.chunks(VARIANTS.len())) {
        table(&mut md, label, *f, *cache, runs)?;
        let (wt, wb) = (&runs[0], &runs[1]);
        if wb.throughput_iops * NOISE < wt.throughput_iops {
            losses.push(diagnosis(label, *cache, runs));
        }
    }
    if losses.is_empty() {
        writeln!(
            md,
            "Write-back does not lose to write-through in any of these cells."
        )?;
    } else {
        writeln!(
            md,
            "Where write-back loses to write-through, what the runs show:\n"
        )?;
        for l in losses {
            writeln!(md, "* {l}")?;
        }
    }
    Ok(md)
}

fn table(md: &mut String, label: &str, f: f64, cache: u64, runs: &[RunResult]) -> Result<()> {
    writeln!(
        md,
        "**{label}**, cache {} ({:.0} % of the working set), `{DISK}` backing:\n",
        format_size(cache),
        f * 100.0
    )?;
    writeln!(
        md,
        "| variant | requests/s | × write-through | backing write commands | backing reads | fetch-before-write reads | read hits | stalled write pieces |"
    )?;
    writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|")?;
    let wt = runs[0].throughput_iops.max(1e-9);
    for ((name, ..), r) in VARIANTS.iter().zip(runs) {
        writeln!(
            md,
            "| {name} | {:.1} | {:.2} | {} | {} | {} | {} | {} |",
            r.throughput_iops,
            r.throughput_iops / wt,
            r.backing_write_ops,
            r.backing_reads,
            r.fetches,
            r.read_hits,
            r.stalled_writes
        )?;
    }
    writeln!(md)?;
    Ok(())
}

/// One loss, explained from the counters of write-through (`runs[0]`),
/// write-back (`runs[1]`) and the variants that change one thing each.
fn diagnosis(label: &str, cache: u64, runs: &[RunResult]) -> String {
    let (wt, wb) = (&runs[0], &runs[1]);
    let x = |r: &RunResult| r.throughput_iops / wt.throughput_iops.max(1e-9);
    let ops = |r: &RunResult| r.backing_write_ops + r.backing_reads;
    let hits = if wb.read_hits < wt.read_hits {
        " (dirty blocks hold the cache)"
    } else {
        ""
    };
    format!(
        "{label}, {}: write-back {:.2}× write-through. The disk is the bottleneck \
         (write-back's backing utilisation {:.0} %), and write-back gives it {:.2}× the commands: \
         {} fetch-before-write reads for partial writes, {} write commands against {} \
         (destages of cache blocks in replacement order, against the client's own writes), \
         and {} read hits against {}{hits}. Writes wait for room ({} stalled pieces). \
         Sending a write that would wait around the full cache, as `nvwc serve` does by \
         default, gives {:.2}×; lazy patches (no fetch) {:.2}×; both {:.2}×. What remains: \
         write-back writes {:.2}× write-through's bytes to the disk, so at this cache size \
         there is little to coalesce, and every write still reaches the saturated disk.",
        format_size(cache),
        x(wb),
        wb.backing_utilisation * 100.0,
        ops(wb) as f64 / ops(wt).max(1) as f64,
        wb.fetches,
        wb.backing_write_ops,
        wt.backing_write_ops,
        wb.read_hits,
        wt.read_hits,
        wb.stalled_writes,
        x(&runs[2]),
        x(&runs[3]),
        x(&runs[4]),
        wb.backing_write_bytes as f64 / wt.backing_write_bytes.max(1) as f64,
    )
}
