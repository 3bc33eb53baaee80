//! Streaming block-trace readers for the nvwc simulator.
//!
//! Every reader streams: it pulls bytes from any [`std::io::Read`] through a
//! fixed-size buffer and never holds the whole trace. gzip and bzip2 input
//! is decompressed transparently (detected from magic bytes), and the trace
//! format is detected from content ([`detect_format`]) unless given
//! ([`Format`] parses from / displays as CLI names).
//!
//! ```no_run
//! use nvwc_trace::{open_path, stats, ReaderOptions};
//! let reader = open_path("trace.csv.gz", None, &ReaderOptions::default())?;
//! println!("{}", stats(reader)?);
//! # Ok::<(), nvwc_trace::TraceError>(())
//! ```
//!
//! # Formats and what they map to
//!
//! All offsets/lengths become bytes, all timestamps nanoseconds.
//!
//! | [`Format`] | input | `op` | `dev` | `stream` |
//! |---|---|---|---|---|
//! | `msr` | `FILETIME(100ns),host,disk,Read/Write,offset B,size B,resp` | Read/Write | disk | 0 |
//! | `spc` | `ASU,LBA(512 B),size B,r/w,seconds[,...]` | Read/Write | ASU | 0 |
//! | `blkparse` | `maj,min cpu seq s.ns pid Q rwbs sector + n [proc]` | see below | `maj<<20\|min` | pid |
//! | `vscsi1` / `vscsi2` | binary, see [`formats::vscsi`] | by SCSI opcode | 0 | 0 |
//! | `cloudphysics` | `version,time(s),op(hex SCSI),size B,lbn(512 B)` | by SCSI opcode | 0 | 0 |
//! | `tencent` | `unix s,offset(512 B),size(512 B),0 read/1 write,volume` | Read/Write | volume | 0 |
//! | `systor17` | `unix s.ns,response,R/W,LUN,offset B,size B` (header) | Read/Write | LUN | 0 |
//! | `heimdall` | `ts_ms dev offset_B size_B op` with op 0 = write, 1 = read | Write/Read | dev | 0 |
//! | `mobigen` | `thread time_us syscall args` file syscalls | see below | 0 | thread |
//! | `compact` | nvwc binary, see [`formats::compact`] | as stored | as stored | as stored |
//!
//! * **SCSI opcodes** (vSCSI, CloudPhysics): READ(6/10/12/16) → Read,
//!   WRITE(6/10/12/16) → Write, SYNCHRONIZE CACHE(10/16) → Flush, others
//!   skipped (counted by [`TraceReader::skipped`]). CloudPhysics CSV `time`
//!   is in **seconds**: the CSV export is the vSCSI trace with the
//!   microsecond timestamp divided by 10^6 (its 113,872 records span
//!   7,200 s, the 2 hours of the vSCSI original).
//! * **blkparse**: only `Q` (queued) events become records by default — the
//!   requests as submitted, with arrival time and submitting pid, before
//!   the block layer merges them ([`ReaderOptions::blkparse_action`] can
//!   select `C` instead). RWBS: `F` before the op letter = pre-flush (a
//!   Flush record precedes the data record), `R`/`W`/`D` = Read/Write/Trim,
//!   `F` after the op letter = FUA, `A`/`S`/`M` ignored. Details in
//!   [`formats::blkparse`].
//! * **MobiGen** file-level traces are mapped onto one virtual device: each
//!   file gets its own 1 TiB region (file *k* at `k << 40`), `read`/`write`
//!   advance a per-fd position, `pread`/`pwrite` use their (unscaled) offset,
//!   `fsync`/`fdatasync` → Flush, `unlink` of a known file → Trim of what
//!   was written to it. The MANIFEST's "pwrite offset was divided by 2^32"
//!   is not borne out by the data (offsets are small, mostly page-aligned
//!   byte offsets), so offsets are used as bytes. Full mapping in
//!   [`formats::mobigen`].
//!
//! # Timestamps
//!
//! Normalised to nanoseconds relative to the first record and kept
//! monotonic: an out-of-order record is clamped to its predecessor's
//! timestamp (counted by [`TraceReader::clamped`]); the optional
//! [`ReaderOptions::reorder_window`] sorts within a bounded window first.
//!
//! # Errors and robustness
//!
//! Errors are [`TraceError`]s naming the input and the line (text) or
//! record and byte offset (binary), with the offending text truncated to
//! [`EXCERPT_CHARS`] characters. Malformed lines are not fatal; I/O and
//! truncation errors are. No input makes a reader panic or allocate without
//! bound (text lines are capped at [`MAX_LINE_BYTES`]).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod binary;
mod detect;
mod error;
mod format;
pub mod formats;
mod reader;
mod record;
mod stats;
mod text;

pub use detect::{
    detect_compression, detect_format, Compression, COMPRESSION_MAGIC_LEN, SNIFF_BYTES, SNIFF_LINES,
};
pub use error::{TraceError, EXCERPT_CHARS};
pub use format::Format;
pub use formats::blkparse::BlkparseAction;
pub use formats::compact::{
    CompactWriter, HEADER_LEN as COMPACT_HEADER_LEN, MAGIC as COMPACT_MAGIC,
    MAX_LEN as COMPACT_MAX_LEN, RECORD_LEN as COMPACT_RECORD_LEN, VERSION as COMPACT_VERSION,
};
pub use formats::mobigen::{MAX_FILES as MOBIGEN_MAX_FILES, REGION_BITS as MOBIGEN_REGION_BITS};
pub use formats::vscsi::{V1_RECORD as VSCSI_V1_RECORD, V2_RECORD as VSCSI_V2_RECORD};
pub use reader::{open_path, open_reader, open_reader_with, ReaderOptions, TraceReader};
pub use record::{Op, TraceRecord};
pub use stats::{stats, SizeBucket, StatsCollector, TraceStats, BLOCK};
pub use text::MAX_LINE_BYTES;

use std::io::{Read, Write};

/// What [`convert`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ConvertSummary {
    /// The input format (given or detected).
    pub format: Format,
    /// Records written.
    pub records: u64,
    /// Records whose timestamp was clamped (see [`TraceReader::clamped`]).
    pub clamped: u64,
    /// Input lines/records skipped as carrying no block request.
    pub skipped: u64,
}

/// Converts a trace in any format (detected when `format` is `None`) to the
/// compact format, streaming.
///
/// Stops at the first error (malformed lines included) and returns it; the
/// output then holds the header and the records before the error. `output`
/// can be `&mut W` to keep ownership.
pub fn convert<W: Write>(
    input: impl Read + Send,
    format: Option<Format>,
    name: &str,
    output: W,
) -> Result<ConvertSummary, TraceError> {
    let mut reader = open_reader(input, format, name)?;
    let format = reader.format();
    let source = reader.source_format().unwrap_or(format);
    let records = write_compact(&mut reader, Some(source), output)?;
    Ok(ConvertSummary {
        format,
        records,
        clamped: reader.clamped(),
        skipped: reader.skipped(),
    })
}

/// Bytes of one libCacheSim `oracleGeneral` record: `u32` time (s), `u64`
/// object id, `u32` object size, `i64` next access (virtual time, `-1`:
/// none), little-endian, packed.
pub const ORACLE_GENERAL_RECORD: usize = 24;

/// Bits of an `oracleGeneral` object id that hold the block number; the
/// device number sits above them, so every (device, block) has its own id.
pub const ORACLE_BLOCK_BITS: u32 = 44;

/// What [`write_oracle_general`] wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OracleSummary {
    /// Trace requests read.
    pub requests: u64,
    /// Records written: one per cache block a read or write touched.
    pub records: u64,
    /// Flush and trim requests (not written: libCacheSim has no such operation).
    pub dropped: u64,
}

/// Writes `records` as libCacheSim `oracleGeneral` records, one per
/// `block_size`-byte block each read or write touches (block `offset / B`
/// to `(offset + len - 1) / B`), object id `dev << 44 | block`, object size
/// `block_size`, time in whole seconds, next access `-1` (libCacheSim's LRU
/// does not use it). Flushes and trims are dropped. This is the per-block
/// view nvwc's caches take, for a like-for-like run of libCacheSim.
/// Caller guarantees `block_size > 0`; a block number above 2^44 or a
/// device above 2^20 is an error.
pub fn write_oracle_general<W: Write>(
    records: impl IntoIterator<Item = Result<TraceRecord, TraceError>>,
    block_size: u64,
    mut output: W,
) -> Result<OracleSummary, TraceError> {
    assert!(
        block_size > 0 && block_size <= u64::from(u32::MAX),
        "block size {block_size}"
    );
    let out_err = |e| TraceError::io("oracleGeneral output", e);
    let mut s = OracleSummary::default();
    let mut buf = [0u8; ORACLE_GENERAL_RECORD];
    for r in records {
        let r = r?;
        s.requests += 1;
        if !r.op.is_data() {
            s.dropped += 1;
            continue;
        }
        if r.len == 0 {
            continue;
        }
        let first = r.offset / block_size;
        let last = (r.offset + r.len - 1) / block_size;
        if last >= 1 << ORACLE_BLOCK_BITS || u64::from(r.dev) >= 1 << (64 - ORACLE_BLOCK_BITS) {
            return Err(TraceError::io(
                "oracleGeneral output",
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "device {} block {last} does not fit a 64-bit object id",
                        r.dev
                    ),
                ),
            ));
        }
        let secs = u32::try_from(r.ts_ns / 1_000_000_000).unwrap_or(u32::MAX);
        for b in first..=last {
            let id = (u64::from(r.dev) << ORACLE_BLOCK_BITS) | b;
            buf[..4].copy_from_slice(&secs.to_le_bytes());
            buf[4..12].copy_from_slice(&id.to_le_bytes());
            buf[12..16].copy_from_slice(&(block_size as u32).to_le_bytes());
            buf[16..24].copy_from_slice(&(-1i64).to_le_bytes());
            output.write_all(&buf).map_err(out_err)?;
            s.records += 1;
        }
    }
    output.flush().map_err(out_err)?;
    Ok(s)
}

/// Writes `records` to `output` in the compact format (header included),
/// stopping at the first error; returns the number of records written.
pub fn write_compact<W: Write>(
    records: impl IntoIterator<Item = Result<TraceRecord, TraceError>>,
    source: Option<Format>,
    output: W,
) -> Result<u64, TraceError> {
    let out_err = |e| TraceError::io("compact output", e);
    let mut w = CompactWriter::new(output, source).map_err(out_err)?;
    for r in records {
        w.write(&r?)?;
    }
    let n = w.records();
    w.finish().map_err(out_err)?;
    Ok(n)
}
