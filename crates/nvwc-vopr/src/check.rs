//! The checks after a crash, apart from the run that led to it:
//!
//! * (b) [`recovered`]: recover the engine from the crashed cache image,
//!   read every block back, and require every flushed write (and nothing
//!   the client view forbids);
//! * (c) [`backing_alone`]: the backing store alone is a consistent point
//!   in time for the write policy;
//! * (c) again while a recovered engine drains ([`drain_after_recovery`]).

use bytes::Bytes;
use nvwc_core::layout::{self, Layout};
use nvwc_core::pump::{pump, Driver};
use nvwc_core::*;
use rand_chacha::ChaCha8Rng;

use crate::disk::Disk;
use crate::oracle::{decode, sector_of, Oracle, Val, INIT, SECTOR};
use crate::workload::{Idle, ReadBack};
use crate::world::{Latency, Stop, World};
use crate::SeedOutcome;

/// How a recovered engine's devices behave: at once (1 µs per round), or
/// with latencies and transient errors like the run before the crash.
pub(crate) enum Devices<'a> {
    Instant,
    Timed(Latency, &'a mut ChaCha8Rng),
}

/// The cache image's metadata, as recovery reads it.
pub(crate) fn cache_image(layout: &Layout, cache_img: &[u8]) -> CacheImage {
    let rec = |which: u64| {
        let at = layout.commit_offset(which) as usize;
        cache_img[at..at + 512].to_vec()
    };
    CacheImage {
        superblock: cache_img[0..512].to_vec(),
        commit_a: rec(0),
        commit_b: rec(1),
        table: cache_img
            [layout::TABLE_OFFSET as usize..(layout::TABLE_OFFSET + layout.table_bytes) as usize]
            .to_vec(),
        log: cache_img[layout.log_offset as usize..(layout.log_offset + layout.log_bytes) as usize]
            .to_vec(),
    }
}

fn dump(layout: &Layout, image: &CacheImage) {
    let mut pos = 0usize;
    while pos < image.log.len() {
        match layout::LogRecord::decode(&image.log[pos..], layout.block_size) {
            Some((r, len)) => {
                eprintln!(
                    "log @{pos}: epoch {} n {} sealed {} rec {:?}",
                    r.epoch, r.n, r.sealed, r.record
                );
                for (s, e) in &r.entries {
                    eprintln!("  slot {s}: {e:?}");
                }
                pos += len as usize;
            }
            None => {
                pos += layout::PAGE_BYTES as usize;
            }
        }
    }
    let cr = [
        layout::CommitRecord::decode(&image.commit_a),
        layout::CommitRecord::decode(&image.commit_b),
    ];
    eprintln!("recovery: commit records {cr:?}");
    for pg in 0..layout.pages() {
        for c in 0..2u64 {
            let base = ((2 * pg + c) * layout::PAGE_BYTES) as usize;
            let tag = layout::page_tag(pg, &image.table[base..base + layout::PAGE_BYTES as usize]);
            eprintln!(" page {pg} copy {c}: tag {tag:?}");
            if tag.is_none() {
                continue;
            }
            for i in 0..layout::ENTRIES_PER_PAGE {
                let s = (pg * layout::ENTRIES_PER_PAGE + i) as u32;
                let at = base + 64 + i as usize * 64;
                if let Some(e) = layout::Entry::decode(s, &image.table[at..at + 64]) {
                    if e.flags != 0 {
                        eprintln!("  slot {s}: {e:?}");
                    }
                }
            }
        }
    }
}

thread_local! {
    /// Log records replayed and dropped, and inline versions written back,
    /// by this thread's recoveries.
    static LOG_REPLAYS: std::cell::Cell<(u64, u64, u64)> =
        const { std::cell::Cell::new((0, 0, 0)) };
}

/// Log records replayed and dropped, and inline versions written back, by
/// this thread's recoveries since the last call.
pub(crate) fn take_log_replays() -> (u64, u64, u64) {
    LOG_REPLAYS.with(|c| c.replace((0, 0, 0)))
}

/// Recover an engine from a crashed cache image, writing what recovery
/// repairs (inline log records' versions) into the image.
///
/// The repairs land as durable bytes, where a driver writes them without a
/// flush: the same at any later crash, because until the first checkpoint
/// after recovery has flushed them the log that recovery repaired from is
/// still in force (that checkpoint is the first commit, and nothing is
/// written over the log or into those slots before it), so a second
/// recovery would write the same bytes again.
pub(crate) fn recover(
    cfg: &Config,
    layout: &Layout,
    cache_img: &mut [u8],
) -> Result<Engine<Bytes>, String> {
    let image = cache_image(layout, cache_img);
    let verbose = std::env::var_os("NVWC_VOPR_DUMP").is_some();
    if verbose {
        dump(layout, &image);
    }
    let (e, rep, repairs) =
        recover_image(cfg, &image, cache_img).map_err(|e| format!("(b) recovery failed: {e}"))?;
    LOG_REPLAYS.with(|c| {
        let (a, b, r) = c.get();
        c.set((
            a + rep.log_records,
            b + rep.log_dropped,
            r + rep.inline_repairs,
        ));
    });
    if verbose {
        eprintln!("recovery report: {rep:?}");
        eprintln!("recovery repairs: {repairs:?}");
    }
    Ok(e)
}

/// A recovered engine, its report, and the repairs' offsets and lengths.
pub(crate) type Recovery = (Engine<Bytes>, RecoveryReport, Vec<(u64, usize)>);

/// `Engine::recover` over `image` (read from `cache_img`), with its
/// repairs written into `cache_img`; returns the engine, the report and
/// the repairs' offsets and lengths.
pub(crate) fn recover_image(
    cfg: &Config,
    image: &CacheImage,
    cache_img: &mut [u8],
) -> Result<Recovery, RecoverError> {
    let mut repairs: Vec<(u64, Vec<u8>)> = Vec::new();
    let got = {
        let img: &[u8] = cache_img;
        let mut data_crc = |off: u64, len: u32| {
            Ok(layout::data_crc(
                &img[off as usize..(off + len as u64) as usize],
            ))
        };
        let mut repair = |off: u64, b: &[u8]| {
            repairs.push((off, b.to_vec()));
            Ok(())
        };
        Engine::recover(cfg.clone(), image, &mut data_crc, &mut repair)
    };
    let done = repairs.iter().map(|(o, b)| (*o, b.len())).collect();
    for (off, b) in repairs {
        cache_img[off as usize..off as usize + b.len()].copy_from_slice(&b);
    }
    got.map(|(e, rep)| (e, rep, done))
}

/// What (b) leaves for the checks after it: the recovered engine with its
/// devices, and the image it showed.
pub(crate) struct Recovered {
    pub world: World,
    pub got: Vec<u8>,
}

/// (b) Restart with the cache intact: recover, read every block back, and
/// check that every flushed write is there, nothing holds garbage, and (for
/// ordered) the recovered state is itself a consistent point in time.
/// `None` when a violation was recorded or nothing could be read.
#[allow(clippy::too_many_arguments)]
pub(crate) fn recovered(
    cfg: &Config,
    layout: &Layout,
    mut cache_img: Vec<u8>,
    backing_img: Vec<u8>,
    o: &mut Oracle,
    seed: u64,
    now: u64,
    devices: Devices<'_>,
    out: &mut SeedOutcome,
) -> Option<Recovered> {
    let eng = match recover(cfg, layout, &mut cache_img) {
        Ok(e) => e,
        Err(v) => {
            o.violations.push(v);
            return None;
        }
    };
    let bs = cfg.block_size as u64;
    let n = cfg.backing_size / bs;
    let (world, got) = match devices {
        Devices::Instant => read_back_instant(eng, cache_img, backing_img, bs, n, now, seed, o)?,
        Devices::Timed(lat, rng) => {
            let mut w = World::new(
                eng,
                Disk::new(cache_img),
                Disk::new(backing_img),
                lat,
                now,
                crate::table_range(layout),
            );
            let mut rb = ReadBack::new(bs, n, 16, 0);
            let stop = w.run(&mut rb, o, rng, out, u64::MAX, &mut |_, _, _| true, &|e| {
                e.is_idle()
            });
            if stop == Stop::Violation {
                return None;
            }
            if let Some(f) = rb.failed {
                o.violations.push(format!("(b) {f}"));
                return None;
            }
            (w, rb.got)
        }
    };
    let sectors = cfg.backing_size / SECTOR as u64;
    for s in 0..sectors {
        let v = o.client_val(sector_of(&got, s), s);
        if v == Val::Garbage {
            o.violations
                .push(format!("(b) sector {s} holds garbage after recovery"));
            return None;
        }
        if !o.possible(s, v) {
            o.violations.push(format!(
                "(b) sector {s} shows {v:?} after recovery, a write the recovery before showed superseded"
            ));
            return None;
        }
    }
    // Ordered: the recovered state is what the backing store converges to as
    // the cache drains in dependency order, so it must itself be prefix-closed
    // (else losing the cache after some of that draining would expose a state
    // no prefix allows). (Journaled recovery merges the uncommitted
    // transactions into one open transaction checkpointed later as a whole: a
    // prefix-closed state, but not on the transaction boundaries this check
    // knows, so it is not checked here.)
    if cfg.write_policy == WritePolicyKind::Ordered {
        let before = o.violations.len();
        let mut scratch = SeedOutcome::default();
        backing_alone(cfg, &got, false, o, &mut scratch);
        for v in &mut o.violations[before..] {
            *v = format!("(b) recovered state is not a consistent point in time: {v}");
        }
        if o.violations.len() > before {
            return None;
        }
    }
    for w in o.flushed_writes() {
        let r = o.writes[w as usize].clone();
        for s in r.first_sector..r.first_sector + r.sectors {
            let v = o.client_val(sector_of(&got, s), s);
            if !o.keeps(s, v, w) && !o.trimmed_after(s, w) {
                o.violations.push(format!(
                    "(b) flushed write w{w} (fua={}) lost at sector {s}: recovered {v:?}",
                    r.fua
                ));
                return None;
            }
        }
    }
    Some(Recovered { world, got })
}

/// Read every block back with devices that complete at once.
#[allow(clippy::too_many_arguments)]
fn read_back_instant(
    mut eng: Engine<Bytes>,
    cache_img: Vec<u8>,
    backing_img: Vec<u8>,
    bs: u64,
    n: u64,
    mut now: u64,
    seed: u64,
    o: &mut Oracle,
) -> Option<(World, Vec<u8>)> {
    let mut cache = Disk::new(cache_img);
    let mut backing = Disk::new(backing_img);
    let mut got = vec![0u8; (bs * n) as usize];
    eng.handle_timeout(now);
    for b in 0..n {
        eng.handle_request(
            now,
            Request {
                id: b + 1,
                op: ReqOp::Read {
                    offset: b * bs,
                    len: bs as u32,
                },
                tag: Tag::default(),
            },
        );
    }
    let pending = std::cell::Cell::new(n);
    let see = |seen: Seen<'_>, o: &mut Oracle| {
        if let Seen::Reply(r) = seen {
            pending.set(pending.get() - 1);
            let b = r.id - 1;
            match r.result {
                Ok(Some(d)) => got[(b * bs) as usize..((b + 1) * bs) as usize].copy_from_slice(&d),
                other => {
                    o.violations.push(format!(
                        "(b) read of block {b} after recovery failed: {other:?}"
                    ));
                    return Err(());
                }
            }
        }
        Ok(())
    };
    let done = |e: &Engine<Bytes>| pending.get() == 0 && e.is_idle();
    match run_instant(
        &mut eng,
        &mut now,
        &mut cache,
        &mut backing,
        "reading back",
        seed,
        o,
        see,
        done,
    ) {
        None => return None,
        Some(false) if pending.get() > 0 => {
            o.violations.push("(b) recovered engine stalled".into());
            return None;
        }
        Some(_) => {}
    }
    let lat = Latency {
        cache: (0, 1),
        backing: (0, 1),
        err_rate: 0.0,
    };
    let mut w = World::new(eng, cache, backing, lat, now, (0, 0));
    w.now = now;
    Some((w, got))
}

/// Run `cmd` on the disk models at once (recovery checks use instant devices).
fn instant_io(cmd: &IoCmd<Bytes>, cache: &mut Disk, backing: &mut Disk) -> IoResult<Bytes> {
    let disk = if cmd.dev == Dev::Cache {
        cache
    } else {
        backing
    };
    let stamp = disk.flush_issue_stamp();
    disk.execute(&cmd.op, cmd.group, stamp)
}

/// (c) again, after recovery: the recovered engine drains everything to the
/// backing store, which must be a consistent point in time after every
/// backing command (the cache device could be lost at any of them). The
/// backing image is the one that survived the power loss, hence `powered_off`.
/// Catches recovery destaging again what was already destaged before the
/// crash in a way that moves the backing store off a prefix.
pub(crate) fn drain_after_recovery(
    r: &mut Recovered,
    cfg: &Config,
    o: &mut Oracle,
    seed: u64,
    devices: Devices<'_>,
    out: &mut SeedOutcome,
) {
    // Journaled recovery merges the transactions the crash left open into
    // one, so the pre-crash transaction boundaries no longer apply: what must
    // hold is a prefix under completion→issue order, the ordered check.
    let mut prefix_cfg = cfg.clone();
    prefix_cfg.write_policy = WritePolicyKind::Ordered;
    let cfg = &prefix_cfg;
    let w = &mut r.world;
    w.eng.start_drain(w.now);
    let mut checks = 0u32;
    let trace = std::env::var_os("NVWC_VOPR_TRACE_DRAIN").is_some();
    let mut watch = |cmd: &IoCmd<Bytes>, backing: &Disk, o: &mut Oracle| {
        if trace {
            let what = match &cmd.op {
                IoOp::Write { offset, data, .. } => format!(
                    "write {offset}+{} w{}/s{}",
                    data.len(),
                    u64::from_le_bytes(data[8..16].try_into().unwrap()),
                    u64::from_le_bytes(data[16..24].try_into().unwrap())
                ),
                other => format!("{other:?}"),
            };
            eprintln!("drain: {:?} {what} group={:?}", cmd.dev, cmd.group);
        }
        let changed =
            cmd.dev == Dev::Backing && matches!(cmd.op, IoOp::Write { .. } | IoOp::GroupEnd { .. });
        if changed && checks < 500 {
            checks += 1;
            let before = o.violations.len();
            let mut scratch = SeedOutcome::default();
            backing_alone(cfg, &backing.visible(), true, o, &mut scratch);
            if o.violations.len() > before {
                for v in &mut o.violations[before..] {
                    *v = format!("(c) cache lost while draining after recovery: {v}");
                }
                return false;
            }
        }
        true
    };
    let done = |e: &Engine<Bytes>| e.dirty_versions() == 0 && e.is_idle();
    match devices {
        Devices::Instant => {
            let mut now = w.now;
            let see = |seen: Seen<'_>, o: &mut Oracle| match seen {
                Seen::Io(cmd, backing) => {
                    if watch(cmd, backing, o) {
                        Ok(())
                    } else {
                        Err(())
                    }
                }
                Seen::Reply(_) => Ok(()),
            };
            run_instant(
                &mut w.eng,
                &mut now,
                &mut w.cache,
                &mut w.backing,
                "draining",
                seed,
                o,
                see,
                done,
            );
            w.now = now;
        }
        Devices::Timed(_, rng) => {
            let stop = w.run(&mut Idle, o, rng, out, u64::MAX, &mut watch, &done);
            if stop == Stop::Quiet && !done(&w.eng) {
                o.violations.push(format!(
                    "drain after recovery stopped with {} dirty versions (seed {seed})",
                    w.eng.dirty_versions()
                ));
            }
        }
    }
}

/// What [`run_instant`] shows its caller: a command just completed (with the
/// backing store after it), or a reply.
enum Seen<'a> {
    Io(&'a IoCmd<Bytes>, &'a Disk),
    Reply(Reply<Bytes>),
}

/// Drive a recovered engine with devices that complete at once, 1 µs per
/// round, until `done` holds or nothing is left to do (`Some(done reached)`).
/// `see` watches every completed command and every reply; `Err` from it
/// stops the run (it recorded the violation) and so does a run that never
/// ends (`None` both times).
#[allow(clippy::too_many_arguments)]
fn run_instant(
    eng: &mut Engine<Bytes>,
    now: &mut u64,
    cache: &mut Disk,
    backing: &mut Disk,
    what: &str,
    seed: u64,
    o: &mut Oracle,
    see: impl FnMut(Seen<'_>, &mut Oracle) -> Result<(), ()>,
    done: impl Fn(&Engine<Bytes>) -> bool,
) -> Option<bool> {
    let mut d = InstantDevices {
        eng,
        now: *now,
        cache,
        backing,
        o,
        see,
        failed: false,
    };
    for _ in 0..10_000_000u64 {
        if done(d.eng) {
            return Some(true);
        }
        d.now += 1000;
        *now = d.now;
        let did = pump(&mut d);
        if d.failed {
            return None;
        }
        if !did {
            match d.eng.poll_timeout() {
                Some(t) => {
                    d.now = d.now.max(t);
                    *now = d.now;
                    d.eng.handle_timeout(d.now);
                }
                None => return Some(done(d.eng)),
            }
        }
    }
    d.o.violations.push(format!(
        "(b) recovered engine did not finish {what} (seed {seed})"
    ));
    None
}

/// A recovered engine as [`run_instant`]'s pump sees it: each command runs
/// at once on the disk models and is completed, then shown to `see`, as is
/// each reply. Once `see` fails the run is over: the rest is dropped (the
/// engine is abandoned).
struct InstantDevices<'a, S> {
    eng: &'a mut Engine<Bytes>,
    now: u64,
    cache: &'a mut Disk,
    backing: &'a mut Disk,
    o: &'a mut Oracle,
    see: S,
    failed: bool,
}

impl<S: FnMut(Seen<'_>, &mut Oracle) -> Result<(), ()>> Driver<Bytes> for InstantDevices<'_, S> {
    fn engine(&mut self) -> &mut Engine<Bytes> {
        self.eng
    }
    fn command(&mut self, cmd: IoCmd<Bytes>) {
        if self.failed {
            return;
        }
        let res = instant_io(&cmd, self.cache, self.backing);
        self.eng.handle_completion(self.now, cmd.id, res);
        self.failed = (self.see)(Seen::Io(&cmd, self.backing), self.o).is_err();
    }
    fn reply(&mut self, r: Reply<Bytes>) {
        if !self.failed {
            self.failed = (self.see)(Seen::Reply(r), self.o).is_err();
        }
    }
}

/// (c) The backing store alone, `img`, is a state the write policy allows
/// after losing the cache device (`powered_off`: the backing store lost
/// power too, so only what it made durable counts).
pub(crate) fn backing_alone(
    cfg: &Config,
    img: &[u8],
    powered_off: bool,
    o: &mut Oracle,
    out: &mut SeedOutcome,
) {
    let sectors = cfg.backing_size / SECTOR as u64;
    let mut obs: Vec<Val> = Vec::with_capacity(sectors as usize);
    for s in 0..sectors {
        let v = decode(sector_of(img, s), s);
        if v == Val::Garbage {
            o.violations
                .push(format!("(c) backing sector {s} holds garbage"));
            return;
        }
        obs.push(v);
    }
    // The state's era: the latest round a write it shows was issued in. It
    // continues from what recovery showed before that round, so what the
    // crashes before it lost must not be there. (A state showing no write
    // of the round running may still show what the last crash lost: it is
    // a point in time from before that crash, which the drain after
    // recovery checks.)
    let era = obs
        .iter()
        .filter_map(|v| match v {
            Val::W(w) => Some(o.writes[*w as usize].round),
            _ => None,
        })
        .max()
        .unwrap_or(1)
        .max(1);
    for (s, v) in obs.iter().enumerate() {
        if let Val::W(w) = *v {
            if o.lost_before(w, s as u64, era) {
                o.violations.push(format!(
                    "(c) backing sector {s} shows w{w}, which a crash lost (recovery did not show it), beside writes issued after that recovery"
                ));
                return;
            }
        }
    }
    // A crash before: journaled recovery merged the transactions the crash
    // left open into one, so transaction boundaries from before it no
    // longer apply; what must hold is a prefix, the ordered rule.
    let policy = match cfg.write_policy {
        WritePolicyKind::Journaled | WritePolicyKind::JournaledHints if o.base.is_some() => {
            WritePolicyKind::Ordered
        }
        p => p,
    };
    // Observed writes.
    let mut observed: Vec<u32> = obs
        .iter()
        .filter_map(|v| {
            if let Val::W(w) = v {
                (*w != INIT).then_some(*w)
            } else {
                None
            }
        })
        .collect();
    observed.sort_unstable();
    observed.dedup();
    let acked: Vec<u32> = (1..o.writes.len() as u32)
        .filter(|&w| o.acked_ok(w).is_some())
        .collect();
    // Does sector `s` keep `w` (or did a crash lose `w` there)?
    // Does sector `s` keep `w`, or did a crash before the round running
    // lose it there (then nothing can require it)?
    let kept = |o: &Oracle, s: u64, w: u32| {
        o.excused_before(w, s, o.round) || o.keeps_plain(s, obs[s as usize], w, era)
    };
    // Staleness: acknowledged writes the backing store does not show anywhere.
    out.stale_writes = acked
        .iter()
        .filter(|&&w| {
            let r = &o.writes[w as usize];
            (r.first_sector..r.first_sector + r.sectors).any(|s| !kept(o, s, w))
        })
        .count() as u64;

    let required: Vec<u32> = match policy {
        // Write-through promises every acknowledged write on a backing store that
        // survived, and the flush contract on one that lost power.
        WritePolicyKind::WriteThrough if powered_off => o.flushed_writes(),
        WritePolicyKind::WriteThrough => acked.clone(),
        WritePolicyKind::Journaled | WritePolicyKind::JournaledHints => {
            // Transaction of each write, by sequence number.
            let txn_of = |seq: u64| -> Option<u64> {
                o.txns
                    .iter()
                    .find(|t| seq >= t.1 && seq <= t.2 && seq != 0)
                    .map(|t| t.0)
            };
            let mut k = 0u64;
            for &w in &observed {
                let r = &o.writes[w as usize];
                if r.seq == 0 {
                    // Never acknowledged: its sequence number is unknown; a
                    // failed write may land partially.
                    continue;
                }
                match txn_of(r.seq) {
                    Some(t) => k = k.max(t),
                    None => {
                        o.violations.push(format!(
                            "(c) backing shows w{w} (seq {}) of a transaction that never closed",
                            r.seq
                        ));
                        return;
                    }
                }
            }
            if policy == WritePolicyKind::JournaledHints {
                for t in &o.txns {
                    if !t.3 && !t.4 {
                        o.violations.push(format!(
                            "(c) journaled-hints closed transaction {} outside a consistency point",
                            t.0
                        ));
                        return;
                    }
                }
            }
            // Every successful write of transactions 1..=k must be there.
            (1..o.writes.len() as u32)
                .filter(|&w| {
                    let r = &o.writes[w as usize];
                    r.ok && r.seq != 0 && txn_of(r.seq).is_some_and(|t| t <= k)
                })
                .collect()
        }
        WritePolicyKind::Ordered | WritePolicyKind::WriteBack => Vec::new(),
    };
    // Prefix closure: every write ordered before an observed write must be there.
    let mut anc: Vec<u32> = Vec::new();
    if policy != WritePolicyKind::WriteThrough {
        for w in 1..o.writes.len() as u32 {
            if o.acked_ok(w).is_some() && observed.iter().any(|&x| o.before(w, x)) {
                anc.push(w);
            }
        }
    }
    let check = |w: u32, why: &str, o: &mut Oracle| -> bool {
        let r = o.writes[w as usize].clone();
        for s in r.first_sector..r.first_sector + r.sectors {
            if !kept(o, s, w) {
                let how = if powered_off {
                    "backing powered off"
                } else {
                    "backing alive"
                };
                o.violations.push(format!(
                    "(c) {} ({how}): w{w} {why} but sector {s} shows {:?} ({}; {})",
                    cfg.write_policy,
                    obs[s as usize],
                    o.describe(w),
                    match obs[s as usize] {
                        Val::W(x) => o.describe(x),
                        _ => String::new(),
                    }
                ));
                return false;
            }
        }
        true
    };
    for w in required {
        if !check(w, "must be on the backing store", o) {
            return;
        }
    }
    for w in anc {
        if !check(w, "precedes a write on the backing store", o) {
            return;
        }
    }
}
