//! Running nvwc as a service: the configuration file (`serve --config`,
//! `check-config`, SIGHUP), systemd (the notify protocol, the unit), man
//! pages, shell completions, `nvwc status` as a table, and error messages.
//!
//! The tests with real NBD clients need Debian's `qemu-utils` and
//! `libnbd-bin`, the unit check `systemd-analyze` (Debian's `systemd`).
//! Missing tools skip a test, or fail it when `NVWC_REQUIRE_TOOLS=1` (CI).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{nvwc, require_tools};

fn tempdir(tag: &str) -> PathBuf {
    common::tempdir(&format!("service-{tag}"))
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Run `cmd`: (success, stdout, stderr).
fn run(cmd: &mut Command) -> (bool, String, String) {
    let out = cmd.output().expect("run");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A server; killed (SIGKILL) when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Server {
    /// `nvwc serve ARGS` in `dir`, its stderr appended to `dir/log`; waits
    /// for the unix socket `sock`.
    fn start(dir: &Path, args: &[&str], sock: &Path, env: &[(&str, &str)]) -> Server {
        let _ = std::fs::remove_file(sock);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("log"))
            .unwrap();
        let mut c = nvwc();
        c.current_dir(dir).arg("serve").args(args);
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c.stdout(Stdio::null()).stderr(log).spawn().unwrap();
        let t = Instant::now();
        while !sock.exists() {
            if let Ok(Some(st)) = child.try_wait() {
                panic!("nvwc serve {args:?} exited ({st}): {}", log_of(dir));
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "server did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(100));
        Server(child)
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.0.id().to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig}");
    }

    /// SIGTERM, and wait for a clean exit.
    fn stop(mut self) {
        self.signal("TERM");
        let t = Instant::now();
        loop {
            if let Some(st) = self.0.try_wait().unwrap() {
                assert!(st.success(), "server exit status {st}");
                return;
            }
            assert!(t.elapsed() < Duration::from_secs(60), "no exit on SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn log_of(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("log")).unwrap_or_default()
}

/// Wait (up to 20 s) until the server's log in `dir` has a line with `what`.
fn wait_log(dir: &Path, what: &str) -> String {
    let t = Instant::now();
    loop {
        let log = log_of(dir);
        if let Some(l) = log.lines().find(|l| l.contains(what)) {
            return l.to_string();
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "no {what:?} in the log: {log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `contrib/nvwc.example.toml` with its directories moved into `dir`.
fn example_in(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("contrib/nvwc.example.toml")).unwrap();
    let d = dir.display().to_string();
    let text = text.replace("/var/lib/nvwc", &d).replace("/run/nvwc", &d);
    let p = dir.join("nvwc.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// What a client sees of a server: `nbdinfo --list --json`, less what
/// differs from one run to the next.
fn exports_seen(sock: &Path) -> serde_json::Value {
    let (ok, out, err) = run(Command::new("nbdinfo")
        .args(["--list", "--json"])
        .arg(format!("nbd+unix:///?socket={}", sock.display())));
    assert!(ok, "nbdinfo --list: {err}");
    let mut v: serde_json::Value = serde_json::from_str(&out).expect("nbdinfo --json");
    if let Some(o) = v.as_object_mut() {
        o.remove("handshake_flags");
    }
    v
}

fn qemu_io(sock: &Path, name: &str, cmds: &[&str]) {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw"]);
    for x in cmds {
        c.arg("-c").arg(x);
    }
    let (ok, out, err) = run(c.arg(format!("nbd+unix:///{name}?socket={}", sock.display())));
    assert!(
        ok && !out.contains("failed") && !err.contains("failed"),
        "qemu-io {name:?} {cmds:?}: {out}{err}"
    );
}

/// The example configuration serves what the same settings as flags
/// serve: a real client lists the same exports (names, sizes, flags,
/// descriptions), and data written through one server reads back through
/// the other.
#[test]
fn config_file_serves_the_same_exports_as_flags() {
    require_tools!("nbdinfo", "qemu-io");
    let dir = tempdir("config");
    let cfg = example_in(&dir);
    let sock = dir.join("nvwc.sock");
    let d = dir.display().to_string();
    // Small files for the test: flags override the file's [defaults].
    let small = ["--size", "64M", "--cache-size", "8M"];
    let s = Server::start(
        &dir,
        &[
            &["--config", cfg.to_str().unwrap(), "--listen", "none"][..],
            &small,
        ]
        .concat(),
        &sock,
        &[],
    );
    let from_file = exports_seen(&sock);
    qemu_io(&sock, "", &["write -P 0x11 0 1M", "flush"]);
    qemu_io(&sock, "db", &["write -P 0x22 1M 256k", "flush"]);
    s.stop();
    let db = format!("db={d}/db.img,cache={d}/db.cache,policy=journaled,critical");
    let flags = [
        "--listen",
        "none",
        "--unix",
        sock.to_str().unwrap(),
        "--control",
        &format!("{d}/nvwc.ctl"),
        "--backing",
        &format!("{d}/disk.img"),
        "--cache",
        &format!("{d}/disk.cache"),
        "--export",
        &db,
    ];
    let s = Server::start(&dir, &[&flags[..], &small].concat(), &sock, &[]);
    let from_flags = exports_seen(&sock);
    assert_eq!(
        from_file, from_flags,
        "config vs flags, as nbdinfo sees them"
    );
    let names: Vec<&str> = from_flags["exports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["export-name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["", "db"], "{from_flags}");
    assert_eq!(from_flags["exports"][1]["export-size"], 64 << 20);
    qemu_io(&sock, "", &["read -P 0x11 0 1M"]);
    qemu_io(&sock, "db", &["read -P 0x22 1M 256k"]);
    // The file's `critical = true` reached the engine as the flag does.
    let (ok, st, _) = run(nvwc()
        .args(["status", "--json", "--control"])
        .arg(dir.join("nvwc.ctl")));
    assert!(ok);
    let st: serde_json::Value = serde_json::from_str(&st).unwrap();
    assert_eq!(st["exports"][1]["critical"], true, "{st}");
    s.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `nvwc check-config`: the example is valid; syntax errors, unknown keys,
/// wrong types and semantic errors each name their line and column.
#[test]
fn check_config_errors_name_the_line() {
    let (ok, out, err) = run(nvwc()
        .arg("check-config")
        .arg(repo().join("contrib/nvwc.example.toml")));
    assert!(ok, "{err}");
    assert!(out.contains("ok (2 exports: \"\", \"db\")"), "{out}");
    let dir = tempdir("check");
    let cases = [
        (
            "[server]\nunix = \"/s\"\n[server\n",
            "3:8",
            "unclosed table",
        ),
        (
            "[log]\nlevel = \"info\"\nlevels = 3\n",
            "3:1",
            "unknown field `levels`",
        ),
        (
            "[policy]\n\ntxn-blocks = \"many\"\n",
            "3:14",
            "invalid type",
        ),
        (
            "[defaults]\nwrite-policy = \"fast\"\n",
            "2:16",
            "unknown write policy \"fast\"",
        ),
        (
            "[defaults]\nreplacement = \"mru\"\n",
            "2:15",
            "unknown replacement policy",
        ),
        ("[cache]\nblock-size = \"3K\"\n", "2:14", "power of two"),
        (
            "[policy]\nadmission = \"some\"\n",
            "2:13",
            "unknown admission policy",
        ),
        (
            "[tls]\nmode = \"maybe\"\n",
            "2:8",
            "not one of off, on, require",
        ),
        (
            "[server]\ndefault-export = \"x\"\n",
            "2:18",
            "no [[export]] of that name",
        ),
        (
            "[[export]]\nname = \"a\"\nbacking = \"a.img\"\ncache = \"a.c\"\nsize = \"1X\"\n",
            "5:8",
            "unknown size unit",
        ),
        (
            "[[export]]\nname = \"a\"\nbacking = \"a.img\"\ncache = \"a.c\"\n\n\
             [[export]]\nname = \"a\"\nbacking = \"b.img\"\ncache = \"b.c\"\n",
            "7:8",
            "duplicate export name \"a\"",
        ),
    ];
    for (i, (text, at, what)) in cases.iter().enumerate() {
        let p = dir.join(format!("bad{i}.toml"));
        std::fs::write(&p, text).unwrap();
        let (ok, _, err) = run(nvwc().arg("check-config").arg(&p));
        assert!(!ok, "{text}: accepted");
        let want = format!("{}:{at}: ", p.display());
        assert!(
            err.starts_with(&want) && err.contains(what),
            "{text}: want {want}...{what}, got: {err}"
        );
        // `nvwc serve --config` refuses it the same way, before serving.
        let (ok, _, serr) = run(nvwc()
            .current_dir(&dir)
            .args(["serve", "--listen", "none", "--config"])
            .arg(&p));
        assert!(!ok && serr.contains(&want), "serve --config {text}: {serr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// SIGHUP re-reads the file: the log level and an export's `critical`
/// change at once; a new export and a changed write policy are logged as
/// needing a restart; a broken file is refused and the server keeps its
/// settings. systemd hears RELOADING=1 and READY=1 around it.
#[test]
fn sighup_reloads_what_it_can_and_names_what_needs_a_restart() {
    let dir = tempdir("hup");
    let d = dir.display().to_string();
    let write_cfg = |level: &str, critical: bool, extra: &str| {
        let text = format!(
            "[server]\nunix = \"{d}/s.sock\"\ncontrol = \"{d}/s.ctl\"\nlisten = \"none\"\n\
             [log]\nlevel = \"{level}\"\nformat = \"json\"\n\
             [defaults]\nsize = \"16M\"\ncache-size = \"4M\"\n\
             [[export]]\nname = \"a\"\nbacking = \"a.img\"\ncache = \"a.cache\"\ncritical = {critical}\n{extra}"
        );
        std::fs::write(dir.join("c.toml"), text).unwrap();
    };
    write_cfg("info", false, "");
    let notify = dir.join("notify.sock");
    let rx = std::os::unix::net::UnixDatagram::bind(&notify).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let recv = || {
        let mut b = [0u8; 512];
        let n = rx.recv(&mut b).expect("a notification");
        String::from_utf8_lossy(&b[..n]).into_owned()
    };
    let s = Server::start(
        &dir,
        &["--config", "c.toml", "--export", "z=z.img,cache=z.cache"],
        &dir.join("s.sock"),
        &[("NOTIFY_SOCKET", notify.to_str().unwrap())],
    );
    assert!(recv().starts_with("READY=1"));
    let critical = || {
        let (ok, out, err) = run(nvwc()
            .args(["status", "--json", "--control"])
            .arg(dir.join("s.ctl")));
        assert!(ok, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["exports"][0]["critical"].as_bool().unwrap()
    };
    assert!(!critical());
    // A client of export `name`: `nvwc loadtest` for a moment (one
    // connection, verified).
    let client_on = |name: &str| {
        let (ok, out, err) = run(nvwc()
            .args(["loadtest", "--clients", "1", "--duration", "1s", "--uri"])
            .arg(format!("nbd+unix:///{name}?socket={d}/s.sock")));
        assert!(ok, "loadtest on {name}: {out}{err}");
    };
    client_on("a");
    // SIGHUP: the server reloads, and says so.
    let reload = || {
        s.signal("HUP");
        assert_eq!(recv(), "RELOADING=1");
        assert_eq!(recv(), "READY=1");
    };
    let before = log_of(&dir);
    write_cfg(
        "debug",
        true,
        "[[export]]\nname = \"b\"\nbacking = \"b.img\"\ncache = \"b.cache\"\nwrite-policy = \"ordered\"\n",
    );
    std::fs::write(
        dir.join("c.toml"),
        std::fs::read_to_string(dir.join("c.toml"))
            .unwrap()
            .replace(
                "cache-size = \"4M\"",
                "cache-size = \"4M\"\nwrite-policy = \"ordered\"",
            ),
    )
    .unwrap();
    reload();
    let applied = wait_log(&dir, "\"event\":\"reloaded\"");
    assert!(
        applied.contains("log.level") && applied.contains("export[\\\"a\\\"].critical"),
        "{applied}"
    );
    let restart = wait_log(&dir, "reload_needs_restart");
    assert!(
        !restart.contains("export[\\\"b\\\"]") && restart.contains("defaults.write-policy"),
        "{restart}"
    );
    // The new export serves: listed, and a verified client on it.
    let added = wait_log(&dir, "\"event\":\"export_added\"");
    assert!(added.contains("\"export\":\"b\""), "{added}");
    client_on("b");
    let (ok, out, err) = run(Command::new("nbdinfo")
        .arg("--list")
        .arg(format!("nbd+unix:///?socket={d}/s.sock")));
    assert!(
        ok && out.contains("export=\"a\"") && out.contains("export=\"b\""),
        "{out}{err}"
    );
    // A new export sharing a served export's cache file is refused, and
    // the others keep serving: the file's own check names the line when
    // both are in the file; the server refuses one sharing the cache of an
    // export given on the command line (`z`).
    let text = std::fs::read_to_string(dir.join("c.toml")).unwrap();
    let add = |extra: &str| std::fs::write(dir.join("c.toml"), format!("{text}{extra}")).unwrap();
    // (export `c`'s cache, the log line, two parts of it).
    for (cache, event, part1, part2) in [
        (
            "a.cache",
            "is also used by export",
            "reload_failed",
            "c.toml:",
        ),
        (
            "z.cache",
            "export_add_failed",
            "\"export\":\"c\"",
            "shares its cache",
        ),
    ] {
        add(&format!(
            "[[export]]\nname = \"c\"\nbacking = \"c.img\"\ncache = \"{cache}\"\n"
        ));
        reload();
        let refused = wait_log(&dir, event);
        assert!(
            refused.contains(part1) && refused.contains(part2),
            "{refused}"
        );
    }
    client_on("a");
    client_on("b");
    assert!(critical(), "critical = true not applied");
    // Debug events are logged now: an NBD client's `ready` (its handshake).
    assert!(
        !before.contains("\"event\":\"ready\""),
        "debug event at info level"
    );
    client_on("a");
    let ready = wait_log(&dir, "\"event\":\"ready\"");
    assert!(ready.contains("\"level\":\"debug\""), "{ready}");
    // A broken file: refused, logged, nothing changes.
    std::fs::write(dir.join("c.toml"), "[log]\nlevel = \"loud\"\n").unwrap();
    reload();
    let failed = wait_log(&dir, "c.toml:2:9");
    assert!(failed.contains("reload_failed"), "{failed}");
    assert!(critical(), "a refused reload changed the settings");
    s.stop();
    assert!(recv().starts_with("STOPPING=1"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The sd_notify protocol as systemd's `Type=notify` uses it: READY=1 once
/// serving, STOPPING=1 on SIGTERM; both to a path and to an abstract
/// (`@name`) socket.
#[test]
fn systemd_notify_ready_and_stopping() {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let dir = tempdir("notify");
    let path = dir.join("notify.sock");
    let name = format!("nvwc-test-notify-{}", std::process::id());
    let by_path = UnixDatagram::bind(&path).unwrap();
    let abstract_ =
        UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
    for (rx, target) in [
        (&by_path, path.display().to_string()),
        (&abstract_, format!("@{name}")),
    ] {
        rx.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let s = Server::start(
            &dir,
            &["--listen", "none", "--size", "16M", "--cache-size", "4M"],
            &dir.join("nvwc-data/nvwc.sock"),
            &[("NOTIFY_SOCKET", &target)],
        );
        let mut b = [0u8; 512];
        let n = rx.recv(&mut b).expect("READY=1");
        let msg = String::from_utf8_lossy(&b[..n]).into_owned();
        assert!(
            msg.starts_with("READY=1\nSTATUS=serving 1 export"),
            "{target}: {msg}"
        );
        s.signal("TERM");
        let n = rx.recv(&mut b).expect("STOPPING=1");
        let msg = String::from_utf8_lossy(&b[..n]).into_owned();
        assert!(msg.starts_with("STOPPING=1"), "{target}: {msg}");
        s.stop();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `systemd-analyze verify` accepts the unit (with this build's binary in
/// ExecStart=): no error and no warning about it.
#[test]
fn systemd_unit_verifies() {
    let unit = std::fs::read_to_string(repo().join("contrib/systemd/nvwc.service")).unwrap();
    for want in [
        "Type=notify",
        "ExecReload=",
        "TimeoutStopSec=",
        "ProtectSystem=strict",
        "PrivateTmp=yes",
        "NoNewPrivileges=yes",
        "ReadWritePaths=/var/lib/nvwc",
    ] {
        assert!(unit.contains(want), "nvwc.service lacks {want}");
    }
    require_tools!("systemd-analyze");
    let dir = tempdir("unit");
    // Documentation= would ask man(1) for pages not installed here.
    let unit: String = unit
        .lines()
        .filter(|l| !l.starts_with("Documentation="))
        .map(|l| l.replace("/usr/local/bin/nvwc", env!("CARGO_BIN_EXE_nvwc")) + "\n")
        .collect();
    std::fs::write(dir.join("nvwc.service"), unit).unwrap();
    let (ok, out, err) = run(Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(dir.join("nvwc.service")));
    let complaints: Vec<&str> = err.lines().filter(|l| l.contains("nvwc.service")).collect();
    assert!(
        ok && complaints.is_empty(),
        "systemd-analyze verify: {out}{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// docs/man holds a page for `nvwc` and every subcommand, as the current
/// command line would generate them.
#[test]
fn man_pages_are_current() {
    let dir = tempdir("man");
    let (ok, _, err) = run(nvwc().args(["man", "--out"]).arg(&dir));
    assert!(ok, "{err}");
    let list = |d: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".1"))
            .collect();
        v.sort();
        v
    };
    let fresh = list(&dir);
    let committed = list(&repo().join("docs/man"));
    let regen = "regenerate them: cargo run --release -p nvwc -- man --out docs/man";
    assert_eq!(
        committed, fresh,
        "docs/man has other pages than the CLI: {regen}"
    );
    for sub in [
        "serve",
        "status",
        "check-config",
        "completions",
        "trace-convert",
        "detach",
    ] {
        assert!(
            fresh.contains(&format!("nvwc-{sub}.1")),
            "no page for {sub}"
        );
    }
    for p in &fresh {
        let a = std::fs::read(dir.join(p)).unwrap();
        let b = std::fs::read(repo().join("docs/man").join(p)).unwrap();
        assert!(a == b, "docs/man/{p} is stale: {regen}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `nvwc completions SHELL` for bash, zsh and fish; bash parses its script.
#[test]
fn shell_completions() {
    for shell in ["bash", "zsh", "fish"] {
        let (ok, out, err) = run(nvwc().args(["completions", shell]));
        assert!(ok, "{shell}: {err}");
        for word in ["serve", "check-config", "status", "--config"] {
            assert!(out.contains(word), "{shell} completion lacks {word}");
        }
        if shell == "bash" {
            let dir = tempdir("bash");
            std::fs::write(dir.join("nvwc.bash"), &out).unwrap();
            let (ok, _, err) = run(Command::new("bash").arg("-n").arg(dir.join("nvwc.bash")));
            assert!(ok, "bash -n: {err}");
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    let (ok, _, _) = run(nvwc().args(["completions", "tcsh"]));
    assert!(!ok, "an unknown shell is refused");
}

/// `nvwc status`: JSON when stdout is not a terminal (scripts and the other
/// tests rely on it) and with --json; a table with --table.
#[test]
fn status_table_and_json() {
    let dir = tempdir("status");
    let s = Server::start(
        &dir,
        &[
            "--listen",
            "none",
            "--size",
            "16M",
            "--cache-size",
            "4M",
            "--export",
            "db=db.img,size=8M,cache-size=4M",
        ],
        &dir.join("nvwc-data/nvwc.sock"),
        &[],
    );
    for args in [&["status"][..], &["status", "--json"]] {
        let (ok, out, err) = run(nvwc().current_dir(&dir).args(args));
        assert!(ok, "{err}");
        let v: serde_json::Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"));
        assert_eq!(v["exports"].as_array().unwrap().len(), 2);
    }
    let (ok, out, err) =
        run(nvwc()
            .current_dir(&dir)
            .args(["status", "--table", "--interval-ms", "200"]));
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    for col in ["EXPORT", "READ HIT", "DIRTY", "DESTAGE/s", "STALLS"] {
        assert!(lines[0].contains(col), "{out}");
    }
    assert!(
        lines[1].starts_with("(default)") && lines[1].contains("write-back"),
        "{out}"
    );
    assert!(
        lines[2].starts_with("db ") && lines[2].contains("8.0M"),
        "{out}"
    );
    assert!(out.contains("no connections"), "{out}");
    let (ok, _, _) = run(nvwc()
        .current_dir(&dir)
        .args(["status", "--json", "--table"]));
    assert!(!ok, "--json and --table together");
    s.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// An error and its causes print each cause once (was: `...: No such file
/// or directory (os error 2): No such file or directory (os error 2)`).
#[test]
fn error_causes_print_once() {
    let cases: [&[&str]; 3] = [
        &["status", "--control", "/nonexistent/nvwc.ctl"],
        &["sim", "--trace", "/nonexistent/trace.txt"],
        &[
            "loadtest",
            "--uri",
            "nbd+unix:///?socket=/nonexistent/s",
            "--duration",
            "1s",
        ],
    ];
    for args in cases {
        let (ok, _, err) = run(nvwc().args(args));
        assert!(!ok, "{args:?} succeeded");
        assert!(err.contains("No such file or directory"), "{args:?}: {err}");
        assert_eq!(
            err.matches("No such file or directory").count(),
            1,
            "{args:?}: a cause printed twice: {err}"
        );
    }
}

/// The control socket's directory is created when missing, so `nvwc status`
/// reaches a server whose cache, backing store and NBD socket all live
/// elsewhere; a control socket that cannot be made stops the server at start
/// with an error naming it and `--control`, instead of serving without one
/// (when `nvwc status`, `flush` and `detach` could only say that no server
/// is running).
#[test]
fn the_control_socket_gets_its_directory_or_the_server_refuses_to_start() {
    let dir = tempdir("control-dir");
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("n.sock");
    let args = [
        "--listen",
        "none",
        "--unix",
        "n.sock",
        "--backing",
        "b.img",
        "--cache",
        "c.img",
        "--size",
        "16M",
        "--cache-size",
        "8M",
    ];
    let mut with_ctl: Vec<&str> = args.to_vec();
    with_ctl.extend(["--control", "run/nvwc/ctl"]);
    let s = Server::start(&dir, &with_ctl, &sock, &[]);
    let (ok, out, err) =
        run(nvwc()
            .current_dir(&dir)
            .args(["status", "--json", "--control", "run/nvwc/ctl"]));
    assert!(ok, "nvwc status: {out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("status JSON");
    assert_eq!(v["exports"].as_array().map(Vec::len), Some(1), "{out}");
    s.stop();

    // A directory that cannot exist: its parent is a file.
    std::fs::write(dir.join("a-file"), b"x").unwrap();
    let mut bad: Vec<&str> = args.to_vec();
    bad.extend(["--control", "a-file/ctl"]);
    let _ = std::fs::remove_file(&sock);
    let err = common::serve_refused(&dir, &bad);
    assert!(
        err.contains("control socket a-file/ctl") && err.contains("--control"),
        "{err}"
    );
    assert!(!sock.exists(), "it listened before failing");
}
