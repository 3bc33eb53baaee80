//! Async NBD client (tokio) with request pipelining.
//!
//! [`Client::connect`] negotiates fixed newstyle, optionally structured
//! replies and the `base:allocation` metadata context, then `NBD_OPT_GO`
//! (falling back to `NBD_OPT_EXPORT_NAME` for servers without it). All
//! request methods take `&self`: many requests may be in flight at once over
//! one connection; a single writer task serializes them onto the socket and a
//! reader task routes replies back by handle.
//!
//! The client enforces the client-side MUSTs of the spec locally (no
//! unadvertised features, no requests beyond the export size or the maximum
//! payload, alignment to the minimum block size) and reports violations as
//! [`ClientError::Unsupported`] / [`ClientError::InvalidArgument`] without
//! sending anything. Write requests to a read-only export are sent (the
//! server answers `EPERM`).

mod uri;

pub use uri::{Endpoint, NbdUri, UriError};

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::task::JoinHandle;

use crate::error::{CodecError, ErrorCode, NbdError};
use crate::export::WriteZeroesFlags;
use crate::proto::{
    self, chunk_type, client_flags, cmd_flags, handshake_flags, info, opt, rep, tx_flags,
    ChunkHeader, ChunkPayload, ClientOption, Command, Extent, InfoReply, InfoRequest,
    MetaContextEntry, MetaContextRequest, OptionReplyHeader, ReplyHeader, RequestHeader,
    ServerEntry, BASE_ALLOCATION,
};

/// Largest option reply we accept during the handshake.
const MAX_OPTION_REPLY: u32 = 1 << 20;
/// Largest structured chunk payload we accept.
const MAX_CHUNK: u32 = 80 << 20;
const IO_BUF: usize = 128 * 1024;

/// Errors returned by [`Client`]. A message that includes an inner error's
/// does not also give it as a `source`, so a chain printed whole names each
/// cause once.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Bad URI.
    #[error(transparent)]
    Uri(#[from] UriError),
    /// Socket error.
    #[error("I/O error: {0}")]
    Io(io::Error),
    /// The server violated the protocol (the connection is closed).
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The server refused an option during the handshake.
    #[error("server rejected option {option}: reply {reply_type:#x}: {message}")]
    OptionRejected {
        /// `NBD_OPT_*`.
        option: u32,
        /// `NBD_REP_ERR_*`.
        reply_type: u32,
        /// Server's message.
        message: String,
    },
    /// The server answered the request with an error.
    #[error("server error: {0}")]
    Server(NbdError),
    /// The export does not advertise the feature this call needs.
    #[error("not supported by this export: {0}")]
    Unsupported(&'static str),
    /// The request would violate the export's size constraints.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The connection is closed (or closing).
    #[error("disconnected: {0}")]
    Disconnected(String),
}

impl From<io::Error> for ClientError {
    fn from(e: io::Error) -> Self {
        ClientError::Io(e)
    }
}

impl From<NbdError> for ClientError {
    fn from(e: NbdError) -> Self {
        ClientError::Server(e)
    }
}

impl From<CodecError> for ClientError {
    fn from(e: CodecError) -> Self {
        ClientError::Protocol(e.to_string())
    }
}

impl ClientError {
    /// The NBD error code if the server replied with an error.
    pub fn nbd_code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Server(e) => Some(e.code),
            _ => None,
        }
    }
}

/// Handshake preferences.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Negotiate structured replies (needed for block status).
    pub structured_replies: bool,
    /// Select the `base:allocation` metadata context (needs structured replies).
    pub base_allocation: bool,
    /// Timeout for connecting plus the handshake.
    pub connect_timeout: Option<Duration>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            structured_replies: true,
            base_allocation: true,
            connect_timeout: Some(Duration::from_secs(30)),
        }
    }
}

/// What the handshake established about the export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportDetails {
    /// Canonical name (from `NBD_INFO_NAME`, else the requested name).
    pub name: String,
    /// Description ("" if none).
    pub description: String,
    /// Size in bytes.
    pub size: u64,
    /// Transmission flags.
    pub flags: u16,
    /// Minimum block size (1 if not advertised).
    pub min_block: u32,
    /// Preferred block size (4096 if not advertised).
    pub pref_block: u32,
    /// Maximum payload (32 MiB if not advertised).
    pub max_block: u32,
    /// Structured replies negotiated.
    pub structured: bool,
    /// `base:allocation` selected (block status available).
    pub base_allocation: bool,
}

/// One accessor per transmission flag: `$name()` is true if `$flag` is set.
macro_rules! flag_accessors {
    ($($(#[$doc:meta])* $name:ident => $flag:ident,)*) => {
        impl ExportDetails {
            $(
                $(#[$doc])*
                pub fn $name(&self) -> bool {
                    self.flags & tx_flags::$flag != 0
                }
            )*
        }
    };
}

flag_accessors! {
    /// `NBD_FLAG_READ_ONLY`.
    read_only => READ_ONLY,
    /// `NBD_FLAG_SEND_FLUSH`.
    can_flush => SEND_FLUSH,
    /// `NBD_FLAG_SEND_FUA`.
    can_fua => SEND_FUA,
    /// `NBD_FLAG_SEND_TRIM`.
    can_trim => SEND_TRIM,
    /// `NBD_FLAG_SEND_WRITE_ZEROES`.
    can_zero => SEND_WRITE_ZEROES,
    /// `NBD_FLAG_SEND_FAST_ZERO`.
    can_fast_zero => SEND_FAST_ZERO,
    /// `NBD_FLAG_SEND_CACHE`.
    can_cache => SEND_CACHE,
    /// `NBD_FLAG_CAN_MULTI_CONN`.
    can_multi_conn => CAN_MULTI_CONN,
}

// ---------------------------------------------------------------------------
// Shared state between the API, the reader and the writer
// ---------------------------------------------------------------------------

enum Done {
    Unit,
    Data(Bytes),
    Extents(Vec<Extent>),
}

enum Acc {
    Read {
        offset: u64,
        len: u32,
        buf: BytesMut,
        ranges: Vec<(u64, u64)>,
    },
    Status {
        len: u32,
        req_one: bool,
        extents: Option<Vec<Extent>>,
    },
    Other,
}

struct Pending {
    acc: Acc,
    /// `None` once the caller gave up waiting (its future was dropped).
    tx: Option<oneshot::Sender<Result<Done, ClientError>>>,
    error: Option<NbdError>,
}

#[derive(Default)]
struct State {
    map: HashMap<u64, Pending>,
    /// Set when the connection is dead; the reason.
    closed: Option<String>,
    /// Set by `disconnect()`: no new requests.
    closing: bool,
}

struct Shared {
    state: Mutex<State>,
    next_handle: AtomicU64,
    idle: Notify,
    dead: watch::Sender<bool>,
    structured: bool,
    context_id: Option<u32>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("client state poisoned")
    }

    /// Mark the connection dead and fail every pending request.
    fn fail_all(&self, reason: String) {
        let drained: Vec<Pending> = {
            let mut st = self.lock();
            if st.closed.is_none() {
                st.closed = Some(reason.clone());
            }
            st.map.drain().map(|(_, p)| p).collect()
        };
        for p in drained {
            if let Some(tx) = p.tx {
                let _ = tx.send(Err(ClientError::Disconnected(reason.clone())));
            }
        }
        self.dead.send_replace(true);
        self.idle.notify_waiters();
    }

    fn complete(&self, handle: u64, r: Result<Done, ClientError>) {
        let p = {
            let mut st = self.lock();
            let p = st.map.remove(&handle);
            if st.map.is_empty() {
                self.idle.notify_waiters();
            }
            p
        };
        if let Some(Pending { tx: Some(tx), .. }) = p {
            let _ = tx.send(r);
        }
    }
}

/// Removes / abandons a pending entry if the caller's future is dropped.
struct Registration<'a> {
    shared: &'a Shared,
    handle: u64,
    sent: bool,
    finished: bool,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let mut st = self.shared.lock();
        if self.sent {
            // The reply will still arrive and must be parsed; just drop it then.
            if let Some(p) = st.map.get_mut(&self.handle) {
                p.tx = None;
            }
        } else {
            st.map.remove(&self.handle);
            if st.map.is_empty() {
                self.shared.idle.notify_waiters();
            }
        }
    }
}

enum Outbound {
    Request {
        hdr: [u8; RequestHeader::LEN],
        payload: Option<Bytes>,
    },
    Disconnect(oneshot::Sender<()>),
}

// ---------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------

/// A connection to one export of an NBD server.
pub struct Client {
    details: ExportDetails,
    tx: mpsc::Sender<Outbound>,
    shared: Arc<Shared>,
    reader: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Client {
    fn drop(&mut self) {
        // The writer sends NBD_CMD_DISC when the channel closes; the reader
        // is no longer needed.
        if let Some(h) = self.reader.lock().ok().and_then(|mut g| g.take()) {
            h.abort();
        }
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("details", &self.details)
            .finish_non_exhaustive()
    }
}

async fn with_timeout<T>(
    t: Option<Duration>,
    f: impl std::future::Future<Output = Result<T, ClientError>>,
) -> Result<T, ClientError> {
    match t {
        Some(t) => tokio::time::timeout(t, f).await.map_err(|_| {
            ClientError::Io(io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))
        })?,
        None => f.await,
    }
}

impl Client {
    /// Connect to `uri` (`nbd://host[:port][/name]` or
    /// `nbd+unix:///[name]?socket=PATH`) with default options.
    pub async fn connect(uri: &str) -> Result<Client, ClientError> {
        Self::connect_with(uri, ClientOptions::default()).await
    }

    /// Connect with explicit options.
    pub async fn connect_with(uri: &str, opts: ClientOptions) -> Result<Client, ClientError> {
        let u: NbdUri = uri.parse()?;
        let t = opts.connect_timeout;
        with_timeout(t, async move {
            match &u.endpoint {
                Endpoint::Tcp { host, port } => {
                    let s = TcpStream::connect((host.as_str(), *port)).await?;
                    s.set_nodelay(true)?;
                    Self::handshake_stream(s, &u.export_name, &opts).await
                }
                Endpoint::Unix(p) => {
                    let s = UnixStream::connect(p).await?;
                    Self::handshake_stream(s, &u.export_name, &opts).await
                }
            }
        })
        .await
    }

    /// Run the handshake over an already-connected stream.
    pub async fn from_stream<S>(
        stream: S,
        export_name: &str,
        opts: ClientOptions,
    ) -> Result<Client, ClientError>
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let t = opts.connect_timeout;
        with_timeout(t, Self::handshake_stream(stream, export_name, &opts)).await
    }

    /// List the server's exports (`NBD_OPT_LIST`), then abort the session.
    pub async fn list_exports(uri: &str) -> Result<Vec<ServerEntry>, ClientError> {
        let u: NbdUri = uri.parse()?;
        async fn run<S: AsyncRead + AsyncWrite + Unpin>(
            s: S,
        ) -> Result<Vec<ServerEntry>, ClientError> {
            let (rd, wr) = tokio::io::split(s);
            let mut rd = BufReader::new(rd);
            let mut wr = BufWriter::new(wr);
            let _no_zeroes = greet(&mut rd, &mut wr, true).await?;
            send_option(&mut wr, &ClientOption::List).await?;
            let mut out = Vec::new();
            loop {
                let (t, data) = read_option_reply(&mut rd, opt::LIST).await?;
                match t {
                    rep::SERVER => out.push(ServerEntry::decode_data(&data)?),
                    rep::ACK => break,
                    t if rep::is_error(t) => return Err(rejected(opt::LIST, t, &data)),
                    t => return Err(ClientError::Protocol(format!("unexpected reply {t:#x}"))),
                }
            }
            send_option(&mut wr, &ClientOption::Abort).await?;
            // The server SHOULD ack; tolerate it closing instead.
            let _ = read_option_reply(&mut rd, opt::ABORT).await;
            Ok(out)
        }
        match &u.endpoint {
            Endpoint::Tcp { host, port } => {
                run(TcpStream::connect((host.as_str(), *port)).await?).await
            }
            Endpoint::Unix(p) => run(UnixStream::connect(p).await?).await,
        }
    }

    async fn handshake_stream<S>(
        stream: S,
        export_name: &str,
        opts: &ClientOptions,
    ) -> Result<Client, ClientError>
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let (rd, wr) = tokio::io::split(stream);
        let mut rd = BufReader::with_capacity(IO_BUF, rd);
        let mut wr = BufWriter::with_capacity(IO_BUF, wr);
        let (details, context_id) = negotiate(&mut rd, &mut wr, export_name, opts).await?;
        let (dead_tx, dead_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            next_handle: AtomicU64::new(1),
            idle: Notify::new(),
            dead: dead_tx,
            structured: details.structured,
            context_id,
        });
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(writer_task(wr, rx, dead_rx, shared.clone()));
        let reader = tokio::spawn(reader_task(rd, shared.clone()));
        Ok(Client {
            details,
            tx,
            shared,
            reader: Mutex::new(Some(reader)),
        })
    }

    /// What the handshake established.
    pub fn info(&self) -> &ExportDetails {
        &self.details
    }

    /// Export size in bytes.
    pub fn size(&self) -> u64 {
        self.details.size
    }

    /// True once the connection is closed or closing.
    pub fn is_closed(&self) -> bool {
        let st = self.shared.lock();
        st.closed.is_some() || st.closing
    }

    /// Requests sent (or being sent) and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.shared.lock().map.len()
    }

    fn check_range(&self, offset: u64, len: u32) -> Result<(), ClientError> {
        let d = &self.details;
        match offset.checked_add(u64::from(len)) {
            Some(end) if end <= d.size => {}
            _ => {
                return Err(ClientError::InvalidArgument(format!(
                    "range {offset}+{len} exceeds export size {}",
                    d.size
                )))
            }
        }
        let mb = u64::from(d.min_block.max(1));
        if !offset.is_multiple_of(mb) || u64::from(len) % mb != 0 {
            return Err(ClientError::InvalidArgument(format!(
                "range {offset}+{len} not aligned to minimum block size {mb}"
            )));
        }
        Ok(())
    }

    fn check_payload(&self, len: u32) -> Result<(), ClientError> {
        if len > self.details.max_block {
            return Err(ClientError::InvalidArgument(format!(
                "length {len} exceeds maximum payload {}",
                self.details.max_block
            )));
        }
        Ok(())
    }

    async fn submit(
        &self,
        command: Command,
        flags: u16,
        offset: u64,
        length: u32,
        payload: Option<Bytes>,
        acc: Acc,
    ) -> Result<Done, ClientError> {
        let handle = self.shared.next_handle.fetch_add(1, Ordering::Relaxed);
        let (otx, orx) = oneshot::channel();
        {
            let mut st = self.shared.lock();
            if let Some(r) = &st.closed {
                return Err(ClientError::Disconnected(r.clone()));
            }
            if st.closing {
                return Err(ClientError::Disconnected("client is disconnecting".into()));
            }
            st.map.insert(
                handle,
                Pending {
                    acc,
                    tx: Some(otx),
                    error: None,
                },
            );
        }
        let mut reg = Registration {
            shared: &self.shared,
            handle,
            sent: false,
            finished: false,
        };
        let hdr = RequestHeader {
            flags,
            command,
            handle,
            offset,
            length,
        }
        .encode();
        if self
            .tx
            .send(Outbound::Request { hdr, payload })
            .await
            .is_err()
        {
            return Err(ClientError::Disconnected("writer stopped".into()));
        }
        reg.sent = true;
        let r = orx
            .await
            .unwrap_or_else(|_| Err(ClientError::Disconnected("connection closed".into())));
        reg.finished = true;
        r
    }

    /// `NBD_CMD_READ` of `len` bytes at `offset`.
    pub async fn read(&self, offset: u64, len: u32) -> Result<Bytes, ClientError> {
        self.check_range(offset, len)?;
        self.check_payload(len)?;
        let acc = Acc::Read {
            offset,
            len,
            buf: BytesMut::zeroed(len as usize),
            ranges: Vec::new(),
        };
        match self
            .submit(Command::Read, 0, offset, len, None, acc)
            .await?
        {
            Done::Data(d) => Ok(d),
            _ => Err(ClientError::Protocol("read completed without data".into())),
        }
    }

    /// `NBD_CMD_WRITE` of `data` at `offset`, optionally with FUA.
    pub async fn write(
        &self,
        offset: u64,
        data: impl Into<Bytes>,
        fua: bool,
    ) -> Result<(), ClientError> {
        let data = data.into();
        let len = u32::try_from(data.len())
            .map_err(|_| ClientError::InvalidArgument("write larger than 4 GiB".into()))?;
        self.check_range(offset, len)?;
        self.check_payload(len)?;
        let flags = self.fua_flag(fua)?;
        self.submit(Command::Write, flags, offset, len, Some(data), Acc::Other)
            .await
            .map(|_| ())
    }

    /// `NBD_CMD_FLUSH`.
    pub async fn flush(&self) -> Result<(), ClientError> {
        if !self.details.can_flush() {
            return Err(ClientError::Unsupported("flush"));
        }
        self.submit(Command::Flush, 0, 0, 0, None, Acc::Other)
            .await
            .map(|_| ())
    }

    /// `NBD_CMD_TRIM`.
    pub async fn trim(&self, offset: u64, len: u32, fua: bool) -> Result<(), ClientError> {
        if !self.details.can_trim() {
            return Err(ClientError::Unsupported("trim"));
        }
        let flags = self.fua_flag(fua)?;
        self.no_data(Command::Trim, flags, offset, len).await
    }

    /// `NBD_CMD_WRITE_ZEROES`.
    pub async fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        flags: WriteZeroesFlags,
    ) -> Result<(), ClientError> {
        if !self.details.can_zero() {
            return Err(ClientError::Unsupported("write zeroes"));
        }
        let mut f = self.fua_flag(flags.fua)?;
        if flags.fast_zero && !self.details.can_fast_zero() {
            return Err(ClientError::Unsupported("fast zero"));
        }
        if flags.no_hole {
            f |= cmd_flags::NO_HOLE;
        }
        if flags.fast_zero {
            f |= cmd_flags::FAST_ZERO;
        }
        self.no_data(Command::WriteZeroes, f, offset, len).await
    }

    /// `NBD_CMD_CACHE` (prefetch hint).
    pub async fn cache(&self, offset: u64, len: u32) -> Result<(), ClientError> {
        if !self.details.can_cache() {
            return Err(ClientError::Unsupported("cache"));
        }
        self.no_data(Command::Cache, 0, offset, len).await
    }

    /// `cmd_flags::FUA` if `fua` (which the export MUST support), else 0.
    fn fua_flag(&self, fua: bool) -> Result<u16, ClientError> {
        match fua {
            false => Ok(0),
            true if self.details.can_fua() => Ok(cmd_flags::FUA),
            true => Err(ClientError::Unsupported("FUA")),
        }
    }

    /// A command that carries no data either way, after the range check.
    async fn no_data(
        &self,
        cmd: Command,
        flags: u16,
        offset: u64,
        len: u32,
    ) -> Result<(), ClientError> {
        self.check_range(offset, len)?;
        self.submit(cmd, flags, offset, len, None, Acc::Other)
            .await
            .map(|_| ())
    }

    /// `NBD_CMD_BLOCK_STATUS` for `base:allocation`. With `req_one` the
    /// answer is exactly one extent no longer than `len`; otherwise one or
    /// more consecutive extents starting at `offset`.
    pub async fn block_status(
        &self,
        offset: u64,
        len: u32,
        req_one: bool,
    ) -> Result<Vec<Extent>, ClientError> {
        if !self.details.base_allocation {
            return Err(ClientError::Unsupported("block status (base:allocation)"));
        }
        if len == 0 {
            return Err(ClientError::InvalidArgument(
                "block status length MUST be nonzero".into(),
            ));
        }
        self.check_range(offset, len)?;
        let flags = if req_one { cmd_flags::REQ_ONE } else { 0 };
        let acc = Acc::Status {
            len,
            req_one,
            extents: None,
        };
        match self
            .submit(Command::BlockStatus, flags, offset, len, None, acc)
            .await?
        {
            Done::Extents(e) => Ok(e),
            _ => Err(ClientError::Protocol("block status without extents".into())),
        }
    }

    /// Soft disconnect: refuse new requests, wait for in-flight ones, send
    /// `NBD_CMD_DISC`, and wait (up to 10 s) for the server to close.
    pub async fn disconnect(&self) -> Result<(), ClientError> {
        {
            let mut st = self.shared.lock();
            if st.closed.is_some() || st.closing {
                return Ok(());
            }
            st.closing = true;
        }
        loop {
            let notified = self.shared.idle.notified();
            {
                let st = self.shared.lock();
                if st.map.is_empty() || st.closed.is_some() {
                    break;
                }
            }
            notified.await;
        }
        let (ack_tx, ack_rx) = oneshot::channel();
        if self.tx.send(Outbound::Disconnect(ack_tx)).await.is_ok() {
            let _ = ack_rx.await;
        }
        let reader = self.reader.lock().ok().and_then(|mut g| g.take());
        if let Some(h) = reader {
            if tokio::time::timeout(Duration::from_secs(10), h)
                .await
                .is_err()
            {
                return Err(ClientError::Io(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "server did not close the connection after NBD_CMD_DISC",
                )));
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Handshake
// ---------------------------------------------------------------------------

fn rejected(option: u32, reply_type: u32, data: &[u8]) -> ClientError {
    ClientError::OptionRejected {
        option,
        reply_type,
        message: String::from_utf8_lossy(data).into_owned(),
    }
}

/// Read the greeting and send client flags. Returns (fixed newstyle, NO_ZEROES in effect).
async fn greet<R, W>(
    rd: &mut R,
    wr: &mut W,
    require_fixed: bool,
) -> Result<(bool, bool), ClientError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut g = [0u8; proto::GREETING_LEN];
    rd.read_exact(&mut g).await?;
    let hflags = proto::decode_server_greeting(&g)?;
    let fixed = hflags & handshake_flags::FIXED_NEWSTYLE != 0;
    if require_fixed && !fixed {
        return Err(ClientError::Protocol(
            "server does not support fixed newstyle".into(),
        ));
    }
    let no_zeroes = hflags & handshake_flags::NO_ZEROES != 0;
    let mut cf = 0;
    if fixed {
        cf |= client_flags::FIXED_NEWSTYLE;
    }
    if no_zeroes {
        cf |= client_flags::NO_ZEROES;
    }
    wr.write_all(&proto::encode_client_flags(cf)).await?;
    wr.flush().await?;
    Ok((fixed, no_zeroes))
}

async fn send_option<W: AsyncWrite + Unpin>(wr: &mut W, o: &ClientOption) -> io::Result<()> {
    wr.write_all(&o.encode()).await?;
    wr.flush().await
}

async fn read_option_reply<R: AsyncRead + Unpin>(
    rd: &mut R,
    option: u32,
) -> Result<(u32, Vec<u8>), ClientError> {
    let mut h = [0u8; OptionReplyHeader::LEN];
    rd.read_exact(&mut h).await?;
    let h = OptionReplyHeader::decode(&h)?;
    if h.option != option {
        return Err(ClientError::Protocol(format!(
            "reply for option {} while waiting for {option}",
            h.option
        )));
    }
    if h.length > MAX_OPTION_REPLY {
        return Err(ClientError::Protocol(format!(
            "option reply of {} bytes is too large",
            h.length
        )));
    }
    let mut data = vec![0u8; h.length as usize];
    rd.read_exact(&mut data).await?;
    Ok((h.reply_type, data))
}

async fn negotiate<R, W>(
    rd: &mut R,
    wr: &mut W,
    name: &str,
    opts: &ClientOptions,
) -> Result<(ExportDetails, Option<u32>), ClientError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (fixed, no_zeroes) = greet(rd, wr, false).await?;

    let mut details = ExportDetails {
        name: name.to_string(),
        description: String::new(),
        size: 0,
        flags: 0,
        min_block: 1,
        pref_block: 4096,
        max_block: proto::SAFE_PAYLOAD_LEN,
        structured: false,
        base_allocation: false,
    };
    if !fixed {
        // Non-fixed newstyle: only NBD_OPT_EXPORT_NAME is possible.
        return export_name(rd, wr, name, no_zeroes, details)
            .await
            .map(|d| (d, None));
    }

    if opts.structured_replies {
        send_option(wr, &ClientOption::StructuredReply).await?;
        let (t, data) = read_option_reply(rd, opt::STRUCTURED_REPLY).await?;
        match t {
            rep::ACK => details.structured = true,
            t if rep::is_error(t) => {}
            t => {
                return Err(ClientError::Protocol(format!(
                    "unexpected reply {t:#x} to STRUCTURED_REPLY ({} bytes)",
                    data.len()
                )))
            }
        }
    }

    let mut context_id = None;
    if details.structured && opts.base_allocation {
        send_option(
            wr,
            &ClientOption::SetMetaContext(MetaContextRequest {
                export: name.to_string(),
                queries: vec![BASE_ALLOCATION.to_string()],
            }),
        )
        .await?;
        loop {
            let (t, data) = read_option_reply(rd, opt::SET_META_CONTEXT).await?;
            match t {
                rep::META_CONTEXT => {
                    let e = MetaContextEntry::decode_data(&data)?;
                    if e.name == BASE_ALLOCATION {
                        context_id = Some(e.id);
                    }
                }
                rep::ACK => break,
                t if rep::is_error(t) => {
                    context_id = None;
                    break;
                }
                t => return Err(ClientError::Protocol(format!("unexpected reply {t:#x}"))),
            }
        }
    }

    send_option(
        wr,
        &ClientOption::Go(InfoRequest {
            name: name.to_string(),
            requests: vec![info::BLOCK_SIZE, info::NAME, info::DESCRIPTION],
        }),
    )
    .await?;
    let mut got_export = false;
    loop {
        let (t, data) = read_option_reply(rd, opt::GO).await?;
        match t {
            rep::INFO => match InfoReply::decode_data(&data)? {
                InfoReply::Export { size, flags } => {
                    details.size = size;
                    details.flags = flags;
                    got_export = true;
                }
                InfoReply::Name(n) => details.name = n,
                InfoReply::Description(d) => details.description = d,
                InfoReply::BlockSize {
                    min,
                    preferred,
                    max,
                } => {
                    if !min.is_power_of_two() || max < min {
                        return Err(ClientError::Protocol(format!(
                            "invalid block sizes min={min} pref={preferred} max={max}"
                        )));
                    }
                    details.min_block = min;
                    details.pref_block = preferred;
                    details.max_block = max;
                }
                InfoReply::Unknown { .. } => {} // MUST ignore
            },
            rep::ACK => {
                if !got_export {
                    return Err(ClientError::Protocol(
                        "NBD_OPT_GO succeeded without NBD_INFO_EXPORT".into(),
                    ));
                }
                break;
            }
            rep::ERR_UNSUP => {
                // Old server: fall back to EXPORT_NAME.
                return export_name(rd, wr, name, no_zeroes, details)
                    .await
                    .map(|d| (d, context_id));
            }
            t if rep::is_error(t) => return Err(rejected(opt::GO, t, &data)),
            t => return Err(ClientError::Protocol(format!("unexpected reply {t:#x}"))),
        }
    }
    details.base_allocation = context_id.is_some();
    Ok((details, context_id))
}

async fn export_name<R, W>(
    rd: &mut R,
    wr: &mut W,
    name: &str,
    no_zeroes: bool,
    mut details: ExportDetails,
) -> Result<ExportDetails, ClientError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    send_option(wr, &ClientOption::ExportName(name.to_string())).await?;
    let mut b = [0u8; proto::EXPORT_NAME_REPLY_LEN + proto::EXPORT_NAME_ZEROES];
    let n = if no_zeroes {
        proto::EXPORT_NAME_REPLY_LEN
    } else {
        b.len()
    };
    rd.read_exact(&mut b[..n]).await.map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            ClientError::Protocol(format!(
                "server closed the connection: export {name:?} refused"
            ))
        } else {
            ClientError::Io(e)
        }
    })?;
    let (size, flags) = proto::decode_export_name_reply(&b[..n])?;
    details.size = size;
    details.flags = flags;
    Ok(details)
}

// ---------------------------------------------------------------------------
// Transmission tasks
// ---------------------------------------------------------------------------

async fn writer_task<W: AsyncWrite + Unpin>(
    mut wr: BufWriter<W>,
    mut rx: mpsc::Receiver<Outbound>,
    mut dead: watch::Receiver<bool>,
    shared: Arc<Shared>,
) {
    let disc = RequestHeader {
        flags: 0,
        command: Command::Disc,
        handle: 0,
        offset: 0,
        length: 0,
    }
    .encode();
    let mut dirty = false;
    loop {
        let msg = match rx.try_recv() {
            Ok(m) => Some(m),
            Err(mpsc::error::TryRecvError::Disconnected) => None,
            Err(mpsc::error::TryRecvError::Empty) => {
                if dirty {
                    if let Err(e) = wr.flush().await {
                        shared.fail_all(format!("write failed: {e}"));
                        return;
                    }
                }
                tokio::select! {
                    biased;
                    _ = dead.wait_for(|d| *d) => return,
                    m = rx.recv() => m,
                }
            }
        };
        match msg {
            Some(Outbound::Request { hdr, payload }) => {
                let r = async {
                    wr.write_all(&hdr).await?;
                    if let Some(p) = payload {
                        wr.write_all(&p).await?;
                    }
                    Ok::<_, io::Error>(())
                }
                .await;
                if let Err(e) = r {
                    shared.fail_all(format!("write failed: {e}"));
                    return;
                }
                dirty = true;
            }
            Some(Outbound::Disconnect(ack)) => {
                let _ = wr.write_all(&disc).await;
                let _ = wr.flush().await;
                let _ = wr.shutdown().await;
                let _ = ack.send(());
                return;
            }
            None => {
                // Client dropped: soft disconnect.
                let _ = wr.write_all(&disc).await;
                let _ = wr.flush().await;
                let _ = wr.shutdown().await;
                return;
            }
        }
    }
}

async fn reader_task<R: AsyncRead + Unpin>(mut rd: BufReader<R>, shared: Arc<Shared>) {
    let reason = match read_replies(&mut rd, &shared).await {
        Ok(()) => "connection closed by server".to_string(),
        Err(e) => e,
    };
    shared.fail_all(reason);
}

fn to_nbd_error(v: u32, message: String) -> NbdError {
    match ErrorCode::from_wire(v) {
        Some(c) => NbdError::new(c, message),
        // Spec: treat unexpected error values as EINVAL.
        None => NbdError::inval(format!("unknown error value {v}: {message}")),
    }
}

/// Returns Ok on clean EOF between replies, Err(reason) otherwise.
async fn read_replies<R: AsyncRead + Unpin>(
    rd: &mut BufReader<R>,
    shared: &Shared,
) -> Result<(), String> {
    loop {
        let mut hb = [0u8; ChunkHeader::LEN];
        match rd.read_exact(&mut hb[..4]).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(format!("read failed: {e}")),
        }
        let hl =
            ReplyHeader::header_len([hb[0], hb[1], hb[2], hb[3]]).map_err(|e| e.to_string())?;
        rd.read_exact(&mut hb[4..hl])
            .await
            .map_err(|e| format!("read failed: {e}"))?;
        match ReplyHeader::decode(&hb[..hl]).map_err(|e| e.to_string())? {
            ReplyHeader::Simple(h) => {
                // Which request is this, and does it carry data?
                let read_len = {
                    let st = shared.lock();
                    match st.map.get(&h.handle) {
                        None => return Err(format!("reply for unknown handle {}", h.handle)),
                        Some(p) => match &p.acc {
                            Acc::Read { len, .. } => {
                                if shared.structured {
                                    return Err("simple reply to READ after structured replies were negotiated".into());
                                }
                                Some(*len)
                            }
                            Acc::Status { .. } if h.error == 0 => {
                                return Err(
                                    "successful block status needs a structured reply".into()
                                )
                            }
                            _ => None,
                        },
                    }
                };
                let r = if h.error != 0 {
                    Err(ClientError::Server(to_nbd_error(h.error, String::new())))
                } else if let Some(len) = read_len {
                    let mut buf = BytesMut::zeroed(len as usize);
                    rd.read_exact(&mut buf)
                        .await
                        .map_err(|e| format!("read payload failed: {e}"))?;
                    Ok(Done::Data(buf.freeze()))
                } else {
                    Ok(Done::Unit)
                };
                shared.complete(h.handle, r);
            }
            ReplyHeader::Chunk(h) => {
                if !shared.structured {
                    return Err("structured reply without negotiation".into());
                }
                if h.length > MAX_CHUNK {
                    return Err(format!("chunk of {} bytes is too large", h.length));
                }
                let mut buf = BytesMut::zeroed(h.length as usize);
                rd.read_exact(&mut buf)
                    .await
                    .map_err(|e| format!("read chunk failed: {e}"))?;
                let payload =
                    ChunkPayload::decode(h.kind, buf.freeze()).map_err(|e| e.to_string())?;
                let finished = {
                    let mut st = shared.lock();
                    let p = st
                        .map
                        .get_mut(&h.handle)
                        .ok_or_else(|| format!("chunk for unknown handle {}", h.handle))?;
                    apply_chunk(p, &h, payload, shared.context_id)?;
                    if h.is_done() {
                        let p = st.map.remove(&h.handle).expect("present");
                        if st.map.is_empty() {
                            shared.idle.notify_waiters();
                        }
                        Some(p)
                    } else {
                        None
                    }
                };
                if let Some(p) = finished {
                    let Pending { acc, tx, error } = p;
                    let r = finish(acc, error)?;
                    if let Some(tx) = tx {
                        let _ = tx.send(r);
                    }
                }
            }
        }
    }
}

/// The part of a read's buffer that a chunk of `n` bytes at `offset`
/// fills, recorded as received; an error if the request is not a read or
/// the chunk falls outside it.
fn read_target<'a>(
    acc: &'a mut Acc,
    offset: u64,
    n: u64,
    what: &str,
) -> Result<&'a mut [u8], String> {
    let Acc::Read {
        offset: ro,
        len,
        buf,
        ranges,
    } = acc
    else {
        return Err(format!("{what} for a non-read request"));
    };
    let start = offset
        .checked_sub(*ro)
        .filter(|s| s + n <= u64::from(*len))
        .ok_or_else(|| format!("{what} outside the requested range"))?;
    ranges.push((start, n));
    Ok(&mut buf[start as usize..(start + n) as usize])
}

fn apply_chunk(
    p: &mut Pending,
    h: &ChunkHeader,
    payload: ChunkPayload,
    context_id: Option<u32>,
) -> Result<(), String> {
    let mut record = |e: NbdError| {
        if p.error.is_none() {
            p.error = Some(e);
        }
    };
    match payload {
        ChunkPayload::None => {
            if !h.is_done() {
                return Err("NONE chunk without DONE flag".into());
            }
        }
        ChunkPayload::Error { error, message } => record(to_nbd_error(error, message)),
        ChunkPayload::ErrorOffset { error, message, .. } => record(to_nbd_error(error, message)),
        ChunkPayload::Unknown { kind, error, .. } => {
            if kind & chunk_type::ERR_BIT != 0 {
                record(to_nbd_error(
                    error.unwrap_or(ErrorCode::Inval.to_wire()),
                    format!("unknown error chunk type {kind:#x}"),
                ));
            } else {
                return Err(format!("unknown chunk type {kind}"));
            }
        }
        ChunkPayload::OffsetData { offset, data } => {
            read_target(&mut p.acc, offset, data.len() as u64, "OFFSET_DATA")?
                .copy_from_slice(&data);
        }
        ChunkPayload::OffsetHole { offset, len: hl } => {
            read_target(&mut p.acc, offset, hl.into(), "OFFSET_HOLE")?.fill(0);
        }
        ChunkPayload::BlockStatus {
            context_id: id,
            extents,
        } => {
            let Acc::Status {
                len,
                req_one,
                extents: slot,
            } = &mut p.acc
            else {
                return Err("BLOCK_STATUS for a non-block-status request".into());
            };
            if Some(id) != context_id {
                return Err(format!("BLOCK_STATUS for unknown context id {id}"));
            }
            if slot.is_some() {
                return Err("duplicate BLOCK_STATUS chunk".into());
            }
            if *req_one && (extents.len() != 1 || extents[0].len > *len) {
                return Err("REQ_ONE violated: need exactly one extent within the request".into());
            }
            *slot = Some(extents);
        }
    }
    Ok(())
}

fn finish(acc: Acc, error: Option<NbdError>) -> Result<Result<Done, ClientError>, String> {
    if let Some(e) = error {
        return Ok(Err(ClientError::Server(e)));
    }
    match acc {
        Acc::Read {
            len,
            buf,
            mut ranges,
            ..
        } => {
            ranges.sort_unstable();
            let mut cur = 0u64;
            for (s, l) in ranges {
                if s != cur {
                    return Err("read reply chunks overlap or leave a gap".into());
                }
                cur += l;
            }
            if cur != u64::from(len) {
                return Err(format!("read reply covered {cur} of {len} bytes"));
            }
            Ok(Ok(Done::Data(buf.freeze())))
        }
        Acc::Status { extents, .. } => match extents {
            Some(e) => Ok(Ok(Done::Extents(e))),
            None => Err("block status reply without a BLOCK_STATUS chunk".into()),
        },
        Acc::Other => Ok(Ok(Done::Unit)),
    }
}
