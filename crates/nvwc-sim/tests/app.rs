//! The application runtime's criticality mechanisms on toy models: process
//! criticality inheritance through a lock, cascading through a condition,
//! and I/O criticality inheritance (reissue) for a write a critical process
//! waits on. Each is checked against the policy without the mechanism.

use nvwc_core::ReqId;
use nvwc_sim::app::{run, AppConfig, CondId, Model, Pid, Policy, Rt, Step};
use nvwc_sim::device::DeviceSpec;

const MS: u64 = 1_000_000;

/// Scripted processes: each runs its list of steps once, then sleeps.
struct Toy {
    crit: Vec<bool>,
    scripts: Vec<Vec<Step>>,
    at: Vec<usize>,
    /// Process 1's async write, for `WaitIo` by others (`WaitIo(0)` in a
    /// script means "that write").
    shared: Option<ReqId>,
    signaller: Option<Pid>,
}

impl Model for Toy {
    fn processes(&self) -> Vec<(String, bool)> {
        self.crit
            .iter()
            .enumerate()
            .map(|(i, &c)| (format!("p-{i}"), c))
            .collect()
    }
    fn locks(&self) -> usize {
        1
    }
    fn conds(&self) -> usize {
        1
    }
    fn signaller(&self, _c: CondId) -> Option<Pid> {
        self.signaller
    }
    fn wal_ranges(&self) -> Vec<(u64, u64)> {
        Vec::new()
    }
    fn backing_bytes(&self) -> u64 {
        64 << 20
    }
    fn step(&mut self, rt: &mut Rt, p: Pid) -> Step {
        if p == 1 && self.shared.is_none() && self.at[1] > 0 {
            if let Some(Step::Write { wait: false, .. }) = self.scripts[1].get(self.at[1] - 1) {
                self.shared = Some(rt.last_req);
            }
        }
        let i = self.at[p];
        self.at[p] += 1;
        match self.scripts[p].get(i).copied() {
            Some(Step::WaitIo(0)) => Step::WaitIo(self.shared.expect("shared write issued")),
            Some(s) => s,
            None => Step::Compute(1_000_000 * MS),
        }
    }
}

fn w(wait: bool) -> Step {
    Step::Write {
        offset: 1 << 20,
        len: 4096,
        sync: true,
        wait,
        fua: false,
    }
}

/// The critical P0 of the lock tests: after 1 ms, a transaction that takes
/// and releases lock 0.
fn critical_locker() -> Vec<Step> {
    vec![
        Step::Compute(MS),
        Step::Begin,
        Step::Lock(0),
        Step::Unlock(0),
        Step::End(None),
    ]
}

fn go(
    policy: Policy,
    crit: Vec<bool>,
    scripts: Vec<Vec<Step>>,
    signaller: Option<Pid>,
) -> (u64, u64, f64) {
    let n = scripts.len();
    let mut m = Toy {
        crit,
        scripts,
        at: vec![0; n],
        shared: None,
        signaller,
    };
    let cfg = AppConfig {
        policy,
        cache_bytes: 16 << 20,
        cache_device: DeviceSpec::preset("nvdram").unwrap(),
        backing: DeviceSpec::preset("hdd-7200").unwrap(),
        duration_ns: 2000 * MS,
        warmup_ns: 0,
        seed: 1,
        timeline_ns: None,
    };
    let r = run("toy", &mut m, &cfg).unwrap();
    assert_eq!(r.requests, 1, "the critical request finished");
    (r.cached_write_bytes, r.reissued_writes, r.latency_ms_avg)
}

/// P1 takes the lock, then writes synchronously; critical P0 waits for the
/// lock meanwhile. With PI, P1 inherits criticality and its write is cached.
#[test]
fn process_inheritance_through_a_lock() {
    let scripts = || {
        vec![
            critical_locker(),
            vec![
                Step::Lock(0),
                Step::Compute(2 * MS),
                w(true),
                Step::Unlock(0),
            ],
        ]
    };
    let (cp, _, lat_cp) = go(Policy::Cp, vec![true, false], scripts(), None);
    let (pi, _, lat_pi) = go(Policy::CpPi, vec![true, false], scripts(), None);
    assert_eq!(cp, 0, "CP: the non-critical write bypasses");
    assert_eq!(pi, 4096, "CP+PI: the lock holder's write is cached");
    assert!(
        lat_pi < lat_cp,
        "inheritance shortens the wait: {lat_pi} vs {lat_cp} ms"
    );
}

/// Critical P0 waits for a lock held by P2, which waits on a condition P3
/// signals after a synchronous write: the chain is followed to P3.
#[test]
fn cascading_dependency_reaches_the_writer() {
    let scripts = || {
        vec![
            critical_locker(),
            vec![],
            vec![Step::Lock(0), Step::Wait(0), Step::Unlock(0)],
            vec![Step::Compute(2 * MS), w(true), Step::Signal(0)],
        ]
    };
    let crit = vec![true, false, false, false];
    let (cp, _, _) = go(Policy::Cp, crit.clone(), scripts(), Some(3));
    let (pi, _, _) = go(Policy::CpPi, crit, scripts(), Some(3));
    assert_eq!(cp, 0);
    assert_eq!(pi, 4096, "P3 inherited through P2 and its write was cached");
}

/// P1's asynchronous write is in flight to the backing store when critical
/// P0 must wait for it: CP+PI+IOI reissues it to the cache.
#[test]
fn io_inheritance_reissues_an_outstanding_write() {
    let scripts = || {
        vec![
            vec![
                Step::Compute(MS / 10),
                Step::Begin,
                Step::WaitIo(0),
                Step::End(None),
            ],
            vec![w(false)],
        ]
    };
    let (c0, r0, lat_pi) = go(Policy::CpPi, vec![true, false], scripts(), None);
    let (c1, r1, lat_ioi) = go(Policy::CpPiIoi, vec![true, false], scripts(), None);
    assert_eq!((c0, r0), (0, 0));
    assert_eq!((c1, r1), (4096, 1), "reissued to the cache");
    assert!(lat_ioi < lat_pi, "{lat_ioi} vs {lat_pi} ms");
}
