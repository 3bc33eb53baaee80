//! `nvwc crashtest --ext4`: the filesystem-level check.
//!
//! Each trial: a fresh `nvwc serve`, `nbdfuse` exposing its export as a file,
//! a loop device on it, `mkfs.ext4`, mount, and a workload of small files,
//! appends, renames (write-temp-then-rename with fsyncs), and a few large
//! files. At a random time the server is killed with `kill -9`; the mount,
//! loop device and FUSE mount are torn down; the cache device is deleted;
//! `nvwc recover` runs on the backing file; the ext4 journal is replayed
//! (`e2fsck -E journal_only`, what a mount would do) and `e2fsck -fn` must
//! find the filesystem clean. Needs root, `/dev/fuse`, nbdfuse, losetup,
//! mkfs.ext4 and e2fsck (fusermount3 if present, else `umount -l`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::crashtest::{Args, Rng, Server, ServerCfg};

/// What the tools say about running ext4 trials here (None: they can run).
pub fn missing_tools() -> Option<String> {
    for t in [
        "nbdfuse",
        "losetup",
        "mkfs.ext4",
        "e2fsck",
        "mount",
        "umount",
    ] {
        let ok = Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {t}"))
            .stdout(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            return Some(format!("{t} not found"));
        }
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    if !root || !Path::new("/dev/fuse").exists() {
        return Some("needs root and /dev/fuse".into());
    }
    None
}

fn sh(cmd: &str) -> (bool, String) {
    match Command::new("sh").arg("-c").arg(cmd).output() {
        Ok(o) => (
            o.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
        ),
        Err(e) => (false, e.to_string()),
    }
}

/// The FUSE file, loop device and mount of one trial; torn down on drop.
struct Stack {
    fuse_dir: PathBuf,
    fuse: Child,
    loopdev: String,
    mnt: PathBuf,
    mounted: bool,
}

impl Stack {
    fn new(dir: &Path, uri: &str) -> Result<Stack> {
        let fuse_dir = dir.join("fuse");
        std::fs::create_dir_all(&fuse_dir)?;
        let fuse = Command::new("nbdfuse")
            .arg(fuse_dir.join("disk"))
            .arg(uri)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting nbdfuse")?;
        let t = Instant::now();
        while !fuse_dir.join("disk").exists() {
            if t.elapsed() > Duration::from_secs(20) {
                bail!("nbdfuse did not start");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let (ok, out) = sh(&format!(
            "losetup -f --show {}",
            fuse_dir.join("disk").display()
        ));
        let mut s = Stack {
            fuse_dir,
            fuse,
            loopdev: String::new(),
            mnt: dir.join("mnt"),
            mounted: false,
        };
        if !ok {
            bail!("losetup: {out}");
        }
        s.loopdev = out.trim().to_string();
        Ok(s)
    }

    fn mkfs_and_mount(&mut self) -> Result<()> {
        let (ok, out) = sh(&format!("mkfs.ext4 -q -F -b 4096 {}", self.loopdev));
        if !ok {
            bail!("mkfs.ext4: {out}");
        }
        std::fs::create_dir_all(&self.mnt)?;
        let (ok, out) = sh(&format!(
            "mount -t ext4 {} {}",
            self.loopdev,
            self.mnt.display()
        ));
        if !ok {
            bail!("mount: {out}");
        }
        self.mounted = true;
        Ok(())
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if self.mounted {
            let _ = sh(&format!("umount -l {}", self.mnt.display()));
        }
        if !self.loopdev.is_empty() {
            let _ = sh(&format!("losetup -d {}", self.loopdev));
        }
        stop_nbdfuse(&self.fuse_dir, &mut self.fuse);
    }
}

/// Unmount the nbdfuse mount point `fuse_dir` (lazily if busy) and end its
/// process `fuse`: the teardown of every nbdfuse this project starts.
pub fn stop_nbdfuse(fuse_dir: &Path, fuse: &mut Child) {
    let d = fuse_dir.display();
    let _ = sh(&format!("fusermount3 -uz {d} || umount -l {d}"));
    let _ = fuse.kill();
    let _ = fuse.wait();
}

/// The file workload; runs until `stop` or the first I/O error.
fn fs_workload(mnt: &Path, seed: u64, stop: &AtomicBool) -> u64 {
    let mut rng = Rng::new(seed);
    let mut ops = 0u64;
    let r: std::io::Result<()> = (|| {
        for d in 0..4 {
            std::fs::create_dir_all(mnt.join(format!("d{d}")))?;
        }
        let mut logs: Vec<std::fs::File> = (0..3)
            .map(|i| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(mnt.join(format!("log{i}")))
            })
            .collect::<std::io::Result<_>>()?;
        while !stop.load(Ordering::Relaxed) {
            ops += 1;
            let d = mnt.join(format!("d{}", rng.below(4)));
            match rng.below(10) {
                // Small file, sometimes fsynced.
                0..=3 => {
                    let p = d.join(format!("f{}", rng.below(200)));
                    let mut f = std::fs::File::create(&p)?;
                    f.write_all(&vec![rng.next_u64() as u8; 512 + rng.below(8192) as usize])?;
                    if rng.below(3) == 0 {
                        f.sync_all()?;
                    }
                }
                // Append to a log, fsync.
                4..=5 => {
                    let i = rng.below(3) as usize;
                    let line = format!("{ops} {}\n", "x".repeat(rng.below(300) as usize));
                    logs[i].write_all(line.as_bytes())?;
                    if rng.below(2) == 0 {
                        logs[i].sync_data()?;
                    }
                }
                // Atomic replace: write temp, fsync, rename, fsync the directory.
                6..=7 => {
                    let tmp = d.join(format!("tmp{}", rng.below(1000)));
                    let dst = d.join(format!("cfg{}", rng.below(20)));
                    let mut f = std::fs::File::create(&tmp)?;
                    f.write_all(format!("config {ops}\n").repeat(50).as_bytes())?;
                    f.sync_all()?;
                    std::fs::rename(&tmp, &dst)?;
                    std::fs::File::open(&d)?.sync_all()?;
                }
                // Delete a small file.
                8 => {
                    let _ = std::fs::remove_file(d.join(format!("f{}", rng.below(200))));
                }
                // A large file (1-3 MiB), now and then.
                _ => {
                    if rng.below(4) == 0 {
                        let p = mnt.join(format!("big{}", rng.below(4)));
                        let mut f = std::fs::File::create(&p)?;
                        let chunk = vec![rng.next_u64() as u8; 256 << 10];
                        for _ in 0..(4 + rng.below(8)) {
                            f.write_all(&chunk)?;
                        }
                        if rng.below(2) == 0 {
                            f.sync_all()?;
                        }
                    }
                }
            }
        }
        Ok(())
    })();
    let _ = r;
    ops
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Ext4Result {
    pub policy: String,
    pub trial: u32,
    pub seed: u64,
    pub run_ms: u64,
    pub fs_ops: u64,
    /// Server counters just before the kill (None if it did not answer):
    /// blocks written back to the backing store during the workload, and
    /// dirty blocks the crash left only in the (then deleted) cache.
    pub destaged_blocks: Option<u64>,
    pub dirty_blocks: Option<u64>,
    pub clean: bool,
    /// First lines of e2fsck's complaints, if any.
    pub fsck: String,
}

pub fn run_ext4_trial(
    policy: &str,
    trial: u32,
    seed: u64,
    root: &Path,
    max_run_ms: u64,
    cache_mib: u64,
    server_args: &[String],
) -> Result<Ext4Result> {
    let dir = root.join(format!("ext4-{policy}-{trial}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let cfg = ServerCfg {
        dir: dir.clone(),
        policy: policy.to_string(),
        backing_size: 96 << 20,
        cache_size: cache_mib.max(4) << 20,
        env: Vec::new(),
        extra_args: server_args.to_vec(),
        backing_uri: None,
    };
    let mut rng = Rng::new(seed);
    let server = Server::start(&cfg, "serve.log")?;
    let mut stack = Stack::new(&dir, &cfg.uri())?;
    stack.mkfs_and_mount()?;
    // The trial starts from a filesystem that is on the backing store: write
    // back everything (a backing state from before mkfs finished is a
    // consistent point in time, but not a filesystem e2fsck can judge).
    let _ = Command::new("sync").arg("-f").arg(&stack.mnt).status();
    crate::crashtest::control_line(&cfg.dir.join("nvwc.ctl"), "flush", Duration::from_secs(60))
        .context("nvwc flush after mkfs")?;
    let run_ms = 200 + rng.below(max_run_ms.max(201) - 200);
    let stop = Arc::new(AtomicBool::new(false));
    let (mnt, st, s2) = (stack.mnt.clone(), stop.clone(), rng.next_u64());
    let worker = std::thread::spawn(move || fs_workload(&mnt, s2, &st));
    std::thread::sleep(Duration::from_millis(run_ms));
    let status = crate::crashtest::status_line(&cfg.dir.join("nvwc.ctl"));
    let destaged_blocks = status
        .as_deref()
        .and_then(|s| crate::crashtest::stat(s, "destaged_blocks"));
    let dirty_blocks = status
        .as_deref()
        .and_then(|s| crate::crashtest::stat(s, "dirty_blocks"));
    server.kill9();
    stop.store(true, Ordering::Relaxed);
    drop(stack);
    // The workload ends on its first I/O error; do not wait forever for it.
    let t = Instant::now();
    while !worker.is_finished() && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let fs_ops = if worker.is_finished() {
        worker.join().unwrap_or(0)
    } else {
        0
    };
    std::fs::remove_file(cfg.cache()).context("deleting the cache device")?;
    let out = Command::new(std::env::current_exe()?)
        .arg("recover")
        .arg("--backing")
        .arg(cfg.backing())
        .output()?;
    if !out.status.success() {
        bail!("nvwc recover: {}", String::from_utf8_lossy(&out.stderr));
    }
    let img = cfg.backing().display().to_string();
    // Replay the ext4 journal, as mounting would; then the full read-only check.
    let (_, replay) = sh(&format!("e2fsck -E journal_only -y {img} 2>&1"));
    let (clean, fsck) = sh(&format!("e2fsck -fn {img} 2>&1"));
    let summary: String = if clean {
        String::new()
    } else {
        format!("{replay}{fsck}")
            .lines()
            .filter(|l| !l.starts_with("e2fsck ") && !l.trim().is_empty())
            .take(6)
            .collect::<Vec<_>>()
            .join(" | ")
    };
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Ext4Result {
        policy: policy.to_string(),
        trial,
        seed,
        run_ms,
        fs_ops,
        destaged_blocks,
        dirty_blocks,
        clean,
        fsck: summary,
    })
}

pub fn run(a: &Args) -> Result<std::process::ExitCode> {
    if let Some(why) = missing_tools() {
        bail!("ext4 check cannot run here: {why}");
    }
    let (seed, root) = crate::crashtest::seed_and_dir(a, "ext4", "nvwc crashtest --ext4")?;
    let mut bad = false;
    let mut n = 0u64;
    println!("{:<16} {:>6} {:>6}", "policy", "trials", "clean");
    let policies: Vec<&str> = a.policies.split(',').map(str::trim).collect();
    let pb = crate::crashtest::trials_bar(policies.len() as u64 * u64::from(a.trials));
    for p in policies {
        let mut clean = 0;
        pb.set_message(p.to_string());
        for i in 0..a.trials {
            n += 1;
            let s = crate::crashtest::trial_seed(seed, n);
            let r = run_ext4_trial(
                p,
                i,
                s,
                &root,
                a.max_run_ms.max(400),
                a.ext4_cache_mib,
                &a.server_args,
            )
            .with_context(|| format!("ext4 trial {p} {i} (seed {s})"))?;
            if a.json {
                println!("{}", serde_json::to_string(&r)?);
            } else if !r.clean {
                pb.suspend(|| eprintln!("  {p} #{i} seed {s}: e2fsck: {}", r.fsck));
            }
            clean += u32::from(r.clean);
            pb.inc(1);
        }
        if !a.json {
            pb.suspend(|| println!("{p:<16} {:>6} {clean:>6}", a.trials));
        }
        if clean < a.trials && p != "write-back" {
            bad = true;
        }
    }
    pb.finish_and_clear();
    let _ = std::fs::remove_dir(&root);
    Ok(if bad {
        std::process::ExitCode::from(1)
    } else {
        std::process::ExitCode::SUCCESS
    })
}
