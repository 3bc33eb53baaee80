//! Serve a sparse in-memory export over NBD until Ctrl-C.
//!
//! ```text
//! cargo run -p nvwc-nbd --example memserver -- --unix /tmp/nbd.sock --size 64M
//! cargo run -p nvwc-nbd --example memserver -- --tcp 127.0.0.1:10809 --name disk --read-only
//! nbdinfo 'nbd+unix:///?socket=/tmp/nbd.sock'
//! ```

use std::sync::Arc;

use nvwc_nbd::{ExportInfo, MemoryExport, Server};

use nvwc_core::units::parse_size;

const USAGE: &str = "usage: memserver [--unix PATH] [--tcp ADDR] [--name NAME] [--size N[K|M|G]] \
                     [--read-only] [--min-block N] [--max-block N]";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut unix = None;
    let mut tcp = None;
    let mut info = ExportInfo::new("", 64 << 20).with_all_features();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value\n{USAGE}"));
        match a.as_str() {
            "--unix" => unix = Some(val()?),
            "--tcp" => tcp = Some(val()?),
            "--name" => info.name = val()?,
            "--size" => info.size = parse_size(&val()?)?,
            "--min-block" => info.min_block = parse_size(&val()?)? as u32,
            "--max-block" => info.max_block = parse_size(&val()?)? as u32,
            "--read-only" => info.read_only = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            _ => return Err(format!("unknown argument {a}\n{USAGE}").into()),
        }
    }
    if unix.is_none() && tcp.is_none() {
        tcp = Some(nvwc_nbd::server::DEFAULT_TCP_ADDR.to_string());
    }
    let server = Server::builder()
        .export(Arc::new(MemoryExport::new(info.clone())))
        .build()?;
    if let Some(p) = &unix {
        server.listen_unix(p).await?;
        eprintln!(
            "serving {:?} ({} bytes) on unix socket {p}",
            info.name, info.size
        );
    }
    if let Some(a) = &tcp {
        let addr = server.listen_tcp(a.as_str()).await?;
        eprintln!(
            "serving {:?} ({} bytes) on tcp {addr}",
            info.name, info.size
        );
    }
    tokio::signal::ctrl_c().await?;
    eprintln!("shutting down");
    server.shutdown().await;
    Ok(())
}
