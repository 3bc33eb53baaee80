//! End-to-end tests of `nvwc sim`, `nvwc mrc` and `nvwc trace` on small generated traces.

use std::path::Path;

mod common;
use common::{nvwc, run_ok};

fn tmpdir(name: &str) -> std::path::PathBuf {
    common::tempdir(&format!("sim-cli-{name}"))
}

/// `nvwc trace stats --json PATH`'s request count.
fn trace_requests(path: &Path) -> u64 {
    let out = run_ok(nvwc().args(["trace", "stats", "--json"]).arg(path));
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    s["requests"].as_u64().unwrap()
}

/// `nvwc trace convert EXTRA.. FROM TO`.
fn convert(extra: &[&str], from: &Path, to: &Path) {
    run_ok(
        nvwc()
            .args(["trace", "convert"])
            .args(extra)
            .arg(from)
            .arg(to),
    );
}

/// The JSON document in `path`.
fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// A Heimdall-format trace (`ts_ms dev offset size op`, op 0 = write, 1 = read)
/// of `n` requests over `span_blocks` 4 KiB blocks with a hot spot; deterministic.
fn write_trace(path: &Path, n: u64, span_blocks: u64) {
    let mut rng = nvwc_dev::rng::Rng::new(0x9E37_79B9_7F4A_7C15);
    let mut s = String::with_capacity(n as usize * 32);
    for i in 0..n {
        let x = rng.next_u64();
        let hot = x % 10 < 7;
        let block = if hot {
            (x >> 8) % (span_blocks / 16).max(1)
        } else {
            (x >> 8) % span_blocks
        };
        let len = 4096 * (1 + (x >> 40) % 4);
        let op = if (x >> 20) % 10 < 6 { 0 } else { 1 };
        s.push_str(&format!(
            "{}.{:03} 0 {} {} {}\n",
            i / 10,
            i % 10,
            block * 4096,
            len,
            op
        ));
    }
    std::fs::write(path, s).unwrap();
}

/// A fresh directory `name` with [`write_trace`]'s `t.trace` of `n` requests.
fn dir_with_trace(
    name: &str,
    n: u64,
    span_blocks: u64,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let d = tmpdir(name);
    let trace = d.join("t.trace");
    write_trace(&trace, n, span_blocks);
    (d, trace)
}

const KEYS: &[&str] = &[
    "trace",
    "write_policy",
    "replacement",
    "cache_size_bytes",
    "requests",
    "reads",
    "writes",
    "read_hits",
    "write_hits",
    "overwrites",
    "backing_writes",
    "backing_write_bytes",
    "stalled_writes",
    "stall_time_us",
    "sim_time_us",
    "throughput_iops",
    "latency_us_p50",
    "latency_us_p99",
    "wall_seconds",
    "write_amplification",
    "backing_write_runs",
    "run_length_histogram",
    "dirty_bytes_end",
    "uncheckpointed_txns",
];

#[test]
fn sim_sweep_writes_valid_json_csv_and_plot() {
    let (d, trace) = dir_with_trace("sweep", 3000, 4096);
    let json = d.join("out.json");
    let csv = d.join("out.csv");
    let svg = d.join("out.svg");
    run_ok(
        nvwc()
            .args(["sim", "--trace"])
            .arg(&trace)
            .args([
                "--format",
                "heimdall",
                "--write-policy",
                "wt,wb,journaled",
                "--replacement",
                "lru,stack:knee=64",
                "--cache-size",
                "256k,2M",
                "--backing",
                "ssd-sata",
                "--qd",
                "4",
                "--threads",
                "2",
                "--interval",
                "0.01",
                "--json",
            ])
            .arg(&json)
            .arg("--csv")
            .arg(&csv)
            .arg("--plot")
            .arg(&svg),
    );
    let v = read_json(&json);
    let runs = v.as_array().expect("a JSON array");
    assert_eq!(runs.len(), 3 * 2 * 2);
    for r in runs {
        for k in KEYS {
            assert!(r.get(*k).is_some(), "key {k} missing in {r}");
        }
        assert_eq!(r["requests"].as_u64().unwrap(), 3000);
        assert_eq!(r["errors"].as_u64().unwrap(), 0);
        assert!(r["throughput_iops"].as_f64().unwrap() > 0.0);
        assert!(r["latency_us_p99"].as_f64().unwrap() >= r["latency_us_p50"].as_f64().unwrap());
        assert!(!r["intervals"].as_array().unwrap().is_empty());
        let journaled = r["write_policy"] == "journaled";
        assert_eq!(r["uncheckpointed_txns"].is_null(), !journaled);
    }
    // Write-through writes every client byte; a 2M write-back cache absorbs overwrites.
    let find = |p: &str, c: u64| {
        runs.iter()
            .find(|r| {
                r["write_policy"] == p && r["cache_size_bytes"] == c && r["replacement"] == "lru"
            })
            .unwrap()
    };
    let wt = find("write-through", 2 << 20);
    assert_eq!(wt["backing_write_bytes"], wt["client_write_bytes"]);
    let wb = find("write-back", 2 << 20);
    assert!(wb["overwrites"].as_u64().unwrap() > 0);
    assert!(
        wb["backing_write_bytes"].as_u64().unwrap() < wt["backing_write_bytes"].as_u64().unwrap()
    );
    let csv = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(csv.lines().count(), 13);
    assert!(csv.lines().next().unwrap().contains("throughput_iops"));
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.contains("<svg") && svg.contains("Throughput"));
}

#[test]
fn mrc_and_trace_commands() {
    let (d, trace) = dir_with_trace("mrc", 4000, 2048);
    let json = d.join("mrc.json");
    run_ok(
        nvwc()
            .args(["mrc", "--format", "heimdall", "--trace"])
            .arg(&trace)
            .arg("--json")
            .arg(&json),
    );
    let v = read_json(&json);
    assert_eq!(v["method"], "exact");
    let pts = v["points"].as_array().unwrap();
    assert!(pts.len() > 10);
    // The miss ratio never increases with the cache size.
    let m: Vec<f64> = pts.iter().map(|p| p[1].as_f64().unwrap()).collect();
    assert!(m.windows(2).all(|w| w[1] <= w[0] + 1e-12));
    // The hot spot (1/16 of the blocks, 70% of accesses) gives a knee.
    assert!(!v["knees"].as_array().unwrap().is_empty(), "{v}");
    let out = run_ok(
        nvwc()
            .args([
                "mrc",
                "--format",
                "heimdall",
                "--shards",
                "0.5",
                "--writes-only",
                "--trace",
            ])
            .arg(&trace),
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("shards-rate"));

    let compact = d.join("t.nvwc");
    convert(&["--format", "heimdall"], &trace, &compact);
    assert_eq!(trace_requests(&compact), 4000);
}

fn peak_rss(trace: &Path) -> u64 {
    let out = run_ok(
        nvwc()
            .args([
                "sim",
                "--format",
                "heimdall",
                "--quiet",
                "--print-peak-rss",
                "--threads",
                "1",
            ])
            .args([
                "--write-policy",
                "wb",
                "--cache-size",
                "4M",
                "--backing",
                "ssd-sata",
                "--trace",
            ])
            .arg(trace),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.starts_with("peak_rss_kib"))
        .expect("rss line");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn memory_does_not_grow_with_trace_length() {
    let d = tmpdir("rss");
    let short = d.join("short.trace");
    let long = d.join("long.trace");
    // Same address space, 10x the records.
    write_trace(&short, 20_000, 65_536);
    write_trace(&long, 200_000, 65_536);
    let a = peak_rss(&short);
    let b = peak_rss(&long);
    assert!(a > 0);
    // 200k records would take >= 6 MB if they were held in memory (32 B each).
    assert!(
        b < a + 4096,
        "peak RSS {a} KiB for 20k requests vs {b} KiB for 200k"
    );
}

/// `nvwc repro non-blocking-writes --quick` on the shared traces: the report
/// and plots are written, partial writes block in `blocking` mode and become
/// patches in the others, and the 4 KiB control is the same in every mode.
#[test]
fn repro_non_blocking_writes_quick() {
    let Some(traces) = common::traces("mobigen.out.facebook") else {
        return;
    };
    let out = tmpdir("repro-nbw");
    let st = nvwc()
        .args(["repro", "non-blocking-writes", "--quick", "--traces"])
        .arg(&traces)
        .arg("--out")
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success());
    let md = std::fs::read_to_string(out.join("non-blocking-writes.md")).unwrap();
    for h in [
        "## Figure 5",
        "## Figure 10",
        "## Figure 11",
        "Beside the paper",
    ] {
        assert!(md.contains(h), "report lacks {h}");
    }
    for p in ["fig5", "fig10", "fig11"] {
        let f = out.join(format!("img/non-blocking-writes-{p}.png"));
        assert!(
            std::fs::metadata(&f).unwrap().len() > 1000,
            "{}",
            f.display()
        );
    }
    let j: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("non-blocking-writes.json")).unwrap(),
    )
    .unwrap();
    let r10 = j[1].as_array().unwrap();
    let get = |label: &str| {
        r10.iter()
            .find(|r| r["label"] == label)
            .unwrap_or_else(|| panic!("no run {label}"))
    };
    for b in ["hdd", "ssd"] {
        let blocking = get(&format!("{b} 2048 true blocking"));
        let lazy = get(&format!("{b} 2048 true lazy"));
        assert!(blocking["fetches"].as_u64().unwrap() > 0);
        assert_eq!(blocking["patches_created"].as_u64().unwrap(), 0);
        assert!(lazy["patches_created"].as_u64().unwrap() > 0);
        let c0 = get(&format!("{b} 4096 true blocking"))["throughput_iops"]
            .as_f64()
            .unwrap();
        for m in ["async", "async-bg", "lazy", "lazy+direct"] {
            let c = get(&format!("{b} 4096 true {m}"))["throughput_iops"]
                .as_f64()
                .unwrap();
            assert!(
                (c - c0).abs() <= 1e-6 * c0,
                "{b} 4k control {m}: {c} vs {c0}"
            );
        }
    }
}

/// `nvwc trace convert --to oracle-general` writes one 24-byte libCacheSim
/// record per 4 KiB block touched, and `nvwc sim --model hit-ratio` counts
/// exactly the hits of a textbook LRU over those records (the property the
/// libCacheSim cross-check relies on, checked here without libCacheSim).
#[test]
fn oracle_general_conversion_and_hit_ratio_model_agree_with_textbook_lru() {
    let (d, trace) = dir_with_trace("oracle", 3000, 600);
    let oracle = d.join("t.oracle");
    convert(&["--to", "oracle-general"], &trace, &oracle);
    let bytes = std::fs::read(&oracle).unwrap();
    assert_eq!(bytes.len() % 24, 0);
    let ids: Vec<u64> = bytes
        .chunks(24)
        .map(|r| {
            assert_eq!(u32::from_le_bytes(r[12..16].try_into().unwrap()), 4096);
            assert_eq!(i64::from_le_bytes(r[16..24].try_into().unwrap()), -1);
            u64::from_le_bytes(r[4..12].try_into().unwrap())
        })
        .collect();
    // Every request is 1..=4 aligned blocks: between 3000 and 12000 records.
    assert!((3000..=12000).contains(&ids.len()), "{}", ids.len());

    let json = d.join("hr.json");
    run_ok(
        nvwc()
            .args(["sim", "--model", "hit-ratio", "--quiet", "--trace"])
            .arg(&trace)
            .args([
                "--replacement",
                "lru",
                "--cache-size",
                "64k,256k,1M",
                "--json",
            ])
            .arg(&json),
    );
    let v = read_json(&json);
    let runs = v.as_array().unwrap();
    assert_eq!(runs.len(), 3);
    let mut last_hits = 0;
    for r in runs {
        let blocks = r["cache_blocks"].as_u64().unwrap() as usize;
        assert_eq!(r["block_accesses"].as_u64().unwrap() as usize, ids.len());
        assert_eq!(r["requests"].as_u64().unwrap(), 3000);
        // Textbook LRU over the converted records.
        let mut q: std::collections::VecDeque<u64> = Default::default();
        let mut hits = 0u64;
        for &id in &ids {
            if let Some(i) = q.iter().position(|&x| x == id) {
                q.remove(i);
                hits += 1;
            } else if q.len() == blocks {
                q.pop_front();
            }
            q.push_back(id);
        }
        let got = r["read_hits"].as_u64().unwrap() + r["write_hits"].as_u64().unwrap();
        assert_eq!(got, hits, "{r}");
        // LRU is a stack algorithm: hits never fall as the cache grows.
        assert!(got >= last_hits);
        last_hits = got;
    }
    assert!(last_hits > 0);

    // --repeat: the same records three times, timestamps continuing.
    let long = d.join("long.nvwc");
    convert(&["--repeat", "3"], &trace, &long);
    assert_eq!(trace_requests(&long), 9000);
    let _ = std::fs::remove_dir_all(&d);
}

/// `nvwc repro admission --quick` for both application models: one JSON
/// object per run with the documented keys, every policy per configuration,
/// and a report with both apps.
#[test]
fn repro_admission_quick() {
    let out = tmpdir("repro-adm");
    for app in ["postgres", "redis"] {
        let json = out.join(format!("{app}.json"));
        let st = nvwc()
            .args(["repro", "admission", "--quick", "--app", app, "--out"])
            .arg(&out)
            .arg("--json")
            .arg(&json)
            .status()
            .unwrap();
        assert!(st.success(), "{app}");
        let text = std::fs::read_to_string(&json).unwrap();
        let runs: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(runs.len() % 6, 0, "six policies per configuration");
        for r in &runs {
            for k in [
                "app",
                "policy",
                "nvwc_bytes",
                "throughput",
                "cached_write_bytes",
                "latency_ms_p99",
                "latency_ms_p999",
            ] {
                assert!(r.get(k).is_some(), "{app}: run lacks {k}: {r}");
            }
            assert_eq!(r["app"], app);
            assert!(r["throughput"].as_f64().unwrap() > 0.0, "{r}");
        }
        // ALL caches every write; the critical policies cache less.
        let all = runs.iter().find(|r| r["policy"] == "ALL").unwrap();
        let cp = runs.iter().find(|r| r["policy"] == "CP").unwrap();
        assert!(
            cp["cached_write_bytes"].as_u64() < all["cached_write_bytes"].as_u64(),
            "{app}: CP cached {} vs ALL {}",
            cp["cached_write_bytes"],
            all["cached_write_bytes"]
        );
    }
    let md = std::fs::read_to_string(out.join("admission.md")).unwrap();
    for h in ["## postgres", "## redis", "CP+PI+IOI", "Beside the paper"] {
        assert!(md.contains(h), "report lacks {h}");
    }
}
