//! The control socket (`--control`): one command per line (`status`,
//! `flush`, `detach`, `hint`), one JSON line back ([`control_loop`]); and its
//! client side, `nvwc flush`, `nvwc detach`, `nvwc hint` ([`ask`]).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::{bail, Context, Result};

use crate::connections::Conns;
use crate::export::NvwcExport;
use crate::log::log;
use crate::metrics::{json_string, stats_pairs};
use crate::server::ExportList;

/// `nvwc status`: `{"exports":[{"name":...,"export_size":...,"description":...,"stats":{...},"policy":{...}},...]}`.
pub(crate) fn status_json(exports: &[Arc<NvwcExport>], conns: &Conns) -> String {
    let items: Vec<String> = exports
        .iter()
        .map(|e| {
            let (st, pc) = e.host.status();
            let kv = |v: &[(&str, u64)]| {
                v.iter()
                    .map(|(k, v)| format!("\"{k}\":{v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            };
            format!(
                "{{\"name\":{},\"export_size\":{},\"description\":{},\"critical\":{},\"stats\":{{{}}},\"policy\":{{{}}}}}",
                json_string(&e.info.name),
                e.info.size,
                json_string(&e.info.description),
                e.critical.load(Ordering::Relaxed),
                kv(&stats_pairs(&st)),
                kv(&pc)
            )
        })
        .collect();
    let cs: Vec<String> = conns
        .lock()
        .unwrap()
        .iter()
        .map(|(id, (peer, export))| {
            let critical = export.as_ref().is_some_and(|x| {
                exports.iter().any(|e| {
                    &e.info.name == x
                        && (e.critical.load(Ordering::Relaxed)
                            || e.hints.lock().unwrap().contains(id))
                })
            });
            format!(
                "{{\"id\":{id},\"peer\":{},\"export\":{},\"critical\":{critical}}}",
                json_string(peer),
                export.as_deref().map_or("null".to_string(), json_string)
            )
        })
        .collect();
    format!(
        "{{\"exports\":[{}],\"connections\":[{}]}}",
        items.join(","),
        cs.join(",")
    )
}

/// Bind the control socket at `path`, creating its directory if missing
/// (a server whose cache and backing store live elsewhere need not have a
/// `nvwc-data/`). A socket that cannot be bound MUST stop the server at
/// start with this error: served without one, `nvwc status`, `flush` and
/// `detach` would only say that no server is running.
pub(crate) fn bind_control(path: &Path) -> Result<tokio::net::UnixListener> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| {
            format!(
                "control socket {}: creating its directory (choose another with --control PATH)",
                path.display()
            )
        })?;
    }
    let _ = std::fs::remove_file(path);
    tokio::net::UnixListener::bind(path).with_context(|| {
        format!(
            "control socket {} (choose another with --control PATH)",
            path.display()
        )
    })
}

/// Serve the control socket `l` ([`bind_control`]): one command per line
/// (`status`, `flush`, `detach`), one JSON line back. `flush` and `detach`
/// cover every export.
pub(crate) async fn control_loop(
    l: tokio::net::UnixListener,
    exports: Arc<ExportList>,
    stop: Arc<tokio::sync::Notify>,
    conns: Conns,
) -> Result<()> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    loop {
        let (conn, _) = l.accept().await?;
        let (exports, stop, conns) = (exports.all(), stop.clone(), conns.clone());
        tokio::spawn(async move {
            let (r, mut w) = conn.into_split();
            let mut line = String::new();
            if BufReader::new(r).read_line(&mut line).await.is_err() {
                return;
            }
            let reply = match line.trim() {
                "status" => status_json(&exports, &conns),
                l if l.starts_with("hint ") => control_hint(&l[5..], &exports, &conns),
                cmd @ ("flush" | "detach") => {
                    log!(info, "control", command = cmd);
                    let (mut dirty, mut destaged, mut err) = (0, 0, false);
                    for e in exports.iter() {
                        match e.host.drain(cmd == "detach").await {
                            Some(st) => {
                                dirty += st.dirty_blocks;
                                destaged += st.destaged_blocks;
                            }
                            None => err = true,
                        }
                    }
                    if err {
                        "{\"error\":\"engine stopped\"}".to_string()
                    } else {
                        if cmd == "detach" {
                            stop.notify_one();
                        }
                        format!("{{\"ok\":true,\"command\":\"{cmd}\",\"dirty_blocks\":{dirty},\"destaged_blocks\":{destaged}}}")
                    }
                }
                other => {
                    format!(
                        "{{\"error\":\"unknown command {other:?} (status, flush, detach, hint)\"}}"
                    )
                }
            };
            let _ = w.write_all(format!("{reply}\n").as_bytes()).await;
        });
    }
}

/// `hint CONN on|off [EXPORT]` on the control socket.
fn control_hint(args: &str, exports: &[Arc<NvwcExport>], conns: &Conns) -> String {
    let mut it = args.splitn(3, ' ');
    let (Some(conn), Some(onoff)) = (it.next(), it.next()) else {
        return "{\"error\":\"usage: hint CONNECTION on|off [EXPORT]\"}".into();
    };
    let Ok(conn) = conn.parse::<u64>() else {
        return format!(
            "{{\"error\":{}}}",
            json_string(&format!("bad connection id {conn:?}"))
        );
    };
    let on = match onoff {
        "on" => true,
        "off" => false,
        x => {
            return format!(
                "{{\"error\":{}}}",
                json_string(&format!("expected on or off, got {x:?}"))
            )
        }
    };
    let want = it.next();
    let Some(export) = conns.lock().unwrap().get(&conn).and_then(|c| c.1.clone()) else {
        return format!("{{\"error\":\"no connection {conn} in transmission (see nvwc status)\"}}");
    };
    if want.is_some_and(|w| w != export) {
        return format!(
            "{{\"error\":{}}}",
            json_string(&format!(
                "connection {conn} is on export {export:?}, not {:?}",
                want.unwrap()
            ))
        );
    }
    let Some(e) = exports.iter().find(|e| e.info.name == export) else {
        return "{\"error\":\"export gone\"}".into();
    };
    e.set_hint(conn, on);
    log!(
        info,
        "hint",
        connection = conn,
        export = &export,
        critical = on
    );
    format!(
        "{{\"ok\":true,\"connection\":{conn},\"export\":{},\"critical\":{on}}}",
        json_string(&export)
    )
}

/// `nvwc hint`: mark a connection's requests critical (or not) for admission.
#[derive(clap::Args, Debug)]
pub struct HintArgs {
    /// The connection id (`nvwc status` lists them under "connections").
    #[arg(long)]
    connection: u64,
    /// `on` or `off`.
    #[arg(long)]
    critical: String,
    /// Check that the connection is on this export.
    #[arg(long)]
    export: Option<String>,
    #[command(flatten)]
    ctl: CtlArgs,
}

pub fn hint(a: HintArgs) -> Result<std::process::ExitCode> {
    if a.critical != "on" && a.critical != "off" {
        bail!("--critical must be on or off, not {:?}", a.critical);
    }
    let mut cmd = format!("hint {} {}", a.connection, a.critical);
    if let Some(e) = &a.export {
        cmd += &format!(" {e}");
    }
    control(&cmd, a.ctl)
}

/// `nvwc status`, `nvwc flush`, `nvwc detach`: talk to a running server's control socket.
#[derive(clap::Args, Debug)]
pub struct CtlArgs {
    /// The server's control socket.
    #[arg(long, default_value = "nvwc-data/nvwc.ctl")]
    control: PathBuf,
}

pub fn control(cmd: &str, a: CtlArgs) -> Result<std::process::ExitCode> {
    let line = ask(cmd, &a)?;
    print!("{line}");
    Ok(if line.contains("\"error\"") {
        std::process::ExitCode::from(1)
    } else {
        std::process::ExitCode::SUCCESS
    })
}

/// Send `cmd` to a running server's control socket: its one-line answer.
pub fn ask(cmd: &str, a: &CtlArgs) -> Result<String> {
    use std::io::BufRead;
    let mut s = std::os::unix::net::UnixStream::connect(&a.control).with_context(|| {
        format!(
            "connecting to {} (is `nvwc serve` running?)",
            a.control.display()
        )
    })?;
    s.write_all(format!("{cmd}\n").as_bytes())?;
    let mut line = String::new();
    std::io::BufReader::new(s).read_line(&mut line)?;
    Ok(line)
}
