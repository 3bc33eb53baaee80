//! Structured logs for `nvwc serve`: one line per event on stderr, either
//! `key=value` text or JSON, filtered by level.
//!
//! Every line has `ts` (RFC 3339, UTC, microseconds), `level` and `event`,
//! then the event's fields. Configuration: `--log-format text|json` and
//! `--log-level error|warn|info|debug`, or the environment variable
//! `NVWC_LOG` (e.g. `debug`, `json`, `json,debug`); flags win over the
//! environment.

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Severity, most severe first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error = 0,
    Warn = 1,
    Info = 2,
    Debug = 3,
}

impl Level {
    fn name(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }
    fn parse(s: &str) -> Option<Level> {
        Some(match s {
            "error" => Level::Error,
            "warn" | "warning" => Level::Warn,
            "info" => Level::Info,
            "debug" | "trace" => Level::Debug,
            _ => return None,
        })
    }
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Info as u8);
static JSON: AtomicU8 = AtomicU8::new(0);

/// Set format and level from the flags, falling back to `NVWC_LOG`.
pub fn init(format: Option<&str>, level: Option<&str>) -> Result<(), String> {
    let env = std::env::var("NVWC_LOG").unwrap_or_default();
    let (mut fmt, mut lvl) = (None, None);
    for w in env.split([',', ' ']).filter(|w| !w.is_empty()) {
        match w {
            "json" | "text" => fmt = Some(w.to_string()),
            _ => match Level::parse(w) {
                Some(l) => lvl = Some(l),
                None => {
                    return Err(format!(
                        "NVWC_LOG: unknown word {w:?} (text, json, error, warn, info, debug)"
                    ))
                }
            },
        }
    }
    if let Some(f) = format {
        fmt = Some(f.to_string());
    }
    if let Some(l) = level {
        lvl = Some(
            Level::parse(l)
                .ok_or_else(|| format!("--log-level {l:?}: use error, warn, info or debug"))?,
        );
    }
    match fmt.as_deref() {
        None | Some("text") => JSON.store(0, Ordering::Relaxed),
        Some("json") => JSON.store(1, Ordering::Relaxed),
        Some(f) => return Err(format!("--log-format {f:?}: use text or json")),
    }
    LEVEL.store(lvl.unwrap_or(Level::Info) as u8, Ordering::Relaxed);
    Ok(())
}

/// Whether events at `level` are written.
pub fn enabled(level: Level) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

/// A field value: numbers stay bare in JSON, everything else is a string.
pub enum V<'a> {
    U(u64),
    I(i64),
    F(f64),
    B(bool),
    S(&'a str),
    O(String),
}

impl From<u64> for V<'_> {
    fn from(v: u64) -> Self {
        V::U(v)
    }
}
impl From<u32> for V<'_> {
    fn from(v: u32) -> Self {
        V::U(v.into())
    }
}
impl From<usize> for V<'_> {
    fn from(v: usize) -> Self {
        V::U(v as u64)
    }
}
impl From<i64> for V<'_> {
    fn from(v: i64) -> Self {
        V::I(v)
    }
}
impl From<f64> for V<'_> {
    fn from(v: f64) -> Self {
        V::F(v)
    }
}
impl From<bool> for V<'_> {
    fn from(v: bool) -> Self {
        V::B(v)
    }
}
impl<'a> From<&'a str> for V<'a> {
    fn from(v: &'a str) -> Self {
        V::S(v)
    }
}
impl<'a> From<&'a String> for V<'a> {
    fn from(v: &'a String) -> Self {
        V::S(v)
    }
}
impl From<String> for V<'_> {
    fn from(v: String) -> Self {
        V::O(v)
    }
}

/// Format one line (without the newline). Public for tests.
pub fn format_line(
    json: bool,
    ts: &str,
    level: Level,
    event: &str,
    fields: &[(&str, V)],
) -> String {
    let mut o = String::with_capacity(128);
    if json {
        let _ = write!(
            o,
            "{{\"ts\":\"{ts}\",\"level\":\"{}\",\"event\":",
            level.name()
        );
        json_str(&mut o, event);
        for (k, v) in fields {
            o.push(',');
            json_str(&mut o, k);
            o.push(':');
            match v {
                V::U(x) => {
                    let _ = write!(o, "{x}");
                }
                V::I(x) => {
                    let _ = write!(o, "{x}");
                }
                V::F(x) if x.is_finite() => {
                    let _ = write!(o, "{x}");
                }
                V::F(_) => o.push_str("null"),
                V::B(x) => {
                    let _ = write!(o, "{x}");
                }
                V::S(s) => json_str(&mut o, s),
                V::O(s) => json_str(&mut o, s),
            }
        }
        o.push('}');
    } else {
        let _ = write!(o, "ts={ts} level={} event=", level.name());
        text_val(&mut o, event);
        for (k, v) in fields {
            let _ = write!(o, " {k}=");
            match v {
                V::U(x) => {
                    let _ = write!(o, "{x}");
                }
                V::I(x) => {
                    let _ = write!(o, "{x}");
                }
                V::F(x) => {
                    let _ = write!(o, "{x}");
                }
                V::B(x) => {
                    let _ = write!(o, "{x}");
                }
                V::S(s) => text_val(&mut o, s),
                V::O(s) => text_val(&mut o, s),
            }
        }
    }
    o
}

/// Rate limit for an event that can repeat for every failing I/O (a backing
/// store that went away): at most one line per second; the next line that
/// passes says how many were held back (`suppressed=N`).
#[derive(Debug, Default)]
pub struct Throttle {
    last_ms: AtomicU64,
    held: AtomicU64,
}

impl Throttle {
    pub const fn new() -> Self {
        Throttle {
            last_ms: AtomicU64::new(0),
            held: AtomicU64::new(0),
        }
    }

    /// `Some(lines held back since the last one)` when a line may go out now.
    pub fn pass(&self) -> Option<u64> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_millis() as u64)
            .max(1);
        let last = self.last_ms.load(Ordering::Relaxed);
        if (last != 0 && now < last + 1000)
            || self
                .last_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            self.held.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.held.swap(0, Ordering::Relaxed))
    }
}

/// Write one event (if its level is enabled).
pub fn emit(level: Level, event: &str, fields: &[(&str, V)]) {
    if !enabled(level) {
        return;
    }
    let line = format_line(
        JSON.load(Ordering::Relaxed) == 1,
        &timestamp(),
        level,
        event,
        fields,
    );
    let mut e = std::io::stderr().lock();
    let _ = e.write_all(format!("{line}\n").as_bytes());
}

/// `log!(info, "event", key = value, ...)`.
macro_rules! log {
    ($lvl:ident, $event:expr $(, $k:ident = $v:expr)* $(,)?) => {
        $crate::log::emit(
            $crate::log::lvl!($lvl),
            $event,
            &[$((stringify!($k), $crate::log::V::from($v))),*],
        )
    };
}
macro_rules! lvl {
    (error) => {
        $crate::log::Level::Error
    };
    (warn) => {
        $crate::log::Level::Warn
    };
    (info) => {
        $crate::log::Level::Info
    };
    (debug) => {
        $crate::log::Level::Debug
    };
}
pub(crate) use {log, lvl};

fn json_str(o: &mut String, s: &str) {
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            '\t' => o.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
}

/// Bare if it has no space, quote, `=` or control character; else quoted like JSON.
fn text_val(o: &mut String, s: &str) {
    if !s.is_empty()
        && !s
            .chars()
            .any(|c| c == ' ' || c == '"' || c == '=' || c == '\\' || c.is_control())
    {
        o.push_str(s);
    } else {
        json_str(o, s);
    }
}

/// Now as RFC 3339 UTC with microseconds.
fn timestamp() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    rfc3339(d.as_secs(), d.subsec_micros())
}

fn rfc3339(secs: u64, micros: u32) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(rfc3339(951_782_400, 5), "2000-02-29T00:00:00.000005Z");
        assert_eq!(
            rfc3339(1_795_000_000, 123_456),
            "2026-11-18T11:06:40.123456Z"
        );
    }

    #[test]
    fn text_and_json_lines() {
        let f = [
            ("conn", V::U(3)),
            ("client", V::S("127.0.0.1:5000")),
            ("msg", V::S("bad \"x\" = 1")),
            ("ok", V::B(true)),
        ];
        assert_eq!(
            format_line(false, "T", Level::Info, "connect", &f),
            r#"ts=T level=info event=connect conn=3 client=127.0.0.1:5000 msg="bad \"x\" = 1" ok=true"#
        );
        let j = format_line(true, "T", Level::Warn, "connect", &f);
        assert_eq!(
            j,
            r#"{"ts":"T","level":"warn","event":"connect","conn":3,"client":"127.0.0.1:5000","msg":"bad \"x\" = 1","ok":true}"#
        );
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["conn"], 3);
        assert_eq!(
            format_line(false, "T", Level::Debug, "e", &[("empty", V::S(""))]),
            r#"ts=T level=debug event=e empty="""#
        );
    }
}
