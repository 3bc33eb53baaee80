//! Engine counters.

/// Counters the engine keeps; all are monotonic except the gauges at the end.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub requests: u64,
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub trims: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Block pieces of reads served from the cache.
    pub read_hits: u64,
    pub read_misses: u64,
    /// Block pieces of writes to a block already cached.
    pub write_hits: u64,
    pub write_misses: u64,
    /// Writes that replaced a dirty version, so one destage was saved.
    pub overwrites: u64,
    /// Write requests whose payload the driver put on the cache device
    /// itself (`Engine::handle_direct_write`).
    pub direct_writes: u64,
    pub cache_reads: u64,
    pub cache_read_bytes: u64,
    pub cache_writes: u64,
    pub cache_write_bytes: u64,
    pub cache_flushes: u64,
    pub backing_reads: u64,
    pub backing_read_bytes: u64,
    pub backing_writes: u64,
    pub backing_write_bytes: u64,
    pub backing_flushes: u64,
    pub backing_groups: u64,
    /// Backing reads made to fill a partial write (fetch-before-write).
    pub fetches: u64,
    /// Read misses copied into the cache.
    pub populates: u64,
    /// Write pieces that waited for cache space (in admission, for a slot
    /// reservation, or after it, for a free slot), and the total time they
    /// waited (summed over pieces).
    pub stalled_writes: u64,
    pub stall_ns: u64,
    /// Write requests that could not be admitted on arrival (waited for space).
    pub admission_stalls: u64,
    /// Of those, the ones that waited for room in a bounded journal
    /// (`JournalConfig::size_blocks`), not for cache slots.
    pub journal_stalls: u64,
    /// Pieces (reads and writes) that waited for another piece of the same
    /// block to finish (a write in flight holds its block, under
    /// write-through until the backing store has it), and the total time
    /// they waited.
    pub block_waits: u64,
    pub block_wait_ns: u64,
    pub evictions: u64,
    pub destaged_blocks: u64,
    pub destage_plans: u64,
    pub destage_failures: u64,
    pub commits: u64,
    /// Commits that were log records (one device flush each); the rest were checkpoints.
    pub log_commits: u64,
    /// Log commits whose record carried its versions' bytes (one FUA write,
    /// no device flush; counted in `log_commits` too).
    pub inline_commits: u64,
    pub commit_failures: u64,
    pub io_errors: u64,
    /// Partial writes buffered as patches (new patched blocks, and merges into existing ones).
    pub patches_created: u64,
    pub patch_merges: u64,
    /// Reads served from patches without a fetch (non-blocking reads).
    pub patch_reads: u64,
    /// Patched blocks brought up to date: fetched, patched and written to the cache.
    pub patch_fetches: u64,
    /// Patched blocks written back as partial writes without a fetch (`patch_direct`).
    pub patch_direct_writes: u64,
    /// Full-block writes that discarded a block's patches (and any fetch result).
    pub patch_discards: u64,
    /// Partial writes that fell back to fetch-before-write: patch memory full.
    pub patch_fallbacks: u64,
    /// Writes and reads that had to wait for a patched block to be brought up to date.
    pub patch_waits: u64,
    /// Failed fetches of patched blocks (reported to the FLUSH that needed them; retried).
    pub patch_fetch_errors: u64,
    /// Lazy patch sets persisted as partial versions, with no fetch; reads of
    /// a partial version that needed backing bytes outside its range; partial
    /// writes over one that needed a fetch (their range could not join).
    pub patch_persists: u64,
    pub partial_read_fetches: u64,
    pub partial_write_fetches: u64,
    /// Admission: write pieces cached because the admission policy admitted
    /// them, pieces it rejected that went straight to the backing store
    /// (bypass, with FUA), their bytes, and rejected pieces cached anyway
    /// because a bypass was not safe (the block was cached or recently was,
    /// or the write policy forbade it at that moment).
    pub admitted_pieces: u64,
    pub bypassed_pieces: u64,
    pub bypassed_bytes: u64,
    pub bypass_refused: u64,
    /// Writes sent around a full cache (`Config::bypass_when_full`); their
    /// pieces count in `bypassed_pieces` or, where a version was cached,
    /// `bypass_refused`.
    pub full_bypassed_writes: u64,
    /// Clean cached copies dropped so that a write with no slot to spare
    /// could go around the cache instead of waiting for one (write-back).
    pub full_dropped_clean: u64,
    /// I/O criticality inheritance: bypassed writes reissued to the cache for
    /// a critical waiter, and original backing completions discarded.
    pub reissued_writes: u64,
    pub discarded_completions: u64,
    /// The admission counters above for critical requests alone (by the
    /// request's tag; the normal class is the total minus these).
    pub critical_admitted_pieces: u64,
    pub critical_bypassed_pieces: u64,
    pub critical_reissued_writes: u64,
    /// Cascading dependencies: writes that inherited criticality from a
    /// critical request waiting behind them.
    pub inherited: u64,
    /// Gauges.
    /// Patched blocks and the bytes of patch data held in RAM.
    pub patched_blocks: u64,
    pub patch_bytes: u64,
    pub dirty_blocks: u64,
    pub cached_blocks: u64,
    pub free_slots: u64,
}
