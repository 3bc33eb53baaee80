//! Helpers shared by the policies' unit tests.

use crate::{BlockId, Replacement};

/// A pin predicate that pins no block.
pub(crate) fn none(_: BlockId) -> bool {
    false
}

/// Insert blocks `0..n` at lbns `lbn0..lbn0 + n`, all dirty or all clean.
pub(crate) fn fill(p: &mut impl Replacement, n: u32, lbn0: u64, dirty: bool) {
    for i in 0..n {
        p.insert(BlockId(i), lbn0 + u64::from(i), dirty);
    }
}
