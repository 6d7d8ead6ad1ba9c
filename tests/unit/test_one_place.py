"""Facts written once: the unknown-strategy message, the worker-seed formula and each
launcher's variable names each live in one module (``splitsync check``'s rules, which read
users' scripts, are left out: they name these variables as patterns to find)."""

from __future__ import annotations

import ast
from pathlib import Path

import splitsync
from splitsync.distributed.env import LAUNCHER_VARS

ROOT = Path(splitsync.__file__).resolve().parent


def _constants() -> dict[str, set[str]]:
    """Every string constant of the package -> the modules holding it."""
    found: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("check/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.setdefault(node.value, set()).add(rel)
    return found


def test_launcher_variable_names_live_in_distributed_env() -> None:
    found = _constants()
    names = {n for v in LAUNCHER_VARS.values() for n in v.names}
    assert {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"} <= names
    for name in sorted(names):
        assert found.get(name, set()) <= {"distributed/env.py"}, (name, found.get(name))


def test_unknown_strategy_message_and_worker_seed_formula_are_written_once() -> None:
    hits = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.py")
            if "Unknown strategy" in p.read_text(encoding="utf-8")]
    assert hits == ["strategies/__init__.py"]
    seeds = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.py")
             if "loader_seed(" in p.read_text(encoding="utf-8")
             or "* 1000003 + rank" in p.read_text(encoding="utf-8")]
    assert sorted(seeds) == ["data/build.py", "distributed/seeding.py"]
    from splitsync.distributed.seeding import loader_seed

    assert loader_seed(3, 1) != loader_seed(3, 0) != loader_seed(4, 0)
