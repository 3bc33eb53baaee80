//! # nvwc-vopr
//!
//! Deterministic simulation testing of the nvwc engine, in the style of
//! TigerBeetle's VOPR. One seed generates a random configuration, a random
//! concurrent workload (overlapping writes, reads, flushes, FUA, trims,
//! write-zeroes, checkpoints), random device latencies and errors, and a crash
//! at a random point. An oracle that knows every write checks:
//!
//! * **(a) while running**: every read returns a value the NBD semantics allow
//!   (the latest acknowledged write, or a write concurrent with the read);
//! * **(b) crash with the cache intact**: after recovery, every write
//!   acknowledged before a completed FLUSH, and every acknowledged FUA write, is
//!   there (or was overwritten by a later write);
//! * **(c) cache device lost**: the backing store alone is a consistent point
//!   in time: `ordered` (and `write-back`, which must fail): a prefix-closed set
//!   under completion→issue order; `journaled`: a whole-transaction prefix;
//!   `journaled-hints`: a prefix of consistency points; `write-through`:
//!   everything acknowledged. For the consistent policies this is checked
//!   again after recovery: the recovered engine drains to the backing store,
//!   which must be a prefix (completion→issue order) after every backing write.
//!
//! Every 512-byte sector written carries `(write id, sector number)`, so the
//! oracle knows which write each sector came from.

#![forbid(unsafe_code)]

pub mod disk;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};

use bytes::Bytes;
use nvwc_core::layout::{self, Layout};
use nvwc_core::AdmissionKind;
use nvwc_core::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use disk::{Disk, SECTOR};

const MAGIC: u64 = 0x5EC7_0B5E_AAAA_0001;
const INIT: u32 = 0;

/// Options for a VOPR run.
#[derive(Clone, Debug)]
pub struct Options {
    pub policy: WritePolicyKind,
    /// Fixed replacement policy; random when `None`.
    pub replacement: Option<ReplacementKind>,
    /// Print a trace of the run.
    pub verbose: bool,
    /// Fixed fetch mode for partial writes to uncached blocks (patches);
    /// random per seed (all four modes) when `None`.
    pub fetch: Option<FetchMode>,
    /// Fixed admission policy; random per seed (all six) when `None`. Every
    /// request carries random `critical` and `sync` hints, so rejected
    /// writes bypass the cache at random; critical requests that wait
    /// behind a bypass write in flight, and random `inherit_request` calls,
    /// race reissues against the original completions.
    pub admission: Option<AdmissionKind>,
}

/// The result of one seed.
#[derive(Clone, Debug, Default)]
pub struct SeedOutcome {
    pub seed: u64,
    pub violations: Vec<String>,
    pub ops: usize,
    pub crashed_at_event: u64,
    /// Acknowledged writes whose data the backing store did not show after cache loss.
    pub stale_writes: u64,
    pub forced_closes: u64,
    pub config: String,
    /// Patch activity before the crash: patched blocks made, merges,
    /// reads served from patches, blocks brought up to date (fetch or direct),
    /// fallbacks to fetch-before-write, patches persisted as partial
    /// versions, reads and writes of partial versions that needed a fetch.
    pub patches: [u64; 8],
    /// Admission activity before the crash: pieces bypassed, rejected pieces
    /// cached because a bypass was unsafe, reissues, discarded completions.
    pub admission: [u64; 4],
    /// Writes taken as direct writes (`Engine::handle_direct_write`).
    pub direct_writes: u64,
}

#[derive(Clone, Debug)]
struct WriteRec {
    issue: u64,
    done: Option<u64>,
    ok: bool,
    fua: bool,
    zero: bool,
    first_sector: u64,
    sectors: u64,
    seq: u64,
}

#[derive(Clone, Debug)]
struct Op {
    kind: OpKind,
    issue: u64,
    done: Option<u64>,
    ok: bool,
    write: u32,
    first_sector: u64,
    sectors: u64,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum OpKind {
    Read,
    Write,
    Flush,
    Trim,
    Checkpoint,
}

/// A decoded sector.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Val {
    W(u32),
    Zero,
    Garbage,
}

fn stamp(buf: &mut [u8], w: u32, sector: u64) {
    buf[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    buf[8..16].copy_from_slice(&(w as u64).to_le_bytes());
    buf[16..24].copy_from_slice(&sector.to_le_bytes());
    let fill = (w as u8).wrapping_mul(31).wrapping_add(sector as u8) | 1;
    buf[24..SECTOR].fill(fill);
}

fn decode(buf: &[u8], sector: u64) -> Val {
    if buf.iter().all(|&b| b == 0) {
        return Val::Zero;
    }
    let m = u64::from_le_bytes(buf[0..8].try_into().unwrap());
    let w = u64::from_le_bytes(buf[8..16].try_into().unwrap());
    let s = u64::from_le_bytes(buf[16..24].try_into().unwrap());
    if m != MAGIC || s != sector || w > u32::MAX as u64 {
        return Val::Garbage;
    }
    let fill = (w as u8).wrapping_mul(31).wrapping_add(sector as u8) | 1;
    if buf[24..].iter().any(|&b| b != fill) {
        return Val::Garbage;
    }
    Val::W(w as u32)
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Client,
    Io(u64),
    Timeout,
}

struct InFlight {
    cmd: IoCmd<Bytes>,
    stamp: u64,
    fail: bool,
}

/// The oracle: every write, flush and trim, with logical issue/done times.
struct Oracle {
    writes: Vec<WriteRec>,
    by_sector: HashMap<u64, Vec<u32>>,
    ops: Vec<Op>,
    clock: u64,
    txns: Vec<(u64, u64, u64, bool, bool)>,
    violations: Vec<String>,
}

impl Oracle {
    fn new() -> Self {
        let init = WriteRec {
            issue: 0,
            done: Some(0),
            ok: true,
            fua: true,
            zero: false,
            first_sector: 0,
            sectors: 0,
            seq: 0,
        };
        Oracle {
            writes: vec![init],
            by_sector: HashMap::new(),
            ops: Vec::new(),
            clock: 1,
            txns: Vec::new(),
            violations: Vec::new(),
        }
    }
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }
    fn acked_ok(&self, w: u32) -> Option<u64> {
        let r = &self.writes[w as usize];
        if r.ok {
            r.done
        } else {
            None
        }
    }
    /// `a` completed before `b` was issued (completion→issue order).
    fn before(&self, a: u32, b: u32) -> bool {
        matches!(self.writes[a as usize].done, Some(d) if d < self.writes[b as usize].issue)
    }
    /// Could a read of `sector` issued at `ri` and completed at `rc` return `v`?
    fn read_ok(&self, sector: u64, v: Val, ri: u64, rc: u64) -> bool {
        let ws: &[u32] = self
            .by_sector
            .get(&sector)
            .map(|v| v.as_slice())
            .unwrap_or(&[]);
        if self.trimmed_since(sector, ri, rc) && v != Val::Garbage {
            return true;
        }
        let fresh = |w: u32| -> bool {
            // Written (issued) before the read completed, not superseded before it was issued.
            let r = &self.writes[w as usize];
            if r.issue >= rc {
                return false;
            }
            let wd = r.done;
            !ws.iter().any(|&w2| {
                let r2 = &self.writes[w2 as usize];
                w2 != w
                    && r2.ok
                    && matches!((wd, r2.done), (Some(d), Some(d2)) if d < r2.issue && d2 < ri)
            })
        };
        match v {
            Val::Garbage => false,
            Val::W(w) => (w == INIT || ws.contains(&w)) && fresh(w),
            Val::Zero => ws.iter().any(|&w| self.writes[w as usize].zero && fresh(w)),
        }
    }
    fn trimmed_since(&self, sector: u64, _ri: u64, rc: u64) -> bool {
        self.ops.iter().any(|o| {
            o.kind == OpKind::Trim
                && o.issue < rc
                && sector >= o.first_sector
                && sector < o.first_sector + o.sectors
        })
    }
}

fn random_config(rng: &mut ChaCha8Rng, opts: &Options) -> Config {
    let bs = [512u32, 1024, 2048, 4096][rng.gen_range(0..4)];
    let cap = rng.gen_range(16..96u64);
    let nblocks = rng.gen_range(cap / 2..cap * 3);
    let mut c = Config::new(bs, cap, nblocks * bs as u64, opts.policy);
    c.replacement = opts
        .replacement
        .unwrap_or_else(|| match rng.gen_range(0..5) {
            4 => ReplacementKind::Stack {
                track_blocks: 8,
                knee: nvwc_core::config::KneeSource::Online {
                    period: 32,
                    sample_keys: 256,
                },
            },
            0 => ReplacementKind::Lru,
            1 => ReplacementKind::Arc,
            2 => ReplacementKind::Lst {
                track_blocks: [4, 8, 16][rng.gen_range(0..3)],
            },
            _ => ReplacementKind::Stack {
                track_blocks: [4, 8, 16][rng.gen_range(0..3)],
                knee: nvwc_core::config::KneeSource::Fixed(cap / 3),
            },
        });
    let high = rng.gen_range(0.2..0.95);
    c.watermarks = Watermarks {
        high,
        low: high * rng.gen_range(0.2..0.9),
    };
    c.journal.txn_max_blocks = rng.gen_range(1..32);
    c.journal.txn_max_age_ns = [0, 50_000, 500_000, 5_000_000][rng.gen_range(0..4)];
    c.journal.checkpoint_delay_ns = [0, 0, 100_000, 2_000_000][rng.gen_range(0..4)];
    c.journal.checkpoint_merge_max = rng.gen_range(1..4);
    c.dummy_every = [0, 2, 3, 10, 100][rng.gen_range(0..5)];
    c.read_allocate = rng.gen_bool(0.7);
    c.autocommit_ns = [100_000, 1_000_000, 50_000_000][rng.gen_range(0..3)];
    c.autocommit_changes = rng.gen_range(4..256);
    c.max_destage_inflight = rng.gen_range(1..32);
    c.free_reserve = rng.gen_range(1..8);
    c.retry_ns = 200_000;
    // Drawn last, so the fields above keep their values per seed.
    c.fetch = opts
        .fetch
        .unwrap_or_else(|| FetchMode::ALL[rng.gen_range(0..4)]);
    c.patch_mem_bytes = [512, 4096, 65536][rng.gen_range(0..3)];
    c.patch_clean_at = [0.0, 0.5, 1.0][rng.gen_range(0..3)];
    c.patch_direct = opts.policy == WritePolicyKind::WriteBack && rng.gen_bool(0.5);
    c.rewrite_in_place = opts.policy == WritePolicyKind::WriteBack && rng.gen_bool(0.5);
    c.fetch_bg_inflight = rng.gen_range(1..4);
    c.admission = opts
        .admission
        .unwrap_or_else(|| AdmissionKind::ALL[rng.gen_range(0..6)]);
    let span = c.backing_size / 4;
    c.wal_ranges = vec![(rng.gen_range(0..c.backing_size - span), span)];
    c
}

/// Run one seed.
pub fn run_seed(seed: u64, opts: &Options) -> SeedOutcome {
    let mut rng = ChaCha8Rng::seed_from_u64(
        seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ opts.policy.code() as u64,
    );
    let cfg = random_config(&mut rng, opts);
    let bs = cfg.block_size as u64;
    let layout = Layout::new(&cfg);
    let mut out = SeedOutcome {
        seed,
        config: format!("{cfg:?}"),
        ..Default::default()
    };

    // Devices.
    let mut cache_img = vec![0u8; layout.device_bytes() as usize];
    for (off, b) in layout::format_writes(&cfg, seed) {
        cache_img[off as usize..off as usize + b.len()].copy_from_slice(&b);
    }
    let mut cache = Disk::new(cache_img);
    let sectors_total = cfg.backing_size / SECTOR as u64;
    let mut bimg = vec![0u8; cfg.backing_size as usize];
    for s in 0..sectors_total {
        stamp(
            &mut bimg[(s as usize) * SECTOR..(s as usize + 1) * SECTOR],
            INIT,
            s,
        );
    }
    let mut backing = Disk::new(bimg);

    let mut eng: Engine<Bytes> = Engine::new(cfg.clone()).expect("valid config");
    let mut oracle = Oracle::new();
    let err_rate = [0.0, 0.0, 0.002, 0.02][rng.gen_range(0..4)];
    let n_ops = rng.gen_range(20..600usize);
    let qd = rng.gen_range(1..17usize);
    let crash_at: u64 = rng.gen_range(10..(n_ops as u64 * 12));
    let cache_lat = |rng: &mut ChaCha8Rng| rng.gen_range(1_000..40_000u64);
    let backing_lat = |rng: &mut ChaCha8Rng| rng.gen_range(20_000..2_000_000u64);

    let mut events: BinaryHeap<Reverse<(u64, u64, Ev)>> = BinaryHeap::new();
    let mut ev_seq = 0u64;
    let mut push = |events: &mut BinaryHeap<Reverse<(u64, u64, Ev)>>, t: u64, e: Ev| {
        ev_seq += 1;
        events.push(Reverse((t, ev_seq, e)));
    };
    // Ordered maps: the crash walks what is in flight, drawing randomness per
    // command, so iteration order must not depend on a hasher's seed.
    let mut inflight: BTreeMap<u64, InFlight> = BTreeMap::new();
    let mut outstanding: BTreeMap<u64, u32> = BTreeMap::new(); // req id -> op index
    let mut issued = 0usize;
    let mut timeout_at: Option<u64> = None;
    let mut now = 0u64;
    let mut processed = 0u64;
    let mut in_flush_request = false;
    let mut direct_cmds: VecDeque<IoCmd<Bytes>> = VecDeque::new();
    push(&mut events, 0, Ev::Client);

    loop {
        if processed >= crash_at {
            break;
        }
        let Some(Reverse((t, _, ev))) = events.pop() else {
            if !outstanding.is_empty() {
                oracle.violations.push(format!(
                    "deadlock: {} requests never completed",
                    outstanding.len()
                ));
            }
            break;
        };
        processed += 1;
        now = now.max(t);
        match ev {
            Ev::Client => {
                // A critical waiter the engine cannot see (the simulator's
                // application model does this): I/O inheritance for a random
                // request in flight, racing its bypass write's completion.
                if !outstanding.is_empty() && rng.gen_bool(0.2) {
                    let k = rng.gen_range(0..outstanding.len());
                    let id = *outstanding.keys().nth(k).expect("k < len");
                    eng.inherit_request(now, id);
                }
                while outstanding.len() < qd && issued < n_ops {
                    issued += 1;
                    let id = issued as u64;
                    let roll = rng.gen_range(0..100);
                    let max_sectors = (4 * bs / SECTOR as u64).min(sectors_total);
                    let nsec = rng.gen_range(1..=max_sectors);
                    let aligned = rng.gen_bool(0.5);
                    // Some aligned requests cover whole blocks (direct-write candidates).
                    let nsec = if aligned && rng.gen_bool(0.3) {
                        let per = bs / SECTOR as u64;
                        (per * rng.gen_range(1..=4u64)).min(sectors_total / per * per)
                    } else {
                        nsec
                    };
                    let first = if aligned {
                        // Block-aligned.
                        let b = rng.gen_range(0..cfg.backing_size / bs);
                        (b * bs / SECTOR as u64).min(sectors_total - nsec)
                    } else {
                        rng.gen_range(0..=sectors_total - nsec)
                    };
                    let (op, kind, widx) = if roll < 45
                        || roll >= 95 && opts.policy != WritePolicyKind::JournaledHints && roll < 97
                    {
                        let zero = rng.gen_bool(0.08);
                        let fua = rng.gen_bool(0.12);
                        let w = oracle.writes.len() as u32;
                        oracle.writes.push(WriteRec {
                            issue: 0,
                            done: None,
                            ok: false,
                            fua,
                            zero,
                            first_sector: first,
                            sectors: nsec,
                            seq: 0,
                        });
                        for s in first..first + nsec {
                            oracle.by_sector.entry(s).or_default().push(w);
                        }
                        let offset = first * SECTOR as u64;
                        let len = (nsec * SECTOR as u64) as u32;
                        let op = if zero {
                            ReqOp::WriteZeroes { offset, len, fua }
                        } else {
                            let mut buf = vec![0u8; len as usize];
                            for (i, chunk) in buf.chunks_mut(SECTOR).enumerate() {
                                stamp(chunk, w, first + i as u64);
                            }
                            ReqOp::Write {
                                offset,
                                data: Bytes::from(buf),
                                fua,
                            }
                        };
                        (op, OpKind::Write, w)
                    } else if roll < 80 {
                        (
                            ReqOp::Read {
                                offset: first * SECTOR as u64,
                                len: (nsec * SECTOR as u64) as u32,
                            },
                            OpKind::Read,
                            0,
                        )
                    } else if roll < 90 {
                        (ReqOp::Flush, OpKind::Flush, 0)
                    } else if roll < 95 {
                        (
                            ReqOp::Trim {
                                offset: first * SECTOR as u64,
                                len: (nsec * SECTOR as u64) as u32,
                            },
                            OpKind::Trim,
                            0,
                        )
                    } else {
                        (ReqOp::Checkpoint, OpKind::Checkpoint, 0)
                    };
                    let issue = oracle.tick();
                    if kind == OpKind::Write {
                        oracle.writes[widx as usize].issue = issue;
                    }
                    let oi = oracle.ops.len() as u32;
                    oracle.ops.push(Op {
                        kind,
                        issue,
                        done: None,
                        ok: false,
                        write: widx,
                        first_sector: first,
                        sectors: nsec,
                    });
                    outstanding.insert(id, oi);
                    if opts.verbose {
                        eprintln!("t={now} issue #{id} {kind:?} w{widx} sectors {first}+{nsec}");
                    }
                    in_flush_request = matches!(kind, OpKind::Flush | OpKind::Checkpoint);
                    let tag = Tag {
                        client: 0,
                        critical: rng.gen_bool(0.3),
                        sync: rng.gen_bool(0.2),
                    };
                    // Half the plain writes are offered as direct writes (the
                    // server's path for payloads read straight into the
                    // cache): the parts become cache writes of the payload's
                    // bytes, with the usual latencies, errors and crashes.
                    let direct = match &op {
                        ReqOp::Write { offset, data, fua } if rng.gen_bool(0.5) => eng
                            .handle_direct_write(now, id, *offset, data.len() as u64, *fua, tag)
                            .map(|parts| (parts, data.clone())),
                        _ => None,
                    };
                    match direct {
                        Some((parts, data)) => {
                            out.direct_writes += 1;
                            direct_cmds.extend(parts.into_iter().map(|p| IoCmd {
                                id: p.io,
                                dev: Dev::Cache,
                                op: IoOp::Write {
                                    offset: p.offset,
                                    data: data.slice(
                                        p.payload_offset as usize
                                            ..(p.payload_offset + p.len) as usize,
                                    ),
                                    fua: false,
                                },
                                group: None,
                            }));
                        }
                        None => eng.handle_request(now, Request { id, op, tag }),
                    }
                    in_flush_request_events(&mut eng, &mut oracle, in_flush_request, &mut out);
                    in_flush_request = false;
                }
                if issued < n_ops {
                    push(&mut events, now + rng.gen_range(0..200_000), Ev::Client);
                }
            }
            Ev::Io(id) => {
                let f = inflight.remove(&id).expect("io");
                let disk = if f.cmd.dev == Dev::Cache {
                    &mut cache
                } else {
                    &mut backing
                };
                let res: IoResult<Bytes> = if f.fail {
                    Err(IoError::Eio)
                } else {
                    match &f.cmd.op {
                        IoOp::Read { offset, len } => {
                            Ok(Some(Bytes::from(disk.read(*offset, *len as usize))))
                        }
                        IoOp::Write { offset, data, fua } => {
                            disk.write(*offset, data, *fua, f.cmd.group);
                            Ok(None)
                        }
                        IoOp::Flush => {
                            disk.flush(f.stamp);
                            Ok(None)
                        }
                        IoOp::Trim { .. } => Ok(None),
                        IoOp::GroupBegin { group } => {
                            disk.group_begin(*group);
                            Ok(None)
                        }
                        IoOp::GroupEnd { group } => {
                            disk.group_end(*group);
                            Ok(None)
                        }
                    }
                };
                eng.handle_completion(now, id, res);
            }
            Ev::Timeout => {
                if timeout_at.is_some_and(|t| t <= now) {
                    timeout_at = None;
                    eng.handle_timeout(now);
                }
            }
        }
        // Drain the engine (direct writes' parts first: they were due first).
        while let Some(cmd) = direct_cmds.pop_front().or_else(|| eng.poll_io()) {
            let lat = if cmd.dev == Dev::Cache {
                cache_lat(&mut rng)
            } else {
                backing_lat(&mut rng)
            };
            let disk = if cmd.dev == Dev::Cache {
                &cache
            } else {
                &backing
            };
            let fail = err_rate > 0.0
                && rng.gen_bool(err_rate)
                && !matches!(cmd.op, IoOp::GroupBegin { .. });
            let stamp = disk.flush_issue_stamp();
            if opts.verbose {
                let what = match &cmd.op {
                    IoOp::Read { offset, len } => format!("read {offset}+{len}"),
                    IoOp::Write { offset, data, fua } => format!(
                        "write {offset}+{} fua={fua} stamp=w{}/s{}",
                        data.len(),
                        u64::from_le_bytes(data[8..16].try_into().unwrap()),
                        u64::from_le_bytes(data[16..24].try_into().unwrap())
                    ),
                    other => format!("{other:?}"),
                };
                eprintln!(
                    "t={now}   io {} {:?} {what} group={:?} fail={fail} done_at={}",
                    cmd.id,
                    cmd.dev,
                    cmd.group,
                    now + lat
                );
            }
            push(&mut events, now + lat, Ev::Io(cmd.id));
            inflight.insert(cmd.id, InFlight { cmd, stamp, fail });
        }
        drain_replies(
            &mut eng,
            &mut oracle,
            &mut outstanding,
            &mut out,
            opts.verbose,
            now,
        );
        collect_events(&mut eng, &mut oracle, false, &mut out);
        if let Some(t) = eng.poll_timeout() {
            let t = t.max(now);
            if timeout_at.is_none_or(|x| t < x) {
                timeout_at = Some(t);
                push(&mut events, t, Ev::Timeout);
            }
        }
        if issued >= n_ops
            && outstanding.is_empty()
            && inflight.is_empty()
            && events.iter().all(|e| matches!(e.0 .2, Ev::Timeout))
            && timeout_at.is_none_or(|t| t > now + 10_000_000_000)
        {
            break;
        }
    }
    out.crashed_at_event = processed;
    {
        let st = eng.stats();
        out.patches = [
            st.patches_created,
            st.patch_merges,
            st.patch_reads,
            st.patch_fetches + st.patch_direct_writes,
            st.patch_fallbacks,
            st.patch_persists,
            st.partial_read_fetches,
            st.partial_write_fetches,
        ];
        out.admission = [
            st.bypassed_pieces,
            st.bypass_refused,
            st.reissued_writes,
            st.discarded_completions,
        ];
    }
    out.ops = issued;
    let _ = in_flush_request;

    // ---- Crash: both devices lose what was not durable.
    let cache_inflight: Vec<(u64, Vec<u8>)> = inflight
        .values()
        .filter(|f| f.cmd.dev == Dev::Cache && f.cmd.group.is_none())
        .filter_map(|f| match &f.cmd.op {
            IoOp::Write { offset, data, .. } => Some((*offset, data.to_vec())),
            _ => None,
        })
        .collect();
    let backing_inflight: Vec<(u64, Vec<u8>)> = inflight
        .values()
        .filter(|f| f.cmd.dev == Dev::Backing && f.cmd.group.is_none())
        .filter_map(|f| match &f.cmd.op {
            IoOp::Write { offset, data, .. } => Some((*offset, data.to_vec())),
            _ => None,
        })
        .collect();
    let ends: Vec<u64> = inflight
        .values()
        .filter_map(|f| match f.cmd.op {
            IoOp::GroupEnd { group } => Some(group),
            _ => None,
        })
        .collect();
    let cache_crash = cache.crash(&mut rng, &cache_inflight, &[]);
    let backing_crash = backing.crash(&mut rng, &backing_inflight, &ends);
    let backing_alive = backing.host_lost(&mut rng, &backing_inflight);

    // Writes that never got a reply: issued, still "in flight" forever.
    // (b) Restart with the cache intact.
    check_recovered(
        &cfg,
        &layout,
        cache_crash,
        backing_crash.clone(),
        &mut oracle,
        seed,
    );
    // (c) The cache device is lost: the backing store alone, both when the
    // backing store survived the host (networked storage: every completed write
    // is there) and when it lost power too (only what it had made durable).
    check_backing_alone(&cfg, &backing_alive, false, &mut oracle, &mut out);
    if oracle.violations.is_empty() {
        check_backing_alone(&cfg, &backing_crash, true, &mut oracle, &mut out);
    }

    out.violations = oracle.violations;
    out
}

fn in_flush_request_events(
    eng: &mut Engine<Bytes>,
    oracle: &mut Oracle,
    at_flush: bool,
    out: &mut SeedOutcome,
) {
    collect_events(eng, oracle, at_flush, out);
}

fn collect_events(
    eng: &mut Engine<Bytes>,
    oracle: &mut Oracle,
    at_flush: bool,
    out: &mut SeedOutcome,
) {
    while let Some(e) = eng.poll_event() {
        if let Event::Policy(PolicyEvent::TxnClosed {
            txn,
            first_seq,
            last_seq,
            forced,
        }) = e
        {
            if forced {
                out.forced_closes += 1;
            }
            oracle
                .txns
                .push((txn, first_seq, last_seq, forced, at_flush));
        }
    }
}

fn drain_replies(
    eng: &mut Engine<Bytes>,
    oracle: &mut Oracle,
    outstanding: &mut BTreeMap<u64, u32>,
    _out: &mut SeedOutcome,
    verbose: bool,
    now: u64,
) {
    while let Some(r) = eng.poll_reply() {
        let oi = outstanding
            .remove(&r.id)
            .expect("reply for unknown request");
        let done = oracle.tick();
        let ok = r.result.is_ok();
        let op = oracle.ops[oi as usize].clone();
        oracle.ops[oi as usize].done = Some(done);
        oracle.ops[oi as usize].ok = ok;
        if verbose {
            eprintln!(
                "t={now} reply #{} {:?} ok={ok} seq={}",
                r.id, op.kind, r.seq
            );
        }
        match op.kind {
            OpKind::Write => {
                let w = &mut oracle.writes[op.write as usize];
                w.done = Some(done);
                w.ok = ok;
                w.seq = r.seq;
            }
            OpKind::Read => {
                if let Ok(Some(data)) = r.result {
                    if data.len() as u64 != op.sectors * SECTOR as u64 {
                        oracle.violations.push(format!(
                            "(a) read #{} returned {} bytes, wanted {}",
                            r.id,
                            data.len(),
                            op.sectors * SECTOR as u64
                        ));
                        continue;
                    }
                    for i in 0..op.sectors {
                        let s = op.first_sector + i;
                        let v = decode(&data[(i as usize) * SECTOR..(i as usize + 1) * SECTOR], s);
                        if !oracle.read_ok(s, v, op.issue, done) {
                            let hist: Vec<_> = oracle
                                .by_sector
                                .get(&s)
                                .cloned()
                                .unwrap_or_default()
                                .iter()
                                .map(|&w| {
                                    (
                                        w,
                                        oracle.writes[w as usize].issue,
                                        oracle.writes[w as usize].done,
                                        oracle.writes[w as usize].ok,
                                    )
                                })
                                .collect();
                            oracle.violations.push(format!("(a) read #{} (issued {}, done {done}) sector {s} returned {v:?}; writes to it (id, issue, done, ok): {hist:?}", r.id, op.issue));
                            break;
                        }
                    }
                }
            }
            _ => {}
        }
    }
}

/// Writes that must survive a crash with the cache intact: acknowledged FUA
/// writes, and writes acknowledged before a FLUSH that completed successfully.
fn flushed_writes(o: &Oracle) -> Vec<u32> {
    let last_flush_issue = o
        .ops
        .iter()
        .filter(|op| {
            matches!(op.kind, OpKind::Flush | OpKind::Checkpoint) && op.ok && op.done.is_some()
        })
        .map(|op| op.issue)
        .max()
        .unwrap_or(0);
    (1..o.writes.len() as u32)
        .filter(|&w| {
            let r = &o.writes[w as usize];
            r.ok && matches!(r.done, Some(d) if r.fua || d < last_flush_issue)
        })
        .collect()
}

/// Does sector `s` showing `v` keep write `w` (it shows `w`, or a write not ordered before `w`)?
fn keeps(o: &Oracle, s: u64, v: Val, w: u32) -> bool {
    match v {
        Val::Garbage => false,
        Val::W(x) if x == w => true,
        Val::W(INIT) => false,
        Val::W(x) => o.by_sector.get(&s).is_some_and(|ws| ws.contains(&x)) && !o.before(x, w),
        Val::Zero => o.by_sector.get(&s).is_some_and(|ws| {
            ws.iter()
                .any(|&x| o.writes[x as usize].zero && (x == w || !o.before(x, w)))
        }),
    }
}

fn trimmed_after(o: &Oracle, s: u64, w: u32) -> bool {
    let wi = o.writes[w as usize].issue;
    o.ops.iter().any(|op| {
        op.kind == OpKind::Trim
            && op.issue > wi
            && s >= op.first_sector
            && s < op.first_sector + op.sectors
    })
}

fn check_recovered(
    cfg: &Config,
    layout: &Layout,
    cache_img: Vec<u8>,
    backing_img: Vec<u8>,
    o: &mut Oracle,
    seed: u64,
) {
    let image = CacheImage {
        superblock: cache_img[0..512].to_vec(),
        commit_a: cache_img
            [layout.commit_offset(0) as usize..layout.commit_offset(0) as usize + 512]
            .to_vec(),
        commit_b: cache_img
            [layout.commit_offset(1) as usize..layout.commit_offset(1) as usize + 512]
            .to_vec(),
        table: cache_img
            [layout::TABLE_OFFSET as usize..(layout::TABLE_OFFSET + layout.table_bytes) as usize]
            .to_vec(),
    };
    if std::env::var_os("NVWC_VOPR_DUMP").is_some() {
        let cr = [
            layout::CommitRecord::decode(&image.commit_a),
            layout::CommitRecord::decode(&image.commit_b),
        ];
        eprintln!("recovery: commit records {cr:?}");
        for pg in 0..layout.pages() {
            for c in 0..2u64 {
                let base = ((2 * pg + c) * layout::PAGE_BYTES) as usize;
                let tag =
                    layout::page_tag(pg, &image.table[base..base + layout::PAGE_BYTES as usize]);
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
    let mut eng: Engine<Bytes> = match Engine::recover(cfg.clone(), &image) {
        Ok((e, rep)) => {
            if std::env::var_os("NVWC_VOPR_DUMP").is_some() {
                eprintln!("recovery report: {rep:?}");
            }
            e
        }
        Err(e) => {
            o.violations.push(format!("(b) recovery failed: {e}"));
            return;
        }
    };
    let mut cache = Disk::new(cache_img);
    let mut backing = Disk::new(backing_img);
    // Read everything back, one block per request, with instant devices.
    let bs = cfg.block_size as u64;
    let n = cfg.backing_size / bs;
    let mut got = vec![0u8; cfg.backing_size as usize];
    let mut now = 1_000_000_000_000u64;
    eng.handle_timeout(now);
    let mut pending = 0u64;
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
        pending += 1;
    }
    let pending = std::cell::Cell::new(pending);
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
        None => return,
        Some(false) if pending.get() > 0 => {
            o.violations.push("(b) recovered engine stalled".into());
            return;
        }
        Some(_) => {}
    }
    let sectors = cfg.backing_size / SECTOR as u64;
    for s in 0..sectors {
        let v = decode(&got[(s as usize) * SECTOR..(s as usize + 1) * SECTOR], s);
        if v == Val::Garbage {
            o.violations
                .push(format!("(b) sector {s} holds garbage after recovery"));
            return;
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
        check_backing_alone(cfg, &got, false, o, &mut scratch);
        for v in &mut o.violations[before..] {
            *v = format!("(b) recovered state is not a consistent point in time: {v}");
        }
        if o.violations.len() > before {
            return;
        }
    }
    for w in flushed_writes(o) {
        let r = o.writes[w as usize].clone();
        for s in r.first_sector..r.first_sector + r.sectors {
            let v = decode(&got[(s as usize) * SECTOR..(s as usize + 1) * SECTOR], s);
            if !keeps(o, s, v, w) && !trimmed_after(o, s, w) {
                o.violations.push(format!(
                    "(b) flushed write w{w} (fua={}) lost at sector {s}: recovered {v:?}",
                    r.fua
                ));
                return;
            }
        }
    }
    if matches!(
        cfg.write_policy,
        WritePolicyKind::Ordered | WritePolicyKind::Journaled | WritePolicyKind::JournaledHints
    ) {
        drain_after_recovery(&mut eng, &mut cache, &mut backing, cfg, now, o, seed);
    }
}

/// Run `cmd` on the disk models at once (recovery checks use instant devices).
fn instant_io(cmd: &IoCmd<Bytes>, cache: &mut Disk, backing: &mut Disk) -> IoResult<Bytes> {
    let disk = if cmd.dev == Dev::Cache {
        cache
    } else {
        backing
    };
    match &cmd.op {
        IoOp::Read { offset, len } => Ok(Some(Bytes::from(disk.read(*offset, *len as usize)))),
        IoOp::Write { offset, data, fua } => {
            disk.write(*offset, data, *fua, cmd.group);
            Ok(None)
        }
        IoOp::Flush => {
            let st = disk.flush_issue_stamp();
            disk.flush(st);
            Ok(None)
        }
        IoOp::GroupBegin { group } => {
            disk.group_begin(*group);
            Ok(None)
        }
        IoOp::GroupEnd { group } => {
            disk.group_end(*group);
            Ok(None)
        }
        IoOp::Trim { .. } => Ok(None),
    }
}

/// (c) again, after recovery: the recovered engine drains everything to the
/// backing store, which must be a consistent point in time after every
/// backing command (the cache device could be lost at any of them). The
/// backing image is the one that survived the power loss, hence `powered_off`.
/// Catches
/// recovery destaging again what was already destaged before the crash in a
/// way that moves the backing store off a prefix.
fn drain_after_recovery(
    eng: &mut Engine<Bytes>,
    cache: &mut Disk,
    backing: &mut Disk,
    cfg: &Config,
    mut now: u64,
    o: &mut Oracle,
    seed: u64,
) {
    // Journaled recovery merges the transactions the crash left open into
    // one, so the pre-crash transaction boundaries no longer apply: what must
    // hold is a prefix under completion→issue order, the ordered check.
    let mut prefix_cfg = cfg.clone();
    prefix_cfg.write_policy = WritePolicyKind::Ordered;
    let cfg = &prefix_cfg;
    eng.start_drain(now);
    let mut checks = 0u32;
    let see = |seen: Seen<'_>, o: &mut Oracle| {
        let Seen::Io(cmd, backing) = seen else {
            return Ok(());
        };
        let changed =
            cmd.dev == Dev::Backing && matches!(cmd.op, IoOp::Write { .. } | IoOp::GroupEnd { .. });
        if changed && checks < 500 {
            checks += 1;
            let before = o.violations.len();
            let mut scratch = SeedOutcome::default();
            check_backing_alone(cfg, backing.visible(), true, o, &mut scratch);
            if o.violations.len() > before {
                for v in &mut o.violations[before..] {
                    *v = format!("(c) cache lost while draining after recovery: {v}");
                }
                return Err(());
            }
        }
        Ok(())
    };
    let done = |e: &Engine<Bytes>| e.dirty_versions() == 0 && e.is_idle();
    run_instant(
        eng, &mut now, cache, backing, "draining", seed, o, see, done,
    );
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
    mut see: impl FnMut(Seen<'_>, &mut Oracle) -> Result<(), ()>,
    done: impl Fn(&Engine<Bytes>) -> bool,
) -> Option<bool> {
    for _ in 0..10_000_000u64 {
        if done(eng) {
            return Some(true);
        }
        *now += 1000;
        let mut did = false;
        while let Some(cmd) = eng.poll_io() {
            did = true;
            let res = instant_io(&cmd, cache, backing);
            eng.handle_completion(*now, cmd.id, res);
            see(Seen::Io(&cmd, backing), o).ok()?;
        }
        while let Some(r) = eng.poll_reply() {
            did = true;
            see(Seen::Reply(r), o).ok()?;
        }
        if !did {
            match eng.poll_timeout() {
                Some(t) => {
                    *now = (*now).max(t);
                    eng.handle_timeout(*now);
                }
                None => return Some(done(eng)),
            }
        }
    }
    o.violations.push(format!(
        "(b) recovered engine did not finish {what} (seed {seed})"
    ));
    None
}

fn check_backing_alone(
    cfg: &Config,
    img: &[u8],
    powered_off: bool,
    o: &mut Oracle,
    out: &mut SeedOutcome,
) {
    let sectors = cfg.backing_size / SECTOR as u64;
    let mut obs: Vec<Val> = Vec::with_capacity(sectors as usize);
    for s in 0..sectors {
        let v = decode(&img[(s as usize) * SECTOR..(s as usize + 1) * SECTOR], s);
        if v == Val::Garbage {
            o.violations
                .push(format!("(c) backing sector {s} holds garbage"));
            return;
        }
        obs.push(v);
    }
    let policy = cfg.write_policy;
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
    // Staleness: acknowledged writes the backing store does not show anywhere.
    out.stale_writes = acked
        .iter()
        .filter(|&&w| {
            let r = &o.writes[w as usize];
            (r.first_sector..r.first_sector + r.sectors).any(|s| !keeps(o, s, obs[s as usize], w))
        })
        .count() as u64;

    let required: Vec<u32> = match policy {
        // Write-through promises every acknowledged write on a backing store that
        // survived, and the flush contract on one that lost power.
        WritePolicyKind::WriteThrough if powered_off => flushed_writes(o),
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
                    if r.ok {
                        continue;
                    }
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
    if !matches!(policy, WritePolicyKind::WriteThrough) {
        let min_issue_obs = observed
            .iter()
            .map(|&w| o.writes[w as usize].issue)
            .max()
            .unwrap_or(0);
        let _ = min_issue_obs;
        for w in 1..o.writes.len() as u32 {
            if o.acked_ok(w).is_some() && observed.iter().any(|&x| o.before(w, x)) {
                anc.push(w);
            }
        }
    }
    let check = |w: u32, why: &str, o: &mut Oracle| -> bool {
        let r = o.writes[w as usize].clone();
        for s in r.first_sector..r.first_sector + r.sectors {
            if !keeps(o, s, obs[s as usize], w) {
                let how = if powered_off {
                    "backing powered off"
                } else {
                    "backing alive"
                };
                o.violations.push(format!(
                    "(c) {policy} ({how}): w{w} {why} but sector {s} shows {:?}",
                    obs[s as usize]
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

thread_local! {
    static PANIC_MSG: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Summary of many seeds for one policy.
#[derive(Clone, Debug, Default)]
pub struct PolicySummary {
    pub policy: String,
    pub seeds: u64,
    pub violations: u64,
    pub first_failure: Option<SeedOutcome>,
    pub forced_close_seeds: u64,
    pub stale_writes: u64,
    /// Seeds failing each check: (a), (b), (c), and anything else (panic, deadlock).
    pub by_check: [u64; 4],
    /// Sums of [`SeedOutcome::patches`].
    pub patches: [u64; 8],
    /// Sums of [`SeedOutcome::admission`].
    pub admission: [u64; 4],
    /// Sum of [`SeedOutcome::direct_writes`].
    pub direct_writes: u64,
}

/// Run `seeds` seeds starting at `first` on `threads` threads.
pub fn run_many(
    opts: &Options,
    first: u64,
    seeds: u64,
    threads: usize,
    progress: &(dyn Fn(u64) + Sync),
) -> PolicySummary {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;
    let next = AtomicU64::new(first);
    let done = AtomicU64::new(0);
    let results: Mutex<BTreeMap<u64, SeedOutcome>> = Mutex::new(BTreeMap::new());
    let agg = Mutex::new((0u64, 0u64, 0u64, [0u64; 4], [0u64; 8], [0u64; 4], 0u64));
    std::panic::set_hook(Box::new(|info| {
        let loc = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        PANIC_MSG.with(|m| *m.borrow_mut() = format!("{msg} at {loc}"));
    }));
    std::thread::scope(|sc| {
        for _ in 0..threads.max(1) {
            sc.spawn(|| loop {
                let s = next.fetch_add(1, Ordering::Relaxed);
                if s >= first + seeds {
                    break;
                }
                let r = std::panic::catch_unwind(|| run_seed(s, opts)).unwrap_or_else(|_| {
                    let msg = PANIC_MSG.with(|m| m.borrow().clone());
                    SeedOutcome {
                        seed: s,
                        violations: vec![format!("panic: {msg}")],
                        ..Default::default()
                    }
                });
                {
                    let mut a = agg.lock().unwrap();
                    if !r.violations.is_empty() {
                        a.0 += 1;
                    }
                    for (i, tag) in ["(a)", "(b)", "(c)"].iter().enumerate() {
                        if r.violations.iter().any(|v| v.starts_with(tag)) {
                            a.3[i] += 1;
                        }
                    }
                    if r.violations.iter().any(|v| !v.starts_with('(')) {
                        a.3[3] += 1;
                    }
                    if r.forced_closes > 0 {
                        a.1 += 1;
                    }
                    a.2 += r.stale_writes;
                    for (x, y) in a.4.iter_mut().zip(r.patches) {
                        *x += y;
                    }
                    for (x, y) in a.5.iter_mut().zip(r.admission) {
                        *x += y;
                    }
                    a.6 += r.direct_writes;
                }
                if !r.violations.is_empty() {
                    let mut m = results.lock().unwrap();
                    if m.len() < 4 {
                        m.insert(s, r);
                    }
                }
                let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                progress(d);
            });
        }
    });
    let a = agg.into_inner().unwrap();
    let _ = std::panic::take_hook();
    let first_failure = results.into_inner().unwrap().into_values().next();
    PolicySummary {
        policy: opts.policy.name().to_string(),
        seeds,
        violations: a.0,
        first_failure,
        forced_close_seeds: a.1,
        stale_writes: a.2,
        by_check: a.3,
        patches: a.4,
        admission: a.5,
        direct_writes: a.6,
    }
}
