//! `nvwc serve` as a process: a [`Server`] started, its banner printed,
//! then serving until `SIGINT`, `SIGTERM` or `nvwc detach`, with `SIGHUP`
//! reloading the configuration file and systemd told each state change
//! (`notify.rs`).

use std::time::Duration;

use anyhow::Result;

use crate::args::Args;
use crate::config_file;
use crate::log::log;
use crate::open::open_export;
use crate::server::{Server, State};
use crate::spec::{is_upstream, ExportSpec};

/// `nvwc serve`: serve until a signal or `nvwc detach`, then stop in order.
pub fn run(a: Args) -> Result<std::process::ExitCode> {
    let mut server = Server::start(a)?;
    banner(&server);
    let detached = server.rt.block_on(server.state.serve(&server.rt))?;
    sd_notify("STOPPING=1\nSTATUS=stopping: finishing requests, committing metadata");
    log!(info, "stopping");
    // An export that did not stop in time is logged (`stop_timeout`); the
    // exit status stays 0, as the others stopped in order.
    let _ = server.finish(detached);
    Ok(std::process::ExitCode::SUCCESS)
}

/// An export's line on stdout.
fn print_export(info: &nvwc_nbd::ExportInfo) {
    let shown = if info.name.is_empty() {
        "(default)"
    } else {
        &info.name
    };
    println!(
        "nvwc: export {shown}: {} ({} bytes)",
        info.description, info.size
    );
}

/// What is served, and how to connect, on stdout.
fn banner(s: &Server) {
    let (a, sock) = (&s.state.args, s.unix_socket());
    let uri = s.uri("");
    for e in s.state.exports.all() {
        print_export(&e.info);
    }
    println!("  unix socket: {}", sock.display());
    if let Some(addr) = s.tcp_addr() {
        println!("  tcp:         nbd://{addr}/");
    }
    println!("connect with:");
    if let Some(h) = crate::tls::connect_hint(&a.tls, sock) {
        println!("{h}");
    }
    println!("  nbdinfo '{uri}'            # nbdinfo --list '{uri}' lists every export");
    println!("  qemu-io -f raw -c 'write -P 0xab 0 64k' -c 'read -P 0xab 0 64k' '{uri}'");
    println!("  mkdir -p /tmp/nvwc-fuse && nbdfuse /tmp/nvwc-fuse/disk '{uri}' &   # then: losetup -f --show /tmp/nvwc-fuse/disk");
    println!(
        "  (a named export: nbd+unix:///NAME?socket={})",
        sock.display()
    );
    println!("stop with Ctrl-C or SIGTERM (in-flight requests finish, metadata is committed)");
}

impl State {
    /// Serve until `SIGINT`, `SIGTERM` or `nvwc detach` (then `true`),
    /// reloading the configuration file on `SIGHUP`.
    async fn serve(&mut self, rt: &tokio::runtime::Runtime) -> Result<bool> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut hup = signal(SignalKind::hangup())?;
        sd_notify(&format!(
            "READY=1\nSTATUS=serving {} export(s)",
            self.exports.all().len()
        ));
        let detached = self.detached.clone();
        Ok(loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => { log!(info, "signal", signal = "SIGINT"); break false }
                _ = term.recv() => { log!(info, "signal", signal = "SIGTERM"); break false }
                _ = detached.notified() => { log!(info, "detached", dirty_blocks = 0u64); break true }
                _ = hup.recv() => {
                    log!(info, "signal", signal = "SIGHUP");
                    self.reload(rt);
                }
            }
        })
    }

    /// `SIGHUP`: serve the exports new in the configuration file.
    fn reload(&mut self, rt: &tokio::runtime::Runtime) {
        let Some(l) = &self.args.loaded else {
            log!(
                warn,
                "reload_skipped",
                reason = "no --config file to reload"
            );
            return;
        };
        sd_notify("RELOADING=1");
        for spec in config_file::reload(l, &self.args, &self.exports.all()) {
            self.add_export(&spec, rt);
            let loaded = self.args.loaded.as_ref().expect("reloading a loaded file");
            if self.specs.iter().any(|x| x.name == spec.name) {
                config_file::added(loaded, &spec.name);
            }
        }
        sd_notify("READY=1");
    }

    /// `SIGHUP` found export `spec` new in the configuration file: open it
    /// and serve it (new connections can list and open it). Refused with a
    /// log line (`export_add_failed`) when it shares a cache or backing file
    /// with an export being served or fails to open; the others keep serving.
    fn add_export(&mut self, spec: &ExportSpec, rt: &tokio::runtime::Runtime) {
        let fail = |error: String| {
            log!(
                error,
                "export_add_failed",
                export = &spec.name,
                error = error
            )
        };
        if let Some(x) = self.specs.iter().find(|x| {
            x.cache == spec.cache || (x.backing == spec.backing && !is_upstream(&spec.backing))
        }) {
            return fail(format!(
                "it shares its cache or backing file with export {:?}",
                x.name
            ));
        }
        // `open_export` blocks on the runtime for an upstream backing store,
        // which only a thread outside the runtime may do.
        let a = &self.args;
        let opened = std::thread::scope(|s| s.spawn(|| open_export(spec, a, rt)).join());
        let e = match opened {
            Ok(Ok(e)) => e,
            Ok(Err(err)) => return fail(crate::errors::chain(&err)),
            Err(_) => return fail("opening it panicked".into()),
        };
        if let Err(err) = self.nbd.add_export(e.clone()) {
            e.host.shutdown(Duration::from_secs(60));
            return fail(err.to_string());
        }
        self.exports.push(e.clone());
        self.specs.push(spec.clone());
        print_export(&e.info);
        log!(
            info,
            "export_added",
            export = &e.info.name,
            size = e.info.size,
            backing = &spec.backing
        );
    }
}

/// Tell systemd (`Type=notify`) about the server's state; see `notify.rs`.
fn sd_notify(state: &str) {
    if let Err(e) = crate::notify::notify(state) {
        log!(warn, "sd_notify_failed", error = e.to_string());
    }
}
