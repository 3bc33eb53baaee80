//! What the unordered write policies (write-through, write-back) keep of
//! the cache across a restart: a clean shutdown keeps every copy (the cache
//! restarts warm); after a crash the backing store may hold newer bytes than
//! a clean copy, so clean copies go, and only write-back's dirty versions
//! (the newest acknowledged data) stay. Mutation testing
//! (`scripts/mutants.sh`) found the policies' recovery rules unchecked.

use bytes::Bytes;
use nvwc_core::testkit::MemHarness;
use nvwc_core::*;

const BS: u64 = 4096;

fn harness(policy: WritePolicyKind) -> MemHarness {
    let mut c = Config::new(BS as u32, 32, 128 * BS, policy);
    // No cleaning but what a test asks for.
    c.watermarks = Watermarks {
        high: 1.0,
        low: 1.0,
    };
    MemHarness::new(c)
}

fn run(h: &mut MemHarness, id: ReqId, op: ReqOp<Bytes>) -> Option<Bytes> {
    h.submit(id, op);
    h.wait(id, &mut |_| 0).result.unwrap()
}

/// Write block `lbn` whole with `byte`.
fn write(h: &mut MemHarness, id: ReqId, lbn: u64, byte: u8) {
    let data = Bytes::from(vec![byte; BS as usize]);
    run(
        h,
        id,
        ReqOp::Write {
            offset: lbn * BS,
            data,
            fua: false,
        },
    );
}

/// Read block `lbn` after a reopen; asserts its bytes and returns whether
/// the cache served it.
fn read_hit(h: &mut MemHarness, id: ReqId, lbn: u64, byte: u8) -> bool {
    let before = h.engine.stats().read_hits;
    let op = ReqOp::Read {
        offset: lbn * BS,
        len: BS as u32,
    };
    let got = run(h, id, op).unwrap();
    assert!(got.iter().all(|&b| b == byte), "block {lbn}");
    h.engine.stats().read_hits > before
}

fn shut_down(h: &mut MemHarness) {
    h.engine.start_shutdown(h.now);
    h.settle(&mut |_| 0);
}

/// Restart after a clean shutdown (`clean`) or a crash; recovery MUST keep
/// `dirty` dirty versions and `kept` clean copies.
fn restart(h: &mut MemHarness, clean: bool, dirty: u64, kept: u64) {
    if clean {
        shut_down(h);
    }
    let rep = h.reopen().unwrap();
    assert_eq!(rep.clean_shutdown, clean);
    let got = (rep.dirty_versions, rep.clean_versions);
    assert_eq!(got, (dirty, kept), "clean shutdown {clean}: {rep:?}");
}

/// A driver calls `handle_timeout` at each deadline: an engine left with
/// nothing to do MUST NOT ask for one already due, or the driver spins.
#[test]
fn a_settled_engine_wants_no_timeout_already_due() {
    for policy in WritePolicyKind::ALL {
        let mut h = harness(policy);
        write(&mut h, 1, 0, 1);
        run(&mut h, 2, ReqOp::Flush);
        h.settle(&mut |_| 0);
        let t = h.engine.poll_timeout();
        assert!(t.is_none_or(|t| t > h.now), "{policy}: {t:?} at {}", h.now);
    }
}

/// Write-through and write-back have no state of their own to report.
#[test]
fn unordered_policies_report_no_counters() {
    for policy in [WritePolicyKind::WriteThrough, WritePolicyKind::WriteBack] {
        let mut h = harness(policy);
        write(&mut h, 1, 0, 1);
        assert_eq!(h.engine.policy_counters(), vec![], "{policy}");
    }
}

/// Write-back overwrites a dirty version that no commit names yet in
/// place: writes of one block between commits take one slot, not one each,
/// and each rewrite counts as an overwrite.
#[test]
fn write_back_overwrites_an_uncommitted_version_in_place() {
    let mut h = harness(WritePolicyKind::WriteBack);
    let free = h.engine.stats().free_slots;
    for i in 0..10 {
        write(&mut h, i + 1, 0, i as u8);
    }
    assert_eq!(
        h.engine.stats().free_slots,
        free - 1,
        "{}",
        h.engine.debug_state()
    );
    assert_eq!(h.engine.dirty_versions(), 1);
    // Counted as overwrites (`overwrite_in_place`), nine of them.
    assert_eq!(h.engine.stats().overwrites, 9, "{:?}", h.engine.stats());
    assert!(read_hit(&mut h, 20, 0, 9));
}

/// A version a durable commit names is overwritten in place only by
/// write-back with `rewrite_in_place`. Otherwise the overwrite takes a fresh
/// slot, and a crash before the next FLUSH recovers the flushed version
/// exactly (journaled: a FLUSH does not close the open transaction, so the
/// overwrite belongs to the same one).
#[test]
fn only_write_back_rewrites_a_committed_version_in_place_and_only_when_configured() {
    for (policy, in_place) in [
        (WritePolicyKind::WriteBack, false),
        (WritePolicyKind::WriteBack, true),
        (WritePolicyKind::Journaled, false),
        (WritePolicyKind::Ordered, false),
    ] {
        let mut c = harness(policy).engine.config().clone();
        c.rewrite_in_place = in_place;
        c.journal.txn_max_age_ns = 0;
        // Flushed log commits: the second one seals the first (an inline
        // commit flushes no slot, so it seals nothing for in-place rewrites;
        // `commit::an_inline_commit_seals_no_version_for_in_place_rewrites`).
        c.log_inline_bytes = 0;
        let mut h = MemHarness::new(c);
        write(&mut h, 1, 0, 1);
        run(&mut h, 2, ReqOp::Flush);
        // A later commit seals the one that named block 0's version.
        write(&mut h, 3, 5, 5);
        run(&mut h, 4, ReqOp::Flush);
        let free = h.engine.stats().free_slots;
        write(&mut h, 5, 0, 2);
        let used = free - h.engine.stats().free_slots;
        assert_eq!(
            used,
            u64::from(!in_place),
            "{policy}, rewrite in place {in_place}"
        );
        if !in_place {
            h.reopen().unwrap();
            let hit = read_hit(&mut h, 6, 0, 1);
            assert!(hit, "{policy}: the flushed version, from the cache");
        }
    }
}

/// Nothing changed, nothing to clean: time passing costs no commit and no
/// destage plan.
#[test]
fn an_idle_write_back_cache_neither_commits_nor_destages() {
    let mut h = harness(WritePolicyKind::WriteBack);
    write(&mut h, 1, 0, 1);
    run(&mut h, 2, ReqOp::Flush);
    h.settle(&mut |_| 0);
    let before = h.engine.stats();
    for _ in 0..3 {
        h.now += 10_000_000_000;
        h.engine.handle_timeout(h.now);
        h.settle(&mut |_| 0);
    }
    let after = h.engine.stats();
    assert_eq!(after.commits, before.commits);
    assert_eq!(after.destage_plans, 0);
    assert_eq!(after.dirty_blocks, 1);
}

#[test]
fn write_through_restarts_warm_only_after_a_clean_shutdown() {
    for clean in [true, false] {
        let mut h = harness(WritePolicyKind::WriteThrough);
        for b in 0..4 {
            write(&mut h, b + 1, b, b as u8 + 1);
        }
        run(&mut h, 10, ReqOp::Flush);
        assert_eq!(h.backing[0], 1, "written through before the reply");
        // A write-through FLUSH is the backing store's; the autocommit
        // names the four copies on the cache device.
        let before = h.engine.durable_commit();
        h.settle(&mut |_| 0);
        assert!(h.engine.durable_commit() > before);
        restart(&mut h, clean, 0, if clean { 4 } else { 0 });
        for b in 0..4 {
            let hit = read_hit(&mut h, 20 + b, b, b as u8 + 1);
            assert_eq!(hit, clean, "clean shutdown {clean}: block {b}");
        }
    }
}

/// A clean-shutdown record vouches for every clean copy it names, so a
/// write acknowledged after a warm restart MUST NOT leave an older copy for
/// a crash to bring back: write-through's writes (on the backing store when
/// acknowledged, no commit of their own) and every policy's FUA writes.
/// Before the fix, write-through served the pre-restart copy after the
/// crash (`nvwc serve`: clean stop, restart, rewrite, `kill -9`, read).
#[test]
fn a_write_after_a_warm_restart_survives_a_crash() {
    for policy in WritePolicyKind::ALL {
        for fua in [false, true] {
            if !fua && policy != WritePolicyKind::WriteThrough {
                // Only write-through promises a plain write before a FLUSH.
                continue;
            }
            let mut h = harness(policy);
            write(&mut h, 1, 0, 1);
            run(&mut h, 2, ReqOp::Flush);
            h.settle(&mut |_| 0);
            shut_down(&mut h);
            assert!(h.reopen().unwrap().clean_shutdown, "a warm restart");
            let data = Bytes::from(vec![2u8; BS as usize]);
            let op = ReqOp::Write {
                offset: 0,
                data,
                fua,
            };
            run(&mut h, 3, op);
            // A crash now: nothing more runs, and recovery reads what the
            // cache device holds.
            let rep = h.reopen().unwrap();
            assert!(!rep.clean_shutdown, "{policy} fua {fua}: {rep:?}");
            read_hit(&mut h, 4, 0, 2);
        }
    }
}

#[test]
fn write_back_keeps_dirty_versions_always_and_clean_copies_after_a_clean_shutdown() {
    for clean in [true, false] {
        let mut h = harness(WritePolicyKind::WriteBack);
        // Blocks 0 and 1 written back (clean copies), 2 and 3 dirty.
        write(&mut h, 1, 0, 1);
        write(&mut h, 2, 1, 2);
        h.engine.start_drain(h.now);
        h.settle(&mut |_| 0);
        h.engine.end_drain();
        assert_eq!(h.engine.dirty_versions(), 0);
        write(&mut h, 3, 2, 3);
        write(&mut h, 4, 3, 4);
        run(&mut h, 10, ReqOp::Flush);
        assert_eq!(
            h.backing[2 * BS as usize],
            0,
            "a write-back write stays in the cache"
        );
        restart(&mut h, clean, 2, if clean { 2 } else { 0 });
        for b in 0..4 {
            let hit = read_hit(&mut h, 20 + b, b, b as u8 + 1);
            assert_eq!(hit, clean || b >= 2, "clean shutdown {clean}: block {b}");
        }
    }
}

/// A cache write that fails after tearing (a prefix of its bytes reached the
/// device, as a failing device may leave it) damages no version the engine
/// keeps: a read, and the backing store after a drain, show a whole version
/// of the block, under every policy that promises whole versions. Write-back
/// does not: it rewrites a dirty version in place (and, with
/// `Config::rewrite_in_place`, a flushed one too), so a failed rewrite leaves
/// its block undefined, as a failed write to a disk does; the crash test
/// judges it so.
/// The live crash test found journaled rewriting an acknowledged version in
/// place within its open transaction: a torn rewrite then left a mix of the
/// two writes' sectors, and the next checkpoint wrote it to the backing store
/// (`crash.rs::cache_faults_degrade_and_lose_nothing_acknowledged`, seed
/// 1795737061197464157).
#[test]
fn a_torn_cache_write_damages_no_kept_version() {
    for policy in WritePolicyKind::ALL {
        if policy == WritePolicyKind::WriteBack {
            continue;
        }
        for flushed in [false, true] {
            let mut h = harness(policy);
            write(&mut h, 1, 0, 1);
            if flushed {
                run(&mut h, 2, ReqOp::Flush);
            }
            let data = Bytes::from(vec![2u8; BS as usize]);
            let op = ReqOp::Write {
                offset: 0,
                data,
                fua: false,
            };
            h.submit(3, op);
            let i = h
                .inflight()
                .iter()
                .position(|c| {
                    c.dev == Dev::Cache
                        && matches!(&c.op, IoOp::Write { data, .. } if data.len() == BS as usize && data[0] == 2)
                })
                .unwrap_or_else(|| panic!("{policy}: no cache write of the rewrite"));
            h.complete_torn(i, BS as usize / 2);
            let r = h.wait(3, &mut |_| 0);
            // Write-through's write succeeds on the backing store; only its
            // cache copy is lost.
            let synchronous = policy == WritePolicyKind::WriteThrough;
            assert_eq!(r.result.is_err(), !synchronous, "{policy}: {r:?}");
            let what = format!("{policy}, flushed {flushed}");
            let newest = if synchronous { 2 } else { 1 };
            let whole = |b: &[u8]| b.iter().all(|&x| x == b[0]) && b[0] <= newest;
            let op = ReqOp::Read {
                offset: 0,
                len: BS as u32,
            };
            let got = run(&mut h, 4, op).unwrap();
            assert!(
                whole(&got),
                "{what}: read a torn block ({} then {})",
                got[0],
                got[BS as usize - 1]
            );
            h.engine.start_drain(h.now);
            h.settle(&mut |_| 0);
            h.engine.end_drain();
            let b = &h.backing[..BS as usize];
            assert!(
                whole(b),
                "{what}: a torn block on the backing store ({} then {})",
                b[0],
                b[BS as usize - 1]
            );
        }
    }
}

/// A clean stop whose final commit fails tries again (`STOP_RETRIES`
/// times, `retry_ns` apart) and ends with its clean-shutdown record, so the
/// restart is warm; a stop on a device that keeps failing gives up and
/// ends without one (the restart is cold, which is safe). Before, the first
/// failure ended the stop at once, and the engine reported idle while the
/// retry was due.
#[test]
fn a_clean_stop_retries_its_final_commit_then_gives_up() {
    for policy in WritePolicyKind::ALL {
        // One failed command, then a device that fails every command.
        for fails in [1, u32::MAX] {
            let mut h = harness(policy);
            write(&mut h, 1, 0, 1);
            run(&mut h, 2, ReqOp::Flush);
            h.settle(&mut |_| 0);
            h.engine.start_shutdown(h.now);
            let mut failed = 0;
            for _ in 0..10_000 {
                let cache = h.inflight().iter().position(|c| c.dev == Dev::Cache);
                match cache {
                    Some(i) if failed < fails => {
                        h.complete_failed(i);
                        failed += 1;
                    }
                    _ => {
                        if !h.step(&mut |_| 0) && h.engine.is_idle() {
                            break;
                        }
                    }
                }
            }
            assert!(h.engine.is_idle(), "{policy}: {}", h.engine.debug_state());
            let gave_up = fails == u32::MAX;
            if gave_up {
                assert!(failed > STOP_RETRIES, "{policy}: {failed} failures");
            }
            assert_eq!(
                h.engine.stop_gave_up(),
                gave_up,
                "{policy}, {fails} failures"
            );
            let rep = h.reopen().unwrap();
            assert_eq!(rep.clean_shutdown, !gave_up, "{policy}, {fails} failures");
            read_hit(&mut h, 3, 0, 1);
        }
    }
}

/// A clean stop during a drain, on a backing store that fails every
/// command: each failed destage is retried `retry_ns` later while the stop
/// has retries left (`STOP_RETRIES`), and its final commits (the cache
/// works) record a clean shutdown. Once the retries are spent the engine
/// is idle although a retry is still due (`is_idle`'s `stop_tries > 0`):
/// a driver that stops at `is_idle` stops there, rather than destaging
/// into the failed store for ever.
#[test]
fn a_stop_whose_destages_keep_failing_is_idle_once_its_retries_are_spent() {
    let mut h = harness(WritePolicyKind::WriteBack);
    for b in 0..4 {
        write(&mut h, 1 + b, b, 1);
    }
    run(&mut h, 9, ReqOp::Flush);
    h.settle(&mut |_| 0);
    h.engine.start_drain(h.now);
    h.engine.start_shutdown(h.now);
    let mut failed = 0;
    for _ in 0..1000 {
        if h.engine.is_idle() && h.inflight().is_empty() {
            break;
        }
        match h.inflight().iter().position(|c| c.dev == Dev::Backing) {
            Some(i) => {
                h.complete_failed(i);
                failed += 1;
            }
            None => assert!(h.step(&mut |_| 0), "{}", h.engine.debug_state()),
        }
    }
    assert!(h.engine.is_idle(), "{}", h.engine.debug_state());
    assert_eq!(failed, STOP_RETRIES + 1, "the first try and the retries");
    assert!(h.engine.poll_timeout().is_some(), "a retry still due");
    assert!(!h.engine.stop_gave_up(), "a clean-shutdown record");
    assert_eq!(h.engine.dirty_versions(), 4, "nothing destaged");
}

/// Write-back (no `rewrite_in_place`): a rewrite of a version no commit
/// names, not even a commit in flight, goes over it in place, to the same
/// cache slot (`inplace_ok`); while an autocommit in flight names the
/// version, the rewrite takes a fresh slot, so the slot the commit names
/// keeps the bytes it names.
#[test]
fn a_rewrite_goes_in_place_only_over_a_version_no_commit_names() {
    let mut h = harness(WritePolicyKind::WriteBack);
    let submit = |h: &mut MemHarness, id: ReqId, byte: u8| {
        let data = Bytes::from(vec![byte; BS as usize]);
        h.submit(
            id,
            ReqOp::Write {
                offset: 0,
                data,
                fua: false,
            },
        );
    };
    // The cache write of the version filled with `byte`: its offset.
    let cache_write = |h: &mut MemHarness, byte: u8| -> u64 {
        h.inflight()
            .iter()
            .find_map(|c| match &c.op {
                IoOp::Write { offset, data, .. }
                    if c.dev == Dev::Cache && data.len() == BS as usize && data[0] == byte =>
                {
                    Some(*offset)
                }
                _ => None,
            })
            .expect("the version's cache write in flight")
    };
    submit(&mut h, 1, 1);
    let first = cache_write(&mut h, 1);
    h.wait(1, &mut |_| 0).result.unwrap();
    submit(&mut h, 2, 2);
    assert_eq!(
        cache_write(&mut h, 2),
        first,
        "no commit names it: in place"
    );
    h.wait(2, &mut |_| 0).result.unwrap();
    // An autocommit (no FLUSH waits for it) names the version; a rewrite
    // while it is in flight.
    h.now += 10_000_000_000;
    h.engine.handle_timeout(h.now);
    assert!(!h.inflight().is_empty(), "the autocommit is in flight");
    submit(&mut h, 3, 3);
    assert_ne!(cache_write(&mut h, 3), first, "a commit in flight names it");
    h.wait(3, &mut |_| 0).result.unwrap();
    h.settle(&mut |_| 0);
    assert!(read_hit(&mut h, 4, 0, 3));
}

/// Write-through keeps a clean copy of a written block only while more
/// than half of `free_reserve` slots would stay free (`write_through_piece`):
/// with the cache full of clean copies down to the reserve (8 of 64 free),
/// a write of 16 new blocks, whose pieces all start at once (a quarter of
/// the cache), copies the first 4 and sends the other 12 to the backing
/// store alone. Every block reads back.
#[test]
fn write_through_copies_a_block_only_above_half_the_free_reserve() {
    let mut c = Config::new(BS as u32, 64, 1024 * BS, WritePolicyKind::WriteThrough);
    c.free_reserve = 8;
    let mut h = MemHarness::new(c);
    for (i, lbn) in (100..160u64).enumerate() {
        write(&mut h, i as ReqId + 1, lbn, 1);
    }
    h.settle(&mut |_| 0);
    let st = h.engine.stats().clone();
    assert_eq!(st.free_slots, 8, "{st:?}");
    h.submit(
        100,
        ReqOp::Write {
            offset: 0,
            data: Bytes::from(vec![2u8; 16 * BS as usize]),
            fua: false,
        },
    );
    let copies = h
        .inflight()
        .iter()
        .filter(|c| {
            c.dev == Dev::Cache && matches!(&c.op, IoOp::Write { data, .. } if data[0] == 2)
        })
        .count();
    assert_eq!(copies, 4, "{:?}", h.engine.stats());
    assert_eq!(h.engine.stats().free_slots, 4);
    h.wait(100, &mut |_| 0).result.unwrap();
    h.settle(&mut |_| 0);
    for lbn in 0..16 {
        read_hit(&mut h, 200 + lbn, lbn, 2);
    }
}

/// Write-back with `rewrite_in_place`: a rewrite in place of a version a
/// durable commit names (no commit in flight) leaves the durable entry as
/// it is (`on_piece_cache_write`: the bytes only wait for a device flush),
/// so time passing starts no commit; the next FLUSH commits once, and its
/// device flush makes the bytes durable.
#[test]
fn an_in_place_rewrite_of_a_committed_version_needs_only_the_next_flush() {
    let mut c = harness(WritePolicyKind::WriteBack).engine.config().clone();
    c.rewrite_in_place = true;
    // Flushed log commits (see the test above).
    c.log_inline_bytes = 0;
    let mut h = MemHarness::new(c);
    write(&mut h, 1, 0, 1);
    run(&mut h, 2, ReqOp::Flush);
    // A later commit seals the one that named block 0's version.
    write(&mut h, 3, 5, 5);
    run(&mut h, 4, ReqOp::Flush);
    h.settle(&mut |_| 0);
    let before = h.engine.stats().clone();
    write(&mut h, 5, 0, 2);
    h.settle(&mut |_| 0);
    let st = h.engine.stats().clone();
    assert_eq!(st.free_slots, before.free_slots, "in place: {st:?}");
    assert_eq!(st.commits, before.commits, "no commit while idle: {st:?}");
    run(&mut h, 6, ReqOp::Flush);
    let st = h.engine.stats().clone();
    assert_eq!(st.commits, before.commits + 1, "the FLUSH commits: {st:?}");
    h.reopen().unwrap();
    assert!(
        read_hit(&mut h, 7, 0, 2),
        "the rewritten version, from the cache"
    );
}

/// Write-through sends the pieces of one request to the backing store as
/// one write, as the client sent it (`flush_through_batch`), FUA or not as
/// the client asked: a 4-block write is one backing command of 4 blocks.
#[test]
fn write_through_sends_a_request_as_one_backing_write() {
    for fua in [false, true] {
        let mut h = harness(WritePolicyKind::WriteThrough);
        h.submit(
            1,
            ReqOp::Write {
                offset: 8 * BS,
                data: Bytes::from(vec![3u8; 4 * BS as usize]),
                fua,
            },
        );
        let backing: Vec<_> = h
            .inflight()
            .iter()
            .filter(|c| c.dev == Dev::Backing)
            .cloned()
            .collect();
        assert!(
            matches!(
                backing.as_slice(),
                [IoCmd { op: IoOp::Write { offset, data, fua: f }, .. }]
                    if *offset == 8 * BS && data.len() as u64 == 4 * BS && *f == fua
            ),
            "fua {fua}: {backing:?}"
        );
        h.wait(1, &mut |_| 0).result.unwrap();
        for lbn in 8..12 {
            read_hit(&mut h, 10 + lbn, lbn, 3);
        }
    }
}

/// Ordered write-back with reply events (`Engine::set_reply_events`, the
/// server): a write issued before any reply went out does not depend on
/// writes completed before it (their replies cannot have been seen), and
/// once the driver reports replies going out
/// (`Engine::handle_replies_sending`) the next write depends on both.
/// Without the events, every write depends on the one completed before it.
#[test]
fn with_reply_events_writes_depend_only_on_replies_sent() {
    let edges = |h: &MemHarness| {
        h.engine
            .policy_counters()
            .into_iter()
            .find(|(n, _)| *n == "ordered_edges_total")
            .expect("ordered's edge count")
            .1
    };
    for events in [true, false] {
        let mut h = harness(WritePolicyKind::Ordered);
        h.engine.set_reply_events(events);
        write(&mut h, 1, 0, 1);
        write(&mut h, 2, 1, 2);
        assert_eq!(edges(&h), u64::from(!events), "events {events}: b on a");
        h.engine.handle_replies_sending(h.now);
        write(&mut h, 3, 2, 3);
        // With events: c on a and b; without: c on b (b on a already).
        assert_eq!(edges(&h), 2, "events {events}: c");
    }
}
