//! Device models for the trace-driven simulator.
//!
//! A device model is a small discrete-event system in virtual time (`u64`
//! nanoseconds). The simulator [`submit`](DeviceModel::submit)s commands at
//! non-decreasing times, asks for the [next time](DeviceModel::next_completion)
//! at which the device needs attention, and
//! [pops the completions](DeviceModel::pop_completions) that happened by then.
//! Every model has its own queue; none of them uses randomness, so a run is a
//! pure function of the command stream.
//!
//! Models:
//! * [`HddModel`]: seek curve + rotation + transfer, request queue with FIFO,
//!   SSTF or C-LOOK scheduling, head position, rotational position derived
//!   from absolute time, zones, track/cylinder skew, read-ahead and an optional
//!   write cache. Presets: [`HddParams::hp97560`], [`HddParams::modern_7200`].
//! * [`SolidStateModel`]: parallel units (channels/dies), per-op latency,
//!   sequential-vs-random latency, media and link bandwidth, optional DRAM
//!   write buffer, FLUSH latency. Presets for SATA-class and NVMe-class SSDs,
//!   the OCZ RevoDrive of the write-policy paper, NV-DRAM and PMEM.
//! * [`NetModel`]: networked storage (iSCSI/NBD-like): RTT, bandwidth,
//!   outstanding-request limit, composed with any backend device. Preset from
//!   Table 1 of the write-policy paper.
//! * [`ArrayModel`]: RAID 0 / RAID 1 of member models (e.g. an HDD array
//!   behind a [`NetModel`]).
//!
//! [`DeviceSpec`] names a model with its parameters (`FromStr` names and
//! serde), and [`build`] turns it into a `Box<dyn DeviceModel>`.
//!
//! # Driving a model
//! ```
//! use nvwc_sim::device::{build, DevOp, DevOpKind, DeviceModel, DeviceSpec};
//! let spec: DeviceSpec = "ssd-nvme".parse().unwrap();
//! let mut dev = build(&spec, None).unwrap();
//! dev.submit(0, DevOp { id: 1, kind: DevOpKind::Read, offset: 0, len: 4096, fua: false });
//! let mut done = Vec::new();
//! while let Some(t) = dev.next_completion() {
//!     dev.pop_completions(t, &mut done);
//! }
//! assert_eq!(done, vec![1]);
//! ```

pub mod array;
mod calendar;
mod engine;
pub mod hdd;
pub mod net;
pub mod solid;
mod spec;
mod stats;

pub use array::{ArrayModel, ArrayParams, RaidLevel};
pub use hdd::{DiskScheduler, HddModel, HddParams, SeekCurve, Zone};
pub use net::{NetModel, NetParams};
pub use solid::{SolidStateModel, SolidStateParams, WriteBufferParams};
pub use spec::{build, DeviceSpec, PRESET_NAMES};
pub use stats::{DeviceStats, KindStats, QD_BUCKETS};

use serde::{Deserialize, Serialize};

/// Virtual time and durations, in nanoseconds.
pub type Nanos = u64;

/// Nanoseconds per second.
pub const NS_PER_SEC: u64 = 1_000_000_000;

/// Kind of a block command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DevOpKind {
    /// Read `len` bytes at `offset`.
    Read,
    /// Write `len` bytes at `offset` (`fua` forces it to stable media).
    Write,
    /// Make every write completed before this command durable.
    /// `offset` and `len` are ignored.
    Flush,
    /// Discard `len` bytes at `offset`.
    Trim,
}

impl DevOpKind {
    /// Dense index (Read=0, Write=1, Flush=2, Trim=3).
    pub fn index(self) -> usize {
        match self {
            DevOpKind::Read => 0,
            DevOpKind::Write => 1,
            DevOpKind::Flush => 2,
            DevOpKind::Trim => 3,
        }
    }
}

/// A block command submitted to a device model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevOp {
    /// Caller-chosen identifier, returned by
    /// [`pop_completions`](DeviceModel::pop_completions). The caller
    /// guarantees it is unique among the device's outstanding commands.
    pub id: u64,
    /// Command kind.
    pub kind: DevOpKind,
    /// Byte offset (ignored for FLUSH).
    pub offset: u64,
    /// Length in bytes (ignored for FLUSH; must be > 0 for READ/WRITE).
    pub len: u64,
    /// Force unit access: for a WRITE, bypass any volatile write cache.
    pub fua: bool,
}

impl DevOp {
    /// Convenience constructor for a read.
    pub fn read(id: u64, offset: u64, len: u64) -> Self {
        DevOp {
            id,
            kind: DevOpKind::Read,
            offset,
            len,
            fua: false,
        }
    }
    /// Convenience constructor for a write.
    pub fn write(id: u64, offset: u64, len: u64) -> Self {
        DevOp {
            id,
            kind: DevOpKind::Write,
            offset,
            len,
            fua: false,
        }
    }
    /// Convenience constructor for a flush.
    pub fn flush(id: u64) -> Self {
        DevOp {
            id,
            kind: DevOpKind::Flush,
            offset: 0,
            len: 0,
            fua: false,
        }
    }
    /// Convenience constructor for a trim.
    pub fn trim(id: u64, offset: u64, len: u64) -> Self {
        DevOp {
            id,
            kind: DevOpKind::Trim,
            offset,
            len,
            fua: false,
        }
    }
}

/// An event-driven model of a block device.
///
/// Contract for every method that takes `now`: the caller guarantees that
/// `now` never decreases across calls to [`submit`](Self::submit) and
/// [`pop_completions`](Self::pop_completions) on the same device; models
/// assert it.
pub trait DeviceModel: Send {
    /// Human-readable model name (e.g. `"hdd-hp97560"`).
    fn name(&self) -> &str;

    /// Submit `op` at virtual time `now`.
    ///
    /// Caller guarantees: `now` is not before any earlier `now` given to this
    /// device; `op.id` is not the id of an outstanding command; for READ and
    /// WRITE `op.len > 0`; for READ, WRITE and TRIM
    /// `op.offset + op.len <= capacity_bytes()`. Violations panic.
    fn submit(&mut self, now: Nanos, op: DevOp);

    /// Earliest time at which the device has something to do: a completion,
    /// or an internal event (e.g. the end of a background destage) after
    /// which a completion may become known. No completion happens before it.
    /// The driver should call [`pop_completions`](Self::pop_completions) at
    /// that time; it may then return no id. Without background work
    /// (write caches off) this is exactly the next completion time.
    /// It is earlier than the latest `now` given to the device when
    /// completions that already happened have not been popped yet (pop them
    /// at the current time). `None` means the device has no outstanding
    /// command and no pending internal event.
    fn next_completion(&self) -> Option<Nanos>;

    /// Append to `out` the id of every command completing at or before `now`,
    /// in completion order (ties in a deterministic internal order).
    fn pop_completions(&mut self, now: Nanos, out: &mut Vec<u64>);

    /// Usable capacity in bytes.
    fn capacity_bytes(&self) -> u64;

    /// Statistics since creation, up to the last event the model processed.
    fn stats(&self) -> DeviceStats;

    /// Size of one track at offset 0 for rotating media (the unit the
    /// stack-model LST policy coalesces into); `None` for devices without
    /// tracks.
    fn track_bytes(&self) -> Option<u64> {
        None
    }
}

/// Errors from building a device model.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DeviceError {
    /// Unknown preset name.
    #[error("unknown device spec name {0:?} (known: {known})", known = PRESET_NAMES.join(", "))]
    UnknownName(String),
    /// Parameters are inconsistent or out of range.
    #[error("invalid device parameters: {0}")]
    InvalidParams(String),
    /// Requested capacity cannot be provided by the model.
    #[error("requested capacity {requested} bytes exceeds the model's maximum of {max} bytes")]
    CapacityTooLarge {
        /// Requested capacity in bytes.
        requested: u64,
        /// What the model can provide.
        max: u64,
    },
    /// A parameter file could not be parsed.
    #[error("cannot parse device spec: {0}")]
    Parse(String),
}

/// `ceil(bytes / rate)` in nanoseconds; `rate == 0` means unlimited (0 ns).
pub(crate) fn transfer_ns(bytes: u64, bytes_per_sec: u64) -> Nanos {
    if bytes_per_sec == 0 || bytes == 0 {
        return 0;
    }
    let num = bytes as u128 * NS_PER_SEC as u128;
    let r = bytes_per_sec as u128;
    num.div_ceil(r) as u64
}

/// Move a model's clock `last` on to `now`. Panics if time went backwards.
pub(crate) fn advance_clock(name: &str, last: &mut Nanos, now: Nanos) {
    assert!(now >= *last, "{name}: time went backwards ({now} < {last})");
    *last = now;
}

/// The capacity a model exposes: `requested`, which MUST NOT exceed the
/// `native` one; `None` is the native capacity.
pub(crate) fn exposed_capacity(native: u64, requested: Option<u64>) -> Result<u64, DeviceError> {
    match requested {
        None => Ok(native),
        Some(c) if c <= native => Ok(c),
        Some(c) => Err(DeviceError::CapacityTooLarge {
            requested: c,
            max: native,
        }),
    }
}

/// Validate the part of the [`DeviceModel::submit`] contract that does not
/// depend on the model's internal state. Panics on violation.
pub(crate) fn check_op(op: &DevOp, capacity: u64) {
    match op.kind {
        DevOpKind::Read | DevOpKind::Write => {
            assert!(op.len > 0, "DevOp {}: READ/WRITE with len 0", op.id);
            assert!(
                op.offset
                    .checked_add(op.len)
                    .is_some_and(|end| end <= capacity),
                "DevOp {}: [{}, +{}) beyond capacity {}",
                op.id,
                op.offset,
                op.len,
                capacity
            );
        }
        DevOpKind::Trim => assert!(
            op.offset
                .checked_add(op.len)
                .is_some_and(|end| end <= capacity),
            "DevOp {}: TRIM [{}, +{}) beyond capacity {}",
            op.id,
            op.offset,
            op.len,
            capacity
        ),
        DevOpKind::Flush => {}
    }
}

#[cfg(test)]
mod tests;
