//! An upstream NBD backing store, and the redo-log region nvwc keeps at its
//! end so that journaled checkpoints are atomic on a foreign NBD server.
//!
//! Layout (`docs/BACKING-FORMAT.md`): with a region, the last `R` bytes of
//! the upstream export are nvwc's, and nvwc exports only what lies before
//! them. Let `S` be the upstream size rounded down to 4 KiB:
//!
//! * the **trailer**, the 4 KiB block at `S - 4096`, names the region
//!   (magic, version, upstream size, region start, log length, uuid, CRC).
//!   It is written once, when the region is created, and never again;
//! * the **log area**, `[start, S - 4096)`: a 4 KiB log header, then the log
//!   body (the group's records).
//!
//! A checkpoint group is committed as: (1) write the header and the body
//! (one write), FLUSH; (2) write every record in place, FLUSH. That is the
//! one redo-log protocol (`nvwc-dev/src/redo.rs`, which also finishes a
//! group an earlier commit left half applied), run over this region as its
//! log store ([`RegionLog`]) and the upstream as its device
//! ([`UpstreamDev`]), both blocking on the client's runtime. Crash story:
//! before (1)'s FLUSH returns, the header or body may be torn or missing
//! (theirs or the previous group's): the header's and body's CRCs fail and
//! replay does nothing; the in-place writes have not started, so the
//! upstream holds the previous checkpoint. After it, the log is complete:
//! replay (on open, or `nvwc recover --backing nbd://...`) writes every
//! record again (writing twice is harmless), FLUSHes, and clears the header
//! (zeroes, FLUSH). The header of a group already applied stays until the
//! next group's replaces it: replaying it writes bytes the upstream already
//! holds, since a write outside a group first clears it, durably
//! (`Redo::settle`; `device.rs` routes such writes through it).

use std::ops::Deref;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use nvwc_dev::block::BlockDevice;
use nvwc_dev::redo::{LogStore, Redo};
use nvwc_nbd::Client;

use crate::label::{Label, LABEL_BYTES};

const TRAILER_MAGIC: &[u8; 8] = b"NVWCRGN1";
const LOG_MAGIC: &[u8; 8] = b"NVWCRLOG";
const BLOCK: u64 = 4096;
/// Region start is aligned to this (so every block size up to 1 MiB fits).
const ALIGN: u64 = 1 << 20;
/// In-place writes of a group in flight at once.
const APPLY_DEPTH: usize = 64;

/// Run the futures concurrently; the first error wins (the rest still finish).
async fn join_all<T, E, F>(futs: Vec<F>) -> Result<(), E>
where
    F: std::future::Future<Output = Result<T, E>>,
{
    let mut futs: Vec<Option<std::pin::Pin<Box<F>>>> =
        futs.into_iter().map(|f| Some(Box::pin(f))).collect();
    let mut err = None;
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for slot in futs.iter_mut() {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(r) => {
                        if let Err(e) = r {
                            err.get_or_insert(e);
                        }
                        *slot = None;
                    }
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    err.map_or(Ok(()), Err)
}

/// Where the region is, as read from (or written to) the trailer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RedoRegion {
    /// First byte of the region = bytes nvwc exports.
    pub start: u64,
    /// Bytes of the log area (header + body).
    pub log_len: u64,
    /// Offset of the trailer block.
    pub trailer: u64,
    pub uuid: u64,
}

impl RedoRegion {
    fn encode_trailer(&self, upstream_size: u64) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK as usize];
        b[0..8].copy_from_slice(TRAILER_MAGIC);
        b[8..12].copy_from_slice(&1u32.to_le_bytes());
        b[16..24].copy_from_slice(&upstream_size.to_le_bytes());
        b[24..32].copy_from_slice(&self.start.to_le_bytes());
        b[32..40].copy_from_slice(&self.log_len.to_le_bytes());
        b[40..48].copy_from_slice(&self.uuid.to_le_bytes());
        let crc = crc32fast::hash(&b[..48]);
        b[48..52].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn decode_trailer(b: &[u8], trailer: u64) -> Option<RedoRegion> {
        if b.len() < 52 || &b[0..8] != TRAILER_MAGIC {
            return None;
        }
        let u64at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if crc32fast::hash(&b[..48]) != u32::from_le_bytes(b[48..52].try_into().expect("4 bytes")) {
            return None;
        }
        let r = RedoRegion {
            start: u64at(24),
            log_len: u64at(32),
            trailer,
            uuid: u64at(40),
        };
        (r.start + r.log_len == trailer && r.log_len > BLOCK).then_some(r)
    }

    /// Encode a group as a log: header block, then the body padded to 4 KiB.
    fn encode_log(&self, writes: &[(u64, Bytes)]) -> Vec<u8> {
        let mut body = Vec::new();
        for (off, d) in writes {
            body.extend_from_slice(&off.to_le_bytes());
            body.extend_from_slice(&(d.len() as u64).to_le_bytes());
            body.extend_from_slice(d);
        }
        let body_len = body.len() as u64;
        body.resize(body_len.div_ceil(BLOCK) as usize * BLOCK as usize, 0);
        let mut log = vec![0u8; BLOCK as usize];
        log[0..8].copy_from_slice(LOG_MAGIC);
        log[8..16].copy_from_slice(&(writes.len() as u64).to_le_bytes());
        log[16..24].copy_from_slice(&body_len.to_le_bytes());
        log[24..28].copy_from_slice(&crc32fast::hash(&body[..body_len as usize]).to_le_bytes());
        log[28..36].copy_from_slice(&self.uuid.to_le_bytes());
        let hcrc = crc32fast::hash(&log[..36]);
        log[36..40].copy_from_slice(&hcrc.to_le_bytes());
        log.extend_from_slice(&body);
        log
    }

    /// Parse a log header: `(records, body_len)` if it is a valid header of this region.
    fn decode_header(&self, h: &[u8]) -> Option<(u64, u64)> {
        if &h[0..8] != LOG_MAGIC
            || crc32fast::hash(&h[..36]) != u32::from_le_bytes(h[36..40].try_into().expect("4"))
            || u64::from_le_bytes(h[28..36].try_into().expect("8")) != self.uuid
        {
            return None;
        }
        let n = u64::from_le_bytes(h[8..16].try_into().expect("8"));
        let body_len = u64::from_le_bytes(h[16..24].try_into().expect("8"));
        (body_len <= self.log_len - BLOCK).then_some((n, body_len))
    }
}

/// The index of the smallest of `loads` (the first on a tie; 0 if empty).
fn least_loaded(loads: impl Iterator<Item = usize>) -> usize {
    let mut best = (usize::MAX, 0);
    for (i, n) in loads.enumerate() {
        if n < best.0 {
            best = (n, i);
        }
    }
    best.1
}

/// Decode a log body into its records (`None` if the CRC or framing is wrong).
fn decode_body(body: &[u8], n: u64, crc: u32) -> Option<Vec<(u64, Bytes)>> {
    if crc32fast::hash(body) != crc {
        return None;
    }
    let mut out = Vec::new();
    let mut at = 0usize;
    for _ in 0..n {
        let hdr = body.get(at..at + 16)?;
        let off = u64::from_le_bytes(hdr[..8].try_into().expect("8"));
        let len = u64::from_le_bytes(hdr[8..].try_into().expect("8")) as usize;
        let d = body.get(at + 16..at + 16 + len)?;
        out.push((off, Bytes::copy_from_slice(d)));
        at += 16 + len;
    }
    (at == body.len()).then_some(out)
}

/// Bytes of log area a group of `max_group_bytes` in `max_records` records needs.
pub fn log_bytes_needed(max_group_bytes: u64, max_records: u64) -> u64 {
    BLOCK + (max_group_bytes + 16 * max_records).div_ceil(BLOCK) * BLOCK
}

/// The upstream NBD backing store: nvwc's client plus, when present, the redo region.
pub struct Upstream {
    client: Client,
    /// Further connections to the same export ([`Upstream::connect_more`]),
    /// for the hot path's reads, writes and FLUSHes ([`Upstream::pick`]).
    /// The redo region, the label and replay use `client` alone.
    more: Vec<Client>,
    region: Option<RedoRegion>,
}

impl Deref for Upstream {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl Upstream {
    /// Connect to `uri` through `rt`, which MUST be a multi-thread
    /// runtime's (call it outside the runtime). An existing region is
    /// always honoured (and a pending log replayed); with
    /// `want_log_len = Some(n)` and no region, a region with `n` bytes of
    /// log area is created.
    pub fn open(
        uri: &str,
        want_log_len: Option<u64>,
        rt: &tokio::runtime::Handle,
    ) -> Result<(Upstream, usize)> {
        let mut up = rt.block_on(Upstream::connect(uri))?;
        if let Some(want) = want_log_len {
            rt.block_on(up.ensure_region(want))?;
        }
        let replayed = up.replay(rt)?;
        Ok((up, replayed))
    }

    /// Finish a logged group after a crash (through `rt`, which MUST be a
    /// multi-thread runtime's: a current-thread runtime's handle cannot
    /// drive the client while this thread blocks; call it outside the
    /// runtime). Returns how many records it applied.
    pub fn replay(&self, rt: &tokio::runtime::Handle) -> Result<usize> {
        assert_eq!(
            rt.runtime_flavor(),
            tokio::runtime::RuntimeFlavor::MultiThread,
            "the upstream's redo log blocks on a multi-thread runtime"
        );
        let dev = UpstreamDev {
            up: self,
            rt: rt.clone(),
        };
        let log = RegionLog {
            up: self,
            rt: rt.clone(),
        };
        Ok(Redo::new(log).replay(&dev)?)
    }

    /// Connect to `uri` and find its region, writing nothing.
    pub async fn connect(uri: &str) -> Result<Upstream> {
        let client = Client::connect(uri)
            .await
            .with_context(|| format!("connecting to {uri}"))?;
        let mut up = Upstream {
            client,
            more: Vec::new(),
            region: None,
        };
        let aligned = up.client.size() / BLOCK * BLOCK;
        if aligned >= BLOCK {
            let t = up.read_all(aligned - BLOCK, BLOCK).await?;
            up.region = RedoRegion::decode_trailer(&t, aligned - BLOCK);
        }
        Ok(up)
    }

    /// Open connections to `uri` until there are `n`, if the export
    /// advertises `NBD_FLAG_CAN_MULTI_CONN`; returns how many are open.
    /// Why: a server bounds how many requests it runs at once per
    /// connection (nbdkit: 16 threads each), so over a slow upstream one
    /// connection queues what a client of the bare upstream, with several,
    /// would not (nbdfuse and nbdcopy open 4 where multi-conn is offered).
    /// Multi-conn is what makes this safe (NBD spec, `CAN_MULTI_CONN`):
    /// every connection sees one cache, so a FLUSH sent on any of them
    /// covers the writes completed on all, and a read on one sees a write
    /// completed on another. Without it, one connection is kept: a FLUSH
    /// would not be known to cover another connection's writes.
    pub async fn connect_more(&mut self, uri: &str, n: usize) -> Result<usize> {
        if !self.client.info().can_multi_conn() {
            return Ok(1);
        }
        while self.more.len() + 1 < n {
            let c = Client::connect(uri)
                .await
                .with_context(|| format!("connecting to {uri} again (multi-conn)"))?;
            if c.size() != self.client.size() || c.info().name != self.client.info().name {
                bail!(
                    "{uri} answered a second connection with another export ({} bytes, not {})",
                    c.size(),
                    self.client.size()
                );
            }
            self.more.push(c);
        }
        Ok(1 + self.more.len())
    }

    /// The connection for the next hot-path command: the one with the
    /// fewest requests in flight (the first on a tie).
    pub fn pick(&self) -> &Client {
        if self.more.is_empty() {
            return &self.client;
        }
        let loads = std::iter::once(&self.client)
            .chain(&self.more)
            .map(|c| c.in_flight());
        match least_loaded(loads) {
            0 => &self.client,
            i => &self.more[i - 1],
        }
    }

    /// Where a region with `want_log_len` bytes of log area would start
    /// (the existing region's start if there is one).
    pub fn planned_start(&self, want_log_len: u64) -> Result<u64> {
        if let Some(r) = self.region {
            return Ok(r.start);
        }
        let size = self.client.size();
        let want = want_log_len.div_ceil(BLOCK) * BLOCK;
        let trailer = (size / BLOCK * BLOCK).saturating_sub(BLOCK);
        let start = trailer.saturating_sub(want) / ALIGN * ALIGN;
        if start == 0 {
            bail!("upstream ({size} bytes) is too small for a {want}-byte redo region");
        }
        Ok(start)
    }

    /// Create a region with `want_log_len` bytes of log area unless there is
    /// one. Returns whether it created one.
    pub async fn ensure_region(&mut self, want_log_len: u64) -> Result<bool> {
        if self.region.is_some() {
            return Ok(false);
        }
        let start = self.planned_start(want_log_len)?;
        let size = self.client.size();
        let trailer = size / BLOCK * BLOCK - BLOCK;
        let r = RedoRegion {
            start,
            log_len: trailer - start,
            trailer,
            uuid: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1),
        };
        // An empty log header first, then the trailer that makes the
        // region exist: a crash in between leaves no region at all.
        self.write_all(start, &vec![0u8; BLOCK as usize]).await?;
        self.client.flush().await?;
        self.write_all(trailer, &r.encode_trailer(size)).await?;
        self.client.flush().await?;
        self.region = Some(r);
        Ok(true)
    }

    /// Where the label lives: the second sector of the region's trailer block.
    fn label_offset(&self) -> Option<u64> {
        self.region.map(|r| r.trailer + LABEL_BYTES as u64)
    }

    /// The label in the region, if there is a region and it carries one.
    pub async fn read_label(&self) -> Result<Option<Label>> {
        let (Some(at), Some(r)) = (self.label_offset(), self.region) else {
            return Ok(None);
        };
        let b = self.client.read(at, LABEL_BYTES as u32).await?;
        Ok(Label::decode(&b, at).filter(|l| l.data_len == r.start))
    }

    /// A label for this upstream (`None` without a region).
    pub fn label_for(&self, uuid: [u8; 16], cache: u64) -> Option<Label> {
        Some(Label {
            uuid,
            cache,
            data_len: self.region?.start,
            offset: self.label_offset()?,
        })
    }

    /// Write the label's sector and FLUSH.
    pub async fn write_label(&self, l: &Label) -> Result<()> {
        self.client
            .write(l.offset, Bytes::from(l.encode()), false)
            .await?;
        self.client.flush().await?;
        Ok(())
    }

    /// The region, if this upstream has one.
    pub fn region(&self) -> Option<RedoRegion> {
        self.region
    }

    /// Bytes nvwc may use: everything before the region.
    pub fn usable(&self) -> u64 {
        self.region.map_or(self.client.size(), |r| r.start)
    }

    /// Write `data` at `off` in requests of at most the upstream's maximum
    /// block size (a destage run may be larger), `fua` on each, all in
    /// flight at once.
    pub async fn write_split(&self, off: u64, data: Bytes, fua: bool) -> Result<()> {
        let chunk = self.chunk() as usize;
        if data.len() <= chunk {
            return Ok(self.pick().write(off, data, fua).await?);
        }
        let pieces: Vec<_> = (0..data.len())
            .step_by(chunk)
            .map(|at| {
                let piece = data.slice(at..(at + chunk).min(data.len()));
                self.pick().write(off + at as u64, piece, fua)
            })
            .collect();
        Ok(join_all(pieces).await?)
    }

    /// Read `len` bytes at `off` in requests of at most the upstream's
    /// maximum block size, all in flight at once.
    pub async fn read_split(&self, off: u64, len: u32) -> Result<Bytes> {
        let chunk = self.chunk() as u32;
        if len <= chunk {
            return Ok(self.pick().read(off, len).await?);
        }
        let starts: Vec<u32> = (0..len).step_by(chunk as usize).collect();
        let got: Vec<std::sync::Mutex<Bytes>> = starts.iter().map(|_| Default::default()).collect();
        let pieces: Vec<_> = starts
            .iter()
            .zip(&got)
            .map(|(&at, slot)| async move {
                let d = self
                    .pick()
                    .read(off + u64::from(at), chunk.min(len - at))
                    .await?;
                *slot.lock().expect("a piece's slot") = d;
                Ok::<(), nvwc_nbd::ClientError>(())
            })
            .collect();
        join_all(pieces).await?;
        let mut out = bytes::BytesMut::with_capacity(len as usize);
        for g in &got {
            out.extend_from_slice(&g.lock().expect("a piece's slot"));
        }
        Ok(out.freeze())
    }

    fn chunk(&self) -> u64 {
        u64::from(self.client.info().max_block).clamp(BLOCK, 4 << 20) / BLOCK * BLOCK
    }

    async fn read_all(&self, off: u64, len: u64) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(len as usize);
        let mut at = 0;
        while at < len {
            let n = (len - at).min(self.chunk());
            out.extend_from_slice(&self.client.read(off + at, n as u32).await?);
            at += n;
        }
        Ok(out)
    }

    async fn write_all(&self, off: u64, data: &[u8]) -> Result<()> {
        let mut at = 0;
        while at < data.len() {
            let n = (data.len() - at).min(self.chunk() as usize);
            self.client
                .write(
                    off + at as u64,
                    Bytes::copy_from_slice(&data[at..at + n]),
                    false,
                )
                .await?;
            at += n;
        }
        Ok(())
    }

    /// Write every record in place, [`APPLY_DEPTH`] requests in flight at a
    /// time (the records of one group may go in any order: the group is
    /// durable only at the FLUSH that follows).
    async fn apply(&self, writes: &[(u64, Bytes)]) -> Result<()> {
        let mut pieces = Vec::new();
        for (off, d) in writes {
            let mut at = 0;
            while at < d.len() {
                let n = (d.len() - at).min(self.chunk() as usize);
                pieces.push((off + at as u64, d.slice(at..at + n)));
                at += n;
            }
        }
        for batch in pieces.chunks(APPLY_DEPTH) {
            let futs = batch
                .iter()
                .map(|(off, d)| self.client.write(*off, d.clone(), false))
                .collect();
            join_all(futs).await?;
        }
        Ok(())
    }

    /// Step (1): the group's log, body first, header last, in one pass
    /// (the CRCs catch any tearing), then FLUSH.
    async fn log_put(&self, writes: &[(u64, Bytes)]) -> Result<()> {
        let r = self.region.context("no redo region on this upstream")?;
        let log = r.encode_log(writes);
        if log.len() as u64 > r.log_len {
            bail!(
                "checkpoint group of {} bytes does not fit the {}-byte redo region",
                log.len(),
                r.log_len
            );
        }
        // Header and body together: the header carries the body's CRC, so a
        // header that lands without its whole body is not replayed.
        self.write_all(r.start, &log).await?;
        self.client.flush().await?;
        Ok(())
    }

    /// The logged group, if the region holds a complete one.
    async fn log_get(&self) -> Result<Option<Vec<(u64, Bytes)>>> {
        let Some(r) = self.region else {
            return Ok(None);
        };
        let h = self.read_all(r.start, BLOCK).await?;
        let Some((n, body_len)) = r.decode_header(&h) else {
            return Ok(None);
        };
        let crc = u32::from_le_bytes(h[24..28].try_into().expect("4"));
        let body = self.read_all(r.start + BLOCK, body_len).await?;
        // A torn body: the group never started applying; nothing to do.
        Ok(decode_body(&body, n, crc))
    }

    /// Step (3): overwrite the header with zeroes, FLUSH.
    async fn log_clear(&self) -> Result<()> {
        let r = self.region.context("no redo region on this upstream")?;
        self.write_all(r.start, &[0u8; BLOCK as usize]).await?;
        self.client.flush().await?;
        Ok(())
    }
}

/// An error of the upstream, for the device interface (the whole chain in
/// its message, for the `redo_commit_failed` log line).
fn io_err(e: anyhow::Error) -> std::io::Error {
    std::io::Error::other(format!("{e:#}"))
}

/// The upstream as a block device, blocking on the client's runtime `rt`
/// (from a worker thread, never a runtime thread). A batch keeps
/// [`APPLY_DEPTH`] writes in flight. `U`: `&Upstream` or `Arc<Upstream>`.
pub struct UpstreamDev<U> {
    pub up: U,
    pub rt: tokio::runtime::Handle,
}

impl<U: Deref<Target = Upstream>> BlockDevice for UpstreamDev<U> {
    fn read(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let got = self
            .rt
            .block_on(self.up.read_all(offset, buf.len() as u64))
            .map_err(io_err)?;
        buf.copy_from_slice(&got);
        Ok(())
    }
    fn write(&self, offset: u64, parts: &[&[u8]], fua: bool) -> std::io::Result<()> {
        let data = Bytes::from(parts.concat());
        self.rt
            .block_on(self.up.client.write(offset, data, fua))
            .map_err(|e| io_err(e.into()))
    }
    fn write_batch(&self, writes: &[(u64, Bytes)]) -> std::io::Result<()> {
        self.rt.block_on(self.up.apply(writes)).map_err(io_err)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.rt
            .block_on(self.up.client.flush())
            .map_err(|e| io_err(e.into()))
    }
    fn trim(&self, _offset: u64, _len: u64) -> std::io::Result<()> {
        Ok(())
    }
}

/// The redo region as the redo log's store (module docs).
pub struct RegionLog<U> {
    pub up: U,
    pub rt: tokio::runtime::Handle,
}

impl<U: Deref<Target = Upstream>> LogStore for RegionLog<U> {
    fn put(&self, writes: &[(u64, Bytes)]) -> std::io::Result<()> {
        self.rt.block_on(self.up.log_put(writes)).map_err(io_err)
    }
    fn get(&self) -> std::io::Result<Option<Vec<(u64, Bytes)>>> {
        self.rt.block_on(self.up.log_get()).map_err(io_err)
    }
    fn clear(&self) -> std::io::Result<()> {
        self.rt.block_on(self.up.log_clear()).map_err(io_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region() -> RedoRegion {
        RedoRegion {
            start: 63 << 20,
            log_len: (1 << 20) - BLOCK,
            trailer: (64 << 20) - BLOCK,
            uuid: 42,
        }
    }

    #[test]
    fn trailer_round_trip_and_corruption() {
        let r = region();
        let t = r.encode_trailer(64 << 20);
        assert_eq!(RedoRegion::decode_trailer(&t, r.trailer), Some(r));
        let mut bad = t.clone();
        bad[30] ^= 1;
        assert_eq!(RedoRegion::decode_trailer(&bad, r.trailer), None);
        // A trailer found at another place is not this region's.
        assert_eq!(RedoRegion::decode_trailer(&t, r.trailer + BLOCK), None);
    }

    /// Over a real NBD connection (an in-process memory server): a region is
    /// created once and found again; a group logged but not applied (a crash
    /// between steps 1 and 2) is replayed on open; a torn log is not; a
    /// committed group is applied and leaves nothing to replay.
    /// A runtime with one worker, for a test's server and client.
    fn one_thread_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    }

    /// A fresh directory for this test process (`prefix` names the test).
    fn test_dir(prefix: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("{prefix}{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A 64 MiB in-memory NBD export on a unix socket in `dir`: the server
    /// (keep it while the test runs), its export, and its URI.
    async fn memory_server(
        dir: &std::path::Path,
    ) -> (
        nvwc_nbd::Server,
        std::sync::Arc<nvwc_nbd::MemoryExport>,
        String,
    ) {
        let info = nvwc_nbd::export::ExportInfo::new("", 64 << 20).with_all_features();
        memory_server_with(dir, info).await
    }

    /// As [`memory_server`], the export described by `info`.
    async fn memory_server_with(
        dir: &std::path::Path,
        info: nvwc_nbd::export::ExportInfo,
    ) -> (
        nvwc_nbd::Server,
        std::sync::Arc<nvwc_nbd::MemoryExport>,
        String,
    ) {
        let sock = dir.join("m.sock");
        let _ = std::fs::remove_file(&sock);
        let mem = std::sync::Arc::new(nvwc_nbd::MemoryExport::new(info));
        let server = nvwc_nbd::Server::builder()
            .export(mem.clone())
            .build()
            .unwrap();
        server.listen_unix(&sock).await.unwrap();
        let uri = format!("nbd+unix:///?socket={}", sock.display());
        (server, mem, uri)
    }

    #[test]
    fn region_over_nbd_replays_logged_groups_only() {
        let rt = one_thread_runtime();
        let h = rt.handle();
        let dir = test_dir("nvwc-region-");
        let (server, mem, uri) = rt.block_on(memory_server(&dir));

        // No region unless asked for one.
        let (up, n) = Upstream::open(&uri, None, h).unwrap();
        assert_eq!((up.region(), n, up.usable()), (None, 0, 64 << 20));
        let (up, _) = Upstream::open(&uri, Some(2 << 20), h).unwrap();
        let r = up.region().unwrap();
        assert_eq!(
            r.start,
            61 << 20,
            "2 MiB of log + trailer, aligned down to 1 MiB"
        );
        assert_eq!(up.usable(), r.start);
        // Found again, whatever size is asked for now.
        let (up, _) = Upstream::open(&uri, Some(8 << 20), h).unwrap();
        assert_eq!(up.region(), Some(r));

        let g1 = vec![
            (0u64, Bytes::from(vec![1u8; 8192])),
            (1 << 20, Bytes::from(vec![2u8; 4096])),
        ];
        let dev = UpstreamDev {
            up: &up,
            rt: h.clone(),
        };
        let log = RegionLog {
            up: &up,
            rt: h.clone(),
        };
        Redo::new(log).commit(&dev, &g1).unwrap();
        assert_eq!(mem.contents(0, 8192), vec![1u8; 8192]);
        assert_eq!(mem.contents(1 << 20, 4096), vec![2u8; 4096]);
        // The applied group's header stays (two syncs a group, not three):
        // replaying it rewrites the same bytes, then clears it.
        assert_eq!(up.replay(h).unwrap(), 2);
        assert_eq!(mem.contents(0, 8192), vec![1u8; 8192]);
        assert_eq!(up.replay(h).unwrap(), 0);

        // Crash after the log's FLUSH, before any in-place write.
        let g2 = vec![
            (4096u64, Bytes::from(vec![3u8; 4096])),
            (5 << 20, Bytes::from(vec![4u8; 100])),
        ];
        let log = r.encode_log(&g2);
        rt.block_on(up.write_all(r.start, &log)).unwrap();
        rt.block_on(up.flush()).unwrap();
        assert_eq!(mem.contents(4096, 4096), vec![1u8; 4096], "not applied yet");
        let (up, n) = Upstream::open(&uri, None, h).unwrap();
        assert_eq!(n, 2, "replayed on open");
        assert_eq!(mem.contents(4096, 4096), vec![3u8; 4096]);
        assert_eq!(mem.contents(5 << 20, 100), vec![4u8; 100]);
        assert_eq!(up.replay(h).unwrap(), 0, "the header was cleared");

        // A torn log (its last body block never written) is ignored.
        let g3 = vec![(0u64, Bytes::from(vec![9u8; 3 * 4096]))];
        let log = r.encode_log(&g3);
        let cut = log.len() - BLOCK as usize;
        rt.block_on(up.write_all(r.start, &log[..cut])).unwrap();
        rt.block_on(up.write_all(r.start + cut as u64, &vec![0u8; BLOCK as usize]))
            .unwrap();
        let (_up, n) = Upstream::open(&uri, None, h).unwrap();
        assert_eq!(n, 0);
        assert_eq!(
            mem.contents(0, 4096),
            vec![1u8; 4096],
            "torn group not applied"
        );
        rt.block_on(server.shutdown());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The label lives in the trailer block's second sector: none before a
    /// region exists, none until written, found again after, and the
    /// trailer (the region) is untouched by it.
    #[test]
    fn label_in_the_region_trailer() {
        one_thread_runtime().block_on(async {
            let dir = test_dir("nvwc-ulabel-");
            let (server, mem, uri) = memory_server(&dir).await;

            let mut up = Upstream::connect(&uri).await.unwrap();
            assert_eq!(up.read_label().await.unwrap(), None);
            assert_eq!(up.label_for([1; 16], 5), None, "no region, no label");
            assert_eq!(up.planned_start(2 << 20).unwrap(), 61 << 20);
            assert_eq!(
                mem.contents(63 << 20, 1 << 20),
                vec![0u8; 1 << 20],
                "connect writes nothing"
            );
            assert!(up.ensure_region(2 << 20).await.unwrap());
            let r = up.region().unwrap();
            assert_eq!(up.read_label().await.unwrap(), None);
            let l = up.label_for([1; 16], 5).unwrap();
            assert_eq!((l.offset, l.data_len), (r.trailer + 512, r.start));
            up.write_label(&l).await.unwrap();
            let up = Upstream::connect(&uri).await.unwrap();
            assert_eq!(up.region(), Some(r), "the trailer is intact");
            assert_eq!(up.read_label().await.unwrap(), Some(l));
            server.shutdown().await;
            let _ = std::fs::remove_dir_all(&dir);
        });
    }

    #[test]
    fn the_least_loaded_connection_first_on_a_tie() {
        assert_eq!(least_loaded([0usize, 0, 0].into_iter()), 0);
        assert_eq!(least_loaded([3usize, 1, 1, 2].into_iter()), 1);
        assert_eq!(least_loaded([2usize, 2, 0].into_iter()), 2);
        assert_eq!(least_loaded(std::iter::empty()), 0);
    }

    /// More connections only where the export offers multi-conn, and what
    /// one connection wrote is read back, and flushed, through another.
    #[test]
    fn more_connections_only_with_multi_conn() {
        one_thread_runtime().block_on(async {
            let dir = test_dir("nvwc-umc-");
            let (server, mem, uri) = memory_server(&dir).await;
            let mut up = Upstream::connect(&uri).await.unwrap();
            assert!(std::ptr::eq(up.pick(), &up.client), "one connection");
            assert_eq!(up.connect_more(&uri, 3).await.unwrap(), 3);
            assert_eq!(up.connect_more(&uri, 3).await.unwrap(), 3, "no more");
            assert!(std::ptr::eq(up.pick(), &up.client), "all idle: the first");
            let data = Bytes::from(vec![7u8; 4096]);
            up.client.write(8192, data.clone(), false).await.unwrap();
            let other = &up.more[1];
            other.flush().await.unwrap();
            assert_eq!(other.read(8192, 4096).await.unwrap(), data);
            assert_eq!(mem.contents(8192, 4096), vec![7u8; 4096]);
            server.shutdown().await;

            // Without multi-conn, one connection whatever is asked.
            let mut info = nvwc_nbd::export::ExportInfo::new("", 64 << 20).with_all_features();
            info.can_multi_conn = false;
            let (server, _mem, uri) = memory_server_with(&dir, info).await;
            let mut up = Upstream::connect(&uri).await.unwrap();
            assert_eq!(up.connect_more(&uri, 4).await.unwrap(), 1);
            assert!(up.more.is_empty());
            server.shutdown().await;
            let _ = std::fs::remove_dir_all(&dir);
        });
    }

    #[test]
    fn log_round_trip_and_torn_logs() {
        let r = region();
        let writes = vec![
            (4096u64, Bytes::from(vec![1u8; 4096])),
            (1 << 20, Bytes::from(vec![2u8; 100])),
        ];
        let log = r.encode_log(&writes);
        assert_eq!(log.len() % BLOCK as usize, 0);
        assert!(log.len() as u64 <= log_bytes_needed(4196, 2));
        let (n, body_len) = r.decode_header(&log[..BLOCK as usize]).unwrap();
        let crc = u32::from_le_bytes(log[24..28].try_into().unwrap());
        let body = &log[BLOCK as usize..BLOCK as usize + body_len as usize];
        assert_eq!(decode_body(body, n, crc).unwrap(), writes);
        // A torn body fails its CRC.
        let mut torn = body.to_vec();
        torn[4200] ^= 1;
        assert!(decode_body(&torn, n, crc).is_none());
        // A cleared header is no log; a header of another region is ignored.
        assert!(r.decode_header(&[0u8; BLOCK as usize]).is_none());
        let other = RedoRegion { uuid: 7, ..r };
        assert!(other.decode_header(&log[..BLOCK as usize]).is_none());
    }
}
