"""What differs when a run is fault tolerant: a part the :class:`~splitsync.run.runtime.Run`
delegates to, the way it delegates to a strategy.

The Run's verbs are the same in every mode (one class, one signature each); at the few
points where a fault-tolerant run decides otherwise, the verb asks its part. :class:`Plain`
(no fault tolerance) hands every decision back unchanged; ``splitsync.ft.part``
``FaultTolerance`` (``init(fault_tolerance="torchft")``) decides whether a step commits, who
writes a checkpoint, how a model is wrapped across replica groups and which batches the
training loader reads. ``plain`` arguments are what the Run does without fault tolerance,
for the part to call (or not).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from torch import nn

    from splitsync.ckpt.load import ResumeState

__all__ = ["Tolerance", "Plain", "PLAIN"]


class Tolerance(Protocol):
    """The decisions a Run leaves to its fault-tolerance part."""

    #: replica groups in the job, and this process's (1 and 0 without fault tolerance)
    groups: int
    group: int
    #: whether ``run.resume`` arms preemption handling
    preemptible: bool

    @property
    def session(self) -> Any:
        """The group's torchft session (None without fault tolerance)."""
        ...

    def model(self, name: str, options: dict[str, Any],
              wrap: Callable[[str, dict[str, Any]], nn.Module]) -> nn.Module:
        """``run.model`` under strategy ``name`` (config's if None was given, "auto" kept)."""
        ...

    def loader(self, data: Any, batch_size: int | None, options: dict[str, Any],
               plain: Callable[[], Any]) -> Any:
        """``run.loader``; ``options``: its keyword arguments."""
        ...

    def epochs(self, n: int, start: int, plain: Callable[[int, int], Iterator[int]]
               ) -> Iterator[int]:
        """``run.epochs``."""
        ...

    def progress(self, iterable: Iterable[Any], desc: str, every: int | None,
                 plain: Callable[[], Iterable[Any]]) -> Iterable[Any]:
        """``run.progress``."""
        ...

    def backward(self, count: Any) -> None:
        """Before ``run.backward(loss, count=...)``: refuse what this mode cannot do."""
        ...

    def step(self, optimizer: torch.optim.Optimizer, clip: float | None,
             plain: Callable[[torch.optim.Optimizer, float | None], Any]) -> Any:
        """``run.step``: whether and how the optimizer steps, and what it returns."""
        ...

    def log(self, metrics: dict[str, Any], count: Any,
            plain: Callable[[dict[str, Any], Any], dict[str, int | float]]
            ) -> dict[str, int | float]:
        """``run.log``: whether the record is written, and its step."""
        ...

    def resume(self, objects: dict[str, Any],
               plain: Callable[[dict[str, Any]], ResumeState]) -> ResumeState:
        """``run.resume`` with ``objects`` (the caller's, EMAs included)."""
        ...

    def writes(self) -> bool:
        """Whether this process's ``run.save`` writes (False: it returns None)."""
        ...

    def close(self) -> None:
        """``run.close`` ended."""
        ...


class Plain:
    """No fault tolerance: every decision is the Run's own."""

    groups = 1
    group = 0
    preemptible = True

    @property
    def session(self) -> Any:
        return None

    def model(self, name: str, options: dict[str, Any],
              wrap: Callable[[str, dict[str, Any]], nn.Module]) -> nn.Module:
        return wrap(name, options)

    def loader(self, data: Any, batch_size: int | None, options: dict[str, Any],
               plain: Callable[[], Any]) -> Any:
        return plain()

    def epochs(self, n: int, start: int, plain: Callable[[int, int], Iterator[int]]
               ) -> Iterator[int]:
        return plain(n, start)

    def progress(self, iterable: Iterable[Any], desc: str, every: int | None,
                 plain: Callable[[], Iterable[Any]]) -> Iterable[Any]:
        return plain()

    def backward(self, count: Any) -> None:
        return None

    def step(self, optimizer: torch.optim.Optimizer, clip: float | None,
             plain: Callable[[torch.optim.Optimizer, float | None], Any]) -> Any:
        return plain(optimizer, clip)

    def log(self, metrics: dict[str, Any], count: Any,
            plain: Callable[[dict[str, Any], Any], dict[str, int | float]]
            ) -> dict[str, int | float]:
        return plain(metrics, count)

    def resume(self, objects: dict[str, Any],
               plain: Callable[[dict[str, Any]], ResumeState]) -> ResumeState:
        return plain(objects)

    def writes(self) -> bool:
        return True

    def close(self) -> None:
        return None


#: The part of every run without fault tolerance (it holds no state).
PLAIN = Plain()
