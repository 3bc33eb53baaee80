//! Reads (`engine/read.rs`): a read miss asks the backing store for the
//! bytes it needs at their offset (the whole block with `read_allocate`,
//! else the piece alone), a backing read that returns fewer bytes than
//! asked fails the read (and fills nothing), and a filled clean version
//! takes a fresh sequence number of its own. Mutation testing
//! (`scripts/mutants.sh`) found each of these unchecked.

use bytes::Bytes;
use nvwc_core::testkit::MemHarness;
use nvwc_core::*;

const BS: u64 = 4096;

fn cfg(policy: WritePolicyKind, read_allocate: bool) -> Config {
    let mut c = Config::new(BS as u32, 64, 1024 * BS, policy);
    c.read_allocate = read_allocate;
    c
}

/// A byte for every backing offset, different from its neighbours' and
/// from the bytes a block or a few bytes away, so that data read from the
/// wrong offset (or of the wrong length) shows.
fn pattern(off: u64) -> u8 {
    (off.wrapping_mul(0x9E37_79B9).wrapping_shr(11) ^ off ^ (off >> 12)) as u8
}

fn harness_with_pattern(c: Config) -> MemHarness {
    let mut h = MemHarness::new(c);
    for (i, b) in h.backing.iter_mut().enumerate() {
        *b = pattern(i as u64);
    }
    h
}

fn read(offset: u64, len: u64) -> ReqOp<Bytes> {
    ReqOp::Read {
        offset,
        len: len as u32,
    }
}

/// Read misses, not at a block's first byte and not at block 0, return the
/// backing store's bytes at the offset read, with `read_allocate` off (the
/// piece alone is read: `lbn * bs + start`, `end - start` bytes) and on (the
/// whole block is read and the piece cut from it), for a piece in one
/// block and for a read over three blocks that starts and ends inside one.
#[test]
fn read_misses_return_the_backing_bytes_at_the_offset_read() {
    let reads = [
        (5 * BS + 100, 1000),
        (7 * BS + 3000, 2 * BS + 77),
        (20 * BS, BS - 1),
        (11 * BS + 1, BS - 1),
    ];
    for allocate in [false, true] {
        let mut h = harness_with_pattern(cfg(WritePolicyKind::WriteBack, allocate));
        for (i, &(off, len)) in reads.iter().enumerate() {
            let id = i as ReqId + 1;
            h.submit(id, read(off, len));
            let r = h.wait(id, &mut |_| 0);
            let d = r.result.expect("read ok").expect("read data");
            let want: Vec<u8> = (off..off + len).map(pattern).collect();
            assert_eq!(d.len() as u64, len, "{allocate}: read {off}+{len}");
            assert!(
                d[..] == want[..],
                "{allocate}: read {off}+{len}: wrong bytes, first differing at {:?}",
                d.iter().zip(&want).position(|(a, b)| a != b)
            );
        }
        h.settle(&mut |_| 0);
        let s = h.engine.stats();
        assert_eq!(s.read_misses, 6, "{allocate}: {s:?}");
        assert_eq!(s.read_hits, 0, "{allocate}: {s:?}");
    }
}

/// Run `op` as request `id` on `h`'s engine directly, completing every
/// command on `h`'s devices, but answering the backing reads with their
/// last `cut` bytes left out. Returns the reply.
fn run_with_short_backing_reads(
    h: &mut MemHarness,
    id: ReqId,
    op: ReqOp<Bytes>,
    cut: usize,
) -> Reply<Bytes> {
    h.settle(&mut |_| 0);
    h.now += 1;
    h.engine.handle_request(
        h.now,
        Request {
            id,
            op,
            tag: Tag::default(),
        },
    );
    let mut backing_reads = 0;
    let mut reply = None;
    loop {
        let mut progressed = false;
        while let Some(cmd) = h.engine.poll_io() {
            progressed = true;
            let dev = match cmd.dev {
                Dev::Cache => &mut h.cache,
                Dev::Backing => &mut h.backing,
            };
            let res = match &cmd.op {
                IoOp::Read { offset, len } => {
                    let mut n = *len as usize;
                    if cmd.dev == Dev::Backing {
                        backing_reads += 1;
                        n = n.saturating_sub(cut);
                    }
                    let at = *offset as usize;
                    Ok(Some(Bytes::copy_from_slice(&dev[at..at + n])))
                }
                IoOp::Write { offset, data, .. } => {
                    assert!(cmd.group.is_none(), "no group writes here: {cmd:?}");
                    let at = *offset as usize;
                    dev[at..at + data.len()].copy_from_slice(data);
                    Ok(None)
                }
                IoOp::Flush | IoOp::Trim { .. } => Ok(None),
                other => panic!("unexpected command {other:?}"),
            };
            h.now += 1;
            h.engine.handle_completion(h.now, cmd.id, res);
        }
        while let Some(r) = h.engine.poll_reply() {
            progressed = true;
            assert_eq!(r.id, id, "only request {id} is in flight");
            reply = Some(r);
        }
        while h.engine.poll_event().is_some() {}
        if !progressed {
            break;
        }
    }
    assert!(backing_reads > 0, "the read went to the backing store");
    reply.expect("the read got its reply")
}

/// A backing read that returns fewer bytes than it asked for fails the
/// read with EIO (the short data is neither returned nor cached): with
/// `read_allocate` (a whole block asked for, the piece cut from it; also a
/// piece the short data still covers) and without (the piece alone).
/// The block read again afterwards comes back whole and right.
#[test]
fn a_short_backing_read_fails_the_read_and_fills_nothing() {
    for allocate in [true, false] {
        for (off, len, cut) in [
            (5 * BS, BS, BS as usize / 2),
            (5 * BS + 10, 1000, 1),
            (5 * BS + 10, 1000, 500),
        ] {
            let why = format!("allocate {allocate}, read {off}+{len}, {cut} bytes short");
            let mut h = harness_with_pattern(cfg(WritePolicyKind::WriteBack, allocate));
            let r = run_with_short_backing_reads(&mut h, 1, read(off, len), cut);
            assert_eq!(r.result, Err(ReqError::Io), "{why}");
            h.settle(&mut |_| 0);
            assert_eq!(h.engine.stats().populates, 0, "{why}: nothing filled");
            h.submit(2, read(5 * BS, BS));
            let d = h.wait(2, &mut |_| 0).result.expect("read ok").unwrap();
            let want: Vec<u8> = (5 * BS..6 * BS).map(pattern).collect();
            assert!(d[..] == want[..], "{why}: the block read again");
        }
    }
}

/// A write's reply carries its sequence number, in issue order (`Reply::seq`),
/// and a read that fills the cache in between takes a fresh one too
/// (`on_fill` moves `next_seq` on), under every policy: each write's number
/// is above every earlier write's and above the fill's. Recovery takes the
/// newest version of a block by these numbers and relies on no two versions
/// of a block sharing one (see the answer to `recover.rs:384:22` in
/// `reports/mutants-answers.md`).
#[test]
fn write_sequence_numbers_grow_across_read_fills() {
    for policy in WritePolicyKind::ALL {
        let mut h = harness_with_pattern(cfg(policy, true));
        let mut last = 0;
        for i in 0..4u64 {
            let id = 2 * i + 1;
            h.submit(
                id,
                ReqOp::Write {
                    offset: (20 + i) * BS,
                    data: Bytes::from(vec![i as u8 + 1; BS as usize]),
                    fua: false,
                },
            );
            let r = h.wait(id, &mut |_| 0);
            r.result.expect("write ok");
            assert!(
                r.seq > last,
                "{policy:?}: write {i} has sequence number {} after {last}",
                r.seq
            );
            // The fill after a write takes `last + 1`: the next write comes
            // after it.
            last = r.seq + 1;
            h.submit(id + 1, read((40 + i) * BS, BS));
            h.wait(id + 1, &mut |_| 0).result.expect("read ok");
            h.settle(&mut |_| 0);
            assert_eq!(
                h.engine.stats().populates,
                i + 1,
                "{policy:?}: the read filled"
            );
        }
    }
}

/// A write-back cache under lazy fetch over the pattern, whose block 5
/// holds a partial version (`partial.rs`): `len` bytes of 0x11 at `at`
/// within the block, written as a patch and persisted by a FLUSH.
fn partial_version_of_block_5(read_allocate: bool, at: u64, len: usize) -> MemHarness {
    let mut c = cfg(WritePolicyKind::WriteBack, read_allocate);
    c.fetch = FetchMode::Lazy;
    let mut h = harness_with_pattern(c);
    h.submit(
        1,
        ReqOp::Write {
            offset: 5 * BS + at,
            data: Bytes::from(vec![0x11; len]),
            fua: false,
        },
    );
    h.wait(1, &mut |_| 0).result.expect("write ok");
    h.submit(2, ReqOp::Flush);
    h.wait(2, &mut |_| 0).result.expect("flush ok");
    assert_eq!(h.engine.stats().patch_persists, 1);
    h
}

/// A read of a partial version (a lazy patch persisted by a FLUSH) that
/// needs bytes outside its range reads them from the backing store
/// (`partial_read`); a short answer fails the read with EIO too.
#[test]
fn a_short_backing_read_fails_a_read_around_a_partial_version() {
    let mut h = partial_version_of_block_5(false, 1024, 1024);
    for cut in [1, 100] {
        let r = run_with_short_backing_reads(&mut h, 3, read(5 * BS, BS), cut);
        assert_eq!(r.result, Err(ReqError::Io), "{cut} bytes short");
    }
    h.submit(4, read(5 * BS, BS));
    let d = h.wait(4, &mut |_| 0).result.expect("read ok").unwrap();
    let mut want: Vec<u8> = (5 * BS..6 * BS).map(pattern).collect();
    want[1024..2048].fill(0x11);
    assert!(d[..] == want[..], "the block read again");
}

/// A patch fetch (a read of a patched block outside its part, `Lazy`)
/// that returns fewer bytes than a block fails like any failed fetch
/// (`patch_fetch_errors`): the read fails, the patch stays, and the block,
/// fetched whole later, reads back with the patch's bytes over the
/// backing store's.
#[test]
fn a_short_patch_fetch_keeps_the_patch_and_fails_the_read() {
    for cut in [1, BS as usize / 2] {
        let mut c = cfg(WritePolicyKind::WriteBack, true);
        c.fetch = FetchMode::Lazy;
        let mut h = harness_with_pattern(c);
        h.submit(
            1,
            ReqOp::Write {
                offset: 5 * BS + 100,
                data: Bytes::from(vec![0x11; 100]),
                fua: false,
            },
        );
        h.wait(1, &mut |_| 0).result.expect("write");
        assert_eq!(h.engine.stats().patched_blocks, 1);
        let r = run_with_short_backing_reads(&mut h, 2, read(5 * BS, BS), cut);
        assert_eq!(r.result, Err(ReqError::Io), "{cut}");
        let st = h.engine.stats();
        assert_eq!(
            (st.patch_fetch_errors, st.patched_blocks, st.populates),
            (1, 1, 0),
            "{cut}: {st:?}"
        );
        h.settle(&mut |_| 0);
        let mut want: Vec<u8> = (5 * BS..6 * BS).map(pattern).collect();
        want[100..200].fill(0x11);
        h.submit(3, read(5 * BS, BS));
        let d = h.wait(3, &mut |_| 0).result.expect("read").expect("data");
        assert!(d[..] == want[..], "{cut}: wrong bytes");
        assert_eq!(h.engine.stats().patched_blocks, 0, "{cut}");
    }
}

/// A write to a block whose latest version is partial (`partial.rs`), away
/// from that version's range, is a read-modify-write: the whole block is
/// fetched from the backing store (`Engine::on_rmw_fetch`), then the
/// version's bytes and the write are laid over it. A fetch that returns
/// fewer bytes than the block (one short, or none) fails the write with EIO
/// instead of merging a short block (`Engine::rmw_failed`); the block still
/// reads back as the partial version over the backing store's bytes.
#[test]
fn a_short_read_modify_write_fetch_fails_the_write() {
    for cut in [1, BS as usize] {
        let mut h = partial_version_of_block_5(true, 100, 100);
        let st = h.engine.stats();
        assert_eq!(
            (st.patch_persists, st.patched_blocks),
            (1, 0),
            "{cut}: {st:?}"
        );
        let write = ReqOp::Write {
            offset: 5 * BS + 1000,
            data: Bytes::from(vec![0x22; 100]),
            fua: false,
        };
        let r = run_with_short_backing_reads(&mut h, 3, write, cut);
        assert_eq!(r.result, Err(ReqError::Io), "{cut}");
        assert_eq!(h.engine.stats().partial_write_fetches, 1, "{cut}");
        h.settle(&mut |_| 0);
        h.submit(4, read(5 * BS, BS));
        let d = h.wait(4, &mut |_| 0).result.expect("read").expect("data");
        let mut want: Vec<u8> = (5 * BS..6 * BS).map(pattern).collect();
        want[100..200].fill(0x11);
        assert!(d[..] == want[..], "{cut}: wrong bytes");
    }
}
