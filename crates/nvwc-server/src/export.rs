//! One export as the NBD server sees it ([`NvwcExport`]): a client request
//! becomes engine requests on the export's host (split at
//! [`max_request`]-sized block runs), tagged for admission by the
//! connection's hints, timed into the latency histograms (`metrics.rs`).

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use nvwc_core::layout;
use nvwc_core::{ReqError, ReqOp, Tag, WritePolicyKind};
use nvwc_nbd::export::{
    BoxFuture, Export, ExportInfo, NbdResult, OpFuture, RequestCtx, WriteZeroesFlags,
};
use nvwc_nbd::NbdError;

use crate::host;
use crate::metrics::Latency;

/// Largest READ/WRITE payload every export advertises and accepts
/// (`NBD_INFO_BLOCK_SIZE`), whatever its cache size and write policy: the
/// NBD spec's 32 MiB, what a client that negotiated nothing may send, and
/// the most qemu's client ever asks for. Writes longer than the engine takes
/// at once are split into several engine writes ([`NvwcExport::split`]).
pub(crate) const MAX_PAYLOAD: u32 = 32 << 20;

/// One export: its engine host, as the NBD server sees it.
pub(crate) struct NvwcExport {
    pub(crate) host: Arc<host::Host>,
    pub(crate) info: ExportInfo,
    /// Cache block size.
    pub(crate) block: u64,
    /// Most cache blocks one engine request may span: longer client
    /// requests are split ([`NvwcExport::split`]).
    pub(crate) split_blocks: u64,
    /// Request latency per class: `[normal, critical]` (admission hints).
    pub(crate) lat: [Latency; 2],
    /// Every request of this export is critical (`--export NAME:critical`;
    /// a configuration file's `critical`, which `SIGHUP` reloads).
    pub(crate) critical: std::sync::atomic::AtomicBool,
    /// Connections marked critical by `nvwc hint` (looked up only while
    /// `hinted` is non-zero, so unhinted serving takes no lock).
    pub(crate) hints: Mutex<std::collections::HashSet<u64>>,
    pub(crate) hinted: AtomicU64,
    /// The cache device (a handle for its superblock) and its superblock as
    /// bound at start: `nvwc detach` marks it emptied.
    pub(crate) cache_path: PathBuf,
    pub(crate) cache_meta: File,
    pub(crate) superblock: layout::Superblock,
}

fn nbd_err(e: ReqError) -> NbdError {
    match e {
        ReqError::InvalidRange => NbdError::inval(e.to_string()),
        ReqError::TooLarge => NbdError::inval(e.to_string()),
        ReqError::NoSpace => NbdError::nospc(e.to_string()),
        ReqError::Io => NbdError::io(e.to_string()),
        ReqError::Shutdown => NbdError::new(nvwc_nbd::ErrorCode::Shutdown, e.to_string()),
    }
}

impl NvwcExport {
    /// The admission tag of a request on connection `conn`.
    pub(crate) fn tag(&self, conn: u64) -> Tag {
        let critical = self.critical.load(Ordering::Relaxed)
            || self.hinted.load(Ordering::Relaxed) > 0
                && self.hints.lock().unwrap().contains(&conn);
        Tag {
            client: conn as u32,
            critical,
            sync: false,
        }
    }

    /// Set or clear a connection's critical hint.
    pub(crate) fn set_hint(&self, conn: u64, on: bool) {
        let mut h = self.hints.lock().unwrap();
        if on {
            h.insert(conn);
        } else {
            h.remove(&conn);
        }
        self.hinted.store(h.len() as u64, Ordering::Relaxed);
    }

    async fn call(&self, ctx: &RequestCtx, op: ReqOp<Bytes>) -> NbdResult<Option<Bytes>> {
        self.calls(ctx, std::iter::once(op)).await
    }

    /// Run `ops`, the engine requests one client request stands for, one
    /// after another: each is submitted once the one before it has
    /// completed (replied), and the first error ends the request. Returns the
    /// last one's reply; the latency recorded is the client request's.
    async fn calls(
        &self,
        ctx: &RequestCtx,
        ops: impl Iterator<Item = ReqOp<Bytes>> + Send,
    ) -> NbdResult<Option<Bytes>> {
        let tag = self.tag(ctx.conn_id);
        let t = Instant::now();
        let mut kind = None;
        let mut out = Ok(None);
        for op in ops {
            kind.get_or_insert(match &op {
                ReqOp::Read { .. } => 0,
                ReqOp::Write { .. } => 1,
                ReqOp::Flush | ReqOp::Checkpoint => 2,
                ReqOp::Trim { .. } => 3,
                ReqOp::WriteZeroes { .. } => 4,
            });
            if matches!(
                op,
                ReqOp::Write { .. } | ReqOp::WriteZeroes { .. } | ReqOp::Trim { .. }
            ) && self.host.degraded()
            {
                // Refused before any device sees it: the export is read-only now.
                out = Err(NbdError::perm(
                    "the cache device failed: the export is read-only until the server restarts",
                ));
                break;
            }
            out = match self.host.call(op, tag).await {
                Ok(reply) => reply.result.map_err(nbd_err),
                Err(e) => Err(nbd_err(e)),
            };
            if out.is_err() {
                break;
            }
        }
        if let Some(kind) = kind {
            self.lat[tag.critical as usize].record(kind, t.elapsed().as_micros() as u64);
        }
        out
    }

    /// Split `len` bytes at `offset` into the engine requests a client
    /// request becomes: cut at block boundaries, each spanning at most
    /// `split_blocks` blocks, so that none is larger than the engine takes
    /// (`Engine::max_write_bytes`) or than a checkpoint group is sized for.
    /// A request that fits is one. NBD gives a multi-block request no
    /// atomicity, and each engine request keeps its write policy's
    /// guarantee (`docs/ARCHITECTURE.md`, "Requests of every advertised size").
    /// [`calls`](Self::calls) of `op` for each engine-sized piece (see
    /// [`split`](Self::split)) of the `len` bytes at `offset`.
    async fn pieces(
        &self,
        ctx: &RequestCtx,
        offset: u64,
        len: u32,
        op: impl Fn(u64, u32) -> ReqOp<Bytes> + Send,
    ) -> NbdResult<()> {
        let ops = self
            .split(offset, u64::from(len))
            .map(move |(offset, len)| op(offset, len as u32));
        self.calls(ctx, ops).await.map(|_| ())
    }

    fn split(&self, offset: u64, len: u64) -> impl Iterator<Item = (u64, u64)> + Send {
        let (bs, n, end) = (self.block, self.split_blocks, offset + len);
        let mut at = offset;
        std::iter::from_fn(move || {
            (at < end).then(|| {
                let next = ((at / bs + n) * bs).min(end);
                let range = (at, next - at);
                at = next;
                range
            })
        })
    }
}

impl Export for NvwcExport {
    fn info(&self) -> ExportInfo {
        self.info.clone()
    }
    fn read(&self, ctx: RequestCtx, offset: u64, len: u32) -> BoxFuture<'_, NbdResult<Bytes>> {
        Box::pin(async move {
            Ok(self
                .call(&ctx, ReqOp::Read { offset, len })
                .await?
                .unwrap_or_default())
        })
    }
    fn write(&self, ctx: RequestCtx, offset: u64, data: Bytes, fua: bool) -> OpFuture<'_> {
        Box::pin(async move {
            // Each engine write is a view of the one payload buffer (no
            // copy) and carries the FUA flag: the reply waits until all of
            // them are durable.
            let ops = self
                .split(offset, data.len() as u64)
                .map(|(o, len)| ReqOp::Write {
                    offset: o,
                    data: data.slice((o - offset) as usize..(o - offset + len) as usize),
                    fua,
                });
            self.calls(&ctx, ops).await.map(|_| ())
        })
    }
    fn write_direct(
        self: Arc<Self>,
        ctx: RequestCtx,
        offset: u64,
        len: u32,
        fua: bool,
        src: &mut nvwc_nbd::DirectSource<'_>,
    ) -> Option<OpFuture<'static>> {
        if self.host.degraded() {
            // `write` refuses it (read-only now).
            return None;
        }
        if self.split(offset, u64::from(len)).nth(1).is_some() {
            // Longer than one engine request: `write` splits it.
            return None;
        }
        let tag = self.tag(ctx.conn_id);
        let t = Instant::now();
        let pending = self
            .host
            .call_direct(offset, u64::from(len), fua, tag, &mut |dst| src.recv(dst))?;
        Some(Box::pin(async move {
            let r = match pending.get().await {
                Ok(reply) => reply.result.map(|_| ()).map_err(nbd_err),
                Err(e) => Err(nbd_err(e)),
            };
            self.lat[tag.critical as usize].record(1, t.elapsed().as_micros() as u64);
            r
        }))
    }
    fn flush(&self, ctx: RequestCtx) -> OpFuture<'_> {
        Box::pin(async move { self.call(&ctx, ReqOp::Flush).await.map(|_| ()) })
    }
    fn replies_sending(&self) {
        self.host.replies_sending();
    }
    fn trim(&self, ctx: RequestCtx, offset: u64, len: u32, fua: bool) -> OpFuture<'_> {
        Box::pin(async move {
            self.pieces(&ctx, offset, len, |offset, len| ReqOp::Trim { offset, len })
                .await?;
            if fua {
                self.call(&ctx, ReqOp::Flush).await?;
            }
            Ok(())
        })
    }
    fn write_zeroes(
        &self,
        ctx: RequestCtx,
        offset: u64,
        len: u32,
        flags: WriteZeroesFlags,
    ) -> OpFuture<'_> {
        Box::pin(async move {
            if flags.fast_zero {
                // Zeroes are written like data: not faster than a write.
                return Err(NbdError::new(nvwc_nbd::ErrorCode::NotSup, "no fast zero"));
            }
            self.pieces(&ctx, offset, len, |offset, len| ReqOp::WriteZeroes {
                offset,
                len,
                fua: flags.fua,
            })
            .await
        })
    }
    fn cache(&self, ctx: RequestCtx, offset: u64, len: u32) -> OpFuture<'_> {
        // A read fills the cache (read-allocate).
        Box::pin(async move {
            self.pieces(&ctx, offset, len, |offset, len| ReqOp::Read { offset, len })
                .await
        })
    }
}

/// Largest request the engine sees (client requests are split to it,
/// `NvwcExport::split`): what the engine accepts (half the cache), at most
/// the largest client payload, and 8 MiB for journaled over NBD, where it
/// bounds a checkpoint group in the redo region.
pub(crate) fn max_request(capacity: u64, bs: u64, upstream: bool, wp: WritePolicyKind) -> u64 {
    ((capacity / 2).max(1) * bs)
        .min(if upstream && wp.is_journaled() {
            8 << 20
        } else {
            u64::from(MAX_PAYLOAD)
        })
        .max(bs)
        / bs
        * bs
}
