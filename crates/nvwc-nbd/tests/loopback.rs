//! Our server + our client (and a raw byte-level driver) over unix sockets.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use nvwc_nbd::proto::{
    self, chunk_type, cmd_flags, info, opt, rep, state, tx_flags, ChunkPayload, ClientOption,
    Extent, InfoReply, InfoRequest, MetaContextEntry, MetaContextRequest, BASE_ALLOCATION,
};
use nvwc_nbd::{
    BoxFuture, Client, ClientError, ClientOptions, DirectSource, ErrorCode, Export, ExportInfo,
    MemoryExport, NbdError, NbdResult, RequestCtx, Server, ServerConfig, WriteZeroesFlags,
};
use tokio::io::AsyncWriteExt;
use tokio::sync::{Barrier, Notify};

const MIB: u64 = 1 << 20;

fn mem(name: &str, size: u64) -> Arc<MemoryExport> {
    Arc::new(MemoryExport::with_size(name, size))
}

// ---------------------------------------------------------------------------
// Helper exports
// ---------------------------------------------------------------------------

/// Reads at offset 0 block until `gate` is opened; everything else is memory.
struct GateExport {
    inner: MemoryExport,
    gate: Notify,
    opened: std::sync::atomic::AtomicBool,
    entered: Notify,
}

impl GateExport {
    fn new(size: u64) -> Arc<Self> {
        Arc::new(GateExport {
            inner: MemoryExport::with_size("", size),
            gate: Notify::new(),
            opened: false.into(),
            entered: Notify::new(),
        })
    }
    fn open(&self) {
        self.opened.store(true, Ordering::SeqCst);
        self.gate.notify_waiters();
    }
}

impl Export for GateExport {
    fn info(&self) -> ExportInfo {
        self.inner.info()
    }
    fn read(&self, ctx: RequestCtx, offset: u64, len: u32) -> BoxFuture<'_, NbdResult<Bytes>> {
        Box::pin(async move {
            if offset == 0 {
                let n = self.gate.notified();
                self.entered.notify_one();
                if !self.opened.load(Ordering::SeqCst) {
                    n.await;
                }
            }
            self.inner.read(ctx, offset, len).await
        })
    }
    fn write(
        &self,
        ctx: RequestCtx,
        offset: u64,
        data: Bytes,
        fua: bool,
    ) -> BoxFuture<'_, NbdResult<()>> {
        self.inner.write(ctx, offset, data, fua)
    }
}

/// Every read waits at a barrier of `n`: completes only if n reads are in flight at once.
struct BarrierExport {
    info: ExportInfo,
    barrier: Barrier,
}

impl Export for BarrierExport {
    fn info(&self) -> ExportInfo {
        self.info.clone()
    }
    fn read(&self, _ctx: RequestCtx, _offset: u64, len: u32) -> BoxFuture<'_, NbdResult<Bytes>> {
        Box::pin(async move {
            self.barrier.wait().await;
            Ok(Bytes::from(vec![0x5a; len as usize]))
        })
    }
    fn write(&self, _: RequestCtx, _: u64, _: Bytes, _: bool) -> BoxFuture<'_, NbdResult<()>> {
        Box::pin(async { Ok(()) })
    }
}

/// Tracks the maximum number of concurrently running reads.
struct CountingExport {
    info: ExportInfo,
    cur: AtomicUsize,
    max: AtomicUsize,
}

impl Export for CountingExport {
    fn info(&self) -> ExportInfo {
        self.info.clone()
    }
    fn read(&self, _ctx: RequestCtx, _offset: u64, len: u32) -> BoxFuture<'_, NbdResult<Bytes>> {
        Box::pin(async move {
            let now = self.cur.fetch_add(1, Ordering::SeqCst) + 1;
            self.max.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            self.cur.fetch_sub(1, Ordering::SeqCst);
            Ok(Bytes::from(vec![0; len as usize]))
        })
    }
    fn write(&self, _: RequestCtx, _: u64, _: Bytes, _: bool) -> BoxFuture<'_, NbdResult<()>> {
        Box::pin(async { Ok(()) })
    }
}

/// Panics on reads at offset 0, returns a short buffer at offset 512,
/// an empty extent list for block status, and ENOTSUP for fast zero.
struct BuggyExport {
    inner: MemoryExport,
}

impl Export for BuggyExport {
    fn info(&self) -> ExportInfo {
        self.inner.info()
    }
    fn read(&self, ctx: RequestCtx, offset: u64, len: u32) -> BoxFuture<'_, NbdResult<Bytes>> {
        if offset == 0 {
            panic!("deliberate test panic in export read");
        }
        if offset == 512 {
            return Box::pin(async { Ok(Bytes::from_static(b"short")) });
        }
        self.inner.read(ctx, offset, len)
    }
    fn write(
        &self,
        ctx: RequestCtx,
        offset: u64,
        data: Bytes,
        fua: bool,
    ) -> BoxFuture<'_, NbdResult<()>> {
        self.inner.write(ctx, offset, data, fua)
    }
    fn write_zeroes(
        &self,
        ctx: RequestCtx,
        offset: u64,
        len: u32,
        flags: WriteZeroesFlags,
    ) -> BoxFuture<'_, NbdResult<()>> {
        if flags.fast_zero {
            return Box::pin(async { Err(NbdError::notsup("zeroing is not fast here")) });
        }
        self.inner.write_zeroes(ctx, offset, len, flags)
    }
    fn block_status(&self, _: RequestCtx, _: u64, _: u32) -> BoxFuture<'_, NbdResult<Vec<Extent>>> {
        Box::pin(async { Ok(vec![]) })
    }
}

// ---------------------------------------------------------------------------
// Happy paths
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_all_commands_structured() {
    bounded(async {
        let m = mem("", MIB);
        let ts = TestServer::start(vec![m.clone()]).await;
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
        for _ in 0..100 {
            if m.stats().disconnects == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(m.stats().disconnects, 1);
        ts.server.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_all_commands_simple_replies() {
    bounded(async {
        let m = mem("", MIB);
        let ts = TestServer::start(vec![m.clone()]).await;
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
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_processed_concurrently() {
    bounded(async {
        const N: usize = 8;
        let e = Arc::new(BarrierExport {
            info: ExportInfo::new("", MIB),
            barrier: Barrier::new(N),
        });
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
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_limit_is_respected() {
    bounded(async {
        let e = Arc::new(CountingExport {
            info: ExportInfo::new("", MIB),
            cur: 0.into(),
            max: 0.into(),
        });
        let server = Server::builder()
            .export(e.clone())
            .max_in_flight(4)
            .build()
            .unwrap();
        let ts = TestServer::start_with(server).await;
        let c = Arc::new(Client::connect(&ts.uri("")).await.unwrap());
        let mut set = tokio::task::JoinSet::new();
        for i in 0..32u64 {
            let c = c.clone();
            set.spawn(async move { c.read(i * 512, 512).await });
        }
        while let Some(r) = set.join_next().await {
            r.unwrap().unwrap();
        }
        let max = e.max.load(Ordering::SeqCst);
        assert!(max <= 4, "in-flight limit exceeded: {max}");
        assert!(max >= 2, "requests were not overlapped at all: {max}");
        ts.server.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_byte_budget_is_respected() {
    bounded(async {
        let e = Arc::new(CountingExport {
            info: ExportInfo::new("", MIB),
            cur: 0.into(),
            max: 0.into(),
        });
        let server = Server::builder()
            .export(e.clone())
            .config(ServerConfig {
                max_in_flight_bytes: 64 * 1024,
                ..Default::default()
            })
            .build()
            .unwrap();
        let ts = TestServer::start_with(server).await;
        let c = Arc::new(Client::connect(&ts.uri("")).await.unwrap());
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
        let max = e.max.load(Ordering::SeqCst);
        assert!(
            max <= 2,
            "64 KiB budget admits at most two 32 KiB reads, saw {max}"
        );
        ts.server.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_are_sent_in_completion_order() {
    bounded(async {
        let g = GateExport::new(MIB);
        let ts = TestServer::start(vec![g.clone()]).await;
        let mut r = Raw::go(&ts.sock, "", true, false).await;
        r.request(req(0, 0, 1, 0, 512), &[]).await; // blocks at the gate
        g.entered.notified().await;
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
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disc_waits_for_in_flight_requests() {
    bounded(async {
        let g = GateExport::new(MIB);
        let ts = TestServer::start(vec![g.clone()]).await;
        let mut r = Raw::go(&ts.sock, "", false, false).await;
        r.request(req(0, 0, 7, 0, 16), &[]).await;
        g.entered.notified().await;
        r.request(req(2, 0, 8, 0, 0), &[]).await; // NBD_CMD_DISC
        tokio::time::sleep(Duration::from_millis(50)).await;
        g.open();
        let h = r.simple_reply().await;
        assert_eq!((h.handle, h.error), (7, 0));
        assert_eq!(r.read_n(16).await, vec![0u8; 16]);
        r.expect_closed().await;
        ts.server.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_concurrent_integrity() {
    bounded(async {
        let m = mem("", 4 * MIB);
        let ts = TestServer::start(vec![m.clone()]).await;
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
    })
    .await
}

/// Large writes (whose next header the server reads unbuffered) pipelined
/// with small writes, reads and flushes on one connection keep the stream in
/// sync and the data intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_large_and_small_requests_stay_in_sync() {
    bounded(async {
        let m = mem("", 8 * MIB);
        let ts = TestServer::start(vec![m.clone()]).await;
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
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_loopback_listener() {
    bounded(async {
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
    })
    .await
}

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
async fn graceful_shutdown_finishes_in_flight_and_answers_eshutdown() {
    bounded(async {
        let g = GateExport::new(MIB);
        let ts = TestServer::start(vec![g.clone()]).await;
        let mut r = Raw::go(&ts.sock, "", true, false).await;
        // A connection idling in the handshake is closed by shutdown.
        let mut idle = Raw::connect(&ts.sock).await;
        r.request(req(0, 0, 1, 0, 512), &[]).await;
        g.entered.notified().await;

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
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_bugs_become_errors_not_crashes() {
    bounded(async {
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
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_enforces_size_constraints_locally() {
    bounded(async {
        let mut i = ExportInfo::new("", MIB);
        i.min_block = 512;
        i.max_block = 65536;
        let plain = Arc::new(MemoryExport::new(i));
        let ts = TestServer::start(vec![plain.clone()]).await;
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
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_client_soft_disconnects() {
    bounded(async {
        let m = mem("", MIB);
        let ts = TestServer::start(vec![m.clone()]).await;
        {
            let c = Client::connect(&ts.uri("")).await.unwrap();
            c.write(0, vec![1u8; 16], false).await.unwrap();
        }
        for _ in 0..200 {
            if m.stats().disconnects == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(m.stats().disconnects, 1);
        ts.server.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_request_does_not_break_connection() {
    bounded(async {
        let g = GateExport::new(MIB);
        let ts = TestServer::start(vec![g.clone()]).await;
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
    })
    .await
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

// ---------------------------------------------------------------------------
// Bad input table: transmission phase
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
enum Expect {
    /// Error reply with this code; the connection keeps working.
    Err(ErrorCode),
}

struct Case {
    export: &'static str,
    structured: bool,
    meta: bool,
    hdr: proto::RequestHeader,
    payload: Vec<u8>,
    expect: Expect,
}

fn case(export: &'static str, structured: bool, hdr: proto::RequestHeader, expect: Expect) -> Case {
    let payload = if hdr.command == proto::Command::Write && hdr.length <= (1 << 20) {
        vec![0xee; hdr.length as usize]
    } else {
        vec![]
    };
    Case {
        export,
        structured,
        meta: false,
        hdr,
        payload,
        expect,
    }
}

/// Exports: "" (all features, 1 MiB, max_block 64 KiB), "ro" (read-only),
/// "aligned" (min_block 512), "plain" (no optional features).
async fn table_server() -> (TestServer, Arc<MemoryExport>) {
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

async fn run_case(c: Case) {
    let (ts, _default) = table_server().await;
    let mut r = Raw::go(&ts.sock, c.export, c.structured, c.meta).await;
    r.request(c.hdr, &c.payload).await;
    match c.expect {
        Expect::Err(code) => {
            if c.structured {
                let (h, p) = r.chunk().await;
                assert_eq!(h.handle, c.hdr.handle);
                assert!(h.is_done(), "error chunk MUST be final here");
                assert_eq!(h.kind, chunk_type::ERROR);
                match p {
                    ChunkPayload::Error { error, message } => {
                        assert_eq!(error, code.to_wire(), "message: {message}");
                        assert!(!message.is_empty(), "structured errors carry a message");
                    }
                    other => panic!("expected error chunk, got {other:?}"),
                }
            } else {
                let h = r.simple_reply().await;
                assert_eq!(h.handle, c.hdr.handle);
                assert_eq!(h.error, code.to_wire());
            }
            // The same connection keeps working (stream still in sync).
            r.request(req(0, 0, 999, 0, 512), &[]).await;
            if c.structured {
                let (h, p) = r.chunk().await;
                assert_eq!(h.handle, 999);
                assert!(matches!(p, ChunkPayload::OffsetData { offset: 0, .. }));
            } else {
                let h = r.simple_reply().await;
                assert_eq!((h.handle, h.error), (999, 0));
                r.read_n(512).await;
            }
        }
    }
    ts.assert_other_client_works("").await;
    ts.server.shutdown().await;
}

macro_rules! bad_request {
    ($name:ident, $case:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            bounded(run_case($case)).await
        }
    };
}

use Expect::Err as E;
const READ: u16 = 0;
const WRITE: u16 = 1;
const FLUSH: u16 = 3;
const TRIM: u16 = 4;
const CACHE: u16 = 5;
const ZEROES: u16 = 6;
const BLOCK_STATUS: u16 = 7;

bad_request!(
    read_out_of_range_einval_simple,
    case("", false, req(READ, 0, 1, MIB - 4, 8), E(ErrorCode::Inval))
);
bad_request!(
    read_out_of_range_einval_structured,
    case("", true, req(READ, 0, 1, MIB, 1), E(ErrorCode::Inval))
);
bad_request!(
    read_offset_overflow_einval,
    case(
        "",
        true,
        req(READ, 0, 1, u64::MAX - 3, 8),
        E(ErrorCode::Inval)
    )
);
bad_request!(
    write_out_of_range_enospc,
    case(
        "",
        false,
        req(WRITE, 0, 1, MIB - 512, 1024),
        E(ErrorCode::NoSpc)
    )
);
bad_request!(
    write_zeroes_out_of_range_enospc,
    case("", true, req(ZEROES, 0, 1, MIB, 512), E(ErrorCode::NoSpc))
);
bad_request!(
    trim_out_of_range_einval,
    case("", false, req(TRIM, 0, 1, MIB - 1, 2), E(ErrorCode::Inval))
);
bad_request!(
    cache_out_of_range_einval,
    case("", false, req(CACHE, 0, 1, 2 * MIB, 2), E(ErrorCode::Inval))
);
bad_request!(block_status_out_of_range_einval, {
    let mut c = case(
        "",
        true,
        req(BLOCK_STATUS, 0, 1, MIB, 512),
        E(ErrorCode::Inval),
    );
    c.meta = true;
    c
});
bad_request!(block_status_zero_length_einval, {
    let mut c = case("", true, req(BLOCK_STATUS, 0, 1, 0, 0), E(ErrorCode::Inval));
    c.meta = true;
    c
});
bad_request!(
    block_status_without_meta_context_einval,
    case(
        "",
        true,
        req(BLOCK_STATUS, 0, 1, 0, 512),
        E(ErrorCode::Inval)
    )
);
bad_request!(
    block_status_req_one_on_read_einval,
    case(
        "",
        true,
        req(READ, cmd_flags::REQ_ONE, 1, 0, 512),
        E(ErrorCode::Inval)
    )
);
bad_request!(
    read_too_long_simple_einval,
    case("", false, req(READ, 0, 1, 0, 131072), E(ErrorCode::Inval))
);
bad_request!(
    read_too_long_structured_eoverflow,
    case("", true, req(READ, 0, 1, 0, 131072), E(ErrorCode::Overflow))
);
bad_request!(
    write_too_long_einval_payload_consumed,
    case("", false, req(WRITE, 0, 1, 0, 131072), E(ErrorCode::Inval))
);
// Above 32 MiB and the maximum: the spec would allow a hard disconnect
// (denial of service), but the payload is skipped as it arrives, never
// held, so the client gets its error and keeps its connection.
bad_request!(write_huge_length_einval_payload_consumed, {
    let mut c = case(
        "",
        false,
        req(WRITE, 0, 1, 0, (33 << 20) + 1),
        E(ErrorCode::Inval),
    );
    c.payload = vec![0xee; (33 << 20) + 1];
    c
});
bad_request!(write_huge_length_structured_einval_payload_consumed, {
    let mut c = case(
        "",
        true,
        req(WRITE, 0, 1, 0, (33 << 20) + 1),
        E(ErrorCode::Inval),
    );
    c.payload = vec![0xee; (33 << 20) + 1];
    c
});
bad_request!(write_too_long_past_the_end_einval_payload_consumed, {
    let mut c = case(
        "",
        false,
        req(WRITE, 0, 1, MIB, 131072),
        E(ErrorCode::Inval),
    );
    c.payload = vec![0xee; 131072];
    c
});
bad_request!(write_read_only_eperm_large_payload_consumed, {
    let mut c = case(
        "ro",
        false,
        req(WRITE, 0, 1, 0, 4 << 20),
        E(ErrorCode::Perm),
    );
    c.payload = vec![0xee; 4 << 20];
    c
});
bad_request!(
    write_read_only_eperm,
    case("ro", false, req(WRITE, 0, 1, 0, 512), E(ErrorCode::Perm))
);
bad_request!(
    trim_read_only_eperm,
    case("ro", true, req(TRIM, 0, 1, 0, 512), E(ErrorCode::Perm))
);
bad_request!(
    write_zeroes_read_only_eperm,
    case("ro", false, req(ZEROES, 0, 1, 0, 512), E(ErrorCode::Perm))
);
bad_request!(
    unknown_command_einval,
    case("", false, req(42, 0, 1, 0, 0), E(ErrorCode::Inval))
);
bad_request!(
    unknown_command_structured_einval,
    case("", true, req(8, 0, 1, 0, 0), E(ErrorCode::Inval))
);
bad_request!(
    unknown_flag_einval,
    case("", false, req(READ, 0x8000, 1, 0, 8), E(ErrorCode::Inval))
);
bad_request!(
    no_hole_on_read_einval,
    case(
        "",
        false,
        req(READ, cmd_flags::NO_HOLE, 1, 0, 8),
        E(ErrorCode::Inval)
    )
);
bad_request!(
    req_one_on_write_einval_payload_consumed,
    case(
        "",
        false,
        req(WRITE, cmd_flags::REQ_ONE, 1, 0, 4096),
        E(ErrorCode::Inval)
    )
);
bad_request!(
    df_without_structured_einval,
    case(
        "",
        false,
        req(READ, cmd_flags::DF, 1, 0, 8),
        E(ErrorCode::Inval)
    )
);
bad_request!(
    fua_not_advertised_einval,
    case(
        "plain",
        false,
        req(WRITE, cmd_flags::FUA, 1, 0, 512),
        E(ErrorCode::Inval)
    )
);
bad_request!(
    fast_zero_not_advertised_einval,
    case(
        "ro",
        false,
        req(ZEROES, cmd_flags::FAST_ZERO, 1, 0, 512),
        E(ErrorCode::Inval)
    )
);
bad_request!(
    flush_not_advertised_einval,
    case("plain", false, req(FLUSH, 0, 1, 0, 0), E(ErrorCode::Inval))
);
bad_request!(
    trim_not_advertised_einval,
    case("plain", true, req(TRIM, 0, 1, 0, 512), E(ErrorCode::Inval))
);
bad_request!(
    write_zeroes_not_advertised_einval,
    case(
        "plain",
        false,
        req(ZEROES, 0, 1, 0, 512),
        E(ErrorCode::Inval)
    )
);
bad_request!(
    cache_not_advertised_einval,
    case(
        "plain",
        false,
        req(CACHE, 0, 1, 0, 512),
        E(ErrorCode::Inval)
    )
);
bad_request!(
    unaligned_read_einval,
    case(
        "aligned",
        false,
        req(READ, 0, 1, 100, 512),
        E(ErrorCode::Inval)
    )
);
bad_request!(
    unaligned_write_length_einval,
    case(
        "aligned",
        true,
        req(WRITE, 0, 1, 0, 100),
        E(ErrorCode::Inval)
    )
);

// The macro above encodes a valid magic; this one sends a corrupted header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_request_magic_disconnects_only_that_client() {
    bounded(async {
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
        ts.assert_other_client_works("").await;
        ts.server.shutdown().await;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_mid_write_payload_ends_only_that_connection() {
    bounded(async {
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
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnect_mid_request_header_ends_only_that_connection() {
    bounded(async {
        let (ts, _) = table_server().await;
        let mut r = Raw::go(&ts.sock, "", true, false).await;
        r.send(&req(READ, 0, 1, 0, 8).encode()[..10]).await;
        drop(r);
        ts.assert_other_client_works("").await;
        ts.server.shutdown().await;
    })
    .await
}

// ---------------------------------------------------------------------------
// Bad input table: handshake phase
// ---------------------------------------------------------------------------

/// Send raw option bytes, expect a final reply of `want`, then check that a
/// GO on the same connection still succeeds and serves a read.
async fn option_error_then_go(raw_option: Vec<u8>, want_opt: u32, want: u32) {
    let (ts, _) = table_server().await;
    let mut r = Raw::connect(&ts.sock).await;
    r.send(&raw_option).await;
    let (h, _) = r.opt_reply().await;
    assert_eq!((h.option, h.reply_type), (want_opt, want));
    r.option(&ClientOption::Go(InfoRequest {
        name: String::new(),
        requests: vec![],
    }))
    .await;
    let (_, fin) = r.opt_replies_until_final().await;
    assert_eq!(fin, rep::ACK, "GO after the error must succeed");
    r.request(req(READ, 0, 1, 0, 8), &[]).await;
    assert_eq!(r.simple_reply().await.error, 0);
    ts.assert_other_client_works("").await;
    ts.server.shutdown().await;
}

macro_rules! bad_option {
    ($name:ident, $bytes:expr, $opt:expr, $want:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            bounded(option_error_then_go($bytes, $opt, $want)).await
        }
    };
}

bad_option!(
    unknown_option_err_unsup_then_go,
    unknown_option_bytes(0xdead, b"some data"),
    0xdead,
    rep::ERR_UNSUP
);
bad_option!(
    extended_headers_err_unsup_then_go,
    unknown_option_bytes(opt::EXTENDED_HEADERS, b""),
    opt::EXTENDED_HEADERS,
    rep::ERR_UNSUP
);
bad_option!(
    starttls_err_unsup_then_go,
    unknown_option_bytes(opt::STARTTLS, b""),
    opt::STARTTLS,
    rep::ERR_UNSUP
);
bad_option!(
    go_name_length_overflow_err_invalid,
    unknown_option_bytes(opt::GO, &[0, 0, 0, 200, 0, 0]),
    opt::GO,
    rep::ERR_INVALID
);
bad_option!(
    info_truncated_err_invalid,
    unknown_option_bytes(opt::INFO, &[0, 0]),
    opt::INFO,
    rep::ERR_INVALID
);
bad_option!(
    go_request_count_mismatch_err_invalid,
    unknown_option_bytes(opt::GO, &[0, 0, 0, 0, 0, 5, 0, 1]),
    opt::GO,
    rep::ERR_INVALID
);
bad_option!(
    go_unknown_export_err_unknown,
    ClientOption::Go(InfoRequest {
        name: "nope".into(),
        requests: vec![]
    })
    .encode()
    .to_vec(),
    opt::GO,
    rep::ERR_UNKNOWN
);
bad_option!(
    list_with_data_err_invalid,
    unknown_option_bytes(opt::LIST, b"x"),
    opt::LIST,
    rep::ERR_INVALID
);
bad_option!(
    structured_reply_with_data_err_invalid,
    unknown_option_bytes(opt::STRUCTURED_REPLY, b"x"),
    opt::STRUCTURED_REPLY,
    rep::ERR_INVALID
);
bad_option!(
    set_meta_without_structured_err_invalid,
    ClientOption::SetMetaContext(MetaContextRequest {
        export: String::new(),
        queries: vec![BASE_ALLOCATION.into()]
    })
    .encode()
    .to_vec(),
    opt::SET_META_CONTEXT,
    rep::ERR_INVALID
);
bad_option!(
    meta_query_length_overflow_err_invalid,
    unknown_option_bytes(
        opt::LIST_META_CONTEXT,
        &[0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, b'b']
    ),
    opt::LIST_META_CONTEXT,
    rep::ERR_INVALID
);
bad_option!(
    meta_context_unknown_export_err_unknown,
    ClientOption::ListMetaContext(MetaContextRequest {
        export: "nope".into(),
        queries: vec![]
    })
    .encode()
    .to_vec(),
    opt::LIST_META_CONTEXT,
    rep::ERR_UNKNOWN
);
bad_option!(
    oversized_unknown_option_skipped_err_unsup,
    unknown_option_bytes(0x4242, &vec![7u8; 100_000]),
    0x4242,
    rep::ERR_UNSUP
);
bad_option!(
    oversized_known_option_skipped_err_too_big,
    unknown_option_bytes(opt::INFO, &vec![7u8; 100_000]),
    opt::INFO,
    rep::ERR_TOO_BIG
);

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

/// Cases where the spec requires / allows a hard disconnect during the handshake.
async fn handshake_closes(setup: impl FnOnce(&mut Vec<u8>), flags: u32) {
    let (ts, _) = table_server().await;
    let (mut r, _) = Raw::connect_bare(&ts.sock).await;
    let mut bytes = proto::encode_client_flags(flags).to_vec();
    setup(&mut bytes);
    r.send(&bytes).await;
    r.expect_closed().await;
    ts.assert_other_client_works("").await;
    ts.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_client_flags_disconnect() {
    bounded(handshake_closes(|_| {}, 0x8000_0001)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_option_magic_disconnects() {
    bounded(handshake_closes(
        |b| {
            let mut o = ClientOption::List.encode().to_vec();
            o[0] = b'X';
            b.extend_from_slice(&o);
        },
        3,
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_name_unknown_disconnects() {
    bounded(handshake_closes(
        |b| b.extend_from_slice(&ClientOption::ExportName("nope".into()).encode()),
        3,
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_option_then_hangup_ends_only_that_connection() {
    bounded(async {
        let (ts, _) = table_server().await;
        let mut r = Raw::connect(&ts.sock).await;
        // Claims 1000 bytes of data, sends 3, then half-closes.
        let mut o = proto::OptionHeader {
            option: opt::GO,
            length: 1000,
        }
        .encode()
        .to_vec();
        o.extend_from_slice(b"abc");
        r.send(&o).await;
        r.s.shutdown().await.unwrap();
        r.expect_closed().await;
        ts.assert_other_client_works("").await;
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

// ---------------------------------------------------------------------------
// Direct writes (`Export::write_direct`)
// ---------------------------------------------------------------------------

/// What [`DirectExport::write_direct`] does with a payload.
#[derive(Clone, Copy, PartialEq, Eq)]
enum DirectMode {
    /// Receive it all, then store it.
    All,
    /// Receive the first half, then fail the write (the server skips the rest).
    Half,
    /// Decline (the server reads the payload and calls `write`).
    Decline,
}

/// Memory, with a `write_direct` that receives payloads itself.
struct DirectExport {
    inner: MemoryExport,
    mode: DirectMode,
    direct_calls: AtomicUsize,
}

impl DirectExport {
    fn new(size: u64, mode: DirectMode) -> Arc<Self> {
        Arc::new(DirectExport {
            inner: MemoryExport::with_size("", size),
            mode,
            direct_calls: AtomicUsize::new(0),
        })
    }
}

impl Export for DirectExport {
    fn info(&self) -> ExportInfo {
        self.inner.info()
    }
    fn read(&self, ctx: RequestCtx, offset: u64, len: u32) -> BoxFuture<'_, NbdResult<Bytes>> {
        self.inner.read(ctx, offset, len)
    }
    fn write(
        &self,
        ctx: RequestCtx,
        offset: u64,
        data: Bytes,
        fua: bool,
    ) -> BoxFuture<'_, NbdResult<()>> {
        self.inner.write(ctx, offset, data, fua)
    }
    fn write_direct(
        self: Arc<Self>,
        ctx: RequestCtx,
        offset: u64,
        len: u32,
        fua: bool,
        src: &mut DirectSource<'_>,
    ) -> Option<BoxFuture<'static, NbdResult<()>>> {
        assert_eq!(
            src.remaining(),
            len as usize,
            "the whole payload is offered"
        );
        if self.mode == DirectMode::Decline {
            return None;
        }
        self.direct_calls.fetch_add(1, Ordering::SeqCst);
        let take = if self.mode == DirectMode::Half {
            len / 2
        } else {
            len
        };
        let mut buf = vec![0u8; take as usize];
        let got = src.recv(&mut buf);
        // Past the payload's end: refused, nothing taken.
        assert!(src.recv(&mut vec![0u8; src.remaining() + 1]).is_err());
        Some(Box::pin(async move {
            got.map_err(|e| NbdError::io(e.to_string()))?;
            if self.mode == DirectMode::Half {
                return Err(NbdError::io("stopped half-way"));
            }
            self.inner.write(ctx, offset, Bytes::from(buf), fua).await
        }))
    }
}

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
