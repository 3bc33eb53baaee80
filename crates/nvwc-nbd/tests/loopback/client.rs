//! Every command through the client (structured and simple replies),
//! concurrent processing, in-flight limits and reply order; and direct
//! writes (`Export::write_direct`): queued payloads taken by the export,
//! writes stopped half-way, declined and TCP writes, stalled payloads.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use nvwc_nbd::proto::{state, tx_flags, ChunkPayload, Extent};
use nvwc_nbd::{
    Client, ClientError, ClientOptions, ErrorCode, Server, ServerBuilder, ServerConfig,
    WriteZeroesFlags,
};
use tokio::io::AsyncWriteExt;

use crate::common::*;
use crate::exports::*;
use crate::{disconnected, gated_read, mem, serve, MIB};

bounded_test! {
    async fn client_all_commands_structured() {
        let m = mem("", MIB);
        let ts = serve(&m).await;
        let c = Client::connect(&ts.uri("")).await.unwrap();
        let d = c.info().clone();
        assert_eq!(c.size(), MIB);
        assert!(d.structured && d.base_allocation);
        assert!(d.can_flush() && d.can_fua() && d.can_trim() && d.can_zero());
        assert!(d.can_fast_zero() && d.can_cache() && d.can_multi_conn() && !d.read_only());
        assert_eq!(d.flags & tx_flags::SEND_DF, tx_flags::SEND_DF);
        assert_eq!((d.min_block, d.pref_block, d.max_block), (1, 4096, 1 << 25));

        // Fresh export: one hole+zero extent.
        assert_eq!(
            c.block_status(0, 65536, false).await.unwrap(),
            vec![Extent {
                len: 65536,
                flags: state::HOLE | state::ZERO
            }]
        );

        let data = random_bytes(10000, 1);
        c.write(5000, data.clone(), false).await.unwrap();
        assert_eq!(c.read(5000, 10000).await.unwrap(), data);
        assert_eq!(m.contents(5000, 10000), data);
        c.write(0, vec![1u8; 512], true).await.unwrap();
        assert_eq!(m.stats().fua_writes, 1);
        c.flush().await.unwrap();
        assert_eq!(m.stats().flushes, 1);

        // Pages 0..=3 are allocated now (bytes 0..15000).
        let st = c.block_status(0, 32768, false).await.unwrap();
        assert_eq!(
            st,
            vec![
                Extent {
                    len: 16384,
                    flags: 0
                },
                Extent {
                    len: 16384,
                    flags: state::HOLE | state::ZERO
                }
            ]
        );
        let one = c.block_status(0, 32768, true).await.unwrap();
        assert_eq!(
            one,
            vec![Extent {
                len: 16384,
                flags: 0
            }]
        );
        let one = c.block_status(20000, 100, true).await.unwrap();
        assert_eq!(one, vec![Extent { len: 100, flags: 3 }]);

        c.trim(4096, 8192, false).await.unwrap();
        assert_eq!(c.read(4096, 8192).await.unwrap(), vec![0u8; 8192]);
        c.write_zeroes(
            12288,
            4096,
            WriteZeroesFlags {
                fua: true,
                no_hole: true,
                fast_zero: true,
            },
        )
        .await
        .unwrap();
        assert_eq!(c.read(12288, 4096).await.unwrap(), vec![0u8; 4096]);
        c.cache(0, 4096).await.unwrap();
        // Zero-length read is answered by the server itself.
        assert_eq!(c.read(0, 0).await.unwrap().len(), 0);
        let s = m.stats();
        assert_eq!((s.trims, s.zeroes, s.fast_zeroes, s.caches), (1, 1, 1, 1));
        assert_eq!(s.connects, 1);

        c.disconnect().await.unwrap();
        assert!(c.is_closed());
        assert!(matches!(
            c.read(0, 1).await,
            Err(ClientError::Disconnected(_))
        ));
        // on_disconnect ran after the server closed.
        disconnected(&m, 1).await;
        ts.server.shutdown().await;
    }
}

bounded_test! {
    async fn client_all_commands_simple_replies() {
        let m = mem("", MIB);
        let ts = serve(&m).await;
        let opts = ClientOptions {
            structured_replies: false,
            ..Default::default()
        };
        let c = Client::connect_with(&ts.uri(""), opts).await.unwrap();
        assert!(!c.info().structured && !c.info().base_allocation);
        assert_eq!(
            c.info().flags & tx_flags::SEND_DF,
            0,
            "DF only with structured replies"
        );
        let data = random_bytes(70000, 2);
        c.write(100, data.clone(), true).await.unwrap();
        assert_eq!(c.read(100, 70000).await.unwrap(), data);
        c.flush().await.unwrap();
        c.trim(0, 4096, false).await.unwrap();
        c.write_zeroes(8192, 4096, WriteZeroesFlags::default())
            .await
            .unwrap();
        assert_eq!(c.read(8192, 4096).await.unwrap(), vec![0u8; 4096]);
        c.cache(0, 100).await.unwrap();
        assert!(matches!(
            c.block_status(0, 4096, false).await,
            Err(ClientError::Unsupported(_))
        ));
        c.disconnect().await.unwrap();
        ts.server.shutdown().await;
    }
}

bounded_test! {
    async fn requests_are_processed_concurrently() {
        const N: usize = 8;
        let e = ProbeExport::barrier(N);
        let ts = TestServer::start(vec![e]).await;
        let c = Arc::new(Client::connect(&ts.uri("")).await.unwrap());
        let mut set = tokio::task::JoinSet::new();
        for i in 0..N as u64 {
            let c = c.clone();
            set.spawn(async move { c.read(i * 4096, 4096).await });
        }
        // Each read only completes once all N are inside the export at once.
        let all = tokio::time::timeout(Duration::from_secs(5), async {
            let mut n = 0;
            while let Some(r) = set.join_next().await {
                assert_eq!(r.unwrap().unwrap(), vec![0x5a; 4096]);
                n += 1;
            }
            n
        })
        .await
        .expect("requests were not processed concurrently");
        assert_eq!(all, N);
        ts.server.shutdown().await;
    }
}

/// A server over a counting export (built with `limits`), and a client.
async fn counting(
    limits: impl FnOnce(ServerBuilder) -> ServerBuilder,
) -> (Arc<ProbeExport>, TestServer, Arc<Client>) {
    let e = ProbeExport::counting();
    let server = limits(Server::builder().export(e.clone())).build().unwrap();
    let ts = TestServer::start_with(server).await;
    let c = Arc::new(Client::connect(&ts.uri("")).await.unwrap());
    (e, ts, c)
}

bounded_test! {
    async fn in_flight_limit_is_respected() {
        let (e, ts, c) = counting(|b| b.max_in_flight(4)).await;
        let mut set = tokio::task::JoinSet::new();
        for i in 0..32u64 {
            let c = c.clone();
            set.spawn(async move { c.read(i * 512, 512).await });
        }
        while let Some(r) = set.join_next().await {
            r.unwrap().unwrap();
        }
        let max = e.max();
        assert!(max <= 4, "in-flight limit exceeded: {max}");
        assert!(max >= 2, "requests were not overlapped at all: {max}");
        ts.server.shutdown().await;
    }
}

bounded_test! {
    async fn in_flight_byte_budget_is_respected() {
        let (e, ts, c) = counting(|b| {
            b.config(ServerConfig {
                max_in_flight_bytes: 64 * 1024,
                ..Default::default()
            })
        })
        .await;
        let mut set = tokio::task::JoinSet::new();
        for i in 0..12u64 {
            let c = c.clone();
            set.spawn(async move { c.read(i * 32768, 32768).await.map(|d| d.len()) });
        }
        // Larger than the whole budget: admitted alone.
        let big = c.read(0, 256 * 1024).await.unwrap();
        assert_eq!(big.len(), 256 * 1024);
        while let Some(r) = set.join_next().await {
            assert_eq!(r.unwrap().unwrap(), 32768);
        }
        let max = e.max();
        assert!(
            max <= 2,
            "64 KiB budget admits at most two 32 KiB reads, saw {max}"
        );
        ts.server.shutdown().await;
    }
}

bounded_test! {
    async fn replies_are_sent_in_completion_order() {
        let (g, ts, mut r) = gated_read(true, 1, 512).await; // blocks at the gate
        r.request(req(0, 0, 2, 4096, 512), &[]).await;
        let (h, p) = r.chunk().await;
        assert_eq!(
            h.handle, 2,
            "the later, faster request must be answered first"
        );
        assert!(h.is_done());
        assert!(matches!(p, ChunkPayload::OffsetData { offset: 4096, .. }));
        g.open();
        let (h, p) = r.chunk().await;
        assert_eq!(h.handle, 1);
        assert_eq!(
            p,
            ChunkPayload::OffsetData {
                offset: 0,
                data: Bytes::from(vec![0u8; 512])
            }
        );
        ts.server.shutdown().await;
    }
}

bounded_test! {
    async fn disc_waits_for_in_flight_requests() {
        let (g, ts, mut r) = gated_read(false, 7, 16).await;
        r.request(req(2, 0, 8, 0, 0), &[]).await; // NBD_CMD_DISC
        tokio::time::sleep(Duration::from_millis(50)).await;
        g.open();
        let h = r.simple_reply().await;
        assert_eq!((h.handle, h.error), (7, 0));
        assert_eq!(r.read_n(16).await, vec![0u8; 16]);
        r.expect_closed().await;
        ts.server.shutdown().await;
    }
}

bounded_test! {
    async fn many_clients_concurrent_integrity() {
        let m = mem("", 4 * MIB);
        let ts = serve(&m).await;
        let mut set = tokio::task::JoinSet::new();
        for k in 0..4u64 {
            let uri = ts.uri("");
            set.spawn(async move {
                let c = Arc::new(Client::connect(&uri).await.unwrap());
                let mut inner = tokio::task::JoinSet::new();
                for i in 0..32u64 {
                    let c = c.clone();
                    inner.spawn(async move {
                        let off = k * MIB + i * 8192;
                        let d = random_bytes(8192, k * 1000 + i);
                        c.write(off, d.clone(), i % 3 == 0).await.unwrap();
                        assert_eq!(c.read(off, 8192).await.unwrap(), d);
                    });
                }
                while let Some(r) = inner.join_next().await {
                    r.unwrap();
                }
                c.flush().await.unwrap();
                c.disconnect().await.unwrap();
            });
        }
        while let Some(r) = set.join_next().await {
            r.unwrap();
        }
        for k in 0..4u64 {
            for i in 0..32u64 {
                assert_eq!(
                    m.contents(k * MIB + i * 8192, 8192),
                    random_bytes(8192, k * 1000 + i)
                );
            }
        }
        ts.server.shutdown().await;
        assert_eq!(ts.server.connections_accepted(), 4);
    }
}

bounded_test! {
    /// Large writes (whose next header the server reads unbuffered) pipelined
    /// with small writes, reads and flushes on one connection keep the stream in
    /// sync and the data intact.
    async fn pipelined_large_and_small_requests_stay_in_sync() {
        let m = mem("", 8 * MIB);
        let ts = serve(&m).await;
        let c = Arc::new(Client::connect(&ts.uri("")).await.unwrap());
        let mut set = tokio::task::JoinSet::new();
        for i in 0..48u64 {
            let c = c.clone();
            set.spawn(async move {
                let (off, len) = match i % 3 {
                    0 => (i * 128 * 1024, 64 * 1024),
                    1 => (i * 128 * 1024 + 70 * 1024, 512),
                    _ => (i * 128 * 1024 + 80 * 1024, 20 * 1024),
                };
                let d = random_bytes(len, 7000 + i);
                c.write(off, d.clone(), false).await.unwrap();
                if i % 4 == 0 {
                    c.flush().await.unwrap();
                }
                assert_eq!(c.read(off, len as u32).await.unwrap(), d);
                (off, len, i)
            });
        }
        let mut done = Vec::new();
        while let Some(r) = set.join_next().await {
            done.push(r.unwrap());
        }
        for (off, len, i) in done {
            assert_eq!(m.contents(off, len), random_bytes(len, 7000 + i));
        }
        c.disconnect().await.unwrap();
        ts.server.shutdown().await;
    }
}

bounded_test! {
    async fn tcp_loopback_listener() {
        let server = Server::builder().export(mem("", MIB)).build().unwrap();
        let addr = server.listen_tcp("127.0.0.1:0").await.unwrap();
        assert!(addr.ip().is_loopback());
        let c = Client::connect(&format!("nbd://127.0.0.1:{}/", addr.port()))
            .await
            .unwrap();
        c.write(0, vec![9u8; 4096], false).await.unwrap();
        assert_eq!(c.read(0, 4096).await.unwrap(), vec![9u8; 4096]);
        c.disconnect().await.unwrap();
        server.shutdown().await;
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }
}

// ---------------------------------------------------------------------------
// Direct writes
// ---------------------------------------------------------------------------

/// Three 64 KiB writes back to back (handles 0..3, at 0, 64 KiB, 128 KiB),
/// write `i` carrying `payload(i)`.
fn large_writes(payload: impl Fn(u64) -> Vec<u8>) -> Vec<u8> {
    let mut bytes = Vec::new();
    for i in 0..3u64 {
        bytes.extend_from_slice(&req(1, 0, i, i * 64 * 1024, 64 * 1024).encode());
        bytes.extend_from_slice(&payload(i));
    }
    bytes
}

/// A [`DirectExport`] of `size` bytes served, and a raw client that has
/// made one 64 KiB write, so that the server reads the next header
/// unbuffered; with the direct writes made so far.
async fn after_a_large_write(size: u64) -> (Arc<DirectExport>, TestServer, Raw, usize) {
    let e = DirectExport::new(size, DirectMode::All);
    let ts = serve(&e).await;
    let mut r = Raw::go(&ts.sock, "", false, false).await;
    r.request(req(1, 0, 1, 0, 64 * 1024), &[1; 64 * 1024]).await;
    assert_eq!(r.simple_reply().await.error, 0);
    let calls = e.direct_calls.load(Ordering::SeqCst);
    (e, ts, r, calls)
}

bounded_test! {
    /// Pipelined 64 KiB writes with small writes and reads over a unix socket:
    /// the export takes queued payloads directly, and everything reads back.
    async fn direct_writes_take_queued_payloads() {
        let e = DirectExport::new(16 * MIB, DirectMode::All);
        let ts = serve(&e).await;
        let mut r = Raw::go(&ts.sock, "", false, false).await;
        // Three large writes sent back to back: after the first, each header
        // is read unbuffered and its payload is already queued.
        let bytes = large_writes(|i| random_bytes(64 * 1024, 100 + i));
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
    }
}

bounded_test! {
    /// Direct writes whose payloads are followed by (part of) the next
    /// header on the socket: the server takes those bytes with the payload
    /// and reads the rest of the header later; every request is parsed from
    /// the right place, whichever way its header was split.
    async fn headers_behind_direct_payloads_stay_in_sync() {
        let (e, ts, mut r, calls) = after_a_large_write(8 * MIB).await;
        let mut stream = Vec::new();
        for i in 0..4u64 {
            stream.extend_from_slice(&req(1, 0, 10 + i, (1 + i) * MIB, 64 * 1024).encode());
            stream.extend_from_slice(&random_bytes(64 * 1024, 700 + i));
        }
        stream.extend_from_slice(&req(0, 0, 20, 2 * MIB, 512).encode());
        // Cut inside each header after the first: the bytes up to a cut are
        // queued behind a payload, the rest come later.
        let whole = 64 * 1024 + 28;
        let mut at = 0;
        for (i, cut) in [10usize, 1, 27, 28].into_iter().enumerate() {
            let end = (i + 1) * whole + cut;
            r.send(&stream[at..end]).await;
            at = end;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        r.send(&stream[at..]).await;
        for i in 0..4u64 {
            let h = r.simple_reply().await;
            assert_eq!((h.handle, h.error), (10 + i, 0));
        }
        let h = r.simple_reply().await;
        assert_eq!((h.handle, h.error), (20, 0));
        assert_eq!(r.read_n(512).await, random_bytes(64 * 1024, 701)[..512].to_vec());
        assert!(e.direct_calls.load(Ordering::SeqCst) > calls, "no direct write");
        for i in 0..4u64 {
            assert_eq!(
                e.inner.contents((1 + i) * MIB, 64 * 1024),
                random_bytes(64 * 1024, 700 + i)
            );
        }
        ts.assert_other_client_works_and_shut_down().await;
    }
}

bounded_test! {
    /// An export that stops receiving part-way: the write fails, the server
    /// discards the rest of its payload, and the connection stays in sync.
    async fn direct_write_stopped_half_way_keeps_the_stream_in_sync() {
        let e = DirectExport::new(4 * MIB, DirectMode::Half);
        let ts = serve(&e).await;
        let mut r = Raw::go(&ts.sock, "", false, false).await;
        let mut bytes = large_writes(|_| vec![0x5a; 64 * 1024]);
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
        ts.assert_other_client_works_and_shut_down().await;
    }
}

bounded_test! {
    /// Declined direct writes, and TCP connections (never offered one), take
    /// the buffered path.
    async fn declined_and_tcp_writes_take_the_buffered_path() {
        let e = DirectExport::new(4 * MIB, DirectMode::Decline);
        let ts = serve(&e).await;
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
    }
}

bounded_test! {
    /// A large write whose payload stops half-way: after a short wait for the
    /// rest, the server reads it the buffered way. If the rest comes later, the
    /// write lands whole; if the client hangs up instead, the export never sees
    /// the write and other clients are served.
    async fn stalled_large_write_payloads_are_read_buffered() {
        let (e, ts, mut r, calls) = after_a_large_write(4 * MIB).await;
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
        ts.assert_other_client_works_and_shut_down().await;
    }
}
