//! VMware vSCSI binary traces (the format CloudPhysics published and
//! PyMimircache / libCacheSim read).
//!
//! All fields little-endian, no header:
//!
//! * **v1**, 32 bytes: `u32 sn, u32 len, u32 nSG, u16 cmd, u16 ver, u64 lbn, u64 ts`
//! * **v2**, 40 bytes: `u16 cmd, u16 ver, u32 sn, u32 len, u32 nSG, u64 lbn, u64 ts, u64 rt`
//!
//! `ver >> 8` is the format version (so `ver` is `0x0100` in v1 files,
//! `0x02xx` in v2); `len` is in bytes, `lbn` in 512-byte sectors, `ts` in
//! microseconds (`rt`, the v2 response time, is not kept). `cmd` is a SCSI
//! opcode: READ(6/10/12/16) `0x08 0x28 0xa8 0x88` → Read, WRITE(6/10/12/16)
//! `0x0a 0x2a 0xaa 0x8a` → Write, SYNCHRONIZE CACHE(10/16) `0x35 0x91` →
//! Flush; other commands (INQUIRY, TEST UNIT READY, and UNMAP, whose ranges
//! the trace does not record) are skipped and counted by
//! [`crate::TraceReader::skipped`]. The vSCSI record has no FUA bit.
//! `dev` and `stream` are 0 (the format records neither). Every record's
//! `ver` is checked, so a misaligned or foreign file is reported, not
//! silently decoded.

use crate::binary::{u16_at, u32_at, u64_at, Batched, FixedRecords};
use crate::error::TraceError;
use crate::formats::scsi_op;
use crate::record::{Op, TraceRecord};
use std::io::BufRead;

/// v1 record size in bytes.
pub const V1_RECORD: usize = 32;
/// v2 record size in bytes.
pub const V2_RECORD: usize = 40;

/// Decoded fields common to both versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct VscsiFields {
    pub cmd: u16,
    pub ver: u16,
    pub len: u32,
    pub lbn: u64,
    pub ts_us: u64,
}

#[inline]
pub(crate) fn decode_v1(b: &[u8]) -> VscsiFields {
    VscsiFields {
        len: u32_at(b, 4),
        cmd: u16_at(b, 12),
        ver: u16_at(b, 14),
        lbn: u64_at(b, 16),
        ts_us: u64_at(b, 24),
    }
}

#[inline]
pub(crate) fn decode_v2(b: &[u8]) -> VscsiFields {
    VscsiFields {
        cmd: u16_at(b, 0),
        ver: u16_at(b, 2),
        len: u32_at(b, 8),
        lbn: u64_at(b, 16),
        ts_us: u64_at(b, 24),
    }
}

/// Turns decoded fields into a raw record (`ts_ns` absolute), `Ok(None)` for
/// a skipped SCSI command.
#[inline(always)]
fn to_record(f: VscsiFields, version: u8) -> Result<Option<TraceRecord>, String> {
    if f.ver >> 8 != u16::from(version) {
        return Err(format!(
            "version field {:#06x} is not vSCSI v{version} (misaligned or not a vSCSI trace?)",
            f.ver
        ));
    }
    let ts_ns = f
        .ts_us
        .checked_mul(1000)
        .ok_or_else(|| format!("timestamp {} us overflows 64-bit nanoseconds", f.ts_us))?;
    match scsi_op(f.cmd) {
        None => Ok(None),
        Some(Op::Flush) => Ok(Some(TraceRecord::flush(ts_ns, 0))),
        Some(op) => {
            let offset = f
                .lbn
                .checked_mul(512)
                .ok_or_else(|| format!("lbn {} overflows a 64-bit byte offset", f.lbn))?;
            let len = u64::from(f.len);
            offset
                .checked_add(len)
                .ok_or_else(|| format!("offset {offset} + length {len} overflows 64 bits"))?;
            Ok(Some(TraceRecord::new(ts_ns, op, offset, len, 0)))
        }
    }
}

/// Streaming vSCSI reader.
pub(crate) struct VscsiReader<'a> {
    src: Batched<'a>,
    version: u8,
}

impl<'a> VscsiReader<'a> {
    pub(crate) fn new(inner: Box<dyn BufRead + Send + 'a>, version: u8) -> Self {
        let size = if version == 1 { V1_RECORD } else { V2_RECORD };
        VscsiReader {
            src: Batched::new(FixedRecords::new(inner, size, 0)),
            version,
        }
    }

    /// Records skipped as SCSI commands without a block mapping.
    pub(crate) fn skipped(&self) -> u64 {
        self.src.skipped
    }

    /// Next record of the current batch, if any.
    #[inline]
    pub(crate) fn next_buffered(&mut self) -> Option<TraceRecord> {
        self.src.next_buffered()
    }

    /// Next raw record; errors are fatal only for I/O and truncation.
    #[inline]
    pub(crate) fn next_raw(&mut self, name: &str) -> Option<Result<TraceRecord, TraceError>> {
        if self.version == 1 {
            self.src.next_raw(name, |b| to_record(decode_v1(b), 1))
        } else {
            self.src.next_raw(name, |b| to_record(decode_v2(b), 2))
        }
    }
}

/// `true` if `sample` starts with at least one whole vSCSI record of
/// `version` and every whole record among the first four has that version.
pub(crate) fn looks_like(sample: &[u8], version: u8) -> bool {
    let (size, decode): (usize, fn(&[u8]) -> VscsiFields) = if version == 1 {
        (V1_RECORD, decode_v1)
    } else {
        (V2_RECORD, decode_v2)
    };
    let n = (sample.len() / size).min(4);
    n > 0
        && sample
            .chunks_exact(size)
            .take(n)
            .all(|r| decode(r).ver >> 8 == u16::from(version))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_fields() {
        let mut b = [0u8; 32];
        b[4..8].copy_from_slice(&4096u32.to_le_bytes());
        b[12..14].copy_from_slice(&0x2au16.to_le_bytes());
        b[14..16].copy_from_slice(&0x0100u16.to_le_bytes());
        b[16..24].copy_from_slice(&10u64.to_le_bytes());
        b[24..32].copy_from_slice(&7u64.to_le_bytes());
        let r = to_record(decode_v1(&b), 1).unwrap().unwrap();
        assert_eq!(
            (r.op, r.offset, r.len, r.ts_ns),
            (Op::Write, 5120, 4096, 7000)
        );
        assert!(to_record(decode_v1(&b), 2).is_err());
        assert!(looks_like(&b, 1));
        assert!(!looks_like(&b, 2));
    }
}
