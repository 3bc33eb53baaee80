//! The hit-ratio model: a trace replayed through a replacement policy alone.
//!
//! The discrete-event driver ([`crate::driver`]) runs the whole engine: write
//! policy, destaging, device queues, virtual time. Researchers who only want
//! a hit ratio (and a cross-check against a key-value simulator such as
//! libCacheSim) do not need any of that, and pay for it in replay speed. This
//! model drives the **same** [`Replacement`] implementations the engine uses
//! (`nvwc-replacement`), with nothing else:
//!
//! * every read or write request is split into the cache blocks it touches
//!   (block `offset / B` to `(offset + len - 1) / B`), after the same address
//!   mapping as the driver ([`crate::addr`]); each block is one access;
//! * a resident block is a hit (`touch`);
//! * a missing block is allocated (write misses always, read misses when
//!   `read_allocate`), evicting the policy's victim when the cache is full;
//! * every block stays clean (no write policy, no destaging), so the
//!   policy's victim is always the block it ranks last, as in a pure
//!   replacement simulator; flushes and trims are counted and ignored.
//!
//! With LRU and read allocation this is exactly the LRU of libCacheSim fed
//! one request per block (`nvwc trace convert --to oracle-general`), which
//! `scripts/crosscheck-libcachesim.sh` checks.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::time::Instant;

use nvwc_replacement::{build, BlockId, Replacement, ReplacementKind};
use nvwc_trace::{open_path, Format, Op, ReaderOptions, TraceError, TraceRecord};
use serde::Serialize;
use std::path::Path;

use crate::metrics::per;
use crate::SimError;

/// Bits of a model key that hold the block number; the device sits above.
pub const DEV_SHIFT: u32 = 44;

/// One configuration of the hit-ratio model.
#[derive(Clone, Debug)]
pub struct HitRatioConfig {
    /// The replacement policy.
    pub replacement: ReplacementKind,
    /// Cache size in bytes (rounded down to whole blocks, at least one).
    pub cache_bytes: u64,
    /// Cache block size in bytes (`> 0`).
    pub block_size: u64,
    /// Allocate a block on a read miss (writes always allocate).
    pub read_allocate: bool,
}

/// What a hit-ratio run reports.
#[derive(Clone, Debug, Default, Serialize)]
pub struct HitRatioResult {
    /// Trace file name.
    pub trace: String,
    /// Always `"hit-ratio"` (the driver's results say `"des"`).
    pub model: &'static str,
    /// Replacement policy, in its text form.
    pub replacement: String,
    /// Cache size in bytes, as asked.
    pub cache_size_bytes: u64,
    /// Cache size in blocks.
    pub cache_blocks: u64,
    /// Cache block size.
    pub block_size: u64,
    /// Read allocation.
    pub read_allocate: bool,
    /// Trace requests replayed (all kinds).
    pub requests: u64,
    /// Read requests.
    pub reads: u64,
    /// Write requests.
    pub writes: u64,
    /// Block accesses (the unit of the hit counts).
    pub block_accesses: u64,
    /// Read block accesses that hit.
    pub read_hits: u64,
    /// Read block accesses that missed.
    pub read_misses: u64,
    /// Write block accesses that hit.
    pub write_hits: u64,
    /// Write block accesses that missed.
    pub write_misses: u64,
    /// Blocks evicted.
    pub evictions: u64,
    /// `(read_hits + write_hits) / block_accesses`.
    pub hit_ratio: f64,
    /// `read_hits / (read_hits + read_misses)`.
    pub read_hit_ratio: f64,
    /// Wall-clock seconds of the replay (trace reading included).
    pub wall_seconds: f64,
    /// Requests per wall-clock second.
    pub replay_rate: f64,
    /// Block accesses per wall-clock second.
    pub accesses_per_sec: f64,
}

/// A hasher for block numbers: one multiply-xorshift round (block numbers
/// are not adversarial; std's SipHash costs more than the replacement step).
#[derive(Default)]
struct BlockHasher(u64);

impl Hasher for BlockHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, x: u64) {
        let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        self.0 = z ^ (z >> 31);
    }
}

type BlockMap = HashMap<u64, u32, BuildHasherDefault<BlockHasher>>;

/// The model's state: resident blocks and the policy.
pub struct HitRatioCache {
    policy: Box<dyn Replacement>,
    /// Block number -> slot.
    map: BlockMap,
    /// Slot -> block number (for eviction).
    lbn: Vec<u64>,
    /// Slots never used yet (handed out in order; nothing is freed but by eviction).
    next_free: u32,
    capacity: u32,
    read_allocate: bool,
    /// Counters.
    pub read_hits: u64,
    /// Counters.
    pub read_misses: u64,
    /// Counters.
    pub write_hits: u64,
    /// Counters.
    pub write_misses: u64,
    /// Counters.
    pub evictions: u64,
}

impl HitRatioCache {
    /// A cache of `capacity` blocks (`1..=u32::MAX`).
    pub fn new(kind: ReplacementKind, capacity: u64, read_allocate: bool) -> Self {
        assert!(
            (1..=u64::from(u32::MAX)).contains(&capacity),
            "cache of {capacity} blocks"
        );
        let cap = capacity as usize;
        HitRatioCache {
            policy: build(kind, cap),
            map: BlockMap::with_capacity_and_hasher(cap.min(1 << 24), Default::default()),
            lbn: vec![0; cap.min(1 << 24)],
            next_free: 0,
            capacity: capacity as u32,
            read_allocate,
            read_hits: 0,
            read_misses: 0,
            write_hits: 0,
            write_misses: 0,
            evictions: 0,
        }
    }

    /// Resident blocks.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no block is resident.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Whether block `b` is resident.
    pub fn contains(&self, b: u64) -> bool {
        self.map.contains_key(&b)
    }

    /// One access to block `b`; returns whether it hit.
    pub fn access(&mut self, b: u64, write: bool) -> bool {
        if let Some(&slot) = self.map.get(&b) {
            self.policy.touch(BlockId(slot), write);
            if write {
                self.write_hits += 1;
            } else {
                self.read_hits += 1;
            }
            return true;
        }
        if write {
            self.write_misses += 1;
        } else {
            self.read_misses += 1;
            if !self.read_allocate {
                return false;
            }
        }
        let slot = if self.next_free < self.capacity {
            let s = self.next_free;
            self.next_free += 1;
            if s as usize >= self.lbn.len() {
                self.lbn.resize((s as usize + 1).next_power_of_two(), 0);
            }
            s
        } else {
            let v = self
                .policy
                .victim_clean(&|_| false)
                .expect("a full cache of clean blocks always has a victim");
            self.policy.remove(v);
            let old = self.lbn[v.0 as usize];
            let gone = self.map.remove(&old);
            assert_eq!(gone, Some(v.0), "slot map and block map disagree");
            self.evictions += 1;
            v.0
        };
        self.lbn[slot as usize] = b;
        self.map.insert(b, slot);
        self.policy.insert(BlockId(slot), b, false);
        false
    }
}

/// Replays `records` (already mapped) through the model.
pub fn replay<I>(
    cfg: &HitRatioConfig,
    records: I,
    trace_name: &str,
) -> Result<HitRatioResult, SimError>
where
    I: Iterator<Item = Result<TraceRecord, TraceError>>,
{
    if cfg.block_size == 0 {
        return Err(SimError::Config("block size must be positive".into()));
    }
    let blocks = (cfg.cache_bytes / cfg.block_size).max(1);
    if blocks > u64::from(u32::MAX) {
        return Err(SimError::Config(format!(
            "cache of {blocks} blocks is too large"
        )));
    }
    let mut c = HitRatioCache::new(cfg.replacement, blocks, cfg.read_allocate);
    let mut r = HitRatioResult {
        trace: trace_name.to_string(),
        model: "hit-ratio",
        replacement: cfg.replacement.to_string(),
        cache_size_bytes: cfg.cache_bytes,
        cache_blocks: blocks,
        block_size: cfg.block_size,
        read_allocate: cfg.read_allocate,
        ..Default::default()
    };
    let bs = cfg.block_size;
    let t0 = Instant::now();
    for rec in records {
        let rec = rec?;
        r.requests += 1;
        let write = match rec.op {
            Op::Read => {
                r.reads += 1;
                false
            }
            Op::Write => {
                r.writes += 1;
                true
            }
            Op::Flush | Op::Trim => continue,
        };
        if rec.len == 0 {
            continue;
        }
        let first = rec.offset / bs;
        let last = (rec.offset + rec.len - 1) / bs;
        if last >= 1 << DEV_SHIFT {
            return Err(SimError::Config(format!(
                "block {last} of device {} is beyond 2^{DEV_SHIFT}",
                rec.dev
            )));
        }
        let dev = u64::from(rec.dev) << DEV_SHIFT;
        for b in first..=last {
            c.access(dev | b, write);
        }
        r.block_accesses += last - first + 1;
    }
    let wall = t0.elapsed().as_secs_f64();
    r.read_hits = c.read_hits;
    r.read_misses = c.read_misses;
    r.write_hits = c.write_hits;
    r.write_misses = c.write_misses;
    r.evictions = c.evictions;
    let hits = r.read_hits + r.write_hits;
    r.hit_ratio = per(hits as f64, r.block_accesses);
    r.read_hit_ratio = per(r.read_hits as f64, r.read_hits + r.read_misses);
    r.wall_seconds = wall;
    if wall > 0.0 {
        r.replay_rate = r.requests as f64 / wall;
        r.accesses_per_sec = r.block_accesses as f64 / wall;
    }
    Ok(r)
}

/// Replays a trace file through the model. No address map and no scan:
/// every (device, block) is its own key, which gives the same hits as the
/// driver's block-preserving map ([`crate::addr`] maps whole 4 KiB-multiple
/// regions one to one). Only device `dev` if given, at most `limit` records;
/// malformed records are skipped as the driver skips them.
pub fn run_file(
    cfg: &HitRatioConfig,
    path: &Path,
    format: Option<Format>,
    dev: Option<u32>,
    limit: Option<u64>,
) -> Result<HitRatioResult, SimError> {
    let reader = open_path(path, format, &ReaderOptions::default())?;
    let recs = reader
        .filter(|r| !matches!(r, Err(e) if !e.is_fatal()))
        .filter(|r| match (r, dev) {
            (Ok(r), Some(d)) => r.dev == d,
            _ => true,
        })
        .take(limit.map_or(usize::MAX, |l| l.min(usize::MAX as u64) as usize));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    replay(cfg, recs, &name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// A textbook LRU over a deque: the oracle for the model with LRU.
    struct NaiveLru {
        cap: usize,
        q: VecDeque<u64>,
    }

    impl NaiveLru {
        fn access(&mut self, b: u64) -> bool {
            if let Some(i) = self.q.iter().position(|&x| x == b) {
                self.q.remove(i);
                self.q.push_back(b);
                return true;
            }
            if self.q.len() == self.cap {
                self.q.pop_front();
            }
            self.q.push_back(b);
            false
        }
    }

    fn rec(op: Op, offset: u64, len: u64) -> Result<TraceRecord, TraceError> {
        Ok(TraceRecord::new(0, op, offset, len, 0))
    }

    #[test]
    fn lru_matches_a_textbook_lru_hit_for_hit() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut next = || rng.gen::<u64>();
        for cap in [1u64, 2, 7, 64, 300] {
            let mut m = HitRatioCache::new(ReplacementKind::Lru, cap, true);
            let mut o = NaiveLru {
                cap: cap as usize,
                q: VecDeque::new(),
            };
            for i in 0..20_000 {
                // Skewed: a hot set of 50 blocks and a cold range of 2000.
                let b = if next() % 3 == 0 {
                    next() % 2000
                } else {
                    next() % 50
                };
                let w = i % 4 == 0;
                assert_eq!(
                    m.access(b, w),
                    o.access(b),
                    "cap {cap} access {i} block {b}"
                );
            }
            assert!(m.len() as u64 <= cap);
            assert!(m.read_hits + m.write_hits > 0);
            assert!(m.evictions > 0);
        }
    }

    #[test]
    fn requests_split_into_blocks_and_read_allocate_is_honoured() {
        let cfg = HitRatioConfig {
            replacement: ReplacementKind::Lru,
            cache_bytes: 4 * 4096,
            block_size: 4096,
            read_allocate: false,
        };
        let recs = vec![
            rec(Op::Read, 0, 4096),     // miss, not allocated
            rec(Op::Read, 0, 4096),     // miss again
            rec(Op::Write, 2048, 4096), // blocks 0 and 1: two write misses
            rec(Op::Read, 0, 8192),     // two read hits
            rec(Op::Flush, 0, 0),
            rec(Op::Trim, 0, 4096),
        ];
        let r = replay(&cfg, recs.into_iter(), "t").unwrap();
        assert_eq!(r.requests, 6);
        assert_eq!((r.reads, r.writes), (3, 1));
        assert_eq!(r.block_accesses, 6);
        assert_eq!((r.read_hits, r.read_misses), (2, 2));
        assert_eq!((r.write_hits, r.write_misses), (0, 2));
        assert!((r.hit_ratio - 2.0 / 6.0).abs() < 1e-12);
    }

    #[test]
    fn every_policy_runs_and_respects_capacity() {
        for k in ["lru", "arc", "lst:track=4", "stack:track=4,knee=8"] {
            let kind: ReplacementKind = k.parse().unwrap();
            let mut m = HitRatioCache::new(kind, 32, true);
            for i in 0..10_000u64 {
                m.access((i * 7919) % 500 + (i % 3) * 1000, i % 2 == 0);
                assert!(m.len() <= 32, "{k}");
            }
            assert!(m.evictions > 0, "{k}");
        }
    }
}
