"""Process-group facts of one file: the calls every rank enters together
(:data:`COLLECTIVES`, :func:`collective_call`), the module-level functions that enter one
(:func:`collective_functions`), and a group set up on some paths only
(:func:`optional_group`). Read by the engine (a project's facts) and by SS207/SS208."""

from __future__ import annotations

import ast
import re
from pathlib import PurePath

from splitsync.check.facts import Facts, dotted, last_name

__all__ = ["COLLECTIVES", "collective_call", "collective_functions", "optional_group"]


#: Calls that every rank must make together (torch.distributed, MPI, Accelerate, Fabric).
COLLECTIVES = frozenset({
    "barrier", "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor",
    "broadcast", "broadcast_object_list", "reduce", "gather", "gather_object", "scatter",
    "scatter_object_list", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
    "all_to_all_single", "monitored_barrier", "bcast", "Bcast", "allreduce", "Allreduce",
    "allgather", "Allgather", "Barrier", "wait_for_everyone"})



#: Receivers whose methods of those names are collectives.
_GROUPS = re.compile(r"^(dist|torch\.distributed|tdist|comm|COMM_WORLD|MPI\.COMM_WORLD|"
                     r"accelerator|fabric|self\.accelerator|self\.fabric|xm|idist|run)$")



def collective_call(facts: Facts, call: ast.Call) -> bool:
    """``dist.barrier()``, ``MPI.COMM_WORLD.bcast(x)``, ``accelerator.wait_for_everyone()``."""
    if last_name(call) not in COLLECTIVES or not isinstance(call.func, ast.Attribute):
        return False
    receiver = facts.resolve(call.func.value) or dotted(call.func.value) or ""
    return bool(_GROUPS.match(receiver)) or receiver.startswith("torch.distributed") or (
        receiver.endswith("COMM_WORLD"))



def collective_functions(facts: Facts) -> frozenset[str]:
    """``stem:name`` of the module-level functions of this file that enter a collective
    (guided-diffusion's ``dist_util.load_state_dict`` broadcasts the file over MPI)."""
    stem = PurePath(facts.path).stem
    found = set()
    for fn in facts.tree.body:
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                collective_call(facts, c) for c in facts.inside(fn, ast.Call)):  # type: ignore[arg-type]
            found.add(f"{stem}:{fn.name}")
    return frozenset(found)



def optional_group(facts: Facts) -> bool:
    """Does this file set up the process group on some paths only (``args.distributed =
    False; return`` in ``init_distributed_mode`` when no launcher is found)?"""
    if not facts.torch_calls("init_process_group"):
        return False
    return any(isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)  # type: ignore[attr-defined]
               and n.value.value is False and any(  # type: ignore[attr-defined]
                   (last_name(t) or "") == "distributed" for t in n.targets)  # type: ignore[attr-defined]
               for n in facts.of(ast.Assign))
