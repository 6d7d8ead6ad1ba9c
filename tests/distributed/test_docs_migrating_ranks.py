"""docs/migrating.md: its splitsync snippets run, section by section, at 1 and 2 processes;
the other side's snippets parse; every row of its tables maps to a call the README's
reference documents; the notebook launch snippet runs."""

from __future__ import annotations

import ast
import contextlib
import io
import re
from pathlib import Path
from typing import Any

import pytest

from splitsync.testing import spawn

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "migrating.md").read_text(encoding="utf-8")
README = (ROOT / "README.md").read_text(encoding="utf-8")
SECTIONS = ("Accelerate", "Lightning Fabric", "PyTorch-Ignite `idist`", "Raw DDP")
PEERS = {"Accelerate": "accelerate", "Lightning Fabric": "fabric",
         "PyTorch-Ignite `idist`": "ignite", "Raw DDP": "ddp"}


def _section(title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", DOC, flags=re.S | re.M)
    assert m, f"docs/migrating.md has no '## {title}' section"
    return m.group(1)


def _blocks(tag: str, text: str = DOC) -> list[str]:
    return re.findall(rf"^```python {tag}\n(.*?)^```", text, flags=re.S | re.M)


def _plain(value: Any) -> Any:
    """What a rank sends back of a snippet variable: numbers, strings, flags, small lists."""
    if isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "tolist") and getattr(value, "numel", lambda: 99)() <= 64:
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if _plain(v) is not None}
    return None


def _run_section(rank: int, world: int, title: str, workdir: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"workdir": workdir, "__name__": "migrating"}
    exec(compile(_blocks("preamble")[0], "migrating.md:preamble", "exec"), namespace)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            for i, block in enumerate(_blocks("splitsync", _section(title))):
                exec(compile(block, f"migrating.md:{title}:{i}", "exec"), namespace)
    finally:
        run = namespace.get("run")
        if run is not None:
            run.close()
    names = {k: _plain(v) for k, v in namespace.items() if not k.startswith("_")}
    return {"names": {k: v for k, v in names.items() if v is not None},
            "stdout": out.getvalue()}


def test_the_other_sides_snippets_parse_and_every_section_has_both_sides() -> None:
    for title in SECTIONS:
        text = _section(title)
        theirs, ours = _blocks(PEERS[title], text), _blocks("splitsync", text)
        assert theirs and ours, title
        for block in theirs:
            ast.parse(block)


def test_every_table_row_maps_to_a_documented_splitsync_call() -> None:
    documented = set(re.findall(r"`((?:run|ss)\.\w+)", README))
    for title in SECTIONS:
        rows = [line for line in _section(title).splitlines()
                if line.startswith("| ") and not line.startswith("| ---")][1:]
        assert len(rows) >= 10, title
        for row in rows:
            ours = row.split(" | ")[-1]
            calls = set(re.findall(r"`[^`]*?\b((?:run|ss)\.\w+)", ours))
            assert calls or "splitsync " in ours or ours.startswith("nothing"), row
            assert calls <= documented, f"{row}: {calls - documented} not in the README"


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("title", SECTIONS)
def test_the_splitsync_snippets_run(title: str, world: int, tmp_path: Path) -> None:
    out = spawn(_run_section, world, title, str(tmp_path), timeout=240)
    names = [o["names"] for o in out]
    if title == "Accelerate":
        for n in names:
            assert n["completed_steps"] == (9 if world == 1 else 5)  # 70 samples, 2 epochs
            assert len(n["correct"]) == 23  # every eval sample once, padding dropped
            assert n["accuracy"] == names[0]["accuracy"]
        assert (tmp_path / "model.safetensors").is_file()
        assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == \
            (["latest", "step-000004", "step-000008"] if world == 1 else
             ["latest", "step-000004"])
        said = [o["stdout"].count(" steps\n") for o in out]  # run.print: rank 0 only
        assert said == [1] + [0] * (world - 1), said
    if title == "Lightning Fabric":
        for n in names:
            assert n["state"]["iteration"] == 10  # back from the checkpoint
            assert n["ranks"] == list(range(world)) and n["config"] == {"lr": 0.1}
    if title == "Raw DDP":
        assert (tmp_path / "ckpt" / f"step-{2 * (9 if world == 1 else 5):06d}").is_dir()


def test_the_notebook_launch_snippet_runs() -> None:
    (block,) = _blocks("launch")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "migrating.md:launch", "exec"), {"__name__": "migrating"})
    assert out.getvalue().strip() == "[0.2, 0.2]"
