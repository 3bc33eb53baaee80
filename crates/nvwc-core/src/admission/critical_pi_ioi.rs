//! `critical+pi+ioi`: `critical+pi` plus I/O criticality inheritance
//! (§4.2.2): a critical request that waits for a bypassed write still in
//! flight to the backing store has that write reissued to the cache device;
//! the write completes from the reissue and the original completion is
//! discarded (the engine keeps the block from being destaged until it
//! arrives, so the stale backing write can never land over newer data).

use super::{Admission, WriteInfo};
use crate::config::AdmissionKind;

pub struct CriticalPiIoi;

impl Admission for CriticalPiIoi {
    fn kind(&self) -> AdmissionKind {
        AdmissionKind::CriticalPiIoi
    }
    fn admit(&self, w: &WriteInfo) -> bool {
        w.tag.critical
    }
    fn reissue(&self) -> bool {
        true
    }
}
