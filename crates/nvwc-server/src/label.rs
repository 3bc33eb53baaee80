//! The nvwc label: a 512-byte record on the backing store that says which
//! cache it is bound to (`docs/BACKING-FORMAT.md`, "The label").
//!
//! * A **file** carries it in a 4 KiB block appended after its data, at the
//!   first 4 KiB boundary at or after the data's end: the export keeps the
//!   file's old size, and no byte a client can address is touched.
//! * An **upstream NBD export** with a redo region carries it in the second
//!   512-byte sector of the region's trailer block (the trailer's own record
//!   is in the first sector, written once and never again).
//! * A block device carries none (see [`crate::bind`]).
//!
//! Record: magic `NVWCLABL`, version, backing uuid (random, chosen when the
//! label is first written), the uuid of the cache bound to it (0: none),
//! the length of the client's data, the record's own offset (a record read
//! anywhere else is not this backing store's label), CRC-32. Rewriting it
//! writes that one sector only, which the cache format already assumes is
//! atomic.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;

pub const LABEL_MAGIC: &[u8; 8] = b"NVWCLABL";
/// Bytes of the record.
pub const LABEL_BYTES: usize = 512;
/// A file's label block.
pub const LABEL_BLOCK: u64 = 4096;

/// A decoded label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Label {
    /// The backing store's uuid (kept when the label is rewritten).
    pub uuid: [u8; 16],
    /// The uuid of the cache bound to it (a superblock's `uuid`); 0 = none.
    pub cache: u64,
    /// Bytes of client data: a file's length before its label, an
    /// upstream's redo region start.
    pub data_len: u64,
    /// Where the record is on the backing store.
    pub offset: u64,
}

impl Label {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; LABEL_BYTES];
        b[0..8].copy_from_slice(LABEL_MAGIC);
        b[8..12].copy_from_slice(&1u32.to_le_bytes());
        b[16..32].copy_from_slice(&self.uuid);
        b[32..40].copy_from_slice(&self.cache.to_le_bytes());
        b[40..48].copy_from_slice(&self.data_len.to_le_bytes());
        b[48..56].copy_from_slice(&self.offset.to_le_bytes());
        let c = crc32fast::hash(&b[..508]);
        b[508..512].copy_from_slice(&c.to_le_bytes());
        b
    }

    /// The label in `b` if it is intact, version 1, and was written for `offset`.
    pub fn decode(b: &[u8], offset: u64) -> Option<Label> {
        if b.len() < LABEL_BYTES
            || &b[0..8] != LABEL_MAGIC
            || crc32fast::hash(&b[..508]) != u32::from_le_bytes(b[508..512].try_into().ok()?)
            || u32::from_le_bytes(b[8..12].try_into().ok()?) != 1
        {
            return None;
        }
        let u64at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let l = Label {
            uuid: b[16..32].try_into().expect("16 bytes"),
            cache: u64at(32),
            data_len: u64at(40),
            offset: u64at(48),
        };
        (l.offset == offset && l.data_len <= offset).then_some(l)
    }
}

/// Where a file whose data is `data_len` bytes long keeps its label.
pub fn file_label_offset(data_len: u64) -> u64 {
    data_len.div_ceil(LABEL_BLOCK) * LABEL_BLOCK
}

/// The label at the end of a file of `len` bytes, if it has one.
pub fn read_file_label(f: &File, len: u64) -> std::io::Result<Option<Label>> {
    if len < LABEL_BLOCK || !len.is_multiple_of(LABEL_BLOCK) {
        return Ok(None);
    }
    let at = len - LABEL_BLOCK;
    let mut b = vec![0u8; LABEL_BYTES];
    f.read_exact_at(&mut b, at)?;
    Ok(Label::decode(&b, at).filter(|l| file_label_offset(l.data_len) == at))
}

/// Write `l` into a file and make it durable. A new label (the file ends
/// at its data) is written as a whole 4 KiB block, which extends the file;
/// an existing one has its record sector rewritten in place.
pub fn write_file_label(f: &File, l: &Label, new: bool) -> std::io::Result<()> {
    let mut b = l.encode();
    if new {
        b.resize(LABEL_BLOCK as usize, 0);
    }
    f.write_all_at(&b, l.offset)?;
    // The file's length changed with a new label: sync it too.
    f.sync_all()
}

/// 16 random bytes from the kernel, as a version 4 uuid.
pub fn new_uuid() -> std::io::Result<[u8; 16]> {
    let mut u = [0u8; 16];
    File::open("/dev/urandom")?.read_exact(&mut u)?;
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    Ok(u)
}

/// A random non-zero 64-bit id (a cache's uuid).
pub fn new_cache_uuid() -> std::io::Result<u64> {
    let u = new_uuid()?;
    Ok(u64::from_le_bytes(u[..8].try_into().expect("8 bytes")).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_round_trip_and_misplaced_or_torn_labels() {
        let l = Label {
            uuid: [3; 16],
            cache: 99,
            data_len: 5000,
            offset: 8192,
        };
        let b = l.encode();
        assert_eq!(Label::decode(&b, 8192), Some(l));
        assert_eq!(Label::decode(&b, 4096), None, "found elsewhere: not ours");
        let mut t = b.clone();
        t[20] ^= 1;
        assert_eq!(Label::decode(&t, 8192), None, "torn");
        assert_eq!(Label::decode(&[0u8; 512], 0), None, "blank");
        assert_eq!(file_label_offset(5000), 8192);
        assert_eq!(file_label_offset(8192), 8192);
    }

    #[test]
    fn file_label_is_appended_after_the_data_and_found_again() {
        let dir = std::env::temp_dir().join(format!("nvwc-label-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("b.img");
        std::fs::write(&p, vec![7u8; 5000]).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        assert_eq!(read_file_label(&f, 5000).unwrap(), None);
        let l = Label {
            uuid: new_uuid().unwrap(),
            cache: 1,
            data_len: 5000,
            offset: file_label_offset(5000),
        };
        write_file_label(&f, &l, true).unwrap();
        let len = std::fs::metadata(&p).unwrap().len();
        assert_eq!(len, 8192 + 4096);
        assert_eq!(read_file_label(&f, len).unwrap(), Some(l));
        let data = std::fs::read(&p).unwrap();
        assert!(data[..5000].iter().all(|&x| x == 7), "data untouched");
        assert!(data[5000..8192].iter().all(|&x| x == 0));
        // Rebinding rewrites the record in place.
        let l2 = Label { cache: 2, ..l };
        write_file_label(&f, &l2, false).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), len);
        assert_eq!(read_file_label(&f, len).unwrap(), Some(l2));
        // A file grown past its label no longer ends in it.
        f.set_len(len + 4096).unwrap();
        assert_eq!(read_file_label(&f, len + 4096).unwrap(), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
