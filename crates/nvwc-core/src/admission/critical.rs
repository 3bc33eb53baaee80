//! The three criticality policies, one engine rule: admit cache writes whose
//! request tag says critical (a request waits on them). The tag comes from
//! the driver: the server's per-export and per-connection hints, or the
//! simulator's critical processes.
//!
//! - `critical`: the rule alone.
//! - `critical+pi`: with process criticality inheritance (§4.2.1).
//!   Inheritance happens where processes and locks are visible: the
//!   simulator's application model marks a process critical while a
//!   critical process waits on a lock it holds, so its writes arrive tagged
//!   critical. The engine rule is the same as `critical`'s.
//! - `critical+pi+ioi`: `critical+pi` plus I/O criticality inheritance
//!   (§4.2.2): a critical request that waits for a bypassed write still in
//!   flight to the backing store has that write reissued to the cache device;
//!   the write completes from the reissue and the original completion is
//!   discarded (the engine keeps the block from being destaged until it
//!   arrives, so the stale backing write can never land over newer data).

use super::{Admission, WriteInfo};
use crate::config::AdmissionKind;

/// `critical`, `critical+pi` or `critical+pi+ioi` (the kind it reports).
pub struct Critical {
    kind: AdmissionKind,
}

impl Critical {
    /// `kind` MUST be one of the three criticality kinds.
    pub fn new(kind: AdmissionKind) -> Critical {
        assert!(
            matches!(
                kind,
                AdmissionKind::Critical | AdmissionKind::CriticalPi | AdmissionKind::CriticalPiIoi
            ),
            "{kind:?} is not a criticality policy"
        );
        Critical { kind }
    }
}

impl Admission for Critical {
    fn kind(&self) -> AdmissionKind {
        self.kind
    }
    fn admit(&self, w: &WriteInfo) -> bool {
        w.tag.critical
    }
    fn reissue(&self) -> bool {
        self.kind == AdmissionKind::CriticalPiIoi
    }
}
