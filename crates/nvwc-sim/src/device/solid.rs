//! Solid-state devices: flash SSDs, NV-DRAM and persistent memory.
//!
//! The device is `parallel_units` identical servers (channels/dies, or CPU
//! copy engines for memory) behind one queue. A READ or WRITE longer than
//! `chunk_bytes` is split at aligned `chunk_bytes` boundaries and its pieces
//! are served by the units independently; the command completes with its
//! last piece. A piece occupies a unit for a fixed latency: the sequential
//! latency if it starts where the previous piece of the same kind ended (in
//! dispatch order), else the random latency. Data also crosses a host link
//! of limited bandwidth, modelled as a shared resource booked into its
//! earliest idle gap (half duplex: one link for both directions; full
//! duplex: one per direction): a READ crosses it after the media access, a
//! WRITE before.
//!
//! With a write buffer, non-FUA writes that fit are acknowledged after the
//! link transfer plus `ack_ns`, and their pieces are programmed in the
//! background with the random/sequential write latency. A FLUSH waits for
//! buffered data only if the buffer is volatile (no power-loss protection).
//!
//! Not modelled: garbage collection and write amplification, read/write
//! interference inside a die, queue-depth-dependent firmware behaviour,
//! reads served from the write buffer.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::calendar::Calendar;
use super::engine::{delegate_device_model, Engine, Job, JobClass, Mechanism, Plan};
use super::{transfer_ns, DevOp, DevOpKind, DeviceError, Nanos};

/// Device write buffer (DRAM in front of the flash).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteBufferParams {
    /// Buffer size in bytes.
    pub bytes: u64,
    /// Latency from the end of the link transfer to the acknowledgement.
    pub ack_ns: Nanos,
    /// `true`: data in the buffer is lost on power failure, so FLUSH waits
    /// until everything buffered before it is programmed. `false`:
    /// power-loss protected; FLUSH does not wait.
    pub volatile: bool,
}

/// Parameters of [`SolidStateModel`]; see the presets for sources. The
/// default is all zero: no time, link limit, write buffer or capacity.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SolidStateParams {
    /// Model name.
    pub name: String,
    /// Capacity in bytes when none is requested.
    pub capacity_bytes: u64,
    /// Parallel units (servers).
    pub parallel_units: u32,
    /// Split size for READ/WRITE (0 = never split). The latencies below are
    /// per piece.
    pub chunk_bytes: u64,
    /// Random read latency of one piece.
    pub read_ns: Nanos,
    /// Sequential read latency of one piece (`None` = `read_ns`).
    #[serde(default)]
    pub seq_read_ns: Option<Nanos>,
    /// Random write (program) latency of one piece.
    pub write_ns: Nanos,
    /// Sequential write latency of one piece (`None` = `write_ns`).
    #[serde(default)]
    pub seq_write_ns: Option<Nanos>,
    /// Host link bandwidth for reads (device to host), bytes/s; 0 = unlimited.
    #[serde(default)]
    pub link_read_bytes_per_sec: u64,
    /// Host link bandwidth for writes (host to device), bytes/s; 0 = unlimited.
    #[serde(default)]
    pub link_write_bytes_per_sec: u64,
    /// Whether reads and writes use separate link directions.
    #[serde(default)]
    pub link_full_duplex: bool,
    /// Optional write buffer.
    #[serde(default)]
    pub write_buffer: Option<WriteBufferParams>,
    /// Extra latency of a FLUSH (after any wait for buffered data).
    #[serde(default)]
    pub flush_ns: Nanos,
    /// Latency of a TRIM (does not occupy a unit).
    #[serde(default)]
    pub trim_ns: Nanos,
}

impl SolidStateParams {
    /// SATA-class enterprise SSD (6 Gb/s SATA, power-loss-protected DRAM
    /// buffer), modelled on the Intel DC S3700 generation.
    ///
    /// | parameter | value | source / derivation |
    /// |---|---|---|
    /// | random read, 4 KiB piece | 80 µs | assumption (typical MLC page read + ECC + SATA protocol) |
    /// | sequential read | 50 µs | S3700 spec "latency read 50 µs" (†) |
    /// | parallel units | 6 | Little's law: 75 k random-read IOPS (†) × 80 µs |
    /// | random program, 4 KiB | 167 µs | 6 units / 36 k random-write IOPS (†) |
    /// | sequential program, 4 KiB | 53 µs | 6 units × 4 KiB / 460 MB/s sequential write (†) |
    /// | write buffer | 32 MiB, ack 65 µs, power-loss protected | ack: S3700 "latency write 65 µs" (†); PLP: S3700 has capacitors to commit the write cache (AnandTech S3700 review); size: assumption |
    /// | link | 600 MB/s, half duplex | SATA 6 Gb/s with 8b/10b coding |
    /// | capacity | 400 GB | an S3700 capacity point |
    /// | FLUSH, TRIM | 0 | assumption (PLP buffer: nothing to wait for) |
    ///
    /// (†) S3700 datasheet figures as recalled (seq 500/460 MB/s, random
    /// 75 k/36 k IOPS, latency 50/65 µs); the search tool found only the
    /// review's design details (8 NAND channels, capacitors), so treat these
    /// as unverified.
    pub fn ssd_sata() -> Self {
        SolidStateParams {
            name: "ssd-sata".into(),
            capacity_bytes: 400_000_000_000,
            parallel_units: 6,
            chunk_bytes: 4096,
            read_ns: 80_000,
            seq_read_ns: Some(50_000),
            write_ns: 166_667,
            seq_write_ns: Some(53_426),
            link_read_bytes_per_sec: 600_000_000,
            link_write_bytes_per_sec: 600_000_000,
            link_full_duplex: false,
            write_buffer: Some(WriteBufferParams {
                bytes: 32 << 20,
                ack_ns: 65_000,
                volatile: false,
            }),
            flush_ns: 0,
            trim_ns: 0,
        }
    }

    /// NVMe-class enterprise SSD modelled on the Intel DC P3700 (PCIe Gen3
    /// x4).
    ///
    /// | parameter | value | source / derivation |
    /// |---|---|---|
    /// | random read, 4 KiB piece | 80 µs | assumption (the datasheet gives only sequential latency) |
    /// | sequential read | 20 µs | P3700 product specification: "Seq Latency (typ) R/W: 20/20 µs" |
    /// | parallel units | 37 | Little's law: 460 k random-read IOPS (spec) × 80 µs |
    /// | random program, 4 KiB | 211 µs | 37 units / 175 k random-write IOPS (spec) |
    /// | sequential program, 4 KiB | 76 µs | 37 × 4 KiB / 2000 MB/s sequential write (spec) |
    /// | write buffer | 32 MiB, ack 20 µs, power-loss protected | ack: spec sequential write latency; PLP: spec "enhanced power-loss data protection"; size: assumption |
    /// | link | 2800 MB/s read, 2000 MB/s write, full duplex | spec "Seq R/W: up to 2800/2000 MB/s" (PCIe is full duplex) |
    /// | capacity | 800 GB | a P3700 capacity point |
    /// | FLUSH, TRIM | 0 | assumption (power-loss-protected buffer, as above: a FLUSH has nothing to wait for) |
    pub fn ssd_nvme() -> Self {
        SolidStateParams {
            name: "ssd-nvme".into(),
            capacity_bytes: 800_000_000_000,
            parallel_units: 37,
            chunk_bytes: 4096,
            read_ns: 80_000,
            seq_read_ns: Some(20_000),
            write_ns: 211_429,
            seq_write_ns: Some(75_776),
            link_read_bytes_per_sec: 2_800_000_000,
            link_write_bytes_per_sec: 2_000_000_000,
            link_full_duplex: true,
            write_buffer: Some(WriteBufferParams {
                bytes: 32 << 20,
                ack_ns: 20_000,
                volatile: false,
            }),
            flush_ns: 0,
            trim_ns: 0,
        }
    }

    /// The 120 GB OCZ RevoDrive PCIe SSD used as the host-side cache in
    /// Koller et al., "Write policies for host-side flash caches" (FAST'13),
    /// §5.1, with the access times of its Table 1 ("Local SSD", µs):
    /// sequential write 82, sequential read 93, random read 177, random
    /// write 66.
    ///
    /// | parameter | value | source |
    /// |---|---|---|
    /// | read / seq read / write / seq write | 177 / 93 / 66 / 82 µs per piece | Table 1 |
    /// | piece size | 4 KiB | assumption: the paper's cache uses 4 KB blocks (§5.1); Table 1 does not state the request size |
    /// | capacity | 120 GB | §5.1 |
    /// | parallel units | 2 | assumption: the RevoDrive is two SandForce controllers striped behind a PCIe bridge (product design, not in the paper) |
    /// | write buffer, link limit | none | not given; Table 1 write times are end-to-end, so no separate buffer is modelled |
    /// | FLUSH | 66 µs | assumption: one random program (Table 1's write time); the RevoDrive has no power-loss protection, and with no buffer modelled a FLUSH finds at most the last write's page to program |
    pub fn ssd_revodrive() -> Self {
        SolidStateParams {
            name: "ssd-revodrive".into(),
            capacity_bytes: 120_000_000_000,
            parallel_units: 2,
            chunk_bytes: 4096,
            read_ns: 177_000,
            seq_read_ns: Some(93_000),
            write_ns: 66_000,
            seq_write_ns: Some(82_000),
            flush_ns: 66_000,
            ..Default::default()
        }
    }

    /// Battery/flash-backed DRAM (NVDIMM-N class) used as a block device.
    ///
    /// | parameter | value | source / derivation |
    /// |---|---|---|
    /// | latency | 1 µs read and write | assumption: block-layer software path dominates DRAM access |
    /// | bandwidth | 8 GB/s, half duplex | assumption: one core's memcpy rate (the brief's 2–8 GB/s range) |
    /// | parallel units | 16 | assumption: submitting cores |
    /// | capacity | 8 GiB | assumption (NVDIMM-N modules are 8–32 GB) |
    /// | FLUSH | 1 µs | assumption: the same software path as a read or write; nothing is buffered below it (battery/flash-backed DRAM is durable as written) |
    ///
    /// A 4 KiB access therefore takes 1 µs + 0.51 µs.
    pub fn nvdram() -> Self {
        Self::memory("nvdram", 8 << 30, 8_000_000_000, 8_000_000_000)
    }

    /// Intel Optane DC persistent memory (one DIMM) used as a block device.
    ///
    /// | parameter | value | source / derivation |
    /// |---|---|---|
    /// | latency | 1 µs read and write | assumption: software path; the media's random load latency is ~0.3 µs (Izraelevitz et al., "Basic performance measurements of the Intel Optane DC PMM", 2019: 305 ns) |
    /// | bandwidth | 6.6 GB/s read, 2.3 GB/s write, half duplex | Izraelevitz et al. 2019, single DIMM |
    /// | parallel units | 16 | assumption |
    /// | capacity | 128 GiB | smallest Optane DC PMM module |
    /// | FLUSH | 1 µs | assumption: the same software path as a read or write; the pmem driver writes with non-temporal stores, so a FLUSH only drains the memory controller's write queue (ADR makes that queue durable) |
    ///
    /// A 4 KiB access therefore takes about 1.6 µs (read) / 2.8 µs (write).
    pub fn pmem() -> Self {
        Self::memory("pmem", 128 << 30, 6_600_000_000, 2_300_000_000)
    }

    /// Memory used as a block device ([`nvdram`](Self::nvdram),
    /// [`pmem`](Self::pmem)): 1 µs read, write and FLUSH, 16 units,
    /// half-duplex links of the given rates.
    fn memory(name: &str, capacity_bytes: u64, link_read: u64, link_write: u64) -> Self {
        SolidStateParams {
            name: name.into(),
            capacity_bytes,
            parallel_units: 16,
            read_ns: 1_000,
            write_ns: 1_000,
            flush_ns: 1_000,
            link_read_bytes_per_sec: link_read,
            link_write_bytes_per_sec: link_write,
            ..Default::default()
        }
    }

    /// Check the parameters.
    pub fn validate(&self) -> Result<(), DeviceError> {
        let bad = |m: &str| Err(DeviceError::InvalidParams(format!("{}: {m}", self.name)));
        if self.parallel_units == 0 {
            return bad("parallel_units must be > 0");
        }
        if self.capacity_bytes == 0 {
            return bad("capacity_bytes must be > 0");
        }
        if let Some(b) = &self.write_buffer {
            if b.bytes == 0 {
                return bad("write_buffer.bytes must be > 0 (omit the buffer instead)");
            }
        }
        Ok(())
    }
}

struct SolidMech {
    p: SolidStateParams,
    /// Device-to-host link (also host-to-device when half duplex).
    link_rd: Calendar,
    /// Host-to-device link when full duplex.
    link_wr: Calendar,
    last_read_end: Option<u64>,
    last_write_end: Option<u64>,
}

impl SolidMech {
    fn book_write_link(&mut self, earliest: Nanos, len: u64) -> Nanos {
        let d = transfer_ns(len, self.p.link_write_bytes_per_sec);
        let cal = if self.p.link_full_duplex {
            &mut self.link_wr
        } else {
            &mut self.link_rd
        };
        cal.prune(earliest);
        cal.book(earliest, d) + d
    }

    fn book_read_link(&mut self, earliest: Nanos, now: Nanos, len: u64) -> Nanos {
        let d = transfer_ns(len, self.p.link_read_bytes_per_sec);
        self.link_rd.prune(now);
        self.link_rd.book(earliest, d) + d
    }

    fn write_latency(&mut self, op: &DevOp) -> Nanos {
        let seq = self.last_write_end == Some(op.offset);
        self.last_write_end = Some(op.offset + op.len);
        if seq {
            self.p.seq_write_ns.unwrap_or(self.p.write_ns)
        } else {
            self.p.write_ns
        }
    }
}

impl Mechanism for SolidMech {
    fn servers(&self) -> usize {
        self.p.parallel_units as usize
    }

    fn chunk_bytes(&self) -> u64 {
        self.p.chunk_bytes
    }

    fn plan(&mut self, now: Nanos, op: &DevOp, buffer_free: u64, dirty: bool) -> Plan {
        match op.kind {
            DevOpKind::Read => Plan::Queue,
            DevOpKind::Write => match self.p.write_buffer {
                Some(b) if !op.fua && op.len <= buffer_free => {
                    let at = self.book_write_link(now, op.len) + b.ack_ns;
                    Plan::Buffer { at }
                }
                _ => Plan::Queue,
            },
            DevOpKind::Flush => {
                let volatile = self.p.write_buffer.is_some_and(|b| b.volatile);
                if volatile && dirty {
                    Plan::FlushBarrier {
                        extra: self.p.flush_ns,
                    }
                } else {
                    Plan::Complete {
                        at: now + self.p.flush_ns,
                    }
                }
            }
            DevOpKind::Trim => Plan::Complete {
                at: now + self.p.trim_ns,
            },
        }
    }

    fn pick(&mut self, _now: Nanos, _queue: &VecDeque<Job>, candidates: &[usize]) -> usize {
        candidates[0]
    }

    fn fifo(&self) -> bool {
        true
    }

    fn start(&mut self, now: Nanos, job: &Job, _server: usize) -> Nanos {
        let op = &job.op;
        match (job.class, op.kind) {
            (JobClass::Host, DevOpKind::Read) => {
                let seq = self.last_read_end == Some(op.offset);
                self.last_read_end = Some(op.offset + op.len);
                let lat = if seq {
                    self.p.seq_read_ns.unwrap_or(self.p.read_ns)
                } else {
                    self.p.read_ns
                };
                self.book_read_link(now + lat, now, op.len)
            }
            (JobClass::Host, DevOpKind::Write) => {
                let lat = self.write_latency(op);
                self.book_write_link(now, op.len) + lat
            }
            (JobClass::Destage { .. }, DevOpKind::Write) => now + self.write_latency(op),
            (class, kind) => unreachable!("solid-state device never queues {class:?} {kind:?}"),
        }
    }
}

/// Solid-state device model; see the [module documentation](self) and
/// [`SolidStateParams`].
pub struct SolidStateModel(Engine<SolidMech>);

impl SolidStateModel {
    /// Build a device; `capacity_bytes` overrides the parameter's capacity.
    pub fn new(params: SolidStateParams, capacity_bytes: Option<u64>) -> Result<Self, DeviceError> {
        params.validate()?;
        let capacity = capacity_bytes.unwrap_or(params.capacity_bytes);
        if capacity == 0 {
            return Err(DeviceError::InvalidParams("capacity must be > 0".into()));
        }
        let buffer = params.write_buffer.map_or(0, |b| b.bytes);
        let name = params.name.clone();
        let mech = SolidMech {
            p: params,
            link_rd: Calendar::default(),
            link_wr: Calendar::default(),
            last_read_end: None,
            last_write_end: None,
        };
        Ok(SolidStateModel(Engine::new(mech, name, capacity, buffer)))
    }

    /// Parameters in use.
    pub fn params(&self) -> &SolidStateParams {
        &self.0.mech.p
    }

    /// Bytes accepted into the write buffer and not yet programmed.
    pub fn buffered_bytes(&self) -> u64 {
        self.0.buffered_bytes()
    }

    fn track_bytes_opt(&self) -> Option<u64> {
        None
    }
}

delegate_device_model!(SolidStateModel);
