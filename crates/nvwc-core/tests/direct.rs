//! Direct writes (`engine/direct.rs`): a whole-block write whose payload the
//! driver places on the cache device itself. Taken: one part per block in
//! payload order, the data reads back, survives a restart after a FLUSH and
//! reaches the backing store on a drain, in place or not. Declined (nothing
//! changed): when any condition fails.

use bytes::Bytes;
use nvwc_core::testkit::MemHarness;
use nvwc_core::*;

const BS: u64 = 4096;

fn cfg(policy: WritePolicyKind) -> Config {
    Config::new(BS as u32, 64, 1024 * BS, policy)
}

fn data(seed: u8, blocks: u64) -> Bytes {
    Bytes::from(
        (0..blocks * BS)
            .map(|i| seed.wrapping_add((i / 512) as u8).wrapping_mul(31) ^ (i as u8))
            .collect::<Vec<u8>>(),
    )
}

fn run(h: &mut MemHarness, id: ReqId, op: ReqOp<Bytes>) -> Option<Bytes> {
    h.submit(id, op);
    h.wait(id, &mut |_| 0).result.expect("request failed")
}

fn read(h: &mut MemHarness, id: ReqId, offset: u64, len: u64) -> Bytes {
    run(
        h,
        id,
        ReqOp::Read {
            offset,
            len: len as u32,
        },
    )
    .expect("read data")
}

/// Offer a direct write; it must be taken. Returns its parts.
fn direct(h: &mut MemHarness, id: ReqId, offset: u64, d: &Bytes) -> Vec<DirectPart> {
    let parts = h
        .submit_direct(id, offset, d.clone(), false)
        .expect("direct write declined");
    let r = h.wait(id, &mut |n| n - 1);
    r.result.expect("direct write failed");
    parts
}

#[test]
fn direct_writes_read_back_survive_restart_and_destage() {
    let policies = [
        (WritePolicyKind::WriteBack, false),
        (WritePolicyKind::WriteBack, true),
        (WritePolicyKind::Ordered, false),
        (WritePolicyKind::Journaled, false),
        (WritePolicyKind::JournaledHints, false),
    ];
    for (policy, in_place) in policies {
        let ctx = format!("{policy:?} rewrite_in_place={in_place}");
        let mut c = cfg(policy);
        c.rewrite_in_place = in_place;
        let mut h = MemHarness::new(c);
        let (off, n) = (8 * BS, 4);
        let d1 = data(1, n);
        let parts = direct(&mut h, 1, off, &d1);
        assert_eq!(parts.len(), n as usize, "{ctx}");
        for (i, p) in parts.iter().enumerate() {
            assert_eq!((p.payload_offset, p.len), (i as u64 * BS, BS), "{ctx}");
        }
        assert_eq!(read(&mut h, 2, off, n * BS), d1, "{ctx}");
        // Commit it, then rewrite the middle two blocks directly.
        run(&mut h, 3, ReqOp::Flush);
        let d2 = data(2, 2);
        direct(&mut h, 4, off + BS, &d2);
        let want: Vec<u8> = [&d1[..BS as usize], &d2[..], &d1[3 * BS as usize..]].concat();
        assert_eq!(read(&mut h, 5, off, n * BS), want, "{ctx}");
        assert_eq!(h.engine.stats().direct_writes, 2, "{ctx}");
        // Durable after a FLUSH, across a restart.
        run(&mut h, 6, ReqOp::Flush);
        h.reopen().expect("recover");
        assert_eq!(read(&mut h, 7, off, n * BS), want, "{ctx}");
        // And on the backing store once drained.
        h.engine.start_drain(h.now);
        h.settle(&mut |_| 0);
        assert_eq!(h.engine.dirty_versions(), 0, "{ctx}");
        assert_eq!(
            &h.backing[off as usize..(off + n * BS) as usize],
            &want[..],
            "{ctx}"
        );
    }
}

#[test]
fn direct_writes_are_declined_without_any_change() {
    let declined = |h: &mut MemHarness, id: ReqId, offset: u64, len: u64, why: &str| {
        let before = h.engine.stats();
        assert!(
            h.submit_direct(
                id,
                offset,
                data(9, len.div_ceil(BS)).slice(..len as usize),
                false
            )
            .is_none(),
            "{why}: taken"
        );
        assert_eq!(h.engine.stats(), before, "{why}: the engine changed");
        assert!(h.engine.poll_io().is_none(), "{why}: a command came out");
    };
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack));
    declined(&mut h, 1, BS + 512, BS, "unaligned offset");
    declined(&mut h, 1, BS, BS / 2, "part of a block");
    declined(&mut h, 1, 1024 * BS, BS, "past the end");
    // A block with a write in progress (its cache write not completed).
    h.submit(
        1,
        ReqOp::Write {
            offset: 5 * BS,
            data: data(3, 1),
            fua: false,
        },
    );
    assert!(!h.inflight().is_empty());
    declined(&mut h, 2, 4 * BS, 2 * BS, "a block in progress");
    h.wait(1, &mut |_| 0);
    // A patched block (lazy fetch: a partial write to an uncached block).
    let mut c = cfg(WritePolicyKind::WriteBack);
    c.fetch = FetchMode::Lazy;
    let mut h = MemHarness::new(c);
    run(
        &mut h,
        1,
        ReqOp::Write {
            offset: 20 * BS + 100,
            data: Bytes::from(vec![7u8; 200]),
            fua: false,
        },
    );
    assert_eq!(h.engine.stats().patches_created, 1);
    declined(&mut h, 2, 20 * BS, BS, "a patched block");
    // Policies that need the bytes themselves.
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteThrough));
    declined(&mut h, 1, 0, BS, "write-through");
    let mut c = cfg(WritePolicyKind::WriteBack);
    c.admission = AdmissionKind::Critical;
    let mut h = MemHarness::new(c);
    declined(&mut h, 1, 0, BS, "admission other than all");
    // More blocks than half the cache.
    let mut h = MemHarness::new(cfg(WritePolicyKind::Ordered));
    declined(&mut h, 1, 0, 200 * BS, "too large");
}

/// A cache full of clean blocks makes room by evicting, as the buffered
/// path does: blocks no commit names free their slots at once; committed
/// ones free theirs at the next commit, and until then the write is
/// declined (the buffered path would wait for that commit).
#[test]
fn direct_writes_evict_clean_blocks_for_room() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack));
    for i in 0..14u64 {
        let op = ReqOp::Write {
            offset: i * 4 * BS,
            data: data(i as u8, 4),
            fua: false,
        };
        run(&mut h, 1 + i, op);
    }
    // Everything clean and committed; the cache nearly full.
    h.engine.start_drain(h.now);
    h.settle(&mut |_| 0);
    h.engine.end_drain();
    run(&mut h, 50, ReqOp::Flush);
    let st = h.engine.stats();
    assert_eq!((st.dirty_blocks, st.cached_blocks), (0, 56), "{st:?}");
    assert!(st.free_slots < 16);
    let d = data(60, 16);
    assert!(h.submit_direct(100, 900 * BS, d.clone(), false).is_none());
    assert!(h.engine.stats().evictions > st.evictions, "no eviction");
    // Evicted until the free slots and those the next commit frees reach
    // the write's 16 plus the free reserve (8).
    assert_eq!(
        h.engine.stats().evictions - st.evictions,
        16 + 8 - st.free_slots,
        "evictions"
    );
    assert!(h.engine.poll_io().is_none());
    // The commit that frees the evicted slots; then it is taken.
    run(&mut h, 101, ReqOp::Flush);
    let parts = direct(&mut h, 102, 900 * BS, &d);
    assert_eq!(parts.len(), 16);
    assert_eq!(read(&mut h, 103, 900 * BS, 16 * BS), d);
    for i in 0..14u64 {
        assert_eq!(read(&mut h, 200 + i, i * 4 * BS, 4 * BS), data(i as u8, 4));
    }
}

/// Offer a direct write that must be declined, changing nothing.
fn declined(h: &mut MemHarness, id: ReqId, offset: u64, len: u64, why: &str) {
    let before = h.engine.stats();
    let queued = h.inflight().len();
    assert!(
        h.submit_direct(
            id,
            offset,
            data(9, len.div_ceil(BS)).slice(..len as usize),
            false
        )
        .is_none(),
        "{why}: taken"
    );
    assert_eq!(h.engine.stats(), before, "{why}: the engine changed");
    assert_eq!(h.inflight().len(), queued, "{why}: a command came out");
}

/// Writes the engine would not run at once as plain cache writes are
/// declined: one of no bytes, one during a clean stop (it would fail), and
/// one while a warm restart's clean-shutdown record is still the durable
/// one (it would be held until the commit that ends that).
#[test]
fn direct_writes_are_declined_empty_stopping_or_held() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack));
    declined(&mut h, 1, 0, 0, "no bytes");
    declined(&mut h, 1, BS, 0, "no bytes at a block");
    // Warm restart: a clean stop, then a start that vouches for it.
    run(
        &mut h,
        2,
        ReqOp::Write {
            offset: 0,
            data: data(1, 1),
            fua: false,
        },
    );
    h.engine.start_shutdown(h.now);
    declined(&mut h, 3, 2 * BS, BS, "stopping");
    h.settle(&mut |_| 0);
    assert!(h.engine.is_idle());
    assert!(h.reopen().expect("recover").clean_shutdown);
    declined(&mut h, 4, 2 * BS, BS, "warm restart not yet ended");
    // Once a commit ends it, direct writes go again.
    run(&mut h, 5, ReqOp::Flush);
    let d = data(2, 1);
    direct(&mut h, 6, 2 * BS, &d);
    assert_eq!(read(&mut h, 7, 2 * BS, BS), d);
    assert_eq!(read(&mut h, 8, 0, BS), data(1, 1));
}

/// A direct write's pieces all start at once: it is taken while the
/// pieces in progress leave room for all of its own (`max_active`: a
/// quarter of the cache's slots, 16 here) and declined otherwise.
#[test]
fn direct_writes_are_declined_when_their_pieces_could_not_all_start() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack));
    // A buffered write of 15 blocks, its cache writes not completed.
    let d0 = data(1, 15);
    h.submit(
        1,
        ReqOp::Write {
            offset: 0,
            data: d0.clone(),
            fua: false,
        },
    );
    assert_eq!(h.inflight().len(), 15);
    // One more block fits: 16 in progress.
    let d1 = data(2, 1);
    let parts = h
        .submit_direct(2, 100 * BS, d1.clone(), false)
        .expect("the 16th piece is declined");
    assert_eq!(parts.len(), 1);
    // A 17th does not.
    declined(&mut h, 3, 101 * BS, BS, "a 17th piece in progress");
    declined(&mut h, 3, 102 * BS, 2 * BS, "17 and 18 in progress");
    h.wait(1, &mut |_| 0).result.expect("write");
    h.wait(2, &mut |_| 0).result.expect("direct write");
    assert_eq!(read(&mut h, 4, 0, 15 * BS), d0);
    assert_eq!(read(&mut h, 5, 100 * BS, BS), d1);
}

/// A write that waits for admission (its slots not free) holds back every
/// later write: a direct write of a block for which a slot is free is
/// declined while it waits.
#[test]
fn direct_writes_are_declined_behind_a_write_waiting_for_admission() {
    let mut c = Config::new(BS as u32, 16, 1024 * BS, WritePolicyKind::WriteBack);
    c.free_reserve = 0;
    c.watermarks = Watermarks {
        high: 1.0,
        low: 1.0,
    };
    let mut h = MemHarness::new(c);
    for b in 0..12u64 {
        run(
            &mut h,
            10 + b,
            ReqOp::Write {
                offset: b * BS,
                data: data(b as u8, 1),
                fua: false,
            },
        );
    }
    let st = h.engine.stats();
    assert_eq!((st.free_slots, st.dirty_blocks), (4, 12), "{st:?}");
    // Eight new blocks: four slots free, so it waits.
    h.submit(
        1,
        ReqOp::Write {
            offset: 100 * BS,
            data: data(50, 8),
            fua: false,
        },
    );
    assert_eq!(h.engine.stats().admission_stalls, 1);
    assert!(h.engine.stats().free_slots >= 1);
    declined(&mut h, 2, 200 * BS, BS, "a write waits for admission");
    h.wait(1, &mut |_| 0).result.expect("the waiting write");
    assert_eq!(read(&mut h, 3, 100 * BS, 8 * BS), data(50, 8));
}

/// Under a bounded journal a direct write needs room in it for every block
/// (else its buffered form would wait for a checkpoint).
#[test]
fn direct_writes_are_declined_when_the_journal_bound_is_reached() {
    let mut c = cfg(WritePolicyKind::Journaled);
    c.journal.size_blocks = 8;
    c.journal.checkpoint_delay_ns = 3_600_000_000_000;
    let mut h = MemHarness::new(c);
    let d = data(1, 7);
    direct(&mut h, 1, 0, &d);
    run(&mut h, 2, ReqOp::Flush);
    assert_eq!(h.engine.journal_blocks(), 7);
    declined(&mut h, 3, 50 * BS, 2 * BS, "two blocks past the bound");
    let d2 = data(2, 1);
    direct(&mut h, 4, 50 * BS, &d2);
    assert_eq!(h.engine.journal_blocks(), 8);
    declined(&mut h, 5, 60 * BS, BS, "a block past the bound");
    assert_eq!(read(&mut h, 6, 0, 7 * BS), d);
    assert_eq!(read(&mut h, 7, 50 * BS, BS), d2);
}

/// Clean blocks no commit names (read fills) free their slots as soon as
/// they are evicted: a direct write into a cache full of them evicts just
/// the slots it needs (no free reserve here) and is taken.
#[test]
fn a_direct_write_evicts_just_its_slots_from_a_cache_full_of_fills() {
    let mut c = cfg(WritePolicyKind::WriteBack);
    c.free_reserve = 0;
    let mut h = MemHarness::new(c);
    for i in 0..64u64 {
        read(&mut h, 1 + i, i * BS, BS);
    }
    let st = h.engine.stats();
    assert_eq!((st.dirty_blocks, st.free_slots), (0, 0), "{st:?}");
    let d = data(60, 4);
    let parts = direct(&mut h, 100, 900 * BS, &d);
    assert_eq!(parts.len(), 4);
    assert_eq!(h.engine.stats().evictions - st.evictions, 4, "evictions");
    assert_eq!(read(&mut h, 101, 900 * BS, 4 * BS), d);
}

/// While cleaning is paced (writes went around the full cache within the
/// last second), a write of new blocks leaves the free reserve and the
/// slots evicted ahead of it (`full_keep`: 16 here) to writes that cannot
/// go around: a direct write is taken only with that many free slots to
/// spare, else its buffered form would go around the cache.
#[test]
fn a_paced_cache_keeps_its_reserve_from_direct_writes() {
    let mut c = Config::new(BS as u32, 64, 4096 * BS, WritePolicyKind::WriteBack);
    c.bypass_when_full = true;
    c.full_clean_secs = 40;
    c.watermarks = Watermarks {
        high: 0.0,
        low: 0.0,
    };
    let mut h = MemHarness::new(c);
    let quiesce = |h: &mut MemHarness| {
        while !h.inflight().is_empty() {
            h.step(&mut |_| 0);
        }
    };
    for i in 0..96u64 {
        h.submit(
            1 + i,
            ReqOp::Write {
                offset: i * BS,
                data: data(i as u8, 1),
                fua: false,
            },
        );
    }
    quiesce(&mut h);
    let st = h.engine.stats();
    assert!(st.full_bypassed_writes > 0, "{st:?}");
    assert!(h.now < 1_000_000_000, "the pacing window is one second");
    assert_eq!((st.free_slots, st.dirty_blocks), (16, 0), "{st:?}");
    // 16 free and one clean block evicted at once (no commit names it yet):
    // 17, the block plus the 16 kept.
    let d = data(200, 1);
    let parts = h
        .submit_direct(500, 900 * BS, d.clone(), false)
        .expect("declined with 17 free");
    assert_eq!(parts.len(), 1);
    assert_eq!(h.engine.stats().evictions, st.evictions + 1, "evictions");
    quiesce(&mut h);
    // After a commit the evicted block's slot waits for the next one: 16
    // free, one short.
    h.submit(600, ReqOp::Flush);
    quiesce(&mut h);
    assert!(h.now < 1_000_000_000);
    let st = h.engine.stats();
    assert_eq!(st.free_slots, 16, "{st:?}");
    assert!(h
        .submit_direct(501, 901 * BS, data(201, 1), false)
        .is_none());
    assert!(h.inflight().is_empty());
    let st2 = h.engine.stats();
    assert_eq!(st2.direct_writes, st.direct_writes);
    // Its buffered form goes around the cache.
    h.submit(
        502,
        ReqOp::Write {
            offset: 901 * BS,
            data: data(201, 1),
            fua: false,
        },
    );
    quiesce(&mut h);
    assert_eq!(
        h.engine.stats().full_bypassed_writes,
        st2.full_bypassed_writes + 1
    );
    assert_eq!(
        read(&mut h, 503, 900 * BS, 2 * BS),
        [&d[..], &data(201, 1)[..]].concat()
    );
}
