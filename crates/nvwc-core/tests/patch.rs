//! Patches (`engine/patch.rs`): which writes become patches, and what
//! bringing a patched block up to date costs and leaves behind. Mutation
//! testing (`scripts/mutants.sh`) found each of these unchecked by the rest
//! of the suite.

use bytes::Bytes;
use nvwc_core::testkit::MemHarness;
use nvwc_core::*;

const BS: u64 = 4096;

fn cfg(policy: WritePolicyKind, fetch: FetchMode) -> Config {
    let mut c = Config::new(BS as u32, 64, 1024 * BS, policy);
    c.fetch = fetch;
    c
}

const FETCHES: [FetchMode; 3] = [FetchMode::Async, FetchMode::AsyncBg, FetchMode::Lazy];

fn write(offset: u64, byte: u8, len: u64, fua: bool) -> ReqOp<Bytes> {
    ReqOp::Write {
        offset,
        data: Bytes::from(vec![byte; len as usize]),
        fua,
    }
}

fn run(h: &mut MemHarness, id: ReqId, op: ReqOp<Bytes>) -> Option<Bytes> {
    h.submit(id, op);
    h.wait(id, &mut |_| 0).result.expect("request failed")
}

fn read(h: &mut MemHarness, id: ReqId, offset: u64, len: u64) -> Vec<u8> {
    let op = ReqOp::Read {
        offset,
        len: len as u32,
    };
    run(h, id, op).expect("read data").to_vec()
}

/// A write of a whole block never becomes a patch, in any mode that
/// patches: it goes to a slot like any write, and nothing reads the block
/// from the backing store.
#[test]
fn a_full_block_write_is_not_patched() {
    for fetch in FETCHES {
        let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack, fetch));
        run(&mut h, 1, write(5 * BS, 0x11, BS, false));
        run(&mut h, 2, ReqOp::Flush);
        h.settle(&mut |_| 0);
        let st = h.engine.stats();
        assert_eq!(st.patches_created, 0, "{fetch:?}: {st:?}");
        assert_eq!(
            (st.backing_reads, st.patch_fetches, st.patch_persists),
            (0, 0, 0),
            "{fetch:?}: {st:?}"
        );
        assert_eq!(read(&mut h, 3, 5 * BS, BS), vec![0x11; BS as usize]);
    }
}

/// A FUA write never becomes a patch (a patch lives in RAM only): a partial
/// FUA write to a cold block fetches the block (fetch-before-write) and its
/// reply means its bytes are durable: a crash right after keeps them, with
/// the rest of the block from the backing store.
#[test]
fn a_fua_partial_write_is_not_patched_and_survives_a_crash() {
    for policy in [
        WritePolicyKind::WriteBack,
        WritePolicyKind::Ordered,
        WritePolicyKind::Journaled,
    ] {
        for fetch in FETCHES {
            let ctx = format!("{policy:?} {fetch:?}");
            let mut h = MemHarness::new(cfg(policy, fetch));
            h.backing[5 * BS as usize..6 * BS as usize].fill(0xaa);
            run(&mut h, 1, write(5 * BS + 100, 0x22, 1000, true));
            assert_eq!(h.engine.stats().patches_created, 0, "{ctx}");
            h.reopen().expect("recovers");
            let d = read(&mut h, 2, 5 * BS, BS);
            let mut want = vec![0xaa; BS as usize];
            want[100..1100].fill(0x22);
            if let Some(i) = (0..d.len()).find(|&i| d[i] != want[i]) {
                panic!("{ctx}: byte {i} is {:#x}, want {:#x}", d[i], want[i]);
            }
        }
    }
}

/// Under ordered write-back a metadata commit waits until no patch is left,
/// and new patch sets are refused meanwhile (`Engine::patch_barrier`), so
/// the wait is bounded: a partial write to a cold block that arrives while
/// the commit (for a FUA write) waits for an older patch takes the
/// fetch-before-write path instead of making a second patch.
#[test]
fn no_patch_is_made_while_a_commit_waits_for_patches() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::Ordered, FetchMode::Lazy));
    run(&mut h, 1, write(5 * BS + 100, 0x11, 1000, false));
    assert_eq!(h.engine.stats().patches_created, 1);
    // A FUA write needs a commit: it waits for the patch, whose persisting
    // starts once the FUA write's data is in the cache.
    h.submit(2, write(20 * BS, 0x33, BS, true));
    let mut steps = 0;
    while h.engine.stats().patch_persists == 0 {
        steps += 1;
        assert!(steps < 1000, "the patch was never persisted");
        assert!(h.step(&mut |_| 0), "{}", h.engine.debug_state());
    }
    h.submit(3, write(9 * BS + 100, 0x22, 1000, false));
    h.wait(3, &mut |_| 0).result.expect("write ok");
    h.wait(2, &mut |_| 0).result.expect("FUA write ok");
    h.settle(&mut |_| 0);
    let st = h.engine.stats();
    assert_eq!(st.patches_created, 1, "{st:?}");
    assert_eq!(st.patch_persists, 1, "{st:?}");
    let mut want = vec![0u8; BS as usize];
    want[100..1100].fill(0x22);
    assert_eq!(read(&mut h, 4, 9 * BS, BS), want);
}

/// `FetchMode::Blocking` never patches: a partial write to a cold block
/// reads the block from the backing store first (fetch-before-write) and
/// its bytes go to the cache with the rest of the block.
#[test]
fn blocking_mode_fetches_before_a_partial_write() {
    for policy in [WritePolicyKind::WriteBack, WritePolicyKind::Ordered] {
        let mut h = MemHarness::new(cfg(policy, FetchMode::Blocking));
        h.backing[5 * BS as usize..6 * BS as usize].fill(0xaa);
        run(&mut h, 1, write(5 * BS + 100, 0x11, 1000, false));
        let st = h.engine.stats();
        assert_eq!(st.patches_created, 0, "{policy:?}: {st:?}");
        assert_eq!((st.fetches, st.backing_reads), (1, 1), "{policy:?}: {st:?}");
        let mut want = vec![0xaa; BS as usize];
        want[100..1100].fill(0x11);
        assert_eq!(read(&mut h, 2, 5 * BS, BS), want, "{policy:?}");
        assert_eq!(h.engine.stats().backing_reads, 1, "{policy:?}: a cache hit");
    }
}

/// The patch counters and gauges (`Stats`): a partial write to a cold block
/// makes a patch set, the next ones merge into it (overlapping bytes count
/// once in `patch_bytes`), a read one part covers is answered from RAM, a
/// read it does not cover (and a FUA write onto a set) waits for the block
/// to be brought up to date, and a full-block write over a set discards it. Under `Lazy` nothing is
/// brought up to date unasked, so each count is exact.
#[test]
fn patch_counters_follow_merges_reads_waits_and_discards() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack, FetchMode::Lazy));
    h.backing[5 * BS as usize..6 * BS as usize].fill(0xaa);
    run(&mut h, 1, write(5 * BS + 100, 0x11, 1000, false));
    run(&mut h, 2, write(5 * BS + 600, 0x22, 1000, false));
    run(&mut h, 3, write(5 * BS + 3000, 0x33, 10, false));
    run(&mut h, 4, write(9 * BS + 8, 0x44, 8, false));
    let st = h.engine.stats();
    assert_eq!((st.patches_created, st.patch_merges), (2, 2), "{st:?}");
    assert_eq!(
        (st.patched_blocks, st.patch_bytes),
        (2, 1500 + 10 + 8),
        "{st:?}"
    );
    assert_eq!(st.backing_reads, 0, "{st:?}");
    // Bytes 100..1600 of block 5 are one part: a read inside it is a hit.
    let d = read(&mut h, 5, 5 * BS + 500, 200);
    assert_eq!(&d[..100], &[0x11; 100][..]);
    assert_eq!(&d[100..], &[0x22; 100][..]);
    let st = h.engine.stats();
    assert_eq!((st.patch_reads, st.read_hits), (1, 1), "{st:?}");
    assert_eq!((st.patch_waits, st.backing_reads), (0, 0), "{st:?}");
    // A read past the part waits for the block.
    let d = read(&mut h, 6, 5 * BS + 1500, 200);
    assert_eq!(&d[..100], &[0x22; 100][..]);
    assert_eq!(&d[100..], &[0xaa; 100][..]);
    let st = h.engine.stats();
    assert_eq!((st.patch_reads, st.patch_waits), (1, 1), "{st:?}");
    assert_eq!((st.patched_blocks, st.patch_bytes), (1, 8), "{st:?}");
    // A full write over block 9's set discards it.
    run(&mut h, 7, write(9 * BS, 0x55, BS, false));
    h.settle(&mut |_| 0);
    let st = h.engine.stats();
    assert_eq!(st.patch_discards, 1, "{st:?}");
    assert_eq!((st.patched_blocks, st.patch_bytes), (0, 0), "{st:?}");
    assert_eq!(read(&mut h, 8, 9 * BS, BS), vec![0x55; BS as usize]);
    // A FUA write onto a set cannot merge: it waits for the block too.
    run(&mut h, 9, write(12 * BS + 8, 0x66, 8, false));
    run(&mut h, 10, write(12 * BS + 100, 0x77, 8, true));
    let st = h.engine.stats();
    assert_eq!((st.patches_created, st.patch_merges), (3, 2), "{st:?}");
    assert_eq!(st.patch_waits, 2, "{st:?}");
    assert_eq!((st.patched_blocks, st.patch_bytes), (0, 0), "{st:?}");
}

/// A read is answered from RAM (`patch_read`) exactly when one part covers
/// it, up to the part's first and last bytes; a read that starts before the
/// block's first part, or spans the gap between two parts, waits for the
/// block to be brought up to date and gets the backing store's bytes
/// around the parts.
#[test]
fn a_read_is_answered_from_a_patch_only_inside_one_part() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack, FetchMode::Lazy));
    h.backing[5 * BS as usize..7 * BS as usize].fill(0xaa);
    for (id, blk) in [(1, 5), (3, 6)] {
        run(&mut h, id, write(blk * BS + 100, 0x11, 1000, false));
        run(&mut h, id + 1, write(blk * BS + 2000, 0x22, 100, false));
    }
    let st = h.engine.stats();
    assert_eq!((st.patches_created, st.patched_blocks), (2, 2), "{st:?}");
    let mut id = 10;
    let mut rd = |h: &mut MemHarness, off: u64, len: u64| {
        id += 1;
        read(h, id, off, len)
    };
    // Hits: a part's last 100 bytes, its first byte, the whole second part.
    assert_eq!(rd(&mut h, 5 * BS + 1000, 100), vec![0x11; 100]);
    assert_eq!(rd(&mut h, 5 * BS + 100, 1), vec![0x11; 1]);
    assert_eq!(rd(&mut h, 5 * BS + 2000, 100), vec![0x22; 100]);
    let st = h.engine.stats();
    assert_eq!((st.patch_reads, st.patch_waits), (3, 0), "{st:?}");
    assert_eq!((st.read_hits, st.backing_reads), (3, 0), "{st:?}");
    // Waits: across the gap between block 5's parts, and before block 6's first.
    let d = rd(&mut h, 5 * BS + 1050, 1000);
    assert_eq!(&d[..50], &[0x11; 50][..]);
    assert_eq!(&d[50..950], &[0xaa; 900][..]);
    assert_eq!(&d[950..], &[0x22; 50][..]);
    let d = rd(&mut h, 6 * BS + 50, 100);
    assert_eq!(&d[..50], &[0xaa; 50][..]);
    assert_eq!(&d[50..], &[0x11; 50][..]);
    let st = h.engine.stats();
    assert_eq!((st.patch_reads, st.patch_waits), (3, 2), "{st:?}");
    assert_eq!(st.patched_blocks, 0, "{st:?}");
}

/// A FLUSH waits for every patch set older than it (by issue sequence). A
/// partial write issued before the FLUSH but held back until after it (it
/// waited for its block, busy with a write that then failed) becomes a
/// patch set older than the FLUSH: it is brought up to date at once, and
/// the FLUSH completes (under `Lazy` nothing else would bring it up to date:
/// the FLUSH would wait for it forever). One issued after the FLUSH stays a
/// patch.
#[test]
fn a_patch_issued_before_a_waiting_flush_is_brought_up_to_date_for_it() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack, FetchMode::Lazy));
    h.backing[6 * BS as usize..7 * BS as usize].fill(0xaa);
    run(&mut h, 1, write(5 * BS + 100, 0x11, 100, false));
    h.submit(2, write(6 * BS, 0x22, BS, false));
    let at = h
        .inflight()
        .iter()
        .position(|c| c.dev == Dev::Cache && matches!(c.op, IoOp::Write { .. }))
        .expect("the full write's cache write");
    h.submit(3, write(6 * BS + 100, 0x33, 100, false));
    h.submit(4, ReqOp::Flush);
    // Issued after the FLUSH: it does not wait for this one.
    h.submit(6, write(7 * BS + 100, 0x44, 100, false));
    h.complete_failed(at);
    assert_eq!(h.wait(2, &mut |_| 0).result, Err(ReqError::Io));
    h.wait(3, &mut |_| 0).result.expect("partial write ok");
    h.wait(4, &mut |_| 0).result.expect("flush ok");
    h.wait(6, &mut |_| 0).result.expect("partial write ok");
    h.settle(&mut |_| 0);
    let st = h.engine.stats();
    assert_eq!(st.patches_created, 3, "{st:?}");
    assert_eq!((st.patched_blocks, st.patch_bytes), (1, 100), "{st:?}");
    let mut want = vec![0xaa; BS as usize];
    want[100..200].fill(0x33);
    assert_eq!(read(&mut h, 5, 6 * BS, BS), want);
}

/// `AsyncBg` brings a patched block up to date in the background, at once
/// (queued, `fetch_bg_inflight` at a time: one here), and `Async` in the foreground;
/// `Lazy` leaves it a patch until something needs it.
#[test]
fn background_modes_bring_a_patch_up_to_date_unasked() {
    for (fetch, fetched) in [
        (FetchMode::Async, true),
        (FetchMode::AsyncBg, true),
        (FetchMode::Lazy, false),
    ] {
        let mut c = cfg(WritePolicyKind::WriteBack, fetch);
        c.fetch_bg_inflight = 1;
        let mut h = MemHarness::new(c);
        h.backing[5 * BS as usize..7 * BS as usize].fill(0xaa);
        // One after the other, one background fetch at a time: the second
        // must not wait for the first's background slot (`bg_inflight`).
        for (i, lbn) in [5u64, 6].into_iter().enumerate() {
            let i = i as u64 + 1;
            run(&mut h, i, write(lbn * BS + 100, 0x11, 100, false));
            h.settle(&mut |_| 0);
            let st = h.engine.stats();
            assert_eq!(st.patches_created, i, "{fetch:?}: {st:?}");
            let n = fetched as u64;
            assert_eq!(
                (st.patch_fetches, st.patched_blocks),
                (n * i, (1 - n) * i),
                "{fetch:?}: {st:?}"
            );
        }
        let mut want = vec![0xaa; BS as usize];
        want[100..200].fill(0x11);
        assert_eq!(read(&mut h, 3, 5 * BS, BS), want, "{fetch:?}");
        assert_eq!(read(&mut h, 4, 6 * BS, BS), want, "{fetch:?}");
    }
}

/// With `patch_direct` (write-back), a patched block is brought up to date
/// by writing its parts straight to the backing store (no fetch, no slot),
/// unless a read waits on it: then it is fetched, and the read answered
/// from the block brought up to date. (`Lazy`, so that nothing starts
/// before the FLUSH or the read asks.)
#[test]
fn patch_direct_writes_parts_to_the_backing_store_unless_a_read_waits() {
    let mut c = cfg(WritePolicyKind::WriteBack, FetchMode::Lazy);
    c.patch_direct = true;
    let mut h = MemHarness::new(c);
    h.backing[5 * BS as usize..7 * BS as usize].fill(0xaa);
    run(&mut h, 1, write(5 * BS + 100, 0x11, 100, false));
    run(&mut h, 2, ReqOp::Flush);
    h.settle(&mut |_| 0);
    let st = h.engine.stats();
    assert_eq!(
        (st.patch_direct_writes, st.patch_fetches, st.patched_blocks),
        (1, 0, 0),
        "{st:?}"
    );
    assert_eq!(&h.backing[5 * BS as usize + 100..][..100], &[0x11; 100][..]);
    // A read that waits for block 6's set: fetched, not written directly.
    run(&mut h, 3, write(6 * BS + 100, 0x22, 100, false));
    let mut want = vec![0xaa; BS as usize];
    want[100..200].fill(0x22);
    assert_eq!(read(&mut h, 4, 6 * BS, BS), want);
    h.settle(&mut |_| 0);
    let st = h.engine.stats();
    assert_eq!((st.patch_direct_writes, st.patch_fetches), (1, 1), "{st:?}");
}

/// Under `Lazy`, a FLUSH persists a set of one part as a partial version
/// (no fetch), but a set of two parts is fetched and applied as a whole
/// version: a partial version holds one range, and persisting the first
/// part alone would lose the second.
#[test]
fn a_flush_fetches_a_set_of_two_parts_instead_of_persisting_one() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack, FetchMode::Lazy));
    h.backing[5 * BS as usize..7 * BS as usize].fill(0xaa);
    run(&mut h, 1, write(5 * BS + 100, 0x11, 100, false));
    run(&mut h, 2, write(5 * BS + 2000, 0x22, 100, false));
    run(&mut h, 3, write(6 * BS + 100, 0x33, 100, false));
    run(&mut h, 4, ReqOp::Flush);
    h.settle(&mut |_| 0);
    let st = h.engine.stats();
    assert_eq!((st.patch_persists, st.patch_fetches), (1, 1), "{st:?}");
    assert_eq!(st.patched_blocks, 0, "{st:?}");
    h.reopen().expect("recovers");
    let mut want = vec![0xaa; BS as usize];
    want[100..200].fill(0x11);
    want[2000..2100].fill(0x22);
    assert_eq!(read(&mut h, 5, 5 * BS, BS), want);
    let mut want = vec![0xaa; BS as usize];
    want[100..200].fill(0x33);
    assert_eq!(read(&mut h, 6, 6 * BS, BS), want);
}

/// A failed fetch of a patched block keeps the patch (counted in
/// `patch_fetch_errors`), fails the read waiting on it, and is retried
/// later: the block is then brought up to date with the patch's bytes.
#[test]
fn a_failed_patch_fetch_keeps_the_patch_and_is_retried() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack, FetchMode::Lazy));
    h.backing[5 * BS as usize..6 * BS as usize].fill(0xaa);
    run(&mut h, 1, write(5 * BS + 100, 0x11, 100, false));
    h.submit(
        2,
        ReqOp::Read {
            offset: 5 * BS,
            len: BS as u32,
        },
    );
    let fetch = h
        .inflight()
        .iter()
        .position(|c| c.dev == Dev::Backing && matches!(c.op, IoOp::Read { .. }))
        .expect("the patched block's fetch");
    h.complete_failed(fetch);
    assert_eq!(h.wait(2, &mut |_| 0).result, Err(ReqError::Io));
    let st = h.engine.stats();
    assert_eq!((st.patch_fetch_errors, st.patched_blocks), (1, 1), "{st:?}");
    let mut want = vec![0xaa; BS as usize];
    want[100..200].fill(0x11);
    assert_eq!(read(&mut h, 3, 5 * BS, BS), want);
    h.settle(&mut |_| 0);
    let st = h.engine.stats();
    assert_eq!((st.patch_fetch_errors, st.patched_blocks), (1, 0), "{st:?}");
}

/// Lazy write-back patch cleaning (patch RAM over `patch_clean_at`) writes
/// a set's part straight to the backing store once free slots beyond those
/// promised fall below an eighth of the cache (`write_patch_directly`), and
/// persists it as a partial version above that: with 60 sets on 64 slots
/// (4 free, 60 promised) and with 29 (35 free: below 29 + 64 / 8, not
/// below 29) cleaning writes directly; with 8 sets (56 free, 8 promised:
/// 56 is not below 8 + 64 / 8) it persists.
#[test]
fn patch_cleaning_writes_directly_only_when_slots_run_short() {
    for (n, direct) in [(60u64, true), (29, true), (8, false)] {
        let mut c = cfg(WritePolicyKind::WriteBack, FetchMode::Lazy);
        c.patch_mem_bytes = n * 1024;
        c.patch_clean_at = 0.0;
        let mut h = MemHarness::new(c);
        h.backing.fill(0xaa);
        for i in 0..n {
            h.submit(i + 1, write(i * BS + 1024, i as u8, 1024, false));
        }
        for i in 0..n {
            h.wait(i + 1, &mut |_| 0).result.expect("write ok");
        }
        h.settle(&mut |_| 0);
        let st = h.engine.stats();
        assert_eq!(st.patches_created, n, "{n}: {st:?}");
        if direct {
            assert!(st.patch_direct_writes > 0, "{n}: {st:?}");
        } else {
            assert_eq!(st.patch_direct_writes, 0, "{n}: {st:?}");
            assert!(st.patch_persists > 0, "{n}: {st:?}");
        }
        for i in 0..n {
            let got = read(&mut h, 1000 + i, i * BS, BS);
            let mut want = vec![0xaa; BS as usize];
            want[1024..2048].fill(i as u8);
            assert!(got == want, "{n}: block {i}");
        }
    }
}

/// The backing writes in flight, by index in `inflight()`.
fn backing_writes(h: &mut MemHarness) -> Vec<usize> {
    h.inflight()
        .iter()
        .enumerate()
        .filter(|(_, c)| c.dev == Dev::Backing && matches!(c.op, IoOp::Write { .. }))
        .map(|(i, _)| i)
        .collect()
}

/// With `patch_direct`, a set of two parts goes out as two backing writes;
/// the set goes only when both are done. One failing keeps it (its bytes
/// are not on the backing store), fails the FLUSH that waited for it, and
/// is retried `retry_ns` later: both parts then reach the backing store.
#[test]
fn a_failed_direct_patch_write_keeps_the_set_fails_the_flush_and_is_retried() {
    let mut c = cfg(WritePolicyKind::WriteBack, FetchMode::Lazy);
    c.patch_direct = true;
    let retry = c.retry_ns;
    let mut h = MemHarness::new(c);
    h.backing[5 * BS as usize..6 * BS as usize].fill(0xaa);
    run(&mut h, 1, write(5 * BS + 100, 0x11, 100, false));
    run(&mut h, 2, write(5 * BS + 2000, 0x22, 100, false));
    h.submit(3, ReqOp::Flush);
    let w = backing_writes(&mut h);
    assert_eq!(w.len(), 2, "{:?}", h.inflight());
    // The first part's write succeeds: the set stays for the second.
    h.step(&mut |_| w[0]);
    assert_eq!(h.engine.stats().patched_blocks, 1);
    let w = backing_writes(&mut h);
    assert_eq!(w.len(), 1);
    h.complete_failed(w[0]);
    let t = h.now;
    let r = h
        .replies
        .iter()
        .position(|r| r.id == 3)
        .expect("the FLUSH failed at once");
    assert_eq!(h.replies.remove(r).result, Err(ReqError::Io));
    let st = h.engine.stats();
    assert_eq!(
        (st.patched_blocks, st.patch_direct_writes),
        (1, 1),
        "{st:?}"
    );
    assert!(backing_writes(&mut h).is_empty());
    assert_eq!(h.engine.poll_timeout(), Some(t + retry), "the retry");
    h.now = t + retry;
    h.engine.handle_timeout(h.now);
    h.settle(&mut |_| 0);
    let st = h.engine.stats();
    assert_eq!(
        (st.patched_blocks, st.patch_direct_writes),
        (0, 2),
        "{st:?}"
    );
    let mut want = vec![0xaa; BS as usize];
    want[100..200].fill(0x11);
    want[2000..2100].fill(0x22);
    assert_eq!(&h.backing[5 * BS as usize..6 * BS as usize], &want[..]);
    run(&mut h, 4, ReqOp::Flush);
    assert_eq!(read(&mut h, 5, 5 * BS, BS), want);
}

/// `AsyncBg` with `patch_direct`: the background queue writes each set's
/// parts directly, `fetch_bg_inflight` (one) at a time, and goes on to
/// the next set when one is done, until none is left.
#[test]
fn background_direct_patch_writes_run_one_after_another_until_none_is_left() {
    let mut c = cfg(WritePolicyKind::WriteBack, FetchMode::AsyncBg);
    c.patch_direct = true;
    c.fetch_bg_inflight = 1;
    let mut h = MemHarness::new(c);
    h.backing[..8 * BS as usize].fill(0xaa);
    for lbn in 0..4u64 {
        h.submit(lbn + 1, write(lbn * BS + 100, 0x10 + lbn as u8, 100, false));
    }
    assert_eq!(backing_writes(&mut h).len(), 1, "one at a time");
    h.settle(&mut |_| 0);
    let st = h.engine.stats();
    assert_eq!(
        (
            st.patches_created,
            st.patch_direct_writes,
            st.patched_blocks
        ),
        (4, 4, 0),
        "{st:?}"
    );
    for lbn in 0..4u64 {
        let mut want = vec![0xaa; BS as usize];
        want[100..200].fill(0x10 + lbn as u8);
        assert_eq!(
            &h.backing[(lbn * BS) as usize..((lbn + 1) * BS) as usize],
            &want[..]
        );
    }
}

/// The index in `inflight()` of the backing read of block `lbn`.
fn fetch_of(h: &mut MemHarness, lbn: u64) -> usize {
    h.inflight()
        .iter()
        .position(|c| {
            c.dev == Dev::Backing && matches!(c.op, IoOp::Read { offset, .. } if offset == lbn * BS)
        })
        .expect("the block's fetch")
}

/// A failed fetch fails only the FLUSHes that wait for its set: a set
/// made after the FLUSH arrived (with the sequence number the FLUSH noted)
/// failing leaves the FLUSH waiting for the older set, and it succeeds.
#[test]
fn a_failed_fetch_of_a_set_newer_than_a_flush_does_not_fail_the_flush() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack, FetchMode::Lazy));
    h.backing[5 * BS as usize..7 * BS as usize].fill(0xaa);
    // Two parts: the FLUSH fetches the set (`Lazy` persists only one).
    run(&mut h, 1, write(5 * BS + 100, 0x11, 100, false));
    run(&mut h, 7, write(5 * BS + 2000, 0x11, 100, false));
    h.submit(2, ReqOp::Flush);
    fetch_of(&mut h, 5);
    // A partial write after the FLUSH: a new set, left a patch.
    run(&mut h, 3, write(6 * BS + 100, 0x22, 100, false));
    assert_eq!(h.engine.stats().patched_blocks, 2);
    // A read of it fetches it; that fetch fails, and so does the read.
    h.submit(
        4,
        ReqOp::Read {
            offset: 6 * BS,
            len: BS as u32,
        },
    );
    let b = fetch_of(&mut h, 6);
    h.complete_failed(b);
    assert!(h.replies.iter().all(|r| r.id != 2), "the FLUSH failed");
    assert_eq!(h.wait(4, &mut |_| 0).result, Err(ReqError::Io));
    assert_eq!(h.wait(2, &mut |_| 0).result, Ok(None), "the FLUSH");
    h.settle(&mut |_| 0);
    let mut want = vec![0xaa; BS as usize];
    want[100..200].fill(0x11);
    want[2000..2100].fill(0x11);
    assert_eq!(read(&mut h, 5, 5 * BS, BS), want);
    let mut want = vec![0xaa; BS as usize];
    want[100..200].fill(0x22);
    assert_eq!(read(&mut h, 6, 6 * BS, BS), want);
}

/// Under journaled, a full write that supersedes a patch of its own
/// transaction discards the set and tells the policy the patch is done
/// (`on_patch_done`): the transaction then closes, and a drain destages
/// it. (Ordered never discards a patch of a node: `keep_superseded`.)
#[test]
fn a_superseded_patch_lets_its_transaction_complete() {
    for policy in [WritePolicyKind::Journaled, WritePolicyKind::JournaledHints] {
        let mut h = MemHarness::new(cfg(policy, FetchMode::Lazy));
        h.backing[5 * BS as usize..6 * BS as usize].fill(0xaa);
        run(&mut h, 1, write(5 * BS + 100, 0x11, 100, false));
        assert_eq!(h.engine.stats().patched_blocks, 1, "{policy}");
        run(&mut h, 2, write(5 * BS, 0x22, BS, false));
        let st = h.engine.stats();
        assert_eq!(
            (st.patch_discards, st.patched_blocks),
            (1, 0),
            "{policy}: {st:?}"
        );
        run(&mut h, 3, ReqOp::Flush);
        h.engine.start_drain(h.now);
        h.settle(&mut |_| 0);
        assert_eq!(h.engine.dirty_versions(), 0, "{policy}");
        assert_eq!(
            &h.backing[5 * BS as usize..6 * BS as usize],
            &[0x22; BS as usize][..],
            "{policy}"
        );
    }
}

/// Patch cleaning starts once patch RAM is above `patch_clean_at` of
/// `patch_mem_bytes` (here half of 2048 bytes), not at it.
#[test]
fn patch_cleaning_starts_above_its_mark_not_at_it() {
    let mut c = cfg(WritePolicyKind::WriteBack, FetchMode::Lazy);
    c.patch_mem_bytes = 2048;
    c.patch_clean_at = 0.5;
    let mut h = MemHarness::new(c);
    h.backing[..8 * BS as usize].fill(0xaa);
    run(&mut h, 1, write(5 * BS + 1024, 0x11, 1024, false));
    h.settle(&mut |_| 0);
    let st = h.engine.stats();
    assert_eq!(
        (st.patch_bytes, st.patched_blocks),
        (1024, 1),
        "at the mark: {st:?}"
    );
    run(&mut h, 2, write(6 * BS + 7, 0x22, 1, false));
    h.settle(&mut |_| 0);
    let st = h.engine.stats();
    assert_eq!(
        (st.patch_bytes, st.patched_blocks),
        (0, 0),
        "above it: {st:?}"
    );
    let mut want = vec![0xaa; BS as usize];
    want[1024..2048].fill(0x11);
    assert_eq!(read(&mut h, 3, 5 * BS, BS), want);
    let mut want = vec![0xaa; BS as usize];
    want[7] = 0x22;
    assert_eq!(read(&mut h, 4, 6 * BS, BS), want);
}

/// Patch cleaning queues at most `fetch_bg_inflight` sets ahead: with
/// patch RAM over its mark it queues the oldest sets (fetched: two parts
/// each, as `Lazy` persists a set of one part at once) until that many
/// wait, and once the RAM falls back under the mark the newer sets stay
/// patches. Sets of 599 bytes, the last one taking the RAM over the mark
/// (half of `patch_mem_bytes`); cleaning goes on until the first set is
/// installed. One at a time with six sets, three are queued by then (the
/// first, the second while the first is fetched, the third while it is
/// installed) and three stay; two at a time with twelve, six stay.
#[test]
fn patch_cleaning_queues_no_more_sets_than_it_may_run() {
    for (limit, sets, left) in [(1u32, 6u64, 3u64), (2, 12, 6)] {
        let mut c = cfg(WritePolicyKind::WriteBack, FetchMode::Lazy);
        c.patch_mem_bytes = 2 * 599 * sets - 188;
        c.patch_clean_at = 0.5;
        c.fetch_bg_inflight = limit;
        let mut h = MemHarness::new(c);
        h.backing[..32 * BS as usize].fill(0xaa);
        for lbn in 5..5 + sets {
            run(&mut h, lbn, write(lbn * BS + 1000, lbn as u8, 300, false));
            run(
                &mut h,
                20 + lbn,
                write(lbn * BS + 1301, lbn as u8, 299, false),
            );
        }
        h.settle(&mut |_| 0);
        let st = h.engine.stats();
        assert_eq!(
            (st.patches_created, st.patched_blocks, st.patch_bytes),
            (sets, left, left * 599),
            "{limit}: {st:?}"
        );
        for lbn in 5..5 + sets {
            let mut want = vec![0xaa; BS as usize];
            want[1000..1300].fill(lbn as u8);
            want[1301..1600].fill(lbn as u8);
            assert_eq!(read(&mut h, 100 + lbn, lbn * BS, BS), want, "{limit}");
        }
    }
}

/// A set queued for the background that a read brings up to date first
/// (in the foreground) is skipped when the queue reaches it: one fetch.
#[test]
fn a_queued_set_a_read_fetched_meanwhile_is_not_fetched_again() {
    let mut c = cfg(WritePolicyKind::WriteBack, FetchMode::AsyncBg);
    c.fetch_bg_inflight = 1;
    let mut h = MemHarness::new(c);
    h.backing[..8 * BS as usize].fill(0xaa);
    h.submit(1, write(5 * BS + 100, 0x11, 100, false));
    h.submit(2, write(6 * BS + 100, 0x22, 100, false));
    // Block 5's set is fetched in the background; block 6's waits queued.
    assert_eq!(h.engine.stats().patch_fetches, 1);
    h.submit(
        3,
        ReqOp::Read {
            offset: 6 * BS,
            len: BS as u32,
        },
    );
    assert_eq!(h.engine.stats().patch_fetches, 2, "the read's fetch");
    h.settle(&mut |_| 0);
    let st = h.engine.stats();
    assert_eq!((st.patch_fetches, st.patched_blocks), (2, 0), "{st:?}");
    let mut want = vec![0xaa; BS as usize];
    want[100..200].fill(0x22);
    let r = h.replies.iter().position(|r| r.id == 3).expect("the read");
    assert_eq!(h.replies.remove(r).result, Ok(Some(Bytes::from(want))));
}
