//! Line splitting and exact numeric parsing shared by the text formats.

use std::io::{self, BufRead, Read};

/// Longest accepted text line, in bytes (without the newline). Longer lines
/// are reported as errors and skipped, so a newline-free input cannot make a
/// reader allocate without bound.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// Why [`LineSource::next_line`] could not return a line.
pub(crate) enum LineError {
    /// The underlying reader failed (fatal).
    Io(io::Error),
    /// The line is not valid UTF-8 or too long (not fatal); carries the line
    /// number and a lossy rendering of the start of the line.
    Bad {
        line: u64,
        reason: &'static str,
        text: String,
    },
}

/// Splits a byte stream into lines, counting 1-based physical line numbers.
pub(crate) struct LineSource<'a> {
    inner: Box<dyn BufRead + Send + 'a>,
    buf: Vec<u8>,
    line_no: u64,
}

impl<'a> LineSource<'a> {
    pub(crate) fn new(inner: Box<dyn BufRead + Send + 'a>) -> Self {
        LineSource {
            inner,
            buf: Vec::with_capacity(256),
            line_no: 0,
        }
    }

    /// The next line without its `\n` / `\r\n`, with its line number, or
    /// `Ok(None)` at end of input.
    pub(crate) fn next_line(&mut self) -> Result<Option<(u64, &str)>, LineError> {
        self.buf.clear();
        let limit = MAX_LINE_BYTES as u64 + 1;
        let n = (&mut self.inner)
            .take(limit)
            .read_until(b'\n', &mut self.buf)
            .map_err(LineError::Io)?;
        if n == 0 {
            return Ok(None);
        }
        self.line_no += 1;
        let line = self.line_no;
        if self.buf.last() == Some(&b'\n') {
            self.buf.pop();
        } else if self.buf.len() > MAX_LINE_BYTES {
            self.skip_rest_of_line().map_err(LineError::Io)?;
            return Err(LineError::Bad {
                line,
                reason: "line too long",
                text: String::from_utf8_lossy(&self.buf[..200]).into_owned(),
            });
        }
        if self.buf.last() == Some(&b'\r') {
            self.buf.pop();
        }
        match std::str::from_utf8(&self.buf) {
            Ok(s) => Ok(Some((line, s))),
            Err(_) => Err(LineError::Bad {
                line,
                reason: "line is not valid UTF-8",
                text: String::from_utf8_lossy(&self.buf).into_owned(),
            }),
        }
    }

    fn skip_rest_of_line(&mut self) -> io::Result<()> {
        loop {
            let chunk = self.inner.fill_buf()?;
            if chunk.is_empty() {
                return Ok(());
            }
            match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    self.inner.consume(i + 1);
                    return Ok(());
                }
                None => {
                    let len = chunk.len();
                    self.inner.consume(len);
                }
            }
        }
    }
}

/// Parses an unsigned decimal integer (no sign, no spaces).
pub(crate) fn parse_u64(s: &str, what: &str) -> Result<u64, String> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{what} `{}` is not an unsigned integer", short(s)));
    }
    s.parse::<u64>()
        .map_err(|_| format!("{what} `{}` is out of range", short(s)))
}

/// Parses an unsigned decimal integer that must fit in `u32`.
pub(crate) fn parse_u32(s: &str, what: &str) -> Result<u32, String> {
    let v = parse_u64(s, what)?;
    u32::try_from(v).map_err(|_| format!("{what} `{}` does not fit in 32 bits", short(s)))
}

/// Parses a signed decimal integer.
pub(crate) fn parse_i64(s: &str, what: &str) -> Result<i64, String> {
    let digits = s.strip_prefix('-').unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{what} `{}` is not an integer", short(s)));
    }
    s.parse::<i64>()
        .map_err(|_| format!("{what} `{}` is out of range", short(s)))
}

/// Parses a hexadecimal number (optional `0x` prefix) that fits in `u16`.
pub(crate) fn parse_hex_u16(s: &str, what: &str) -> Result<u16, String> {
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    if digits.is_empty() || digits.len() > 4 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("{what} `{}` is not a hex number", short(s)));
    }
    u16::from_str_radix(digits, 16)
        .map_err(|_| format!("{what} `{}` is not a hex number", short(s)))
}

/// Parses a non-negative decimal number such as `1456095145.133076000` and
/// returns it multiplied by `10^scale` (so `scale = 9` turns seconds into
/// nanoseconds, `scale = 6` milliseconds into nanoseconds), exactly:
/// fractional digits beyond `scale` are truncated. Exponent notation
/// (`1.5e3`) is accepted through `f64` (then rounding applies).
pub(crate) fn parse_scaled(s: &str, scale: u32, what: &str) -> Result<u64, String> {
    let bad = || format!("{what} `{}` is not a non-negative number", short(s));
    let range = || format!("{what} `{}` is out of range", short(s));
    let body = s.strip_prefix('+').unwrap_or(s);
    if body.bytes().any(|b| b == b'e' || b == b'E') {
        let v: f64 = body.parse().map_err(|_| bad())?;
        if !v.is_finite() || v < 0.0 {
            return Err(bad());
        }
        let scaled = v * 10f64.powi(scale as i32);
        if scaled >= 18_446_744_073_709_551_615.0 {
            return Err(range());
        }
        return Ok(scaled as u64);
    }
    let (int, frac) = match body.split_once('.') {
        Some((i, f)) => (i, f),
        None => (body, ""),
    };
    if (int.is_empty() && frac.is_empty())
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(bad());
    }
    let unit = 10u64.pow(scale);
    let int_v: u64 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|_| range())?
    };
    let mut frac_v: u64 = 0;
    let mut place = unit;
    for b in frac.bytes().take(scale as usize) {
        place /= 10;
        frac_v += u64::from(b - b'0') * place;
    }
    int_v
        .checked_mul(unit)
        .and_then(|v| v.checked_add(frac_v))
        .ok_or_else(range)
}

/// Multiplies a sector count by 512, failing on overflow.
pub(crate) fn sectors_to_bytes(sectors: u64, what: &str) -> Result<u64, String> {
    sectors
        .checked_mul(512)
        .ok_or_else(|| format!("{what} {sectors} sectors overflows a 64-bit byte offset"))
}

/// Checks that `offset + len` fits in `u64`.
pub(crate) fn check_extent(offset: u64, len: u64) -> Result<(), String> {
    offset
        .checked_add(len)
        .map(|_| ())
        .ok_or_else(|| format!("offset {offset} + length {len} overflows 64 bits"))
}

/// Splits `line` on `sep`, trims each field, and requires exactly `N` fields.
pub(crate) fn split_exact<const N: usize>(line: &str, sep: char) -> Result<[&str; N], String> {
    let mut out = [""; N];
    let mut n = 0;
    for field in line.split(sep) {
        if n == N {
            return Err(format!("expected {N} fields, found more"));
        }
        out[n] = field.trim();
        n += 1;
    }
    if n != N {
        return Err(format!("expected {N} fields, found {n}"));
    }
    Ok(out)
}

/// Splits `line` on `sep`, trims each field, and requires at least `N`
/// fields; extra fields are ignored.
pub(crate) fn split_at_least<const N: usize>(line: &str, sep: char) -> Result<[&str; N], String> {
    let mut out = [""; N];
    let mut n = 0;
    for field in line.split(sep).take(N) {
        out[n] = field.trim();
        n += 1;
    }
    if n != N {
        return Err(format!("expected at least {N} fields, found {n}"));
    }
    Ok(out)
}

fn short(s: &str) -> String {
    crate::error::excerpt(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaled_decimal_is_exact() {
        assert_eq!(
            parse_scaled("1456095145.133076000", 9, "t").unwrap(),
            1_456_095_145_133_076_000
        );
        assert_eq!(parse_scaled("22.810", 6, "t").unwrap(), 22_810_000);
        assert_eq!(parse_scaled("0.551706", 9, "t").unwrap(), 551_706_000);
        assert_eq!(parse_scaled("7", 9, "t").unwrap(), 7_000_000_000);
        assert_eq!(parse_scaled(".5", 3, "t").unwrap(), 500);
        assert_eq!(parse_scaled("1.", 3, "t").unwrap(), 1000);
        assert_eq!(parse_scaled("1.0000000009", 9, "t").unwrap(), 1_000_000_000);
        assert_eq!(parse_scaled("1.5e3", 0, "t").unwrap(), 1500);
        for bad in [
            "", ".", "-1", "1.2.3", "abc", "1,5", "nan", "inf", "1e400", "-1e3",
        ] {
            assert!(parse_scaled(bad, 9, "t").is_err(), "{bad}");
        }
        assert!(parse_scaled("99999999999999999999", 9, "t").is_err());
    }

    #[test]
    fn integers() {
        assert_eq!(parse_u64("42", "x").unwrap(), 42);
        assert!(parse_u64("+42", "x").is_err());
        assert!(parse_u64("-1", "x").is_err());
        assert!(parse_u64("18446744073709551616", "x").is_err());
        assert!(parse_u32("4294967296", "x").is_err());
        assert_eq!(parse_i64("-1", "x").unwrap(), -1);
        assert!(parse_i64("-", "x").is_err());
        assert_eq!(parse_hex_u16("2a", "x").unwrap(), 0x2a);
        assert_eq!(parse_hex_u16("0x8A", "x").unwrap(), 0x8a);
        assert!(parse_hex_u16("g1", "x").is_err());
        assert!(parse_hex_u16("12345", "x").is_err());
    }

    #[test]
    fn splitting() {
        assert_eq!(split_exact::<3>("a, b ,c", ',').unwrap(), ["a", "b", "c"]);
        assert!(split_exact::<3>("a,b", ',').is_err());
        assert!(split_exact::<3>("a,b,c,d", ',').is_err());
        assert_eq!(split_at_least::<2>("a,b,c", ',').unwrap(), ["a", "b"]);
        assert!(split_at_least::<4>("a,b,c", ',').is_err());
    }

    #[test]
    fn lines_are_numbered_and_bounded() {
        let mut input = b"a\r\nb\n\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', MAX_LINE_BYTES + 10));
        input.extend(b"\nlast");
        let mut src = LineSource::new(Box::new(std::io::Cursor::new(input)));
        let mut got = Vec::new();
        loop {
            match src.next_line() {
                Ok(Some((n, l))) => got.push(format!("{n}:{l}")),
                Ok(None) => break,
                Err(LineError::Bad { line, reason, .. }) => got.push(format!("{line}!{reason}")),
                Err(LineError::Io(e)) => panic!("{e}"),
            }
        }
        assert_eq!(got, ["1:a", "2:b", "3:", "4!line too long", "5:last"]);
    }
}
