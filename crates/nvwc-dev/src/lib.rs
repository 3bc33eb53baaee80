//! Device filters shared by `nvwc serve` (its fault layer) and the live
//! harnesses (`nvwc-harness`): the volatile write cache that models a host
//! crash ([`volatile`]), the one random generator both use ([`rng`]), the
//! one encoder of self-identifying sectors that the VOPR and the live
//! harnesses write ([`stamp`]), and the one atomic-group stager of the
//! server's devices and the VOPR's disk ([`group`]).
//! The block-device interface with stacking filters (issue 19, part 2)
//! grows here.

pub mod group;
pub mod rng;
pub mod stamp;
pub mod volatile;
