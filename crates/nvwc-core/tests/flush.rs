//! FLUSH and TRIM (`engine/flush.rs`): a FLUSH with nothing new is answered
//! at once; bypassed writes (acknowledged, volatile on the backing store)
//! get a backing FLUSH before the FLUSH's commit, and a failed one fails the
//! FLUSH and is tried again by the next; a drain ends with that backing
//! FLUSH, retried after `retry_ns` if it fails; a TRIM drops the clean
//! cached copies of the blocks it covers whole (no others), and reaches the
//! backing store only under write-through and write-back.

use bytes::Bytes;
use nvwc_core::testkit::{write_filled as write, MemHarness};
use nvwc_core::*;

const BS: u64 = 4096;

fn cfg(policy: WritePolicyKind) -> Config {
    Config::new(BS as u32, 64, 1024 * BS, policy)
}

/// Write-back whose non-critical writes to uncached blocks bypass the cache
/// (ordinary backing writes, no FUA).
fn bypassing() -> MemHarness {
    let mut c = cfg(WritePolicyKind::WriteBack);
    c.admission = AdmissionKind::Critical;
    MemHarness::new(c)
}

fn run(h: &mut MemHarness, id: ReqId, op: ReqOp<Bytes>) -> Option<Bytes> {
    h.submit(id, op);
    h.wait(id, &mut |_| 0).result.expect("request failed")
}

/// A non-critical write of block `lbn` that bypasses the cache; returns
/// once it is acknowledged and the engine is idle.
fn bypass_write(h: &mut MemHarness, id: ReqId, lbn: u64, byte: u8) {
    let tag = Tag {
        client: 0,
        critical: false,
        sync: false,
    };
    h.submit_tagged(id, write(lbn * BS, byte, BS), tag);
    h.wait(id, &mut |_| 0).result.expect("bypass write failed");
    h.settle(&mut |_| 0);
    assert_eq!(h.engine.stats().bypassed_pieces, 1, "the write bypassed");
}

/// Indexes of the backing FLUSHes in flight.
fn backing_flushes(h: &mut MemHarness) -> Vec<usize> {
    h.inflight()
        .iter()
        .enumerate()
        .filter(|(_, c)| c.dev == Dev::Backing && matches!(c.op, IoOp::Flush))
        .map(|(i, _)| i)
        .collect()
}

fn answered(h: &MemHarness, id: ReqId) -> bool {
    h.replies.iter().any(|r| r.id == id)
}

/// A FLUSH when every acknowledged write is named by a durable commit is
/// answered when it arrives: no commit, no device command.
#[test]
fn a_flush_with_nothing_new_is_answered_at_once() {
    for policy in [
        WritePolicyKind::WriteBack,
        WritePolicyKind::Ordered,
        WritePolicyKind::Journaled,
    ] {
        let mut h = MemHarness::new(cfg(policy));
        run(&mut h, 1, write(0, 1, BS));
        run(&mut h, 2, ReqOp::Flush);
        h.settle(&mut |_| 0);
        let before = h.engine.stats();
        h.submit(3, ReqOp::Flush);
        assert!(answered(&h, 3), "{policy}: the FLUSH waits");
        assert!(
            h.inflight().is_empty(),
            "{policy}: {:?}",
            h.inflight().clone()
        );
        let after = h.engine.stats();
        assert_eq!(
            (after.commits, after.cache_flushes, after.backing_flushes),
            (before.commits, before.cache_flushes, before.backing_flushes),
            "{policy}"
        );
        assert_eq!(after.backing_flushes, 0, "{policy}");
    }
}

/// Bypassed writes: no backing FLUSH until a client FLUSH; each FLUSH that
/// arrives while such writes are not yet durable (unflushed, or under a
/// backing FLUSH still in flight) waits for a backing FLUSH of its own;
/// once one succeeded, nothing is left to cover.
#[test]
fn a_flush_waits_for_a_backing_flush_of_bypassed_writes() {
    let mut h = bypassing();
    bypass_write(&mut h, 1, 0, 7);
    assert_eq!(h.engine.stats().backing_flushes, 0, "no FLUSH yet");
    assert!(h.inflight().is_empty());
    assert_eq!(
        h.engine.dirty_versions(),
        1,
        "volatile on the backing store"
    );
    h.submit(2, ReqOp::Flush);
    assert_eq!(backing_flushes(&mut h).len(), 1, "FLUSH 2 covers the write");
    assert!(!answered(&h, 2));
    // A second FLUSH while the first one's backing FLUSH is in flight.
    h.submit(3, ReqOp::Flush);
    assert!(
        !answered(&h, 3),
        "FLUSH 3 answered before the bypassed write is durable"
    );
    assert_eq!(backing_flushes(&mut h).len(), 2, "FLUSH 3 covers it too");
    assert_eq!(h.engine.dirty_versions(), 1);
    h.wait(2, &mut |_| 0).result.expect("FLUSH 2");
    h.wait(3, &mut |_| 0).result.expect("FLUSH 3");
    h.settle(&mut |_| 0);
    assert_eq!(h.engine.stats().backing_flushes, 2);
    assert_eq!(h.engine.dirty_versions(), 0, "nothing left to cover");
    // Nothing left: the next FLUSH is answered at once.
    h.submit(4, ReqOp::Flush);
    assert!(answered(&h, 4), "FLUSH 4 waits");
    assert!(h.inflight().is_empty(), "{:?}", h.inflight().clone());
    assert_eq!(h.engine.stats().backing_flushes, 2);
    assert_eq!(h.backing[0], 7);
}

/// A backing FLUSH that fails fails the FLUSH that waits for it (no retry
/// timer: a client FLUSH asks again), and the next FLUSH covers the
/// writes again.
#[test]
fn a_failed_backing_flush_fails_the_flush_and_the_next_one_covers_again() {
    let mut h = bypassing();
    bypass_write(&mut h, 1, 0, 7);
    h.submit(2, ReqOp::Flush);
    let i = backing_flushes(&mut h);
    assert_eq!(i.len(), 1);
    h.complete_failed(i[0]);
    let r = h.wait(2, &mut |_| 0);
    assert_eq!(r.result, Err(ReqError::Io), "FLUSH 2 succeeded");
    assert_eq!(h.engine.poll_timeout(), None, "a retry timer");
    assert_eq!(h.engine.dirty_versions(), 1, "still volatile");
    h.submit(3, ReqOp::Flush);
    assert_eq!(backing_flushes(&mut h).len(), 1, "FLUSH 3 covers again");
    h.wait(3, &mut |_| 0).result.expect("FLUSH 3");
    assert_eq!(
        h.engine.stats().backing_flushes,
        2,
        "the failed one and FLUSH 3's"
    );
    assert_eq!(h.engine.dirty_versions(), 0);
}

/// A drain ends with a backing FLUSH of bypassed writes; a failed one is
/// issued again once `retry_ns` has passed.
#[test]
fn a_drain_flushes_bypassed_writes_and_retries_a_failed_backing_flush() {
    for fail in [false, true] {
        let mut h = bypassing();
        let retry = h.engine.config().retry_ns;
        bypass_write(&mut h, 1, 0, 7);
        assert_eq!(h.engine.stats().backing_flushes, 0);
        h.engine.start_drain(h.now);
        let i = backing_flushes(&mut h);
        assert_eq!(i.len(), 1, "fail={fail}: the drain covers the write");
        if fail {
            h.complete_failed(i[0]);
            let t = h.now;
            assert!(h.inflight().is_empty());
            assert_eq!(h.engine.poll_timeout(), Some(t + retry), "the retry");
            assert_eq!(h.engine.dirty_versions(), 1);
            // Not before the retry is due.
            h.engine.handle_timeout(t + retry - 1);
            assert!(h.inflight().is_empty(), "retried early");
            h.now = t + retry;
            h.engine.handle_timeout(h.now);
            assert_eq!(backing_flushes(&mut h).len(), 1, "retried");
        }
        h.settle(&mut |_| 0);
        let st = h.engine.stats();
        assert_eq!(st.backing_flushes, 1 + u64::from(fail), "fail={fail}");
        assert_eq!(h.engine.dirty_versions(), 0, "fail={fail}");
        assert!(h.inflight().is_empty());
    }
}

/// Blocks 0..4 cached and clean (written, committed, destaged).
fn clean_blocks(policy: WritePolicyKind) -> MemHarness {
    let mut h = MemHarness::new(cfg(policy));
    run(&mut h, 1, write(0, 1, 4 * BS));
    run(&mut h, 2, ReqOp::Flush);
    h.engine.start_drain(h.now);
    h.settle(&mut |_| 0);
    h.engine.end_drain();
    let st = h.engine.stats();
    assert_eq!((st.cached_blocks, st.dirty_blocks), (4, 0), "{policy}");
    h
}

/// Whether block `lbn` is a read hit (counted by the engine).
fn cached(h: &mut MemHarness, id: ReqId, lbn: u64) -> bool {
    let hits = h.engine.stats().read_hits;
    run(
        h,
        id,
        ReqOp::Read {
            offset: lbn * BS,
            len: BS as u32,
        },
    );
    h.engine.stats().read_hits > hits
}

/// A TRIM drops clean cached copies of the blocks it covers whole, and
/// only those; dirty blocks and blocks with a write in progress stay.
#[test]
fn a_trim_drops_only_clean_blocks_it_covers_whole() {
    for policy in [
        WritePolicyKind::WriteBack,
        WritePolicyKind::WriteThrough,
        WritePolicyKind::Ordered,
        WritePolicyKind::Journaled,
    ] {
        let mut h = clean_blocks(policy);
        // Half of block 0, all of block 1, half of block 2.
        run(
            &mut h,
            3,
            ReqOp::Trim {
                offset: BS / 2,
                len: 2 * BS as u32,
            },
        );
        assert_eq!(h.engine.stats().cached_blocks, 3, "{policy}");
        let hits: Vec<bool> = (0..4).map(|b| cached(&mut h, 10 + b, b)).collect();
        assert_eq!(hits, [true, false, true, true], "{policy}");
        // An empty trim changes nothing.
        let before = h.engine.stats().cached_blocks;
        run(&mut h, 4, ReqOp::Trim { offset: 0, len: 0 });
        assert_eq!(h.engine.stats().cached_blocks, before, "{policy}");
        if policy == WritePolicyKind::WriteThrough {
            continue;
        }
        // A dirty block is kept.
        run(&mut h, 5, write(8 * BS, 2, BS));
        let before = h.engine.stats();
        run(
            &mut h,
            6,
            ReqOp::Trim {
                offset: 8 * BS,
                len: BS as u32,
            },
        );
        let after = h.engine.stats();
        assert_eq!(
            (after.cached_blocks, after.dirty_blocks),
            (before.cached_blocks, before.dirty_blocks),
            "{policy}: a dirty block dropped"
        );
        // A block whose first write is still in progress (no version yet).
        h.submit(7, write(9 * BS, 3, BS));
        assert!(!answered(&h, 7));
        h.submit(
            8,
            ReqOp::Trim {
                offset: 9 * BS,
                len: BS as u32,
            },
        );
        h.wait(7, &mut |_| 0).result.expect("write 7");
        h.wait(8, &mut |_| 0).result.expect("trim 8");
        assert!(cached(&mut h, 20, 9), "{policy}");
    }
}

/// Write-through and write-back pass a TRIM to the backing store (the reply
/// waits for it); ordered and journaled answer it at once.
#[test]
fn a_trim_reaches_the_backing_store_only_without_ordering() {
    for policy in [
        WritePolicyKind::WriteThrough,
        WritePolicyKind::WriteBack,
        WritePolicyKind::Ordered,
        WritePolicyKind::Journaled,
        WritePolicyKind::JournaledHints,
    ] {
        let mut h = MemHarness::new(cfg(policy));
        h.settle(&mut |_| 0);
        let (offset, len) = (4 * BS, 3 * BS as u32);
        h.submit(1, ReqOp::Trim { offset, len });
        let cmds: Vec<IoCmd<Bytes>> = h.inflight().iter().cloned().collect();
        let passed = matches!(
            policy,
            WritePolicyKind::WriteThrough | WritePolicyKind::WriteBack
        );
        if passed {
            assert_eq!(cmds.len(), 1, "{policy}: {cmds:?}");
            assert_eq!(cmds[0].dev, Dev::Backing, "{policy}");
            assert!(
                matches!(cmds[0].op, IoOp::Trim { offset: o, len: l } if o == offset && l == len),
                "{policy}: {cmds:?}"
            );
            assert!(!answered(&h, 1), "{policy}: answered before the trim");
        } else {
            assert!(cmds.is_empty(), "{policy}: {cmds:?}");
            assert!(answered(&h, 1), "{policy}");
        }
        h.wait(1, &mut |_| 0).result.expect("trim");
    }
}
