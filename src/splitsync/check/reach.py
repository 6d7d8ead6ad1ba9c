"""Which functions of a project run on every rank: a call graph by name, built without
running anything, that follows only the calls made outside a rank-0 check.

A ``print`` inside a helper is per-rank output only if training reaches the helper on every
rank. The stylegan trainers call ``misc.print_module_summary(...)`` under ``if rank == 0:``,
yolov7's model-profiling helpers are never called by training, build-nanogpt's
``from_pretrained`` is never called at all: their output is not repeated per rank.

The graph is by name (``misc.summary(...)`` reaches every function called ``summary``), so
it errs towards "reached". Functions are reached from the code that runs on import (module
and class bodies), from functions handed to another call (``mp.spawn(main_worker, ...)``),
and by being decorated (a decorator may register the function with a framework), a dunder
or ``forward`` (called implicitly).
"""

from __future__ import annotations

import ast
from bisect import bisect_right
from collections.abc import Iterable, Mapping

from splitsync.check.facts import Facts, last_name
from splitsync.check.flow import nonmain_test, rank0_flags, rank0_test

__all__ = ["call_graph", "references", "reached", "runs_everywhere"]

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
#: Decorators that only change how a function is called, not who calls it.
_PLAIN_DECORATORS = frozenset({"staticmethod", "classmethod", "property", "cached_property",
                               "abstractmethod", "no_grad", "inference_mode", "wraps",
                               "lru_cache", "cache", "setter", "getter", "overload"})
#: Packages that never call into the project: `torch.load(...)` is no call of the project's
#: own `load`, and does not make it reached.
_FOREIGN = frozenset({
    "torch", "numpy", "os", "sys", "math", "json", "time", "shutil", "logging", "re",
    "random", "pickle", "subprocess", "argparse", "collections", "itertools", "functools",
    "glob", "datetime", "copy", "pathlib", "io", "warnings", "typing", "tqdm", "yaml", "PIL",
    "cv2", "wandb", "transformers", "accelerate", "lightning", "pytorch_lightning",
    "torchvision", "einops", "timm", "deepspeed", "safetensors", "huggingface_hub",
    "datasets", "tensorboard", "tensorboardX", "scipy", "pandas", "matplotlib", "h5py",
    "requests", "urllib", "threading", "multiprocessing", "contextlib", "dataclasses",
    "inspect", "traceback", "signal", "socket", "uuid", "hashlib", "tempfile", "zipfile",
    "tarfile", "csv", "struct", "platform", "psutil", "omegaconf", "hydra", "submitit",
})
_IMPLICIT = frozenset({"forward", "__call__", "__init__", "__post_init__", "__iter__",
                       "__next__", "__getitem__", "__len__", "__enter__", "__exit__", "run"})


def _exits(block: list[ast.stmt]) -> bool:
    end = block[-1] if block else None
    return isinstance(end, ast.Return | ast.Continue | ast.Break | ast.Raise) or (
        isinstance(end, ast.Expr) and last_name(end.value) in {"exit", "_exit", "quit"})


def _guarded_spans(facts: Facts) -> list[tuple[int, int]]:
    """Spans of node positions that run on rank 0 only: the body of ``if rank == 0:``, the
    ``else:`` of ``if rank != 0:``, and what follows ``if rank != 0: return`` in its block."""
    index = facts.tree_index
    position, ends, parents = index.position, index.ends, index.parents
    flags = rank0_flags(facts)
    spans: list[tuple[int, int]] = []

    def block(stmts: list[ast.stmt]) -> None:
        if stmts:
            spans.append((position[stmts[0]], ends[position[stmts[-1]]]))

    for node in index.of(ast.If):
        test = node.test  # type: ignore[attr-defined]
        if rank0_test(test, flags):
            block(node.body)  # type: ignore[attr-defined]
        elif nonmain_test(test, flags):
            block(node.orelse)  # type: ignore[attr-defined]
            if _exits(node.body):  # type: ignore[attr-defined]
                holder = parents.get(node)
                for name in ("body", "orelse", "finalbody"):
                    stmts = getattr(holder, name, None)
                    if isinstance(stmts, list) and node in stmts:
                        block(stmts[stmts.index(node) + 1:])
    return sorted(spans)


def _roots(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    if fn.name in _IMPLICIT or (fn.name.startswith("__") and fn.name.endswith("__")):
        return True
    return any(last_name(d) not in _PLAIN_DECORATORS for d in fn.decorator_list)


def _callable_from_outside(facts: Facts) -> frozenset[str]:
    """Functions code outside the project may call: the module-level functions of every
    file (a launcher imports ``main`` by name), and the public methods of a library module
    (a user calls ``trainer.load()``). A method of a script nothing calls is dead code."""
    found = {s.name for s in facts.tree.body if isinstance(s, _FUNCTIONS)}
    if not facts.is_script:
        for cls in facts.tree.body:
            if isinstance(cls, ast.ClassDef):
                found.update(s.name for s in cls.body
                             if isinstance(s, _FUNCTIONS) and not s.name.startswith("_"))
    return frozenset(found)


def _foreign(facts: Facts, expr: ast.AST) -> bool:
    """Is ``expr`` an attribute of a package that never calls the project (``torch.load``)?"""
    while isinstance(expr, ast.Attribute | ast.Call):
        expr = expr.value if isinstance(expr, ast.Attribute) else expr.func
    if not isinstance(expr, ast.Name) or expr.id not in facts.aliases:
        return False
    return facts.aliases[expr.id].split(".")[0] in _FOREIGN


def references(facts: Facts) -> frozenset[str]:
    """Every name this file mentions that may refer to a function of the project (names,
    and attributes of anything but a foreign package)."""
    found = {n.id for n in facts.of(ast.Name)}  # type: ignore[attr-defined]
    found.update(n.attr for n in facts.of(ast.Attribute)  # type: ignore[attr-defined]
                 if not _foreign(facts, n.value))  # type: ignore[attr-defined]
    return frozenset(found)


def call_graph(facts: Facts) -> tuple[frozenset[str], dict[str, frozenset[str]], frozenset[str]]:
    """What this file calls on every rank: the names called (or handed to a call) by code
    that runs on import, with the functions that are roots; per function name, the names
    its body calls outside a rank-0 check; and the functions outside code may call (roots
    when nothing in the project refers to them)."""
    index = facts.tree_index
    position, ends = index.position, index.ends
    functions = index.of(*_FUNCTIONS)
    starts = [position[f] for f in functions]
    spans = _guarded_spans(facts)
    span_starts = [s for s, _ in spans]
    reach_end: list[int] = []  # the furthest end of the spans starting up to each one
    for _, end in spans:
        reach_end.append(max(end, reach_end[-1]) if reach_end else end)
    entry: set[str] = {f.name for f in functions if _roots(f)}  # type: ignore[arg-type]
    edges: dict[str, set[str]] = {}
    for call, _ in facts.calls:
        at = position.get(call)
        if at is None:
            continue
        i = bisect_right(span_starts, at)
        if i and reach_end[i - 1] > at:
            continue  # inside a span that runs on rank 0 only
        names = set() if _foreign(facts, call.func) else {last_name(call)}
        names.update(last_name(a) for a in (*call.args, *(k.value for k in call.keywords))
                     if isinstance(a, ast.Name | ast.Attribute))
        names.discard(None)
        j = bisect_right(starts, at) - 1
        while j >= 0 and ends[starts[j]] <= at:
            j -= 1  # the nearest function that contains the call
        if j < 0:
            entry.update(names)  # type: ignore[arg-type]
        else:
            edges.setdefault(functions[j].name, set()).update(names)  # type: ignore[attr-defined,arg-type]
    return (frozenset(entry), {k: frozenset(v) for k, v in edges.items()},
            _callable_from_outside(facts))


def reached(entry: Iterable[str], edges: Mapping[str, Iterable[str]],
            outside: Iterable[str] = (), mentioned: frozenset[str] = frozenset()
            ) -> frozenset[str]:
    """Every name reached from ``entry`` through ``edges``; the ``outside`` functions that
    no code of the project ``mentioned`` are entries too (called from outside)."""
    seen = set(entry) | {name for name in outside if name not in mentioned}
    todo = list(seen)
    while todo:
        for name in edges.get(todo.pop(), ()):
            if name not in seen:
                seen.add(name)
                todo.append(name)
    return frozenset(seen)


def runs_everywhere(facts: Facts, node: ast.AST) -> bool:
    """Does the project reach the function holding ``node`` on every rank (module-level code
    always runs)? Each enclosing function must be reached."""
    reach = facts.project.reach
    if reach is None:
        return True  # no project graph: assume it runs
    return all(p.name in reach for p in facts.ancestors(node) if isinstance(p, _FUNCTIONS))
