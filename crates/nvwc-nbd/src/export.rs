//! The [`Export`] trait that the server framework drives, and its companions.

use std::future::Future;
use std::io;
use std::os::fd::BorrowedFd;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;

use crate::error::NbdError;
use crate::proto::{tx_flags, Extent, RequestHeader, MAX_STRING_LEN};

/// A boxed, `Send` future (the trait is object safe and async-trait free).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Result of an export operation.
pub type NbdResult<T> = Result<T, NbdError>;

/// The future of an operation that answers with no data (write, flush,
/// trim, write zeroes, cache).
pub type OpFuture<'a> = BoxFuture<'a, NbdResult<()>>;

/// Largest `max_block` an export may advertise: the server buffers whole
/// payloads, so this bounds per-request memory (64 MiB).
pub const MAX_BLOCK_LIMIT: u32 = 64 << 20;

/// Description of an export, as advertised during the handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    /// Export name; "" is the default export.
    pub name: String,
    /// Human-readable description ("" for none).
    pub description: String,
    /// Size in bytes.
    pub size: u64,
    /// Writes, trims and zeroes are refused with `EPERM`.
    pub read_only: bool,
    /// Advertise `NBD_CMD_FLUSH`.
    pub can_flush: bool,
    /// Advertise `NBD_CMD_FLAG_FUA`.
    pub can_fua: bool,
    /// Advertise `NBD_CMD_TRIM`.
    pub can_trim: bool,
    /// Advertise `NBD_CMD_WRITE_ZEROES`.
    pub can_zero: bool,
    /// Advertise `NBD_CMD_FLAG_FAST_ZERO` (requires `can_zero`).
    pub can_fast_zero: bool,
    /// Advertise `NBD_CMD_CACHE`.
    pub can_cache: bool,
    /// Advertise `NBD_FLAG_CAN_MULTI_CONN`: flush/FUA effects MUST then be
    /// visible across all connections when the reply is sent.
    pub can_multi_conn: bool,
    /// Minimum block size: power of two, 1..=65536. Requests not aligned to it get `EINVAL`.
    pub min_block: u32,
    /// Preferred block size: power of two ≥ max(min_block, 512).
    pub pref_block: u32,
    /// Maximum READ/WRITE payload: ≥ pref_block and ≤ [`MAX_BLOCK_LIMIT`].
    pub max_block: u32,
}

impl Default for ExportInfo {
    fn default() -> Self {
        ExportInfo {
            name: String::new(),
            description: String::new(),
            size: 0,
            read_only: false,
            can_flush: false,
            can_fua: false,
            can_trim: false,
            can_zero: false,
            can_fast_zero: false,
            can_cache: false,
            can_multi_conn: false,
            min_block: 1,
            pref_block: 4096,
            max_block: 1 << 25,
        }
    }
}

impl ExportInfo {
    /// A writable export with the spec's default block sizes and no optional features.
    pub fn new(name: impl Into<String>, size: u64) -> Self {
        ExportInfo {
            name: name.into(),
            size,
            ..Default::default()
        }
    }

    /// Enable every optional feature (flush, FUA, trim, zero, fast zero, cache, multi-conn).
    pub fn with_all_features(mut self) -> Self {
        self.can_flush = true;
        self.can_fua = true;
        self.can_trim = true;
        self.can_zero = true;
        self.can_fast_zero = true;
        self.can_cache = true;
        self.can_multi_conn = true;
        self
    }

    /// Check the spec's constraints on the advertised values.
    pub fn validate(&self) -> Result<(), String> {
        if self.name.len() > MAX_STRING_LEN || self.name.contains('\0') {
            return Err("name MUST be at most 4096 bytes without NUL".into());
        }
        if self.description.len() > MAX_STRING_LEN || self.description.contains('\0') {
            return Err("description MUST be at most 4096 bytes without NUL".into());
        }
        if !self.min_block.is_power_of_two() || self.min_block > 65536 {
            return Err(format!(
                "min_block {} MUST be a power of two ≤ 65536",
                self.min_block
            ));
        }
        if !self.pref_block.is_power_of_two() || self.pref_block < self.min_block.max(512) {
            return Err(format!(
                "pref_block {} MUST be a power of two ≥ max(min_block, 512)",
                self.pref_block
            ));
        }
        if self.max_block < self.pref_block || self.max_block > MAX_BLOCK_LIMIT {
            return Err(format!(
                "max_block {} MUST be ≥ pref_block and ≤ {MAX_BLOCK_LIMIT}",
                self.max_block
            ));
        }
        if self.can_fast_zero && !self.can_zero {
            return Err("can_fast_zero requires can_zero".into());
        }
        Ok(())
    }

    /// The 16-bit transmission flags for this export. `structured` tells
    /// whether structured replies were negotiated (`SEND_DF` needs them).
    pub fn transmission_flags(&self, structured: bool) -> u16 {
        let mut f = tx_flags::HAS_FLAGS;
        let mut set = |cond: bool, bit: u16| {
            if cond {
                f |= bit;
            }
        };
        set(self.read_only, tx_flags::READ_ONLY);
        set(self.can_flush, tx_flags::SEND_FLUSH);
        set(self.can_fua, tx_flags::SEND_FUA);
        set(self.can_trim, tx_flags::SEND_TRIM);
        set(self.can_zero, tx_flags::SEND_WRITE_ZEROES);
        set(structured, tx_flags::SEND_DF);
        set(self.can_multi_conn, tx_flags::CAN_MULTI_CONN);
        set(self.can_cache, tx_flags::SEND_CACHE);
        set(
            self.can_zero && self.can_fast_zero,
            tx_flags::SEND_FAST_ZERO,
        );
        f
    }
}

/// Per-request context handed to every [`Export`] operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestCtx {
    /// Server-unique connection id (never 0).
    pub conn_id: u64,
    /// Canonical name of the export the connection selected.
    pub export: Arc<str>,
    /// The client's cookie for this request.
    pub handle: u64,
}

/// Flags of `NBD_CMD_WRITE_ZEROES`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteZeroesFlags {
    /// `NBD_CMD_FLAG_FUA`: persist before returning.
    pub fua: bool,
    /// `NBD_CMD_FLAG_NO_HOLE`: the area MUST end up fully provisioned.
    pub no_hole: bool,
    /// `NBD_CMD_FLAG_FAST_ZERO`: fail quickly with `ENOTSUP` unless faster than a write.
    pub fast_zero: bool,
}

/// The payload of one `NBD_CMD_WRITE`, still queued on the client's unix
/// socket, for [`Export::write_direct`]: the export receives it straight
/// into its own storage, with no copy through a buffer.
///
/// The server offers one only when the whole payload is already queued, so
/// receiving never waits, and a client that disconnects cannot leave it
/// half-received. On a unix socket the kernel copies queued bytes without
/// stopping for signals: only a fault on the destination (an I/O error, or
/// a `kill -9` while a destination page is being faulted in) ends a copy
/// early, and then at a page boundary. Whatever the export does not take,
/// the server reads and discards, so the stream stays in sync.
pub struct DirectSource<'a> {
    fd: BorrowedFd<'a>,
    left: usize,
    /// The bytes after the payload that the server knows are queued too
    /// (the next request's header, or its start): the receive that ends
    /// the payload takes them in the same system call.
    ahead: [u8; RequestHeader::LEN],
    ahead_want: usize,
    ahead_got: usize,
}

impl<'a> DirectSource<'a> {
    /// A payload of `len` bytes queued on `fd`, followed by at least
    /// `ahead` more queued bytes (at most a request header's worth are
    /// taken with the payload's end). Caller (the server) guarantees they
    /// are queued and next in the stream.
    pub(crate) fn new(fd: BorrowedFd<'a>, len: usize, ahead: usize) -> Self {
        DirectSource {
            fd,
            left: len,
            ahead: [0; RequestHeader::LEN],
            ahead_want: ahead.min(RequestHeader::LEN),
            ahead_got: 0,
        }
    }

    /// Payload bytes not received yet.
    pub fn remaining(&self) -> usize {
        self.left
    }

    /// The bytes after the payload taken with its end (none unless the
    /// whole payload was received).
    pub(crate) fn taken_ahead(&self) -> &[u8] {
        &self.ahead[..self.ahead_got]
    }

    /// Receive the next `dst.len()` payload bytes into `dst`.
    ///
    /// # Errors
    /// `InvalidInput` (and nothing received) past the payload's end; else
    /// the socket's error, e.g. `EFAULT` when `dst` could not be written.
    /// After an error, any part of `dst` may hold received bytes.
    pub fn recv(&mut self, dst: &mut [u8]) -> io::Result<()> {
        if dst.len() > self.left {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        let last = dst.len() == self.left;
        let mut done = 0;
        while done < dst.len() {
            let got = if last && self.ahead_want > 0 {
                self.recv_with_ahead(&mut dst[done..])
            } else {
                rustix::net::recv(self.fd, &mut dst[done..], rustix::net::RecvFlags::DONTWAIT)
                    .map(|(n, _)| n)
            };
            match got {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    done += n;
                    self.left -= n;
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// One receive into `dst` (the payload's rest) and the bytes after it;
    /// returns the payload bytes received.
    fn recv_with_ahead(&mut self, dst: &mut [u8]) -> rustix::io::Result<usize> {
        use std::io::IoSliceMut;
        let want = dst.len();
        let mut iov = [
            IoSliceMut::new(dst),
            IoSliceMut::new(&mut self.ahead[..self.ahead_want]),
        ];
        let mut control = rustix::net::RecvAncillaryBuffer::default();
        let n = rustix::net::recvmsg(
            self.fd,
            &mut iov,
            &mut control,
            rustix::net::RecvFlags::DONTWAIT,
        )?
        .bytes;
        self.ahead_got = n.saturating_sub(want);
        Ok(n.min(want))
    }
}

/// A block device served over NBD.
///
/// The server validates every request before calling an operation, so
/// implementations may rely on these preconditions:
/// - `offset + len <= info().size` (as captured when the client connected),
///   and both are multiples of `min_block`;
/// - `len > 0` (zero-length requests are answered by the server itself);
/// - `read`/`write` lengths are `<= max_block`;
/// - a write-like operation is never called on a `read_only` export, and an
///   optional operation is only called if its `can_*` flag is set.
///
/// Operations of one connection run concurrently (up to the server's
/// in-flight limit) and may complete in any order. Implementations MUST:
/// - `read`: return exactly `len` bytes (otherwise the server replies `EIO`);
/// - `write`/`trim`/`write_zeroes` with `fua`: persist the effect before
///   the returned future completes;
/// - `flush`: persist every write that completed before `flush` was called;
/// - `block_status`: return at least one extent, each with nonzero length,
///   describing consecutive bytes starting at `offset` (the server drops
///   extents past `len` and clips the last one; an empty list becomes `EIO`);
/// - with `can_multi_conn`, make flush/FUA effects visible to every connection.
pub trait Export: Send + Sync + 'static {
    /// Current description. Called once per `NBD_OPT_INFO`/`GO`/`EXPORT_NAME`;
    /// the values in force for a connection are those seen when it entered
    /// transmission.
    fn info(&self) -> ExportInfo;

    /// `NBD_CMD_READ`: return exactly `len` bytes from `offset`.
    fn read(&self, ctx: RequestCtx, offset: u64, len: u32) -> BoxFuture<'_, NbdResult<Bytes>>;

    /// `NBD_CMD_WRITE` of `data` (length ≥ 1) at `offset`.
    fn write(&self, ctx: RequestCtx, offset: u64, data: Bytes, fua: bool) -> OpFuture<'_>;

    /// Optional zero-copy `NBD_CMD_WRITE`: called, before the payload is
    /// read, for a write (with `write`'s preconditions) whose whole payload
    /// is already queued on a unix socket.
    ///
    /// * `None` (the default): declined; the export MUST NOT have received
    ///   anything from `src`. The server reads the payload and calls
    ///   [`Export::write`].
    /// * `Some(result)`: the export took the write. It received what it
    ///   needed from `src` before returning (the server discards any rest:
    ///   an export that stops after an error reports it in `result`), and
    ///   `result` resolves with `write`'s contract (FUA included).
    fn write_direct(
        self: Arc<Self>,
        ctx: RequestCtx,
        offset: u64,
        len: u32,
        fua: bool,
        src: &mut DirectSource<'_>,
    ) -> Option<OpFuture<'static>> {
        let _ = (ctx, offset, len, fua, src);
        None
    }

    /// `NBD_CMD_FLUSH`. Only called if `can_flush`.
    fn flush(&self, ctx: RequestCtx) -> OpFuture<'_> {
        let _ = ctx;
        Box::pin(async { Err(NbdError::inval("flush not supported")) })
    }

    /// `NBD_CMD_TRIM` (a hint; MAY do nothing). Only called if `can_trim`.
    fn trim(&self, ctx: RequestCtx, offset: u64, len: u32, fua: bool) -> OpFuture<'_> {
        let _ = (ctx, offset, len, fua);
        Box::pin(async { Ok(()) })
    }

    /// `NBD_CMD_WRITE_ZEROES`: the range MUST read back as zeroes afterwards.
    /// With `flags.fast_zero` it MAY fail with `ENOTSUP` instead (and then
    /// SHOULD NOT change the contents). Only called if `can_zero`.
    fn write_zeroes(
        &self,
        ctx: RequestCtx,
        offset: u64,
        len: u32,
        flags: WriteZeroesFlags,
    ) -> OpFuture<'_> {
        let _ = (ctx, offset, len, flags);
        Box::pin(async { Err(NbdError::inval("write zeroes not supported")) })
    }

    /// `NBD_CMD_CACHE` (prefetch hint). Only called if `can_cache`.
    fn cache(&self, ctx: RequestCtx, offset: u64, len: u32) -> OpFuture<'_> {
        let _ = (ctx, offset, len);
        Box::pin(async { Ok(()) })
    }

    /// `NBD_CMD_BLOCK_STATUS` for `base:allocation`. The default reports the
    /// whole range as allocated data (flags 0), which is always safe.
    fn block_status(
        &self,
        ctx: RequestCtx,
        offset: u64,
        len: u32,
    ) -> BoxFuture<'_, NbdResult<Vec<Extent>>> {
        let _ = (ctx, offset);
        Box::pin(async move { Ok(vec![Extent { len, flags: 0 }]) })
    }

    /// A connection's reply writer is about to send replies to requests
    /// whose operations returned before this call: none of them has
    /// reached the client yet. Called before every batch of replies, from
    /// the writer's task; MUST NOT block for long. An export may use it to
    /// tell which requests a client could have sent knowing of which
    /// completions: a request read before this call was sent before its
    /// client saw these replies.
    fn replies_sending(&self) {}

    /// A connection selected this export and entered transmission.
    fn on_connect(&self, conn_id: u64) {
        let _ = conn_id;
    }

    /// The connection ended. Called after all of its operations completed;
    /// no operation with this `conn_id` starts afterwards.
    fn on_disconnect(&self, conn_id: u64) {
        let _ = conn_id;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_rules() {
        let ok = ExportInfo::new("x", 1 << 20);
        assert!(ok.validate().is_ok());
        let mut b = ok.clone();
        b.min_block = 3;
        assert!(b.validate().is_err());
        let mut b = ok.clone();
        b.min_block = 1 << 17;
        assert!(b.validate().is_err());
        let mut b = ok.clone();
        b.pref_block = 256;
        assert!(b.validate().is_err());
        let mut b = ok.clone();
        b.min_block = 8192;
        b.pref_block = 4096;
        assert!(b.validate().is_err());
        let mut b = ok.clone();
        b.max_block = 1024;
        assert!(b.validate().is_err());
        let mut b = ok.clone();
        b.max_block = MAX_BLOCK_LIMIT + 1;
        assert!(b.validate().is_err());
        let mut b = ok.clone();
        b.can_fast_zero = true;
        assert!(b.validate().is_err());
        let mut b = ok;
        b.name = "a\0".into();
        assert!(b.validate().is_err());
    }

    #[test]
    fn transmission_flags_bits() {
        let e = ExportInfo::new("x", 1);
        assert_eq!(e.transmission_flags(false), 0x0001);
        assert_eq!(e.transmission_flags(true), 0x0081);
        let all = e.clone().with_all_features();
        // HAS_FLAGS|FLUSH|FUA|TRIM|ZEROES|MULTI_CONN|CACHE|FAST_ZERO
        assert_eq!(all.transmission_flags(false), 0x0d6d);
        let mut ro = e;
        ro.read_only = true;
        assert_eq!(ro.transmission_flags(false), 0x0003);
    }
}
