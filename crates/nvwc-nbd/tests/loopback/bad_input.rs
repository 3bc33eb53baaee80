//! Bad input, table-driven. Each table row is one case, run against a fresh
//! [`table_server`]; after each, another client MUST still be served.
//!
//! - [`bad_requests`]: transmission-phase requests the server MUST answer
//!   with an error, keeping the connection in sync;
//! - [`bad_options`]: option requests it MUST refuse, staying in the
//!   handshake so that a GO still works;
//! - [`closing_handshakes`]: handshakes where the spec requires or allows a
//!   hard disconnect.

use std::sync::Arc;

use nvwc_nbd::proto::{
    self, chunk_type, cmd_flags, opt, rep, ChunkPayload, ClientOption, Command, InfoRequest,
    MetaContextRequest, RequestHeader, BASE_ALLOCATION,
};
use nvwc_nbd::{ErrorCode, ExportInfo, MemoryExport};

use crate::common::*;
use crate::MIB;

pub const READ: u16 = 0;
pub const WRITE: u16 = 1;
const FLUSH: u16 = 3;
const TRIM: u16 = 4;
const CACHE: u16 = 5;
const ZEROES: u16 = 6;
const BLOCK_STATUS: u16 = 7;

/// Exports: "" (all features, 1 MiB, max_block 64 KiB), "ro" (read-only),
/// "aligned" (min_block 512), "plain" (no optional features).
pub async fn table_server() -> (TestServer, Arc<MemoryExport>) {
    let mut d = ExportInfo::new("", MIB).with_all_features();
    d.max_block = 65536;
    let default = Arc::new(MemoryExport::new(d));
    let mut ro = ExportInfo::new("ro", MIB);
    ro.read_only = true;
    ro.can_trim = true;
    ro.can_zero = true;
    let mut al = ExportInfo::new("aligned", MIB);
    al.min_block = 512;
    let plain = ExportInfo::new("plain", MIB);
    let ts = TestServer::start(vec![
        default.clone(),
        Arc::new(MemoryExport::new(ro)),
        Arc::new(MemoryExport::new(al)),
        Arc::new(MemoryExport::new(plain)),
    ])
    .await;
    (ts, default)
}

// ---------------------------------------------------------------------------
// Transmission phase
// ---------------------------------------------------------------------------

/// How a connection negotiates before GO.
#[derive(Clone, Copy)]
enum Replies {
    Simple,
    Structured,
    /// Structured, with `base:allocation` selected.
    StructuredMeta,
}
use Replies::{Simple, Structured, StructuredMeta};

/// A request the server MUST refuse with `want` (a write carries its whole
/// payload, which the server MUST consume to stay in sync).
struct BadRequest {
    name: &'static str,
    export: &'static str,
    replies: Replies,
    hdr: RequestHeader,
    want: ErrorCode,
}

#[rustfmt::skip]
fn bad_requests() -> Vec<BadRequest> {
    use ErrorCode::{Inval, NoSpc, Overflow, Perm};
    let r = |name, export, replies, hdr, want| BadRequest {
        name,
        export,
        replies,
        hdr,
        want,
    };
    // Above 32 MiB and the maximum: the spec would allow a hard disconnect
    // (denial of service), but the payload is skipped as it arrives, never
    // held, so the client gets its error and keeps its connection.
    let huge = (33 << 20) + 1;
    vec![
        r("read out of range, simple", "", Simple, req(READ, 0, 1, MIB - 4, 8), Inval),
        r("read out of range, structured", "", Structured, req(READ, 0, 1, MIB, 1), Inval),
        r("read offset overflow", "", Structured, req(READ, 0, 1, u64::MAX - 3, 8), Inval),
        r("write out of range", "", Simple, req(WRITE, 0, 1, MIB - 512, 1024), NoSpc),
        r("write zeroes out of range", "", Structured, req(ZEROES, 0, 1, MIB, 512), NoSpc),
        r("trim out of range", "", Simple, req(TRIM, 0, 1, MIB - 1, 2), Inval),
        r("cache out of range", "", Simple, req(CACHE, 0, 1, 2 * MIB, 2), Inval),
        r("block status out of range", "", StructuredMeta, req(BLOCK_STATUS, 0, 1, MIB, 512), Inval),
        r("block status of length 0", "", StructuredMeta, req(BLOCK_STATUS, 0, 1, 0, 0), Inval),
        r("block status without a meta context", "", Structured, req(BLOCK_STATUS, 0, 1, 0, 512), Inval),
        r("REQ_ONE on a read", "", Structured, req(READ, cmd_flags::REQ_ONE, 1, 0, 512), Inval),
        r("read too long, simple", "", Simple, req(READ, 0, 1, 0, 131072), Inval),
        r("read too long, structured", "", Structured, req(READ, 0, 1, 0, 131072), Overflow),
        r("write too long", "", Simple, req(WRITE, 0, 1, 0, 131072), Inval),
        r("write of a huge length, simple", "", Simple, req(WRITE, 0, 1, 0, huge), Inval),
        r("write of a huge length, structured", "", Structured, req(WRITE, 0, 1, 0, huge), Inval),
        r("write too long past the end", "", Simple, req(WRITE, 0, 1, MIB, 131072), Inval),
        r("large write to a read-only export", "ro", Simple, req(WRITE, 0, 1, 0, 4 << 20), Perm),
        r("write to a read-only export", "ro", Simple, req(WRITE, 0, 1, 0, 512), Perm),
        r("trim of a read-only export", "ro", Structured, req(TRIM, 0, 1, 0, 512), Perm),
        r("write zeroes to a read-only export", "ro", Simple, req(ZEROES, 0, 1, 0, 512), Perm),
        r("unknown command", "", Simple, req(42, 0, 1, 0, 0), Inval),
        r("unknown command, structured", "", Structured, req(8, 0, 1, 0, 0), Inval),
        r("unknown flag", "", Simple, req(READ, 0x8000, 1, 0, 8), Inval),
        r("NO_HOLE on a read", "", Simple, req(READ, cmd_flags::NO_HOLE, 1, 0, 8), Inval),
        r("REQ_ONE on a write", "", Simple, req(WRITE, cmd_flags::REQ_ONE, 1, 0, 4096), Inval),
        r("DF without structured replies", "", Simple, req(READ, cmd_flags::DF, 1, 0, 8), Inval),
        r("FUA not advertised", "plain", Simple, req(WRITE, cmd_flags::FUA, 1, 0, 512), Inval),
        r("FAST_ZERO not advertised", "ro", Simple, req(ZEROES, cmd_flags::FAST_ZERO, 1, 0, 512), Inval),
        r("flush not advertised", "plain", Simple, req(FLUSH, 0, 1, 0, 0), Inval),
        r("trim not advertised", "plain", Structured, req(TRIM, 0, 1, 0, 512), Inval),
        r("write zeroes not advertised", "plain", Simple, req(ZEROES, 0, 1, 0, 512), Inval),
        r("cache not advertised", "plain", Simple, req(CACHE, 0, 1, 0, 512), Inval),
        r("unaligned read", "aligned", Simple, req(READ, 0, 1, 100, 512), Inval),
        r("unaligned write length", "aligned", Structured, req(WRITE, 0, 1, 0, 100), Inval),
    ]
}

async fn run_bad_request(c: &BadRequest) {
    let (ts, _default) = table_server().await;
    let structured = !matches!(c.replies, Simple);
    let meta = matches!(c.replies, StructuredMeta);
    let mut r = Raw::go(&ts.sock, c.export, structured, meta).await;
    let payload = if c.hdr.command == Command::Write {
        vec![0xee; c.hdr.length as usize]
    } else {
        vec![]
    };
    r.request(c.hdr, &payload).await;
    let name = c.name;
    if structured {
        let (h, p) = r.chunk().await;
        assert_eq!(h.handle, c.hdr.handle, "{name}");
        assert!(h.is_done(), "{name}: error chunk MUST be final here");
        assert_eq!(h.kind, chunk_type::ERROR, "{name}");
        match p {
            ChunkPayload::Error { error, message } => {
                assert_eq!(error, c.want.to_wire(), "{name}: message: {message}");
                assert!(
                    !message.is_empty(),
                    "{name}: structured errors carry a message"
                );
            }
            other => panic!("{name}: expected error chunk, got {other:?}"),
        }
    } else {
        let h = r.simple_reply().await;
        assert_eq!(
            (h.handle, h.error),
            (c.hdr.handle, c.want.to_wire()),
            "{name}"
        );
    }
    // The same connection keeps working (stream still in sync).
    r.request(req(READ, 0, 999, 0, 512), &[]).await;
    if structured {
        let (h, p) = r.chunk().await;
        assert_eq!(h.handle, 999, "{name}");
        assert!(
            matches!(p, ChunkPayload::OffsetData { offset: 0, .. }),
            "{name}"
        );
    } else {
        let h = r.simple_reply().await;
        assert_eq!((h.handle, h.error), (999, 0), "{name}");
        r.read_n(512).await;
    }
    ts.assert_other_client_works_and_shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_an_error_and_keep_the_connection() {
    for c in bad_requests() {
        bounded_case(c.name, run_bad_request(&c)).await;
    }
}

// ---------------------------------------------------------------------------
// Handshake phase
// ---------------------------------------------------------------------------

/// Raw option bytes the server MUST refuse with final reply `want` to `option`.
struct BadOption {
    name: &'static str,
    bytes: Vec<u8>,
    option: u32,
    want: u32,
}

#[rustfmt::skip]
fn bad_options() -> Vec<BadOption> {
    use rep::{ERR_INVALID, ERR_TOO_BIG, ERR_UNKNOWN, ERR_UNSUP};
    let raw = |name, option, data: &[u8], want| BadOption {
        name,
        bytes: unknown_option_bytes(option, data),
        option,
        want,
    };
    let encoded = |name, o: ClientOption, want| BadOption {
        name,
        option: o.code(),
        bytes: o.encode().to_vec(),
        want,
    };
    let meta = |export: &str, queries: Vec<String>| MetaContextRequest {
        export: export.into(),
        queries,
    };
    let big = vec![7u8; 100_000];
    vec![
        raw("unknown option", 0xdead, b"some data", ERR_UNSUP),
        raw("extended headers", opt::EXTENDED_HEADERS, b"", ERR_UNSUP),
        raw("STARTTLS without TLS", opt::STARTTLS, b"", ERR_UNSUP),
        raw("GO name length overflow", opt::GO, &[0, 0, 0, 200, 0, 0], ERR_INVALID),
        raw("INFO truncated", opt::INFO, &[0, 0], ERR_INVALID),
        raw("GO request count mismatch", opt::GO, &[0, 0, 0, 0, 0, 5, 0, 1], ERR_INVALID),
        raw("LIST with data", opt::LIST, b"x", ERR_INVALID),
        raw("STRUCTURED_REPLY with data", opt::STRUCTURED_REPLY, b"x", ERR_INVALID),
        raw(
            "meta context query length overflow",
            opt::LIST_META_CONTEXT,
            &[0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, b'b'],
            ERR_INVALID,
        ),
        raw("oversized unknown option skipped", 0x4242, &big, ERR_UNSUP),
        raw("oversized known option skipped", opt::INFO, &big, ERR_TOO_BIG),
        encoded(
            "GO to an unknown export",
            ClientOption::Go(InfoRequest {
                name: "nope".into(),
                requests: vec![],
            }),
            ERR_UNKNOWN,
        ),
        encoded(
            "SET_META_CONTEXT without structured replies",
            ClientOption::SetMetaContext(meta("", vec![BASE_ALLOCATION.into()])),
            ERR_INVALID,
        ),
        encoded(
            "meta context of an unknown export",
            ClientOption::ListMetaContext(meta("nope", vec![])),
            ERR_UNKNOWN,
        ),
    ]
}

/// Send the option, expect its refusal, then check that a GO on the same
/// connection still succeeds and serves a read.
async fn run_bad_option(c: &BadOption) {
    let name = c.name;
    let (ts, _) = table_server().await;
    let mut r = Raw::connect(&ts.sock).await;
    r.send(&c.bytes).await;
    let (h, _) = r.opt_reply().await;
    assert_eq!((h.option, h.reply_type), (c.option, c.want), "{name}");
    r.option(&ClientOption::Go(InfoRequest {
        name: String::new(),
        requests: vec![],
    }))
    .await;
    let (_, fin) = r.opt_replies_until_final().await;
    assert_eq!(fin, rep::ACK, "{name}: GO after the error must succeed");
    r.request(req(READ, 0, 1, 0, 8), &[]).await;
    assert_eq!(r.simple_reply().await.error, 0, "{name}");
    ts.assert_other_client_works_and_shut_down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_options_are_refused_and_the_handshake_goes_on() {
    for c in bad_options() {
        bounded_case(c.name, run_bad_option(&c)).await;
    }
}

/// Client flags, then option bytes, after which the server MUST hang up.
fn closing_handshakes() -> Vec<(&'static str, u32, Vec<u8>)> {
    let mut bad_magic = ClientOption::List.encode().to_vec();
    bad_magic[0] = b'X';
    vec![
        ("unknown client flags", 0x8000_0001, vec![]),
        ("bad option magic", 3, bad_magic),
        (
            "EXPORT_NAME of an unknown export",
            3,
            ClientOption::ExportName("nope".into()).encode().to_vec(),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_handshakes_disconnect_only_that_client() {
    for (name, flags, options) in closing_handshakes() {
        bounded_case(name, async {
            let (ts, _) = table_server().await;
            let (mut r, _) = Raw::connect_bare(&ts.sock).await;
            let mut bytes = proto::encode_client_flags(flags).to_vec();
            bytes.extend_from_slice(&options);
            r.send(&bytes).await;
            r.expect_closed().await;
            ts.assert_other_client_works_and_shut_down().await;
        })
        .await;
    }
}
