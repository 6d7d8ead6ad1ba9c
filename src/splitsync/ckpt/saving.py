"""Collecting what each rank writes for one checkpoint (the part of a save that stalls training).

A blocking save writes the live state directly. A background save first stages it: every
tensor is copied to host memory (pinned for CUDA tensors) before ``run.save`` returns, so
training may change the originals while the copy is written. Sharded state is staged the
same way (its DTensors by their local shards) and written with
``torch.distributed.checkpoint.save`` by the save's own thread, on the background gloo group:
one path for every strategy, whatever the mesh.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from splitsync.ckpt.background import SaveJob, direct
from splitsync.ckpt.fs import Storage
from splitsync.ckpt.full import split_extra
from splitsync.ckpt.kinds import described
from splitsync.ckpt.model_state import is_sharded, model_state, optimizer_state
from splitsync.ckpt.sharded import DCP_DIR, sharded_state, write_sharded
from splitsync.ckpt.staging import Stager, live_storages, local_tensor
from splitsync.ckpt.state import capture_rng, loader_position
from splitsync.ckpt.store import CheckpointError, step_dirname
from splitsync.distributed import comm
from splitsync.tree import iter_tensors

if TYPE_CHECKING:
    from splitsync.data.loader import DeviceLoader
    from splitsync.distributed.seeding import Generators

__all__ = ["STATE_FILE", "rank_file", "Registered", "collect", "build_job", "collective_ok"]

STATE_FILE = "state.pt"


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def collective_ok(rank: int, fn: Callable[[], None], what: str, only_rank0: bool = False,
                  call: Callable[..., Any] = direct, world_size: int = 0) -> None:
    """Run ``fn`` (on rank 0 only, or everywhere) and raise on every rank if any rank failed
    (``world_size`` 1: no other rank to hear from)."""
    err = None
    if rank == 0 or not only_rank0:
        try:
            fn()
        except Exception as e:  # reported to every rank below, then re-raised
            err = f"rank {rank}: {type(e).__name__}: {e}"
    outcomes = [err] if world_size == 1 else call("all_gather_object", comm.gather_object, err)
    errors = [e for e in outcomes if e]
    if errors:
        raise CheckpointError(f"checkpoint {what} failed on {errors[0]}")


def _dcp_files(storage: Storage, work: str, rank: int) -> dict[str, dict[str, Any]]:
    """Size and chunk digests of the DCP files this rank wrote (rank 0: also DCP's metadata)."""
    from splitsync.ckpt.digest import digest_path

    base = Path(storage.root) / work / DCP_DIR
    mine = f"__{rank}_"
    out = {}
    for p in sorted(base.iterdir()):
        if p.is_file() and (p.name.startswith(mine) or (rank == 0 and not p.name.startswith("__"))):
            # DCP writes these itself, so they are hashed in a pass after its own fsync.
            out[f"{DCP_DIR}/{p.name}"] = digest_path(p)
    return out


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


def collect(reg: Registered, *, offload: bool) -> dict[str, Any]:
    """The model and optimizer state a save writes, by the user's names, not copied: whole
    (state.pt, rank 0) or this rank's shards (under ``dcp``, every rank). ``offload``: whole
    device tensors come to the host here (a blocking save); else the stager copies them."""
    if reg.sharded:
        return {DCP_DIR: sharded_state(reg.models, reg.optims)}
    if reg.rank != 0:
        return {}
    return {STATE_FILE: {
        "model": {n: model_state(m, full=True, offload=offload) for n, m in reg.models.items()},
        "optim": {n: optimizer_state(reg.models[owner], o, full=True, offload=offload)
                  for n, (o, owner) in reg.optims.items()},
    }}


def _nbytes(obj: Any) -> int:
    return sum(local_tensor(t).numel() * t.element_size() for _, t in iter_tensors(obj))


def build_job(reg: Registered, storage: Storage, loaders: Sequence[DeviceLoader], *,
              step: int, epoch: int | None, extra: Mapping[str, Any], blocking: bool,
              group: Any, stager: Stager | None = None, call: Any = None) -> SaveJob:
    """Collective: prepare the work directory and collect (staged, unless blocking) state.

    Staging copies only what still aliases live state, into ``stager``'s buffers, which are
    reused by the next save of the same state: no allocation and no page faults per save.
    Sharded state (DTensors on any mesh) is staged the same way and written by
    ``torch.distributed.checkpoint`` in the same thread as the rest, on ``group``."""
    plain, tensors = split_extra(extra)
    positions = [loader_position(ld) for ld in loaders]
    if epoch is None:
        epoch = max((p["epoch"] for p, _ in positions), default=0)
    sharded = reg.sharded
    if sharded and not storage.local:
        raise CheckpointError(
            f"{storage.where(step_dirname(step))}: sharded (DTensor / FSDP2) state is saved "
            "with torch.distributed.checkpoint to a filesystem path every rank can reach; "
            "object storage holds unsharded checkpoints only.")
    work = storage.work_name(step)
    collective_ok(reg.rank, lambda: storage.prepare(step), "prepare", only_rank0=True,
                  call=call or direct, world_size=reg.world_size)
    parts: dict[str, Any] = {
        rank_file(reg.rank): {"rng": capture_rng(reg.generators),
                              "generators": [g for _, g in positions]},
        **collect(reg, offload=blocking)}
    if reg.rank == 0:
        parts.setdefault(STATE_FILE, {}).update(
            objects={n: o.state_dict() for n, o in reg.others.items()}, extra=tensors)
        if reg.generators is not None and reg.generators.streams:  # same on every rank: once
            parts[STATE_FILE]["generators"] = reg.generators.capture(per_rank=False)
    if not blocking:
        parts = (stager or Stager()).stage(parts, reg.live())
    nbytes = _nbytes(parts)
    after = None
    if sharded:
        shards = parts.pop(DCP_DIR)
        path, rank = Path(storage.root) / work, reg.rank

        def after() -> dict[str, dict[str, Any]]:
            write_sharded(path, shards, group)
            return _dcp_files(storage, work, rank)

    body = {
        "step": step, "epoch": epoch, "world_size": reg.world_size,
        "layout": "sharded" if sharded else "full", "models": sorted(reg.models),
        "optimizers": {n: owner for n, (_, owner) in reg.optims.items()},
        "objects": sorted(reg.others), **described(reg.models, reg.optims, reg.others),
        "loaders": [p for p, _ in positions],
        "extra": plain, "tensor_extra": sorted(tensors), "torch": torch.__version__,
    }
    return SaveJob(storage=storage, work=work, step=step, rank=reg.rank, keep=reg.keep,
                   body=body, parts=parts, after_parts=after, group=group,
                   final=storage.where(step_dirname(step)), nbytes=nbytes,
                   call=call or direct, world_size=reg.world_size)
