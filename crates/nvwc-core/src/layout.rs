//! The cache device's on-disk format (documented in `docs/ON-DISK-FORMAT.md`).
//!
//! ```text
//! offset 0        superblock (4 KiB region, record in the first 512 B; from
//!                 byte 56 on, the backing store the cache is bound to)
//! offset 4 KiB    commit record A (512 B record in a 4 KiB region)
//! offset 8 KiB    commit record B
//! offset 12 KiB   slot table: 4 KiB pages of 63 64-byte entries, two copies
//!                 of each page (page p copy c at 12 KiB + (2p + c) × 4 KiB):
//!                 the checkpoint
//! log_offset      metadata log (format 3): `log_pages` × 4 KiB of records,
//!                 appended after the checkpoint and restarted by the next
//! data_offset     data slots: capacity × block_size, aligned to max(4 KiB, block_size)
//! ```
//! All integers are little-endian. Every record carries a CRC-32 (IEEE) of its
//! other bytes, so an all-zero or torn record is recognised as invalid.
//!
//! Atomicity rests on two assumptions, both standard: a 512-byte sector write
//! is atomic, and a FLUSH makes every completed write durable.

use crate::config::{Config, WritePolicyKind};

/// Superblock magic.
pub const SB_MAGIC: &[u8; 8] = b"NVWCSB01";
/// Commit record magic.
pub const CR_MAGIC: &[u8; 8] = b"NVWCCR01";
/// Format version written at format time. Version 2 added `F_PARTIAL`;
/// version 3 the metadata log (single-sync commits); version 4 log records
/// that carry their versions' bytes (`F_INLINE`: one FUA write per commit,
/// no device flush). Version 1 to 3 caches are still opened and keep their
/// format: version 1 and 2 have no log, so every commit is a checkpoint
/// (three device syncs), version 1 never gets partial entries, and
/// version 3 never gets inline records (a version 3 reader would take one
/// for the end of the log).
pub const FORMAT_VERSION: u32 = 4;
/// Oldest format version this build opens.
pub const FORMAT_VERSION_MIN: u32 = 1;
/// Bytes per slot entry.
pub const ENTRY_BYTES: u64 = 64;
/// Bytes per metadata page.
pub const PAGE_BYTES: u64 = 4096;
/// Entries per metadata page (the first 64 bytes are the page header).
pub const ENTRIES_PER_PAGE: u64 = PAGE_BYTES / ENTRY_BYTES - 1;
/// Page header magic.
pub const PAGE_MAGIC: &[u8; 8] = b"NVWCPAGE";
/// Log record magic.
pub const LOG_MAGIC: &[u8; 8] = b"NVWCLOG1";
/// Bytes of a log record's header (its entries follow, 64 bytes each).
pub const LOG_HEADER_BYTES: u64 = 128;
/// Offset of commit record A; B follows 4 KiB later.
pub const COMMIT_A: u64 = 4096;
/// Offset of the slot table.
pub const TABLE_OFFSET: u64 = 3 * 4096;

/// Entry flag: the slot holds a valid version.
pub const F_VALID: u32 = 1;
/// Entry flag: the version is dirty (not yet on the backing store).
pub const F_DIRTY: u32 = 2;
/// Entry flag (format 2): a partial version. Only `lo..hi` of the slot is
/// the block's data; the backing store holds the rest of the block.
pub const F_PARTIAL: u32 = 4;
/// Entry flag (log records only): the entry's data checksum is not checked at
/// recovery. Set when the slot already held this version under a sealed
/// record or checkpoint, so its bytes are durable as far as any FLUSH
/// promised, and write-back may have rewritten them in place since.
pub const F_NOCHECK: u32 = 8;
/// Entry flag (log records of format 4 only): the record carries the
/// version's bytes (`lo..hi` of a partial version, else the whole block) in
/// its data area, with `data_crc` their CRC-32C. Recovery writes them into
/// the slot while the record is unsealed (`LogRecord`).
pub const F_INLINE: u32 = 16;

/// CRC-32C (Castagnoli) of a data block's bytes, as log entries carry it.
pub fn data_crc(b: &[u8]) -> u32 {
    crc32c::crc32c(b)
}

/// Log size (4 KiB pages) a fresh cache of `capacity` slots of
/// `block_size` bytes gets: one copy of its slot table, so that a
/// checkpoint writes about as many bytes as the log it retires, within
/// 256 KiB .. 64 MiB, but never more than an eighth of the data (at least
/// 16 KiB), so that a small cache stays mostly data.
pub fn default_log_pages(capacity: u64, block_size: u32) -> u32 {
    let table = capacity.div_ceil(ENTRIES_PER_PAGE).clamp(64, 16384);
    let eighth = (capacity * block_size as u64 / PAGE_BYTES / 8).max(4);
    table.min(eighth) as u32
}

/// Geometry of a cache device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub block_size: u32,
    pub capacity: u64,
    pub table_bytes: u64,
    /// The metadata log: `log_bytes` at `log_offset` (0 bytes: no log, format 1 and 2).
    pub log_offset: u64,
    pub log_bytes: u64,
    pub data_offset: u64,
}

impl Layout {
    /// Geometry for `cfg`.
    pub fn new(cfg: &Config) -> Self {
        let table_bytes = 2 * cfg.capacity_blocks.div_ceil(ENTRIES_PER_PAGE) * PAGE_BYTES;
        let align = (cfg.block_size as u64).max(4096);
        let log_offset = TABLE_OFFSET + table_bytes;
        let log_bytes = cfg.log_pages as u64 * PAGE_BYTES;
        let data_offset = (log_offset + log_bytes).div_ceil(align) * align;
        Layout {
            block_size: cfg.block_size,
            capacity: cfg.capacity_blocks,
            table_bytes,
            log_offset,
            log_bytes,
            data_offset,
        }
    }
    /// Total bytes the cache device must have.
    pub fn device_bytes(&self) -> u64 {
        self.data_offset + self.capacity * self.block_size as u64
    }
    /// Byte offset of slot `s`'s data.
    pub fn slot_offset(&self, s: u32) -> u64 {
        self.data_offset + s as u64 * self.block_size as u64
    }
    /// Byte offset of copy `copy` (0 or 1) of metadata page `p`.
    pub fn page_offset(&self, p: u64, copy: u8) -> u64 {
        TABLE_OFFSET + (2 * p + copy as u64) * PAGE_BYTES
    }
    /// The bytes a valid log entry's data checksum covers, as `(offset,
    /// len)` on the cache device: `lo..hi` of a partial version, else the
    /// whole slot.
    pub fn checked_bytes(&self, s: u32, e: &Entry) -> (u64, u32) {
        let at = self.slot_offset(s);
        if e.flags & F_PARTIAL != 0 {
            (at + e.lo as u64, e.hi - e.lo)
        } else {
            (at, self.block_size)
        }
    }
    /// Number of metadata pages (each stored twice).
    pub fn pages(&self) -> u64 {
        self.table_bytes / PAGE_BYTES / 2
    }
    /// Offset of commit record `which` (0 = A, 1 = B).
    pub fn commit_offset(&self, which: u64) -> u64 {
        COMMIT_A + (which & 1) * 4096
    }
    /// Largest cache capacity (slots) that fits a device of `bytes` with
    /// `block_size`, with the default log ([`default_log_pages`]).
    pub fn capacity_for(bytes: u64, block_size: u32) -> u64 {
        let bs = block_size as u64;
        let fits = |cap: u64| {
            let table = 2 * cap.div_ceil(ENTRIES_PER_PAGE) * PAGE_BYTES;
            let log = default_log_pages(cap, block_size) as u64 * PAGE_BYTES;
            let align = bs.max(4096);
            (TABLE_OFFSET + table + log).div_ceil(align) * align + cap * bs <= bytes
        };
        // Each slot costs its block plus two copies of a 64-byte entry.
        let mut cap = bytes / (bs + 2 * ENTRY_BYTES);
        while cap > 0 && !fits(cap) {
            cap -= 1 + cap / 1024;
        }
        while fits(cap + 1) {
            cap += 1;
        }
        cap
    }
}

fn crc(b: &[u8]) -> u32 {
    crc32fast::hash(b)
}
fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn get64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}
fn get32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// Superblock flag: bytes 60..504 record the backing store the cache is
/// bound to ([`BackingId`]). Superblocks written before binding existed
/// have zeroes there, so the flag is clear.
pub const SB_BOUND: u32 = 1;
/// Superblock flag: the device holds nothing any backing store needs (set by
/// `nvwc detach` after writing everything back, and by `nvwc format
/// --force`). The next open formats it afresh, keeping its uuid.
pub const SB_EMPTY: u32 = 2;

/// What kind of backing store a cache is bound to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackingKind {
    /// A regular file: identified by the label nvwc appends after its data.
    File,
    /// A block device: identified by its stable name and size (no label:
    /// a block device cannot grow, and every byte of it is the client's).
    Block,
    /// An upstream NBD export: URI, export name and size, plus the label in
    /// its redo region when it has one.
    Nbd,
}

impl BackingKind {
    /// Code stored in the superblock.
    pub fn code(self) -> u32 {
        match self {
            BackingKind::File => 1,
            BackingKind::Block => 2,
            BackingKind::Nbd => 3,
        }
    }
    /// The kind of a stored code.
    pub fn from_code(c: u32) -> Option<Self> {
        Some(match c {
            1 => BackingKind::File,
            2 => BackingKind::Block,
            3 => BackingKind::Nbd,
            _ => return None,
        })
    }
}

/// A string stored in a fixed-size superblock field: its first bytes (cut
/// at a character boundary), plus the whole string's length and CRC-32, so
/// that a string too long for the field still compares exactly.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Text {
    /// The stored prefix (the whole string when it fits).
    pub shown: String,
    /// Length of the whole string in bytes.
    pub len: u32,
    /// CRC-32 of the whole string.
    pub crc: u32,
}

impl Text {
    /// `full`, to be stored in a field of `cap` bytes.
    pub fn new(full: &str, cap: usize) -> Self {
        let mut end = full.len().min(cap);
        while !full.is_char_boundary(end) {
            end -= 1;
        }
        Text {
            shown: full[..end].to_string(),
            len: full.len().min(u32::MAX as usize) as u32,
            crc: crc(full.as_bytes()),
        }
    }
    /// Whether `full` is the string this was made from.
    pub fn is(&self, full: &str) -> bool {
        full.len() == self.len as usize
            && crc(full.as_bytes()) == self.crc
            && full.starts_with(&self.shown)
    }
    /// Only a prefix is stored.
    pub fn truncated(&self) -> bool {
        self.shown.len() < self.len as usize
    }
}

impl std::fmt::Display for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)?;
        if self.truncated() {
            f.write_str("…")?;
        }
        Ok(())
    }
}

/// Bytes of the superblock's location field.
pub const LOCATION_BYTES: usize = 256;
/// Bytes of the superblock's export-name field.
pub const NAME_BYTES: usize = 144;

/// The identity of the backing store a cache is bound to (superblock bytes
/// 60..504, valid with [`SB_BOUND`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackingId {
    pub kind: BackingKind,
    /// The uuid of the nvwc label on the backing store; all zero when it
    /// carries none (a block device, an upstream without a redo region).
    pub uuid: [u8; 16],
    /// The backing store's size in bytes: a file's data (without the label),
    /// a block device's size, an upstream export's size.
    pub size: u64,
    /// Where it was: a file's or block device's path (for a block device
    /// its `/dev/disk/by-id` name when it has one), an upstream's URI.
    pub location: Text,
    /// An upstream's export name (empty otherwise).
    pub name: Text,
}

impl BackingId {
    /// An identity; `location` and `name` are cut to their fields' sizes.
    pub fn new(kind: BackingKind, uuid: [u8; 16], size: u64, location: &str, name: &str) -> Self {
        BackingId {
            kind,
            uuid,
            size,
            location: Text::new(location, LOCATION_BYTES),
            name: Text::new(name, NAME_BYTES),
        }
    }
    /// The backing store carries an nvwc label.
    pub fn labelled(&self) -> bool {
        self.uuid != [0; 16]
    }
}

/// A uuid as `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn uuid_string(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

impl std::fmt::Display for BackingId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let label = if self.labelled() {
            format!("nvwc label {}", uuid_string(&self.uuid))
        } else {
            "no nvwc label".to_string()
        };
        match self.kind {
            BackingKind::File => write!(f, "file {} ({label}, {} bytes)", self.location, self.size),
            BackingKind::Block => write!(
                f,
                "block device {} ({label}, {} bytes)",
                self.location, self.size
            ),
            BackingKind::Nbd => write!(
                f,
                "NBD export \"{}\" at {} ({label}, {} bytes)",
                self.name, self.location, self.size
            ),
        }
    }
}

/// The superblock: written at format time, and rewritten whole (one
/// 512-byte sector) only while no request is served: when the cache is
/// bound to a backing store, or emptied ([`SB_EMPTY`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub version: u32,
    pub block_size: u32,
    pub capacity: u64,
    pub backing_size: u64,
    pub data_offset: u64,
    pub write_policy: u32,
    /// Metadata log size in 4 KiB pages (0 before format 3: no log).
    pub log_pages: u32,
    pub uuid: u64,
    /// [`SB_EMPTY`] (and [`SB_BOUND`], which encoding derives from `backing`).
    pub flags: u32,
    /// The backing store the cache is bound to; `None` in a superblock
    /// written before binding existed (or by `nvwc format --force`).
    pub backing: Option<BackingId>,
}

impl Superblock {
    /// The superblock for a fresh device formatted for `cfg` (not bound yet).
    pub fn for_config(cfg: &Config, uuid: u64) -> Self {
        let l = Layout::new(cfg);
        Superblock {
            version: FORMAT_VERSION,
            block_size: cfg.block_size,
            capacity: cfg.capacity_blocks,
            backing_size: cfg.backing_size,
            data_offset: l.data_offset,
            write_policy: cfg.write_policy.code(),
            log_pages: cfg.log_pages,
            uuid,
            flags: 0,
            backing: None,
        }
    }
    /// The device holds nothing any backing store needs ([`SB_EMPTY`]).
    pub fn empty(&self) -> bool {
        self.flags & SB_EMPTY != 0
    }
    /// 512-byte encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; 512];
        b[0..8].copy_from_slice(SB_MAGIC);
        put32(&mut b, 8, self.version);
        put32(&mut b, 12, self.block_size);
        put64(&mut b, 16, self.capacity);
        put64(&mut b, 24, self.backing_size);
        put64(&mut b, 32, self.data_offset);
        put32(&mut b, 40, self.write_policy);
        put32(&mut b, 44, self.log_pages);
        put64(&mut b, 48, self.uuid);
        let mut flags = self.flags & !SB_BOUND;
        if let Some(id) = &self.backing {
            flags |= SB_BOUND;
            put32(&mut b, 60, id.kind.code());
            b[64..80].copy_from_slice(&id.uuid);
            put64(&mut b, 80, id.size);
            for (at, t, cap) in [
                (88, &id.location, LOCATION_BYTES),
                (96, &id.name, NAME_BYTES),
            ] {
                put32(&mut b, at, t.len);
                put32(&mut b, at + 4, t.crc);
                let field = if at == 88 { 104 } else { 104 + LOCATION_BYTES };
                let n = t.shown.len().min(cap);
                b[field..field + n].copy_from_slice(&t.shown.as_bytes()[..n]);
            }
        }
        put32(&mut b, 56, flags);
        let c = crc(&b[0..508]);
        put32(&mut b, 508, c);
        b
    }
    /// Decode and verify.
    pub fn decode(b: &[u8]) -> Result<Self, FormatError> {
        if b.len() < 512 {
            return Err(FormatError::Short);
        }
        if &b[0..8] != SB_MAGIC {
            return Err(FormatError::NotNvwc);
        }
        if crc(&b[0..508]) != get32(b, 508) {
            return Err(FormatError::Checksum("superblock"));
        }
        let flags = get32(b, 56);
        let backing = if flags & SB_BOUND != 0 {
            let kind = BackingKind::from_code(get32(b, 60))
                .ok_or(FormatError::BackingKind(get32(b, 60)))?;
            let text = |at: usize, field: usize, cap: usize| {
                let len = get32(b, at);
                let mut raw = &b[field..field + (len as usize).min(cap)];
                if len as usize > cap {
                    // A cut string may stop short of the field (at a
                    // character boundary); the rest is zero.
                    while let [rest @ .., 0] = raw {
                        raw = rest;
                    }
                }
                // Stored cut at a character boundary; anything else is not ours.
                let shown = std::str::from_utf8(raw)
                    .map_err(|_| FormatError::Checksum("superblock text"))?
                    .to_string();
                Ok::<_, FormatError>(Text {
                    shown,
                    len,
                    crc: get32(b, at + 4),
                })
            };
            Some(BackingId {
                kind,
                uuid: b[64..80].try_into().expect("16 bytes"),
                size: get64(b, 80),
                location: text(88, 104, LOCATION_BYTES)?,
                name: text(96, 104 + LOCATION_BYTES, NAME_BYTES)?,
            })
        } else {
            None
        };
        let sb = Superblock {
            version: get32(b, 8),
            block_size: get32(b, 12),
            capacity: get64(b, 16),
            backing_size: get64(b, 24),
            data_offset: get64(b, 32),
            write_policy: get32(b, 40),
            log_pages: get32(b, 44),
            uuid: get64(b, 48),
            flags: flags & !SB_BOUND,
            backing,
        };
        if !(FORMAT_VERSION_MIN..=FORMAT_VERSION).contains(&sb.version) {
            return Err(FormatError::Version(sb.version));
        }
        Ok(sb)
    }
}

/// A commit record: the atomic switch from one metadata state to the next.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitRecord {
    /// Commit number: slot entries tagged with a larger number are not part of the state.
    pub commit: u64,
    /// Highest journaled transaction that is committed (closed and durable).
    pub txn_committed: u64,
    /// Highest journaled transaction that is checkpointed to the backing store.
    pub txn_checkpointed: u64,
    /// Next write sequence number.
    pub next_seq: u64,
    /// Next ordered-write completion index.
    pub next_cidx: u64,
    /// The engine shut down cleanly after this commit.
    pub clean_shutdown: bool,
}

impl CommitRecord {
    /// 512-byte encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; 512];
        b[0..8].copy_from_slice(CR_MAGIC);
        put64(&mut b, 8, self.commit);
        put64(&mut b, 16, self.txn_committed);
        put64(&mut b, 24, self.txn_checkpointed);
        put64(&mut b, 32, self.next_seq);
        put64(&mut b, 40, self.next_cidx);
        b[48] = self.clean_shutdown as u8;
        let c = crc(&b[0..508]);
        put32(&mut b, 508, c);
        b
    }
    /// Decode; `None` if absent or torn.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() < 512 || &b[0..8] != CR_MAGIC || crc(&b[0..508]) != get32(b, 508) {
            return None;
        }
        Some(CommitRecord {
            commit: get64(b, 8),
            txn_committed: get64(b, 16),
            txn_checkpointed: get64(b, 24),
            next_seq: get64(b, 32),
            next_cidx: get64(b, 40),
            clean_shutdown: b[48] != 0,
        })
    }
}

/// A metadata log record (format 3; format 4 adds the data area): one
/// commit that cost a single device flush, or (inline, format 4) a single
/// FUA write. Records follow the checkpoint they extend (`epoch`, the
/// checkpoint's commit number) with consecutive numbers, each at a 4 KiB
/// boundary of the log region, the first at its start.
///
/// ```text
/// 0..8     magic NVWCLOG1
/// 8..16    epoch: commit number of the checkpoint this record follows
/// 16..24   record (commit) number n = previous + 1
/// 24..32   sealed: highest commit whose versions' bytes were durable in
///          their slots when the record was built
/// 32..36   entry count
/// 36..40   record length in 4 KiB pages
/// 40..80   commit-record fields: txn_committed, txn_checkpointed, next_seq, next_cidx, (reserved)
/// 80..84   data-area bytes (format 4; zero in format 3 and without F_INLINE entries)
/// 124..128 CRC-32C of bytes 0..124 and of every entry byte
/// 128..    entries, 64 bytes each (slot entries carrying `data_crc`)
/// then, from the next 4 KiB boundary: the data area, the bytes of each
///          `F_INLINE` entry in entry order, each `data_crc` checked at decode
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogRecord {
    pub epoch: u64,
    pub n: u64,
    pub sealed: u64,
    /// `commit` is `n`; `clean_shutdown` is never set (a clean shutdown is a checkpoint).
    pub record: CommitRecord,
    pub entries: Vec<(u32, Entry)>,
    /// The data area: the bytes of each `F_INLINE` entry, in entry order.
    pub data: Vec<u8>,
}

impl LogRecord {
    /// Bytes a record of `entries` entries and `data` data-area bytes takes
    /// in the log (whole 4 KiB pages).
    pub fn bytes_for(entries: usize, data: u64) -> u64 {
        Self::data_at(entries) + data.div_ceil(PAGE_BYTES) * PAGE_BYTES
    }
    /// Where the data area starts: the 4 KiB boundary after the entries.
    fn data_at(entries: usize) -> u64 {
        (LOG_HEADER_BYTES + entries as u64 * ENTRY_BYTES).div_ceil(PAGE_BYTES) * PAGE_BYTES
    }
    /// Encoding, padded with zeroes to [`LogRecord::bytes_for`].
    pub fn encode(&self) -> Vec<u8> {
        let len = Self::bytes_for(self.entries.len(), self.data.len() as u64);
        let mut b = vec![0u8; len as usize];
        let at = Self::data_at(self.entries.len()) as usize;
        b[at..at + self.data.len()].copy_from_slice(&self.data);
        put32(&mut b, 80, self.data.len() as u32);
        b[0..8].copy_from_slice(LOG_MAGIC);
        put64(&mut b, 8, self.epoch);
        put64(&mut b, 16, self.n);
        put64(&mut b, 24, self.sealed);
        put32(&mut b, 32, self.entries.len() as u32);
        put32(&mut b, 36, (len / PAGE_BYTES) as u32);
        put64(&mut b, 40, self.record.txn_committed);
        put64(&mut b, 48, self.record.txn_checkpointed);
        put64(&mut b, 56, self.record.next_seq);
        put64(&mut b, 64, self.record.next_cidx);
        for (i, (slot, e)) in self.entries.iter().enumerate() {
            let at = LOG_HEADER_BYTES as usize + i * 64;
            e.encode_into(*slot, &mut b[at..at + 64]);
        }
        let c = Self::crc(&b, self.entries.len());
        put32(&mut b, 124, c);
        b
    }
    /// CRC-32C, not the entries' own CRC-32 (IEEE): a CRC over a message
    /// that ends in a block carrying its own CRC of the same polynomial is
    /// the same whatever that block holds, so an IEEE record CRC would not
    /// see a torn record whose last sectors hold an older record's intact
    /// entries (the VOPR found it: journaled seed 14564).
    fn crc(b: &[u8], count: usize) -> u32 {
        let end = LOG_HEADER_BYTES as usize + count * 64;
        crc32c::crc32c_append(crc32c::crc32c(&b[0..124]), &b[128..end])
    }
    /// Decode the record at the start of `b` (the rest of the log region)
    /// of a cache of `block_size`-byte blocks: `None` if there is none, it
    /// is torn, or it does not fit.
    pub fn decode(b: &[u8], block_size: u32) -> Option<(Self, u64)> {
        if b.len() < LOG_HEADER_BYTES as usize || &b[0..8] != LOG_MAGIC {
            return None;
        }
        let count = get32(b, 32) as usize;
        let len = get32(b, 36) as u64 * PAGE_BYTES;
        let data_len = u64::from(get32(b, 80));
        if len != Self::bytes_for(count, data_len) || len > b.len() as u64 {
            return None;
        }
        if Self::crc(b, count) != get32(b, 124) {
            return None;
        }
        let mut entries = Vec::with_capacity(count);
        for i in 0..count {
            let at = LOG_HEADER_BYTES as usize + i * 64;
            let slot = get32(b, at + 56);
            entries.push((slot, Entry::decode(slot, &b[at..at + 64])?));
        }
        // The data area: each inline entry's bytes MUST match its checksum
        // (a record whose data area is torn is no record), and the entries
        // MUST account for the whole area.
        let area = Self::data_at(count) as usize;
        let data = b[area..area + data_len as usize].to_vec();
        let mut pos = 0usize;
        for (_, e) in &entries {
            if e.flags & F_INLINE == 0 {
                continue;
            }
            let n = e.inline_len(block_size)?;
            let bytes = data.get(pos..pos + n)?;
            if data_crc(bytes) != e.data_crc {
                return None;
            }
            pos += n;
        }
        if pos != data.len() {
            return None;
        }
        let n = get64(b, 16);
        Some((
            LogRecord {
                epoch: get64(b, 8),
                n,
                sealed: get64(b, 24),
                record: CommitRecord {
                    commit: n,
                    txn_committed: get64(b, 40),
                    txn_checkpointed: get64(b, 48),
                    next_seq: get64(b, 56),
                    next_cidx: get64(b, 64),
                    clean_shutdown: false,
                },
                entries,
                data,
            },
            len,
        ))
    }

    /// The inline entries with their bytes: `(slot, entry, bytes)` in
    /// entry order (the data area split as `decode` checked it).
    pub fn inline(&self, block_size: u32) -> impl Iterator<Item = (u32, &Entry, &[u8])> + '_ {
        let mut pos = 0usize;
        self.entries
            .iter()
            .filter(|(_, e)| e.flags & F_INLINE != 0)
            .map(move |(s, e)| {
                let n = e
                    .inline_len(block_size)
                    .expect("an inline entry has a byte range");
                let bytes = &self.data[pos..pos + n];
                pos += n;
                (*s, e, bytes)
            })
    }
}

/// One slot-table entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// Backing block number (in cache blocks).
    pub lbn: u64,
    /// Write sequence number of the version (issue order; larger is newer).
    pub seq: u64,
    /// Commit that wrote this entry.
    pub commit: u64,
    /// Journaled: transaction id. Ordered: completion index.
    pub aux0: u64,
    /// Ordered: number of completions before the write was issued (its dependency floor).
    pub aux1: u64,
    /// Byte range within the block that the version's writes changed.
    pub lo: u32,
    pub hi: u32,
    /// `F_VALID | F_DIRTY | F_PARTIAL | F_NOCHECK`.
    pub flags: u32,
    /// Log entries of valid versions: CRC-32C ([`data_crc`]) of the
    /// version's bytes in its slot (`lo..hi` of a partial version, else the
    /// whole block). Zero in slot-table pages.
    pub data_crc: u32,
}

impl Entry {
    /// Bytes an `F_INLINE` entry carries, as [`Layout::checked_bytes`]
    /// counts them: `hi - lo` of a partial version, else the whole block of
    /// `block_size` bytes; `None` for a partial range that is not one.
    pub fn inline_len(&self, block_size: u32) -> Option<usize> {
        if self.flags & F_PARTIAL == 0 {
            return Some(block_size as usize);
        }
        (self.lo < self.hi && self.hi <= block_size).then(|| (self.hi - self.lo) as usize)
    }
    /// Encode into `b[0..64]` for slot `slot`.
    pub fn encode_into(&self, slot: u32, b: &mut [u8]) {
        assert!(b.len() >= 64);
        b[..64].fill(0);
        put64(b, 0, self.lbn);
        put64(b, 8, self.seq);
        put64(b, 16, self.commit);
        put64(b, 24, self.aux0);
        put64(b, 32, self.aux1);
        put32(b, 40, self.lo);
        put32(b, 44, self.hi);
        put32(b, 48, self.flags);
        put32(b, 52, self.data_crc);
        put32(b, 56, slot);
        let c = crc(&b[0..60]);
        put32(b, 60, c);
    }
    /// Decode; `None` if torn, blank or written for another slot.
    pub fn decode(slot: u32, b: &[u8]) -> Option<Self> {
        if b.len() < 64 || crc(&b[0..60]) != get32(b, 60) || get32(b, 56) != slot {
            return None;
        }
        Some(Entry {
            lbn: get64(b, 0),
            seq: get64(b, 8),
            commit: get64(b, 16),
            aux0: get64(b, 24),
            aux1: get64(b, 32),
            lo: get32(b, 40),
            hi: get32(b, 44),
            flags: get32(b, 48),
            data_crc: get32(b, 52),
        })
    }
}

/// Build a metadata page: header (magic, page number, commit tag, CRC) and entries.
/// `entries[i]` is the entry of slot `page * ENTRIES_PER_PAGE + i`.
pub fn encode_page(page: u64, tag: u64, entries: &[(u32, Entry)]) -> Vec<u8> {
    assert!(entries.len() as u64 <= ENTRIES_PER_PAGE);
    let mut b = vec![0u8; PAGE_BYTES as usize];
    b[0..8].copy_from_slice(PAGE_MAGIC);
    put64(&mut b, 8, page);
    put64(&mut b, 16, tag);
    for (i, (slot, e)) in entries.iter().enumerate() {
        let at = 64 + i * 64;
        e.encode_into(*slot, &mut b[at..at + 64]);
    }
    let c = page_crc(&b);
    put32(&mut b, 60, c);
    b
}

fn page_crc(b: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&b[0..60]);
    h.update(&b[64..PAGE_BYTES as usize]);
    h.finalize()
}

/// Decode a metadata page copy: `Some(tag)` if it is intact and belongs to page `page`.
pub fn page_tag(page: u64, b: &[u8]) -> Option<u64> {
    if b.len() < PAGE_BYTES as usize
        || &b[0..8] != PAGE_MAGIC
        || get64(b, 8) != page
        || page_crc(b) != get32(b, 60)
    {
        return None;
    }
    Some(get64(b, 16))
}

/// Errors reading a cache device's metadata.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("metadata region too short")]
    Short,
    #[error("not an nvwc cache device (bad superblock magic)")]
    NotNvwc,
    #[error("{0} checksum mismatch")]
    Checksum(&'static str),
    #[error("unsupported format version {0}")]
    Version(u32),
    #[error("cache device was formatted with block size {found}, configuration says {want}")]
    BlockSize { found: u32, want: u32 },
    #[error("cache device holds {found} slots, configuration says {want}")]
    Capacity { found: u64, want: u64 },
    #[error("cache device has a {found}-page metadata log, configuration says {want}")]
    LogSize { found: u32, want: u32 },
    #[error("cache device belongs to a backing store of {found} bytes, configuration says {want}")]
    BackingSize { found: u64, want: u64 },
    #[error("cache holds dirty data written under write policy {found}; open it with that policy (or flush it first)")]
    Policy { found: String },
    #[error("no valid commit record")]
    NoCommit,
    #[error("superblock names an unknown backing store kind {0}")]
    BackingKind(u32),
}

/// The bytes a fresh cache device needs, as `(offset, bytes)` writes; everything
/// else may stay as it is (stale entries fail their CRC or their slot check,
/// or carry a commit tag above the fresh commit record's 0... which is why the
/// table is zeroed too).
pub fn format_writes(cfg: &Config, uuid: u64) -> Vec<(u64, Vec<u8>)> {
    let l = Layout::new(cfg);
    let sb = Superblock::for_config(cfg, uuid);
    let mut v = vec![(0u64, sb.encode())];
    let cr = CommitRecord {
        commit: 0,
        next_seq: 1,
        ..Default::default()
    };
    v.push((l.commit_offset(0), cr.encode()));
    v.push((l.commit_offset(1), vec![0u8; 512]));
    // Zero the table and the log in 1 MiB chunks (a log record left by an
    // earlier format of the device must not read as one of this format's).
    let mut off = 0;
    let meta = l.table_bytes + l.log_bytes;
    while off < meta {
        let n = (meta - off).min(1 << 20);
        v.push((TABLE_OFFSET + off, vec![0u8; n as usize]));
        off += n;
    }
    v
}

/// Check a superblock against a configuration.
pub fn check_superblock(sb: &Superblock, cfg: &Config) -> Result<(), FormatError> {
    if sb.block_size != cfg.block_size {
        return Err(FormatError::BlockSize {
            found: sb.block_size,
            want: cfg.block_size,
        });
    }
    if sb.capacity != cfg.capacity_blocks {
        return Err(FormatError::Capacity {
            found: sb.capacity,
            want: cfg.capacity_blocks,
        });
    }
    if sb.log_pages != cfg.log_pages {
        return Err(FormatError::LogSize {
            found: sb.log_pages,
            want: cfg.log_pages,
        });
    }
    if sb.backing_size != cfg.backing_size {
        return Err(FormatError::BackingSize {
            found: sb.backing_size,
            want: cfg.backing_size,
        });
    }
    Ok(())
}

/// Name of a stored policy code.
pub fn policy_name(code: u32) -> String {
    WritePolicyKind::from_code(code)
        .map(|k| k.name().to_string())
        .unwrap_or_else(|| format!("#{code}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_roundtrip_and_torn_page() {
        let e = Entry {
            lbn: 1,
            seq: 2,
            commit: 3,
            flags: F_VALID,
            ..Default::default()
        };
        let b = encode_page(5, 3, &[(315, e)]);
        assert_eq!(page_tag(5, &b), Some(3));
        assert_eq!(page_tag(6, &b), None, "page number is checked");
        let mut t = b.clone();
        t[2048] ^= 1;
        assert_eq!(page_tag(5, &t), None, "a torn page is rejected");
        assert_eq!(Entry::decode(315, &b[64..128]), Some(e));
    }

    /// A format-4 record carries its inline entries' bytes after the
    /// entries, from the next 4 KiB boundary: whole blocks and a partial
    /// version's `lo..hi`. A torn data area, an entry whose CRC does not
    /// match its bytes, or bytes the entries do not account for make it no
    /// record; a record without inline entries encodes as in format 3.
    #[test]
    fn an_inline_log_record_carries_and_checks_its_data() {
        let bs = 4096u32;
        let whole = vec![0x5au8; bs as usize];
        let part = vec![0xa5u8; 100];
        // A whole-block version whose written range is narrower (ordered
        // keeps the exact range): it still carries the whole block.
        let e_whole = Entry {
            lbn: 3,
            seq: 9,
            commit: 7,
            lo: 512,
            hi: 1024,
            flags: F_VALID | F_DIRTY | F_INLINE,
            data_crc: data_crc(&whole),
            ..Default::default()
        };
        let e_part = Entry {
            lbn: 4,
            seq: 10,
            commit: 7,
            lo: 200,
            hi: 300,
            flags: F_VALID | F_DIRTY | F_PARTIAL | F_INLINE,
            data_crc: data_crc(&part),
            ..Default::default()
        };
        let e_free = Entry {
            commit: 7,
            ..Default::default()
        };
        let r = LogRecord {
            epoch: 5,
            n: 7,
            sealed: 5,
            record: CommitRecord {
                commit: 7,
                ..Default::default()
            },
            entries: vec![(1, e_whole), (2, e_free), (6, e_part)],
            data: [whole.clone(), part.clone()].concat(),
        };
        let b = r.encode();
        assert_eq!(b.len() as u64, LogRecord::bytes_for(3, 4196));
        assert_eq!(b.len(), 3 * 4096, "a header page and two data pages");
        assert_eq!(&b[4096..8192], &whole[..], "data from the first boundary");
        assert_eq!(&b[8192..8292], &part[..]);
        let (got, len) = LogRecord::decode(&b, bs).expect("decodes");
        assert_eq!((&got, len), (&r, 3 * 4096));
        let split: Vec<(u32, Vec<u8>)> = got.inline(bs).map(|(s, _, d)| (s, d.to_vec())).collect();
        assert_eq!(split, vec![(1, whole.clone()), (6, part.clone())]);
        for at in [4096usize, 8191, 8192, 8291] {
            let mut t = b.clone();
            t[at] ^= 1;
            assert_eq!(LogRecord::decode(&t, bs), None, "data byte {at} torn");
        }
        // Zero padding after the data is not checked: not data.
        let mut t = b.clone();
        t[8292] ^= 1;
        assert!(LogRecord::decode(&t, bs).is_some());
        // Bytes no inline entry accounts for.
        let mut extra = r.clone();
        extra.data.push(0);
        assert_eq!(LogRecord::decode(&extra.encode(), bs), None);
        // A data area shorter than its entries need.
        let mut short = r.clone();
        short.data.truncate(4096);
        assert_eq!(LogRecord::decode(&short.encode(), bs), None);
        // Cut off after the entries: no record.
        assert_eq!(LogRecord::decode(&b[..8192], bs), None);
        // A partial inline entry whose range is empty, or runs past the
        // block, is no record (its CRC is right, its range is not).
        for (lo, hi) in [(100, 100), (0, bs + 512)] {
            let bytes = vec![7u8; (hi - lo) as usize];
            let bad = LogRecord {
                entries: vec![(
                    6,
                    Entry {
                        lo,
                        hi,
                        data_crc: data_crc(&bytes),
                        ..e_part
                    },
                )],
                data: bytes,
                ..r.clone()
            };
            assert_eq!(LogRecord::decode(&bad.encode(), bs), None, "{lo}..{hi}");
        }
        // Without inline entries: format 3's bytes (the data-area length,
        // 80..84, stays zero).
        let plain = LogRecord {
            entries: vec![(2, e_free)],
            data: Vec::new(),
            ..r.clone()
        };
        let pb = plain.encode();
        assert_eq!(pb.len(), 4096);
        assert_eq!(&pb[80..84], &[0, 0, 0, 0]);
        assert_eq!(LogRecord::decode(&pb, bs), Some((plain, 4096)));
    }

    #[test]
    fn log_record_roundtrip_torn_and_misplaced() {
        let e = Entry {
            lbn: 9,
            seq: 4,
            commit: 12,
            flags: F_VALID | F_DIRTY,
            data_crc: 77,
            ..Default::default()
        };
        let r = LogRecord {
            epoch: 10,
            n: 12,
            sealed: 11,
            record: CommitRecord {
                commit: 12,
                next_seq: 5,
                txn_committed: 3,
                ..Default::default()
            },
            entries: (0..70).map(|i| (i, e)).collect(),
            data: Vec::new(),
        };
        let b = r.encode();
        assert_eq!(b.len() as u64, LogRecord::bytes_for(70, 0));
        assert_eq!(
            b.len(),
            2 * PAGE_BYTES as usize,
            "128 + 70 × 64 bytes take two pages"
        );
        let mut region = b.clone();
        region.extend_from_slice(&[0u8; 4096]);
        assert_eq!(LogRecord::decode(&region, 4096), Some((r.clone(), 8192)));
        assert_eq!(
            LogRecord::decode(&region[8192..], 4096),
            None,
            "zeroes are no record"
        );
        for at in [3usize, 30, 130, 4095 + 100, 128 + 69 * 64 + 10] {
            let mut t = region.clone();
            t[at] ^= 0x40;
            assert_eq!(
                LogRecord::decode(&t, 4096),
                None,
                "a torn record (byte {at}) is rejected"
            );
        }
        assert_eq!(
            LogRecord::decode(&b[..4096], 4096),
            None,
            "a record cut short is rejected"
        );
        // A record torn over an older one at the same place: its first
        // sector new, the rest old (whole, self-consistent old entries).
        let entry = |slot: u32, commit: u64| {
            (
                slot,
                Entry {
                    commit,
                    ..Default::default()
                },
            )
        };
        let old = LogRecord {
            epoch: 184,
            n: 186,
            sealed: 185,
            entries: (0..9).map(|i| entry(i, 186)).collect(),
            ..Default::default()
        }
        .encode();
        let new = LogRecord {
            epoch: 189,
            n: 191,
            sealed: 190,
            entries: (10..17).map(|i| entry(i, 191)).collect(),
            ..Default::default()
        }
        .encode();
        let mut torn = new.clone();
        torn[512..].copy_from_slice(&old[512..]);
        assert_ne!(torn[512..576], new[512..576]);
        assert_eq!(
            LogRecord::decode(&torn, 4096),
            None,
            "a torn record is rejected"
        );
        let data = vec![7u8; 4096];
        assert_ne!(data_crc(&data), data_crc(&data[..4095]));
        assert_eq!(data_crc(b"123456789"), 0xe306_9283, "CRC-32C check value");
    }

    #[test]
    fn entry_roundtrip_and_torn_detection() {
        let e = Entry {
            lbn: 7,
            seq: 99,
            commit: 3,
            aux0: 5,
            aux1: 6,
            lo: 512,
            hi: 1024,
            flags: F_VALID | F_DIRTY,
            data_crc: 0xdead_beef,
        };
        let mut b = [0u8; 64];
        e.encode_into(12, &mut b);
        assert_eq!(Entry::decode(12, &b), Some(e));
        assert_eq!(
            Entry::decode(13, &b),
            None,
            "entry for another slot must be rejected"
        );
        b[3] ^= 1;
        assert_eq!(Entry::decode(12, &b), None, "torn entry must be rejected");
        assert_eq!(
            Entry::decode(0, &[0u8; 64]),
            None,
            "blank entry must be rejected"
        );
    }

    #[test]
    fn commit_and_superblock_roundtrip() {
        let c = CommitRecord {
            commit: 9,
            txn_committed: 4,
            txn_checkpointed: 2,
            next_seq: 77,
            next_cidx: 5,
            clean_shutdown: true,
        };
        assert_eq!(CommitRecord::decode(&c.encode()), Some(c));
        let mut b = c.encode();
        b[10] ^= 0xff;
        assert_eq!(CommitRecord::decode(&b), None);
        let cfg = Config::new(4096, 100, 1 << 30, WritePolicyKind::Ordered);
        let sb = Superblock::for_config(&cfg, 42);
        assert_eq!(Superblock::decode(&sb.encode()), Ok(sb.clone()));
        assert!(check_superblock(&sb, &cfg).is_ok());
    }

    /// A superblock as written before binding existed: the same fields,
    /// zeroes from byte 56 on (and at 44..48 before format 3's log).
    fn pre_binding_superblock(sb: &Superblock) -> Vec<u8> {
        let mut b = vec![0u8; 512];
        b[0..8].copy_from_slice(SB_MAGIC);
        put32(&mut b, 8, sb.version);
        put32(&mut b, 12, sb.block_size);
        put64(&mut b, 16, sb.capacity);
        put64(&mut b, 24, sb.backing_size);
        put64(&mut b, 32, sb.data_offset);
        put32(&mut b, 40, sb.write_policy);
        put32(&mut b, 44, sb.log_pages);
        put64(&mut b, 48, sb.uuid);
        let c = crc(&b[0..508]);
        put32(&mut b, 508, c);
        b
    }

    #[test]
    fn bound_superblock_roundtrip_and_old_superblocks() {
        let cfg = Config::new(4096, 100, 1 << 30, WritePolicyKind::WriteBack);
        let mut sb = Superblock::for_config(&cfg, 7);
        // An unbound superblock encodes exactly as before binding existed.
        assert_eq!(sb.encode(), pre_binding_superblock(&sb));
        let old = Superblock::decode(&pre_binding_superblock(&sb)).unwrap();
        assert_eq!((old.backing.clone(), old.flags), (None, 0));
        assert_eq!(old, sb);

        let uuid = [0x5a; 16];
        sb.backing = Some(BackingId::new(
            BackingKind::File,
            uuid,
            1 << 30,
            "/srv/a.img",
            "",
        ));
        let b = sb.encode();
        assert_eq!(get32(&b, 56), SB_BOUND);
        let back = Superblock::decode(&b).unwrap();
        assert_eq!(back, sb);
        let id = back.backing.unwrap();
        assert!(id.labelled() && id.location.is("/srv/a.img") && !id.location.is("/srv/b.img"));
        assert_eq!(
            id.to_string(),
            "file /srv/a.img (nvwc label 5a5a5a5a-5a5a-5a5a-5a5a-5a5a5a5a5a5a, 1073741824 bytes)"
        );

        // Every binding byte is under the CRC.
        for at in [56, 60, 64, 79, 80, 88, 100, 104, 400, 503] {
            let mut t = b.clone();
            t[at] ^= 1;
            assert_eq!(
                Superblock::decode(&t),
                Err(FormatError::Checksum("superblock")),
                "byte {at}"
            );
        }
        // An unknown kind is refused, not guessed.
        let mut t = b.clone();
        put32(&mut t, 60, 9);
        let c = crc(&t[0..508]);
        put32(&mut t, 508, c);
        assert_eq!(Superblock::decode(&t), Err(FormatError::BackingKind(9)));

        // The empty flag survives (with or without a binding).
        sb.flags = SB_EMPTY;
        let e = Superblock::decode(&sb.encode()).unwrap();
        assert!(e.empty() && e.backing.is_some());
        sb.backing = None;
        assert!(Superblock::decode(&sb.encode()).unwrap().empty());
    }

    #[test]
    fn long_locations_are_cut_but_compare_exactly() {
        let cfg = Config::new(4096, 100, 1 << 30, WritePolicyKind::Journaled);
        let mut sb = Superblock::for_config(&cfg, 7);
        // A URI longer than its field, with a two-byte character at the cut.
        let uri = format!(
            "nbd+unix:///?socket=/{}é{}",
            "d".repeat(234),
            "x".repeat(300)
        );
        let name = "n".repeat(NAME_BYTES + 10);
        sb.backing = Some(BackingId::new(
            BackingKind::Nbd,
            [0; 16],
            1 << 30,
            &uri,
            &name,
        ));
        let id = Superblock::decode(&sb.encode()).unwrap().backing.unwrap();
        assert!(id.location.truncated() && id.location.shown.len() == LOCATION_BYTES - 1);
        assert!(id.location.is(&uri), "the whole URI still matches");
        let mut other = uri.clone();
        other.pop();
        other.push('y');
        assert!(!id.location.is(&other), "a difference past the cut is seen");
        assert!(id.name.is(&name) && !id.name.is(&name[1..]));
        assert!(!id.labelled());
        assert!(id.to_string().starts_with("NBD export \"nnn"));
        assert!(id.to_string().contains("…"));
    }

    /// Records are read from buffers of other lengths than their own: a
    /// commit record or page from a larger read, a log record from the rest
    /// of the log region (exactly its length when it ends the region). A
    /// buffer too short is no record (and no panic), a longer one still is.
    #[test]
    fn records_decode_from_longer_buffers_and_reject_short_ones() {
        let c = CommitRecord {
            commit: 3,
            next_seq: 9,
            ..Default::default()
        };
        let mut long = c.encode();
        long.resize(4096, 0xee);
        assert_eq!(CommitRecord::decode(&long), Some(c));
        assert_eq!(CommitRecord::decode(&c.encode()[..511]), None);

        // The superblock, read as its whole 4 KiB region.
        let cfg = Config::new(4096, 100, 1 << 30, WritePolicyKind::WriteBack);
        let sb = Superblock::for_config(&cfg, 5);
        let mut region = sb.encode();
        region.resize(4096, 0);
        assert_eq!(Superblock::decode(&region), Ok(sb.clone()));
        assert_eq!(
            Superblock::decode(&sb.encode()[..511]),
            Err(FormatError::Short)
        );

        let e = Entry {
            lbn: 4,
            seq: 5,
            flags: F_VALID,
            ..Default::default()
        };
        let mut b = [0u8; 100];
        e.encode_into(8, &mut b);
        assert_eq!(Entry::decode(8, &b), Some(e));
        assert_eq!(Entry::decode(8, &b[..63]), None);

        let page = encode_page(2, 7, &[(126, e)]);
        let mut long = page.clone();
        long.extend_from_slice(&[0xee; 512]);
        assert_eq!(page_tag(2, &long), Some(7));
        assert_eq!(page_tag(2, &page[..4095]), None);

        let r = LogRecord {
            epoch: 1,
            n: 2,
            sealed: 1,
            record: CommitRecord {
                commit: 2,
                next_seq: 6,
                ..Default::default()
            },
            entries: vec![(3, e)],
            data: Vec::new(),
        };
        let b = r.encode();
        assert_eq!(
            LogRecord::decode(&b, 4096),
            Some((r.clone(), 4096)),
            "a record ending the region"
        );
        for cut in [20, 100, 127, 128, 4095] {
            assert_eq!(LogRecord::decode(&b[..cut], 4096), None, "{cut} bytes");
        }
    }

    /// Every check of a record's header is its own: a record whose CRC is
    /// right but whose magic (or, for a log record, length) is not, is no
    /// record. Such a sector is what another record type looks like: a
    /// superblock's sector carries a valid CRC at the same place as a
    /// commit record's.
    #[test]
    fn a_valid_crc_under_another_header_is_no_record() {
        let cfg = Config::new(4096, 100, 1 << 30, WritePolicyKind::WriteBack);
        let sb = Superblock::for_config(&cfg, 1).encode();
        assert_eq!(
            CommitRecord::decode(&sb),
            None,
            "a superblock is no commit record"
        );

        let mut page = encode_page(2, 7, &[]);
        page[0..8].copy_from_slice(b"NVWCPAGX");
        let c = page_crc(&page);
        put32(&mut page, 60, c);
        assert_eq!(page_tag(2, &page), None, "a page with another magic");

        let r = LogRecord {
            epoch: 1,
            n: 2,
            entries: vec![(3, Entry::default())],
            ..Default::default()
        };
        // `edit` changes an encoding of `r`, then its CRC is made to match:
        // still no record.
        let refused = |edit: &dyn Fn(&mut Vec<u8>), what: &str| {
            let mut b = r.encode();
            edit(&mut b);
            let c = LogRecord::crc(&b, 1);
            put32(&mut b, 124, c);
            assert_eq!(LogRecord::decode(&b, 4096), None, "{what}");
        };
        refused(
            &|b| b[0..8].copy_from_slice(b"NVWCLOGX"),
            "a log record with another magic",
        );

        // A length field that disagrees with the entry count (two pages for
        // one entry), the CRC made to match: not a record, even where the
        // region holds the two pages.
        refused(
            &|b| {
                b.resize(8192, 0);
                put32(b, 36, 2);
            },
            "a log record of the wrong length",
        );
    }

    /// Every backing kind keeps its code through the superblock, and names
    /// itself.
    #[test]
    fn every_backing_kind_roundtrips_and_names_itself() {
        let cfg = Config::new(4096, 100, 1 << 30, WritePolicyKind::WriteBack);
        let mut sb = Superblock::for_config(&cfg, 7);
        assert!(!sb.empty() && !Superblock::decode(&sb.encode()).unwrap().empty());
        let kinds = [BackingKind::File, BackingKind::Block, BackingKind::Nbd];
        let codes: Vec<u32> = kinds.iter().map(|k| k.code()).collect();
        assert_eq!(codes, [1, 2, 3]);
        for k in kinds {
            assert_eq!(BackingKind::from_code(k.code()), Some(k));
            sb.backing = Some(BackingId::new(k, [0; 16], 1 << 20, "/dev/sdq", "x"));
            assert_eq!(Superblock::decode(&sb.encode()), Ok(sb.clone()), "{k:?}");
        }
        assert_eq!(BackingKind::from_code(0), None);
        assert_eq!(BackingKind::from_code(4), None);
        assert_eq!(
            sb.backing.as_ref().map(|b| b.to_string()).unwrap(),
            "NBD export \"x\" at /dev/sdq (no nvwc label, 1048576 bytes)"
        );
        let id = BackingId::new(BackingKind::Block, [0; 16], 1 << 20, "/dev/sdq", "");
        assert_eq!(
            id.to_string(),
            "block device /dev/sdq (no nvwc label, 1048576 bytes)"
        );
        let mut u = [0u8; 16];
        for (i, b) in u.iter_mut().enumerate() {
            *b = i as u8 * 17;
        }
        assert_eq!(uuid_string(&u), "00112233-4455-6677-8899-aabbccddeeff");
    }

    /// A superblock is checked against the configuration field by field,
    /// each mismatch with its own error; a policy code is named.
    #[test]
    fn a_superblock_for_another_configuration_is_refused_by_field() {
        let cfg = Config::new(4096, 100, 1 << 30, WritePolicyKind::Ordered);
        let sb = Superblock::for_config(&cfg, 42);
        assert_eq!(check_superblock(&sb, &cfg), Ok(()));
        // One field changed at a time, and the error that names it.
        type Change = fn(&mut Config);
        let cases: [(Change, FormatError); 4] = [
            (
                |c| c.block_size = 512,
                FormatError::BlockSize {
                    found: 4096,
                    want: 512,
                },
            ),
            (
                |c| c.capacity_blocks = 99,
                FormatError::Capacity {
                    found: 100,
                    want: 99,
                },
            ),
            (
                |c| c.log_pages += 1,
                FormatError::LogSize {
                    found: cfg.log_pages,
                    want: cfg.log_pages + 1,
                },
            ),
            (
                |c| c.backing_size = 1 << 29,
                FormatError::BackingSize {
                    found: 1 << 30,
                    want: 1 << 29,
                },
            ),
        ];
        for (change, want) in cases {
            let mut other = cfg.clone();
            change(&mut other);
            assert_eq!(check_superblock(&sb, &other), Err(want));
        }
        assert_eq!(policy_name(3), "ordered");
        assert_eq!(policy_name(5), "journaled-hints");
        assert_eq!(policy_name(77), "#77");
    }

    /// A fresh format writes the superblock, commit record A (commit 0, next
    /// sequence number 1), a blank commit record B, and zeroes over exactly
    /// the table and the log, in order and without a gap: nothing of an
    /// earlier format's metadata survives, and no data slot is touched.
    #[test]
    fn a_format_zeroes_exactly_the_metadata() {
        // A table and log of several MiB, not a multiple of the 1 MiB chunks.
        let cfg = Config::new(4096, 100_000, 1 << 32, WritePolicyKind::Journaled);
        let l = Layout::new(&cfg);
        let meta = l.table_bytes + l.log_bytes;
        assert!(meta > 3 << 20 && !meta.is_multiple_of(1 << 20));
        let w = format_writes(&cfg, 9);
        assert_eq!(w[0], (0, Superblock::for_config(&cfg, 9).encode()));
        let cr = CommitRecord::decode(&w[1].1).unwrap();
        assert_eq!(w[1].0, l.commit_offset(0));
        assert_eq!((cr.commit, cr.next_seq, cr.clean_shutdown), (0, 1, false));
        assert_eq!(w[2], (l.commit_offset(1), vec![0u8; 512]));
        let mut at = TABLE_OFFSET;
        for (off, b) in &w[3..] {
            assert_eq!(*off, at, "chunks in order, without a gap");
            assert!(!b.is_empty() && b.len() <= 1 << 20 && b.iter().all(|&x| x == 0));
            at += b.len() as u64;
        }
        assert_eq!(at, TABLE_OFFSET + meta, "the table and log, no more");
        assert_eq!(at, l.log_offset + l.log_bytes);
    }

    #[test]
    fn layout_is_aligned_and_fits() {
        for bs in [512u32, 4096, 65536, 1 << 20] {
            let cfg = Config::new(bs, 1000, 1 << 30, WritePolicyKind::WriteBack);
            let l = Layout::new(&cfg);
            assert_eq!(l.data_offset % (bs as u64).max(4096), 0);
            assert!(l.data_offset >= TABLE_OFFSET + 1000 * ENTRY_BYTES);
            assert!(Layout::capacity_for(l.device_bytes(), bs) >= 999);
        }
    }

    #[test]
    fn a_text_that_fills_its_field_roundtrips_exactly() {
        // Only a cut text has its zero padding stripped: a text of exactly
        // its field's size is kept whole, zero bytes at its end included.
        let cfg = Config::new(4096, 100, 1 << 30, WritePolicyKind::Journaled);
        let mut sb = Superblock::for_config(&cfg, 7);
        let location = format!("{}\0\0", "l".repeat(LOCATION_BYTES - 2));
        let name = format!("{}\0", "n".repeat(NAME_BYTES - 1));
        let id = BackingId::new(BackingKind::Nbd, [1; 16], 1 << 30, &location, &name);
        assert!(!id.location.truncated() && !id.name.truncated());
        sb.backing = Some(id.clone());
        let got = Superblock::decode(&sb.encode()).unwrap().backing.unwrap();
        assert_eq!(got.location.shown, location);
        assert_eq!(got.name.shown, name);
        assert_eq!(got, id);
    }
}
