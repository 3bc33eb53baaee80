//! Helpers shared by the integration tests (each test file is its own
//! crate, so not every helper is used by each).
#![allow(dead_code)]

pub mod serve;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `nvwc` binary under test.
pub fn nvwc() -> Command {
    Command::new(env!("CARGO_BIN_EXE_nvwc"))
}

/// A fresh, empty `$TMPDIR/nvwc-TAG-PID`.
pub fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nvwc-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A process's stdout and then its stderr, as text.
pub fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr)
}

/// A loopback TCP port nobody listens on (now).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `c`, asserting success; returns its output.
pub fn run_ok(c: &mut Command) -> Output {
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The shared traces directory (`$NVWC_TRACES`, else `../shared/traces`
/// beside the checkout) when it holds `marker`; otherwise `None` (skip),
/// or a panic under CI ([`strict`]).
pub fn traces(marker: &str) -> Option<PathBuf> {
    let d = match std::env::var_os("NVWC_TRACES") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces"),
    };
    if d.join(marker).exists() {
        return Some(d);
    }
    assert!(
        !strict(),
        "../shared/traces (or $NVWC_TRACES) is required under CI (CI=true or NVWC_REQUIRE_TOOLS=1)"
    );
    eprintln!("SKIP: ../shared/traces not present (set NVWC_TRACES)");
    None
}

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

/// Skip the calling test (return from it) unless every named tool is
/// installed ([`tools`]: under CI a missing one fails the test instead).
#[allow(unused_macros)]
macro_rules! require_tools {
    ($($name:expr),+ $(,)?) => {
        if !$crate::common::tools(&[$($name),+]) {
            return;
        }
    };
}
#[allow(unused_imports)]
pub(crate) use require_tools;

/// Call `f` every `every` until it returns `Some` (returned), or until
/// `timeout` has passed (`None`).
pub fn poll_until<T>(
    timeout: Duration,
    every: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> Option<T> {
    let t = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if t.elapsed() > timeout {
            return None;
        }
        std::thread::sleep(every);
    }
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
    let exited = poll_until(Duration::from_secs(20), Duration::from_millis(50), || {
        child.try_wait().unwrap()
    });
    let Some(status) = exited else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("nvwc serve {args:?} started; it must refuse");
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
