"""Recall of ``splitsync check`` on the real data-parallel mistakes of the labelled corpus.

``benchmarks/check_corpus/mistakes.tsv`` lists the mistakes found by reading each file before
looking at what ``check`` reports on it (path, line, class, description,
labelled_before_rules, split). ``line`` is one line, a range ``a-b``, or several of either
joined by ``;`` (``120;240-245``): the lines a user would change or where the mistake shows.
A row of class ``none`` (line ``0``) records a file that was read and holds no mistake.

Matching rule: a mistake is found when ``check`` reports a finding, of any rule, in the same
file on one of the labelled lines. It is found "at warning or above" when one such finding is
shown at ``warning`` or ``error`` after the severity gate. Findings in the imported local
modules count (they are reported when the scored file that imports them is checked).

The report prints precision per rule (``check_precision.report``) and then recall per class
and per split, overall and without ``hard-coded-cuda`` (a lesson rule, not a correctness bug
at N GPUs); ``--found`` lists the mistakes found at warning or above with the rules that
matched (so credit from a rule of another topic on the same line shows; the last column of
the table counts only the rules of the class's topic, :data:`TOPIC`), ``--misses`` every
mistake not found at warning or above. Both list the ``train`` split unless ``--split`` names
another: the held-out parts measure the rules and are never read to design them.

    PYTHONPATH=src python benchmarks/check_recall.py            # both tables
    PYTHONPATH=src python benchmarks/check_recall.py --misses   # and the missed mistakes
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import check_precision as precision  # noqa: E402  (a sibling script, not a package)

CLASSES = ("output-every-rank", "collective-out-of-step", "never-synchronised", "no-sampler",
           "no-set-epoch", "padded-eval", "unreduced-metric", "accumulation-without-no_sync",
           "every-rank-writes", "repeated-heavy-work", "group-never-initialised",
           "hard-coded-cuda", "unsynchronised-seeds", "other")
SHOWN = ("warning", "error")
#: The rules about each class's topic: a mistake found by one of them is found for its own
#: reason, not by a rule about something else that shares its line (`other`: any rule).
TOPIC = {
    "output-every-rank": {"SS501", "SS503", "SS508"},
    "collective-out-of-step": {"SS207", "SS208"},
    "never-synchronised": {"SS106", "SS202", "SS205", "SS206", "SS208", "SS209"},
    "no-sampler": {"SS301"}, "no-set-epoch": {"SS302"}, "padded-eval": {"SS304", "SS506"},
    "unreduced-metric": {"SS506", "SS304"}, "accumulation-without-no_sync": {"SS602"},
    "every-rank-writes": {"SS502", "SS504", "SS505", "SS509"}, "repeated-heavy-work": set(),
    "group-never-initialised": {"SS202", "SS208"},
    "hard-coded-cuda": {"SS101", "SS104", "SS204"},
    "unsynchronised-seeds": {"SS401", "SS404"},
}
_SPEC = re.compile(r"^\d+(-\d+)?(;\d+(-\d+)?)*$")


@dataclass(frozen=True)
class Mistake:
    """One labelled mistake: where, what, and which split it belongs to."""

    path: str
    spans: tuple[tuple[int, int], ...]
    cls: str
    description: str
    before_rules: bool
    split: str

    def covers(self, path: str, line: int) -> bool:
        """Is a finding at ``path:line`` on one of the labelled lines?"""
        return path == self.path and any(a <= line <= b for a, b in self.spans)


def _spans(spec: str) -> tuple[tuple[int, int], ...]:
    out = []
    for part in spec.split(";"):
        a, _, b = part.partition("-")
        out.append((int(a), int(b or a)))
    return tuple(out)


def load_mistakes(corpus: dict[str, str]) -> tuple[list[Mistake], set[str]]:
    """The labelled mistakes and the files read for them (``corpus``: path -> split)."""
    mistakes, read = [], set()
    for n, row in enumerate(precision._rows("mistakes.tsv"), start=2):
        where = f"mistakes.tsv line {n}"
        if row["path"] not in corpus:
            raise SystemExit(f"{where}: {row['path']} is not in corpus.tsv; add it there")
        if row["class"] not in (*CLASSES, "none"):
            raise SystemExit(f"{where}: unknown class {row['class']!r}; use one of "
                             f"{', '.join(CLASSES)} or none")
        if row["split"] not in precision.SPLITS:
            raise SystemExit(f"{where}: split must be one of {precision.SPLITS}")
        if not _SPEC.match(row["line"]):
            raise SystemExit(f"{where}: line {row['line']!r} is not like 120, 120-125 or 3;9-12")
        read.add(row["path"])
        if row["class"] != "none":
            mistakes.append(Mistake(row["path"], _spans(row["line"]), row["class"],
                                    row["description"], row["labelled_before_rules"] == "yes",
                                    row["split"]))
    return mistakes, read


def match(mistakes: list[Mistake], findings: list[tuple[str, int, str, str]]
          ) -> list[tuple[Mistake, list[tuple[str, str]]]]:
    """Each mistake with the (rule, shown severity) of the findings on its lines."""
    by_path: dict[str, list[tuple[str, int, str, str]]] = {}
    for f in findings:
        by_path.setdefault(f[0], []).append(f)
    return [(m, sorted({(code, sev) for path, line, code, sev in by_path.get(m.path, [])
                        if m.covers(path, line)})) for m in mistakes]


def _pct(num: int, den: int) -> str:
    return precision._pct(num, den)


def _counts(rows: list[tuple[Mistake, list[tuple[str, str]]]]) -> Counter[str]:
    c: Counter[str] = Counter()
    for m, hits in rows:
        shown = any(sev in SHOWN for _, sev in hits)
        topic = TOPIC.get(m.cls)
        own = any(sev in SHOWN and (topic is None or code in topic) for code, sev in hits)
        for part in (m.split, "all"):
            c[f"{part}"] += 1
            c[f"{part}_any"] += bool(hits)
            c[f"{part}_shown"] += shown
            c[f"{part}_own"] += own
        c["before"] += m.before_rules
    return c


def _row(name: str, c: Counter[str], splits: list[str]) -> str:
    per_split = " | ".join(f"{c[f'{s}_shown']}/{c[s]}" for s in splits)
    return (f"| {name} | {c['all']} | {c['all_any']} | {_pct(c['all_any'], c['all'])} | "
            f"{c['all_shown']} | {_pct(c['all_shown'], c['all'])} | {per_split} | "
            f"{c['all_own']} ({_pct(c['all_own'], c['all'])}) |")


def report(matched: list[tuple[Mistake, list[tuple[str, str]]]], files_read: int) -> str:
    """The recall table: per class, then overall, with warning+ recall per split."""
    splits = [s for s in precision.SPLITS if any(m.split == s for m, _ in matched)]
    head = ("| class | mistakes | found (any severity) | recall (any) | found (warning+) | "
            "recall (warning+) | " + " | ".join(f"warning+ {s}" for s in splits) +
            " | warning+ by a rule of its topic |")
    out = [f"{len(matched)} real mistakes labelled in {files_read} files read "
           f"({_counts(matched)['before']} labelled before looking at check's output).", "",
           head, "|" + " --- |" * (7 + len(splits))]
    for cls in CLASSES:
        rows = [r for r in matched if r[0].cls == cls]
        if rows:
            out.append(_row(cls, _counts(rows), splits))
    out.append(_row("**all**", _counts(matched), splits))
    out.append(_row("**all but hard-coded-cuda**",
                    _counts([r for r in matched if r[0].cls != "hard-coded-cuda"]), splits))
    return "\n".join(out)


def misses(matched: list[tuple[Mistake, list[tuple[str, str]]]], splits: tuple[str, ...]
           ) -> str:
    """Every mistake of ``splits`` not found at warning or above, grouped by class."""
    out = ["", f"misses listed for: {', '.join(splits)}"]
    for cls in CLASSES:
        rows = [(m, hits) for m, hits in matched if m.cls == cls and m.split in splits
                and not any(sev in SHOWN for _, sev in hits)]
        if not rows:
            continue
        out += ["", f"### {cls} ({len(rows)} missed at warning+)"]
        for m, hits in rows:
            seen = f" [seen at info: {', '.join(c for c, _ in hits)}]" if hits else ""
            spans = ";".join(f"{a}" if a == b else f"{a}-{b}" for a, b in m.spans)
            out.append(f"- {m.path}:{spans} ({m.split}){seen}: {m.description}")
    return "\n".join(out)


def found(matched: list[tuple[Mistake, list[tuple[str, str]]]], splits: tuple[str, ...]
          ) -> str:
    """Every mistake of ``splits`` found at warning or above, with the rules that matched it
    (a rule of another topic on the same line also matches: this list shows such credit)."""
    out = ["", "### found at warning+"]
    for m, hits in matched:
        if m.split in splits and any(sev in SHOWN for _, sev in hits):
            rules = ", ".join(f"{code} ({sev})" for code, sev in hits)
            out.append(f"- {m.cls}: {m.path} ({m.split}) by {rules}")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--misses", action="store_true",
                        help="list the mistakes not found at warning or above")
    parser.add_argument("--found", action="store_true",
                        help="list the mistakes found at warning or above and the rules that did")
    parser.add_argument("--split", action="append", choices=precision.SPLITS,
                        help="the splits --misses and --found list (repeatable; default train: "
                             "the held-out parts are for measuring, never for designing rules)")
    args = parser.parse_args()
    splits = tuple(args.split or ("train",))
    result = precision.measure()
    corpus = {precision._key(r["repo"], r["path"]): r["split"]
              for r in precision._rows("corpus.tsv")}
    mistakes, read = load_mistakes(corpus)
    matched = match(mistakes, result["findings"])  # type: ignore[arg-type]
    print(precision.report(result))
    unlabelled = result["unlabelled"]
    if unlabelled:
        print(f"\n{len(unlabelled)} findings in scored files have no precision label "  # type: ignore[arg-type]
              "(run check_precision.py to list them)")
    print()
    print(report(matched, len(read)))
    if args.found:
        print(found(matched, splits))
    if args.misses:
        print(misses(matched, splits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
