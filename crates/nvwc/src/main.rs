//! `nvwc`: the command-line front end.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

mod docs;
mod vopr;

use nvwc_harness::{crashtest, grid, loadtest};
use nvwc_lab::{mrc, repro, sim, sweep, trace};
use nvwc_server::{self as serve, errors, status};

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

/// Parsed once per run, so the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Cmd {
    /// Serve a backing store through a persistent write cache over NBD.
    Serve(serve::Args),
    /// Print a running server's state: a table on a terminal, else JSON (`--json`).
    Status(status::StatusArgs),
    /// Mark a connection's requests critical (or not) for `--admission`.
    Hint(serve::HintArgs),
    /// Write back everything dirty on a running server (it keeps serving).
    Flush(serve::CtlArgs),
    /// Write back everything dirty, then stop the server: the backing store is complete on its own.
    Detach(serve::CtlArgs),
    /// Make a backing store consistent alone (after losing the cache device).
    Recover(serve::RecoverArgs),
    /// Start a cache device over: erase it so that the next `nvwc serve` formats it.
    Format(serve::format::FormatArgs),
    /// Deterministic simulation testing of the engine under crashes.
    Vopr(vopr::Args),
    /// Trace-driven simulation: sweep write policies, replacement policies and cache sizes.
    Sim(sim::Args),
    /// Resumable sweep (traces x policies x sizes x devices x fetch x admission), one result file per cell.
    Sweep(sweep::Args),
    /// Miss-ratio curve of a trace, with its knees.
    Mrc(mrc::Args),
    /// Trace conversion and statistics.
    #[command(subcommand)]
    Trace(trace::Cmd),
    /// Time-bounded NBD load test with data verification (see `loadtest.rs`).
    Loadtest(loadtest::Args),
    /// Crash the live server (kill -9, host crash, failpoints) and check what survives.
    Crashtest(crashtest::Args),
    /// Measure the consistency grid (write policies x failure modes; the write-policy paper's Figure 10).
    Grid(grid::Args),
    /// Reproduce a paper's experiments (writes reports/<name>.md).
    Repro(repro::Args),
    /// Check a configuration file for `nvwc serve --config` (errors name the line).
    CheckConfig(serve::config_file::CheckArgs),
    /// Print a shell completion script (bash, zsh, fish, ...) on stdout.
    Completions(docs::CompletionArgs),
    /// Write the man pages (docs/man/).
    #[command(hide = true)]
    Man(docs::ManArgs),
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let r = match cli.cmd {
        Cmd::Serve(a) => {
            let m = matches.subcommand_matches("serve").expect("serve");
            serve::config_file::serve(a, m)
        }
        Cmd::Recover(a) => serve::recover(a),
        Cmd::Format(a) => serve::format::run(a),
        Cmd::Status(a) => status::run(a),
        Cmd::Hint(a) => serve::hint(a),
        Cmd::Flush(a) => serve::control("flush", a),
        Cmd::Detach(a) => serve::control("detach", a),
        Cmd::Vopr(a) => vopr::run(a),
        Cmd::Sim(a) => sim::run(a),
        Cmd::Sweep(a) => sweep::run(a),
        Cmd::Mrc(a) => mrc::run(a),
        Cmd::Trace(c) => trace::run(c),
        Cmd::Repro(a) => repro::run(a),
        Cmd::Loadtest(a) => loadtest::run(a),
        Cmd::Crashtest(a) => crashtest::run(a),
        Cmd::Grid(a) => grid::run(a),
        Cmd::CheckConfig(a) => serve::config_file::check_config(a),
        Cmd::Completions(a) => docs::completions(Cli::command(), a),
        Cmd::Man(a) => docs::write_man(Cli::command(), a),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("nvwc: error: {}", errors::chain(&e));
            ExitCode::from(2)
        }
    }
}
