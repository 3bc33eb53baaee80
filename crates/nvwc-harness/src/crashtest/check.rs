//! The log indexed per block ([`History`]), and the checks of what a device
//! shows against it: the flush contract (cache intact) and each policy's
//! cache-lost promise (all acknowledged, point in time, flush-aligned).

use std::collections::HashMap;

use super::blocks::Seen;
use super::workload::Op;

/// The log, indexed for the checks.
pub struct History {
    /// Per block: (seq, acked ok, fua) of every write touching it, ascending.
    per_block: Vec<Vec<(u64, bool, bool)>>,
    /// seq -> ack time (µs) of acknowledged writes.
    ack: HashMap<u64, u64>,
    /// Writes with seq <= this were acknowledged before a completed FLUSH.
    durable_upto: u64,
    /// Every FLUSH issued: the write seq it follows.
    flush_points: Vec<u64>,
    pub counts: Counts,
}

/// How many requests of a run did what.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Counts {
    pub writes: u64,
    pub acked: u64,
    pub flushes_acked: u64,
    pub fua_acked: u64,
    pub failed_requests: u64,
    /// Writes refused with `EPERM` by an export degraded to read-only.
    pub refused_writes: u64,
}

impl History {
    pub fn new(ops: &[Op], blocks: u64) -> History {
        let mut h = History {
            per_block: vec![Vec::new(); blocks as usize],
            ack: HashMap::new(),
            durable_upto: 0,
            flush_points: vec![0],
            counts: Counts::default(),
        };
        for op in ops {
            match *op {
                Op::Write {
                    seq,
                    block,
                    n,
                    fua,
                    ack_us,
                    ok,
                    refused,
                    ..
                } => {
                    h.counts.writes += 1;
                    h.counts.refused_writes += u64::from(refused);
                    for b in block..block + n {
                        if !refused {
                            h.per_block[b as usize].push((seq, ok, fua));
                        }
                    }
                    if let (true, Some(t)) = (ok, ack_us) {
                        h.counts.acked += 1;
                        h.ack.insert(seq, t);
                        if fua {
                            h.counts.fua_acked += 1;
                        }
                    } else if ack_us.is_none() && !ok {
                        // In flight at the crash, or failed.
                    }
                    if !ok {
                        h.counts.failed_requests += 1;
                    }
                }
                Op::Flush { after_seq, ok, .. } => {
                    h.flush_points.push(after_seq);
                    if ok {
                        h.counts.flushes_acked += 1;
                        h.durable_upto = h.durable_upto.max(after_seq);
                    } else {
                        h.counts.failed_requests += 1;
                    }
                }
            }
        }
        // The last request may have been in flight at the crash; it is neither acked nor failed.
        if let Some(Op::Write { ack_us: None, .. } | Op::Flush { ack_us: None, .. }) = ops.last() {
            h.counts.failed_requests -= 1;
        }
        h
    }

    /// Newest write to `b` with seq <= `upto` (0: none).
    fn last_write(&self, b: usize, upto: u64) -> u64 {
        self.per_block[b]
            .iter()
            .rev()
            .find(|w| w.0 <= upto)
            .map_or(0, |w| w.0)
    }

    fn wrote(&self, b: usize, seq: u64) -> bool {
        self.per_block[b].iter().any(|w| w.0 == seq)
    }

    /// Every write to block `b`, newest first.
    pub fn seqs(&self, b: usize) -> impl Iterator<Item = u64> + '_ {
        self.per_block[b].iter().rev().map(|w| w.0)
    }
}

/// Outcome of one check.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Check {
    pub ok: bool,
    /// Blocks that break the promise.
    pub bad_blocks: u64,
    /// Blocks holding bytes no write produced.
    pub garbage_blocks: u64,
    /// Acknowledged writes the state does not show (staleness, in writes).
    pub stale_writes: u64,
    /// How long before the crash the oldest missing acknowledged write was acknowledged (ms).
    pub stale_ms: f64,
    /// The cut (last write of the matching prefix), for point-in-time checks.
    pub cut: Option<u64>,
    /// Blocks not judged because a write to them failed after their floor
    /// (disk semantics, see [`check_flush_contract`]).
    pub failed_write_blocks: u64,
    /// Blocks a host crash tore ([`Seen::Torn`]), judged sector by sector.
    pub torn_blocks: u64,
    pub detail: String,
}

/// Staleness: acknowledged writes whose data is not visible (per block,
/// counting a write missing when any block of it shows an older write).
fn staleness(h: &History, seen: &[Seen], crash_us: u64) -> (u64, f64) {
    let mut missing = std::collections::HashSet::new();
    for (b, s) in seen.iter().enumerate() {
        // A torn block shows a write only where all its sectors do.
        let have = match s {
            Seen::Seq(x) => *x,
            Seen::Torn(secs) => secs.iter().copied().min().unwrap_or(0),
            _ => 0,
        };
        for w in &h.per_block[b] {
            if w.1 && w.0 > have {
                missing.insert(w.0);
            }
        }
    }
    let oldest = missing.iter().filter_map(|s| h.ack.get(s)).min().copied();
    (
        missing.len() as u64,
        oldest.map_or(0.0, |t| crash_us.saturating_sub(t) as f64 / 1000.0),
    )
}

/// Every block must show a write this run made, no older than its floor
/// (`floor(writes to the block)`; 0: anything or zeroes will do).
/// `failed_undefined`: a block with a failed write newer than its floor may
/// hold anything (it is counted, not judged).
fn check_floor(
    h: &History,
    seen: &[Seen],
    crash_us: u64,
    what: &str,
    floor: impl Fn(&[(u64, bool, bool)]) -> u64,
    failed_undefined: bool,
) -> Check {
    let mut c = Check::default();
    for (b, s) in seen.iter().enumerate() {
        let floor = floor(&h.per_block[b]);
        if failed_undefined && h.per_block[b].iter().any(|w| !w.1 && w.0 > floor) {
            c.failed_write_blocks += 1;
            continue;
        }
        let bad = match *s {
            Seen::Garbage => {
                c.garbage_blocks += 1;
                true
            }
            Seen::Zero => floor > 0,
            Seen::Seq(x) => x < floor || !h.wrote(b, x),
            // Each sector on its own: its floor write's bytes, or a newer
            // write's (one the crash tore).
            Seen::Torn(secs) => {
                c.torn_blocks += 1;
                secs.iter().any(|&x| {
                    if x == 0 {
                        floor > 0
                    } else {
                        x < floor || !h.wrote(b, x)
                    }
                })
            }
        };
        if bad {
            if c.bad_blocks < 3 {
                c.detail += &format!("block {b}: {s:?}, {what} {floor}; ");
            }
            c.bad_blocks += 1;
        }
    }
    (c.stale_writes, c.stale_ms) = staleness(h, seen, crash_us);
    c.ok = c.bad_blocks == 0;
    c
}

/// Cache intact: the flush contract. Every block shows its newest write
/// that a completed FLUSH or its own FUA made durable, or a newer one.
///
/// `failed_undefined` applies a disk's rule for failed writes: a block that
/// a *failed* write touched after that floor may hold anything. Use it only
/// where the server promises no more: injected cache-device faults under
/// write-back rewriting in place, where a write that fails part-way lands on
/// the block's only copy (`docs/ON-DISK-FORMAT.md`).
pub fn check_flush_contract(
    h: &History,
    seen: &[Seen],
    crash_us: u64,
    failed_undefined: bool,
) -> Check {
    check_floor(
        h,
        seen,
        crash_us,
        "durable floor",
        |ws| {
            ws.iter()
                .filter(|&&(seq, ok, fua)| ok && (seq <= h.durable_upto || fua))
                .map(|w| w.0)
                .max()
                .unwrap_or(0)
        },
        failed_undefined,
    )
}

/// Cache lost, `write-through`: everything acknowledged is on the backing store.
pub fn check_all_acked(h: &History, seen: &[Seen], crash_us: u64) -> Check {
    check_floor(
        h,
        seen,
        crash_us,
        "last acked",
        |ws| ws.iter().filter(|w| w.1).map(|w| w.0).max().unwrap_or(0),
        false,
    )
}

/// Cache lost: is the state a prefix of the write sequence? With
/// `flush_aligned`, the prefix must end exactly at a FLUSH and be complete.
pub fn check_point_in_time(
    h: &History,
    seen: &[Seen],
    crash_us: u64,
    flush_aligned: bool,
) -> Check {
    let mut c = Check::default();
    let mut newest = 0;
    for s in seen {
        match s {
            Seen::Garbage => c.garbage_blocks += 1,
            Seen::Seq(x) => newest = newest.max(*x),
            Seen::Torn(secs) => {
                c.torn_blocks += 1;
                newest = newest.max(secs.iter().copied().max().unwrap_or(0));
            }
            Seen::Zero => {}
        }
    }
    let cut = if flush_aligned {
        match h
            .flush_points
            .iter()
            .copied()
            .filter(|&p| p >= newest)
            .min()
        {
            Some(p) => p,
            None => {
                c.detail = format!("newest visible write {newest} is after the last FLUSH");
                c.bad_blocks = 1;
                (c.stale_writes, c.stale_ms) = staleness(h, seen, crash_us);
                return c;
            }
        }
    } else {
        newest
    };
    c.cut = Some(cut);
    for (b, s) in seen.iter().enumerate() {
        let want = h.last_write(b, cut);
        // The write at the cut may be partly there (no multi-block atomicity
        // in NBD; after a host crash, down to single sectors), unless the
        // state must be flush-aligned.
        let before = h.last_write(b, cut.saturating_sub(1));
        let sector_ok = |x: u64| x == want || (!flush_aligned && want == cut && x == before);
        let ok = s
            .sectors()
            .is_some_and(|secs| secs.iter().all(|&x| sector_ok(x)));
        if !ok {
            if c.bad_blocks < 3 {
                c.detail += &format!("block {b}: {s:?}, prefix {cut} wants {want}; ");
            }
            c.bad_blocks += 1;
        }
    }
    (c.stale_writes, c.stale_ms) = staleness(h, seen, crash_us);
    c.ok = c.bad_blocks == 0 && c.garbage_blocks == 0;
    c
}

/// The cache-lost promise of a policy (`write-back` has none; it is held to
/// point-in-time to show that). After a host crash, write-through promises
/// only what a FLUSH or FUA covered: the backing store lost its page cache too.
/// `journaled-hints` is flush-aligned unless `off_flush_points`: it reported
/// forced closes (transactions closed for space, not at a FLUSH; see
/// `journaled.rs`; an unknown count, no status, counts as none), or its
/// admission policy may send writes around the cache (each reaches the
/// backing store as it completes, between FLUSHes); point-in-time always.
pub fn check_cache_lost(
    policy: &str,
    host_crash: bool,
    off_flush_points: bool,
    h: &History,
    seen: &[Seen],
    crash_us: u64,
) -> Check {
    match policy {
        "write-through" if host_crash => check_flush_contract(h, seen, crash_us, false),
        "write-through" => check_all_acked(h, seen, crash_us),
        "journaled-hints" if !off_flush_points => check_point_in_time(h, seen, crash_us, true),
        _ => check_point_in_time(h, seen, crash_us, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crashtest::blocks::{block_bytes, decode_region, SECTOR, SECTORS};
    use crate::crashtest::BS;

    fn w(seq: u64, block: u64, n: u64, ok: bool) -> Op {
        Op::Write {
            seq,
            block,
            n,
            fua: false,
            issue_us: seq * 10,
            ack_us: ok.then_some(seq * 10 + 5),
            ok,
            refused: false,
        }
    }
    fn f(after: u64) -> Op {
        Op::Flush {
            after_seq: after,
            issue_us: 0,
            ack_us: Some(1),
            ok: true,
        }
    }

    #[test]
    fn flush_contract_catches_a_lost_flushed_write() {
        // Writes 1 (block 0), flush, 2 (block 1), 3 (block 0, in flight).
        let ops = vec![w(1, 0, 1, true), f(1), w(2, 1, 1, true), w(3, 0, 1, false)];
        let h = History::new(&ops, 2);
        assert!(check_flush_contract(&h, &[Seen::Seq(1), Seen::Zero], 100, false).ok);
        assert!(check_flush_contract(&h, &[Seen::Seq(3), Seen::Seq(2)], 100, false).ok);
        assert!(!check_flush_contract(&h, &[Seen::Zero, Seen::Seq(2)], 100, false).ok);
        assert!(!check_flush_contract(&h, &[Seen::Garbage, Seen::Seq(2)], 100, false).ok);
        // Disk semantics: write 3 failed (or was in flight) on block 0, so
        // block 0 is not judged; block 1 still is.
        let c = check_flush_contract(&h, &[Seen::Garbage, Seen::Seq(2)], 100, true);
        assert!(c.ok && c.failed_write_blocks == 1, "{c:?}");
        assert!(!check_flush_contract(&h, &[Seen::Seq(1), Seen::Garbage], 100, true).ok);
        // A failed write older than the floor excuses nothing.
        let ops = vec![w(1, 0, 1, false), w(2, 0, 1, true), f(2)];
        let h = History::new(&ops, 1);
        assert!(!check_flush_contract(&h, &[Seen::Garbage], 100, true).ok);
    }

    /// A block made of the sectors of writes `secs` (0: zeroes).
    fn mix(nonce: u64, block: u64, secs: [u64; SECTORS]) -> Vec<u8> {
        let s = SECTOR as usize;
        let mut b = vec![0u8; BS as usize];
        for (i, &seq) in secs.iter().enumerate() {
            if seq > 0 {
                b[i * s..(i + 1) * s]
                    .copy_from_slice(&block_bytes(nonce, seq, block)[i * s..(i + 1) * s]);
            }
        }
        b
    }

    #[test]
    fn torn_blocks_are_judged_sector_by_sector() {
        // 1: block 0, flush; 2: blocks 0-1 (acked, not flushed); 3: block 1.
        let ops = vec![w(1, 0, 1, true), f(1), w(2, 0, 2, true), w(3, 1, 1, true)];
        let h = History::new(&ops, 2);
        let region = |b0: [u64; 8], b1: [u64; 8]| [mix(5, 0, b0), mix(5, 1, b1)].concat();
        // A torn block is garbage unless a host crash is being judged.
        let r = region([2, 2, 1, 1, 1, 1, 2, 1], [3; 8]);
        assert_eq!(decode_region(5, &r, None)[0], Seen::Garbage);
        let seen = decode_region(5, &r, Some(&h));
        assert_eq!(seen[0], Seen::Torn([2, 2, 1, 1, 1, 1, 2, 1]));
        assert_eq!(seen[1], Seen::Seq(3));
        // The flushed write 1, partly overwritten by write 2: kept.
        let c = check_flush_contract(&h, &seen, 100, false);
        assert!(c.ok && c.torn_blocks == 1, "{c:?}");
        // A sector older than the floor (zeroes under write 1): lost.
        let seen = decode_region(5, &region([2, 0, 1, 1, 1, 1, 1, 1], [3; 8]), Some(&h));
        assert!(matches!(seen[0], Seen::Torn(_)));
        assert!(!check_flush_contract(&h, &seen, 100, false).ok);
        // A sector of another block's write, or of no write: garbage.
        let mut r = region([2, 2, 1, 1, 1, 1, 1, 1], [3; 8]);
        r[512..1024].copy_from_slice(&mix(5, 1, [3; 8])[512..1024]);
        assert_eq!(decode_region(5, &r, Some(&h))[0], Seen::Garbage);
        // Point in time: write 2 at the cut, torn across both its blocks.
        let seen = decode_region(
            5,
            &region([2, 1, 2, 1, 1, 1, 1, 1], [0, 2, 2, 0, 0, 0, 0, 0]),
            Some(&h),
        );
        let c = check_point_in_time(&h, &seen, 0, false);
        assert!(c.ok && c.cut == Some(2) && c.torn_blocks == 2, "{c:?}");
        // ... but not at a FLUSH, and a torn write before the cut is a hole.
        assert!(!check_point_in_time(&h, &seen, 0, true).ok);
        let seen = decode_region(5, &region([2, 1, 2, 1, 1, 1, 1, 1], [3; 8]), Some(&h));
        assert!(!check_point_in_time(&h, &seen, 0, false).ok);
    }

    #[test]
    fn point_in_time_finds_prefixes_and_rejects_holes() {
        // 1: blocks 0-1, 2: block 2, flush, 3: block 0, 4: block 1-2.
        let ops = vec![
            w(1, 0, 2, true),
            w(2, 2, 1, true),
            f(2),
            w(3, 0, 1, true),
            w(4, 1, 2, true),
        ];
        let h = History::new(&ops, 3);
        let s = |a, b, c| [a, b, c];
        use Seen::*;
        assert!(check_point_in_time(&h, &s(Zero, Zero, Zero), 0, false).ok);
        assert!(check_point_in_time(&h, &s(Seq(1), Seq(1), Seq(2)), 0, false).ok);
        // Write 4 partly there (the write at the cut).
        assert!(check_point_in_time(&h, &s(Seq(3), Seq(4), Seq(2)), 0, false).ok);
        // Write 3 there but write 2 missing: a hole.
        assert!(!check_point_in_time(&h, &s(Seq(3), Seq(1), Zero), 0, false).ok);
        // Flush-aligned: only the state at the FLUSH (after 2), or the empty one.
        assert!(check_point_in_time(&h, &s(Seq(1), Seq(1), Seq(2)), 0, true).ok);
        assert!(!check_point_in_time(&h, &s(Seq(1), Seq(1), Zero), 0, true).ok);
        assert!(!check_point_in_time(&h, &s(Seq(3), Seq(1), Seq(2)), 0, true).ok);
        // Write-through: everything acknowledged.
        assert!(check_all_acked(&h, &s(Seq(3), Seq(4), Seq(4)), 0).ok);
        assert!(!check_all_acked(&h, &s(Seq(3), Seq(1), Seq(4)), 0).ok);
    }

    #[test]
    fn journaled_hints_off_flush_points_is_held_to_point_in_time() {
        // 1: block 0, flush, 2: block 1 (sent around the cache by admission:
        // on the backing store before any FLUSH covers it), 3: block 2.
        let ops = vec![w(1, 0, 1, true), f(1), w(2, 1, 1, true), w(3, 2, 1, true)];
        let h = History::new(&ops, 3);
        use Seen::*;
        let after_2 = [Seq(1), Seq(2), Zero];
        let hole = [Zero, Seq(2), Zero];
        let lost =
            |off, seen: &[Seen]| check_cache_lost("journaled-hints", false, off, &h, seen, 0);
        // Flush-aligned when nothing left a FLUSH point: write 2 is too new.
        assert!(!lost(false, &after_2).ok);
        assert!(lost(false, &[Seq(1), Zero, Zero]).ok);
        // Off FLUSH points (forced closes, or writes around the cache): any
        // prefix, but never a hole.
        assert!(lost(true, &after_2).ok);
        assert!(!lost(true, &hole).ok);
    }
}
