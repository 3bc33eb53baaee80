//! `nvwc serve` with requests of every advertised size, up to the largest
//! payload, on the smallest cache and a small one, for every write policy:
//! what it advertises, errors for requests over the maximum on a connection
//! that keeps working, `kill -9` after FUA writes, and every byte read back;
//! and a cache of format 2 opened and reformatted.
//!
//! Needs Debian's `qemu-utils` and `libnbd-bin` (and `nbdkit` for the
//! upstream case). Missing tools skip the test, or fail it when
//! `NVWC_REQUIRE_TOOLS=1` (CI).

use std::process::Command;
use std::time::Instant;

mod common;
use common::serve::*;
use common::{require_tools, tool, tools};

/// The raw NBD connection, shared with nvwc-server's in-process tests.
#[path = "../../nvwc-server/tests/common/raw_nbd.rs"]
mod raw_nbd;
use raw_nbd::RawNbd;

/// The largest READ/WRITE payload the server advertises, whatever its cache.
const MAX_PAYLOAD: u32 = 32 << 20;
const WRITE_POLICIES: [&str; 5] = [
    "write-through",
    "write-back",
    "ordered",
    "journaled",
    "journaled-hints",
];

/// `len` bytes for export offset `off`, of write number `seed`: every byte
/// depends on its offset, so a range written at the wrong place, or a block
/// left from another write, is caught.
fn pattern(seed: u64, off: u64, len: usize) -> Vec<u8> {
    (off..off + len as u64)
        .map(|x| ((x ^ seed << 40).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8)
        .collect()
}

/// The peak resident memory of process `pid` (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib = st
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .expect("VmHWM in /proc/PID/status");
    kib << 10
}

/// One server: `policy` over a file backing (or an upstream nbdkit) with a
/// `cache`-sized cache. Checks what it advertises; that requests one byte
/// over the maximum get an error reply on a connection that keeps working
/// (and that a huge one is not buffered); `kill -9` right after a FUA write
/// of a few engine writes; then single requests of every size up to the
/// maximum, aligned and not, FUA and not, including write-zeroes, trim and
/// cache longer than the maximum; `kill -9` right after a FUA write of the
/// maximum at an unaligned offset; and after the restart every byte reads
/// back, through our client, qemu-io and nbdcopy, all with requests of the
/// maximum.
fn maxreq_case(policy: &str, cache: &str, upstream: bool) {
    use nvwc_nbd::Client;
    let what = format!(
        "{policy}, {cache} cache, {}",
        if upstream { "upstream" } else { "file" }
    );
    let dir = tempdir(&format!("maxreq-{policy}-{cache}-{upstream}"));
    let backing = Backing::new(&dir, upstream, "256M");
    let mut args = backing.args();
    // No commit by time: what survives `kill -9` is what FUA and FLUSH made durable.
    args.extend(
        [
            "--cache-size",
            cache,
            "--write-policy",
            policy,
            "--commit-interval-ms",
            "600000",
        ]
        .map(String::from),
    );
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let s = start_with(&dir, &refs);
    let t0 = Instant::now();

    // What a libnbd client is told.
    let out = Command::new("nbdinfo")
        .arg("--json")
        .arg(uri(&dir))
        .output()
        .unwrap();
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).expect("nbdinfo --json");
    let e = &info["exports"][0];
    assert_eq!(
        (
            e["block_size_minimum"].as_u64(),
            e["block_size_preferred"].as_u64(),
            e["block_size_maximum"].as_u64()
        ),
        (Some(1), Some(4096), Some(u64::from(MAX_PAYLOAD))),
        "{what}: advertised block sizes"
    );

    // One byte over the maximum: an error reply, and the connection (and
    // another) keeps working.
    let sock = dir.join("nvwc-data/nvwc.sock");
    let rss0 = peak_rss(s.0.id());
    for structured in [false, true] {
        let mut r = RawNbd::connect(&sock, structured);
        let over = MAX_PAYLOAD + 1;
        r.send(1, 1, 0, over, u64::from(over), 0xee);
        assert_eq!(r.reply(1, 0).0, 22, "{what}: write of max + 1: EINVAL");
        r.send(0, 2, 0, over, 0, 0);
        let want = if structured { 75 } else { 22 };
        assert_eq!(r.reply(2, over).0, want, "{what}: read of max + 1");
        // A huge write is skipped, not held: 512 MiB must not show in the
        // server's peak memory.
        r.send(1, 3, 0, 1 << 29, 1 << 29, 0xee);
        assert_eq!(r.reply(3, 0).0, 22, "{what}: huge write: EINVAL");
        r.send(0, 4, 0, 4096, 0, 0);
        let (err, data) = r.reply(4, 4096);
        assert_eq!(
            (err, data.len()),
            (0, 4096),
            "{what}: same connection after"
        );
    }
    let rss1 = peak_rss(s.0.id());
    assert!(
        rss1 < rss0 + (64 << 20),
        "{what}: refused writes were held in memory: peak RSS {rss0} -> {rss1}"
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let check = |c: &Client, ranges: &[(u64, usize, u64)], what: &str| {
        rt.block_on(async {
            for &(off, len, seed) in ranges {
                let got = c.read(off, len as u32).await.expect("read");
                assert!(
                    got[..] == pattern(seed, off, len)[..],
                    "{what}: {len} bytes at {off} read back wrong"
                );
            }
        })
    };
    let mut expect: Vec<(u64, usize, u64)> = Vec::new();

    // A FUA write a little longer than one engine write on the 16 MiB
    // cache (many on the smallest), its head a partial block, into an idle
    // cache, then `kill -9`: every engine write is durable, the first too (a
    // partial write that is not FUA becomes a patch in RAM, which the
    // commit of a later FUA engine write does not cover).
    let early = (150 << 20 | 1000, (9 << 20) + 555, 77);
    rt.block_on(async {
        let c = Client::connect(&uri(&dir)).await.unwrap();
        let (off, len, seed) = early;
        c.write(off, bytes::Bytes::from(pattern(seed, off, len)), true)
            .await
            .unwrap_or_else(|e| panic!("{what}: FUA write of {len} at {off}: {e}"));
    });
    expect.push(early);
    drop(s);
    let s = start_with(&dir, &refs);
    let c = rt.block_on(Client::connect(&uri(&dir))).unwrap();
    check(&c, &expect, &format!("{what}, after kill -9"));
    rt.block_on(c.disconnect()).unwrap();

    let max = MAX_PAYLOAD as usize;
    // (offset, length, FUA): every size up to the maximum, one request each.
    let writes: [(u64, usize, bool); 7] = [
        (0, 4096, false),
        (1 << 20, 1 << 20, false),
        (2 << 20, 8 << 20, true),
        (10 << 20, 16 << 20, false),
        (32 << 20, max, false),
        // Not aligned, in offset and length.
        (64 << 20, max - 12345, false),
        (96 << 20, 5 << 20 | 777, true),
    ];
    // Written last, with FUA, right before `kill -9`: the maximum, not aligned.
    let fua_max = (104 << 20 | 1000, max);
    // Longer than the maximum (no payload): zeroes over the first two
    // writes' tail, trim and cache anywhere.
    let zero = (40 << 20 | 333, 40 << 20);
    {
        let c = rt.block_on(Client::connect(&uri(&dir))).unwrap();
        assert_eq!(c.info().max_block, MAX_PAYLOAD);
        rt.block_on(async {
            for (i, &(off, len, fua)) in writes.iter().enumerate() {
                let seed = i as u64 + 1;
                c.write(off, bytes::Bytes::from(pattern(seed, off, len)), fua)
                    .await
                    .unwrap_or_else(|e| panic!("{what}: write of {len} at {off}: {e}"));
                expect.push((off, len, seed));
            }
            c.write_zeroes(zero.0, zero.1, Default::default())
                .await
                .unwrap_or_else(|e| panic!("{what}: write-zeroes {zero:?}: {e}"));
            c.trim(160 << 20, 48 << 20, false)
                .await
                .unwrap_or_else(|e| panic!("{what}: trim: {e}"));
            c.cache(0, 64 << 20)
                .await
                .unwrap_or_else(|e| panic!("{what}: cache: {e}"));
            c.flush().await.unwrap();
        });
        // The zeroes cut the 32 MiB write at 32M short, and the next one's head.
        expect[5].1 = (zero.0 - expect[5].0) as usize;
        let end = zero.0 + u64::from(zero.1);
        let (o6, l6, s6) = expect[6];
        expect[6] = (end, (o6 + l6 as u64 - end) as usize, s6);
        check(&c, &expect, &what);
        rt.block_on(async {
            let seed = 99;
            let (off, len) = fua_max;
            c.write(off, bytes::Bytes::from(pattern(seed, off, len)), true)
                .await
                .unwrap_or_else(|e| panic!("{what}: FUA write of the maximum: {e}"));
            expect.push((off, len, seed));
        });
    }
    // Crash right after the FUA write's reply: all of it is durable.
    drop(s);
    let s = start_with(&dir, &refs);
    let c = rt.block_on(Client::connect(&uri(&dir))).unwrap();
    check(&c, &expect, &format!("{what}, after kill -9"));
    rt.block_on(async {
        let mut at = zero.0;
        while at < zero.0 + u64::from(zero.1) {
            let len = (zero.0 + u64::from(zero.1) - at).min(u64::from(MAX_PAYLOAD)) as u32;
            let got = c.read(at, len).await.unwrap();
            assert!(got.iter().all(|&b| b == 0), "{what}: zeroes at {at}");
            at += u64::from(len);
        }
        c.disconnect().await.unwrap();
    });

    // Real clients with requests of the maximum: qemu-io (one 32 MiB request
    // each) and nbdcopy (libnbd refuses requests over the advertised maximum).
    qemu_io(
        &dir,
        &[
            "write -P 0x5a 200M 32M",
            "read -P 0x5a 200M 32M",
            "write -P 0xa5 150001 32M",
            "read -P 0xa5 150001 32M",
        ],
    );
    let src = dir.join("src.bin");
    let back = dir.join("back.bin");
    must(&format!(
        "head -c 33566777 /dev/urandom > {}",
        src.display()
    ));
    let opts = "--request-size=33554432 --connections=1";
    nbdcopy_round_trip(
        &dir,
        &src,
        &back,
        [&format!("{opts} --flush"), opts],
        "33566777",
        &what,
    );
    eprintln!("{what}: {:?}", t0.elapsed());
    drop(s);
    clean_up(&dir, backing);
}

/// [`maxreq_case`] for every write policy on a `cache`-byte cache; false
/// (skipped) without the clients.
fn maxreq_every_policy(cache: &str) -> bool {
    if !tools(&["qemu-io", "nbdinfo", "nbdcopy"]) {
        return false;
    }
    for policy in WRITE_POLICIES {
        maxreq_case(policy, cache, false);
    }
    true
}

/// Every request up to the advertised maximum works on the smallest cache
/// the server accepts (16 blocks: each 32 MiB write is 1024 engine writes),
/// for every write policy.
#[test]
fn maxreq_smallest_cache_every_policy() {
    maxreq_every_policy("100K");
}

/// The same on a 16 MiB cache (32 MiB writes are five engine writes), for
/// every write policy, and journaled over an upstream NBD server, where
/// engine writes are at most 8 MiB (a checkpoint group's bound).
#[test]
fn maxreq_16m_cache_every_policy() {
    if maxreq_every_policy("16M") && tool("nbdkit") {
        maxreq_case("journaled", "64M", true);
    }
}

/// A cache of format 2 (no metadata log) opens with its own geometry,
/// keeps what a FLUSH made durable across `kill -9`, stays format 2, and
/// after `nvwc detach` the next start reformats it as format 3 with a log.
#[test]
fn format2_cache_opens_and_detach_reformats_it_with_a_log() {
    use nvwc_core::layout::{self, Superblock};
    use std::os::unix::fs::FileExt;
    require_tools!("qemu-io");
    let dir = tempdir("fmt2");
    let b = Backing::new(&dir, false, "64M");
    stop(start(&dir, "write-back", &b));
    let path = dir.join("nvwc-data/cache.img");
    let superblock = || {
        let f = std::fs::File::open(&path).unwrap();
        let mut raw = vec![0u8; 512];
        f.read_exact_at(&mut raw, 0).unwrap();
        Superblock::decode(&raw).unwrap()
    };
    let sb = superblock();
    assert_eq!(sb.version, layout::FORMAT_VERSION);
    assert!(sb.log_pages > 0);
    // The same cache, bound to the same store, as a format 2 build wrote it.
    let mut cfg = nvwc_core::Config::new(
        sb.block_size,
        sb.capacity,
        sb.backing_size,
        nvwc_core::WritePolicyKind::WriteBack,
    );
    cfg.log_pages = 0;
    {
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        for (off, bytes) in layout::format_writes(&cfg, sb.uuid) {
            f.write_all_at(&bytes, off).unwrap();
        }
        let mut old = Superblock::for_config(&cfg, sb.uuid);
        old.version = 2;
        old.backing = sb.backing.clone();
        f.write_all_at(&old.encode(), 0).unwrap();
        f.sync_all().unwrap();
    }
    let s = start(&dir, "write-back", &b);
    qemu_io(
        &dir,
        &[
            "write -P 0xab 0 1M",
            "flush",
            "write -P 0xcd 4M 64k",
            "flush",
        ],
    );
    drop(s); // kill -9
    let s = start(&dir, "write-back", &b);
    qemu_io(&dir, &["read -P 0xab 0 1M", "read -P 0xcd 4M 64k"]);
    let sb2 = superblock();
    assert_eq!(
        (sb2.version, sb2.log_pages),
        (2, 0),
        "still format 2, no log"
    );
    detach(&dir, s);
    let s = start(&dir, "write-back", &b);
    qemu_io(&dir, &["read -P 0xab 0 1M", "read -P 0xcd 4M 64k"]);
    let sb3 = superblock();
    assert_eq!(sb3.version, layout::FORMAT_VERSION, "reformatted");
    assert!(sb3.log_pages > 0);
    stop(s);
}
