//! The cache device before the engine opens it: what it holds (blank, an
//! emptied cache, a cache, or something else), formatting and binding
//! writes, and `nvwc format`.
//!
//! A device is formatted without being asked only when it is *blank*: its
//! metadata region (superblock, both commit records, slot table) holds
//! nothing but zeroes and, at most, the empty commit record of a format
//! that did not finish. A device whose superblock fails its magic or CRC
//! and is not blank may be a damaged cache still holding dirty data, or
//! somebody's file given as `--cache` by mistake: it is refused, and
//! `nvwc format --force` is the explicit way to start over.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use nvwc_core::layout::{self, CommitRecord, FormatError, Layout, Superblock, SB_EMPTY};
use nvwc_core::{CacheImage, Config, Engine, WritePolicyKind};

use crate::bind::BindError;

/// What a cache device holds.
pub enum Found {
    /// Never formatted (a new file, a zeroed one, a format that did not
    /// finish): formatted at this start.
    Blank,
    /// Emptied (`nvwc detach`, `nvwc format --force`): holds nothing a
    /// backing store needs; formatted afresh, keeping its uuid.
    Empty(Superblock),
    /// A cache that may hold data.
    Cache(Superblock),
}

/// Why a superblock does not decode, in words.
fn what(e: &FormatError) -> String {
    match e {
        FormatError::NotNvwc => "it has no nvwc superblock (bad magic)".into(),
        FormatError::Checksum(_) => "its superblock is damaged (checksum mismatch)".into(),
        FormatError::Short => "it is too short for a superblock".into(),
        e => format!("its superblock cannot be used ({e})"),
    }
}

/// Classify the cache device. `created`: the file was created by this
/// start. `l`: the geometry this start would format (bounds the blank check).
pub fn inspect(cache: &File, path: &Path, created: bool, l: &Layout) -> Result<Found> {
    if created {
        return Ok(Found::Blank);
    }
    let name = path.display().to_string();
    let mut b = vec![0u8; 512];
    let got = read_some(cache, &mut b, 0)?;
    match Superblock::decode(&b[..got]) {
        Ok(sb) if sb.empty() => Ok(Found::Empty(sb)),
        Ok(sb) => Ok(Found::Cache(sb)),
        Err(FormatError::Version(version)) => Err(BindError::Newer {
            cache: name,
            version,
            min: layout::FORMAT_VERSION_MIN,
            max: layout::FORMAT_VERSION,
        }
        .into()),
        Err(e) => {
            if blank(cache, l).with_context(|| format!("reading {name}"))? {
                Ok(Found::Blank)
            } else {
                Err(BindError::Damaged {
                    cache: name,
                    what: what(&e),
                }
                .into())
            }
        }
    }
}

/// Read up to `b.len()` bytes at `off`; fewer at the end of the file.
fn read_some(f: &File, b: &mut [u8], off: u64) -> std::io::Result<usize> {
    let mut got = 0;
    while got < b.len() {
        match f.read_at(&mut b[got..], off + got as u64)? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

/// The metadata region of geometry `l` holds nothing but zeroes, except
/// that a commit record slot may hold a valid commit 0 (written by a format
/// whose superblock never became durable; it names no data).
fn blank(cache: &File, l: &Layout) -> std::io::Result<bool> {
    let zero = |b: &[u8]| b.iter().all(|&x| x == 0);
    let mut head = vec![0u8; layout::TABLE_OFFSET as usize];
    let got = read_some(cache, &mut head, 0)?;
    head.truncate(got);
    if !zero(&head[..head.len().min(4096)]) {
        return Ok(false);
    }
    for which in 0..2 {
        let at = l.commit_offset(which) as usize;
        let Some(region) = head.get(at..(at + 4096).min(head.len())) else {
            continue;
        };
        let empty_commit = region.len() >= 512
            && CommitRecord::decode(&region[..512]).is_some_and(|c| c.commit == 0)
            && zero(&region[512..]);
        if !zero(region) && !empty_commit {
            return Ok(false);
        }
    }
    let mut buf = vec![0u8; 1 << 20];
    let mut off = layout::TABLE_OFFSET;
    while off < l.data_offset {
        let n = ((l.data_offset - off) as usize).min(buf.len());
        let got = read_some(cache, &mut buf[..n], off)?;
        if !zero(&buf[..got]) {
            return Ok(false);
        }
        if got < n {
            break;
        }
        off += n as u64;
    }
    Ok(true)
}

/// The metadata regions recovery reads.
pub fn read_image(cache: &File, l: &Layout) -> std::io::Result<CacheImage> {
    let read = |off: u64, len: u64| -> std::io::Result<Vec<u8>> {
        let mut b = vec![0u8; len as usize];
        cache.read_exact_at(&mut b, off)?;
        Ok(b)
    };
    Ok(CacheImage {
        superblock: read(0, 512)?,
        commit_a: read(l.commit_offset(0), 512)?,
        commit_b: read(l.commit_offset(1), 512)?,
        table: read(layout::TABLE_OFFSET, l.table_bytes)?,
        log: read(l.log_offset, l.log_bytes)?,
    })
}

/// Recovery's data checksums (`Engine::recover`), read from the cache file.
pub fn data_crc(cache: &File) -> impl FnMut(u64, u32) -> Result<u32, String> + '_ {
    move |off, len| {
        let mut b = vec![0u8; len as usize];
        cache
            .read_exact_at(&mut b, off)
            .map_err(|e| format!("at byte {off}: {e}"))?;
        Ok(layout::data_crc(&b))
    }
}

/// Recovery's repairs (`Engine::recover`): bytes written into the cache
/// file, not flushed (the first commit after recovery is a checkpoint,
/// which flushes them before the log that names them is retired).
pub fn repair(cache: &File) -> impl FnMut(u64, &[u8]) -> Result<(), String> + '_ {
    move |off, b| {
        cache
            .write_all_at(b, off)
            .map_err(|e| format!("at byte {off}: {e}"))
    }
}

/// The configuration a superblock describes (for counting its dirty blocks).
fn config_of(sb: &Superblock) -> Option<Config> {
    let wp = WritePolicyKind::from_code(sb.write_policy)?;
    let mut cfg = Config::new(sb.block_size, sb.capacity, sb.backing_size, wp);
    cfg.log_pages = sb.log_pages;
    cfg.validate().ok()?;
    Some(cfg)
}

/// How many dirty blocks the cache recovers to, read with its own geometry.
pub fn dirty_blocks(cache: &File, sb: &Superblock) -> Option<u64> {
    let cfg = config_of(sb)?;
    let image = read_image(cache, &Layout::new(&cfg)).ok()?;
    // Counting only: what recovery would write into slots (inline log
    // records' versions) changes no entry, so it is left unwritten.
    let (eng, _) =
        Engine::<Bytes>::recover(cfg, &image, &mut data_crc(cache), &mut |_, _| Ok(())).ok()?;
    Some(eng.stats().dirty_blocks)
}

/// Format the device for `cfg` with superblock `sb`: everything else first,
/// a device flush, then the superblock, a flush. Until the superblock is
/// durable the device stays blank (see [`inspect`]), so a crash mid-format
/// only means formatting again.
pub fn format(cache: &File, cfg: &Config, sb: &Superblock) -> std::io::Result<()> {
    for (off, b) in layout::format_writes(cfg, sb.uuid) {
        if off != 0 {
            cache.write_all_at(&b, off)?;
        }
    }
    cache.sync_data()?;
    write_superblock(cache, sb)
}

/// Rewrite the superblock (one 512-byte sector) and make it durable.
pub fn write_superblock(cache: &File, sb: &Superblock) -> std::io::Result<()> {
    cache.write_all_at(&sb.encode(), 0)?;
    cache.sync_data()
}

/// Take the cache file for this process: two servers (or a server and
/// `nvwc format`) on one cache would destroy it.
pub fn lock(cache: &File, path: &Path) -> Result<()> {
    use rustix::fs::{flock, FlockOperation};
    match flock(cache, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(()),
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => bail!(
            "cache {} is in use by another nvwc process (a running server?)",
            path.display()
        ),
        // A file system without locks: nothing to take.
        Err(_) => Ok(()),
    }
}

/// `nvwc format`: start a cache device over.
#[derive(clap::Args, Debug)]
pub struct FormatArgs {
    /// The cache device (file or block device).
    #[arg(long, default_value = "nvwc-data/cache.img")]
    cache: PathBuf,
    /// Erase it whatever it holds: a cache's dirty blocks are lost, and
    /// something that is not a cache is overwritten at its start.
    #[arg(long)]
    force: bool,
}

/// What a device holds, in words, for `nvwc format`.
fn describe(cache: &File, sb: &Result<Superblock, FormatError>, head_zero: bool) -> String {
    match sb {
        Ok(sb) if sb.empty() => "an emptied nvwc cache: nothing in it is needed".to_string(),
        Ok(sb) => {
            let bound = match &sb.backing {
                Some(id) => format!("bound to {id}"),
                None => "formatted before binding existed".to_string(),
            };
            match dirty_blocks(cache, sb) {
                Some(n) => format!("an nvwc cache {bound}, with {n} dirty blocks"),
                None => format!("an nvwc cache {bound}"),
            }
        }
        Err(_) if head_zero => "nothing: it is blank".to_string(),
        Err(FormatError::NotNvwc) => "data that is not an nvwc cache (no nvwc superblock)".into(),
        Err(e) => format!("an nvwc cache with a damaged superblock ({e})"),
    }
}

pub fn run(a: FormatArgs) -> Result<std::process::ExitCode> {
    let name = a.cache.display().to_string();
    let cache = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&a.cache)
        .with_context(|| format!("opening {name}"))?;
    lock(&cache, &a.cache)?;
    let mut b = vec![0u8; 512];
    let got = read_some(&cache, &mut b, 0)?;
    let sb = Superblock::decode(&b[..got]);
    let head_zero = {
        let mut h = vec![0u8; layout::TABLE_OFFSET as usize];
        let got = read_some(&cache, &mut h, 0)?;
        h[..got].iter().all(|&x| x == 0)
    };
    let was = describe(&cache, &sb, head_zero);
    if !a.force {
        if sb.as_ref().is_ok_and(|s| s.empty()) || (sb.is_err() && head_zero) {
            println!(
                "nvwc format: {name} holds {was}; the next `nvwc serve` formats it for its configuration"
            );
            return Ok(std::process::ExitCode::SUCCESS);
        }
        bail!("{name} holds {was}; to erase it anyway, add --force");
    }
    let uuid = crate::label::new_cache_uuid().context("choosing a uuid")?;
    let empty = Superblock {
        version: layout::FORMAT_VERSION,
        block_size: 0,
        capacity: 0,
        backing_size: 0,
        data_offset: 0,
        write_policy: 0,
        log_pages: 0,
        uuid,
        flags: SB_EMPTY,
        backing: None,
    };
    write_superblock(&cache, &empty).with_context(|| format!("writing {name}"))?;
    println!(
        "nvwc format: erased {name}, which held {was}; the next `nvwc serve` formats it for its \
         configuration and binds it to the backing store it is given"
    );
    Ok(std::process::ExitCode::SUCCESS)
}
