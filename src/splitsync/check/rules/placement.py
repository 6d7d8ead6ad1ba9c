"""Every rank on one GPU (SS106): a CUDA model wrapped in DDP without a device chosen per
process, or a ``--local_rank`` flag that only the old launcher passes.

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
)
