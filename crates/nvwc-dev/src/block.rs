//! The one block-device interface: the commands a device of nvwc answers
//! (read, write with or without FUA, flush, trim, atomic groups), small
//! enough that a filter can wrap any device by forwarding them, the way
//! nbdkit stacks its filters on one `next` interface.
//!
//! Devices: a file ([`std::fs::File`] itself, below), the in-memory twin
//! (`mem.rs`), and an upstream NBD export (`UpstreamDev` in
//! `nvwc-server/src/upstream.rs`). Filters, each wrapping any device and
//! forwarding what it does not change:
//!
//! - atomic groups through the redo log (`redo.rs`);
//! - injected faults (`fault.rs`): eio, enospc, timeout, delay, torn and
//!   torn-crash writes, from the rule language of `rules.rs`
//!   (`NVWC_FAULT_CACHE` / `NVWC_FAULT_BACKING`);
//! - a volatile write cache and host crashes (`hostcrash.rs`, over the
//!   model and side log of `volatile.rs`).
//!
//! `nvwc serve` stacks the fault filter over the host-crash filter over its
//! devices when a fault spec asks (`nvwc-server/src/fault.rs`). What is
//! not a filter, and why:
//!
//! - writes whose bytes the server places itself, straight into the
//!   mapped cache file (a payload received from the socket, buffered cache
//!   writes copied in by the kernel): [`BlockDevice::write`] takes bytes
//!   that exist before the write, these exist only once written. The
//!   server's fault layer asks the same rules (`rules::Rules::decide`) and
//!   records them in the same host-crash state (`volatile::Volatile`)
//!   around its copy (`Layer::put_write`);
//! - failpoints and the degraded mode stay in the server: they are about
//!   the engine's crash story and the export, not a device
//!   (`nvwc-server/src/fault.rs`).
//!
//! Contract, for every implementation:
//!
//! - a completed [`BlockDevice::write`] is visible to every later read; it
//!   is durable only after a [`BlockDevice::flush`] issued after it
//!   completed returns, or at once with `fua` (that write only, nothing
//!   else);
//! - [`BlockDevice::write_batch`]'s writes MUST NOT overlap: they may land
//!   in any order (and concurrently), none durable before the next flush;
//! - atomic groups: a device that has none refuses them
//!   ([`io::ErrorKind::Unsupported`]), the default; a filter that has them
//!   makes a group's staged writes visible and durable together when
//!   [`BlockDevice::group_end`] returns, and none of them before.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use bytes::Bytes;

/// A block device (see the module docs). Methods take `&self`: a device is
/// shared by the threads that run its commands.
pub trait BlockDevice {
    /// Fill `buf` with the bytes at `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;

    /// Write `parts`, back to back, at `offset` (no copy of the parts is
    /// made where the device can take them as they are: `pwritev`).
    fn write(&self, offset: u64, parts: &[&[u8]], fua: bool) -> io::Result<()>;

    /// Write every (offset, bytes) of `writes`, which MUST NOT overlap, in
    /// any order; none is durable before the next flush. A device that can
    /// keep several in flight (an upstream NBD export) does.
    fn write_batch(&self, writes: &[(u64, Bytes)]) -> io::Result<()> {
        for (offset, data) in writes {
            self.write(*offset, &[data], false)?;
        }
        Ok(())
    }

    /// Make every write completed before this call durable.
    fn flush(&self) -> io::Result<()>;

    /// The range's contents no longer matter (a hint: a device may ignore it).
    fn trim(&self, offset: u64, len: u64) -> io::Result<()>;

    /// Open atomic group `g`.
    fn group_begin(&self, g: u64) -> io::Result<()> {
        let _ = g;
        Err(no_groups())
    }

    /// Stage a write of the open group `g`: invisible until its end.
    fn group_write(&self, g: u64, offset: u64, data: Bytes) -> io::Result<()> {
        let _ = (g, offset, data);
        Err(no_groups())
    }

    /// End group `g`: all its writes visible and durable, or (an error)
    /// none of them, or, after a crash, all once the filter's recovery ran.
    fn group_end(&self, g: u64) -> io::Result<()> {
        let _ = g;
        Err(no_groups())
    }
}

fn no_groups() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "this device has no atomic groups (stack the redo-log filter on it)",
    )
}

impl<T: BlockDevice + ?Sized> BlockDevice for &T {
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        (**self).read(offset, buf)
    }
    fn write(&self, offset: u64, parts: &[&[u8]], fua: bool) -> io::Result<()> {
        (**self).write(offset, parts, fua)
    }
    fn write_batch(&self, writes: &[(u64, Bytes)]) -> io::Result<()> {
        (**self).write_batch(writes)
    }
    fn flush(&self) -> io::Result<()> {
        (**self).flush()
    }
    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        (**self).trim(offset, len)
    }
    fn group_begin(&self, g: u64) -> io::Result<()> {
        (**self).group_begin(g)
    }
    fn group_write(&self, g: u64, offset: u64, data: Bytes) -> io::Result<()> {
        (**self).group_write(g, offset, data)
    }
    fn group_end(&self, g: u64) -> io::Result<()> {
        (**self).group_end(g)
    }
}

/// A file (or a block device node) is a device: `pread`, `pwritev`
/// (`pwritev2(RWF_DSYNC)` for FUA), `fdatasync`. Trim is ignored.
impl BlockDevice for File {
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.read_exact_at(buf, offset)
    }

    fn write(&self, offset: u64, parts: &[&[u8]], fua: bool) -> io::Result<()> {
        match (parts, fua) {
            ([one], false) => self.write_all_at(one, offset),
            (_, false) => pwritev_all(self, offset, parts, false),
            (_, true) => pwritev_all(self, offset, parts, true),
        }
    }

    fn flush(&self) -> io::Result<()> {
        self.sync_data()
    }

    fn trim(&self, _offset: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
}

/// Linux takes at most IOV_MAX (1024) buffers per call.
const IOV_MAX: usize = 1024;

/// `pwritev` all of `parts` at `offset`, resuming after short writes;
/// `dsync`: with `RWF_DSYNC`, which syncs the written range only (a
/// whole-file `fdatasync` would also write back every other dirty page,
/// such as the many writes sent around a full cache). That is FUA's promise
/// in the NBD protocol, and what the in-memory twin and the host-crash layer
/// model: the write itself is durable, nothing else. Falls back to a write
/// and a `fdatasync` where the kernel lacks `RWF_DSYNC`.
fn pwritev_all(f: &File, mut offset: u64, parts: &[&[u8]], dsync: bool) -> io::Result<()> {
    use std::io::IoSlice;
    use std::os::fd::AsRawFd;
    let flags = if dsync { libc::RWF_DSYNC } else { 0 };
    // The first part not written whole, and how much of it is written.
    let (mut i, mut skip) = (0usize, 0usize);
    let mut first = true;
    loop {
        while i < parts.len() && parts[i].len() == skip {
            (i, skip) = (i + 1, 0);
        }
        if i == parts.len() {
            return Ok(());
        }
        let end = (i + IOV_MAX).min(parts.len());
        let iov: Vec<IoSlice> = std::iter::once(&parts[i][skip..])
            .chain(parts[i + 1..end].iter().copied())
            .map(IoSlice::new)
            .collect();
        // SAFETY: `IoSlice` is ABI-compatible with `iovec`; the slices
        // point into `parts`, which outlive the call; the kernel only reads
        // from them.
        let n = unsafe {
            libc::pwritev2(
                f.as_raw_fd(),
                iov.as_ptr() as *const libc::iovec,
                iov.len() as libc::c_int,
                offset as libc::off_t,
                flags,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL) if dsync && first => {
                    let mut at = offset;
                    for p in parts {
                        f.write_all_at(p, at)?;
                        at += p.len() as u64;
                    }
                    return f.sync_data();
                }
                _ => return Err(e),
            }
        }
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        first = false;
        offset += n as u64;
        // Past the `n` bytes written (a short write resumes mid-part).
        let mut n = n as usize;
        while n > 0 {
            let left = parts[i].len() - skip;
            if n < left {
                skip += n;
                break;
            }
            n -= left;
            (i, skip) = (i + 1, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_writes_parts_back_to_back_with_and_without_fua() {
        let dir = std::env::temp_dir().join(format!("nvwc-dev-block-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join("f"))
            .unwrap();
        f.set_len(8192).unwrap();
        // Many parts: more than one pwritev call.
        let parts: Vec<Vec<u8>> = (0..1500).map(|i| vec![(i % 251) as u8; 3]).collect();
        let refs: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
        f.write(100, &refs, false).unwrap();
        f.write(5000, &[&[], &[7u8; 10], &[], &[8u8; 5]], true)
            .unwrap();
        let mut buf = vec![0u8; 4500];
        f.read(100, &mut buf).unwrap();
        assert_eq!(buf, parts.concat());
        let mut b = [0u8; 16];
        f.read(5000, &mut b).unwrap();
        assert_eq!(&b[..15], &[[7u8; 10].as_slice(), &[8u8; 5]].concat()[..]);
        assert_eq!(b[15], 0);
        f.flush().unwrap();
        assert_eq!(
            f.group_begin(1).unwrap_err().kind(),
            io::ErrorKind::Unsupported,
            "a file has no atomic groups of its own"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
