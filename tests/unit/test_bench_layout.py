"""Where ``bench``, ``plan`` and ``launch`` sit: no import cycle inside them, and the core
and the cost model never import the benchmarks (imports read with ``ast``, none run)."""

from __future__ import annotations

import ast
from pathlib import Path

import splitsync

SRC = Path(splitsync.__file__).parent


def _module(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """splitsync modules ``path`` imports anywhere (lazy imports inside functions too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return {m for m in found if m.split(".")[0] == "splitsync"}


def _graph() -> dict[str, set[str]]:
    modules = {_module(p): p for p in SRC.rglob("*.py")}
    return {name: {m for m in _imports(path) if m in modules and m != name}
            for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]], within: tuple[str, ...]) -> list[str] | None:
    nodes = {n for n in graph if n.startswith(within)}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(n: str, path: list[str]) -> list[str] | None:
        state[n] = 1
        for m in sorted(graph[n] & nodes):
            if state.get(m) == 1:
                return [*path[path.index(m):], m] if m in path else [n, m]
            if m not in state and (found := visit(m, [*path, m])):
                return found
        state[n] = 2
        return None

    for n in sorted(nodes):
        if n not in state and (found := visit(n, [n])):
            return found
    return None


def test_no_import_cycle_in_bench_plan_or_launch() -> None:
    graph = _graph()
    for package in ("splitsync.bench", "splitsync.tools.plan", "splitsync.launch"):
        assert _cycle(graph, (package,)) is None, f"import cycle in {package}"


def test_only_commands_and_bench_itself_import_bench() -> None:
    graph = _graph()
    users = {n for n, deps in graph.items() if any(d.startswith("splitsync.bench") for d in deps)}
    assert {u for u in users if not u.startswith(("splitsync.bench", "splitsync.commands."))} == set()


def test_plan_and_env_stay_below_bench_and_launch() -> None:
    graph = _graph()
    for low in ("splitsync.tools.plan", "splitsync.tools.plan.costmodel", "splitsync.distributed.parsing", "splitsync.distributed.env"):
        assert {d for d in graph[low] if d.startswith(("splitsync.bench", "splitsync.launch",
                                                       "splitsync.commands"))} == set(), low


def test_the_checker_finds_a_cycle() -> None:
    assert _cycle({"a.x": {"a.y"}, "a.y": {"a.x"}}, ("a",)) == ["a.x", "a.y", "a.x"]
    assert _cycle({"a.x": {"a.y"}, "a.y": set()}, ("a",)) is None
