"""The training loops compared on a workload: splitsync's and hand-written PyTorch ones.

Each loop owns its model copy, optimizer and loader, and ``run(steps)`` returns the wall
time of every step (batch fetch included). Loops in other toolkits are in ``otherloops``.
"""

from __future__ import annotations

import copy
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from splitsync.bench.workloads import Workload

__all__ = ["Loop", "HandLoop", "SplitsyncLoop", "BareLoop", "DDPOneLoop", "LocalLoop",
           "NaiveLoop", "LOOP_BUILDERS"]


class Loop(ABC):
    """A training loop under test: ``run(steps)`` returns per-step seconds."""

    name = "loop"

    def __init__(self, wl: Workload, base: nn.Module, ctx: dict[str, Any]) -> None:
        self.wl = wl
        self.device: torch.device = ctx["device"]
        self.rank: int = ctx["rank"]
        self.world: int = ctx["world_size"]
        self.seed: int = ctx["seed"]
        self._sync = torch.cuda.synchronize if self.device.type == "cuda" else None
        self.epoch = 0
        self.setup(copy.deepcopy(base), ctx)
        self._it = self._epoch_iter()

    @abstractmethod
    def setup(self, module: nn.Module, ctx: dict[str, Any]) -> None:
        """Build the model, optimizer and data for this loop."""

    @abstractmethod
    def batches(self) -> Any:
        """An iterable over this rank's batches."""

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    @abstractmethod
    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """One optimizer step on (x, y)."""

    def params(self) -> list[torch.Tensor]:
        from splitsync.strategies import unwrap

        return [p.detach().cpu() for p in unwrap(self.model).parameters()]

    def _epoch_iter(self) -> Iterator[Any]:
        self.set_epoch(self.epoch)
        return iter(self.batches())

    def run(self, steps: int) -> list[float]:
        times = []
        clock = time.perf_counter
        for _ in range(steps):
            t0 = clock()
            try:
                x, y = next(self._it)
            except StopIteration:
                self.epoch += 1
                self._it = self._epoch_iter()
                x, y = next(self._it)
            self.train_step(x, y)
            if self._sync is not None:
                self._sync()
            times.append(clock() - t0)
        return times

    def _hand_loader(self) -> DataLoader:
        self.sampler = DistributedSampler(self.wl.dataset, num_replicas=self.world, rank=self.rank,
                                          shuffle=True, seed=self.seed, drop_last=True)
        return DataLoader(self.wl.dataset, batch_size=self.wl.batch_size, sampler=self.sampler,
                          drop_last=True, pin_memory=self.device.type == "cuda")

    def _to(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.device.type == "cpu" else x.to(self.device, non_blocking=True)

    def _sgd(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.model.parameters(), lr=self.wl.lr, momentum=0.9)


class SplitsyncLoop(Loop):
    """The loop as a splitsync user writes it: run.model, run.loader, run.backward, run.step."""

    name = "splitsync"

    def setup(self, module: nn.Module, ctx: dict[str, Any]) -> None:
        self.run_ = ctx["run"]
        self.model = self.run_.model(module)
        self.opt = self._sgd()
        # DistributedSampler's order, so that both loops see the same batches and their
        # parameters can be compared bit for bit (the default order's cost per index is
        # measured by benchmarks/stream_bench.py).
        self.loader = self.run_.loader(self.wl.dataset, batch_size=self.wl.batch_size,
                                       shuffle=True, drop_last=True, order="randperm")

    def batches(self) -> Any:
        return self.loader

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        loss = F.cross_entropy(self.model(x), y)
        self.run_.backward(loss)
        self.run_.step(self.opt)


class HandLoop(Loop):
    """Hand-written PyTorch: DistributedSampler + DataLoader, DDP when world size > 1."""

    name = "hand-written DDP"

    def setup(self, module: nn.Module, ctx: dict[str, Any]) -> None:
        module = module.to(self.device)
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.device.index] if self.device.type == "cuda" else None
            module = DDP(module, device_ids=ids)
        self.model = module
        self.opt = self._sgd()
        self.loader = self._hand_loader()

    def batches(self) -> Any:
        return self.loader

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.model(self._to(x)), self._to(y))
        loss.backward()
        self.opt.step()


class BareLoop(HandLoop):
    """One process, no DDP wrapper, no process group: the floor."""

    name = "bare loop"


class DDPOneLoop(HandLoop):
    """DDP on a 1-process group: DDP's per-step bookkeeping (reducer hooks, bucket, a
    1-rank all-reduce through the backend's thread) without any peer to talk to."""

    name = "DDP, 1-process group"

    def setup(self, module: nn.Module, ctx: dict[str, Any]) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [self.device.index] if self.device.type == "cuda" else None
        # gradient_as_bucket_view as in splitsync's DDP strategy, whose step is predicted
        self.model = DDP(module.to(self.device), device_ids=ids, gradient_as_bucket_view=True)
        self.opt = self._sgd()
        self.loader = self._hand_loader()


class LocalLoop(HandLoop):
    """Every rank trains alone on its shard, no gradient sync: per-device compute time
    under the same machine load as the synchronised loops (the cost model's input)."""

    name = "no sync (compute only)"

    def setup(self, module: nn.Module, ctx: dict[str, Any]) -> None:
        self.model = module.to(self.device)
        self.opt = self._sgd()
        self.loader = self._hand_loader()


class NaiveLoop(HandLoop):
    """The lesson's scheme: after backward, one all_reduce per parameter, then divide."""

    name = "naive all_reduce"

    def setup(self, module: nn.Module, ctx: dict[str, Any]) -> None:
        self.model = module.to(self.device)
        self.opt = self._sgd()
        self.loader = self._hand_loader()

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        import torch.distributed as dist

        self.opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.model(self._to(x)), self._to(y))
        loss.backward()
        for p in self.model.parameters():  # "sum and average the gradients"
            dist.all_reduce(p.grad)
            p.grad /= self.world
        self.opt.step()


LOOP_BUILDERS: dict[str, type[Loop]] = {
    "splitsync": SplitsyncLoop, "hand": HandLoop, "bare": BareLoop, "local": LocalLoop,
    "naive": NaiveLoop, "ddp1": DDPOneLoop,
}
