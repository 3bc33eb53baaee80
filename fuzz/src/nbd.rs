//! NBD server fuzz harness, shared by the cargo-fuzz targets
//! (`fuzz/fuzz_targets/nbd_*.rs`) and by the regression test
//! `crates/nvwc-nbd/tests/fuzz_regressions.rs` (which includes this file
//! with `#[path]`), so a saved crash is replayed through exactly the code
//! that found it.
//!
//! The server side is fuzzed end to end: a real [`Server`] with in-memory
//! exports serves one end of an in-memory duplex stream; the fuzz input is
//! written to the other end, followed by EOF, while the server's answers are
//! drained. Contract checked: the server never panics (libFuzzer aborts on a
//! panic in any task), closes the connection within [`SESSION_BOUND`] of the
//! client's EOF, and shuts down cleanly afterwards. The sans-IO decoders the
//! server uses are also called directly on the same bytes.

use std::sync::Arc;
use std::time::Duration;

use nvwc_nbd::proto::{
    client_flags, ClientOption, InfoRequest, MetaContextRequest, OptionHeader, RequestHeader,
    BASE_ALLOCATION,
};
use nvwc_nbd::proto::{opt, rep, GREETING_LEN, OPTION_REPLY_MAGIC};
use nvwc_nbd::{
    BoxFuture, BoxStream, ExportInfo, MemoryExport, Server, ServerConfig, TlsAcceptor, TlsMode,
    TlsSession,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A session must end this long after the client's EOF (generous: the
/// machine may be loaded; a real hang never ends).
pub const SESSION_BOUND: Duration = Duration::from_secs(20);

/// Exports offered: all features; read-only; no optional features with a
/// 512-byte minimum block.
pub const EXPORTS: [&str; 3] = ["rw", "ro", "plain"];

/// A stand-in for a TLS library: hands the stream back unchanged, so the
/// option haggling after `NBD_OPT_STARTTLS` is driven by the same plain
/// bytes; or fails every handshake.
pub struct FakeTls {
    /// Fail the handshake.
    pub fail: bool,
}

impl TlsAcceptor for FakeTls {
    fn accept(&self, stream: BoxStream) -> BoxFuture<'static, std::io::Result<TlsSession>> {
        let fail = self.fail;
        Box::pin(async move {
            if fail {
                Err(std::io::Error::other("fake TLS handshake failure"))
            } else {
                Ok(TlsSession {
                    stream,
                    peer: "fake".into(),
                })
            }
        })
    }
}

fn server_with(tls: Option<(TlsMode, bool)>) -> Server {
    let mut rw = ExportInfo::new("rw", 256 << 10).with_all_features();
    rw.max_block = 64 << 10;
    let mut ro = rw.clone();
    ro.name = "ro".into();
    ro.read_only = true;
    let mut plain = ExportInfo::new("plain", 256 << 10);
    plain.min_block = 512;
    plain.max_block = 64 << 10;
    let config = ServerConfig {
        max_in_flight: 8,
        max_in_flight_bytes: 1 << 20,
        max_option_len: 16 << 10,
        ..ServerConfig::default()
    };
    let mut b = Server::builder().config(config).default_export("rw");
    for info in [rw, ro, plain] {
        b = b.export(Arc::new(MemoryExport::new(info)));
    }
    if let Some((mode, fail)) = tls {
        b = b.tls(mode, Arc::new(FakeTls { fail }));
    }
    b.build().expect("valid fuzz server")
}

/// Runs one connection: `client` is everything the client sends after
/// reading the greeting. Returns the server's bytes (greeting included).
pub fn session(client: &[u8]) -> Vec<u8> {
    session_on(None, client)
}

/// [`session`] on a server with TLS `mode` and a [`FakeTls`] (`fail`: every
/// handshake fails); `None`: no TLS (NOTLS).
pub fn session_on(tls: Option<(TlsMode, bool)>, client: &[u8]) -> Vec<u8> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let server = server_with(tls);
        let (ours, theirs) = tokio::io::duplex(64 << 10);
        server.serve_connection(theirs).expect("not shutting down");
        let (mut rd, mut wr) = tokio::io::split(ours);
        let send = async {
            // The server may hang up early (protocol violation): stop then.
            let _ = wr.write_all(client).await;
            let _ = wr.shutdown().await;
            wr
        };
        let recv = async {
            let mut out = Vec::new();
            let _ = rd.read_to_end(&mut out).await;
            out
        };
        let (_wr, out) = tokio::time::timeout(SESSION_BOUND, async { tokio::join!(send, recv) })
            .await
            .expect("server did not close the connection after the client's EOF");
        tokio::time::timeout(SESSION_BOUND, server.shutdown())
            .await
            .expect("server did not shut down");
        out
    })
}

/// Handshake target: `data` is the raw client side after the greeting
/// (client flags, then options). Also runs the option decoders on it.
pub fn check_handshake(data: &[u8]) {
    let _ = OptionHeader::decode(data);
    if data.len() >= 4 {
        let code = u32::from_be_bytes(data[..4].try_into().unwrap());
        let _ = ClientOption::parse(code, &data[4..]);
        let _ = InfoRequest::decode_data(&data[4..]);
        let _ = MetaContextRequest::decode_data(&data[4..]);
    }
    let out = session(data);
    assert!(out.len() >= nvwc_nbd::proto::GREETING_LEN, "no greeting");
}

/// The client bytes of a valid handshake into transmission, chosen by
/// `sel`: bit 0 structured replies, bit 1 base:allocation meta context,
/// bits 2-3 the export (see [`EXPORTS`]; 3 = the default export "").
pub fn handshake_prefix(sel: u8) -> Vec<u8> {
    let name = match (sel >> 2) & 3 {
        3 => "",
        i => EXPORTS[i as usize],
    };
    let mut v = client_flags_bytes();
    if sel & 1 != 0 {
        v.extend_from_slice(&ClientOption::StructuredReply.encode());
    }
    if sel & 2 != 0 {
        v.extend_from_slice(
            &ClientOption::SetMetaContext(MetaContextRequest {
                export: name.into(),
                queries: vec![BASE_ALLOCATION.into()],
            })
            .encode(),
        );
    }
    v.extend_from_slice(
        &ClientOption::Go(InfoRequest {
            name: name.into(),
            requests: vec![],
        })
        .encode(),
    );
    v
}

fn client_flags_bytes() -> Vec<u8> {
    (client_flags::FIXED_NEWSTYLE | client_flags::NO_ZEROES)
        .to_be_bytes()
        .to_vec()
}

/// Request target: the first byte picks the negotiated session (see
/// [`handshake_prefix`]), the rest is the transmission phase (request
/// headers, payloads, garbage). Also runs the request-header decoder on
/// every 28-byte window.
pub fn check_requests(data: &[u8]) {
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    for w in body.chunks(RequestHeader::LEN) {
        let _ = RequestHeader::decode(w);
    }
    let mut client = handshake_prefix(sel);
    let hs_len = client.len();
    client.extend_from_slice(body);
    let out = session(&client);
    // The handshake prefix is valid, so the server must have answered it.
    assert!(
        out.len() >= nvwc_nbd::proto::GREETING_LEN,
        "no greeting after a {hs_len}-byte valid handshake"
    );
}

/// The option replies in a server's output (after the greeting), as
/// (option, reply type), up to the first bytes that are not one (an
/// `NBD_OPT_EXPORT_NAME` reply, the transmission phase, or the end).
pub fn option_replies(out: &[u8]) -> Vec<(u32, u32)> {
    let mut v = Vec::new();
    let mut p = GREETING_LEN.min(out.len());
    while out.len() >= p + 20 {
        let be32 = |o: usize| u32::from_be_bytes(out[o..o + 4].try_into().unwrap());
        if u64::from_be_bytes(out[p..p + 8].try_into().unwrap()) != OPTION_REPLY_MAGIC {
            break;
        }
        let (option, kind, len) = (be32(p + 8), be32(p + 12), be32(p + 16) as usize);
        v.push((option, kind));
        p += 20 + len;
        if option == opt::GO && kind == rep::ACK {
            break; // transmission
        }
    }
    v
}

/// STARTTLS target: byte 0 picks the server (bit 0: `--tls require`, else
/// `on`; bit 1: the TLS handshake fails), the rest is the client side after
/// the greeting, as for [`check_handshake`]; after an acknowledged STARTTLS
/// the [`FakeTls`] hands the same stream back. Checks the spec's TLS rules
/// on the replies: `NBD_REP_ERR_TLS_REQD` only under require and only before
/// STARTTLS succeeded; under require, before that, nothing but
/// `ERR_TLS_REQD` or a reply to STARTTLS or ABORT (no export is listed,
/// described or entered); a second STARTTLS is never acknowledged.
pub fn check_starttls(data: &[u8]) {
    let Some((&sel, client)) = data.split_first() else {
        return;
    };
    let require = sel & 1 != 0;
    let mode = if require {
        TlsMode::Require
    } else {
        TlsMode::On
    };
    let out = session_on(Some((mode, sel & 2 != 0)), client);
    assert!(out.len() >= GREETING_LEN, "no greeting");
    let mut tls = false;
    for (option, kind) in option_replies(&out) {
        if kind == rep::ERR_TLS_REQD {
            assert!(require, "ERR_TLS_REQD under --tls on");
            assert!(!tls, "ERR_TLS_REQD after STARTTLS succeeded");
        } else if require && !tls {
            assert!(
                option == opt::STARTTLS || option == opt::ABORT,
                "reply {kind:#x} to option {option} before TLS under require"
            );
        }
        if option == opt::STARTTLS && kind == rep::ACK {
            assert!(!tls, "a second STARTTLS was acknowledged");
            tls = true;
        }
    }
}
