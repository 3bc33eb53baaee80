//! The cache file mapped into memory: the target of direct writes (a
//! payload received from the socket straight into its slots) and, in
//! host-crash mode, of every cache write.
//!
//! Plain (buffered) cache writes are `pwrite`n in normal operation. They
//! were copied into this mapping while the cache file's page cache held
//! large folios, into which a 4 KiB `pwrite` is expensive on ext4; with the
//! file kept as single pages (`files::small_pages`) `pwrite` is the cheaper
//! one, because pages dirtied through the mapping fault again after every
//! sync (4 KiB random rewrites at QD16: ~195k IOPS with `pwrite`, ~182k
//! copied here; rewrites into fresh slots ~171k against ~98k).
//!
//! Copies into the mapping are made by the kernel: `process_vm_writev` to
//! our own process pins the mapped pages (faulting them in writable),
//! copies, and marks them dirty.
//!
//! Why not a plain `memcpy` into the mapping (15.7 µs)? Two reasons, both
//! about what a failure leaves behind:
//! * a store the file system cannot back (a page it fails to read or make
//!   writable) raises `SIGBUS` and kills the server; here it is `EFAULT`, a
//!   failed cache write like any other (the export degrades to read-only);
//! * a `kill -9` can stop a `memcpy` at any cache line, leaving a block half
//!   old and half new in the page cache. The kernel's copy stops only between
//!   pages (it checks for a fatal signal while pinning), like `pwrite`, so a
//!   4 KiB block rewritten in place is old or new after a crash, never mixed.
//!
//! Durability is exactly `pwrite`'s: the bytes are in the page cache, a
//! `kill -9` keeps them, and `fdatasync` on the file (the engine's cache
//! FLUSH) makes them durable, since the kernel writes back dirty pages
//! however they were dirtied.
//!
//! **Host-crash mode** (`fault.rs`, `volatile`): the file is mapped
//! *private* instead. The same copies (`write`, `recv_into`) then land in
//! the process's own copy-on-write pages and never reach the file, which
//! keeps only what the fault layer made durable; reads come from the
//! mapping ([`Mapped::read`], the kernel's copy again), so they see every
//! write. The fault layer is told of each such write, and the host-crash
//! filter writes it to the file at the FLUSH that makes it durable
//! (`nvwc-dev/src/hostcrash.rs`, this mapping as its view): the mapping
//! stands for the page cache, the file for the device.

use std::fs::File;
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// A read-write mapping of a whole cache file: shared, or private in
/// host-crash mode (module docs).
pub struct Mapped {
    ptr: NonNull<u8>,
    len: usize,
    private: bool,
    /// Buffers copied in by [`Mapped::write`] (each a cache write), and
    /// payloads received by [`Mapped::recv_into`]: which path the cache
    /// writes took (`nvwc status`: `cache_mapped_writes`, `cache_direct_recvs`).
    copied: AtomicU64,
    received: AtomicU64,
}

// SAFETY: the mapping is memory that only the kernel reads and writes (in
// `write`, `read`, and the system call `recv_into` hands a slice of it to);
// Rust code never reads or writes through the pointer.
unsafe impl Send for Mapped {}
unsafe impl Sync for Mapped {}

impl Mapped {
    /// Map `len` bytes of `f` (its whole size), shared, or `private`
    /// (host-crash mode: writes never reach the file). `None` when the file
    /// cannot be mapped (some file systems and devices cannot) or the kernel
    /// refuses `process_vm_writev` (a seccomp filter); the caller then keeps
    /// using `pwrite`.
    pub fn new(f: &File, len: u64, private: bool) -> Option<Mapped> {
        use rustix::mm::{mmap, MapFlags, ProtFlags};
        let len = usize::try_from(len).ok().filter(|&l| l > 0)?;
        // SAFETY: a fresh mapping chosen by the kernel; it aliases no Rust
        // object. The file outlives nothing here: the mapping holds its own
        // reference to the file.
        let p = unsafe {
            mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                if private {
                    MapFlags::PRIVATE
                } else {
                    MapFlags::SHARED
                },
                f,
                0,
            )
        }
        .ok()?;
        // Faults read the page they need, not a large folio around it
        // (`files::small_pages`). Advice only.
        // SAFETY: the range is exactly the mapping just made.
        let _ = unsafe { rustix::mm::madvise(p, len, rustix::mm::Advice::Random) };
        let m = Mapped {
            ptr: NonNull::new(p.cast::<u8>())?,
            len,
            private,
            copied: AtomicU64::new(0),
            received: AtomicU64::new(0),
        };
        // Probe: write the file's first byte back as it is (and, private,
        // read it back: host-crash mode reads the cache through the mapping).
        let mut b = [0u8; 1];
        use std::os::unix::fs::FileExt;
        f.read_exact_at(&mut b, 0).ok()?;
        m.write(0, &[&b]).ok()?;
        if private {
            let mut back = [0u8; 1];
            m.read(0, &mut back).ok().filter(|()| back == b)?;
        }
        m.copied.store(0, Ordering::Relaxed);
        Some(m)
    }

    /// Private (host-crash mode): writes stay in this process's pages.
    pub fn private(&self) -> bool {
        self.private
    }

    /// Cache writes copied in so far, and direct payloads received.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.copied.load(Ordering::Relaxed),
            self.received.load(Ordering::Relaxed),
        )
    }

    /// Copy `buf.len()` bytes at byte `offset` of the mapping into `buf`,
    /// by the kernel (`process_vm_readv` from ourselves): as for writes, a
    /// page the file system cannot provide is `EFAULT`, never `SIGBUS`, and
    /// Rust code never reads the mapping itself. Host-crash mode reads the
    /// cache this way (the file holds only durable bytes).
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let start = usize::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
        start
            .checked_add(buf.len())
            .filter(|&e| e <= self.len)
            .ok_or(io::ErrorKind::InvalidInput)?;
        let mut done = 0usize;
        while done < buf.len() {
            let local = libc::iovec {
                // SAFETY: `done < buf.len()`: inside `buf`.
                iov_base: unsafe { buf.as_mut_ptr().add(done) }.cast(),
                iov_len: buf.len() - done,
            };
            let remote = libc::iovec {
                // SAFETY: `start + done < start + buf.len() <= len`: inside the mapping.
                iov_base: unsafe { self.ptr.as_ptr().add(start + done) }.cast(),
                iov_len: buf.len() - done,
            };
            // SAFETY: the local iovec points into `buf`, which we borrow
            // mutably; the remote one into our own mapping (bounds checked
            // above). The kernel only reads the latter and writes the former.
            let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            done += n as usize;
        }
        Ok(())
    }

    /// Copy `parts`, back to back, to byte `offset` of the file.
    ///
    /// Overlapping writes at the same time leave some mix of their bytes, as
    /// two `pwrite`s would; the engine never has two outstanding cache writes
    /// to one slot.
    pub fn write(&self, offset: u64, parts: &[&[u8]]) -> io::Result<()> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let start = usize::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
        start
            .checked_add(total)
            .filter(|&e| e <= self.len)
            .ok_or(io::ErrorKind::InvalidInput)?;
        if total == 0 {
            return Ok(());
        }
        self.copied.fetch_add(parts.len() as u64, Ordering::Relaxed);
        // The kernel does the copy (process_vm_writev to ourselves): it pins
        // the pages (faulting them in writable; a failure is EFAULT, never a
        // SIGBUS), copies page by page and marks them dirty. A kill -9 can
        // stop it only between pages, like a `pwrite`, so a 4 KiB block is
        // never left half-copied by a crash of this process.
        let local: Vec<libc::iovec> = parts
            .iter()
            .map(|p| libc::iovec {
                iov_base: p.as_ptr() as *mut libc::c_void,
                iov_len: p.len(),
            })
            .collect();
        let mut done = 0usize;
        while done < total {
            // Skip what an earlier short call copied.
            let mut skip = done;
            let mut iov: Vec<libc::iovec> = Vec::with_capacity(local.len());
            for v in &local {
                if skip >= v.iov_len {
                    skip -= v.iov_len;
                    continue;
                }
                iov.push(libc::iovec {
                    // SAFETY: `skip < iov_len`: inside the part.
                    iov_base: unsafe { v.iov_base.cast::<u8>().add(skip) }.cast(),
                    iov_len: v.iov_len - skip,
                });
                skip = 0;
            }
            let remote = libc::iovec {
                // SAFETY: `start + done < end <= len`: inside the mapping.
                iov_base: unsafe { self.ptr.as_ptr().add(start + done) }.cast(),
                iov_len: total - done,
            };
            // SAFETY: every local iovec points into a live Rust buffer, the
            // remote one into our own mapping (bounds checked above); the
            // kernel only reads the former and writes the latter.
            let n = unsafe {
                libc::process_vm_writev(
                    libc::getpid(),
                    iov.as_ptr(),
                    iov.len() as libc::c_ulong,
                    &remote,
                    1,
                    0,
                )
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            done += n as usize;
        }
        Ok(())
    }
}

impl Mapped {
    /// Let `fill` write `len` bytes at byte `offset` of the file, straight
    /// into the mapping: the direct-write path, where `fill` is a `recv`
    /// from the client's socket, so the kernel copies the payload into the
    /// file's pages once, with no buffer in between. As with [`Mapped::write`]
    /// a page that cannot be made writable is `EFAULT` (the socket's copy
    /// fails), never `SIGBUS`, and a `kill -9` can end the copy only between
    /// pages (`nvwc_nbd::DirectSource`).
    ///
    /// Caller guarantees `fill` only hands the slice to the kernel (a
    /// system call that writes it): Rust code never reads or writes the
    /// mapping itself. The engine never has two writes outstanding to one
    /// slot, so nothing else writes these bytes meanwhile.
    pub fn recv_into(
        &self,
        offset: u64,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        let start = usize::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
        start
            .checked_add(len)
            .filter(|&e| e <= self.len)
            .ok_or(io::ErrorKind::InvalidInput)?;
        self.received.fetch_add(1, Ordering::Relaxed);
        // SAFETY: `start + len <= self.len`: inside the live mapping, which
        // outlives the call. The slice aliases no other Rust reference (the
        // mapping is only ever written by the kernel, see `write`), and the
        // caller hands it only to a system call.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(start), len) };
        fill(dst)
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `new`; no reference
        // into it outlives `self`.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
