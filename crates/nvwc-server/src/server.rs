//! A server running in this process ([`Server`]): its exports
//! ([`ExportList`]), the NBD listeners, the control socket and metrics, and
//! the orderly stop (requests finished, metadata committed, a detached
//! cache released). `nvwc serve` wraps it with signals, systemd
//! notification and its banner (`run.rs`); tests start one directly.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use nvwc_core::layout;
use nvwc_core::Stats;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

use crate::args::Args;
use crate::connections::{log_server_event, track_connection, Conns};
use crate::control::{bind_control, control_loop};
use crate::export::NvwcExport;
use crate::log::log;
use crate::metrics::metrics_loop;
use crate::open::open_export;
use crate::spec::{export_specs, ExportSpec};
use crate::{format, log};

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

/// A server serving its exports on its unix socket (and TCP address, unless
/// `--listen none`) from a runtime of its own, until [`Server::stop`].
///
/// Its methods MUST be called from outside any tokio runtime: they block on
/// the server's own.
pub struct Server {
    pub(crate) rt: Runtime,
    pub(crate) state: State,
}

/// What a running server holds, apart from its runtime.
pub(crate) struct State {
    pub(crate) args: Args,
    pub(crate) nbd: nvwc_nbd::Server,
    pub(crate) exports: Arc<ExportList>,
    /// The specs of the exports served, for `SIGHUP`'s additions.
    pub(crate) specs: Vec<ExportSpec>,
    /// Notified by `nvwc detach` once every export is written back.
    pub(crate) detached: Arc<tokio::sync::Notify>,
    tasks: Vec<JoinHandle<Result<()>>>,
    unix: PathBuf,
    tcp: Option<SocketAddr>,
}

impl Server {
    /// Open every export `a` names, bind them, and start serving: the NBD
    /// listeners, the control socket and, with `--metrics`, the metrics
    /// address. Refuses (an error, nothing served) what `nvwc serve` refuses.
    pub fn start(a: Args) -> Result<Server> {
        assert!(
            tokio::runtime::Handle::try_current().is_err(),
            "Server::start MUST be called outside a tokio runtime"
        );
        log::init(a.log_format.as_deref(), a.log_level.as_deref()).map_err(anyhow::Error::msg)?;
        // Before anything is created or opened: the public-listener guard,
        // and every TLS file loaded.
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
        let specs = export_specs(&a)?;
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
        let state = match rt.block_on(State::listen(a, specs, exports.clone(), tls)) {
            Ok(s) => s,
            Err(err) => {
                for e in exports.all() {
                    e.host.shutdown(Duration::from_secs(60));
                }
                return Err(err);
            }
        };
        Ok(Server { rt, state })
    }

    /// The unix socket the server listens on (canonical).
    pub fn unix_socket(&self) -> &Path {
        &self.state.unix
    }

    /// The TCP address the server listens on, unless `--listen none`.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.state.tcp
    }

    /// The NBD URI of export `name` ("" for the default one) on the unix socket.
    pub fn uri(&self, name: &str) -> String {
        format!("nbd+unix:///{name}?socket={}", self.state.unix.display())
    }

    /// Stop serving: connections end after their requests in flight, every
    /// export's metadata is committed and its host stopped. Errors if an
    /// export did not stop within a minute.
    /// Returns once every device and every export (whose superblock handle
    /// shares the cache's lock) is closed, so that a new server may open the
    /// same cache at once.
    pub fn stop(self) -> Result<()> {
        let all = self.state.exports.all();
        let devices: Vec<_> = all.iter().flat_map(|e| e.host.devices()).collect();
        let exports: Vec<_> = all.iter().map(Arc::downgrade).collect();
        drop(all);
        self.finish(false)?;
        // The host's threads let go of its devices shortly after it stops,
        // and the last holder of an export (a connection's task, the
        // control socket's) drops it as it ends.
        let t = std::time::Instant::now();
        while devices.iter().any(|d| d.strong_count() > 0)
            || exports.iter().any(|e| e.strong_count() > 0)
        {
            if t.elapsed() > Duration::from_secs(30) {
                bail!("the stopped server's devices or exports were not closed within 30 s");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }

    /// Stop (see [`Server::stop`]); `detached`: `nvwc detach` wrote every
    /// export back, so each cache left clean is released (`release_cache`).
    pub(crate) fn finish(self, detached: bool) -> Result<()> {
        let Server { rt, state } = self;
        rt.block_on(async {
            for t in &state.tasks {
                t.abort();
            }
            state.nbd.shutdown().await;
        });
        let mut timed_out = Vec::new();
        for e in state.exports.all() {
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
                None => {
                    log!(error, "stop_timeout", export = &e.info.name);
                    timed_out.push(e.info.name.clone());
                }
            }
        }
        if !timed_out.is_empty() {
            bail!("exports {timed_out:?} did not stop within a minute");
        }
        Ok(())
    }
}

impl State {
    /// Build the NBD server over `exports`, start the control socket and
    /// metrics, and listen. Runs on the server's runtime.
    async fn listen(
        a: Args,
        specs: Vec<ExportSpec>,
        exports: Arc<ExportList>,
        tls: Option<(nvwc_nbd::TlsMode, Arc<dyn nvwc_nbd::TlsAcceptor>)>,
    ) -> Result<State> {
        let conns: Conns = Arc::default();
        let nbd = nbd_server(&a, &exports, conns.clone(), tls)?;
        let detached = Arc::new(tokio::sync::Notify::new());
        let control = bind_control(&a.control)?;
        let mut tasks = vec![tokio::spawn(control_loop(
            control,
            exports.clone(),
            detached.clone(),
            conns,
        ))];
        if let Some(m) = a.metrics.clone() {
            tasks.push(tokio::spawn(metrics_loop(m, exports.clone())));
        }
        let mut state = State {
            args: a,
            nbd,
            exports,
            specs,
            detached,
            tasks,
            unix: PathBuf::new(),
            tcp: None,
        };
        if let Err(err) = state.bind().await {
            for t in &state.tasks {
                t.abort();
            }
            return Err(err);
        }
        Ok(state)
    }

    /// Listen on the unix socket and, unless `--listen none`, on TCP.
    async fn bind(&mut self) -> Result<()> {
        let a = &self.args;
        let _ = std::fs::remove_file(&a.unix);
        if let Some(d) = a.unix.parent() {
            if !d.as_os_str().is_empty() {
                std::fs::create_dir_all(d)?;
            }
        }
        self.nbd
            .listen_unix(&a.unix)
            .await
            .with_context(|| format!("listening on {}", a.unix.display()))?;
        if a.listen != "none" {
            let addr = self
                .nbd
                .listen_tcp(a.listen.as_str())
                .await
                .with_context(|| format!("listening on {}", a.listen))?;
            self.tcp = Some(addr);
        }
        self.unix = std::fs::canonicalize(&a.unix).unwrap_or(a.unix.clone());
        log!(
            info,
            "listening",
            unix = self.unix.display().to_string(),
            tcp = self
                .tcp
                .map(|t| t.to_string())
                .unwrap_or_else(|| "none".into()),
            exports = self.exports.all().len()
        );
        Ok(())
    }
}

/// The NBD server over `exports`: connection events tracked in `conns` and
/// logged, a gone connection's hints dropped.
fn nbd_server(
    a: &Args,
    exports: &Arc<ExportList>,
    conns: Conns,
    tls: Option<(nvwc_nbd::TlsMode, Arc<dyn nvwc_nbd::TlsAcceptor>)>,
) -> Result<nvwc_nbd::Server> {
    let ex = exports.clone();
    let mut b = nvwc_nbd::Server::builder().on_event(move |ev| {
        track_connection(&conns, &ev);
        if let nvwc_nbd::ServerEvent::Disconnected { conn_id, .. } = &ev {
            // A gone connection's hint goes with it (ids are never reused).
            for e in ex
                .all()
                .iter()
                .filter(|e| e.hinted.load(Ordering::Relaxed) > 0)
            {
                e.set_hint(*conn_id, false);
            }
        }
        log_server_event(ev)
    });
    for e in exports.all() {
        b = b.export(e);
    }
    if let Some(d) = &a.default_export {
        b = b.default_export(d.clone());
    }
    if let Some((mode, acceptor)) = tls {
        b = b.tls(mode, acceptor);
    }
    Ok(b.build()?)
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
