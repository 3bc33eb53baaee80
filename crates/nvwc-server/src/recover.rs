//! `nvwc recover`: a backing store made consistent on its own, after the
//! cache device is lost.

use std::fs::OpenOptions;
use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::files::file_len;
use crate::spec::is_upstream;
use crate::{bind, label, upstream};
use nvwc_dev::redo::{FileLog, Redo};

/// `nvwc recover`: make a backing store consistent on its own (after losing
/// the cache device) by finishing a journaled checkpoint its redo log holds.
#[derive(clap::Args, Debug)]
pub struct RecoverArgs {
    /// The backing store: a file (its redo log is `FILE.nvwc-redo`) or an
    /// upstream NBD server (its redo region is at the end of the export).
    #[arg(long)]
    backing: PathBuf,
}

pub fn recover(a: RecoverArgs) -> Result<std::process::ExitCode> {
    let spec = a.backing.to_string_lossy().to_string();
    let (n, found) = if is_upstream(&spec) {
        // A worker thread drives the client while this thread blocks on it
        // (`upstream::Upstream::replay`).
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let (up, n) = upstream::Upstream::open(&spec, None, rt.handle())?;
        if up.region().is_none() {
            println!(
                "nvwc recover: {spec} has no redo region (never served journaled); nothing to do"
            );
        }
        (n, rt.block_on(up.read_label())?)
    } else {
        let mut backing = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&a.backing)
            .with_context(|| format!("opening {}", a.backing.display()))?;
        let redo = PathBuf::from(format!("{}.nvwc-redo", a.backing.display()));
        let n = Redo::new(FileLog { path: redo }).replay(&backing)?;
        let len = file_len(&mut backing)?;
        let found = if backing.metadata()?.is_file() {
            label::read_file_label(&backing, len)?
        } else {
            None
        };
        (n, found)
    };
    if n > 0 {
        println!(
            "nvwc recover: finished an interrupted checkpoint ({n} writes); {spec} is consistent"
        );
    } else {
        println!("nvwc recover: no interrupted checkpoint; {spec} is consistent as it is");
    }
    // The binding is left as it is: the cache it names may not be lost after
    // all (restarting it is then safe, nothing else wrote here). A new cache
    // takes the store over, and from then on the old one is refused.
    if let Some(l) = found.filter(|l| l.cache != 0) {
        println!(
            "nvwc recover: {spec} is bound to cache {} (nvwc label {}); a new cache started over it \
             takes it over, and that cache is refused from then on",
            bind::cache_name(l.cache),
            bind::label_name(&l)
        );
    }
    Ok(std::process::ExitCode::SUCCESS)
}
