//! The handshake up to transmission, client side of it: the server
//! greeting, the client flags and every option request (`NBD_OPT_*`).

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::CodecError;

use super::wire::{
    assert_wire_string, decode_string, put_prefixed_string, u32_len, wire_header, Rd, WireInt,
};
use super::{opt, IHAVEOPT, NBDMAGIC};

/// Length of the newstyle server greeting: NBDMAGIC, IHAVEOPT, 16-bit flags.
pub const GREETING_LEN: usize = 18;

/// Encode the newstyle greeting `S: NBDMAGIC, IHAVEOPT, handshake flags`.
pub fn encode_server_greeting(handshake_flags: u16) -> [u8; GREETING_LEN] {
    let mut b = [0u8; GREETING_LEN];
    let mut w = &mut b[..];
    w.put_u64(NBDMAGIC);
    w.put_u64(IHAVEOPT);
    w.put_u16(handshake_flags);
    b
}

/// Decode the newstyle greeting; returns the handshake flags.
/// Oldstyle servers (second magic `cliserv_magic`) are rejected as `BadMagic`.
pub fn decode_server_greeting(buf: &[u8]) -> Result<u16, CodecError> {
    let mut r = Rd::new(buf, "server greeting");
    r.magic(NBDMAGIC)?;
    r.what = "server greeting (newstyle)";
    r.magic(IHAVEOPT)?;
    r.u16()
}

/// Encode the 32-bit client flags.
pub fn encode_client_flags(flags: u32) -> [u8; 4] {
    flags.to_be_bytes()
}

/// Decode the 32-bit client flags (unknown bits are returned as-is; the
/// caller MUST drop the connection if any are outside [`client_flags::KNOWN`]).
pub fn decode_client_flags(buf: &[u8]) -> Result<u32, CodecError> {
    Rd::new(buf, "client flags").u32()
}

wire_header! {
    /// The fixed 16-byte header of an option request: IHAVEOPT, option, length.
    OptionHeader, "option header", magic u64 = IHAVEOPT;
    /// The `NBD_OPT_*` code.
    option: u32,
    /// Length of the option data that follows.
    length: u32,
}

/// Encode a complete option request (header + data) for any option code.
pub fn encode_option(option: u32, data: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(OptionHeader::LEN + data.len());
    b.put_slice(
        &OptionHeader {
            option,
            length: u32_len(data.len()),
        }
        .encode(),
    );
    b.put_slice(data);
    b.freeze()
}

/// Data of `NBD_OPT_INFO` / `NBD_OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    /// Export name ("" = default export).
    pub name: String,
    /// Requested `NBD_INFO_*` items.
    pub requests: Vec<u16>,
}

impl InfoRequest {
    /// Encode the option data (not the header).
    pub fn encode_data(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(4 + self.name.len() + 2 + 2 * self.requests.len());
        put_prefixed_string(&mut b, &self.name);
        b.put_u16(u16::try_from(self.requests.len()).expect("at most 65535 info requests"));
        for r in &self.requests {
            b.put_u16(*r);
        }
        b.freeze()
    }

    /// Decode the option data. The layout MUST be consumed exactly:
    /// `4 + name_len + 2 + 2 * n == data.len()`.
    pub fn decode_data(data: &[u8]) -> Result<Self, CodecError> {
        let what = "NBD_OPT_INFO/GO data";
        if data.len() < 6 {
            return Err(CodecError::Truncated {
                what,
                need: 6,
                have: data.len(),
            });
        }
        let mut r = Rd::new(data, what);
        let name_len = r.u32()? as usize;
        if name_len > data.len() - 6 {
            return Err(CodecError::Malformed {
                what,
                reason: format!(
                    "name length {name_len} exceeds option length {} - 6",
                    data.len()
                ),
            });
        }
        let name = r.string(name_len)?;
        let n = r.u16()? as usize;
        if r.remaining() != 2 * n {
            return Err(CodecError::Malformed {
                what,
                reason: format!(
                    "{n} information requests need {} bytes, {} present",
                    2 * n,
                    r.remaining()
                ),
            });
        }
        let mut requests = Vec::with_capacity(n);
        for _ in 0..n {
            requests.push(r.u16()?);
        }
        r.finish()?;
        Ok(InfoRequest { name, requests })
    }
}

/// Data of `NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextRequest {
    /// Export the contexts are for.
    pub export: String,
    /// Queries such as `base:allocation` or `base:`.
    pub queries: Vec<String>,
}

impl MetaContextRequest {
    /// Encode the option data.
    pub fn encode_data(&self) -> Bytes {
        let mut b = BytesMut::new();
        put_prefixed_string(&mut b, &self.export);
        b.put_u32(u32_len(self.queries.len()));
        for q in &self.queries {
            put_prefixed_string(&mut b, q);
        }
        b.freeze()
    }

    /// Decode the option data; every length MUST stay inside the option and
    /// the data MUST be consumed exactly (else the server replies ERR_INVALID).
    pub fn decode_data(data: &[u8]) -> Result<Self, CodecError> {
        let what = "meta context option data";
        let mut r = Rd::new(data, what);
        let export = r.prefixed_string("export name")?;
        let n = r.u32()? as usize;
        // Every query needs at least 4 bytes; reject absurd counts before allocating.
        if n > r.remaining() / 4 {
            return Err(CodecError::Malformed {
                what,
                reason: format!("{n} queries cannot fit in {} bytes", r.remaining()),
            });
        }
        let mut queries = Vec::with_capacity(n);
        for _ in 0..n {
            queries.push(r.prefixed_string("query")?);
        }
        r.finish()?;
        Ok(MetaContextRequest { export, queries })
    }
}

/// A parsed option request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientOption {
    /// `NBD_OPT_EXPORT_NAME`: enter transmission on this export (no error possible).
    ExportName(String),
    /// `NBD_OPT_ABORT` (any data is ignored, per spec).
    Abort,
    /// `NBD_OPT_LIST`.
    List,
    /// `NBD_OPT_STARTTLS`.
    StartTls,
    /// `NBD_OPT_INFO`.
    Info(InfoRequest),
    /// `NBD_OPT_GO`.
    Go(InfoRequest),
    /// `NBD_OPT_STRUCTURED_REPLY`.
    StructuredReply,
    /// `NBD_OPT_LIST_META_CONTEXT`.
    ListMetaContext(MetaContextRequest),
    /// `NBD_OPT_SET_META_CONTEXT`.
    SetMetaContext(MetaContextRequest),
    /// Any option this implementation does not know (the data is dropped).
    Unknown(u32),
}

impl ClientOption {
    /// The `NBD_OPT_*` code.
    pub fn code(&self) -> u32 {
        match self {
            ClientOption::ExportName(_) => opt::EXPORT_NAME,
            ClientOption::Abort => opt::ABORT,
            ClientOption::List => opt::LIST,
            ClientOption::StartTls => opt::STARTTLS,
            ClientOption::Info(_) => opt::INFO,
            ClientOption::Go(_) => opt::GO,
            ClientOption::StructuredReply => opt::STRUCTURED_REPLY,
            ClientOption::ListMetaContext(_) => opt::LIST_META_CONTEXT,
            ClientOption::SetMetaContext(_) => opt::SET_META_CONTEXT,
            ClientOption::Unknown(c) => *c,
        }
    }

    /// True if this implementation understands option `code`.
    pub fn is_known(code: u32) -> bool {
        matches!(
            code,
            opt::EXPORT_NAME
                | opt::ABORT
                | opt::LIST
                | opt::STARTTLS
                | opt::INFO
                | opt::GO
                | opt::STRUCTURED_REPLY
                | opt::LIST_META_CONTEXT
                | opt::SET_META_CONTEXT
        )
    }

    /// Parse option `code` with its `data`. Unknown codes parse successfully
    /// as [`ClientOption::Unknown`] so that the server can reply ERR_UNSUP
    /// and keep going; syntactically invalid known options yield an error
    /// (the server replies ERR_INVALID).
    pub fn parse(code: u32, data: &[u8]) -> Result<Self, CodecError> {
        let no_data = |what: &'static str| {
            if data.is_empty() {
                Ok(())
            } else {
                Err(CodecError::Malformed {
                    what,
                    reason: format!("option MUST NOT carry data, got {} bytes", data.len()),
                })
            }
        };
        Ok(match code {
            opt::EXPORT_NAME => ClientOption::ExportName(decode_string(data, "export name")?),
            opt::ABORT => ClientOption::Abort,
            opt::LIST => {
                no_data("NBD_OPT_LIST")?;
                ClientOption::List
            }
            opt::STARTTLS => {
                no_data("NBD_OPT_STARTTLS")?;
                ClientOption::StartTls
            }
            opt::INFO => ClientOption::Info(InfoRequest::decode_data(data)?),
            opt::GO => ClientOption::Go(InfoRequest::decode_data(data)?),
            opt::STRUCTURED_REPLY => {
                no_data("NBD_OPT_STRUCTURED_REPLY")?;
                ClientOption::StructuredReply
            }
            opt::LIST_META_CONTEXT => {
                ClientOption::ListMetaContext(MetaContextRequest::decode_data(data)?)
            }
            opt::SET_META_CONTEXT => {
                ClientOption::SetMetaContext(MetaContextRequest::decode_data(data)?)
            }
            other => ClientOption::Unknown(other),
        })
    }

    /// Encode the full option request (header + data).
    pub fn encode(&self) -> Bytes {
        let data: Bytes = match self {
            ClientOption::ExportName(n) => {
                assert_wire_string(n);
                Bytes::copy_from_slice(n.as_bytes())
            }
            ClientOption::Info(r) | ClientOption::Go(r) => r.encode_data(),
            ClientOption::ListMetaContext(r) | ClientOption::SetMetaContext(r) => r.encode_data(),
            _ => Bytes::new(),
        };
        encode_option(self.code(), &data)
    }
}
#[cfg(test)]
mod tests {
    //! Byte vectors below are written by hand from the layouts in proto.md.
    use super::*;
    use crate::proto::wire::hex;
    use crate::proto::*;

    #[test]
    fn greeting_bytes() {
        // "NBDMAGIC" "IHAVEOPT" flags=FIXED_NEWSTYLE|NO_ZEROES (0x0003)
        let g =
            encode_server_greeting(handshake_flags::FIXED_NEWSTYLE | handshake_flags::NO_ZEROES);
        let mut want = b"NBDMAGICIHAVEOPT".to_vec();
        want.extend_from_slice(&[0x00, 0x03]);
        assert_eq!(g.to_vec(), want);
        assert_eq!(decode_server_greeting(&g).unwrap(), 3);
        // Oldstyle greeting: second magic is cliserv_magic 0x00420281861253.
        let mut old = b"NBDMAGIC".to_vec();
        old.extend_from_slice(&hex("0000420281861253"));
        old.extend_from_slice(&[0, 0]);
        assert!(matches!(
            decode_server_greeting(&old),
            Err(CodecError::BadMagic { .. })
        ));
        assert!(matches!(
            decode_server_greeting(&g[..10]),
            Err(CodecError::Truncated { .. })
        ));
    }

    #[test]
    fn client_flags_bytes() {
        assert_eq!(encode_client_flags(3), [0, 0, 0, 3]);
        assert_eq!(decode_client_flags(&[0, 0, 0, 1]).unwrap(), 1);
        assert!(decode_client_flags(&[0, 0]).is_err());
    }

    #[test]
    fn option_header_and_go() {
        // IHAVEOPT, option 7 (GO), length 10: name_len=4 "disk", 1 request: BLOCK_SIZE(3)
        let want = hex("49484156454f5054 00000007 0000000c
             00000004 6469736b 0001 0003");
        let opt = ClientOption::Go(InfoRequest {
            name: "disk".into(),
            requests: vec![info::BLOCK_SIZE],
        });
        let enc = opt.encode();
        // length field is 4+4+2+2 = 12
        assert_eq!(enc.to_vec(), want);
        let h = OptionHeader::decode(&enc[..16]).unwrap();
        assert_eq!(
            h,
            OptionHeader {
                option: opt::GO,
                length: 12
            }
        );
        assert_eq!(ClientOption::parse(h.option, &enc[16..]).unwrap(), opt);
    }

    #[test]
    fn option_header_bad_magic() {
        let mut b = OptionHeader {
            option: 1,
            length: 0,
        }
        .encode();
        b[0] ^= 0xff;
        assert!(matches!(
            OptionHeader::decode(&b),
            Err(CodecError::BadMagic { .. })
        ));
    }

    #[test]
    fn info_request_malformed_lengths() {
        // Too short for the fixed fields.
        assert!(InfoRequest::decode_data(&hex("0000000000")).is_err());
        // name_len 100 > len - 6.
        assert!(InfoRequest::decode_data(&hex("00000064 0000")).is_err());
        // name_len 0, nreq 2 but only one request present.
        assert!(InfoRequest::decode_data(&hex("00000000 0002 0001")).is_err());
        // Trailing byte.
        assert!(InfoRequest::decode_data(&hex("00000000 0000 ff")).is_err());
        // name_len 0xffffffff must not overflow.
        assert!(InfoRequest::decode_data(&hex("ffffffff 0000")).is_err());
        // Invalid UTF-8 name.
        assert!(InfoRequest::decode_data(&hex("00000001 ff 0000")).is_err());
        // Minimal valid: default export, no requests.
        assert_eq!(
            InfoRequest::decode_data(&hex("00000000 0000")).unwrap(),
            InfoRequest {
                name: String::new(),
                requests: vec![]
            }
        );
    }

    #[test]
    fn meta_context_request_roundtrip_and_malformed() {
        let req = MetaContextRequest {
            export: "".into(),
            queries: vec!["base:allocation".into()],
        };
        let d = req.encode_data();
        let want = hex("00000000 00000001 0000000f 626173653a616c6c6f636174696f6e");
        assert_eq!(d.to_vec(), want);
        assert_eq!(MetaContextRequest::decode_data(&d).unwrap(), req);
        // Query length beyond the data.
        assert!(MetaContextRequest::decode_data(&hex("00000000 00000001 00000010 6162")).is_err());
        // Huge query count must not allocate / panic.
        assert!(MetaContextRequest::decode_data(&hex("00000000 ffffffff")).is_err());
        // Export name length beyond data.
        assert!(MetaContextRequest::decode_data(&hex("00000009 00")).is_err());
        // Trailing garbage.
        assert!(MetaContextRequest::decode_data(&hex("00000000 00000000 00")).is_err());
    }

    #[test]
    fn parse_options_rules() {
        assert_eq!(
            ClientOption::parse(opt::ABORT, b"junk").unwrap(),
            ClientOption::Abort
        );
        assert!(ClientOption::parse(opt::LIST, b"x").is_err());
        assert_eq!(
            ClientOption::parse(opt::LIST, b"").unwrap(),
            ClientOption::List
        );
        assert!(ClientOption::parse(opt::STRUCTURED_REPLY, b"x").is_err());
        assert_eq!(
            ClientOption::parse(0x1234, b"whatever").unwrap(),
            ClientOption::Unknown(0x1234)
        );
        assert_eq!(
            ClientOption::parse(opt::EXPORT_NAME, b"abc").unwrap(),
            ClientOption::ExportName("abc".into())
        );
        assert!(ClientOption::parse(opt::EXPORT_NAME, b"a\0b").is_err());
        assert!(ClientOption::parse(opt::EXPORT_NAME, &vec![b'a'; 4097]).is_err());
    }
}
