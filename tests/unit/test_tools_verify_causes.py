"""verify offers a cause only when the records show the script can have it: no BatchNorm
advice with SyncBatchNorm or at the same world size; global-RNG draws counted per step on
each side and named as augmentation."""

from __future__ import annotations

import random

import numpy as np
import torch

from splitsync.tools.verify.compare import compare_runs, likely_cause
from splitsync.tools.verify.draws import Draws, words_between
from splitsync.tools.verify.pair import Side, compare_pair, pair_cause


def _step(loss: float, rows: list[str], draws: dict | None = None) -> dict:
    return {"loss": loss, "grad_norm": loss, "rows": rows, "indices": [], "pass": 0,
            "micro": 1, "optimizer_steps": 0.0, "lr": [0.1],
            "draws": draws or {"python": 0, "numpy": 0, "torch": 0}}


def _record(steps: list[dict], modules: list[str], world: int = 1,
            resumed: int | None = None) -> dict:
    return {"steps": steps, "passes": [], "init_hash": "h", "modules": modules,
            "used_run_loader": True, "world_size": world, "first_step": 0,
            "resumed_step": resumed, "saves": []}


def _one_vs_two(modules: list[str], draws: tuple[int, int] = (0, 0)) -> str | None:
    d1, d2 = ({"python": k, "numpy": 0, "torch": 0} for k in draws)
    single = _record([_step(1.0, ["a", "b", "c", "d"], d1), _step(0.9, ["e", "f", "g", "h"], d1)],
                     modules)
    multi = [_record([_step(1.0, ["a", "b"], d2), _step(0.7, ["e", "f"], d2)], modules, 2),
             _record([_step(1.0, ["c", "d"], d2), _step(0.7, ["g", "h"], d2)], modules, 2)]
    results = compare_runs(single, multi, 2)
    assert any(r.check == "per-step loss" and not r.ok for r in results)
    return likely_cause(results, single, multi, 2)


def test_batchnorm_advice_only_without_syncbatchnorm() -> None:
    plain = _one_vs_two(["BatchNorm2d", "Linear"])
    assert plain is not None and "sync_batchnorm=True" in plain
    for synced in (["SyncBatchNorm", "Linear"], ["CPUSyncBatchNorm", "Linear"]):
        cause = _one_vs_two(synced)
        assert cause is not None and "BatchNorm" not in cause, cause


def test_global_rng_draws_are_counted_and_named_as_augmentation() -> None:
    cause = _one_vs_two(["BatchNorm2d", "Linear"], draws=(8, 4))
    assert cause is not None and cause.startswith("Random augmentation"), cause
    assert "Python's random drew 8 words a step in the 1-process run and 4 words a step" \
        in cause


def _pair(modules: list[str], world: int, draws: tuple[int, int] = (0, 0)) -> str | None:
    da, db = ({"python": 0, "numpy": k, "torch": 0} for k in draws)
    ref = Side("straight", [_record([_step(1.0, ["a"], da), _step(0.9, ["b"], da)], modules,
                                    world)] * world, {"w": torch.ones(2)})
    other = Side("resumed", [_record([_step(1.0, ["a"], db), _step(0.8, ["b"], db)], modules,
                                     world, resumed=0)] * world, {"w": torch.ones(2)})
    results = compare_pair(ref, other)
    assert any(r.check == "per-step loss" and not r.ok for r in results)
    return pair_cause(results, ref, other)


def test_no_batchnorm_blame_at_the_same_world_size() -> None:
    assert _pair(["BatchNorm2d"], 2) is None  # each rank normalises the same samples
    cause = _pair(["BatchNorm2d"], 2, draws=(3, 5))
    assert cause is not None and "NumPy's np.random drew 3 words a step in the straight " \
        "run and 5 words a step on each rank of the resumed run" in cause


def test_draws_are_counted_in_words_between_states() -> None:
    before = random.getstate()
    for _ in range(700):
        random.random()  # two words each
    assert words_between(before, random.getstate()) == 1400
    draws = Draws()
    random.getrandbits(32)
    np.random.rand(3)
    torch.rand(1)
    assert draws.mark() == {"python": 1, "numpy": 6, "torch": 1}
    assert draws.mark() == {"python": 0, "numpy": 0, "torch": 0}
