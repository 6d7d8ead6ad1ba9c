"""A data-parallel wrapper prepared but bypassed (SS210): the model is wrapped in DDP/FSDP,
then training calls the module underneath (``model = model.module`` right after the wrap,
or ``loss = model.module.get_loss(x)`` before ``loss.backward()``). The wrapper's forward
never runs, so it never arms the gradient all-reduce: each rank trains its own model."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from splitsync.check.facts import Facts, dotted, last_name
from splitsync.check.model import Hit, Rule

__all__ = ["RULES"]

_WRAPS = ("DistributedDataParallel", "FullyShardedDataParallel")
#: What may be read off the inner module without bypassing the wrapper's forward.
_HARMLESS = frozenset({"state_dict", "load_state_dict", "parameters", "named_parameters",
                       "buffers", "named_buffers", "children", "modules", "named_modules",
                       "to", "cpu", "cuda", "eval", "train", "save_pretrained", "generate",
                       "config", "requires_grad_", "zero_grad", "half", "float", "apply",
                       "register_buffer", "get_submodule", "sample", "no_sync"})
_TRAINS = ("train", "fit", "backward", "run_epoch", "step")


def _wrapped_names(facts: Facts) -> set[str]:
    """Names (or attributes) a DDP/FSDP wrap is assigned to: ``model``, ``self.model``."""
    names = set()
    for call in facts.torch_calls(*_WRAPS):
        holder = facts.parents.get(call)
        if isinstance(holder, ast.Assign):
            names.update(d for t in holder.targets if (d := dotted(t)))
    return names


def _unwrapped_again(facts: Facts, names: set[str]) -> Iterator[Hit]:
    """``model = DDP(model); model = model.module`` and then training."""
    for node in facts.of(ast.Assign):
        value = node.value  # type: ignore[attr-defined]
        if not (isinstance(value, ast.Attribute) and value.attr == "module"):
            continue
        inner = dotted(value.value)
        targets = {dotted(t) for t in node.targets}  # type: ignore[attr-defined]
        if inner not in names or inner not in targets:
            continue
        scope = facts.scope(node)
        later = [c for c in facts.inside(scope, ast.Call) if c.lineno > node.lineno]  # type: ignore[attr-defined]
        trains = next((c for c in later if any(w in (last_name(c) or "").lower() for w in _TRAINS)
                       or any(isinstance(a, ast.Name) and a.id == inner for a in c.args)
                       and "trainer" in (last_name(c) or "").lower()), None)
        if trains is None:
            continue  # unwrapped to save or export after training: the wrapper did its work
        yield Hit(node, f"`{facts.text(node, 60)}` replaces the DDP/FSDP wrapper with the module "
                  f"inside it, and training goes on with it (`{facts.text(trains, 40)}`, line "
                  f"{trains.lineno}): the wrapper's forward never runs, so gradients are never "
                  "all-reduced and every rank trains its own model.",
                  f"keep training through the wrapper (`{inner}(x)`); take `{inner}.module` only "
                  "to save, export or evaluate on one rank.")


def _bypassed_in_step(facts: Facts, names: set[str]) -> Iterator[Hit]:
    """``loss = model.module.get_loss(x)`` then ``loss.backward()``."""
    short = {n.rsplit(".", 1)[-1] for n in names}
    for call in facts.method_calls("backward"):
        scope = facts.scope(call)
        used = {n.id for part in (call.func.value, *call.args)  # type: ignore[attr-defined]
                for n in ast.walk(part) if isinstance(n, ast.Name)}
        for node in facts.inside(scope, ast.Assign):
            value = node.value  # type: ignore[attr-defined]
            if node.lineno > call.lineno or not any(  # type: ignore[attr-defined]
                    isinstance(t, ast.Name) and t.id in used for t in node.targets):  # type: ignore[attr-defined]
                continue
            for inner in facts.inside(value, ast.Call):
                func = inner.func  # type: ignore[attr-defined]
                owner = func.value if isinstance(func, ast.Attribute) else None
                if isinstance(func, ast.Attribute) and func.attr == "module":
                    owner, name = func, "forward"  # `model.module(x)`
                else:
                    name = last_name(inner) or ""
                if not (isinstance(owner, ast.Attribute) and owner.attr == "module"
                        and (dotted(owner.value) or "").rsplit(".", 1)[-1] in short
                        and name not in _HARMLESS):
                    continue
                yield Hit(inner, f"`{facts.text(inner, 60)}` computes the loss through the module "
                          f"inside the DDP/FSDP wrapper, and `{facts.text(call, 40)}` (line "
                          f"{call.lineno}) back-propagates it: the wrapper's forward never runs, "
                          "so gradients are never all-reduced and every rank trains its own "
                          "model.",
                          "call the wrapper itself (give the model a `forward` that returns the "
                          "loss, or wrap a module that does); read `.module` only outside the "
                          "training step.")
                break


def wrapper_bypassed(facts: Facts) -> Iterator[Hit]:
    """SS210: training that goes around the DDP/FSDP wrapper it prepared."""
    names = _wrapped_names(facts)
    if not names:
        return
    yield from _unwrapped_again(facts, names)
    yield from _bypassed_in_step(facts, names)


RULES = (
    Rule("SS210", "wrapper-bypassed", "error",
         "a model wrapped in DDP/FSDP whose training calls the module inside the wrapper",
         "DDP all-reduces gradients through hooks its own forward arms; FSDP gathers and "
         "reshards in its forward. `model = model.module` right after the wrap (followed by "
         "training), or a loss computed with `model.module.some_method(x)` and back-propagated, "
         "never runs that forward: no gradient is averaged and each rank drifts into its own "
         "model while the run looks healthy. Reading `.module` to save, export or evaluate is "
         "fine. Known false positives: a module whose method itself calls the wrapper.",
         wrapper_bypassed),
)
