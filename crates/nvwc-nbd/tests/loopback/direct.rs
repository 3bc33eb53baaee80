//! Direct writes (`Export::write_direct`): queued payloads taken by the
//! export, writes stopped half-way, declined and TCP writes, stalled payloads.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use nvwc_nbd::{Client, ErrorCode, Server};
use tokio::io::AsyncWriteExt;

use crate::common::*;
use crate::exports::*;
use crate::MIB;

/// Pipelined 64 KiB writes with small writes and reads over a unix socket:
/// the export takes queued payloads directly, and everything reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_writes_take_queued_payloads() {
    bounded(async {
        let e = DirectExport::new(16 * MIB, DirectMode::All);
        let ts = TestServer::start(vec![e.clone()]).await;
        let mut r = Raw::go(&ts.sock, "", false, false).await;
        // Three large writes sent back to back: after the first, each header
        // is read unbuffered and its payload is already queued.
        let mut bytes = Vec::new();
        for i in 0..3u64 {
            bytes.extend_from_slice(&req(1, 0, i, i * 64 * 1024, 64 * 1024).encode());
            bytes.extend_from_slice(&random_bytes(64 * 1024, 100 + i));
        }
        r.send(&bytes).await;
        for _ in 0..3 {
            assert_eq!(r.simple_reply().await.error, 0);
        }
        assert!(
            e.direct_calls.load(Ordering::SeqCst) >= 1,
            "no direct write"
        );
        for i in 0..3u64 {
            assert_eq!(
                e.inner.contents(i * 64 * 1024, 64 * 1024),
                random_bytes(64 * 1024, 100 + i)
            );
        }
        // Mixed sizes through the client, with reads in between.
        let c = Arc::new(Client::connect(&ts.uri("")).await.unwrap());
        let mut set = tokio::task::JoinSet::new();
        for i in 0..48u64 {
            let c = c.clone();
            set.spawn(async move {
                let len = [64 * 1024, 512, 20 * 1024][i as usize % 3];
                let off = MIB + i * 128 * 1024;
                let d = random_bytes(len, 300 + i);
                c.write(off, d.clone(), false).await.unwrap();
                assert_eq!(c.read(off, len as u32).await.unwrap(), d);
            });
        }
        while let Some(r) = set.join_next().await {
            r.unwrap();
        }
        c.disconnect().await.unwrap();
        ts.server.shutdown().await;
    })
    .await
}

/// An export that stops receiving part-way: the write fails, the server
/// discards the rest of its payload, and the connection stays in sync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_write_stopped_half_way_keeps_the_stream_in_sync() {
    bounded(async {
        let e = DirectExport::new(4 * MIB, DirectMode::Half);
        let ts = TestServer::start(vec![e.clone()]).await;
        let mut r = Raw::go(&ts.sock, "", false, false).await;
        let mut bytes = Vec::new();
        for i in 0..3u64 {
            bytes.extend_from_slice(&req(1, 0, i, i * 64 * 1024, 64 * 1024).encode());
            bytes.extend_from_slice(&[0x5a; 64 * 1024]);
        }
        // A small write and a read after them must be parsed from the right place.
        bytes.extend_from_slice(&req(1, 0, 10, 3 * MIB, 512).encode());
        bytes.extend_from_slice(&[0x77; 512]);
        bytes.extend_from_slice(&req(0, 0, 11, 3 * MIB, 512).encode());
        r.send(&bytes).await;
        let mut errors = 0;
        for _ in 0..4 {
            let h = r.simple_reply().await;
            if h.error != 0 {
                errors += 1;
                assert_eq!(h.error, ErrorCode::Io as u32);
            }
        }
        let h = r.simple_reply().await;
        assert_eq!((h.handle, h.error), (11, 0));
        assert_eq!(r.read_n(512).await, vec![0x77; 512]);
        let calls = e.direct_calls.load(Ordering::SeqCst);
        assert!(calls >= 1, "no direct write");
        assert_eq!(
            errors, calls,
            "each direct write failed, the others did not"
        );
        ts.assert_other_client_works("").await;
        ts.server.shutdown().await;
    })
    .await
}

/// Declined direct writes, and TCP connections (never offered one), take
/// the buffered path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declined_and_tcp_writes_take_the_buffered_path() {
    bounded(async {
        let e = DirectExport::new(4 * MIB, DirectMode::Decline);
        let ts = TestServer::start(vec![e.clone()]).await;
        let c = Client::connect(&ts.uri("")).await.unwrap();
        for i in 0..8u64 {
            let d = random_bytes(64 * 1024, 500 + i);
            c.write(i * 64 * 1024, d.clone(), false).await.unwrap();
            assert_eq!(c.read(i * 64 * 1024, 64 * 1024).await.unwrap(), d);
        }
        c.disconnect().await.unwrap();
        ts.server.shutdown().await;

        let e = DirectExport::new(4 * MIB, DirectMode::All);
        let server = Server::builder().export(e.clone()).build().unwrap();
        let addr = server.listen_tcp("127.0.0.1:0").await.unwrap();
        let c = Client::connect(&format!("nbd://127.0.0.1:{}/", addr.port()))
            .await
            .unwrap();
        for i in 0..8u64 {
            let d = random_bytes(64 * 1024, 600 + i);
            c.write(i * 64 * 1024, d.clone(), false).await.unwrap();
            assert_eq!(c.read(i * 64 * 1024, 64 * 1024).await.unwrap(), d);
        }
        assert_eq!(e.direct_calls.load(Ordering::SeqCst), 0);
        c.disconnect().await.unwrap();
        server.shutdown().await;
    })
    .await
}

/// A large write whose payload stops half-way: after a short wait for the
/// rest, the server reads it the buffered way. If the rest comes later, the
/// write lands whole; if the client hangs up instead, the export never sees
/// the write and other clients are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_large_write_payloads_are_read_buffered() {
    bounded(async {
        let e = DirectExport::new(4 * MIB, DirectMode::All);
        let ts = TestServer::start(vec![e.clone()]).await;
        let mut r = Raw::go(&ts.sock, "", false, false).await;
        // A first large write, so the next header is read unbuffered.
        r.request(req(1, 0, 1, 0, 64 * 1024), &[1; 64 * 1024]).await;
        assert_eq!(r.simple_reply().await.error, 0);
        let calls = e.direct_calls.load(Ordering::SeqCst);
        let d = random_bytes(64 * 1024, 42);
        let mut first = req(1, 0, 2, MIB, 64 * 1024).encode().to_vec();
        first.extend_from_slice(&d[..32 * 1024]);
        r.send(&first).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        r.send(&d[32 * 1024..]).await;
        assert_eq!(r.simple_reply().await.error, 0);
        assert_eq!(
            e.direct_calls.load(Ordering::SeqCst),
            calls,
            "taken directly"
        );
        assert_eq!(e.inner.contents(MIB, 64 * 1024), d);
        // Hang up half-way through the next one.
        let mut half = req(1, 0, 3, 2 * MIB, 64 * 1024).encode().to_vec();
        half.extend_from_slice(&[0xee; 32 * 1024]);
        r.send(&half).await;
        r.s.shutdown().await.unwrap();
        r.expect_closed().await;
        assert_eq!(e.direct_calls.load(Ordering::SeqCst), calls);
        assert_eq!(e.inner.contents(2 * MIB, 64 * 1024), vec![0; 64 * 1024]);
        ts.assert_other_client_works("").await;
        ts.server.shutdown().await;
    })
    .await
}
