//! Throughput of exact Mattson and SHARDS (fixed-rate R=0.01, fixed-size).
//!
//! `cargo bench -p nvwc-mrc --bench shards` (release). Prints requests/s for a
//! synthetic 20M-key Zipf-like stream and, if present, the 4 KiB block numbers
//! of ../shared/traces/cloudPhysicsIO.vscsi (beside the repository) repeated to >= 10M accesses
//! (override the path with NVWC_VSCSI).

use std::hint::black_box;
use std::time::Instant;

use nvwc_mrc::{Histogram, Mrc, ShardsFixedRate, ShardsFixedSize, StackDistance};

const SYNTH_N: usize = 20_000_000;
const SYNTH_UNIVERSE: u64 = 4_000_000;
const TRACE_MIN: usize = 10_000_000;

#[path = "../tests/common/mod.rs"]
mod common;

/// The synthetic stream: [`common::zipfish`] from seed 42, unsalted.
fn zipfish(n: usize, universe: u64) -> Vec<u64> {
    common::zipfish(n, universe, 42, 0)
}

/// 4 KiB block numbers touched by each vSCSI v1 record, in order.
fn vscsi_blocks(path: &str) -> Option<Vec<u64>> {
    let data = std::fs::read(path).ok()?;
    let mut out = Vec::new();
    for r in data.chunks_exact(32) {
        let len = u32::from_le_bytes(r[4..8].try_into().unwrap()) as u64;
        let lbn = u64::from_le_bytes(r[16..24].try_into().unwrap());
        let first = lbn * 512 / 4096;
        let last = (lbn * 512 + len.max(1) - 1) / 4096;
        out.extend(first..=last);
    }
    Some(out)
}

fn rate(n: usize, secs: f64) -> String {
    format!("{:7.2} M req/s", n as f64 / secs / 1e6)
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / 1048576.0
}

/// Seconds `access` takes for every key of `keys` (kept opaque to the optimiser).
fn timed(keys: &[u64], mut access: impl FnMut(u64)) -> f64 {
    let t = Instant::now();
    for &k in black_box(keys) {
        access(k);
    }
    t.elapsed().as_secs_f64()
}

fn run(label: &str, keys: &[u64]) {
    println!("== {label}: {} accesses", keys.len());
    let t = Instant::now();
    let mut sd = StackDistance::new();
    let mut h = Histogram::bounded(1 << 20);
    for &k in keys {
        h.record(sd.access(k));
    }
    let secs = t.elapsed().as_secs_f64();
    let distinct = sd.distinct();
    println!(
        "exact Mattson            {}  ({secs:.2} s, {distinct} distinct, {:.1} MiB)",
        rate(keys.len(), secs),
        mib(sd.mem_bytes() + h.mem_bytes())
    );
    let exact: Mrc = h.mrc();
    let sizes: Vec<u64> = (1..=100).map(|i| i * distinct as u64 / 100).collect();

    // One SHARDS line: throughput, `detail`, then the error against the
    // exact curve and the memory of `(curve, memory in bytes)`.
    let line = |label: &str, secs: f64, detail: String, (mrc, mem_bytes): (Mrc, usize)| {
        println!(
            "{label}   {}  ({secs:.2} s, {detail}, MAE {:.4}, {:.2} MiB)",
            rate(keys.len(), secs),
            exact.mae(&mrc, &sizes),
            mib(mem_bytes)
        )
    };

    let mut fr = ShardsFixedRate::new(0.01);
    let secs = timed(keys, |k| fr.access(k));
    let sampled = format!("{} sampled", fr.sampled_keys());
    let curve = (fr.mrc(), fr.mem_bytes());
    line("SHARDS fixed-rate 0.01", secs, sampled, curve);

    let mut fs = ShardsFixedSize::new(8192);
    let secs = timed(keys, |k| fs.access(k));
    let final_rate = format!("final R {:.5}", fs.rate());
    let curve = (fs.mrc(), fs.mem_bytes());
    line("SHARDS fixed-size 8192", secs, final_rate, curve);
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` would too. Skip heavy work
    // when invoked as a test (e.g. `cargo test --all-targets` runs benches in test mode).
    if std::env::args().any(|a| a == "--test") || cfg!(debug_assertions) {
        println!("shards bench: skipped (run with `cargo bench`)");
        return;
    }
    let t = Instant::now();
    let keys = zipfish(SYNTH_N, SYNTH_UNIVERSE);
    println!(
        "generated synthetic stream in {:.2} s",
        t.elapsed().as_secs_f64()
    );
    run("synthetic Zipf-like (log-uniform over 4M keys)", &keys);
    drop(keys);

    let path = std::env::var("NVWC_VSCSI").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/traces/cloudPhysicsIO.vscsi"
        )
        .to_string()
    });
    match vscsi_blocks(&path) {
        Some(blocks) if !blocks.is_empty() => {
            let reps = TRACE_MIN.div_ceil(blocks.len());
            let mut keys = Vec::with_capacity(reps * blocks.len());
            for _ in 0..reps {
                keys.extend_from_slice(&blocks);
            }
            run(
                &format!("{path} 4 KiB blocks ({} per pass) x{reps}", blocks.len()),
                &keys,
            );
        }
        _ => println!("{path}: not found, trace benchmark skipped"),
    }
}
