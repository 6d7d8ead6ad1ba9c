"""Numeric precision: autocast, GradScaler and parameter dtype for the four named policies.

``"32"``          plain fp32; no autocast context at all (nothing on the hot path).
``"bf16-mixed"``  fp32 parameters, forward under ``torch.autocast(dtype=bfloat16)``.
``"16-mixed"``    fp32 parameters, fp16 autocast and a GradScaler that skips steps whose
                  gradients hold inf/nan. CUDA (and other accelerators) only.
``"bf16-true"``   parameters (and floating-point inputs) in bfloat16, no autocast.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Precision", "PRECISIONS", "check_precision_name", "get_precision", "precision_on",
           "cast_inputs",
           "forward_with"]

PRECISIONS: tuple[str, ...] = ("32", "bf16-mixed", "16-mixed", "bf16-true")


def check_precision_name(name: object) -> str:
    """``name`` if it is a precision splitsync knows; else a ValueError naming the valid ones
    (the one check, used by RunConfig and :func:`get_precision`)."""
    if not isinstance(name, str) or name not in PRECISIONS:
        raise ValueError(
            f"Unknown precision {name!r}. Valid precisions: {', '.join(map(repr, PRECISIONS))}."
        )
    return name


@dataclass(frozen=True)
class Precision:
    """What one precision name means on one device."""

    name: str
    device_type: str
    autocast_dtype: torch.dtype | None  # None: forward runs without autocast
    param_dtype: torch.dtype | None  # None: parameters keep their dtype (fp32)
    scaled: bool  # a GradScaler scales the loss and skips inf/nan steps

    def autocast(self) -> AbstractContextManager[Any]:
        """The autocast context for the forward pass (a no-op for "32" and "bf16-true")."""
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device_type, dtype=self.autocast_dtype)

    def make_scaler(self, sharded: bool = False) -> Any:
        """A GradScaler for "16-mixed" (ShardedGradScaler for FSDP), else None."""
        if not self.scaled:
            return None
        if sharded:
            # Every rank sees only its gradient shard: found-inf must be all-reduced so that
            # all ranks skip the same steps.
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            return ShardedGradScaler(self.device_type)
        return torch.amp.GradScaler(self.device_type)


def get_precision(name: str, device: torch.device | str) -> Precision:
    """Validate ``name`` for ``device`` and describe it; raises ValueError with the fix."""
    return precision_on(check_precision_name(name), device)


def precision_on(name: str, device: torch.device | str) -> Precision:
    """A name :func:`check_precision_name` has passed (``RunConfig`` did), on ``device``:
    raises ValueError with the fix where the device cannot run it."""
    kind = torch.device(device).type
    if name == "32":
        return Precision(name, kind, None, None, False)
    if name == "bf16-mixed":
        return Precision(name, kind, torch.bfloat16, None, False)
    if name == "bf16-true":
        return Precision(name, kind, None, torch.bfloat16, False)
    if kind in ("cpu", "mps"):
        raise ValueError(
            f"precision='16-mixed' (float16 autocast with GradScaler) is not supported on "
            f"{kind}. Use precision='bf16-mixed' or precision='32' on {kind}, or run on a GPU."
        )
    return Precision(name, kind, torch.float16, None, True)


def cast_inputs(obj: Any, dtype: torch.dtype) -> Any:
    """Floating-point tensors in a nested batch cast to ``dtype`` (others untouched)."""
    from splitsync.tree import map_tensors

    return map_tensors(lambda t: t.to(dtype) if t.is_floating_point() else t, obj)


def forward_with(forward: Callable[..., Any], precision: Precision) -> Callable[..., Any]:
    """``forward`` run under the precision's autocast / with inputs cast to the param dtype."""
    dtype = precision.param_dtype
    if dtype is not None:
        def cast_forward(*args: Any, **kwargs: Any) -> Any:
            return forward(*cast_inputs(args, dtype), **cast_inputs(kwargs, dtype))

        return cast_forward
    if precision.autocast_dtype is None:
        return forward

    def autocast_forward(*args: Any, **kwargs: Any) -> Any:
        with precision.autocast():
            return forward(*args, **kwargs)

    return autocast_forward
