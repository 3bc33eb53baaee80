//! Structured reply chunk payloads (`NBD_REPLY_TYPE_*`): encoding with the
//! spec's per-type contracts, decoding with its length rules.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::CodecError;

use super::transmission::ChunkHeader;
use super::wire::{assert_wire_string, u32_len, Rd};
use super::{chunk_type, Extent};

/// A decoded structured reply chunk payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChunkPayload {
    /// `NBD_REPLY_TYPE_NONE` (MUST carry the DONE flag).
    None,
    /// `NBD_REPLY_TYPE_OFFSET_DATA`.
    OffsetData {
        /// Absolute export offset of `data`.
        offset: u64,
        /// At least one byte.
        data: Bytes,
    },
    /// `NBD_REPLY_TYPE_OFFSET_HOLE`.
    OffsetHole {
        /// Absolute export offset.
        offset: u64,
        /// Hole size, nonzero.
        len: u32,
    },
    /// `NBD_REPLY_TYPE_BLOCK_STATUS`.
    BlockStatus {
        /// Metadata context id.
        context_id: u32,
        /// One or more descriptors.
        extents: Vec<Extent>,
    },
    /// `NBD_REPLY_TYPE_ERROR`.
    Error {
        /// Nonzero error value.
        error: u32,
        /// Human-readable message.
        message: String,
    },
    /// `NBD_REPLY_TYPE_ERROR_OFFSET`.
    ErrorOffset {
        /// Nonzero error value.
        error: u32,
        /// Human-readable message.
        message: String,
        /// Offset of the failure.
        offset: u64,
    },
    /// An unknown chunk type. If `kind` has bit 15 set it is an error chunk and
    /// `error` holds its error value (when the payload was long enough).
    Unknown {
        /// The chunk type.
        kind: u16,
        /// For unknown *error* chunk types, the leading error value.
        error: Option<u32>,
        /// Raw payload.
        data: Bytes,
    },
}

impl ChunkPayload {
    /// The `NBD_REPLY_TYPE_*` of this payload.
    pub fn kind(&self) -> u16 {
        match self {
            ChunkPayload::None => chunk_type::NONE,
            ChunkPayload::OffsetData { .. } => chunk_type::OFFSET_DATA,
            ChunkPayload::OffsetHole { .. } => chunk_type::OFFSET_HOLE,
            ChunkPayload::BlockStatus { .. } => chunk_type::BLOCK_STATUS,
            ChunkPayload::Error { .. } => chunk_type::ERROR,
            ChunkPayload::ErrorOffset { .. } => chunk_type::ERROR_OFFSET,
            ChunkPayload::Unknown { kind, .. } => *kind,
        }
    }

    /// True for error chunks (type bit 15).
    pub fn is_error(&self) -> bool {
        self.kind() & chunk_type::ERR_BIT != 0
    }

    /// Encode the payload (without the chunk header).
    ///
    /// Contract: the payload MUST satisfy the spec's per-type constraints
    /// (nonempty data, nonzero hole, at least one extent, nonzero error,
    /// message ≤ 4096 bytes); violations are programming errors and panic.
    pub fn encode_payload(&self) -> Bytes {
        let mut b = BytesMut::new();
        match self {
            ChunkPayload::None => {}
            ChunkPayload::OffsetData { offset, data } => {
                assert!(
                    !data.is_empty(),
                    "OFFSET_DATA MUST describe at least one byte"
                );
                b.put_u64(*offset);
                b.put_slice(data);
            }
            ChunkPayload::OffsetHole { offset, len } => {
                assert!(*len > 0, "OFFSET_HOLE size MUST be nonzero");
                b.put_u64(*offset);
                b.put_u32(*len);
            }
            ChunkPayload::BlockStatus {
                context_id,
                extents,
            } => {
                assert!(
                    !extents.is_empty(),
                    "BLOCK_STATUS MUST carry at least one extent"
                );
                b.put_u32(*context_id);
                for e in extents {
                    assert!(e.len > 0, "extent length MUST be nonzero");
                    b.put_u32(e.len);
                    b.put_u32(e.flags);
                }
            }
            ChunkPayload::Error { error, message } => {
                assert!(*error != 0, "error chunk value MUST be nonzero");
                assert_wire_string(message);
                b.put_u32(*error);
                b.put_u16(message.len() as u16);
                b.put_slice(message.as_bytes());
            }
            ChunkPayload::ErrorOffset {
                error,
                message,
                offset,
            } => {
                assert!(*error != 0, "error chunk value MUST be nonzero");
                assert_wire_string(message);
                b.put_u32(*error);
                b.put_u16(message.len() as u16);
                b.put_slice(message.as_bytes());
                b.put_u64(*offset);
            }
            ChunkPayload::Unknown { data, .. } => b.put_slice(data),
        }
        b.freeze()
    }

    /// Decode a payload of chunk type `kind`, checking the spec's length rules.
    pub fn decode(kind: u16, payload: Bytes) -> Result<Self, CodecError> {
        let what = "structured reply payload";
        let malformed = |reason: String| CodecError::Malformed { what, reason };
        let len = payload.len();
        let mut r = Rd::new(&payload, what);
        let v = match kind {
            chunk_type::NONE => {
                if len != 0 {
                    return Err(malformed(format!("NONE chunk with length {len}")));
                }
                ChunkPayload::None
            }
            chunk_type::OFFSET_DATA => {
                if len < 9 {
                    return Err(malformed(format!("OFFSET_DATA length {len} < 9")));
                }
                let offset = r.u64()?;
                ChunkPayload::OffsetData {
                    offset,
                    data: payload.slice(8..),
                }
            }
            chunk_type::OFFSET_HOLE => {
                if len != 12 {
                    return Err(malformed(format!("OFFSET_HOLE length {len} != 12")));
                }
                let offset = r.u64()?;
                let hl = r.u32()?;
                if hl == 0 {
                    return Err(malformed("OFFSET_HOLE with zero size".into()));
                }
                ChunkPayload::OffsetHole { offset, len: hl }
            }
            chunk_type::BLOCK_STATUS => {
                if len < 12 || !(len - 4).is_multiple_of(8) {
                    return Err(malformed(format!(
                        "BLOCK_STATUS length {len} is not 4 + a positive multiple of 8"
                    )));
                }
                let context_id = r.u32()?;
                let mut extents = Vec::with_capacity((len - 4) / 8);
                while r.remaining() > 0 {
                    let l = r.u32()?;
                    let f = r.u32()?;
                    if l == 0 {
                        return Err(malformed("extent with zero length".into()));
                    }
                    extents.push(Extent { len: l, flags: f });
                }
                ChunkPayload::BlockStatus {
                    context_id,
                    extents,
                }
            }
            chunk_type::ERROR | chunk_type::ERROR_OFFSET => {
                let fixed = if kind == chunk_type::ERROR { 6 } else { 14 };
                if len < fixed {
                    return Err(malformed(format!("error chunk length {len} < {fixed}")));
                }
                let error = r.u32()?;
                if error == 0 {
                    return Err(malformed("error chunk with zero error value".into()));
                }
                let ml = r.u16()? as usize;
                if ml > len - fixed {
                    return Err(malformed(format!(
                        "error message length {ml} exceeds chunk length {len} - {fixed}"
                    )));
                }
                let message = String::from_utf8_lossy(r.take(ml)?).into_owned();
                if kind == chunk_type::ERROR {
                    ChunkPayload::Error { error, message }
                } else {
                    let offset = r.u64()?;
                    ChunkPayload::ErrorOffset {
                        error,
                        message,
                        offset,
                    }
                }
            }
            k => {
                let error = if k & chunk_type::ERR_BIT != 0 && len >= 6 {
                    let e = r.u32()?;
                    let ml = r.u16()? as usize;
                    if ml > len - 6 {
                        return Err(malformed(format!(
                            "unknown error chunk message length {ml} exceeds chunk"
                        )));
                    }
                    Some(e)
                } else {
                    None
                };
                ChunkPayload::Unknown {
                    kind: k,
                    error,
                    data: payload.clone(),
                }
            }
        };
        Ok(v)
    }
}

/// Encode a complete structured reply chunk (header + payload).
pub fn encode_chunk(handle: u64, flags: u16, payload: &ChunkPayload) -> Bytes {
    let body = payload.encode_payload();
    let mut b = BytesMut::with_capacity(ChunkHeader::LEN + body.len());
    b.put_slice(
        &ChunkHeader {
            flags,
            kind: payload.kind(),
            handle,
            length: u32_len(body.len()),
        }
        .encode(),
    );
    b.put_slice(&body);
    b.freeze()
}

/// Encode the chunk header plus the 8-byte offset of an `OFFSET_DATA` chunk
/// whose `data_len` data bytes the caller sends separately (zero-copy path).
pub fn encode_offset_data_prefix(handle: u64, flags: u16, offset: u64, data_len: u32) -> [u8; 28] {
    assert!(data_len > 0, "OFFSET_DATA MUST describe at least one byte");
    let mut b = [0u8; 28];
    b[..20].copy_from_slice(
        &ChunkHeader {
            flags,
            kind: chunk_type::OFFSET_DATA,
            handle,
            length: data_len
                .checked_add(8)
                .expect("OFFSET_DATA payload MUST fit in 32 bits"),
        }
        .encode(),
    );
    b[20..28].copy_from_slice(&offset.to_be_bytes());
    b
}
#[cfg(test)]
mod tests {
    //! Byte vectors below are written by hand from the layouts in proto.md.
    use super::*;
    use crate::proto::wire::hex;
    use crate::proto::*;

    #[test]
    fn structured_chunks_bytes() {
        // OFFSET_DATA, DONE, handle 1, offset 0x200, data "ab"
        let c = encode_chunk(
            1,
            reply_flags::DONE,
            &ChunkPayload::OffsetData {
                offset: 0x200,
                data: Bytes::from_static(b"ab"),
            },
        );
        let want = hex("668e33ef 0001 0001 0000000000000001 0000000a
             0000000000000200 6162");
        assert_eq!(c.to_vec(), want);
        let mut pre = encode_offset_data_prefix(1, reply_flags::DONE, 0x200, 2).to_vec();
        pre.extend_from_slice(b"ab");
        assert_eq!(pre, want);
        let h = ChunkHeader::decode(&c).unwrap();
        assert!(h.is_done());
        assert_eq!(
            ChunkPayload::decode(h.kind, c.slice(20..)).unwrap(),
            ChunkPayload::OffsetData {
                offset: 0x200,
                data: Bytes::from_static(b"ab")
            }
        );

        // NONE chunk.
        let c = encode_chunk(9, reply_flags::DONE, &ChunkPayload::None);
        assert_eq!(
            c.to_vec(),
            hex("668e33ef 0001 0000 0000000000000009 00000000")
        );

        // ERROR chunk: EIO, message "x".
        let c = encode_chunk(
            2,
            reply_flags::DONE,
            &ChunkPayload::Error {
                error: 5,
                message: "x".into(),
            },
        );
        assert_eq!(
            c.to_vec(),
            hex("668e33ef 0001 8001 0000000000000002 00000007 00000005 0001 78")
        );

        // ERROR_OFFSET: EIO, "", offset 0x10.
        let p = ChunkPayload::ErrorOffset {
            error: 5,
            message: String::new(),
            offset: 0x10,
        };
        let enc = p.encode_payload();
        assert_eq!(enc.to_vec(), hex("00000005 0000 0000000000000010"));
        assert_eq!(
            ChunkPayload::decode(chunk_type::ERROR_OFFSET, enc).unwrap(),
            p
        );

        // BLOCK_STATUS: context 1, extents (4096, HOLE|ZERO), (512, 0).
        let p = ChunkPayload::BlockStatus {
            context_id: 1,
            extents: vec![
                Extent {
                    len: 4096,
                    flags: 3,
                },
                Extent { len: 512, flags: 0 },
            ],
        };
        let enc = p.encode_payload();
        assert_eq!(
            enc.to_vec(),
            hex("00000001 00001000 00000003 00000200 00000000")
        );
        assert_eq!(
            ChunkPayload::decode(chunk_type::BLOCK_STATUS, enc).unwrap(),
            p
        );

        // OFFSET_HOLE.
        let p = ChunkPayload::OffsetHole {
            offset: 0,
            len: 4096,
        };
        let enc = p.encode_payload();
        assert_eq!(enc.to_vec(), hex("0000000000000000 00001000"));
        assert_eq!(
            ChunkPayload::decode(chunk_type::OFFSET_HOLE, enc).unwrap(),
            p
        );
    }

    #[test]
    fn structured_chunks_malformed() {
        let d = |k, h: &str| ChunkPayload::decode(k, Bytes::from(hex(h)));
        assert!(d(chunk_type::NONE, "00").is_err());
        assert!(d(chunk_type::OFFSET_DATA, "0000000000000000").is_err());
        assert!(d(chunk_type::OFFSET_HOLE, "0000000000000000 00000000").is_err());
        assert!(d(chunk_type::OFFSET_HOLE, "0000000000000000 0000").is_err());
        assert!(d(chunk_type::BLOCK_STATUS, "00000001").is_err());
        assert!(d(chunk_type::BLOCK_STATUS, "00000001 00000000 00000000").is_err());
        assert!(d(chunk_type::BLOCK_STATUS, "00000001 00000001 000000").is_err());
        assert!(d(chunk_type::ERROR, "00000005 00").is_err());
        assert!(d(chunk_type::ERROR, "00000000 0000").is_err());
        assert!(d(chunk_type::ERROR, "00000005 0005 61").is_err());
        assert!(d(chunk_type::ERROR_OFFSET, "00000005 0000 00000000").is_err());
        // Unknown error chunk: error value surfaced.
        assert_eq!(
            d(0x8005, "0000001c 0000").unwrap(),
            ChunkPayload::Unknown {
                kind: 0x8005,
                error: Some(28),
                data: Bytes::from(hex("0000001c 0000"))
            }
        );
        assert!(d(0x8005, "0000001c 0009").is_err());
    }
}
