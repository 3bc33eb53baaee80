//! Replays the NBD fuzz targets' saved inputs through the fuzz harness
//! itself (`fuzz/src/nbd.rs`, included below: a real server on an in-memory
//! duplex stream): every crash cargo-fuzz ever found
//! (`fuzz/regressions/nbd_{handshake,requests,starttls}/`) and the hand-made seeds
//! (`fuzz/seeds/...`). A regression makes the harness panic or time out.

#[path = "../../../fuzz/src/nbd.rs"]
#[allow(dead_code)]
mod harness;

use std::path::{Path, PathBuf};

fn inputs(kind: &str, target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz")
        .join(kind)
        .join(target);
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|rd| rd.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    v.retain(|p| p.is_file() && !p.file_name().unwrap().to_string_lossy().starts_with('.'));
    v.sort();
    v
}

fn replay(target: &str, check: fn(&[u8])) {
    let mut n = 0;
    for kind in ["regressions", "seeds"] {
        for p in inputs(kind, target) {
            eprintln!("replaying {}", p.display());
            check(&std::fs::read(&p).unwrap());
            n += 1;
        }
    }
    assert!(n > 0, "no saved inputs for {target}");
}

#[test]
fn handshake_target_replays_its_saved_inputs() {
    replay("nbd_handshake", harness::check_handshake);
}

#[test]
fn starttls_target_replays_its_saved_inputs() {
    replay("nbd_starttls", harness::check_starttls);
}

/// The spec's TLS rules, reply by reply, through the fuzz harness's server
/// (a stand-in TLS that hands the stream back, so the options after
/// STARTTLS are plain bytes here).
#[test]
fn starttls_replies_follow_the_spec() {
    use nvwc_nbd::proto::{client_flags, opt, rep, ClientOption, InfoRequest, GREETING_LEN};
    use nvwc_nbd::TlsMode;
    let flags = (client_flags::FIXED_NEWSTYLE | client_flags::NO_ZEROES).to_be_bytes();
    let enc = |o: ClientOption| o.encode().to_vec();
    let go = |n: &str| {
        enc(ClientOption::Go(InfoRequest {
            name: n.into(),
            requests: vec![],
        }))
    };
    let run = |tls: Option<(TlsMode, bool)>, opts: &[Vec<u8>]| {
        let mut c = flags.to_vec();
        for o in opts {
            c.extend_from_slice(o);
        }
        harness::option_replies(&harness::session_on(tls, &c))
    };
    let require = Some((TlsMode::Require, false));
    let list = enc(ClientOption::List);
    let tls = enc(ClientOption::StartTls);
    let structured = enc(ClientOption::StructuredReply);
    // An unknown option (99): LIST's encoding with another code.
    let mut unknown = enc(ClientOption::List);
    unknown[8..12].copy_from_slice(&99u32.to_be_bytes());

    // require: every option before TLS is refused, STARTTLS is acknowledged,
    // a second one is invalid, then options work (LIST: 3 exports + ACK).
    let r = run(
        require,
        &[
            list.clone(),
            go(""),
            unknown.clone(),
            structured.clone(),
            tls.clone(),
            tls.clone(),
            list.clone(),
        ],
    );
    assert_eq!(
        r,
        vec![
            (opt::LIST, rep::ERR_TLS_REQD),
            (opt::GO, rep::ERR_TLS_REQD),
            (99, rep::ERR_TLS_REQD),
            (opt::STRUCTURED_REPLY, rep::ERR_TLS_REQD),
            (opt::STARTTLS, rep::ACK),
            (opt::STARTTLS, rep::ERR_INVALID),
            (opt::LIST, rep::SERVER),
            (opt::LIST, rep::SERVER),
            (opt::LIST, rep::SERVER),
            (opt::LIST, rep::ACK),
        ]
    );
    // require: NBD_OPT_EXPORT_NAME before TLS closes with no reply at all.
    let mut c = flags.to_vec();
    c.extend_from_slice(&enc(ClientOption::ExportName("rw".into())));
    assert_eq!(harness::session_on(require, &c).len(), GREETING_LEN);
    // require: ABORT before TLS is acknowledged.
    assert_eq!(
        run(require, &[enc(ClientOption::Abort)]),
        vec![(opt::ABORT, rep::ACK)]
    );
    // A failed TLS handshake ends the session right after the ACK.
    assert_eq!(
        run(Some((TlsMode::Require, true)), &[tls.clone(), list.clone()]),
        vec![(opt::STARTTLS, rep::ACK)]
    );
    // on: options work in plain text; state negotiated before STARTTLS is
    // dropped (SET_META_CONTEXT then needs structured replies again).
    let meta = enc(ClientOption::SetMetaContext(
        nvwc_nbd::proto::MetaContextRequest {
            export: "rw".into(),
            queries: vec!["base:allocation".into()],
        },
    ));
    let r = run(
        Some((TlsMode::On, false)),
        &[
            structured.clone(),
            meta.clone(),
            tls.clone(),
            meta.clone(),
            go("rw"),
        ],
    );
    assert_eq!(
        r,
        vec![
            (opt::STRUCTURED_REPLY, rep::ACK),
            (opt::SET_META_CONTEXT, rep::META_CONTEXT),
            (opt::SET_META_CONTEXT, rep::ACK),
            (opt::STARTTLS, rep::ACK),
            (opt::SET_META_CONTEXT, rep::ERR_INVALID),
            (opt::GO, rep::INFO),
            (opt::GO, rep::INFO),
            (opt::GO, rep::ACK),
        ]
    );
    // off (no TLS configured): STARTTLS is unsupported, never TLS_REQD.
    assert_eq!(
        run(None, &[tls.clone(), list.clone()])[..2],
        [(opt::STARTTLS, rep::ERR_UNSUP), (opt::LIST, rep::SERVER)]
    );
}

#[test]
fn requests_target_replays_its_saved_inputs() {
    replay("nbd_requests", harness::check_requests);
}

/// The harness's valid handshake really reaches transmission on every
/// export: a READ after it gets a reply, so the request target fuzzes the
/// transmission phase and not just handshake errors.
#[test]
fn request_harness_reaches_transmission() {
    use nvwc_nbd::proto::{RequestHeader, GREETING_LEN};
    for sel in 0u8..16 {
        let mut input = vec![sel];
        let hdr = RequestHeader {
            flags: 0,
            command: 0u16.into(),
            handle: 0x1122_3344_5566_7788,
            offset: 0,
            length: 512,
        };
        input.extend_from_slice(&hdr.encode());
        let mut client = harness::handshake_prefix(sel);
        client.extend_from_slice(&input[1..]);
        let out = harness::session(&client);
        assert!(out.len() > GREETING_LEN);
        let cookie = 0x1122_3344_5566_7788u64.to_be_bytes();
        assert!(
            out.windows(8).any(|w| w == cookie),
            "selector {sel}: no reply to the READ after the handshake"
        );
    }
}
