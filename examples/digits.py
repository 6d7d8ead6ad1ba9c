"""Train a small CNN on scikit-learn's 8x8 digits, on one process or many.

    python examples/digits.py                     # one process (CPU or one GPU)
    splitsync run -n 2 examples/digits.py         # two processes, DDP
    splitsync run -n 2 examples/digits.py --epochs 5 --precision bf16-mixed

The dataset ships with scikit-learn (1,797 images, no download). Every rank reads its own
shard of the training split; validation accuracy is exact: the predictions of all ranks are
gathered without the sampler's padded duplicates, so every validation image counts once.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import splitsync as ss
from splitsync import PRECISIONS
from splitsync.strategies import STRATEGY_NAMES


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=32, help="per process")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--precision", choices=PRECISIONS, default="32")
    p.add_argument("--accumulate", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--strategy", choices=STRATEGY_NAMES, default="auto")
    p.add_argument("--val-fraction", type=float, default=0.2)
    p.add_argument("--run-dir", default=None, help="write metrics.jsonl/.csv here")
    p.add_argument("--ckpt", default=None, help="checkpoint here every epoch; resume from it")
    return p.parse_args(argv)


class DigitsNet(nn.Module):
    """Two 3x3 convolutions and a linear head: about 40k parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),  # 8x8 -> 4x4
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(),
                                  nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def load_split(val_fraction: float, seed: int) -> tuple[TensorDataset, TensorDataset]:
    """The digits as (N, 1, 8, 8) floats in [0, 1], split the same way on every rank."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    # The split depends on the seed only, never on the rank: all ranks agree on it.
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_val = int(len(y) * val_fraction)
    val, train = order[:n_val], order[n_val:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[val], y[val])


def evaluate(run: ss.Run, model: nn.Module, loader: Iterable) -> tuple[int, int]:
    """(correct, total) over the whole validation split, counted once per image."""
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in loader:
            hits = run.gather_for_metrics(model(x).argmax(dim=1) == y)
            correct += int(hits.sum().item())
            total += hits.numel()
    model.train()
    return correct, total


def main(argv: list[str] | None = None) -> float:
    args = parse_args(argv)
    with ss.init(seed=args.seed, precision=args.precision, accumulate=args.accumulate,
                 strategy=args.strategy, run_dir=args.run_dir) as run:
        train_set, val_set = load_split(args.val_fraction, args.seed)
        run.print(f"digits: {len(train_set)} train / {len(val_set)} validation images, "
                  f"{run.world_size} process(es) on {run.device}, batch {args.batch_size} "
                  f"per process")
        model = run.model(DigitsNet())
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
        train_loader = run.loader(train_set, batch_size=args.batch_size, shuffle=True)
        val_loader = run.loader(val_set, batch_size=256)

        start_epoch = 0
        if args.ckpt:
            start_epoch = run.resume(args.ckpt, model=model, optimizer=opt).epoch

        accuracy = 0.0
        for epoch in run.epochs(args.epochs, start_epoch):
            start = time.perf_counter()
            seen = 0
            loss_sum = torch.zeros((), device=run.device)
            for x, y in run.progress(train_loader, desc=f"epoch {epoch + 1}/{args.epochs}"):
                loss = F.cross_entropy(model(x), y)
                run.backward(loss)
                run.step(opt)
                loss_sum += loss.detach()
                seen += len(y)
            # Samples/s over all ranks: every rank's count, over the slowest rank's time.
            elapsed = run.max(time.perf_counter() - start)
            samples_per_s = run.sum(seen) / elapsed
            correct, total = evaluate(run, model, val_loader)
            if total != len(val_set):  # exact evaluation: each image exactly once
                raise RuntimeError(f"evaluated {total} images, expected {len(val_set)}")
            accuracy = correct / total
            run.log(epoch=epoch + 1, loss=loss_sum / max(len(train_loader), 1),
                    val_acc=accuracy, samples_per_s=samples_per_s)
            if args.ckpt:
                run.save(epoch=epoch + 1)
        run.print(f"validation accuracy: {100 * accuracy:.1f}%")
    return accuracy


if __name__ == "__main__":
    main()
