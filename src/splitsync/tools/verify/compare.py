"""Diff a script's 1-process and N-process records and name the likely cause (pure)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from splitsync.tools.verify.checks import Result, not_checkable
from splitsync.tools.verify.rng import augmentation_cause, plain_batchnorm

__all__ = ["compare_runs", "likely_cause", "summed_micro_steps", "unshuffled", "lr_row",
           "first_lr_change", "step_loss", "counted", "RTOL", "ATOL", "UNSHUFFLED"]

RTOL, ATOL = 1e-3, 1e-5
Record = dict[str, Any]


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=RTOL, abs_tol=ATOL)


def _ids(records: Sequence[Record], step: int) -> list[list[Any]]:
    """Per rank, the samples of one step: indices if every rank has them, else row hashes."""
    use_idx = all(r["steps"][step]["indices"] for r in records)
    return [r["steps"][step]["indices" if use_idx else "rows"] for r in records]


def unshuffled(record: Record) -> bool:
    """Whether the script trained on a ``run.loader`` made without ``shuffle=True`` (verify
    takes such a loader for evaluation and leaves its batch and data alone)."""
    return any(not p["shuffle"] and not p.get("custom") and p.get("trained", 1)
               for p in record["passes"])


UNSHUFFLED = ("the training loader is not shuffled: verify leaves a run.loader without "
              "shuffle=True as the script made it (it takes it for evaluation), so its "
              "batch stays per process at every world size; make the training loader with "
              "run.loader(dataset, batch_size=..., shuffle=True)")


def first_lr_change(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """The first index where two series of per-step learning rates (one list per step, one
    rate per param group) differ; None when they agree."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False))
                 if len(x) != len(y) or not all(math.isclose(u, v, rel_tol=1e-9, abs_tol=0)
                                                for u, v in zip(x, y, strict=True))), None)


def lr_row(a: Sequence[Any], b: Sequence[Any], label_a: str, label_b: str,
           steps: Sequence[int]) -> Result | None:
    """The per-step learning rate check (None when a record predates the rates)."""
    if any(not x for x in (*a, *b)):
        return None
    i = first_lr_change(a, b)
    return Result("per-step learning rate", i is None, "equal at every step" if i is None
                  else f"first differs at step {steps[i]}: {label_a} {a[i][0]:.6g}, "
                       f"{label_b} {b[i][0]:.6g}")


def _first_mismatch(a: Sequence[float | None], b: Sequence[float | None]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if not _close(x, y)), None)


def step_loss(per_rank: Sequence[Record]) -> float | None:
    """One step's loss over all ranks: the mean of the ranks' losses, or under count= the
    mean over every rank's items (each rank's loss weighs by its count)."""
    values = [r["loss"] for r in per_rank]
    counts = [r.get("count") for r in per_rank]
    if None in counts:
        return None if None in values else sum(values) / len(values)
    total = sum(counts)
    return sum(v * n for v, n in zip(values, counts, strict=True) if n) / total if total \
        else None


def _series(single: Record, multi: Sequence[Record], steps: int) -> tuple[list, list, list, list]:
    loss1 = [single["steps"][s]["loss"] for s in range(steps)]
    lossn = [step_loss([r["steps"][s] for r in multi]) for s in range(steps)]
    grad1 = [single["steps"][s]["grad_norm"] for s in range(steps)]
    gradn = [multi[0]["steps"][s]["grad_norm"] for s in range(steps)]
    return loss1, lossn, grad1, gradn


def _overlap(multi: Sequence[Record], steps: int) -> tuple[int, int] | None:
    """(step, shared samples) of the first step where two ranks read the same samples.

    Counted within one pass over the data (a new epoch may read the samples again).
    """
    seen: Counter[Any] = Counter()
    current = None
    # batches a script draws itself (random offsets) are drawn with replacement: only
    # the same step's batches must be disjoint across ranks
    per_step = not multi[0]["used_run_loader"]
    for s in range(steps):
        if per_step or multi[0]["steps"][s].get("pass") != current:
            current, seen = multi[0]["steps"][s].get("pass"), Counter()
        per_rank = _ids(multi, s)
        for ids in per_rank:
            seen.update(set(ids))
        shared = sum(1 for v in seen.values() if v > 1)
        if shared:
            return s, shared
    return None


def compare_runs(single: Record, multi: Sequence[Record], n: int) -> list[Result]:
    """Every check of a script verify, in the order a user should read them."""
    steps = min([len(single["steps"])] + [len(r["steps"]) for r in multi])
    out = [Result("steps recorded", steps > 0,
                  f"{steps} optimizer steps compared" if steps else
                  "no step recorded: the script must call run.backward(loss) and run.step(opt)")]
    if not steps:
        return out
    hashes = [r["init_hash"] for r in multi]
    out.append(Result("initial weights agree across ranks", len(set(hashes)) == 1,
                      "identical" if len(set(hashes)) == 1 else f"hashes per rank: {hashes}"))
    out.append(Result(f"initial weights: 1 vs {n} processes", single["init_hash"] == hashes[0],
                      "identical" if single["init_hash"] == hashes[0] else
                      "the model is initialised differently at different process counts"))
    ov = _overlap(multi, steps)
    out.append(Result("ranks' samples disjoint", ov is None, "disjoint" if ov is None else
                      f"by step {ov[0]}, {ov[1]} samples were read by more than one rank"))
    size = _global_batch(single, multi, steps, n)
    out.append(size)
    bad = next((s for s in range(steps) if Counter(x for ids in _ids(multi, s) for x in ids)
                != Counter(_ids([single], s)[0])), None)
    batch_row = f"{n} ranks' batches = 1-process batch"
    own = not multi[0]["used_run_loader"] and not single["used_run_loader"]
    why = None
    if not size.checkable:
        why = "the two runs trained at different global batches (see above)"
    elif bad is not None and own:
        why = (f"the script draws its own batches (not through run.loader), so the 1-process "
               f"and {n}-process runs trained on different samples (from step {bad}); "
               "--strategies and --resume compare it at one world size")
    if why is not None:
        out.append(not_checkable(batch_row, why))
    else:
        out.append(Result(batch_row, bad is None, "every step covers the same samples"
                          if bad is None else f"step {bad}: the ranks' samples together "
                          "differ from the 1-process batch"))
    out.append(_epochs(multi[0]))
    rates = lr_row([single["steps"][s].get("lr") for s in range(steps)],
                   [multi[0]["steps"][s].get("lr") for s in range(steps)], "1 process",
                   f"{n} processes", range(steps))
    out += [rates] if rates is not None else []
    loss1, lossn, grad1, gradn = _series(single, multi, steps)
    for name, a, b in (("per-step loss", loss1, lossn), ("per-step gradient norm", grad1, gradn)):
        if why is not None:
            out.append(not_checkable(name, why))
            continue
        i = _first_mismatch(a, b)
        out.append(Result(name, i is None, f"equal within rtol {RTOL:g}" if i is None else
                          f"first differs at step {i}: 1 process {a[i]:.6g}, {n} processes "
                          f"{b[i]:.6g}"))
    return out


def _global_batch(single: Record, multi: Sequence[Record], steps: int, n: int) -> Result:
    """Samples per optimizer step at 1 and at N processes (equal, or the comparison of
    losses is not one of equals)."""
    name = "equal global batch"
    key = "rows" if any(single["steps"][s]["rows"] for s in range(steps)) else "indices"
    one = [len(single["steps"][s][key]) for s in range(steps)]
    many = [sum(len(r["steps"][s][key]) for r in multi) for s in range(steps)]
    if not any(one) and not any(many):
        return not_checkable(name, "no samples seen: the model's forward takes no tensor "
                                   "first and the data is not read through run.loader")
    micro1, micron = single["steps"][0].get("micro", 1), multi[0]["steps"][0].get("micro", 1)
    shape = (f"1 process: {micro1} micro-batch(es), {one[0]} samples per step; {n} processes: "
             f"{micron} micro-batch(es) each, {many[0]} samples")
    if one == many:
        return Result(name, True, shape)
    if unshuffled(single) or unshuffled(multi[0]):
        return not_checkable(name, f"{shape}: {UNSHUFFLED}")
    if any(p.get("custom") for p in single["passes"]):
        return not_checkable(name, f"{shape}: the training loader takes its order from a "
                                   "sampler of the script's own (run.loader(..., sampler=)), "
                                   "which verify leaves as the script made it")
    return not_checkable(name, f"{shape}. verify sets the global batch of run.loader and of "
                               "init(accumulate=...); this script accumulates or batches by "
                               "itself: give --batch B, or let init(accumulate=k) accumulate")


def _epochs(record: Record) -> Result:
    name = "set_epoch advanced"
    if not record["used_run_loader"]:
        return not_checkable(name, "the training data is not read with a shuffled "
                                   "run.loader: there is no sampler epoch to advance")
    by_loader: dict[Any, list[Any]] = {}
    for p in record["passes"]:
        # a pass that trained on nothing (a peek: next(iter(loader))) is not an epoch
        if p["shuffle"] and p.get("trained", 1):
            by_loader.setdefault(p["loader"], []).append(p["epoch"])
    multi_pass = [e for e in by_loader.values() if len(e) > 1]
    if not multi_pass:
        return Result(name, True, "one pass per loader; nothing to advance")
    stuck = [e for e in multi_pass if any(b is None or a is None or b <= a
                                          for a, b in zip(e, e[1:], strict=False))]
    return Result(name, not stuck, "each pass got a new epoch" if not stuck else
                  f"sampler epochs per pass {stuck[0]}: call loader.set_epoch(epoch) or iterate "
                  "run.epochs(n)")


def likely_cause(results: Sequence[Result], single: Record, multi: Sequence[Record],
                 n: int, token_mean: str | None = None) -> str | None:
    """The first failure's most likely explanation, or None when everything passed.

    Causes are tried in the order of the checks: a cause is named only for a check that
    failed (dropout is blamed only when losses diverge and the model has dropout).
    ``token_mean``: what to say when the losses diverge and the script hands a mean over a
    micro-batch's tokens to run.backward without count= (``splitsync check``'s SS610).
    """
    failed = {r.check for r in results if not r.ok}
    if not failed:
        return None
    if "steps recorded" in failed:
        return ("The script did not complete a training step under verify; see the runs' "
                "output above.")
    if "initial weights agree across ranks" in failed:
        return ("Ranks start from different weights: seed every rank the same (init(seed=0)) "
                "and do not reseed with the rank before building the model.")
    if "ranks' samples disjoint" in failed:
        return ("Unsharded data: every rank reads the same samples (a plain DataLoader). Read "
                "data with run.loader(dataset, batch_size=...) so each rank gets its shard.")
    if any(c.endswith("= 1-process batch") for c in failed):
        if multi[0]["used_run_loader"]:
            return ("The ranks' batches do not make up the 1-process batch although the "
                    "script reads through run.loader: another loader or a sampler of the "
                    "script's own feeds the model, or the script changes the batch itself.")
        return ("The ranks' batches do not make up the 1-process batch: the training data is "
                "not read through run.loader(dataset, batch_size=..., shuffle=True).")
    if "per-step learning rate" in failed:
        return (f"The learning rate depends on the number of processes ({_lr_detail(results)})."
                " The global batch and the optimizer steps are the same at every world size, "
                "so the rate and the schedule must be too: do not scale them by world_size. "
                "Accelerate's scripts multiply warmup and total steps by num_processes "
                "because Accelerate steps a prepared scheduler num_processes times per "
                "step; step yours once per optimizer step: if run.step(opt): sched.step().")
    if {"per-step loss", "per-step gradient norm"} & failed:
        return _diverged(failed, single, multi, n, token_mean)
    if "set_epoch advanced" in failed:
        return ("The sampler's epoch never advances, so every epoch reads the samples in the "
                "same order: iterate run.epochs(n) or call loader.set_epoch(epoch).")
    if f"initial weights: 1 vs {n} processes" in failed:
        return "The model's initial weights depend on the number of processes (seed or rank)."
    return "See the failed checks above."


def _lr_detail(results: Sequence[Result]) -> str:
    return next(r.detail for r in results if r.check == "per-step learning rate")


def _diverged(failed: set[str], single: Record, multi: Sequence[Record], n: int,
              token_mean: str | None = None) -> str:
    """Why per-step losses or gradient norms differ although the data is right."""
    steps = min(len(single["steps"]), *(len(r["steps"]) for r in multi))
    loss1, lossn, grad1, gradn = _series(single, multi, steps)
    summed = summed_micro_steps(loss1, lossn, single["steps"][0], multi[0]["steps"][0])
    if summed:
        return summed
    for a, b in ((loss1, lossn), (grad1, gradn)):
        i = _first_mismatch(a, b)
        if i is not None and a[i] and b[i] and math.isclose(a[i] / b[i], n, rel_tol=0.05):
            return (f"The loss is summed over the batch, not averaged: at {n} processes each "
                    f"rank's loss and gradient are 1/{n} of the 1-process ones. Use "
                    "reduction='mean' (the default) or divide by the batch size.")
    if f"initial weights: 1 vs {n} processes" in failed:
        return "The model's initial weights depend on the number of processes (seed or rank)."
    if token_mean and not counted(multi):
        return token_mean
    modules = set(multi[0]["modules"])
    dropout = any(m.startswith("Dropout") and not m.endswith("(p=0)") for m in modules)
    first = next((i for i in (_first_mismatch(loss1, lossn), _first_mismatch(grad1, gradn))
                  if i is not None), steps - 1)
    drawn = augmentation_cause(single["steps"], [r["steps"] for r in multi], first + 1,
                               "1-process", f"{n}-process", dropout=dropout,
                               same_world=False)
    if drawn:
        return drawn
    if dropout:
        return ("Dropout draws different masks for a batch of B than for N batches of B/N; "
                "this difference is expected. Verify with dropout off (p=0) to check the rest.")
    if plain_batchnorm(list(modules)):
        return ("BatchNorm normalises each rank's B/N samples separately; use "
                "run.model(net, sync_batchnorm=True) for statistics over the global batch.")
    return ("The losses diverge without a known cause: check that the loss is a mean over the "
            "batch, that the learning rate and batch size do not depend on world_size, and "
            "that nothing random (augmentation, noise) is drawn per process.")


def counted(records: Sequence[Record]) -> bool:
    """Whether the run gave run.backward its counts (count=) on every recorded step."""
    steps = [st for r in records for st in r["steps"]]
    return bool(steps) and all(st.get("count") is not None for st in steps)


def summed_micro_steps(a: Sequence[float | None], b: Sequence[float | None], step_a: Record,
                       step_b: Record) -> str | None:
    """The micro-step losses are summed, not averaged: two runs that split the same step
    into different numbers of micro-steps then differ by that ratio (evidence: the
    per-step micro-step counts and the ratio of the first differing losses)."""
    ma, mb = step_a.get("micro", 1), step_b.get("micro", 1)
    i = _first_mismatch(a, b)
    if ma == mb or i is None or not a[i] or not b[i]:
        return None
    if not math.isclose(a[i] / b[i], ma / mb, rel_tol=0.05):
        return None
    return (f"The loss is summed across micro-steps, not averaged: a step of {ma} micro-"
            f"batches has a loss and gradient {ma / mb:g}x those of the same step in {mb}. "
            "With init(accumulate=k), run.backward(loss) already averages over the k "
            "micro-steps: pass each micro-batch's mean loss, unscaled; accumulating by hand, "
            "divide each micro-step's loss by their number.")
