//! Helpers shared by the policies' unit tests.

use crate::BlockId;

/// A pin predicate that pins no block.
pub(crate) fn none(_: BlockId) -> bool {
    false
}
