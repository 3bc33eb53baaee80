//! Short load tests of `nvwc serve` (the full 5-minute run is
//! `scripts/load-test.sh 300s`): 64 concurrent NBD clients with mixed
//! request sizes (512 B .. 1 MiB) and reads, writes (some FUA), flushes and
//! trims, every read verified, through `nvwc loadtest`.

use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::serve::{uri, Scratch};

fn start(tag: &str, size: &str, cache: &str) -> Scratch {
    Scratch::start(
        &format!("loadtest-{tag}"),
        &["--size", size, "--cache-size", cache],
    )
}

/// Runs `nvwc loadtest --json` against `s`; returns (exit success, report).
fn load(s: &Scratch, duration: &str, extra: &[&str]) -> (bool, serde_json::Value) {
    let out = common::nvwc()
        .args([
            "loadtest",
            "--json",
            "--clients",
            "64",
            "--duration",
            duration,
        ])
        .args(["--request-timeout", "60s", "--sample-ms", "500"])
        .arg("--uri")
        .arg(uri(&s.dir))
        .arg("--server-pid")
        .arg(s.server.0.id().to_string())
        .args(extra)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "loadtest output is not JSON ({e}): {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.success(), v)
}

/// 64 clients for 20 s: every request succeeds, every read returns what the
/// client last wrote, every kind of request ran, and the server's RSS does
/// not grow by more than 48 MiB over the second half of the run.
#[test]
fn sixty_four_clients_mixed_sizes_no_errors_flat_memory() {
    let s = start("main", "1G", "128M");
    let (ok, r) = load(&s, "20s", &["--max-rss-growth-mib", "48"]);
    eprintln!("{}", serde_json::to_string_pretty(&r).unwrap());
    assert_eq!(r["errors"], 0, "errors: {}", r["first_errors"]);
    assert_eq!(r["verify_failures"], 0);
    for op in ["read", "write", "flush", "trim"] {
        assert!(r[op]["count"].as_u64().unwrap() > 0, "no {op} completed");
    }
    assert!(
        r["verified_sectors"].as_u64().unwrap() > 0,
        "no read was checked"
    );
    let rss = &r["rss"];
    assert!(
        rss["samples"].as_u64().unwrap() >= 10,
        "RSS not sampled: {rss}"
    );
    assert!(
        ok,
        "loadtest failed (RSS growth {})",
        rss["second_half_growth_kib"]
    );
}

/// After a loaded run the server still stops cleanly on SIGTERM (in-flight
/// requests finish, metadata is committed) within 60 s. (The configuration
/// of `scripts/load-test.sh`, where a shutdown livelock was first seen.)
#[test]
fn server_stops_promptly_after_load() {
    let mut s = start("stop", "2G", "512M");
    let (ok, r) = load(&s, "15s", &[]);
    assert!(ok && r["errors"] == 0, "load failed: {}", r["first_errors"]);
    let pid = s.server.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let t = Instant::now();
    loop {
        if let Some(st) = s.server.0.try_wait().unwrap() {
            assert!(st.success(), "server exited with {st} after SIGTERM");
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "server still running 60 s after SIGTERM (shutdown does not finish after load)"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
