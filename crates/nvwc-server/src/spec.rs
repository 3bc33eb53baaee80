//! The exports to serve ([`ExportSpec`]): the default one from
//! `--backing`/`--cache`, each `--export NAME=BACKING[,key=value...]`, and
//! a configuration file's.

use std::path::PathBuf;

use anyhow::{bail, Result};

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
    /// Connections to an upstream backing store that offers multi-conn.
    pub(crate) upstream_connections: usize,
}

impl ExportSpec {
    /// Export `name` of `backing` with cache `cache`, the rest from the
    /// global flags.
    fn with_flags(a: &Args, name: String, backing: String, cache: PathBuf) -> ExportSpec {
        ExportSpec {
            name,
            backing,
            cache,
            size: a.size,
            cache_size: a.cache_size,
            write_policy: a.write_policy.clone(),
            replacement: a.replacement.clone(),
            read_only: a.read_only,
            critical: false,
            upstream_connections: a.upstream_connections as usize,
        }
    }
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
    let cache = a.cache.with_file_name(format!("cache-{safe}.img"));
    let mut e = ExportSpec::with_flags(a, name.to_string(), backing, cache);
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

/// The exports `a` asks for, checked: the default one (unless
/// `--default-export` or a configuration file's exports replace it), the
/// configuration file's, then each `--export`; `NAME:critical` marks one.
/// Names, caches and backing files MUST be unique (an upstream may serve
/// several), and `--default-export` MUST name one of them.
pub(crate) fn export_specs(a: &Args) -> Result<Vec<ExportSpec>> {
    let mut specs = Vec::new();
    let from_file = a.loaded.as_ref().map_or(&[][..], |l| &l.exports[..]);
    if a.default_export.is_none() && from_file.is_empty() {
        specs.push(ExportSpec::with_flags(
            a,
            String::new(),
            a.backing.to_string_lossy().to_string(),
            a.cache.clone(),
        ));
    }
    specs.extend(from_file.iter().cloned());
    // `NAME:critical` marks an export (given here or by another --export).
    let mut critical_names = Vec::new();
    for s in &a.export {
        if let Some(name) = s.strip_suffix(":critical").filter(|n| !n.contains('=')) {
            critical_names.push(name.to_string());
            continue;
        }
        let e = parse_export(s, a).map_err(anyhow::Error::msg)?;
        if specs.iter().any(|x: &ExportSpec| x.name == e.name) {
            bail!("--export {:?}: duplicate export name", e.name);
        }
        if let Some(x) = specs
            .iter()
            .find(|x| x.cache == e.cache || (x.backing == e.backing && !is_upstream(&e.backing)))
        {
            bail!(
                "--export {:?} shares its cache or backing file with export {:?}",
                e.name,
                x.name
            );
        }
        specs.push(e);
    }
    for n in &critical_names {
        let Some(x) = specs.iter_mut().find(|x| &x.name == n) else {
            bail!("--export {n}:critical: no export of that name");
        };
        x.critical = true;
    }
    if let Some(d) = &a.default_export {
        if !specs.iter().any(|x| &x.name == d) {
            bail!("--default-export {d:?}: no --export of that name");
        }
    }
    Ok(specs)
}
