//! Bad input against the real `nvwc serve` (engine-backed exports, not the
//! in-memory export of `crates/nvwc-nbd/tests/loopback.rs`): every
//! misbehaving client gets the reply listed in `docs/BAD-INPUT.md`, and a
//! well-behaved client keeps being served, with verified data, *while* the
//! bad clients misbehave.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use nvwc_nbd::proto::{
    self, client_flags, opt, rep, ClientOption, InfoRequest, OptionReplyHeader, RequestHeader,
    SimpleReplyHeader,
};
use nvwc_nbd::Client;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const IO_TIMEOUT: Duration = Duration::from_secs(20);
const EPERM: u32 = 1;
const EINVAL: u32 = 22;
const ENOSPC: u32 = 28;

mod common;
use common::serve::Scratch;

/// The URI of export `name` of `s`.
fn uri(s: &Scratch, name: &str) -> String {
    format!("nbd+unix:///{name}?socket={}", s.sock().display())
}

fn start() -> Scratch {
    Scratch::start(
        "bad-input",
        &[
            "--size",
            "64M",
            "--cache-size",
            "8M",
            "--export",
            "ro=nvwc-data/ro.img,size=16M,read-only",
        ],
    )
}

/// A raw NBD connection for exact-byte cases.
struct Raw(UnixStream);

impl Raw {
    /// Connects, reads the greeting and sends FIXED_NEWSTYLE | NO_ZEROES.
    async fn connect(path: &Path) -> Raw {
        let mut s = UnixStream::connect(path).await.unwrap();
        let mut g = [0u8; proto::GREETING_LEN];
        s.read_exact(&mut g).await.unwrap();
        proto::decode_server_greeting(&g).unwrap();
        let mut r = Raw(s);
        r.send(&proto::encode_client_flags(
            client_flags::FIXED_NEWSTYLE | client_flags::NO_ZEROES,
        ))
        .await;
        r
    }

    async fn send(&mut self, b: &[u8]) {
        self.0.write_all(b).await.unwrap();
    }

    async fn read_n(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        tokio::time::timeout(IO_TIMEOUT, self.0.read_exact(&mut b))
            .await
            .expect("timed out waiting for the server")
            .unwrap();
        b
    }

    /// Option replies up to the final one; returns its type.
    async fn final_reply(&mut self) -> u32 {
        loop {
            let h = OptionReplyHeader::decode(&self.read_n(OptionReplyHeader::LEN).await).unwrap();
            self.read_n(h.length as usize).await;
            if h.reply_type == rep::ACK || rep::is_error(h.reply_type) {
                return h.reply_type;
            }
        }
    }

    async fn go(&mut self, name: &str) {
        self.send(
            &ClientOption::Go(InfoRequest {
                name: name.into(),
                requests: vec![],
            })
            .encode(),
        )
        .await;
        assert_eq!(self.final_reply().await, rep::ACK, "GO {name:?}");
    }

    async fn request(&mut self, cmd: u16, handle: u64, offset: u64, length: u32, payload: &[u8]) {
        let h = RequestHeader {
            flags: 0,
            command: cmd.into(),
            handle,
            offset,
            length,
        };
        let mut b = h.encode().to_vec();
        b.extend_from_slice(payload);
        self.send(&b).await;
    }

    /// The next simple reply's error value (READ data, if any, is read too).
    async fn reply(&mut self, handle: u64, data_len: usize) -> u32 {
        let h = SimpleReplyHeader::decode(&self.read_n(SimpleReplyHeader::LEN).await).unwrap();
        assert_eq!(h.handle, handle);
        if h.error == 0 {
            self.read_n(data_len).await;
        }
        h.error
    }

    /// The server closes the connection without sending anything more.
    async fn expect_closed(&mut self) {
        let mut b = [0u8; 64];
        match tokio::time::timeout(IO_TIMEOUT, self.0.read(&mut b))
            .await
            .expect("server did not close the connection")
        {
            Ok(0) => {}
            Ok(n) => panic!("expected close, got {n} bytes"),
            Err(e) => assert!(
                matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
                ),
                "{e}"
            ),
        }
    }
}

/// The well-behaved client: writes a pattern, reads it back, flushes, in a
/// loop until `stop`; counts rounds and fails on any error or wrong byte.
async fn good_client(uri: String, stop: Arc<AtomicBool>, rounds: Arc<AtomicU64>) {
    let c = Client::connect(&uri).await.expect("good client connects");
    let mut i: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        let off = (i % 256) * 65536;
        let data: Vec<u8> = (0..65536u32).map(|k| (k as u64 ^ i) as u8).collect();
        c.write(off, Bytes::from(data.clone()), i.is_multiple_of(4))
            .await
            .expect("good client write");
        let got = c.read(off, 65536).await.expect("good client read");
        assert_eq!(&got[..], &data[..], "good client read back wrong data");
        if i.is_multiple_of(8) {
            c.flush().await.expect("good client flush");
        }
        i += 1;
        rounds.fetch_add(1, Ordering::Relaxed);
    }
    c.disconnect().await.expect("good client disconnect");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_clients_get_spec_replies_while_a_good_client_keeps_working() {
    let s = start();
    let sock = s.sock();
    let max_block = {
        let c = Client::connect(&uri(&s, "")).await.unwrap();
        let m = c.info().max_block;
        c.disconnect().await.unwrap();
        m
    };
    let size: u64 = 64 << 20;

    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let good = tokio::spawn(good_client(uri(&s, ""), stop.clone(), rounds.clone()));
    // Let the good client get going.
    while rounds.load(Ordering::Relaxed) < 3 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before = rounds.load(Ordering::Relaxed);

    let bad = async {
        // Transmission-phase errors; the same connection keeps working.
        let mut r = Raw::connect(&sock).await;
        r.go("").await;
        r.request(0, 1, size, 4096, &[]).await; // read past the end
        assert_eq!(r.reply(1, 0).await, EINVAL, "read past the end");
        r.request(0, 2, u64::MAX - 100, 4096, &[]).await; // offset + length overflows
        assert_eq!(r.reply(2, 0).await, EINVAL, "overflowing read");
        r.request(1, 3, size - 512, 4096, &[7u8; 4096]).await; // write past the end
        assert_eq!(r.reply(3, 0).await, ENOSPC, "write past the end");
        let big = max_block + 4096;
        r.request(1, 4, 0, big, &vec![9u8; big as usize]).await; // above the maximum
        assert_eq!(r.reply(4, 0).await, EINVAL, "write above max_block");
        r.request(0, 5, 0, big, &[]).await;
        assert_eq!(r.reply(5, 0).await, EINVAL, "read above max_block");
        r.request(42, 6, 0, 4096, &[]).await; // unknown command
        assert_eq!(r.reply(6, 0).await, EINVAL, "unknown command");
        r.request(0, 7, 0, 4096, &[]).await; // still served
        assert_eq!(r.reply(7, 4096).await, 0, "connection survives its errors");

        // Write / trim to the read-only export.
        let mut ro = Raw::connect(&sock).await;
        ro.go("ro").await;
        ro.request(1, 8, 0, 4096, &[1u8; 4096]).await;
        assert_eq!(ro.reply(8, 0).await, EPERM, "write to read-only export");
        ro.request(0, 9, 0, 4096, &[]).await;
        assert_eq!(ro.reply(9, 4096).await, 0, "read-only export still reads");

        // Handshake: unknown option, then GO works; bad option magic closes.
        let mut h = Raw::connect(&sock).await;
        h.send(&proto::encode_option(0x7777, b"junk")).await;
        assert_eq!(h.final_reply().await, rep::ERR_UNSUP, "unknown option");
        h.send(&proto::encode_option(opt::EXTENDED_HEADERS, b""))
            .await;
        assert_eq!(h.final_reply().await, rep::ERR_UNSUP, "extended headers");
        h.go("").await;
        let mut h2 = Raw::connect(&sock).await;
        h2.send(&[0xde; 16]).await;
        h2.expect_closed().await;
        let mut h3 = Raw::connect(&sock).await;
        h3.send(
            &ClientOption::Go(InfoRequest {
                name: "nope".into(),
                requests: vec![],
            })
            .encode(),
        )
        .await;
        assert_eq!(h3.final_reply().await, rep::ERR_UNKNOWN, "unknown export");

        // Corrupted request magic: that client is disconnected.
        let mut m = Raw::connect(&sock).await;
        m.go("").await;
        let mut hdr = RequestHeader {
            flags: 0,
            command: 0u16.into(),
            handle: 10,
            offset: 0,
            length: 512,
        }
        .encode();
        hdr[0] ^= 0xff;
        m.send(&hdr).await;
        m.expect_closed().await;

        // Hang up in the middle of a WRITE payload and of a header.
        let mut d = Raw::connect(&sock).await;
        d.go("").await;
        d.request(1, 11, 48 << 20, 65536, &[5u8; 1000]).await;
        drop(d);
        let mut d2 = Raw::connect(&sock).await;
        d2.go("").await;
        d2.send(
            &RequestHeader::encode(&RequestHeader {
                flags: 0,
                command: 0u16.into(),
                handle: 12,
                offset: 0,
                length: 512,
            })[..10],
        )
        .await;
        drop(d2);
        // Connect and vanish mid-handshake, many times.
        for _ in 0..20 {
            let mut x = UnixStream::connect(&sock).await.unwrap();
            let _ = x.write_all(&[0, 0]).await;
        }
        // A write whose header promised data that never came must not have
        // landed: the bytes at 48 MiB (never written) are still what they were (zeroes).
        let c = Client::connect(&uri(&s, "")).await.unwrap();
        let got = c.read(48 << 20, 65536).await.unwrap();
        assert!(got.iter().all(|&b| b == 0), "half-sent write was applied");
        c.disconnect().await.unwrap();
    };
    tokio::time::timeout(Duration::from_secs(120), bad)
        .await
        .expect("bad-client phase timed out");
    let during = rounds.load(Ordering::Relaxed) - before;
    eprintln!("good client: {during} rounds while bad clients misbehaved");
    // Keep the good client running briefly after, then stop it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    tokio::time::timeout(Duration::from_secs(60), good)
        .await
        .expect("good client stuck")
        .expect("good client failed");
    assert!(
        during > 0,
        "the good client made no progress while bad clients misbehaved"
    );
}
