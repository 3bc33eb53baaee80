//! `nvwc repro`: reproductions of the papers' experiments with our traces.
//!
//! * `stack-model`: Pâris, Haining & Long (2000), Table 1 and Figure 2.
//! * `write-policies`: Koller et al. (FAST'13), Figures 12, 13, 14 and §5.4.
//!
//! Each writes `reports/<name>.md` and its plots under `reports/img/`. All
//! numbers come from simulation runs (`nvwc_sim`); nothing is fitted. The
//! scaling rules (cache sizes relative to each trace's working set) are
//! stated in the reports.

mod admission;
mod admission_claims;
mod admission_timeline;
mod common;
mod non_blocking_writes;
mod non_blocking_writes_claims;
mod stack_model;
mod stack_model_claims;
mod stack_model_sensitivity;
mod template;
mod verdict;
mod write_policies;
mod write_policies_claims;
mod write_policies_disk;
mod write_policies_notes;
mod write_policies_parallel;

use std::process::ExitCode;

use anyhow::{bail, Context, Result};

pub use common::{default_traces, Args};

/// `nvwc repro`.
pub fn run(mut a: Args) -> Result<ExitCode> {
    if a.traces.is_none() {
        a.traces = Some(default_traces());
    }
    let traces = a.traces.clone().expect("set");
    // The admission reproduction runs application models, not traces.
    if a.name != "admission" && !traces.is_dir() {
        bail!(
            "trace directory {} not found (give --traces DIR)",
            traces.display()
        );
    }
    std::fs::create_dir_all(a.out.join("img"))?;
    let t0 = std::time::Instant::now();
    let md = match a.name.as_str() {
        "stack-model" => stack_model::stack_model(&a)?,
        "write-policies" => write_policies::write_policies(&a)?,
        "non-blocking-writes" => non_blocking_writes::non_blocking_writes(&a)?,
        "admission" => admission::admission(&a)?,
        other => bail!(
            "unknown reproduction {other:?} (stack-model, write-policies, non-blocking-writes, admission)"
        ),
    };
    let md = md.replace(
        "@WALL@",
        &format!(
            "{:.0} s on this machine ({} threads)",
            t0.elapsed().as_secs_f64(),
            a.threads.unwrap_or_else(nvwc_sim::sweep::default_threads)
        ),
    );
    let path = a.out.join(format!("{}.md", a.name));
    std::fs::write(&path, md).with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(ExitCode::SUCCESS)
}
