//! Fixed-size record framing shared by the binary formats.

use crate::error::TraceError;
use crate::record::TraceRecord;
use std::io::{self, BufRead};

/// Why a fixed-size record could not be read.
pub(crate) enum FrameError {
    /// The underlying reader failed.
    Io(io::Error),
    /// End of input inside a record; `have` bytes of it were present.
    Truncated { have: usize },
}

/// Cuts a byte stream into records of `size` bytes, decoding each straight
/// out of the `BufRead` buffer when it is whole there (the fast path) and
/// through a scratch copy when it straddles a refill.
pub(crate) struct FixedRecords<'a> {
    inner: Box<dyn BufRead + Send + 'a>,
    size: usize,
    scratch: Vec<u8>,
    /// Records returned so far.
    pub(crate) count: u64,
    /// Byte offset of the next record in the stream.
    pub(crate) offset: u64,
}

impl<'a> FixedRecords<'a> {
    /// `offset` is the byte position of the first record in the stream.
    pub(crate) fn new(inner: Box<dyn BufRead + Send + 'a>, size: usize, offset: u64) -> Self {
        FixedRecords {
            inner,
            size,
            scratch: Vec::with_capacity(size),
            count: 0,
            offset,
        }
    }

    /// Applies `decode` to the next record's bytes (exactly `size` of them);
    /// `Ok(None)` at a clean end of input.
    #[inline]
    pub(crate) fn next_with<T>(
        &mut self,
        decode: impl FnOnce(&[u8]) -> T,
    ) -> Result<Option<T>, FrameError> {
        let size = self.size;
        let buf = self.inner.fill_buf().map_err(FrameError::Io)?;
        if buf.len() >= size {
            let out = decode(&buf[..size]);
            self.inner.consume(size);
            self.count += 1;
            self.offset += size as u64;
            return Ok(Some(out));
        }
        if buf.is_empty() {
            return Ok(None);
        }
        self.scratch.clear();
        while self.scratch.len() < size {
            let buf = self.inner.fill_buf().map_err(FrameError::Io)?;
            if buf.is_empty() {
                return Err(FrameError::Truncated {
                    have: self.scratch.len(),
                });
            }
            let take = buf.len().min(size - self.scratch.len());
            self.scratch.extend_from_slice(&buf[..take]);
            self.inner.consume(take);
        }
        self.count += 1;
        self.offset += size as u64;
        Ok(Some(decode(&self.scratch)))
    }
}

/// Outcome of [`FixedRecords::fill_batch`].
pub(crate) enum Fill {
    /// Clean end of input; nothing was decoded.
    Eof,
    /// At least one record was consumed (decoded into the batch or skipped).
    Filled,
    /// Record number `record` (1-based) at byte `offset` failed to decode;
    /// the records before it are in the batch and it has been consumed.
    Bad {
        record: u64,
        offset: u64,
        reason: String,
    },
}

/// What a record decoder makes of one record.
pub(crate) type Decoded = Result<Option<TraceRecord>, String>;

impl FixedRecords<'_> {
    /// Decodes every whole record currently buffered (reading more first if
    /// none is) into `out`, in order: `Ok(Some(r))` is pushed, `Ok(None)`
    /// counted in `skipped`, and the first `Err` ends the batch. This is the
    /// fast path: one buffer refill and a tight loop per few thousand records.
    #[inline(always)]
    pub(crate) fn fill_batch(
        &mut self,
        out: &mut Vec<TraceRecord>,
        skipped: &mut u64,
        decode: impl Fn(&[u8]) -> Decoded,
    ) -> Result<Fill, FrameError> {
        let size = self.size;
        let buf = self.inner.fill_buf().map_err(FrameError::Io)?;
        if buf.len() < size {
            let (record, offset) = (self.count + 1, self.offset);
            return Ok(match self.next_with(&decode)? {
                None => Fill::Eof,
                Some(Ok(Some(r))) => {
                    out.push(r);
                    Fill::Filled
                }
                Some(Ok(None)) => {
                    *skipped += 1;
                    Fill::Filled
                }
                Some(Err(reason)) => Fill::Bad {
                    record,
                    offset,
                    reason,
                },
            });
        }
        let mut used = 0;
        let mut outcome = Fill::Filled;
        for chunk in buf.chunks_exact(size) {
            used += size;
            match decode(chunk) {
                Ok(Some(r)) => out.push(r),
                Ok(None) => *skipped += 1,
                Err(reason) => {
                    outcome = Fill::Bad {
                        record: self.count + (used / size) as u64,
                        offset: self.offset + (used - size) as u64,
                        reason,
                    };
                    break;
                }
            }
        }
        self.inner.consume(used);
        self.count += (used / size) as u64;
        self.offset += used as u64;
        Ok(outcome)
    }
}

/// Batched record source: decodes a buffer's worth of records at a time
/// and hands them out one by one, turning framing problems into
/// [`TraceError`]s that name the input and the record.
pub(crate) struct Batched<'a> {
    recs: FixedRecords<'a>,
    batch: Vec<TraceRecord>,
    pos: usize,
    pending: Option<TraceError>,
    /// Records that decoded to `Ok(None)`.
    pub(crate) skipped: u64,
}

impl<'a> Batched<'a> {
    pub(crate) fn new(recs: FixedRecords<'a>) -> Self {
        Batched {
            recs,
            batch: Vec::with_capacity(READ_BATCH),
            pos: 0,
            pending: None,
            skipped: 0,
        }
    }

    /// The next already-decoded record, if the current batch has one (the
    /// hot path: no decoding, no error plumbing).
    #[inline]
    pub(crate) fn next_buffered(&mut self) -> Option<TraceRecord> {
        let r = self.batch.get(self.pos).copied();
        self.pos += usize::from(r.is_some());
        r
    }

    /// The next record, decoding a new batch with `decode` when needed.
    #[inline]
    pub(crate) fn next_raw(
        &mut self,
        name: &str,
        decode: impl Fn(&[u8]) -> Decoded,
    ) -> Option<Result<TraceRecord, TraceError>> {
        loop {
            if let Some(r) = self.batch.get(self.pos) {
                self.pos += 1;
                return Some(Ok(*r));
            }
            if let Some(e) = self.pending.take() {
                return Some(Err(e));
            }
            self.batch.clear();
            self.pos = 0;
            match self
                .recs
                .fill_batch(&mut self.batch, &mut self.skipped, &decode)
            {
                Ok(Fill::Eof) => return None,
                Ok(Fill::Filled) => {}
                Ok(Fill::Bad {
                    record,
                    offset,
                    reason,
                }) => {
                    self.pending = Some(TraceError::Record {
                        file: name.to_owned(),
                        record,
                        byte_offset: offset,
                        reason,
                    })
                }
                Err(FrameError::Io(e)) => return Some(Err(TraceError::io(name, e))),
                Err(FrameError::Truncated { have }) => {
                    return Some(Err(TraceError::Io {
                        file: name.to_owned(),
                        error: io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!(
                                "record {} (byte offset {}) is truncated: {have} of {} bytes",
                                self.recs.count + 1,
                                self.recs.offset,
                                self.recs.size
                            ),
                        ),
                    }))
                }
            }
        }
    }
}

/// Typical batch capacity (the 256 KiB read buffer holds 8192 32-byte records).
const READ_BATCH: usize = 8192;

/// Little-endian field readers over a record slice whose length the caller
/// has already checked.
#[inline]
pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

#[inline]
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline]
pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufReader, Cursor};

    #[test]
    fn straddling_and_truncated_records() {
        let data: Vec<u8> = (0u8..10).collect();
        // A 3-byte BufReader capacity forces every 4-byte record to straddle.
        let inner = BufReader::with_capacity(3, Cursor::new(data));
        let mut f = FixedRecords::new(Box::new(inner), 4, 0);
        assert_eq!(
            f.next_with(|b| b.to_vec()).ok().flatten(),
            Some(vec![0, 1, 2, 3])
        );
        assert_eq!(
            f.next_with(|b| b.to_vec()).ok().flatten(),
            Some(vec![4, 5, 6, 7])
        );
        assert!(matches!(
            f.next_with(|b| b.to_vec()),
            Err(FrameError::Truncated { have: 2 })
        ));
        assert_eq!(f.count, 2);
        assert_eq!(f.offset, 8);
    }
}
