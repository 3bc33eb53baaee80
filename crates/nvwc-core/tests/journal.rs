//! The journal bound of journaled write-back (`JournalConfig::size_blocks`,
//! write-policy paper §5.3.2): the allowable staleness of the backing
//! store, in blocks written to the cache and not yet checkpointed.

use bytes::Bytes;
use nvwc_core::testkit::MemHarness;
use nvwc_core::*;

const BS: u64 = 4096;
const WRITES: u64 = 400;

/// What one run of `WRITES` single-block writes to distinct blocks saw.
struct Run {
    /// Most blocks the bound counts at any step.
    peak_journal: u64,
    /// Most blocks whose backing copy lagged the acknowledged data.
    peak_stale: u64,
    stats: Stats,
}

fn byte(b: u64) -> u8 {
    (b % 251) as u8 + 1
}

/// Blocks of `0..WRITES` that were acknowledged and whose backing copy is not yet their data.
fn stale(h: &MemHarness, acked: &[bool]) -> u64 {
    (0..WRITES)
        .filter(|&b| acked[b as usize] && h.backing[(b * BS) as usize] != byte(b))
        .count() as u64
}

/// Journaled with transactions of 16 blocks and checkpoints held back an
/// hour, so that only the bound (or cache space) makes room: 400 writes to
/// distinct blocks, all submitted at once, into a 1024-slot cache.
fn run(policy: WritePolicyKind, bound: u64) -> Run {
    let mut c = Config::new(BS as u32, 1024, 8192 * BS, policy);
    c.journal.txn_max_blocks = 16;
    c.journal.checkpoint_delay_ns = 3_600_000_000_000;
    c.journal.checkpoint_merge_max = 4;
    c.journal.size_blocks = bound;
    let mut h = MemHarness::new(c);
    for b in 0..WRITES {
        h.submit(
            b + 1,
            ReqOp::Write {
                offset: b * BS,
                data: Bytes::from(vec![byte(b); BS as usize]),
                fua: false,
            },
        );
    }
    let mut acked = vec![false; WRITES as usize];
    let (mut peak_journal, mut peak_stale) = (0, 0);
    for _ in 0..1_000_000 {
        for r in h.replies.drain(..) {
            r.result.expect("write failed");
            acked[(r.id - 1) as usize] = true;
        }
        peak_journal = peak_journal.max(h.engine.journal_blocks());
        peak_stale = peak_stale.max(stale(&h, &acked));
        if acked.iter().all(|&a| a) {
            break;
        }
        if !h.step(&mut |_| 0) {
            // Idle with writes unanswered would be a deadlock; time passing
            // (transaction age) is what lets the unbounded run go on.
            h.now += 1_000_000_000;
            h.engine.handle_timeout(h.now);
        }
    }
    assert!(
        acked.iter().all(|&a| a),
        "{policy} bound {bound}: writes never answered"
    );
    for b in (0..WRITES).step_by(7) {
        h.submit(
            10_000 + b,
            ReqOp::Read {
                offset: b * BS,
                len: BS as u32,
            },
        );
        let got = h.wait(10_000 + b, &mut |_| 0).result.unwrap().unwrap();
        assert!(
            got.iter().all(|&x| x == byte(b)),
            "{policy} bound {bound}: block {b}"
        );
    }
    Run {
        peak_journal,
        peak_stale,
        stats: h.engine.stats().clone(),
    }
}

#[test]
fn a_bounded_journal_never_holds_more_than_its_bound() {
    for policy in [WritePolicyKind::Journaled, WritePolicyKind::JournaledHints] {
        for bound in [32, 64, 200] {
            let r = run(policy, bound);
            eprintln!(
                "{policy} bound {bound}: peak journal {}, peak stale {}, journal stalls {}",
                r.peak_journal, r.peak_stale, r.stats.journal_stalls
            );
            assert!(
                r.peak_journal <= bound,
                "{policy} bound {bound}: {}",
                r.peak_journal
            );
            assert!(
                r.peak_stale <= bound,
                "{policy} bound {bound}: {}",
                r.peak_stale
            );
            assert!(
                r.stats.journal_stalls > 0,
                "{policy} bound {bound}: never full"
            );
            // At most once per write: each is one request.
            assert!(
                r.stats.journal_stalls <= WRITES,
                "{policy} bound {bound}: {} stalls for {WRITES} writes",
                r.stats.journal_stalls
            );
            assert!(
                r.stats.destaged_blocks > 0,
                "{policy}: a full journal checkpoints"
            );
        }
    }
}

#[test]
fn staleness_rises_with_the_journal_bound() {
    let peaks: Vec<u64> = [32, 128, 0]
        .iter()
        .map(|&bound| run(WritePolicyKind::Journaled, bound).peak_stale)
        .collect();
    eprintln!("peak stale blocks at bounds 32, 128, unbounded: {peaks:?}");
    assert!(peaks[0] < peaks[1] && peaks[1] < peaks[2], "{peaks:?}");
    // Unbounded, with checkpoints held back, every acknowledged write is
    // stale until its transaction is old enough.
    assert_eq!(peaks[2], WRITES, "{peaks:?}");
}

#[test]
fn no_bound_leaves_write_back_and_ordered_alone() {
    for policy in [WritePolicyKind::WriteBack, WritePolicyKind::Ordered] {
        let r = run(policy, 8);
        assert_eq!(r.stats.journal_stalls, 0, "{policy}");
    }
}

/// A checkpoint copies its transaction's own copy of every block it wrote,
/// even when a later transaction has rewritten the block since: the backing
/// store goes from one transaction boundary to the next. Transaction 1
/// writes blocks 0 and 1 (1 everywhere), transaction 2 rewrites block 0 and
/// writes block 2 (2 everywhere) while transaction 1 is committed and not
/// yet checkpointed; checkpoints wait a second after their commit, so
/// transaction 1 is checkpointed alone. Mutation testing found that freeing
/// transaction 1's copy of block 0 at the rewrite (`keep_superseded` always
/// false) was caught by no integration test: the checkpoint then leaves
/// block 0 out, and the backing store shows block 1 of transaction 1 with
/// block 0 of neither.
#[test]
fn a_checkpoint_writes_its_own_copy_of_a_block_a_later_transaction_rewrote() {
    let mut c = Config::new(BS as u32, 64, 64 * BS, WritePolicyKind::Journaled);
    c.journal.txn_max_blocks = 2;
    c.journal.txn_max_age_ns = 0;
    c.journal.checkpoint_delay_ns = 1_000_000_000;
    c.journal.checkpoint_merge_max = 1;
    let mut h = MemHarness::new(c);
    let mut id = 0;
    let mut write = |h: &mut MemHarness, lbn: u64, byte: u8| {
        id += 1;
        h.submit(
            id,
            ReqOp::Write {
                offset: lbn * BS,
                data: Bytes::from(vec![byte; BS as usize]),
                fua: false,
            },
        );
        h.wait(id, &mut |_| 0).result.expect("write failed");
    };
    let block = |h: &MemHarness, lbn: u64| h.backing[(lbn * BS) as usize];
    write(&mut h, 0, 1);
    write(&mut h, 1, 1);
    write(&mut h, 0, 2);
    write(&mut h, 2, 2);
    assert_eq!(
        (block(&h, 0), block(&h, 1), block(&h, 2)),
        (0, 0, 0),
        "nothing checkpointed before the delay"
    );
    // Run until transaction 1's checkpoint lands, and look at the backing
    // store then, before transaction 2's.
    let mut steps = 0;
    while block(&h, 1) == 0 {
        steps += 1;
        assert!(
            steps < 100_000 && h.step(&mut |_| 0),
            "transaction 1 never checkpointed: {}",
            h.engine.debug_state()
        );
    }
    assert_eq!(
        (block(&h, 0), block(&h, 1), block(&h, 2)),
        (1, 1, 0),
        "the backing store after transaction 1 alone"
    );
    h.settle(&mut |_| 0);
    assert_eq!((block(&h, 0), block(&h, 1), block(&h, 2)), (2, 1, 2));
}
