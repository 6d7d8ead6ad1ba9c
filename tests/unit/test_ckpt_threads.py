"""A background save's thread has ended, with the staged copy freed, once the run waits for
it: a daemon thread still freeing tensors when the interpreter shuts down aborts the process
("terminate called without an active exception")."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import splitsync as ss
from splitsync.ckpt import save as background


class SlowToFree:
    """A staged job that takes a while to free, and says which thread freed it."""

    def __init__(self, freed: list[str]) -> None:
        self.final, self.step, self.freed = "nowhere", 3, freed

    def __del__(self) -> None:
        time.sleep(0.3)
        self.freed.append(threading.current_thread().name)


def test_the_staged_copy_is_freed_before_the_save_counts_as_done(monkeypatch) -> None:
    monkeypatch.setattr(background, "run_job", lambda job: None)
    freed: list[str] = []
    handle = background.start(SlowToFree(freed))  # type: ignore[arg-type]
    handle.wait(timeout=30)
    # freed already (by the save's thread, or by this one if that let go first), so no
    # thread frees it after the run has stopped waiting
    assert len(freed) == 1 and freed[0] in ("ckpt-save-3", "MainThread"), freed
    handle.finish()
    assert handle._thread is not None and not handle._thread.is_alive()


def test_a_failed_save_keeps_its_error_and_its_thread_ends(monkeypatch) -> None:
    def fail(job: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(background, "run_job", fail)
    handle = background.start(SlowToFree([]))  # type: ignore[arg-type]
    handle.finish()
    assert handle._thread is not None and not handle._thread.is_alive()
    with pytest.raises(OSError, match="disk gone"):
        handle.wait()


def _ours() -> list[str]:
    return [t.name for t in threading.enumerate()
            if t.name.startswith(("ckpt-save-", "ckpt-free-replaced"))]


def test_no_save_or_freeing_thread_outlives_the_run(tmp_path: Path) -> None:
    with ss.init(seed=0) as run:
        torch.manual_seed(0)
        model = run.model(nn.Linear(16, 8))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        run.resume(tmp_path, model=model, optimizer=opt, save_blocking=False)
        for _ in range(2):
            run.backward(model(torch.randn(4, 16)).square().mean())
            run.step(opt)
            run.save(tmp_path)
        run.resume(tmp_path, model=model, optimizer=opt, save_blocking=False)  # frees later
        run.backward(model(torch.randn(4, 16)).square().mean())
        run.step(opt)
        run.save(tmp_path)
    assert _ours() == []
