"""Registering training objects with a run, saving them and resuming from the newest checkpoint."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from splitsync import comm
from splitsync.ckpt.full import load_full, load_pt, split_extra, write_pt
from splitsync.ckpt.sharded import load_sharded, save_sharded
from splitsync.ckpt.state import (
    capture_rng,
    loader_position,
    owner_of,
    restore_loader,
    restore_rng,
)
from splitsync.ckpt.store import (
    CheckpointError,
    clear_stale,
    commit,
    committed_steps,
    newest_valid,
    prune,
    set_aside,
    step_dirname,
    tmp_dirname,
    write_manifest,
)
from splitsync.data import DeviceLoader
from splitsync.strategies import for_model

__all__ = ["ResumeState", "Checkpointer", "CheckpointWarning", "STATE_FILE", "rank_file"]

STATE_FILE = "state.pt"
RESERVED = ("step", "epoch")


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped (incomplete or corrupted) while looking for one to resume."""


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


@dataclass(frozen=True)
class ResumeState:
    """Where to continue: ``step`` optimizer steps done, ``epoch`` to start, the saved extras."""

    step: int = 0
    epoch: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)
    path: Path | None = None  # the checkpoint loaded; None on a fresh start
    world_size: int | None = None  # of the run that wrote it

    @property
    def resumed(self) -> bool:
        return self.path is not None


class Checkpointer:
    """The objects registered by ``run.resume`` and the step counter they advance."""

    def __init__(self, root: Path, objects: Mapping[str, Any], *, keep: int, rank: int,
                 world_size: int) -> None:
        if not isinstance(keep, int) or keep < 2:
            raise ValueError(f"keep={keep!r}: keep at least 2 checkpoints, so one complete "
                             "checkpoint always survives a crash during the next save.")
        bad = sorted(set(objects) & set(RESERVED))
        if bad:
            raise TypeError(f"run.resume(...) cannot register objects named {bad}; rename them.")
        self.root = Path(root)
        self.keep = keep
        self.rank = rank
        self.world_size = world_size
        self.models: dict[str, nn.Module] = {}
        self.optims: dict[str, tuple[torch.optim.Optimizer, str]] = {}
        self.others: dict[str, Any] = {}
        for name, obj in objects.items():
            if isinstance(obj, nn.Module):
                self.models[name] = obj
        for name, obj in objects.items():
            if isinstance(obj, nn.Module):
                continue
            if isinstance(obj, torch.optim.Optimizer):
                self.optims[name] = (obj, owner_of(obj, self.models))
            elif callable(getattr(obj, "state_dict", None)) and callable(
                    getattr(obj, "load_state_dict", None)):
                self.others[name] = obj
            else:
                raise TypeError(f"run.resume(..., {name}=...): a {type(obj).__name__} has no "
                                "state_dict()/load_state_dict(); pass it to run.save() as an "
                                "extra instead.")
        self.step = 0
        self._counting = True
        self._hook: Any = None
        self._pending: list[tuple[dict[str, int], torch.Tensor | None]] = []

    # --- step counting -------------------------------------------------------------------
    def _on_step(self, *_: Any) -> None:
        if self._counting:
            self.step += 1

    def _start_counting(self) -> None:
        if self._hook is None and self.optims:
            first = next(iter(self.optims.values()))[0]
            self._hook = first.register_step_post_hook(self._on_step)

    def close(self) -> None:
        """Stop counting optimizer steps (a new ``run.resume`` replaces this one)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    # --- saving --------------------------------------------------------------------------
    def save(self, root: Path, loaders: Sequence[DeviceLoader], *, step: int | None,
             epoch: int | None, extra: Mapping[str, Any]) -> Path:
        """Collective: write everything registered as ``root/step-<step>/``; returns its path."""
        if step is None:
            if not self.optims:
                raise TypeError("run.save(...) cannot count steps without a registered "
                                "optimizer; pass step=<number of steps done>.")
            step = self.step
        plain, tensors = split_extra(extra)
        positions = [loader_position(ld) for ld in loaders]
        if epoch is None:
            epoch = max((p["epoch"] for p, _ in positions), default=0)
        tmp = root / tmp_dirname(step)
        _collective_ok(self.rank, lambda: _prepare(root, tmp), "prepare", only_rank0=True)
        strategies = {n: for_model(m) for n, m in self.models.items()}
        sharded = any(strategies[n].is_sharded(m) for n, m in self.models.items())

        def write() -> None:
            if sharded:
                self._counting = False
                try:
                    save_sharded(tmp, self.models, self.optims)
                finally:
                    self._counting = True
            write_pt(tmp / rank_file(self.rank),
                      {"rng": capture_rng(), "generators": [g for _, g in positions]})
            if self.rank == 0:
                state: dict[str, Any] = {
                    "objects": {n: o.state_dict() for n, o in self.others.items()},
                    "extra": tensors,
                }
                if not sharded:
                    state["model"] = {n: strategies[n].full_state(m, self.rank)
                                      for n, m in self.models.items()}
                    state["optim"] = {n: strategies[owner].optimizer_state(self.models[owner], o)
                                      for n, (o, owner) in self.optims.items()}
                write_pt(tmp / STATE_FILE, state)

        _collective_ok(self.rank, write, "write")
        body = {
            "step": step, "epoch": epoch, "world_size": self.world_size,
            "layout": "sharded" if sharded else "full", "models": sorted(self.models),
            "optimizers": {n: owner for n, (_, owner) in self.optims.items()},
            "objects": sorted(self.others), "loaders": [p for p, _ in positions],
            "extra": plain, "tensor_extra": sorted(tensors), "torch": torch.__version__,
        }
        def finish() -> None:
            write_manifest(tmp, body)
            prune(root, self.keep, commit(tmp, root, step))

        _collective_ok(self.rank, finish, "commit", only_rank0=True)
        return root / step_dirname(step)

    # --- loading -------------------------------------------------------------------------
    def load(self, loaders: Sequence[DeviceLoader]) -> ResumeState:
        """Collective: load the newest complete checkpoint under ``root``, or start fresh."""
        found: tuple[str | None, Any, list[tuple[str, str]], int] = (None, None, [], 0)
        if self.rank == 0:
            cand = newest_valid(self.root)
            found = (None if cand.path is None else str(cand.path), cand.body,
                     [(str(p), why) for p, why in cand.skipped],
                     len(committed_steps(self.root)))
            for p, why in found[2]:
                aside = ""
                if cand.path is not None:  # set it aside so keep-last-k never counts it
                    aside = set_aside(Path(p))
                warnings.warn(f"skipping checkpoint {p}: {why}{aside}", CheckpointWarning,
                              stacklevel=3)
        path_s, body, skipped, total = comm.broadcast_object(found)
        if path_s is None:
            if total:
                listing = "; ".join(f"{p}: {why}" for p, why in skipped)
                raise CheckpointError(
                    f"no usable checkpoint in {self.root}: every one is incomplete or corrupted "
                    f"({listing}). Move them away to start fresh, or restore a good copy.")
            self._start_counting()
            return ResumeState()
        path = Path(path_s)
        self._counting = False
        try:
            extra = self._load_objects(path, body)
        finally:
            self._counting = True
        rank_state = path / rank_file(self.rank)
        generators: list[torch.Tensor | None] = []
        if rank_state.is_file():  # ranks beyond the saved world size keep their fresh seeds
            per_rank = load_pt(rank_state)
            restore_rng(per_rank["rng"])
            generators = list(per_rank["generators"])
        self._pending = [(pos, generators[i] if i < len(generators) else None)
                         for i, pos in enumerate(body["loaders"])]
        for i, ld in enumerate(loaders):
            self.attach_loader(ld, i)
        self.step = int(body["step"])
        self._start_counting()
        return ResumeState(step=self.step, epoch=int(body["epoch"]), extra=extra, path=path,
                           world_size=int(body["world_size"]))

    def attach_loader(self, loader: DeviceLoader, index: int) -> None:
        """Continue the ``index``-th loader made by the run where the checkpoint left it."""
        if index < len(self._pending):
            pos, gen = self._pending[index]
            restore_loader(loader, pos, gen)

    def _load_objects(self, path: Path, body: Mapping[str, Any]) -> dict[str, Any]:
        missing = [n for n in (*self.models, *self.optims, *self.others)
                   if n not in (*body["models"], *body["optimizers"], *body["objects"])]
        if missing:
            raise CheckpointError(f"checkpoint {path} has no state for {missing}; it holds "
                                  f"{[*body['models'], *body['optimizers'], *body['objects']]}.")
        state = load_pt(path / STATE_FILE)
        if body["layout"] == "sharded":
            load_sharded(path, self.models, self.optims)
        else:
            load_full(path.name, state, self.models, self.optims)
        for n, o in self.others.items():
            o.load_state_dict(state["objects"][n])
        return {**body["extra"], **state["extra"]}


def _prepare(root: Path, tmp: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    clear_stale(root)
    tmp.mkdir()


def _collective_ok(rank: int, fn: Callable[[], None], what: str, only_rank0: bool = False) -> None:
    """Run ``fn`` (on rank 0 only, or everywhere) and raise on every rank if any rank failed."""
    err = None
    if rank == 0 or not only_rank0:
        try:
            fn()
        except Exception as e:  # reported to every rank below, then re-raised
            err = f"rank {rank}: {type(e).__name__}: {e}"
    errors = [e for e in comm.gather_object(err) if e]
    if errors:
        raise CheckpointError(f"checkpoint {what} failed on {errors[0]}")
