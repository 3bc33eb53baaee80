//! Recovery (`engine/recover.rs`): the image's regions are checked before
//! use; page copies newer than the checkpoint are ignored, counted and
//! rewritten before a later commit could make them valid; older ones are
//! read; commit and sequence numbers stay above everything the device
//! holds; a recovered format-3 cache keeps persisting lazy patches as
//! partial versions.

use bytes::Bytes;
use nvwc_core::layout::{self, Layout};
use nvwc_core::testkit::MemHarness;
use nvwc_core::*;

const BS: u64 = 4096;

/// A cache of 1024 slots (17 slot-table pages of 63 entries) over 4096
/// blocks, with a metadata log of `log_pages` pages (0: every commit a
/// checkpoint).
/// Log commits always flush here (no inline records): replay's data
/// checks are what these tests look at.
fn cfg(policy: WritePolicyKind, log_pages: u32) -> Config {
    let mut c = Config::new(BS as u32, 1024, 4096 * BS, policy);
    c.log_pages = log_pages;
    c.log_inline_bytes = 0;
    c
}

fn write(lbn: u64, byte: u8) -> ReqOp<Bytes> {
    ReqOp::Write {
        offset: lbn * BS,
        data: Bytes::from(vec![byte; BS as usize]),
        fua: false,
    }
}

/// Run request `id` to its reply (timers fire when idle).
fn run(h: &mut MemHarness, id: ReqId, op: ReqOp<Bytes>) -> Reply<Bytes> {
    h.submit(id, op);
    let r = h.wait(id, &mut |_| 0);
    assert!(r.result.is_ok(), "request {id}: {r:?}");
    r
}

/// Block `lbn` read back, as its first byte if every byte is that one.
fn read(h: &mut MemHarness, id: ReqId, lbn: u64) -> Option<u8> {
    let op = ReqOp::Read {
        offset: lbn * BS,
        len: BS as u32,
    };
    let d = run(h, id, op).result.unwrap().expect("read data");
    d.iter().all(|&b| b == d[0]).then_some(d[0])
}

/// The metadata regions of `h`'s cache device, as a driver reads them.
fn image(h: &MemHarness) -> CacheImage {
    let l = Layout::new(h.engine.config());
    let c = &h.cache;
    CacheImage {
        superblock: c[0..512].to_vec(),
        commit_a: c[l.commit_offset(0) as usize..][..512].to_vec(),
        commit_b: c[l.commit_offset(1) as usize..][..512].to_vec(),
        table: c[layout::TABLE_OFFSET as usize..(layout::TABLE_OFFSET + l.table_bytes) as usize]
            .to_vec(),
        log: c[l.log_offset as usize..(l.log_offset + l.log_bytes) as usize].to_vec(),
    }
}

fn recover(h: &MemHarness, img: &CacheImage) -> Result<RecoveryReport, RecoverError> {
    let c = &h.cache;
    Engine::<Bytes>::recover(
        h.engine.config().clone(),
        img,
        &mut |off, len| {
            Ok(layout::data_crc(
                &c[off as usize..(off + len as u64) as usize],
            ))
        },
        &mut |_, _| Ok(()),
    )
    .map(|(_, rep)| rep)
}

/// A slot table or a log shorter than the layout's is an error, whichever
/// of the two is short (reading it would run past its end).
#[test]
fn a_short_table_or_log_is_an_error() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack, 16));
    run(&mut h, 1, write(0, 1));
    run(&mut h, 2, ReqOp::Flush);
    let whole = image(&h);
    assert!(recover(&h, &whole).is_ok());
    let short = Err(RecoverError::Format(layout::FormatError::Short));
    let mut img = whole.clone();
    img.table.pop();
    assert_eq!(recover(&h, &img), short, "a short table");
    let mut img = whole.clone();
    img.log.pop();
    assert_eq!(recover(&h, &img), short, "a short log");
}

/// A recovered format-3 cache persists a lazy patch as a partial version
/// (no backing read), as a freshly formatted one does.
#[test]
fn a_recovered_cache_persists_lazy_patches() {
    let mut c = cfg(WritePolicyKind::WriteBack, 16);
    c.fetch = FetchMode::Lazy;
    let mut h = MemHarness::new(c);
    h.reopen().expect("recover");
    let op = ReqOp::Write {
        offset: 3 * BS + 1024,
        data: Bytes::from(vec![0x11; 1024]),
        fua: false,
    };
    run(&mut h, 1, op);
    run(&mut h, 2, ReqOp::Flush);
    let st = h.engine.stats();
    assert_eq!((st.patch_persists, st.patch_fetches), (1, 0));
    assert_eq!(st.backing_reads, 0);
}

/// The slot whose bytes are all `byte` (a block's only cached version).
fn slot_of(h: &MemHarness, byte: u8) -> u32 {
    let l = h.engine.layout();
    (0..l.capacity as u32)
        .find(|&s| {
            let at = l.slot_offset(s) as usize;
            h.cache[at..at + BS as usize].iter().all(|&b| b == byte)
        })
        .expect("a slot with these bytes")
}

/// Block 0 and then block 1 written and flushed, and block 1's slot
/// corrupted (its data did not land), then a restart: the record naming
/// block 1 is dropped. Returns block 1's write sequence number.
fn drop_the_last_record(policy: WritePolicyKind) -> (MemHarness, u64) {
    let mut h = MemHarness::new(cfg(policy, 64));
    run(&mut h, 1, write(0, 0x10));
    run(&mut h, 2, ReqOp::Flush);
    let seq = run(&mut h, 3, write(1, 0x11)).seq;
    run(&mut h, 4, ReqOp::Flush);
    h.settle(&mut |_| 0);
    let at = h.engine.layout().slot_offset(slot_of(&h, 0x11)) as usize;
    h.cache[at] ^= 0xff;
    let rep = h.reopen().expect("recover");
    assert_eq!(rep.log_dropped, 1, "{policy}: {rep:?}");
    (h, seq)
}

/// The writes after recovery get sequence numbers above the writes a
/// dropped record names (write-back: a dirty entry; write-through: a clean
/// one).
#[test]
fn sequence_numbers_stay_above_a_dropped_record() {
    for policy in [WritePolicyKind::WriteBack, WritePolicyKind::WriteThrough] {
        let (mut h, seq) = drop_the_last_record(policy);
        let next = run(&mut h, 5, write(2, 0x12)).seq;
        assert!(next > seq, "{policy}: seq {next} after {seq}");
    }
}

/// The slot a dropped record names stays retired (not free) until the
/// first commit after recovery has written its entry free, and counts as
/// one retired slot that commit frees.
#[test]
fn a_dropped_records_slot_is_freed_by_the_first_commit() {
    let (mut h, _) = drop_the_last_record(WritePolicyKind::WriteBack);
    let cap = h.engine.layout().capacity;
    assert_eq!(h.retired_pending(), 1, "{}", h.engine.debug_state());
    assert_eq!(
        h.engine.stats().free_slots,
        cap - 2,
        "block 0 and the dropped slot"
    );
    h.settle(&mut |_| 0);
    assert_eq!(h.retired_pending(), 0, "{}", h.engine.debug_state());
    assert_eq!(h.engine.stats().free_slots, cap - 1, "block 0");
}

/// The commit-record write in flight (512 bytes, FUA, to the cache), if any.
fn record_write(h: &mut MemHarness) -> Option<usize> {
    h.inflight().iter().position(|c| {
        c.dev == Dev::Cache
            && matches!(&c.op, IoOp::Write { fua: true, data, .. } if data.len() == 512)
    })
}

/// A checkpoint (no log) that wrote its page copies but not its record:
/// recovery ignores those copies and counts them, reads the checkpoint's
/// (blocks 0 and 70, on pages 0 and 1, read as flushed), and starts a
/// commit at once to rewrite both pages. A later checkpoint that changes
/// neither page (block 200's, page 3) would otherwise make the ignored
/// copies' tag valid: the next recovery would bring back the versions
/// the first one dropped, after reads and a FLUSH that returned the old.
#[test]
fn page_copies_of_an_unfinished_checkpoint_are_ignored_and_rewritten() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack, 0));
    run(&mut h, 1, write(0, 0xa0));
    run(&mut h, 2, write(70, 0xa1));
    run(&mut h, 3, ReqOp::Flush);
    run(&mut h, 4, write(0, 0xb0));
    run(&mut h, 5, write(70, 0xb1));
    h.submit(6, ReqOp::Flush);
    while record_write(&mut h).is_none() {
        assert!(h.step(&mut |_| 0), "no record write");
    }
    let rep = h.reopen().expect("recover");
    assert_eq!((rep.ignored_uncommitted, rep.commit), (2, 1), "{rep:?}");
    assert!(!h.inflight().is_empty(), "the rewrite starts at once");
    assert_eq!(read(&mut h, 10, 0), Some(0xa0));
    assert_eq!(read(&mut h, 11, 70), Some(0xa1));
    run(&mut h, 12, write(200, 0xc0));
    run(&mut h, 13, ReqOp::Flush);
    let rep = h.reopen().expect("recover");
    assert_eq!(rep.ignored_uncommitted, 0, "{rep:?}");
    assert_eq!(read(&mut h, 20, 0), Some(0xa0));
    assert_eq!(read(&mut h, 21, 70), Some(0xa1));
    assert_eq!(read(&mut h, 22, 200), Some(0xc0));
}

/// Pages a checkpoint did not rewrite keep their older copies' tags: a
/// later checkpoint reads them (block 0's page, written by the first
/// checkpoint only).
#[test]
fn a_checkpoint_reads_pages_an_earlier_checkpoint_wrote() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack, 0));
    run(&mut h, 1, write(0, 0xa0));
    run(&mut h, 2, ReqOp::Flush);
    run(&mut h, 3, write(70, 0xa1));
    run(&mut h, 4, ReqOp::Flush);
    let rep = h.reopen().expect("recover");
    assert_eq!(
        (rep.ignored_uncommitted, rep.dirty_versions),
        (0, 2),
        "{rep:?}"
    );
    assert_eq!(read(&mut h, 10, 0), Some(0xa0));
    assert_eq!(read(&mut h, 11, 70), Some(0xa1));
}

/// Each restart's first commit gets a number above the checkpoint's, with
/// or without a log: a checkpoint with the number of the one it replaces
/// would lose to it when it went to the first record copy's twin, and the
/// writes it made durable would be lost.
#[test]
fn commit_numbers_grow_across_restarts() {
    for log_pages in [0, 16] {
        let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack, log_pages));
        let mut last = h.engine.durable_commit();
        for r in 0..4u64 {
            run(&mut h, 10 * r + 1, write(r, 0x10 + r as u8));
            run(&mut h, 10 * r + 2, ReqOp::Flush);
            let rep = h.reopen().expect("recover");
            assert!(
                rep.commit > last,
                "log {log_pages} round {r}: {rep:?} after {last}"
            );
            last = rep.commit;
            for b in 0..=r {
                let got = read(&mut h, 10 * r + 3 + b, b);
                assert_eq!(
                    got,
                    Some(0x10 + b as u8),
                    "log {log_pages} round {r} block {b}"
                );
            }
        }
    }
}

/// Write-back drops clean versions at a restart after a crash: each
/// stays retired until the first commit writes its entry free, counted
/// as one retired slot that commit frees.
#[test]
fn clean_versions_dropped_after_a_crash_are_freed_by_the_first_commit() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack, 16));
    run(&mut h, 1, write(0, 0x10));
    run(&mut h, 2, write(1, 0x11));
    run(&mut h, 3, ReqOp::Flush);
    let now = h.now + 1;
    h.engine.start_drain(now);
    h.settle(&mut |_| 0);
    h.engine.end_drain();
    assert_eq!(h.engine.dirty_versions(), 0);
    run(&mut h, 4, write(2, 0x12));
    run(&mut h, 5, ReqOp::Flush);
    h.settle(&mut |_| 0);
    let rep = h.reopen().expect("recover");
    assert_eq!((rep.discarded, rep.dirty_versions), (2, 1), "{rep:?}");
    let cap = h.engine.layout().capacity;
    assert_eq!(h.retired_pending(), 2, "{}", h.engine.debug_state());
    assert_eq!(h.engine.stats().free_slots, cap - 3);
    h.settle(&mut |_| 0);
    assert_eq!(h.retired_pending(), 0, "{}", h.engine.debug_state());
    assert_eq!(h.engine.stats().free_slots, cap - 1);
    assert_eq!(read(&mut h, 10, 0), Some(0x10));
}

/// Versions recovery read from log records stay unsealed until the first
/// checkpoint after it is durable: write-back with `rewrite_in_place`
/// does not rewrite one in place meanwhile. (If it did, a crash before
/// that checkpoint would find the record's data changed and drop it, with
/// the flushed write it holds.)
#[test]
fn replayed_versions_are_not_rewritten_in_place_before_the_checkpoint() {
    let mut c = cfg(WritePolicyKind::WriteBack, 64);
    c.rewrite_in_place = true;
    let mut h = MemHarness::new(c);
    run(&mut h, 1, write(0, 0x10));
    run(&mut h, 2, ReqOp::Flush);
    let rep = h.reopen().expect("recover");
    assert_eq!(rep.log_records, 1, "{rep:?}");
    // The rewrite runs; the checkpoint's commands stay in flight.
    h.submit(3, write(0, 0x20));
    while !h.replies.iter().any(|r| r.id == 3) {
        let i = h
            .inflight()
            .iter()
            .position(|c| matches!(&c.op, IoOp::Write { data, .. } if data.len() == BS as usize))
            .expect("the rewrite's data write");
        assert!(h.step(&mut |_| i));
    }
    let rep = h.reopen().expect("recover");
    assert_eq!((rep.log_records, rep.log_dropped), (1, 0), "{rep:?}");
    assert_eq!(read(&mut h, 10, 0), Some(0x10));
}

/// Replay takes consecutive records of the checkpoint's epoch from the
/// log's start: a valid record after the last one is ignored when its
/// number skips one, when it belongs to another epoch, or when it names a
/// slot past the cache's end.
#[test]
fn replay_stops_at_a_record_out_of_sequence() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack, 16));
    run(&mut h, 1, write(0, 0x10));
    run(&mut h, 2, ReqOp::Flush);
    let l = h.engine.layout();
    let log = l.log_offset as usize;
    let (r, len) = layout::LogRecord::decode(&h.cache[log..log + l.log_bytes as usize], BS as u32)
        .expect("the flush's record");
    let at = log + len as usize;
    let rep = h.reopen().expect("recover");
    assert_eq!((rep.log_records, rep.log_dropped), (1, 0), "{rep:?}");
    let mut skips = r.clone();
    skips.n = r.n + 2;
    let mut other_epoch = r.clone();
    other_epoch.epoch = r.epoch + 1;
    other_epoch.n = r.n + 1;
    let mut past_the_end = r.clone();
    past_the_end.n = r.n + 1;
    past_the_end.entries[0].0 = l.capacity as u32;
    for (what, next) in [
        ("a skipped number", skips),
        ("another epoch", other_epoch),
        ("a slot past the end", past_the_end),
    ] {
        let b = next.encode();
        h.cache[at..at + b.len()].copy_from_slice(&b);
        let rep = h.reopen().expect("recover");
        assert_eq!(
            (rep.log_records, rep.log_dropped),
            (1, 0),
            "{what}: {rep:?}"
        );
    }
    assert_eq!(read(&mut h, 10, 0), Some(0x10));
}

/// Page `pg`'s newest copy on `h`'s cache device: its offset, tag and
/// entries (a blank entry as the default one, which is free).
fn page_copy(h: &MemHarness, pg: u64) -> (usize, u64, Vec<(u32, layout::Entry)>) {
    let page = layout::PAGE_BYTES as usize;
    let (at, tag) = (0..2u64)
        .filter_map(|c| {
            let at = layout::TABLE_OFFSET as usize + (2 * pg + c) as usize * page;
            layout::page_tag(pg, &h.cache[at..at + page]).map(|t| (at, t))
        })
        .max_by_key(|&(_, t)| t)
        .expect("a copy of the page");
    let first = pg * layout::ENTRIES_PER_PAGE;
    let entries = (0..layout::ENTRIES_PER_PAGE)
        .map(|i| {
            let s = (first + i) as u32;
            let e = at + 64 + i as usize * 64;
            (
                s,
                layout::Entry::decode(s, &h.cache[e..e + 64]).unwrap_or_default(),
            )
        })
        .collect();
    (at, tag, entries)
}

/// Run the commands in flight to the end, without timers.
fn run_io(h: &mut MemHarness) {
    while !h.inflight().is_empty() {
        assert!(h.step(&mut |_| 0));
    }
}

/// Journaled, no log: block 0 written in the open transaction (1) and
/// flushed, so the checkpoint names it uncommitted. Its entry is then made
/// to name transaction 2, as a later transaction's version would, and,
/// with `older`, a second, older version of the block in transaction 2 is
/// added in slot 62. Returns the recovery report.
fn merge_uncommitted(older: bool) -> (MemHarness, RecoveryReport) {
    let mut h = MemHarness::new(cfg(WritePolicyKind::Journaled, 0));
    run(&mut h, 1, write(0, 0x10));
    run(&mut h, 2, ReqOp::Flush);
    let (at, tag, mut entries) = page_copy(&h, 0);
    let i = entries
        .iter()
        .position(|(_, e)| e.flags & layout::F_VALID != 0 && e.lbn == 0)
        .expect("block 0's entry");
    assert_eq!(entries[i].1.aux0, 1, "the open transaction");
    entries[i].1.aux0 = 2;
    if older {
        let mut e = entries[i].1;
        e.seq -= 1;
        entries[62].1 = e;
    }
    let b = layout::encode_page(0, tag, &entries);
    h.cache[at..at + b.len()].copy_from_slice(&b);
    let rep = h.reopen().expect("recover");
    (h, rep)
}

/// Versions of uncommitted transactions are merged into the open one at
/// recovery: the older of two versions of one block among them is
/// discarded, and the kept version's entry, which named another
/// transaction, is rewritten by the first commit (a stale transaction id
/// left on a page would later read as a committed transaction's).
#[test]
fn uncommitted_transactions_merge_into_the_open_one() {
    let (_, rep) = merge_uncommitted(true);
    assert_eq!((rep.dirty_versions, rep.discarded), (1, 1), "{rep:?}");
    let (mut h, rep) = merge_uncommitted(false);
    assert_eq!((rep.dirty_versions, rep.discarded), (1, 0), "{rep:?}");
    run_io(&mut h);
    let (_, _, entries) = page_copy(&h, 0);
    let e = entries
        .iter()
        .find(|(_, e)| e.flags & layout::F_VALID != 0 && e.lbn == 0)
        .expect("block 0's entry")
        .1;
    assert_eq!(e.aux0, 1, "rewritten for the open transaction");
}

/// Block `lbn`'s valid entry in the slot table on `h`'s cache device
/// (the newest copy of each page): its slot and the entry.
fn table_entry(h: &MemHarness, lbn: u64) -> Option<(u32, layout::Entry)> {
    let pages = h
        .engine
        .config()
        .capacity_blocks
        .div_ceil(layout::ENTRIES_PER_PAGE);
    let page = layout::PAGE_BYTES as usize;
    let written = |pg: u64| {
        (0..2u64).any(|c| {
            let at = layout::TABLE_OFFSET as usize + (2 * pg + c) as usize * page;
            layout::page_tag(pg, &h.cache[at..at + page]).is_some()
        })
    };
    (0..pages)
        .filter(|&pg| written(pg))
        .flat_map(|pg| page_copy(h, pg).2)
        .find(|(_, e)| e.flags & layout::F_VALID != 0 && e.lbn == lbn)
}

/// Complete every command in flight but `held` (an id), until none is left.
fn run_io_but(h: &mut MemHarness, held: u64) {
    while let Some(i) = h.inflight().iter().position(|c| c.id != held) {
        assert!(h.step(&mut |_| i));
    }
}

/// Ordered: a version's entry carries its write's completion index, known
/// only once the whole write is done. A commit that runs while a two-block
/// write is half done records the block already installed as "not
/// completed"; the write's completion marks that entry again
/// (`finish_request`), so the next commit records the index, even when
/// nothing else changes on that entry's page. Without it, recovery would
/// take the version for a write that never completed, ordered after every
/// other.
#[test]
fn an_ordered_entry_committed_before_its_write_completed_is_rewritten_with_its_completion() {
    const UNSET: u64 = u64::MAX;
    let mut c = cfg(WritePolicyKind::Ordered, 0);
    c.autocommit_ns = 1_000;
    let mut h = MemHarness::new(c);
    // A free block's slot is the one its number maps to: blocks 62 and 63
    // have their entries on pages 0 and 1.
    let per_page = layout::ENTRIES_PER_PAGE;
    let lbn = per_page - 1;
    h.submit(1, testkit::write_filled(lbn * BS, 0x21, 2 * BS));
    let writes: Vec<u64> = (h.inflight().iter())
        .filter(|c| c.dev == Dev::Cache && matches!(c.op, IoOp::Write { .. }))
        .map(|c| c.id)
        .collect();
    assert_eq!(writes.len(), 2, "one cache write a block");
    let held = writes[1];
    run_io_but(&mut h, held);
    // A commit while the second block's cache write is in flight.
    h.now += 1_000_000;
    h.engine.handle_timeout(h.now);
    run_io_but(&mut h, held);
    let first = (lbn..lbn + 2)
        .find(|&l| table_entry(&h, l).is_some_and(|(_, e)| e.aux0 == UNSET))
        .expect("the commit recorded the installed block as not completed");
    let second = 2 * lbn + 1 - first;
    assert!(
        !h.replies.iter().any(|r| r.id == 1),
        "the write is not done"
    );
    // The write completes; the next commit records its completion.
    let i = h.inflight().iter().position(|c| c.id == held).unwrap();
    assert!(h.step(&mut |_| i));
    assert!(
        h.replies.iter().any(|r| r.id == 1 && r.result.is_ok()),
        "the write is done"
    );
    run(&mut h, 2, ReqOp::Flush);
    let (sa, a) = table_entry(&h, first).expect("the first block's entry");
    let (sb, b) = table_entry(&h, second).expect("the second block's entry");
    assert_ne!(
        sa / per_page as u32,
        sb / per_page as u32,
        "the blocks' entries share no page"
    );
    assert_ne!(
        a.aux0, UNSET,
        "the first block's entry names the completion"
    );
    assert_eq!(
        a.aux0, b.aux0,
        "both blocks carry the write's completion index"
    );
}

/// Ordered, critical admission: a recovered cache that keeps an older
/// dirty version of a block (a shadow: ordered keeps every version until
/// its node is destaged) counts it on its block, and the count returns to
/// zero once the shadow is destaged and retired. The block, trimmed from
/// the cache, then takes a rejected write around the cache, as any block
/// the cache holds nothing of (`can_bypass` reads the count).
#[test]
fn a_recovered_shadow_is_counted_on_its_block_until_it_is_retired() {
    let tag = |critical| Tag {
        client: 0,
        critical,
        sync: false,
    };
    let mut c = cfg(WritePolicyKind::Ordered, 0);
    c.admission = AdmissionKind::Critical;
    let mut h = MemHarness::new(c);
    for (id, byte) in [(1, 0x31), (2, 0x32)] {
        h.submit_tagged(id, write(7, byte), tag(true));
        assert!(h.wait(id, &mut |_| 0).result.is_ok());
    }
    run(&mut h, 3, ReqOp::Flush);
    let rep = h.reopen().expect("recover");
    assert_eq!(rep.dirty_versions, 2, "both versions come back: {rep:?}");
    h.engine.start_drain(h.now);
    h.settle(&mut |_| 0);
    run(&mut h, 4, ReqOp::Flush);
    assert_eq!(h.backing[7 * BS as usize], 0x32, "destaged");
    let trim = ReqOp::Trim {
        offset: 7 * BS,
        len: BS as u32,
    };
    run(&mut h, 5, trim);
    run(&mut h, 6, ReqOp::Flush);
    h.settle(&mut |_| 0);
    let before = h.engine.stats().clone();
    h.submit_tagged(7, write(7, 0x33), tag(false));
    assert!(h.wait(7, &mut |_| 0).result.is_ok());
    let st = h.engine.stats();
    assert_eq!(
        (
            st.bypassed_pieces - before.bypassed_pieces,
            st.bypass_refused - before.bypass_refused
        ),
        (1, 0),
        "the rejected write goes around the cache: {st:?}"
    );
    assert_eq!(h.backing[7 * BS as usize], 0x33);
}
