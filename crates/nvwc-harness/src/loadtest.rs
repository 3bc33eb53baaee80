//! `nvwc loadtest`: a time-bounded NBD load generator with data verification.
//!
//! N concurrent clients (one NBD connection each, one request in flight per
//! client) issue a random mix of READ, WRITE (some with FUA), FLUSH and TRIM
//! with sizes from 512 B to 1 MiB against a running server until the
//! duration has passed. Each client owns a disjoint slice of the export, so
//! it knows what every sector it wrote must contain: every READ is checked
//! against the last WRITE of each sector (sectors never written or trimmed
//! since are not checked — NBD leaves their contents unspecified). Any NBD
//! error, protocol error or wrong byte counts as an error.
//!
//! With `--server-pid` the server's resident set size (`VmRSS` of
//! `/proc/PID/status`) is sampled every `--sample-ms`; the report gives the
//! first, last and largest sample and the growth over the second half of
//! the run (a leak grows there; warm-up growth happens before).
//!
//! Exit status: 0 if there were no errors (and, with `--max-rss-growth`, the
//! second-half growth stayed under it), 1 otherwise.
//!
//! Contract: the run is bounded — the clients stop issuing at the deadline,
//! and every request in flight then has `--request-timeout` to finish
//! (counted as an error if it does not).

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use nvwc_dev::rng::Rng;
use nvwc_dev::stamp;
use nvwc_nbd::Client;
use serde::Serialize;

const SECTOR: u64 = 512;
const MAX_IO: u64 = 1 << 20;
/// Version value of a sector whose contents are unspecified (never written
/// by this run, or trimmed).
const UNKNOWN: u32 = 0;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// NBD URI of the server (`nbd://127.0.0.1:10809/`, `nbd+unix:///?socket=PATH`).
    #[arg(long, default_value = "nbd+unix:///?socket=nvwc-data/nvwc.sock")]
    uri: String,
    /// Concurrent clients (one connection each).
    #[arg(long, default_value_t = 64)]
    clients: u32,
    /// How long to issue requests: `300`, `300s`, `5m`, `1h`.
    #[arg(long, default_value = "300s", value_parser = parse_duration)]
    duration: Duration,
    /// Per-request bound; a request taking longer is an error.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    request_timeout: Duration,
    /// Sample this process's RSS (the server) during the run.
    #[arg(long)]
    server_pid: Option<u32>,
    /// RSS sampling interval in milliseconds.
    #[arg(long, default_value_t = 1000)]
    sample_ms: u64,
    /// Fail if the server's RSS grew by more than this many MiB over the
    /// second half of the run (needs --server-pid).
    #[arg(long)]
    max_rss_growth_mib: Option<u64>,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Parses `300`, `300s`, `1500ms`, `5m`, `1h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("bad duration {s:?} (e.g. 20s, 5m)"))?;
    let mult = match unit {
        "" | "s" => 1.0,
        "ms" => 0.001,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return Err(format!("bad duration unit in {s:?} (ms, s, m, h)")),
    };
    let secs = n * mult;
    if !secs.is_finite() || secs <= 0.0 || secs > 7.0 * 86400.0 {
        return Err(format!("duration {s:?} out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Read,
    Write,
    Flush,
    Trim,
}

const OPS: [Op; 4] = [Op::Read, Op::Write, Op::Flush, Op::Trim];

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Trim => "trim",
        }
    }
}

/// Sector contents for (client, sector, version): a self-identifying
/// sector ([`stamp`]), so a misplaced or stale sector is caught.
fn fill_sector(buf: &mut [u8], client: u32, sector: u64, version: u32) {
    stamp::fill(buf, client.into(), version.into(), sector);
}

/// Request size: 512 B × 2^k (k uniform in 0..=11, so 512 B .. 1 MiB),
/// half of the time scaled down to a random multiple of 512 B of that size.
fn pick_len(rng: &mut Rng, limit: u64) -> u64 {
    let pow = SECTOR << rng.below(12);
    let len = if rng.below(2) == 0 {
        pow
    } else {
        SECTOR * (1 + rng.below(pow / SECTOR))
    };
    len.min(limit).max(SECTOR)
}

fn pick_op(rng: &mut Rng) -> Op {
    match rng.below(100) {
        0..=44 => Op::Read,
        45..=86 => Op::Write,
        87..=93 => Op::Flush,
        _ => Op::Trim,
    }
}

#[derive(Default)]
struct ClientResult {
    lat_us: [Vec<u32>; 4],
    bytes: [u64; 4],
    errors: u64,
    verify_failures: u64,
    verified_sectors: u64,
    first_errors: Vec<String>,
}

impl ClientResult {
    fn error(&mut self, msg: String) {
        self.errors += 1;
        if self.first_errors.len() < 5 {
            self.first_errors.push(msg);
        }
    }
}

struct ClientCfg {
    id: u32,
    base: u64,
    region: u64,
    seed: u64,
    deadline: Instant,
    request_timeout: Duration,
}

async fn run_client(c: Client, cfg: ClientCfg, stop: Arc<AtomicBool>) -> ClientResult {
    let mut res = ClientResult::default();
    let mut rng = Rng::new(cfg.seed);
    let sectors = (cfg.region / SECTOR) as usize;
    let mut versions = vec![UNKNOWN; sectors];
    let mut next_version: u32 = 1;
    let max_io = MAX_IO.min(u64::from(c.info().max_block)).min(cfg.region);
    let (can_flush, can_trim) = (c.info().can_flush(), c.info().can_trim());
    let can_fua = c.info().can_fua();
    while Instant::now() < cfg.deadline && !stop.load(Ordering::Relaxed) {
        let mut op = pick_op(&mut rng);
        if (op == Op::Flush && !can_flush) || (op == Op::Trim && !can_trim) {
            op = Op::Read;
        }
        let len = pick_len(&mut rng, max_io);
        let first = rng.below((cfg.region - len) / SECTOR + 1);
        let off = cfg.base + first * SECTOR;
        let t0 = Instant::now();
        let outcome: Result<(), String> = match op {
            Op::Read => {
                match tokio::time::timeout(cfg.request_timeout, c.read(off, len as u32)).await {
                    Err(_) => Err("read timed out".into()),
                    Ok(Err(e)) => Err(format!("read {off}+{len}: {e}")),
                    Ok(Ok(data)) => {
                        let lat = t0.elapsed();
                        let mut bad = None;
                        let mut expect = vec![0u8; SECTOR as usize];
                        for (i, chunk) in data.chunks(SECTOR as usize).enumerate() {
                            let s = first as usize + i;
                            let v = versions[s];
                            if v == UNKNOWN {
                                continue;
                            }
                            fill_sector(&mut expect, cfg.id, s as u64, v);
                            res.verified_sectors += 1;
                            if chunk != &expect[..] && bad.is_none() {
                                bad = Some(s);
                            }
                        }
                        if data.len() as u64 != len {
                            Err(format!("read {off}+{len} returned {} bytes", data.len()))
                        } else if let Some(s) = bad {
                            res.verify_failures += 1;
                            Err(format!(
                                "client {} sector {s} (byte {}) does not hold version {}",
                                cfg.id,
                                cfg.base + s as u64 * SECTOR,
                                versions[s]
                            ))
                        } else {
                            res.lat_us[0].push(lat.as_micros().min(u32::MAX as u128) as u32);
                            res.bytes[0] += len;
                            continue;
                        }
                    }
                }
            }
            Op::Write => {
                let v = next_version;
                next_version = next_version.wrapping_add(1).max(1);
                let mut buf = vec![0u8; len as usize];
                for (i, chunk) in buf.chunks_mut(SECTOR as usize).enumerate() {
                    fill_sector(chunk, cfg.id, first + i as u64, v);
                }
                let fua = can_fua && rng.below(10) == 0;
                let t0w = Instant::now();
                let r =
                    tokio::time::timeout(cfg.request_timeout, c.write(off, Bytes::from(buf), fua))
                        .await;
                let lat = t0w.elapsed();
                let n = (len / SECTOR) as usize;
                match r {
                    Err(_) => {
                        // Unknown whether it landed.
                        versions[first as usize..first as usize + n].fill(UNKNOWN);
                        Err("write timed out".into())
                    }
                    Ok(Err(e)) => {
                        versions[first as usize..first as usize + n].fill(UNKNOWN);
                        Err(format!("write {off}+{len}: {e}"))
                    }
                    Ok(Ok(())) => {
                        versions[first as usize..first as usize + n].fill(v);
                        res.lat_us[1].push(lat.as_micros().min(u32::MAX as u128) as u32);
                        res.bytes[1] += len;
                        continue;
                    }
                }
            }
            Op::Flush => match tokio::time::timeout(cfg.request_timeout, c.flush()).await {
                Err(_) => Err("flush timed out".into()),
                Ok(Err(e)) => Err(format!("flush: {e}")),
                Ok(Ok(())) => {
                    res.lat_us[2].push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
                    continue;
                }
            },
            Op::Trim => {
                let n = (len / SECTOR) as usize;
                // Contents are unspecified from the moment the trim is sent.
                versions[first as usize..first as usize + n].fill(UNKNOWN);
                match tokio::time::timeout(cfg.request_timeout, c.trim(off, len as u32, false))
                    .await
                {
                    Err(_) => Err("trim timed out".into()),
                    Ok(Err(e)) => Err(format!("trim {off}+{len}: {e}")),
                    Ok(Ok(())) => {
                        res.lat_us[3].push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
                        res.bytes[3] += len;
                        continue;
                    }
                }
            }
        };
        if let Err(msg) = outcome {
            res.error(msg);
            if c.is_closed() {
                res.error(format!("client {}: connection closed", cfg.id));
                break;
            }
        }
    }
    if let Err(e) = c.disconnect().await {
        res.error(format!("client {} disconnect: {e}", cfg.id));
    }
    res
}

#[derive(Serialize, Debug, Clone)]
pub struct Latency {
    pub count: u64,
    pub p50_us: u32,
    pub p99_us: u32,
    pub p999_us: u32,
    pub max_us: u32,
}

fn latency(mut v: Vec<u32>) -> Latency {
    v.sort_unstable();
    let q = |p: f64| -> u32 {
        if v.is_empty() {
            0
        } else {
            v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1]
        }
    };
    Latency {
        count: v.len() as u64,
        p50_us: q(0.50),
        p99_us: q(0.99),
        p999_us: q(0.999),
        max_us: v.last().copied().unwrap_or(0),
    }
}

#[derive(Serialize, Debug, Clone)]
pub struct Rss {
    pub samples: usize,
    pub first_kib: u64,
    pub last_kib: u64,
    pub max_kib: u64,
    /// RSS at the middle of the run.
    pub mid_kib: u64,
    /// last − mid, in KiB (negative: shrank).
    pub second_half_growth_kib: i64,
    /// (seconds since start, KiB) every sample.
    pub series: Vec<(f64, u64)>,
}

#[derive(Serialize, Debug)]
pub struct Report {
    pub clients: u32,
    pub duration_s: f64,
    pub ops: u64,
    pub ops_per_s: f64,
    pub mib_per_s: f64,
    pub errors: u64,
    pub verify_failures: u64,
    pub verified_sectors: u64,
    pub first_errors: Vec<String>,
    pub all: Latency,
    pub read: Latency,
    pub write: Latency,
    pub flush: Latency,
    pub trim: Latency,
    pub rss: Option<Rss>,
}

fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Runs the load described by `args` and returns the report.
pub async fn load(args: &Args) -> Result<Report> {
    if args.clients == 0 {
        bail!("--clients must be at least 1");
    }
    let mut clients = Vec::with_capacity(args.clients as usize);
    for i in 0..args.clients {
        let c = Client::connect(&args.uri)
            .await
            .with_context(|| format!("client {i}: connect to {}", args.uri))?;
        clients.push(c);
    }
    let size = clients[0].size();
    if clients[0].info().read_only() {
        bail!("the export is read-only");
    }
    // Disjoint, sector-aligned slices; at least one full-size request each.
    let region = (size / u64::from(args.clients)) / SECTOR * SECTOR;
    if region < MAX_IO {
        bail!(
            "export of {size} bytes is too small for {} clients (need {} MiB each)",
            args.clients,
            MAX_IO >> 20
        );
    }
    let start = Instant::now();
    let deadline = start + args.duration;
    let stop = Arc::new(AtomicBool::new(false));

    let sampler = args.server_pid.map(|pid| {
        let stop = stop.clone();
        let every = Duration::from_millis(args.sample_ms.max(10));
        tokio::spawn(async move {
            let mut series = Vec::new();
            loop {
                if let Some(kib) = rss_kib(pid) {
                    series.push((start.elapsed().as_secs_f64(), kib));
                }
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                tokio::time::sleep(every).await;
            }
            series
        })
    });

    let mut tasks = Vec::new();
    for (i, c) in clients.into_iter().enumerate() {
        let cfg = ClientCfg {
            id: i as u32,
            base: region * i as u64,
            region,
            seed: args.seed.wrapping_mul(1_000_003).wrapping_add(i as u64),
            deadline,
            request_timeout: args.request_timeout,
        };
        tasks.push(tokio::spawn(run_client(c, cfg, stop.clone())));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.context("client task panicked")?);
    }
    let elapsed = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let series = match sampler {
        Some(s) => s.await.context("sampler panicked")?,
        None => Vec::new(),
    };

    let mut per: [Vec<u32>; 4] = Default::default();
    let mut bytes = 0;
    let (mut errors, mut verify_failures, mut verified) = (0, 0, 0);
    let mut first_errors = Vec::new();
    for r in results {
        for (k, v) in r.lat_us.into_iter().enumerate() {
            per[k].extend(v);
        }
        bytes += r.bytes[0] + r.bytes[1];
        errors += r.errors;
        verify_failures += r.verify_failures;
        verified += r.verified_sectors;
        for e in r.first_errors {
            if first_errors.len() < 10 {
                first_errors.push(e);
            }
        }
    }
    let all: Vec<u32> = per.iter().flatten().copied().collect();
    let ops = all.len() as u64;
    let [read, write, flush, trim] = per.map(latency);
    let rss = (!series.is_empty()).then(|| {
        let mid_t = elapsed / 2.0;
        let mid = series
            .iter()
            .find(|(t, _)| *t >= mid_t)
            .unwrap_or(series.last().unwrap())
            .1;
        let last = series.last().unwrap().1;
        Rss {
            samples: series.len(),
            first_kib: series[0].1,
            last_kib: last,
            max_kib: series.iter().map(|s| s.1).max().unwrap(),
            mid_kib: mid,
            second_half_growth_kib: last as i64 - mid as i64,
            series,
        }
    });
    debug_assert_eq!(OPS.len(), 4);
    Ok(Report {
        clients: args.clients,
        duration_s: elapsed,
        ops,
        ops_per_s: ops as f64 / elapsed,
        mib_per_s: bytes as f64 / elapsed / (1 << 20) as f64,
        errors,
        verify_failures,
        verified_sectors: verified,
        first_errors,
        all: latency(all),
        read,
        write,
        flush,
        trim,
        rss,
    })
}

fn print_text(r: &Report) {
    println!(
        "loadtest: {} clients, {:.1} s, {} ops ({:.0} ops/s, {:.1} MiB/s read+write), {} errors, {} verify failures, {} sectors verified",
        r.clients, r.duration_s, r.ops, r.ops_per_s, r.mib_per_s, r.errors, r.verify_failures, r.verified_sectors
    );
    for (name, l) in [
        ("all", &r.all),
        (OPS[0].name(), &r.read),
        (OPS[1].name(), &r.write),
        (OPS[2].name(), &r.flush),
        (OPS[3].name(), &r.trim),
    ] {
        println!(
            "  {name:<5} n={:<8} p50={:>7} us  p99={:>7} us  p99.9={:>7} us  max={:>7} us",
            l.count, l.p50_us, l.p99_us, l.p999_us, l.max_us
        );
    }
    if let Some(s) = &r.rss {
        println!(
            "  server RSS: first {} MiB, mid {} MiB, last {} MiB, max {} MiB ({} samples; second-half growth {:+} KiB)",
            s.first_kib >> 10,
            s.mid_kib >> 10,
            s.last_kib >> 10,
            s.max_kib >> 10,
            s.samples,
            s.second_half_growth_kib
        );
    }
    for e in &r.first_errors {
        println!("  error: {e}");
    }
}

pub fn run(args: Args) -> Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let report = rt.block_on(load(&args))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report);
    }
    let mut ok = report.errors == 0 && report.ops > 0;
    if let (Some(limit), Some(rss)) = (args.max_rss_growth_mib, &report.rss) {
        if rss.second_half_growth_kib > (limit << 10) as i64 {
            eprintln!(
                "nvwc loadtest: server RSS grew {} KiB over the second half (limit {limit} MiB)",
                rss.second_half_growth_kib
            );
            ok = false;
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("20s").unwrap(), Duration::from_secs(20));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("300").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn sizes_span_512b_to_1mib() {
        let mut rng = Rng::new(7);
        let (mut lo, mut hi) = (u64::MAX, 0);
        for _ in 0..100_000 {
            let l = pick_len(&mut rng, MAX_IO);
            assert_eq!(l % SECTOR, 0);
            lo = lo.min(l);
            hi = hi.max(l);
        }
        assert_eq!((lo, hi), (SECTOR, MAX_IO));
    }

    #[test]
    fn sector_pattern_depends_on_every_field() {
        let mut a = [0u8; 512];
        let mut b = [0u8; 512];
        fill_sector(&mut a, 1, 2, 3);
        for (c, s, v) in [(2, 2, 3), (1, 3, 3), (1, 2, 4)] {
            fill_sector(&mut b, c, s, v);
            assert_ne!(a, b);
        }
    }

    #[test]
    fn percentiles() {
        let l = latency((1..=1000).collect());
        assert_eq!(
            (l.p50_us, l.p99_us, l.p999_us, l.max_us),
            (500, 990, 999, 1000)
        );
        assert_eq!(latency(vec![]).count, 0);
    }
}
