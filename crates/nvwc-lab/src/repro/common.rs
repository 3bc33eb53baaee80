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
        if bytes >= m && bytes.is_multiple_of(m) {
            return format!("{} {unit}", bytes / m);
        }
    }
    format!("{bytes} B")
}

/// `x` with thousands separators (`2,879`).
pub fn thousands(x: u64) -> String {
    let d = x.to_string();
    let mut out = String::new();
    for (i, c) in d.chars().enumerate() {
        if i > 0 && (d.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `lo–hi` of `v` (one value when they are equal), each as `f` writes it;
/// `lo to hi` when `f` writes signs.
pub fn range<T: Copy + PartialOrd>(v: &[T], f: impl Fn(T) -> String) -> String {
    let lo = v.iter().copied().reduce(|a, b| if b < a { b } else { a });
    let hi = v.iter().copied().reduce(|a, b| if b > a { b } else { a });
    match (lo, hi) {
        (Some(lo), Some(hi)) if f(lo) != f(hi) => {
            let (a, b) = (f(lo), f(hi));
            let signed = a.starts_with(['+', '-']);
            format!("{a}{}{b}", if signed { " to " } else { "–" })
        }
        (Some(lo), _) => f(lo),
        _ => "n/a".into(),
    }
}

/// The points of a sweep: `quick`'s few under `--quick`, else `full`.
pub fn quick_or<T: Copy>(quick: bool, few: &[T], full: &[T]) -> Vec<T> {
    if quick { few } else { full }.to_vec()
}

/// A list of items in prose: `a`, `a and b`, `a, b and c`, or `none`.
pub fn listed(v: &[String]) -> String {
    listed_or(v, "none")
}

/// [`listed`], with `none` for an empty list.
pub fn listed_or(v: &[String], none: &str) -> String {
    match v {
        [] => none.into(),
        [a] => a.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::{prose_size, range, thousands};

    #[test]
    fn prose_sizes_use_the_largest_exact_unit() {
        assert_eq!(prose_size(4096), "4 KiB");
        assert_eq!(prose_size(172 << 10), "172 KiB");
        assert_eq!(prose_size(16 << 20), "16 MiB");
        assert_eq!(prose_size(3 << 30), "3 GiB");
        assert_eq!(prose_size(1536), "1536 B");
    }

    #[test]
    fn numbers_and_ranges_read_as_prose() {
        assert_eq!(thousands(2879), "2,879");
        assert_eq!(thousands(100), "100");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(range(&[3u64, 1, 2], |x| x.to_string()), "1–3");
        assert_eq!(range(&[2u64, 2], |x| x.to_string()), "2");
        assert_eq!(range(&[0.999, 1.0], |x| format!("{x:.2}")), "1.00");
        assert_eq!(
            range(&[-6.0, -3.0], |x| format!("{x:+.0} %")),
            "-6 % to -3 %"
        );
        assert_eq!(range::<u64>(&[], |x| x.to_string()), "n/a");
    }
}
