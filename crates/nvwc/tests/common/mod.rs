//! Helpers shared by the integration tests (each test file is its own
//! crate, so not every helper is used by each).
#![allow(dead_code)]

pub mod serve;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// CI (`CI=true` or `NVWC_REQUIRE_TOOLS=1`) fails a test whose tools are
/// missing instead of skipping it.
pub fn strict() -> bool {
    std::env::var("NVWC_REQUIRE_TOOLS").as_deref() == Ok("1")
        || matches!(std::env::var("CI").as_deref(), Ok("true" | "1"))
}

/// Whether `name` is installed. Missing, it panics under CI ([`strict`])
/// and prints `SKIP` otherwise.
pub fn tool(name: &str) -> bool {
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {name}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        if strict() {
            panic!("{name} is required (NVWC_REQUIRE_TOOLS=1)");
        }
        eprintln!("SKIP: {name} not installed");
    }
    ok
}

/// [`tool`] for each of `names`, stopping at the first missing one.
pub fn tools(names: &[&str]) -> bool {
    names.iter().all(|n| tool(n))
}

/// Run `nvwc serve ARGS` in `dir`, which MUST refuse to start: it must exit
/// non-zero within 20 s without creating `dir/nvwc-data/nvwc.sock`.
/// Returns its stderr.
pub fn serve_refused(dir: &Path, args: &[&str]) -> String {
    let sock = dir.join("nvwc-data/nvwc.sock");
    let _ = std::fs::remove_file(&sock);
    let mut child = Command::new(env!("CARGO_BIN_EXE_nvwc"))
        .current_dir(dir)
        .arg("serve")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("nvwc serve {args:?} started; it must refuse");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!status.success(), "nvwc serve {args:?} exited 0: {err}");
    assert!(!sock.exists(), "a refused server listened: {args:?}");
    err
}
