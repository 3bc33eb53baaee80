//! Admission policies and bypass: what goes to the cache, what goes straight
//! to the backing store, and I/O criticality inheritance (reissue).

use bytes::Bytes;
use nvwc_core::testkit::{write_filled as write, MemHarness};
use nvwc_core::*;

const BS: u64 = 4096;

fn cfg(policy: WritePolicyKind, admission: AdmissionKind) -> Config {
    let mut c = Config::new(BS as u32, 64, 1024 * BS, policy);
    c.admission = admission;
    c
}

/// A harness whose cache destages everything dirty at once (watermarks 0).
fn eager(policy: WritePolicyKind, admission: AdmissionKind) -> MemHarness {
    let mut c = cfg(policy, admission);
    c.watermarks = Watermarks {
        high: 0.0,
        low: 0.0,
    };
    MemHarness::new(c)
}

fn tag(critical: bool) -> Tag {
    Tag {
        client: 0,
        critical,
        sync: false,
    }
}

/// A backing-store write at `offset` (a bypass write).
fn is_backing_write_at(c: &IoCmd<Bytes>, offset: u64) -> bool {
    c.dev == Dev::Backing && matches!(c.op, IoOp::Write { offset: o, .. } if o == offset)
}

/// Submit critical read `id` of the block at `offset`, whose bypass write is
/// in flight, and run every other command (at most `steps`) until I/O
/// inheritance has reissued that write to the cache. Returns the stats then.
fn critical_read_until_reissued(h: &mut MemHarness, id: ReqId, offset: u64, steps: usize) -> Stats {
    let read = ReqOp::Read {
        offset,
        len: BS as u32,
    };
    h.submit_tagged(id, read, tag(true));
    for _ in 0..steps {
        if h.engine.stats().reissued_writes == 1 {
            break;
        }
        let Some(i) = h
            .inflight()
            .iter()
            .position(|c| !is_backing_write_at(c, offset))
        else {
            break;
        };
        h.step(&mut |_| i);
    }
    h.engine.stats().clone()
}

/// Every byte of `got` is `want` (reports the first wrong byte, not the block).
#[track_caller]
fn assert_block(got: Vec<u8>, want: u8, ctx: impl std::fmt::Display) {
    assert_eq!(got.len(), BS as usize, "{ctx}");
    if let Some(i) = got.iter().position(|&b| b != want) {
        panic!("{ctx}: byte {i} is {}, want {want}", got[i]);
    }
}

/// Block 0 holds `want` bytes (requests 3 to 5: a read, a flush, then a
/// read after a reopen), before and after a flush and a reopen.
fn assert_block_survives_reopen(h: &mut MemHarness, want: u8, ctx: impl std::fmt::Display) {
    assert_block(read(h, 3, 0, BS as u32), want, &ctx);
    h.submit(4, ReqOp::Flush);
    h.wait(4, &mut |_| 0).result.unwrap();
    h.reopen().unwrap();
    assert_block(read(h, 5, 0, BS as u32), want, &ctx);
}

fn read(h: &mut MemHarness, id: ReqId, offset: u64, len: u32) -> Vec<u8> {
    h.submit(id, ReqOp::Read { offset, len });
    let r = h.wait(id, &mut |_| 0);
    r.result.unwrap().unwrap().to_vec()
}

/// Under `critical`, a non-critical write to an uncached block goes to the
/// backing store as an ordinary write (no FUA) and never touches the cache;
/// a critical one is cached. The next FLUSH flushes the backing store.
#[test]
fn non_critical_writes_bypass_and_critical_writes_are_cached() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack, AdmissionKind::Critical));
    h.submit_tagged(1, write(0, 7, BS), tag(false));
    let cmds: Vec<_> = h.inflight().iter().cloned().collect();
    assert_eq!(cmds.len(), 1, "{cmds:?}");
    assert_eq!(cmds[0].dev, Dev::Backing);
    assert!(
        matches!(cmds[0].op, IoOp::Write { fua: false, .. }),
        "{cmds:?}"
    );
    h.wait(1, &mut |_| 0).result.unwrap();
    let flushes = h.engine.stats().backing_flushes;
    h.submit(9, ReqOp::Flush);
    h.wait(9, &mut |_| 0).result.unwrap();
    assert_eq!(
        h.engine.stats().backing_flushes,
        flushes + 1,
        "a FLUSH after a bypass write flushes the backing store"
    );
    assert_eq!(h.backing[0], 7, "bypassed data is on the backing store");
    h.submit_tagged(2, write(8 * BS, 9, BS), tag(true));
    h.wait(2, &mut |_| 0).result.unwrap();
    h.settle(&mut |_| 0);
    let st = h.engine.stats().clone();
    assert_eq!(st.bypassed_pieces, 1, "{st:?}");
    assert_eq!(st.admitted_pieces, 1, "{st:?}");
    assert_eq!(
        st.cache_write_bytes.min(BS),
        BS,
        "the critical write was cached"
    );
    assert_block(read(&mut h, 3, 0, BS as u32), 7, "bypassed");
    assert_block(read(&mut h, 4, 8 * BS, BS as u32), 9, "");
}

/// A rejected write to a block the cache holds is cached after all: going
/// around the cache would leave the cached copy stale.
#[test]
fn bypass_never_leaves_a_stale_cached_copy() {
    for policy in [WritePolicyKind::WriteBack, WritePolicyKind::WriteThrough] {
        let mut h = MemHarness::new(cfg(policy, AdmissionKind::Critical));
        h.submit_tagged(1, write(0, 1, BS), tag(true));
        h.wait(1, &mut |_| 0).result.unwrap();
        // Cached (dirty under write-back, clean under write-through); now a
        // non-critical write to the same block.
        h.submit_tagged(2, write(0, 2, BS), tag(false));
        h.wait(2, &mut |_| 0).result.unwrap();
        assert_block_survives_reopen(&mut h, 2, policy);
    }
}

/// A block evicted from the cache whose old entry a durable commit still
/// names is not bypassed where recovery would bring the old version back
/// over the bypassed data (ordered keeps a clean latest version). Write-back
/// recovery drops clean versions after a crash, so there a durably clean
/// entry does not stand in the way.
#[test]
fn a_block_recovery_could_resurrect_is_not_bypassed() {
    for policy in [WritePolicyKind::Ordered, WritePolicyKind::WriteBack] {
        let mut h = eager(policy, AdmissionKind::Critical);
        h.submit_tagged(1, write(0, 1, BS), tag(true));
        h.wait(1, &mut |_| 0).result.unwrap();
        h.submit(2, ReqOp::Flush);
        h.wait(2, &mut |_| 0).result.unwrap();
        h.settle(&mut |_| 0);
        // Destaged (watermarks 0): clean; trim drops the clean copy, whose
        // entry the last durable commit still names.
        h.submit(
            3,
            ReqOp::Trim {
                offset: 0,
                len: BS as u32,
            },
        );
        h.wait(3, &mut |_| 0).result.unwrap();
        h.submit_tagged(4, write(0, 2, BS), tag(false));
        h.wait(4, &mut |_| 0).result.unwrap();
        let st = h.engine.stats().clone();
        // Crash. An ordered bypass carries FUA, so it is durable without a
        // FLUSH: crash before one (the case a resurrected version would
        // break). A cached write, or a write-back bypass (an ordinary
        // write), is durable only after one.
        if policy == WritePolicyKind::WriteBack || st.bypassed_pieces == 0 {
            h.submit(5, ReqOp::Flush);
            h.wait(5, &mut |_| 0).result.unwrap();
        }
        h.reopen().unwrap();
        assert_block(read(&mut h, 6, 0, BS as u32), 2, policy);
        let bypassed = u64::from(policy == WritePolicyKind::WriteBack);
        assert_eq!(st.bypassed_pieces, bypassed, "{policy}: {st:?}");
        assert_eq!(st.bypass_refused, 1 - bypassed, "{policy}: {st:?}");
    }
}

/// I/O criticality inheritance: a critical read waits behind a bypass write
/// in flight; the write is reissued to the cache, completes from there, and
/// its original backing completion, arriving later, is discarded: one reply
/// per request, and the data is right everywhere.
#[test]
fn critical_waiter_reissues_an_outstanding_bypass_write() {
    for (kind, reissues) in [
        (AdmissionKind::CriticalPiIoi, true),
        (AdmissionKind::Critical, false),
    ] {
        let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack, kind));
        h.submit_tagged(1, write(0, 5, BS), tag(false));
        assert_eq!(h.inflight().len(), 1);
        h.submit_tagged(
            2,
            ReqOp::Read {
                offset: 0,
                len: BS as u32,
            },
            tag(true),
        );
        let cmds: Vec<_> = h.inflight().iter().cloned().collect();
        let cache_writes = cmds
            .iter()
            .filter(|c| c.dev == Dev::Cache && matches!(c.op, IoOp::Write { .. }))
            .count();
        assert_eq!(cache_writes, reissues as usize, "{kind}: {cmds:?}");
        if reissues {
            // Complete the reissue first (index 1), keep the backing write back.
            h.step(&mut |_| 1);
            assert!(
                h.replies.iter().any(|r| r.id == 1),
                "write completed from the cache"
            );
            let r = h.wait(2, &mut |n| n - 1);
            assert_block(r.result.unwrap().unwrap().to_vec(), 5, "critical read");
            assert!(
                h.inflight().iter().any(|c| c.dev == Dev::Backing),
                "the original backing write is still in flight"
            );
        }
        h.settle(&mut |_| 0);
        let st = h.engine.stats().clone();
        assert_eq!(st.reissued_writes, reissues as u64, "{kind}: {st:?}");
        assert_eq!(st.discarded_completions, reissues as u64, "{kind}: {st:?}");
        assert_eq!(
            st.inherited, 1,
            "{kind}: the holder inherited criticality, once: {st:?}"
        );
        let ones = h.replies.iter().filter(|r| r.id == 1).count()
            + h.replies.iter().filter(|r| r.id == 2).count();
        assert!(ones <= 2, "no duplicate replies: {:?}", h.replies);
        h.replies.clear();
        assert_eq!(h.backing[0], 5, "{kind}");
        assert_block_survives_reopen(&mut h, 5, kind);
    }
}

/// The original backing write of a reissued bypass (the orphan) may arrive
/// last of all: a later version of the block, written and destaged in the
/// meantime, must still be what the backing store holds afterwards (the
/// orphan keeps the block's destage mark until it completes). Write-back is
/// the policy that reissues; ordered does not (see `Engine::reissue`), and
/// its part of the test checks that it waits for the bypass write instead.
#[test]
fn an_orphaned_bypass_write_never_lands_over_a_later_destage() {
    for policy in [WritePolicyKind::WriteBack, WritePolicyKind::Ordered] {
        let reissues = policy == WritePolicyKind::WriteBack;
        let mut h = eager(policy, AdmissionKind::CriticalPiIoi);
        h.submit_tagged(1, write(0, 5, BS), tag(false));
        let is_orphan = |c: &IoCmd<Bytes>| {
            c.dev == Dev::Backing
                && matches!(&c.op, IoOp::Write { offset: 0, data, fua } if data[0] == 5 && *fua != reissues)
        };
        assert!(h.inflight().iter().any(is_orphan), "{policy}: bypassed");
        // A critical read waits on it: reissued to the cache.
        h.submit_tagged(
            2,
            ReqOp::Read {
                offset: 0,
                len: BS as u32,
            },
            tag(true),
        );
        // Run everything but the orphan, as long as anything else is left.
        let others_first = |h: &mut MemHarness| loop {
            let q: Vec<_> = h.inflight().iter().cloned().collect();
            match q.iter().position(|c| !is_orphan(c)) {
                Some(i) => {
                    h.step(&mut |_| i);
                }
                None => break,
            }
        };
        others_first(&mut h);
        assert_eq!(
            h.replies.iter().any(|r| r.id == 1) && h.replies.iter().any(|r| r.id == 2),
            reissues,
            "{policy}: both complete while the orphan is in flight iff reissued: {:?}",
            h.replies
        );
        assert_eq!(
            h.engine.stats().reissued_writes,
            reissues as u64,
            "{policy}"
        );
        h.submit_tagged(3, write(0, 6, BS), tag(true));
        h.submit(4, ReqOp::Flush);
        others_first(&mut h);
        // Now the orphan, then whatever it released.
        h.settle(&mut |_| 0);
        let st = h.engine.stats().clone();
        assert_eq!(
            st.discarded_completions, reissues as u64,
            "{policy}: {st:?}"
        );
        assert_eq!(h.engine.dirty_versions(), 0, "{policy}: destaged");
        assert_eq!(
            h.backing[0], 6,
            "{policy}: the orphan landed over the newer version"
        );
        assert_block(read(&mut h, 5, 0, BS as u32), 6, policy);
    }
}

/// Ordered: a rejected write bypasses only while every completed write is
/// on the backing store; journaled only while the journal is empty.
#[test]
fn consistent_policies_bypass_only_when_it_keeps_their_guarantee() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::Ordered, AdmissionKind::Critical));
    h.submit_tagged(1, write(0, 1, BS), tag(false));
    h.wait(1, &mut |_| 0).result.unwrap();
    assert_eq!(h.engine.stats().bypassed_pieces, 1, "nothing dirty: bypass");
    h.submit_tagged(2, write(BS, 2, BS), tag(true));
    h.wait(2, &mut |_| 0).result.unwrap();
    h.submit_tagged(3, write(2 * BS, 3, BS), tag(false));
    h.wait(3, &mut |_| 0).result.unwrap();
    let st = h.engine.stats().clone();
    assert_eq!(
        st.bypassed_pieces, 1,
        "w2 is dirty: w3 must not pass it: {st:?}"
    );
    assert_eq!(st.bypass_refused, 1, "{st:?}");
    assert_eq!(
        h.backing[2 * BS as usize],
        0,
        "w3 is in the cache, not on the backing store"
    );

    // Journaled: only while the journal is empty, and then the write belongs
    // to no transaction (its reply carries no sequence number).
    for policy in [WritePolicyKind::Journaled, WritePolicyKind::JournaledHints] {
        let mut h = MemHarness::new(cfg(policy, AdmissionKind::Critical));
        h.submit_tagged(1, write(0, 1, BS), tag(false));
        let cmds: Vec<_> = h.inflight().iter().cloned().collect();
        assert!(
            matches!(
                cmds.as_slice(),
                [IoCmd {
                    dev: Dev::Backing,
                    op: IoOp::Write { fua: true, .. },
                    ..
                }]
            ),
            "{policy}: empty journal: one FUA backing write: {cmds:?}"
        );
        let r = h.wait(1, &mut |_| 0);
        assert!(r.result.is_ok() && r.seq == 0, "{policy}: {r:?}");
        assert_eq!(h.backing[0], 1, "{policy}");
        // A cached write opens the journal: the next rejected write joins it.
        h.submit_tagged(2, write(BS, 2, BS), tag(true));
        h.wait(2, &mut |_| 0).result.unwrap();
        h.submit_tagged(3, write(2 * BS, 3, BS), tag(false));
        let r = h.wait(3, &mut |_| 0);
        assert!(r.result.is_ok() && r.seq != 0, "{policy}: {r:?}");
        let st = h.engine.stats().clone();
        assert_eq!(
            (st.bypassed_pieces, st.bypass_refused),
            (1, 1),
            "{policy}: {st:?}"
        );
        assert_eq!(
            h.backing[2 * BS as usize],
            0,
            "{policy}: w3 is in the cache"
        );
        // Once everything is checkpointed the journal is empty again.
        h.submit(4, ReqOp::Checkpoint);
        h.wait(4, &mut |_| 0).result.unwrap();
        h.settle(&mut |_| 0);
        assert_eq!(h.backing[2 * BS as usize], 3, "{policy}: checkpointed");
        h.submit_tagged(5, write(3 * BS, 5, BS), tag(false));
        let r = h.wait(5, &mut |_| 0);
        assert!(r.result.is_ok() && r.seq == 0, "{policy}: {r:?}");
        assert_eq!(h.engine.stats().bypassed_pieces, 2, "{policy}");
        assert_eq!(h.backing[3 * BS as usize], 5, "{policy}");
        for (i, want) in [1u8, 2, 3, 5].into_iter().enumerate() {
            assert_block(
                read(&mut h, 10 + i as u64, i as u64 * BS, BS as u32),
                want,
                policy,
            );
        }
    }
}

/// `wal` caches writes that touch a declared log range, `sync` FUA writes.
#[test]
fn wal_and_sync_policies_pick_their_writes() {
    let mut c = cfg(WritePolicyKind::WriteBack, AdmissionKind::Wal);
    c.wal_ranges = vec![(16 * BS, 4 * BS)];
    let mut h = MemHarness::new(c);
    h.submit(1, write(0, 1, BS));
    h.submit(2, write(17 * BS, 2, BS));
    h.wait(1, &mut |_| 0).result.unwrap();
    h.wait(2, &mut |_| 0).result.unwrap();
    let st = h.engine.stats().clone();
    assert_eq!((st.bypassed_pieces, st.admitted_pieces), (1, 1), "{st:?}");

    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack, AdmissionKind::Sync));
    h.submit(1, write(0, 1, BS));
    h.submit(
        2,
        ReqOp::Write {
            offset: 4 * BS,
            data: Bytes::from(vec![2; BS as usize]),
            fua: true,
        },
    );
    h.wait(1, &mut |_| 0).result.unwrap();
    h.wait(2, &mut |_| 0).result.unwrap();
    let st = h.engine.stats().clone();
    assert_eq!((st.bypassed_pieces, st.admitted_pieces), (1, 1), "{st:?}");
}

/// The pieces of one bypassed request go out as one backing write; a critical
/// waiter on one of its blocks reissues just that piece, and the shared
/// backing write then completes the other pieces only.
#[test]
fn a_bypassed_request_is_one_backing_write_and_reissues_piecewise() {
    let mut h = MemHarness::new(cfg(
        WritePolicyKind::WriteBack,
        AdmissionKind::CriticalPiIoi,
    ));
    h.submit_tagged(1, write(4 * BS, 3, 4 * BS), tag(false));
    let cmds: Vec<_> = h.inflight().iter().cloned().collect();
    assert_eq!(cmds.len(), 1, "{cmds:?}");
    assert!(
        matches!(&cmds[0].op, IoOp::Write { offset, data, fua: false } if *offset == 4 * BS && data.len() as u64 == 4 * BS),
        "{cmds:?}"
    );
    // A critical read of the third block: that piece is reissued.
    h.submit_tagged(
        2,
        ReqOp::Read {
            offset: 6 * BS,
            len: BS as u32,
        },
        tag(true),
    );
    assert_eq!(h.engine.stats().reissued_writes, 1);
    // Finish the reissue and the read before the backing write.
    let r = h.wait(2, &mut |n| n - 1);
    assert_block(r.result.unwrap().unwrap().to_vec(), 3, "critical read");
    assert!(
        !h.replies.iter().any(|r| r.id == 1),
        "the other pieces wait for the backing write"
    );
    let r = h.wait(1, &mut |_| 0);
    r.result.unwrap();
    h.settle(&mut |_| 0);
    let st = h.engine.stats().clone();
    assert_eq!(
        (
            st.bypassed_pieces,
            st.reissued_writes,
            st.discarded_completions
        ),
        (4, 1, 1),
        "{st:?}"
    );
    for (i, lbn) in (4..8).enumerate() {
        assert_block(
            read(&mut h, 10 + i as u64, lbn * BS, BS as u32),
            3,
            format!("block {lbn}"),
        );
    }
}

/// `inherit_request` on a rejected FUA write still queued behind its block
/// turns it into a cached write; its reply then waits for a metadata commit,
/// so it survives a crash right after the reply (the VOPR found a version
/// that replied at once).
#[test]
fn inherited_fua_write_is_durable_when_acknowledged() {
    let mut h = MemHarness::new(cfg(
        WritePolicyKind::WriteBack,
        AdmissionKind::CriticalPiIoi,
    ));
    h.submit_tagged(1, write(0, 1, BS), tag(false));
    h.submit_tagged(
        2,
        ReqOp::Write {
            offset: 0,
            data: Bytes::from(vec![2; BS as usize]),
            fua: true,
        },
        tag(false),
    );
    h.engine.inherit_request(h.now, 2);
    h.wait(2, &mut |_| 0).result.unwrap();
    let st = h.engine.stats().clone();
    assert_eq!(
        st.bypassed_pieces, 1,
        "only the first write bypassed: {st:?}"
    );
    h.reopen().unwrap();
    assert_block(read(&mut h, 3, 0, BS as u32), 2, "FUA write after a crash");
}

/// Write-back with `bypass_when_full`: once every slot holds dirty data, a
/// write to an uncached block goes around the cache as an ordinary backing
/// write instead of waiting for a destage; a write to a cached block still
/// goes to the cache; the next FLUSH flushes the backing store. Without the
/// option the same write waits for space.
#[test]
fn a_full_write_back_cache_sends_new_blocks_around_it() {
    for on in [true, false] {
        let mut c = Config::new(BS as u32, 16, 1024 * BS, WritePolicyKind::WriteBack);
        c.bypass_when_full = on;
        c.free_reserve = 0;
        // No destage until asked: the cache fills with dirty blocks.
        c.watermarks = Watermarks {
            high: 1.0,
            low: 1.0,
        };
        let mut h = MemHarness::new(c);
        for i in 0..16 {
            h.submit(i + 1, write(i * BS, 1, BS));
            h.wait(i + 1, &mut |_| 0).result.unwrap();
        }
        assert_eq!(h.engine.stats().free_slots, 0, "on={on}: full");
        h.submit(100, write(200 * BS, 7, BS));
        let cmds: Vec<_> = h.inflight().iter().cloned().collect();
        let around = cmds.iter().any(|c| {
            c.dev == Dev::Backing
                && matches!(&c.op, IoOp::Write { offset, fua: false, .. } if *offset == 200 * BS)
        });
        let st = h.engine.stats().clone();
        if on {
            assert!(
                around,
                "on: the new block goes to the backing store: {cmds:?}"
            );
            assert_eq!(st.full_bypassed_writes, 1, "{st:?}");
            assert_eq!(st.admission_stalls, 0, "{st:?}");
            h.wait(100, &mut |_| 0).result.unwrap();
            assert_eq!(h.backing[200 * BS as usize], 7);
            // A cached block is rewritten in the cache, never around it.
            h.submit(101, write(3 * BS, 8, BS));
            h.wait(101, &mut |_| 0).result.unwrap();
            assert_eq!(h.backing[3 * BS as usize], 0, "block 3 stays in the cache");
            let flushes = h.engine.stats().backing_flushes;
            h.submit(102, ReqOp::Flush);
            h.wait(102, &mut |_| 0).result.unwrap();
            assert!(
                h.engine.stats().backing_flushes > flushes,
                "the FLUSH covers the bypass write"
            );
            assert_block(read(&mut h, 103, 200 * BS, BS as u32), 7, "bypassed");
            assert_block(read(&mut h, 104, 3 * BS, BS as u32), 8, "cached");
        } else {
            assert!(!around, "off: {cmds:?}");
            assert_eq!(st.full_bypassed_writes, 0, "{st:?}");
            assert_eq!(st.admission_stalls, 1, "off: the write waits for space");
            h.wait(100, &mut |_| 0).result.unwrap();
        }
    }
}

/// While writes go around a full write-back cache, its cleaner is paced
/// (`Config::full_clean_secs`): it destages far less than at full speed,
/// with the same writes, every block still reads back, and once the writes
/// stop the cleaner catches up at full speed (down to the low watermark).
#[test]
fn a_full_write_back_cache_paces_its_cleaning() {
    let run = |secs: u32| {
        let mut c = Config::new(BS as u32, 64, 4096 * BS, WritePolicyKind::WriteBack);
        c.bypass_when_full = true;
        c.full_clean_secs = secs;
        let mut h = MemHarness::new(c);
        // First touch of 1024 blocks, 16 times the cache, 32 writes at a
        // time: it fills, then new blocks go around it.
        for batch in (0..1024u64).collect::<Vec<_>>().chunks(32) {
            for &i in batch {
                let b = (i * 37) % 1024;
                h.submit(i + 1, write(b * BS, (b % 251) as u8 + 1, BS));
            }
            for &i in batch {
                h.wait(i + 1, &mut |_| 0).result.unwrap();
            }
        }
        let during = h.engine.stats().clone();
        assert!(during.full_bypassed_writes > 500, "{during:?}");
        assert!(
            h.now < 1_000_000_000,
            "the writes ran within the pacing window"
        );
        // Idle: the cleaner goes back to full speed, down to the low watermark.
        h.settle(&mut |_| 0);
        let after = h.engine.stats().clone();
        assert!(after.dirty_blocks <= 32, "secs={secs}: {after:?}");
        for b in (0..1024u64).step_by(61) {
            assert_block(
                read(&mut h, 10_000 + b, b * BS, BS as u32),
                (b % 251) as u8 + 1,
                "every block reads back",
            );
        }
        during.destaged_blocks
    };
    let (paced, full_speed) = (run(40), run(0));
    eprintln!("blocks destaged while writes went around: paced {paced}, full speed {full_speed}");
    assert!(full_speed > 0, "unpaced, the cleaner keeps destaging");
    assert!(
        paced * 4 <= full_speed,
        "paced: {paced} blocks destaged, at full speed {full_speed}"
    );
}

/// A write-back cache under critical admission with I/O criticality
/// inheritance, no free reserve and cleaning from the first dirty block,
/// every one of its 64 slots holding a clean block (critical writes of 7s
/// to blocks 0..64, destaged at once; request ids 10..74).
fn full_of_clean_blocks_without_reserve() -> MemHarness {
    let mut c = cfg(WritePolicyKind::WriteBack, AdmissionKind::CriticalPiIoi);
    c.free_reserve = 0;
    c.watermarks = Watermarks {
        high: 0.0,
        low: 0.0,
    };
    let mut h = MemHarness::new(c);
    for b in 0..64u64 {
        let id = 10 + b;
        h.submit_tagged(id, write(b * BS, 7, BS), tag(true));
        h.wait(id, &mut |_| 0).result.unwrap();
    }
    h.settle(&mut |_| 0);
    h
}

/// I/O criticality inheritance in a cache full of clean blocks: the reissue
/// finds no free slot, waits for one (a clean block is evicted for it and
/// a commit frees the slot), and then goes to the cache while the original
/// backing write is still in flight. Refusing it instead (the engine before
/// the deferred reissue) left the critical request waiting for the backing
/// store.
#[test]
fn a_reissue_in_a_cache_full_of_clean_blocks_waits_for_a_slot() {
    let mut h = full_of_clean_blocks_without_reserve();
    assert_eq!(h.engine.stats().dirty_blocks, 0, "all clean");
    assert_eq!(h.engine.stats().free_slots, 0, "no free slot left");
    // A non-critical write bypasses the cache; keep its backing write back.
    h.submit_tagged(1, write(100 * BS, 5, BS), tag(false));
    let is_bypass = |c: &IoCmd<Bytes>| is_backing_write_at(c, 100 * BS);
    assert!(h.inflight().iter().any(is_bypass), "bypass write in flight");
    // A critical read waits behind it: I/O inheritance asks for a reissue.
    let st = critical_read_until_reissued(&mut h, 2, 100 * BS, 100);
    assert_eq!(
        st.reissued_writes, 1,
        "the reissue waited for a slot: {st:?}"
    );
    assert!(
        st.evictions >= 1,
        "a clean block was evicted for it: {st:?}"
    );
    assert!(
        h.inflight().iter().any(is_bypass),
        "the original backing write is still in flight"
    );
    let r = h.wait(2, &mut |_| 0);
    assert_block(r.result.unwrap().unwrap().to_vec(), 5, "critical read");
    h.settle(&mut |_| 0);
    assert_eq!(h.engine.stats().discarded_completions, 1);
    assert_eq!(h.backing[100 * BS as usize], 5);
}

/// Write-back, a rejected write to a block the cache holds clean: with
/// free slots it is cached (the clean copy stays the block's version);
/// with no slot to spare the clean copy, durably clean, is dropped and the
/// write goes around the cache (`drop_clean_for_bypass`). Either way the
/// block reads back new, before and after a reopen.
#[test]
fn a_clean_copy_is_dropped_for_a_bypass_only_when_no_slot_is_spare() {
    let mut c = Config::new(BS as u32, 16, 1024 * BS, WritePolicyKind::WriteBack);
    c.admission = AdmissionKind::Critical;
    c.free_reserve = 0;
    c.watermarks = Watermarks {
        high: 0.0,
        low: 0.0,
    };
    let mut h = MemHarness::new(c);
    let fill = |h: &mut MemHarness, blocks: std::ops::Range<u64>| {
        let blocks_end = blocks.end;
        for b in blocks {
            h.submit_tagged(10 + b, write(b * BS, 7, BS), tag(true));
            h.wait(10 + b, &mut |_| 0).result.unwrap();
        }
        let flush = 100 + blocks_end;
        h.submit(flush, ReqOp::Flush);
        h.wait(flush, &mut |_| 0).result.unwrap();
        h.settle(&mut |_| 0);
        assert_eq!(h.engine.stats().dirty_blocks, 0, "all clean");
    };
    // Half the cache clean, half free: the rejected write is cached.
    fill(&mut h, 0..8);
    h.submit_tagged(1, write(2 * BS, 8, BS), tag(false));
    h.wait(1, &mut |_| 0).result.unwrap();
    let st = h.engine.stats().clone();
    assert_eq!(st.bypass_refused, 1, "{st:?}");
    assert_eq!(
        (st.bypassed_pieces, st.full_dropped_clean),
        (0, 0),
        "{st:?}"
    );
    assert_block(read(&mut h, 2, 2 * BS, BS as u32), 8, "cached");
    // Every slot clean: the rejected write drops block 5's copy and goes
    // to the backing store.
    fill(&mut h, 8..16);
    assert_eq!(h.engine.stats().free_slots, 0, "no free slot");
    h.submit_tagged(3, write(5 * BS, 9, BS), tag(false));
    h.wait(3, &mut |_| 0).result.unwrap();
    let st = h.engine.stats().clone();
    assert_eq!(
        (st.bypassed_pieces, st.full_dropped_clean),
        (1, 1),
        "{st:?}"
    );
    assert_eq!(st.bypass_refused, 1, "{st:?}");
    assert_eq!(h.backing[5 * BS as usize], 9, "around the cache");
    assert_block(read(&mut h, 4, 5 * BS, BS as u32), 9, "bypassed");
    h.submit(5, ReqOp::Flush);
    h.wait(5, &mut |_| 0).result.unwrap();
    h.reopen().unwrap();
    assert_block(read(&mut h, 6, 5 * BS, BS as u32), 9, "after a reopen");
    assert_block(read(&mut h, 7, 2 * BS, BS as u32), 8, "after a reopen");
}

/// The admission counters (`count_admitted`, `count_bypassed`): pieces
/// and bypassed bytes of every request, and the pieces of requests tagged
/// critical again on their own, whichever admission policy decided (`wal`
/// here, which ignores the tag), under write-back (`admission_bypasses`)
/// and write-through (`write_through_piece`).
#[test]
fn admission_counters_split_pieces_bytes_and_the_critical_class() {
    for policy in [WritePolicyKind::WriteBack, WritePolicyKind::WriteThrough] {
        let mut c = cfg(policy, AdmissionKind::Wal);
        c.wal_ranges = vec![(16 * BS, 4 * BS)];
        let mut h = MemHarness::new(c);
        // Outside the log range, around the cache: a whole block and 1000
        // bytes of the next, tagged critical; then one block, not.
        h.submit_tagged(1, write(0, 1, BS + 1000), tag(true));
        h.wait(1, &mut |_| 0).result.unwrap();
        h.submit_tagged(2, write(4 * BS, 2, BS), tag(false));
        h.wait(2, &mut |_| 0).result.unwrap();
        // In the log range, cached: two blocks tagged critical, one not.
        h.submit_tagged(3, write(16 * BS, 3, 2 * BS), tag(true));
        h.wait(3, &mut |_| 0).result.unwrap();
        h.submit_tagged(4, write(18 * BS, 4, BS), tag(false));
        h.wait(4, &mut |_| 0).result.unwrap();
        h.settle(&mut |_| 0);
        let st = h.engine.stats().clone();
        assert_eq!(
            (
                st.bypassed_pieces,
                st.bypassed_bytes,
                st.critical_bypassed_pieces
            ),
            (3, 2 * BS + 1000, 2),
            "{policy}: {st:?}"
        );
        assert_eq!(
            (st.admitted_pieces, st.critical_admitted_pieces),
            (3, 2),
            "{policy}: {st:?}"
        );
        assert_eq!(h.backing[BS as usize + 999], 1, "{policy}");
        assert_eq!(h.backing[BS as usize + 1000], 0, "{policy}");
    }
}

/// A 16-slot write-back cache admitting only critical writes, no reserve,
/// no destage until space is short, with blocks `0..blocks` written
/// (critical, one value 7) and flushed (request ids 10.. and 1).
fn critical_write_back_filled(blocks: u64) -> MemHarness {
    let mut c = Config::new(BS as u32, 16, 1024 * BS, WritePolicyKind::WriteBack);
    c.admission = AdmissionKind::Critical;
    c.free_reserve = 0;
    c.watermarks = Watermarks {
        high: 1.0,
        low: 1.0,
    };
    let mut h = MemHarness::new(c);
    for b in 0..blocks {
        h.submit_tagged(10 + b, write(b * BS, 7, BS), tag(true));
        h.wait(10 + b, &mut |_| 0).result.unwrap();
    }
    h.submit(1, ReqOp::Flush);
    h.wait(1, &mut |_| 0).result.unwrap();
    h
}

/// Write-back, every slot dirty and committed: a rejected write to a cached
/// block never drops the block's version to go around the cache
/// (`drop_clean_for_bypass` drops only a clean, idle, durably clean one),
/// whatever else holds of it (unreferenced, not destaging, no commit
/// pending). It is cached, waits for a slot, and reads back new, also
/// after a crash and recovery.
#[test]
fn a_dirty_committed_version_is_never_dropped_for_a_bypass() {
    let mut h = critical_write_back_filled(16);
    let st = h.engine.stats().clone();
    assert_eq!((st.free_slots, st.dirty_blocks), (0, 16), "{st:?}");
    let t0 = h.now;
    h.submit_tagged(2, write(3 * BS, 9, BS), tag(false));
    h.wait(2, &mut |_| 0).result.unwrap();
    let st = h.engine.stats().clone();
    // It waited for a slot once (`alloc_and_write`): from its start to a
    // destage's cache read, backing write and backing FLUSH at least, one
    // harness nanosecond each, and never longer than the request took.
    assert_eq!(st.stalled_writes, 1, "{st:?}");
    assert!(
        (3..=h.now - t0).contains(&st.stall_ns),
        "{} ns in {}: {st:?}",
        st.stall_ns,
        h.now - t0
    );
    assert_eq!(
        (st.full_dropped_clean, st.bypassed_pieces, st.bypass_refused),
        (0, 0, 1),
        "{st:?}"
    );
    assert_eq!(h.backing[3 * BS as usize], 0, "not around the cache");
    assert_block(read(&mut h, 3, 3 * BS, BS as u32), 9, "cached");
    h.submit(4, ReqOp::Flush);
    h.wait(4, &mut |_| 0).result.unwrap();
    h.reopen().unwrap();
    assert_block(read(&mut h, 5, 3 * BS, BS as u32), 9, "after recovery");
}

/// A piece without a reservation (a rejected write cached after all)
/// takes a slot only if one is free beyond those reserved
/// (`alloc_and_write`): with one slot free and reserved by a partial
/// write whose fetch is in flight, a rejected write of a cached block
/// waits for a slot instead of taking that one.
#[test]
fn a_piece_without_a_reservation_leaves_the_reserved_slots_alone() {
    let mut h = critical_write_back_filled(15);
    assert_eq!(h.engine.stats().free_slots, 1);
    // A partial write of a block not cached: its slot is reserved while
    // the block is fetched.
    h.submit_tagged(2, write(20 * BS + 512, 5, 512), tag(true));
    let fetch = |c: &IoCmd<Bytes>| {
        c.dev == Dev::Backing && matches!(c.op, IoOp::Read { offset, .. } if offset == 20 * BS)
    };
    assert!(h.inflight().iter().any(fetch), "{:?}", h.inflight());
    h.submit_tagged(3, write(0, 9, BS), tag(false));
    let st = h.engine.stats().clone();
    let nines = h
        .inflight()
        .iter()
        .filter(|c| matches!(&c.op, IoOp::Write { data, .. } if data[0] == 9))
        .count();
    assert_eq!(nines, 0, "{:?}", h.inflight());
    assert_eq!((st.bypass_refused, st.stalled_writes), (1, 1), "{st:?}");
    h.wait(2, &mut |_| 0).result.unwrap();
    h.wait(3, &mut |_| 0).result.unwrap();
    h.settle(&mut |_| 0);
    assert_block(read(&mut h, 4, 0, BS as u32), 9, "rejected write");
    let b20 = read(&mut h, 5, 20 * BS, BS as u32);
    assert_eq!((b20[511], b20[512], b20[1023], b20[1024]), (0, 5, 5, 0));
}

/// A failed bypass write leaves its block's bytes on the backing store
/// unknown (`settle`: unsettled), so a read of the block does not fill the
/// cache with them; the next successful write of the block settles it, and
/// a read fills the cache again.
#[test]
fn a_failed_bypass_write_keeps_reads_from_filling_until_a_write_settles_it() {
    let mut c = cfg(WritePolicyKind::WriteBack, AdmissionKind::Critical);
    c.read_allocate = true;
    let mut h = MemHarness::new(c);
    let is_bypass = |c: &IoCmd<Bytes>| {
        c.dev == Dev::Backing && matches!(c.op, IoOp::Write { offset, .. } if offset == 3 * BS)
    };
    h.submit_tagged(1, write(3 * BS, 7, BS), tag(false));
    let i = h
        .inflight()
        .iter()
        .position(is_bypass)
        .expect("bypass write");
    h.complete_failed(i);
    assert!(h.wait(1, &mut |_| 0).result.is_err());
    read(&mut h, 2, 3 * BS, BS as u32);
    h.settle(&mut |_| 0);
    let st = h.engine.stats().clone();
    assert_eq!((st.bypassed_pieces, st.populates), (1, 0), "{st:?}");
    h.submit_tagged(3, write(3 * BS, 8, BS), tag(false));
    h.wait(3, &mut |_| 0).result.unwrap();
    assert_block(read(&mut h, 4, 3 * BS, BS as u32), 8, "settled");
    h.settle(&mut |_| 0);
    let st = h.engine.stats().clone();
    assert_eq!((st.bypassed_pieces, st.populates), (2, 1), "{st:?}");
}

/// Write-back with `critical_pi_ioi` and `bypass_when_full`: a critical
/// write that finds every slot dirty goes around the cache; a critical read
/// of its block then asks for a reissue, which waits until a destage and a
/// commit free a slot, and goes to the cache while the backing write is
/// still in flight. It counts as a reissue of a critical request
/// (`critical_reissued_writes`), the read gets the new bytes, and the
/// orphaned backing write's completion is discarded.
#[test]
fn a_critical_write_around_a_full_cache_is_reissued_as_critical() {
    let mut c = Config::new(BS as u32, 16, 1024 * BS, WritePolicyKind::WriteBack);
    c.admission = AdmissionKind::CriticalPiIoi;
    c.bypass_when_full = true;
    c.free_reserve = 0;
    let mut h = MemHarness::new(c);
    // Sixteen critical writes fill the cache; their destages wait.
    for b in 0..16u64 {
        h.submit_tagged(10 + b, write(b * BS, 1, BS), tag(true));
    }
    let backing_write =
        |c: &IoCmd<Bytes>| c.dev == Dev::Backing && matches!(c.op, IoOp::Write { .. });
    while let Some(i) = h.inflight().iter().position(|c| !backing_write(c)) {
        h.step(&mut |_| i);
    }
    let st = h.engine.stats().clone();
    assert_eq!((st.free_slots, st.dirty_blocks), (0, 16), "{st:?}");
    h.submit_tagged(1, write(200 * BS, 7, BS), tag(true));
    let is_bypass = |c: &IoCmd<Bytes>| is_backing_write_at(c, 200 * BS);
    assert!(h.inflight().iter().any(is_bypass), "around the full cache");
    let st = critical_read_until_reissued(&mut h, 2, 200 * BS, 1000);
    assert_eq!(
        (
            st.full_bypassed_writes,
            st.critical_bypassed_pieces,
            st.reissued_writes,
            st.critical_reissued_writes
        ),
        (1, 1, 1, 1),
        "{st:?}"
    );
    assert!(h.inflight().iter().any(is_bypass), "still in flight");
    let r = h.wait(2, &mut |_| 0);
    assert_block(r.result.unwrap().unwrap().to_vec(), 7, "critical read");
    h.settle(&mut |_| 0);
    let st = h.engine.stats().clone();
    assert_eq!(
        (st.discarded_completions, st.critical_reissued_writes),
        (1, 1),
        "{st:?}"
    );
    assert_eq!(h.backing[200 * BS as usize], 7);
}

/// Journaled, with the journal empty (everything checkpointed): a rejected
/// write bypasses only where no version of its block is cached
/// (`journal_bypass_ok`). A block the cache still holds (clean, after the
/// checkpoint) is written in the journal instead; a block that only a read
/// in flight names (its entry exists, nothing is cached) bypasses, as one
/// FUA backing write outside any transaction. Both read back new after a
/// crash.
#[test]
fn a_journaled_bypass_needs_no_cached_version_of_its_block() {
    for policy in [WritePolicyKind::Journaled, WritePolicyKind::JournaledHints] {
        let mut h = MemHarness::new(cfg(policy, AdmissionKind::Critical));
        h.submit_tagged(1, write(0, 1, BS), tag(true));
        h.wait(1, &mut |_| 0).result.unwrap();
        h.submit(2, ReqOp::Checkpoint);
        h.wait(2, &mut |_| 0).result.unwrap();
        h.settle(&mut |_| 0);
        // Block 0 is cached, clean: the rejected write joins a transaction.
        h.submit_tagged(3, write(0, 3, BS), tag(false));
        let r = h.wait(3, &mut |_| 0);
        assert!(r.result.is_ok() && r.seq != 0, "{policy}: {r:?}");
        let st = h.engine.stats().clone();
        assert_eq!(
            (st.bypassed_pieces, st.bypass_refused),
            (0, 1),
            "{policy}: {st:?}"
        );
        h.submit(4, ReqOp::Checkpoint);
        h.wait(4, &mut |_| 0).result.unwrap();
        h.settle(&mut |_| 0);
        // Block 5: a read of it in flight, then a rejected write: it bypasses.
        h.submit(
            5,
            ReqOp::Read {
                offset: 5 * BS,
                len: BS as u32,
            },
        );
        assert_eq!(h.inflight().len(), 1, "{policy}: the read miss");
        h.submit_tagged(6, write(5 * BS, 6, BS), tag(false));
        let cmds: Vec<_> = h.inflight().iter().cloned().collect();
        assert!(
            cmds.iter().any(|c| c.dev == Dev::Backing
                && matches!(&c.op, IoOp::Write { offset, fua: true, .. } if *offset == 5 * BS)),
            "{policy}: one FUA backing write: {cmds:?}"
        );
        let r = h.wait(6, &mut |_| 0);
        assert!(r.result.is_ok() && r.seq == 0, "{policy}: {r:?}");
        h.settle(&mut |_| 0);
        let st = h.engine.stats().clone();
        assert_eq!(
            (st.bypassed_pieces, st.bypass_refused),
            (1, 1),
            "{policy}: {st:?}"
        );
        h.reopen().unwrap();
        assert_block(read(&mut h, 7, 0, BS as u32), 3, policy);
        assert_block(read(&mut h, 8, 5 * BS, BS as u32), 6, policy);
    }
}

/// Ordered: a block whose dropped version a durable commit still names is
/// not bypassed (`a_block_recovery_could_resurrect_is_not_bypassed`), but
/// once the next commit frees that version (`try_release`) nothing stands
/// in the way: a rejected write of the block then bypasses, durable at once
/// (FUA), and reads back after a crash.
#[test]
fn a_bypass_is_taken_again_once_a_commit_frees_the_retired_version() {
    let mut h = eager(WritePolicyKind::Ordered, AdmissionKind::Critical);
    for b in 0..2u64 {
        h.submit_tagged(1 + b, write(b * BS, 1, BS), tag(true));
        h.wait(1 + b, &mut |_| 0).result.unwrap();
    }
    h.submit(3, ReqOp::Flush);
    h.wait(3, &mut |_| 0).result.unwrap();
    h.settle(&mut |_| 0);
    // Both destaged, clean; trim drops both copies, which the last
    // durable commit still names.
    h.submit(
        4,
        ReqOp::Trim {
            offset: 0,
            len: 2 * BS as u32,
        },
    );
    h.wait(4, &mut |_| 0).result.unwrap();
    assert_eq!(h.retired_pending(), 2);
    h.submit_tagged(5, write(BS, 5, BS), tag(false));
    h.wait(5, &mut |_| 0).result.unwrap();
    let st = h.engine.stats().clone();
    assert_eq!((st.bypassed_pieces, st.bypass_refused), (0, 1), "{st:?}");
    // The commit of the FLUSH frees block 0's version (block 1 has a
    // cached version again): block 0 bypasses now.
    h.submit(6, ReqOp::Flush);
    h.wait(6, &mut |_| 0).result.unwrap();
    h.settle(&mut |_| 0);
    assert_eq!(h.retired_pending(), 0);
    h.submit_tagged(7, write(0, 7, BS), tag(false));
    h.wait(7, &mut |_| 0).result.unwrap();
    let st = h.engine.stats().clone();
    assert_eq!((st.bypassed_pieces, st.bypass_refused), (1, 1), "{st:?}");
    assert_eq!(h.backing[0], 7, "around the cache");
    h.reopen().unwrap();
    assert_block(read(&mut h, 8, 0, BS as u32), 7, "block 0 after a crash");
    assert_block(read(&mut h, 9, BS, BS as u32), 5, "block 1 after a crash");
}

/// Write-back: a version destaged after the last commit named it dirty is
/// clean in memory but not durably clean (`retire`: `durably_clean`), so
/// once it is dropped (a trim) its block is not bypassed until a commit
/// records it: recovery would bring it back dirty and destage it over the
/// bypassed bytes. A rejected FUA write of the block is cached instead and
/// acknowledged after a commit, and it survives a crash right after.
#[test]
fn a_version_clean_only_since_the_last_commit_keeps_its_block_from_bypassing() {
    let mut h = eager(WritePolicyKind::WriteBack, AdmissionKind::Critical);
    let backing_write =
        |c: &IoCmd<Bytes>| c.dev == Dev::Backing && matches!(c.op, IoOp::Write { .. });
    // Run request `id` to its reply, holding back every backing write.
    let run_but_backing = |h: &mut MemHarness, id: ReqId| {
        while !h.replies.iter().any(|r| r.id == id) {
            let i = h
                .inflight()
                .iter()
                .position(|c| !backing_write(c))
                .expect("request stuck behind a backing write");
            h.step(&mut |_| i);
        }
    };
    h.submit_tagged(1, write(0, 1, BS), tag(true));
    run_but_backing(&mut h, 1);
    // The FLUSH commits block 0's version as dirty; its destage waits.
    h.submit(2, ReqOp::Flush);
    run_but_backing(&mut h, 2);
    let st = h.engine.stats().clone();
    assert_eq!((st.commits, st.destaged_blocks), (1, 0), "{st:?}");
    while h.engine.stats().destaged_blocks == 0 {
        assert!(h.step(&mut |_| 0), "the destage completes");
    }
    // Clean now, dirty in the durable table: the trim drops it.
    h.submit(
        3,
        ReqOp::Trim {
            offset: 0,
            len: BS as u32,
        },
    );
    h.wait(3, &mut |_| 0).result.unwrap();
    let st = h.engine.stats().clone();
    assert_eq!((st.cached_blocks, st.commits), (0, 1), "{st:?}");
    assert_eq!(h.retired_pending(), 1);
    h.submit_tagged(
        4,
        ReqOp::Write {
            offset: 0,
            data: Bytes::from(vec![9u8; BS as usize]),
            fua: true,
        },
        tag(false),
    );
    h.wait(4, &mut |_| 0).result.unwrap();
    let st = h.engine.stats().clone();
    assert_eq!((st.bypassed_pieces, st.bypass_refused), (0, 1), "{st:?}");
    h.reopen().unwrap();
    assert_block(
        read(&mut h, 5, 0, BS as u32),
        9,
        "the FUA write after a crash",
    );
}

/// `bypassed_bytes` counts each bypassed piece's own bytes, wherever in
/// its block it starts: 1000 bytes at offset 512 of a block are 1000.
#[test]
fn bypassed_bytes_count_a_piece_from_where_it_starts() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack, AdmissionKind::Critical));
    h.submit_tagged(1, write(3 * BS + 512, 4, 1000), tag(false));
    h.wait(1, &mut |_| 0).result.unwrap();
    let st = h.engine.stats().clone();
    assert_eq!(
        (
            st.bypassed_pieces,
            st.bypassed_bytes,
            st.critical_bypassed_pieces
        ),
        (1, 1000, 0),
        "{st:?}"
    );
    let b = read(&mut h, 2, 3 * BS, BS as u32);
    assert_eq!((b[511], b[512], b[1511], b[1512]), (0, 4, 4, 0));
}

/// I/O criticality inheritance reissues only whole-block pieces
/// (`reissue`): a bypassed write of part of a block (from its start, or
/// up to its end) is not reissued to the cache, since the cache would need
/// the block's other bytes; the critical read waits for the backing write
/// and gets the block with the write's bytes and the old ones around them.
#[test]
fn a_partial_bypass_write_is_never_reissued() {
    for (offset, len) in [(0, 1000), (BS - 1000, 1000)] {
        let mut h = MemHarness::new(cfg(
            WritePolicyKind::WriteBack,
            AdmissionKind::CriticalPiIoi,
        ));
        h.submit_tagged(1, write(4 * BS + offset, 6, len), tag(false));
        assert_eq!(h.engine.stats().bypassed_pieces, 1, "{offset}");
        h.submit_tagged(
            2,
            ReqOp::Read {
                offset: 4 * BS,
                len: BS as u32,
            },
            tag(true),
        );
        let r = h.wait(2, &mut |_| 0);
        let b = r.result.unwrap().unwrap().to_vec();
        for (i, &x) in b.iter().enumerate() {
            let want = if (offset..offset + len).contains(&(i as u64)) {
                6
            } else {
                0
            };
            assert_eq!(x, want, "offset {offset}: byte {i}");
        }
        h.settle(&mut |_| 0);
        let st = h.engine.stats().clone();
        assert_eq!(
            (st.reissued_writes, st.discarded_completions),
            (0, 0),
            "{offset}: {st:?}"
        );
    }
}

/// A critical request waiting on a block whose write waits for a free slot
/// moves that write to the head of the slot queue (`inherit`): of three
/// rejected writes of cached blocks queued for a slot on a full write-back
/// cache, the one a critical read waits on (the last queued) gets the
/// first slot and completes first; the read gets its bytes.
#[test]
fn a_critical_waiter_moves_its_blocks_write_to_the_head_of_the_slot_queue() {
    let mut h = critical_write_back_filled(16);
    for (id, lbn) in [(2, 3u64), (3, 5), (4, 7)] {
        h.submit_tagged(id, write(lbn * BS, id as u8, BS), tag(false));
    }
    let st = h.engine.stats().clone();
    assert_eq!((st.bypass_refused, st.stalled_writes), (3, 3), "{st:?}");
    h.submit_tagged(
        5,
        ReqOp::Read {
            offset: 7 * BS,
            len: BS as u32,
        },
        tag(true),
    );
    let r = h.wait(5, &mut |_| 0);
    assert_block(r.result.unwrap().unwrap().to_vec(), 4, "critical read");
    h.settle(&mut |_| 0);
    let order: Vec<ReqId> = h.replies.iter().map(|r| r.id).collect();
    assert_eq!(order, [4, 2, 3], "{:?}", h.engine.stats());
    assert_eq!(h.engine.stats().inherited, 1);
    for (id, lbn) in [(2, 3u64), (3, 5), (4, 7)] {
        assert_block(read(&mut h, 10 + id, lbn * BS, BS as u32), id as u8, lbn);
    }
}

/// I/O inheritance is for critical waiters only: a non-critical read that
/// waits behind a bypass write in flight leaves that write on the backing
/// store (no reissue to the cache, nothing inherited), and reads its bytes
/// once it completes.
#[test]
fn a_non_critical_waiter_does_not_reissue_a_bypass_write() {
    let mut h = MemHarness::new(cfg(
        WritePolicyKind::WriteBack,
        AdmissionKind::CriticalPiIoi,
    ));
    h.submit_tagged(1, write(100 * BS, 5, BS), tag(false));
    let bypass = |c: &IoCmd<Bytes>| is_backing_write_at(c, 100 * BS);
    assert!(h.inflight().iter().any(bypass), "bypass write in flight");
    let read = ReqOp::Read {
        offset: 100 * BS,
        len: BS as u32,
    };
    h.submit_tagged(2, read, tag(false));
    for _ in 0..100 {
        let Some(i) = h.inflight().iter().position(|c| !bypass(c)) else {
            break;
        };
        h.step(&mut |_| i);
    }
    let st = h.engine.stats().clone();
    assert_eq!((st.reissued_writes, st.inherited), (0, 0), "{st:?}");
    assert!(
        h.inflight().iter().any(bypass),
        "still on the backing store"
    );
    assert!(h.replies.iter().all(|r| r.id != 2), "the read waits for it");
    let got = h.wait(2, &mut |_| 0).result.unwrap().expect("read data");
    assert_block(got.to_vec(), 5, "read after the bypass write");
}

/// `inherit_request` reissues the bypass writes of the request it names,
/// and no other request's: two non-critical writes bypass the cache, each
/// to its own block; inheriting the first reissues its write alone to the
/// cache.
#[test]
fn inherit_request_reissues_only_that_requests_bypass_writes() {
    let mut h = MemHarness::new(cfg(
        WritePolicyKind::WriteBack,
        AdmissionKind::CriticalPiIoi,
    ));
    h.submit_tagged(1, write(0, 1, BS), tag(false));
    h.submit_tagged(2, write(10 * BS, 2, BS), tag(false));
    assert!(h.inflight().iter().any(|c| is_backing_write_at(c, 0)));
    assert!(h.inflight().iter().any(|c| is_backing_write_at(c, 10 * BS)));
    h.engine.inherit_request(h.now, 1);
    let cached: Vec<u8> = h
        .inflight()
        .iter()
        .filter_map(|c| match &c.op {
            IoOp::Write { data, .. } if c.dev == Dev::Cache => Some(data[0]),
            _ => None,
        })
        .collect();
    assert_eq!(cached, vec![1], "request 1's write reissued, alone");
    assert_eq!(h.engine.stats().reissued_writes, 1);
    h.settle(&mut |_| 0);
    assert_eq!(h.engine.stats().reissued_writes, 1);
}

/// Under an admission policy that does not reissue (`Critical`), a
/// request's pieces still queued when it inherits criticality keep their
/// bypass: a second non-critical write to a block, queued behind the
/// first's bypass write, bypasses too.
#[test]
fn inherit_request_keeps_a_queued_bypass_without_reissue() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack, AdmissionKind::Critical));
    h.submit_tagged(1, write(0, 1, BS), tag(false));
    h.submit_tagged(2, write(0, 2, BS), tag(false));
    assert_eq!(
        h.inflight().len(),
        1,
        "the second write waits for the block"
    );
    h.engine.inherit_request(h.now, 2);
    h.wait(1, &mut |_| 0).result.unwrap();
    h.wait(2, &mut |_| 0).result.unwrap();
    h.settle(&mut |_| 0);
    let st = h.engine.stats();
    assert_eq!(st.bypassed_pieces, 2, "{st:?}");
    assert_eq!(st.reissued_writes, 0, "{st:?}");
    assert_eq!(h.backing[0], 2);
}

/// Two reissues wait for a slot in a cache full of clean blocks; the
/// first one's bypass write then completes from the backing store: only
/// that reissue is dropped (it is moot now), and the other still goes to
/// the cache once a slot is free, while its backing write is in flight.
#[test]
fn a_completed_bypass_write_drops_only_its_own_pending_reissue() {
    let mut h = full_of_clean_blocks_without_reserve();
    assert_eq!(h.engine.stats().free_slots, 0, "no free slot left");
    h.submit_tagged(1, write(100 * BS, 5, BS), tag(false));
    h.submit_tagged(2, write(200 * BS, 6, BS), tag(false));
    let x = |c: &IoCmd<Bytes>| is_backing_write_at(c, 100 * BS);
    let y = |c: &IoCmd<Bytes>| is_backing_write_at(c, 200 * BS);
    assert!(h.inflight().iter().any(x) && h.inflight().iter().any(y));
    h.engine.inherit_request(h.now, 1);
    h.engine.inherit_request(h.now, 2);
    assert_eq!(h.engine.stats().reissued_writes, 0, "both wait for a slot");
    // The first bypass write completes.
    let i = h.inflight().iter().position(x).unwrap();
    assert!(h.step(&mut |_| i));
    assert!(h.replies.iter().any(|r| r.id == 1));
    // Everything else but the second bypass write.
    for _ in 0..1000 {
        if h.engine.stats().reissued_writes > 0 {
            break;
        }
        let Some(i) = h.inflight().iter().position(|c| !y(c)) else {
            break;
        };
        assert!(h.step(&mut |_| i));
    }
    let st = h.engine.stats();
    assert_eq!(
        st.reissued_writes, 1,
        "the second reissue went ahead: {st:?}"
    );
    assert!(
        h.inflight().iter().any(y),
        "its backing write still in flight"
    );
    h.wait(2, &mut |_| 0).result.unwrap();
    h.settle(&mut |_| 0);
    assert_eq!(h.engine.stats().discarded_completions, 1);
    assert_eq!(h.backing[200 * BS as usize], 6);
}

/// A write that starts while reads of its block are in flight makes their
/// data unfit to cache (`Block::fill_stale`: a read in flight beside the
/// write may return the bytes from before it), until the last of those
/// reads ends, not the first (`Block::remove_reader`). Two reads of a cold
/// block are in flight when a non-critical write of it bypasses the cache;
/// the first read ends, then the write, then the second read: neither read
/// fills the cache, and the block reads back as written.
#[test]
fn reads_in_flight_across_a_bypassed_write_fill_nothing_until_the_last_ends() {
    let mut c = cfg(WritePolicyKind::WriteBack, AdmissionKind::Critical);
    c.read_allocate = true;
    let mut h = MemHarness::new(c);
    for id in [1, 2] {
        h.submit_tagged(
            id,
            ReqOp::Read {
                offset: 3 * BS,
                len: BS as u32,
            },
            tag(true),
        );
    }
    h.submit_tagged(3, write(3 * BS, 7, BS), tag(false));
    let cmds: Vec<IoCmd<Bytes>> = h.inflight().iter().cloned().collect();
    let reads: Vec<usize> = (0..cmds.len())
        .filter(|&i| cmds[i].dev == Dev::Backing && matches!(cmds[i].op, IoOp::Read { .. }))
        .collect();
    assert_eq!(reads.len(), 2, "two backing reads: {cmds:?}");
    assert!(
        cmds.iter().any(|c| is_backing_write_at(c, 3 * BS)),
        "the bypass write: {cmds:?}"
    );
    let (r1, r2) = (cmds[reads[0]].id, cmds[reads[1]].id);
    let step_id = |h: &mut MemHarness, id: IoId| {
        let i = h
            .inflight()
            .iter()
            .position(|c| c.id == id)
            .expect("in flight");
        h.step(&mut |_| i);
    };
    step_id(&mut h, r1);
    let w = h
        .inflight()
        .iter()
        .find(|c| is_backing_write_at(c, 3 * BS))
        .expect("the bypass write")
        .id;
    step_id(&mut h, w);
    step_id(&mut h, r2);
    h.settle(&mut |_| 0);
    assert_eq!(h.replies.len(), 3, "every request answered");
    let st = h.engine.stats();
    assert_eq!((st.bypassed_pieces, st.populates), (1, 0), "{st:?}");
    assert!(read(&mut h, 4, 3 * BS, BS as u32).iter().all(|&b| b == 7));
}
