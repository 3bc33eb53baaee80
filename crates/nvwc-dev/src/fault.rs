//! The fault filter: any device, with the faults of a rule spec
//! (`rules.rs`) injected into its commands; what a rule does not touch is
//! forwarded as it is.
//!
//! A failing rule fails the command before it reaches the device (an
//! [`Injected`](crate::rules::Injected) error). A torn write writes its
//! first whole sectors to the device, as a plain write (no FUA), then fails
//! with EIO; a torn crash writes them, flushes the device (the page cache
//! keeps what was written: a crash mid-write), then aborts the process.

use std::io;

use bytes::Bytes;

use crate::block::BlockDevice;
use crate::rules::{Fate, OpClass, Rules};

/// See the module docs.
pub struct Faulty<D> {
    rules: Rules,
    dev: D,
}

/// The first `n` bytes of `parts`, back to back.
pub fn prefix<'a>(parts: &[&'a [u8]], mut n: usize) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    for p in parts {
        if n == 0 {
            break;
        }
        let k = p.len().min(n);
        out.push(&p[..k]);
        n -= k;
    }
    out
}

impl<D: BlockDevice> Faulty<D> {
    pub fn new(rules: Rules, dev: D) -> Faulty<D> {
        Faulty { rules, dev }
    }

    /// The device under the filter.
    pub fn inner(&self) -> &D {
        &self.dev
    }

    /// A torn write (`keep` bytes of `len` written): fail, or abort.
    fn torn(&self, keep: usize, len: usize, crash: bool) -> io::Result<()> {
        if crash {
            // The page cache keeps what was written: a crash mid-write.
            let _ = self.dev.flush();
            eprintln!("nvwc: torn-crash fault: abort after {keep} of {len} bytes");
            std::process::abort();
        }
        Err(crate::rules::Injected::Eio.into_io())
    }
}

impl<D: BlockDevice> BlockDevice for Faulty<D> {
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.rules.decide(OpClass::Read, 0)?;
        self.dev.read(offset, buf)
    }

    fn write(&self, offset: u64, parts: &[&[u8]], fua: bool) -> io::Result<()> {
        let len = parts.iter().map(|p| p.len()).sum();
        match self.rules.decide(OpClass::Write, len)? {
            Fate::Run => self.dev.write(offset, parts, fua),
            Fate::Torn { keep, crash } => {
                if keep > 0 {
                    let _ = self.dev.write(offset, &prefix(parts, keep), false);
                }
                self.torn(keep, len, crash)
            }
        }
    }

    fn flush(&self) -> io::Result<()> {
        self.rules.decide(OpClass::Flush, 0)?;
        self.dev.flush()
    }

    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        self.dev.trim(offset, len)
    }

    fn group_begin(&self, g: u64) -> io::Result<()> {
        self.dev.group_begin(g)
    }

    fn group_write(&self, g: u64, offset: u64, data: Bytes) -> io::Result<()> {
        match self.rules.decide(OpClass::Write, data.len())? {
            Fate::Run => self.dev.group_write(g, offset, data),
            Fate::Torn { keep, crash } => {
                if keep > 0 {
                    let _ = self.dev.group_write(g, offset, data.slice(..keep));
                }
                self.torn(keep, data.len(), crash)
            }
        }
    }

    fn group_end(&self, g: u64) -> io::Result<()> {
        self.rules.decide(OpClass::Flush, 0)?;
        self.dev.group_end(g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemDisk;
    use crate::rules::{parse, Injected};
    use std::cell::RefCell;

    fn twin() -> RefCell<MemDisk> {
        RefCell::new(MemDisk::new(vec![0; 8 * 512]))
    }

    #[test]
    fn a_fault_fires_after_n_commands_then_stops() {
        let d = twin();
        let f = Faulty::new(parse("eio,op=write,after=2,count=1").unwrap().rules, &d);
        let w = |b: u8| f.write(0, &[&[b; 512]], false);
        assert!(w(1).is_ok() && w(2).is_ok());
        let e = w(3).unwrap_err();
        assert_eq!(Injected::of(&e), Some(Injected::Eio));
        assert_eq!(
            d.borrow().read(0, 1),
            vec![2],
            "the failed write never reached it"
        );
        f.read(0, &mut [0u8; 512]).unwrap();
        f.flush().unwrap();
        assert!(w(4).is_ok(), "count=1: fired once");
        assert_eq!(d.borrow().read(0, 1), vec![4]);
    }

    #[test]
    fn torn_writes_tear_at_512_byte_sectors() {
        let d = twin();
        let f = Faulty::new(parse("torn,seed=3").unwrap().rules, &d);
        let mut seen = std::collections::HashSet::new();
        for round in 1..=40u8 {
            let parts: [&[u8]; 2] = [&[round; 1536], &[round; 2560]];
            assert!(f.write(0, &parts, true).is_err(), "a torn write fails");
            let img = d.borrow().read(0, 4096);
            let kept = img.iter().position(|&b| b != round).unwrap_or(4096);
            assert_eq!(kept % 512, 0, "a prefix of whole sectors: {kept}");
            assert!(img[kept..].iter().all(|&b| b != round));
            seen.insert(kept);
        }
        assert!(seen.len() > 3, "{seen:?}");
        assert!(
            d.borrow()
                .crash(&mut rand::rngs::mock::StepRng::new(0, 0), &[], &[])[0]
                != 40,
            "the torn prefix is a plain write, not FUA"
        );
    }

    #[test]
    fn groups_and_trims_are_forwarded() {
        let d = twin();
        let f = Faulty::new(parse("delay,ms=0,op=read").unwrap().rules, &d);
        f.trim(0, 512).unwrap();
        assert_eq!(
            f.group_begin(1).unwrap_err().kind(),
            io::ErrorKind::Unsupported
        );
        f.write(512, &[&[9; 512]], true).unwrap();
        let mut b = [0u8; 1];
        f.read(512, &mut b).unwrap();
        assert_eq!(b, [9]);
    }
}
