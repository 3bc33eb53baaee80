//! Shared helpers for the integration tests.
#![allow(dead_code, unused_imports, unused_macros)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use nvwc_nbd::proto::{
    self, client_flags, rep, ChunkHeader, ChunkPayload, ClientOption, InfoRequest,
    MetaContextRequest, OptionReplyHeader, ReplyHeader, RequestHeader, SimpleReplyHeader,
    BASE_ALLOCATION,
};
use nvwc_nbd::{Client, Export, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// Every test body runs under this bound.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(30);

pub async fn bounded<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(TEST_TIMEOUT, f)
        .await
        .expect("test exceeded its time bound")
}

/// One case of a table-driven test, named on stderr first, within [`bounded`].
pub async fn bounded_case<F: Future>(name: &str, f: F) -> F::Output {
    eprintln!("case: {name}");
    bounded(f).await
}

/// Multi-threaded tokio tests (two workers), each `async fn` run within
/// [`bounded`]; after `needs "TOOL";` it skips without that tool (see
/// [`tool_available`]).
macro_rules! bounded_test {
    ($(#[$m:meta])* $(needs $tool:literal;)? async fn $name:ident() $body:block) => {
        $(#[$m])*
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            $(
                if !$crate::common::tool_available($tool) {
                    return;
                }
            )?
            $crate::common::bounded(async $body).await
        }
    };
}
pub(crate) use bounded_test;

/// A unique temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "nvwc-nbd-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub struct TestServer {
    pub server: Server,
    pub sock: PathBuf,
    pub dir: TempDir,
}

impl TestServer {
    pub async fn start(exports: Vec<Arc<dyn Export>>) -> TestServer {
        let mut b = Server::builder();
        for e in exports {
            b = b.export(e);
        }
        Self::start_with(b.build().expect("valid server")).await
    }

    pub async fn start_with(server: Server) -> TestServer {
        let dir = TempDir::new("srv");
        let sock = dir.path().join("nbd.sock");
        server.listen_unix(&sock).await.unwrap();
        TestServer { server, sock, dir }
    }

    pub fn uri(&self, name: &str) -> String {
        format!("nbd+unix:///{name}?socket={}", self.sock.display())
    }

    /// Another, independent client must still be fully served.
    pub async fn assert_other_client_works(&self, name: &str) {
        let c = Client::connect(&self.uri(name))
            .await
            .expect("second client connects");
        let off = 8192;
        c.write(off, Bytes::from_static(b"still-alive"), false)
            .await
            .expect("second client write");
        let got = c.read(off, 11).await.expect("second client read");
        assert_eq!(&got[..], b"still-alive");
        c.disconnect().await.unwrap();
    }

    /// The end of a test whose failure MUST stay in its own connection:
    /// another client is still fully served, then the server shuts down.
    pub async fn assert_other_client_works_and_shut_down(&self) {
        self.assert_other_client_works("").await;
        self.server.shutdown().await;
    }
}

/// A raw protocol driver for exact-byte tests.
pub struct Raw {
    pub s: UnixStream,
}

pub const IO_TIMEOUT: Duration = Duration::from_secs(5);

impl Raw {
    /// Connect and read the greeting; does NOT send client flags.
    pub async fn connect_bare(path: &Path) -> (Raw, u16) {
        let mut s = UnixStream::connect(path).await.unwrap();
        let mut g = [0u8; proto::GREETING_LEN];
        s.read_exact(&mut g).await.unwrap();
        let f = proto::decode_server_greeting(&g).unwrap();
        (Raw { s }, f)
    }

    /// Connect, check the greeting, send FIXED_NEWSTYLE|NO_ZEROES.
    pub async fn connect(path: &Path) -> Raw {
        let (mut r, f) = Self::connect_bare(path).await;
        assert_eq!(f, 0x0003, "handshake flags FIXED_NEWSTYLE|NO_ZEROES");
        r.send(&proto::encode_client_flags(
            client_flags::FIXED_NEWSTYLE | client_flags::NO_ZEROES,
        ))
        .await;
        r
    }

    pub async fn send(&mut self, b: &[u8]) {
        self.s.write_all(b).await.unwrap();
    }

    pub async fn read_n(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        tokio::time::timeout(IO_TIMEOUT, self.s.read_exact(&mut b))
            .await
            .expect("timed out waiting for server bytes")
            .unwrap();
        b
    }

    pub async fn option(&mut self, o: &ClientOption) {
        self.send(&o.encode()).await;
    }

    pub async fn opt_reply(&mut self) -> (OptionReplyHeader, Vec<u8>) {
        let h = OptionReplyHeader::decode(&self.read_n(OptionReplyHeader::LEN).await).unwrap();
        let d = self.read_n(h.length as usize).await;
        (h, d)
    }

    /// Read option replies until a final one (ACK or error); returns (all, final type).
    /// [`Raw::opt_replies_until_final`], which MUST end with ACK and
    /// otherwise be replies of type `typ`, each `decode`d.
    pub async fn acked_replies<T>(&mut self, typ: u32, decode: impl Fn(&[u8]) -> T) -> Vec<T> {
        let (v, fin) = self.opt_replies_until_final().await;
        assert_eq!(fin, rep::ACK);
        v.iter()
            .map(|(t, d)| {
                assert_eq!(*t, typ);
                decode(d)
            })
            .collect()
    }

    pub async fn opt_replies_until_final(&mut self) -> (Vec<(u32, Vec<u8>)>, u32) {
        let mut v = Vec::new();
        loop {
            let (h, d) = self.opt_reply().await;
            if h.reply_type == rep::ACK || rep::is_error(h.reply_type) {
                return (v, h.reply_type);
            }
            v.push((h.reply_type, d));
        }
    }

    /// Full handshake into transmission on `name`.
    pub async fn go(path: &Path, name: &str, structured: bool, meta: bool) -> Raw {
        let mut r = Self::connect(path).await;
        if structured {
            r.option(&ClientOption::StructuredReply).await;
            let (h, _) = r.opt_reply().await;
            assert_eq!(h.reply_type, rep::ACK);
        }
        if meta {
            r.option(&ClientOption::SetMetaContext(MetaContextRequest {
                export: name.into(),
                queries: vec![BASE_ALLOCATION.into()],
            }))
            .await;
            let (v, fin) = r.opt_replies_until_final().await;
            assert_eq!(fin, rep::ACK);
            assert_eq!(v.len(), 1);
        }
        r.option(&ClientOption::Go(InfoRequest {
            name: name.into(),
            requests: vec![],
        }))
        .await;
        let (_, fin) = r.opt_replies_until_final().await;
        assert_eq!(fin, rep::ACK, "GO must succeed");
        r
    }

    pub async fn request(&mut self, hdr: RequestHeader, payload: &[u8]) {
        let mut b = hdr.encode().to_vec();
        b.extend_from_slice(payload);
        self.send(&b).await;
    }

    pub async fn simple_reply(&mut self) -> SimpleReplyHeader {
        let b = self.read_n(SimpleReplyHeader::LEN).await;
        match ReplyHeader::decode(&b).unwrap() {
            ReplyHeader::Simple(h) => h,
            other => panic!("expected simple reply, got {other:?}"),
        }
    }

    pub async fn chunk(&mut self) -> (ChunkHeader, ChunkPayload) {
        let b = self.read_n(ChunkHeader::LEN).await;
        let h = ChunkHeader::decode(&b).unwrap();
        let p = self.read_n(h.length as usize).await;
        (h, ChunkPayload::decode(h.kind, Bytes::from(p)).unwrap())
    }

    /// The server MUST close the connection (EOF or reset) without sending anything more.
    pub async fn expect_closed(&mut self) {
        let mut b = [0u8; 64];
        let r = tokio::time::timeout(IO_TIMEOUT, self.s.read(&mut b))
            .await
            .expect("server did not close the connection");
        match r {
            Ok(0) => {}
            Ok(n) => panic!("expected close, got {n} more bytes: {:?}", &b[..n]),
            Err(e) => assert!(
                matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
                ),
                "unexpected error {e}"
            ),
        }
    }
}

pub fn req(cmd: u16, flags: u16, handle: u64, offset: u64, length: u32) -> RequestHeader {
    RequestHeader {
        flags,
        command: cmd.into(),
        handle,
        offset,
        length,
    }
}

pub fn unknown_option_bytes(code: u32, data: &[u8]) -> Vec<u8> {
    proto::encode_option(code, data).to_vec()
}

// ---------------------------------------------------------------------------
// External tools
// ---------------------------------------------------------------------------

/// True if `tool` is on PATH. If it is missing: panics when
/// `NVWC_REQUIRE_TOOLS=1` (CI), otherwise prints a SKIP line and returns false.
pub fn tool_available(tool: &str) -> bool {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false);
    if found {
        return true;
    }
    if std::env::var("NVWC_REQUIRE_TOOLS").as_deref() == Ok("1")
        || matches!(std::env::var("CI").as_deref(), Ok("true" | "1"))
    {
        panic!("required tool `{tool}` is missing (NVWC_REQUIRE_TOOLS=1); install libnbd-bin qemu-utils nbdkit");
    }
    // Written to the stderr handle directly so libtest's capture does not hide it.
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "SKIP: `{tool}` not found on PATH (set NVWC_REQUIRE_TOOLS=1 to make this a failure)"
    );
    false
}

pub struct ToolOutput {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Run a tool with a time bound; kills it on timeout. Runs in the system
/// temp dir so that stray output files never land in the source tree.
pub async fn run_tool(tool: &str, args: &[&str]) -> ToolOutput {
    run_tool_in(&std::env::temp_dir(), tool, args).await
}

/// [`run_tool`] with an explicit working directory.
pub async fn run_tool_in(cwd: &Path, tool: &str, args: &[&str]) -> ToolOutput {
    let child = tokio::process::Command::new(tool)
        .args(args)
        .current_dir(cwd)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(20), child)
        .await
        .unwrap_or_else(|_| panic!("{tool} {args:?} timed out"))
        .unwrap_or_else(|e| panic!("failed to run {tool}: {e}"));
    ToolOutput {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Deterministic pseudo-random bytes (`nvwc_dev::rng`, seeded with `seed`).
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut out = vec![0u8; len];
    nvwc_dev::rng::Rng::new(seed).fill(&mut out);
    out
}
