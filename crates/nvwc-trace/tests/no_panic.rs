//! Property tests: no input makes any reader panic, and whatever records
//! come out satisfy the [`TraceRecord`] contract.

mod common;

use common::*;
use nvwc_trace::{open_reader, Format, Op, StatsCollector, TraceRecord, COMPACT_MAGIC};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;

/// Index into `Format::ALL`, or one past it for auto-detection.
fn any_format() -> impl Strategy<Value = Option<Format>> {
    (0..=Format::ALL.len()).prop_map(|i| Format::ALL.get(i).copied())
}

/// Drains a reader over `bytes`, checking the record contract.
fn drain(bytes: &[u8], format: Option<Format>) -> Result<(), TestCaseError> {
    let Ok(reader) = open_reader(bytes, format, "fuzz-input") else {
        return Ok(());
    };
    let mut stats = StatsCollector::new();
    let mut prev: Option<TraceRecord> = None;
    for item in reader.take(100_000) {
        match item {
            Ok(r) => {
                prop_assert!(r.offset.checked_add(r.len).is_some(), "{r:?}");
                if r.op == Op::Flush {
                    prop_assert_eq!((r.offset, r.len), (0, 0));
                }
                match prev {
                    None => prop_assert_eq!(r.ts_ns, 0),
                    Some(p) => prop_assert!(p.ts_ns <= r.ts_ns),
                }
                prev = Some(r);
                stats.add(&r);
            }
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(
                    msg.contains("fuzz-input"),
                    "error does not name the input: {msg}"
                );
            }
        }
    }
    let _ = stats.finish().to_string();
    Ok(())
}

/// Tokens that the text formats use, so random lines often parse.
fn token() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        (0u32..100_000).prop_map(|n| n.to_string()),
        "[0-9]{1,11}\\.[0-9]{1,10}",
        prop::sample::select(vec![
            "R",
            "W",
            "w",
            "r",
            "Q",
            "C",
            "A",
            "FWFS",
            "FWS",
            "D",
            "N",
            "+",
            "8,0",
            "253,1",
            "[kworker/0:1]",
            "write",
            "pwrite",
            "read",
            "pread",
            "open",
            "close",
            "fsync",
            "unlink",
            "\"/f\"",
            "/data/data",
            "O_RDWR|O_APPEND",
            "Read",
            "Write",
            "hm",
            "2a",
            "28",
            "35",
            "0",
            "1",
            "-1",
            "18446744073709551615",
            "1e300",
            "",
        ])
        .prop_map(str::to_owned),
    ]
}

/// Up to 20 lines of tokens joined by commas or spaces.
fn lines() -> impl Strategy<Value = String> {
    vec((vec(token(), 1..9), prop::bool::ANY), 1..20).prop_map(|lines| {
        lines
            .into_iter()
            .map(|(toks, comma)| toks.join(if comma { "," } else { " " }) + "\n")
            .collect()
    })
}

fn fixtures() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = valid_inputs().into_iter().map(|(_, b)| b).collect();
    let mut compact = Vec::new();
    nvwc_trace::write_compact(
        vscsi_expected().into_iter().map(Ok),
        Some(Format::VscsiV1),
        &mut compact,
    )
    .unwrap();
    v.push(compact);
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 384, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in vec(any::<u8>(), 0..2048), format in any_format()) {
        drain(&bytes, format)?;
    }

    #[test]
    fn random_text_never_panics(text in "[0-9a-zA-Z,.+ \\[\\]\"/:|#\\-\n]{0,600}", format in any_format()) {
        drain(text.as_bytes(), format)?;
    }

    #[test]
    fn format_shaped_lines_never_panic(text in lines(), format in any_format()) {
        drain(text.as_bytes(), format)?;
    }

    #[test]
    fn magic_prefixed_bytes_never_panic(
        prefix in 0usize..5,
        tail in vec(any::<u8>(), 0..1024),
        format in any_format(),
    ) {
        let mut bytes: Vec<u8> = match prefix {
            0 => COMPACT_MAGIC.to_vec(),
            1 => {
                let mut h = COMPACT_MAGIC.to_vec();
                h.extend_from_slice(&1u16.to_le_bytes());
                h
            }
            2 => vec![0x1f, 0x8b, 0x08],
            3 => b"BZh9".to_vec(),
            _ => vscsi_v1(&VSCSI_REQS[..1]),
        };
        bytes.extend_from_slice(&tail);
        drain(&bytes, format)?;
    }

    #[test]
    fn mutated_fixtures_never_panic(
        which in any::<Index>(),
        edits in vec((any::<Index>(), any::<u8>()), 1..8),
        format in any_format(),
    ) {
        let all = fixtures();
        let mut bytes = all[which.index(all.len())].clone();
        for (at, byte) in edits {
            let i = at.index(bytes.len());
            bytes[i] = byte;
        }
        drain(&bytes, format)?;
    }
}
