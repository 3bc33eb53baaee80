//! `nvwc trace convert` and `nvwc trace stats`: a thin CLI over `nvwc-trace`.

use std::io::BufWriter;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use nvwc_trace::{open_path, Format, ReaderOptions};

/// `nvwc trace ...`
#[derive(clap::Subcommand, Debug)]
pub enum Cmd {
    /// Convert a trace (any readable format) to nvwc's compact binary format,
    /// or to libCacheSim's `oracleGeneral` (one record per cache block touched).
    Convert {
        /// Input trace.
        input: PathBuf,
        /// Output file.
        output: PathBuf,
        /// Input format (detected when omitted).
        #[arg(long)]
        format: Option<String>,
        /// Output format: `compact` (nvwc's) or `oracle-general` (libCacheSim's
        /// binary format: every read and write split into `--block-size`
        /// blocks, object id `dev << 44 | block`; flushes and trims dropped).
        #[arg(long, default_value = "compact")]
        to: String,
        /// Block size for `--to oracle-general`.
        #[arg(long, default_value = "4k")]
        block_size: String,
        /// Write the trace this many times in a row (timestamps continue,
        /// addresses repeat): a longer trace with the same footprint, for
        /// speed and memory measurements.
        #[arg(long, default_value_t = 1)]
        repeat: u32,
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
            to,
            block_size,
            repeat,
        } if to != "compact" || repeat != 1 => {
            if repeat == 0 {
                anyhow::bail!("--repeat must be at least 1");
            }
            let fmt = fmt(&format)?;
            let out = std::fs::File::create(&output)
                .with_context(|| format!("creating {}", output.display()))?;
            let records = Repeat::new(input.clone(), fmt, repeat);
            match to.as_str() {
                "oracle-general" => {
                    let bs = nvwc_sim::parse_size(&block_size).map_err(|e| anyhow::anyhow!(e))?;
                    if bs == 0 || bs > u64::from(u32::MAX) {
                        anyhow::bail!("bad --block-size {block_size}");
                    }
                    let s = nvwc_trace::write_oracle_general(records, bs, BufWriter::new(out))?;
                    println!(
                        "{} x{repeat} -> {} (oracleGeneral, {bs}-byte blocks): {} requests, {} records, {} flushes/trims dropped",
                        input.display(),
                        output.display(),
                        s.requests,
                        s.records,
                        s.dropped
                    );
                }
                "compact" => {
                    let n = nvwc_trace::write_compact(records, fmt, BufWriter::new(out))?;
                    println!(
                        "{} x{repeat} -> {}: {n} records",
                        input.display(),
                        output.display()
                    );
                }
                t => anyhow::bail!("unknown output format {t:?} (compact, oracle-general)"),
            }
        }
        Cmd::Convert {
            input,
            output,
            format,
            ..
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

/// The records of a trace `n` times in a row: each pass's timestamps start
/// 1 ms after the previous pass's last one. Malformed records are skipped
/// (the reader's default), fatal errors end the stream.
struct Repeat {
    path: PathBuf,
    format: Option<Format>,
    left: u32,
    cur: Option<nvwc_trace::TraceReader<'static>>,
    base_ns: u64,
    last_ns: u64,
}

impl Repeat {
    fn new(path: PathBuf, format: Option<Format>, n: u32) -> Self {
        Repeat {
            path,
            format,
            left: n,
            cur: None,
            base_ns: 0,
            last_ns: 0,
        }
    }
}

impl Iterator for Repeat {
    type Item = Result<nvwc_trace::TraceRecord, nvwc_trace::TraceError>;
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.cur.is_none() {
                if self.left == 0 {
                    return None;
                }
                self.left -= 1;
                match open_path(&self.path, self.format, &ReaderOptions::default()) {
                    Ok(r) => self.cur = Some(r),
                    Err(e) => {
                        self.left = 0;
                        return Some(Err(e));
                    }
                }
            }
            match self.cur.as_mut().expect("open").next() {
                Some(Ok(mut r)) => {
                    r.ts_ns += self.base_ns;
                    self.last_ns = r.ts_ns;
                    return Some(Ok(r));
                }
                Some(Err(e)) if e.is_fatal() => {
                    self.left = 0;
                    self.cur = None;
                    return Some(Err(e));
                }
                Some(Err(_)) => {}
                None => {
                    self.cur = None;
                    self.base_ns = self.last_ns + 1_000_000;
                }
            }
        }
    }
}
