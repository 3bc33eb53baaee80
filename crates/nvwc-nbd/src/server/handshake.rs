//! Server side of the fixed-newstyle handshake (option haggling).

use std::io;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::tls::{TlsMode, TlsState};
use super::Inner;
use crate::export::{Export, ExportInfo};
use crate::proto::{
    self, client_flags, handshake_flags, info, opt, rep, ClientOption, InfoReply, InfoRequest,
    MetaContextEntry, MetaContextRequest, OptionHeader, ServerEntry, BASE_ALLOCATION,
};

/// Context id we assign to `base:allocation` in `NBD_OPT_SET_META_CONTEXT`.
pub(crate) const BASE_ALLOCATION_ID: u32 = 1;

/// Outcome of a successful handshake.
pub(crate) struct Negotiated {
    pub name: Arc<str>,
    pub export: Arc<dyn Export>,
    pub info: ExportInfo,
    pub structured: bool,
    pub base_allocation: bool,
}

/// How the option haggling ended.
pub(crate) enum Outcome {
    /// Transmission phase entered.
    Transmit(Negotiated),
    /// The session ended cleanly (abort, shutdown).
    Closed,
    /// `NBD_OPT_STARTTLS` was acknowledged (and flushed): the caller runs the
    /// TLS handshake on the stream, then [`options`] again over TLS.
    StartTls,
}

/// What the greeting settled, and what the option haggling tells the
/// connection's log; lives for the whole connection (across STARTTLS).
pub(crate) struct Session {
    /// The client set `NBD_FLAG_C_NO_ZEROES`.
    pub no_zeroes: bool,
    /// The client set `NBD_FLAG_C_FIXED_NEWSTYLE` (TLS needs it).
    pub fixed: bool,
    /// Plain, or TLS active.
    pub tls: TlsState,
    /// An option was refused with `NBD_REP_ERR_TLS_REQD`.
    pub refused_tls: bool,
}

struct State {
    no_zeroes: bool,
    structured: bool,
    /// Canonical export name for which `base:allocation` was selected by the
    /// most recent `NBD_OPT_SET_META_CONTEXT`, if any.
    meta_export: Option<Arc<str>>,
}

fn violation(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

async fn reply<W: AsyncWrite + Unpin>(
    wr: &mut W,
    option: u32,
    reply_type: u32,
    data: &[u8],
) -> io::Result<()> {
    wr.write_all(&proto::encode_option_reply(option, reply_type, data))
        .await
}

async fn final_reply<W: AsyncWrite + Unpin>(
    wr: &mut W,
    option: u32,
    reply_type: u32,
    data: &[u8],
) -> io::Result<()> {
    reply(wr, option, reply_type, data).await?;
    wr.flush().await
}

async fn error_reply<W: AsyncWrite + Unpin>(
    wr: &mut W,
    option: u32,
    reply_type: u32,
    message: &str,
) -> io::Result<()> {
    debug_assert!(rep::is_error(reply_type));
    final_reply(
        wr,
        option,
        reply_type,
        proto::sanitize_message(message).as_bytes(),
    )
    .await
}

/// Send the greeting and read the client flags. Under `--tls require` a
/// client without `NBD_FLAG_C_FIXED_NEWSTYLE` cannot be offered TLS (the
/// spec: such a session is NOTLS), so it is dropped.
pub(crate) async fn greeting<R, W>(inner: &Inner, rd: &mut R, wr: &mut W) -> io::Result<Session>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    wr.write_all(&proto::encode_server_greeting(
        handshake_flags::FIXED_NEWSTYLE | handshake_flags::NO_ZEROES,
    ))
    .await?;
    wr.flush().await?;

    let mut b4 = [0u8; 4];
    rd.read_exact(&mut b4).await?;
    let cflags = u32::from_be_bytes(b4);
    // Spec: the server MUST drop the connection on unknown client flags.
    if cflags & !client_flags::KNOWN != 0 {
        return Err(violation(format!("unknown client flags {cflags:#x}")));
    }
    let fixed = cflags & client_flags::FIXED_NEWSTYLE != 0;
    if !fixed && inner.tls.mode == TlsMode::Require {
        return Err(violation(
            "TLS is required and the client did not set NBD_FLAG_C_FIXED_NEWSTYLE",
        ));
    }
    Ok(Session {
        no_zeroes: cflags & client_flags::NO_ZEROES != 0,
        fixed,
        tls: TlsState::Plain,
        refused_tls: false,
    })
}

/// The message of `NBD_REP_ERR_TLS_REQD`.
pub(crate) const TLS_REQUIRED_MSG: &str =
    "TLS is required: this server runs with --tls require; send NBD_OPT_STARTTLS first";

/// Run the option haggling (after [`greeting`], and again after STARTTLS).
/// `Err` = I/O error or a protocol violation that requires a hard
/// disconnect.
pub(crate) async fn options<R, W>(
    inner: &Inner,
    rd: &mut R,
    wr: &mut W,
    sess: &mut Session,
) -> io::Result<Outcome>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut shutdown = inner.shutdown.subscribe();
    // Nothing negotiated before STARTTLS survives it (spec, NBD_OPT_STARTTLS).
    let mut st = State {
        no_zeroes: sess.no_zeroes,
        structured: false,
        meta_export: None,
    };
    // FORCEDTLS before the upgrade.
    let forced = inner.tls.mode == TlsMode::Require && sess.tls == TlsState::Plain;

    loop {
        let mut hb = [0u8; OptionHeader::LEN];
        tokio::select! {
            biased;
            r = rd.read_exact(&mut hb) => { r?; }
            // Shutting down while the client is idle in the handshake: close.
            _ = async { let _ = shutdown.wait_for(|s| *s).await; } => return Ok(Outcome::Closed),
        }
        let hdr = OptionHeader::decode(&hb).map_err(|e| violation(e.to_string()))?;

        if hdr.length > inner.config.max_option_len {
            if hdr.option == opt::EXPORT_NAME {
                return Err(violation("oversized NBD_OPT_EXPORT_NAME"));
            }
            // Skip the data without buffering it, then keep parsing.
            let want = u64::from(hdr.length);
            let skipped =
                tokio::io::copy(&mut (&mut *rd).take(want), &mut tokio::io::sink()).await?;
            if skipped != want {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            let t = if forced && hdr.option != opt::STARTTLS && hdr.option != opt::ABORT {
                sess.refused_tls = true;
                rep::ERR_TLS_REQD
            } else if ClientOption::is_known(hdr.option) {
                rep::ERR_TOO_BIG
            } else {
                rep::ERR_UNSUP
            };
            error_reply(wr, hdr.option, t, "option data too large").await?;
            continue;
        }

        let mut data = vec![0u8; hdr.length as usize];
        rd.read_exact(&mut data).await?;

        if inner.is_shutting_down() {
            if hdr.option == opt::ABORT {
                let _ = final_reply(wr, hdr.option, rep::ACK, &[]).await;
                return Ok(Outcome::Closed);
            }
            if hdr.option != opt::EXPORT_NAME {
                let _ =
                    error_reply(wr, hdr.option, rep::ERR_SHUTDOWN, "server shutting down").await;
            }
            return Ok(Outcome::Closed);
        }

        if forced {
            match hdr.option {
                opt::STARTTLS | opt::ABORT => {}
                // It cannot be answered with an error: the spec says terminate.
                opt::EXPORT_NAME => {
                    sess.refused_tls = true;
                    return Err(violation(
                        "NBD_OPT_EXPORT_NAME before TLS, and TLS is required",
                    ));
                }
                _ => {
                    sess.refused_tls = true;
                    error_reply(wr, hdr.option, rep::ERR_TLS_REQD, TLS_REQUIRED_MSG).await?;
                    continue;
                }
            }
        }

        let parsed = match ClientOption::parse(hdr.option, &data) {
            Ok(p) => p,
            Err(e) => {
                if hdr.option == opt::EXPORT_NAME {
                    // Cannot return an error to EXPORT_NAME: terminate.
                    return Err(violation(e.to_string()));
                }
                if hdr.option == opt::SET_META_CONTEXT {
                    // "replaces all previously-set metadata contexts (including when this command fails)"
                    st.meta_export = None;
                }
                error_reply(wr, hdr.option, rep::ERR_INVALID, &e.to_string()).await?;
                continue;
            }
        };

        match parsed {
            ClientOption::ExportName(name) => {
                let Some((canon, export)) = inner.lookup(&name) else {
                    return Err(violation(format!("unknown export {name:?}")));
                };
                let info = export.info();
                let flags = info.transmission_flags(st.structured);
                wr.write_all(&proto::encode_export_name_reply(
                    info.size,
                    flags,
                    st.no_zeroes,
                ))
                .await?;
                wr.flush().await?;
                return Ok(Outcome::Transmit(finish(&st, canon, export, info)));
            }
            ClientOption::Abort => {
                // The client may already have closed; ignore errors.
                let _ = final_reply(wr, opt::ABORT, rep::ACK, &[]).await;
                return Ok(Outcome::Closed);
            }
            ClientOption::List => {
                for (name, e) in inner.exports() {
                    let entry = ServerEntry {
                        name,
                        description: e.info().description,
                    };
                    reply(wr, opt::LIST, rep::SERVER, &entry.encode_data()).await?;
                }
                final_reply(wr, opt::LIST, rep::ACK, &[]).await?;
            }
            ClientOption::Info(req) => {
                info_or_go(inner, wr, &st, opt::INFO, &req).await?;
            }
            ClientOption::Go(req) => {
                if let Some((canon, export, info)) =
                    info_or_go(inner, wr, &st, opt::GO, &req).await?
                {
                    return Ok(Outcome::Transmit(finish(&st, canon, export, info)));
                }
            }
            ClientOption::StructuredReply => {
                if st.structured {
                    error_reply(
                        wr,
                        hdr.option,
                        rep::ERR_INVALID,
                        "structured replies already negotiated",
                    )
                    .await?;
                } else {
                    st.structured = true;
                    final_reply(wr, hdr.option, rep::ACK, &[]).await?;
                }
            }
            ClientOption::ListMetaContext(req) => {
                meta_context(inner, wr, &mut st, false, &req).await?;
            }
            ClientOption::SetMetaContext(req) => {
                meta_context(inner, wr, &mut st, true, &req).await?;
            }
            ClientOption::StartTls => {
                if sess.tls == TlsState::Active {
                    error_reply(wr, hdr.option, rep::ERR_INVALID, "TLS is already active").await?;
                } else if inner.tls.mode == TlsMode::Off
                    || inner.tls.acceptor.is_none()
                    || !sess.fixed
                {
                    // NOTLS (a client without fixed newstyle is NOTLS too).
                    error_reply(
                        wr,
                        hdr.option,
                        rep::ERR_UNSUP,
                        "TLS is not enabled on this server (nvwc serve --tls on|require)",
                    )
                    .await?;
                } else {
                    final_reply(wr, hdr.option, rep::ACK, &[]).await?;
                    return Ok(Outcome::StartTls);
                }
            }
            ClientOption::Unknown(_) => {
                // Unknown options: ERR_UNSUP and keep parsing.
                error_reply(wr, hdr.option, rep::ERR_UNSUP, "option not supported").await?;
            }
        }
    }
}

fn finish(st: &State, canon: Arc<str>, export: Arc<dyn Export>, info: ExportInfo) -> Negotiated {
    let base_allocation = st.structured && st.meta_export.as_deref() == Some(&*canon);
    Negotiated {
        name: canon,
        export,
        info,
        structured: st.structured,
        base_allocation,
    }
}

/// Answer `NBD_OPT_INFO` / `NBD_OPT_GO`. Returns the export on success.
async fn info_or_go<W: AsyncWrite + Unpin>(
    inner: &Inner,
    wr: &mut W,
    st: &State,
    option: u32,
    req: &InfoRequest,
) -> io::Result<Option<(Arc<str>, Arc<dyn Export>, ExportInfo)>> {
    let Some((canon, export)) = inner.lookup(&req.name) else {
        error_reply(
            wr,
            option,
            rep::ERR_UNKNOWN,
            &format!("export {:?} not found", req.name),
        )
        .await?;
        return Ok(None);
    };
    let info = export.info();
    let flags = info.transmission_flags(st.structured);
    let send = |r: InfoReply| r.encode_data();
    let mut msgs = vec![send(InfoReply::Export {
        size: info.size,
        flags,
    })];
    if req.requests.contains(&info::NAME) {
        msgs.push(send(InfoReply::Name(canon.to_string())));
    }
    if req.requests.contains(&info::DESCRIPTION) && !info.description.is_empty() {
        msgs.push(send(InfoReply::Description(info.description.clone())));
    }
    // Always advertise our constraints (allowed unrequested; clients that did
    // not ask may ignore it, and we still enforce them with EINVAL).
    msgs.push(send(InfoReply::BlockSize {
        min: info.min_block,
        preferred: info.pref_block,
        max: info.max_block,
    }));
    for m in msgs {
        reply(wr, option, rep::INFO, &m).await?;
    }
    final_reply(wr, option, rep::ACK, &[]).await?;
    Ok(Some((canon, export, info)))
}

/// Which of `queries` select `base:allocation`. For LIST, an empty query
/// list and the `base:` wildcard match; for SET only the exact name does.
fn matches_base_allocation(queries: &[String], list: bool) -> bool {
    if list && queries.is_empty() {
        return true;
    }
    queries
        .iter()
        .any(|q| q == BASE_ALLOCATION || (list && q == "base:"))
}

async fn meta_context<W: AsyncWrite + Unpin>(
    inner: &Inner,
    wr: &mut W,
    st: &mut State,
    set: bool,
    req: &MetaContextRequest,
) -> io::Result<()> {
    let option = if set {
        opt::SET_META_CONTEXT
    } else {
        opt::LIST_META_CONTEXT
    };
    if set {
        st.meta_export = None;
        if !st.structured {
            return error_reply(
                wr,
                option,
                rep::ERR_INVALID,
                "structured replies MUST be negotiated first",
            )
            .await;
        }
    }
    let Some((canon, _export)) = inner.lookup(&req.export) else {
        return error_reply(
            wr,
            option,
            rep::ERR_UNKNOWN,
            &format!("export {:?} not found", req.export),
        )
        .await;
    };
    if matches_base_allocation(&req.queries, !set) {
        let entry = MetaContextEntry {
            id: if set { BASE_ALLOCATION_ID } else { 0 },
            name: BASE_ALLOCATION.to_string(),
        };
        reply(wr, option, rep::META_CONTEXT, &entry.encode_data()).await?;
        if set {
            st.meta_export = Some(canon);
        }
    }
    final_reply(wr, option, rep::ACK, &[]).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_allocation_matching() {
        let q = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(matches_base_allocation(&[], true));
        assert!(!matches_base_allocation(&[], false));
        assert!(matches_base_allocation(&q(&["base:"]), true));
        assert!(!matches_base_allocation(&q(&["base:"]), false));
        assert!(matches_base_allocation(&q(&["base:allocation"]), false));
        assert!(!matches_base_allocation(
            &q(&["qemu:dirty-bitmap:x"]),
            false
        ));
        assert!(matches_base_allocation(
            &q(&["x-foo:bar", "base:allocation"]),
            false
        ));
    }
}
