"""``run.resume`` against what a user would do instead, on the same model + AdamW state.

    python benchmarks/resume_bench.py [--gb 0.6] [--rounds 5] [--procs 1,2]
        [--cache cold,warm] [--load quiet,busy] [--ways ss,plain,mmap,dcp] [--dir PATH]
        [--profile]

Four ways to get a trained model and its optimizer back, each timed from the start of the
resume to the end of the first optimizer step after it (a lazy load pays its reads there):

- ``ss``: ``run.resume(dir, model=..., optimizer=...)``: every byte's checksum verified;
- ``plain``: ``torch.load(file, weights_only=True)`` + ``load_state_dict`` of both;
- ``mmap``: the same with ``torch.load(..., mmap=True)``;
- ``dcp``: ``torch.distributed.checkpoint.load`` of ``get_state_dict(model, optimizer)``,
  then ``set_state_dict`` (the torch recipe; at 2 ranks it is collective).

Each file was written once, by its own library, from the same state (``run.save``;
``torch.save`` of both state dicts on rank 0; ``dcp.save``). Every measurement builds a
fresh model (weights written, so its pages exist, as after a real initialisation) and a fresh
AdamW (no state) in a fresh ``splitsync.init()``, outside the timing; then the way loads and
one training step (forward, ``run.backward``, ``run.step``: the same for every way) runs.
The time is the slowest rank's. After the step every way must hold the same weights (a
checksum of all parameters is compared; "same" in the table).

Cases: ``cold`` (the way's files dropped from the page cache first, by
``posix_fadvise(POSIX_FADV_DONTNEED)`` on every file after an ``fsync``; the machine's whole
cache is not dropped) and ``warm`` (the files read once just before); ``quiet`` and
``busy`` (a ``python -c 'while 1: pass'`` process this script starts, and kills after); 1
and 2 ranks (gloo, one thread each, started with ``splitsync.testing.spawn``). Ways rotate
within each case and cases rotate within each round. Rank 0 prints per case the median of
each way over the rounds, ``run.resume``'s ratio to the fastest alternative (time / fastest;
the goal is <= 1/0.9 = 1.11), the per-round ratios, and each way's median CPU time (the
process's, all its threads, in the same span: on a shared machine the work done, without
the waiting for a core; page faults count, waiting for the disk does not).

``--profile`` also runs ``run.resume`` + the first step under cProfile (cold and warm,
quiet, every rank count) and prints rank 0's heaviest functions.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

WIDTH = 2048
WAYS = ("ss", "plain", "mmap", "dcp")


def _layers(gb: float) -> int:
    # a Linear(W, W) layer: (W*W + W) float32 parameters, and AdamW keeps two more of each
    per_layer = (WIDTH * WIDTH + WIDTH) * 4 * 3
    return max(1, round(gb * 1e9 / per_layer))


def _model(layers: int) -> nn.Module:
    # no initialisation to pay for, but every page written, as after a real one
    m = nn.Sequential(*[nn.Linear(WIDTH, WIDTH, device="meta") for _ in range(layers)])
    m = m.to_empty(device="cpu")
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(0.5)
    return m


def _files(path: Path) -> list[Path]:
    return [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())


def _drop(paths: list[Path]) -> None:
    for p in paths:  # evicts this file's clean pages: the next read comes from the disk
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _warm(paths: list[Path]) -> None:
    buf = bytearray(16 << 20)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def _step(run: Any, model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    run.backward(model(x).square().mean())
    run.step(opt)


def _write(root: Path, layers: int, world: int) -> dict[str, Path]:
    """The same trained state, saved once each way."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    import splitsync as ss

    where = {"ss": root / "ss", "plain": root / "plain.pt", "mmap": root / "plain.pt",
             "dcp": root / "dcp"}
    with ss.init(seed=0) as run:
        torch.manual_seed(0)
        model = _model(layers)
        with torch.no_grad():  # activations keep their scale through the layers
            for p in model.parameters():
                p.normal_(0.0, WIDTH ** -0.5)
        model = run.model(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        _step(run, model, opt, torch.randn(8, WIDTH))
        run.resume(where["ss"], model=model, optimizer=opt, save_blocking=True)
        run.save(where["ss"])
        inner = getattr(model, "module", model)
        if run.rank == 0:
            torch.save({"model": inner.state_dict(), "optimizer": opt.state_dict()},
                       where["plain"])
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(where["dcp"]))
        if world > 1 and dist.is_initialized():
            dist.barrier()
    return where


def _load(way: str, run: Any, model: nn.Module, opt: torch.optim.Optimizer,
          where: dict[str, Path]) -> None:
    if way == "ss":
        state = run.resume(where["ss"], model=model, optimizer=opt)
        if not state.resumed:
            raise RuntimeError(f"run.resume found no checkpoint under {where['ss']}")
        return
    if way in ("plain", "mmap"):
        sd = torch.load(where[way], weights_only=True, mmap=way == "mmap")
        getattr(model, "module", model).load_state_dict(sd["model"])
        opt.load_state_dict(sd["optimizer"])
        return
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=str(where["dcp"]))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])


def _measure(way: str, cold: bool, layers: int, where: dict[str, Path],
             profile: cProfile.Profile | None = None) -> tuple[float, float, float]:
    """(seconds from the resume's start to the end of the first step, slowest rank; the
    CPU seconds of the rank's process in that time, most of any rank; a checksum of the
    weights after it)."""
    import splitsync as ss

    # the last measurement's DDP model is in a reference cycle (torch's own): without a
    # collection each round's model and optimizer state stay, 0.5 GB a rank each time
    gc.collect()
    with ss.init(seed=0) as run:
        model = run.model(_model(layers))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(1))
        files = _files(where[way])
        (_drop if cold else _warm)(files)
        run.barrier()
        if profile is not None:
            profile.enable()
        t0, c0 = time.perf_counter(), time.process_time()
        _load(way, run, model, opt, where)
        _step(run, model, opt, x)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        if profile is not None:
            profile.disable()
        slowest = run.max(torch.tensor([dt, cpu], dtype=torch.float64)).tolist()
        with torch.no_grad():
            check = float(sum(p.double().sum() for p in model.parameters()))
    return slowest[0], slowest[1], check


def _busy(on: bool, rank: int, proc: subprocess.Popen[bytes] | None
          ) -> subprocess.Popen[bytes] | None:
    """Keeps one core busy (rank 0 starts one process for the whole machine) or not."""
    if on and proc is None and rank == 0:
        return subprocess.Popen([sys.executable, "-c", "while 1: pass"])
    if not on and proc is not None:
        proc.kill()
        proc.wait()
        return None
    return proc


def _rank(rank: int, world: int, args: argparse.Namespace, root: str) -> dict[str, Any]:
    import logging

    import splitsync as ss

    torch.set_num_threads(1)
    logging.getLogger("splitsync").setLevel(logging.WARNING)  # no "resumed from" per round
    layers = _layers(args.gb)
    holder = ss.init(seed=0)  # keeps the group across the runs below
    busy: subprocess.Popen[bytes] | None = None
    times: dict[tuple[str, str, str], list[float]] = {}
    cpus: dict[tuple[str, str, str], list[float]] = {}
    checks: dict[tuple[str, str], set[tuple[str, float]]] = {}
    ways, caches, loads = args.ways.split(","), args.cache.split(","), args.load.split(",")
    cases = [(c, q) for q in loads for c in caches]
    try:
        where = _write(Path(root) / f"w{world}", layers, world)
        nbytes = sum(f.stat().st_size for f in _files(where["ss"]))
        for r in range(args.rounds):
            for cache, load in cases[r % len(cases):] + cases[:r % len(cases)]:
                busy = _busy(load == "busy", rank, busy)
                holder.barrier()
                for way in ways[r % len(ways):] + ways[:r % len(ways)]:
                    dt, cpu, check = _measure(way, cache == "cold", layers, where)
                    times.setdefault((cache, load, way), []).append(dt)
                    cpus.setdefault((cache, load, way), []).append(cpu)
                    checks.setdefault((cache, load), set()).add((way, check))
        busy = _busy(False, rank, busy)
        prof_text = ""
        if args.profile:
            for cache in ("cold", "warm"):
                prof = cProfile.Profile()
                _measure("ss", cache == "cold", layers, where, prof)
                s = io.StringIO()
                pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(30)
                prof_text += f"\n--- run.resume + first step, {cache}, {world} rank(s)\n"
                prof_text += s.getvalue()
        holder.barrier()
        return {"times": times, "cpus": cpus, "checks": checks, "nbytes": nbytes, "layers": layers,
                "profile": prof_text}
    finally:
        _busy(False, rank, busy)
        holder.close()


def _report(world: int, res: dict[str, Any], ways: list[str]) -> str:
    times, checks = res["times"], res["checks"]
    lines = [f"\n{world} rank(s), {res['layers']} layers, run.save's files "
             f"{res['nbytes'] / 1e9:.2f} GB",
             "| cache | load | " + " | ".join(f"{w} s" for w in ways)
             + " | ss / fastest other | per-round ratios | CPU s (" + " / ".join(ways)
             + ") | same weights |",
             "|---|---|" + "---|" * len(ways) + "---|---|---|---|"]
    cpus = res["cpus"]
    for cache, load in sorted({(c, q) for c, q, _ in times}):
        med = {w: statistics.median(times[(cache, load, w)]) for w in ways}
        cpu = {w: statistics.median(cpus[(cache, load, w)]) for w in ways}
        others = [w for w in ways if w != "ss"]
        cells = " | ".join(f"{med[w]:.3f}" for w in ways)
        ratio, rounds = "n/a", "n/a"
        if "ss" in ways and others:
            best = min(others, key=lambda w: med[w])
            ratio = f"{med['ss'] / med[best]:.2f}x ({best})"
            per = [s / min(times[(cache, load, w)][i] for w in others)
                   for i, s in enumerate(times[(cache, load, "ss")])]
            rounds = ", ".join(f"{v:.2f}" for v in per)
        got = checks[(cache, load)]
        same = "yes" if len({v for _, v in got}) == 1 else f"NO: {sorted(got)}"
        cpu_cells = " / ".join(f"{cpu[w]:.2f}" for w in ways)
        lines.append(f"| {cache} | {load} | {cells} | {ratio} | {rounds} | {cpu_cells} | "
                     f"{same} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gb", type=float, default=0.6, help="model + AdamW state size, GB")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--procs", default="1,2", help="rank counts, comma-separated")
    p.add_argument("--cache", default="cold,warm")
    p.add_argument("--load", default="quiet,busy")
    p.add_argument("--ways", default=",".join(WAYS), help=f"from {','.join(WAYS)}")
    p.add_argument("--dir", default=None, help="where the checkpoints go (default: a "
                   "temporary folder under $TMPDIR)")
    p.add_argument("--profile", action="store_true", help="cProfile run.resume + step")
    args = p.parse_args()
    bad = [w for w in args.ways.split(",") if w not in WAYS]
    if bad:
        p.error(f"--ways: unknown {bad}; choose from {','.join(WAYS)}")
    from splitsync.testing import spawn

    root = tempfile.mkdtemp(prefix="resume-bench-", dir=args.dir)
    load0 = os.getloadavg()[0]
    out: list[str] = []
    try:
        for world in (int(x) for x in args.procs.split(",")):
            fn: Callable[..., Any] = _rank
            res = spawn(fn, world, args, root, timeout=7200)[0]
            out.append(_report(world, res, args.ways.split(",")))
            print(out[-1], flush=True)
            if res["profile"]:
                print(res["profile"], flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nload average before/after: {load0:.1f} / {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
