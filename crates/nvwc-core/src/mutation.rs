//! Planted bugs, to prove that a checker bites (feature `mutations`).
//!
//! With the feature off (every build but the checkers' own tests), `active`
//! is a constant `false` and the planted branches compile away. With it on,
//! a test selects one mutation for the whole process with `set` (with the feature on); the
//! engine then misbehaves in exactly that one place, and the test asserts
//! that the VOPR fails. Nothing selects a mutation unless a test does.

/// A planted bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Mutation {
    /// No planted bug.
    None = 0,
    /// A client FLUSH skips the backing FLUSH that must cover direct patch
    /// writes (`--patch-direct`) before it commits: the patched writes it
    /// acknowledges can then be lost from the backing store's volatile
    /// cache (check (b) under write-back).
    FlushSkipsDirectCover = 1,
    /// A FLUSH that has to wait for a commit is forgotten, never answered
    /// (liveness: the VOPR's deadlock and liveness checks, "other").
    FlushNeverAnswered = 2,
    /// Recovery accepts every log record without checking its data
    /// against the checksums: a record that reached the device before its
    /// data names bytes that are not there (checks (a)/(b)).
    LogSkipsDataCheck = 3,
    /// Write-back rewrites a version in place while the log record that
    /// introduced it is not sealed: at recovery that record's data no
    /// longer matches, it is dropped with every later one, and FLUSHes it
    /// answered are lost (check (b)).
    InPlaceIgnoresSeal = 4,
    /// A write-back bypass write (admission or full cache) completes without
    /// marking the backing store unflushed: a later FLUSH answers without a
    /// backing FLUSH, and the bypassed write can be lost from the backing
    /// store's volatile cache (check (b)).
    FlushSkipsBypassCover = 5,
    /// A paced destage plan (`Config::full_clean_secs`) writes its copies
    /// without FUA yet still ends without a backing FLUSH: its blocks count
    /// as durably clean while the backing store may lose them, and their
    /// slots are reused (check (b) under write-back).
    PacedDestageWithoutFua = 6,
    /// After a warm restart (the durable record says "clean shutdown"),
    /// writes are not held for the commit that ends that record's
    /// vouching: a write-through write acknowledged before it leaves the
    /// old copy for a crash to bring back (checks (a)/(b) under
    /// write-through, on the VOPR's warm restarts).
    WarmRestartUnvouched = 7,
    /// Journaled rewrites a version of the open transaction in place (the
    /// behaviour before 0c80eb7): a rewrite whose cache write tears and
    /// fails leaves the kept version a mix of two writes, and the next
    /// checkpoint puts the mix on the backing store (the VOPR's torn-version
    /// check, (c)).
    JournaledRewritesInPlace = 8,
    /// Ordered write-back, with reply events on, lets the writes it counts
    /// as complete at `on_replies_sending` raise later writes' completion
    /// floor without joining the graph's frontier: a write issued after a
    /// client saw another's reply does not wait for it on its way to the
    /// backing store (check (c), on the VOPR's seeds that hold replies).
    RepliesSeenWithoutEdges = 9,
    /// Ordered write-back plans a wave that rewrites a block whose clean
    /// mark the commit in flight is still recording (`Ordered::marking`),
    /// as if that commit were already durable, whenever no mark waits for
    /// a later commit (cargo-mutants' `!self.marking.is_empty()` ->
    /// `self.marking.is_empty()` in `needs_marks` does the same). A crash
    /// inside the commit then loses the mark, recovery destages the older
    /// version again over the newer one the wave wrote, and the backing
    /// store leaves its prefix (check (c); of the VOPR's ordered seeds
    /// 0..20,000, four find it: 1243, 2646, 6231 and 9205).
    WaveIgnoresMarking = 10,
    /// A pipelined ordered wave (`Plan::after`) writes each run as soon as
    /// it is read, without waiting for the backing FLUSH of the wave before
    /// it: a write can reach the backing store before one it depends on is
    /// durable there (check (c)).
    GatedPlanWritesEarly = 11,
    /// Recovery does not write an unsealed inline log record's bytes into
    /// their slots: the versions it names keep whatever their slots held
    /// when the host went down (a write never flushed), so FLUSHed writes
    /// read back wrong (checks (a)/(b)).
    InlineSkipsRepair = 12,
    /// A commit carries its versions inline (one FUA write, no device
    /// flush) even though in-place overwrites wait for a flush: a FLUSH
    /// after write-back's in-place rewrite answers with the rewrite still
    /// volatile (check (b)).
    InlineIgnoresOverwrites = 13,
    /// Recovery writes every unsealed inline entry's bytes into its slot,
    /// also where a later record names that slot anew (freed, then reused):
    /// the older bytes overwrite the newer version (checks (a)/(b)).
    InlineRepairsSuperseded = 14,
}

impl Mutation {
    /// Every planted bug, `None` first.
    pub const ALL: [Mutation; 15] = [
        Mutation::None,
        Mutation::FlushSkipsDirectCover,
        Mutation::FlushNeverAnswered,
        Mutation::LogSkipsDataCheck,
        Mutation::InPlaceIgnoresSeal,
        Mutation::FlushSkipsBypassCover,
        Mutation::PacedDestageWithoutFua,
        Mutation::WarmRestartUnvouched,
        Mutation::JournaledRewritesInPlace,
        Mutation::RepliesSeenWithoutEdges,
        Mutation::WaveIgnoresMarking,
        Mutation::GatedPlanWritesEarly,
        Mutation::InlineSkipsRepair,
        Mutation::InlineIgnoresOverwrites,
        Mutation::InlineRepairsSuperseded,
    ];
}

#[cfg(feature = "mutations")]
static ACTIVE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Select the planted bug for the whole process.
#[cfg(feature = "mutations")]
pub fn set(m: Mutation) {
    ACTIVE.store(m as u8, std::sync::atomic::Ordering::SeqCst);
}

/// Is `m` the planted bug?
#[inline]
pub(crate) fn active(m: Mutation) -> bool {
    #[cfg(feature = "mutations")]
    {
        ACTIVE.load(std::sync::atomic::Ordering::Relaxed) == m as u8
    }
    #[cfg(not(feature = "mutations"))]
    {
        let _ = m;
        false
    }
}

/// Is `Mutation::WaveIgnoresMarking` planted? (`Ordered::needs_marks`.)
#[inline]
pub(crate) fn ignore_marking() -> bool {
    active(Mutation::WaveIgnoresMarking)
}
