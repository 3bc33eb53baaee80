//! Harnesses for nvwc's cargo-fuzz targets (see `fuzz/README.md`).
pub mod nbd;
pub mod trace;
