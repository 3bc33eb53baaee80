//! `nvwc serve --config FILE` and `nvwc check-config FILE`: the TOML
//! configuration file (`contrib/nvwc.example.toml` shows every key).
//!
//! Every key is the `nvwc serve` flag of the same name, grouped in tables:
//! `[server]` (listeners, control socket, default export), `[log]`,
//! `[metrics]`, `[tls]`, `[cache]` (geometry and commits), `[defaults]`
//! (what each export inherits), `[policy]` (engine tuning) and one
//! `[[export]]` table per export. A flag given on the command line wins over
//! the file. Unknown keys are errors, and every error names the file's line
//! and column.
//!
//! `SIGHUP` re-reads the file ([`reload`]): the log level and format and the
//! exports' `critical` admission hints change at once, and a new
//! `[[export]]` is opened and served (new connections see it); anything else,
//! a removed export too, is logged as needing a restart.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use anyhow::Result;
use serde::Deserialize;
use toml::{Spanned, Value};

use crate::args::{parse_range, parse_size, Args};
use crate::export::NvwcExport;
use crate::log::log;
use crate::spec::ExportSpec;

type S<T> = Option<Spanned<T>>;

/// The file as written.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct File {
    #[serde(default)]
    server: Server,
    #[serde(default)]
    log: LogT,
    #[serde(default)]
    metrics: Metrics,
    #[serde(default)]
    tls: Tls,
    #[serde(default)]
    cache: Cache,
    #[serde(default)]
    defaults: Defaults,
    #[serde(default)]
    policy: Policy,
    #[serde(default)]
    export: Vec<Spanned<ExportT>>,
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Server {
    unix: S<String>,
    listen: S<String>,
    control: S<String>,
    default_export: S<String>,
    allow_insecure_tcp: S<bool>,
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct LogT {
    level: S<String>,
    format: S<String>,
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Metrics {
    listen: S<String>,
}

/// `[tls]`: nbdkit's conventions (`--tls`, `--tls-certificates`,
/// `--tls-verify-peer`, `--tls-psk`).
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Tls {
    mode: S<String>,
    certificates: S<String>,
    verify_peer: S<bool>,
    psk: S<String>,
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Cache {
    block_size: S<Value>,
    commit_interval_ms: S<u64>,
    commit_changes: S<u32>,
    log_inline_bytes: S<u64>,
    redo_size: S<Value>,
    upstream_connections: S<u32>,
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Defaults {
    size: S<Value>,
    cache_size: S<Value>,
    write_policy: S<String>,
    replacement: S<String>,
    read_only: S<bool>,
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Policy {
    fetch: S<String>,
    patch_mem: S<Value>,
    fetch_inflight: S<u32>,
    patch_direct: S<bool>,
    rewrite_in_place: S<bool>,
    bypass_when_full: S<bool>,
    full_clean_secs: S<u32>,
    txn_blocks: S<u32>,
    txn_age_ms: S<u64>,
    journal_size: S<Value>,
    high_watermark: S<f64>,
    low_watermark: S<f64>,
    admission: S<String>,
    wal_range: S<Vec<Spanned<String>>>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ExportT {
    name: Spanned<String>,
    backing: Spanned<String>,
    cache: Spanned<String>,
    size: S<Value>,
    cache_size: S<Value>,
    write_policy: S<String>,
    replacement: S<String>,
    read_only: S<bool>,
    critical: S<bool>,
}

/// TLS settings from `[tls]` (and `[server] allow-insecure-tcp`), checked.
/// Wiring them to `nvwc serve`'s TLS flags is a few lines in [`apply`].
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct TlsSettings {
    /// `off`, `on` or `require`.
    pub mode: Option<String>,
    /// A directory with `ca-cert.pem`, `server-cert.pem`, `server-key.pem`.
    pub certificates: Option<PathBuf>,
    pub verify_peer: Option<bool>,
    /// A `psktool` key file (`username:hexkey` lines).
    pub psk: Option<PathBuf>,
    pub allow_insecure_tcp: Option<bool>,
}

/// A configuration file as `nvwc serve` loaded it (kept for `SIGHUP`).
#[derive(Debug)]
pub(crate) struct Loaded {
    path: PathBuf,
    /// Ids of the `nvwc serve` arguments given on the command line.
    given: BTreeSet<String>,
    /// The exports the file lists, resolved against the flags.
    pub(super) exports: Vec<ExportSpec>,
    /// `--export NAME:critical` given on the command line.
    cli_critical: Vec<String>,
    cli_log: (Option<String>, Option<String>),
    /// The file's settings in effect (flattened, `table.key` = value).
    running: Mutex<BTreeMap<String, String>>,
}

/// One error at a place in the file.
struct Diag {
    at: std::ops::Range<usize>,
    msg: String,
}

/// `FILE:LINE:COL: message` for a byte offset of `src`.
fn locate(path: &Path, src: &str, at: usize) -> String {
    let at = at.min(src.len());
    let before = &src[..at];
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    format!("{}:{line}:{col}", path.display())
}

fn render(path: &Path, src: &str, diags: &[Diag]) -> String {
    diags
        .iter()
        .map(|d| format!("{}: {}", locate(path, src, d.at.start), d.msg))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Parse `src`; a syntax error, a wrong type or an unknown key is one
/// `FILE:LINE:COL: message` error.
fn parse(path: &Path, src: &str) -> Result<File, String> {
    toml::from_str::<File>(src).map_err(|e| {
        let msg = e.message().trim().to_string();
        match e.span() {
            Some(s) => format!("{}: {msg}", locate(path, src, s.start)),
            None => format!("{}: {msg}", path.display()),
        }
    })
}

/// A size: an integer (bytes) or a string like `"16G"`.
fn size(v: &Spanned<Value>) -> Result<u64, Diag> {
    let bad = |msg: String| Diag { at: v.span(), msg };
    match v.get_ref() {
        Value::Integer(n) if *n >= 0 => Ok(*n as u64),
        Value::String(s) => parse_size(s).map_err(bad),
        other => Err(bad(format!(
            "expected a size (bytes, or a string like \"16G\"), got {other}"
        ))),
    }
}

fn check<T, E: std::fmt::Display>(
    diags: &mut Vec<Diag>,
    v: &S<String>,
    what: &str,
    f: impl Fn(&str) -> Result<T, E>,
) {
    if let Some(v) = v {
        if let Err(e) = f(v.get_ref()) {
            diags.push(Diag {
                at: v.span(),
                msg: format!("{what}: {e}"),
            });
        }
    }
}

fn check_size(diags: &mut Vec<Diag>, v: &S<Value>) {
    if let Some(v) = v {
        if let Err(d) = size(v) {
            diags.push(d);
        }
    }
}

fn one_of<'a>(allowed: &'a [&'a str]) -> impl Fn(&str) -> Result<(), String> + 'a {
    move |s| {
        if allowed.contains(&s) {
            Ok(())
        } else {
            Err(format!("{s:?} is not one of {}", allowed.join(", ")))
        }
    }
}

/// Every semantic error of a parsed file, each at its value.
fn validate(f: &File) -> Vec<Diag> {
    use nvwc_core::{AdmissionKind, FetchMode, WritePolicyKind};
    use nvwc_replacement::ReplacementKind;
    let mut d = Vec::new();
    let policy = |s: &str| s.parse::<WritePolicyKind>();
    let repl = |s: &str| s.parse::<ReplacementKind>();
    check(
        &mut d,
        &f.log.level,
        "log level",
        one_of(&["error", "warn", "info", "debug"]),
    );
    check(
        &mut d,
        &f.log.format,
        "log format",
        one_of(&["text", "json"]),
    );
    check(
        &mut d,
        &f.tls.mode,
        "tls mode",
        one_of(&["off", "on", "require"]),
    );
    if let Some(m) = &f.tls.mode {
        if m.get_ref() != "off" && f.tls.certificates.is_none() && f.tls.psk.is_none() {
            d.push(Diag {
                at: m.span(),
                msg: format!(
                    "tls mode {:?} needs `certificates` (a directory) or `psk` (a key file)",
                    m.get_ref()
                ),
            });
        }
    }
    for (v, what) in [
        (&f.tls.certificates, "tls certificates"),
        (&f.tls.psk, "tls psk"),
    ] {
        check(&mut d, v, what, |s| {
            if s.is_empty() {
                Err("an empty path")
            } else {
                Ok(())
            }
        });
    }
    if let Some(bs) = &f.cache.block_size {
        match size(bs) {
            Ok(n) if (512..=1 << 20).contains(&n) && n.is_power_of_two() => {}
            Ok(n) => d.push(Diag {
                at: bs.span(),
                msg: format!("block-size {n}: must be a power of two between 512 and 1M"),
            }),
            Err(e) => d.push(e),
        }
    }
    check_size(&mut d, &f.cache.redo_size);
    check_size(&mut d, &f.defaults.size);
    check_size(&mut d, &f.defaults.cache_size);
    check_size(&mut d, &f.policy.patch_mem);
    check_size(&mut d, &f.policy.journal_size);
    check(&mut d, &f.defaults.write_policy, "write-policy", policy);
    check(&mut d, &f.defaults.replacement, "replacement", repl);
    check(&mut d, &f.policy.fetch, "fetch", |s| s.parse::<FetchMode>());
    check(&mut d, &f.policy.admission, "admission", |s| {
        s.parse::<AdmissionKind>()
    });
    for w in [&f.policy.high_watermark, &f.policy.low_watermark]
        .into_iter()
        .flatten()
    {
        if !(0.0..=1.0).contains(w.get_ref()) {
            d.push(Diag {
                at: w.span(),
                msg: format!(
                    "a watermark is a fraction of the cache (0 to 1), not {}",
                    w.get_ref()
                ),
            });
        }
    }
    if let Some(n) = f.cache.upstream_connections.as_ref() {
        if !(1..=64).contains(n.get_ref()) {
            d.push(Diag {
                at: n.span(),
                msg: format!("upstream-connections {}: must be 1 to 64", n.get_ref()),
            });
        }
    }
    if let (Some(h), Some(l)) = (&f.policy.high_watermark, &f.policy.low_watermark) {
        if l.get_ref() > h.get_ref() {
            d.push(Diag {
                at: l.span(),
                msg: "low-watermark is above high-watermark".into(),
            });
        }
    }
    for r in f.policy.wal_range.iter().flat_map(|v| v.get_ref()) {
        if let Err(e) = parse_range(r.get_ref()) {
            d.push(Diag {
                at: r.span(),
                msg: format!("wal-range: {e}"),
            });
        }
    }
    // Exports: names, paths and their own settings.
    let mut names = BTreeSet::new();
    let mut files: BTreeMap<&str, &str> = BTreeMap::new();
    for e in &f.export {
        let e = e.get_ref();
        let n = e.name.get_ref().as_str();
        if n.len() > 4096 || n.contains(['\0', '/', ',']) {
            d.push(Diag {
                at: e.name.span(),
                msg: format!("export name {n:?}: at most 4096 bytes, without '/', ',' or NUL"),
            });
        }
        if !names.insert(n) {
            d.push(Diag {
                at: e.name.span(),
                msg: format!("duplicate export name {n:?}"),
            });
        }
        for (p, what) in [(&e.backing, "backing"), (&e.cache, "cache")] {
            if p.get_ref().is_empty() {
                d.push(Diag {
                    at: p.span(),
                    msg: format!("export {n:?}: empty {what} path"),
                });
                continue;
            }
            // A backing store may be an upstream NBD export shared on purpose.
            if what == "backing" && crate::spec::is_upstream(p.get_ref()) {
                continue;
            }
            if let Some(other) = files.insert(p.get_ref(), n) {
                d.push(Diag {
                    at: p.span(),
                    msg: format!(
                        "export {n:?}: {what} {:?} is also used by export {other:?}",
                        p.get_ref()
                    ),
                });
            }
        }
        check_size(&mut d, &e.size);
        check_size(&mut d, &e.cache_size);
        check(&mut d, &e.write_policy, "write-policy", policy);
        check(&mut d, &e.replacement, "replacement", repl);
    }
    if let Some(de) = &f.server.default_export {
        if !f
            .export
            .iter()
            .any(|e| e.get_ref().name.get_ref() == de.get_ref())
        {
            d.push(Diag {
                at: de.span(),
                msg: format!(
                    "default-export {:?}: no [[export]] of that name",
                    de.get_ref()
                ),
            });
        }
    }
    d.sort_by_key(|x| x.at.start);
    d
}

/// Read, parse and validate `path`: the file and its text, or every error
/// as `FILE:LINE:COL: message` lines.
fn load(path: &Path) -> Result<(File, String), String> {
    let src = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    let f = parse(path, &src)?;
    let diags = validate(&f);
    if !diags.is_empty() {
        return Err(render(path, &src, &diags));
    }
    Ok((f, src))
}

/// `nvwc check-config FILE`.
#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// The configuration file (TOML; see contrib/nvwc.example.toml).
    file: PathBuf,
}

pub fn check_config(a: CheckArgs) -> Result<std::process::ExitCode> {
    match load(&a.file) {
        Ok((f, _)) => {
            let names: Vec<String> = f
                .export
                .iter()
                .map(|e| format!("{:?}", e.get_ref().name.get_ref()))
                .collect();
            println!(
                "{}: ok ({} export{}{}{})",
                a.file.display(),
                names.len(),
                if names.len() == 1 { "" } else { "s" },
                if names.is_empty() { "" } else { ": " },
                names.join(", ")
            );
            Ok(std::process::ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{e}");
            Ok(std::process::ExitCode::from(1))
        }
    }
}

/// `table.key` -> the id of the `nvwc serve` argument it stands for.
fn arg_id(table: &str, key: &str) -> String {
    match (table, key) {
        ("log", k) => format!("log_{k}"),
        ("metrics", "listen") => "metrics".into(),
        ("tls", "mode") => "tls".into(),
        ("tls", k) => format!("tls_{}", k.replace('-', "_")),
        (_, k) => k.replace('-', "_"),
    }
}

/// The file's settings flattened to `table.key` = value (exports as
/// `export[NAME].key`), leaving out what the command line overrides.
/// A set value's copy.
fn copied<T: Copy>(v: &S<T>) -> Option<T> {
    v.as_ref().map(|v| *v.get_ref())
}

fn flatten(src: &str, given: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    let Ok(t) = src.parse::<toml::Table>() else {
        return m;
    };
    for (table, v) in &t {
        match v {
            Value::Table(kv) => {
                for (k, v) in kv {
                    if !given.contains(&arg_id(table, k)) {
                        m.insert(format!("{table}.{k}"), v.to_string());
                    }
                }
            }
            Value::Array(items) if table == "export" => {
                for it in items.iter().filter_map(Value::as_table) {
                    let name = it.get("name").and_then(Value::as_str).unwrap_or_default();
                    m.insert(format!("export[{name:?}]"), String::new());
                    for (k, v) in it.iter().filter(|(k, _)| *k != "name") {
                        m.insert(format!("export[{name:?}].{k}"), v.to_string());
                    }
                }
            }
            _ => {}
        }
    }
    m
}

/// Apply the file at `path` to `a`, except what the command line gave
/// (`given`: argument ids, from clap's `ArgMatches`).
pub(super) fn apply(path: &Path, a: &mut Args, given: BTreeSet<String>) -> Result<()> {
    let (f, src) = load(path).map_err(anyhow::Error::msg)?;
    let g = |id: &str| given.contains(id);
    let string = |v: &S<String>| v.as_ref().map(|v| v.get_ref().clone());
    let sz = |v: &S<Value>| {
        v.as_ref()
            .map(|v| size(v).map_err(|d| d.msg).expect("validated"))
    };
    macro_rules! set {
        ($id:expr, $field:expr, $val:expr) => {
            if let Some(v) = $val {
                if !g($id) {
                    $field = v;
                }
            }
        };
    }
    // Settings named alike in `Args` and the file's `$table`, read by `$read`.
    macro_rules! set_same {
        ($read:ident, $table:expr; $($name:ident),+ $(,)?) => {
            $(set!(stringify!($name), a.$name, $read(&$table.$name));)+
        };
    }
    set!("unix", a.unix, string(&f.server.unix).map(PathBuf::from));
    set!("listen", a.listen, string(&f.server.listen));
    set!(
        "control",
        a.control,
        string(&f.server.control).map(PathBuf::from)
    );
    set!(
        "default_export",
        a.default_export,
        string(&f.server.default_export).map(Some)
    );
    set!("log_level", a.log_level, string(&f.log.level).map(Some));
    set!("log_format", a.log_format, string(&f.log.format).map(Some));
    set!("metrics", a.metrics, string(&f.metrics.listen).map(Some));
    set_same!(sz, f.cache; block_size);
    set_same!(copied, f.cache; commit_interval_ms, log_inline_bytes);
    set!(
        "commit_changes",
        a.commit_changes,
        f.cache.commit_changes.as_ref().map(|v| Some(*v.get_ref()))
    );
    set!("redo_size", a.redo_size, sz(&f.cache.redo_size).map(Some));
    set_same!(copied, f.cache; upstream_connections);
    set_same!(sz, f.defaults; size, cache_size);
    set_same!(string, f.defaults; write_policy, replacement);
    set_same!(copied, f.defaults; read_only);
    let p = &f.policy;
    set_same!(string, p; fetch, admission);
    set_same!(sz, p; patch_mem, journal_size);
    set_same!(
        copied,
        p;
        fetch_inflight,
        patch_direct,
        rewrite_in_place,
        bypass_when_full,
        full_clean_secs,
        txn_blocks,
        txn_age_ms,
        high_watermark,
        low_watermark,
    );
    set!(
        "wal_range",
        a.wal_range,
        p.wal_range.as_ref().map(|v| {
            v.get_ref()
                .iter()
                .map(|r| parse_range(r.get_ref()).expect("validated"))
                .collect()
        })
    );
    let tls = TlsSettings {
        mode: string(&f.tls.mode),
        certificates: string(&f.tls.certificates).map(PathBuf::from),
        verify_peer: copied(&f.tls.verify_peer),
        psk: string(&f.tls.psk).map(PathBuf::from),
        allow_insecure_tcp: copied(&f.server.allow_insecure_tcp),
    };
    set!(
        "tls",
        a.tls.tls,
        tls.mode.as_deref().map(|m| {
            <crate::tls::TlsSetting as clap::ValueEnum>::from_str(m, false).expect("validated")
        })
    );
    set!(
        "tls_certificates",
        a.tls.tls_certificates,
        tls.certificates.clone().map(Some)
    );
    set!("tls_verify_peer", a.tls.tls_verify_peer, tls.verify_peer);
    set!("tls_psk", a.tls.tls_psk, tls.psk.clone().map(Some));
    set!(
        "allow_insecure_tcp",
        a.tls.allow_insecure_tcp,
        tls.allow_insecure_tcp
    );
    if !f.export.is_empty() && (g("backing") || g("cache")) {
        anyhow::bail!(
            "{}: the file lists exports, so --backing and --cache are not used: describe the \
             default export there ([[export]] with name = \"\")",
            path.display()
        );
    }
    // Exports inherit what the flags and [defaults] settled above.
    let exports = f
        .export
        .iter()
        .map(|e| export_spec(e.get_ref(), a))
        .collect();
    let cli_critical = a
        .export
        .iter()
        .filter_map(|s| s.strip_suffix(":critical").filter(|n| !n.contains('=')))
        .map(String::from)
        .collect();
    let running = Mutex::new(flatten(&src, &given));
    a.loaded = Some(Loaded {
        path: path.to_path_buf(),
        cli_log: (
            given
                .contains("log_format")
                .then(|| a.log_format.clone())
                .flatten(),
            given
                .contains("log_level")
                .then(|| a.log_level.clone())
                .flatten(),
        ),
        given,
        exports,
        cli_critical,
        running,
    });
    Ok(())
}

/// An `[[export]]` table as an export, inheriting what `a` settled (the
/// flags and `[defaults]`).
fn export_spec(e: &ExportT, a: &Args) -> ExportSpec {
    let string = |v: &S<String>| v.as_ref().map(|v| v.get_ref().clone());
    let sz = |v: &S<Value>| {
        v.as_ref()
            .map(|v| size(v).map_err(|d| d.msg).expect("validated"))
    };
    ExportSpec {
        name: e.name.get_ref().clone(),
        backing: e.backing.get_ref().clone(),
        cache: PathBuf::from(e.cache.get_ref()),
        size: sz(&e.size).unwrap_or(a.size),
        cache_size: sz(&e.cache_size).unwrap_or(a.cache_size),
        write_policy: string(&e.write_policy).unwrap_or_else(|| a.write_policy.clone()),
        replacement: string(&e.replacement).unwrap_or_else(|| a.replacement.clone()),
        read_only: e.read_only.as_ref().map_or(a.read_only, |v| *v.get_ref()),
        critical: e.critical.as_ref().is_some_and(|v| *v.get_ref()),
        upstream_connections: a.upstream_connections as usize,
    }
}

/// `nvwc serve`: apply `--config` (if given) under the flags the command
/// line gave (`m`), then run.
pub fn serve(a: Args, m: &clap::ArgMatches) -> Result<std::process::ExitCode> {
    crate::run::run(with_config(a, m)?)
}

/// `a` with `--config` (if given) applied under the flags the command line
/// gave (`m`, the matches `a` was parsed from).
pub(crate) fn with_config(mut a: Args, m: &clap::ArgMatches) -> Result<Args> {
    if let Some(path) = a.config.clone() {
        let given = m
            .ids()
            .filter(|id| {
                m.value_source(id.as_str()) == Some(clap::parser::ValueSource::CommandLine)
            })
            .map(|id| id.as_str().to_string())
            .collect();
        apply(&path, &mut a, given)?;
    }
    Ok(a)
}

/// `SIGHUP`: re-read the file; apply the log settings and the exports'
/// `critical` hints, return the exports the file adds (the caller opens
/// them and reports each with [`added`]), and log every other change,
/// a removed export too, as needing a restart.
pub(super) fn reload(l: &Loaded, a: &Args, exports: &[Arc<NvwcExport>]) -> Vec<ExportSpec> {
    let path = l.path.display().to_string();
    log!(info, "reload", config = &path);
    let (f, src) = match load(&l.path) {
        Ok(x) => x,
        Err(e) => {
            log!(
                error,
                "reload_failed",
                config = &path,
                error = e,
                note = "the running settings stay"
            );
            return Vec::new();
        }
    };
    let new = flatten(&src, &l.given);
    let mut running = l.running.lock().unwrap();
    let keys: BTreeSet<String> = running.keys().chain(new.keys()).cloned().collect();
    let (mut applied, mut restart, mut new_exports) = (Vec::new(), Vec::new(), Vec::new());
    // `export[NAME].key` -> `export[NAME]`, the key an export's presence has.
    let export_of = |k: &str| k.find("].").map(|i| k[..=i].to_string());
    for k in keys {
        if running.get(&k) == new.get(&k) {
            continue;
        }
        let export = export_of(&k);
        // An export added or removed is reported once, not key by key.
        let whole = |e: &String| !running.contains_key(e) || !new.contains_key(e);
        if export.as_ref().is_some_and(whole) {
            continue;
        }
        let live = k == "log.level"
            || k == "log.format"
            || (export.is_some() && k.ends_with("].critical"));
        if live {
            match new.get(&k) {
                Some(v) => running.insert(k.clone(), v.clone()),
                None => running.remove(&k),
            };
            applied.push(k);
        } else if k.starts_with("export[") && export.is_none() && new.contains_key(&k) {
            new_exports.push(k);
        } else if k.starts_with("export[") && export.is_none() {
            restart.push(format!("{k} (removed)"));
        } else {
            restart.push(k);
        }
    }
    drop(running);
    // The log settings in effect: the command line's, else the file's.
    let lvl = l
        .cli_log
        .1
        .clone()
        .or_else(|| f.log.level.as_ref().map(|v| v.get_ref().clone()));
    let fmt = l
        .cli_log
        .0
        .clone()
        .or_else(|| f.log.format.as_ref().map(|v| v.get_ref().clone()));
    if let Err(e) = crate::log::init(fmt.as_deref(), lvl.as_deref()) {
        log!(error, "reload_failed", config = &path, error = e);
    }
    for x in exports {
        if let Some(e) = f
            .export
            .iter()
            .find(|e| e.get_ref().name.get_ref() == &x.info.name)
        {
            let on = e.get_ref().critical.as_ref().is_some_and(|v| *v.get_ref())
                || l.cli_critical.contains(&x.info.name);
            x.critical.store(on, Ordering::Relaxed);
        }
    }
    log!(
        info,
        "reloaded",
        config = &path,
        applied = applied.join(" ")
    );
    if !restart.is_empty() {
        log!(
            warn,
            "reload_needs_restart",
            config = &path,
            changed = restart.join(" "),
            note = "these changes take effect when nvwc serve restarts"
        );
    }
    // New exports: opened by the caller; their keys join the running
    // settings in `added` once they serve.
    f.export
        .iter()
        .map(|e| e.get_ref())
        .filter(|e| new_exports.contains(&format!("export[{:?}]", e.name.get_ref())))
        .map(|e| {
            let mut spec = export_spec(e, a);
            spec.critical |= l.cli_critical.contains(&spec.name);
            spec
        })
        .collect()
}

/// Export `name`, which [`reload`] returned, now serves: its settings join
/// those in effect, so a later reload compares against them.
pub(super) fn added(l: &Loaded, name: &str) {
    let Ok((_, src)) = load(&l.path) else {
        return;
    };
    let prefix = format!("export[{name:?}]");
    let mut running = l.running.lock().unwrap();
    for (k, v) in flatten(&src, &l.given) {
        if k == prefix || k.starts_with(&format!("{prefix}.")) {
            running.insert(k, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errs(src: &str) -> String {
        let p = Path::new("t.toml");
        match parse(p, src) {
            Err(e) => e,
            Ok(f) => render(p, src, &validate(&f)),
        }
    }

    #[test]
    fn errors_name_the_line_and_column() {
        assert_eq!(errs("[server]\nunix = \"/s\"\n"), "");
        // (file, the start of its error, a part of it).
        for (src, start, part) in [
            ("[server]\nunix = \"/s\"\nlisten = 5\n", "t.toml:3:10: ", ""),
            ("[server]\nbogus = 1\n", "t.toml:2:1: ", "unknown field `bogus`"),
            (
                "[defaults]\n\nwrite-policy = \"fast\"\n",
                "t.toml:3:16: write-policy: unknown write policy",
                "",
            ),
            (
                "[[export]]\nname = \"a\"\nbacking = \"a.img\"\ncache = \"a.c\"\ncache-size = \"12Q\"\n",
                "t.toml:5:14: unknown size unit",
                "",
            ),
            (
                "[tls]\nmode = \"require\"\n",
                "t.toml:2:8: tls mode \"require\" needs",
                "",
            ),
            ("[cache]\nblock-size = 1000\n", "t.toml:2:14: block-size 1000", ""),
            (
                "[cache]\nupstream-connections = 0\n",
                "t.toml:2:24: upstream-connections 0: must be 1 to 64",
                "",
            ),
        ] {
            let e = errs(src);
            assert!(e.starts_with(start) && e.contains(part), "{e}");
        }
        let two = "[[export]]\nname = \"a\"\nbacking = \"a.img\"\ncache = \"a.c\"\n\
                   [[export]]\nname = \"a\"\nbacking = \"b.img\"\ncache = \"a.c\"\n";
        let e = errs(two);
        assert_eq!(
            e,
            "t.toml:6:8: duplicate export name \"a\"\n\
             t.toml:8:9: export \"a\": cache \"a.c\" is also used by export \"a\""
        );
    }

    /// Flags given on the command line win over the file; the file wins
    /// over the flags' defaults; exports inherit the result.
    #[test]
    fn flags_override_the_file() {
        use clap::{Args as _, FromArgMatches};
        let dir = std::env::temp_dir().join(format!("nvwc-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("c.toml");
        std::fs::write(
            &p,
            "[log]\nlevel = \"debug\"\n[defaults]\nwrite-policy = \"journaled\"\ncache-size = \"2M\"\n\
             [policy]\nwal-range = [\"0:1M\"]\n\
             [[export]]\nname = \"a\"\nbacking = \"a.img\"\ncache = \"a.c\"\n\
             [[export]]\nname = \"b\"\nbacking = \"b.img\"\ncache = \"b.c\"\nwrite-policy = \"write-through\"\n",
        )
        .unwrap();
        let cmd = Args::augment_args(clap::Command::new("serve"));
        let m = cmd
            .try_get_matches_from([
                "serve",
                "--config",
                p.to_str().unwrap(),
                "--write-policy",
                "ordered",
            ])
            .unwrap();
        let a = with_config(Args::from_arg_matches(&m).unwrap(), &m).unwrap();
        assert_eq!(a.write_policy, "ordered");
        assert_eq!(a.log_level.as_deref(), Some("debug"));
        assert_eq!(a.cache_size, 2 << 20);
        assert_eq!(a.wal_range, [(0, 1 << 20)]);
        let ex = &a.loaded.as_ref().unwrap().exports;
        assert_eq!(
            (ex[0].write_policy.as_str(), ex[0].cache_size),
            ("ordered", 2 << 20)
        );
        assert_eq!(ex[1].write_policy, "write-through");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn flatten_leaves_out_what_the_command_line_gives() {
        let src = "[log]\nlevel = \"debug\"\n[defaults]\ncache-size = \"1G\"\n\
                   [[export]]\nname = \"db\"\nbacking = \"b\"\ncache = \"c\"\ncritical = true\n";
        let given: BTreeSet<String> = ["log_level".to_string()].into();
        let m = flatten(src, &given);
        let keys: Vec<&str> = m.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "defaults.cache-size",
                "export[\"db\"]",
                "export[\"db\"].backing",
                "export[\"db\"].cache",
                "export[\"db\"].critical"
            ]
        );
    }
}
