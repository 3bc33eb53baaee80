//! `tests/tls.rs` compiles only with the `tls` cargo feature. CI builds with
//! it (`scripts/test.sh`: `--features nvwc/tls`); this test fails under CI
//! if it did not, so the TLS tests can never silently drop out.

#[test]
fn ci_builds_the_tls_tests() {
    let strict = std::env::var("NVWC_REQUIRE_TOOLS").as_deref() == Ok("1")
        || matches!(std::env::var("CI").as_deref(), Ok("true" | "1"));
    let built_with_tls = cfg!(feature = "tls");
    assert!(
        built_with_tls || !strict,
        "under CI the tests MUST be built with --features nvwc/tls (tests/tls.rs compiled out)"
    );
}
