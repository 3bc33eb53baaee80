//! A Redis-like model (the admission paper's §7.3, Figure 9, Table 4).
//!
//! * **server** (critical, single-threaded): an event loop. Each iteration
//!   takes every queued request (YCSB clients, closed loop), computes them,
//!   appends the updates to the AOF and, with `appendfsync always`,
//!   fdatasyncs it before replying: a synchronous write of the AOF's tail
//!   pages, then, because the file grew, a wait for the journal commit that
//!   records the new size (`jbd2_log_wait_commit`), after joining the running
//!   transaction with the AOF's inode block.
//! * **clients**: YCSB workload A (50 % updates) or B (5 %), 1 KiB values,
//!   no think time; a request's latency runs from when it is queued to its reply.
//! * **bgsave** and **rewrite** children: periodically write a whole copy of
//!   the data set (a snapshot, an AOF rewrite) through the page cache, with
//!   block allocation in the running journal transaction (their pages become
//!   its *ordered data*), then fsync. ext4's `data=ordered` makes the next
//!   commit write those pages first, and the server's fdatasync waits for
//!   that commit: the dependency the paper found (§7.3).
//! * **kworker** and **jbd2** as in the PostgreSQL model.
//!
//! Layout: AOF 0..1 GiB (appended, wrapping), snapshot 1..1.5 GiB, rewritten
//! AOF 1.5..2 GiB, metadata, journal; one HDD.

use nvwc_core::ReqId;
use std::collections::VecDeque;

use super::fs::{Journal, JournalConds, PageCache, ProcIo};
use super::{CondId, Model, Pid, Rt, Step};
use crate::device::Nanos;

const SEC: Nanos = 1_000_000_000;
const MS: Nanos = 1_000_000;
const PAGE: u64 = 4096;
const AOF_PAGES: u64 = (1 << 30) / PAGE;
const DUMP_AT: u64 = 1 << 30;
const REWRITE_AT: u64 = (3 << 30) / 2;
const META_AT: u64 = 2 << 30;
const JOURNAL_AT: u64 = META_AT + (16 << 20);
const JOURNAL_BYTES: u64 = 128 << 20;
const BACKING: u64 = JOURNAL_AT + JOURNAL_BYTES;

/// Model parameters.
#[derive(Clone, Debug)]
pub struct RedisParams {
    /// YCSB clients (the paper: 40).
    pub clients: usize,
    /// Fraction of updates (workload A: 0.5, B: 0.05).
    pub update_ratio: f64,
    /// CPU per request (Redis serves about 100k simple requests/s per core).
    pub req_cpu: Nanos,
    /// AOF bytes per update (a 1 KiB value plus the command's framing).
    pub aof_record: u64,
    /// Data set: 0.5 M objects of 1 KiB (the paper), as written by a snapshot.
    pub dataset_bytes: u64,
    /// Children write their file at this rate (serialisation CPU bound).
    pub child_bytes_per_sec: u64,
    /// A snapshot starts every `bgsave_every`, an AOF rewrite every
    /// `rewrite_every` (offset by half a period).
    pub bgsave_every: Nanos,
    pub rewrite_every: Nanos,
}

impl Default for RedisParams {
    fn default() -> Self {
        RedisParams {
            clients: 40,
            update_ratio: 0.5,
            req_cpu: 10_000,
            aof_record: 1100,
            dataset_bytes: 512 << 20,
            child_bytes_per_sec: 400 << 20,
            bgsave_every: 20 * SEC,
            rewrite_every: 40 * SEC,
        }
    }
}

const COMMIT_DONE: CondId = JournalConds::FIRST.commit_done;
const COMMIT_REQ: CondId = JournalConds::FIRST.commit_req;
const TXN_UNLOCKED: CondId = JournalConds::FIRST.unlocked;
const ARRIVAL: CondId = 3;
/// Reply condition of client `i` is `REPLY + i`.
const REPLY: CondId = 4;
/// Inode blocks of the AOF, the snapshot and the rewritten AOF.
const AOF_INODE: u64 = 0;

#[derive(Default, Clone)]
struct Local {
    pc: u32,
    target: u64,
    pos: u64,
    io: ProcIo,
    batch: Vec<(usize, Nanos, bool)>,
}

/// The model; see the module docs.
pub struct Redis {
    p: RedisParams,
    loc: Vec<Local>,
    cache: PageCache,
    jbd2: Journal,
    queue: VecDeque<(usize, Nanos, bool)>,
    aof_len: u64,
    aof_synced: u64,
}

impl Redis {
    pub fn new(p: RedisParams) -> Self {
        let n = p.clients + 5;
        Redis {
            loc: vec![Local::default(); n],
            p,
            cache: PageCache::new(PAGE),
            jbd2: Journal::new(JournalConds::FIRST, JOURNAL_AT, JOURNAL_BYTES),
            queue: VecDeque::new(),
            aof_len: 0,
            aof_synced: 0,
        }
    }
    fn server(&self) -> Pid {
        self.p.clients
    }
}

impl Model for Redis {
    fn processes(&self) -> Vec<(String, bool)> {
        let mut v: Vec<(String, bool)> = (0..self.p.clients)
            .map(|i| (format!("client-{i}"), false))
            .collect();
        v.push(("server".into(), true));
        v.push(("bgsave".into(), false));
        v.push(("rewrite".into(), false));
        v.push(("kworker".into(), false));
        v.push(("jbd2".into(), false));
        v
    }
    fn locks(&self) -> usize {
        0
    }
    fn conds(&self) -> usize {
        REPLY + self.p.clients
    }
    fn signaller(&self, c: CondId) -> Option<Pid> {
        match c {
            COMMIT_DONE | TXN_UNLOCKED => Some(self.p.clients + 4),
            c if c >= REPLY => Some(self.server()),
            _ => None,
        }
    }
    fn wal_ranges(&self) -> Vec<(u64, u64)> {
        // The AOF is Redis's log.
        vec![(0, AOF_PAGES * PAGE)]
    }
    fn backing_bytes(&self) -> u64 {
        BACKING
    }
    fn io_done(&mut self, _rt: &mut Rt, id: ReqId) {
        self.cache.io_done(id);
    }

    fn step(&mut self, rt: &mut Rt, me: Pid) -> Step {
        let c = self.p.clients;
        let mut io = std::mem::take(&mut self.loc[me].io);
        let st = if me == c + 4 {
            Some(self.jbd2.step(rt, &mut self.cache, &mut io))
        } else {
            self.cache.prologue(rt, &mut io)
        };
        self.loc[me].io = io;
        if let Some(st) = st {
            return st;
        }
        if me < c {
            self.client(rt, me)
        } else if me == c {
            self.server_step(rt, me)
        } else if me == c + 1 {
            self.child(
                rt,
                me,
                DUMP_AT,
                self.p.bgsave_every,
                self.p.bgsave_every / 2,
                1,
            )
        } else if me == c + 2 {
            self.child(
                rt,
                me,
                REWRITE_AT,
                self.p.rewrite_every,
                self.p.rewrite_every * 3 / 4,
                2,
            )
        } else {
            // kworker: Linux's flusher.
            let mut io = std::mem::take(&mut self.loc[me].io);
            let mut pc = self.loc[me].pc;
            let st = self.cache.flusher(rt, &mut io, &mut pc);
            self.loc[me].io = io;
            self.loc[me].pc = pc;
            st
        }
    }
}

impl Redis {
    fn client(&mut self, rt: &mut Rt, me: Pid) -> Step {
        match self.loc[me].pc {
            0 => {
                let upd = rt.chance(self.p.update_ratio);
                self.queue.push_back((me, rt.now, upd));
                self.loc[me].pc = 1;
                Step::Signal(ARRIVAL)
            }
            _ => {
                // Woken by the server's reply (it recorded the latency).
                self.loc[me].pc = 0;
                Step::Wait(REPLY + me)
            }
        }
    }

    fn server_step(&mut self, rt: &mut Rt, me: Pid) -> Step {
        loop {
            match self.loc[me].pc {
                0 => {
                    if self.queue.is_empty() {
                        return Step::Wait(ARRIVAL);
                    }
                    let n = self.queue.len().min(64);
                    let batch: Vec<_> = self.queue.drain(..n).collect();
                    let cpu = self.p.req_cpu * batch.len() as u64;
                    self.loc[me].batch = batch;
                    self.loc[me].pc = 1;
                    return Step::Compute(cpu);
                }
                1 => {
                    let updates = self.loc[me].batch.iter().filter(|b| b.2).count() as u64;
                    if updates == 0 {
                        self.loc[me].pc = 5;
                        continue;
                    }
                    // Append to the AOF (page cache), then fdatasync: the
                    // tail pages, written and waited for by the server.
                    self.aof_len += updates * self.p.aof_record;
                    let first = self.aof_synced / PAGE;
                    let last = self.aof_len.div_ceil(PAGE);
                    self.aof_synced = self.aof_len;
                    let start = first % AOF_PAGES;
                    let n = (last - first).min(AOF_PAGES - start);
                    self.loc[me].pc = 2;
                    return Step::Write {
                        offset: start * PAGE,
                        len: n * PAGE,
                        sync: true,
                        wait: true,
                        fua: false,
                    };
                }
                2 => {
                    // The file grew: its inode (size) joins the running
                    // transaction, and fdatasync waits for the commit.
                    if let Some(w) = self.jbd2.join(rt, AOF_INODE, &[]) {
                        return w;
                    }
                    self.loc[me].target = self.jbd2.request();
                    self.loc[me].pc = 3;
                    return Step::Signal(COMMIT_REQ);
                }
                3 => {
                    if !self.jbd2.committed(self.loc[me].target) {
                        return Step::Wait(COMMIT_DONE);
                    }
                    self.loc[me].pc = 4;
                    return Step::Flush;
                }
                4 => {
                    self.loc[me].pc = 5;
                }
                5 => {
                    // Reply to each request of the batch.
                    let Some((client, t0, _)) = self.loc[me].batch.pop() else {
                        self.loc[me].pc = 0;
                        continue;
                    };
                    self.loc[me].io.push(Step::Signal(REPLY + client));
                    return Step::End(Some(t0));
                }
                _ => unreachable!(),
            }
        }
    }

    /// A child writing a `dataset_bytes` file at `at`, every `every` from
    /// `first`: 1 MiB per step through the page cache (each MiB allocates
    /// blocks: a metadata block and ordered data in the running transaction),
    /// then fsync (its remaining dirty pages, synchronously) and a commit.
    fn child(
        &mut self,
        rt: &mut Rt,
        me: Pid,
        at: u64,
        every: Nanos,
        first: Nanos,
        inode: u64,
    ) -> Step {
        const CHUNK: u64 = 1 << 20;
        loop {
            match self.loc[me].pc {
                0 => {
                    self.loc[me].pc = 1;
                    let wait = if rt.now < first {
                        first - rt.now
                    } else {
                        every - (rt.now - first) % every
                    };
                    return Step::Compute(wait);
                }
                1 => {
                    self.loc[me].pos = 0;
                    self.loc[me].pc = 2;
                }
                2 => {
                    let pos = self.loc[me].pos;
                    if pos >= self.p.dataset_bytes {
                        self.loc[me].pc = 3;
                        continue;
                    }
                    let pages: Vec<u64> =
                        (0..CHUNK / PAGE).map(|i| (at + pos) / PAGE + i).collect();
                    if let Some(w) = self.jbd2.join(rt, inode * 1000 + pos / (8 * CHUNK), &pages) {
                        return w;
                    }
                    for &pg in &pages {
                        self.cache.dirty(pg, rt.now);
                    }
                    self.loc[me].pos += CHUNK;
                    return Step::Compute(CHUNK * SEC / self.p.child_bytes_per_sec);
                }
                3 => {
                    // fsync: whatever of the file is still dirty.
                    let lo = at / PAGE;
                    let hi = (at + self.p.dataset_bytes) / PAGE;
                    let mut io = std::mem::take(&mut self.loc[me].io);
                    let pro = self.cache.fsync_range(rt, &mut io, lo..hi, 256);
                    self.loc[me].io = io;
                    self.loc[me].pc = 4;
                    if let Some(st) = pro {
                        return st;
                    }
                }
                4 => {
                    self.loc[me].target = self.jbd2.request();
                    self.loc[me].pc = 5;
                    return Step::Signal(COMMIT_REQ);
                }
                _ => {
                    if !self.jbd2.committed(self.loc[me].target) {
                        return Step::Wait(COMMIT_DONE);
                    }
                    self.loc[me].pc = 0;
                    let _ = MS;
                }
            }
        }
    }
}
