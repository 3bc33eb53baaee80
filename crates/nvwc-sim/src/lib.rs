//! Trace-driven discrete-event simulator for nvwc.
//!
//! Virtual time is a `u64` count of nanoseconds. The [`device`] module holds
//! the device models (HDD, SSD, NV-DRAM/PMEM, networked storage) that the
//! simulator drives with block commands; [`driver`] runs the engine
//! (`nvwc_core::Engine<Phantom>`) between a cache device model and a backing
//! device model under a trace ([`addr`] maps the trace's addresses first);
//! [`metrics`] defines what a run reports; [`sweep`] runs many
//! configurations in parallel; [`plot`] draws PNG/SVG charts; [`tradeoff`]
//! is the write-policy paper's revenue/penalty model (§5.4).
#![forbid(unsafe_code)]

pub mod addr;
pub mod app;
pub mod cpu;
pub mod device;
pub mod driver;
pub mod hitratio;
mod idring;
pub mod metrics;
pub mod plot;
pub mod sweep;
pub mod tradeoff;

pub use addr::{AddressMode, DevSelect, ScanOptions, TracePlan};
pub use driver::{
    default_backing_qd, redo_log_bytes, run_plan, ClientKey, EngineTuning, GroupEndCost, Mode,
    SimConfig, Simulator,
};
pub use metrics::{IntervalRecord, LatencySummary, RunHistogram, RunResult};

/// Errors of the simulator. Each message includes the inner error's, so
/// the inner error is not also given as a `source` (a chain printed whole
/// would repeat it).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The trace could not be read.
    #[error("trace: {0}")]
    Trace(nvwc_trace::TraceError),
    /// A device model could not be built.
    #[error("device: {0}")]
    Device(device::DeviceError),
    /// The configuration is invalid.
    #[error("configuration: {0}")]
    Config(String),
    /// The simulation cannot make progress (an engine or driver bug).
    #[error("simulation stuck: {0}")]
    Stuck(String),
    /// Plotting failed.
    #[error("plot: {0}")]
    Plot(String),
    /// I/O outside the trace (output files).
    #[error("{0}")]
    Io(std::io::Error),
}

impl From<nvwc_trace::TraceError> for SimError {
    fn from(e: nvwc_trace::TraceError) -> Self {
        SimError::Trace(e)
    }
}

impl From<device::DeviceError> for SimError {
    fn from(e: device::DeviceError) -> Self {
        SimError::Device(e)
    }
}

impl From<std::io::Error> for SimError {
    fn from(e: std::io::Error) -> Self {
        SimError::Io(e)
    }
}

pub use nvwc_core::units::{format_size, parse_size};
