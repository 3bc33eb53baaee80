//! Reads every real trace in `shared/traces` (next to the repository) with
//! the format auto-detected, and checks the request counts and write
//! fractions the MANIFEST gives. Skips, loudly, if the directory is absent,
//! except under `CI=true` or `NVWC_REQUIRE_TOOLS=1` (CI), where a missing
//! trace directory fails the test. `NVWC_TRACES` overrides the location, as
//! for every other test and `nvwc repro` (`NVWC_TRACES_DIR`, its old name, too).

use nvwc_trace::{
    convert, open_path, open_reader, stats, Compression, Format, Op, ReaderOptions, TraceRecord,
    TraceStats, MOBIGEN_REGION_BITS,
};
use std::path::PathBuf;

fn traces_dir() -> Option<PathBuf> {
    let env = std::env::var_os("NVWC_TRACES").or_else(|| std::env::var_os("NVWC_TRACES_DIR"));
    let dir = match env {
        Some(d) => PathBuf::from(d),
        None => {
            // Canonicalise first so a symlinked checkout still finds the
            // repository's sibling `shared/`.
            let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
            let manifest = manifest.canonicalize().unwrap_or(manifest);
            manifest.join("../../../shared/traces")
        }
    };
    if dir.join("MANIFEST.md").is_file() {
        Some(dir)
    } else {
        assert!(
            !strict(),
            "real-trace tests: no trace directory at {} (CI needs ../shared beside the repository; set NVWC_TRACES)",
            dir.display()
        );
        eprintln!(
            "SKIPPED: real-trace tests: no trace directory at {} (set NVWC_TRACES)",
            dir.display()
        );
        None
    }
}

/// CI runs every test: missing traces fail there instead of skipping.
fn strict() -> bool {
    std::env::var("NVWC_REQUIRE_TOOLS").as_deref() == Ok("1")
        || matches!(std::env::var("CI").as_deref(), Ok("true" | "1"))
}

fn read_all(dir: &std::path::Path, file: &str) -> (Format, Compression, Vec<TraceRecord>) {
    let mut r = open_path(dir.join(file), None, &ReaderOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let recs: Vec<TraceRecord> = r
        .by_ref()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{e}"));
    (r.format(), r.compression(), recs)
}

fn stats_of(recs: &[TraceRecord]) -> TraceStats {
    stats(recs.iter().map(|r| Ok(*r))).unwrap()
}

/// Write fraction of all requests, as the MANIFEST counts it.
fn write_fraction(s: &TraceStats) -> f64 {
    s.writes as f64 / s.requests as f64
}

#[test]
fn manifest_counts_and_write_fractions() {
    let Some(dir) = traces_dir() else { return };
    // (file, format, compression, requests, write fraction, tolerance)
    let table = [
        (
            "cloudPhysicsIO.vscsi",
            Format::VscsiV1,
            Compression::None,
            113_872,
            0.587,
            0.0005,
        ),
        (
            "cloudPhysicsIO.csv",
            Format::CloudPhysics,
            Compression::None,
            113_872,
            0.587,
            0.0005,
        ),
        (
            "msr-cambridge1-sample.csv",
            Format::Msr,
            Compression::None,
            1_000,
            0.49,
            0.005,
        ),
        (
            "msr.cut.per_10k.rw_40_60.1370.trace",
            Format::Heimdall,
            Compression::None,
            10_000,
            0.59,
            0.005,
        ),
        (
            "systor17-traces-sample.csv.gz",
            Format::Systor17,
            Compression::Gzip,
            999,
            0.17,
            0.005,
        ),
        (
            "systor17-additional-sample.csv.gz",
            Format::Systor17,
            Compression::Gzip,
            999,
            0.30,
            0.005,
        ),
        (
            "cloud_storage-sample.bz2",
            Format::Tencent,
            Compression::Bzip2,
            50_000,
            0.51,
            0.005,
        ),
    ];
    for (file, format, compression, requests, wf, tol) in table {
        let (f, c, recs) = read_all(&dir, file);
        assert_eq!((f, c), (format, compression), "{file}");
        let s = stats_of(&recs);
        assert_eq!(s.requests, requests, "{file}");
        assert_eq!(
            s.reads + s.writes,
            requests,
            "{file}: only reads and writes"
        );
        let got = write_fraction(&s);
        assert!(
            (got - wf).abs() <= tol,
            "{file}: write fraction {got:.4}, MANIFEST {wf}"
        );
        assert!(
            recs.windows(2).all(|w| w[0].ts_ns <= w[1].ts_ns),
            "{file}: monotonic"
        );
        assert_eq!(recs[0].ts_ns, 0, "{file}");
        eprintln!(
            "{file}: {format}, {} requests, {:.1}% writes, {:.1}% unaligned writes, {:.1} s",
            s.requests,
            100.0 * got,
            100.0 * s.unaligned_write_fraction,
            s.duration_ns as f64 / 1e9
        );
    }
}

#[test]
fn cloudphysics_vscsi_and_csv_agree() {
    let Some(dir) = traces_dir() else { return };
    let (_, _, bin) = read_all(&dir, "cloudPhysicsIO.vscsi");
    let (_, _, csv) = read_all(&dir, "cloudPhysicsIO.csv");
    assert_eq!(bin.len(), csv.len());
    for (i, (b, c)) in bin.iter().zip(&csv).enumerate() {
        assert_eq!(
            (b.op, b.offset, b.len),
            (c.op, c.offset, c.len),
            "record {i}"
        );
        // The CSV's time is the vSCSI microsecond timestamp in whole seconds.
        assert!(
            b.ts_ns.abs_diff(c.ts_ns) < 1_000_000_000,
            "record {i}: {} vs {}",
            b.ts_ns,
            c.ts_ns
        );
    }
    let s = stats_of(&bin);
    let dur = s.duration_ns as f64 / 1e9;
    assert!((7199.0..7201.0).contains(&dur), "2 hours, got {dur} s");
    // MANIFEST: 13.6% of sizes are not 4 KiB multiples.
    let odd = bin.iter().filter(|r| r.len % 4096 != 0).count() as f64 / bin.len() as f64;
    assert!((odd - 0.136).abs() < 0.0005, "{odd}");
}

#[test]
fn tencent_volumes_and_msr_disk() {
    let Some(dir) = traces_dir() else { return };
    let (_, _, recs) = read_all(&dir, "cloud_storage-sample.bz2");
    assert_eq!(
        stats_of(&recs).devices.len(),
        2_038,
        "MANIFEST: 2,038 volumes"
    );
    let (_, _, recs) = read_all(&dir, "msr-cambridge1-sample.csv");
    assert_eq!(stats_of(&recs).devices, [0], "hm_0 is disk 0");
}

#[test]
fn mobigen_traces_map_onto_blocks() {
    let Some(dir) = traces_dir() else { return };
    let mut r = open_path(
        dir.join("mobigen.out.facebook"),
        None,
        &ReaderOptions::default(),
    )
    .unwrap();
    assert_eq!(r.format(), Format::Mobigen);
    let recs: Vec<TraceRecord> = r.by_ref().collect::<Result<_, _>>().unwrap();
    let s = stats_of(&recs);
    // Every line yields at most one record, so records + skipped = lines.
    assert_eq!(
        recs.len() as u64 + r.skipped(),
        30_819,
        "MANIFEST: 30,819 lines"
    );
    assert_eq!(s.flushes, 997, "MANIFEST: 997 fsyncs");
    let small = recs
        .iter()
        .filter(|r| r.op == Op::Write && r.len < 4096)
        .count() as f64
        / s.writes as f64;
    assert!(
        (0.80..0.92).contains(&small),
        "MANIFEST: ~87% of writes under 4 KiB, got {small}"
    );
    // pwrite offsets are used unscaled: every record stays inside its file's
    // region, and (SQLite pages) most file offsets are 4 KiB aligned.
    let region = 1u64 << MOBIGEN_REGION_BITS;
    assert!(recs
        .iter()
        .all(|r| r.len == 0 || (r.offset % region) + r.len <= region));
    let r = open_path(
        dir.join("mobigen.out.twitter"),
        None,
        &ReaderOptions::default(),
    )
    .unwrap();
    let s = stats(r).unwrap();
    assert_eq!(s.flushes, 297);
    assert!(
        (5_000..7_000).contains(&s.writes),
        "MANIFEST: ~6k writes, got {}",
        s.writes
    );
}

#[test]
fn real_traces_round_trip_through_compact() {
    let Some(dir) = traces_dir() else { return };
    for file in [
        "cloudPhysicsIO.vscsi",
        "msr-cambridge1-sample.csv",
        "msr.cut.per_10k.rw_40_60.1370.trace",
        "systor17-traces-sample.csv.gz",
        "cloud_storage-sample.bz2",
        "mobigen.out.twitter",
    ] {
        let (format, _, want) = read_all(&dir, file);
        let mut compact = Vec::new();
        let input = std::fs::File::open(dir.join(file)).unwrap();
        let summary = convert(input, None, file, &mut compact).unwrap();
        assert_eq!(
            (summary.format, summary.records),
            (format, want.len() as u64)
        );
        let back = open_reader(&compact[..], None, "compact").unwrap();
        assert_eq!(back.source_format(), Some(format));
        let got: Vec<TraceRecord> = back.collect::<Result<_, _>>().unwrap();
        assert!(got == want, "{file}: compact round trip differs");
    }
}
