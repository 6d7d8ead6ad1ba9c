"""The training loop: a host sync every step (SS601), accumulation that all-reduces every
micro-step (SS602), and BatchNorm statistics that stay per process (SS603)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from splitsync.lint.facts import Facts, dotted
from splitsync.lint.flow import conditional_between, loops_of
from splitsync.lint.model import Hit, Rule

__all__ = ["RULES"]

_SYNCS = frozenset({"item", "cpu", "tolist", "numpy"})
_NO_SYNC = frozenset({"no_sync", "require_backward_grad_sync", "set_requires_gradient_sync"})
_BATCHNORMS = ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LazyBatchNorm1d", "LazyBatchNorm2d",
               "LazyBatchNorm3d")



def _backwards(facts: Facts) -> list[ast.Call]:
    return facts.method_calls("backward")


def sync_per_step(facts: Facts) -> Iterator[Hit]:
    """SS601: ``.item()``/``.cpu()`` in the training-step loop, every step."""
    if not facts.is_distributed:
        return  # one process: a per-step read is a habit, not a stall of the other ranks
    seen: set[int] = set()
    for back in _backwards(facts):
        loop = next(loops_of(facts, back), None)
        if loop is None:
            continue
        for node in ast.walk(loop):
            if (not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute)
                    or node.func.attr not in _SYNCS or node.args or id(node) in seen):
                continue
            seen.add(id(node))
            if facts.scope(node) is not facts.scope(loop) or conditional_between(facts, node, loop):
                continue
            what = facts.text(node)
            yield Hit(node, f"`{what}` runs on every training step (the loop at line "
                      f"{loop.lineno}): it copies to the host and waits for the device to "
                      "finish, a synchronisation per step that drains the GPU's queue and, under "
                      "DDP, holds the other ranks at the next all-reduce.",
                      f"keep running values on the device (`total += {facts.text(node.func.value, 30)}"
                      ".detach()`) and convert once per epoch, or every N steps under "
                      "`if step % N == 0:`.")


def _is_step(facts: Facts, call: ast.Call) -> bool:
    receiver = call.func.value  # type: ignore[attr-defined]
    names = [dotted(receiver) or "", *(dotted(a) or "" for a in call.args)]
    return facts.is_run(receiver) or any("opt" in n.lower() for n in names)


def _model_name(facts: Facts) -> str:
    for call in facts.torch_calls("DistributedDataParallel") + facts.run_calls("model"):
        holder = facts.parents.get(call)
        if isinstance(holder, ast.Assign) and (name := dotted(holder.targets[0])):
            return name
    return "model"


def _enclosing_test(facts: Facts, node: ast.AST, loop: ast.AST) -> str:
    for parent in facts.ancestors(node):
        if parent is loop:
            break
        if isinstance(parent, ast.If):
            return facts.text(parent.test, 200)
    return "the accumulation condition"


def accumulation_without_no_sync(facts: Facts) -> Iterator[Hit]:
    """SS602: DDP gradient accumulation whose micro-steps all-reduce anyway."""
    wrapped = facts.torch_calls("DistributedDataParallel") or facts.run_calls("model")
    if not wrapped or facts.loaded_names & _NO_SYNC:
        return
    steps = [c for c in facts.method_calls("step") if _is_step(facts, c)]
    model = _model_name(facts)
    for back in _backwards(facts):
        if facts.is_run(back.func.value):  # type: ignore[attr-defined]
            continue  # run.backward skips the sync itself when accumulate > 1
        loops = list(loops_of(facts, back))
        if not loops:
            continue
        inner = loops[0]
        direct = [s for s in steps if next(loops_of(facts, s), None) is inner]
        nested = [s for s in steps if any(lp is inner for lp in loops_of(facts, s))]
        if direct and all(conditional_between(facts, s, inner) for s in direct) \
                and not conditional_between(facts, back, inner):
            when = f"only when `{_enclosing_test(facts, direct[0], inner)}` (line {direct[0].lineno})"
        elif not nested and any(any(lp is outer for lp in loops_of(facts, s))
                                for outer in loops[1:] for s in steps):
            when = f"once after the micro-step loop at line {inner.lineno} finishes"
        else:
            continue
        yield Hit(back, f"`{facts.text(back)}` runs every micro-step but the optimizer steps {when}: "
                  "gradient accumulation, yet DDP all-reduces the gradients on every backward, "
                  "so all but the last all-reduce of each window are wasted communication.",
                  f"skip the sync on micro-steps that don't step: `with {model}.no_sync():` "
                  "around their backward (`contextlib.nullcontext()` on the last one); or "
                  "`splitsync.init(accumulate=N)` with `run.backward(loss)` and `run.step(opt)`.")


def batchnorm_without_syncbn(facts: Facts) -> Iterator[Hit]:
    """SS603: BatchNorm layers in a DDP model that keep per-process statistics."""
    wraps = facts.torch_calls("DistributedDataParallel") + [
        c for c in facts.run_calls("model")
        if not any(k.arg == "sync_batchnorm" for k in c.keywords)]
    if not wraps or "SyncBatchNorm" in facts.loaded_names \
            or "convert_sync_batchnorm" in facts.loaded_names:
        return
    norms = facts.torch_calls(*_BATCHNORMS)
    if not norms:
        return
    first = norms[0]
    more = f" (and {len(norms) - 1} more)" if len(norms) > 1 else ""
    fix = ("`model = run.model(net, sync_batchnorm=True)`" if facts.is_splitsync else
           "`model = nn.SyncBatchNorm.convert_sync_batchnorm(model)` before wrapping in DDP")
    yield Hit(first, f"`{facts.text(first)}`{more} sits in a model trained data-parallel (wrapped at "
              f"line {wraps[0].lineno}): each rank normalises with the statistics of its own "
              "per-process batch, not the global batch. It matters when per-process batches are "
              "small (roughly under 16-32 samples, as in detection or segmentation); with large "
              "per-process batches plain BatchNorm is usually fine.",
              f"on GPU runs with small per-process batches use {fix} (SyncBatchNorm needs CUDA "
              "or XPU); otherwise keep BatchNorm and silence this with "
              "`# splitsync: ignore[SS603]`.")


RULES = (
    Rule("SS601", "sync-per-step", "info",
         ".item() / .cpu() / .tolist() / .numpy() on every training step",
         "Each call waits for the device and copies to the host. Once per step it serialises "
         "the host and device; accumulate on the device and read out rarely.", sync_per_step),
    Rule("SS602", "accumulation-without-no-sync", "warning",
         "gradient accumulation under DDP without no_sync",
         "DDP all-reduces in backward. With accumulation only the last micro-step needs it; "
         "model.no_sync() (or splitsync's accumulate=N) skips the rest.",
         accumulation_without_no_sync),
    Rule("SS603", "batchnorm-without-syncbn", "warning",
         "BatchNorm in a DDP model without SyncBatchNorm",
         "BatchNorm under DDP computes statistics per process. With small per-process batches "
         "they are noisy and training differs from the single-device run; SyncBatchNorm "
         "computes them over all ranks (CUDA/XPU only).", batchnorm_without_syncbn),
)
