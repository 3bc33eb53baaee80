//! Our server + our client (and a raw byte-level driver) over unix sockets.
//!
//! - `exports`: the test exports (gate, probe, buggy, direct);
//! - `client`: every command through the client, concurrency and limits;
//! - `handshake`: option negotiation, listing, meta contexts;
//! - `lifecycle`: shutdown, disconnects, export bugs, client-side checks;
//! - `bad_input`: the tables of bad requests, options and handshakes;
//! - `direct`: direct writes (`Export::write_direct`).

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod client;
mod direct;
mod exports;
mod handshake;
mod lifecycle;

use std::sync::Arc;

use nvwc_nbd::MemoryExport;

pub const MIB: u64 = 1 << 20;

pub fn mem(name: &str, size: u64) -> Arc<MemoryExport> {
    Arc::new(MemoryExport::with_size(name, size))
}
