//! Inputs and outputs of the engine.

use crate::payload::Payload;

/// Identifier of a client request, chosen by the driver (unique among requests in flight).
pub type ReqId = u64;
/// Identifier of a device command, chosen by the engine.
pub type IoId = u64;

/// Client identity and hints carried by every request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tag {
    /// Client (connection or simulated process) identifier.
    pub client: u32,
    /// The request is critical: something waits on it (admission hint).
    pub critical: bool,
    /// The write is issued on behalf of a sync operation (fsync, O_SYNC): the
    /// `sync` admission policy caches it. Block-level drivers that cannot
    /// see this leave it false (FUA still counts).
    pub sync: bool,
}

/// A client request.
#[derive(Clone, Debug)]
pub enum ReqOp<P> {
    /// Read `len` bytes at `offset`.
    Read { offset: u64, len: u32 },
    /// Write `data` at `offset`; with `fua` the reply waits until it is durable.
    Write { offset: u64, data: P, fua: bool },
    /// Make every write acknowledged before this request durable.
    Flush,
    /// The range's contents become unspecified until written again.
    Trim { offset: u64, len: u32 },
    /// Write zeroes.
    WriteZeroes { offset: u64, len: u32, fua: bool },
    /// An explicit consistency point (closes a `journaled-hints` transaction); acts as a flush.
    Checkpoint,
}

/// A client request with its identity.
#[derive(Clone, Debug)]
pub struct Request<P> {
    pub id: ReqId,
    pub op: ReqOp<P>,
    pub tag: Tag,
}

/// Why a request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReqError {
    #[error("request range is outside the device or not allowed")]
    InvalidRange,
    #[error("write larger than the engine accepts (see Engine::max_write_bytes)")]
    TooLarge,
    #[error("I/O error")]
    Io,
    #[error("no space")]
    NoSpace,
    #[error("engine is shutting down")]
    Shutdown,
}

/// The reply to one request.
#[derive(Clone, Debug)]
pub struct Reply<P> {
    pub id: ReqId,
    /// `Ok(Some(data))` for reads, `Ok(None)` otherwise.
    pub result: Result<Option<P>, ReqError>,
    /// For writes: the sequence number the engine gave the write (issue
    /// order); 0 otherwise, and for a journaled write that bypassed the cache
    /// (it belongs to no transaction).
    pub seq: u64,
}

/// Which device a command is for.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Dev {
    /// The fast persistent cache device.
    Cache,
    /// The slow backing store.
    Backing,
}

/// A device command.
#[derive(Clone, Debug)]
pub enum IoOp<P> {
    Read {
        offset: u64,
        len: u32,
    },
    /// Write; with `fua` it completes only once durable.
    Write {
        offset: u64,
        data: P,
        fua: bool,
    },
    Flush,
    /// Checksum `len` bytes at `offset` (cache device only). Completes with
    /// `Ok(Some(p))` where `p`'s first four bytes are the little-endian
    /// CRC-32C ([`crate::layout::data_crc`]) of the device's current
    /// contents there, as a read issued now would return them (a payload
    /// without bytes, in models that keep none, counts as CRC 0). Drivers
    /// that hold the bytes in memory answer without device I/O.
    Checksum {
        offset: u64,
        len: u32,
    },
    Trim {
        offset: u64,
        len: u32,
    },
    /// Start an atomic group on the backing store (journaled checkpoints).
    GroupBegin {
        group: u64,
    },
    /// End an atomic group: on completion every write of the group is durable
    /// and visible, all together; before it, none of them may be visible after a crash.
    GroupEnd {
        group: u64,
    },
}

/// A device command with its identity.
#[derive(Clone, Debug)]
pub struct IoCmd<P> {
    pub id: IoId,
    pub dev: Dev,
    pub op: IoOp<P>,
    /// For backing writes inside an atomic group: the group.
    pub group: Option<u64>,
}

/// One part of a direct write (`Engine::handle_direct_write`): payload bytes
/// `[payload_offset, payload_offset + len)` go to cache-device byte `offset`,
/// as the cache write `io`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirectPart {
    pub io: IoId,
    pub offset: u64,
    pub payload_offset: u64,
    pub len: u64,
}

/// Why a device command failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IoError {
    #[error("device I/O error")]
    Eio,
    #[error("device out of space")]
    NoSpace,
    #[error("device timed out")]
    Timeout,
}

/// The result of a device command: data for reads.
pub type IoResult<P> = Result<Option<P>, IoError>;

impl<P: Payload> IoCmd<P> {
    /// Bytes moved by the command (0 for flush and markers).
    pub fn bytes(&self) -> u64 {
        match &self.op {
            IoOp::Read { len, .. } => *len as u64,
            IoOp::Write { data, .. } => data.len() as u64,
            IoOp::Trim { len, .. } => *len as u64,
            _ => 0,
        }
    }
}
