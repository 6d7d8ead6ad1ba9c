"""``splitsync verify --strategies A,B`` / ``--accumulate K`` / ``--resume`` on a script.

All modes given in one call share their launches: the reference (the script as written,
or under the first of ``--strategies``) runs once, beside one launch per other strategy, the accumulation run and the first half
of the resume check; the resumed launches start once that first half has saved. Each
launch writes only under its own folder of one temporary directory (see ``record``).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from splitsync.tools.verify import agree, record
from splitsync.tools.verify.checks import Result, not_checkable
from splitsync.tools.verify.launch import Launch, Outcome, run_all
from splitsync.tools.verify.pair import Side, compare_pair, pair_cause
from splitsync.tools.verify.script import launch_env, token_mean_cause

__all__ = ["Section", "Plan", "verify_modes"]


@dataclass(frozen=True)
class Section:
    """One mode's table: its title, checks and likely cause."""

    title: str
    results: list[Result]
    cause: str | None


@dataclass(frozen=True)
class Plan:
    """What to compare: strategies (empty: none), accumulation factor (1: none), resume."""

    nproc: int
    strategies: tuple[str, ...] = ()
    accumulate: int = 1
    resume: bool = False
    resume_nproc: int | None = None  # the other world size (default: 1, or 2 from 1)
    steps: int = 3
    epochs: int = 2
    batch: int | None = None
    timeout: float = 300.0


@dataclass(frozen=True)
class _Launch:
    label: str
    world: int
    env: dict[str, str] = field(default_factory=dict)


def _load(directory: Path, world: int, label: str) -> Side | None:
    paths = [directory / f"rank{r}.json" for r in range(world)]
    if not all(p.exists() for p in paths):
        return None
    params = directory / "params.pt"
    return Side(label, [json.loads(p.read_text()) for p in paths],
                torch.load(params, weights_only=True) if params.exists() else None)


def _failure(outcome: Outcome) -> str | None:
    """The exception a failed launch ended with (its last ``Name: message`` line)."""
    if outcome.ok:
        return None
    lines = [ln.strip() for ln in outcome.output.splitlines()]
    errors = [ln for ln in lines if re.match(r"^[A-Za-z_.]*(Error|Exception)\b.*:", ln)]
    if outcome.returncode is None:
        return "it was killed at the timeout"
    return errors[-1] if errors else f"exit code {outcome.returncode}"


def _ran(label: str, outcome: Outcome) -> Result:
    if outcome.ok:
        return Result(f"{label} runs", True, "exit code 0")
    code = "timed out" if outcome.returncode is None else f"exit code {outcome.returncode}"
    return Result(f"{label} runs", False, f"{code}:\n{outcome.tail()}")


def _launch_cause(label: str, outcome: Outcome) -> str:
    error = _failure(outcome) or ""
    if "StaleOptimizerError" in error:
        return (f"Under {label} the optimizer holds parameters that run.model replaced: "
                f"{error.split(':', 1)[1].strip()}")
    return f"The {label} run failed: {error}"


class _Runner:
    """Starts launches in one temporary folder and reads back their records."""

    def __init__(self, tmp: Path, script: str, args: Sequence[str], plan: Plan) -> None:
        self.tmp, self.script, self.args, self.plan = tmp, script, list(args), plan
        self.outcomes: dict[str, Outcome] = {}

    def dir(self, label: str) -> Path:
        return self.tmp / re.sub(r"[^A-Za-z0-9]+", "-", label)

    def run(self, launches: Sequence[_Launch]) -> None:
        p = self.plan
        commands = []
        for launch in launches:
            env = launch_env(self.dir(launch.label), self.tmp, p.nproc, p.steps, p.epochs,
                             p.batch, p.timeout)
            env.update(launch.env)
            commands.append(Launch(launch.world, (self.script, *self.args), env))

        def ended(i: int) -> None:
            if launches[i].env.get(record.ENV_ROLE) == agree.REF:
                (self.tmp / agree.EXITED.format(label=agree.REF)).touch()

        for launch, outcome in zip(launches, run_all(commands, p.timeout, on_exit=ended),
                                   strict=True):
            self.outcomes[launch.label] = outcome

    def side(self, launch: _Launch) -> Side | None:
        return _load(self.dir(launch.label), launch.world, launch.label)


def verify_modes(script: str, args: Sequence[str], plan: Plan) -> list[Section]:
    """Run every mode of ``plan`` on ``script`` and return one section per mode."""
    if not Path(script).is_file():
        raise FileNotFoundError(f"splitsync verify: no script at {script!r}.")
    n, total = plan.nproc, plan.steps * plan.epochs
    half = max(1, total // 2)
    other_world = plan.resume_nproc or (1 if n > 1 else 2)
    follow = {record.ENV_ROLE: "follow"}
    strategies = [_Launch(f"strategy {s}", n, {**follow, record.ENV_STRATEGY: s})
                  for s in plan.strategies]
    ref = _Launch("as written", n, {record.ENV_ROLE: agree.REF})
    if strategies:  # the first strategy's run is everyone's reference: one launch fewer
        ref = strategies[0] = replace(strategies[0], env={**strategies[0].env, **ref.env})
    accum = _Launch(f"accumulate x{plan.accumulate}", n,
                    {**follow, record.ENV_ACCUMULATE: str(plan.accumulate)})
    # stopped one step after `half`, before the script's own save of that step: a script
    # that saves every step leaves its checkpoint of step `half`
    first = _Launch("first half", n, {**follow, record.ENV_STOP: str(half + 1)})
    resumed = [_Launch(f"resumed at {w} process{'es' if w > 1 else ''}", w, follow)
               for w in (n, other_world)]
    with tempfile.TemporaryDirectory(prefix="splitsync-verify-") as tmp:
        runner = _Runner(Path(tmp), script, args, plan)
        phase1 = [ref, *strategies[1:], *([accum] if plan.accumulate > 1 else []),
                  *([first] if plan.resume else [])]
        runner.run(phase1)
        if plan.resume:
            for launch in resumed:  # each resumes from its own copy of the first half's files
                src = runner.dir(first.label) / "files"
                if src.exists():
                    shutil.copytree(src, runner.dir(launch.label) / "files")
            runner.run(resumed)
        base = runner.side(ref)
        sections = []
        if plan.strategies:
            sections.append(_strategies(runner, strategies, n))
        if plan.accumulate > 1:
            sections.append(_accumulate(runner, ref, base, accum, plan.accumulate, n))
        if plan.resume:
            sections.append(_resume(runner, ref, base, first, resumed, half, total))
        return sections


def _runs(runner: _Runner, launches: Sequence[_Launch]) -> tuple[list[Result], str | None]:
    rows = [_ran(launch.label, runner.outcomes[launch.label]) for launch in launches]
    bad = next((launch for launch in launches if not runner.outcomes[launch.label].ok), None)
    return rows, None if bad is None else _launch_cause(bad.label, runner.outcomes[bad.label])


def _no_records(side: Side | None, label: str) -> Result | None:
    if side is not None:
        return None
    return Result(f"{label}: records written", False, "the run wrote no record: it failed "
                  "before splitsync.init(), or never calls it")


def _strategies(runner: _Runner, launches: list[_Launch], n: int) -> Section:
    title = (f"splitsync verify {runner.script} --strategies "
             f"{','.join(ln.label.split()[-1] for ln in launches)} ({n} processes)")
    results, cause = _runs(runner, launches)
    sides = [runner.side(ln) for ln in launches]
    for launch, side in zip(launches, sides, strict=True):
        missing = _no_records(side, launch.label)
        if missing:
            results.append(missing)
    base = sides[0]
    for launch, side in zip(launches[1:], sides[1:], strict=True):
        if base is None or side is None or not runner.outcomes[launch.label].ok \
                or not runner.outcomes[launches[0].label].ok:
            continue  # a failed launch is its own row (and cause); nothing to compare
        rows = compare_pair(base, side)
        results += [Result(f"{side.label} vs {base.label}: {r.check}", r.ok, r.detail,
                           r.checkable) for r in rows]
        init = base.records[0]["init_hash"] == side.records[0]["init_hash"]
        results.insert(len(results) - len(rows), Result(
            f"{side.label} vs {base.label}: initial weights", init,
            "identical" if init else "the strategies start from different weights"))
        cause = cause or pair_cause(rows, base, side)
    return Section(title, results, cause or _generic(results))


def _accumulate(runner: _Runner, ref: _Launch, base: Side | None, accum: _Launch, k: int,
                n: int) -> Section:
    title = (f"splitsync verify {runner.script} --accumulate {k} ({k} micro-batches per step "
             f"vs one batch {k}x larger, {n} processes)")
    results, cause = _runs(runner, [ref, accum])
    side = runner.side(accum)
    for label, s in ((ref.label, base), (accum.label, side)):
        missing = _no_records(s, label)
        if missing:
            results.append(missing)
    if base is not None and side is not None:
        own = not base.records[0]["used_run_loader"]
        why = (f"the script draws its own batches (not through run.loader), so verify cannot "
               f"split a step's batch into {k} micro-batches: the accumulation run trained "
               f"on {k}x the samples per step") if own else None
        rows = compare_pair(base, side, samples_differ_ok=why)
        results += rows
        cause = cause or pair_cause(rows, base, side, token_mean_cause(runner.script))
    return Section(title, results, cause or _generic(results))


def _resume(runner: _Runner, ref: _Launch, base: Side | None, first: _Launch,
            resumed: list[_Launch], half: int, total: int) -> Section:
    title = (f"splitsync verify {runner.script} --resume ({total} steps straight vs {half}, "
             "a checkpoint, then the rest)")
    results, cause = _runs(runner, [ref, first, *resumed])
    head = runner.side(first)
    saves = head.records[0]["saves"] if head is not None else []
    if head is not None and not saves:
        results.append(not_checkable("checkpoint saved", f"the script saved no checkpoint "
                                     f"(run.save) in its first {half} steps"))
        return Section(title, results, cause)
    if saves:
        results.append(Result("checkpoint saved", True, f"at step {max(saves)}"))
    for launch in resumed:
        side = runner.side(launch)
        if base is None or side is None:
            missing = _no_records(side, launch.label)
            results += [missing] if missing else []
            continue
        at = side.records[0]["resumed_step"]
        results.append(Result(f"{launch.label}: resumed", at is not None,
                              f"from the checkpoint of step {at}" if at is not None else
                              "started from scratch: the script never loaded the checkpoint"))
        if at is None:
            cause = cause or ("The script did not resume: call run.resume(dir, model=..., "
                              "optimizer=...) before training, with the directory it saves in.")
            continue
        same = launch.world == base.records[0]["world_size"]
        own = not base.records[0]["used_run_loader"]
        why = ("the script draws its own batches per rank (not through run.loader): at "
               "another world size it draws other ones") if own and not same else None
        results.append(_optimizer_state(base, side, at))
        rows = compare_pair(base, side, exact=same, samples_differ_ok=why)
        results += [Result(f"{launch.label}: {r.check}", r.ok, r.detail, r.checkable)
                    for r in rows]
        if not results[-len(rows) - 1].ok:
            cause = cause or _optimizer_cause(base, side, at)
        cause = cause or pair_cause(rows, base, side)
    return Section(title, results, cause or _generic(results))


def _optimizer_state(base: Side, side: Side, at: int) -> Result:
    """The optimizer's own step count at the first resumed step, against the straight run's."""
    name = f"{side.label}: optimizer state restored"
    straight = {base.records[0]["first_step"] + i: s["optimizer_steps"]
                for i, s in enumerate(base.records[0]["steps"])}
    steps = side.records[0]["steps"]
    if not steps or at not in straight:
        return not_checkable(name, f"no step after step {at} to look at")
    mine, theirs = steps[0]["optimizer_steps"], straight[at]
    return Result(name, mine == theirs, f"{mine:g} steps of optimizer state, as straight"
                  if mine == theirs else f"the optimizer had {mine:g} steps of state after "
                  f"resuming at step {at}; the straight run's had {theirs:g}")


def _optimizer_cause(base: Side, side: Side, at: int) -> str:
    return (f"The checkpoint does not restore the optimizer state: after resuming at step {at} "
            "the optimizer started afresh (its moments and step count are gone), so every "
            "later step differs. Register it: run.resume(dir, model=model, optimizer=opt).")


def _generic(results: Sequence[Result]) -> str | None:
    failed = [r for r in results if not r.ok]
    if not failed:
        return None
    return f"See the first failed check ({failed[0].check})."
