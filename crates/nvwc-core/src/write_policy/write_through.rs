//! Write-through (write-policy paper, Table 2 "WT"): the backing store is
//! written before the reply; the cache holds clean copies only, so losing it
//! loses nothing.

use super::{Plan, PlanCtx, RecoveredVersion, WritePolicy};
use crate::config::WritePolicyKind;
use crate::layout::CommitRecord;

/// See the module docs.
pub struct WriteThrough;

impl WritePolicy for WriteThrough {
    fn kind(&self) -> WritePolicyKind {
        WritePolicyKind::WriteThrough
    }
    fn synchronous_backing(&self) -> bool {
        true
    }
    fn on_write_issue(&mut self, _now: u64, _seq: u64) -> u64 {
        0
    }
    fn next_plan(&mut self, _ctx: &mut dyn PlanCtx) -> Option<Plan> {
        None
    }
    /// Clean copies survive only a clean shutdown: after a crash the backing
    /// store may hold writes newer than a committed clean copy (the reply went
    /// out when the backing write completed, before the cache metadata commit),
    /// so every version is discarded and the cache restarts cold.
    fn recover(&mut self, rec: &CommitRecord, versions: &mut [RecoveredVersion]) {
        for v in versions.iter_mut() {
            v.clean = true;
            v.discard = !rec.clean_shutdown || !v.latest;
        }
    }
}
