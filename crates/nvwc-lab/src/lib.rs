//! The simulator's command line: `nvwc sim`, `nvwc sweep`, `nvwc mrc`,
//! `nvwc trace` and `nvwc repro` (the paper reproductions, whose prose lives
//! in `reports/templates/`). Each subcommand's module exposes its clap
//! arguments and a `run` function; the `nvwc` binary only dispatches.

pub mod mrc;
pub mod repro;
mod runs;
pub mod sim;
pub mod sweep;
pub mod trace;
