"""The walk from ``run.loader(x)`` to the first batch: which splitsync modules it passes through.

Traces every call into ``splitsync.*`` (and into the observer) while ``run.loader(...)`` runs
and then while ``next(iter(loader))`` runs (each after one untraced warm-up, so lazy imports
do not count). Prints, for a map-style dataset and for a stream, with and without an observer
that adjusts loader arguments and watches passes (what ``splitsync verify`` attaches): the
modules entered, in order of the calls; how many distinct modules; how many calls turn back
into a module the walk had already left; and how many calls go up the layers (into a module
already on the call stack, or into an observer, from below).

    OMP_NUM_THREADS=1 python benchmarks/loader_walk.py
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import IterableDataset, TensorDataset

import splitsync as ss
from splitsync.observe import Observer


class Stream(IterableDataset):
    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(torch.arange(16.0).reshape(8, 2))


class Watching(Observer):
    def loader_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return kwargs

    def on_loader_iter(self, loader: Any) -> None:
        pass


OBSERVER_CODE = {f.__code__ for f in (Watching.loader_kwargs, Watching.on_loader_iter)}


def _module(frame: Any) -> str | None:
    if frame is None:
        return None
    if frame.f_code in OBSERVER_CODE:
        return "splitsync.<observer>"
    name = frame.f_globals.get("__name__", "")
    return name if name.startswith("splitsync.") else None


# The layers of tests/unit/test_layers.py, lowest first (an observer is a tool).
LAYERS = (("splitsync.distributed", "splitsync.errors", "splitsync.tree"),
          ("splitsync.observe", "splitsync.train", "splitsync.strategies", "splitsync.data",
           "splitsync.output", "splitsync.ckpt"),
          ("splitsync.run",), ("splitsync.launch", "splitsync.testing"),
          ("splitsync.tools", "splitsync.<observer>"))


def layer(mod: str) -> int:
    return next((i for i, names in enumerate(LAYERS)
                 if any(mod == n or mod.startswith(n + ".") for n in names)), len(LAYERS))


def trace(fn: Callable[[], Any]) -> tuple[Any, list[str], int]:
    """``fn()``, the modules entered by calls in order (repeats collapsed; a generator
    resuming is not a call), and the number of calls that go up the layers."""
    path: list[str] = []
    seen: list[Any] = []  # frames already entered: a later "call" on one is a resumption
    ups = 0

    def prof(frame: Any, event: str, arg: Any) -> None:
        nonlocal ups
        if event != "call" or any(frame is f for f in seen):
            return
        mod = _module(frame)
        if mod is None:
            return
        seen.append(frame)
        if not path or path[-1] != mod:
            path.append(mod)
        caller = frame.f_back
        while caller is not None and _module(caller) is None and caller.f_back is not None:
            caller = caller.f_back  # through torch's frames to the splitsync one that called
        up = _module(caller)
        if up is not None and layer(mod) > layer(up):
            ups += 1

    sys.setprofile(prof)
    try:
        out = fn()
    finally:
        sys.setprofile(None)
    return out, path, ups


def walk(data: Any, observe: bool) -> tuple[list[str], list[str], int]:
    with ss.init(seed=0, guards=False, straggler_threshold=None) as run:
        if observe:
            run.add_observer(Watching())
        next(iter(run.loader(data, batch_size=2, shuffle=True)))  # warm-up: lazy imports
        loader, first, up1 = trace(lambda: run.loader(data, batch_size=2, shuffle=True))
        _, second, up2 = trace(lambda: next(iter(loader)))
        return first, second, up1 + up2


def turn_backs(path: list[str]) -> int:
    return sum(1 for i, m in enumerate(path) if m in path[:i])


def main() -> None:
    for label, data in (("map-style", TensorDataset(torch.arange(8.0))), ("stream", Stream())):
        for observe in (False, True):
            first, second, ups = walk(data, observe)
            short = [[m.removeprefix("splitsync.") for m in p] for p in (first, second)]
            mods = sorted(set(first) | set(second))
            print(f"{label:9s} observer={observe!s:5s}: {len(mods)} modules, "
                  f"{turn_backs(first)} + {turn_backs(second)} turn-backs, {ups} calls up")
            print(f"    run.loader:  {' -> '.join(short[0])}")
            print(f"    first batch: {' -> '.join(short[1])}")


if __name__ == "__main__":
    main()
