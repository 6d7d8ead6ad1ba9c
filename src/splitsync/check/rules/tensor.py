"""Tensor-parallel mistakes that can be seen in the source: a plan naming a module the model
does not have (SS215), and a loss or metric not reduced over the TP group (SS216).

A plan is a dict literal handed to ``run.model(m, tp_plan=...)`` or to PyTorch's
``parallelize_module(m, mesh, plan)`` (directly or through a name assigned once in the same
scope). The model is checked only when its class is defined in the file and every submodule
it registers is a plain ``self.name = ...`` assignment: a class the checker cannot see
completely is never reported.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from fnmatch import fnmatchcase

from splitsync.check.facts import Facts, last_name
from splitsync.check.model import Hit, Rule

__all__ = ["RULES"]

#: Calls that register a submodule under a computed name: the class is not fully visible.
_DYNAMIC = {"add_module", "register_module", "setattr", "__setattr__"}
#: Containers whose children are numbered (``layers.0``): a key segment there is an index.
_CONTAINERS = {"ModuleList", "Sequential"}
#: Last names of a language model's output layer, when the forward cannot be read.
_HEADS = {"output", "lm_head", "head", "classifier", "fc_out"}
#: Reductions that give the same answer when each replica is counted tp times.
_SAFE_OPS = {"AVG", "MAX", "MIN"}


def _plans(facts: Facts) -> Iterator[tuple[ast.Call, ast.AST, ast.Dict]]:
    """(call, the model expression, the plan's dict literal) of every TP plan in the file."""
    for call, _ in facts.calls:
        name = last_name(call)
        model: ast.AST | None = None
        plan: ast.AST | None = None
        if name == "parallelize_module":
            model = call.args[0] if call.args else _keyword(call, "module")
            plan = call.args[2] if len(call.args) > 2 else _keyword(call, "parallelize_plan")
        elif name == "model" and isinstance(call.func, ast.Attribute) and facts.is_run(call.func.value):
            model = call.args[0] if call.args else None
            plan = _keyword(call, "tp_plan")
        if model is None or plan is None:
            continue
        found = _as_dict(facts, plan, call)
        if found is not None:
            yield call, model, found


def _keyword(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _assigned(facts: Facts, name: str, before: ast.AST) -> ast.AST | None:
    """The value of the one assignment ``name = ...`` before ``before`` in its scope."""
    values = [n.value for n in facts.walk_scope(facts.scope(before))
              if isinstance(n, ast.Assign) and n.lineno < before.lineno  # type: ignore[attr-defined]
              and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]
    return values[0] if len(values) == 1 else None


def _as_dict(facts: Facts, expr: ast.AST, at: ast.AST) -> ast.Dict | None:
    """A dict literal, a name assigned one, or a call of a function of the file whose one
    ``return`` is one (``tp_plan=tp_plan()``)."""
    if isinstance(expr, ast.Name):
        expr = _assigned(facts, expr.id, at)  # type: ignore[assignment]
    elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) \
            and expr.func.id in facts.functions:
        returns = [n.value for n in ast.walk(facts.functions[expr.func.id])
                   if isinstance(n, ast.Return)]
        expr = returns[0] if len(returns) == 1 else None  # type: ignore[assignment]
    return expr if isinstance(expr, ast.Dict) else None


def _classes(facts: Facts) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in facts.tree.body if isinstance(n, ast.ClassDef)}


def _class_of(facts: Facts, expr: ast.AST) -> str | None:
    """The local class ``expr`` is an instance of: ``Net(...)``, or a name assigned from one."""
    if isinstance(expr, ast.Name):
        expr = _assigned(facts, expr.id, expr)  # type: ignore[assignment]
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) \
            and expr.func.attr in {"to", "cuda", "cpu", "double", "float", "bfloat16", "half"}:
        expr = expr.func.value
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name):
        return expr.func.id
    return None


def _children(classes: dict[str, ast.ClassDef], name: str) -> dict[str, ast.AST] | None:
    """Submodule attribute -> assigned value of a local class, or None when not fully visible."""
    cls = classes.get(name)
    if cls is None:
        return None
    found: dict[str, ast.AST] = {}
    for base in cls.bases:
        base_name = last_name(base) if not isinstance(base, ast.Name) else base.id
        if base_name in classes:
            inherited = _children(classes, base_name)
            if inherited is None:
                return None
            found.update(inherited)
        elif base_name != "Module":
            return None  # a library base class registers modules the checker cannot see
    for node in ast.walk(cls):
        if isinstance(node, ast.Call) and last_name(node) in _DYNAMIC:
            return None
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for attr, value in _pairs(t, node.value):
                    found[attr] = value
    return found


def _pairs(target: ast.AST, value: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    """``self.x = v`` -> (x, v); ``self.a, self.b = A(), B()`` pairs each; unpacking from
    something else (a generator) gives each name that whole value (a layer of unknown class)."""
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
            and target.value.id == "self":
        yield target.attr, value
    elif isinstance(target, ast.Tuple | ast.List):
        values = value.elts if isinstance(value, ast.Tuple | ast.List) \
            and len(value.elts) == len(target.elts) else [value] * len(target.elts)
        for t, v in zip(target.elts, values, strict=True):
            yield from _pairs(t, v)


def _element(value: ast.AST) -> str | None:
    """The local class built inside ``nn.ModuleList([Block() for _ in ...])``."""
    for node in ast.walk(value):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node is not value:
            return node.func.id
    return None


def _missing(classes: dict[str, ast.ClassDef], cls: str, key: str) -> str | None:
    """The first segment of ``key`` that no module of ``cls`` matches (None: all match, or
    the checker cannot tell)."""
    current: str | None = cls
    container = False
    for segment in key.split("."):
        if current is None:
            return None
        if container:  # a numbered child of a ModuleList: its class is the element's
            container = False
            if segment == "*" or segment.isdigit():
                continue
            return None
        children = _children(classes, current)
        if children is None:
            return None
        matched = [n for n in children if fnmatchcase(n, segment)]
        if not matched:
            return segment
        value = children[matched[0]]
        kind = last_name(value) if isinstance(value, ast.Call) else None
        if kind in _CONTAINERS:
            current, container = _element(value), True
        elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            current = value.func.id
        else:
            current = None  # a library layer: deeper segments are its own names
    return None


def plan_names_missing_module(facts: Facts) -> Iterator[Hit]:
    """SS215: a TP plan key that names no module of the (visible) model class."""
    classes = _classes(facts)
    for call, model, plan in _plans(facts):
        cls = _class_of(facts, model)
        if cls is None or cls not in classes:
            continue
        known = sorted(_children(classes, cls) or ())
        for key in plan.keys:
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                continue
            segment = _missing(classes, cls, key.value)
            if segment is None:
                continue
            yield Hit(key, f"the plan of `{facts.text(call, 50)}` names `{key.value}`, but "
                      f"`{segment}` is no submodule there (`{cls}` has {', '.join(known[:8])}): "
                      "`parallelize_module` fails on this key, or with a wildcard silently "
                      "leaves the layer whole on every rank.",
                      "name the module by its path in `model.named_modules()` "
                      "(`layers.*.attn.q_proj`).")


def _forward_head(cls: ast.ClassDef | None) -> str | None:
    """``x`` when the class's forward returns ``self.x(...)`` (directly or through a name)."""
    if cls is None:
        return None
    forward = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward"), None)
    if forward is None:
        return None
    returns = [n.value for n in ast.walk(forward) if isinstance(n, ast.Return) and n.value is not None]
    if len(returns) != 1:
        return None
    value = returns[0]
    if isinstance(value, ast.Name):
        assigns = [n.value for n in ast.walk(forward) if isinstance(n, ast.Assign)
                   and any(isinstance(t, ast.Name) and t.id == value.id for t in n.targets)]
        value = assigns[-1] if assigns else value
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
            and isinstance(value.func.value, ast.Name) and value.func.value.id == "self":
        return value.func.attr
    return None


def _local_shard(style: ast.AST) -> bool:
    """``ColwiseParallel(...)`` that hands the next op its local shard of the output."""
    if not (isinstance(style, ast.Call) and last_name(style) == "ColwiseParallel"):
        return False
    local = _keyword(style, "use_local_output")
    if isinstance(local, ast.Constant) and local.value is False:
        return False
    layouts = _keyword(style, "output_layouts")
    return layouts is None or not any(last_name(n) == "Replicate" for n in ast.walk(layouts)
                                      if isinstance(n, ast.Call))


def _has_tp_mesh(facts: Facts) -> bool:
    for call in facts.init_calls():
        mesh = _keyword(call, "mesh")
        if isinstance(mesh, ast.Dict) and any(
                isinstance(k, ast.Constant) and k.value == "tp" for k in mesh.keys):
            return True
    for call, _ in facts.calls:
        if last_name(call) == "init_device_mesh":
            names = _keyword(call, "mesh_dim_names")
            if names is not None and any(isinstance(n, ast.Constant) and n.value == "tp"
                                         for n in ast.walk(names)):
                return True
    return False


def _world_reduce(facts: Facts) -> Iterator[ast.Call]:
    """``all_reduce(x)`` summing over the whole world (no group), never divided by its size."""
    for call in facts.named_calls("all_reduce"):
        if len(call.args) > 2 or _keyword(call, "group") is not None:
            continue
        op = call.args[1] if len(call.args) > 1 else _keyword(call, "op")
        if op is not None and (last_name(op) or "") in _SAFE_OPS:
            continue
        scope = facts.scope(call)
        divided = any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div)
                      and "world_size" in facts.text(n.right, 200)
                      for n in facts.walk_scope(scope))
        if not divided:
            yield call


def loss_not_reduced_over_tp(facts: Facts) -> Iterator[Hit]:
    """SS216: a loss computed on the local shard of a Colwise output layer, or a sum over the
    world that counts each TP replica tp times."""
    classes = _classes(facts)
    for _call, model, plan in _plans(facts):
        cls = _class_of(facts, model)
        head = _forward_head(classes.get(cls or ""))
        for key, style in zip(plan.keys, plan.values, strict=True):
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                continue
            last = key.value.rsplit(".", 1)[-1]
            is_head = last == head if head is not None else last in _HEADS
            if is_head and _local_shard(style):
                yield Hit(style, f"`{key.value}` is the model's output layer and "
                          f"`{facts.text(style, 50)}` hands the loss its local shard: each rank "
                          "of the TP group sees only its columns of the logits, so the "
                          "cross-entropy's softmax runs over a slice of the vocabulary and the "
                          "loss is never reduced over the TP group.",
                          "`ColwiseParallel(output_layouts=Replicate())` to gather the "
                          "logits, or `use_local_output=False` with the loss under "
                          "`torch.distributed.tensor.parallel.loss_parallel()`.")
    if not _has_tp_mesh(facts):
        return
    for call in _world_reduce(facts):
        yield Hit(call, f"`{facts.text(call, 50)}` sums over every rank of a mesh with a `tp` "
                  "dimension: the ranks of a TP group hold the same value, so each replica is "
                  "counted tp times.",
                  "reduce over the data-parallel group (`group=mesh[\"dp\"].get_group()` or "
                  "`run.mesh` likewise), or divide by the world size for a mean.")


RULES = (
    Rule("SS215", "tp-plan-unknown-module", "error",
         "a tensor-parallel plan names a module the model class does not have",
         "A key of a `tp_plan` / `parallelize_module` plan is a path in "
         "`model.named_modules()`. A key naming no module (a typo, `attention.wq` for a class "
         "whose attribute is `attn`) makes `parallelize_module` raise, or, with a wildcard, "
         "match nothing: the layer stays whole on every rank and the memory TP was meant to "
         "save is not saved. Checked only against a model class defined in the file whose "
         "submodules are all plain `self.x = ...` assignments. Known false positives: a module the class "
         "registers in a way the checker reads as absent (a submodule set by a helper method).", plan_names_missing_module),
    Rule("SS216", "tp-loss-not-reduced", "error",
         "a loss or metric not reduced over the tensor-parallel group",
         "Under tensor parallelism an output layer planned `ColwiseParallel()` returns each "
         "rank's columns of the logits (`use_local_output=True`, `output_layouts=Shard(-1)`): "
         "a cross-entropy on them is a softmax over part of the vocabulary, different on each "
         "rank of the TP group. On a mesh with a `tp` dimension an `all_reduce` with no group "
         "sums over every rank, so a count or a sum of losses counts each replica tp times. "
         "Known false positives: a value that differs across the TP group on purpose.",
         loss_not_reduced_over_tp),
)
