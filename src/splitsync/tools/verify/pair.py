"""Compare two launches of a script at the same steps and name a likely cause (pure).

Used by ``verify --strategies`` (one strategy against another), ``--accumulate K`` (K
micro-batches per step against one batch K times larger) and ``--resume`` (a resumed run
against one that ran straight through). Steps are matched by their global index, so a run
resumed at step s is compared from step s on.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from splitsync.tools.verify.checks import Result, not_checkable
from splitsync.tools.verify.compare import (
    UNSHUFFLED,
    counted,
    lr_row,
    step_loss,
    summed_micro_steps,
    unshuffled,
)
from splitsync.tools.verify.rng import augmentation_cause, plain_batchnorm

__all__ = ["Side", "compare_pair", "pair_cause", "tolerance"]

Record = dict[str, Any]


@dataclass(frozen=True)
class Side:
    """One launch's records: per rank, and its final parameters (None if not written)."""

    label: str
    records: list[Record]
    params: Mapping[str, torch.Tensor] | None


def tolerance(params: Mapping[str, torch.Tensor]) -> tuple[float, float]:
    """(rtol, atol) for the parameters' dtype: fp32 sums in another order differ in the
    last bits; bf16/fp16 in the third digit."""
    low = any(t.dtype in (torch.bfloat16, torch.float16) for t in params.values())
    return (2e-2, 2e-2) if low else (1e-4, 1e-5)


def _steps(side: Side) -> dict[int, list[Record]]:
    """Global step index -> that step's record on every rank."""
    first = side.records[0]["first_step"]
    count = min(len(r["steps"]) for r in side.records)
    return {first + i: [r["steps"][i] for r in side.records] for i in range(count)}


def _samples(per_rank: list[Record], use_indices: bool) -> Counter[Any]:
    key = "indices" if use_indices else "rows"
    return Counter(x for rec in per_rank for x in rec[key])


def _loss(per_rank: list[Record]) -> float | None:
    return step_loss(per_rank)


def _close(a: float | None, b: float | None, rtol: float, exact: bool) -> bool:
    if a is None or b is None:
        return a is b
    return a == b if exact else math.isclose(a, b, rel_tol=rtol, abs_tol=1e-7)


def compare_pair(ref: Side, other: Side, *, exact: bool = False,
                 samples_differ_ok: str | None = None) -> list[Result]:
    """The checks of ``other`` against ``ref``. ``exact``: bit-equal (same world size
    resumed). ``samples_differ_ok``: the reason the samples may legitimately differ."""
    a, b = _steps(ref), _steps(other)
    shared = sorted(set(a) & set(b))
    out = [Result("steps compared", bool(shared), f"steps {shared[0]}..{shared[-1]}" if shared
                  else f"no step in common ({ref.label}: {sorted(a)[:1]}..., {other.label}: "
                       f"{sorted(b)[:1]}...)")]
    if not shared:
        return out
    use_idx = all(rec["indices"] for s in shared for rec in a[s] + b[s])
    bad = next((s for s in shared if _samples(a[s], use_idx) != _samples(b[s], use_idx)), None)
    same_data = Result("same samples per step", bad is None,
                       "every step trained on the same samples" if bad is None else
                       f"step {bad}: {ref.label} and {other.label} trained on different samples")
    if bad is not None and samples_differ_ok:
        same_data = not_checkable("same samples per step", samples_differ_ok)
    out.append(same_data)
    rates = lr_row([a[s][0].get("lr") for s in shared], [b[s][0].get("lr") for s in shared],
                   ref.label, other.label, shared)
    out += [rates] if rates is not None else []
    params = ref.params or other.params or {}
    rtol, _ = tolerance(params) if params else (1e-4, 1e-5)
    rows = (("per-step loss", lambda s, side: _loss(side[s])),
            ("per-step gradient norm", lambda s, side: side[s][0]["grad_norm"]))
    for name, value in rows:
        if not same_data.checkable:
            out.append(not_checkable(name, samples_differ_ok or ""))
            continue
        i = next((s for s in shared if not _close(value(s, a), value(s, b), rtol, exact)), None)
        how = "bit-equal" if exact else f"equal within rtol {rtol:g}"
        out.append(Result(name, i is None, how if i is None else
                          f"first differs at step {i}: {ref.label} {value(i, a):.8g}, "
                          f"{other.label} {value(i, b):.8g}"))
    out.append(_params(ref, other, exact, same_data.checkable))
    return out


def _params(ref: Side, other: Side, exact: bool, checkable: bool) -> Result:
    name = "final parameters"
    if not checkable:
        return not_checkable(name, "the runs trained on different samples")
    if ref.params is None or other.params is None:
        missing = ref.label if ref.params is None else other.label
        return Result(name, False, f"the {missing} run did not reach the last step")
    if ref.params.keys() != other.params.keys():
        return Result(name, False, "the runs have different parameter names")
    rtol, atol = tolerance(ref.params)
    worst, where = 0.0, ""
    for k, t in ref.params.items():
        u = other.params[k]
        if t.shape != u.shape:
            return Result(name, False, f"{k}: shape {tuple(t.shape)} vs {tuple(u.shape)}")
        if exact and not torch.equal(t, u):
            diff = float((t.float() - u.float()).abs().max())
            return Result(name, False, f"{k} differs (max |diff| {diff:.2e}); bit-equality "
                                       "is expected at the same world size")
        diff = float(((t.float() - u.float()).abs() - rtol * u.float().abs()).max())
        if diff > worst:
            worst, where = diff, k
    if exact:
        return Result(name, True, f"bit-equal ({len(ref.params)} tensors)")
    return Result(name, worst <= atol, f"equal within rtol {rtol:g}, atol {atol:g}"
                  if worst <= atol else f"{where} differs by {worst:.2e} beyond rtol {rtol:g}")


def pair_cause(results: Sequence[Result], ref: Side, other: Side,
               token_mean: str | None = None) -> str | None:
    """The first failure's likely cause, named only from what the records show
    (``token_mean``: as for :func:`~splitsync.tools.verify.compare.likely_cause`)."""
    failed = [r.check for r in results if not r.ok]
    if not failed:
        return None
    a, b = _steps(ref), _steps(other)
    shared = sorted(set(a) & set(b))
    if "same samples per step" in failed and shared:
        return _data_cause(ref, other)
    if "per-step learning rate" in failed and shared:
        detail = next(r.detail for r in results if r.check == "per-step learning rate")
        return _lr_cause(ref, other, a[shared[0]][0], b[shared[0]][0], detail)
    if {"per-step loss", "per-step gradient norm"} & set(failed) and shared:
        first = shared[0]
        la = [_loss(a[s]) for s in shared]
        lb = [_loss(b[s]) for s in shared]
        summed = summed_micro_steps(lb, la, b[first][0], a[first][0])
        if summed:
            return summed
        if token_mean and not counted(other.records):
            return token_mean
        modules = set(ref.records[0]["modules"])
        dropout = any(m.startswith("Dropout") and not m.endswith("(p=0)") for m in modules)
        same_world = ref.records[0]["world_size"] == other.records[0]["world_size"]
        upto = next((k for k, s in enumerate(shared, start=1)
                     if not math.isclose(_loss(a[s]) or 0.0, _loss(b[s]) or 0.0,
                                         rel_tol=1e-6)), len(shared))
        drawn = augmentation_cause(
            [a[s][0] for s in shared], [[b[s][r] for s in shared] for r in range(len(b[first]))],
            upto, ref.label, other.label, dropout=dropout, same_world=same_world)
        if drawn:
            return drawn
        if dropout:
            return ("Dropout draws its masks from a random stream that differs between the "
                    "two runs; this difference is expected. Verify with dropout off (p=0).")
        # the same world size and micro-steps: each rank normalises the same samples
        micro_same = a[first][0].get("micro", 1) == b[first][0].get("micro", 1)
        if plain_batchnorm(list(modules)) and not (same_world and micro_same):
            return ("BatchNorm normalises over each micro-batch (or each rank's part of it); "
                    "the statistics differ between the runs.")
    return None


def _lr_cause(ref: Side, other: Side, step_a: Record, step_b: Record, detail: str) -> str:
    """Why the learning rates of two runs part: a scheduler stepped on micro-steps (the runs
    split a step into different numbers of them), or one a resume did not restore."""
    at = other.records[0]["resumed_step"]
    if at is not None:
        return (f"After resuming at step {at} the learning rate is not the straight run's "
                f"({detail}): the scheduler's state was not restored. Register it: "
                "run.resume(dir, model=model, optimizer=opt, scheduler=sched).")
    ma, mb = step_a.get("micro", 1), step_b.get("micro", 1)
    if ma != mb:
        more = max(ma, mb)
        return (f"The learning rate differs ({detail}) where the runs take {ma} and {mb} "
                "micro-steps per optimizer step: the scheduler is stepped on every "
                f"run.step call, micro-steps included, so with {more} it runs {more}x too "
                "fast. Step it once per optimizer step: if run.step(opt): sched.step() (or "
                "check run.sync_gradients). Accelerate's prepared scheduler skipped those "
                "calls by itself.")
    return (f"The learning rate differs between the {ref.label} and {other.label} runs "
            f"({detail}): the schedule must not depend on the strategy or the world size.")


def _data_cause(ref: Side, other: Side) -> str:
    if other.records[0]["resumed_step"] is not None:
        at = other.records[0]["resumed_step"]
        epochs = [_epoch_at(side, at) for side in (ref, other)]
        if ref.records[0]["used_run_loader"] and None not in epochs and epochs[0] != epochs[1]:
            return (f"After resuming at step {at} the script trained epoch {epochs[1]} again "
                    f"where the straight run was in epoch {epochs[0]}: start the epoch loop "
                    "where the checkpoint left it, run.epochs(n, start=state.epoch) with "
                    "state = run.resume(...).")
        if ref.records[0]["used_run_loader"]:
            return ("After resuming, the script read other samples than the straight run: "
                    "the loader's position was not restored. Create the loader with "
                    "run.loader before run.resume (or after it, but let run.resume restore "
                    "it) and do not skip or rebuild it by hand.")
        return ("After resuming, the script drew other batches than the straight run: its "
                "random batch stream was not restored. Draw batches from "
                "run.generator(per_rank=True), which run.save saves and run.resume restores.")
    if unshuffled(ref.records[0]):
        return (f"The {ref.label} and {other.label} runs read different samples at the same "
                f"step: {UNSHUFFLED}.")
    return (f"The {ref.label} and {other.label} runs read different samples at the same step; "
            "read the training data through run.loader(dataset, batch_size=..., shuffle=True).")


def _epoch_at(side: Side, step: int) -> int | None:
    """The sampler epoch of the pass that global step ``step`` trained in."""
    rec = side.records[0]
    index = step - rec["first_step"]
    if not 0 <= index < len(rec["steps"]):
        return None
    passes = rec["passes"]
    i = rec["steps"][index]["pass"] - 1
    return passes[i]["epoch"] if 0 <= i < len(passes) else None
