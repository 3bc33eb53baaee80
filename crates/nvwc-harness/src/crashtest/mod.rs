//! `nvwc crashtest`: crash the live server and check what survives.
//!
//! Each trial starts `nvwc serve` (this same binary) on fresh files, runs a
//! workload client over NBD on a unix socket that writes blocks whose
//! contents encode (sequence number, block) and logs every request's issue
//! and acknowledgement times with its FUA/FLUSH status, then crashes the
//! server. Workloads (`--workloads`): `small` writes 1 to 4 blocks of 4 KiB
//! (the server buffers them and copies them into its mapped cache file; a
//! 16 KiB one may go direct), `large` writes 16 to 64 KiB (each offered to
//! the direct path: received from the socket straight into the mapped cache
//! file), `hot` is `large` within 1 MiB (write-back rewrites those blocks in
//! place, which changes no slot entry: only the next FLUSH's device sync
//! makes the bytes durable). Each trial reports how many writes went
//! direct and how many cache writes were copied into the mapping (`nvwc
//! status` just before the crash).
//! Crash modes:
//!
//! - `server-crash`: `kill -9` at a random time (the page cache survives);
//! - `host-crash`: the same, with both devices in host-crash mode
//!   (`nvwc-dev/src/volatile.rs`): each file holds only what was made durable, the
//!   cache file is mapped private so mapped and direct writes take their
//!   usual path, and every write not yet durable is in a side log. After
//!   the kill, a random subset of those writes, seeded by the trial's seed,
//!   reaches each file in completion order, each lost, whole, or torn at
//!   512-byte sectors, as a power loss may leave a disk's volatile cache
//!   (`docs/ARCHITECTURE.md`, "Crash testing the live server");
//! - `failpoint`: a random failpoint (`NVWC_FAILPOINTS`) aborts the server in
//!   the commit window, a checkpoint, a redo apply or a write-back.
//!
//! Then two checks:
//!
//! 1. **Cache intact.** Restart on the same files and read every block back:
//!    every write acknowledged before a completed FLUSH, and every
//!    acknowledged FUA write, must be there (or a newer write of the block),
//!    and no block may hold bytes no write produced.
//! 2. **Cache lost.** On a copy of the backing file taken right after the
//!    crash, run `nvwc recover`, then check the backing alone against the
//!    policy's promise: `write-through` holds everything acknowledged;
//!    `ordered` and `journaled` are a point-in-time state (some prefix of the
//!    write sequence; the one write at the cut may be partly there, as NBD
//!    gives multi-block writes no atomicity); `journaled-hints` is exactly the
//!    state at a FLUSH; `write-back` promises nothing and is checked against
//!    point-in-time to show what it does. Staleness (acknowledged writes
//!    after the cut, and how long before the crash the first was
//!    acknowledged) is reported.
//!
//! After a host crash a block may be torn: its sectors from different
//! writes ([`Seen::Torn`]). Both checks then judge it sector by sector: each
//! sector must hold what the block as a whole would have to (its durable
//! write or a newer one; the prefix's write, or at the cut the write before
//! it), so a tear of a write that was not durable passes and any sector of
//! an older or foreign write fails.
//!
//! The client keeps one request in flight, so the server's sequence order is
//! the client's issue order and the prefix search is exact.

//!
//! Files: `server` runs `nvwc serve` and talks to its control socket;
//! `workload` is the client that logs every request; `blocks` encodes and
//! decodes what it writes; `check` holds the log's index and the checks;
//! `trial` runs one trial end to end; `summary` aggregates and prints.

mod blocks;
mod check;
mod server;
mod summary;
mod trial;
mod workload;

use std::path::PathBuf;

use anyhow::{Context, Result};

pub use blocks::{block_bytes, decode, decode_region, decode_sectors, Seen, SECTOR};
pub use check::{
    check_all_acked, check_cache_lost, check_flush_contract, check_point_in_time, Check, Counts,
    History,
};
pub use server::{connect, control_line, Server, ServerCfg};
pub(crate) use server::{stat, status_line};
use summary::{print_summary, verdict};
pub use summary::{summarize, Summary};
pub use trial::{run_trial, trial_seed, HostCrash, Trial, TrialResult, CACHE_SIZE};
pub use workload::{
    read_region_file, read_region_nbd, workload, Op, Workload, DIRECT_MIN, HOT_BLOCKS,
};

/// Block size of the workload (and of the server's cache).
pub const BS: u64 = 4096;

pub const POLICIES: [&str; 5] = [
    "write-through",
    "write-back",
    "ordered",
    "journaled",
    "journaled-hints",
];

/// Failpoints a `failpoint` trial picks from (see `nvwc-server/src/fault.rs`).
pub const FAILPOINTS: [&str; 6] = [
    "cache-flush",
    "commit-record",
    "writeback",
    "backing-flush",
    "checkpoint",
    "redo-apply",
];

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Write policies, comma-separated.
    #[arg(
        long,
        default_value = "write-through,write-back,ordered,journaled,journaled-hints"
    )]
    pub policies: String,
    /// Crash modes, comma-separated: server-crash, host-crash, failpoint.
    #[arg(long, default_value = "server-crash,host-crash,failpoint")]
    pub modes: String,
    /// Workloads, comma-separated: `small` (1 to 4 blocks: buffered writes,
    /// copied into the mapped cache file; the 16 KiB ones may go direct),
    /// `large` (16 to 64 KiB: direct writes, received from the unix socket
    /// straight into the mapped cache file), `hot` (as `large`, within 1 MiB:
    /// write-back rewrites the blocks in place).
    #[arg(long, default_value = "small")]
    pub workloads: String,
    /// Trials per policy, mode and workload.
    #[arg(long, default_value_t = 5)]
    pub trials: u32,
    /// Longest workload run before the crash (each trial picks at random up to this).
    #[arg(long, default_value_t = 800)]
    pub max_run_ms: u64,
    /// Shortest workload run before the crash.
    #[arg(long, default_value_t = 30)]
    pub min_run_ms: u64,
    /// Seed (default: from the clock); printed so a run can be repeated.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Working directory (default: a new one under the system temp dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Keep the files of failed trials.
    #[arg(long)]
    pub keep: bool,
    #[command(flatten)]
    pub faults: Faults,
    /// Print one JSON object per trial, and a summary object.
    #[arg(long)]
    pub json: bool,
    /// Run the ext4 check instead (see `ext4.rs`): mkfs, file workload, kill, drop the cache, e2fsck.
    #[arg(long)]
    pub ext4: bool,
    /// ext4 trials: cache size in MiB (a smaller cache makes write-back
    /// write back during the run instead of holding everything).
    #[arg(long, default_value_t = 12)]
    pub ext4_cache_mib: u64,
    /// Extra `nvwc serve` flag for every trial, repeatable, e.g.
    /// `--server-arg=--block-size=16K`: the workload's 4 KiB writes (and
    /// ext4's) then are partial writes, which lazy fetch keeps as patches
    /// and persists as partial versions.
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    pub server_args: Vec<String>,
    /// Cache size of every trial's server (e.g. 100K, the smallest it
    /// accepts: 16 blocks and a 16 KiB metadata log).
    #[arg(long, default_value = "6M", value_parser = nvwc_core::units::parse_size)]
    pub cache_size: u64,
    /// Longest workload write, in 4 KiB blocks, beyond the workload's own
    /// sizes. A write spanning more than half the cache's blocks reaches the
    /// engine as several writes (`docs/ARCHITECTURE.md`, "Requests of every
    /// advertised size"); with the default (4) the workload is the same as
    /// before this option.
    #[arg(long, default_value_t = 4)]
    pub max_write_blocks: u64,
}

/// The faults of every trial: a fault spec for each device, and an upstream
/// backing store with the file that makes its error filter fail requests.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct Faults {
    /// Fault spec for the cache device during the workload (`fault.rs` syntax).
    #[arg(long)]
    pub fault_cache: Option<String>,
    /// Fault spec for the backing device during the workload.
    #[arg(long)]
    pub fault_backing: Option<String>,
    /// Upstream NBD backing store (e.g. nbdkit with the `error` and `delay` filters).
    #[arg(long)]
    pub backing_uri: Option<String>,
    /// Created while each workload runs, removed at the crash (nbdkit `error-file=`).
    #[arg(long)]
    pub error_file: Option<PathBuf>,
}

impl Faults {
    /// Some writes may fail: a device has a fault spec, or the upstream an
    /// error file.
    pub fn injected(&self) -> bool {
        self.fault_cache.is_some() || self.fault_backing.is_some() || self.error_file.is_some()
    }
}

pub use nvwc_dev::rng::Rng;

pub fn default_dir(what: &str) -> PathBuf {
    std::env::temp_dir().join(format!("nvwc-{what}-{}", std::process::id()))
}

pub fn seed_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
}

/// The run's seed (`--seed`, or the clock) and a working directory
/// (`--dir`, or a new one named after `what`), both announced as `title`.
pub(crate) fn seed_and_dir(a: &Args, what: &str, title: &str) -> Result<(u64, PathBuf)> {
    let seed = a.seed.unwrap_or_else(seed_now);
    let root = a.dir.clone().unwrap_or_else(|| default_dir(what));
    std::fs::create_dir_all(&root)?;
    eprintln!("{title}: seed {seed}, files under {}", root.display());
    Ok((seed, root))
}

pub fn run(a: Args) -> Result<std::process::ExitCode> {
    if a.ext4 {
        return crate::ext4::run(&a);
    }
    let (seed, root) = seed_and_dir(&a, "crashtest", "nvwc crashtest")?;
    let policies: Vec<&str> = a.policies.split(',').map(str::trim).collect();
    let modes: Vec<&str> = a.modes.split(',').map(str::trim).collect();
    let workloads = a
        .workloads
        .split(',')
        .map(|w| Workload::parse(w.trim()))
        .collect::<Result<Vec<_>>>()?;
    let mut all = Vec::new();
    let mut n = 0u64;
    let pb =
        trials_bar((policies.len() * modes.len() * workloads.len()) as u64 * u64::from(a.trials));
    for p in &policies {
        for (m, w) in modes
            .iter()
            .flat_map(|m| workloads.iter().map(move |w| (m, *w)))
        {
            let wn = w.name();
            pb.set_message(format!("{p} {m} {wn}"));
            for i in 0..a.trials {
                n += 1;
                let t = Trial {
                    min_run_ms: a.min_run_ms,
                    max_run_ms: a.max_run_ms,
                    faults: a.faults.clone(),
                    server_args: a.server_args.clone(),
                    cache_size: a.cache_size,
                    max_write_blocks: a.max_write_blocks,
                    workload: w,
                    ..Trial::new(p, m, i, trial_seed(seed, n))
                };
                let r = run_trial(&t, &root, a.keep)
                    .with_context(|| format!("trial {p} {m} {wn} {i} (seed {})", t.seed))?;
                if a.json {
                    println!("{}", serde_json::to_string(&r)?);
                } else if !r.cache_intact.ok || !r.cache_lost.ok {
                    pb.suspend(|| {
                        eprintln!(
                            "  {p} {m} {wn} #{i} seed {}: cache intact {} {}; cache lost {} {}",
                            r.seed,
                            verdict(r.cache_intact.ok),
                            r.cache_intact.detail,
                            verdict(r.cache_lost.ok),
                            r.cache_lost.detail
                        )
                    });
                }
                all.push(r);
                pb.inc(1);
            }
        }
    }
    pb.finish_and_clear();
    let summary = summarize(&all);
    if a.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        print_summary(&summary);
    }
    let _ = std::fs::remove_dir(&root);
    // Under injected faults some writes failed: their blocks may or may not
    // have changed, so only the flush contract is judged.
    let bad = summary.iter().any(|s| {
        s.flushed_lost_trials > 0
            || (!a.faults.injected() && s.policy != "write-back" && s.cache_lost_passes < s.trials)
    });
    Ok(if bad {
        std::process::ExitCode::from(1)
    } else {
        std::process::ExitCode::SUCCESS
    })
}

/// A progress bar over `n` crash trials, on stderr (hidden when stderr is
/// not a terminal).
pub(crate) fn trials_bar(n: u64) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(n);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} trials {msg} (eta {eta})",
        )
        .expect("template")
        .progress_chars("=> "),
    );
    pb
}
