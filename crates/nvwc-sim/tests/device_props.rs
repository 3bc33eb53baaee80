//! Property tests of the device-model contract: with any command stream and
//! any driver interleaving, every command completes exactly once, never
//! before it was submitted, completions come out in non-decreasing time, the
//! statistics add up, and runs are reproducible.

use std::collections::HashMap;

use nvwc_sim::device::{
    build, ArrayParams, DevOp, DevOpKind, DeviceModel, DeviceSpec, DiskScheduler, HddParams,
    NetParams, RaidLevel, SolidStateParams, WriteBufferParams, PRESET_NAMES,
};
use proptest::prelude::*;

/// Device specs under test: the presets plus variants that exercise write
/// caches, schedulers and a network in front of a disk with a write cache.
fn specs() -> Vec<DeviceSpec> {
    // Every preset once (aliases name the same model).
    let mut v: Vec<DeviceSpec> = Vec::new();
    for name in PRESET_NAMES {
        let spec: DeviceSpec = name.parse().unwrap();
        if !v.contains(&spec) {
            v.push(spec);
        }
    }
    let mut hp = HddParams::hp97560();
    hp.write_cache_bytes = 64 * 1024;
    hp.scheduler = DiskScheduler::Sstf;
    v.push(DeviceSpec::Hdd(hp.clone()));
    hp.scheduler = DiskScheduler::CLook;
    hp.destage_idle_only = true;
    v.push(DeviceSpec::Hdd(hp.clone()));
    let mut ssd = SolidStateParams::ssd_nvme();
    ssd.parallel_units = 3;
    ssd.write_buffer = Some(WriteBufferParams {
        bytes: 48 * 1024,
        ack_ns: 10_000,
        volatile: true,
    });
    ssd.flush_ns = 7_000;
    v.push(DeviceSpec::SolidState(ssd));
    v.push("hdd-raid1".parse().unwrap());
    v.push(DeviceSpec::Array(ArrayParams {
        name: "raid0-mixed".into(),
        raid: RaidLevel::Raid0 { stripe_bytes: 8192 },
        members: vec![
            "ssd-revodrive".parse().unwrap(),
            "hdd-hp97560".parse().unwrap(),
            "ssd-nvme".parse().unwrap(),
        ],
    }));
    v.push(DeviceSpec::Net(NetParams {
        name: "net-cached-disk".into(),
        rtt_ns: 50_000,
        bandwidth_bytes_per_sec: 50_000_000,
        max_outstanding: 3,
        backend: Box::new(DeviceSpec::Hdd(hp)),
    }));
    v
}

#[derive(Clone, Debug)]
struct Cmd {
    gap_ns: u64,
    kind: u8,
    offset_frac: u32,
    sectors: u64,
    fua: bool,
}

fn cmd() -> impl Strategy<Value = Cmd> {
    (
        prop_oneof![Just(0u64), 0u64..50_000, 0u64..20_000_000],
        0u8..10,
        any::<u32>(),
        1u64..300,
        any::<bool>(),
    )
        .prop_map(|(gap_ns, kind, offset_frac, sectors, fua)| Cmd {
            gap_ns,
            kind,
            offset_frac,
            sectors,
            fua,
        })
}

fn to_ops(cmds: &[Cmd], capacity: u64) -> Vec<(u64, DevOp)> {
    let mut t = 0;
    cmds.iter()
        .enumerate()
        .map(|(i, c)| {
            t += c.gap_ns;
            let len = (c.sectors * 512).min(capacity);
            let max_off = (capacity - len) / 512;
            let offset = (max_off as u128 * c.offset_frac as u128 / u32::MAX as u128) as u64 * 512;
            let kind = match c.kind {
                0 => DevOpKind::Flush,
                1 => DevOpKind::Trim,
                2..=5 => DevOpKind::Write,
                _ => DevOpKind::Read,
            };
            let op = DevOp {
                id: 1000 + i as u64 * 7,
                kind,
                offset,
                len,
                fua: c.fua,
            };
            (t, op)
        })
        .collect()
}

/// Drive `dev`; `lazy[i]` makes the driver skip popping before the i-th
/// submission (so the model must catch up inside `submit`), and pops happen
/// at `next_completion` or, when lazy, at the next submission time.
/// Returns (id, pop time) in pop order and the submission times. With an
/// eager driver (no `lazy` entry set) pop times are exact completion times.
fn drive(
    dev: &mut dyn DeviceModel,
    ops: &[(u64, DevOp)],
    lazy: &[bool],
) -> (Vec<(u64, u64)>, HashMap<u64, u64>) {
    let eager = lazy.iter().all(|&l| !l);
    let mut out = Vec::new();
    let mut buf = Vec::new();
    let mut submitted = HashMap::new();
    let mut now = 0;
    // Pop every completion the model reports at or before `limit`.
    let mut pop_until =
        |dev: &mut dyn DeviceModel, now: &mut u64, limit: u64, out: &mut Vec<(u64, u64)>| {
            while let Some(c) = dev.next_completion() {
                if c > limit {
                    break;
                }
                // After lazy submissions, completions before the current time
                // may still be waiting to be popped: pop them now.
                assert!(
                    c >= *now || !eager,
                    "next_completion {c} before current time {now}"
                );
                *now = (*now).max(c);
                buf.clear();
                dev.pop_completions(*now, &mut buf);
                out.extend(buf.iter().map(|&id| (id, *now)));
            }
        };
    for (i, &(t, op)) in ops.iter().enumerate() {
        if !lazy[i % lazy.len()] {
            pop_until(dev, &mut now, t, &mut out);
        }
        now = t;
        dev.submit(t, op);
        submitted.insert(op.id, t);
    }
    pop_until(dev, &mut now, u64::MAX, &mut out);
    (out, submitted)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn every_op_completes_once_and_never_early(
        cmds in prop::collection::vec(cmd(), 1..60),
        lazy in prop::collection::vec(any::<bool>(), 1..8),
        which in 0usize..64,
    ) {
        let all = specs();
        let spec = &all[which % all.len()];
        let mut dev = build(spec, None).unwrap();
        let ops = to_ops(&cmds, dev.capacity_bytes());
        let (done, submitted) = drive(dev.as_mut(), &ops, &lazy);

        let mut seen = HashMap::new();
        for &(id, t) in &done {
            prop_assert!(seen.insert(id, t).is_none(), "{}: id {} completed twice", spec.name(), id);
            let s = submitted[&id];
            prop_assert!(t >= s, "{}: id {} popped at {} before submission at {}", spec.name(), id, t, s);
        }
        prop_assert_eq!(seen.len(), ops.len(), "{}: not every op completed", spec.name());
        prop_assert!(done.windows(2).all(|w| w[0].1 <= w[1].1));

        let st = dev.stats();
        prop_assert_eq!(st.completed(), ops.len() as u64);
        prop_assert_eq!(st.submitted, ops.len() as u64);
        let count = |k: DevOpKind| ops.iter().filter(|(_, o)| o.kind == k).count() as u64;
        prop_assert_eq!(st.read.ops, count(DevOpKind::Read));
        prop_assert_eq!(st.write.ops, count(DevOpKind::Write));
        prop_assert_eq!(st.flush.ops, count(DevOpKind::Flush));
        prop_assert_eq!(st.trim.ops, count(DevOpKind::Trim));
        prop_assert!(st.busy_ns <= st.elapsed_ns);
        prop_assert_eq!(st.qd_time_ns.iter().sum::<u64>(), st.elapsed_ns);
        prop_assert!(st.max_queue_depth as usize <= ops.len());

        // Reproducible: the same stream gives the same completions.
        let mut again = build(spec, None).unwrap();
        let (done2, _) = drive(again.as_mut(), &ops, &lazy);
        prop_assert_eq!(&done, &done2);
    }

    #[test]
    fn driver_laziness_does_not_change_completion_times(
        cmds in prop::collection::vec(cmd(), 1..40),
        which in 0usize..64,
    ) {
        // Completion times must not depend on whether the driver popped
        // eagerly or only caught up at submissions (causality of the lazy
        // advance). Pop times differ, so compare with an eager driver whose
        // pops happen exactly at the completion times.
        let all = specs();
        let spec = &all[which % all.len()];
        let mut eager = build(spec, None).unwrap();
        let ops = to_ops(&cmds, eager.capacity_bytes());
        let (a, _) = drive(eager.as_mut(), &ops, &[false]);
        let mut lazy = build(spec, None).unwrap();
        let (b, _) = drive(lazy.as_mut(), &ops, &[true]);
        let ids = |v: &[(u64, u64)]| { let mut x: Vec<u64> = v.iter().map(|p| p.0).collect(); x.sort(); x };
        prop_assert_eq!(ids(&a), ids(&b));
        prop_assert_eq!(eager.stats(), lazy.stats());
    }
}
