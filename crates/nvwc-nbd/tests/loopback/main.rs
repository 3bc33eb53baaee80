//! Our server + our client (and a raw byte-level driver) over unix sockets.
//!
//! - `exports`: the test exports (gate, probe, buggy, direct);
//! - `client`: every command through the client, concurrency, limits and
//!   direct writes;
//! - `session`: the handshake, shutdown, disconnects, export bugs and
//!   client-side checks;
//! - `bad_input`: the tables of bad requests, options and handshakes.

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod client;
mod exports;
mod session;

use std::sync::Arc;

use common::{req, Raw, TestServer};
use exports::GateExport;
use nvwc_nbd::{Export, MemoryExport};

pub const MIB: u64 = 1 << 20;

pub fn mem(name: &str, size: u64) -> Arc<MemoryExport> {
    Arc::new(MemoryExport::with_size(name, size))
}

/// Wait up to 2 s for `m` to count `n` disconnects (`on_disconnect` runs
/// after the server closed the connection), then assert it did.
pub async fn disconnected(m: &MemoryExport, n: u64) {
    for _ in 0..200 {
        if m.stats().disconnects == n {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(m.stats().disconnects, n);
}

/// A server of the one export `e`.
pub async fn serve<E: Export>(e: &Arc<E>) -> TestServer {
    TestServer::start(vec![e.clone()]).await
}

/// A server of a fresh [`GateExport`] and a raw connection (`structured`
/// replies or not) whose read `handle` of `len` bytes at 0 waits at the gate.
pub async fn gated_read(
    structured: bool,
    handle: u64,
    len: u32,
) -> (Arc<GateExport>, TestServer, Raw) {
    let g = GateExport::new(MIB);
    let ts = serve(&g).await;
    let mut r = Raw::go(&ts.sock, "", structured, false).await;
    r.request(req(0, 0, handle, 0, len), &[]).await;
    g.entered.notified().await;
    (g, ts, r)
}
