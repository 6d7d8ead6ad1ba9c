"""Writing a checkpoint: what each rank writes, staged in host memory, then written,
checksummed and committed, in the caller's thread (a blocking save) or in one background
thread (``blocking=False``).

Collecting is the part of a save that stalls training. A blocking save writes the live state
directly. A background save first stages it: every tensor is copied to host memory (pinned
for CUDA tensors) before ``run.save`` returns, so training may change the originals while
the copy is written. Sharded state is staged the same way (its DTensors by their local
shards) and written with ``torch.distributed.checkpoint.save`` by the save's own thread.

The background thread never touches the training loop's process group: its handshakes
(every rank's file list to rank 0, the outcome back) run on a separate gloo group made
once, by every rank together, at the first background save. Collectives on different groups
do not interleave, so the loop may all-reduce while a save finishes. They go through
:mod:`splitsync.distributed.comm` and the run's ``call``, so observers (the hang guard) see
them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from splitsync.ckpt.faults import DISK_FULL, describe_failure
from splitsync.ckpt.fs import Storage
from splitsync.ckpt.integrity import write_object
from splitsync.ckpt.sharded import DCP_DIR, sharded_state, write_sharded
from splitsync.ckpt.staging import Stager, local_tensor, rank_buffers
from splitsync.ckpt.state import (
    Registered,
    capture_rng,
    described,
    loader_position,
    model_state,
    optimizer_state,
    split_extra,
)
from splitsync.ckpt.store import manifest_text, step_dirname
from splitsync.distributed import comm
from splitsync.errors import CheckpointError
from splitsync.observe import Observer
from splitsync.strategies import for_model
from splitsync.tree import iter_tensors

__all__ = ["STATE_FILE", "rank_file", "collect", "build_job", "collective_ok", "SaveJob", "SaveHandle", "side_group", "destroy_side_group", "run_job", "gather", "broadcast", "direct", "start", "SaveWatch", "Window", "window_state"]

if TYPE_CHECKING:
    from splitsync.data.loader import DeviceLoader


def side_group(world_size: int, timeout: Any) -> Any:
    """A gloo group over all ranks for background handshakes (collective: every rank calls it)."""
    import torch.distributed as dist

    if world_size < 2 or not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.new_group(backend="gloo", timeout=timeout)


def destroy_side_group(group: Any) -> None:
    """Destroy a group made by :func:`side_group` (no background save may still use it)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group(group)


Call = Callable[..., Any]  # call(op, fn, *args): runs a collective (observers wrap it)


def direct(op: str, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def gather(obj: Any, group: Any, call: Call = direct) -> list[Any]:
    """Every rank's ``obj`` on rank 0 (others get an empty list), on ``group``."""
    return call("gather_object", comm.gather_object_to, obj, 0, group)


def broadcast(obj: Any, group: Any, call: Call = direct) -> Any:
    """Rank 0's ``obj`` on every rank, on ``group``."""
    return call("broadcast", comm.broadcast_object, obj, 0, group)


@dataclass
class SaveJob:
    """Everything one rank writes for one checkpoint, already staged."""

    storage: Storage
    work: str  # directory being written (``.tmp-step-N`` locally, ``step-N`` in object stores)
    step: int
    rank: int
    keep: int
    body: dict[str, Any]  # manifest body without the file list (rank 0)
    parts: dict[str, Any]  # relative file name -> object for torch.save
    after_parts: Callable[[], dict[str, dict[str, Any]]] | None = None  # e.g. DCP's files
    group: Any = None
    final: str = ""
    nbytes: int = 0  # what this rank writes (tensor bytes), for a full disk's message
    call: Call = direct
    world_size: int = 0  # 1: no other rank to gather from or tell (0: unknown, ask)


def _write_parts(job: SaveJob) -> tuple[dict[str, dict[str, Any]], str | None]:
    files: dict[str, dict[str, Any]] = {}
    current = job.work
    try:
        for rel, obj in job.parts.items():
            current = f"{job.work}/{rel}"
            files[rel] = write_object(lambda rel=rel: job.storage.create(job.work, rel),
                                      job.storage.durable, obj)
        if job.after_parts is not None:
            current = f"{job.work} (sharded state)"
            files.update(job.after_parts())
    except BaseException as e:  # reported to rank 0, then every rank (DCP's are BaseException)
        if not isinstance(e, Exception) and type(e).__name__ != "CheckpointException":
            raise  # KeyboardInterrupt, SystemExit
        return files, describe_failure(e, f"rank {job.rank} writing", job.storage.where(current),
                                       job.nbytes, job.storage.free_bytes())
    return files, None


def run_job(job: SaveJob) -> str:
    """Write this rank's files, then (rank 0) the manifest, commit and prune. Collective on
    ``job.group``; every rank returns the checkpoint's location or raises the same error."""
    files, err = _write_parts(job)
    alone = job.world_size == 1
    reports = [(files, err)] if alone else gather((files, err), job.group, job.call)
    outcome: str | None = None
    if job.rank == 0:
        errors = [e for _, e in reports if e]
        if errors:
            full = [e for e in errors if DISK_FULL in e]
            outcome = (full or errors)[0]  # the cause, not a peer's consequence of it
            job.storage.discard(job.work)  # every rank has reported: nobody writes there now
        else:
            merged: dict[str, dict[str, Any]] = {}
            for f, _ in reports:
                merged.update(f)
            committed = False
            try:
                job.storage.put_manifest(job.work, manifest_text(job.body, merged))
                name = job.storage.commit(job.work, job.step)
                committed = True
                job.storage.prune(job.keep, name)
            except Exception as e:
                outcome = describe_failure(e, "rank 0 committing", job.storage.where(job.work),
                                           0, job.storage.free_bytes())
                if not committed:  # a committed one is complete: never removed here
                    job.storage.discard(job.work)
    if not alone:
        outcome = broadcast(outcome, job.group, job.call)
    if outcome is not None:
        raise CheckpointError(f"checkpoint save of step {job.step} failed on {outcome}. "
                              "It does not count; earlier checkpoints are untouched.")
    return job.final


@dataclass
class SaveHandle:
    """A checkpoint being written in the background: ``done()``, ``wait()``, ``path``."""

    path: str
    step: int
    _done: threading.Event = field(default_factory=threading.Event, repr=False)
    _error: BaseException | None = field(default=None, repr=False)
    _reported: bool = field(default=False, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def finish(self) -> None:
        """Wait until the save's thread has ended, not only the save: a daemon thread that
        is still freeing the staged copy when the interpreter shuts down aborts the process
        (a tensor's last reference dropped then needs the GIL, which is gone)."""
        self._done.wait()
        if self._thread is not None:
            self._thread.join()

    def done(self) -> bool:
        """True once the checkpoint is committed, or has failed."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> str:
        """Block until committed and return its location; raise the save's error if it failed."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"checkpoint {self.path} is still being written")
        if self._error is not None:
            self._reported = True
            raise self._error
        return self.path

    @property
    def error(self) -> BaseException | None:
        """The save's failure once done (None while running or after a commit)."""
        return self._error if self._done.is_set() else None

    def failed(self) -> bool:
        """Done with an error nobody has been told about yet."""
        return self._done.is_set() and self._error is not None and not self._reported

    def raise_if_failed(self) -> None:
        if self.failed():
            self._reported = True
            raise self._error  # type: ignore[misc]

    def __fspath__(self) -> str:
        return self.path


def start(job: SaveJob) -> SaveHandle:
    """Run ``job`` in a daemon thread; its error is kept in the handle, never dropped."""
    handle = SaveHandle(path=job.final, step=job.step)
    pending = [job]  # the thread's only reference: the staged copy is freed before "done"

    def body() -> None:
        try:
            run_job(pending.pop())
        except BaseException as e:  # kept for the next save, step or close
            handle._error = e
        finally:
            handle._done.set()

    handle._thread = threading.Thread(target=body, name=f"ckpt-save-{job.step}", daemon=True)
    handle._thread.start()
    return handle


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
    from splitsync.ckpt.integrity import digest_path

    base = Path(storage.root) / work / DCP_DIR
    mine = f"__{rank}_"
    out = {}
    for p in sorted(base.iterdir()):
        if p.is_file() and (p.name.startswith(mine) or (rank == 0 and not p.name.startswith("__"))):
            # DCP writes these itself, so they are hashed in a pass after its own fsync.
            out[f"{DCP_DIR}/{p.name}"] = digest_path(p)
    return out


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


class Window(Protocol):
    """The run's accumulation window as a checkpoint sees it (``run.step``'s Training)."""

    every: int

    @property
    def window(self) -> int: ...  # micro-steps done in the open window (0: none)

    def open_state(self) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
        """What the open window holds besides its micro-steps and gradients: what is the
        same on every rank (the manifest keeps it) and this rank's own (its rank file)."""
        ...

    def reopen(self, done: int, shared: Mapping[str, Any] | None = None,
               own: Mapping[str, Any] | None = None) -> None: ...


def window_state(window: Window | None, models: Mapping[str, nn.Module]
                 ) -> tuple[dict[str, Any] | None, dict[str, dict[str, torch.Tensor]],
                            dict[str, Any]]:
    """A window open at a save: its manifest entry (micro-steps done, ``every``, the state
    every rank shares), this rank's gradients accumulated in it (host copies: the next
    micro-step changes the live ones), by model and parameter name, and this rank's own
    state of it. ``(None, {}, {})`` when none is open."""
    if window is None or not window.window:
        return None, {}, {}
    grads = {n: {k: g.detach().to("cpu", copy=True)
                 for k, g in for_model(m).window_grads(m).items()} for n, m in models.items()}
    shared, own = window.open_state()
    entry: dict[str, Any] = {"done": window.window, "every": window.every}
    if shared:
        entry["state"] = dict(shared)
    return entry, grads, dict(own)


def _nbytes(obj: Any) -> int:
    return sum(local_tensor(t).numel() * t.element_size() for _, t in iter_tensors(obj))


def build_job(reg: Registered, storage: Storage, loaders: Sequence[DeviceLoader], *,
              step: int, epoch: int | None, extra: Mapping[str, Any], blocking: bool,
              group: Any, stager: Stager | None = None, call: Any = None,
              window: Window | None = None) -> SaveJob:
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
    open_window, grads, own = window_state(window, reg.models)
    parts: dict[str, Any] = {
        rank_file(reg.rank): {"rng": capture_rng(reg.generators),
                              "generators": [g for _, g in positions], "window": grads,
                              "window_own": own, "buffers": rank_buffers(reg.models)},
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
    if open_window is not None:  # a save inside an accumulation window keeps it
        body["window"] = open_window
    return SaveJob(storage=storage, work=work, step=step, rank=reg.rank, keep=reg.keep,
                   body=body, parts=parts, after_parts=after, group=group,
                   final=storage.where(step_dirname(step)), nbytes=nbytes,
                   call=call or direct, world_size=reg.world_size)


class SaveWatch(Observer):
    """Attached while a background save is in flight: its outcome surfaces at ``run.step``
    (``owner.settle``: the run's Checkpointer)."""

    def __init__(self, owner: Any) -> None:
        self.owner = owner

    def on_step_end(self, optimizer: torch.optim.Optimizer, norm: torch.Tensor | None,
                    stepped: bool = True) -> None:
        # After the step, not before: each rank learns of the failure at its own step, and a
        # rank that raised before stepping would have skipped a step the others took.
        self.owner.settle(wait=False)
