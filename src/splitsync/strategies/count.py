"""``run.backward(loss, count=n)``: how a wrapped model's gradient reduction divides by the
number of items on every rank instead of by the number of ranks.

Each backward of a counted window multiplies its loss (the micro-batch's mean) by
``n * unit``, so the gradients a rank accumulates are ``unit * sum(n_i * grad(mean_i))``.
``unit`` is a power of two, the same on every rank, that keeps those gradients near their
usual size (exact: scaling by a power of two changes no bit). The reduction must then
divide by ``unit * N``, where ``N`` is the items of the window on all ranks:

- DDP (:class:`DdpCount`): a comm hook appends this rank's count to one gradient bucket,
  the smallest of the previous backward's layout (the same on every rank; bucket 0 before
  any is known), so the all-reduce DDP does anyway also sums the counts; the other buckets
  are all-reduced in place. The division by ``unit * N`` replaces DDP's division by the
  world size. No collective of its own, and a copy of that one bucket only (a copy of
  every bucket would hold a second set of gradients, as much memory again). Should the
  chosen bucket not come (DDP laid its buckets out anew), the count is all-reduced apart. With one micro-batch per window the loss is not multiplied: the hook
  multiplies the gradient by ``n`` (``weight``) and divides by ``N``.
- FSDP2 and HSDP (:class:`FsdpCount`): the reduction averages over the ranks as usual;
  after the window's last backward ``N`` is all-reduced (one small all-reduce per
  optimizer step) and the rank's gradient shards, 1/world of the model, are multiplied by
  ``world / (unit * N)``. (FSDP2's ``set_gradient_divide_factor`` would save that pass, but
  its reduce-scatter over a group of one rank divides twice under gloo's sum-only
  reductions and float16/float64 gradients, as with HSDP ``shard=1``.)

Anything else (one process, DataParallel, a DDP model with a comm hook of the user's) is
rescaled by the step (``run/counting.py``).
"""

# No ``from __future__ import annotations``: DDP checks the comm hook's annotations as
# objects (``dist.GradBucket``), not as strings.
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["CountSync", "DdpCount", "FsdpCount"]


class CountSync:
    """One model's reduction under ``count=``: the base does nothing (a model whose
    gradients the step rescales)."""

    def __init__(self, model: nn.Module) -> None:
        # weak: the run keeps one of these per model, and must not keep the model alive
        self._model = weakref.ref(model)

    @property
    def model(self) -> nn.Module | None:
        return self._model()

    def parameters(self) -> Iterator[torch.Tensor]:
        """The parameters whose reduction this object divides by the count."""
        model = self.model
        return iter(()) if model is None else model.parameters()

    #: Whether :meth:`before` can weigh the local gradient itself (``weight``), so that a
    #: window of one micro-batch needs no multiplication of its loss.
    weighs = False

    def before(self, local: float, unit: float, weight: float = 1.0) -> None:
        """Before the window's last backward: this rank's count, the unit, and (when
        :attr:`weighs`) a factor for the local gradient."""

    def after(self, total: Callable[[], float]) -> float | torch.Tensor | None:
        """After that backward: complete the division; ``total()`` gives the count on all
        ranks (an all-reduce the first time). Returns the total if it learnt it itself (a
        tensor when it is still on the device)."""
        return None


class _HookState:
    """What :func:`_count_hook` reads: set around the last backward of a counted window."""

    def __init__(self, group: Any) -> None:
        # imported once here, not in the hook: an import statement runs at every bucket
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        self.group = group
        self.average = default_hooks.allreduce_hook  # a backward outside a counted window
        self.counting = False
        self.slot = 0.0  # this rank's count in the window
        self.unit = 1.0
        self.weight = 1.0  # what the local gradient is multiplied by as it is packed
        # the first bucket's buffer address, the packed tensor (its gradients and one more
        # element for the count) with its two parts, and a future completed with the bucket;
        # reused from step to step. Index 0 only: the other buckets need no copy.
        self.packed: dict[int, tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, Any]] = {}
        self.sizes: dict[int, int] = {}  # each bucket's elements, as the hook last saw them
        self.carrier = 0  # the bucket the count rides with in this backward
        self.pending: list[tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]] = []


def _packed(state: _HookState, index: int, buf: torch.Tensor
            ) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, Any]:
    found = state.packed.get(index)
    if found is None or found[0] != buf.data_ptr() or found[2].shape != buf.shape \
            or found[1].dtype != buf.dtype:  # new (or rebuilt) buckets
        packed = buf.new_empty(buf.numel() + 1)
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        done.set_result(buf)
        found = state.packed[index] = (buf.data_ptr(), packed, packed[:-1], packed[-1:], done)
    return found


def _count_hook(state: _HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    buf = bucket.buffer()
    state.sizes[bucket.index()] = buf.numel()
    if not state.counting:  # a backward outside a counted window: DDP's own average
        return state.average(state.group, bucket)
    if bucket.index() != state.carrier:  # in place: the count rides with one bucket only
        if state.weight != 1.0:
            buf.mul_(state.weight)
        done = torch.futures.Future()
        done.set_result(buf)
        state.pending.append((state.group.allreduce([buf]), buf, None, buf))
        return done
    _, packed, body, tail, done = _packed(state, state.carrier, buf)
    if state.weight == 1.0:
        body.copy_(buf)
    else:
        torch.mul(buf, state.weight, out=body)
    tail.fill_(state.slot)
    state.pending.append((state.group.allreduce([packed]), body, tail, buf))
    # Completed already, with the bucket itself: the gradients are views of it, so DDP
    # copies nothing, and DdpCount.after writes the reduced values into it. No callback runs
    # on the communication thread (with gloo each one costs a thread switch and the GIL).
    return done


class DdpCount(CountSync):
    """The count rides in DDP's gradient all-reduce (see the module docstring)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        group = getattr(model, "process_group", None) or dist.group.WORLD
        self.state = _HookState(group)
        model.register_comm_hook(self.state, _count_hook)

    weighs = True

    def before(self, local: float, unit: float, weight: float = 1.0) -> None:
        join = getattr(self.model, "_join_config", None)
        if join is not None and join.enable:
            raise RuntimeError(
                "run.backward(loss, count=...) inside run.join(): a rank that has run out of "
                "batches cannot add its count to the others' gradient all-reduce. Give every "
                "rank the same number of batches (run.loader(..., drop_last=True)) instead.")
        state = self.state
        state.counting, state.slot, state.unit, state.weight = True, local, unit, weight
        smallest = min(state.sizes, key=lambda i: (state.sizes[i], i), default=0)
        if smallest != state.carrier:  # another bucket carries it: free the old one's copy
            state.carrier = smallest
            state.packed.clear()

    def after(self, total: Callable[[], float]) -> float | torch.Tensor | None:
        state = self.state
        state.counting = False
        found: float | torch.Tensor | None = None
        divisor: float | torch.Tensor = 1.0
        for work, *_ in state.pending:
            work.wait()
        for _, _, tail, _ in state.pending:  # the first bucket's: the count on all ranks
            if tail is None:
                continue
            if tail.device.type == "cpu":  # read at once: free on the host
                found = float(tail.item())
                divisor = found * state.unit if found > 0 else 1.0
            else:  # stays on the device: the step reads it (one wait, as GradScaler's)
                found = tail
                divisor = (tail * state.unit).clamp_min(torch.finfo(tail.dtype).tiny)
        if found is None and state.pending:  # the carrier did not come: apart, once
            found = total()
            divisor = found * state.unit if found > 0 else 1.0
        # an empty window (no item on any rank) has zero gradients: any divisor will do
        for _, body, _, buf in state.pending:
            torch.div(body, divisor, out=buf)
        state.pending.clear()
        return found


class FsdpCount(CountSync):
    """FSDP2's average over ranks, turned into the mean over items shard by shard."""

    def __init__(self, model: nn.Module, ranks: int | None = None) -> None:
        super().__init__(model)
        self.unit = 1.0
        # what FSDP2 divided by: the data-parallel ranks (None: every rank of the mesh)
        self.ranks = ranks

    def before(self, local: float, unit: float, weight: float = 1.0) -> None:
        self.unit = unit

    def after(self, total: Callable[[], float]) -> float | torch.Tensor | None:
        model = self.model
        n = total()
        if model is None or not n:  # no item anywhere: the gradients are zeros already
            return None
        grads, ranks = [], 1
        for p in model.parameters():
            if p.grad is None:
                continue
            local = getattr(p.grad, "to_local", None)
            mesh = getattr(p, "device_mesh", None)
            if mesh is not None:
                ranks = mesh.size() if self.ranks is None else self.ranks
            grads.append(local() if local is not None else p.grad)
        if grads:
            torch._foreach_mul_(grads, ranks / (self.unit * n))
        return None
