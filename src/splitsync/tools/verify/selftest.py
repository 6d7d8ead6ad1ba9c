"""``splitsync verify [-n N]``: collectives on every backend, 1-vs-N training, checkpoints."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from splitsync.launch.spawn import clean_env
from splitsync.tools.verify.checks import Result, compare_params
from splitsync.tools.verify.launch import Launch, Outcome, run_all

__all__ = ["available_backends", "selftest"]

_WORKER = ["-m", "splitsync.commands.verify_worker"]


def available_backends(nproc: int) -> list[str]:
    """gloo always (its absence is a failure), nccl when there is a GPU per process."""
    names = ["gloo"]
    if dist.is_nccl_available() and torch.cuda.device_count() >= nproc:
        names.append("nccl")
    return names


def _launch_result(name: str, outcome: Outcome) -> Result:
    if outcome.ok:
        return Result(name, True, "exit code 0")
    code = "timed out" if outcome.returncode is None else f"exit code {outcome.returncode}"
    return Result(name, False, f"{code}:\n{outcome.tail()}")


def _rank_results(directory: Path, label: str) -> list[Result]:
    """One row per check, merged over ranks: passes only if it passed on every rank."""
    rows: dict[str, list[tuple[str, dict]]] = {}
    for path in sorted(directory.glob("rank*.json")):
        for row in json.loads(path.read_text()):
            rows.setdefault(row["check"], []).append((path.stem.removeprefix("rank"), row))
    out = []
    for check, per_rank in rows.items():
        bad = [(r, row) for r, row in per_rank if not row["ok"]]
        if bad:
            ranks = ", ".join(r for r, _ in bad)
            out.append(Result(f"{check} ({label})", False, f"rank {ranks}: {bad[0][1]['detail']}"))
        else:
            out.append(Result(f"{check} ({label})", True,
                              f"{len(per_rank)} rank(s): {per_rank[0][1]['detail']}"))
    return out


def selftest(nproc: int, backends: list[str] | None = None, timeout: float = 120.0) -> list[Result]:
    """Run the worker with 1 and ``nproc`` processes and collect every check's result."""
    chosen = backends or available_backends(nproc)
    results: list[Result] = []
    if not dist.is_available():
        return [Result("torch.distributed", False, "this PyTorch build has no torch.distributed")]
    if "gloo" in chosen and not dist.is_gloo_available():
        results.append(Result("collectives on gloo", False, "gloo is not available in this "
                                                            "PyTorch build"))
    with tempfile.TemporaryDirectory(prefix="splitsync-verify-") as tmp:
        one, many = Path(tmp) / "1", Path(tmp) / str(nproc)
        flags = [a for b in chosen for a in ("--backend", b)]
        env = clean_env()
        commands = [Launch(1, (*_WORKER, "--out", str(one)), env)]
        if nproc > 1:
            commands.append(Launch(nproc, (*_WORKER, "--out", str(many), *flags), env))
        outcomes = run_all(commands, timeout)
        results.append(_launch_result("1 process runs", outcomes[0]))
        results += _rank_results(one, "1 process")
        if nproc > 1:
            results.append(_launch_result(f"{nproc} processes run", outcomes[1]))
            multi = _rank_results(many, f"{nproc} processes")
            for b in chosen:
                if not any(r.check.startswith(f"collectives on {b} (") for r in multi):
                    multi.append(Result(f"collectives on {b}", False, "not run (see above)"))
            results += multi
            if (one / "params.pt").exists() and (many / "params.pt").exists():
                results.append(compare_params(torch.load(one / "params.pt", weights_only=True),
                                              torch.load(many / "params.pt", weights_only=True),
                                              nproc))
            else:
                results.append(Result(f"train 1 vs {nproc} processes", False,
                                      "a run did not finish training (see above)"))
    return results
