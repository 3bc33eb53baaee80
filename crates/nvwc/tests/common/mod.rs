//! Helpers shared by the integration tests (each test file is its own
//! crate, so not every helper is used by each).
#![allow(dead_code)]

use std::process::{Command, Stdio};

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
