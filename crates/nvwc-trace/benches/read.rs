//! Reader throughput on the real cloudPhysicsIO trace, repeated in memory to
//! at least 10 M records. Run with
//! `cargo bench -p nvwc-trace --bench read` (set `NVWC_TRACES_DIR` if the
//! traces are not in `../../../shared/traces` relative to this crate).

use nvwc_trace::{convert, open_reader, Format, COMPACT_HEADER_LEN};
use std::io::Read;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const TARGET_RECORDS: u64 = 10_000_000;
const RUNS: usize = 3;

/// `head` once, then `body` `reps` times, without materialising the copies.
struct Repeat<'a> {
    head: &'a [u8],
    body: &'a [u8],
    reps: u64,
    pos: usize,
}

impl Read for Repeat<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if !self.head.is_empty() {
            let n = self.head.len().min(buf.len());
            buf[..n].copy_from_slice(&self.head[..n]);
            self.head = &self.head[n..];
            return Ok(n);
        }
        while self.reps > 0 {
            let rest = &self.body[self.pos..];
            if rest.is_empty() {
                self.reps -= 1;
                self.pos = 0;
                continue;
            }
            let n = rest.len().min(buf.len());
            buf[..n].copy_from_slice(&rest[..n]);
            self.pos += n;
            return Ok(n);
        }
        Ok(0)
    }
}

fn traces_dir() -> PathBuf {
    match std::env::var_os("NVWC_TRACES_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let m = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
            m.canonicalize().unwrap_or(m).join("../../../shared/traces")
        }
    }
}

/// Nanoseconds this thread has spent on a CPU (Linux `schedstat`), so the
/// numbers mean something on a shared machine; `None` elsewhere.
fn cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// Best of `RUNS` timings of reading `head + body * reps` as `format`.
fn bench(label: &str, head: &[u8], body: &[u8], reps: u64, format: Format) {
    let mut best = Duration::MAX;
    let mut best_cpu = u64::MAX;
    let mut count = 0u64;
    for _ in 0..RUNS {
        let input = Repeat {
            head,
            body,
            reps,
            pos: 0,
        };
        let cpu0 = cpu_ns();
        let start = Instant::now();
        let reader = open_reader(input, Some(format), label).expect("open");
        let mut n = 0u64;
        let mut bytes = 0u64;
        for r in reader {
            let r = r.expect("record");
            n += 1;
            bytes = bytes.wrapping_add(r.len);
        }
        let t = start.elapsed();
        if let (Some(a), Some(b)) = (cpu0, cpu_ns()) {
            best_cpu = best_cpu.min(b - a);
        }
        std::hint::black_box(bytes);
        best = best.min(t);
        count = n;
    }
    let secs = best.as_secs_f64();
    let mb = (head.len() as f64 + body.len() as f64 * reps as f64) / 1e6;
    let cpu = if best_cpu == u64::MAX {
        String::new()
    } else {
        let c = best_cpu as f64 / 1e9;
        format!(
            "  (on-CPU {c:.3} s: {:.2} M records/s)",
            count as f64 / c / 1e6
        )
    };
    println!(
        "{label:<24} {count:>9} records  wall {secs:.3} s: {:>6.2} M records/s, {:>6.0} MB/s{cpu}",
        count as f64 / secs / 1e6,
        mb / secs
    );
}

fn main() {
    let dir = traces_dir();
    let Ok(vscsi) = std::fs::read(dir.join("cloudPhysicsIO.vscsi")) else {
        println!("SKIPPED: no cloudPhysicsIO.vscsi in {}", dir.display());
        return;
    };
    let records = (vscsi.len() / 32) as u64;
    let reps = TARGET_RECORDS.div_ceil(records);
    println!("cloudPhysicsIO: {records} records x {reps} repetitions (best of {RUNS})");

    bench("vscsi1 reader", &[], &vscsi, reps, Format::VscsiV1);

    let mut compact = Vec::new();
    convert(
        &vscsi[..],
        Some(Format::VscsiV1),
        "cloudPhysicsIO.vscsi",
        &mut compact,
    )
    .expect("convert");
    let (head, body) = compact.split_at(COMPACT_HEADER_LEN);
    bench("compact reader", head, body, reps, Format::Compact);

    if let Ok(csv) = std::fs::read(dir.join("cloudPhysicsIO.csv")) {
        // Text for reference: skip the header line in the repeated part.
        let cut = csv.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1);
        let (h, b) = csv.split_at(cut);
        bench(
            "cloudphysics csv (text)",
            h,
            b,
            reps / 4,
            Format::CloudPhysics,
        );
    }
}
