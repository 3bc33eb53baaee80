//! Opening the cache and backing files: created at their size, the cache's
//! blocks reserved and zero-filled, and kept in the page cache as single
//! pages ([`small_pages`]).

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::Path;

use anyhow::{Context, Result};

use crate::log::log;

/// Write zeroes over `len` bytes of `f`, then sync.
///
/// In 4 KiB writes: the page cache keeps a written range in folios of the
/// write's size, and large folios make every later 4 KiB cache write (and
/// the writeback at each sync) walk all of the folio's blocks on ext4
/// (`small_pages`). About 0.5 s per GiB, once, when the cache is created.
fn zero_fill(f: &File, len: u64) -> std::io::Result<()> {
    let chunk = vec![0u8; 4096];
    let mut off = 0u64;
    while off < len {
        let n = (len - off).min(chunk.len() as u64) as usize;
        f.write_all_at(&chunk[..n], off)?;
        off += n as u64;
    }
    f.sync_data()
}

/// Keep the cache file in the page cache as single pages, not large folios.
///
/// Large folios (from writes in large chunks, or from mapping faults with
/// readahead) make every 4 KiB write into them walk all of the folio's
/// blocks on file systems that track blocks with buffer heads (ext4), and
/// so does writeback at every sync. Measured on this machine (6.18, ext4),
/// a random 4 KiB pwrite followed by fdatasync: 27 us per pwrite into large
/// folios, 4 us into single pages. The cache is accessed by slot, at random,
/// so readahead buys nothing: the file is read at random from now on, and
/// the mapping is advised the same way (`mapped.rs`); the zero fill writes
/// 4 KiB at a time (`zero_fill`). Its pages are not dropped: a page that
/// is not resident costs a read from the device when a write through the
/// mapping first touches it. Advice only: a file system that ignores it is
/// served as before.
pub(crate) fn small_pages(f: &File) {
    use rustix::fs::{fadvise, Advice};
    let _ = fadvise(f, 0, None, Advice::Random);
}

/// Open `path`, or create it with `size` bytes. `reserve` (the cache file):
/// a new file gets its blocks allocated now (`fallocate`), so cache writes
/// cannot fail later for want of room in the file system, as writes into a
/// sparse file can; a file system that cannot preallocate gets a sparse file
/// and a warning. Backing files stay sparse (they are the client's disk).
pub(crate) fn open_or_create(path: &Path, size: u64, reserve: bool) -> Result<(File, bool)> {
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
    }
    let created = !path.exists();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    if created {
        f.set_len(size)
            .with_context(|| format!("sizing {}", path.display()))?;
        if reserve && size > 0 {
            use rustix::fs::{fallocate, FallocateFlags};
            match fallocate(&f, FallocateFlags::empty(), 0, size) {
                Ok(()) => {
                    // Preallocated extents are "unwritten": the first write
                    // to each converts it, and every fdatasync after such a
                    // write commits the file system's journal too (a FLUSH
                    // then costs two device syncs, not one). Writing zeroes
                    // once, as databases do with their log files, leaves
                    // plain blocks that a sync only has to write.
                    let t0 = std::time::Instant::now();
                    log!(
                        info,
                        "cache_zero_filling",
                        path = path.display().to_string(),
                        bytes = size
                    );
                    zero_fill(&f, size).with_context(|| {
                        format!("zero-filling the cache file {}", path.display())
                    })?;
                    log!(
                        info,
                        "cache_zero_filled",
                        path = path.display().to_string(),
                        bytes = size,
                        ms = t0.elapsed().as_millis() as u64
                    );
                }
                Err(e) if e == rustix::io::Errno::OPNOTSUPP => {
                    log!(
                        warn,
                        "cache_sparse",
                        path = path.display().to_string(),
                        reason = "the file system cannot preallocate"
                    );
                }
                Err(e) => {
                    drop(f);
                    let _ = std::fs::remove_file(path);
                    anyhow::bail!(
                        "reserving {} bytes for the cache file {}: {e} (free some space or choose a smaller --cache-size)",
                        size,
                        path.display()
                    );
                }
            }
        }
    }
    Ok((f, created))
}

/// The length of `f` (also of a block device, whose metadata says 0).
pub(crate) fn file_len(f: &mut File) -> Result<u64> {
    Ok(f.seek(SeekFrom::End(0))?)
}
