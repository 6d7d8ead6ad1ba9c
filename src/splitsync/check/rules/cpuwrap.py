"""DDP given a GPU for a module on the CPU (SS206): ``device_ids`` on the branch of a device
test that runs without CUDA, or for a model this function builds and never moves to a GPU.

DDP reads ``device_ids`` / ``output_device`` as the GPU the module lives on; for a CPU module
it raises ``ValueError`` ("device_ids and output_device arguments only work with
single-device/multiple-device GPU modules or CPU modules") when the wrap runs.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from splitsync.check.facts import Facts, dotted, last_name
from splitsync.check.model import Hit, Rule

__all__ = ["RULES"]

#: Methods of a module that leave it where it is.
_KEEPS = frozenset({"train", "eval", "parameters", "named_parameters", "state_dict",
                    "load_state_dict", "modules", "named_modules", "children", "requires_grad_",
                    "zero_grad", "buffers", "named_buffers", "register_buffer"})


def _cpu_branch(facts: Facts, node: ast.AST) -> ast.AST | None:
    """The test whose branch holding ``node`` runs without CUDA (``if not
    torch.cuda.is_available():``, the ``else`` of ``if torch.cuda.is_available():``,
    ``if args.gpu is None:``), if any."""
    child = node
    for parent in facts.ancestors(node):
        if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module):
            return None
        if isinstance(parent, ast.If):
            text = ast.unparse(parent.test).replace(" ", "").lower()
            in_body = any(child is s for s in parent.body)
            negated = text.startswith("not") and "is_available" in text
            positive = "is_available" in text and not text.startswith("not")
            none_gpu = "gpuisnone" in text or "device=='cpu'" in text or 'device=="cpu"' in text
            if (in_body and (negated or none_gpu)) or (not in_body and positive):
                return parent.test
        child = parent
    return None


def _names_a_gpu(call: ast.Call) -> bool:
    """``device_ids=[i]`` (a non-empty literal list) or a non-zero ``output_device``: what DDP
    refuses for a CPU module (``if device_ids or output_device``)."""
    for k in call.keywords:
        if k.arg == "device_ids" and isinstance(k.value, ast.List | ast.Tuple) and k.value.elts:
            return True
        if k.arg == "output_device" and not (isinstance(k.value, ast.Constant)
                                             and not k.value.value):
            return True
    return False


def _to_cpu(call: ast.AST) -> bool:
    """``m.cpu()``, ``m.to("cpu")``, ``m.to(torch.device("cpu"))``."""
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute):
        return False
    if call.func.attr == "cpu" and not call.args:
        return True
    if call.func.attr != "to" or len(call.args) != 1 or call.keywords:
        return False
    arg = call.args[0]
    if isinstance(arg, ast.Call) and last_name(arg) == "device" and len(arg.args) == 1:
        arg = arg.args[0]
    return isinstance(arg, ast.Constant) and arg.value == "cpu"


def _built_on_cpu(facts: Facts, value: ast.AST) -> bool:
    """A model built on the CPU: a class of this file or a torch/torchvision/timm
    constructor with no ``device=``, optionally followed by ``.cpu()`` / ``.to("cpu")``."""
    while _to_cpu(value):
        value = value.func.value  # type: ignore[attr-defined]
    if not isinstance(value, ast.Call) or any(k.arg in {"device", "device_map"} or k.arg is None
                                              for k in value.keywords):
        return False
    func = value.func
    if isinstance(func, ast.Subscript) and dotted(func.value) in {"models.__dict__",
                                                                  "torchvision.models.__dict__"}:
        return True  # the ImageNet example's `models.__dict__[args.arch]()`
    full = facts.resolve(func) or ""
    if isinstance(func, ast.Name) and func.id in facts.classes:
        return _init_stays(facts, func.id)
    if full.startswith("torch.nn."):
        return full.rsplit(".", 1)[-1][:1].isupper()  # a layer class, not a helper
    return full.startswith(("torchvision.models.", "timm.models.")) or full == "timm.create_model"


def _init_stays(facts: Facts, name: str) -> bool:
    """A class of this file whose body moves nothing to a device (no ``.cuda()``/``.to()``)."""
    cls = next((c for c in facts.of(ast.ClassDef) if c.name == name), None)  # type: ignore[attr-defined]
    if cls is None or any(dotted(b) not in {"nn.Module", "torch.nn.Module", "Module"}
                          for b in cls.bases):  # type: ignore[attr-defined]
        return False  # a base class of its own (or a library's) may move it
    return not any(isinstance(n, ast.Call) and last_name(n) in {"cuda", "to", "to_empty"}
                   for n in facts.subtree(cls))


def _cpu_model(facts: Facts, call: ast.Call) -> ast.AST | None:
    """The statement that builds the module ``call`` wraps, when this function shows it is on
    the CPU at the wrap: every binding of the name in the function is a CPU constructor
    (``if args.pretrained: model = resnet50(weights=...) else: model = resnet50()``), and
    before the wrap it is named only by methods that do not move it."""
    if not call.args or not isinstance(call.args[0], ast.Name):
        return None
    name, scope = call.args[0].id, facts.scope(call)
    if isinstance(scope, ast.Lambda) or "set_default_device" in facts.source \
            or "set_default_tensor_type" in facts.source:
        return None  # layers may be created on a GPU by default
    if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef) and any(
            a.arg == name for a in ast.walk(scope.args) if isinstance(a, ast.arg)):
        return None
    wrap = facts.parents.get(call)
    built: list[ast.Assign] = []
    for node in facts.walk_scope(scope):
        if node is wrap:
            continue  # `model = DDP(model, ...)` itself
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.For | ast.With
                      | ast.Global | ast.Nonlocal | ast.NamedExpr) and name in {
                getattr(n, "id", None) for t in _targets(node) for n in ast.walk(t)}:
            if not isinstance(node, ast.Assign) or not _built_on_cpu(facts, node.value) or any(
                    isinstance(a, ast.With) for a in facts.ancestors(node)):
                return None  # bound by something that may put it on a GPU
            built.append(node)
        elif isinstance(node, ast.Name) and node.id == name and node.lineno < call.lineno \
                and not _stays(facts, node):
            return None
    before = [b for b in built if b.lineno < call.lineno]
    return before[0] if before else None


def _targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, ast.AugAssign | ast.AnnAssign | ast.For | ast.NamedExpr):
        return [node.target]
    if isinstance(node, ast.With):
        return [i.optional_vars for i in node.items if i.optional_vars is not None]
    if isinstance(node, ast.Global | ast.Nonlocal):
        return [ast.Name(id=n) for n in node.names]
    return []


def _stays(facts: Facts, use: ast.Name) -> bool:
    """Is this mention of the model one that leaves it on the CPU (``m.train()``,
    ``m.to("cpu")``, ``print(m)``)? Anything else (``m.cuda()``, passing it on) may move it."""
    holder = facts.parents.get(use)
    if isinstance(holder, ast.Assign | ast.AnnAssign | ast.AugAssign) \
            and use in _targets(holder):
        return True
    if isinstance(holder, ast.Attribute):
        call = facts.parents.get(holder)
        return isinstance(call, ast.Call) and call.func is holder and (
            holder.attr in _KEEPS or _to_cpu(call))
    return isinstance(holder, ast.Call) and last_name(holder) in {"print", "len", "str", "repr"}


def device_ids_on_cpu(facts: Facts) -> Iterator[Hit]:
    """SS206: ``DDP(model, device_ids=[i])`` on a path where the model stays on the CPU."""
    for call in facts.torch_calls("DistributedDataParallel"):
        ids = next((k.value for k in call.keywords if k.arg == "device_ids"), None)
        if ids is not None and not (isinstance(ids, ast.Constant) and ids.value is None) \
                and (test := _cpu_branch(facts, call)) is not None:
            yield Hit(call, f"`{facts.text(call, 120)}` passes `device_ids` on the path where "
                      f"`{facts.text(test, 60)}` says there is no GPU: for a CPU module DDP "
                      "refuses device_ids (\"DistributedDataParallel device_ids and "
                      "output_device arguments only work with single-device/multiple-device "
                      "GPU modules\").",
                      "wrap a CPU model as `DDP(model)` with no device_ids (gloo backend); pass "
                      "`device_ids=[local_rank]` only when the model is on that GPU, or use "
                      "`run.model(model)`, which picks the right form.")
        elif _names_a_gpu(call) and (built := _cpu_model(facts, call)) is not None:
            model = facts.text(call.args[0], 30)
            yield Hit(call, f"`{facts.text(call, 120)}` names a GPU for `{model}`, but `{model}`"
                      f" is built on the CPU (`{facts.text(built, 60)}`, line {built.lineno}) "
                      "and nothing moves it before the wrap: DDP raises \"device_ids and "
                      "output_device arguments only work with single-device/multiple-device "
                      "GPU modules or CPU modules\" as soon as it runs.",
                      f"move the model to its GPU first (`{model}.cuda(local_rank)` or "
                      f"`{model}.to(device)`), or, to train on the CPU, wrap it as "
                      f"`DDP({model})` with no device_ids; `run.model({model})` picks the "
                      "right form.")


RULES = (Rule(
    "SS206", "device-ids-on-cpu", "error",
    "DistributedDataParallel given device_ids on a path where the model is on the CPU",
    "DDP's device_ids names the single GPU the module lives on; for a CPU module it must be "
    "None, and DDP raises a ValueError otherwise. The finding is made on the branch of a "
    "device test that runs without CUDA, and where the function builds the model itself (a "
    "class of the file, a torch/torchvision/timm constructor with no device) and names it "
    "before the wrap only through methods that do not move it (`.train()`, `.to(\"cpu\")`). "
    "Silent when the model is a parameter, is bound anywhere in the function by something "
    "else than a CPU constructor, is passed to anything, or is built under a `with` (a "
    "device context) or a default device. Known false positives: a branch the "
    "checker reads as CPU-only that moves the model to a GPU anyway.", device_ids_on_cpu),)
