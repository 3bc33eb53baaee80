//! `nvwc serve`: an NBD server that caches writes on a persistent cache file.
//!
//! One thread owns the engine (`nvwc_core::Engine`); NBD requests reach it
//! over a channel and wait on a oneshot for their reply. Device commands run on
//! small worker pools, one per device, with positional file I/O; completions go
//! back to the engine thread with the time from a monotonic clock. Every
//! connection and every export shares the one engine, so a FLUSH or FUA on one
//! connection covers writes acknowledged on all of them: multi-conn is true.
//!
//! Crash story (see `docs/ON-DISK-FORMAT.md`): the engine acknowledges a plain
//! write once it is in the cache file, and a FLUSH or FUA write only after a
//! commit (fdatasync of data, shadow-paged metadata write, fdatasync, commit
//! record written and synced). After `kill -9` the next start recovers the last
//! commit: every write acknowledged before a completed FLUSH, and every FUA
//! write, is there. Journaled checkpoints reach the backing file through the
//! redo log in `<backing>.nvwc-redo` (`docs/BACKING-FORMAT.md`), replayed on
//! start and by `nvwc recover`, so the backing file alone is always at a
//! checkpoint boundary.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use nvwc_core::layout::{self, Layout};
use nvwc_core::*;
use nvwc_nbd::export::{BoxFuture, Export, ExportInfo, NbdResult, RequestCtx, WriteZeroesFlags};
use nvwc_nbd::NbdError;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Backing store: a file (created sparse with --size if missing) or an
    /// upstream NBD server, `nbd://host:port/name` or `nbd+unix:///name?socket=PATH`.
    #[arg(long, default_value = "nvwc-data/backing.img")]
    backing: PathBuf,
    /// Cache device file (created with --cache-size if missing).
    #[arg(long, default_value = "nvwc-data/cache.img")]
    cache: PathBuf,
    /// Size of a new backing file (e.g. 8G, 512M).
    #[arg(long, default_value = "8G", value_parser = parse_size)]
    size: u64,
    /// Size of a new cache file.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    cache_size: u64,
    /// Unix socket to listen on.
    #[arg(long, default_value = "nvwc-data/nvwc.sock")]
    unix: PathBuf,
    /// TCP address to listen on ("none" to disable).
    #[arg(long, default_value = "127.0.0.1:10809")]
    listen: String,
    #[arg(long, default_value = "write-back")]
    write_policy: String,
    #[arg(long, default_value = "lru")]
    replacement: String,
    /// Cache block size.
    #[arg(long, default_value = "4K", value_parser = parse_size)]
    block_size: u64,
    /// Journaled: close a transaction at this many blocks.
    #[arg(long, default_value_t = 1024)]
    txn_blocks: u32,
    /// Journaled: close a transaction at this age.
    #[arg(long, default_value_t = 1000)]
    txn_age_ms: u64,
    /// Start cleaning above this dirty fraction.
    #[arg(long, default_value_t = 0.9)]
    high_watermark: f64,
    /// Stop cleaning at this dirty fraction.
    #[arg(long, default_value_t = 0.5)]
    low_watermark: f64,
    /// Partial writes to uncached blocks: `blocking` (fetch-before-write),
    /// `async`, `async-bg` or `lazy` (non-blocking writes: the data is kept as
    /// a patch and the write acknowledged at once; see docs/ARCHITECTURE.md).
    #[arg(long, default_value = "lazy")]
    fetch: String,
    /// RAM for patches; at the limit partial writes fall back to blocking.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    patch_mem: u64,
    /// Write-back only: write a patched block back as partial writes to the
    /// backing store, with no fetch.
    #[arg(long)]
    patch_direct: bool,
    /// Serve the export read-only.
    #[arg(long)]
    read_only: bool,
    /// Control socket for `nvwc status`, `nvwc flush` and `nvwc detach`.
    #[arg(long, default_value = "nvwc-data/nvwc.ctl")]
    control: PathBuf,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9180).
    #[arg(long)]
    metrics: Option<String>,
}

/// Parse sizes like `4096`, `4K`, `64M`, `8G`, `1T`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let unit = t[i..].to_ascii_lowercase();
            let m = match unit.trim_end_matches("ib").trim_end_matches('b') {
                "" => 1,
                "k" => 1 << 10,
                "m" => 1 << 20,
                "g" => 1 << 30,
                "t" => 1u64 << 40,
                _ => return Err(format!("unknown size unit in {s:?} (use K, M, G or T)")),
            };
            (&t[..i], m)
        }
        None => (t, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("not a size: {s:?}"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size too large: {s:?}"))
}

// ------------------------------------------------------------------ devices

/// Redo log for atomic groups on a plain backing file: `<backing>.nvwc-redo`.
struct Redo {
    path: PathBuf,
}

const REDO_MAGIC: &[u8; 8] = b"NVWCREDO";

impl Redo {
    /// Write the group to the log and sync it, then apply it in place, sync,
    /// and truncate the log. A crash before the log is synced leaves the
    /// backing file untouched; after, replay finishes the group.
    fn commit_and_apply(&self, backing: &File, writes: &[(u64, Bytes)]) -> std::io::Result<()> {
        let mut buf = Vec::new();
        buf.extend_from_slice(REDO_MAGIC);
        buf.extend_from_slice(&(writes.len() as u64).to_le_bytes());
        for (off, d) in writes {
            buf.extend_from_slice(&off.to_le_bytes());
            buf.extend_from_slice(&(d.len() as u64).to_le_bytes());
            buf.extend_from_slice(d);
        }
        let crc = crc32fast::hash(&buf);
        buf.extend_from_slice(&crc.to_le_bytes());
        let mut f = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&self.path)?;
        f.write_all(&buf)?;
        f.sync_data()?;
        for (off, d) in writes {
            backing.write_all_at(d, *off)?;
        }
        backing.sync_data()?;
        f.set_len(0)?;
        f.sync_data()
    }

    /// Apply a complete logged group, if any (after a crash). Returns how many writes it applied.
    fn replay(path: &Path, backing: &File) -> Result<usize> {
        let Ok(mut f) = File::open(path) else {
            return Ok(0);
        };
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)?;
        if buf.len() < 20 || &buf[..8] != REDO_MAGIC {
            return Ok(0);
        }
        let body = &buf[..buf.len() - 4];
        let crc = u32::from_le_bytes(buf[buf.len() - 4..].try_into().unwrap());
        if crc32fast::hash(body) != crc {
            // Torn log: the group never started applying; nothing to do.
            return Ok(0);
        }
        let n = u64::from_le_bytes(body[8..16].try_into().unwrap()) as usize;
        let mut at = 16;
        for _ in 0..n {
            let off = u64::from_le_bytes(body[at..at + 8].try_into().unwrap());
            let len = u64::from_le_bytes(body[at + 8..at + 16].try_into().unwrap()) as usize;
            backing.write_all_at(&body[at + 16..at + 16 + len], off)?;
            at += 16 + len;
        }
        backing.sync_data()?;
        OpenOptions::new().write(true).open(path)?.set_len(0)?;
        Ok(n)
    }
}

/// Where a device's bytes live.
enum Backend {
    File(File),
    /// An upstream NBD export, driven from the worker threads through the runtime.
    Nbd(Arc<nvwc_nbd::Client>, tokio::runtime::Handle),
}

struct Device {
    backend: Backend,
    groups: Mutex<HashMap<u64, Vec<(u64, Bytes)>>>,
    redo: Option<Redo>,
}

impl Device {
    fn execute(&self, op: &IoOp<Bytes>, group: Option<u64>) -> IoResult<Bytes> {
        let io = |r: std::io::Result<()>| {
            r.map_err(|e| match e.raw_os_error() {
                Some(28) => IoError::NoSpace,
                _ => IoError::Eio,
            })
        };
        let file = match &self.backend {
            Backend::File(f) => f,
            Backend::Nbd(c, rt) => {
                let e = |_| IoError::Eio;
                return match op {
                    IoOp::Read { offset, len } => {
                        rt.block_on(c.read(*offset, *len)).map(Some).map_err(e)
                    }
                    IoOp::Write { offset, data, fua } => rt
                        .block_on(c.write(*offset, data.clone(), *fua))
                        .map(|_| None)
                        .map_err(e),
                    IoOp::Flush => rt.block_on(c.flush()).map(|_| None).map_err(e),
                    IoOp::Trim { .. } => Ok(None),
                    // Journaled policies are refused over an upstream (no redo region yet).
                    IoOp::GroupBegin { .. } | IoOp::GroupEnd { .. } => Err(IoError::Eio),
                };
            }
        };
        match op {
            IoOp::Read { offset, len } => {
                let mut buf = vec![0u8; *len as usize];
                io(file.read_exact_at(&mut buf, *offset))?;
                Ok(Some(Bytes::from(buf)))
            }
            IoOp::Write { offset, data, fua } => {
                if let Some(g) = group {
                    self.groups
                        .lock()
                        .unwrap()
                        .entry(g)
                        .or_default()
                        .push((*offset, data.clone()));
                    return Ok(None);
                }
                io(file.write_all_at(data, *offset))?;
                if *fua {
                    io(file.sync_data())?;
                }
                Ok(None)
            }
            IoOp::Flush => io(file.sync_data()).map(|_| None),
            IoOp::Trim { .. } => Ok(None),
            IoOp::GroupBegin { group } => {
                self.groups.lock().unwrap().insert(*group, Vec::new());
                Ok(None)
            }
            IoOp::GroupEnd { group } => {
                let writes = self
                    .groups
                    .lock()
                    .unwrap()
                    .remove(group)
                    .unwrap_or_default();
                let redo = self.redo.as_ref().expect("backing device has a redo log");
                io(redo.commit_and_apply(file, &writes)).map(|_| None)
            }
        }
    }
}

// ------------------------------------------------------------------ engine thread

enum Msg {
    Req(ReqOp<Bytes>, tokio::sync::oneshot::Sender<Reply<Bytes>>),
    Io(IoId, IoResult<Bytes>),
    Shutdown(mpsc::Sender<Stats>),
    /// Counters and policy counters, for `nvwc status` and metrics.
    Status(tokio::sync::oneshot::Sender<(Stats, Vec<(&'static str, u64)>)>),
    /// Write back everything dirty; answer when nothing is dirty.
    Drain(tokio::sync::oneshot::Sender<Stats>),
}

fn spawn_pool(
    dev: Arc<Device>,
    done: mpsc::Sender<Msg>,
    threads: usize,
) -> mpsc::Sender<IoCmd<Bytes>> {
    let (tx, rx) = mpsc::channel::<IoCmd<Bytes>>();
    let rx = Arc::new(Mutex::new(rx));
    for _ in 0..threads {
        let (rx, dev, done) = (rx.clone(), dev.clone(), done.clone());
        std::thread::spawn(move || loop {
            let cmd = match rx.lock().unwrap().recv() {
                Ok(c) => c,
                Err(_) => return,
            };
            let res = dev.execute(&cmd.op, cmd.group);
            if done.send(Msg::Io(cmd.id, res)).is_err() {
                return;
            }
        });
    }
    tx
}

fn run_engine(
    mut eng: Engine<Bytes>,
    rx: mpsc::Receiver<Msg>,
    cache_dev: Arc<Device>,
    cache: mpsc::Sender<IoCmd<Bytes>>,
    backing: mpsc::Sender<IoCmd<Bytes>>,
) {
    let t0 = Instant::now();
    let now = || t0.elapsed().as_nanos() as u64;
    let mut next_id: ReqId = 1;
    let mut waiting: HashMap<ReqId, tokio::sync::oneshot::Sender<Reply<Bytes>>> = HashMap::new();
    let mut shutdown: Option<mpsc::Sender<Stats>> = None;
    let mut drains: Vec<tokio::sync::oneshot::Sender<Stats>> = Vec::new();
    eng.handle_timeout(now());
    loop {
        while let Some(cmd) = eng.poll_io() {
            // Cache-device reads and plain writes go to the page cache and are
            // done here, inline: no thread hop on the hot path. Syncs, FUA
            // writes and everything for the backing store run on the pools.
            let inline = cmd.dev == Dev::Cache
                && cmd.group.is_none()
                && matches!(cmd.op, IoOp::Read { .. } | IoOp::Write { fua: false, .. });
            if inline {
                let res = cache_dev.execute(&cmd.op, None);
                eng.handle_completion(now(), cmd.id, res);
                continue;
            }
            let q = if cmd.dev == Dev::Cache {
                &cache
            } else {
                &backing
            };
            let _ = q.send(cmd);
        }
        while let Some(r) = eng.poll_reply() {
            if let Some(w) = waiting.remove(&r.id) {
                let _ = w.send(r);
            }
        }
        while let Some(ev) = eng.poll_event() {
            if let Event::BackgroundError { what } = ev {
                eprintln!("nvwc: level=warn event=background_error what={what}");
            }
        }
        if !drains.is_empty() && eng.dirty_versions() == 0 && eng.is_idle() {
            for d in drains.drain(..) {
                let _ = d.send(eng.stats());
            }
        }
        if shutdown.is_some() && eng.is_idle() {
            let _ = shutdown.take().unwrap().send(eng.stats());
            return;
        }
        let wait = match eng.poll_timeout() {
            Some(t) => Duration::from_nanos(t.saturating_sub(now())),
            None => Duration::from_secs(1),
        };
        let msg = match rx.recv_timeout(wait) {
            Ok(m) => m,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                eng.handle_timeout(now());
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
        match msg {
            Msg::Req(op, reply) => {
                let id = next_id;
                next_id += 1;
                waiting.insert(id, reply);
                eng.handle_request(
                    now(),
                    Request {
                        id,
                        op,
                        tag: Tag::default(),
                    },
                );
            }
            Msg::Io(id, res) => eng.handle_completion(now(), id, res),
            Msg::Shutdown(ack) => {
                eng.start_shutdown(now());
                shutdown = Some(ack);
            }
            Msg::Status(ack) => {
                let _ = ack.send((eng.stats(), eng.policy_counters()));
            }
            Msg::Drain(ack) => {
                eng.start_drain(now());
                drains.push(ack);
            }
        }
        if eng.poll_timeout().is_some_and(|t| t <= now()) {
            eng.handle_timeout(now());
        }
    }
}

// ------------------------------------------------------------------ NBD export

struct NvwcExport {
    tx: Mutex<mpsc::Sender<Msg>>,
    info: ExportInfo,
    lat: Latency,
}

/// Upper bounds (µs) of the latency histogram buckets; the last is +Inf.
const LAT_BOUNDS_US: [u64; 12] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
];
const OPS: [&str; 5] = ["read", "write", "flush", "trim", "write_zeroes"];

/// Per-operation latency histograms (Prometheus style: cumulative at export).
#[derive(Default)]
struct Latency {
    counts: Mutex<[[u64; 13]; 5]>,
    sums_us: Mutex<[u64; 5]>,
}

impl Latency {
    fn record(&self, op: usize, us: u64) {
        let b = LAT_BOUNDS_US
            .iter()
            .position(|&x| us <= x)
            .unwrap_or(LAT_BOUNDS_US.len());
        self.counts.lock().unwrap()[op][b] += 1;
        self.sums_us.lock().unwrap()[op] += us;
    }
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
    async fn call(&self, op: ReqOp<Bytes>) -> NbdResult<Option<Bytes>> {
        let kind = match &op {
            ReqOp::Read { .. } => 0,
            ReqOp::Write { .. } => 1,
            ReqOp::Flush | ReqOp::Checkpoint => 2,
            ReqOp::Trim { .. } => 3,
            ReqOp::WriteZeroes { .. } => 4,
        };
        let t = Instant::now();
        let r = self.call_engine(op).await;
        self.lat.record(kind, t.elapsed().as_micros() as u64);
        r
    }

    async fn call_engine(&self, op: ReqOp<Bytes>) -> NbdResult<Option<Bytes>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.tx
            .lock()
            .unwrap()
            .send(Msg::Req(op, tx))
            .map_err(|_| NbdError::new(nvwc_nbd::ErrorCode::Shutdown, "engine stopped"))?;
        let r = rx
            .await
            .map_err(|_| NbdError::io("engine dropped the request"))?;
        r.result.map_err(nbd_err)
    }
}

impl NvwcExport {
    fn send(&self, m: Msg) -> Result<()> {
        self.tx
            .lock()
            .unwrap()
            .send(m)
            .map_err(|_| anyhow::anyhow!("engine stopped"))
    }
    async fn status(&self) -> Result<(Stats, Vec<(&'static str, u64)>)> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send(Msg::Status(tx))?;
        Ok(rx.await?)
    }
    async fn drain(&self) -> Result<Stats> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send(Msg::Drain(tx))?;
        Ok(rx.await?)
    }
}

macro_rules! stat_fields {
    ($m:ident) => {
        $m!(requests reads writes flushes trims read_bytes write_bytes read_hits read_misses write_hits write_misses
            overwrites cache_reads cache_read_bytes cache_writes cache_write_bytes cache_flushes backing_reads
            backing_read_bytes backing_writes backing_write_bytes backing_flushes backing_groups fetches populates
            stalled_writes stall_ns evictions destaged_blocks destage_plans destage_failures commits commit_failures
            io_errors patches_created patch_merges patch_reads patch_fetches patch_direct_writes patch_discards
            patch_fallbacks patch_waits patch_fetch_errors patched_blocks patch_bytes dirty_blocks cached_blocks free_slots)
    };
}

fn stats_pairs(st: &Stats) -> Vec<(&'static str, u64)> {
    macro_rules! pairs {
        ($($f:ident)*) => { vec![$((stringify!($f), st.$f)),*] };
    }
    stat_fields!(pairs)
}

fn status_json(info: &ExportInfo, st: &Stats, pc: &[(&'static str, u64)]) -> String {
    let mut out = format!(
        "{{\"export_size\":{},\"description\":\"{}\",\"stats\":{{",
        info.size,
        info.description.replace('"', "'")
    );
    let kv: Vec<String> = stats_pairs(st)
        .iter()
        .map(|(k, v)| format!("\"{k}\":{v}"))
        .collect();
    out += &kv.join(",");
    out += "},\"policy\":{";
    let kv: Vec<String> = pc.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
    out += &kv.join(",");
    out += "}}";
    out
}

fn metrics_text(st: &Stats, pc: &[(&'static str, u64)], lat: &Latency) -> String {
    let mut o = String::new();
    for (k, v) in stats_pairs(st) {
        let kind = if matches!(k, "dirty_blocks" | "cached_blocks" | "free_slots") {
            "gauge"
        } else {
            "counter"
        };
        o += &format!("# TYPE nvwc_{k} {kind}\nnvwc_{k} {v}\n");
    }
    for (k, v) in pc {
        o += &format!("# TYPE nvwc_{k} gauge\nnvwc_{k} {v}\n");
    }
    let counts = *lat.counts.lock().unwrap();
    let sums = *lat.sums_us.lock().unwrap();
    o += "# TYPE nvwc_request_latency_seconds histogram\n";
    for (i, op) in OPS.iter().enumerate() {
        let mut cum = 0;
        for (b, bound) in LAT_BOUNDS_US.iter().enumerate() {
            cum += counts[i][b];
            o += &format!(
                "nvwc_request_latency_seconds_bucket{{op=\"{op}\",le=\"{}\"}} {cum}\n",
                *bound as f64 / 1e6
            );
        }
        cum += counts[i][LAT_BOUNDS_US.len()];
        o += &format!("nvwc_request_latency_seconds_bucket{{op=\"{op}\",le=\"+Inf\"}} {cum}\n");
        o += &format!(
            "nvwc_request_latency_seconds_sum{{op=\"{op}\"}} {}\n",
            sums[i] as f64 / 1e6
        );
        o += &format!("nvwc_request_latency_seconds_count{{op=\"{op}\"}} {cum}\n");
    }
    o
}

/// Serve the control socket: one command per line (`status`, `flush`, `detach`), one JSON line back.
async fn control_loop(
    path: PathBuf,
    export: Arc<NvwcExport>,
    stop: Arc<tokio::sync::Notify>,
) -> Result<()> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let _ = std::fs::remove_file(&path);
    let l = tokio::net::UnixListener::bind(&path)
        .with_context(|| format!("control socket {}", path.display()))?;
    loop {
        let (conn, _) = l.accept().await?;
        let (export, stop) = (export.clone(), stop.clone());
        tokio::spawn(async move {
            let (r, mut w) = conn.into_split();
            let mut line = String::new();
            if BufReader::new(r).read_line(&mut line).await.is_err() {
                return;
            }
            let reply = match line.trim() {
                "status" => match export.status().await {
                    Ok((st, pc)) => status_json(&export.info, &st, &pc),
                    Err(e) => format!("{{\"error\":\"{e}\"}}"),
                },
                cmd @ ("flush" | "detach") => match export.drain().await {
                    Ok(st) => {
                        if cmd == "detach" {
                            stop.notify_one();
                        }
                        format!("{{\"ok\":true,\"command\":\"{cmd}\",\"dirty_blocks\":{},\"destaged_blocks\":{}}}", st.dirty_blocks, st.destaged_blocks)
                    }
                    Err(e) => format!("{{\"error\":\"{e}\"}}"),
                },
                other => {
                    format!("{{\"error\":\"unknown command {other:?} (status, flush, detach)\"}}")
                }
            };
            let _ = w.write_all(format!("{reply}\n").as_bytes()).await;
        });
    }
}

/// Serve Prometheus text metrics over plain HTTP/1.1.
async fn metrics_loop(addr: String, export: Arc<NvwcExport>) -> Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("metrics address {addr}"))?;
    loop {
        let (mut conn, _) = l.accept().await?;
        let export = export.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            let _ = conn.read(&mut buf).await;
            let body = match export.status().await {
                Ok((st, pc)) => metrics_text(&st, &pc, &export.lat),
                Err(_) => String::new(),
            };
            let resp = format!("HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
            let _ = conn.write_all(resp.as_bytes()).await;
        });
    }
}

/// `nvwc status`, `nvwc flush`, `nvwc detach`: talk to a running server's control socket.
#[derive(clap::Args, Debug)]
pub struct CtlArgs {
    /// The server's control socket.
    #[arg(long, default_value = "nvwc-data/nvwc.ctl")]
    control: PathBuf,
}

pub fn control(cmd: &str, a: CtlArgs) -> Result<std::process::ExitCode> {
    use std::io::BufRead;
    let mut s = std::os::unix::net::UnixStream::connect(&a.control).with_context(|| {
        format!(
            "connecting to {} (is `nvwc serve` running?)",
            a.control.display()
        )
    })?;
    s.write_all(format!("{cmd}\n").as_bytes())?;
    let mut line = String::new();
    std::io::BufReader::new(s).read_line(&mut line)?;
    print!("{line}");
    Ok(if line.contains("\"error\"") {
        std::process::ExitCode::from(1)
    } else {
        std::process::ExitCode::SUCCESS
    })
}

impl Export for NvwcExport {
    fn info(&self) -> ExportInfo {
        self.info.clone()
    }
    fn read(&self, _ctx: RequestCtx, offset: u64, len: u32) -> BoxFuture<'_, NbdResult<Bytes>> {
        Box::pin(async move {
            Ok(self
                .call(ReqOp::Read { offset, len })
                .await?
                .unwrap_or_default())
        })
    }
    fn write(
        &self,
        _ctx: RequestCtx,
        offset: u64,
        data: Bytes,
        fua: bool,
    ) -> BoxFuture<'_, NbdResult<()>> {
        Box::pin(async move {
            self.call(ReqOp::Write { offset, data, fua })
                .await
                .map(|_| ())
        })
    }
    fn flush(&self, _ctx: RequestCtx) -> BoxFuture<'_, NbdResult<()>> {
        Box::pin(async move { self.call(ReqOp::Flush).await.map(|_| ()) })
    }
    fn trim(
        &self,
        _ctx: RequestCtx,
        offset: u64,
        len: u32,
        fua: bool,
    ) -> BoxFuture<'_, NbdResult<()>> {
        Box::pin(async move {
            self.call(ReqOp::Trim { offset, len }).await?;
            if fua {
                self.call(ReqOp::Flush).await?;
            }
            Ok(())
        })
    }
    fn write_zeroes(
        &self,
        _ctx: RequestCtx,
        offset: u64,
        len: u32,
        flags: WriteZeroesFlags,
    ) -> BoxFuture<'_, NbdResult<()>> {
        Box::pin(async move {
            if flags.fast_zero {
                // Zeroes are written like data: not faster than a write.
                return Err(NbdError::new(nvwc_nbd::ErrorCode::NotSup, "no fast zero"));
            }
            self.call(ReqOp::WriteZeroes {
                offset,
                len,
                fua: flags.fua,
            })
            .await
            .map(|_| ())
        })
    }
    fn cache(&self, _ctx: RequestCtx, offset: u64, len: u32) -> BoxFuture<'_, NbdResult<()>> {
        // A read fills the cache (read-allocate).
        Box::pin(async move { self.call(ReqOp::Read { offset, len }).await.map(|_| ()) })
    }
}

// ------------------------------------------------------------------ setup

fn open_or_create(path: &Path, size: u64) -> Result<(File, bool)> {
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
    }
    let created = !path.exists();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    if created {
        f.set_len(size)
            .with_context(|| format!("sizing {}", path.display()))?;
    }
    Ok((f, created))
}

fn file_len(f: &mut File) -> Result<u64> {
    Ok(f.seek(SeekFrom::End(0))?)
}

fn read_at(f: &File, off: u64, len: u64) -> Result<Vec<u8>> {
    let mut b = vec![0u8; len as usize];
    f.read_exact_at(&mut b, off)?;
    Ok(b)
}

/// Open (recover or format) the engine for these files.
fn open_engine(cfg: Config, cache: &File, fresh: bool) -> Result<Engine<Bytes>> {
    let l = Layout::new(&cfg);
    let sb = read_at(cache, 0, 512)?;
    if !fresh && layout::Superblock::decode(&sb).is_ok() {
        let image = CacheImage {
            superblock: sb,
            commit_a: read_at(cache, l.commit_offset(0), 512)?,
            commit_b: read_at(cache, l.commit_offset(1), 512)?,
            table: read_at(cache, layout::TABLE_OFFSET, l.table_bytes)?,
        };
        let (e, rep) = Engine::recover(cfg, &image).context("recovering the cache device")?;
        eprintln!(
            "nvwc: level=info event=recovered commit={} clean_shutdown={} dirty={} clean={} discarded={}",
            rep.commit, rep.clean_shutdown, rep.dirty_versions, rep.clean_versions, rep.discarded
        );
        return Ok(e);
    }
    let uuid = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    for (off, b) in layout::format_writes(&cfg, uuid) {
        cache.write_all_at(&b, off)?;
    }
    cache.sync_data()?;
    eprintln!(
        "nvwc: level=info event=formatted capacity_blocks={} block_size={}",
        cfg.capacity_blocks, cfg.block_size
    );
    Ok(Engine::new(cfg)?)
}

pub fn run(a: Args) -> Result<std::process::ExitCode> {
    let bs = a.block_size;
    if !(512..=1 << 20).contains(&bs) || !bs.is_power_of_two() {
        bail!("--block-size must be a power of two between 512 and 1M");
    }
    let wp: WritePolicyKind = a.write_policy.parse()?;
    let repl: ReplacementKind = a
        .replacement
        .parse()
        .map_err(|e| anyhow::anyhow!("--replacement: {e}"))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let spec = a.backing.to_string_lossy().to_string();
    let upstream = spec.starts_with("nbd://") || spec.starts_with("nbd+unix://");
    let (backend, backing_len, redo) = if upstream {
        if wp.is_journaled() {
            bail!("--write-policy {wp} needs a file backing store for atomic checkpoints (the redo log); over an upstream NBD server use write-through, write-back or ordered");
        }
        let client = rt
            .block_on(nvwc_nbd::Client::connect(&spec))
            .with_context(|| format!("connecting to {spec}"))?;
        let len = client.size();
        (
            Backend::Nbd(Arc::new(client), rt.handle().clone()),
            len,
            None,
        )
    } else {
        let (mut backing, _) = open_or_create(&a.backing, a.size)?;
        let redo_path = PathBuf::from(format!("{}.nvwc-redo", a.backing.display()));
        let replayed = Redo::replay(&redo_path, &backing)?;
        if replayed > 0 {
            eprintln!("nvwc: level=info event=redo_replayed writes={replayed}");
        }
        let len = file_len(&mut backing)?;
        (Backend::File(backing), len, Some(Redo { path: redo_path }))
    };
    let (mut cache, cache_new) = open_or_create(&a.cache, a.cache_size)?;
    let usable = backing_len / bs * bs;
    let capacity = Layout::capacity_for(file_len(&mut cache)?, bs as u32);
    if usable == 0 {
        bail!(
            "backing store {} is smaller than one block",
            a.backing.display()
        );
    }
    let mut cfg = Config::new(bs as u32, capacity, usable, wp);
    cfg.replacement = repl;
    cfg.journal.txn_max_blocks = a.txn_blocks;
    cfg.journal.txn_max_age_ns = a.txn_age_ms * 1_000_000;
    cfg.watermarks = Watermarks {
        high: a.high_watermark,
        low: a.low_watermark,
    };
    cfg.fetch = a
        .fetch
        .parse()
        .map_err(|e| anyhow::anyhow!("--fetch: {e}"))?;
    cfg.patch_mem_bytes = a.patch_mem;
    cfg.patch_direct = a.patch_direct;
    cfg.validate()?;
    let eng = open_engine(cfg.clone(), &cache, cache_new)?;
    let max_write = eng.max_write_bytes();

    let (tx, rx) = mpsc::channel::<Msg>();
    let cache_dev = Arc::new(Device {
        backend: Backend::File(cache),
        groups: Mutex::default(),
        redo: None,
    });
    let backing_dev = Arc::new(Device {
        backend,
        groups: Mutex::default(),
        redo,
    });
    let cache_q = spawn_pool(cache_dev.clone(), tx.clone(), 2);
    // An upstream NBD server serves many requests at once; each pool thread
    // waits for one, so give it more threads than a local file needs.
    let backing_q = spawn_pool(backing_dev, tx.clone(), if upstream { 16 } else { 4 });
    let engine_thread =
        std::thread::spawn(move || run_engine(eng, rx, cache_dev, cache_q, backing_q));

    let mut info = ExportInfo::new("", usable).with_all_features();
    info.description = format!("nvwc {wp} cache over {}", a.backing.display());
    info.read_only = a.read_only;
    info.can_fast_zero = false;
    info.min_block = 1;
    info.pref_block = bs as u32;
    info.max_block =
        (max_write.min(nvwc_nbd::export::MAX_BLOCK_LIMIT as u64) as u32).max(bs as u32);
    let export = Arc::new(NvwcExport {
        tx: Mutex::new(tx.clone()),
        info,
        lat: Latency::default(),
    });
    let ctl_export = export.clone();
    let ctl_path = a.control.clone();
    let metrics_addr = a.metrics.clone();

    let code = rt.block_on(async move {
        let server = nvwc_nbd::Server::builder().export(export).build()?;
        let stop = Arc::new(tokio::sync::Notify::new());
        let ctl = tokio::spawn(control_loop(ctl_path, ctl_export.clone(), stop.clone()));
        if let Some(m) = metrics_addr {
            tokio::spawn(metrics_loop(m, ctl_export.clone()));
        }
        let _ = std::fs::remove_file(&a.unix);
        if let Some(d) = a.unix.parent() {
            if !d.as_os_str().is_empty() {
                std::fs::create_dir_all(d)?;
            }
        }
        server.listen_unix(&a.unix).await.with_context(|| format!("listening on {}", a.unix.display()))?;
        let mut tcp = None;
        if a.listen != "none" {
            tcp = Some(server.listen_tcp(a.listen.as_str()).await.with_context(|| format!("listening on {}", a.listen))?);
        }
        let sock = std::fs::canonicalize(&a.unix).unwrap_or(a.unix.clone());
        let uri = format!("nbd+unix:///?socket={}", sock.display());
        println!("nvwc: serving {} ({} bytes) through {} ({} blocks of {bs} bytes), write policy {wp}", a.backing.display(), usable, a.cache.display(), cfg.capacity_blocks);
        println!("  unix socket: {}", sock.display());
        if let Some(addr) = tcp {
            println!("  tcp:         nbd://{addr}/");
        }
        println!("connect with:");
        println!("  nbdinfo '{uri}'");
        println!("  qemu-io -f raw -c 'write -P 0xab 0 64k' -c 'read -P 0xab 0 64k' '{uri}'");
        println!("  mkdir -p /tmp/nvwc-fuse && nbdfuse /tmp/nvwc-fuse/disk '{uri}' &   # then: losetup -f --show /tmp/nvwc-fuse/disk");
        println!("stop with Ctrl-C or SIGTERM (in-flight requests finish, metadata is committed)");
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = term.recv() => {},
            _ = stop.notified() => eprintln!("nvwc: level=info event=detached dirty_blocks=0"),
        }
        eprintln!("nvwc: level=info event=stopping");
        ctl.abort();
        server.shutdown().await;
        anyhow::Ok(())
    });
    code?;
    let (ack, done) = mpsc::channel();
    let _ = tx.send(Msg::Shutdown(ack));
    if let Ok(stats) = done.recv_timeout(Duration::from_secs(60)) {
        eprintln!(
            "nvwc: level=info event=stopped dirty_blocks={} writes={} reads={} read_hits={} commits={}",
            stats.dirty_blocks, stats.writes, stats.reads, stats.read_hits, stats.commits
        );
    }
    drop(engine_thread);
    Ok(std::process::ExitCode::SUCCESS)
}

/// `nvwc recover`: make a backing store consistent on its own (after losing
/// the cache device) by finishing a journaled checkpoint its redo log holds.
#[derive(clap::Args, Debug)]
pub struct RecoverArgs {
    /// The backing store file.
    #[arg(long)]
    backing: PathBuf,
}

pub fn recover(a: RecoverArgs) -> Result<std::process::ExitCode> {
    let backing = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&a.backing)
        .with_context(|| format!("opening {}", a.backing.display()))?;
    let redo = PathBuf::from(format!("{}.nvwc-redo", a.backing.display()));
    let n = Redo::replay(&redo, &backing)?;
    if n > 0 {
        println!(
            "nvwc recover: finished an interrupted checkpoint ({n} writes); {} is consistent",
            a.backing.display()
        );
    } else {
        println!(
            "nvwc recover: no interrupted checkpoint; {} is consistent as it is",
            a.backing.display()
        );
    }
    Ok(std::process::ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("64m"), Ok(64 << 20));
        assert_eq!(parse_size("8G"), Ok(8 << 30));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("x").is_err());
    }

    #[test]
    fn redo_log_replays_a_committed_group_and_ignores_a_torn_one() {
        let dir = std::env::temp_dir().join(format!("nvwc-redo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bpath = dir.join("b.img");
        let b = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&bpath)
            .unwrap();
        b.set_len(8192).unwrap();
        let log = dir.join("b.img.nvwc-redo");
        // A committed group that was never applied: write the log by hand.
        let redo = Redo { path: log.clone() };
        let writes = vec![
            (0u64, Bytes::from(vec![7u8; 512])),
            (4096, Bytes::from(vec![9u8; 512])),
        ];
        redo.commit_and_apply(&b, &writes).unwrap();
        assert_eq!(
            std::fs::metadata(&log).unwrap().len(),
            0,
            "log truncated after apply"
        );
        // Recreate a logged-but-unapplied group and replay it.
        let mut buf = Vec::new();
        buf.extend_from_slice(REDO_MAGIC);
        buf.extend_from_slice(&1u64.to_le_bytes());
        buf.extend_from_slice(&1024u64.to_le_bytes());
        buf.extend_from_slice(&3u64.to_le_bytes());
        buf.extend_from_slice(&[1, 2, 3]);
        let crc = crc32fast::hash(&buf);
        buf.extend_from_slice(&crc.to_le_bytes());
        std::fs::write(&log, &buf).unwrap();
        assert_eq!(Redo::replay(&log, &b).unwrap(), 1);
        assert_eq!(read_at(&b, 1024, 3).unwrap(), vec![1, 2, 3]);
        // A torn log (bad checksum) is not applied.
        buf[20] ^= 1;
        std::fs::write(&log, &buf).unwrap();
        b.write_all_at(&[0, 0, 0], 1024).unwrap();
        assert_eq!(Redo::replay(&log, &b).unwrap(), 0);
        assert_eq!(read_at(&b, 1024, 3).unwrap(), vec![0, 0, 0]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
