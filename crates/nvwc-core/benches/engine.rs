//! Engine benchmark (`cargo bench -p nvwc-core --bench engine`, or
//! `scripts/bench-engine.sh`). For each write policy, on a stream of 4 KiB
//! random writes with 32 in flight and devices that complete at once:
//! engine operations per second, and bytes of RAM per cached block. For
//! ordered write-back: edge counts on a one-million-write stream with and
//! without dummy nodes. Medians of repeated runs; the machine is noisy.

use std::time::Instant;

use nvwc_core::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

struct Run {
    ops_per_sec: f64,
    bytes_per_block: f64,
    counters: Vec<(&'static str, u64)>,
}

fn run(cfg: Config, writes: u64, qd: u64, seed: u64) -> Run {
    let blocks = cfg.backing_blocks();
    let mut e: Engine<Phantom> = Engine::new(cfg).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut now = 0u64;
    let mut issued = 0u64;
    let mut done = 0u64;
    let mut inflight = 0u64;
    let mut ios: Vec<IoCmd<Phantom>> = Vec::new();
    let t0 = Instant::now();
    while done < writes {
        while inflight < qd && issued < writes {
            issued += 1;
            inflight += 1;
            let lbn = rng.gen_range(0..blocks);
            now += 1_000;
            e.handle_request(
                now,
                Request {
                    id: issued,
                    op: ReqOp::Write {
                        offset: lbn * 4096,
                        data: Phantom(4096),
                        fua: false,
                    },
                    tag: Tag::default(),
                },
            );
        }
        while let Some(c) = e.poll_io() {
            ios.push(c);
        }
        // Complete in a scrambled order.
        while !ios.is_empty() {
            let i = rng.gen_range(0..ios.len());
            let c = ios.swap_remove(i);
            let data = match c.op {
                IoOp::Read { len, .. } => Some(Phantom(len as usize)),
                _ => None,
            };
            now += 100;
            e.handle_completion(now, c.id, Ok(data));
            while let Some(c) = e.poll_io() {
                ios.push(c);
            }
        }
        while let Some(r) = e.poll_reply() {
            assert!(r.result.is_ok());
            if r.id <= writes {
                done += 1;
                inflight -= 1;
            }
        }
        if let Some(t) = e.poll_timeout() {
            if t <= now {
                e.handle_timeout(now);
            }
        }
        if inflight == qd || issued == writes {
            // Nothing completed this round (all waiting on space): let time pass.
            now += 1_000_000;
            e.handle_timeout(now);
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let cached = e.stats().cached_blocks.max(1);
    Run {
        ops_per_sec: writes as f64 / secs,
        bytes_per_block: e.mem_bytes() as f64 / cached as f64,
        counters: e.policy_counters(),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (writes, reps) = if quick { (100_000, 3) } else { (1_000_000, 5) };
    let cap = 65_536u64; // 256 MiB of 4 KiB blocks
    let backing = 1u64 << 20; // 4 GiB
    println!("engine benchmark: 4 KiB random writes, QD32, cache {cap} blocks, backing {backing} blocks, {writes} writes, median of {reps}");
    println!(
        "{:<16} {:>14} {:>16}",
        "policy", "ops/s", "RAM B/cached blk"
    );
    for wp in WritePolicyKind::ALL {
        let mut ops = Vec::new();
        let mut mem = Vec::new();
        for r in 0..reps {
            let mut cfg = Config::new(4096, cap, backing * 4096, wp);
            cfg.replacement = ReplacementKind::Lru;
            let x = run(cfg, writes, 32, r as u64);
            ops.push(x.ops_per_sec);
            mem.push(x.bytes_per_block);
        }
        println!(
            "{:<16} {:>14.0} {:>16.1}",
            wp.name(),
            median(ops),
            median(mem)
        );
    }
    println!();
    println!("ordered write-back: edges on a {writes}-write stream (QD32; 'total' = edges created, 'max live' = most edges held at once)");
    for (label, dummy, reduce) in [
        ("paper rule, no dummy nodes", 0u32, false),
        ("paper rule + dummy nodes (every 100)", 100, false),
        ("frontier reduction, no dummy nodes", 0, true),
        ("nvwc default: reduction + dummy nodes", 100, true),
    ] {
        let mut cfg = Config::new(4096, cap, backing * 4096, WritePolicyKind::Ordered);
        cfg.dummy_every = dummy;
        cfg.ordered_reduction = reduce;
        // Without dummies and without reduction the paper's rule is quadratic:
        // the stored graph is only affordable on a shorter stream.
        let n = if dummy == 0 && !reduce {
            writes / 100
        } else {
            writes
        };
        let x = run(cfg, n, 32, 7);
        let get = |k: &str| {
            x.counters
                .iter()
                .find(|c| c.0 == k)
                .map(|c| c.1)
                .unwrap_or(0)
        };
        println!(
            "  {label:<40} writes={n:<8} edges total={:<12} max live={:<10} dummies={:<7} (raw rule would create {})",
            get("ordered_edges_total"),
            get("ordered_edges_max"),
            get("ordered_dummies"),
            get("ordered_raw_rule_edges")
        );
    }
}
