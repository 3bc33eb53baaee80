//! Model-based tests: every write policy × every replacement policy, driven
//! one request at a time against a flat-array oracle, with device commands
//! completing in random order. After each run everything dirty is written
//! back and the backing store must equal the oracle; then the engine is
//! reopened from its cache device and must still read the oracle.

use bytes::Bytes;
use nvwc_core::testkit::MemHarness;
use nvwc_core::*;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[derive(Clone, Debug)]
enum Op {
    Write {
        sector: u64,
        n: u64,
        fua: bool,
        fill: u8,
    },
    Zero {
        sector: u64,
        n: u64,
    },
    Read {
        sector: u64,
        n: u64,
    },
    Flush,
    Trim {
        sector: u64,
        n: u64,
    },
    Checkpoint,
}

/// A plain (not FUA) write of `len` bytes of `byte` at `offset`.
fn write_op(offset: u64, byte: u8, len: usize) -> ReqOp<Bytes> {
    ReqOp::Write {
        offset,
        data: Bytes::from(vec![byte; len]),
        fua: false,
    }
}

fn read_op(offset: u64, len: u32) -> ReqOp<Bytes> {
    ReqOp::Read { offset, len }
}

fn repls() -> Vec<ReplacementKind> {
    vec![
        ReplacementKind::Lru,
        ReplacementKind::Arc,
        ReplacementKind::Lst { track_blocks: 4 },
        ReplacementKind::Stack {
            track_blocks: 4,
            knee: KneeSource::Fixed(8),
        },
    ]
}

fn config(wp: WritePolicyKind, repl: ReplacementKind, bs: u32, cap: u64, blocks: u64) -> Config {
    let mut c = Config::new(bs, cap, blocks * bs as u64, wp);
    c.replacement = repl;
    c.journal.txn_max_blocks = 6;
    c.dummy_every = 3;
    c.watermarks = Watermarks {
        high: 0.5,
        low: 0.25,
    };
    c
}

/// Run `ops`; returns a description of the first mismatch.
fn run(cfg: Config, ops: &[Op], seed: u64) -> Result<(), String> {
    let sectors = cfg.backing_size / 512;
    let mut h = MemHarness::new(cfg);
    let mut oracle = vec![0u8; (sectors * 512) as usize];
    let mut defined = vec![true; sectors as usize];
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut pick = move |n: usize| rng.gen_range(0..n);
    let mut id = 0u64;
    for op in ops {
        id += 1;
        match *op {
            Op::Write {
                sector,
                n,
                fua,
                fill,
            } => {
                let mut buf = vec![fill; (n * 512) as usize];
                for (i, b) in buf.iter_mut().enumerate() {
                    *b = fill.wrapping_add((i / 512) as u8 ^ (sector as u8));
                }
                oracle[(sector * 512) as usize..((sector + n) * 512) as usize]
                    .copy_from_slice(&buf);
                defined[sector as usize..(sector + n) as usize].fill(true);
                h.submit(
                    id,
                    ReqOp::Write {
                        offset: sector * 512,
                        data: Bytes::from(buf),
                        fua,
                    },
                );
                let r = h.wait(id, &mut pick);
                r.result.map_err(|e| format!("write failed: {e}"))?;
            }
            Op::Zero { sector, n } => {
                let (offset, len) = (sector * 512, (n * 512) as u32);
                oracle[offset as usize..offset as usize + len as usize].fill(0);
                defined[sector as usize..(sector + n) as usize].fill(true);
                h.submit(
                    id,
                    ReqOp::WriteZeroes {
                        offset,
                        len,
                        fua: false,
                    },
                );
                h.wait(id, &mut pick)
                    .result
                    .map_err(|e| format!("zero failed: {e}"))?;
            }
            Op::Read { sector, n } => {
                h.submit(id, read_op(sector * 512, (n * 512) as u32));
                let r = h.wait(id, &mut pick);
                let d = r
                    .result
                    .map_err(|e| format!("read failed: {e}"))?
                    .expect("read data");
                for i in 0..n {
                    let s = sector + i;
                    let got = &d[(i * 512) as usize..((i + 1) * 512) as usize];
                    if defined[s as usize]
                        && got != &oracle[(s * 512) as usize..((s + 1) * 512) as usize]
                    {
                        return Err(format!(
                            "read of sector {s} after op #{id} returned stale data"
                        ));
                    }
                }
            }
            Op::Flush | Op::Checkpoint => {
                let o = if matches!(op, Op::Flush) {
                    ReqOp::Flush
                } else {
                    ReqOp::Checkpoint
                };
                h.submit(id, o);
                h.wait(id, &mut pick)
                    .result
                    .map_err(|e| format!("flush failed: {e}"))?;
            }
            Op::Trim { sector, n } => {
                let (offset, len) = (sector * 512, (n * 512) as u32);
                defined[sector as usize..(sector + n) as usize].fill(false);
                h.submit(id, ReqOp::Trim { offset, len });
                h.wait(id, &mut pick)
                    .result
                    .map_err(|e| format!("trim failed: {e}"))?;
            }
        }
    }
    // Write everything back; the backing store alone must equal the oracle.
    h.engine.start_drain(h.now);
    h.settle(&mut pick);
    if h.engine.dirty_versions() != 0 {
        return Err(format!(
            "{} dirty versions left after drain",
            h.engine.dirty_versions()
        ));
    }
    for s in 0..sectors as usize {
        if defined[s] && h.backing[s * 512..(s + 1) * 512] != oracle[s * 512..(s + 1) * 512] {
            return Err(format!(
                "after drain, backing sector {s} differs from the oracle"
            ));
        }
    }
    // Clean shutdown, reopen, read everything through the cache.
    h.engine.start_shutdown(h.now);
    h.settle(&mut pick);
    h.reopen().map_err(|e| format!("reopen failed: {e}"))?;
    let rid = 1 << 40;
    h.submit(rid, read_op(0, (sectors * 512) as u32));
    let d = h
        .wait(rid, &mut pick)
        .result
        .map_err(|e| format!("read after reopen failed: {e}"))?
        .unwrap();
    for s in 0..sectors as usize {
        if defined[s] && d[s * 512..(s + 1) * 512] != oracle[s * 512..(s + 1) * 512] {
            return Err(format!("after reopen, sector {s} differs from the oracle"));
        }
    }
    Ok(())
}

fn op_strategy(sectors: u64) -> impl Strategy<Value = Op> {
    let span = (0..sectors, 1u64..=16)
        .prop_map(move |(s, n)| (s.min(sectors - 1), n.min(sectors - s.min(sectors - 1))));
    prop_oneof![
        5 => (span.clone(), any::<bool>(), any::<u8>()).prop_map(|((s, n), fua, fill)| Op::Write { sector: s, n, fua: fua && fill % 4 == 0, fill }),
        1 => span.clone().prop_map(|(s, n)| Op::Zero { sector: s, n }),
        4 => span.clone().prop_map(|(s, n)| Op::Read { sector: s, n }),
        1 => Just(Op::Flush),
        1 => span.prop_map(|(s, n)| Op::Trim { sector: s, n }),
        1 => Just(Op::Checkpoint),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn engine_matches_flat_array(
        wp in 0usize..5, rp in 0usize..4, bs_pow in 0u32..4, cap in 32u64..64,
        ops in proptest::collection::vec(op_strategy(256), 1..120), seed in any::<u64>(),
        fetch in 0usize..4, direct in any::<bool>(),
    ) {
        let bs = 512u32 << bs_pow;
        let blocks = (256 * 512 / bs as u64).max(1);
        let mut cfg = config(WritePolicyKind::ALL[wp], repls()[rp], bs, cap, blocks);
        cfg.fetch = FetchMode::ALL[fetch];
        cfg.patch_direct = direct && cfg.write_policy == WritePolicyKind::WriteBack;
        if let Err(e) = run(cfg, &ops, seed) {
            prop_assert!(false, "{e}");
        }
    }
}

/// Every combination, deterministically, with a longer random stream.
#[test]
fn every_policy_combination() {
    for wp in WritePolicyKind::ALL {
        for repl in repls() {
            for seed in 0..6u64 {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                let bs = [512u32, 1024, 4096][seed as usize % 3];
                let sectors = 384u64;
                let mut cfg = config(wp, repl, bs, 32, sectors * 512 / bs as u64);
                // Patches (non-blocking writes) in every fetch mode, with a
                // small patch memory so fallbacks and cleaning happen too.
                cfg.fetch = FetchMode::ALL[seed as usize % 4];
                cfg.patch_mem_bytes = 8192;
                cfg.patch_direct = wp == WritePolicyKind::WriteBack && seed % 2 == 1;
                let ops: Vec<Op> = (0..300)
                    .map(|_| {
                        let s = rng.gen_range(0..sectors);
                        let n = rng.gen_range(1..=16).min(sectors - s);
                        match rng.gen_range(0..14) {
                            0..=5 => Op::Write {
                                sector: s,
                                n,
                                fua: rng.gen_bool(0.1),
                                fill: rng.gen(),
                            },
                            6 => Op::Zero { sector: s, n },
                            7..=10 => Op::Read { sector: s, n },
                            11 => Op::Flush,
                            12 => Op::Trim { sector: s, n },
                            _ => Op::Checkpoint,
                        }
                    })
                    .collect();
                eprintln!("combination {wp} + {repl}, seed {seed}");
                if let Err(e) = run(cfg, &ops, seed) {
                    panic!("{wp} + {repl}: seed {seed}: {e}");
                }
            }
        }
    }
}

/// A journaled transaction holds one copy per block; ordered keeps every version.
#[test]
fn journaled_coalesces_ordered_keeps_versions() {
    for (wp, want) in [
        (WritePolicyKind::Journaled, 1u64),
        (WritePolicyKind::Ordered, 10),
    ] {
        let mut cfg = Config::new(4096, 64, 64 * 4096, wp);
        cfg.journal.txn_max_blocks = 1000;
        cfg.journal.txn_max_age_ns = 0;
        cfg.watermarks = Watermarks {
            high: 1.0,
            low: 1.0,
        };
        let mut h = MemHarness::new(cfg);
        let mut pick = |_n: usize| 0usize;
        for i in 0..10u64 {
            h.submit(i + 1, write_op(0, i as u8, 4096));
            h.wait(i + 1, &mut pick).result.unwrap();
        }
        assert_eq!(
            h.engine.dirty_versions(),
            want,
            "{wp}: dirty versions of one block written 10 times"
        );
        assert_eq!(
            h.engine.stats().overwrites,
            if want == 1 { 9 } else { 0 },
            "{wp}: overwrites absorbed"
        );
    }
}

/// A FLUSH makes acknowledged writes survive a restart that loses nothing but RAM.
#[test]
fn flushed_writes_survive_reopen_without_shutdown() {
    for wp in WritePolicyKind::ALL {
        let cfg = Config::new(4096, 32, 128 * 4096, wp);
        let mut h = MemHarness::new(cfg);
        let mut pick = |n: usize| n - 1;
        h.submit(1, write_op(8192, 7u8, 8192));
        h.wait(1, &mut pick).result.unwrap();
        h.submit(2, ReqOp::Flush);
        h.wait(2, &mut pick).result.unwrap();
        // No drain, no shutdown: reopen from whatever the devices hold.
        let rep = h.reopen().unwrap();
        assert!(!rep.clean_shutdown);
        h.submit(3, read_op(8192, 8192));
        let d = h.wait(3, &mut pick).result.unwrap().unwrap();
        assert!(
            d.iter().all(|&b| b == 7),
            "{wp}: flushed write lost across reopen"
        );
    }
}

/// Bad requests get errors, and the engine keeps serving.
#[test]
fn out_of_range_requests_fail_cleanly() {
    let cfg = Config::new(4096, 32, 64 * 4096, WritePolicyKind::WriteBack);
    let size = cfg.backing_size;
    let mut h = MemHarness::new(cfg);
    let mut pick = |_n: usize| 0usize;
    h.submit(1, read_op(size - 512, 1024));
    assert_eq!(
        h.wait(1, &mut pick).result.unwrap_err(),
        ReqError::InvalidRange
    );
    h.submit(2, write_op(u64::MAX - 10, 1u8, 512));
    assert_eq!(
        h.wait(2, &mut pick).result.unwrap_err(),
        ReqError::InvalidRange
    );
    h.submit(3, write_op(0, 1u8, 512));
    h.wait(3, &mut pick).result.unwrap();
}

#[test]
fn config_validation_rejects_bad_values() {
    let ok = Config::new(4096, 64, 1 << 20, WritePolicyKind::WriteBack);
    assert!(ok.validate().is_ok());
    let mut c = ok.clone();
    c.block_size = 3000;
    assert!(matches!(c.validate(), Err(ConfigError::BlockSize(3000))));
    let mut c = ok.clone();
    c.block_size = 2 << 20;
    assert!(c.validate().is_err());
    let mut c = ok.clone();
    c.capacity_blocks = 3;
    assert!(matches!(c.validate(), Err(ConfigError::Capacity(3))));
    let mut c = ok;
    c.watermarks = Watermarks {
        high: 0.2,
        low: 0.5,
    };
    assert!(matches!(c.validate(), Err(ConfigError::Watermarks)));
}

/// Non-blocking writes: a partial write to an uncached block becomes a patch
/// (no backing read), a read the patch covers is served from RAM, a read it
/// does not cover fetches once, and a FLUSH makes the patch durable.
#[test]
fn patches_avoid_fetch_before_write_and_survive_flush() {
    for wp in [
        WritePolicyKind::WriteBack,
        WritePolicyKind::Ordered,
        WritePolicyKind::Journaled,
        WritePolicyKind::JournaledHints,
    ] {
        for fetch in FetchMode::ALL {
            let mut cfg = Config::new(4096, 32, 128 * 4096, wp);
            cfg.fetch = fetch;
            let mut h = MemHarness::new(cfg);
            let mut pick = |n: usize| n - 1;
            h.submit(1, write_op(8192 + 1024, 5u8, 2048));
            h.wait(1, &mut pick).result.unwrap();
            let st = h.engine.stats();
            if fetch == FetchMode::Blocking {
                assert_eq!(st.backing_reads, 1, "{wp}/{fetch}: fetch-before-write");
                assert_eq!(st.patches_created, 0);
            } else {
                assert_eq!(st.patches_created, 1, "{wp}/{fetch}");
            }
            if fetch == FetchMode::Lazy {
                assert_eq!(st.backing_reads, 0, "{wp}/{fetch}: no fetch yet");
                // Covered by the patch: served from RAM, still no device I/O.
                h.submit(2, read_op(8192 + 1536, 1024));
                let d = h.wait(2, &mut pick).result.unwrap().unwrap();
                assert!(d.iter().all(|&b| b == 5));
                let st = h.engine.stats();
                assert_eq!(st.patch_reads, 1);
                assert_eq!(st.backing_reads + st.cache_reads, 0);
            }
            // Not covered: the block is brought up to date (one fetch at most).
            h.submit(3, read_op(8192, 4096));
            let d = h.wait(3, &mut pick).result.unwrap().unwrap();
            assert!(d[..1024].iter().all(|&b| b == 0), "{wp}/{fetch}");
            assert!(d[1024..3072].iter().all(|&b| b == 5), "{wp}/{fetch}");
            assert!(d[3072..].iter().all(|&b| b == 0), "{wp}/{fetch}");
            assert_eq!(h.engine.stats().backing_reads, 1, "{wp}/{fetch}");
            // A second patch, then FLUSH, then a restart that loses RAM.
            h.submit(4, write_op(40960 + 512, 6u8, 512));
            h.wait(4, &mut pick).result.unwrap();
            h.submit(5, ReqOp::Flush);
            h.wait(5, &mut pick).result.unwrap();
            assert_eq!(h.engine.stats().patched_blocks, 0, "{wp}/{fetch}");
            h.reopen().unwrap();
            h.submit(6, read_op(40960, 4096));
            let d = h.wait(6, &mut pick).result.unwrap().unwrap();
            assert!(d[512..1024].iter().all(|&b| b == 6), "{wp}/{fetch}");
            assert!(d[..512].iter().all(|&b| b == 0), "{wp}/{fetch}");
        }
    }
}

/// At the patch-memory limit, new partial writes fall back to fetch-before-write.
#[test]
fn patch_memory_limit_falls_back_to_blocking() {
    let mut cfg = Config::new(4096, 64, 256 * 4096, WritePolicyKind::WriteBack);
    cfg.fetch = FetchMode::Lazy;
    cfg.patch_mem_bytes = 4 * 1024;
    cfg.patch_clean_at = 1.0;
    let mut h = MemHarness::new(cfg);
    let mut pick = |n: usize| n - 1;
    for i in 0..8u64 {
        h.submit(i + 1, write_op(i * 4096, 1u8, 1024));
        h.wait(i + 1, &mut pick).result.unwrap();
    }
    let st = h.engine.stats();
    assert_eq!(st.patches_created, 4);
    assert_eq!(st.patch_fallbacks, 4);
    assert_eq!(st.patch_bytes, 4096);
    assert_eq!(st.backing_reads, 4, "the fallbacks fetched before writing");
}

/// Writes that cannot be admitted for lack of cache space are counted as
/// stalled (pieces and time), and every one of them completes.
#[test]
fn admission_waits_count_as_stalled_writes() {
    let cfg = Config::new(4096, 16, 256 * 4096, WritePolicyKind::WriteBack);
    let mut h = MemHarness::new(cfg);
    for i in 0..40u64 {
        h.submit(i + 1, write_op(i * 2 * 4096, i as u8 + 1, 2 * 4096));
    }
    let mut pick = |_: usize| 0;
    for i in 0..40u64 {
        h.wait(i + 1, &mut pick).result.unwrap();
    }
    let st = h.engine.stats();
    assert!(st.admission_stalls > 0, "{st:?}");
    assert!(st.admission_stalls < 40, "the first writes fit: {st:?}");
    // Each stalled request covers two blocks.
    assert!(st.stalled_writes >= 2 * st.admission_stalls, "{st:?}");
    assert!(st.stall_ns > 0, "{st:?}");
}
