"""Device-mismatch guard: a forward that mixes devices says which tensors are where, and why."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from splitsync.errors import DeviceMismatchError
from splitsync.observers.guards.hangs import is_comm_failure

__all__ = ["DeviceMismatchError", "guard_forward", "is_device_error", "describe_devices"]

_PATTERNS = ("same device", "not on the expected device")
_SHOW = 4  # names listed per device before "and N more"


def is_device_error(exc: BaseException) -> bool:
    """True for PyTorch's "expected all tensors to be on the same device" family of errors."""
    return isinstance(exc, RuntimeError) and any(p in str(exc) for p in _PATTERNS)


def _tensors(obj: Any, path: str) -> Iterator[tuple[str, torch.Tensor]]:
    from splitsync.tree import iter_tensors

    return iter_tensors(obj, path)


def _by_device(items: Iterator[tuple[str, torch.Tensor]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, t in items:
        out.setdefault(str(t.device), []).append(name)
    return out


def _fmt(kind: str, groups: dict[str, list[str]]) -> list[str]:
    lines = []
    for dev, names in groups.items():
        more = f" and {len(names) - _SHOW} more" if len(names) > _SHOW else ""
        lines.append(f"  {kind} on {dev}: {', '.join(names[:_SHOW])}{more}")
    return lines


def describe_devices(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                     expected: torch.device, original: BaseException) -> str:
    """The message of a DeviceMismatchError: every tensor group, its device, and the fix."""
    from splitsync.strategies import unwrap

    module = unwrap(module)  # the user's own names, without DDP's "module." prefix
    params = _by_device(iter(module.named_parameters()))
    buffers = _by_device(iter(module.named_buffers()))
    inputs = _by_device(_tensors(list(args), "input").__iter__())
    inputs.update(_by_device(_tensors(kwargs, "input")))
    devices = set(params) | set(buffers) | set(inputs)
    lines = [f"The forward of {type(module).__name__} mixed devices (the run's device is "
             f"{expected}). PyTorch said: {original}"]
    lines += _fmt("parameters", params) + _fmt("buffers", buffers) + _fmt("inputs", inputs)
    if len(devices) <= 1:
        lines.append("  All parameters, buffers and inputs are on the same device, so a tensor "
                     "created inside forward() is on another one.")
    lines.append(
        "Fix: let splitsync place things: model = run.model(net) moves parameters and "
        "buffers; batches from run.loader(...) or run.to_device(batch) arrive on the device. "
        "Inside forward, create tensors with device=x.device (never .cuda() or the CPU "
        "default), and register fixed tensors with self.register_buffer(...) so they move "
        "with the model."
    )
    return "\n".join(lines)


class GuardedForward:
    """Replaces ``module.forward`` on the instance; re-raises device errors with an explanation.

    Costs one Python call per forward. Copies and pickles of the module keep a guard bound to
    the copy, never to the original.
    """

    def __init__(self, module: nn.Module, expected: torch.device, watch: Any = None) -> None:
        self.module = module
        self.expected = expected
        self.watch = watch  # hangs.Watch: DDP's forward communicates (buffers, buckets)
        inner = module.__dict__.get("forward")
        self.inner = inner if inner is not None else type(module).forward.__get__(module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.inner(*args, **kwargs)
        except RuntimeError as exc:
            if self.watch is not None and is_comm_failure(exc):
                raise self.watch.explain(exc, "forward", counted=False) from exc
            if not is_device_error(exc):
                raise
            raise DeviceMismatchError(
                describe_devices(self.module, args, kwargs, self.expected, exc)) from exc

    def __deepcopy__(self, memo: dict[int, Any]) -> GuardedForward:
        twin = memo.get(id(self.module))
        if twin is None:
            twin = copy.deepcopy(self.module, memo)
        return GuardedForward(twin, self.expected)  # a copy is not part of the job's group

    def __reduce__(self) -> tuple[Any, ...]:
        return (GuardedForward, (self.module, self.expected))


def guard_forward(module: nn.Module, expected: torch.device, watch: Any = None) -> nn.Module:
    """Install the guard on ``module`` (the outermost wrapper the user calls); returns it."""
    if not isinstance(module.__dict__.get("forward"), GuardedForward):
        module.forward = GuardedForward(module, expected, watch)  # type: ignore[method-assign]
    return module
