//! What every reproduction shares: the arguments, where the traces are,
//! running a batch of simulations and where the plots go.

use std::path::PathBuf;

use anyhow::{Context, Result};
use nvwc_sim::sweep::Job;
use nvwc_sim::RunResult;

use crate::runs::run_jobs;

/// Arguments of `nvwc repro`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Which reproduction: `stack-model`, `write-policies` or `non-blocking-writes`.
    pub name: String,
    /// Directory with the traces (see shared/traces/MANIFEST.md). Default:
    /// `../shared/traces` from the current directory, else the `shared`
    /// directory beside this source tree.
    #[arg(long)]
    pub traces: Option<PathBuf>,
    /// Where reports go (`<out>/<name>.md`, `<out>/img/`).
    #[arg(long, default_value = "reports")]
    pub out: PathBuf,
    /// Worker threads (default: available cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Smaller runs (for tests): fewer requests and points.
    #[arg(long)]
    pub quick: bool,
    /// `admission`: the application model, `postgres` or `redis`.
    #[arg(long)]
    pub app: Option<String>,
    /// `admission`: also write one JSON object per run here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// `../shared/traces` if it exists here, else the one beside the source tree.
pub fn default_traces() -> PathBuf {
    let rel = PathBuf::from("../shared/traces");
    if rel.is_dir() {
        return rel;
    }
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/traces"
    ))
}

pub fn results(jobs: &[Job], a: &Args) -> Result<Vec<RunResult>> {
    run_jobs(jobs, a.threads, false)
        .into_iter()
        .zip(jobs)
        .map(|(r, j)| {
            r.with_context(|| {
                format!(
                    "run {} {} {}",
                    j.cfg.write_policy, j.cfg.replacement, j.cfg.label
                )
            })
        })
        .collect()
}

pub fn img(a: &Args, name: &str) -> PathBuf {
    a.out.join("img").join(name)
}
/// A size as the reports' prose writes it: whole units, the largest of
/// KiB, MiB and GiB that divides it exactly (`4 KiB`, `172 KiB`, `16 MiB`),
/// else bytes.
pub fn prose_size(bytes: u64) -> String {
    for (unit, m) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
        if bytes >= m && bytes % m == 0 {
            return format!("{} {unit}", bytes / m);
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::prose_size;

    #[test]
    fn prose_sizes_use_the_largest_exact_unit() {
        assert_eq!(prose_size(4096), "4 KiB");
        assert_eq!(prose_size(172 << 10), "172 KiB");
        assert_eq!(prose_size(16 << 20), "16 MiB");
        assert_eq!(prose_size(3 << 30), "3 GiB");
        assert_eq!(prose_size(1536), "1536 B");
    }
}
