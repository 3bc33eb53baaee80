//! A sparse in-memory [`Export`], for tests, examples and as a reference
//! implementation of the trait's contracts.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use bytes::{Bytes, BytesMut};

use crate::error::NbdError;
use crate::export::{
    BoxFuture, Export, ExportInfo, NbdResult, OpFuture, RequestCtx, WriteZeroesFlags,
};
use crate::proto::{state, Extent};

/// Allocation granularity of [`MemoryExport`].
pub const PAGE_SIZE: u64 = 4096;

/// Operation counters of a [`MemoryExport`] (what the server actually delivered).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// READ calls.
    pub reads: u64,
    /// WRITE calls.
    pub writes: u64,
    /// WRITE calls with FUA.
    pub fua_writes: u64,
    /// FLUSH calls.
    pub flushes: u64,
    /// TRIM calls.
    pub trims: u64,
    /// WRITE_ZEROES calls.
    pub zeroes: u64,
    /// WRITE_ZEROES calls with FAST_ZERO.
    pub fast_zeroes: u64,
    /// CACHE calls.
    pub caches: u64,
    /// BLOCK_STATUS calls.
    pub block_status: u64,
    /// Connections that entered transmission on this export.
    pub connects: u64,
    /// Connections that ended.
    pub disconnects: u64,
}

#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    writes: AtomicU64,
    fua_writes: AtomicU64,
    flushes: AtomicU64,
    trims: AtomicU64,
    zeroes: AtomicU64,
    fast_zeroes: AtomicU64,
    caches: AtomicU64,
    block_status: AtomicU64,
    connects: AtomicU64,
    disconnects: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Sparse RAM-backed export: unwritten 4 KiB pages are holes that read as
/// zeroes; trim and write-zeroes free whole pages (unless `NO_HOLE`).
/// Everything is "persistent" immediately, so flush and FUA are trivially
/// honoured and multi-conn is safe.
pub struct MemoryExport {
    info: ExportInfo,
    pages: Mutex<BTreeMap<u64, Box<[u8]>>>,
    counters: Counters,
}

impl MemoryExport {
    /// Create an export described by `info` (its `size` is the capacity).
    pub fn new(info: ExportInfo) -> Self {
        MemoryExport {
            info,
            pages: Mutex::new(BTreeMap::new()),
            counters: Counters::default(),
        }
    }

    /// Convenience: writable export `name` of `size` bytes with every feature enabled.
    pub fn with_size(name: impl Into<String>, size: u64) -> Self {
        Self::new(ExportInfo::new(name, size).with_all_features())
    }

    /// Copy out `len` bytes at `offset` (direct access for tests).
    pub fn contents(&self, offset: u64, len: usize) -> Vec<u8> {
        let pages = self.pages.lock().expect("poisoned");
        let mut out = vec![0u8; len];
        copy_out(&pages, offset, &mut out);
        out
    }

    /// Write directly, bypassing NBD (for test setup).
    pub fn fill(&self, offset: u64, data: &[u8]) {
        let mut pages = self.pages.lock().expect("poisoned");
        copy_in(&mut pages, offset, data);
    }

    /// Number of allocated pages.
    pub fn allocated_pages(&self) -> usize {
        self.pages.lock().expect("poisoned").len()
    }

    /// Snapshot of the operation counters.
    pub fn stats(&self) -> MemoryStats {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MemoryStats {
            reads: l(&c.reads),
            writes: l(&c.writes),
            fua_writes: l(&c.fua_writes),
            flushes: l(&c.flushes),
            trims: l(&c.trims),
            zeroes: l(&c.zeroes),
            fast_zeroes: l(&c.fast_zeroes),
            caches: l(&c.caches),
            block_status: l(&c.block_status),
            connects: l(&c.connects),
            disconnects: l(&c.disconnects),
        }
    }

    fn check_range(&self, offset: u64, len: u64) -> NbdResult<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.info.size => Ok(()),
            _ => Err(NbdError::inval("range beyond end of memory export")),
        }
    }

    /// Zero `[offset, offset+len)`: whole pages are freed (or, with
    /// `keep_allocated`, zero-filled), partial pages are zero-filled.
    fn zero_range(&self, offset: u64, len: u64, keep_allocated: bool) {
        let mut pages = self.pages.lock().expect("poisoned");
        for s in spans(offset, len) {
            if s.whole() && !keep_allocated {
                pages.remove(&s.page);
            } else if keep_allocated {
                page_mut(&mut pages, s.page)[s.range()].fill(0);
            } else if let Some(p) = pages.get_mut(&s.page) {
                p[s.range()].fill(0);
            }
        }
    }
}

/// The part of one page a byte range covers.
struct Span {
    page: u64,
    /// Offset in the page.
    at: usize,
    /// Offset in the range.
    done: usize,
    len: usize,
}

impl Span {
    fn range(&self) -> std::ops::Range<usize> {
        self.at..self.at + self.len
    }
    fn whole(&self) -> bool {
        self.len == PAGE_SIZE as usize
    }
}

/// The pages `[offset, offset+len)` covers, in order.
fn spans(offset: u64, len: u64) -> impl Iterator<Item = Span> {
    let mut done = 0u64;
    std::iter::from_fn(move || {
        (done < len).then(|| {
            let pos = offset + done;
            let at = (pos % PAGE_SIZE) as usize;
            let n = (PAGE_SIZE - at as u64).min(len - done);
            let s = Span {
                page: pos / PAGE_SIZE,
                at,
                done: done as usize,
                len: n as usize,
            };
            done += n;
            s
        })
    })
}

/// Page `page`, allocated (zeroed) if it was not.
fn page_mut(pages: &mut BTreeMap<u64, Box<[u8]>>, page: u64) -> &mut [u8] {
    pages
        .entry(page)
        .or_insert_with(|| vec![0u8; PAGE_SIZE as usize].into_boxed_slice())
}

fn copy_out(pages: &BTreeMap<u64, Box<[u8]>>, offset: u64, out: &mut [u8]) {
    for s in spans(offset, out.len() as u64) {
        let to = &mut out[s.done..s.done + s.len];
        match pages.get(&s.page) {
            Some(p) => to.copy_from_slice(&p[s.range()]),
            None => to.fill(0),
        }
    }
}

fn copy_in(pages: &mut BTreeMap<u64, Box<[u8]>>, offset: u64, data: &[u8]) {
    for s in spans(offset, data.len() as u64) {
        page_mut(pages, s.page)[s.range()].copy_from_slice(&data[s.done..s.done + s.len]);
    }
}

impl Export for MemoryExport {
    fn info(&self) -> ExportInfo {
        self.info.clone()
    }

    fn read(&self, _ctx: RequestCtx, offset: u64, len: u32) -> BoxFuture<'_, NbdResult<Bytes>> {
        bump(&self.counters.reads);
        let r = self.check_range(offset, len.into()).map(|_| {
            let mut buf = BytesMut::zeroed(len as usize);
            copy_out(&self.pages.lock().expect("poisoned"), offset, &mut buf);
            buf.freeze()
        });
        Box::pin(async move { r })
    }

    fn write(&self, _ctx: RequestCtx, offset: u64, data: Bytes, fua: bool) -> OpFuture<'_> {
        bump(&self.counters.writes);
        if fua {
            bump(&self.counters.fua_writes);
        }
        let r = if self.info.read_only {
            Err(NbdError::perm("read-only"))
        } else {
            self.check_range(offset, data.len() as u64).map(|_| {
                copy_in(&mut self.pages.lock().expect("poisoned"), offset, &data);
            })
        };
        Box::pin(async move { r })
    }

    fn flush(&self, _ctx: RequestCtx) -> OpFuture<'_> {
        bump(&self.counters.flushes);
        Box::pin(async { Ok(()) })
    }

    fn trim(&self, _ctx: RequestCtx, offset: u64, len: u32, _fua: bool) -> OpFuture<'_> {
        bump(&self.counters.trims);
        let r = self
            .check_range(offset, len.into())
            .map(|_| self.zero_range(offset, len.into(), false));
        Box::pin(async move { r })
    }

    fn write_zeroes(
        &self,
        _ctx: RequestCtx,
        offset: u64,
        len: u32,
        flags: WriteZeroesFlags,
    ) -> OpFuture<'_> {
        bump(&self.counters.zeroes);
        if flags.fast_zero {
            bump(&self.counters.fast_zeroes);
        }
        let r = self
            .check_range(offset, len.into())
            .map(|_| self.zero_range(offset, len.into(), flags.no_hole));
        Box::pin(async move { r })
    }

    fn cache(&self, _ctx: RequestCtx, offset: u64, len: u32) -> OpFuture<'_> {
        bump(&self.counters.caches);
        let r = self.check_range(offset, len.into());
        Box::pin(async move { r })
    }

    fn block_status(
        &self,
        _ctx: RequestCtx,
        offset: u64,
        len: u32,
    ) -> BoxFuture<'_, NbdResult<Vec<Extent>>> {
        bump(&self.counters.block_status);
        let r = self.check_range(offset, len.into()).map(|_| {
            let pages = self.pages.lock().expect("poisoned");
            let end = offset + u64::from(len);
            let mut out: Vec<Extent> = Vec::new();
            let mut pos = offset;
            while pos < end {
                let page = pos / PAGE_SIZE;
                let n = (PAGE_SIZE - pos % PAGE_SIZE).min(end - pos) as u32;
                let flags = if pages.contains_key(&page) {
                    0
                } else {
                    state::HOLE | state::ZERO
                };
                match out.last_mut() {
                    Some(last) if last.flags == flags => last.len += n,
                    _ => out.push(Extent { len: n, flags }),
                }
                pos += u64::from(n);
            }
            out
        });
        Box::pin(async move { r })
    }

    fn on_connect(&self, _conn_id: u64) {
        bump(&self.counters.connects);
    }

    fn on_disconnect(&self, _conn_id: u64) {
        bump(&self.counters.disconnects);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> RequestCtx {
        RequestCtx {
            conn_id: 1,
            export: "m".into(),
            handle: 0,
        }
    }

    #[tokio::test]
    async fn sparse_read_write_trim_status() {
        let m = MemoryExport::with_size("m", 64 * 1024);
        assert_eq!(m.read(ctx(), 0, 10).await.unwrap(), vec![0u8; 10]);
        m.write(ctx(), 4090, Bytes::from(vec![7u8; 12]), true)
            .await
            .unwrap();
        assert_eq!(m.allocated_pages(), 2);
        assert_eq!(
            m.contents(4088, 16)[..],
            [0, 0, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 0, 0]
        );
        let st = m.block_status(ctx(), 0, 16384).await.unwrap();
        assert_eq!(
            st,
            vec![
                Extent {
                    len: 8192,
                    flags: 0
                },
                Extent {
                    len: 8192,
                    flags: 3
                }
            ]
        );
        // Trim of a partial page zeroes it but keeps the page.
        m.trim(ctx(), 4090, 6, false).await.unwrap();
        assert_eq!(m.contents(4090, 6), vec![0; 6]);
        assert_eq!(m.allocated_pages(), 2);
        m.trim(ctx(), 0, 8192, false).await.unwrap();
        assert_eq!(m.allocated_pages(), 0);
        // NO_HOLE zeroes allocate.
        let f = WriteZeroesFlags {
            no_hole: true,
            ..Default::default()
        };
        m.write_zeroes(ctx(), 0, 4096, f).await.unwrap();
        assert_eq!(m.allocated_pages(), 1);
        assert!(m.read(ctx(), 65535, 2).await.is_err());
        let s = m.stats();
        assert_eq!((s.writes, s.fua_writes, s.trims, s.zeroes), (1, 1, 2, 1));
    }
}
