//! [`TraceReader`]: the streaming iterator every format is read through.

use crate::detect::{detect, detect_compression, Compression, COMPRESSION_MAGIC_LEN, SNIFF_BYTES};
use crate::error::TraceError;
use crate::format::Format;
use crate::formats::blkparse::{BlkparseAction, BlkparseParser};
use crate::formats::compact::CompactReader;
use crate::formats::csv;
use crate::formats::mobigen::MobigenParser;
use crate::formats::vscsi::VscsiReader;
use crate::record::TraceRecord;
use crate::text::{LineError, LineSource};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Cursor, Read};
use std::path::Path;

/// Buffer between the (decompressed) input and the parsers.
const READ_BUFFER: usize = 256 * 1024;

/// Knobs for [`open_reader_with`]. `Default` gives the behaviour of
/// [`open_reader`].
#[derive(Debug, Clone, Default)]
pub struct ReaderOptions {
    /// Which blkparse action becomes a record (default: `Q`, queued).
    pub blkparse_action: BlkparseAction,
    /// Reorder window in records (default 0 = off). When non-zero the
    /// reader keeps up to this many records ordered by raw timestamp (ties
    /// in input order) and releases the earliest, so
    /// out-of-order input whose displacement is within the window comes out
    /// sorted. Memory is bounded by the window. Records arriving later than
    /// an already released one are still clamped (see [`TraceReader`]).
    pub reorder_window: usize,
}

/// Keeps timestamps relative to the first released record and monotonic.
#[derive(Debug, Clone, Default)]
struct TsNormalizer {
    origin: Option<u64>,
    last: u64,
    clamped: u64,
}

impl TsNormalizer {
    #[inline]
    fn apply(&mut self, raw: u64) -> u64 {
        let origin = *self.origin.get_or_insert(raw);
        let rel = raw.saturating_sub(origin);
        if raw < origin || rel < self.last {
            self.clamped += 1;
            self.last
        } else {
            self.last = rel;
            rel
        }
    }
}

enum LineParser {
    Msr,
    Spc,
    CloudPhysics,
    Tencent,
    Systor,
    Heimdall,
    Blkparse(BlkparseParser),
    Mobigen(Box<MobigenParser>),
}

impl LineParser {
    fn new(format: Format, opts: &ReaderOptions) -> Option<Self> {
        Some(match format {
            Format::Msr => LineParser::Msr,
            Format::Spc => LineParser::Spc,
            Format::CloudPhysics => LineParser::CloudPhysics,
            Format::Tencent => LineParser::Tencent,
            Format::Systor17 => LineParser::Systor,
            Format::Heimdall => LineParser::Heimdall,
            Format::Blkparse => LineParser::Blkparse(BlkparseParser::new(opts.blkparse_action)),
            Format::Mobigen => LineParser::Mobigen(Box::default()),
            Format::VscsiV1 | Format::VscsiV2 | Format::Compact => return None,
        })
    }

    /// CSV formats may start with a header line (first content line starting
    /// with a letter).
    fn may_have_header(&self) -> bool {
        matches!(
            self,
            LineParser::Msr
                | LineParser::Spc
                | LineParser::CloudPhysics
                | LineParser::Tencent
                | LineParser::Systor
        )
    }

    fn parse(&mut self, line: &str, out: &mut Vec<TraceRecord>) -> Result<(), String> {
        let one = match self {
            LineParser::Msr => csv::parse_msr(line)?,
            LineParser::Spc => csv::parse_spc(line)?,
            LineParser::CloudPhysics => csv::parse_cloudphysics(line)?,
            LineParser::Tencent => csv::parse_tencent(line)?,
            LineParser::Systor => csv::parse_systor(line)?,
            LineParser::Heimdall => csv::parse_heimdall(line)?,
            LineParser::Blkparse(p) => return p.parse(line, out),
            LineParser::Mobigen(p) => return p.parse(line, out),
        };
        out.extend(one);
        Ok(())
    }
}

struct TextSource<'a> {
    lines: LineSource<'a>,
    parser: LineParser,
    pending: Vec<TraceRecord>,
    pending_pos: usize,
    seen_content: bool,
    skipped: u64,
}

impl TextSource<'_> {
    fn next_raw(&mut self, name: &str) -> Option<Result<TraceRecord, TraceError>> {
        loop {
            if let Some(r) = self.pending.get(self.pending_pos) {
                self.pending_pos += 1;
                return Some(Ok(*r));
            }
            self.pending.clear();
            self.pending_pos = 0;
            let (no, line) = match self.lines.next_line() {
                Ok(None) => return None,
                Ok(Some(l)) => l,
                Err(LineError::Io(e)) => return Some(Err(TraceError::io(name, e))),
                Err(LineError::Bad { line, reason, text }) => {
                    return Some(Err(TraceError::parse(name, line, reason, &text)))
                }
            };
            let t = line.trim();
            if t.is_empty() || t.starts_with('#') {
                continue;
            }
            if !self.seen_content {
                self.seen_content = true;
                if self.parser.may_have_header() && t.starts_with(|c: char| c.is_ascii_alphabetic())
                {
                    continue;
                }
            }
            match self.parser.parse(t, &mut self.pending) {
                Ok(()) => {
                    if self.pending.is_empty() {
                        self.skipped += 1;
                    }
                }
                Err(reason) => return Some(Err(TraceError::parse(name, no, reason, line))),
            }
        }
    }
}

enum Source<'a> {
    Text(Box<TextSource<'a>>),
    Vscsi(VscsiReader<'a>),
    Compact(CompactReader<'a>),
}

impl Source<'_> {
    /// A record already decoded into a batch, without touching the input.
    #[inline]
    fn next_buffered(&mut self) -> Option<TraceRecord> {
        match self {
            Source::Compact(c) => c.next_buffered(),
            Source::Vscsi(v) => v.next_buffered(),
            Source::Text(_) => None,
        }
    }

    #[inline]
    fn next_raw(&mut self, name: &str) -> Option<Result<TraceRecord, TraceError>> {
        match self {
            Source::Compact(c) => c.next_raw(name),
            Source::Vscsi(v) => v.next_raw(name),
            Source::Text(t) => t.next_raw(name),
        }
    }
}

/// A streaming trace reader: an iterator of [`TraceRecord`]s.
///
/// Created by [`open_reader`], [`open_reader_with`] or [`open_path`]. It
/// holds a bounded amount of memory (a read buffer, one line, the reorder
/// window if enabled, and for MobiGen the fd/file tables) whatever the trace
/// size.
///
/// **Timestamps.** Each record's `ts_ns` is its source timestamp converted
/// to nanoseconds minus that of the first record released. A record whose
/// timestamp is earlier than the previous released record's is **clamped**
/// to the previous value (the disorder is counted by
/// [`TraceReader::clamped`]), so output timestamps never decrease and the
/// request order of the file is kept. Records earlier than the first one
/// therefore get 0. Real traces do this: SYSTOR'17 and Tencent files are
/// only roughly sorted, and MobiGen files are grouped per thread; enable
/// [`ReaderOptions::reorder_window`] to sort within a bounded window instead.
///
/// **Errors.** A malformed line or record yields `Some(Err(_))` naming the
/// input and line (or record); polling again continues with the next one. An
/// I/O error, a decompression error or a truncated binary record yields one
/// error for which [`TraceError::is_fatal`] is true, after which the
/// iterator returns `None` (once the reorder window, if any, is drained).
/// Readers never panic, whatever the input.
pub struct TraceReader<'a> {
    name: String,
    format: Format,
    compression: Compression,
    source: Source<'a>,
    norm: TsNormalizer,
    window: usize,
    /// The reorder window: records by (raw timestamp, arrival number).
    pending: BTreeMap<(u64, u64), TraceRecord>,
    seq: u64,
    source_done: bool,
}

impl TraceReader<'_> {
    /// The input name given when opening.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The format being read (given or detected).
    pub fn format(&self) -> Format {
        self.format
    }

    /// The decompression applied.
    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// For compact traces, the format they were converted from (if recorded).
    pub fn source_format(&self) -> Option<Format> {
        match &self.source {
            Source::Compact(c) => c.source,
            _ => None,
        }
    }

    /// Records released so far whose timestamp had to be clamped because it
    /// was earlier than the previous record's.
    pub fn clamped(&self) -> u64 {
        self.norm.clamped
    }

    /// Input lines / binary records read so far that were valid but carried
    /// no block request: blkparse events other than the selected action and
    /// blkparse's closing summary lines, MobiGen syscalls that move no data
    /// (`open`, `close`, `stat64`, zero-byte I/O, ...), SCSI commands other
    /// than read/write/synchronize-cache. Headers, blank and `#` lines are
    /// not counted. Malformed lines are not counted either (they are errors).
    pub fn skipped(&self) -> u64 {
        match &self.source {
            Source::Text(t) => t.skipped,
            Source::Vscsi(v) => v.skipped(),
            Source::Compact(_) => 0,
        }
    }

    #[inline]
    fn pull(&mut self) -> Option<Result<TraceRecord, TraceError>> {
        if self.source_done {
            return None;
        }
        let got = self.source.next_raw(&self.name);
        match &got {
            None => self.source_done = true,
            Some(Err(e)) if e.is_fatal() => self.source_done = true,
            _ => {}
        }
        got
    }
}

impl Iterator for TraceReader<'_> {
    type Item = Result<TraceRecord, TraceError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.window == 0 {
            if let Some(mut r) = self.source.next_buffered() {
                r.ts_ns = self.norm.apply(r.ts_ns);
                return Some(Ok(r));
            }
            return match self.pull()? {
                Ok(mut r) => {
                    r.ts_ns = self.norm.apply(r.ts_ns);
                    Some(Ok(r))
                }
                Err(e) => Some(Err(e)),
            };
        }
        while self.pending.len() <= self.window {
            match self.pull() {
                None => break,
                Some(Err(e)) => return Some(Err(e)),
                Some(Ok(rec)) => {
                    self.seq += 1;
                    self.pending.insert((rec.ts_ns, self.seq), rec);
                }
            }
        }
        let (_, mut rec) = self.pending.pop_first()?;
        rec.ts_ns = self.norm.apply(rec.ts_ns);
        Some(Ok(rec))
    }
}

/// Reads from `r` until `buf` holds `want` bytes or the input ends; returns
/// whether the input ended.
fn fill(r: &mut dyn Read, buf: &mut Vec<u8>, want: usize) -> io::Result<bool> {
    let mut chunk = [0u8; 4096];
    while buf.len() < want {
        let room = (want - buf.len()).min(chunk.len());
        match r.read(&mut chunk[..room]) {
            Ok(0) => return Ok(true),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

/// Opens a streaming reader over any [`Read`] with default options.
///
/// * `input`: the raw (possibly gzip- or bzip2-compressed) trace bytes;
///   decompression is detected from the magic bytes.
/// * `format`: `Some` to force a format, `None` to detect it from the first
///   [`SNIFF_BYTES`] decompressed bytes ([`crate::detect_format`]).
/// * `name`: how errors refer to the input (usually the file path).
///
/// Fails (with a fatal error naming `name`) only if the first bytes cannot
/// be read or decompressed, detection finds no format, or a compact header
/// is invalid; all later problems are reported by the iterator. Never
/// panics, whatever `input` contains — fuzz targets can call it directly.
pub fn open_reader<'a>(
    input: impl Read + Send + 'a,
    format: Option<Format>,
    name: &str,
) -> Result<TraceReader<'a>, TraceError> {
    open_reader_with(input, format, name, &ReaderOptions::default())
}

/// [`open_reader`] with explicit [`ReaderOptions`].
pub fn open_reader_with<'a>(
    input: impl Read + Send + 'a,
    format: Option<Format>,
    name: &str,
    options: &ReaderOptions,
) -> Result<TraceReader<'a>, TraceError> {
    let mut input = input;
    let mut head = Vec::with_capacity(COMPRESSION_MAGIC_LEN);
    fill(&mut input, &mut head, COMPRESSION_MAGIC_LEN).map_err(|e| TraceError::io(name, e))?;
    let compression = detect_compression(&head);
    let raw: Box<dyn Read + Send + 'a> = Box::new(Cursor::new(head).chain(input));
    let mut plain: Box<dyn Read + Send + 'a> = match compression {
        Compression::None => raw,
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(raw)),
        Compression::Bzip2 => Box::new(bzip2::read::MultiBzDecoder::new(raw)),
    };
    let mut sample = Vec::with_capacity(SNIFF_BYTES);
    let eof = fill(&mut plain, &mut sample, SNIFF_BYTES).map_err(|e| TraceError::io(name, e))?;
    let format = match format {
        Some(f) => f,
        None => detect(&sample, eof).map_err(|reason| TraceError::UnknownFormat {
            file: name.to_owned(),
            reason,
        })?,
    };
    let buffered: Box<dyn BufRead + Send + 'a> = Box::new(BufReader::with_capacity(
        READ_BUFFER,
        Cursor::new(sample).chain(plain),
    ));
    let source = match format {
        Format::Compact => Source::Compact(CompactReader::new(buffered, name)?),
        Format::VscsiV1 => Source::Vscsi(VscsiReader::new(buffered, 1)),
        Format::VscsiV2 => Source::Vscsi(VscsiReader::new(buffered, 2)),
        text => Source::Text(Box::new(TextSource {
            lines: LineSource::new(buffered),
            parser: LineParser::new(text, options).ok_or_else(|| TraceError::UnknownFormat {
                file: name.to_owned(),
                reason: format!("{text} is not a text format"),
            })?,
            pending: Vec::with_capacity(4),
            pending_pos: 0,
            seen_content: false,
            skipped: 0,
        })),
    };
    Ok(TraceReader {
        name: name.to_owned(),
        format,
        compression,
        source,
        norm: TsNormalizer::default(),
        window: options.reorder_window,
        pending: BTreeMap::new(),
        seq: 0,
        source_done: false,
    })
}

/// Opens the file at `path` (named by its display form in errors).
pub fn open_path(
    path: impl AsRef<Path>,
    format: Option<Format>,
    options: &ReaderOptions,
) -> Result<TraceReader<'static>, TraceError> {
    let path = path.as_ref();
    let name = path.display().to_string();
    let file = File::open(path).map_err(|e| TraceError::io(&name, e))?;
    open_reader_with(file, format, &name, options)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizer_clamps() {
        let mut n = TsNormalizer::default();
        let out: Vec<u64> = [100, 150, 120, 90, 200]
            .iter()
            .map(|&t| n.apply(t))
            .collect();
        assert_eq!(out, [0, 50, 50, 50, 100]);
        assert_eq!(n.clamped, 2);
    }
}
