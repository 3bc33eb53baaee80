//! The [`Format`] enum: one variant per supported trace format.

use crate::error::TraceError;
use serde::Serialize;
use std::fmt;
use std::str::FromStr;

/// A trace format. [`Format::name`] / [`FromStr`] / [`Display`](fmt::Display)
/// use the short names shown below, suitable for a CLI `--format` option
/// (parsing is case-insensitive and accepts a few aliases).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(into = "&'static str")]
pub enum Format {
    /// `msr`: MSR Cambridge CSV, no header:
    /// `Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime` —
    /// Windows FILETIME (100 ns ticks), `Read`/`Write` (any case), offset
    /// and size in bytes; `dev` = DiskNumber; hostname and response time
    /// are checked but not kept.
    Msr,
    /// `spc`: SNIA SPC / UMass (Financial, WebSearch)
    /// `ASU,LBA,Size,Opcode,Timestamp[,...]` — LBA in 512-byte sectors,
    /// size in bytes, opcode `r`/`R`/`w`/`W`, timestamp in seconds
    /// (decimal); `dev` = ASU; optional trailing fields ignored.
    Spc,
    /// `blkparse`: default text output of `blkparse`; `Q` events by default,
    /// see [`crate::formats::blkparse`].
    Blkparse,
    /// `vscsi1`: VMware vSCSI binary, 32-byte version-1 records, see
    /// [`crate::formats::vscsi`].
    VscsiV1,
    /// `vscsi2`: VMware vSCSI binary, 40-byte version-2 records, see
    /// [`crate::formats::vscsi`].
    VscsiV2,
    /// `cloudphysics`: CloudPhysics CSV `version,time,op,size,lbn` (header
    /// optional) — time in seconds (the vSCSI microsecond timestamp / 10^6),
    /// op a hex SCSI opcode mapped like vSCSI, size in bytes, lbn in
    /// 512-byte sectors; `dev` = 0.
    CloudPhysics,
    /// `tencent`: Tencent CBS `Timestamp,Offset,Size,IOType,VolumeID` — unix
    /// seconds, offset and size in 512-byte sectors, IOType `0` read / `1`
    /// write; `dev` = VolumeID.
    Tencent,
    /// `systor17`: SYSTOR'17 `Timestamp,Response,IOType,LUN,Offset,Size`
    /// (header line optional) — unix seconds with nanosecond decimals,
    /// response seconds (not kept), `R`/`W`, offset and size in bytes;
    /// `dev` = LUN.
    Systor17,
    /// `heimdall`: Heimdall / MSR-cut `ts dev offset size op`, white-space
    /// separated — ts in milliseconds (decimal), offset and size in bytes,
    /// **op `0` = write, `1` = read**; `dev` = dev.
    Heimdall,
    /// `mobigen`: MobiBench / MobiGen file-syscall trace mapped onto a
    /// virtual block device, see [`crate::formats::mobigen`].
    Mobigen,
    /// `compact`: nvwc's own fixed-width binary format, see
    /// [`crate::formats::compact`].
    Compact,
}

impl Format {
    /// Every format, in the order used by [`Format::id`].
    pub const ALL: [Format; 11] = [
        Format::Msr,
        Format::Spc,
        Format::Blkparse,
        Format::VscsiV1,
        Format::VscsiV2,
        Format::CloudPhysics,
        Format::Tencent,
        Format::Systor17,
        Format::Heimdall,
        Format::Mobigen,
        Format::Compact,
    ];

    /// The canonical CLI name.
    pub fn name(self) -> &'static str {
        match self {
            Format::Msr => "msr",
            Format::Spc => "spc",
            Format::Blkparse => "blkparse",
            Format::VscsiV1 => "vscsi1",
            Format::VscsiV2 => "vscsi2",
            Format::CloudPhysics => "cloudphysics",
            Format::Tencent => "tencent",
            Format::Systor17 => "systor17",
            Format::Heimdall => "heimdall",
            Format::Mobigen => "mobigen",
            Format::Compact => "compact",
        }
    }

    /// One-line human description.
    pub fn description(self) -> &'static str {
        match self {
            Format::Msr => "MSR Cambridge CSV (FILETIME,host,disk,Read/Write,offset,size,resp)",
            Format::Spc => "SNIA SPC / UMass CSV (ASU,LBA sectors,size bytes,r/w,seconds)",
            Format::Blkparse => "blkparse default text output (queue 'Q' events)",
            Format::VscsiV1 => "VMware vSCSI binary v1 (32-byte records)",
            Format::VscsiV2 => "VMware vSCSI binary v2 (40-byte records)",
            Format::CloudPhysics => "CloudPhysics CSV (version,time s,op hex,size,lbn)",
            Format::Tencent => "Tencent CBS CSV (unix s,offset sectors,size sectors,0/1,volume)",
            Format::Systor17 => "SYSTOR'17 CSV (unix s,response,R/W,LUN,offset,size)",
            Format::Heimdall => "Heimdall text (ts ms, dev, offset, size, 0=write/1=read)",
            Format::Mobigen => "MobiBench/MobiGen file-syscall trace (mapped onto blocks)",
            Format::Compact => "nvwc compact binary trace",
        }
    }

    /// `true` for the binary formats (vSCSI and compact).
    pub fn is_binary(self) -> bool {
        matches!(self, Format::VscsiV1 | Format::VscsiV2 | Format::Compact)
    }

    /// Stable numeric id (1-based index in [`Format::ALL`]), stored in the
    /// compact header to remember where a converted trace came from.
    pub fn id(self) -> u16 {
        Format::ALL
            .iter()
            .position(|f| *f == self)
            .map_or(0, |i| i as u16 + 1)
    }

    /// Inverse of [`Format::id`].
    pub fn from_id(id: u16) -> Option<Format> {
        (id as usize)
            .checked_sub(1)
            .and_then(|i| Format::ALL.get(i).copied())
    }

    /// Comma-separated list of the canonical names.
    pub fn names() -> String {
        Format::ALL
            .iter()
            .map(|f| f.name())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl From<Format> for &'static str {
    fn from(f: Format) -> Self {
        f.name()
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Format {
    type Err = TraceError;

    /// Accepts the canonical names, case-insensitively, plus the aliases
    /// `msr-cambridge`, `umass`, `blktrace`, `vscsi-v1`, `vscsi-v2`,
    /// `cloud-physics`, `tencent-cbs`, `cbs`, `systor`, `mobibench`, `nvwc`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        let f = match lower.as_str() {
            "msr" | "msr-cambridge" => Format::Msr,
            "spc" | "umass" => Format::Spc,
            "blkparse" | "blktrace" => Format::Blkparse,
            "vscsi1" | "vscsi-v1" => Format::VscsiV1,
            "vscsi2" | "vscsi-v2" => Format::VscsiV2,
            "cloudphysics" | "cloud-physics" => Format::CloudPhysics,
            "tencent" | "tencent-cbs" | "cbs" => Format::Tencent,
            "systor17" | "systor" => Format::Systor17,
            "heimdall" => Format::Heimdall,
            "mobigen" | "mobibench" => Format::Mobigen,
            "compact" | "nvwc" => Format::Compact,
            _ => {
                return Err(TraceError::UnknownFormatName {
                    name: s.to_owned(),
                    expected: Format::names(),
                })
            }
        };
        Ok(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for f in Format::ALL {
            assert_eq!(f.name().parse::<Format>().unwrap(), f);
            assert_eq!(f.to_string().to_uppercase().parse::<Format>().unwrap(), f);
            assert_eq!(Format::from_id(f.id()), Some(f));
        }
        assert_eq!(Format::from_id(0), None);
        assert_eq!(Format::from_id(99), None);
    }

    #[test]
    fn unknown_name_lists_choices() {
        let e = "nope".parse::<Format>().unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("nope") && msg.contains("blkparse") && msg.contains("compact"));
    }
}
