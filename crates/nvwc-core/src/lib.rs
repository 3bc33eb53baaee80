//! # nvwc-core
//!
//! The sans-IO write-cache engine behind nvwc: write policies (write-through,
//! write-back, ordered, journaled, journaled-hints), replacement (via
//! `nvwc-replacement`), and the cache device's on-disk format. It holds no
//! clock, no threads and no file handles: drivers (the NBD server, the
//! simulator, the VOPR) feed it requests, device completions and time, and
//! execute the device commands it emits. See `docs/ARCHITECTURE.md`.

#![forbid(unsafe_code)]

pub mod admission;
pub mod config;
pub mod engine;
pub mod group;
mod index;
pub mod layout;
pub mod mutation;
pub mod payload;
pub mod pump;
mod slab;
pub mod stats;
#[doc(hidden)]
pub mod testkit;
pub mod types;
pub mod units;
pub mod write_policy;

pub use config::{
    AdmissionKind, Config, ConfigError, FetchMode, JournalConfig, KneeSource, ReplacementKind,
    Watermarks, WritePolicyKind,
};
pub use engine::{
    CacheImage, Engine, Event, RecoverError, RecoveryReport, RepairFn, RECORD_RETRIES, STOP_RETRIES,
};
pub use payload::{Payload, Phantom};
pub use stats::Stats;
pub use types::*;
pub use write_policy::PolicyEvent;
