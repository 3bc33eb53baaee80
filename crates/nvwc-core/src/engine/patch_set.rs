//! Patch sets: the patches of one block, kept sorted, disjoint and
//! non-adjacent as writes merge into them (see the [`super::patch`] module
//! docs for what the engine does with them).

use super::*;

/// The patches of one block. See the [`super::patch`] module docs.
#[derive(Debug)]
pub(super) struct PatchSet<P> {
    /// `(offset in block, data)`: sorted, disjoint, not adjacent.
    pub parts: Vec<(u32, P)>,
    pub bytes: u32,
    pub group: Group,
    pub first_seq: u64,
    pub last_seq: u64,
    /// Identifies this set (a set discarded and made again gets a new id).
    pub id: u64,
    /// A fetch, direct write or cache write for it is in flight.
    pub io: bool,
    /// The parts are being written (to a slot after a fetch, or directly to
    /// the backing store): a write must not merge now; it waits.
    pub frozen: bool,
    /// Direct writes still in flight, and whether one failed.
    pub direct_left: u32,
    pub direct_failed: bool,
    /// Queued for background materialisation.
    pub queued: bool,
    /// A full-block write that replaces the patches is in flight.
    pub superseding: bool,
    /// Pieces waiting for the block to be up to date (FIFO; at most one write,
    /// which holds the block busy).
    pub waiters: Vec<u32>,
}

/// Merge `data` at `start` into sorted, disjoint, non-adjacent `parts`.
/// Returns the change in patch bytes.
pub(super) fn merge_part<P: Payload>(parts: &mut Vec<(u32, P)>, start: u32, data: P) -> i64 {
    let end = start + data.len() as u32;
    // Parts that overlap or touch [start, end).
    let lo_i = parts.partition_point(|(s, d)| (s + d.len() as u32) < start);
    let hi_i = parts.partition_point(|(s, _)| *s <= end);
    if lo_i == hi_i {
        parts.insert(lo_i, (start, data));
        return (end - start) as i64;
    }
    let (fs, fd) = &parts[lo_i];
    let (ls, ld) = &parts[hi_i - 1];
    let lo = start.min(*fs);
    let hi = end.max(ls + ld.len() as u32);
    let mut pieces = Vec::with_capacity(3);
    if *fs < start {
        pieces.push(fd.slice(0..(start - fs) as usize));
    }
    pieces.push(data);
    if ls + ld.len() as u32 > end {
        pieces.push(ld.slice((end - ls) as usize..ld.len()));
    }
    let old: i64 = parts[lo_i..hi_i].iter().map(|(_, d)| d.len() as i64).sum();
    let merged = P::concat(&pieces);
    debug_assert_eq!(merged.len() as u32, hi - lo);
    parts.splice(lo_i..hi_i, std::iter::once((lo, merged)));
    (hi - lo) as i64 - old
}

#[cfg(test)]
mod tests {
    use super::merge_part;
    use bytes::Bytes;

    fn parts_bytes(parts: &[(u32, Bytes)]) -> Vec<(u32, Vec<u8>)> {
        parts.iter().map(|(s, d)| (*s, d.to_vec())).collect()
    }

    #[test]
    fn merge_keeps_parts_sorted_disjoint_and_newest() {
        let mut parts: Vec<(u32, Bytes)> = Vec::new();
        assert_eq!(merge_part(&mut parts, 10, Bytes::from(vec![1u8; 5])), 5);
        assert_eq!(merge_part(&mut parts, 30, Bytes::from(vec![2u8; 5])), 5);
        // Adjacent on the left of the first part: merges.
        assert_eq!(merge_part(&mut parts, 5, Bytes::from(vec![3u8; 5])), 5);
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].0, 5);
        // Overlapping both parts: one part, newer bytes win.
        let d = merge_part(&mut parts, 12, Bytes::from(vec![4u8; 20]));
        assert_eq!(parts.len(), 1);
        let (s, v) = &parts_bytes(&parts)[0];
        assert_eq!(*s, 5);
        let mut want = vec![3u8; 5];
        want.extend([1u8; 2]);
        want.extend([4u8; 20]);
        want.extend([2u8; 3]);
        assert_eq!(v, &want);
        assert_eq!(d, want.len() as i64 - 15);
        // Inside an existing part: no growth.
        assert_eq!(merge_part(&mut parts, 6, Bytes::from(vec![9u8; 2])), 0);
        assert_eq!(&parts_bytes(&parts)[0].1[1..3], &[9, 9]);
    }

    #[test]
    fn merge_matches_a_flat_model() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for _ in 0..200 {
            let mut parts: Vec<(u32, Bytes)> = Vec::new();
            let mut flat: Vec<Option<u8>> = vec![None; 256];
            let mut bytes = 0i64;
            for k in 0..12u8 {
                let s = rng.gen_range(0..250u32);
                let l = rng.gen_range(1..=(256 - s).min(40));
                bytes += merge_part(&mut parts, s, Bytes::from(vec![k; l as usize]));
                for x in &mut flat[s as usize..(s + l) as usize] {
                    *x = Some(k);
                }
                let mut seen: Vec<Option<u8>> = vec![None; 256];
                let mut total = 0i64;
                let mut prev_end: Option<u32> = None;
                for (ps, d) in &parts {
                    if let Some(e) = prev_end {
                        assert!(*ps > e, "parts adjacent or overlapping");
                    }
                    prev_end = Some(ps + d.len() as u32);
                    total += d.len() as i64;
                    for (i, b) in d.iter().enumerate() {
                        seen[*ps as usize + i] = Some(*b);
                    }
                }
                assert_eq!(seen, flat);
                assert_eq!(total, bytes);
            }
        }
    }
}
