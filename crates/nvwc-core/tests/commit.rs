//! The commit protocol (`engine/commit.rs`): a client FLUSH costs one cache
//! device flush with the metadata log, three without it (format 1 and 2);
//! recovery replays the log and stops at a record whose data did not land.

use bytes::Bytes;
use nvwc_core::testkit::MemHarness;
use nvwc_core::*;

const BS: u64 = 4096;

/// A write-back cache of 64 blocks whose log commits always flush (no
/// inline records, the default): the protocol most of these tests follow
/// step by step.
fn cfg(log_pages: u32) -> Config {
    let mut c = Config::new(BS as u32, 64, 1024 * BS, WritePolicyKind::WriteBack);
    c.log_pages = log_pages;
    c.log_inline_bytes = 0;
    c
}

/// The same with inline log records of up to 64 KiB.
fn cfg_inline(log_pages: u32) -> Config {
    let mut c = cfg(log_pages);
    c.log_inline_bytes = 64 << 10;
    c
}

fn write(offset: u64, byte: u8) -> ReqOp<Bytes> {
    ReqOp::Write {
        offset,
        data: Bytes::from(vec![byte; BS as usize]),
        fua: false,
    }
}

/// Write block `lbn` with `byte`, then FLUSH; count the cache-device
/// flushes the FLUSH cost.
fn write_and_flush(h: &mut MemHarness, id: ReqId, lbn: u64, byte: u8) -> usize {
    flush_commands(h, id, lbn, byte).0
}

/// The commit-record write in flight (512 bytes, FUA, to the cache), if any.
fn record_write(h: &mut MemHarness) -> Option<usize> {
    h.inflight().iter().position(|c| {
        c.dev == Dev::Cache
            && matches!(&c.op, IoOp::Write { fua: true, data, .. } if data.len() == 512)
    })
}

fn read(h: &mut MemHarness, id: ReqId, lbn: u64) -> Vec<u8> {
    h.submit(
        id,
        ReqOp::Read {
            offset: lbn * BS,
            len: BS as u32,
        },
    );
    h.wait(id, &mut |_| 0).result.unwrap().unwrap().to_vec()
}

#[test]
fn a_flush_costs_one_device_flush_with_the_log_and_three_without() {
    let mut h = MemHarness::new(cfg(16));
    // The first commit after formatting may be a log record already.
    let per_flush: Vec<usize> = (0..20)
        .map(|i| write_and_flush(&mut h, 10 + 2 * i, i, i as u8 + 1))
        .collect();
    // 16 pages of one-page records: a checkpoint restarts the log now and then.
    let ones = per_flush.iter().filter(|&&n| n == 1).count();
    let checkpoints = per_flush.iter().filter(|&&n| n == 2).count();
    assert!(ones >= 15, "log commits cost one flush: {per_flush:?}");
    assert!(
        checkpoints >= 1,
        "a full log is checkpointed (two flushes + FUA): {per_flush:?}"
    );
    assert!(h.engine.stats().log_commits >= 15);

    let mut old = MemHarness::new(cfg(0));
    let per_flush: Vec<usize> = (0..5)
        .map(|i| write_and_flush(&mut old, 10 + 2 * i, i, 1))
        .collect();
    assert_eq!(
        per_flush,
        vec![2; 5],
        "checkpoints: FLUSH, pages, FLUSH, FUA record"
    );
    assert_eq!(old.engine.stats().log_commits, 0);
}

#[test]
fn recovery_replays_the_log_and_stops_where_data_did_not_land() {
    let mut h = MemHarness::new(cfg(64));
    for i in 0..6u64 {
        write_and_flush(&mut h, 10 + 2 * i, i, 0x10 + i as u8);
    }
    let rep = h.reopen().unwrap();
    assert!(rep.log_records >= 5, "{rep:?}");
    assert_eq!(rep.log_dropped, 0);
    for i in 0..6u64 {
        assert!(read(&mut h, 100 + i, i)
            .iter()
            .all(|&b| b == 0x10 + i as u8));
    }
    // A record whose data did not reach the device is the log's end, with
    // everything after it: here the last record's block is corrupted (as if
    // the device kept the record but not the data).
    for i in 6..9u64 {
        write_and_flush(&mut h, 200 + 2 * i, i, 0x20 + i as u8);
    }
    let l = h.engine.layout();
    // Find block 8's slot: the one holding its bytes.
    let slot = (0..l.capacity as u32)
        .find(|&s| {
            let at = l.slot_offset(s) as usize;
            h.cache[at..at + BS as usize].iter().all(|&b| b == 0x28)
        })
        .expect("block 8 is cached");
    let at = l.slot_offset(slot) as usize;
    h.cache[at] ^= 0xff;
    let rep = h.reopen().unwrap();
    assert!(rep.log_dropped >= 1, "{rep:?}");
    // Blocks flushed before that record are intact; block 8 reads as it was
    // before its write (zeroes on the backing store), never as garbage.
    for i in 0..8u64 {
        let want = if i < 6 {
            0x10 + i as u8
        } else {
            0x20 + i as u8
        };
        assert!(
            read(&mut h, 300 + i, i).iter().all(|&b| b == want),
            "block {i}"
        );
    }
    assert!(read(&mut h, 400, 8).iter().all(|&b| b == 0));
}

/// A checkpoint whose commit-record write fails may still have written the
/// record whole (a failing device can do that). The engine writes the same
/// record again after `retry_ns` instead of giving the commit up, so the
/// next checkpoint never overwrites the page copies that record names.
/// Before, it did: a crash in the middle of that next checkpoint recovered
/// the landed record over pages it no longer described (the VOPR found it
/// once failed cache writes could tear).
#[test]
fn a_failed_record_write_that_landed_is_written_again() {
    let mut h = MemHarness::new(cfg(0));
    write_and_flush(&mut h, 1, 0, 1);
    // Block 1, then a FLUSH whose record write lands whole but fails.
    h.submit(3, write(BS, 2));
    h.wait(3, &mut |_| 0).result.unwrap();
    h.submit(4, ReqOp::Flush);
    loop {
        if let Some(i) = record_write(&mut h) {
            h.complete_torn(i, 512);
            break;
        }
        assert!(h.step(&mut |_| 0), "no record write");
    }
    let r = h.wait(4, &mut |_| 0);
    assert!(r.result.is_ok(), "the record is written again: {r:?}");
    // Block 2 and a FLUSH, whose checkpoint runs until its record write is
    // in flight; then the host crashes.
    h.submit(5, write(2 * BS, 3));
    h.wait(5, &mut |_| 0).result.unwrap();
    h.submit(6, ReqOp::Flush);
    while record_write(&mut h).is_none() {
        assert!(h.step(&mut |_| 0), "no record write");
    }
    h.reopen().expect("recovery");
    let whole = |b: &[u8], v: u8| b.iter().all(|&x| x == v);
    let b0 = read(&mut h, 10, 0);
    let b1 = read(&mut h, 11, 1);
    let b2 = read(&mut h, 12, 2);
    assert!(whole(&b0, 1), "block 0 (flushed): {}", b0[0]);
    assert!(whole(&b1, 2), "block 1 (flushed): {}", b1[0]);
    assert!(whole(&b2, 3) || whole(&b2, 0), "block 2: {}", b2[0]);
}

/// A record write that keeps failing (every retry lands whole and reports
/// EIO) gives its checkpoint up. The copy it went to may now hold a record
/// in force whose pages the next checkpoint would overwrite; so that
/// checkpoint first erases that copy. Without the erase, a crash in the
/// next checkpoint recovers the landed record over pages it no longer
/// describes, and the log of the checkpoint before it (which holds a
/// flushed write) is ignored.
#[test]
fn a_record_that_kept_failing_is_erased_before_the_next_checkpoint() {
    let mut h = MemHarness::new(cfg(16));
    // Block 0, durable through a log record.
    fail_a_log_commit(&mut h);
    // Block 2 and a FLUSH: the checkpoint's record lands whole and fails,
    // every time it is written.
    h.submit(5, write(2 * BS, 3));
    h.wait(5, &mut |_| 0).result.unwrap();
    h.submit(6, ReqOp::Flush);
    let mut tries = 0;
    while !h.replies.iter().any(|r| r.id == 6) {
        if let Some(i) = record_write(&mut h) {
            h.complete_torn(i, 512);
            tries += 1;
            continue;
        }
        assert!(h.step(&mut |_| 0), "FLUSH never answered");
    }
    assert_eq!(tries, RECORD_RETRIES + 1, "written once, then retried");
    assert!(h.wait(6, &mut |_| 0).result.is_err(), "the commit gave up");
    // Block 3 and a FLUSH, whose checkpoint runs until its record write is
    // in flight; then the host crashes.
    h.submit(7, write(3 * BS, 4));
    h.wait(7, &mut |_| 0).result.unwrap();
    h.submit(8, ReqOp::Flush);
    while record_write(&mut h).is_none() {
        assert!(h.step(&mut |_| 0), "no record write");
    }
    h.reopen().expect("recovery");
    let whole = |b: &[u8], v: u8| b.iter().all(|&x| x == v);
    let b0 = read(&mut h, 10, 0);
    assert!(whole(&b0, 1), "block 0 (flushed): {}", b0[0]);
    for (lbn, v) in [(1u64, 2u8), (2, 3), (3, 4)] {
        let b = read(&mut h, 10 + lbn, lbn);
        assert!(whole(&b, v) || whole(&b, 0), "block {lbn}: {}", b[0]);
    }
}

/// The first cache-device flush in flight, if any.
/// Block 0 made durable through a log record (requests 1-2); then block 1
/// (request 3) and a FLUSH (request 4) whose log commit's device flush
/// fails, so the FLUSH fails and the next commit is a checkpoint.
fn fail_a_log_commit(h: &mut MemHarness) {
    write_and_flush(h, 1, 0, 1);
    h.submit(3, write(BS, 2));
    h.wait(3, &mut |_| 0).result.unwrap();
    h.submit(4, ReqOp::Flush);
    loop {
        if let Some(i) = cache_flush(h) {
            h.complete_failed(i);
            break;
        }
        assert!(h.step(&mut |_| 0), "no cache flush");
    }
    assert!(h.wait(4, &mut |_| 0).result.is_err());
}

/// A write-back cache of 1024 slots (17 slot-table pages) over 4096
/// blocks, with a metadata log of `log_pages` pages (0: every commit a
/// checkpoint).
fn write_back_1024(log_pages: u32) -> Config {
    let mut c = Config::new(BS as u32, 1024, 4096 * BS, WritePolicyKind::WriteBack);
    c.log_pages = log_pages;
    c
}

fn cache_flush(h: &mut MemHarness) -> Option<usize> {
    h.inflight()
        .iter()
        .position(|c| c.dev == Dev::Cache && matches!(c.op, IoOp::Flush))
}

/// Commits, log commits and failed commits are counted (a record write
/// that fails and is written again counts as a failure too). After a failed
/// log commit the next commit is due at the autocommit age, not at
/// `retry_ns` (the retry timer is for a clean stop's final commit and for a
/// record written again); a failed record write is written again
/// `retry_ns` after its failure.
#[test]
fn commits_and_failed_commits_are_counted_and_retried_on_time() {
    let mut h = MemHarness::new(cfg(64));
    let (retry, autocommit) = (h.engine.config().retry_ns, h.engine.config().autocommit_ns);
    for i in 0..3u64 {
        assert_eq!(write_and_flush(&mut h, 10 + 2 * i, i, 1 + i as u8), 1);
    }
    let st = h.engine.stats();
    assert_eq!((st.commits, st.log_commits, st.commit_failures), (3, 3, 0));
    // A log commit whose device flush fails.
    h.submit(20, write(3 * BS, 4));
    h.wait(20, &mut |_| 0).result.unwrap();
    h.submit(21, ReqOp::Flush);
    loop {
        if let Some(i) = cache_flush(&mut h) {
            h.complete_failed(i);
            break;
        }
        assert!(h.step(&mut |_| 0), "no cache flush");
    }
    let t = h.now;
    assert!(h.wait(21, &mut |_| 0).result.is_err());
    let st = h.engine.stats();
    assert_eq!((st.commits, st.log_commits, st.commit_failures), (3, 3, 1));
    assert_eq!(h.engine.poll_timeout(), Some(t + autocommit));
    // The next commit is a checkpoint; its record write fails once.
    h.submit(22, ReqOp::Flush);
    loop {
        if let Some(i) = record_write(&mut h) {
            h.complete_torn(i, 512);
            break;
        }
        assert!(h.step(&mut |_| 0), "no record write");
    }
    let t = h.now;
    assert_eq!(h.engine.poll_timeout(), Some(t + retry), "the record retry");
    let st = h.engine.stats();
    assert_eq!((st.commits, st.commit_failures), (3, 2));
    h.engine.handle_timeout(t + retry - 1);
    assert_eq!(record_write(&mut h), None, "written again too early");
    h.now = t + retry;
    h.engine.handle_timeout(h.now);
    assert!(record_write(&mut h).is_some(), "not written again");
    h.wait(22, &mut |_| 0).result.unwrap();
    let st = h.engine.stats();
    assert_eq!((st.commits, st.log_commits, st.commit_failures), (4, 3, 2));
}

/// A clean stop whose final commit fails tries it again `retry_ns` after
/// the failure.
#[test]
fn a_clean_stop_retries_its_failed_final_commit_after_retry_ns() {
    let mut h = MemHarness::new(cfg(64));
    let retry = h.engine.config().retry_ns;
    write_and_flush(&mut h, 1, 0, 1);
    h.settle(&mut |_| 0);
    h.engine.start_shutdown(h.now);
    let i = cache_flush(&mut h).expect("the final commit's first flush");
    h.complete_failed(i);
    let t = h.now;
    assert!(h.inflight().is_empty());
    assert_eq!(h.engine.poll_timeout(), Some(t + retry));
    assert!(!h.engine.is_idle(), "the retry is due");
    h.engine.handle_timeout(t + retry - 1);
    assert!(h.inflight().is_empty(), "retried too early");
    h.now = t + retry;
    h.engine.handle_timeout(h.now);
    assert!(cache_flush(&mut h).is_some(), "not retried");
    h.settle(&mut |_| 0);
    assert!(h.engine.is_idle());
    assert!(!h.engine.stop_gave_up());
    assert_eq!(h.engine.stats().commit_failures, 1);
    let rep = h.reopen().unwrap();
    assert!(rep.clean_shutdown, "{rep:?}");
}

/// Write-back with `rewrite_in_place` does not rewrite a version in place
/// while the record that named it is unsealed (no later durable record
/// says it was durable): a crash then would find that record's data
/// changed, and recovery would drop the record with the flushed write.
#[test]
fn a_version_is_not_rewritten_in_place_before_its_record_is_sealed() {
    let mut c = cfg(64);
    c.rewrite_in_place = true;
    let mut h = MemHarness::new(c);
    write_and_flush(&mut h, 1, 5, 5);
    // Block 0 through a log record (unsealed until a later record says so).
    let logged = h.engine.stats().log_commits;
    write_and_flush(&mut h, 3, 0, 1);
    assert_eq!(h.engine.stats().log_commits, logged + 1);
    let free = h.engine.stats().free_slots;
    h.submit(5, write(0, 2));
    h.wait(5, &mut |_| 0).result.unwrap();
    assert_eq!(
        free - h.engine.stats().free_slots,
        1,
        "the rewrite takes a fresh slot"
    );
    // Crash before a FLUSH: the flushed version comes back.
    let rep = h.reopen().unwrap();
    assert_eq!(rep.log_dropped, 0, "{rep:?}");
    let b = read(&mut h, 6, 0);
    assert!(b.iter().all(|&x| x == 1), "block 0: {}", b[0]);
}

/// The commit record in force after recovery may be copy B; the first
/// checkpoint after recovery writes its record over the other copy (A),
/// so a crash that tears that write finds copy B's checkpoint intact.
#[test]
fn the_first_checkpoint_after_recovery_writes_the_copy_not_in_force() {
    // No log: every commit is a checkpoint. The first one goes to copy B
    // (a fresh format holds commit 0 in copy A).
    let mut h = MemHarness::new(cfg(0));
    write_and_flush(&mut h, 1, 0, 1);
    h.reopen().unwrap();
    h.submit(3, write(BS, 2));
    h.wait(3, &mut |_| 0).result.unwrap();
    h.submit(4, ReqOp::Flush);
    let copy_a = h.engine.layout().commit_offset(0);
    loop {
        if let Some(i) = record_write(&mut h) {
            let IoOp::Write { offset, .. } = h.inflight()[i].op else {
                unreachable!()
            };
            assert_eq!(offset, copy_a, "the record goes to copy A");
            // Torn: a crash in the middle of the record write.
            h.complete_torn(i, 100);
            break;
        }
        assert!(h.step(&mut |_| 0), "no record write");
    }
    let rep = h.reopen().unwrap();
    assert_eq!(rep.commit, 1, "{rep:?}");
    let b0 = read(&mut h, 10, 0);
    assert!(b0.iter().all(|&x| x == 1), "block 0 (flushed): {}", b0[0]);
}

/// After a clean stop and a restart, sequence numbers go on from where
/// they stopped, even when the newest versions left the cache (here a
/// trimmed block): the commit record carries the next sequence number.
#[test]
fn sequence_numbers_go_on_after_a_restart() {
    let mut h = MemHarness::new(cfg(16));
    let mut seqs = Vec::new();
    for (id, lbn) in [(1, 0u64), (2, 1)] {
        h.submit(id, write(lbn * BS, 1));
        seqs.push(h.wait(id, &mut |_| 0).seq);
    }
    h.submit(3, ReqOp::Flush);
    h.wait(3, &mut |_| 0).result.unwrap();
    h.engine.start_drain(h.now);
    h.settle(&mut |_| 0);
    h.engine.end_drain();
    // Block 1, the newest write, is clean now; a trim drops it.
    h.submit(
        4,
        ReqOp::Trim {
            offset: BS,
            len: BS as u32,
        },
    );
    h.wait(4, &mut |_| 0).result.unwrap();
    assert_eq!(h.engine.stats().cached_blocks, 1);
    h.engine.start_shutdown(h.now);
    h.settle(&mut |_| 0);
    let rep = h.reopen().unwrap();
    assert!(rep.clean_shutdown, "{rep:?}");
    h.submit(5, write(2 * BS, 2));
    let seq = h.wait(5, &mut |_| 0).seq;
    assert!(
        seqs.iter().all(|&s| s > 0 && s < seq),
        "{seq} after {seqs:?}"
    );
}

/// A checkpoint writes every entry of a page it writes with its commit
/// number (`Entry::commit`), the entries of free slots too. The field is
/// informational (`docs/ON-DISK-FORMAT.md`: validity comes from the page
/// tag; recovery does not read it), so only this test pins it.
#[test]
fn a_checkpoint_tags_every_entry_of_its_pages_with_its_commit() {
    use nvwc_core::layout::{self, Entry};
    let mut h = MemHarness::new(cfg(0));
    write_and_flush(&mut h, 1, 0, 1);
    let n = h.engine.durable_commit();
    assert!(n > 0);
    let page = layout::PAGE_BYTES as usize;
    let table = layout::TABLE_OFFSET as usize;
    let base = (0..2)
        .map(|c| table + c * page)
        .find(|&b| layout::page_tag(0, &h.cache[b..b + page]) == Some(n))
        .expect("page 0 written by the checkpoint");
    let slots = h.engine.layout().capacity.min(layout::ENTRIES_PER_PAGE) as usize;
    let mut free = 0;
    for i in 0..slots {
        let at = base + 64 + i * 64;
        let e = Entry::decode(i as u32, &h.cache[at..at + 64]).expect("an entry");
        assert_eq!(e.commit, n, "slot {i}: {e:?}");
        free += usize::from(e.flags == 0);
    }
    assert_eq!(free, slots - 1, "one valid entry, the rest free");
}

/// A log commit whose record write fails leaves unknown what reached the
/// device, so the slot of the version it would have freed stays in use
/// (its entry may still be in force): a new block does not take it, and a
/// crash recovers the flushed version, not another block's bytes.
#[test]
fn a_failed_commit_does_not_free_the_slots_it_would_have_freed() {
    let mut h = MemHarness::new(cfg(64));
    let log = h.engine.layout().log_offset;
    // Block 0's first version, durable (in its home slot, 0).
    write_and_flush(&mut h, 1, 0, 1);
    // A second version in another slot; its log commit's record write fails.
    h.submit(3, write(0, 2));
    h.wait(3, &mut |_| 0).result.unwrap();
    let free = h.engine.stats().free_slots;
    h.submit(4, ReqOp::Flush);
    loop {
        let rec = h.inflight().iter().position(|c| {
            c.dev == Dev::Cache && matches!(c.op, IoOp::Write { offset, .. } if offset >= log)
        });
        if let Some(i) = rec {
            h.complete_failed(i);
            break;
        }
        assert!(h.step(&mut |_| 0), "no log record write");
    }
    assert!(h.wait(4, &mut |_| 0).result.is_err());
    assert_eq!(h.engine.stats().free_slots, free, "a slot was freed");
    // Block 64 (home slot 0, as block 0), then a crash.
    h.submit(5, write(64 * BS, 3));
    h.wait(5, &mut |_| 0).result.unwrap();
    h.reopen().unwrap();
    let b = read(&mut h, 6, 0);
    assert!(b.iter().all(|&x| x == 1), "block 0: {}", b[0]);
}

/// A version superseded while a read of it is in flight stays retired
/// until the read is done; if the read completes while a commit that
/// writes the version's entry free is in flight, that commit frees the
/// slot when it completes (nothing else will).
#[test]
fn a_retired_slot_a_read_held_during_a_commit_is_freed_by_the_commit() {
    let mut h = MemHarness::new(cfg(64));
    let cap = h.engine.config().capacity_blocks;
    h.submit(1, write(0, 1));
    h.wait(1, &mut |_| 0).result.unwrap();
    let is_read = |c: &IoCmd<Bytes>| c.dev == Dev::Cache && matches!(c.op, IoOp::Read { .. });
    // A read of block 0, held in flight.
    h.submit(
        2,
        ReqOp::Read {
            offset: 0,
            len: BS as u32,
        },
    );
    assert!(h.inflight().iter().any(is_read), "a cache read");
    // Run everything but the read.
    let others = |h: &mut MemHarness, until: &dyn Fn(&MemHarness) -> bool| {
        while !until(h) {
            let i = h.inflight().iter().position(|c| !is_read(c));
            let i = i.expect("nothing but the read in flight");
            assert!(h.step(&mut |_| i));
        }
    };
    // The rewrite takes a fresh slot (the old one is being read) and
    // retires the first version.
    h.submit(3, write(0, 2));
    others(&mut h, &|h| h.replies.iter().any(|r| r.id == 3));
    assert_eq!(h.engine.stats().free_slots, cap - 2);
    // A FLUSH: its commit writes the retired slot's entry free. The read
    // completes while the commit is in flight.
    h.submit(4, ReqOp::Flush);
    assert!(
        h.inflight().iter().any(|c| !is_read(c)),
        "the commit is in flight"
    );
    let r = h.inflight().iter().position(is_read).unwrap();
    assert!(h.step(&mut |_| r));
    assert!(h.replies.iter().any(|r| r.id == 2), "the read answered");
    h.wait(4, &mut |_| 0).result.unwrap();
    h.settle(&mut |_| 0);
    assert_eq!(
        h.engine.stats().free_slots,
        cap - 1,
        "the first version's slot is free again"
    );
}

/// A checkpoint writes every slot-table page that changed, not only the
/// first: blocks whose slots are on many pages (a cache of 1024 slots, 17
/// pages) survive a restart.
#[test]
fn a_checkpoint_writes_every_changed_page() {
    let c = write_back_1024(0);
    let mut h = MemHarness::new(c);
    // Blocks 0, 7, 14, ...: their home slots spread over every page.
    let blocks: Vec<u64> = (0..146).map(|i| i * 7).collect();
    for (i, &lbn) in blocks.iter().enumerate() {
        h.submit(1 + i as u64, write(lbn * BS, 1 + (i % 200) as u8));
        h.wait(1 + i as u64, &mut |_| 0).result.unwrap();
    }
    h.submit(1000, ReqOp::Flush);
    h.wait(1000, &mut |_| 0).result.unwrap();
    let rep = h.reopen().unwrap();
    assert_eq!(rep.dirty_versions, blocks.len() as u64, "{rep:?}");
    for (i, &lbn) in blocks.iter().enumerate() {
        let b = read(&mut h, 2000 + i as u64, lbn);
        let want = 1 + (i % 200) as u8;
        assert!(b.iter().all(|&x| x == want), "block {lbn}: {}", b[0]);
    }
}

/// The free slots a FLUSH's commit adds (nothing else allocating).
fn flush_frees(h: &mut MemHarness, id: ReqId) -> u64 {
    let before = h.engine.stats().free_slots;
    h.submit(id, ReqOp::Flush);
    h.wait(id, &mut |_| 0).result.unwrap();
    h.settle(&mut |_| 0);
    h.engine.stats().free_slots - before
}

/// A commit lowers `retired_pending` only for retired slots it frees, not
/// for every entry of its snapshot: a durable version retired while the
/// commit is in flight (block 5's) is still counted when it ends, and the
/// next commit frees exactly the slots counted.
#[test]
fn a_commit_leaves_the_retired_slots_it_does_not_free_counted() {
    let mut h = MemHarness::new(cfg(64));
    // Block 5: durable. Block 0: written, not committed.
    h.submit(1, write(5 * BS, 1));
    h.wait(1, &mut |_| 0).result.unwrap();
    h.submit(2, ReqOp::Flush);
    h.wait(2, &mut |_| 0).result.unwrap();
    h.submit(3, write(0, 1));
    h.wait(3, &mut |_| 0).result.unwrap();
    // A FLUSH: its commit takes block 0's entry (valid). While it is in
    // flight, a rewrite of block 5 retires its durable version.
    h.submit(4, ReqOp::Flush);
    assert!(!h.inflight().is_empty(), "the commit is in flight");
    h.submit(5, write(5 * BS, 2));
    while !h.replies.iter().any(|r| r.id == 5) {
        assert!(h.step(&mut |_| 0));
    }
    assert!(
        !h.replies.iter().any(|r| r.id == 4),
        "the rewrite finished before the commit"
    );
    assert_eq!(h.retired_pending(), 1, "{}", h.engine.debug_state());
    h.wait(4, &mut |_| 0).result.unwrap();
    assert_eq!(
        h.retired_pending(),
        1,
        "block 5's first version still waits for a commit: {}",
        h.engine.debug_state()
    );
    assert_eq!(flush_frees(&mut h, 6), 1, "the next commit frees it");
    assert_eq!(h.retired_pending(), 0);
}

/// `retired_pending` counts the retired slots a commit will free. A slot
/// retired while it is off the disk (its version never committed) and
/// held by a read is not counted (`Engine::retire` counts only slots on the
/// disk or in a commit's snapshot); but its entry is still meta-dirty, so
/// if the read is still in flight when the next commit starts, that commit
/// snapshots it and `finish_commit` subtracts one for it. Here that commit
/// ends with another slot retired meanwhile (a durable version, counted)
/// still waiting for a commit, and the count at 0 instead of 1: the next
/// commit frees a slot the count did not stand for. Fixed in 51aeb8e: only
/// slots marked `reclaim` when counted are subtracted.
#[test]
fn a_retired_slot_never_counted_is_not_subtracted() {
    let mut h = MemHarness::new(cfg(64));
    let is_read = |c: &IoCmd<Bytes>| c.dev == Dev::Cache && matches!(c.op, IoOp::Read { .. });
    let others = |h: &mut MemHarness, until: &dyn Fn(&MemHarness) -> bool| {
        while !until(h) {
            let i = h.inflight().iter().position(|c| !is_read(c));
            let i = i.expect("nothing but the read in flight");
            assert!(h.step(&mut |_| i));
        }
    };
    // Block 5: durable. Block 0: written, not committed.
    h.submit(1, write(5 * BS, 1));
    h.wait(1, &mut |_| 0).result.unwrap();
    h.submit(2, ReqOp::Flush);
    h.wait(2, &mut |_| 0).result.unwrap();
    h.submit(3, write(0, 1));
    h.wait(3, &mut |_| 0).result.unwrap();
    // A read of block 0, held in flight; a rewrite retires the first
    // version, off the disk: nothing for a commit to free, not counted.
    h.submit(
        4,
        ReqOp::Read {
            offset: 0,
            len: BS as u32,
        },
    );
    assert!(h.inflight().iter().any(is_read), "a cache read");
    h.submit(5, write(0, 2));
    others(&mut h, &|h| h.replies.iter().any(|r| r.id == 5));
    assert_eq!(h.retired_pending(), 0, "{}", h.engine.debug_state());
    // A FLUSH: its commit snapshots block 0's retired slot (the read still
    // holds it). While it is in flight, a rewrite of block 5 retires its
    // durable version: counted, freed by the next commit.
    h.submit(6, ReqOp::Flush);
    assert!(
        h.inflight().iter().any(|c| !is_read(c)),
        "the commit is in flight"
    );
    h.submit(7, write(5 * BS, 2));
    others(&mut h, &|h| h.replies.iter().any(|r| r.id == 7));
    assert!(
        !h.replies.iter().any(|r| r.id == 6),
        "the rewrite finished before the commit"
    );
    assert_eq!(h.retired_pending(), 1, "{}", h.engine.debug_state());
    others(&mut h, &|h| h.replies.iter().any(|r| r.id == 6));
    // The read ends: block 0's first slot is free.
    let r = h.inflight().iter().position(is_read).unwrap();
    assert!(h.step(&mut |_| r));
    h.wait(4, &mut |_| 0).result.unwrap();
    assert!(h.inflight().is_empty(), "{}", h.engine.debug_state());
    // Block 5's first version still waits for a commit to free it.
    let counted = h.retired_pending();
    let freed = flush_frees(&mut h, 8);
    assert_eq!(freed, 1, "the next commit frees block 5's first slot");
    assert_eq!(
        counted, freed,
        "retired_pending stands for the slots the next commit frees"
    );
}

/// Run the commands in flight (and those they start) to completion,
/// without letting timers fire (no autocommit).
fn run_io(h: &mut MemHarness) {
    for _ in 0..1_000_000 {
        if h.inflight().is_empty() {
            return;
        }
        assert!(h.step(&mut |_| 0));
    }
    panic!("commands never stop: {}", h.engine.debug_state());
}

/// Submit request `id` and run until its reply, without timers.
fn run_req(h: &mut MemHarness, id: ReqId, op: ReqOp<Bytes>) {
    h.submit(id, op);
    for _ in 0..1_000_000 {
        if h.replies.iter().any(|r| r.id == id) {
            break;
        }
        assert!(!h.inflight().is_empty(), "request {id} waits for a timer");
        assert!(h.step(&mut |_| 0));
    }
    let i = h.replies.iter().position(|r| r.id == id).unwrap();
    h.replies.remove(i).result.unwrap();
}

/// A reclaim commit starts without a FLUSH once free slots are below an
/// eighth of the cache and a thirty-second of it waits, retired, for a
/// commit to free it (`maybe_commit`); not before. A cache of 1024 slots
/// (free_reserve 8): 900 blocks written and flushed leave 124 free, then
/// each rewrite of a flushed block retires its durable version.
#[test]
fn a_reclaim_commit_starts_when_a_thirty_second_of_the_cache_is_retired() {
    let c = write_back_1024(64);
    let cap = c.capacity_blocks;
    assert_eq!((cap, c.free_reserve), (1024, 8));
    let mut h = MemHarness::new(c);
    for lbn in 0..900 {
        run_req(&mut h, 1 + lbn, write(lbn * BS, 1));
    }
    run_req(&mut h, 1000, ReqOp::Flush);
    run_io(&mut h);
    let commits = h.engine.stats().commits;
    assert_eq!(h.engine.stats().free_slots, cap - 900);
    assert_eq!(h.retired_pending(), 0);
    // 31 rewrites: 31 retired (below 1024 / 32), no commit.
    for lbn in 0..31 {
        run_req(&mut h, 2000 + lbn, write(lbn * BS, 2));
        run_io(&mut h);
    }
    assert_eq!(h.retired_pending(), 31, "{}", h.engine.debug_state());
    assert_eq!(h.engine.stats().free_slots, cap - 931);
    assert_eq!(h.engine.stats().commits, commits, "no commit yet");
    // The 32nd: a commit starts at once and frees the 32 slots.
    run_req(&mut h, 2031, write(31 * BS, 2));
    run_io(&mut h);
    assert_eq!(h.engine.stats().commits, commits + 1, "a reclaim commit");
    assert_eq!(h.retired_pending(), 0, "{}", h.engine.debug_state());
    assert_eq!(h.engine.stats().free_slots, cap - 900);
}

/// A commit takes the log while the new data its record checksums is at
/// most 1 MiB (`LOG_MAX_CHECKED_BYTES`: 256 new 4 KiB versions), and a
/// checkpoint above that; rewrites of sealed versions in place cost no
/// checksum.
#[test]
fn a_commit_checksumming_more_than_a_mib_is_a_checkpoint() {
    let c = write_back_1024(64);
    let mut h = MemHarness::new(c);
    let mut id = 1;
    let mut flush_writes = |h: &mut MemHarness, lbns: std::ops::Range<u64>| {
        let before = h.engine.stats();
        for lbn in lbns {
            run_req(h, id, write(lbn * BS, 1));
            id += 1;
        }
        run_req(h, id, ReqOp::Flush);
        id += 1;
        run_io(h);
        let after = h.engine.stats();
        assert_eq!(after.commits, before.commits + 1, "one commit");
        after.log_commits - before.log_commits
    };
    assert_eq!(flush_writes(&mut h, 0..256), 1, "256 new blocks: the log");
    assert_eq!(flush_writes(&mut h, 256..513), 0, "257: a checkpoint");
    assert_eq!(flush_writes(&mut h, 513..514), 1, "then the log again");
}

/// A checkpoint writes the slot-table pages changed since the last one,
/// and only those: after a checkpoint of pages 0 and 11, a change on page
/// 0 alone costs one page write (a cache of 1024 slots, 17 pages; block
/// `lbn`'s home slot is `lbn % 1024`, 63 entries a page).
#[test]
fn a_checkpoint_writes_only_the_pages_changed_since_the_last() {
    let c = write_back_1024(0);
    let mut h = MemHarness::new(c);
    let l = h.engine.layout();
    let table = layout::TABLE_OFFSET..layout::TABLE_OFFSET + l.table_bytes;
    // Table pages written while running `id` to its reply.
    let pages_written = |h: &mut MemHarness, id: ReqId, op: ReqOp<Bytes>| {
        h.submit(id, op);
        let mut pages = std::collections::HashSet::new();
        while !h.replies.iter().any(|r| r.id == id) {
            for c in h.inflight().iter() {
                if let (Dev::Cache, IoOp::Write { offset, .. }) = (c.dev, &c.op) {
                    if table.contains(offset) {
                        pages.insert(c.id);
                    }
                }
            }
            assert!(h.step(&mut |_| 0));
        }
        pages.len()
    };
    assert_eq!(pages_written(&mut h, 1, write(5 * BS, 1)), 0);
    assert_eq!(pages_written(&mut h, 2, write(700 * BS, 1)), 0);
    assert_eq!(pages_written(&mut h, 3, ReqOp::Flush), 2, "pages 0 and 11");
    assert_eq!(pages_written(&mut h, 4, write(6 * BS, 1)), 0);
    assert_eq!(pages_written(&mut h, 5, ReqOp::Flush), 1, "page 0 only");
}

/// Slot-table pages past the 64th (one `PageSet` word) are written too: a
/// block whose home slot is on page 65 survives a restart after a FLUSH.
#[test]
fn a_checkpoint_writes_pages_past_the_sixty_fourth() {
    let mut c = Config::new(BS as u32, 4200, 8192 * BS, WritePolicyKind::WriteBack);
    c.log_pages = 0;
    let mut h = MemHarness::new(c);
    // Slot 4100 is on page 4100 / 63 = 65; slot 1 on page 0.
    run_req(&mut h, 1, write(4100 * BS, 7));
    run_req(&mut h, 2, write(BS, 8));
    run_req(&mut h, 3, ReqOp::Flush);
    let rep = h.reopen().unwrap();
    assert_eq!(rep.dirty_versions, 2, "{rep:?}");
    assert!(read(&mut h, 10, 4100).iter().all(|&x| x == 7));
    assert!(read(&mut h, 11, 1).iter().all(|&x| x == 8));
}

/// Without a FLUSH, a commit starts once `autocommit_changes` slot entries
/// changed, or `autocommit_ns` after the oldest change; not before.
#[test]
fn an_autocommit_starts_after_enough_changes_or_time() {
    let mut c = cfg(64);
    c.autocommit_changes = 10;
    let autocommit = c.autocommit_ns;
    let mut h = MemHarness::new(c);
    // Nine new blocks: nine changed entries, no commit.
    for lbn in 0..9 {
        run_req(&mut h, 1 + lbn, write(lbn * BS, 1));
        run_io(&mut h);
    }
    assert_eq!(h.engine.stats().commits, 0, "no commit at 9 changes");
    // The tenth: a commit.
    run_req(&mut h, 10, write(9 * BS, 1));
    run_io(&mut h);
    assert_eq!(h.engine.stats().commits, 1, "a commit at 10 changes");
    // One change: a commit autocommit_ns after it.
    run_req(&mut h, 11, write(20 * BS, 1));
    let t = h.now;
    run_io(&mut h);
    assert_eq!(h.engine.poll_timeout(), Some(t + autocommit));
    h.engine.handle_timeout(t + autocommit - 1);
    run_io(&mut h);
    assert_eq!(h.engine.stats().commits, 1, "no commit before the age");
    h.now = t + autocommit;
    h.engine.handle_timeout(h.now);
    run_io(&mut h);
    assert_eq!(h.engine.stats().commits, 2, "a commit at the age");
}

/// Below the free reserve (`free_reserve`, 8), a commit starts as soon as
/// one retired slot waits for it, and not while none does. A cache of 1024
/// slots: 1015 blocks written and flushed leave 9 free; each rewrite of a
/// flushed block takes a slot and retires the durable version.
#[test]
fn a_reclaim_commit_starts_below_the_free_reserve() {
    let c = write_back_1024(64);
    let cap = c.capacity_blocks;
    let mut h = MemHarness::new(c);
    for lbn in 0..1015 {
        run_req(&mut h, 1 + lbn, write(lbn * BS, 1));
    }
    run_req(&mut h, 2000, ReqOp::Flush);
    run_io(&mut h);
    let commits = h.engine.stats().commits;
    assert_eq!(h.engine.stats().free_slots, cap - 1015);
    // At the reserve (8 free), one retired: no commit.
    run_req(&mut h, 3000, write(0, 2));
    run_io(&mut h);
    assert_eq!(h.engine.stats().free_slots, 8);
    assert_eq!(h.retired_pending(), 1, "{}", h.engine.debug_state());
    assert_eq!(
        h.engine.stats().commits,
        commits,
        "no commit at the reserve"
    );
    // Below it: a reclaim commit.
    run_req(&mut h, 3001, write(BS, 2));
    run_io(&mut h);
    assert_eq!(h.engine.stats().commits, commits + 1, "a reclaim commit");
    // It started when the new slot was taken (7 free) and freed the first
    // retired slot; the second version retired after it started.
    assert_eq!(h.engine.stats().free_slots, 8);
}

/// Below the free reserve with nothing retired, no commit starts: it
/// would free nothing (the cleaner makes room: it evicts clean blocks back
/// up to the reserve). A cache of 64 slots takes 62 new blocks without a
/// FLUSH and without a commit.
#[test]
fn no_commit_starts_below_the_reserve_with_nothing_to_reclaim() {
    let mut h = MemHarness::new(cfg(64));
    for lbn in 0..62 {
        run_req(&mut h, 1 + lbn, write(lbn * BS, 1));
        run_io(&mut h);
    }
    let st = h.engine.stats();
    assert!(st.evictions > 0, "{}", h.engine.debug_state());
    assert_eq!(st.commits, 0, "{}", h.engine.debug_state());
}

/// The thirty-second of the cache retired starts a commit only once free
/// slots are below an eighth of the cache: a cache of 1024 slots with 864
/// blocks written and flushed (160 free) takes 32 rewrites of flushed
/// blocks down to 128 free (32 retired) without a commit, and the 33rd
/// starts one.
#[test]
fn a_reclaim_commit_waits_for_free_slots_below_an_eighth_of_the_cache() {
    let c = write_back_1024(64);
    let cap = c.capacity_blocks;
    let mut h = MemHarness::new(c);
    for lbn in 0..864 {
        run_req(&mut h, 1 + lbn, write(lbn * BS, 1));
    }
    run_req(&mut h, 1000, ReqOp::Flush);
    run_io(&mut h);
    let commits = h.engine.stats().commits;
    for lbn in 0..32 {
        run_req(&mut h, 2000 + lbn, write(lbn * BS, 2));
        run_io(&mut h);
    }
    assert_eq!(h.engine.stats().free_slots, cap / 8);
    assert_eq!(h.retired_pending(), 32, "{}", h.engine.debug_state());
    assert_eq!(h.engine.stats().commits, commits, "no commit at 128 free");
    run_req(&mut h, 2032, write(32 * BS, 2));
    run_io(&mut h);
    assert_eq!(h.engine.stats().commits, commits + 1, "a reclaim commit");
}

/// Recovery that replayed log records starts its first commit (a
/// checkpoint) at once, without waiting for a request or a timer.
#[test]
fn recovery_after_a_log_commit_checkpoints_at_once() {
    let mut h = MemHarness::new(cfg(64));
    assert_eq!(write_and_flush(&mut h, 1, 0, 1), 1);
    assert_eq!(h.engine.stats().log_commits, 1);
    let rep = h.reopen().unwrap();
    assert_eq!(rep.log_records, 1, "{rep:?}");
    run_io(&mut h);
    let st = h.engine.stats();
    assert_eq!((st.commits, st.log_commits), (1, 0), "a checkpoint");
}

/// A commit waits for in-place rewrites in flight (their slots' bytes are
/// undefined until they complete): a FLUSH during an in-place rewrite of
/// a sealed version, after a write of another block, starts its commit (a
/// cache flush first) only after the rewrite completes.
#[test]
fn a_commit_waits_for_an_in_place_rewrite_in_flight() {
    let mut c = cfg(64);
    c.rewrite_in_place = true;
    let mut h = MemHarness::new(c);
    write_and_flush(&mut h, 1, 0, 1);
    // A later record seals block 0's version.
    write_and_flush(&mut h, 3, 5, 1);
    write_and_flush(&mut h, 5, 6, 1);
    h.settle(&mut |_| 0);
    let free = h.engine.stats().free_slots;
    let is_rewrite = |c: &IoCmd<Bytes>| {
        c.dev == Dev::Cache
            && matches!(&c.op, IoOp::Write { data, .. } if data.len() == BS as usize && data[0] == 3)
    };
    h.submit(10, write(0, 3));
    assert!(h.inflight().iter().any(is_rewrite), "the rewrite in flight");
    assert_eq!(h.engine.stats().free_slots, free, "in place: no new slot");
    // A new block, acknowledged: the FLUSH needs a commit for it.
    h.submit(12, write(7 * BS, 4));
    while !h.replies.iter().any(|r| r.id == 12) {
        let i = h.inflight().iter().position(|c| !is_rewrite(c)).unwrap();
        assert!(h.step(&mut |_| i));
    }
    h.submit(11, ReqOp::Flush);
    for _ in 0..100 {
        let Some(i) = h.inflight().iter().position(|c| !is_rewrite(c)) else {
            break;
        };
        assert!(
            !matches!(h.inflight()[i].op, IoOp::Flush),
            "a cache flush while the rewrite is in flight"
        );
        assert!(h.step(&mut |_| i));
    }
    assert!(!h.replies.iter().any(|r| r.id == 11));
    let i = h.inflight().iter().position(is_rewrite).unwrap();
    assert!(h.step(&mut |_| i));
    h.wait(10, &mut |_| 0).result.unwrap();
    h.wait(11, &mut |_| 0).result.unwrap();
    let rep = h.reopen().unwrap();
    assert_eq!(rep.log_dropped, 0, "{rep:?}");
    assert!(read(&mut h, 20, 0).iter().all(|&x| x == 3));
}

/// A clean stop takes one commit, its final one, once no request is in
/// flight (`shutdown_quiet`): a stop begun while a write is in flight
/// starts no commit before the write completes, and then one (a clean
/// shutdown record).
#[test]
fn a_clean_stop_commits_once_after_the_requests_in_flight() {
    let mut h = MemHarness::new(cfg(64));
    write_and_flush(&mut h, 1, 0, 1);
    h.settle(&mut |_| 0);
    let commits = h.engine.stats().commits;
    h.submit(10, write(5 * BS, 2));
    assert_eq!(h.inflight().len(), 1, "the write's data in flight");
    h.engine.start_shutdown(h.now);
    assert_eq!(h.inflight().len(), 1, "{}", h.engine.debug_state());
    assert_eq!(h.engine.stats().commits, commits, "no commit yet");
    h.wait(10, &mut |_| 0).result.unwrap();
    h.settle(&mut |_| 0);
    assert!(h.engine.is_idle());
    assert_eq!(h.engine.stats().commits, commits + 1, "one commit");
    let rep = h.reopen().unwrap();
    assert!(rep.clean_shutdown, "{rep:?}");
    assert!(read(&mut h, 20, 5).iter().all(|&x| x == 2));
}

/// A partial version's record checksums its range only (`hi - lo` bytes,
/// not the block): 256 partial versions of 512 bytes at byte 2048 (128
/// KiB) go to the log, 293 of 3584 bytes at byte 512 (just over 1 MiB)
/// take a checkpoint. Lazy fetch: a partial write to a cold block is a
/// patch, and a FLUSH persists it as a partial version.
#[test]
fn a_partial_version_counts_its_range_toward_the_log_limit() {
    let mut c = write_back_1024(64);
    c.fetch = FetchMode::Lazy;
    let mut h = MemHarness::new(c);
    let mut id = 1;
    let mut flush_partials = |h: &mut MemHarness, lbns: std::ops::Range<u64>, at: u64, len: u64| {
        let before = h.engine.stats();
        let n = lbns.end - lbns.start;
        for lbn in lbns {
            let op = ReqOp::Write {
                offset: lbn * BS + at,
                data: Bytes::from(vec![3; len as usize]),
                fua: false,
            };
            run_req(h, id, op);
            id += 1;
        }
        run_req(h, id, ReqOp::Flush);
        id += 1;
        run_io(h);
        let after = h.engine.stats();
        assert_eq!(after.patch_persists - before.patch_persists, n);
        assert_eq!(after.commits, before.commits + 1, "one commit");
        after.log_commits - before.log_commits
    };
    assert_eq!(flush_partials(&mut h, 0..256, 2048, 512), 1, "the log");
    assert_eq!(
        flush_partials(&mut h, 256..549, 512, 3584),
        0,
        "a checkpoint"
    );
}

/// The checkpoint after a given-up one erases the record copy that one
/// may have landed in, beside its first device flush, and writes no
/// slot-table page before both completed (`start_commit` counts the erase
/// in the commands the first step waits for).
#[test]
fn a_checkpoint_writes_no_page_before_its_record_erase_completes() {
    let mut h = MemHarness::new(cfg(16));
    let l = h.engine.layout();
    let table = layout::TABLE_OFFSET..layout::TABLE_OFFSET + l.table_bytes;
    fail_a_log_commit(&mut h);
    // Block 2 and a FLUSH: the checkpoint's record write fails every time.
    h.submit(5, write(2 * BS, 3));
    h.wait(5, &mut |_| 0).result.unwrap();
    h.submit(6, ReqOp::Flush);
    while !h.replies.iter().any(|r| r.id == 6) {
        if let Some(i) = record_write(&mut h) {
            h.complete_torn(i, 512);
            continue;
        }
        assert!(h.step(&mut |_| 0), "FLUSH never answered");
    }
    assert!(h.wait(6, &mut |_| 0).result.is_err(), "the commit gave up");
    // Block 3 and a FLUSH: its checkpoint erases the unsure record copy.
    h.submit(7, write(3 * BS, 4));
    h.wait(7, &mut |_| 0).result.unwrap();
    h.submit(8, ReqOp::Flush);
    let is_erase = |c: &IoCmd<Bytes>| {
        c.dev == Dev::Cache
            && matches!(&c.op, IoOp::Write { fua: true, data, .. }
                if data.len() == 512 && data.iter().all(|&b| b == 0))
    };
    while !h.inflight().iter().any(is_erase) {
        assert!(h.step(&mut |_| 0), "no record erase");
    }
    // Everything but the erase runs: no page is written meanwhile.
    for _ in 0..100 {
        let Some(i) = h.inflight().iter().position(|c| !is_erase(c)) else {
            break;
        };
        let c = &h.inflight()[i];
        assert!(
            !matches!((c.dev, &c.op), (Dev::Cache, IoOp::Write { offset, .. }) if table.contains(offset)),
            "a slot-table page written before the record erase completed"
        );
        assert!(h.step(&mut |_| i));
    }
    assert!(!h.replies.iter().any(|r| r.id == 8));
    let i = h.inflight().iter().position(is_erase).unwrap();
    assert!(h.step(&mut |_| i));
    h.wait(8, &mut |_| 0).result.unwrap();
    h.reopen().expect("recovery");
    for (lbn, v) in [(0u64, 1u8), (3, 4)] {
        assert!(
            read(&mut h, 10 + lbn, lbn).iter().all(|&x| x == v),
            "block {lbn}"
        );
    }
}

/// Only valid entries count toward a log record's checked bytes: slots
/// written free (versions dropped before any commit named them) cost no
/// checksum. 200 blocks read (cached clean) and trimmed (dropped), then
/// 200 others written, before a FLUSH: 200 new versions (800 KiB) and 200
/// free entries in the commit, which takes the log.
#[test]
fn free_entries_cost_no_checksum() {
    let c = write_back_1024(64);
    let mut h = MemHarness::new(c);
    let read = ReqOp::Read {
        offset: 0,
        len: 200 * BS as u32,
    };
    run_req(&mut h, 1, read);
    run_io(&mut h);
    assert_eq!(h.engine.stats().cached_blocks, 200);
    let trim = ReqOp::Trim {
        offset: 0,
        len: 200 * BS as u32,
    };
    run_req(&mut h, 2, trim);
    let write = ReqOp::Write {
        offset: 200 * BS,
        data: Bytes::from(vec![2; 200 * BS as usize]),
        fua: false,
    };
    run_req(&mut h, 3, write);
    run_io(&mut h);
    let st = h.engine.stats();
    assert_eq!(
        (st.commits, st.cached_blocks),
        (0, 200),
        "{}",
        h.engine.debug_state()
    );
    run_req(&mut h, 4, ReqOp::Flush);
    run_io(&mut h);
    let st = h.engine.stats();
    assert_eq!((st.commits, st.log_commits), (1, 1), "a log commit");
}

/// A log record checks the data of the versions it introduces and of
/// those whose record is not sealed yet, not of sealed ones it names again:
/// blocks 0, 5 and 6 flushed one by one (records 1 to 3; record 3 seals 1
/// and 2), then destaged (clean: their entries change, their data does
/// not), cost the drain's commit one checksum, block 6's; its record
/// names all three versions valid.
#[test]
fn a_sealed_version_named_again_costs_no_checksum() {
    let mut h = MemHarness::new(cfg(64));
    for (id, lbn) in [(1, 0), (3, 5), (5, 6)] {
        assert_eq!(write_and_flush(&mut h, id, lbn, 1), 1);
    }
    h.settle(&mut |_| 0);
    let commits = h.engine.stats().log_commits;
    h.engine.start_drain(h.now);
    let mut sums = std::collections::HashSet::new();
    for _ in 0..10_000 {
        sums.extend(
            h.inflight()
                .iter()
                .filter(|c| matches!(c.op, IoOp::Checksum { .. }))
                .map(|c| c.id),
        );
        if !h.step(&mut |_| 0) && h.engine.is_idle() {
            break;
        }
    }
    h.engine.end_drain();
    assert_eq!(h.engine.dirty_versions(), 0);
    assert!(h.engine.stats().log_commits > commits, "a log commit");
    assert_eq!(sums.len(), 1, "{}", h.engine.debug_state());
    // The record names the three clean versions (write-back recovery after
    // a crash discards them; their data is on the backing store).
    let rep = h.reopen().unwrap();
    assert_eq!((rep.log_records, rep.discarded), (4, 3), "{rep:?}");
    assert!(read(&mut h, 10, 5).iter().all(|&x| x == 1));
}

/// Write block `lbn` with `byte`, then FLUSH; the cache-device commands the
/// FLUSH's commit issued (device flushes, and writes with their FUA flag
/// and length).
fn flush_commands(
    h: &mut MemHarness,
    id: ReqId,
    lbn: u64,
    byte: u8,
) -> (usize, Vec<(bool, usize)>) {
    h.submit(id, write(lbn * BS, byte));
    h.wait(id, &mut |_| 0).result.unwrap();
    h.submit(id + 1, ReqOp::Flush);
    let mut flushes = std::collections::HashSet::new();
    let mut writes = std::collections::HashMap::new();
    while !h.replies.iter().any(|r| r.id == id + 1) {
        for c in h.inflight().iter().filter(|c| c.dev == Dev::Cache) {
            match &c.op {
                IoOp::Flush => {
                    flushes.insert(c.id);
                }
                IoOp::Write { fua, data, .. } => {
                    writes.insert(c.id, (*fua, data.len()));
                }
                _ => {}
            }
        }
        assert!(h.step(&mut |_| 0), "FLUSH never answered");
    }
    let r = h.replies.iter().find(|r| r.id == id + 1).unwrap();
    assert!(r.result.is_ok());
    let mut w: Vec<_> = writes.into_iter().collect();
    w.sort();
    (flushes.len(), w.into_iter().map(|(_, v)| v).collect())
}

/// An inline commit (format 4): the FLUSH after a one-block write costs one
/// FUA write of the record with the block's bytes (a header page and a
/// data page) and no device flush.
#[test]
fn an_inline_commit_costs_one_fua_write_and_no_device_flush() {
    let mut h = MemHarness::new(cfg_inline(64));
    // The first commit after formatting may differ; look at the later ones.
    flush_commands(&mut h, 10, 0, 1);
    let before = h.engine.stats().clone();
    for i in 1..6u64 {
        let (flushes, writes) = flush_commands(&mut h, 10 + 2 * i, i, i as u8 + 1);
        assert_eq!(flushes, 0, "no device flush: {writes:?}");
        assert_eq!(
            writes,
            vec![(true, 2 * BS as usize)],
            "one FUA record write"
        );
    }
    let st = h.engine.stats().clone();
    assert_eq!(st.inline_commits - before.inline_commits, 5, "{st:?}");
    assert_eq!(st.log_commits - before.log_commits, 5, "{st:?}");
    // With the bound at 0 the same FLUSH writes the record without FUA and
    // flushes the device once.
    let mut h = MemHarness::new(cfg(64));
    flush_commands(&mut h, 10, 0, 1);
    let (flushes, writes) = flush_commands(&mut h, 12, 1, 2);
    assert_eq!(flushes, 1);
    assert_eq!(writes, vec![(false, BS as usize)]);
    assert_eq!(h.engine.stats().inline_commits, 0);
}

/// An inline commit flushes nothing but its record, so a version it names
/// may be missing from its slot after a crash: recovery writes it back from
/// the record.
#[test]
fn recovery_writes_an_inline_records_versions_back_into_their_slots() {
    let mut h = MemHarness::new(cfg_inline(64));
    for i in 0..4u64 {
        flush_commands(&mut h, 10 + 2 * i, i, 0x30 + i as u8);
    }
    let inline = h.engine.stats().inline_commits;
    assert!(inline >= 3);
    // Wipe the slots of blocks 1..4, as if their writes never left the
    // device's volatile cache.
    let l = h.engine.layout();
    let mut wiped = 0;
    for s in 0..l.capacity as u32 {
        let at = l.slot_offset(s) as usize;
        let b = h.cache[at];
        if (0x31..0x34).contains(&b) && h.cache[at..at + BS as usize].iter().all(|&x| x == b) {
            h.cache[at..at + BS as usize].fill(0xee);
            wiped += 1;
        }
    }
    assert_eq!(wiped, 3);
    let rep = h.reopen().unwrap();
    // Every inline commit named one new version and none is sealed (no
    // flushed commit followed them): each is written back, once.
    assert_eq!(rep.inline_repairs, inline, "{rep:?}");
    assert_eq!(rep.log_dropped, 0, "{rep:?}");
    for i in 0..4u64 {
        assert!(
            read(&mut h, 100 + i, i)
                .iter()
                .all(|&b| b == 0x30 + i as u8),
            "block {i}"
        );
    }
}

/// An inline commit flushes no slot, so it seals nothing for write-back's
/// in-place rewrites: after FLUSHes that were all inline, a rewrite takes a
/// fresh slot. A flushed commit (here: more data than the inline bound)
/// puts every version named so far in place, and once a later record says
/// so the rewrite goes in place; the FLUSH after an in-place rewrite then
/// flushes the device (an inline record would leave the rewrite volatile).
#[test]
fn an_inline_commit_seals_no_version_for_in_place_rewrites() {
    let mut c = cfg_inline(64);
    c.rewrite_in_place = true;
    let mut h = MemHarness::new(c);
    for i in 0..3u64 {
        flush_commands(&mut h, 10 + 2 * i, i, 1);
    }
    let free = h.engine.stats().free_slots;
    h.submit(20, write(0, 2));
    h.wait(20, &mut |_| 0).result.unwrap();
    assert_eq!(
        free - h.engine.stats().free_slots,
        1,
        "a fresh slot: nothing is sealed in place"
    );
    // 20 blocks (80 KiB, over the 64 KiB bound), then FLUSH: a flushed commit.
    for i in 0..20u64 {
        h.submit(100 + i, write((30 + i) * BS, 3));
        h.wait(100 + i, &mut |_| 0).result.unwrap();
    }
    let inline = h.engine.stats().inline_commits;
    run_flush(&mut h, 200);
    assert_eq!(h.engine.stats().inline_commits, inline, "flushed");
    // The next record carries `sealed` past it.
    flush_commands(&mut h, 210, 5, 4);
    h.settle(&mut |_| 0);
    let free = h.engine.stats().free_slots;
    h.submit(220, write(0, 5));
    h.wait(220, &mut |_| 0).result.unwrap();
    assert_eq!(free, h.engine.stats().free_slots, "in place now");
    h.submit(221, ReqOp::Flush);
    let mut flushed = false;
    while !h.replies.iter().any(|r| r.id == 221) {
        flushed |= h
            .inflight()
            .iter()
            .any(|c| c.dev == Dev::Cache && matches!(c.op, IoOp::Flush));
        assert!(h.step(&mut |_| 0));
    }
    assert!(flushed, "the rewrite's FLUSH flushes the device");
    h.reopen().unwrap();
    assert!(read(&mut h, 230, 0).iter().all(|&b| b == 5));
}

fn run_flush(h: &mut MemHarness, id: ReqId) {
    h.submit(id, ReqOp::Flush);
    h.wait(id, &mut |_| 0).result.unwrap();
}

/// A format 3 cache is opened as it is and never gets an inline record (a
/// format 3 reader would take one for the log's end): with inline records
/// configured, its FLUSH still writes a plain record and flushes.
#[test]
fn a_format_3_cache_never_gets_an_inline_record() {
    let mut h = MemHarness::new(cfg_inline(64));
    flush_commands(&mut h, 10, 0, 1);
    assert!(h.engine.stats().inline_commits > 0);
    let mut sb = layout::Superblock::decode(&h.cache[0..512]).unwrap();
    assert_eq!(sb.version, layout::FORMAT_VERSION);
    sb.version = 3;
    h.cache[0..512].copy_from_slice(&sb.encode());
    h.reopen().unwrap();
    // The first commit after recovery is a checkpoint; look at later ones.
    flush_commands(&mut h, 20, 1, 2);
    for i in 2..5u64 {
        let (flushes, writes) = flush_commands(&mut h, 20 + 2 * i, i, 3);
        assert_eq!((flushes, writes), (1, vec![(false, BS as usize)]));
    }
    assert_eq!(h.engine.stats().inline_commits, 0);
    // The same cache at format 4 takes them again.
    let mut sb = layout::Superblock::decode(&h.cache[0..512]).unwrap();
    sb.version = 4;
    h.cache[0..512].copy_from_slice(&sb.encode());
    h.reopen().unwrap();
    flush_commands(&mut h, 40, 6, 4);
    let (flushes, writes) = flush_commands(&mut h, 42, 7, 5);
    assert_eq!((flushes, writes), (0, vec![(true, 2 * BS as usize)]));
}

/// Recovery writes back only unsealed inline records: a sealed one's
/// version may have been rewritten in place since, and a FLUSH may have
/// covered that rewrite. Block 0's first version goes inline; a flushed
/// commit and the record after it seal it; write-back rewrites it in place
/// and a FLUSH covers the rewrite; after a restart block 0 reads the
/// rewrite, not the inline record's bytes.
#[test]
fn a_sealed_inline_record_is_not_written_back() {
    let mut c = cfg_inline(64);
    c.rewrite_in_place = true;
    // No destage: no later record names block 0's slot again.
    c.watermarks = Watermarks {
        high: 1.0,
        low: 1.0,
    };
    let mut h = MemHarness::new(c);
    flush_commands(&mut h, 10, 9, 1);
    let inline = h.engine.stats().inline_commits;
    flush_commands(&mut h, 12, 0, 0x11);
    assert_eq!(
        h.engine.stats().inline_commits,
        inline + 1,
        "block 0 went inline"
    );
    // A flushed commit (80 KiB, over the bound), then a record that seals it.
    for i in 0..20u64 {
        h.submit(100 + i, write((30 + i) * BS, 3));
        h.wait(100 + i, &mut |_| 0).result.unwrap();
    }
    run_flush(&mut h, 200);
    flush_commands(&mut h, 210, 5, 4);
    let free = h.engine.stats().free_slots;
    h.submit(220, write(0, 0x22));
    h.wait(220, &mut |_| 0).result.unwrap();
    assert_eq!(free, h.engine.stats().free_slots, "rewritten in place");
    run_flush(&mut h, 221);
    let rep = h.reopen().unwrap();
    assert!(read(&mut h, 230, 0).iter().all(|&b| b == 0x22), "{rep:?}");
}

/// The cache write of a whole block of `byte`s in flight, if any.
fn block_write(h: &mut MemHarness, byte: u8) -> Option<usize> {
    h.inflight().iter().position(|c| {
        c.dev == Dev::Cache
            && matches!(&c.op, IoOp::Write { data, .. } if data.len() == BS as usize && data[0] == byte)
    })
}

/// `poll_timeout` asks for no commit deadline while a commit cannot start
/// (`commit_blocked`): here while one is in flight. A write acknowledged
/// during a FLUSH's commit is a change whose autocommit age shows only
/// once that commit is done.
#[test]
fn no_commit_deadline_is_asked_for_while_a_commit_is_in_flight() {
    let autocommit = cfg(64).autocommit_ns;
    let mut h = MemHarness::new(cfg(64));
    run_req(&mut h, 1, write(0, 1));
    h.submit(2, ReqOp::Flush);
    assert!(!h.inflight().is_empty());
    assert!(
        h.engine.debug_state().contains("commit=Some"),
        "the FLUSH's commit in flight: {}",
        h.engine.debug_state()
    );
    h.submit(3, write(BS, 2));
    let i = block_write(&mut h, 2).expect("block 1's write");
    assert!(h.step(&mut |_| i));
    let t = h.now;
    assert!(h.replies.iter().any(|r| r.id == 3), "block 1 written");
    assert_eq!(h.engine.poll_timeout(), None, "a commit in flight");
    run_io(&mut h);
    assert!(h.replies.iter().any(|r| r.id == 2), "the FLUSH done");
    assert_eq!(h.engine.poll_timeout(), Some(t + autocommit));
}

/// Nor while a clean stop holds commits back for its final one
/// (`stop_holds_commits`): a stop begun with a write in flight asks for
/// no deadline (its final commit waits for the write, not for a time).
#[test]
fn no_commit_deadline_is_asked_for_while_a_stop_waits_for_a_write() {
    let mut h = MemHarness::new(cfg(64));
    h.submit(1, write(0, 1));
    assert!(block_write(&mut h, 1).is_some());
    h.engine.start_shutdown(h.now);
    assert_eq!(
        h.engine.poll_timeout(),
        None,
        "the stop waits for the write"
    );
    h.wait(1, &mut |_| 0).result.unwrap();
    h.settle(&mut |_| 0);
    assert!(h.engine.is_idle() && !h.engine.stop_gave_up());
}

/// Nor while an in-place rewrite is in flight (its slot's bytes are
/// undefined until it completes): a new block acknowledged meanwhile has
/// its autocommit deadline asked for once the rewrite completes.
#[test]
fn no_commit_deadline_is_asked_for_while_an_in_place_rewrite_is_in_flight() {
    let mut c = cfg(64);
    c.rewrite_in_place = true;
    let autocommit = c.autocommit_ns;
    let mut h = MemHarness::new(c);
    write_and_flush(&mut h, 1, 0, 1);
    // A later record seals block 0's version.
    write_and_flush(&mut h, 3, 5, 1);
    write_and_flush(&mut h, 5, 6, 1);
    h.settle(&mut |_| 0);
    let free = h.engine.stats().free_slots;
    h.submit(10, write(0, 3));
    let rewrite = block_write(&mut h, 3).expect("the rewrite in flight");
    assert_eq!(h.engine.stats().free_slots, free, "in place: no new slot");
    assert_eq!(h.engine.poll_timeout(), None, "nothing changed yet");
    h.submit(12, write(7 * BS, 4));
    let i = block_write(&mut h, 4).expect("block 7's write");
    assert!(i != rewrite);
    assert!(h.step(&mut |_| i));
    let t = h.now;
    assert!(h.replies.iter().any(|r| r.id == 12));
    assert_eq!(h.engine.poll_timeout(), None, "the rewrite in flight");
    let i = block_write(&mut h, 3).unwrap();
    assert!(h.step(&mut |_| i));
    assert!(h.replies.iter().any(|r| r.id == 10));
    assert_eq!(h.engine.poll_timeout(), Some(t + autocommit));
}

/// A patch (dirty bytes held in RAM, `FetchMode::Lazy`) blocks no commit
/// deadline by itself: under write-back (whose commits need no patches
/// done) and journaled (whose do, once a commit asks for them: the
/// patch barrier) alike, a change's autocommit age is asked for while a
/// patch is held. Once the autocommit has raised journaled's barrier and
/// the patch is being turned into a version, the deadline (due) is not
/// asked for until the commit can start.
#[test]
fn a_held_patch_leaves_the_autocommit_deadline_until_a_barrier() {
    for policy in [WritePolicyKind::WriteBack, WritePolicyKind::Journaled] {
        let mut c = cfg(64);
        c.write_policy = policy;
        c.fetch = FetchMode::Lazy;
        c.journal.txn_max_age_ns = 0;
        let autocommit = c.autocommit_ns;
        let mut h = MemHarness::new(c);
        h.submit(1, write(0, 1));
        let i = block_write(&mut h, 1).expect("block 0's write");
        assert!(h.step(&mut |_| i));
        let t = h.now;
        run_io(&mut h);
        assert!(h.replies.iter().any(|r| r.id == 1));
        h.submit(
            2,
            ReqOp::Write {
                offset: 9 * BS + 100,
                data: Bytes::from(vec![2u8; 100]),
                fua: false,
            },
        );
        assert!(h.replies.iter().any(|r| r.id == 2), "{policy}: patched");
        assert_eq!(h.engine.stats().patched_blocks, 1, "{policy}");
        assert!(h.inflight().is_empty(), "{policy}");
        assert_eq!(
            h.engine.poll_timeout(),
            Some(t + autocommit),
            "{policy}: a patch held"
        );
        if policy == WritePolicyKind::Journaled {
            // The autocommit: the barrier first turns the patch into a
            // version; the deadline, due, is not asked for again meanwhile.
            h.now = t + autocommit;
            h.engine.handle_timeout(h.now);
            assert!(!h.inflight().is_empty(), "the patch being installed");
            assert_eq!(h.engine.stats().commits, 0);
            assert_eq!(h.engine.poll_timeout(), None, "the patch barrier");
            run_io(&mut h);
            assert_eq!(h.engine.stats().patched_blocks, 0, "{policy}");
            assert_eq!(h.engine.stats().commits, 1);
        }
    }
}

/// An engine recovered from `h`'s cache device, as `MemHarness::reopen`
/// makes it but before any call (reopen's `handle_timeout` starts its
/// first commit at once).
fn recover_raw(h: &MemHarness) -> Engine<Bytes> {
    let cfg = h.engine.config().clone();
    let l = h.engine.layout();
    let c = &h.cache;
    let image = CacheImage {
        superblock: c[0..512].to_vec(),
        commit_a: c[l.commit_offset(0) as usize..][..512].to_vec(),
        commit_b: c[l.commit_offset(1) as usize..][..512].to_vec(),
        table: c[layout::TABLE_OFFSET as usize..(layout::TABLE_OFFSET + l.table_bytes) as usize]
            .to_vec(),
        log: c[l.log_offset as usize..(l.log_offset + l.log_bytes) as usize].to_vec(),
    };
    let (e, _) = Engine::recover(
        cfg,
        &image,
        &mut |off, len| {
            Ok(layout::data_crc(
                &c[off as usize..(off + len as u64) as usize],
            ))
        },
        &mut |_, _| Ok(()),
    )
    .expect("recovers");
    e
}

/// Recovery that replayed a log record wants a commit at once
/// (`CommitState::asap`), and nothing blocks it: `poll_timeout` asks for
/// it now, so a driver that only calls `handle_timeout` when asked starts
/// it without waiting for a request.
#[test]
fn a_recovered_engine_asks_for_its_first_commit_now() {
    let mut h = MemHarness::new(cfg(64));
    assert_eq!(write_and_flush(&mut h, 1, 0, 1), 1);
    assert_eq!(h.engine.stats().log_commits, 1);
    let e = recover_raw(&h);
    assert_eq!(e.poll_timeout(), Some(0));
}

/// With the inline bound at 0 no commit is inline, not even one that
/// checks no data: after a restart's checkpoint has sealed every version,
/// a drain destages them, and its commit names only sealed versions (no
/// checksum); it is still a plain log record, not an inline one.
#[test]
fn a_commit_that_checks_no_data_is_not_inline_with_the_bound_at_0() {
    let mut h = MemHarness::new(cfg(64));
    for (id, lbn) in [(1, 0), (3, 5), (5, 6)] {
        assert_eq!(write_and_flush(&mut h, id, lbn, 1), 1);
    }
    h.settle(&mut |_| 0);
    h.reopen().unwrap();
    // The first commit after recovery is a checkpoint: it seals them all.
    run_flush(&mut h, 10);
    h.settle(&mut |_| 0);
    let st = h.engine.stats().clone();
    assert!(st.commits > st.log_commits, "a checkpoint: {st:?}");
    assert_eq!(st.inline_commits, 0, "{st:?}");
    assert!(h.engine.dirty_versions() > 0);
    let before = st;
    h.engine.start_drain(h.now);
    let mut sums = 0;
    for _ in 0..10_000 {
        sums += h
            .inflight()
            .iter()
            .filter(|c| matches!(c.op, IoOp::Checksum { .. }))
            .count();
        if !h.step(&mut |_| 0) && h.engine.is_idle() {
            break;
        }
    }
    h.engine.end_drain();
    assert_eq!(h.engine.dirty_versions(), 0);
    let st = h.engine.stats().clone();
    assert!(st.log_commits > before.log_commits, "a log commit: {st:?}");
    assert_eq!(sums, 0, "nothing to check");
    assert_eq!(st.inline_commits, 0, "{st:?}");
}
