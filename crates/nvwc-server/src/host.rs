//! The engine host: drives one sans-IO `Engine` from whatever thread has
//! work for it.
//!
//! The engine sits in a `Mutex` together with the table of waiting requests.
//! A connection's task locks it, hands the request to the engine and pumps
//! the engine's outputs itself: cache-device reads and plain writes go to the
//! page cache inline, under the lock, so a cache hit completes on the
//! connection's own thread with no thread hop and no channel; its reply is
//! returned directly. Syncs, FUA writes and every backing-store command go to
//! a small worker pool per device; a worker that finishes a command locks the
//! engine, completes the command and pumps in turn. An upstream NBD backing
//! store's commands are sent from tasks on the runtime instead, completed
//! the same way when their replies come (`Host::spawn_upstream`). An upstream NBD backing
//! store's commands are sent from tasks on the runtime instead, completed
//! the same way when their replies come (`Host::spawn_upstream`). A timer thread sleeps on
//! a condition variable until the engine's next deadline (it is woken when a
//! pump leaves an earlier deadline than the one it sleeps for).
//!
//! Ordering and durability are the engine's: whichever thread pumps, every
//! command the engine emits is started (inline, or queued to its device's
//! pool) before the engine sees its completion, and every reply is delivered
//! only once the engine released it. The crash story is therefore the
//! engine's (`docs/ON-DISK-FORMAT.md`): nothing here acknowledges anything on
//! its own.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use nvwc_core::pump::{pump, Driver};
use nvwc_core::*;
use tokio::sync::oneshot;

use crate::device::{Device, UpFuture};
use crate::log::log;

/// Largest run of adjacent cache writes (or reads) merged into one call.
const MAX_MERGE: u64 = 1 << 20;

/// Mutable state behind the host's lock.
struct Core {
    eng: Engine<Bytes>,
    next_id: ReqId,
    /// Requests whose reply did not come out of their own pump.
    waiting: HashMap<ReqId, oneshot::Sender<Reply<Bytes>>>,
    drains: Vec<oneshot::Sender<Stats>>,
    /// A finished drain leaves the engine draining (`nvwc detach`: the server
    /// stops next, so later writes go straight on to the backing store).
    keep_draining: bool,
    shutdown: Option<mpsc::Sender<Stats>>,
    /// The deadline the timer thread sleeps for (`None`: it sleeps a second).
    timer_at: Option<u64>,
    stopped: bool,
    /// Set while a request's own pump runs (`Host::call`): the first command
    /// it emits that `Host::caller_may_run` allows at this level is kept in
    /// `caller_cmd` for that request's thread to run once it has let go of
    /// the lock, instead of going to a pool.
    caller_runs: CallerRuns,
    caller_cmd: Option<Queued>,
    /// Cache reads made, each a run of adjacent reads (`Host::read_batch`).
    cache_read_calls: u64,
}

/// What a request's own pump may keep back for its thread to run
/// (`Host::caller_may_run`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum CallerRuns {
    No,
    /// Plain writes of a local backing file.
    Writes,
    /// Those, and syncs (the request waits for durability).
    Syncs,
}

/// One engine with its devices' worker pools and its timer.
pub struct Host {
    /// Itself, for the upstream commands it spawns (`Host::pump`).
    me: std::sync::Weak<Host>,
    core: Mutex<Core>,
    timer: Condvar,
    cache_dev: Arc<Device>,
    backing_dev: Arc<Device>,
    cache_q: mpsc::Sender<Queued>,
    backing_q: mpsc::Sender<Queued>,
    t0: Instant,
    /// Export name, for logs.
    name: String,
    /// `background_error` lines: one per second at most.
    bg_log: crate::log::Throttle,
    /// The engine takes reply events (`Host::replies_sending`): ordered
    /// write-back, whose graph they keep from being a chain.
    reply_events: bool,
}

impl Host {
    /// Start the host: `cache_threads` and `backing_threads` workers, and the timer.
    pub fn start(
        mut eng: Engine<Bytes>,
        cache_dev: Arc<Device>,
        backing_dev: Arc<Device>,
        cache_threads: usize,
        backing_threads: usize,
        name: &str,
    ) -> Arc<Host> {
        let (cache_q, cache_rx) = mpsc::channel();
        let (backing_q, backing_rx) = mpsc::channel();
        let reply_events = eng.config().write_policy == WritePolicyKind::Ordered;
        eng.set_reply_events(reply_events);
        let host = Arc::new_cyclic(|me| Host {
            me: me.clone(),
            core: Mutex::new(Core {
                eng,
                next_id: 1,
                waiting: HashMap::new(),
                drains: Vec::new(),
                keep_draining: false,
                shutdown: None,
                timer_at: None,
                stopped: false,
                caller_runs: CallerRuns::No,
                caller_cmd: None,
                cache_read_calls: 0,
            }),
            timer: Condvar::new(),
            cache_dev: cache_dev.clone(),
            backing_dev: backing_dev.clone(),
            cache_q,
            backing_q,
            t0: Instant::now(),
            name: name.to_string(),
            bg_log: crate::log::Throttle::new(),
            reply_events,
        });
        spawn_pool(&host, cache_dev, cache_rx, cache_threads);
        spawn_pool(&host, backing_dev, backing_rx, backing_threads);
        {
            let mut c = host.lock();
            let now = host.now();
            c.eng.handle_timeout(now);
            host.pump(&mut c, 0);
        }
        let h = host.clone();
        std::thread::Builder::new()
            .name("nvwc-timer".into())
            .spawn(move || h.timer_loop())
            .expect("spawn timer thread");
        host
    }

    fn now(&self) -> u64 {
        self.t0.elapsed().as_nanos() as u64
    }

    fn lock(&self) -> MutexGuard<'_, Core> {
        // A panic under the lock is a bug in the engine (its asserts); the
        // state may be inconsistent, so do not go on serving from it.
        self.core
            .lock()
            .expect("engine lock poisoned by an engine panic")
    }

    /// Its two devices, held weakly: they are closed (and the cache file's
    /// lock released) once the host and its threads are gone.
    pub fn devices(&self) -> [std::sync::Weak<Device>; 2] {
        [
            Arc::downgrade(&self.cache_dev),
            Arc::downgrade(&self.backing_dev),
        ]
    }

    /// Replies may reach clients from now on: a connection's reply writer
    /// calls this before it sends the replies it has taken, each time
    /// (`Export::replies_sending`). The engine then counts every write whose
    /// data is in the cache as complete for the writes issued after this
    /// call (`Engine::set_reply_events`); requests read before it were sent
    /// before their client saw any of these replies.
    pub fn replies_sending(&self) {
        if !self.reply_events {
            return;
        }
        let mut c = self.lock();
        let now = self.now();
        c.eng.handle_replies_sending(now);
        self.pump(&mut c, 0);
    }

    /// Submit a request and wait for its reply.
    pub async fn call(&self, op: ReqOp<Bytes>, tag: Tag) -> Result<Reply<Bytes>, ReqError> {
        // Degraded (the cache device failed, see `fault.rs`): read-only.
        if self.cache_dev.fault.failed() && !matches!(op, ReqOp::Read { .. }) {
            return Err(ReqError::Io);
        }
        let (pending, id, mut next, level) = {
            let mut c = self.lock();
            let id = c.next_id;
            c.next_id += 1;
            let now = self.now();
            // Only a request that waits for durability runs a sync itself: a
            // plain write whose pump starts a background commit must not hold
            // its connection for that commit's sync.
            let level = match &op {
                ReqOp::Flush
                | ReqOp::Write { fua: true, .. }
                | ReqOp::WriteZeroes { fua: true, .. } => CallerRuns::Syncs,
                _ => CallerRuns::Writes,
            };
            c.eng.handle_request(now, Request { id, op, tag });
            c.caller_runs = level;
            let p = self.reply_or_wait(&mut c, id);
            c.caller_runs = CallerRuns::No;
            let mut next = c.caller_cmd.take();
            if matches!(p, Pending::Ready(_)) {
                // Answered already: the command is someone else's; a pool runs it.
                self.to_pool(next.take());
            }
            (p, id, next, level)
        };
        // Caller runs: the command this request's pump emitted and waits
        // for (a FLUSH's commit sync, a write-through write to a local
        // backing file) runs here, on the connection's thread, and its
        // completion is handled here too: no hand-off to a pool thread and
        // back, which at queue depth 1 costs more than the command itself.
        // The engine saw the command issued under the lock, as for a pool,
        // so the order and the crash story are unchanged.
        while let Some((cmd, issued)) = next.take() {
            let res = self
                .device(cmd.dev)
                .1
                .execute_issued(&cmd.op, cmd.group, issued);
            let mut c = self.lock();
            let now = self.now();
            c.eng.handle_completion(now, cmd.id, res);
            c.caller_runs = level;
            let own = self.pump(&mut c, id);
            c.caller_runs = CallerRuns::No;
            next = c.caller_cmd.take();
            if let Some(r) = own {
                c.waiting.remove(&id);
                // Not this request's any more: a pool runs it.
                self.to_pool(next.take());
                return Ok(r);
            }
        }
        pending.get().await
    }

    /// A write of `len` bytes at `offset` whose payload `recv` puts straight
    /// into the mapped cache file (`Engine::handle_direct_write`; `recv`
    /// fills the slice it is given with the payload's next bytes). `None`,
    /// with nothing received, when the cache file is not mapped, the export
    /// is degraded, or the engine cannot take the write directly now.
    ///
    /// Each run of adjacent slots is received through the fault layer
    /// (`Layer::put_write`): injected faults apply as to any cache write (a
    /// torn one receives a prefix), and in host-crash mode the mapping is
    /// private and the layer records what was received as not durable yet.
    ///
    /// Crash story: the engine chose the slots exactly as for a buffered
    /// write, and the bytes land as that write's cache writes would (a
    /// `kill -9` mid-copy leaves whole pages, see `mapped.rs`), so what
    /// survives is what survives a buffered write's cache writes. A failed
    /// copy fails its parts: `EFAULT` (the file's pages) also degrades the
    /// export, like any failed cache write.
    pub fn call_direct(
        &self,
        offset: u64,
        len: u64,
        fua: bool,
        tag: Tag,
        recv: &mut dyn FnMut(&mut [u8]) -> std::io::Result<()>,
    ) -> Option<Pending> {
        let dev = &self.cache_dev;
        let map = dev.map.as_ref()?;
        if dev.fault.failed() {
            return None;
        }
        let mut c = self.lock();
        let id = c.next_id;
        let now = self.now();
        let parts = c.eng.handle_direct_write(now, id, offset, len, fua, tag)?;
        c.next_id += 1;
        // Payload order (the socket's), each run adjacent on the device as one copy.
        let mut failed = false;
        for run in adjacent_runs(&parts, |p| (p.offset, p.len)) {
            let (start, end) = (
                parts[run.start].offset,
                parts[run.end - 1].offset + parts[run.end - 1].len,
            );
            let res = if failed {
                Err(IoError::Eio)
            } else {
                // What was received, part by part (host-crash mode's record).
                let received = |n: usize| {
                    let mut out = Vec::new();
                    for p in &parts[run.clone()] {
                        let k = p.len.min((start + n as u64).saturating_sub(p.offset)) as usize;
                        if k == 0 {
                            break;
                        }
                        let mut b = vec![0u8; k];
                        map.read(p.offset, &mut b)?;
                        out.push((p.offset, Bytes::from(b)));
                    }
                    Ok(out)
                };
                let r = dev.fault.put_write(
                    start,
                    (end - start) as usize,
                    &**dev,
                    &mut |n| map.recv_into(start, n, &mut *recv),
                    crate::fault::Written::After(&received),
                );
                r.map(|()| None).map_err(|e| {
                    failed = true;
                    if let crate::fault::PutError::Put(e) = e {
                        if e.raw_os_error() == Some(libc::EFAULT) {
                            // The cache file's pages could not be written.
                            dev.fault.record_error(&IoError::Eio);
                        }
                    }
                    IoError::Eio
                })
            };
            for p in &parts[run] {
                c.eng.handle_completion(now, p.io, res.clone());
            }
        }
        Some(self.reply_or_wait(&mut c, id))
    }

    /// Pump after request `id` went in: its reply if that came out, else a
    /// receiver for it.
    fn reply_or_wait(&self, c: &mut Core, id: ReqId) -> Pending {
        if let Some(r) = self.pump(c, id) {
            return Pending::Ready(r);
        }
        let (tx, rx) = oneshot::channel();
        c.waiting.insert(id, tx);
        Pending::Wait(rx)
    }

    /// The cache device failed: the export serves reads only.
    pub fn degraded(&self) -> bool {
        self.cache_dev.fault.failed()
    }

    /// Counters and policy counters.
    pub fn status(&self) -> (Stats, Vec<(&'static str, u64)>) {
        let c = self.lock();
        let mut pc = c.eng.policy_counters();
        pc.push(("cache_degraded", u64::from(self.cache_dev.fault.failed())));
        pc.push(("cache_device_errors", self.cache_dev.fault.errors()));
        // Which path cache writes took: copied into the mapped cache file
        // (each a cache-slot or metadata write), or received into it
        // straight from a client's socket (direct writes, one per run of
        // adjacent slots).
        let (copied, received) = self.cache_dev.map.as_ref().map_or((0, 0), |m| m.counts());
        pc.push(("cache_mapped_writes", copied));
        pc.push(("cache_direct_recvs", received));
        // Cache reads made (`Host::read_batch`): one per run of adjacent
        // slots read together, against the engine's `cache_reads` commands.
        pc.push(("cache_read_calls", c.cache_read_calls));
        (c.eng.stats(), pc)
    }

    /// Write back everything dirty; resolves when nothing is dirty. `keep`:
    /// stay in drain mode afterwards (detach); otherwise the write policy's
    /// usual destaging resumes (flush).
    pub async fn drain(&self, keep: bool) -> Option<Stats> {
        let rx = {
            let mut c = self.lock();
            c.keep_draining |= keep;
            let now = self.now();
            c.eng.start_drain(now);
            let (tx, rx) = oneshot::channel();
            c.drains.push(tx);
            self.pump(&mut c, 0);
            rx
        };
        rx.await.ok()
    }

    /// Stop the engine (it finishes what is in flight and commits its
    /// metadata); returns the final counters, or `None` after `timeout`.
    pub fn shutdown(&self, timeout: Duration) -> Option<Stats> {
        let (tx, rx) = mpsc::channel();
        {
            let mut c = self.lock();
            let now = self.now();
            c.eng.start_shutdown(now);
            c.shutdown = Some(tx);
            self.pump(&mut c, 0);
        }
        self.timer.notify_all();
        let r = rx.recv_timeout(timeout).ok();
        self.lock().stopped = true;
        self.timer.notify_all();
        if r.is_some() {
            // The engine is idle: clear a redo log that still holds the last
            // checkpoint group (`Redo::settle`), so that nothing replays it
            // over writes made to the backing store after this stop (with
            // the cache detached, or by another tool).
            if let Err(err) = self.backing_dev.settle_redo() {
                log!(
                    error,
                    "redo_settle_failed",
                    error = err.to_string(),
                    action = "the backing store's redo log still holds the last checkpoint group; run `nvwc recover` on it before writing to it without nvwc"
                );
            }
        }
        r
    }

    /// Run the engine's outputs until it has nothing more to say (the one
    /// pump, `nvwc_core::pump`, through [`Pumped`]). Returns the reply to
    /// request `mine` if it came out (0: none is wanted).
    fn pump(&self, c: &mut Core, mine: ReqId) -> Option<Reply<Bytes>> {
        let mut p = Pumped {
            host: self,
            c: &mut *c,
            mine,
            own: None,
            writes: Vec::new(),
            reads: Vec::new(),
            timer_checked: false,
        };
        pump(&mut p);
        let own = p.own;
        if !c.drains.is_empty() && c.eng.dirty_versions() == 0 && c.eng.is_idle() {
            if !c.keep_draining {
                c.eng.end_drain();
            }
            let st = c.eng.stats();
            for d in c.drains.drain(..) {
                let _ = d.send(st.clone());
            }
        }
        if c.shutdown.is_some() && c.eng.is_idle() {
            let _ = c.shutdown.take().expect("checked").send(c.eng.stats());
        }
        if let Some(t) = c.eng.poll_timeout() {
            if !matches!(c.timer_at, Some(at) if at <= t) {
                self.timer.notify_one();
            }
        }
        own
    }

    /// Write a batch of plain cache writes, all outstanding at once (so in
    /// any order): sorted by offset, each run of adjacent ones as one call,
    /// then complete each with its run's result.
    fn write_batch(&self, c: &mut Core, writes: &mut Vec<IoCmd<Bytes>>) {
        if writes.is_empty() {
            return;
        }
        let span = |cmd: &IoCmd<Bytes>| match &cmd.op {
            IoOp::Write { offset, data, .. } => (*offset, data.len() as u64),
            _ => unreachable!("only plain writes are batched"),
        };
        writes.sort_by_key(|w| span(w).0);
        for run in adjacent_runs(writes, span) {
            let res = if run.len() == 1 {
                self.cache_dev.execute(&writes[run.start].op, None)
            } else {
                let parts: Vec<&Bytes> = writes[run.clone()]
                    .iter()
                    .map(|w| match &w.op {
                        IoOp::Write { data, .. } => data,
                        _ => unreachable!("only plain writes are batched"),
                    })
                    .collect();
                self.cache_dev
                    .write_parts(span(&writes[run.start]).0, &parts)
            };
            let now = self.now();
            for w in &writes[run] {
                c.eng.handle_completion(now, w.id, res.clone());
            }
        }
        writes.clear();
    }

    /// Read a batch of cache reads, all outstanding at once (so in any
    /// order): sorted by offset, each run of adjacent ones as one `pread`
    /// into one buffer, each read completed with its slice of it (or with
    /// the run's error). A destage plan reads its copies from neighbouring
    /// slots (blocks live in their home slots: `Engine::alloc_slot`), one
    /// system call and one buffer per run instead of one per block.
    fn read_batch(&self, c: &mut Core, reads: &mut Vec<IoCmd<Bytes>>) {
        if reads.is_empty() {
            return;
        }
        let span = |cmd: &IoCmd<Bytes>| match &cmd.op {
            IoOp::Read { offset, len } => (*offset, u64::from(*len)),
            _ => unreachable!("only reads are batched"),
        };
        reads.sort_by_key(|r| span(r).0);
        for run in adjacent_runs(reads, span) {
            c.cache_read_calls += 1;
            let now;
            if run.len() == 1 {
                let res = self.cache_dev.execute(&reads[run.start].op, None);
                now = self.now();
                c.eng.handle_completion(now, reads[run.start].id, res);
                continue;
            }
            let (start, _) = span(&reads[run.start]);
            let (last, last_len) = span(&reads[run.end - 1]);
            let total = last + last_len - start;
            let op = IoOp::Read {
                offset: start,
                len: u32::try_from(total).expect("a run is under MAX_MERGE"),
            };
            let res = self.cache_dev.execute(&op, None);
            now = self.now();
            for r in &reads[run] {
                let (at, len) = span(r);
                let part = match &res {
                    Ok(Some(buf)) if buf.len() as u64 == total => {
                        let lo = (at - start) as usize;
                        Ok(Some(buf.slice(lo..lo + len as usize)))
                    }
                    Ok(_) => Err(IoError::Eio),
                    Err(e) => Err(*e),
                };
                c.eng.handle_completion(now, r.id, part);
            }
        }
        reads.clear();
    }

    fn timer_loop(&self) {
        let mut c = self.lock();
        let mut just_handled = false;
        loop {
            if c.stopped {
                return;
            }
            let now = self.now();
            let wait = match c.eng.poll_timeout() {
                Some(t) if t <= now && !just_handled => {
                    c.eng.handle_timeout(now);
                    self.pump(&mut c, 0);
                    just_handled = true;
                    continue;
                }
                Some(t) if t <= now => {
                    // Still due right after handling it: the engine waits for
                    // a completion (whose pump handles the timeout again).
                    // Look again shortly, with the lock released.
                    just_handled = false;
                    c.timer_at = Some(t);
                    Duration::from_micros(200)
                }
                Some(t) => {
                    just_handled = false;
                    c.timer_at = Some(t);
                    Duration::from_nanos(t - now)
                }
                None => {
                    c.timer_at = None;
                    Duration::from_secs(1)
                }
            };
            c = self
                .timer
                .wait_timeout(c, wait)
                .expect("engine lock poisoned by an engine panic")
                .0;
        }
    }

    /// May a request's thread run `cmd` itself (`Host::call`)? Commands that
    /// take the time of one system call: a plain write of a local backing
    /// file (a write-through write, a bypass) for any request, and a cache
    /// sync or a local backing file's sync only for a request that waits
    /// for durability (FLUSH, FUA). Never an upstream's (a network round
    /// trip would hold the connection's runtime thread), nor part of an
    /// atomic group (the redo log's own sequence).
    fn caller_may_run(&self, level: CallerRuns, cmd: &IoCmd<Bytes>) -> bool {
        if level == CallerRuns::No || cmd.group.is_some() {
            return false;
        }
        let syncs = level == CallerRuns::Syncs;
        match cmd.dev {
            // A FUA write to the cache is a commit's: a checkpoint's
            // record, or an inline log record (its FLUSH's one sync).
            Dev::Cache => syncs && matches!(cmd.op, IoOp::Flush | IoOp::Write { fua: true, .. }),
            Dev::Backing => {
                self.backing_dev.is_file()
                    && (matches!(cmd.op, IoOp::Write { fua: false, .. })
                        || syncs && matches!(cmd.op, IoOp::Flush | IoOp::Write { .. }))
            }
        }
    }

    /// A device's worker-pool queue and the device.
    fn device(&self, dev: Dev) -> (&mpsc::Sender<Queued>, &Arc<Device>) {
        match dev {
            Dev::Cache => (&self.cache_q, &self.cache_dev),
            Dev::Backing => (&self.backing_q, &self.backing_dev),
        }
    }

    /// Queue a command the caller will not run on its device's pool.
    fn to_pool(&self, q: Option<Queued>) {
        if let Some(q) = q {
            let pool = self.device(q.0.dev).0;
            pool.send(q).expect("device pool is gone");
        }
    }

    /// Run an upstream command's future on `rt`; its result completes
    /// command `id` like a pool worker's would (errors counted by the
    /// device's fault layer, as `Layer::run` counts them).
    fn spawn_upstream(&self, rt: tokio::runtime::Handle, fut: UpFuture, id: IoId) {
        let me = self.me.clone();
        rt.spawn(async move {
            let res = fut.await;
            if let Some(h) = me.upgrade() {
                if let Err(e) = &res {
                    h.backing_dev.fault.record_error(e);
                }
                h.complete(id, res);
            }
        });
    }

    fn complete(&self, id: IoId, res: IoResult<Bytes>) {
        let mut c = self.lock();
        let now = self.now();
        c.eng.handle_completion(now, id, res);
        self.pump(&mut c, 0);
    }
}

/// The host as the engine's pump sees it (`Host::pump`): cache-device
/// reads, checksums and plain writes run inline (the writes batched),
/// everything else goes to the calling thread, an upstream's runtime or a
/// device's pool; replies go to their waiters.
struct Pumped<'a> {
    host: &'a Host,
    c: &'a mut Core,
    /// The request whose own pump this is (0: none), and its reply.
    mine: ReqId,
    own: Option<Reply<Bytes>>,
    /// Plain cache writes held back, to write adjacent slots with one call.
    writes: Vec<IoCmd<Bytes>>,
    /// Cache reads held back, to read adjacent slots with one call. At most
    /// one of `writes` and `reads` holds commands: a command of the other
    /// kind (or any other command) runs the held ones first, so reads and
    /// writes run in the order the engine issued them.
    reads: Vec<IoCmd<Bytes>>,
    /// Whether the one timeout check of this pump was made.
    timer_checked: bool,
}

impl Driver<Bytes> for Pumped<'_> {
    fn engine(&mut self) -> &mut Engine<Bytes> {
        &mut self.c.eng
    }

    fn command(&mut self, cmd: IoCmd<Bytes>) {
        let h = self.host;
        // Cache-device reads, checksums and plain writes go to the page
        // cache: done here, inline. Syncs, FUA writes and everything for
        // the backing store run on the pools.
        let inline = cmd.dev == Dev::Cache
            && cmd.group.is_none()
            && matches!(
                cmd.op,
                IoOp::Read { .. } | IoOp::Write { fua: false, .. } | IoOp::Checksum { .. }
            );
        if inline && matches!(cmd.op, IoOp::Write { .. }) {
            // Collected, to write adjacent slots with one call.
            h.read_batch(self.c, &mut self.reads);
            self.writes.push(cmd);
            return;
        }
        // Anything else is started only after the writes the engine
        // emitted before it completed (the order the engine chose).
        h.write_batch(self.c, &mut self.writes);
        if inline && matches!(cmd.op, IoOp::Read { .. }) {
            // Collected, to read adjacent slots (a destage plan's copies)
            // with one call.
            self.reads.push(cmd);
            return;
        }
        h.read_batch(self.c, &mut self.reads);
        if inline {
            let res = h.cache_dev.execute(&cmd.op, None);
            let now = h.now();
            self.c.eng.handle_completion(now, cmd.id, res);
            return;
        }
        let (q, dev) = h.device(cmd.dev);
        // Host-crash mode: a FLUSH (or group end) covers the writes
        // completed before the engine issued it, which is now.
        let issued = matches!(cmd.op, IoOp::Flush | IoOp::GroupEnd { .. })
            .then(|| dev.fault.issue_stamp())
            .flatten();
        if self.c.caller_cmd.is_none() && h.caller_may_run(self.c.caller_runs, &cmd) {
            // The requesting thread runs it (`Host::call`).
            self.c.caller_cmd = Some((cmd, issued));
            return;
        }
        if let Some((rt, fut)) = dev.upstream_async(&cmd.op, cmd.group) {
            // An upstream's request: sent from a task on its runtime,
            // completed there when the reply comes.
            h.spawn_upstream(rt, fut, cmd.id);
            return;
        }
        // The pools live as long as the host; a send cannot fail.
        q.send((cmd, issued)).expect("device pool is gone");
    }

    fn commands_taken(&mut self) -> bool {
        if self.writes.is_empty() && self.reads.is_empty() {
            return false;
        }
        // Their completions may make the engine emit more commands.
        self.host.write_batch(self.c, &mut self.writes);
        self.host.read_batch(self.c, &mut self.reads);
        true
    }

    fn reply(&mut self, r: Reply<Bytes>) {
        if r.id == self.mine {
            self.own = Some(r);
        } else if let Some(w) = self.c.waiting.remove(&r.id) {
            let _ = w.send(r);
        }
    }

    fn event(&mut self, ev: Event) {
        let h = self.host;
        if let Event::BackgroundError { what } = ev {
            if let Some(held) = h.bg_log.pass() {
                log!(
                    warn,
                    "background_error",
                    export = &h.name,
                    what = what,
                    suppressed = held
                );
            }
        }
    }

    /// One timeout check per pump, after its first pass: while the engine
    /// waits for a device (e.g. a commit it wants "as soon as possible"),
    /// its deadline stays due, and spinning on it under the lock would
    /// starve the very completion it waits for.
    fn pass_done(&mut self) -> bool {
        if std::mem::replace(&mut self.timer_checked, true) {
            return false;
        }
        let now = self.host.now();
        match self.c.eng.poll_timeout() {
            Some(t) if t <= now => {
                self.c.eng.handle_timeout(now);
                true
            }
            _ => false,
        }
    }
}

/// A request's reply: out already, or to come.
pub enum Pending {
    Ready(Reply<Bytes>),
    Wait(oneshot::Receiver<Reply<Bytes>>),
}

impl Pending {
    pub async fn get(self) -> Result<Reply<Bytes>, ReqError> {
        match self {
            Pending::Ready(r) => Ok(r),
            Pending::Wait(rx) => rx.await.map_err(|_| ReqError::Shutdown),
        }
    }
}

/// Split `items` into runs where each item starts where the one before it
/// ends (`span`: start, length), each run under [`MAX_MERGE`] bytes before
/// its last item: the writes one call can do.
fn adjacent_runs<'a, T>(
    items: &'a [T],
    span: impl Fn(&T) -> (u64, u64) + 'a,
) -> impl Iterator<Item = std::ops::Range<usize>> + 'a {
    let mut i = 0;
    std::iter::from_fn(move || {
        if i >= items.len() {
            return None;
        }
        let (start, len0) = span(&items[i]);
        let mut end = start + len0;
        let mut j = i + 1;
        while j < items.len() && span(&items[j]).0 == end && end - start < MAX_MERGE {
            end += span(&items[j]).1;
            j += 1;
        }
        let run = i..j;
        i = j;
        Some(run)
    })
}

/// A command for a device's pool, with its issue stamp in host-crash mode
/// (`fault::Layer::issue_stamp`).
type Queued = (IoCmd<Bytes>, Option<u64>);

fn spawn_pool(host: &Arc<Host>, dev: Arc<Device>, rx: mpsc::Receiver<Queued>, threads: usize) {
    let rx = Arc::new(Mutex::new(rx));
    for i in 0..threads {
        let (rx, dev) = (rx.clone(), dev.clone());
        // Workers hold the host weakly: they end with it.
        let host = Arc::downgrade(host);
        std::thread::Builder::new()
            .name(format!("nvwc-io-{i}"))
            .spawn(move || loop {
                let (cmd, issued) = match rx.lock().expect("pool queue lock").recv() {
                    Ok(c) => c,
                    Err(_) => return,
                };
                let res = dev.execute_issued(&cmd.op, cmd.group, issued);
                match host.upgrade() {
                    Some(h) => h.complete(cmd.id, res),
                    None => return,
                }
            })
            .expect("spawn device worker");
    }
}
