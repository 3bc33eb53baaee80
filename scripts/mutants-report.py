#!/usr/bin/env python3
"""reports/mutants.md from committed mutant records and cargo-mutants output.

cargo-mutants' own output directories (mutants.out/) live in target/ or
/work/mutants-out/ and are lost when the machine is reset, so every run is
also kept as a compact committed record, reports/mutants-data/NAME.tsv: a
few `# key: value` header lines (run name, commit, cargo-mutants version,
test command, timeout, and free-text notes on what the run covered), then
one line per mutant, `OUTCOME<TAB>SECONDS<TAB>MUTANT` (caught, missed,
timeout or unviable; SECONDS is the mutant's build and test time, or `-`).

Usage:
  mutants-report.py record NAME OUT_DIR [--note TEXT ...] [--data DIR] [--skip-previous]
      Write DIR/NAME.tsv (default reports/mutants-data) from OUT_DIR
      (cargo-mutants' mutants.out: caught.txt, missed.txt, timeout.txt,
      unviable.txt, previously_caught.txt after --iterate, outcomes.json).
      --skip-previous leaves previously_caught.txt out (when the earlier
      run into the same directory has a record of its own).
  mutants-report.py remap NAME LIST.json [--data DIR] [--answers ANSWERS.md]
      Carry the outcomes of recorded mutants whose names moved (the source
      shifted since their run) to their names in LIST.json (`cargo mutants
      --list --json`, the code as it is now), and write them as DIR/NAME.tsv.
      A mutant is carried only if its line is untouched by `git diff -U0
      COMMIT HEAD` (COMMIT: its record's) and no line of its function, as
      LIST.json spans it now, is added, changed or deleted since COMMIT: the
      mutated function is the code the run tested, byte for byte, and only
      the lines around it moved. This is cargo-mutants' own incremental rule
      (`--in-diff` tests only mutants in touched code), made stricter by
      whole functions. Answers of carried missed mutants are appended to
      ANSWERS.md under their new names. Mutants in changed functions stay
      untested until a run covers them.
  mutants-report.py selftest
      Check remap's line arithmetic on made-up diffs (scripts/test.sh runs it).
  mutants-report.py [--data DIR] [--list LIST] [OUT_DIR ...] ANSWERS.md
      Print the report on stdout: every record in DIR, plus any OUT_DIR
      given. A mutant tested by several runs counts with its best outcome
      (caught > timeout > missed > unviable): a mutant that any run's tests
      catch is caught by the full test command too. LIST
      (default DIR/list.txt, from `cargo mutants --list`) is the set of
      mutants that exist now: records of mutants no longer in it (the source
      moved) are left out and counted, and the untested rest is counted per
      file.

ANSWERS.md answers missed mutants, one per line: "- `MUTANT` -- ANSWER" (the
test that now catches it, or why the mutant is equivalent).

A record may also hold `# prior: FILE caught=N timeout=N unviable=N` lines
and mutants with outcome `prior`: a run whose raw output was lost and of
which only the report's per-file totals and its missed mutants survive (the
missed ones are listed as `missed`, the rest as `prior`, counted from the
totals). Re-running such mutants replaces the record.
"""
import collections
import datetime
import json
import os
import re
import subprocess
import sys

KINDS = ["caught", "timeout", "missed", "unviable"]
RANK = {"caught": 4, "timeout": 3, "missed": 2, "unviable": 1, "prior": 0}
DEFAULT_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reports", "mutants-data")


def read_lines(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [l.rstrip("\n") for l in f if l.strip()]


def read_answers(path):
    """{mutant: answer} from ANSWERS.md's "- `MUTANT` -- ANSWER" lines."""
    answers = {}
    for line in read_lines(path):
        m = re.match(r"- `(.+?)` -- (.+)$", line)
        if m:
            answers[m.group(1)] = m.group(2)
    return answers


def raw_outcomes(d, previous=True):
    """{mutant: outcome} from a cargo-mutants output directory."""
    seen = {}
    for m in read_lines(os.path.join(d, "previously_caught.txt")) if previous else []:
        seen[m] = "caught"
    for k in KINDS:
        for m in read_lines(os.path.join(d, k + ".txt")):
            seen[m] = k
    return seen


def raw_details(d):
    """(seconds per mutant, baseline test argv, cargo-mutants version) from outcomes.json."""
    path = os.path.join(d, "outcomes.json")
    secs, argv, version = {}, None, None
    if not os.path.exists(path):
        return secs, argv, version
    with open(path) as f:
        j = json.load(f)
    version = j.get("cargo_mutants_version")
    for o in j.get("outcomes", []):
        sc = o.get("scenario")
        phases = o.get("phase_results", [])
        total = sum(float(p.get("duration", 0)) for p in phases)
        if sc == "Baseline":
            for p in phases:
                if p.get("phase") == "Test":
                    argv = p.get("argv")
            continue
        if isinstance(sc, dict) and "Mutant" in sc:
            if argv is None:
                argv = next((p.get("argv") for p in phases if p.get("phase") == "Test"), None)
            mu = sc["Mutant"]
            name = mu.get("name")
            if not name:
                span = mu.get("span", {}).get("start", {})
                name = "{}:{}:{}: {}".format(mu.get("file"), span.get("line"), span.get("column"),
                                              mu.get("description", ""))
            secs[name] = total
    return secs, argv, version


def record(name, out_dir, notes, data_dir, previous=True):
    seen = raw_outcomes(out_dir, previous)
    secs, argv, version = raw_details(out_dir)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "?"
    os.makedirs(data_dir, exist_ok=True)
    path = os.path.join(data_dir, name + ".tsv")
    with open(path, "w") as f:
        f.write("# nvwc mutants record v1\n")
        f.write(f"# run: {name}\n")
        f.write(f"# recorded: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC at commit {commit}\n")
        if version:
            f.write(f"# cargo-mutants: {version}\n")
        if argv:
            f.write(f"# test: {' '.join(argv)}\n")
        for n in notes:
            f.write(f"# note: {n}\n")
        for m in sorted(seen, key=sort_key):
            s = secs.get(m)
            f.write(f"{seen[m]}\t{'-' if s is None else f'{s:.0f}'}\t{m}\n")
    print(f"{path}: {len(seen)} mutants", file=sys.stderr)


def sort_key(m):
    parts = m.split(":", 3)
    try:
        return (parts[0], int(parts[1]), int(parts[2]), m)
    except (IndexError, ValueError):
        return (m, 0, 0, m)


def load_record(path):
    """(header lines, {mutant: outcome}, {file: Counter} prior totals)."""
    header, seen, prior = [], {}, collections.defaultdict(collections.Counter)
    for line in read_lines(path):
        if line.startswith("#"):
            m = re.match(r"# prior: (\S+) (.*)$", line)
            if m:
                for kv in m.group(2).split():
                    k, v = kv.split("=")
                    prior[m.group(1)][k] += int(v)
            else:
                header.append(line[2:] if line.startswith("# ") else line[1:])
            continue
        outcome, _secs, mutant = line.split("\t", 2)
        seen[mutant] = outcome
    return header, seen, prior


def file_of(m):
    return m.split(":", 1)[0]


def parse_name(m):
    """(file, line, col, description) of a mutant name, or None."""
    mm = re.match(r"([^:]+):(\d+):(\d+): (.*)$", m)
    return (mm.group(1), int(mm.group(2)), int(mm.group(3)), mm.group(4)) if mm else None


def diff_hunks(commit, path, cache):
    """[(old_start, old_count, new_start, new_count)] of `git diff -U0 COMMIT HEAD -- PATH`, or None."""
    key = (commit, path)
    if key not in cache:
        r = subprocess.run(["git", "diff", "-U0", commit, "HEAD", "--", path], capture_output=True, text=True)
        if r.returncode != 0:
            cache[key] = None
        else:
            hunks = []
            for h in re.finditer(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@", r.stdout, re.M):
                os_, oc, ns, nc = h.groups()
                hunks.append((int(os_), 1 if oc is None else int(oc), int(ns), 1 if nc is None else int(nc)))
            cache[key] = hunks
    return cache[key]


def map_line(line, hunks):
    """The line's number in HEAD, or None if a hunk changed or deleted it."""
    shift = 0
    for os_, oc, ns, nc in hunks:
        if oc and os_ <= line < os_ + oc:
            return None
        # A pure insertion (oc == 0) sits after old line os_.
        if (oc and os_ + oc <= line) or (not oc and os_ < line):
            shift += nc - oc
    return line + shift


def span_touched(start, end, hunks):
    """Whether a hunk adds, changes or deletes lines within HEAD's lines start..=end."""
    for _os, _oc, ns, nc in hunks:
        if nc and ns <= end and start <= ns + nc - 1:
            return True
        # A pure deletion (nc == 0) sits after new line ns.
        if not nc and start <= ns < end:
            return True
    return False


def remap(name, list_json, data_dir, answers_path):
    with open(list_json) as f:
        listing = json.load(f)
    spans = {}
    for mu in listing:
        fn = mu.get("function") or {}
        sp = fn.get("span")
        spans[mu["name"]] = (sp["start"]["line"], sp["end"]["line"]) if sp else None
    answers = read_answers(answers_path)
    cache, carried, origin = {}, {}, {}
    skipped = collections.Counter()
    for fn in sorted(os.listdir(data_dir)):
        if not fn.endswith(".tsv") or fn[:-4] == name:
            continue
        header, seen, _prior = load_record(os.path.join(data_dir, fn))
        commit = None
        for h in header:
            c = re.match(r"recorded: .*?(?: at commit| of) ([0-9a-f]{7,40})\b", h)
            if c:
                commit = c.group(1)
        for m, k in seen.items():
            if m in spans:
                continue
            p = parse_name(m)
            if p is None or commit is None:
                skipped["unparsed"] += 1
                continue
            path, line, col, desc = p
            hunks = diff_hunks(commit, path, cache)
            if hunks is None:
                skipped["unknown commit"] += 1
                continue
            new_line = map_line(line, hunks)
            if new_line is None:
                skipped["line changed"] += 1
                continue
            new = f"{path}:{new_line}:{col}: {desc}"
            if new not in spans:
                skipped["no such mutant now"] += 1
                continue
            if spans[new] is None or span_touched(spans[new][0], spans[new][1], hunks):
                skipped["function changed"] += 1
                continue
            if new not in carried or RANK[k] > RANK[carried[new]]:
                carried[new], origin[new] = k, (m, fn[:-4], commit)
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        head = "?"
    path = os.path.join(data_dir, name + ".tsv")
    with open(path, "w") as f:
        f.write("# nvwc mutants record v1\n")
        f.write(f"# run: {name}\n")
        f.write(f"# recorded: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC at commit {head}\n")
        f.write("# note: not a run: outcomes carried from earlier records to the names their mutants have now "
                "(`scripts/mutants-report.py remap`), each only if its whole function is unchanged since "
                "that record's commit\n")
        f.write("# note: not carried: " + ", ".join(f"{v} {k}" for k, v in sorted(skipped.items())) + "\n")
        for m in sorted(carried, key=sort_key):
            f.write(f"{carried[m]}\t-\t{m}\n")
    new_answers = []
    for m in sorted(carried, key=sort_key):
        old = origin[m][0]
        if carried[m] == "missed" and m not in answers and old in answers:
            new_answers.append(f"- `{m}` -- {answers[old]} (carried from `{old}`)")
    if new_answers:
        with open(answers_path, "a") as f:
            f.write(f"\n## Carried by record {name} (the same mutants, moved)\n\n")
            f.write("\n".join(new_answers) + "\n")
    print(f"{path}: {len(carried)} mutants carried; not carried: {dict(skipped)}; "
          f"{len(new_answers)} answers carried", file=sys.stderr)


def selftest():
    """remap's line arithmetic on made-up `git diff -U0` hunks."""
    # Old lines 10..=12 replaced by 4 new ones (10..=13); 3 lines inserted
    # after old line 20 (new 22..=24); old 30..=31 deleted (after new 33).
    hunks = [(10, 3, 10, 4), (20, 0, 22, 3), (30, 2, 33, 0)]
    cases = {5: 5, 9: 9, 10: None, 12: None, 13: 14, 20: 21, 21: 25, 29: 33, 30: None, 31: None, 32: 34}
    for old, new in cases.items():
        got = map_line(old, hunks)
        assert got == new, f"map_line({old}) = {got}, want {new}"
    # Functions by their span now: the deletion lies between new lines 33
    # and 34, inside 33..=40 and outside 34..=40 and 26..=33.
    for (s, e), want in {(1, 9): False, (1, 11): True, (13, 20): True, (14, 21): False,
                         (22, 23): True, (25, 30): False, (33, 40): True, (34, 40): False,
                         (26, 33): False}.items():
        got = span_touched(s, e, hunks)
        assert got == want, f"span_touched({s}, {e}) = {got}, want {want}"
    assert parse_name("a/b.rs:12:5: replace + with - in f") == ("a/b.rs", 12, 5, "replace + with - in f")
    print("mutants-report.py selftest: ok")


def main():
    args = sys.argv[1:]
    if args == ["selftest"]:
        return selftest()
    if args and args[0] == "record":
        name, out_dir, rest = args[1], args[2], args[3:]
        notes, data_dir, previous = [], DEFAULT_DATA, True
        while rest:
            if rest[0] == "--skip-previous":
                # previously_caught.txt is already in the record of the run it came from.
                previous = False
                rest = rest[1:]
                continue
            if rest[0] == "--note":
                notes.append(rest[1])
            elif rest[0] == "--data":
                data_dir = rest[1]
            else:
                sys.exit(f"unknown argument {rest[0]}")
            rest = rest[2:]
        record(name, out_dir, notes, data_dir, previous)
        return
    if args and args[0] == "remap":
        name, list_json, rest = args[1], args[2], args[3:]
        data_dir, answers_path = DEFAULT_DATA, os.path.join(DEFAULT_DATA, "..", "mutants-answers.md")
        while rest:
            if rest[0] == "--data":
                data_dir = rest[1]
            elif rest[0] == "--answers":
                answers_path = rest[1]
            else:
                sys.exit(f"unknown argument {rest[0]}")
            rest = rest[2:]
        remap(name, list_json, data_dir, answers_path)
        return
    data_dir, list_path = DEFAULT_DATA, None
    while args and args[0].startswith("--"):
        if args[0] == "--data":
            data_dir = args[1]
        elif args[0] == "--list":
            list_path = args[1]
        else:
            sys.exit(f"unknown option {args[0]}")
        args = args[2:]
    *dirs, answers_path = args
    if list_path is None:
        list_path = os.path.join(data_dir, "list.txt")

    runs = []  # (name, header, {mutant: outcome}, prior)
    if os.path.isdir(data_dir):
        for fn in sorted(os.listdir(data_dir)):
            if fn.endswith(".tsv"):
                h, s, p = load_record(os.path.join(data_dir, fn))
                runs.append((fn[:-4], h, s, p))
    for d in dirs:
        runs.append((d, ["raw output directory, not recorded"], raw_outcomes(d), {}))

    existing = set(read_lines(list_path)) if os.path.exists(list_path) else None
    best, stale = {}, set()
    prior = collections.defaultdict(collections.Counter)
    for _name, _h, seen, p in runs:
        for f, c in p.items():
            prior[f].update(c)
        for m, k in seen.items():
            if existing is not None and m not in existing:
                stale.add(m)
                continue
            if m not in best or RANK[k] > RANK[best[m]]:
                best[m] = k

    # A record with prior totals names its mutants with outcome `prior`. The
    # totals count only while every one of those names is a mutant of the
    # code now (unmoved, or carried by a remap record) that no run has
    # tested since; otherwise the file's totals are dropped and its prior
    # names count as untested.
    dropped_prior = []
    for f in sorted(prior):
        current = [m for m, k in best.items() if k == "prior" and file_of(m) == f]
        if len(current) != sum(prior[f].values()):
            dropped_prior.append((f, sum(prior[f].values()), len(current)))
            del prior[f]
            for m in current:
                del best[m]
    per_file = collections.defaultdict(collections.Counter)
    for m, k in best.items():
        if k != "prior":
            per_file[file_of(m)][k] += 1
    for f, c in prior.items():
        per_file[f].update(c)
    total = collections.Counter()
    for c in per_file.values():
        total.update(c)
    tested = sum(total[k] for k in KINDS)
    viable = total["caught"] + total["missed"] + total["timeout"]
    rate = 100.0 * (total["caught"] + total["timeout"]) / viable if viable else 0.0

    answers = read_answers(answers_path)

    print("# Mutation testing: engine, write policies, layout\n")
    print("Generated by `scripts/mutants-report.py` from the committed records in")
    print("`reports/mutants-data/` (one per cargo-mutants run; `scripts/mutants.sh` runs")
    print("cargo-mutants with the full test command, nvwc-core's tests and")
    print("`crates/nvwc-vopr/tests/smoke.rs`, a VOPR run of every policy). A mutant")
    print("tested by several runs counts with its best outcome: a mutant caught by a")
    print("subset of the tests is caught by the full command too. A timeout counts as")
    print("caught (the mutant hangs the engine, and the VOPR's liveness check or the")
    print("test timeout stops it).\n")
    print(f"Mutants tested: {tested}; viable: {viable}; caught {total['caught']}, "
          f"timeouts {total['timeout']}, missed {total['missed']}, unviable {total['unviable']}.")
    print(f"**Caught: {rate:.1f}% of viable mutants tested.**\n")

    remaining = collections.Counter()
    listed = collections.Counter()
    if existing is not None:
        for m in existing:
            listed[file_of(m)] += 1
            if m not in best:
                remaining[file_of(m)] += 1
    files = sorted(set(per_file) | set(listed))
    print("| file | mutants | tested | caught | timeout | missed | unviable | caught % | untested |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for f in files:
        c = per_file[f]
        v = c["caught"] + c["missed"] + c["timeout"]
        t = v + c["unviable"]
        pct = f"{100.0 * (c['caught'] + c['timeout']) / v:.1f}" if v else "-"
        n = listed[f] if existing is not None else "?"
        r = remaining[f] if existing is not None else "?"
        print(f"| `{f}` | {n} | {t} | {c['caught']} | {c['timeout']} | {c['missed']} | {c['unviable']} | {pct} | {r} |")
    if existing is not None:
        print(f"| **all** | {sum(listed.values())} | {tested} | {total['caught']} | {total['timeout']} | "
              f"{total['missed']} | {total['unviable']} | {rate:.1f} | {sum(remaining.values())} |")
        print(f"\n`mutants` and `untested` are from `{os.path.relpath(list_path)}` "
              "(`cargo mutants --list` over the files of `scripts/mutants.sh`).")
        if stale:
            print(f"{len(stale)} recorded mutants are no longer in that list (the source moved) and are left out.")
        for f, n, cur in dropped_prior:
            print(f"The prior totals of `{f}` ({n} mutants, from a record whose raw output was lost) are left out: "
                  f"only {cur} of their names are mutants of the code now and untested since.")

    missed_all = [m for m, k in best.items() if k == "missed"]
    equiv = [m for m in missed_all if answers.get(m, "").startswith("equivalent")]
    if viable:
        print(f"\nOf the {len(missed_all)} missed mutants, {len(equiv)} are answered as equivalent "
              "(no output can change; the answer says why): counting those out, "
              f"{100.0 * (total['caught'] + total['timeout']) / (viable - len(equiv)):.1f}% "
              "of the mutants that could be caught are.")

    print("\n## Runs\n")
    for name, header, seen, p in runs:
        c = collections.Counter(seen.values())
        counts = ", ".join(f"{k} {c[k]}" for k in KINDS + ["prior"] if c[k])
        print(f"- **{name}** ({len(seen)} mutants: {counts})")
        for h in header:
            if not h.startswith("nvwc mutants record"):
                print(f"  - {h}")

    missed = sorted((m for m, k in best.items() if k == "missed"), key=sort_key)
    unanswered = [m for m in missed if m not in answers]
    print(f"\n## Missed mutants ({len(missed)}; {len(unanswered)} without an answer)\n")
    for m in missed:
        print(f"- `{m}` -- {answers.get(m, '**no answer yet**')}")


if __name__ == "__main__":
    main()
