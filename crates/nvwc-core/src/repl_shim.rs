//! TEMPORARY: a plain LRU used until nvwc-replacement lands its policies.
use nvwc_replacement::{BlockId, Replacement};

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum KneeSource {
    Fixed(u64),
    Online,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ReplacementKind {
    Lru,
    Arc,
    Lst { track_blocks: u64 },
    Stack { track_blocks: u64, knee: KneeSource },
}

struct Lru {
    prev: Vec<u32>,
    next: Vec<u32>,
    dirty: Vec<bool>,
    head: u32,
    tail: u32,
}
const N: u32 = u32::MAX;
impl Lru {
    fn unlink(&mut self, i: u32) {
        let (p, n) = (self.prev[i as usize], self.next[i as usize]);
        if p != N { self.next[p as usize] = n } else { self.head = n }
        if n != N { self.prev[n as usize] = p } else { self.tail = p }
    }
    fn push_front(&mut self, i: u32) {
        self.prev[i as usize] = N;
        self.next[i as usize] = self.head;
        if self.head != N { self.prev[self.head as usize] = i } else { self.tail = i }
        self.head = i;
    }
}
impl Replacement for Lru {
    fn name(&self) -> &'static str { "lru" }
    fn insert(&mut self, id: BlockId, _lbn: u64, dirty: bool) { self.dirty[id.0 as usize] = dirty; self.push_front(id.0) }
    fn touch(&mut self, id: BlockId, _w: bool) { self.unlink(id.0); self.push_front(id.0) }
    fn set_dirty(&mut self, id: BlockId, d: bool) { self.dirty[id.0 as usize] = d }
    fn remove(&mut self, id: BlockId) { self.unlink(id.0) }
    fn victim_clean(&mut self, pinned: &dyn Fn(BlockId) -> bool) -> Option<BlockId> {
        let mut i = self.tail;
        while i != N { if !self.dirty[i as usize] && !pinned(BlockId(i)) { return Some(BlockId(i)) } i = self.prev[i as usize]; }
        None
    }
    fn clean_batch(&mut self, max: usize, busy: &dyn Fn(BlockId) -> bool, out: &mut Vec<BlockId>) {
        let mut i = self.tail;
        while i != N && out.len() < max { if self.dirty[i as usize] && !busy(BlockId(i)) { out.push(BlockId(i)) } i = self.prev[i as usize]; }
    }
    fn mem_bytes(&self) -> usize { self.prev.capacity() * 9 }
}
pub fn build(_k: ReplacementKind, cap: u32) -> Box<dyn Replacement> {
    Box::new(Lru { prev: vec![N; cap as usize], next: vec![N; cap as usize], dirty: vec![false; cap as usize], head: N, tail: N })
}
