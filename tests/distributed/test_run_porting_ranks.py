"""Porting at two processes: misspelt keywords refused before DDP sees them, run.generator
per rank and shared through a save and a resume, and the stream loader's collectives seen
by the observers (so the hang guard watches them). One spawn for all of it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import IterableDataset

import splitsync as ss
from splitsync.observe import Observer
from splitsync.testing import spawn

pytestmark = pytest.mark.slow


class Shards4(IterableDataset):
    """Four shards of five numbers each."""

    n_shards = 4

    def shard(self, num_shards: int, index: int) -> list[torch.Tensor]:
        return [torch.tensor(float(5 * index + i)) for i in range(5)]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return (x for s in range(4) for x in self.shard(4, s))


class Ops(Observer):
    def __init__(self) -> None:
        self.ops: list[str] = []

    def around_collective(self, op: str, fn: Callable[..., Any], *args: Any) -> Any:
        self.ops.append(op)
        return fn(*args)


def _error(fn: Callable[[], Any]) -> str:
    try:
        fn()
    except TypeError as exc:
        return str(exc)
    return "no error"


def _draw(g: torch.Generator) -> list[int]:
    return torch.randint(0, 1 << 30, (3,), generator=g).tolist()


def _port(rank: int, world: int, root: str) -> dict[str, Any]:
    out: dict[str, Any] = {"init": _error(lambda: ss.init(seed=0, precison="bf16-mixed"))}
    with ss.init(seed=4) as run:  # guards on: the stream's all-reduces go through the watch
        out["model"] = _error(lambda: run.model(nn.Linear(2, 1), find_unsused_parameters=True))
        model = run.model(nn.Linear(1, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        mine, shared = run.generator(), run.generator(per_rank=False)
        out["first"] = (_draw(mine), _draw(shared))
        ops = run.add_observer(Ops())
        loader = run.loader(Shards4(), batch_size=2)
        batches = [b.tolist() for b in loader]
        out["stream_ops"] = list(ops.ops)
        run.resume(root, model=model, optimizer=opt)
        for x in batches[:1]:
            run.backward(model(torch.tensor(x).unsqueeze(1)).sum())
            run.step(opt)
        before = len(ops.ops)
        run.save()
        out["save_ops"] = ops.ops[before:]
        out["expected"] = (_draw(mine), _draw(shared))
        state = run.resume(root, model=model, optimizer=opt)  # back to the saved state
        out["restored"] = (_draw(mine), _draw(shared))
        out["step"] = state.step
    return out


def test_keywords_generators_and_stream_collectives_at_two_processes(tmp_path: Any) -> None:
    out = spawn(_port, 2, str(tmp_path / "ck"), timeout=180)
    for o in out:
        assert "did you mean `precision`?" in o["init"].lower(), o["init"]
        assert "did you mean `find_unused_parameters`?" in o["model"].lower(), o["model"]
        assert o["restored"] == o["expected"] and o["step"] == 1
        # the stream agreed where its epoch ends, and run.save took its position, through
        # the observers' around_collective
        assert o["stream_ops"] and set(o["stream_ops"]) == {"all_reduce"}
        assert "all_reduce" in o["save_ops"]
    (mine0, shared0), (mine1, shared1) = out[0]["first"], out[1]["first"]
    assert mine0 != mine1 and shared0 == shared1  # per rank: seeded from (seed, rank)
    assert out[0]["expected"][1] == out[1]["expected"][1]
