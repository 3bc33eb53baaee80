//! The block-device layer of nvwc, shared by `nvwc serve`, the VOPR and
//! the live harnesses (`nvwc-harness`):
//!
//! - the one device interface, [`block::BlockDevice`], which a file
//!   implements ([`block`]), and the in-memory twin, the VOPR's disk
//!   ([`mem`]);
//! - filters stacked on it: atomic groups through the one redo log
//!   ([`redo`], over the one stager, [`group`]: the engine's, re-exported),
//!   injected faults
//!   ([`fault`], from the rule language of [`rules`]), and the volatile
//!   write cache that models a host crash ([`hostcrash`], over the model
//!   and side log of [`volatile`]);
//! - the one random generator of the fault layers and harnesses ([`rng`]),
//!   and the one encoder of the self-identifying sectors that the VOPR and
//!   the live harnesses write ([`stamp`]).

pub mod block;
pub mod fault;
pub use nvwc_core::group;
pub mod hostcrash;
pub mod mem;
pub mod redo;
pub mod rng;
pub mod rules;
pub mod stamp;
pub mod volatile;
