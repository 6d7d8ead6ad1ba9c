"""Device placement: hard-coded CUDA (SS101) and a model and its input on different
devices (SS102). CUDA named by a bare index is in :mod:`splitsync.check.rules.indices`."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from splitsync.check.availability import availability_guarded
from splitsync.check.evidence import cuda_only_reason, parameterless, test_or_benchmark
from splitsync.check.facts import Facts, dotted, last_name
from splitsync.check.model import Hit, Rule
from splitsync.check.rules.common import FACTORIES, cuda_literal, overridable_default

__all__ = ["RULES"]

_PORTABLE = ('pick the device once, `device = torch.device("cuda" if torch.cuda.is_available() '
             'else "cpu")` (in splitsync: `run.device`), and move with `.to(device)`')
_DTYPES = frozenset({"float", "float16", "float32", "float64", "half", "double", "bfloat16",
                     "long", "int", "int32", "int64", "int8", "uint8", "bool", "complex64"})
_NOT_MODULES = frozenset({"DataLoader", "DistributedSampler", "TensorDataset", "Dataset",
                          "SGD", "Adam", "AdamW", "GradScaler", "Generator", "Size", "device"})





def _device_position(facts: Facts, node: ast.AST) -> ast.AST | None:
    """The call or assignment that uses ``node`` as a device, if it does."""
    parent = facts.parents.get(node)
    if isinstance(parent, ast.IfExp):  # `"cuda" if ... else "cpu"` is portable by construction
        return None
    if isinstance(parent, ast.keyword) and parent.arg in {"device", "map_location"}:
        return facts.parents.get(parent)
    if isinstance(parent, ast.Call) and node in parent.args[:1]:
        if facts.is_torch(parent, "device", "set_default_device") or last_name(parent) == "to":
            return parent
    if isinstance(parent, ast.Assign) and any(
            "dev" in (dotted(t) or "").lower() for t in parent.targets):
        return parent
    return None




def _cli_default(facts: Facts) -> Iterator[tuple[ast.AST, ast.Call]]:
    """``parser.add_argument('--device', default='cuda')``: a default the user can change."""
    for call in facts.method_calls("add_argument"):
        names = [a.value for a in call.args if isinstance(a, ast.Constant)]
        default = next((k.value for k in call.keywords if k.arg == "default"), None)
        if default is not None and cuda_literal(default) and any(
                "device" in str(n).lower() for n in names):
            yield default, call


def _overridden_default(facts: Facts, node: ast.AST) -> bool:
    """``def training_loop(device=torch.device('cuda'))`` whose every call in the file passes
    ``device=``: the default is never used."""
    holder = node
    for parent in facts.ancestors(node):
        if isinstance(parent, ast.arguments):
            fn = facts.parents.get(parent)
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                return False
            names = [a.arg for a in (*parent.posonlyargs, *parent.args, *parent.kwonlyargs)]
            defaults = dict(zip(reversed([a.arg for a in (*parent.posonlyargs, *parent.args)]),
                                reversed(parent.defaults), strict=False))
            defaults.update({a.arg: d for a, d in zip(parent.kwonlyargs, parent.kw_defaults,
                                                      strict=True) if d is not None})
            param = next((n for n, d in defaults.items() if d is holder), None)
            if param is None or param not in names:
                return False
            index = names.index(param)
            sites = [c for c, _ in facts.calls if last_name(c) == fn.name]
            return bool(sites) and all(
                any(k.arg == param for k in c.keywords) or len(c.args) > index
                - (1 if isinstance(facts.parents.get(fn), ast.ClassDef) else 0) for c in sites)
        holder = parent
    return False


_FRAMEWORKS = frozenset({"Fabric", "Trainer"})


def _framework_accelerator(facts: Facts) -> Iterator[Hit]:
    """``L.Fabric(accelerator="cuda")``: the framework is told to use CUDA whatever the machine."""
    for call in facts.named_calls(*_FRAMEWORKS):
        full = facts.resolve(call.func) or ""
        if not full.startswith(("lightning", "pytorch_lightning", "lightning_fabric")):
            continue
        value = next((k.value for k in call.keywords if k.arg == "accelerator"), None)
        if isinstance(value, ast.Constant) and str(value.value).lower() in {"cuda", "gpu"} \
                and not availability_guarded(facts, call):
            yield Hit(value, f"`{facts.text(call, 120)}` pins the accelerator to "
                      f"{value.value!r}: on a machine without CUDA GPUs the script fails at "
                      "start-up, although Fabric picks the device itself.",
                      "leave `accelerator=\"auto\"` (the default): Fabric then uses the GPUs "
                      "when there are some and the CPU otherwise.")


def hard_coded_cuda(facts: Facts) -> Iterator[Hit]:
    """SS101: ``.cuda()``, ``"cuda"`` literals and unconditional CUDA calls (not in test or
    benchmark code, which measures the GPU on purpose)."""
    if cuda_only_reason(facts):
        return  # the file imports CUDA-only kernels (triton, flash_attn ...): no CPU path to keep
    for hit in (*_framework_accelerator(facts), *_hard_coded_cuda(facts)):
        if not test_or_benchmark(facts, hit.node):
            yield hit


def _hard_coded_cuda(facts: Facts) -> Iterator[Hit]:
    for default, call in _cli_default(facts):
        yield Hit(default, f"`{facts.text(call, 120)}` defaults to CUDA: an overridable default, "
                  "so a machine without GPUs needs the flag changed on every run.",
                  "default to what is available, `default=\"cuda\" if torch.cuda.is_available() "
                  "else \"cpu\"` (splitsync's run.device picks it per rank).", severity="info")
    for call in facts.method_calls("cuda"):
        if facts.resolve(call.func) == "torch.cuda" or availability_guarded(facts, call):
            continue
        if parameterless(facts, call.func.value):  # type: ignore[attr-defined]
            continue  # `nn.CrossEntropyLoss().cuda()` moves nothing: the loss holds no tensors
        yield Hit(call, f"`{facts.text(call)}` hard-codes CUDA with `.cuda()`: on a machine without "
                  "an NVIDIA GPU it raises (\"Torch not compiled with CUDA enabled\" / \"No CUDA "
                  "GPUs are available\").", f"{_PORTABLE} instead of `.cuda()`.")
    for node in facts.of(ast.Constant, ast.BinOp, ast.JoinedStr):  # what cuda_literal reads
        literal = cuda_literal(node)
        where = _device_position(facts, node) if literal else None
        if where is None or availability_guarded(facts, node) or _overridden_default(facts, node):
            continue
        if overridable_default(facts, where):
            yield Hit(node, f"`{facts.text(where)}` is an overridable default (the configuration "
                      "executed after it can replace it), but as written a run without "
                      "arguments needs CUDA.", "default to what is available: "
                      "`device = \"cuda\" if torch.cuda.is_available() else \"cpu\"`.",
                      severity="info")
            continue
        shared = (" In this distributed script every rank would also use that same GPU."
                  if facts.is_distributed and literal in {"cuda:0", "cuda"} else "")
        shown = repr(literal) if isinstance(node, ast.Constant) else literal
        yield Hit(node, f"device hard-coded to {shown} in `{facts.text(where)}`: the script fails "
                  f"on a machine without CUDA GPUs.{shared}",
                  f"{_PORTABLE}; under torchrun use `torch.device(\"cuda\", local_rank)` only "
                  "when `torch.cuda.is_available()`.")
    for call in facts.calls:
        c = call[0]
        if facts.resolve(c.func) == "torch.cuda.set_device" and not availability_guarded(facts, c):
            yield Hit(c, f"`{facts.text(c)}` runs unconditionally: on a machine without GPUs it raises.",
                      "call it only under `if torch.cuda.is_available():` "
                      "(splitsync.init() does this for you).")
    for node in facts.of(ast.BinOp):
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod | ast.FloorDiv)
                and isinstance(node.right, ast.Call)
                and facts.resolve(node.right.func) == "torch.cuda.device_count"
                and not availability_guarded(facts, node)):
            yield Hit(node, f"`{facts.text(node)}` divides by `torch.cuda.device_count()`, which is 0 "
                      "on a machine without GPUs: ZeroDivisionError.",
                      "take the launcher's local rank, `int(os.environ[\"LOCAL_RANK\"])`, and use "
                      "it as a CUDA index only when `torch.cuda.is_available()`.")


# --- SS102 -------------------------------------------------------------------------------

def _place_of_arg(facts: Facts, arg: ast.AST, known: dict[str, str]) -> str | None:
    if isinstance(arg, ast.Constant):
        if isinstance(arg.value, int) and not isinstance(arg.value, bool):
            return "cuda"
        text = str(arg.value).lower()
        return "cpu" if text.startswith("cpu") else "cuda" if text.startswith("cuda") else None
    if cuda_literal(arg):
        return "cuda"
    name = dotted(arg)
    if name is None or (last_name(arg) or "") in _DTYPES:
        return None
    if isinstance(arg, ast.Attribute) and facts.is_run(arg.value) and arg.attr == "device":
        return "run"
    return None if name in known else f"var:{name}"


def _place(facts: Facts, expr: ast.AST, models: dict[str, str], tensors: dict[str, str],
           want_model: bool) -> str | None:
    """Where ``expr`` lives, when it is a model (or tensor) we can follow; else None."""
    table = models if want_model else tensors
    if isinstance(expr, ast.Name):
        return table.get(expr.id)
    if not isinstance(expr, ast.Call):
        return None
    func = expr.func
    if isinstance(func, ast.Attribute):
        if func.attr == "cuda":
            inner = _place(facts, func.value, models, tensors, want_model)
            return "cuda" if inner else None
        if func.attr == "cpu":
            return "cpu" if _place(facts, func.value, models, tensors, want_model) else None
        if func.attr == "to":
            inner = _place(facts, func.value, models, tensors, want_model)
            if inner is None:
                return None
            arg = expr.args[0] if expr.args else next(
                (k.value for k in expr.keywords if k.arg == "device"), None)
            moved = _place_of_arg(facts, arg, {**models, **tensors}) if arg is not None else None
            return moved or inner
        if want_model and func.attr == "model" and facts.is_run(func.value):
            return "run"
        if not want_model and func.attr == "to_device" and facts.is_run(func.value):
            return "run"
    if want_model:
        if facts.is_torch(expr, "DistributedDataParallel", "DataParallel") and expr.args:
            if len(expr.args) > 1 or any(k.arg == "device_ids" for k in expr.keywords):
                return None  # DDP(model, device_ids=[i]) moves its inputs to device i itself
            return _place(facts, expr.args[0], models, tensors, True)
        if any(k.arg == "device" for k in expr.keywords):
            return None  # `Net(..., device="cuda")` is built where it says: follow no further
        return "cpu" if _is_module_ctor(facts, expr) else None
    if facts.is_torch(expr, *FACTORIES) and isinstance(func, ast.Attribute):
        device = next((k.value for k in expr.keywords if k.arg == "device"), None)
        return (_place_of_arg(facts, device, tensors) if device is not None else "cpu")
    return None


def _is_module_ctor(facts: Facts, call: ast.Call) -> bool:
    full = facts.resolve(call.func) or ""
    name = full.rsplit(".", 1)[-1]
    if not name[:1].isupper() or name in _NOT_MODULES:
        return False
    if full.startswith("torch.nn.") or name in facts.classes:
        return True
    return "." not in full and name not in facts.aliases  # a class from the lesson's other file


def _describe(place: str, line: int | None) -> str:
    if place == "cpu":
        return "on the CPU" + (f" (line {line}, never moved)" if line else "")
    if place == "cuda":
        return "on a CUDA GPU" + (f" (line {line})" if line else "")
    if place == "run":
        return "on run.device"
    return f"on `{place[4:]}`" + (f" (line {line})" if line else "")


def device_mismatch(facts: Facts) -> Iterator[Hit]:
    """SS102: ``model(x)`` where the model and ``x`` were put on different devices."""
    scopes = [facts.tree, *facts.of(ast.FunctionDef, ast.AsyncFunctionDef)]
    for scope in scopes:
        if scope is not facts.tree:
            text = "".join(facts.lines[scope.lineno - 1:scope.end_lineno])  # type: ignore[attr-defined]
            if not any(word in text for word in (".to(", ".cuda(", ".cpu(", "device")):
                continue  # nothing in this function places a model or a tensor
        models: dict[str, str] = {}
        tensors: dict[str, str] = {}
        lines: dict[str, int] = {}
        checked: set[int] = set()
        for node in facts.walk_scope(scope):
            # calls on the right of `x = model(x)` are checked before `x` is rebound
            inner = facts.subtree(node.value) if isinstance(node, ast.Assign) else [node]
            for call in inner:
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) \
                        and call.args and id(call) not in checked:
                    checked.add(id(call))
                    hit = _check_call(facts, call, models, tensors, lines)
                    if hit:
                        yield hit
            if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                    and isinstance(node.targets[0], ast.Name):
                name = node.targets[0].id
                m = _place(facts, node.value, models, tensors, True)
                t = _place(facts, node.value, models, tensors, False)
                models.pop(name, None)
                tensors.pop(name, None)
                if m:
                    models[name] = m
                if t:
                    tensors[name] = t
                lines[name] = node.lineno
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                func = node.value.func  # `model.to(device)` moves a module in place
                if isinstance(func, ast.Attribute) and func.attr in {"to", "cuda", "cpu"} \
                        and isinstance(func.value, ast.Name) and func.value.id in models:
                    moved = _place(facts, node.value, models, tensors, True)
                    if moved:
                        models[func.value.id] = moved
                        lines[func.value.id] = node.lineno


def _check_call(facts: Facts, call: ast.Call, models: dict[str, str], tensors: dict[str, str],
                lines: dict[str, int]) -> Hit | None:
    model = call.func.id  # type: ignore[attr-defined]
    if model not in models:
        return None
    arg = call.args[0]
    x_place = _place(facts, arg, models, tensors, False)
    m_place = models[model]
    if x_place is None or x_place == m_place or "cpu" not in {x_place, m_place}:
        return None
    x_name = arg.id if isinstance(arg, ast.Name) else facts.text(arg, 40)
    x_line = lines.get(arg.id) if isinstance(arg, ast.Name) else None
    return Hit(call, f"`{facts.text(call)}` mixes devices: `{model}` is "
               f"{_describe(m_place, lines.get(model))} but `{x_name}` is "
               f"{_describe(x_place, x_line)}; this raises \"RuntimeError: Expected all tensors "
               "to be on the same device\".",
               f"move the model and its inputs with the same device variable: "
               f"`{model} = {model}.to(device)` and `{x_name} = {x_name}.to(device)` "
               "(in splitsync: `run.model(...)` and batches from `run.loader(...)`).")


RULES = (
    Rule("SS101", "hard-coded-cuda", "warning",
         "CUDA hard-coded (.cuda(), \"cuda\" literals, unconditional torch.cuda calls)",
         "A script that names CUDA directly fails on a laptop, a CPU CI runner or an Apple/Intel "
         "GPU machine. Choose the device once from what is available and move everything with "
         ".to(device); splitsync's run.device does this per rank. A CUDA default that the "
         "command line or an exec'd configuration file overrides is reported once, as info. "
         "Known false positives: scripts that are CUDA-only by design (the check then is "
         "about portability, not correctness) and CUDA calls guarded by an availability test "
         "the checker does not recognise.", hard_coded_cuda),
    Rule("SS102", "device-mismatch", "error",
         "model and its input placed on different devices in the same scope",
         "The lesson's first common mistake: a model left on the CPU called with a tensor moved "
         "to the GPU (or the reverse) raises \"Expected all tensors to be on the same device\". "
         "A model wrapped in DDP(model, device_ids=[i]) moves its inputs to device i itself, "
         "so its inputs are not checked. Known false positives: models whose forward moves "
         "the input itself (model parallel), which the checker cannot see.", device_mismatch),
)
