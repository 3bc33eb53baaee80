//! The write-policies report's look at a networked store that serves several
//! commands at once: where ordered write-back's parallel eviction of
//! independent sets (§3.1, Figure 7) can pay. Every number comes from the
//! runs.
//!
//! The report's `net` model is Table 1's measured store: one number per
//! access type, served one command at a time, so a wave of independent
//! destages costs what the same writes cost one by one. Here the store is
//! the physical model of the same §5.1 organisation instead (`net-raid1`:
//! iSCSI over 1 Gb Ethernet in front of a RAID 1 of two 7200 rpm disks),
//! with each disk serving its queue in C-LOOK order (Linux's mq-deadline
//! dispatches sorted by sector; a disk's NCQ reorders too), at the driver
//! queue depth of the report (one command at a time) and at open-iscsi's
//! default session queue depth (`node.session.queue_depth = 32`, the `net`
//! models' `max_outstanding`).

use std::fmt::Write as _;
use std::sync::Arc;

use anyhow::Result;
use nvwc_core::WritePolicyKind;
use nvwc_sim::device::{DeviceSpec, DiskScheduler, NetParams};
use nvwc_sim::sweep::Job;
use nvwc_sim::{format_size, RunResult, SimConfig};

use super::common::{results, Args};
use super::verdict::NOISE;

/// Driver queue depths: the report's (1) and open-iscsi's default (32).
const QDS: [usize; 2] = [1, 32];

/// The store: `net-raid1` with both disks scheduling C-LOOK.
pub(super) fn store() -> DeviceSpec {
    let mut p = NetParams::raid1_over_gbe();
    p.name = "net-raid1-clook".into();
    if let DeviceSpec::Array(a) = &mut *p.backend {
        for m in &mut a.members {
            if let DeviceSpec::Hdd(h) = m {
                h.scheduler = DiskScheduler::CLook;
            }
        }
    }
    DeviceSpec::Net(p)
}

/// The section's Markdown: per trace, each policy's requests/s over
/// write-through at both queue depths, with ordered's waves; then what the
/// runs say.
pub(super) fn section(
    a: &Args,
    base: &SimConfig,
    traces: &[(&str, &str, Option<u64>)],
    policies: &[WritePolicyKind],
    pct: u64,
    bs: u64,
) -> Result<String> {
    let mut net = base.clone();
    net.backing = store();
    let mut jobs = Vec::new();
    let mut cells = Vec::new();
    for (file, label, limit) in traces {
        let path = a.traces.as_ref().expect("resolved in run").join(file);
        let plan = Arc::new(crate::runs::scan_plan(&path, &net, *limit)?);
        let cache = ((plan.unique_blocks * pct / 100).max(64)) * bs;
        for qd in QDS {
            for &pol in policies {
                let mut cfg = net.clone();
                cfg.backing_qd = qd;
                cfg.write_policy = pol;
                cfg.cache_bytes = cache;
                cfg.label = format!("{label}|qd{qd}");
                jobs.push(Job {
                    cfg,
                    plan: plan.clone(),
                    limit: *limit,
                });
            }
            cells.push((label.to_string(), qd, cache));
        }
    }
    let res = results(&jobs, a)?;
    let mut md = String::new();
    writeln!(
        md,
        "| trace | cache | backing queue depth | WT requests/s | WB | ordered | journaled | ordered: backing write commands | ordered: waves | ordered: blocks per wave |"
    )?;
    writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    let ord = policies
        .iter()
        .position(|&p| p == WritePolicyKind::Ordered)
        .expect("ordered is among the policies");
    let mut gains = Vec::new();
    for ((label, qd, cache), runs) in cells.iter().zip(res.chunks(policies.len())) {
        row(&mut md, label, *qd, *cache, runs, ord)?;
        gains.push(runs[ord].throughput_iops / runs[0].throughput_iops.max(1e-9));
    }
    writeln!(md)?;
    summary(&mut md, &cells, &gains)?;
    Ok(md)
}

fn waves(r: &RunResult) -> u64 {
    r.policy_counters.get("ordered_waves").copied().unwrap_or(0)
}

fn row(
    md: &mut String,
    label: &str,
    qd: usize,
    cache: u64,
    runs: &[RunResult],
    ord: usize,
) -> Result<()> {
    let wt = runs[0].throughput_iops.max(1e-9);
    let o = &runs[ord];
    let w = waves(o);
    writeln!(
        md,
        "| {label} | {} | {qd} | {:.0} | {:.2} | {:.2} | {:.2} | {} | {w} | {} |",
        format_size(cache),
        wt,
        runs[1].throughput_iops / wt,
        o.throughput_iops / wt,
        runs[3].throughput_iops / wt,
        o.backing_write_ops,
        if w > 0 {
            format!("{:.1}", o.backing_writes as f64 / w as f64)
        } else {
            "—".into()
        },
    )?;
    Ok(())
}

/// Ordered over write-through at queue depth 32 against 1, per trace.
fn summary(md: &mut String, cells: &[(String, usize, u64)], gains: &[f64]) -> Result<()> {
    let mut better = Vec::new();
    let mut not = Vec::new();
    for (pair, g) in cells.chunks(2).zip(gains.chunks(2)) {
        let (lo, hi) = (g[0], g[1]);
        let s = format!("{} ({lo:.2}× → {hi:.2}×)", pair[0].0);
        if hi > lo * NOISE {
            better.push(s);
        } else {
            not.push(s);
        }
    }
    writeln!(
        md,
        "Ordered over write-through gains from a store that takes {} commands at once on {} of {} traces{}{}.",
        QDS[1],
        better.len(),
        better.len() + not.len(),
        if better.is_empty() {
            String::new()
        } else {
            format!(": {}", better.join(", "))
        },
        if not.is_empty() {
            String::new()
        } else {
            format!("; not on {}", not.join(", "))
        }
    )?;
    Ok(())
}
