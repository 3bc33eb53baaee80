//! The stateless line formats: MSR Cambridge, SPC, CloudPhysics CSV,
//! Tencent CBS, SYSTOR'17 and Heimdall.
//!
//! Each `parse_*` function turns one content line into at most one record
//! whose `ts_ns` is still the *raw absolute* timestamp in nanoseconds (the
//! reader normalises it). `Ok(None)` means the line is valid but carries no
//! block request (e.g. a SCSI command that is neither a read nor a write).

use crate::formats::scsi_op;
use crate::record::{Op, TraceRecord};
use crate::text::{
    check_extent, parse_hex_u16, parse_scaled, parse_u32, parse_u64, sectors_to_bytes,
    split_at_least, split_exact,
};

/// Nanoseconds per Windows FILETIME tick (100 ns).
const FILETIME_TICK_NS: u64 = 100;

fn rec(ts_ns: u64, op: Op, offset: u64, len: u64, dev: u32) -> Result<TraceRecord, String> {
    check_extent(offset, len)?;
    Ok(TraceRecord::new(ts_ns, op, offset, len, dev))
}

/// `Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime`.
///
/// Timestamp is a Windows FILETIME (100 ns ticks); Type is `Read`/`Write`
/// (any case); offset and size are bytes; `dev` = DiskNumber; the hostname
/// and response time are validated but not kept.
pub(crate) fn parse_msr(line: &str) -> Result<Option<TraceRecord>, String> {
    let [ts, _host, disk, kind, offset, size, resp] = split_exact::<7>(line, ',')?;
    let ticks = parse_u64(ts, "timestamp")?;
    let ts_ns = ticks
        .checked_mul(FILETIME_TICK_NS)
        .ok_or_else(|| format!("timestamp {ticks} overflows 64-bit nanoseconds"))?;
    let dev = parse_u32(disk, "disk number")?;
    let op = if kind.eq_ignore_ascii_case("read") {
        Op::Read
    } else if kind.eq_ignore_ascii_case("write") {
        Op::Write
    } else {
        return Err(format!("type `{kind}` is neither Read nor Write"));
    };
    let offset = parse_u64(offset, "offset")?;
    let len = parse_u64(size, "size")?;
    parse_u64(resp, "response time")?;
    rec(ts_ns, op, offset, len, dev).map(Some)
}

/// `ASU,LBA,Size,Opcode,Timestamp[,...]`: LBA in 512-byte sectors, size in
/// bytes, opcode `r`/`R`/`w`/`W`, timestamp in seconds (decimal). Extra
/// trailing fields (allowed by the SPC spec) are ignored. `dev` = ASU.
pub(crate) fn parse_spc(line: &str) -> Result<Option<TraceRecord>, String> {
    let [asu, lba, size, opcode, ts] = split_at_least::<5>(line, ',')?;
    let dev = parse_u32(asu, "ASU")?;
    let offset = sectors_to_bytes(parse_u64(lba, "LBA")?, "LBA")?;
    let len = parse_u64(size, "size")?;
    let op = match opcode {
        "r" | "R" => Op::Read,
        "w" | "W" => Op::Write,
        _ => return Err(format!("opcode `{opcode}` is not r/R/w/W")),
    };
    let ts_ns = parse_scaled(ts, 9, "timestamp")?;
    rec(ts_ns, op, offset, len, dev).map(Some)
}

/// `version,time,op,size,lbn`: time in seconds (the CloudPhysics CSV export
/// divides the vSCSI microsecond timestamp by 10^6), op a hex SCSI opcode
/// (see [`scsi_op`]), size in bytes, lbn in 512-byte sectors. `dev` = 0.
pub(crate) fn parse_cloudphysics(line: &str) -> Result<Option<TraceRecord>, String> {
    let [version, time, op, size, lbn] = split_exact::<5>(line, ',')?;
    parse_u32(version, "version")?;
    let ts_ns = parse_scaled(time, 9, "time")?;
    let opcode = parse_hex_u16(op, "opcode")?;
    let len = parse_u64(size, "size")?;
    let offset = sectors_to_bytes(parse_u64(lbn, "lbn")?, "lbn")?;
    match scsi_op(opcode) {
        None => Ok(None),
        Some(Op::Flush) => Ok(Some(TraceRecord::flush(ts_ns, 0))),
        Some(op) => rec(ts_ns, op, offset, len, 0).map(Some),
    }
}

/// `Timestamp,Offset,Size,IOType,VolumeID`: unix seconds, offset and size in
/// 512-byte sectors, IOType `0` = read / `1` = write, `dev` = VolumeID.
pub(crate) fn parse_tencent(line: &str) -> Result<Option<TraceRecord>, String> {
    let [ts, offset, size, kind, volume] = split_exact::<5>(line, ',')?;
    let ts_ns = parse_scaled(ts, 9, "timestamp")?;
    let offset = sectors_to_bytes(parse_u64(offset, "offset")?, "offset")?;
    let len = sectors_to_bytes(parse_u64(size, "size")?, "size")?;
    let op = match kind {
        "0" => Op::Read,
        "1" => Op::Write,
        _ => return Err(format!("IOType `{kind}` is not 0 (read) or 1 (write)")),
    };
    let dev = parse_u32(volume, "volume id")?;
    rec(ts_ns, op, offset, len, dev).map(Some)
}

/// `Timestamp,Response,IOType,LUN,Offset,Size`: unix seconds (decimal),
/// response time in seconds (validated, not kept), IOType `R`/`W` (any
/// case), `dev` = LUN, offset and size in bytes.
pub(crate) fn parse_systor(line: &str) -> Result<Option<TraceRecord>, String> {
    let [ts, resp, kind, lun, offset, size] = split_exact::<6>(line, ',')?;
    let ts_ns = parse_scaled(ts, 9, "timestamp")?;
    parse_scaled(resp, 9, "response time")?;
    let op = match kind {
        "R" | "r" => Op::Read,
        "W" | "w" => Op::Write,
        _ => return Err(format!("IOType `{kind}` is not R or W")),
    };
    let dev = parse_u32(lun, "LUN")?;
    let offset = parse_u64(offset, "offset")?;
    let len = parse_u64(size, "size")?;
    rec(ts_ns, op, offset, len, dev).map(Some)
}

/// `ts dev offset size op` separated by white space: ts in milliseconds
/// (decimal), offset and size in bytes, op `0` = write / `1` = read.
pub(crate) fn parse_heimdall(line: &str) -> Result<Option<TraceRecord>, String> {
    let mut it = line.split_ascii_whitespace();
    let mut f = [""; 5];
    for slot in f.iter_mut() {
        *slot = it
            .next()
            .ok_or("expected 5 fields: ts_ms dev offset size op")?;
    }
    if it.next().is_some() {
        return Err("expected 5 fields: ts_ms dev offset size op, found more".into());
    }
    let [ts, dev, offset, size, op] = f;
    let ts_ns = parse_scaled(ts, 6, "timestamp (ms)")?;
    let dev = parse_u32(dev, "device")?;
    let offset = parse_u64(offset, "offset")?;
    let len = parse_u64(size, "size")?;
    let op = match op {
        "0" => Op::Write,
        "1" => Op::Read,
        _ => return Err(format!("op `{op}` is not 0 (write) or 1 (read)")),
    };
    rec(ts_ns, op, offset, len, dev).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msr_line() {
        let r = parse_msr("128166385295514663,hm,1,Write,9056014336,2048,2833")
            .unwrap()
            .unwrap();
        assert_eq!(r.ts_ns, 12_816_638_529_551_466_300);
        assert_eq!(
            (r.op, r.offset, r.len, r.dev),
            (Op::Write, 9056014336, 2048, 1)
        );
        assert!(parse_msr("1,hm,0,Erase,0,1,1").is_err());
        assert!(parse_msr("999999999999999999,hm,0,Read,0,1,1").is_err());
    }

    #[test]
    fn cloudphysics_ops() {
        let r = parse_cloudphysics("1,12,28,4096,8").unwrap().unwrap();
        assert_eq!(
            (r.op, r.offset, r.len, r.ts_ns),
            (Op::Read, 4096, 4096, 12_000_000_000)
        );
        let f = parse_cloudphysics("1,1,35,0,0").unwrap().unwrap();
        assert_eq!(f.op, Op::Flush);
        assert_eq!(parse_cloudphysics("1,1,12,36,0").unwrap(), None);
    }

    #[test]
    fn heimdall_ops_are_inverted() {
        assert_eq!(
            parse_heimdall("1.5 0 0 512 0").unwrap().unwrap().op,
            Op::Write
        );
        assert_eq!(
            parse_heimdall("1.5 0 0 512 1").unwrap().unwrap().op,
            Op::Read
        );
        assert!(parse_heimdall("1.5 0 0 512 2").is_err());
        assert!(parse_heimdall("1.5 0 0 512").is_err());
        assert!(parse_heimdall("1.5 0 0 512 1 9").is_err());
    }

    #[test]
    fn extent_overflow_is_an_error() {
        assert!(parse_systor("1,0,W,0,18446744073709551615,2").is_err());
        assert!(parse_tencent("1,36028797018963968,1,1,1").is_err());
    }
}
