//! `critical`: cache writes whose request tag says critical (a request waits
//! on them). The tag comes from the driver: the server's per-export and
//! per-connection hints, or the simulator's critical processes.

use super::{Admission, WriteInfo};
use crate::config::AdmissionKind;

pub struct Critical;

impl Admission for Critical {
    fn kind(&self) -> AdmissionKind {
        AdmissionKind::Critical
    }
    fn admit(&self, w: &WriteInfo) -> bool {
        w.tag.critical
    }
}
