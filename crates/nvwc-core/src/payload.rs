//! Data carried through the engine.
//!
//! The engine is generic over its payload so that the live server and the VOPR
//! move real bytes ([`bytes::Bytes`]) while the simulator moves only lengths
//! ([`Phantom`]), with one code path for both.

use std::ops::Range;

/// A contiguous run of bytes (or just its length).
///
/// Implementations MUST keep `len()` consistent with every operation: for
/// example `slice(r).len() == r.len()` and `overlay(at, p).len() == self.len()`.
pub trait Payload: Clone + std::fmt::Debug + Send + 'static {
    /// Length in bytes.
    fn len(&self) -> usize;
    /// True when `len() == 0`.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// `len` zero bytes.
    fn zeroes(len: usize) -> Self;
    /// A sub-range. Caller guarantees `range.end <= self.len()`.
    fn slice(&self, range: Range<usize>) -> Self;
    /// A copy of `self` with `patch` written at byte `at`.
    /// Caller guarantees `at + patch.len() <= self.len()`.
    fn overlay(&self, at: usize, patch: &Self) -> Self;
    /// Concatenation of `parts` in order.
    fn concat(parts: &[Self]) -> Self;
    /// The payload's bytes, if it carries any (used for metadata records).
    fn from_vec(v: Vec<u8>) -> Self;
    /// The payload as bytes, if it carries any.
    fn bytes(&self) -> Option<&[u8]>;
    /// Whether payloads of this type carry bytes (false for [`Phantom`]: then
    /// the engine skips encoding metadata that nobody will read).
    const CARRIES_BYTES: bool = true;
    /// A payload of `len` bytes made by `encode` (metadata records): payloads
    /// that carry no bytes never call `encode`.
    fn encoded(len: usize, encode: impl FnOnce() -> Vec<u8>) -> Self {
        let v = encode();
        debug_assert_eq!(v.len(), len, "encoded length");
        Self::from_vec(v)
    }
}

impl Payload for bytes::Bytes {
    fn len(&self) -> usize {
        bytes::Bytes::len(self)
    }
    fn zeroes(len: usize) -> Self {
        // Up to a MiB: a view of one static zero buffer (no allocation, no
        // memset); larger: calloc, which maps fresh zero pages.
        static ZEROES: [u8; 1 << 20] = [0; 1 << 20];
        match ZEROES.get(..len) {
            Some(z) => bytes::Bytes::from_static(z),
            None => bytes::Bytes::from(vec![0u8; len]),
        }
    }
    fn slice(&self, range: Range<usize>) -> Self {
        assert!(range.end <= self.len(), "slice out of range");
        bytes::Bytes::slice(self, range)
    }
    fn overlay(&self, at: usize, patch: &Self) -> Self {
        assert!(at + patch.len() <= self.len(), "overlay out of range");
        let mut v = self.to_vec();
        v[at..at + patch.len()].copy_from_slice(patch);
        bytes::Bytes::from(v)
    }
    fn concat(parts: &[Self]) -> Self {
        if parts.len() == 1 {
            return parts[0].clone();
        }
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut v = Vec::with_capacity(total);
        for p in parts {
            v.extend_from_slice(p);
        }
        bytes::Bytes::from(v)
    }
    fn from_vec(v: Vec<u8>) -> Self {
        bytes::Bytes::from(v)
    }
    fn bytes(&self) -> Option<&[u8]> {
        Some(self)
    }
}

/// A payload that carries only its length: the simulator's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Phantom(pub usize);

impl Payload for Phantom {
    fn len(&self) -> usize {
        self.0
    }
    fn zeroes(len: usize) -> Self {
        Phantom(len)
    }
    fn slice(&self, range: Range<usize>) -> Self {
        assert!(range.end <= self.0, "slice out of range");
        Phantom(range.len())
    }
    fn overlay(&self, at: usize, patch: &Self) -> Self {
        assert!(at + patch.0 <= self.0, "overlay out of range");
        *self
    }
    fn concat(parts: &[Self]) -> Self {
        Phantom(parts.iter().map(|p| p.0).sum())
    }
    fn from_vec(v: Vec<u8>) -> Self {
        Phantom(v.len())
    }
    fn bytes(&self) -> Option<&[u8]> {
        None
    }
    const CARRIES_BYTES: bool = false;
    fn encoded(len: usize, _encode: impl FnOnce() -> Vec<u8>) -> Self {
        Phantom(len)
    }
}
