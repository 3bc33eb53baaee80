//! The host-crash model behind the `volatile` fault kind: a device with a
//! volatile write cache, as the in-memory twin (`mem.rs`) models one, under
//! the live server. The filter that drives it is `hostcrash.rs`.
//!
//! The device (the file) holds only what was made durable. Every write that
//! is not durable yet is a *pending* record (offset, bytes, completion
//! stamp): in RAM, and, with a side log (`volatile,log=PATH`), appended to
//! that log before the write completes, so that it outlives a `kill -9`:
//!
//! - a plain write completes once its bytes are in the device's *view*
//!   (the cache file's private mapping, `nvwc-server/src/mapped.rs`; or, for a device
//!   without one, the filter's overlay of pending records on reads) and its
//!   record is logged;
//! - a FLUSH takes the stamp at its issue, writes every record pending then
//!   to the file in completion order, syncs the file, and logs `synced`
//!   (records completed while it ran stay pending, as on a disk);
//! - a FUA write goes to the file and is synced at once; older pending
//!   records that overlap it are patched with its bytes (in RAM, and by a
//!   `durable` record in the log), so none of them can bring older bytes
//!   back over it;
//! - a journaled group's end first flushes (the redo log's sync of the
//!   backing file makes every completed write durable too), then applies.
//!
//! Every write to the file itself (flush batches, FUA writes, group ends)
//! holds one lock, so an older batch never lands over a newer durable write.
//!
//! After the kill, [`apply_crash`] replays the log and applies a random,
//! seeded subset of what is still pending onto the file, in completion
//! order: each record independently lost, kept whole, or torn (each of its
//! 512-byte sectors kept or lost at random), as `MemDisk::crash` does in the
//! VOPR. What that models, and what it does not, is in
//! `docs/ARCHITECTURE.md` ("Crash testing the live server").
//!
//! The log is a file of records `tag u8 | stamp u64 | offset u64 | len u32 |
//! bytes | crc32 u32` (little-endian; the CRC covers everything before it).
//! A cut or damaged record ends it: its write never completed. When a FLUSH
//! leaves nothing pending the log is truncated; past [`COMPACT_AT`] it is
//! rewritten with the pending records only (a new file renamed over it).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use bytes::Bytes;

/// The unit a device writes atomically, and the unit of a torn write.
pub const SECTOR: u64 = 512;

/// A log larger than this is rewritten with only what is pending.
const COMPACT_AT: u64 = 64 << 20;

const REC_WRITE: u8 = 1;
const REC_DURABLE: u8 = 2;
const REC_SYNCED: u8 = 3;
/// tag, stamp, offset, len.
const HEAD: usize = 1 + 8 + 8 + 4;

struct Pending {
    stamp: u64,
    offset: u64,
    data: Bytes,
}

struct SideLog {
    path: PathBuf,
    file: File,
    len: u64,
}

impl SideLog {
    fn open(path: PathBuf) -> io::Result<SideLog> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)?;
        drop(file);
        let file = OpenOptions::new().append(true).open(&path)?;
        Ok(SideLog { path, file, len: 0 })
    }

    fn append(&mut self, buf: &[u8]) -> io::Result<()> {
        self.file.write_all(buf)?;
        self.len += buf.len() as u64;
        Ok(())
    }
}

fn encode(out: &mut Vec<u8>, tag: u8, stamp: u64, offset: u64, data: &[u8]) {
    let start = out.len();
    out.push(tag);
    out.extend_from_slice(&stamp.to_le_bytes());
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out.extend_from_slice(data);
    let crc = crc32fast::hash(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
}

struct State {
    /// Completion stamps handed out so far.
    clock: u64,
    /// Not durable yet, in completion order.
    pending: Vec<Pending>,
    log: Option<SideLog>,
}

/// The volatile state of one device (module docs).
pub struct Volatile {
    state: Mutex<State>,
    /// Held by every write to the device itself.
    sync: Mutex<()>,
}

/// Copy the bytes of `src` (at `src_off`) that overlap `dst` (at `dst_off`) into `dst`.
fn patch(dst_off: u64, dst: &mut [u8], src_off: u64, src: &[u8]) -> bool {
    let s = dst_off.max(src_off);
    let e = (dst_off + dst.len() as u64).min(src_off + src.len() as u64);
    if s >= e {
        return false;
    }
    dst[(s - dst_off) as usize..(e - dst_off) as usize]
        .copy_from_slice(&src[(s - src_off) as usize..(e - src_off) as usize]);
    true
}

impl Volatile {
    /// Pending writes in RAM only (`log: None`: a `kill -9` loses them
    /// all), or also in a side log at `log` (created empty).
    pub fn new(log: Option<PathBuf>) -> io::Result<Volatile> {
        Ok(Volatile {
            state: Mutex::new(State {
                clock: 0,
                pending: Vec::new(),
                log: log.map(SideLog::open).transpose()?,
            }),
            sync: Mutex::new(()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("volatile state lock")
    }

    /// Taken by every write to the device itself (flush batches, FUA
    /// writes, group ends), for as long as it runs.
    pub fn sync_lock(&self) -> MutexGuard<'_, ()> {
        self.sync.lock().expect("volatile sync lock")
    }

    /// Plain writes completed, in this order: their bytes are in the
    /// device's view; they are durable only after a FLUSH issued from now on.
    pub fn completed(&self, writes: Vec<(u64, Bytes)>) -> io::Result<()> {
        let mut st = self.lock();
        let mut rec = Vec::new();
        for (offset, data) in writes {
            st.clock += 1;
            let stamp = st.clock;
            if st.log.is_some() {
                encode(&mut rec, REC_WRITE, stamp, offset, &data);
            }
            st.pending.push(Pending {
                stamp,
                offset,
                data,
            });
        }
        match &mut st.log {
            Some(l) => l.append(&rec),
            None => Ok(()),
        }
    }

    /// The stamp of a FLUSH issued now: it covers the writes completed so far.
    pub fn stamp(&self) -> u64 {
        self.lock().clock
    }

    /// A FLUSH issued at `issued` (`None`: now) runs: its stamp, and the
    /// writes it covers that are still pending (to write to the device, in
    /// this order, under [`Volatile::sync_lock`]).
    pub fn batch(&self, issued: Option<u64>) -> (u64, Vec<(u64, Bytes)>) {
        let st = self.lock();
        let stamp = issued.unwrap_or(st.clock);
        let batch = st
            .pending
            .iter()
            .filter(|p| p.stamp <= stamp)
            .map(|p| (p.offset, p.data.clone()))
            .collect();
        (stamp, batch)
    }

    /// The FLUSH issued at `stamp` completed: the writes it covered are durable.
    pub fn synced(&self, stamp: u64) -> io::Result<()> {
        let mut st = self.lock();
        st.pending.retain(|p| p.stamp > stamp);
        let State { pending, log, .. } = &mut *st;
        let Some(l) = log else { return Ok(()) };
        if pending.is_empty() {
            l.file.set_len(0)?;
            l.len = 0;
            return Ok(());
        }
        let mut rec = Vec::new();
        encode(&mut rec, REC_SYNCED, stamp, 0, &[]);
        l.append(&rec)?;
        if l.len < COMPACT_AT {
            return Ok(());
        }
        // Rewrite with the pending records only (already patched by every
        // durable write), then rename it over the log: a kill at any point
        // leaves one whole log or the other.
        let tmp = l.path.with_extension("compact");
        let mut buf = Vec::new();
        for p in pending.iter() {
            encode(&mut buf, REC_WRITE, p.stamp, p.offset, &p.data);
        }
        std::fs::write(&tmp, &buf)?;
        std::fs::rename(&tmp, &l.path)?;
        l.file = OpenOptions::new().append(true).open(&l.path)?;
        l.len = buf.len() as u64;
        Ok(())
    }

    /// A FUA write of `data` at `offset` is durable on the device: older
    /// pending writes must not bring older bytes back over it.
    pub fn durable(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut st = self.lock();
        let mut hit = false;
        for p in st.pending.iter_mut() {
            let (s, e) = (p.offset, p.offset + p.data.len() as u64);
            if s < offset + data.len() as u64 && offset < e {
                let mut d = p.data.to_vec();
                patch(p.offset, &mut d, offset, data);
                p.data = Bytes::from(d);
                hit = true;
            }
        }
        match &mut st.log {
            Some(l) if hit => {
                let mut rec = Vec::new();
                encode(&mut rec, REC_DURABLE, 0, offset, data);
                l.append(&rec)
            }
            _ => Ok(()),
        }
    }

    /// What a device without a view of its own shows: `buf` (the device's
    /// bytes at `offset`) with the pending writes over it, in order.
    pub fn overlay(&self, offset: u64, buf: &mut [u8]) {
        let st = self.lock();
        for p in &st.pending {
            patch(offset, buf, p.offset, &p.data);
        }
    }
}

// ------------------------------------------------------------------ after the crash

/// The writes a side log leaves pending, in completion order: every
/// `write` record, patched by later `durable` records and without those a
/// later `synced` record covers. Reading stops at the first cut or damaged
/// record (a write that never completed).
pub fn pending_in_log(log: &[u8]) -> Vec<(u64, Vec<u8>)> {
    let mut pending: Vec<(u64, u64, Vec<u8>)> = Vec::new();
    let mut at = 0usize;
    while log.len() >= at + HEAD + 4 {
        let h = &log[at..at + HEAD];
        let len = u32::from_le_bytes(h[17..21].try_into().expect("4 bytes")) as usize;
        let Some(end) = (at + HEAD + len).checked_add(4).filter(|&e| e <= log.len()) else {
            break;
        };
        let crc = u32::from_le_bytes(log[end - 4..end].try_into().expect("4 bytes"));
        if crc32fast::hash(&log[at..end - 4]) != crc {
            break;
        }
        let stamp = u64::from_le_bytes(h[1..9].try_into().expect("8 bytes"));
        let offset = u64::from_le_bytes(h[9..17].try_into().expect("8 bytes"));
        let data = &log[at + HEAD..end - 4];
        match h[0] {
            REC_WRITE => pending.push((stamp, offset, data.to_vec())),
            REC_DURABLE => {
                for (_, o, d) in pending.iter_mut() {
                    patch(*o, d, offset, data);
                }
            }
            REC_SYNCED => pending.retain(|p| p.0 > stamp),
            _ => break,
        }
        at = end;
    }
    pending.into_iter().map(|(_, o, d)| (o, d)).collect()
}

/// What a host crash did to one device's pending writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CrashOutcome {
    /// Writes not durable at the crash.
    pub pending: u64,
    /// ... of which none reached the device,
    pub lost: u64,
    /// ... all of it did,
    pub whole: u64,
    /// ... and some of its sectors did, not all.
    pub torn: u64,
}

/// Decide what survives of `pending` (in completion order): each write is
/// lost, kept whole, or torn (each 512-byte sector, counted from the
/// device's start, kept with probability 1/2), a third of the time each.
/// Returns the pieces to write to the device, in order.
pub fn crash_pieces(
    pending: &[(u64, Vec<u8>)],
    rng: &mut dyn FnMut() -> u64,
) -> (Vec<(u64, Vec<u8>)>, CrashOutcome) {
    let mut out = CrashOutcome {
        pending: pending.len() as u64,
        ..CrashOutcome::default()
    };
    let mut pieces = Vec::new();
    for (offset, data) in pending {
        let end = offset + data.len() as u64;
        match rng() % 3 {
            0 => out.lost += 1,
            1 => {
                out.whole += 1;
                pieces.push((*offset, data.clone()));
            }
            _ => {
                let (mut kept, mut all) = (0, 0);
                let mut s = *offset;
                while s < end {
                    let e = ((s / SECTOR + 1) * SECTOR).min(end);
                    all += 1;
                    if rng() & 1 == 1 {
                        kept += 1;
                        let d = &data[(s - offset) as usize..(e - offset) as usize];
                        match pieces.last_mut() {
                            // Adjacent kept sectors of this write: one piece.
                            Some((po, pd)) if *po + pd.len() as u64 == s && kept > 1 => {
                                pd.extend_from_slice(d)
                            }
                            _ => pieces.push((s, d.to_vec())),
                        }
                    }
                    s = e;
                }
                match kept {
                    0 => out.lost += 1,
                    k if k == all => out.whole += 1,
                    _ => out.torn += 1,
                }
            }
        }
    }
    (pieces, out)
}

/// A host crash, after the `kill -9`: read the side log at `log` (a
/// missing log: nothing pending) and write what survives of its pending
/// writes with `put` (offset, bytes), in completion order.
pub fn apply_crash(
    log: &Path,
    rng: &mut dyn FnMut() -> u64,
    put: &mut dyn FnMut(u64, &[u8]) -> io::Result<()>,
) -> io::Result<CrashOutcome> {
    let bytes = match std::fs::read(log) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    let (pieces, out) = crash_pieces(&pending_in_log(&bytes), rng);
    for (o, d) in &pieces {
        put(*o, d)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut s = seed | 1;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        }
    }

    fn b(v: u8, n: usize) -> Bytes {
        Bytes::from(vec![v; n])
    }

    /// Apply a crash to `durable` (the file) with `seed`; the image.
    fn crash(log: &Path, durable: &[u8], seed: u64) -> (Vec<u8>, CrashOutcome) {
        let mut img = durable.to_vec();
        let out = apply_crash(log, &mut rng(seed), &mut |o, d| {
            img[o as usize..o as usize + d.len()].copy_from_slice(d);
            Ok(())
        })
        .unwrap();
        (img, out)
    }

    #[test]
    fn subsets_and_tears_keep_durable_writes_and_never_resurrect() {
        let dir = std::env::temp_dir().join(format!("nvwc-volatile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("log");
        let v = Volatile::new(Some(log.clone())).unwrap();
        // The device: 8 sectors, durable contents only (what the layer writes to it).
        let mut dev = vec![0u8; 8 * 512];
        let put = |dev: &mut Vec<u8>, o: u64, d: &[u8]| {
            dev[o as usize..o as usize + d.len()].copy_from_slice(d)
        };
        // 1: sectors 0-3, then synced by a FLUSH.
        v.completed(vec![(0, b(1, 2048))]).unwrap();
        let _g = v.sync_lock();
        let (s, batch) = v.batch(None);
        for (o, d) in &batch {
            put(&mut dev, *o, d);
        }
        v.synced(s).unwrap();
        drop(_g);
        assert_eq!(
            std::fs::metadata(&log).unwrap().len(),
            0,
            "nothing pending: truncated"
        );
        // 2: sectors 0-1 (pending); 3: sectors 1-2 with FUA (durable, patches 2's sector 1);
        // 4: sectors 4-7 (pending); a FLUSH is issued; 5: sector 3 completes
        // before it runs; the FLUSH completes; 6: sectors 6-7 (pending).
        v.completed(vec![(0, b(2, 1024))]).unwrap();
        put(&mut dev, 512, &b(3, 1024));
        v.durable(512, &b(3, 1024)).unwrap();
        v.completed(vec![(2048, b(4, 2048))]).unwrap();
        let issued = v.stamp();
        v.completed(vec![(1536, b(5, 512))]).unwrap();
        // The FLUSH runs only now: 5 completed after its issue.
        let (s, batch) = v.batch(Some(issued));
        assert_eq!(batch.len(), 2);
        for (o, d) in &batch {
            put(&mut dev, *o, d);
        }
        v.synced(s).unwrap();
        v.completed(vec![(3072, b(6, 1024))]).unwrap();
        // The flush made 2 (patched) and 4 durable; 5 and 6 are pending.
        let want_durable = [2u8, 3, 3, 1, 4, 4, 4, 4];
        let sectors = |img: &[u8]| -> Vec<u8> {
            img.chunks(512)
                .map(|c| {
                    assert!(c.iter().all(|&x| x == c[0]), "a sector is never split");
                    c[0]
                })
                .collect()
        };
        assert_eq!(sectors(&dev), want_durable);
        let left = pending_in_log(&std::fs::read(&log).unwrap());
        assert_eq!(
            left.iter()
                .map(|(o, d)| (*o, d.len(), d[0]))
                .collect::<Vec<_>>(),
            vec![(1536, 512, 5), (3072, 1024, 6)]
        );
        let mut seen = std::collections::HashSet::new();
        let mut totals = CrashOutcome::default();
        for seed in 1..200u64 {
            let (img, out) = crash(&log, &dev, seed);
            // Deterministic per seed.
            assert_eq!(crash(&log, &dev, seed), (img.clone(), out));
            let got = sectors(&img);
            for (i, (&g, &d)) in got.iter().zip(&want_durable).enumerate() {
                // Each sector: its durable bytes, or a pending write's; 3 (FUA)
                // is never undone by 2, and nothing older than durable shows.
                let ok = g == d || (i == 3 && g == 5) || (i >= 6 && g == 6);
                assert!(ok, "seed {seed}: sector {i} = {g}, durable {d}");
            }
            seen.insert((got[3], got[6], got[7]));
            totals.lost += out.lost;
            totals.whole += out.whole;
            totals.torn += out.torn;
            assert_eq!(out.pending, 2);
        }
        // Every subset showed up, and each outcome happened.
        assert_eq!(seen.len(), 8, "{seen:?}");
        assert!(
            totals.lost > 0 && totals.whole > 0 && totals.torn > 0,
            "{totals:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_cut_record_ends_the_log_and_tears_follow_device_sectors() {
        let mut log = Vec::new();
        encode(&mut log, REC_WRITE, 1, 256, &[7u8; 1024]);
        encode(&mut log, REC_WRITE, 2, 4096, &[8u8; 512]);
        let whole = pending_in_log(&log);
        assert_eq!(whole.len(), 2);
        log.truncate(log.len() - 1);
        assert_eq!(
            pending_in_log(&log),
            whole[..1].to_vec(),
            "cut record ignored"
        );
        // A write at 256..1280 spans sectors 0, 1, 2 in part: torn pieces
        // start and end at sector boundaries (or the write's own ends).
        for seed in 1..100 {
            let (pieces, out) = crash_pieces(&whole[..1], &mut rng(seed));
            for (o, d) in &pieces {
                let e = o + d.len() as u64;
                assert!(*o == 256 || o.is_multiple_of(SECTOR), "{o}");
                assert!(e == 1280 || e.is_multiple_of(SECTOR), "{e}");
            }
            assert_eq!(out.lost + out.whole + out.torn, 1);
        }
    }

    #[test]
    fn overlay_shows_pending_writes_in_order() {
        let v = Volatile::new(None).unwrap();
        v.completed(vec![(0, b(1, 8)), (4, b(2, 8))]).unwrap();
        let mut got = [9u8; 16];
        v.overlay(0, &mut got);
        assert_eq!(got, [1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 9, 9, 9, 9]);
        let mut far = [9u8; 4];
        v.overlay(100, &mut far);
        assert_eq!(far, [9u8; 4]);
    }
}
