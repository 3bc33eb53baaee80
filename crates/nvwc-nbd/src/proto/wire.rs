//! Shared by every codec file: the bounds-checked big-endian reader, the
//! string rules of the spec ("Conventions") and the helpers that encode them.

use crate::error::CodecError;

use super::MAX_STRING_LEN;

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
    /// A 32-bit magic that MUST be `expected` (else `BadMagic`).
    pub(super) fn magic_u32(&mut self, expected: u32) -> Result<(), CodecError> {
        let got = self.u32()?;
        self.check_magic(expected.into(), got.into())
    }
    /// A 64-bit magic that MUST be `expected` (else `BadMagic`).
    pub(super) fn magic_u64(&mut self, expected: u64) -> Result<(), CodecError> {
        let got = self.u64()?;
        self.check_magic(expected, got)
    }
    fn check_magic(&self, expected: u64, got: u64) -> Result<(), CodecError> {
        if got == expected {
            Ok(())
        } else {
            Err(CodecError::BadMagic {
                what: self.what,
                expected,
                got,
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
