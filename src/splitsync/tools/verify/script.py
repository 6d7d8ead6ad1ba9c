"""``splitsync verify -n N script.py [args]``: run the script at 1 and N processes, diff them."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from splitsync.launch.spawn import clean_env
from splitsync.tools.verify import agree, record
from splitsync.tools.verify.checks import Result
from splitsync.tools.verify.compare import compare_runs, likely_cause
from splitsync.tools.verify.launch import Launch, Outcome, run_all

__all__ = ["ScriptReport", "verify_script", "launch_env", "token_mean_cause", "replicas",
           "layer_diff"]


@dataclass(frozen=True)
class ScriptReport:
    """The checks, the likely cause of the first failure, and the launches' output."""

    results: list[Result]
    cause: str | None
    outcomes: list[Outcome]


def _load(directory: Path, world: int) -> list[dict] | None:
    paths = [directory / f"rank{r}.json" for r in range(world)]
    if not all(p.exists() for p in paths):
        return None
    return [json.loads(p.read_text()) for p in paths]


def _params(directory: Path) -> dict[str, torch.Tensor] | None:
    path = directory / "params.pt"
    return torch.load(path, weights_only=True) if path.exists() else None


#: Per-tensor relative tolerance of the final weights by dtype: the TP ranks add each
#: matrix product's partial sums in another order than one process does; an optimizer that
#: normalises its step (Adam) turns that last-bit noise into steps of the learning rate's
#: size on parameters whose gradient is nearly zero, so elementwise tolerances do not hold.
LAYER_RTOL = {torch.float64: 1e-9, torch.float32: 1e-3}


def layer_diff(one: dict[str, torch.Tensor] | None,
               many: dict[str, torch.Tensor] | None) -> Result:
    """The final weights of the one-process and tensor-parallel runs, each tensor within
    :data:`LAYER_RTOL` of its own largest value; else the layer that differs most, named."""
    name = "final weights by layer"
    if one is None or many is None:
        return Result(name, False, "the {} run wrote no final weights".format(
            "1-process" if one is None else "tensor-parallel"))
    if one.keys() != many.keys():
        return Result(name, False, f"the runs name different parameters: "
                      f"{sorted(one.keys() ^ many.keys())[:3]}")
    worst, where, limit = 0.0, "", 0.0
    for key, t in one.items():
        u = many[key]
        if t.shape != u.shape:
            return Result(name, False, f"layer {key.rsplit('.', 1)[0]}: {key} has shape "
                          f"{tuple(t.shape)} at 1 process, {tuple(u.shape)} under TP")
        rtol = LAYER_RTOL.get(t.dtype, 2e-2)
        rel = float((t.double() - u.double()).abs().max()) / max(float(t.abs().max()), 1e-12)
        if rel / rtol > worst:
            worst, where, limit = rel / rtol, key, rtol
    if worst <= 1:
        return Result(name, True, f"{len(one)} tensors equal within their dtype's tolerance "
                      "(relative to each tensor's largest value)")
    return Result(name, False, f"layer {where.rsplit('.', 1)[0]} differs: {where} is off by "
                  f"{worst * limit:.2e} of its largest value (> {limit:g})")


def launch_env(directory: Path, shared: Path, nproc: int, steps: int, epochs: int,
               batch: int | None, timeout: float) -> dict[str, str]:
    """The environment of one launch: a clean one, plus what switches the recorder on."""
    env = clean_env()
    env.update({record.ENV_DIR: str(directory), record.ENV_NPROC: str(nproc),
                record.ENV_STEPS: str(steps), record.ENV_EPOCHS: str(epochs),
                record.ENV_SHARED: str(shared), record.ENV_TIMEOUT: str(timeout),
                # no __pycache__ next to the user's modules either
                "PYTHONDONTWRITEBYTECODE": "1"})
    if batch is not None:
        env[record.ENV_BATCH] = str(batch)
    return env


def verify_script(script: str, args: list[str], nproc: int, steps: int = 3, epochs: int = 2,
                  batch: int | None = None, timeout: float = 300.0) -> ScriptReport:
    """Run ``script`` for ``steps x epochs`` steps at 1 and ``nproc`` processes and compare.

    Each run writes what the script saves through splitsync (checkpoints, exports, run_dir)
    in its own temporary folder, removed afterwards: the user's directories are untouched.
    """
    if not Path(script).is_file():
        raise FileNotFoundError(f"splitsync verify: no script at {script!r}.")
    with tempfile.TemporaryDirectory(prefix="splitsync-verify-") as tmp:
        shared = Path(tmp)
        dirs = {1: shared / "1", nproc: shared / str(nproc)}
        commands = []
        for world, directory in dirs.items():
            env = launch_env(directory, shared, nproc, steps, epochs, batch, timeout)
            # the N-process run is the script as the user runs it: it sets the global batch
            env[record.ENV_ROLE] = agree.REF if world == nproc else "follow"
            commands.append(Launch(world, (script, *args), env))

        def ended(i: int) -> None:  # a run waiting to agree on the batch stops waiting
            if i == 1:
                (shared / agree.EXITED.format(label=agree.REF)).touch()

        outcomes = run_all(commands, timeout, on_exit=ended)
        results = [Result("1 process runs", outcomes[0].ok, _exit(outcomes[0])),
                   Result(f"{nproc} processes run", outcomes[1].ok, _exit(outcomes[1]))]
        single, multi = _load(dirs[1], 1), _load(dirs[nproc], nproc)
        if single is None or multi is None:
            detail, cause = _no_records(outcomes, single is None, multi is None, nproc)
            results.append(Result("records written", False, detail))
            return ScriptReport(results, cause, outcomes)
        multi, groups = replicas(multi)
        results += groups
        n = len(multi)
        results += compare_runs(single[0], multi, n)
        if groups:  # tensor parallel: the layer whose weights end up elsewhere, by name
            results.append(layer_diff(_params(dirs[1]), _params(dirs[nproc])))
        cause = likely_cause(results, single[0], multi, n, token_mean_cause(script))
        return ScriptReport(results, cause, outcomes)


def replicas(records: list[dict]) -> tuple[list[dict], list[Result]]:
    """Under tensor parallelism (``init(mesh=...)`` with tp > 1), one record per
    data-parallel replica (its TP rank 0: the ranks of a TP group train one batch together),
    and a check that every rank of a group saw that batch and that loss; else ``records``."""
    tp = int(records[0].get("tp_size", 1))
    if tp == 1:
        return records, []
    heads = [r for r in records if r.get("tp_rank", 0) == 0]
    for r in records:
        head = records[r["rank"] - r["tp_rank"]]
        for mine, theirs in zip(r["steps"], head["steps"], strict=False):
            if mine.get("indices") != theirs.get("indices") or mine.get("loss") != theirs.get("loss"):
                return heads, [Result(
                    f"TP groups of {tp} agree", False,
                    f"step {mine.get('step', '?')}: rank {r['rank']} trained another batch or "
                    f"loss than rank {head['rank']} of its TP group (loss {mine.get('loss')} vs "
                    f"{theirs.get('loss')}); every rank of a TP group must read the same batch "
                    "(run.loader deals by replica) and compute the loss of the whole output")]
    return heads, [Result(f"TP groups of {tp} agree", True,
                          f"{len(heads)} replica(s) of {tp} ranks: same batches and losses "
                          "within each")]


def token_mean_cause(script: str) -> str | None:
    """The likely cause when the script hands run.backward a mean over a micro-batch's real
    tokens without count= (``splitsync check``'s SS610), else None.

    The linter runs as its own command: it stands alone, no other part imports it."""
    command = [sys.executable, "-m", "splitsync", "check", "--select", "SS610", "--json",
               "--jobs", "1", script]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        found = json.loads(out.stdout)["findings"]
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError):
        return None  # no hint is better than a wrong one: the generic cause stays
    hit = next((f for f in found if f.get("code") == "SS610"), None)
    if hit is None:
        return None
    return (f"{Path(hit['path']).name}:{hit['line']}: the loss is a mean over each "
            "micro-batch's real tokens, handed to run.backward without count=. The ranks' (and "
            "micro-batches') means are then averaged with equal weights whatever their numbers "
            "of tokens, so the step is not the mean over every token that one process on the "
            "whole batch takes. Pass the count: run.backward(loss, count=n), n the "
            "micro-batch's real tokens (docs/token-losses.md).")


NEEDS = ("verify records what a run does through splitsync: splitsync.init(), "
         "run.model(net), run.loader(dataset, batch_size=...), run.backward(loss) and "
         "run.step(optimizer)")


def _no_records(outcomes: list[Outcome], no_single: bool, no_multi: bool,
                nproc: int) -> tuple[str, str]:
    """Why a run wrote no record (the recorder writes one as soon as init() runs)."""
    if all(o.ok for o in outcomes):
        return ("both runs exited 0 without calling splitsync.init()",
                f"The script does not use splitsync (it never calls splitsync.init()); {NEEDS}. "
                "Port the training loop to these calls, or read a plain torch.distributed "
                "script with `splitsync check script.py`.")
    sides = [name for name, missing in (("1-process", no_single), (f"{nproc}-process", no_multi))
             if missing]
    return (f"the {' and '.join(sides)} run failed before splitsync.init()",
            "The script failed before splitsync.init(); see the runs' output above.")


def _exit(outcome: Outcome) -> str:
    if outcome.ok:
        return "exit code 0"
    code = "timed out" if outcome.returncode is None else f"exit code {outcome.returncode}"
    return f"{code}:\n{outcome.tail()}"
