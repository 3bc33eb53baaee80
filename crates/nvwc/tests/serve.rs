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
use common::{strict, tool};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Where a test server's backing store lives: its own file (created with
/// `--size`), or an upstream nbdkit `file` export on a unix socket (the
/// write-policy paper's networked storage), which outlives server restarts.
enum Backing {
    File(&'static str),
    Upstream(Child, String),
}

impl Backing {
    /// `upstream`: start `nbdkit file` on `dir/up.img` of `size` bytes.
    fn new(dir: &Path, upstream: bool, size: &'static str) -> Backing {
        if !upstream {
            return Backing::File(size);
        }
        must(&format!("truncate -s {size} {}/up.img", dir.display()));
        let sock = dir.join("up.sock");
        let _ = std::fs::remove_file(&sock);
        // One nbdkit thread: nbdkit 1.32 can abort when a client is killed
        // while several of its workers still send replies (the tests kill -9).
        let child = Command::new("nbdkit")
            .args(["-U"])
            .arg(&sock)
            .args(["-f", "--exit-with-parent", "--threads", "1", "file"])
            .arg(dir.join("up.img"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nbdkit");
        wait_for(&sock, "nbdkit");
        Backing::Upstream(child, format!("nbd+unix:///?socket={}", sock.display()))
    }

    fn args(&self) -> Vec<String> {
        match self {
            Backing::File(size) => vec!["--size".into(), size.to_string()],
            Backing::Upstream(_, uri) => vec!["--backing".into(), uri.clone()],
        }
    }

    /// The upstream's NBD URI (`None` for a file backing).
    fn uri(&self) -> Option<&str> {
        match self {
            Backing::File(_) => None,
            Backing::Upstream(_, uri) => Some(uri),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Backing::File(_) => "file",
            Backing::Upstream(..) => "upstream",
        }
    }
}

impl Drop for Backing {
    fn drop(&mut self) {
        if let Backing::Upstream(child, _) = self {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Both backing kinds, when the upstream one can run (nbdkit installed).
fn backing_kinds() -> Vec<bool> {
    if tool("nbdkit") {
        vec![false, true]
    } else {
        vec![false]
    }
}

fn start(dir: &Path, policy: &str, backing: &Backing) -> Server {
    let mut args = backing.args();
    args.extend(
        [
            "--cache-size",
            "8M",
            "--write-policy",
            policy,
            "--txn-blocks",
            "16",
            "--txn-age-ms",
            "20",
        ]
        .map(String::from),
    );
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    start_with(dir, &refs)
}

/// Wait (up to 20 s) until `path` exists: `what` started.
fn wait_for(path: &Path, what: &str) {
    let t = Instant::now();
    while !path.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{what} did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn uri(dir: &Path) -> String {
    format!(
        "nbd+unix:///?socket={}",
        dir.join("nvwc-data/nvwc.sock").display()
    )
}

fn qemu_io(dir: &Path, cmds: &[&str]) -> String {
    let mut c = Command::new("qemu-io");
    c.args(["-t", "writeback", "-f", "raw"]);
    for x in cmds {
        c.arg("-c").arg(x);
    }
    let out = c.arg(uri(dir)).output().expect("run qemu-io");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "qemu-io failed: {text}");
    assert!(
        !text.contains("Pattern verification failed") && !text.contains("failed"),
        "qemu-io reported a failure: {text}"
    );
    text
}

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nvwc-serve-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn real_clients_every_policy_and_kill9_recovery() {
    if !tool("qemu-io") || !tool("nbdinfo") {
        return;
    }
    for (upstream, policy) in backing_kinds().into_iter().flat_map(|u| {
        [
            "write-through",
            "write-back",
            "ordered",
            "journaled",
            "journaled-hints",
        ]
        .map(|p| (u, p))
    }) {
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
        let mut cmds: Vec<String> = (0..12)
            .map(|i| format!("write -P {} {}M 1M", 0x10 + i, i))
            .collect();
        cmds.push("write -f -P 0xcd 20M 64k".into());
        cmds.push("write -z 21M 64k".into());
        cmds.push("write -P 0x77 22M 6k".into());
        cmds.push("discard 30M 64k".into());
        cmds.push("flush".into());
        for i in 0..12 {
            cmds.push(format!("read -P {} {}M 1M", 0x10 + i, i));
        }
        cmds.push("read -P 0xcd 20M 64k".into());
        cmds.push("read -P 0 21M 64k".into());
        cmds.push("read -P 0x77 22M 6k".into());
        let refs: Vec<&str> = cmds.iter().map(String::as_str).collect();
        qemu_io(&dir, &refs);
        // Crash the server: everything flushed must come back.
        drop(s);
        let s = start(&dir, pol, &backing);
        let mut check: Vec<String> = (0..12)
            .map(|i| format!("read -P {} {}M 1M", 0x10 + i, i))
            .collect();
        check.push("read -P 0xcd 20M 64k".into());
        check.push("read -P 0 21M 64k".into());
        check.push("read -P 0x77 22M 6k".into());
        let refs: Vec<&str> = check.iter().map(String::as_str).collect();
        qemu_io(&dir, &refs);
        // A wrong pattern must be caught (the check can fail).
        let bad = Command::new("qemu-io")
            .args(["-f", "raw", "-c", "read -P 0x99 0 4k"])
            .arg(uri(&dir))
            .output()
            .unwrap();
        let t = String::from_utf8_lossy(&bad.stdout).to_string()
            + &String::from_utf8_lossy(&bad.stderr);
        assert!(
            t.contains("Pattern verification failed"),
            "{policy}: wrong pattern not detected: {t}"
        );
        drop(s);
        drop(backing);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

fn sh(cmd: &str) -> (bool, String) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output()
        .expect("run sh");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn must(cmd: &str) -> String {
    let (ok, out) = sh(cmd);
    assert!(ok, "`{cmd}` failed: {out}");
    out
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
        let _ = sh(&format!(
            "fusermount3 -u {} || umount -l {}",
            self.fuse_dir.display(),
            self.fuse_dir.display()
        ));
        let _ = self.fuse.kill();
        let _ = self.fuse.wait();
    }
}

fn stop(mut s: Server) {
    // Graceful stop: SIGTERM, then wait for exit.
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(s.0.id().to_string())
        .status();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(30) {
        if let Ok(Some(_)) = s.0.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("server did not stop on SIGTERM");
}

/// ext4 on nvwc through nbdfuse and a loop device: write, fsync, unmount,
/// restart the server, mount again: contents intact and `e2fsck -fn` clean.
#[test]
fn ext4_round_trip_across_restart() {
    if !tool("nbdfuse") || !tool("mkfs.ext4") || !tool("losetup") || !tool("e2fsck") {
        return;
    }
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
        drop(backing);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// nbdcopy with 4 connections in and out (multi-conn), identical checksums;
/// fio's nbd engine with crc32c verification.
#[test]
fn nbdcopy_and_fio_verify() {
    if !tool("nbdcopy") || !tool("fio") {
        return;
    }
    for upstream in backing_kinds() {
        let dir = tempdir(&format!("copy-{upstream}"));
        let backing = Backing::new(&dir, upstream, "512M");
        let what = backing.name();
        // 256 MiB (the issue's acceptance size) through a 64 MiB cache: the
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
        must(&format!(
            "nbdcopy --connections=4 {} '{}'",
            src.display(),
            uri(&dir)
        ));
        must(&format!(
            "nbdcopy --connections=4 '{}' {}",
            uri(&dir),
            back.display()
        ));
        let a = must(&format!("head -c 256M {} | md5sum", back.display()));
        let b = must(&format!("md5sum < {}", src.display()));
        assert_eq!(
            a.split_whitespace().next(),
            b.split_whitespace().next(),
            "{what}: nbdcopy round trip differs"
        );
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
                assert!(
                    out.contains("err= 0") && !out.contains("verify: bad"),
                    "{what}: fio {rw} {bs}: {out}"
                );
            }
        }
        drop(s);
        drop(backing);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Direct writes (a large write's payload received from the unix socket
/// straight into the mapped cache file): fio's 64 KiB writes with crc32c
/// take that path, a final FLUSH, `kill -9`, restart, and fio verifies every
/// block again, for each write policy that caches writes, rewriting in place
/// and not.
#[test]
fn direct_writes_fio_verify_across_kill9() {
    if !tool("fio") || !tool("nbdcopy") {
        return;
    }
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
            assert!(
                out.contains("err= 0") && !out.contains("verify: bad"),
                "{what}: {out}"
            );
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
        assert!(
            out.contains("err= 0") && !out.contains("verify: bad"),
            "{what}: after kill -9: {out}"
        );
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
    if !tool("nbdkit") || !tool("qemu-io") || !tool("fio") {
        return;
    }
    for policy in [
        "write-through",
        "write-back",
        "ordered",
        "journaled",
        "journaled-hints",
    ] {
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
            let out = Command::new("qemu-io")
                .args(["-f", "raw", "-r"])
                .args(["-c", "read -P 0x31 0 12M", "-c", "read -P 0x32 12M 64k"])
                .args(["-c", "read -P 0x33 13M 1M"])
                .arg(dir.join("up.img"))
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            assert!(
                out.status.success() && !text.contains("failed"),
                "{policy}: upstream after detach: {text}"
            );
        } else {
            drop(s);
        }
        drop(up);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Counter `name` of the first export in `nvwc status` of the server in `dir`.
fn status_counter(dir: &Path, name: &str) -> u64 {
    let st = Command::new(env!("CARGO_BIN_EXE_nvwc"))
        .current_dir(dir)
        .arg("status")
        .output()
        .unwrap();
    let st = String::from_utf8_lossy(&st.stdout).to_string();
    st.split(&format!("\"{name}\":"))
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no {name} in status: {st}"))
}

fn start_with(dir: &Path, extra: &[&str]) -> Server {
    let _ = std::fs::remove_file(dir.join("nvwc-data/nvwc.sock"));
    let child = Command::new(env!("CARGO_BIN_EXE_nvwc"))
        .current_dir(dir)
        .args(["serve", "--listen", "none"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let sock = dir.join("nvwc-data/nvwc.sock");
    wait_for(&sock, "server");
    std::thread::sleep(Duration::from_millis(100));
    Server(child)
}

/// `nvwc status` / `flush` / `detach` through the control socket; after
/// detach the server has exited and the backing file alone holds the data.
#[test]
fn control_socket_flush_and_detach() {
    if !tool("qemu-io") {
        return;
    }
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
            let out = Command::new(env!("CARGO_BIN_EXE_nvwc"))
                .current_dir(&dir)
                .arg(cmd)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "nvwc {cmd}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).to_string()
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
        let t = Instant::now();
        while s.0.try_wait().unwrap().is_none() {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "{policy}: server did not exit after detach"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let img = dir.join("nvwc-data/backing.img");
        let out = Command::new("qemu-io")
            .args([
                "-f",
                "raw",
                "-r",
                "-c",
                "read -P 0x6b 0 3M",
                "-c",
                "read -P 0x6c 5M 100k",
                "-c",
                "read -P 0x6d 9M 64k",
            ])
            .arg(&img)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && !text.contains("failed"),
            "{policy}: backing after detach: {text}"
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
    if !tool("fio") || !tool("qemu-io") {
        return;
    }
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
        let mut args = vec![
            "--size",
            "64M",
            "--cache-size",
            "16M",
            "--write-policy",
            policy,
            "--fetch",
            fetch,
            "--patch-mem",
            "256K",
        ];
        if direct {
            args.push("--patch-direct");
        }
        let s = start_with(&dir, &args);
        let sock = dir.join("nvwc-data/nvwc.sock");
        let out = must(&format!(
            "fio --name=v --ioengine=nbd --uri='nbd+unix:///?socket={}' --rw=randwrite --bs=2k --size=16M --iodepth=16 --fsync=64 --verify=crc32c --verify_state_save=0 --do_verify=1 --verify_fatal=1 2>&1",
            sock.display()
        ));
        assert!(
            out.contains("err= 0") && !out.contains("verify: bad"),
            "fio {policy} --fetch {fetch} direct={direct}: {out}"
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
    if !tool("qemu-io") || !tool("nbdinfo") {
        return;
    }
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
        let t = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
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
    if !tool("qemu-io") {
        return;
    }
    let dir = tempdir("admission");
    let nvwc = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_nvwc"))
            .current_dir(&dir)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let stat = |name: &str| -> u64 {
        let (ok, st) = nvwc(&["status"]);
        assert!(ok, "{st}");
        let key = format!("\"{name}\":");
        let at = st.find(&key).unwrap_or_else(|| panic!("{name} in {st}")) + key.len();
        st[at..].split([',', '}']).next().unwrap().parse().unwrap()
    };
    // A free loopback port for the Prometheus endpoint.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let maddr = format!("127.0.0.1:{port}");
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
    let t = Instant::now();
    let id = loop {
        let (_, st) = nvwc(&["status"]);
        if let Some(at) = st.find("\"connections\":[{\"id\":") {
            let rest = &st[at + "\"connections\":[{\"id\":".len()..];
            break rest.split(',').next().unwrap().to_string();
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no connection in status: {st}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
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
    let t = Instant::now();
    while !nvwc(&["status"]).1.contains("\"connections\":[]") {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "a gone connection stays listed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
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

// ------------------------------------------------------------ binding

/// `nvwc serve --listen none ARGS` must exit non-zero before listening;
/// returns stderr.
fn refused(dir: &Path, args: &[&str]) -> String {
    let args: Vec<&str> = ["--listen", "none"].iter().chain(args).copied().collect();
    common::serve_refused(dir, &args)
}

/// Run an `nvwc` subcommand in `dir`: (success, stdout + stderr).
fn nvwc_in(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nvwc"))
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// `nvwc detach` the server in `dir`, and wait (up to 20 s) until `s` exits.
fn detach(dir: &Path, mut s: Server) {
    let (ok, out) = nvwc_in(dir, &["detach"]);
    assert!(ok, "{out}");
    let t = Instant::now();
    while s.0.try_wait().unwrap().is_none() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "no exit after detach"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn read(dir: &Path, f: &str) -> Vec<u8> {
    std::fs::read(dir.join(f)).unwrap()
}

/// The issue's scenario: a.img served through c.img, 1 MiB of 0xaa written
/// and flushed, `kill -9`; then the same cache with other.img (same size)
/// must refuse to start, naming both backing stores, and leave other.img
/// (and the cache) byte for byte as they were. The right backing store still
/// recovers the flushed data, and `nvwc flush` lands it there.
/// `--force-attach` binds the cache to other.img on purpose; then a.img is
/// the wrong one.
#[test]
fn bind_wrong_backing_is_refused_and_force_attach_rebinds() {
    if !tool("qemu-io") {
        return;
    }
    let dir = tempdir("bind-file");
    must(&format!(
        "cd {} && truncate -s 16M a.img other.img",
        dir.display()
    ));
    let with = |backing: &'static str, extra: &[&'static str]| {
        let mut v = vec![
            "--backing",
            backing,
            "--cache",
            "c.img",
            "--cache-size",
            "8M",
        ];
        v.extend(extra);
        v
    };
    let s = start_with(&dir, &with("a.img", &[]));
    qemu_io(&dir, &["write -P 0xaa 0 1M", "flush"]);
    drop(s); // kill -9
    let (other, cache) = (read(&dir, "other.img"), read(&dir, "c.img"));
    let err = refused(&dir, &with("other.img", &[]));
    assert!(
        err.contains("belongs to another backing store")
            && err.contains(&format!(
                "bound to file {}/a.img (nvwc label ",
                dir.display()
            ))
            && err.contains(&format!(
                "given is file {}/other.img (no nvwc label",
                dir.display()
            ))
            && err.contains("256 dirty blocks")
            && err.contains("--force-attach")
            && err.contains("nvwc format --force --cache c.img"),
        "{err}"
    );
    assert!(read(&dir, "other.img") == other, "other.img was written");
    assert!(read(&dir, "c.img") == cache, "the cache was written");
    assert!(!dir.join("other.img.nvwc-redo").exists());

    // The right backing store: the flushed data is there, and a flush
    // writes it back to a.img (its data; the label lies past it).
    let s = start_with(&dir, &with("a.img", &[]));
    qemu_io(&dir, &["read -P 0xaa 0 1M"]);
    let (ok, out) = nvwc_in(&dir, &["flush"]);
    assert!(ok, "{out}");
    let a = read(&dir, "a.img");
    assert!(a[..1 << 20].iter().all(|&b| b == 0xaa), "not written back");
    assert_eq!(a.len(), (16 << 20) + 4096, "a.img carries its label");
    qemu_io(&dir, &["write -P 0xbb 1M 64k", "flush"]);
    drop(s);

    // On purpose: other.img takes the cache's dirty data. The clean copies
    // of a.img's blocks are dropped after the kill -9 (write-back recovery
    // keeps only dirty versions after a crash), so those blocks read from
    // other.img itself.
    let s = start_with(&dir, &with("other.img", &["--force-attach"]));
    qemu_io(&dir, &["read -P 0 0 1M", "read -P 0xbb 1M 64k"]);
    let (ok, out) = nvwc_in(&dir, &["flush"]);
    assert!(ok, "{out}");
    let o = read(&dir, "other.img");
    assert!(o[1 << 20..(1 << 20) + 65536].iter().all(|&b| b == 0xbb));
    drop(s);
    let err = refused(&dir, &with("a.img", &[]));
    assert!(
        err.contains(&format!("bound to file {}/other.img", dir.display())),
        "{err}"
    );
    // A new cache takes other.img over; from then on the old one is stale
    // there (its contents could overwrite what the new one wrote back).
    let s = start_with(
        &dir,
        &[
            "--backing",
            "other.img",
            "--cache",
            "d.img",
            "--cache-size",
            "8M",
        ],
    );
    qemu_io(
        &dir,
        &["read -P 0xbb 1M 64k", "write -P 0xdd 0 64k", "flush"],
    );
    drop(s);
    let cache = read(&dir, "c.img");
    let err = refused(&dir, &with("other.img", &[]));
    assert!(
        err.contains("c.img is stale for file")
            && err.contains("bound to another cache")
            && err.contains("It holds "),
        "{err}"
    );
    assert!(read(&dir, "c.img") == cache);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A cache whose superblock is damaged is refused and left as it is, and
/// so is a file that is not a cache; `nvwc format` without `--force`
/// refuses too; `nvwc format --force` starts over (the dirty data is gone,
/// the backing store's own data is served). A blank file is formatted.
/// `nvwc detach` empties the cache: the next start may use any backing store.
#[test]
fn bind_damaged_cache_refused_format_force_starts_over() {
    if !tool("qemu-io") {
        return;
    }
    let dir = tempdir("bind-damaged");
    must(&format!(
        "cd {} && truncate -s 16M a.img b.img && head -c 8M /dev/urandom > foreign.img && truncate -s 8M blank.img",
        dir.display()
    ));
    let args =
        |cache: &'static str| vec!["--backing", "a.img", "--cache", cache, "--cache-size", "8M"];
    let s = start_with(&dir, &args("c.img"));
    qemu_io(&dir, &["write -P 0xaa 0 1M", "flush"]);
    drop(s); // kill -9
    let mut c = read(&dir, "c.img");
    c[100] ^= 0xff; // inside the superblock's CRC
    std::fs::write(dir.join("c.img"), &c).unwrap();
    let err = refused(&dir, &args("c.img"));
    assert!(
        err.contains("c.img: its superblock is damaged")
            && err.contains("not blank")
            && err.contains("nvwc format --force --cache c.img"),
        "{err}"
    );
    assert!(read(&dir, "c.img") == c, "a damaged cache was written");
    let (ok, out) = nvwc_in(&dir, &["format", "--cache", "c.img"]);
    assert!(!ok && out.contains("--force"), "{out}");
    assert!(read(&dir, "c.img") == c);

    let foreign = read(&dir, "foreign.img");
    let err = refused(&dir, &args("foreign.img"));
    assert!(err.contains("no nvwc superblock"), "{err}");
    assert!(
        read(&dir, "foreign.img") == foreign,
        "a foreign file was written"
    );

    let (ok, out) = nvwc_in(&dir, &["format", "--force", "--cache", "c.img"]);
    assert!(ok && out.contains("erased c.img"), "{out}");
    let s = start_with(&dir, &args("c.img"));
    qemu_io(&dir, &["read -P 0 0 1M", "write -P 0xcc 2M 64k", "flush"]);
    drop(s);
    let s = start_with(&dir, &args("c.img"));
    qemu_io(&dir, &["read -P 0xcc 2M 64k"]);
    // Detach: everything written back, the cache emptied.
    detach(&dir, s);
    assert!(read(&dir, "a.img")[2 << 20..(2 << 20) + 65536]
        .iter()
        .all(|&b| b == 0xcc));
    let (ok, out) = nvwc_in(&dir, &["format", "--cache", "c.img"]);
    assert!(ok && out.contains("emptied"), "{out}");
    // An emptied cache serves another backing store, with nothing of a.img.
    let s = start_with(
        &dir,
        &[
            "--backing",
            "b.img",
            "--cache",
            "c.img",
            "--cache-size",
            "8M",
        ],
    );
    qemu_io(&dir, &["read -P 0 2M 64k"]);
    drop(s);
    // A blank (all-zero) file is a new cache.
    let s = start_with(&dir, &args("blank.img"));
    qemu_io(&dir, &["read -P 0xcc 2M 64k"]);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `nbdkit file` on `dir/file` at `dir/sock` (one thread, see [`Backing`]).
fn nbdkit_file(dir: &Path, file: &str, sock: &str) -> Server {
    let sock = dir.join(sock);
    let _ = std::fs::remove_file(&sock);
    let child = Command::new("nbdkit")
        .arg("-U")
        .arg(&sock)
        .args(["-f", "--exit-with-parent", "--threads", "1", "file"])
        .arg(dir.join(file))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nbdkit");
    wait_for(&sock, "nbdkit");
    Server(child)
}

/// Upstream NBD backing stores: write-back over upstream A, then another
/// upstream (other socket, same size) is refused and untouched. Journaled
/// over A keeps a label in A's redo region: when another server takes A's
/// socket (same URI, same size, no region), the start is refused, and no
/// redo region is created on it; with A back, the flushed data is there.
#[test]
fn bind_upstream_nbd_identity_and_label() {
    if !tool("nbdkit") || !tool("qemu-io") {
        return;
    }
    let dir = tempdir("bind-up");
    must(&format!(
        "cd {} && truncate -s 64M up.img other.img",
        dir.display()
    ));
    fn refs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    let uri = |sock: &str| format!("nbd+unix:///?socket={}", dir.join(sock).display());
    let (a_uri, b_uri) = (uri("a.sock"), uri("b.sock"));
    let args = |u: &str, policy: &'static str, cache: &'static str| -> Vec<String> {
        ["--backing", u, "--cache", cache, "--cache-size", "8M"]
            .into_iter()
            .map(String::from)
            .chain(["--write-policy".into(), policy.into()])
            .collect()
    };
    let up_a = nbdkit_file(&dir, "up.img", "a.sock");
    let up_b = nbdkit_file(&dir, "other.img", "b.sock");

    let wb = args(&a_uri, "write-back", "wb.img");
    let s = start_with(&dir, &refs(&wb));
    qemu_io(&dir, &["write -P 0xaa 0 1M", "flush"]);
    drop(s);
    let other = read(&dir, "other.img");
    let err = refused(&dir, &refs(&args(&b_uri, "write-back", "wb.img")));
    assert!(
        err.contains(&format!(
            "bound to NBD export \"\" at {a_uri} (no nvwc label"
        )) && err.contains(&format!("given is NBD export \"\" at {b_uri}"))
            && err.contains("256 dirty blocks"),
        "{err}"
    );
    assert!(
        read(&dir, "other.img") == other,
        "the other upstream was written"
    );
    let s = start_with(&dir, &refs(&wb));
    qemu_io(&dir, &["read -P 0xaa 0 1M"]);
    drop(s);

    let j = args(&a_uri, "journaled", "j.img");
    let s = start_with(&dir, &refs(&j));
    qemu_io(&dir, &["write -P 0x5c 4M 1M", "flush"]);
    drop(s);
    // Another store at A's socket.
    drop(up_a);
    let imposter = nbdkit_file(&dir, "other.img", "a.sock");
    let err = refused(&dir, &refs(&j));
    assert!(
        err.contains(&format!("bound to NBD export \"\" at {a_uri} (nvwc label "))
            && err.contains(&format!(
                "given is NBD export \"\" at {a_uri} (no nvwc label"
            )),
        "{err}"
    );
    assert!(
        read(&dir, "other.img") == other,
        "a redo region or label was written on the wrong upstream"
    );
    drop(imposter);
    let up_a = nbdkit_file(&dir, "up.img", "a.sock");
    let s = start_with(&dir, &refs(&j));
    qemu_io(&dir, &["read -P 0x5c 4M 1M"]);
    drop(s);
    // The upstream alone after losing the cache: recover names the binding.
    let (ok, out) = nvwc_in(&dir, &["recover", "--backing", &a_uri]);
    assert!(ok && out.contains("is bound to cache"), "{out}");
    drop((up_a, up_b));
    let _ = std::fs::remove_dir_all(&dir);
}

// ------------------------------------------------- every advertised request

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

/// A raw NBD connection for the requests `nvwc_nbd::Client` refuses to
/// send (longer than the advertised maximum), with simple or structured
/// replies.
struct RawNbd {
    s: std::os::unix::net::UnixStream,
    structured: bool,
}

impl RawNbd {
    fn connect(sock: &Path, structured: bool) -> RawNbd {
        use nvwc_nbd::proto::{
            self, client_flags, rep, ClientOption, InfoRequest, OptionReplyHeader,
        };
        use std::io::{Read, Write};
        let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let mut g = [0u8; proto::GREETING_LEN];
        s.read_exact(&mut g).unwrap();
        proto::decode_server_greeting(&g).unwrap();
        s.write_all(&proto::encode_client_flags(
            client_flags::FIXED_NEWSTYLE | client_flags::NO_ZEROES,
        ))
        .unwrap();
        let mut opts = Vec::new();
        if structured {
            opts.push(ClientOption::StructuredReply);
        }
        opts.push(ClientOption::Go(InfoRequest {
            name: String::new(),
            requests: vec![],
        }));
        for o in opts {
            s.write_all(&o.encode()).unwrap();
            loop {
                let mut h = [0u8; OptionReplyHeader::LEN];
                s.read_exact(&mut h).unwrap();
                let h = OptionReplyHeader::decode(&h).unwrap();
                let mut d = vec![0u8; h.length as usize];
                s.read_exact(&mut d).unwrap();
                assert!(!rep::is_error(h.reply_type), "option refused: {h:?}");
                if h.reply_type == rep::ACK {
                    break;
                }
            }
        }
        RawNbd { s, structured }
    }

    /// Send a request whose payload is `payload_len` bytes of `fill`.
    fn send(&mut self, cmd: u16, handle: u64, offset: u64, len: u32, payload_len: u64, fill: u8) {
        use std::io::Write;
        let h = nvwc_nbd::proto::RequestHeader {
            flags: 0,
            command: cmd.into(),
            handle,
            offset,
            length: len,
        };
        self.s.write_all(&h.encode()).unwrap();
        let chunk = vec![fill; 1 << 20];
        let mut left = payload_len;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            self.s.write_all(&chunk[..n]).unwrap();
            left -= n as u64;
        }
    }

    /// The reply to request `handle`: its error value (0: success) and data.
    fn reply(&mut self, handle: u64, read_len: u32) -> (u32, Vec<u8>) {
        use nvwc_nbd::proto::{reply_flags, ChunkHeader, ChunkPayload, SimpleReplyHeader};
        use std::io::Read;
        if !self.structured {
            let mut h = [0u8; SimpleReplyHeader::LEN];
            self.s.read_exact(&mut h).unwrap();
            let h = SimpleReplyHeader::decode(&h).unwrap();
            assert_eq!(h.handle, handle);
            let mut data = vec![0u8; if h.error == 0 { read_len as usize } else { 0 }];
            self.s.read_exact(&mut data).unwrap();
            return (h.error, data);
        }
        let (mut error, mut data) = (0, Vec::new());
        loop {
            let mut h = [0u8; ChunkHeader::LEN];
            self.s.read_exact(&mut h).unwrap();
            let h = ChunkHeader::decode(&h).unwrap();
            assert_eq!(h.handle, handle);
            let mut p = vec![0u8; h.length as usize];
            self.s.read_exact(&mut p).unwrap();
            match ChunkPayload::decode(h.kind, bytes::Bytes::from(p)).unwrap() {
                ChunkPayload::Error { error: e, .. } => error = e,
                ChunkPayload::OffsetData { data: d, .. } => data.extend_from_slice(&d),
                _ => {}
            }
            if h.flags & reply_flags::DONE != 0 {
                return (error, data);
            }
        }
    }
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
    must(&format!(
        "nbdcopy --request-size=33554432 --connections=1 --flush {} '{}'",
        src.display(),
        uri(&dir)
    ));
    must(&format!(
        "nbdcopy --request-size=33554432 --connections=1 '{}' {}",
        uri(&dir),
        back.display()
    ));
    let a = must(&format!("head -c 33566777 {} | md5sum", back.display()));
    let b = must(&format!("md5sum < {}", src.display()));
    assert_eq!(
        a.split_whitespace().next(),
        b.split_whitespace().next(),
        "{what}: nbdcopy round trip differs"
    );
    eprintln!("{what}: {:?}", t0.elapsed());
    drop(s);
    drop(backing);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every request up to the advertised maximum works on the smallest cache
/// the server accepts (16 blocks: each 32 MiB write is 1024 engine writes),
/// for every write policy.
#[test]
fn maxreq_smallest_cache_every_policy() {
    if !tool("qemu-io") || !tool("nbdinfo") || !tool("nbdcopy") {
        return;
    }
    for policy in WRITE_POLICIES {
        maxreq_case(policy, "100K", false);
    }
}

/// The same on a 16 MiB cache (32 MiB writes are five engine writes), for
/// every write policy, and journaled over an upstream NBD server, where
/// engine writes are at most 8 MiB (a checkpoint group's bound).
#[test]
fn maxreq_16m_cache_every_policy() {
    if !tool("qemu-io") || !tool("nbdinfo") || !tool("nbdcopy") {
        return;
    }
    for policy in WRITE_POLICIES {
        maxreq_case(policy, "16M", false);
    }
    if tool("nbdkit") {
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
    if !tool("qemu-io") {
        return;
    }
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
