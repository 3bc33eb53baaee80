//! The nvwc server (`nvwc serve`): an NBD server that caches writes on a
//! persistent cache file, as a library, so that the binary only parses
//! arguments and tests can run a server in their own process ([`Server`]).
//!
//! Every export (the default one from `--backing`/`--cache`, and each
//! `--export`) has its own engine (`nvwc_core::Engine`), run by a
//! `host::Host`: the engine sits in a mutex and is pumped by whichever
//! thread has work for it. A connection's task runs its request and the
//! inline cache I/O itself (a cache hit never leaves that thread); syncs, FUA
//! writes and backing-store commands run on small worker pools, one per
//! device, whose threads complete them under the same lock. Every connection
//! of an export shares its engine, so a FLUSH or FUA on one connection covers
//! writes acknowledged on all of them: multi-conn is true.
//!
//! Crash story (see `docs/ON-DISK-FORMAT.md`): the engine acknowledges a plain
//! write once it is in the cache file, and a FLUSH or FUA write only after a
//! commit (fdatasync of data, shadow-paged metadata write, fdatasync, commit
//! record written and synced). After `kill -9` the next start recovers the last
//! commit: every write acknowledged before a completed FLUSH, and every FUA
//! write, is there. Journaled checkpoints reach the backing file through the
//! redo log in `<backing>.nvwc-redo`, or an upstream NBD export through the
//! redo region at its end (`docs/BACKING-FORMAT.md`), replayed on start and by
//! `nvwc recover`, so the backing store alone is always at a checkpoint
//! boundary.
//!
//! Binding (`bind.rs`, `format.rs`, `label.rs`; `docs/ON-DISK-FORMAT.md`,
//! "Binding"): a cache is opened only with the backing store its superblock
//! names (the store carries a label naming the cache), and a cache device is
//! formatted only when it is blank. Both are decided before anything is
//! written to either device.

//! Where each concern lives:
//! * flags and exports: `args.rs` ([`Args`]), `spec.rs`, `config_file.rs`;
//! * opening an export: `open.rs`, `backing.rs`, `files.rs`, `bind.rs`,
//!   `format.rs`, `label.rs`;
//! * serving: `server.rs` (a running server), `run.rs` (`nvwc serve` as a
//!   process: signals, reloads, systemd), `export.rs` (NBD requests
//!   to engine requests), `host.rs` (the engine's pump and worker pools),
//!   `device.rs` (over `nvwc-dev`: the device interface, the redo log),
//!   `mapped.rs`, `upstream.rs`, `fault.rs`,
//!   `tls.rs`;
//! * watching and steering it: `control.rs`, `connections.rs`,
//!   `metrics.rs`, `log.rs`, `notify.rs`, `status.rs`;
//! * after losing the cache: `recover.rs`.

mod args;
mod backing;
mod bind;
pub mod config_file;
mod connections;
mod control;
mod device;
pub mod errors;
mod export;
pub mod fault;
mod files;
pub mod format;
mod host;
mod label;
pub mod log;
mod mapped;
mod metrics;
mod notify;
mod open;
mod recover;
mod run;
mod server;
mod spec;
pub mod status;
pub mod tls;
mod upstream;

pub use args::{parse_range, parse_size, Args};
pub use control::{ask, control, hint, CtlArgs, HintArgs};
pub use recover::{recover, RecoverArgs};
pub use run::run;
pub use server::Server;
