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
