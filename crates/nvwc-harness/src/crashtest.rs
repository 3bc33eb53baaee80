//! `nvwc crashtest`: crash the live server and check what survives.
//!
//! Each trial starts `nvwc serve` (this same binary) on fresh files, runs a
//! workload client over NBD on a unix socket that writes blocks whose
//! contents encode (sequence number, block) and logs every request's issue
//! and acknowledgement times with its FUA/FLUSH status, then crashes the
//! server. Workloads (`--workloads`): `small` writes 1 to 4 blocks of 4 KiB
//! (the server buffers them and copies them into its mapped cache file; a
//! 16 KiB one may go direct), `large` writes 16 to 64 KiB (each offered to
//! the direct path: received from the socket straight into the mapped cache
//! file), `hot` is `large` within 1 MiB (write-back rewrites those blocks in
//! place, which changes no slot entry: only the next FLUSH's device sync
//! makes the bytes durable). Each trial reports how many writes went
//! direct and how many cache writes were copied into the mapping (`nvwc
//! status` just before the crash).
//! Crash modes:
//!
//! - `server-crash`: `kill -9` at a random time (the page cache survives);
//! - `host-crash`: the same, with both devices in host-crash mode
//!   (`nvwc-dev/src/volatile.rs`): each file holds only what was made durable, the
//!   cache file is mapped private so mapped and direct writes take their
//!   usual path, and every write not yet durable is in a side log. After
//!   the kill, a random subset of those writes, seeded by the trial's seed,
//!   reaches each file in completion order, each lost, whole, or torn at
//!   512-byte sectors, as a power loss may leave a disk's volatile cache
//!   (`docs/ARCHITECTURE.md`, "Crash testing the live server");
//! - `failpoint`: a random failpoint (`NVWC_FAILPOINTS`) aborts the server in
//!   the commit window, a checkpoint, a redo apply or a write-back.
//!
//! Then two checks:
//!
//! 1. **Cache intact.** Restart on the same files and read every block back:
//!    every write acknowledged before a completed FLUSH, and every
//!    acknowledged FUA write, must be there (or a newer write of the block),
//!    and no block may hold bytes no write produced.
//! 2. **Cache lost.** On a copy of the backing file taken right after the
//!    crash, run `nvwc recover`, then check the backing alone against the
//!    policy's promise: `write-through` holds everything acknowledged;
//!    `ordered` and `journaled` are a point-in-time state (some prefix of the
//!    write sequence; the one write at the cut may be partly there, as NBD
//!    gives multi-block writes no atomicity); `journaled-hints` is exactly the
//!    state at a FLUSH; `write-back` promises nothing and is checked against
//!    point-in-time to show what it does. Staleness (acknowledged writes
//!    after the cut, and how long before the crash the first was
//!    acknowledged) is reported.
//!
//! After a host crash a block may be torn: its sectors from different
//! writes ([`Seen::Torn`]). Both checks then judge it sector by sector: each
//! sector must hold what the block as a whole would have to (its durable
//! write or a newer one; the prefix's write, or at the cut the write before
//! it), so a tear of a write that was not durable passes and any sector of
//! an older or foreign write fails.
//!
//! The client keeps one request in flight, so the server's sequence order is
//! the client's issue order and the prefix search is exact.

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use nvwc_nbd::Client;

/// Block size of the workload (and of the server's cache).
pub const BS: u64 = 4096;
const MAGIC: &[u8; 8] = b"NVWCCRSH";

pub const POLICIES: [&str; 5] = [
    "write-through",
    "write-back",
    "ordered",
    "journaled",
    "journaled-hints",
];

/// Failpoints a `failpoint` trial picks from (see `nvwc-server/src/fault.rs`).
pub const FAILPOINTS: [&str; 6] = [
    "cache-flush",
    "commit-record",
    "writeback",
    "backing-flush",
    "checkpoint",
    "redo-apply",
];

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Write policies, comma-separated.
    #[arg(
        long,
        default_value = "write-through,write-back,ordered,journaled,journaled-hints"
    )]
    pub policies: String,
    /// Crash modes, comma-separated: server-crash, host-crash, failpoint.
    #[arg(long, default_value = "server-crash,host-crash,failpoint")]
    pub modes: String,
    /// Workloads, comma-separated: `small` (1 to 4 blocks: buffered writes,
    /// copied into the mapped cache file; the 16 KiB ones may go direct),
    /// `large` (16 to 64 KiB: direct writes, received from the unix socket
    /// straight into the mapped cache file), `hot` (as `large`, within 1 MiB:
    /// write-back rewrites the blocks in place).
    #[arg(long, default_value = "small")]
    pub workloads: String,
    /// Trials per policy, mode and workload.
    #[arg(long, default_value_t = 5)]
    pub trials: u32,
    /// Longest workload run before the crash (each trial picks at random up to this).
    #[arg(long, default_value_t = 800)]
    pub max_run_ms: u64,
    /// Shortest workload run before the crash.
    #[arg(long, default_value_t = 30)]
    pub min_run_ms: u64,
    /// Seed (default: from the clock); printed so a run can be repeated.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Working directory (default: a new one under the system temp dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Keep the files of failed trials.
    #[arg(long)]
    pub keep: bool,
    /// Fault spec for the cache device during the workload (`fault.rs` syntax).
    #[arg(long)]
    pub fault_cache: Option<String>,
    /// Fault spec for the backing device during the workload.
    #[arg(long)]
    pub fault_backing: Option<String>,
    /// Upstream NBD backing store (e.g. nbdkit with the `error` and `delay` filters).
    #[arg(long)]
    pub backing_uri: Option<String>,
    /// Created while each workload runs, removed at the crash (nbdkit `error-file=`).
    #[arg(long)]
    pub error_file: Option<PathBuf>,
    /// Print one JSON object per trial, and a summary object.
    #[arg(long)]
    pub json: bool,
    /// Run the ext4 check instead (see `ext4.rs`): mkfs, file workload, kill, drop the cache, e2fsck.
    #[arg(long)]
    pub ext4: bool,
    /// ext4 trials: cache size in MiB (a smaller cache makes write-back
    /// write back during the run instead of holding everything).
    #[arg(long, default_value_t = 12)]
    pub ext4_cache_mib: u64,
    /// Extra `nvwc serve` flag for every trial, repeatable, e.g.
    /// `--server-arg=--block-size=16K`: the workload's 4 KiB writes (and
    /// ext4's) then are partial writes, which lazy fetch keeps as patches
    /// and persists as partial versions.
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    pub server_args: Vec<String>,
    /// Cache size of every trial's server (e.g. 100K, the smallest it
    /// accepts: 16 blocks and a 16 KiB metadata log).
    #[arg(long, default_value = "6M", value_parser = nvwc_core::units::parse_size)]
    pub cache_size: u64,
    /// Longest workload write, in 4 KiB blocks, beyond the workload's own
    /// sizes. A write spanning more than half the cache's blocks reaches the
    /// engine as several writes (`docs/ARCHITECTURE.md`, "Requests of every
    /// advertised size"); with the default (4) the workload is the same as
    /// before this option.
    #[arg(long, default_value_t = 4)]
    pub max_write_blocks: u64,
}

pub use nvwc_dev::rng::Rng;

// ------------------------------------------------------------------ server process

/// Geometry and files of one trial's server.
#[derive(Clone, Debug)]
pub struct ServerCfg {
    pub dir: PathBuf,
    pub policy: String,
    pub backing_size: u64,
    pub cache_size: u64,
    /// Extra environment (faults, failpoints).
    pub env: Vec<(String, String)>,
    pub extra_args: Vec<String>,
    /// An upstream NBD backing store instead of `backing.img`.
    pub backing_uri: Option<String>,
}

impl ServerCfg {
    /// What `--backing` gets.
    pub fn backing_spec(&self) -> String {
        match &self.backing_uri {
            Some(u) => u.clone(),
            None => self.backing().display().to_string(),
        }
    }
    pub fn backing(&self) -> PathBuf {
        self.dir.join("backing.img")
    }
    pub fn cache(&self) -> PathBuf {
        self.dir.join("cache.img")
    }
    pub fn socket(&self) -> PathBuf {
        self.dir.join("nbd.sock")
    }
    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket().display())
    }
}

/// A running `nvwc serve`.
pub struct Server {
    pub child: Child,
}

impl Server {
    /// Start the server and wait until it accepts connections.
    pub fn start(cfg: &ServerCfg, log_name: &str) -> Result<Server> {
        let exe = std::env::current_exe().context("finding the nvwc binary")?;
        let log = std::fs::File::create(cfg.dir.join(log_name))?;
        let _ = std::fs::remove_file(cfg.socket());
        let mut cmd = Command::new(exe);
        cmd.arg("serve")
            .arg("--backing")
            .arg(cfg.backing_spec())
            .arg("--cache")
            .arg(cfg.cache())
            .arg("--size")
            .arg(cfg.backing_size.to_string())
            .arg("--cache-size")
            .arg(cfg.cache_size.to_string())
            .arg("--unix")
            .arg(cfg.socket())
            .arg("--listen")
            .arg("none")
            .arg("--control")
            .arg(cfg.dir.join("nvwc.ctl"))
            .arg("--write-policy")
            .arg(&cfg.policy)
            .args(["--txn-blocks", "64", "--txn-age-ms", "100"])
            .args(["--commit-interval-ms", "100", "--log-level", "warn"])
            .args(&cfg.extra_args)
            .env_remove("NVWC_FAILPOINTS")
            .env_remove("NVWC_FAULT_CACHE")
            .env_remove("NVWC_FAULT_BACKING")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        for (k, v) in &cfg.env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().context("spawning nvwc serve")?;
        let t = Instant::now();
        while !cfg.socket().exists() {
            if let Some(st) = child.try_wait()? {
                bail!(
                    "nvwc serve exited at start ({st}): {}",
                    std::fs::read_to_string(cfg.dir.join(log_name)).unwrap_or_default()
                );
            }
            if t.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                bail!("nvwc serve did not start in 30 s");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(Server { child })
    }

    /// `kill -9`, and wait. Returns the signal the process died of (if any).
    pub fn kill9(mut self) -> Option<i32> {
        let _ = self.child.kill();
        self.child.wait().ok().and_then(|s| s.signal())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Connect, retrying while the server finishes starting.
pub async fn connect(uri: &str) -> Result<Client> {
    let t = Instant::now();
    loop {
        match Client::connect(uri).await {
            Ok(c) => return Ok(c),
            Err(e) if t.elapsed() > Duration::from_secs(30) => {
                return Err(e).context("connecting to nvwc serve")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

// ------------------------------------------------------------------ workload

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

/// The contents of block `block` as written by write `seq` of run `nonce`.
pub fn block_bytes(nonce: u64, seq: u64, block: u64) -> Vec<u8> {
    let mut b = vec![0u8; BS as usize];
    b[..8].copy_from_slice(MAGIC);
    b[8..16].copy_from_slice(&seq.to_le_bytes());
    b[16..24].copy_from_slice(&block.to_le_bytes());
    b[24..32].copy_from_slice(&nonce.to_le_bytes());
    let mut x = seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ block ^ nonce;
    for c in b[32..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
    b
}

/// The unit a device writes atomically (a torn write keeps whole sectors).
pub const SECTOR: u64 = 512;
const SECTORS: usize = (BS / SECTOR) as usize;

/// What a block holds.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    Zero,
    Seq(u64),
    /// Bytes no write of this run produced (torn, stale garbage, wrong block).
    Garbage,
    /// After a host crash only: each 512-byte sector holds zeroes (0) or
    /// what one write of this block put there, not all the same write: a
    /// write the crash tore, as a disk may leave one it had not made
    /// durable. Judged sector by sector.
    Torn([u64; SECTORS]),
}

impl Seen {
    /// Per sector: the write it shows (0: zeroes), or `None` for garbage.
    fn sectors(&self) -> Option<[u64; SECTORS]> {
        match *self {
            Seen::Zero => Some([0; SECTORS]),
            Seen::Seq(x) => Some([x; SECTORS]),
            Seen::Torn(s) => Some(s),
            Seen::Garbage => None,
        }
    }
}

pub fn decode(nonce: u64, block: u64, b: &[u8]) -> Seen {
    if b.iter().all(|&x| x == 0) {
        return Seen::Zero;
    }
    if &b[..8] != MAGIC {
        return Seen::Garbage;
    }
    let seq = u64::from_le_bytes(b[8..16].try_into().unwrap());
    if b == block_bytes(nonce, seq, block).as_slice() {
        Seen::Seq(seq)
    } else {
        Seen::Garbage
    }
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

/// What each block of `region` holds. `torn`: after a host crash, a block
/// no single write produced is read sector by sector against the writes
/// `torn` logged for it ([`Seen::Torn`]); otherwise it is garbage.
pub fn decode_region(nonce: u64, region: &[u8], torn: Option<&History>) -> Vec<Seen> {
    region
        .chunks(BS as usize)
        .enumerate()
        .map(|(b, d)| match (decode(nonce, b as u64, d), torn) {
            (Seen::Garbage, Some(h)) => decode_sectors(nonce, b as u64, d, h.seqs(b)),
            (s, _) => s,
        })
        .collect()
}

/// A block read as 512-byte sectors: [`Seen::Torn`] if every sector is
/// zeroes or the bytes one of `candidates` (writes of this block) put there,
/// else [`Seen::Garbage`].
pub fn decode_sectors(
    nonce: u64,
    block: u64,
    b: &[u8],
    candidates: impl Iterator<Item = u64>,
) -> Seen {
    const S: usize = SECTOR as usize;
    let mut secs = [None; SECTORS];
    for (i, sec) in b.chunks(S).enumerate() {
        if sec.iter().all(|&x| x == 0) {
            secs[i] = Some(0);
        }
    }
    for seq in candidates {
        if secs.iter().all(Option::is_some) {
            break;
        }
        let want = block_bytes(nonce, seq, block);
        for (i, sec) in b.chunks(S).enumerate() {
            if secs[i].is_none() && sec == &want[i * S..(i + 1) * S] {
                secs[i] = Some(seq);
            }
        }
    }
    let mut out = [0u64; SECTORS];
    for (o, s) in out.iter_mut().zip(secs) {
        match s {
            Some(x) => *o = x,
            None => return Seen::Garbage,
        }
    }
    Seen::Torn(out)
}

// ------------------------------------------------------------------ checks

/// The log, indexed for the checks.
pub struct History {
    /// Per block: (seq, acked ok, fua) of every write touching it, ascending.
    per_block: Vec<Vec<(u64, bool, bool)>>,
    /// seq -> ack time (µs) of acknowledged writes.
    ack: HashMap<u64, u64>,
    /// Writes with seq <= this were acknowledged before a completed FLUSH.
    durable_upto: u64,
    /// Every FLUSH issued: the write seq it follows.
    flush_points: Vec<u64>,
    pub writes: u64,
    pub acked: u64,
    pub flushes_acked: u64,
    pub fua_acked: u64,
    pub failed_requests: u64,
    /// Writes refused with `EPERM` by an export degraded to read-only.
    pub refused_writes: u64,
}

impl History {
    pub fn new(ops: &[Op], blocks: u64) -> History {
        let mut h = History {
            per_block: vec![Vec::new(); blocks as usize],
            ack: HashMap::new(),
            durable_upto: 0,
            flush_points: vec![0],
            writes: 0,
            acked: 0,
            flushes_acked: 0,
            fua_acked: 0,
            failed_requests: 0,
            refused_writes: 0,
        };
        for op in ops {
            match *op {
                Op::Write {
                    seq,
                    block,
                    n,
                    fua,
                    ack_us,
                    ok,
                    refused,
                    ..
                } => {
                    h.writes += 1;
                    h.refused_writes += u64::from(refused);
                    for b in block..block + n {
                        if !refused {
                            h.per_block[b as usize].push((seq, ok, fua));
                        }
                    }
                    if let (true, Some(t)) = (ok, ack_us) {
                        h.acked += 1;
                        h.ack.insert(seq, t);
                        if fua {
                            h.fua_acked += 1;
                        }
                    } else if ack_us.is_none() && !ok {
                        // In flight at the crash, or failed.
                    }
                    if !ok {
                        h.failed_requests += 1;
                    }
                }
                Op::Flush { after_seq, ok, .. } => {
                    h.flush_points.push(after_seq);
                    if ok {
                        h.flushes_acked += 1;
                        h.durable_upto = h.durable_upto.max(after_seq);
                    } else {
                        h.failed_requests += 1;
                    }
                }
            }
        }
        // The last request may have been in flight at the crash; it is neither acked nor failed.
        if let Some(Op::Write { ack_us: None, .. } | Op::Flush { ack_us: None, .. }) = ops.last() {
            h.failed_requests -= 1;
        }
        h
    }

    /// Newest write to `b` with seq <= `upto` (0: none).
    fn last_write(&self, b: usize, upto: u64) -> u64 {
        self.per_block[b]
            .iter()
            .rev()
            .find(|w| w.0 <= upto)
            .map_or(0, |w| w.0)
    }

    fn wrote(&self, b: usize, seq: u64) -> bool {
        self.per_block[b].iter().any(|w| w.0 == seq)
    }

    /// Every write to block `b`, newest first.
    pub fn seqs(&self, b: usize) -> impl Iterator<Item = u64> + '_ {
        self.per_block[b].iter().rev().map(|w| w.0)
    }
}

/// Outcome of one check.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Check {
    pub ok: bool,
    /// Blocks that break the promise.
    pub bad_blocks: u64,
    /// Blocks holding bytes no write produced.
    pub garbage_blocks: u64,
    /// Acknowledged writes the state does not show (staleness, in writes).
    pub stale_writes: u64,
    /// How long before the crash the oldest missing acknowledged write was acknowledged (ms).
    pub stale_ms: f64,
    /// The cut (last write of the matching prefix), for point-in-time checks.
    pub cut: Option<u64>,
    /// Blocks not judged because a write to them failed after their floor
    /// (disk semantics, see [`check_flush_contract`]).
    pub failed_write_blocks: u64,
    /// Blocks a host crash tore ([`Seen::Torn`]), judged sector by sector.
    pub torn_blocks: u64,
    pub detail: String,
}

/// Staleness: acknowledged writes whose data is not visible (per block,
/// counting a write missing when any block of it shows an older write).
fn staleness(h: &History, seen: &[Seen], crash_us: u64) -> (u64, f64) {
    let mut missing = std::collections::HashSet::new();
    for (b, s) in seen.iter().enumerate() {
        // A torn block shows a write only where all its sectors do.
        let have = match s {
            Seen::Seq(x) => *x,
            Seen::Torn(secs) => secs.iter().copied().min().unwrap_or(0),
            _ => 0,
        };
        for w in &h.per_block[b] {
            if w.1 && w.0 > have {
                missing.insert(w.0);
            }
        }
    }
    let oldest = missing.iter().filter_map(|s| h.ack.get(s)).min().copied();
    (
        missing.len() as u64,
        oldest.map_or(0.0, |t| crash_us.saturating_sub(t) as f64 / 1000.0),
    )
}

/// Every block must show a write this run made, no older than its floor
/// (`floor(writes to the block)`; 0: anything or zeroes will do).
/// `failed_undefined`: a block with a failed write newer than its floor may
/// hold anything (it is counted, not judged).
fn check_floor(
    h: &History,
    seen: &[Seen],
    crash_us: u64,
    what: &str,
    floor: impl Fn(&[(u64, bool, bool)]) -> u64,
    failed_undefined: bool,
) -> Check {
    let mut c = Check::default();
    for (b, s) in seen.iter().enumerate() {
        let floor = floor(&h.per_block[b]);
        if failed_undefined && h.per_block[b].iter().any(|w| !w.1 && w.0 > floor) {
            c.failed_write_blocks += 1;
            continue;
        }
        let bad = match *s {
            Seen::Garbage => {
                c.garbage_blocks += 1;
                true
            }
            Seen::Zero => floor > 0,
            Seen::Seq(x) => x < floor || !h.wrote(b, x),
            // Each sector on its own: its floor write's bytes, or a newer
            // write's (one the crash tore).
            Seen::Torn(secs) => {
                c.torn_blocks += 1;
                secs.iter().any(|&x| {
                    if x == 0 {
                        floor > 0
                    } else {
                        x < floor || !h.wrote(b, x)
                    }
                })
            }
        };
        if bad {
            if c.bad_blocks < 3 {
                c.detail += &format!("block {b}: {s:?}, {what} {floor}; ");
            }
            c.bad_blocks += 1;
        }
    }
    (c.stale_writes, c.stale_ms) = staleness(h, seen, crash_us);
    c.ok = c.bad_blocks == 0;
    c
}

/// Cache intact: the flush contract. Every block shows its newest write
/// that a completed FLUSH or its own FUA made durable, or a newer one.
///
/// `failed_undefined` applies a disk's rule for failed writes: a block that
/// a *failed* write touched after that floor may hold anything. Use it only
/// where the server promises no more: injected cache-device faults under
/// write-back rewriting in place, where a write that fails part-way lands on
/// the block's only copy (`docs/ON-DISK-FORMAT.md`).
pub fn check_flush_contract(
    h: &History,
    seen: &[Seen],
    crash_us: u64,
    failed_undefined: bool,
) -> Check {
    check_floor(
        h,
        seen,
        crash_us,
        "durable floor",
        |ws| {
            ws.iter()
                .filter(|&&(seq, ok, fua)| ok && (seq <= h.durable_upto || fua))
                .map(|w| w.0)
                .max()
                .unwrap_or(0)
        },
        failed_undefined,
    )
}

/// Cache lost, `write-through`: everything acknowledged is on the backing store.
pub fn check_all_acked(h: &History, seen: &[Seen], crash_us: u64) -> Check {
    check_floor(
        h,
        seen,
        crash_us,
        "last acked",
        |ws| ws.iter().filter(|w| w.1).map(|w| w.0).max().unwrap_or(0),
        false,
    )
}

/// Cache lost: is the state a prefix of the write sequence? With
/// `flush_aligned`, the prefix must end exactly at a FLUSH and be complete.
pub fn check_point_in_time(
    h: &History,
    seen: &[Seen],
    crash_us: u64,
    flush_aligned: bool,
) -> Check {
    let mut c = Check::default();
    let mut newest = 0;
    for s in seen {
        match s {
            Seen::Garbage => c.garbage_blocks += 1,
            Seen::Seq(x) => newest = newest.max(*x),
            Seen::Torn(secs) => {
                c.torn_blocks += 1;
                newest = newest.max(secs.iter().copied().max().unwrap_or(0));
            }
            Seen::Zero => {}
        }
    }
    let cut = if flush_aligned {
        match h
            .flush_points
            .iter()
            .copied()
            .filter(|&p| p >= newest)
            .min()
        {
            Some(p) => p,
            None => {
                c.detail = format!("newest visible write {newest} is after the last FLUSH");
                c.bad_blocks = 1;
                (c.stale_writes, c.stale_ms) = staleness(h, seen, crash_us);
                return c;
            }
        }
    } else {
        newest
    };
    c.cut = Some(cut);
    for (b, s) in seen.iter().enumerate() {
        let want = h.last_write(b, cut);
        // The write at the cut may be partly there (no multi-block atomicity
        // in NBD; after a host crash, down to single sectors), unless the
        // state must be flush-aligned.
        let before = h.last_write(b, cut.saturating_sub(1));
        let sector_ok = |x: u64| x == want || (!flush_aligned && want == cut && x == before);
        let ok = s
            .sectors()
            .is_some_and(|secs| secs.iter().all(|&x| sector_ok(x)));
        if !ok {
            if c.bad_blocks < 3 {
                c.detail += &format!("block {b}: {s:?}, prefix {cut} wants {want}; ");
            }
            c.bad_blocks += 1;
        }
    }
    (c.stale_writes, c.stale_ms) = staleness(h, seen, crash_us);
    c.ok = c.bad_blocks == 0 && c.garbage_blocks == 0;
    c
}

/// The cache-lost promise of a policy (`write-back` has none; it is held to
/// point-in-time to show that). After a host crash, write-through promises
/// only what a FLUSH or FUA covered: the backing store lost its page cache too.
/// `journaled-hints` is flush-aligned unless it reported forced closes
/// (transactions closed for space, not at a FLUSH; see `journaled.rs`), and
/// point-in-time always. An unknown count (no status) is held to flush-aligned.
pub fn check_cache_lost(
    policy: &str,
    host_crash: bool,
    forced_closes: Option<u64>,
    h: &History,
    seen: &[Seen],
    crash_us: u64,
) -> Check {
    match policy {
        "write-through" if host_crash => check_flush_contract(h, seen, crash_us, false),
        "write-through" => check_all_acked(h, seen, crash_us),
        "journaled-hints" if forced_closes.unwrap_or(0) == 0 => {
            check_point_in_time(h, seen, crash_us, true)
        }
        _ => check_point_in_time(h, seen, crash_us, false),
    }
}

// ------------------------------------------------------------------ trials

#[derive(Clone, Debug, serde::Serialize)]
pub struct TrialResult {
    pub policy: String,
    pub mode: String,
    pub failpoint: Option<String>,
    pub trial: u32,
    pub seed: u64,
    /// The signal the server died of (9: kill -9; 6: a failpoint's abort).
    pub signal: Option<i32>,
    pub run_ms: u64,
    pub writes: u64,
    pub acked: u64,
    pub flushes_acked: u64,
    pub fua_acked: u64,
    pub failed_requests: u64,
    /// Writes refused with `EPERM` by an export degraded to read-only.
    pub refused_writes: u64,
    pub cache_intact: Check,
    pub cache_lost: Check,
    /// Degraded flag reported by `nvwc status` just before the crash.
    pub degraded: Option<bool>,
    /// Journaled: transactions closed early for space (not at a FLUSH), per `nvwc status` just before the crash.
    pub forced_closes: Option<u64>,
    pub workload: &'static str,
    /// Client writes of 16 KiB or more: each offered to the direct path.
    pub large_writes: u64,
    /// Writes the server took directly (payload received from the socket
    /// straight into the mapped cache file), per `nvwc status` just before
    /// the crash.
    pub direct_writes: Option<u64>,
    /// Cache writes copied into the mapped cache file (slot and metadata
    /// writes of buffered requests), same status.
    pub mapped_writes: Option<u64>,
    /// Host crash: what became of each device's writes that were not durable.
    pub host_crash: Option<HostCrash>,
}

/// What a host crash did to the writes that were not durable (`nvwc-dev/src/volatile.rs`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct HostCrash {
    pub cache: nvwc_dev::volatile::CrashOutcome,
    pub backing: nvwc_dev::volatile::CrashOutcome,
}

/// One trial's plan.
#[derive(Clone, Debug)]
pub struct Trial {
    pub policy: String,
    pub mode: String,
    pub trial: u32,
    pub seed: u64,
    pub min_run_ms: u64,
    pub max_run_ms: u64,
    pub fault_cache: Option<String>,
    pub fault_backing: Option<String>,
    /// Upstream NBD backing store (shared by the trials; the region is zeroed first).
    pub backing_uri: Option<String>,
    /// Created when the workload starts and removed at the crash (for nbdkit's `error-file=`).
    pub error_file: Option<PathBuf>,
    /// Extra `nvwc serve` flags (`--server-arg`).
    pub server_args: Vec<String>,
    /// The server's cache size (`--cache-size`).
    pub cache_size: u64,
    /// Longest workload write, in blocks (`--max-write-blocks`).
    pub max_write_blocks: u64,
    pub workload: Workload,
}

impl Trial {
    /// Cache-device faults under write-back that rewrites in place (the
    /// server's default): a failed write may damage its blocks' last flushed
    /// version, as on a disk, so the flush contract does not judge them.
    pub fn failed_writes_undefined(&self) -> bool {
        let fresh_slots = self
            .server_args
            .windows(2)
            .any(|w| w[0] == "--rewrite-in-place" && w[1] == "false")
            || self
                .server_args
                .iter()
                .any(|a| a == "--rewrite-in-place=false");
        self.fault_cache.is_some() && self.policy == "write-back" && !fresh_slots
    }
}

/// The seed of the `n`-th trial (from 1) of a run seeded with `seed`: spread
/// out so that neighbouring trials do not share workload streams.
pub fn trial_seed(seed: u64, n: u64) -> u64 {
    seed.wrapping_add(n.wrapping_mul(0x1000_0001))
}

/// Workload region and device sizes: the cache holds about half the region,
/// so write-back, cleaning and checkpoints all happen within a second.
const REGION_BLOCKS: u64 = 3072;
const BACKING_SIZE: u64 = 16 << 20;
pub const CACHE_SIZE: u64 = 6 << 20;

pub fn run_trial(t: &Trial, root: &Path, keep: bool) -> Result<TrialResult> {
    let dir = root.join(format!(
        "{}-{}-{}-{}",
        t.policy,
        t.mode,
        t.workload.name(),
        t.trial
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let mut rng = Rng::new(t.seed);
    let nonce = rng.next_u64();
    let mut env = Vec::new();
    let mut failpoint = None;
    match t.mode.as_str() {
        "server-crash" => {}
        "host-crash" => {
            // Each device's writes that are not durable go to a side log,
            // applied in part after the kill (below).
            for (var, log) in [
                ("NVWC_FAULT_CACHE", dir.join("cache.volatile")),
                ("NVWC_FAULT_BACKING", dir.join("backing.volatile")),
            ] {
                env.push((var.to_string(), format!("volatile,log={}", log.display())));
            }
        }
        "failpoint" => {
            // The redo log exists only under the journaled policies.
            let n_fp = if t.policy.starts_with("journaled") {
                6
            } else {
                4
            };
            let fp = FAILPOINTS[rng.below(n_fp) as usize];
            let n = 1 + rng.below(if fp.contains("flush") || fp == "commit-record" {
                8
            } else {
                40
            });
            env.push(("NVWC_FAILPOINTS".to_string(), format!("{fp}:{n}")));
            failpoint = Some(format!("{fp}:{n}"));
        }
        m => bail!("unknown crash mode {m:?} (server-crash, host-crash, failpoint)"),
    }
    // Injected faults join the host-crash model's rule, if any.
    for (var, spec) in [
        ("NVWC_FAULT_CACHE", &t.fault_cache),
        ("NVWC_FAULT_BACKING", &t.fault_backing),
    ] {
        let Some(spec) = spec else { continue };
        match env.iter_mut().find(|(k, _)| k == var) {
            Some((_, v)) => *v = format!("{v};{spec}"),
            None => env.push((var.to_string(), spec.clone())),
        }
    }
    let mut cfg = ServerCfg {
        dir: dir.clone(),
        policy: t.policy.clone(),
        backing_size: BACKING_SIZE,
        cache_size: t.cache_size,
        env,
        extra_args: t.server_args.clone(),
        backing_uri: t.backing_uri.clone(),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if let Some(u) = &t.backing_uri {
        // A previous trial's server may have left a logged group in the redo
        // region: finish it before zeroing, or the new server would replay it.
        let out = Command::new(std::env::current_exe()?)
            .arg("recover")
            .arg("--backing")
            .arg(u)
            .output()?;
        if !out.status.success() {
            bail!(
                "nvwc recover failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        rt.block_on(zero_region(u))?;
    }
    let server = Server::start(&cfg, "serve-1.log")?;
    if let Some(f) = &t.error_file {
        std::fs::write(f, b"")?;
    }
    let pid = server.child.id();
    let run_ms = t.min_run_ms + rng.below(t.max_run_ms.saturating_sub(t.min_run_ms).max(1));
    let t0 = Instant::now();
    // The killer: kill -9 at a random time, while requests are in flight.
    let ctl = dir.join("nvwc.ctl");
    let want_status = true;
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(run_ms));
        let status = want_status.then(|| status_line(&ctl)).flatten();
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        (t0.elapsed().as_micros() as u64, status)
    });
    let ops = rt.block_on(workload(
        &cfg.uri(),
        nonce,
        REGION_BLOCKS,
        t.max_write_blocks,
        &mut rng,
        t0,
        Duration::from_millis(run_ms + 10_000),
        t.workload,
    ))?;
    let (crash_us, status) = killer.join().expect("killer thread");
    let signal = server.kill9();
    if let Some(f) = &t.error_file {
        std::fs::remove_file(f)?;
    }
    let host_crash = t.mode == "host-crash";
    // The host went down with the server: of each device's writes that were
    // not durable, a random subset reaches it, some torn.
    let crashed = if host_crash {
        let mut crng = Rng::new(t.seed ^ 0x686f_7374_6372_7368);
        let cache = apply_host_crash(
            &dir.join("cache.volatile"),
            &cfg.cache(),
            None,
            &rt,
            &mut crng,
        )?;
        let backing = apply_host_crash(
            &dir.join("backing.volatile"),
            &cfg.backing(),
            t.backing_uri.as_deref(),
            &rt,
            &mut crng,
        )?;
        Some(HostCrash { cache, backing })
    } else {
        None
    };
    let h = History::new(&ops, REGION_BLOCKS);
    // Blocks a host crash tore are read sector by sector.
    let torn_from = host_crash.then_some(&h);
    let forced_closes = status
        .as_deref()
        .and_then(|s| counter(s, "journal_forced_closes"));
    let exe = std::env::current_exe()?;
    let recover = |spec: &str| -> Result<()> {
        let out = Command::new(&exe)
            .arg("recover")
            .arg("--backing")
            .arg(spec)
            .output()?;
        if !out.status.success() {
            bail!(
                "nvwc recover failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    };
    let failed_undefined = t.failed_writes_undefined();

    let (cache_intact, cache_lost) = if let Some(u) = &t.backing_uri {
        // Upstream: check the backing alone first (the restart below may write it back).
        recover(u)?;
        let region = rt.block_on(read_region_nbd(u, REGION_BLOCKS))?;
        let seen_lost = decode_region(nonce, &region, torn_from);
        let cache_lost = check_cache_lost(
            &t.policy,
            host_crash,
            forced_closes,
            &h,
            &seen_lost,
            crash_us,
        );
        cfg.env.clear();
        let server = Server::start(&cfg, "serve-2.log")?;
        let region = rt.block_on(read_region_nbd(&cfg.uri(), REGION_BLOCKS))?;
        let seen = decode_region(nonce, &region, torn_from);
        server.kill9();
        (
            check_flush_contract(&h, &seen, crash_us, failed_undefined),
            cache_lost,
        )
    } else {
        // Cache lost: copy the backing store as the crash left it.
        let lost = dir.join("lost");
        std::fs::create_dir_all(&lost)?;
        let lost_backing = lost.join("backing.img");
        std::fs::copy(cfg.backing(), &lost_backing)?;
        let redo = PathBuf::from(format!("{}.nvwc-redo", cfg.backing().display()));
        if redo.exists() {
            std::fs::copy(&redo, lost.join("backing.img.nvwc-redo"))?;
        }

        // Cache intact: restart (no faults) and read everything back.
        cfg.env.clear();
        let server = Server::start(&cfg, "serve-2.log")?;
        let region = rt.block_on(read_region_nbd(&cfg.uri(), REGION_BLOCKS))?;
        let seen = decode_region(nonce, &region, torn_from);
        server.kill9();
        let cache_intact = check_flush_contract(&h, &seen, crash_us, failed_undefined);

        recover(&lost_backing.display().to_string())?;
        let region = read_region_file(&lost_backing, REGION_BLOCKS)?;
        let seen_lost = decode_region(nonce, &region, torn_from);
        let cache_lost = check_cache_lost(
            &t.policy,
            host_crash,
            forced_closes,
            &h,
            &seen_lost,
            crash_us,
        );
        (cache_intact, cache_lost)
    };

    let r = TrialResult {
        policy: t.policy.clone(),
        mode: t.mode.clone(),
        failpoint,
        trial: t.trial,
        seed: t.seed,
        signal,
        run_ms,
        writes: h.writes,
        acked: h.acked,
        flushes_acked: h.flushes_acked,
        fua_acked: h.fua_acked,
        failed_requests: h.failed_requests,
        refused_writes: h.refused_writes,
        cache_intact,
        cache_lost,
        degraded: status
            .as_deref()
            .map(|s| s.contains("\"cache_degraded\":1")),
        forced_closes,
        workload: t.workload.name(),
        large_writes: ops
            .iter()
            .filter(|o| matches!(o, Op::Write { n, .. } if n * BS >= DIRECT_MIN))
            .count() as u64,
        direct_writes: status.as_deref().and_then(|s| stat(s, "direct_writes")),
        mapped_writes: status
            .as_deref()
            .and_then(|s| counter(s, "cache_mapped_writes")),
        host_crash: crashed,
    };
    let failed = !r.cache_intact.ok || (!r.cache_lost.ok && t.policy != "write-back");
    if !(keep && failed) {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        std::fs::write(
            dir.join("ops.log"),
            ops.iter()
                .map(|o| serde_json::to_string(o).unwrap_or_default() + "\n")
                .collect::<String>(),
        )?;
    }
    Ok(r)
}

/// A host crash on one device: apply a random subset of the writes its side
/// log holds (`log`; none if it is missing), torn at sectors, to the file
/// `file`, or through NBD to the upstream `uri`.
fn apply_host_crash(
    log: &Path,
    file: &Path,
    uri: Option<&str>,
    rt: &tokio::runtime::Runtime,
    rng: &mut Rng,
) -> Result<nvwc_dev::volatile::CrashOutcome> {
    use std::os::unix::fs::FileExt;
    let mut pieces: Vec<(u64, Vec<u8>)> = Vec::new();
    let out = nvwc_dev::volatile::apply_crash(log, &mut || rng.next_u64(), &mut |o, d| {
        pieces.push((o, d.to_vec()));
        Ok(())
    })
    .with_context(|| format!("applying {}", log.display()))?;
    match uri {
        None => {
            let f = std::fs::OpenOptions::new().write(true).open(file)?;
            for (o, d) in &pieces {
                f.write_all_at(d, *o)?;
            }
        }
        Some(u) if !pieces.is_empty() => rt.block_on(async {
            let c = connect(u).await?;
            for (o, d) in pieces {
                c.write(o, Bytes::from(d), false).await?;
            }
            c.flush().await?;
            let _ = c.disconnect().await;
            anyhow::Ok(())
        })?,
        Some(_) => {}
    }
    Ok(out)
}

/// Zero the workload region of an upstream backing store (the trials share it).
async fn zero_region(uri: &str) -> Result<()> {
    let c = connect(uri).await?;
    let chunk = 256 * BS;
    let mut off = 0;
    while off < REGION_BLOCKS * BS {
        c.write(off, Bytes::from(vec![0u8; chunk as usize]), false)
            .await?;
        off += chunk;
    }
    c.flush().await?;
    let _ = c.disconnect().await;
    Ok(())
}

/// A counter from a `nvwc status` line.
pub(crate) fn counter(status: &str, name: &str) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_str(status).ok()?;
    v["exports"][0]["policy"][name].as_u64()
}

pub(crate) fn stat(status: &str, name: &str) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_str(status).ok()?;
    v["exports"][0]["stats"][name].as_u64()
}

pub(crate) fn status_line(ctl: &Path) -> Option<String> {
    control_line(ctl, "status", Duration::from_secs(2))
}

/// Send one control command (`status`, `flush`, `detach`) and read the answer.
pub fn control_line(ctl: &Path, cmd: &str, timeout: Duration) -> Option<String> {
    use std::io::{BufRead, Write};
    let mut s = std::os::unix::net::UnixStream::connect(ctl).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.write_all(format!("{cmd}\n").as_bytes()).ok()?;
    let mut line = String::new();
    std::io::BufReader::new(s).read_line(&mut line).ok()?;
    Some(line)
}

pub fn default_dir(what: &str) -> PathBuf {
    std::env::temp_dir().join(format!("nvwc-{what}-{}", std::process::id()))
}

pub fn seed_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
}

pub fn run(a: Args) -> Result<std::process::ExitCode> {
    if a.ext4 {
        return crate::ext4::run(&a);
    }
    let seed = a.seed.unwrap_or_else(seed_now);
    let root = a.dir.clone().unwrap_or_else(|| default_dir("crashtest"));
    std::fs::create_dir_all(&root)?;
    eprintln!(
        "nvwc crashtest: seed {seed}, files under {}",
        root.display()
    );
    let policies: Vec<&str> = a.policies.split(',').map(str::trim).collect();
    let modes: Vec<&str> = a.modes.split(',').map(str::trim).collect();
    let workloads = a
        .workloads
        .split(',')
        .map(|w| Workload::parse(w.trim()))
        .collect::<Result<Vec<_>>>()?;
    let mut all = Vec::new();
    let mut n = 0u64;
    let pb =
        trials_bar((policies.len() * modes.len() * workloads.len()) as u64 * u64::from(a.trials));
    for p in &policies {
        for (m, w) in modes
            .iter()
            .flat_map(|m| workloads.iter().map(move |w| (m, *w)))
        {
            let wn = w.name();
            pb.set_message(format!("{p} {m} {wn}"));
            for i in 0..a.trials {
                n += 1;
                let t = Trial {
                    policy: p.to_string(),
                    mode: m.to_string(),
                    trial: i,
                    seed: trial_seed(seed, n),
                    min_run_ms: a.min_run_ms,
                    max_run_ms: a.max_run_ms,
                    fault_cache: a.fault_cache.clone(),
                    fault_backing: a.fault_backing.clone(),
                    backing_uri: a.backing_uri.clone(),
                    error_file: a.error_file.clone(),
                    server_args: a.server_args.clone(),
                    cache_size: a.cache_size,
                    max_write_blocks: a.max_write_blocks,
                    workload: w,
                };
                let r = run_trial(&t, &root, a.keep)
                    .with_context(|| format!("trial {p} {m} {wn} {i} (seed {})", t.seed))?;
                if a.json {
                    println!("{}", serde_json::to_string(&r)?);
                } else if !r.cache_intact.ok || !r.cache_lost.ok {
                    pb.suspend(|| {
                        eprintln!(
                            "  {p} {m} {wn} #{i} seed {}: cache intact {} {}; cache lost {} {}",
                            r.seed,
                            verdict(r.cache_intact.ok),
                            r.cache_intact.detail,
                            verdict(r.cache_lost.ok),
                            r.cache_lost.detail
                        )
                    });
                }
                all.push(r);
                pb.inc(1);
            }
        }
    }
    pb.finish_and_clear();
    let summary = summarize(&all);
    if a.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        print_summary(&summary);
    }
    let _ = std::fs::remove_dir(&root);
    // Under injected faults some writes failed: their blocks may or may not
    // have changed, so only the flush contract is judged.
    let faults = a.fault_cache.is_some() || a.fault_backing.is_some() || a.error_file.is_some();
    let bad = summary.iter().any(|s| {
        s.flushed_lost_trials > 0
            || (!faults && s.policy != "write-back" && s.cache_lost_passes < s.trials)
    });
    Ok(if bad {
        std::process::ExitCode::from(1)
    } else {
        std::process::ExitCode::SUCCESS
    })
}

/// A progress bar over `n` crash trials, on stderr (hidden when stderr is
/// not a terminal).
pub(crate) fn trials_bar(n: u64) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(n);
    pb.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} trials {msg} (eta {eta})",
        )
        .expect("template")
        .progress_chars("=> "),
    );
    pb
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "ok"
    } else {
        "FAIL"
    }
}

/// Per policy, mode and workload.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Summary {
    pub policy: String,
    pub mode: String,
    pub workload: String,
    pub trials: u64,
    /// Trials where the restarted server lost a flushed (or FUA) write or showed garbage.
    pub flushed_lost_trials: u64,
    /// Blocks, over all trials, where it did (lost flushed writes).
    pub flushed_lost_blocks: u64,
    pub cache_lost_passes: u64,
    /// Trials whose backing alone broke the policy's promise.
    pub cache_lost_inconsistent: u64,
    /// Trials the server ended itself (a failpoint's or torn-crash's abort) rather than by kill -9.
    pub self_aborts: u64,
    /// Journaled-hints trials with forced closes (held to point-in-time, not flush-aligned).
    pub forced_close_trials: u64,
    pub acked_writes: u64,
    pub flushes_acked: u64,
    /// Client writes of 16 KiB or more (offered to the direct path).
    pub large_writes: u64,
    /// Writes the server took directly (received into the mapped cache).
    pub direct_writes: u64,
    /// Cache writes copied into the mapped cache file.
    pub mapped_writes: u64,
    /// Host crashes: writes not durable at the crash (both devices), and
    /// of those, how many were lost, kept whole, or torn.
    pub crash_pending: u64,
    pub crash_lost: u64,
    pub crash_whole: u64,
    pub crash_torn: u64,
    /// Blocks read back torn (judged sector by sector), cache intact and lost.
    pub torn_blocks_intact: u64,
    pub torn_blocks_lost: u64,
    pub mean_stale_writes_cache_intact: f64,
    pub mean_stale_writes_cache_lost: f64,
    pub max_stale_ms_cache_lost: f64,
}

pub fn summarize(all: &[TrialResult]) -> Vec<Summary> {
    let mut out: Vec<Summary> = Vec::new();
    for r in all {
        let i = match out
            .iter()
            .position(|s| s.policy == r.policy && s.mode == r.mode && s.workload == r.workload)
        {
            Some(i) => i,
            None => {
                out.push(Summary {
                    policy: r.policy.clone(),
                    mode: r.mode.clone(),
                    workload: r.workload.to_string(),
                    ..Summary::default()
                });
                out.len() - 1
            }
        };
        let s = &mut out[i];
        s.trials += 1;
        s.flushed_lost_trials += u64::from(!r.cache_intact.ok);
        s.flushed_lost_blocks += r.cache_intact.bad_blocks;
        s.cache_lost_passes += u64::from(r.cache_lost.ok);
        s.cache_lost_inconsistent += u64::from(!r.cache_lost.ok);
        s.self_aborts += u64::from(r.signal == Some(6));
        s.forced_close_trials += u64::from(r.forced_closes.unwrap_or(0) > 0);
        s.acked_writes += r.acked;
        s.flushes_acked += r.flushes_acked;
        s.large_writes += r.large_writes;
        s.direct_writes += r.direct_writes.unwrap_or(0);
        s.mapped_writes += r.mapped_writes.unwrap_or(0);
        if let Some(hc) = &r.host_crash {
            for o in [hc.cache, hc.backing] {
                s.crash_pending += o.pending;
                s.crash_lost += o.lost;
                s.crash_whole += o.whole;
                s.crash_torn += o.torn;
            }
        }
        s.torn_blocks_intact += r.cache_intact.torn_blocks;
        s.torn_blocks_lost += r.cache_lost.torn_blocks;
        s.mean_stale_writes_cache_intact += r.cache_intact.stale_writes as f64;
        s.mean_stale_writes_cache_lost += r.cache_lost.stale_writes as f64;
        s.max_stale_ms_cache_lost = s.max_stale_ms_cache_lost.max(r.cache_lost.stale_ms);
    }
    for s in &mut out {
        s.mean_stale_writes_cache_intact /= s.trials as f64;
        s.mean_stale_writes_cache_lost /= s.trials as f64;
    }
    out
}

fn print_summary(s: &[Summary]) {
    println!(
        "{:<16} {:<13} {:<6} {:>6} {:>6} {:>12} {:>13} {:>8} {:>8} {:>8} {:>8} {:>16} {:>10} {:>11} {:>12}",
        "policy",
        "mode",
        "load",
        "trials",
        "aborts",
        "flushed-lost",
        "cache-lost ok",
        "acked",
        "flushes",
        "direct",
        "mapped",
        "crash lost/torn",
        "stale(int)",
        "stale(lost)",
        "stale ms max"
    );
    for x in s {
        println!(
            "{:<16} {:<13} {:<6} {:>6} {:>6} {:>12} {:>13} {:>8} {:>8} {:>8} {:>8} {:>16} {:>10.1} {:>11.1} {:>12.0}",
            x.policy,
            x.mode,
            x.workload,
            x.trials,
            x.self_aborts,
            x.flushed_lost_trials,
            format!("{}/{}", x.cache_lost_passes, x.trials),
            x.acked_writes,
            x.flushes_acked,
            x.direct_writes,
            x.mapped_writes,
            format!("{}/{}/{}", x.crash_lost, x.crash_torn, x.crash_pending),
            x.mean_stale_writes_cache_intact,
            x.mean_stale_writes_cache_lost,
            x.max_stale_ms_cache_lost
        );
    }
    println!("(flushed-lost: trials where the restarted server lost an acknowledged write covered by a FLUSH or FUA; cache-lost ok: the backing alone kept the policy's promise; direct: writes received from the socket straight into the mapped cache; mapped: cache writes copied into it; crash lost/torn: of the writes not durable at a host crash (both devices), lost and torn / all; stale: acknowledged writes not visible, mean per trial; stale ms max: age at the crash of the oldest acknowledged write the backing alone missed; aborts: the server died at its failpoint)");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(seq: u64, block: u64, n: u64, ok: bool) -> Op {
        Op::Write {
            seq,
            block,
            n,
            fua: false,
            issue_us: seq * 10,
            ack_us: ok.then_some(seq * 10 + 5),
            ok,
            refused: false,
        }
    }
    fn f(after: u64) -> Op {
        Op::Flush {
            after_seq: after,
            issue_us: 0,
            ack_us: Some(1),
            ok: true,
        }
    }

    #[test]
    fn block_contents_round_trip() {
        let b = block_bytes(7, 3, 9);
        assert_eq!(decode(7, 9, &b), Seen::Seq(3));
        assert_eq!(decode(7, 8, &b), Seen::Garbage, "wrong block");
        assert_eq!(decode(6, 9, &b), Seen::Garbage, "other run");
        assert_eq!(decode(7, 9, &[0u8; 4096]), Seen::Zero);
        let mut t = b.clone();
        t[4000] ^= 1;
        assert_eq!(decode(7, 9, &t), Seen::Garbage, "torn");
    }

    #[test]
    fn flush_contract_catches_a_lost_flushed_write() {
        // Writes 1 (block 0), flush, 2 (block 1), 3 (block 0, in flight).
        let ops = vec![w(1, 0, 1, true), f(1), w(2, 1, 1, true), w(3, 0, 1, false)];
        let h = History::new(&ops, 2);
        assert!(check_flush_contract(&h, &[Seen::Seq(1), Seen::Zero], 100, false).ok);
        assert!(check_flush_contract(&h, &[Seen::Seq(3), Seen::Seq(2)], 100, false).ok);
        assert!(!check_flush_contract(&h, &[Seen::Zero, Seen::Seq(2)], 100, false).ok);
        assert!(!check_flush_contract(&h, &[Seen::Garbage, Seen::Seq(2)], 100, false).ok);
        // Disk semantics: write 3 failed (or was in flight) on block 0, so
        // block 0 is not judged; block 1 still is.
        let c = check_flush_contract(&h, &[Seen::Garbage, Seen::Seq(2)], 100, true);
        assert!(c.ok && c.failed_write_blocks == 1, "{c:?}");
        assert!(!check_flush_contract(&h, &[Seen::Seq(1), Seen::Garbage], 100, true).ok);
        // A failed write older than the floor excuses nothing.
        let ops = vec![w(1, 0, 1, false), w(2, 0, 1, true), f(2)];
        let h = History::new(&ops, 1);
        assert!(!check_flush_contract(&h, &[Seen::Garbage], 100, true).ok);
    }

    /// A block made of the sectors of writes `secs` (0: zeroes).
    fn mix(nonce: u64, block: u64, secs: [u64; SECTORS]) -> Vec<u8> {
        let s = SECTOR as usize;
        let mut b = vec![0u8; BS as usize];
        for (i, &seq) in secs.iter().enumerate() {
            if seq > 0 {
                b[i * s..(i + 1) * s]
                    .copy_from_slice(&block_bytes(nonce, seq, block)[i * s..(i + 1) * s]);
            }
        }
        b
    }

    #[test]
    fn torn_blocks_are_judged_sector_by_sector() {
        // 1: block 0, flush; 2: blocks 0-1 (acked, not flushed); 3: block 1.
        let ops = vec![w(1, 0, 1, true), f(1), w(2, 0, 2, true), w(3, 1, 1, true)];
        let h = History::new(&ops, 2);
        let region = |b0: [u64; 8], b1: [u64; 8]| [mix(5, 0, b0), mix(5, 1, b1)].concat();
        // A torn block is garbage unless a host crash is being judged.
        let r = region([2, 2, 1, 1, 1, 1, 2, 1], [3; 8]);
        assert_eq!(decode_region(5, &r, None)[0], Seen::Garbage);
        let seen = decode_region(5, &r, Some(&h));
        assert_eq!(seen[0], Seen::Torn([2, 2, 1, 1, 1, 1, 2, 1]));
        assert_eq!(seen[1], Seen::Seq(3));
        // The flushed write 1, partly overwritten by write 2: kept.
        let c = check_flush_contract(&h, &seen, 100, false);
        assert!(c.ok && c.torn_blocks == 1, "{c:?}");
        // A sector older than the floor (zeroes under write 1): lost.
        let seen = decode_region(5, &region([2, 0, 1, 1, 1, 1, 1, 1], [3; 8]), Some(&h));
        assert!(matches!(seen[0], Seen::Torn(_)));
        assert!(!check_flush_contract(&h, &seen, 100, false).ok);
        // A sector of another block's write, or of no write: garbage.
        let mut r = region([2, 2, 1, 1, 1, 1, 1, 1], [3; 8]);
        r[512..1024].copy_from_slice(&mix(5, 1, [3; 8])[512..1024]);
        assert_eq!(decode_region(5, &r, Some(&h))[0], Seen::Garbage);
        // Point in time: write 2 at the cut, torn across both its blocks.
        let seen = decode_region(
            5,
            &region([2, 1, 2, 1, 1, 1, 1, 1], [0, 2, 2, 0, 0, 0, 0, 0]),
            Some(&h),
        );
        let c = check_point_in_time(&h, &seen, 0, false);
        assert!(c.ok && c.cut == Some(2) && c.torn_blocks == 2, "{c:?}");
        // ... but not at a FLUSH, and a torn write before the cut is a hole.
        assert!(!check_point_in_time(&h, &seen, 0, true).ok);
        let seen = decode_region(5, &region([2, 1, 2, 1, 1, 1, 1, 1], [3; 8]), Some(&h));
        assert!(!check_point_in_time(&h, &seen, 0, false).ok);
    }

    #[test]
    fn point_in_time_finds_prefixes_and_rejects_holes() {
        // 1: blocks 0-1, 2: block 2, flush, 3: block 0, 4: block 1-2.
        let ops = vec![
            w(1, 0, 2, true),
            w(2, 2, 1, true),
            f(2),
            w(3, 0, 1, true),
            w(4, 1, 2, true),
        ];
        let h = History::new(&ops, 3);
        let s = |a, b, c| [a, b, c];
        use Seen::*;
        assert!(check_point_in_time(&h, &s(Zero, Zero, Zero), 0, false).ok);
        assert!(check_point_in_time(&h, &s(Seq(1), Seq(1), Seq(2)), 0, false).ok);
        // Write 4 partly there (the write at the cut).
        assert!(check_point_in_time(&h, &s(Seq(3), Seq(4), Seq(2)), 0, false).ok);
        // Write 3 there but write 2 missing: a hole.
        assert!(!check_point_in_time(&h, &s(Seq(3), Seq(1), Zero), 0, false).ok);
        // Flush-aligned: only the state at the FLUSH (after 2), or the empty one.
        assert!(check_point_in_time(&h, &s(Seq(1), Seq(1), Seq(2)), 0, true).ok);
        assert!(!check_point_in_time(&h, &s(Seq(1), Seq(1), Zero), 0, true).ok);
        assert!(!check_point_in_time(&h, &s(Seq(3), Seq(1), Seq(2)), 0, true).ok);
        // Write-through: everything acknowledged.
        assert!(check_all_acked(&h, &s(Seq(3), Seq(4), Seq(4)), 0).ok);
        assert!(!check_all_acked(&h, &s(Seq(3), Seq(1), Seq(4)), 0).ok);
    }
}
