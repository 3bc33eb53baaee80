//! Helpers shared by the integration tests.
#![allow(dead_code)]

use nvwc_trace::{Op, TraceRecord};
use std::path::PathBuf;

/// Path of a file in `tests/fixtures/`.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Every valid fixture, by name: the files in `tests/fixtures/` and both
/// vSCSI versions of [`VSCSI_REQS`].
pub fn valid_inputs() -> Vec<(String, Vec<u8>)> {
    let mut inputs: Vec<(String, Vec<u8>)> = [
        "msr.csv",
        "spc.spc",
        "blkparse.txt",
        "cloudphysics.csv",
        "tencent.csv",
        "systor17.csv",
        "heimdall.trace",
        "mobigen.out.sample",
    ]
    .iter()
    .map(|n| (n.to_string(), std::fs::read(fixture(n)).unwrap()))
    .collect();
    inputs.push(("vscsi1".into(), vscsi_v1(&VSCSI_REQS)));
    inputs.push(("vscsi2".into(), vscsi_v2(&VSCSI_REQS)));
    inputs
}

/// Shorthand record constructor.
pub fn rec(
    ts_ns: u64,
    op: Op,
    offset: u64,
    len: u64,
    fua: bool,
    dev: u32,
    stream: u32,
) -> TraceRecord {
    TraceRecord {
        ts_ns,
        op,
        offset,
        len,
        fua,
        dev,
        stream,
    }
}

/// One vSCSI request: (SCSI opcode, length in bytes, lbn in sectors, timestamp in us).
pub type VscsiReq = (u16, u32, u64, u64);

/// Encodes requests as a vSCSI v1 file (32-byte records).
pub fn vscsi_v1(reqs: &[VscsiReq]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, &(cmd, len, lbn, ts)) in reqs.iter().enumerate() {
        out.extend_from_slice(&(0x8000_0000u32 + i as u32).to_le_bytes()); // sn
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&1u32.to_le_bytes()); // nSG
        out.extend_from_slice(&cmd.to_le_bytes());
        out.extend_from_slice(&0x0100u16.to_le_bytes()); // ver
        out.extend_from_slice(&lbn.to_le_bytes());
        out.extend_from_slice(&ts.to_le_bytes());
    }
    out
}

/// Encodes requests as a vSCSI v2 file (40-byte records, response time 7 us).
pub fn vscsi_v2(reqs: &[VscsiReq]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, &(cmd, len, lbn, ts)) in reqs.iter().enumerate() {
        out.extend_from_slice(&cmd.to_le_bytes());
        out.extend_from_slice(&0x0200u16.to_le_bytes()); // ver
        out.extend_from_slice(&(i as u32).to_le_bytes()); // sn
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&1u32.to_le_bytes()); // nSG
        out.extend_from_slice(&lbn.to_le_bytes());
        out.extend_from_slice(&ts.to_le_bytes());
        out.extend_from_slice(&7u64.to_le_bytes()); // rt
    }
    out
}

/// The vSCSI fixture requests (shared by v1 and v2): a write, a read, an
/// INQUIRY (skipped), a SYNCHRONIZE CACHE (flush) and a WRITE(16).
pub const VSCSI_REQS: [VscsiReq; 5] = [
    (0x2a, 512, 42_932_745, 5_633_898_368_802),
    (0x28, 4096, 100, 5_633_898_368_900),
    (0x12, 36, 0, 5_633_898_369_000),
    (0x35, 0, 0, 5_633_898_370_000),
    (0x8a, 8192, 16, 5_633_898_371_000),
];

/// The records [`VSCSI_REQS`] must decode to.
pub fn vscsi_expected() -> Vec<TraceRecord> {
    vec![
        rec(0, Op::Write, 21_981_565_440, 512, false, 0, 0),
        rec(98_000, Op::Read, 51_200, 4096, false, 0, 0),
        rec(1_198_000, Op::Flush, 0, 0, false, 0, 0),
        rec(2_198_000, Op::Write, 8192, 8192, false, 0, 0),
    ]
}
