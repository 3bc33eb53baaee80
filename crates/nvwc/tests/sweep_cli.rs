//! End-to-end tests of `nvwc sweep` on prefixes of the real traces in
//! `../shared/traces` (or `$NVWC_TRACES`). Without the traces the tests skip,
//! except under CI (`CI=true` or `NVWC_REQUIRE_TOOLS=1`), where they fail.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

mod common;
use common::{nvwc, run_ok};

fn tmpdir(name: &str) -> PathBuf {
    common::tempdir(&format!("sweep-{name}"))
}

/// The shared traces directory, or None (skip) when it is absent outside CI.
fn traces() -> Option<PathBuf> {
    common::traces("cloudPhysicsIO.vscsi")
}

/// `nvwc sweep FLAGS --spec SPEC --out OUT`.
fn sweep(spec: &Path, out: &Path, flags: &[&str]) -> Command {
    let mut c = nvwc();
    c.arg("sweep")
        .args(flags)
        .arg("--spec")
        .arg(spec)
        .arg("--out")
        .arg(out);
    c
}

const THREE: [&str; 3] = [
    "cloudPhysicsIO.vscsi",
    "msr.cut.per_10k.rw_40_60.1370.trace",
    "msr-cambridge1-sample.csv",
];

/// Cell files in `out/cells` (complete ones only: temporaries start with '.').
fn cell_files(out: &Path) -> BTreeMap<String, (Vec<u8>, SystemTime)> {
    let mut m = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir(out.join("cells")) else {
        return m;
    };
    for e in rd {
        let e = e.unwrap();
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with('.') || !n.ends_with(".json") {
            continue;
        }
        let bytes = std::fs::read(e.path()).unwrap();
        let mtime = e.metadata().unwrap().modified().unwrap();
        m.insert(n, (bytes, mtime));
    }
    m
}

fn status_of(bytes: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(bytes).unwrap();
    v["status"].as_str().unwrap().to_string()
}

/// A cell file without its wall-clock fields.
fn without_wall(bytes: &[u8]) -> serde_json::Value {
    let mut v: serde_json::Value = serde_json::from_slice(bytes).unwrap();
    if let Some(r) = v.get_mut("result").and_then(|r| r.as_object_mut()) {
        r.remove("wall_seconds");
        r.remove("replay_rate");
    }
    v
}

fn toml_list(items: &[String]) -> String {
    let q: Vec<String> = items.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", q.join(", "))
}

/// 3 traces x 4 write policies x 3 cache sizes from a TOML spec: every cell
/// completes, with a summary table, a CSV and one plot per trace.
#[test]
fn sweep_three_traces_four_policies_three_sizes() {
    let Some(t) = traces() else { return };
    let out = tmpdir("3x4x3");
    let tr: Vec<String> = THREE
        .iter()
        .map(|n| t.join(n).display().to_string())
        .collect();
    let spec = out.join("spec.toml");
    std::fs::write(
        &spec,
        format!(
            "traces = {}\nwrite_policies = [\"wt\", \"wb\", \"ordered\", \"journaled\"]\ncache_sizes = [\"256k\", \"1M\", \"16M\"]\nlimit = 1500\n",
            toml_list(&tr)
        ),
    )
    .unwrap();
    let res = out.join("res");
    run_ok(&mut sweep(&spec, &res, &["--quiet"]));
    let files = cell_files(&res);
    assert_eq!(files.len(), 36);
    for (n, (b, _)) in &files {
        assert_eq!(status_of(b), "ok", "{n}");
    }
    let md = std::fs::read_to_string(res.join("summary.md")).unwrap();
    assert!(md.contains("36 cells: 36 complete, 0 failed"), "{md}");
    assert_eq!(md.lines().filter(|l| l.starts_with("| ")).count(), 37);
    let csv = std::fs::read_to_string(res.join("summary.csv")).unwrap();
    assert_eq!(csv.lines().count(), 37);
    for n in THREE {
        let p = res.join("plots").join(format!("{n}.svg"));
        assert!(
            std::fs::metadata(&p).unwrap().len() > 1000,
            "{}",
            p.display()
        );
    }
    // --list shows every cell done.
    let o = sweep(&spec, &res, &[]).arg("--list").output().unwrap();
    let lines: Vec<serde_json::Value> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 36);
    assert!(lines.iter().all(|l| l["done"] == true));
}

/// Kill -9 a sweep halfway; the re-run runs exactly the missing cells and
/// leaves the complete ones untouched.
#[test]
fn sweep_resumes_after_kill() {
    let Some(t) = traces() else { return };
    let out = tmpdir("resume");
    let args = |c: &mut Command| {
        c.args(["sweep", "--trace"])
            .arg(t.join("cloudPhysicsIO.vscsi"))
            .args([
                "--write-policy",
                "wt,wb,ordered,journaled",
                "--cache-size",
                "256k,1M,16M",
                "--limit",
                "20000",
                "--out",
            ])
            .arg(&out);
    };
    let mut c = nvwc();
    args(&mut c);
    let mut child = c
        .args(["--quiet", "--threads", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while cell_files(&out).len() < 3 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "sweep finished before it could be killed"
        );
        assert!(start.elapsed() < Duration::from_secs(300), "no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let before = cell_files(&out);
    let k = before.len();
    assert!((3..12).contains(&k), "{k} cells complete at the kill");
    // Every file that exists is complete (written to a temporary, renamed).
    for (n, (b, _)) in &before {
        assert_eq!(status_of(b), "ok", "{n}");
    }
    // The re-run (not quiet: it says what it skips) runs the missing cells only.
    let rerun = || {
        let mut c = nvwc();
        args(&mut c);
        let o = run_ok(c.arg("--threads").arg("2"));
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let err = rerun();
    let want = format!("sweep: 12 cells, {k} already complete, running {}", 12 - k);
    assert!(err.contains(&want), "{err}");
    let after = cell_files(&out);
    assert_eq!(after.len(), 12);
    for (n, (b, m)) in &before {
        let (b2, m2) = &after[n];
        assert_eq!(b, b2, "{n} was rewritten");
        assert_eq!(m, m2, "{n} was rewritten");
    }
    for (n, (b, _)) in &after {
        assert_eq!(status_of(b), "ok", "{n}");
    }
    let err = rerun();
    assert!(
        err.contains("sweep: 12 cells, 12 already complete, running 0"),
        "{err}"
    );
    assert_eq!(cell_files(&out), after);
}

/// A missing trace, an unknown write policy and a bad size fail their own
/// cells with the error recorded; the other cells complete; exit status 1.
#[test]
fn sweep_bad_cells_fail_alone() {
    let Some(t) = traces() else { return };
    let out = tmpdir("bad");
    let o = nvwc()
        .args(["sweep", "--quiet", "--trace"])
        .arg(format!(
            "{},{}",
            t.join("msr.cut.per_10k.rw_40_60.1370.trace").display(),
            t.join("no-such-trace.csv").display()
        ))
        .args([
            "--write-policy",
            "wb,nonsense",
            "--cache-size",
            "1M,lots",
            "--limit",
            "500",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let files = cell_files(&out);
    assert_eq!(files.len(), 8);
    let mut ok = 0;
    for (n, (b, _)) in &files {
        let v: serde_json::Value = serde_json::from_slice(b).unwrap();
        let e = v["error"].as_str().unwrap_or("");
        if n.starts_with("msr.cut") && n.contains("-wb-") && n.contains("-1M-") {
            assert_eq!(v["status"], "ok", "{n}: {e}");
            ok += 1;
        } else {
            assert_eq!(v["status"], "failed", "{n}");
            assert!(
                e.contains("not found") || e.contains("nonsense") || e.contains("lots"),
                "{n}: {e}"
            );
        }
    }
    assert_eq!(ok, 1);
    let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(md.contains("8 cells: 1 complete, 7 failed"), "{md}");
    assert!(md.contains("no-such-trace.csv not found"), "{md}");
}

/// `--cell ID` (what the Ray driver runs) writes the same file as the whole
/// sweep, up to the wall-clock fields.
#[test]
fn sweep_single_cells_match_the_whole_sweep() {
    let Some(t) = traces() else { return };
    let out = tmpdir("cells");
    let spec = out.join("spec.json");
    std::fs::write(
        &spec,
        serde_json::json!({
            "traces": [t.join("msr.cut.per_10k.rw_40_60.1370.trace")],
            "write_policies": ["wt", "journaled"],
            "replacements": ["lru", "arc"],
            "cache_sizes": ["512k"],
            "fetch": ["blocking", "lazy"],
            "admission": ["all", "sync"],
            "limit": 2000
        })
        .to_string(),
    )
    .unwrap();
    let (a, b) = (out.join("a"), out.join("b"));
    let st = sweep(&spec, &a, &["--quiet"]).status().unwrap();
    assert!(st.success());
    let o = sweep(&spec, &b, &["--list"]).output().unwrap();
    let ids: Vec<String> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            assert_eq!(v["done"], false);
            v["id"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(ids.len(), 16);
    for id in &ids {
        let st = sweep(&spec, &b, &["--quiet", "--threads", "1"])
            .args(["--cell", id])
            .status()
            .unwrap();
        assert!(st.success(), "{id}");
    }
    let (fa, fb) = (cell_files(&a), cell_files(&b));
    assert_eq!(fa.len(), 16);
    assert_eq!(fa.keys().collect::<Vec<_>>(), fb.keys().collect::<Vec<_>>());
    for (n, (x, _)) in &fa {
        assert_eq!(without_wall(x), without_wall(&fb[n].0), "{n}");
    }
}

/// `nvwc sim --repeat N` replays exactly what `nvwc trace convert --repeat N`
/// writes (every field but the trace name and wall-clock fields), in closed
/// and open loop, and its peak RSS does not grow with N.
#[test]
fn sim_repeat_matches_converted_trace_with_flat_memory() {
    let Some(t) = traces() else { return };
    let out = tmpdir("repeat");
    let trace = t.join("msr.cut.per_10k.rw_40_60.1370.trace");
    let conv = out.join("x3.nvwc");
    let st = nvwc()
        .args(["trace", "convert", "--repeat", "3"])
        .arg(&trace)
        .arg(&conv)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    let sim = |path: &Path, extra: &[&str], json: &Path| -> String {
        let o = run_ok(
            nvwc()
                .args(["sim", "--quiet", "--print-peak-rss", "--threads", "1"])
                .args(["--write-policy", "wb,journaled", "--cache-size", "1M"])
                .arg("--trace")
                .arg(path)
                .args(extra)
                .arg("--json")
                .arg(json),
        );
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let load = |p: &Path| -> Vec<serde_json::Value> {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let mut r = r.clone();
                let m = r.as_object_mut().unwrap();
                for k in ["wall_seconds", "replay_rate", "trace"] {
                    m.remove(k);
                }
                r
            })
            .collect()
    };
    for mode in [
        &["--mode", "closed"][..],
        &["--mode", "open", "--speedup", "5"],
    ] {
        let (a, b) = (out.join("conv.json"), out.join("rep.json"));
        sim(&conv, mode, &a);
        let mut args = mode.to_vec();
        args.extend(["--repeat", "3"]);
        sim(&trace, &args, &b);
        let (ra, rb) = (load(&a), load(&b));
        assert_eq!(ra.len(), 2);
        assert_eq!(ra[0]["requests"], 30000);
        assert_eq!(ra, rb, "{mode:?}");
    }
    let rss = |n: &str| -> u64 {
        let err = sim(&trace, &["--repeat", n], &out.join("rss.json"));
        err.lines()
            .find_map(|l| l.strip_prefix("peak_rss_kib "))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let (one, many) = (rss("1"), rss("20"));
    assert!(one > 0);
    assert!(
        many < one + 4096,
        "peak RSS {one} KiB for 1 pass vs {many} KiB for 20 passes"
    );
}
