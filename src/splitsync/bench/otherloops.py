"""The same training loop in other toolkits (optional) and in legacy DataParallel."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from splitsync.bench.loops import HandLoop, Loop

__all__ = ["AccelerateLoop", "FabricLoop", "DataParallelLoop", "BUILDERS"]


class AccelerateLoop(HandLoop):
    """The same loop in Hugging Face Accelerate (optional)."""

    name = "accelerate"

    def setup(self, module: nn.Module, ctx: dict[str, Any]) -> None:
        from accelerate import Accelerator

        self.acc = Accelerator(cpu=self.device.type == "cpu")
        opt = torch.optim.SGD(module.parameters(), lr=self.wl.lr, momentum=0.9)
        loader = DataLoader(self.wl.dataset, batch_size=self.wl.batch_size, shuffle=True,
                            drop_last=True)
        self.model, self.opt, self.loader = self.acc.prepare(module, opt, loader)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.loader, "set_epoch"):
            self.loader.set_epoch(epoch)

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.model(x), y)
        self.acc.backward(loss)
        self.opt.step()


class FabricLoop(AccelerateLoop):
    """The same loop in Lightning Fabric (optional)."""

    name = "lightning fabric"

    def setup(self, module: nn.Module, ctx: dict[str, Any]) -> None:
        try:
            from lightning.fabric import Fabric
        except ImportError:
            from lightning_fabric import Fabric
        accel = "cuda" if self.device.type == "cuda" else "cpu"
        self.fabric = Fabric(accelerator=accel, devices=self.world,
                             strategy="ddp" if self.world > 1 else "auto")
        self.fabric.launch()
        opt = torch.optim.SGD(module.parameters(), lr=self.wl.lr, momentum=0.9)
        self.model, self.opt = self.fabric.setup(module, opt)
        self.loader = self.fabric.setup_dataloaders(DataLoader(
            self.wl.dataset, batch_size=self.wl.batch_size, shuffle=True, drop_last=True))

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.model(x), y)
        self.fabric.backward(loss)
        self.opt.step()


class DataParallelLoop(HandLoop):
    """One process driving every visible GPU with nn.DataParallel; the batch is the
    per-device batch times the number of GPUs, so samples per step match DDP's."""

    name = "DataParallel"

    def setup(self, module: nn.Module, ctx: dict[str, Any]) -> None:
        n = torch.cuda.device_count()
        if n < 2:
            raise RuntimeError("DataParallel vs DDP needs 2 or more GPUs.")
        self.model = nn.DataParallel(module.to("cuda:0"))
        self.opt = self._sgd()
        self.sampler = torch.utils.data.DistributedSampler(
            self.wl.dataset, num_replicas=1, rank=0, shuffle=True, seed=self.seed, drop_last=True)
        self.loader = DataLoader(self.wl.dataset, batch_size=self.wl.batch_size * n,
                                 sampler=self.sampler, drop_last=True, pin_memory=True)

    def _to(self, x: torch.Tensor) -> torch.Tensor:
        return x.to("cuda:0", non_blocking=True)


BUILDERS: dict[str, type[Loop]] = {
    "accelerate": AccelerateLoop, "fabric": FabricLoop, "dp": DataParallelLoop,
}
