//! The verdict table every report ends with: the paper's number, ours, and a
//! verdict computed from the two by one rule for every report, with the
//! cause where the verdict is not "reproduced".
//!
//! The rule, for a claim about a ratio between two configurations (1.0 = no
//! difference), reads both as effects `ln(ratio)`:
//!
//! * **reproduced**: every value of ours has the paper's direction, an
//!   effect size within a factor [`SLACK`] of the paper's range, and a ratio
//!   within a factor [`SLACK`] of it (a paper range of 1.8–2.2× accepts
//!   1.34–4.4×; +4 to +12 % accepts +3 to +25 %; 45× accepts 22.5–90×): a
//!   simulation of a model of the paper's system is not expected to give its
//!   exact number, only its kind;
//! * **partly**: some of ours (over cache sizes, say) is reproduced, or ours
//!   has the paper's direction beyond [`NOISE`] somewhere, but not that size,
//!   and nowhere the other way;
//! * **reversed**: every value of ours goes the other way, beyond [`NOISE`];
//! * **not reproduced**: ours shows no effect (within [`NOISE`] of 1.0), or
//!   goes both ways.
//!
//! A qualitative claim (an ordering, a trend) is judged by how many of the
//! cases it is about hold: all (reproduced), some (partly), none (not
//! reproduced). The two constants are fixed for every claim in every report;
//! neither was chosen to move any verdict.

use std::fmt::Write as _;

/// Ours within 3 % of no change counts as no effect (simulation runs of a
/// few tens of seconds vary by about that much between nearby settings).
pub const NOISE: f64 = 1.03;

/// How far, as a factor on the effect size, ours may sit from the paper's
/// range and still count as reproduced.
pub const SLACK: f64 = 2.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Reproduced,
    Partly,
    NotReproduced,
    Reversed,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Reproduced => "reproduced",
            Verdict::Partly => "partly",
            Verdict::NotReproduced => "not reproduced",
            Verdict::Reversed => "reversed",
        }
    }

    /// A ratio claim: the paper's range `[lo, hi]` against our values (one
    /// per cache size or trace). Values MUST be positive and finite.
    pub fn of_ratio(paper: (f64, f64), ours: &[f64]) -> Verdict {
        assert!(
            paper.0 > 0.0 && paper.1 >= paper.0,
            "bad paper range {paper:?}"
        );
        assert!(
            ours.iter().all(|x| x.is_finite() && *x > 0.0),
            "bad ratios {ours:?}"
        );
        if ours.is_empty() {
            return Verdict::NotReproduced;
        }
        let (plo, phi) = (paper.0.ln(), paper.1.ln());
        let noise = NOISE.ln();
        if plo.abs() <= noise && phi.abs() <= noise {
            // The paper claims no change: ours must show none either.
            let none = ours.iter().filter(|x| x.ln().abs() <= noise).count();
            return Self::of_count(none, ours.len());
        }
        let dir = (plo + phi).signum();
        let (elo, ehi) = ((plo * dir).min(phi * dir), (plo * dir).max(phi * dir));
        let (accept_lo, accept_hi) = ((elo / SLACK).max(noise), ehi * SLACK);
        // Both bounds: the effect size within SLACK of the paper's, and the
        // ratio itself within SLACK (so 45× does not accept 2000×).
        let (ratio_lo, ratio_hi) = ((plo - SLACK.ln()) * dir, (phi + SLACK.ln()) * dir);
        let (ratio_lo, ratio_hi) = (ratio_lo.min(ratio_hi), ratio_lo.max(ratio_hi));
        let effects: Vec<f64> = ours.iter().map(|x| x.ln() * dir).collect();
        let inside = effects
            .iter()
            .filter(|e| **e >= accept_lo.max(ratio_lo) && **e <= accept_hi.min(ratio_hi))
            .count();
        let with = effects.iter().filter(|e| **e > noise).count();
        let against = effects.iter().filter(|e| **e < -noise).count();
        if inside == effects.len() {
            Verdict::Reproduced
        } else if inside > 0 || (with > 0 && against == 0) {
            Verdict::Partly
        } else if against == effects.len() {
            Verdict::Reversed
        } else {
            Verdict::NotReproduced
        }
    }

    /// A claim that ours is at least `floor` (e.g. "no throughput loss",
    /// floor 1.0), within [`NOISE`].
    pub fn of_floor(floor: f64, ours: &[f64]) -> Verdict {
        let ok = ours.iter().filter(|x| **x * NOISE >= floor).count();
        Self::of_count(ok, ours.len())
    }

    /// A qualitative claim that holds in `holds` of `cases` cases.
    pub fn of_count(holds: usize, cases: usize) -> Verdict {
        assert!(holds <= cases);
        if cases > 0 && holds == cases {
            Verdict::Reproduced
        } else if holds > 0 {
            Verdict::Partly
        } else {
            Verdict::NotReproduced
        }
    }
}

/// One row of the table.
pub struct Row {
    pub claim: String,
    pub paper: String,
    pub ours: String,
    pub verdict: Verdict,
    /// Why, where the verdict is not "reproduced" (shown only then).
    pub cause: String,
}

impl Row {
    pub fn new(
        claim: impl Into<String>,
        paper: impl Into<String>,
        ours: impl Into<String>,
        verdict: Verdict,
        cause: impl Into<String>,
    ) -> Row {
        Row {
            claim: claim.into(),
            paper: paper.into(),
            ours: ours.into(),
            verdict,
            cause: cause.into(),
        }
    }
}

impl Row {
    /// A qualitative claim that holds in `holds` of `cases` cases; ours reads
    /// `"{at} {holds} of {cases} {unit}"` ("on 3 of 4 traces").
    pub fn counted(
        claim: impl Into<String>,
        paper: impl Into<String>,
        (holds, cases): (usize, usize),
        (at, unit): (&str, &str),
        cause: impl Into<String>,
    ) -> Row {
        let ours = format!("{at} {holds} of {cases} {unit}");
        Row::new(claim, paper, ours, Verdict::of_count(holds, cases), cause)
    }
}

/// A qualitative claim judged case by case: (claim, the paper's words,
/// whether it holds in one case, cause).
pub type Check<'a, T> = (String, &'a str, &'a dyn Fn(&T) -> bool, &'a str);

/// One [`Row::counted`] per check, each counted over `cases`.
pub fn counted_rows<T>(
    rows: &mut Vec<Row>,
    cases: &[T],
    phrase: (&str, &str),
    checks: Vec<Check<'_, T>>,
) {
    for (claim, paper, holds, cause) in checks {
        let n = cases.iter().filter(|c| holds(c)).count();
        rows.push(Row::counted(claim, paper, (n, cases.len()), phrase, cause));
    }
}

/// Adds a report's rows for one figure or table of the runs `R`.
pub type Part<'a, R> = &'a dyn Fn(&R, &mut Vec<Row>);

/// The table of the rows `parts` add from `runs`, in order.
pub fn table_of<R>(runs: &R, parts: &[Part<R>]) -> String {
    let mut rows = Vec::new();
    for part in parts {
        part(runs, &mut rows);
    }
    table(&rows)
}

/// The Markdown table, with a count of each verdict under it.
pub fn table(rows: &[Row]) -> String {
    let mut s = String::from("| claim | paper | ours | verdict | cause |\n|---|---|---|---|---|\n");
    for r in rows {
        let cause = if r.verdict == Verdict::Reproduced {
            ""
        } else {
            r.cause.as_str()
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | **{}** | {} |",
            r.claim,
            r.paper,
            r.ours,
            r.verdict.as_str(),
            cause
        );
    }
    let count = |v: Verdict| rows.iter().filter(|r| r.verdict == v).count();
    let _ = writeln!(
        s,
        "\n{} claims: {} reproduced, {} partly, {} not reproduced, {} reversed. \
         One rule gives every verdict in every report \
         (`crates/nvwc-lab/src/repro/verdict.rs`): *reproduced* when every value \
         of ours has the paper's direction, with an effect and a ratio within a \
         factor of {SLACK} of the paper's, or when a qualitative claim holds in \
         every case; *partly* when only some values or cases do, or only the \
         direction holds; *reversed* when ours goes the other way; *not \
         reproduced* when ours shows no effect (within {:.0} % of none) or the \
         claim holds in no case.",
        rows.len(),
        count(Verdict::Reproduced),
        count(Verdict::Partly),
        count(Verdict::NotReproduced),
        count(Verdict::Reversed),
        (NOISE - 1.0) * 100.0
    );
    s
}

#[cfg(test)]
mod tests {
    use super::Verdict::*;
    use super::*;

    #[test]
    fn ratio_rule() {
        // Inside the paper's range, and within the slack.
        assert_eq!(Verdict::of_ratio((1.8, 2.2), &[2.0]), Reproduced);
        assert_eq!(Verdict::of_ratio((1.8, 2.2), &[1.4, 4.3]), Reproduced);
        assert_eq!(Verdict::of_ratio((1.8, 2.2), &[4.5]), Partly);
        // A large claimed ratio does not accept one forty times larger.
        assert_eq!(Verdict::of_ratio((45.0, 45.0), &[30.0, 80.0]), Reproduced);
        assert_eq!(Verdict::of_ratio((45.0, 45.0), &[863.0]), Partly);
        // Right direction, too small; and some sizes in, some out.
        assert_eq!(Verdict::of_ratio((1.8, 2.2), &[1.1]), Partly);
        assert_eq!(Verdict::of_ratio((1.8, 2.2), &[1.0, 2.0]), Partly);
        // No effect; the other way; both ways.
        assert_eq!(Verdict::of_ratio((1.8, 2.2), &[1.01]), NotReproduced);
        assert_eq!(Verdict::of_ratio((1.8, 2.2), &[0.65, 0.8]), Reversed);
        assert_eq!(Verdict::of_ratio((1.8, 2.2), &[0.7, 1.2]), NotReproduced);
        assert_eq!(Verdict::of_ratio((0.8, 0.8), &[0.6, 0.99]), Partly);
        // A reduction claimed (-72 %).
        assert_eq!(Verdict::of_ratio((0.28, 0.28), &[0.15]), Reproduced);
        assert_eq!(Verdict::of_ratio((0.28, 0.28), &[1.5]), Reversed);
        // A small claimed effect (+4 to +12 %) against none.
        assert_eq!(Verdict::of_ratio((1.04, 1.12), &[1.0]), NotReproduced);
        assert_eq!(Verdict::of_ratio((1.04, 1.12), &[1.05]), Reproduced);
        // The paper claims no change.
        assert_eq!(Verdict::of_ratio((1.0, 1.0), &[1.01, 0.99]), Reproduced);
        assert_eq!(Verdict::of_ratio((1.0, 1.0), &[1.01, 1.5]), Partly);
    }

    #[test]
    fn floor_and_count() {
        assert_eq!(Verdict::of_floor(1.0, &[0.99, 1.2]), Reproduced);
        assert_eq!(Verdict::of_floor(1.0, &[0.61]), NotReproduced);
        assert_eq!(Verdict::of_floor(1.0, &[0.61, 1.0]), Partly);
        assert_eq!(Verdict::of_count(0, 0), NotReproduced);
        assert_eq!(Verdict::of_count(2, 3), Partly);
    }

    #[test]
    fn table_hides_cause_when_reproduced() {
        let t = table(&[
            Row::new("a", "2×", "2.1×", Reproduced, "never shown"),
            Row::new("b", "2×", "1.0×", NotReproduced, "the model"),
        ]);
        assert!(!t.contains("never shown"));
        assert!(t.contains("| **not reproduced** | the model |"));
        assert!(t.contains("2 claims: 1 reproduced, 0 partly, 1 not reproduced, 0 reversed."));
    }
}
