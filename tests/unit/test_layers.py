"""The package's import structure: no cycles, and no import from a lower layer to a higher one.

Walks every module of src/splitsync with ``ast``. Imports inside functions count (a lazy
import is still a dependency); imports under ``if TYPE_CHECKING:`` count for the direction
of layers but not for cycles (they never run, so a type-only loop cannot bite).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import splitsync

ROOT = Path(splitsync.__file__).resolve().parent

# The recorders init attaches, each in its feature family's package under tools/: they run in
# the training process, so they sit in the observers layer, below the programs that read them.
RECORDERS = ("splitsync.tools.goodput.clock", "splitsync.tools.verify.record",
             "splitsync.tools.verify.agree", "splitsync.tools.verify.draws",
             "splitsync.tools.audit.ledger")

# Lowest first; a layer is a set of folders (and a few top-level modules). A module belongs to
# the layer of its longest matching prefix, and may import its own layer and lower ones only.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("splitsync.errors", "splitsync.tree", "splitsync.version",
              "splitsync.distributed", "splitsync.preemption")),
    ("check", ("splitsync.check",)),  # the linter: a product of its own (see below)
    ("mechanics", ("splitsync.observe", "splitsync.train", "splitsync.strategies",
                   "splitsync.data", "splitsync.output", "splitsync.ckpt")),
    ("run", ("splitsync.run", "splitsync.ft")),  # ft: the Run of a fault-tolerant job
    # what init attaches to a run: the guards, the straggler clock, and each feature family's
    # recorder, kept in its family's package under tools/ (RECORDERS)
    ("observers", ("splitsync.observers", *RECORDERS)),
    ("launch", ("splitsync.launch", "splitsync.testing")),
    ("api", ("splitsync", "splitsync.api")),  # "splitsync" alone: the package itself
    # a feature family's programs (verify, plan, audit, goodput, envreport), over the public API
    ("tools", ("splitsync.tools",)),
    ("apps", ("splitsync.bench",)),
    ("commands", ("splitsync.commands", "splitsync.cli", "splitsync.__main__")),
)
RANK = {name: i for i, (name, _) in enumerate(LAYERS)}
MAX_CKPT_MODULES = 13  # docs/architecture.md states it; tests/unit/test_docs_architecture.py checks


def layer_of(module: str) -> str:
    best, length = "", 0
    for name, prefixes in LAYERS:
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > length:
                best, length = name, len(p)
    return best


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in ROOT.rglob("*.py")}


def _targets(node: ast.AST, here: str, is_pkg: bool) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] == "splitsync":
                yield alias.name
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            pkg = here.split(".") if is_pkg else here.split(".")[:-1]
            pkg = pkg[: len(pkg) - (node.level - 1)]
            base = ".".join([*pkg, base] if base else pkg)
        if base.split(".")[0] != "splitsync":
            return
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            if sub in MODULES:
                yield sub
            elif base == "splitsync" and alias.name.startswith("__"):
                continue  # __version__: a constant, not the public API
            else:
                yield base


def _type_only(tree: ast.Module) -> set[int]:
    """ids of import nodes under ``if TYPE_CHECKING:``."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            found |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return found


@functools.cache
def _parsed(path: Path) -> ast.Module:
    """Each module parsed once for all the tests here (the trees are only read)."""
    return ast.parse(path.read_text(), filename=str(path))


def graph(runtime_only: bool = False) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for mod, path in MODULES.items():
        tree = _parsed(path)
        is_pkg = path.name == "__init__.py"
        skip = _type_only(tree) if runtime_only else set()
        edges[mod] = {t for n in ast.walk(tree) if id(n) not in skip
                      for t in _targets(n, mod, is_pkg) if t in MODULES and t != mod}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_layers_are_assigned_as_intended() -> None:
    assert layer_of("splitsync.run.runtime") == "run"
    assert layer_of("splitsync.strategies.fsdp") == "mechanics"
    assert layer_of("splitsync.distributed.comm") == "base"
    assert layer_of("splitsync.observers.guards.hangs") == "observers"
    assert layer_of("splitsync.tools.verify.record") == "observers"
    assert layer_of("splitsync.tools.verify.script") == "tools"
    assert layer_of("splitsync.check.rules.data") == "check"
    assert layer_of("splitsync.commands.verify_worker") == "commands"
    assert layer_of("splitsync") == "api" and layer_of("splitsync.api") == "api"
    assert layer_of("splitsync.commands.run") == "commands"
    assert layer_of("splitsync.launch.spec") == "launch"
    assert layer_of("splitsync.bench.workloads") == "apps"
    # run.log's sinks and run.profile's stepper are the Run's own; the straggler clock is a
    # observer that init attaches; the notebook launcher is part of launch.
    assert layer_of("splitsync.output.trackers.fanout") == "mechanics"
    assert layer_of("splitsync.run.profile") == "run"
    assert layer_of("splitsync.observers.stragglers") == "observers"
    assert layer_of("splitsync.launch.notebook") == "launch"


def test_every_module_is_in_a_layer_and_the_top_level_stays_small() -> None:
    unplaced = sorted(m for m in MODULES if not layer_of(m))
    assert not unplaced, f"modules in no layer (add their folder to LAYERS): {unplaced}"
    top = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(top) <= 14, f"{len(top)} top-level modules: {top}"
    # every folder is a package in exactly one layer
    for folder in sorted(d for d in ROOT.iterdir() if d.is_dir() and d.name != "__pycache__"):
        assert (folder / "__init__.py").exists(), folder
        assert layer_of(f"splitsync.{folder.name}"), folder.name


def test_no_import_goes_up_a_layer() -> None:
    bad = [f"{mod} ({layer_of(mod)}) imports {dep} ({layer_of(dep)})"
           for mod, deps in graph().items() for dep in sorted(deps)
           if RANK[layer_of(dep)] > RANK[layer_of(mod)]]
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_the_core_never_names_a_tool() -> None:
    """Not even in a string: the Run and its parts know observers only as observers."""
    core = [p for name, prefixes in LAYERS[:4] if name != "check" for prefix in prefixes
            for p in _files_under(prefix)]
    assert len(core) > 40
    for path in core:
        text = path.read_text()
        assert "splitsync.tools" not in text and "splitsync.observers" not in text, \
            path.relative_to(ROOT)
    # config carries the tools' settings (straggler_threshold); the rest names none of them
    for path in [*_files_under("splitsync.run"), ROOT / "observe.py"]:
        if path.name != "config.py":
            text = path.read_text()
            assert "verify" not in text and "desync" not in text and "straggler" not in text, path


def _files_under(prefix: str) -> list[Path]:
    rel = Path(*prefix.split(".")[1:])
    folder, module = ROOT / rel, (ROOT / rel).with_suffix(".py")
    return sorted(folder.rglob("*.py")) if folder.is_dir() else [module]


def test_no_import_cycles() -> None:
    found = cycles(graph(runtime_only=True))
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_cycle_finder_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_linter_stands_alone() -> None:
    """``splitsync.check`` reads users' scripts without torch: it imports no other part of
    the package, and no shipped module but the ``check`` command imports it."""
    edges = graph()
    out = sorted(f"{m} imports {d}" for m, deps in edges.items() if m.startswith("splitsync.check")
                 for d in deps if not d.startswith("splitsync.check"))
    assert not out, out
    users = sorted(m for m, deps in edges.items() if not m.startswith("splitsync.check")
                   and any(d.startswith("splitsync.check") for d in deps))
    assert users == ["splitsync.commands.check"], users


def test_no_shipped_module_imports_the_test_helpers() -> None:
    users = sorted(m for m, deps in graph().items() if "splitsync.testing" in deps)
    assert users == [], users


def test_init_names_no_observer() -> None:
    """``init`` attaches observers through :mod:`splitsync.observers` alone."""
    deps = graph()["splitsync.api"]
    assert not any(d.startswith("splitsync.observers.") for d in deps), sorted(deps)


def test_rooms_stay_small() -> None:
    """One room per concern: no module over 400 lines, no class over 350, and at most
    MAX_CKPT_MODULES checkpoint modules on the online path (the offline readers live in
    ckpt/offline/). Smells to look at, not budgets to meet by splitting mid-concern."""
    long_modules, long_classes = [], []
    for mod, path in MODULES.items():
        text = path.read_text()
        if text.count("\n") > 400:
            long_modules.append(f"{mod}: {text.count(chr(10))} lines")
        for node in ast.walk(_parsed(path)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 350:
                long_classes.append(f"{mod}.{node.name}: {node.end_lineno - node.lineno + 1}")
    assert not long_modules, long_modules
    assert not long_classes, long_classes
    online = sorted(p.name for p in (ROOT / "ckpt").glob("*.py"))
    assert len(online) <= MAX_CKPT_MODULES, online


# The wrapper classes of torch's data-parallel strategies: only strategies/ may test for them
WRAPPER_TYPES = ("DistributedDataParallel", "FSDPModule", "FullyShardedDataParallel",
                 "DataParallel", "ReplicateModule")


def _wrapper_checks(tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("isinstance", "issubclass") and len(node.args) == 2:
            named = {n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", "")
                     for n in ast.walk(node.args[1])}
            found += [f"line {node.lineno}: {w}" for w in WRAPPER_TYPES if w in named]
    return found


def test_only_strategies_check_a_wrapper_type() -> None:
    """What differs by strategy lives in strategies/: no other module asks whether a model is
    wrapped by DDP or FSDP (it asks its strategy, ``strategies.for_model``)."""
    bad = [f"{mod} {hit}" for mod, path in MODULES.items()
           if not mod.startswith("splitsync.strategies")
           for hit in _wrapper_checks(ast.parse(path.read_text()))]
    assert not bad, bad
    sample = ast.parse("isinstance(m, (nn.Linear, FSDPModule))\nisinstance(m, nn.Linear)")
    assert _wrapper_checks(sample) == ["line 1: FSDPModule"]  # the check sees tuples of types
