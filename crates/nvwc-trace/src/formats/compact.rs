//! nvwc's compact binary trace format (version 1).
//!
//! Designed to be read at memory speed: a 32-byte header followed by
//! fixed-width 32-byte little-endian records, so decoding is a handful of
//! loads per record with no parsing, and record *i* sits at byte
//! `header_len + i * record_size` (time-based seeks by binary search work
//! on a file).
//!
//! ## Header (32 bytes)
//!
//! | bytes | field | value |
//! |---|---|---|
//! | 0..8 | magic | `89 'N' 'V' 'W' 'C' '\r' '\n' 1A` ([`MAGIC`]; the high-bit byte, CRLF and ^Z catch 7-bit, newline-translating and text-mode transfers, PNG-style) |
//! | 8..10 | version | `u16` = 1 |
//! | 10..12 | header_len | `u16` ≥ 32: bytes before the first record (readers skip any extension) |
//! | 12..14 | record_size | `u16` ≥ 32: bytes per record (readers ignore bytes past 32) |
//! | 14..16 | source | `u16` [`crate::Format::id`] of the trace this was converted from, 0 if unknown |
//! | 16..32 | reserved | written as 0, ignored by version-1 readers |
//!
//! Readers accept `header_len` and `record_size` up to 4096 so that later
//! versions can append fields without breaking old readers.
//!
//! ## Record (32 bytes)
//!
//! | bytes | field | meaning |
//! |---|---|---|
//! | 0..8 | `ts_ns` | `u64` nanoseconds since the first record — **absolute, not a delta**: a corrupt record cannot shift every later timestamp, and fixed-width absolute times allow binary search by time; 8 bytes cover 584 years |
//! | 8..16 | `offset` | `u64` bytes |
//! | 16..20 | `len_lo` | low 32 bits of the length in bytes |
//! | 20 | `op` | [`Op::code`]: 0 read, 1 write, 2 flush, 3 trim |
//! | 21 | `flags` | bit 0 = FUA; other bits must be 0 |
//! | 22..24 | `len_hi` | bits 32..47 of the length (lengths up to 256 TiB, for whole-device trims) |
//! | 24..28 | `dev` | `u32` volume / disk id |
//! | 28..32 | `stream` | `u32` pid / tid / stream hint, 0 if unknown |
//!
//! A flush has offset and length 0. A file ending inside a record is
//! reported as truncated.

use crate::binary::{u16_at, u32_at, u64_at, Batched, FixedRecords};
use crate::error::TraceError;
use crate::format::Format;
use crate::record::{Op, TraceRecord};
use std::io::{self, BufRead, BufWriter, Write};

/// The 8 magic bytes that open every compact trace.
pub const MAGIC: [u8; 8] = [0x89, b'N', b'V', b'W', b'C', b'\r', b'\n', 0x1a];
/// The format version this crate writes and reads.
pub const VERSION: u16 = 1;
/// Header size written by this crate.
pub const HEADER_LEN: usize = 32;
/// Record size written by this crate.
pub const RECORD_LEN: usize = 32;
/// Largest length a record can carry (`2^48 - 1` bytes).
pub const MAX_LEN: u64 = (1 << 48) - 1;
/// Largest `header_len` / `record_size` a reader accepts.
const MAX_EXTENSIBLE: usize = 4096;
const FLAG_FUA: u8 = 1;

/// Encodes one record; the caller has checked `r.len <= MAX_LEN`.
#[inline]
pub(crate) fn encode(r: &TraceRecord) -> [u8; RECORD_LEN] {
    let mut b = [0u8; RECORD_LEN];
    b[0..8].copy_from_slice(&r.ts_ns.to_le_bytes());
    b[8..16].copy_from_slice(&r.offset.to_le_bytes());
    b[16..20].copy_from_slice(&(r.len as u32).to_le_bytes());
    b[20] = r.op.code();
    b[21] = if r.fua { FLAG_FUA } else { 0 };
    b[22..24].copy_from_slice(&((r.len >> 32) as u16).to_le_bytes());
    b[24..28].copy_from_slice(&r.dev.to_le_bytes());
    b[28..32].copy_from_slice(&r.stream.to_le_bytes());
    b
}

/// Decodes one record (at least [`RECORD_LEN`] bytes).
#[inline(always)]
pub(crate) fn decode(b: &[u8]) -> Result<TraceRecord, String> {
    let op = Op::from_code(b[20]).ok_or_else(|| format!("unknown op code {}", b[20]))?;
    let flags = b[21];
    if flags & !FLAG_FUA != 0 {
        return Err(format!("unknown flag bits {flags:#04x}"));
    }
    let offset = u64_at(b, 8);
    let len = u64::from(u32_at(b, 16)) | u64::from(u16_at(b, 22)) << 32;
    if offset.checked_add(len).is_none() {
        return Err(format!("offset {offset} + length {len} overflows 64 bits"));
    }
    if op == Op::Flush && (offset != 0 || len != 0) {
        return Err(format!("flush with offset {offset} and length {len}"));
    }
    Ok(TraceRecord {
        ts_ns: u64_at(b, 0),
        op,
        offset,
        len,
        fua: flags & FLAG_FUA != 0,
        dev: u32_at(b, 24),
        stream: u32_at(b, 28),
    })
}

/// Writes a compact trace to any [`Write`], buffering internally.
///
/// The header is written by [`CompactWriter::new`]; call
/// [`CompactWriter::finish`] to flush (dropping the writer also flushes, but
/// loses any error).
pub struct CompactWriter<W: Write> {
    out: BufWriter<W>,
    records: u64,
}

impl<W: Write> CompactWriter<W> {
    /// Writes the header. `source` is remembered in the header as the
    /// format the records came from.
    pub fn new(out: W, source: Option<Format>) -> io::Result<Self> {
        let mut out = BufWriter::with_capacity(1 << 16, out);
        let mut h = [0u8; HEADER_LEN];
        h[0..8].copy_from_slice(&MAGIC);
        h[8..10].copy_from_slice(&VERSION.to_le_bytes());
        h[10..12].copy_from_slice(&(HEADER_LEN as u16).to_le_bytes());
        h[12..14].copy_from_slice(&(RECORD_LEN as u16).to_le_bytes());
        h[14..16].copy_from_slice(&source.map_or(0, Format::id).to_le_bytes());
        out.write_all(&h)?;
        Ok(CompactWriter { out, records: 0 })
    }

    /// Appends one record. Fails with [`TraceError::Unwritable`] (writing
    /// nothing) if `len > MAX_LEN`, `offset + len` overflows, or a flush has
    /// a non-zero offset or length; with [`TraceError::Io`] if the output
    /// fails.
    pub fn write(&mut self, r: &TraceRecord) -> Result<(), TraceError> {
        let n = self.records + 1;
        let bad = |reason: String| TraceError::Unwritable { record: n, reason };
        if r.len > MAX_LEN {
            return Err(bad(format!("length {} exceeds {MAX_LEN}", r.len)));
        }
        if r.offset.checked_add(r.len).is_none() {
            return Err(bad(format!(
                "offset {} + length {} overflows",
                r.offset, r.len
            )));
        }
        if r.op == Op::Flush && (r.offset != 0 || r.len != 0) {
            return Err(bad("flush records must have offset 0 and length 0".into()));
        }
        self.out
            .write_all(&encode(r))
            .map_err(|e| TraceError::io("compact output", e))?;
        self.records = n;
        Ok(())
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Flushes the buffer and returns the underlying writer.
    pub fn finish(self) -> io::Result<W> {
        self.out.into_inner().map_err(|e| e.into_error())
    }
}

/// Streaming compact reader.
pub(crate) struct CompactReader<'a> {
    src: Batched<'a>,
    pub(crate) source: Option<Format>,
}

impl<'a> CompactReader<'a> {
    /// Reads and checks the header.
    pub(crate) fn new(
        mut inner: Box<dyn BufRead + Send + 'a>,
        name: &str,
    ) -> Result<Self, TraceError> {
        let header_err = |reason: String| TraceError::Header {
            file: name.to_owned(),
            reason,
        };
        let mut h = [0u8; HEADER_LEN];
        let n = read_full(&mut inner, &mut h).map_err(|e| TraceError::io(name, e))?;
        let m = n.min(MAGIC.len());
        if h[..m] != MAGIC[..m] || n == 0 {
            return Err(header_err(
                "magic bytes missing (not an nvwc compact trace)".into(),
            ));
        }
        if n < HEADER_LEN {
            return Err(header_err(format!(
                "input has only {n} bytes, the header needs {HEADER_LEN}"
            )));
        }
        let version = u16_at(&h, 8);
        if version != VERSION {
            return Err(header_err(format!(
                "unsupported version {version} (this reader knows {VERSION})"
            )));
        }
        let header_len = usize::from(u16_at(&h, 10));
        let record_size = usize::from(u16_at(&h, 12));
        if !(HEADER_LEN..=MAX_EXTENSIBLE).contains(&header_len) {
            return Err(header_err(format!(
                "header length {header_len} outside {HEADER_LEN}..={MAX_EXTENSIBLE}"
            )));
        }
        if !(RECORD_LEN..=MAX_EXTENSIBLE).contains(&record_size) {
            return Err(header_err(format!(
                "record size {record_size} outside {RECORD_LEN}..={MAX_EXTENSIBLE}"
            )));
        }
        let mut ext = vec![0u8; header_len - HEADER_LEN];
        let n = read_full(&mut inner, &mut ext).map_err(|e| TraceError::io(name, e))?;
        if n < ext.len() {
            return Err(header_err(format!(
                "header truncated: {} of {header_len} bytes",
                HEADER_LEN + n
            )));
        }
        Ok(CompactReader {
            src: Batched::new(FixedRecords::new(inner, record_size, header_len as u64)),
            source: Format::from_id(u16_at(&h, 14)),
        })
    }

    /// Next record of the current batch, if any.
    #[inline]
    pub(crate) fn next_buffered(&mut self) -> Option<TraceRecord> {
        self.src.next_buffered()
    }

    /// Next record (timestamps as stored).
    #[inline]
    pub(crate) fn next_raw(&mut self, name: &str) -> Option<Result<TraceRecord, TraceError>> {
        self.src.next_raw(name, |b| decode(b).map(Some))
    }
}

/// Reads until `buf` is full or end of input; returns the bytes read.
fn read_full(r: &mut dyn BufRead, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_decode_round_trip() {
        let r = TraceRecord {
            ts_ns: u64::MAX - 1,
            op: Op::Trim,
            offset: 1 << 50,
            len: MAX_LEN,
            fua: true,
            dev: u32::MAX,
            stream: 77,
        };
        assert_eq!(decode(&encode(&r)).unwrap(), r);
        let mut b = encode(&r);
        b[20] = 9;
        assert!(decode(&b).is_err());
        let mut b = encode(&r);
        b[21] = 2;
        assert!(decode(&b).is_err());
    }

    #[test]
    fn writer_rejects_unrepresentable_records() {
        let mut w = CompactWriter::new(Vec::new(), None).unwrap();
        let mut r = TraceRecord::new(0, Op::Write, 0, MAX_LEN + 1, 0);
        assert!(matches!(
            w.write(&r),
            Err(TraceError::Unwritable { record: 1, .. })
        ));
        r.len = 1;
        r.offset = u64::MAX;
        assert!(w.write(&r).is_err());
        let f = TraceRecord {
            offset: 5,
            ..TraceRecord::flush(0, 0)
        };
        assert!(w.write(&f).is_err());
        assert_eq!(w.records(), 0);
        assert_eq!(w.finish().unwrap().len(), HEADER_LEN);
    }
}
