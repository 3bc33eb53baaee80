//! systemd's readiness protocol (`sd_notify(3)`) without libsystemd: one
//! datagram of `KEY=VALUE` lines to the unix socket named by
//! `$NOTIFY_SOCKET`, a path or, starting with `@`, an abstract-namespace
//! address. Without `$NOTIFY_SOCKET` (not started by systemd with
//! `Type=notify`) it does nothing.

use std::os::unix::net::UnixDatagram;

/// Send `state` (e.g. `"READY=1\nSTATUS=serving"`) to the service manager.
/// Errors are returned for the caller to log; they never stop the server.
pub fn notify(state: &str) -> std::io::Result<bool> {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let target = target.to_string_lossy().into_owned();
    let sock = UnixDatagram::unbound()?;
    if let Some(name) = target.strip_prefix('@') {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
        sock.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        sock.send_to(state.as_bytes(), &target)?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both address kinds; one test, since it sets the process's environment.
    #[test]
    fn sends_to_a_path_and_to_an_abstract_address() {
        let path = std::env::temp_dir().join(format!("nvwc-notify-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let rx = UnixDatagram::bind(&path).unwrap();
        std::env::set_var("NOTIFY_SOCKET", &path);
        assert!(notify("READY=1").unwrap());
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        let _ = std::fs::remove_file(&path);

        use std::os::linux::net::SocketAddrExt;
        let name = format!("nvwc-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let rx = UnixDatagram::bind_addr(&addr).unwrap();
        std::env::set_var("NOTIFY_SOCKET", format!("@{name}"));
        assert!(notify("STOPPING=1").unwrap());
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
        std::env::remove_var("NOTIFY_SOCKET");
        assert!(!notify("READY=1").unwrap());
    }
}
