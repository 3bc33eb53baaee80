//! `nvwc status`: a running server's state, as a table for a person at a
//! terminal or as JSON (`--json`, and whenever stdout is not a terminal, so
//! scripts keep getting JSON).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde_json::Value;

use crate::CtlArgs;

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    ctl: CtlArgs,
    /// Print the JSON the control socket answers (the default when stdout
    /// is not a terminal).
    #[arg(long, conflicts_with = "table")]
    json: bool,
    /// Print a table even when stdout is not a terminal.
    #[arg(long)]
    table: bool,
    /// Table: measure rates (destaged blocks, requests) over this long;
    /// 0 shows no rates.
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    interval_ms: u64,
}

pub fn run(a: StatusArgs) -> Result<std::process::ExitCode> {
    let first = crate::ask("status", &a.ctl)?;
    let table = a.table || (!a.json && std::io::stdout().is_terminal());
    if !table {
        print!("{first}");
        return Ok(if first.contains("\"error\"") {
            std::process::ExitCode::from(1)
        } else {
            std::process::ExitCode::SUCCESS
        });
    }
    let v0: Value = serde_json::from_str(&first)?;
    if let Some(e) = v0.get("error") {
        bail!("the server answered: {e}");
    }
    let t0 = Instant::now();
    let out = if a.interval_ms > 0 {
        std::thread::sleep(Duration::from_millis(a.interval_ms));
        let v1: Value = serde_json::from_str(&crate::ask("status", &a.ctl)?)?;
        table_text(&v1, Some((&v0, t0.elapsed().as_secs_f64())))
    } else {
        table_text(&v0, None)
    };
    print!("{out}");
    Ok(std::process::ExitCode::SUCCESS)
}

fn stat(e: &Value, k: &str) -> u64 {
    e["stats"][k].as_u64().unwrap_or(0)
}

fn pct(num: u64, den: u64) -> String {
    if den == 0 {
        "-".into()
    } else {
        format!("{:.1}%", num as f64 * 100.0 / den as f64)
    }
}

/// Bytes in binary units, one decimal (`8.0G`).
fn human(b: u64) -> String {
    nvwc_core::units::format_size_1dp(b, &["", "K", "M", "G", "T", "P"], "")
}

/// Left-aligned columns, two spaces apart.
fn columns(rows: &[Vec<String>]) -> String {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let w: Vec<usize> = (0..n)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut o = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<width$}", width = w[i]))
            .collect();
        o += line.join("  ").trim_end();
        o.push('\n');
    }
    o
}

/// The table for status `now`; `before` (an earlier status and the seconds
/// between them) gives the rate columns.
pub fn table_text(now: &Value, before: Option<(&Value, f64)>) -> String {
    let empty = Vec::new();
    let exports = now["exports"].as_array().unwrap_or(&empty);
    let mut rows = vec![[
        "EXPORT",
        "SIZE",
        "POLICY",
        "READ HIT",
        "WRITE HIT",
        "DIRTY",
        "CACHED",
        "DESTAGE/s",
        "REQ/s",
        "STALLS",
        "CRITICAL",
    ]
    .map(String::from)
    .to_vec()];
    for e in exports {
        let name = e["name"].as_str().unwrap_or_default();
        let desc = e["description"].as_str().unwrap_or_default();
        let policy = desc
            .strip_prefix("nvwc ")
            .and_then(|r| r.split(" cache over ").next())
            .unwrap_or("?");
        let cached = stat(e, "cached_blocks");
        let dirty = stat(e, "dirty_blocks");
        let rate = |k: &str| -> String {
            let Some((b, dt)) = before else {
                return "-".into();
            };
            let old = b["exports"]
                .as_array()
                .and_then(|xs| xs.iter().find(|x| x["name"] == e["name"]))
                .map_or(0, |x| stat(x, k));
            format!(
                "{:.0}",
                stat(e, k).saturating_sub(old) as f64 / dt.max(1e-3)
            )
        };
        rows.push(vec![
            if name.is_empty() {
                "(default)".into()
            } else {
                name.to_string()
            },
            human(e["export_size"].as_u64().unwrap_or(0)),
            policy.to_string(),
            pct(
                stat(e, "read_hits"),
                stat(e, "read_hits") + stat(e, "read_misses"),
            ),
            pct(
                stat(e, "write_hits"),
                stat(e, "write_hits") + stat(e, "write_misses"),
            ),
            format!("{dirty} ({})", pct(dirty, cached)),
            cached.to_string(),
            rate("destaged_blocks"),
            rate("requests"),
            (stat(e, "stalled_writes") + stat(e, "admission_stalls")).to_string(),
            if e["critical"].as_bool() == Some(true) {
                "yes"
            } else {
                "no"
            }
            .into(),
        ]);
    }
    let mut o = columns(&rows);
    let conns = now["connections"].as_array().unwrap_or(&empty);
    o.push('\n');
    if conns.is_empty() {
        o += "no connections\n";
    } else {
        let mut rows = vec![["CONN", "PEER", "EXPORT", "CRITICAL"]
            .map(String::from)
            .to_vec()];
        for c in conns {
            rows.push(vec![
                c["id"].to_string(),
                c["peer"].as_str().unwrap_or("?").to_string(),
                match c["export"].as_str() {
                    None => "(handshake)".into(),
                    Some("") => "(default)".into(),
                    Some(x) => x.to_string(),
                },
                if c["critical"].as_bool() == Some(true) {
                    "yes"
                } else {
                    "no"
                }
                .into(),
            ]);
        }
        o += &columns(&rows);
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_of_a_status() {
        let st = |destaged: u64| {
            serde_json::json!({
                "exports": [{"name": "", "export_size": 8u64 << 30, "critical": false,
                    "description": "nvwc write-back cache over b.img",
                    "stats": {"read_hits": 3, "read_misses": 1, "write_hits": 0, "write_misses": 0,
                              "dirty_blocks": 5, "cached_blocks": 10, "destaged_blocks": destaged,
                              "requests": 0, "stalled_writes": 2, "admission_stalls": 1}}],
                "connections": [{"id": 7, "peer": "unix", "export": "", "critical": true}]
            })
        };
        let t = table_text(&st(100), Some((&st(40), 2.0)));
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[0].starts_with("EXPORT     SIZE  POLICY      READ HIT"),
            "{t}"
        );
        let row: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            row,
            [
                "(default)",
                "8.0G",
                "write-back",
                "75.0%",
                "-",
                "5",
                "(50.0%)",
                "10",
                "30",
                "0",
                "3",
                "no"
            ],
            "{t}"
        );
        assert!(lines[3].starts_with("CONN"), "{t}");
        assert_eq!(
            lines[4].split_whitespace().collect::<Vec<_>>(),
            ["7", "unix", "(default)", "yes"]
        );
    }
}
