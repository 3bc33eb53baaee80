//! The server's answers during the handshake: option reply headers and
//! the data of `NBD_REP_SERVER`, `NBD_REP_INFO`, `NBD_REP_META_CONTEXT`, and
//! the old `NBD_OPT_EXPORT_NAME` reply.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::CodecError;

use super::wire::{
    assert_wire_string, decode_string, put_prefixed_string, u32_len, wire_header, Rd, WireInt,
};
use super::{info, OPTION_REPLY_MAGIC};

wire_header! {
    /// The fixed 20-byte header of an option reply.
    OptionReplyHeader, "option reply header", magic u64 = OPTION_REPLY_MAGIC;
    /// The option being replied to.
    option: u32,
    /// `NBD_REP_*`.
    reply_type: u32,
    /// Length of the reply data.
    length: u32,
}

/// Encode a complete option reply.
pub fn encode_option_reply(option: u32, reply_type: u32, data: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(OptionReplyHeader::LEN + data.len());
    b.put_slice(
        &OptionReplyHeader {
            option,
            reply_type,
            length: u32_len(data.len()),
        }
        .encode(),
    );
    b.put_slice(data);
    b.freeze()
}

/// Payload of `NBD_REP_SERVER` (one export in an `NBD_OPT_LIST` answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerEntry {
    /// Export name.
    pub name: String,
    /// Free-form description ("" if none).
    pub description: String,
}

impl ServerEntry {
    /// Encode the reply data.
    pub fn encode_data(&self) -> Bytes {
        assert_wire_string(&self.description);
        let mut b = BytesMut::with_capacity(4 + self.name.len() + self.description.len());
        put_prefixed_string(&mut b, &self.name);
        b.put_slice(self.description.as_bytes());
        b.freeze()
    }

    /// Decode the reply data.
    pub fn decode_data(data: &[u8]) -> Result<Self, CodecError> {
        let what = "NBD_REP_SERVER";
        let mut r = Rd::new(data, what);
        let name = r.prefixed_string("name")?;
        let description = decode_string(r.rest(), what)?;
        Ok(ServerEntry { name, description })
    }
}

/// Payload of `NBD_REP_INFO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InfoReply {
    /// `NBD_INFO_EXPORT`: size and transmission flags.
    Export {
        /// Export size in bytes.
        size: u64,
        /// Transmission flags.
        flags: u16,
    },
    /// `NBD_INFO_NAME`: canonical export name.
    Name(String),
    /// `NBD_INFO_DESCRIPTION`.
    Description(String),
    /// `NBD_INFO_BLOCK_SIZE`.
    BlockSize {
        /// Minimum block size.
        min: u32,
        /// Preferred block size.
        preferred: u32,
        /// Maximum payload size.
        max: u32,
    },
    /// An information type we do not understand (clients MUST ignore it).
    Unknown {
        /// The `NBD_INFO_*` value.
        kind: u16,
        /// Raw payload after the type.
        data: Bytes,
    },
}

impl InfoReply {
    /// Encode the reply data (including the 16-bit information type).
    pub fn encode_data(&self) -> Bytes {
        let mut b = BytesMut::new();
        match self {
            InfoReply::Export { size, flags } => {
                b.put_u16(info::EXPORT);
                b.put_u64(*size);
                b.put_u16(*flags);
            }
            InfoReply::Name(n) => {
                assert_wire_string(n);
                b.put_u16(info::NAME);
                b.put_slice(n.as_bytes());
            }
            InfoReply::Description(d) => {
                assert_wire_string(d);
                b.put_u16(info::DESCRIPTION);
                b.put_slice(d.as_bytes());
            }
            InfoReply::BlockSize {
                min,
                preferred,
                max,
            } => {
                b.put_u16(info::BLOCK_SIZE);
                b.put_u32(*min);
                b.put_u32(*preferred);
                b.put_u32(*max);
            }
            InfoReply::Unknown { kind, data } => {
                b.put_u16(*kind);
                b.put_slice(data);
            }
        }
        b.freeze()
    }

    /// Decode the reply data; fixed-size types MUST have their exact length.
    pub fn decode_data(data: &[u8]) -> Result<Self, CodecError> {
        let what = "NBD_REP_INFO";
        let mut r = Rd::new(data, what);
        let kind = r.u16()?;
        let exact = |r: &Rd<'_>, n: usize| {
            if r.remaining() == n {
                Ok(())
            } else {
                Err(CodecError::Malformed {
                    what,
                    reason: format!(
                        "info type {kind} needs length {}, got {}",
                        n + 2,
                        r.remaining() + 2
                    ),
                })
            }
        };
        let v = match kind {
            info::EXPORT => {
                exact(&r, 10)?;
                InfoReply::Export {
                    size: r.u64()?,
                    flags: r.u16()?,
                }
            }
            info::NAME => InfoReply::Name(decode_string(r.rest(), what)?),
            info::DESCRIPTION => InfoReply::Description(decode_string(r.rest(), what)?),
            info::BLOCK_SIZE => {
                exact(&r, 12)?;
                InfoReply::BlockSize {
                    min: r.u32()?,
                    preferred: r.u32()?,
                    max: r.u32()?,
                }
            }
            k => InfoReply::Unknown {
                kind: k,
                data: Bytes::copy_from_slice(r.rest()),
            },
        };
        Ok(v)
    }
}

/// Payload of `NBD_REP_META_CONTEXT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextEntry {
    /// Context id (SHOULD be 0 in LIST replies).
    pub id: u32,
    /// Context name, e.g. `base:allocation`.
    pub name: String,
}

impl MetaContextEntry {
    /// Encode the reply data.
    pub fn encode_data(&self) -> Bytes {
        assert_wire_string(&self.name);
        let mut b = BytesMut::with_capacity(4 + self.name.len());
        b.put_u32(self.id);
        b.put_slice(self.name.as_bytes());
        b.freeze()
    }

    /// Decode the reply data.
    pub fn decode_data(data: &[u8]) -> Result<Self, CodecError> {
        let mut r = Rd::new(data, "NBD_REP_META_CONTEXT");
        let id = r.u32()?;
        let name = decode_string(r.rest(), "NBD_REP_META_CONTEXT")?;
        Ok(MetaContextEntry { id, name })
    }
}

/// Length of the `NBD_OPT_EXPORT_NAME` reply without / with the 124 zero bytes.
pub const EXPORT_NAME_REPLY_LEN: usize = 10;
/// The reserved zero padding after an `NBD_OPT_EXPORT_NAME` reply.
pub const EXPORT_NAME_ZEROES: usize = 124;

/// Encode the reply to `NBD_OPT_EXPORT_NAME`: size, flags, and 124 zeroes
/// unless `NO_ZEROES` was negotiated by both sides.
pub fn encode_export_name_reply(size: u64, flags: u16, no_zeroes: bool) -> Bytes {
    let mut b = BytesMut::with_capacity(EXPORT_NAME_REPLY_LEN + EXPORT_NAME_ZEROES);
    b.put_u64(size);
    b.put_u16(flags);
    if !no_zeroes {
        b.put_bytes(0, EXPORT_NAME_ZEROES);
    }
    b.freeze()
}

/// Decode the first 10 bytes of an `NBD_OPT_EXPORT_NAME` reply: (size, flags).
pub fn decode_export_name_reply(buf: &[u8]) -> Result<(u64, u16), CodecError> {
    let mut r = Rd::new(buf, "export name reply");
    Ok((r.u64()?, r.u16()?))
}
#[cfg(test)]
mod tests {
    //! Byte vectors below are written by hand from the layouts in proto.md.
    use super::*;
    use crate::proto::wire::hex;
    use crate::proto::*;

    #[test]
    fn option_reply_bytes() {
        let r = encode_option_reply(opt::LIST, rep::ACK, &[]);
        assert_eq!(
            r.to_vec(),
            hex("0003e889045565a9 00000003 00000001 00000000")
        );
        let r = encode_option_reply(0xdead, rep::ERR_UNSUP, b"");
        assert_eq!(
            r.to_vec(),
            hex("0003e889045565a9 0000dead 80000001 00000000")
        );
        let h = OptionReplyHeader::decode(&r).unwrap();
        assert_eq!(h.reply_type, rep::ERR_UNSUP);
        assert!(rep::is_error(h.reply_type));
        assert_eq!(rep::ERR_TOO_BIG, 0x8000_0009);
        assert_eq!(rep::ERR_SHUTDOWN, 0x8000_0007);
    }

    #[test]
    fn info_reply_bytes() {
        let e = InfoReply::Export {
            size: 0x1_0000_0000,
            flags: 0x0d,
        };
        assert_eq!(e.encode_data().to_vec(), hex("0000 0000000100000000 000d"));
        assert_eq!(InfoReply::decode_data(&e.encode_data()).unwrap(), e);
        let bs = InfoReply::BlockSize {
            min: 512,
            preferred: 4096,
            max: 1 << 25,
        };
        assert_eq!(
            bs.encode_data().to_vec(),
            hex("0003 00000200 00001000 02000000")
        );
        assert_eq!(InfoReply::decode_data(&bs.encode_data()).unwrap(), bs);
        let n = InfoReply::Name("x".into());
        assert_eq!(n.encode_data().to_vec(), hex("0001 78"));
        // INFO_EXPORT length MUST be 12 (2 + 10).
        assert!(InfoReply::decode_data(&hex("0000 00000000")).is_err());
        assert!(InfoReply::decode_data(&hex("0003 00000200")).is_err());
        // Unknown types are preserved for the caller to ignore.
        assert!(matches!(
            InfoReply::decode_data(&hex("00ff 01")).unwrap(),
            InfoReply::Unknown { kind: 0xff, .. }
        ));
    }

    #[test]
    fn server_entry_and_meta_entry() {
        let s = ServerEntry {
            name: "a".into(),
            description: "desc".into(),
        };
        assert_eq!(s.encode_data().to_vec(), hex("00000001 61 64657363"));
        assert_eq!(ServerEntry::decode_data(&s.encode_data()).unwrap(), s);
        assert!(ServerEntry::decode_data(&hex("00000005 61")).is_err());
        let m = MetaContextEntry {
            id: 1,
            name: BASE_ALLOCATION.into(),
        };
        assert_eq!(
            m.encode_data().to_vec(),
            hex("00000001 626173653a616c6c6f636174696f6e")
        );
        assert_eq!(MetaContextEntry::decode_data(&m.encode_data()).unwrap(), m);
    }

    #[test]
    fn export_name_reply_zeroes() {
        let r = encode_export_name_reply(1 << 20, 0x0001, false);
        assert_eq!(r.len(), 134);
        assert_eq!(&r[..10], &hex("0000000000100000 0001")[..]);
        assert!(r[10..].iter().all(|&b| b == 0));
        let r = encode_export_name_reply(1 << 20, 0x0001, true);
        assert_eq!(r.len(), 10);
        assert_eq!(decode_export_name_reply(&r).unwrap(), (1 << 20, 1));
    }

    #[test]
    #[should_panic(expected = "MUST")]
    fn encode_rejects_too_long_string() {
        let _ = ServerEntry {
            name: "a".repeat(4097),
            description: String::new(),
        }
        .encode_data();
    }
}
