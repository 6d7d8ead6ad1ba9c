"""Reading a checkpoint back: its files read verified, and unsharded state loaded into the
registered objects (which checkpoint to read is :mod:`splitsync.ckpt.find`'s choice).

Every rank reads, in parallel with the others, the files it needs, hashing them on the way.
Nothing is unpickled before its bytes match the manifest's checksums, and then only with
``weights_only=True``."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from splitsync.ckpt.fs import Storage
from splitsync.ckpt.integrity import load_bytes, read_verified, refused, verify_fd
from splitsync.ckpt.sharded import load_sharded
from splitsync.ckpt.state import (
    check_optimizer_names,
    check_shapes,
    is_sharded,
    load_model_state,
    load_optimizer_state,
    state_shapes,
)
from splitsync.errors import CheckpointError
from splitsync.strategies import for_model
from splitsync.tree import map_tensors

if TYPE_CHECKING:
    from splitsync.ckpt.save import Window
    from splitsync.ckpt.state import Registered

__all__ = ["ResumeState", "load_objects", "read_part", "verify_files", "read_rank_parts",
           "load_rank_parts", "held_state", "Freeing", "free_later", "load_full", "load_models",
           "unregistered", "reopen_window"]

@dataclass(frozen=True)
class ResumeState:
    """Where to continue: ``step`` optimizer steps done, ``epoch`` to start, the saved extras."""

    step: int = 0
    epoch: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)
    path: Path | str | None = None  # the checkpoint loaded (a URL in object storage)
    world_size: int | None = None  # of the run that wrote it

    @property
    def resumed(self) -> bool:
        return self.path is not None


def read_part(storage: Storage, name: str, rel: str, info: dict[str, Any]) -> Any:
    """One ``torch.save`` file of checkpoint ``name``, verified, then loaded (weights only).

    A local file is read and hashed once, chunks by several threads at once, and then
    memory-mapped: its pages are in the page cache by then, so it is neither read from the
    disk nor copied a second time. From object storage the verified bytes are loaded.
    """
    if storage.local:
        _verify_local(Path(storage.root) / name / rel, rel, info)
        return _load_local(storage, name, rel)
    with storage.open(name, rel) as f:
        return load_bytes(read_verified(f, rel, info), rel)


def _load_local(storage: Storage, name: str, rel: str) -> Any:
    """A local file whose bytes were verified (by this rank, or in shares by every rank)."""
    import pickle

    try:  # mapped, so the tensors are not copied again
        return torch.load(Path(storage.root) / name / rel, map_location="cpu",
                          weights_only=True, mmap=True)
    except pickle.UnpicklingError as e:
        raise refused(rel, e) from None


def _verify_local(path: Path, label: str, info: dict[str, Any],
                  share: tuple[int, int] = (0, 1)) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        verify_fd(fd, label, info, share)
    finally:
        os.close(fd)


def verify_files(storage: Storage, name: str, rels: Iterable[str],
                 files: dict[str, dict[str, Any]]) -> None:
    """Hash ``rels`` without loading them (files another library reads, e.g. DCP shards)."""
    for rel in rels:
        if storage.local:
            _verify_local(Path(storage.root) / name / rel, rel, files[rel])
        else:
            with storage.open(name, rel) as f:
                read_verified(f, rel, files[rel])


def read_rank_parts(storage: Storage, name: str, body: Mapping[str, Any], rank: int,
                     world: int, needed: list[str]) -> dict[str, Any]:
    """Verify (and from object storage, load) the files this rank needs. Local files are
    only verified here, and loaded by :func:`load_rank_parts` once every rank's verify: the
    first needed file, which every rank reads (``state.pt``), is hashed in shares, each rank
    its own run of chunks, so that n ranks hash it once between them, not n times."""
    files = body["files"]
    # Files nobody loads here (DCP shards, which DCP reads itself) are verified in parallel,
    # each by one rank; which rank reads which shard is DCP's business.
    others = sorted(r for r in files if r.startswith("dcp/"))[rank::world]
    mine = [rel for rel in needed if rel in files]
    if not storage.local:
        out = {rel: read_part(storage, name, rel, files[rel]) for rel in mine}
    else:
        for rel in mine:
            shared = bool(needed) and rel == needed[0]
            _verify_local(Path(storage.root) / name / rel, rel, files[rel],
                          (rank, world) if shared else (0, 1))
        out = dict.fromkeys(mine)
    verify_files(storage, name, others, files)
    return out


def load_rank_parts(storage: Storage, name: str, parts: dict[str, Any]) -> dict[str, Any]:
    """The local files :func:`read_rank_parts` verified, loaded (from object storage they
    are loaded already)."""
    if not storage.local:
        return parts
    return {rel: _load_local(storage, name, rel) for rel in parts}


def reopen_window(window: Window | None, models: Mapping[str, nn.Module],
                  entry: Mapping[str, Any] | None, grads: Mapping[str, Any], *,
                  world_size: int, saved_world: int, where: str,
                  own: Mapping[str, Any] | None = None) -> None:
    """Continue the window a checkpoint was saved in (none: a new window begins). Its
    gradients and ``own`` state are this rank's, so only the same world size and
    ``accumulate`` take it."""
    if window is None:
        return
    if not entry:
        window.reopen(0)
        return
    done, every = int(entry["done"]), int(entry["every"])
    if every != window.every or saved_world != world_size:
        raise CheckpointError(
            f"checkpoint {where} was saved inside an accumulation window ({done} of {every} "
            f"micro-batches, at {saved_world} processes), whose gradients are each rank's "
            f"own; this run has accumulate={window.every} at {world_size} processes. Resume "
            f"it with accumulate={every} at {saved_world} processes, or resume an older "
            "checkpoint (save at window boundaries, where run.sync_gradients is True, to "
            "change either).")
    window.reopen(done, entry.get("state", {}), own or {})
    for n, m in models.items():
        for_model(m).restore_window_grads(m, grads.get(n, {}))


def _keeps_what_it_is_given(model: nn.Module, optimizer: torch.optim.Optimizer) -> bool:
    """Whether loading keeps the very tensors of the state (a CPU model that is not sharded;
    a sharded one gets new shards, a GPU one copies to the device)."""
    first = next((p for g in optimizer.param_groups for p in g["params"]), None)
    return first is not None and first.device.type == "cpu" and not is_sharded(model)


def held_state(optimizer: torch.optim.Optimizer) -> dict[Any, dict[str, Any]]:
    """References to ``optimizer``'s per-parameter state (copies of the dicts, never the live
    ones): they keep its tensors alive after a load replaces them, for :func:`free_later`."""
    return {p: dict(st) for p, st in optimizer.state.items()}


@dataclass(frozen=True)
class Freeing:
    """The thread of :func:`free_later`."""

    thread: threading.Thread
    hurry: threading.Event

    def finish(self) -> None:
        """Free what is left now, without pauses, and wait for it: a daemon thread still
        dropping tensors when the interpreter shuts down aborts the process."""
        self.hurry.set()
        self.thread.join()


def free_later(replaced: list[dict[Any, Any]]) -> Freeing:
    """Drop ``replaced`` (copies of optimizers' old per-parameter states) on a thread, one
    parameter's tensors at a time: giving GBs back to the kernel takes it tens of
    milliseconds, which a resume need not wait for; the GIL is let go between parameters."""
    hurry = threading.Event()

    def drop() -> None:
        while replaced:
            state = replaced.pop()
            while state:
                state.popitem()  # frees under the GIL (munmap): a few ms per parameter
                hurry.wait(0.002)  # lets the resume's own Python run in between

    thread = threading.Thread(target=drop, name="ckpt-free-replaced", daemon=True)
    thread.start()
    return Freeing(thread, hurry)


def load_full(where: str, state: Mapping[str, Any], models: Mapping[str, nn.Module],
              optims: Mapping[str, tuple[torch.optim.Optimizer, str]], *,
              mapped: bool = False) -> Freeing:
    """Load an unsharded checkpoint into any model, sharded or not (every shape and every
    optimizer's parameter names are checked before anything is loaded); ``mapped``: its
    tensors are mapped from a local file (the optimizers get copies of theirs). Returns
    the thread that frees the optimizer state it replaced: finish it before the run ends."""
    for name, m in models.items():
        check_shapes(name, {k: v.shape for k, v in state["model"][name].items()},
                     state_shapes(m), where)
    for name, (o, owner) in optims.items():
        check_optimizer_names(models[owner], o, state["optim"][name])
    # whole tensors are resharded into a sharded model; an unsharded one takes them as
    # they are (DCP's "full" path needs a tensor state to find the device: SGD has none)
    for name, m in models.items():
        load_model_state(m, state["model"][name], full=is_sharded(m))
    replaced = [held_state(o) for o, _ in optims.values()]  # not freed in this thread
    for name, (o, owner) in optims.items():
        optim = state["optim"][name]
        if mapped and _keeps_what_it_is_given(models[owner], o):
            # the optimizer writes its state at every step: left mapped from the file, each
            # page would fault and be copied on write at the first step (as slow as
            # allocating it afresh); one copy now reuses memory the allocator holds
            optim = map_tensors(torch.Tensor.clone, optim)
        load_optimizer_state(models[owner], o, optim,
                             full=is_sharded(models[owner]))
    return free_later(replaced)


def load_models(storage: Storage, name: str, body: Mapping[str, Any], state_file: str,
                models: Mapping[str, nn.Module]) -> None:
    """Collective: load ``models`` (registered after checkpoint ``name`` was loaded, e.g. an
    EMA made after ``run.resume``) from it; ``state_file`` is read again, verified."""
    if body["layout"] == "sharded":
        load_sharded(Path(storage.root) / name, models, {})
        return
    state = read_part(storage, name, state_file, body["files"][state_file])
    load_full(storage.where(name), state, models, {}).finish()


def unregistered(body: Mapping[str, Any], reg: Registered) -> list[str]:
    """Optimizers checkpoint ``body`` holds that ``reg`` lacks (their state would be lost)."""
    return sorted(n for n in body["optimizers"] if n not in reg.optims)


def load_objects(storage: Storage, name: str, body: Mapping[str, Any], state: Mapping[str, Any],
                 reg: Registered) -> tuple[dict[str, Any], Freeing | None]:
    """Load checkpoint ``name`` into the registered objects. Returns the saved extras and
    the thread freeing the optimizer state the load replaced (None for sharded state)."""
    held = (*body["models"], *body["optimizers"], *body["objects"])
    missing = [n for n in (*reg.models, *reg.optims, *reg.others) if n not in held]
    where = storage.where(name)
    if missing:
        raise CheckpointError(f"checkpoint {where} has no state for {missing}; it holds "
                              f"{list(held)}.")
    freeing = None
    if body["layout"] == "sharded":
        if not storage.local:
            raise CheckpointError(f"{where}: sharded checkpoints are read from a "
                                  "filesystem path, not from object storage.")
        load_sharded(Path(storage.root) / name, reg.models, reg.optims)
    else:
        freeing = load_full(name, state, reg.models, reg.optims, mapped=storage.local)
    for n, o in reg.others.items():
        o.load_state_dict(state["objects"][n])
    return {**body["extra"], **state["extra"]}, freeing
