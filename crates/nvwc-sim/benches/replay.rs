//! Replay speed of the simulator's two models on a real trace.
//!
//! `cargo bench -p nvwc-sim --bench replay` (release). Replays
//! ../shared/traces/cloudPhysicsIO.vscsi (beside the repository) (override with NVWC_TRACE)
//! `REPS` times (env, default 5) through:
//! - the hit-ratio model (`hitratio::run_file`, LRU, 64 MiB);
//! - the discrete-event driver (`run_plan`: engine, device models, virtual
//!   time; write-back, LRU, 64 MiB, nvdram cache over `net` backing);
//!
//! and prints the median requests/s and block accesses/s of each. The
//! comparison with libCacheSim, measured in the same run, is
//! `scripts/crosscheck-libcachesim.sh` (libCacheSim is not a dependency).

use std::path::PathBuf;

use nvwc_core::WritePolicyKind;
use nvwc_replacement::ReplacementKind;
use nvwc_sim::addr::{AddressMode, DevSelect, ScanOptions, TracePlan};
use nvwc_sim::hitratio::{run_file, HitRatioConfig};
use nvwc_sim::{run_plan, SimConfig};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let trace = PathBuf::from(std::env::var("NVWC_TRACE").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/traces/cloudPhysicsIO.vscsi"
        )
        .into()
    }));
    if !trace.exists() {
        eprintln!("SKIP: {} not found (set NVWC_TRACE)", trace.display());
        return;
    }
    let reps: usize = std::env::var("REPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5)
        .max(1);

    let hr = HitRatioConfig {
        replacement: ReplacementKind::Lru,
        cache_bytes: 64 << 20,
        block_size: 4096,
        read_allocate: true,
    };
    let mut rates = Vec::new();
    let mut acc = Vec::new();
    let mut hit = 0.0;
    for _ in 0..reps {
        let r = run_file(&hr, &trace, None, None, None).expect("hit-ratio replay");
        rates.push(r.replay_rate);
        acc.push(r.accesses_per_sec);
        hit = r.hit_ratio;
    }
    println!(
        "hit-ratio model, lru 64M: median {:.0} requests/s, {:.0} block accesses/s (hit ratio {:.4}, {reps} runs)",
        median(rates),
        median(acc),
        hit
    );

    let cfg = SimConfig::new(WritePolicyKind::WriteBack, ReplacementKind::Lru, 64 << 20);
    let opts = ScanOptions {
        select: DevSelect::All,
        mode: AddressMode::Auto,
        limit: None,
        block_size: 4096,
        device_capacity: 1 << 50,
        reserve_bytes: cfg.reserve_bytes(),
        backing_size: None,
    };
    let plan = TracePlan::scan(&trace, None, &opts).expect("scan");
    let mut rates = Vec::new();
    for _ in 0..reps {
        let r = run_plan(&cfg, &plan, None).expect("des replay");
        rates.push(r.replay_rate);
    }
    println!(
        "discrete-event driver, write-back lru 64M: median {:.0} requests/s ({} requests, {reps} runs)",
        median(rates),
        plan.records
    );
}
