//! `nvwc`: the command-line front end.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    /// Deterministic simulation testing of the engine under crashes.
    Vopr(vopr::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
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
