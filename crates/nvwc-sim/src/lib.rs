//! Trace-driven discrete-event simulator for nvwc.
//!
//! Virtual time is a `u64` count of nanoseconds. The [`device`] module holds
//! the device models (HDD, SSD, NV-DRAM/PMEM, networked storage) that the
//! simulator drives with block commands.
#![forbid(unsafe_code)]

pub mod device;
