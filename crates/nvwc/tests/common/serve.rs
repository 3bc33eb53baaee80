//! Helpers for the tests of a live `nvwc serve` process (`serve.rs`,
//! `serve_bind.rs`, `serve_maxreq.rs`): starting and stopping it in a
//! directory, its backing store (a file or an upstream nbdkit), and running
//! clients and `nvwc` subcommands against it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Server(pub Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A server in a scratch directory of its own, which is removed (after the
/// server is killed) on drop.
pub struct Scratch {
    pub server: Server,
    pub dir: PathBuf,
}

impl Scratch {
    /// `nvwc serve --listen none ARGS --log-level warn` in a fresh
    /// [`tempdir`] `tag`.
    pub fn start(tag: &str, args: &[&str]) -> Scratch {
        let dir = tempdir(tag);
        let mut args = args.to_vec();
        args.extend(["--log-level", "warn"]);
        let server = start_with(&dir, &args);
        Scratch { server, dir }
    }

    pub fn sock(&self) -> PathBuf {
        self.dir.join("nvwc-data/nvwc.sock")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = self.server.0.kill();
        let _ = self.server.0.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Where a test server's backing store lives: its own file (created with
/// `--size`), or an upstream nbdkit `file` export on a unix socket (the
/// write-policy paper's networked storage), which outlives server restarts.
pub enum Backing {
    File(&'static str),
    Upstream(Child, String),
}

impl Backing {
    /// `upstream`: start `nbdkit file` on `dir/up.img` of `size` bytes.
    pub fn new(dir: &Path, upstream: bool, size: &'static str) -> Backing {
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

    pub fn args(&self) -> Vec<String> {
        match self {
            Backing::File(size) => vec!["--size".into(), size.to_string()],
            Backing::Upstream(_, uri) => vec!["--backing".into(), uri.clone()],
        }
    }

    /// The upstream's NBD URI (`None` for a file backing).
    pub fn uri(&self) -> Option<&str> {
        match self {
            Backing::File(_) => None,
            Backing::Upstream(_, uri) => Some(uri),
        }
    }

    pub fn name(&self) -> &'static str {
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

/// The end of a test in `dir` over `backing`: the upstream (if any) stops,
/// then the directory goes.
pub fn clean_up(dir: &Path, backing: Backing) {
    drop(backing);
    let _ = std::fs::remove_dir_all(dir);
}

/// Both backing kinds, when the upstream one can run (nbdkit installed).
pub fn backing_kinds() -> Vec<bool> {
    if super::tool("nbdkit") {
        vec![false, true]
    } else {
        vec![false]
    }
}

pub fn start(dir: &Path, policy: &str, backing: &Backing) -> Server {
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

/// Wait (up to 30 s) until `path` exists: `what` started.
pub fn wait_for(path: &Path, what: &str) {
    let up = super::poll_until(Duration::from_secs(30), Duration::from_millis(50), || {
        path.exists().then_some(())
    });
    assert!(up.is_some(), "{what} did not start");
}

pub fn uri(dir: &Path) -> String {
    format!(
        "nbd+unix:///?socket={}",
        dir.join("nvwc-data/nvwc.sock").display()
    )
}

pub fn qemu_io(dir: &Path, cmds: &[&str]) -> String {
    let mut c = Command::new("qemu-io");
    c.args(["-t", "writeback", "-f", "raw"]);
    for x in cmds {
        c.arg("-c").arg(x);
    }
    let out = c.arg(uri(dir)).output().expect("run qemu-io");
    let text = super::text(&out);
    assert!(out.status.success(), "qemu-io failed: {text}");
    assert!(
        !text.contains("Pattern verification failed") && !text.contains("failed"),
        "qemu-io reported a failure: {text}"
    );
    text
}

pub fn tempdir(tag: &str) -> PathBuf {
    super::tempdir(&format!("serve-{tag}"))
}

/// [`tempdir`] `tag`, in which the shell command `setup` has run.
pub fn tempdir_with(tag: &str, setup: &str) -> PathBuf {
    let d = tempdir(tag);
    must(&format!("cd {} && {setup}", d.display()));
    d
}

pub fn sh(cmd: &str) -> (bool, String) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output()
        .expect("run sh");
    (out.status.success(), super::text(&out))
}

pub fn must(cmd: &str) -> String {
    let (ok, out) = sh(cmd);
    assert!(ok, "`{cmd}` failed: {out}");
    out
}

pub fn stop(mut s: Server) {
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

/// Counter `name` of the first export in `nvwc status` of the server in `dir`.
pub fn status_counter(dir: &Path, name: &str) -> u64 {
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

pub fn start_with(dir: &Path, extra: &[&str]) -> Server {
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

/// `nvwc serve --listen none ARGS` must exit non-zero before listening;
/// returns stderr.
pub fn refused(dir: &Path, args: &[&str]) -> String {
    let args: Vec<&str> = ["--listen", "none"].iter().chain(args).copied().collect();
    super::serve_refused(dir, &args)
}

/// Run an `nvwc` subcommand in `dir`: (success, stdout + stderr).
pub fn nvwc_in(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = super::nvwc().current_dir(dir).args(args).output().unwrap();
    (out.status.success(), super::text(&out))
}

/// `nvwc detach` the server in `dir`, and wait (up to 20 s) until `s` exits.
pub fn detach(dir: &Path, mut s: Server) {
    let (ok, out) = nvwc_in(dir, &["detach"]);
    assert!(ok, "{out}");
    wait_exit(&mut s, "detach");
}

/// Wait (up to 20 s) until `s` exits after `what`.
pub fn wait_exit(s: &mut Server, what: &str) {
    let exited = super::poll_until(Duration::from_secs(20), Duration::from_millis(50), || {
        s.0.try_wait().unwrap()
    });
    assert!(exited.is_some(), "no exit after {what}");
}

/// `qemu-io -r` on the image file `img` running `cmds`: it MUST succeed
/// without a failed check (`what` names the case).
pub fn qemu_io_file(img: &Path, cmds: &[&str], what: &str) {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw", "-r"]);
    for x in cmds {
        c.arg("-c").arg(x);
    }
    let out = c.arg(img).output().unwrap();
    let text = super::text(&out);
    assert!(
        out.status.success() && !text.contains("failed"),
        "{what}: {text}"
    );
}

/// nbdcopy the file `src` into the export of the server in `dir`
/// (`opts[0]`: nbdcopy's options), then out into `back` (`opts[1]`): the
/// first `len` bytes of `back` MUST be `src` (`what` names the case).
pub fn nbdcopy_round_trip(
    dir: &Path,
    src: &Path,
    back: &Path,
    opts: [&str; 2],
    len: &str,
    what: &str,
) {
    must(&format!(
        "nbdcopy {} {} '{}'",
        opts[0],
        src.display(),
        uri(dir)
    ));
    must(&format!(
        "nbdcopy {} '{}' {}",
        opts[1],
        uri(dir),
        back.display()
    ));
    let a = must(&format!("head -c {len} {} | md5sum", back.display()));
    let b = must(&format!("md5sum < {}", src.display()));
    assert_eq!(
        a.split_whitespace().next(),
        b.split_whitespace().next(),
        "{what}: nbdcopy round trip differs"
    );
}

/// fio's output `out` reports no error and no failed verification.
#[track_caller]
pub fn assert_fio_clean(out: &str, what: &str) {
    assert!(
        out.contains("err= 0") && !out.contains("verify: bad"),
        "{what}: {out}"
    );
}

pub fn read(dir: &Path, f: &str) -> Vec<u8> {
    std::fs::read(dir.join(f)).unwrap()
}

/// `nbdkit file` on `dir/file` at `dir/sock` (one thread, see [`Backing`]).
pub fn nbdkit_file(dir: &Path, file: &str, sock: &str) -> Server {
    nbdkit_file_with(dir, file, sock, &[], &[])
}

/// [`nbdkit_file`] with `filters` (`--filter=NAME`) and their `params`
/// (`key=value`).
pub fn nbdkit_file_with(
    dir: &Path,
    file: &str,
    sock: &str,
    filters: &[&str],
    params: &[&str],
) -> Server {
    let sock = dir.join(sock);
    let _ = std::fs::remove_file(&sock);
    let child = Command::new("nbdkit")
        .arg("-U")
        .arg(&sock)
        .args(["-f", "--exit-with-parent", "--threads", "1"])
        .args(filters.iter().map(|f| format!("--filter={f}")))
        .arg("file")
        .arg(dir.join(file))
        .args(params)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nbdkit");
    wait_for(&sock, "nbdkit");
    Server(child)
}
