//! Naming and building device models.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{
    ArrayModel, ArrayParams, DeviceError, DeviceModel, HddModel, HddParams, NetModel, NetParams,
    SolidStateModel, SolidStateParams,
};

/// A device model with its parameters.
///
/// Parse a preset by name (`"hdd-hp97560".parse()`), or deserialise from
/// JSON (or any serde format) to give custom parameters, e.g.
/// `{"type": "hdd", "name": "mydisk", "heads": 4, ...}`; the field set is
/// that of the variant's parameter struct plus the `type` tag
/// (`"hdd"`, `"solid-state"`, `"net"`, `"array"`). Unknown fields are
/// rejected.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum DeviceSpec {
    /// Rotating disk.
    Hdd(HddParams),
    /// SSD, NV-DRAM or PMEM.
    SolidState(SolidStateParams),
    /// Networked storage with a backend.
    Net(NetParams),
    /// RAID 0/1 array of member devices.
    Array(ArrayParams),
}

/// Preset names accepted by [`DeviceSpec::from_str`].
pub const PRESET_NAMES: &[&str] = &[
    "hdd",
    "hdd-hp97560",
    "hdd-7200",
    "ssd",
    "ssd-sata",
    "ssd-nvme",
    "ssd-revodrive",
    "nvdram",
    "pmem",
    "net",
    "net-iscsi-raid",
    "net-hdd",
    "hdd-raid1",
    "net-raid1",
];

impl DeviceSpec {
    /// The preset called `name` (see [`PRESET_NAMES`]):
    /// `hdd` = `hdd-7200` ([`HddParams::modern_7200`]),
    /// `hdd-hp97560` ([`HddParams::hp97560`]),
    /// `ssd` = `ssd-sata` ([`SolidStateParams::ssd_sata`]),
    /// `ssd-nvme`, `ssd-revodrive`, `nvdram`, `pmem` (the
    /// [`SolidStateParams`] presets), `net` = `net-iscsi-raid`
    /// ([`NetParams::iscsi_raid_table1`]), `net-hdd`
    /// ([`NetParams::hdd_over_gbe`]), `hdd-raid1`
    /// ([`ArrayParams::raid1_7200`]) and `net-raid1`
    /// ([`NetParams::raid1_over_gbe`]).
    pub fn preset(name: &str) -> Result<Self, DeviceError> {
        Ok(match name {
            "hdd" | "hdd-7200" => DeviceSpec::Hdd(HddParams::modern_7200()),
            "hdd-hp97560" => DeviceSpec::Hdd(HddParams::hp97560()),
            "ssd" | "ssd-sata" => DeviceSpec::SolidState(SolidStateParams::ssd_sata()),
            "ssd-nvme" => DeviceSpec::SolidState(SolidStateParams::ssd_nvme()),
            "ssd-revodrive" => DeviceSpec::SolidState(SolidStateParams::ssd_revodrive()),
            "nvdram" => DeviceSpec::SolidState(SolidStateParams::nvdram()),
            "pmem" => DeviceSpec::SolidState(SolidStateParams::pmem()),
            "net" | "net-iscsi-raid" => DeviceSpec::Net(NetParams::iscsi_raid_table1()),
            "net-hdd" => DeviceSpec::Net(NetParams::hdd_over_gbe()),
            "hdd-raid1" => DeviceSpec::Array(ArrayParams::raid1_7200()),
            "net-raid1" => DeviceSpec::Net(NetParams::raid1_over_gbe()),
            other => return Err(DeviceError::UnknownName(other.to_string())),
        })
    }

    /// Parse a spec from JSON text: either a JSON string naming a preset
    /// (`"ssd-nvme"`) or an object with a `type` tag and parameters.
    pub fn from_json(text: &str) -> Result<Self, DeviceError> {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| DeviceError::Parse(e.to_string()))?;
        match v {
            serde_json::Value::String(name) => Self::preset(&name),
            other => serde_json::from_value(other).map_err(|e| DeviceError::Parse(e.to_string())),
        }
    }

    /// Serialise to pretty JSON (a starting point for custom parameters).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("device specs always serialise")
    }

    /// Model name of the spec.
    pub fn name(&self) -> &str {
        match self {
            DeviceSpec::Hdd(p) => &p.name,
            DeviceSpec::SolidState(p) => &p.name,
            DeviceSpec::Net(p) => &p.name,
            DeviceSpec::Array(p) => &p.name,
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = DeviceError;

    /// A preset name, or (if the text starts with `{` or `"`) JSON as in
    /// [`DeviceSpec::from_json`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t.starts_with('{') || t.starts_with('"') {
            Self::from_json(t)
        } else {
            Self::preset(t)
        }
    }
}

/// Build the model for `spec`. `capacity_bytes`: `None` keeps the model's own
/// capacity; `Some(c)` asks for `c` bytes (an HDD exposes only its first `c`
/// bytes and refuses more than its native capacity; solid-state devices take
/// `c` as their capacity; a network device passes it to its backend; an
/// array asks each member for its share).
pub fn build(
    spec: &DeviceSpec,
    capacity_bytes: Option<u64>,
) -> Result<Box<dyn DeviceModel>, DeviceError> {
    Ok(match spec {
        DeviceSpec::Hdd(p) => Box::new(HddModel::new(p.clone(), capacity_bytes)?),
        DeviceSpec::SolidState(p) => Box::new(SolidStateModel::new(p.clone(), capacity_bytes)?),
        DeviceSpec::Net(p) => Box::new(NetModel::new(p.clone(), capacity_bytes)?),
        DeviceSpec::Array(p) => Box::new(ArrayModel::new(p.clone(), capacity_bytes)?),
    })
}
