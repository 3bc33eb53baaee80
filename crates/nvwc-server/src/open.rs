//! Opening one export ([`open_export`]): its cache device and backing store
//! bound to each other (`bind.rs`), its engine recovered or formatted, its
//! devices and host started.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use nvwc_core::layout::{self, Layout};
use nvwc_core::{Config, Engine, ReplacementKind, Watermarks, WritePolicyKind};
use nvwc_nbd::export::ExportInfo;

use crate::args::Args;
use crate::backing::{find_backing, BackingFound, Store};
use crate::device::{Backend, Device};
use crate::export::{max_request, NvwcExport, MAX_PAYLOAD};
use crate::files::{file_len, open_or_create, small_pages};
use crate::log::log;
use crate::spec::ExportSpec;
use crate::{bind, format, host, label, log, mapped};
use nvwc_dev::redo::{FileLog, Redo};

/// Open the backing store, cache and engine of one export and start its host.
///
/// Order (`docs/ON-DISK-FORMAT.md`, "Binding"): read the cache device and
/// the backing store and decide whether they belong together, writing
/// nothing; recover the engine from the cache's metadata (pure); only then
/// write: the backing store's own recovery (redo log), the label (durable),
/// the cache's format or superblock (durable). No request is served before
/// all of it, so no dirty data exists before the binding is durable.
pub(crate) fn open_export(
    e: &ExportSpec,
    a: &Args,
    rt: &tokio::runtime::Runtime,
) -> Result<Arc<NvwcExport>> {
    let bs = a.block_size;
    let wp: WritePolicyKind = e.write_policy.parse()?;
    let repl: ReplacementKind = e
        .replacement
        .parse()
        .map_err(|err| anyhow::anyhow!("replacement policy: {err}"))?;
    let cache = open_cache(e, bs, wp)?;
    let mut backing = find_backing(e, a, wp, cache.capacity, rt)?;
    let usable = backing.usable / bs * bs;
    if usable == 0 {
        bail!("backing store {} is smaller than one block", e.backing);
    }
    let cfg = engine_config(a, &cache, usable, wp, repl)?;
    // Decide, writing nothing yet.
    let (cache_uuid, plan) = decide(a, &cache, &backing)?;
    let recovered = recover_engine(&cache, &cfg)?;
    replay_backing(e, &mut backing, rt)?;
    write_label(e, &backing, &plan, rt)?;
    let (eng, superblock) = format_or_rebind(e, &cache, &cfg, cache_uuid, &plan, recovered)?;
    log_bound(e, &cache.name, &plan);
    start_export(e, cache.file, backing, eng, superblock, &cfg, rt)
}

/// The engine the server runs: it moves bytes.
type Eng = Engine<Bytes>;

/// An export's cache device as found at start, before anything is written.
struct OpenedCache {
    file: File,
    name: String,
    found: format::Found,
    /// Cache blocks (a cache of format 1 or 2 keeps its own).
    capacity: u64,
    log_pages: u32,
}

/// Open (or create) export `e`'s cache device, lock it and read what it
/// holds, writing nothing to a cache that exists.
fn open_cache(e: &ExportSpec, bs: u64, wp: WritePolicyKind) -> Result<OpenedCache> {
    let cache_name = e.cache.display().to_string();
    let (mut cache, cache_new) = open_or_create(Path::new(&e.cache), e.cache_size, true)?;
    format::lock(&cache, &e.cache)?;
    small_pages(&cache);
    let cache_len = file_len(&mut cache)?;
    let capacity = Layout::capacity_for(cache_len, bs as u32);
    if capacity == 0 {
        bail!("cache {cache_name} ({cache_len} bytes) has no room for one {bs}-byte block and its metadata");
    }
    let found = format::inspect(
        &cache,
        &e.cache,
        cache_new,
        &Layout::new(&Config::new(bs as u32, capacity, bs, wp)),
    )?;
    // A cache formatted before the metadata log (format 1 and 2) keeps its
    // geometry and commits the old way; formats 3 and later keep the log
    // size they were formatted with.
    let (capacity, log_pages) = match &found {
        format::Found::Cache(sb) if sb.log_pages == 0 => {
            log!(
                warn,
                "cache_format_without_log",
                export = &e.name,
                cache = &cache_name,
                format = sb.version,
                note = "every commit costs three device syncs on this cache; `nvwc detach` (which \
                        writes its dirty blocks back) and a restart reformat it with the \
                        single-sync metadata log"
            );
            (sb.capacity, 0)
        }
        format::Found::Cache(sb) => (capacity, sb.log_pages),
        _ => (capacity, layout::default_log_pages(capacity, bs as u32)),
    };
    Ok(OpenedCache {
        file: cache,
        name: cache_name,
        found,
        capacity,
        log_pages,
    })
}

/// The engine's configuration for a cache of `cache.capacity` blocks over
/// `usable` bytes of backing store, from the flags.
fn engine_config(
    a: &Args,
    cache: &OpenedCache,
    usable: u64,
    wp: WritePolicyKind,
    repl: ReplacementKind,
) -> Result<Config> {
    let (bs, capacity, log_pages) = (a.block_size, cache.capacity, cache.log_pages);
    let mut cfg = Config::new(bs as u32, capacity, usable, wp);
    cfg.log_pages = log_pages;
    cfg.replacement = repl;
    cfg.journal.txn_max_blocks = a.txn_blocks;
    cfg.journal.txn_max_age_ns = a.txn_age_ms * 1_000_000;
    cfg.journal.size_blocks = a.journal_size.div_ceil(bs);
    cfg.watermarks = Watermarks {
        high: a.high_watermark,
        low: a.low_watermark,
    };
    cfg.fetch = a
        .fetch
        .parse()
        .map_err(|err| anyhow::anyhow!("--fetch: {err}"))?;
    cfg.patch_mem_bytes = a.patch_mem;
    cfg.patch_direct = a.patch_direct;
    cfg.fetch_bg_inflight = a.fetch_inflight;
    cfg.rewrite_in_place = a.rewrite_in_place;
    cfg.bypass_when_full = a.bypass_when_full;
    cfg.full_clean_secs = a.full_clean_secs;
    cfg.admission = a
        .admission
        .parse()
        .map_err(|err| anyhow::anyhow!("--admission: {err}"))?;
    cfg.wal_ranges = a.wal_range.clone();
    cfg.autocommit_ns = a.commit_interval_ms.max(1) * 1_000_000;
    cfg.log_inline_bytes = a.log_inline_bytes;
    cfg.autocommit_changes = a
        .commit_changes
        .unwrap_or(capacity.clamp(4096, u64::from(u32::MAX)) as u32)
        .max(1);
    cfg.validate()?;
    if wp == WritePolicyKind::JournaledHints && cfg.admission != nvwc_core::AdmissionKind::All {
        // Each write admission sends around the cache reaches the backing
        // store as it completes, between FLUSHes (ARCHITECTURE.md,
        // "Admission and bypass").
        log!(
            warn,
            "admission",
            policy = "journaled-hints",
            admission = a.admission.as_str(),
            note = "writes sent around the cache reach the backing store between FLUSHes: without the cache it is point-in-time consistent, not always at a FLUSH"
        );
    }
    Ok(cfg)
}

/// Whether the cache and the backing store belong together
/// (`bind::decide`), writing nothing: the cache's uuid and the plan. A
/// refusal leaves no trace of a backing file this start created.
fn decide(a: &Args, cache: &OpenedCache, backing: &BackingFound) -> Result<(u64, bind::Plan)> {
    let (found, cache_name) = (&cache.found, &cache.name);
    let cache_uuid = match found {
        format::Found::Blank => label::new_cache_uuid().context("choosing a cache uuid")?,
        format::Found::Empty(sb) | format::Found::Cache(sb) => sb.uuid,
    };
    let side = match found {
        format::Found::Cache(sb) => bind::Cache::Existing(sb),
        _ => bind::Cache::Fresh { uuid: cache_uuid },
    };
    let mut uuid_err = None;
    let decided = bind::decide(
        cache_name,
        side,
        &backing.given,
        a.force_attach,
        &mut || {
            label::new_uuid().unwrap_or_else(|err| {
                uuid_err = Some(err);
                [0; 16]
            })
        },
    );
    if let Some(err) = uuid_err {
        return Err(err).context("choosing a label uuid");
    }
    let plan = match decided {
        Ok(p) => p,
        Err(mut err) => {
            if let (
                bind::BindError::Mismatch { dirty, .. } | bind::BindError::Stale { dirty, .. },
                format::Found::Cache(sb),
            ) = (&mut err, found)
            {
                *dirty = bind::dirty_note(format::dirty_blocks(&cache.file, sb));
            }
            if let Some(p) = &backing.created {
                // Created by this start (a mistyped path?): leave no trace.
                let _ = std::fs::remove_file(p);
            }
            return Err(err.into());
        }
    };
    Ok((cache_uuid, plan))
}

/// Recover the engine from the cache's metadata, if it holds any.
fn recover_engine(
    cache: &OpenedCache,
    cfg: &Config,
) -> Result<Option<(Eng, nvwc_core::RecoveryReport)>> {
    // Recover before any other write, so that a cache this configuration
    // cannot open is refused untouched. Recovery writes only once it has
    // succeeded: the bytes of unsealed inline log records into the slots
    // they name (what the log says those slots hold, so harmless even if a
    // later step refuses the cache).
    let (found, cache_name) = (&cache.found, &cache.name);
    let l = Layout::new(cfg);
    let recovered = match found {
        format::Found::Cache(_) => {
            let image = format::read_image(&cache.file, &l)
                .with_context(|| format!("reading the cache device {cache_name}"))?;
            let (eng, rep) = Engine::recover(
                cfg.clone(),
                &image,
                &mut format::data_crc(&cache.file),
                &mut format::repair(&cache.file),
            )
            .with_context(|| format!("recovering the cache device {cache_name}"))?;
            Some((eng, rep))
        }
        _ => None,
    };
    Ok(recovered)
}

/// The backing store's own recovery: a checkpoint its redo log holds.
fn replay_backing(
    e: &ExportSpec,
    backing: &mut BackingFound,
    rt: &tokio::runtime::Runtime,
) -> Result<()> {
    // The backing store's own recovery: a checkpoint its redo log holds.
    let replayed = match &mut backing.store {
        Store::File { file, redo, .. } => {
            Redo::new(FileLog { path: redo.clone() }).replay(&*file)?
        }
        Store::Nbd { up, want_region } => {
            if let Some(w) = *want_region {
                rt.block_on(up.ensure_region(w))
                    .with_context(|| format!("creating the redo region on {}", e.backing))?;
            }
            up.replay(rt.handle())?
        }
    };
    if replayed > 0 {
        log!(
            info,
            "redo_replayed",
            export = &e.name,
            backing = &e.backing,
            writes = replayed
        );
    }
    if let Store::Nbd { up, .. } = &backing.store {
        if let Some(r) = up.region() {
            log!(
                info,
                "redo_region",
                export = &e.name,
                start = r.start,
                log_bytes = r.log_len
            );
        }
    }
    Ok(())
}

/// The label, durable before the superblock names it.
fn write_label(
    e: &ExportSpec,
    backing: &BackingFound,
    plan: &bind::Plan,
    rt: &tokio::runtime::Runtime,
) -> Result<()> {
    // The label, durable before the superblock names it.
    if let Some((uuid, c)) = plan.label {
        match &backing.store {
            Store::File { file, data_len, .. } => {
                let l = label::Label {
                    uuid,
                    cache: c,
                    data_len: *data_len,
                    offset: label::file_label_offset(*data_len),
                };
                label::write_file_label(file, &l, backing.given.label.is_none())
                    .with_context(|| format!("writing the nvwc label on {}", e.backing))?;
            }
            Store::Nbd { up, .. } => {
                let l = up
                    .label_for(uuid, c)
                    .context("an upstream label needs a redo region")?;
                rt.block_on(up.write_label(&l))
                    .with_context(|| format!("writing the nvwc label on {}", e.backing))?;
            }
        }
    }
    Ok(())
}

/// The cache: formatted, or its superblock rewritten, with the binding.
/// Returns its engine and superblock.
fn format_or_rebind(
    e: &ExportSpec,
    cache: &OpenedCache,
    cfg: &Config,
    cache_uuid: u64,
    plan: &bind::Plan,
    recovered: Option<(Eng, nvwc_core::RecoveryReport)>,
) -> Result<(Eng, layout::Superblock)> {
    // The cache: formatted, or its superblock rewritten, with the binding.
    let cache_name = &cache.name;
    let bound = Some(plan.id.clone());
    let (eng, superblock) = match (recovered, &cache.found) {
        (Some((eng, rep)), format::Found::Cache(sb)) => {
            let mut sb = sb.clone();
            if sb.backing != bound {
                sb.backing = bound;
                format::write_superblock(&cache.file, &sb)
                    .with_context(|| format!("writing the superblock of {cache_name}"))?;
            }
            log!(
                info,
                "recovered",
                export = &e.name,
                commit = rep.commit,
                clean_shutdown = rep.clean_shutdown,
                dirty = rep.dirty_versions,
                clean = rep.clean_versions,
                discarded = rep.discarded,
                log_records = rep.log_records,
                log_dropped = rep.log_dropped,
                inline_repairs = rep.inline_repairs
            );
            (eng, sb)
        }
        (_, found) => {
            let mut sb = layout::Superblock::for_config(cfg, cache_uuid);
            sb.backing = bound;
            format::format(&cache.file, cfg, &sb)
                .with_context(|| format!("formatting the cache device {cache_name}"))?;
            log!(
                info,
                "formatted",
                export = &e.name,
                capacity_blocks = cfg.capacity_blocks,
                block_size = cfg.block_size,
                emptied_before = matches!(found, format::Found::Empty(_))
            );
            (Engine::new(cfg.clone())?, sb)
        }
    };
    Ok((eng, superblock))
}

/// Log how the cache was bound (`bound`), unless nothing changed.
fn log_bound(e: &ExportSpec, cache_name: &str, plan: &bind::Plan) {
    use bind::Reason;
    let (level, how, detail) = match &plan.reason {
        Reason::Same => (None, "", String::new()),
        Reason::Fresh => (Some(log::Level::Info), "fresh", String::new()),
        Reason::Labelled => (Some(log::Level::Info), "labelled", String::new()),
        Reason::Reclaimed => (Some(log::Level::Info), "reclaimed", String::new()),
        Reason::Moved { from } => (Some(log::Level::Info), "moved", format!("was at {from}")),
        Reason::Adopted => (
            Some(log::Level::Warn),
            "adopted",
            "the cache was formatted before binding existed and is bound to this backing store from now on".to_string(),
        ),
        Reason::TookOver { from } => (
            Some(log::Level::Warn),
            "took-over",
            format!(
                "the backing store was bound to cache {}, which is refused from now on",
                bind::cache_name(*from)
            ),
        ),
        Reason::Forced { was } => (
            Some(log::Level::Warn),
            "force-attach",
            format!("the cache was bound to {was}"),
        ),
    };
    if let Some(level) = level {
        log::emit(
            level,
            "bound",
            &[
                ("export", log::V::from(e.name.as_str())),
                ("cache", log::V::from(cache_name)),
                ("how", log::V::from(how)),
                ("backing", log::V::from(plan.id.to_string())),
                ("detail", log::V::from(detail)),
            ],
        );
    }
}

/// Start export `e`'s devices and host over the bound cache and backing store.
fn start_export(
    e: &ExportSpec,
    cache: File,
    backing: BackingFound,
    eng: Eng,
    superblock: layout::Superblock,
    cfg: &Config,
    rt: &tokio::runtime::Runtime,
) -> Result<Arc<NvwcExport>> {
    let upstream = matches!(backing.store, Store::Nbd { .. });
    let (bs, wp) = (u64::from(cfg.block_size), cfg.write_policy);
    let meta = cache.try_clone()?;
    let split_blocks =
        max_request(cfg.capacity_blocks, bs, upstream, wp).min(eng.max_write_bytes()) / bs;
    let (cache_dev, backing_dev) = devices(e, cache, backing, rt)?;
    // An upstream NBD server serves many requests at once; each pool thread
    // waits for one, so give it more threads than a local file needs.
    let host = host::Host::start(
        eng,
        cache_dev,
        backing_dev,
        2,
        if upstream { 64 } else { 4 },
        &e.name,
    );
    log!(
        info,
        "export",
        export = &e.name,
        backing = &e.backing,
        cache = e.cache.display().to_string(),
        size = cfg.backing_size,
        cache_blocks = cfg.capacity_blocks,
        block_size = bs,
        write_policy = wp.to_string(),
        replacement = &e.replacement,
        read_only = e.read_only,
    );
    Ok(Arc::new(NvwcExport {
        host,
        info: export_info(e, cfg),
        block: bs,
        split_blocks,
        lat: Default::default(),
        critical: e.critical.into(),
        hints: Mutex::default(),
        hinted: AtomicU64::new(0),
        cache_path: e.cache.clone(),
        cache_meta: meta,
        superblock,
    }))
}

/// The cache and backing devices of export `e`, each with its fault layer
/// (`fault.rs`, from the environment); the cache file mapped if it can be.
fn devices(
    e: &ExportSpec,
    cache: File,
    backing: BackingFound,
    rt: &tokio::runtime::Runtime,
) -> Result<(Arc<Device>, Arc<Device>)> {
    let backend = match backing.store {
        Store::File { file, redo, .. } => Backend::journaled(file, redo),
        Store::Nbd { mut up, .. } => {
            let n = rt
                .block_on(up.connect_more(&e.backing, e.upstream_connections))
                .with_context(|| format!("upstream {}", e.backing))?;
            log!(
                info,
                "upstream_connections",
                export = &e.name,
                backing = &e.backing,
                connections = n,
                multi_conn = up.info().can_multi_conn(),
            );
            Backend::upstream(up, rt.handle().clone())
        }
    };
    // Block devices report size 0 in their metadata: ask the end instead.
    let cache_len = (&cache).seek(SeekFrom::End(0)).unwrap_or(0);
    let cache_fault = crate::fault::Layer::from_env(crate::fault::Role::Cache, &e.name)?;
    // Host-crash mode maps the cache private: the file keeps only what the
    // fault layer made durable.
    let map = mapped::Mapped::new(&cache, cache_len, cache_fault.volatile());
    if map.is_none() {
        log!(
            warn,
            "cache_unmapped",
            cache = e.cache.display().to_string(),
            reason = "the cache cannot be mapped; plain writes use pwrite"
        );
    }
    let cache_dev = Arc::new(Device {
        backend: Backend::File(cache),
        map,
        fault: cache_fault,
    });
    let backing_dev = Arc::new(Device {
        backend,
        map: None,
        fault: crate::fault::Layer::from_env(crate::fault::Role::Backing, &e.name)?,
    });
    Ok((cache_dev, backing_dev))
}

/// What export `e` advertises to NBD clients.
fn export_info(e: &ExportSpec, cfg: &Config) -> ExportInfo {
    let mut info = ExportInfo::new(e.name.clone(), cfg.backing_size).with_all_features();
    info.description = format!("nvwc {} cache over {}", cfg.write_policy, e.backing);
    info.read_only = e.read_only;
    info.can_fast_zero = false;
    // Truthful sizes: any byte range works (partial blocks are patched or
    // read-modify-written), whole aligned blocks avoid that, and every
    // request up to MAX_PAYLOAD is taken, split if the cache is small.
    info.min_block = 1;
    info.pref_block = cfg.block_size;
    info.max_block = MAX_PAYLOAD;
    info
}
