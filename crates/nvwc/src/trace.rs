//! `nvwc trace convert` and `nvwc trace stats`: a thin CLI over `nvwc-trace`.

use std::io::BufWriter;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use nvwc_trace::{open_path, Format, ReaderOptions};

/// `nvwc trace ...`
#[derive(clap::Subcommand, Debug)]
pub enum Cmd {
    /// Convert a trace (any readable format) to nvwc's compact binary format.
    Convert {
        /// Input trace.
        input: PathBuf,
        /// Output file (compact format).
        output: PathBuf,
        /// Input format (detected when omitted).
        #[arg(long)]
        format: Option<String>,
    },
    /// Summary statistics of a trace.
    Stats {
        /// The trace.
        trace: PathBuf,
        /// Trace format (detected when omitted).
        #[arg(long)]
        format: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

fn fmt(f: &Option<String>) -> Result<Option<Format>> {
    Ok(f.as_deref().map(|s| s.parse()).transpose()?)
}

/// Runs a `nvwc trace` subcommand.
pub fn run(cmd: Cmd) -> Result<ExitCode> {
    match cmd {
        Cmd::Convert {
            input,
            output,
            format,
        } => {
            let f = std::fs::File::open(&input)
                .with_context(|| format!("opening {}", input.display()))?;
            let out = std::fs::File::create(&output)
                .with_context(|| format!("creating {}", output.display()))?;
            let s = nvwc_trace::convert(
                f,
                fmt(&format)?,
                &input.display().to_string(),
                BufWriter::new(out),
            )?;
            println!(
                "{} ({}) -> {}: {} records, {} skipped, {} timestamps clamped",
                input.display(),
                s.format,
                output.display(),
                s.records,
                s.skipped,
                s.clamped
            );
        }
        Cmd::Stats {
            trace,
            format,
            json,
        } => {
            let r = open_path(&trace, fmt(&format)?, &ReaderOptions::default())?;
            let s = nvwc_trace::stats(r)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                println!("{s}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
