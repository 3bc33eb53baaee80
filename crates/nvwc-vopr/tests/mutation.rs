//! The VOPR's verdict bites on write-back: with a planted bug that breaks the
//! flush contract (check (b)), the run that passes without it fails. The
//! `nvwc vopr` command exits with the same verdict
//! (`PolicySummary::verdict`), so this is the command failing.
//!
//! One test per binary: the planted bug is process-wide.

use nvwc_core::mutation::{self, Mutation};
use nvwc_core::{FetchMode, WritePolicyKind};
use nvwc_vopr::{run_many, Options};

#[test]
fn a_write_back_flush_contract_violation_fails_the_run() {
    let opts = Options {
        policy: WritePolicyKind::WriteBack,
        replacement: None,
        verbose: false,
        // Direct patch writes need partial writes kept as patches.
        fetch: Some(FetchMode::Lazy),
        admission: None,
    };
    let seeds = 1500;
    mutation::set(Mutation::None);
    let clean = run_many(&opts, 0, seeds, 2, &|_| {});
    assert_eq!(clean.by_check[1], 0, "no (b) failure without the bug");
    assert!(clean.by_check[2] > 0, "write-back fails (c) on some seeds");
    assert_eq!(
        clean.verdict(),
        Ok(()),
        "write-back failing only (c) passes"
    );

    mutation::set(Mutation::FlushSkipsDirectCover);
    let planted = run_many(&opts, 0, seeds, 2, &|_| {});
    mutation::set(Mutation::None);
    eprintln!(
        "failing seeds by check (a, b, c, other): without the bug {:?}, with it {:?}",
        clean.by_check, planted.by_check
    );
    assert!(
        planted.by_check[1] > 0,
        "the planted bug fails check (b) on some seeds: {:?}",
        planted.by_check
    );
    let why = planted.verdict().expect_err("a (b) failure fails the run");
    assert!(why.contains("(b)"), "{why}");
}
