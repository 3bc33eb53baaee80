//! What both application models share: an OS page cache of dirty file pages,
//! per-process write queues, and an ext4-like journaling daemon (jbd2) in
//! `data=ordered` mode.
//!
//! * [`ProcIo`] lets a process issue a batch of asynchronous writes (one step
//!   each; the runtime gives back each request's id) and then wait for all of
//!   them, as `fsync` does.
//! * [`PageCache`] tracks dirty pages (and when they were dirtied) and pages
//!   under writeback (and by which request): a process that must write a page
//!   already under writeback waits for that request instead (an I/O dependency).
//! * [`Journal`] is jbd2: processes join the running transaction with
//!   metadata blocks (waiting while it is locked: `wait_transaction_locked`,
//!   and for a block the committing transaction is writing:
//!   `sleep_on_shadow_bh`) and with *ordered* data pages (pages of files whose
//!   blocks were allocated in the transaction). A commit locks the transaction
//!   briefly, writes its ordered data (synchronously, as jbd2), then the
//!   descriptor and metadata blocks to the journal, then a commit block with
//!   FUA; waiters of `jbd2_log_wait_commit` wait for it.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use nvwc_core::ReqId;

use super::{CondId, Rt, Step};
use crate::device::Nanos;

const SEC: Nanos = 1_000_000_000;
const FSB: u64 = 4096;

/// A process's queued writes and the requests it waits for.
#[derive(Default, Clone, Debug)]
pub struct ProcIo {
    queue: VecDeque<(Step, Vec<u64>)>,
    last: Option<Vec<u64>>,
    pending: Vec<ReqId>,
    /// Never wait for this process's own async writes (the flusher).
    pub nowait: bool,
}

impl ProcIo {
    /// Queue a step to run before the process goes on.
    pub fn push(&mut self, st: Step) {
        self.queue.push_back((st, Vec::new()));
    }
    /// Wait for request `r` once the queue is empty.
    pub fn wait_for(&mut self, r: ReqId) {
        self.pending.push(r);
    }
}

/// Dirty file pages in the OS page cache.
pub struct PageCache {
    /// Page size in bytes.
    pub page: u64,
    pub dirty: BTreeMap<u64, Nanos>,
    writeback: HashMap<u64, ReqId>,
    req_pages: HashMap<ReqId, Vec<u64>>,
}

impl PageCache {
    pub fn new(page: u64) -> Self {
        PageCache {
            page,
            dirty: BTreeMap::new(),
            writeback: HashMap::new(),
            req_pages: HashMap::new(),
        }
    }

    /// A write() into page `pg` (no I/O).
    pub fn dirty(&mut self, pg: u64, now: Nanos) {
        self.dirty.entry(pg).or_insert(now);
    }

    pub fn under_writeback(&self, pg: u64) -> Option<ReqId> {
        self.writeback.get(&pg).copied()
    }

    /// Queue the write-back of `pages` (sorted) for a process: runs of
    /// adjacent pages become one write of at most `max_run` pages; pages
    /// already under writeback are waited for instead.
    pub fn queue_pages(&mut self, io: &mut ProcIo, pages: &[u64], sync: bool, max_run: usize) {
        let mut i = 0;
        while i < pages.len() {
            if let Some(&r) = self.writeback.get(&pages[i]) {
                io.pending.push(r);
                i += 1;
                continue;
            }
            let mut j = i + 1;
            while j < pages.len()
                && pages[j] == pages[j - 1] + 1
                && j - i < max_run
                && !self.writeback.contains_key(&pages[j])
            {
                j += 1;
            }
            for pg in &pages[i..j] {
                self.dirty.remove(pg);
            }
            io.queue.push_back((
                Step::Write {
                    offset: pages[i] * self.page,
                    len: (j - i) as u64 * self.page,
                    sync,
                    wait: false,
                    fua: false,
                },
                pages[i..j].to_vec(),
            ));
            i = j;
        }
    }

    /// `fsync` of the file holding pages `range`: its dirty pages become
    /// synchronous writes (runs of at most `max_run` pages) the process then
    /// waits for; returns its first step, if any.
    pub fn fsync_range(
        &mut self,
        rt: &mut Rt,
        io: &mut ProcIo,
        range: std::ops::Range<u64>,
        max_run: usize,
    ) -> Option<Step> {
        let pages: Vec<u64> = self.dirty.range(range).map(|(&p, _)| p).collect();
        self.queue_pages(io, &pages, true, max_run);
        self.prologue(rt, io)
    }

    /// Flusher pass: queue async write-back of pages dirty for `expire` or
    /// more (at most `max` pages).
    pub fn flush_old(&mut self, io: &mut ProcIo, now: Nanos, expire: Nanos, max: usize) {
        let old: Vec<u64> = self
            .dirty
            .iter()
            .filter(|(pg, &t)| now.saturating_sub(t) >= expire && !self.writeback.contains_key(pg))
            .map(|(&pg, _)| pg)
            .take(max)
            .collect();
        io.nowait = true;
        self.queue_pages(io, &old, false, 256);
        io.pending.clear();
    }

    /// Linux's flusher as a process: every second, write back (async) the
    /// pages dirty for 5 s or more. `pc` is the process's program counter.
    pub fn flusher(&mut self, rt: &mut Rt, io: &mut ProcIo, pc: &mut u32) -> Step {
        if *pc == 0 {
            *pc = 1;
            return Step::Compute(SEC);
        }
        self.flush_old(io, rt.now, 5 * SEC, 1 << 16);
        self.prologue(rt, io).unwrap_or_else(|| {
            *pc = 1;
            Step::Compute(SEC)
        })
    }

    /// Run first at every step of a process: register its last async write,
    /// emit its queued steps, then wait for its pending requests. `None`:
    /// the process goes on with its program.
    pub fn prologue(&mut self, rt: &mut Rt, io: &mut ProcIo) -> Option<Step> {
        if let Some(pages) = io.last.take() {
            let r = rt.last_req;
            if rt.in_flight(r) {
                for &pg in &pages {
                    self.writeback.insert(pg, r);
                }
                self.req_pages.insert(r, pages);
                if !io.nowait {
                    io.pending.push(r);
                }
            }
        }
        if let Some((st, pages)) = io.queue.pop_front() {
            if matches!(st, Step::Write { wait: false, .. }) && !pages.is_empty() {
                io.last = Some(pages);
            }
            return Some(st);
        }
        while let Some(r) = io.pending.pop() {
            if rt.in_flight(r) {
                return Some(Step::WaitIo(r));
            }
        }
        None
    }

    /// A request completed: its pages are no longer under writeback.
    pub fn io_done(&mut self, id: ReqId) {
        if let Some(pages) = self.req_pages.remove(&id) {
            for pg in pages {
                if self.writeback.get(&pg) == Some(&id) {
                    self.writeback.remove(&pg);
                }
            }
        }
    }
}

/// The conditions a [`Journal`] uses.
#[derive(Clone, Copy, Debug)]
pub struct JournalConds {
    pub commit_done: CondId,
    pub commit_req: CondId,
    pub unlocked: CondId,
}

impl JournalConds {
    /// Conditions 0, 1 and 2 (both models put the journal's first).
    pub const FIRST: JournalConds = JournalConds {
        commit_done: 0,
        commit_req: 1,
        unlocked: 2,
    };
}

/// jbd2 (see the module docs).
pub struct Journal {
    pub conds: JournalConds,
    /// Journal area: byte offset and length.
    at: u64,
    bytes: u64,
    tail: u64,
    /// Running transaction id; transactions up to `done` are committed.
    pub running: u64,
    pub done: u64,
    requested: u64,
    locked: bool,
    run_meta: HashSet<u64>,
    run_ordered: Vec<u64>,
    commit_meta: Vec<u64>,
    shadow: HashMap<u64, ReqId>,
    pc: u32,
    target: u64,
    ordered: Vec<u64>,
    /// Commit interval (ext4 default 5 s).
    pub interval: Nanos,
}

impl Journal {
    pub fn new(conds: JournalConds, at: u64, bytes: u64) -> Self {
        Journal {
            conds,
            at,
            bytes,
            tail: 0,
            running: 1,
            done: 0,
            requested: 0,
            locked: false,
            run_meta: HashSet::new(),
            run_ordered: Vec::new(),
            commit_meta: Vec::new(),
            shadow: HashMap::new(),
            pc: 0,
            target: 0,
            ordered: Vec::new(),
            interval: 5 * SEC,
        }
    }

    /// Join the running transaction with metadata block `m` (and ordered
    /// data pages): `Some(step)` to wait first (call again after it).
    pub fn join(&mut self, rt: &Rt, m: u64, ordered: &[u64]) -> Option<Step> {
        if self.locked {
            return Some(Step::Wait(self.conds.unlocked));
        }
        if let Some(&r) = self.shadow.get(&m) {
            if rt.in_flight(r) {
                return Some(Step::WaitIo(r));
            }
        }
        self.run_meta.insert(m);
        self.run_ordered.extend_from_slice(ordered);
        None
    }

    /// Ask for the running transaction to commit; returns the id to wait for
    /// with [`Journal::committed`].
    pub fn request(&mut self) -> u64 {
        self.requested = self.requested.max(self.running);
        self.running
    }

    pub fn committed(&self, t: u64) -> bool {
        self.done >= t
    }

    /// jbd2's next step.
    pub fn step(&mut self, rt: &mut Rt, pc: &mut PageCache, io: &mut ProcIo) -> Step {
        if let Some(st) = pc.prologue(rt, io) {
            return st;
        }
        loop {
            match self.pc {
                0 => {
                    self.pc = 1;
                    if self.requested <= self.done {
                        return Step::WaitTimeout(self.conds.commit_req, self.interval);
                    }
                }
                1 => {
                    if self.run_meta.is_empty() && self.run_ordered.is_empty() {
                        self.done = self.running;
                        self.running += 1;
                        self.pc = 0;
                        return Step::Signal(self.conds.commit_done);
                    }
                    self.locked = true;
                    self.target = self.running;
                    self.running += 1;
                    self.commit_meta = self.run_meta.drain().collect();
                    self.commit_meta.sort_unstable();
                    self.ordered = std::mem::take(&mut self.run_ordered);
                    self.pc = 2;
                    // T_LOCKED: the running handles finish.
                    return Step::Compute(100_000);
                }
                2 => {
                    self.locked = false;
                    let mut pages = std::mem::take(&mut self.ordered);
                    pages.sort_unstable();
                    pages.dedup();
                    pages.retain(|&p| pc.dirty.contains_key(&p) || pc.under_writeback(p).is_some());
                    pc.queue_pages(io, &pages, true, 256);
                    self.pc = 3;
                    return Step::Signal(self.conds.unlocked);
                }
                3 => {
                    // The ordered data is written (prologue waited): the
                    // descriptor and metadata blocks go to the journal.
                    let n = self.commit_meta.len() as u64 + 1;
                    let off = self.advance(n);
                    self.pc = 4;
                    return Step::Write {
                        offset: self.at + off,
                        len: n * FSB,
                        sync: true,
                        wait: false,
                        fua: false,
                    };
                }
                4 => {
                    let r = rt.last_req;
                    for &m in &self.commit_meta {
                        self.shadow.insert(m, r);
                    }
                    self.pc = 5;
                    return Step::WaitIo(r);
                }
                5 => {
                    for m in std::mem::take(&mut self.commit_meta) {
                        self.shadow.remove(&m);
                    }
                    let off = self.advance(1);
                    self.pc = 6;
                    return Step::Write {
                        offset: self.at + off,
                        len: FSB,
                        sync: true,
                        wait: true,
                        fua: true,
                    };
                }
                _ => {
                    self.done = self.target;
                    self.pc = 0;
                    return Step::Signal(self.conds.commit_done);
                }
            }
        }
    }

    fn advance(&mut self, blocks: u64) -> u64 {
        let len = blocks * FSB;
        if self.tail + len > self.bytes {
            self.tail = 0;
        }
        let off = self.tail;
        self.tail += len;
        off
    }
}
