//! `nvwc serve` with real NBD clients (qemu-io, nbdinfo), for every write
//! policy: pattern writes and reads, FUA, write-zeroes, discard, flush; then
//! `kill -9`, restart, and the flushed data must be there.
//!
//! Needs Debian's `qemu-utils` and `libnbd-bin`. Missing tools skip the test,
//! or fail it when `NVWC_REQUIRE_TOOLS=1` (CI).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::serve::*;
use common::{poll_until, require_tools, strict};

/// Every write policy, by its `--write-policy` name.
const POLICIES: [&str; 5] = [
    "write-through",
    "write-back",
    "ordered",
    "journaled",
    "journaled-hints",
];

#[test]
fn real_clients_every_policy_and_kill9_recovery() {
    require_tools!("qemu-io", "nbdinfo");
    for (upstream, policy) in backing_kinds()
        .into_iter()
        .flat_map(|u| POLICIES.map(|p| (u, p)))
    {
        let dir = tempdir(&format!("{policy}-{upstream}"));
        let backing = Backing::new(&dir, upstream, "64M");
        let policy_name = format!("{policy} over {}", backing.name());
        let policy = policy_name.as_str();
        let pol = policy.split(' ').next().unwrap();
        let s = start(&dir, pol, &backing);
        for flag in ["flush", "fua", "multi-conn", "trim", "zero"] {
            let ok = Command::new("nbdinfo")
                .args(["--can", flag])
                .arg(uri(&dir))
                .status()
                .unwrap()
                .success();
            assert!(ok, "{policy}: nbdinfo --can {flag}");
        }
        let map = Command::new("nbdinfo")
            .arg("--map")
            .arg(uri(&dir))
            .output()
            .unwrap();
        assert!(
            map.status.success() && !map.stdout.is_empty(),
            "{policy}: nbdinfo --map"
        );
        // More data than the 8 MiB cache holds, so destaging and eviction run.
        let megabytes =
            |op: &'static str| (0..12).map(move |i| format!("{op} -P {} {i}M 1M", 0x10 + i));
        let mut cmds: Vec<String> = megabytes("write").collect();
        cmds.push("write -f -P 0xcd 20M 64k".into());
        cmds.push("write -z 21M 64k".into());
        cmds.push("write -P 0x77 22M 6k".into());
        cmds.push("discard 30M 64k".into());
        cmds.push("flush".into());
        // Everything written above, as it must read back.
        let mut check: Vec<String> = megabytes("read").collect();
        check.push("read -P 0xcd 20M 64k".into());
        check.push("read -P 0 21M 64k".into());
        check.push("read -P 0x77 22M 6k".into());
        cmds.extend(check.iter().cloned());
        let refs: Vec<&str> = cmds.iter().map(String::as_str).collect();
        qemu_io(&dir, &refs);
        // Crash the server: everything flushed must come back.
        drop(s);
        let s = start(&dir, pol, &backing);
        let refs: Vec<&str> = check.iter().map(String::as_str).collect();
        qemu_io(&dir, &refs);
        // A wrong pattern must be caught (the check can fail).
        let bad = Command::new("qemu-io")
            .args(["-f", "raw", "-c", "read -P 0x99 0 4k"])
            .arg(uri(&dir))
            .output()
            .unwrap();
        let t = common::text(&bad);
        assert!(
            t.contains("Pattern verification failed"),
            "{policy}: wrong pattern not detected: {t}"
        );
        drop(s);
        clean_up(&dir, backing);
    }
}

/// Attach the export as a block device: nbdfuse exposes it as a file, losetup as /dev/loopN.
struct Attached {
    fuse_dir: PathBuf,
    fuse: Child,
    loopdev: String,
}

impl Attached {
    fn new(dir: &Path) -> Attached {
        let fuse_dir = dir.join("fuse");
        std::fs::create_dir_all(&fuse_dir).unwrap();
        let fuse = Command::new("nbdfuse")
            .arg(fuse_dir.join("disk"))
            .arg(uri(dir))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nbdfuse");
        wait_for(&fuse_dir.join("disk"), "nbdfuse");
        let loopdev = must(&format!(
            "losetup -f --show {}",
            fuse_dir.join("disk").display()
        ))
        .trim()
        .to_string();
        Attached {
            fuse_dir,
            fuse,
            loopdev,
        }
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        let _ = sh(&format!("losetup -d {}", self.loopdev));
        nvwc_harness::ext4::stop_nbdfuse(&self.fuse_dir, &mut self.fuse);
    }
}

/// ext4 on nvwc through nbdfuse and a loop device: write, fsync, unmount,
/// restart the server, mount again: contents intact and `e2fsck -fn` clean.
#[test]
fn ext4_round_trip_across_restart() {
    require_tools!("nbdfuse", "mkfs.ext4", "losetup", "e2fsck");
    let root = sh("id -u").1.trim() == "0";
    if !root || !Path::new("/dev/fuse").exists() {
        if strict() {
            panic!("the ext4 round trip needs root and /dev/fuse");
        }
        eprintln!("SKIP: needs root and /dev/fuse");
        return;
    }
    for (upstream, policy) in backing_kinds()
        .into_iter()
        .flat_map(|u| ["write-back", "journaled"].map(|p| (u, p)))
    {
        let dir = tempdir(&format!("fs-{policy}-{upstream}"));
        let mnt = dir.join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        let backing = Backing::new(&dir, upstream, "64M");
        let s = start(&dir, policy, &backing);
        {
            let a = Attached::new(&dir);
            must(&format!("mkfs.ext4 -q -F {}", a.loopdev));
            must(&format!("mount {} {}", a.loopdev, mnt.display()));
            must(&format!(
                "cd {m} && head -c 3000000 /dev/urandom > big && for i in $(seq 1 40); do echo line$i > f$i; echo more >> f$i; done && mv f1 renamed && sync && md5sum big renamed f40 > ../sums",
                m = mnt.display()
            ));
            must(&format!("umount {}", mnt.display()));
        }
        stop(s);
        let s = start(&dir, policy, &backing);
        {
            let a = Attached::new(&dir);
            let out = must(&format!("e2fsck -fn {}", a.loopdev));
            assert!(
                out.contains("clean") || out.contains("Pass 5"),
                "{policy} over {}: e2fsck: {out}",
                backing.name()
            );
            must(&format!("mount {} {}", a.loopdev, mnt.display()));
            must(&format!("cd {} && md5sum -c ../sums", mnt.display()));
            must(&format!("umount {}", mnt.display()));
        }
        stop(s);
        clean_up(&dir, backing);
    }
}

/// nbdcopy with 4 connections in and out (multi-conn), identical checksums;
/// fio's nbd engine with crc32c verification.
#[test]
fn nbdcopy_and_fio_verify() {
    require_tools!("nbdcopy", "fio");
    for upstream in backing_kinds() {
        let dir = tempdir(&format!("copy-{upstream}"));
        let backing = Backing::new(&dir, upstream, "512M");
        let what = backing.name();
        // 256 MiB (the acceptance size) through a 64 MiB cache: the
        // copy in destages and evicts all along, the copy out reads mostly
        // misses.
        let mut args = backing.args();
        args.extend(["--cache-size", "64M", "--write-policy", "write-back"].map(String::from));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let s = start_with(&dir, &refs);
        let src = dir.join("src.bin");
        let back = dir.join("back.bin");
        let t0 = Instant::now();
        must(&format!("head -c 256M /dev/urandom > {}", src.display()));
        let conns = "--connections=4";
        nbdcopy_round_trip(&dir, &src, &back, [conns, conns], "256M", what);
        eprintln!("{what}: nbdcopy 256 MiB in and out: {:?}", t0.elapsed());
        let sock = dir.join("nvwc-data/nvwc.sock");
        // Over data the copy left (offset 16M): a stale or misplaced block
        // fails the crc32c check.
        for rw in ["randwrite", "randrw"] {
            for bs in ["4k", "64k"] {
                let out = must(&format!(
                    "fio --name=v --ioengine=nbd --uri='nbd+unix:///?socket={}' --rw={rw} --bs={bs} --size=16M --iodepth=16 --verify=crc32c --verify_state_save=0 --do_verify=1 --verify_fatal=1 --offset=16M 2>&1",
                    sock.display()
                ));
                assert_fio_clean(&out, &format!("{what}: fio {rw} {bs}"));
            }
        }
        drop(s);
        clean_up(&dir, backing);
    }
}

/// Direct writes (a large write's payload received from the unix socket
/// straight into the mapped cache file): fio's 64 KiB writes with crc32c
/// take that path, a final FLUSH, `kill -9`, restart, and fio verifies every
/// block again, for each write policy that caches writes, rewriting in place
/// and not.
#[test]
fn direct_writes_fio_verify_across_kill9() {
    require_tools!("fio", "nbdcopy");
    for (policy, extra) in [
        ("write-back", ""),
        ("write-back", "--rewrite-in-place=false"),
        ("ordered", ""),
        ("journaled", ""),
    ] {
        let what = format!("{policy} {extra}");
        let dir = tempdir(&format!("direct-{policy}{}", extra.len()));
        let mut args = vec![
            "--size",
            "256M",
            "--cache-size",
            "128M",
            "--write-policy",
            policy,
        ];
        if !extra.is_empty() {
            args.push(extra);
        }
        let sock = dir.join("nvwc-data/nvwc.sock");
        let fio = |verify_only: bool| {
            let mode = if verify_only {
                "--verify_only=1"
            } else {
                "--do_verify=1 --end_fsync=1"
            };
            must(&format!(
                "fio --name=d --ioengine=nbd --uri='nbd+unix:///?socket={}' --rw=randwrite --bs=64k --size=32M --iodepth=16 --randseed=7 --verify=crc32c --verify_state_save=0 --verify_fatal=1 {mode} 2>&1",
                sock.display()
            ))
        };
        let s = start_with(&dir, &args);
        // Twice: the second pass rewrites every block (in place where allowed).
        for _ in 0..2 {
            let out = fio(false);
            assert_fio_clean(&out, &what);
        }
        let direct = status_counter(&dir, "direct_writes");
        let writes = status_counter(&dir, "writes");
        assert!(
            direct * 2 > writes,
            "{what}: {direct} of {writes} writes direct"
        );
        // The whole export as flushed (fio's final FLUSH), before and after
        // kill -9: identical (fio's own check below cannot tell the second
        // pass's blocks from the first's).
        let image = |tag: &str| {
            let f = dir.join(format!("{tag}.img"));
            must(&format!("nbdcopy '{}' {}", uri(&dir), f.display()));
            must(&format!("md5sum < {}", f.display()))
        };
        let before = image("before");
        drop(s); // kill -9
        let s = start_with(&dir, &args);
        assert_eq!(
            image("after"),
            before,
            "{what}: flushed data changed across kill -9"
        );
        let out = fio(true);
        assert_fio_clean(&out, &format!("{what}: after kill -9"));
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Upstream mode: the backing store is an nbdkit `file` export on a unix
/// socket, for every write policy. Journaled ones keep their redo region at
/// the end of the upstream: after `kill -9`, `nvwc recover --backing nbd://…`
/// and a restart, everything flushed reads back; after `nvwc detach` the
/// upstream file alone holds the data.
#[test]
fn upstream_nbdkit_backing() {
    require_tools!("nbdkit", "qemu-io", "fio");
    for policy in POLICIES {
        let dir = tempdir(&format!("up-{policy}"));
        let up = Backing::new(&dir, true, "64M");
        let backing = up.uri().expect("an upstream backing").to_string();
        let s = start(&dir, policy, &up);
        let sock = dir.join("nvwc-data/nvwc.sock");
        qemu_io(
            &dir,
            &[
                "write -P 0x31 0 12M",
                "write -f -P 0x32 12M 64k",
                "flush",
                "read -P 0x31 0 12M",
                "read -P 0x32 12M 64k",
            ],
        );
        let out = must(&format!(
            "fio --name=v --ioengine=nbd --uri='nbd+unix:///?socket={}' --rw=randwrite --bs=4k --size=8M --offset=32M --iodepth=16 --verify=crc32c --verify_state_save=0 --verify_fatal=1 2>&1",
            sock.display()
        ));
        assert!(out.contains("err= 0"), "{policy}: fio: {out}");
        let journaled = policy.starts_with("journaled");
        if journaled {
            qemu_io(&dir, &["write -P 0x33 13M 1M", "flush"]);
            // Crash, finish any interrupted checkpoint on the upstream alone.
            drop(s);
            let out = Command::new(env!("CARGO_BIN_EXE_nvwc"))
                .args(["recover", "--backing", &backing])
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            assert!(
                out.status.success() && text.contains("consistent"),
                "{policy}: recover: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            );
        } else {
            stop(s);
        }
        // The dirty data is in the cache; the upstream holds at least what
        // was destaged. Read the flushed range back through nvwc.
        let args = [
            "--backing",
            &backing,
            "--cache-size",
            "8M",
            "--write-policy",
            policy,
        ];
        let s = start_with(&dir, &args);
        qemu_io(&dir, &["read -P 0x31 0 12M", "read -P 0x32 12M 64k"]);
        if journaled {
            qemu_io(&dir, &["read -P 0x33 13M 1M"]);
            // The export ends where the redo region begins.
            let size = must(&format!("nbdinfo --size '{}'", uri(&dir)));
            let size: u64 = size.trim().parse().unwrap();
            assert!(
                (32 << 20..64 << 20).contains(&size),
                "{policy}: size {size}"
            );
            // Detach: the upstream file alone holds every write.
            detach(&dir, s);
            qemu_io_file(
                &dir.join("up.img"),
                &[
                    "read -P 0x31 0 12M",
                    "read -P 0x32 12M 64k",
                    "read -P 0x33 13M 1M",
                ],
                &format!("{policy}: upstream after detach"),
            );
        } else {
            drop(s);
        }
        drop(up);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `nvwc status` / `flush` / `detach` through the control socket; after
/// detach the server has exited and the backing file alone holds the data.
#[test]
fn control_socket_flush_and_detach() {
    require_tools!("qemu-io");
    for policy in ["write-back", "ordered", "journaled"] {
        let dir = tempdir(&format!("ctl-{policy}"));
        let mut s = start(&dir, policy, &Backing::File("64M"));
        // The cache file's space is reserved when it is created (no ENOSPC
        // later); the backing file stays sparse.
        {
            use std::os::unix::fs::MetadataExt;
            let allocated = |f: &str| std::fs::metadata(dir.join(f)).unwrap().blocks() * 512;
            assert!(
                allocated("nvwc-data/cache.img") >= 8 << 20,
                "cache file not preallocated: {} bytes",
                allocated("nvwc-data/cache.img")
            );
            assert!(
                allocated("nvwc-data/backing.img") < 64 << 20,
                "backing file not sparse"
            );
        }
        qemu_io(&dir, &["write -P 0x6b 0 3M", "write -P 0x6c 5M 100k"]);
        let nvwc = |cmd: &str| {
            let (ok, out) = nvwc_in(&dir, &[cmd]);
            assert!(ok, "nvwc {cmd}: {out}");
            out
        };
        let st = nvwc("status");
        assert!(
            st.contains("\"dirty_blocks\":") && st.contains("\"writes\":2"),
            "{policy}: status: {st}"
        );
        let fl = nvwc("flush");
        assert!(fl.contains("\"dirty_blocks\":0"), "{policy}: flush: {fl}");
        // A finished flush does not leave the engine draining: under
        // write-back a later small write stays dirty in the cache.
        qemu_io(&dir, &["write -P 0x6d 9M 64k"]);
        if policy == "write-back" {
            std::thread::sleep(Duration::from_millis(500));
            let st = nvwc("status");
            assert!(
                !st.contains("\"dirty_blocks\":0,"),
                "{policy}: a write after `nvwc flush` was destaged at once: {st}"
            );
        }
        let de = nvwc("detach");
        assert!(de.contains("\"ok\":true"), "{policy}: detach: {de}");
        wait_exit(&mut s, &format!("{policy}: detach"));
        qemu_io_file(
            &dir.join("nvwc-data/backing.img"),
            &[
                "read -P 0x6b 0 3M",
                "read -P 0x6c 5M 100k",
                "read -P 0x6d 9M 64k",
            ],
            &format!("{policy}: backing after detach"),
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Non-blocking writes in the live server: fio's crc32c verification with
/// 2 KiB writes (every write partial for 4 KiB cache blocks) in every fetch
/// mode, with FLUSHes during the run and a patch memory small enough that
/// fallbacks and background cleaning happen; then patched writes covered by
/// a FLUSH survive `kill -9`.
#[test]
fn partial_writes_every_fetch_mode() {
    require_tools!("fio", "qemu-io");
    for (policy, fetch, direct) in [
        ("write-back", "blocking", false),
        ("write-back", "async", false),
        ("write-back", "async-bg", false),
        ("write-back", "lazy", false),
        ("write-back", "lazy", true),
        ("ordered", "lazy", false),
        ("journaled", "async-bg", false),
    ] {
        let dir = tempdir(&format!("nbw-{policy}-{fetch}-{direct}"));
        let flags = format!(
            "--size 64M --cache-size 16M --write-policy {policy} --fetch {fetch} --patch-mem 256K"
        );
        let mut args: Vec<&str> = flags.split_whitespace().collect();
        if direct {
            args.push("--patch-direct");
        }
        let s = start_with(&dir, &args);
        let sock = dir.join("nvwc-data/nvwc.sock");
        let out = must(&format!(
            "fio --name=v --ioengine=nbd --uri='nbd+unix:///?socket={}' --rw=randwrite --bs=2k --size=16M --iodepth=16 --fsync=64 --verify=crc32c --verify_state_save=0 --do_verify=1 --verify_fatal=1 2>&1",
            sock.display()
        ));
        assert_fio_clean(
            &out,
            &format!("fio {policy} --fetch {fetch} direct={direct}"),
        );
        let created = status_counter(&dir, "patches_created");
        assert_eq!(
            created > 0,
            fetch != "blocking",
            "{policy} --fetch {fetch}: patches_created={created}"
        );
        // Patched writes (partial, to blocks fio never touched), a FLUSH, kill -9.
        qemu_io(
            &dir,
            &[
                "write -P 0x5a 40M 2k",
                "write -P 0x6b 41M 1k",
                "write -P 0x7c 42M 3k",
                "flush",
            ],
        );
        drop(s);
        let s = start_with(&dir, &args);
        qemu_io(
            &dir,
            &[
                "read -P 0x5a 40M 2k",
                "read -P 0x6b 41M 1k",
                "read -P 0x7c 42M 3k",
                "read -P 0 41945088 2k",
            ],
        );
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Several exports on one server, each with its own engine, cache and
/// backing: `nbdinfo --list` shows them, qemu-io writes a different pattern
/// to each at the same offsets, and each reads back only its own, also after
/// `kill -9` and a restart. The JSON logs name each connection's client and
/// its disconnect.
#[test]
fn several_exports_and_json_logs() {
    require_tools!("qemu-io", "nbdinfo");
    let dir = tempdir("multi");
    let spawn = |dir: &Path| {
        let _ = std::fs::remove_file(dir.join("nvwc-data/nvwc.sock"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("log.json"))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_nvwc"))
            .current_dir(dir)
            .args([
                "serve",
                "--listen",
                "none",
                "--size",
                "32M",
                "--cache-size",
                "4M",
            ])
            .args(["--log-format", "json", "--txn-blocks", "16"])
            .args(["--export", "db=db.img,size=16M,policy=journaled"])
            .args([
                "--export",
                "logs=logs.img,size=8M,cache-size=2M,policy=ordered,replacement=arc",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        wait_for(&dir.join("nvwc-data/nvwc.sock"), "server");
        std::thread::sleep(Duration::from_millis(100));
        Server(child)
    };
    let sock = dir.join("nvwc-data/nvwc.sock");
    let named = |name: &str| format!("nbd+unix:///{name}?socket={}", sock.display());
    let io = |u: &str, cmds: &[String]| {
        let mut c = Command::new("qemu-io");
        c.args(["-f", "raw"]);
        for x in cmds {
            c.arg("-c").arg(x);
        }
        let out = c.arg(u).output().unwrap();
        let t = common::text(&out);
        assert!(out.status.success() && !t.contains("failed"), "{u}: {t}");
    };
    let s = spawn(&dir);
    let list = must(&format!("nbdinfo --list '{}'", uri(&dir)));
    for (name, size) in [
        ("\"\"", "33554432"),
        ("\"db\"", "16777216"),
        ("\"logs\"", "8388608"),
    ] {
        assert!(
            list.contains(&format!("export={name}")),
            "nbdinfo --list: {list}"
        );
        assert!(list.contains(size), "nbdinfo --list: {list}");
    }
    let exports = [
        (String::new(), 0x41),
        ("db".to_string(), 0x42),
        ("logs".to_string(), 0x43),
    ];
    for (name, p) in &exports {
        io(
            &named(name),
            &[
                format!("write -P {p} 0 3M"),
                format!("write -P {p} 5M 100k"),
                "flush".into(),
            ],
        );
    }
    for (name, p) in &exports {
        io(
            &named(name),
            &[format!("read -P {p} 0 3M"), format!("read -P {p} 5M 100k")],
        );
    }
    // A name nobody serves is refused.
    let bad = Command::new("nbdinfo").arg(named("nope")).output().unwrap();
    assert!(!bad.status.success(), "unknown export accepted");
    drop(s); // kill -9
    let s = spawn(&dir);
    for (name, p) in &exports {
        io(
            &named(name),
            &[format!("read -P {p} 0 3M"), format!("read -P {p} 5M 100k")],
        );
    }
    stop(s);
    let log = std::fs::read_to_string(dir.join("log.json")).unwrap();
    let mut events = std::collections::HashMap::<String, usize>::new();
    for line in log.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(v["ts"].is_string() && v["level"].is_string(), "{line}");
        let ev = v["event"].as_str().unwrap().to_string();
        if ev == "connect" {
            assert_eq!(v["client"], "unix", "{line}");
            assert!(v["conn"].as_u64().unwrap() > 0, "{line}");
        }
        if ev == "disconnect" {
            assert!(v["reason"].is_string(), "{line}");
        }
        *events.entry(ev).or_default() += 1;
    }
    assert!(events.get("connect") >= Some(&8), "{events:?}");
    assert!(events.get("disconnect") >= Some(&8), "{events:?}");
    assert_eq!(events.get("export"), Some(&6), "two starts: {events:?}");
    assert_eq!(events.get("stopped"), Some(&3), "{events:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Admission in the live server: with `--admission critical`, a plain
/// client's writes go straight to the backing file; after `nvwc hint` marks
/// its connection critical they are cached; `--export :critical` marks a
/// whole export. Status shows the counters and the connections.
#[test]
fn admission_hints_per_connection_and_export() {
    require_tools!("qemu-io");
    let dir = tempdir("admission");
    let nvwc = |args: &[&str]| nvwc_in(&dir, args);
    let stat = |name: &str| -> u64 {
        let (ok, st) = nvwc(&["status"]);
        assert!(ok, "{st}");
        let key = format!("\"{name}\":");
        let at = st.find(&key).unwrap_or_else(|| panic!("{name} in {st}")) + key.len();
        st[at..].split([',', '}']).next().unwrap().parse().unwrap()
    };
    // A free loopback port for the Prometheus endpoint.
    let maddr = format!("127.0.0.1:{}", common::free_port());
    let scrape = || -> String {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(&maddr).expect("metrics endpoint");
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut body = String::new();
        c.read_to_string(&mut body).unwrap();
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        body
    };
    // The value of one series (whole line before the value must match).
    let series = |body: &str, name: &str| -> u64 {
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("{name} not in metrics:\n{body}"))
            .parse()
            .unwrap()
    };
    let args = [
        "--size",
        "64M",
        "--cache-size",
        "8M",
        "--admission",
        "critical",
        "--metrics",
        &maddr,
    ];
    let s = start_with(&dir, &args);
    qemu_io(&dir, &["write -P 0x11 0 64k"]);
    assert_eq!(stat("bypassed_pieces"), 16);
    assert_eq!(stat("admitted_pieces"), 0);
    assert_eq!(stat("critical_bypassed_pieces"), 0);
    let backing = std::fs::read(dir.join("nvwc-data/backing.img")).unwrap();
    assert!(
        backing[..65536].iter().all(|&b| b == 0x11),
        "a bypassed write is on the backing file when acknowledged"
    );
    // A long-lived client: hint its connection, then it writes.
    let mut q = Command::new("qemu-io")
        .args([
            "-t",
            "writeback",
            "-f",
            "raw",
            "-c",
            "sleep 3000",
            "-c",
            "write -P 0x22 1M 64k",
        ])
        .arg(uri(&dir))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    const FIRST_ID: &str = "\"connections\":[{\"id\":";
    let mut last = String::new();
    let id = poll_until(Duration::from_secs(10), Duration::from_millis(20), || {
        let (_, st) = nvwc(&["status"]);
        let id = st.find(FIRST_ID).map(|at| {
            let rest = &st[at + FIRST_ID.len()..];
            rest.split(',').next().unwrap().to_string()
        });
        last = st;
        id
    })
    .unwrap_or_else(|| panic!("no connection in status: {last}"));
    let (ok, out) = nvwc(&[
        "hint",
        "--connection",
        &id,
        "--critical",
        "on",
        "--export",
        "",
    ]);
    assert!(ok && out.contains("\"critical\":true"), "{out}");
    let (_, st) = nvwc(&["status"]);
    assert!(
        st.contains(&format!("{{\"id\":{id},")) && st.contains("\"critical\":true}"),
        "{st}"
    );
    assert!(q.wait().unwrap().success());
    assert_eq!(
        stat("admitted_pieces"),
        16,
        "the hinted connection's write was cached"
    );
    assert_eq!(stat("critical_admitted_pieces"), 16);
    // Per-class metrics: the normal client's write bypassed, the critical
    // one's admitted; a latency histogram for each class.
    let m = scrape();
    let l = |class: &str, outcome: &str| {
        format!("nvwc_admission_pieces{{export=\"\",class=\"{class}\",outcome=\"{outcome}\"}}")
    };
    assert_eq!(series(&m, &l("normal", "bypassed")), 16);
    assert_eq!(series(&m, &l("normal", "admitted")), 0);
    assert_eq!(series(&m, &l("critical", "admitted")), 16);
    assert_eq!(series(&m, &l("critical", "bypassed")), 0);
    assert_eq!(series(&m, &l("critical", "reissued")), 0);
    for class in ["critical", "normal"] {
        let count = format!(
            "nvwc_request_latency_seconds_count{{export=\"\",class=\"{class}\",op=\"write\"}}"
        );
        assert!(series(&m, &count) >= 1, "{class} write latency: {m}");
    }
    let gone = poll_until(Duration::from_secs(10), Duration::from_millis(20), || {
        nvwc(&["status"])
            .1
            .contains("\"connections\":[]")
            .then_some(())
    });
    assert!(gone.is_some(), "a gone connection stays listed");
    assert_eq!(stat("bypassed_pieces"), 16);
    // Bad hints are refused with a reason.
    let (ok, out) = nvwc(&["hint", "--connection", "999999", "--critical", "on"]);
    assert!(!ok && out.contains("no connection 999999"), "{out}");
    let (ok, out) = nvwc(&["hint", "--connection", &id, "--critical", "maybe"]);
    assert!(!ok && out.contains("on or off"), "{out}");
    qemu_io(&dir, &["read -P 0x11 0 64k", "read -P 0x22 1M 64k"]);
    drop(s);

    // A critical export: every write is admitted.
    let mut args2 = args[..6].to_vec();
    args2.extend(["--export", ":critical"]);
    let s = start_with(&dir, &args2);
    qemu_io(
        &dir,
        &[
            "write -P 0x33 2M 64k",
            "read -P 0x11 0 64k",
            "read -P 0x22 1M 64k",
        ],
    );
    assert_eq!(stat("admitted_pieces"), 16);
    assert_eq!(stat("bypassed_pieces"), 0);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Write-through after a warm restart: write and FLUSH, stop cleanly, start
/// (the cache restarts warm), rewrite the block, `kill -9` at once (before
/// any background commit), start again: the read MUST return the rewrite.
/// The clean-shutdown record vouched for the old copy; the server served
/// it here until writes waited for the first commit after a warm restart
/// (`CommitState::vouched`). Every policy is run: for the others a FUA
/// rewrite must survive the same way.
#[test]
fn a_rewrite_after_a_warm_restart_survives_kill9() {
    require_tools!("qemu-io");
    for policy in POLICIES {
        let dir = tempdir(&format!("warm-{policy}"));
        let backing = Backing::new(&dir, false, "64M");
        let s = start(&dir, policy, &backing);
        qemu_io(
            &dir,
            &["write -P 0xaa 0 64k", "flush", "read -P 0xaa 0 64k"],
        );
        stop(s);
        let s = start(&dir, policy, &backing);
        // A read hit first: the old copy is in the cache.
        qemu_io(&dir, &["read -P 0xaa 0 64k"]);
        let rewrite = if policy == "write-through" {
            "write -P 0xbb 0 64k"
        } else {
            "write -f -P 0xbb 0 64k"
        };
        qemu_io(&dir, &[rewrite]);
        drop(s); // kill -9
        let s = start(&dir, policy, &backing);
        qemu_io(&dir, &["read -P 0xbb 0 64k"]);
        drop(s);
        clean_up(&dir, backing);
    }
}

/// An upstream that advertises a 64 KiB maximum block size and refuses
/// anything longer (nbdkit's blocksize-policy filter): destage runs (up to
/// 1 MiB, `MAX_DESTAGE_RUN_BYTES`), bypassed writes and backing reads reach
/// it in pieces, for every write policy; after `nvwc detach` the upstream
/// file alone holds every write.
#[test]
fn upstream_with_a_small_maximum_block_size() {
    require_tools!("nbdkit", "qemu-io");
    for policy in ["write-back", "write-through", "ordered", "journaled"] {
        let dir = tempdir(&format!("upmax-{policy}"));
        must(&format!(
            "truncate -s 64M {d}/up.img && qemu-io -f raw -c 'write -P 0x41 40M 4M' {d}/up.img",
            d = dir.display()
        ));
        let sock = dir.join("up.sock");
        let up = nbdkit_file_with(
            &dir,
            "up.img",
            "up.sock",
            &["blocksize-policy"],
            &[
                "blocksize-maximum=65536",
                "blocksize-preferred=4096",
                "blocksize-error-policy=error",
            ],
        );
        let backing = format!("nbd+unix:///?socket={}", sock.display());
        let s = start_with(
            &dir,
            &[
                "--backing",
                &backing,
                "--cache-size",
                "8M",
                "--write-policy",
                policy,
            ],
        );
        qemu_io(
            &dir,
            &[
                "write -P 0x31 0 6M",
                "write -P 0x32 6M 2M",
                "flush",
                "read -P 0x41 40M 4M",
                "read -P 0x31 0 6M",
            ],
        );
        let (ok, out) = nvwc_in(&dir, &["flush"]);
        assert!(ok, "{policy}: nvwc flush: {out}");
        qemu_io(&dir, &["read -P 0x31 0 6M", "read -P 0x32 6M 2M"]);
        detach(&dir, s);
        qemu_io_file(
            &dir.join("up.img"),
            &[
                "read -P 0x31 0 6M",
                "read -P 0x32 6M 2M",
                "read -P 0x41 40M 4M",
            ],
            &format!("{policy}: upstream after detach"),
        );
        drop(up);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
