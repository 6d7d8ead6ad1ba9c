"""The runner: suppression comments, code selection, unparsable files, file discovery, JSON."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from splitsync.check import (
    all_rules,
    check_paths,
    check_source,
    iter_python_files,
    select_rules,
)
from splitsync.check.report import render_json, render_text

BAD = """\
import torch
x = torch.randn(2).cuda(){comment}
y = torch.device("cuda"){comment2}
"""


def codes(source: str, **kw: object) -> list[tuple[int, str]]:
    return [(f.line, f.code) for f in check_source(textwrap.dedent(source), "t.py", **kw)]


def test_findings_without_comments() -> None:
    assert codes(BAD.format(comment="", comment2="")) == [(2, "SS101"), (3, "SS101")]


@pytest.mark.parametrize("comment", ["  # splitsync: ignore[SS101]", "  # splitsync: ignore",
                                     "  # splitsync: ignore[SS501, ss101]",
                                     "  # noqa  # splitsync:ignore[SS101]"])
def test_line_comment_silences_its_line_only(comment: str) -> None:
    assert codes(BAD.format(comment=comment, comment2="")) == [(3, "SS101")]


def test_comment_for_another_code_silences_nothing() -> None:
    found = codes(BAD.format(comment="  # splitsync: ignore[SS501]", comment2=""))
    assert found == [(2, "SS101"), (3, "SS101")]


def test_file_comment_silences_the_code_everywhere() -> None:
    source = "# splitsync: ignore-file[SS101]\n" + BAD.format(comment="", comment2="")
    assert codes(source) == []


def test_unknown_code_in_comment_is_reported() -> None:
    found = check_source(BAD.format(comment="  # splitsync: ignore[SS999]", comment2=""), "t.py")
    bad = [f for f in found if f.code == "SS001"]
    assert len(bad) == 1 and bad[0].line == 2 and "SS999" in bad[0].message
    assert (2, "SS101") in [(f.line, f.code) for f in found]


def test_comment_text_inside_a_string_is_not_a_comment() -> None:
    source = 'import torch\nx = torch.randn(2).cuda(); s = "# splitsync: ignore"\n'
    assert codes(source) == [(2, "SS101")]


def test_multi_line_expression_can_be_silenced_on_its_last_line() -> None:
    source = "import torch\nx = torch.randn(\n    2).cuda()  # splitsync: ignore[SS101]\n"
    assert codes(source) == []


def test_select_and_ignore_by_code_and_prefix() -> None:
    assert [r.code for r in select_rules(["SS5"])] == ["SS501", "SS502", "SS503", "SS504", "SS505",
                                                     "SS506", "SS508", "SS509", "SS510"]
    assert "SS601" not in {r.code for r in select_rules(None, ["ss6"])}
    assert len(select_rules()) == len(all_rules()) >= 16
    with pytest.raises(ValueError, match="SS9.*matches no rule"):
        select_rules(["SS9"])
    with pytest.raises(ValueError, match="--ignore 'XX'"):
        select_rules(None, ["XX"])


def test_every_rule_has_a_unique_code_name_and_docs() -> None:
    rules = all_rules()
    assert len({r.code for r in rules}) == len(rules) == len({r.name for r in rules})
    assert all(r.summary and r.explain and r.check.__doc__ for r in rules)


def test_syntax_error_is_one_clear_error() -> None:
    found = check_source("def broken(:\n    pass\n", "broken.py")
    assert [(f.code, f.severity, f.line) for f in found] == [("SS000", "error", 1)]
    assert "cannot parse broken.py" in found[0].message


def test_file_discovery_recurses_and_skips_hidden_and_caches(tmp_path: Path) -> None:
    for rel in ["a.py", "sub/b.py", "sub/deeper/c.py", ".venv/x.py", "sub/__pycache__/d.py",
                "notes.txt"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    found = [p.relative_to(tmp_path).as_posix() for p in iter_python_files([tmp_path])]
    assert found == ["a.py", "sub/b.py", "sub/deeper/c.py"]
    assert check_paths([tmp_path, tmp_path / "a.py"]) == ([], 3)
    with pytest.raises(FileNotFoundError, match="missing.py: no such file"):
        list(iter_python_files([tmp_path / "missing.py"]))


def test_non_utf8_file_is_reported_not_crashed(tmp_path: Path) -> None:
    path = tmp_path / "latin.py"
    path.write_bytes(b"s = '\xe9'\n")
    (finding,) = check_paths([path])[0]
    assert finding.code == "SS000" and "UTF-8" in finding.fix


def test_json_and_text_reports(capsys: pytest.CaptureFixture[str]) -> None:
    found = check_source(BAD.format(comment="", comment2=""), "t.py", all_rules(gated=False))
    doc = json.loads(render_json(found, 1))
    assert doc["version"] == 1 and doc["files_checked"] == 1
    assert doc["summary"] == {"error": 0, "warning": 2, "info": 0}
    first = doc["findings"][0]
    assert {k: first[k] for k in ("code", "severity", "path", "line", "column")} == {
        "code": "SS101", "severity": "warning", "path": "t.py", "line": 2, "column": 5}
    assert first["message"] and first["fix"] and first["name"] == "hard-coded-cuda"
    render_text(found, 1)
    out = capsys.readouterr().out
    assert "t.py:2:5: SS101 warning [hard-coded-cuda]" in out
    assert "fix: " in out and "Found 2 warnings in 1 file (1 file checked)." in out
