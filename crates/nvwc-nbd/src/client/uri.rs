//! NBD URIs (`nbd://host:port/name`, `nbd+unix:///name?socket=PATH`).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::proto::DEFAULT_PORT;

/// Where to connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// TCP host (name or IP; IPv6 without brackets) and port.
    Tcp {
        /// Host.
        host: String,
        /// Port.
        port: u16,
    },
    /// Unix domain socket path.
    Unix(PathBuf),
}

/// A parsed NBD URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdUri {
    /// Transport endpoint.
    pub endpoint: Endpoint,
    /// Export name ("" = default export).
    pub export_name: String,
}

/// A URI that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid NBD URI {uri:?}: {reason}")]
pub struct UriError {
    /// The input.
    pub uri: String,
    /// What is wrong.
    pub reason: String,
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

impl FromStr for NbdUri {
    type Err = UriError;

    fn from_str(uri: &str) -> Result<Self, UriError> {
        let err = |reason: &str| UriError {
            uri: uri.to_string(),
            reason: reason.to_string(),
        };
        let (scheme, rest) = uri.split_once("://").ok_or_else(|| err("missing scheme"))?;
        let unix = match scheme {
            "nbd" => false,
            "nbd+unix" => true,
            "nbds" | "nbds+unix" => return Err(err("TLS is not supported")),
            _ => return Err(err("scheme must be nbd or nbd+unix")),
        };
        let (before_query, query) = match rest.split_once('?') {
            Some((a, q)) => (a, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match before_query.find('/') {
            Some(i) => (&before_query[..i], &before_query[i + 1..]),
            None => (before_query, ""),
        };
        let export_name = percent_decode(path).ok_or_else(|| err("bad percent-encoding"))?;
        let mut socket = None;
        if let Some(q) = query {
            for kv in q.split('&').filter(|s| !s.is_empty()) {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                match k {
                    "socket" => {
                        socket = Some(percent_decode(v).ok_or_else(|| err("bad socket path"))?)
                    }
                    _ => return Err(err("unsupported query parameter")),
                }
            }
        }
        let endpoint = if unix {
            if !authority.is_empty() {
                return Err(err("nbd+unix URIs must have an empty host"));
            }
            let s = socket.ok_or_else(|| err("nbd+unix requires ?socket=PATH"))?;
            if s.is_empty() {
                return Err(err("empty socket path"));
            }
            Endpoint::Unix(PathBuf::from(s))
        } else {
            if socket.is_some() {
                return Err(err("socket= is only valid with nbd+unix"));
            }
            let (host, port) = if let Some(r) = authority.strip_prefix('[') {
                let (h, after) = r.split_once(']').ok_or_else(|| err("unclosed '['"))?;
                let port = match after {
                    "" => None,
                    p => Some(p.strip_prefix(':').ok_or_else(|| err("bad port"))?),
                };
                (h.to_string(), port)
            } else {
                match authority.rsplit_once(':') {
                    Some((h, p)) => (h.to_string(), Some(p)),
                    None => (authority.to_string(), None),
                }
            };
            if host.is_empty() {
                return Err(err("missing host"));
            }
            let port = match port {
                None => DEFAULT_PORT,
                Some(p) => p.parse().map_err(|_| err("bad port"))?,
            };
            Endpoint::Tcp { host, port }
        };
        Ok(NbdUri {
            endpoint,
            export_name,
        })
    }
}

impl fmt::Display for NbdUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let enc = |s: &str| {
            let mut o = String::new();
            for b in s.bytes() {
                if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
                    o.push(b as char);
                } else {
                    o.push_str(&format!("%{b:02X}"));
                }
            }
            o
        };
        match &self.endpoint {
            Endpoint::Tcp { host, port } if host.contains(':') => {
                write!(f, "nbd://[{host}]:{port}/{}", enc(&self.export_name))
            }
            Endpoint::Tcp { host, port } => {
                write!(f, "nbd://{host}:{port}/{}", enc(&self.export_name))
            }
            Endpoint::Unix(p) => write!(
                f,
                "nbd+unix:///{}?socket={}",
                enc(&self.export_name),
                enc(&p.to_string_lossy())
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(h: &str, p: u16, n: &str) -> NbdUri {
        NbdUri {
            endpoint: Endpoint::Tcp {
                host: h.into(),
                port: p,
            },
            export_name: n.into(),
        }
    }

    fn unix(path: &str, n: &str) -> NbdUri {
        NbdUri {
            endpoint: Endpoint::Unix(path.into()),
            export_name: n.into(),
        }
    }

    #[test]
    fn parse_valid() {
        for (u, want) in [
            ("nbd://localhost", tcp("localhost", 10809, "")),
            ("nbd://127.0.0.1:1234/disk", tcp("127.0.0.1", 1234, "disk")),
            ("nbd://[::1]:99/a%20b", tcp("::1", 99, "a b")),
            ("nbd://[::1]", tcp("::1", 10809, "")),
            ("nbd+unix:///?socket=/tmp/s", unix("/tmp/s", "")),
            ("nbd+unix:///exp?socket=/tmp/a%20s", unix("/tmp/a s", "exp")),
        ] {
            assert_eq!(u.parse::<NbdUri>().unwrap(), want, "{u}");
        }
        assert_eq!(
            "nbd+unix://?socket=/x".parse::<NbdUri>().unwrap().endpoint,
            Endpoint::Unix("/x".into())
        );
    }

    #[test]
    fn parse_invalid() {
        for u in [
            "localhost",
            "http://x",
            "nbds://x",
            "nbd://",
            "nbd://h:notaport",
            "nbd://h:70000",
            "nbd+unix:///x",
            "nbd+unix://host/?socket=/s",
            "nbd://h/?socket=/s",
            "nbd://h/%zz",
            "nbd://[::1/x",
            "nbd+unix:///?socket=",
            "nbd://h/?foo=1",
        ] {
            assert!(u.parse::<NbdUri>().is_err(), "{u} should be rejected");
        }
    }

    #[test]
    fn display_roundtrip() {
        for u in [
            "nbd://127.0.0.1:1234/disk",
            "nbd://[::1]:99/a%20b",
            "nbd+unix:///exp?socket=/tmp/a%20s",
        ] {
            let p: NbdUri = u.parse().unwrap();
            assert_eq!(p.to_string(), u);
            assert_eq!(p.to_string().parse::<NbdUri>().unwrap(), p);
        }
    }
}
