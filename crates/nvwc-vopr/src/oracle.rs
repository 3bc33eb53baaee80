//! The oracle: every write, read, flush and trim of a run, with logical issue
//! and completion times, and the rules that say which sector contents each
//! check allows.
//!
//! Every 512-byte sector a write carries is stamped `(write id, sector)`
//! ([`stamp`], a self-identifying sector of `nvwc_dev::stamp`), so a sector read back names the write it came from
//! ([`decode`]). Write 0 ([`INIT`]) is the initial contents.
//!
//! **Two views of a sector.** The *client view* (checks (a) and (b)) is what
//! the engine must show its clients. After a crash and recovery it is pinned
//! to the recovered image ([`Oracle::begin_round`]): a synthetic *base* write
//! stands for every sector's recovered contents, and any other write from
//! before the crash showing up later is a resurrection. The *backing view*
//! (check (c)) is what the backing store alone may hold: a prefix of the
//! whole history. Its *era* is the latest round a write it shows belongs to:
//! a state of round `r` continues from the image recovery showed before
//! round `r`, so in it the sectors earlier crashes lost (that recovery did
//! not show: [`Oracle::mark_lost`]) no longer exist. A state showing only
//! writes of rounds before a crash may still show what that crash lost: it is
//! a point in time from before the crash.

use std::collections::HashMap;

use nvwc_dev::stamp::Stamp;

pub(crate) use crate::disk::SECTOR;

/// The run every VOPR sector carries (writes differ by version: their id).
const RUN: u64 = 0x5EC7_0B5E_AAAA_0001;
/// The initial contents of every sector.
pub(crate) const INIT: u32 = 0;

/// Fill `buf` (one sector) with the stamp of write `w` at `sector`.
pub(crate) fn stamp(buf: &mut [u8], w: u32, sector: u64) {
    Stamp {
        run: RUN,
        version: w.into(),
        sector,
    }
    .write(buf);
}

/// A decoded sector.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Val {
    W(u32),
    Zero,
    Garbage,
}

/// Which write (if any) produced the sector `buf` at `sector`.
pub(crate) fn decode(buf: &[u8], sector: u64) -> Val {
    if buf.iter().all(|&b| b == 0) {
        return Val::Zero;
    }
    match nvwc_dev::stamp::read(buf, sector) {
        Some(s) if s.run == RUN => u32::try_from(s.version).map_or(Val::Garbage, Val::W),
        _ => Val::Garbage,
    }
}

/// Sector `s` of an image.
pub(crate) fn sector_of(img: &[u8], s: u64) -> &[u8] {
    &img[(s as usize) * SECTOR..(s as usize + 1) * SECTOR]
}

#[derive(Clone, Debug)]
pub(crate) struct WriteRec {
    pub issue: u64,
    pub done: Option<u64>,
    pub ok: bool,
    pub fua: bool,
    pub zero: bool,
    pub first_sector: u64,
    pub sectors: u64,
    pub seq: u64,
    /// The round (1 before the first crash) the write was issued in.
    pub round: u32,
    /// Sectors (bit `i` = `first_sector + i`) a crash lost, per crash (the
    /// crash ending round `k`): recovery did not show them, so no state of
    /// a later round may show them.
    pub lost: Vec<(u32, u64)>,
    /// Sectors where a crash's recovery showed a write concurrent with this
    /// one: no later state must show this write there, nor must it not.
    pub unsure: Vec<(u32, u64)>,
}

impl WriteRec {
    /// A synthetic write standing for a whole image (the initial contents,
    /// or what a recovery showed), complete at `t`.
    fn whole_image(t: u64, round: u32) -> Self {
        WriteRec {
            issue: t,
            done: Some(t),
            ok: true,
            fua: true,
            zero: false,
            first_sector: 0,
            sectors: 0,
            seq: 0,
            round,
            lost: Vec::new(),
            unsure: Vec::new(),
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Op {
    pub kind: OpKind,
    pub issue: u64,
    pub done: Option<u64>,
    pub ok: bool,
    pub write: u32,
    pub first_sector: u64,
    pub sectors: u64,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum OpKind {
    Read,
    Write,
    Flush,
    Trim,
    Checkpoint,
}

/// The client view after a crash: the recovered image, as one write.
pub(crate) struct Base {
    /// The synthetic write standing for the recovered image.
    pub id: u32,
    /// The image recovery showed (the read-back of every block).
    pub image: Vec<u8>,
}

/// The oracle: every write, flush and trim, with logical issue/done times.
pub(crate) struct Oracle {
    pub writes: Vec<WriteRec>,
    pub by_sector: HashMap<u64, Vec<u32>>,
    pub ops: Vec<Op>,
    pub clock: u64,
    /// Journal transactions closed: (txn, first seq, last seq, forced, at a flush).
    pub txns: Vec<(u64, u64, u64, bool, bool)>,
    pub violations: Vec<String>,
    /// Set after the first crash ([`Oracle::begin_round`]).
    pub base: Option<Base>,
    /// The round now running (1 before the first crash).
    pub round: u32,
    /// Writes a failed backing write tore: a prefix of their data is the
    /// backing store's own state (`World::torn_version_ok` does not judge
    /// them).
    pub backing_torn: std::collections::HashSet<u32>,
}

impl Oracle {
    pub fn new() -> Self {
        let init = WriteRec::whole_image(0, 0);
        Oracle {
            writes: vec![init],
            by_sector: HashMap::new(),
            ops: Vec::new(),
            clock: 1,
            txns: Vec::new(),
            violations: Vec::new(),
            base: None,
            round: 1,
            backing_torn: Default::default(),
        }
    }

    pub fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// When `w` was acknowledged, if it succeeded (and an earlier crash did
    /// not lose it entirely).
    pub fn acked_ok(&self, w: u32) -> Option<u64> {
        let r = &self.writes[w as usize];
        if r.ok {
            r.done
        } else {
            None
        }
    }

    /// `a` completed before `b` was issued (completion→issue order).
    pub fn before(&self, a: u32, b: u32) -> bool {
        matches!(self.writes[a as usize].done, Some(d) if d < self.writes[b as usize].issue)
    }

    fn writes_to(&self, sector: u64) -> &[u32] {
        self.by_sector
            .get(&sector)
            .map(|v| v.as_slice())
            .unwrap_or(&[])
    }

    /// A write's history, for violation messages.
    pub fn describe(&self, w: u32) -> String {
        let r = &self.writes[w as usize];
        format!(
            "w{w}: round {}, issued {}, done {:?}, ok {}, fua {}, lost {:?}",
            r.round, r.issue, r.done, r.ok, r.fua, r.lost
        )
    }

    /// Was sector `s` of write `w` lost by a crash before round `era`?
    pub fn lost_before(&self, w: u32, s: u64, era: u32) -> bool {
        let r = &self.writes[w as usize];
        Self::marked(r, &r.lost, s, era)
    }

    /// Need no state of round `era` show sector `s` of write `w` (a crash
    /// before it lost the sector, or hid it under a concurrent write)?
    pub fn excused_before(&self, w: u32, s: u64, era: u32) -> bool {
        let r = &self.writes[w as usize];
        Self::marked(r, &r.lost, s, era) || Self::marked(r, &r.unsure, s, era)
    }

    fn marked(r: &WriteRec, marks: &[(u32, u64)], s: u64, era: u32) -> bool {
        s >= r.first_sector
            && s < r.first_sector + r.sectors
            && marks
                .iter()
                .any(|&(k, m)| k < era && m >> (s - r.first_sector) & 1 == 1)
    }

    /// The client view of sector `s` holding `buf`: the base write where it
    /// matches the recovered image.
    pub fn client_val(&self, buf: &[u8], s: u64) -> Val {
        match &self.base {
            Some(b) if sector_of(&b.image, s) == buf => Val::W(b.id),
            _ => decode(buf, s),
        }
    }

    /// The base write stands for a zeroed sector `s` (a zero read could
    /// also come from a write-zeroes of this round).
    fn base_is_zero(&self, s: u64) -> Option<u32> {
        let b = self.base.as_ref()?;
        sector_of(&b.image, s)
            .iter()
            .all(|&x| x == 0)
            .then_some(b.id)
    }

    /// Is `x` a value the client view may show at `s` at all: the base
    /// write, or a write issued since (before the first crash: any write to
    /// `s`, or the initial contents)?
    fn current(&self, x: u32, s: u64) -> bool {
        match &self.base {
            Some(b) => x == b.id || x > b.id && self.writes_to(s).contains(&x),
            None => x == INIT || self.writes_to(s).contains(&x),
        }
    }

    /// (a) Could a read of `sector` issued at `ri` and completed at `rc` return `v`?
    pub fn read_ok(&self, sector: u64, v: Val, ri: u64, rc: u64) -> bool {
        if v != Val::Garbage && self.trim_relaxes(sector, v, ri, rc) {
            return true;
        }
        let ws = self.writes_to(sector);
        let base = self.base.as_ref().map(|b| b.id);
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
            Val::W(w) => {
                self.current(w, sector) && fresh(w)
                    || Some(w) == base
                        && self.base_is_zero(sector).is_some()
                        && self.zero_fresh(ws, &fresh)
            }
            Val::Zero => {
                self.zero_fresh(ws, &fresh) || self.base_is_zero(sector).is_some_and(&fresh)
            }
        }
    }

    fn zero_fresh(&self, ws: &[u32], fresh: &dyn Fn(u32) -> bool) -> bool {
        let base = self.base.as_ref().map_or(0, |b| b.id);
        ws.iter()
            .any(|&w| w > base && self.writes[w as usize].zero && fresh(w))
    }

    /// A trim of `sector` leaves its contents unspecified (any value some
    /// write issued before the read completed produced, or zeroes) until a
    /// write issued after the trim completed has completed; so the read
    /// check is relaxed for a read issued at `ri` and completed at `rc` only
    /// while such a trim is not superseded (trims before the last crash are
    /// settled by the recovered image).
    pub fn trim_relaxes(&self, sector: u64, v: Val, ri: u64, rc: u64) -> bool {
        let since = self
            .base
            .as_ref()
            .map_or(0, |b| self.writes[b.id as usize].issue);
        let known = match v {
            Val::Garbage => false,
            Val::Zero => true,
            Val::W(x) => {
                x == INIT
                    || self.base.as_ref().is_some_and(|b| b.id == x)
                    || self.writes_to(sector).contains(&x) && self.writes[x as usize].issue < rc
            }
        };
        known
            && self.ops.iter().any(|t| {
                t.kind == OpKind::Trim
                    && t.issue > since
                    && t.issue < rc
                    && sector >= t.first_sector
                    && sector < t.first_sector + t.sectors
                    && !self.writes_to(sector).iter().any(|&w| {
                        let r = &self.writes[w as usize];
                        r.ok && matches!((t.done, r.done), (Some(td), Some(d)) if r.issue > td && d < ri)
                    })
            })
    }

    /// Client view: does sector `s` showing `v` keep write `w` (it shows
    /// `w`, or a write not ordered before `w`)?
    pub fn keeps(&self, s: u64, v: Val, w: u32) -> bool {
        let Some(b) = self.base.as_ref().map(|b| b.id) else {
            return self.keeps_plain(s, v, w, self.round);
        };
        // A zero write of this round, not ordered before `w`.
        let zeroed = || {
            self.writes_to(s)
                .iter()
                .any(|&x| x > b && self.writes[x as usize].zero && (x == w || !self.before(x, w)))
        };
        match v {
            Val::W(x) if x == b => !self.before(b, w) || self.base_is_zero(s).is_some() && zeroed(),
            Val::Zero => zeroed(),
            // A write from before the crash that recovery did not show.
            Val::W(x) if x < b => false,
            _ => self.keeps_plain(s, v, w, self.round),
        }
    }

    /// Backing view of [`Oracle::keeps`] in a state of round `era`: any
    /// write of the whole history, except sectors a crash before `era` lost.
    pub fn keeps_plain(&self, s: u64, v: Val, w: u32, era: u32) -> bool {
        let gone = |x: u32| self.lost_before(x, s, era);
        match v {
            Val::Garbage => false,
            Val::W(x) if x == w => !gone(x),
            Val::W(INIT) => false,
            Val::W(x) => self.writes_to(s).contains(&x) && !self.before(x, w) && !gone(x),
            Val::Zero => self.writes_to(s).iter().any(|&x| {
                self.writes[x as usize].zero && (x == w || !self.before(x, w)) && !gone(x)
            }),
        }
    }

    /// Does `v` at sector `s` show write `w`, or a write to `s` not ordered
    /// before `w` (whatever crashes lost)?
    pub fn shows_or_supersedes(&self, s: u64, v: Val, w: u32) -> bool {
        match v {
            Val::Garbage => false,
            Val::W(x) => {
                x == w || x != INIT && self.writes_to(s).contains(&x) && !self.before(x, w)
            }
            Val::Zero => self
                .writes_to(s)
                .iter()
                .any(|&x| self.writes[x as usize].zero && !self.before(x, w)),
        }
    }

    /// May the client view show `v` at `s` after recovery at all (before
    /// the first crash: anything but garbage)?
    pub fn possible(&self, s: u64, v: Val) -> bool {
        match (v, &self.base) {
            (Val::Garbage, _) => false,
            (_, None) => true,
            (Val::Zero, Some(b)) => {
                self.base_is_zero(s).is_some()
                    || self
                        .writes_to(s)
                        .iter()
                        .any(|&w| w > b.id && self.writes[w as usize].zero)
            }
            (Val::W(x), Some(_)) => self.current(x, s),
        }
    }

    /// Writes that must survive a crash with the cache intact: acknowledged
    /// FUA writes, and writes acknowledged before a FLUSH that completed
    /// successfully.
    pub fn flushed_writes(&self) -> Vec<u32> {
        let last_flush_issue = self
            .ops
            .iter()
            .filter(|op| {
                matches!(op.kind, OpKind::Flush | OpKind::Checkpoint) && op.ok && op.done.is_some()
            })
            .map(|op| op.issue)
            .max()
            .unwrap_or(0);
        (1..self.writes.len() as u32)
            .filter(|&w| {
                let r = &self.writes[w as usize];
                r.ok && matches!(r.done, Some(d) if r.fua || d < last_flush_issue)
            })
            .collect()
    }

    /// A trim issued after `w` covers `s`: `w` may be gone there.
    pub fn trimmed_after(&self, s: u64, w: u32) -> bool {
        let wi = self.writes[w as usize].issue;
        self.ops.iter().any(|op| {
            op.kind == OpKind::Trim
                && op.issue > wi
                && s >= op.first_sector
                && s < op.first_sector + op.sectors
        })
    }

    /// After the crash ending this round: mark, per write, the sectors the
    /// recovered image `got` (what the engine showed after recovery) lost,
    /// so no state of a later round accepts them. Failed or unacknowledged
    /// writes are left alone (they may be anywhere, torn).
    pub fn mark_lost(&mut self, got: &[u8]) {
        let k = self.round;
        for w in 1..self.writes.len() as u32 {
            if self.acked_ok(w).is_none() {
                continue;
            }
            let r = &self.writes[w as usize];
            let (mut lost, mut unsure) = (0u64, 0u64);
            for s in r.first_sector..r.first_sector + r.sectors {
                let v = decode(sector_of(got, s), s);
                // Lost where recovery shows something older than `w`: no
                // later state may show `w` there. Where it shows a write
                // concurrent with `w`, nothing says whether `w` survived (its
                // version may be lost while the concurrent one's was not):
                // a later state need not show `w` there (`unsure`), and may.
                // A trim does not excuse it: whatever recovery showed is what
                // the next round starts from.
                if self.lost_before(w, s, k) {
                    continue;
                }
                let bit = 1 << (s - r.first_sector);
                if !self.keeps_plain(s, v, w, k) {
                    lost |= bit;
                    continue;
                }
                let after = |x: u32| x == w || self.before(w, x);
                let shown_after = match v {
                    Val::W(x) => after(x),
                    Val::Zero => self
                        .writes_to(s)
                        .iter()
                        .any(|&x| self.writes[x as usize].zero && after(x)),
                    Val::Garbage => false,
                };
                if !shown_after {
                    unsure |= bit;
                }
            }
            if lost != 0 {
                self.writes[w as usize].lost.push((k, lost));
            }
            if unsure != 0 {
                self.writes[w as usize].unsure.push((k, unsure));
            }
        }
    }

    /// A new round of the workload starts on the engine recovered from a
    /// crash, whose clients saw `got`: pin the client view to it.
    pub fn begin_round(&mut self, got: Vec<u8>) {
        let t = self.tick();
        let id = self.writes.len() as u32;
        self.round += 1;
        self.writes.push(WriteRec::whole_image(t, self.round));
        self.base = Some(Base { id, image: got });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Record a write of `sectors` at `first`, issued and done at the given
    /// logical times.
    fn write(o: &mut Oracle, first: u64, sectors: u64, issue: u64, done: u64) -> u32 {
        let w = o.writes.len() as u32;
        o.writes.push(WriteRec {
            issue,
            done: Some(done),
            ok: true,
            fua: false,
            zero: false,
            first_sector: first,
            sectors,
            seq: w as u64,
            round: o.round,
            lost: Vec::new(),
            unsure: Vec::new(),
        });
        for s in first..first + sectors {
            o.by_sector.entry(s).or_default().push(w);
        }
        w
    }

    fn trim(o: &mut Oracle, first: u64, sectors: u64, issue: u64, done: u64) {
        o.ops.push(Op {
            kind: OpKind::Trim,
            issue,
            done: Some(done),
            ok: true,
            write: 0,
            first_sector: first,
            sectors,
        });
    }

    #[test]
    fn a_trim_relaxes_reads_only_until_a_later_write_supersedes_it() {
        let mut o = Oracle::new();
        let w1 = write(&mut o, 0, 8, 10, 11);
        trim(&mut o, 0, 8, 12, 13);
        // Right after the trim: any value a write produced, or zeroes.
        assert!(o.read_ok(3, Val::W(w1), 14, 15));
        assert!(o.read_ok(3, Val::W(INIT), 14, 15));
        assert!(o.read_ok(3, Val::Zero, 14, 15));
        let w2 = write(&mut o, 0, 8, 16, 17);
        // A read issued after the rewrite completed must see it: the
        // pre-trim data is a stale read (the old rule let it pass).
        assert!(
            !o.read_ok(3, Val::W(w1), 18, 19),
            "stale read after trim and rewrite"
        );
        assert!(!o.read_ok(3, Val::W(INIT), 18, 19));
        assert!(o.read_ok(3, Val::W(w2), 18, 19));
        // Concurrent with the rewrite: either.
        assert!(o.read_ok(3, Val::W(w1), 16, 19));
        // Never a value no write had produced when the read completed.
        let w3 = write(&mut o, 0, 8, 30, 31);
        assert!(!o.read_ok(3, Val::W(w3), 14, 15));
    }

    #[test]
    fn after_a_crash_the_client_view_is_the_recovered_image() {
        let mut o = Oracle::new();
        let w1 = write(&mut o, 0, 1, 10, 11);
        let w2 = write(&mut o, 1, 1, 12, 13);
        // Recovery showed w1 at sector 0 and the initial contents at sector
        // 1 (w2 was lost).
        let mut img = vec![0u8; 2 * SECTOR];
        stamp(&mut img[..SECTOR], w1, 0);
        stamp(&mut img[SECTOR..], INIT, 1);
        o.mark_lost(&img);
        o.clock = 50;
        assert!(!o.lost_before(w1, 0, 2));
        assert!(o.lost_before(w2, 1, 2), "lost for states after the crash");
        assert!(!o.lost_before(w2, 1, 1), "not for states from before it");
        o.begin_round(img.clone());
        let base = o.base.as_ref().unwrap().id;
        assert_eq!(o.client_val(&img[..SECTOR], 0), Val::W(base));
        // A read may show the recovered image, never the lost write.
        let mut lost = vec![0u8; SECTOR];
        stamp(&mut lost, w2, 1);
        let v = o.client_val(&lost, 1);
        assert_eq!(v, Val::W(w2));
        assert!(!o.read_ok(1, v, 100, 101), "a lost write resurrected");
        assert!(!o.possible(1, v));
        assert!(o.read_ok(1, Val::W(base), 100, 101));
        // The backing view accepts the lost sector only in a state from
        // before the crash.
        assert!(!o.keeps_plain(1, Val::W(w2), w2, 2));
        assert!(o.keeps_plain(1, Val::W(w2), w2, 1));
        // A write of this round supersedes the recovered image.
        let w3 = write(&mut o, 0, 1, 102, 103);
        assert!(!o.read_ok(0, Val::W(base), 104, 105));
        assert!(o.read_ok(0, Val::W(w3), 104, 105));
        assert!(!o.keeps(0, Val::W(base), w3), "the recovered image lost w3");
        assert!(o.keeps(0, Val::W(base), w1), "the recovered image keeps w1");
    }
}
