//! Destage plans in flight (`engine/destage.rs`): the destage limit, and
//! ordered's pipelined waves (a wave planned while the wave before waits for
//! its backing FLUSH, its writes held until that wave ends). Mutation
//! testing (`scripts/mutants.sh`) found these unchecked by the other tests
//! (the VOPR exercises them, but not to the count).

use bytes::Bytes;
use nvwc_core::testkit::MemHarness;
use nvwc_core::*;

const BS: u64 = 4096;

fn harness(policy: WritePolicyKind, limit: u32) -> MemHarness {
    let mut c = Config::new(BS as u32, 32, 128 * BS, policy);
    // Clean from the first dirty block on.
    c.watermarks = Watermarks {
        high: 0.0,
        low: 0.0,
    };
    c.max_destage_inflight = limit;
    MemHarness::new(c)
}

fn write(lbn: u64, byte: u8) -> ReqOp<Bytes> {
    ReqOp::Write {
        offset: lbn * BS,
        data: Bytes::from(vec![byte; BS as usize]),
        fua: false,
    }
}

fn is_backing_write(c: &IoCmd<Bytes>) -> bool {
    c.dev == Dev::Backing && matches!(c.op, IoOp::Write { .. })
}

/// Complete every command in flight but backing writes, oldest first, until
/// only backing writes are left (timers fire when nothing else can run);
/// returns the most backing writes seen in flight at once.
fn run_holding_backing_writes(h: &mut MemHarness) -> usize {
    let mut most = 0;
    let mut idle = 0;
    for _ in 0..100_000 {
        let cmds: Vec<IoCmd<Bytes>> = h.inflight().iter().cloned().collect();
        most = most.max(cmds.iter().filter(|c| is_backing_write(c)).count());
        match cmds.iter().position(|c| !is_backing_write(c)) {
            Some(i) => {
                idle = 0;
                h.step(&mut |_| i);
            }
            None if idle < 3 => {
                idle += 1;
                h.now += 1_000_000_000;
                h.engine.handle_timeout(h.now);
            }
            None => return most,
        }
    }
    panic!("never quiet: {}", h.engine.debug_state());
}

fn counter(h: &MemHarness, name: &str) -> u64 {
    h.engine
        .policy_counters()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no counter {name}"))
}

/// Write-back keeps at most `max_destage_inflight` destage copies in flight
/// (`View::destage_in_flight`, `View::destage_limit`): with a limit of 2
/// and eight dirty blocks (not contiguous: one backing write per copy), no
/// more than 2 backing writes are ever in flight, and 2 are at once, while
/// cache commands complete first (destage writes pile up if allowed).
#[test]
fn write_back_keeps_the_destage_limit_of_copies_in_flight() {
    let mut h = harness(WritePolicyKind::WriteBack, 2);
    for i in 0..8u64 {
        h.submit(i + 1, write(2 * i, i as u8 + 1));
    }
    let mut most = 0;
    for _ in 0..100 {
        most = most.max(run_holding_backing_writes(&mut h));
        if !h.step(&mut |_| 0) {
            break;
        }
    }
    h.settle(&mut |_| 0);
    assert_eq!(h.replies.len(), 8, "every write acknowledged");
    assert_eq!(h.engine.stats().destaged_blocks, 8, "every block destaged");
    assert_eq!(most, 2, "destage writes in flight at most");
}

/// Ordered pipelines a wave behind the wave in flight once that wave has
/// written all its copies (`View::copies_pending`): block 0's wave writes
/// while block 1 (written after block 0 completed: it depends on it) is
/// acknowledged; only when block 0's backing write is done does block 1's
/// wave start, pipelined behind block 0's backing FLUSH.
#[test]
fn ordered_pipelines_a_wave_once_the_wave_in_flight_has_written_its_copies() {
    let mut h = harness(WritePolicyKind::Ordered, 16);
    h.submit(1, write(0, 1));
    run_holding_backing_writes(&mut h);
    assert!(h.replies.iter().any(|r| r.id == 1), "block 0 acknowledged");
    assert_eq!(h.engine.stats().destage_plans, 1, "block 0's wave");
    h.submit(2, write(1, 2));
    run_holding_backing_writes(&mut h);
    assert!(h.replies.iter().any(|r| r.id == 2), "block 1 acknowledged");
    assert_eq!(
        h.engine.stats().destage_plans,
        1,
        "no wave while block 0's copy is unwritten"
    );
    assert_eq!(counter(&h, "ordered_waves_pipelined"), 0);
    h.settle(&mut |_| 0);
    assert_eq!(counter(&h, "ordered_waves_pipelined"), 1, "block 1's wave");
    assert_eq!(h.engine.stats().destaged_blocks, 2);
    assert_eq!(&h.backing[..BS as usize], &[1u8; BS as usize][..]);
    assert_eq!(
        &h.backing[BS as usize..2 * BS as usize],
        &[2u8; BS as usize][..]
    );
}

/// A write-back cache of 32 slots after 40 one-block writes of `byte(lbn)`
/// and a settle: every block destaged, 24 clean blocks cached, the 8 slots
/// of the free reserve free.
fn full_of_clean_blocks(byte: impl Fn(u64) -> u8) -> MemHarness {
    let mut h = harness(WritePolicyKind::WriteBack, 16);
    for lbn in 0..40u64 {
        h.submit(lbn + 1, write(lbn, byte(lbn)));
        h.wait(lbn + 1, &mut |_| 0).result.unwrap();
    }
    h.settle(&mut |_| 0);
    let st = h.engine.stats();
    assert_eq!(
        (st.free_slots, st.cached_blocks, st.dirty_blocks),
        (8, 24, 0)
    );
    h
}

/// A full cache of clean blocks evicts room for every write waiting for
/// admission at once (`Engine::ensure_free`: the writes queued behind the
/// first count too, up to `max_destage_inflight` slots), so that one
/// commit frees room for all of them. Twelve one-block writes arrive at a
/// cache of 24 clean blocks and 8 free slots (the reserve): 8 take the free
/// slots, 4 wait; 12 blocks are evicted, the reserve's 8 and one for each
/// waiting write (9 if only the first waiting write counted; every clean
/// block if the count ran away).
#[test]
fn a_full_cache_evicts_room_for_every_queued_write_at_once() {
    let mut h = full_of_clean_blocks(|_| 1);
    let st = h.engine.stats();
    for i in 0..12u64 {
        h.submit(100 + i, write(60 + i, 2));
    }
    assert_eq!(h.engine.stats().evictions - st.evictions, 12);
    h.settle(&mut |_| 0);
    assert_eq!(h.replies.iter().filter(|r| r.id >= 100).count(), 12);
}

/// While writes go around a full write-back cache and cleaning is paced
/// (`Config::full_clean_secs`), clean blocks are evicted ahead: the reserve
/// (8 slots) and a reserve's worth more (`Engine::reclaim_ahead`), so that
/// one commit frees several slots for the writes that cannot go around.
/// 256 first writes to a 64-block cache: 16 blocks evicted, 16 slots free
/// (8 if nothing were evicted ahead).
#[test]
fn paced_cleaning_evicts_a_reserve_ahead() {
    let mut c = Config::new(BS as u32, 64, 4096 * BS, WritePolicyKind::WriteBack);
    c.bypass_when_full = true;
    c.full_clean_secs = 40;
    let mut h = MemHarness::new(c);
    for batch in (0..256u64).collect::<Vec<_>>().chunks(32) {
        for &i in batch {
            let b = (i * 37) % 1024;
            h.submit(i + 1, write(b, (b % 251) as u8 + 1));
        }
        for &i in batch {
            h.wait(i + 1, &mut |_| 0).result.unwrap();
        }
    }
    let st = h.engine.stats();
    assert!(st.full_bypassed_writes > 0, "{st:?}");
    assert_eq!((st.evictions, st.free_slots), (16, 16), "{st:?}");
}

/// While cleaning is paced, a write of a new block goes around the cache
/// only if it would take one of the slots kept free (`Engine::full_keep`:
/// the reserve and the reserve's worth evicted ahead, 16 here). With the
/// cache emptied by TRIMs (64 slots free) while still paced, a new block
/// is cached.
#[test]
fn a_new_block_is_cached_while_paced_when_slots_beyond_the_kept_ones_are_free() {
    let mut c = Config::new(BS as u32, 64, 4096 * BS, WritePolicyKind::WriteBack);
    c.bypass_when_full = true;
    c.full_clean_secs = 40;
    let mut h = MemHarness::new(c);
    let blocks: Vec<u64> = (0..256u64).map(|i| (i * 37) % 1024).collect();
    for (batch, lbns) in blocks.chunks(32).enumerate() {
        let ids: Vec<u64> = (0..32).map(|k| 1 + batch as u64 * 32 + k).collect();
        for (&id, &b) in ids.iter().zip(lbns) {
            h.submit(id, write(b, (b % 251) as u8 + 1));
        }
        for &id in &ids {
            h.wait(id, &mut |_| 0).result.unwrap();
        }
    }
    for (k, &b) in blocks.iter().enumerate() {
        let id = 1000 + k as u64;
        h.submit(
            id,
            ReqOp::Trim {
                offset: b * BS,
                len: BS as u32,
            },
        );
        h.wait(id, &mut |_| 0).result.unwrap();
    }
    let before = h.engine.stats();
    assert_eq!((before.free_slots, before.cached_blocks), (64, 0));
    assert!(h.now < 1_000_000_000, "still within the pacing window");
    h.submit(2000, write(2000, 9));
    h.wait(2000, &mut |_| 0).result.unwrap();
    let st = h.engine.stats();
    assert_eq!(st.full_bypassed_writes, before.full_bypassed_writes);
    assert_eq!(st.cached_blocks, 1, "{st:?}");
}

/// A failed destage waits `Config::retry_ns` before cleaning tries again
/// (`Engine::plan` plans nothing while `retry_at` is set): after block 0's
/// backing write fails, no new plan starts while time stands still.
#[test]
fn a_failed_destage_is_retried_only_after_the_retry_delay() {
    let mut h = harness(WritePolicyKind::WriteBack, 16);
    h.submit(1, write(0, 1));
    h.wait(1, &mut |_| 0).result.unwrap();
    let find = |h: &mut MemHarness| h.inflight().iter().position(is_backing_write);
    let mut failed = false;
    for _ in 0..1000 {
        if let Some(i) = find(&mut h) {
            h.complete_failed(i);
            failed = true;
            break;
        }
        assert!(h.step(&mut |_| 0), "block 0 is destaged");
    }
    assert!(failed);
    assert_eq!(h.engine.stats().destage_failures, 1);
    // Complete everything else, time standing still (no timeout fires).
    for _ in 0..1000 {
        let cmds: Vec<IoCmd<Bytes>> = h.inflight().iter().cloned().collect();
        assert!(!cmds.iter().any(is_backing_write), "retried at once");
        if cmds.is_empty() {
            break;
        }
        h.step(&mut |_| 0);
    }
    assert_eq!(h.engine.stats().destage_plans, 1, "no second plan yet");
    // After the delay, block 0 is destaged.
    h.settle(&mut |_| 0);
    let st = h.engine.stats();
    assert_eq!((st.destage_plans, st.destaged_blocks), (2, 1), "{st:?}");
}

/// Complete the oldest command in flight other than `held` (timers fire
/// when only `held` is left); false once nothing else can run.
fn step_holding(h: &mut MemHarness, held: IoId) -> bool {
    let i = h.inflight().iter().position(|c| c.id != held);
    match i {
        Some(i) => h.step(&mut |_| i),
        None => {
            let before = h.inflight().len();
            h.now += 1_000_000_000;
            h.engine.handle_timeout(h.now);
            h.inflight().len() > before
        }
    }
}

/// Run until reply `id` arrives, never completing command `held`.
fn wait_holding(h: &mut MemHarness, id: u64, held: IoId) -> Reply<Bytes> {
    for _ in 0..100_000 {
        if let Some(i) = h.replies.iter().position(|r| r.id == id) {
            return h.replies.remove(i);
        }
        step_holding(h, held);
    }
    panic!("request {id} never completed: {}", h.engine.debug_state());
}

/// A clean block whose cache read is in flight (`Slot::refs > 0`) is never
/// evicted (`Engine::evict_clean_until`'s pins): block 16 of a full cache
/// of 24 clean blocks is read, its cache read held, and 40 new blocks are
/// written meanwhile, evicting every other clean block, those new ones
/// among them; block 16, the replacement policy's first victim after the
/// first 23, stays cached: the held read returns its bytes, and a read of
/// it afterwards is a hit.
#[test]
fn a_clean_block_a_read_holds_is_not_evicted() {
    let mut h = full_of_clean_blocks(|lbn| lbn as u8 + 1);
    let st = h.engine.stats();
    h.submit(
        50,
        ReqOp::Read {
            offset: 16 * BS,
            len: BS as u32,
        },
    );
    let held = {
        let cmds = h.inflight();
        assert_eq!(cmds.len(), 1, "one cache read: {cmds:?}");
        assert!(matches!(
            (cmds[0].dev, &cmds[0].op),
            (Dev::Cache, IoOp::Read { .. })
        ));
        cmds[0].id
    };
    for i in 0..40u64 {
        h.submit(100 + i, write(60 + i, 7));
        wait_holding(&mut h, 100 + i, held).result.unwrap();
    }
    let mid = h.engine.stats();
    assert!(mid.evictions - st.evictions >= 40, "{mid:?}");
    h.settle(&mut |_| 0);
    let r = h.wait(50, &mut |_| 0).result.unwrap().unwrap();
    assert_eq!(&r[..], &[17u8; BS as usize][..], "the held read's bytes");
    let before = h.engine.stats();
    h.submit(
        51,
        ReqOp::Read {
            offset: 16 * BS,
            len: BS as u32,
        },
    );
    let r = h.wait(51, &mut |_| 0).result.unwrap().unwrap();
    assert_eq!(&r[..], &[17u8; BS as usize][..]);
    let st = h.engine.stats();
    assert_eq!(
        (
            st.read_hits - before.read_hits,
            st.read_misses - before.read_misses
        ),
        (1, 0),
        "block 16 stayed cached"
    );
}

/// Paced cleaning (`Config::full_clean_secs`) destages at its pace, in
/// turns (`Engine::pace_after`), and at full speed again once writes stop
/// going around the cache (`Engine::paced`): a 64-block write-back cache,
/// cleaning from the first dirty block, takes 256 first writes (most go
/// around it), then the same 256 blocks again: the 48 cached among them turn
/// dirty and stay dirty while time stands still. The engine's next deadline
/// is the paced turn, within the pacing window; woken exactly then, it
/// destages 16 blocks; woken at the window's end, it destages the rest.
#[test]
fn paced_cleaning_destages_in_turns_until_writes_stop_going_around() {
    let mut c = Config::new(BS as u32, 64, 4096 * BS, WritePolicyKind::WriteBack);
    c.bypass_when_full = true;
    c.full_clean_secs = 40;
    c.watermarks = Watermarks {
        high: 0.0,
        low: 0.0,
    };
    let mut h = MemHarness::new(c);
    for round in 0..2u64 {
        for batch in (0..256u64).collect::<Vec<_>>().chunks(32) {
            for &i in batch {
                let b = (i * 37) % 1024;
                let byte = (b % 251) as u8 + 1 + round as u8;
                h.submit(round * 1000 + i + 1, write(b, byte));
            }
            for &i in batch {
                h.wait(round * 1000 + i + 1, &mut |_| 0).result.unwrap();
            }
        }
    }
    // Complete what is in flight, time standing still; note whether the
    // destage writes were FUA (`Engine::start_plan`: a paced plan's are,
    // and end without a backing FLUSH).
    let fuas = std::cell::RefCell::new(Vec::new());
    let quiesce = |h: &mut MemHarness| {
        while !h.inflight().is_empty() {
            let c = h.inflight()[0].clone();
            if let (Dev::Backing, IoOp::Write { fua, .. }) = (c.dev, &c.op) {
                fuas.borrow_mut().push(*fua);
            }
            h.step(&mut |_| 0);
        }
        h.engine.stats()
    };
    let st = quiesce(&mut h);
    assert!(st.full_bypassed_writes > 400, "{st:?}");
    assert_eq!(st.dirty_blocks, 48, "paced: no destage at once: {st:?}");
    let turn = h.engine.poll_timeout().expect("a paced turn");
    assert!(turn > h.now && turn < 1_000_000_000, "{turn}");
    h.now = turn;
    h.engine.handle_timeout(h.now);
    let st2 = quiesce(&mut h);
    assert_eq!(st2.destage_plans, st.destage_plans + 1, "the turn's plan");
    assert_eq!(st2.dirty_blocks, 32, "{st2:?}");
    let turn_fuas = fuas.take();
    assert!(
        !turn_fuas.is_empty() && turn_fuas.iter().all(|&f| f),
        "the paced turn's copies are FUA: {turn_fuas:?}"
    );
    assert_eq!(
        st2.backing_flushes, st.backing_flushes,
        "a paced plan ends without a backing FLUSH"
    );
    // The window ends 1 s after the last write that went around (a commit
    // deadline may come first): then full speed.
    let mut st3 = st2.clone();
    for _ in 0..4 {
        let t = h.engine.poll_timeout().expect("a deadline");
        assert!(t >= 1_000_000_000, "no second turn in the window: {t}");
        h.now = t;
        h.engine.handle_timeout(h.now);
        st3 = quiesce(&mut h);
        if st3.dirty_blocks == 0 {
            break;
        }
    }
    assert_eq!(st3.dirty_blocks, 0, "full speed: {st3:?}");
    let full_fuas = fuas.take();
    assert!(
        !full_fuas.is_empty() && full_fuas.iter().all(|&f| !f),
        "full-speed copies are not FUA: {full_fuas:?}"
    );
    assert!(h.now > 1_000_001_000, "only once the window ended");
    for b in (0..1024u64).step_by(37).take(8) {
        h.submit(
            5000 + b,
            ReqOp::Read {
                offset: b * BS,
                len: BS as u32,
            },
        );
        let r = h.wait(5000 + b, &mut |_| 0).result.unwrap().unwrap();
        assert_eq!(r[0], (b % 251) as u8 + 2, "block {b}");
    }
}

/// A clean stop (`Engine::start_shutdown`) still cleans for writers waiting
/// for a slot (`Engine::plan` stops planning only once nothing is dirty):
/// a write-back cache of 16 dirty blocks, no free reserve and one destage
/// copy at a time, takes two writes of new blocks and starts stopping at
/// once; blocks are destaged one plan at a time (most planned after the
/// stop began), one evicted for each write, and both writes complete.
#[test]
fn a_clean_stop_still_cleans_for_writes_waiting_for_a_slot() {
    let mut c = Config::new(BS as u32, 16, 128 * BS, WritePolicyKind::WriteBack);
    c.watermarks = Watermarks {
        high: 1.0,
        low: 1.0,
    };
    c.free_reserve = 0;
    c.max_destage_inflight = 1;
    let mut h = MemHarness::new(c);
    for lbn in 0..16u64 {
        h.submit(lbn + 1, write(lbn, lbn as u8 + 1));
        h.wait(lbn + 1, &mut |_| 0).result.unwrap();
    }
    h.settle(&mut |_| 0);
    let st = h.engine.stats();
    assert_eq!((st.free_slots, st.dirty_blocks), (0, 16), "{st:?}");
    h.submit(100, write(40, 40));
    h.submit(101, write(41, 41));
    let plans = h.engine.stats().destage_plans;
    assert!(plans - st.destage_plans <= 1, "one copy at a time");
    h.engine.start_shutdown(h.now);
    for _ in 0..10_000 {
        if h.replies.iter().filter(|r| r.id >= 100).count() == 2 {
            break;
        }
        if !h.step(&mut |_| 0) {
            h.now += 1_000_000_000;
            h.engine.handle_timeout(h.now);
        }
    }
    let st2 = h.engine.stats();
    for id in [100, 101] {
        let r = h.replies.iter().find(|r| r.id == id);
        assert!(
            matches!(r, Some(r) if r.result.is_ok()),
            "write {id}: {r:?} {st2:?}"
        );
    }
    assert!(st2.destage_plans - st.destage_plans >= 2, "{st2:?}");
    assert_eq!(st2.evictions - st.evictions, 2, "{st2:?}");
}

/// A destage plan writes each run of contiguous copies as one backing
/// write of at most `MAX_DESTAGE_RUN_BYTES` (`Engine::plan_copy`): 20
/// contiguous dirty blocks of 128 KiB, drained in plans of 16 blocks, go
/// out as backing writes of 8 blocks (1 MiB), 8 and 4, and the bytes land
/// where they belong.
#[test]
fn contiguous_copies_go_out_in_runs_of_at_most_a_mebibyte() {
    let bs = 128 * 1024u64;
    let mut c = Config::new(bs as u32, 64, 128 * bs, WritePolicyKind::WriteBack);
    c.watermarks = Watermarks {
        high: 1.0,
        low: 1.0,
    };
    let mut h = MemHarness::new(c);
    for lbn in 0..20u64 {
        h.submit(
            lbn + 1,
            ReqOp::Write {
                offset: lbn * bs,
                data: Bytes::from(vec![lbn as u8 + 1; bs as usize]),
                fua: false,
            },
        );
        h.wait(lbn + 1, &mut |_| 0).result.unwrap();
    }
    h.settle(&mut |_| 0);
    let st = h.engine.stats();
    assert_eq!((st.dirty_blocks, st.backing_writes), (20, 0), "{st:?}");
    h.engine.start_drain(h.now);
    let mut runs = Vec::new();
    for _ in 0..100_000 {
        let cmds: Vec<IoCmd<Bytes>> = h.inflight().iter().cloned().collect();
        if let Some(i) = cmds.iter().position(is_backing_write) {
            if let IoOp::Write { offset, data, .. } = &cmds[i].op {
                runs.push((offset / bs, data.len() as u64 / bs));
            }
            h.step(&mut |_| i);
        } else if !h.step(&mut |_| 0) {
            break;
        }
    }
    h.engine.end_drain();
    let st2 = h.engine.stats();
    assert_eq!(
        (st2.destaged_blocks, st2.destage_plans - st.destage_plans),
        (20, 2),
        "{st2:?}"
    );
    runs.sort();
    assert_eq!(runs, vec![(0, 8), (8, 8), (16, 4)], "{st2:?}");
    for lbn in 0..20u64 {
        let at = (lbn * bs) as usize;
        assert_eq!(h.backing[at], lbn as u8 + 1, "block {lbn}");
        assert_eq!(h.backing[at + bs as usize - 1], lbn as u8 + 1);
    }
}

/// A pipelined wave whose gate fails is cancelled (`Engine::release_gated`
/// with a failed gate, `Engine::drop_run`): block 1's wave is planned
/// behind block 0's while block 0's backing FLUSH is in flight, its copy
/// held (no backing write of it before that FLUSH ends); that FLUSH
/// fails, so block 1's copy is dropped unwritten and its
/// plan ends; after the retry delay both blocks are destaged again and the
/// engine settles.
#[test]
fn a_pipelined_wave_whose_gate_fails_is_dropped_and_retried() {
    let mut h = harness(WritePolicyKind::Ordered, 16);
    h.submit(1, write(0, 1));
    run_holding_backing_writes(&mut h);
    h.submit(2, write(1, 2));
    run_holding_backing_writes(&mut h);
    assert_eq!(h.replies.len(), 2);
    // Complete block 0's backing write, then everything but backing FLUSHes.
    let is_flush = |c: &IoCmd<Bytes>| c.dev == Dev::Backing && matches!(c.op, IoOp::Flush);
    let mut failed = false;
    for _ in 0..1000 {
        let cmds: Vec<IoCmd<Bytes>> = h.inflight().iter().cloned().collect();
        if let Some(i) = cmds.iter().position(|c| !is_flush(c)) {
            h.step(&mut |_| i);
            continue;
        }
        assert_eq!(cmds.len(), 1, "block 0's FLUSH: {}", h.engine.debug_state());
        assert_eq!(counter(&h, "ordered_waves_pipelined"), 1);
        // The pipelined wave holds its copy until its gate ends.
        assert!(
            h.backing[BS as usize..2 * BS as usize]
                .iter()
                .all(|&b| b == 0),
            "block 1 written before block 0's FLUSH"
        );
        h.complete_failed(0);
        failed = true;
        break;
    }
    assert!(failed, "block 1's wave pipelined behind block 0's FLUSH");
    for _ in 0..100_000 {
        if !h.step(&mut |_| 0) {
            if h.engine.is_idle() {
                break;
            }
            h.now += 1_000_000_000;
            h.engine.handle_timeout(h.now);
        }
    }
    assert!(h.engine.is_idle(), "{}", h.engine.debug_state());
    let st = h.engine.stats();
    assert!(st.destage_failures >= 1, "{st:?}");
    assert_eq!(st.dirty_blocks, 0, "{st:?}");
    assert_eq!(&h.backing[..BS as usize], &[1u8; BS as usize][..]);
    assert_eq!(
        &h.backing[BS as usize..2 * BS as usize],
        &[2u8; BS as usize][..]
    );
}

fn is_backing_flush(c: &IoCmd<Bytes>) -> bool {
    c.dev == Dev::Backing && matches!(c.op, IoOp::Flush)
}

/// Complete commands in flight, oldest first, until one matching `target`
/// is in flight (returned, not completed); time stands still.
fn run_until(h: &mut MemHarness, target: &dyn Fn(&IoCmd<Bytes>) -> bool) -> usize {
    for _ in 0..100_000 {
        let cmds: Vec<IoCmd<Bytes>> = h.inflight().iter().cloned().collect();
        if let Some(i) = cmds.iter().position(target) {
            return i;
        }
        assert!(!cmds.is_empty(), "never issued: {}", h.engine.debug_state());
        h.step(&mut |_| 0);
    }
    panic!("never issued: {}", h.engine.debug_state());
}

/// A destage whose backing FLUSH fails (its copies written) counts as a
/// failed destage (`Stats::destage_failures`) and is retried `retry_ns`
/// after the failure (`Engine::plan_end_inner`'s `retry_at`), not sooner
/// and not much later: block 0's FLUSH fails at 5 s; a timeout half the
/// delay later plans nothing; one just after the delay plans block 0 again.
#[test]
fn a_destage_whose_backing_flush_fails_is_retried_after_the_delay() {
    let mut h = harness(WritePolicyKind::WriteBack, 16);
    let retry = h.engine.config().retry_ns;
    h.now = 5_000_000_000;
    h.submit(1, write(0, 1));
    h.wait(1, &mut |_| 0).result.unwrap();
    let i = run_until(&mut h, &is_backing_flush);
    h.complete_failed(i);
    let failed_at = h.now;
    let st = h.engine.stats();
    assert_eq!((st.destage_plans, st.destage_failures), (1, 1), "{st:?}");
    // Complete everything else, time standing still.
    loop {
        let cmds: Vec<IoCmd<Bytes>> = h.inflight().iter().cloned().collect();
        assert!(!cmds.iter().any(is_backing_write), "retried at once");
        if cmds.is_empty() {
            break;
        }
        h.step(&mut |_| 0);
    }
    h.now = failed_at + retry / 2;
    h.engine.handle_timeout(h.now);
    assert!(
        !h.inflight().iter().any(is_backing_write),
        "retried before the delay"
    );
    assert_eq!(h.engine.stats().destage_plans, 1);
    h.now = failed_at + retry + 1;
    h.engine.handle_timeout(h.now);
    run_until(&mut h, &is_backing_write);
    assert_eq!(h.engine.stats().destage_plans, 2, "retried after the delay");
    h.settle(&mut |_| 0);
    let st = h.engine.stats();
    assert_eq!((st.destaged_blocks, st.destage_failures), (1, 1), "{st:?}");
    assert_eq!(&h.backing[..BS as usize], &[1u8; BS as usize][..]);
}

/// Ordered with block 0's wave waiting for its backing FLUSH and block 1's
/// wave pipelined behind it (gated on it, `Plan::after`), block 1's copy
/// read in flight (both writes submitted with `tag`): returns the indices
/// of that FLUSH and that read.
fn pipelined_wave_reading(h: &mut MemHarness, tag: Tag) -> (usize, usize) {
    h.submit_tagged(1, write(0, 1), tag);
    run_holding_backing_writes(h);
    h.submit_tagged(2, write(1, 2), tag);
    run_holding_backing_writes(h);
    assert_eq!(h.replies.len(), 2);
    let is_cache_read = |c: &IoCmd<Bytes>| c.dev == Dev::Cache && matches!(c.op, IoOp::Read { .. });
    for _ in 0..1000 {
        let cmds: Vec<IoCmd<Bytes>> = h.inflight().iter().cloned().collect();
        let flush = cmds.iter().position(is_backing_flush);
        let read = cmds.iter().position(is_cache_read);
        if let (Some(f), Some(r)) = (flush, read) {
            assert_eq!(counter(h, "ordered_waves_pipelined"), 1);
            assert_eq!(h.engine.stats().destage_plans, 2);
            return (f, r);
        }
        let i = cmds
            .iter()
            .position(|c| !is_backing_flush(c) && !is_cache_read(c))
            .unwrap_or_else(|| panic!("stuck: {}", h.engine.debug_state()));
        h.step(&mut |_| i);
    }
    panic!("no pipelined wave: {}", h.engine.debug_state());
}

/// A gated plan whose copies all fail to read ends at once, failed, before
/// its gate (`Engine::plan_copied`, `plan_end_inner`'s gated arm): block
/// 1's copy read fails while block 0's FLUSH is in flight; the failure is
/// counted then, the plan leaves the gated list, and when block 0's FLUSH
/// ends the engine goes on: block 1 is destaged after the retry delay.
#[test]
fn a_gated_plan_whose_copy_read_fails_ends_before_its_gate() {
    let mut h = harness(WritePolicyKind::Ordered, 16);
    let (_flush, read) = pipelined_wave_reading(&mut h, Tag::default());
    h.complete_failed(read);
    assert_eq!(
        h.engine.stats().destage_failures,
        1,
        "counted when the read fails, not when the gate ends"
    );
    h.settle(&mut |_| 0);
    assert!(h.engine.is_idle(), "{}", h.engine.debug_state());
    let st = h.engine.stats();
    assert_eq!((st.destage_failures, st.dirty_blocks), (1, 0), "{st:?}");
    assert_eq!(&h.backing[..BS as usize], &[1u8; BS as usize][..]);
    assert_eq!(
        &h.backing[BS as usize..2 * BS as usize],
        &[2u8; BS as usize][..]
    );
}

/// A pipelined wave's copies count as destage writes in flight from the
/// end of its gate to its own end (`Engine::release_gated`, then
/// `plan_end_inner`), and no longer: once block 1's pipelined wave has
/// ended, nothing is in flight, so under critical admission ordered lets a
/// non-critical write to a new block bypass the cache (`Engine::can_bypass`
/// asks for no destage write in flight), as it does on a fresh cache.
#[test]
fn a_pipelined_wave_leaves_no_destage_write_counted_in_flight() {
    let mut c = Config::new(BS as u32, 32, 128 * BS, WritePolicyKind::Ordered);
    c.watermarks = Watermarks {
        high: 0.0,
        low: 0.0,
    };
    c.admission = AdmissionKind::Critical;
    let mut h = MemHarness::new(c);
    let critical = Tag {
        client: 0,
        critical: true,
        sync: false,
    };
    let (_flush, _read) = pipelined_wave_reading(&mut h, critical);
    h.settle(&mut |_| 0);
    let st = h.engine.stats();
    assert_eq!((st.destaged_blocks, st.dirty_blocks), (2, 0), "{st:?}");
    h.submit_tagged(3, write(8, 3), Tag::default());
    h.wait(3, &mut |_| 0).result.unwrap();
    let st = h.engine.stats();
    assert_eq!(
        (st.bypassed_pieces, st.bypass_refused),
        (1, 0),
        "nothing dirty, nothing in flight: bypass: {st:?}"
    );
    assert_eq!(
        &h.backing[8 * BS as usize..9 * BS as usize],
        &[3u8; BS as usize][..]
    );
}

/// A journaled checkpoint that merges transactions writes each block's
/// newest copy and drops the older ones (`Plan::drop`), which
/// `Engine::plan_end_inner` frees with it: block 0 written in three
/// transactions (of one block each, each FLUSHed), checkpointed together
/// (merge up to 4, a delay of 1 s, all three past it), leaves one slot in use, block 0's
/// newest copy, and the rest free.
#[test]
fn a_merged_checkpoint_frees_the_older_copies_it_drops() {
    let mut c = Config::new(BS as u32, 32, 128 * BS, WritePolicyKind::Journaled);
    c.journal.checkpoint_delay_ns = 1_000_000_000;
    c.journal.checkpoint_merge_max = 4;
    c.journal.txn_max_blocks = 1;
    let mut h = MemHarness::new(c);
    let slots = h.engine.stats().free_slots;
    for i in 1..=3u64 {
        h.submit(2 * i, write(0, i as u8));
        h.wait(2 * i, &mut |_| 0).result.unwrap();
        h.submit(2 * i + 1, ReqOp::Flush);
        h.wait(2 * i + 1, &mut |_| 0).result.unwrap();
    }
    assert_eq!(h.engine.stats().destage_plans, 0, "within the delay");
    // Past the delay of all three: one checkpoint takes them together.
    h.now += 2_000_000_000;
    h.engine.handle_timeout(h.now);
    h.settle(&mut |_| 0);
    let st = h.engine.stats();
    assert_eq!(
        (st.destage_plans, st.destaged_blocks),
        (1, 1),
        "one checkpoint of three transactions: {st:?}"
    );
    assert_eq!(
        (st.dirty_blocks, st.cached_blocks, st.free_slots),
        (0, 1, slots - 1),
        "{st:?}"
    );
    assert_eq!(&h.backing[..BS as usize], &[3u8; BS as usize][..]);
}

/// Writers that wait only for slots already on their way back (evicted,
/// freed at the next metadata commit) put no space pressure on the write
/// policy (`Engine::plan`: free plus returning slots cover the slots
/// wanted): journaled-hints, whose transactions close only at FLUSH
/// boundaries unless writers stall, does not close its open transaction
/// early for them. A cache of 24 clean blocks and 8 free slots takes nine
/// or twelve one-block writes: 8 take the free slots, 1 or 4 wait, and
/// 9 or 12 clean blocks are evicted (with one waiting write, the returning
/// slots are exactly the slots wanted); no transaction is closed.
#[test]
fn writers_waiting_only_for_returning_slots_close_no_transaction() {
    for writes in [9u64, 12] {
        let mut c = Config::new(BS as u32, 32, 128 * BS, WritePolicyKind::JournaledHints);
        c.watermarks = Watermarks {
            high: 0.0,
            low: 0.0,
        };
        let mut h = MemHarness::new(c);
        for lbn in 0..40u64 {
            h.submit(lbn + 1, write(lbn, 1));
            h.wait(lbn + 1, &mut |_| 0).result.unwrap();
            h.submit(100 + lbn, ReqOp::Flush);
            h.wait(100 + lbn, &mut |_| 0).result.unwrap();
        }
        h.settle(&mut |_| 0);
        let st = h.engine.stats();
        assert_eq!(
            (st.free_slots, st.cached_blocks, st.dirty_blocks),
            (8, 24, 0),
            "{st:?}"
        );
        let (closed, evicted) = (counter(&h, "journal_txns_closed"), st.evictions);
        for i in 0..writes {
            h.submit(200 + i, write(60 + i, 2));
        }
        assert_eq!(
            h.engine.stats().evictions - evicted,
            writes,
            "{writes} writes"
        );
        for i in 0..writes {
            h.wait(200 + i, &mut |_| 0).result.unwrap();
        }
        assert_eq!(
            (
                counter(&h, "journal_txns_closed") - closed,
                counter(&h, "journal_forced_closes")
            ),
            (0, 0),
            "{writes} writes: {}",
            h.engine.debug_state()
        );
    }
}
