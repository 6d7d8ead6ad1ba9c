"""The training loop: a host sync every step (SS601), accumulation that all-reduces every
micro-step (SS602), BatchNorm statistics that stay per process (SS603), and gradients clipped
while still scaled by a GradScaler (SS604)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from splitsync.check.facts import Facts, dotted
from splitsync.check.flow import conditional_between, loops_of
from splitsync.check.model import Hit, Rule
from splitsync.check.rules.common import FACTORIES

__all__ = ["RULES"]

_SYNCS = frozenset({"item", "cpu", "tolist", "numpy"})
_NO_SYNC = frozenset({"no_sync", "require_backward_grad_sync", "set_requires_gradient_sync"})
_BATCHNORMS = ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LazyBatchNorm1d", "LazyBatchNorm2d",
               "LazyBatchNorm3d")



def _backwards(facts: Facts) -> list[ast.Call]:
    return facts.method_calls("backward")


def _on_host(facts: Facts, receiver: ast.AST, loop: ast.AST) -> bool:
    """Is ``receiver`` a CPU value: the result of ``.cpu()``/``.item()`` (the wait already
    happened there), or a name the loop's function binds only to a torch factory made
    without a device (``t = torch.zeros(1)``)?"""
    if isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Attribute) \
            and receiver.func.attr in _SYNCS:
        return True  # `x.cpu().numpy()`: the wait is `.cpu()`'s, reported there
    if not isinstance(receiver, ast.Name):
        return False
    values = [n.value for n in facts.walk_scope(facts.scope(loop)) if isinstance(n, ast.Assign)
              and any(isinstance(t, ast.Name) and t.id == receiver.id for t in n.targets)]
    return bool(values) and all(
        isinstance(v, ast.Call) and facts.is_torch(v, *FACTORIES)
        and isinstance(v.func, ast.Attribute) and not any(
            k.arg == "device" and not (isinstance(k.value, ast.Constant) and k.value.value == "cpu")
            for k in v.keywords) for v in values)


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
            if _on_host(facts, node.func.value, loop):
                continue  # already on the CPU: nothing to wait for
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


def _window_keyword(call: ast.Call) -> ast.keyword | None:
    """``update_grad=(i + 1) % accum_iter == 0``: a helper told which micro-steps step."""
    for k in call.keywords:
        if any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for n in ast.walk(k.value)):
            return k
    return None


def _helper_accumulation(facts: Facts, model: str) -> Iterator[Hit]:
    """Accumulation through a helper (MAE's ``loss_scaler(loss, opt, update_grad=...)``)."""
    for call, _ in facts.calls:
        if next(loops_of(facts, call), None) is None or facts.is_run(
                getattr(call.func, "value", None) or call.func):
            continue
        names = [dotted(a) or "" for a in call.args]
        window = _window_keyword(call)
        if window is None or not any("loss" in n.lower() for n in names):
            continue
        yield Hit(call, f"`{facts.text(call)}` runs backward every micro-step and steps only when "
                  f"`{facts.text(window.value, 80)}`: gradient accumulation through a helper, "
                  "but the model is wrapped in DDP and nothing skips the all-reduce, so every "
                  "micro-step but the last of each window synchronises gradients for nothing.",
                  f"enter `{model}.no_sync()` for the micro-steps that do not step (e.g. "
                  f"`ctx = {model}.no_sync() if not ({facts.text(window.value, 60)}) else "
                  "contextlib.nullcontext()` around the helper call), or use "
                  "`splitsync.init(accumulate=N)` with `run.backward` and `run.step`.")


def _context_values(facts: Facts, expr: ast.AST) -> list[ast.AST]:
    """What a ``with`` item enters: the expression, or what a name was bound to in its
    function (``ctx = model.no_sync() if accumulating else nullcontext()``, then ``with
    ctx:``)."""
    if not isinstance(expr, ast.Name):
        return [expr]
    found = [n.value for n in facts.walk_scope(facts.scope(expr)) if isinstance(n, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == expr.id for t in n.targets)]
    return found or [expr]


def _under_sync_context(facts: Facts, node: ast.AST, self_deciding: bool = False,
                        depth: int = 0) -> bool:
    """Inside ``with model.no_sync():`` (or a context named for the sync: ``ddp_sync(...)``,
    ``sync_context``)? ``self_deciding``: only a context that itself picks the last micro-step
    (``nullcontext() if last else model.no_sync()``, ``ddp_sync(ddp, sync=last)``)."""
    for parent in facts.ancestors(node):
        if isinstance(parent, ast.With | ast.AsyncWith) and any(
                "sync" in ast.unparse(expr).lower() and (
                    not self_deciding or isinstance(expr, ast.IfExp)
                    or (isinstance(expr, ast.Call) and expr.args[1:]))
                for item in parent.items for expr in _context_values(facts, item.context_expr)):
            return True
        if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef) and depth < 2:
            # a helper whose every call enters the context (`with model.no_sync(): step()`)
            sites = [c for c in facts.named_calls(parent.name)]
            return bool(sites) and all(_under_sync_context(facts, c, self_deciding, depth + 1)
                                       for c in sites)
        if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module):
            return False
    return False


def _branch_without_no_sync(facts: Facts) -> Iterator[Hit]:
    """A loop whose backward skips the sync on one branch (``if args.fp16:``) only: the other
    branch all-reduces every micro-step."""
    backs = [b for b in _backwards(facts) if next(loops_of(facts, b), None) is not None
             and not facts.is_run(b.func.value)]  # type: ignore[attr-defined]
    for back in backs:
        if _under_sync_context(facts, back):
            continue
        loop = next(loops_of(facts, back))
        # the other branch decides per micro-step itself, so this one is a different path
        # (precision, optimizer), not the last micro-step of `if i < k: no_sync else: sync`
        synced = [b for b in backs if b is not back and _under_sync_context(facts, b, True)
                  and next(loops_of(facts, b), None) is loop]
        if not synced:
            continue
        other = synced[0]
        yield Hit(back, f"`{facts.text(back)}` runs outside `no_sync` on this branch, while the "
                  f"backward at line {other.lineno} in the same loop runs under `no_sync`: on "
                  "this path (another precision or optimizer branch) DDP all-reduces every "
                  "micro-step of the accumulation window.",
                  "put this backward under the same `with model.no_sync()` (or the same "
                  "context) as the other branch, or `splitsync.init(accumulate=N)` with "
                  "`run.backward(loss)`, which handles every branch alike.")


def accumulation_without_no_sync(facts: Facts) -> Iterator[Hit]:
    """SS602: DDP gradient accumulation whose micro-steps all-reduce anyway."""
    wrapped = facts.torch_calls("DistributedDataParallel") or facts.run_calls("model")
    if facts.loaded_names & _NO_SYNC:
        yield from _branch_without_no_sync(facts)
        return
    if (facts.project.mentioned | facts.project.called) & _NO_SYNC:
        return
    if facts.project.wrapped and not facts.run_calls("model"):
        yield from _helper_accumulation(facts, _model_name(facts))
    if not wrapped:
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


_CLIPS = ("clip_grad_norm_", "clip_grad_value_")


def _branches(facts: Facts, node: ast.AST) -> set[tuple[int, str]]:
    """The (if statement, branch) pairs ``node`` sits in, up to its scope."""
    found: set[tuple[int, str]] = set()
    child = node
    for parent in facts.ancestors(node):
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
            break
        if isinstance(parent, ast.If):
            found.add((id(parent), "body" if any(child is s for s in parent.body) else "else"))
        child = parent
    return found


def clip_before_unscale(facts: Facts) -> Iterator[Hit]:
    """SS604: ``clip_grad_norm_`` on gradients a GradScaler has scaled and not unscaled."""
    scopes = {id(facts.scope(c)): facts.scope(c) for c in facts.torch_calls(*_CLIPS)}
    for scope in scopes.values():
        scaled: ast.Call | None = None
        for node in facts.walk_scope(scope):
            if not isinstance(node, ast.Call):
                continue
            attr = node.func.attr if isinstance(node.func, ast.Attribute) else None
            receiver = (dotted(node.func.value) or "").lower() if isinstance(
                node.func, ast.Attribute) else ""
            if attr == "scale" and "scaler" in receiver:
                scaled = node
            elif attr == "unscale_":
                scaled = None
            elif scaled is not None and facts.is_torch(node, *_CLIPS) \
                    and _branches(facts, scaled) <= _branches(facts, node):
                name = dotted(scaled.func.value)  # type: ignore[attr-defined]
                yield Hit(node, f"`{facts.text(node)}` clips gradients that `{name}.scale(...)` "
                          f"(line {scaled.lineno}) multiplied by the loss scale: the threshold "
                          "is compared with scaled gradients (thousands of times too large), so "
                          "clipping is wrong or never happens.",
                          f"unscale first: `{name}.unscale_(optimizer)` right before clipping, "
                          f"then `{name}.step(optimizer)` and `{name}.update()` as before.")


RULES = (
    Rule("SS601", "sync-per-step", "info",
         ".item() / .cpu() / .tolist() / .numpy() on every training step",
         "Each call waits for the device and copies to the host. Once per step it serialises "
         "the host and device; accumulate on the device and read out rarely. Known false "
         "positives: reads the loop needs every step anyway (a loss that decides control flow).",
         sync_per_step),
    Rule("SS602", "accumulation-without-no-sync", "warning",
         "gradient accumulation under DDP without no_sync",
         "DDP all-reduces in backward. With accumulation only the last micro-step needs it; "
         "model.no_sync() (or splitsync's accumulate=N) skips the rest. Accumulation through "
         "a helper (a loss-scaler call told `update_grad=(i + 1) % accum == 0`) in a module "
         "of a project that wraps the model in DDP counts too. Known false positives: an "
         "accumulation count of 1 at run time (nothing to skip), and no_sync entered in code "
         "the checker cannot read.", accumulation_without_no_sync),
    Rule("SS603", "batchnorm-without-syncbn", "info",
         "BatchNorm in a DDP model without SyncBatchNorm",
         "BatchNorm under DDP computes statistics per process. With small per-process batches "
         "they are noisy and training differs from the single-device run; SyncBatchNorm "
         "computes them over all ranks (CUDA/XPU only). Whether it matters depends on the "
         "per-process batch size, which the checker cannot see, so it is advice (info). Known "
         "false positives: large per-process batches, where per-process statistics are fine.",
         batchnorm_without_syncbn),
    Rule("SS604", "clip-before-unscale", "warning",
         "clip_grad_norm_ after scaler.scale(loss).backward() without scaler.unscale_",
         "A GradScaler multiplies the loss, hence every gradient, by the loss scale (2**16 at "
         "first). Clipping before scaler.unscale_(optimizer) compares the threshold with "
         "scaled gradients. Call scaler.unscale_(optimizer) first. Known false positives: a "
         "GradScaler constructed with enabled=False at run time (scale is then 1).",
         clip_before_unscale),
)
