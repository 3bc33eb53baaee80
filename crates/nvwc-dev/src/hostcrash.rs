//! The host-crash filter: any device behind a volatile write cache, the
//! `volatile` fault kind (`rules.rs`), over the model and side log of
//! `volatile.rs`.
//!
//! The device under the filter holds only what is durable. A plain write
//! completes once it is recorded as pending ([`Volatile::completed`]) and
//! shown in the filter's *view*: a [`View`] of the device's own (the cache
//! file's private mapping in `nvwc serve`, which reads then come from), or,
//! without one, the pending records overlaid on reads. A FLUSH writes every
//! record pending at its issue to the device, in completion order, and
//! syncs it; a FUA write goes to the device at once (durable) and patches
//! the older pending records it overlaps; a group's end flushes first, then
//! ends the group on the device. Every write to the device itself holds the
//! model's one sync lock, so an older batch never lands over a newer
//! durable write. Trims and a group's begin and writes are forwarded.
//!
//! A command may run later than it was issued (the server's worker
//! threads): a FLUSH covers the writes completed before its *issue*. Such a
//! driver takes [`Volatile::stamp`] at the issue and builds the filter for
//! that command with [`HostCrash::issued`]; by default a FLUSH covers what
//! completed before it runs.

use std::io;
use std::sync::Arc;

use bytes::Bytes;

use crate::block::BlockDevice;
use crate::volatile::Volatile;

/// Where a device shows the writes that are not durable yet, if it has a
/// place of its own for them (module docs).
pub trait View {
    /// Put `parts`, back to back, at `offset` in the view (never on the device).
    fn show(&self, offset: u64, parts: &[&[u8]]) -> io::Result<()>;
    /// Read from the view: every completed write.
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
}

impl<T: View + ?Sized> View for &T {
    fn show(&self, offset: u64, parts: &[&[u8]]) -> io::Result<()> {
        (**self).show(offset, parts)
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        (**self).read(offset, buf)
    }
}

/// No view: pending writes are overlaid on reads.
pub struct NoView;

impl View for NoView {
    fn show(&self, _offset: u64, _parts: &[&[u8]]) -> io::Result<()> {
        Ok(())
    }
    fn read(&self, _offset: u64, _buf: &mut [u8]) -> io::Result<()> {
        unreachable!("a filter without a view never reads from it")
    }
}

/// The side log could not be written: the host-crash model is broken, so
/// the command fails rather than go unrecorded.
#[derive(Debug, thiserror::Error)]
#[error("host-crash side log: {0}")]
pub struct SideLogFailed(pub io::Error);

impl SideLogFailed {
    /// The side log's own error, if `e` is a side-log failure.
    pub fn of(e: &io::Error) -> Option<&io::Error> {
        Some(&e.get_ref()?.downcast_ref::<SideLogFailed>()?.0)
    }
}

fn side_log(e: io::Error) -> io::Error {
    io::Error::other(SideLogFailed(e))
}

/// See the module docs.
pub struct HostCrash<D, V = NoView> {
    state: Arc<Volatile>,
    dev: D,
    view: Option<V>,
    issued: Option<u64>,
}

impl<D: BlockDevice> HostCrash<D, NoView> {
    /// `dev` behind the volatile cache `state`, without a view.
    pub fn new(state: Arc<Volatile>, dev: D) -> HostCrash<D, NoView> {
        HostCrash {
            state,
            dev,
            view: None,
            issued: None,
        }
    }
}

impl<D: BlockDevice, V: View> HostCrash<D, V> {
    /// Show pending writes in `view` (and read from it), if any.
    pub fn with_view<W: View>(self, view: Option<W>) -> HostCrash<D, W> {
        HostCrash {
            state: self.state,
            dev: self.dev,
            view,
            issued: self.issued,
        }
    }

    /// A FLUSH or group end through this filter covers the writes completed
    /// before `stamp` ([`Volatile::stamp`] at its issue; `None`: now).
    /// `stamp` MUST be one the model handed out: a flush cannot be issued
    /// in the future.
    pub fn issued(mut self, stamp: Option<u64>) -> Self {
        assert!(
            stamp.is_none_or(|s| s <= self.state.stamp()),
            "a flush issued at {stamp:?}, after every completed write"
        );
        self.issued = stamp;
        self
    }

    /// The device under the filter.
    pub fn inner(&self) -> &D {
        &self.dev
    }

    /// Under the sync lock: write the batch a FLUSH covers to the device,
    /// sync it, mark the batch durable, then `then` (still locked).
    fn sync_then(&self, then: impl FnOnce(&D) -> io::Result<()>) -> io::Result<()> {
        let _sync = self.state.sync_lock();
        let (stamp, batch) = self.state.batch(self.issued);
        for (offset, data) in batch {
            self.dev.write(offset, &[&data], false)?;
        }
        self.dev.flush()?;
        self.state.synced(stamp).map_err(side_log)?;
        then(&self.dev)
    }

    fn show(&self, offset: u64, parts: &[&[u8]]) -> io::Result<()> {
        match &self.view {
            Some(v) => v.show(offset, parts),
            None => Ok(()),
        }
    }
}

impl<D: BlockDevice, V: View> BlockDevice for HostCrash<D, V> {
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if let Some(v) = &self.view {
            return v.read(offset, buf);
        }
        // The device and the overlay as of one moment: a FLUSH moves
        // records from the one to the other.
        let _sync = self.state.sync_lock();
        self.dev.read(offset, buf)?;
        self.state.overlay(offset, buf);
        Ok(())
    }

    fn write(&self, offset: u64, parts: &[&[u8]], fua: bool) -> io::Result<()> {
        if !fua {
            // Recorded before it is shown: a crash in the middle of the
            // copy may keep any part of it (a write in flight).
            let mut at = offset;
            let mut writes = Vec::with_capacity(parts.len());
            for p in parts {
                writes.push((at, Bytes::copy_from_slice(p)));
                at += p.len() as u64;
            }
            self.state.completed(writes).map_err(side_log)?;
            return self.show(offset, parts);
        }
        // FUA: to the device now. Flushes wait, so that no older batch
        // lands over it.
        let _sync = self.state.sync_lock();
        self.show(offset, parts)?;
        self.dev.write(offset, parts, true)?;
        match parts {
            [one] => self.state.durable(offset, one),
            _ => self.state.durable(offset, &parts.concat()),
        }
        .map_err(side_log)
    }

    fn flush(&self) -> io::Result<()> {
        self.sync_then(|_| Ok(()))
    }

    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        self.dev.trim(offset, len)
    }

    fn group_begin(&self, g: u64) -> io::Result<()> {
        self.dev.group_begin(g)
    }

    fn group_write(&self, g: u64, offset: u64, data: Bytes) -> io::Result<()> {
        self.dev.group_write(g, offset, data)
    }

    /// A group's end syncs first: its redo log's sync of the device makes
    /// every completed write durable as well.
    fn group_end(&self, g: u64) -> io::Result<()> {
        self.sync_then(|dev| dev.group_end(g))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemDisk;
    use std::cell::RefCell;
    use std::sync::Mutex;

    fn twin() -> RefCell<MemDisk> {
        RefCell::new(MemDisk::new(vec![0; 8 * 512]))
    }

    fn state() -> Arc<Volatile> {
        Arc::new(Volatile::new(None).unwrap())
    }

    /// The first byte of the twin's durable sector `i` (what a crash of
    /// the twin keeps: the filter writes to it only as it flushes it, or
    /// with FUA, so its own cache holds nothing that a crash could keep).
    fn durable(d: &RefCell<MemDisk>, i: usize) -> u8 {
        let mut none = rand::rngs::mock::StepRng::new(0, 0);
        d.borrow().crash(&mut none, &[], &[])[i * 512]
    }

    #[test]
    fn loses_unsynced_writes_and_keeps_synced_and_fua_ones() {
        let d = twin();
        let v = state();
        let f = HostCrash::new(v.clone(), &d);
        f.write(0, &[&[1; 512]], false).unwrap();
        let mut b = [0u8; 1024];
        f.read(0, &mut b).unwrap();
        assert_eq!(b[0], 1, "a completed write is visible");
        assert_eq!(d.borrow().read(0, 1), vec![0], "but not on the device");
        f.write(512, &[&[2; 512]], true).unwrap();
        assert_eq!(durable(&d, 1), 2, "FUA is durable at once");
        assert_eq!(durable(&d, 0), 0, "the unsynced write is not");
        // A FLUSH issued now covers 1, not 3 (completed after its issue).
        let issued = v.stamp();
        f.write(1024, &[&[3; 512]], false).unwrap();
        HostCrash::new(v.clone(), &d)
            .issued(Some(issued))
            .flush()
            .unwrap();
        assert_eq!(durable(&d, 0), 1, "synced");
        assert_eq!(durable(&d, 2), 0, "completed after the FLUSH's issue");
        assert_eq!(d.borrow().read(1024, 1), vec![0]);
        f.read(1024, &mut b[..512]).unwrap();
        assert_eq!(b[0], 3, "still visible through the filter");
    }

    #[test]
    fn a_fua_write_is_never_undone_by_an_older_pending_one() {
        let d = twin();
        let f = HostCrash::new(state(), &d);
        f.write(0, &[&[1; 1024]], false).unwrap();
        f.write(512, &[&[2; 512]], true).unwrap();
        f.flush().unwrap();
        assert_eq!((durable(&d, 0), durable(&d, 1)), (1, 2));
    }

    /// A view of its own: a buffer standing for a private mapping.
    struct Buf(Mutex<Vec<u8>>);

    impl View for Buf {
        fn show(&self, offset: u64, parts: &[&[u8]]) -> io::Result<()> {
            let mut b = self.0.lock().unwrap();
            let o = offset as usize;
            let data = parts.concat();
            b[o..o + data.len()].copy_from_slice(&data);
            Ok(())
        }
        fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
            let b = self.0.lock().unwrap();
            buf.copy_from_slice(&b[offset as usize..offset as usize + buf.len()]);
            Ok(())
        }
    }

    #[test]
    fn a_view_shows_pending_writes_and_serves_reads() {
        let d = twin();
        let view = Buf(Mutex::new(vec![0; 8 * 512]));
        let f = HostCrash::new(state(), &d).with_view(Some(&view));
        f.write(0, &[&[4; 256], &[5; 256]], false).unwrap();
        assert_eq!(view.0.lock().unwrap()[300], 5);
        let mut b = [0u8; 2];
        f.read(255, &mut b).unwrap();
        assert_eq!(b, [4, 5]);
        assert_eq!(d.borrow().read(0, 1), vec![0]);
        f.flush().unwrap();
        assert_eq!(durable(&d, 0), 4);
    }
}
