//! Fault injection for the live server's devices, and crash failpoints:
//! the wiring of the device filters of `nvwc-dev` into `nvwc serve`.
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
//!   The language is `nvwc-dev/src/rules.rs`; the filter that injects the
//!   faults into any block device, `nvwc-dev/src/fault.rs`.
//! - **simulate a host crash** (`volatile[,log=PATH]`): the host-crash
//!   filter (`nvwc-dev/src/hostcrash.rs`, over `nvwc-dev/src/volatile.rs`):
//!   the file holds only what is durable; a write reaches it only at a
//!   FLUSH issued after the write completed (or as a FUA write, or before a
//!   journaled group ends). Until then it is visible in the device's own
//!   view (the cache file mapped *private*, so mapped cache writes and
//!   direct writes take their usual path, `mapped.rs`) or in the
//!   filter's overlay on reads, and, with `log=PATH`, recorded in a side log
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
//!
//! What stays here, not in a filter, and why:
//!
//! - failpoints and degraded mode are about the server, not a device: a
//!   failpoint names a step of the engine's crash story (`commit-record` is
//!   the cache's FUA write, `writeback` a backing write outside a group),
//!   which a device cannot tell apart, and the armed counts are one per
//!   process, shared by every export; degraded mode is the export's answer
//!   to a failed cache device (and counts every failure, the filters' and
//!   the device's own alike);
//! - a write whose bytes the driver puts in the device's view itself
//!   ([`Layer::put_write`]: a payload received from the socket straight
//!   into the mapped cache file, and buffered cache writes copied into the
//!   mapping) cannot go through the interface's `write`, which takes bytes
//!   that exist before the write: the layer asks the same rules
//!   ([`Rules::decide`]) and records what was written in the same
//!   host-crash state ([`Volatile::completed`]) around the driver's copy.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use nvwc_core::{IoError, IoOp, IoResult};
use nvwc_dev::block::BlockDevice;
use nvwc_dev::fault::Faulty;
use nvwc_dev::hostcrash::{HostCrash, SideLogFailed, View};
use nvwc_dev::rules::{self, Fate, Injected, OpClass, Rules};
use nvwc_dev::volatile::Volatile;

use crate::log::log;

pub use nvwc_dev::rules::SpecError;
pub use nvwc_dev::volatile;

/// The device under a [`Layer`], for what the layer does itself.
pub trait Media {
    /// FLUSH the device through the host-crash filter, if on, but no
    /// fault rule (a torn crash's last act).
    fn flush_unfaulted(&self) -> IoResult<Bytes>;
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
    rules: Rules,
    /// Host-crash mode: what is not durable yet (`nvwc-dev/src/volatile.rs`).
    volatile: Option<Arc<Volatile>>,
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
        let parsed = rules::parse(spec)?;
        let volatile = parsed
            .volatile
            .map(|v| {
                // One log per export.
                let log = v.log.map(|p| match export {
                    "" => p,
                    name => format!("{}.{name}", p.display()).into(),
                });
                Volatile::new(log.clone())
                    .map(Arc::new)
                    .map_err(|e| SpecError {
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
            rules: parsed.rules,
            volatile,
            failed: AtomicBool::new(false),
            errors: AtomicU64::new(0),
            err_log: crate::log::Throttle::new(),
            export: export.to_string(),
        })
    }

    /// Nothing to inject, overlay or check: a command may bypass [`Layer::run`].
    pub fn passthrough(&self) -> bool {
        !self.filtered() && !failpoints_armed()
    }

    /// Commands go through the device filters (fault rules, or host-crash
    /// mode): [`Layer::with_filters`].
    pub fn filtered(&self) -> bool {
        !self.rules.is_empty() || self.volatile.is_some()
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
    /// pass to [`Layer::with_filters`] when it runs later (on a worker): it
    /// covers the writes completed before its issue, not those completed
    /// while it waited to run. `None` otherwise.
    pub fn issue_stamp(&self) -> Option<u64> {
        self.volatile.as_ref().map(|v| v.stamp())
    }

    /// Run `f` on `base` under this layer's filters: the fault filter over
    /// the host-crash filter (if on, showing pending writes in `view`; its
    /// FLUSH covering the writes completed before `issued`) over `base`.
    pub fn with_filters<D: BlockDevice, V: View, R>(
        &self,
        base: D,
        view: Option<V>,
        issued: Option<u64>,
        f: impl FnOnce(&dyn BlockDevice) -> R,
    ) -> R {
        self.stack(self.rules.clone(), base, view, issued, f)
    }

    fn stack<D: BlockDevice, V: View, R>(
        &self,
        rules: Rules,
        base: D,
        view: Option<V>,
        issued: Option<u64>,
        f: impl FnOnce(&dyn BlockDevice) -> R,
    ) -> R {
        match &self.volatile {
            Some(v) => {
                let crash = HostCrash::new(v.clone(), base)
                    .with_view(view)
                    .issued(issued);
                f(&Faulty::new(rules, crash))
            }
            None => f(&Faulty::new(rules, base)),
        }
    }

    /// [`Layer::with_filters`] without the fault rules.
    pub fn without_rules<D: BlockDevice, V: View, R>(
        &self,
        base: D,
        view: Option<V>,
        f: impl FnOnce(&dyn BlockDevice) -> R,
    ) -> R {
        self.stack(Rules::default(), base, view, None, f)
    }

    /// Run `op` (`exec`: on the device, through [`Layer::with_filters`] if
    /// [`Layer::filtered`]) with the failpoints around it; its failure is
    /// counted and logged ([`Layer::record_error`]).
    pub fn run(
        &self,
        op: &IoOp<Bytes>,
        group: Option<u64>,
        exec: impl FnOnce() -> IoResult<Bytes>,
    ) -> IoResult<Bytes> {
        if failpoints_armed() {
            self.failpoints_before(op, group);
        }
        let r = exec();
        if failpoints_armed() && r.is_ok() {
            match (self.role, op) {
                (Role::Cache, IoOp::Flush) => failpoint("cache-flush"),
                (Role::Backing, IoOp::Flush) => failpoint("backing-flush"),
                _ => {}
            }
        }
        if let Err(e) = &r {
            self.record_error(e);
        }
        r
    }

    /// The engine's error for a failed device command: an injected fault's
    /// own, no space, or EIO (a failed side log logged first).
    pub fn io_error(&self, e: &io::Error) -> IoError {
        match Injected::of(e) {
            Some(Injected::Eio) => return IoError::Eio,
            Some(Injected::NoSpace) => return IoError::NoSpace,
            Some(Injected::Timeout) => return IoError::Timeout,
            None => {}
        }
        if let Some(e) = SideLogFailed::of(e) {
            return self.log_failed(e);
        }
        match e.raw_os_error() {
            Some(libc::ENOSPC) => IoError::NoSpace,
            _ => IoError::Eio,
        }
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
    /// through the fault filter; with nothing configured this is just `put(len)`.
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
        if failpoints_armed() {
            let probe = IoOp::Write {
                offset,
                data: Bytes::new(),
                fua: false,
            };
            self.failpoints_before(&probe, None);
        }
        let fate = self
            .rules
            .decide(OpClass::Write, len)
            .map_err(|e| fail(self.io_error(&e)))?;
        let keep = match fate {
            Fate::Run => len,
            Fate::Torn { keep, .. } => keep,
        };
        if keep > 0 {
            self.put_kept(keep, put, written).map_err(|e| match e {
                PutError::Device(e) => fail(e),
                put => put,
            })?;
        }
        match fate {
            Fate::Torn { crash: true, .. } => {
                // The page cache keeps what was written: a crash mid-write.
                let _ = dev.flush_unfaulted();
                eprintln!("nvwc: torn-crash fault: abort after {keep} of {len} bytes");
                std::process::abort();
            }
            Fate::Torn { .. } => Err(fail(IoError::Eio)),
            Fate::Run => Ok(()),
        }
    }

    /// `put(keep)`, recorded by host-crash mode before or after (`written`).
    fn put_kept(
        &self,
        keep: usize,
        put: &mut dyn FnMut(usize) -> std::io::Result<()>,
        written: Written<'_>,
    ) -> Result<(), PutError> {
        let record = |w: std::io::Result<Vec<(u64, Bytes)>>| match &self.volatile {
            Some(v) => w
                .and_then(|w| v.completed(w))
                .map_err(|e| PutError::Device(self.log_failed(&e))),
            None => Ok(()),
        };
        match written {
            Written::Before(w) => {
                if self.volatile.is_some() {
                    record(Ok(w(keep)))?;
                }
                put(keep).map_err(PutError::Put)
            }
            Written::After(w) => {
                put(keep).map_err(PutError::Put)?;
                if self.volatile.is_some() {
                    record(w(keep))?;
                }
                Ok(())
            }
        }
    }

    /// The side log could not be written: the host-crash model is broken,
    /// so the write fails (and the export degrades) rather than go unrecorded.
    fn log_failed(&self, e: &io::Error) -> IoError {
        log!(
            error,
            "volatile_log_failed",
            device = self.role.name(),
            export = &self.export,
            error = e.to_string()
        );
        IoError::Eio
    }

    fn failpoints_before(&self, op: &IoOp<Bytes>, group: Option<u64>) {
        match (self.role, op) {
            (Role::Cache, IoOp::Write { fua: true, .. }) => failpoint("commit-record"),
            (Role::Backing, IoOp::Write { .. }) if group.is_none() => failpoint("writeback"),
            (Role::Backing, IoOp::GroupEnd { .. }) => failpoint("checkpoint"),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvwc_dev::hostcrash::NoView;
    use std::os::unix::fs::FileExt;

    #[test]
    fn host_crash_mode_over_a_file_reads_its_writes_and_loses_unsynced_ones() {
        let path = std::env::temp_dir().join(format!("nvwc-fault-layer-{}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.set_len(4096).unwrap();
        let l = Layer::new(Role::Backing, "volatile", "t").unwrap();
        assert!(l.filtered() && l.volatile());
        let on_disk = |at: u64| {
            let mut b = [0u8; 1];
            file.read_exact_at(&mut b, at).unwrap();
            b[0]
        };
        let run = |f: &dyn Fn(&dyn BlockDevice) -> io::Result<()>| {
            l.with_filters(&file, None::<NoView>, None, f).unwrap()
        };
        run(&|d| d.write(0, &[&[1; 512]], false));
        let mut b = [0u8; 1024];
        l.with_filters(&file, None::<NoView>, None, |d| d.read(0, &mut b))
            .unwrap();
        assert_eq!(&b[..512], &[1u8; 512][..]);
        assert_eq!(on_disk(0), 0, "not on the device before a sync");
        run(&|d| d.write(512, &[&[2; 512]], true));
        assert_eq!(on_disk(512), 2, "FUA reaches the device");
        assert_eq!(on_disk(0), 0);
        run(&|d| d.flush());
        assert_eq!(on_disk(0), 1, "a sync makes it durable");
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn injected_faults_become_the_engines_errors() {
        let l = Layer::new(Role::Backing, "enospc,op=flush;timeout,ms=0,op=read", "t").unwrap();
        assert!(l.filtered() && !l.volatile());
        let dev = std::fs::File::open("/dev/null").unwrap();
        let r = l.with_filters(&dev, None::<NoView>, None, |d| d.flush());
        assert!(matches!(l.io_error(&r.unwrap_err()), IoError::NoSpace));
        let r = l.with_filters(&dev, None::<NoView>, None, |d| d.read(0, &mut [0u8; 1]));
        assert!(matches!(l.io_error(&r.unwrap_err()), IoError::Timeout));
    }
}
