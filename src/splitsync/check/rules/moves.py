"""A tensor moved with ``x.to(device)`` whose result is thrown away (SS103), and a context
manager called as a plain statement (SS105)."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from splitsync.check.evidence import test_or_benchmark
from splitsync.check.facts import Facts, dotted, last_name
from splitsync.check.model import Hit, Rule
from splitsync.check.rules.common import FACTORIES

__all__ = ["RULES"]

_MOVES = frozenset({"to", "cuda", "cpu"})


def _names(target: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _loader_names(facts: Facts) -> set[str]:
    makers = facts.torch_calls("DataLoader") + facts.run_calls("loader")
    names: set[str] = set()
    for call in makers:
        holder = facts.parents.get(call)
        if isinstance(holder, ast.Assign):
            names.update(d for t in holder.targets if (d := dotted(t)))
    return names


def _tensor_names(facts: Facts, scope: ast.AST, loaders: set[str]) -> dict[str, str]:
    """Names in ``scope`` bound to tensors: ``"factory"`` results (certainly tensors) and the
    ``"loader"`` items unpacked from a batch (almost always tensors). A whole batch bound to
    one name is left out: it may be a dict or a Hugging Face BatchEncoding, whose ``.to()``
    moves in place."""
    found: dict[str, str] = {}
    for node in facts.walk_scope(scope):
        if isinstance(node, ast.Assign):
            root = node.value
            while isinstance(root, ast.Call) and isinstance(root.func, ast.Attribute) \
                    and root.func.attr in _MOVES | {"float", "long", "half"}:
                root = root.func.value
            names = _names(node.targets[0]) if len(node.targets) == 1 else set()
            if isinstance(root, ast.Call) and facts.is_torch(root, *FACTORIES) \
                    and isinstance(root.func, ast.Attribute):
                found.update(dict.fromkeys(names, "factory"))
            else:
                for name in names:
                    found.pop(name, None)  # rebound to something else
        elif isinstance(node, ast.For | ast.AsyncFor):
            if any(dotted(n) in loaders for n in ast.walk(node.iter)):
                items = [e for e in ast.walk(node.target)
                         if isinstance(e, ast.Name) and e is not node.target]
                if isinstance(node.target, ast.Tuple) and isinstance(node.iter, ast.Call) \
                        and last_name(node.iter) == "enumerate" and node.target.elts:
                    # `for step, batch in enumerate(loader)`: the batch is the second item
                    second = node.target.elts[-1]
                    items = [e for e in ast.walk(second)
                             if isinstance(e, ast.Name) and e is not second]
                found.update(dict.fromkeys((e.id for e in items), "loader"))
    return found


def discarded_move(facts: Facts) -> Iterator[Hit]:
    """SS103: ``x.to(device)`` as a statement on a tensor: the moved copy is lost."""
    loaders = _loader_names(facts)
    # only scopes with a candidate statement (`name.to(...)` alone) are worth reading
    wanted = {id(facts.scope(n)) for n in facts.of(ast.Expr)
              if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
              and isinstance(n.value.func, ast.Attribute) and n.value.func.attr in _MOVES
              and isinstance(n.value.func.value, ast.Name)}
    scopes = [s for s in (facts.tree, *facts.of(ast.FunctionDef, ast.AsyncFunctionDef))
              if id(s) in wanted]
    for scope in scopes:
        tensors = _tensor_names(facts, scope, loaders)
        for node in facts.walk_scope(scope):
            if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
                continue
            func = node.value.func
            if not (isinstance(func, ast.Attribute) and func.attr in _MOVES
                    and isinstance(func.value, ast.Name) and func.value.id in tensors):
                continue
            name, call = func.value.id, facts.text(node.value, 200)
            unsure = tensors[name] == "loader"
            yield Hit(node.value, f"`{call}` throws its result away: a tensor's `.{func.attr}()` "
                      f"returns a moved copy (only a module's moves in place), so `{name}` stays "
                      "where it was and the next forward raises \"Expected all tensors to be on "
                      "the same device\"." + (" (It is an item of a loader batch: a tensor "
                                               "unless the dataset yields objects whose "
                                               "`.to()` moves in place.)" if unsure else ""),
                      f"assign the copy: `{name} = {call}`.",
                      severity="warning" if unsure else None)


#: torch context managers that do nothing unless entered with ``with``.
_CONTEXTS = frozenset({"device_index", "no_grad", "enable_grad", "inference_mode", "autocast",
                       "stream", "set_grad_enabled", "profile", "record_function"})
_CUDA_DEVICE = frozenset({"torch.cuda.device", "torch.xpu.device", "torch.mps.device",
                          "torch.device", "torch.cuda.stream"})
_MODEL_CONTEXTS = frozenset({"no_sync", "join", "summon_full_params"})
#: Calls that return a wrapped model, whose ``.join()`` is DDP's uneven-inputs context manager.
_WRAPS = frozenset({"DistributedDataParallel", "DDP", "FullyShardedDataParallel", "FSDP"})


def _wrapped_models(facts: Facts) -> set[str]:
    """Names bound to a DDP/FSDP wrapper (``model = DDP(model)``, ``self.model = DDP(...)``)."""
    names: set[str] = set()
    for call, _ in facts.calls:
        holder = facts.parents.get(call)
        wraps = last_name(call) in _WRAPS or (
            isinstance(call.func, ast.Attribute) and call.func.attr == "model"
            and facts.is_run(call.func.value))
        if wraps and isinstance(holder, ast.Assign):
            names.update(d for t in holder.targets if (d := dotted(t)))
    return names


def _context_call(facts: Facts, call: ast.Call, wrapped: set[str]) -> str | None:
    full = facts.resolve(call.func) or ""
    if full in _CUDA_DEVICE:
        return full
    last = full.rsplit(".", 1)[-1]
    if full.startswith("torch.") and last in _CONTEXTS and not (
            last == "set_grad_enabled" and full == "torch.set_grad_enabled"):
        return full  # torch.set_grad_enabled(False) as a call does switch grad mode globally
    if isinstance(call.func, ast.Attribute) and call.func.attr in _MODEL_CONTEXTS \
            and not call.args and not call.keywords:
        # `p.join()` on a Process or a Thread waits for it: only a wrapped model's is a context
        if call.func.attr == "join" and dotted(call.func.value) not in wrapped:
            return None
        return facts.text(call.func, 60)
    return None


def context_as_statement(facts: Facts) -> Iterator[Hit]:
    """SS105: ``torch.cuda.device(rank)`` as a statement: a context manager nobody enters."""
    wrapped = _wrapped_models(facts)
    for node in facts.of(ast.Expr):
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
            continue
        name = _context_call(facts, node.value, wrapped)
        if name is None or test_or_benchmark(facts, node):
            continue  # test code (a type-stub test) is checked, not run
        call = facts.text(node.value, 120)
        setter = ("`torch.accelerator.set_device_index(...)`" if "accelerator" in name
                  else "`torch.cuda.set_device(...)`" if "device" in name else None)
        fix = (f"to select the device for the rest of the process call {setter}; to use it for "
               f"a block, `with {call}:`" if setter else f"enter it for the block it should "
               f"cover: `with {call}:`")
        yield Hit(node.value, f"`{call}` creates a context manager and throws it away: it has no "
                  "effect unless entered with `with`, so the code after it runs as if the line "
                  "were not there.", f"{fix}.")


RULES = (
    Rule("SS103", "tensor-move-discarded", "error",
         "tensor.to(device) / .cuda() as a statement: the moved copy is discarded",
         "Module.to() moves parameters in place and returns self; Tensor.to() returns a new "
         "tensor. Writing `x.to(device)` on a tensor does nothing. Only receivers known to be "
         "tensors are reported: results of torch factories (error) and items unpacked from a "
         "DataLoader batch (warning). A whole batch bound to one name (a dict, a Hugging Face "
         "BatchEncoding, whose .to() moves in place) is not. Known false positives: a custom "
         "batch class unpacked from a loader whose .to() moves in place.", discarded_move),
    Rule("SS105", "context-manager-as-statement", "error",
         "a context manager (torch.cuda.device, torch.no_grad, model.no_sync ...) called as a "
         "plain statement",
         "torch.cuda.device(i), torch.accelerator.device_index(i), torch.no_grad(), "
         "torch.autocast(...) and model.no_sync() return context managers: calling one as a "
         "statement builds it and discards it, changing nothing. Use `with ...:` or the "
         "setter (torch.cuda.set_device, torch.accelerator.set_device_index). Known false "
         "positives: none known for these torch names; a project function that shadows one "
         "of them under a torch-like import alias. `.join()` counts only on a name bound to "
         "a DDP/FSDP wrapper (a Process's or a Thread's `join()` waits, it is no context).",
         context_as_statement),
)
