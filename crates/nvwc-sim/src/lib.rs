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
pub mod device;
pub mod driver;
pub mod hitratio;
pub mod metrics;
pub mod plot;
pub mod sweep;
pub mod tradeoff;

pub use addr::{AddressMode, DevSelect, ScanOptions, TracePlan};
pub use driver::{
    default_backing_qd, run_plan, ClientKey, EngineTuning, GroupEndCost, Mode, SimConfig, Simulator,
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

/// Parses a size: a number with an optional binary suffix `k`, `m`, `g`, `t`
/// (powers of 1024, case-insensitive, optional trailing `b`/`ib`): `4k`,
/// `64M`, `1GiB`, `4096`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let t = t
        .strip_suffix("ib")
        .or_else(|| t.strip_suffix('b'))
        .unwrap_or(&t);
    let (num, mul) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m') => (&t[..t.len() - 1], 1 << 20),
        Some('g') => (&t[..t.len() - 1], 1 << 30),
        Some('t') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("bad size {s:?} (e.g. 4k, 64M, 1G)"))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("bad size {s:?}"));
    }
    Ok((v * mul as f64).round() as u64)
}

/// Formats a byte count with a binary suffix (`64M`, `1.5G`, `4k`).
pub fn format_size(b: u64) -> String {
    const U: [(&str, u64); 4] = [
        ("T", 1 << 40),
        ("G", 1 << 30),
        ("M", 1 << 20),
        ("k", 1 << 10),
    ];
    for (n, m) in U {
        if b >= m {
            let v = b as f64 / m as f64;
            return if (v - v.round()).abs() < 1e-9 {
                format!("{}{n}", v.round() as u64)
            } else {
                format!("{v:.2}{n}")
            };
        }
    }
    format!("{b}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes() {
        assert_eq!(super::parse_size("4k").unwrap(), 4096);
        assert_eq!(super::parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(super::parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(super::parse_size("512").unwrap(), 512);
        assert_eq!(super::parse_size("1.5k").unwrap(), 1536);
        assert!(super::parse_size("x").is_err());
        assert_eq!(super::format_size(64 << 20), "64M");
        assert_eq!(super::format_size(1536), "1.50k");
    }
}
