//! Error type shared by every reader and writer.

use std::io;

/// Longest excerpt of offending input quoted in an error, in characters.
pub const EXCERPT_CHARS: usize = 80;

/// Everything that can go wrong while reading, detecting or writing traces.
///
/// Every variant raised while reading names the input (`file`, the `name`
/// given to [`crate::open_reader`]); text-format errors also carry the
/// 1-based physical line number and an excerpt of the line, binary-format
/// errors the 1-based record number and its byte offset.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// A text line that does not parse in the trace's format. Not fatal: the
    /// reader continues with the next line if it is polled again.
    #[error("{file}:{line}: {reason}: `{text}`")]
    Parse {
        /// Input name.
        file: String,
        /// 1-based physical line number.
        line: u64,
        /// What is wrong.
        reason: String,
        /// The line, truncated to [`EXCERPT_CHARS`] characters.
        text: String,
    },
    /// A binary record that does not decode. Not fatal unless the record is
    /// truncated (end of input in the middle of a record).
    #[error("{file}: record {record} (byte offset {byte_offset}): {reason}")]
    Record {
        /// Input name.
        file: String,
        /// 1-based record number.
        record: u64,
        /// Byte offset of the record in the (decompressed) input.
        byte_offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// The compact-format header is missing or invalid. Fatal.
    #[error("{file}: bad nvwc compact-trace header: {reason}")]
    Header {
        /// Input name.
        file: String,
        /// What is wrong.
        reason: String,
    },
    /// No format was given and none could be recognised. Fatal.
    #[error("{file}: cannot detect the trace format: {reason}")]
    UnknownFormat {
        /// Input name.
        file: String,
        /// Why detection failed.
        reason: String,
    },
    /// A `--format` name that is not one of [`crate::Format::ALL`].
    #[error("unknown trace format `{name}` (expected one of: {expected})")]
    UnknownFormatName {
        /// The name given.
        name: String,
        /// Comma-separated accepted names.
        expected: String,
    },
    /// Reading, decompressing or writing failed. Fatal. The message
    /// includes the I/O error's, so it is not also given as a `source` (a
    /// chain printed whole would repeat it).
    #[error("{file}: I/O error: {error}")]
    Io {
        /// Input (or output) name.
        file: String,
        /// The underlying error.
        error: io::Error,
    },
    /// A record that the compact format cannot represent.
    #[error("cannot write record {record} to the compact format: {reason}")]
    Unwritable {
        /// 1-based number of the record given to the writer.
        record: u64,
        /// Why.
        reason: String,
    },
}

impl TraceError {
    /// The input name the error refers to, if any.
    pub fn file(&self) -> Option<&str> {
        match self {
            TraceError::Parse { file, .. }
            | TraceError::Record { file, .. }
            | TraceError::Header { file, .. }
            | TraceError::UnknownFormat { file, .. }
            | TraceError::Io { file, .. } => Some(file),
            TraceError::UnknownFormatName { .. } | TraceError::Unwritable { .. } => None,
        }
    }

    /// The 1-based line number, for text parse errors.
    pub fn line(&self) -> Option<u64> {
        match self {
            TraceError::Parse { line, .. } => Some(*line),
            _ => None,
        }
    }

    /// `true` when the reader that returned this error has stopped (it will
    /// only return `None` afterwards).
    pub fn is_fatal(&self) -> bool {
        !matches!(self, TraceError::Parse { .. } | TraceError::Record { .. })
    }

    pub(crate) fn io(file: &str, source: io::Error) -> Self {
        TraceError::Io {
            file: file.to_owned(),
            error: source,
        }
    }

    pub(crate) fn parse(file: &str, line: u64, reason: impl Into<String>, text: &str) -> Self {
        TraceError::Parse {
            file: file.to_owned(),
            line,
            reason: reason.into(),
            text: excerpt(text),
        }
    }
}

/// `text` cut to [`EXCERPT_CHARS`] characters (on a char boundary), with `…`
/// appended when something was cut.
pub(crate) fn excerpt(text: &str) -> String {
    match text.char_indices().nth(EXCERPT_CHARS) {
        None => text.to_owned(),
        Some((cut, _)) => format!("{}…", &text[..cut]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpt_truncates_on_char_boundary() {
        assert_eq!(excerpt("short"), "short");
        let long: String = "é".repeat(200);
        let e = excerpt(&long);
        assert_eq!(e.chars().count(), EXCERPT_CHARS + 1);
        assert!(e.ends_with('…'));
    }

    #[test]
    fn parse_error_names_file_and_line() {
        let e = TraceError::parse("t.csv", 7, "bad offset", "1,2,x");
        assert_eq!(e.to_string(), "t.csv:7: bad offset: `1,2,x`");
        assert_eq!(e.file(), Some("t.csv"));
        assert_eq!(e.line(), Some(7));
        assert!(!e.is_fatal());
    }
}
