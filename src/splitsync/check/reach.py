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

The launching process is not a rank: a function that starts the ranks (``mp.spawn``, a
``Process`` started, a launcher call), and a ``__main__`` block that does, run once in the
parent. What they call themselves is not reached through them; only the functions they hand
over (``mp.spawn(worker, ...)``, ``Process(target=train)``, ``partial(train, ...)``) are.
"""

from __future__ import annotations

import ast
from bisect import bisect_right
from collections.abc import Collection, Iterable, Mapping
from pathlib import PurePath

from splitsync.check.evidence import launcher_functions
from splitsync.check.facts import Facts, last_name
from splitsync.check.flow import nonmain_test, rank0_flags, rank0_test

__all__ = ["FOREIGN", "call_graph", "resolve", "reached", "runs_everywhere"]

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
#: Decorators that only change how a function is called, not who calls it.
_PLAIN_DECORATORS = frozenset({"staticmethod", "classmethod", "property", "cached_property",
                               "abstractmethod", "no_grad", "inference_mode", "wraps",
                               "lru_cache", "cache", "setter", "getter", "overload"})
#: Packages that never call into the project: `torch.load(...)` is no call of the project's
#: own `load`, and does not make it reached.
FOREIGN = frozenset({
    "torch", "numpy", "os", "sys", "math", "json", "time", "shutil", "logging", "re",
    "random", "pickle", "subprocess", "argparse", "collections", "itertools", "functools",
    "glob", "datetime", "copy", "pathlib", "io", "warnings", "typing", "tqdm", "yaml", "PIL",
    "cv2", "wandb", "transformers", "accelerate", "lightning", "pytorch_lightning",
    "torchvision", "einops", "timm", "deepspeed", "safetensors", "huggingface_hub",
    "datasets", "tensorboard", "tensorboardX", "scipy", "pandas", "matplotlib", "h5py",
    "requests", "urllib", "threading", "multiprocessing", "contextlib", "dataclasses",
    "inspect", "traceback", "signal", "socket", "uuid", "hashlib", "tempfile", "zipfile",
    "tarfile", "csv", "struct", "platform", "psutil", "omegaconf", "hydra", "submitit",
    "torchaudio", "torchtext", "torchmetrics", "apex", "fairscale", "mmcv", "mmengine",
    "detectron2", "sklearn", "skimage", "kornia", "lpips", "clip", "open_clip", "peft",
    "bitsandbytes", "neptune", "mlflow", "comet_ml", "lightning_fabric", "ray", "horovod",
    "mpi4py", "xformers", "flash_attn", "triton", "sentencepiece", "tokenizers", "tiktoken",
    "pycocotools", "albumentations", "imageio", "soundfile", "librosa", "fire", "tyro",
    "jsonargparse", "rich", "click", "absl", "ml_collections", "jax", "tensorflow", "gym",
    "gymnasium", "dgl", "torch_geometric", "networkx", "numba", "cupy", "pynvml", "evaluate",
    "nltk", "spacy", "visdom", "termcolor", "loguru", "setproctitle", "decouple", "friendlywords", "typing_extensions", "packaging", "filelock", "seaborn",
    "torchdata", "webdataset", "opt_einsum", "simple_parsing", "dotenv", "jsonlines", "msgpack",
    "lmdb", "zarr", "pyarrow", "polars", "orjson", "ujson", "regex", "ftfy", "braceexpand",
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


def _implicit(name: str) -> bool:
    """Methods Python or torch call without naming them (``__init__``, ``forward``)."""
    return name in _IMPLICIT or (name.startswith("__") and name.endswith("__"))


def _key(facts: Facts, fn: ast.AST) -> str:
    """A function's name in the graph: ``name`` for a function, ``.name`` for a method (a
    method is only ever called through an attribute: ``model.train()`` is no call of a
    module-level ``train``), ``Class.name`` for a method called implicitly, which runs
    when its class is used (``Net(...)`` reaches ``Net.__init__`` and ``Net.forward``)."""
    owner = facts.parents.get(fn)
    name = fn.name  # type: ignore[attr-defined]
    if not isinstance(owner, ast.ClassDef):
        return name
    return f"{owner.name}.{name}" if _implicit(name) else f".{name}"


def _refs(facts: Facts, expr: ast.AST) -> tuple[str, ...]:
    """The graph names ``expr`` may refer to: ``f`` for a name of this file, ``mod:f`` for a
    name imported from module ``mod`` or an attribute of it (``misc.summary`` with ``from
    utils import misc``: resolved against the project's files by :func:`resolve`), ``.m``
    for an attribute (a method); nothing for a foreign package (``torch.load``)."""
    if isinstance(expr, ast.Name):
        full = facts.aliases.get(expr.id)
        if full is None or "." not in full:
            return (expr.id,)
        if full.split(".")[0] in FOREIGN:
            return ()
        module, name = full.rsplit(".", 1)
        return (f"{module.rsplit('.', 1)[-1]}:{name}",)
    if not isinstance(expr, ast.Attribute) or _foreign(facts, expr.value):
        return ()
    if isinstance(expr.value, ast.Name) and expr.value.id in facts.aliases:
        module = facts.aliases[expr.value.id].rsplit(".", 1)[-1]
        return (f"{module}:{expr.attr}", f".{expr.attr}")
    return (f".{expr.attr}",)


def resolve(names: Iterable[str], stems: Collection[str]) -> set[str]:
    """Graph names with ``mod:f`` turned into ``f`` when ``mod`` is a file of the project,
    and dropped otherwise (a function of a package the checker does not read)."""
    out = set()
    for name in names:
        if ":" not in name:
            out.add(name)
            continue
        module, _, rest = name.partition(":")
        if module in stems:
            out.add(rest)
    return out


def _params(fn: ast.AST) -> frozenset[str]:
    """The parameters of ``fn``: a name passed on is a value, not a function of the file."""
    args = fn.args  # type: ignore[attr-defined]
    return frozenset(a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs))


def _roots(facts: Facts, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A decorator may hand the function to a framework that calls it (``@app.route``,
    ``@trainer.on(...)``): such functions are entries."""
    return any(last_name(d) not in _PLAIN_DECORATORS for d in fn.decorator_list)


def _callable_from_outside(facts: Facts) -> tuple[frozenset[str], frozenset[str]]:
    """Functions code outside the project may call: the module-level functions of every
    file (a launcher imports ``main`` by name); and a library module's API, its public
    classes and methods (a user calls ``trainer.load()``), which count only for a project
    without a script (in an application, a method nothing calls is dead code)."""
    functions = {s.name for s in facts.tree.body if isinstance(s, _FUNCTIONS)}
    api: set[str] = set()
    if not facts.is_script:
        for cls in facts.tree.body:
            if isinstance(cls, ast.ClassDef) and not cls.name.startswith("_"):
                api.add(cls.name)
                api.update(f".{s.name}" for s in cls.body
                           if isinstance(s, _FUNCTIONS) and not s.name.startswith("_"))
    return frozenset(functions), frozenset(api)


def _foreign(facts: Facts, expr: ast.AST) -> bool:
    """Is ``expr`` an attribute of a package that never calls the project (``torch.load``)?"""
    while isinstance(expr, ast.Attribute | ast.Call):
        expr = expr.value if isinstance(expr, ast.Attribute) else expr.func
    if not isinstance(expr, ast.Name) or expr.id not in facts.aliases:
        return False
    return facts.aliases[expr.id].split(".")[0] in FOREIGN


def call_graph(facts: Facts) -> tuple[frozenset[str], frozenset[str], dict[str, frozenset[str]],
                                      tuple[frozenset[str], frozenset[str]], frozenset[str]]:
    """What this file calls on every rank: the names called (or handed to a call) by code
    that runs on import, with the functions that are roots; the names its ``__main__``
    block calls (it runs only when the file is the script); per function, the names its
    body calls outside a rank-0 check; and the functions outside code may call (roots when
    nothing in the project refers to them); and every name the file refers to in a call or
    an argument (so a function used anywhere is no entry from outside). Names are graph
    names (:func:`_key`)."""
    index = facts.tree_index
    position, ends = index.position, index.ends
    functions = index.of(*_FUNCTIONS)
    starts = [position[f] for f in functions]
    keys = [_key(facts, f) for f in functions]
    spans = _guarded_spans(facts)
    span_starts = [s for s, _ in spans]
    reach_end: list[int] = []  # the furthest end of the spans starting up to each one
    for _, end in spans:
        reach_end.append(max(end, reach_end[-1]) if reach_end else end)
    entry: set[str] = {k for f, k in zip(functions, keys, strict=True)
                       if _roots(facts, f)}  # type: ignore[arg-type]
    main_entry: set[str] = set()
    block = facts.main_block()
    main_span = (position[block], ends[position[block]]) if block is not None else (-1, -1)
    edges: dict[str, set[str]] = {}
    params: dict[int, frozenset[str]] = {}
    for cls in facts.of(ast.ClassDef):  # using a class runs its implicit methods
        edges[cls.name] = {f"{cls.name}.{s.name}" for s in cls.body  # type: ignore[attr-defined]
                           if isinstance(s, _FUNCTIONS) and _implicit(s.name)}
        for base in cls.bases:  # type: ignore[attr-defined]
            edges[cls.name].update(_refs(facts, base))  # and its bases' (`super().__init__()`)
    mentioned: set[str] = {n.id for n in facts.of(ast.Name)}  # type: ignore[attr-defined]
    launchers = launcher_functions(facts, spawning=True)
    spawning_main = block is not None and facts.uses_spawn
    for call, _ in facts.calls:
        at = position.get(call)
        if at is None:
            continue
        j = bisect_right(starts, at) - 1
        while j >= 0 and ends[starts[j]] <= at:
            j -= 1  # the nearest function that contains the call
        # in the launching process only what is handed over runs on the ranks
        once = (getattr(functions[j], "name", None) in launchers if j >= 0
                else spawning_main and main_span[0] <= at < main_span[1])
        names = (set() if once and last_name(call) not in launchers
                 else set(_refs(facts, call.func)))
        args = call.args + [k.value for k in call.keywords] if call.keywords else call.args
        for arg in args:
            if isinstance(arg, ast.Name):
                if j < 0 or arg.id not in (params.get(j) or params.setdefault(
                        j, _params(functions[j]))):
                    names.update(_refs(facts, arg))  # `mp.spawn(main_worker, ...)`
            elif isinstance(arg, ast.Attribute):
                names.update(_refs(facts, arg))
        mentioned.update(names)
        i = bisect_right(span_starts, at)
        if i and reach_end[i - 1] > at:
            continue  # inside a span that runs on rank 0 only: no edge
        if j < 0:
            (main_entry if main_span[0] <= at < main_span[1] else entry).update(names)
        else:
            edges.setdefault(keys[j], set()).update(names)
    for assign in index.of(ast.Assign):  # `fn = self.a if c else self.b`, called as `fn(...)`
        value = assign.value  # type: ignore[attr-defined]
        options = (value.body, value.orelse) if isinstance(value, ast.IfExp) else (value,)
        names = {n for o in options if isinstance(o, ast.Attribute) for n in _refs(facts, o)}
        if not names:
            continue
        mentioned.update(names)
        at = position[assign]
        i = bisect_right(span_starts, at)
        if i and reach_end[i - 1] > at:
            continue
        j = bisect_right(starts, at) - 1
        while j >= 0 and ends[starts[j]] <= at:
            j -= 1
        if j >= 0:
            edges.setdefault(keys[j], set()).update(names)
    return (frozenset(entry), frozenset(main_entry), {k: frozenset(v) for k, v in edges.items()},
            _callable_from_outside(facts), frozenset(mentioned))


def reached(entry: Iterable[str], edges: Mapping[str, Iterable[str]],
            outside: Iterable[str] = (), mentioned: Collection[str] = frozenset(),
            stems: Collection[str] | None = None) -> frozenset[str]:
    """Every name reached from ``entry`` through ``edges``; the ``outside`` functions that
    no code of the project ``mentioned`` are entries too (called from outside). With
    ``stems``, ``mod:f`` names are resolved on the way (only those reached are)."""
    seen = set(entry) | {name for name in outside if name not in mentioned}
    if stems is not None:
        seen = resolve(seen, stems)
    todo = list(seen)
    while todo:
        found = edges.get(todo.pop(), ())
        for name in (resolve(found, stems) if stems is not None else found):
            if name not in seen:
                seen.add(name)
                todo.append(name)
    return frozenset(seen)


def runs_everywhere(facts: Facts, node: ast.AST) -> bool:
    """Does the project reach the function holding ``node`` on every rank (module-level code
    always runs)? Each enclosing function must be reached, from the project's entries or
    from this file's own ``__main__`` block (this file may be the script that is run even
    when another module imports it)."""
    reach = facts.project.reach
    if reach is None:
        return True  # no project graph: assume it runs
    keys = [_key(facts, p) for p in facts.ancestors(node) if isinstance(p, _FUNCTIONS)]
    if all(k in reach for k in keys):
        return True
    memo = facts.tree_index.memo
    if "own_reach" not in memo or memo["own_reach"][0] is not facts.project:  # type: ignore[index]
        project = facts.project
        stems = {PurePath(f).stem for f in project.files}
        own = resolve(call_graph(facts)[1], stems) - reach
        memo["own_reach"] = (project, reached(own, project.edges, stems=stems) | reach
                             if own else reach)
    extended = memo["own_reach"][1]  # type: ignore[index]
    return all(k in extended for k in keys)
