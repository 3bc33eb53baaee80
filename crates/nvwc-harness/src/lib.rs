//! Live harnesses: each drives a real `nvwc serve` process (the binary that
//! calls it: `std::env::current_exe`) with real clients, and checks what
//! survives.
//!
//! * [`crashtest`]: `nvwc crashtest`, `kill -9`, host crashes (random subsets
//!   and torn writes of what was not synced) and cache-device loss, checked
//!   by an independent oracle;
//! * [`ext4`]: `nvwc crashtest --workload ext4`, a file system over nbdfuse
//!   and a loop device;
//! * [`grid`]: `nvwc grid`, the consistency grid (write policies x failure
//!   modes);
//! * [`loadtest`]: `nvwc loadtest`, a time-bounded NBD load with data
//!   verification.

pub mod crashtest;
pub mod ext4;
pub mod grid;
pub mod loadtest;
