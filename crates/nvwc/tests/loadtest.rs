//! Short load tests of `nvwc serve` (the full 5-minute run is
//! `scripts/load-test.sh 300s`): 64 concurrent NBD clients with mixed
//! request sizes (512 B .. 1 MiB) and reads, writes (some FUA), flushes and
//! trims, every read verified, through `nvwc loadtest`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nvwc-loadtest-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

struct Server {
    child: Child,
    dir: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start(tag: &str, size: &str, cache: &str) -> Server {
    let dir = tempdir(tag);
    let child = Command::new(env!("CARGO_BIN_EXE_nvwc"))
        .current_dir(&dir)
        .args([
            "serve",
            "--listen",
            "none",
            "--size",
            size,
            "--cache-size",
            cache,
        ])
        .args(["--log-level", "warn"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let sock = dir.join("nvwc-data/nvwc.sock");
    let t = Instant::now();
    while !sock.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "server did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(100));
    Server { child, dir }
}

fn uri(dir: &Path) -> String {
    format!(
        "nbd+unix:///?socket={}",
        dir.join("nvwc-data/nvwc.sock").display()
    )
}

/// Runs `nvwc loadtest --json` against `s`; returns (exit success, report).
fn load(s: &Server, duration: &str, extra: &[&str]) -> (bool, serde_json::Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_nvwc"))
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
        .arg(s.child.id().to_string())
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
    let pid = s.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let t = Instant::now();
    loop {
        if let Some(st) = s.child.try_wait().unwrap() {
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
