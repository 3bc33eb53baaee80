//! Parallel sweeps: many independent runs, one per thread at a time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::addr::TracePlan;
use crate::driver::{run_plan, SimConfig};
use crate::metrics::RunResult;
use crate::SimError;

/// One run of a sweep.
#[derive(Clone, Debug)]
pub struct Job {
    /// Its configuration.
    pub cfg: SimConfig,
    /// The trace plan (shared between jobs over the same trace).
    pub plan: Arc<TracePlan>,
    /// Replay at most this many records.
    pub limit: Option<u64>,
}

/// Runs `jobs` on `threads` worker threads (at least 1), each thread taking
/// the next job when it finishes one. Returns the results in job order.
/// `on_done(index, result)` is called from the worker thread as each run ends
/// (for progress bars). A run's error does not stop the others.
pub fn run_parallel<F>(jobs: &[Job], threads: usize, on_done: F) -> Vec<Result<RunResult, SimError>>
where
    F: Fn(usize, &Result<RunResult, SimError>) + Sync,
{
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<Result<RunResult, SimError>>>> =
        Mutex::new((0..jobs.len()).map(|_| None).collect());
    let threads = threads.clamp(1, jobs.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs.len() {
                    break;
                }
                let j = &jobs[i];
                let r = run_plan(&j.cfg, &j.plan, j.limit);
                on_done(i, &r);
                out.lock().expect("results lock")[i] = Some(r);
            });
        }
    });
    out.into_inner()
        .expect("results lock")
        .into_iter()
        .map(|r| r.expect("every job ran"))
        .collect()
}

/// Default worker count: the machine's available parallelism.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}
