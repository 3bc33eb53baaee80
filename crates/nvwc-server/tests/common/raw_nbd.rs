//! A raw NBD connection for tests: requests the project's client
//! (`nvwc_nbd::Client`) refuses to send, such as ranges past the end of the
//! export or longer than the advertised maximum. Shared by this crate's
//! tests and `crates/nvwc/tests/serve_maxreq.rs` (which includes this file).
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

/// A raw NBD connection for the requests `nvwc_nbd::Client` refuses to
/// send (longer than the advertised maximum), with simple or structured
/// replies.
pub struct RawNbd {
    s: std::os::unix::net::UnixStream,
    structured: bool,
}

impl RawNbd {
    /// Connect to the default export on unix socket `sock` (fixed newstyle,
    /// `NBD_OPT_GO`), negotiating structured replies if `structured`.
    pub fn connect(sock: &Path, structured: bool) -> RawNbd {
        use nvwc_nbd::proto::{
            self, client_flags, rep, ClientOption, InfoRequest, OptionReplyHeader,
        };
        use std::io::{Read, Write};
        let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let mut g = [0u8; proto::GREETING_LEN];
        s.read_exact(&mut g).unwrap();
        proto::decode_server_greeting(&g).unwrap();
        s.write_all(&proto::encode_client_flags(
            client_flags::FIXED_NEWSTYLE | client_flags::NO_ZEROES,
        ))
        .unwrap();
        let mut opts = Vec::new();
        if structured {
            opts.push(ClientOption::StructuredReply);
        }
        opts.push(ClientOption::Go(InfoRequest {
            name: String::new(),
            requests: vec![],
        }));
        for o in opts {
            s.write_all(&o.encode()).unwrap();
            loop {
                let mut h = [0u8; OptionReplyHeader::LEN];
                s.read_exact(&mut h).unwrap();
                let h = OptionReplyHeader::decode(&h).unwrap();
                let mut d = vec![0u8; h.length as usize];
                s.read_exact(&mut d).unwrap();
                assert!(!rep::is_error(h.reply_type), "option refused: {h:?}");
                if h.reply_type == rep::ACK {
                    break;
                }
            }
        }
        RawNbd { s, structured }
    }

    /// Send a request whose payload is `payload_len` bytes of `fill`.
    pub fn send(
        &mut self,
        cmd: u16,
        handle: u64,
        offset: u64,
        len: u32,
        payload_len: u64,
        fill: u8,
    ) {
        use std::io::Write;
        let h = nvwc_nbd::proto::RequestHeader {
            flags: 0,
            command: cmd.into(),
            handle,
            offset,
            length: len,
        };
        self.s.write_all(&h.encode()).unwrap();
        let chunk = vec![fill; 1 << 20];
        let mut left = payload_len;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            self.s.write_all(&chunk[..n]).unwrap();
            left -= n as u64;
        }
    }

    /// The reply to request `handle`: its error value (0: success) and data.
    pub fn reply(&mut self, handle: u64, read_len: u32) -> (u32, Vec<u8>) {
        let r = self.reply_full(handle, read_len);
        (r.error, r.data)
    }

    /// The reply to request `handle`, with the server's error message (only
    /// structured replies carry one; simple replies give "").
    pub fn reply_full(&mut self, handle: u64, read_len: u32) -> RawReply {
        use nvwc_nbd::proto::{reply_flags, ChunkHeader, ChunkPayload, SimpleReplyHeader};
        use std::io::Read;
        if !self.structured {
            let mut h = [0u8; SimpleReplyHeader::LEN];
            self.s.read_exact(&mut h).unwrap();
            let h = SimpleReplyHeader::decode(&h).unwrap();
            assert_eq!(h.handle, handle);
            let mut data = vec![0u8; if h.error == 0 { read_len as usize } else { 0 }];
            self.s.read_exact(&mut data).unwrap();
            return RawReply {
                error: h.error,
                message: String::new(),
                data,
            };
        }
        let mut r = RawReply {
            error: 0,
            message: String::new(),
            data: Vec::new(),
        };
        loop {
            let mut h = [0u8; ChunkHeader::LEN];
            self.s.read_exact(&mut h).unwrap();
            let h = ChunkHeader::decode(&h).unwrap();
            assert_eq!(h.handle, handle);
            let mut p = vec![0u8; h.length as usize];
            self.s.read_exact(&mut p).unwrap();
            match ChunkPayload::decode(h.kind, bytes::Bytes::from(p)).unwrap() {
                ChunkPayload::Error { error, message } => (r.error, r.message) = (error, message),
                ChunkPayload::OffsetData { data: d, .. } => r.data.extend_from_slice(&d),
                _ => {}
            }
            if h.flags & reply_flags::DONE != 0 {
                return r;
            }
        }
    }
}

/// One request's reply on a [`RawNbd`] connection.
pub struct RawReply {
    /// The NBD error value (0: success).
    pub error: u32,
    /// The server's message for an error (structured replies only).
    pub message: String,
    /// A read's data.
    pub data: Vec<u8>,
}
