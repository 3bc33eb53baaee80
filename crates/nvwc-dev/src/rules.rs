//! The fault rule language (env `NVWC_FAULT_CACHE` / `NVWC_FAULT_BACKING`
//! of `nvwc serve`, and any harness that stacks the fault filter): its
//! parser, and the matcher that decides, command by command, what fires.
//! The filter that acts on the decisions is `fault.rs`.
//!
//! A spec is `RULE[;RULE...]`, a rule being
//! `KIND[,op=read|write|flush|any][,after=N][,count=N][,prob=P][,ms=N][,seed=N]`
//! with `KIND` one of `eio`, `enospc`, `timeout` (sleep `ms`, then fail),
//! `delay` (sleep `ms`, then run), `torn` (write a random prefix of the
//! sectors, then fail with EIO), `torn-crash` (write a prefix, then abort
//! the process: a crash in the middle of a write), and `volatile[,log=PATH]`
//! (host-crash mode: not a rule, the volatile write-cache filter,
//! `hostcrash.rs`). A rule fires on the matching commands after the first
//! `after`, at most `count` times (default: always), each time with
//! probability `prob` (its draws from `seed`). Reads (and checksums) are
//! `read`; writes, a group's writes included, `write`; flushes and group
//! ends `flush`; trims and group begins match no rule.

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::rng::Rng;
use crate::volatile::SECTOR;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Eio,
    NoSpace,
    Timeout,
    Delay,
    Torn,
    TornCrash,
}

/// Which commands a rule matches.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum OpClass {
    Read,
    Write,
    Flush,
    Any,
}

/// One rule of a spec, with its counters and random draws.
#[derive(Debug)]
pub struct Rule {
    pub kind: Kind,
    pub op: OpClass,
    after: u64,
    count: u64,
    prob: f64,
    ms: u64,
    seen: AtomicU64,
    fired: AtomicU64,
    rng: Mutex<Rng>,
}

/// A bad fault spec.
#[derive(Debug, thiserror::Error)]
#[error("fault spec {spec:?}: {why}")]
pub struct SpecError {
    pub spec: String,
    pub why: String,
}

/// The `volatile` rule: host-crash mode, and where its side log goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolatileSpec {
    pub log: Option<PathBuf>,
}

/// A parsed spec: its rules, and host-crash mode if asked for.
#[derive(Debug)]
pub struct Spec {
    pub rules: Rules,
    pub volatile: Option<VolatileSpec>,
}

/// The rules of a spec, in order; cloned cheaply (shared counters).
#[derive(Clone, Debug, Default)]
pub struct Rules(Arc<Vec<Rule>>);

/// An injected fault: the error a rule fails a command with.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Injected {
    #[error("injected fault: I/O error")]
    Eio,
    #[error("injected fault: no space left")]
    NoSpace,
    #[error("injected fault: timed out")]
    Timeout,
}

impl Injected {
    /// As an I/O error (which [`Injected::of`] finds again).
    pub fn into_io(self) -> io::Error {
        let kind = match self {
            Injected::Eio => io::ErrorKind::Other,
            Injected::NoSpace => io::ErrorKind::StorageFull,
            Injected::Timeout => io::ErrorKind::TimedOut,
        };
        io::Error::new(kind, self)
    }

    /// The injected fault `e` carries, if it is one.
    pub fn of(e: &io::Error) -> Option<Injected> {
        e.get_ref()?.downcast_ref::<Injected>().copied()
    }
}

/// What the rules decided for one command that they did not fail.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Run it.
    Run,
    /// A write of which only the first `keep` bytes (whole sectors) land;
    /// then it fails (EIO), or, with `crash`, the process aborts.
    Torn { keep: usize, crash: bool },
}

/// Parse `spec` (module docs).
pub fn parse(spec: &str) -> Result<Spec, SpecError> {
    let err = |why: String| SpecError {
        spec: spec.to_string(),
        why,
    };
    let mut rules = Vec::new();
    let mut volatile = None;
    for r in spec.split(';').map(str::trim).filter(|r| !r.is_empty()) {
        let mut parts = r.split(',').map(str::trim);
        let head = parts.next().unwrap_or_default();
        if head == "volatile" {
            volatile = Some(parse_volatile(parts).map_err(err)?);
            continue;
        }
        let kind = parse_kind(head).map_err(err)?;
        rules.push(parse_rule(kind, parts).map_err(err)?);
    }
    Ok(Spec {
        rules: Rules(Arc::new(rules)),
        volatile,
    })
}

fn parse_volatile<'a>(opts: impl Iterator<Item = &'a str>) -> Result<VolatileSpec, String> {
    let mut v = VolatileSpec::default();
    for kv in opts {
        match kv.split_once('=') {
            Some(("log", path)) if !path.is_empty() => v.log = Some(path.into()),
            _ => return Err(format!("volatile: unknown option {kv:?} (log=PATH)")),
        }
    }
    Ok(v)
}

fn parse_kind(k: &str) -> Result<Kind, String> {
    Ok(match k {
        "eio" => Kind::Eio,
        "enospc" => Kind::NoSpace,
        "timeout" => Kind::Timeout,
        "delay" => Kind::Delay,
        "torn" => Kind::Torn,
        "torn-crash" => Kind::TornCrash,
        k => {
            return Err(format!(
                "unknown kind {k:?} (eio, enospc, timeout, delay, torn, torn-crash, volatile)"
            ))
        }
    })
}

fn parse_rule<'a>(kind: Kind, opts: impl Iterator<Item = &'a str>) -> Result<Rule, String> {
    let torn = matches!(kind, Kind::Torn | Kind::TornCrash);
    let mut rule = Rule {
        kind,
        op: if torn { OpClass::Write } else { OpClass::Any },
        after: 0,
        count: u64::MAX,
        prob: 1.0,
        ms: 100,
        seen: AtomicU64::new(0),
        fired: AtomicU64::new(0),
        rng: Mutex::new(Rng::new(0)),
    };
    for kv in opts {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("expected key=value, got {kv:?}"))?;
        let num = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{k}: not a number: {v:?}"))
        };
        match k {
            "op" => rule.op = parse_op(v)?,
            "after" => rule.after = num(v)?,
            "count" => rule.count = num(v)?,
            "ms" => rule.ms = num(v)?,
            "seed" => *rule.rng.get_mut().expect("fresh lock") = Rng::new(num(v)?),
            "prob" => {
                rule.prob = v
                    .parse::<f64>()
                    .ok()
                    .filter(|p| (0.0..=1.0).contains(p))
                    .ok_or_else(|| format!("prob: {v:?} is not in [0, 1]"))?
            }
            _ => {
                return Err(format!(
                    "unknown key {k:?} (op, after, count, prob, ms, seed)"
                ))
            }
        }
    }
    if torn && rule.op != OpClass::Write {
        return Err("torn faults apply to writes only".into());
    }
    Ok(rule)
}

fn parse_op(v: &str) -> Result<OpClass, String> {
    Ok(match v {
        "read" => OpClass::Read,
        "write" => OpClass::Write,
        "flush" => OpClass::Flush,
        "any" => OpClass::Any,
        _ => return Err(format!("op: {v:?} (read, write, flush, any)")),
    })
}

impl Rule {
    fn matches(&self, class: OpClass) -> bool {
        self.op == OpClass::Any || self.op == class
    }

    /// Does the rule fire for this (matching) command? Also returns a random number.
    fn fires(&self) -> Option<u64> {
        let n = self.seen.fetch_add(1, Ordering::Relaxed) + 1;
        if n <= self.after || self.fired.load(Ordering::Relaxed) >= self.count {
            return None;
        }
        let r = self.rng.lock().expect("rule rng lock").next_u64();
        if self.prob < 1.0 && (r >> 11) as f64 / (1u64 << 53) as f64 >= self.prob {
            return None;
        }
        self.fired.fetch_add(1, Ordering::Relaxed);
        Some(r)
    }
}

impl Rules {
    /// No rules: every command runs as it is.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The rules, in order.
    pub fn iter(&self) -> impl Iterator<Item = &Rule> {
        self.0.iter()
    }

    /// A command of `class` (`len` bytes, for a write) comes: run every
    /// matching rule in order, sleeping for `delay` and `timeout`. Fails
    /// with an [`Injected`] fault, or says whether to run it whole or torn.
    /// MUST be called once per command: it counts.
    pub fn decide(&self, class: OpClass, len: usize) -> io::Result<Fate> {
        for rule in self.0.iter().filter(|r| r.matches(class)) {
            let Some(r) = rule.fires() else { continue };
            let sleep = || std::thread::sleep(Duration::from_millis(rule.ms));
            match rule.kind {
                Kind::Eio => return Err(Injected::Eio.into_io()),
                Kind::NoSpace => return Err(Injected::NoSpace.into_io()),
                Kind::Timeout => {
                    sleep();
                    return Err(Injected::Timeout.into_io());
                }
                Kind::Delay => sleep(),
                Kind::Torn | Kind::TornCrash => {
                    let sectors = len.div_ceil(SECTOR as usize) as u64;
                    let keep = ((r % sectors.max(1)) * SECTOR) as usize;
                    return Ok(Fate::Torn {
                        keep: keep.min(len),
                        crash: rule.kind == Kind::TornCrash,
                    });
                }
            }
        }
        Ok(Fate::Run)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_reject() {
        let s = parse("eio,op=write,after=3,count=2;volatile").unwrap();
        assert_eq!(s.volatile, Some(VolatileSpec::default()));
        let r: Vec<&Rule> = s.rules.iter().collect();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].kind, Kind::Eio);
        assert_eq!(r[0].op, OpClass::Write);
        assert!(parse("bogus").is_err());
        assert!(parse("eio,prob=2").is_err());
        assert!(parse("torn,op=read").is_err());
        let v = parse("volatile,log=/tmp/x.log").unwrap().volatile;
        assert_eq!(v.unwrap().log.unwrap(), std::path::Path::new("/tmp/x.log"));
        assert!(parse("volatile,bogus").is_err());
        assert_eq!(parse("eio").unwrap().volatile, None);
    }

    #[test]
    fn rule_fires_after_and_count() {
        let s = parse("eio,after=2,count=1").unwrap();
        let fired: Vec<bool> = (0..5)
            .map(|_| s.rules.decide(OpClass::Read, 0).is_err())
            .collect();
        assert_eq!(fired, vec![false, false, true, false, false]);
    }

    #[test]
    fn rules_match_their_class_and_tear_at_sectors() {
        let s = parse("enospc,op=flush;torn,seed=7").unwrap();
        assert_eq!(s.rules.decide(OpClass::Read, 0).unwrap(), Fate::Run);
        let e = s.rules.decide(OpClass::Flush, 0).unwrap_err();
        assert_eq!(Injected::of(&e), Some(Injected::NoSpace));
        for _ in 0..50 {
            match s.rules.decide(OpClass::Write, 4000).unwrap() {
                Fate::Torn { keep, crash } => {
                    assert!(!crash);
                    assert!(keep < 4000 && keep % 512 == 0, "{keep}");
                }
                Fate::Run => panic!("torn always fires"),
            }
        }
    }
}
