//! Discrete-event driver tests: known latencies, closed and open loop, metrics arithmetic.

use nvwc_core::{ReplacementKind, WritePolicyKind};
use nvwc_sim::device::{build, DevOp, DeviceSpec};
use nvwc_sim::{redo_log_bytes, ClientKey, EngineTuning, GroupEndCost, Mode, SimConfig, Simulator};
use nvwc_trace::{Op, TraceError, TraceRecord};

type Recs = std::vec::IntoIter<Result<TraceRecord, TraceError>>;

fn recs(v: Vec<TraceRecord>) -> Recs {
    v.into_iter().map(Ok).collect::<Vec<_>>().into_iter()
}

fn cfg(policy: WritePolicyKind) -> SimConfig {
    let mut c = SimConfig::new(policy, ReplacementKind::Lru, 1 << 20);
    c.backing = "ssd-sata".parse().unwrap();
    c.cache_device = "nvdram".parse().unwrap();
    c.backing_qd = 32;
    c
}

/// Latency of one command alone on a fresh model of `spec`.
fn alone(spec: &str, op: DevOp, cap: u64) -> u64 {
    let spec: DeviceSpec = spec.parse().unwrap();
    let mut d = build(&spec, Some(cap)).unwrap();
    d.submit(0, op);
    let mut out = Vec::new();
    let mut t = 0;
    while out.is_empty() {
        t = d.next_completion().unwrap();
        d.pop_completions(t, &mut out);
    }
    t
}

const BACKING: u64 = 64 << 20;

/// The host CPU time the driver charges a 4 KiB request (`cpu.rs`).
fn cpu_4k() -> u64 {
    nvwc_sim::cpu::CpuCost::measured().cost(4096)
}

#[test]
fn read_miss_costs_one_backing_read() {
    let mut c = cfg(WritePolicyKind::WriteBack);
    c.tuning = EngineTuning {
        read_allocate: Some(false),
        ..Default::default()
    };
    let r = Simulator::new(
        c,
        BACKING,
        recs(vec![TraceRecord::new(0, Op::Read, 1 << 20, 4096, 0)]),
        "t",
    )
    .unwrap()
    .run()
    .unwrap();
    // The device's time, then the host's CPU time for the request.
    let expect = alone("ssd-sata", DevOp::read(1, 1 << 20, 4096), BACKING) + cpu_4k();
    assert_eq!(r.requests, 1);
    assert_eq!(r.read_misses, 1);
    assert!(expect > 10_000, "the SSD model takes time: {expect}");
    assert_eq!(r.sim_time_us, expect as f64 / 1e3);
    assert!((r.latency_us_p50 - expect as f64 / 1e3).abs() <= expect as f64 / 1e3 * 0.001 + 0.001);
}

#[test]
fn write_back_write_costs_one_cache_write_and_write_through_waits_for_backing() {
    let rec = || recs(vec![TraceRecord::new(0, Op::Write, 8192, 4096, 0)]);
    let wb = Simulator::new(cfg(WritePolicyKind::WriteBack), BACKING, rec(), "t")
        .unwrap()
        .run()
        .unwrap();
    let cache_cap = 1 << 30;
    let cache_write = alone("nvdram", DevOp::write(1, 1 << 20, 4096), cache_cap) + cpu_4k();
    // The slot's offset does not change an NV-DRAM write's latency.
    assert_eq!(wb.sim_time_us, cache_write as f64 / 1e3);
    assert_eq!(wb.backing_writes, 0);
    let wt = Simulator::new(cfg(WritePolicyKind::WriteThrough), BACKING, rec(), "t")
        .unwrap()
        .run()
        .unwrap();
    let backing_write = alone("ssd-sata", DevOp::write(1, 8192, 4096), BACKING) + cpu_4k();
    assert_eq!(wt.backing_writes, 1);
    assert_eq!(wt.sim_time_us, backing_write.max(cache_write) as f64 / 1e3);
    assert!(wt.sim_time_us > wb.sim_time_us);
}

fn reads(n: u64) -> Vec<TraceRecord> {
    (0..n)
        .map(|i| TraceRecord::new(i * 1000, Op::Read, i * 4096 * 7 % BACKING, 4096, 0))
        .collect()
}

#[test]
fn closed_loop_keeps_qd_outstanding() {
    for qd in [1u32, 4, 16] {
        let mut c = cfg(WritePolicyKind::WriteBack);
        c.qd = qd;
        let n = 200;
        let mut s = Simulator::new(c, BACKING, recs(reads(n)), "t").unwrap();
        let mut steps = 0;
        let mut max = 0;
        while s.step().unwrap() {
            steps += 1;
            let issued = s.engine().stats().requests;
            max = max.max(s.in_flight());
            assert!(s.in_flight() <= qd as usize);
            if issued < n {
                assert_eq!(s.in_flight(), qd as usize, "qd {qd} step {steps}");
            }
        }
        assert_eq!(max, qd as usize);
        assert_eq!(s.engine().stats().requests, n);
    }
}

#[test]
fn closed_loop_qd_scales_throughput_on_a_parallel_device() {
    let run = |qd| {
        let mut c = cfg(WritePolicyKind::WriteBack);
        c.qd = qd;
        Simulator::new(c, BACKING, recs(reads(400)), "t")
            .unwrap()
            .run()
            .unwrap()
    };
    let (a, b) = (run(1), run(8));
    assert!(
        b.throughput_iops > 2.0 * a.throughput_iops,
        "{} vs {}",
        b.throughput_iops,
        a.throughput_iops
    );
}

#[test]
fn open_loop_respects_timestamps() {
    let speedup = 2.0;
    let ts: Vec<u64> = vec![0, 10_000_000, 10_000_000, 35_000_000, 80_000_000];
    let v: Vec<TraceRecord> = ts
        .iter()
        .enumerate()
        .map(|(i, &t)| TraceRecord::new(t, Op::Write, i as u64 * 4096, 4096, 0))
        .collect();
    let mut c = cfg(WritePolicyKind::WriteBack);
    c.mode = Mode::Open;
    c.speedup = speedup;
    let mut s = Simulator::new(c, BACKING, recs(v), "t").unwrap();
    let mut seen_times = Vec::new();
    while s.step().unwrap() {
        let now = s.now();
        let due = ts
            .iter()
            .filter(|&&t| (t as f64 / speedup) as u64 <= now)
            .count() as u64;
        assert_eq!(s.engine().stats().requests, due, "at t={now}");
        seen_times.push(now);
    }
    // Every arrival instant was an event time.
    for t in &ts {
        assert!(seen_times.contains(&((*t as f64 / speedup) as u64)) || *t == 0);
    }
    let r = Simulator::new(
        {
            let mut c = cfg(WritePolicyKind::WriteBack);
            c.mode = Mode::Open;
            c.speedup = speedup;
            c
        },
        BACKING,
        recs(
            ts.iter()
                .enumerate()
                .map(|(i, &t)| TraceRecord::new(t, Op::Write, i as u64 * 4096, 4096, 0))
                .collect(),
        ),
        "t",
    )
    .unwrap()
    .run()
    .unwrap();
    // The run ends shortly after the last arrival (40 ms), not at 5 × latency.
    assert!(
        r.sim_time_us >= 40_000.0 && r.sim_time_us < 40_100.0,
        "{}",
        r.sim_time_us
    );
}

#[test]
fn metrics_arithmetic() {
    // 50 distinct aligned writes then the same 50 again, write-through.
    let v: Vec<TraceRecord> = (0..100u64)
        .map(|i| TraceRecord::new(0, Op::Write, (i % 50) * 4096, 4096, 0))
        .chain((0..20u64).map(|i| TraceRecord::new(0, Op::Read, (i % 50) * 4096, 4096, 0)))
        .collect();
    let r = Simulator::new(cfg(WritePolicyKind::WriteThrough), BACKING, recs(v), "t")
        .unwrap()
        .run()
        .unwrap();
    assert_eq!(r.requests, 120);
    assert_eq!((r.reads, r.writes), (20, 100));
    assert_eq!(r.client_write_bytes, 100 * 4096);
    // Write-through writes every client byte to the backing store once.
    assert_eq!(r.backing_write_bytes, r.client_write_bytes);
    assert!((r.write_amplification - 1.0).abs() < 1e-12);
    assert_eq!(r.read_hits + r.read_misses, 20);
    assert_eq!(r.write_hits + r.write_misses, 100);
    assert!((r.throughput_iops - 120.0 / (r.sim_time_us / 1e6)).abs() < 1e-6 * r.throughput_iops);
    assert_eq!(r.dirty_bytes_end, 0);
    assert_eq!(r.run_length_histogram.blocks, r.backing_writes);
    assert_eq!(r.run_length_histogram.runs, r.backing_write_runs);
}

#[test]
fn adjacent_destages_coalesce_into_runs() {
    // Fill a 64-block write-back cache with 256 sequential blocks: destages
    // of adjacent blocks issued together become multi-block runs.
    let v: Vec<TraceRecord> = (0..256u64)
        .map(|i| TraceRecord::new(0, Op::Write, i * 4096, 4096, 0))
        .collect();
    let mut c = cfg(WritePolicyKind::WriteBack);
    c.cache_bytes = 64 * 4096;
    c.replacement = "lst:track=16".parse().unwrap();
    c.backing_qd = 1;
    let r = Simulator::new(c.clone(), BACKING, recs(v.clone()), "t")
        .unwrap()
        .run()
        .unwrap();
    assert!(r.backing_writes > 0);
    assert!(
        r.backing_write_runs < r.backing_writes,
        "{} runs for {} writes",
        r.backing_write_runs,
        r.backing_writes
    );
    assert!(r.run_length_histogram.mean() > 1.5);
    c.merge_backing = false;
    let r2 = Simulator::new(c, BACKING, recs(v), "t")
        .unwrap()
        .run()
        .unwrap();
    // Without the driver's merging, the engine's destage runs still put
    // adjacent blocks of one plan in one device write
    // (`MAX_DESTAGE_RUN_BYTES`); the driver's merging only takes more.
    assert!(r2.backing_write_ops > 0);
    assert!(
        r2.backing_write_ops < r2.run_length_histogram.blocks,
        "{} device writes for {} blocks",
        r2.backing_write_ops,
        r2.run_length_histogram.blocks
    );
    assert!(r.backing_write_ops <= r2.backing_write_ops);
    assert!(r2.backing_write_runs <= r2.backing_write_ops);
}

#[test]
fn large_writes_are_split_for_small_caches() {
    let v = vec![TraceRecord::new(0, Op::Write, 0, 1 << 20, 0)];
    let mut c = cfg(WritePolicyKind::WriteBack);
    c.cache_bytes = 32 * 4096; // max write = 16 blocks = 64 KiB
    let r = Simulator::new(c, BACKING, recs(v), "t")
        .unwrap()
        .run()
        .unwrap();
    assert_eq!(r.requests, 1);
    assert_eq!(r.errors, 0);
    assert_eq!(r.write_hits + r.write_misses, 256);
}

#[test]
fn intervals_partition_the_run() {
    let mut c = cfg(WritePolicyKind::WriteBack);
    c.interval_ns = Some(100_000);
    let r = Simulator::new(c, BACKING, recs(reads(300)), "t")
        .unwrap()
        .run()
        .unwrap();
    assert!(r.intervals.len() >= 2);
    let total: u64 = r.intervals.iter().map(|i| i.requests).sum();
    assert_eq!(total, r.requests);
    let reads: u64 = r.intervals.iter().map(|i| i.read_hits).sum();
    assert_eq!(reads, r.read_hits);
    for w in r.intervals.windows(2) {
        assert_eq!(w[0].end_us, w[1].start_us);
    }
    assert_eq!(r.intervals.last().unwrap().end_us, r.sim_time_us);
}

#[test]
fn a_journaled_checkpoint_pays_the_redo_log_unless_the_journal_is_free() {
    // 512 writes over 256 blocks through a 64-block journaled cache: the
    // checkpoints are atomic groups. The default cost is the live server's
    // redo log (driver docs): per group, a log write of the group in the log's
    // encoding and two flushes; `Free` is the write-policy
    // paper's NVRAM journal; `WriteFlush` a 4 KiB commit record.
    let v: Vec<TraceRecord> = (0..512u64)
        .map(|i| TraceRecord::new(0, Op::Write, (i * 97 % 256) * 4096, 4096, 0))
        .collect();
    let run = |end: GroupEndCost| {
        let mut c = cfg(WritePolicyKind::Journaled);
        c.cache_bytes = 64 * 4096;
        c.backing_qd = 1;
        c.group_end = end;
        Simulator::new(c, BACKING, recs(v.clone()), "t")
            .unwrap()
            .run()
            .unwrap()
    };
    assert_eq!(
        SimConfig::new(WritePolicyKind::Journaled, ReplacementKind::Lru, 0).group_end,
        GroupEndCost::Redo
    );
    let free = run(GroupEndCost::Free);
    let redo = run(GroupEndCost::Redo);
    let record = run(GroupEndCost::WriteFlush);
    assert!(free.backing_groups > 0, "the run checkpoints");
    assert_eq!((free.group_commit_writes, free.group_log_bytes), (0, 0));
    // The engine's own work is the same whatever a group's end costs.
    assert_eq!(redo.backing_write_bytes, free.backing_write_bytes);
    assert_eq!(redo.backing_groups, free.backing_groups);
    assert_eq!(redo.group_commit_writes, redo.backing_groups);
    assert_eq!(record.group_log_bytes, 4096 * record.group_commit_writes);
    // Every checkpoint write is in a group, so the log holds at least every
    // byte written, plus its encoding's headers.
    assert!(
        redo.group_log_bytes > redo.backing_write_bytes,
        "{} log bytes for {} group bytes in {} groups",
        redo.group_log_bytes,
        redo.backing_write_bytes,
        redo.backing_groups
    );
    assert!(
        redo.sim_time_us > record.sim_time_us,
        "{} vs {}",
        redo.sim_time_us,
        record.sim_time_us
    );
    assert!(
        record.sim_time_us > free.sim_time_us,
        "{} vs {}",
        record.sim_time_us,
        free.sim_time_us
    );
}

#[test]
fn a_redo_log_is_the_encoding_rounded_to_pages() {
    assert_eq!(redo_log_bytes(0, 0), 4096);
    assert_eq!(redo_log_bytes(4096, 1), 8192, "20 + 16 + 4096 bytes");
    assert_eq!(redo_log_bytes(4096 - 36, 1), 4096);
    assert_eq!(redo_log_bytes(4096 - 35, 1), 8192);
}

/// The replay options parse from their names (and `none`, an alias of
/// `single`); any other string is refused with the list of names.
#[test]
fn replay_options_parse_from_their_names() {
    assert_eq!("open".parse::<Mode>(), Ok(Mode::Open));
    assert_eq!("closed".parse::<Mode>(), Ok(Mode::Closed));
    assert_eq!("dev".parse::<ClientKey>(), Ok(ClientKey::Dev));
    assert_eq!("none".parse::<ClientKey>(), Ok(ClientKey::Single));
    assert_eq!("write-flush".parse(), Ok(GroupEndCost::WriteFlush));
    assert_eq!(
        "x".parse::<ClientKey>(),
        Err("unknown client key \"x\" (stream, dev, single)".to_string())
    );
    assert_eq!(
        "Open".parse::<Mode>(),
        Err("unknown mode \"Open\" (closed, open)".to_string())
    );
    assert_eq!(
        "".parse::<GroupEndCost>(),
        Err("unknown group-end cost \"\" (redo, free, write-flush)".to_string())
    );
}
