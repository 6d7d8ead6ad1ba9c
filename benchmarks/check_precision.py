"""Precision and recall of ``splitsync check`` on the labelled corpus of public training code.

The corpus (``benchmarks/check_corpus/corpus.tsv``) lists files of public repositories at fixed
commits; ``benchmarks/check_corpus/build.py --mirrors DIR`` rebuilds them from git mirrors.
Files marked ``context`` are there only because the scored files import them (a script is read
with its local modules); findings in them are not scored.

Each finding in a scored file must have a label (``labels.tsv``: path, line, rule, verdict,
why, batch). ``true`` labels that no finding matches are real mistakes the checker misses, so
recall = true labels found / all true labels. ``batch`` says whether the label was made on the
checker as it stood before the rules were tuned on this corpus (``before``) or afterwards
(``after``); the ``heldout`` split was labelled but never used to tune a rule.

    PYTHONPATH=src python benchmarks/check_precision.py            # the table
    PYTHONPATH=src python benchmarks/check_precision.py --write    # and store it in the package

``--write`` regenerates the checker's ``measured.py``, which gates each rule's severity (a rule
whose 95% Wilson interval of precision lies below 95% is at most ``info``; ``error`` needs no
false positive; see ``splitsync.check.gating``) and which ``splitsync check --explain`` quotes.
It counts the findings at each rule's own severity, not those a rule lowers to ``info``
itself (an overridable default, a finding that depends on unseen values).

Splits: ``train`` (rules were tuned on it), ``heldout`` (labelled, never tuned on),
``holdout`` (files added with ``mistakes.tsv``, labelled blind, never tuned on) and ``unseen``
(31 more repositories, mistakes labelled blind before any rule change they measure). Recall of the
real mistakes labelled by reading the files is ``benchmarks/check_recall.py``.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import sys
import time
from collections import Counter
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "check_corpus"
FILES = CORPUS / "files"
SHOW_FALSE = "--show-false" in sys.argv
SPLITS = ("train", "heldout", "holdout", "unseen")
#: The split that measures the rules as they are judged: never part of the gate's table.
UNSEEN = "unseen"
#: The runner's code for a module it could not read (listed once per run, not a finding).
NOT_READ = "SS003"


def lint(module: str = "") -> ModuleType:
    """The checker's package (``splitsync.check``), or one of its modules."""
    name = f"splitsync.check.{module}" if module else "splitsync.check"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        raise SystemExit(f"checker not found: {name} ({err}); install splitsync "
                         "(pip install -e .) or run with PYTHONPATH=src") from err


def _rows(name: str) -> list[dict[str, str]]:
    with open(CORPUS / name, newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def _key(repo: str, path: str) -> str:
    return f"{repo.replace('/', '__')}/{path}"


def _pct(num: int, den: int) -> str:
    return f"{100 * num / den:.1f}%" if den else "-"


def measure(skip: frozenset[str] = frozenset()) -> dict[str, object]:
    """Run the checker over the corpus (but the ``skip`` splits) and score it against the
    labels."""
    check_paths, all_rules = lint().check_paths, lint("registry").all_rules
    gate = lint("registry").gate
    corpus = _rows("corpus.tsv")
    split = {_key(r["repo"], r["path"]): r["split"] for r in corpus}
    missing = [k for k in split if not (FILES / k).is_file()]
    if missing:
        raise SystemExit(f"{len(missing)} corpus files are missing (e.g. {missing[0]}); rebuild "
                         "them: python benchmarks/check_corpus/build.py --mirrors DIR")
    labels = {(r["path"], int(r["line"]), r["rule"]): r for r in _rows("labels.tsv")}
    scored = sorted(k for k, s in split.items() if s != "context" and s not in skip)
    start = time.perf_counter()
    findings, _ = check_paths([FILES / k for k in scored], all_rules(gated=False))
    seconds = time.perf_counter() - start
    found: set[tuple[str, int, str]] = set()
    records: list[tuple[str, str, str, str, str]] = []  # rule, split, verdict, batch, severity
    located: list[tuple[str, int, str, str]] = []  # every finding: path, line, rule, shown severity
    raw: list[tuple[str, int, str, str]] = []  # the same with the severity before the gate
    unlabelled = []
    for f in findings:
        rel = Path(f.path).resolve().relative_to(FILES.resolve()).as_posix()
        located.append((rel, f.line, f.code, gate(f.code, f.severity)[0]))
        raw.append((rel, f.line, f.code, f.severity))
        if split.get(rel, "context") == "context" or f.code == NOT_READ:
            continue  # a module it could not read is listed, not a finding to label
        key = (rel, f.line, f.code)
        if key in found:
            continue
        found.add(key)
        label = labels.get(key)
        if label is None:
            unlabelled.append(key)
            continue
        records.append((f.code, split[rel], label["verdict"], label["batch"], f.severity))
        if label["verdict"] == "false" and SHOW_FALSE:
            print(f"false: {rel}:{f.line} {f.code} - {label['why']}", file=sys.stderr)
    real = [(rule, split.get(path, "train"), (path, line, rule) in found)
            for (path, line, rule), label in labels.items() if label["verdict"] == "true"
            and split.get(path, "train") not in skip]
    if SHOW_FALSE:
        for (path, line, rule), label in labels.items():
            if label["verdict"] == "true" and (path, line, rule) not in found:
                print(f"missed: {path}:{line} {rule} - {label['why']}", file=sys.stderr)
    return {"records": records, "real": real, "unlabelled": unlabelled, "files": len(scored),
            "findings": located, "raw": raw, "splits": split,
            "repos": len({r["repo"] for r in corpus
                          if r["split"] != "context" and r["split"] not in skip}),
            "seconds": seconds, "rules": {r.code: r.severity for r in all_rules(gated=False)}}


def _tally(result: dict[str, object], part: str, codes: set[str],
           shown_only: bool = False) -> Counter[str]:
    """Counts of true/false findings and of real mistakes found, for ``codes`` in ``part``
    (``shown_only``: findings at warning or error after the severity gate)."""
    gate = lint("registry").gate
    c: Counter[str] = Counter()
    for code, where, verdict, batch, severity in result["records"]:  # type: ignore[attr-defined]
        if code in codes and part in (where, "all"):
            if shown_only and gate(code, severity)[0] == "info":
                continue
            c[verdict] += 1
            c[f"{batch}_{verdict}"] += 1
            c[f"{gate(code, severity)[0]}_{verdict}"] += 1
            if severity == result["rules"].get(code):  # type: ignore[attr-defined]
                c[f"own_{verdict}"] += 1  # at the rule's own level: what the gate measures
    for code, where, hit in result["real"]:  # type: ignore[attr-defined]
        if code in codes and part in (where, "all"):
            c["real"] += 1
            c["real_found"] += hit
    return c


def _line(name: str, c: Counter[str], severity: str = "") -> str:
    n = c["true"] + c["false"]
    return (f"| {name} | {severity} | {n} | {c['true']} | {c['false']} | {_pct(c['true'], n)} | "
            f"{c['real_found']}/{c['real']} | {_pct(c['real_found'], c['real'])} |")


def _rule_line(code: str, c: Counter[str], shown: Counter[str], severity: str) -> str:
    """A rule's row: every finding, the findings at its own level (what the gate reads, with
    the 95% Wilson interval) and the findings shown at warning or error."""
    wilson = lint("gating").wilson
    n, own = c["true"] + c["false"], c["own_true"] + c["own_false"]
    low, high = wilson(c["own_true"], own)
    interval = f"{100 * low:.0f}-{100 * high:.0f}%" if own else "-"
    warn = shown["true"] + shown["false"]
    return (f"| {code} | {severity} | {n} | {c['true']} | {c['false']} | {_pct(c['true'], n)} | "
            f"{c['own_true']}/{own} | {interval} | {shown['true']}/{warn} | "
            f"{_pct(shown['true'], warn)} |")


def report(result: dict[str, object]) -> str:
    """The markdown tables: per rule over the whole corpus, then totals per split."""
    gated = {r.code: r.severity for r in lint("registry").all_rules()}
    codes = {r[0] for r in result["records"]} | {r[0] for r in result["real"]}  # type: ignore[attr-defined]
    out = [f"{result['files']} scored files from {result['repos']} repositories; check took "
           f"{result['seconds']:.2f} s.", "",
           "| rule | severity | findings | true | false | precision | at own level | "
           "95% interval | shown at warning+ | precision at warning+ |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for code in sorted(codes):
        out.append(_rule_line(code, _tally(result, "all", {code}),
                              _tally(result, "all", {code}, shown_only=True),
                              gated.get(code, "-")))
    out += ["", "| set | shown at | findings | true | false | precision | real found | recall |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    present = set(result["splits"].values())  # type: ignore[attr-defined]
    for part in [*(s for s in SPLITS if s in present), "all"]:
        out.append(_line(part, _tally(result, part, codes), "any severity"))
        out.append(_line(part, _tally(result, part, codes, shown_only=True), "warning+error"))
    every = _tally(result, "all", codes)
    before, after = every["before_true"] + every["before_false"], every["after_true"] + every[
        "after_false"]
    out += ["", f"labelled on the checker before any rule was tuned on this corpus: {before} "
            f"findings ({_pct(every['before_true'], before)} true); labelled after a change: "
            f"{after} ({_pct(every['after_true'], after)} true).",
            f"error-level false positives (gated severities): {every['error_false']}"]
    return "\n".join(out)


def write_measured(result: dict[str, object]) -> None:
    """Regenerate the package's table of measured precision (rule -> true, false, split)."""
    lines = ['"""Precision of each rule measured on the labelled corpus of public training code.',
             "", "Generated by ``benchmarks/check_precision.py --write``; do not edit by hand.",
             '"""', "", "from __future__ import annotations", "", "from types import MappingProxyType",
             "", "#: rule -> (true, false, held-out true, held-out false) findings on the corpus, counting",
             "#: the findings at the rule's own severity (not those it lowers to info itself).",
             "MEASURED: MappingProxyType[str, tuple[int, int, int, int]] = MappingProxyType({"]
    for code in sorted(result["rules"]):  # type: ignore[arg-type]
        a, h = _tally(result, "all", {code}), _tally(result, "heldout", {code})
        lines.append(f"    {code!r}: ({a['own_true']}, {a['own_false']}, {h['own_true']}, "
                     f"{h['own_false']}),")
    lines += ["})", "#: Scored files and repositories of the corpus.",
              f"CORPUS = ({result['files']}, {result['repos']})", ""]
    Path(lint("measured").__file__).write_text("\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true",
                        help="store the measured table in the checker's measured.py")
    parser.add_argument("--show-false", action="store_true",
                        help="list the false positives (to stderr)")
    parser.add_argument("--skip-split", action="append", default=[], choices=SPLITS,
                        help="leave a split out (repeatable); --write always leaves out "
                             f"{UNSEEN!r}, which measures the rules but never gates them")
    args = parser.parse_args()
    skip = frozenset(args.skip_split) | ({UNSEEN} if args.write else frozenset())
    result = measure(skip)
    if args.write:
        write_measured(result)
        importlib.reload(lint("measured"))
        importlib.reload(lint("gating"))
        importlib.reload(lint("registry"))  # report the severities the new table gates to
    print(report(result))
    unlabelled = result["unlabelled"]
    if unlabelled:
        print(f"\n{len(unlabelled)} findings have no label; add them to labels.tsv:")
        for path, line, rule in unlabelled:  # type: ignore[misc]
            print(f"{path}\t{line}\t{rule}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
