"""Fault tolerance as a part of the Run: :class:`FaultTolerance`, which the Run of
``init(fault_tolerance="torchft")`` delegates to (``splitsync.run.tolerance``). The same Run,
verbs and script as without fault tolerance; what differs:

- ``run.model``: DDP (or FSDP2 for ``hsdp``) inside the replica group, with a gradient hook
  that then averages across the groups of the step's quorum (:mod:`splitsync.ft.hooks`);
- ``run.loader``: the first loader is the training loader, its batches chosen from the global
  cursor after each step's quorum (:mod:`splitsync.ft.loader`); later loaders (evaluation)
  are read by every group on its own, as without fault tolerance;
- ``run.resume``: also registers the cursor and the Manager's state, builds the Manager, and
  takes the first quorum (a group that is behind receives its peers' state there);
- ``run.step``: steps only when the step commits; returns a :class:`StepOutcome`;
- ``run.save``: written by one group (the first of the last quorum), None elsewhere;
- ``run.epochs``, ``run.progress``, ``run.log`` and registered LR schedulers follow the
  committed steps only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from splitsync.ckpt.state import (
    load_model_state,
    load_optimizer_state,
    model_state,
    optimizer_state,
)
from splitsync.ft.hooks import HookState, install_ddp_hook, install_fsdp_hook
from splitsync.ft.loader import FTLoader
from splitsync.ft.manager import build_manager
from splitsync.ft.options import FTOptions
from splitsync.ft.steps import FTSession, StepOutcome
from splitsync.observe import overriding, step_end_calls
from splitsync.output.metrics import average_metrics, weighted_metrics
from splitsync.output.progress import progress as _progress

if TYPE_CHECKING:
    from splitsync.ckpt import ResumeState
    from splitsync.ckpt.checkpointer import Checkpointer
    from splitsync.distributed.env import DistEnv
    from splitsync.observe import Observer
    from splitsync.run.data import Loaders

__all__ = ["FaultTolerance", "StepOutcome", "RESERVED_NAMES"]

RESERVED_NAMES = ("ft_data", "ft_manager")


class _ManagerState:
    """The Manager's step count as a registered object: saved in durable checkpoints, and
    held until the Manager exists when a checkpoint is loaded before it is built."""

    def __init__(self, session: FTSession) -> None:
        self.session = session
        self.pending: dict[str, int] | None = None

    def state_dict(self) -> dict[str, int]:
        manager = self.session.manager
        if manager is None:
            return dict(self.pending or {"step": 0, "batches_committed": 0})
        return {k: int(v) for k, v in manager.state_dict().items()}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.pending = {k: int(v) for k, v in state.items()}
        if self.session.manager is not None:
            self.session.manager.load_state_dict(self.pending)


class FaultTolerance:
    """The decisions of a Run whose steps survive the loss of a replica group (see the
    module doc); the :class:`~splitsync.run.tolerance.Tolerance` of a fault-tolerant run."""

    preemptible = False  # a group told to stop is a group lost, which the others train through

    def __init__(self, ft: FTOptions, *, env: DistEnv, device: torch.device, backend: str,
                 seed: int, data: Loaders, checkpoints: Checkpointer,
                 observers: Callable[[], Sequence[Observer]]) -> None:
        self.ft = ft
        self.env = env
        self.rank, self.world_size = env.rank, env.world_size
        self.device, self.backend, self.seed = device, backend, seed
        self._data = data
        self._checkpoints = checkpoints
        self._observers = observers
        self._session = FTSession(ft, restart_count=env.restart_count,
                                  world_size=env.world_size, agree=_group_agrees)
        self._manager_state = _ManagerState(self._session)
        self._train_loader: FTLoader | None = None
        self._guarded: set[int] = set()

    # --- who -------------------------------------------------------------------------------
    @property
    def group(self) -> int:
        """This process's replica group (0 to ``groups - 1``)."""
        return self.ft.group

    @property
    def groups(self) -> int:
        """Replica groups in the job."""
        return self.ft.groups

    @property
    def session(self) -> FTSession:
        """The group's torchft session (its Manager, cursor and the step under way)."""
        return self._session

    # --- model: the wrapper ------------------------------------------------------------------
    def model(self, name: str | None, options: dict[str, Any],
              wrap: Callable[[str, dict[str, Any]], nn.Module]) -> nn.Module:
        """``run.model`` with the replica groups averaged by torchft: ``ddp`` (DDP inside the
        group, ``find_unused_parameters=True`` so that its buckets never change and match
        across groups) or ``hsdp`` (FSDP2 sharded inside the group)."""
        name = "ddp" if name in (None, "auto") else name
        if name not in ("ddp", "hsdp"):
            raise ValueError(f"fault_tolerance='torchft' trains with strategy 'ddp' or 'hsdp' "
                             f"(replicas across groups, averaged by torchft); got {name!r}.")
        if name == "ddp":
            if options.get("find_unused_parameters") is False:
                raise ValueError(
                    "fault_tolerance='torchft' needs DDP's find_unused_parameters=True: it keeps "
                    "DDP from rebuilding its buckets after the first step, so a recovered group's "
                    "buckets match its peers'.")
            wrapped = wrap("ddp", {**options, "find_unused_parameters": True})
            install_ddp_hook(wrapped, HookState(self._session, dist.group.WORLD,  # type: ignore[arg-type]
                                                self.world_size))
            return wrapped
        bad = sorted(set(options) & {"replicate", "shard"})
        if bad:
            raise ValueError(f"strategy='hsdp' under fault_tolerance='torchft' shards inside "
                             f"the replica group and replicates across groups: {bad} do not "
                             "apply.")
        wrapped = wrap("fsdp", options)
        install_fsdp_hook(wrapped, self._session)
        return wrapped

    # --- data: the cursor --------------------------------------------------------------------
    def loader(self, data: Any, batch_size: int | None, options: dict[str, Any],
               plain: Callable[[], Any]) -> Any:
        """The first loader is the training loader (batches from the global cursor, see
        :class:`~splitsync.ft.loader.FTLoader`); later ones are read by each group alone."""
        if self._train_loader is not None:
            return plain()
        shuffle, drop_last = options.pop("shuffle"), options.pop("drop_last")
        collate_fn = options.pop("collate_fn")
        if options.pop("num_workers") or options:
            raise ValueError(
                "the training loader of a fault-tolerant run reads its batches in the training "
                "process, once each step's quorum has chosen them: num_workers and "
                f"DataLoader options {sorted(options)} do not apply; pass num_workers=0.")
        if isinstance(data, torch.utils.data.DataLoader):
            batch_size = batch_size or data.batch_size
            collate_fn = collate_fn or data.collate_fn
            data = data.dataset
        if batch_size is None:
            raise TypeError("run.loader(dataset, batch_size=...) needs a per-process "
                            "batch_size.")
        loader = FTLoader(data, batch_size, shuffle=shuffle, drop_last=drop_last,
                          collate_fn=collate_fn, seed=self.seed, rank=self.rank,
                          world_size=self.world_size, device=self.device,
                          hooks=self._data.hooks, session=self._session)
        self._train_loader = loader
        self._data.all.append(loader)  # type: ignore[arg-type]
        self._checkpoints.attach_loader(loader)  # type: ignore[arg-type]
        return loader

    def epochs(self, n: int, start: int, plain: Callable[[int, int], Iterator[int]]
               ) -> Iterator[int]:
        """Epochs ``start``..``n-1`` as the cursor reaches them: an epoch the job finished
        while this group was away is not trained again."""
        for obs in overriding(self._observers(), "epochs"):
            n = obs.epochs(start, n)
        if self._train_loader is not None:  # the last step takes no group-batch beyond epoch n
            self._session.limit = n * self._train_loader.order.per_epoch
        epoch = max(start, self._cursor_epoch(start))
        while epoch < n:
            for loader in self._data.all:
                loader.set_epoch(epoch)
            for obs in overriding(self._observers(), "on_epoch"):
                obs.on_epoch(epoch)
            yield epoch
            epoch = max(epoch + 1, self._cursor_epoch(epoch + 1))

    def _cursor_epoch(self, default: int) -> int:
        loader = self._train_loader
        return default if loader is None else loader.epoch_now()

    def progress(self, iterable: Iterable[Any], desc: str, every: int | None,
                 plain: Callable[[], Iterable[Any]]) -> Iterable[Any]:
        """Over the training loader: the epoch's group-batches that committed steps took."""
        if iterable is not self._train_loader or self.rank != 0:
            return plain()
        return self._committed_progress(iterable, desc, every)

    def _committed_progress(self, loader: FTLoader, desc: str, every: int | None
                            ) -> Iterator[Any]:
        order, cursor = loader.order, self._session.cursor
        begin = loader.epoch_now() * order.per_epoch
        marks = _Marks()
        bar = iter(_progress(marks, show=True, total=order.per_epoch, desc=desc, every=every))
        seen = cursor.cursor
        for _ in range(seen - begin):
            next(bar)
        for batch in loader:
            yield batch
            for _ in range(min(cursor.cursor, begin + order.per_epoch) - seen):
                next(bar)
            seen = cursor.cursor
        marks.done = True
        for _ in bar:
            pass

    # --- training: the decision to commit ----------------------------------------------------
    def backward(self, count: Any) -> None:
        """``run.backward(loss, count=...)`` is refused: torchft's reduction of the gradients
        is its own, so the count cannot ride in it (docs/token-losses.md)."""
        if count is not None:
            raise NotImplementedError(
                "run.backward(loss, count=...) is not available under "
                "fault_tolerance='torchft': torchft all-reduces the gradients itself, over the "
                "groups of each quorum. Use a loss that is the mean over the micro-batch "
                "without count=, or run without fault tolerance.")

    def step(self, optimizer: torch.optim.Optimizer, clip: float | None,
             plain: Callable[[torch.optim.Optimizer, float | None], Any]) -> StepOutcome:
        """Step ``optimizer`` if this step commits (every group of its quorum agreed); else
        zero its gradients: the step's samples are trained again at the next step. Returns
        a :class:`~splitsync.ft.steps.StepOutcome`, truthy when the step counted."""
        session = self._session
        if session.decide():
            result = plain(optimizer, clip)
            return StepOutcome(True, session.step, session.taking, result.norm)
        optimizer.zero_grad(set_to_none=True)
        for call in step_end_calls(self._observers()):
            call(optimizer, None, False)  # observers: nothing stepped, nothing counts
        return StepOutcome(False, session.step, session.taking, None)

    def log(self, metrics: dict[str, Any], count: Any,
            plain: Callable[[dict[str, Any], Any], dict[str, int | float]]
            ) -> dict[str, int | float]:
        """``run.log`` of a committed step, numbered by committed steps; after a discarded
        step the means (weighed by ``count=`` when given) are returned but not written."""
        if not self._session.last_committed:
            if count is None:
                return average_metrics(metrics, self.device)
            return weighted_metrics(metrics, count, self.device)[0]
        if metrics and "step" not in metrics:
            metrics["step"] = self._session.step
        return plain(metrics, count)

    # --- checkpoints: the writer -------------------------------------------------------------
    def resume(self, objects: dict[str, Any],
               plain: Callable[[dict[str, Any]], ResumeState]) -> ResumeState:
        """``run.resume``, plus the data cursor and the Manager's state; then the Manager is
        built (last: a group heartbeating long before its first quorum would hold up its
        peers) and, when the training loader exists, the first quorum is taken: a group
        that is behind its peers receives their state here."""
        taken = sorted(set(objects) & set(RESERVED_NAMES))
        if taken:
            raise TypeError(f"run.resume(...) cannot register objects named {taken} under "
                            "fault_tolerance='torchft' (splitsync's own); rename them.")
        state = plain({**objects, "ft_data": self._session.cursor,
                       "ft_manager": self._manager_state})
        self._guard_schedulers()
        session = self._session
        if session.manager is None:
            env = self.env
            manager = build_manager(self.ft, rank=self.rank, world_size=self.world_size,
                                    store_addr=env.master_addr, store_port=env.master_port,
                                    device=self.device, backend=self.backend,
                                    load_state_dict=self._load_peer_state,
                                    state_dict=self._peer_state)
            session.attach(manager, self._manager_state.pending)
        if self._train_loader is not None:
            session.begin()
        return replace(state, step=self._checkpoints.step,
                       epoch=self._cursor_epoch(state.epoch))

    def writes(self) -> bool:
        """``run.save`` writes in one group, the first of the last quorum (every group calls
        it; one checkpoint is written); it returns None on the others."""
        return self._session.writer

    def _peer_state(self) -> dict[str, Any]:
        """What a recovering group receives: everything run.resume registered, as this
        rank holds it (its shards under FSDP2), and the step count."""
        reg = self._checkpoints.registered
        assert reg is not None
        return {"models": {n: model_state(m, full=False, offload=False)
                           for n, m in reg.models.items()},
                "optims": {n: optimizer_state(reg.models[owner], o, full=False, offload=False)
                           for n, (o, owner) in reg.optims.items()},
                "objects": {n: o.state_dict() for n, o in reg.others.items()
                            if n != "ft_manager"},
                "step": self._checkpoints.step}

    def _load_peer_state(self, state: dict[str, Any]) -> None:
        start = time.perf_counter()
        reg = self._checkpoints.registered
        assert reg is not None
        for n, m in reg.models.items():
            load_model_state(m, state["models"][n], full=False)
        for n, (o, owner) in reg.optims.items():
            load_optimizer_state(reg.models[owner], o, state["optims"][n], full=False)
        for n, o in reg.others.items():
            if n in state["objects"]:
                o.load_state_dict(state["objects"][n])
        self._checkpoints.step = int(state["step"])
        self._session.on_recovered(time.perf_counter() - start)

    def _guard_schedulers(self) -> None:
        # An LR scheduler registered with run.resume steps only after a committed step, so a
        # script's plain `run.step(opt); sched.step()` keeps its schedule under discards.
        reg = self._checkpoints.registered
        for obj in ([] if reg is None else reg.others.values()):
            if isinstance(obj, torch.optim.lr_scheduler.LRScheduler) and id(obj) not in \
                    self._guarded:
                self._guarded.add(id(obj))
                obj.step = _committed_only(obj.step, self._session)  # type: ignore[method-assign]

    def close(self) -> None:
        self._session.close()


class _Marks:
    """An iterable of nothing that ends once ``done`` is set: the items the progress bar
    counts (one per group-batch a committed step took)."""

    def __init__(self) -> None:
        self.done = False

    def __iter__(self) -> Iterator[None]:
        while not self.done:
            yield None


def _group_agrees(values: list[int]) -> bool:
    """Whether every rank of the replica group holds ``values`` (one small all-reduce)."""
    both = torch.tensor([*values, *(-v for v in values)], dtype=torch.int64)
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    n = len(values)
    return all(int(both[i]) == -int(both[n + i]) for i in range(n))


def _committed_only(step: Any, session: FTSession) -> Any:
    def step_if_committed(*args: Any, **kwargs: Any) -> Any:
        if session.last_committed:
            return step(*args, **kwargs)
        return None

    return step_if_committed

