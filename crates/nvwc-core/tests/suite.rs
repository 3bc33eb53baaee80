//! nvwc-core's integration tests, one binary: each file of `tests/` is a
//! module here (see `Cargo.toml`, `autotests = false`). Run one file's tests
//! by its module path, e.g. `cargo test -p nvwc-core --test suite admission::`.
//!
//! A file added to `tests/` MUST be listed here too, or it never runs;
//! `every_test_file_is_a_module_of_the_suite` fails until it is.

#[path = "accounting.rs"]
mod accounting;
#[path = "admission.rs"]
mod admission;
#[path = "commit.rs"]
mod commit;
#[path = "destage.rs"]
mod destage;
#[path = "direct.rs"]
mod direct;
#[path = "flush.rs"]
mod flush;
#[path = "journal.rs"]
mod journal;
#[path = "layout.rs"]
mod layout;
#[path = "model.rs"]
mod model;
#[path = "partial.rs"]
mod partial;
#[path = "patch.rs"]
mod patch;
#[path = "read.rs"]
mod read;
#[path = "recover.rs"]
mod recover;
#[path = "write_policies.rs"]
mod write_policies;

#[test]
fn every_test_file_is_a_module_of_the_suite() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let this = include_str!("suite.rs");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("tests/ is readable")
        .map(|e| {
            e.expect("a directory entry")
                .file_name()
                .into_string()
                .expect("a UTF-8 name")
        })
        .filter(|n| n.ends_with(".rs") && n != "suite.rs")
        .collect();
    files.sort();
    assert!(files.len() >= 11, "tests/ lost files: {files:?}");
    let missing: Vec<&String> = files
        .iter()
        .filter(|f| !this.contains(&format!("#[path = \"{f}\"]")))
        .collect();
    assert!(
        missing.is_empty(),
        "tests/{missing:?} not in tests/suite.rs: they would never run"
    );
}
