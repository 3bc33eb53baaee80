//! The admission report's table of the paper's claims beside ours, with a
//! verdict for each (`verdict.rs`), computed from the saved runs.

use std::path::Path;

use nvwc_sim::app::AppResult;
use nvwc_sim::format_size;

use super::admission::{get, load, thr};
use super::verdict::{self, Row, Verdict};

/// `f` over the groups (cache sizes) of `dev`, smallest size first.
fn values(rs: &[AppResult], dev: &str, f: &dyn Fn(u64) -> Option<f64>) -> Vec<f64> {
    let mut sizes: Vec<u64> = rs
        .iter()
        .filter(|r| r.nvwc_device == dev)
        .map(|r| r.nvwc_bytes)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes.iter().filter_map(|&s| f(s)).collect()
}

/// `lo to hi` of `v`, as ratios or as percentages.
fn fmt(v: &[f64], pct: bool) -> String {
    if v.is_empty() {
        return "not run".into();
    }
    let (lo, hi) = v
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
    let one = |x: f64| {
        if pct {
            format!("{:+.0} %", (x - 1.0) * 100.0)
        } else {
            format!("{x:.2}×")
        }
    };
    if (hi - lo).abs() < 1e-9 {
        one(lo)
    } else {
        format!("{} to {}", one(lo), one(hi))
    }
}

/// `lo to hi` of `f` over the groups of `dev`, as ratios or percentages.
pub(super) fn span(
    rs: &[AppResult],
    dev: &str,
    f: &dyn Fn(u64) -> Option<f64>,
    pct: bool,
) -> String {
    fmt(&values(rs, dev, f), pct)
}

/// Throughput of `a` over `b` at one size.
fn ratio<'a>(
    rs: &'a [AppResult],
    dev: &'a str,
    a: &'a str,
    b: &'a str,
) -> impl Fn(u64) -> Option<f64> + 'a {
    move |s| Some(thr(rs, dev, s, a)? / thr(rs, dev, s, b)?.max(1e-9))
}

/// Cached bytes of CP+PI+IOI over ALL's at one size.
fn cached<'a>(rs: &'a [AppResult], dev: &'a str) -> impl Fn(u64) -> Option<f64> + 'a {
    move |s| {
        let c = |p: &str| get(rs, dev, s, p).map(|r| r.cached_write_bytes as f64);
        Some(c("CP+PI+IOI")?.max(1.0) / c("ALL")?.max(1.0))
    }
}

/// A ratio row over the sizes of `dev`.
fn ratio_row(
    claim: String,
    paper: (&str, f64, f64),
    ours: Vec<f64>,
    pct: bool,
    cause: &str,
) -> Row {
    let verdict = Verdict::of_ratio((paper.1, paper.2), &ours);
    Row::new(claim, paper.0, fmt(&ours, pct), verdict, cause)
}

// Causes: each names the paragraph of "Where ours differs, and why" that
// explains it.
const NO_PI_WRITES: &str =
    "the lock holder has no write left to issue when it inherits (\"CP+PI equals CP\")";
const DISK_CACHE: &str = "the backing disk's write cache and C-LOOK let ALL destage a full cache quickly, while under CP each WAL fsync also flushes the disk that the bypassed writes wait in (\"ALL is not the worst\", \"The timeline\")";
const CKPT_HDD: &str = "backends wait on the checkpointer's fsync and the flusher, whose writes reach the disk at any cache size (\"ALL is not the worst\")";
const SSD_MODEL: &str = "our SSD model has parallel units and no garbage collection, so ALL does not suffer the paper's queue congestion (\"SSD\")";
const JBD2: &str =
    "jbd2 writes the children's ordered data itself, so few waits are on another's write in flight (\"Redis\")";
const ALL_SYNC: &str = "nearly every write in the model is synchronous and jbd2 inherits criticality, so CP+PI+IOI caches what ALL does (\"Redis\": SYNC equals ALL)";
const TAILS: &str = "the model's children's bursts hold the cache full only briefly; tails reproduced only in kind (\"Redis\")";

/// A throughput-ratio claim over every size of one device: the app, the
/// claim, the paper's text and range, the device, numerator and denominator
/// policies, whether ours prints as a percentage, and the cause.
type RatioClaim = (
    &'static str,
    &'static str,
    (&'static str, f64, f64),
    &'static str,
    &'static str,
    &'static str,
    bool,
    &'static str,
);

#[rustfmt::skip]
const RATIOS: [RatioClaim; 8] = [
    ("PostgreSQL", "CP+PI over CP, ramdisk (Fig. 4a)", ("+4 to +12 %", 1.04, 1.12), "nvdram", "CP+PI", "CP", true, NO_PI_WRITES),
    ("PostgreSQL", "CP+PI+IOI over CP+PI, ramdisk", ("+18 to +29 %", 1.18, 1.29), "nvdram", "CP+PI+IOI", "CP+PI", true, CKPT_HDD),
    ("PostgreSQL", "CP+PI+IOI over ALL, SSD (Fig. 4b)", ("1.8 to 2.2×", 1.8, 2.2), "ssd-sata", "CP+PI+IOI", "ALL", false, SSD_MODEL),
    ("PostgreSQL", "CP+PI+IOI over SYNC, SSD", ("2.2 to 2.5×", 2.2, 2.5), "ssd-sata", "CP+PI+IOI", "SYNC", false, SSD_MODEL),
    ("Redis", "CP+PI over CP, ramdisk (Fig. 9)", ("2 to 30×", 2.0, 30.0), "nvdram", "CP+PI", "CP", false, JBD2),
    ("Redis", "CP+PI+IOI over CP+PI, ramdisk", ("+3 to +49 %", 1.03, 1.49), "nvdram", "CP+PI+IOI", "CP+PI", true, JBD2),
    ("Redis", "CP+PI+IOI over ALL, ramdisk", ("+17 to +32 %", 1.17, 1.32), "nvdram", "CP+PI+IOI", "ALL", true, DISK_CACHE),
    ("Redis", "CP+PI+IOI over ALL, SSD", ("+47 to +55 %", 1.47, 1.55), "ssd-sata", "CP+PI+IOI", "ALL", true, SSD_MODEL),
];

/// The rows of [`RATIOS`] for the runs `rs` of `app`.
fn ratio_rows(app: &str, rs: &[AppResult], rows: &mut Vec<Row>) {
    for &(_, claim, paper, dev, a, b, pct, cause) in RATIOS.iter().filter(|c| c.0 == app) {
        let ours = values(rs, dev, &ratio(rs, dev, a, b));
        rows.push(ratio_row(
            format!("{app}: {claim}"),
            paper,
            ours,
            pct,
            cause,
        ));
    }
}

fn postgres_rows(pg: &[AppResult], rows: &mut Vec<Row>) {
    let ram = |f: &dyn Fn(u64) -> Option<f64>| values(pg, "nvdram", f);
    let claim = |c: &str| format!("PostgreSQL: {c}");
    ratio_rows("PostgreSQL", pg, rows);
    let sizes: Vec<u64> = pg
        .iter()
        .filter(|r| r.nvwc_device == "nvdram")
        .map(|r| r.nvwc_bytes)
        .collect();
    if let (Some(&min), Some(&max)) = (sizes.iter().min(), sizes.iter().max()) {
        let at_min: Vec<f64> = ratio(pg, "nvdram", "CP+PI+IOI", "ALL")(min)
            .into_iter()
            .collect();
        rows.push(ratio_row(
            claim(&format!(
                "CP+PI+IOI over ALL at the smallest ramdisk ({})",
                format_size(min)
            )),
            ("+80 % (32 MB)", 1.8, 1.8),
            at_min,
            true,
            DISK_CACHE,
        ));
        let c: Vec<f64> = cached(pg, "nvdram")(max).into_iter().collect();
        rows.push(ratio_row(
            claim(&format!(
                "cached writes, CP+PI+IOI vs ALL at the largest ramdisk ({})",
                format_size(max)
            )),
            ("-72 % (4 GB)", 0.28, 0.28),
            c,
            true,
            CKPT_HDD,
        ));
        let t: Vec<f64> = ratio(pg, "nvdram", "CP+PI+IOI", "ALL")(max)
            .into_iter()
            .collect();
        rows.push(Row::new(
            claim(&format!(
                "throughput, CP+PI+IOI vs ALL at the largest ramdisk ({})",
                format_size(max)
            )),
            "no loss (4 GB)",
            fmt(&t, true),
            Verdict::of_floor(1.0, &t),
            CKPT_HDD,
        ));
    }
    let eff = |s: u64| {
        let e = |p: &str| get(pg, "nvdram", s, p).map(|r| r.efficiency);
        Some(e("CP+PI+IOI")?.max(1e-12) / e("ALL")?.max(1e-12))
    };
    rows.push(ratio_row(
        claim("caching efficiency, CP+PI+IOI over ALL, ramdisk (Fig. 7)"),
        ("1.2 to 3.7×", 1.2, 3.7),
        ram(&eff),
        false,
        CKPT_HDD,
    ));
}

fn redis_rows(rd: &[AppResult], rows: &mut Vec<Row>) {
    let on = |dev: &str, f: &dyn Fn(u64) -> Option<f64>| values(rd, dev, f);
    let claim = |c: &str| format!("Redis: {c}");
    ratio_rows("Redis", rd, rows);
    for (dev, paper) in [
        ("nvdram", ("-20 to -29 %", 0.71, 0.80)),
        ("ssd-sata", ("-84 to -87 %", 0.13, 0.16)),
    ] {
        rows.push(ratio_row(
            claim(&format!("cached writes, CP+PI+IOI vs ALL, {dev}")),
            paper,
            on(dev, &cached(rd, dev)),
            true,
            if dev == "nvdram" { JBD2 } else { ALL_SYNC },
        ));
    }
    let largest_ssd = rd
        .iter()
        .filter(|r| r.nvwc_device == "ssd-sata")
        .map(|r| r.nvwc_bytes)
        .max();
    if let Some(s) = largest_ssd {
        let (Some(all), Some(ioi)) = (
            get(rd, "ssd-sata", s, "ALL"),
            get(rd, "ssd-sata", s, "CP+PI+IOI"),
        ) else {
            return;
        };
        let tails = |r: &AppResult| {
            format!(
                "{:.1} / {:.1} / {:.1}",
                r.latency_ms_p99, r.latency_ms_p999, r.latency_ms_p9999
            )
        };
        let r = ioi.latency_ms_p999.max(1e-3) / all.latency_ms_p999.max(1e-3);
        rows.push(Row::new(
            claim(&format!(
                "p99 / p99.9 / p99.99 ms, CP+PI+IOI against ALL, SSD {} (Table 4, workload A); \
                 verdict on the p99.9 ratio",
                format_size(s)
            )),
            "32 / 50 / 79 against 80 / 649 / >1000 (0.08×)",
            format!("{} against {} ({r:.2}×)", tails(ioi), tails(all)),
            Verdict::of_ratio((50.0 / 649.0, 50.0 / 649.0), &[r]),
            TAILS,
        ));
    }
}

/// The table for whichever apps have saved runs under `out`.
pub(super) fn table(out: &Path) -> String {
    let mut rows = Vec::new();
    if let Some(pg) = load(out, "postgres") {
        postgres_rows(&pg, &mut rows);
    }
    if let Some(rd) = load(out, "redis") {
        redis_rows(&rd, &mut rows);
    }
    verdict::table(&rows)
}
