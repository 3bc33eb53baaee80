//! Disk arrays (RAID 0 and RAID 1) composed of member device models.
//!
//! The array forwards each command to its members at the time it is
//! submitted (no array-controller delay or cache) and completes it when the
//! last member command completes:
//! * RAID 0: READ/WRITE/TRIM are split at `stripe_bytes` boundaries; stripe
//!   unit `k` lives on member `k mod n` at member offset
//!   `(k div n) * stripe_bytes`. FLUSH goes to every member.
//! * RAID 1: a READ goes to the member with the fewest outstanding member
//!   commands (ties: lowest index); WRITE, TRIM and FLUSH go to every member.
//!
//! RAID 5/6 (read-modify-write of parity) is not modelled.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::spec::{build, DeviceSpec};
use super::stats::StatsRecorder;
use super::{
    advance_clock, check_op, exposed_capacity, DevOp, DevOpKind, DeviceError, DeviceModel,
    DeviceStats, HddParams, Nanos,
};

/// Array organisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "level", rename_all = "kebab-case")]
pub enum RaidLevel {
    /// Striping without redundancy.
    Raid0 {
        /// Stripe unit in bytes.
        stripe_bytes: u64,
    },
    /// Mirroring.
    Raid1,
}

/// Parameters of [`ArrayModel`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArrayParams {
    /// Model name.
    pub name: String,
    /// Organisation.
    pub raid: RaidLevel,
    /// Member devices (at least one).
    pub members: Vec<DeviceSpec>,
}

impl ArrayParams {
    /// RAID 1 of two modern 7200 rpm disks ([`HddParams::modern_7200`]): the
    /// organisation of the networked store in §5.1 of Koller et al.,
    /// "Write policies for host-side flash caches" (two 1 TB 7200 rpm disks
    /// there; the 4 TB preset geometry is used here, short-stroked to the
    /// requested capacity if one is given).
    pub fn raid1_7200() -> Self {
        ArrayParams {
            name: "raid1-7200".into(),
            raid: RaidLevel::Raid1,
            members: vec![
                DeviceSpec::Hdd(HddParams::modern_7200()),
                DeviceSpec::Hdd(HddParams::modern_7200()),
            ],
        }
    }
}

#[derive(Debug)]
struct Parent {
    op: DevOp,
    submitted: Nanos,
    remaining: usize,
}

/// Array model; see the [module documentation](self).
pub struct ArrayModel {
    p: ArrayParams,
    members: Vec<Box<dyn DeviceModel>>,
    /// Outstanding member commands per member.
    member_load: Vec<usize>,
    capacity: u64,
    parents: HashMap<u64, Parent, nvwc_mrc::MixBuildHasher>,
    /// Member command id -> (parent id, member index).
    children: HashMap<u64, (u64, usize), nvwc_mrc::MixBuildHasher>,
    next_child: u64,
    completed: VecDeque<(Nanos, u64)>,
    scratch: Vec<u64>,
    last_now: Nanos,
    stats: StatsRecorder,
}

impl ArrayModel {
    /// Build the array. `capacity_bytes` limits the exposed capacity (it may
    /// not exceed what the members provide).
    pub fn new(params: ArrayParams, capacity_bytes: Option<u64>) -> Result<Self, DeviceError> {
        if params.members.is_empty() {
            return Err(DeviceError::InvalidParams(format!(
                "{}: an array needs members",
                params.name
            )));
        }
        let n = params.members.len() as u64;
        // Ask the members only for what the array needs of each.
        let per_member = match (params.raid, capacity_bytes) {
            (_, None) => None,
            (RaidLevel::Raid1, Some(c)) => Some(c),
            (RaidLevel::Raid0 { stripe_bytes }, Some(c)) => {
                let units = c.div_ceil(stripe_bytes.max(1));
                Some(units.div_ceil(n) * stripe_bytes)
            }
        };
        let members = params
            .members
            .iter()
            .map(|m| build(m, per_member))
            .collect::<Result<Vec<_>, _>>()?;
        let min_cap = members
            .iter()
            .map(|m| m.capacity_bytes())
            .min()
            .expect("non-empty");
        let native = match params.raid {
            RaidLevel::Raid1 => min_cap,
            RaidLevel::Raid0 { stripe_bytes } => {
                if stripe_bytes == 0 {
                    return Err(DeviceError::InvalidParams(format!(
                        "{}: stripe_bytes must be > 0",
                        params.name
                    )));
                }
                (min_cap / stripe_bytes) * stripe_bytes * n
            }
        };
        let capacity = exposed_capacity(native, capacity_bytes)?;
        Ok(ArrayModel {
            member_load: vec![0; members.len()],
            members,
            capacity,
            p: params,
            parents: HashMap::default(),
            children: HashMap::default(),
            next_child: 0,
            completed: VecDeque::new(),
            scratch: Vec::new(),
            last_now: 0,
            stats: StatsRecorder::default(),
        })
    }

    /// Parameters in use.
    pub fn params(&self) -> &ArrayParams {
        &self.p
    }

    /// Statistics of member `i`.
    pub fn member_stats(&self, i: usize) -> DeviceStats {
        self.members[i].stats()
    }

    /// Member commands for `op`: (member, member op).
    fn fan_out(&self, op: &DevOp) -> Vec<(usize, DevOp)> {
        let n = self.members.len();
        let all = || (0..n).map(|m| (m, *op)).collect::<Vec<_>>();
        match (self.p.raid, op.kind) {
            (_, DevOpKind::Flush) => all(),
            (RaidLevel::Raid1, DevOpKind::Read) => {
                let m = (0..n)
                    .min_by_key(|&m| (self.member_load[m], m))
                    .expect("members");
                vec![(m, *op)]
            }
            (RaidLevel::Raid1, _) => all(),
            (RaidLevel::Raid0 { stripe_bytes: s }, _) => {
                let mut out: Vec<(usize, DevOp)> = Vec::new();
                let end = op.offset + op.len;
                let mut o = op.offset;
                while o < end {
                    let unit = o / s;
                    let next = ((unit + 1) * s).min(end);
                    let member = (unit % n as u64) as usize;
                    let moff = (unit / n as u64) * s + (o - unit * s);
                    // Merge with the previous piece on the same member when contiguous there.
                    match out.iter_mut().rev().find(|(m, _)| *m == member) {
                        Some((_, prev)) if prev.offset + prev.len == moff => prev.len += next - o,
                        _ => out.push((
                            member,
                            DevOp {
                                offset: moff,
                                len: next - o,
                                ..*op
                            },
                        )),
                    }
                    o = next;
                }
                if out.is_empty() {
                    // Zero-length TRIM: send to member 0 so it still completes.
                    out.push((
                        0,
                        DevOp {
                            offset: 0,
                            len: 0,
                            ..*op
                        },
                    ));
                }
                out
            }
        }
    }

    fn advance(&mut self, now: Nanos) {
        loop {
            let next = self
                .members
                .iter()
                .enumerate()
                .filter_map(|(i, m)| m.next_completion().map(|t| (t, i)))
                .min();
            let Some((t, i)) = next else { break };
            if t > now {
                break;
            }
            let mut ids = std::mem::take(&mut self.scratch);
            ids.clear();
            self.members[i].pop_completions(t, &mut ids);
            for &cid in &ids {
                let (pid, m) = self.children.remove(&cid).expect("known member command");
                self.member_load[m] -= 1;
                let p = self.parents.get_mut(&pid).expect("known parent");
                p.remaining -= 1;
                if p.remaining == 0 {
                    let p = self.parents.remove(&pid).expect("present");
                    self.stats.on_server(t, false);
                    self.stats
                        .on_complete(t, p.op.kind, p.op.len, p.submitted, p.submitted);
                    self.completed.push_back((t, pid));
                }
            }
            self.scratch = ids;
        }
    }
}

impl DeviceModel for ArrayModel {
    fn name(&self) -> &str {
        &self.p.name
    }

    fn submit(&mut self, now: Nanos, op: DevOp) {
        advance_clock(&self.p.name, &mut self.last_now, now);
        check_op(&op, self.capacity);
        self.advance(now);
        assert!(
            !self.parents.contains_key(&op.id),
            "{}: DevOp id {} is already outstanding",
            self.p.name,
            op.id
        );
        self.stats.on_submit(now);
        self.stats.on_server(now, true);
        let parts = self.fan_out(&op);
        self.parents.insert(
            op.id,
            Parent {
                op,
                submitted: now,
                remaining: parts.len(),
            },
        );
        for (m, mut child) in parts {
            let cid = self.next_child;
            self.next_child += 1;
            child.id = cid;
            self.children.insert(cid, (op.id, m));
            self.member_load[m] += 1;
            self.members[m].submit(now, child);
        }
    }

    fn next_completion(&self) -> Option<Nanos> {
        self.completed
            .front()
            .map(|&(t, _)| t)
            .into_iter()
            .chain(self.members.iter().filter_map(|m| m.next_completion()))
            .min()
    }

    fn pop_completions(&mut self, now: Nanos, out: &mut Vec<u64>) {
        advance_clock(&self.p.name, &mut self.last_now, now);
        self.advance(now);
        out.extend(self.completed.drain(..).map(|(_, id)| id));
    }

    fn capacity_bytes(&self) -> u64 {
        self.capacity
    }

    fn stats(&self) -> DeviceStats {
        self.stats.snapshot()
    }

    fn track_bytes(&self) -> Option<u64> {
        match self.p.raid {
            RaidLevel::Raid1 => self.members[0].track_bytes(),
            RaidLevel::Raid0 { .. } => None,
        }
    }
}
