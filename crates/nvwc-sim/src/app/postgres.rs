//! A PostgreSQL-like model (the admission paper's §6–§7.2, Tables 1–3).
//!
//! Processes and what they write (Table 1's breakdown is the target of the
//! *structure*, not of any number):
//! * **backends** (critical, one per client, closed loop): a transaction
//!   computes, dirties buffer-pool pages, sometimes extends a relation (an
//!   ext4 metadata update under the relation's inode mutex, joining the
//!   running journal transaction, and waiting for a metadata buffer the
//!   journal is writing: `sleep_on_shadow_bh`, or for the transaction lock:
//!   `wait_transaction_locked`), then commits: it takes `WALWriteLock`,
//!   writes the WAL from the flushed position to its own (group commit) and
//!   fdatasyncs it, synchronously. A backend that finds the buffer pool too
//!   dirty writes a victim page into the OS page cache (no I/O).
//! * **WAL writer**: every 200 ms (`wal_writer_delay`), under `WALWriteLock`,
//!   writes and fdatasyncs what backends inserted: a lock a backend may wait
//!   for while the WAL writer does synchronous I/O (process dependency).
//! * **checkpointer**: when 64 MiB of WAL were written since the last
//!   checkpoint (the paper's 256 MiB `checkpoint_segments`, scaled to the
//!   shorter runs) or 30 s passed, writes every dirty buffer into the page
//!   cache spread over time, then fsyncs: a burst of synchronous random
//!   writes, then a journal commit it waits for.
//! * **kworker**: every second, writes back page-cache pages dirty for more
//!   than 5 s, asynchronously (Linux's flusher, `dirty_expire` scaled from 30 s).
//! * **jbd2**: commits the running journal transaction every 5 s or when
//!   someone waits for it (`jbd2_log_wait_commit`): locks it briefly, writes
//!   the ordered data (pages of files extended in it), then the metadata
//!   blocks to the journal (they are *shadow* buffers meanwhile), then a
//!   commit block with FUA.
//!
//! Layout (bytes): data 0..1 GiB (the paper's scale factor 10), fs metadata
//! 1 GiB.., the ext4 journal (128 MiB, circular), and the WAL on a second
//! disk from 2 GiB (the paper puts log and data on different HDDs).
//!
//! Parameters are fixed constants below, each with its reason; none was
//! fitted to the paper's figures.

use std::collections::HashMap;

use nvwc_core::ReqId;

use super::fs::{Journal, JournalConds, PageCache, ProcIo};
use super::{CondId, Model, Pid, Rt, Step};
use crate::device::Nanos;

const MS: Nanos = 1_000_000;
const SEC: Nanos = 1_000_000_000;
/// PostgreSQL page.
const PAGE: u64 = 8192;
/// Data region: 1 GiB database (TPC-C scale factor 10, §7.2).
const DATA_PAGES: u64 = (1 << 30) / PAGE;
/// Hot fs metadata blocks (inode table, bitmaps, extent blocks of 8 relations).
const META_BLOCKS: u64 = 64;
const JOURNAL_AT: u64 = (1 << 30) + (16 << 20);
const JOURNAL_BYTES: u64 = 128 << 20;
/// The log disk starts here.
const LOG_AT: u64 = 2 << 30;
const WAL_BYTES: u64 = 256 << 20;

/// Model parameters.
#[derive(Clone, Debug)]
pub struct PgParams {
    /// Clients, one backend each (the paper: 24).
    pub backends: usize,
    /// CPU time of a transaction. With 24 backends, 30 ms caps the rate at
    /// 800 transactions/s, the order of the paper's TPC-C rate on its 8
    /// cores (tpmC counts New-Order only, about 45 % of the mix), so the
    /// backends are CPU-bound only when no I/O holds them up.
    pub txn_cpu: Nanos,
    /// Buffer-pool pages a transaction dirties (New-Order touches about 10
    /// rows across stock, order-line, orders and district pages).
    pub pages_per_txn: u64,
    /// WAL bytes a transaction inserts.
    pub wal_per_txn: u64,
    /// Shared buffers in pages (the paper: 512 MiB).
    pub pool_pages: u64,
    /// Probability that a transaction extends a relation (new page: a
    /// metadata update in the journal).
    pub p_extend: f64,
    /// Page accesses that miss the buffer pool (it holds half of the
    /// database, and TPC-C's skewed accesses hit it about 98 % of the time):
    /// each needs a victim buffer, written into the page cache first when dirty.
    pub p_miss: f64,
    /// Checkpoint after this much WAL (64 MiB) or this time (30 s).
    pub ckpt_wal: u64,
    pub ckpt_timeout: Nanos,
}

impl Default for PgParams {
    fn default() -> Self {
        PgParams {
            backends: 24,
            txn_cpu: 30 * MS,
            pages_per_txn: 10,
            wal_per_txn: 4096,
            pool_pages: (512 << 20) / PAGE,
            p_extend: 0.02,
            p_miss: 0.02,
            ckpt_wal: 64 << 20,
            ckpt_timeout: 30 * SEC,
        }
    }
}

const WAL_LOCK: usize = 0;
/// Inode mutex of relation `i` is lock `1 + i`.
const RELATIONS: u64 = 8;
const COMMIT_DONE: CondId = JournalConds::FIRST.commit_done;
const COMMIT_REQ: CondId = JournalConds::FIRST.commit_req;
const TXN_UNLOCKED: CondId = JournalConds::FIRST.unlocked;

/// A set of pages with uniform random removal.
#[derive(Default)]
struct PageSet {
    v: Vec<u64>,
    at: HashMap<u64, usize>,
}

impl PageSet {
    fn insert(&mut self, pg: u64) {
        if !self.at.contains_key(&pg) {
            self.at.insert(pg, self.v.len());
            self.v.push(pg);
        }
    }
    fn len(&self) -> usize {
        self.v.len()
    }
    fn take_random(&mut self, rt: &mut Rt) -> Option<u64> {
        if self.v.is_empty() {
            return None;
        }
        let i = rt.below(self.v.len() as u64) as usize;
        let pg = self.v.swap_remove(i);
        self.at.remove(&pg);
        if let Some(&moved) = self.v.get(i) {
            self.at.insert(moved, i);
        }
        Some(pg)
    }
    fn drain(&mut self) -> Vec<u64> {
        self.at.clear();
        std::mem::take(&mut self.v)
    }
}

/// Relation (data file) of a page.
fn rel_of(pg: u64) -> u64 {
    pg / (DATA_PAGES / RELATIONS)
}

#[derive(Default, Clone)]
struct Local {
    pc: u32,
    lsn: u64,
    target: u64,
    rel: u64,
    meta: u64,
    newpage: u64,
    victims: Vec<u64>,
    rels: Vec<u64>,
    pages: Vec<u64>,
    io: ProcIo,
}

impl Local {
    /// The next item of a work list (its last, popped once handled): the
    /// process goes on at `then`, or at `done` when the list is empty.
    fn next_of(&mut self, list: fn(&Local) -> &Vec<u64>, then: u32, done: u32) -> Option<u64> {
        let next = list(self).last().copied();
        self.pc = if next.is_some() { then } else { done };
        next
    }
}

/// The model; see the module docs.
pub struct Postgres {
    p: PgParams,
    loc: Vec<Local>,
    pool_dirty: PageSet,
    cache: PageCache,
    jbd2: Journal,
    insert_lsn: u64,
    flushed_lsn: u64,
    wal_since_ckpt: u64,
    last_ckpt: Nanos,
}

impl Postgres {
    pub fn new(p: PgParams) -> Self {
        let n = p.backends + 4;
        Postgres {
            p,
            loc: vec![Local::default(); n],
            pool_dirty: PageSet::default(),
            cache: PageCache::new(PAGE),
            jbd2: Journal::new(JournalConds::FIRST, JOURNAL_AT, JOURNAL_BYTES),
            insert_lsn: 0,
            flushed_lsn: 0,
            wal_since_ckpt: 0,
            last_ckpt: 0,
        }
    }
    fn jbd2_pid(&self) -> Pid {
        self.p.backends + 3
    }

    /// TPC-C is skewed: 80 % of accesses to 20 % of the pages.
    fn pick_page(rt: &mut Rt) -> u64 {
        if rt.chance(0.8) {
            rt.below(DATA_PAGES / 5)
        } else {
            rt.below(DATA_PAGES)
        }
    }

    /// The WAL write a commit needs: from the flushed position to the
    /// inserted one, whole 8 KiB WAL pages (the last one partial and
    /// rewritten by the next commit), within the WAL region.
    fn wal_write(&self) -> Option<(u64, u64)> {
        if self.flushed_lsn >= self.insert_lsn {
            return None;
        }
        let first = self.flushed_lsn / PAGE;
        let last = self.insert_lsn.div_ceil(PAGE);
        let start = (first * PAGE) % WAL_BYTES;
        let len = ((last - first) * PAGE).min(WAL_BYTES - start);
        Some((LOG_AT + start, len))
    }
}

impl Model for Postgres {
    fn processes(&self) -> Vec<(String, bool)> {
        let mut v: Vec<(String, bool)> = (0..self.p.backends)
            .map(|i| (format!("backend-{i}"), true))
            .collect();
        v.push(("walwriter".into(), false));
        v.push(("checkpointer".into(), false));
        v.push(("kworker".into(), false));
        v.push(("jbd2".into(), false));
        v
    }
    fn locks(&self) -> usize {
        1 + RELATIONS as usize
    }
    fn conds(&self) -> usize {
        3
    }
    fn signaller(&self, c: CondId) -> Option<Pid> {
        match c {
            COMMIT_DONE | TXN_UNLOCKED => Some(self.jbd2_pid()),
            _ => None,
        }
    }
    fn wal_ranges(&self) -> Vec<(u64, u64)> {
        vec![(LOG_AT, WAL_BYTES)]
    }
    fn backing_bytes(&self) -> u64 {
        LOG_AT + WAL_BYTES
    }
    fn log_disk_at(&self) -> Option<u64> {
        Some(LOG_AT)
    }
    fn io_done(&mut self, _rt: &mut Rt, id: ReqId) {
        self.cache.io_done(id);
    }

    fn step(&mut self, rt: &mut Rt, me: Pid) -> Step {
        let b = self.p.backends;
        if me == b + 3 {
            let mut io = std::mem::take(&mut self.loc[me].io);
            let st = self.jbd2.step(rt, &mut self.cache, &mut io);
            self.loc[me].io = io;
            return st;
        }
        let mut io = std::mem::take(&mut self.loc[me].io);
        let pro = self.cache.prologue(rt, &mut io);
        self.loc[me].io = io;
        if let Some(st) = pro {
            return st;
        }
        if me < b {
            self.backend(rt, me)
        } else if me == b {
            self.walwriter(me)
        } else if me == b + 1 {
            self.checkpointer(rt, me)
        } else {
            self.kworker(rt, me)
        }
    }
}

impl Postgres {
    fn backend(&mut self, rt: &mut Rt, me: Pid) -> Step {
        loop {
            let pc = self.loc[me].pc;
            match pc {
                0 => {
                    self.loc[me].pc = 1;
                    return Step::Begin;
                }
                1 => {
                    self.loc[me].pc = 2;
                    return Step::Compute(self.p.txn_cpu);
                }
                2 => {
                    for _ in 0..self.p.pages_per_txn {
                        let pg = Self::pick_page(rt);
                        // A miss needs a victim buffer; a dirty one is
                        // written into the page cache first (below).
                        let dirty_frac = self.pool_dirty.len() as f64 / self.p.pool_pages as f64;
                        if rt.chance(self.p.p_miss) && rt.chance(dirty_frac) {
                            if let Some(v) = self.pool_dirty.take_random(rt) {
                                self.loc[me].victims.push(v);
                            }
                        }
                        self.pool_dirty.insert(pg);
                    }
                    self.loc[me].pc = 20;
                }
                20 => {
                    // write() of a dirty victim: the file's inode mutex
                    // (i_mutex, held by generic_file_aio_write), then the page
                    // itself, waiting while it is under writeback
                    // (lock_page / wait_on_page_writeback).
                    if let Some(v) = self.loc[me].next_of(|l| &l.victims, 21, 23) {
                        return Step::Lock(1 + rel_of(v) as usize);
                    }
                }
                21 => {
                    let v = *self.loc[me].victims.last().expect("victim");
                    if let Some(r) = self.cache.under_writeback(v) {
                        if rt.in_flight(r) {
                            return Step::WaitIo(r);
                        }
                    }
                    self.cache.dirty(v, rt.now);
                    self.loc[me].victims.pop();
                    self.loc[me].pc = 20;
                    return Step::Unlock(1 + rel_of(v) as usize);
                }
                23 => {
                    if rt.chance(self.p.p_extend) {
                        let rel = rt.below(RELATIONS);
                        let l = &mut self.loc[me];
                        l.rel = rel;
                        l.meta =
                            rel * (META_BLOCKS / RELATIONS) + rt.below(META_BLOCKS / RELATIONS);
                        l.newpage = DATA_PAGES - 1 - rt.below(DATA_PAGES / 16);
                        l.pc = 3;
                        return Step::Lock(1 + rel as usize);
                    }
                    self.loc[me].pc = 6;
                }
                3 => {
                    // Relation extension under the inode mutex: a new page
                    // (ordered data) and a metadata block in the journal.
                    let (m, pg) = (self.loc[me].meta, self.loc[me].newpage);
                    if let Some(w) = self.jbd2.join(rt, m, &[pg]) {
                        return w;
                    }
                    self.cache.dirty(pg, rt.now);
                    self.loc[me].pc = 6;
                    return Step::Unlock(1 + self.loc[me].rel as usize);
                }
                6 => {
                    self.insert_lsn += self.p.wal_per_txn;
                    self.wal_since_ckpt += self.p.wal_per_txn;
                    self.loc[me].lsn = self.insert_lsn;
                    self.loc[me].pc = 7;
                    return Step::Lock(WAL_LOCK);
                }
                7 => match self.wal_write() {
                    Some((offset, len)) if self.flushed_lsn < self.loc[me].lsn => {
                        self.loc[me].target = self.insert_lsn;
                        self.loc[me].pc = 8;
                        return Step::Write {
                            offset,
                            len,
                            sync: true,
                            wait: true,
                            fua: false,
                        };
                    }
                    _ => {
                        self.loc[me].pc = 10;
                        return Step::Unlock(WAL_LOCK);
                    }
                },
                8 => {
                    self.loc[me].pc = 9;
                    return Step::Flush;
                }
                9 => {
                    self.flushed_lsn = self.flushed_lsn.max(self.loc[me].target);
                    self.loc[me].pc = 10;
                    return Step::Unlock(WAL_LOCK);
                }
                10 => {
                    self.loc[me].pc = 0;
                    return Step::End(None);
                }
                _ => unreachable!("backend pc {pc}"),
            }
        }
    }

    fn walwriter(&mut self, me: Pid) -> Step {
        match self.loc[me].pc {
            0 => {
                self.loc[me].pc = 1;
                Step::Compute(200 * MS)
            }
            1 => {
                self.loc[me].pc = 2;
                Step::Lock(WAL_LOCK)
            }
            2 => match self.wal_write() {
                Some((offset, len)) => {
                    self.loc[me].target = self.insert_lsn;
                    self.loc[me].pc = 3;
                    Step::Write {
                        offset,
                        len,
                        sync: true,
                        wait: true,
                        fua: false,
                    }
                }
                None => {
                    self.loc[me].pc = 0;
                    Step::Unlock(WAL_LOCK)
                }
            },
            3 => {
                self.loc[me].pc = 4;
                Step::Flush
            }
            _ => {
                self.flushed_lsn = self.flushed_lsn.max(self.loc[me].target);
                self.loc[me].pc = 0;
                Step::Unlock(WAL_LOCK)
            }
        }
    }

    fn checkpointer(&mut self, rt: &mut Rt, me: Pid) -> Step {
        loop {
            match self.loc[me].pc {
                0 => {
                    self.loc[me].pc = 1;
                    return Step::Compute(SEC);
                }
                1 => {
                    if self.wal_since_ckpt < self.p.ckpt_wal
                        && rt.now - self.last_ckpt < self.p.ckpt_timeout
                    {
                        self.loc[me].pc = 0;
                        continue;
                    }
                    self.wal_since_ckpt = 0;
                    self.last_ckpt = rt.now;
                    let mut pages: Vec<u64> = self.pool_dirty.drain();
                    pages.sort_unstable();
                    self.loc[me].pages = pages;
                    self.loc[me].pc = 2;
                }
                2 => {
                    // Dirty buffers into the page cache, 2000 per 100 ms
                    // (spread, like checkpoint_completion_target).
                    if self.loc[me].pages.is_empty() {
                        self.loc[me].pc = 3;
                        continue;
                    }
                    let n = self.loc[me].pages.len().min(2000);
                    let batch: Vec<u64> = self.loc[me].pages.drain(..n).collect();
                    for pg in batch {
                        self.cache.dirty(pg, rt.now);
                    }
                    return Step::Compute(100 * MS);
                }
                3 => {
                    // fsync of each data file in turn, holding its inode
                    // mutex while its dirty pages are written (synchronously,
                    // by the checkpointer, 64 KiB runs at most) and waited
                    // for: a model choice standing in for the i_mutex and
                    // i_data_sem waits of the paper's Table 2.
                    self.loc[me].rels = (0..RELATIONS).rev().collect();
                    self.loc[me].pc = 30;
                }
                30 => {
                    if let Some(r) = self.loc[me].next_of(|l| &l.rels, 31, 4) {
                        return Step::Lock(1 + r as usize);
                    }
                }
                31 => {
                    let r = *self.loc[me].rels.last().expect("relation");
                    let per = DATA_PAGES / RELATIONS;
                    let mut io = std::mem::take(&mut self.loc[me].io);
                    let pro = self
                        .cache
                        .fsync_range(rt, &mut io, r * per..(r + 1) * per, 8);
                    self.loc[me].io = io;
                    self.loc[me].pc = 32;
                    if let Some(st) = pro {
                        return st;
                    }
                }
                32 => {
                    let r = self.loc[me].rels.pop().expect("relation");
                    self.loc[me].pc = 30;
                    return Step::Unlock(1 + r as usize);
                }
                4 => {
                    self.loc[me].pc = 5;
                    return Step::Flush;
                }
                5 => {
                    // ...and the journal commit of the files' metadata (mtime).
                    if let Some(w) = self.jbd2.join(rt, 0, &[]) {
                        return w;
                    }
                    self.loc[me].target = self.jbd2.request();
                    self.loc[me].pc = 6;
                    return Step::Signal(COMMIT_REQ);
                }
                _ => {
                    if self.jbd2.committed(self.loc[me].target) {
                        self.loc[me].pc = 0;
                        continue;
                    }
                    return Step::Wait(COMMIT_DONE);
                }
            }
        }
    }

    /// Linux's flusher (see [`PageCache::flusher`]).
    fn kworker(&mut self, rt: &mut Rt, me: Pid) -> Step {
        let l = &mut self.loc[me];
        let mut io = std::mem::take(&mut l.io);
        let mut pc = l.pc;
        let st = self.cache.flusher(rt, &mut io, &mut pc);
        self.loc[me].io = io;
        self.loc[me].pc = pc;
        st
    }
}
