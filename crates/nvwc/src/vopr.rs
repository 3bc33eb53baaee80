//! `nvwc vopr`.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Result;
use nvwc_core::{AdmissionKind, FetchMode, ReplacementKind, WritePolicyKind};
use nvwc_vopr::{run_many, run_seed, Options};

#[derive(clap::Args)]
pub struct Args {
    /// A write policy name, or `all`.
    #[arg(long, default_value = "all")]
    write_policy: String,
    /// Number of seeds per policy.
    #[arg(long, default_value_t = 1000)]
    seeds: u64,
    /// Run only this seed (with a trace when --verbose).
    #[arg(long)]
    seed: Option<u64>,
    /// First seed of the range.
    #[arg(long, default_value_t = 0)]
    first_seed: u64,
    /// Fix the replacement policy (lru, arc, lst, stack); random per seed otherwise.
    #[arg(long)]
    replacement: Option<String>,
    /// Worker threads (default: available cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Print the run's trace (with --seed).
    #[arg(long)]
    verbose: bool,
    /// Fetch mode for partial writes to uncached blocks: blocking, async,
    /// async-bg, lazy (patches), or random (per seed).
    #[arg(long, default_value = "random")]
    fetch: String,
    /// Admission policy (all, sync, wal, critical, critical+pi,
    /// critical+pi+ioi), or random (per seed).
    #[arg(long, default_value = "random")]
    admission: String,
    /// Append every failing seed (`policy seed checks`) to this file, to
    /// compare two runs seed by seed.
    #[arg(long)]
    seed_log: Option<std::path::PathBuf>,
}

fn parse_repl(s: &str) -> Result<ReplacementKind> {
    s.parse().map_err(|e| anyhow::anyhow!("{e}"))
}

pub fn run(a: Args) -> Result<ExitCode> {
    let policies: Vec<WritePolicyKind> = if a.write_policy == "all" {
        WritePolicyKind::ALL.to_vec()
    } else {
        a.write_policy
            .split(',')
            .map(|p| p.parse())
            .collect::<Result<_, _>>()?
    };
    let replacement = a.replacement.as_deref().map(parse_repl).transpose()?;
    let fetch: Option<FetchMode> = match a.fetch.as_str() {
        "random" => None,
        m => Some(m.parse()?),
    };
    let admission: Option<AdmissionKind> = match a.admission.as_str() {
        "random" => None,
        m => Some(m.parse()?),
    };
    let threads = a.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let mut bad = false;
    for policy in policies {
        let opts = Options {
            policy,
            replacement,
            verbose: a.verbose,
            fetch,
            admission,
            log_inline_bytes: None,
        };
        if let Some(seed) = a.seed {
            let r = run_seed(seed, &opts);
            println!(
                "write-policy={} seeds=1 violations={}",
                policy.name(),
                (!r.violations.is_empty()) as u32
            );
            println!("  config: {}", r.config);
            println!(
                "  ops={} crashed_at_event={} stale_writes={} forced_closes={}",
                r.ops, r.crashed_at_event, r.stale_writes, r.forced_closes
            );
            for v in &r.violations {
                println!("  violation: {v}");
            }
            if let Err(why) = nvwc_vopr::seed_verdict(policy, &r) {
                println!("  FAIL: {why}");
                bad = true;
            }
            continue;
        }
        let shown = AtomicU64::new(0);
        let total = a.seeds;
        let tty = std::io::stderr().is_terminal();
        let progress = |d: u64| {
            let step = (total / 20).max(1);
            if tty && d.is_multiple_of(step) && shown.fetch_max(d, Ordering::Relaxed) < d {
                eprint!("\r  {}: {d}/{total} seeds", policy.name());
                let _ = std::io::stderr().flush();
            }
        };
        let s = run_many(&opts, a.first_seed, a.seeds, threads, &progress);
        if tty {
            eprint!("\r\x1b[K");
        }
        if let Some(path) = &a.seed_log {
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?;
            for (seed, checks) in &s.failing {
                writeln!(f, "{} {seed} {checks}", s.policy)?;
            }
        }
        println!(
            "write-policy={} seeds={} violations={}",
            s.policy, s.seeds, s.violations
        );
        let [ca, cb, cc, other] = s.by_check;
        println!(
            "  failing seeds by check: (a) reads={ca} (b) flush-contract={cb} (c) cache-lost={cc} other={other}; seeds with forced journal closes={}; stale acknowledged writes after cache loss={}",
            s.forced_close_seeds, s.stale_writes
        );
        let [pc, pm, pr, pf, pb, pp, prf, pwf] = s.patches;
        if pc + pb > 0 {
            println!(
                "  patches: created={pc} merged={pm} reads_from_patches={pr} brought_up_to_date={pf} fallbacks={pb} persisted_partial={pp} partial_read_fetches={prf} partial_write_fetches={pwf}"
            );
        }
        println!(
            "  direct writes (payload placed by the driver): {}; warm restarts before a crash: {} (stops that ran out of retries and restarted cold: {})",
            s.direct_writes, s.warm_restarts, s.stops_given_up
        );
        if s.slow_sync_seeds > 0 {
            println!(
                "  seeds whose cache device had slow syncs (FLUSH and FUA 0.1-8 ms): {}",
                s.slow_sync_seeds
            );
        }
        if s.reply_batches.0 > 0 {
            println!(
                "  replies held and sent in batches (the engine told before each): {} seeds, {} batches",
                s.reply_batches.0, s.reply_batches.1
            );
        }
        println!(
            "  longest request wait: {:.1} ms (seed {}; liveness bound {} ms); most metadata pages in one commit: {}",
            s.max_latency.0 as f64 / 1e6,
            s.max_latency.1,
            nvwc_vopr::LIVENESS_NS / 1_000_000,
            s.max_commit_pages
        );
        let [lc, cp, lr, ld, li, lw] = s.log;
        println!(
            "  commits: log records={lc} (inline={li}) checkpoints={cp}; at recovery: log records replayed={lr} dropped (data did not match)={ld} inline versions written back={lw}"
        );
        let [ab, ar, ai, ad] = s.admission;
        if ab + ar > 0 {
            println!(
                "  admission: bypassed={ab} refused_unsafe={ar} reissued={ai} discarded_completions={ad}"
            );
        }
        if let Some(f) = &s.first_failure {
            let rep = a
                .replacement
                .as_ref()
                .map(|r| format!(" --replacement {r}"))
                .unwrap_or_default();
            println!(
                "  first failing seed: {} ({})",
                f.seed,
                f.violations.first().map(String::as_str).unwrap_or("")
            );
            println!(
                "  replay: nvwc vopr --write-policy {} --seed {}{rep} --verbose",
                s.policy, f.seed
            );
        }
        match s.verdict() {
            Ok(()) if policy == WritePolicyKind::WriteBack => {
                println!("  ok: write-back fails only (c), losing the cache device, as it must")
            }
            Ok(()) => {}
            Err(why) => {
                println!("  FAIL: {why}");
                bad = true;
            }
        }
    }
    Ok(if bad {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
