//! What the workload writes and what a block read back shows. A write of
//! sequence number `seq` fills each of its 4 KiB blocks with
//! self-identifying sectors ([`nvwc_dev::stamp`]: the trial's nonce as the
//! run, `seq` as the version, the block's sectors as addresses), so each
//! sector read back names the write it came from.

use nvwc_dev::stamp;

use super::check::History;
use super::BS;

/// The unit a device writes atomically (a torn write keeps whole sectors).
pub const SECTOR: u64 = stamp::SECTOR as u64;
pub(crate) const SECTORS: usize = (BS / SECTOR) as usize;

/// The contents of block `block` as written by write `seq` of run `nonce`.
pub fn block_bytes(nonce: u64, seq: u64, block: u64) -> Vec<u8> {
    let mut b = vec![0u8; BS as usize];
    stamp::fill(&mut b, nonce, seq, block * SECTORS as u64);
    b
}

/// What a block holds.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    Zero,
    Seq(u64),
    /// Bytes no write of this run produced (torn, stale garbage, wrong block).
    Garbage,
    /// After a host crash only: each 512-byte sector holds zeroes (0) or
    /// what one write of this block put there, not all the same write: a
    /// write the crash tore, as a disk may leave one it had not made
    /// durable. Judged sector by sector.
    Torn([u64; SECTORS]),
}

impl Seen {
    /// Per sector: the write it shows (0: zeroes), or `None` for garbage.
    pub(crate) fn sectors(&self) -> Option<[u64; SECTORS]> {
        match *self {
            Seen::Zero => Some([0; SECTORS]),
            Seen::Seq(x) => Some([x; SECTORS]),
            Seen::Torn(s) => Some(s),
            Seen::Garbage => None,
        }
    }
}

/// Per sector of block `block`: 0 for zeroes, the write of run `nonce` that
/// stamped it, or `None` (garbage: no stamp of this run for this address).
fn sector_writes(nonce: u64, block: u64, b: &[u8]) -> [Option<u64>; SECTORS] {
    let mut out = [None; SECTORS];
    for (i, sec) in b.chunks(SECTOR as usize).enumerate() {
        out[i] = if sec.iter().all(|&x| x == 0) {
            Some(0)
        } else {
            stamp::read(sec, block * SECTORS as u64 + i as u64)
                .filter(|s| s.run == nonce)
                .map(|s| s.version)
        };
    }
    out
}

/// What block `block` holds, read as one write's block.
pub fn decode(nonce: u64, block: u64, b: &[u8]) -> Seen {
    let secs = sector_writes(nonce, block, b);
    match secs[0] {
        Some(w) if secs.iter().all(|&s| s == Some(w)) => {
            if w == 0 {
                Seen::Zero
            } else {
                Seen::Seq(w)
            }
        }
        _ => Seen::Garbage,
    }
}

/// What each block of `region` holds. `torn`: after a host crash, a block
/// no single write produced is read sector by sector against the writes
/// `torn` logged for it ([`Seen::Torn`]); otherwise it is garbage.
pub fn decode_region(nonce: u64, region: &[u8], torn: Option<&History>) -> Vec<Seen> {
    region
        .chunks(BS as usize)
        .enumerate()
        .map(|(b, d)| match (decode(nonce, b as u64, d), torn) {
            (Seen::Garbage, Some(h)) => decode_sectors(nonce, b as u64, d, h.seqs(b)),
            (s, _) => s,
        })
        .collect()
}

/// A block read as 512-byte sectors: [`Seen::Torn`] if every sector is
/// zeroes or the bytes one of `candidates` (writes of this block) put there,
/// else [`Seen::Garbage`].
pub fn decode_sectors(
    nonce: u64,
    block: u64,
    b: &[u8],
    candidates: impl Iterator<Item = u64>,
) -> Seen {
    let candidates: Vec<u64> = candidates.collect();
    let mut out = [0u64; SECTORS];
    for (o, s) in out.iter_mut().zip(sector_writes(nonce, block, b)) {
        match s {
            Some(x) if x == 0 || candidates.contains(&x) => *o = x,
            _ => return Seen::Garbage,
        }
    }
    Seen::Torn(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_contents_round_trip() {
        let b = block_bytes(7, 3, 9);
        assert_eq!(decode(7, 9, &b), Seen::Seq(3));
        assert_eq!(decode(7, 8, &b), Seen::Garbage, "wrong block");
        assert_eq!(decode(6, 9, &b), Seen::Garbage, "other run");
        assert_eq!(decode(7, 9, &[0u8; 4096]), Seen::Zero);
        let mut t = b.clone();
        t[4000] ^= 1;
        assert_eq!(decode(7, 9, &t), Seen::Garbage, "torn");
        // Sectors of two writes: torn, if both wrote this block.
        t[..512].copy_from_slice(&block_bytes(7, 2, 9)[..512]);
        t[512..].copy_from_slice(&b[512..]);
        assert_eq!(decode(7, 9, &t), Seen::Garbage);
        let mut want = [3; SECTORS];
        want[0] = 2;
        assert_eq!(
            decode_sectors(7, 9, &t, [3, 2].into_iter()),
            Seen::Torn(want)
        );
        assert_eq!(decode_sectors(7, 9, &t, [3].into_iter()), Seen::Garbage);
    }
}
