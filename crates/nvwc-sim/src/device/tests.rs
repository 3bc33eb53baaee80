//! Analytic and behavioural tests of the device models.

use super::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const US: u64 = 1_000;
const MS: u64 = 1_000_000;

/// Submit `ops` (time, op) in order, popping completions at the model's
/// `next_completion` times; returns (id, completion time) in completion
/// order. Completion times are exact because the driver pops at every
/// `next_completion` before moving time forward.
fn run(dev: &mut dyn DeviceModel, mut ops: Vec<(u64, DevOp)>) -> Vec<(u64, u64)> {
    ops.sort_by_key(|&(t, _)| t);
    let mut done = Vec::new();
    let mut buf = Vec::new();
    let mut next = ops.into_iter().peekable();
    loop {
        let tn = dev.next_completion();
        let ts = next.peek().map(|&(t, _)| t);
        match (tn, ts) {
            (None, None) => break,
            (Some(c), s) if s.is_none_or(|s| c <= s) => {
                buf.clear();
                dev.pop_completions(c, &mut buf);
                done.extend(buf.iter().map(|&id| (id, c)));
            }
            (_, s) => {
                let (_, op) = next.next().expect("peeked");
                dev.submit(s.expect("a submission is next"), op);
            }
        }
    }
    done
}

/// Completion time of `id` in a `run` result.
fn at(done: &[(u64, u64)], id: u64) -> u64 {
    done.iter()
        .find(|&&(i, _)| i == id)
        .map(|&(_, t)| t)
        .expect("id completed")
}

/// Table 1's accesses of 4 KiB, each alone on an idle `d`, 1 ms apart:
/// random read, sequential read, random write, sequential write; their
/// service times.
fn table1_latencies(d: &mut dyn DeviceModel) -> [u64; 4] {
    let mut t = 0;
    [
        DevOp::read(1, 1 << 30, 4096),
        DevOp::read(2, (1 << 30) + 4096, 4096),
        DevOp::write(3, 5 << 30, 4096),
        DevOp::write(4, (5 << 30) + 4096, 4096),
    ]
    .map(|op| {
        let s = lone(d, t, op);
        t += s + MS;
        s
    })
}

/// Time of a lone op on a fresh device.
fn lone(dev: &mut dyn DeviceModel, t0: u64, op: DevOp) -> u64 {
    at(&run(dev, vec![(t0, op)]), op.id) - t0
}

fn hp() -> HddModel {
    HddModel::new(HddParams::hp97560(), None).unwrap()
}

/// Rotational wait computed independently in floating point: from time `t`
/// (ns) until physical sector `p` of a track with `spt` sectors.
fn rot_wait_f64(t: u64, rpm: u32, spt: u32, p: u32) -> f64 {
    let rev = 60e9 / rpm as f64;
    let phase = (t as f64 / rev).fract();
    let target = p as f64 / spt as f64;
    let mut w = target - phase;
    if w < -1e-9 {
        w += 1.0;
    }
    w.max(0.0) * rev
}

/// Physical sector of (cyl, head, logical sector) under the HP 97560 skews.
fn hp_physical(cyl: u32, head: u32, sector: u32) -> u32 {
    let per_cyl = 18 + 18 * 8;
    ((sector as u64 + cyl as u64 * per_cyl + head as u64 * 8) % 72) as u32
}

// ---------------------------------------------------------------- HDD ----

#[test]
fn hp97560_geometry_matches_datasheet() {
    let d = hp();
    // 1962 cyl x 19 heads x 72 sectors x 512 B = 1374 MB (datasheet: 1374 MB formatted).
    assert_eq!(d.capacity_bytes(), 1_374_216_192);
    assert_eq!(d.track_bytes(), 72 * 512);
    assert_eq!(DeviceModel::track_bytes(&d), Some(36_864));
    assert_eq!(d.track_extent(36_864 * 3 + 100), (36_864 * 3, 36_864));
    assert_eq!(d.chs(0), (0, 0, 0));
    assert_eq!(d.chs(36_864 * 19), (1, 0, 0));
    assert_eq!(d.chs(36_864 + 512 * 5), (0, 1, 5));
}

#[test]
fn hp97560_published_skews_equal_derived_skews() {
    let mut p = HddParams::hp97560();
    p.track_skew_sectors = None;
    p.cylinder_skew_sectors = None;
    let d = HddModel::new(p, None).unwrap();
    assert_eq!(d.skews(0), (8, 18));
}

#[test]
fn hp97560_seek_curve() {
    let s = HddParams::hp97560().seek;
    assert_eq!(s.seek_ns(0), 0);
    assert_eq!(s.seek_ns(1), 3_640_000);
    assert!((s.seek_ms(100) - 7.24).abs() < 1e-9);
    assert!((s.seek_ms(382) - (3.24 + 0.4 * 382f64.sqrt())).abs() < 1e-9);
    assert!((s.seek_ms(383) - 11.064).abs() < 1e-9);
    assert!((s.seek_ms(1961) - 23.688).abs() < 1e-9);
    // Nearly continuous at the boundary.
    assert!((s.seek_ms(383) - s.seek_ms(382)).abs() < 0.05);
    // Mean seek of the curve vs the datasheet's 13.5 ms average seek.
    let mean = s.mean_seek_ms(1962);
    assert!((mean - 13.5).abs() < 1.0, "mean seek {mean}");
}

#[test]
fn modern_7200_meets_its_datasheet_figures() {
    let p = HddParams::modern_7200();
    let cyls = p.cylinders();
    assert_eq!(cyls, 320_800);
    let s = p.seek;
    assert!(
        (s.seek_ms(1) - 0.5).abs() < 0.01,
        "single track {}",
        s.seek_ms(1)
    );
    assert!(
        (s.seek_ms(cyls as u64 - 1) - 17.5).abs() < 0.05,
        "full stroke {}",
        s.seek_ms(cyls as u64 - 1)
    );
    let mean = s.mean_seek_ms(cyls);
    assert!((mean - 8.5).abs() < 0.05, "mean seek {mean}");
    let b = s.boundary_cylinders as u64;
    assert!((s.seek_ms(b) - s.seek_ms(b - 1)).abs() < 0.05);
    let cap = p.native_capacity() as f64;
    assert!((cap / 4e12 - 1.0).abs() < 1e-3, "capacity {cap}");
    let d = HddModel::new(p.clone(), None).unwrap();
    let track = d.track_bytes();
    assert!((1 << 20..2 << 20).contains(&track), "track {track}");
    // Outer-zone media rate ~200 MB/s, inner ~100 MB/s.
    let outer = track as f64 * 7200.0 / 60.0;
    assert!((outer / 200e6 - 1.0).abs() < 0.03, "outer rate {outer}");
    let inner = p.zones.last().unwrap().sectors_per_track as f64 * 512.0 * 120.0;
    assert!((inner / 100e6 - 1.0).abs() < 0.05, "inner rate {inner}");
    // Derived skews hide a head switch (0.5 ms) and a 1-cylinder seek.
    let (ts, cs) = d.skews(0);
    let sector_ns = 60e9 / 7200.0 / 3250.0;
    assert!(ts as f64 * sector_ns >= 0.5e6 - 1.0 && (ts as f64 - 1.0) * sector_ns < 0.5e6);
    assert!(cs as f64 * sector_ns >= s.seek_ms(1) * 1e6);
}

#[test]
fn hp97560_single_random_4k_read_is_overhead_seek_rotation_transfer() {
    // 4 KiB at cylinder 700, head 3, sector 40; head starts at cylinder 0.
    let offset = ((700 * 19 + 3) * 72 + 40) * 512;
    for t0 in [0, 1_234_567, 9_999_999_999] {
        let mut d = hp();
        let svc = lone(&mut d, t0, DevOp::read(1, offset, 4096));
        let seek = HddParams::hp97560().seek.seek_ns(700);
        let xfer = (8.0 * 60e9 / 4002.0 / 72.0) as u64;
        let arrive = t0 + 2_200_000 + seek;
        let wait = rot_wait_f64(arrive, 4002, 72, hp_physical(700, 3, 40));
        let expect = (2_200_000 + seek + xfer) as f64 + wait;
        assert!(
            (svc as f64 - expect).abs() < 3.0,
            "t0 {t0}: {svc} vs {expect}"
        );
        // And within the generic bounds.
        let rev = 60e9 / 4002.0;
        assert!(
            svc >= 2_200_000 + seek + xfer && (svc as f64) < (2_200_000 + seek + xfer) as f64 + rev
        );
        assert_eq!(d.head_cylinder(), 700);
    }
}

#[test]
fn hp97560_random_reads_average_matches_analytic_mean() {
    // Random 4 KiB reads one after another (closed loop): mean service should
    // be overhead + mean seek + half a revolution + transfer.
    let mut d = hp();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let blocks = d.capacity_bytes() / 4096;
    let n = 400;
    let mut t = 0;
    let mut total = 0u64;
    for id in 0..n {
        let op = DevOp::read(id, rng.gen_range(0..blocks) * 4096, 4096);
        let svc = lone(&mut d, t, op);
        total += svc;
        t += svc;
    }
    let s = HddParams::hp97560().seek;
    let rev = 60e6 / 4002.0; // µs
    let expect = 2200.0 + s.mean_seek_ms(1962) * 1000.0 + rev / 2.0 + 8.0 * rev / 72.0;
    let mean = total as f64 / n as f64 / 1000.0;
    assert!(
        (mean / expect - 1.0).abs() < 0.07,
        "mean {mean} µs vs {expect} µs"
    );
}

#[test]
fn hp97560_full_track_read_transfers_in_one_revolution() {
    let mut d = hp();
    let cyl = 10;
    let offset = (cyl * 19 * 72) * 512;
    let svc = lone(&mut d, 0, DevOp::read(1, offset, 72 * 512));
    let seek = HddParams::hp97560().seek.seek_ns(cyl);
    let wait = rot_wait_f64(2_200_000 + seek, 4002, 72, hp_physical(cyl as u32, 0, 0));
    let rev = 60e9 / 4002.0;
    let media = svc as f64 - 2_200_000.0 - seek as f64 - wait;
    assert!(
        (media - rev).abs() < 3.0,
        "transfer {media} vs revolution {rev}"
    );
}

#[test]
fn hp97560_skew_hides_head_and_cylinder_switches() {
    let rev = 60e9 / 4002.0;
    let sector = rev / 72.0;
    // Two whole tracks starting at cylinder 5, head 18: crosses a cylinder.
    // The second track starts 18 sectors (cylinder skew) after the first
    // ended, and 18 sectors (3.75 ms) cover a 1-cylinder seek (3.64 ms).
    let off = ((5 * 19 + 18) * 72) * 512;
    let mut d = hp();
    let svc = lone(&mut d, 0, DevOp::read(1, off, 2 * 72 * 512));
    let seek = HddParams::hp97560().seek.seek_ns(5);
    let wait = rot_wait_f64(2_200_000 + seek, 4002, 72, hp_physical(5, 18, 0));
    let expect = 2_200_000.0 + seek as f64 + wait + rev + 18.0 * sector + rev;
    assert!((svc as f64 - expect).abs() < 5.0, "{svc} vs {expect}");
    // Same within a cylinder (head 2 -> 3): the track skew (8 sectors) covers the 1.6 ms switch.
    let off = ((5 * 19 + 2) * 72) * 512;
    let mut d = hp();
    let svc = lone(&mut d, 0, DevOp::read(1, off, 2 * 72 * 512));
    let wait = rot_wait_f64(2_200_000 + seek, 4002, 72, hp_physical(5, 2, 0));
    let expect = 2_200_000.0 + seek as f64 + wait + rev + 8.0 * sector + rev;
    assert!((svc as f64 - expect).abs() < 5.0, "{svc} vs {expect}");
    // Without skew the switch misses the start of the next track: almost a
    // whole extra revolution.
    let mut p = HddParams::hp97560();
    p.track_skew_sectors = Some(0);
    p.cylinder_skew_sectors = Some(0);
    let mut d0 = HddModel::new(p, None).unwrap();
    let svc0 = lone(&mut d0, 0, DevOp::read(1, off, 2 * 72 * 512));
    assert!(
        svc0 as f64 > svc as f64 + rev / 2.0,
        "no-skew {svc0} vs skew {svc}"
    );
}

/// Read one HP track as 9 back-to-back 4 KiB requests (closed loop).
fn hp_track_in_4k_requests(readahead: u64) -> (u64, u64) {
    let mut p = HddParams::hp97560();
    p.readahead_bytes = readahead;
    let mut d = HddModel::new(p, None).unwrap();
    let base = (20 * 19 * 72) * 512;
    let first = lone(&mut d, 0, DevOp::read(0, base, 4096));
    let mut t = first;
    for i in 1..9 {
        t += lone(&mut d, t, DevOp::read(i, base + i * 4096, 4096));
    }
    (first, t)
}

#[test]
fn hp97560_sequential_reads_hit_read_ahead() {
    let rev = (60e9 / 4002.0) as u64;
    let bus_4k = transfer_ns(4096, 10_000_000);
    let (first, total) = hp_track_in_4k_requests(64 * 1024);
    // Each later request costs controller overhead + bus: the drive is ahead.
    assert_eq!(total - first, 8 * (2_200_000 + bus_4k), "with read-ahead");
    let (first0, total0) = hp_track_in_4k_requests(0);
    // Without read-ahead each later request just misses its sector and
    // waits about a revolution.
    let per = (total0 - first0) / 8;
    assert!(
        per > rev && per < rev + 2 * MS,
        "per-request {per} vs revolution {rev}"
    );
}

#[test]
fn fifo_sstf_clook_orders() {
    let cyl_off = |c: u64| c * 19 * 72 * 512;
    // Request 0 (cylinder 600) occupies the disk; 1..=4 queue behind it.
    let ops = |ids_cyls: &[(u64, u64)]| -> Vec<(u64, DevOp)> {
        ids_cyls
            .iter()
            .map(|&(id, c)| (id, DevOp::read(id, cyl_off(c), 4096)))
            .collect()
    };
    let order = |sched: DiskScheduler| -> Vec<u64> {
        let mut p = HddParams::hp97560();
        p.scheduler = sched;
        p.readahead_bytes = 0;
        let mut d = HddModel::new(p, None).unwrap();
        let done = run(
            &mut d,
            ops(&[(0, 600), (1, 100), (2, 700), (3, 1500), (4, 650)]),
        );
        done.iter().map(|&(id, _)| id).collect()
    };
    assert_eq!(order(DiskScheduler::Fifo), vec![0, 1, 2, 3, 4]);
    assert_eq!(order(DiskScheduler::Sstf), vec![0, 4, 2, 1, 3]);
    assert_eq!(order(DiskScheduler::CLook), vec![0, 4, 2, 3, 1]);
    // SSTF and C-LOOK differ when the nearest request is behind the head.
    let order2 = |sched: DiskScheduler| -> Vec<u64> {
        let mut p = HddParams::hp97560();
        p.scheduler = sched;
        let mut d = HddModel::new(p, None).unwrap();
        let done = run(&mut d, ops(&[(0, 600), (1, 590), (2, 900), (3, 100)]));
        done.iter().map(|&(id, _)| id).collect()
    };
    assert_eq!(order2(DiskScheduler::Sstf), vec![0, 1, 2, 3]);
    assert_eq!(order2(DiskScheduler::CLook), vec![0, 2, 3, 1]);
}

#[test]
fn write_through_disk_flush_and_trim_cost_nothing() {
    let mut d = hp();
    let done = run(
        &mut d,
        vec![
            (0, DevOp::write(1, 0, 4096)),
            (10, DevOp::flush(2)),
            (20, DevOp::trim(3, 0, 4096)),
        ],
    );
    assert_eq!(at(&done, 2), 10);
    assert_eq!(at(&done, 3), 20);
    assert!(at(&done, 1) > 2 * MS);
    let s = d.stats();
    assert_eq!((s.write.ops, s.flush.ops, s.trim.ops), (1, 1, 1));
    assert_eq!(s.flush.response_ns, 0);
}

#[test]
fn disk_write_cache_acks_early_and_flush_waits_for_destage() {
    let mut p = HddParams::hp97560();
    p.write_cache_bytes = 128 * 1024;
    let mut d = HddModel::new(p, None).unwrap();
    let off = (900 * 19 * 72) * 512;
    let done = run(
        &mut d,
        vec![(0, DevOp::write(1, off, 8192)), (3 * MS, DevOp::flush(2))],
    );
    let ack = at(&done, 1);
    assert_eq!(ack, 2_200_000 + transfer_ns(8192, 10_000_000));
    // The destage seeks 900 cylinders (15.2 ms) before writing: the flush
    // cannot complete before that.
    let flush = at(&done, 2);
    let seek = HddParams::hp97560().seek.seek_ns(900);
    assert!(
        flush >= seek + 16 * (60e9 / 4002.0 / 72.0) as u64,
        "flush at {flush}"
    );
    let s = d.stats();
    assert_eq!(s.background_ops, 1);
    assert_eq!(s.background_bytes, 8192);
    // With nothing dirty a FLUSH is immediate again.
    let t = flush + MS;
    let done = run(&mut d, vec![(t, DevOp::flush(3))]);
    assert_eq!(at(&done, 3), t);
}

#[test]
fn disk_write_cache_fua_and_overflow_go_to_media() {
    let mut p = HddParams::hp97560();
    p.write_cache_bytes = 16 * 1024;
    let mut d = HddModel::new(p, None).unwrap();
    let mut op = DevOp::write(1, 0, 4096);
    op.fua = true;
    let t_fua = lone(&mut d, 0, op);
    assert!(t_fua > 2_200_000 + MS, "FUA write went to media: {t_fua}");
    // A write larger than the cache is written through.
    let t_big = lone(&mut d, 100 * MS, DevOp::write(2, 1 << 20, 32 * 1024));
    assert!(t_big > 2_200_000 + 64 * (60e9 / 4002.0 / 72.0) as u64);
}

#[test]
fn idle_only_destage_lets_reads_go_first() {
    let mk = |idle: bool| {
        let mut p = HddParams::hp97560();
        p.write_cache_bytes = 1 << 20;
        p.destage_idle_only = idle;
        p.readahead_bytes = 0;
        HddModel::new(p, None).unwrap()
    };
    let cyl_off = |c: u64| c * 19 * 72 * 512;
    let ops = vec![
        (0, DevOp::read(1, cyl_off(10), 4096)),
        (1, DevOp::write(2, cyl_off(1900), 4096)),
        (2, DevOp::read(3, cyl_off(20), 4096)),
    ];
    let a = run(&mut mk(false), ops.clone());
    let b = run(&mut mk(true), ops);
    // FIFO destage: the read at cylinder 20 waits for the far destage.
    assert!(
        at(&b, 3) + 10 * MS < at(&a, 3),
        "idle-only {} vs fifo {}",
        at(&b, 3),
        at(&a, 3)
    );
}

#[test]
fn short_stroked_and_oversized_hdd_capacity() {
    let d = HddModel::new(HddParams::hp97560(), Some(1 << 30)).unwrap();
    assert_eq!(d.capacity_bytes(), 1 << 30);
    let e = HddModel::new(HddParams::hp97560(), Some(2 << 30))
        .err()
        .unwrap();
    assert!(matches!(e, DeviceError::CapacityTooLarge { .. }));
}

// -------------------------------------------------------- solid state ----

/// `n` reads of `len` bytes, `stride` bytes apart (ids `0..n`), all
/// submitted at time 0.
fn reads_at_zero(n: u64, stride: u64, len: u64) -> Vec<(u64, DevOp)> {
    (0..n)
        .map(|i| (0, DevOp::read(i, i * stride, len)))
        .collect()
}

fn simple(units: u32, read_ns: u64) -> SolidStateParams {
    SolidStateParams {
        name: "test".into(),
        capacity_bytes: 1 << 30,
        parallel_units: units,
        chunk_bytes: 0,
        read_ns,
        seq_read_ns: None,
        write_ns: read_ns,
        ..Default::default()
    }
}

#[test]
fn one_server_serves_n_simultaneous_ops_in_n_service_times() {
    let mut d = SolidStateModel::new(simple(1, 100 * US), None).unwrap();
    let ops = reads_at_zero(10, 8192, 4096);
    let done = run(&mut d, ops);
    let expect: Vec<(u64, u64)> = (0..10).map(|i| (i, (i + 1) * 100 * US)).collect();
    assert_eq!(done, expect);
    let s = d.stats();
    assert_eq!(s.read.ops, 10);
    assert_eq!(s.read.bytes, 40_960);
    assert_eq!(s.elapsed_ns, MS);
    assert_eq!(s.busy_ns, MS);
    assert_eq!(s.media_busy_ns, MS);
    assert!((s.mean_queue_depth - 5.5).abs() < 1e-9);
    assert_eq!(s.max_queue_depth, 10);
    assert_eq!(s.qd_time_ns[10], 100 * US);
    assert_eq!(s.qd_time_ns[1], 100 * US);
    assert_eq!(s.read.service_ns, 10 * 100 * US as u128);
    assert_eq!(s.read.response_ns, 55 * 100 * US as u128);
    assert_eq!(s.read.max_response_ns, MS);
}

#[test]
fn k_units_complete_k_ops_in_parallel() {
    let mut d = SolidStateModel::new(simple(4, 100 * US), None).unwrap();
    let ops = reads_at_zero(8, 4096, 4096);
    let done = run(&mut d, ops);
    for (id, t) in done {
        assert_eq!(t, if id < 4 { 100 * US } else { 200 * US }, "op {id}");
    }
}

#[test]
fn large_ops_split_across_units() {
    let mut p = simple(4, 100 * US);
    p.chunk_bytes = 4096;
    let mut d = SolidStateModel::new(p, None).unwrap();
    // 32 KiB = 8 pieces on 4 units: two rounds.
    assert_eq!(lone(&mut d, 0, DevOp::read(1, 0, 32 * 1024)), 200 * US);
    // Unaligned: [2048, 2048 + 8192) covers 3 pieces -> one round.
    assert_eq!(lone(&mut d, MS, DevOp::read(2, 2048, 8192)), 100 * US);
}

#[test]
fn link_bandwidth_serialises_transfers() {
    let mut p = simple(16, US);
    p.link_read_bytes_per_sec = 1_000_000_000;
    p.link_write_bytes_per_sec = 1_000_000_000;
    let mut d = SolidStateModel::new(p.clone(), None).unwrap();
    let ops = reads_at_zero(4, 1 << 20, 1 << 20);
    let done = run(&mut d, ops);
    let x = transfer_ns(1 << 20, 1_000_000_000);
    for (id, t) in done {
        assert_eq!(t, US + (id + 1) * x, "read {id}");
    }
    // Half duplex: a write issued with the reads shares the link.
    let mut d = SolidStateModel::new(p.clone(), None).unwrap();
    let done = run(
        &mut d,
        vec![
            (0, DevOp::write(2, 1 << 20, 1 << 20)),
            (0, DevOp::read(1, 0, 1 << 20)),
        ],
    );
    // The write books the link first; the read's transfer follows it.
    assert_eq!(at(&done, 2), x + US);
    assert_eq!(at(&done, 1), 2 * x);
    // Full duplex: no sharing.
    p.link_full_duplex = true;
    let mut d = SolidStateModel::new(p, None).unwrap();
    let done = run(
        &mut d,
        vec![
            (0, DevOp::read(1, 0, 1 << 20)),
            (0, DevOp::write(2, 1 << 20, 1 << 20)),
        ],
    );
    assert_eq!(at(&done, 1), US + x);
    assert_eq!(at(&done, 2), x + US);
}

#[test]
fn revodrive_reproduces_table1_at_queue_depth_one() {
    let mut d = SolidStateModel::new(SolidStateParams::ssd_revodrive(), None).unwrap();
    assert_eq!(
        table1_latencies(&mut d),
        [177 * US, 93 * US, 66 * US, 82 * US]
    );
}

#[test]
fn memory_devices_are_microsecond_class() {
    for (p, lo, hi) in [
        (SolidStateParams::nvdram(), US, 2 * US),
        (SolidStateParams::pmem(), US, 3 * US),
    ] {
        let mut d = SolidStateModel::new(p.clone(), None).unwrap();
        let r = lone(&mut d, 0, DevOp::read(1, 0, 4096));
        let w = lone(&mut d, MS, DevOp::write(2, 0, 4096));
        assert!(
            (lo..=hi).contains(&r) && (lo..=hi).contains(&w),
            "{}: read {r} write {w}",
            p.name
        );
    }
}

#[test]
fn ssd_presets_qd1_latencies_and_saturation() {
    // NVMe: random 4 KiB read at QD1 = 80 µs + link; 4 KiB write acked from the buffer.
    let mut d = SolidStateModel::new(SolidStateParams::ssd_nvme(), None).unwrap();
    let r = lone(&mut d, 0, DevOp::read(1, 1 << 30, 4096));
    assert_eq!(r, 80 * US + transfer_ns(4096, 2_800_000_000));
    let w = lone(&mut d, MS, DevOp::write(2, 1 << 31, 4096));
    assert_eq!(w, 20 * US + transfer_ns(4096, 2_000_000_000));
    // Saturated random reads approach units / latency (Little's law): 37 / 80 µs.
    let mut d = SolidStateModel::new(SolidStateParams::ssd_nvme(), None).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let n = 3700u64;
    let ops = (0..n)
        .map(|i| (0, DevOp::read(i, rng.gen_range(0..1u64 << 27) * 4096, 4096)))
        .collect();
    let done = run(&mut d, ops);
    let end = done.iter().map(|&(_, t)| t).max().unwrap();
    let iops = n as f64 / (end as f64 / 1e9);
    assert!((iops / 462_500.0 - 1.0).abs() < 0.03, "iops {iops}");
}

fn buffered(volatile: bool) -> SolidStateParams {
    let mut p = simple(1, 100 * US);
    p.write_ns = 300 * US;
    p.write_buffer = Some(WriteBufferParams {
        bytes: 64 * 1024,
        ack_ns: 20 * US,
        volatile,
    });
    p.flush_ns = 5 * US;
    p
}

#[test]
fn volatile_ssd_buffer_flush_waits_for_programs() {
    let mut d = SolidStateModel::new(buffered(true), None).unwrap();
    let ops = vec![
        (0, DevOp::write(1, 0, 4096)),
        (0, DevOp::write(2, 4096 * 10, 4096)),
        (30 * US, DevOp::flush(3)),
    ];
    let done = run(&mut d, ops);
    assert_eq!(at(&done, 1), 20 * US);
    assert_eq!(at(&done, 2), 20 * US);
    // Two programs of 300 µs on one unit, then the flush's own 5 µs.
    assert_eq!(at(&done, 3), 600 * US + 5 * US);
    assert_eq!(d.buffered_bytes(), 0);
    // Power-loss-protected buffer: FLUSH does not wait.
    let mut d = SolidStateModel::new(buffered(false), None).unwrap();
    let done = run(
        &mut d,
        vec![(0, DevOp::write(1, 0, 4096)), (30 * US, DevOp::flush(3))],
    );
    assert_eq!(at(&done, 3), 35 * US);
}

#[test]
fn full_buffer_writes_through_and_flush_ignores_later_writes() {
    let mut d = SolidStateModel::new(buffered(true), None).unwrap();
    // 64 KiB buffer: the 17th 4 KiB write does not fit and is written through.
    let mut ops: Vec<(u64, DevOp)> = (0..17)
        .map(|i| (0, DevOp::write(i, i * 8192, 4096)))
        .collect();
    ops.push((0, DevOp::flush(100)));
    let done = run(&mut d, ops);
    assert_eq!(at(&done, 0), 20 * US);
    assert_eq!(at(&done, 15), 20 * US);
    // Write 16 queues behind the 16 destages on the single unit.
    assert_eq!(at(&done, 16), 17 * 300 * US);
    // The flush covers the 16 buffered writes only.
    assert_eq!(at(&done, 100), 16 * 300 * US + 5 * US);
}

// ---------------------------------------------------------------- net ----

fn net_over_simple(rtt: u64, bw: u64, max_out: u32) -> NetModel {
    let mut b = simple(4, 50 * US);
    b.write_ns = 70 * US;
    let p = NetParams {
        name: "n".into(),
        rtt_ns: rtt,
        bandwidth_bytes_per_sec: bw,
        max_outstanding: max_out,
        backend: Box::new(DeviceSpec::SolidState(b)),
    };
    NetModel::new(p, None).unwrap()
}

#[test]
fn network_rtt_and_bandwidth_add() {
    let mut n = net_over_simple(200 * US, 100_000_000, 0);
    let r = lone(&mut n, 0, DevOp::read(1, 0, 4096));
    assert_eq!(
        r,
        100 * US + 50 * US + transfer_ns(4096, 100_000_000) + 100 * US
    );
    let w = lone(&mut n, MS, DevOp::write(2, 0, 65536));
    assert_eq!(
        w,
        transfer_ns(65536, 100_000_000) + 100 * US + 70 * US + 100 * US
    );
    let f = lone(&mut n, 10 * MS, DevOp::flush(3));
    assert_eq!(f, 200 * US);
    // Two simultaneous 64 KiB writes serialise on the link.
    let mut n = net_over_simple(200 * US, 100_000_000, 0);
    let done = run(
        &mut n,
        vec![
            (0, DevOp::write(1, 0, 65536)),
            (0, DevOp::write(2, 65536, 65536)),
        ],
    );
    let x = transfer_ns(65536, 100_000_000);
    assert_eq!(at(&done, 1), x + 270 * US);
    assert_eq!(at(&done, 2), 2 * x + 270 * US);
    assert_eq!(n.backend_stats().write.ops, 2);
}

#[test]
fn network_outstanding_limit_holds_commands_at_the_client() {
    let mut n = net_over_simple(100 * US, 0, 2);
    let ops = reads_at_zero(4, 4096, 4096);
    let done = run(&mut n, ops);
    // Backend has 4 units, but only 2 commands may be on the wire.
    assert_eq!(at(&done, 0), 150 * US);
    assert_eq!(at(&done, 1), 150 * US);
    assert_eq!(at(&done, 2), 300 * US);
    assert_eq!(at(&done, 3), 300 * US);
    assert_eq!(n.stats().max_queue_depth, 4);
}

#[test]
fn iscsi_preset_reproduces_table1_at_queue_depth_one() {
    let mut n = build(&"net".parse().unwrap(), None).unwrap();
    assert_eq!(n.capacity_bytes(), 1_000_000_000_000);
    assert_eq!(
        table1_latencies(n.as_mut()),
        [4813 * US, 593 * US, 5285 * US, 891 * US]
    );
    // Table 1's headline: random writes ~80x slower than on the local SSD.
    let mut ssd = build(&"ssd-revodrive".parse().unwrap(), None).unwrap();
    let local = lone(ssd.as_mut(), 0, DevOp::write(1, 5 << 30, 4096));
    let ratio = 5285.0 * US as f64 / local as f64;
    assert!((70.0..90.0).contains(&ratio), "ratio {ratio}");
}

#[test]
fn network_over_hdd_backend_reports_track_size() {
    let n = build(&"net-hdd".parse().unwrap(), None).unwrap();
    assert_eq!(n.track_bytes(), Some(3250 * 512));
    assert!(build(&"ssd".parse().unwrap(), None)
        .unwrap()
        .track_bytes()
        .is_none());
}

// -------------------------------------------------------------- array ----

fn array(raid: RaidLevel, n: usize) -> ArrayModel {
    let mut m = simple(1, 100 * US);
    m.write_ns = 150 * US;
    let members = (0..n).map(|_| DeviceSpec::SolidState(m.clone())).collect();
    ArrayModel::new(
        ArrayParams {
            name: "a".into(),
            raid,
            members,
        },
        None,
    )
    .unwrap()
}

#[test]
fn raid0_splits_stripes_across_members() {
    let mut a = array(RaidLevel::Raid0 { stripe_bytes: 4096 }, 2);
    assert_eq!(a.capacity_bytes(), 2 << 30);
    // 16 KiB = stripe units 0..4: units 0, 2 on member 0 (member offsets 0,
    // 4096: one 8 KiB command), units 1, 3 on member 1.
    assert_eq!(lone(&mut a, 0, DevOp::read(1, 0, 16384)), 100 * US);
    for m in 0..2 {
        let s = a.member_stats(m);
        assert_eq!((s.read.ops, s.read.bytes), (1, 8192), "member {m}");
    }
    // Unaligned 4 KiB at 6144 touches units 1 and 2 -> both members.
    assert_eq!(lone(&mut a, MS, DevOp::read(2, 6144, 4096)), 100 * US);
    assert_eq!(a.member_stats(0).read.ops, 2);
    assert_eq!(a.member_stats(1).read.ops, 2);
    // A flush goes to every member.
    lone(&mut a, 2 * MS, DevOp::flush(3));
    assert_eq!(a.member_stats(1).flush.ops, 1);
}

#[test]
fn raid1_mirrors_writes_and_spreads_reads() {
    let mut a = array(RaidLevel::Raid1, 2);
    assert_eq!(a.capacity_bytes(), 1 << 30);
    assert_eq!(lone(&mut a, 0, DevOp::write(1, 0, 4096)), 150 * US);
    assert_eq!(
        (a.member_stats(0).write.ops, a.member_stats(1).write.ops),
        (1, 1)
    );
    // Two simultaneous reads use both mirrors; four take two rounds.
    let ops = (0..4)
        .map(|i| (MS, DevOp::read(10 + i, i * 4096, 4096)))
        .collect();
    let done = run(&mut a, ops);
    assert_eq!(at(&done, 10), MS + 100 * US);
    assert_eq!(at(&done, 11), MS + 100 * US);
    assert_eq!(at(&done, 12), MS + 200 * US);
    assert_eq!(at(&done, 13), MS + 200 * US);
    assert_eq!(
        (a.member_stats(0).read.ops, a.member_stats(1).read.ops),
        (2, 2)
    );
}

#[test]
fn raid1_of_disks_behind_the_network() {
    let n = build(&"net-raid1".parse().unwrap(), Some(1_000_000_000_000)).unwrap();
    assert_eq!(n.capacity_bytes(), 1_000_000_000_000);
    assert_eq!(n.track_bytes(), Some(3250 * 512));
    let e = build(&"hdd-raid1".parse().unwrap(), Some(5_000_000_000_000))
        .err()
        .unwrap();
    assert!(matches!(e, DeviceError::CapacityTooLarge { .. }));
}

// --------------------------------------------------- spec, determinism ----

#[test]
fn every_preset_parses_builds_and_round_trips_through_json() {
    for &name in PRESET_NAMES {
        let spec: DeviceSpec = name.parse().unwrap();
        let dev = build(&spec, None).unwrap();
        assert!(dev.capacity_bytes() > 0, "{name}");
        let json = spec.to_json();
        assert_eq!(DeviceSpec::from_json(&json).unwrap(), spec, "{name}");
        assert_eq!(json.parse::<DeviceSpec>().unwrap(), spec, "{name}");
        assert_eq!(DeviceSpec::from_json(&format!("{name:?}")).unwrap(), spec);
    }
    assert!(matches!(
        "floppy".parse::<DeviceSpec>(),
        Err(DeviceError::UnknownName(_))
    ));
    assert_eq!(
        "hdd".parse::<DeviceSpec>().unwrap(),
        "hdd-7200".parse().unwrap()
    );
    assert_eq!(
        "ssd".parse::<DeviceSpec>().unwrap(),
        "ssd-sata".parse().unwrap()
    );
    assert_eq!("net".parse::<DeviceSpec>().unwrap().name(), "net");
}

#[test]
fn custom_parameters_from_json() {
    let json = r#"{
        "type": "hdd", "name": "tiny", "heads": 2, "rpm": 6000,
        "zones": [{"cylinders": 100, "sectors_per_track": 10}],
        "seek": {"boundary_cylinders": 10, "short_base_ms": 1.0, "short_sqrt_ms": 0.5,
                 "long_base_ms": 2.0, "long_linear_ms": 0.01},
        "head_switch_ns": 100000, "read_overhead_ns": 0, "write_overhead_ns": 0,
        "scheduler": "c-look"
    }"#;
    let spec = DeviceSpec::from_json(json).unwrap();
    let DeviceSpec::Hdd(p) = &spec else {
        panic!("not an hdd")
    };
    assert_eq!(p.scheduler, DiskScheduler::CLook);
    assert_eq!(p.sector_bytes, 512);
    let mut d = build(&spec, None).unwrap();
    assert_eq!(d.capacity_bytes(), 100 * 2 * 10 * 512);
    assert_eq!(d.name(), "tiny");
    // One full track at cylinder 0 from time 0: 10 ms revolution, sector 0 is under the head.
    assert_eq!(lone(d.as_mut(), 0, DevOp::read(1, 0, 5120)), 10 * MS);
    let bad = json.replace("\"rpm\"", "\"rpms\"");
    assert!(matches!(
        DeviceSpec::from_json(&bad),
        Err(DeviceError::Parse(_))
    ));
    let zero = json.replace("\"heads\": 2", "\"heads\": 0");
    assert!(matches!(
        build(&DeviceSpec::from_json(&zero).unwrap(), None),
        Err(DeviceError::InvalidParams(_))
    ));
}

fn random_workload(seed: u64, n: u64, cap: u64) -> Vec<(u64, DevOp)> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut t = 0;
    (0..n)
        .map(|id| {
            t += rng.gen_range(0..2 * MS);
            let len = 4096 * rng.gen_range(1..16u64);
            let off = rng.gen_range(0..(cap - len) / 512) * 512;
            let op = match rng.gen_range(0..10) {
                0 => DevOp::flush(id),
                1..=4 => DevOp::write(id, off, len),
                _ => DevOp::read(id, off, len),
            };
            (t, op)
        })
        .collect()
}

#[test]
fn models_are_deterministic() {
    for &name in PRESET_NAMES {
        let spec: DeviceSpec = name.parse().unwrap();
        let go = || {
            let mut d = build(&spec, None).unwrap();
            let ops = random_workload(42, 300, d.capacity_bytes());
            (run(d.as_mut(), ops), d.stats())
        };
        let (a, sa) = go();
        let (b, sb) = go();
        assert_eq!(a.len(), 300, "{name}");
        assert_eq!(a, b, "{name}");
        assert_eq!(sa, sb, "{name}");
    }
}

#[test]
#[should_panic(expected = "time went backwards")]
fn time_must_not_go_backwards() {
    let mut d = hp();
    d.submit(10, DevOp::read(1, 0, 512));
    d.submit(5, DevOp::read(2, 0, 512));
}

#[test]
#[should_panic(expected = "already outstanding")]
fn ids_must_be_unique_among_outstanding() {
    let mut d = SolidStateModel::new(simple(1, US), None).unwrap();
    d.submit(0, DevOp::read(1, 0, 512));
    d.submit(0, DevOp::read(1, 512, 512));
}

#[test]
#[should_panic(expected = "beyond capacity")]
fn ops_must_fit_the_capacity() {
    let mut d = hp();
    let cap = d.capacity_bytes();
    d.submit(0, DevOp::read(1, cap - 512, 1024));
}

#[test]
#[should_panic(expected = "len 0")]
fn reads_must_have_a_length() {
    let mut d = hp();
    d.submit(0, DevOp::read(1, 0, 0));
}
