//! The engine's accounting and introspection: request counters, the
//! state `is_idle`, `requests_in_flight`, `durable_commit` and
//! `dirty_versions` report, the largest write it accepts, the bound on
//! pieces in progress, per-policy counters, and the memory estimate.
//! Drivers and operators act on these (`nvwc status`, the server's metrics,
//! the simulator's results, a clean stop waiting for `is_idle`), so each is
//! pinned here; mutation testing (`scripts/mutants.sh`) found them
//! unchecked.

use bytes::Bytes;
use nvwc_core::testkit::MemHarness;
use nvwc_core::*;

const BS: u64 = 4096;

fn cfg(policy: WritePolicyKind, blocks: u64) -> Config {
    Config::new(BS as u32, blocks, 1024 * BS, policy)
}

fn write(offset: u64, len: u64) -> ReqOp<Bytes> {
    ReqOp::Write {
        offset,
        data: Bytes::from(vec![7u8; len as usize]),
        fua: false,
    }
}

#[test]
fn every_request_kind_is_counted_once_with_its_bytes() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack, 64));
    h.submit(
        1,
        ReqOp::Read {
            offset: 0,
            len: 3 * BS as u32,
        },
    );
    h.wait(1, &mut |_| 0).result.unwrap();
    h.submit(2, write(BS, 2 * BS));
    h.wait(2, &mut |_| 0).result.unwrap();
    h.submit(3, ReqOp::Flush);
    h.wait(3, &mut |_| 0).result.unwrap();
    h.submit(4, ReqOp::Checkpoint);
    h.wait(4, &mut |_| 0).result.unwrap();
    h.submit(
        5,
        ReqOp::Trim {
            offset: 8 * BS,
            len: BS as u32,
        },
    );
    h.wait(5, &mut |_| 0).result.unwrap();
    let s = h.engine.stats();
    assert_eq!(s.requests, 5, "{s:?}");
    assert_eq!((s.reads, s.read_bytes), (1, 3 * BS), "{s:?}");
    assert_eq!((s.writes, s.write_bytes), (1, 2 * BS), "{s:?}");
    assert_eq!(s.flushes, 2, "FLUSH and checkpoint: {s:?}");
    assert_eq!(s.trims, 1, "{s:?}");
}

#[test]
fn idle_and_in_flight_follow_the_requests() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack, 64));
    h.settle(&mut |_| 0);
    assert!(h.engine.is_idle(), "a fresh engine is idle");
    assert_eq!(h.engine.requests_in_flight(), 0);
    h.submit(1, write(0, BS));
    h.submit(2, write(4 * BS, BS));
    assert!(!h.inflight().is_empty(), "cache writes in flight");
    assert_eq!(h.engine.requests_in_flight(), 2);
    assert!(!h.engine.is_idle(), "two writes in flight");
    h.wait(1, &mut |_| 0).result.unwrap();
    h.wait(2, &mut |_| 0).result.unwrap();
    h.settle(&mut |_| 0);
    assert_eq!(h.engine.requests_in_flight(), 0);
    assert!(h.engine.is_idle(), "{}", h.engine.debug_state());
    // A FLUSH in flight (its commit) is not idle either.
    h.submit(3, write(8 * BS, BS));
    h.wait(3, &mut |_| 0).result.unwrap();
    h.submit(4, ReqOp::Flush);
    assert!(!h.engine.is_idle(), "a FLUSH in flight");
    h.wait(4, &mut |_| 0).result.unwrap();
    h.settle(&mut |_| 0);
    assert!(h.engine.is_idle());
}

#[test]
fn durable_commit_advances_with_each_flushed_commit() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack, 64));
    let c0 = h.engine.durable_commit();
    for (i, id) in [(0u64, 10u64), (1, 20), (2, 30)] {
        h.submit(id, write(i * BS, BS));
        h.wait(id, &mut |_| 0).result.unwrap();
        h.submit(id + 1, ReqOp::Flush);
        h.wait(id + 1, &mut |_| 0).result.unwrap();
    }
    let c1 = h.engine.durable_commit();
    assert!(
        c1 >= c0 + 3,
        "three FLUSHes of new data, three commits: {c0} -> {c1}"
    );
}

#[test]
fn dirty_versions_count_the_dirty_blocks() {
    let mut c = cfg(WritePolicyKind::WriteBack, 64);
    // Never clean on its own.
    c.watermarks = Watermarks {
        high: 1.0,
        low: 1.0,
    };
    let mut h = MemHarness::new(c);
    for b in 0..5u64 {
        h.submit(b + 1, write(b * 2 * BS, BS));
        h.wait(b + 1, &mut |_| 0).result.unwrap();
    }
    h.settle(&mut |_| 0);
    assert_eq!(h.engine.dirty_versions(), 5);
    assert_eq!(h.engine.stats().dirty_blocks, 5);
}

#[test]
fn the_largest_write_is_half_the_cache() {
    for blocks in [64u64, 1000] {
        let h = MemHarness::new(cfg(WritePolicyKind::WriteBack, blocks));
        assert_eq!(
            h.engine.max_write_bytes(),
            blocks / 2 * BS,
            "{blocks} blocks"
        );
    }
}

/// A write is refused as too large when it touches more blocks than
/// `max_write_bytes` holds (32 of a 64-block cache): counted by the blocks
/// it spans, so 32 blocks' bytes not aligned to a block (33 blocks) are
/// refused, and 32 aligned ones, or one byte, taken.
#[test]
fn a_write_over_more_blocks_than_the_largest_is_refused() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack, 64));
    let max = h.engine.max_write_bytes();
    assert_eq!(max, 32 * BS);
    for (id, offset, len, refused) in [
        (1, 0, max, false),
        (2, BS, max + BS, true),
        (3, 512, max, true),
        (4, 2 * BS + 17, 1, false),
        (5, 3 * BS - 1, 2, false),
        (6, 100 * BS + 1, max - 2, false),
    ] {
        h.submit(id, write(offset, len));
        let r = h.wait(id, &mut |_| 0);
        match r.result {
            Err(ReqError::TooLarge) => assert!(refused, "write {id} refused"),
            Ok(None) => assert!(!refused, "write {id} taken"),
            e => panic!("write {id}: {e:?}"),
        }
    }
}

/// The device command counters (`Stats::cache_reads` to
/// `backing_groups`) count every command the engine issues, each once,
/// with its bytes: tallied here from the commands themselves over writes,
/// read hits and misses, FLUSHes and a drain of a journaled cache (whose
/// checkpoints write the backing store in atomic groups) and of a
/// write-through one (whose FLUSH flushes the backing store).
#[test]
fn device_commands_are_counted_with_their_bytes() {
    let mut all = [0u64; 11];
    for policy in [WritePolicyKind::Journaled, WritePolicyKind::WriteThrough] {
        let want = device_commands(policy);
        for (a, w) in all.iter_mut().zip(want) {
            *a += w;
        }
    }
    assert!(all.iter().all(|&n| n > 0), "every kind issued: {all:?}");
}

/// Run the workload on a fresh cache under `policy`: returns the tally,
/// after checking the counters against it.
fn device_commands(policy: WritePolicyKind) -> [u64; 11] {
    let mut h = MemHarness::new(cfg(policy, 64));
    let mut seen = std::collections::HashSet::new();
    // cache reads, bytes, backing reads, bytes, cache writes, bytes,
    // backing writes, bytes, cache flushes, backing flushes, groups.
    let mut want = [0u64; 11];
    let mut tally = |h: &mut MemHarness| {
        for c in h.inflight().iter() {
            if !seen.insert(c.id) {
                continue;
            }
            let k = match (&c.op, c.dev) {
                (IoOp::Read { len, .. }, Dev::Cache) => Some((0, *len as u64)),
                (IoOp::Read { len, .. }, Dev::Backing) => Some((2, *len as u64)),
                (IoOp::Write { data, .. }, Dev::Cache) => Some((4, data.len() as u64)),
                (IoOp::Write { data, .. }, Dev::Backing) => Some((6, data.len() as u64)),
                (IoOp::Flush, Dev::Cache) => Some((8, 0)),
                (IoOp::Flush, Dev::Backing) => Some((9, 0)),
                (IoOp::GroupEnd { .. }, _) => Some((10, 0)),
                _ => None,
            };
            if let Some((i, bytes)) = k {
                want[i] += 1;
                if i < 8 {
                    want[i + 1] += bytes;
                }
            }
        }
    };
    let ops: Vec<ReqOp<Bytes>> = vec![
        write(0, 3 * BS),
        ReqOp::Read {
            offset: 10 * BS,
            len: 2 * BS as u32,
        },
        ReqOp::Flush,
        ReqOp::Read {
            offset: BS,
            len: BS as u32,
        },
        write(20 * BS, BS),
        ReqOp::Flush,
    ];
    for (id, op) in ops.into_iter().enumerate() {
        let id = id as ReqId + 1;
        h.submit(id, op);
        while !h.replies.iter().any(|r| r.id == id) {
            tally(&mut h);
            assert!(h.step(&mut |_| 0), "request {id} never answered");
        }
    }
    let now = h.now + 1;
    h.engine.start_drain(now);
    loop {
        tally(&mut h);
        if !h.step(&mut |_| 0) && h.engine.is_idle() {
            break;
        }
    }
    tally(&mut h);
    let s = h.engine.stats();
    let got = [
        s.cache_reads,
        s.cache_read_bytes,
        s.backing_reads,
        s.backing_read_bytes,
        s.cache_writes,
        s.cache_write_bytes,
        s.backing_writes,
        s.backing_write_bytes,
        s.cache_flushes,
        s.backing_flushes,
        s.backing_groups,
    ];
    assert_eq!(got, want, "{policy}");
    want
}

#[test]
fn pieces_in_progress_are_bounded_by_a_quarter_of_the_cache() {
    // 64 blocks: at most 16 pieces at once, so at most 16 cache writes.
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack, 64));
    for b in 0..40u64 {
        h.submit(b + 1, write(b * BS, BS));
    }
    let writes = h
        .inflight()
        .iter()
        .filter(|c| c.dev == Dev::Cache && matches!(c.op, IoOp::Write { .. }))
        .count();
    assert_eq!(writes, 16, "a quarter of 64 blocks");
    h.settle(&mut |_| 0);
    assert_eq!(h.engine.stats().writes, 40);
}

#[test]
fn policies_name_their_counters() {
    for (policy, name) in [
        (WritePolicyKind::Ordered, "ordered_edges_total"),
        (WritePolicyKind::Journaled, "journal_checkpoints"),
    ] {
        let mut h = MemHarness::new(cfg(policy, 64));
        h.submit(1, write(0, BS));
        h.wait(1, &mut |_| 0).result.unwrap();
        let c = h.engine.policy_counters();
        assert!(
            c.iter().any(|(n, _)| *n == name),
            "{policy}: {c:?} lacks {name}"
        );
        assert!(
            c.iter().all(|(n, _)| !n.is_empty()),
            "{policy}: every counter has a name: {c:?}"
        );
    }
    let h = MemHarness::new(cfg(WritePolicyKind::WriteBack, 64));
    assert!(
        h.engine.debug_state().contains("reqs=0"),
        "{}",
        h.engine.debug_state()
    );
}

#[test]
fn the_memory_estimate_is_per_block_and_plausible() {
    let small = MemHarness::new(cfg(WritePolicyKind::WriteBack, 1024));
    let large = MemHarness::new(cfg(WritePolicyKind::WriteBack, 16 * 1024));
    let (s, l) = (small.engine.mem_bytes(), large.engine.mem_bytes());
    // Per-block state: tens of bytes a block, not a handful, not kilobytes.
    for (m, blocks) in [(s, 1024usize), (l, 16 * 1024)] {
        assert!(
            (24 * blocks..1024 * blocks).contains(&m),
            "{m} bytes for {blocks} blocks"
        );
    }
    // Linear in the cache: 16x the blocks, about 16x the bytes.
    let ratio = l as f64 / s as f64;
    assert!((12.0..20.0).contains(&ratio), "{l} / {s} = {ratio}");
}

/// A block's entry is freed when its last version goes: a stream of
/// distinct blocks through a 64-block write-through cache (each write
/// evicts a clean block) leaves the memory estimate where the first 256
/// left it, not growing with every block ever cached.
#[test]
fn evicted_blocks_free_their_entries() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteThrough, 64));
    let stream = |h: &mut MemHarness, blocks: std::ops::Range<u64>| {
        for b in blocks {
            h.submit(b + 1, write(b * BS, BS));
            h.wait(b + 1, &mut |_| 0).result.unwrap();
        }
    };
    stream(&mut h, 0..256);
    let warm = h.engine.mem_bytes();
    stream(&mut h, 256..1024);
    assert_eq!(h.engine.mem_bytes(), warm);
}

/// `journal_blocks` counts dirty versions and new versions being written:
/// a write's new slot counts while its cache write is in flight, and once
/// it completes only as the dirty version; a slot whose cache write fails
/// goes back to the free list and stops counting.
#[test]
fn slots_being_written_are_counted_and_a_failed_one_freed() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack, 64));
    let free = h.engine.stats().free_slots;
    let cache_write = |h: &mut MemHarness| {
        h.inflight()
            .iter()
            .position(|c| c.dev == Dev::Cache && matches!(c.op, IoOp::Write { .. }))
            .expect("a cache write in flight")
    };
    h.submit(1, write(0, BS));
    cache_write(&mut h);
    assert_eq!(h.engine.journal_blocks(), 1, "being written");
    h.wait(1, &mut |_| 0).result.unwrap();
    assert_eq!(h.engine.journal_blocks(), 1, "dirty");
    assert_eq!(h.engine.stats().free_slots, free - 1);
    h.submit(2, write(BS, BS));
    let i = cache_write(&mut h);
    assert_eq!(h.engine.journal_blocks(), 2);
    h.complete_failed(i);
    h.settle(&mut |_| 0);
    assert_eq!(h.engine.journal_blocks(), 1, "{}", h.engine.debug_state());
    assert_eq!(h.engine.stats().free_slots, free - 1);
}

/// A written block piece is a hit when the block has a cached version and a
/// miss when it has none (`write_piece`): three new blocks, then two of
/// them again and one more, in one write each.
#[test]
fn write_hits_and_misses_count_the_pieces() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack, 64));
    h.submit(1, write(0, 3 * BS));
    h.wait(1, &mut |_| 0).result.unwrap();
    let s = h.engine.stats();
    assert_eq!((s.write_hits, s.write_misses), (0, 3), "{s:?}");
    h.submit(2, write(BS, 3 * BS));
    h.wait(2, &mut |_| 0).result.unwrap();
    let s = h.engine.stats();
    assert_eq!((s.write_hits, s.write_misses), (2, 4), "{s:?}");
}

/// A read piece is a hit when the block has a cached version and a miss
/// otherwise (`read_piece`); a missed whole block read with
/// `read_allocate` is filled into the cache once (`fill`: populates),
/// without it never.
#[test]
fn read_hits_misses_and_fills_are_counted() {
    for allocate in [true, false] {
        let mut c = cfg(WritePolicyKind::WriteBack, 64);
        c.read_allocate = allocate;
        let mut h = MemHarness::new(c);
        let read = |h: &mut MemHarness, id: ReqId, blocks: u64| {
            h.submit(
                id,
                ReqOp::Read {
                    offset: 0,
                    len: (blocks * BS) as u32,
                },
            );
            h.wait(id, &mut |_| 0).result.unwrap();
            h.settle(&mut |_| 0);
            h.engine.stats()
        };
        let s = read(&mut h, 1, 2);
        assert_eq!((s.read_hits, s.read_misses), (0, 2), "{allocate}: {s:?}");
        assert_eq!(s.populates, if allocate { 2 } else { 0 }, "{s:?}");
        let s = read(&mut h, 2, 3);
        let (hits, misses) = if allocate { (2, 3) } else { (0, 5) };
        assert_eq!(
            (s.read_hits, s.read_misses),
            (hits, misses),
            "{allocate}: {s:?}"
        );
        assert_eq!(s.populates, if allocate { 3 } else { 0 }, "{s:?}");
    }
}

/// A read miss fills the cache (`read_allocate`) only while more than half
/// of `free_reserve` slots would stay free (`fill`): with a cache of 64
/// full of clean blocks down to its reserve (8 free), a read of 16 new
/// blocks, whose misses all go out at once, fills the first 4 (the evicted
/// clean slots are free again only after the next commit) and serves the
/// other 12 from the backing store alone.
#[test]
fn read_fills_stop_at_half_the_free_reserve() {
    let mut c = cfg(WritePolicyKind::WriteThrough, 64);
    c.read_allocate = true;
    let mut h = MemHarness::new(c);
    for lbn in 100..160u64 {
        h.submit(lbn, write(lbn * BS, BS));
        h.wait(lbn, &mut |_| 0).result.unwrap();
    }
    h.settle(&mut |_| 0);
    let st = h.engine.stats().clone();
    assert_eq!((st.free_slots, st.populates), (8, 0), "{st:?}");
    h.submit(
        1,
        ReqOp::Read {
            offset: 0,
            len: 16 * BS as u32,
        },
    );
    let data = h.wait(1, &mut |_| 0).result.unwrap().unwrap();
    assert_eq!(data.len() as u64, 16 * BS);
    let st = h.engine.stats().clone();
    assert_eq!((st.populates, st.free_slots), (4, 4), "{st:?}");
}

/// A partial write to a block not cached is a read-modify-write with one
/// fetch of the block from the backing store (`FetchMode::Blocking`),
/// counted in `fetches`; over a whole cached version (ordered: not in
/// place) it reads the cached copy instead, with no fetch.
#[test]
fn a_partial_write_fetches_only_a_block_not_cached() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::Ordered, 64));
    h.submit(1, write(2 * BS + 512, 512));
    h.wait(1, &mut |_| 0).result.unwrap();
    let s = h.engine.stats();
    assert_eq!((s.fetches, s.backing_reads), (1, 1), "{s:?}");
    h.submit(2, write(5 * BS, BS));
    h.wait(2, &mut |_| 0).result.unwrap();
    h.submit(3, write(5 * BS + 512, 512));
    h.wait(3, &mut |_| 0).result.unwrap();
    let s = h.engine.stats();
    assert_eq!((s.fetches, s.backing_reads), (1, 1), "{s:?}");
    assert_eq!(s.partial_write_fetches, 0, "{s:?}");
}

/// A piece that finds its block busy waits for it (`block_waits`), and
/// the time from its arrival to the block's release counts in
/// `block_wait_ns` (`release_block`): a second write of a block whose
/// first write is still in flight for 1000 ns waits at least that long,
/// and no longer than the two writes took.
#[test]
fn a_write_waiting_for_its_block_counts_the_wait() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack, 64));
    h.now = 1_000_000;
    let t0 = h.now;
    h.submit(1, write(0, BS));
    h.submit(2, write(0, BS));
    h.now += 1000;
    h.wait(1, &mut |_| 0).result.unwrap();
    h.wait(2, &mut |_| 0).result.unwrap();
    let s = h.engine.stats();
    assert_eq!(s.block_waits, 1, "{s:?}");
    assert!(
        (1000..=h.now - t0).contains(&s.block_wait_ns),
        "{} ns in {}: {s:?}",
        s.block_wait_ns,
        h.now - t0
    );
}

/// `journal_blocks` (what a journal bound counts): dirty versions, new
/// versions being written and reserved slots. A write of three blocks
/// counts three while its cache writes are in flight, and three again
/// once installed, as dirty versions (`install` ends the writing count).
#[test]
fn journal_blocks_count_a_version_once_while_written_and_once_installed() {
    let mut c = cfg(WritePolicyKind::WriteBack, 64);
    // Never clean on its own.
    c.watermarks = Watermarks {
        high: 1.0,
        low: 1.0,
    };
    let mut h = MemHarness::new(c);
    h.submit(1, write(0, 3 * BS));
    assert_eq!(h.engine.journal_blocks(), 3, "being written");
    h.wait(1, &mut |_| 0).result.unwrap();
    h.settle(&mut |_| 0);
    assert_eq!(h.engine.dirty_versions(), 3);
    assert_eq!(h.engine.journal_blocks(), 3, "installed");
}

/// A write that waits for admission (no room for its slots) is counted as
/// one admission stall, its pieces as stalled writes, and its wait, from
/// its arrival to the completion that admits it, once per piece: exactly
/// what the simulator and `nvwc status` report as stall time.
#[test]
fn an_admission_stall_counts_its_pieces_and_its_wait_exactly() {
    let mut c = cfg(WritePolicyKind::WriteBack, 16);
    c.free_reserve = 0;
    c.watermarks = Watermarks {
        high: 1.0,
        low: 1.0,
    };
    let mut h = MemHarness::new(c);
    for b in 0..16 {
        h.submit(10 + b, write(b * BS, BS));
        h.wait(10 + b, &mut |_| 0).result.unwrap();
    }
    let st = h.engine.stats().clone();
    assert_eq!((st.free_slots, st.dirty_blocks), (0, 16), "{st:?}");
    assert_eq!(
        (st.admission_stalls, st.stalled_writes, st.stall_ns),
        (0, 0, 0)
    );
    // Two blocks not cached, away from block 0: both need a fresh slot.
    h.submit(1, write(20 * BS, 2 * BS));
    let arrived = h.now;
    assert_eq!(h.engine.stats().admission_stalls, 1);
    let mut admitted = None;
    for _ in 0..10_000 {
        if !h.step(&mut |_| 0) {
            break;
        }
        if admitted.is_none() && h.engine.stats().stalled_writes > 0 {
            admitted = Some(h.now);
        }
    }
    let admitted = admitted.expect("the write was admitted");
    assert!(admitted > arrived);
    assert_eq!(h.replies.last().map(|r| r.id), Some(1));
    let st = h.engine.stats().clone();
    assert_eq!(st.admission_stalls, 1, "{st:?}");
    assert_eq!(st.stalled_writes, 2, "{st:?}");
    assert_eq!(st.stall_ns, (admitted - arrived) * 2, "{st:?}");
}

/// A read miss whose backing read is still in flight when a write to the
/// same block starts must not install the old bytes it fetched: later reads
/// see the write (the fill is stale, `fill_stale`).
#[test]
fn a_fill_that_a_write_overtook_is_not_cached() {
    for policy in [WritePolicyKind::WriteBack, WritePolicyKind::WriteThrough] {
        let mut h = MemHarness::new(cfg(policy, 64));
        h.backing[5 * BS as usize..6 * BS as usize].fill(3);
        h.submit(
            1,
            ReqOp::Read {
                offset: 5 * BS,
                len: BS as u32,
            },
        );
        let fetch = |c: &IoCmd<Bytes>| {
            c.dev == Dev::Backing && matches!(c.op, IoOp::Read { offset, .. } if offset == 5 * BS)
        };
        assert!(
            h.inflight().iter().any(fetch),
            "{policy}: the miss reads the backing store"
        );
        h.submit(2, write(5 * BS, BS));
        // Run everything but the fetch, then the fetch.
        while let Some(i) = h.inflight().iter().position(|c| !fetch(c)) {
            h.step(&mut |_| i);
        }
        h.settle(&mut |_| 0);
        assert!(
            h.replies.iter().any(|r| r.id == 2),
            "{policy}: the write ended"
        );
        h.submit(
            3,
            ReqOp::Read {
                offset: 5 * BS,
                len: BS as u32,
            },
        );
        let got = h.wait(3, &mut |_| 0).result.unwrap().expect("read data");
        assert!(
            got.iter().all(|&b| b == 7),
            "{policy}: read {:?}",
            &got[..8]
        );
    }
}

/// Complete every command `e` has issued, and those that brings, at once
/// and in order, with success (reads zeroes, checksums of zeroes); returns
/// the replies and keeps the events (the testkit's pump drops them).
fn drive_raw(e: &mut Engine<Bytes>, now: u64, events: &mut Vec<Event>) -> Vec<Reply<Bytes>> {
    let mut replies = Vec::new();
    loop {
        let mut any = false;
        while let Some(cmd) = e.poll_io() {
            any = true;
            let res = match cmd.op {
                IoOp::Read { len, .. } => Ok(Some(Bytes::from(vec![0u8; len as usize]))),
                IoOp::Checksum { len, .. } => Ok(Some(Bytes::copy_from_slice(
                    &layout::data_crc(&vec![0u8; len as usize]).to_le_bytes(),
                ))),
                _ => Ok(None),
            };
            e.handle_completion(now, cmd.id, res);
        }
        while let Some(r) = e.poll_reply() {
            replies.push(r);
            any = true;
        }
        events.extend(std::iter::from_fn(|| e.poll_event()));
        if !any {
            return replies;
        }
    }
}

/// `has_output` (what the pump asserts it leaves: nothing, and what the
/// simulator's pump checks before it runs) is true while a device command
/// or a reply waits to be polled, each on its own, and false once both
/// are taken.
#[test]
fn has_output_tells_whether_a_command_or_a_reply_waits() {
    let mut e: Engine<Bytes> = Engine::new(cfg(WritePolicyKind::WriteBack, 64)).unwrap();
    assert!(!e.has_output(), "a fresh engine");
    // A reply alone: a read out of range is answered at once.
    let read = ReqOp::Read {
        offset: 2048 * BS,
        len: BS as u32,
    };
    e.handle_request(
        1,
        Request {
            id: 1,
            op: read,
            tag: Tag::default(),
        },
    );
    assert!(e.has_output(), "a reply waits");
    assert!(e.poll_io().is_none(), "and no command");
    assert_eq!(e.poll_reply().unwrap().result, Err(ReqError::InvalidRange));
    assert!(!e.has_output(), "both taken");
    // A command alone: a write's cache write, its reply not yet due.
    e.handle_request(
        2,
        Request {
            id: 2,
            op: write(0, BS),
            tag: Tag::default(),
        },
    );
    assert!(e.has_output(), "a command waits");
    let cmd = e.poll_io().expect("the cache write");
    assert!(
        e.poll_reply().is_none(),
        "no reply before the write completes"
    );
    assert!(!e.has_output(), "both taken");
    e.handle_completion(3, cmd.id, Ok(None));
    assert!(e.has_output(), "the write's reply waits");
    assert!(e.poll_io().is_none(), "and no command");
    assert_eq!(e.poll_reply().unwrap().id, 2);
    assert!(!e.has_output());
}

/// The engine's events come out of `poll_event`: a commit's
/// `Committed`, and a journaled cache's own events (a drain closes its
/// transaction).
#[test]
fn poll_event_yields_commits_and_the_policys_events() {
    for policy in [WritePolicyKind::WriteBack, WritePolicyKind::Journaled] {
        let mut e: Engine<Bytes> = Engine::new(cfg(policy, 64)).unwrap();
        let mut events = Vec::new();
        e.handle_request(
            1,
            Request {
                id: 1,
                op: write(0, BS),
                tag: Tag::default(),
            },
        );
        drive_raw(&mut e, 2, &mut events);
        e.handle_request(
            3,
            Request {
                id: 2,
                op: ReqOp::Flush,
                tag: Tag::default(),
            },
        );
        let replies = drive_raw(&mut e, 4, &mut events);
        assert!(
            replies.iter().any(|r| r.id == 2 && r.result.is_ok()),
            "{policy}: {replies:?}"
        );
        assert!(
            events
                .iter()
                .any(|ev| matches!(ev, Event::Committed { ok: true, .. })),
            "{policy}: {events:?}"
        );
        if policy == WritePolicyKind::Journaled {
            // A drain closes the open transaction and checkpoints it.
            e.start_drain(5);
            drive_raw(&mut e, 6, &mut events);
            assert!(
                events
                    .iter()
                    .any(|ev| matches!(ev, Event::Policy(PolicyEvent::TxnClosed { .. }))),
                "{policy}: {events:?}"
            );
        }
    }
}

/// `dirty_versions` counts a patched block (dirty bytes held in RAM) with
/// the dirty versions: two dirty blocks and a partial write held as a
/// patch (`FetchMode::Lazy`) make three.
#[test]
fn dirty_versions_count_patched_blocks_too() {
    let mut c = cfg(WritePolicyKind::WriteBack, 64);
    c.fetch = FetchMode::Lazy;
    c.watermarks = Watermarks {
        high: 1.0,
        low: 1.0,
    };
    let mut h = MemHarness::new(c);
    h.submit(1, write(0, 2 * BS));
    h.wait(1, &mut |_| 0).result.unwrap();
    h.submit(2, write(10 * BS + 100, 100));
    h.wait(2, &mut |_| 0).result.unwrap();
    let st = h.engine.stats();
    assert_eq!((st.dirty_blocks, st.patched_blocks), (2, 1), "{st:?}");
    assert_eq!(h.engine.dirty_versions(), 3);
}

/// `io_errors` counts the device commands that completed with an error,
/// each once, and no other: a write whose cache write fails (the one
/// failed command), then a write that succeeds.
#[test]
fn failed_device_commands_are_counted_once_each() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack, 64));
    h.submit(1, write(0, BS));
    let i = h
        .inflight()
        .iter()
        .position(|c| c.dev == Dev::Cache && matches!(c.op, IoOp::Write { .. }))
        .expect("the cache write");
    h.complete_failed(i);
    assert!(h.wait(1, &mut |_| 0).result.is_err());
    assert_eq!(h.engine.stats().io_errors, 1);
    h.submit(2, write(BS, BS));
    h.wait(2, &mut |_| 0).result.unwrap();
    h.settle(&mut |_| 0);
    assert_eq!(h.engine.stats().io_errors, 1);
}
