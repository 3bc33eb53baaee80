//! `nvwc serve`'s flags ([`Args`]), as clap parses them and as a
//! configuration file (`config_file.rs`) fills them in; and `START:LEN`
//! byte ranges ([`parse_range`]).

use std::path::PathBuf;

pub use nvwc_core::units::parse_size;

use crate::config_file;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A configuration file (TOML; `contrib/nvwc.example.toml`): its
    /// settings and exports, under the flags given here. `SIGHUP` reloads it.
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// The configuration file as loaded (`config_file::apply`).
    #[arg(skip)]
    pub(crate) loaded: Option<config_file::Loaded>,
    /// Backing store: a file (created sparse with --size if missing) or an
    /// upstream NBD server, `nbd://host:port/name` or `nbd+unix:///name?socket=PATH`.
    #[arg(long, default_value = "nvwc-data/backing.img")]
    pub(crate) backing: PathBuf,
    /// Cache device file (created with --cache-size if missing).
    #[arg(long, default_value = "nvwc-data/cache.img")]
    pub(crate) cache: PathBuf,
    /// Size of a new backing file (e.g. 8G, 512M).
    #[arg(long, default_value = "8G", value_parser = parse_size)]
    pub(crate) size: u64,
    /// Size of a new cache file.
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub(crate) cache_size: u64,
    /// Unix socket to listen on.
    #[arg(long, default_value = "nvwc-data/nvwc.sock")]
    pub(crate) unix: PathBuf,
    /// TCP address to listen on ("none" to disable).
    #[arg(long, default_value = "127.0.0.1:10809")]
    pub(crate) listen: String,
    #[arg(long, default_value = "write-back")]
    pub(crate) write_policy: String,
    #[arg(long, default_value = "lru")]
    pub(crate) replacement: String,
    /// Cache block size.
    #[arg(long, default_value = "4K", value_parser = parse_size)]
    pub(crate) block_size: u64,
    /// Journaled: close a transaction at this many blocks.
    #[arg(long, default_value_t = 1024)]
    pub(crate) txn_blocks: u32,
    /// Journaled: close a transaction at this age.
    #[arg(long, default_value_t = 1000)]
    pub(crate) txn_age_ms: u64,
    /// Journaled: the journal's size, the most data written to the cache
    /// and not yet checkpointed to the backing store (how stale the backing
    /// store may be after losing the cache device). A write that would
    /// exceed it waits for a checkpoint. 0: bounded by the cache only.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    pub(crate) journal_size: u64,
    /// Start cleaning above this dirty fraction.
    #[arg(long, default_value_t = 0.9)]
    pub(crate) high_watermark: f64,
    /// Stop cleaning at this dirty fraction.
    #[arg(long, default_value_t = 0.5)]
    pub(crate) low_watermark: f64,
    /// Partial writes to uncached blocks: `blocking` (fetch-before-write),
    /// `async`, `async-bg` or `lazy` (non-blocking writes: the data is kept as
    /// a patch and the write acknowledged at once; see docs/ARCHITECTURE.md).
    #[arg(long, default_value = "lazy")]
    pub(crate) fetch: String,
    /// RAM for patches; at the limit partial writes fall back to blocking.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    pub(crate) patch_mem: u64,
    /// Background fetches (async-bg, and lazy's patch cleaning) in flight at
    /// most. Match it to the backing store's parallelism: below it, lazy
    /// retires patches no faster than blocking fetches. (An upstream NBD
    /// backing store is driven by 64 worker threads, a file by 4.)
    #[arg(long, default_value_t = 64)]
    pub(crate) fetch_inflight: u32,
    /// Write-back only: write a patched block back as partial writes to the
    /// backing store, with no fetch.
    #[arg(long)]
    pub(crate) patch_direct: bool,
    /// Write-back only: rewrite committed dirty blocks in place (the
    /// default), as a disk and dm-writecache do. `--rewrite-in-place=false`
    /// writes every rewrite to a fresh slot instead: slower (slot churn and
    /// commits), but a cache-device write that *fails* part-way then cannot
    /// damage the block's last flushed version. Crashes keep every FLUSH/FUA
    /// promise either way (`docs/ON-DISK-FORMAT.md`).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_value_t = true,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) rewrite_in_place: bool,
    /// Write-back only: a write that would wait for cache space goes around
    /// the cache to the backing store instead (the default), where none of
    /// its blocks is cached, as bcache bypasses writeback on a nearly full
    /// cache. It is an ordinary backing write; the next FLUSH flushes the
    /// backing store before it answers. `--bypass-when-full=false` makes it
    /// wait for a slot (destage and eviction) as the papers' write-back does.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_value_t = true,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub(crate) bypass_when_full: bool,
    /// Write-back with --bypass-when-full: while writes go around the full
    /// cache, write the dirty blocks above the low watermark back over this
    /// many seconds instead of at full speed, as bcache paces its writeback
    /// (its writeback_rate_p_term_inverse, 40 by default). Destaging to make
    /// room costs cache writes, reads and syncs that a write sent around the
    /// cache does not. Full speed returns a second after the last write
    /// went around, and whenever a write must wait for a slot. 0: never paced
    #[arg(long, value_name = "SECS", default_value_t = 40)]
    pub(crate) full_clean_secs: u32,
    /// Serve the export read-only.
    #[arg(long)]
    pub(crate) read_only: bool,
    /// Admission policy: which writes go to the cache (`all`, `sync`, `wal`,
    /// `critical`, `critical+pi`, `critical+pi+ioi`); the others go straight
    /// to the backing store with FUA when the write policy allows it.
    #[arg(long, default_value = "all")]
    pub(crate) admission: String,
    /// A write-ahead-log byte range for `--admission wal`, `START:LEN`
    /// (sizes like 0:64M); repeatable.
    #[arg(long = "wal-range", value_name = "START:LEN", value_parser = parse_range)]
    pub(crate) wal_range: Vec<(u64, u64)>,
    /// Control socket for `nvwc status`, `nvwc flush` and `nvwc detach`.
    #[arg(long, default_value = "nvwc-data/nvwc.ctl")]
    pub(crate) control: PathBuf,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9180).
    #[arg(long)]
    pub(crate) metrics: Option<String>,
    /// Another export, repeatable: `NAME=BACKING[,cache=PATH][,cache-size=SIZE]`
    /// `[,size=SIZE][,policy=P][,replacement=R][,read-only][,critical]`; or
    /// `NAME:critical` to mark an export's requests critical for admission
    /// (`:critical` for the default export). Each export has
    /// its own engine, cache and backing; unset keys come from the flags above,
    /// and the cache defaults to `cache-NAME.img` beside `--cache`. The export
    /// built from `--backing`/`--cache` answers to the empty name.
    #[arg(long = "export", value_name = "NAME=BACKING[,key=value...]")]
    pub(crate) export: Vec<String>,
    /// Serve only the `--export`s, and let this one answer to the empty name
    /// (no export is built from `--backing`/`--cache`).
    #[arg(long, value_name = "NAME")]
    pub(crate) default_export: Option<String>,
    /// Log format: `text` (key=value) or `json`; default from `NVWC_LOG`, else text.
    #[arg(long)]
    pub(crate) log_format: Option<String>,
    /// Log level: error, warn, info or debug; default from `NVWC_LOG`, else info.
    #[arg(long)]
    pub(crate) log_level: Option<String>,
    /// Journaled over an upstream NBD server: bytes reserved at the end of the
    /// upstream export for the redo log (default: what the configuration
    /// needs, at least 16M). Used only when the region is created.
    #[arg(long, value_parser = parse_size)]
    pub(crate) redo_size: Option<u64>,
    /// Connections to an upstream NBD backing store that advertises
    /// multi-conn; reads, writes and FLUSHes go to the one with the fewest
    /// requests in flight. An upstream without multi-conn gets one (a FLUSH
    /// on one connection is not known to cover another's writes).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) upstream_connections: u32,
    /// Commit cache metadata (and sync the cache device) at least this often
    /// while anything changed, even without a client FLUSH: this bounds what
    /// `kill -9` can take of writes no FLUSH covered.
    #[arg(long, default_value_t = 1000)]
    pub(crate) commit_interval_ms: u64,
    /// Bind each export's cache to the backing store given even when the
    /// cache is bound to another one (a disk moved or copied on purpose),
    /// or the store has been bound to another cache since. The cache's
    /// dirty blocks are then written to this store. Logged at warn.
    #[arg(long)]
    pub(crate) force_attach: bool,
    /// Also commit once this many cache entries changed (default: the
    /// cache's block count, at least 4096, so in practice the interval
    /// decides). FLUSH, FUA and reclaiming space commit whenever they need
    /// to. Every commit syncs the cache device and makes the next rewrite of
    /// each block go to a fresh slot, so frequent commits cost throughput.
    #[arg(long)]
    pub(crate) commit_changes: Option<u32>,
    /// Most bytes of new data a commit carries inside its log record: a
    /// FLUSH whose commit names at most this much new data (and no in-place
    /// rewrite waits for a sync) writes the record with those bytes in one
    /// FUA write and no cache-device sync, at the cost of writing the bytes
    /// twice (the slot is synced later, at a checkpoint). 0 (the default):
    /// every commit syncs the cache device. Worth trying on a cache device
    /// whose FUA writes cost much less than its syncs; on ext4 over a
    /// virtual disk it did not pay. Needs a cache formatted at format 4.
    #[arg(long, default_value_t = 0)]
    pub(crate) log_inline_bytes: u64,
    #[command(flatten)]
    pub(crate) tls: crate::tls::TlsArgs,
}

/// `nvwc serve`'s command line alone, for [`Args::parse_flags`].
#[derive(clap::Parser)]
#[command(name = "nvwc-serve")]
struct Flags {
    #[command(flatten)]
    args: Args,
}

impl Args {
    /// `flags` (without a program name) parsed as `nvwc serve`'s command
    /// line, with its defaults and checks, and `--config` applied under
    /// them: how a test or another program starts a [`crate::Server`].
    pub fn parse_flags<I, T>(flags: I) -> anyhow::Result<Args>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString>,
    {
        use clap::{CommandFactory, FromArgMatches};
        let argv = std::iter::once("nvwc-serve".into()).chain(flags.into_iter().map(Into::into));
        let m = Flags::command().try_get_matches_from(argv)?;
        let a = Flags::from_arg_matches(&m)?.args;
        config_file::with_config(a, &m)
    }
}

/// Parse a byte range `START:LEN` (sizes as in [`parse_size`]).
pub fn parse_range(s: &str) -> Result<(u64, u64), String> {
    let (a, b) = s
        .split_once(':')
        .ok_or_else(|| format!("expected START:LEN, got {s:?}"))?;
    let (start, len) = (parse_size(a)?, parse_size(b)?);
    if len == 0 {
        return Err(format!("empty range {s:?}"));
    }
    start
        .checked_add(len)
        .ok_or_else(|| format!("range {s:?} overflows"))?;
    Ok((start, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("64m"), Ok(64 << 20));
        assert_eq!(parse_size("8G"), Ok(8 << 30));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("x").is_err());
    }
}
