//! `nvwc serve --tls ...` with real clients: nbdinfo and nbdcopy (libnbd,
//! GnuTLS) with a pre-shared key and with x509 certificates, qemu-io with
//! `tls-creds-psk` and `tls-creds-x509`; plain clients under `--tls require`,
//! a wrong key, an unknown user, an untrusted server and untrusted client
//! certificates are each refused while a TLS client keeps being served.
//! Also the public-listener guard and the flag checks.
//!
//! Needs Debian's `libnbd-bin`, `qemu-utils` and `openssl` (the CLI makes
//! the test CA and certificates). Missing tools skip a test, or fail it under
//! CI (`CI=true` or `NVWC_REQUIRE_TOOLS=1`).
#![cfg(feature = "tls")]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{free_port, require_tools, text};

fn tempdir(tag: &str) -> PathBuf {
    common::tempdir(&format!("tls-{tag}"))
}

/// A running `nvwc serve`, killed on drop; its log goes to `dir/server.log`.
struct Server {
    server: common::serve::Server,
    dir: PathBuf,
    port: u16,
}

impl Server {
    /// Start on a free loopback port; another process taking the port
    /// between our probe and the server's bind gets a retry.
    fn start(dir: &Path, extra: &[&str]) -> Server {
        for _ in 0..3 {
            if let Some(s) = Server::try_start(dir, extra) {
                return s;
            }
        }
        panic!("nvwc serve could not bind a free port three times");
    }

    fn try_start(dir: &Path, extra: &[&str]) -> Option<Server> {
        let port = free_port();
        let sock = dir.join("nvwc-data/nvwc.sock");
        let _ = std::fs::remove_file(&sock);
        let log = std::fs::File::create(dir.join("server.log")).unwrap();
        let child = common::nvwc()
            .current_dir(dir)
            .args(["serve", "--size", "16M", "--cache-size", "8M"])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut s = Server {
            server: common::serve::Server(child),
            dir: dir.to_path_buf(),
            port,
        };
        let t = Instant::now();
        while !sock.exists() || std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(st) = s.server.0.try_wait().unwrap() {
                let log = s.log();
                if log.contains("Address already in use") {
                    return None;
                }
                panic!("nvwc serve exited ({st}): {log}");
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "server did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(s)
    }

    /// `nbds://USER@127.0.0.1:PORT/?tls-psk-file=FILE`.
    fn psk_tcp(&self, user: &str, file: &Path) -> String {
        format!(
            "nbds://{user}@127.0.0.1:{}/?tls-psk-file={}",
            self.port,
            file.display()
        )
    }

    /// `nbds://localhost:PORT/?tls-certificates=CERTS`.
    fn x509_tcp(&self, certs: &Path) -> String {
        format!(
            "nbds://localhost:{}/?tls-certificates={}",
            self.port,
            certs.display()
        )
    }

    fn plain_tcp(&self) -> String {
        format!("nbd://127.0.0.1:{}/", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    fn sock(&self) -> PathBuf {
        std::fs::canonicalize(self.dir.join("nvwc-data/nvwc.sock")).unwrap()
    }
}

/// The TLS client that ran beside the refusals finished without an error
/// and saw only the data it wrote.
fn busy_client_passed(busy: Child) {
    let out = busy.wait_with_output().unwrap();
    let t = text(&out);
    assert!(
        out.status.success(),
        "the TLS client beside the refusals failed: {t}"
    );
    assert!(!t.contains("failed"), "the TLS client saw bad data: {t}");
}

/// Run a client; `ok`: whether it must succeed. Returns its output.
fn client(ok: bool, what: &str, cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let t = text(&out);
    assert_eq!(
        out.status.success(),
        ok,
        "{what}: expected {}: {t}",
        if ok { "success" } else { "a refusal" }
    );
    t
}

/// [`client`] `nbdinfo URI`.
fn nbdinfo_client(ok: bool, what: &str, uri: &str) -> String {
    client(ok, what, &mut nbdinfo(uri))
}

fn nbdinfo(uri: &str) -> Command {
    let mut c = Command::new("nbdinfo");
    // libnbd logs the server's error message only in debug output.
    c.env("LIBNBD_DEBUG", "1").arg(uri);
    c
}

fn sh(cmd: &str, dir: &Path) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{cmd}: {}", text(&out));
}

/// Wait until the server's log has `needle` (the event is logged just after
/// the client saw the refusal).
fn log_has(s: &Server, needle: &str) {
    let t = Instant::now();
    while !s.log().contains(needle) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "server log lacks {needle:?}:\n{}",
            s.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A GnuTLS system priority file that disables TLS 1.3 (for
/// `GNUTLS_SYSTEM_PRIORITY_FILE`), so a libnbd client speaks TLS 1.2.
fn no_tls13(dir: &Path) -> PathBuf {
    let p = dir.join("no-tls13.conf");
    std::fs::write(&p, "[overrides]\ndisabled-version = tls1.3\n").unwrap();
    p
}

const KEY: &str = "8a4d2c1e0f9b7a6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c";
const WRONG_KEY: &str = "0a4d2c1e0f9b7a6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c";

/// `dir/keys.psk`: user alice with [`KEY`].
fn write_key(dir: &Path) {
    std::fs::write(dir.join("keys.psk"), format!("alice:{KEY}\n")).unwrap();
}

/// A fresh [`tempdir`] `tag` with [`write_key`]'s `keys.psk`.
fn key_dir(tag: &str) -> PathBuf {
    let dir = tempdir(tag);
    write_key(&dir);
    dir
}

/// A qemu-io with TLS credentials `creds` (a `tls-creds-*` object with
/// `id=tls0`) to `host:port` running `cmds`.
fn qemu_io_tls<S: AsRef<std::ffi::OsStr>>(
    creds: String,
    host: &str,
    port: u16,
    cmds: &[S],
) -> Command {
    let mut c = Command::new("qemu-io");
    c.arg("--object").arg(creds);
    c.args(["--image-opts"]).arg(format!(
        "driver=nbd,server.type=inet,server.host={host},server.port={port},tls-creds=tls0"
    ));
    for x in cmds {
        c.arg("-c").arg(x);
    }
    c
}

/// A qemu-io over TLS-PSK to the server's TCP port running `cmds`.
fn qemu_io_psk(s: &Server, pskdir: &Path, cmds: &[String]) -> Command {
    let creds = format!(
        "tls-creds-psk,id=tls0,endpoint=client,dir={},username=alice",
        pskdir.display()
    );
    qemu_io_tls(creds, "127.0.0.1", s.port, cmds)
}

#[test]
fn psk_nbdinfo_nbdcopy_qemu_and_refusals_while_serving() {
    require_tools!("nbdinfo", "nbdcopy", "qemu-io");
    let dir = key_dir("psk");
    // qemu's tls-creds-psk reads DIR/keys.psk.
    let qdir = dir.join("qemu");
    std::fs::create_dir_all(&qdir).unwrap();
    write_key(&qdir);
    std::fs::write(dir.join("wrong.psk"), format!("alice:{WRONG_KEY}\n")).unwrap();
    std::fs::write(dir.join("bob.psk"), format!("bob:{KEY}\n")).unwrap();
    let no13 = no_tls13(&dir);
    let s = Server::start(&dir, &["--tls", "require", "--tls-psk", "keys.psk"]);
    let psk = dir.join("keys.psk");
    let tcp = s.psk_tcp("alice", &psk);
    let unix = format!(
        "nbds+unix://alice@/?socket={}&tls-psk-file={}",
        s.sock().display(),
        psk.display()
    );

    let t = nbdinfo_client(true, "nbdinfo over TLS-PSK (tcp)", &tcp);
    assert!(t.contains("with TLS"), "{t}");
    let t = nbdinfo_client(true, "nbdinfo over TLS-PSK (unix)", &unix);
    assert!(t.contains("with TLS"), "{t}");
    log_has(&s, "tls=\"psk:alice TLSv1.3 TLS_");
    // TLS 1.2 (the spec's MUST) with a PSK suite: GnuTLS told to not offer 1.3.
    let t = client(
        true,
        "nbdinfo over TLS 1.2 PSK",
        nbdinfo(&tcp).env("GNUTLS_SYSTEM_PRIORITY_FILE", &no13),
    );
    assert!(t.contains("with TLS"), "{t}");
    log_has(&s, "tls=\"psk:alice TLSv1.2 ECDHE-PSK-");

    // nbdcopy in and out through TLS, checked byte for byte. In through the
    // unix socket, where plain connections take direct writes: a TLS one
    // must not (its socket carries ciphertext).
    let data: Vec<u8> = (0..16u64 << 20)
        .map(|i| (i.wrapping_mul(0x9e37_79b9) >> 13) as u8)
        .collect();
    std::fs::write(dir.join("src.img"), &data).unwrap();
    client(
        true,
        "nbdcopy to the server (unix: no direct writes of ciphertext)",
        Command::new("nbdcopy")
            .arg("--request-size=65536")
            .arg(dir.join("src.img"))
            .arg(&unix),
    );
    client(
        true,
        "nbdcopy from the server (tcp)",
        Command::new("nbdcopy").arg(&tcp).arg(dir.join("out.img")),
    );
    let back = std::fs::read(dir.join("out.img")).unwrap();
    assert!(
        back == data,
        "nbdcopy round trip through TLS changed the data"
    );

    // A TLS client busy with verified writes and reads, while plain and
    // badly keyed clients are refused beside it.
    let mut cmds = Vec::new();
    for round in 0..40 {
        let p = 0x10 + round % 200;
        cmds.push(format!("write -P {p} {}k 256k", (round % 32) * 256));
        cmds.push(format!("read -P {p} {}k 256k", (round % 32) * 256));
    }
    let busy = qemu_io_psk(&s, &qdir, &cmds)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    // Plain text under --tls require: an error reply (libnbd says ENOTSUP
    // and logs our message; qemu names the TLS requirement).
    let plain = s.plain_tcp();
    let t = nbdinfo_client(false, "plain nbdinfo under --tls require", &plain);
    assert!(t.contains("TLS is required"), "{t}");
    let t = client(
        false,
        "plain qemu-io under --tls require",
        Command::new("qemu-io").args(["-f", "raw", "-c", "read 0 4k", &plain]),
    );
    assert!(t.to_lowercase().contains("tls"), "{t}");
    let t = client(
        false,
        "plain nbdinfo on the unix socket",
        &mut nbdinfo(&format!("nbd+unix:///?socket={}", s.sock().display())),
    );
    assert!(t.contains("TLS is required"), "{t}");
    // A wrong key and an unknown user: the TLS handshake fails.
    let wrong = s.psk_tcp("alice", &dir.join("wrong.psk"));
    nbdinfo_client(false, "nbdinfo with a wrong PSK", &wrong);
    let bob = s.psk_tcp("bob", &dir.join("bob.psk"));
    nbdinfo_client(false, "nbdinfo with an unknown PSK user", &bob);

    busy_client_passed(busy);
    // And the server still serves TLS clients afterwards.
    nbdinfo_client(true, "nbdinfo over TLS after the refusals", &tcp);

    log_has(&s, "reason=\"tls-required: ");
    log_has(&s, "unknown PSK username \\\"bob\\\"");
    log_has(
        &s,
        "PSK username \\\"alice\\\": the client's key does not match?",
    );
}

/// A CA (`NAME-ca-cert.pem`, `NAME-ca-key.pem`) in `dir`.
fn make_ca(dir: &Path, name: &str) {
    sh(
        &format!(
            "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
             -keyout {name}-ca-key.pem -out {name}-ca-cert.pem -days 3 -subj /CN={name}-ca \
             -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign"
        ),
        dir,
    );
}

/// A certificate `OUT-cert.pem`/`OUT-key.pem` signed by CA `ca`, for
/// `usage` (serverAuth or clientAuth).
fn make_cert(dir: &Path, ca: &str, out: &str, cn: &str, usage: &str) {
    std::fs::write(
        dir.join(format!("{out}.ext")),
        format!(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
             extendedKeyUsage={usage}\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n"
        ),
    )
    .unwrap();
    sh(
        &format!(
            "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
             -keyout {out}-key.pem -out {out}.csr -subj /CN={cn} && \
             openssl x509 -req -in {out}.csr -CA {ca}-ca-cert.pem -CAkey {ca}-ca-key.pem \
             -CAcreateserial -out {out}-cert.pem -days 3 -extfile {out}.ext"
        ),
        dir,
    );
}

/// A directory as libnbd's `tls-certificates` and qemu's `tls-creds-x509`
/// read it: `ca-cert.pem` (trusted CA), and a client certificate if given.
fn client_dir(dir: &Path, name: &str, ca: &str, cert: Option<&str>) -> PathBuf {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(dir.join(format!("{ca}-ca-cert.pem")), d.join("ca-cert.pem")).unwrap();
    if let Some(c) = cert {
        std::fs::copy(dir.join(format!("{c}-cert.pem")), d.join("client-cert.pem")).unwrap();
        std::fs::copy(dir.join(format!("{c}-key.pem")), d.join("client-key.pem")).unwrap();
    }
    d
}

#[test]
fn x509_nbdinfo_qemu_io_verify_peer_and_bad_certificates() {
    require_tools!("nbdinfo", "qemu-io", "openssl");
    let dir = tempdir("x509");
    make_ca(&dir, "good");
    make_ca(&dir, "rogue");
    make_cert(&dir, "good", "server", "localhost", "serverAuth");
    make_cert(&dir, "good", "client", "nvwc-test-client", "clientAuth");
    make_cert(&dir, "rogue", "intruder", "intruder", "clientAuth");
    let srv = dir.join("server-certs");
    std::fs::create_dir_all(&srv).unwrap();
    for (from, to) in [
        ("good-ca-cert.pem", "ca-cert.pem"),
        ("server-cert.pem", "server-cert.pem"),
        ("server-key.pem", "server-key.pem"),
    ] {
        std::fs::copy(dir.join(from), srv.join(to)).unwrap();
    }
    let good = client_dir(&dir, "good-client", "good", Some("client"));
    let nocert = client_dir(&dir, "no-client-cert", "good", None);
    let intruder = client_dir(&dir, "intruder", "good", Some("intruder"));
    let distrust = client_dir(&dir, "distrusting", "rogue", Some("client"));

    let x509_server = ["--tls", "require", "--tls-certificates", "server-certs"];
    let s = Server::start(&dir, &[&x509_server[..], &["--tls-verify-peer"]].concat());
    let port = s.port;
    let uri = |d: &Path| s.x509_tcp(d);
    let t = nbdinfo_client(true, "nbdinfo with x509", &uri(&good));
    assert!(t.contains("with TLS"), "{t}");
    log_has(&s, "tls=\"x509:CN=nvwc-test-client TLSv1.3 TLS_");
    client(
        true,
        "nbdinfo with x509 over TLS 1.2",
        nbdinfo(&uri(&good)).env("GNUTLS_SYSTEM_PRIORITY_FILE", no_tls13(&dir)),
    );
    log_has(&s, "tls=\"x509:CN=nvwc-test-client TLSv1.2 ECDHE-");

    let qemu = |d: &Path, cmds: &[&str]| {
        let creds = format!("tls-creds-x509,id=tls0,endpoint=client,dir={}", d.display());
        qemu_io_tls(creds, "localhost", port, cmds)
    };
    let t = client(
        true,
        "qemu-io with tls-creds-x509",
        &mut qemu(
            &good,
            &["write -P 0xa5 1M 192k", "flush", "read -P 0xa5 1M 192k"],
        ),
    );
    assert!(!t.contains("failed"), "{t}");

    // A busy x509 client beside the refusals.
    let cmds: Vec<String> = (0..40)
        .flat_map(|i| {
            let p = 0x20 + i;
            [
                format!("write -P {p} {}k 128k", i * 256),
                format!("read -P {p} {}k 128k", i * 256),
            ]
        })
        .collect();
    let refs: Vec<&str> = cmds.iter().map(String::as_str).collect();
    let busy = qemu(&good, &refs)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The client does not trust the server's CA: it refuses the server.
    nbdinfo_client(
        false,
        "nbdinfo that distrusts the server's CA",
        &uri(&distrust),
    );
    // The server refuses a client certificate from an unknown CA, and a
    // client without one.
    nbdinfo_client(
        false,
        "nbdinfo with an untrusted client certificate",
        &uri(&intruder),
    );
    nbdinfo_client(false, "nbdinfo with no client certificate", &uri(&nocert));
    client(
        false,
        "qemu-io with an untrusted client certificate",
        &mut qemu(&intruder, &["read 0 4k"]),
    );
    busy_client_passed(busy);
    nbdinfo_client(true, "nbdinfo with x509 after the refusals", &uri(&good));
    log_has(&s, "reason=\"tls-handshake-failed: ");
    // GnuTLS sends no certificate that the server's CA list does not name.
    log_has(&s, "peer did not return a certificate (--tls-verify-peer: ");
    drop(s);

    // Certificates and PSKs together: each client uses what it has.
    write_key(&dir);
    let s = Server::start(
        &dir,
        &[&x509_server[..], &["--tls-psk", "keys.psk"]].concat(),
    );
    let psk = s.psk_tcp("alice", &dir.join("keys.psk"));
    nbdinfo_client(true, "PSK client of a server with both", &psk);
    let x509 = s.x509_tcp(&nocert);
    nbdinfo_client(true, "x509 client of a server with both", &x509);
    log_has(&s, "tls=\"psk:alice TLSv1.3");
    log_has(&s, "tls=\"x509 TLSv1.3");
}

#[test]
fn tls_on_serves_both_and_tls_off_refuses_starttls() {
    require_tools!("nbdinfo");
    let dir = key_dir("modes");
    let psk = dir.join("keys.psk");
    {
        let s = Server::start(&dir, &["--tls", "on", "--tls-psk", "keys.psk"]);
        let tls = s.psk_tcp("alice", &psk);
        let t = nbdinfo_client(true, "TLS client under --tls on", &tls);
        assert!(t.contains("with TLS"), "{t}");
        let t = nbdinfo_client(true, "plain client under --tls on", &s.plain_tcp());
        assert!(t.contains("without TLS"), "{t}");
    }
    let s = Server::start(&dir, &[]);
    let tls = s.psk_tcp("alice", &psk);
    let t = nbdinfo_client(false, "TLS client under --tls off", &tls);
    assert!(t.contains("TLS is not enabled on this server"), "{t}");
    nbdinfo_client(true, "plain client under --tls off", &s.plain_tcp());
}

/// `nvwc serve ARGS` must exit non-zero before listening; returns stderr.
fn refused(dir: &Path, args: &[&str]) -> String {
    common::serve_refused(dir, args)
}

#[test]
fn public_listener_guard_and_tls_flag_errors() {
    let dir = tempdir("guard");
    // Non-loopback without --tls require: refused, nothing bound or created.
    for extra in [&[][..], &["--tls", "on", "--tls-psk", "keys.psk"][..]] {
        let mut args = vec!["--listen", "0.0.0.0:10999"];
        args.extend_from_slice(extra);
        write_key(&dir);
        let err = refused(&dir, &args);
        assert!(err.contains("refusing to listen on 0.0.0.0:10999"), "{err}");
        assert!(err.contains("--allow-insecure-tcp"), "{err}");
        assert!(
            !dir.join("nvwc-data").exists(),
            "the guard ran after files were made"
        );
    }
    // --allow-insecure-tcp (or --tls require) passes the guard: these stop
    // at a later check instead, so nothing binds a public address.
    let err = refused(
        &dir,
        &[
            "--listen",
            "0.0.0.0:10999",
            "--allow-insecure-tcp",
            "--block-size",
            "3",
        ],
    );
    assert!(err.contains("--block-size must be"), "{err}");
    let err = refused(&dir, &["--listen", "[::]:10999", "--tls", "require"]);
    assert!(err.contains("--tls require needs credentials"), "{err}");
    // Flag mistakes are named.
    let err = refused(&dir, &["--listen", "none", "--tls-psk", "keys.psk"]);
    assert!(err.contains("need --tls on or --tls require"), "{err}");
    std::fs::write(dir.join("bad.psk"), "alice:00ff\nbob:xyz\n").unwrap();
    let err = refused(
        &dir,
        &["--listen", "none", "--tls", "on", "--tls-psk", "bad.psk"],
    );
    assert!(err.contains("bad.psk: line 2"), "{err}");
    let err = refused(
        &dir,
        &["--listen", "none", "--tls", "on", "--tls-psk", "nope.psk"],
    );
    assert!(err.contains("--tls-psk: reading nope.psk"), "{err}");
    let err = refused(
        &dir,
        &[
            "--listen",
            "none",
            "--tls",
            "on",
            "--tls-psk",
            "keys.psk",
            "--tls-verify-peer",
        ],
    );
    assert!(
        err.contains("--tls-verify-peer needs --tls-certificates"),
        "{err}"
    );
    let err = refused(
        &dir,
        &[
            "--listen",
            "none",
            "--tls",
            "require",
            "--tls-certificates",
            "missing-dir",
        ],
    );
    assert!(err.contains("missing-dir/server-cert.pem"), "{err}");
}

/// `nvwc serve --config FILE` takes TLS from the file's `[tls]` table: a
/// plain client is refused, a PSK client served; a flag on the command line
/// wins over the file.
#[test]
fn config_file_tls_table_applies_and_flags_override_it() {
    require_tools!("nbdinfo");
    let dir = key_dir("cfgtls");
    std::fs::write(
        dir.join("c.toml"),
        "[tls]\nmode = \"require\"\npsk = \"keys.psk\"\n",
    )
    .unwrap();
    let s = Server::start(&dir, &["--config", "c.toml"]);
    let plain = format!("nbd+unix:///?socket={}", s.sock().display());
    let tls = format!(
        "nbds+unix://alice@/?socket={}&tls-psk-file={}",
        s.sock().display(),
        dir.join("keys.psk").display()
    );
    nbdinfo_client(false, "plain nbdinfo under [tls] mode = require", &plain);
    let t = nbdinfo_client(true, "nbdinfo with the file's PSK", &tls);
    assert!(t.contains("with TLS"), "{t}");
    drop(s);
    // `--tls on` on the command line wins over the file's `require`.
    let s = Server::start(&dir, &["--config", "c.toml", "--tls", "on"]);
    let plain = format!("nbd+unix:///?socket={}", s.sock().display());
    nbdinfo_client(true, "plain nbdinfo under --tls on", &plain);
}
