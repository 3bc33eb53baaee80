//! A device the engine's I/O commands run on: the cache file (mapped where
//! it can be, `mapped.rs`) or the backing store (a file, or an upstream NBD
//! export), each behind its fault layer (`fault.rs`). Atomic groups are
//! collected here and committed through the redo log (`redo.rs`, or the
//! upstream's redo region).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use nvwc_core::{IoError, IoOp, IoResult};
use nvwc_dev::group::GroupStager;

use crate::log::log;
use crate::redo::Redo;
use crate::{mapped, upstream};

/// The first `n` bytes of `parts`, back to back.
fn prefix<'a>(parts: &[&'a [u8]], mut n: usize) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    for p in parts {
        if n == 0 {
            break;
        }
        let k = p.len().min(n);
        out.push(&p[..k]);
        n -= k;
    }
    out
}

/// The first `n` bytes of `parts` written back to back at `offset`, as
/// (offset, bytes) pieces, one per part.
fn pieces(mut offset: u64, parts: &[&Bytes], mut n: usize) -> Vec<(u64, Bytes)> {
    let mut out = Vec::new();
    for p in parts {
        if n == 0 {
            break;
        }
        let k = p.len().min(n);
        out.push((offset, p.slice(..k)));
        offset += k as u64;
        n -= k;
    }
    out
}

/// `pwritev` all of `parts` at `offset`, resuming after short writes.
fn pwritev_all(f: &File, mut offset: u64, parts: &[&Bytes]) -> std::io::Result<()> {
    use std::io::IoSlice;
    // Linux takes at most IOV_MAX (1024) buffers per call.
    for chunk in parts.chunks(1024) {
        let mut slices: Vec<IoSlice> = chunk.iter().map(|p| IoSlice::new(p)).collect();
        let mut rest = &mut slices[..];
        while !rest.is_empty() {
            let n = rustix::io::pwritev(f, rest, offset)?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            offset += n as u64;
            IoSlice::advance_slices(&mut rest, n);
        }
    }
    Ok(())
}

/// An upstream command in flight (`Device::upstream_async`).
pub(crate) type UpFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = IoResult<Bytes>> + Send>>;

/// Where a device's bytes live.
pub(crate) enum Backend {
    File(File),
    /// An upstream NBD export, driven from the worker threads through the runtime.
    /// Journaled groups go through the redo region at the end of the upstream.
    Nbd(Arc<upstream::Upstream>, tokio::runtime::Handle),
}

pub(crate) struct Device {
    pub(crate) backend: Backend,
    /// The cache file mapped (`mapped.rs`): direct writes are received into
    /// it; private in host-crash mode (`fault.rs`), where it is the device's
    /// view of writes not yet durable and every write goes to it. Plain
    /// writes are `pwrite`n otherwise: into the page cache's single pages
    /// (`small_pages`) that is cheaper than copying into the mapping, whose
    /// pages each fault again after every sync (4 KiB random rewrites at
    /// QD16: ~195k IOPS with `pwrite`, ~182k copied into the mapping;
    /// rewrites into fresh slots ~171k against ~98k). `None` for the
    /// backing store, or when the file cannot be mapped.
    pub(crate) map: Option<mapped::Mapped>,
    /// Atomic groups' writes until their end (`nvwc-dev/src/group.rs`).
    pub(crate) groups: Mutex<GroupStager>,
    pub(crate) redo: Option<Redo>,
    /// Fault injection, host-crash overlay, failpoints and the failed flag (`fault.rs`).
    pub(crate) fault: crate::fault::Layer,
}

impl crate::fault::Media for Device {
    fn raw(&self, op: &IoOp<Bytes>, group: Option<u64>) -> IoResult<Bytes> {
        self.execute_raw(op, group)
    }
    fn has_view(&self) -> bool {
        self.map.as_ref().is_some_and(|m| m.private())
    }
    fn show(&self, offset: u64, data: &[u8]) -> Result<(), IoError> {
        match &self.map {
            Some(m) if m.private() => m.write(offset, &[data]).map_err(|_| IoError::Eio),
            _ => Ok(()),
        }
    }
}

impl Device {
    pub(crate) fn execute(&self, op: &IoOp<Bytes>, group: Option<u64>) -> IoResult<Bytes> {
        self.fault.run(op, group, self)
    }

    /// A local file (not an upstream NBD server).
    pub(crate) fn is_file(&self) -> bool {
        matches!(self.backend, Backend::File(_))
    }

    /// An upstream's read, write, flush or checksum as a future on the
    /// upstream's runtime, for the host to spawn rather than hand to a pool
    /// thread that would block on it (`host.rs`): one request on the wire
    /// either way, without the thread hop. `None` where the command must
    /// run through [`Device::execute_issued`]: a local file, an atomic
    /// group's part (the redo log), or a fault layer in the way.
    pub(crate) fn upstream_async(
        &self,
        op: &IoOp<Bytes>,
        group: Option<u64>,
    ) -> Option<(tokio::runtime::Handle, UpFuture)> {
        let Backend::Nbd(c, rt) = &self.backend else {
            return None;
        };
        if group.is_some() || !self.fault.passthrough() {
            return None;
        }
        let c = c.clone();
        let e = |_| IoError::Eio;
        let fut: UpFuture = match op.clone() {
            IoOp::Read { offset, len } => {
                Box::pin(async move { c.read(offset, len).await.map(Some).map_err(e) })
            }
            IoOp::Write { offset, data, fua } => {
                Box::pin(async move { c.write(offset, data, fua).await.map(|_| None).map_err(e) })
            }
            IoOp::Flush => Box::pin(async move { c.flush().await.map(|_| None).map_err(e) }),
            IoOp::Checksum { offset, len } => Box::pin(async move {
                c.read(offset, len)
                    .await
                    .map(|b| Some(crc_payload(&b)))
                    .map_err(e)
            }),
            _ => return None,
        };
        Some((rt.clone(), fut))
    }

    /// [`Device::execute`] for a command the engine issued earlier, at
    /// `issued` (`fault::Layer::issue_stamp`).
    pub(crate) fn execute_issued(
        &self,
        op: &IoOp<Bytes>,
        group: Option<u64>,
        issued: Option<u64>,
    ) -> IoResult<Bytes> {
        self.fault.run_issued(op, group, self, issued)
    }

    /// Write adjacent `parts` starting at `offset` as one command: one copy
    /// into the mapped cache file, through the fault layer
    /// ([`crate::fault::Layer::put_write`]: injected faults, and in
    /// host-crash mode the record of what is not durable yet), or one
    /// `pwritev` where the file is not mapped and no fault layer is in the
    /// way, else one merged write through [`Device::execute`] (which also
    /// records errors).
    pub(crate) fn write_parts(&self, offset: u64, parts: &[&Bytes]) -> IoResult<Bytes> {
        if let Backend::File(f) = &self.backend {
            if let Some(m) = self
                .map
                .as_ref()
                .filter(|m| m.private() || !self.fault.passthrough())
            {
                let slices: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
                let total = slices.iter().map(|p| p.len()).sum();
                let r = self.fault.put_write(
                    offset,
                    total,
                    self,
                    &mut |n| {
                        if n == total {
                            m.write(offset, &slices)
                        } else {
                            m.write(offset, &prefix(&slices, n))
                        }
                    },
                    crate::fault::Written::Before(&|n| pieces(offset, parts, n)),
                );
                return match r {
                    Ok(()) => Ok(None),
                    Err(crate::fault::PutError::Device(e)) => Err(e),
                    Err(crate::fault::PutError::Put(_)) => {
                        self.fault.record_error(&IoError::Eio);
                        Err(IoError::Eio)
                    }
                };
            }
            if self.fault.passthrough() && pwritev_all(f, offset, parts).is_ok() {
                return Ok(None);
            }
            // Retried below, so the failure is counted and logged as usual.
        }
        let mut buf = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
        for p in parts {
            buf.extend_from_slice(p);
        }
        let op = IoOp::Write {
            offset,
            data: Bytes::from(buf),
            fua: false,
        };
        self.execute(&op, None)
    }

    fn execute_raw(&self, op: &IoOp<Bytes>, group: Option<u64>) -> IoResult<Bytes> {
        match &self.backend {
            Backend::File(f) => self.execute_file(f, op, group),
            Backend::Nbd(c, rt) => self.execute_upstream(c, rt, op, group),
        }
    }

    /// A command on an upstream NBD export, blocking on its runtime; an
    /// atomic group's writes are held until its end, then committed through
    /// the redo region.
    fn execute_upstream(
        &self,
        c: &upstream::Upstream,
        rt: &tokio::runtime::Handle,
        op: &IoOp<Bytes>,
        group: Option<u64>,
    ) -> IoResult<Bytes> {
        let e = |_| IoError::Eio;
        match op {
            // A group's writes wait for its end (below).
            IoOp::Write { offset, data, .. } if group.is_some() => {
                let g = group.expect("checked");
                self.groups.lock().unwrap().stage(g, *offset, data.clone());
                Ok(None)
            }
            IoOp::Read { offset, len } => rt.block_on(c.read(*offset, *len)).map(Some).map_err(e),
            IoOp::Write { offset, data, fua } => rt
                .block_on(c.write(*offset, data.clone(), *fua))
                .map(|_| None)
                .map_err(e),
            IoOp::Flush => rt.block_on(c.flush()).map(|_| None).map_err(e),
            IoOp::Checksum { offset, len } => rt
                .block_on(c.read(*offset, *len))
                .map(|b| Some(crc_payload(&b)))
                .map_err(e),
            IoOp::Trim { .. } => Ok(None),
            IoOp::GroupBegin { group } => {
                self.groups.lock().unwrap().begin(*group);
                Ok(None)
            }
            IoOp::GroupEnd { group } => {
                let writes = self.groups.lock().unwrap().end(*group);
                rt.block_on(c.commit_and_apply(&writes))
                    .map(|_| None)
                    .map_err(|err| {
                        log!(
                            error,
                            "redo_commit_failed",
                            error = crate::errors::chain(&err)
                        );
                        IoError::Eio
                    })
            }
        }
    }

    /// A command on a file (the cache, or a backing file): atomic groups
    /// through its redo log.
    fn execute_file(&self, file: &File, op: &IoOp<Bytes>, group: Option<u64>) -> IoResult<Bytes> {
        let io = |r: std::io::Result<()>| {
            r.map_err(|e| match e.raw_os_error() {
                Some(28) => IoError::NoSpace,
                _ => IoError::Eio,
            })
        };
        match op {
            IoOp::Read { offset, len } | IoOp::Checksum { offset, len } => {
                let mut buf = vec![0u8; *len as usize];
                match &self.map {
                    // Host-crash mode: the private mapping is what a reader
                    // sees (the file holds only what is durable).
                    Some(m) if m.private() => io(m.read(*offset, &mut buf))?,
                    _ => io(file.read_exact_at(&mut buf, *offset))?,
                }
                if matches!(op, IoOp::Checksum { .. }) {
                    return Ok(Some(crc_payload(&buf)));
                }
                Ok(Some(Bytes::from(buf)))
            }
            IoOp::Write { offset, data, fua } => {
                if let Some(g) = group {
                    self.groups.lock().unwrap().stage(g, *offset, data.clone());
                    return Ok(None);
                }
                // Plain writes are `pwrite`s, also where the file is mapped
                // (`files::small_pages`). A private mapping never reaches the
                // file: in host-crash mode the fault layer writes here what
                // is durable.
                if *fua {
                    io(write_dsync(file, data, *offset))?;
                } else {
                    io(file.write_all_at(data, *offset))?;
                }
                Ok(None)
            }
            IoOp::Flush => {
                io(file.sync_data())?;
                Ok(None)
            }
            IoOp::Trim { .. } => Ok(None),
            IoOp::GroupBegin { group } => {
                self.groups.lock().unwrap().begin(*group);
                Ok(None)
            }
            IoOp::GroupEnd { group } => {
                let writes = self.groups.lock().unwrap().end(*group);
                let redo = self.redo.as_ref().expect("backing device has a redo log");
                io(redo.commit_and_apply(file, &writes)).map(|_| None)
            }
        }
    }
}

/// A checksum command's answer: the CRC-32C of `b`, little-endian.
fn crc_payload(b: &[u8]) -> Bytes {
    Bytes::copy_from_slice(&nvwc_core::layout::data_crc(b).to_le_bytes())
}

/// A FUA write to a file: `data` at `offset`, durable when this returns, by
/// `pwritev2(RWF_DSYNC)`, which syncs the written range only (a whole-file
/// `fdatasync` would also write back every other dirty page, such as the
/// many writes sent around a full cache). That is FUA's promise in the NBD
/// protocol, and what the VOPR's disk and the host-crash layer model: the
/// write itself is durable, nothing else. Falls back to a write and a
/// `fdatasync` where the kernel lacks `RWF_DSYNC`.
pub(crate) fn write_dsync(file: &std::fs::File, data: &[u8], offset: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut done = 0usize;
    while done < data.len() {
        let rest = &data[done..];
        let iov = libc::iovec {
            iov_base: rest.as_ptr() as *mut libc::c_void,
            iov_len: rest.len(),
        };
        // SAFETY: `iov` points into `data`, which outlives the call; the
        // kernel only reads from it.
        let n = unsafe {
            libc::pwritev2(
                file.as_raw_fd(),
                &iov,
                1,
                (offset + done as u64) as libc::off_t,
                libc::RWF_DSYNC,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL) if done == 0 => {
                    file.write_all_at(data, offset)?;
                    return file.sync_data();
                }
                _ => return Err(e),
            }
        }
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        done += n as usize;
    }
    Ok(())
}
