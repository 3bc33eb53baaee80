//! Atomic groups over any device: the redo log, and the filter that stages
//! a group's writes ([`crate::group`]) and commits them through it.
//!
//! One protocol, [`Redo::commit`]: (1) write the group to the log, durably
//! (over the log of the group before); (2) write every record in place;
//! (3) flush the device. Two syncs a group: the log is not cleared after
//! it. Crash story: before (1) completes, the log is torn or missing,
//! replay does nothing, and the device holds none of the group (step 2 has
//! not started); a log torn while (1) overwrote the previous group's is
//! torn for both (each checks its CRC), and that group is on the device
//! already (its step 3 is done). After (1), the log is complete:
//! [`Redo::replay`] (on open, or `nvwc recover`) writes every record again
//! (writing twice is harmless), flushes, and clears the log, durably.
//!
//! **The log stays after (3)** (until the next group's log replaces it),
//! so replay after a crash may apply a group that is already on the
//! device. That changes nothing as long as nothing else wrote those blocks
//! since: groups only follow each other through the log, so the one rule is
//! [`Redo::settle`]: before any write outside a group reaches the device,
//! the log is cleared, durably. [`Atomic`] settles before its own plain
//! writes and trims; a driver that writes to the device around the filter
//! (the server's upstream fast path) MUST settle first
//! ([`Redo::unsettled`]). Under journaled write-back the engine writes
//! outside a group only for an admission bypass, so the clear is paid there
//! and not per checkpoint. (The protocol used to clear the log, durably, as
//! its step 4 of every group: a third sync.)
//!
//! Where the log lives is a [`LogStore`]: for a backing file, the file
//! `<backing>.nvwc-redo` ([`FileLog`], format in `docs/BACKING-FORMAT.md`);
//! for an upstream NBD export, the redo region at its end (`RegionLog` in
//! `nvwc-server/src/upstream.rs`, its own format); for the VOPR's
//! in-memory twin, a file log's bytes in memory ([`MemLog`]). The filter,
//! [`Atomic`], is how the server's backing stores and the VOPR's backing
//! disk get their atomic groups: the VOPR runs this code at every
//! journaled checkpoint.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use bytes::Bytes;

use crate::block::BlockDevice;
use crate::group::GroupStager;

/// The first bytes of a redo log (`docs/BACKING-FORMAT.md`).
pub const REDO_MAGIC: &[u8; 8] = b"NVWCREDO";

/// Where a redo log is kept.
pub trait LogStore {
    /// Replace the log with `writes`, durably: when this returns,
    /// [`LogStore::get`] finds them, after any crash.
    fn put(&self, writes: &[(u64, Bytes)]) -> io::Result<()>;
    /// The logged group, if the log holds a complete one (a missing, empty
    /// or torn log holds none).
    fn get(&self) -> io::Result<Option<Vec<(u64, Bytes)>>>;
    /// Empty the log, durably.
    fn clear(&self) -> io::Result<()>;
}

/// A group as a log: magic, count, then (offset u64, length u64, bytes)
/// per write, then the CRC-32 of all of that (little-endian).
pub fn encode(writes: &[(u64, Bytes)]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(20 + writes.iter().map(|(_, d)| 16 + d.len()).sum::<usize>());
    buf.extend_from_slice(REDO_MAGIC);
    buf.extend_from_slice(&(writes.len() as u64).to_le_bytes());
    for (off, d) in writes {
        buf.extend_from_slice(&off.to_le_bytes());
        buf.extend_from_slice(&(d.len() as u64).to_le_bytes());
        buf.extend_from_slice(d);
    }
    let crc = crc32fast::hash(&buf);
    buf.extend_from_slice(&crc.to_le_bytes());
    buf
}

/// The group in a log written by [`encode`]; `None` for an empty, torn
/// (bad CRC) or malformed one.
pub fn decode(buf: &[u8]) -> Option<Vec<(u64, Bytes)>> {
    if buf.len() < 20 || &buf[..8] != REDO_MAGIC {
        return None;
    }
    let body = &buf[..buf.len() - 4];
    let crc = u32::from_le_bytes(buf[buf.len() - 4..].try_into().expect("4 bytes"));
    if crc32fast::hash(body) != crc {
        return None;
    }
    let u64at = |at: usize| -> Option<u64> {
        Some(u64::from_le_bytes(
            body.get(at..at + 8)?.try_into().expect("8 bytes"),
        ))
    };
    let n = u64at(8)?;
    let mut at = 16;
    let mut out = Vec::new();
    for _ in 0..n {
        let off = u64at(at)?;
        let len = usize::try_from(u64at(at + 8)?).ok()?;
        let data = body.get(at + 16..(at + 16).checked_add(len)?)?;
        out.push((off, Bytes::copy_from_slice(data)));
        at += 16 + len;
    }
    Some(out)
}

/// The redo log of a backing file: the file at `path` (`<backing>.nvwc-redo`).
pub struct FileLog {
    pub path: PathBuf,
}

impl LogStore for FileLog {
    fn put(&self, writes: &[(u64, Bytes)]) -> io::Result<()> {
        let mut f = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&self.path)?;
        f.write_all(&encode(writes))?;
        f.sync_data()
    }

    fn get(&self) -> io::Result<Option<Vec<(u64, Bytes)>>> {
        // No log file (never journaled, or a plain directory's backing): nothing to replay.
        let Ok(mut f) = File::open(&self.path) else {
            return Ok(None);
        };
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)?;
        Ok(decode(&buf))
    }

    fn clear(&self) -> io::Result<()> {
        let f = OpenOptions::new().write(true).open(&self.path)?;
        f.set_len(0)?;
        f.sync_data()
    }
}

/// A redo log in memory, durable as soon as written: the VOPR's, whose
/// group end completes in one step, so that no crash falls inside it.
#[derive(Debug, Default)]
pub struct MemLog {
    bytes: Mutex<Vec<u8>>,
}

impl MemLog {
    /// What the log holds now.
    pub fn bytes(&self) -> Vec<u8> {
        self.bytes.lock().expect("log lock").clone()
    }
}

impl LogStore for MemLog {
    fn put(&self, writes: &[(u64, Bytes)]) -> io::Result<()> {
        *self.bytes.lock().expect("log lock") = encode(writes);
        Ok(())
    }
    fn get(&self) -> io::Result<Option<Vec<(u64, Bytes)>>> {
        Ok(decode(&self.bytes.lock().expect("log lock")))
    }
    fn clear(&self) -> io::Result<()> {
        self.bytes.lock().expect("log lock").clear();
        Ok(())
    }
}

/// The redo-log protocol (module docs) over a [`LogStore`].
pub struct Redo<L> {
    log: L,
    /// The log may hold a group that is not fully applied (a commit failed
    /// after it began writing the log): the next commit finishes that group
    /// first, because writing a new log over it would make it unreplayable
    /// while the device holds part of it.
    pending: AtomicBool,
    /// Called halfway through step (2), where the server's `redo-apply`
    /// failpoint aborts (`nvwc-server/src/fault.rs`).
    mid_apply: fn(),
    /// The log holds a group that is on the device already, not cleared:
    /// [`Redo::settle`] clears it before a write outside a group.
    unsettled: AtomicBool,
}

impl<L: LogStore> Redo<L> {
    pub fn new(log: L) -> Redo<L> {
        Redo {
            log,
            pending: AtomicBool::new(false),
            mid_apply: || {},
            unsettled: AtomicBool::new(false),
        }
    }

    /// Call `hook` halfway through every in-place apply of a commit.
    pub fn with_mid_apply(mut self, hook: fn()) -> Redo<L> {
        self.mid_apply = hook;
        self
    }

    pub fn log(&self) -> &L {
        &self.log
    }

    /// Commit the group `writes` (which MUST NOT overlap) to `dev`
    /// atomically: log, in place, flush (module docs); the log stays until
    /// the next group or [`Redo::settle`]. An error leaves either none of
    /// the group on `dev`, or all of it once the log is replayed (which the
    /// next commit does first).
    pub fn commit(&self, dev: &impl BlockDevice, writes: &[(u64, Bytes)]) -> io::Result<()> {
        // A group an earlier commit logged but could not finish (an I/O
        // error mid-apply) may be partly in place: finish it before its log
        // is overwritten. If that fails, this group is not started.
        if self.pending.load(Ordering::Acquire) {
            self.replay(dev)?;
        }
        self.pending.store(true, Ordering::Release);
        self.log.put(writes)?;
        if !writes.is_empty() {
            let half = writes.len() / 2;
            dev.write_batch(&writes[..half])?;
            (self.mid_apply)();
            dev.write_batch(&writes[half..])?;
        }
        dev.flush()?;
        self.unsettled.store(true, Ordering::Release);
        self.pending.store(false, Ordering::Release);
        Ok(())
    }

    /// The log may hold a group that a write outside a group could make
    /// stale: call [`Redo::settle`] before such a write.
    pub fn unsettled(&self) -> bool {
        self.unsettled.load(Ordering::Acquire) || self.pending.load(Ordering::Acquire)
    }

    /// Before a write outside a group reaches the device: clear the log of
    /// a group already applied (module docs), durably, so that replay after
    /// a crash cannot write that group over the new bytes. A group still
    /// pending (its apply failed) is finished first, on `dev`. Nothing to
    /// do (and no I/O) when the log is settled.
    pub fn settle(&self, dev: &impl BlockDevice) -> io::Result<()> {
        if self.pending.load(Ordering::Acquire) {
            self.replay(dev)?;
            return Ok(());
        }
        if self.unsettled.load(Ordering::Acquire) {
            self.log.clear()?;
            self.unsettled.store(false, Ordering::Release);
        }
        Ok(())
    }

    /// Finish a logged group (after a crash, or a failed commit): apply it
    /// in place, flush, clear the log. Returns how many writes it applied
    /// (0: the log held no complete group).
    pub fn replay(&self, dev: &impl BlockDevice) -> io::Result<usize> {
        let Some(writes) = self.log.get()? else {
            self.pending.store(false, Ordering::Release);
            self.unsettled.store(false, Ordering::Release);
            return Ok(0);
        };
        dev.write_batch(&writes)?;
        dev.flush()?;
        self.log.clear()?;
        self.pending.store(false, Ordering::Release);
        self.unsettled.store(false, Ordering::Release);
        Ok(writes.len())
    }
}

/// The atomic-group filter: `dev` with atomic groups, staged here and
/// committed through the redo log at their end; every other command goes
/// straight to `dev`.
pub struct Atomic<D, L> {
    dev: D,
    redo: Redo<L>,
    groups: Mutex<GroupStager>,
}

impl<D: BlockDevice, L: LogStore> Atomic<D, L> {
    pub fn new(dev: D, redo: Redo<L>) -> Atomic<D, L> {
        Atomic {
            dev,
            redo,
            groups: Mutex::default(),
        }
    }

    /// The device under the filter.
    pub fn inner(&self) -> &D {
        &self.dev
    }

    pub fn redo(&self) -> &Redo<L> {
        &self.redo
    }

    /// The writes staged to group `g` so far (what a crash during its end
    /// may apply).
    pub fn staged(&self, g: u64) -> Vec<(u64, Bytes)> {
        self.stager().staged(g).to_vec()
    }

    fn stager(&self) -> std::sync::MutexGuard<'_, GroupStager> {
        self.groups.lock().expect("group stager lock")
    }
}

impl<D: BlockDevice, L: LogStore> BlockDevice for Atomic<D, L> {
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.dev.read(offset, buf)
    }
    fn write(&self, offset: u64, parts: &[&[u8]], fua: bool) -> io::Result<()> {
        self.redo.settle(&self.dev)?;
        self.dev.write(offset, parts, fua)
    }
    fn write_batch(&self, writes: &[(u64, Bytes)]) -> io::Result<()> {
        self.redo.settle(&self.dev)?;
        self.dev.write_batch(writes)
    }
    fn flush(&self) -> io::Result<()> {
        self.dev.flush()
    }
    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        self.redo.settle(&self.dev)?;
        self.dev.trim(offset, len)
    }
    fn group_begin(&self, g: u64) -> io::Result<()> {
        self.stager().begin(g);
        Ok(())
    }
    fn group_write(&self, g: u64, offset: u64, data: Bytes) -> io::Result<()> {
        self.stager().stage(g, offset, data);
        Ok(())
    }
    fn group_end(&self, g: u64) -> io::Result<()> {
        let writes = self.stager().end(g);
        self.redo.commit(&self.dev, &writes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemDisk;
    use std::cell::RefCell;
    use std::os::unix::fs::FileExt;

    fn b(v: u8, n: usize) -> Bytes {
        Bytes::from(vec![v; n])
    }

    fn read_at(f: &File, off: u64, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        f.read_exact_at(&mut v, off).unwrap();
        v
    }

    fn test_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("nvwc-dev-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A group whose in-place apply fails stays in the log; the next commit
    /// finishes it before writing its own log over it. (Before, the next
    /// commit overwrote the log, so a crash during it left the failed group
    /// half applied with nothing to replay: the crash test caught this
    /// journaled over an upstream with injected write errors.)
    #[test]
    fn a_failed_group_is_finished_before_the_next() {
        let dir = test_dir("redo-fail");
        let bpath = dir.join("b.img");
        std::fs::write(&bpath, vec![0u8; 8192]).unwrap();
        let log = dir.join("b.img.nvwc-redo");
        let redo = Redo::new(FileLog { path: log.clone() });
        // Opened read-only: the log is written, the apply fails.
        let ro = File::open(&bpath).unwrap();
        assert!(redo.commit(&ro, &[(0, b(5, 512))]).is_err());
        assert!(
            std::fs::metadata(&log).unwrap().len() > 0,
            "failed group stays logged"
        );
        // The next group, on a working backing file, finishes the first one too.
        let rw = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&bpath)
            .unwrap();
        redo.commit(&rw, &[(4096, b(6, 512))]).unwrap();
        assert_eq!(read_at(&rw, 0, 512), vec![5u8; 512]);
        assert_eq!(read_at(&rw, 4096, 512), vec![6u8; 512]);
        // The log holds the second group now (applied, not cleared).
        assert_eq!(
            decode(&std::fs::read(&log).unwrap()),
            Some(vec![(4096, b(6, 512))])
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_committed_group_is_replayed_and_a_torn_one_is_not() {
        let dir = test_dir("redo");
        let bpath = dir.join("b.img");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&bpath)
            .unwrap();
        f.set_len(8192).unwrap();
        let log = dir.join("b.img.nvwc-redo");
        let redo = Redo::new(FileLog { path: log.clone() });
        redo.commit(&f, &[(0, b(7, 512)), (4096, b(9, 512))])
            .unwrap();
        assert_eq!(read_at(&f, 4096, 512), vec![9u8; 512]);
        assert!(redo.unsettled(), "the applied group stays logged");
        // A write outside a group clears it first (`settle`), durably.
        redo.settle(&f).unwrap();
        assert!(!redo.unsettled());
        assert_eq!(
            std::fs::metadata(&log).unwrap().len(),
            0,
            "log truncated before a write outside a group"
        );
        // A logged-but-unapplied group, written by hand in the documented
        // format (`docs/BACKING-FORMAT.md`), is replayed.
        let mut buf = Vec::new();
        buf.extend_from_slice(b"NVWCREDO");
        buf.extend_from_slice(&1u64.to_le_bytes());
        buf.extend_from_slice(&1024u64.to_le_bytes());
        buf.extend_from_slice(&3u64.to_le_bytes());
        buf.extend_from_slice(&[1, 2, 3]);
        let crc = crc32fast::hash(&buf);
        buf.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(encode(&[(1024, Bytes::from_static(&[1, 2, 3]))]), buf);
        std::fs::write(&log, &buf).unwrap();
        assert_eq!(redo.replay(&f).unwrap(), 1);
        assert_eq!(read_at(&f, 1024, 3), vec![1, 2, 3]);
        assert_eq!(std::fs::metadata(&log).unwrap().len(), 0);
        // A torn log (bad checksum) is not applied.
        buf[20] ^= 1;
        std::fs::write(&log, &buf).unwrap();
        f.write_all_at(&[0, 0, 0], 1024).unwrap();
        assert_eq!(redo.replay(&f).unwrap(), 0);
        assert_eq!(read_at(&f, 1024, 3), vec![0, 0, 0]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The filter over the twin: a group is invisible until its end, then
    /// visible and durable whole; and a crash of the twin right after the
    /// log was written (before any in-place write) loses nothing, because
    /// the log replays it.
    #[test]
    fn groups_over_the_twin_are_atomic_across_a_crash() {
        let dev = Atomic::new(
            RefCell::new(MemDisk::new(vec![0; 8192])),
            Redo::new(MemLog::default()),
        );
        dev.group_begin(3).unwrap();
        dev.group_write(3, 0, b(1, 512)).unwrap();
        dev.group_write(3, 4096, b(2, 1024)).unwrap();
        let mut r = [0u8; 1];
        dev.read(0, &mut r).unwrap();
        assert_eq!(r, [0], "staged, not visible");
        assert_eq!(dev.staged(3).len(), 2);
        dev.group_end(3).unwrap();
        assert!(
            !dev.redo().log().bytes().is_empty(),
            "two syncs a group: the log is not cleared at its end"
        );
        let mut rng = rand::rngs::mock::StepRng::new(0, 1);
        let img = dev.inner().borrow().crash(&mut rng, &[], &[]);
        assert_eq!(
            (img[0], img[4096], img[5119]),
            (1, 2, 2),
            "durable at the end"
        );
        // Step (1) done, then the host died: the twin keeps only what is
        // durable, and replay on the restarted device finishes the group.
        let group = [(512u64, b(8, 512)), (6144, b(9, 512))];
        dev.redo().log().put(&group).unwrap();
        let after = RefCell::new(MemDisk::new(img));
        assert_eq!(dev.redo().replay(&after).unwrap(), 2);
        let img = after.borrow().crash(&mut rng, &[], &[]);
        assert_eq!((img[512], img[6144], img[0]), (8, 9, 1));
        assert_eq!(dev.redo().replay(&after).unwrap(), 0, "nothing left");
    }

    /// A device that counts its flushes, and a log that counts its puts
    /// and clears (each a sync of the log's store).
    struct Counted {
        disk: RefCell<MemDisk>,
        flushes: std::cell::Cell<u32>,
    }
    impl BlockDevice for Counted {
        fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
            self.disk.read(offset, buf)
        }
        fn write(&self, offset: u64, parts: &[&[u8]], fua: bool) -> io::Result<()> {
            self.disk.write(offset, parts, fua)
        }
        fn flush(&self) -> io::Result<()> {
            self.flushes.set(self.flushes.get() + 1);
            self.disk.flush()
        }
        fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
            self.disk.trim(offset, len)
        }
    }
    #[derive(Default)]
    struct CountedLog {
        log: MemLog,
        syncs: std::cell::Cell<u32>,
    }
    impl LogStore for CountedLog {
        fn put(&self, writes: &[(u64, Bytes)]) -> io::Result<()> {
            self.syncs.set(self.syncs.get() + 1);
            self.log.put(writes)
        }
        fn get(&self) -> io::Result<Option<Vec<(u64, Bytes)>>> {
            self.log.get()
        }
        fn clear(&self) -> io::Result<()> {
            self.syncs.set(self.syncs.get() + 1);
            self.log.clear()
        }
    }

    /// A group costs two syncs (its log, then the device after the apply),
    /// not three: the log is cleared only before a write outside a group.
    /// And that clear is what keeps replay from undoing such a write: a
    /// crash after it replays nothing, while the log of the group, had it
    /// stayed, would write the group's bytes over the newer ones.
    #[test]
    fn a_group_costs_two_syncs_and_a_plain_write_settles_the_log_first() {
        let dev = Atomic::new(
            Counted {
                disk: RefCell::new(MemDisk::new(vec![0; 8192])),
                flushes: Default::default(),
            },
            Redo::new(CountedLog::default()),
        );
        for g in 1..=3u64 {
            dev.group_begin(g).unwrap();
            dev.group_write(g, 0, b(g as u8, 512)).unwrap();
            dev.group_end(g).unwrap();
        }
        let syncs = dev.inner().flushes.get() + dev.redo().log().syncs.get();
        assert_eq!(syncs, 6, "two syncs for each of three groups");
        assert!(dev.redo().unsettled());
        // A plain write over the last group's block: the log is cleared
        // first, so replay after a crash leaves the new bytes.
        dev.write(0, &[&[7u8; 512]], true).unwrap();
        assert_eq!(dev.redo().log().syncs.get(), 4, "one clear");
        assert!(!dev.redo().unsettled());
        dev.write(512, &[&[8u8; 512]], true).unwrap();
        assert_eq!(dev.redo().log().syncs.get(), 4, "settled already: no clear");
        let mut rng = rand::rngs::mock::StepRng::new(0, 1);
        let img = dev.inner().disk.borrow().crash(&mut rng, &[], &[]);
        let after = RefCell::new(MemDisk::new(img));
        assert_eq!(dev.redo().replay(&after).unwrap(), 0, "nothing to replay");
        let img = after.borrow().crash(&mut rng, &[], &[]);
        assert_eq!((img[0], img[512]), (7, 8));
    }

    #[test]
    fn decode_rejects_what_encode_did_not_write() {
        let log = encode(&[(4096, b(1, 100)), (0, b(2, 3))]);
        assert_eq!(decode(&log).unwrap(), vec![(4096, b(1, 100)), (0, b(2, 3))]);
        assert_eq!(decode(&encode(&[])).unwrap(), vec![]);
        assert!(decode(&log[..log.len() - 1]).is_none(), "cut");
        assert!(decode(&[]).is_none(), "cleared");
        // A count larger than the records, with a CRC that matches: malformed.
        let mut bad = log[..log.len() - 4].to_vec();
        bad[8] = 3;
        let crc = crc32fast::hash(&bad);
        bad.extend_from_slice(&crc.to_le_bytes());
        assert!(decode(&bad).is_none());
    }
}
