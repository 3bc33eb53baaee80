//! `tests/tls.rs` compiles only with the `tls` cargo feature. CI builds with
//! it (`scripts/test.sh`: `--features nvwc/tls`); this test fails under CI
//! if it did not, so the TLS tests can never silently drop out.

mod common;

#[test]
fn ci_builds_the_tls_tests() {
    let strict = common::strict();
    let built_with_tls = cfg!(feature = "tls");
    assert!(
        built_with_tls || !strict,
        "under CI the tests MUST be built with --features nvwc/tls (tests/tls.rs compiled out)"
    );
}
