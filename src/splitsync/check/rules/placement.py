"""Every rank on one GPU (SS106): a CUDA model wrapped in DDP without a device chosen per
process, or a ``--local_rank`` flag that only the old launcher passes. A GPU chosen from the
global rank modulo the device count where the launcher gives the local rank (SS107).

A process uses ``cuda:0`` until it is told otherwise (``torch.cuda.set_device(i)``,
``model.cuda(i)``, ``DDP(model, device_ids=[i])``). On the path that sets none of them every
process of a machine trains on the first GPU: out of memory, or N times slower.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from splitsync.check.facts import Facts, dotted, last_name
from splitsync.check.model import Hit, Rule

__all__ = ["RULES"]

_SETTERS = frozenset({"set_device", "set_device_index"})
_DEVICE_KWARGS = frozenset({"device_ids", "output_device", "device_id", "device_mesh"})
#: Variables holding the global rank, and the one each launcher sets for the local rank.
_GLOBAL_VARS = {"RANK": "LOCAL_RANK", "SLURM_PROCID": "SLURM_LOCALID",
                "OMPI_COMM_WORLD_RANK": "OMPI_COMM_WORLD_LOCAL_RANK",
                "PMI_RANK": "MPI_LOCALRANKID", "PMIX_RANK": "OMPI_COMM_WORLD_LOCAL_RANK"}
_LOCAL_VARS = frozenset({"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK",
                         "MPI_LOCALRANKID"})


def _sets_device(stmt: ast.stmt) -> bool:
    """A statement that picks this process's GPU unconditionally."""
    value = stmt.value if isinstance(stmt, ast.Expr | ast.Assign) else None
    return isinstance(value, ast.Call) and last_name(value) in _SETTERS


def _moved_to_default(facts: Facts, block: list[ast.stmt], before: ast.stmt,
                      model: str) -> ast.Call | None:
    """``model.cuda()`` (no index) earlier in ``block``: the model is on the default GPU."""
    for stmt in block[:block.index(before)]:
        for call in facts.inside(stmt, ast.Call):
            func = call.func  # type: ignore[attr-defined]
            if isinstance(func, ast.Attribute) and func.attr == "cuda" and not call.args \
                    and dotted(func.value) == model:  # type: ignore[attr-defined]
                return call  # type: ignore[return-value]
    return None


def _no_device(facts: Facts) -> Iterator[Hit]:
    """``model.cuda(); model = DDP(model)`` with no ``set_device`` on the path."""
    for wrap in facts.torch_calls("DistributedDataParallel"):
        if len(wrap.args) > 1 or any(k.arg in _DEVICE_KWARGS for k in wrap.keywords) \
                or not wrap.args or (model := dotted(wrap.args[0])) is None:
            continue
        stmt = facts.parents.get(wrap)
        holder = facts.parents.get(stmt) if stmt is not None else None
        block = next((b for n in ("body", "orelse") if isinstance(
            b := getattr(holder, n, None), list) and stmt in b), None)
        if block is None or (moved := _moved_to_default(facts, block, stmt, model)) is None:
            continue
        child: ast.AST = stmt  # type: ignore[assignment]
        chosen = False
        for parent in facts.ancestors(stmt):  # an unconditional set_device before, anywhere up
            for name in ("body", "orelse"):
                stmts = getattr(parent, name, None)
                if isinstance(stmts, list) and child in stmts:
                    chosen |= any(_sets_device(s) for s in stmts[:stmts.index(child)])
            if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module):
                break
            child = parent
        if chosen:
            continue
        yield Hit(wrap, f"`{facts.text(wrap, 80)}` wraps a model moved with "
                  f"`{facts.text(moved, 40)}` (line {moved.lineno}), and nothing on this path "
                  "picks the process's GPU (no `torch.cuda.set_device`, no `device_ids`): "
                  "every process of a machine puts its replica on `cuda:0`.",
                  "pick the GPU from the launcher's local rank first: `torch.cuda.set_device("
                  "local_rank)`, then `model.cuda(local_rank)` and `DDP(model, device_ids=["
                  "local_rank])`; splitsync's `run.model(model)` does it.")


def _local_rank_flag(facts: Facts) -> Iterator[Hit]:
    """``--local_rank`` defaulting to 0 in a script that never reads ``LOCAL_RANK``."""
    if "LOCAL_RANK" in facts.source:
        return  # read from the environment too (torchrun sets it)
    for call in facts.method_calls("add_argument"):
        flags = [a.value for a in call.args if isinstance(a, ast.Constant)]
        default = next((k.value for k in call.keywords if k.arg == "default"), None)
        if not any(str(f).lstrip("-").replace("-", "_") == "local_rank" for f in flags) \
                or not (isinstance(default, ast.Constant) and default.value == 0):
            continue
        used = [c for c in facts.calls if last_name(c[0]) in _SETTERS | {"cuda", "device"}
                and any(last_name(n) == "local_rank" for a in c[0].args for n in ast.walk(a))]
        if not used:
            continue
        yield Hit(default, f"`{facts.text(call, 80)}`: only the old `torch.distributed.launch` "
                  "passes `--local_rank`; under torchrun it stays 0 in every process, so "
                  f"`{facts.text(used[0][0], 50)}` (line {used[0][0].lineno}) puts every rank "
                  "of a machine on `cuda:0`.",
                  "read the launcher's variable: `default=int(os.environ.get(\"LOCAL_RANK\", "
                  "0))` (splitsync.init() does it).")


def one_gpu_for_all(facts: Facts) -> Iterator[Hit]:
    """SS106: every rank of a machine on ``cuda:0``."""
    if not facts.in_distributed_run:
        return
    if "CUDA_VISIBLE_DEVICES" in facts.source:
        return  # each process is shown its own GPU: cuda:0 is that GPU
    yield from _no_device(facts)
    yield from _local_rank_flag(facts)


def _env_key(expr: ast.AST) -> str | None:
    """``"RANK"`` for ``os.environ["RANK"]``, ``os.environ.get("RANK")``, ``os.getenv("RANK")``."""
    if isinstance(expr, ast.Subscript) and dotted(expr.value) in {"os.environ", "environ"}:
        key = expr.slice
    elif isinstance(expr, ast.Call) and expr.args and (
            dotted(expr.func) in {"os.environ.get", "environ.get", "os.getenv", "getenv"}):
        key = expr.args[0]
    else:
        return None
    return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None


def _global_source(expr: ast.AST) -> str | None:
    """What makes ``expr`` the global rank for certain (``dist.get_rank()``, ``RANK``), or None."""
    while isinstance(expr, ast.Call) and last_name(expr) == "int" and expr.args:
        expr = expr.args[0]
    if isinstance(expr, ast.Call) and last_name(expr) in {"get_rank", "get_global_rank"} \
            and not expr.args and not expr.keywords:
        return "RANK"
    key = _env_key(expr)
    return key if key in _GLOBAL_VARS else None


def _bound_in(facts: Facts, scope: ast.AST, name: str) -> list[ast.AST]:
    """The values assigned to ``name`` (a dotted name) in ``scope``, in source order."""
    return [n.value for n in facts.walk_scope(scope) if isinstance(n, ast.Assign)
            and any(dotted(t) == name for t in n.targets)]  # type: ignore[attr-defined]


def _global_rank(facts: Facts, expr: ast.AST, scope: ast.AST) -> str | None:
    """The launcher variable ``expr`` (the left of ``% device_count()``) is the global rank
    of, when that is certain: read directly, or a name every assignment of this function gives
    the global rank (a parameter, or a name also given another value, is not certain)."""
    found = _global_source(expr)
    name = dotted(expr)
    if found is not None or name is None or "local" in name.lower():
        return found
    values = _bound_in(facts, scope, name)
    sources = [_global_source(v) for v in values]
    if not sources or not all(sources):
        return None
    before = [s for v, s in zip(values, sources, strict=True) if v.lineno <= expr.lineno]  # type: ignore[attr-defined]
    return (before or sources)[-1]  # the nearest binding: the branch's own launcher


def _device_count(facts: Facts, expr: ast.AST, scope: ast.AST) -> bool:
    """``torch.cuda.device_count()``, or a name this function binds to it alone."""
    if isinstance(expr, ast.Call):
        return last_name(expr) == "device_count"
    name = dotted(expr)
    values = _bound_in(facts, scope, name) if name is not None else []
    return bool(values) and all(isinstance(v, ast.Call) and last_name(v) == "device_count"
                                for v in values)


def _reads_local(facts: Facts, stmt: ast.AST, own: set[str]) -> ast.AST | None:
    """A read of the local rank in ``stmt``: a launcher's local variable, or a name such as
    ``local_rank`` / ``args.local_rank`` (``own``: names the modulo itself is assigned to)."""
    for node in facts.subtree(stmt):
        if isinstance(node, ast.Constant) and node.value in _LOCAL_VARS:
            holder = facts.parents.get(node)
            if not (isinstance(holder, ast.Subscript) and isinstance(holder.ctx, ast.Store)):
                return node  # a read, not `os.environ["LOCAL_RANK"] = str(gpu)`
        if isinstance(node, ast.Name | ast.Attribute) and dotted(node) not in own \
                and "local_rank" in (last_name(node) or "").lower().replace("localrank",
                                                                            "local_rank"):
            return node
    return None


def _local_on_path(facts: Facts, node: ast.AST) -> ast.AST | None:
    """The local rank read on the path of ``node`` in its function: in a block that holds
    ``node`` (a sibling branch of an ``if`` is another path), before or after it."""
    stmt = next((a for a in facts.ancestors(node) if isinstance(a, ast.stmt)), None)
    if stmt is None:
        return None
    own = {d for t in getattr(stmt, "targets", ()) if (d := dotted(t)) is not None}
    child: ast.AST = stmt
    for parent in facts.ancestors(stmt):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(parent, name, None)
            if isinstance(block, list) and child in block:
                for other in block:
                    if other is not child and (read := _reads_local(facts, other, own)):
                        return read
        if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module):
            return None
        child = parent
    return None


def gpu_from_global_rank(facts: Facts) -> Iterator[Hit]:
    """SS107: ``device = dist.get_rank() % torch.cuda.device_count()``."""
    if not facts.in_distributed_run or "CUDA_VISIBLE_DEVICES" in facts.source \
            or "device_count" not in facts.source:
        return  # each process shown its own GPUs (the count is that process's), or no count
    counts = {d for c in facts.named_calls("device_count")
              if isinstance(a := facts.parents.get(c), ast.Assign)
              for t in a.targets if (d := dotted(t)) is not None}  # `n = ...device_count()`
    for node in facts.of(ast.BinOp):
        right = node.right  # type: ignore[attr-defined]
        if not isinstance(node.op, ast.Mod) or not (  # type: ignore[attr-defined]
                last_name(right) == "device_count" if isinstance(right, ast.Call)
                else dotted(right) in counts):
            continue  # a cheap test first: most `%` are step counters and string formats
        scope = facts.scope(node)
        if not _device_count(facts, right, scope):
            continue
        var = _global_rank(facts, node.left, scope)  # type: ignore[attr-defined]
        if var is None or (read := _local_on_path(facts, node)) is None:
            continue  # no local rank at hand: the modulo is the usual way to get one
        local = _GLOBAL_VARS[var]
        yield Hit(node, f"`{facts.text(node, 80)}` picks this process's GPU from the global "
                  f"rank (`{var}`) although the local rank is at hand (`{facts.text(read, 40)}`,"
                  f" line {read.lineno}): it is the GPU of the process only when every machine's "
                  "ranks are numbered one after the other and it runs no more processes than it "
                  "has GPUs; with ranks placed round-robin (`srun --distribution=cyclic`), "
                  "machines with different GPU counts, or more processes than GPUs, two "
                  "processes of a machine pick the same GPU, or another line using the local "
                  "rank points elsewhere.",
                  f"use the local rank the launcher sets: `int(os.environ[\"{local}\"])` "
                  "(splitsync: `run.local_rank`, or `run.device`).")


RULES = (
    Rule("SS106", "every-rank-on-one-gpu", "error",
         "every rank of a machine on cuda:0: DDP without a device per process, or a "
         "--local_rank flag torchrun never passes",
         "A process uses cuda:0 until told otherwise. `model.cuda(); DDP(model)` with no "
         "`torch.cuda.set_device(local_rank)` on that path, or a `--local_rank` argument "
         "defaulting to 0 (only `torch.distributed.launch` passes it; torchrun sets the "
         "LOCAL_RANK variable instead), puts every process of a machine on the first GPU. "
         "Known false positives: launchers that give each process one visible GPU "
         "(CUDA_VISIBLE_DEVICES per process, set outside the script).", one_gpu_for_all),
    Rule("SS107", "gpu-from-global-rank", "warning",
         "a GPU chosen as the global rank modulo the device count, where the launcher gives "
         "the local rank",
         "`device = dist.get_rank() % torch.cuda.device_count()` (or `int(os.environ["
         "\"RANK\"])`, `SLURM_PROCID` modulo the count) is the process's GPU only when the "
         "ranks of each machine are numbered one after the other and no machine runs more "
         "processes than it has GPUs. Under a round-robin placement (SLURM's cyclic "
         "distribution), uneven machines, or more processes than GPUs, two processes share a "
         "GPU. The launcher already says which GPU is the process's: LOCAL_RANK (torchrun), "
         "SLURM_LOCALID (SLURM). Reported only where the function reads the local rank on "
         "the same path (it is at hand and not used); silent when the value modulo the count "
         "is a local rank, or a name this function does not bind to the global rank for "
         "certain (the index `mp.spawn` passes). Known false positives: a cluster whose launcher always numbers "
         "ranks node by node with one process per GPU, where the modulo is right.",
         gpu_from_global_rank),
)
