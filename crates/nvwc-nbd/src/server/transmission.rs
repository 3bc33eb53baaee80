//! Per-connection driver: handshake (with STARTTLS), then the concurrent
//! transmission phase.

use std::any::Any;
use std::future::Future;
use std::os::fd::{AsFd, OwnedFd};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use tokio::io::Interest;
use tokio::io::{
    AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter, ReadHalf, WriteHalf,
};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use super::handshake::{greeting, options, Negotiated, Outcome, BASE_ALLOCATION_ID};
use super::tls::{BoxStream, TlsState};
use super::{EventHook, Inner, ServerEvent};
use crate::error::{ErrorCode, NbdError};
use crate::export::{
    BoxFuture, DirectSource, Export, ExportInfo, NbdResult, OpFuture, RequestCtx, WriteZeroesFlags,
};
use crate::proto::{
    self, cmd_flags, reply_flags, ChunkPayload, Command, Extent, RequestHeader, SimpleReplyHeader,
};

const IO_BUF: usize = 128 * 1024;
/// A write at least this large makes the next header be read unbuffered.
const LARGE_WRITE: u32 = 16 * 1024;
/// Largest payload `payload_queued` waits for: well inside what a unix
/// socket queues by default (`net.core.wmem_default`, 208 KiB), so a client
/// is never blocked on a full socket while we wait for it.
const MAX_DIRECT_WAIT_LEN: u32 = 128 * 1024;
/// Most extents we send in one `BLOCK_STATUS` chunk (spec: SHOULD NOT exceed 2^20).
const MAX_EXTENTS: usize = 1 << 20;

/// Read a write's `len`-byte payload: what the reader has buffered, then the
/// rest straight from the socket into the payload buffer (no second copy
/// through the read buffer, and no zeroing of memory about to be filled).
async fn read_payload<R: AsyncRead + Unpin>(
    rd: &mut BufReader<R>,
    len: usize,
) -> std::io::Result<Bytes> {
    use bytes::BufMut;
    use tokio::io::AsyncBufReadExt;
    let mut buf = BytesMut::with_capacity(len);
    let have = rd.buffer().len().min(len);
    buf.extend_from_slice(&rd.buffer()[..have]);
    rd.consume(have);
    // The read buffer is empty now unless it already held the whole payload.
    while buf.len() < len {
        let want = len - buf.len();
        if rd.get_mut().read_buf(&mut (&mut buf).limit(want)).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(buf.freeze())
}

/// A reply queued for the writer task.
enum Outgoing {
    Simple {
        handle: u64,
        error: u32,
        data: Option<Bytes>,
    },
    Chunk {
        handle: u64,
        flags: u16,
        payload: ChunkPayload,
    },
}

/// A reply plus the memory-budget permit covering its data, if any.
type Queued = (Outgoing, Option<OwnedSemaphorePermit>);

/// Unit of the per-connection payload memory budget.
const BUDGET_UNIT: usize = 4096;

/// Result of a successful export operation.
enum OpOutput {
    Unit,
    Data(Bytes),
    Extents(Vec<Extent>),
}

/// Connection state shared with request tasks.
struct Conn {
    conn_id: u64,
    name: Arc<str>,
    export: Arc<dyn Export>,
    info: ExportInfo,
    structured: bool,
    base_allocation: bool,
    hook: Option<EventHook>,
}

impl Conn {
    fn error_event(&self, hdr: &RequestHeader, e: &NbdError) {
        if let Some(h) = &self.hook {
            h(ServerEvent::RequestError {
                conn_id: self.conn_id,
                command: format!("{:?}", hdr.command),
                code: format!("{:?}", e.code),
                message: e.message.to_string(),
            });
        }
    }
}

/// Why the transmission phase ended (the reason names the cause for logs).
enum End {
    /// `NBD_CMD_DISC`, EOF, or shutdown drained: finish in-flight work, flush, close.
    Graceful(&'static str),
    /// Protocol violation or broken stream: close immediately.
    Hard(&'static str),
}

/// Run `fut` until `deadline` (if any); `None` when it passed.
async fn until<T>(
    deadline: Option<tokio::time::Instant>,
    fut: impl Future<Output = std::io::Result<T>>,
) -> Option<std::io::Result<T>> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d, fut).await.ok(),
        None => Some(fut.await),
    }
}

pub(crate) async fn run_connection<S>(
    inner: Arc<Inner>,
    stream: S,
    conn_id: u64,
    direct: Option<OwnedFd>,
) where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (rd, wr) = tokio::io::split(stream);
    let mut rd = BufReader::with_capacity(IO_BUF, rd);
    let mut wr = BufWriter::with_capacity(IO_BUF, wr);

    let gone = |reason: String, refused_tls: bool| {
        // A plain client turned away by `--tls require` says so in the log.
        let reason = if refused_tls {
            format!("tls-required: {reason}")
        } else {
            reason
        };
        inner.emit(|| ServerEvent::Disconnected {
            conn_id,
            reason,
            requests: 0,
        })
    };
    // The whole handshake, TLS included, has one time limit.
    let deadline = inner
        .config
        .handshake_timeout
        .map(|t| tokio::time::Instant::now() + t);
    let mut sess = match until(deadline, greeting(&inner, &mut rd, &mut wr)).await {
        None => return gone("handshake-timeout".into(), false),
        Some(Err(e)) => return gone(format!("handshake-error: {e}"), false),
        Some(Ok(s)) => s,
    };
    let out = until(deadline, options(&inner, &mut rd, &mut wr, &mut sess)).await;
    match out {
        None => return gone("handshake-timeout".into(), sess.refused_tls),
        // Hard disconnect: drop both halves.
        Some(Err(e)) => return gone(format!("handshake-error: {e}"), sess.refused_tls),
        Some(Ok(Outcome::Closed)) => {
            let _ = wr.shutdown().await;
            return gone("handshake-abort".into(), sess.refused_tls);
        }
        Some(Ok(Outcome::Transmit(nego))) => {
            return serve(&inner, rd, wr, conn_id, direct, nego, None).await;
        }
        Some(Ok(Outcome::StartTls)) => {}
    }
    let Some(acceptor) = inner.tls.acceptor.clone() else {
        return gone(
            "handshake-error: STARTTLS without a TLS acceptor".into(),
            false,
        );
    };
    // STARTTLS acknowledged. A client waits for that reply before its TLS
    // ClientHello, but whatever it sent early is in the read buffer: the
    // TLS handshake reads that first.
    let early = rd.buffer().to_vec();
    let stream = rd.into_inner().unsplit(wr.into_inner());
    let plain: BoxStream = if early.is_empty() {
        Box::new(stream)
    } else {
        Box::new(Prefixed {
            early,
            pos: 0,
            inner: stream,
        })
    };
    let tls = match until(deadline, acceptor.accept(plain)).await {
        None => return gone("handshake-timeout (in the TLS handshake)".into(), false),
        Some(Err(e)) => return gone(format!("tls-handshake-failed: {e}"), false),
        Some(Ok(t)) => t,
    };
    sess.tls = TlsState::Active;
    let (rd, wr) = tokio::io::split(tls.stream);
    let mut rd = BufReader::with_capacity(IO_BUF, rd);
    let mut wr = BufWriter::with_capacity(IO_BUF, wr);
    match until(deadline, options(&inner, &mut rd, &mut wr, &mut sess)).await {
        None => gone("handshake-timeout".into(), false),
        Some(Err(e)) => gone(format!("handshake-error: {e}"), false),
        Some(Ok(Outcome::Transmit(nego))) => {
            // The socket carries ciphertext: no direct writes.
            serve(&inner, rd, wr, conn_id, None, nego, Some(tls.peer)).await
        }
        Some(Ok(Outcome::Closed | Outcome::StartTls)) => {
            let _ = wr.shutdown().await;
            gone("handshake-abort".into(), false)
        }
    }
}

/// A stream whose first bytes are `early` (read before the stream changed hands).
struct Prefixed<S> {
    early: Vec<u8>,
    pos: usize,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.pos < self.early.len() {
            let n = (self.early.len() - self.pos).min(buf.remaining());
            let pos = self.pos;
            buf.put_slice(&self.early[pos..pos + n]);
            self.pos += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The transmission phase of a negotiated connection.
async fn serve<S>(
    inner: &Inner,
    rd: BufReader<ReadHalf<S>>,
    wr: BufWriter<WriteHalf<S>>,
    conn_id: u64,
    direct: Option<OwnedFd>,
    nego: Negotiated,
    tls: Option<String>,
) where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let Negotiated {
        name,
        export,
        info,
        structured,
        base_allocation,
    } = nego;
    export.on_connect(conn_id);
    inner.emit(|| ServerEvent::Ready {
        conn_id,
        export: name.clone(),
        structured,
        tls,
    });
    let conn = Arc::new(Conn {
        conn_id,
        name,
        export: export.clone(),
        info,
        structured,
        base_allocation,
        hook: inner.hook.clone(),
    });
    let (reason, requests) = transmission(inner, conn, rd, wr, direct).await;
    export.on_disconnect(conn_id);
    inner.emit(|| ServerEvent::Disconnected {
        conn_id,
        reason: reason.to_string(),
        requests,
    });
}

async fn transmission<S>(
    inner: &Inner,
    conn: Arc<Conn>,
    mut rd: BufReader<ReadHalf<S>>,
    wr: BufWriter<WriteHalf<S>>,
    direct_fd: Option<OwnedFd>,
) -> (&'static str, u64)
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    // The socket's second handle, with its own readiness (`payload_queued`).
    let direct_fd = direct_fd.and_then(|fd| UnixStream::from_std(fd.into()).ok());
    let max = inner.config.max_in_flight;
    let sem = Arc::new(Semaphore::new(max));
    // Payload memory budget, in 4 KiB units. A request never needs more than
    // the whole budget, so a single large request can always proceed.
    let budget_units = (inner.config.max_in_flight_bytes / BUDGET_UNIT)
        .clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize)) as u32;
    let budget = Arc::new(Semaphore::new(budget_units as usize));
    let units_for = |len: u32| -> u32 {
        (u64::from(len).div_ceil(BUDGET_UNIT as u64)).min(u64::from(budget_units)) as u32
    };
    let (tx, rx) = mpsc::channel::<Queued>(max + 16);
    let writer = tokio::spawn(writer_task(wr, rx, conn.export.clone()));
    let mut shutdown = inner.shutdown.subscribe();
    let mut requests = 0u64;
    // Requests run inline on the reader task first: one that completes at
    // once (a cache hit) costs no task spawn; one that must wait is spawned.
    let noop = std::task::Waker::from(Arc::new(NoopWake));

    // After a large write, the next header is read straight from the socket
    // when nothing is buffered: a buffered read would pull most of the next
    // payload into the read buffer, and `read_payload` would copy it again.
    let mut after_large_write = false;
    // What a direct write knew of the socket, for the next request: the
    // bytes still queued on it (`payload_queued`), and the start of the
    // next header, taken with the payload's end.
    let mut carried = Ahead::default();
    let end = loop {
        let mut ahead = std::mem::take(&mut carried);
        let mut hb = [0u8; RequestHeader::LEN];
        let have = ahead.header(&mut hb);
        debug_assert!(have == 0 || rd.buffer().is_empty());
        let direct = have > 0 || after_large_write && rd.buffer().is_empty();
        let read = if have == hb.len() {
            // The socket read this replaces would have spent the task's
            // budget: spend it here too, so that the reader still yields as
            // often, and the writer task (woken on this thread) sends the
            // replies that piled up.
            tokio::task::consume_budget().await;
            Ok(())
        } else {
            tokio::select! {
                biased;
                r = async {
                    if direct {
                        rd.get_mut().read_exact(&mut hb[have..]).await
                    } else {
                        rd.read_exact(&mut hb).await
                    }
                } => r.map(|_| ()),
                // The writer died (client gone): stop.
                _ = tx.closed() => break End::Hard("client-gone"),
                // Shutting down and nothing in flight: close.
                _ = async {
                    let _ = shutdown.wait_for(|s| *s).await;
                    sem.acquire_many(max as u32).await
                } => break End::Graceful("shutdown"),
            }
        };
        // A header read through the read buffer leaves the socket unknown.
        ahead.consumed(if direct {
            (hb.len() - have) as u64
        } else {
            u64::MAX
        });
        if read.is_err() {
            // EOF (possibly mid-header) or I/O error: the client is gone.
            break End::Graceful("eof");
        }
        let Ok(hdr) = RequestHeader::decode(&hb) else {
            // Bad request magic: hard disconnect this client only.
            break End::Hard("bad-request-magic");
        };

        // Consume the WRITE payload first so the stream stays in sync even
        // when the request is rejected.
        let mut payload = None;
        let mut bytes_permit = None;
        let mut permit = None;
        after_large_write = hdr.command == Command::Write && hdr.length >= LARGE_WRITE;
        if hdr.command == Command::Write && validate(&conn, &hdr).is_err() {
            // A write the export will not see (longer than the maximum
            // payload, whatever its length; out of range; read-only; bad
            // flags): its payload is read and dropped as it arrives, never
            // held, so the stream stays in sync at no memory cost, and the
            // error is answered below.
            let len = u64::from(hdr.length);
            let skipped =
                tokio::io::copy_buf(&mut (&mut rd).take(len), &mut tokio::io::sink()).await;
            if !matches!(skipped, Ok(n) if n == len) {
                break End::Graceful("eof-mid-request");
            }
        } else if hdr.command == Command::Write {
            let len = hdr.length;
            // A large write whose payload is all queued on a unix socket
            // (nothing of it in the read buffer) is offered to the export
            // to receive straight into its storage.
            if let Some(fd) = direct_fd.as_ref().filter(|_| {
                len >= LARGE_WRITE && rd.buffer().is_empty() && !inner.is_shutting_down()
            }) {
                let Ok(p) = sem.clone().acquire_owned().await else {
                    break End::Hard("internal");
                };
                permit = Some(p);
                if payload_queued(fd, len, &mut ahead.queued).await {
                    let after = ahead.queued - u64::from(len);
                    let mut src = DirectSource::new(fd.as_fd(), len as usize, after as usize);
                    let ctx = RequestCtx {
                        conn_id: conn.conn_id,
                        export: conn.name.clone(),
                        handle: hdr.handle,
                    };
                    let fua = hdr.flags & cmd_flags::FUA != 0;
                    let taken = conn
                        .export
                        .clone()
                        .write_direct(ctx, hdr.offset, len, fua, &mut src);
                    let left = src.remaining() as u64;
                    if left == 0 {
                        carried = Ahead::after(after, src.taken_ahead());
                    }
                    match taken {
                        Some(result) => {
                            if left > 0 {
                                // The export stopped early (an error): skip the rest.
                                let skipped = tokio::io::copy(
                                    &mut (&mut rd).take(left),
                                    &mut tokio::io::sink(),
                                )
                                .await;
                                if !matches!(skipped, Ok(n) if n == left) {
                                    break End::Graceful("eof-mid-request");
                                }
                            }
                            requests += 1;
                            let p = permit.take().expect("acquired above");
                            let fut = Box::pin(handle_request(
                                conn.clone(),
                                hdr,
                                Body::Direct(result),
                                tx.clone(),
                                p,
                                None,
                            ));
                            run_inline_or_spawn(fut, &noop);
                            continue;
                        }
                        None => assert_eq!(
                            left,
                            u64::from(len),
                            "an export declined a direct write after receiving from it"
                        ),
                    }
                }
            }
            let Ok(p) = budget.clone().acquire_many_owned(units_for(len)).await else {
                break End::Hard("internal");
            };
            bytes_permit = Some(p);
            let Ok(buf) = read_payload(&mut rd, len as usize).await else {
                // Disconnected mid-request: just end this connection.
                break End::Graceful("eof-mid-request");
            };
            payload = Some(buf);
        }

        if hdr.command == Command::Disc {
            break End::Graceful("disc");
        }

        if inner.is_shutting_down() {
            let msg = reply_for(
                &conn,
                &hdr,
                Err(NbdError::shutdown("server is shutting down")),
            );
            if tx.send((msg, None)).await.is_err() {
                break End::Hard("client-gone");
            }
            continue;
        }

        if let Err(e) = validate(&conn, &hdr) {
            conn.error_event(&hdr, &e);
            if tx
                .send((reply_for(&conn, &hdr, Err(e)), None))
                .await
                .is_err()
            {
                break End::Hard("client-gone");
            }
            continue;
        }

        if hdr.command == Command::Read {
            // Budget for the reply data, held until the writer has sent it.
            let Ok(p) = budget
                .clone()
                .acquire_many_owned(units_for(hdr.length))
                .await
            else {
                break End::Hard("internal");
            };
            bytes_permit = Some(p);
        }
        let permit = match permit {
            Some(p) => p,
            None => match sem.clone().acquire_owned().await {
                Ok(p) => p,
                Err(_) => break End::Hard("internal"),
            },
        };
        requests += 1;
        let fut = Box::pin(handle_request(
            conn.clone(),
            hdr,
            Body::Payload(payload),
            tx.clone(),
            permit,
            bytes_permit,
        ));
        run_inline_or_spawn(fut, &noop);
    };

    let reason = match end {
        End::Graceful(r) | End::Hard(r) => r,
    };
    match end {
        End::Graceful(_) => {
            drop(rd);
            // Wait for every in-flight request to queue its reply.
            let _all = sem.acquire_many(max as u32).await;
            drop(tx);
            if let Ok(Some(mut w)) = writer.await {
                let _ = w.shutdown().await;
            }
        }
        End::Hard(_) => {
            writer.abort();
            drop(rd);
            drop(tx);
            let _ = writer.await;
            // The socket is closed now; still wait for in-flight operations so
            // that on_disconnect runs after all of them.
            let _all = sem.acquire_many(max as u32).await;
        }
    }
    (reason, requests)
}

struct NoopWake;

impl std::task::Wake for NoopWake {
    fn wake(self: Arc<Self>) {}
}

/// Writes replies in the order they are queued (= completion order),
/// flushing whenever the queue is momentarily empty. Each batch (what is
/// queued when the writer wakes) is taken whole, then the export is told
/// (`Export::replies_sending`), then it is written. A reply's memory-budget
/// permit is released once it has been written. Returns the writer on a
/// clean end (channel closed), `None` after an I/O error.
async fn writer_task<W: AsyncWrite + Unpin>(
    mut wr: BufWriter<W>,
    mut rx: mpsc::Receiver<Queued>,
    export: Arc<dyn Export>,
) -> Option<BufWriter<W>> {
    let mut batch = Vec::new();
    while let Some(q) = rx.recv().await {
        batch.push(q);
        while let Ok(q) = rx.try_recv() {
            batch.push(q);
        }
        export.replies_sending();
        for (msg, _permit) in batch.drain(..) {
            if write_msg(&mut wr, msg).await.is_err() {
                return None;
            }
        }
        if wr.flush().await.is_err() {
            return None;
        }
    }
    Some(wr)
}

async fn write_msg<W: AsyncWrite + Unpin>(
    wr: &mut BufWriter<W>,
    msg: Outgoing,
) -> std::io::Result<()> {
    match msg {
        Outgoing::Simple {
            handle,
            error,
            data,
        } => {
            wr.write_all(&SimpleReplyHeader { error, handle }.encode())
                .await?;
            if let Some(d) = data {
                wr.write_all(&d).await?;
            }
        }
        Outgoing::Chunk {
            handle,
            flags,
            payload: ChunkPayload::OffsetData { offset, data },
        } => {
            let len = u32::try_from(data.len()).expect("read length fits u32");
            wr.write_all(&proto::encode_offset_data_prefix(
                handle, flags, offset, len,
            ))
            .await?;
            wr.write_all(&data).await?;
        }
        Outgoing::Chunk {
            handle,
            flags,
            payload,
        } => {
            wr.write_all(&proto::encode_chunk(handle, flags, &payload))
                .await?;
        }
    }
    Ok(())
}

/// Check a request against the negotiated export. Order: unknown command,
/// flags, command availability, read-only, payload size, range, alignment.
fn validate(conn: &Conn, hdr: &RequestHeader) -> Result<(), NbdError> {
    let info = &conn.info;
    let fua = if info.can_fua { cmd_flags::FUA } else { 0 };
    let allowed = match hdr.command {
        Command::Read => fua | if conn.structured { cmd_flags::DF } else { 0 },
        Command::Write | Command::Flush | Command::Trim | Command::Cache => fua,
        Command::WriteZeroes => {
            fua | cmd_flags::NO_HOLE
                | if info.can_fast_zero {
                    cmd_flags::FAST_ZERO
                } else {
                    0
                }
        }
        Command::BlockStatus => fua | cmd_flags::REQ_ONE,
        Command::Disc => u16::MAX,
        Command::Other(c) => return Err(NbdError::inval(format!("unknown command {c}"))),
    };
    if hdr.flags & !allowed != 0 {
        return Err(NbdError::inval(format!(
            "command flags {:#x} not allowed for {:?}",
            hdr.flags & !allowed,
            hdr.command
        )));
    }
    let available = match hdr.command {
        Command::Flush => info.can_flush,
        Command::Trim => info.can_trim,
        Command::WriteZeroes => info.can_zero,
        Command::Cache => info.can_cache,
        Command::BlockStatus => conn.structured && conn.base_allocation,
        _ => true,
    };
    if !available {
        return Err(NbdError::inval(format!(
            "{:?} was not negotiated",
            hdr.command
        )));
    }
    let writes = matches!(
        hdr.command,
        Command::Write | Command::Trim | Command::WriteZeroes
    );
    if writes && info.read_only {
        return Err(NbdError::perm("export is read-only"));
    }
    if hdr.command == Command::Flush {
        return Ok(()); // offset/length are reserved
    }
    if hdr.command == Command::Read && hdr.length > info.max_block {
        return Err(if conn.structured {
            NbdError::overflow("read longer than maximum payload")
        } else {
            NbdError::inval("read longer than maximum payload")
        });
    }
    if hdr.command == Command::Write && hdr.length > info.max_block {
        return Err(NbdError::inval("write longer than maximum payload"));
    }
    let in_range = matches!(
        hdr.offset.checked_add(u64::from(hdr.length)),
        Some(end) if end <= info.size
    );
    if !in_range {
        return Err(
            if matches!(hdr.command, Command::Write | Command::WriteZeroes) {
                NbdError::nospc("request beyond end of export")
            } else {
                NbdError::inval("request beyond end of export")
            },
        );
    }
    let mb = u64::from(info.min_block);
    if mb > 1 && (!hdr.offset.is_multiple_of(mb) || u64::from(hdr.length) % mb != 0) {
        return Err(NbdError::inval(format!(
            "request not aligned to minimum block size {mb}"
        )));
    }
    if hdr.command == Command::BlockStatus && hdr.length == 0 {
        return Err(NbdError::inval("zero-length block status"));
    }
    Ok(())
}

/// What the reader knows of a unix socket's queue while it reads the
/// socket itself, bypassing the read buffer (direct writes and the headers
/// between them): it saves a `FIONREAD` per request while an earlier one
/// showed more requests queued, and a `recv` per header taken with the
/// payload before it ([`DirectSource`]).
#[derive(Default)]
struct Ahead {
    /// Bytes queued on the socket, not read yet (a lower bound: the client
    /// only adds to them).
    queued: u64,
    /// The next header's first `got` bytes, already read.
    header: [u8; RequestHeader::LEN],
    got: usize,
}

impl Ahead {
    /// After a direct write with `after` bytes known queued behind its
    /// payload, of which `taken` (the next header's start) were read with it.
    fn after(after: u64, taken: &[u8]) -> Ahead {
        let mut a = Ahead {
            queued: after - taken.len() as u64,
            ..Ahead::default()
        };
        a.header[..taken.len()].copy_from_slice(taken);
        a.got = taken.len();
        a
    }

    /// Copy the header bytes read already into `hb`; returns how many.
    fn header(&self, hb: &mut [u8; RequestHeader::LEN]) -> usize {
        hb[..self.got].copy_from_slice(&self.header[..self.got]);
        self.got
    }

    /// `n` more bytes were read from the socket (`u64::MAX`: an unknown
    /// amount, through the read buffer).
    fn consumed(&mut self, n: u64) {
        self.queued = self.queued.saturating_sub(n);
        self.got = 0;
    }
}

/// Wait (briefly) until the next `len` bytes are all queued on the socket
/// (`known`: the bytes known to be queued, updated by every look):
/// a client that sent a header is normally still sending its payload, and
/// the wait costs what reading it would (a wake-up when data arrives), so
/// most payloads can still be taken directly. `false` after 1 ms (a slow or
/// gone client: the buffered path reads, or sees the end of, the stream) or
/// for a payload the socket may not be able to queue whole.
async fn payload_queued(fd: &UnixStream, len: u32, known: &mut u64) -> bool {
    if *known >= u64::from(len) {
        // An earlier look saw this much, and nothing has read it since.
        return true;
    }
    let mut queued = || {
        *known = rustix::io::ioctl_fionread(fd).unwrap_or(0);
        *known >= u64::from(len)
    };
    if queued() {
        return true;
    }
    if len > MAX_DIRECT_WAIT_LEN {
        return false;
    }
    let until = tokio::time::Instant::now() + std::time::Duration::from_millis(1);
    loop {
        let Ok(Ok(ready)) = tokio::time::timeout_at(until, fd.ready(Interest::READABLE)).await
        else {
            return false;
        };
        if queued() {
            return true;
        }
        // The client hung up (its half of the stream will not grow), or the
        // time is up (checked here too: readiness may keep coming at once).
        if ready.is_read_closed() || tokio::time::Instant::now() >= until {
            return false;
        }
        // Clear the readiness: the next arrival sets it again.
        let _ = fd.try_io(Interest::READABLE, || {
            Err::<(), _>(std::io::ErrorKind::WouldBlock.into())
        });
    }
}

/// Poll a request's future once here, on the reader task; spawn it only if
/// it must wait. A future polled once with a no-op waker and then handed to
/// a task is polled again by that task with the task's waker before it
/// waits, so no wake-up is lost.
fn run_inline_or_spawn(
    mut fut: Pin<Box<impl Future<Output = ()> + Send + 'static>>,
    noop: &std::task::Waker,
) {
    if fut
        .as_mut()
        .poll(&mut Context::from_waker(noop))
        .is_pending()
    {
        tokio::spawn(fut);
    }
}

/// What a request carries: its payload (a WRITE's, read already), or the
/// result of a write the export took directly (`Export::write_direct`).
enum Body {
    Payload(Option<Bytes>),
    Direct(OpFuture<'static>),
}

async fn handle_request(
    conn: Arc<Conn>,
    hdr: RequestHeader,
    body: Body,
    tx: mpsc::Sender<Queued>,
    permit: OwnedSemaphorePermit,
    bytes_permit: Option<OwnedSemaphorePermit>,
) {
    let fut: BoxFuture<'static, NbdResult<OpOutput>> = match body {
        Body::Payload(payload) => Box::pin(execute(conn.clone(), hdr, payload)),
        Body::Direct(result) => Box::pin(async move { result.await.map(|()| OpOutput::Unit) }),
    };
    let out = match CatchUnwind(fut).await {
        Ok(r) => r,
        Err(_) => Err(NbdError::io("internal error: export operation panicked")),
    };
    if let Err(e) = &out {
        conn.error_event(&hdr, e);
    }
    let msg = reply_for(&conn, &hdr, out);
    // The WRITE payload was consumed by the export; a READ's data lives on in
    // the reply until written.
    let keep = if hdr.command == Command::Read {
        bytes_permit
    } else {
        drop(bytes_permit);
        None
    };
    let _ = tx.send((msg, keep)).await; // the connection may be gone; nothing to do
    drop(permit);
}

async fn execute(
    conn: Arc<Conn>,
    hdr: RequestHeader,
    payload: Option<Bytes>,
) -> NbdResult<OpOutput> {
    let ctx = RequestCtx {
        conn_id: conn.conn_id,
        export: conn.name.clone(),
        handle: hdr.handle,
    };
    let e = &conn.export;
    let (off, len) = (hdr.offset, hdr.length);
    let fua = hdr.flags & cmd_flags::FUA != 0;
    // Zero-length requests: unspecified by the spec; succeed without
    // bothering the export (which is promised len > 0).
    if len == 0 && !matches!(hdr.command, Command::Flush | Command::BlockStatus) {
        return Ok(match hdr.command {
            Command::Read => OpOutput::Data(Bytes::new()),
            _ => OpOutput::Unit,
        });
    }
    match hdr.command {
        Command::Read => {
            let data = e.read(ctx, off, len).await?;
            if data.len() != len as usize {
                return Err(NbdError::io(format!(
                    "export returned {} bytes for a {len}-byte read",
                    data.len()
                )));
            }
            Ok(OpOutput::Data(data))
        }
        Command::Write => {
            let data = payload.expect("WRITE payload is read before dispatch");
            debug_assert_eq!(data.len(), len as usize);
            e.write(ctx, off, data, fua).await.map(|_| OpOutput::Unit)
        }
        Command::Flush => e.flush(ctx).await.map(|_| OpOutput::Unit),
        Command::Trim => e.trim(ctx, off, len, fua).await.map(|_| OpOutput::Unit),
        Command::Cache => e.cache(ctx, off, len).await.map(|_| OpOutput::Unit),
        Command::WriteZeroes => {
            let flags = WriteZeroesFlags {
                fua,
                no_hole: hdr.flags & cmd_flags::NO_HOLE != 0,
                fast_zero: hdr.flags & cmd_flags::FAST_ZERO != 0,
            };
            e.write_zeroes(ctx, off, len, flags)
                .await
                .map(|_| OpOutput::Unit)
        }
        Command::BlockStatus => {
            let ext = e.block_status(ctx, off, len).await?;
            let req_one = hdr.flags & cmd_flags::REQ_ONE != 0;
            normalize_extents(ext, len, req_one).map(OpOutput::Extents)
        }
        Command::Disc | Command::Other(_) => {
            unreachable!("DISC and unknown commands are handled before dispatch")
        }
    }
}

/// Enforce the spec on an export's block status answer: drop zero-length
/// extents, stop once `req_len` is covered (clipping the last extent), at
/// most one extent with REQ_ONE, at most 2^20 extents.
fn normalize_extents(ext: Vec<Extent>, req_len: u32, req_one: bool) -> NbdResult<Vec<Extent>> {
    let mut out = Vec::new();
    let mut covered: u64 = 0;
    for e in ext.into_iter().filter(|e| e.len > 0) {
        let remaining = u64::from(req_len) - covered;
        let len = u64::from(e.len).min(remaining) as u32;
        out.push(Extent {
            len,
            flags: e.flags,
        });
        covered += u64::from(len);
        if covered >= u64::from(req_len) || req_one || out.len() >= MAX_EXTENTS {
            break;
        }
    }
    if out.is_empty() {
        return Err(NbdError::io("export returned no block status extents"));
    }
    debug_assert!(covered <= u64::from(req_len));
    Ok(out)
}

fn reply_for(conn: &Conn, hdr: &RequestHeader, out: NbdResult<OpOutput>) -> Outgoing {
    let handle = hdr.handle;
    if conn.structured {
        let payload = match out {
            Ok(OpOutput::Unit) => ChunkPayload::None,
            Ok(OpOutput::Data(d)) if d.is_empty() => ChunkPayload::None,
            Ok(OpOutput::Data(data)) => ChunkPayload::OffsetData {
                offset: hdr.offset,
                data,
            },
            Ok(OpOutput::Extents(extents)) => ChunkPayload::BlockStatus {
                context_id: BASE_ALLOCATION_ID,
                extents,
            },
            Err(e) => ChunkPayload::Error {
                error: e.code.to_wire(),
                message: proto::sanitize_message(&e.message),
            },
        };
        Outgoing::Chunk {
            handle,
            flags: reply_flags::DONE,
            payload,
        }
    } else {
        match out {
            Ok(OpOutput::Data(d)) => Outgoing::Simple {
                handle,
                error: 0,
                data: Some(d),
            },
            Ok(OpOutput::Unit) => Outgoing::Simple {
                handle,
                error: 0,
                data: None,
            },
            Ok(OpOutput::Extents(_)) => {
                // validate() refuses BLOCK_STATUS without structured replies.
                debug_assert!(false, "block status without structured replies");
                Outgoing::Simple {
                    handle,
                    error: ErrorCode::Inval.to_wire(),
                    data: None,
                }
            }
            Err(e) => Outgoing::Simple {
                handle,
                error: e.code.to_wire(),
                data: None,
            },
        }
    }
}

/// Turns a panic inside an export operation into an error value so that the
/// client still gets a reply and the connection keeps working.
struct CatchUnwind<F: ?Sized>(Pin<Box<F>>);

impl<F: Future + ?Sized> Future for CatchUnwind<F> {
    type Output = Result<F::Output, Box<dyn Any + Send>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let fut = self.get_mut().0.as_mut();
        match std::panic::catch_unwind(AssertUnwindSafe(move || fut.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Err(p) => Poll::Ready(Err(p)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_clips_and_limits() {
        let e = |len, flags| Extent { len, flags };
        assert_eq!(
            normalize_extents(vec![e(100, 1), e(100, 0)], 150, false).unwrap(),
            vec![e(100, 1), e(50, 0)]
        );
        assert_eq!(
            normalize_extents(vec![e(0, 3), e(100, 1), e(100, 0)], 150, true).unwrap(),
            vec![e(100, 1)]
        );
        assert_eq!(
            normalize_extents(vec![e(1000, 3)], 150, true).unwrap(),
            vec![e(150, 3)]
        );
        assert_eq!(
            normalize_extents(vec![e(10, 3)], 150, false).unwrap(),
            vec![e(10, 3)]
        );
        assert!(normalize_extents(vec![], 150, false).is_err());
        assert!(normalize_extents(vec![e(0, 0)], 150, false).is_err());
    }
}
