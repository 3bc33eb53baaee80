//! `blkparse` default text output.
//!
//! Event lines look like
//! `maj,min cpu seq sec.nsec pid action rwbs [sector + nsectors] [process]`,
//! e.g. `  8,0    3        1     0.000000000   697  Q  WS 223490 + 8 [jbd2]`.
//!
//! * Only one action is turned into records: **`Q` (queued)** by default —
//!   the request as the submitter issued it, before merging, with its
//!   arrival time and the submitting pid, which is what a write cache
//!   sitting in front of the device sees. [`BlkparseAction::Complete`]
//!   selects `C` (completed, i.e. what the device executed, timestamped at
//!   completion) instead. All other actions are validated and skipped.
//! * RWBS, following the kernel's `blk_fill_rwbs()` and blkparse's
//!   `fill_rwbs()`: an `F` **before** the operation letter is a pre-flush
//!   (`REQ_PREFLUSH`) and yields an [`Op::Flush`] record ahead of the data
//!   record; the operation letter is `R` read, `W` write, `D` discard
//!   ([`Op::Trim`]; `DE` secure erase likewise), `F` a bare flush, `N` none;
//!   an `F` **after** the operation letter is FUA; `A` (read-ahead), `S`
//!   (sync), `M` (metadata) are accepted and not kept; the pre-2.6.36 `B`
//!   (barrier) flag is treated as pre-flush + FUA, which is what a barrier
//!   meant.
//! * A data request with 0 sectors (e.g. the `FWS` empty pre-flush bio that
//!   `fsync` issues, printed with no sector field) only yields its flush.
//! * `dev` = `maj << 20 | min` (Linux `MKDEV` layout), `stream` = pid,
//!   offsets = sector × 512.
//! * Lines that are not events but contain `:` are the summary blkparse
//!   prints at the end (`CPU0 (8,0):`, `Total (8,0):`, `Throughput ...`) and
//!   are ignored; anything else is an error.

use crate::record::{Op, TraceRecord};
use crate::text::{check_extent, parse_scaled, parse_u32, parse_u64, sectors_to_bytes};

/// Which blkparse action becomes a trace record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BlkparseAction {
    /// `Q`: queued (submitted) — the default.
    #[default]
    Queue,
    /// `C`: completed.
    Complete,
}

impl BlkparseAction {
    fn letter(self) -> &'static str {
        match self {
            BlkparseAction::Queue => "Q",
            BlkparseAction::Complete => "C",
        }
    }
}

/// Decoded RWBS string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rwbs {
    /// Flush issued before the data (`F` before the op letter, or `B`).
    pub preflush: bool,
    /// The operation letter: `Some(Read | Write | Trim | Flush)`, `None` for `N`.
    pub op: Option<Op>,
    /// Force Unit Access (`F` after the op letter, or `B`).
    pub fua: bool,
}

/// Parses an RWBS string (see the module docs).
pub(crate) fn parse_rwbs(s: &str) -> Result<Rwbs, String> {
    let b = s.as_bytes();
    let mut i = 0;
    let mut preflush = false;
    if b.len() >= 2 && b[0] == b'F' && matches!(b[1], b'R' | b'W' | b'D' | b'N' | b'F') {
        preflush = true;
        i = 1;
    }
    let op = match b.get(i) {
        Some(b'R') => Some(Op::Read),
        Some(b'W') => Some(Op::Write),
        Some(b'D') => Some(Op::Trim),
        Some(b'F') => Some(Op::Flush),
        Some(b'N') => None,
        _ => return Err(format!("RWBS `{s}` has no R/W/D/F/N operation letter")),
    };
    i += 1;
    if op == Some(Op::Trim) && b.get(i) == Some(&b'E') {
        i += 1;
    }
    let mut fua = false;
    for &c in &b[i..] {
        match c {
            b'F' => fua = true,
            b'A' | b'S' | b'M' => {}
            b'B' => {
                preflush = true;
                fua = true;
            }
            _ => return Err(format!("RWBS `{s}` has unknown flag `{}`", c as char)),
        }
    }
    Ok(Rwbs { preflush, op, fua })
}

/// Line parser state.
#[derive(Debug, Clone)]
pub(crate) struct BlkparseParser {
    action: BlkparseAction,
}

fn parse_dev(tok: &str) -> Option<Result<u32, String>> {
    let (maj, min) = tok.split_once(',')?;
    if maj.is_empty()
        || min.is_empty()
        || !maj.bytes().chain(min.bytes()).all(|b| b.is_ascii_digit())
    {
        return None;
    }
    Some(dev_number(maj, min))
}

fn dev_number(maj: &str, min: &str) -> Result<u32, String> {
    let maj = parse_u32(maj, "major")?;
    let min = parse_u32(min, "minor")?;
    if maj >= 1 << 12 || min >= 1 << 20 {
        return Err(format!("device {maj},{min} does not fit maj<<20|min"));
    }
    Ok(maj << 20 | min)
}

/// `true` when the first token of `line` is a `maj,min` device.
pub(crate) fn is_event_line(line: &str) -> bool {
    line.split_ascii_whitespace()
        .next()
        .and_then(parse_dev)
        .is_some()
}

impl BlkparseParser {
    pub(crate) fn new(action: BlkparseAction) -> Self {
        BlkparseParser { action }
    }

    /// Parses one line, appending 0–2 raw records to `out`.
    pub(crate) fn parse(&mut self, line: &str, out: &mut Vec<TraceRecord>) -> Result<(), String> {
        let mut toks = [""; 11];
        let mut n = 0;
        for t in line.split_ascii_whitespace() {
            if n < toks.len() {
                toks[n] = t;
            }
            n += 1;
        }
        let dev =
            match parse_dev(toks[0]) {
                Some(d) => d?,
                None if line.contains(':') => return Ok(()), // summary section
                None => return Err(
                    "not a blkparse event line (expected `maj,min cpu seq time pid action ...`)"
                        .into(),
                ),
            };
        if n < 6 {
            return Err("blkparse event line has fewer than 6 fields".into());
        }
        parse_u32(toks[1], "cpu")?;
        parse_u64(toks[2], "sequence number")?;
        let ts_ns = parse_scaled(toks[3], 9, "time")?;
        let pid = parse_u32(toks[4], "pid")?;
        if toks[5] != self.action.letter() {
            return Ok(());
        }
        if n < 7 {
            return Err("queue/complete event without RWBS field".into());
        }
        let rwbs = parse_rwbs(toks[6])?;
        let (sector, nsect) = if n >= 10 && toks[7].bytes().all(|b| b.is_ascii_digit()) {
            if toks[8] != "+" {
                return Err(format!("expected `+` after sector, found `{}`", toks[8]));
            }
            (
                parse_u64(toks[7], "sector")?,
                parse_u64(toks[9], "sector count")?,
            )
        } else if n == 7 || toks[7].starts_with('[') {
            (0, 0)
        } else {
            return Err("expected `sector + count` or `[process]` after RWBS".into());
        };
        let offset = sectors_to_bytes(sector, "sector")?;
        let len = sectors_to_bytes(nsect, "sector count")?;
        check_extent(offset, len)?;
        let base = TraceRecord {
            ts_ns,
            op: Op::Flush,
            offset: 0,
            len: 0,
            fua: false,
            dev,
            stream: pid,
        };
        if rwbs.preflush || rwbs.op == Some(Op::Flush) {
            out.push(base);
        }
        if let Some(op @ (Op::Read | Op::Write | Op::Trim)) = rwbs.op {
            if len > 0 {
                out.push(TraceRecord {
                    op,
                    offset,
                    len,
                    fua: rwbs.fua,
                    ..base
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rw(s: &str) -> (bool, Option<Op>, bool) {
        let r = parse_rwbs(s).unwrap();
        (r.preflush, r.op, r.fua)
    }

    #[test]
    fn rwbs_flags() {
        assert_eq!(rw("R"), (false, Some(Op::Read), false));
        assert_eq!(rw("WS"), (false, Some(Op::Write), false));
        assert_eq!(rw("WFS"), (false, Some(Op::Write), true));
        assert_eq!(rw("FWS"), (true, Some(Op::Write), false));
        assert_eq!(rw("FWFSM"), (true, Some(Op::Write), true));
        assert_eq!(rw("F"), (false, Some(Op::Flush), false));
        assert_eq!(rw("FN"), (true, None, false));
        assert_eq!(rw("N"), (false, None, false));
        assert_eq!(rw("D"), (false, Some(Op::Trim), false));
        assert_eq!(rw("DE"), (false, Some(Op::Trim), false));
        assert_eq!(rw("RA"), (false, Some(Op::Read), false));
        assert_eq!(rw("WBS"), (true, Some(Op::Write), true));
        assert!(parse_rwbs("").is_err());
        assert!(parse_rwbs("X").is_err());
        assert!(parse_rwbs("WZ").is_err());
    }

    #[test]
    fn queue_lines() {
        let mut p = BlkparseParser::new(BlkparseAction::Queue);
        let mut out = Vec::new();
        p.parse(
            "  8,16   1   7   1.500000001  42  Q FWFS 100 + 8 [jbd2/sdb1-8]",
            &mut out,
        )
        .unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].op, Op::Flush);
        assert_eq!(
            (
                out[1].op,
                out[1].offset,
                out[1].len,
                out[1].fua,
                out[1].dev,
                out[1].stream
            ),
            (Op::Write, 51200, 4096, true, 8 << 20 | 16, 42)
        );
        assert_eq!(out[1].ts_ns, 1_500_000_001);
        out.clear();
        p.parse("8,0 0 3 2.0 9 C W 100 + 8 [0]", &mut out).unwrap();
        p.parse("8,0 0 3 2.0 9 Q FWS [kworker/0:1]", &mut out)
            .unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].op, Op::Flush);
        p.parse("CPU0 (8,0):", &mut out).unwrap();
        assert!(p.parse("garbage", &mut out).is_err());
        assert!(p.parse("8,0 0 3 2.0 9 Q W 100 - 8 [x]", &mut out).is_err());
        assert!(p
            .parse("5000,0 0 3 2.0 9 Q W 100 + 8 [x]", &mut out)
            .is_err());
    }
}
