//! Self-identifying sectors: the one encoder of the data that the VOPR, the
//! crash test and the load test write, so that a sector read back names the
//! write it came from, or shows that no write made it.
//!
//! Each 512-byte sector holds a 32-byte header (a magic, then the [`Stamp`]:
//! `run`, `version` and `sector`, little-endian) and a fill that is a pure
//! function of the header. A sector that is stale names an older version, a
//! misplaced one names another address, one of another run names that run,
//! and one torn or damaged inside fails the fill check: [`read`] then gives
//! `None`, as it does for zeroes.

use crate::rng::Rng;

/// The unit a stamp covers, in bytes.
pub const SECTOR: usize = 512;

const MAGIC: u64 = 0x4e56_5743_5354_4d50; // "NVWCSTMP"
const HEADER: usize = 32;

/// Who wrote a sector: `run` (a run's nonce or a client's id), `version`
/// (the write's id or sequence number) and the address it was written for
/// (`sector`, in 512-byte units).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub run: u64,
    pub version: u64,
    pub sector: u64,
}

impl Stamp {
    /// The fill's generator: a different stream for each header.
    fn fill_rng(&self) -> Rng {
        let mut mix = Rng::new(self.run);
        let a = mix.next_u64() ^ self.version;
        let mut mix = Rng::new(a);
        Rng::new(mix.next_u64() ^ self.sector)
    }

    /// Write this stamp over one sector. `buf` MUST be [`SECTOR`] bytes.
    pub fn write(&self, buf: &mut [u8]) {
        assert_eq!(buf.len(), SECTOR, "a stamp MUST cover exactly one sector");
        buf[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        buf[8..16].copy_from_slice(&self.run.to_le_bytes());
        buf[16..24].copy_from_slice(&self.version.to_le_bytes());
        buf[24..32].copy_from_slice(&self.sector.to_le_bytes());
        let mut rng = self.fill_rng();
        for w in buf[HEADER..].chunks_exact_mut(8) {
            w.copy_from_slice(&rng.next_u64().to_le_bytes());
        }
    }
}

/// Stamp consecutive sectors: sector `i` of `buf` gets
/// `(run, version, first_sector + i)`. `buf.len()` MUST be a multiple of
/// [`SECTOR`].
pub fn fill(buf: &mut [u8], run: u64, version: u64, first_sector: u64) {
    assert_eq!(buf.len() % SECTOR, 0, "stamped data MUST be whole sectors");
    for (i, s) in buf.chunks_exact_mut(SECTOR).enumerate() {
        let sector = first_sector + i as u64;
        Stamp {
            run,
            version,
            sector,
        }
        .write(s);
    }
}

/// The stamp a sector read at address `sector` holds: `None` unless it is
/// exactly what [`Stamp::write`] wrote for that address (zeroes, garbage, a
/// tear inside the sector or a misplaced sector all give `None`). `buf` MUST
/// be [`SECTOR`] bytes.
pub fn read(buf: &[u8], sector: u64) -> Option<Stamp> {
    assert_eq!(buf.len(), SECTOR, "a stamp MUST cover exactly one sector");
    let word = |i: usize| u64::from_le_bytes(buf[i..i + 8].try_into().unwrap());
    if word(0) != MAGIC || word(24) != sector {
        return None;
    }
    let st = Stamp {
        run: word(8),
        version: word(16),
        sector,
    };
    let mut rng = st.fill_rng();
    buf[HEADER..]
        .chunks_exact(8)
        .all(|w| w == rng.next_u64().to_le_bytes())
        .then_some(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_every_field_counts() {
        let mut b = vec![0u8; 4 * SECTOR];
        fill(&mut b, 7, 3, 40);
        for i in 0..4 {
            let s = read(&b[i * SECTOR..(i + 1) * SECTOR], 40 + i as u64);
            assert_eq!(
                s,
                Some(Stamp {
                    run: 7,
                    version: 3,
                    sector: 40 + i as u64
                })
            );
        }
        // Read at another address: misplaced.
        assert_eq!(read(&b[..SECTOR], 41), None);
        // Another run, version or address gives another fill.
        let base = &b[HEADER..SECTOR];
        for (run, version, sector) in [(8, 3, 40), (7, 4, 40), (7, 3, 41)] {
            let mut o = vec![0u8; SECTOR];
            fill(&mut o, run, version, sector);
            assert_ne!(&o[HEADER..], base);
        }
    }

    #[test]
    fn zeroes_and_damage_are_no_stamp() {
        assert_eq!(read(&[0u8; SECTOR], 0), None);
        let mut b = vec![0u8; SECTOR];
        fill(&mut b, 1, 2, 3);
        // A tear inside the sector: the last bytes of another version.
        let mut other = vec![0u8; SECTOR];
        fill(&mut other, 1, 5, 3);
        b[SECTOR - 8..].copy_from_slice(&other[SECTOR - 8..]);
        assert_eq!(read(&b, 3), None);
        // The header of another version over this fill.
        fill(&mut b, 1, 2, 3);
        b[16..24].copy_from_slice(&5u64.to_le_bytes());
        assert_eq!(read(&b, 3), None);
    }
}
