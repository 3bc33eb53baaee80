//! The cache device's geometry (`layout::Layout`) and the sizes a fresh
//! cache gets: every region in its documented place (docs/ON-DISK-FORMAT.md),
//! none overlapping, the default log within its bounds, and the capacity
//! chosen for a device the largest whose layout fits it. A cache formatted
//! by one build is opened by the next, so this arithmetic is the on-disk
//! format; mutation testing (`scripts/mutants.sh`) found it unchecked.

use nvwc_core::layout::*;
use nvwc_core::{Config, WritePolicyKind};

const BLOCK_SIZES: [u32; 4] = [512, 4096, 65536, 1 << 20];

/// The layout of a fresh cache of `cap` slots of `bs` bytes (default log).
fn layout(bs: u32, cap: u64) -> Layout {
    Layout::new(&Config::new(
        bs,
        cap,
        16 * bs as u64,
        WritePolicyKind::WriteBack,
    ))
}

#[test]
fn every_region_has_its_documented_place_and_none_overlap() {
    for bs in BLOCK_SIZES {
        for cap in [16u64, 63, 64, 100, 1000, 63 * 4096 + 1] {
            let l = layout(bs, cap);
            let at = format!("{bs}-byte blocks, {cap} slots");
            // Two commit records between the superblock and the table.
            assert_eq!(l.commit_offset(0), COMMIT_A, "{at}");
            assert_eq!(l.commit_offset(1), COMMIT_A + 4096, "{at}");
            assert!(l.commit_offset(1) + 4096 <= TABLE_OFFSET, "{at}");
            // The fewest pages that hold every slot's entry, each stored twice.
            let pages = cap.div_ceil(ENTRIES_PER_PAGE);
            assert_eq!(l.pages(), pages, "{at}");
            assert_eq!(l.table_bytes, 2 * pages * PAGE_BYTES, "{at}");
            // Page p's copies side by side, the pages in order, tiling the table.
            let mut next = TABLE_OFFSET;
            for p in 0..pages {
                for copy in [0u8, 1] {
                    assert_eq!(l.page_offset(p, copy), next, "{at}: page {p} copy {copy}");
                    next += PAGE_BYTES;
                }
            }
            assert_eq!(next, TABLE_OFFSET + l.table_bytes, "{at}");
            // The log right after the table, then the data, aligned.
            assert_eq!(l.log_offset, TABLE_OFFSET + l.table_bytes, "{at}");
            assert_eq!(
                l.log_bytes,
                default_log_pages(cap, bs) as u64 * PAGE_BYTES,
                "{at}"
            );
            let align = (bs as u64).max(4096);
            let log_end = l.log_offset + l.log_bytes;
            assert_eq!(l.data_offset % align, 0, "{at}");
            assert!(
                (log_end..log_end + align).contains(&l.data_offset),
                "{at}: data at {} after a log ending at {log_end}",
                l.data_offset
            );
            // Slots tile the data region up to the device's end.
            assert_eq!(l.slot_offset(0), l.data_offset, "{at}");
            assert_eq!(l.slot_offset(1) - l.slot_offset(0), bs as u64, "{at}");
            let last = (cap - 1) as u32;
            assert_eq!(l.slot_offset(last) + bs as u64, l.device_bytes(), "{at}");
        }
    }
}

#[test]
fn a_log_entry_checks_exactly_its_versions_bytes() {
    let l = layout(4096, 100);
    let whole = Entry {
        flags: F_VALID | F_DIRTY,
        lo: 512,
        hi: 1536,
        ..Default::default()
    };
    assert_eq!(
        l.checked_bytes(7, &whole),
        (l.slot_offset(7), 4096),
        "a whole version: the whole slot, whatever bytes its writes changed"
    );
    let partial = Entry {
        flags: F_VALID | F_DIRTY | F_PARTIAL,
        ..whole
    };
    assert_eq!(
        l.checked_bytes(7, &partial),
        (l.slot_offset(7) + 512, 1024),
        "a partial version: only lo..hi is its data"
    );
}

/// The default log: one copy of the slot table, within 64 .. 16384 pages,
/// but never more than an eighth of the data (nor less than 4 pages); and
/// as large as those bounds allow.
#[test]
fn the_default_log_is_the_largest_within_its_bounds() {
    for bs in [512u32, 4096, 65536] {
        for cap in [16u64, 100, 1000, 10_000, 100_000, 2_000_000, 50_000_000] {
            let pages = default_log_pages(cap, bs) as u64;
            let data = cap * bs as u64;
            let by_data = (data / 8).max(4 * PAGE_BYTES);
            let by_table = cap.div_ceil(ENTRIES_PER_PAGE).clamp(64, 16384);
            let at = format!("{cap} slots of {bs} bytes: {pages} log pages");
            assert!(pages >= 4, "{at}");
            assert!(pages * PAGE_BYTES <= by_data, "{at}");
            assert!(pages <= by_table, "{at}");
            assert!(
                (pages + 1) * PAGE_BYTES > by_data || pages + 1 > by_table,
                "{at}: one more page is still within the bounds"
            );
        }
    }
}

#[test]
fn the_capacity_for_a_device_is_the_largest_that_fits() {
    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * KIB;
    for bs in BLOCK_SIZES {
        for bytes in [
            0,
            12 * KIB,
            100 * KIB,
            MIB,
            MIB + 4095,
            10 * MIB + 12345,
            256 * MIB,
            (1 << 30) + 7,
            64 << 30,
        ] {
            let cap = Layout::capacity_for(bytes, bs);
            let at = format!("{bytes} bytes of {bs}-byte blocks: {cap} slots");
            if cap > 0 {
                let need = layout(bs, cap).device_bytes();
                assert!(need <= bytes, "{at} need {need} bytes");
            }
            let more = layout(bs, cap + 1).device_bytes();
            assert!(more > bytes, "{at}, but one more fits ({more} bytes)");
        }
    }
}

#[test]
fn a_device_made_for_a_capacity_gets_that_capacity_back() {
    for bs in BLOCK_SIZES {
        for cap in [16u64, 100, 1000, 123_457] {
            let bytes = layout(bs, cap).device_bytes();
            assert_eq!(Layout::capacity_for(bytes, bs), cap, "{bs}-byte blocks");
        }
    }
}
