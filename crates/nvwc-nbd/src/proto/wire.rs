//! Shared by every codec file: the bounds-checked big-endian reader, the
//! string rules of the spec ("Conventions") and the helpers that encode them.

use bytes::{BufMut, BytesMut};

use crate::error::CodecError;

use super::{Command, MAX_STRING_LEN};

/// Bounds-checked big-endian reader over a byte slice.
pub(super) struct Rd<'a> {
    buf: &'a [u8],
    /// What is being decoded, for errors.
    pub(super) what: &'static str,
}

impl<'a> Rd<'a> {
    pub(super) fn new(buf: &'a [u8], what: &'static str) -> Self {
        Rd { buf, what }
    }
    pub(super) fn remaining(&self) -> usize {
        self.buf.len()
    }
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        if self.buf.len() < n {
            return Err(CodecError::Truncated {
                what: self.what,
                need: n,
                have: self.buf.len(),
            });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    pub(super) fn u16(&mut self) -> Result<u16, CodecError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    pub(super) fn u32(&mut self) -> Result<u32, CodecError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub(super) fn u64(&mut self) -> Result<u64, CodecError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
    /// A magic that MUST be `expected` (else `BadMagic`).
    pub(super) fn magic<T: WireInt + Into<u64> + PartialEq>(
        &mut self,
        expected: T,
    ) -> Result<(), CodecError> {
        let got = T::get(self)?;
        if got == expected {
            Ok(())
        } else {
            Err(CodecError::BadMagic {
                what: self.what,
                expected: expected.into(),
                got: got.into(),
            })
        }
    }
    pub(super) fn string(&mut self, n: usize) -> Result<String, CodecError> {
        if n > MAX_STRING_LEN {
            return Err(CodecError::BadString {
                what: self.what,
                reason: "longer than 4096 bytes",
            });
        }
        let b = self.take(n)?;
        decode_string(b, self.what)
    }
    /// A string after its 32-bit length, which MUST stay inside the data
    /// (`field` names it in the error).
    pub(super) fn prefixed_string(&mut self, field: &str) -> Result<String, CodecError> {
        let n = self.u32()? as usize;
        if n > self.remaining() {
            return Err(CodecError::Malformed {
                what: self.what,
                reason: format!("{field} length {n} exceeds the data"),
            });
        }
        self.string(n)
    }
    pub(super) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }
    pub(super) fn finish(&self) -> Result<(), CodecError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(CodecError::Malformed {
                what: self.what,
                reason: format!("{} unexpected trailing bytes", self.buf.len()),
            })
        }
    }
}

/// A fixed-size big-endian field of a header.
pub(super) trait WireInt: Copy + Sized {
    /// Encoded size.
    const LEN: usize;
    /// Append to `w` (which MUST have room).
    fn put(self, w: &mut &mut [u8]);
    /// Read from `r`.
    fn get(r: &mut Rd<'_>) -> Result<Self, CodecError>;
}

macro_rules! wire_int {
    ($($t:ty: $put:ident, $get:ident;)*) => {
        $(impl WireInt for $t {
            const LEN: usize = std::mem::size_of::<$t>();
            fn put(self, w: &mut &mut [u8]) {
                w.$put(self);
            }
            fn get(r: &mut Rd<'_>) -> Result<Self, CodecError> {
                r.$get()
            }
        })*
    };
}

wire_int! {
    u16: put_u16, u16;
    u32: put_u32, u32;
    u64: put_u64, u64;
}

impl WireInt for Command {
    const LEN: usize = 2;
    fn put(self, w: &mut &mut [u8]) {
        u16::from(self).put(w);
    }
    fn get(r: &mut Rd<'_>) -> Result<Self, CodecError> {
        r.u16().map(Command::from)
    }
}

/// Defines a fixed-size header: the struct, its encoded size `LEN`, and
/// `encode` / `decode` (the magic first, then each field in order, as its
/// [`WireInt`]). `decode` checks the magic.
macro_rules! wire_header {
    (
        $(#[$meta:meta])*
        $name:ident, $what:literal, magic $mty:ty = $magic:expr;
        $($(#[$fmeta:meta])* $field:ident: $fty:ty,)*
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name {
            $($(#[$fmeta])* pub $field: $fty,)*
        }

        impl $name {
            /// Encoded size.
            pub const LEN: usize = <$mty as WireInt>::LEN $(+ <$fty as WireInt>::LEN)*;

            /// Encode (with the magic).
            pub fn encode(&self) -> [u8; Self::LEN] {
                let mut b = [0u8; Self::LEN];
                let mut w = &mut b[..];
                WireInt::put($magic, &mut w);
                $(WireInt::put(self.$field, &mut w);)*
                b
            }

            /// Decode and check the magic.
            pub fn decode(buf: &[u8]) -> Result<Self, CodecError> {
                let mut r = Rd::new(buf, $what);
                r.magic::<$mty>($magic)?;
                Ok($name {
                    $($field: WireInt::get(&mut r)?,)*
                })
            }
        }
    };
}
pub(super) use wire_header;

pub(super) fn decode_string(b: &[u8], what: &'static str) -> Result<String, CodecError> {
    if b.len() > MAX_STRING_LEN {
        return Err(CodecError::BadString {
            what,
            reason: "longer than 4096 bytes",
        });
    }
    if b.contains(&0) {
        return Err(CodecError::BadString {
            what,
            reason: "contains NUL",
        });
    }
    String::from_utf8(b.to_vec()).map_err(|_| CodecError::BadString {
        what,
        reason: "not UTF-8",
    })
}

/// Asserts the encode-side string contract: MUST be at most 4096 bytes and
/// contain no NUL (spec "Conventions").
pub(super) fn assert_wire_string(s: &str) {
    assert!(
        s.len() <= MAX_STRING_LEN,
        "NBD strings MUST be at most {MAX_STRING_LEN} bytes (got {})",
        s.len()
    );
    assert!(!s.contains('\0'), "NBD strings MUST NOT contain NUL");
}

/// Append `s` after its 32-bit length (the encode side of
/// [`Rd::prefixed_string`]); `s` MUST be a valid NBD string.
pub(super) fn put_prefixed_string(b: &mut BytesMut, s: &str) {
    assert_wire_string(s);
    b.put_u32(u32_len(s.len()));
    b.put_slice(s.as_bytes());
}

pub(super) fn u32_len(n: usize) -> u32 {
    u32::try_from(n).expect("length MUST fit in 32 bits")
}

/// Truncate `s` to at most [`MAX_STRING_LEN`] bytes on a char boundary and
/// strip NULs, so that it may be sent as an NBD string.
pub fn sanitize_message(s: &str) -> String {
    let mut out: String = s.chars().filter(|&c| c != '\0').collect();
    if out.len() > MAX_STRING_LEN {
        let mut cut = MAX_STRING_LEN;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
    }
    out
}

/// Bytes from a hex string with whitespace (the tests' wire vectors).
#[cfg(test)]
pub(crate) fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[cfg(test)]
mod tests {
    //! Byte vectors below are written by hand from the layouts in proto.md.
    use super::*;

    #[test]
    fn sanitize_message_limits() {
        let long = "é".repeat(3000); // 6000 bytes
        let s = sanitize_message(&long);
        assert!(s.len() <= MAX_STRING_LEN);
        assert!(s.is_char_boundary(s.len()));
        assert_eq!(sanitize_message("a\0b"), "ab");
    }
}
