//! The in-memory twin of a block device, with a volatile write cache and
//! crashes: the VOPR's disk (`nvwc-vopr/src/disk.rs` stacks the redo-log
//! filter on it), and the device the redo log's own tests crash.
//!
//! * A completed write is visible to reads but not durable until a FLUSH that
//!   was issued after it completes, or unless it was written with FUA.
//! * [`MemDisk::crash`] returns what survives: the durable image plus, for
//!   every write not yet durable, independently: nothing, all of it, or a
//!   random subset of its 512-byte sectors (torn).
//!
//! The twin has no atomic groups of its own: the redo-log filter
//! (`redo.rs`) gives them to it, as to a file. Its random draws are part
//! of the VOPR's seeds: a seed replays only while they stay the same, in
//! number and order.

use std::cell::RefCell;
use std::io;

use bytes::Bytes;
use rand::Rng;

use crate::block::BlockDevice;

/// The unit of a torn write.
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
pub struct MemDisk {
    visible: Vec<u8>,
    durable: Vec<u8>,
    unflushed: Vec<Pending>,
    clock: u64,
}

impl MemDisk {
    /// A device holding `image`, all of it durable.
    pub fn new(image: Vec<u8>) -> Self {
        MemDisk {
            durable: image.clone(),
            visible: image,
            unflushed: Vec::new(),
            clock: 0,
        }
    }

    pub fn len(&self) -> u64 {
        self.visible.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.visible.is_empty()
    }

    /// The `len` bytes at `offset`, as a reader sees them now.
    pub fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        self.visible[offset as usize..offset as usize + len].to_vec()
    }

    /// A write completes (it was issued earlier; its data lands now).
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

    /// Completion stamp to pass to [`MemDisk::flush`] for a flush issued now.
    pub fn flush_issue_stamp(&self) -> u64 {
        self.clock
    }

    /// A flush issued when the stamp was `issued_at` completes: the writes
    /// completed by then are durable.
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
    /// `ends_in_flight`: for each atomic group whose end was issued but
    /// did not complete, its staged writes; each group is applied whole or
    /// not at all (its redo log was, or was not, complete).
    pub fn crash(
        &self,
        rng: &mut impl Rng,
        in_flight: &[(u64, Vec<u8>)],
        ends_in_flight: &[Vec<(u64, Bytes)>],
    ) -> Vec<u8> {
        let mut img = self.durable.clone();
        for group in ends_in_flight {
            if rng.gen_bool(0.5) {
                for (off, d) in group {
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

/// The twin under a filter: commands complete at once, in call order.
impl BlockDevice for RefCell<MemDisk> {
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let d = self.borrow();
        let end = offset as usize + buf.len();
        if end > d.visible.len() {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.copy_from_slice(&d.visible[offset as usize..end]);
        Ok(())
    }

    fn write(&self, offset: u64, parts: &[&[u8]], fua: bool) -> io::Result<()> {
        let mut d = self.borrow_mut();
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if offset as usize + len > d.visible.len() {
            return Err(io::Error::from_raw_os_error(28));
        }
        match parts {
            [one] => d.write(offset, one, fua),
            _ => d.write(offset, &parts.concat(), fua),
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        let mut d = self.borrow_mut();
        let now = d.flush_issue_stamp();
        d.flush(now);
        Ok(())
    }

    fn trim(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn only_flushed_or_fua_writes_are_durable_and_fua_is_never_undone() {
        let mut d = MemDisk::new(vec![0; 4 * SECTOR]);
        d.write(0, &[1; SECTOR], false);
        let issued = d.flush_issue_stamp();
        d.write(SECTOR as u64, &[2; SECTOR], false);
        // The FLUSH was issued before the second write completed.
        d.flush(issued);
        d.write(0, &[3; 2 * SECTOR], false);
        d.write(0, &[4; SECTOR], true);
        assert_eq!(d.read(0, 1), vec![4]);
        // No in-flight writes: a crash keeps 1 durable (overwritten by the
        // FUA 4), and 2 and 3 (patched by 4) each whole, torn or lost.
        let mut seen = std::collections::HashSet::new();
        for seed in 0..64 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let img = d.crash(&mut rng, &[], &[]);
            assert_eq!(img[0], 4, "the FUA write is durable and never undone");
            assert!([0, 2, 3].contains(&img[SECTOR]), "{}", img[SECTOR]);
            seen.insert(img[SECTOR]);
            assert_eq!(img[2 * SECTOR], 0);
        }
        assert_eq!(seen.len(), 3, "lost, older and newer all happen");
    }

    #[test]
    fn a_group_end_in_flight_survives_whole_or_not_at_all() {
        let d = MemDisk::new(vec![0; 8 * SECTOR]);
        let group = vec![
            (0u64, Bytes::from(vec![5u8; SECTOR])),
            (4 * SECTOR as u64, Bytes::from(vec![6u8; 2 * SECTOR])),
        ];
        let mut both = [false; 2];
        for seed in 0..32 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let img = d.crash(&mut rng, &[], std::slice::from_ref(&group));
            let applied = img[0] == 5;
            let want = if applied { 6 } else { 0 };
            assert!(img[4 * SECTOR..6 * SECTOR].iter().all(|&b| b == want));
            both[usize::from(applied)] = true;
        }
        assert_eq!(both, [true, true]);
    }

    #[test]
    fn the_twin_as_a_block_device() {
        let d = RefCell::new(MemDisk::new(vec![0; 4 * SECTOR]));
        BlockDevice::write(&d, 10, &[&[1, 2], &[3]], false).unwrap();
        let mut b = [0u8; 4];
        BlockDevice::read(&d, 9, &mut b).unwrap();
        assert_eq!(b, [0, 1, 2, 3]);
        assert_eq!(d.borrow().durable[10], 0, "not durable before a flush");
        BlockDevice::flush(&d).unwrap();
        assert_eq!(d.borrow().durable[10..13], [1, 2, 3]);
        assert!(BlockDevice::write(&d, 4 * SECTOR as u64 - 1, &[&[1, 2]], false).is_err());
    }
}
