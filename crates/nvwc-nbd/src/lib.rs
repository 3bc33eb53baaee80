//! `nvwc-nbd`: the NBD (Network Block Device) protocol for nvwc.
//!
//! - [`proto`]: sans-IO wire codec (fixed-newstyle handshake, options,
//!   requests, simple and structured replies), constants from the spec
//!   (`doc/proto.md` of NetworkBlockDevice/nbd).
//! - [`server`]: async server framework over the [`Export`] trait: several
//!   named exports, TCP and unix listeners, concurrent request processing,
//!   graceful shutdown, TLS through `NBD_OPT_STARTTLS` (the TLS library is
//!   the embedding program's: [`TlsAcceptor`]).
//! - [`client`]: async pipelining client, nvwc's upstream backing-store client.
//! - [`memory`]: a sparse in-memory export.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod client;
pub mod error;
pub mod export;
pub mod memory;
pub mod proto;
pub mod server;

pub use client::{Client, ClientError, ClientOptions, ExportDetails, NbdUri};
pub use error::{CodecError, ErrorCode, NbdError};
pub use export::{
    BoxFuture, DirectSource, Export, ExportInfo, NbdResult, OpFuture, RequestCtx, WriteZeroesFlags,
    MAX_BLOCK_LIMIT,
};
pub use memory::{MemoryExport, MemoryStats};
pub use proto::Extent;
pub use server::{
    BoxStream, EventHook, Server, ServerBuilder, ServerConfig, ServerError, ServerEvent,
    TlsAcceptor, TlsMode, TlsSession,
};
