//! TLS for the server: the policy (`NBD_OPT_STARTTLS`, spec section "TLS
//! support") and the hook through which the embedding program supplies the
//! TLS library.
//!
//! This crate does no cryptography: a [`TlsAcceptor`] turns the plain
//! stream into an encrypted one after the server has answered
//! `NBD_OPT_STARTTLS` with `NBD_REP_ACK`. The handshake then restarts its
//! option haggling over the new stream with no state carried over (the spec
//! forbids preserving structured replies or meta contexts across STARTTLS),
//! and the transmission phase runs over it. Direct writes (receiving a
//! payload straight from a unix socket into the export) are off on a TLS
//! connection: the socket carries ciphertext.

use std::io;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};

use crate::export::BoxFuture;

/// A byte stream a connection runs over (plain or TLS).
pub trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

/// A boxed [`Stream`].
pub type BoxStream = Box<dyn Stream>;

/// The server's TLS mode, with nbdkit's names (`--tls=off|on|require`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// The spec's NOTLS: `NBD_OPT_STARTTLS` gets `NBD_REP_ERR_UNSUP`.
    Off,
    /// The spec's SELECTIVETLS with no TLS-only export: a client may upgrade
    /// with `NBD_OPT_STARTTLS`, or go on in plain text.
    On,
    /// The spec's FORCEDTLS: before TLS every option except `NBD_OPT_STARTTLS`
    /// and `NBD_OPT_ABORT` gets `NBD_REP_ERR_TLS_REQD`, and
    /// `NBD_OPT_EXPORT_NAME` (which cannot be answered with an error) closes
    /// the connection.
    Require,
}

/// An established TLS session.
pub struct TlsSession {
    /// The encrypted stream; the rest of the connection runs over it.
    pub stream: BoxStream,
    /// Who the client proved to be, for logs: e.g. `psk:alice`,
    /// `x509:CN=client`, or `x509` (no client certificate asked for).
    pub peer: String,
}

/// Runs the server side of a TLS handshake on a stream (the embedding
/// program's TLS library). An error ends the connection (the spec: "the
/// server MUST terminate the session"); its message is logged as the
/// reason, so it should say why (e.g. an unknown PSK identity, a client
/// certificate that did not verify).
pub trait TlsAcceptor: Send + Sync {
    /// Handshake on `stream`, which has just carried the `NBD_REP_ACK` to
    /// `NBD_OPT_STARTTLS` and has nothing buffered.
    fn accept(&self, stream: BoxStream) -> BoxFuture<'static, io::Result<TlsSession>>;
}

/// The server's TLS set-up: a mode other than [`TlsMode::Off`] needs an
/// acceptor.
#[derive(Clone)]
pub(crate) struct TlsConfig {
    pub mode: TlsMode,
    pub acceptor: Option<Arc<dyn TlsAcceptor>>,
}

impl TlsConfig {
    pub(crate) fn off() -> TlsConfig {
        TlsConfig {
            mode: TlsMode::Off,
            acceptor: None,
        }
    }
}

/// Where a connection is in its TLS life, for the handshake's replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TlsState {
    /// Not (yet) encrypted.
    Plain,
    /// `NBD_OPT_STARTTLS` succeeded: options now come over TLS.
    Active,
}
