"""The recall measurement's own rules: how a finding matches a labelled mistake, how
``mistakes.tsv`` is validated, and that every label points at lines that exist.

Run with ``PYTHONPATH=src python -m pytest -q benchmarks/check_corpus/test_recall.py``; the
line check is skipped until ``build.py`` has rebuilt the files.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import check_precision as precision  # noqa: E402
import check_recall as recall  # noqa: E402


def _mistake(path: str = "a/train.py", spec: str = "10-12;40", cls: str = "padded-eval",
             split: str = "train") -> recall.Mistake:
    return recall.Mistake(path, recall._spans(spec), cls, "why", True, split)


def test_a_finding_matches_on_a_labelled_line_of_the_same_file_only() -> None:
    m = _mistake()
    assert m.covers("a/train.py", 10) and m.covers("a/train.py", 12)
    assert m.covers("a/train.py", 40)
    assert not m.covers("a/train.py", 13) and not m.covers("a/train.py", 39)
    assert not m.covers("b/train.py", 11)


def test_match_keeps_the_shown_severity_of_every_rule_on_the_lines() -> None:
    m, other = _mistake(), _mistake(path="b/eval.py", spec="7")
    findings = [("a/train.py", 11, "SS506", "warning"), ("a/train.py", 11, "SS101", "info"),
                ("a/train.py", 13, "SS501", "warning"), ("b/eval.py", 8, "SS501", "info")]
    matched = dict((x.path, hits) for x, hits in recall.match([m, other], findings))
    assert matched == {"a/train.py": [("SS101", "info"), ("SS506", "warning")], "b/eval.py": []}


def test_counts_split_recall_at_any_severity_and_at_warning() -> None:
    rows = [(_mistake(split="train"), [("SS501", "info")]),
            (_mistake(split="holdout"), [("SS506", "warning")]),
            (_mistake(split="holdout"), [])]
    c = recall._counts(rows)
    assert (c["all"], c["all_any"], c["all_shown"]) == (3, 2, 1)
    assert (c["holdout"], c["holdout_shown"], c["train_shown"]) == (2, 1, 0)
    assert "| **all** | 3 | 2 | 66.7% | 1 | 33.3% |" in recall.report(rows, files_read=3)


@pytest.mark.parametrize("row, error", [
    ({"path": "x/nope.py"}, "not in corpus.tsv"),
    ({"class": "printing"}, "unknown class"),
    ({"split": "dev"}, "split must be one of"),
    ({"line": "12,14"}, "is not like 120"),
])
def test_bad_rows_are_refused_naming_the_row_and_the_fix(
        monkeypatch: pytest.MonkeyPatch, row: dict[str, str], error: str) -> None:
    good = {"path": "a/train.py", "line": "3", "class": "padded-eval", "description": "d",
            "labelled_before_rules": "yes", "split": "train"}
    monkeypatch.setattr(precision, "_rows", lambda name: [{**good, **row}])
    with pytest.raises(SystemExit, match=error):
        recall.load_mistakes({"a/train.py": "train"})


def test_the_labelled_mistakes_load_and_cover_every_class_but_none() -> None:
    corpus = {precision._key(r["repo"], r["path"]): r["split"]
              for r in precision._rows("corpus.tsv")}
    mistakes, read = recall.load_mistakes(corpus)
    assert len(mistakes) >= 150 and len(read) >= 90
    assert all(m.before_rules for m in mistakes)
    assert {m.split for m in mistakes} == set(precision.SPLITS)


def test_every_labelled_line_exists_in_the_rebuilt_file() -> None:
    if not precision.FILES.is_dir():
        pytest.skip("corpus files not rebuilt (build.py --mirrors DIR)")
    corpus = {precision._key(r["repo"], r["path"]): r["split"]
              for r in precision._rows("corpus.tsv")}
    for m in recall.load_mistakes(corpus)[0]:
        lines = (precision.FILES / m.path).read_text(encoding="utf-8",
                                                     errors="replace").count("\n") + 1
        assert all(1 <= a <= b <= lines for a, b in m.spans), m


def test_the_checker_is_found_wherever_it_lives() -> None:
    assert hasattr(precision.lint(), "check_paths")
    assert hasattr(precision.lint("registry"), "gate")
    with pytest.raises(SystemExit, match="checker not found"):
        precision.lint("no_such_module")
