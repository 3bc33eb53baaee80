//! `all`: cache every write (the baseline).

use super::{Admission, WriteInfo};
use crate::config::AdmissionKind;

pub struct All;

impl Admission for All {
    fn kind(&self) -> AdmissionKind {
        AdmissionKind::All
    }
    fn admit(&self, _w: &WriteInfo) -> bool {
        true
    }
}
