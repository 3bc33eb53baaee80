//! Per policy, mode and workload: how many trials kept each promise, and the
//! table `nvwc crashtest` prints.

use super::TrialResult;

pub(super) fn verdict(ok: bool) -> &'static str {
    if ok {
        "ok"
    } else {
        "FAIL"
    }
}

/// Per policy, mode and workload.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Summary {
    pub policy: String,
    pub mode: String,
    pub workload: String,
    pub trials: u64,
    /// Trials where the restarted server lost a flushed (or FUA) write or showed garbage.
    pub flushed_lost_trials: u64,
    /// Blocks, over all trials, where it did (lost flushed writes).
    pub flushed_lost_blocks: u64,
    pub cache_lost_passes: u64,
    /// Trials whose backing alone broke the policy's promise.
    pub cache_lost_inconsistent: u64,
    /// Trials the server ended itself (a failpoint's or torn-crash's abort) rather than by kill -9.
    pub self_aborts: u64,
    /// Journaled-hints trials with forced closes (held to point-in-time, not flush-aligned).
    pub forced_close_trials: u64,
    pub acked_writes: u64,
    pub flushes_acked: u64,
    /// Client writes of 16 KiB or more (offered to the direct path).
    pub large_writes: u64,
    /// Writes the server took directly (received into the mapped cache).
    pub direct_writes: u64,
    /// Cache writes copied into the mapped cache file.
    pub mapped_writes: u64,
    /// Host crashes: writes not durable at the crash (both devices), and
    /// of those, how many were lost, kept whole, or torn.
    pub crash_pending: u64,
    pub crash_lost: u64,
    pub crash_whole: u64,
    pub crash_torn: u64,
    /// Blocks read back torn (judged sector by sector), cache intact and lost.
    pub torn_blocks_intact: u64,
    pub torn_blocks_lost: u64,
    pub mean_stale_writes_cache_intact: f64,
    pub mean_stale_writes_cache_lost: f64,
    pub max_stale_ms_cache_lost: f64,
}

pub fn summarize(all: &[TrialResult]) -> Vec<Summary> {
    let mut out: Vec<Summary> = Vec::new();
    for r in all {
        let i = match out
            .iter()
            .position(|s| s.policy == r.policy && s.mode == r.mode && s.workload == r.workload)
        {
            Some(i) => i,
            None => {
                out.push(Summary {
                    policy: r.policy.clone(),
                    mode: r.mode.clone(),
                    workload: r.workload.to_string(),
                    ..Summary::default()
                });
                out.len() - 1
            }
        };
        let s = &mut out[i];
        s.trials += 1;
        s.flushed_lost_trials += u64::from(!r.cache_intact.ok);
        s.flushed_lost_blocks += r.cache_intact.bad_blocks;
        s.cache_lost_passes += u64::from(r.cache_lost.ok);
        s.cache_lost_inconsistent += u64::from(!r.cache_lost.ok);
        s.self_aborts += u64::from(r.signal == Some(6));
        s.forced_close_trials += u64::from(r.forced_closes.unwrap_or(0) > 0);
        s.acked_writes += r.counts.acked;
        s.flushes_acked += r.counts.flushes_acked;
        s.large_writes += r.large_writes;
        s.direct_writes += r.direct_writes.unwrap_or(0);
        s.mapped_writes += r.mapped_writes.unwrap_or(0);
        if let Some(hc) = &r.host_crash {
            for o in [hc.cache, hc.backing] {
                s.crash_pending += o.pending;
                s.crash_lost += o.lost;
                s.crash_whole += o.whole;
                s.crash_torn += o.torn;
            }
        }
        s.torn_blocks_intact += r.cache_intact.torn_blocks;
        s.torn_blocks_lost += r.cache_lost.torn_blocks;
        s.mean_stale_writes_cache_intact += r.cache_intact.stale_writes as f64;
        s.mean_stale_writes_cache_lost += r.cache_lost.stale_writes as f64;
        s.max_stale_ms_cache_lost = s.max_stale_ms_cache_lost.max(r.cache_lost.stale_ms);
    }
    for s in &mut out {
        s.mean_stale_writes_cache_intact /= s.trials as f64;
        s.mean_stale_writes_cache_lost /= s.trials as f64;
    }
    out
}

pub(super) fn print_summary(s: &[Summary]) {
    println!(
        "{:<16} {:<13} {:<6} {:>6} {:>6} {:>12} {:>13} {:>8} {:>8} {:>8} {:>8} {:>16} {:>10} {:>11} {:>12}",
        "policy",
        "mode",
        "load",
        "trials",
        "aborts",
        "flushed-lost",
        "cache-lost ok",
        "acked",
        "flushes",
        "direct",
        "mapped",
        "crash lost/torn",
        "stale(int)",
        "stale(lost)",
        "stale ms max"
    );
    for x in s {
        println!(
            "{:<16} {:<13} {:<6} {:>6} {:>6} {:>12} {:>13} {:>8} {:>8} {:>8} {:>8} {:>16} {:>10.1} {:>11.1} {:>12.0}",
            x.policy,
            x.mode,
            x.workload,
            x.trials,
            x.self_aborts,
            x.flushed_lost_trials,
            format!("{}/{}", x.cache_lost_passes, x.trials),
            x.acked_writes,
            x.flushes_acked,
            x.direct_writes,
            x.mapped_writes,
            format!("{}/{}/{}", x.crash_lost, x.crash_torn, x.crash_pending),
            x.mean_stale_writes_cache_intact,
            x.mean_stale_writes_cache_lost,
            x.max_stale_ms_cache_lost
        );
    }
    println!("(flushed-lost: trials where the restarted server lost an acknowledged write covered by a FLUSH or FUA; cache-lost ok: the backing alone kept the policy's promise; direct: writes received from the socket straight into the mapped cache; mapped: cache writes copied into it; crash lost/torn: of the writes not durable at a host crash (both devices), lost and torn / all; stale: acknowledged writes not visible, mean per trial; stale ms max: age at the crash of the oldest acknowledged write the backing alone missed; aborts: the server died at its failpoint)");
}
