//! The common record type every reader produces.

use serde::Serialize;
use std::fmt;

/// What a request does to the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// Read `len` bytes at `offset`.
    Read,
    /// Write `len` bytes at `offset`.
    Write,
    /// Cache flush / write barrier (SYNCHRONIZE CACHE, REQ_PREFLUSH, `fsync`).
    /// Flush records always have `offset == 0` and `len == 0`.
    Flush,
    /// Discard / unmap / TRIM of `len` bytes at `offset`.
    Trim,
}

impl Op {
    /// All operations, in code order.
    pub const ALL: [Op; 4] = [Op::Read, Op::Write, Op::Flush, Op::Trim];

    /// The one-byte code used by the compact format (`Read = 0`, `Write = 1`,
    /// `Flush = 2`, `Trim = 3`).
    pub fn code(self) -> u8 {
        match self {
            Op::Read => 0,
            Op::Write => 1,
            Op::Flush => 2,
            Op::Trim => 3,
        }
    }

    /// Inverse of [`Op::code`]; `None` for codes above 3.
    pub fn from_code(code: u8) -> Option<Op> {
        match code {
            0 => Some(Op::Read),
            1 => Some(Op::Write),
            2 => Some(Op::Flush),
            3 => Some(Op::Trim),
            _ => None,
        }
    }

    /// `true` for the operations that move data (`Read` and `Write`).
    pub fn is_data(self) -> bool {
        matches!(self, Op::Read | Op::Write)
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Trim => "trim",
        })
    }
}

/// One block request, as every reader in this crate yields it.
///
/// Contract (for records coming out of a [`crate::TraceReader`]):
/// * `ts_ns` is in nanoseconds relative to the first record the reader
///   released (which therefore has `ts_ns == 0`), and never decreases from
///   one record to the next (see the crate docs for out-of-order input).
/// * `offset` and `len` are in **bytes**; for [`Op::Flush`] both are 0.
/// * `offset + len` does not overflow `u64`.
/// * `fua` is only ever set where the source format records Force Unit
///   Access (blkparse RWBS, the compact format).
/// * `dev` is the volume / disk / ASU / LUN number (0 when the format has
///   none); `stream` is the issuing pid / tid when known, else 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct TraceRecord {
    /// Nanoseconds since the first record of the trace.
    pub ts_ns: u64,
    /// What the request does.
    pub op: Op,
    /// Byte offset on the device.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// Force Unit Access: the write must be durable when it completes.
    pub fua: bool,
    /// Volume / disk / ASU / LUN id.
    pub dev: u32,
    /// Issuing process / thread id, 0 when unknown.
    pub stream: u32,
}

impl TraceRecord {
    /// A data or trim request with no FUA and stream 0.
    pub fn new(ts_ns: u64, op: Op, offset: u64, len: u64, dev: u32) -> Self {
        TraceRecord {
            ts_ns,
            op,
            offset,
            len,
            fua: false,
            dev,
            stream: 0,
        }
    }

    /// A flush (`offset == len == 0`).
    pub fn flush(ts_ns: u64, dev: u32) -> Self {
        TraceRecord::new(ts_ns, Op::Flush, 0, 0, dev)
    }

    /// One past the last byte touched (`offset + len`, saturating).
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.len)
    }
}
