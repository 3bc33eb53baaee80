//! The VOPR's disk: the in-memory twin (`nvwc-dev/src/mem.rs`: a volatile
//! write cache, crashes, torn sectors) under the atomic-group filter
//! (`nvwc-dev/src/redo.rs`), the stack the server puts on a backing file.
//! A journaled checkpoint's `GroupEnd` therefore runs the server's redo-log
//! code: log the group, write it in place, flush, clear the log. It
//! completes in one step of the simulation, so a crash never falls inside
//! it; a crash while a `GroupEnd` is in flight applies the group whole or
//! not at all ([`MemDisk::crash`]), which is what the redo log guarantees.
//!
//! This module only maps the engine's commands onto that stack.

use std::cell::{Ref, RefCell};

use bytes::Bytes;
use nvwc_core::{layout, IoError, IoOp, IoResult};
use nvwc_dev::block::BlockDevice;
use nvwc_dev::mem::MemDisk;
use nvwc_dev::redo::{Atomic, LogStore, MemLog, Redo};
use rand::Rng;

pub use nvwc_dev::mem::SECTOR;

/// See the module docs.
pub struct Disk {
    dev: Atomic<RefCell<MemDisk>, MemLog>,
}

fn eio(_: std::io::Error) -> IoError {
    IoError::Eio
}

impl Disk {
    pub fn new(image: Vec<u8>) -> Self {
        Disk {
            dev: Atomic::new(
                RefCell::new(MemDisk::new(image)),
                Redo::new(MemLog::default()),
            ),
        }
    }

    fn twin(&self) -> Ref<'_, MemDisk> {
        self.dev.inner().borrow()
    }

    pub fn len(&self) -> u64 {
        self.twin().len()
    }

    pub fn is_empty(&self) -> bool {
        self.twin().is_empty()
    }

    /// Run a device command that completes now. `flush_stamp`: for a FLUSH,
    /// [`Disk::flush_issue_stamp`] when it was issued (writes completed
    /// before then become durable).
    pub fn execute(
        &mut self,
        op: &IoOp<Bytes>,
        group: Option<u64>,
        flush_stamp: u64,
    ) -> IoResult<Bytes> {
        match op {
            IoOp::Read { offset, len } => {
                return Ok(Some(Bytes::from(self.twin().read(*offset, *len as usize))))
            }
            IoOp::Checksum { offset, len } => {
                let crc = layout::data_crc(&self.twin().read(*offset, *len as usize));
                return Ok(Some(Bytes::copy_from_slice(&crc.to_le_bytes())));
            }
            IoOp::Write { offset, data, fua } => match group {
                Some(g) => self
                    .dev
                    .group_write(g, *offset, data.clone())
                    .map_err(eio)?,
                None => self.dev.write(*offset, &[data], *fua).map_err(eio)?,
            },
            // A FLUSH covers what completed before its issue, not before now.
            IoOp::Flush => self.dev.inner().borrow_mut().flush(flush_stamp),
            IoOp::Trim { offset, len } => self.dev.trim(*offset, u64::from(*len)).map_err(eio)?,
            IoOp::GroupBegin { group } => self.dev.group_begin(*group).map_err(eio)?,
            IoOp::GroupEnd { group } => self.dev.group_end(*group).map_err(eio)?,
        }
        Ok(None)
    }

    /// Completion stamp to pass to [`Disk::execute`] for a flush issued now.
    pub fn flush_issue_stamp(&self) -> u64 {
        self.twin().flush_issue_stamp()
    }

    /// What a reader sees now: every completed write.
    pub fn visible(&self) -> Ref<'_, [u8]> {
        Ref::map(self.twin(), |d| d.visible())
    }

    /// [`MemDisk::host_lost`], then the redo log replayed (as the server
    /// does when it opens the backing store, [`Disk::replayed`]).
    pub fn host_lost(&self, rng: &mut impl Rng, in_flight: &[(u64, Vec<u8>)]) -> Vec<u8> {
        self.replayed(self.twin().host_lost(rng, in_flight))
    }

    /// `img` with the group the redo log still holds written over it, as
    /// `nvwc serve` replays it on open. The log keeps the last group after
    /// its end (`nvwc-dev/src/redo.rs`: two syncs a group), so this
    /// rewrites bytes the image holds already, unless a write outside a
    /// group changed them without clearing the log first (`Redo::settle`):
    /// replay would then undo that write, and the checks see it.
    fn replayed(&self, mut img: Vec<u8>) -> Vec<u8> {
        if let Ok(Some(group)) = self.dev.redo().log().get() {
            for (off, d) in group {
                img[off as usize..off as usize + d.len()].copy_from_slice(&d);
            }
        }
        img
    }

    /// What survives a power loss now, given writes still in flight.
    /// `ends_in_flight`: groups whose `GroupEnd` was issued but not completed.
    pub fn crash(
        &self,
        rng: &mut impl Rng,
        in_flight: &[(u64, Vec<u8>)],
        ends_in_flight: &[u64],
    ) -> Vec<u8> {
        let ends: Vec<Vec<(u64, Bytes)>> =
            ends_in_flight.iter().map(|g| self.dev.staged(*g)).collect();
        let img = self.twin().crash(rng, in_flight, &ends);
        if ends.is_empty() {
            self.replayed(img)
        } else {
            // A group end in flight: the twin keeps it whole or drops it, as
            // the server's log would (replaced by it, or not yet); the log
            // here still holds the group before it, which the server would
            // replay before, not after, so it is left out.
            img
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn write(offset: u64, v: u8) -> IoOp<Bytes> {
        IoOp::Write {
            offset,
            data: Bytes::from(vec![v; SECTOR]),
            fua: false,
        }
    }

    /// A group's writes are invisible until its end, which commits them
    /// through the redo log (which keeps them) to the twin: visible and durable.
    /// While the end is in flight, a crash keeps the group whole or drops it.
    #[test]
    fn a_group_end_commits_through_the_redo_log() {
        let mut d = Disk::new(vec![0; 8 * SECTOR]);
        d.execute(&IoOp::GroupBegin { group: 4 }, Some(4), 0)
            .unwrap();
        d.execute(&write(0, 1), Some(4), 0).unwrap();
        d.execute(&write(2 * SECTOR as u64, 2), Some(4), 0).unwrap();
        assert_eq!(d.visible()[0], 0, "staged, not visible");
        let mut outcomes = std::collections::HashSet::new();
        for seed in 0..16 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let img = d.crash(&mut rng, &[], &[4]);
            assert_eq!(img[0] == 1, img[2 * SECTOR] == 2, "whole or nothing");
            outcomes.insert(img[0]);
        }
        assert_eq!(outcomes.len(), 2);
        d.execute(&IoOp::GroupEnd { group: 4 }, Some(4), 0).unwrap();
        assert!(
            !d.dev.redo().log().bytes().is_empty(),
            "the log keeps the group"
        );
        assert_eq!((d.visible()[0], d.visible()[2 * SECTOR]), (1, 2));
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        let img = d.crash(&mut rng, &[], &[]);
        assert_eq!((img[0], img[2 * SECTOR]), (1, 2), "durable at its end");
    }
}
