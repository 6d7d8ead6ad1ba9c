"""Background saves on 2 gloo ranks: bit-exact resume, no interleaving, failures never lost."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import splitsync as ss
from splitsync.testing import spawn


def _build(run: ss.Run) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = run.model(nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.2),
                                    nn.Linear(32, 1)))
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def _step(run: ss.Run, model: nn.Module, opt: torch.optim.Optimizer, i: int) -> float:
    g = torch.Generator().manual_seed(100 * i + run.rank)
    x = torch.randn(8, 6, generator=g)
    loss = F.mse_loss(model(x), x.sum(1, keepdim=True))
    run.backward(loss)
    run.step(opt)
    return loss.item()


def _params(model: nn.Module) -> list[Any]:
    return [p.detach().numpy().copy() for p in model.parameters()]


def scenario(rank: int, world: int, root: str) -> dict[str, Any]:
    holder = ss.init(seed=0)  # one process group across the simulated restarts
    try:
        return _scenario(root)
    finally:
        holder.close()


class _Ops(ss.Observer):
    """Records the collectives observers see, and from which thread."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, bool]] = set()

    def around_collective(self, op: str, fn: Any, *args: Any) -> Any:
        import threading

        self.seen.add((op, threading.current_thread() is threading.main_thread()))
        return fn(*args)


def _scenario(root: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with ss.init(seed=0, save_blocking=False) as run:  # the default set once, at init
        ops = run.add_observer(_Ops())
        model, opt = _build(run)
        run.resume(f"{root}/bg", model=model, optimizer=opt)
        losses = {i: _step(run, model, opt, i) for i in range(1, 4)}
        h3 = run.save()  # background
        before = _params(model)
        losses.update({i: _step(run, model, opt, i) for i in range(4, 6)})  # while it writes
        h5 = run.save(note="five")  # waits for step 3's save: never two at once
        out["first_done_when_second_started"] = h3.done()
        out["handles"] = (type(h3).__name__, h3.path, h5.path)
        losses.update({i: _step(run, model, opt, i) for i in range(6, 9)})
        out["base"] = (losses, _params(model))
        out["at3"] = before
        out["ops"] = set(ops.seen)
    # resume from step 5 (committed by close) and continue: bit-equal to the run above
    with ss.init(seed=0) as run:
        model, opt = _build(run)
        state = run.resume(f"{root}/bg", model=model, optimizer=opt)
        out["resumed"] = (state.step, dict(state.extra))
        rest = {i: _step(run, model, opt, i) for i in range(state.step + 1, 9)}
        out["rest"] = (rest, _params(model))
    return out


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_background_save_then_resume_is_bit_exact(tmp_path: Path) -> None:
    results = spawn(scenario, 2, str(tmp_path), timeout=140)
    for res in results:
        # the save's handshakes go through comm and around_collective: the prepare check in
        # the loop's thread, the file lists and the outcome in the save's thread
        assert {("all_gather_object", True), ("gather_object", False),
                ("broadcast", False)} <= res["ops"], res["ops"]
        assert res["first_done_when_second_started"]
        kind, p3, p5 = res["handles"]
        assert kind == "SaveHandle" and p3.endswith("step-000003") and p5.endswith("step-000005")
        assert res["resumed"] == (5, {"note": "five"})
        losses, final = res["base"]
        rest, resumed_final = res["rest"]
        assert all(rest[i] == losses[i] for i in rest) and sorted(rest) == [6, 7, 8]
        for a, b in zip(final, resumed_final, strict=True):
            assert (a == b).all()
    assert results[0]["base"][0] != results[1]["base"][0]  # ranks saw different data
    # step 3's checkpoint holds the state at step 3, not what training did while it wrote
    with ss.init(seed=0) as run:
        model, opt = _build(run)
        run.resume(tmp_path / "bg", model=model, optimizer=opt)  # newest: step 5
    import shutil

    shutil.rmtree(tmp_path / "bg" / "step-000005")
    with ss.init(seed=0) as run:
        model, opt = _build(run)
        assert run.resume(tmp_path / "bg", model=model, optimizer=opt).step == 3
        for a, b in zip(_params(model), results[0]["at3"], strict=True):
            assert (a == b).all()


def failing(rank: int, world: int, root: str) -> dict[str, Any]:
    """Rank 1's part of the step-4 save fails in the background, as on a full disk."""
    holder = ss.init(seed=0)  # one process group across the simulated restarts
    try:
        return _failing(root)
    finally:
        holder.close()


def _failing(root: str) -> dict[str, Any]:
    import fsspec
    from fsspec.implementations.local import LocalFileSystem

    class Broken(LocalFileSystem):
        protocol = ("broken",)

        def _open(self, path: str, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
            if "w" in mode and path.endswith("step-000004/rank-00001.pt"):
                raise OSError(28, "No space left on device")
            return super()._open(path, mode, *args, **kwargs)

    fsspec.register_implementation("broken", Broken, clobber=True)
    url = f"broken://{root}/ck"
    out: dict[str, Any] = {}
    with ss.init(seed=0) as run:
        model, opt = _build(run)
        run.resume(url, model=model, optimizer=opt)
        for i in range(1, 3):
            _step(run, model, opt, i)
        run.save(blocking=False).wait()
        good = _params(model)
        for i in range(3, 5):
            _step(run, model, opt, i)
        run.save(blocking=False)
        err = None
        deadline = time.monotonic() + 60
        try:  # raised at a run.step boundary once the background write has failed
            while time.monotonic() < deadline:
                # no collective here: each rank learns of the failure at its own step, and
                # a rank gone on to an all-reduce the other never joins would wait forever
                run.step(opt)
                time.sleep(0.01)
        except ss.ckpt.CheckpointError as e:
            err = str(e)
        out["error"] = err
        run.barrier()
    with ss.init(seed=0) as run:
        model, opt = _build(run)
        out["resumed"] = run.resume(url, model=model, optimizer=opt).step
        out["same"] = all((a == b).all() for a, b in zip(_params(model), good, strict=True))
    return out


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_failed_background_write_is_raised_and_loses_nothing(tmp_path: Path) -> None:
    for res in spawn(failing, 2, str(tmp_path), timeout=140):
        assert res["error"] is not None, "the failure was lost"
        assert "rank 1 writing" in res["error"] and "step-000004/rank-00001.pt" in res["error"]
        assert "No space left" in res["error"] and "earlier checkpoints are untouched" in \
            res["error"]
        assert res["resumed"] == 2 and res["same"]


def one_group(rank: int, world: int, root: str) -> dict[str, Any]:
    """Several resumes, each followed by background saves: one background group per run."""
    import torch.distributed as dist

    holder = ss.init(seed=0)
    try:
        out: dict[str, Any] = {}
        with ss.init(seed=0) as run:
            model, opt = _build(run)
            groups, watched = [], []
            for k in range(3):
                run.resume(f"{root}/g", model=model, optimizer=opt, save_blocking=False)
                _step(run, model, opt, k)
                h = run.save()
                groups.append(run._checkpoints._group)
                watched.append(len(run._step_watch))  # the step-boundary watch is attached
                # the core's own watch, not one of the observers a user sees
                assert all(w not in run.observers for w in run._step_watch)
                h.wait()
                _step(run, model, opt, k)  # ...and removed at the next step once done
                watched.append(len(run._step_watch))
            out["same_group"] = all(g is groups[0] for g in groups) and groups[0] is not None
            out["watched"] = watched
            before = len(dist.distributed_c10d._world.pg_map)
        out["destroyed"] = before - len(dist.distributed_c10d._world.pg_map)
        return out
    finally:
        holder.close()


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_one_background_group_per_run_destroyed_on_close(tmp_path: Path) -> None:
    for res in spawn(one_group, 2, str(tmp_path), timeout=140):
        assert res["same_group"], "a new gloo group per resume leaks groups"
        assert res["watched"] == [1, 0] * 3
        assert res["destroyed"] == 1
