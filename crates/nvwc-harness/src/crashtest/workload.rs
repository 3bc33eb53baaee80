//! The workload client: one request in flight, every write and FLUSH
//! logged with its issue and acknowledgement times; and reading a region
//! back, through NBD or from a file.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;

use super::blocks::block_bytes;
use super::server::connect;
use super::{Rng, BS};

/// One logged request (times in µs since the trial's start).
#[derive(Clone, Debug, serde::Serialize)]
pub enum Op {
    Write {
        seq: u64,
        block: u64,
        n: u64,
        fua: bool,
        issue_us: u64,
        ack_us: Option<u64>,
        ok: bool,
        /// Refused with `EPERM`: the export had degraded to read-only, so the
        /// write never reached a device (it changes no block).
        refused: bool,
    },
    /// A FLUSH issued after write `after_seq` (and before the next write).
    Flush {
        after_seq: u64,
        issue_us: u64,
        ack_us: Option<u64>,
        ok: bool,
    },
}

/// What the workload client writes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Workload {
    /// 1 to 4 blocks (4 to 16 KiB): the server buffers them and copies them
    /// into the mapped cache file; a 16 KiB one may be taken directly.
    Small,
    /// 4 to 16 blocks (16 to 64 KiB): each is offered to the direct path (a
    /// unix socket, payload queued), received straight into the mapped cache.
    Large,
    /// As `large`, within the first [`HOT_BLOCKS`] blocks: most writes
    /// rewrite a block whose version a commit names, which write-back does
    /// in place (no entry changes; only the next FLUSH's device sync makes
    /// the new bytes durable).
    Hot,
}

/// The region of the `hot` workload, in blocks (1 MiB).
pub const HOT_BLOCKS: u64 = 256;

impl Workload {
    pub fn parse(s: &str) -> Result<Workload> {
        match s {
            "small" => Ok(Workload::Small),
            "large" => Ok(Workload::Large),
            "hot" => Ok(Workload::Hot),
            w => bail!("unknown workload {w:?} (small, large, hot)"),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Workload::Small => "small",
            Workload::Large => "large",
            Workload::Hot => "hot",
        }
    }
    /// Write sizes in blocks, drawn uniformly.
    fn sizes(self) -> &'static [u64] {
        match self {
            Workload::Small => &[1, 1, 1, 2, 3, 4],
            Workload::Large | Workload::Hot => &[4, 4, 8, 8, 16, 16],
        }
    }
    /// Blocks it writes, of a region of `blocks`.
    fn span(self, blocks: u64) -> u64 {
        match self {
            Workload::Hot => HOT_BLOCKS.min(blocks),
            _ => blocks,
        }
    }
}

/// Writes of at least this many bytes may go direct (over a unix socket).
pub const DIRECT_MIN: u64 = 16 << 10;

/// Run the workload until the connection breaks or `limit` passes.
/// One request in flight; writes of the workload's sizes (and, with
/// `max_write_blocks` above 4, longer ones a quarter of the time), some FUA,
/// a FLUSH every 1 to 24 writes.
#[allow(clippy::too_many_arguments)]
pub async fn workload(
    uri: &str,
    nonce: u64,
    blocks: u64,
    max_write_blocks: u64,
    rng: &mut Rng,
    t0: Instant,
    limit: Duration,
    kind: Workload,
) -> Result<Vec<Op>> {
    let c = connect(uri).await?;
    let us = || t0.elapsed().as_micros() as u64;
    let mut ops = Vec::new();
    let mut seq = 0u64;
    let mut until_flush = 1 + rng.below(24);
    while t0.elapsed() < limit {
        if until_flush == 0 {
            until_flush = 1 + rng.below(24);
            let issue_us = us();
            let r = c.flush().await;
            ops.push(Op::Flush {
                after_seq: seq,
                issue_us,
                ack_us: r.is_ok().then(us),
                ok: r.is_ok(),
            });
            if r.is_err() && c.is_closed() {
                break;
            }
            continue;
        }
        until_flush -= 1;
        seq += 1;
        let sizes = kind.sizes();
        let mut n = sizes[rng.below(sizes.len() as u64) as usize];
        // Longer writes, when asked for, a quarter of the time (no extra
        // draw otherwise, so a seed gives the workload it always gave).
        if max_write_blocks > 4 && rng.below(4) == 0 {
            n = 5 + rng.below(max_write_blocks - 4);
        }
        let span = kind.span(blocks);
        let n = n.min(span);
        let block = rng.below(span - n + 1);
        let fua = rng.below(10) == 0;
        let mut data = Vec::with_capacity((n * BS) as usize);
        for b in block..block + n {
            data.extend_from_slice(&block_bytes(nonce, seq, b));
        }
        let issue_us = us();
        let r = c.write(block * BS, Bytes::from(data), fua).await;
        let refused = matches!(
            &r,
            Err(nvwc_nbd::ClientError::Server(e)) if e.code == nvwc_nbd::ErrorCode::Perm
        );
        ops.push(Op::Write {
            seq,
            block,
            n,
            fua,
            issue_us,
            ack_us: r.is_ok().then(us),
            ok: r.is_ok(),
            refused,
        });
        if r.is_err() && c.is_closed() {
            break;
        }
    }
    Ok(ops)
}

/// Read blocks `0..blocks` through NBD.
pub async fn read_region_nbd(uri: &str, blocks: u64) -> Result<Vec<u8>> {
    let c = connect(uri).await?;
    let mut out = Vec::with_capacity((blocks * BS) as usize);
    let chunk = 64u64;
    let mut b = 0;
    while b < blocks {
        let n = chunk.min(blocks - b);
        let d = c
            .read(b * BS, (n * BS) as u32)
            .await
            .context("reading back")?;
        out.extend_from_slice(&d);
        b += n;
    }
    let _ = c.disconnect().await;
    Ok(out)
}

/// Read blocks `0..blocks` of a file (zeroes past its end).
pub fn read_region_file(path: &Path, blocks: u64) -> Result<Vec<u8>> {
    let mut d = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    d.resize((blocks * BS) as usize, 0);
    Ok(d)
}
