"""splitsync.launch refuses, before starting anything, where it cannot work."""

from __future__ import annotations

import pytest

import splitsync


def _fn() -> int:
    return 1


def test_cuda_initialised_in_the_parent_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match="CUDA is already initialised.*Restart the kernel"):
        splitsync.launch(_fn, nprocs=2)


def test_more_processes_than_gpus_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"only 1 GPU\(s\).*nprocs<=1"):
        splitsync.launch(_fn, nprocs=2)


def test_inside_a_launched_rank_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(RuntimeError, match="rank of a launched job"):
        splitsync.launch(_fn, nprocs=2)


@pytest.mark.parametrize("nprocs", [0, -1, 1.5, True])
def test_bad_nprocs(nprocs: object) -> None:
    with pytest.raises(ValueError, match="number of processes >= 1"):
        splitsync.launch(_fn, nprocs=nprocs)


def test_spawn_needs_a_picklable_function() -> None:
    with pytest.raises(ValueError, match="cannot be sent to 'spawn'"):
        splitsync.launch(lambda: 1, nprocs=1, start_method="spawn")
