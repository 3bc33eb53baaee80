//! Sans-IO wire codec for the NBD protocol (fixed newstyle handshake,
//! simple and structured replies), following `doc/proto.md` of
//! NetworkBlockDevice/nbd.
//!
//! Everything here is pure: functions take byte slices and return values or
//! [`CodecError`]s. No function in this module panics on any input received
//! from a peer; assertions only guard values *we* are about to encode (for
//! example a string longer than the spec's 4096-byte limit).
//!
//! All integers are big-endian ("network byte order").

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::CodecError;

/// `NBDMAGIC` / `INIT_PASSWD`, first 8 bytes sent by every server.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: second server magic in newstyle, and the magic of every option request.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every option reply (fixed newstyle).
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// `NBD_REQUEST_MAGIC`.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// `NBD_SIMPLE_REPLY_MAGIC`.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// `NBD_STRUCTURED_REPLY_MAGIC`.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
/// IANA port for NBD.
pub const DEFAULT_PORT: u16 = 10809;
/// Strings (export names, messages, queries) MUST be no longer than this.
pub const MAX_STRING_LEN: usize = 4096;
/// The only metadata context defined by the spec.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// Largest payload that, per spec, SHOULD NOT be treated as a denial of service (2^25).
pub const SAFE_PAYLOAD_LEN: u32 = 1 << 25;

/// Handshake flags (16 bits, sent by the server after the magics).
pub mod handshake_flags {
    /// `NBD_FLAG_FIXED_NEWSTYLE`.
    pub const FIXED_NEWSTYLE: u16 = 1 << 0;
    /// `NBD_FLAG_NO_ZEROES`.
    pub const NO_ZEROES: u16 = 1 << 1;
}

/// Client flags (32 bits, sent by the client after the handshake flags).
pub mod client_flags {
    /// `NBD_FLAG_C_FIXED_NEWSTYLE`.
    pub const FIXED_NEWSTYLE: u32 = 1 << 0;
    /// `NBD_FLAG_C_NO_ZEROES`.
    pub const NO_ZEROES: u32 = 1 << 1;
    /// Every flag defined by the spec; a server MUST drop clients setting others.
    pub const KNOWN: u32 = FIXED_NEWSTYLE | NO_ZEROES;
}

/// Transmission flags (16 bits, per export).
pub mod tx_flags {
    /// `NBD_FLAG_HAS_FLAGS`: MUST always be set.
    pub const HAS_FLAGS: u16 = 1 << 0;
    /// `NBD_FLAG_READ_ONLY`.
    pub const READ_ONLY: u16 = 1 << 1;
    /// `NBD_FLAG_SEND_FLUSH`.
    pub const SEND_FLUSH: u16 = 1 << 2;
    /// `NBD_FLAG_SEND_FUA`.
    pub const SEND_FUA: u16 = 1 << 3;
    /// `NBD_FLAG_ROTATIONAL`.
    pub const ROTATIONAL: u16 = 1 << 4;
    /// `NBD_FLAG_SEND_TRIM`.
    pub const SEND_TRIM: u16 = 1 << 5;
    /// `NBD_FLAG_SEND_WRITE_ZEROES`.
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    /// `NBD_FLAG_SEND_DF` (only with structured replies).
    pub const SEND_DF: u16 = 1 << 7;
    /// `NBD_FLAG_CAN_MULTI_CONN`.
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
    /// `NBD_FLAG_SEND_RESIZE` (experimental; never set by us).
    pub const SEND_RESIZE: u16 = 1 << 9;
    /// `NBD_FLAG_SEND_CACHE`.
    pub const SEND_CACHE: u16 = 1 << 10;
    /// `NBD_FLAG_SEND_FAST_ZERO`.
    pub const SEND_FAST_ZERO: u16 = 1 << 11;
}

/// Option codes (`NBD_OPT_*`).
pub mod opt {
    /// `NBD_OPT_EXPORT_NAME`.
    pub const EXPORT_NAME: u32 = 1;
    /// `NBD_OPT_ABORT`.
    pub const ABORT: u32 = 2;
    /// `NBD_OPT_LIST`.
    pub const LIST: u32 = 3;
    /// `NBD_OPT_PEEK_EXPORT` (withdrawn).
    pub const PEEK_EXPORT: u32 = 4;
    /// `NBD_OPT_STARTTLS`.
    pub const STARTTLS: u32 = 5;
    /// `NBD_OPT_INFO`.
    pub const INFO: u32 = 6;
    /// `NBD_OPT_GO`.
    pub const GO: u32 = 7;
    /// `NBD_OPT_STRUCTURED_REPLY`.
    pub const STRUCTURED_REPLY: u32 = 8;
    /// `NBD_OPT_LIST_META_CONTEXT`.
    pub const LIST_META_CONTEXT: u32 = 9;
    /// `NBD_OPT_SET_META_CONTEXT`.
    pub const SET_META_CONTEXT: u32 = 10;
    /// `NBD_OPT_EXTENDED_HEADERS` (experimental; unsupported here).
    pub const EXTENDED_HEADERS: u32 = 11;
}

/// Option reply types (`NBD_REP_*`).
pub mod rep {
    /// `NBD_REP_ACK`.
    pub const ACK: u32 = 1;
    /// `NBD_REP_SERVER`.
    pub const SERVER: u32 = 2;
    /// `NBD_REP_INFO`.
    pub const INFO: u32 = 3;
    /// `NBD_REP_META_CONTEXT`.
    pub const META_CONTEXT: u32 = 4;
    /// Bit 31: set on every error reply.
    pub const ERR_BIT: u32 = 1 << 31;
    /// `NBD_REP_ERR_UNSUP`.
    pub const ERR_UNSUP: u32 = ERR_BIT + 1;
    /// `NBD_REP_ERR_POLICY`.
    pub const ERR_POLICY: u32 = ERR_BIT + 2;
    /// `NBD_REP_ERR_INVALID`.
    pub const ERR_INVALID: u32 = ERR_BIT + 3;
    /// `NBD_REP_ERR_PLATFORM`.
    pub const ERR_PLATFORM: u32 = ERR_BIT + 4;
    /// `NBD_REP_ERR_TLS_REQD`.
    pub const ERR_TLS_REQD: u32 = ERR_BIT + 5;
    /// `NBD_REP_ERR_UNKNOWN`.
    pub const ERR_UNKNOWN: u32 = ERR_BIT + 6;
    /// `NBD_REP_ERR_SHUTDOWN`.
    pub const ERR_SHUTDOWN: u32 = ERR_BIT + 7;
    /// `NBD_REP_ERR_BLOCK_SIZE_REQD`.
    pub const ERR_BLOCK_SIZE_REQD: u32 = ERR_BIT + 8;
    /// `NBD_REP_ERR_TOO_BIG`.
    pub const ERR_TOO_BIG: u32 = ERR_BIT + 9;

    /// True for error replies.
    pub fn is_error(t: u32) -> bool {
        t & ERR_BIT != 0
    }
}

/// Information types inside `NBD_REP_INFO` (`NBD_INFO_*`).
pub mod info {
    /// `NBD_INFO_EXPORT`.
    pub const EXPORT: u16 = 0;
    /// `NBD_INFO_NAME`.
    pub const NAME: u16 = 1;
    /// `NBD_INFO_DESCRIPTION`.
    pub const DESCRIPTION: u16 = 2;
    /// `NBD_INFO_BLOCK_SIZE`.
    pub const BLOCK_SIZE: u16 = 3;
}

/// Command flags (`NBD_CMD_FLAG_*`).
pub mod cmd_flags {
    /// `NBD_CMD_FLAG_FUA`.
    pub const FUA: u16 = 1 << 0;
    /// `NBD_CMD_FLAG_NO_HOLE`.
    pub const NO_HOLE: u16 = 1 << 1;
    /// `NBD_CMD_FLAG_DF`.
    pub const DF: u16 = 1 << 2;
    /// `NBD_CMD_FLAG_REQ_ONE`.
    pub const REQ_ONE: u16 = 1 << 3;
    /// `NBD_CMD_FLAG_FAST_ZERO`.
    pub const FAST_ZERO: u16 = 1 << 4;
}

/// Structured reply flags.
pub mod reply_flags {
    /// `NBD_REPLY_FLAG_DONE`.
    pub const DONE: u16 = 1 << 0;
}

/// Structured reply chunk types (`NBD_REPLY_TYPE_*`).
pub mod chunk_type {
    /// `NBD_REPLY_TYPE_NONE`.
    pub const NONE: u16 = 0;
    /// `NBD_REPLY_TYPE_OFFSET_DATA`.
    pub const OFFSET_DATA: u16 = 1;
    /// `NBD_REPLY_TYPE_OFFSET_HOLE`.
    pub const OFFSET_HOLE: u16 = 2;
    /// `NBD_REPLY_TYPE_BLOCK_STATUS`.
    pub const BLOCK_STATUS: u16 = 5;
    /// Bit 15: set on every error chunk type.
    pub const ERR_BIT: u16 = 1 << 15;
    /// `NBD_REPLY_TYPE_ERROR`.
    pub const ERROR: u16 = ERR_BIT + 1;
    /// `NBD_REPLY_TYPE_ERROR_OFFSET`.
    pub const ERROR_OFFSET: u16 = ERR_BIT + 2;
}

/// `base:allocation` status flags (`NBD_STATE_*`).
pub mod state {
    /// `NBD_STATE_HOLE`: not allocated.
    pub const HOLE: u32 = 1 << 0;
    /// `NBD_STATE_ZERO`: reads as zeroes.
    pub const ZERO: u32 = 1 << 1;
}

/// Transmission-phase command types (`NBD_CMD_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    /// `NBD_CMD_READ` (0).
    Read,
    /// `NBD_CMD_WRITE` (1).
    Write,
    /// `NBD_CMD_DISC` (2).
    Disc,
    /// `NBD_CMD_FLUSH` (3).
    Flush,
    /// `NBD_CMD_TRIM` (4).
    Trim,
    /// `NBD_CMD_CACHE` (5).
    Cache,
    /// `NBD_CMD_WRITE_ZEROES` (6).
    WriteZeroes,
    /// `NBD_CMD_BLOCK_STATUS` (7).
    BlockStatus,
    /// Any other value; servers reply `NBD_EINVAL`.
    Other(u16),
}

impl From<u16> for Command {
    fn from(v: u16) -> Self {
        match v {
            0 => Command::Read,
            1 => Command::Write,
            2 => Command::Disc,
            3 => Command::Flush,
            4 => Command::Trim,
            5 => Command::Cache,
            6 => Command::WriteZeroes,
            7 => Command::BlockStatus,
            n => Command::Other(n),
        }
    }
}

impl From<Command> for u16 {
    fn from(c: Command) -> u16 {
        match c {
            Command::Read => 0,
            Command::Write => 1,
            Command::Disc => 2,
            Command::Flush => 3,
            Command::Trim => 4,
            Command::Cache => 5,
            Command::WriteZeroes => 6,
            Command::BlockStatus => 7,
            Command::Other(n) => n,
        }
    }
}

/// One `base:allocation` (or other context) block status descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Extent {
    /// Length in bytes; MUST be nonzero on the wire.
    pub len: u32,
    /// Status flags, e.g. [`state::HOLE`] | [`state::ZERO`].
    pub flags: u32,
}

// ---------------------------------------------------------------------------
// Reading helper
// ---------------------------------------------------------------------------

/// Bounds-checked big-endian reader over a byte slice.
struct Rd<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Rd<'a> {
    fn new(buf: &'a [u8], what: &'static str) -> Self {
        Rd { buf, what }
    }
    fn remaining(&self) -> usize {
        self.buf.len()
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        if self.buf.len() < n {
            return Err(CodecError::Truncated {
                what: self.what,
                need: n,
                have: self.buf.len(),
            });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    fn u16(&mut self) -> Result<u16, CodecError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, CodecError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, CodecError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
    fn string(&mut self, n: usize) -> Result<String, CodecError> {
        if n > MAX_STRING_LEN {
            return Err(CodecError::BadString {
                what: self.what,
                reason: "longer than 4096 bytes",
            });
        }
        let b = self.take(n)?;
        decode_string(b, self.what)
    }
    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }
    fn finish(&self) -> Result<(), CodecError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(CodecError::Malformed {
                what: self.what,
                reason: format!("{} unexpected trailing bytes", self.buf.len()),
            })
        }
    }
}

fn decode_string(b: &[u8], what: &'static str) -> Result<String, CodecError> {
    if b.len() > MAX_STRING_LEN {
        return Err(CodecError::BadString {
            what,
            reason: "longer than 4096 bytes",
        });
    }
    if b.contains(&0) {
        return Err(CodecError::BadString {
            what,
            reason: "contains NUL",
        });
    }
    String::from_utf8(b.to_vec()).map_err(|_| CodecError::BadString {
        what,
        reason: "not UTF-8",
    })
}

/// Asserts the encode-side string contract: MUST be at most 4096 bytes and
/// contain no NUL (spec "Conventions").
fn assert_wire_string(s: &str) {
    assert!(
        s.len() <= MAX_STRING_LEN,
        "NBD strings MUST be at most {MAX_STRING_LEN} bytes (got {})",
        s.len()
    );
    assert!(!s.contains('\0'), "NBD strings MUST NOT contain NUL");
}

fn u32_len(n: usize) -> u32 {
    u32::try_from(n).expect("length MUST fit in 32 bits")
}

/// Truncate `s` to at most [`MAX_STRING_LEN`] bytes on a char boundary and
/// strip NULs, so that it may be sent as an NBD string.
pub fn sanitize_message(s: &str) -> String {
    let mut out: String = s.chars().filter(|&c| c != '\0').collect();
    if out.len() > MAX_STRING_LEN {
        let mut cut = MAX_STRING_LEN;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
    }
    out
}

// ---------------------------------------------------------------------------
// Handshake: greeting and client flags
// ---------------------------------------------------------------------------

/// Length of the newstyle server greeting: NBDMAGIC, IHAVEOPT, 16-bit flags.
pub const GREETING_LEN: usize = 18;

/// Encode the newstyle greeting `S: NBDMAGIC, IHAVEOPT, handshake flags`.
pub fn encode_server_greeting(handshake_flags: u16) -> [u8; GREETING_LEN] {
    let mut b = [0u8; GREETING_LEN];
    b[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    b[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    b[16..18].copy_from_slice(&handshake_flags.to_be_bytes());
    b
}

/// Decode the newstyle greeting; returns the handshake flags.
/// Oldstyle servers (second magic `cliserv_magic`) are rejected as `BadMagic`.
pub fn decode_server_greeting(buf: &[u8]) -> Result<u16, CodecError> {
    let mut r = Rd::new(buf, "server greeting");
    let m1 = r.u64()?;
    if m1 != NBDMAGIC {
        return Err(CodecError::BadMagic {
            what: "server greeting",
            expected: NBDMAGIC,
            got: m1,
        });
    }
    let m2 = r.u64()?;
    if m2 != IHAVEOPT {
        return Err(CodecError::BadMagic {
            what: "server greeting (newstyle)",
            expected: IHAVEOPT,
            got: m2,
        });
    }
    r.u16()
}

/// Encode the 32-bit client flags.
pub fn encode_client_flags(flags: u32) -> [u8; 4] {
    flags.to_be_bytes()
}

/// Decode the 32-bit client flags (unknown bits are returned as-is; the
/// caller MUST drop the connection if any are outside [`client_flags::KNOWN`]).
pub fn decode_client_flags(buf: &[u8]) -> Result<u32, CodecError> {
    Rd::new(buf, "client flags").u32()
}

// ---------------------------------------------------------------------------
// Option requests
// ---------------------------------------------------------------------------

/// The fixed 16-byte header of an option request: IHAVEOPT, option, length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    /// The `NBD_OPT_*` code.
    pub option: u32,
    /// Length of the option data that follows.
    pub length: u32,
}

impl OptionHeader {
    /// Encoded size.
    pub const LEN: usize = 16;

    /// Encode (with the IHAVEOPT magic).
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
        b[8..12].copy_from_slice(&self.option.to_be_bytes());
        b[12..16].copy_from_slice(&self.length.to_be_bytes());
        b
    }

    /// Decode and check the magic.
    pub fn decode(buf: &[u8]) -> Result<Self, CodecError> {
        let mut r = Rd::new(buf, "option header");
        let magic = r.u64()?;
        if magic != IHAVEOPT {
            return Err(CodecError::BadMagic {
                what: "option header",
                expected: IHAVEOPT,
                got: magic,
            });
        }
        Ok(OptionHeader {
            option: r.u32()?,
            length: r.u32()?,
        })
    }
}

/// Encode a complete option request (header + data) for any option code.
pub fn encode_option(option: u32, data: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(OptionHeader::LEN + data.len());
    b.put_slice(
        &OptionHeader {
            option,
            length: u32_len(data.len()),
        }
        .encode(),
    );
    b.put_slice(data);
    b.freeze()
}

/// Data of `NBD_OPT_INFO` / `NBD_OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    /// Export name ("" = default export).
    pub name: String,
    /// Requested `NBD_INFO_*` items.
    pub requests: Vec<u16>,
}

impl InfoRequest {
    /// Encode the option data (not the header).
    pub fn encode_data(&self) -> Bytes {
        assert_wire_string(&self.name);
        let mut b = BytesMut::with_capacity(4 + self.name.len() + 2 + 2 * self.requests.len());
        b.put_u32(u32_len(self.name.len()));
        b.put_slice(self.name.as_bytes());
        b.put_u16(u16::try_from(self.requests.len()).expect("at most 65535 info requests"));
        for r in &self.requests {
            b.put_u16(*r);
        }
        b.freeze()
    }

    /// Decode the option data. The layout MUST be consumed exactly:
    /// `4 + name_len + 2 + 2 * n == data.len()`.
    pub fn decode_data(data: &[u8]) -> Result<Self, CodecError> {
        let what = "NBD_OPT_INFO/GO data";
        if data.len() < 6 {
            return Err(CodecError::Truncated {
                what,
                need: 6,
                have: data.len(),
            });
        }
        let mut r = Rd::new(data, what);
        let name_len = r.u32()? as usize;
        if name_len > data.len() - 6 {
            return Err(CodecError::Malformed {
                what,
                reason: format!(
                    "name length {name_len} exceeds option length {} - 6",
                    data.len()
                ),
            });
        }
        let name = r.string(name_len)?;
        let n = r.u16()? as usize;
        if r.remaining() != 2 * n {
            return Err(CodecError::Malformed {
                what,
                reason: format!(
                    "{n} information requests need {} bytes, {} present",
                    2 * n,
                    r.remaining()
                ),
            });
        }
        let mut requests = Vec::with_capacity(n);
        for _ in 0..n {
            requests.push(r.u16()?);
        }
        r.finish()?;
        Ok(InfoRequest { name, requests })
    }
}

/// Data of `NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextRequest {
    /// Export the contexts are for.
    pub export: String,
    /// Queries such as `base:allocation` or `base:`.
    pub queries: Vec<String>,
}

impl MetaContextRequest {
    /// Encode the option data.
    pub fn encode_data(&self) -> Bytes {
        assert_wire_string(&self.export);
        let mut b = BytesMut::new();
        b.put_u32(u32_len(self.export.len()));
        b.put_slice(self.export.as_bytes());
        b.put_u32(u32_len(self.queries.len()));
        for q in &self.queries {
            assert_wire_string(q);
            b.put_u32(u32_len(q.len()));
            b.put_slice(q.as_bytes());
        }
        b.freeze()
    }

    /// Decode the option data; every length MUST stay inside the option and
    /// the data MUST be consumed exactly (else the server replies ERR_INVALID).
    pub fn decode_data(data: &[u8]) -> Result<Self, CodecError> {
        let what = "meta context option data";
        let mut r = Rd::new(data, what);
        let name_len = r.u32()? as usize;
        if name_len > r.remaining() {
            return Err(CodecError::Malformed {
                what,
                reason: format!("export name length {name_len} exceeds option data"),
            });
        }
        let export = r.string(name_len)?;
        let n = r.u32()? as usize;
        // Every query needs at least 4 bytes; reject absurd counts before allocating.
        if n > r.remaining() / 4 {
            return Err(CodecError::Malformed {
                what,
                reason: format!("{n} queries cannot fit in {} bytes", r.remaining()),
            });
        }
        let mut queries = Vec::with_capacity(n);
        for _ in 0..n {
            let ql = r.u32()? as usize;
            if ql > r.remaining() {
                return Err(CodecError::Malformed {
                    what,
                    reason: format!("query length {ql} exceeds option data"),
                });
            }
            queries.push(r.string(ql)?);
        }
        r.finish()?;
        Ok(MetaContextRequest { export, queries })
    }
}

/// A parsed option request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientOption {
    /// `NBD_OPT_EXPORT_NAME`: enter transmission on this export (no error possible).
    ExportName(String),
    /// `NBD_OPT_ABORT` (any data is ignored, per spec).
    Abort,
    /// `NBD_OPT_LIST`.
    List,
    /// `NBD_OPT_STARTTLS`.
    StartTls,
    /// `NBD_OPT_INFO`.
    Info(InfoRequest),
    /// `NBD_OPT_GO`.
    Go(InfoRequest),
    /// `NBD_OPT_STRUCTURED_REPLY`.
    StructuredReply,
    /// `NBD_OPT_LIST_META_CONTEXT`.
    ListMetaContext(MetaContextRequest),
    /// `NBD_OPT_SET_META_CONTEXT`.
    SetMetaContext(MetaContextRequest),
    /// Any option this implementation does not know (the data is dropped).
    Unknown(u32),
}

impl ClientOption {
    /// The `NBD_OPT_*` code.
    pub fn code(&self) -> u32 {
        match self {
            ClientOption::ExportName(_) => opt::EXPORT_NAME,
            ClientOption::Abort => opt::ABORT,
            ClientOption::List => opt::LIST,
            ClientOption::StartTls => opt::STARTTLS,
            ClientOption::Info(_) => opt::INFO,
            ClientOption::Go(_) => opt::GO,
            ClientOption::StructuredReply => opt::STRUCTURED_REPLY,
            ClientOption::ListMetaContext(_) => opt::LIST_META_CONTEXT,
            ClientOption::SetMetaContext(_) => opt::SET_META_CONTEXT,
            ClientOption::Unknown(c) => *c,
        }
    }

    /// True if this implementation understands option `code`.
    pub fn is_known(code: u32) -> bool {
        matches!(
            code,
            opt::EXPORT_NAME
                | opt::ABORT
                | opt::LIST
                | opt::STARTTLS
                | opt::INFO
                | opt::GO
                | opt::STRUCTURED_REPLY
                | opt::LIST_META_CONTEXT
                | opt::SET_META_CONTEXT
        )
    }

    /// Parse option `code` with its `data`. Unknown codes parse successfully
    /// as [`ClientOption::Unknown`] so that the server can reply ERR_UNSUP
    /// and keep going; syntactically invalid known options yield an error
    /// (the server replies ERR_INVALID).
    pub fn parse(code: u32, data: &[u8]) -> Result<Self, CodecError> {
        let no_data = |what: &'static str| {
            if data.is_empty() {
                Ok(())
            } else {
                Err(CodecError::Malformed {
                    what,
                    reason: format!("option MUST NOT carry data, got {} bytes", data.len()),
                })
            }
        };
        Ok(match code {
            opt::EXPORT_NAME => ClientOption::ExportName(decode_string(data, "export name")?),
            opt::ABORT => ClientOption::Abort,
            opt::LIST => {
                no_data("NBD_OPT_LIST")?;
                ClientOption::List
            }
            opt::STARTTLS => {
                no_data("NBD_OPT_STARTTLS")?;
                ClientOption::StartTls
            }
            opt::INFO => ClientOption::Info(InfoRequest::decode_data(data)?),
            opt::GO => ClientOption::Go(InfoRequest::decode_data(data)?),
            opt::STRUCTURED_REPLY => {
                no_data("NBD_OPT_STRUCTURED_REPLY")?;
                ClientOption::StructuredReply
            }
            opt::LIST_META_CONTEXT => {
                ClientOption::ListMetaContext(MetaContextRequest::decode_data(data)?)
            }
            opt::SET_META_CONTEXT => {
                ClientOption::SetMetaContext(MetaContextRequest::decode_data(data)?)
            }
            other => ClientOption::Unknown(other),
        })
    }

    /// Encode the full option request (header + data).
    pub fn encode(&self) -> Bytes {
        let data: Bytes = match self {
            ClientOption::ExportName(n) => {
                assert_wire_string(n);
                Bytes::copy_from_slice(n.as_bytes())
            }
            ClientOption::Info(r) | ClientOption::Go(r) => r.encode_data(),
            ClientOption::ListMetaContext(r) | ClientOption::SetMetaContext(r) => r.encode_data(),
            _ => Bytes::new(),
        };
        encode_option(self.code(), &data)
    }
}

// ---------------------------------------------------------------------------
// Option replies
// ---------------------------------------------------------------------------

/// The fixed 20-byte header of an option reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReplyHeader {
    /// The option being replied to.
    pub option: u32,
    /// `NBD_REP_*`.
    pub reply_type: u32,
    /// Length of the reply data.
    pub length: u32,
}

impl OptionReplyHeader {
    /// Encoded size.
    pub const LEN: usize = 20;

    /// Encode (with magic).
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
        b[8..12].copy_from_slice(&self.option.to_be_bytes());
        b[12..16].copy_from_slice(&self.reply_type.to_be_bytes());
        b[16..20].copy_from_slice(&self.length.to_be_bytes());
        b
    }

    /// Decode and check the magic.
    pub fn decode(buf: &[u8]) -> Result<Self, CodecError> {
        let mut r = Rd::new(buf, "option reply header");
        let magic = r.u64()?;
        if magic != OPTION_REPLY_MAGIC {
            return Err(CodecError::BadMagic {
                what: "option reply header",
                expected: OPTION_REPLY_MAGIC,
                got: magic,
            });
        }
        Ok(OptionReplyHeader {
            option: r.u32()?,
            reply_type: r.u32()?,
            length: r.u32()?,
        })
    }
}

/// Encode a complete option reply.
pub fn encode_option_reply(option: u32, reply_type: u32, data: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(OptionReplyHeader::LEN + data.len());
    b.put_slice(
        &OptionReplyHeader {
            option,
            reply_type,
            length: u32_len(data.len()),
        }
        .encode(),
    );
    b.put_slice(data);
    b.freeze()
}

/// Payload of `NBD_REP_SERVER` (one export in an `NBD_OPT_LIST` answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerEntry {
    /// Export name.
    pub name: String,
    /// Free-form description ("" if none).
    pub description: String,
}

impl ServerEntry {
    /// Encode the reply data.
    pub fn encode_data(&self) -> Bytes {
        assert_wire_string(&self.name);
        assert_wire_string(&self.description);
        let mut b = BytesMut::with_capacity(4 + self.name.len() + self.description.len());
        b.put_u32(u32_len(self.name.len()));
        b.put_slice(self.name.as_bytes());
        b.put_slice(self.description.as_bytes());
        b.freeze()
    }

    /// Decode the reply data.
    pub fn decode_data(data: &[u8]) -> Result<Self, CodecError> {
        let what = "NBD_REP_SERVER";
        let mut r = Rd::new(data, what);
        let n = r.u32()? as usize;
        if n > r.remaining() {
            return Err(CodecError::Malformed {
                what,
                reason: format!("name length {n} exceeds reply length"),
            });
        }
        let name = r.string(n)?;
        let description = decode_string(r.rest(), what)?;
        Ok(ServerEntry { name, description })
    }
}

/// Payload of `NBD_REP_INFO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InfoReply {
    /// `NBD_INFO_EXPORT`: size and transmission flags.
    Export {
        /// Export size in bytes.
        size: u64,
        /// Transmission flags.
        flags: u16,
    },
    /// `NBD_INFO_NAME`: canonical export name.
    Name(String),
    /// `NBD_INFO_DESCRIPTION`.
    Description(String),
    /// `NBD_INFO_BLOCK_SIZE`.
    BlockSize {
        /// Minimum block size.
        min: u32,
        /// Preferred block size.
        preferred: u32,
        /// Maximum payload size.
        max: u32,
    },
    /// An information type we do not understand (clients MUST ignore it).
    Unknown {
        /// The `NBD_INFO_*` value.
        kind: u16,
        /// Raw payload after the type.
        data: Bytes,
    },
}

impl InfoReply {
    /// Encode the reply data (including the 16-bit information type).
    pub fn encode_data(&self) -> Bytes {
        let mut b = BytesMut::new();
        match self {
            InfoReply::Export { size, flags } => {
                b.put_u16(info::EXPORT);
                b.put_u64(*size);
                b.put_u16(*flags);
            }
            InfoReply::Name(n) => {
                assert_wire_string(n);
                b.put_u16(info::NAME);
                b.put_slice(n.as_bytes());
            }
            InfoReply::Description(d) => {
                assert_wire_string(d);
                b.put_u16(info::DESCRIPTION);
                b.put_slice(d.as_bytes());
            }
            InfoReply::BlockSize {
                min,
                preferred,
                max,
            } => {
                b.put_u16(info::BLOCK_SIZE);
                b.put_u32(*min);
                b.put_u32(*preferred);
                b.put_u32(*max);
            }
            InfoReply::Unknown { kind, data } => {
                b.put_u16(*kind);
                b.put_slice(data);
            }
        }
        b.freeze()
    }

    /// Decode the reply data; fixed-size types MUST have their exact length.
    pub fn decode_data(data: &[u8]) -> Result<Self, CodecError> {
        let what = "NBD_REP_INFO";
        let mut r = Rd::new(data, what);
        let kind = r.u16()?;
        let exact = |r: &Rd<'_>, n: usize| {
            if r.remaining() == n {
                Ok(())
            } else {
                Err(CodecError::Malformed {
                    what,
                    reason: format!(
                        "info type {kind} needs length {}, got {}",
                        n + 2,
                        r.remaining() + 2
                    ),
                })
            }
        };
        let v = match kind {
            info::EXPORT => {
                exact(&r, 10)?;
                InfoReply::Export {
                    size: r.u64()?,
                    flags: r.u16()?,
                }
            }
            info::NAME => InfoReply::Name(decode_string(r.rest(), what)?),
            info::DESCRIPTION => InfoReply::Description(decode_string(r.rest(), what)?),
            info::BLOCK_SIZE => {
                exact(&r, 12)?;
                InfoReply::BlockSize {
                    min: r.u32()?,
                    preferred: r.u32()?,
                    max: r.u32()?,
                }
            }
            k => InfoReply::Unknown {
                kind: k,
                data: Bytes::copy_from_slice(r.rest()),
            },
        };
        Ok(v)
    }
}

/// Payload of `NBD_REP_META_CONTEXT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextEntry {
    /// Context id (SHOULD be 0 in LIST replies).
    pub id: u32,
    /// Context name, e.g. `base:allocation`.
    pub name: String,
}

impl MetaContextEntry {
    /// Encode the reply data.
    pub fn encode_data(&self) -> Bytes {
        assert_wire_string(&self.name);
        let mut b = BytesMut::with_capacity(4 + self.name.len());
        b.put_u32(self.id);
        b.put_slice(self.name.as_bytes());
        b.freeze()
    }

    /// Decode the reply data.
    pub fn decode_data(data: &[u8]) -> Result<Self, CodecError> {
        let mut r = Rd::new(data, "NBD_REP_META_CONTEXT");
        let id = r.u32()?;
        let name = decode_string(r.rest(), "NBD_REP_META_CONTEXT")?;
        Ok(MetaContextEntry { id, name })
    }
}

/// Length of the `NBD_OPT_EXPORT_NAME` reply without / with the 124 zero bytes.
pub const EXPORT_NAME_REPLY_LEN: usize = 10;
/// The reserved zero padding after an `NBD_OPT_EXPORT_NAME` reply.
pub const EXPORT_NAME_ZEROES: usize = 124;

/// Encode the reply to `NBD_OPT_EXPORT_NAME`: size, flags, and 124 zeroes
/// unless `NO_ZEROES` was negotiated by both sides.
pub fn encode_export_name_reply(size: u64, flags: u16, no_zeroes: bool) -> Bytes {
    let mut b = BytesMut::with_capacity(EXPORT_NAME_REPLY_LEN + EXPORT_NAME_ZEROES);
    b.put_u64(size);
    b.put_u16(flags);
    if !no_zeroes {
        b.put_bytes(0, EXPORT_NAME_ZEROES);
    }
    b.freeze()
}

/// Decode the first 10 bytes of an `NBD_OPT_EXPORT_NAME` reply: (size, flags).
pub fn decode_export_name_reply(buf: &[u8]) -> Result<(u64, u16), CodecError> {
    let mut r = Rd::new(buf, "export name reply");
    Ok((r.u64()?, r.u16()?))
}

// ---------------------------------------------------------------------------
// Transmission: requests
// ---------------------------------------------------------------------------

/// The 28-byte request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    /// `NBD_CMD_FLAG_*`.
    pub flags: u16,
    /// Command type.
    pub command: Command,
    /// Opaque cookie echoed in the reply ("handle").
    pub handle: u64,
    /// Byte offset.
    pub offset: u64,
    /// Byte length (also the payload length for WRITE).
    pub length: u32,
}

impl RequestHeader {
    /// Encoded size.
    pub const LEN: usize = 28;

    /// Encode (with magic).
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&u16::from(self.command).to_be_bytes());
        b[8..16].copy_from_slice(&self.handle.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b
    }

    /// Decode and check the magic.
    pub fn decode(buf: &[u8]) -> Result<Self, CodecError> {
        let mut r = Rd::new(buf, "request header");
        let magic = r.u32()?;
        if magic != REQUEST_MAGIC {
            return Err(CodecError::BadMagic {
                what: "request header",
                expected: REQUEST_MAGIC as u64,
                got: magic as u64,
            });
        }
        Ok(RequestHeader {
            flags: r.u16()?,
            command: Command::from(r.u16()?),
            handle: r.u64()?,
            offset: r.u64()?,
            length: r.u32()?,
        })
    }
}

// ---------------------------------------------------------------------------
// Transmission: replies
// ---------------------------------------------------------------------------

/// The 16-byte simple reply header (READ data, if any, follows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimpleReplyHeader {
    /// 0 or an error value.
    pub error: u32,
    /// Cookie of the request.
    pub handle: u64,
}

impl SimpleReplyHeader {
    /// Encoded size.
    pub const LEN: usize = 16;

    /// Encode (with magic).
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
        b[4..8].copy_from_slice(&self.error.to_be_bytes());
        b[8..16].copy_from_slice(&self.handle.to_be_bytes());
        b
    }

    /// Decode and check the magic.
    pub fn decode(buf: &[u8]) -> Result<Self, CodecError> {
        let mut r = Rd::new(buf, "simple reply");
        let magic = r.u32()?;
        if magic != SIMPLE_REPLY_MAGIC {
            return Err(CodecError::BadMagic {
                what: "simple reply",
                expected: SIMPLE_REPLY_MAGIC as u64,
                got: magic as u64,
            });
        }
        Ok(SimpleReplyHeader {
            error: r.u32()?,
            handle: r.u64()?,
        })
    }
}

/// The 20-byte structured reply chunk header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    /// `NBD_REPLY_FLAG_*`.
    pub flags: u16,
    /// `NBD_REPLY_TYPE_*`.
    pub kind: u16,
    /// Cookie of the request.
    pub handle: u64,
    /// Payload length.
    pub length: u32,
}

impl ChunkHeader {
    /// Encoded size.
    pub const LEN: usize = 20;

    /// Encode (with magic).
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.kind.to_be_bytes());
        b[8..16].copy_from_slice(&self.handle.to_be_bytes());
        b[16..20].copy_from_slice(&self.length.to_be_bytes());
        b
    }

    /// Decode and check the magic.
    pub fn decode(buf: &[u8]) -> Result<Self, CodecError> {
        let mut r = Rd::new(buf, "structured reply chunk");
        let magic = r.u32()?;
        if magic != STRUCTURED_REPLY_MAGIC {
            return Err(CodecError::BadMagic {
                what: "structured reply chunk",
                expected: STRUCTURED_REPLY_MAGIC as u64,
                got: magic as u64,
            });
        }
        Ok(ChunkHeader {
            flags: r.u16()?,
            kind: r.u16()?,
            handle: r.u64()?,
            length: r.u32()?,
        })
    }

    /// True if `NBD_REPLY_FLAG_DONE` is set.
    pub fn is_done(&self) -> bool {
        self.flags & reply_flags::DONE != 0
    }
}

/// Either kind of reply header, distinguished by the first 4 bytes (magic).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyHeader {
    /// Simple reply.
    Simple(SimpleReplyHeader),
    /// Structured reply chunk.
    Chunk(ChunkHeader),
}

impl ReplyHeader {
    /// Given the 4-byte magic, the total header length to read (16 or 20).
    pub fn header_len(magic: [u8; 4]) -> Result<usize, CodecError> {
        match u32::from_be_bytes(magic) {
            SIMPLE_REPLY_MAGIC => Ok(SimpleReplyHeader::LEN),
            STRUCTURED_REPLY_MAGIC => Ok(ChunkHeader::LEN),
            m => Err(CodecError::BadMagic {
                what: "reply",
                expected: SIMPLE_REPLY_MAGIC as u64,
                got: m as u64,
            }),
        }
    }

    /// Decode a full header (16 or 20 bytes, starting with the magic).
    pub fn decode(buf: &[u8]) -> Result<Self, CodecError> {
        if buf.len() < 4 {
            return Err(CodecError::Truncated {
                what: "reply",
                need: 4,
                have: buf.len(),
            });
        }
        match Self::header_len([buf[0], buf[1], buf[2], buf[3]])? {
            SimpleReplyHeader::LEN => Ok(ReplyHeader::Simple(SimpleReplyHeader::decode(buf)?)),
            _ => Ok(ReplyHeader::Chunk(ChunkHeader::decode(buf)?)),
        }
    }
}

/// A decoded structured reply chunk payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChunkPayload {
    /// `NBD_REPLY_TYPE_NONE` (MUST carry the DONE flag).
    None,
    /// `NBD_REPLY_TYPE_OFFSET_DATA`.
    OffsetData {
        /// Absolute export offset of `data`.
        offset: u64,
        /// At least one byte.
        data: Bytes,
    },
    /// `NBD_REPLY_TYPE_OFFSET_HOLE`.
    OffsetHole {
        /// Absolute export offset.
        offset: u64,
        /// Hole size, nonzero.
        len: u32,
    },
    /// `NBD_REPLY_TYPE_BLOCK_STATUS`.
    BlockStatus {
        /// Metadata context id.
        context_id: u32,
        /// One or more descriptors.
        extents: Vec<Extent>,
    },
    /// `NBD_REPLY_TYPE_ERROR`.
    Error {
        /// Nonzero error value.
        error: u32,
        /// Human-readable message.
        message: String,
    },
    /// `NBD_REPLY_TYPE_ERROR_OFFSET`.
    ErrorOffset {
        /// Nonzero error value.
        error: u32,
        /// Human-readable message.
        message: String,
        /// Offset of the failure.
        offset: u64,
    },
    /// An unknown chunk type. If `kind` has bit 15 set it is an error chunk and
    /// `error` holds its error value (when the payload was long enough).
    Unknown {
        /// The chunk type.
        kind: u16,
        /// For unknown *error* chunk types, the leading error value.
        error: Option<u32>,
        /// Raw payload.
        data: Bytes,
    },
}

impl ChunkPayload {
    /// The `NBD_REPLY_TYPE_*` of this payload.
    pub fn kind(&self) -> u16 {
        match self {
            ChunkPayload::None => chunk_type::NONE,
            ChunkPayload::OffsetData { .. } => chunk_type::OFFSET_DATA,
            ChunkPayload::OffsetHole { .. } => chunk_type::OFFSET_HOLE,
            ChunkPayload::BlockStatus { .. } => chunk_type::BLOCK_STATUS,
            ChunkPayload::Error { .. } => chunk_type::ERROR,
            ChunkPayload::ErrorOffset { .. } => chunk_type::ERROR_OFFSET,
            ChunkPayload::Unknown { kind, .. } => *kind,
        }
    }

    /// True for error chunks (type bit 15).
    pub fn is_error(&self) -> bool {
        self.kind() & chunk_type::ERR_BIT != 0
    }

    /// Encode the payload (without the chunk header).
    ///
    /// Contract: the payload MUST satisfy the spec's per-type constraints
    /// (nonempty data, nonzero hole, at least one extent, nonzero error,
    /// message ≤ 4096 bytes); violations are programming errors and panic.
    pub fn encode_payload(&self) -> Bytes {
        let mut b = BytesMut::new();
        match self {
            ChunkPayload::None => {}
            ChunkPayload::OffsetData { offset, data } => {
                assert!(
                    !data.is_empty(),
                    "OFFSET_DATA MUST describe at least one byte"
                );
                b.put_u64(*offset);
                b.put_slice(data);
            }
            ChunkPayload::OffsetHole { offset, len } => {
                assert!(*len > 0, "OFFSET_HOLE size MUST be nonzero");
                b.put_u64(*offset);
                b.put_u32(*len);
            }
            ChunkPayload::BlockStatus {
                context_id,
                extents,
            } => {
                assert!(
                    !extents.is_empty(),
                    "BLOCK_STATUS MUST carry at least one extent"
                );
                b.put_u32(*context_id);
                for e in extents {
                    assert!(e.len > 0, "extent length MUST be nonzero");
                    b.put_u32(e.len);
                    b.put_u32(e.flags);
                }
            }
            ChunkPayload::Error { error, message } => {
                assert!(*error != 0, "error chunk value MUST be nonzero");
                assert_wire_string(message);
                b.put_u32(*error);
                b.put_u16(message.len() as u16);
                b.put_slice(message.as_bytes());
            }
            ChunkPayload::ErrorOffset {
                error,
                message,
                offset,
            } => {
                assert!(*error != 0, "error chunk value MUST be nonzero");
                assert_wire_string(message);
                b.put_u32(*error);
                b.put_u16(message.len() as u16);
                b.put_slice(message.as_bytes());
                b.put_u64(*offset);
            }
            ChunkPayload::Unknown { data, .. } => b.put_slice(data),
        }
        b.freeze()
    }

    /// Decode a payload of chunk type `kind`, checking the spec's length rules.
    pub fn decode(kind: u16, payload: Bytes) -> Result<Self, CodecError> {
        let what = "structured reply payload";
        let malformed = |reason: String| CodecError::Malformed { what, reason };
        let len = payload.len();
        let mut r = Rd::new(&payload, what);
        let v = match kind {
            chunk_type::NONE => {
                if len != 0 {
                    return Err(malformed(format!("NONE chunk with length {len}")));
                }
                ChunkPayload::None
            }
            chunk_type::OFFSET_DATA => {
                if len < 9 {
                    return Err(malformed(format!("OFFSET_DATA length {len} < 9")));
                }
                let offset = r.u64()?;
                ChunkPayload::OffsetData {
                    offset,
                    data: payload.slice(8..),
                }
            }
            chunk_type::OFFSET_HOLE => {
                if len != 12 {
                    return Err(malformed(format!("OFFSET_HOLE length {len} != 12")));
                }
                let offset = r.u64()?;
                let hl = r.u32()?;
                if hl == 0 {
                    return Err(malformed("OFFSET_HOLE with zero size".into()));
                }
                ChunkPayload::OffsetHole { offset, len: hl }
            }
            chunk_type::BLOCK_STATUS => {
                if len < 12 || (len - 4) % 8 != 0 {
                    return Err(malformed(format!(
                        "BLOCK_STATUS length {len} is not 4 + a positive multiple of 8"
                    )));
                }
                let context_id = r.u32()?;
                let mut extents = Vec::with_capacity((len - 4) / 8);
                while r.remaining() > 0 {
                    let l = r.u32()?;
                    let f = r.u32()?;
                    if l == 0 {
                        return Err(malformed("extent with zero length".into()));
                    }
                    extents.push(Extent { len: l, flags: f });
                }
                ChunkPayload::BlockStatus {
                    context_id,
                    extents,
                }
            }
            chunk_type::ERROR | chunk_type::ERROR_OFFSET => {
                let fixed = if kind == chunk_type::ERROR { 6 } else { 14 };
                if len < fixed {
                    return Err(malformed(format!("error chunk length {len} < {fixed}")));
                }
                let error = r.u32()?;
                if error == 0 {
                    return Err(malformed("error chunk with zero error value".into()));
                }
                let ml = r.u16()? as usize;
                if ml > len - fixed {
                    return Err(malformed(format!(
                        "error message length {ml} exceeds chunk length {len} - {fixed}"
                    )));
                }
                let message = String::from_utf8_lossy(r.take(ml)?).into_owned();
                if kind == chunk_type::ERROR {
                    ChunkPayload::Error { error, message }
                } else {
                    let offset = r.u64()?;
                    ChunkPayload::ErrorOffset {
                        error,
                        message,
                        offset,
                    }
                }
            }
            k => {
                let error = if k & chunk_type::ERR_BIT != 0 && len >= 6 {
                    let e = r.u32()?;
                    let ml = r.u16()? as usize;
                    if ml > len - 6 {
                        return Err(malformed(format!(
                            "unknown error chunk message length {ml} exceeds chunk"
                        )));
                    }
                    Some(e)
                } else {
                    None
                };
                ChunkPayload::Unknown {
                    kind: k,
                    error,
                    data: payload.clone(),
                }
            }
        };
        Ok(v)
    }
}

/// Encode a complete structured reply chunk (header + payload).
pub fn encode_chunk(handle: u64, flags: u16, payload: &ChunkPayload) -> Bytes {
    let body = payload.encode_payload();
    let mut b = BytesMut::with_capacity(ChunkHeader::LEN + body.len());
    b.put_slice(
        &ChunkHeader {
            flags,
            kind: payload.kind(),
            handle,
            length: u32_len(body.len()),
        }
        .encode(),
    );
    b.put_slice(&body);
    b.freeze()
}

/// Encode the chunk header plus the 8-byte offset of an `OFFSET_DATA` chunk
/// whose `data_len` data bytes the caller sends separately (zero-copy path).
pub fn encode_offset_data_prefix(handle: u64, flags: u16, offset: u64, data_len: u32) -> [u8; 28] {
    assert!(data_len > 0, "OFFSET_DATA MUST describe at least one byte");
    let mut b = [0u8; 28];
    b[..20].copy_from_slice(
        &ChunkHeader {
            flags,
            kind: chunk_type::OFFSET_DATA,
            handle,
            length: data_len
                .checked_add(8)
                .expect("OFFSET_DATA payload MUST fit in 32 bits"),
        }
        .encode(),
    );
    b[20..28].copy_from_slice(&offset.to_be_bytes());
    b
}

#[cfg(test)]
mod tests {
    //! Byte vectors below are written by hand from the layouts in proto.md.
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn greeting_bytes() {
        // "NBDMAGIC" "IHAVEOPT" flags=FIXED_NEWSTYLE|NO_ZEROES (0x0003)
        let g =
            encode_server_greeting(handshake_flags::FIXED_NEWSTYLE | handshake_flags::NO_ZEROES);
        let mut want = b"NBDMAGICIHAVEOPT".to_vec();
        want.extend_from_slice(&[0x00, 0x03]);
        assert_eq!(g.to_vec(), want);
        assert_eq!(decode_server_greeting(&g).unwrap(), 3);
        // Oldstyle greeting: second magic is cliserv_magic 0x00420281861253.
        let mut old = b"NBDMAGIC".to_vec();
        old.extend_from_slice(&hex("0000420281861253"));
        old.extend_from_slice(&[0, 0]);
        assert!(matches!(
            decode_server_greeting(&old),
            Err(CodecError::BadMagic { .. })
        ));
        assert!(matches!(
            decode_server_greeting(&g[..10]),
            Err(CodecError::Truncated { .. })
        ));
    }

    #[test]
    fn client_flags_bytes() {
        assert_eq!(encode_client_flags(3), [0, 0, 0, 3]);
        assert_eq!(decode_client_flags(&[0, 0, 0, 1]).unwrap(), 1);
        assert!(decode_client_flags(&[0, 0]).is_err());
    }

    #[test]
    fn option_header_and_go() {
        // IHAVEOPT, option 7 (GO), length 10: name_len=4 "disk", 1 request: BLOCK_SIZE(3)
        let want = hex("49484156454f5054 00000007 0000000c
             00000004 6469736b 0001 0003");
        let opt = ClientOption::Go(InfoRequest {
            name: "disk".into(),
            requests: vec![info::BLOCK_SIZE],
        });
        let enc = opt.encode();
        // length field is 4+4+2+2 = 12
        assert_eq!(enc.to_vec(), want);
        let h = OptionHeader::decode(&enc[..16]).unwrap();
        assert_eq!(
            h,
            OptionHeader {
                option: opt::GO,
                length: 12
            }
        );
        assert_eq!(ClientOption::parse(h.option, &enc[16..]).unwrap(), opt);
    }

    #[test]
    fn option_header_bad_magic() {
        let mut b = OptionHeader {
            option: 1,
            length: 0,
        }
        .encode();
        b[0] ^= 0xff;
        assert!(matches!(
            OptionHeader::decode(&b),
            Err(CodecError::BadMagic { .. })
        ));
    }

    #[test]
    fn info_request_malformed_lengths() {
        // Too short for the fixed fields.
        assert!(InfoRequest::decode_data(&hex("0000000000")).is_err());
        // name_len 100 > len - 6.
        assert!(InfoRequest::decode_data(&hex("00000064 0000")).is_err());
        // name_len 0, nreq 2 but only one request present.
        assert!(InfoRequest::decode_data(&hex("00000000 0002 0001")).is_err());
        // Trailing byte.
        assert!(InfoRequest::decode_data(&hex("00000000 0000 ff")).is_err());
        // name_len 0xffffffff must not overflow.
        assert!(InfoRequest::decode_data(&hex("ffffffff 0000")).is_err());
        // Invalid UTF-8 name.
        assert!(InfoRequest::decode_data(&hex("00000001 ff 0000")).is_err());
        // Minimal valid: default export, no requests.
        assert_eq!(
            InfoRequest::decode_data(&hex("00000000 0000")).unwrap(),
            InfoRequest {
                name: String::new(),
                requests: vec![]
            }
        );
    }

    #[test]
    fn meta_context_request_roundtrip_and_malformed() {
        let req = MetaContextRequest {
            export: "".into(),
            queries: vec!["base:allocation".into()],
        };
        let d = req.encode_data();
        let want = hex("00000000 00000001 0000000f 626173653a616c6c6f636174696f6e");
        assert_eq!(d.to_vec(), want);
        assert_eq!(MetaContextRequest::decode_data(&d).unwrap(), req);
        // Query length beyond the data.
        assert!(MetaContextRequest::decode_data(&hex("00000000 00000001 00000010 6162")).is_err());
        // Huge query count must not allocate / panic.
        assert!(MetaContextRequest::decode_data(&hex("00000000 ffffffff")).is_err());
        // Export name length beyond data.
        assert!(MetaContextRequest::decode_data(&hex("00000009 00")).is_err());
        // Trailing garbage.
        assert!(MetaContextRequest::decode_data(&hex("00000000 00000000 00")).is_err());
    }

    #[test]
    fn parse_options_rules() {
        assert_eq!(
            ClientOption::parse(opt::ABORT, b"junk").unwrap(),
            ClientOption::Abort
        );
        assert!(ClientOption::parse(opt::LIST, b"x").is_err());
        assert_eq!(
            ClientOption::parse(opt::LIST, b"").unwrap(),
            ClientOption::List
        );
        assert!(ClientOption::parse(opt::STRUCTURED_REPLY, b"x").is_err());
        assert_eq!(
            ClientOption::parse(0x1234, b"whatever").unwrap(),
            ClientOption::Unknown(0x1234)
        );
        assert_eq!(
            ClientOption::parse(opt::EXPORT_NAME, b"abc").unwrap(),
            ClientOption::ExportName("abc".into())
        );
        assert!(ClientOption::parse(opt::EXPORT_NAME, b"a\0b").is_err());
        assert!(ClientOption::parse(opt::EXPORT_NAME, &vec![b'a'; 4097]).is_err());
    }

    #[test]
    fn option_reply_bytes() {
        let r = encode_option_reply(opt::LIST, rep::ACK, &[]);
        assert_eq!(
            r.to_vec(),
            hex("0003e889045565a9 00000003 00000001 00000000")
        );
        let r = encode_option_reply(0xdead, rep::ERR_UNSUP, b"");
        assert_eq!(
            r.to_vec(),
            hex("0003e889045565a9 0000dead 80000001 00000000")
        );
        let h = OptionReplyHeader::decode(&r).unwrap();
        assert_eq!(h.reply_type, rep::ERR_UNSUP);
        assert!(rep::is_error(h.reply_type));
        assert_eq!(rep::ERR_TOO_BIG, 0x8000_0009);
        assert_eq!(rep::ERR_SHUTDOWN, 0x8000_0007);
    }

    #[test]
    fn info_reply_bytes() {
        let e = InfoReply::Export {
            size: 0x1_0000_0000,
            flags: 0x0d,
        };
        assert_eq!(e.encode_data().to_vec(), hex("0000 0000000100000000 000d"));
        assert_eq!(InfoReply::decode_data(&e.encode_data()).unwrap(), e);
        let bs = InfoReply::BlockSize {
            min: 512,
            preferred: 4096,
            max: 1 << 25,
        };
        assert_eq!(
            bs.encode_data().to_vec(),
            hex("0003 00000200 00001000 02000000")
        );
        assert_eq!(InfoReply::decode_data(&bs.encode_data()).unwrap(), bs);
        let n = InfoReply::Name("x".into());
        assert_eq!(n.encode_data().to_vec(), hex("0001 78"));
        // INFO_EXPORT length MUST be 12 (2 + 10).
        assert!(InfoReply::decode_data(&hex("0000 00000000")).is_err());
        assert!(InfoReply::decode_data(&hex("0003 00000200")).is_err());
        // Unknown types are preserved for the caller to ignore.
        assert!(matches!(
            InfoReply::decode_data(&hex("00ff 01")).unwrap(),
            InfoReply::Unknown { kind: 0xff, .. }
        ));
    }

    #[test]
    fn server_entry_and_meta_entry() {
        let s = ServerEntry {
            name: "a".into(),
            description: "desc".into(),
        };
        assert_eq!(s.encode_data().to_vec(), hex("00000001 61 64657363"));
        assert_eq!(ServerEntry::decode_data(&s.encode_data()).unwrap(), s);
        assert!(ServerEntry::decode_data(&hex("00000005 61")).is_err());
        let m = MetaContextEntry {
            id: 1,
            name: BASE_ALLOCATION.into(),
        };
        assert_eq!(
            m.encode_data().to_vec(),
            hex("00000001 626173653a616c6c6f636174696f6e")
        );
        assert_eq!(MetaContextEntry::decode_data(&m.encode_data()).unwrap(), m);
    }

    #[test]
    fn export_name_reply_zeroes() {
        let r = encode_export_name_reply(1 << 20, 0x0001, false);
        assert_eq!(r.len(), 134);
        assert_eq!(&r[..10], &hex("0000000000100000 0001")[..]);
        assert!(r[10..].iter().all(|&b| b == 0));
        let r = encode_export_name_reply(1 << 20, 0x0001, true);
        assert_eq!(r.len(), 10);
        assert_eq!(decode_export_name_reply(&r).unwrap(), (1 << 20, 1));
    }

    #[test]
    fn request_header_bytes() {
        let h = RequestHeader {
            flags: cmd_flags::FUA,
            command: Command::Write,
            handle: 0x0102030405060708,
            offset: 0x1000,
            length: 0x200,
        };
        let want = hex("25609513 0001 0001 0102030405060708 0000000000001000 00000200");
        assert_eq!(h.encode().to_vec(), want);
        assert_eq!(RequestHeader::decode(&want).unwrap(), h);
        let mut bad = want.clone();
        bad[3] = 0x14; // reserved 0x25609514
        assert!(matches!(
            RequestHeader::decode(&bad),
            Err(CodecError::BadMagic { .. })
        ));
        assert!(RequestHeader::decode(&want[..27]).is_err());
        // Unknown commands round-trip.
        let mut u = want.clone();
        u[6..8].copy_from_slice(&[0x00, 0x2a]);
        assert_eq!(
            RequestHeader::decode(&u).unwrap().command,
            Command::Other(42)
        );
        for v in 0u16..=8 {
            assert_eq!(u16::from(Command::from(v)), v);
        }
    }

    #[test]
    fn simple_reply_bytes() {
        let h = SimpleReplyHeader {
            error: 22,
            handle: 7,
        };
        let want = hex("67446698 00000016 0000000000000007");
        assert_eq!(h.encode().to_vec(), want);
        assert_eq!(SimpleReplyHeader::decode(&want).unwrap(), h);
        assert_eq!(ReplyHeader::decode(&want).unwrap(), ReplyHeader::Simple(h));
        assert_eq!(
            ReplyHeader::header_len([0x67, 0x44, 0x66, 0x98]).unwrap(),
            16
        );
        assert_eq!(
            ReplyHeader::header_len([0x66, 0x8e, 0x33, 0xef]).unwrap(),
            20
        );
        assert!(ReplyHeader::header_len([0x96, 0x74, 0x46, 0x68]).is_err());
    }

    #[test]
    fn structured_chunks_bytes() {
        // OFFSET_DATA, DONE, handle 1, offset 0x200, data "ab"
        let c = encode_chunk(
            1,
            reply_flags::DONE,
            &ChunkPayload::OffsetData {
                offset: 0x200,
                data: Bytes::from_static(b"ab"),
            },
        );
        let want = hex("668e33ef 0001 0001 0000000000000001 0000000a
             0000000000000200 6162");
        assert_eq!(c.to_vec(), want);
        let mut pre = encode_offset_data_prefix(1, reply_flags::DONE, 0x200, 2).to_vec();
        pre.extend_from_slice(b"ab");
        assert_eq!(pre, want);
        let h = ChunkHeader::decode(&c).unwrap();
        assert!(h.is_done());
        assert_eq!(
            ChunkPayload::decode(h.kind, c.slice(20..)).unwrap(),
            ChunkPayload::OffsetData {
                offset: 0x200,
                data: Bytes::from_static(b"ab")
            }
        );

        // NONE chunk.
        let c = encode_chunk(9, reply_flags::DONE, &ChunkPayload::None);
        assert_eq!(
            c.to_vec(),
            hex("668e33ef 0001 0000 0000000000000009 00000000")
        );

        // ERROR chunk: EIO, message "x".
        let c = encode_chunk(
            2,
            reply_flags::DONE,
            &ChunkPayload::Error {
                error: 5,
                message: "x".into(),
            },
        );
        assert_eq!(
            c.to_vec(),
            hex("668e33ef 0001 8001 0000000000000002 00000007 00000005 0001 78")
        );

        // ERROR_OFFSET: EIO, "", offset 0x10.
        let p = ChunkPayload::ErrorOffset {
            error: 5,
            message: String::new(),
            offset: 0x10,
        };
        let enc = p.encode_payload();
        assert_eq!(enc.to_vec(), hex("00000005 0000 0000000000000010"));
        assert_eq!(
            ChunkPayload::decode(chunk_type::ERROR_OFFSET, enc).unwrap(),
            p
        );

        // BLOCK_STATUS: context 1, extents (4096, HOLE|ZERO), (512, 0).
        let p = ChunkPayload::BlockStatus {
            context_id: 1,
            extents: vec![
                Extent {
                    len: 4096,
                    flags: 3,
                },
                Extent { len: 512, flags: 0 },
            ],
        };
        let enc = p.encode_payload();
        assert_eq!(
            enc.to_vec(),
            hex("00000001 00001000 00000003 00000200 00000000")
        );
        assert_eq!(
            ChunkPayload::decode(chunk_type::BLOCK_STATUS, enc).unwrap(),
            p
        );

        // OFFSET_HOLE.
        let p = ChunkPayload::OffsetHole {
            offset: 0,
            len: 4096,
        };
        let enc = p.encode_payload();
        assert_eq!(enc.to_vec(), hex("0000000000000000 00001000"));
        assert_eq!(
            ChunkPayload::decode(chunk_type::OFFSET_HOLE, enc).unwrap(),
            p
        );
    }

    #[test]
    fn structured_chunks_malformed() {
        let d = |k, h: &str| ChunkPayload::decode(k, Bytes::from(hex(h)));
        assert!(d(chunk_type::NONE, "00").is_err());
        assert!(d(chunk_type::OFFSET_DATA, "0000000000000000").is_err());
        assert!(d(chunk_type::OFFSET_HOLE, "0000000000000000 00000000").is_err());
        assert!(d(chunk_type::OFFSET_HOLE, "0000000000000000 0000").is_err());
        assert!(d(chunk_type::BLOCK_STATUS, "00000001").is_err());
        assert!(d(chunk_type::BLOCK_STATUS, "00000001 00000000 00000000").is_err());
        assert!(d(chunk_type::BLOCK_STATUS, "00000001 00000001 000000").is_err());
        assert!(d(chunk_type::ERROR, "00000005 00").is_err());
        assert!(d(chunk_type::ERROR, "00000000 0000").is_err());
        assert!(d(chunk_type::ERROR, "00000005 0005 61").is_err());
        assert!(d(chunk_type::ERROR_OFFSET, "00000005 0000 00000000").is_err());
        // Unknown error chunk: error value surfaced.
        assert_eq!(
            d(0x8005, "0000001c 0000").unwrap(),
            ChunkPayload::Unknown {
                kind: 0x8005,
                error: Some(28),
                data: Bytes::from(hex("0000001c 0000"))
            }
        );
        assert!(d(0x8005, "0000001c 0009").is_err());
    }

    #[test]
    fn sanitize_message_limits() {
        let long = "é".repeat(3000); // 6000 bytes
        let s = sanitize_message(&long);
        assert!(s.len() <= MAX_STRING_LEN);
        assert!(s.is_char_boundary(s.len()));
        assert_eq!(sanitize_message("a\0b"), "ab");
    }

    #[test]
    #[should_panic(expected = "MUST")]
    fn encode_rejects_too_long_string() {
        let _ = ServerEntry {
            name: "a".repeat(4097),
            description: String::new(),
        }
        .encode_data();
    }
}
