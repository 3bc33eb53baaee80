//! An in-memory block device with a volatile write cache, atomic groups and crashes.
//!
//! * A completed write is visible to reads but not durable until a FLUSH that
//!   was issued after it completes, or unless it was written with FUA.
//! * Writes tagged with a group are staged: invisible and not durable until the
//!   group's `GroupEnd` completes, which makes them visible and durable at once
//!   (the write-policy paper's storage-side journal, §3.2.2).
//! * [`Disk::crash`] returns what survives: the durable image plus, for every
//!   write not yet durable, independently: nothing, all of it, or a random
//!   subset of its 512-byte sectors (torn).

use bytes::Bytes;
use nvwc_core::{layout, IoOp, IoResult};
use nvwc_dev::group::GroupStager;
use rand::Rng;

pub const SECTOR: usize = 512;

#[derive(Clone, Debug)]
struct Pending {
    offset: u64,
    data: Vec<u8>,
    /// Completion order stamp.
    done_at: u64,
}

/// See the module docs.
#[derive(Clone, Debug)]
pub struct Disk {
    pub visible: Vec<u8>,
    pub durable: Vec<u8>,
    unflushed: Vec<Pending>,
    groups: GroupStager,
    clock: u64,
}

impl Disk {
    pub fn new(image: Vec<u8>) -> Self {
        Disk {
            durable: image.clone(),
            visible: image,
            unflushed: Vec::new(),
            groups: GroupStager::new(),
            clock: 0,
        }
    }

    pub fn len(&self) -> u64 {
        self.visible.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.visible.is_empty()
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
                return Ok(Some(Bytes::from(self.read(*offset, *len as usize))))
            }
            IoOp::Checksum { offset, len } => {
                let crc = layout::data_crc(&self.read(*offset, *len as usize));
                return Ok(Some(Bytes::copy_from_slice(&crc.to_le_bytes())));
            }
            IoOp::Write { offset, data, fua } => match group {
                Some(g) => self.groups.stage(g, *offset, data.clone()),
                None => self.write(*offset, data, *fua),
            },
            IoOp::Flush => self.flush(flush_stamp),
            IoOp::Trim { .. } => {}
            IoOp::GroupBegin { group } => self.group_begin(*group),
            IoOp::GroupEnd { group } => self.group_end(*group),
        }
        Ok(None)
    }

    pub fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        self.visible[offset as usize..offset as usize + len].to_vec()
    }

    /// A write outside a group completes (it was issued earlier; its data
    /// lands now).
    pub fn write(&mut self, offset: u64, data: &[u8], fua: bool) {
        let o = offset as usize;
        self.visible[o..o + data.len()].copy_from_slice(data);
        self.clock += 1;
        if fua {
            self.durable[o..o + data.len()].copy_from_slice(data);
            // Older unflushed writes to the same range must not resurrect at a crash.
            for p in &mut self.unflushed {
                let (a, b) = (p.offset as usize, p.offset as usize + p.data.len());
                let (x, y) = (a.max(o), b.min(o + data.len()));
                if x < y {
                    p.data[x - a..y - a].copy_from_slice(&data[x - o..y - o]);
                }
            }
        } else {
            self.unflushed.push(Pending {
                offset,
                data: data.to_vec(),
                done_at: self.clock,
            });
        }
    }

    /// Completion stamp to pass to [`Disk::flush`] for a flush issued now.
    pub fn flush_issue_stamp(&self) -> u64 {
        self.clock
    }

    /// A flush issued when the stamp was `issued_at` completes.
    pub fn flush(&mut self, issued_at: u64) {
        let (done, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.unflushed)
            .into_iter()
            .partition(|p| p.done_at <= issued_at);
        for p in done {
            let o = p.offset as usize;
            self.durable[o..o + p.data.len()].copy_from_slice(&p.data);
        }
        self.unflushed = keep;
    }

    pub fn group_begin(&mut self, g: u64) {
        self.groups.begin(g);
    }

    /// The group becomes visible and durable atomically.
    pub fn group_end(&mut self, g: u64) {
        for (off, d) in self.groups.end(g) {
            let o = off as usize;
            self.visible[o..o + d.len()].copy_from_slice(&d);
            self.durable[o..o + d.len()].copy_from_slice(&d);
            for p in &mut self.unflushed {
                let (a, b) = (p.offset as usize, p.offset as usize + p.data.len());
                let (x, y) = (a.max(o), b.min(o + d.len()));
                if x < y {
                    p.data[x - a..y - a].copy_from_slice(&d[x - o..y - o]);
                }
            }
        }
    }

    /// What a reader sees now: every completed write.
    pub fn visible(&self) -> &[u8] {
        &self.visible
    }

    /// The state a surviving device shows after its host died: every completed
    /// write, plus any subset (possibly torn) of the writes still in flight.
    pub fn host_lost(&self, rng: &mut impl Rng, in_flight: &[(u64, Vec<u8>)]) -> Vec<u8> {
        let mut img = self.visible.clone();
        for (off, d) in in_flight {
            let mode = rng.gen_range(0..3);
            for (i, chunk) in d.chunks(SECTOR).enumerate() {
                if mode == 1 || (mode == 2 && rng.gen_bool(0.5)) {
                    let at = *off as usize + i * SECTOR;
                    img[at..at + chunk.len()].copy_from_slice(chunk);
                }
            }
        }
        img
    }

    /// What survives a power loss now, given writes still in flight.
    /// `ends_in_flight`: groups whose `GroupEnd` was issued but not completed;
    /// each is applied whole or not at all.
    pub fn crash(
        &self,
        rng: &mut impl Rng,
        in_flight: &[(u64, Vec<u8>)],
        ends_in_flight: &[u64],
    ) -> Vec<u8> {
        let mut img = self.durable.clone();
        for g in ends_in_flight {
            if rng.gen_bool(0.5) {
                for (off, d) in self.groups.staged(*g) {
                    let o = *off as usize;
                    img[o..o + d.len()].copy_from_slice(d);
                }
            }
        }
        let mut apply = |off: u64, data: &[u8], rng: &mut dyn rand::RngCore| {
            let mode = rng.gen_range(0..3);
            if mode == 0 {
                return;
            }
            let o = off as usize;
            for (i, chunk) in data.chunks(SECTOR).enumerate() {
                if mode == 1 || rng.gen_bool(0.5) {
                    let at = o + i * SECTOR;
                    img[at..at + chunk.len()].copy_from_slice(chunk);
                }
            }
        };
        for p in &self.unflushed {
            apply(p.offset, &p.data, rng);
        }
        for (off, d) in in_flight {
            apply(*off, d, rng);
        }
        img
    }
}
