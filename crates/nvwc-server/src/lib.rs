//! `nvwc serve`: an NBD server that caches writes on a persistent cache file.
//!
//! Every export (the default one from `--backing`/`--cache`, and each
//! `--export`) has its own engine (`nvwc_core::Engine`), run by a
//! [`host::Host`]: the engine sits in a mutex and is pumped by whichever
//! thread has work for it. A connection's task runs its request and the
//! inline cache I/O itself (a cache hit never leaves that thread); syncs, FUA
//! writes and backing-store commands run on small worker pools, one per
//! device, whose threads complete them under the same lock. Every connection
//! of an export shares its engine, so a FLUSH or FUA on one connection covers
//! writes acknowledged on all of them: multi-conn is true.
//!
//! Crash story (see `docs/ON-DISK-FORMAT.md`): the engine acknowledges a plain
//! write once it is in the cache file, and a FLUSH or FUA write only after a
//! commit (fdatasync of data, shadow-paged metadata write, fdatasync, commit
//! record written and synced). After `kill -9` the next start recovers the last
//! commit: every write acknowledged before a completed FLUSH, and every FUA
//! write, is there. Journaled checkpoints reach the backing file through the
//! redo log in `<backing>.nvwc-redo`, or an upstream NBD export through the
//! redo region at its end (`docs/BACKING-FORMAT.md`), replayed on start and by
//! `nvwc recover`, so the backing store alone is always at a checkpoint
//! boundary.
//!
//! Binding (`bind.rs`, `format.rs`, `label.rs`; `docs/ON-DISK-FORMAT.md`,
//! "Binding"): a cache is opened only with the backing store its superblock
//! names (the store carries a label naming the cache), and a cache device is
//! formatted only when it is blank. Both are decided before anything is
//! written to either device.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use nvwc_core::layout::{self, Layout};
use nvwc_core::*;
use nvwc_nbd::export::{BoxFuture, Export, ExportInfo, NbdResult, RequestCtx, WriteZeroesFlags};
use nvwc_nbd::NbdError;

mod bind;
pub mod config_file;
pub mod errors;
pub mod fault;
pub mod format;
mod host;
mod label;
pub mod log;
mod mapped;
mod notify;
pub mod status;
pub mod tls;
mod upstream;
use log::log;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A configuration file (TOML; `contrib/nvwc.example.toml`): its
    /// settings and exports, under the flags given here. `SIGHUP` reloads it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The configuration file as loaded (`config_file::apply`).
    #[arg(skip)]
    loaded: Option<config_file::Loaded>,
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
    /// Background fetches (async-bg, and lazy's patch cleaning) in flight at
    /// most. Match it to the backing store's parallelism: below it, lazy
    /// retires patches no faster than blocking fetches. (An upstream NBD
    /// backing store is driven by 64 worker threads, a file by 4.)
    #[arg(long, default_value_t = 64)]
    fetch_inflight: u32,
    /// Write-back only: write a patched block back as partial writes to the
    /// backing store, with no fetch.
    #[arg(long)]
    patch_direct: bool,
    /// Write-back only: rewrite committed dirty blocks in place (the
    /// default), as a disk and dm-writecache do. `--rewrite-in-place=false`
    /// writes every rewrite to a fresh slot instead: slower (slot churn and
    /// commits), but a cache-device write that *fails* part-way then cannot
    /// damage the block's last flushed version. Crashes keep every FLUSH/FUA
    /// promise either way (`docs/ON-DISK-FORMAT.md`).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_value_t = true,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    rewrite_in_place: bool,
    /// Write-back only: a write that would wait for cache space goes around
    /// the cache to the backing store instead (the default), where none of
    /// its blocks is cached, as bcache bypasses writeback on a nearly full
    /// cache. It is an ordinary backing write; the next FLUSH flushes the
    /// backing store before it answers. `--bypass-when-full=false` makes it
    /// wait for a slot (destage and eviction) as the papers' write-back does.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_value_t = true,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    bypass_when_full: bool,
    /// Write-back with --bypass-when-full: while writes go around the full
    /// cache, write the dirty blocks above the low watermark back over this
    /// many seconds instead of at full speed, as bcache paces its writeback
    /// (its writeback_rate_p_term_inverse, 40 by default). Destaging to make
    /// room costs cache writes, reads and syncs that a write sent around the
    /// cache does not. Full speed returns a second after the last write
    /// went around, and whenever a write must wait for a slot. 0: never paced
    #[arg(long, value_name = "SECS", default_value_t = 40)]
    full_clean_secs: u32,
    /// Serve the export read-only.
    #[arg(long)]
    read_only: bool,
    /// Admission policy: which writes go to the cache (`all`, `sync`, `wal`,
    /// `critical`, `critical+pi`, `critical+pi+ioi`); the others go straight
    /// to the backing store with FUA when the write policy allows it.
    #[arg(long, default_value = "all")]
    admission: String,
    /// A write-ahead-log byte range for `--admission wal`, `START:LEN`
    /// (sizes like 0:64M); repeatable.
    #[arg(long = "wal-range", value_name = "START:LEN", value_parser = parse_range)]
    wal_range: Vec<(u64, u64)>,
    /// Control socket for `nvwc status`, `nvwc flush` and `nvwc detach`.
    #[arg(long, default_value = "nvwc-data/nvwc.ctl")]
    control: PathBuf,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9180).
    #[arg(long)]
    metrics: Option<String>,
    /// Another export, repeatable: `NAME=BACKING[,cache=PATH][,cache-size=SIZE]`
    /// `[,size=SIZE][,policy=P][,replacement=R][,read-only][,critical]`; or
    /// `NAME:critical` to mark an export's requests critical for admission
    /// (`:critical` for the default export). Each export has
    /// its own engine, cache and backing; unset keys come from the flags above,
    /// and the cache defaults to `cache-NAME.img` beside `--cache`. The export
    /// built from `--backing`/`--cache` answers to the empty name.
    #[arg(long = "export", value_name = "NAME=BACKING[,key=value...]")]
    export: Vec<String>,
    /// Serve only the `--export`s, and let this one answer to the empty name
    /// (no export is built from `--backing`/`--cache`).
    #[arg(long, value_name = "NAME")]
    default_export: Option<String>,
    /// Log format: `text` (key=value) or `json`; default from `NVWC_LOG`, else text.
    #[arg(long)]
    log_format: Option<String>,
    /// Log level: error, warn, info or debug; default from `NVWC_LOG`, else info.
    #[arg(long)]
    log_level: Option<String>,
    /// Journaled over an upstream NBD server: bytes reserved at the end of the
    /// upstream export for the redo log (default: what the configuration
    /// needs, at least 16M). Used only when the region is created.
    #[arg(long, value_parser = parse_size)]
    redo_size: Option<u64>,
    /// Commit cache metadata (and sync the cache device) at least this often
    /// while anything changed, even without a client FLUSH: this bounds what
    /// `kill -9` can take of writes no FLUSH covered.
    #[arg(long, default_value_t = 1000)]
    commit_interval_ms: u64,
    /// Bind each export's cache to the backing store given even when the
    /// cache is bound to another one (a disk moved or copied on purpose),
    /// or the store has been bound to another cache since. The cache's
    /// dirty blocks are then written to this store. Logged at warn.
    #[arg(long)]
    force_attach: bool,
    /// Also commit once this many cache entries changed (default: the
    /// cache's block count, at least 4096, so in practice the interval
    /// decides). FLUSH, FUA and reclaiming space commit whenever they need
    /// to. Every commit syncs the cache device and makes the next rewrite of
    /// each block go to a fresh slot, so frequent commits cost throughput.
    #[arg(long)]
    commit_changes: Option<u32>,
    #[command(flatten)]
    tls: crate::tls::TlsArgs,
}

/// Parse a byte range `START:LEN` (sizes as in [`parse_size`]).
pub fn parse_range(s: &str) -> Result<(u64, u64), String> {
    let (a, b) = s
        .split_once(':')
        .ok_or_else(|| format!("expected START:LEN, got {s:?}"))?;
    let (start, len) = (parse_size(a)?, parse_size(b)?);
    if len == 0 {
        return Err(format!("empty range {s:?}"));
    }
    start
        .checked_add(len)
        .ok_or_else(|| format!("range {s:?} overflows"))?;
    Ok((start, len))
}

pub use nvwc_core::units::parse_size;

// ------------------------------------------------------------------ devices

/// Redo log for atomic groups on a plain backing file: `<backing>.nvwc-redo`.
struct Redo {
    path: PathBuf,
    /// The log may hold a group that is not fully applied (an earlier
    /// commit failed after it began writing the log): see `commit_and_apply`.
    pending: std::sync::atomic::AtomicBool,
}

const REDO_MAGIC: &[u8; 8] = b"NVWCREDO";

impl Redo {
    /// Write the group to the log and sync it, then apply it in place, sync,
    /// and truncate the log. A crash before the log is synced leaves the
    /// backing file untouched; after, replay finishes the group.
    fn commit_and_apply(&self, backing: &File, writes: &[(u64, Bytes)]) -> std::io::Result<()> {
        use std::sync::atomic::Ordering;
        // A group an earlier commit logged but could not finish (an I/O error
        // mid-apply) may be partly in place: finish it before its log is
        // overwritten, or it could never be replayed. If that fails, this
        // group is not started.
        if self.pending.load(Ordering::Acquire) {
            Self::replay(&self.path, backing).map_err(std::io::Error::other)?;
        }
        self.pending.store(true, Ordering::Release);
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
        for (i, (off, d)) in writes.iter().enumerate() {
            if i == writes.len() / 2 {
                crate::fault::failpoint("redo-apply");
            }
            backing.write_all_at(d, *off)?;
        }
        backing.sync_data()?;
        f.set_len(0)?;
        f.sync_data()?;
        self.pending.store(false, Ordering::Release);
        Ok(())
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
type UpFuture = std::pin::Pin<Box<dyn std::future::Future<Output = IoResult<Bytes>> + Send>>;

/// Where a device's bytes live.
enum Backend {
    File(File),
    /// An upstream NBD export, driven from the worker threads through the runtime.
    /// Journaled groups go through the redo region at the end of the upstream.
    Nbd(Arc<upstream::Upstream>, tokio::runtime::Handle),
}

struct Device {
    backend: Backend,
    /// The cache file mapped (`mapped.rs`): direct writes are received into
    /// it; private in host-crash mode (`fault.rs`), where it is the device's
    /// view of writes not yet durable and every write goes to it. Plain
    /// writes are `pwrite`n otherwise: into the page cache's single pages
    /// (`small_pages`) that is cheaper than copying into the mapping, whose
    /// pages each fault again after every sync (4 KiB random rewrites at
    /// QD16: ~195k IOPS with `pwrite`, ~182k copied into the mapping;
    /// rewrites into fresh slots ~171k against ~98k). `None` for the
    /// backing store, or when the file cannot be mapped.
    map: Option<mapped::Mapped>,
    groups: Mutex<HashMap<u64, Vec<(u64, Bytes)>>>,
    redo: Option<Redo>,
    /// Fault injection, host-crash overlay, failpoints and the failed flag (`fault.rs`).
    fault: crate::fault::Layer,
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
    fn execute(&self, op: &IoOp<Bytes>, group: Option<u64>) -> IoResult<Bytes> {
        self.fault.run(op, group, self)
    }

    /// A local file (not an upstream NBD server).
    fn is_file(&self) -> bool {
        matches!(self.backend, Backend::File(_))
    }

    /// An upstream's read, write, flush or checksum as a future on the
    /// upstream's runtime, for the host to spawn rather than hand to a pool
    /// thread that would block on it (`host.rs`): one request on the wire
    /// either way, without the thread hop. `None` where the command must
    /// run through [`Device::execute_issued`]: a local file, an atomic
    /// group's part (the redo log), or a fault layer in the way.
    fn upstream_async(
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
    fn execute_issued(
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
    fn write_parts(&self, offset: u64, parts: &[&Bytes]) -> IoResult<Bytes> {
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
                    // A group's writes wait for its end (below).
                    IoOp::Write { offset, data, .. } if group.is_some() => {
                        let g = group.expect("checked");
                        let mut groups = self.groups.lock().unwrap();
                        groups.entry(g).or_default().push((*offset, data.clone()));
                        Ok(None)
                    }
                    IoOp::Read { offset, len } => {
                        rt.block_on(c.read(*offset, *len)).map(Some).map_err(e)
                    }
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
                        self.groups.lock().unwrap().insert(*group, Vec::new());
                        Ok(None)
                    }
                    IoOp::GroupEnd { group } => {
                        let writes = self.groups.lock().unwrap().remove(group);
                        let writes = writes.unwrap_or_default();
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
                };
            }
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
                    self.groups
                        .lock()
                        .unwrap()
                        .entry(g)
                        .or_default()
                        .push((*offset, data.clone()));
                    return Ok(None);
                }
                // Plain writes are `pwrite`s, also where the file is mapped
                // (`serve::small_pages`). A private mapping never reaches the
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

/// A checksum command's answer: the CRC-32C of `b`, little-endian.
fn crc_payload(b: &[u8]) -> Bytes {
    Bytes::copy_from_slice(&nvwc_core::layout::data_crc(b).to_le_bytes())
}

// ------------------------------------------------------------------ NBD export

/// Largest READ/WRITE payload every export advertises and accepts
/// (`NBD_INFO_BLOCK_SIZE`), whatever its cache size and write policy: the
/// NBD spec's 32 MiB, what a client that negotiated nothing may send, and
/// the most qemu's client ever asks for. Writes longer than the engine takes
/// at once are split into several engine writes ([`NvwcExport::split`]).
const MAX_PAYLOAD: u32 = 32 << 20;

/// One export: its engine host, as the NBD server sees it.
struct NvwcExport {
    host: Arc<host::Host>,
    info: ExportInfo,
    /// Cache block size.
    block: u64,
    /// Most cache blocks one engine request may span: longer client
    /// requests are split ([`NvwcExport::split`]).
    split_blocks: u64,
    /// Request latency per class: `[normal, critical]` (admission hints).
    lat: [Latency; 2],
    /// Every request of this export is critical (`--export NAME:critical`;
    /// a configuration file's `critical`, which `SIGHUP` reloads).
    critical: std::sync::atomic::AtomicBool,
    /// Connections marked critical by `nvwc hint` (looked up only while
    /// `hinted` is non-zero, so unhinted serving takes no lock).
    hints: Mutex<std::collections::HashSet<u64>>,
    hinted: AtomicU64,
    /// The cache device (a handle for its superblock) and its superblock as
    /// bound at start: `nvwc detach` marks it emptied.
    cache_path: PathBuf,
    cache_meta: File,
    superblock: layout::Superblock,
}

/// Upper bounds (µs) of the latency histogram buckets; the last is +Inf.
const LAT_BOUNDS_US: [u64; 12] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
];
const OPS: [&str; 5] = ["read", "write", "flush", "trim", "write_zeroes"];

/// Per-operation latency histograms (Prometheus style: cumulative at export).
#[derive(Default)]
struct Latency {
    counts: [[AtomicU64; 13]; 5],
    sums_us: [AtomicU64; 5],
}

impl Latency {
    fn record(&self, op: usize, us: u64) {
        let b = LAT_BOUNDS_US
            .iter()
            .position(|&x| us <= x)
            .unwrap_or(LAT_BOUNDS_US.len());
        self.counts[op][b].fetch_add(1, Ordering::Relaxed);
        self.sums_us[op].fetch_add(us, Ordering::Relaxed);
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
    /// The admission tag of a request on connection `conn`.
    fn tag(&self, conn: u64) -> Tag {
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
    fn set_hint(&self, conn: u64, on: bool) {
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

macro_rules! stat_fields {
    ($m:ident) => {
        $m!(requests reads writes flushes trims read_bytes write_bytes read_hits read_misses write_hits write_misses
            overwrites direct_writes cache_reads cache_read_bytes cache_writes cache_write_bytes cache_flushes backing_reads
            backing_read_bytes backing_writes backing_write_bytes backing_flushes backing_groups fetches populates
            stalled_writes stall_ns admission_stalls block_waits block_wait_ns evictions destaged_blocks destage_plans destage_failures commits commit_failures
            io_errors patches_created patch_merges patch_reads patch_fetches patch_direct_writes patch_discards
            patch_fallbacks patch_waits patch_fetch_errors patch_persists partial_read_fetches partial_write_fetches admitted_pieces bypassed_pieces bypassed_bytes bypass_refused full_bypassed_writes full_dropped_clean
            reissued_writes discarded_completions critical_admitted_pieces critical_bypassed_pieces
            critical_reissued_writes inherited patched_blocks patch_bytes dirty_blocks cached_blocks free_slots)
    };
}

fn stats_pairs(st: &Stats) -> Vec<(&'static str, u64)> {
    macro_rules! pairs {
        ($($f:ident)*) => { vec![$((stringify!($f), st.$f)),*] };
    }
    stat_fields!(pairs)
}

fn json_string(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// `nvwc status`: `{"exports":[{"name":...,"export_size":...,"description":...,"stats":{...},"policy":{...}},...]}`.
fn status_json(exports: &[Arc<NvwcExport>], conns: &Conns) -> String {
    let items: Vec<String> = exports
        .iter()
        .map(|e| {
            let (st, pc) = e.host.status();
            let kv = |v: &[(&str, u64)]| {
                v.iter()
                    .map(|(k, v)| format!("\"{k}\":{v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            };
            format!(
                "{{\"name\":{},\"export_size\":{},\"description\":{},\"critical\":{},\"stats\":{{{}}},\"policy\":{{{}}}}}",
                json_string(&e.info.name),
                e.info.size,
                json_string(&e.info.description),
                e.critical.load(Ordering::Relaxed),
                kv(&stats_pairs(&st)),
                kv(&pc)
            )
        })
        .collect();
    let cs: Vec<String> = conns
        .lock()
        .unwrap()
        .iter()
        .map(|(id, (peer, export))| {
            let critical = export.as_ref().is_some_and(|x| {
                exports.iter().any(|e| {
                    &e.info.name == x
                        && (e.critical.load(Ordering::Relaxed)
                            || e.hints.lock().unwrap().contains(id))
                })
            });
            format!(
                "{{\"id\":{id},\"peer\":{},\"export\":{},\"critical\":{critical}}}",
                json_string(peer),
                export.as_deref().map_or("null".to_string(), json_string)
            )
        })
        .collect();
    format!(
        "{{\"exports\":[{}],\"connections\":[{}]}}",
        items.join(","),
        cs.join(",")
    )
}

/// Prometheus text format; every series has an `export` label.
fn metrics_text(exports: &[Arc<NvwcExport>]) -> String {
    let snaps: Vec<_> = exports.iter().map(|e| (e, e.host.status())).collect();
    let mut o = String::new();
    let label = |e: &NvwcExport| format!("export={}", json_string(&e.info.name));
    if let Some((_, (st, pc))) = snaps.first() {
        for (k, _) in stats_pairs(st) {
            let kind = if matches!(
                k,
                "dirty_blocks" | "cached_blocks" | "free_slots" | "patched_blocks" | "patch_bytes"
            ) {
                "gauge"
            } else {
                "counter"
            };
            o += &format!("# TYPE nvwc_{k} {kind}\n");
            for (e, (st, _)) in &snaps {
                let v = stats_pairs(st)
                    .into_iter()
                    .find(|(n, _)| *n == k)
                    .map_or(0, |p| p.1);
                o += &format!("nvwc_{k}{{{}}} {v}\n", label(e));
            }
        }
        let _ = pc;
    }
    for (e, (_, pc)) in &snaps {
        for (k, v) in pc {
            o += &format!("# TYPE nvwc_{k} gauge\nnvwc_{k}{{{}}} {v}\n", label(e));
        }
    }
    // Admission outcomes per class (critical by an export or connection
    // hint, or normal): pieces admitted, bypassed, and reissued to the cache.
    o += "# TYPE nvwc_admission_pieces counter\n";
    for (e, (st, _)) in &snaps {
        for (outcome, all, crit) in [
            ("admitted", st.admitted_pieces, st.critical_admitted_pieces),
            ("bypassed", st.bypassed_pieces, st.critical_bypassed_pieces),
            ("reissued", st.reissued_writes, st.critical_reissued_writes),
        ] {
            for (class, v) in [("critical", crit), ("normal", all - crit)] {
                o += &format!(
                    "nvwc_admission_pieces{{{},class=\"{class}\",outcome=\"{outcome}\"}} {v}\n",
                    label(e)
                );
            }
        }
    }
    o += "# TYPE nvwc_request_latency_seconds histogram\n";
    for (e, _) in &snaps {
        let l = label(e);
        // `class`: the admission class of the request (critical by an export
        // or connection hint, or normal).
        for (lat, class) in e.lat.iter().zip(["normal", "critical"]) {
            for (i, op) in OPS.iter().enumerate() {
                let mut cum = 0;
                for (b, bound) in LAT_BOUNDS_US.iter().enumerate() {
                    cum += lat.counts[i][b].load(Ordering::Relaxed);
                    o += &format!(
                        "nvwc_request_latency_seconds_bucket{{{l},class=\"{class}\",op=\"{op}\",le=\"{}\"}} {cum}\n",
                        *bound as f64 / 1e6
                    );
                }
                cum += lat.counts[i][LAT_BOUNDS_US.len()].load(Ordering::Relaxed);
                o += &format!(
                    "nvwc_request_latency_seconds_bucket{{{l},class=\"{class}\",op=\"{op}\",le=\"+Inf\"}} {cum}\n"
                );
                o += &format!(
                    "nvwc_request_latency_seconds_sum{{{l},class=\"{class}\",op=\"{op}\"}} {}\n",
                    lat.sums_us[i].load(Ordering::Relaxed) as f64 / 1e6
                );
                o += &format!(
                    "nvwc_request_latency_seconds_count{{{l},class=\"{class}\",op=\"{op}\"}} {cum}\n"
                );
            }
        }
    }
    o
}

/// The exports being served. `SIGHUP` may add one (`config_file::reload`),
/// so the control socket, metrics and shutdown take a snapshot each time.
#[derive(Default)]
struct ExportList(std::sync::RwLock<Vec<Arc<NvwcExport>>>);

impl ExportList {
    fn all(&self) -> Vec<Arc<NvwcExport>> {
        self.0.read().unwrap().clone()
    }

    fn push(&self, e: Arc<NvwcExport>) {
        self.0.write().unwrap().push(e);
    }
}

/// Serve the control socket: one command per line (`status`, `flush`,
/// `detach`), one JSON line back. `flush` and `detach` cover every export.
async fn control_loop(
    path: PathBuf,
    exports: Arc<ExportList>,
    stop: Arc<tokio::sync::Notify>,
    conns: Conns,
) -> Result<()> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let _ = std::fs::remove_file(&path);
    let l = tokio::net::UnixListener::bind(&path)
        .with_context(|| format!("control socket {}", path.display()))?;
    loop {
        let (conn, _) = l.accept().await?;
        let (exports, stop, conns) = (exports.all(), stop.clone(), conns.clone());
        tokio::spawn(async move {
            let (r, mut w) = conn.into_split();
            let mut line = String::new();
            if BufReader::new(r).read_line(&mut line).await.is_err() {
                return;
            }
            let reply = match line.trim() {
                "status" => status_json(&exports, &conns),
                l if l.starts_with("hint ") => control_hint(&l[5..], &exports, &conns),
                cmd @ ("flush" | "detach") => {
                    log!(info, "control", command = cmd);
                    let (mut dirty, mut destaged, mut err) = (0, 0, false);
                    for e in exports.iter() {
                        match e.host.drain(cmd == "detach").await {
                            Some(st) => {
                                dirty += st.dirty_blocks;
                                destaged += st.destaged_blocks;
                            }
                            None => err = true,
                        }
                    }
                    if err {
                        "{\"error\":\"engine stopped\"}".to_string()
                    } else {
                        if cmd == "detach" {
                            stop.notify_one();
                        }
                        format!("{{\"ok\":true,\"command\":\"{cmd}\",\"dirty_blocks\":{dirty},\"destaged_blocks\":{destaged}}}")
                    }
                }
                other => {
                    format!(
                        "{{\"error\":\"unknown command {other:?} (status, flush, detach, hint)\"}}"
                    )
                }
            };
            let _ = w.write_all(format!("{reply}\n").as_bytes()).await;
        });
    }
}

/// Serve Prometheus text metrics over plain HTTP/1.1.
async fn metrics_loop(addr: String, exports: Arc<ExportList>) -> Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind(&addr)
        .await
        .with_context(|| format!("metrics address {addr}"))?;
    loop {
        let (mut conn, _) = l.accept().await?;
        let exports = exports.all();
        tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            let _ = conn.read(&mut buf).await;
            let body = metrics_text(&exports);
            let resp = format!("HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
            let _ = conn.write_all(resp.as_bytes()).await;
        });
    }
}

/// `nvwc hint`: mark a connection's requests critical (or not) for admission.
#[derive(clap::Args, Debug)]
pub struct HintArgs {
    /// The connection id (`nvwc status` lists them under "connections").
    #[arg(long)]
    connection: u64,
    /// `on` or `off`.
    #[arg(long)]
    critical: String,
    /// Check that the connection is on this export.
    #[arg(long)]
    export: Option<String>,
    #[command(flatten)]
    ctl: CtlArgs,
}

pub fn hint(a: HintArgs) -> Result<std::process::ExitCode> {
    if a.critical != "on" && a.critical != "off" {
        bail!("--critical must be on or off, not {:?}", a.critical);
    }
    let mut cmd = format!("hint {} {}", a.connection, a.critical);
    if let Some(e) = &a.export {
        cmd += &format!(" {e}");
    }
    control(&cmd, a.ctl)
}

/// `nvwc status`, `nvwc flush`, `nvwc detach`: talk to a running server's control socket.
#[derive(clap::Args, Debug)]
pub struct CtlArgs {
    /// The server's control socket.
    #[arg(long, default_value = "nvwc-data/nvwc.ctl")]
    control: PathBuf,
}

pub fn control(cmd: &str, a: CtlArgs) -> Result<std::process::ExitCode> {
    let line = ask(cmd, &a)?;
    print!("{line}");
    Ok(if line.contains("\"error\"") {
        std::process::ExitCode::from(1)
    } else {
        std::process::ExitCode::SUCCESS
    })
}

/// Send `cmd` to a running server's control socket: its one-line answer.
pub fn ask(cmd: &str, a: &CtlArgs) -> Result<String> {
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
    Ok(line)
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
    fn write(
        &self,
        ctx: RequestCtx,
        offset: u64,
        data: Bytes,
        fua: bool,
    ) -> BoxFuture<'_, NbdResult<()>> {
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
    ) -> Option<BoxFuture<'static, NbdResult<()>>> {
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
    fn flush(&self, ctx: RequestCtx) -> BoxFuture<'_, NbdResult<()>> {
        Box::pin(async move { self.call(&ctx, ReqOp::Flush).await.map(|_| ()) })
    }
    fn trim(
        &self,
        ctx: RequestCtx,
        offset: u64,
        len: u32,
        fua: bool,
    ) -> BoxFuture<'_, NbdResult<()>> {
        Box::pin(async move {
            let ops = self
                .split(offset, u64::from(len))
                .map(|(offset, len)| ReqOp::Trim {
                    offset,
                    len: len as u32,
                });
            self.calls(&ctx, ops).await?;
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
    ) -> BoxFuture<'_, NbdResult<()>> {
        Box::pin(async move {
            if flags.fast_zero {
                // Zeroes are written like data: not faster than a write.
                return Err(NbdError::new(nvwc_nbd::ErrorCode::NotSup, "no fast zero"));
            }
            let ops = self
                .split(offset, u64::from(len))
                .map(|(offset, len)| ReqOp::WriteZeroes {
                    offset,
                    len: len as u32,
                    fua: flags.fua,
                });
            self.calls(&ctx, ops).await.map(|_| ())
        })
    }
    fn cache(&self, ctx: RequestCtx, offset: u64, len: u32) -> BoxFuture<'_, NbdResult<()>> {
        // A read fills the cache (read-allocate).
        Box::pin(async move {
            let ops = self
                .split(offset, u64::from(len))
                .map(|(offset, len)| ReqOp::Read {
                    offset,
                    len: len as u32,
                });
            self.calls(&ctx, ops).await.map(|_| ())
        })
    }
}

// ------------------------------------------------------------------ setup

/// Open `path`, or create it with `size` bytes. `reserve` (the cache file):
/// a new file gets its blocks allocated now (`fallocate`), so cache writes
/// cannot fail later for want of room in the file system, as writes into a
/// sparse file can; a file system that cannot preallocate gets a sparse file
/// and a warning. Backing files stay sparse (they are the client's disk).
/// Write zeroes over `len` bytes of `f`, then sync.
///
/// In 4 KiB writes: the page cache keeps a written range in folios of the
/// write's size, and large folios make every later 4 KiB cache write (and
/// the writeback at each sync) walk all of the folio's blocks on ext4
/// (`small_pages`). About 0.5 s per GiB, once, when the cache is created.
fn zero_fill(f: &File, len: u64) -> std::io::Result<()> {
    let chunk = vec![0u8; 4096];
    let mut off = 0u64;
    while off < len {
        let n = (len - off).min(chunk.len() as u64) as usize;
        f.write_all_at(&chunk[..n], off)?;
        off += n as u64;
    }
    f.sync_data()
}

/// Keep the cache file in the page cache as single pages, not large folios.
///
/// Large folios (from writes in large chunks, or from mapping faults with
/// readahead) make every 4 KiB write into them walk all of the folio's
/// blocks on file systems that track blocks with buffer heads (ext4), and
/// so does writeback at every sync. Measured on this machine (6.18, ext4),
/// a random 4 KiB pwrite followed by fdatasync: 27 us per pwrite into large
/// folios, 4 us into single pages. The cache is accessed by slot, at random,
/// so readahead buys nothing: the file is read at random from now on, and
/// the mapping is advised the same way (`mapped.rs`); the zero fill writes
/// 4 KiB at a time (`zero_fill`). Its pages are not dropped: a page that
/// is not resident costs a read from the device when a write through the
/// mapping first touches it. Advice only: a file system that ignores it is
/// served as before.
fn small_pages(f: &File) {
    use rustix::fs::{fadvise, Advice};
    let _ = fadvise(f, 0, None, Advice::Random);
}

fn open_or_create(path: &Path, size: u64, reserve: bool) -> Result<(File, bool)> {
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
        if reserve && size > 0 {
            use rustix::fs::{fallocate, FallocateFlags};
            match fallocate(&f, FallocateFlags::empty(), 0, size) {
                Ok(()) => {
                    // Preallocated extents are "unwritten": the first write
                    // to each converts it, and every fdatasync after such a
                    // write commits the file system's journal too (a FLUSH
                    // then costs two device syncs, not one). Writing zeroes
                    // once, as databases do with their log files, leaves
                    // plain blocks that a sync only has to write.
                    let t0 = std::time::Instant::now();
                    log!(
                        info,
                        "cache_zero_filling",
                        path = path.display().to_string(),
                        bytes = size
                    );
                    zero_fill(&f, size).with_context(|| {
                        format!("zero-filling the cache file {}", path.display())
                    })?;
                    log!(
                        info,
                        "cache_zero_filled",
                        path = path.display().to_string(),
                        bytes = size,
                        ms = t0.elapsed().as_millis() as u64
                    );
                }
                Err(e) if e == rustix::io::Errno::OPNOTSUPP => {
                    log!(
                        warn,
                        "cache_sparse",
                        path = path.display().to_string(),
                        reason = "the file system cannot preallocate"
                    );
                }
                Err(e) => {
                    drop(f);
                    let _ = std::fs::remove_file(path);
                    anyhow::bail!(
                        "reserving {} bytes for the cache file {}: {e} (free some space or choose a smaller --cache-size)",
                        size,
                        path.display()
                    );
                }
            }
        }
    }
    Ok((f, created))
}

fn file_len(f: &mut File) -> Result<u64> {
    Ok(f.seek(SeekFrom::End(0))?)
}

#[cfg(test)]
fn read_at(f: &File, off: u64, len: u64) -> Result<Vec<u8>> {
    let mut b = vec![0u8; len as usize];
    f.read_exact_at(&mut b, off)?;
    Ok(b)
}

/// One export to serve, from the default flags or an `--export` value.
#[derive(Clone, Debug, PartialEq)]
struct ExportSpec {
    name: String,
    backing: String,
    cache: PathBuf,
    size: u64,
    cache_size: u64,
    write_policy: String,
    replacement: String,
    read_only: bool,
    /// Every request is critical (admission hint).
    critical: bool,
}

/// Parse `NAME=BACKING[,cache=PATH][,cache-size=S][,size=S][,policy=P][,replacement=R][,read-only]`.
/// Unset keys come from the global flags; the cache defaults to
/// `cache-NAME.img` beside `--cache`.
fn parse_export(s: &str, a: &Args) -> Result<ExportSpec, String> {
    let (name, rest) = s
        .split_once('=')
        .ok_or_else(|| format!("--export {s:?}: expected NAME=BACKING[,key=value...]"))?;
    if name.is_empty() || name.len() > 4096 || name.contains(['\0', '/', ',']) {
        return Err(format!(
            "--export {s:?}: the name must be non-empty, without '/', ',' or NUL"
        ));
    }
    let mut parts = rest.split(',');
    let backing = parts.next().unwrap_or_default().to_string();
    if backing.is_empty() {
        return Err(format!("--export {s:?}: no backing store"));
    }
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut e = ExportSpec {
        name: name.to_string(),
        backing,
        cache: a.cache.with_file_name(format!("cache-{safe}.img")),
        size: a.size,
        cache_size: a.cache_size,
        write_policy: a.write_policy.clone(),
        replacement: a.replacement.clone(),
        read_only: a.read_only,
        critical: false,
    };
    for kv in parts {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        match k {
            "cache" => e.cache = PathBuf::from(v),
            "cache-size" => e.cache_size = parse_size(v)?,
            "size" => e.size = parse_size(v)?,
            "policy" | "write-policy" => e.write_policy = v.to_string(),
            "replacement" => e.replacement = v.to_string(),
            "read-only" if v.is_empty() || v == "true" => e.read_only = true,
            "critical" if v.is_empty() || v == "true" => e.critical = true,
            _ => {
                return Err(format!(
                    "--export {s:?}: unknown key {k:?} (cache, cache-size, size, policy, replacement, read-only, critical)"
                ))
            }
        }
    }
    Ok(e)
}

fn is_upstream(spec: &str) -> bool {
    spec.starts_with("nbd://") || spec.starts_with("nbd+unix://")
}

/// Largest request the engine sees (client requests are split to it,
/// `NvwcExport::split`): what the engine accepts (half the cache), at most
/// the largest client payload, and 8 MiB for journaled over NBD, where it
/// bounds a checkpoint group in the redo region.
fn max_request(capacity: u64, bs: u64, upstream: bool, wp: WritePolicyKind) -> u64 {
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

/// A backing store as found at start, before anything is written to it
/// (a missing backing file is created empty: `created`).
struct BackingFound {
    given: bind::Given,
    /// Bytes the export may use, before rounding to the block size (for an
    /// upstream that gets its redo region at this start: what lies before it).
    usable: u64,
    store: Store,
    created: Option<PathBuf>,
}

enum Store {
    /// A file or block device; `data_len`: a file's bytes before its label.
    File {
        file: File,
        redo: PathBuf,
        data_len: u64,
    },
    /// An upstream; `want_region`: journaled and no region yet (its log size).
    Nbd {
        up: upstream::Upstream,
        want_region: Option<u64>,
    },
}

/// Open the backing store of export `e` and read its identity, writing nothing.
fn find_backing(
    e: &ExportSpec,
    a: &Args,
    wp: WritePolicyKind,
    capacity: u64,
    rt: &tokio::runtime::Runtime,
) -> Result<BackingFound> {
    use nvwc_core::layout::{BackingId, BackingKind};
    let bs = a.block_size;
    if is_upstream(&e.backing) {
        let max_req = max_request(capacity, bs, true, wp);
        // A journaled checkpoint group holds at most `merge` transactions of
        // at most `txn_blocks` blocks plus the write that closed each one,
        // and never more blocks than the cache has.
        let txn = u64::from(a.txn_blocks).min((capacity / 4).max(1));
        let merge = u64::from(
            Config::new(bs as u32, capacity, bs, wp)
                .journal
                .checkpoint_merge_max,
        );
        let group_blocks = (merge * (txn + max_req / bs + 1)).min(capacity);
        let needed = upstream::log_bytes_needed(group_blocks * bs, group_blocks);
        let want = match a.redo_size {
            Some(r) if r < needed => bail!(
                "--redo-size {r} is below the {needed} bytes a checkpoint group of this configuration may need"
            ),
            Some(r) => r,
            None => needed.max(16 << 20),
        };
        let up = rt.block_on(upstream::Upstream::connect(&e.backing))?;
        if let Some(r) = up.region() {
            if wp.is_journaled() && r.log_len < needed {
                bail!(
                    "the redo region on {} has {} bytes of log; this configuration may need {needed} (lower --txn-blocks)",
                    e.backing,
                    r.log_len
                );
            }
        }
        let want_region = (wp.is_journaled() && up.region().is_none()).then_some(want);
        let usable = match want_region {
            Some(w) => up
                .planned_start(w)
                .with_context(|| format!("upstream {}", e.backing))?,
            None => up.usable(),
        };
        let label = rt.block_on(up.read_label())?;
        let name = up.info().name.clone();
        let given = bind::Given {
            id: BackingId::new(
                BackingKind::Nbd,
                label.map_or([0; 16], |l| l.uuid),
                up.size(),
                &e.backing,
                &name,
            ),
            location: e.backing.clone(),
            name,
            label,
            can_label: up.region().is_some() || want_region.is_some(),
            aliases: Vec::new(),
        };
        return Ok(BackingFound {
            given,
            usable,
            store: Store::Nbd { up, want_region },
            created: None,
        });
    }
    let path = PathBuf::from(&e.backing);
    let redo = PathBuf::from(format!("{}.nvwc-redo", path.display()));
    let block = std::fs::metadata(&path).is_ok_and(|m| {
        use std::os::unix::fs::FileTypeExt;
        m.file_type().is_block_device()
    });
    if block {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let len = file_len(&mut file)?;
        let names = bind::block_names(&path);
        let given = bind::Given {
            id: BackingId::new(BackingKind::Block, [0; 16], len, &names[0], ""),
            location: names[0].clone(),
            name: String::new(),
            label: None,
            can_label: false,
            aliases: names,
        };
        return Ok(BackingFound {
            given,
            usable: len,
            store: Store::File {
                file,
                redo,
                data_len: len,
            },
            created: None,
        });
    }
    let (mut file, created) = open_or_create(&path, e.size, false)?;
    let len = file_len(&mut file)?;
    let label = label::read_file_label(&file, len)
        .with_context(|| format!("reading {}", path.display()))?;
    let data_len = label.map_or(len, |l| l.data_len);
    let shown = bind::shown_path(&path).display().to_string();
    let given = bind::Given {
        id: BackingId::new(
            BackingKind::File,
            label.map_or([0; 16], |l| l.uuid),
            data_len,
            &shown,
            "",
        ),
        location: shown,
        name: String::new(),
        label,
        can_label: true,
        aliases: Vec::new(),
    };
    Ok(BackingFound {
        given,
        usable: data_len,
        store: Store::File {
            file,
            redo,
            data_len,
        },
        created: created.then_some(path),
    })
}

/// Open the backing store, cache and engine of one export and start its host.
///
/// Order (`docs/ON-DISK-FORMAT.md`, "Binding"): read the cache device and
/// the backing store and decide whether they belong together, writing
/// nothing; recover the engine from the cache's metadata (pure); only then
/// write: the backing store's own recovery (redo log), the label (durable),
/// the cache's format or superblock (durable). No request is served before
/// all of it, so no dirty data exists before the binding is durable.
fn open_export(e: &ExportSpec, a: &Args, rt: &tokio::runtime::Runtime) -> Result<Arc<NvwcExport>> {
    use bind::Reason;
    let bs = a.block_size;
    let wp: WritePolicyKind = e.write_policy.parse()?;
    let repl: ReplacementKind = e
        .replacement
        .parse()
        .map_err(|err| anyhow::anyhow!("replacement policy: {err}"))?;
    let cache_name = e.cache.display().to_string();
    let (mut cache, cache_new) = open_or_create(Path::new(&e.cache), e.cache_size, true)?;
    format::lock(&cache, &e.cache)?;
    small_pages(&cache);
    let cache_len = file_len(&mut cache)?;
    let capacity = Layout::capacity_for(cache_len, bs as u32);
    if capacity == 0 {
        bail!("cache {cache_name} ({cache_len} bytes) has no room for one {bs}-byte block and its metadata");
    }
    let found = format::inspect(
        &cache,
        &e.cache,
        cache_new,
        &Layout::new(&Config::new(bs as u32, capacity, bs, wp)),
    )?;
    // A cache formatted before the metadata log (format 1 and 2) keeps its
    // geometry and commits the old way; formats 3 and later keep the log
    // size they were formatted with.
    let (capacity, log_pages) = match &found {
        format::Found::Cache(sb) if sb.log_pages == 0 => {
            log!(
                warn,
                "cache_format_without_log",
                export = &e.name,
                cache = &cache_name,
                format = sb.version,
                note = "every commit costs three device syncs on this cache; `nvwc detach` (which \
                        writes its dirty blocks back) and a restart reformat it with the \
                        single-sync metadata log"
            );
            (sb.capacity, 0)
        }
        format::Found::Cache(sb) => (capacity, sb.log_pages),
        _ => (capacity, layout::default_log_pages(capacity, bs as u32)),
    };
    let mut backing = find_backing(e, a, wp, capacity, rt)?;
    let upstream = matches!(backing.store, Store::Nbd { .. });
    let usable = backing.usable / bs * bs;
    if usable == 0 {
        bail!("backing store {} is smaller than one block", e.backing);
    }
    let mut cfg = Config::new(bs as u32, capacity, usable, wp);
    cfg.log_pages = log_pages;
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
        .map_err(|err| anyhow::anyhow!("--fetch: {err}"))?;
    cfg.patch_mem_bytes = a.patch_mem;
    cfg.patch_direct = a.patch_direct;
    cfg.fetch_bg_inflight = a.fetch_inflight;
    cfg.rewrite_in_place = a.rewrite_in_place;
    cfg.bypass_when_full = a.bypass_when_full;
    cfg.full_clean_secs = a.full_clean_secs;
    cfg.admission = a
        .admission
        .parse()
        .map_err(|err| anyhow::anyhow!("--admission: {err}"))?;
    cfg.wal_ranges = a.wal_range.clone();
    cfg.autocommit_ns = a.commit_interval_ms.max(1) * 1_000_000;
    cfg.autocommit_changes = a
        .commit_changes
        .unwrap_or(capacity.clamp(4096, u64::from(u32::MAX)) as u32)
        .max(1);
    cfg.validate()?;

    // Decide, writing nothing yet.
    let cache_uuid = match &found {
        format::Found::Blank => label::new_cache_uuid().context("choosing a cache uuid")?,
        format::Found::Empty(sb) | format::Found::Cache(sb) => sb.uuid,
    };
    let side = match &found {
        format::Found::Cache(sb) => bind::Cache::Existing(sb),
        _ => bind::Cache::Fresh { uuid: cache_uuid },
    };
    let mut uuid_err = None;
    let decided = bind::decide(
        &cache_name,
        side,
        &backing.given,
        a.force_attach,
        &mut || {
            label::new_uuid().unwrap_or_else(|err| {
                uuid_err = Some(err);
                [0; 16]
            })
        },
    );
    if let Some(err) = uuid_err {
        return Err(err).context("choosing a label uuid");
    }
    let plan = match decided {
        Ok(p) => p,
        Err(mut err) => {
            if let (
                bind::BindError::Mismatch { dirty, .. } | bind::BindError::Stale { dirty, .. },
                format::Found::Cache(sb),
            ) = (&mut err, &found)
            {
                *dirty = bind::dirty_note(format::dirty_blocks(&cache, sb));
            }
            if let Some(p) = &backing.created {
                // Created by this start (a mistyped path?): leave no trace.
                let _ = std::fs::remove_file(p);
            }
            return Err(err.into());
        }
    };
    // Recover (pure: reads the cache, writes nothing) before any write, so
    // that a cache this configuration cannot open is refused untouched.
    let l = Layout::new(&cfg);
    let recovered = match &found {
        format::Found::Cache(_) => {
            let image = format::read_image(&cache, &l)
                .with_context(|| format!("reading the cache device {cache_name}"))?;
            let (eng, rep) = Engine::recover(cfg.clone(), &image, &mut format::data_crc(&cache))
                .with_context(|| format!("recovering the cache device {cache_name}"))?;
            Some((eng, rep))
        }
        _ => None,
    };

    // The backing store's own recovery: a checkpoint its redo log holds.
    let replayed = match &mut backing.store {
        Store::File { file, redo, .. } => Redo::replay(redo, file)?,
        Store::Nbd { up, want_region } => {
            if let Some(w) = *want_region {
                rt.block_on(up.ensure_region(w))
                    .with_context(|| format!("creating the redo region on {}", e.backing))?;
            }
            rt.block_on(up.replay())?
        }
    };
    if replayed > 0 {
        log!(
            info,
            "redo_replayed",
            export = &e.name,
            backing = &e.backing,
            writes = replayed
        );
    }
    if let Store::Nbd { up, .. } = &backing.store {
        if let Some(r) = up.region() {
            log!(
                info,
                "redo_region",
                export = &e.name,
                start = r.start,
                log_bytes = r.log_len
            );
        }
    }
    // The label, durable before the superblock names it.
    if let Some((uuid, c)) = plan.label {
        match &backing.store {
            Store::File { file, data_len, .. } => {
                let l = label::Label {
                    uuid,
                    cache: c,
                    data_len: *data_len,
                    offset: label::file_label_offset(*data_len),
                };
                label::write_file_label(file, &l, backing.given.label.is_none())
                    .with_context(|| format!("writing the nvwc label on {}", e.backing))?;
            }
            Store::Nbd { up, .. } => {
                let l = up
                    .label_for(uuid, c)
                    .context("an upstream label needs a redo region")?;
                rt.block_on(up.write_label(&l))
                    .with_context(|| format!("writing the nvwc label on {}", e.backing))?;
            }
        }
    }
    // The cache: formatted, or its superblock rewritten, with the binding.
    let bound = Some(plan.id.clone());
    let (eng, superblock) = match (recovered, found) {
        (Some((eng, rep)), format::Found::Cache(mut sb)) => {
            if sb.backing != bound {
                sb.backing = bound;
                format::write_superblock(&cache, &sb)
                    .with_context(|| format!("writing the superblock of {cache_name}"))?;
            }
            log!(
                info,
                "recovered",
                export = &e.name,
                commit = rep.commit,
                clean_shutdown = rep.clean_shutdown,
                dirty = rep.dirty_versions,
                clean = rep.clean_versions,
                discarded = rep.discarded
            );
            (eng, sb)
        }
        (_, found) => {
            let mut sb = layout::Superblock::for_config(&cfg, cache_uuid);
            sb.backing = bound;
            format::format(&cache, &cfg, &sb)
                .with_context(|| format!("formatting the cache device {cache_name}"))?;
            log!(
                info,
                "formatted",
                export = &e.name,
                capacity_blocks = cfg.capacity_blocks,
                block_size = cfg.block_size,
                emptied_before = matches!(found, format::Found::Empty(_))
            );
            (Engine::new(cfg.clone())?, sb)
        }
    };
    let (level, how, detail) = match &plan.reason {
        Reason::Same => (None, "", String::new()),
        Reason::Fresh => (Some(log::Level::Info), "fresh", String::new()),
        Reason::Labelled => (Some(log::Level::Info), "labelled", String::new()),
        Reason::Reclaimed => (Some(log::Level::Info), "reclaimed", String::new()),
        Reason::Moved { from } => (Some(log::Level::Info), "moved", format!("was at {from}")),
        Reason::Adopted => (
            Some(log::Level::Warn),
            "adopted",
            "the cache was formatted before binding existed and is bound to this backing store from now on".to_string(),
        ),
        Reason::TookOver { from } => (
            Some(log::Level::Warn),
            "took-over",
            format!(
                "the backing store was bound to cache {}, which is refused from now on",
                bind::cache_name(*from)
            ),
        ),
        Reason::Forced { was } => (
            Some(log::Level::Warn),
            "force-attach",
            format!("the cache was bound to {was}"),
        ),
    };
    if let Some(level) = level {
        log::emit(
            level,
            "bound",
            &[
                ("export", log::V::from(e.name.as_str())),
                ("cache", log::V::from(cache_name.as_str())),
                ("how", log::V::from(how)),
                ("backing", log::V::from(plan.id.to_string())),
                ("detail", log::V::from(detail)),
            ],
        );
    }
    let BackingFound { store, .. } = backing;
    let (backend, redo) = match store {
        Store::File { file, redo, .. } => (
            Backend::File(file),
            Some(Redo {
                path: redo,
                pending: false.into(),
            }),
        ),
        Store::Nbd { up, .. } => (Backend::Nbd(Arc::new(up), rt.handle().clone()), None),
    };
    let meta = cache.try_clone()?;
    let split_blocks = max_request(capacity, bs, upstream, wp).min(eng.max_write_bytes()) / bs;

    // Block devices report size 0 in their metadata: ask the end instead.
    let cache_len = (&cache).seek(SeekFrom::End(0)).unwrap_or(0);
    let cache_fault = crate::fault::Layer::from_env(crate::fault::Role::Cache, &e.name)?;
    // Host-crash mode maps the cache private: the file keeps only what the
    // fault layer made durable.
    let map = mapped::Mapped::new(&cache, cache_len, cache_fault.volatile());
    if map.is_none() {
        log!(
            warn,
            "cache_unmapped",
            cache = e.cache.display().to_string(),
            reason = "the cache cannot be mapped; plain writes use pwrite"
        );
    }
    let cache_dev = Arc::new(Device {
        backend: Backend::File(cache),
        map,
        groups: Mutex::default(),
        redo: None,
        fault: cache_fault,
    });
    let backing_dev = Arc::new(Device {
        backend,
        map: None,
        groups: Mutex::default(),
        redo,
        fault: crate::fault::Layer::from_env(crate::fault::Role::Backing, &e.name)?,
    });
    // An upstream NBD server serves many requests at once; each pool thread
    // waits for one, so give it more threads than a local file needs.
    let host = host::Host::start(
        eng,
        cache_dev,
        backing_dev,
        2,
        if upstream { 64 } else { 4 },
        &e.name,
    );
    let mut info = ExportInfo::new(e.name.clone(), usable).with_all_features();
    info.description = format!("nvwc {wp} cache over {}", e.backing);
    info.read_only = e.read_only;
    info.can_fast_zero = false;
    // Truthful sizes: any byte range works (partial blocks are patched or
    // read-modify-written), whole aligned blocks avoid that, and every
    // request up to MAX_PAYLOAD is taken, split if the cache is small.
    info.min_block = 1;
    info.pref_block = bs as u32;
    info.max_block = MAX_PAYLOAD;
    log!(
        info,
        "export",
        export = &e.name,
        backing = &e.backing,
        cache = e.cache.display().to_string(),
        size = usable,
        cache_blocks = cfg.capacity_blocks,
        block_size = bs,
        write_policy = wp.to_string(),
        replacement = &e.replacement,
        read_only = e.read_only,
    );
    Ok(Arc::new(NvwcExport {
        host,
        info,
        block: bs,
        split_blocks,
        lat: Default::default(),
        critical: e.critical.into(),
        hints: Mutex::default(),
        hinted: AtomicU64::new(0),
        cache_path: e.cache.clone(),
        cache_meta: meta,
        superblock,
    }))
}

pub fn run(a: Args) -> Result<std::process::ExitCode> {
    log::init(a.log_format.as_deref(), a.log_level.as_deref()).map_err(anyhow::Error::msg)?;
    // Before anything is created or opened: the public-listener guard, and
    // every TLS file loaded.
    if crate::tls::check_listener(&a.listen, &a.tls)? {
        log!(
            warn,
            "insecure_tcp",
            listen = &a.listen,
            tls = format!("{:?}", a.tls.tls).to_lowercase()
        );
    }
    let tls = crate::tls::setup(&a.tls)?;
    let bs = a.block_size;
    if !(512..=1 << 20).contains(&bs) || !bs.is_power_of_two() {
        bail!("--block-size must be a power of two between 512 and 1M");
    }
    let mut specs = Vec::new();
    let from_file = a.loaded.as_ref().map_or(&[][..], |l| &l.exports[..]);
    if a.default_export.is_none() && from_file.is_empty() {
        specs.push(ExportSpec {
            name: String::new(),
            backing: a.backing.to_string_lossy().to_string(),
            cache: a.cache.clone(),
            size: a.size,
            cache_size: a.cache_size,
            write_policy: a.write_policy.clone(),
            replacement: a.replacement.clone(),
            read_only: a.read_only,
            critical: false,
        });
    }
    specs.extend(from_file.iter().cloned());
    // `NAME:critical` marks an export (given here or by another --export).
    let mut critical_names = Vec::new();
    for s in &a.export {
        if let Some(name) = s.strip_suffix(":critical").filter(|n| !n.contains('=')) {
            critical_names.push(name.to_string());
            continue;
        }
        let e = parse_export(s, &a).map_err(anyhow::Error::msg)?;
        if specs.iter().any(|x: &ExportSpec| x.name == e.name) {
            bail!("--export {:?}: duplicate export name", e.name);
        }
        if let Some(x) = specs
            .iter()
            .find(|x| x.cache == e.cache || (x.backing == e.backing && !is_upstream(&e.backing)))
        {
            bail!(
                "--export {:?} shares its cache or backing file with export {:?}",
                e.name,
                x.name
            );
        }
        specs.push(e);
    }
    for n in &critical_names {
        let Some(x) = specs.iter_mut().find(|x| &x.name == n) else {
            bail!("--export {n}:critical: no export of that name");
        };
        x.critical = true;
    }
    if let Some(d) = &a.default_export {
        if !specs.iter().any(|x| &x.name == d) {
            bail!("--default-export {d:?}: no --export of that name");
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut exports = Vec::new();
    for e in &specs {
        exports.push(
            open_export(e, &a, &rt)
                .with_context(|| format!("export {:?} ({})", e.name, e.backing))?,
        );
    }
    let exports = Arc::new(ExportList(std::sync::RwLock::new(exports)));
    let ctl_path = a.control.clone();
    let metrics_addr = a.metrics.clone();

    let ex = exports.clone();
    let rt_ref = &rt;
    let code = rt.block_on(async move {
        let rt = rt_ref;
        let mut specs = specs;
        let conns: Conns = Arc::default();
        let c2 = conns.clone();
        let ex2 = ex.clone();
        let mut b = nvwc_nbd::Server::builder().on_event(move |ev| {
            track_connection(&c2, &ev);
            if let nvwc_nbd::ServerEvent::Disconnected { conn_id, .. } = &ev {
                // A gone connection's hint goes with it (ids are never reused).
                for e in ex2.all().iter().filter(|e| e.hinted.load(Ordering::Relaxed) > 0) {
                    e.set_hint(*conn_id, false);
                }
            }
            log_server_event(ev)
        });
        for e in ex.all() {
            b = b.export(e);
        }
        if let Some(d) = &a.default_export {
            b = b.default_export(d.clone());
        }
        if let Some((mode, acceptor)) = tls {
            b = b.tls(mode, acceptor);
        }
        let server = b.build()?;
        let stop = Arc::new(tokio::sync::Notify::new());
        let ctl = tokio::spawn(control_loop(ctl_path, ex.clone(), stop.clone(), conns));
        if let Some(m) = metrics_addr {
            tokio::spawn(metrics_loop(m, ex.clone()));
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
        for e in ex.all() {
            let shown = if e.info.name.is_empty() { "(default)" } else { &e.info.name };
            println!("nvwc: export {shown}: {} ({} bytes)", e.info.description, e.info.size);
        }
        log!(info, "listening", unix = sock.display().to_string(), tcp = tcp.map(|t| t.to_string()).unwrap_or_else(|| "none".into()), exports = ex.all().len());
        println!("  unix socket: {}", sock.display());
        if let Some(addr) = tcp {
            println!("  tcp:         nbd://{addr}/");
        }
        println!("connect with:");
        if let Some(h) = crate::tls::connect_hint(&a.tls, &sock) {
            println!("{h}");
        }
        println!("  nbdinfo '{uri}'            # nbdinfo --list '{uri}' lists every export");
        println!("  qemu-io -f raw -c 'write -P 0xab 0 64k' -c 'read -P 0xab 0 64k' '{uri}'");
        println!("  mkdir -p /tmp/nvwc-fuse && nbdfuse /tmp/nvwc-fuse/disk '{uri}' &   # then: losetup -f --show /tmp/nvwc-fuse/disk");
        println!("  (a named export: nbd+unix:///NAME?socket={})", sock.display());
        println!("stop with Ctrl-C or SIGTERM (in-flight requests finish, metadata is committed)");
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
        sd_notify(&format!("READY=1\nSTATUS=serving {} export(s)", ex.all().len()));
        let detached = loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => { log!(info, "signal", signal = "SIGINT"); break false }
                _ = term.recv() => { log!(info, "signal", signal = "SIGTERM"); break false }
                _ = stop.notified() => { log!(info, "detached", dirty_blocks = 0u64); break true }
                _ = hup.recv() => {
                    log!(info, "signal", signal = "SIGHUP");
                    match &a.loaded {
                        Some(l) => {
                            sd_notify("RELOADING=1");
                            for spec in config_file::reload(l, &a, &ex.all()) {
                                add_export(&spec, &a, rt, &server, &ex, &mut specs);
                                if specs.iter().any(|x| x.name == spec.name) {
                                    config_file::added(l, &spec.name);
                                }
                            }
                            sd_notify("READY=1");
                        }
                        None => log!(warn, "reload_skipped", reason = "no --config file to reload"),
                    }
                }
            }
        };
        sd_notify("STOPPING=1\nSTATUS=stopping: finishing requests, committing metadata");
        log!(info, "stopping");
        ctl.abort();
        server.shutdown().await;
        anyhow::Ok(detached)
    });
    let detached = code?;
    for e in exports.all() {
        let st = e.host.shutdown(Duration::from_secs(60));
        if let Some(st) = st
            .as_ref()
            .filter(|st| detached && st.dirty_blocks == 0 && st.patched_blocks == 0)
        {
            release_cache(&e, st);
        }
        match st {
            Some(st) => log!(
                info,
                "stopped",
                export = &e.info.name,
                dirty_blocks = st.dirty_blocks,
                writes = st.writes,
                reads = st.reads,
                read_hits = st.read_hits,
                commits = st.commits
            ),
            None => log!(error, "stop_timeout", export = &e.info.name),
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// `SIGHUP` found export `spec` new in the configuration file: open it and
/// serve it (new connections can list and open it). Refused with a log line
/// (`export_add_failed`) when it shares a cache or backing file with an
/// export being served or fails to open; the others keep serving.
fn add_export(
    spec: &ExportSpec,
    a: &Args,
    rt: &tokio::runtime::Runtime,
    server: &nvwc_nbd::Server,
    ex: &ExportList,
    specs: &mut Vec<ExportSpec>,
) {
    let fail = |error: String| {
        log!(
            error,
            "export_add_failed",
            export = &spec.name,
            error = error
        )
    };
    if let Some(x) = specs.iter().find(|x| {
        x.cache == spec.cache || (x.backing == spec.backing && !is_upstream(&spec.backing))
    }) {
        return fail(format!(
            "it shares its cache or backing file with export {:?}",
            x.name
        ));
    }
    // `open_export` blocks on the runtime for an upstream backing store,
    // which only a thread outside the runtime may do.
    let opened = std::thread::scope(|s| s.spawn(|| open_export(spec, a, rt)).join());
    let e = match opened {
        Ok(Ok(e)) => e,
        Ok(Err(err)) => return fail(crate::errors::chain(&err)),
        Err(_) => return fail("opening it panicked".into()),
    };
    if let Err(err) = server.add_export(e.clone()) {
        e.host.shutdown(Duration::from_secs(60));
        return fail(err.to_string());
    }
    ex.push(e.clone());
    specs.push(spec.clone());
    let shown = if e.info.name.is_empty() {
        "(default)"
    } else {
        &e.info.name
    };
    println!(
        "nvwc: export {shown}: {} ({} bytes)",
        e.info.description, e.info.size
    );
    log!(
        info,
        "export_added",
        export = &e.info.name,
        size = e.info.size,
        backing = &spec.backing
    );
}

/// Tell systemd (`Type=notify`) about the server's state; see `notify.rs`.
fn sd_notify(state: &str) {
    if let Err(e) = crate::notify::notify(state) {
        log!(warn, "sd_notify_failed", error = e.to_string());
    }
}

/// After `nvwc detach` wrote everything back: mark the cache emptied, so
/// that its next start formats it afresh (and may bind it to any backing
/// store) instead of serving clean copies that writes made to the backing
/// store alone since would have made stale. One superblock sector, synced;
/// if it fails, the cache stays bound and holds only clean blocks.
fn release_cache(e: &NvwcExport, st: &Stats) {
    let mut sb = e.superblock.clone();
    sb.flags |= layout::SB_EMPTY;
    let cache = e.cache_path.display().to_string();
    match format::write_superblock(&e.cache_meta, &sb) {
        Ok(()) => log!(
            info,
            "released",
            export = &e.info.name,
            cache = cache,
            destaged_blocks = st.destaged_blocks
        ),
        Err(err) => log!(
            warn,
            "release_failed",
            export = &e.info.name,
            cache = cache,
            error = err.to_string()
        ),
    }
}

/// Live connections: id -> (peer, export once the handshake chose one).
type Conns = Arc<Mutex<std::collections::BTreeMap<u64, (String, Option<String>)>>>;

/// Keep [`Conns`] up to date (the hook runs on the connection's task: quick).
fn track_connection(conns: &Conns, ev: &nvwc_nbd::ServerEvent) {
    use nvwc_nbd::ServerEvent as E;
    let mut c = conns.lock().unwrap();
    match ev {
        E::Connected { conn_id, peer } => {
            c.insert(*conn_id, (peer.clone(), None));
        }
        E::Ready {
            conn_id, export, ..
        } => {
            if let Some(x) = c.get_mut(conn_id) {
                x.1 = Some(export.to_string());
            }
        }
        E::Disconnected { conn_id, .. } => {
            c.remove(conn_id);
        }
        E::RequestError { .. } => {}
    }
}

/// `hint CONN on|off [EXPORT]` on the control socket.
fn control_hint(args: &str, exports: &[Arc<NvwcExport>], conns: &Conns) -> String {
    let mut it = args.splitn(3, ' ');
    let (Some(conn), Some(onoff)) = (it.next(), it.next()) else {
        return "{\"error\":\"usage: hint CONNECTION on|off [EXPORT]\"}".into();
    };
    let Ok(conn) = conn.parse::<u64>() else {
        return format!(
            "{{\"error\":{}}}",
            json_string(&format!("bad connection id {conn:?}"))
        );
    };
    let on = match onoff {
        "on" => true,
        "off" => false,
        x => {
            return format!(
                "{{\"error\":{}}}",
                json_string(&format!("expected on or off, got {x:?}"))
            )
        }
    };
    let want = it.next();
    let Some(export) = conns.lock().unwrap().get(&conn).and_then(|c| c.1.clone()) else {
        return format!("{{\"error\":\"no connection {conn} in transmission (see nvwc status)\"}}");
    };
    if want.is_some_and(|w| w != export) {
        return format!(
            "{{\"error\":{}}}",
            json_string(&format!(
                "connection {conn} is on export {export:?}, not {:?}",
                want.unwrap()
            ))
        );
    }
    let Some(e) = exports.iter().find(|e| e.info.name == export) else {
        return "{\"error\":\"export gone\"}".into();
    };
    e.set_hint(conn, on);
    log!(
        info,
        "hint",
        connection = conn,
        export = &export,
        critical = on
    );
    format!(
        "{{\"ok\":true,\"connection\":{conn},\"export\":{},\"critical\":{on}}}",
        json_string(&export)
    )
}

/// Log the NBD server's connection events.
fn log_server_event(ev: nvwc_nbd::ServerEvent) {
    use nvwc_nbd::ServerEvent as E;
    match ev {
        E::Connected { conn_id, peer } => log!(info, "connect", conn = conn_id, client = peer),
        E::Ready {
            conn_id,
            export,
            structured,
            tls: None,
        } => log!(
            debug,
            "ready",
            conn = conn_id,
            export = &*export,
            structured = structured
        ),
        // Who came in over TLS is worth an info line.
        E::Ready {
            conn_id,
            export,
            structured,
            tls: Some(tls),
        } => log!(
            info,
            "ready",
            conn = conn_id,
            export = &*export,
            structured = structured,
            tls = tls
        ),
        E::Disconnected {
            conn_id,
            reason,
            requests,
        } => log!(
            info,
            "disconnect",
            conn = conn_id,
            reason = reason,
            requests = requests
        ),
        E::RequestError {
            conn_id,
            command,
            code,
            message,
        } => {
            // Device errors are the operator's business; bad requests are the client's.
            if code == "Io" || code == "NoSpc" {
                log!(
                    warn,
                    "request_error",
                    conn = conn_id,
                    command = command,
                    code = code,
                    message = message
                );
            } else {
                log!(
                    debug,
                    "request_error",
                    conn = conn_id,
                    command = command,
                    code = code,
                    message = message
                );
            }
        }
    }
}

/// `nvwc recover`: make a backing store consistent on its own (after losing
/// the cache device) by finishing a journaled checkpoint its redo log holds.
#[derive(clap::Args, Debug)]
pub struct RecoverArgs {
    /// The backing store: a file (its redo log is `FILE.nvwc-redo`) or an
    /// upstream NBD server (its redo region is at the end of the export).
    #[arg(long)]
    backing: PathBuf,
}

pub fn recover(a: RecoverArgs) -> Result<std::process::ExitCode> {
    let spec = a.backing.to_string_lossy().to_string();
    let (n, found) = if is_upstream(&spec) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (up, n) = rt.block_on(upstream::Upstream::open(&spec, None))?;
        if up.region().is_none() {
            println!(
                "nvwc recover: {spec} has no redo region (never served journaled); nothing to do"
            );
        }
        (n, rt.block_on(up.read_label())?)
    } else {
        let mut backing = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&a.backing)
            .with_context(|| format!("opening {}", a.backing.display()))?;
        let redo = PathBuf::from(format!("{}.nvwc-redo", a.backing.display()));
        let n = Redo::replay(&redo, &backing)?;
        let len = file_len(&mut backing)?;
        let found = if backing.metadata()?.is_file() {
            label::read_file_label(&backing, len)?
        } else {
            None
        };
        (n, found)
    };
    if n > 0 {
        println!(
            "nvwc recover: finished an interrupted checkpoint ({n} writes); {spec} is consistent"
        );
    } else {
        println!("nvwc recover: no interrupted checkpoint; {spec} is consistent as it is");
    }
    // The binding is left as it is: the cache it names may not be lost after
    // all (restarting it is then safe, nothing else wrote here). A new cache
    // takes the store over, and from then on the old one is refused.
    if let Some(l) = found.filter(|l| l.cache != 0) {
        println!(
            "nvwc recover: {spec} is bound to cache {} (nvwc label {}); a new cache started over it \
             takes it over, and that cache is refused from then on",
            bind::cache_name(l.cache),
            bind::label_name(&l)
        );
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// A FUA write to a file: `data` at `offset`, durable when this returns, by
/// `pwritev2(RWF_DSYNC)`, which syncs the written range only (a whole-file
/// `fdatasync` would also write back every other dirty page, such as the
/// many writes sent around a full cache). That is FUA's promise in the NBD
/// protocol, and what the VOPR's disk and the host-crash layer model: the
/// write itself is durable, nothing else. Falls back to a write and a
/// `fdatasync` where the kernel lacks `RWF_DSYNC`.
fn write_dsync(file: &std::fs::File, data: &[u8], offset: u64) -> std::io::Result<()> {
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

    /// A group whose in-place apply fails stays in the log; the next commit
    /// finishes it before writing its own log over it. (Before, the next
    /// commit overwrote the log, so a crash during it left the failed group
    /// half applied with nothing to replay: the crash test caught this
    /// journaled over an upstream with injected write errors.)
    #[test]
    fn redo_log_finishes_a_failed_group_before_the_next() {
        let dir = std::env::temp_dir().join(format!("nvwc-redo-fail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bpath = dir.join("b.img");
        std::fs::write(&bpath, vec![0u8; 8192]).unwrap();
        let log = dir.join("b.img.nvwc-redo");
        let redo = Redo {
            path: log.clone(),
            pending: false.into(),
        };
        // Opened read-only: the log is written, the apply fails.
        let ro = File::open(&bpath).unwrap();
        let g1 = vec![(0u64, Bytes::from(vec![5u8; 512]))];
        assert!(redo.commit_and_apply(&ro, &g1).is_err());
        assert!(
            std::fs::metadata(&log).unwrap().len() > 0,
            "failed group stays logged"
        );
        // The next group, on a working backing file, finishes the first one too.
        let rw = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&bpath)
            .unwrap();
        let g2 = vec![(4096u64, Bytes::from(vec![6u8; 512]))];
        redo.commit_and_apply(&rw, &g2).unwrap();
        assert_eq!(read_at(&rw, 0, 512).unwrap(), vec![5u8; 512]);
        assert_eq!(read_at(&rw, 4096, 512).unwrap(), vec![6u8; 512]);
        assert_eq!(std::fs::metadata(&log).unwrap().len(), 0);
        let _ = std::fs::remove_dir_all(&dir);
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
        let redo = Redo {
            path: log.clone(),
            pending: false.into(),
        };
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
