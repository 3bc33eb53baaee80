//! `nvwc serve`'s TLS flags and the public-listener guard.
//!
//! The flags follow nbdkit's (`nbdkit-tls(1)`), so that libnbd URIs and
//! habits carry over: `--tls off|on|require`, `--tls-certificates DIR`
//! (`ca-cert.pem`, `server-cert.pem`, `server-key.pem`), `--tls-verify-peer`
//! and `--tls-psk FILE` (`username:hexkey` lines, as GnuTLS's `psktool`
//! writes them). The NBD side (`NBD_OPT_STARTTLS`, `NBD_REP_ERR_TLS_REQD`)
//! is in `nvwc_nbd::server`; this module builds its [`TlsAcceptor`] with
//! OpenSSL (the `tls` cargo feature; scripts/test.sh builds with it).
//!
//! Why OpenSSL: a TLS PSK is what libnbd's `tls-psk-file` and qemu's
//! `tls-creds-psk` use, so the library must do x509 *and* external
//! pre-shared keys. rustls does not support external PSKs (its issue #174 is
//! open; the TLS 1.3 PSK pull request #2424 is not merged), OpenSSL does
//! (TLS 1.2 PSK suites, and TLS 1.3 external PSKs with SHA-256, which is what
//! GnuTLS clients offer). The crash story is untouched: TLS only wraps the
//! socket; what is acknowledged, and when, is the same.

use std::collections::HashMap;
use std::net::{IpAddr, ToSocketAddrs};
use std::path::PathBuf;

use anyhow::{bail, Result};
use nvwc_nbd::TlsMode;

/// TLS and listener-safety flags of `nvwc serve` (flattened into its args).
#[derive(clap::Args, Debug, Clone)]
pub struct TlsArgs {
    /// TLS on the NBD listeners (unix and TCP): `off`; `on` (a client may
    /// upgrade with NBD_OPT_STARTTLS); `require` (every client must: other
    /// options are answered NBD_REP_ERR_TLS_REQD). Needs --tls-certificates
    /// or --tls-psk.
    #[arg(long, value_enum, value_name = "MODE", default_value = "off")]
    pub tls: TlsSetting,
    /// Directory with `server-cert.pem` and `server-key.pem` (and
    /// `ca-cert.pem` for --tls-verify-peer), as nbdkit's --tls-certificates.
    #[arg(long, value_name = "DIR")]
    pub tls_certificates: Option<PathBuf>,
    /// Ask for a client certificate and refuse a client without one signed
    /// by `ca-cert.pem` in --tls-certificates.
    #[arg(long)]
    pub tls_verify_peer: bool,
    /// Pre-shared keys: a file of `username:hexkey` lines (`psktool -u NAME
    /// -p FILE` writes them). Clients: `nbds://NAME@HOST/?tls-psk-file=F`
    /// (libnbd takes the PSK username from the URI's user part).
    #[arg(long, value_name = "FILE")]
    pub tls_psk: Option<PathBuf>,
    /// Serve NBD on a non-loopback TCP address without `--tls require`.
    /// Anyone who can reach the port could then read and overwrite every
    /// export: only on a network you trust.
    #[arg(long)]
    pub allow_insecure_tcp: bool,
}

/// `--tls` values (nbdkit's names).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsSetting {
    /// No TLS: NBD_OPT_STARTTLS is refused.
    Off,
    /// TLS if the client asks for it.
    On,
    /// TLS or nothing.
    Require,
}

impl From<TlsSetting> for TlsMode {
    fn from(s: TlsSetting) -> TlsMode {
        match s {
            TlsSetting::Off => TlsMode::Off,
            TlsSetting::On => TlsMode::On,
            TlsSetting::Require => TlsMode::Require,
        }
    }
}

/// Whether `--listen ADDR` (`HOST:PORT`, `[V6]:PORT`, or `none`) listens only
/// on loopback: 127.0.0.0/8, ::1, `localhost`, or a host name that resolves
/// to loopback addresses only. An empty host or 0.0.0.0/:: (every
/// interface) is not loopback.
pub fn is_loopback_listen(listen: &str) -> bool {
    if listen == "none" {
        return true;
    }
    let host = match listen.rsplit_once(':') {
        Some((h, _port)) => h,
        None => listen,
    };
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return ip.to_canonical().is_loopback();
    }
    if host.is_empty() {
        return false;
    }
    // A host name: loopback only if every address it names is.
    match listen.to_socket_addrs() {
        Ok(addrs) => {
            let addrs: Vec<_> = addrs.collect();
            !addrs.is_empty() && addrs.iter().all(|a| a.ip().to_canonical().is_loopback())
        }
        Err(_) => false,
    }
}

/// The public-listener guard: `Err` (with why, and the ways out) when
/// `--listen` is reachable from other hosts and TLS is not required, unless
/// `--allow-insecure-tcp`. `Ok(true)`: allowed only by that flag (log it).
pub fn check_listener(listen: &str, t: &TlsArgs) -> Result<bool> {
    if is_loopback_listen(listen) || t.tls == TlsSetting::Require {
        return Ok(false);
    }
    if t.allow_insecure_tcp {
        return Ok(true);
    }
    let why = match t.tls {
        TlsSetting::On => "--tls on still serves clients that do not start TLS",
        _ => "TLS is off",
    };
    bail!(
        "refusing to listen on {listen}: it is not a loopback address and {why}, so anyone \
         who can reach the port could read and overwrite the disk. Use --tls require with \
         --tls-psk FILE or --tls-certificates DIR, or listen on loopback \
         (--listen 127.0.0.1:10809) or the unix socket only (--listen none), or add \
         --allow-insecure-tcp if the network is trusted"
    )
}

/// What `nvwc serve` prints under "connect with:" when TLS is on: the
/// `nbds+unix://` URI form for the credentials given.
pub fn connect_hint(t: &TlsArgs, sock: &std::path::Path) -> Option<String> {
    let sock = sock.display();
    let uri = match (&t.tls_psk, &t.tls_certificates) {
        (Some(f), _) => format!(
            "nbds+unix://USER@/?socket={sock}&tls-psk-file={}",
            f.display()
        ),
        (None, Some(_)) => format!("nbds+unix:///?socket={sock}&tls-certificates=CLIENT_DIR"),
        (None, None) => return None,
    };
    let how = match t.tls {
        TlsSetting::Off => return None,
        TlsSetting::On => "TLS (optional)",
        TlsSetting::Require => "TLS (required)",
    };
    Some(format!("  {how}: nbdinfo '{uri}'"))
}

/// Parse a PSK file: `username:hexkey` lines (psktool's format); blank
/// lines and `#` comments are skipped. Errors name the line.
#[cfg_attr(not(feature = "tls"), allow(dead_code))]
pub fn parse_psk_file(text: &str) -> Result<HashMap<String, Vec<u8>>, String> {
    let mut keys = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((user, hex)) = line.rsplit_once(':') else {
            return Err(format!("line {n}: expected username:hexkey"));
        };
        if user.is_empty() {
            return Err(format!("line {n}: empty username"));
        }
        let key = decode_hex(hex).ok_or_else(|| {
            format!("line {n}: the key of {user:?} is not an even number of hex digits")
        })?;
        if key.is_empty() {
            return Err(format!("line {n}: empty key for {user:?}"));
        }
        if keys.insert(user.to_string(), key).is_some() {
            return Err(format!("line {n}: {user:?} appears twice"));
        }
    }
    if keys.is_empty() {
        return Err("no username:hexkey line".into());
    }
    Ok(keys)
}

#[cfg_attr(not(feature = "tls"), allow(dead_code))]
fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if s.len() & 1 != 0 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

/// The server's TLS set-up from the flags: `None` for `--tls off`.
/// Checks the flags and loads every file now, so a mistake stops the start.
pub fn setup(t: &TlsArgs) -> Result<Option<(TlsMode, std::sync::Arc<dyn nvwc_nbd::TlsAcceptor>)>> {
    if t.tls == TlsSetting::Off {
        if t.tls_certificates.is_some() || t.tls_psk.is_some() || t.tls_verify_peer {
            bail!("--tls-certificates, --tls-psk and --tls-verify-peer need --tls on or --tls require");
        }
        return Ok(None);
    }
    if t.tls_certificates.is_none() && t.tls_psk.is_none() {
        bail!(
            "--tls {} needs credentials: --tls-certificates DIR (server-cert.pem, \
             server-key.pem) or --tls-psk FILE (username:hexkey lines, see psktool)",
            if t.tls == TlsSetting::On {
                "on"
            } else {
                "require"
            }
        );
    }
    if t.tls_verify_peer && t.tls_certificates.is_none() {
        bail!("--tls-verify-peer needs --tls-certificates DIR with ca-cert.pem");
    }
    imp::acceptor(t).map(|a| Some((t.tls.into(), a)))
}

#[cfg(not(feature = "tls"))]
mod imp {
    use super::*;

    pub fn acceptor(_t: &TlsArgs) -> Result<std::sync::Arc<dyn nvwc_nbd::TlsAcceptor>> {
        bail!(
            "this nvwc was built without TLS (cargo feature `tls`). Rebuild with it: \
             install libssl-dev and pkg-config, then `cargo build --release -p nvwc \
             --features tls` (or --features tls-vendored: OpenSSL from source)"
        )
    }
}

#[cfg(feature = "tls")]
mod imp {
    use std::io;
    use std::pin::Pin;
    use std::sync::Arc;

    use anyhow::{Context, Result};
    use nvwc_nbd::{BoxFuture, BoxStream, TlsAcceptor, TlsSession};
    use openssl::ssl::{
        Ssl, SslAcceptor, SslContext, SslFiletype, SslMethod, SslSessionCacheMode, SslVerifyMode,
    };
    use openssl::x509::X509Name;

    use super::{parse_psk_file, TlsArgs};

    /// TLS 1.2 PSK suites (AEAD only) added to Mozilla's intermediate list;
    /// TLS 1.3 uses its own suites for PSKs and certificates alike.
    const PSK_CIPHERS: &str = "ECDHE-PSK-CHACHA20-POLY1305:DHE-PSK-AES256-GCM-SHA384:\
        DHE-PSK-AES128-GCM-SHA256:DHE-PSK-CHACHA20-POLY1305:PSK-AES256-GCM-SHA384:\
        PSK-AES128-GCM-SHA256:PSK-CHACHA20-POLY1305";
    const CERT_CIPHERS: &str = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:\
        ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:\
        ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305:\
        DHE-RSA-AES128-GCM-SHA256:DHE-RSA-AES256-GCM-SHA384";

    struct OpenSsl {
        ctx: SslContext,
        /// Per connection: the PSK identity the client named, and whether
        /// it was known.
        psk_seen: openssl::ex_data::Index<Ssl, (String, bool)>,
    }

    pub fn acceptor(t: &TlsArgs) -> Result<Arc<dyn TlsAcceptor>> {
        let psk_seen = Ssl::new_ex_index::<(String, bool)>()?;
        // TLS 1.2 and 1.3 (the NBD spec: 1.2 MUST, later SHOULD, older not by default).
        let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server())?;
        let mut ciphers = Vec::new();
        if let Some(dir) = &t.tls_certificates {
            let cert = dir.join("server-cert.pem");
            let key = dir.join("server-key.pem");
            b.set_certificate_chain_file(&cert)
                .with_context(|| format!("--tls-certificates: loading {}", cert.display()))?;
            b.set_private_key_file(&key, SslFiletype::PEM)
                .with_context(|| format!("--tls-certificates: loading {}", key.display()))?;
            b.check_private_key().with_context(|| {
                format!(
                    "--tls-certificates: {} does not match {}",
                    key.display(),
                    cert.display()
                )
            })?;
            if t.tls_verify_peer {
                let ca = dir.join("ca-cert.pem");
                b.set_ca_file(&ca)
                    .with_context(|| format!("--tls-verify-peer: loading {}", ca.display()))?;
                b.set_client_ca_list(X509Name::load_client_ca_file(&ca)?);
                b.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
            }
            ciphers.push(CERT_CIPHERS);
        }
        if let Some(file) = &t.tls_psk {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("--tls-psk: reading {}", file.display()))?;
            let keys = parse_psk_file(&text)
                .map_err(|e| anyhow::anyhow!("--tls-psk {}: {e}", file.display()))?;
            b.set_psk_server_callback(move |ssl, identity, out| {
                let name = String::from_utf8_lossy(identity.unwrap_or_default()).into_owned();
                match keys.get(&name).filter(|k| k.len() <= out.len()) {
                    Some(k) => {
                        out[..k.len()].copy_from_slice(k);
                        ssl.set_ex_data(psk_seen, (name, true));
                        Ok(k.len())
                    }
                    None => {
                        ssl.set_ex_data(psk_seen, (name, false));
                        // 0: no such identity, the handshake fails.
                        Ok(0)
                    }
                }
            });
            ciphers.push(PSK_CIPHERS);
            // OpenSSL's PSK callback gives TLS 1.3 a SHA-256 key: pick the
            // suites ourselves (SHA-256 first), or a client preferring
            // AES-256 (GnuTLS) gets a SHA-384 suite, its PSK is ignored and
            // the server answers with a certificate, or fails.
            b.set_options(openssl::ssl::SslOptions::CIPHER_SERVER_PREFERENCE);
            b.set_ciphersuites(
                "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256:TLS_AES_256_GCM_SHA384",
            )?;
        }
        b.set_cipher_list(&ciphers.join(":"))?;
        // NBD connections are long-lived: no session resumption to secure.
        b.set_session_cache_mode(SslSessionCacheMode::OFF);
        b.set_num_tickets(0)?;
        Ok(Arc::new(OpenSsl {
            ctx: b.build().into_context(),
            psk_seen,
        }))
    }

    impl TlsAcceptor for OpenSsl {
        fn accept(&self, stream: BoxStream) -> BoxFuture<'static, io::Result<TlsSession>> {
            let ssl = Ssl::new(&self.ctx);
            let psk_seen = self.psk_seen;
            Box::pin(async move {
                let ssl = ssl.map_err(io::Error::other)?;
                let mut s = tokio_openssl::SslStream::new(ssl, stream).map_err(io::Error::other)?;
                if let Err(e) = Pin::new(&mut s).accept().await {
                    let psk = s.ssl().ex_data(psk_seen).cloned();
                    return Err(io::Error::other(explain(&e, psk)));
                }
                let ssl = s.ssl();
                let what = match ssl.ex_data(psk_seen) {
                    Some((name, _)) => format!("psk:{name}"),
                    None => match ssl.peer_certificate() {
                        Some(c) => format!("x509:{}", subject(&c)),
                        None => "x509".into(),
                    },
                };
                let cipher = ssl.current_cipher().map_or("", |c| c.name());
                let peer = format!("{what} {} {cipher}", ssl.version_str());
                Ok(TlsSession {
                    stream: Box::new(s),
                    peer,
                })
            })
        }
    }

    fn subject(c: &openssl::x509::X509) -> String {
        c.subject_name()
            .entries()
            .filter_map(|e| {
                let k = e.object().nid().short_name().ok()?;
                let v = e.data().to_string().ok()?;
                Some(format!("{k}={v}"))
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A handshake failure in words: the PSK identity when that was the
    /// problem, OpenSSL's reasons otherwise.
    fn explain(e: &openssl::ssl::Error, psk: Option<(String, bool)>) -> String {
        let detail = match e.ssl_error() {
            Some(stack) => stack
                .errors()
                .iter()
                .map(|x| x.reason().unwrap_or("unknown").to_string())
                .collect::<Vec<_>>()
                .join("; "),
            None => e.to_string(),
        };
        match psk {
            Some((name, false)) => {
                format!("unknown PSK username {name:?} (not in --tls-psk) ({detail})")
            }
            Some((name, true)) => {
                format!("PSK username {name:?}: the client's key does not match? ({detail})")
            }
            None if detail.contains("did not return a certificate")
                || detail.contains("certificate verify failed") =>
            {
                format!(
                    "{detail} (--tls-verify-peer: the client needs a certificate \
                     signed by the CA in ca-cert.pem)"
                )
            }
            None => detail,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(tls: TlsSetting, allow: bool) -> TlsArgs {
        TlsArgs {
            tls,
            tls_certificates: None,
            tls_verify_peer: false,
            tls_psk: None,
            allow_insecure_tcp: allow,
        }
    }

    #[test]
    fn loopback_addresses() {
        for a in [
            "127.0.0.1:10809",
            "127.1.2.3:1",
            "[::1]:10809",
            "localhost:10809",
            "LOCALHOST:1",
            "[::ffff:127.0.0.1]:5",
            "none",
        ] {
            assert!(is_loopback_listen(a), "{a}");
        }
        for a in [
            "0.0.0.0:10809",
            "[::]:10809",
            ":10809",
            "10.1.2.3:10809",
            "192.168.0.1:1",
            "[2001:db8::1]:1",
            "no-such-host.invalid:1",
        ] {
            assert!(!is_loopback_listen(a), "{a}");
        }
    }

    #[test]
    fn guard_refuses_public_plain_listeners() {
        let e = check_listener("0.0.0.0:10809", &args(TlsSetting::Off, false)).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("refusing to listen on 0.0.0.0:10809"), "{msg}");
        assert!(msg.contains("--allow-insecure-tcp"), "{msg}");
        assert!(msg.contains("--tls require"), "{msg}");
        assert!(check_listener("0.0.0.0:1", &args(TlsSetting::On, false)).is_err());
        assert!(!check_listener("0.0.0.0:1", &args(TlsSetting::Require, false)).unwrap());
        assert!(check_listener("0.0.0.0:1", &args(TlsSetting::Off, true)).unwrap());
        assert!(!check_listener("127.0.0.1:1", &args(TlsSetting::Off, false)).unwrap());
        assert!(!check_listener("none", &args(TlsSetting::Off, false)).unwrap());
    }

    #[test]
    fn psk_files() {
        let k = parse_psk_file("# keys\nalice:00ff10\n\nbob:ABCD\n").unwrap();
        assert_eq!(k["alice"], vec![0, 0xff, 0x10]);
        assert_eq!(k["bob"], vec![0xab, 0xcd]);
        for (bad, why) in [
            ("alice", "line 1: expected"),
            ("alice:0g", "line 1: the key"),
            ("a:00\nb:123", "line 2: the key"),
            (":00", "empty username"),
            ("a:", "empty key"),
            ("a:00\na:01", "appears twice"),
            ("\n# none\n", "no username"),
        ] {
            let e = parse_psk_file(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }
}
