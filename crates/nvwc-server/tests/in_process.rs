//! The server started in the test's own process ([`Server::start`]) and
//! driven through the project's NBD client (`nvwc_nbd::Client`): writes,
//! FLUSH and reads for write-back and write-through, what survives a stop
//! and a restart, and a bad request answered with a clear error while
//! other connections keep being served. No external tool is needed.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use nvwc_nbd::{Client, ClientError};
use nvwc_server::{Args, Server};

mod common;
use common::raw_nbd::RawNbd;

/// A fresh directory for one test's files.
fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nvwc-in-process-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A server in `dir`: `policy` over a 64 MiB backing file with a 16 MiB
/// cache, on a unix socket only.
fn start(dir: &Path, policy: &str) -> Server {
    start_with(dir, policy, &[])
}

/// [`start`], with `extra` flags after the others.
fn start_with(dir: &Path, policy: &str, extra: &[&str]) -> Server {
    let p = |f: &str| dir.join(f).display().to_string();
    let flags = [
        "--backing",
        &p("backing.img"),
        "--cache",
        &p("cache.img"),
        "--unix",
        &p("nvwc.sock"),
        "--control",
        &p("nvwc.ctl"),
        "--listen",
        "none",
        "--size",
        "64M",
        "--cache-size",
        "16M",
        "--write-policy",
        policy,
    ];
    let a = Args::parse_flags(flags.iter().copied().chain(extra.iter().copied())).unwrap();
    Server::start(a).unwrap()
}

/// `len` bytes for offset `off` of write `seed`: every byte depends on its
/// offset, so data read from the wrong place is caught.
fn pattern(seed: u8, off: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| ((off + i) % 251) as u8 ^ seed.wrapping_mul(37))
        .collect()
}

/// Writes of whole blocks, a partial block, and a run across several
/// blocks; each (offset, data).
fn writes(seed: u8) -> Vec<(u64, Vec<u8>)> {
    [(0u64, 4096usize), (1 << 20, 3000), (5 << 20 | 512, 70_000)]
        .into_iter()
        .map(|(off, len)| (off, pattern(seed, off, len)))
        .collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Write [`writes`] through `uri` (the last with FUA), FLUSH, and read
/// every range back on a second connection.
async fn write_flush_read(uri: &str, seed: u8) {
    let c = Client::connect(uri).await.unwrap();
    assert_eq!(c.size(), 64 << 20, "the export is the backing file's size");
    let ws = writes(seed);
    for (i, (off, d)) in ws.iter().enumerate() {
        c.write(*off, d.clone(), i == ws.len() - 1).await.unwrap();
    }
    c.flush().await.unwrap();
    let other = Client::connect(uri).await.unwrap();
    for (off, d) in &ws {
        let got = other.read(*off, d.len() as u32).await.unwrap();
        assert!(got[..] == d[..], "read back at {off} differs");
    }
    // Never written: zeroes from the backing file.
    let hole = other.read(32 << 20, 8192).await.unwrap();
    assert!(
        hole.iter().all(|&b| b == 0),
        "an unwritten range reads zeroes"
    );
    c.disconnect().await.unwrap();
    other.disconnect().await.unwrap();
}

/// Read every range of [`writes`]`(seed)` through `uri`.
async fn read_back(uri: &str, seed: u8) {
    let c = Client::connect(uri).await.unwrap();
    for (off, d) in writes(seed) {
        let got = c.read(off, d.len() as u32).await.unwrap();
        assert!(got[..] == d[..], "after a restart, {off} differs");
    }
    c.disconnect().await.unwrap();
}

/// A fresh [`tempdir`] `tag`, a runtime for the client, and [`start`]'s
/// server of `policy` there.
fn setup(tag: &str, policy: &str) -> (PathBuf, tokio::runtime::Runtime, Server) {
    let dir = tempdir(tag);
    let s = start(&dir, policy);
    (dir, runtime(), s)
}

/// Stop `s`, start `policy` again on its files in `dir`, and read write
/// `seed`'s data back; then stop it and remove `dir`.
fn restart_and_read_back(
    rt: &tokio::runtime::Runtime,
    s: Server,
    dir: &Path,
    policy: &str,
    seed: u8,
) {
    s.stop().unwrap();
    let s = start(dir, policy);
    rt.block_on(read_back(&s.uri(""), seed));
    s.stop().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// Journaled over a backing file: a checkpoint group's redo log stays after
/// the group (two syncs a group, not three), and a clean stop clears it, so
/// that nothing replays it over writes made to the file after the stop.
#[test]
fn journaled_keeps_the_last_group_logged_until_a_clean_stop() {
    let dir = tempdir("jredo");
    let s = start_with(&dir, "journaled", &["--txn-age-ms", "20"]);
    let rt = runtime();
    rt.block_on(write_flush_read(&s.uri(""), 4));
    let log = dir.join("backing.img.nvwc-redo");
    let len = || std::fs::metadata(&log).map_or(0, |m| m.len());
    // Every write checkpointed (on the backing file), the last group still
    // in the log.
    let backing = std::fs::File::open(dir.join("backing.img")).unwrap();
    let on_backing = || {
        writes(4).iter().all(|(off, d)| {
            let mut got = vec![0u8; d.len()];
            backing.read_exact_at(&mut got, *off).unwrap();
            got == *d
        })
    };
    let t = std::time::Instant::now();
    while !(on_backing() && len() > 0) {
        assert!(
            t.elapsed().as_secs() < 30,
            "not checkpointed: on the backing file {}, log {} bytes",
            on_backing(),
            len()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    s.stop().unwrap();
    assert_eq!(len(), 0, "a clean stop clears the redo log");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Write-back: the flushed writes read back, and are still there after the
/// server stops and starts again on the same cache.
#[test]
fn write_back_write_flush_read_and_restart() {
    let (dir, rt, s) = setup("wb", "write-back");
    rt.block_on(write_flush_read(&s.uri(""), 1));
    restart_and_read_back(&rt, s, &dir, "write-back", 1);
}

/// Write-through: the writes read back, and the backing file itself holds
/// every one of them once they are acknowledged.
#[test]
fn write_through_reaches_the_backing_file() {
    let (dir, rt, s) = setup("wt", "write-through");
    rt.block_on(write_flush_read(&s.uri(""), 2));
    let backing = std::fs::File::open(dir.join("backing.img")).unwrap();
    for (off, d) in writes(2) {
        let mut got = vec![0u8; d.len()];
        backing.read_exact_at(&mut got, off).unwrap();
        assert!(got == d, "the backing file lacks the write at {off}");
    }
    restart_and_read_back(&rt, s, &dir, "write-through", 2);
}

/// A read past the end of the export gets EINVAL with a message saying so,
/// and the connection that sent it keeps working; an unknown export name is
/// refused at the handshake with its name in the message; meanwhile another
/// connection's writes and reads go on.
#[test]
fn a_bad_request_gets_a_clear_error_and_others_are_served() {
    const EINVAL: u32 = 22;
    let (dir, rt, s) = setup("bad", "write-back");
    let good = rt.block_on(Client::connect(&s.uri(""))).unwrap();
    let data = pattern(3, 8192, 8192);
    rt.block_on(good.write(8192, data.clone(), false)).unwrap();

    let mut raw = RawNbd::connect(s.unix_socket(), true);
    const READ: u16 = 0;
    raw.send(READ, 1, (64 << 20) - 4096, 8192, 0, 0);
    let r = raw.reply_full(1, 8192);
    assert_eq!(r.error, EINVAL, "past the end: EINVAL");
    assert!(
        r.message.contains("beyond end of export"),
        "the error says why: {:?}",
        r.message
    );
    // The same connection goes on: an in-range read sees the other's write.
    raw.send(READ, 2, 8192, 8192, 0, 0);
    let r = raw.reply_full(2, 8192);
    assert_eq!(r.error, 0, "in range after the error: {:?}", r.message);
    assert!(r.data == data, "the raw connection reads the other's write");

    let err = rt
        .block_on(Client::connect(&s.uri("no-such-export")))
        .unwrap_err();
    match &err {
        ClientError::OptionRejected { message, .. } => assert!(
            message.contains("no-such-export") && message.contains("not found"),
            "the refusal names the export: {message:?}"
        ),
        other => panic!("expected the export refused, got {other}"),
    }

    // The good connection was served throughout.
    rt.block_on(good.flush()).unwrap();
    let got = rt.block_on(good.read(8192, 8192)).unwrap();
    assert!(got[..] == data[..], "the good connection reads its write");
    rt.block_on(good.disconnect()).unwrap();
    s.stop().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// One line to the control socket in `dir`, its one-line JSON answer.
fn control(dir: &Path, cmd: &str) -> serde_json::Value {
    use std::io::{BufRead, BufReader, Write};
    let mut s = std::os::unix::net::UnixStream::connect(dir.join("nvwc.ctl")).unwrap();
    writeln!(s, "{cmd}").unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{cmd}: {e}: {line}"))
}

/// Write-back destages a sequential MiB (neighbouring blocks in
/// neighbouring slots) with a read per run of adjacent slots, not one per
/// block (`Host::read_batch`), and every byte lands on the backing file.
#[test]
fn destage_reads_adjacent_slots_with_one_call_per_run() {
    let (dir, rt, s) = setup("readruns", "write-back");
    let data = pattern(9, 8 << 20, 1 << 20);
    rt.block_on(async {
        let c = Client::connect(&s.uri("")).await.unwrap();
        for (i, chunk) in data.chunks(64 << 10).enumerate() {
            let off = (8 << 20) + (i as u64) * (64 << 10);
            c.write(off, chunk.to_vec(), false).await.unwrap();
        }
        c.flush().await.unwrap();
        c.disconnect().await.unwrap();
    });
    let before = control(&dir, "status");
    let flushed = control(&dir, "flush");
    assert!(flushed.to_string().contains("destaged"), "{flushed}");
    let after = control(&dir, "status");
    let n = |v: &serde_json::Value, group: &str, k: &str| {
        v["exports"][0][group][k]
            .as_u64()
            .unwrap_or_else(|| panic!("no {group}.{k} in {v}"))
    };
    let destaged = n(&after, "stats", "destaged_blocks") - n(&before, "stats", "destaged_blocks");
    let reads = n(&after, "stats", "cache_reads") - n(&before, "stats", "cache_reads");
    let calls = n(&after, "policy", "cache_read_calls") - n(&before, "policy", "cache_read_calls");
    assert_eq!(destaged, 256, "the MiB is destaged");
    assert_eq!(reads, 256, "one engine read per block");
    assert!(
        calls > 0 && calls * 8 <= reads,
        "{calls} read calls for {reads} adjacent blocks"
    );
    let backing = std::fs::File::open(dir.join("backing.img")).unwrap();
    let mut got = vec![0u8; data.len()];
    backing.read_exact_at(&mut got, 8 << 20).unwrap();
    assert!(got == data, "the backing file holds the MiB");
    s.stop().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
