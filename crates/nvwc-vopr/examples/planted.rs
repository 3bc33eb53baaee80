//! Which VOPR seeds catch a planted bug: runs the seeds `FIRST..FIRST+COUNT`
//! of one write policy with the bug planted, and prints every failing seed
//! with its checks. `tests/mutation.rs` runs a few seeds per planted bug;
//! when an engine change moves a rare bug's catching seeds, this finds new
//! ones.
//!
//!     cargo run --release -p nvwc-vopr --example planted -- WaveIgnoresMarking ordered 0 20000

use nvwc_core::mutation::{self, Mutation};
use nvwc_core::WritePolicyKind;
use nvwc_vopr::{run_many, Options};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = || -> ! {
        let names: Vec<String> = Mutation::ALL.iter().map(|m| format!("{m:?}")).collect();
        eprintln!(
            "usage: planted MUTATION POLICY [FIRST [COUNT]]\n  MUTATION: one of {}",
            names.join(", ")
        );
        std::process::exit(2)
    };
    let Some(m) = args
        .first()
        .and_then(|a| Mutation::ALL.iter().find(|m| format!("{m:?}") == *a))
    else {
        usage()
    };
    let Some(policy) = args.get(1).and_then(|p| p.parse::<WritePolicyKind>().ok()) else {
        usage()
    };
    let num = |i: usize, d: u64| args.get(i).map_or(Some(d), |s| s.parse().ok());
    let (Some(first), Some(count)) = (num(2, 0), num(3, 1000)) else {
        usage()
    };
    let o = Options {
        policy,
        replacement: None,
        verbose: false,
        fetch: None,
        admission: None,
        log_inline_bytes: None,
    };
    mutation::set(*m);
    let s = run_many(&o, first, count, 2, &|_| {});
    for (seed, checks) in &s.failing {
        println!("seed {seed}: fails {checks}");
    }
    println!(
        "{m:?} on {policy}: {} failing seeds in {first}..{}; by check (a, b, c, other) {:?}",
        s.failing.len(),
        first + count,
        s.by_check
    );
}
