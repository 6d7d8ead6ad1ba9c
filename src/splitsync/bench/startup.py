"""Import time and launch-to-first-step time, each against a baseline, alternating A B A B."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from splitsync.bench.harness import median
from splitsync.launch.spawn import clean_env

__all__ = ["import_times", "launch_times", "FIRST_STEP_SCRIPT", "run_available"]

FIRST_STEP_SCRIPT = Path(__file__).with_name("firststep.py")
IMPORTS = {
    "import torch": "import torch",
    "import splitsync": "import splitsync",
    "import splitsync.run.runtime": "import splitsync.run.runtime",  # torch + the library proper
}


def _env() -> dict[str, str]:
    env = clean_env()
    src = str(Path(__file__).resolve().parents[2])  # the tree this splitsync came from
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    return env


def _wall(argv: Sequence[str], env: dict[str, str], timeout: float) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, timeout=timeout, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def import_times(pairs: int = 5, timeout: float = 120.0) -> list[dict]:
    """Median wall time of a fresh interpreter running each import; ratio to ``import torch``."""
    env = _env()
    times: dict[str, list[float]] = {k: [] for k in IMPORTS}
    for _, code in IMPORTS.items():  # warm the file cache once, not counted
        _wall([sys.executable, "-c", code], env, timeout)
    for i in range(pairs):
        order = list(IMPORTS) if i % 2 == 0 else list(reversed(IMPORTS))
        for name in order:
            times[name].append(_wall([sys.executable, "-c", IMPORTS[name]], env, timeout))
    base = times["import torch"]
    return [{"what": name, "median_s": median(ts), "runs": len(ts),
             "ratio": median([a / b for a, b in zip(ts, base, strict=True)])} for name, ts in times.items()]


def run_available() -> bool:
    """Whether this installation has the ``splitsync run`` subcommand."""
    return importlib.util.find_spec("splitsync.commands.run") is not None


def _launch_argv(kind: str, nproc: int, stamp: str) -> list[str]:
    script = [str(FIRST_STEP_SCRIPT), "--stamp", stamp]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(nproc)]
    if kind == "splitsync run":
        return [sys.executable, "-m", "splitsync", "run", "-n", str(nproc), *script,
                "--mode", "splitsync"]
    if kind == "torchrun + splitsync script":
        return [*torchrun, *script, "--mode", "splitsync"]
    return [*torchrun, *script, "--mode", "hand"]


def launch_times(nproc: int = 2, pairs: int = 3, timeout: float = 180.0) -> list[dict]:
    """Seconds from starting the launcher to the end of the first training step on rank 0."""
    kinds = ["torchrun (hand-written)", "torchrun + splitsync script"]
    if run_available():
        kinds.insert(1, "splitsync run")
    env = _env()
    times: dict[str, list[float]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):
            order = kinds if i % 2 == 0 else list(reversed(kinds))
            for kind in order:
                stamp = os.path.join(tmp, f"stamp-{i}-{len(times[kind])}-{kind[:5]}")
                t0 = time.time()
                subprocess.run(_launch_argv(kind, nproc, stamp), env=env, check=True,
                               timeout=timeout, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
                times[kind].append(float(Path(stamp).read_text()) - t0)
    base = times["torchrun (hand-written)"]
    rows = [{"what": k, "nproc": nproc, "median_s": median(ts), "runs": len(ts),
             "ratio": median([a / b for a, b in zip(ts, base, strict=True)])} for k, ts in times.items()]
    if not run_available():
        rows.append({"what": "splitsync run", "nproc": nproc, "median_s": None, "runs": 0,
                     "ratio": None, "note": "n/a: this installation has no `splitsync run`"})
    return rows
