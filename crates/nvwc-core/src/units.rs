//! Byte sizes as people write them: the one parser and formatter that every
//! command line, configuration file and report uses.

/// Parse a size: a number (integer, or decimal such as `1.5`) with an
/// optional binary unit `K`, `M`, `G` or `T` (powers of 1024,
/// case-insensitive, optionally followed by `B` or `iB`): `4096`, `4K`,
/// `64M`, `1GiB`, `1.5k`. A decimal size is rounded to whole bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let unit = t[i..].to_ascii_lowercase();
            let unit = unit
                .strip_suffix("ib")
                .or_else(|| unit.strip_suffix('b'))
                .unwrap_or(&unit);
            let m: u64 = match unit {
                "" => 1,
                "k" => 1 << 10,
                "m" => 1 << 20,
                "g" => 1 << 30,
                "t" => 1 << 40,
                _ => return Err(format!("unknown size unit in {s:?} (use K, M, G or T)")),
            };
            (t[..i].trim(), m)
        }
        None => (t, 1),
    };
    let too_large = || format!("size too large: {s:?}");
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(mult).ok_or_else(too_large);
    }
    let v: f64 = num
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v >= 0.0 && num.contains('.'))
        .ok_or_else(|| format!("not a size: {s:?} (e.g. 4096, 4K, 64M, 1G)"))?;
    let bytes = (v * mult as f64).round();
    if bytes >= u64::MAX as f64 {
        return Err(too_large());
    }
    Ok(bytes as u64)
}

/// Format a byte count with a binary unit (`64M`, `1.50G`, `4k`, `512`).
pub fn format_size(b: u64) -> String {
    const U: [(&str, u64); 4] = [
        ("T", 1 << 40),
        ("G", 1 << 30),
        ("M", 1 << 20),
        ("k", 1 << 10),
    ];
    for (n, m) in U {
        if b >= m {
            let v = b as f64 / m as f64;
            return if (v - v.round()).abs() < 1e-9 {
                format!("{}{n}", v.round() as u64)
            } else {
                format!("{v:.2}{n}")
            };
        }
    }
    format!("{b}")
}

/// Format a byte count with one decimal in the largest binary unit it
/// reaches: `units[0]` names bytes, `units[i]` 1024^i bytes, and `sep`
/// stands between number and unit. With `["", "K", "M", ...]` and `""`,
/// 8 GiB is `8.0G` and 512 bytes `512`; with `["B", "KiB", ...]` and
/// `" "`, `8.0 GiB` and `512 B`. `units` MUST NOT be empty.
pub fn format_size_1dp(b: u64, units: &[&str], sep: &str) -> String {
    assert!(!units.is_empty(), "no units");
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b}{sep}{}", units[0])
    } else {
        format!("{v:.1}{sep}{}", units[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size(" 64M ").unwrap(), 64 << 20);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("1gb").unwrap(), 1 << 30);
        assert_eq!(parse_size("2 T").unwrap(), 2 << 40);
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("1.5k").unwrap(), 1536);
        assert_eq!(parse_size("0").unwrap(), 0);
        for bad in [
            "x",
            "",
            "4X",
            "-1",
            "-1.5k",
            "nan",
            "inf",
            "1.2.3",
            "99999999999T",
            "k",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} parsed");
        }
        assert!(parse_size("4X").unwrap_err().contains("unit"));
        assert!(parse_size("99999999999T")
            .unwrap_err()
            .contains("too large"));
        assert_eq!(format_size(64 << 20), "64M");
        assert_eq!(format_size(1536), "1.50k");
        assert_eq!(format_size(100), "100");
        let short = ["", "K", "M", "G", "T", "P"];
        assert_eq!(format_size_1dp(8 << 30, &short, ""), "8.0G");
        assert_eq!(format_size_1dp(512, &short, ""), "512");
        assert_eq!(format_size_1dp(1536, &["B", "KiB"], " "), "1.5 KiB");
        assert_eq!(format_size_1dp(3 << 20, &["B", "KiB"], " "), "3072.0 KiB");
        for b in [0, 1, 4096, 64 << 20, 3 << 30, 5 << 40] {
            assert_eq!(parse_size(&format_size(b)).unwrap(), b);
        }
    }
}
