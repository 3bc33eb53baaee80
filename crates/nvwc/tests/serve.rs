//! `nvwc serve` with real NBD clients (qemu-io, nbdinfo), for every write
//! policy: pattern writes and reads, FUA, write-zeroes, discard, flush; then
//! `kill -9`, restart, and the flushed data must be there.
//!
//! Needs Debian's `qemu-utils` and `libnbd-bin`. Missing tools skip the test,
//! or fail it when `NVWC_REQUIRE_TOOLS=1` (CI).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn tool(name: &str) -> bool {
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {name}"))
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        if std::env::var("NVWC_REQUIRE_TOOLS").as_deref() == Ok("1") {
            panic!("{name} is required (NVWC_REQUIRE_TOOLS=1)");
        }
        eprintln!("SKIP: {name} not installed");
    }
    ok
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(dir: &Path, policy: &str) -> Server {
    let child = Command::new(env!("CARGO_BIN_EXE_nvwc"))
        .current_dir(dir)
        .args([
            "serve",
            "--size",
            "64M",
            "--cache-size",
            "8M",
            "--listen",
            "none",
            "--write-policy",
            policy,
            "--txn-blocks",
            "16",
            "--txn-age-ms",
            "20",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start nvwc serve");
    let sock = dir.join("nvwc-data/nvwc.sock");
    let t = Instant::now();
    while !sock.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "server did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(100));
    Server(child)
}

fn uri(dir: &Path) -> String {
    format!(
        "nbd+unix:///?socket={}",
        dir.join("nvwc-data/nvwc.sock").display()
    )
}

fn qemu_io(dir: &Path, cmds: &[&str]) -> String {
    let mut c = Command::new("qemu-io");
    c.args(["-t", "writeback", "-f", "raw"]);
    for x in cmds {
        c.arg("-c").arg(x);
    }
    let out = c.arg(uri(dir)).output().expect("run qemu-io");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "qemu-io failed: {text}");
    assert!(
        !text.contains("Pattern verification failed") && !text.contains("failed"),
        "qemu-io reported a failure: {text}"
    );
    text
}

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nvwc-serve-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn real_clients_every_policy_and_kill9_recovery() {
    if !tool("qemu-io") || !tool("nbdinfo") {
        return;
    }
    for policy in [
        "write-through",
        "write-back",
        "ordered",
        "journaled",
        "journaled-hints",
    ] {
        let dir = tempdir(policy);
        let s = start(&dir, policy);
        for flag in ["flush", "fua", "multi-conn", "trim", "zero"] {
            let ok = Command::new("nbdinfo")
                .args(["--can", flag])
                .arg(uri(&dir))
                .status()
                .unwrap()
                .success();
            assert!(ok, "{policy}: nbdinfo --can {flag}");
        }
        let map = Command::new("nbdinfo")
            .arg("--map")
            .arg(uri(&dir))
            .output()
            .unwrap();
        assert!(
            map.status.success() && !map.stdout.is_empty(),
            "{policy}: nbdinfo --map"
        );
        // More data than the 8 MiB cache holds, so destaging and eviction run.
        let mut cmds: Vec<String> = (0..12)
            .map(|i| format!("write -P {} {}M 1M", 0x10 + i, i))
            .collect();
        cmds.push("write -f -P 0xcd 20M 64k".into());
        cmds.push("write -z 21M 64k".into());
        cmds.push("write -P 0x77 22M 6k".into());
        cmds.push("discard 30M 64k".into());
        cmds.push("flush".into());
        for i in 0..12 {
            cmds.push(format!("read -P {} {}M 1M", 0x10 + i, i));
        }
        cmds.push("read -P 0xcd 20M 64k".into());
        cmds.push("read -P 0 21M 64k".into());
        cmds.push("read -P 0x77 22M 6k".into());
        let refs: Vec<&str> = cmds.iter().map(String::as_str).collect();
        qemu_io(&dir, &refs);
        // Crash the server: everything flushed must come back.
        drop(s);
        let s = start(&dir, policy);
        let mut check: Vec<String> = (0..12)
            .map(|i| format!("read -P {} {}M 1M", 0x10 + i, i))
            .collect();
        check.push("read -P 0xcd 20M 64k".into());
        check.push("read -P 0 21M 64k".into());
        check.push("read -P 0x77 22M 6k".into());
        let refs: Vec<&str> = check.iter().map(String::as_str).collect();
        qemu_io(&dir, &refs);
        // A wrong pattern must be caught (the check can fail).
        let bad = Command::new("qemu-io")
            .args(["-f", "raw", "-c", "read -P 0x99 0 4k"])
            .arg(uri(&dir))
            .output()
            .unwrap();
        let t = String::from_utf8_lossy(&bad.stdout).to_string()
            + &String::from_utf8_lossy(&bad.stderr);
        assert!(
            t.contains("Pattern verification failed"),
            "{policy}: wrong pattern not detected: {t}"
        );
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
