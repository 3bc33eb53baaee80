//! Sans-IO wire codec for the NBD protocol (fixed newstyle handshake,
//! simple and structured replies), following `doc/proto.md` of
//! NetworkBlockDevice/nbd.
//!
//! Everything here is pure: functions take byte slices and return values or
//! [`CodecError`](crate::CodecError)s. No function in this module panics on any input received
//! from a peer; assertions only guard values *we* are about to encode (for
//! example a string longer than the spec's 4096-byte limit).
//!
//! All integers are big-endian ("network byte order").
//!
//! This file holds the spec's constants, flags and command codes; each
//! phase's codec has its own file:
//!
//! - `wire`: the bounds-checked reader and the string rules every codec uses;
//! - `handshake`: greeting, client flags and option requests;
//! - `option_reply`: option replies and their data;
//! - `transmission`: request, simple reply and chunk headers;
//! - `chunk`: structured reply chunk payloads.

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

mod chunk;
mod handshake;
mod option_reply;
mod transmission;
mod wire;

pub use chunk::{encode_chunk, encode_offset_data_prefix, ChunkPayload};
pub use handshake::{
    decode_client_flags, decode_server_greeting, encode_client_flags, encode_option,
    encode_server_greeting, ClientOption, InfoRequest, MetaContextRequest, OptionHeader,
    GREETING_LEN,
};
pub use option_reply::{
    decode_export_name_reply, encode_export_name_reply, encode_option_reply, InfoReply,
    MetaContextEntry, OptionReplyHeader, ServerEntry, EXPORT_NAME_REPLY_LEN, EXPORT_NAME_ZEROES,
};
pub use transmission::{ChunkHeader, ReplyHeader, RequestHeader, SimpleReplyHeader};
pub use wire::sanitize_message;
