"""Collecting what each rank writes for one checkpoint (the part of a save that stalls training).

A blocking save writes the live state directly. A background save first stages it: every
tensor is copied to host memory (pinned for CUDA tensors) before ``run.save`` returns, so
training may change the originals while the copy is written. Sharded state goes through
``torch.distributed.checkpoint.async_save``, which stages it the same way and writes it in
its own thread, on the background gloo group.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from splitsync.ckpt.background import SaveJob
from splitsync.ckpt.fs import Storage
from splitsync.ckpt.full import split_extra
from splitsync.ckpt.kinds import described
from splitsync.ckpt.sharded import DCP_DIR, async_save_sharded, save_sharded
from splitsync.ckpt.staging import Stager, live_storages
from splitsync.ckpt.state import capture_rng, loader_position
from splitsync.ckpt.store import CheckpointError, step_dirname
from splitsync.dist import comm
from splitsync.strategies import for_model

if TYPE_CHECKING:
    from splitsync.ckpt.session import Checkpointer
    from splitsync.data.loader import DeviceLoader

__all__ = ["STATE_FILE", "rank_file", "build_job", "collective_ok"]

STATE_FILE = "state.pt"


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def collective_ok(rank: int, fn: Callable[[], None], what: str, only_rank0: bool = False) -> None:
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


def build_job(ck: Checkpointer, storage: Storage, loaders: Sequence[DeviceLoader], *,
              step: int, epoch: int | None, extra: Mapping[str, Any], blocking: bool,
              group: Any, stager: Stager | None = None) -> SaveJob:
    """Collective: prepare the work directory and collect (staged, unless blocking) state.

    Staging copies only what still aliases live state (the strategies hand back CPU views of
    CPU tensors, fresh host copies of device tensors), into ``stager``'s buffers, which are
    reused by the next save of the same state: no allocation and no page faults per save."""
    plain, tensors = split_extra(extra)
    positions = [loader_position(ld) for ld in loaders]
    if epoch is None:
        epoch = max((p["epoch"] for p, _ in positions), default=0)
    strategies = {n: for_model(m) for n, m in ck.models.items()}
    sharded = any(strategies[n].is_sharded(m) for n, m in ck.models.items())
    if sharded and not storage.local:
        raise CheckpointError(
            f"{storage.where(step_dirname(step))}: sharded (DTensor / FSDP2) state is saved "
            "with torch.distributed.checkpoint to a filesystem path every rank can reach; "
            "object storage holds unsharded checkpoints only.")
    work = storage.work_name(step)
    collective_ok(ck.rank, lambda: storage.prepare(step), "prepare", only_rank0=True)
    parts: dict[str, Any] = {
        rank_file(ck.rank): {"rng": capture_rng(), "generators": [g for _, g in positions]}}
    if ck.rank == 0:
        state: dict[str, Any] = {
            "objects": {n: o.state_dict() for n, o in ck.others.items()},
            "extra": tensors,
        }
        if not sharded:
            state["model"] = {n: strategies[n].full_state(m, ck.rank)
                              for n, m in ck.models.items()}
            state["optim"] = {n: strategies[owner].optimizer_state(ck.models[owner], o)
                              for n, (o, owner) in ck.optims.items()}
        parts[STATE_FILE] = state
    if not blocking:
        live = live_storages(ck.models.values(), (o for o, _ in ck.optims.values()))
        parts = (stager or Stager()).stage(parts, live)
    after = None
    if sharded:
        dcp_dir = Path(storage.root) / work / DCP_DIR
        if blocking:
            save_sharded(dcp_dir.parent, ck.models, ck.optims)
            wait: Callable[[], None] = lambda: None  # noqa: E731
        else:
            wait = async_save_sharded(dcp_dir.parent, ck.models, ck.optims, group).result
        rank = ck.rank

        def after() -> dict[str, dict[str, Any]]:
            wait()
            return _dcp_files(storage, work, rank)

    body = {
        "step": step, "epoch": epoch, "world_size": ck.world_size,
        "layout": "sharded" if sharded else "full", "models": sorted(ck.models),
        "optimizers": {n: owner for n, (_, owner) in ck.optims.items()},
        "objects": sorted(ck.others), **described(ck.models, ck.optims, ck.others),
        "loaders": [p for p, _ in positions],
        "extra": plain, "tensor_extra": sorted(tensors), "torch": torch.__version__,
    }
    return SaveJob(storage=storage, work=work, step=step, rank=ck.rank, keep=ck.keep,
                   body=body, parts=parts, after_parts=after, group=group,
                   final=storage.where(step_dirname(step)))
