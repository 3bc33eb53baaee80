//! Policy selection: [`ReplacementKind`], its text form, and [`build`].

use std::fmt;
use std::str::FromStr;

use crate::stack::{KneeSource, DEFAULT_KNEE_PERIOD, DEFAULT_KNEE_SAMPLES};
use crate::{arc::Arc, lru::Lru, lst::Lst, stack::Stack, Replacement};

/// Default track size in blocks for LST and stack.
pub const DEFAULT_TRACK_BLOCKS: u64 = 64;

/// Which replacement policy to run, with its parameters.
///
/// Text form (`FromStr`/`Display`, round-trips): `lru`, `arc`,
/// `lst[:track=N]`, `stack[:track=N][,knee=K|online][,period=P][,samples=S]`
/// (`period`/`samples` only with an online knee). `Display` omits defaults.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ReplacementKind {
    /// [`Lru`].
    Lru,
    /// [`Arc`].
    Arc,
    /// [`Lst`].
    Lst {
        /// Track size in blocks (`>= 1`).
        track_blocks: u64,
    },
    /// [`Stack`].
    Stack {
        /// Track size in blocks (`>= 1`).
        track_blocks: u64,
        /// Source of `s_knee`.
        knee: KneeSource,
    },
}

/// Error parsing a [`ReplacementKind`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseKindError {
    /// Unknown policy name.
    #[error("unknown replacement policy `{0}` (expected lru, arc, lst or stack)")]
    UnknownPolicy(String),
    /// A parameter the policy does not take.
    #[error("policy `{policy}` has no parameter `{param}`")]
    UnknownParam {
        /// Policy name.
        policy: String,
        /// Offending parameter.
        param: String,
    },
    /// A malformed or out-of-range value.
    #[error("bad value for `{param}`: `{value}`")]
    BadValue {
        /// Parameter.
        param: String,
        /// Offending value.
        value: String,
    },
}

fn num<T: FromStr + PartialOrd + From<u8>>(param: &str, value: &str) -> Result<T, ParseKindError> {
    match value.parse::<T>() {
        Ok(v) if v >= T::from(1u8) => Ok(v),
        _ => Err(ParseKindError::BadValue {
            param: param.into(),
            value: value.into(),
        }),
    }
}

impl FromStr for ReplacementKind {
    type Err = ParseKindError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (name, params) = match s.split_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (s, None),
        };
        let name = name.to_ascii_lowercase();
        let pairs: Vec<(String, String)> = match params {
            None => Vec::new(),
            Some(p) => p
                .split(',')
                .map(|kv| match kv.split_once('=') {
                    Some((k, v)) => Ok((k.trim().to_ascii_lowercase(), v.trim().to_string())),
                    None => Err(ParseKindError::BadValue {
                        param: kv.trim().into(),
                        value: String::new(),
                    }),
                })
                .collect::<Result<_, _>>()?,
        };
        let unknown = |k: &str| ParseKindError::UnknownParam {
            policy: name.clone(),
            param: k.into(),
        };
        match name.as_str() {
            "lru" | "arc" => {
                if let Some((k, _)) = pairs.first() {
                    return Err(unknown(k));
                }
                Ok(if name == "lru" {
                    ReplacementKind::Lru
                } else {
                    ReplacementKind::Arc
                })
            }
            "lst" => {
                let mut track_blocks = DEFAULT_TRACK_BLOCKS;
                for (k, v) in &pairs {
                    match k.as_str() {
                        "track" => track_blocks = num(k, v)?,
                        _ => return Err(unknown(k)),
                    }
                }
                Ok(ReplacementKind::Lst { track_blocks })
            }
            "stack" => {
                let mut track_blocks = DEFAULT_TRACK_BLOCKS;
                let mut fixed: Option<u64> = None;
                let (mut period, mut samples) = (None, None);
                for (k, v) in &pairs {
                    match k.as_str() {
                        "track" => track_blocks = num(k, v)?,
                        "knee" if v.eq_ignore_ascii_case("online") => fixed = None,
                        "knee" => {
                            fixed = Some(v.parse().map_err(|_| ParseKindError::BadValue {
                                param: k.clone(),
                                value: v.clone(),
                            })?)
                        }
                        "period" => period = Some(num::<u64>(k, v)?),
                        "samples" => samples = Some(num::<u64>(k, v)? as usize),
                        _ => return Err(unknown(k)),
                    }
                }
                let knee = match fixed {
                    Some(k) => {
                        if period.is_some() || samples.is_some() {
                            return Err(ParseKindError::BadValue {
                                param: "knee".into(),
                                value: format!("{k} (period/samples need knee=online)"),
                            });
                        }
                        KneeSource::Fixed(k)
                    }
                    None => KneeSource::Online {
                        period: period.unwrap_or(DEFAULT_KNEE_PERIOD),
                        sample_keys: samples.unwrap_or(DEFAULT_KNEE_SAMPLES),
                    },
                };
                Ok(ReplacementKind::Stack { track_blocks, knee })
            }
            _ => Err(ParseKindError::UnknownPolicy(name)),
        }
    }
}

impl fmt::Display for ReplacementKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut params: Vec<String> = Vec::new();
        let name = match *self {
            ReplacementKind::Lru => "lru",
            ReplacementKind::Arc => "arc",
            ReplacementKind::Lst { track_blocks } => {
                if track_blocks != DEFAULT_TRACK_BLOCKS {
                    params.push(format!("track={track_blocks}"));
                }
                "lst"
            }
            ReplacementKind::Stack { track_blocks, knee } => {
                if track_blocks != DEFAULT_TRACK_BLOCKS {
                    params.push(format!("track={track_blocks}"));
                }
                match knee {
                    KneeSource::Fixed(k) => params.push(format!("knee={k}")),
                    KneeSource::Online {
                        period,
                        sample_keys,
                    } => {
                        if period != DEFAULT_KNEE_PERIOD {
                            params.push(format!("period={period}"));
                        }
                        if sample_keys != DEFAULT_KNEE_SAMPLES {
                            params.push(format!("samples={sample_keys}"));
                        }
                    }
                }
                "stack"
            }
        };
        if params.is_empty() {
            f.write_str(name)
        } else {
            write!(f, "{name}:{}", params.join(","))
        }
    }
}

/// Builds the policy `kind` for a cache of `capacity_blocks` blocks
/// (block ids `0..capacity_blocks`).
pub fn build(kind: ReplacementKind, capacity_blocks: usize) -> Box<dyn Replacement> {
    match kind {
        ReplacementKind::Lru => Box::new(Lru::new(capacity_blocks)),
        ReplacementKind::Arc => Box::new(Arc::new(capacity_blocks)),
        ReplacementKind::Lst { track_blocks } => Box::new(Lst::new(capacity_blocks, track_blocks)),
        ReplacementKind::Stack { track_blocks, knee } => {
            Box::new(Stack::new(capacity_blocks, track_blocks, knee))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_display_round_trip() {
        for s in [
            "lru",
            "arc",
            "lst",
            "lst:track=128",
            "stack",
            "stack:knee=1000",
            "stack:track=32,knee=0",
            "stack:period=1000,samples=512",
        ] {
            let k: ReplacementKind = s.parse().unwrap();
            assert_eq!(k.to_string(), s);
            assert_eq!(k.to_string().parse::<ReplacementKind>().unwrap(), k);
        }
        assert_eq!(
            "LRU".parse::<ReplacementKind>().unwrap(),
            ReplacementKind::Lru
        );
        assert_eq!(
            "stack".parse::<ReplacementKind>().unwrap(),
            ReplacementKind::Stack {
                track_blocks: 64,
                knee: KneeSource::default()
            }
        );
        assert_eq!(
            "stack:knee=online"
                .parse::<ReplacementKind>()
                .unwrap()
                .to_string(),
            "stack"
        );
    }

    #[test]
    fn parse_errors() {
        use ParseKindError as E;
        let unknown_policy: fn(&E) -> bool = |e| matches!(e, E::UnknownPolicy(_));
        let unknown_param: fn(&E) -> bool = |e| matches!(e, E::UnknownParam { .. });
        let bad_value: fn(&E) -> bool = |e| matches!(e, E::BadValue { .. });
        let cases = [
            ("fifo", unknown_policy),
            ("lru:track=4", unknown_param),
            ("lst:track=0", bad_value),
            ("lst:track=x", bad_value),
            ("stack:knee=5,period=9", bad_value),
            ("stack:knee", bad_value),
        ];
        for (s, want) in cases {
            let e = s.parse::<ReplacementKind>().unwrap_err();
            assert!(want(&e), "{s}: {e:?}");
        }
    }

    #[test]
    fn build_names() {
        for (s, n) in [
            ("lru", "lru"),
            ("arc", "arc"),
            ("lst", "lst"),
            ("stack:knee=3", "stack"),
            ("stack", "stack"),
        ] {
            let p = build(s.parse().unwrap(), 16);
            assert_eq!(p.name(), n);
            assert!(p.mem_bytes() >= 16 * 13);
        }
    }
}
