//! Admission policies (request-oriented admission paper): which client writes
//! go to the cache device and which go straight to the backing store
//! (*bypass*). One file each, behind the narrow [`Admission`] trait.
//!
//! A policy only *classifies* a write. Whether a write the policy rejects may
//! really bypass is the engine's decision (see `docs/ARCHITECTURE.md`,
//! "Admission and bypass"): a bypass never weakens the write policy's
//! guarantee, so a rejected write that cannot bypass safely is cached like
//! any other.
//!
//! Process-level criticality (the paper's §4.2.1 inheritance across locks)
//! is the driver's business: a block device sees no processes, so the
//! simulator's application model and the server's hints compute
//! [`Tag::critical`](crate::types::Tag) before the request reaches the engine.
//! That is why `critical` and `critical+pi` behave alike in the engine; they
//! differ in how their driver sets the tag. I/O criticality inheritance
//! (§4.2.2) does live in the engine: see [`Admission::reissue`].

use crate::config::AdmissionKind;
use crate::types::Tag;

pub mod all;
pub mod critical;
pub mod sync;
pub mod wal;

/// What a policy sees of a write.
#[derive(Clone, Copy, Debug)]
pub struct WriteInfo {
    pub offset: u64,
    pub len: u64,
    pub fua: bool,
    pub tag: Tag,
}

/// An admission policy. See the module docs.
pub trait Admission: Send {
    /// The configuration name.
    fn kind(&self) -> AdmissionKind;
    /// Should this write be cached? `false` asks for a bypass.
    fn admit(&self, w: &WriteInfo) -> bool;
    /// I/O criticality inheritance (§4.2.2): when a critical request must wait
    /// for a bypassed write still in flight to the backing store, reissue that
    /// write to the cache device and complete it from there.
    fn reissue(&self) -> bool {
        false
    }
}

/// Build the policy for a configuration.
pub fn build(kind: AdmissionKind, wal_ranges: &[(u64, u64)]) -> Box<dyn Admission> {
    match kind {
        AdmissionKind::All => Box::new(all::All),
        AdmissionKind::Sync => Box::new(sync::Sync),
        AdmissionKind::Wal => Box::new(wal::Wal::new(wal_ranges)),
        AdmissionKind::Critical | AdmissionKind::CriticalPi | AdmissionKind::CriticalPiIoi => {
            Box::new(critical::Critical::new(kind))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(offset: u64, len: u64, fua: bool, critical: bool, sync: bool) -> WriteInfo {
        WriteInfo {
            offset,
            len,
            fua,
            tag: Tag {
                client: 0,
                critical,
                sync,
            },
        }
    }

    #[test]
    fn each_policy_classifies_by_its_rule() {
        let ranges = [(1 << 20, 1 << 20)];
        let plain = w(0, 4096, false, false, false);
        let fua = w(0, 4096, true, false, false);
        let sync = w(0, 4096, false, false, true);
        let crit = w(0, 4096, false, true, false);
        let log = w((1 << 20) + 4096, 4096, false, false, false);
        let straddle = w((2 << 20) - 512, 4096, false, false, false);
        let cases: [(AdmissionKind, [bool; 6]); 6] = [
            (AdmissionKind::All, [true; 6]),
            (
                AdmissionKind::Sync,
                [false, true, true, false, false, false],
            ),
            (AdmissionKind::Wal, [false, false, false, false, true, true]),
            (
                AdmissionKind::Critical,
                [false, false, false, true, false, false],
            ),
            (
                AdmissionKind::CriticalPi,
                [false, false, false, true, false, false],
            ),
            (
                AdmissionKind::CriticalPiIoi,
                [false, false, false, true, false, false],
            ),
        ];
        for (kind, want) in cases {
            let p = build(kind, &ranges);
            assert_eq!(p.kind(), kind);
            let got = [&plain, &fua, &sync, &crit, &log, &straddle].map(|x| p.admit(x));
            assert_eq!(got, want, "{kind}");
            assert_eq!(p.reissue(), kind == AdmissionKind::CriticalPiIoi, "{kind}");
        }
    }
}
