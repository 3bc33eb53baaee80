//! The redo log that makes an atomic group (a journaled checkpoint) atomic
//! on a plain backing file: `<backing>.nvwc-redo`, written and synced before
//! the group is applied in place, replayed on start and by `nvwc recover`
//! (`docs/BACKING-FORMAT.md`). An upstream NBD backing store keeps its log
//! in a region at its end instead (`upstream.rs`).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use anyhow::Result;
use bytes::Bytes;

/// Redo log for atomic groups on a plain backing file: `<backing>.nvwc-redo`.
pub(crate) struct Redo {
    pub(crate) path: PathBuf,
    /// The log may hold a group that is not fully applied (an earlier
    /// commit failed after it began writing the log): see `commit_and_apply`.
    pub(crate) pending: std::sync::atomic::AtomicBool,
}

pub(crate) const REDO_MAGIC: &[u8; 8] = b"NVWCREDO";

impl Redo {
    /// Write the group to the log and sync it, then apply it in place, sync,
    /// and truncate the log. A crash before the log is synced leaves the
    /// backing file untouched; after, replay finishes the group.
    pub(crate) fn commit_and_apply(
        &self,
        backing: &File,
        writes: &[(u64, Bytes)],
    ) -> std::io::Result<()> {
        use std::sync::atomic::Ordering;
        // A group an earlier commit logged but could not finish (an I/O error
        // mid-apply) may be partly in place: finish it before its log is
        // overwritten, or it could never be replayed. If that fails, this
        // group is not started.
        if self.pending.load(Ordering::Acquire) {
            Self::replay(&self.path, backing).map_err(std::io::Error::other)?;
        }
        self.pending.store(true, Ordering::Release);
        let mut buf = Vec::new();
        buf.extend_from_slice(REDO_MAGIC);
        buf.extend_from_slice(&(writes.len() as u64).to_le_bytes());
        for (off, d) in writes {
            buf.extend_from_slice(&off.to_le_bytes());
            buf.extend_from_slice(&(d.len() as u64).to_le_bytes());
            buf.extend_from_slice(d);
        }
        let crc = crc32fast::hash(&buf);
        buf.extend_from_slice(&crc.to_le_bytes());
        let mut f = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&self.path)?;
        f.write_all(&buf)?;
        f.sync_data()?;
        for (i, (off, d)) in writes.iter().enumerate() {
            if i == writes.len() / 2 {
                crate::fault::failpoint("redo-apply");
            }
            backing.write_all_at(d, *off)?;
        }
        backing.sync_data()?;
        f.set_len(0)?;
        f.sync_data()?;
        self.pending.store(false, Ordering::Release);
        Ok(())
    }

    /// Apply a complete logged group, if any (after a crash). Returns how many writes it applied.
    pub(crate) fn replay(path: &Path, backing: &File) -> Result<usize> {
        let Ok(mut f) = File::open(path) else {
            return Ok(0);
        };
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)?;
        if buf.len() < 20 || &buf[..8] != REDO_MAGIC {
            return Ok(0);
        }
        let body = &buf[..buf.len() - 4];
        let crc = u32::from_le_bytes(buf[buf.len() - 4..].try_into().unwrap());
        if crc32fast::hash(body) != crc {
            // Torn log: the group never started applying; nothing to do.
            return Ok(0);
        }
        let n = u64::from_le_bytes(body[8..16].try_into().unwrap()) as usize;
        let mut at = 16;
        for _ in 0..n {
            let off = u64::from_le_bytes(body[at..at + 8].try_into().unwrap());
            let len = u64::from_le_bytes(body[at + 8..at + 16].try_into().unwrap()) as usize;
            backing.write_all_at(&body[at + 16..at + 16 + len], off)?;
            at += 16 + len;
        }
        backing.sync_data()?;
        OpenOptions::new().write(true).open(path)?.set_len(0)?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::read_at;

    /// A group whose in-place apply fails stays in the log; the next commit
    /// finishes it before writing its own log over it. (Before, the next
    /// commit overwrote the log, so a crash during it left the failed group
    /// half applied with nothing to replay: the crash test caught this
    /// journaled over an upstream with injected write errors.)
    #[test]
    fn redo_log_finishes_a_failed_group_before_the_next() {
        let dir = std::env::temp_dir().join(format!("nvwc-redo-fail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bpath = dir.join("b.img");
        std::fs::write(&bpath, vec![0u8; 8192]).unwrap();
        let log = dir.join("b.img.nvwc-redo");
        let redo = Redo {
            path: log.clone(),
            pending: false.into(),
        };
        // Opened read-only: the log is written, the apply fails.
        let ro = File::open(&bpath).unwrap();
        let g1 = vec![(0u64, Bytes::from(vec![5u8; 512]))];
        assert!(redo.commit_and_apply(&ro, &g1).is_err());
        assert!(
            std::fs::metadata(&log).unwrap().len() > 0,
            "failed group stays logged"
        );
        // The next group, on a working backing file, finishes the first one too.
        let rw = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&bpath)
            .unwrap();
        let g2 = vec![(4096u64, Bytes::from(vec![6u8; 512]))];
        redo.commit_and_apply(&rw, &g2).unwrap();
        assert_eq!(read_at(&rw, 0, 512).unwrap(), vec![5u8; 512]);
        assert_eq!(read_at(&rw, 4096, 512).unwrap(), vec![6u8; 512]);
        assert_eq!(std::fs::metadata(&log).unwrap().len(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn redo_log_replays_a_committed_group_and_ignores_a_torn_one() {
        let dir = std::env::temp_dir().join(format!("nvwc-redo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bpath = dir.join("b.img");
        let b = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&bpath)
            .unwrap();
        b.set_len(8192).unwrap();
        let log = dir.join("b.img.nvwc-redo");
        // A committed group that was never applied: write the log by hand.
        let redo = Redo {
            path: log.clone(),
            pending: false.into(),
        };
        let writes = vec![
            (0u64, Bytes::from(vec![7u8; 512])),
            (4096, Bytes::from(vec![9u8; 512])),
        ];
        redo.commit_and_apply(&b, &writes).unwrap();
        assert_eq!(
            std::fs::metadata(&log).unwrap().len(),
            0,
            "log truncated after apply"
        );
        // Recreate a logged-but-unapplied group and replay it.
        let mut buf = Vec::new();
        buf.extend_from_slice(REDO_MAGIC);
        buf.extend_from_slice(&1u64.to_le_bytes());
        buf.extend_from_slice(&1024u64.to_le_bytes());
        buf.extend_from_slice(&3u64.to_le_bytes());
        buf.extend_from_slice(&[1, 2, 3]);
        let crc = crc32fast::hash(&buf);
        buf.extend_from_slice(&crc.to_le_bytes());
        std::fs::write(&log, &buf).unwrap();
        assert_eq!(Redo::replay(&log, &b).unwrap(), 1);
        assert_eq!(read_at(&b, 1024, 3).unwrap(), vec![1, 2, 3]);
        // A torn log (bad checksum) is not applied.
        buf[20] ^= 1;
        std::fs::write(&log, &buf).unwrap();
        b.write_all_at(&[0, 0, 0], 1024).unwrap();
        assert_eq!(Redo::replay(&log, &b).unwrap(), 0);
        assert_eq!(read_at(&b, 1024, 3).unwrap(), vec![0, 0, 0]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
