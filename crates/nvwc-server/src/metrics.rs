//! What a running server reports: the engine's counters by name
//! ([`stats_pairs`]), request latency histograms per export ([`Latency`]),
//! and Prometheus text over plain HTTP (`--metrics`, [`metrics_loop`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use nvwc_core::Stats;

use crate::export::NvwcExport;
use crate::server::ExportList;

/// Upper bounds (µs) of the latency histogram buckets; the last is +Inf.
const LAT_BOUNDS_US: [u64; 12] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
];
const OPS: [&str; 5] = ["read", "write", "flush", "trim", "write_zeroes"];

/// Per-operation latency histograms (Prometheus style: cumulative at export).
#[derive(Default)]
pub(crate) struct Latency {
    counts: [[AtomicU64; 13]; 5],
    sums_us: [AtomicU64; 5],
}

impl Latency {
    pub(crate) fn record(&self, op: usize, us: u64) {
        let b = LAT_BOUNDS_US
            .iter()
            .position(|&x| us <= x)
            .unwrap_or(LAT_BOUNDS_US.len());
        self.counts[op][b].fetch_add(1, Ordering::Relaxed);
        self.sums_us[op].fetch_add(us, Ordering::Relaxed);
    }
}

macro_rules! stat_fields {
    ($m:ident) => {
        $m!(requests reads writes flushes trims read_bytes write_bytes read_hits read_misses write_hits write_misses
            overwrites direct_writes cache_reads cache_read_bytes cache_writes cache_write_bytes cache_flushes backing_reads
            backing_read_bytes backing_writes backing_write_bytes backing_flushes backing_groups fetches populates
            stalled_writes stall_ns admission_stalls block_waits block_wait_ns evictions destaged_blocks destage_plans destage_failures commits log_commits inline_commits commit_failures
            io_errors patches_created patch_merges patch_reads patch_fetches patch_direct_writes patch_discards
            patch_fallbacks patch_waits patch_fetch_errors patch_persists partial_read_fetches partial_write_fetches admitted_pieces bypassed_pieces bypassed_bytes bypass_refused full_bypassed_writes full_dropped_clean
            reissued_writes discarded_completions critical_admitted_pieces critical_bypassed_pieces
            critical_reissued_writes inherited patched_blocks patch_bytes dirty_blocks cached_blocks free_slots)
    };
}

pub(crate) fn stats_pairs(st: &Stats) -> Vec<(&'static str, u64)> {
    macro_rules! pairs {
        ($($f:ident)*) => { vec![$((stringify!($f), st.$f)),*] };
    }
    stat_fields!(pairs)
}

pub(crate) fn json_string(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// Prometheus text format; every series has an `export` label.
fn metrics_text(exports: &[Arc<NvwcExport>]) -> String {
    let snaps: Vec<_> = exports.iter().map(|e| (e, e.host.status())).collect();
    let mut o = String::new();
    let label = |e: &NvwcExport| format!("export={}", json_string(&e.info.name));
    if let Some((_, (st, pc))) = snaps.first() {
        for (k, _) in stats_pairs(st) {
            let kind = if matches!(
                k,
                "dirty_blocks" | "cached_blocks" | "free_slots" | "patched_blocks" | "patch_bytes"
            ) {
                "gauge"
            } else {
                "counter"
            };
            o += &format!("# TYPE nvwc_{k} {kind}\n");
            for (e, (st, _)) in &snaps {
                let v = stats_pairs(st)
                    .into_iter()
                    .find(|(n, _)| *n == k)
                    .map_or(0, |p| p.1);
                o += &format!("nvwc_{k}{{{}}} {v}\n", label(e));
            }
        }
        let _ = pc;
    }
    for (e, (_, pc)) in &snaps {
        for (k, v) in pc {
            o += &format!("# TYPE nvwc_{k} gauge\nnvwc_{k}{{{}}} {v}\n", label(e));
        }
    }
    // Admission outcomes per class (critical by an export or connection
    // hint, or normal): pieces admitted, bypassed, and reissued to the cache.
    o += "# TYPE nvwc_admission_pieces counter\n";
    for (e, (st, _)) in &snaps {
        for (outcome, all, crit) in [
            ("admitted", st.admitted_pieces, st.critical_admitted_pieces),
            ("bypassed", st.bypassed_pieces, st.critical_bypassed_pieces),
            ("reissued", st.reissued_writes, st.critical_reissued_writes),
        ] {
            for (class, v) in [("critical", crit), ("normal", all - crit)] {
                o += &format!(
                    "nvwc_admission_pieces{{{},class=\"{class}\",outcome=\"{outcome}\"}} {v}\n",
                    label(e)
                );
            }
        }
    }
    o += "# TYPE nvwc_request_latency_seconds histogram\n";
    for (e, _) in &snaps {
        latency_text(&mut o, e, &label(e));
    }
    o
}

/// Export `e`'s request latency histograms, labelled `l`, appended to `o`.
fn latency_text(o: &mut String, e: &NvwcExport, l: &str) {
    // `class`: the admission class of the request (critical by an export
    // or connection hint, or normal).
    for (lat, class) in e.lat.iter().zip(["normal", "critical"]) {
        for (i, op) in OPS.iter().enumerate() {
            let mut cum = 0;
            for (b, bound) in LAT_BOUNDS_US.iter().enumerate() {
                cum += lat.counts[i][b].load(Ordering::Relaxed);
                *o += &format!(
                    "nvwc_request_latency_seconds_bucket{{{l},class=\"{class}\",op=\"{op}\",le=\"{}\"}} {cum}\n",
                    *bound as f64 / 1e6
                );
            }
            cum += lat.counts[i][LAT_BOUNDS_US.len()].load(Ordering::Relaxed);
            *o += &format!(
                "nvwc_request_latency_seconds_bucket{{{l},class=\"{class}\",op=\"{op}\",le=\"+Inf\"}} {cum}\n"
            );
            *o += &format!(
                "nvwc_request_latency_seconds_sum{{{l},class=\"{class}\",op=\"{op}\"}} {}\n",
                lat.sums_us[i].load(Ordering::Relaxed) as f64 / 1e6
            );
            *o += &format!(
                "nvwc_request_latency_seconds_count{{{l},class=\"{class}\",op=\"{op}\"}} {cum}\n"
            );
        }
    }
}

/// Serve Prometheus text metrics over plain HTTP/1.1.
pub(crate) async fn metrics_loop(addr: String, exports: Arc<ExportList>) -> Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("metrics address {addr}"))?;
    loop {
        let (mut conn, _) = l.accept().await?;
        let exports = exports.all();
        tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            let _ = conn.read(&mut buf).await;
            let body = metrics_text(&exports);
            let resp = format!("HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
            let _ = conn.write_all(resp.as_bytes()).await;
        });
    }
}
