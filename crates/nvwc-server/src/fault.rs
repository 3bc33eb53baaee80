//! Fault injection for the live server's devices, and crash failpoints.
//!
//! Every device command of `nvwc serve` goes through a [`Layer`] (one per
//! device, see `device::Device::execute`). With nothing configured the layer
//! passes commands straight through. It can:
//!
//! - **inject faults** from a spec (env `NVWC_FAULT_CACHE` / `NVWC_FAULT_BACKING`):
//!   `RULE[;RULE...]`, a rule being `KIND[,op=read|write|flush|any][,after=N][,count=N][,prob=P][,ms=N][,seed=N]`
//!   with `KIND` one of `eio`, `enospc`, `timeout` (sleep `ms`, then fail),
//!   `delay` (sleep `ms`, then run), `torn` (write a random prefix of the
//!   sectors, then fail with EIO), `torn-crash` (write a prefix, then abort
//!   the process: a crash in the middle of a write), and `volatile` (below).
//!   A rule fires on the matching commands after the first `after`, at most
//!   `count` times (default: always), each time with probability `prob`.
//! - **simulate a host crash** (`volatile[,log=PATH]`; `nvwc-dev/src/volatile.rs`):
//!   the file holds only what is durable; a write reaches it only at a
//!   FLUSH issued after the write completed (or as a FUA write, or before a
//!   journaled group ends). Until then it is visible in the device's own
//!   view (the cache file mapped *private*, so mapped cache writes and
//!   direct writes take their usual path, `mapped.rs`) or in the
//!   layer's overlay on reads, and, with `log=PATH`, recorded in a side log
//!   that outlives a `kill -9` (a named export's log is `PATH.NAME`). After
//!   the kill, `nvwc crashtest` applies a random, seeded subset of the
//!   logged writes, torn at 512-byte sectors ([`volatile::apply_crash`]), as
//!   a power loss could leave them; without a log, the kill loses them all.
//! - **abort at failpoints** (env `NVWC_FAILPOINTS=name:count[,name:count]`):
//!   the `count`-th time the named point is reached the process aborts.
//!   Points: `cache-flush` (after a cache sync: the commit window between the
//!   data flush and the commit record), `commit-record` (before a commit
//!   record is written), `writeback` (before a write to the backing store),
//!   `checkpoint` (before a journaled group is made durable), `redo-apply`
//!   (in the middle of applying a logged group in place), `backing-flush`
//!   (after a backing sync).
//!
//! **Degraded mode.** The first failed command on the cache device marks the
//! layer failed: it is logged at error level (`cache_device_failed`) and shown
//! as the `cache_degraded` metric, and the export then refuses writes, trim
//! and zeroes with EPERM (it is read-only now, and they never reach a
//! device) and FLUSH with EIO: nothing more is acknowledged that the cache
//! could not hold. A restart (after replacing the device) clears it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use nvwc_core::{IoError, IoOp, IoResult};

use crate::log::log;
use nvwc_dev::rng::Rng;

pub use nvwc_dev::volatile;

/// The device under a [`Layer`].
pub trait Media {
    /// Run `op` on the device itself.
    fn raw(&self, op: &IoOp<Bytes>, group: Option<u64>) -> IoResult<Bytes>;
    /// Whether the device has a view of its own for writes that are not
    /// durable (the cache file's private mapping in host-crash mode): the
    /// layer puts them there with [`Media::show`], and `raw` reads see them.
    /// Otherwise the layer overlays them on reads.
    fn has_view(&self) -> bool {
        false
    }
    /// Put a write in the device's view (never on the device itself).
    fn show(&self, _offset: u64, _data: &[u8]) -> Result<(), IoError> {
        Ok(())
    }
}

impl<F: Fn(&IoOp<Bytes>, Option<u64>) -> IoResult<Bytes>> Media for F {
    fn raw(&self, op: &IoOp<Bytes>, group: Option<u64>) -> IoResult<Bytes> {
        self(op, group)
    }
}

/// The bytes of a write the driver puts in the device's view itself
/// ([`Layer::put_write`]): given how many bytes are written, the (offset,
/// bytes) pieces, in order, for host-crash mode to record.
pub enum Written<'a> {
    /// Known before they are written (a buffer copied into the mapping):
    /// recorded first, so that a crash in the middle of the copy may keep
    /// any part of them, as a power loss may keep part of a write in flight.
    Before(&'a dyn Fn(usize) -> Vec<(u64, Bytes)>),
    /// Known only once written (a payload received from a socket): recorded
    /// after; a crash in the middle loses the write whole.
    After(&'a dyn Fn(usize) -> std::io::Result<Vec<(u64, Bytes)>>),
}

/// Why [`Layer::put_write`] failed.
#[derive(Debug)]
pub enum PutError {
    /// The layer failed the write (an injected fault, or the side log could
    /// not be written); counted and logged already.
    Device(IoError),
    /// `put` itself failed: the caller decides what that means.
    Put(std::io::Error),
}

/// Which device a layer sits on.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Role {
    Cache,
    Backing,
}

impl Role {
    fn env(self) -> &'static str {
        match self {
            Role::Cache => "NVWC_FAULT_CACHE",
            Role::Backing => "NVWC_FAULT_BACKING",
        }
    }
    fn name(self) -> &'static str {
        match self {
            Role::Cache => "cache",
            Role::Backing => "backing",
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Kind {
    Eio,
    NoSpace,
    Timeout,
    Delay,
    Torn,
    TornCrash,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum OpClass {
    Read,
    Write,
    Flush,
    Any,
}

#[derive(Debug)]
struct Rule {
    kind: Kind,
    op: OpClass,
    after: u64,
    count: u64,
    prob: f64,
    ms: u64,
    seen: AtomicU64,
    fired: AtomicU64,
    rng: Mutex<Rng>,
}

/// A bad fault or failpoint spec.
#[derive(Debug, thiserror::Error)]
#[error("fault spec {spec:?}: {why}")]
pub struct SpecError {
    spec: String,
    why: String,
}

/// The `volatile` rule: host-crash mode, and where its side log goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct VolatileSpec {
    log: Option<std::path::PathBuf>,
}

fn parse_rules(spec: &str) -> Result<(Vec<Rule>, Option<VolatileSpec>), SpecError> {
    let err = |why: String| SpecError {
        spec: spec.to_string(),
        why,
    };
    let mut rules = Vec::new();
    let mut volatile = None;
    for r in spec.split(';').map(str::trim).filter(|r| !r.is_empty()) {
        let mut parts = r.split(',').map(str::trim);
        let kind = match parts.next().unwrap_or_default() {
            "volatile" => {
                let mut v = VolatileSpec::default();
                for kv in parts {
                    match kv.split_once('=') {
                        Some(("log", path)) if !path.is_empty() => v.log = Some(path.into()),
                        _ => {
                            return Err(err(format!("volatile: unknown option {kv:?} (log=PATH)")))
                        }
                    }
                }
                volatile = Some(v);
                continue;
            }
            "eio" => Kind::Eio,
            "enospc" => Kind::NoSpace,
            "timeout" => Kind::Timeout,
            "delay" => Kind::Delay,
            "torn" => Kind::Torn,
            "torn-crash" => Kind::TornCrash,
            k => {
                return Err(err(format!(
                    "unknown kind {k:?} (eio, enospc, timeout, delay, torn, torn-crash, volatile)"
                )))
            }
        };
        let mut rule = Rule {
            kind,
            op: if matches!(kind, Kind::Torn | Kind::TornCrash) {
                OpClass::Write
            } else {
                OpClass::Any
            },
            after: 0,
            count: u64::MAX,
            prob: 1.0,
            ms: 100,
            seen: AtomicU64::new(0),
            fired: AtomicU64::new(0),
            rng: Mutex::new(Rng::new(0)),
        };
        for kv in parts {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| err(format!("expected key=value, got {kv:?}")))?;
            let num = |v: &str| {
                v.parse::<u64>()
                    .map_err(|_| err(format!("{k}: not a number: {v:?}")))
            };
            match k {
                "op" => {
                    rule.op = match v {
                        "read" => OpClass::Read,
                        "write" => OpClass::Write,
                        "flush" => OpClass::Flush,
                        "any" => OpClass::Any,
                        _ => return Err(err(format!("op: {v:?} (read, write, flush, any)"))),
                    }
                }
                "after" => rule.after = num(v)?,
                "count" => rule.count = num(v)?,
                "ms" => rule.ms = num(v)?,
                "seed" => *rule.rng.get_mut().unwrap() = Rng::new(num(v)?),
                "prob" => {
                    rule.prob = v
                        .parse::<f64>()
                        .ok()
                        .filter(|p| (0.0..=1.0).contains(p))
                        .ok_or_else(|| err(format!("prob: {v:?} is not in [0, 1]")))?
                }
                _ => {
                    return Err(err(format!(
                        "unknown key {k:?} (op, after, count, prob, ms, seed)"
                    )))
                }
            }
        }
        if matches!(kind, Kind::Torn | Kind::TornCrash) && rule.op != OpClass::Write {
            return Err(err("torn faults apply to writes only".into()));
        }
        rules.push(rule);
    }
    Ok((rules, volatile))
}

impl Rule {
    fn matches(&self, op: &IoOp<Bytes>) -> bool {
        let class = match op {
            IoOp::Read { .. } | IoOp::Checksum { .. } => OpClass::Read,
            IoOp::Write { .. } => OpClass::Write,
            IoOp::Flush | IoOp::GroupEnd { .. } => OpClass::Flush,
            IoOp::Trim { .. } | IoOp::GroupBegin { .. } => return false,
        };
        self.op == OpClass::Any || self.op == class
    }
    /// Does the rule fire for this (matching) command? Also returns a random number.
    fn fires(&self) -> Option<u64> {
        let n = self.seen.fetch_add(1, Ordering::Relaxed) + 1;
        if n <= self.after || self.fired.load(Ordering::Relaxed) >= self.count {
            return None;
        }
        let r = self.rng.lock().unwrap().next_u64();
        if self.prob < 1.0 && (r >> 11) as f64 / (1u64 << 53) as f64 >= self.prob {
            return None;
        }
        self.fired.fetch_add(1, Ordering::Relaxed);
        Some(r)
    }
}

// ------------------------------------------------------------------ failpoints

fn failpoints() -> &'static Mutex<HashMap<String, u64>> {
    static FP: OnceLock<Mutex<HashMap<String, u64>>> = OnceLock::new();
    FP.get_or_init(|| {
        let mut m = HashMap::new();
        if let Ok(s) = std::env::var("NVWC_FAILPOINTS") {
            for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
                let (name, n) = item.split_once(':').unwrap_or((item, "1"));
                match n.parse::<u64>() {
                    Ok(n) if n > 0 => {
                        m.insert(name.to_string(), n);
                    }
                    _ => eprintln!("nvwc: NVWC_FAILPOINTS: bad count in {item:?}; ignored"),
                }
            }
        }
        Mutex::new(m)
    })
}

/// A failpoint: abort the process the configured number-th time it is reached.
pub fn failpoint(name: &str) {
    let mut m = failpoints().lock().unwrap();
    if let Some(n) = m.get_mut(name) {
        *n -= 1;
        if *n == 0 {
            eprintln!("nvwc: failpoint {name}: abort");
            std::process::abort();
        }
    }
}

/// Whether any failpoint is armed (cheap check on the hot path).
fn failpoints_armed() -> bool {
    static ARMED: OnceLock<bool> = OnceLock::new();
    *ARMED.get_or_init(|| !failpoints().lock().unwrap().is_empty())
}

// ------------------------------------------------------------------ the layer

/// The fault layer of one device (see the module docs).
pub struct Layer {
    role: Role,
    rules: Vec<Rule>,
    /// Host-crash mode: what is not durable yet (`nvwc-dev/src/volatile.rs`).
    volatile: Option<volatile::Volatile>,
    failed: AtomicBool,
    errors: AtomicU64,
    export: String,
    /// `backing_device_error` lines: one per second at most.
    err_log: crate::log::Throttle,
}

impl Layer {
    /// The layer for `role`, from its environment variable (none set: pass-through).
    pub fn from_env(role: Role, export: &str) -> Result<Layer, SpecError> {
        let spec = std::env::var(role.env()).unwrap_or_default();
        Layer::new(role, &spec, export)
    }

    pub fn new(role: Role, spec: &str, export: &str) -> Result<Layer, SpecError> {
        let (rules, volatile) = parse_rules(spec)?;
        let volatile = volatile
            .map(|v| {
                // One log per export.
                let log = v.log.map(|p| match export {
                    "" => p,
                    name => format!("{}.{name}", p.display()).into(),
                });
                volatile::Volatile::new(log.clone()).map_err(|e| SpecError {
                    spec: spec.to_string(),
                    why: format!("volatile: side log {log:?}: {e}"),
                })
            })
            .transpose()?;
        if !spec.trim().is_empty() {
            log!(
                warn,
                "fault_injection",
                device = role.name(),
                export = export,
                spec = spec
            );
        }
        Ok(Layer {
            role,
            rules,
            volatile,
            failed: AtomicBool::new(false),
            errors: AtomicU64::new(0),
            err_log: crate::log::Throttle::new(),
            export: export.to_string(),
        })
    }

    /// Nothing to inject, overlay or check: a command may bypass [`Layer::run`].
    pub fn passthrough(&self) -> bool {
        self.rules.is_empty() && self.volatile.is_none() && !failpoints_armed()
    }

    /// Host-crash mode (`volatile`): the device's file must hold only what
    /// the layer made durable (so a cache file is mapped private).
    pub fn volatile(&self) -> bool {
        self.volatile.is_some()
    }

    /// The device failed (cache: the export is degraded to read-only).
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Failed commands so far.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Host-crash mode: the stamp of a FLUSH (or group end) issued now, to
    /// pass to [`Layer::run_issued`] when it runs later (on a worker): it
    /// covers the writes completed before its issue, not those completed
    /// while it waited to run. `None` otherwise.
    pub fn issue_stamp(&self) -> Option<u64> {
        self.volatile.as_ref().map(|v| v.stamp())
    }

    /// Run `op` through the layer on `dev`.
    pub fn run(&self, op: &IoOp<Bytes>, group: Option<u64>, dev: &impl Media) -> IoResult<Bytes> {
        self.run_issued(op, group, dev, None)
    }

    /// [`Layer::run`] for a command issued at `issued` ([`Layer::issue_stamp`];
    /// `None`: now).
    pub fn run_issued(
        &self,
        op: &IoOp<Bytes>,
        group: Option<u64>,
        dev: &impl Media,
        issued: Option<u64>,
    ) -> IoResult<Bytes> {
        let r = self.run_inner(op, group, dev, issued);
        if let Err(e) = &r {
            self.record_error(e);
        }
        r
    }

    /// Count and log a failed command; the first on the cache device
    /// degrades the export (module docs). [`Layer::run`] calls it; a driver
    /// that writes to the device itself (direct writes) calls it too.
    pub fn record_error(&self, e: &IoError) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if self.role == Role::Cache && !self.failed.swap(true, Ordering::Relaxed) {
            log!(
                error,
                "cache_device_failed",
                export = &self.export,
                error = e.to_string(),
                action = "degraded to read-only: writes now fail with EPERM and FLUSH with EIO; replace the cache device and restart"
            );
        } else if self.role == Role::Backing {
            if let Some(held) = self.err_log.pass() {
                log!(
                    warn,
                    "backing_device_error",
                    export = &self.export,
                    error = e.to_string(),
                    suppressed = held
                );
            }
        }
    }

    /// A plain write of `len` bytes at `offset` that the driver puts in the
    /// device's view itself (the mapped cache file: cache-slot writes copied
    /// in by the kernel, direct writes received into it): `put(n)` writes
    /// its first `n` bytes (`n < len` for a torn write), and `written`
    /// gives them to host-crash mode to record. Faults apply as to a write
    /// through [`Layer::run`]; with nothing configured this is just `put(len)`.
    pub fn put_write(
        &self,
        offset: u64,
        len: usize,
        dev: &impl Media,
        put: &mut dyn FnMut(usize) -> std::io::Result<()>,
        written: Written<'_>,
    ) -> Result<(), PutError> {
        if self.passthrough() {
            return put(len).map_err(PutError::Put);
        }
        let fail = |e: IoError| {
            self.record_error(&e);
            PutError::Device(e)
        };
        let probe = IoOp::Write {
            offset,
            data: Bytes::new(),
            fua: false,
        };
        if failpoints_armed() {
            self.failpoints_before(&probe, None);
        }
        let (mut keep, mut torn) = (len, None);
        for rule in &self.rules {
            if !rule.matches(&probe) {
                continue;
            }
            let Some(r) = rule.fires() else { continue };
            match rule.kind {
                Kind::Eio => return Err(fail(IoError::Eio)),
                Kind::NoSpace => return Err(fail(IoError::NoSpace)),
                Kind::Timeout => {
                    std::thread::sleep(Duration::from_millis(rule.ms));
                    return Err(fail(IoError::Timeout));
                }
                Kind::Delay => std::thread::sleep(Duration::from_millis(rule.ms)),
                Kind::Torn | Kind::TornCrash => {
                    let sectors = len.div_ceil(512) as u64;
                    keep = (((r % sectors.max(1)) * 512) as usize).min(len);
                    torn = Some(rule.kind);
                    break;
                }
            }
        }
        if keep > 0 {
            let record = |w: std::io::Result<Vec<(u64, Bytes)>>| match &self.volatile {
                Some(v) => w
                    .and_then(|w| v.completed(w))
                    .map_err(|e| fail(self.log_failed(e))),
                None => Ok(()),
            };
            match written {
                Written::Before(w) => {
                    if self.volatile.is_some() {
                        record(Ok(w(keep)))?;
                    }
                    put(keep).map_err(PutError::Put)?;
                }
                Written::After(w) => {
                    put(keep).map_err(PutError::Put)?;
                    if self.volatile.is_some() {
                        record(w(keep))?;
                    }
                }
            }
        }
        match torn {
            Some(Kind::TornCrash) => {
                // The page cache keeps what was written: a crash mid-write.
                let _ = self.exec(&IoOp::Flush, None, dev, None);
                eprintln!("nvwc: torn-crash fault: abort after {keep} of {len} bytes");
                std::process::abort();
            }
            Some(_) => Err(fail(IoError::Eio)),
            None => Ok(()),
        }
    }

    /// The side log could not be written: the host-crash model is broken,
    /// so the write fails (and the export degrades) rather than go unrecorded.
    fn log_failed(&self, e: std::io::Error) -> IoError {
        log!(
            error,
            "volatile_log_failed",
            device = self.role.name(),
            export = &self.export,
            error = e.to_string()
        );
        IoError::Eio
    }

    fn run_inner(
        &self,
        op: &IoOp<Bytes>,
        group: Option<u64>,
        dev: &impl Media,
        issued: Option<u64>,
    ) -> IoResult<Bytes> {
        if failpoints_armed() {
            self.failpoints_before(op, group);
        }
        for rule in &self.rules {
            if !rule.matches(op) {
                continue;
            }
            let Some(r) = rule.fires() else { continue };
            match rule.kind {
                Kind::Eio => return Err(IoError::Eio),
                Kind::NoSpace => return Err(IoError::NoSpace),
                Kind::Timeout => {
                    std::thread::sleep(Duration::from_millis(rule.ms));
                    return Err(IoError::Timeout);
                }
                Kind::Delay => std::thread::sleep(Duration::from_millis(rule.ms)),
                Kind::Torn | Kind::TornCrash => {
                    if let IoOp::Write { offset, data, .. } = op {
                        let sectors = data.len().div_ceil(512) as u64;
                        let keep = ((r % sectors.max(1)) * 512) as usize;
                        if keep > 0 {
                            let part = data.slice(..keep.min(data.len()));
                            let _ = self.exec(
                                &IoOp::Write {
                                    offset: *offset,
                                    data: part,
                                    fua: false,
                                },
                                group,
                                dev,
                                None,
                            );
                        }
                        if rule.kind == Kind::TornCrash {
                            // The page cache keeps what was written: a crash mid-write.
                            let _ = self.exec(&IoOp::Flush, None, dev, None);
                            eprintln!(
                                "nvwc: torn-crash fault: abort after {keep} of {} bytes",
                                data.len()
                            );
                            std::process::abort();
                        }
                        return Err(IoError::Eio);
                    }
                }
            }
        }
        let r = self.exec(op, group, dev, issued);
        if failpoints_armed() && r.is_ok() {
            match (self.role, op) {
                (Role::Cache, IoOp::Flush) => failpoint("cache-flush"),
                (Role::Backing, IoOp::Flush) => failpoint("backing-flush"),
                _ => {}
            }
        }
        r
    }

    fn failpoints_before(&self, op: &IoOp<Bytes>, group: Option<u64>) {
        match (self.role, op) {
            (Role::Cache, IoOp::Write { fua: true, .. }) => failpoint("commit-record"),
            (Role::Backing, IoOp::Write { .. }) if group.is_none() => failpoint("writeback"),
            (Role::Backing, IoOp::GroupEnd { .. }) => failpoint("checkpoint"),
            _ => {}
        }
    }

    /// Execute on `dev`, through the host-crash model if it is on
    /// (`nvwc-dev/src/volatile.rs`); `issued`: a FLUSH's issue stamp.
    fn exec(
        &self,
        op: &IoOp<Bytes>,
        group: Option<u64>,
        dev: &impl Media,
        issued: Option<u64>,
    ) -> IoResult<Bytes> {
        let Some(v) = &self.volatile else {
            return dev.raw(op, group);
        };
        match op {
            IoOp::Write {
                offset,
                data,
                fua: false,
            } if group.is_none() => {
                // Recorded before it is shown: a crash in the middle of the
                // copy may keep any part of it (a write in flight).
                v.completed(vec![(*offset, data.clone())])
                    .map_err(|e| self.log_failed(e))?;
                if dev.has_view() {
                    dev.show(*offset, data)?;
                }
                Ok(None)
            }
            IoOp::Write { offset, data, .. } if group.is_none() => {
                // FUA: to the device now. Flushes wait, so that no older
                // batch lands over it.
                let _sync = v.sync_lock();
                if dev.has_view() {
                    dev.show(*offset, data)?;
                }
                dev.raw(op, None)?;
                v.durable(*offset, data).map_err(|e| self.log_failed(e))?;
                Ok(None)
            }
            IoOp::Checksum { offset, len } => {
                // Over what a read shows now (the overlay included).
                let read = IoOp::Read {
                    offset: *offset,
                    len: *len,
                };
                let got = self.exec(&read, group, dev, issued)?.unwrap_or_default();
                let crc = nvwc_core::layout::data_crc(&got);
                Ok(Some(Bytes::copy_from_slice(&crc.to_le_bytes())))
            }
            IoOp::Read { .. } if dev.has_view() => dev.raw(op, group),
            IoOp::Read { offset, len } => {
                // The device and the overlay as of one moment: a FLUSH
                // moves records from the one to the other.
                let _sync = v.sync_lock();
                let got = dev.raw(op, group)?;
                Ok(v.overlay(*offset, *len, got))
            }
            IoOp::Write { .. } | IoOp::Trim { .. } | IoOp::GroupBegin { .. } => dev.raw(op, group),
            IoOp::Flush | IoOp::GroupEnd { .. } => {
                // Every write completed before the FLUSH was issued
                // reaches the device, then the sync makes it durable. A
                // group's end syncs first too: its redo log's sync of the
                // backing file makes every completed write durable as well.
                let _sync = v.sync_lock();
                let (stamp, batch) = v.batch(issued);
                for (offset, data) in batch {
                    let w = IoOp::Write {
                        offset,
                        data,
                        fua: false,
                    };
                    dev.raw(&w, None)?;
                }
                if matches!(op, IoOp::Flush) {
                    dev.raw(op, group)?;
                    v.synced(stamp).map_err(|e| self.log_failed(e))?;
                    return Ok(None);
                }
                dev.raw(&IoOp::Flush, None)?;
                v.synced(stamp).map_err(|e| self.log_failed(e))?;
                dev.raw(op, group)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_reject() {
        let (r, v) = parse_rules("eio,op=write,after=3,count=2;volatile").unwrap();
        assert_eq!(v, Some(VolatileSpec::default()));
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].kind, Kind::Eio);
        assert_eq!(r[0].op, OpClass::Write);
        assert!(parse_rules("bogus").is_err());
        assert!(parse_rules("eio,prob=2").is_err());
        assert!(parse_rules("torn,op=read").is_err());
        let (_, v) = parse_rules("volatile,log=/tmp/x.log").unwrap();
        assert_eq!(v.unwrap().log.unwrap(), std::path::Path::new("/tmp/x.log"));
        assert!(parse_rules("volatile,bogus").is_err());
        assert_eq!(parse_rules("eio").unwrap().1, None);
    }

    #[test]
    fn rule_fires_after_and_count() {
        let (r, _) = parse_rules("eio,after=2,count=1").unwrap();
        let fired: Vec<bool> = (0..5).map(|_| r[0].fires().is_some()).collect();
        assert_eq!(fired, vec![false, false, true, false, false]);
    }

    #[test]
    fn overlay_reads_its_writes_and_loses_unsynced_ones() {
        let disk = Mutex::new(vec![0u8; 4096]);
        let raw = |op: &IoOp<Bytes>, _g: Option<u64>| -> IoResult<Bytes> {
            let mut d = disk.lock().unwrap();
            match op {
                IoOp::Read { offset, len } => Ok(Some(Bytes::copy_from_slice(
                    &d[*offset as usize..(*offset + u64::from(*len)) as usize],
                ))),
                IoOp::Write { offset, data, .. } => {
                    d[*offset as usize..*offset as usize + data.len()].copy_from_slice(data);
                    Ok(None)
                }
                _ => Ok(None),
            }
        };
        let l = Layer::new(Role::Backing, "volatile", "t").unwrap();
        let w = |o: u64, b: u8, fua: bool| IoOp::Write {
            offset: o,
            data: Bytes::from(vec![b; 512]),
            fua,
        };
        l.run(&w(0, 1, false), None, &raw).unwrap();
        let r = l
            .run(
                &IoOp::Read {
                    offset: 0,
                    len: 1024,
                },
                None,
                &raw,
            )
            .unwrap()
            .unwrap();
        assert_eq!(&r[..512], &[1u8; 512][..]);
        assert_eq!(
            disk.lock().unwrap()[0],
            0,
            "not on the device before a sync"
        );
        l.run(&w(512, 2, true), None, &raw).unwrap();
        assert_eq!(disk.lock().unwrap()[512], 2, "FUA reaches the device");
        assert_eq!(disk.lock().unwrap()[0], 0);
        l.run(&IoOp::Flush, None, &raw).unwrap();
        assert_eq!(disk.lock().unwrap()[0], 1, "a sync makes it durable");
    }
}
