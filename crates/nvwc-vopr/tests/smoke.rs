//! A short VOPR run of every write policy with its verdict, for quick
//! feedback on an engine change (and the test command of
//! `scripts/mutants.sh`). The acceptance run is
//! `nvwc vopr --write-policy all --seeds 20000`; CI runs 3000 seeds.

use nvwc_core::WritePolicyKind;
use nvwc_vopr::{run_many, Options};

/// `policy` with every other dimension drawn per seed.
fn options(policy: WritePolicyKind) -> Options {
    Options {
        policy,
        replacement: None,
        verbose: false,
        fetch: None,
        admission: None,
        log_inline_bytes: None,
    }
}

#[test]
fn every_policy_passes_its_verdict_on_a_few_hundred_seeds() {
    let seeds: u64 = std::env::var("NVWC_VOPR_SMOKE_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let mut failed = Vec::new();
    for policy in WritePolicyKind::ALL {
        let s = run_many(&options(policy), 0, seeds, 2, &|_| {});
        if let Err(why) = s.verdict() {
            let first = s
                .first_failure
                .as_ref()
                .map(|f| {
                    format!(
                        "seed {}: {}",
                        f.seed,
                        f.violations.first().cloned().unwrap_or_default()
                    )
                })
                .unwrap_or_default();
            failed.push(format!("{policy}: {why}; {first}"));
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

/// Seeds the VOPR once failed on, each with the policy it failed and why
/// (kept so that the fix stays): they must pass.
#[test]
fn seeds_that_once_failed_pass() {
    // journaled-hints 12401: a bypassed write failed after landing whole in
    // the backing store's volatile state; a read filled the cache with its
    // bytes as a clean copy, a power loss took them from the backing store,
    // and after recovery reads of the block changed with no write.
    // ordered 401643 (admission critical-pi, two rounds): the same fill, of
    // a failed write's bytes seen by the first recovery's read-back; after
    // the second crash the block showed the version before it. Fails on
    // 51aeb8e, passes since the fill fix (65c98dc).
    let cases = [
        (WritePolicyKind::JournaledHints, 12401u64),
        (WritePolicyKind::Ordered, 401643),
    ];
    for (policy, seed) in cases {
        let s = run_many(&options(policy), seed, 1, 1, &|_| {});
        assert_eq!(
            s.violations,
            0,
            "{policy} seed {seed}: {:?}",
            s.first_failure.map(|f| f.violations)
        );
    }
}
