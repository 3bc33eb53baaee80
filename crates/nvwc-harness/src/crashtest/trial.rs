//! One trial end to end: start the server, run the workload, crash it (and,
//! for a host crash, drop or tear what was not durable), then read back and
//! judge the cache-intact and cache-lost states.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;

use super::blocks::decode_region;
use super::check::{check_cache_lost, check_flush_contract, Check, Counts, History};
use super::server::{connect, counter, stat, status_line, Server, ServerCfg};
use super::workload::{read_region_file, read_region_nbd, workload, Op, Workload, DIRECT_MIN};
use super::{Faults, Rng, BS, FAILPOINTS};

#[derive(Clone, Debug, serde::Serialize)]
pub struct TrialResult {
    pub policy: String,
    pub mode: String,
    pub failpoint: Option<String>,
    pub trial: u32,
    pub seed: u64,
    /// The signal the server died of (9: kill -9; 6: a failpoint's abort).
    pub signal: Option<i32>,
    pub run_ms: u64,
    #[serde(flatten)]
    pub counts: Counts,
    pub cache_intact: Check,
    pub cache_lost: Check,
    /// Degraded flag reported by `nvwc status` just before the crash.
    pub degraded: Option<bool>,
    /// Journaled: transactions closed early for space (not at a FLUSH), per `nvwc status` just before the crash.
    pub forced_closes: Option<u64>,
    pub workload: &'static str,
    /// Client writes of 16 KiB or more: each offered to the direct path.
    pub large_writes: u64,
    /// Writes the server took directly (payload received from the socket
    /// straight into the mapped cache file), per `nvwc status` just before
    /// the crash.
    pub direct_writes: Option<u64>,
    /// Cache writes copied into the mapped cache file (slot and metadata
    /// writes of buffered requests), same status.
    pub mapped_writes: Option<u64>,
    /// Pieces of writes admission sent around the cache (`bypassed_pieces`),
    /// same status.
    pub bypassed_pieces: Option<u64>,
    /// Host crash: what became of each device's writes that were not durable.
    pub host_crash: Option<HostCrash>,
}

/// What a host crash did to the writes that were not durable (`nvwc-dev/src/volatile.rs`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct HostCrash {
    pub cache: nvwc_dev::volatile::CrashOutcome,
    pub backing: nvwc_dev::volatile::CrashOutcome,
}

/// One trial's plan.
#[derive(Clone, Debug)]
pub struct Trial {
    pub policy: String,
    pub mode: String,
    pub trial: u32,
    pub seed: u64,
    pub min_run_ms: u64,
    pub max_run_ms: u64,
    /// Device fault specs; the upstream NBD backing store (shared by the
    /// trials; the region is zeroed first) and its error file (created when
    /// the workload starts, removed at the crash).
    pub faults: Faults,
    /// Extra `nvwc serve` flags (`--server-arg`).
    pub server_args: Vec<String>,
    /// The server's cache size (`--cache-size`).
    pub cache_size: u64,
    /// Longest workload write, in blocks (`--max-write-blocks`).
    pub max_write_blocks: u64,
    pub workload: Workload,
}

impl Trial {
    /// Trial `trial` of `policy` under crash mode `mode`: the small workload
    /// on the default cache, no faults, runs of 30 to 800 ms.
    pub fn new(policy: &str, mode: &str, trial: u32, seed: u64) -> Trial {
        Trial {
            policy: policy.to_string(),
            mode: mode.to_string(),
            trial,
            seed,
            min_run_ms: 30,
            max_run_ms: 800,
            faults: Faults::default(),
            server_args: Vec::new(),
            cache_size: CACHE_SIZE,
            max_write_blocks: 4,
            workload: Workload::Small,
        }
    }

    /// Cache-device faults under write-back that rewrites in place (the
    /// server's default): a failed write may damage its blocks' last flushed
    /// version, as on a disk, so the flush contract does not judge them.
    pub fn failed_writes_undefined(&self) -> bool {
        let fresh_slots = self.server_arg("--rewrite-in-place") == Some("false");
        self.faults.fault_cache.is_some() && self.policy == "write-back" && !fresh_slots
    }

    /// May admission send writes around the cache (`--admission` other
    /// than `all`)? Under journaled-hints such a write reaches the backing
    /// store between FLUSHes (`docs/ARCHITECTURE.md`, "Admission and
    /// bypass"), so its backing store alone is held to point-in-time only.
    pub fn admission_may_bypass(&self) -> bool {
        self.server_arg("--admission").is_some_and(|a| a != "all")
    }

    /// The value of `nvwc serve` flag `name` among `--server-arg`s, given
    /// as `name=value` or as `name value` (the last one wins, as for clap).
    fn server_arg(&self, name: &str) -> Option<&str> {
        let a = &self.server_args;
        let mut found = None;
        for (i, x) in a.iter().enumerate() {
            if let Some(v) = x.strip_prefix(name).and_then(|r| r.strip_prefix('=')) {
                found = Some(v);
            } else if x == name {
                found = a.get(i + 1).map(String::as_str);
            }
        }
        found
    }
}

/// The seed of the `n`-th trial (from 1) of a run seeded with `seed`: spread
/// out so that neighbouring trials do not share workload streams.
pub fn trial_seed(seed: u64, n: u64) -> u64 {
    seed.wrapping_add(n.wrapping_mul(0x1000_0001))
}

/// Workload region and device sizes: the cache holds about half the region,
/// so write-back, cleaning and checkpoints all happen within a second.
const REGION_BLOCKS: u64 = 3072;
const BACKING_SIZE: u64 = 16 << 20;
pub const CACHE_SIZE: u64 = 6 << 20;

pub fn run_trial(t: &Trial, root: &Path, keep: bool) -> Result<TrialResult> {
    let dir = root.join(format!(
        "{}-{}-{}-{}",
        t.policy,
        t.mode,
        t.workload.name(),
        t.trial
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let mut rng = Rng::new(t.seed);
    let nonce = rng.next_u64();
    let (env, failpoint) = server_env(t, &dir, &mut rng)?;
    let mut cfg = ServerCfg {
        dir: dir.clone(),
        policy: t.policy.clone(),
        backing_size: BACKING_SIZE,
        cache_size: t.cache_size,
        env,
        extra_args: t.server_args.clone(),
        backing_uri: t.faults.backing_uri.clone(),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if let Some(u) = &t.faults.backing_uri {
        // A previous trial's server may have left a logged group in the redo
        // region: finish it before zeroing, or the new server would replay it.
        recover(u)?;
        rt.block_on(zero_region(u))?;
    }
    let run = run_until_crash(t, &cfg, &rt, &mut rng, nonce)?;
    let host_crash = t.mode == "host-crash";
    // The host went down with the server: of each device's writes that were
    // not durable, a random subset reaches it, some torn.
    let crashed = if host_crash {
        let mut crng = Rng::new(t.seed ^ 0x686f_7374_6372_7368);
        let mut crash = |log: &str, file: PathBuf, uri: Option<&str>| {
            apply_host_crash(&dir.join(log), &file, uri, &rt, &mut crng)
        };
        let cache = crash("cache.volatile", cfg.cache(), None)?;
        let backing = crash(
            "backing.volatile",
            cfg.backing(),
            t.faults.backing_uri.as_deref(),
        )?;
        Some(HostCrash { cache, backing })
    } else {
        None
    };
    let h = History::new(&run.ops, REGION_BLOCKS);
    let forced_closes = run
        .status
        .as_deref()
        .and_then(|s| counter(s, "journal_forced_closes"));
    let judge = Judge {
        t,
        h: &h,
        nonce,
        // Blocks a host crash tore are read sector by sector.
        torn_from: host_crash.then_some(&h),
        host_crash,
        forced_closes,
        crash_us: run.crash_us,
    };
    let (cache_intact, cache_lost) = judge.both(&mut cfg, &rt)?;
    let r = TrialResult {
        policy: t.policy.clone(),
        mode: t.mode.clone(),
        failpoint,
        trial: t.trial,
        seed: t.seed,
        signal: run.signal,
        run_ms: run.run_ms,
        counts: h.counts,
        cache_intact,
        cache_lost,
        degraded: run
            .status
            .as_deref()
            .map(|s| s.contains("\"cache_degraded\":1")),
        forced_closes,
        workload: t.workload.name(),
        large_writes: run
            .ops
            .iter()
            .filter(|o| matches!(o, Op::Write { n, .. } if n * BS >= DIRECT_MIN))
            .count() as u64,
        direct_writes: run.status.as_deref().and_then(|s| stat(s, "direct_writes")),
        bypassed_pieces: run
            .status
            .as_deref()
            .and_then(|s| stat(s, "bypassed_pieces")),
        mapped_writes: run
            .status
            .as_deref()
            .and_then(|s| counter(s, "cache_mapped_writes")),
        host_crash: crashed,
    };
    let failed = !r.cache_intact.ok || (!r.cache_lost.ok && t.policy != "write-back");
    if !(keep && failed) {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        std::fs::write(
            dir.join("ops.log"),
            run.ops
                .iter()
                .map(|o| serde_json::to_string(o).unwrap_or_default() + "\n")
                .collect::<String>(),
        )?;
    }
    Ok(r)
}

/// Environment variables for `nvwc serve`.
type ServerEnv = Vec<(String, String)>;

/// The server's environment for the trial's crash mode, with the injected
/// faults joined to the host-crash model's rule; and the failpoint armed, if any.
fn server_env(t: &Trial, dir: &Path, rng: &mut Rng) -> Result<(ServerEnv, Option<String>)> {
    let mut env = Vec::new();
    let mut failpoint = None;
    match t.mode.as_str() {
        "server-crash" => {}
        "host-crash" => {
            // Each device's writes that are not durable go to a side log,
            // applied in part after the kill.
            for (var, log) in [
                ("NVWC_FAULT_CACHE", dir.join("cache.volatile")),
                ("NVWC_FAULT_BACKING", dir.join("backing.volatile")),
            ] {
                env.push((var.to_string(), format!("volatile,log={}", log.display())));
            }
        }
        "failpoint" => {
            // The redo log exists only under the journaled policies.
            let n_fp = if t.policy.starts_with("journaled") {
                6
            } else {
                4
            };
            let fp = FAILPOINTS[rng.below(n_fp) as usize];
            let n = 1 + rng.below(if fp.contains("flush") || fp == "commit-record" {
                8
            } else {
                40
            });
            env.push(("NVWC_FAILPOINTS".to_string(), format!("{fp}:{n}")));
            failpoint = Some(format!("{fp}:{n}"));
        }
        m => bail!("unknown crash mode {m:?} (server-crash, host-crash, failpoint)"),
    }
    for (var, spec) in [
        ("NVWC_FAULT_CACHE", &t.faults.fault_cache),
        ("NVWC_FAULT_BACKING", &t.faults.fault_backing),
    ] {
        let Some(spec) = spec else { continue };
        match env.iter_mut().find(|(k, _)| k == var) {
            Some((_, v)) => *v = format!("{v};{spec}"),
            None => env.push((var.to_string(), spec.clone())),
        }
    }
    Ok((env, failpoint))
}

/// What the run up to the crash left.
struct Run {
    ops: Vec<Op>,
    run_ms: u64,
    /// When the server was killed (µs since the workload started).
    crash_us: u64,
    /// `nvwc status` just before the kill.
    status: Option<String>,
    signal: Option<i32>,
}

/// Start the server, run the workload, and `kill -9` it at a random time
/// while requests are in flight.
fn run_until_crash(
    t: &Trial,
    cfg: &ServerCfg,
    rt: &tokio::runtime::Runtime,
    rng: &mut Rng,
    nonce: u64,
) -> Result<Run> {
    let server = Server::start(cfg, "serve-1.log")?;
    if let Some(f) = &t.faults.error_file {
        std::fs::write(f, b"")?;
    }
    let pid = server.child.id();
    let run_ms = t.min_run_ms + rng.below(t.max_run_ms.saturating_sub(t.min_run_ms).max(1));
    let t0 = Instant::now();
    let ctl = cfg.dir.join("nvwc.ctl");
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(run_ms));
        let status = status_line(&ctl);
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        (t0.elapsed().as_micros() as u64, status)
    });
    let ops = rt.block_on(workload(
        &cfg.uri(),
        nonce,
        REGION_BLOCKS,
        t.max_write_blocks,
        rng,
        t0,
        Duration::from_millis(run_ms + 10_000),
        t.workload,
    ))?;
    let (crash_us, status) = killer.join().expect("killer thread");
    let signal = server.kill9();
    if let Some(f) = &t.faults.error_file {
        std::fs::remove_file(f)?;
    }
    Ok(Run {
        ops,
        run_ms,
        crash_us,
        status,
        signal,
    })
}

/// `nvwc recover` on a backing store (a file or an NBD URI).
fn recover(spec: &str) -> Result<()> {
    let out = Command::new(std::env::current_exe()?)
        .arg("recover")
        .arg("--backing")
        .arg(spec)
        .output()?;
    if !out.status.success() {
        bail!(
            "nvwc recover failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// What the two checks of a trial need.
struct Judge<'a> {
    t: &'a Trial,
    h: &'a History,
    nonce: u64,
    torn_from: Option<&'a History>,
    host_crash: bool,
    forced_closes: Option<u64>,
    crash_us: u64,
}

impl Judge<'_> {
    /// Cache intact: what a restarted server shows, against the flush contract.
    fn cache_intact(&self, cfg: &mut ServerCfg, rt: &tokio::runtime::Runtime) -> Result<Check> {
        cfg.env.clear();
        let server = Server::start(cfg, "serve-2.log")?;
        let region = rt.block_on(read_region_nbd(&cfg.uri(), REGION_BLOCKS))?;
        server.kill9();
        let seen = decode_region(self.nonce, &region, self.torn_from);
        let failed_undefined = self.t.failed_writes_undefined();
        Ok(check_flush_contract(
            self.h,
            &seen,
            self.crash_us,
            failed_undefined,
        ))
    }

    /// Cache lost: a recovered backing store's `region`, against the policy's promise.
    fn cache_lost(&self, region: &[u8]) -> Check {
        let seen = decode_region(self.nonce, region, self.torn_from);
        check_cache_lost(
            &self.t.policy,
            self.host_crash,
            self.forced_closes.unwrap_or(0) > 0 || self.t.admission_may_bypass(),
            self.h,
            &seen,
            self.crash_us,
        )
    }

    /// Both checks: (cache intact, cache lost).
    fn both(&self, cfg: &mut ServerCfg, rt: &tokio::runtime::Runtime) -> Result<(Check, Check)> {
        if let Some(u) = &self.t.faults.backing_uri {
            // Upstream: check the backing alone first (the restart may write it back).
            recover(u)?;
            let lost = self.cache_lost(&rt.block_on(read_region_nbd(u, REGION_BLOCKS))?);
            return Ok((self.cache_intact(cfg, rt)?, lost));
        }
        // Cache lost: copy the backing store as the crash left it.
        let lost = cfg.dir.join("lost");
        std::fs::create_dir_all(&lost)?;
        let lost_backing = lost.join("backing.img");
        std::fs::copy(cfg.backing(), &lost_backing)?;
        let redo = PathBuf::from(format!("{}.nvwc-redo", cfg.backing().display()));
        if redo.exists() {
            std::fs::copy(&redo, lost.join("backing.img.nvwc-redo"))?;
        }
        let intact = self.cache_intact(cfg, rt)?;
        recover(&lost_backing.display().to_string())?;
        let lost = self.cache_lost(&read_region_file(&lost_backing, REGION_BLOCKS)?);
        Ok((intact, lost))
    }
}

/// A host crash on one device: apply a random subset of the writes its side
/// log holds (`log`; none if it is missing), torn at sectors, to the file
/// `file`, or through NBD to the upstream `uri`.
fn apply_host_crash(
    log: &Path,
    file: &Path,
    uri: Option<&str>,
    rt: &tokio::runtime::Runtime,
    rng: &mut Rng,
) -> Result<nvwc_dev::volatile::CrashOutcome> {
    use std::os::unix::fs::FileExt;
    let mut pieces: Vec<(u64, Vec<u8>)> = Vec::new();
    let out = nvwc_dev::volatile::apply_crash(log, &mut || rng.next_u64(), &mut |o, d| {
        pieces.push((o, d.to_vec()));
        Ok(())
    })
    .with_context(|| format!("applying {}", log.display()))?;
    match uri {
        None => {
            let f = std::fs::OpenOptions::new().write(true).open(file)?;
            for (o, d) in &pieces {
                f.write_all_at(d, *o)?;
            }
        }
        Some(u) if !pieces.is_empty() => rt.block_on(async {
            let c = connect(u).await?;
            for (o, d) in pieces {
                c.write(o, Bytes::from(d), false).await?;
            }
            c.flush().await?;
            let _ = c.disconnect().await;
            anyhow::Ok(())
        })?,
        Some(_) => {}
    }
    Ok(out)
}

/// Zero the workload region of an upstream backing store (the trials share it).
async fn zero_region(uri: &str) -> Result<()> {
    let c = connect(uri).await?;
    let chunk = 256 * BS;
    let mut off = 0;
    while off < REGION_BLOCKS * BS {
        c.write(off, Bytes::from(vec![0u8; chunk as usize]), false)
            .await?;
        off += chunk;
    }
    c.flush().await?;
    let _ = c.disconnect().await;
    Ok(())
}
