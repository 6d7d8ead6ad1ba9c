"""The Run's side of preemption: on a stop request, every rank stops after one agreed step.

Armed by ``run.resume`` for ``init(preempt_signals=..., preempt_file=...)``;
docs/checkpoints.md#preemption has the whole story. Where requests come from, the board,
the watching thread, the exit protocol and requeue live in :mod:`splitsync.preemption`. A
source only notes the request and wakes the thread, so a signal during ``run.save``,
``run.resume``, an evaluation or a loader's start changes nothing until the rank is between
steps.

1. **Request.** The thread (:mod:`splitsync.preemption.watch`) writes it to the board (the
   job's store, :mod:`splitsync.preemption.board`), or sees another rank's there (it looks
   twice a second; nothing else runs per step until then), and adds a forward pre-hook, first in
   line (before FSDP's all-gathers), to each model ``run.resume`` registered. A SIGTERM
   ``splitsync run`` sends because a worker failed is no request: the rank exits at once.
2. **Post.** At its next forward, on the main thread, a rank posts its completed optimizer
   steps and attaches a watch to ``run.step``.
3. **Agree.** S = max(posts) + 1. A rank posts before the backward of the step it is in,
   and nobody completes step M + 1 before every rank's backward of it (the gradient
   all-reduce or reduce-scatter): when any rank has completed S steps every post is in, so
   each rank learns S by its own boundary S and none passes it unaware (and says so then:
   a save follows, which a dead peer would prevent).
4. **Stop.** At boundary S the watch snapshots the RNG states and loader positions. At the
   next forward of a registered model (after the script's own work for step S, before
   step S + 1 touches the model) the rank finishes the save in flight, saves step S with
   the snapshot (unless the script just saved it) and raises ``Preempted``.
5. **Grace.** No stop ``preempt_grace`` seconds after the signal: the thread says so and
   ends the process with the previous checkpoint intact.

Micro-steps are not boundaries (the count moves when the optimizer steps); every rank
reaches boundary S, so a stream loader's collective ``position()`` runs everywhere.
``run.close`` ends the thread, puts the handlers back and, on rank 0, lets the sources act
on the stop: inside a SLURM job stopped by a signal other than SIGTERM, SLURM's source
requeues it (:mod:`splitsync.preemption.slurm`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from splitsync.ckpt.checkpointer import Checkpointer
from splitsync.ckpt.state import capture_rng, loader_position, restore_rng
from splitsync.distributed.group import default_store
from splitsync.distributed.logs import get_logger
from splitsync.distributed.seeding import Generators
from splitsync.errors import Preempted
from splitsync.observe import Observer
from splitsync.preemption.board import Board, Request, make_board
from splitsync.preemption.exit import PREEMPTED_EXIT_CODE, failure_marked, write_note
from splitsync.preemption.sources import Source
from splitsync.preemption.watch import POLL_SECONDS, Watcher
from splitsync.run.config import RunConfig

__all__ = ["Preemption", "preemption_for", "POLL_SECONDS", "COMMIT_SECONDS"]

COMMIT_SECONDS = 5.0  # at the deadline, how long a background save may still take to commit

_WATCHING, _STOPPING, _STOPPED = "watching", "stopping", "stopped"


@dataclass(frozen=True)
class _Frozen:
    """A loader's position and generator state as they were at the stop step's boundary."""

    at: Mapping[str, Any]
    rng: Any

    def position(self) -> Mapping[str, Any]:
        return self.at

    def rng_state(self) -> Any:
        return self.rng


class _StepWatch(Observer):
    """On ``run.step`` from the post on: learn S, and take the snapshot at boundary S."""

    def __init__(self, owner: Preemption) -> None:
        self.owner = owner

    def on_step_end(self, optimizer: Any, norm: Any, stepped: bool = True) -> None:
        self.owner.at_boundary()


class Preemption:
    """One run's preemption handling (see the module doc)."""

    def __init__(self, *, rank: int, world_size: int, sources: Sequence[Source],
                 grace: float, checkpoints: Checkpointer, generators: Generators | None,
                 watch: Callable[[Observer], None], unwatch: Callable[[Observer], None],
                 store: Any | None, environ: Mapping[str, str] | None = None) -> None:
        self.rank = rank
        self.grace = grace
        self.ckpt = checkpoints
        self.generators = generators
        self._watch, self._unwatch = watch, unwatch
        self.environ = os.environ if environ is None else environ
        self.board: Board = make_board(rank, world_size, store)
        self.request: Request | None = None
        self.stop_step: int | None = None
        self.phase = _WATCHING
        self._posted = False
        self._snapshot: tuple[int, dict[str, Any], list[tuple[Any, Any]]] | None = None
        self._step_watch = _StepWatch(self)
        self._hooks: list[Any] = []
        self._lock = threading.Lock()  # hooking models: the thread and run.resume
        self._closed = False
        self._watcher = Watcher(rank=rank, board=self.board, grace=grace, seen=self._seen,
                                sources=sources,
                                stopping=lambda: self.phase != _WATCHING,
                                give_up=self._give_up)

    def _seen(self, request: Request) -> None:
        if failure_marked(self.environ):  # splitsync run stops us: a worker failed
            get_logger().warning("%s came from splitsync run after another worker failed: "
                                 "not a preemption; exiting without a stop.", request.signal)
            sig = getattr(signal, request.signal, None)
            _flushed_exit(128 + int(sig) if isinstance(sig, signal.Signals) else 1)
        self.request = request  # said once the stop step is agreed (a save follows then)
        self._hook_models()

    # --- the models' forward: post, and stop -----------------------------------------------
    def resumed(self) -> None:
        """``run.resume`` registered (maybe other) models: hook those if a stop is asked."""
        with self._lock:
            for handle in self._hooks:
                handle.remove()
            self._hooks = []
        self._hook_models()

    def _hook_models(self) -> None:
        with self._lock:
            reg = self.ckpt.registered
            if self.request is None or self._hooks or reg is None or self.phase != _WATCHING:
                return
            for module in reg.models.values():
                hook = self._at_forward
                if getattr(module, "_compiled_call_impl", None) is not None:
                    import torch._dynamo  # its forward, hooks included, runs compiled

                    hook = torch._dynamo.disable(hook)
                self._hooks.append(module.register_forward_pre_hook(hook, prepend=True))

    def _at_forward(self, module: Any, args: Any) -> None:
        if self.phase != _WATCHING:
            return
        steps = self.ckpt.step
        if not self._posted:
            self._posted = True
            self.board.post(self.rank, steps)
            self._watch(self._step_watch)
        if self.stop_step is not None and steps >= self.stop_step:
            self._stop(steps)

    def at_boundary(self) -> None:
        """After every ``run.step`` once posted: learn S; at boundary S, the snapshot."""
        if self.phase != _WATCHING:
            return
        if self.stop_step is None:
            self.stop_step = self.board.stop_step()
            req = self.request  # agreed: a save follows (a dead peer never posts), so say so
            if self.stop_step is not None and req and self.rank in (0, req.rank):
                get_logger().warning("%s reached rank %d: every rank stops after step %d "
                                     "and saves it.", req.signal, req.rank, self.stop_step)
        steps = self.ckpt.step
        if self.stop_step is not None and steps == self.stop_step:
            loaders = [loader_position(ld) for ld in self.ckpt.loaders]
            self._snapshot = (steps, capture_rng(self.generators), loaders)

    # --- the stop ----------------------------------------------------------------------------
    def _stop(self, steps: int) -> None:
        self.phase = _STOPPING
        self._unhook()
        log = get_logger()
        if steps != self.stop_step:
            log.warning("stopping after step %d, not the agreed %s: the ranks did not step "
                        "together (every rank must run the same optimizer steps).", steps,
                        self.stop_step)
        handle = self.ckpt.inflight
        self.ckpt.settle(wait=True, raise_errors=False)  # the save in flight first
        if handle is not None and handle.error is not None:
            log.warning("the background save of step %d failed (%s); saving step %d now.",
                        handle.step, handle.error, steps)
        saved = self.ckpt.last_saved
        if saved is not None and saved[0] == steps:
            path = saved[1]  # the script saved this very step: nothing to add
        else:
            with self._as_of_boundary(steps):
                path = self.ckpt.save(blocking=True)
        self.phase = _STOPPED
        request = self.request
        assert request is not None
        if self.rank == 0:
            log.warning("stopped after step %d (%s to rank %d, %.1fs ago); checkpoint %s.",
                        steps, request.signal, request.rank, time.time() - request.time, path)
        noted = write_note(self.environ, self.rank, {"status": "saved", "step": steps,
                                                     "path": str(path),
                                                     "signal": request.signal})
        raise Preempted(0 if noted else PREEMPTED_EXIT_CODE, steps, path)

    @contextlib.contextmanager
    def _as_of_boundary(self, steps: int) -> Iterator[None]:
        """The save sees the RNG states and loader positions of boundary S (the batch the
        stopping forward was given is not consumed; its random draws are undone)."""
        snap = self._snapshot
        if snap is None or snap[0] != steps:
            get_logger().warning("no snapshot of step %d's boundary: saving the state as it is "
                                 "now.", steps)
            yield
            return
        _, rng, positions = snap
        restore_rng(rng, self.generators)
        live = self.ckpt.loaders
        frozen = [_Frozen(*positions[i]) if i < len(positions) else ld
                  for i, ld in enumerate(live)]
        self.ckpt.loaders = frozen  # type: ignore[assignment]
        try:
            yield
        finally:
            self.ckpt.loaders = live

    def _give_up(self) -> None:
        """The deadline passed with no stop: say so and end the process (the thread)."""
        noted = False
        try:
            noted = self._say_giving_up()
        finally:
            _flushed_exit(0 if noted else PREEMPTED_EXIT_CODE)

    def _say_giving_up(self) -> bool:
        handle = self.ckpt.inflight
        end = time.time() + COMMIT_SECONDS
        while handle is not None and not handle.done() and time.time() < end:
            time.sleep(0.05)  # a background save about to commit: let it
        request = self.request
        assert request is not None
        saved = self.ckpt.last_saved
        kept = f"step {saved[0]} ({saved[1]})" if saved is not None else "the one it resumed from"
        get_logger().error(
            "no step boundary came within %gs of %s (a long evaluation?): exiting after %d "
            "step(s) with the previous checkpoint intact, %s; steps after it are lost. "
            "Raise init(preempt_grace=...) if the environment waits longer before killing.",
            self.grace, request.signal, self.ckpt.step, kept)
        self._after_stop(request)
        return write_note(self.environ, self.rank, {
            "status": "deadline", "step": None if saved is None else saved[0],
            "path": None if saved is None else str(saved[1]), "signal": request.signal})

    # --- teardown ----------------------------------------------------------------------------
    def _unhook(self) -> None:
        with self._lock:
            for handle in self._hooks:
                handle.remove()
            self._hooks = []
        if self._posted:
            self._unwatch(self._step_watch)

    def close(self, clean: bool = True) -> None:
        """``run.close`` begins: no stop from now on; the thread ends, handlers go back. A
        run asked to stop that ended its work first tells ``splitsync run`` so."""
        if self._closed:
            return
        self._closed = True
        if clean and self.request is not None and self.phase == _WATCHING:
            write_note(self.environ, self.rank, {"status": "finished", "step": self.ckpt.step,
                                                 "signal": self.request.signal})
        self._watcher.close()  # the thread ends, the signal handlers go back
        self._unhook()

    def after_close(self) -> None:
        """``run.close`` ended: rank 0 of a stopped run lets its sources act (SLURM's asks
        to queue the job again)."""
        if self.phase == _STOPPED and self.request is not None:
            self._after_stop(self.request)

    def _after_stop(self, request: Request) -> None:
        if self.rank != 0:
            return
        for source in self._watcher.sources:
            said = source.after_stop(request.signal)
            if said:
                get_logger().warning("%s", said)


def _flushed_exit(code: int) -> None:
    """End the process from the watching thread, what was logged written out first."""
    for handler in get_logger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    logging.shutdown()
    os._exit(code)


def preemption_for(config: RunConfig, rank: int, world_size: int, checkpoints: Checkpointer,
                   generators: Generators | None, watch: Callable[[Observer], None],
                   unwatch: Callable[[Observer], None]) -> Preemption | None:
    """The run's preemption handling, armed by its first ``run.resume``: None when
    nothing can stop the run (``init(preempt_signals=())`` and no stop file), or where the
    ranks have no store to agree through (said)."""
    chosen = config.preemption  # parsed once, by PreemptionSettings
    if not chosen.armed:
        return None
    store = default_store() if world_size > 1 else None
    if world_size > 1 and store is None:
        get_logger().warning("the process group has no store to agree on a stop step through: "
                             "%s will not stop this run at an agreed step.",
                             "/".join(chosen.preempt_signals) or "the stop file")
        return None
    return Preemption(rank=rank, world_size=world_size, sources=chosen.sources(),
                      grace=chosen.preempt_grace, checkpoints=checkpoints,
                      generators=generators, watch=watch, unwatch=unwatch, store=store)
