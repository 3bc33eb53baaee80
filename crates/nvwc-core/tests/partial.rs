//! Lazy patches persisted as partial versions (`engine/partial.rs`): no
//! backing read for the write or its FLUSH; reads that need bytes outside
//! the range combine the backing store's bytes with the slot's; the version
//! and its range survive a restart; writes over it join the range or fetch;
//! a drain leaves exactly the right bytes on the backing store.

use bytes::Bytes;
use nvwc_core::testkit::MemHarness;
use nvwc_core::*;

const BS: u64 = 4096;
const LBN: u64 = 3;

fn cfg(policy: WritePolicyKind) -> Config {
    let mut c = Config::new(BS as u32, 64, 1024 * BS, policy);
    c.fetch = FetchMode::Lazy;
    c
}

fn run(h: &mut MemHarness, id: ReqId, op: ReqOp<Bytes>) -> Option<Bytes> {
    h.submit(id, op);
    let r = h.wait(id, &mut |_| 0);
    r.result.expect("request failed")
}

fn write(h: &mut MemHarness, id: ReqId, at: u64, byte: u8, len: usize) {
    let op = ReqOp::Write {
        offset: LBN * BS + at,
        data: Bytes::from(vec![byte; len]),
        fua: false,
    };
    run(h, id, op);
}

fn read_block(h: &mut MemHarness, id: ReqId) -> Vec<u8> {
    let op = ReqOp::Read {
        offset: LBN * BS,
        len: BS as u32,
    };
    run(h, id, op).expect("read data").to_vec()
}

/// The block as `(byte, length)` runs.
fn block(runs: &[(u8, usize)]) -> Vec<u8> {
    let v: Vec<u8> = runs
        .iter()
        .flat_map(|&(b, n)| std::iter::repeat_n(b, n))
        .collect();
    assert_eq!(v.len(), BS as usize);
    v
}

#[track_caller]
fn same(got: &[u8], want: &[u8], ctx: &str) {
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!("{ctx}: byte {i} is {:#x}, want {:#x}", got[i], want[i]);
    }
}

#[test]
fn lazy_patch_is_persisted_as_a_partial_version() {
    use WritePolicyKind as W;
    for policy in [W::WriteBack, W::Ordered, W::Journaled, W::JournaledHints] {
        let ctx = format!("{policy:?}");
        let mut h = MemHarness::new(cfg(policy));
        let base = LBN as usize * BS as usize;
        h.backing[base..base + BS as usize].fill(0xaa);

        // A partial write to a cold block, then a FLUSH: the patch goes to a
        // cache slot as a partial version; nothing is read from the backing store.
        write(&mut h, 1, 1024, 0x11, 1024);
        run(&mut h, 2, ReqOp::Flush);
        let st = h.engine.stats();
        assert_eq!(st.patches_created, 1, "{ctx}");
        assert_eq!(st.patch_persists, 1, "{ctx}");
        assert_eq!(
            (st.patch_fetches, st.fetches, st.backing_reads),
            (0, 0, 0),
            "{ctx}"
        );

        // Inside the range: a cache hit. The whole block: backing + slot.
        let op = ReqOp::Read {
            offset: LBN * BS + 1024,
            len: 1024,
        };
        let inside = run(&mut h, 3, op).unwrap();
        assert!(inside.iter().all(|&b| b == 0x11), "{ctx}");
        assert_eq!(h.engine.stats().backing_reads, 0, "{ctx}");
        let one = block(&[(0xaa, 1024), (0x11, 1024), (0xaa, 2048)]);
        same(&read_block(&mut h, 4), &one, &ctx);
        assert_eq!(h.engine.stats().partial_read_fetches, 1, "{ctx}");

        // Restart from the cache device (no shutdown): the FLUSH made the
        // version durable, and it comes back partial (read as whole, its
        // slot's zeroes would show).
        let rep = h.reopen().expect("recover");
        assert_eq!(rep.dirty_versions, 1, "{ctx}");
        same(
            &read_block(&mut h, 5),
            &one,
            &format!("{ctx} after restart"),
        );

        // A write touching the range: the union, from the cache alone
        // (ordered keeps dirty range = valid range, so it fetches instead).
        write(&mut h, 6, 2048, 0x22, 1024);
        let two = block(&[(0xaa, 1024), (0x11, 1024), (0x22, 1024), (0xaa, 1024)]);
        same(&read_block(&mut h, 7), &two, &ctx);
        let fetched = h.engine.stats().partial_write_fetches;
        assert_eq!(fetched, u64::from(policy == W::Ordered), "{ctx}");

        // A write apart from it: fetch the block, lay both over it.
        write(&mut h, 8, 3584, 0x33, 512);
        let three = block(&[
            (0xaa, 1024),
            (0x11, 1024),
            (0x22, 1024),
            (0xaa, 512),
            (0x33, 512),
        ]);
        same(&read_block(&mut h, 9), &three, &ctx);
        if policy != W::Ordered {
            assert_eq!(h.engine.stats().partial_write_fetches, 1, "{ctx}");
        }

        // Everything written back: exactly these bytes on the backing store.
        run(&mut h, 10, ReqOp::Flush);
        let now = h.now + 1;
        h.engine.start_drain(now);
        h.settle(&mut |_| 0);
        assert_eq!(h.engine.dirty_versions(), 0, "{ctx}");
        same(
            &h.backing[base..base + BS as usize],
            &three,
            &format!("{ctx} backing"),
        );
    }
}

/// Async fetch modes still bring patched blocks up to date by fetching (as
/// the paper's modes do); only `lazy` persists patches as partial versions.
#[test]
fn async_modes_fetch_instead() {
    let mut c = cfg(WritePolicyKind::WriteBack);
    c.fetch = FetchMode::Async;
    let mut h = MemHarness::new(c);
    write(&mut h, 1, 1024, 0x11, 1024);
    run(&mut h, 2, ReqOp::Flush);
    let st = h.engine.stats();
    assert_eq!(st.patch_persists, 0);
    assert_eq!(st.patch_fetches, 1);
}

/// Lazy write-back with the cache short of room, because the patch sets'
/// own slot reservations leave less than an eighth of it unpromised:
/// cleaning would write each patch directly to the backing store, but a
/// FLUSH persists the sets it waits for into their reserved slots (cache
/// writes, no backing write on the FLUSH's path), and every byte reads back.
#[test]
fn flush_persists_patches_even_when_cleaning_would_write_them_directly() {
    const N: u64 = 60;
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack));
    h.backing.fill(0xaa);
    for i in 0..N {
        let op = ReqOp::Write {
            offset: i * BS + 1024,
            data: Bytes::from(vec![i as u8; 1024]),
            fua: false,
        };
        run(&mut h, 1 + i, op);
    }
    let st = h.engine.stats();
    assert_eq!(st.patches_created, N, "every write became a patch");
    assert_eq!((st.patch_direct_writes, st.backing_writes), (0, 0));
    run(&mut h, 100, ReqOp::Flush);
    let st = h.engine.stats();
    assert_eq!(st.patch_persists, N);
    // (Backing writes after the FLUSH are destages of the partial versions:
    // the cache is now above its high watermark.)
    assert_eq!(
        (st.patch_direct_writes, st.patch_fetches, st.backing_reads),
        (0, 0, 0),
        "the FLUSH waited for the backing store"
    );
    for i in 0..N {
        let op = ReqOp::Read {
            offset: i * BS,
            len: BS as u32,
        };
        let got = run(&mut h, 200 + i, op).expect("read data").to_vec();
        let want = block(&[(0xaa, 1024), (i as u8, 1024), (0xaa, 2048)]);
        same(&got, &want, &format!("block {i}"));
    }
}

/// Reads of a partial version are counted like any read: inside its range a
/// cache hit, needing bytes outside it a miss (and a partial-read fetch).
#[test]
fn reads_of_a_partial_version_count_hits_inside_and_misses_outside() {
    let mut h = MemHarness::new(cfg(WritePolicyKind::WriteBack));
    let base = LBN as usize * BS as usize;
    h.backing[base..base + BS as usize].fill(0xaa);
    write(&mut h, 1, 1024, 0x11, 1024);
    run(&mut h, 2, ReqOp::Flush);
    assert_eq!(h.engine.stats().patch_persists, 1);
    let (hits, misses) = (h.engine.stats().read_hits, h.engine.stats().read_misses);
    let op = ReqOp::Read {
        offset: LBN * BS + 1100,
        len: 100,
    };
    assert_eq!(
        run(&mut h, 3, op).expect("read data").to_vec(),
        vec![0x11; 100]
    );
    let got = read_block(&mut h, 4);
    same(
        &got,
        &block(&[(0xaa, 1024), (0x11, 1024), (0xaa, 2048)]),
        "block",
    );
    let st = h.engine.stats();
    assert_eq!(
        (st.read_hits - hits, st.read_misses - misses),
        (1, 1),
        "{st:?}"
    );
    assert_eq!(st.partial_read_fetches, 1, "{st:?}");
}
