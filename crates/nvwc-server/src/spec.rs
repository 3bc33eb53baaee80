//! The exports to serve ([`ExportSpec`]): the default one from
//! `--backing`/`--cache`, each `--export NAME=BACKING[,key=value...]`, and
//! a configuration file's.

use std::path::PathBuf;

use crate::args::{parse_size, Args};

/// One export to serve, from the default flags or an `--export` value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ExportSpec {
    pub(crate) name: String,
    pub(crate) backing: String,
    pub(crate) cache: PathBuf,
    pub(crate) size: u64,
    pub(crate) cache_size: u64,
    pub(crate) write_policy: String,
    pub(crate) replacement: String,
    pub(crate) read_only: bool,
    /// Every request is critical (admission hint).
    pub(crate) critical: bool,
}

/// Parse `NAME=BACKING[,cache=PATH][,cache-size=S][,size=S][,policy=P][,replacement=R][,read-only]`.
/// Unset keys come from the global flags; the cache defaults to
/// `cache-NAME.img` beside `--cache`.
pub(crate) fn parse_export(s: &str, a: &Args) -> Result<ExportSpec, String> {
    let (name, rest) = s
        .split_once('=')
        .ok_or_else(|| format!("--export {s:?}: expected NAME=BACKING[,key=value...]"))?;
    if name.is_empty() || name.len() > 4096 || name.contains(['\0', '/', ',']) {
        return Err(format!(
            "--export {s:?}: the name must be non-empty, without '/', ',' or NUL"
        ));
    }
    let mut parts = rest.split(',');
    let backing = parts.next().unwrap_or_default().to_string();
    if backing.is_empty() {
        return Err(format!("--export {s:?}: no backing store"));
    }
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut e = ExportSpec {
        name: name.to_string(),
        backing,
        cache: a.cache.with_file_name(format!("cache-{safe}.img")),
        size: a.size,
        cache_size: a.cache_size,
        write_policy: a.write_policy.clone(),
        replacement: a.replacement.clone(),
        read_only: a.read_only,
        critical: false,
    };
    for kv in parts {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        match k {
            "cache" => e.cache = PathBuf::from(v),
            "cache-size" => e.cache_size = parse_size(v)?,
            "size" => e.size = parse_size(v)?,
            "policy" | "write-policy" => e.write_policy = v.to_string(),
            "replacement" => e.replacement = v.to_string(),
            "read-only" if v.is_empty() || v == "true" => e.read_only = true,
            "critical" if v.is_empty() || v == "true" => e.critical = true,
            _ => {
                return Err(format!(
                    "--export {s:?}: unknown key {k:?} (cache, cache-size, size, policy, replacement, read-only, critical)"
                ))
            }
        }
    }
    Ok(e)
}

/// An `nbd://` or `nbd+unix://` URI: an upstream NBD server, not a file.
pub(crate) fn is_upstream(spec: &str) -> bool {
    spec.starts_with("nbd://") || spec.starts_with("nbd+unix://")
}
