//! Engine configuration: the boundary where policies are enums.

use std::fmt;
use std::str::FromStr;

pub use nvwc_replacement::Watermarks;
pub use nvwc_replacement::{KneeSource, ReplacementKind};

/// For an enum whose values have command-line names: `ALL` (every value, in
/// display order), `name`, `Display`, and `FromStr` by name (else `$err`).
macro_rules! cli_names {
    ($ty:ident, $err:ident { $($v:ident => $name:literal,)* }) => {
        impl $ty {
            /// Every value, in display order.
            pub const ALL: [$ty; [$($name),*].len()] = [$($ty::$v),*];
            /// The command-line name.
            pub fn name(self) -> &'static str {
                match self {
                    $($ty::$v => $name,)*
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        impl FromStr for $ty {
            type Err = $err;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $ty::ALL
                    .iter()
                    .copied()
                    .find(|m| m.name() == s)
                    .ok_or_else(|| $err(s.to_string()))
            }
        }
    };
}

/// The write policy (see `docs/ARCHITECTURE.md`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum WritePolicyKind {
    /// Backing written before the reply; the cache holds clean copies.
    WriteThrough,
    /// Writes land in the cache; dirty blocks are destaged in any order.
    WriteBack,
    /// Write-back destaged in completion→issue order (write-policy paper §3.1).
    Ordered,
    /// Write-back in transactions checkpointed atomically (§3.2), closed by size or age.
    Journaled,
    /// Journaled with transactions closed only at consistency points (FLUSH / checkpoint).
    JournaledHints,
}

impl WritePolicyKind {
    /// Every policy, in display order.
    pub const ALL: [WritePolicyKind; 5] = [
        WritePolicyKind::WriteThrough,
        WritePolicyKind::WriteBack,
        WritePolicyKind::Ordered,
        WritePolicyKind::Journaled,
        WritePolicyKind::JournaledHints,
    ];
    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            WritePolicyKind::WriteThrough => "write-through",
            WritePolicyKind::WriteBack => "write-back",
            WritePolicyKind::Ordered => "ordered",
            WritePolicyKind::Journaled => "journaled",
            WritePolicyKind::JournaledHints => "journaled-hints",
        }
    }
    /// `journaled` or `journaled-hints`.
    pub fn journaled(self) -> bool {
        matches!(
            self,
            WritePolicyKind::Journaled | WritePolicyKind::JournaledHints
        )
    }
    /// Numeric code stored in the superblock.
    pub fn code(self) -> u32 {
        match self {
            WritePolicyKind::WriteThrough => 1,
            WritePolicyKind::WriteBack => 2,
            WritePolicyKind::Ordered => 3,
            WritePolicyKind::Journaled => 4,
            WritePolicyKind::JournaledHints => 5,
        }
    }
    /// Inverse of [`WritePolicyKind::code`].
    pub fn from_code(c: u32) -> Option<Self> {
        Self::ALL.iter().copied().find(|k| k.code() == c)
    }
    /// Is this one of the journaled policies?
    pub fn is_journaled(self) -> bool {
        matches!(
            self,
            WritePolicyKind::Journaled | WritePolicyKind::JournaledHints
        )
    }
}

impl fmt::Display for WritePolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Error parsing a policy name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown write policy {0:?} (expected write-through, write-back, ordered, journaled or journaled-hints)")]
pub struct UnknownPolicy(pub String);

impl FromStr for WritePolicyKind {
    type Err = UnknownPolicy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "write-through" | "wt" => Ok(WritePolicyKind::WriteThrough),
            "write-back" | "wb" => Ok(WritePolicyKind::WriteBack),
            "ordered" | "wb-o" => Ok(WritePolicyKind::Ordered),
            "journaled" | "wb-j" => Ok(WritePolicyKind::Journaled),
            "journaled-hints" | "wb-jh" => Ok(WritePolicyKind::JournaledHints),
            _ => Err(UnknownPolicy(s.to_string())),
        }
    }
}

/// Journaled write-back settings (§3.2, §3.2.3).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct JournalConfig {
    /// Close the current transaction when it holds this many blocks.
    pub txn_max_blocks: u32,
    /// Close the current transaction when it is this old (ns); 0 = never by age.
    pub txn_max_age_ns: u64,
    /// Wait at least this long after a transaction commits before checkpointing it (ns).
    /// 0 checkpoints eagerly. Larger values trade backing staleness for coalescing:
    /// consecutive committed transactions are merged into one atomic group.
    pub checkpoint_delay_ns: u64,
    /// At most this many committed transactions are merged into one checkpoint group.
    pub checkpoint_merge_max: u32,
    /// The journal's size in blocks (§5.3.2, the allowable staleness): at
    /// most this many versions are written to the cache and not yet
    /// checkpointed (dirty, being written, or reserved by an admitted
    /// write). A write that would grow the journal past it waits until a
    /// checkpoint makes room, and while one waits, committed transactions
    /// are checkpointed without `checkpoint_delay_ns` and the open one is
    /// closed if nothing else can be. 0: no bound but the cache's. A single
    /// write larger than the bound is admitted alone into an empty journal.
    pub size_blocks: u64,
}

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig {
            txn_max_blocks: 1024,
            txn_max_age_ns: 1_000_000_000,
            checkpoint_delay_ns: 0,
            checkpoint_merge_max: 1,
            size_blocks: 0,
        }
    }
}

/// How a partial write to a block that is not cached gets the rest of the
/// block (non-blocking-writes paper §4). See `docs/ARCHITECTURE.md`, "Patches".
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum FetchMode {
    /// Fetch-before-write: the writer waits for the backing read (the baseline).
    #[default]
    Blocking,
    /// The write becomes a patch and is acknowledged; the fetch is issued at once.
    Async,
    /// Like `Async`, but fetches are queued to a background worker with a
    /// bounded number in flight (`Config::fetch_bg_inflight`).
    AsyncBg,
    /// The write becomes a patch; a fetch happens only when something needs
    /// the whole block (a read not covered by patches, a FLUSH, memory pressure).
    Lazy,
}

cli_names!(FetchMode, UnknownFetchMode {
    Blocking => "blocking",
    Async => "async",
    AsyncBg => "async-bg",
    Lazy => "lazy",
});

/// Error parsing a fetch mode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown fetch mode {0:?} (expected blocking, async, async-bg or lazy)")]
pub struct UnknownFetchMode(pub String);

/// Admission policy: which writes are cached (see [`crate::admission`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AdmissionKind {
    /// Cache every write.
    #[default]
    All,
    /// FUA writes and writes tagged sync.
    Sync,
    /// Writes to declared log ranges.
    Wal,
    /// Writes tagged critical.
    Critical,
    /// `Critical` with process criticality inheritance (in the driver).
    CriticalPi,
    /// `CriticalPi` plus I/O criticality inheritance (reissue to the cache).
    CriticalPiIoi,
}

cli_names!(AdmissionKind, UnknownAdmission {
    All => "all",
    Sync => "sync",
    Wal => "wal",
    Critical => "critical",
    CriticalPi => "critical+pi",
    CriticalPiIoi => "critical+pi+ioi",
});

/// Error parsing an admission policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown admission policy {0:?} (expected all, sync, wal, critical, critical+pi or critical+pi+ioi)")]
pub struct UnknownAdmission(pub String);

/// Error in a configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("block size {0} must be a power of two between 512 B and 1 MiB")]
    BlockSize(u32),
    #[error("cache capacity must be at least 16 blocks, got {0}")]
    Capacity(u64),
    #[error("backing size {0} must be a positive multiple of the block size")]
    BackingSize(u64),
    #[error("watermarks must satisfy 0 <= low <= high <= 1")]
    Watermarks,
    #[error("transaction size must be at least 1 block")]
    TxnSize,
    #[error("destage limit {0} must be between 1 and 65535")]
    DestageLimit(u32),
    #[error("patch direct destage needs the write-back policy (it bypasses ordering)")]
    PatchDirect,
    #[error("background fetch limit must be at least 1")]
    FetchInflight,
}

/// Engine configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Cache block size in bytes (power of two, 512 B .. 1 MiB).
    pub block_size: u32,
    /// Number of cache data slots.
    pub capacity_blocks: u64,
    /// Metadata log size in 4 KiB pages (`docs/ON-DISK-FORMAT.md`, "The
    /// commit protocol"); 0: no log, every commit is a checkpoint (format 1
    /// and 2 caches). [`Config::new`] sets [`crate::layout::default_log_pages`].
    pub log_pages: u32,
    /// Size of the backing store in bytes.
    pub backing_size: u64,
    pub write_policy: WritePolicyKind,
    pub replacement: ReplacementKind,
    pub watermarks: Watermarks,
    pub journal: JournalConfig,
    /// Ordered write-back: insert a dummy node after this many completions; 0 disables dummies.
    pub dummy_every: u32,
    /// Ordered write-back: drop edges implied by transitivity from the completed frontier.
    pub ordered_reduction: bool,
    /// Ordered write-back: while a wave's backing FLUSH is in flight, read the
    /// next wave from the cache (its writes still wait for that FLUSH).
    pub ordered_pipeline: bool,
    /// Allocate a cache block on a read miss.
    pub read_allocate: bool,
    /// Commit metadata when uncommitted changes are this old (ns), even without a FLUSH.
    pub autocommit_ns: u64,
    /// Commit metadata when this many slot entries changed since the last commit.
    pub autocommit_changes: u32,
    /// Most data bytes a log record carries inline (format 4): a commit
    /// whose new versions hold at most this many bytes, with no in-place
    /// overwrite to make durable, writes its record with their bytes in one
    /// FUA write and no device flush. 0 (the default): never, every log
    /// commit flushes. Off by default because on this project's machine
    /// (ext4 on a virtual disk) it did not pay: fsync-bound fio at QD1 ran
    /// no faster, and 8 fsync-bound jobs ran 8 % slower (the closing note
    /// of issue 17, s20); it is for devices whose FUA writes are much
    /// cheaper than their flushes.
    pub log_inline_bytes: u64,
    /// Upper bound on destage block writes in flight.
    pub max_destage_inflight: u32,
    /// Keep this many free slots ready (evicting clean blocks ahead of need).
    pub free_reserve: u32,
    /// Delay before retrying a failed background I/O (ns).
    pub retry_ns: u64,
    /// Partial writes to uncached blocks: fetch-before-write or patches.
    pub fetch: FetchMode,
    /// Upper bound on RAM held by patches (bytes of patch data). At the limit
    /// new partial writes fall back to fetch-before-write.
    pub patch_mem_bytes: u64,
    /// Once patch data exceeds this share of `patch_mem_bytes`, the oldest
    /// patched blocks are brought up to date in the background.
    pub patch_clean_at: f64,
    /// Write-back only: a block that holds only patches is written back by
    /// writing the patches to the backing store (no fetch), instead of being
    /// fetched, patched and cached.
    pub patch_direct: bool,
    /// Write-back only: rewrite in place a dirty version that a durable commit
    /// already names, instead of writing a fresh slot (see
    /// `WritePolicy::may_overwrite_durable`). Much faster for rewritten hot
    /// blocks (no slot churn, no commit for them). The price: a cache-device
    /// write that *fails* mid-way (EIO, torn) can damage the last flushed
    /// version of that block, where out-of-place writes leave it intact.
    /// Crashes (kill -9, power loss) keep every FLUSH/FUA promise either way.
    pub rewrite_in_place: bool,
    /// `AsyncBg` (and background patch cleaning): fetches in flight at most.
    pub fetch_bg_inflight: u32,
    /// Which writes are cached; the others go straight to the backing store
    /// when the write policy allows it (see [`crate::admission`]).
    pub admission: AdmissionKind,
    /// Log byte ranges `(start, len)` for `AdmissionKind::Wal`.
    pub wal_ranges: Vec<(u64, u64)>,
    /// Write-back only: a write that would wait for cache space goes around
    /// the cache to the backing store instead, where no version of its
    /// blocks is cached (bcache's `should_writeback` bypasses writeback the
    /// same way when the cache is nearly full). As with an admission bypass,
    /// it is an ordinary backing write, made durable by the next FLUSH
    /// (which then flushes the backing store first). Off: the write waits
    /// for a slot, as the papers' write-back does.
    pub bypass_when_full: bool,
    /// Write-back with `bypass_when_full`: while writes are going around the
    /// full cache, the cleaner is paced to write the dirty blocks above the
    /// low watermark back over this many seconds (one plan at a time, at
    /// `excess / full_clean_secs` blocks per second), instead of at full
    /// speed. bcache paces its writeback the same way: the proportional term
    /// of its rate controller writes the dirty excess over
    /// `writeback_rate_p_term_inverse` seconds, 40 by default. Full speed
    /// returns once no write has gone around for [`FULL_IDLE_NS`], and
    /// whenever a writer waits for a slot, a drain runs or the engine stops.
    /// 0: never paced (the cleaner runs at full speed, as the papers' does).
    pub full_clean_secs: u32,
}

/// How long after the last write that went around a full cache the cleaner
/// stays paced (`Config::full_clean_secs`). One second: a burst that ended
/// gets full-speed cleaning back as soon as its stragglers are gone. (bcache
/// waits for 30 s with no I/O at all; nvwc watches only the writes sent
/// around the cache, which stop as soon as the cache has room again.)
pub const FULL_IDLE_NS: u64 = 1_000_000_000;

impl Config {
    /// A configuration with defaults for everything but the sizes.
    pub fn new(
        block_size: u32,
        capacity_blocks: u64,
        backing_size: u64,
        write_policy: WritePolicyKind,
    ) -> Self {
        Config {
            block_size,
            capacity_blocks,
            log_pages: crate::layout::default_log_pages(capacity_blocks, block_size),
            backing_size,
            write_policy,
            replacement: ReplacementKind::Lru,
            watermarks: Watermarks::default(),
            journal: JournalConfig::default(),
            dummy_every: 100,
            ordered_reduction: true,
            ordered_pipeline: true,
            read_allocate: true,
            autocommit_ns: 1_000_000_000,
            autocommit_changes: 4096,
            log_inline_bytes: 0,
            max_destage_inflight: 256,
            free_reserve: 8,
            retry_ns: 10_000_000,
            fetch: FetchMode::Blocking,
            patch_mem_bytes: 64 << 20,
            patch_clean_at: 0.5,
            patch_direct: false,
            rewrite_in_place: false,
            fetch_bg_inflight: 16,
            admission: AdmissionKind::All,
            wal_ranges: Vec::new(),
            bypass_when_full: false,
            full_clean_secs: 0,
        }
    }

    /// Check the configuration. Every engine constructor calls this.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bs = self.block_size;
        if !(512..=1 << 20).contains(&bs) || !bs.is_power_of_two() {
            return Err(ConfigError::BlockSize(bs));
        }
        if self.capacity_blocks < 16 || self.capacity_blocks > u32::MAX as u64 / 2 {
            return Err(ConfigError::Capacity(self.capacity_blocks));
        }
        if self.backing_size == 0 || !self.backing_size.is_multiple_of(self.block_size as u64) {
            return Err(ConfigError::BackingSize(self.backing_size));
        }
        let w = self.watermarks;
        if !(0.0..=1.0).contains(&w.low) || !(0.0..=1.0).contains(&w.high) || w.low > w.high {
            return Err(ConfigError::Watermarks);
        }
        if self.journal.txn_max_blocks == 0 || self.journal.checkpoint_merge_max == 0 {
            return Err(ConfigError::TxnSize);
        }
        if self.max_destage_inflight == 0 || self.max_destage_inflight > u16::MAX as u32 {
            return Err(ConfigError::DestageLimit(self.max_destage_inflight));
        }
        if self.patch_direct && self.write_policy != WritePolicyKind::WriteBack {
            return Err(ConfigError::PatchDirect);
        }
        if self.fetch_bg_inflight == 0 {
            return Err(ConfigError::FetchInflight);
        }
        if !(0.0..=1.0).contains(&self.patch_clean_at) {
            return Err(ConfigError::Watermarks);
        }
        Ok(())
    }

    /// Number of cache blocks covering the backing store.
    pub fn backing_blocks(&self) -> u64 {
        self.backing_size.div_ceil(self.block_size as u64)
    }
}
