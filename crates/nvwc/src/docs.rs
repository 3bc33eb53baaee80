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
    clap_mangen::Man::new(cmd.clone().name(name.clone()).bin_name(bin.clone())).render(&mut buf)?;
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
