//! Replays the NBD fuzz targets' saved inputs through the fuzz harness
//! itself (`fuzz/src/nbd.rs`, included below: a real server on an in-memory
//! duplex stream): every crash cargo-fuzz ever found
//! (`fuzz/regressions/nbd_{handshake,requests}/`) and the hand-made seeds
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
