//! A connection's life: option negotiation (export lists, the default
//! export, EXPORT_NAME, INFO and GO replies, meta contexts, ABORT, the
//! handshake timeout), then graceful shutdown, disconnects at any point,
//! export bugs, the client's own checks and the builder's refusals.

use std::sync::Arc;
use std::time::Duration;

use nvwc_nbd::proto::{
    self, info, opt, rep, ChunkPayload, ClientOption, Extent, InfoReply, InfoRequest,
    MetaContextEntry, MetaContextRequest, BASE_ALLOCATION,
};
use nvwc_nbd::{
    Client, ClientError, ClientOptions, ErrorCode, Export, ExportInfo, MemoryExport, Server,
    ServerConfig, WriteZeroesFlags,
};
use tokio::io::AsyncWriteExt;

use crate::bad_input::{table_server, READ, WRITE};
use crate::common::*;
use crate::exports::*;
use crate::{disconnected, gated_read, mem, serve, MIB};

bounded_test! {
    async fn list_exports_and_default_export() {
        let mut a = ExportInfo::new("alpha", MIB);
        a.description = "disk A".into();
        let b = ExportInfo::new("beta", 2 * MIB);
        let server = Server::builder()
            .export(Arc::new(MemoryExport::new(a)))
            .export(Arc::new(MemoryExport::new(b)))
            .default_export("beta")
            .build()
            .unwrap();
        let ts = TestServer::start_with(server).await;
        let list = Client::list_exports(&ts.uri("")).await.unwrap();
        let got: Vec<(String, String)> =
            list.into_iter().map(|e| (e.name, e.description)).collect();
        assert_eq!(
            got,
            vec![
                ("alpha".into(), "disk A".into()),
                ("beta".into(), String::new())
            ]
        );
        let c = Client::connect(&ts.uri("")).await.unwrap();
        assert_eq!(c.info().name, "beta");
        assert_eq!(c.size(), 2 * MIB);
        let c2 = Client::connect(&ts.uri("alpha")).await.unwrap();
        assert_eq!(c2.info().description, "disk A");
        assert_eq!(c2.size(), MIB);
        match Client::connect(&ts.uri("nope")).await {
            Err(ClientError::OptionRejected {
                option, reply_type, ..
            }) => {
                assert_eq!((option, reply_type), (opt::GO, rep::ERR_UNKNOWN));
            }
            other => panic!("expected ERR_UNKNOWN, got {other:?}"),
        }
        ts.server.shutdown().await;
    }
}

bounded_test! {
    async fn export_name_handshake_with_and_without_zeroes() {
        let ts = TestServer::start(vec![mem("", MIB)]).await;
        for no_zeroes in [true, false] {
            let (mut r, _) = Raw::connect_bare(&ts.sock).await;
            let cf = if no_zeroes { 3 } else { 1 };
            r.send(&proto::encode_client_flags(cf)).await;
            r.option(&ClientOption::ExportName(String::new())).await;
            let n = if no_zeroes { 10 } else { 134 };
            let b = r.read_n(n).await;
            let (size, flags) = proto::decode_export_name_reply(&b).unwrap();
            assert_eq!(size, MIB);
            assert_eq!(flags, 0x0d6d);
            assert!(b[10..].iter().all(|&z| z == 0));
            // Transmission works with simple replies.
            r.request(req(0, 0, 5, 0, 4), &[]).await;
            let h = r.simple_reply().await;
            assert_eq!((h.handle, h.error), (5, 0));
            assert_eq!(r.read_n(4).await, vec![0; 4]);
        }
        ts.server.shutdown().await;
    }
}

bounded_test! {
    async fn opt_info_then_go_replies() {
        let mut i = ExportInfo::new("disk", MIB).with_all_features();
        i.description = "the disk".into();
        i.min_block = 512;
        let ts = TestServer::start(vec![Arc::new(MemoryExport::new(i))]).await;
        let mut r = Raw::connect(&ts.sock).await;
        let req_info = InfoRequest {
            name: "disk".into(),
            requests: vec![info::NAME, info::DESCRIPTION, info::BLOCK_SIZE],
        };
        r.option(&ClientOption::Info(req_info.clone())).await;
        let infos = r
            .acked_replies(rep::INFO, |d| InfoReply::decode_data(d).unwrap())
            .await;
        assert_eq!(
            infos,
            vec![
                InfoReply::Export {
                    size: MIB,
                    flags: 0x0d6d
                },
                InfoReply::Name("disk".into()),
                InfoReply::Description("the disk".into()),
                InfoReply::BlockSize {
                    min: 512,
                    preferred: 4096,
                    max: 1 << 25
                },
            ]
        );
        // Still in option haggling: GO works afterwards.
        r.option(&ClientOption::Go(req_info)).await;
        let (_, fin) = r.opt_replies_until_final().await;
        assert_eq!(fin, rep::ACK);
        r.request(req(0, 0, 1, 512, 512), &[]).await;
        assert_eq!(r.simple_reply().await.error, 0);
        ts.server.shutdown().await;
    }
}

bounded_test! {
    async fn list_meta_context_queries() {
        let ts = TestServer::start(vec![mem("", MIB)]).await;
        let mut r = Raw::connect(&ts.sock).await;
        r.option(&ClientOption::StructuredReply).await;
        assert_eq!(r.opt_reply().await.0.reply_type, rep::ACK);
        let cases: [(&[&str], bool); 4] = [
            (&[], true),
            (&["base:"], true),
            (&["base:allocation"], true),
            (&["x-foo:bar", "qemu:dirty-bitmap:a"], false),
        ];
        for (queries, expect) in cases {
            r.option(&ClientOption::ListMetaContext(MetaContextRequest {
                export: String::new(),
                queries: queries.iter().map(|s| s.to_string()).collect(),
            }))
            .await;
            let (v, fin) = r.opt_replies_until_final().await;
            assert_eq!(fin, rep::ACK);
            if expect {
                assert_eq!(v.len(), 1, "{queries:?}");
                assert_eq!(v[0].0, rep::META_CONTEXT);
                let e = MetaContextEntry::decode_data(&v[0].1).unwrap();
                assert_eq!(e.name, BASE_ALLOCATION);
                assert_eq!(e.id, 0);
            } else {
                assert!(v.is_empty(), "{queries:?}");
            }
        }
        // SET selects with a nonzero id; block status then works.
        r.option(&ClientOption::SetMetaContext(MetaContextRequest {
            export: String::new(),
            queries: vec![BASE_ALLOCATION.into()],
        }))
        .await;
        let (v, fin) = r.opt_replies_until_final().await;
        assert_eq!(fin, rep::ACK);
        let e = MetaContextEntry::decode_data(&v[0].1).unwrap();
        assert_eq!(e.id, 1);
        r.option(&ClientOption::Go(InfoRequest {
            name: String::new(),
            requests: vec![],
        }))
        .await;
        assert_eq!(r.opt_replies_until_final().await.1, rep::ACK);
        r.request(req(7, 0, 3, 0, 4096), &[]).await;
        let (h, p) = r.chunk().await;
        assert!(h.is_done());
        assert_eq!(
            p,
            ChunkPayload::BlockStatus {
                context_id: 1,
                extents: vec![Extent {
                    len: 4096,
                    flags: 3
                }]
            }
        );
        ts.server.shutdown().await;
    }
}

bounded_test! {
    async fn meta_context_for_other_export_does_not_enable_block_status() {
        let server = Server::builder()
            .export(mem("a", MIB))
            .export(mem("b", MIB))
            .build()
            .unwrap();
        let ts = TestServer::start_with(server).await;
        let mut r = Raw::connect(&ts.sock).await;
        r.option(&ClientOption::StructuredReply).await;
        r.opt_reply().await;
        r.option(&ClientOption::SetMetaContext(MetaContextRequest {
            export: "a".into(),
            queries: vec![BASE_ALLOCATION.into()],
        }))
        .await;
        assert_eq!(r.opt_replies_until_final().await.1, rep::ACK);
        r.option(&ClientOption::Go(InfoRequest {
            name: "b".into(),
            requests: vec![],
        }))
        .await;
        assert_eq!(r.opt_replies_until_final().await.1, rep::ACK);
        r.request(req(7, 0, 3, 0, 4096), &[]).await;
        let (_, p) = r.chunk().await;
        assert!(matches!(p, ChunkPayload::Error { error: 22, .. }), "{p:?}");
        ts.server.shutdown().await;
    }
}

bounded_test! {
    async fn opt_abort_is_acked_then_closed() {
        let ts = TestServer::start(vec![mem("", MIB)]).await;
        let mut r = Raw::connect(&ts.sock).await;
        r.send(&proto::encode_option(opt::ABORT, b"ignored data"))
            .await;
        let (h, d) = r.opt_reply().await;
        assert_eq!((h.option, h.reply_type, d.len()), (opt::ABORT, rep::ACK, 0));
        r.expect_closed().await;
        ts.assert_other_client_works_and_shut_down().await;
    }
}

bounded_test! {
    async fn list_returns_all_exports() {
        let (ts, _) = table_server().await;
        let mut r = Raw::connect(&ts.sock).await;
        r.option(&ClientOption::List).await;
        let names = r
            .acked_replies(rep::SERVER, |d| {
                proto::ServerEntry::decode_data(d).unwrap().name
            })
            .await;
        assert_eq!(names, vec!["", "aligned", "plain", "ro"]);
        ts.server.shutdown().await;
    }
}

bounded_test! {
    async fn handshake_timeout_closes_idle_client() {
        let server = Server::builder()
            .export(mem("", MIB))
            .config(ServerConfig {
                handshake_timeout: Some(Duration::from_millis(200)),
                ..Default::default()
            })
            .build()
            .unwrap();
        let ts = TestServer::start_with(server).await;
        let mut r = Raw::connect(&ts.sock).await;
        r.expect_closed().await;
        ts.assert_other_client_works_and_shut_down().await;
    }
}

// ---------------------------------------------------------------------------
// Shutdown, disconnects, bugs
// ---------------------------------------------------------------------------

bounded_test! {
    async fn graceful_shutdown_finishes_in_flight_and_answers_eshutdown() {
        let (g, ts, mut r) = gated_read(true, 1, 512).await;
        // A connection idling in the handshake is closed by shutdown.
        let mut idle = Raw::connect(&ts.sock).await;

        let server = ts.server.clone();
        let sd = tokio::spawn(async move { server.shutdown().await });
        while !ts.server.is_shutting_down() {
            tokio::task::yield_now().await;
        }
        // New requests get ESHUTDOWN...
        r.request(req(0, 0, 2, 4096, 512), &[]).await;
        let (h, p) = r.chunk().await;
        assert_eq!(h.handle, 2);
        assert!(matches!(p, ChunkPayload::Error { error: 108, .. }), "{p:?}");
        idle.expect_closed().await;
        assert!(
            !sd.is_finished(),
            "shutdown must wait for the in-flight read"
        );
        // ...while the in-flight one completes normally.
        g.open();
        let (h, p) = r.chunk().await;
        assert_eq!(h.handle, 1);
        assert!(matches!(p, ChunkPayload::OffsetData { offset: 0, .. }));
        r.expect_closed().await;
        sd.await.unwrap();
        assert_eq!(ts.server.active_tasks(), 0);
        assert!(!ts.sock.exists(), "unix socket removed");
        assert!(Client::connect(&ts.uri("")).await.is_err());
    }
}

bounded_test! {
    async fn export_bugs_become_errors_not_crashes() {
        let mut i = ExportInfo::new("", MIB).with_all_features();
        i.name = String::new();
        let e = Arc::new(BuggyExport {
            inner: MemoryExport::new(i),
        });
        let ts = TestServer::start(vec![e]).await;
        let c = Client::connect(&ts.uri("")).await.unwrap();
        // Panic inside the export -> EIO, connection survives.
        assert_eq!(
            c.read(0, 512).await.unwrap_err().nbd_code(),
            Some(ErrorCode::Io)
        );
        // Short read -> EIO.
        assert_eq!(
            c.read(512, 512).await.unwrap_err().nbd_code(),
            Some(ErrorCode::Io)
        );
        // Empty block status -> EIO.
        assert_eq!(
            c.block_status(0, 512, false).await.unwrap_err().nbd_code(),
            Some(ErrorCode::Io)
        );
        // Export-reported ENOTSUP for fast zero passes through.
        let f = WriteZeroesFlags {
            fast_zero: true,
            ..Default::default()
        };
        assert_eq!(
            c.write_zeroes(0, 512, f).await.unwrap_err().nbd_code(),
            Some(ErrorCode::NotSup)
        );
        c.write(4096, vec![1u8; 512], false).await.unwrap();
        assert_eq!(c.read(4096, 512).await.unwrap(), vec![1u8; 512]);
        ts.server.shutdown().await;
    }
}

bounded_test! {
    async fn client_enforces_size_constraints_locally() {
        let mut i = ExportInfo::new("", MIB);
        i.min_block = 512;
        i.max_block = 65536;
        let plain = Arc::new(MemoryExport::new(i));
        let ts = serve(&plain).await;
        let c = Client::connect(&ts.uri("")).await.unwrap();
        assert_eq!((c.info().min_block, c.info().max_block), (512, 65536));
        let inval = |r: Result<(), ClientError>| {
            assert!(matches!(r, Err(ClientError::InvalidArgument(_))), "{r:?}")
        };
        inval(c.read(MIB, 512).await.map(|_| ()));
        inval(c.read(u64::MAX - 100, 512).await.map(|_| ()));
        inval(c.read(100, 512).await.map(|_| ()));
        inval(c.read(0, 131072).await.map(|_| ()));
        inval(c.write(0, vec![0u8; 131072], false).await);
        assert!(matches!(
            c.write(0, vec![0u8; 512], true).await,
            Err(ClientError::Unsupported("FUA"))
        ));
        assert!(matches!(c.flush().await, Err(ClientError::Unsupported(_))));
        assert!(matches!(
            c.trim(0, 512, false).await,
            Err(ClientError::Unsupported(_))
        ));
        assert!(matches!(
            c.write_zeroes(0, 512, WriteZeroesFlags::default()).await,
            Err(ClientError::Unsupported(_))
        ));
        assert!(matches!(
            c.cache(0, 512).await,
            Err(ClientError::Unsupported(_))
        ));
        // Nothing reached the export.
        assert_eq!(plain.stats().reads + plain.stats().writes, 0);
        ts.server.shutdown().await;
    }
}

bounded_test! {
    async fn dropped_client_soft_disconnects() {
        let m = mem("", MIB);
        let ts = serve(&m).await;
        {
            let c = Client::connect(&ts.uri("")).await.unwrap();
            c.write(0, vec![1u8; 16], false).await.unwrap();
        }
        disconnected(&m, 1).await;
        ts.server.shutdown().await;
    }
}

bounded_test! {
    async fn cancelled_request_does_not_break_connection() {
        let g = GateExport::new(MIB);
        let ts = serve(&g).await;
        let c = Arc::new(Client::connect(&ts.uri("")).await.unwrap());
        // Start a read that blocks in the export, then drop its future.
        let c2 = c.clone();
        let t = tokio::spawn(async move { c2.read(0, 512).await });
        g.entered.notified().await;
        t.abort();
        let _ = t.await;
        // Its reply still arrives later and must be parsed and discarded.
        g.open();
        c.write(4096, vec![3u8; 512], false).await.unwrap();
        assert_eq!(c.read(4096, 512).await.unwrap(), vec![3u8; 512]);
        assert_eq!(c.read(0, 512).await.unwrap(), vec![0u8; 512]);
        assert_eq!(c.in_flight(), 0);
        c.disconnect().await.unwrap();
        ts.server.shutdown().await;
    }
}

/// A fake server that completes the handshake (no structured replies), then
/// answers the first request with a corrupted reply magic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_detects_server_protocol_violation() {
    use tokio::io::AsyncReadExt;
    bounded(async {
        let (cs, mut ss) = tokio::io::duplex(1 << 16);
        let fake = tokio::spawn(async move {
            ss.write_all(&proto::encode_server_greeting(3))
                .await
                .unwrap();
            let mut b4 = [0u8; 4];
            ss.read_exact(&mut b4).await.unwrap();
            loop {
                let mut h = [0u8; 16];
                ss.read_exact(&mut h).await.unwrap();
                let h = proto::OptionHeader::decode(&h).unwrap();
                let mut d = vec![0u8; h.length as usize];
                ss.read_exact(&mut d).await.unwrap();
                if h.option == opt::GO {
                    let i = InfoReply::Export {
                        size: MIB,
                        flags: 1,
                    };
                    ss.write_all(&proto::encode_option_reply(
                        opt::GO,
                        rep::INFO,
                        &i.encode_data(),
                    ))
                    .await
                    .unwrap();
                    ss.write_all(&proto::encode_option_reply(opt::GO, rep::ACK, &[]))
                        .await
                        .unwrap();
                    break;
                }
                ss.write_all(&proto::encode_option_reply(h.option, rep::ERR_UNSUP, &[]))
                    .await
                    .unwrap();
            }
            let mut r = [0u8; 28];
            ss.read_exact(&mut r).await.unwrap();
            ss.write_all(&[0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1])
                .await
                .unwrap();
            // Keep the stream open until the client gives up.
            let mut rest = Vec::new();
            let _ = ss.read_to_end(&mut rest).await;
        });
        let c = Client::from_stream(cs, "", ClientOptions::default())
            .await
            .unwrap();
        assert!(!c.info().structured);
        match c.read(0, 16).await {
            Err(ClientError::Disconnected(reason)) => {
                assert!(reason.contains("magic"), "{reason}")
            }
            other => panic!("expected protocol failure, got {other:?}"),
        }
        assert!(c.is_closed());
        drop(c);
        let _ = fake.await;
    })
    .await
}
bounded_test! {
    async fn corrupted_request_magic_disconnects_only_that_client() {
        let (ts, _) = table_server().await;
        let mut other = Raw::go(&ts.sock, "", false, false).await;
        let mut r = Raw::go(&ts.sock, "", false, false).await;
        let mut b = req(READ, 0, 1, 0, 8).encode();
        b[3] = 0x14; // 0x25609514: reserved, never valid on the wire
        r.send(&b).await;
        r.expect_closed().await;
        // A client that was already connected is unaffected.
        other.request(req(READ, 0, 2, 0, 8), &[]).await;
        assert_eq!(other.simple_reply().await.error, 0);
        ts.assert_other_client_works_and_shut_down().await;
    }
}

bounded_test! {
    async fn disconnect_mid_write_payload_ends_only_that_connection() {
        let (ts, default) = table_server().await;
        let mut r = Raw::go(&ts.sock, "", false, false).await;
        r.request(req(WRITE, 0, 1, 0, 4096), &[0xab; 100]).await;
        r.s.shutdown().await.unwrap(); // half-close: no more bytes will come
        r.expect_closed().await;
        assert_eq!(
            default.stats().writes,
            0,
            "partial write MUST NOT reach the export"
        );
        ts.assert_other_client_works("").await;
        assert_eq!(default.contents(0, 100), vec![0u8; 100]);
        ts.server.shutdown().await;
    }
}

bounded_test! {
    async fn disconnect_mid_request_header_ends_only_that_connection() {
        let (ts, _) = table_server().await;
        let mut r = Raw::go(&ts.sock, "", true, false).await;
        r.send(&req(READ, 0, 1, 0, 8).encode()[..10]).await;
        drop(r);
        ts.assert_other_client_works_and_shut_down().await;
    }
}

// ---------------------------------------------------------------------------
// Bad input table: handshake phase
// ---------------------------------------------------------------------------

/// Send raw option bytes, expect a final reply of `want`, then check that a
#[test]
fn builder_rejects_invalid_configuration() {
    use nvwc_nbd::ServerError;
    let r = Server::builder()
        .export(mem("a", MIB))
        .export(mem("a", MIB))
        .build();
    assert!(matches!(r, Err(ServerError::DuplicateExport(n)) if n == "a"));
    let mut bad = ExportInfo::new("x", MIB);
    bad.min_block = 3;
    let r = Server::builder()
        .export(Arc::new(MemoryExport::new(bad)))
        .build();
    assert!(matches!(r, Err(ServerError::InvalidExport { .. })));
    let r = Server::builder()
        .export(mem("a", MIB))
        .default_export("b")
        .build();
    assert!(matches!(r, Err(ServerError::UnknownDefault(_))));
    let r = Server::builder().max_in_flight(0).build();
    assert!(matches!(r, Err(ServerError::InvalidConfig(_))));
}

#[test]
fn public_types_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Client>();
    assert_send_sync::<Server>();
    assert_send_sync::<MemoryExport>();
    assert_send_sync::<Arc<dyn Export>>();
    assert_send_sync::<ClientError>();
}
