//! One trial's `nvwc serve` process: its files, its start and its `kill -9`,
//! connecting to it, and its control socket (`status`, `flush`).

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nvwc_nbd::Client;

/// Geometry and files of one trial's server.
#[derive(Clone, Debug)]
pub struct ServerCfg {
    pub dir: PathBuf,
    pub policy: String,
    pub backing_size: u64,
    pub cache_size: u64,
    /// Extra environment (faults, failpoints).
    pub env: Vec<(String, String)>,
    pub extra_args: Vec<String>,
    /// An upstream NBD backing store instead of `backing.img`.
    pub backing_uri: Option<String>,
}

impl ServerCfg {
    /// What `--backing` gets.
    pub fn backing_spec(&self) -> String {
        match &self.backing_uri {
            Some(u) => u.clone(),
            None => self.backing().display().to_string(),
        }
    }
    pub fn backing(&self) -> PathBuf {
        self.dir.join("backing.img")
    }
    pub fn cache(&self) -> PathBuf {
        self.dir.join("cache.img")
    }
    pub fn socket(&self) -> PathBuf {
        self.dir.join("nbd.sock")
    }
    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket().display())
    }
}

/// A running `nvwc serve`.
pub struct Server {
    pub child: Child,
}

impl Server {
    /// Start the server and wait until it accepts connections.
    pub fn start(cfg: &ServerCfg, log_name: &str) -> Result<Server> {
        let exe = std::env::current_exe().context("finding the nvwc binary")?;
        let log = std::fs::File::create(cfg.dir.join(log_name))?;
        let _ = std::fs::remove_file(cfg.socket());
        let mut cmd = Command::new(exe);
        cmd.arg("serve")
            .arg("--backing")
            .arg(cfg.backing_spec())
            .arg("--cache")
            .arg(cfg.cache())
            .arg("--size")
            .arg(cfg.backing_size.to_string())
            .arg("--cache-size")
            .arg(cfg.cache_size.to_string())
            .arg("--unix")
            .arg(cfg.socket())
            .arg("--listen")
            .arg("none")
            .arg("--control")
            .arg(cfg.dir.join("nvwc.ctl"))
            .arg("--write-policy")
            .arg(&cfg.policy)
            .args(["--txn-blocks", "64", "--txn-age-ms", "100"])
            .args(["--commit-interval-ms", "100", "--log-level", "warn"])
            .args(&cfg.extra_args)
            .env_remove("NVWC_FAILPOINTS")
            .env_remove("NVWC_FAULT_CACHE")
            .env_remove("NVWC_FAULT_BACKING")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        for (k, v) in &cfg.env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().context("spawning nvwc serve")?;
        let t = Instant::now();
        while !cfg.socket().exists() {
            if let Some(st) = child.try_wait()? {
                bail!(
                    "nvwc serve exited at start ({st}): {}",
                    std::fs::read_to_string(cfg.dir.join(log_name)).unwrap_or_default()
                );
            }
            if t.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                bail!("nvwc serve did not start in 30 s");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(Server { child })
    }

    /// `kill -9`, and wait. Returns the signal the process died of (if any).
    pub fn kill9(mut self) -> Option<i32> {
        let _ = self.child.kill();
        self.child.wait().ok().and_then(|s| s.signal())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Connect, retrying while the server finishes starting.
pub async fn connect(uri: &str) -> Result<Client> {
    let t = Instant::now();
    loop {
        match Client::connect(uri).await {
            Ok(c) => return Ok(c),
            Err(e) if t.elapsed() > Duration::from_secs(30) => {
                return Err(e).context("connecting to nvwc serve")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

pub(crate) fn counter(status: &str, name: &str) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_str(status).ok()?;
    v["exports"][0]["policy"][name].as_u64()
}

pub(crate) fn stat(status: &str, name: &str) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_str(status).ok()?;
    v["exports"][0]["stats"][name].as_u64()
}

pub(crate) fn status_line(ctl: &Path) -> Option<String> {
    control_line(ctl, "status", Duration::from_secs(2))
}

/// Send one control command (`status`, `flush`, `detach`) and read the answer.
pub fn control_line(ctl: &Path, cmd: &str, timeout: Duration) -> Option<String> {
    use std::io::{BufRead, Write};
    let mut s = std::os::unix::net::UnixStream::connect(ctl).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.write_all(format!("{cmd}\n").as_bytes()).ok()?;
    let mut line = String::new();
    std::io::BufReader::new(s).read_line(&mut line).ok()?;
    Some(line)
}
