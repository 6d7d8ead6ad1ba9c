"""``splitsync verify -n N script.py [args]``: run the script at 1 and N processes, diff them."""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from splitsync.testing import clean_env
from splitsync.verify import record
from splitsync.verify.checks import Result
from splitsync.verify.compare import compare_runs, likely_cause
from splitsync.verify.launch import Outcome, run_all, torchrun

__all__ = ["ScriptReport", "verify_script"]


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


def verify_script(script: str, args: list[str], nproc: int, steps: int = 3, epochs: int = 2,
                  batch: int | None = None, timeout: float = 300.0) -> ScriptReport:
    """Run ``script`` for ``steps x epochs`` steps at 1 and ``nproc`` processes and compare."""
    if not Path(script).is_file():
        raise FileNotFoundError(f"splitsync verify: no script at {script!r}.")
    with tempfile.TemporaryDirectory(prefix="splitsync-verify-") as tmp:
        dirs = {1: Path(tmp) / "1", nproc: Path(tmp) / str(nproc)}
        commands = []
        for world, directory in dirs.items():
            env = clean_env()
            env.update({record.ENV_DIR: str(directory), record.ENV_NPROC: str(nproc),
                        record.ENV_STEPS: str(steps), record.ENV_EPOCHS: str(epochs)})
            if batch is not None:
                env[record.ENV_BATCH] = str(batch)
            target = [script, *args]
            commands.append(([sys.executable, *target] if world == 1 else
                             torchrun(world, target), env))
        outcomes = run_all(commands, timeout)
        results = [Result("1 process runs", outcomes[0].ok, _exit(outcomes[0])),
                   Result(f"{nproc} processes run", outcomes[1].ok, _exit(outcomes[1]))]
        single, multi = _load(dirs[1], 1), _load(dirs[nproc], nproc)
        if single is None or multi is None:
            results.append(Result("records written", False, "the script never reached "
                                  "splitsync.init, or failed before its first step"))
            cause = "The script failed before its first step; see the runs' output above."
            return ScriptReport(results, cause, outcomes)
        results += compare_runs(single[0], multi, nproc)
        return ScriptReport(results, likely_cause(results, single[0], multi, nproc), outcomes)


def _exit(outcome: Outcome) -> str:
    if outcome.ok:
        return "exit code 0"
    code = "timed out" if outcome.returncode is None else f"exit code {outcome.returncode}"
    return f"{code}:\n{outcome.tail()}"
