//! Miss-ratio curves for nvwc.
//!
//! * [`StackDistance`]: exact Mattson LRU stack distances in `O(log M)`
//!   amortised per access (Fenwick tree over compacted timestamps).
//! * [`Histogram`] / [`Mrc`]: distance histograms and the miss-ratio curves
//!   they imply for LRU caches of every size.
//! * [`ShardsFixedRate`] / [`ShardsFixedSize`]: SHARDS sampling (FAST'15).
//! * [`kneedle()`]: Kneedle knee detection, reporting every knee.
//! * [`OnlineKnee`]: a bounded-memory, periodically recomputed knee of a
//!   stream's hit-ratio curve, for the stack-model replacement policy.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod hash;
pub mod histogram;
pub mod kneedle;
pub mod mattson;
pub mod online;
pub mod shards;

pub use hash::{mix64, MixBuildHasher, MixHasher};
pub use histogram::{Histogram, Mrc};
pub use kneedle::{kneedle, most_prominent, CurveShape, Knee, DEFAULT_SENSITIVITY};
pub use mattson::StackDistance;
pub use online::{KneeSelect, OnlineKnee, OnlineKneeConfig};
pub use shards::{
    FixedRate, FixedSize, Shards, ShardsFixedRate, ShardsFixedSize, DEFAULT_MAX_BUCKETS,
};
