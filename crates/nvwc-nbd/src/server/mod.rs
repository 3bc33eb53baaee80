//! Async NBD server framework (tokio), generic over [`Export`].
//!
//! A [`Server`] owns a set of named exports and serves any number of
//! listeners (TCP with `TCP_NODELAY`, unix sockets) and individual streams.
//! Each connection runs the fixed-newstyle handshake and then a transmission
//! phase in which requests are processed concurrently (one task per request,
//! bounded by [`ServerConfig::max_in_flight`]) and replies are written by a
//! single writer task in completion order.
//!
//! TLS (`NBD_OPT_STARTTLS`) is offered through [`ServerBuilder::tls`] with a
//! [`TlsAcceptor`] the embedding program supplies (see `nvwc-server/src/tls.rs`).
//!
//! Failure isolation: anything a client does (bad magic, truncated request,
//! bogus lengths, disconnects) affects only that client's connection.

mod handshake;
mod tls;
mod transmission;

pub use tls::{BoxStream, Stream, TlsAcceptor, TlsMode, TlsSession};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, ToSocketAddrs, UnixListener};
use tokio::sync::watch;

use crate::export::Export;

/// What happened on a connection, for the embedding program's logs (see
/// [`ServerBuilder::on_event`]). Emitted from the connection's task; the
/// callback MUST be quick and MUST NOT block.
#[derive(Debug, Clone)]
pub enum ServerEvent {
    /// A client connected (`peer`: `ip:port`, or `unix` for a unix socket).
    Connected {
        /// Connection id (the `conn_id` of [`crate::RequestCtx`]).
        conn_id: u64,
        /// The client's address.
        peer: String,
    },
    /// The handshake selected an export; transmission begins.
    Ready {
        /// Connection id.
        conn_id: u64,
        /// Canonical name of the export.
        export: Arc<str>,
        /// Whether structured replies were negotiated.
        structured: bool,
        /// The TLS peer ([`TlsSession::peer`]) if the connection is
        /// encrypted.
        tls: Option<String>,
    },
    /// The connection ended.
    Disconnected {
        /// Connection id.
        conn_id: u64,
        /// Why: `eof`, `disc`, `shutdown`, `handshake-abort`, `handshake-error: ...`,
        /// `handshake-timeout`, `protocol-error`, `client-gone`,
        /// `tls-handshake-failed: ...`, or `tls-required: ...` (a plain
        /// client that was refused with `NBD_REP_ERR_TLS_REQD`).
        reason: String,
        /// Requests dispatched to the export during transmission.
        requests: u64,
    },
    /// A request got an error reply.
    RequestError {
        /// Connection id.
        conn_id: u64,
        /// The command, e.g. `Write`.
        command: String,
        /// The NBD error, e.g. `EIO`.
        code: String,
        /// The message sent to the client (structured replies) or logged.
        message: String,
    },
}

/// Callback for [`ServerEvent`]s.
pub type EventHook = Arc<dyn Fn(ServerEvent) + Send + Sync>;

/// Default address for [`Server::listen_tcp`] callers: loopback, IANA port.
pub const DEFAULT_TCP_ADDR: &str = "127.0.0.1:10809";

/// Tunables of a [`Server`].
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Maximum requests processed concurrently per connection (≥ 1). When
    /// reached, the server stops reading that connection's requests.
    pub max_in_flight: usize,
    /// Per-connection budget for READ/WRITE payload bytes held in memory
    /// (requests being read, processed, or replies waiting to be written).
    /// When exhausted, the server stops reading that connection's requests.
    /// A single request larger than the budget is still admitted alone.
    pub max_in_flight_bytes: usize,
    /// Close connections that have not finished the handshake in this time.
    pub handshake_timeout: Option<Duration>,
    /// Options with more data than this are skipped (read and discarded) and
    /// answered `NBD_REP_ERR_TOO_BIG` (known option) or `ERR_UNSUP` (unknown).
    pub max_option_len: u32,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_in_flight: 64,
            max_in_flight_bytes: 256 << 20,
            handshake_timeout: Some(Duration::from_secs(30)),
            max_option_len: 64 * 1024,
        }
    }
}

/// Errors building a [`Server`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServerError {
    /// Two exports reported the same name.
    #[error("duplicate export name {0:?}")]
    DuplicateExport(String),
    /// An export's [`crate::ExportInfo`] violates the spec's constraints.
    #[error("export {name:?} is invalid: {reason}")]
    InvalidExport {
        /// The export's name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// The default export name does not match any export.
    #[error("default export {0:?} does not exist")]
    UnknownDefault(String),
    /// Bad [`ServerConfig`].
    #[error("invalid server config: {0}")]
    InvalidConfig(String),
}

/// Builder for [`Server`].
pub struct ServerBuilder {
    config: ServerConfig,
    exports: Vec<Arc<dyn Export>>,
    default_name: Option<String>,
    hook: Option<EventHook>,
    tls: tls::TlsConfig,
}

impl Default for ServerBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl ServerBuilder {
    /// Empty builder with the default config.
    pub fn new() -> Self {
        ServerBuilder {
            config: ServerConfig::default(),
            exports: Vec::new(),
            default_name: None,
            hook: None,
            tls: tls::TlsConfig::off(),
        }
    }

    /// Offer TLS (`NBD_OPT_STARTTLS`) with `acceptor`: [`TlsMode::On`]
    /// lets a client upgrade, [`TlsMode::Require`] refuses every option
    /// before it does. Applies to every listener and stream of the server.
    /// Without this call (or with [`TlsMode::Off`]) the server is NOTLS.
    pub fn tls(mut self, mode: TlsMode, acceptor: Arc<dyn TlsAcceptor>) -> Self {
        self.tls = tls::TlsConfig {
            mode,
            acceptor: (mode != TlsMode::Off).then_some(acceptor),
        };
        self
    }

    /// Call `hook` for every connection event (connect, ready, disconnect,
    /// error replies), e.g. to log them.
    pub fn on_event(mut self, hook: impl Fn(ServerEvent) + Send + Sync + 'static) -> Self {
        self.hook = Some(Arc::new(hook));
        self
    }

    /// Replace the config.
    pub fn config(mut self, config: ServerConfig) -> Self {
        self.config = config;
        self
    }

    /// Set [`ServerConfig::max_in_flight`].
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.config.max_in_flight = n;
        self
    }

    /// Add an export; it is registered under `export.info().name`.
    pub fn export(mut self, export: Arc<dyn Export>) -> Self {
        self.exports.push(export);
        self
    }

    /// Make the export named `name` answer to the empty name "" as well.
    /// Without this, "" resolves to an export literally named "" if any,
    /// otherwise to the first export added.
    pub fn default_export(mut self, name: impl Into<String>) -> Self {
        self.default_name = Some(name.into());
        self
    }

    /// Validate and build.
    pub fn build(self) -> Result<Server, ServerError> {
        if self.config.max_in_flight == 0 || self.config.max_in_flight > (1 << 20) {
            return Err(ServerError::InvalidConfig(
                "max_in_flight MUST be in 1..=2^20".into(),
            ));
        }
        let mut exports = BTreeMap::new();
        let mut first = None;
        for e in self.exports {
            let name = register(&mut exports, e)?;
            first.get_or_insert(name);
        }
        let default_name = match self.default_name {
            Some(n) => {
                if !exports.contains_key(&n) {
                    return Err(ServerError::UnknownDefault(n));
                }
                Some(n)
            }
            None if exports.contains_key("") => Some(String::new()),
            None => first,
        };
        let (shutdown_tx, _) = watch::channel(false);
        let (active_tx, _) = watch::channel(0usize);
        Ok(Server {
            inner: Arc::new(Inner {
                config: self.config,
                exports: std::sync::RwLock::new(exports),
                default_name,
                next_conn_id: AtomicU64::new(1),
                shutdown: shutdown_tx,
                active: active_tx,
                unix_paths: Mutex::new(Vec::new()),
                hook: self.hook,
                tls: self.tls,
            }),
        })
    }
}

/// Add `export` to `map` under its name, if its info is valid and the name
/// is free; returns the name.
fn register(
    map: &mut BTreeMap<String, Arc<dyn Export>>,
    export: Arc<dyn Export>,
) -> Result<String, ServerError> {
    let info = export.info();
    info.validate()
        .map_err(|reason| ServerError::InvalidExport {
            name: info.name.clone(),
            reason,
        })?;
    if map.contains_key(&info.name) {
        return Err(ServerError::DuplicateExport(info.name));
    }
    map.insert(info.name.clone(), export);
    Ok(info.name)
}

pub(crate) struct Inner {
    pub(crate) config: ServerConfig,
    /// Exports by name; [`Server::add_export`] adds to it while serving.
    exports: std::sync::RwLock<BTreeMap<String, Arc<dyn Export>>>,
    default_name: Option<String>,
    next_conn_id: AtomicU64,
    pub(crate) shutdown: watch::Sender<bool>,
    /// Number of live connection tasks plus listener tasks.
    active: watch::Sender<usize>,
    unix_paths: Mutex<Vec<PathBuf>>,
    hook: Option<EventHook>,
    pub(crate) tls: tls::TlsConfig,
}

impl Inner {
    pub(crate) fn emit(&self, ev: impl FnOnce() -> ServerEvent) {
        if let Some(h) = &self.hook {
            h(ev());
        }
    }

    /// Resolve a client-supplied export name to (canonical name, export).
    pub(crate) fn lookup(&self, name: &str) -> Option<(Arc<str>, Arc<dyn Export>)> {
        let key = if name.is_empty() {
            self.default_name.as_deref()?
        } else {
            name
        };
        self.exports
            .read()
            .unwrap()
            .get_key_value(key)
            .map(|(k, e)| (Arc::from(k.as_str()), e.clone()))
    }

    /// A snapshot of the exports, sorted by name.
    pub(crate) fn exports(&self) -> Vec<(String, Arc<dyn Export>)> {
        let map = self.exports.read().unwrap();
        map.iter().map(|(k, e)| (k.clone(), e.clone())).collect()
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }
}

/// Counts a live task in `Inner::active`; decrements on drop.
struct ActiveGuard(Arc<Inner>);

impl ActiveGuard {
    fn new(inner: &Arc<Inner>) -> Self {
        inner.active.send_modify(|n| *n += 1);
        ActiveGuard(inner.clone())
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.send_modify(|n| {
            debug_assert!(*n > 0, "active count MUST NOT underflow");
            *n = n.saturating_sub(1);
        });
    }
}

/// An NBD server. Cheap to clone (all clones share state).
#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
}

impl Server {
    /// Start building a server.
    pub fn builder() -> ServerBuilder {
        ServerBuilder::new()
    }

    /// Names of all registered exports, sorted.
    pub fn export_names(&self) -> Vec<String> {
        self.inner.exports.read().unwrap().keys().cloned().collect()
    }

    /// Add an export while serving: new connections can list and open it
    /// at once; connections in progress are unaffected. The same checks
    /// as [`ServerBuilder::build`]: a valid [`ExportInfo`](crate::ExportInfo)
    /// and a name no export has yet. The default export ("") does not change.
    pub fn add_export(&self, export: Arc<dyn Export>) -> Result<(), ServerError> {
        register(&mut self.inner.exports.write().unwrap(), export).map(|_| ())
    }

    /// Bind a TCP listener on `addr` (e.g. [`DEFAULT_TCP_ADDR`], or port 0
    /// for an ephemeral port) and serve it in the background. Accepted
    /// sockets get `TCP_NODELAY`. Returns the bound address.
    pub async fn listen_tcp(&self, addr: impl ToSocketAddrs) -> std::io::Result<SocketAddr> {
        if self.is_shutting_down() {
            return Err(shutting_down_err());
        }
        let listener = TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        self.spawn_accept_loop(Listener::Tcp(listener));
        Ok(local)
    }

    /// Bind a unix socket at `path` (which MUST NOT exist) and serve it in
    /// the background. The socket file is removed by [`Server::shutdown`].
    pub async fn listen_unix(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        if self.is_shutting_down() {
            return Err(shutting_down_err());
        }
        let path = path.as_ref().to_path_buf();
        let listener = UnixListener::bind(&path)?;
        self.inner.unix_paths.lock().expect("poisoned").push(path);
        self.spawn_accept_loop(Listener::Unix(listener));
        Ok(())
    }

    /// Accept connections on `listener` in the background until shutdown.
    fn spawn_accept_loop(&self, listener: Listener) {
        let server = self.clone();
        let guard = ActiveGuard::new(&self.inner);
        let mut shutdown = self.inner.shutdown.subscribe();
        tokio::spawn(async move {
            let _guard = guard;
            loop {
                tokio::select! {
                    _ = async { let _ = shutdown.wait_for(|s| *s).await; } => break,
                    r = listener.accept(&server) => if r.is_err() {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    },
                }
            }
        });
    }

    /// Serve one already-connected stream in a background task. Returns the
    /// connection id, or `None` (and drops the stream) if shutting down.
    pub fn serve_connection<S>(&self, stream: S) -> Option<u64>
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        self.serve_connection_from(stream, "stream".to_string())
    }

    /// [`Server::serve_connection`], naming the client's address for
    /// [`ServerEvent::Connected`].
    pub fn serve_connection_from<S>(&self, stream: S, peer: String) -> Option<u64>
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        self.spawn_connection(stream, peer, None)
    }

    /// Serve `stream`; `direct`: the same unix socket, for direct writes.
    fn spawn_connection<S>(
        &self,
        stream: S,
        peer: String,
        direct: Option<std::os::fd::OwnedFd>,
    ) -> Option<u64>
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        if self.is_shutting_down() {
            return None;
        }
        let conn_id = self.inner.next_conn_id.fetch_add(1, Ordering::Relaxed);
        let guard = ActiveGuard::new(&self.inner);
        let inner = self.inner.clone();
        inner.emit(|| ServerEvent::Connected { conn_id, peer });
        tokio::spawn(async move {
            let _guard = guard;
            transmission::run_connection(inner, stream, conn_id, direct).await;
        });
        Some(conn_id)
    }

    /// True once [`Server::shutdown`] has been called.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.is_shutting_down()
    }

    /// Connections (and listeners) currently alive.
    pub fn active_tasks(&self) -> usize {
        *self.inner.active.borrow()
    }

    /// Total connections accepted so far (connection ids are 1..=this).
    pub fn connections_accepted(&self) -> u64 {
        self.inner.next_conn_id.load(Ordering::Relaxed) - 1
    }

    /// Graceful shutdown: stop accepting, close connections still in the
    /// handshake, answer requests arriving from now on with `NBD_ESHUTDOWN`,
    /// let in-flight requests finish and their replies be sent, then close
    /// every connection. Resolves when all connection and listener tasks have
    /// ended. Idempotent.
    pub async fn shutdown(&self) {
        self.inner.shutdown.send_replace(true);
        let mut rx = self.inner.active.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
        let paths = std::mem::take(&mut *self.inner.unix_paths.lock().expect("poisoned"));
        for p in paths {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn shutting_down_err() -> std::io::Error {
    std::io::Error::other("server is shutting down")
}

/// A bound listener of either kind.
enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    /// Accept one connection and start serving it: TCP sockets get
    /// `TCP_NODELAY`; unix sockets a second handle for direct writes
    /// (`Export::write_direct`; without it, none).
    async fn accept(&self, server: &Server) -> std::io::Result<()> {
        match self {
            Listener::Tcp(l) => {
                let (sock, peer) = l.accept().await?;
                let _ = sock.set_nodelay(true);
                server.serve_connection_from(sock, peer.to_string());
            }
            Listener::Unix(l) => {
                let (sock, _peer) = l.accept().await?;
                let direct = std::os::fd::AsFd::as_fd(&sock).try_clone_to_owned().ok();
                server.spawn_connection(sock, "unix".to_string(), direct);
            }
        }
        Ok(())
    }
}
