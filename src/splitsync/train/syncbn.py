"""Synchronised BatchNorm that also works on CPU/gloo.

torch's ``nn.SyncBatchNorm`` supports only accelerator tensors; on CPU it raises. This
module computes the batch statistics over all ranks with differentiable all-reduces
(two passes, for the same precision as BatchNorm's own two-pass variance), so CPU runs
train exactly like one process on the global batch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.nn.functional import all_reduce

__all__ = ["CPUSyncBatchNorm", "convert_sync_batchnorm", "batchnorm_stats"]


class CPUSyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose training statistics span every rank of the default group."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        use_batch = self.training or not self.track_running_stats
        if not use_batch or not (dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(input)
        dims = [0, *range(2, input.dim())]
        count = torch.tensor(
            [input.numel() // input.shape[1]], dtype=input.dtype, device=input.device
        )
        total = all_reduce(count.clone())
        mean = all_reduce(input.sum(dims)) / total
        shape = [1, -1] + [1] * (input.dim() - 2)
        centred = input - mean.reshape(shape)
        var = all_reduce((centred * centred).sum(dims)) / total
        if self.training and self.track_running_stats and self.running_mean is not None:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)  # type: ignore[union-attr]
                m = self.momentum if self.momentum is not None else 1.0 / float(
                    self.num_batches_tracked
                )
                n = float(total.item())
                unbiased = var.detach() * (n / max(n - 1.0, 1.0))
                self.running_mean.mul_(1 - m).add_(mean.detach(), alpha=m)
                self.running_var.mul_(1 - m).add_(unbiased, alpha=m)  # type: ignore[union-attr]
        out = centred * torch.rsqrt(var + self.eps).reshape(shape)
        if self.affine:
            out = out * self.weight.reshape(shape) + self.bias.reshape(shape)
        return out


def convert_sync_batchnorm(module: nn.Module, device: torch.device) -> nn.Module:
    """torch's SyncBatchNorm on accelerators, :class:`CPUSyncBatchNorm` on CPU."""
    if device.type != "cpu":
        return nn.SyncBatchNorm.convert_sync_batchnorm(module)
    return _convert_cpu(module)


def _convert_cpu(module: nn.Module) -> nn.Module:
    out = module
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(
        module, CPUSyncBatchNorm
    ):
        out = CPUSyncBatchNorm(
            module.num_features, module.eps, module.momentum, module.affine,
            module.track_running_stats,
        )
        if module.affine:
            with torch.no_grad():
                out.weight = module.weight
                out.bias = module.bias
        out.running_mean = module.running_mean
        out.running_var = module.running_var
        out.num_batches_tracked = module.num_batches_tracked
        out.training = module.training
    for name, child in module.named_children():
        out.add_module(name, _convert_cpu(child))
    return out


def batchnorm_stats(module: nn.Module) -> list[torch.Tensor]:
    """Every BatchNorm running mean and variance in ``module`` (local tensors, in module
    order): what ``run.sync_batchnorm_stats`` averages over the ranks."""
    out = []
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            for t in (m.running_mean, m.running_var):
                if t is not None:
                    to_local = getattr(t, "to_local", None)
                    out.append(to_local() if to_local is not None else t)
    return out
