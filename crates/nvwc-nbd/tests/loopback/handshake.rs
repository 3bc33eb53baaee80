//! Option negotiation: export lists, the default export, EXPORT_NAME, INFO
//! and GO replies, meta contexts, ABORT and the handshake timeout.

use std::sync::Arc;
use std::time::Duration;

use nvwc_nbd::proto::{
    self, info, opt, rep, ChunkPayload, ClientOption, Extent, InfoReply, InfoRequest,
    MetaContextEntry, MetaContextRequest, BASE_ALLOCATION,
};
use nvwc_nbd::{Client, ClientError, ExportInfo, MemoryExport, Server, ServerConfig};

use crate::bad_input::table_server;
use crate::common::*;
use crate::{mem, MIB};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_exports_and_default_export() {
    bounded(async {
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
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_name_handshake_with_and_without_zeroes() {
    bounded(async {
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
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opt_info_then_go_replies() {
    bounded(async {
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
        let (infos, fin) = r.opt_replies_until_final().await;
        assert_eq!(fin, rep::ACK);
        let infos: Vec<InfoReply> = infos
            .iter()
            .map(|(t, d)| {
                assert_eq!(*t, rep::INFO);
                InfoReply::decode_data(d).unwrap()
            })
            .collect();
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
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_meta_context_queries() {
    bounded(async {
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
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meta_context_for_other_export_does_not_enable_block_status() {
    bounded(async {
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
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opt_abort_is_acked_then_closed() {
    bounded(async {
        let ts = TestServer::start(vec![mem("", MIB)]).await;
        let mut r = Raw::connect(&ts.sock).await;
        r.send(&proto::encode_option(opt::ABORT, b"ignored data"))
            .await;
        let (h, d) = r.opt_reply().await;
        assert_eq!((h.option, h.reply_type, d.len()), (opt::ABORT, rep::ACK, 0));
        r.expect_closed().await;
        ts.assert_other_client_works("").await;
        ts.server.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_returns_all_exports() {
    bounded(async {
        let (ts, _) = table_server().await;
        let mut r = Raw::connect(&ts.sock).await;
        r.option(&ClientOption::List).await;
        let (v, fin) = r.opt_replies_until_final().await;
        assert_eq!(fin, rep::ACK);
        let names: Vec<String> = v
            .iter()
            .map(|(t, d)| {
                assert_eq!(*t, rep::SERVER);
                proto::ServerEntry::decode_data(d).unwrap().name
            })
            .collect();
        assert_eq!(names, vec!["", "aligned", "plain", "ro"]);
        ts.server.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_timeout_closes_idle_client() {
    bounded(async {
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
        ts.assert_other_client_works("").await;
        ts.server.shutdown().await;
    })
    .await
}
