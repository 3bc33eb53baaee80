//! Compression and format detection from content.

use crate::format::Format;
use crate::formats::blkparse::{is_event_line, BlkparseAction, BlkparseParser};
use crate::formats::mobigen::{MobigenParser, KNOWN_SYSCALLS};
use crate::formats::{compact, csv, vscsi};
use serde::Serialize;
use std::fmt;

/// Transparent decompression applied before format detection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Plain input.
    None,
    /// gzip (magic `1f 8b 08`); concatenated members are all read.
    Gzip,
    /// bzip2 (magic `BZh1`..`BZh9`); concatenated streams are all read.
    Bzip2,
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Bzip2 => "bzip2",
        })
    }
}

/// Bytes needed by [`detect_compression`].
pub const COMPRESSION_MAGIC_LEN: usize = 4;

/// Recognises gzip and bzip2 by their magic bytes at the start of `head`.
pub fn detect_compression(head: &[u8]) -> Compression {
    match head {
        [0x1f, 0x8b, 0x08, ..] => Compression::Gzip,
        [b'B', b'Z', b'h', b'1'..=b'9', ..] => Compression::Bzip2,
        _ => Compression::None,
    }
}

/// Most (decompressed) bytes [`crate::open_reader`] inspects to detect the
/// format.
pub const SNIFF_BYTES: usize = 16 * 1024;
/// Most content lines inspected for a text format.
pub const SNIFF_LINES: usize = 32;

/// Text formats in detection priority order (earlier wins a tie).
const TEXT_CANDIDATES: [Format; 8] = [
    Format::Blkparse,
    Format::Mobigen,
    Format::Heimdall,
    Format::Msr,
    Format::Systor17,
    Format::Spc,
    Format::Tencent,
    Format::CloudPhysics,
];

/// Detects the format of a (decompressed) trace from its first bytes.
///
/// `sample` should be the first [`SNIFF_BYTES`] bytes or the whole input if
/// shorter; a final line without a newline is ignored unless it is the only
/// line (it may have been cut). Returns `None` when nothing matches.
///
/// Rules, in order:
/// 1. the compact [`compact::MAGIC`];
/// 2. vSCSI v1 / v2: the version byte (`ver >> 8`) of each of the first (up
///    to four) whole 32- / 40-byte records is 1 / 2 — a byte that text never
///    contains at those positions;
/// 3. text: a known CSV header line (`version,time,op,size,lbn`,
///    `Timestamp,Response,IOType,...`, `Timestamp,Hostname,...`, `ASU,LBA,...`,
///    `Timestamp,Offset,Size,IOType,...`) decides directly; otherwise every
///    text format's own line parser is tried on up to [`SNIFF_LINES`] content
///    lines (blank and `#` lines skipped) and the format that accepts the most
///    lines wins, provided it accepts at least half of them (so one malformed
///    line does not defeat detection; the reader then reports it with its line
///    number). Ties go to the more specific format (blkparse, mobigen,
///    heimdall, msr, systor17, spc, tencent, cloudphysics).
pub fn detect_format(sample: &[u8]) -> Option<Format> {
    detect(sample, false).ok()
}

/// [`detect_format`] with an explanation on failure; `complete` says the
/// sample is the whole input (so its last line is whole).
pub(crate) fn detect(sample: &[u8], complete: bool) -> Result<Format, String> {
    if sample.is_empty() {
        return Err("the input is empty".into());
    }
    if sample.starts_with(&compact::MAGIC) {
        return Ok(Format::Compact);
    }
    if vscsi::looks_like(sample, 1) {
        return Ok(Format::VscsiV1);
    }
    if vscsi::looks_like(sample, 2) {
        return Ok(Format::VscsiV2);
    }
    let text = String::from_utf8_lossy(sample);
    let mut lines: Vec<&str> = text.split('\n').collect();
    // Drop the empty piece after a final newline, or a possibly cut last line.
    if lines.last() == Some(&"") || (!complete && lines.len() > 1) {
        lines.pop();
    }
    let mut content: Vec<&str> = lines
        .iter()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .take(SNIFF_LINES)
        .collect();
    let Some(&first) = content.first() else {
        return Err("no content lines in the first bytes".into());
    };
    if first.starts_with(|c: char| c.is_ascii_alphabetic()) && first.contains(',') {
        let h: String = first
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect::<String>()
            .to_ascii_lowercase();
        let by_header = if h.starts_with("version,time,op,size,lbn") {
            Some(Format::CloudPhysics)
        } else if h.starts_with("timestamp,response,iotype") {
            Some(Format::Systor17)
        } else if h.starts_with("timestamp,hostname") {
            Some(Format::Msr)
        } else if h.starts_with("asu,lba") {
            Some(Format::Spc)
        } else if h.starts_with("timestamp,offset,size,iotype") {
            Some(Format::Tencent)
        } else {
            None
        };
        if let Some(f) = by_header {
            return Ok(f);
        }
        content.remove(0);
        if content.is_empty() {
            return Err(format!(
                "unrecognised header line `{}`",
                crate::error::excerpt(first)
            ));
        }
    }
    let mut best: Option<(Format, usize)> = None;
    for f in TEXT_CANDIDATES {
        let score = score_text(f, &content);
        if score > best.map_or(0, |(_, s)| s) {
            best = Some((f, score));
        }
    }
    match best {
        Some((f, s)) if 2 * s >= content.len() => Ok(f),
        _ => Err(format!(
            "no text format matches the first lines (first: `{}`); pass a format explicitly (one of: {})",
            crate::error::excerpt(content[0]),
            Format::names()
        )),
    }
}

/// How many of `lines` format `f` accepts (0 if it accepts only filler).
fn score_text(f: Format, lines: &[&str]) -> usize {
    let mut out = Vec::new();
    match f {
        Format::Blkparse => {
            let mut p = BlkparseParser::new(BlkparseAction::Queue);
            let mut events = 0;
            let mut ok = 0;
            for l in lines {
                out.clear();
                if p.parse(l, &mut out).is_ok() {
                    ok += 1;
                    events += usize::from(is_event_line(l));
                }
            }
            if events == 0 {
                0
            } else {
                ok
            }
        }
        Format::Mobigen => {
            let mut p = MobigenParser::new();
            lines
                .iter()
                .filter(|l| {
                    out.clear();
                    let sys = l.split_ascii_whitespace().nth(2).unwrap_or("");
                    KNOWN_SYSCALLS.contains(&sys) && p.parse(l, &mut out).is_ok()
                })
                .count()
        }
        Format::Heimdall => count_ok(lines, csv::parse_heimdall),
        Format::Msr => count_ok(lines, csv::parse_msr),
        Format::Systor17 => count_ok(lines, csv::parse_systor),
        Format::Spc => count_ok(lines, csv::parse_spc),
        Format::Tencent => count_ok(lines, csv::parse_tencent),
        Format::CloudPhysics => count_ok(lines, |l| {
            // The version column is a small integer (1 in every published
            // trace); this keeps unix-time CSVs from matching.
            let small_version = l
                .split(',')
                .next()
                .and_then(|v| v.trim().parse::<u32>().ok())
                .is_some_and(|v| v < 256);
            if small_version {
                csv::parse_cloudphysics(l)
            } else {
                Err(String::new())
            }
        }),
        _ => 0,
    }
}

fn count_ok<T>(lines: &[&str], parse: impl Fn(&str) -> Result<T, String>) -> usize {
    lines.iter().filter(|l| parse(l).is_ok()).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_magic() {
        assert_eq!(detect_compression(&[0x1f, 0x8b, 8, 0]), Compression::Gzip);
        assert_eq!(detect_compression(b"BZh91AY"), Compression::Bzip2);
        assert_eq!(detect_compression(b"BZh0"), Compression::None);
        assert_eq!(detect_compression(b"1,2"), Compression::None);
        assert_eq!(detect_compression(b""), Compression::None);
    }

    #[test]
    fn text_lines() {
        let d = |s: &str| detect(s.as_bytes(), true).ok();
        assert_eq!(
            d("0.000 0 3242508288 4096 0\n1.5 0 0 512 1\n"),
            Some(Format::Heimdall)
        );
        assert_eq!(d("1538323200,4247200,128,1,1058\n"), Some(Format::Tencent));
        assert_eq!(d("1,5633898,2a,512,42932745\n"), Some(Format::CloudPhysics));
        assert_eq!(d("0,303567,3584,w,0.000000\n"), Some(Format::Spc));
        assert_eq!(
            d("1456095145.1,0.0008,R,0,899056122368,131072\n"),
            Some(Format::Systor17)
        );
        assert_eq!(
            d("128166385295514663,hm,0,Write,9056014336,2048,2833\n"),
            Some(Format::Msr)
        );
        assert_eq!(
            d("1 0 open /data/data O_WRONLY 36\n1 5 write 36 4\n"),
            Some(Format::Mobigen)
        );
        assert_eq!(
            d("8,0 3 1 0.000000000 697 Q W 223490 + 8 [kjournald]\n"),
            Some(Format::Blkparse)
        );
        assert_eq!(d("hello world\n"), None);
        assert_eq!(d(""), None);
        assert_eq!(d("\n\n# only comments\n"), None);
    }

    #[test]
    fn cut_last_line_is_ignored_unless_alone() {
        assert_eq!(
            detect(b"1.5 0 0 512 1\n1.5 0 0 5", false).ok(),
            Some(Format::Heimdall)
        );
        assert_eq!(detect(b"1.5 0 0 512 1", false).ok(), Some(Format::Heimdall));
    }
}
