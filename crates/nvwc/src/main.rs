//! `nvwc`: the command-line front end.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod serve;
mod vopr;

#[derive(Parser)]
#[command(
    name = "nvwc",
    version,
    about = "A non-volatile write cache for block storage"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve a backing store through a persistent write cache over NBD.
    Serve(serve::Args),
    /// Make a backing store consistent alone (after losing the cache device).
    Recover(serve::RecoverArgs),
    /// Deterministic simulation testing of the engine under crashes.
    Vopr(vopr::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Serve(a) => serve::run(a),
        Cmd::Recover(a) => serve::recover(a),
        Cmd::Vopr(a) => vopr::run(a),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("nvwc: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
