//! The NBD server's connection events: the live connections the control
//! socket lists and hints ([`Conns`]), and the log lines they make.

use std::sync::{Arc, Mutex};

use crate::log::log;

/// Live connections: id -> (peer, export once the handshake chose one).
pub(crate) type Conns = Arc<Mutex<std::collections::BTreeMap<u64, (String, Option<String>)>>>;

/// Keep [`Conns`] up to date (the hook runs on the connection's task: quick).
pub(crate) fn track_connection(conns: &Conns, ev: &nvwc_nbd::ServerEvent) {
    use nvwc_nbd::ServerEvent as E;
    let mut c = conns.lock().unwrap();
    match ev {
        E::Connected { conn_id, peer } => {
            c.insert(*conn_id, (peer.clone(), None));
        }
        E::Ready {
            conn_id, export, ..
        } => {
            if let Some(x) = c.get_mut(conn_id) {
                x.1 = Some(export.to_string());
            }
        }
        E::Disconnected { conn_id, .. } => {
            c.remove(conn_id);
        }
        E::RequestError { .. } => {}
    }
}

/// Log the NBD server's connection events.
pub(crate) fn log_server_event(ev: nvwc_nbd::ServerEvent) {
    use nvwc_nbd::ServerEvent as E;
    match ev {
        E::Connected { conn_id, peer } => log!(info, "connect", conn = conn_id, client = peer),
        E::Ready {
            conn_id,
            export,
            structured,
            tls: None,
        } => log!(
            debug,
            "ready",
            conn = conn_id,
            export = &*export,
            structured = structured
        ),
        // Who came in over TLS is worth an info line.
        E::Ready {
            conn_id,
            export,
            structured,
            tls: Some(tls),
        } => log!(
            info,
            "ready",
            conn = conn_id,
            export = &*export,
            structured = structured,
            tls = tls
        ),
        E::Disconnected {
            conn_id,
            reason,
            requests,
        } => log!(
            info,
            "disconnect",
            conn = conn_id,
            reason = reason,
            requests = requests
        ),
        E::RequestError {
            conn_id,
            command,
            code,
            message,
        } => {
            // Device errors are the operator's business; bad requests are the client's.
            if code == "Io" || code == "NoSpc" {
                log!(
                    warn,
                    "request_error",
                    conn = conn_id,
                    command = command,
                    code = code,
                    message = message
                );
            } else {
                log!(
                    debug,
                    "request_error",
                    conn = conn_id,
                    command = command,
                    code = code,
                    message = message
                );
            }
        }
    }
}
