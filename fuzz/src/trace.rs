//! Trace-reader fuzz harness, shared by the cargo-fuzz targets
//! (`fuzz/fuzz_targets/trace_*.rs`) and by the regression test
//! `crates/nvwc-trace/tests/fuzz_regressions.rs` (which includes this file
//! with `#[path]`), so a saved crash is replayed through exactly the code
//! that found it.
//!
//! Contract checked (see `nvwc_trace` crate docs): no input makes a reader
//! panic, loop forever or allocate without bound; every record it yields has
//! `offset + len` without overflow, flushes at (0, 0), timestamps starting at
//! 0 and non-decreasing; every error names the input.

use nvwc_trace::{
    detect_compression, detect_format, open_reader_with, BlkparseAction, Format, Op, ReaderOptions,
    StatsCollector, TraceRecord,
};

/// Records drained per input at most (inputs are small; this only bounds
/// pathological expansion through gzip/bzip2).
pub const MAX_RECORDS: usize = 200_000;

/// Reads `data` as `format` (`None` = auto-detect) and checks the contract.
/// The first byte selects reader options (reorder window, blkparse action)
/// so those code paths are fuzzed too; the rest is the trace.
pub fn check_trace(data: &[u8], format: Option<Format>) {
    let (opts, body) = match data.split_first() {
        Some((&sel, rest)) => (options(sel), rest),
        None => (ReaderOptions::default(), data),
    };
    let _ = detect_compression(body);
    if format.is_none() {
        let _ = detect_format(body);
    }
    let Ok(reader) = open_reader_with(body, format, "fuzz-input", &opts) else {
        return;
    };
    if let Some(f) = format {
        assert_eq!(reader.format(), f, "forced format not honoured");
    }
    let mut stats = StatsCollector::new();
    let mut prev: Option<TraceRecord> = None;
    for item in reader.take(MAX_RECORDS) {
        match item {
            Ok(r) => {
                assert!(
                    r.offset.checked_add(r.len).is_some(),
                    "extent overflows: {r:?}"
                );
                if r.op == Op::Flush {
                    assert_eq!((r.offset, r.len), (0, 0), "flush with an extent: {r:?}");
                }
                match prev {
                    None => assert_eq!(r.ts_ns, 0, "first timestamp not 0: {r:?}"),
                    Some(p) => assert!(p.ts_ns <= r.ts_ns, "time went back: {p:?} then {r:?}"),
                }
                prev = Some(r);
                stats.add(&r);
            }
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    msg.contains("fuzz-input"),
                    "error does not name the input: {msg}"
                );
            }
        }
    }
    let _ = stats.finish().to_string();
}

fn options(sel: u8) -> ReaderOptions {
    ReaderOptions {
        blkparse_action: if sel & 1 == 0 {
            BlkparseAction::Queue
        } else {
            BlkparseAction::Complete
        },
        reorder_window: match (sel >> 1) & 3 {
            0 | 1 => 0,
            2 => 1,
            _ => 16,
        },
    }
}
