"""Checkpoint costs side by side, 2 gloo ranks, a ~50M-parameter model with AdamW.

    python benchmarks/ckpt_bench.py [--rounds 5] [--dir /path/on/the/disk/to/measure]

Every round measures, in rotating order and in the same processes: an in-memory copy of the
state (the floor for any save's stall), a blocking ``run.save``, the stall of a background
``run.save(blocking=False)`` and its write throughput, the disk's own sequential write+fsync
speed for the same number of bytes, a resume (read caches dropped first) and the disk's own
cold sequential read of the same files (their cached pages dropped the same way; the better
of 1 MiB and 16 MiB reads). Peak RSS above the pre-save level is sampled during background
saves; the largest is reported (the first background save allocates the staging buffers that
later ones reuse). Medians over rounds and their ratios are printed (rank 0).

First: in fresh runs, the stall of the first and the second background save, with the
staging buffers made ahead (the run saves in the background by default: they are made from
``run.resume`` on, while training goes on) and without (the first save makes them).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import splitsync as ss
from splitsync.ckpt.staging import stage
from splitsync.ckpt.state import model_state, optimizer_state
from splitsync.testing import spawn

CHUNK = 16 << 20


def _model() -> nn.Module:
    torch.manual_seed(0)  # 12 x (2048 x 2048 + 2048) = 50.4M parameters
    return nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(12)])


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _drop_cache(paths: list[Path]) -> None:
    for p in paths:  # evicts clean pages of these files: the next read comes from the disk
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _disk_write(path: Path, nbytes: int) -> float:
    buf = memoryview(bytearray(os.urandom(1 << 20)) * 16)
    t = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            left -= f.write(buf[:min(CHUNK, left)])
        f.flush()
        os.fsync(f.fileno())
    dt = time.perf_counter() - t
    path.unlink()
    return nbytes / dt


def _disk_read(paths: list[Path]) -> float:
    """The disk's cold sequential read speed: the better of 1 MiB reads (the copy target
    stays in the CPU's cache) and 16 MiB reads, so the baseline is the disk at its best."""
    speeds = []
    for size in (1 << 20, CHUNK):
        _drop_cache(paths)
        buf = memoryview(bytearray(size))
        total, t = 0, time.perf_counter()
        for p in paths:
            with open(p, "rb", buffering=0) as f:
                while n := f.readinto(buf):
                    total += n
        speeds.append(total / (time.perf_counter() - t))
    return max(speeds)


def _train_step(run: ss.Run, model: nn.Module, opt: torch.optim.Optimizer) -> None:
    run.backward(model(torch.randn(4, 2048)).square().mean())
    run.step(opt)


def _first_saves(root: str, rank: int, mode: str, res: dict[str, list[float]]) -> None:
    """A fresh run's first and second background save. ``reserved``: the run saves in the
    background by default, so its staging buffers are made from ``run.resume`` on, while a
    step trains; ``unreserved``: the first save makes them (the behaviour before)."""
    with ss.init(seed=0) as run:
        model = run.model(_model())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        _train_step(run, model, opt)
        ck = Path(root) / f"first-{mode}"
        run.resume(ck, keep=2, model=model, optimizer=opt, save_blocking=mode == "unreserved")
        _train_step(run, model, opt)  # training goes on while the buffers are made
        for key in (f"first_{mode}_s", f"second_{mode}_s"):
            run.barrier()
            t = time.perf_counter()
            h = run.save(blocking=False)
            res[key].append(time.perf_counter() - t)
            h.wait()
            _train_step(run, model, opt)
        stager = run._checkpoints._stager  # noqa: SLF001 - measured, not used
        res["staging_B"].append(float(stager.nbytes if stager is not None else 0))
        run.barrier()
        if rank == 0:
            shutil.rmtree(ck)


def bench(rank: int, world: int, root: str, rounds: int, first: bool = True) -> dict[str, Any]:
    res: dict[str, list[float]] = {k: [] for k in (
        "copy_s", "blocking_s", "stall_s", "bg_write_Bps", "disk_write_Bps", "resume_Bps",
        "disk_read_Bps", "rss_extra_B", "first_reserved_s", "second_reserved_s",
        "first_unreserved_s", "second_unreserved_s", "staging_B")}
    holder = ss.init(seed=0)  # keeps the group across the runs below
    for r in range(rounds if first else 0):
        for mode in (("reserved", "unreserved") if r % 2 else ("unreserved", "reserved")):
            _first_saves(root, rank, mode, res)
    try:
        return _bench(rank, root, rounds, res)
    finally:
        holder.close()


def _bench(rank: int, root: str, rounds: int, res: dict[str, list[float]]) -> dict[str, Any]:
    with ss.init(seed=0) as run:
        model = run.model(_model())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        run.backward(model(torch.randn(4, 2048)).square().mean())
        run.step(opt)
        ck = Path(root) / "ck"
        run.resume(ck, keep=2, model=model, optimizer=opt, save_blocking=False)
        state_bytes = sum(v.numel() * v.element_size()
                          for v in model_state(model, full=True, offload=True).values())
        state_bytes += sum(v.numel() * v.element_size()
                           for st in opt.state_dict()["state"].values()
                           for v in st.values() if isinstance(v, torch.Tensor))
        step = 1
        for r in range(rounds):
            order = ["copy", "blocking", "background", "disk", "resume"]
            order = order[r % len(order):] + order[:r % len(order)]
            for what in order:
                run.barrier()
                if what == "copy":
                    t = time.perf_counter()
                    if rank == 0:
                        stage({"m": model_state(model, full=True, offload=True),
                               "o": optimizer_state(model, opt, full=True, offload=True)})
                    res["copy_s"].append(time.perf_counter() - t)
                elif what == "blocking":
                    step += 1
                    t = time.perf_counter()
                    run.save(ck, step=step, blocking=True)
                    res["blocking_s"].append(time.perf_counter() - t)
                elif what == "background":
                    step += 1
                    base, peak, stop = _rss(), [0], threading.Event()

                    def sample(base: int = base, peak: list[int] = peak,
                               stop: threading.Event = stop) -> None:
                        while not stop.is_set():
                            peak[0] = max(peak[0], _rss() - base)
                            time.sleep(0.002)

                    sampler = threading.Thread(target=sample, daemon=True)
                    sampler.start()
                    t = time.perf_counter()
                    h = run.save(ck, step=step, blocking=False)
                    t1 = time.perf_counter()
                    h.wait()
                    t2 = time.perf_counter()
                    stop.set()
                    sampler.join()
                    res["stall_s"].append(t1 - t)
                    written = sum(p.stat().st_size for p in Path(h.path).iterdir())
                    res["bg_write_Bps"].append(written / (t2 - t1))
                    res["rss_extra_B"].append(float(peak[0]))
                elif what == "disk":
                    nbytes = state_bytes if rank == 0 else 1 << 20
                    res["disk_write_Bps"].append(_disk_write(Path(root) / f"dd-{rank}", nbytes))
                elif what == "resume":
                    newest = sorted(ck.glob("step-*"))[-1]
                    files = [p for p in newest.iterdir() if p.name != "manifest.json"]
                    mine = [p for p in files if p.name in ("state.pt", f"rank-{rank:05d}.pt")]
                    res["disk_read_Bps"].append(_disk_read(mine))
                    _drop_cache(files)
                    run.barrier()
                    t = time.perf_counter()
                    run.resume(ck, keep=2, model=model, optimizer=opt, save_blocking=False)
                    dt = time.perf_counter() - t
                    res["resume_Bps"].append(sum(p.stat().st_size for p in mine) / dt)
    return {"state_bytes": state_bytes, **res}


def _torch_stagers() -> dict[str, Any]:
    """torch.distributed.checkpoint's stagers that run on this host (their pinned-memory
    modes need an accelerator)."""
    from torch.distributed.checkpoint.staging import (
        BlockingAsyncStager,
        DefaultStager,
        StagingOptions,
    )

    cuda = torch.cuda.is_available()
    made: dict[str, Any] = {"torch DefaultStager": lambda: DefaultStager(StagingOptions(
        use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=False,
        use_non_blocking_copy=cuda))}
    if cuda:  # caching pins its buffers: CUDA only
        made["torch BlockingAsyncStager(cache)"] = \
            lambda: BlockingAsyncStager(cache_staged_state_dict=True)
    return made


def stagers(rounds: int) -> None:
    """One process: the state of the benchmark's model, staged by each stager in turn
    (rotating order), first stage (allocates) and later ones (reuse), medians."""
    from splitsync.ckpt.staging import Stager, live_storages

    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(4, 2048)).square().mean().backward()
    opt.step()
    state = {"state.pt": {"model": model_state(model, full=True, offload=False),
                          "optim": optimizer_state(model, opt, full=True, offload=False)}}
    live = live_storages([model], [opt])
    makers: dict[str, Any] = {"splitsync Stager": Stager, **_torch_stagers()}

    def run_one(stager: Any, ours: bool) -> Any:
        return stager.stage(state, live) if ours else stager.stage(state)

    times: dict[str, dict[str, list[float]]] = {n: {"first": [], "later": []} for n in makers}
    copy_s: list[float] = []
    for r in range(rounds):
        names = list(makers)[r % len(makers):] + list(makers)[:r % len(makers)]
        t = time.perf_counter()
        stage(state)
        copy_s.append(time.perf_counter() - t)
        for name in names:
            st = makers[name]()
            for key in ("first", "later", "later"):
                t = time.perf_counter()
                out = run_one(st, name.startswith("splitsync"))
                times[name][key].append(time.perf_counter() - t)
            assert torch.equal(out["state.pt"]["model"]["0.weight"], model[0].weight)
            if hasattr(st, "close"):
                st.close()
    gb = sum(v.numel() * v.element_size() for _, v in _tensors(state)) / 1e9
    print(f"staging {gb:.2f} GB (model + AdamW, one process), {rounds} rounds, medians")
    print(f"{'one-off copy (fresh buffers)':34s} {statistics.median(copy_s):.3f} s")
    for name, t in times.items():
        first, later = statistics.median(t["first"]), statistics.median(t["later"])
        print(f"{name:34s} first {first:.3f} s  later {later:.3f} s  "
              f"({gb / later:.1f} GB/s later)")


def _tensors(obj: Any) -> list[tuple[str, torch.Tensor]]:
    from splitsync.tree import iter_tensors

    return list(iter_tensors(obj))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default=None, help="directory on the disk to measure")
    ap.add_argument("--no-first", action="store_true",
                    help="skip the first-save rounds (fresh runs): only the other rows")
    ap.add_argument("--stagers", action="store_true",
                    help="only compare splitsync's Stager with torch's stagers (one process)")
    a = ap.parse_args()
    if a.stagers:
        stagers(a.rounds)
        return
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        res = spawn(bench, 2, d, a.rounds, not a.no_first, timeout=3600)[0]
    med = {k: statistics.median(v) if v else float("nan") for k, v in res.items()
           if isinstance(v, list)}
    gb = res["state_bytes"] / 1e9
    print(f"state: {gb:.2f} GB (model + AdamW), 2 ranks, {a.rounds} rounds, medians (rank 0)")
    rows = [
        ("in-memory copy of the state", f"{med['copy_s']:.3f} s", ""),
        ("blocking run.save", f"{med['blocking_s']:.3f} s", ""),
        ("background run.save: stall", f"{med['stall_s']:.3f} s",
         f"{med['stall_s'] / med['copy_s']:.2f}x the copy (target <= 1.5x); "
         f"{med['blocking_s'] / med['stall_s']:.1f}x smaller than blocking (target >= 5x)"),
        ("first save, buffers reserved", f"{med['first_reserved_s']:.3f} s",
         f"{med['first_reserved_s'] / med['copy_s']:.2f}x the copy (target <= 1.2x)"),
        ("second save, buffers reserved", f"{med['second_reserved_s']:.3f} s",
         f"{med['second_reserved_s'] / med['copy_s']:.2f}x the copy"),
        ("first save, not reserved", f"{med['first_unreserved_s']:.3f} s",
         f"{med['first_unreserved_s'] / med['copy_s']:.2f}x the copy (the first save "
         "allocates)"),
        ("second save, not reserved", f"{med['second_unreserved_s']:.3f} s",
         f"{med['second_unreserved_s'] / med['copy_s']:.2f}x the copy"),
        ("staging buffers (host memory)", f"{med['staging_B'] / 1e9:.2f} GB",
         f"{med['staging_B'] / res['state_bytes']:.2f}x the state (rank 0)"),
        ("background write", f"{med['bg_write_Bps'] / 1e6:.0f} MB/s",
         f"{med['bg_write_Bps'] / med['disk_write_Bps']:.2f}x the disk (target >= 0.8x)"),
        ("disk sequential write+fsync", f"{med['disk_write_Bps'] / 1e6:.0f} MB/s", ""),
        ("resume (cold cache)", f"{med['resume_Bps'] / 1e6:.0f} MB/s",
         f"{med['resume_Bps'] / med['disk_read_Bps']:.2f}x the disk (target >= 0.8x)"),
        ("disk sequential read (cold)", f"{med['disk_read_Bps'] / 1e6:.0f} MB/s", ""),
        # the first background save allocates the staging buffers every later one reuses:
        # the largest peak over the rounds is the one to compare, not the median
        ("peak RSS extra, background save", f"{max(res['rss_extra_B']) / 1e9:.2f} GB",
         f"{max(res['rss_extra_B']) / res['state_bytes']:.2f}x the state, max over rounds "
         "(target <= 1x)"),
    ]
    for name, value, ratio in rows:
        print(f"{name:34s} {value:>12s}  {ratio}")
    print("all rounds:", {k: [round(x, 4) for x in v] for k, v in res.items()
                          if isinstance(v, list)})


if __name__ == "__main__":
    main()
