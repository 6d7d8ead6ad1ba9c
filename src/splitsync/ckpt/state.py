"""Training state in forms that load with ``weights_only=True``: model and optimizer state
through one path for every strategy, RNG and loader positions, and what each saved object is.

Plain modules, DDP, compiled modules and FSDP2 (on a 1-D or 2-D mesh) all go through
``torch.distributed.checkpoint.state_dict`` (``get_/set_model_state_dict`` and
``get_/set_optimizer_state_dict``): parameter names without wrapper prefixes, optimizer
state keyed by those names. The strategy says only which module holds the state
(:meth:`Strategy.state_module`) and whether it is sharded.

A save records each object's class name and kind (model, optimizer, scheduler, ...) in the
manifest (``types`` and ``kinds``) so that ``splitsync ckpt inspect`` can say what a
checkpoint holds without importing the user's code; older manifests are classified from the
saved state's keys."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from splitsync.ckpt.staging import live_storages
from splitsync.data.build import ResumableLoader
from splitsync.distributed.rng import capture_rng, restore_rng  # kept importable from here
from splitsync.distributed.seeding import Generators
from splitsync.errors import CheckpointError
from splitsync.strategies import for_model
from splitsync.strategies.modules import unwrap
from splitsync.strategies.state import optimizer_to_fqn

__all__ = ["Registered", "register", "RESERVED", "split_extra", "capture_rng", "restore_rng", "loader_position", "restore_loader", "check_shapes", "owner_of", "model_state", "optimizer_state", "load_model_state", "load_optimizer_state", "state_shapes", "check_optimizer_names", "is_sharded", "split_state", "KINDS", "type_name", "kind_of", "kind_from_state", "described"]

# --- loaders (through the protocol both kinds share: splitsync.data.build.ResumableLoader) ---
def loader_position(loader: ResumableLoader) -> tuple[dict[str, Any], torch.Tensor | None]:
    """Where ``loader`` continues from (collective for streams), and this rank's generator
    state that goes with it."""
    return loader.position(), loader.rng_state()


def restore_loader(loader: ResumableLoader, pos: Mapping[str, Any],
                   generator_state: torch.Tensor | None) -> None:
    """Make ``loader`` continue at ``pos``; a position of the other kind is refused."""
    try:
        loader.restore(pos, generator_state)
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None


# --- models and optimizers ----------------------------------------------------------------
def check_shapes(name: str, saved: Mapping[str, Sequence[int]],
                 current: Mapping[str, Sequence[int]], where: str) -> None:
    """Raise naming the first key whose presence or shape differs (nothing is loaded)."""
    for key in sorted(set(saved) | set(current)):
        if key not in current:
            raise CheckpointError(f"checkpoint {where} does not fit {name!r}: it has {key!r} "
                                  f"(shape {tuple(saved[key])}), which the model lacks")
        if key not in saved:
            raise CheckpointError(f"checkpoint {where} does not fit {name!r}: the model's "
                                  f"{key!r} (shape {tuple(current[key])}) is not in it")
        if tuple(saved[key]) != tuple(current[key]):
            raise CheckpointError(
                f"checkpoint {where} does not fit {name!r}: {key!r} has shape "
                f"{tuple(saved[key])} in the checkpoint but {tuple(current[key])} in the model")


def owner_of(optimizer: torch.optim.Optimizer, models: Mapping[str, nn.Module]) -> str:
    """The registered model holding every parameter of ``optimizer``."""
    params = {id(p) for g in optimizer.param_groups for p in g["params"]}
    for name, m in models.items():
        if params <= {id(p) for p in m.parameters()}:
            return name
    raise CheckpointError("an optimizer's parameters do not all belong to one registered model; "
                          "pass the model that owns them to run.resume(...) as well.")


def _options(full: bool, offload: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=full, cpu_offload=offload)


def _holder(model: nn.Module) -> nn.Module:
    return for_model(model).state_module(model)


def is_sharded(model: nn.Module) -> bool:
    """Whether the model's state lives in shards (written through DCP by every rank)."""
    return for_model(model).is_sharded(model)


def model_state(model: nn.Module, *, full: bool, offload: bool) -> dict[str, Any]:
    """The model's state by the user's names. ``full``: whole tensors (collective when
    sharded, kept on rank 0 only with ``offload``); else this rank's shards as DTensors.
    ``offload``: on CPU. Unsharded CPU tensors are the live ones (views, not copies)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(_holder(model), options=_options(full, offload))


def optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, *, full: bool,
                    offload: bool, template: bool = False) -> dict[str, Any]:
    """The optimizer's state keyed by parameter names (layout of
    ``get_optimizer_state_dict``). An optimizer that has not stepped yet is saved as it is:
    DCP would make its state by taking a step with lr 0, which changes what an uninterrupted
    run does next (and would happen on rank 0 only for unsharded models). ``template``: a
    state to load into, so DCP may make it (what is loaded replaces it)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    if not optimizer.state and not template and not is_sharded(model):
        return optimizer_to_fqn(_holder(model), optimizer)
    return get_optimizer_state_dict(_holder(model), optimizer, options=_options(full, offload))


def load_model_state(model: nn.Module, state: Mapping[str, Any], *, full: bool) -> None:
    """Load a state dict by the user's names (``full``: whole tensors, resharded here)."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(_holder(model), dict(state), options=_options(full, False))


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer,
                         state: Mapping[str, Any], *, full: bool) -> None:
    """Load a name-keyed optimizer state (``full``: whole tensors, resharded here)."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    # DCP first gives an optimizer without state one, by stepping it with zero gradients at
    # lr 0: a whole optimizer step (AdamW's state allocated and swept, most of a resume's
    # time), whose state load_state_dict then replaces, and which an optimizer that changes
    # parameters whatever its lr would apply to the weights just loaded. Loading unsharded
    # state needs none of it (DCP pairs names with parameters and calls load_state_dict);
    # DCP skips that step for an optimizer whose state is not empty.
    first = next((p for g in optimizer.param_groups for p in g["params"]), None)
    marked = not full and not optimizer.state and first is not None and not is_sharded(model)
    if marked:
        optimizer.state[first] = {}
    try:
        set_optimizer_state_dict(_holder(model), optimizer, dict(state),
                                 options=_options(full, False))
    except BaseException:
        if marked and optimizer.state.get(first) == {}:  # a failed load leaves no mark
            del optimizer.state[first]
        raise


def state_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Global shapes of the model's state by the user's names (no communication)."""
    return {k: tuple(v.shape) for k, v in model_state(model, full=False, offload=False).items()
            if isinstance(v, torch.Tensor)}


def check_optimizer_names(model: nn.Module, optimizer: torch.optim.Optimizer,
                          state: Mapping[str, Any]) -> None:
    """Raise if a saved optimizer state names a parameter this optimizer does not hold."""
    ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
    mine = {n for n, p in unwrap(model).named_parameters() if id(p) in ids}
    for name in [*state.get("state", {}),
                 *(n for g in state.get("param_groups", []) for n in g.get("params", []))]:
        if name not in mine:
            raise CheckpointError(f"the optimizer state names parameter {name!r}, which this "
                                  "optimizer does not hold")


# The order inspect lists them in.
KINDS = ("model", "optimizer", "scheduler", "scaler", "ema", "object")

# Words in the class names of exponential / stochastic weight averages (torch's
# AveragedModel, timm's ModelEmaV3, ExponentialMovingAverage, ...) or in the names they are
# registered under (``ema=``); whole words, so "schema" is no EMA.
_EMA_WORDS = {"ema", "swa", "averaged"}
_WRAPPERS = ("torch.nn.parallel", "torch._dynamo", "splitsync.strategies.ddp")


def _first_user_class(obj: Any) -> type:
    """The object's class, skipping classes torch.distributed makes on the fly (FSDP2's
    ``FSDPLinear`` and the like subclass the user's class)."""
    for cls in type(obj).__mro__:
        if not cls.__module__.startswith("torch.distributed"):
            return cls
    return type(obj)


def _unwrapped(obj: Any) -> Any:
    """The module under DDP / DataParallel / torch.compile wrappers (not under modules that
    merely hold another, such as torch's AveragedModel: those are what was saved)."""
    while isinstance(obj, nn.Module) and type(obj).__module__.startswith(_WRAPPERS):
        inner = getattr(obj, "module", None) or getattr(obj, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            break
        obj = inner
    return obj


def type_name(obj: Any) -> str:
    """``module.QualName`` of the object (the user's module for a wrapped model)."""
    cls = _first_user_class(_unwrapped(obj))
    return f"{cls.__module__}.{cls.__qualname__}"


def _words(name: str) -> set[str]:
    """``ModelEmaV2`` -> {"model", "ema", "v2"}; ``ema_model`` -> {"ema", "model"}."""
    leaf = name.rsplit(".", 1)[-1]
    return {w.lower() for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", leaf)}


def _looks_ema(name: str) -> bool:
    words = _words(name)
    return bool(words & _EMA_WORDS) or {"moving", "average"} <= words


def kind_of(obj: Any, name: str = "") -> str:
    """One of :data:`KINDS` for a live object registered with ``run.resume`` (as ``name``)."""
    import torch

    if _looks_ema(type_name(obj)) or (_looks_ema(name) and not isinstance(
            obj, (torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler))):
        return "ema"
    if isinstance(obj, nn.Module):
        return "model"
    if isinstance(obj, torch.optim.Optimizer):
        return "optimizer"
    if isinstance(obj, torch.optim.lr_scheduler.LRScheduler):
        return "scheduler"
    if isinstance(obj, torch.amp.GradScaler):  # torch.cuda.amp's subclasses it
        return "scaler"
    return "object"


def kind_from_state(name: str, type_: str | None, state: Any) -> str:
    """The kind of a saved object known only by its name, class name (if recorded) and
    state dict: for manifests that did not record kinds."""
    if type_ and _looks_ema(type_):
        return "ema"
    if type_ and ("lr_scheduler" in type_ or type_.endswith("LR")):
        return "scheduler"
    if type_ and type_.endswith("GradScaler"):
        return "scaler"
    keys = set(state) if isinstance(state, Mapping) else set()
    if {"last_epoch", "base_lrs"} <= keys:
        return "scheduler"
    if {"scale", "growth_factor"} <= keys:
        return "scaler"
    if _looks_ema(name) or "shadow" in keys:
        return "ema"
    return "object"


def described(models: Mapping[str, nn.Module], optims: Mapping[str, tuple[Any, str]],
              others: Mapping[str, Any]) -> dict[str, Any]:
    """Manifest keys saying which strategy wrapped each model and what each saved object is
    (``strategies``, ``types``, ``kinds``): ``splitsync ckpt inspect`` reads checkpoints
    without the user's code."""
    from splitsync.strategies import for_model

    objs = {**models, **{n: o for n, (o, _) in optims.items()}, **others}
    return {"strategies": {n: for_model(m).name for n, m in sorted(models.items())},
            "types": {n: type_name(o) for n, o in sorted(objs.items())},
            "kinds": {n: kind_of(o, n) for n, o in sorted(objs.items())}}


def split_extra(extra: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """JSON-serialisable extras go into the manifest, tensors (or containers of them) to a file."""
    plain, tensors = {}, {}
    for key, value in extra.items():
        try:
            json.dumps(value)
            plain[key] = value
            continue
        except (TypeError, ValueError):
            pass
        try:  # tensors in plain containers survive a weights_only round trip
            buf = io.BytesIO()
            torch.save(value, buf)
            buf.seek(0)
            torch.load(buf, weights_only=True)
        except Exception:
            raise TypeError(f"run.save(..., {key}=...): a {type(value).__name__} is neither "
                            "JSON-serialisable nor tensors in plain containers.") from None
        tensors[key] = value
    return plain, tensors


@dataclass(frozen=True)
class Registered:
    """What ``run.resume`` registered, and where this rank stands: all a save reads."""

    models: Mapping[str, nn.Module]
    optims: Mapping[str, tuple[torch.optim.Optimizer, str]]  # name -> (optimizer, its model)
    others: Mapping[str, Any]  # schedulers, scalers, ...: anything with state_dict()
    rank: int
    world_size: int
    keep: int
    generators: Generators | None = None  # the run's run.generator streams

    @property
    def sharded(self) -> bool:
        return any(is_sharded(m) for m in self.models.values())

    def live(self) -> frozenset[int]:
        """The CPU storages training mutates (what staging must copy)."""
        return live_storages(self.models.values(), (o for o, _ in self.optims.values()))


RESERVED = ("step", "epoch")


def register(objects: Mapping[str, Any], *, rank: int, world_size: int, keep: int,
             generators: Generators | None) -> Registered:
    """``run.resume``'s objects sorted into models, optimizers (each with the registered
    model that owns its parameters) and other stateful objects; a clear error for anything
    else, for the reserved names and for ``keep`` < 2."""
    if not isinstance(keep, int) or keep < 2:
        raise ValueError(f"keep={keep!r}: keep at least 2 checkpoints, so one complete "
                         "checkpoint always survives a crash during the next save.")
    bad = sorted(set(objects) & set(RESERVED))
    if bad:
        raise TypeError(f"run.resume(...) cannot register objects named {bad}; rename them.")
    models = {n: o for n, o in objects.items() if isinstance(o, nn.Module)}
    optims: dict[str, tuple[torch.optim.Optimizer, str]] = {}
    others: dict[str, Any] = {}
    for name, obj in objects.items():
        if isinstance(obj, nn.Module):
            continue
        if isinstance(obj, torch.optim.Optimizer):
            optims[name] = (obj, owner_of(obj, models))
        elif callable(getattr(obj, "state_dict", None)) and callable(
                getattr(obj, "load_state_dict", None)):
            others[name] = obj
        else:
            raise TypeError(f"run.resume(..., {name}=...): a {type(obj).__name__} has no "
                            "state_dict()/load_state_dict(); pass it to run.save() as an "
                            "extra instead.")
    return Registered(models=models, optims=optims, others=others, rank=rank,
                      world_size=world_size, keep=keep, generators=generators)


def split_state(state: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Fabric-style ``state`` dict split into objects to register (models, optimizers,
    anything with ``state_dict()``/``load_state_dict()``) and plain values (extras)."""
    objects = {k: v for k, v in state.items() if isinstance(v, (nn.Module, torch.optim.Optimizer))
               or (callable(getattr(v, "state_dict", None))
                   and callable(getattr(v, "load_state_dict", None)))}
    return objects, {k: v for k, v in state.items() if k not in objects}
