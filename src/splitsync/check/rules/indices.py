"""CUDA named without saying so: ``.to(local_rank)`` (an integer is ``cuda:<n>``), a
``map_location`` mapping onto CUDA devices, and DDP's ``device_ids`` given the global rank
(SS104)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from splitsync.check.availability import availability_guarded
from splitsync.check.facts import Facts, dotted, last_name
from splitsync.check.flow import is_rank_like
from splitsync.check.model import Hit, Rule
from splitsync.check.rules.common import cuda_literal

__all__ = ["RULES"]


def _cuda_mapping(facts: Facts, expr: ast.AST, scope: ast.AST) -> bool:
    """A ``map_location`` dict (or a name bound to one) that maps to CUDA devices."""
    if isinstance(expr, ast.Name):
        values = [n.value for n in facts.walk_scope(scope) if isinstance(n, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == expr.id for t in n.targets)]
        return len(values) == 1 and _cuda_mapping(facts, values[0], scope)
    return isinstance(expr, ast.Dict) and any(
        v is not None and cuda_literal(v) for v in [*expr.keys, *expr.values])


def cuda_by_index(facts: Facts) -> Iterator[Hit]:
    """SS104: ``.to(local_rank)`` and ``map_location={"cuda:0": ...}``: CUDA without naming it."""
    seen: dict[str, list[ast.Call]] = {}
    for call in facts.method_calls("to"):
        arg = call.args[0] if call.args else None
        name = (last_name(arg) or "").lower() if arg is not None else ""
        if arg is None or not isinstance(arg, ast.Name | ast.Attribute) or "dev" in name \
                or not is_rank_like(arg) or availability_guarded(facts, call):
            continue
        seen.setdefault(facts.text(arg), []).append(call)
    for shown, calls in seen.items():  # once per index variable: one fix covers every move
        call, more = calls[0], len(calls) - 1
        also = f" (and {more} more move{'s' if more > 1 else ''} to it)" if more else ""
        arg = call.args[0]
        yield Hit(call, f"`{facts.text(call)}`{also} moves to the integer `{shown}`, which "
                  "PyTorch reads as CUDA device number `cuda:<n>`: on a CPU-only machine (or "
                  "an MPS/XPU one) this raises, even where the script picked its device "
                  "portably elsewhere.",
                  f"move to a device object: `device = torch.device(\"cuda\", {facts.text(arg)}) if "
                  "torch.cuda.is_available() else torch.device(\"cpu\")` and `.to(device)` "
                  "(splitsync: `run.device`).")
    for call, _ in facts.calls:
        where = next((k.value for k in call.keywords if k.arg == "map_location"), None)
        if where is None or not _cuda_mapping(facts, where, facts.scope(call)) \
                or availability_guarded(facts, call):
            continue
        yield Hit(call, f"`{facts.text(call)}` remaps the checkpoint onto CUDA devices through "
                  "`map_location`: on a machine without CUDA loading raises.",
                  "load to the CPU, `map_location=\"cpu\"`, then move the model with "
                  "`.to(device)`; or pass the device the run uses, `map_location=device`.")
    yield from _global_device_ids(facts)


def _global_device_ids(facts: Facts) -> Iterator[Hit]:
    """``DDP(model, device_ids=[rank])`` where the function takes its GPU as ``device = rank %
    torch.cuda.device_count()``: ``rank`` is the global rank, no GPU index (DiT's train.py)."""
    for call in facts.torch_calls("DistributedDataParallel"):
        ids = next((k.value for k in call.keywords if k.arg == "device_ids"), None)
        if not isinstance(ids, ast.List) or len(ids.elts) != 1:
            continue
        rank = dotted(ids.elts[0])
        local = next((n for n in facts.walk_scope(facts.scope(call)) if isinstance(n, ast.Assign)
                      and isinstance(n.value, ast.BinOp) and isinstance(n.value.op, ast.Mod)
                      and rank is not None and dotted(n.value.left) == rank), None)
        if local is None:
            continue
        index = facts.text(local.targets[0], 40)
        yield Hit(ids, f"`device_ids=[{rank}]` names GPU `{rank}`, but this function takes its "
                  f"GPU as `{facts.text(local, 80)}` (line {local.lineno}): `{rank}` is the "
                  "global rank, so on a second machine DDP asks for a GPU number that does not "
                  "exist there.",
                  f"pass the GPU the model is on: `device_ids=[{index}]`.")


RULES = (
    Rule("SS104", "cuda-by-index", "warning",
         "CUDA named by a bare rank (.to(local_rank), device_ids=[global rank]) or a CUDA "
         "map_location mapping",
         "`x.to(rank)` with an integer means `cuda:<rank>`, and `map_location={\"cuda:0\": "
         "f\"cuda:{rank}\"}` maps onto CUDA devices: both fail on CPU-only, MPS and XPU "
         "machines even when the script chose its device portably elsewhere. Known false "
         "positives: a variable named like a rank that actually holds a torch.device.",
         cuda_by_index),
)

