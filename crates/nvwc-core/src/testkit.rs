//! An in-memory driver for the engine: two byte-array devices that complete
//! commands in a chosen order. Used by tests and benchmarks; the VOPR has its
//! own richer device model (volatile caches, crashes, errors).

use std::collections::VecDeque;

use bytes::Bytes;

use crate::engine::{CacheImage, Engine};
use crate::group::GroupStager;
use crate::layout::{self, Layout};
use crate::pump::{pump, Driver};
use crate::types::*;
use crate::Config;

/// In-memory cache and backing devices around an engine.
pub struct MemHarness {
    pub engine: Engine<Bytes>,
    pub cache: Vec<u8>,
    pub backing: Vec<u8>,
    pub now: u64,
    inflight: VecDeque<IoCmd<Bytes>>,
    pub replies: Vec<Reply<Bytes>>,
    groups: GroupStager,
}

/// The harness's pump puts the engine's commands in flight (completed
/// later, by [`MemHarness::step`]) and keeps its replies for the test.
impl Driver<Bytes> for MemHarness {
    fn engine(&mut self) -> &mut Engine<Bytes> {
        &mut self.engine
    }
    fn command(&mut self, cmd: IoCmd<Bytes>) {
        self.inflight.push_back(cmd);
    }
    fn reply(&mut self, reply: Reply<Bytes>) {
        self.replies.push(reply);
    }
}

impl MemHarness {
    /// A fresh, formatted cache and a zeroed backing store.
    pub fn new(cfg: Config) -> Self {
        let l = Layout::new(&cfg);
        let mut cache = vec![0u8; l.device_bytes() as usize];
        for (off, b) in layout::format_writes(&cfg, 1) {
            cache[off as usize..off as usize + b.len()].copy_from_slice(&b);
        }
        let backing = vec![0u8; cfg.backing_size as usize];
        let engine = Engine::new(cfg).expect("valid config");
        MemHarness {
            engine,
            cache,
            backing,
            now: 0,
            inflight: VecDeque::new(),
            replies: Vec::new(),
            groups: Default::default(),
        }
    }

    /// `retired_pending` from `Engine::debug_state`: the retired slots that
    /// the next commit frees (`maybe_commit` starts a reclaim commit off it
    /// when free slots run short; the cleaner counts them as coming).
    pub fn retired_pending(&self) -> u64 {
        let s = self.engine.debug_state();
        let v = s
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix("retired_pending="))
            .expect("retired_pending in debug_state");
        v.parse().expect("a count")
    }

    /// Reopen the engine from the cache device's metadata (as after a restart).
    pub fn reopen(&mut self) -> Result<crate::RecoveryReport, crate::RecoverError> {
        let cfg = self.engine.config().clone();
        let l = Layout::new(&cfg);
        let c = &self.cache;
        let image = CacheImage {
            superblock: c[0..512].to_vec(),
            commit_a: c[l.commit_offset(0) as usize..][..512].to_vec(),
            commit_b: c[l.commit_offset(1) as usize..][..512].to_vec(),
            table: c
                [layout::TABLE_OFFSET as usize..(layout::TABLE_OFFSET + l.table_bytes) as usize]
                .to_vec(),
            log: c[l.log_offset as usize..(l.log_offset + l.log_bytes) as usize].to_vec(),
        };
        let mut repairs: Vec<(u64, Vec<u8>)> = Vec::new();
        let (e, rep) = Engine::recover(
            cfg,
            &image,
            &mut |off, len| {
                Ok(layout::data_crc(
                    &c[off as usize..(off + len as u64) as usize],
                ))
            },
            &mut |off, bytes| {
                repairs.push((off, bytes.to_vec()));
                Ok(())
            },
        )?;
        for (off, bytes) in repairs {
            self.cache[off as usize..off as usize + bytes.len()].copy_from_slice(&bytes);
        }
        self.engine = e;
        self.inflight.clear();
        self.engine.handle_timeout(self.now);
        Ok(rep)
    }

    pub fn submit(&mut self, id: ReqId, op: ReqOp<Bytes>) {
        self.submit_tagged(id, op, Tag::default());
    }

    /// Submit with admission hints.
    pub fn submit_tagged(&mut self, id: ReqId, op: ReqOp<Bytes>, tag: Tag) {
        self.now += 1;
        self.engine
            .handle_request(self.now, Request { id, op, tag });
        self.collect();
    }

    /// Offer a write as a direct write (`Engine::handle_direct_write`). If
    /// the engine takes it, its parts go in flight as cache writes of
    /// `data`'s bytes (as a driver that receives the payload into the cache
    /// device would do) and the parts are returned.
    pub fn submit_direct(
        &mut self,
        id: ReqId,
        offset: u64,
        data: Bytes,
        fua: bool,
    ) -> Option<Vec<DirectPart>> {
        self.now += 1;
        let parts = self.engine.handle_direct_write(
            self.now,
            id,
            offset,
            data.len() as u64,
            fua,
            Tag::default(),
        )?;
        for p in &parts {
            let at = p.payload_offset as usize;
            self.inflight.push_back(IoCmd {
                id: p.io,
                dev: Dev::Cache,
                op: IoOp::Write {
                    offset: p.offset,
                    data: data.slice(at..at + p.len as usize),
                    fua: false,
                },
                group: None,
            });
        }
        self.collect();
        Some(parts)
    }

    /// Commands in flight, in issue order (`step`'s `pick` indexes this).
    pub fn inflight(&mut self) -> &VecDeque<IoCmd<Bytes>> {
        self.collect();
        &self.inflight
    }

    fn collect(&mut self) {
        pump(self);
    }

    fn execute(&mut self, cmd: &IoCmd<Bytes>) -> IoResult<Bytes> {
        let dev = match cmd.dev {
            Dev::Cache => &mut self.cache,
            Dev::Backing => &mut self.backing,
        };
        match &cmd.op {
            IoOp::Read { offset, len } => Ok(Some(Bytes::copy_from_slice(
                &dev[*offset as usize..*offset as usize + *len as usize],
            ))),
            IoOp::Write { offset, data, .. } => {
                if let Some(g) = cmd.group {
                    self.groups.stage(g, *offset, data.clone());
                } else {
                    dev[*offset as usize..*offset as usize + data.len()].copy_from_slice(data);
                }
                Ok(None)
            }
            IoOp::GroupBegin { group } => {
                self.groups.begin(*group);
                Ok(None)
            }
            IoOp::GroupEnd { group } => {
                for (off, d) in self.groups.end(*group) {
                    self.backing[off as usize..off as usize + d.len()].copy_from_slice(&d);
                }
                Ok(None)
            }
            IoOp::Checksum { offset, len } => Ok(Some(Bytes::copy_from_slice(
                &crate::layout::data_crc(&dev[*offset as usize..(*offset + *len as u64) as usize])
                    .to_le_bytes(),
            ))),
            IoOp::Flush | IoOp::Trim { .. } => Ok(None),
        }
    }

    /// Complete one in-flight command, chosen by `pick(n)` among `n`.
    pub fn step(&mut self, pick: &mut dyn FnMut(usize) -> usize) -> bool {
        self.collect();
        if self.inflight.is_empty() {
            if let Some(t) = self.engine.poll_timeout() {
                self.now = self.now.max(t);
                self.engine.handle_timeout(self.now);
                self.collect();
                return !self.inflight.is_empty();
            }
            return false;
        }
        let i = pick(self.inflight.len());
        let cmd = self.inflight.remove(i).unwrap();
        let res = self.execute(&cmd);
        self.now += 1;
        self.engine.handle_completion(self.now, cmd.id, res);
        self.collect();
        true
    }

    /// Complete in-flight command `i` with EIO, without running it.
    pub fn complete_failed(&mut self, i: usize) {
        self.complete_torn(i, 0);
    }

    /// Complete in-flight command `i` as a torn write that failed: its first
    /// `keep` bytes reach the device (as a device that loses power, or
    /// fails, in the middle of a write may leave them), and the command
    /// completes with EIO. With `keep > 0`, command `i` MUST be a write
    /// without a group; with 0 it may be any command (`complete_failed`).
    pub fn complete_torn(&mut self, i: usize, keep: usize) {
        self.collect();
        let cmd = self.inflight.remove(i).expect("no such command in flight");
        if keep > 0 {
            let IoOp::Write { offset, data, .. } = &cmd.op else {
                panic!("complete_torn: not a write: {cmd:?}");
            };
            assert!(cmd.group.is_none(), "complete_torn: a group write");
            let dev = match cmd.dev {
                Dev::Cache => &mut self.cache,
                Dev::Backing => &mut self.backing,
            };
            let keep = keep.min(data.len());
            dev[*offset as usize..*offset as usize + keep].copy_from_slice(&data[..keep]);
        }
        self.now += 1;
        self.engine
            .handle_completion(self.now, cmd.id, Err(IoError::Eio));
        self.collect();
    }

    /// Run until reply `id` arrives; returns it.
    pub fn wait(&mut self, id: ReqId, pick: &mut dyn FnMut(usize) -> usize) -> Reply<Bytes> {
        for _ in 0..10_000_000 {
            if let Some(i) = self.replies.iter().position(|r| r.id == id) {
                return self.replies.remove(i);
            }
            if !self.step(pick) {
                // Idle: let timers fire.
                self.now += 1_000_000_000;
                self.engine.handle_timeout(self.now);
                self.collect();
            }
        }
        panic!(
            "request {id} never completed: {}",
            self.engine.debug_state()
        );
    }

    /// Run until the engine is idle and nothing is in flight.
    pub fn settle(&mut self, pick: &mut dyn FnMut(usize) -> usize) {
        for _ in 0..10_000_000 {
            if !self.step(pick) && self.engine.is_idle() {
                return;
            }
        }
        panic!("engine never settled: {}", self.engine.debug_state());
    }
}

/// A plain (non-FUA) write of `len` bytes of `byte` at `offset`.
pub fn write_filled(offset: u64, byte: u8, len: u64) -> ReqOp<Bytes> {
    ReqOp::Write {
        offset,
        data: Bytes::from(vec![byte; len as usize]),
        fua: false,
    }
}
