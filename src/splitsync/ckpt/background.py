"""Writing a checkpoint: staged in host memory, then written, checksummed and committed,
in the caller's thread (a blocking save) or in one background thread (``blocking=False``).

The background thread never touches the training loop's process group: its handshakes (every
rank's file list to rank 0, the outcome back) run on a separate gloo group made once, by
every rank together, at the first background save. Collectives on different groups do not
interleave, so the loop may all-reduce while a save finishes. They go through
:mod:`splitsync.distributed.comm` and the run's ``call``, so observers (the hang guard) see them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from splitsync.ckpt.chunked import write_object
from splitsync.ckpt.faults import DISK_FULL, describe_failure
from splitsync.ckpt.fs import Storage
from splitsync.ckpt.store import CheckpointError, manifest_text
from splitsync.distributed import comm

__all__ = ["SaveJob", "SaveHandle", "side_group", "destroy_side_group", "run_job",
           "gather", "broadcast", "direct", "start"]


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
