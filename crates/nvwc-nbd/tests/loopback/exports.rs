//! Test exports: memory with a twist (a gate, a barrier, a concurrency
//! counter, deliberate bugs, direct writes), each owning only what its tests
//! watch.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use nvwc_nbd::proto::Extent;
use nvwc_nbd::{
    BoxFuture, DirectSource, Export, ExportInfo, MemoryExport, NbdError, NbdResult, OpFuture,
    RequestCtx, WriteZeroesFlags,
};
use tokio::sync::{Barrier, Notify};

/// `info` and `write` of an export that keeps its blocks in `self.inner`, a
/// [`MemoryExport`].
macro_rules! memory_info_and_write {
    () => {
        fn info(&self) -> ExportInfo {
            self.inner.info()
        }
        fn write(&self, ctx: RequestCtx, offset: u64, data: Bytes, fua: bool) -> OpFuture<'_> {
            self.inner.write(ctx, offset, data, fua)
        }
    };
}

/// Reads at offset 0 block until `gate` is opened; everything else is memory.
pub struct GateExport {
    inner: MemoryExport,
    gate: Notify,
    opened: AtomicBool,
    /// Notified when a read reaches the gate.
    pub entered: Notify,
}

impl GateExport {
    pub fn new(size: u64) -> Arc<Self> {
        Arc::new(GateExport {
            inner: MemoryExport::with_size("", size),
            gate: Notify::new(),
            opened: false.into(),
            entered: Notify::new(),
        })
    }
    pub fn open(&self) {
        self.opened.store(true, Ordering::SeqCst);
        self.gate.notify_waiters();
    }
}

impl Export for GateExport {
    memory_info_and_write!();
    fn read(&self, ctx: RequestCtx, offset: u64, len: u32) -> BoxFuture<'_, NbdResult<Bytes>> {
        Box::pin(async move {
            if offset == 0 {
                let n = self.gate.notified();
                self.entered.notify_one();
                if !self.opened.load(Ordering::SeqCst) {
                    n.await;
                }
            }
            self.inner.read(ctx, offset, len).await
        })
    }
}

/// What a [`ProbeExport`] read does before it answers.
pub enum Probe {
    /// Wait at a barrier of `n`: completes only if n reads are in flight at once.
    Barrier(Barrier),
    /// Stay in flight for a while, counting the reads in flight.
    Count { cur: AtomicUsize, max: AtomicUsize },
}

/// Reads answer a constant (after their [`Probe`]); writes are dropped.
pub struct ProbeExport {
    info: ExportInfo,
    probe: Probe,
}

impl ProbeExport {
    /// Every read waits until `n` reads are in flight at once, then answers 0x5a.
    pub fn barrier(n: usize) -> Arc<Self> {
        Self::new(Probe::Barrier(Barrier::new(n)))
    }
    /// Tracks the maximum number of reads in flight at once ([`Self::max`]).
    pub fn counting() -> Arc<Self> {
        Self::new(Probe::Count {
            cur: 0.into(),
            max: 0.into(),
        })
    }
    fn new(probe: Probe) -> Arc<Self> {
        Arc::new(ProbeExport {
            info: ExportInfo::new("", 1 << 20),
            probe,
        })
    }
    /// The most reads seen in flight at once (counting exports only).
    pub fn max(&self) -> usize {
        match &self.probe {
            Probe::Count { max, .. } => max.load(Ordering::SeqCst),
            Probe::Barrier(_) => panic!("a barrier export does not count"),
        }
    }
}

impl Export for ProbeExport {
    fn info(&self) -> ExportInfo {
        self.info.clone()
    }
    fn read(&self, _ctx: RequestCtx, _offset: u64, len: u32) -> BoxFuture<'_, NbdResult<Bytes>> {
        Box::pin(async move {
            match &self.probe {
                Probe::Barrier(b) => {
                    b.wait().await;
                    Ok(Bytes::from(vec![0x5a; len as usize]))
                }
                Probe::Count { cur, max } => {
                    let now = cur.fetch_add(1, Ordering::SeqCst) + 1;
                    max.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    cur.fetch_sub(1, Ordering::SeqCst);
                    Ok(Bytes::from(vec![0; len as usize]))
                }
            }
        })
    }
    fn write(&self, _: RequestCtx, _: u64, _: Bytes, _: bool) -> OpFuture<'_> {
        Box::pin(async { Ok(()) })
    }
}

/// Panics on reads at offset 0, returns a short buffer at offset 512,
/// an empty extent list for block status, and ENOTSUP for fast zero.
pub struct BuggyExport {
    pub inner: MemoryExport,
}

impl Export for BuggyExport {
    memory_info_and_write!();
    fn read(&self, ctx: RequestCtx, offset: u64, len: u32) -> BoxFuture<'_, NbdResult<Bytes>> {
        if offset == 0 {
            panic!("deliberate test panic in export read");
        }
        if offset == 512 {
            return Box::pin(async { Ok(Bytes::from_static(b"short")) });
        }
        self.inner.read(ctx, offset, len)
    }
    fn write_zeroes(
        &self,
        ctx: RequestCtx,
        offset: u64,
        len: u32,
        flags: WriteZeroesFlags,
    ) -> OpFuture<'_> {
        if flags.fast_zero {
            return Box::pin(async { Err(NbdError::notsup("zeroing is not fast here")) });
        }
        self.inner.write_zeroes(ctx, offset, len, flags)
    }
    fn block_status(&self, _: RequestCtx, _: u64, _: u32) -> BoxFuture<'_, NbdResult<Vec<Extent>>> {
        Box::pin(async { Ok(vec![]) })
    }
}

/// What [`DirectExport::write_direct`] does with a payload.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum DirectMode {
    /// Receive it all, then store it.
    All,
    /// Receive the first half, then fail the write (the server skips the rest).
    Half,
    /// Decline (the server reads the payload and calls `write`).
    Decline,
}

/// Memory, with a `write_direct` that receives payloads itself.
pub struct DirectExport {
    pub inner: MemoryExport,
    mode: DirectMode,
    pub direct_calls: AtomicUsize,
}

impl DirectExport {
    pub fn new(size: u64, mode: DirectMode) -> Arc<Self> {
        Arc::new(DirectExport {
            inner: MemoryExport::with_size("", size),
            mode,
            direct_calls: AtomicUsize::new(0),
        })
    }
}

impl Export for DirectExport {
    memory_info_and_write!();
    fn read(&self, ctx: RequestCtx, offset: u64, len: u32) -> BoxFuture<'_, NbdResult<Bytes>> {
        self.inner.read(ctx, offset, len)
    }
    fn write_direct(
        self: Arc<Self>,
        ctx: RequestCtx,
        offset: u64,
        len: u32,
        fua: bool,
        src: &mut DirectSource<'_>,
    ) -> Option<OpFuture<'static>> {
        assert_eq!(
            src.remaining(),
            len as usize,
            "the whole payload is offered"
        );
        if self.mode == DirectMode::Decline {
            return None;
        }
        self.direct_calls.fetch_add(1, Ordering::SeqCst);
        let take = if self.mode == DirectMode::Half {
            len / 2
        } else {
            len
        };
        let mut buf = vec![0u8; take as usize];
        let got = src.recv(&mut buf);
        // Past the payload's end: refused, nothing taken.
        assert!(src.recv(&mut vec![0u8; src.remaining() + 1]).is_err());
        Some(Box::pin(async move {
            got.map_err(|e| NbdError::io(e.to_string()))?;
            if self.mode == DirectMode::Half {
                return Err(NbdError::io("stopped half-way"));
            }
            self.inner.write(ctx, offset, Bytes::from(buf), fua).await
        }))
    }
}
