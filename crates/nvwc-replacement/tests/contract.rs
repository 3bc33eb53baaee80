//! Model-based property tests: random insert/touch/set_dirty/remove/victim/
//! clean_batch sequences against a simple model of the cache, checking the
//! `Replacement` contract for every policy and each policy's exact choices
//! where the model can predict them (LRU order, largest (cold) segment).

use std::collections::{BTreeMap, HashSet};

use nvwc_replacement::{Arc, BlockId, KneeSource, Lru, Lst, Replacement, Stack, Watermarks};
use proptest::prelude::*;

const CAP: u32 = 12;
const TRACK: u64 = 4;

#[derive(Clone, Debug)]
enum Op {
    Insert { slot: u8, lbn: u8, dirty: bool },
    Touch { pick: u8, write: bool },
    Flip { pick: u8 },
    Remove { pick: u8 },
    Victim { mask: u32 },
    Clean { max: u8, mask: u32 },
    ShouldClean { active: bool },
}

fn mask() -> impl Strategy<Value = u32> {
    prop_oneof![Just(0u32), any::<u32>()]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<u8>(), 0u8..32, any::<bool>()).prop_map(|(slot, lbn, dirty)| Op::Insert { slot, lbn, dirty }),
        3 => (any::<u8>(), any::<bool>()).prop_map(|(pick, write)| Op::Touch { pick, write }),
        2 => any::<u8>().prop_map(|pick| Op::Flip { pick }),
        1 => any::<u8>().prop_map(|pick| Op::Remove { pick }),
        2 => mask().prop_map(|mask| Op::Victim { mask }),
        2 => (0u8..8, mask()).prop_map(|(max, mask)| Op::Clean { max, mask }),
        1 => any::<bool>().prop_map(|active| Op::ShouldClean { active }),
    ]
}

fn bit(mask: u32, id: BlockId) -> bool {
    (mask >> (id.0 % 32)) & 1 == 1
}

#[derive(Clone, Copy, Debug)]
struct MBlock {
    lbn: u64,
    dirty: bool,
    access: u64,
    wtime: u64,
    touched: bool,
}

#[derive(Default)]
struct Model {
    blocks: BTreeMap<u32, MBlock>,
    clock: u64,
}

#[derive(Debug)]
struct MSeg {
    len: usize,
    time: u64,
    ids: Vec<BlockId>,
}

impl Model {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn nth(&self, pick: u8) -> Option<BlockId> {
        let n = self.blocks.len();
        (n > 0).then(|| BlockId(*self.blocks.keys().nth(pick as usize % n).unwrap()))
    }

    fn dirty_count(&self) -> u64 {
        self.blocks.values().filter(|b| b.dirty).count() as u64
    }

    /// LRU-ordered ids satisfying `f`.
    fn lru_order(&self, f: impl Fn(&MBlock) -> bool) -> Vec<BlockId> {
        let mut v: Vec<_> = self
            .blocks
            .iter()
            .filter(|(_, b)| f(b))
            .map(|(&i, b)| (b.access, BlockId(i)))
            .collect();
        v.sort();
        v.into_iter().map(|x| x.1).collect()
    }

    fn segments(&self) -> Vec<MSeg> {
        let mut d: Vec<_> = self
            .blocks
            .iter()
            .filter(|(_, b)| b.dirty)
            .map(|(&i, b)| (b.lbn, b.wtime, BlockId(i)))
            .collect();
        d.sort();
        let mut segs: Vec<MSeg> = Vec::new();
        let mut prev: Option<u64> = None;
        for (lbn, wt, id) in d {
            let extend = prev.is_some_and(|p| p + 1 == lbn && p / TRACK == lbn / TRACK);
            if extend {
                let s = segs.last_mut().unwrap();
                s.len += 1;
                s.time = s.time.max(wt);
                s.ids.push(id);
            } else {
                segs.push(MSeg {
                    len: 1,
                    time: wt,
                    ids: vec![id],
                });
            }
            prev = Some(lbn);
        }
        segs
    }

    /// Expected stack/LST batch for hot-region size `knee`.
    fn expected_segment_batch(
        &self,
        knee: u64,
        max: usize,
        busy: &dyn Fn(BlockId) -> bool,
    ) -> Vec<BlockId> {
        let mut segs = self.segments();
        segs.sort_by_key(|s| std::cmp::Reverse(s.time));
        let mut acc = 0;
        let mut hot = 0;
        for s in &segs {
            if acc + s.len as u64 > knee {
                break;
            }
            acc += s.len as u64;
            hot += 1;
        }
        let (hot_segs, cold_segs) = segs.split_at(hot);
        let usable = |s: &&MSeg| s.ids.iter().any(|&i| !busy(i));
        let pick = if !cold_segs.is_empty() {
            cold_segs
                .iter()
                .filter(usable)
                .min_by_key(|s| (std::cmp::Reverse(s.len), s.time))
        } else {
            hot_segs.iter().filter(usable).min_by_key(|s| s.time)
        };
        match pick {
            Some(s) if max > 0 => s
                .ids
                .iter()
                .copied()
                .filter(|&i| !busy(i))
                .take(max)
                .collect(),
            _ => Vec::new(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Lru,
    Arc,
    Lst,
    Stack,
}

/// Per-policy exact expectations, beyond the generic contract.
trait Expect: Replacement {
    fn check_victim(&self, _m: &Model, _pinned: &dyn Fn(BlockId) -> bool, _v: Option<BlockId>) {}
    fn check_batch(
        &self,
        _m: &Model,
        _max: usize,
        _busy: &dyn Fn(BlockId) -> bool,
        _out: &[BlockId],
    ) {
    }
    fn before_victim(&self) -> Option<bool> {
        None
    }
    fn check_state(&self, _m: &Model) {}
    /// Stack's current hot-region size.
    fn knee(&self) -> u64 {
        0
    }
    /// ARC list membership (`Some(true)` = T2); `None` for other policies.
    fn arc_in_t2(&self, _id: BlockId) -> Option<bool> {
        None
    }
}

fn lru_victim(m: &Model, pinned: &dyn Fn(BlockId) -> bool) -> Option<BlockId> {
    m.lru_order(|b| !b.dirty).into_iter().find(|&i| !pinned(i))
}

impl Expect for Lru {
    fn check_victim(&self, m: &Model, pinned: &dyn Fn(BlockId) -> bool, v: Option<BlockId>) {
        assert_eq!(v, lru_victim(m, pinned), "LRU victim");
    }
    fn check_batch(&self, m: &Model, max: usize, busy: &dyn Fn(BlockId) -> bool, out: &[BlockId]) {
        let want: Vec<_> = m
            .lru_order(|b| b.dirty)
            .into_iter()
            .filter(|&i| !busy(i))
            .take(max)
            .collect();
        assert_eq!(out, &want[..], "LRU clean batch");
    }
}

impl Expect for Lst {
    fn check_victim(&self, m: &Model, pinned: &dyn Fn(BlockId) -> bool, v: Option<BlockId>) {
        assert_eq!(v, lru_victim(m, pinned), "LST victim");
    }
    fn check_batch(&self, m: &Model, max: usize, busy: &dyn Fn(BlockId) -> bool, out: &[BlockId]) {
        assert_eq!(
            out,
            &m.expected_segment_batch(0, max, busy)[..],
            "LST batch"
        );
    }
}

impl Expect for Stack {
    fn knee(&self) -> u64 {
        self.s_knee()
    }
    fn check_victim(&self, m: &Model, pinned: &dyn Fn(BlockId) -> bool, v: Option<BlockId>) {
        assert_eq!(v, lru_victim(m, pinned), "stack victim");
    }
    fn check_batch(&self, m: &Model, max: usize, busy: &dyn Fn(BlockId) -> bool, out: &[BlockId]) {
        assert_eq!(
            out,
            &m.expected_segment_batch(self.s_knee(), max, busy)[..],
            "stack batch"
        );
    }
    fn check_state(&self, m: &Model) {
        assert_eq!(self.cold_exists(), m.dirty_count() > self.s_knee());
    }
}

impl Expect for Arc {
    fn arc_in_t2(&self, id: BlockId) -> Option<bool> {
        self.in_t2(id)
    }
    /// Whether T1 is the preferred victim list right now.
    fn before_victim(&self) -> Option<bool> {
        let (t1, _, _, _) = self.sizes();
        Some(t1 as f64 > self.p())
    }
    fn check_batch(&self, m: &Model, max: usize, busy: &dyn Fn(BlockId) -> bool, out: &[BlockId]) {
        // Dirty blocks of T1 in LRU order, then of T2.
        let order = |t2: bool| {
            m.lru_order(|b| b.dirty)
                .into_iter()
                .filter(move |&i| self.in_t2(i) == Some(t2))
        };
        let want: Vec<_> = order(false)
            .chain(order(true))
            .filter(|&i| !busy(i))
            .take(max)
            .collect();
        assert_eq!(out, &want[..], "ARC clean batch");
    }
    fn check_state(&self, m: &Model) {
        let (t1, t2, b1, b2) = self.sizes();
        assert_eq!(t1 + t2, m.blocks.len());
        assert!(b1 + b2 <= CAP as usize, "ghosts {b1}+{b2}");
        assert!((0.0..=CAP as f64).contains(&self.p()));
        for (&i, b) in &m.blocks {
            if b.touched {
                assert_eq!(
                    self.in_t2(BlockId(i)),
                    Some(true),
                    "re-referenced block must be in T2"
                );
            }
        }
    }
}

fn drive<P: Expect>(p: &mut P, kind: Kind, ops: &[Op]) {
    let mut m = Model::default();
    for op in ops {
        match *op {
            Op::Insert { slot, lbn, dirty } => {
                let id = slot as u32 % CAP;
                let lbn = lbn as u64;
                if m.blocks.contains_key(&id) || m.blocks.values().any(|b| b.lbn == lbn) {
                    continue;
                }
                let t = m.tick();
                p.insert(BlockId(id), lbn, dirty);
                m.blocks.insert(
                    id,
                    MBlock {
                        lbn,
                        dirty,
                        access: t,
                        wtime: t,
                        touched: false,
                    },
                );
            }
            Op::Touch { pick, write } => {
                let Some(id) = m.nth(pick) else { continue };
                let t = m.tick();
                p.touch(id, write);
                let b = m.blocks.get_mut(&id.0).unwrap();
                b.access = t;
                b.touched = true;
                if write && b.dirty {
                    b.wtime = t;
                }
            }
            Op::Flip { pick } => {
                let Some(id) = m.nth(pick) else { continue };
                let t = m.tick();
                let b = m.blocks.get_mut(&id.0).unwrap();
                b.dirty = !b.dirty;
                if b.dirty {
                    b.wtime = t;
                }
                p.set_dirty(id, b.dirty);
            }
            Op::Remove { pick } => {
                let Some(id) = m.nth(pick) else { continue };
                p.remove(id);
                m.blocks.remove(&id.0);
            }
            Op::Victim { mask } => {
                let pinned = move |id: BlockId| bit(mask, id);
                let prefer_t1 = p.before_victim();
                let v = p.victim_clean(&pinned);
                match v {
                    Some(v) => {
                        let b = m.blocks.get(&v.0).expect("victim must be tracked");
                        assert!(!b.dirty, "victim must be clean");
                        assert!(!pinned(v), "victim must not be pinned");
                    }
                    None => assert!(
                        lru_victim(&m, &pinned).is_none(),
                        "a clean unpinned block exists"
                    ),
                }
                p.check_victim(&m, &pinned, v);
                if let (Some(prefer_t1), Some(v)) = (prefer_t1, v) {
                    check_arc_victim(p, &m, &pinned, prefer_t1, v);
                }
            }
            Op::Clean { max, mask } => {
                let busy = move |id: BlockId| bit(mask, id);
                let max = max as usize;
                let mut out = vec![BlockId(999)]; // must be appended to, not cleared
                p.clean_batch(max, &busy, &mut out);
                assert_eq!(out.remove(0), BlockId(999), "clean_batch must append");
                assert!(out.len() <= max);
                let mut seen = HashSet::new();
                for &id in &out {
                    let b = m.blocks.get(&id.0).expect("batch block must be tracked");
                    assert!(b.dirty, "batch block must be dirty");
                    assert!(!busy(id), "batch block must not be busy");
                    assert!(seen.insert(id), "duplicate in batch");
                }
                let any_cleanable = m.blocks.iter().any(|(&i, b)| b.dirty && !busy(BlockId(i)));
                if out.is_empty() && max > 0 && kind != Kind::Stack {
                    assert!(
                        !any_cleanable,
                        "dirty non-busy blocks exist but batch is empty"
                    );
                }
                p.check_batch(&m, max, &busy, &out);
            }
            Op::ShouldClean { active } => {
                let wm = Watermarks {
                    high: 0.5,
                    low: 0.25,
                };
                let d = m.dirty_count();
                let got = p.should_clean(d, CAP as u64, active, wm);
                let above_high = d as f64 > 0.5 * CAP as f64;
                let want = match kind {
                    Kind::Stack => above_high || (active && d > p.knee()),
                    _ if active => d as f64 > 0.25 * CAP as f64,
                    _ => above_high,
                };
                assert_eq!(got, want, "should_clean(d={d}, active={active})");
            }
        }
        p.check_state(&m);
    }
}

/// ARC: the victim is the LRU clean unpinned block of its list, and it comes
/// from the non-preferred list only if the preferred list had none.
fn check_arc_victim<P: Expect>(
    p: &P,
    m: &Model,
    pinned: &dyn Fn(BlockId) -> bool,
    prefer_t1: bool,
    v: BlockId,
) {
    let arc_list = |i: BlockId| p.arc_in_t2(i).expect("tracked");
    let v_t2 = arc_list(v);
    let cands = |t2: bool| {
        m.lru_order(|b| !b.dirty)
            .into_iter()
            .filter(move |&i| !pinned(i) && arc_list(i) == t2)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        cands(v_t2).first(),
        Some(&v),
        "victim is not the LRU clean block of its list"
    );
    if v_t2 == prefer_t1 {
        assert!(
            cands(!prefer_t1).is_empty(),
            "victim from the non-preferred list while the preferred had one"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn lru_contract(ops in prop::collection::vec(op(), 0..200)) {
        drive(&mut Lru::new(CAP as usize), Kind::Lru, &ops);
    }

    #[test]
    fn arc_contract(ops in prop::collection::vec(op(), 0..200)) {
        drive(&mut Arc::new(CAP as usize), Kind::Arc, &ops);
    }

    #[test]
    fn lst_contract(ops in prop::collection::vec(op(), 0..200)) {
        drive(&mut Lst::new(CAP as usize, TRACK), Kind::Lst, &ops);
    }

    #[test]
    fn stack_contract(ops in prop::collection::vec(op(), 0..200), knee in 0u64..14) {
        drive(&mut Stack::new(CAP as usize, TRACK, KneeSource::Fixed(knee)), Kind::Stack, &ops);
    }

    /// Online knee recomputed every 5 writes from at most 4 sampled keys, so
    /// s_knee moves during the run (and SHARDS sampling kicks in).
    #[test]
    fn stack_online_knee_contract(ops in prop::collection::vec(op(), 0..200)) {
        let knee = KneeSource::Online { period: 5, sample_keys: 4 };
        drive(&mut Stack::new(CAP as usize, TRACK, knee), Kind::Stack, &ops);
    }
}
