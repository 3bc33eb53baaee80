//! Device filters shared by `nvwc serve` (its fault layer) and the live
//! harnesses (`nvwc-harness`): the volatile write cache that models a host
//! crash ([`volatile`]), the one random generator both use ([`rng`]), and
//! the one encoder of self-identifying sectors that the VOPR and the live
//! harnesses write ([`stamp`]).
//! The block-device interface with stacking filters (issue 19, part 2)
//! grows here.

pub mod rng;
pub mod stamp;
pub mod volatile;
