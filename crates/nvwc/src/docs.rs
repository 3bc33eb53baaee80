//! Man pages (`nvwc man`, hidden: writes `docs/man/`) and shell completions
//! (`nvwc completions SHELL`), both generated from the command-line definition.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Command;

/// `nvwc man`: write a man page for `nvwc` and every subcommand.
#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// Directory for the pages (`nvwc.1`, `nvwc-serve.1`, ...).
    #[arg(long, default_value = "docs/man")]
    out: PathBuf,
}

/// `nvwc completions SHELL`.
#[derive(clap::Args, Debug)]
pub struct CompletionArgs {
    /// bash, zsh, fish, elvish or powershell.
    shell: clap_complete::Shell,
}

/// Every page: (file name, roff text), for `cmd` and its visible
/// subcommands, nested ones as `nvwc-trace-convert.1`.
pub fn man_pages(mut cmd: Command) -> Result<Vec<(String, Vec<u8>)>> {
    cmd.build();
    let mut out = Vec::new();
    let name = cmd.get_name().to_string();
    add_pages(&cmd, name.clone(), name, &mut out)?;
    Ok(out)
}

/// `name`: the page's (`nvwc-trace-convert`); `bin`: how it is invoked
/// (`nvwc trace convert`).
fn add_pages(
    cmd: &Command,
    name: String,
    bin: String,
    out: &mut Vec<(String, Vec<u8>)>,
) -> Result<()> {
    let mut buf = Vec::new();
    clap_mangen::Man::new(cmd.clone().name(name.clone()).bin_name(bin.clone()))
        .source(format!("nvwc {}", env!("CARGO_PKG_VERSION")))
        .manual("nvwc manual")
        .render(&mut buf)?;
    if name == "nvwc-serve" {
        buf.extend_from_slice(SERVE_EXTRA.as_bytes());
    }
    out.push((format!("{name}.1"), buf));
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        if sub.get_name() == "help" {
            continue;
        }
        let n = sub.get_name();
        add_pages(sub, format!("{name}-{n}"), format!("{bin} {n}"), out)?;
    }
    Ok(())
}

/// What `nvwc serve`'s flags do not say: the configuration file and signals.
const SERVE_EXTRA: &str = r#".SH CONFIGURATION FILE
\fB\-\-config\fR FILE reads a TOML file whose keys are the flags above, in
tables: [server], [log], [metrics], [tls], [cache], [defaults] (what every
export inherits), [policy] and one [[export]] table per export. Flags given on
the command line override the file. Unknown keys are errors.
\fBnvwc check\-config\fR FILE checks a file and names the line and column of
every error. contrib/nvwc.example.toml in the source shows every key.
.SH SIGNALS
.TP
SIGTERM, SIGINT
Stop cleanly: requests in flight finish and every export's metadata is
committed. Dirty data stays in the cache (\fBnvwc detach\fR writes it back).
.TP
SIGHUP
Re\-read the \fB\-\-config\fR file: the log level and format and the
exports' critical hints change at once, and a new [[export]] is opened and
served (export_added; refused with export_add_failed if it shares a file
with a served export); every other change, a removed export too, is logged
(reload_needs_restart) and takes effect at the next start.
.SH SYSTEMD
With $NOTIFY_SOCKET set (Type=notify), the server sends READY=1 once it serves,
RELOADING=1 and READY=1 around a reload, and STOPPING=1 when it stops.
contrib/systemd/nvwc.service in the source is a hardened unit.
.SH SEE ALSO
\fBnvwc\fR(1), \fBnvwc\-status\fR(1), \fBnvwc\-check\-config\fR(1), \fBnvwc\-detach\fR(1)
"#;

pub fn write_man(cmd: Command, a: ManArgs) -> Result<std::process::ExitCode> {
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let pages = man_pages(cmd)?;
    for (name, text) in &pages {
        let p = a.out.join(name);
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
    }
    println!("nvwc man: {} pages in {}", pages.len(), a.out.display());
    Ok(std::process::ExitCode::SUCCESS)
}

pub fn completions(mut cmd: Command, a: CompletionArgs) -> Result<std::process::ExitCode> {
    use std::io::Write;
    let mut buf = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "nvwc", &mut buf);
    match std::io::stdout().write_all(&buf) {
        // `nvwc completions bash | head` is fine.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(std::process::ExitCode::SUCCESS),
    }
}
