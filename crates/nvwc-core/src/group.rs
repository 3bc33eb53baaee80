//! The one atomic-group stager: the writes the engine tags with a group
//! (a journaled checkpoint) are held here from the group's `GroupBegin` to
//! its `GroupEnd`, and then handed back, in the order they were staged, to
//! whatever makes them atomic (the device layer's redo-log filter, which
//! re-exports this module as `nvwc_dev::group`; the testkit's backing
//! store). It is pure logic, so it lives with the engine whose group
//! commands it serves.
//!
//! Contract:
//!
//! - a caller MUST [`GroupStager::begin`] a group before staging a write to
//!   it ([`GroupStager::stage`] asserts it), and MUST stage every write of
//!   the group before its end;
//! - [`GroupStager::end`] hands the writes back in staging order and
//!   forgets the group; ending a group that never began (or was ended
//!   already) hands back nothing;
//! - a group may be abandoned (its plan failed before its end): its writes
//!   stay until the same id begins again, which MUST discard them, because
//!   the engine retries a failed checkpoint under the same id
//!   (`write_policy/journaled.rs` names a group by its last transaction).

use std::collections::HashMap;

use bytes::Bytes;

/// Writes staged by group id (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct GroupStager {
    groups: HashMap<u64, Vec<(u64, Bytes)>>,
}

impl GroupStager {
    pub fn new() -> GroupStager {
        GroupStager::default()
    }

    /// Open group `g`, empty: writes an abandoned earlier group of this id
    /// staged are dropped.
    pub fn begin(&mut self, g: u64) {
        self.groups.insert(g, Vec::new());
    }

    /// Stage a write of group `g`, which MUST be open.
    pub fn stage(&mut self, g: u64, offset: u64, data: Bytes) {
        let Some(ws) = self.groups.get_mut(&g) else {
            panic!("write staged to group {g}, which never began");
        };
        ws.push((offset, data));
    }

    /// The writes staged to `g` so far, in order (empty if `g` is not open):
    /// what a crash during its end may apply.
    pub fn staged(&self, g: u64) -> &[(u64, Bytes)] {
        self.groups.get(&g).map_or(&[], |v| v.as_slice())
    }

    /// End group `g`: its writes, in staging order; the group is forgotten.
    pub fn end(&mut self, g: u64) -> Vec<(u64, Bytes)> {
        self.groups.remove(&g).unwrap_or_default()
    }

    /// Groups open now (begun, not ended).
    pub fn open(&self) -> usize {
        self.groups.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(v: u8) -> Bytes {
        Bytes::from(vec![v; 4])
    }

    #[test]
    fn groups_hand_back_their_own_writes_in_order() {
        let mut s = GroupStager::new();
        s.begin(1);
        s.begin(2);
        s.stage(1, 4096, b(1));
        s.stage(2, 0, b(9));
        s.stage(1, 0, b(2));
        s.stage(1, 4096, b(3));
        assert_eq!(s.staged(1).len(), 3);
        assert_eq!(s.open(), 2);
        assert_eq!(s.end(1), vec![(4096, b(1)), (0, b(2)), (4096, b(3))]);
        assert_eq!(s.end(1), vec![], "ended once");
        assert!(s.staged(1).is_empty());
        assert_eq!(s.end(2), vec![(0, b(9))]);
        assert_eq!(s.open(), 0);
    }

    #[test]
    fn beginning_again_drops_an_abandoned_group() {
        let mut s = GroupStager::new();
        s.begin(7);
        s.stage(7, 0, b(1));
        // The plan failed before its end; the checkpoint is retried as 7.
        s.begin(7);
        s.stage(7, 512, b(2));
        assert_eq!(s.end(7), vec![(512, b(2))]);
    }

    #[test]
    #[should_panic(expected = "never began")]
    fn staging_to_a_group_that_never_began_panics() {
        let mut s = GroupStager::new();
        s.stage(3, 0, b(1));
    }
}
