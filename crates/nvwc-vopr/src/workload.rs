//! The clients of a run: the random concurrent workload, and the read-back
//! of every block after recovery.

use std::collections::BTreeMap;

use bytes::Bytes;
use nvwc_core::*;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::oracle::{sector_of, stamp, Op, OpKind, Oracle, WriteRec, SECTOR};
use crate::world::{Client, Ctx, World};

/// A random concurrent workload: overlapping writes (FUA, zeroes, direct),
/// reads, flushes, trims and checkpoints, up to `qd` at a time, with random
/// admission hints and I/O-inheritance calls.
pub(crate) struct Workload {
    pub n_ops: usize,
    pub qd: usize,
    pub issued: usize,
    /// Request id → (op index, issue time in ns).
    pub outstanding: BTreeMap<u64, (u32, u64)>,
    /// Request ids start after this (so rounds after a crash never reuse one).
    pub id_base: u64,
    pub policy: WritePolicyKind,
    pub block_size: u64,
    pub backing_size: u64,
    pub verbose: bool,
}

impl Workload {
    fn sectors_total(&self) -> u64 {
        self.backing_size / SECTOR as u64
    }

    /// Draw one request and record it in the oracle.
    fn draw(
        &mut self,
        o: &mut Oracle,
        rng: &mut ChaCha8Rng,
    ) -> (ReqOp<Bytes>, OpKind, u32, u64, u64) {
        let bs = self.block_size;
        let sectors_total = self.sectors_total();
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
            let b = rng.gen_range(0..self.backing_size / bs);
            (b * bs / SECTOR as u64).min(sectors_total - nsec)
        } else {
            rng.gen_range(0..=sectors_total - nsec)
        };
        let offset = first * SECTOR as u64;
        let len = (nsec * SECTOR as u64) as u32;
        let journaled_hints = self.policy == WritePolicyKind::JournaledHints;
        let (op, kind, widx) = if roll < 45 || roll >= 95 && !journaled_hints && roll < 97 {
            let zero = rng.gen_bool(0.08);
            let fua = rng.gen_bool(0.12);
            let w = o.writes.len() as u32;
            o.writes.push(WriteRec {
                issue: 0,
                done: None,
                ok: false,
                fua,
                zero,
                first_sector: first,
                sectors: nsec,
                seq: 0,
                round: o.round,
                lost: Vec::new(),
                unsure: Vec::new(),
            });
            for s in first..first + nsec {
                o.by_sector.entry(s).or_default().push(w);
            }
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
            (ReqOp::Read { offset, len }, OpKind::Read, 0)
        } else if roll < 90 {
            (ReqOp::Flush, OpKind::Flush, 0)
        } else if roll < 95 {
            (ReqOp::Trim { offset, len }, OpKind::Trim, 0)
        } else {
            (ReqOp::Checkpoint, OpKind::Checkpoint, 0)
        };
        (op, kind, widx, first, nsec)
    }
}

impl Client for Workload {
    fn issue(&mut self, w: &mut World, cx: &mut Ctx) -> Option<u64> {
        let Ctx { o, rng, out } = cx;
        let now = w.now;
        // A critical waiter the engine cannot see (the simulator's
        // application model does this): I/O inheritance for a random
        // request in flight, racing its bypass write's completion.
        if !self.outstanding.is_empty() && rng.gen_bool(0.2) {
            let k = rng.gen_range(0..self.outstanding.len());
            let id = *self.outstanding.keys().nth(k).expect("k < len");
            w.eng.inherit_request(now, id);
        }
        while self.outstanding.len() < self.qd && self.issued < self.n_ops {
            self.issued += 1;
            let id = self.id_base + self.issued as u64;
            let (op, kind, widx, first, nsec) = self.draw(o, rng);
            let issue = o.tick();
            if kind == OpKind::Write {
                o.writes[widx as usize].issue = issue;
            }
            let oi = o.ops.len() as u32;
            o.ops.push(Op {
                kind,
                issue,
                done: None,
                ok: false,
                write: widx,
                first_sector: first,
                sectors: nsec,
            });
            self.outstanding.insert(id, (oi, now));
            if self.verbose {
                eprintln!("t={now} issue #{id} {kind:?} w{widx} sectors {first}+{nsec}");
            }
            let at_flush = matches!(kind, OpKind::Flush | OpKind::Checkpoint);
            let tag = Tag {
                client: 0,
                critical: rng.gen_bool(0.3),
                sync: rng.gen_bool(0.2),
            };
            // Half the plain writes are offered as direct writes (the
            // server's path for payloads read straight into the cache): the
            // parts become cache writes of the payload's bytes, with the
            // usual latencies, errors and crashes.
            let direct = match &op {
                ReqOp::Write { offset, data, fua } if rng.gen_bool(0.5) => w
                    .eng
                    .handle_direct_write(now, id, *offset, data.len() as u64, *fua, tag)
                    .map(|parts| (parts, data.clone())),
                _ => None,
            };
            match direct {
                Some((parts, data)) => {
                    out.direct_writes += 1;
                    w.direct_cmds.extend(parts.into_iter().map(|p| IoCmd {
                        id: p.io,
                        dev: Dev::Cache,
                        op: IoOp::Write {
                            offset: p.offset,
                            data: data.slice(
                                p.payload_offset as usize..(p.payload_offset + p.len) as usize,
                            ),
                            fua: false,
                        },
                        group: None,
                    }));
                }
                None => w.eng.handle_request(now, Request { id, op, tag }),
            }
            crate::collect_events(&mut w.eng, o, at_flush, out);
        }
        (self.issued < self.n_ops).then(|| now + rng.gen_range(0..200_000))
    }

    fn reply(&mut self, r: Reply<Bytes>, now: u64, cx: &mut Ctx) -> bool {
        let Ctx { o, out, .. } = cx;
        let (oi, issued_ns) = self
            .outstanding
            .remove(&r.id)
            .expect("reply for unknown request");
        out.max_latency_ns = out.max_latency_ns.max(now - issued_ns);
        let done = o.tick();
        let ok = r.result.is_ok();
        let op = o.ops[oi as usize].clone();
        o.ops[oi as usize].done = Some(done);
        o.ops[oi as usize].ok = ok;
        if self.verbose {
            eprintln!(
                "t={now} reply #{} {:?} ok={ok} seq={}",
                r.id, op.kind, r.seq
            );
        }
        match op.kind {
            OpKind::Write => {
                let w = &mut o.writes[op.write as usize];
                w.done = Some(done);
                w.ok = ok;
                w.seq = r.seq;
            }
            OpKind::Read => {
                if let Ok(Some(data)) = r.result {
                    check_read(o, &op, r.id, &data, done);
                }
            }
            _ => {}
        }
        false
    }

    fn outstanding(&self) -> (usize, Option<(u64, u64)>) {
        (self.outstanding.len(), oldest(&self.outstanding))
    }

    fn all_issued(&self) -> bool {
        self.issued >= self.n_ops
    }

    fn records_txns(&self) -> bool {
        true
    }
}

/// The oldest request of `outstanding` (id → (anything, issue time)):
/// `(id, issue time)`.
fn oldest<T>(outstanding: &BTreeMap<u64, (T, u64)>) -> Option<(u64, u64)> {
    outstanding
        .iter()
        .map(|(&id, &(_, t))| (id, t))
        .min_by_key(|&(id, t)| (t, id))
}

/// (a): every sector a read returned is one the NBD semantics allow.
fn check_read(o: &mut Oracle, op: &Op, id: u64, data: &[u8], done: u64) {
    if data.len() as u64 != op.sectors * SECTOR as u64 {
        o.violations.push(format!(
            "(a) read #{id} returned {} bytes, wanted {}",
            data.len(),
            op.sectors * SECTOR as u64
        ));
        return;
    }
    for i in 0..op.sectors {
        let s = op.first_sector + i;
        let v = o.client_val(sector_of(data, i), s);
        if !o.read_ok(s, v, op.issue, done) {
            let hist: Vec<_> = o
                .by_sector
                .get(&s)
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|&w| {
                    let r = &o.writes[w as usize];
                    (w, r.issue, r.done, r.ok)
                })
                .collect();
            o.violations.push(format!(
                "(a) read #{id} (issued {}, done {done}) sector {s} returned {v:?}; writes to it (id, issue, done, ok): {hist:?}",
                op.issue
            ));
            return;
        }
    }
}

/// Read every block back after recovery, `qd` at a time, retrying a read
/// that fails (a transient device error) up to [`ReadBack::TRIES`] times.
pub(crate) struct ReadBack {
    pub block_size: u64,
    pub blocks: u64,
    pub qd: usize,
    next: u64,
    /// Block → (tries, issue time).
    outstanding: BTreeMap<u64, (u32, u64)>,
    retry: Vec<(u64, u32)>,
    /// The image read back.
    pub got: Vec<u8>,
    /// A read failed [`ReadBack::TRIES`] times.
    pub failed: Option<String>,
    /// Read ids start after this.
    pub id_base: u64,
}

impl ReadBack {
    const TRIES: u32 = 50;

    pub fn new(block_size: u64, blocks: u64, qd: usize, id_base: u64) -> Self {
        ReadBack {
            block_size,
            blocks,
            qd,
            next: 0,
            outstanding: BTreeMap::new(),
            retry: Vec::new(),
            got: vec![0u8; (block_size * blocks) as usize],
            failed: None,
            id_base,
        }
    }

    fn send(&mut self, w: &mut World, b: u64, tries: u32) {
        let id = self.id_base + b + 1;
        self.outstanding.insert(id, (tries, w.now));
        w.eng.handle_request(
            w.now,
            Request {
                id,
                op: ReqOp::Read {
                    offset: b * self.block_size,
                    len: self.block_size as u32,
                },
                tag: Tag::default(),
            },
        );
    }
}

impl Client for ReadBack {
    fn issue(&mut self, w: &mut World, _: &mut Ctx) -> Option<u64> {
        for (b, tries) in std::mem::take(&mut self.retry) {
            self.send(w, b, tries);
        }
        while self.outstanding.len() < self.qd && self.next < self.blocks && self.failed.is_none() {
            let b = self.next;
            self.next += 1;
            self.send(w, b, 1);
        }
        None
    }

    fn reply(&mut self, r: Reply<Bytes>, _: u64, _: &mut Ctx) -> bool {
        let (tries, _) = self.outstanding.remove(&r.id).expect("read-back reply");
        let b = r.id - self.id_base - 1;
        let bs = self.block_size as usize;
        match r.result {
            Ok(Some(d)) => {
                self.got[b as usize * bs..(b as usize + 1) * bs].copy_from_slice(&d);
                self.next < self.blocks
            }
            other if tries < Self::TRIES => {
                let _ = other;
                self.retry.push((b, tries + 1));
                true
            }
            other => {
                self.failed = Some(format!(
                    "read of block {b} after recovery failed {tries} times: {other:?}"
                ));
                false
            }
        }
    }

    fn outstanding(&self) -> (usize, Option<(u64, u64)>) {
        (
            self.outstanding.len() + self.retry.len(),
            oldest(&self.outstanding),
        )
    }

    fn all_issued(&self) -> bool {
        self.next >= self.blocks && self.retry.is_empty() || self.failed.is_some()
    }
}

/// No requests at all (a drain).
pub(crate) struct Idle;

impl Client for Idle {
    fn issue(&mut self, _: &mut World, _: &mut Ctx) -> Option<u64> {
        None
    }
    fn reply(&mut self, r: Reply<Bytes>, _: u64, _: &mut Ctx) -> bool {
        panic!("a drain got a reply for request #{}", r.id)
    }
    fn outstanding(&self) -> (usize, Option<(u64, u64)>) {
        (0, None)
    }
    fn all_issued(&self) -> bool {
        true
    }
}
