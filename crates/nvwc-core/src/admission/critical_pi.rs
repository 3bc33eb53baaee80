//! `critical+pi`: `critical` with process criticality inheritance (§4.2.1).
//! Inheritance happens where processes and locks are visible: the simulator's
//! application model marks a process critical while a critical process waits
//! on a lock it holds, so its writes arrive tagged critical. The engine rule
//! is the same as `critical`'s.

use super::{Admission, WriteInfo};
use crate::config::AdmissionKind;

pub struct CriticalPi;

impl Admission for CriticalPi {
    fn kind(&self) -> AdmissionKind {
        AdmissionKind::CriticalPi
    }
    fn admit(&self, w: &WriteInfo) -> bool {
        w.tag.critical
    }
}
