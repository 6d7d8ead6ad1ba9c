"""The dead-code check that ``.ci/run`` runs: vulture at 60% confidence over the package,
with ``.ci/vulture_allowlist.py`` naming the entry points it cannot see used."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import splitsync

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(splitsync.__file__).resolve().parent
ALLOWLIST = ROOT / ".ci" / "vulture_allowlist.py"

pytest.importorskip("vulture")


def _vulture(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vulture", *map(str, paths),
                           "--min-confidence", "60"], capture_output=True, text=True,
                          timeout=120)


def test_the_package_has_no_dead_code() -> None:
    out = _vulture(PACKAGE, ALLOWLIST)
    assert out.returncode == 0, f"dead code (remove it, or allow it with a reason in " \
                                f"{ALLOWLIST.relative_to(ROOT)}):\n{out.stdout}{out.stderr}"


def test_the_check_finds_an_unused_function(tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text("def used():\n    return 1\n\n\ndef unused():\n"
                                     "    return 2\n\n\nprint(used())\n")
    out = _vulture(tmp_path)
    assert out.returncode != 0 and "unused function 'unused'" in out.stdout, out.stdout
