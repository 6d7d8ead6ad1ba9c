"""What the code shows about itself that keeps a rule quiet: evidence read from the AST.

Each function answers one question a rule would otherwise guess at: does this file need CUDA
anyway (it imports CUDA-only kernels)? Is this module a loss or activation without
parameters? Which functions launch the ranks, so their own lines run once in the parent? Is
logging limited to rank 0 by configuration made somewhere in the project?
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from functools import lru_cache
from pathlib import PurePath

from splitsync.check.facts import Facts, dotted, last_name
from splitsync.check.flow import is_rank_like, nonmain_test, rank0_test
from splitsync.check.ranks import rank_in

__all__ = ["world_size_one", "cuda_only_reason", "test_or_benchmark", "parameterless", "launcher_functions", "logging_rank_limited", "forced_prints",
           "logging_configured", "framework_of", "unseen_source", "calls_unseen"]

#: Imports that need an NVIDIA GPU whatever the script does (kernels, GPU-only engines).
_CUDA_ONLY = ("triton", "flash_attn", "vllm", "transformer_engine", "apex.contrib",
              "xformers.ops", "torch.utils.cpp_extension", "cupy", "pynvml", "nvidia.dali")
#: Names whose import shows GPU kernels compiled for the run: FlexAttention's block masks
#: (the speedrun scripts compile block-sparse attention into Triton kernels for CUDA).
_CUDA_KERNEL_NAMES = frozenset({"torch.nn.attention.flex_attention.BlockMask",
                                "torch.nn.attention.flex_attention.create_block_mask"})
#: Test and benchmark code measures or checks the GPU on purpose: a function or a file
#: named so (`test_gradient_and_speed`, `compute_time_train`, `benchmark_indexing.py`).
_MEASURES_GPU = re.compile(r"^bench|benchmark|^compute_time|^time_|^profile", re.I)
_TEST_FILE = re.compile(r"^test_|_test$|benchmark", re.I)  # pytest's file names, benchmarks
_TEST_FUNCTION = re.compile(r"^test_", re.I)
_CUDA_EXTENSION = re.compile(r"(^|_)(cuda|cudnn|nccl)(_|$)|_cuda$", re.I)
#: torch.nn classes that hold no parameters or buffers: `.cuda()` on them does nothing.
_PARAMLESS = re.compile(r"(Loss|ReLU|GELU|SiLU|Sigmoid|Tanh|Softmax|LogSoftmax|Identity|"
                        r"Dropout|Flatten|Criterion|Similarity|Distance)$|^(build_)?(loss|criterion)", re.I)
_SPAWN_CALLS = frozenset({"spawn", "start_processes", "elastic_launch", "Popen", "check_call",
                          "launch_agent"})
#: Launcher calls that run a command line rather than a function of the script.
_COMMANDS = frozenset({"Popen", "check_call"})
_LEVEL_CALLS = frozenset({"setLevel", "basicConfig", "set_verbosity", "disable"})


def cuda_only_reason(facts: Facts) -> str | None:
    """The import that makes this file CUDA-only (``import triton``), if one does."""
    for full in facts.aliases.values():
        if full in _CUDA_KERNEL_NAMES:
            return "torch.nn.attention.flex_attention"
        for prefix in _CUDA_ONLY:
            if full == prefix or full.startswith(prefix + "."):
                return prefix
        head = full.split(".")[0]
        if head != "torch" and _CUDA_EXTENSION.search(head):
            return head  # a compiled CUDA extension (`import nccl_p2p_cuda`, `cudnn_gbn_lib`)
    return None


def test_or_benchmark(facts: Facts, node: ast.AST) -> bool:
    """Is ``node`` in test or benchmark code (a function named ``benchmark*``,
    ``compute_time_*``, ``test_*`` in a module of tests, or a file named
    ``test_*.py``, ``benchmark.py``), which runs on the GPU on purpose rather than training
    on it?"""
    if _TEST_FILE.search(PurePath(facts.path).stem):
        return True
    # `test_*` is a test in a module of tests (most of its functions are `test_*`), not
    # pycls' `test_epoch` beside a training loop
    top = [s.name for s in facts.tree.body if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)]
    tests = len(top) >= 3 and 2 * sum(bool(_TEST_FUNCTION.search(n)) for n in top) >= len(top)
    return any(isinstance(p, ast.FunctionDef | ast.AsyncFunctionDef) and bool(
        _MEASURES_GPU.search(p.name) or (tests and _TEST_FUNCTION.search(p.name)))
        for p in facts.ancestors(node))


def parameterless(facts: Facts, expr: ast.AST) -> bool:
    """Is ``expr`` (the receiver of ``.cuda()``) a module without parameters or buffers:
    ``nn.CrossEntropyLoss()``, ``build_loss_fun()``?"""
    if not isinstance(expr, ast.Call):
        return False
    name = last_name(expr) or ""
    return bool(_PARAMLESS.search(name)) and not expr.args


@lru_cache(maxsize=8)  # asked once per print; Facts compare by identity
def launcher_functions(facts: Facts, spawning: bool = False) -> frozenset[str]:
    """Functions that start the ranks (``mp.spawn(...)``, ``p.start()`` on a Process,
    ``subprocess.Popen``): their own lines run once, in the parent process. A start under a
    rank test is a rank's own helper process (open_clip's remote sync), not the launcher.
    ``spawning``: only those that start Python processes running a function of the script
    (``mp.spawn``, ``Process(...).start()``, ``elastic_launch``), not a command line."""
    found: set[str] = set()
    processes = {dotted(t) for n in facts.of(ast.Assign) if isinstance(n, ast.Assign)
                 and isinstance(n.value, ast.Call) and last_name(n.value) == "Process"
                 for t in n.targets}
    for call, full in facts.calls:
        name = last_name(call)
        commands = not spawning and (name in _COMMANDS or (
            full.startswith("subprocess.") and name == "run"))
        starts = name in _SPAWN_CALLS - _COMMANDS or commands or (
            name == "start" and isinstance(call.func, ast.Attribute)
            and (dotted(call.func.value) in processes or "proc" in (
                dotted(call.func.value) or "").lower() or dotted(call.func.value) == "p"))
        if not starts or _under_rank_test(facts, call):
            continue  # started by one rank (a sync helper under `if is_master(args):`)
        scope = facts.scope(call)
        if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
            found.add(scope.name)
    return frozenset(found)


def _under_rank_test(facts: Facts, node: ast.AST) -> bool:
    for parent in facts.ancestors(node):
        if isinstance(parent, ast.If | ast.IfExp) and (
                rank0_test(parent.test) or nonmain_test(parent.test)
                or rank_in(facts, parent.test)):
            return True
    return False


def _rank_level(facts: Facts) -> bool:
    """A level set per rank, or a handler only rank 0 gets (``NullHandler`` elsewhere)."""
    for call in facts.named_calls(*_LEVEL_CALLS, "NullHandler", "addHandler", "addFilter"):
        name = last_name(call)
        args = [*call.args, *(k.value for k in call.keywords)]
        if name in _LEVEL_CALLS and (any(rank_in(facts, a) or _rank_choice(a) for a in args)
                                     or _under_rank_test(facts, call)):
            return True  # `basicConfig(level=INFO if accelerator.is_main_process else ERROR)`
        if name == "addFilter" and (any(_rank_filter(facts, a) for a in args)
                                    or _under_rank_test(facts, call)):
            return True  # a filter that drops records off rank 0 (`rank0_only`)
        if name == "NullHandler" and _under_rank_test(facts, call):
            return True
        if name in {"addHandler", "basicConfig"} and _under_rank_test(facts, call):
            return True
    return False


def _rank_choice(expr: ast.AST) -> bool:
    """``INFO if is_main else ERROR``: a value chosen by a rank-0 test."""
    return isinstance(expr, ast.IfExp) and (rank0_test(expr.test) or nonmain_test(expr.test))


def _rank_filter(facts: Facts, expr: ast.AST, depth: int = 0) -> bool:
    """A logging filter that reads the rank: ``addFilter(rank0_only)`` where ``rank0_only``
    (a function or a ``logging.Filter`` subclass of this file) tests the rank, a lambda that
    does, or a filter named for rank 0."""
    if rank_in(facts, expr) or _rank_choice(expr):
        return True
    if isinstance(expr, ast.Name) and depth < 2:  # `filter = rank0_filter`, then addFilter(filter)
        values = [n.value for n in facts.of(ast.Assign) if any(  # type: ignore[attr-defined]
            isinstance(t, ast.Name) and t.id == expr.id for t in n.targets)]  # type: ignore[attr-defined]
        if any(_rank_filter(facts, v, depth + 1) for v in values):
            return True
    target = expr.func if isinstance(expr, ast.Call) else expr
    name = last_name(target) or ""
    if re.search(r"rank_?(0|zero)|main_?process|master", name, re.I):
        return True
    defined = [n for n in facts.of(ast.FunctionDef, ast.ClassDef)
               if n.name == name]  # type: ignore[attr-defined]
    return any(rank_in(facts, n) or any(
        isinstance(t, ast.If) and (rank0_test(t.test) or nonmain_test(t.test))
        for t in facts.inside(n, ast.If)) for n in defined)


def _rank_in_format(facts: Facts) -> bool:
    """A logging Formatter subclass or format string that shows the rank on every line."""
    for cls in facts.of(ast.ClassDef):
        if any("Formatter" in (last_name(b) or "") for b in cls.bases):  # type: ignore[attr-defined]
            if rank_in(facts, cls):
                return True
    for node in facts.of(ast.Constant):
        if isinstance(node.value, str) \
                and re.search(r"%\(rank\)|\{rank\}|\[rank", node.value, re.I):
            parent = facts.parents.get(node)
            if isinstance(parent, ast.Call | ast.keyword):
                return True
    return False


def logging_rank_limited(members: Iterable[Facts]) -> bool:
    """Does the project limit log output to rank 0, or label each record with its rank?"""
    return any(_rank_level(f) or _rank_in_format(f) for f in members)


def logging_configured(members: Iterable[Facts]) -> bool:
    """Does any module of the project make INFO records visible (``basicConfig``, a handler,
    ``setLevel``, ``dictConfig``)? Without it the root logger drops INFO."""
    names = {"basicConfig", "addHandler", "setLevel", "dictConfig", "fileConfig",
             "set_verbosity", "set_verbosity_info", "setup_logging", "init_logger",
             "setup_logger", "create_logger", "set_logging"}
    return any(not names.isdisjoint(f.call_names()) for f in members)


def framework_of(facts: Facts) -> str | None:
    """``"Fabric"`` or ``"Accelerator"`` when the script runs under that framework."""
    for call in facts.named_calls("Fabric", "Accelerator"):
        name, full = last_name(call), facts.resolve(call.func) or ""
        if full.startswith(("lightning", "accelerate")) or full == name:
            return name
    return None


_DISTRIBUTED_FLAG = re.compile(r"^(is_)?(distributed|ddp|multiprocessing_distributed|dist_on)$"
                               r"|^(enable|use)_(fsdp|ddp|distributed)$"
                               r"|^is_initialized$|^is_dist", re.I)


def _single_process_test(test: ast.AST) -> bool:
    """``local_rank == -1``, ``world_size == 1``, ``not args.distributed``: true only when
    the script runs as one process."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _distributed_test(test.operand)
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        value = right.value if isinstance(right, ast.Constant) else None
        if isinstance(right, ast.UnaryOp) and isinstance(right.operand, ast.Constant):
            value = -right.operand.value  # type: ignore[operator]
        name = (last_name(left) or "").lower()
        if isinstance(op, ast.Eq | ast.In):
            if "world" in name and value == 1:
                return True
            if is_rank_like(left) and value == -1:
                return True
        if isinstance(op, ast.LtE | ast.Lt) and "world" in name and value in (1, 2):
            return True
    return False


def _distributed_test(test: ast.AST) -> bool:
    """``args.distributed``, ``world_size > 1``, ``dist.is_initialized()``, ``rank != -1``."""
    if isinstance(test, ast.Name | ast.Attribute | ast.Call):
        return bool(_DISTRIBUTED_FLAG.search(last_name(test) or ""))
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        name = (last_name(left) or "").lower()
        value = right.value if isinstance(right, ast.Constant) else None
        if isinstance(right, ast.UnaryOp) and isinstance(right.operand, ast.Constant):
            value = -right.operand.value  # type: ignore[operator]
        if "world" in name and isinstance(op, ast.Gt) and value == 1:
            return True
        if is_rank_like(left) and isinstance(op, ast.NotEq) and value == -1:
            return True
    return False


def world_size_one(facts: Facts, node: ast.AST) -> bool:
    """Is ``node`` reached only when the script runs as one process: the ``else:`` of
    ``if args.distributed:``, a block that asserts ``local_rank == -1``, or a fallback that
    sets ``world_size = 1``?"""
    child = node
    for parent in facts.ancestors(node):
        if isinstance(parent, ast.If):
            if any(child is s for s in parent.orelse) and _distributed_test(parent.test):
                return True
            if any(child is s for s in parent.body) and _single_process_test(parent.test):
                return True
        for name in ("body", "orelse", "handlers", "finalbody"):
            block = getattr(parent, name, None)
            if isinstance(block, list) and any(child is s for s in block):
                for stmt in block:
                    if isinstance(stmt, ast.Assert) and _single_process_test(stmt.test):
                        return True
                    if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Tuple | ast.Constant):
                        targets = [t for tg in stmt.targets for t in ast.walk(tg)
                                   if isinstance(t, ast.Name)]
                        values = stmt.value.elts if isinstance(stmt.value, ast.Tuple) else [
                            stmt.value]
                        if any("world" in t.id.lower() and isinstance(v, ast.Constant)
                               and v.value == 1 for t, v in zip(targets, values, strict=False)):
                            return True
        if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module):
            return False
        child = parent
    return False


def forced_prints(facts: Facts) -> bool:
    """Does the file print with ``force=`` (builtins.print has no such argument): print is
    replaced by a rank-0 one that prints everywhere when forced (DeiT's
    ``setup_for_distributed``), even if the module that installs it was not read."""
    return any(full == "print" and any(k.arg == "force" for k in call.keywords)
               for call, full in facts.calls)


def _binds_unseen(facts: Facts, expr: ast.AST) -> bool:
    names = facts.project.unseen_names
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(expr))


def unseen_source(facts: Facts, expr: ast.AST | None) -> bool:
    """Does ``expr`` come from a module the checker could not read: it uses a name an unseen
    import binds (``make_loader()`` from ``helpers``), directly or through a name assigned
    from one in this file (``loader = make_loader(); for x in loader``)?"""
    if expr is None or not facts.project.unseen_names:
        return False
    if _binds_unseen(facts, expr):
        return True
    used = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}
    used |= {n.attr for n in ast.walk(expr) if isinstance(n, ast.Attribute)}
    return any(isinstance(a, ast.Assign) and _binds_unseen(facts, a.value)  # type: ignore[attr-defined]
               and any((dotted(x) or "").rsplit(".", 1)[-1] in used
                       for t in a.targets for x in ast.walk(t))  # type: ignore[attr-defined]
               for a in facts.of(ast.Assign))


def calls_unseen(facts: Facts, *names: str, before: ast.AST | None = None,
                 hint: re.Pattern[str] | None = None) -> bool:
    """Does the file call a function an unseen import binds (handing it one of ``names``, if
    given; ``before``: above that node; ``hint``: whose name says it may do the thing in
    question, ``init_seeds``): what that function does could not be read."""
    unseen = facts.project.unseen_names
    if not unseen:
        return False
    for call, _ in facts.calls:
        if before is not None and call.lineno >= getattr(before, "lineno", 0):
            continue
        if hint is not None and not hint.search(last_name(call) or ""):
            continue
        root = call.func
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and root.id in unseen and (not names or any(
                (dotted(a) or "") in names for a in (*call.args, *(k.value for k in call.keywords)))):
            return True
    return False
