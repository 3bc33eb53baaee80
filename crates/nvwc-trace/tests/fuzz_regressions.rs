//! Replays the trace fuzz targets' saved inputs through the fuzz harness
//! itself (`fuzz/src/trace.rs`, included below): every crash cargo-fuzz
//! ever found (`fuzz/regressions/trace_<format>/`) and the hand-made seeds
//! (`fuzz/seeds/trace_<format>/`). A regression makes the harness panic.

#[path = "../../../fuzz/src/trace.rs"]
#[allow(dead_code)]
mod harness;

use nvwc_trace::Format;
use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// Files under `fuzz/<kind>/<target>/`, sorted (none if the directory is absent).
fn inputs(kind: &str, target: &str) -> Vec<PathBuf> {
    let dir = fuzz_dir().join(kind).join(target);
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|rd| rd.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    v.retain(|p| p.is_file() && !p.file_name().unwrap().to_string_lossy().starts_with('.'));
    v.sort();
    v
}

fn replay(target: &str, format: Option<Format>) -> usize {
    let mut n = 0;
    for kind in ["regressions", "seeds"] {
        for p in inputs(kind, target) {
            let data = std::fs::read(&p).unwrap();
            eprintln!("replaying {}", p.display());
            harness::check_trace(&data, format);
            n += 1;
        }
    }
    n
}

#[test]
fn every_trace_target_replays_its_saved_inputs() {
    let mut targets: Vec<(String, Option<Format>)> = Format::ALL
        .iter()
        .map(|f| (format!("trace_{}", f.name()), Some(*f)))
        .collect();
    targets.push(("trace_detect".into(), None));
    for (t, f) in targets {
        let n = replay(&t, f);
        // Every format has seeds; an empty directory means the layout broke.
        assert!(
            n > 0,
            "no saved inputs for {t} under {}",
            fuzz_dir().display()
        );
    }
}
