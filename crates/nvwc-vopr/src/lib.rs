//! # nvwc-vopr
//!
//! Deterministic simulation testing of the nvwc engine, in the style of
//! TigerBeetle's VOPR. One seed generates a random configuration, a random
//! concurrent workload (overlapping writes, reads, flushes, FUA, trims,
//! write-zeroes, checkpoints, direct writes, admission hints), random device
//! latencies and errors (a failed plain write, to either device, first lands
//! a random prefix of its sectors), and a crash at a random point. An oracle that knows
//! every write checks:
//!
//! * **(a) while running**: every read returns a value the NBD semantics allow
//!   (the latest acknowledged write, or a write concurrent with the read; a
//!   trim relaxes this only until a later write supersedes it);
//! * **(b) crash with the cache intact**: after recovery, every write
//!   acknowledged before a completed FLUSH, and every acknowledged FUA write, is
//!   there (or was overwritten by a later write), and nothing a client could
//!   not have seen;
//! * **(c) cache device lost**: the backing store alone is a consistent point
//!   in time: `ordered` (and `write-back`, which must fail): a prefix-closed set
//!   under completion→issue order; `journaled`: a whole-transaction prefix;
//!   `journaled-hints`: a prefix of consistency points; `write-through`:
//!   everything acknowledged. For the consistent policies this is checked
//!   again after recovery: the recovered engine drains to the backing store,
//!   which must be a prefix (completion→issue order) after every backing write;
//!   and for every policy but write-back, no backing write carries a torn
//!   version: where it shows a write that had already failed, the rest of
//!   that write in the same block shows it too, or a later write (the
//!   per-sector rules cannot see a torn write, each of whose sectors is
//!   legal alone; a write whose failed backing write tore is exempt, its
//!   prefix being the backing store's own state);
//! * **other**: no panic, no request waiting longer than
//!   [`LIVENESS_NS`] of simulated time (checked at every event, so a request
//!   starved while timers keep firing fails too), no deadlock (nothing left
//!   to happen while requests wait), no livelock (simulated time stuck).
//!
//! Beyond the first run and crash, a seed may draw (from a random stream of
//! its own, so that a seed drawing none of this runs exactly as before):
//!
//! * a **large cache** of 1000–4000 slots, so that commits span many
//!   metadata pages (63 slots per page);
//! * a **quiesced** run: the crash comes only after every request completed;
//! * **recovery under device latencies and transient errors** (the
//!   read-back retries a failed read, as a client would);
//! * **further rounds**: the engine recovered from the crash runs a new
//!   workload and crashes again, up to three crashes per seed. The client
//!   view is then pinned to what recovery showed; for the backing store a
//!   state showing writes of a later round may no longer show what an
//!   earlier crash lost (see `oracle.rs`).
//! * in a further round, a **warm restart** first (a stream of its own per
//!   round): a workload runs to its end, the engine shuts down cleanly and
//!   reopens from the devices as they are (no crash: a clean stop and
//!   start), and the round's workload and crash then hit an engine whose
//!   durable record said "clean shutdown" when it opened. Such a record
//!   vouches for every clean copy, so a write acknowledged before a commit
//!   ends it could leave a copy a crash brings back.
//!
//! Also from streams of their own: half the write-back seeds send writes
//! around a full cache (`bypass_when_full`, some with paced cleaning),
//! half the journaled seeds bound the journal (`JournalConfig::size_blocks`),
//! half the ordered seeds hold replies (`World::delay_replies`: released
//! replies reach the client in batches, up to 0.3 ms late, and the engine is
//! told before each batch, as the server's reply writer does; requests issued
//! meanwhile are independent of the held writes, for the oracle and for
//! ordered's graph), and a third of all seeds have a cache device whose
//! FLUSHes and FUA writes take 0.1-8 ms (`World::slow_cache_syncs`), so that
//! commits stay in flight while destage plans and client writes go on.
//!
//! Triage aids (environment): `NVWC_VOPR_DUMP=1` prints the recovered
//! metadata at each recovery, `NVWC_VOPR_TRACE_DRAIN=1` every command of
//! the drain after recovery, `NVWC_VOPR_SECTOR=S` what each crash left at
//! sector `S` (recovered, backing powered off, backing alive), and
//! `NVWC_VOPR_ONLY=large,quiesce,timed,rounds,warm,journal,replies,syncs` keeps only the named
//! dimensions above and the journal bound below (to find which one a
//! failure needs, or to compare runs).
//!
//! Every 512-byte sector written carries `(write id, sector number)`, so the
//! oracle knows which write each sector came from. The run loop is
//! `world.rs`, the clients `workload.rs`, the oracle's rules `oracle.rs`,
//! and the checks after a crash `check.rs`.

#![forbid(unsafe_code)]

mod check;
pub mod disk;
mod oracle;
mod workload;
mod world;

use std::cmp::Reverse;
use std::collections::BTreeMap;

use bytes::Bytes;
use nvwc_core::layout::{self, Layout};
use nvwc_core::AdmissionKind;
use nvwc_core::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use check::Devices;
use disk::{Disk, SECTOR};
use oracle::{stamp, Oracle, INIT};
use workload::Workload;
pub use world::LIVENESS_NS;
use world::{Latency, World};

/// Options for a VOPR run.
#[derive(Clone, Debug)]
pub struct Options {
    pub policy: WritePolicyKind,
    /// Fixed replacement policy; random when `None`.
    pub replacement: Option<ReplacementKind>,
    /// Print a trace of the run.
    pub verbose: bool,
    /// Fixed fetch mode for partial writes to uncached blocks (patches);
    /// random per seed (all four modes) when `None`.
    pub fetch: Option<FetchMode>,
    /// Fixed admission policy; random per seed (all six) when `None`. Every
    /// request carries random `critical` and `sync` hints, so rejected
    /// writes bypass the cache at random; critical requests that wait
    /// behind a bypass write in flight, and random `inherit_request` calls,
    /// race reissues against the original completions.
    pub admission: Option<AdmissionKind>,
    /// Fixed `Config::log_inline_bytes`; when `None`, drawn per seed from a
    /// stream of its own (a seed that draws 0 runs as before inline log
    /// records existed): 0 on three in seven seeds, else 512 B to 1 MiB.
    pub log_inline_bytes: Option<u64>,
}

/// The result of one seed.
#[derive(Clone, Debug, Default)]
pub struct SeedOutcome {
    pub seed: u64,
    pub violations: Vec<String>,
    pub ops: usize,
    pub crashed_at_event: u64,
    /// Acknowledged writes whose data the backing store did not show after cache loss.
    pub stale_writes: u64,
    pub forced_closes: u64,
    pub config: String,
    /// Patch activity before the crash: patched blocks made, merges,
    /// reads served from patches, blocks brought up to date (fetch or direct),
    /// fallbacks to fetch-before-write, patches persisted as partial
    /// versions, reads and writes of partial versions that needed a fetch.
    pub patches: [u64; 8],
    /// Admission activity before the crash: pieces bypassed, rejected pieces
    /// cached because a bypass was unsafe, reissues, discarded completions.
    pub admission: [u64; 4],
    /// Writes taken as direct writes (`Engine::handle_direct_write`).
    pub direct_writes: u64,
    /// Warm restarts (clean shutdown, reopen) before a further round's crash.
    pub warm_restarts: u64,
    /// Batches of held replies sent (`World::delay_replies`).
    pub reply_batches: u64,
    /// The cache device's syncs were slow (`World::slow_cache_syncs`).
    pub slow_syncs: bool,
    /// Clean stops that ran out of retries (`Engine::stop_gave_up`) and
    /// restarted cold.
    pub stops_given_up: u64,
    /// The longest time (simulated ns) a workload request waited for its reply.
    pub max_latency_ns: u64,
    /// The most metadata pages one commit wrote.
    pub max_commit_pages: u64,
    /// Commits that were log records and checkpoints, and at recoveries,
    /// log records replayed and valid-looking records dropped (their data
    /// did not match its checksums); then log records that were inline,
    /// and versions recoveries wrote back from inline records.
    pub log: [u64; 6],
}

/// The metadata table's byte range on the cache device.
fn table_range(l: &Layout) -> (u64, u64) {
    (layout::TABLE_OFFSET, layout::TABLE_OFFSET + l.table_bytes)
}

fn random_config(rng: &mut ChaCha8Rng, opts: &Options, large: Option<u64>) -> Config {
    let bs = [512u32, 1024, 2048, 4096][rng.gen_range(0..4)];
    let cap = rng.gen_range(16..96u64);
    // A large cache spans many metadata pages (63 slots each); small blocks
    // keep its images small.
    let (bs, cap) = match large {
        Some(n) => (bs.min(1024), n),
        None => (bs, cap),
    };
    let nblocks = rng.gen_range(cap / 2..cap * 3);
    let mut c = Config::new(bs, cap, nblocks * bs as u64, opts.policy);
    c.replacement = opts
        .replacement
        .unwrap_or_else(|| match rng.gen_range(0..5) {
            4 => ReplacementKind::Stack {
                track_blocks: 8,
                knee: nvwc_core::config::KneeSource::Online {
                    period: 32,
                    sample_keys: 256,
                },
            },
            0 => ReplacementKind::Lru,
            1 => ReplacementKind::Arc,
            2 => ReplacementKind::Lst {
                track_blocks: [4, 8, 16][rng.gen_range(0..3)],
            },
            _ => ReplacementKind::Stack {
                track_blocks: [4, 8, 16][rng.gen_range(0..3)],
                knee: nvwc_core::config::KneeSource::Fixed(cap / 3),
            },
        });
    let high = rng.gen_range(0.2..0.95);
    c.watermarks = Watermarks {
        high,
        low: high * rng.gen_range(0.2..0.9),
    };
    c.journal.txn_max_blocks = rng.gen_range(1..32);
    c.journal.txn_max_age_ns = [0, 50_000, 500_000, 5_000_000][rng.gen_range(0..4)];
    c.journal.checkpoint_delay_ns = [0, 0, 100_000, 2_000_000][rng.gen_range(0..4)];
    c.journal.checkpoint_merge_max = rng.gen_range(1..4);
    c.dummy_every = [0, 2, 3, 10, 100][rng.gen_range(0..5)];
    c.read_allocate = rng.gen_bool(0.7);
    c.autocommit_ns = [100_000, 1_000_000, 50_000_000][rng.gen_range(0..3)];
    c.autocommit_changes = rng.gen_range(4..256);
    c.max_destage_inflight = rng.gen_range(1..32);
    c.free_reserve = rng.gen_range(1..8);
    c.retry_ns = 200_000;
    // Drawn last, so the fields above keep their values per seed.
    c.fetch = opts
        .fetch
        .unwrap_or_else(|| FetchMode::ALL[rng.gen_range(0..4)]);
    c.patch_mem_bytes = [512, 4096, 65536][rng.gen_range(0..3)];
    c.patch_clean_at = [0.0, 0.5, 1.0][rng.gen_range(0..3)];
    c.patch_direct = opts.policy == WritePolicyKind::WriteBack && rng.gen_bool(0.5);
    c.rewrite_in_place = opts.policy == WritePolicyKind::WriteBack && rng.gen_bool(0.5);
    c.fetch_bg_inflight = rng.gen_range(1..4);
    c.admission = opts
        .admission
        .unwrap_or_else(|| AdmissionKind::ALL[rng.gen_range(0..6)]);
    let span = c.backing_size / 4;
    c.wal_ranges = vec![(rng.gen_range(0..c.backing_size - span), span)];
    c
}

/// What a seed adds to the first run and its crash, drawn from a stream of
/// its own so that a seed that draws none of it runs exactly as before.
#[derive(Clone, Copy, Debug)]
struct Extras {
    /// A cache of this many slots instead of 16..96.
    large: Option<u64>,
    /// The workload is not cut by the crash: every request must complete
    /// (within the liveness bound, while timers keep firing), then the crash.
    quiesce: bool,
    /// Further rounds: recover, run a new workload, crash again, check.
    rounds: u32,
    /// Recovery (read-back and drain) with device latencies and transient
    /// errors instead of instant, error-free devices.
    timed_recovery: bool,
    /// Metadata log size in 4 KiB pages: small, so that records fill it and
    /// checkpoints restart it often; 0 (no log: every commit a checkpoint)
    /// as on a cache of format 1 or 2.
    log_pages: u32,
}

impl Extras {
    fn draw(rng2: &mut ChaCha8Rng) -> Self {
        let large = rng2.gen_bool(0.1).then(|| rng2.gen_range(1000..4000u64));
        let quiesce = rng2.gen_bool(0.25);
        let rounds = [0, 0, 0, 0, 0, 0, 1, 1, 1, 2][rng2.gen_range(0..10)];
        let timed_recovery = rng2.gen_bool(0.5);
        let log_pages = [0, 1, 2, 3, 4, 8, 32][rng2.gen_range(0..7)];
        let on = dimension_on;
        Extras {
            large: large.filter(|_| on("large")),
            quiesce: quiesce && on("quiesce"),
            rounds: if on("rounds") { rounds } else { 0 },
            timed_recovery: timed_recovery && on("timed"),
            log_pages,
        }
    }
}

/// Is dimension `k` drawn? All are, unless `NVWC_VOPR_ONLY` names the ones to keep.
fn dimension_on(k: &str) -> bool {
    std::env::var("NVWC_VOPR_ONLY").map_or(true, |v| v.split(',').any(|x| x == k))
}

/// Latency ranges (ns) of the cache device's syncs on seeds that draw slow
/// syncs: from a fast NVMe's under load to a busy SATA device's (see
/// `World::slow_cache_syncs` for the measurement), against 1-40 µs for
/// the device's other commands and 20 µs-2 ms for the backing store's.
const SLOW_SYNCS: [(u64, u64); 3] = [
    (100_000, 1_000_000),
    (500_000, 3_000_000),
    (1_000_000, 8_000_000),
];

/// Device latencies and error rates drawn for a round after the first.
fn draw_latency(rng2: &mut ChaCha8Rng) -> Latency {
    Latency {
        cache: (1_000, 40_000),
        backing: (20_000, 2_000_000),
        err_rate: [0.0, 0.002, 0.02][rng2.gen_range(0..3)],
    }
}

/// What a crash left: the cache device and the backing store after a power
/// loss, and the backing store of a host that died while it lived on
/// (networked storage).
struct Crash {
    cache: Vec<u8>,
    backing: Vec<u8>,
    backing_alive: Vec<u8>,
}

impl Crash {
    /// Both devices lose what was not durable.
    fn take(w: &World, rng: &mut ChaCha8Rng) -> Crash {
        let cache_inflight = w.inflight_writes(Dev::Cache);
        let backing_inflight = w.inflight_writes(Dev::Backing);
        let ends = w.inflight_group_ends();
        Crash {
            cache: w.cache.crash(rng, &cache_inflight, &[]),
            backing: w.backing.crash(rng, &backing_inflight, &ends),
            backing_alive: w.backing.host_lost(rng, &backing_inflight),
        }
    }
}

/// Add what the engine counted to the outcome.
fn count_stats(out: &mut SeedOutcome, st: &Stats) {
    out.log[0] += st.log_commits;
    out.log[1] += st.commits - st.log_commits;
    out.log[4] += st.inline_commits;
    let patches = [
        st.patches_created,
        st.patch_merges,
        st.patch_reads,
        st.patch_fetches + st.patch_direct_writes,
        st.patch_fallbacks,
        st.patch_persists,
        st.partial_read_fetches,
        st.partial_write_fetches,
    ];
    for (x, y) in out.patches.iter_mut().zip(patches) {
        *x += y;
    }
    let admission = [
        st.bypassed_pieces,
        st.bypass_refused,
        st.reissued_writes,
        st.discarded_completions,
    ];
    for (x, y) in out.admission.iter_mut().zip(admission) {
        *x += y;
    }
}

/// Simulated time between rounds (each round's engine starts its clock here).
const ROUND_NS: u64 = 1_000_000_000_000;

/// Run one seed.
pub fn run_seed(seed: u64, opts: &Options) -> SeedOutcome {
    check::take_log_replays();
    let mut rng = ChaCha8Rng::seed_from_u64(
        seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ opts.policy.code() as u64,
    );
    let mut rng2 = ChaCha8Rng::seed_from_u64(
        seed.wrapping_mul(0xD1B5_4A32_D192_ED03) ^ 0x5EC0_9D00 ^ opts.policy.code() as u64,
    );
    let x = Extras::draw(&mut rng2);
    let mut cfg = random_config(&mut rng, opts, x.large);
    cfg.log_pages = x.log_pages;
    cfg.log_inline_bytes = opts.log_inline_bytes.unwrap_or_else(|| {
        let mut r = ChaCha8Rng::seed_from_u64(seed ^ 0x1A11_E0F1_0C0D_5EED);
        let drawn = [0, 0, 0, 512, 4096, 65536, 1 << 20][r.gen_range(0..7)];
        if dimension_on("inline") {
            drawn
        } else {
            0
        }
    });
    // Drawn from a stream of its own, so that every other draw keeps its
    // value per seed; half the write-back seeds send writes that would wait
    // for space around the cache.
    let mut full = ChaCha8Rng::seed_from_u64(seed ^ 0xB1FA_55F0_11CA_C4E5);
    cfg.bypass_when_full = opts.policy == WritePolicyKind::WriteBack && full.gen_bool(0.5);
    // Of those, two thirds pace their cleaning while writes go around the
    // full cache (`Config::full_clean_secs`): fast enough to destage within
    // a seed's run, and at bcache's 40 s time constant.
    if cfg.bypass_when_full {
        cfg.full_clean_secs = [0, 1, 40][full.gen_range(0..3)];
    }
    // Half the journaled seeds bound the journal (`JournalConfig::size_blocks`),
    // also from a stream of their own: from one block (every write waits for
    // the previous one's checkpoint, and the open transaction is closed
    // early) to most of a small cache.
    if opts.policy.journaled() && dimension_on("journal") {
        let mut j = ChaCha8Rng::seed_from_u64(seed ^ 0x70C3_A1B0_0D5E_ED11);
        if j.gen_bool(0.5) {
            cfg.journal.size_blocks = [1, 4, 16, 64][j.gen_range(0..4)];
        }
    }
    let bs = cfg.block_size as u64;
    let layout = Layout::new(&cfg);
    let mut out = SeedOutcome {
        seed,
        config: format!("{cfg:?} {x:?}"),
        ..Default::default()
    };

    // Devices.
    let mut cache_img = vec![0u8; layout.device_bytes() as usize];
    for (off, b) in layout::format_writes(&cfg, seed) {
        cache_img[off as usize..off as usize + b.len()].copy_from_slice(&b);
    }
    let mut bimg = vec![0u8; cfg.backing_size as usize];
    for (s, chunk) in bimg.chunks_mut(SECTOR).enumerate() {
        stamp(chunk, INIT, s as u64);
    }

    let eng: Engine<Bytes> = Engine::new(cfg.clone()).expect("valid config");
    let mut oracle = Oracle::new();
    let err_rate = [0.0, 0.0, 0.002, 0.02][rng.gen_range(0..4)];
    let n_ops = rng.gen_range(20..600usize);
    let qd = rng.gen_range(1..17usize);
    let crash_at: u64 = rng.gen_range(10..(n_ops as u64 * 12));
    let crash_at = if x.quiesce { u64::MAX } else { crash_at };
    let lat = Latency {
        cache: (1_000, 40_000),
        backing: (20_000, 2_000_000),
        err_rate,
    };
    let mut world = World::new(
        eng,
        Disk::new(cache_img),
        Disk::new(bimg),
        lat,
        0,
        table_range(&layout),
    );
    world.verbose = opts.verbose;
    // Half the ordered seeds hold replies for a while and report when they
    // go out (`World::delay_replies`), as the server does: requests that
    // arrive together are then independent in ordered's graph. Drawn from
    // a stream of its own.
    let held = opts.policy == WritePolicyKind::Ordered
        && dimension_on("replies")
        && ChaCha8Rng::seed_from_u64(seed ^ 0x5E17_D0E5_0FF1_CE00).gen_bool(0.5);
    let replies = held.then_some(seed ^ 0x5E17_D0E5_0FF1_CE01);
    if let Some(s) = replies {
        world.delay_replies(s);
    }
    // A third of the seeds, every policy: the cache device's syncs are slow
    // (`World::slow_cache_syncs`), from a stream of their own.
    let slow_syncs = dimension_on("syncs").then(|| {
        let mut r = ChaCha8Rng::seed_from_u64(seed ^ 0x5105_C0DE_5EED_0001);
        r.gen_bool(1.0 / 3.0)
            .then(|| SLOW_SYNCS[r.gen_range(0..SLOW_SYNCS.len())])
    });
    let slow_syncs = slow_syncs.flatten();
    if let Some(r) = slow_syncs {
        world.slow_cache_syncs(r);
        out.slow_syncs = true;
    }
    let mut client = Workload {
        n_ops,
        qd,
        issued: 0,
        outstanding: BTreeMap::new(),
        id_base: 0,
        policy: opts.policy,
        block_size: bs,
        backing_size: cfg.backing_size,
        verbose: opts.verbose,
    };
    world.run(
        &mut client,
        &mut oracle,
        &mut rng,
        &mut out,
        crash_at,
        &mut |_, _, _| true,
        &|_| false,
    );
    out.crashed_at_event = world.processed;
    out.max_commit_pages = world.max_commit_pages;
    count_stats(&mut out, &world.eng.stats());
    out.ops = client.issued;
    let crash = Crash::take(&world, &mut rng);
    drop(world);

    let mut round = 1u64;
    let mut crash = crash;
    loop {
        let recovery = x.timed_recovery.then(|| draw_latency(&mut rng2));
        let before = oracle.violations.len();
        let got = after_crash(
            &cfg,
            &layout,
            &crash,
            &mut oracle,
            seed,
            round * ROUND_NS,
            recovery.map(|l| (l, &mut rng2)),
            &mut out,
        );
        if round > 1 {
            for v in &mut oracle.violations[before..] {
                v.push_str(&format!(" [at crash {round}]"));
            }
        }
        let Some(got) = got else { break };
        if round > u64::from(x.rounds) || !oracle.violations.is_empty() {
            break;
        }
        // The next round: a new workload on the engine recovered from this
        // crash, then another crash.
        round += 1;
        oracle.begin_round(got);
        let eng = match check::recover(&cfg, &layout, &mut crash.cache) {
            Ok(e) => e,
            Err(v) => {
                oracle.violations.push(v);
                break;
            }
        };
        let lat = draw_latency(&mut rng2);
        let mut world = World::new(
            eng,
            Disk::new(std::mem::take(&mut crash.cache)),
            Disk::new(std::mem::take(&mut crash.backing)),
            lat,
            round * ROUND_NS,
            table_range(&layout),
        );
        world.verbose = opts.verbose;
        if let Some(s) = replies {
            world.delay_replies(s ^ round);
        }
        if let Some(r) = slow_syncs {
            world.slow_cache_syncs(r);
        }
        let mut warm = ChaCha8Rng::seed_from_u64(seed ^ 0x3A2B_C0FF_EE5E_ED00 ^ round);
        if warm.gen_bool(0.35) && dimension_on("warm") {
            world = match warm_restart(
                world,
                &cfg,
                &layout,
                &mut oracle,
                &mut warm,
                &mut out,
                round,
                opts,
            ) {
                Ok(w) => w,
                Err(v) => {
                    oracle.violations.extend(v);
                    break;
                }
            };
        }
        let n_ops = rng2.gen_range(20..300usize);
        let mut client = Workload {
            n_ops,
            qd: rng2.gen_range(1..17usize),
            issued: 0,
            outstanding: BTreeMap::new(),
            id_base: round * 1_000_000_000,
            policy: opts.policy,
            block_size: bs,
            backing_size: cfg.backing_size,
            verbose: opts.verbose,
        };
        let crash_at = match rng2.gen_bool(0.25) {
            true => u64::MAX,
            false => rng2.gen_range(10..(n_ops as u64 * 12)),
        };
        world.run(
            &mut client,
            &mut oracle,
            &mut rng2,
            &mut out,
            crash_at,
            &mut |_, _, _| true,
            &|_| false,
        );
        out.max_commit_pages = out.max_commit_pages.max(world.max_commit_pages);
        count_stats(&mut out, &world.eng.stats());
        out.ops += client.issued;
        crash = Crash::take(&world, &mut rng2);
    }
    out.violations = oracle.violations;
    let (replayed, dropped, repaired) = check::take_log_replays();
    out.log[2] += replayed;
    out.log[3] += dropped;
    out.log[5] += repaired;
    out
}

/// A warm restart (see the module docs): run a workload on `world` to its
/// end, shut down cleanly, and reopen from the devices as they are; the
/// recovered engine MUST report the clean shutdown. Returns the new world,
/// or the violations (already in no oracle) that stopped it.
#[allow(clippy::too_many_arguments)]
fn warm_restart(
    mut world: World,
    cfg: &Config,
    layout: &Layout,
    oracle: &mut Oracle,
    rng: &mut ChaCha8Rng,
    out: &mut SeedOutcome,
    round: u64,
    opts: &Options,
) -> Result<World, Vec<String>> {
    let mut client = Workload {
        n_ops: rng.gen_range(20..200usize),
        qd: rng.gen_range(1..17usize),
        issued: 0,
        outstanding: BTreeMap::new(),
        id_base: round * 1_000_000_000 + 500_000_000,
        policy: opts.policy,
        block_size: cfg.block_size as u64,
        backing_size: cfg.backing_size,
        verbose: opts.verbose,
    };
    let before = oracle.violations.len();
    let mut run =
        |w: &mut World, c: &mut Workload, o: &mut Oracle, done: &dyn Fn(&Engine<Bytes>) -> bool| {
            w.run(c, o, rng, out, u64::MAX, &mut |_, _, _| true, done)
        };
    run(&mut world, &mut client, oracle, &|_| false);
    world.eng.start_shutdown(world.now);
    run(&mut world, &mut client, oracle, &|e| e.is_idle());
    if oracle.violations.len() > before {
        return Err(oracle.violations.split_off(before));
    }
    if !world.eng.is_idle() {
        return Err(vec![format!(
            "warm restart: the clean shutdown did not finish: {}",
            world.eng.debug_state()
        )]);
    }
    count_stats(out, &world.eng.stats());
    out.ops += client.issued;
    let mut cache = world.cache.visible().to_vec();
    let backing = world.backing.visible().to_vec();
    let image = check::cache_image(layout, &cache);
    // A stop retries what fails on the way (its final commit, a destage, a
    // backing FLUSH) up to `STOP_RETRIES` times; only a stop that ran out
    // of them may end without its clean record. The record before it says
    // the cache was running, so recovery treats the restart as after a
    // crash, and the round goes on from there, cold.
    let gave_up = world.eng.stop_gave_up();
    if gave_up {
        out.stops_given_up += 1;
    }
    let eng = match check::recover_image(cfg, &image, &mut cache) {
        Ok((e, rep, _)) if rep.clean_shutdown || gave_up => {
            out.warm_restarts += u64::from(rep.clean_shutdown);
            e
        }
        Ok((_, rep, _)) => {
            return Err(vec![format!(
                "warm restart: recovery after a clean shutdown reports none: {rep:?}"
            )])
        }
        Err(e) => return Err(vec![format!("warm restart: recovery failed: {e}")]),
    };
    let mut w = World::new(
        eng,
        Disk::new(cache),
        Disk::new(backing),
        draw_latency(rng),
        world.now,
        table_range(layout),
    );
    w.verbose = opts.verbose;
    if let Some(s) = world.reply_seed() {
        w.delay_replies(s ^ 0x3A2B);
    }
    if let Some(r) = world.slow_syncs() {
        w.slow_cache_syncs(r);
    }
    Ok(w)
}

/// The checks after a crash: (b) recover and read back; (c) while the
/// recovered engine drains (ordered, journaled); (c) on the backing store
/// alone. Returns the image recovery showed, when there is one.
#[allow(clippy::too_many_arguments)]
fn after_crash(
    cfg: &Config,
    layout: &Layout,
    crash: &Crash,
    oracle: &mut Oracle,
    seed: u64,
    now: u64,
    mut timed: Option<(Latency, &mut ChaCha8Rng)>,
    out: &mut SeedOutcome,
) -> Option<Vec<u8>> {
    fn devices<'a>(t: &'a mut Option<(Latency, &mut ChaCha8Rng)>) -> Devices<'a> {
        match t {
            Some((l, r)) => Devices::Timed(*l, r),
            None => Devices::Instant,
        }
    }
    // (b) Restart with the cache intact.
    let rec = check::recovered(
        cfg,
        layout,
        crash.cache.clone(),
        crash.backing.clone(),
        oracle,
        seed,
        now,
        devices(&mut timed),
        out,
    );
    let got = rec.map(|mut r| {
        if matches!(
            cfg.write_policy,
            WritePolicyKind::Ordered | WritePolicyKind::Journaled | WritePolicyKind::JournaledHints
        ) {
            check::drain_after_recovery(&mut r, cfg, oracle, seed, devices(&mut timed), out);
        }
        r.got
    });
    // (c) The cache device is lost: the backing store alone, both when the
    // backing store survived the host (networked storage: every completed write
    // is there) and when it lost power too (only what it had made durable).
    check::backing_alone(cfg, &crash.backing_alive, false, oracle, out);
    if oracle.violations.is_empty() {
        check::backing_alone(cfg, &crash.backing, true, oracle, out);
    }
    if let Some(g) = &got {
        if let Some(sec) = std::env::var("NVWC_VOPR_SECTOR")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
        {
            let d = |img: &[u8]| oracle::decode(oracle::sector_of(img, sec), sec);
            eprintln!(
                "DEBUG crash at {now}: sector {sec}: got {:?} backing {:?} alive {:?}",
                d(g),
                d(&crash.backing),
                d(&crash.backing_alive)
            );
        }
        oracle.mark_lost(g);
    }
    got
}

/// Take the engine's events: journal transactions closed (for check (c)).
fn collect_events(
    eng: &mut Engine<Bytes>,
    oracle: &mut Oracle,
    at_flush: bool,
    out: &mut SeedOutcome,
) {
    while let Some(e) = eng.poll_event() {
        record_event(e, oracle, at_flush, out);
    }
}

/// One of the engine's events: a journal transaction closed is recorded
/// (for check (c)); the rest are dropped.
fn record_event(e: Event, oracle: &mut Oracle, at_flush: bool, out: &mut SeedOutcome) {
    if let Event::Policy(PolicyEvent::TxnClosed {
        txn,
        first_seq,
        last_seq,
        forced,
    }) = e
    {
        if forced {
            out.forced_closes += 1;
        }
        oracle
            .txns
            .push((txn, first_seq, last_seq, forced, at_flush));
    }
}

thread_local! {
    static PANIC_MSG: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Summary of many seeds for one policy.
#[derive(Clone, Debug, Default)]
pub struct PolicySummary {
    pub policy: String,
    pub seeds: u64,
    pub violations: u64,
    pub first_failure: Option<SeedOutcome>,
    pub forced_close_seeds: u64,
    pub stale_writes: u64,
    /// Seeds failing each check: (a), (b), (c), and anything else (panic, deadlock).
    pub by_check: [u64; 4],
    /// Sums of [`SeedOutcome::patches`].
    pub patches: [u64; 8],
    /// Sums of [`SeedOutcome::admission`].
    pub admission: [u64; 4],
    /// Sum of [`SeedOutcome::direct_writes`].
    pub direct_writes: u64,
    /// Sum of [`SeedOutcome::warm_restarts`].
    pub warm_restarts: u64,
    /// Seeds with held replies, and the sum of [`SeedOutcome::reply_batches`].
    pub reply_batches: (u64, u64),
    /// Seeds whose cache device had slow syncs ([`SeedOutcome::slow_syncs`]).
    pub slow_sync_seeds: u64,
    /// Sum of [`SeedOutcome::stops_given_up`].
    pub stops_given_up: u64,
    /// The longest wait of any request (simulated ns), and its seed.
    pub max_latency: (u64, u64),
    /// The most metadata pages one commit wrote, over every seed.
    pub max_commit_pages: u64,
    /// Sums of [`SeedOutcome::log`].
    pub log: [u64; 6],
    /// Every failing seed with the checks it failed (`a`, `b`, `c`, `o`
    /// for other), in seed order: for comparing two runs seed by seed.
    pub failing: Vec<(u64, String)>,
}

/// Run `seeds` seeds starting at `first` on `threads` threads.
pub fn run_many(
    opts: &Options,
    first: u64,
    seeds: u64,
    threads: usize,
    progress: &(dyn Fn(u64) + Sync),
) -> PolicySummary {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;
    let next = AtomicU64::new(first);
    let done = AtomicU64::new(0);
    let warm = AtomicU64::new(0);
    let held_seeds = AtomicU64::new(0);
    let slow_seeds = AtomicU64::new(0);
    let batches = AtomicU64::new(0);
    let gave_up = AtomicU64::new(0);
    // The lowest failing seed: one that fails its verdict if any does (a
    // write-back seed failing only (c) is expected), else any.
    let lowest: Mutex<Option<(bool, SeedOutcome)>> = Mutex::new(None);
    let failing: Mutex<Vec<(u64, String)>> = Mutex::new(Vec::new());
    let maxes = Mutex::new(((0u64, 0u64), 0u64));
    let agg = Mutex::new((
        0u64, 0u64, 0u64, [0u64; 4], [0u64; 8], [0u64; 4], 0u64, [0u64; 6],
    ));
    std::panic::set_hook(Box::new(|info| {
        let loc = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        PANIC_MSG.with(|m| *m.borrow_mut() = format!("{msg} at {loc}"));
    }));
    std::thread::scope(|sc| {
        for _ in 0..threads.max(1) {
            sc.spawn(|| loop {
                let s = next.fetch_add(1, Ordering::Relaxed);
                if s >= first + seeds {
                    break;
                }
                let r = std::panic::catch_unwind(|| run_seed(s, opts)).unwrap_or_else(|_| {
                    let msg = PANIC_MSG.with(|m| m.borrow().clone());
                    SeedOutcome {
                        seed: s,
                        violations: vec![format!("panic: {msg}")],
                        ..Default::default()
                    }
                });
                {
                    let mut a = agg.lock().unwrap();
                    if !r.violations.is_empty() {
                        a.0 += 1;
                    }
                    for (i, tag) in ["(a)", "(b)", "(c)"].iter().enumerate() {
                        if r.violations.iter().any(|v| v.starts_with(tag)) {
                            a.3[i] += 1;
                        }
                    }
                    if r.violations.iter().any(|v| !v.starts_with('(')) {
                        a.3[3] += 1;
                    }
                    if r.forced_closes > 0 {
                        a.1 += 1;
                    }
                    a.2 += r.stale_writes;
                    for (x, y) in a.4.iter_mut().zip(r.patches) {
                        *x += y;
                    }
                    for (x, y) in a.5.iter_mut().zip(r.admission) {
                        *x += y;
                    }
                    a.6 += r.direct_writes;
                    for (x, y) in a.7.iter_mut().zip(r.log) {
                        *x += y;
                    }
                }
                warm.fetch_add(r.warm_restarts, Ordering::Relaxed);
                slow_seeds.fetch_add(u64::from(r.slow_syncs), Ordering::Relaxed);
                if r.reply_batches > 0 {
                    held_seeds.fetch_add(1, Ordering::Relaxed);
                    batches.fetch_add(r.reply_batches, Ordering::Relaxed);
                }
                gave_up.fetch_add(r.stops_given_up, Ordering::Relaxed);
                {
                    let mut m = maxes.lock().unwrap();
                    if r.max_latency_ns > m.0 .0 {
                        m.0 = (r.max_latency_ns, s);
                    }
                    m.1 = m.1.max(r.max_commit_pages);
                }
                if !r.violations.is_empty() {
                    failing
                        .lock()
                        .unwrap()
                        .push((s, checks_failed(&r.violations)));
                    let bad = seed_verdict(opts.policy, &r).is_err();
                    let mut m = lowest.lock().unwrap();
                    let better = match &*m {
                        None => true,
                        Some((b, f)) => (bad, Reverse(r.seed)) > (*b, Reverse(f.seed)),
                    };
                    if better {
                        *m = Some((bad, r));
                    }
                }
                let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                progress(d);
            });
        }
    });
    let a = agg.into_inner().unwrap();
    let _ = std::panic::take_hook();
    let first_failure = lowest.into_inner().unwrap().map(|(_, r)| r);
    let mut failing = failing.into_inner().unwrap();
    failing.sort_unstable();
    let (max_latency, max_commit_pages) = maxes.into_inner().unwrap();
    PolicySummary {
        policy: opts.policy.name().to_string(),
        seeds,
        violations: a.0,
        first_failure,
        forced_close_seeds: a.1,
        stale_writes: a.2,
        by_check: a.3,
        patches: a.4,
        admission: a.5,
        direct_writes: a.6,
        warm_restarts: warm.into_inner(),
        reply_batches: (held_seeds.into_inner(), batches.into_inner()),
        slow_sync_seeds: slow_seeds.into_inner(),
        stops_given_up: gave_up.into_inner(),
        max_latency,
        max_commit_pages,
        log: a.7,
        failing,
    }
}

impl PolicySummary {
    /// Does this run pass? Every policy but write-back must show no
    /// violation at all. Write-back promises nothing when the cache device
    /// is lost, so it must fail check (c) on some seeds (else the checker
    /// does not bite) and fail nothing else: not (a), (b), or any other
    /// (panic, deadlock, liveness). `Err` says why not.
    pub fn verdict(&self) -> Result<(), String> {
        let [a, b, c, other] = self.by_check;
        if self.policy != WritePolicyKind::WriteBack.name() {
            return match self.violations {
                0 => Ok(()),
                n => Err(format!("{n} seeds failed")),
            };
        }
        if a + b + other > 0 {
            return Err(format!(
                "write-back failed checks it must pass: (a) {a}, (b) {b}, other {other} seeds"
            ));
        }
        if c == 0 {
            return Err(
                "write-back never failed check (c): the cache-loss checker did not bite (run more seeds)"
                    .into(),
            );
        }
        Ok(())
    }
}

/// One seed's verdict, as [`PolicySummary::verdict`] judges a run (a
/// single write-back seed may pass check (c)).
pub fn seed_verdict(policy: WritePolicyKind, r: &SeedOutcome) -> Result<(), String> {
    let checks = checks_failed(&r.violations);
    match policy {
        WritePolicyKind::WriteBack if checks.is_empty() || checks == "c" => Ok(()),
        _ if checks.is_empty() => Ok(()),
        _ => Err(format!("failed checks {checks}")),
    }
}

/// The checks a seed's violations failed: a subset of `abco` (`o`: other,
/// such as a panic, a deadlock or a liveness bound).
pub fn checks_failed(violations: &[String]) -> String {
    let mut s = String::new();
    for (tag, c) in [("(a)", 'a'), ("(b)", 'b'), ("(c)", 'c')] {
        if violations.iter().any(|v| v.starts_with(tag)) {
            s.push(c);
        }
    }
    if violations.iter().any(|v| !v.starts_with('(')) {
        s.push('o');
    }
    s
}
