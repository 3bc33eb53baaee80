//! Transmission-phase headers: the request header, the simple reply header
//! and the structured reply chunk header, and telling replies apart by magic.

use crate::error::CodecError;

use super::wire::{wire_header, Rd, WireInt};
use super::{reply_flags, Command, REQUEST_MAGIC, SIMPLE_REPLY_MAGIC, STRUCTURED_REPLY_MAGIC};

wire_header! {
    /// The 28-byte request header.
    RequestHeader, "request header", magic u32 = REQUEST_MAGIC;
    /// `NBD_CMD_FLAG_*`.
    flags: u16,
    /// Command type.
    command: Command,
    /// Opaque cookie echoed in the reply ("handle").
    handle: u64,
    /// Byte offset.
    offset: u64,
    /// Byte length (also the payload length for WRITE).
    length: u32,
}

wire_header! {
    /// The 16-byte simple reply header (READ data, if any, follows).
    SimpleReplyHeader, "simple reply", magic u32 = SIMPLE_REPLY_MAGIC;
    /// 0 or an error value.
    error: u32,
    /// Cookie of the request.
    handle: u64,
}

wire_header! {
    /// The 20-byte structured reply chunk header.
    ChunkHeader, "structured reply chunk", magic u32 = STRUCTURED_REPLY_MAGIC;
    /// `NBD_REPLY_FLAG_*`.
    flags: u16,
    /// `NBD_REPLY_TYPE_*`.
    kind: u16,
    /// Cookie of the request.
    handle: u64,
    /// Payload length.
    length: u32,
}

impl ChunkHeader {
    /// True if `NBD_REPLY_FLAG_DONE` is set.
    pub fn is_done(&self) -> bool {
        self.flags & reply_flags::DONE != 0
    }
}

/// Either kind of reply header, distinguished by the first 4 bytes (magic).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyHeader {
    /// Simple reply.
    Simple(SimpleReplyHeader),
    /// Structured reply chunk.
    Chunk(ChunkHeader),
}

impl ReplyHeader {
    /// Given the 4-byte magic, the total header length to read (16 or 20).
    pub fn header_len(magic: [u8; 4]) -> Result<usize, CodecError> {
        match u32::from_be_bytes(magic) {
            SIMPLE_REPLY_MAGIC => Ok(SimpleReplyHeader::LEN),
            STRUCTURED_REPLY_MAGIC => Ok(ChunkHeader::LEN),
            m => Err(CodecError::BadMagic {
                what: "reply",
                expected: SIMPLE_REPLY_MAGIC as u64,
                got: m as u64,
            }),
        }
    }

    /// Decode a full header (16 or 20 bytes, starting with the magic).
    pub fn decode(buf: &[u8]) -> Result<Self, CodecError> {
        if buf.len() < 4 {
            return Err(CodecError::Truncated {
                what: "reply",
                need: 4,
                have: buf.len(),
            });
        }
        match Self::header_len([buf[0], buf[1], buf[2], buf[3]])? {
            SimpleReplyHeader::LEN => Ok(ReplyHeader::Simple(SimpleReplyHeader::decode(buf)?)),
            _ => Ok(ReplyHeader::Chunk(ChunkHeader::decode(buf)?)),
        }
    }
}

#[cfg(test)]
mod tests {
    //! Byte vectors below are written by hand from the layouts in proto.md.
    use super::*;
    use crate::proto::wire::hex;
    use crate::proto::*;

    #[test]
    fn request_header_bytes() {
        let h = RequestHeader {
            flags: cmd_flags::FUA,
            command: Command::Write,
            handle: 0x0102030405060708,
            offset: 0x1000,
            length: 0x200,
        };
        let want = hex("25609513 0001 0001 0102030405060708 0000000000001000 00000200");
        assert_eq!(h.encode().to_vec(), want);
        assert_eq!(RequestHeader::decode(&want).unwrap(), h);
        let mut bad = want.clone();
        bad[3] = 0x14; // reserved 0x25609514
        assert!(matches!(
            RequestHeader::decode(&bad),
            Err(CodecError::BadMagic { .. })
        ));
        assert!(RequestHeader::decode(&want[..27]).is_err());
        // Unknown commands round-trip.
        let mut u = want.clone();
        u[6..8].copy_from_slice(&[0x00, 0x2a]);
        assert_eq!(
            RequestHeader::decode(&u).unwrap().command,
            Command::Other(42)
        );
        for v in 0u16..=8 {
            assert_eq!(u16::from(Command::from(v)), v);
        }
    }

    #[test]
    fn simple_reply_bytes() {
        let h = SimpleReplyHeader {
            error: 22,
            handle: 7,
        };
        let want = hex("67446698 00000016 0000000000000007");
        assert_eq!(h.encode().to_vec(), want);
        assert_eq!(SimpleReplyHeader::decode(&want).unwrap(), h);
        assert_eq!(ReplyHeader::decode(&want).unwrap(), ReplyHeader::Simple(h));
        assert_eq!(
            ReplyHeader::header_len([0x67, 0x44, 0x66, 0x98]).unwrap(),
            16
        );
        assert_eq!(
            ReplyHeader::header_len([0x66, 0x8e, 0x33, 0xef]).unwrap(),
            20
        );
        assert!(ReplyHeader::header_len([0x96, 0x74, 0x46, 0x68]).is_err());
    }
}
