//! `sync`: cache synchronous writes only: FUA writes, and writes the driver
//! tags as issued on behalf of a sync operation (`Tag::sync`: the simulator's
//! fsync and O_SYNC writes, which the paper's SYNC baseline admits).
//!
//! A bypassed write reaches the backing store with FUA before it is
//! acknowledged, so no FLUSH ever waits for one (see ARCHITECTURE.md): the
//! "writes a pending flush waits on" are exactly the tagged ones.

use super::{Admission, WriteInfo};
use crate::config::AdmissionKind;

pub struct Sync;

impl Admission for Sync {
    fn kind(&self) -> AdmissionKind {
        AdmissionKind::Sync
    }
    fn admit(&self, w: &WriteInfo) -> bool {
        w.fua || w.tag.sync
    }
}
