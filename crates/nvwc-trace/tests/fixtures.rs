//! Hand-written fixtures for every format: exact parsed values, detection,
//! error locations, compression, and round trips through the compact format.

mod common;

use common::*;
use nvwc_trace::{
    convert, detect_format, open_path, open_reader, open_reader_with, stats, BlkparseAction,
    Compression, Format, Op, ReaderOptions, TraceError, TraceReader, TraceRecord, COMPACT_MAGIC,
    MOBIGEN_REGION_BITS,
};
use std::io::Write;

/// The fixture `name`, whose format MUST be detected as `format`: its reader
/// (for its counters) and every record.
fn read_fixture(name: &str, format: Format) -> (TraceReader<'static>, Vec<TraceRecord>) {
    let mut r = open_path(fixture(name), None, &ReaderOptions::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(r.format(), format, "{name}");
    let recs: Vec<TraceRecord> = r
        .by_ref()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    (r, recs)
}

fn read_bytes(bytes: &[u8], format: Option<Format>) -> (Format, Vec<TraceRecord>) {
    let r = open_reader(bytes, format, "mem").unwrap();
    let f = r.format();
    (f, r.collect::<Result<_, _>>().unwrap())
}

#[test]
fn msr() {
    let (_, recs) = read_fixture("msr.csv", Format::Msr);
    assert_eq!(
        recs,
        [
            rec(0, Op::Read, 3_154_170_880, 4096, false, 0, 0),
            rec(0, Op::Write, 383_766_528, 512, false, 1, 0),
            rec(1_332_052_600, Op::Write, 0, 65536, false, 2, 0),
        ]
    );
}

#[test]
fn spc() {
    let (_, recs) = read_fixture("spc.spc", Format::Spc);
    assert_eq!(
        recs,
        [
            rec(0, Op::Write, 155_426_304, 3584, false, 0, 0),
            rec(25_000, Op::Read, 28_462_080, 3072, false, 1, 0),
            rec(3_000_000, Op::Write, 155_429_888, 3584, false, 0, 0),
        ]
    );
}

#[test]
fn blkparse_queue_events() {
    let (r, recs) = read_fixture("blkparse.txt", Format::Blkparse);
    let sda = 8 << 20;
    let sdb = 8 << 20 | 16;
    assert_eq!(
        recs,
        [
            rec(0, Op::Write, 114_426_880, 4096, false, sda, 697),
            rec(999_579, Op::Flush, 0, 0, false, sdb, 1201),
            rec(1_499_829, Op::Write, 524_288, 8192, true, sdb, 1201),
            rec(1_999_579, Op::Read, 2_097_152, 131_072, false, sdb, 1202),
            rec(2_099_579, Op::Trim, 4_194_304, 1_048_576, false, sdb, 1202),
            rec(2_199_579, Op::Read, 2_228_224, 4096, false, sdb, 1202),
            rec(2_299_579, Op::Flush, 0, 0, false, sdb, 1203),
            rec(2_299_579, Op::Write, 1_048_576, 4096, true, sdb, 1203),
        ]
    );
    // A G I D C P U m events and the 5 non-blank summary lines.
    assert_eq!(r.skipped(), 13);
}

#[test]
fn blkparse_complete_events() {
    let opts = ReaderOptions {
        blkparse_action: BlkparseAction::Complete,
        ..Default::default()
    };
    let r = open_path(fixture("blkparse.txt"), Some(Format::Blkparse), &opts).unwrap();
    let recs: Vec<_> = r.collect::<Result<_, _>>().unwrap();
    assert_eq!(
        recs,
        [rec(0, Op::Write, 114_426_880, 4096, false, 8 << 20, 0)]
    );
}

#[test]
fn cloudphysics_csv() {
    let (r, recs) = read_fixture("cloudphysics.csv", Format::CloudPhysics);
    assert_eq!(
        recs,
        [
            rec(0, Op::Write, 21_981_565_440, 512, false, 0, 0),
            rec(0, Op::Read, 51_200, 4096, false, 0, 0),
            rec(1_000_000_000, Op::Flush, 0, 0, false, 0, 0),
            rec(2_000_000_000, Op::Write, 8192, 8192, false, 0, 0),
        ]
    );
    assert_eq!(r.skipped(), 1, "INQUIRY (0x12) is skipped");
}

#[test]
fn tencent() {
    let (r, recs) = read_fixture("tencent.csv", Format::Tencent);
    assert_eq!(
        recs,
        [
            rec(0, Op::Write, 2_174_566_400, 65536, false, 1058, 0),
            rec(0, Op::Read, 7_115_202_560, 65536, false, 1063, 0),
            rec(
                1_000_000_000,
                Op::Read,
                25_299_599_360,
                8192,
                false,
                1063,
                0
            ),
        ]
    );
    assert_eq!(
        r.clamped(),
        1,
        "the second record is earlier than the first"
    );
}

#[test]
fn systor17() {
    let (r, recs) = read_fixture("systor17.csv", Format::Systor17);
    assert_eq!(
        recs,
        [
            rec(0, Op::Read, 899_056_122_368, 131_072, false, 0, 0),
            rec(0, Op::Write, 4_256_049_987_072, 122_880, false, 1, 0),
            rec(866_924_001, Op::Write, 4096, 4096, false, 3, 0),
        ]
    );
    assert_eq!(r.clamped(), 1);
}

#[test]
fn heimdall() {
    let (_, recs) = read_fixture("heimdall.trace", Format::Heimdall);
    assert_eq!(
        recs,
        [
            rec(0, Op::Write, 3_242_508_288, 4096, false, 0, 0),
            rec(0, Op::Write, 3_242_266_624, 4096, false, 0, 0),
            rec(22_810_000, Op::Read, 2_205_343_744, 512, false, 1, 0),
        ]
    );
}

#[test]
fn mobigen() {
    let (r, recs) = read_fixture("mobigen.out.sample", Format::Mobigen);
    let region = |k: u64| k << MOBIGEN_REGION_BITS;
    assert_eq!(
        recs,
        [
            rec(0, Op::Write, region(0), 4, false, 0, 1),
            rec(1_378_000, Op::Write, region(0) + 4, 100, false, 0, 1),
            rec(1_600_000, Op::Write, region(1) + 8192, 4096, false, 0, 2),
            rec(1_700_000, Op::Read, region(1), 100, false, 0, 2),
            rec(1_800_000, Op::Flush, 0, 0, false, 0, 2),
            rec(2_100_000, Op::Trim, region(1), 12288, false, 0, 2),
            rec(2_200_000, Op::Read, region(2) + 18_740_699, 30, false, 0, 3),
        ]
    );
    assert_eq!(r.skipped(), 5, "2 opens, stat64, close, zero-byte read");
}

#[test]
fn vscsi_v1_and_v2() {
    for (bytes, format) in [
        (vscsi_v1(&VSCSI_REQS), Format::VscsiV1),
        (vscsi_v2(&VSCSI_REQS), Format::VscsiV2),
    ] {
        let mut r = open_reader(&bytes[..], None, "vscsi fixture").unwrap();
        assert_eq!(r.format(), format);
        let recs: Vec<_> = r.by_ref().collect::<Result<_, _>>().unwrap();
        assert_eq!(recs, vscsi_expected(), "{format}");
        assert_eq!(r.skipped(), 1);
    }
}

#[test]
fn compact_written_and_read_back() {
    let recs = vec![
        rec(0, Op::Write, 4096, 4096, true, 3, 9),
        rec(10, Op::Flush, 0, 0, false, 3, 9),
        rec(10, Op::Trim, 1 << 40, 1 << 44, false, u32::MAX, 0),
        rec(u64::MAX / 2, Op::Read, 0, 1, false, 0, u32::MAX),
    ];
    let mut out = Vec::new();
    let n = nvwc_trace::write_compact(recs.iter().map(|r| Ok(*r)), Some(Format::Msr), &mut out)
        .unwrap();
    assert_eq!(n, 4);
    assert_eq!(out.len(), 32 + 4 * 32);
    assert!(out.starts_with(&COMPACT_MAGIC));
    let r = open_reader(&out[..], None, "c").unwrap();
    assert_eq!(r.format(), Format::Compact);
    assert_eq!(r.source_format(), Some(Format::Msr));
    assert_eq!(r.collect::<Result<Vec<_>, _>>().unwrap(), recs);
}

#[test]
fn compact_forward_compatible_header_and_record_sizes() {
    let r0 = rec(0, Op::Write, 4096, 512, false, 1, 2);
    let mut out = Vec::new();
    nvwc_trace::write_compact([Ok(r0), Ok(r0)], None, &mut out).unwrap();
    // Rewrite as header_len 40, record_size 48 with junk in the extensions.
    let mut ext = out[..32].to_vec();
    ext[10..12].copy_from_slice(&40u16.to_le_bytes());
    ext[12..14].copy_from_slice(&48u16.to_le_bytes());
    ext.extend_from_slice(&[0xee; 8]);
    for rec_bytes in out[32..].chunks(32) {
        ext.extend_from_slice(rec_bytes);
        ext.extend_from_slice(&[0xdd; 16]);
    }
    let (_, got) = read_bytes(&ext, None);
    assert_eq!(got, [r0, r0]);
}

#[test]
fn detection_from_content() {
    let cases = [
        ("msr.csv", Format::Msr),
        ("spc.spc", Format::Spc),
        ("blkparse.txt", Format::Blkparse),
        ("cloudphysics.csv", Format::CloudPhysics),
        ("tencent.csv", Format::Tencent),
        ("systor17.csv", Format::Systor17),
        ("heimdall.trace", Format::Heimdall),
        ("mobigen.out.sample", Format::Mobigen),
    ];
    for (name, want) in cases {
        let bytes = std::fs::read(fixture(name)).unwrap();
        assert_eq!(detect_format(&bytes), Some(want), "{name}");
        // Headerless variants of the CSV formats are detected too.
        let body: String = String::from_utf8(bytes)
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with(|c: char| c.is_ascii_alphabetic()))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(
            detect_format(body.as_bytes()),
            Some(want),
            "{name} without header"
        );
    }
    assert_eq!(detect_format(&vscsi_v1(&VSCSI_REQS)), Some(Format::VscsiV1));
    assert_eq!(detect_format(&vscsi_v2(&VSCSI_REQS)), Some(Format::VscsiV2));
    let mut compact = Vec::new();
    nvwc_trace::write_compact(std::iter::empty(), None, &mut compact).unwrap();
    assert_eq!(detect_format(&compact), Some(Format::Compact));
    assert_eq!(detect_format(b"what is this\n"), None);
    let e = open_reader(&b"what is this\n"[..], None, "mystery.txt")
        .err()
        .expect("undetectable input must fail to open");
    assert!(matches!(e, TraceError::UnknownFormat { .. }));
    assert!(e.to_string().contains("mystery.txt"), "{e}");
}

#[test]
fn explicit_format_overrides_detection() {
    let path = fixture("msr.csv");
    let r = open_path(
        &path,
        Some("tencent".parse().unwrap()),
        &ReaderOptions::default(),
    )
    .unwrap();
    assert_eq!(r.format(), Format::Tencent);
    let errs: Vec<TraceError> = r.filter_map(Result::err).collect();
    assert_eq!(errs.len(), 3, "every MSR line is a malformed Tencent line");
    assert_eq!(errs[0].line(), Some(1));
    assert!(errs[0].to_string().contains("msr.csv:1:"), "{}", errs[0]);
}

#[test]
fn malformed_lines_name_file_line_and_text() {
    // (fixture, format, bad line number, good records before it, text in the excerpt)
    let cases = [
        ("msr_bad.csv", Format::Msr, 3, 2, "Erase"),
        ("spc_bad.spc", Format::Spc, 2, 1, "3072,x"),
        ("blkparse_bad.txt", Format::Blkparse, 3, 1, "223490 - 8"),
        (
            "cloudphysics_bad.csv",
            Format::CloudPhysics,
            4,
            2,
            "1,5633899,2a,4096",
        ),
        ("tencent_bad.csv", Format::Tencent, 2, 1, "128,2,1063"),
        ("systor17_bad.csv", Format::Systor17, 4, 2, "-4096"),
        ("heimdall_bad.trace", Format::Heimdall, 4, 3, "512 r"),
        ("mobigen_bad.out", Format::Mobigen, 4, 2, "pwrite 36 4096"),
    ];
    for (name, format, line, good, text) in cases {
        let path = fixture(name);
        let mut r = open_path(&path, None, &ReaderOptions::default()).unwrap();
        assert_eq!(
            r.format(),
            format,
            "{name}: detection survives one bad line"
        );
        let mut ok = 0;
        let err = loop {
            match r.next() {
                Some(Ok(_)) => ok += 1,
                Some(Err(e)) => break e,
                None => panic!("{name}: no error reported"),
            }
        };
        assert_eq!(ok, good, "{name}");
        assert_eq!(err.line(), Some(line), "{name}: {err}");
        assert!(!err.is_fatal());
        let msg = err.to_string();
        let loc = format!("{}:{line}:", path.display());
        assert!(
            msg.starts_with(&loc),
            "{name}: `{msg}` should start with `{loc}`"
        );
        assert!(msg.contains(text), "{name}: `{msg}` should quote `{text}`");
    }
}

#[test]
fn binary_errors_name_file_and_record() {
    // Record 2 of a v1 trace with a v2 version field.
    let mut bytes = vscsi_v1(&VSCSI_REQS);
    bytes[32 + 14..32 + 16].copy_from_slice(&0x0200u16.to_le_bytes());
    let errs: Vec<String> = open_reader(&bytes[..], Some(Format::VscsiV1), "v.vscsi")
        .unwrap()
        .filter_map(|r| r.err().map(|e| e.to_string()))
        .collect();
    assert_eq!(errs, ["v.vscsi: record 2 (byte offset 32): version field 0x0200 is not vSCSI v1 (misaligned or not a vSCSI trace?)"]);

    // Truncated last record: fatal, names the record, then the reader stops.
    let mut bytes = vscsi_v1(&VSCSI_REQS[..2]);
    bytes.truncate(32 + 20);
    let mut r = open_reader(&bytes[..], None, "t.vscsi").unwrap();
    assert!(r.next().unwrap().is_ok());
    let e = r.next().unwrap().unwrap_err();
    assert!(e.is_fatal());
    assert!(
        e.to_string().contains("t.vscsi") && e.to_string().contains("record 2"),
        "{e}"
    );
    assert!(r.next().is_none());

    // Compact: bad op code in record 2, then bad magic / version / truncation.
    let good = rec(0, Op::Read, 0, 512, false, 0, 0);
    let mut c = Vec::new();
    nvwc_trace::write_compact([Ok(good), Ok(good), Ok(good)], None, &mut c).unwrap();
    let mut bad = c.clone();
    bad[32 + 32 + 20] = 7;
    let res: Vec<_> = open_reader(&bad[..], None, "c.nvwc").unwrap().collect();
    assert_eq!(res.len(), 3);
    let e = res[1].as_ref().unwrap_err();
    assert_eq!(
        e.to_string(),
        "c.nvwc: record 2 (byte offset 64): unknown op code 7"
    );
    let mut bad = c.clone();
    bad[8] = 2;
    let e = open_reader(&bad[..], None, "c.nvwc").err().unwrap();
    assert!(e.to_string().contains("unsupported version 2"), "{e}");
    let e = open_reader(&c[..5], Some(Format::Compact), "c.nvwc")
        .err()
        .unwrap();
    assert!(matches!(e, TraceError::Header { .. }), "{e}");
    let e = open_reader(
        &b"not compact at all, no sir"[..],
        Some(Format::Compact),
        "x",
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("magic"), "{e}");
}

#[test]
fn compressed_inputs_are_transparent() {
    let plain = std::fs::read(fixture("systor17.csv")).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&plain).unwrap();
    let gz = gz.finish().unwrap();
    let mut bz = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::default());
    bz.write_all(&plain).unwrap();
    let bz = bz.finish().unwrap();
    let (_, want) = read_bytes(&plain, None);
    for (bytes, comp) in [(gz, Compression::Gzip), (bz, Compression::Bzip2)] {
        let r = open_reader(&bytes[..], None, "z").unwrap();
        assert_eq!((r.compression(), r.format()), (comp, Format::Systor17));
        assert_eq!(r.collect::<Result<Vec<_>, _>>().unwrap(), want);
    }
    // Binary formats too, and a corrupt gzip stream is a fatal named error.
    let v1 = vscsi_v1(&VSCSI_REQS);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&v1).unwrap();
    let gz = gz.finish().unwrap();
    let (f, got) = read_bytes(&gz, None);
    assert_eq!((f, got), (Format::VscsiV1, vscsi_expected()));
    let mut broken = gz.clone();
    let mid = broken.len() / 2;
    broken[mid..].iter_mut().for_each(|b| *b ^= 0x5a);
    let outcome = open_reader(&broken[..], None, "broken.gz").map(|r| r.collect::<Vec<_>>());
    let named = match outcome {
        Err(e) => e.to_string().contains("broken.gz"),
        Ok(items) => items.iter().any(|i| {
            i.as_ref()
                .is_err_and(|e| e.to_string().contains("broken.gz"))
        }),
    };
    assert!(
        named,
        "corruption must surface as an error naming the input"
    );
}

#[test]
fn round_trip_every_format_through_compact() {
    for (name, bytes) in valid_inputs() {
        let (format, want) = read_bytes(&bytes, None);
        assert!(!want.is_empty(), "{name}");
        let mut compact = Vec::new();
        let summary = convert(&bytes[..], None, &name, &mut compact).unwrap();
        assert_eq!(summary.format, format);
        assert_eq!(summary.records, want.len() as u64);
        let back = open_reader(&compact[..], None, "compact").unwrap();
        assert_eq!(back.source_format(), Some(format), "{name}");
        let got: Vec<_> = back.collect::<Result<_, _>>().unwrap();
        assert_eq!(got, want, "{name}");
        // Converting the compact file again is the identity.
        let mut again = Vec::new();
        convert(&compact[..], None, "compact", &mut again).unwrap();
        assert_eq!(again, compact, "{name}");
    }
}

#[test]
fn stats_on_fixture() {
    let r = open_path(fixture("blkparse.txt"), None, &ReaderOptions::default()).unwrap();
    let s = stats(r).unwrap();
    assert_eq!(
        (s.requests, s.reads, s.writes, s.flushes, s.trims),
        (8, 2, 3, 2, 1)
    );
    assert_eq!(s.fua_writes, 2);
    assert_eq!(s.bytes_written, 4096 + 8192 + 4096);
    assert_eq!(s.bytes_read, 131_072 + 4096);
    assert_eq!(s.bytes_trimmed, 1_048_576);
    // sda: the unaligned write straddles blocks 27936..27938; sdb: writes
    // 128..130 and 256, reads 512..544 plus the read-ahead at 544 (merged).
    assert_eq!(s.unique_blocks, 2 + 2 + 1 + 33);
    assert_eq!(s.unique_blocks_written, 2 + 2 + 1);
    assert_eq!(s.unaligned_writes, 1, "sector 223490 is not 4 KiB aligned");
    assert_eq!(s.devices, [8 << 20, 8 << 20 | 16]);
    assert_eq!(s.duration_ns, 2_299_579);
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["requests"], 8);
    assert_eq!(json["size_histogram"][0]["max_bytes"], 4096);
    assert!(s.to_string().contains("flushes       2"));
}

/// Every record of `text` in `format`, read through a reorder window of
/// `window` records.
fn read_reordered(text: &str, format: Format, window: usize) -> Vec<TraceRecord> {
    let opts = ReaderOptions {
        reorder_window: window,
        ..Default::default()
    };
    let r = open_reader_with(text.as_bytes(), Some(format), "mem", &opts).unwrap();
    r.collect::<Result<_, _>>().unwrap()
}

#[test]
fn reorder_window_sorts_nearby_disorder() {
    let text = "3 0 0 512 1\n1 0 512 512 1\n2 0 1024 512 1\n0.5 0 1536 512 1\n9 0 2048 512 1\n";
    let offs: Vec<u64> = read_reordered(text, Format::Heimdall, 4)
        .iter()
        .map(|r| r.offset)
        .collect();
    assert_eq!(offs, [1536, 512, 1024, 0, 2048]);
    let mut r = open_reader(text.as_bytes(), Some(Format::Heimdall), "t").unwrap();
    let ts: Vec<u64> = r.by_ref().map(|r| r.unwrap().ts_ns).collect();
    assert_eq!(ts, [0, 0, 0, 0, 6_000_000]);
    assert_eq!(
        r.clamped(),
        3,
        "records earlier than the first one count as clamped"
    );
}

#[test]
fn open_reader_with_reorder_sorts_mobigen_threads() {
    // MobiGen groups lines by thread, so raw time goes backwards at each
    // thread switch; a window covering the file sorts it.
    let text = "1 100 write 3 1\n1 300 write 3 1\n2 50 write 4 1\n2 200 write 4 1\n";
    let got: Vec<(u64, u32)> = read_reordered(text, Format::Mobigen, 8)
        .iter()
        .map(|r| (r.ts_ns, r.stream))
        .collect();
    assert_eq!(got, [(0, 2), (50_000, 1), (150_000, 2), (250_000, 1)]);
}
