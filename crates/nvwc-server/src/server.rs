//! A running server: its exports ([`ExportList`]), the NBD listeners, the
//! control socket and metrics, `SIGHUP` reloads, and the orderly stop
//! (requests finished, metadata committed, a detached cache released).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use nvwc_core::layout;
use nvwc_core::Stats;

use crate::args::Args;
use crate::connections::{log_server_event, track_connection, Conns};
use crate::control::control_loop;
use crate::export::NvwcExport;
use crate::log::log;
use crate::metrics::metrics_loop;
use crate::open::open_export;
use crate::spec::{is_upstream, parse_export, ExportSpec};
use crate::{config_file, format, log};

/// The exports being served. `SIGHUP` may add one (`config_file::reload`),
/// so the control socket, metrics and shutdown take a snapshot each time.
#[derive(Default)]
pub(crate) struct ExportList(std::sync::RwLock<Vec<Arc<NvwcExport>>>);

impl ExportList {
    pub(crate) fn all(&self) -> Vec<Arc<NvwcExport>> {
        self.0.read().unwrap().clone()
    }

    pub(crate) fn push(&self, e: Arc<NvwcExport>) {
        self.0.write().unwrap().push(e);
    }
}

pub fn run(a: Args) -> Result<std::process::ExitCode> {
    log::init(a.log_format.as_deref(), a.log_level.as_deref()).map_err(anyhow::Error::msg)?;
    // Before anything is created or opened: the public-listener guard, and
    // every TLS file loaded.
    if crate::tls::check_listener(&a.listen, &a.tls)? {
        log!(
            warn,
            "insecure_tcp",
            listen = &a.listen,
            tls = format!("{:?}", a.tls.tls).to_lowercase()
        );
    }
    let tls = crate::tls::setup(&a.tls)?;
    let bs = a.block_size;
    if !(512..=1 << 20).contains(&bs) || !bs.is_power_of_two() {
        bail!("--block-size must be a power of two between 512 and 1M");
    }
    let mut specs = Vec::new();
    let from_file = a.loaded.as_ref().map_or(&[][..], |l| &l.exports[..]);
    if a.default_export.is_none() && from_file.is_empty() {
        specs.push(ExportSpec {
            name: String::new(),
            backing: a.backing.to_string_lossy().to_string(),
            cache: a.cache.clone(),
            size: a.size,
            cache_size: a.cache_size,
            write_policy: a.write_policy.clone(),
            replacement: a.replacement.clone(),
            read_only: a.read_only,
            critical: false,
        });
    }
    specs.extend(from_file.iter().cloned());
    // `NAME:critical` marks an export (given here or by another --export).
    let mut critical_names = Vec::new();
    for s in &a.export {
        if let Some(name) = s.strip_suffix(":critical").filter(|n| !n.contains('=')) {
            critical_names.push(name.to_string());
            continue;
        }
        let e = parse_export(s, &a).map_err(anyhow::Error::msg)?;
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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut exports = Vec::new();
    for e in &specs {
        exports.push(
            open_export(e, &a, &rt)
                .with_context(|| format!("export {:?} ({})", e.name, e.backing))?,
        );
    }
    let exports = Arc::new(ExportList(std::sync::RwLock::new(exports)));
    let ctl_path = a.control.clone();
    let metrics_addr = a.metrics.clone();

    let ex = exports.clone();
    let rt_ref = &rt;
    let code = rt.block_on(async move {
        let rt = rt_ref;
        let mut specs = specs;
        let conns: Conns = Arc::default();
        let c2 = conns.clone();
        let ex2 = ex.clone();
        let mut b = nvwc_nbd::Server::builder().on_event(move |ev| {
            track_connection(&c2, &ev);
            if let nvwc_nbd::ServerEvent::Disconnected { conn_id, .. } = &ev {
                // A gone connection's hint goes with it (ids are never reused).
                for e in ex2.all().iter().filter(|e| e.hinted.load(Ordering::Relaxed) > 0) {
                    e.set_hint(*conn_id, false);
                }
            }
            log_server_event(ev)
        });
        for e in ex.all() {
            b = b.export(e);
        }
        if let Some(d) = &a.default_export {
            b = b.default_export(d.clone());
        }
        if let Some((mode, acceptor)) = tls {
            b = b.tls(mode, acceptor);
        }
        let server = b.build()?;
        let stop = Arc::new(tokio::sync::Notify::new());
        let ctl = tokio::spawn(control_loop(ctl_path, ex.clone(), stop.clone(), conns));
        if let Some(m) = metrics_addr {
            tokio::spawn(metrics_loop(m, ex.clone()));
        }
        let _ = std::fs::remove_file(&a.unix);
        if let Some(d) = a.unix.parent() {
            if !d.as_os_str().is_empty() {
                std::fs::create_dir_all(d)?;
            }
        }
        server.listen_unix(&a.unix).await.with_context(|| format!("listening on {}", a.unix.display()))?;
        let mut tcp = None;
        if a.listen != "none" {
            tcp = Some(server.listen_tcp(a.listen.as_str()).await.with_context(|| format!("listening on {}", a.listen))?);
        }
        let sock = std::fs::canonicalize(&a.unix).unwrap_or(a.unix.clone());
        let uri = format!("nbd+unix:///?socket={}", sock.display());
        for e in ex.all() {
            let shown = if e.info.name.is_empty() { "(default)" } else { &e.info.name };
            println!("nvwc: export {shown}: {} ({} bytes)", e.info.description, e.info.size);
        }
        log!(info, "listening", unix = sock.display().to_string(), tcp = tcp.map(|t| t.to_string()).unwrap_or_else(|| "none".into()), exports = ex.all().len());
        println!("  unix socket: {}", sock.display());
        if let Some(addr) = tcp {
            println!("  tcp:         nbd://{addr}/");
        }
        println!("connect with:");
        if let Some(h) = crate::tls::connect_hint(&a.tls, &sock) {
            println!("{h}");
        }
        println!("  nbdinfo '{uri}'            # nbdinfo --list '{uri}' lists every export");
        println!("  qemu-io -f raw -c 'write -P 0xab 0 64k' -c 'read -P 0xab 0 64k' '{uri}'");
        println!("  mkdir -p /tmp/nvwc-fuse && nbdfuse /tmp/nvwc-fuse/disk '{uri}' &   # then: losetup -f --show /tmp/nvwc-fuse/disk");
        println!("  (a named export: nbd+unix:///NAME?socket={})", sock.display());
        println!("stop with Ctrl-C or SIGTERM (in-flight requests finish, metadata is committed)");
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
        sd_notify(&format!("READY=1\nSTATUS=serving {} export(s)", ex.all().len()));
        let detached = loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => { log!(info, "signal", signal = "SIGINT"); break false }
                _ = term.recv() => { log!(info, "signal", signal = "SIGTERM"); break false }
                _ = stop.notified() => { log!(info, "detached", dirty_blocks = 0u64); break true }
                _ = hup.recv() => {
                    log!(info, "signal", signal = "SIGHUP");
                    match &a.loaded {
                        Some(l) => {
                            sd_notify("RELOADING=1");
                            for spec in config_file::reload(l, &a, &ex.all()) {
                                add_export(&spec, &a, rt, &server, &ex, &mut specs);
                                if specs.iter().any(|x| x.name == spec.name) {
                                    config_file::added(l, &spec.name);
                                }
                            }
                            sd_notify("READY=1");
                        }
                        None => log!(warn, "reload_skipped", reason = "no --config file to reload"),
                    }
                }
            }
        };
        sd_notify("STOPPING=1\nSTATUS=stopping: finishing requests, committing metadata");
        log!(info, "stopping");
        ctl.abort();
        server.shutdown().await;
        anyhow::Ok(detached)
    });
    let detached = code?;
    for e in exports.all() {
        let st = e.host.shutdown(Duration::from_secs(60));
        if let Some(st) = st
            .as_ref()
            .filter(|st| detached && st.dirty_blocks == 0 && st.patched_blocks == 0)
        {
            release_cache(&e, st);
        }
        match st {
            Some(st) => log!(
                info,
                "stopped",
                export = &e.info.name,
                dirty_blocks = st.dirty_blocks,
                writes = st.writes,
                reads = st.reads,
                read_hits = st.read_hits,
                commits = st.commits
            ),
            None => log!(error, "stop_timeout", export = &e.info.name),
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// `SIGHUP` found export `spec` new in the configuration file: open it and
/// serve it (new connections can list and open it). Refused with a log line
/// (`export_add_failed`) when it shares a cache or backing file with an
/// export being served or fails to open; the others keep serving.
fn add_export(
    spec: &ExportSpec,
    a: &Args,
    rt: &tokio::runtime::Runtime,
    server: &nvwc_nbd::Server,
    ex: &ExportList,
    specs: &mut Vec<ExportSpec>,
) {
    let fail = |error: String| {
        log!(
            error,
            "export_add_failed",
            export = &spec.name,
            error = error
        )
    };
    if let Some(x) = specs.iter().find(|x| {
        x.cache == spec.cache || (x.backing == spec.backing && !is_upstream(&spec.backing))
    }) {
        return fail(format!(
            "it shares its cache or backing file with export {:?}",
            x.name
        ));
    }
    // `open_export` blocks on the runtime for an upstream backing store,
    // which only a thread outside the runtime may do.
    let opened = std::thread::scope(|s| s.spawn(|| open_export(spec, a, rt)).join());
    let e = match opened {
        Ok(Ok(e)) => e,
        Ok(Err(err)) => return fail(crate::errors::chain(&err)),
        Err(_) => return fail("opening it panicked".into()),
    };
    if let Err(err) = server.add_export(e.clone()) {
        e.host.shutdown(Duration::from_secs(60));
        return fail(err.to_string());
    }
    ex.push(e.clone());
    specs.push(spec.clone());
    let shown = if e.info.name.is_empty() {
        "(default)"
    } else {
        &e.info.name
    };
    println!(
        "nvwc: export {shown}: {} ({} bytes)",
        e.info.description, e.info.size
    );
    log!(
        info,
        "export_added",
        export = &e.info.name,
        size = e.info.size,
        backing = &spec.backing
    );
}

/// Tell systemd (`Type=notify`) about the server's state; see `notify.rs`.
fn sd_notify(state: &str) {
    if let Err(e) = crate::notify::notify(state) {
        log!(warn, "sd_notify_failed", error = e.to_string());
    }
}

/// After `nvwc detach` wrote everything back: mark the cache emptied, so
/// that its next start formats it afresh (and may bind it to any backing
/// store) instead of serving clean copies that writes made to the backing
/// store alone since would have made stale. One superblock sector, synced;
/// if it fails, the cache stays bound and holds only clean blocks.
fn release_cache(e: &NvwcExport, st: &Stats) {
    let mut sb = e.superblock.clone();
    sb.flags |= layout::SB_EMPTY;
    let cache = e.cache_path.display().to_string();
    match format::write_superblock(&e.cache_meta, &sb) {
        Ok(()) => log!(
            info,
            "released",
            export = &e.info.name,
            cache = cache,
            destaged_blocks = st.destaged_blocks
        ),
        Err(err) => log!(
            warn,
            "release_failed",
            export = &e.info.name,
            cache = cache,
            error = err.to_string()
        ),
    }
}
