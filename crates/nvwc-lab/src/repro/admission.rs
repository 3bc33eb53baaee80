//! `nvwc repro admission --app postgres|redis`: the request-oriented
//! admission paper's experiments (Figures 4, 7 and 9, Table 4) with the
//! application models of `nvwc_sim::app` over the engine and device models.
//!
//! Every run is a simulation of the model's processes; nothing is fitted.
//! Each app's results are also kept in `reports/admission-<app>.json` (one
//! object per run), and `reports/admission.md` is rebuilt from whichever
//! apps have results, so the two commands together produce the report.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{bail, Context, Result};

use nvwc_sim::app::{self, postgres, redis, AppConfig, AppResult, Policy};
use nvwc_sim::device::{DeviceSpec, DiskScheduler};
use nvwc_sim::format_size;

use super::common::{listed_or, prose_size, range, thousands, Args};
use super::template::{template, Values};

const SEC: u64 = 1_000_000_000;
/// Timeline interval of the smallest cache's runs: fine enough to show a
/// checkpoint cycle of the model (seconds), coarse enough to keep the JSON
/// small.
const TIMELINE_NS: u64 = SEC / 2;

struct Plan {
    app: &'static str,
    /// (device preset, sizes)
    devices: Vec<(&'static str, Vec<u64>)>,
    duration: u64,
    warmup: u64,
}

fn plan(app: &str, quick: bool) -> Result<Plan> {
    const M: u64 = 1 << 20;
    const G: u64 = 1 << 30;
    Ok(match (app, quick) {
        ("postgres", false) => Plan {
            app: "postgres",
            devices: vec![
                ("nvdram", vec![32 * M, 128 * M, 512 * M, 4 * G]),
                ("ssd-sata", vec![4 * G, 16 * G]),
            ],
            duration: 60 * SEC,
            warmup: 10 * SEC,
        },
        ("postgres", true) => Plan {
            app: "postgres",
            devices: vec![("nvdram", vec![32 * M, 4 * G])],
            duration: 20 * SEC,
            warmup: 5 * SEC,
        },
        ("redis", false) => Plan {
            app: "redis",
            devices: vec![
                ("nvdram", vec![64 * M, 512 * M]),
                ("ssd-sata", vec![16 * G]),
            ],
            duration: 60 * SEC,
            warmup: 10 * SEC,
        },
        ("redis", true) => Plan {
            app: "redis",
            devices: vec![("nvdram", vec![512 * M])],
            duration: 20 * SEC,
            warmup: 5 * SEC,
        },
        (other, _) => bail!("--app {other:?}: expected postgres or redis"),
    })
}

/// The backing disks' write cache, in bytes.
const DISK_WRITE_CACHE: u64 = 16 << 20;

/// The backing disks: 7200 rpm with their 16 MiB write cache on (as SATA
/// disks ship; the paper turned off only its SSD's cache) behind the
/// kernel's elevator (C-LOOK).
fn backing_disk() -> DeviceSpec {
    let mut d = DeviceSpec::preset("hdd-7200").expect("preset");
    if let DeviceSpec::Hdd(p) = &mut d {
        p.write_cache_bytes = DISK_WRITE_CACHE;
        p.scheduler = DiskScheduler::CLook;
    }
    d
}

fn run_one(app_name: &str, cfg: &AppConfig) -> Result<AppResult, String> {
    match app_name {
        "postgres" => app::run(
            "postgres",
            &mut postgres::Postgres::new(postgres::PgParams::default()),
            cfg,
        ),
        _ => app::run(
            "redis",
            &mut redis::Redis::new(redis::RedisParams::default()),
            cfg,
        ),
    }
}

/// `nvwc repro admission`.
pub fn admission(a: &Args) -> Result<String> {
    // Without --app: rebuild the report from the saved runs.
    let Some(app_name) = a.app.as_deref() else {
        if load(&a.out, "postgres").is_none() && load(&a.out, "redis").is_none() {
            bail!(
                "no saved runs in {}: run with --app postgres or --app redis",
                a.out.display()
            );
        }
        return report(&a.out, false, "this report was rebuilt from the saved runs");
    };
    let p = plan(app_name, a.quick)?;
    let mut jobs: Vec<AppConfig> = Vec::new();
    for (i, (dev, sizes)) in p.devices.iter().enumerate() {
        for (j, &size) in sizes.iter().enumerate() {
            // The first device's smallest cache, where the policies part
            // ways, gets a timeline (the report's timeline figure).
            let timeline_ns = (i == 0 && j == 0).then_some(TIMELINE_NS);
            for policy in Policy::ALL {
                jobs.push(AppConfig {
                    policy,
                    cache_bytes: size,
                    cache_device: DeviceSpec::preset(dev).expect("preset"),
                    backing: backing_disk(),
                    duration_ns: p.duration,
                    warmup_ns: p.warmup,
                    seed: 42,
                    timeline_ns,
                });
            }
        }
    }
    let threads = a
        .threads
        .unwrap_or_else(nvwc_sim::sweep::default_threads)
        .max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done = std::sync::atomic::AtomicUsize::new(0);
    let results: std::sync::Mutex<Vec<Option<Result<AppResult, String>>>> =
        std::sync::Mutex::new((0..jobs.len()).map(|_| None).collect());
    let total = jobs.len();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= total {
                    break;
                }
                let r = run_one(p.app, &jobs[i]);
                results.lock().unwrap()[i] = Some(r);
                let d = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                eprint!("\r  admission {}: {d}/{total} runs", p.app);
            });
        }
    });
    eprintln!();
    let mut out: Vec<AppResult> = Vec::new();
    for (r, j) in results.into_inner().unwrap().into_iter().zip(&jobs) {
        match r.expect("every job ran") {
            Ok(x) => out.push(x),
            Err(e) => bail!(
                "{} {} {}: {e}",
                p.app,
                j.policy.name(),
                format_size(j.cache_bytes)
            ),
        }
    }
    let lines: Vec<String> = out
        .iter()
        .map(|r| serde_json::to_string(r).expect("json"))
        .collect();
    if let Some(path) = &a.json {
        std::fs::write(path, lines.join("\n") + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let keep = a.out.join(format!("admission-{}.json", p.app));
    std::fs::write(&keep, lines.join("\n") + "\n")
        .with_context(|| format!("writing {}", keep.display()))?;
    for r in &out {
        println!(
            "{:<8} {:<9} {:<10} {:>8} thr={:>9.1}/s cached={:>9} p99={:>8.2}ms p99.9={:>8.2}ms p99.99={:>8.2}ms stalls={} reissued={}",
            r.app,
            r.nvwc_device,
            r.policy,
            format_size(r.nvwc_bytes),
            r.throughput,
            format_size(r.cached_write_bytes),
            r.latency_ms_p99,
            r.latency_ms_p999,
            r.latency_ms_p9999,
            r.stalled_writes,
            r.reissued_writes
        );
    }
    report(
        &a.out,
        a.quick,
        &format!("the last run, `--app {}`, took @WALL@", p.app),
    )
}

pub(super) fn load(out: &Path, app: &str) -> Option<Vec<AppResult>> {
    let t = std::fs::read_to_string(out.join(format!("admission-{app}.json"))).ok()?;
    t.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| v.and_then(|v| from_json(&v)))
        .collect()
}

fn from_json(v: &serde_json::Value) -> Option<AppResult> {
    let f = |k: &str| v.get(k).and_then(|x| x.as_f64());
    let u = |k: &str| v.get(k).and_then(|x| x.as_u64());
    let s = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
    let pairs = |k: &str| -> Vec<(String, u64)> {
        v.get(k)
            .and_then(|x| x.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|p| Some((p.get(0)?.as_str()?.to_string(), p.get(1)?.as_u64()?)))
                    .collect()
            })
            .unwrap_or_default()
    };
    let w = v.get("critical_wait_ms")?.as_array()?;
    let wm = |i: usize| -> (String, f64) {
        (
            w[i].get(0)
                .and_then(|x| x.as_str())
                .unwrap_or("")
                .to_string(),
            w[i].get(1).and_then(|x| x.as_f64()).unwrap_or(0.0),
        )
    };
    Some(AppResult {
        app: s("app")?,
        policy: s("policy")?,
        nvwc_bytes: u("nvwc_bytes")?,
        nvwc_device: s("nvwc_device")?,
        throughput: f("throughput")?,
        requests: u("requests")?,
        cached_write_bytes: u("cached_write_bytes")?,
        write_bytes: u("write_bytes")?,
        efficiency: f("efficiency")?,
        latency_ms_avg: f("latency_ms_avg")?,
        latency_ms_p99: f("latency_ms_p99")?,
        latency_ms_p999: f("latency_ms_p999")?,
        latency_ms_p9999: f("latency_ms_p9999")?,
        stalled_writes: u("stalled_writes")?,
        reissued_writes: u("reissued_writes")?,
        inheritances: u("inheritances")?,
        io_inheritances: u("io_inheritances")?,
        sync_bytes_by_process: pairs("sync_bytes_by_process"),
        async_bytes_by_process: pairs("async_bytes_by_process"),
        critical_wait_ms: [wm(0), wm(1), wm(2)],
        timeline: v
            .get("timeline")
            .and_then(|t| serde_json::from_value(t.clone()).ok())
            .unwrap_or_default(),
    })
}

/// `reports/admission.md` from the saved results of both apps.
fn report(out: &Path, quick: bool, when: &str) -> Result<String> {
    let mut md = String::new();
    for app in ["postgres", "redis"] {
        let Some(rs) = load(out, app) else {
            writeln!(
                md,
                "## {app}\n\nNot run yet (`nvwc repro admission --app {app}`).\n"
            )?;
            continue;
        };
        writeln!(md, "## {app}\n")?;
        let mut groups: Vec<(String, u64)> = Vec::new();
        for r in &rs {
            if !groups.contains(&(r.nvwc_device.clone(), r.nvwc_bytes)) {
                groups.push((r.nvwc_device.clone(), r.nvwc_bytes));
            }
        }
        for (dev, size) in &groups {
            let g: Vec<&AppResult> = rs
                .iter()
                .filter(|r| &r.nvwc_device == dev && r.nvwc_bytes == *size)
                .collect();
            let all = g
                .iter()
                .find(|r| r.policy == "ALL")
                .map(|r| r.throughput)
                .unwrap_or(0.0);
            writeln!(md, "### {dev}, {}\n", format_size(*size))?;
            writeln!(
                md,
                "{}",
                concat!(
                    "| policy | throughput (req/s) | vs ALL | cached writes | efficiency (req/s per cached block) ",
                    "| p99 ms | p99.9 ms | p99.99 ms | stalled pieces | reissued | inherited (proc / I/O) |"
                )
            )?;
            writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|")?;
            for r in &g {
                writeln!(
                    md,
                    "| {} | {:.1} | {:.2}× | {} | {:.5} | {:.1} | {:.1} | {:.1} | {} | {} | {} / {} |",
                    r.policy,
                    r.throughput,
                    if all > 0.0 { r.throughput / all } else { 0.0 },
                    format_size(r.cached_write_bytes),
                    r.efficiency,
                    r.latency_ms_p99,
                    r.latency_ms_p999,
                    r.latency_ms_p9999,
                    r.stalled_writes,
                    r.reissued_writes,
                    r.inheritances,
                    r.io_inheritances
                )?;
            }
            writeln!(md)?;
        }
        let warmup = plan(app, quick)?.warmup;
        md.push_str(&super::admission_timeline::section(out, app, &rs, warmup)?);
        // Table 1-style breakdown from the ALL run with the largest ramdisk.
        if let Some(r) = rs
            .iter()
            .filter(|r| r.policy == "ALL")
            .max_by_key(|r| r.nvwc_bytes)
        {
            let total: u64 = r.sync_bytes_by_process.iter().map(|x| x.1).sum::<u64>()
                + r.async_bytes_by_process.iter().map(|x| x.1).sum::<u64>();
            writeln!(
                md,
                "Writes by type and process (Table 1's breakdown; ALL, {} {}, whole run):\n",
                r.nvwc_device,
                format_size(r.nvwc_bytes)
            )?;
            writeln!(md, "| type | process | share |\n|---|---|---|")?;
            for (kind, v) in [
                ("sync", &r.sync_bytes_by_process),
                ("async", &r.async_bytes_by_process),
            ] {
                for (name, b) in v.iter().filter(|x| x.1 > 0) {
                    writeln!(
                        md,
                        "| {kind} | {name} | {:.2} % |",
                        *b as f64 * 100.0 / total.max(1) as f64
                    )?;
                }
            }
            writeln!(md)?;
        }
    }
    let claims = super::admission_claims::table(out);
    let mut v = Values::new();
    v.set("quick", if quick { " with `--quick`" } else { "" })
        .set("when", when)
        .set("write_cache", prose_size(DISK_WRITE_CACHE))
        .set("results", md)
        .set("claims", claims);
    notes_values(&mut v, out, quick)?;
    Ok(template!("admission.md").fill(&v)?)
}

/// Throughput of `policy` in the group `(dev, size)`.
pub(super) fn thr(rs: &[AppResult], dev: &str, size: u64, policy: &str) -> Option<f64> {
    rs.iter()
        .find(|r| r.nvwc_device == dev && r.nvwc_bytes == size && r.policy == policy)
        .map(|r| r.throughput)
}

pub(super) fn get<'a>(
    rs: &'a [AppResult],
    dev: &str,
    size: u64,
    policy: &str,
) -> Option<&'a AppResult> {
    rs.iter()
        .find(|r| r.nvwc_device == dev && r.nvwc_bytes == size && r.policy == policy)
}

/// The numbers of "Where ours differs": from the saved runs and the
/// models' parameters.
fn notes_values(v: &mut Values, out: &Path, quick: bool) -> Result<()> {
    let pg = load(out, "postgres").unwrap_or_default();
    let rd = load(out, "redis").unwrap_or_default();
    let mut ram: Vec<u64> = pg
        .iter()
        .filter(|r| r.nvwc_device == "nvdram")
        .map(|r| r.nvwc_bytes)
        .collect();
    ram.sort_unstable();
    ram.dedup();
    let size = |s: Option<&u64>| s.map_or("(not run)".into(), |&s| prose_size(s));
    let ahead: Vec<String> = ram
        .iter()
        .filter(|&&s| thr(&pg, "nvdram", s, "CP+PI+IOI") > thr(&pg, "nvdram", s, "ALL"))
        .map(|&s| prose_size(s))
        .collect();
    let at_max = |p: &str| ram.last().and_then(|&s| get(&pg, "nvdram", s, p));
    let (max_thr, cached_less) = match (at_max("ALL"), at_max("CP+PI+IOI")) {
        (Some(a), Some(i)) => (
            range(&[a.throughput, i.throughput], |x| format!("{x:.0}")),
            format!(
                "{:.0} %",
                (1.0 - i.cached_write_bytes as f64 / a.cached_write_bytes.max(1) as f64) * 100.0
            ),
        ),
        _ => ("(not run)".into(), "(not run)".into()),
    };
    let pgp = postgres::PgParams::default();
    let DeviceSpec::SolidState(ssd) = DeviceSpec::preset("ssd-sata").expect("preset") else {
        bail!("ssd-sata is a solid-state model");
    };
    let pi_over_cp =
        |s: u64| Some(thr(&rd, "nvdram", s, "CP+PI")? / thr(&rd, "nvdram", s, "CP")?.max(1e-9));
    let p = plan("postgres", quick)?;
    v.set("pg_min", size(ram.first()))
        .set("pg_max", size(ram.last()))
        .set("ioi_ahead", listed_or(&ahead, "no size"))
        .set("pg_max_thr", max_thr)
        .set(
            "cpu_bound",
            format!(
                "{:.0}",
                pgp.backends as f64 * SEC as f64 / pgp.txn_cpu as f64
            ),
        )
        .set("pg_cached_less", cached_less)
        .set("ssd_units", ssd.parallel_units)
        .set(
            "rd_pi",
            super::admission_claims::span(&rd, "nvdram", &pi_over_cp, false),
        )
        .set("duration", p.duration / SEC)
        .set("warmup", p.warmup / SEC)
        .set("ckpt_wal", prose_size(pgp.ckpt_wal))
        .set("ckpt_s", pgp.ckpt_timeout / SEC)
        .set("pool_pages", thousands(pgp.pool_pages))
        .set("backends", pgp.backends);
    timeline_values(v, &pg, p.warmup);
    Ok(())
}

/// The numbers of the timeline paragraph: ALL against CP+PI+IOI at the
/// smallest cache (the runs that carry a timeline).
fn timeline_values(v: &mut Values, pg: &[AppResult], warmup: u64) {
    let sums = super::admission_timeline::summaries(pg, warmup);
    let get = |p: &str| sums.iter().find(|s| s.policy == p);
    let f1 = |x: f64| format!("{x:.1}");
    let pct = |x: f64| format!("{:.0} %", x * 100.0);
    let (all, ioi) = (get("ALL"), get("CP+PI+IOI"));
    fn set(
        v: &mut Values,
        k: &'static str,
        s: Option<&super::admission_timeline::Summary>,
        f: &dyn Fn(&super::admission_timeline::Summary) -> String,
    ) {
        v.set(k, s.map_or_else(|| "(not run)".to_string(), f));
    }
    set(v, "tl_all_full", all, &|s| pct(s.full));
    set(v, "tl_all_stalled", all, &|s| {
        format!("{:.0}", s.stalled_per_s)
    });
    set(v, "tl_all_behind", all, &|s| f1(s.behind_io));
    set(v, "tl_all_bflush", all, &|s| f1(s.backing_flushes_per_s));
    set(v, "tl_ioi_asks", ioi, &|s| {
        format!("{:.0}", s.inherits_per_s)
    });
    set(v, "tl_ioi_reissues", ioi, &|s| f1(s.reissued_per_s));
    set(v, "tl_ioi_on_io", ioi, &|s| format!("{:.2}", s.on_io));
    set(v, "tl_ioi_behind", ioi, &|s| f1(s.behind_io));
    set(v, "tl_ioi_behind_flush", ioi, &|s| f1(s.behind_flush));
    set(v, "tl_all_behind_flush", all, &|s| f1(s.behind_flush));
    set(v, "tl_ioi_process", ioi, &|s| f1(s.on_process));
    set(v, "tl_ioi_bflush", ioi, &|s| f1(s.backing_flushes_per_s));
    set(v, "tl_ioi_flush", ioi, &|s| f1(s.flushes_per_s));
    set(v, "tl_ioi_queue", ioi, &|s| {
        format!("{:.0}", s.backing_queue)
    });
}
