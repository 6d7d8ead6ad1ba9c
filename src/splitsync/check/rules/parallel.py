"""Process groups and launching: DataParallel (SS201), DDP without a process group (SS202),
a training function nothing runs (SS203), a backend pinned to NCCL (SS204), and a model left
unwrapped on one path of a distributed run (SS205)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from splitsync.check.availability import availability_guarded
from splitsync.check.evidence import calls_unseen, cuda_only_reason, test_or_benchmark
from splitsync.check.facts import SETUP_HELPER, Facts, dotted, last_name
from splitsync.check.flow import is_rank_like
from splitsync.check.model import Hit, Rule
from splitsync.check.rules.common import overridable_default

__all__ = ["RULES"]

#: Names of a helper that may create the process group (read only when it could not be).
_SETS_UP = re.compile(r"init|setup|dist|launch|group|world|ddp", re.I)

_TRAINS = frozenset({"backward", "DistributedDataParallel", "init_process_group", "fully_shard",
                     "FullyShardedDataParallel"})


def _target(facts: Facts, call: ast.Call) -> str:
    parent = facts.parents.get(call)
    if isinstance(parent, ast.Assign):
        return f"`{facts.text(parent, 200)}`"
    return f"`{facts.text(call, 200)}`"


def data_parallel(facts: Facts) -> Iterator[Hit]:
    """SS201: ``torch.nn.DataParallel``."""
    for call in facts.torch_calls("DataParallel"):
        yield Hit(call, f"{_target(facts, call)} uses torch.nn.DataParallel: one Python process "
                  "drives every GPU from threads, so the GIL, a fresh model copy to each GPU on "
                  "every forward and outputs gathered on GPU 0 make it slower than "
                  "DistributedDataParallel even on one machine, and it cannot span machines "
                  "(PyTorch itself recommends DDP).",
                  "run one process per GPU (`torchrun --nproc_per_node=N train.py`) and wrap with "
                  "`DistributedDataParallel(model, device_ids=[local_rank])`; in splitsync, "
                  "`model = run.model(model)` launched by `splitsync run -n N train.py`.")


_STATE_OBJECTS = frozenset({"PartialState", "AcceleratorState", "Accelerator"})


def _initialisers(facts: Facts) -> list[ast.Call]:
    found = facts.torch_calls("init_process_group") + facts.init_calls()
    # Accelerate's state objects create the process group when they are built
    found += [c for c in facts.named_calls(*_STATE_OBJECTS)
              if (facts.resolve(c.func) or "").startswith(("accelerate", last_name(c) or "-"))]
    found += [c for c, full in facts.calls if SETUP_HELPER.search(full.rsplit(".", 1)[-1])
              and full.rsplit(".", 1)[-1] != "init_process_group"]
    # `from utils import setup` may well create the group: give imported set-up helpers the
    # benefit of the doubt rather than report an error we cannot prove
    found += [c for c, full in facts.calls if isinstance(c.func, ast.Name)
              and c.func.id in facts.aliases and not full.startswith("torch")
              and c.func.id.lower().startswith(("setup", "init"))]
    return found


def _passed_to_launcher(facts: Facts, call: ast.AST) -> bool:
    """Is the function holding ``call`` handed to another call (``launch(main, ...)``,
    ``mp.spawn(main, ...)``), which then runs it in processes it set up?"""
    scope = facts.scope(call)
    if not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    return any(any(isinstance(a, ast.Name) and a.id == scope.name
                   for a in (*c.args, *(k.value for k in c.keywords)))
               for c, _ in facts.calls)


def ddp_without_init(facts: Facts) -> Iterator[Hit]:
    """SS202: DDP used but no ``init_process_group`` (or ``splitsync.init``) in the script."""
    if not facts.is_script:
        return  # a library wraps models for scripts that set up the group themselves
    if facts.project.framework is not None:
        return  # Accelerator() / Fabric() create the process group themselves
    inits = _initialisers(facts)
    for call in facts.torch_calls("DistributedDataParallel"):
        if not inits and "init_process_group" in facts.project.called:
            continue  # a helper module of the project creates the group
        if not inits and _passed_to_launcher(facts, call):
            continue  # `launch(main, ...)`: the launcher creates the group, then calls main
        if not inits and calls_unseen(facts, before=call, hint=_SETS_UP):
            continue  # a module that could not be read may create the group (SS003 lists it)
        if not inits:
            yield Hit(call, f"{_target(facts, call)} wraps the model in DistributedDataParallel "
                      "but the script never calls `torch.distributed.init_process_group()` (nor "
                      "`splitsync.init()`): DDP raises \"Default process group has not been "
                      "initialized\".",
                      "call `dist.init_process_group()` once per process before wrapping (under "
                      "torchrun it reads RANK and WORLD_SIZE from the environment), or use "
                      "`run = splitsync.init()` and `model = run.model(model)`.")
            continue
        scope = facts.scope(call)
        same = [c for c in inits if facts.scope(c) is scope]
        if same and all(c.lineno > call.lineno for c in same):
            first = min(c.lineno for c in same)
            yield Hit(call, f"{_target(facts, call)} wraps the model in DistributedDataParallel "
                      f"before the process group exists (it is initialised later, at line "
                      f"{first}): DDP raises \"Default process group has not been initialized\".",
                      f"move the process-group initialisation (line {first}) above line "
                      f"{call.lineno}.")


def _only_prints(block: ast.If) -> str:
    calls = [n for n in ast.walk(block) if isinstance(n, ast.Call)]
    if calls and all(last_name(c) in {"print", "format"} for c in calls):
        return " (it only prints a message)"
    return ""


def _signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    return f"{fn.name}({', '.join(a.arg for a in fn.args.args)})"


def training_never_run(facts: Facts) -> Iterator[Hit]:
    """SS203: a module-level training function that nothing calls, spawns or exports."""
    if not facts.is_script:
        return
    exported = "__all__" in facts.loaded_names or any(
        isinstance(s, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in s.targets)
        for s in facts.tree.body)
    main = facts.main_block()
    if main is None:
        return  # a module without a `__main__` block is imported: its importer runs it
    for name, fn in facts.functions.items():
        if fn.decorator_list or name in facts.loaded_names or exported:
            continue
        marks = {last_name(c) for c in ast.walk(fn) if isinstance(c, ast.Call)}
        if not marks & _TRAINS:
            continue
        where = (f"the `__main__` block (line {main.lineno}) never calls it{_only_prints(main)}"
                 if main is not None else "no module-level code calls it")
        args = [a.arg for a in fn.args.args]
        rest = ", ".join(a for a in args[1:]) if args and "rank" in args[0] else None
        spawn = (f"`torch.multiprocessing.spawn({name}, args=({rest},), nprocs=world_size)`"
                 if rest else f"`torch.multiprocessing.spawn({name}, nprocs=world_size)`")
        call = (f"`{name}(int(os.environ[\"RANK\"]), int(os.environ[\"WORLD_SIZE\"]))`"
                if args[:2] == ["rank", "world_size"] else f"`{name}(...)`")
        yield Hit(fn, f"`{_signature(fn)}` (line {fn.lineno}) is the training function but "
                  f"nothing calls or spawns it: {where}, so running this script - under "
                  "torchrun or not - trains nothing.",
                  f"call it from the `__main__` block with the launcher's values, {call}, or "
                  f"start the processes yourself with {spawn}.")


def _string_value(facts: Facts, expr: ast.AST, scope: ast.AST) -> tuple[str, ast.AST] | None:
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value, expr
    if isinstance(expr, ast.Attribute) and expr.attr in {"NCCL", "GLOO"}:
        return expr.attr.lower(), expr
    if isinstance(expr, ast.Attribute) and (name := dotted(expr)) is not None:
        # `args.dist_backend = 'nccl'` then `init_process_group(backend=args.dist_backend)`
        values = [n.value for n in facts.walk_scope(scope) if isinstance(n, ast.Assign)
                  and any(dotted(t) == name for t in n.targets)]
        if len(values) == 1 and isinstance(values[0], ast.Constant):
            return _string_value(facts, values[0], scope)
        return None
    if isinstance(expr, ast.Name):
        for where in (scope, facts.tree):
            values = [n.value for n in facts.walk_scope(where) if isinstance(n, ast.Assign)
                      and any(isinstance(t, ast.Name) and t.id == expr.id for t in n.targets)]
            if len(values) == 1:
                return _string_value(facts, values[0], where)
            if values:
                return None
    return None


def nccl_hard_coded(facts: Facts) -> Iterator[Hit]:
    """SS204: ``init_process_group("nccl")`` with no CPU fallback."""
    if cuda_only_reason(facts):
        return  # the file imports CUDA-only kernels: it needs NVIDIA GPUs whatever the backend
    for call in facts.torch_calls("init_process_group"):
        if test_or_benchmark(facts, call):
            continue  # a GPU benchmark or test needs NCCL on purpose
        arg = call.args[0] if call.args else next(
            (k.value for k in call.keywords if k.arg == "backend"), None)
        how = "first positional argument `backend`" if call.args else "`backend=`"
        found = _string_value(facts, arg, facts.scope(call)) if arg is not None else None
        if not found or found[0].lower() != "nccl":
            continue
        if availability_guarded(facts, found[1]) or availability_guarded(facts, call):
            continue
        via = "" if found[1] is arg else f" (set at line {found[1].lineno})"
        holder = facts.parents.get(found[1])
        if holder is not None and overridable_default(facts, holder):
            # nanoGPT's `backend = 'nccl'` before `exec(open('configurator.py').read())`
            yield Hit(holder, f"`{facts.text(holder)}` is an overridable default (the "
                      "configuration executed after it can replace it), but as written a run "
                      "without arguments needs NCCL and CUDA GPUs.",
                      "default to what is available: `backend = \"nccl\" if "
                      "torch.cuda.is_available() else \"gloo\"`.", severity="info")
            continue
        if isinstance(arg, ast.Attribute) and isinstance(holder, ast.Assign):
            yield Hit(holder, f"`{facts.text(holder)}` hard-codes the process-group backend "
                      f"through an attribute that `{facts.text(call, 120)}` (line {call.lineno}) "
                      "reads: NCCL needs CUDA GPUs, so on a machine without them this raises.",
                      "choose it from the hardware: `args.dist_backend = \"nccl\" if "
                      "torch.cuda.is_available() else \"gloo\"` (splitsync.init() picks it).")
            continue
        yield Hit(call, f"`{facts.text(call, 200)}` hard-codes the backend to \"nccl\" in its {how}"
                  f"{via}: NCCL needs CUDA GPUs, so on a machine without them (a laptop, CPU CI) "
                  "this line raises.",
                  "choose it from the hardware, `backend=\"nccl\" if torch.cuda.is_available() "
                  "else \"gloo\"`, or leave it out (PyTorch then uses gloo for CPU tensors and "
                  "nccl for CUDA tensors); splitsync.init() picks it for you.")


_SETUP_RULES = (
    Rule("SS201", "data-parallel", "warning", "torch.nn.DataParallel used (prefer DDP)",
         "DataParallel is single-process and multi-threaded: it is limited by the GIL, copies "
         "the model to every GPU on each forward and gathers outputs on GPU 0, so one device "
         "does extra work and memory; DDP runs one process per device and overlaps gradient "
         "all-reduce with backward. Known false positives: none for correctness (DataParallel "
         "works); quick single-machine experiments may accept its cost.", data_parallel),
    Rule("SS202", "ddp-without-init", "error",
         "DistributedDataParallel used without init_process_group / splitsync.init",
         "DDP needs the default process group; the lesson lists forgetting "
         "dist.init_process_group among the common mistakes. An init_process_group call in a "
         "local module the script imports counts. Known false positives: the group created by "
         "code the checker cannot read (a third-party launcher or framework).",
         ddp_without_init),
    Rule("SS203", "training-never-run", "error",
         "a training function is defined but never called or spawned",
         "The lesson's DDP example defines train(rank, world_size) and its __main__ block only "
         "prints a hint, so the script does nothing when launched. Known false positives: a "
         "function run by a framework that imports the file by name (a job launcher reading "
         "the function from a config).", training_never_run),
    Rule("SS204", "nccl-hard-coded", "warning", "process-group backend hard-coded to \"nccl\"",
         "NCCL only runs on NVIDIA GPUs; a hard-coded backend makes the script fail on CPU "
         "machines, which is where most tests and first runs happen. Known false positives: "
         "scripts meant only for NVIDIA clusters (the finding is about portability). A "
         "module-level default that an exec'd configuration overrides (nanoGPT's "
         "`backend = 'nccl'` before `exec(open('configurator.py').read())`) is info.",
         nccl_hard_coded),
)


_AVAILABLE = ("cuda", "gpu", "is_available", "mps", "accel", "device_count", "xpu")
_WRAPPERS = frozenset({"DistributedDataParallel", "FullyShardedDataParallel", "fully_shard",
                       "prepare", "prepare_model"})


def _wraps_in(facts: Facts, block: list[ast.stmt]) -> bool:
    return any(isinstance(n, ast.Call) and (
        (facts.resolve(n.func) or "").rsplit(".", 1)[-1] in _WRAPPERS | {"model"})
        for stmt in block for n in ast.walk(stmt))


def _leaves(block: list[ast.stmt]) -> bool:
    calls = {last_name(n) for stmt in block for n in ast.walk(stmt) if isinstance(n, ast.Call)}
    return bool(block) and (isinstance(block[-1], ast.Return | ast.Raise)
                            or bool(calls & {"exit", "_exit", "quit"}))


def _ddp_needs_cuda(facts: Facts) -> bool:
    """Does the distributed set-up itself require CUDA (``if LOCAL_RANK != -1:
    torch.cuda.set_device(LOCAL_RANK)``, an assert on the GPU count)? Then a CPU path is only
    ever taken at world size 1."""
    for call, full in facts.calls:
        if full == "torch.cuda.set_device" and not availability_guarded(facts, call):
            tests = [p.test for p in facts.ancestors(call) if isinstance(p, ast.If)]
            if tests and any(any(is_rank_like(n) or "distributed" in (last_name(n) or "")
                                 for n in ast.walk(t)) for t in tests):
                return True
    return any("device_count" in ast.unparse(n.test) for n in facts.of(ast.Assert))  # type: ignore[attr-defined]


def unwrapped_path(facts: Facts) -> Iterator[Hit]:
    """SS205: a distributed script with a branch (the CPU path) where the model is not wrapped."""
    if not facts.in_distributed_run or _ddp_needs_cuda(facts):
        return
    inits = _initialisers(facts)
    reported: set[int] = set()
    for wrap in facts.torch_calls("DistributedDataParallel", "FullyShardedDataParallel",
                                  "fully_shard"):
        child: ast.AST = wrap
        for parent in facts.ancestors(wrap):
            if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module):
                break
            if isinstance(parent, ast.If) and id(parent) not in reported:
                here, other = ((parent.body, parent.orelse) if any(child is s for s in parent.body)
                               else (parent.orelse, parent.body))
                text = ast.unparse(parent.test).lower()
                if (any(w in text for w in _AVAILABLE) and not _wraps_in(facts, other)
                        and not _leaves(other) and not any(
                            any(i is n for s in here for n in ast.walk(s)) for i in inits)):
                    reported.add(id(parent))
                    path = "true" if other is parent.body else "false"
                    # reported where the user adds the wrap: the branch that lacks it
                    yield Hit(other[0] if other else wrap,
                              f"`{facts.text(wrap)}` (line {wrap.lineno}) wraps the model only "
                              "on one branch of "
                              f"`if {facts.text(parent.test, 80)}:` (line {parent.lineno}); when "
                              f"that test is {path} (the CPU path) the process group is still "
                              "set up but the model is never wrapped, so each rank trains its "
                              "own model and their gradients are never averaged.",
                              "wrap on every path of a distributed run: `DDP(model)` without "
                              "`device_ids` on the CPU (gloo), `DDP(model, device_ids=[i])` on "
                              "GPU i; or `model = run.model(model)` in splitsync, which picks "
                              "the right form.")
            child = parent


_PATH_RULE = (Rule(
    "SS205", "model-not-wrapped-on-a-path", "error",
    "a distributed script whose model is wrapped in DDP/FSDP on some paths only (e.g. not on "
    "the CPU path)",
    "When the wrap sits under a device-availability test (`if torch.cuda.is_available():`, an "
    "`elif` after a CPU branch) and the other branch neither wraps the model nor leaves, a "
    "run on that path initialises the process group but trains one unsynchronised model per "
    "rank. Known false positives: the other branch is unreachable in a distributed run for "
    "reasons the checker cannot see (an earlier check that refuses CPU distributed runs).",
    unwrapped_path))


RULES = (*_SETUP_RULES, _PATH_RULE)
