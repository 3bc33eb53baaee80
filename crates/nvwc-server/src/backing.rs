//! Finding an export's backing store at start, writing nothing: a file, a
//! block device or an upstream NBD server, with its identity for binding
//! (`bind.rs`) and what it needs before serving (a redo log or region).

use std::fs::{File, OpenOptions};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use nvwc_core::{Config, WritePolicyKind};

use nvwc_core::layout::{BackingId, BackingKind};

use crate::args::Args;
use crate::export::max_request;
use crate::files::{file_len, open_or_create};
use crate::spec::{is_upstream, ExportSpec};
use crate::{bind, label, upstream};

/// A backing store as found at start, before anything is written to it
/// (a missing backing file is created empty: `created`).
pub(crate) struct BackingFound {
    pub(crate) given: bind::Given,
    /// Bytes the export may use, before rounding to the block size (for an
    /// upstream that gets its redo region at this start: what lies before it).
    pub(crate) usable: u64,
    pub(crate) store: Store,
    pub(crate) created: Option<PathBuf>,
}

pub(crate) enum Store {
    /// A file or block device; `data_len`: a file's bytes before its label.
    File {
        file: File,
        redo: PathBuf,
        data_len: u64,
    },
    /// An upstream; `want_region`: journaled and no region yet (its log size).
    Nbd {
        up: upstream::Upstream,
        want_region: Option<u64>,
    },
}

/// Open the backing store of export `e` and read its identity, writing nothing.
pub(crate) fn find_backing(
    e: &ExportSpec,
    a: &Args,
    wp: WritePolicyKind,
    capacity: u64,
    rt: &tokio::runtime::Runtime,
) -> Result<BackingFound> {
    if is_upstream(&e.backing) {
        let (needed, want) = redo_sizes(a, wp, capacity)?;
        return find_upstream(e, wp, needed, want, rt);
    }
    let path = PathBuf::from(&e.backing);
    let redo = PathBuf::from(format!("{}.nvwc-redo", path.display()));
    let block = std::fs::metadata(&path).is_ok_and(|m| {
        use std::os::unix::fs::FileTypeExt;
        m.file_type().is_block_device()
    });
    if block {
        return find_block_device(path, redo);
    }
    find_file(e, path, redo)
}

/// The redo region an upstream backing store needs for this configuration:
/// `(needed, want)`, the bytes of log a journaled checkpoint group may need
/// and the region size to create (`--redo-size`, else at least 16 MiB).
fn redo_sizes(a: &Args, wp: WritePolicyKind, capacity: u64) -> Result<(u64, u64)> {
    let bs = a.block_size;
    let max_req = max_request(capacity, bs, true, wp);
    // A journaled checkpoint group holds at most `merge` transactions of
    // at most `txn_blocks` blocks plus the write that closed each one,
    // and never more blocks than the cache has.
    let txn = u64::from(a.txn_blocks).min((capacity / 4).max(1));
    let merge = u64::from(
        Config::new(bs as u32, capacity, bs, wp)
            .journal
            .checkpoint_merge_max,
    );
    let group_blocks = (merge * (txn + max_req / bs + 1)).min(capacity);
    let needed = upstream::log_bytes_needed(group_blocks * bs, group_blocks);
    let want = match a.redo_size {
        Some(r) if r < needed => bail!(
            "--redo-size {r} is below the {needed} bytes a checkpoint group of this configuration may need"
        ),
        Some(r) => r,
        None => needed.max(16 << 20),
    };
    Ok((needed, want))
}

/// An upstream NBD server as the backing store: its redo region checked
/// against (or planned for) what a journaled checkpoint group may need
/// (`needed`, `want`: [`redo_sizes`]).
fn find_upstream(
    e: &ExportSpec,
    wp: WritePolicyKind,
    needed: u64,
    want: u64,
    rt: &tokio::runtime::Runtime,
) -> Result<BackingFound> {
    let up = rt.block_on(upstream::Upstream::connect(&e.backing))?;
    if let Some(r) = up.region() {
        if wp.is_journaled() && r.log_len < needed {
            bail!(
                "the redo region on {} has {} bytes of log; this configuration may need {needed} (lower --txn-blocks)",
                e.backing,
                r.log_len
            );
        }
    }
    let want_region = (wp.is_journaled() && up.region().is_none()).then_some(want);
    let usable = match want_region {
        Some(w) => up
            .planned_start(w)
            .with_context(|| format!("upstream {}", e.backing))?,
        None => up.usable(),
    };
    let label = rt.block_on(up.read_label())?;
    let name = up.info().name.clone();
    let given = bind::Given {
        id: BackingId::new(
            BackingKind::Nbd,
            label.map_or([0; 16], |l| l.uuid),
            up.size(),
            &e.backing,
            &name,
        ),
        location: e.backing.clone(),
        name,
        label,
        can_label: up.region().is_some() || want_region.is_some(),
        aliases: Vec::new(),
    };
    Ok(BackingFound {
        given,
        usable,
        store: Store::Nbd { up, want_region },
        created: None,
    })
}

/// A block device as the backing store: it carries no label, and is known
/// by its names.
fn find_block_device(path: PathBuf, redo: PathBuf) -> Result<BackingFound> {
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    let len = file_len(&mut file)?;
    let names = bind::block_names(&path);
    let given = bind::Given {
        id: BackingId::new(BackingKind::Block, [0; 16], len, &names[0], ""),
        location: names[0].clone(),
        name: String::new(),
        label: None,
        can_label: false,
        aliases: names,
    };
    Ok(BackingFound {
        given,
        usable: len,
        store: Store::File {
            file,
            redo,
            data_len: len,
        },
        created: None,
    })
}

/// A file as the backing store (created sparse if missing), with its label.
fn find_file(e: &ExportSpec, path: PathBuf, redo: PathBuf) -> Result<BackingFound> {
    let (mut file, created) = open_or_create(&path, e.size, false)?;
    let len = file_len(&mut file)?;
    let label = label::read_file_label(&file, len)
        .with_context(|| format!("reading {}", path.display()))?;
    let data_len = label.map_or(len, |l| l.data_len);
    let shown = bind::shown_path(&path).display().to_string();
    let given = bind::Given {
        id: BackingId::new(
            BackingKind::File,
            label.map_or([0; 16], |l| l.uuid),
            data_len,
            &shown,
            "",
        ),
        location: shown,
        name: String::new(),
        label,
        can_label: true,
        aliases: Vec::new(),
    };
    Ok(BackingFound {
        given,
        usable: data_len,
        store: Store::File {
            file,
            redo,
            data_len,
        },
        created: created.then_some(path),
    })
}
