//! A device the engine's I/O commands run on: the cache file (mapped where
//! it can be, `mapped.rs`) or the backing store (a file, or an upstream NBD
//! export), each behind its fault layer (`fault.rs`). Files are driven
//! through the one block-device interface (`nvwc-dev/src/block.rs`); a
//! backing file's atomic groups go through the atomic-group filter and its
//! redo log (`nvwc-dev/src/redo.rs`), the code the VOPR runs too; an
//! upstream's through the same filter and protocol, the log in its redo
//! region (`upstream.rs`). With faults or host-crash mode configured, every
//! command goes through the fault and host-crash filters
//! (`nvwc-dev/src/fault.rs`, `nvwc-dev/src/hostcrash.rs`) stacked on that
//! device ([`Backend::dev`]), the private mapping as the host-crash
//! filter's view; without, straight to it.

use std::fs::File;
use std::sync::Arc;

use bytes::Bytes;
use nvwc_core::{IoError, IoOp, IoResult};
use nvwc_dev::block::BlockDevice;
use nvwc_dev::fault::prefix;
use nvwc_dev::hostcrash::View;
use nvwc_dev::redo::{Atomic, FileLog, Redo};
use nvwc_dev::rules::Injected;

use crate::log::log;
use crate::{mapped, upstream};

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

/// An upstream command in flight (`Device::upstream_async`).
pub(crate) type UpFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = IoResult<Bytes>> + Send>>;

/// Where a device's bytes live.
pub(crate) enum Backend {
    /// The cache file (no atomic groups).
    File(File),
    /// A backing file, with atomic groups through its redo log
    /// (`<backing>.nvwc-redo`).
    Journaled(Atomic<File, FileLog>),
    /// An upstream NBD export, driven from the worker threads through the
    /// runtime (or, for the fast path, on it: [`Device::upstream_async`]).
    /// Atomic groups go through the same filter and redo-log protocol, the
    /// log in the redo region at the end of the upstream.
    Nbd(
        Arc<upstream::Upstream>,
        tokio::runtime::Handle,
        Box<UpstreamGroups>,
    ),
}

/// An upstream with atomic groups through its redo region.
pub(crate) type UpstreamGroups = Atomic<
    upstream::UpstreamDev<Arc<upstream::Upstream>>,
    upstream::RegionLog<Arc<upstream::Upstream>>,
>;

impl Backend {
    /// A backing file whose groups commit through the redo log at `redo`.
    pub(crate) fn journaled(file: File, redo: std::path::PathBuf) -> Backend {
        let redo = Redo::new(FileLog { path: redo })
            .with_mid_apply(|| crate::fault::failpoint("redo-apply"));
        Backend::Journaled(Atomic::new(file, redo))
    }

    /// An upstream export; its groups commit through its redo region.
    pub(crate) fn upstream(up: upstream::Upstream, rt: tokio::runtime::Handle) -> Backend {
        let up = Arc::new(up);
        let dev = upstream::UpstreamDev {
            up: up.clone(),
            rt: rt.clone(),
        };
        let log = upstream::RegionLog {
            up: up.clone(),
            rt: rt.clone(),
        };
        let redo = Redo::new(log).with_mid_apply(|| crate::fault::failpoint("redo-apply"));
        Backend::Nbd(up, rt, Box::new(Atomic::new(dev, redo)))
    }

    /// Clear the redo log of the last checkpoint group, durably, if it still
    /// holds one (`Redo::settle`); nothing for a plain file.
    fn settle_redo(&self) -> std::io::Result<()> {
        match self {
            Backend::File(_) => Ok(()),
            Backend::Journaled(a) => a.redo().settle(a.inner()),
            Backend::Nbd(_, _, groups) => groups.redo().settle(groups.inner()),
        }
    }

    /// The device the filters stack on: the file, the backing file with its
    /// atomic groups, or the upstream with its atomic groups.
    fn dev(&self) -> &dyn BlockDevice {
        match self {
            Backend::File(f) => f,
            Backend::Journaled(a) => a,
            Backend::Nbd(_, _, groups) => &**groups,
        }
    }

    /// The file, for a local file.
    fn file(&self) -> Option<&File> {
        match self {
            Backend::File(f) => Some(f),
            Backend::Journaled(a) => Some(a.inner()),
            Backend::Nbd(..) => None,
        }
    }
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
    /// Fault injection, host-crash overlay, failpoints and the failed flag (`fault.rs`).
    pub(crate) fault: crate::fault::Layer,
}

impl crate::fault::Media for Device {
    fn flush_unfaulted(&self) -> IoResult<Bytes> {
        self.fault
            .without_rules(self.backend.dev(), self.view(), |d| d.flush())
            .map(|()| None)
            .map_err(|e| self.fault.io_error(&e))
    }
}

/// The private mapping, host-crash mode's view of the cache (`mapped.rs`).
impl View for mapped::Mapped {
    fn show(&self, offset: u64, parts: &[&[u8]]) -> std::io::Result<()> {
        self.write(offset, parts)
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        mapped::Mapped::read(self, offset, buf)
    }
}

impl Device {
    /// At a clean stop: clear the backing store's redo log if it still holds
    /// the last checkpoint group (`Backend::settle_redo`).
    pub(crate) fn settle_redo(&self) -> std::io::Result<()> {
        self.backend.settle_redo()
    }

    pub(crate) fn execute(&self, op: &IoOp<Bytes>, group: Option<u64>) -> IoResult<Bytes> {
        self.execute_issued(op, group, None)
    }

    /// Host-crash mode's view: the private mapping, if the cache is mapped.
    fn view(&self) -> Option<&mapped::Mapped> {
        self.map.as_ref().filter(|m| m.private())
    }

    /// A local file (not an upstream NBD server).
    pub(crate) fn is_file(&self) -> bool {
        self.backend.file().is_some()
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
        let Backend::Nbd(c, rt, groups) = &self.backend else {
            return None;
        };
        if group.is_some() || !self.fault.passthrough() {
            return None;
        }
        if matches!(op, IoOp::Write { .. }) && groups.redo().unsettled() {
            // The redo log still holds the last group: it is cleared first
            // (`execute_upstream`, `Redo::settle`).
            return None;
        }
        let c = c.clone();
        let e = |_| IoError::Eio;
        let fut: UpFuture = match op.clone() {
            IoOp::Read { offset, len } => Box::pin(async move {
                c.read_split(offset, len)
                    .await
                    .map(Some)
                    .map_err(|_| IoError::Eio)
            }),
            IoOp::Write { offset, data, fua } => Box::pin(async move {
                c.write_split(offset, data, fua)
                    .await
                    .map(|_| None)
                    .map_err(|_| IoError::Eio)
            }),
            IoOp::Flush => Box::pin(async move { c.pick().flush().await.map(|_| None).map_err(e) }),
            IoOp::Checksum { offset, len } => Box::pin(async move {
                c.pick()
                    .read(offset, len)
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
        self.fault.run(op, group, || {
            if !self.fault.filtered() {
                return self.execute_raw(op, group);
            }
            let dev = self.backend.dev();
            let r = self
                .fault
                .with_filters(dev, self.view(), issued, |d| run_op(d, op, group));
            r.map_err(|e| {
                if matches!(
                    (op, &self.backend),
                    (IoOp::GroupEnd { .. }, Backend::Nbd(..))
                ) && Injected::of(&e).is_none()
                {
                    commit_failed(&e);
                }
                self.fault.io_error(&e)
            })
        })
    }

    /// Write adjacent `parts` starting at `offset` as one command: one copy
    /// into the mapped cache file, through the fault layer
    /// ([`crate::fault::Layer::put_write`]: injected faults, and in
    /// host-crash mode the record of what is not durable yet), or one
    /// `pwritev` where the file is not mapped and no fault layer is in the
    /// way, else one merged write through [`Device::execute`] (which also
    /// records errors).
    pub(crate) fn write_parts(&self, offset: u64, parts: &[&Bytes]) -> IoResult<Bytes> {
        if let Some(f) = self.backend.file() {
            let slices: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
            if let Some(m) = self
                .map
                .as_ref()
                .filter(|m| m.private() || !self.fault.passthrough())
            {
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
            if self.fault.passthrough() && f.write(offset, &slices, false).is_ok() {
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
            // A file (the cache, or a backing file, whose atomic groups its
            // filter commits through the redo log). Plain writes are
            // `pwrite`s, also where the file is mapped (`files::small_pages`);
            // FUA ones `pwritev2(RWF_DSYNC)`, which syncs the written range
            // only (`nvwc-dev/src/block.rs`).
            Backend::File(_) | Backend::Journaled(_) => {
                run_op(self.backend.dev(), op, group).map_err(|e| self.fault.io_error(&e))
            }
            Backend::Nbd(c, rt, groups) => self.execute_upstream(c, rt, groups, op, group),
        }
    }

    /// A command on an upstream NBD export, blocking on its runtime; an
    /// atomic group's writes are staged by `groups` until its end, then
    /// committed through the redo region.
    fn execute_upstream(
        &self,
        c: &upstream::Upstream,
        rt: &tokio::runtime::Handle,
        groups: &UpstreamGroups,
        op: &IoOp<Bytes>,
        group: Option<u64>,
    ) -> IoResult<Bytes> {
        let e = |_| IoError::Eio;
        let staged = |r: std::io::Result<()>| r.map(|_| None).map_err(|_| IoError::Eio);
        match op {
            // A group's writes wait for its end (below).
            IoOp::Write { offset, data, .. } if group.is_some() => {
                let g = group.expect("checked");
                staged(groups.group_write(g, *offset, data.clone()))
            }
            IoOp::Read { offset, len } => rt
                .block_on(c.read_split(*offset, *len))
                .map(Some)
                .map_err(|_| IoError::Eio),
            IoOp::Write { offset, data, fua } => {
                // A write outside a group: the redo log MUST NOT still hold
                // a group that replay could write over it (`Redo::settle`).
                if let Err(err) = groups.redo().settle(groups.inner()) {
                    commit_failed(&err);
                    return Err(IoError::Eio);
                }
                rt.block_on(c.write_split(*offset, data.clone(), *fua))
                    .map(|_| None)
                    .map_err(|_| IoError::Eio)
            }
            IoOp::Flush => rt.block_on(c.pick().flush()).map(|_| None).map_err(e),
            IoOp::Checksum { offset, len } => rt
                .block_on(c.pick().read(*offset, *len))
                .map(|b| Some(crc_payload(&b)))
                .map_err(e),
            IoOp::Trim { .. } => Ok(None),
            IoOp::GroupBegin { group } => staged(groups.group_begin(*group)),
            IoOp::GroupEnd { group } => groups.group_end(*group).map(|_| None).map_err(|err| {
                commit_failed(&err);
                IoError::Eio
            }),
        }
    }
}

/// An upstream's atomic group could not be committed.
fn commit_failed(e: &std::io::Error) {
    log!(error, "redo_commit_failed", error = e.to_string());
}

/// Run the engine's command `op` (of atomic group `group`, if any) on `dev`.
fn run_op(
    dev: &dyn BlockDevice,
    op: &IoOp<Bytes>,
    group: Option<u64>,
) -> std::io::Result<Option<Bytes>> {
    match op {
        IoOp::Read { offset, len } | IoOp::Checksum { offset, len } => {
            let mut buf = vec![0u8; *len as usize];
            dev.read(*offset, &mut buf)?;
            if matches!(op, IoOp::Checksum { .. }) {
                return Ok(Some(crc_payload(&buf)));
            }
            Ok(Some(Bytes::from(buf)))
        }
        IoOp::Write { offset, data, fua } => match group {
            Some(g) => dev.group_write(g, *offset, data.clone()).map(|_| None),
            None => dev.write(*offset, &[data], *fua).map(|_| None),
        },
        IoOp::Flush => dev.flush().map(|_| None),
        IoOp::Trim { offset, len } => dev.trim(*offset, u64::from(*len)).map(|_| None),
        IoOp::GroupBegin { group } => dev.group_begin(*group).map(|_| None),
        IoOp::GroupEnd { group } => dev.group_end(*group).map(|_| None),
    }
}

/// A checksum command's answer: the CRC-32C of `b`, little-endian.
fn crc_payload(b: &[u8]) -> Bytes {
    Bytes::copy_from_slice(&nvwc_core::layout::data_crc(b).to_le_bytes())
}
