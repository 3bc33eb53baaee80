//! Error types shared by the codec, the server framework and the client.

use std::fmt;

/// Defines [`ErrorCode`] from one table: each code's variant, wire value,
/// spec name and the [`NbdError`] constructor named after it.
macro_rules! error_codes {
    ($($(#[$doc:meta])* $variant:ident = $value:literal, $name:literal, $ctor:ident;)*) => {
        /// The error values that may travel in the `error` field of an NBD reply
        /// (spec section "Error values"). Only these values are portable; every other
        /// failure MUST be mapped onto one of them before it reaches the wire.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u32)]
        pub enum ErrorCode {
            $($(#[$doc])* $variant = $value,)*
        }

        impl ErrorCode {
            /// All defined codes, in wire-value order.
            pub const ALL: [ErrorCode; [$($value),*].len()] = [$(ErrorCode::$variant),*];

            /// The spec's name, e.g. `NBD_EIO`.
            pub fn name(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $name,)*
                }
            }
        }

        impl NbdError {
            $(
                #[doc = concat!("`", $name, "`.")]
                pub fn $ctor(message: impl Into<String>) -> Self {
                    Self::new(ErrorCode::$variant, message)
                }
            )*
        }
    };
}

error_codes! {
    /// `NBD_EPERM` (1): operation not permitted (e.g. write to a read-only export).
    Perm = 1, "NBD_EPERM", perm;
    /// `NBD_EIO` (5): input/output error.
    Io = 5, "NBD_EIO", io;
    /// `NBD_ENOMEM` (12): cannot allocate memory.
    NoMem = 12, "NBD_ENOMEM", nomem;
    /// `NBD_EINVAL` (22): invalid argument (bad range, flags, command...).
    Inval = 22, "NBD_EINVAL", inval;
    /// `NBD_ENOSPC` (28): no space left (write beyond the end of the export).
    NoSpc = 28, "NBD_ENOSPC", nospc;
    /// `NBD_EOVERFLOW` (75): value too large.
    Overflow = 75, "NBD_EOVERFLOW", overflow;
    /// `NBD_ENOTSUP` (95): operation not supported (fast zero).
    NotSup = 95, "NBD_ENOTSUP", notsup;
    /// `NBD_ESHUTDOWN` (108): server is shutting down.
    Shutdown = 108, "NBD_ESHUTDOWN", shutdown;
}

impl ErrorCode {
    /// The value sent on the wire. Always nonzero.
    pub fn to_wire(self) -> u32 {
        self as u32
    }

    /// Decode a wire value. Returns `None` for 0 (success) and for values the
    /// spec does not define; a client SHOULD treat the latter as `EINVAL`.
    pub fn from_wire(v: u32) -> Option<ErrorCode> {
        ErrorCode::ALL.iter().copied().find(|c| c.to_wire() == v)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An NBD-level error: a portable [`ErrorCode`] plus a human-readable message.
///
/// Exports return this from their operations; the server sends `code` to the
/// client (and, with structured replies, `message` too). The client returns
/// it when the server replied with an error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct NbdError {
    /// The wire error value.
    pub code: ErrorCode,
    /// Free-form text for humans; MAY be empty. Truncated to 4096 bytes on the wire.
    pub message: String,
}

impl NbdError {
    /// Build an error with a message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        NbdError {
            code,
            message: message.into(),
        }
    }
}

impl From<ErrorCode> for NbdError {
    fn from(code: ErrorCode) -> Self {
        NbdError::new(code, "")
    }
}

impl From<std::io::Error> for NbdError {
    /// Map an OS error onto the portable set (spec: "SHOULD map the `EDQUOT`
    /// and `EFBIG` errors to `NBD_ENOSPC`"). Linux errno values.
    fn from(e: std::io::Error) -> Self {
        let code = match e.raw_os_error() {
            Some(1) | Some(13) | Some(30) => ErrorCode::Perm, // EPERM, EACCES, EROFS
            Some(12) => ErrorCode::NoMem,
            Some(22) => ErrorCode::Inval,
            Some(27) | Some(28) | Some(122) => ErrorCode::NoSpc, // EFBIG, ENOSPC, EDQUOT
            Some(75) => ErrorCode::Overflow,
            Some(95) => ErrorCode::NotSup,
            Some(108) => ErrorCode::Shutdown,
            _ => match e.kind() {
                std::io::ErrorKind::PermissionDenied => ErrorCode::Perm,
                std::io::ErrorKind::InvalidInput => ErrorCode::Inval,
                std::io::ErrorKind::OutOfMemory => ErrorCode::NoMem,
                std::io::ErrorKind::Unsupported => ErrorCode::NotSup,
                _ => ErrorCode::Io,
            },
        };
        NbdError::new(code, e.to_string())
    }
}

/// A wire-format decoding failure. Produced by the sans-IO codec; never panics.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// A magic number did not match.
    #[error("bad magic in {what}: expected {expected:#x}, got {got:#x}")]
    BadMagic {
        /// Which message was being decoded.
        what: &'static str,
        /// The magic the spec requires.
        expected: u64,
        /// The magic received.
        got: u64,
    },
    /// Fewer bytes than the structure needs.
    #[error("truncated {what}: need {need} bytes, have {have}")]
    Truncated {
        /// Which message was being decoded.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// Structurally invalid content (inconsistent lengths, trailing bytes...).
    #[error("malformed {what}: {reason}")]
    Malformed {
        /// Which message was being decoded.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// A string field was not valid UTF-8, contained NUL, or exceeded 4096 bytes.
    #[error("invalid string in {what}: {reason}")]
    BadString {
        /// Which message was being decoded.
        what: &'static str,
        /// Why.
        reason: &'static str,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_match_spec_values() {
        let expect = [1u32, 5, 12, 22, 28, 75, 95, 108];
        for (c, v) in ErrorCode::ALL.iter().zip(expect) {
            assert_eq!(c.to_wire(), v);
            assert_eq!(ErrorCode::from_wire(v), Some(*c));
        }
        assert_eq!(ErrorCode::from_wire(0), None);
        assert_eq!(ErrorCode::from_wire(2), None);
    }

    #[test]
    fn io_error_mapping() {
        let e: NbdError = std::io::Error::from_raw_os_error(122).into();
        assert_eq!(e.code, ErrorCode::NoSpc);
        let e: NbdError = std::io::Error::from_raw_os_error(27).into();
        assert_eq!(e.code, ErrorCode::NoSpc);
        let e: NbdError = std::io::Error::from_raw_os_error(5).into();
        assert_eq!(e.code, ErrorCode::Io);
        let e: NbdError = std::io::Error::from_raw_os_error(1).into();
        assert_eq!(e.code, ErrorCode::Perm);
    }
}
