"""Kill-and-resume scenarios on real gloo groups, for the resume tests and the randomized
search (``benchmarks/resume_search.py``).

A :class:`Config` fixes a run: dataset size, world size, batch, shuffle, ``drop_last``,
``accumulate``, map-style or stream, and where it is interrupted: a checkpoint after
micro-batch ``save_at`` (possibly inside an accumulation window), the process "killed" after
micro-batch ``kill_at`` (what it did after the save is lost), then a new run that resumes,
at the same world size or at ``new_world``. :func:`check` runs it with
``splitsync.testing.spawn`` and returns what differs from the run never interrupted (an
empty list: bit-equal weights and losses, every sample trained once).

At the same world size the resumed run must end bit-equal to the uninterrupted one. At
another world size no uninterrupted run exists to compare with (its global batch differs):
then every sample of every finished epoch must be trained exactly once (map-style data),
or at most once (streams, whose ranks stop where the first runs out), and the padding must
be DistributedSampler's (the epoch's first positions).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, IterableDataset

import splitsync as ss
from splitsync.testing import spawn

__all__ = ["Config", "check", "check_all", "train", "micro_batches", "with_cuts", "saves"]


@dataclass(frozen=True)
class Config:
    n: int  # samples in the dataset (a stream: over all its shards)
    world: int
    batch: int  # per process
    shuffle: bool = True
    drop_last: bool = False
    accumulate: int = 1
    stream: bool = False
    shards: int = 1  # a stream's shards
    epochs: int = 2
    save_at: int = 1  # the checkpoint is written after this micro-batch (1-based, per rank)
    kill_at: int = 1  # the first run stops after this one (>= save_at)
    new_world: int | None = None  # resume at another world size
    strategy: str = "auto"
    count: bool = False  # run.backward(loss, count=n): a weighted mean, some batches weigh 0

    def describe(self) -> str:
        kind = f"stream/{self.shards} shards" if self.stream else "map"
        where = f" -> {self.new_world} ranks" if self.new_world else ""
        return (f"n={self.n} {kind} world={self.world}{where} batch={self.batch} "
                f"shuffle={self.shuffle} drop_last={self.drop_last} "
                f"accumulate={self.accumulate} save@{self.save_at} kill@{self.kill_at}"
                f"{' count=' if self.count else ''}")


class Indexed(Dataset):
    """Deterministic samples that carry their index."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return _sample(i)


class Sharded(IterableDataset):
    """A stream of ``n`` samples in ``shards`` shards (``n_shards`` + ``shard()``)."""

    def __init__(self, n: int, shards: int) -> None:
        self.n = n
        self.n_shards = shards

    def _ids(self, index: int) -> range:
        per = math.ceil(self.n / self.n_shards)
        return range(index * per, min((index + 1) * per, self.n))

    def shard(self, num_shards: int, index: int):  # type: ignore[no-untyped-def]
        return (_sample(i) for i in self._ids(index))

    def __iter__(self):  # type: ignore[no-untyped-def]
        return (_sample(i) for i in range(self.n))


def _sample(i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    x = torch.randn(6, generator=torch.Generator().manual_seed(i))
    return x, x.sum().unsqueeze(0), i


def _whole(p: torch.Tensor) -> torch.Tensor:
    """A parameter's whole value (an FSDP2 shard is gathered: collective)."""
    full = getattr(p, "full_tensor", None)
    return (full() if full is not None else p).detach()


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.25), nn.Linear(16, 1))


def _weighted(out: torch.Tensor, y: torch.Tensor, idx: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """A token-style loss: sample ``i`` holds ``i % 4`` items (none for every fourth), the
    loss is the mean over the batch's items (0 for a batch without any) and their count."""
    items = (idx % 4).to(out.dtype)
    total = items.sum()
    per = (out - y).pow(2).squeeze(1)
    return (per * items).sum() / total.clamp(min=1), total


def micro_batches(cfg: Config, world: int | None = None) -> int | None:
    """Micro-batches per rank per epoch of map-style data (None for streams)."""
    if cfg.stream:
        return None
    w = world or cfg.world
    per_rank = cfg.n // w if cfg.drop_last else math.ceil(cfg.n / w)
    return per_rank // cfg.batch if cfg.drop_last else math.ceil(per_rank / cfg.batch)


def train(cfg: Config, root: str, *, save_at: int | None = None,
          stop_at: int | None = None) -> dict[str, Any]:
    """One process lifetime: build, resume from ``root``, train; save after micro-batch
    ``save_at`` and stop after ``stop_at`` (the kill). Returns numpy copies."""
    run = ss.init(seed=0, deterministic=True, accumulate=cfg.accumulate, strategy=cfg.strategy)
    try:
        model = run.model(_net())
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        data = Sharded(cfg.n, cfg.shards) if cfg.stream else Indexed(cfg.n)
        extra = {"buffer_size": 4} if cfg.stream else {}
        loader = run.loader(data, batch_size=cfg.batch, shuffle=cfg.shuffle,
                            drop_last=cfg.drop_last, **extra)
        state = run.resume(f"{root}/ckpt", model=model, optimizer=opt)
        micro = int(state.extra.get("micro", 0))
        losses: dict[int, float] = {}
        batches: list[tuple[int, int, list[int], list[int]]] = []  # micro, epoch, ids, padding
        for epoch in run.epochs(cfg.epochs, start=state.epoch):
            for x, y, idx in loader:
                if cfg.count:
                    loss, items = _weighted(model(x), y, idx)
                    run.backward(loss, count=items)
                else:
                    loss = F.mse_loss(model(x), y)
                    run.backward(loss)
                run.step(opt)
                micro += 1
                losses[micro] = loss.item()
                real = loader.trim_padding(idx).tolist()
                batches.append((micro, epoch, real, idx.tolist()[len(real):]))
                if micro == save_at:
                    run.save(f"{root}/ckpt", micro=micro)
                if micro == stop_at:
                    return {"losses": losses, "batches": batches, "params": None}
        params = [_whole(p).numpy().copy() for p in run.unwrap(model).parameters()]
        return {"losses": losses, "batches": batches, "params": params}
    finally:
        run.close()


def _same_world(rank: int, world: int, cfgs: list[Config], root: str) -> list[dict[str, Any]]:
    holder = ss.init(seed=0)  # keeps the process group across the simulated lifetimes
    try:
        out = []
        for i, cfg in enumerate(cfgs):
            base = train(cfg, f"{root}/{i}/base")
            first = train(cfg, f"{root}/{i}/run", save_at=cfg.save_at, stop_at=cfg.kill_at)
            second = train(cfg, f"{root}/{i}/run")
            out.append({"base": base, "first": first, "second": second})
        return out
    finally:
        holder.close()


def _first_part(rank: int, world: int, cfg: Config, root: str) -> dict[str, Any]:
    return train(cfg, f"{root}/run", save_at=cfg.save_at, stop_at=cfg.kill_at)


def _second_part(rank: int, world: int, cfg: Config, root: str) -> dict[str, Any]:
    return train(cfg, f"{root}/run")


def _bit_equal(a: list[np.ndarray] | None, b: list[np.ndarray] | None) -> bool:
    return a is not None and b is not None and all(
        x.shape == y.shape and np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def _compare_same(cfg: Config, results: list[dict[str, Any]]) -> list[str]:
    problems = []
    for rank, res in enumerate(results):
        base, first, second = res["base"], res["first"], res["second"]
        if not _bit_equal(base["params"], second["params"]):
            diff = max(float(np.abs(x - y).max()) for x, y in
                       zip(base["params"], second["params"], strict=True))
            problems.append(f"rank {rank}: final weights differ by {diff:.3g}")
        if max(first["losses"], default=0) < cfg.save_at:
            problems.append(f"rank {rank}: the run ended before micro-batch {cfg.save_at}, "
                            "so it never saved (the configuration tests nothing)")
        merged = {k: v for k, v in first["losses"].items() if k <= cfg.save_at}
        merged.update(second["losses"])
        if merged != base["losses"]:
            bad = min(k for k in base["losses"] if merged.get(k) != base["losses"][k])
            problems.append(f"rank {rank}: the loss of micro-batch {bad} differs")
        pads = {m: p for m, _, _, p in base["batches"] if p}
        if any(pads.get(m, p) != p for m, _, _, p in second["batches"] if p):
            problems.append(f"rank {rank}: other padding samples than uninterrupted")
    return problems


def _compare_other(cfg: Config, first: list[dict[str, Any]], second: list[dict[str, Any]],
                   world: int) -> list[str]:
    """Every finished epoch: each sample once (map-style) or at most once (streams); the
    padding repeats the epoch's first positions."""
    problems = []
    runs = [(b, b[0] <= cfg.save_at) for res in first for b in res["batches"]]
    runs += [(b, True) for res in second for b in res["batches"]]
    for epoch in range(cfg.epochs):
        ids = [i for (_, e, real, _), keep in runs if keep and e == epoch for i in real]
        pads = [i for res in second for _, e, _, pad in res["batches"] if e == epoch
                for i in pad]
        counts = np.bincount(np.asarray(ids, dtype=np.int64), minlength=cfg.n)
        never = int((counts == 0).sum())
        if counts.max(initial=0) > 1:
            problems.append(f"epoch {epoch}: sample {int(counts.argmax())} trained "
                            f"{int(counts.max())} times")
        elif not cfg.stream and not cfg.drop_last and never:
            problems.append(f"epoch {epoch}: {never} sample(s) never trained")
        elif not cfg.stream and never >= world * (cfg.batch + 1) + cfg.world * cfg.batch:
            problems.append(f"epoch {epoch}: {never} sample(s) never trained (drop_last)")
        if pads and not cfg.stream:
            order = _epoch_order(cfg, epoch)
            want = sorted(order[i % cfg.n] for i in range(len(pads)))
            if sorted(pads) != want:
                problems.append(f"epoch {epoch}: padding {sorted(pads)} is not the epoch's "
                                f"first positions {want}")
    return problems


def _epoch_order(cfg: Config, epoch: int) -> list[int]:
    from splitsync.data.loader import ShardSampler

    s = ShardSampler(Indexed(cfg.n), 1, 0, cfg.shuffle, 0, order="bijection")
    s.set_epoch(epoch)
    return s.global_order()


def check(cfg: Config, root: str | os.PathLike[str], timeout: float = 240) -> list[str]:
    """Run ``cfg``; the ways the resumed run differs from what it should be (none: [])."""
    root = str(root)
    Path(root).mkdir(parents=True, exist_ok=True)
    if cfg.new_world is None or cfg.new_world == cfg.world:
        return check_all([cfg], root, timeout)[0]
    first = spawn(_first_part, cfg.world, cfg, root, timeout=timeout)
    second = spawn(_second_part, cfg.new_world, cfg, root, timeout=timeout)
    return _compare_other(cfg, first, second, cfg.new_world)


def check_all(cfgs: list[Config], root: str | os.PathLike[str],
              timeout: float = 240) -> list[list[str]]:
    """:func:`check` for configs of one world size, resumed at it, in one spawn."""
    worlds = {c.world for c in cfgs}
    if len(worlds) != 1 or any(c.new_world not in (None, c.world) for c in cfgs):
        raise ValueError("check_all runs configs of one world size, resumed at it")
    results = spawn(_same_world, worlds.pop(), cfgs, str(root), timeout=timeout)
    return [_compare_same(cfg, [res[i] for res in results]) for i, cfg in enumerate(cfgs)]


def as_dict(cfg: Config) -> dict[str, Any]:
    return asdict(cfg)


def with_cuts(cfg: Config, save_frac: float, lost: int) -> Config:
    """``cfg`` with its checkpoint at ``save_frac`` of the run's micro-batches (at least
    the first, never the last) and ``lost`` micro-batches after it lost with the kill."""
    if cfg.stream:  # every rank a few batches an epoch: a stream stops at the first end
        cfg = replace(cfg, batch=min(cfg.batch, max(1, cfg.n // (4 * cfg.world))))
    # a stream's batches per rank are known only as it is read: a bound below them
    per_epoch = micro_batches(cfg) or max(1, cfg.n // (cfg.world * cfg.batch) - 1)
    total = per_epoch * cfg.epochs
    save = min(max(1, int(save_frac * total)), max(1, total - 1))
    if cfg.new_world not in (None, cfg.world) and cfg.accumulate > 1:
        save -= save % cfg.accumulate  # another world size takes no open window
        save = max(save, cfg.accumulate)
    return replace(cfg, save_at=save, kill_at=min(save + lost, total))


def saves(cfg: Config) -> bool:
    """Whether the first run reaches its checkpoint: a map-style run with no batch (a rank's
    share smaller than a batch it drops) or one whose save :func:`with_cuts` had to put past
    its last micro-batch (another world size takes no open window) tests nothing."""
    return cfg.save_at <= cfg.kill_at and (cfg.stream or bool(micro_batches(cfg)))
